/* libFuzzer entry point for the tar layer extractor and the tar member
 * index (src/lib/store/tarx.c).  Build and run: `make fuzz` (see the
 * Makefile), or by hand:
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -std=gnu11 -D_GNU_SOURCE \
 *     -Isrc/lib fuzz/fuzz_tar.c src/lib/store/tarx.c src/lib/common/hash.c \
 *     src/lib/common/err.c src/lib/common/util.c -lz -lzstd -lcrypto -o build/fuzz_tar
 *   ./build/fuzz_tar corpus/
 *
 * Input: one mode byte, then the layer.  Mode bit 0: recompute the header
 * checksum of every 512-byte block (so that mutations get past the checksum
 * and reach the extractor); bit 1: gzip the result.  Each input is
 * extracted into a fresh directory `<tmp>/root` next to a sentinel file;
 * anything appearing beside `root`, or a changed sentinel, aborts (an
 * escape).  The directory is removed after each input.
 */
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "common/util.h"
#include "store/tarx.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char base[] = "/tmp/hutch-fuzz-tar.XXXXXX";
static int runs;

static void remove_base(void) { rm_rf(base, NULL); }

static void fix_checksums(unsigned char *p, size_t n) {
  for (size_t off = 0; off + 512 <= n; off += 512) {
    unsigned char *h = p + off;
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < 512; i++) sum += h[i];
    snprintf((char *)h + 148, 8, "%06o", sum & 0777777);
    h[155] = ' ';
  }
}

static unsigned char *gzip(const unsigned char *p, size_t n, size_t *out_n) {
  z_stream z;
  memset(&z, 0, sizeof z);
  if (deflateInit2(&z, 1, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK) abort();
  size_t cap = deflateBound(&z, n) + 64;
  unsigned char *out = xmalloc(cap);
  z.next_in = (unsigned char *)p;
  z.avail_in = (uInt)n;
  z.next_out = out;
  z.avail_out = (uInt)cap;
  deflate(&z, Z_FINISH);
  *out_n = cap - z.avail_out;
  deflateEnd(&z);
  return out;
}

/* Only `root` and `sentinel` beside each other, the sentinel unchanged. */
static void check_no_escape(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) abort();
  struct dirent *de;
  while ((de = readdir(d)))
    if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") && strcmp(de->d_name, "root") &&
        strcmp(de->d_name, "sentinel")) {
      fprintf(stderr, "escape: `%s` created beside the root\n", de->d_name);
      abort();
    }
  closedir(d);
  char *s = xasprintf("%s/sentinel", dir);
  struct stat st;
  char *c = read_file(s, 64, NULL, NULL);
  if (lstat(s, &st) < 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1 || !c || strcmp(c, "sentinel")) {
    fprintf(stderr, "escape: the sentinel changed\n");
    abort();
  }
  free(c);
  free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (runs++ == 0) {
    if (!mkdtemp(base)) abort();
    atexit(remove_base);
  }
  if (size == 0) return 0;
  unsigned mode = data[0];
  size_t n = size - 1;
  unsigned char *layer = xmalloc(n + 1);
  memcpy(layer, data + 1, n);
  if (mode & 1) fix_checksums(layer, n);
  if (mode & 2) {
    size_t gn;
    unsigned char *g = gzip(layer, n, &gn);
    free(layer);
    layer = g;
    n = gn;
  }

  char *dir = xasprintf("%s/run", base);
  char *root = xasprintf("%s/root", dir);
  char *sentinel = xasprintf("%s/sentinel", dir);
  if (mkdir(dir, 0700) < 0 || mkdir(root, 0755) < 0) abort();
  if (write_file(sentinel, "sentinel", 8, 0644, NULL) < 0) abort();
  int rfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (rfd < 0) abort();

  struct hutch_tar_layer l = {.fd = -1, .mem = layer, .len = n, .max_size = 8u << 20};
  hutch_err err = HUTCH_ERR_INIT;
  int r = hutch_tar_apply(rfd, &l, &err);
  if (r < 0 && (err.status != 400 && err.status != 500)) abort();
  if (r < 0 && !err.msg[0]) abort();
  close(rfd);
  check_no_escape(dir);

  /* The same bytes as an outer archive: index, then look names up. */
  int mfd = memfd_create("fuzz-tar", MFD_CLOEXEC);
  if (mfd >= 0) {
    if (write_full(mfd, layer, n) == 0) {
      struct hutch_tar_index idx;
      hutch_err_clear(&err);
      if (hutch_tar_index_fd(mfd, &idx, &err) == 0) {
        for (size_t i = 0; i < idx.n; i++) {
          const struct hutch_tar_member *m = hutch_tar_index_find(&idx, idx.m[i].path);
          if (m && (m->type != '0' || m->off + m->size > n)) abort();
        }
        (void)hutch_tar_index_find(&idx, "manifest.json");
        hutch_tar_index_free(&idx);
      }
    }
    close(mfd);
  }

  if (rm_rf(dir, NULL) < 0) abort();
  free(dir);
  free(root);
  free(sentinel);
  free(layer);
  return 0;
}
