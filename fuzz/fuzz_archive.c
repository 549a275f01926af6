/* libFuzzer entry point for the snapshot archive reader
 * (src/lib/store/archive.c): arbitrary bytes as an archive file must be
 * verified or refused as 400 invalid_archive, never crash or leak; what
 * verifies must extract, and what is refused must not.  Built and run by
 * `make fuzz`; by hand:
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -std=gnu11 -D_GNU_SOURCE \
 *     -Isrc/lib fuzz/fuzz_archive.c src/lib/store/archive.c src/lib/common/hash.c \
 *     src/lib/common/err.c src/lib/common/util.c -lzstd -ljansson -lcrypto -o build/fuzz_archive
 *   ./build/fuzz_archive corpus/
 *
 * A random input almost never carries a matching SHA-256, which would stop
 * every run at "checksum mismatch".  So each input is tried twice: as is,
 * and "repaired" (trailer magic, compressed_len and checksum made
 * consistent with the bytes before them), which lets the fuzzer reach the
 * meta parser and the zstd decoder.
 */
#include <fcntl.h>
#include <openssl/evp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/util.h"
#include "store/archive.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int devnull = -1;

static void check(const uint8_t *data, size_t size) {
  int fd = memfd_create("fuzz-archive", MFD_CLOEXEC);
  if (fd < 0) abort();
  if (write_full(fd, data, size) < 0) abort();

  hutch_err err = HUTCH_ERR_INIT;
  char *meta = NULL;
  struct hutch_archive_stats st;
  hutch_err x = HUTCH_ERR_INIT;
  if (hutch_archive_verify(fd, &meta, &st, &err) == 0) {
    if (!meta || st.total_bytes != size ||
        strlen(meta) != size - st.compressed_bytes - HUTCH_ARCHIVE_HEADER_LEN - HUTCH_ARCHIVE_TRAILER_LEN)
      abort();
    free(meta);
    if (hutch_archive_extract(fd, devnull, &x) != 0) abort();
  } else {
    /* Only ever the archive's fault: anything else is hutch's bug. */
    if (err.status != 400 || strcmp(err.code, "invalid_archive") != 0 || meta) abort();
    if (hutch_archive_extract(fd, devnull, &x) == 0 || x.status != 400) abort();
  }
  close(fd);
}

static void put_be64(uint8_t *p, uint64_t v) {
  for (int i = 7; i >= 0; i--, v >>= 8) p[i] = (uint8_t)v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (devnull < 0) devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
  check(data, size);

  if (size < HUTCH_ARCHIVE_HEADER_LEN + HUTCH_ARCHIVE_TRAILER_LEN) return 0;
  uint64_t meta_len = (uint64_t)data[14] << 24 | (uint64_t)data[15] << 16 | (uint64_t)data[16] << 8 | data[17];
  uint64_t body = size - HUTCH_ARCHIVE_TRAILER_LEN;
  if (HUTCH_ARCHIVE_HEADER_LEN + meta_len > body) return 0;
  uint8_t *fixed = malloc(size);
  if (!fixed) abort();
  memcpy(fixed, data, size);
  memcpy(fixed + body, HUTCH_ARCHIVE_TRAILER_MAGIC, 8);
  put_be64(fixed + body + 16, body - HUTCH_ARCHIVE_HEADER_LEN - meta_len);
  EVP_Digest(fixed, body, fixed + body + 24, NULL, EVP_sha256(), NULL);
  check(fixed, size);
  free(fixed);
  return 0;
}
