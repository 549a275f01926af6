/* Safe extraction of untrusted tar streams (image layers) into a directory,
 * and a member index of an uncompressed tar file (the outer archive of a
 * `docker save` tarball or a packed OCI layout).
 *
 * The reader is our own: ustar and v7 headers, GNU long names ('L', 'K'),
 * pax extended headers ('x', or Solaris' 'X': path, linkpath, size, uid, gid,
 * mtime; 'g' is read and ignored), base-256 numbers.  Header checksums are verified.
 * Bounds: names and link targets <= HUTCH_TAR_NAME_MAX bytes, one pax
 * header <= HUTCH_TAR_PAX_MAX bytes.
 *
 * Safety: every path of the archive is resolved under the root directory
 * fd with openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS), so `..`,
 * absolute paths and symlinks planted by earlier entries or layers stay
 * inside the root.  The last component is always created with the *at()
 * call on a plain name in an in-root parent (O_CREAT|O_EXCL|O_NOFOLLOW,
 * mkdirat, symlinkat, mkfifoat, linkat without AT_SYMLINK_FOLLOW) after
 * removing what was there (a directory recursively, never following a
 * symlink); a symlink as the last component is never followed.
 *
 * A layer is read twice (so its source must allow random access: a regular
 * file, read with pread, or memory):
 *   1. every header is read and checked (checksums, bounds, entry types,
 *      truncation), the digests of the stored and of the uncompressed bytes
 *      are computed and compared, and the OCI whiteouts are collected;
 *   2. only then are the whiteouts applied (`d/.wh.x` removes `d/x`,
 *      `d/.wh..wh..opq` empties `d`: both act on lower layers only, since
 *      nothing of this layer exists yet) and the entries extracted.
 * So a malformed layer or one whose digest does not match changes nothing.
 * An error in pass 2 (a hard link to a missing file, a parent that is a
 * file) can leave the layer half applied: the caller discards the root.
 *
 * Entries: regular files, directories, symlinks, hard links (target in the
 * root), fifos; char and block devices are skipped; whiteout files are never
 * created.  Mode (setuid bits included), uid/gid (ids >= 65536 become 65534)
 * and mtime are applied; directory mtimes at the end of the layer.
 *
 * Errors: malformed input is 400 "invalid_argument" with a message naming
 * what and where ("tar header checksum mismatch at offset 1536"); an
 * archive that makes a filesystem call fail for its own reasons (a hard
 * link to a missing file, ENOTDIR, ELOOP) is 400 too; host failures 500.
 */
#ifndef HUTCH_STORE_TARX_H
#define HUTCH_STORE_TARX_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define HUTCH_TAR_NAME_MAX 4096
#define HUTCH_TAR_PAX_MAX (1u << 20)

/* Compression, detected from the first bytes (never from a media type). */
enum { HUTCH_COMP_NONE, HUTCH_COMP_GZIP, HUTCH_COMP_ZSTD, HUTCH_COMP_XZ, HUTCH_COMP_BZIP2 };
int hutch_compression_detect(const unsigned char *p, size_t n);
const char *hutch_compression_name(int kind);

/* One layer: `len` bytes of the regular file `fd` from `off`, or (fd < 0)
 * `len` bytes at `mem`.  Uncompressed tar, gzip or zstd. */
struct hutch_tar_layer {
  int fd;
  uint64_t off, len;
  const void *mem;
  const char *digest;  /* "sha256:<64 hex>" of the stored bytes, or NULL */
  const char *diff_id; /* "sha256:<64 hex>" of the uncompressed tar, or NULL */
  uint64_t max_size;   /* bound on the uncompressed size, 0: none */
};

/* Apply one layer onto the tree under `root_dirfd` (see above). */
int hutch_tar_apply(int root_dirfd, const struct hutch_tar_layer *layer, hutch_err *err);
/* Conveniences: the whole regular file `fd`; `n` bytes in memory. */
int hutch_tar_extract_fd(int fd, int root_dirfd, hutch_err *err);
int hutch_tar_extract_mem(const void *data, size_t n, int root_dirfd, hutch_err *err);

/* Members of an uncompressed tar file, for random access by path. */
struct hutch_tar_member {
  char *path; /* cleaned: no leading "/" or "./", no "." or ".." components */
  char type;  /* '0' regular, '1' hard link, '2' symlink */
  char *link; /* hard link / symlink target as in the archive */
  uint64_t off, size; /* the regular file's data in the file */
  size_t seq;         /* position in the archive (a later duplicate wins) */
};
struct hutch_tar_index {
  struct hutch_tar_member *m; /* sorted by path, then seq */
  size_t n;
};
#define HUTCH_TAR_INDEX_MAX 100000

int hutch_tar_index_fd(int fd, struct hutch_tar_index *idx, hutch_err *err);
/* The regular file at `path`, following symlinks and hard links inside the
 * archive (at most 16); NULL if there is none. */
const struct hutch_tar_member *hutch_tar_index_find(const struct hutch_tar_index *idx, const char *path);
void hutch_tar_index_free(struct hutch_tar_index *idx);

/* Lexically clean an archive path into `out` (room for strlen(in) + 1):
 * drops leading "/", empty and "." components; ".." removes the previous
 * component and is dropped at the top.  "" is the root.  Returns out. */
char *hutch_tar_clean_path(const char *in, char *out);

#endif
