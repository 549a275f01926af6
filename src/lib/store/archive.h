/* The snapshot export stream: one file (or pipe, or socket) that carries a
 * snapshot's metadata and its `btrfs send` output, checksummed end to end.
 *
 * Format (all integers big-endian):
 *
 *   magic    "HUTCHSNAP\n"                      10 bytes
 *   version  u32 = 1                              4 bytes
 *   meta_len u32, at most 1 MiB                   4 bytes
 *   meta     a JSON object in UTF-8 (no NUL)      meta_len bytes
 *   payload  zstd frame(s) of the raw payload     compressed_len bytes (>= 1)
 *   trailer  "HUTCHEND"                           8 bytes
 *            u64 payload_raw_len                  8 bytes
 *            u64 compressed_len                   8 bytes
 *            SHA-256 of every byte from the magic through the last payload
 *            byte                                32 bytes (binary)
 *
 * The trailer is the last 56 bytes of the archive: nothing may follow it.
 * The payload is opaque to this module (hutch puts `btrfs send` output
 * there).  The writer produces one frame; the reader accepts any sequence
 * of complete zstd frames (skippable frames included) whose decompressed
 * bytes add up to exactly payload_raw_len.  The reader refuses frames whose
 * window is over 2^HUTCH_ARCHIVE_WINDOW_LOG_MAX bytes, which bounds its
 * memory; the writer's levels (up to 19) stay well below it.
 *
 * Everything streams through fixed buffers (~256 KiB plus the zstd
 * context); no payload is ever held in memory.
 *
 * Writing to a pipe or socket whose reader went away: a socket is written
 * with send(MSG_NOSIGNAL); any other fd with write(), which relies on the
 * caller ignoring SIGPIPE (hutchd and the CLI do).  Either way the failure
 * comes back as -1 with errnum EPIPE (status 500), not as a signal.
 *
 * Errors: a malformed archive is status 400, code "invalid_archive", with a
 * message that names what is wrong ("bad magic", "checksum mismatch",
 * "truncated: trailer missing", ...); I/O failures are 500 "internal".
 */
#ifndef HUTCH_STORE_ARCHIVE_H
#define HUTCH_STORE_ARCHIVE_H

#include <stdint.h>

#include "common/err.h"

#define HUTCH_ARCHIVE_MAGIC "HUTCHSNAP\n"
#define HUTCH_ARCHIVE_MAGIC_LEN 10
#define HUTCH_ARCHIVE_VERSION 1
#define HUTCH_ARCHIVE_HEADER_LEN 18 /* magic + version + meta_len */
#define HUTCH_ARCHIVE_TRAILER_MAGIC "HUTCHEND"
#define HUTCH_ARCHIVE_TRAILER_LEN 56
#define HUTCH_ARCHIVE_META_MAX (1u << 20)
#define HUTCH_ARCHIVE_WINDOW_LOG_MAX 25 /* 32 MiB */
#define HUTCH_ARCHIVE_LEVEL_MAX 19

struct hutch_archive_stats {
  uint64_t raw_bytes;        /* payload before compression */
  uint64_t compressed_bytes; /* the payload section as stored */
  uint64_t total_bytes;      /* the whole archive, header to trailer */
  char sha256_hex[65];       /* the trailer's checksum, lowercase hex */
};

/* Write header and meta, compress everything read from payload_fd until EOF
 * (zstd `level`: 0 means 3; otherwise ZSTD_minCLevel()..19) into out_fd,
 * then the trailer.  out_fd is written sequentially (a pipe or socket is
 * fine).  meta_json must be a JSON object of at most 1 MiB (else 400
 * "invalid_argument", before anything is written).  `st` may be NULL.  On
 * failure out_fd holds a partial stream without a valid trailer, which
 * hutch_archive_verify rejects. */
int hutch_archive_write(int out_fd, const char *meta_json, int payload_fd, int level,
                        struct hutch_archive_stats *st, hutch_err *err);

/* Verify a complete archive held in a seekable file (read with pread: the
 * file offset is not used or changed): header sane, meta a JSON object,
 * trailer at the very end, lengths consistent, SHA-256 matching, and the
 * payload decompressing to exactly payload_raw_len bytes.  On success
 * returns 0, sets *meta_json (malloc'd, NUL-terminated; meta_json may be
 * NULL) and fills `st` (may be NULL).  On failure -1 with status 400 code
 * "invalid_archive" (or 500 for an I/O error) and *meta_json untouched.
 * The work is one read of the file. */
int hutch_archive_verify(int fd, char **meta_json, struct hutch_archive_stats *st, hutch_err *err);

/* Stream the decompressed payload of the archive in `fd` (a seekable file,
 * read with pread) into out_fd (e.g. a pipe to `btrfs receive`).  Call it
 * after hutch_archive_verify; it makes every check of verify again as it
 * goes, so a file changed since verification still fails (400
 * invalid_archive) -- but possibly after part of the payload was written,
 * so the consumer's result must then be discarded. */
int hutch_archive_extract(int fd, int out_fd, hutch_err *err);

/* Copy in_fd to EOF into file_fd (e.g. an upload into a temp file before
 * verification), refusing more than max_bytes with 413
 * "payload_too_large".  *n_out (may be NULL) gets the bytes copied. */
int hutch_archive_receive(int in_fd, int file_fd, uint64_t max_bytes, uint64_t *n_out, hutch_err *err);

#endif
