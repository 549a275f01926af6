/* libFuzzer entry point for the agent protocol parsers (not built by
 * default).  Build and run:
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -std=gnu11 -D_GNU_SOURCE \
 *     -Isrc/lib fuzz/fuzz_proto.c src/lib/agent/proto.c src/lib/common/err.c \
 *     src/lib/common/util.c -o build/fuzz_proto
 *   ./build/fuzz_proto -max_len=70000 corpus/
 *
 * The input is a byte stream as hutch-init or hutch-shim would read it: fed
 * to the incremental decoder in chunks whose sizes come from the input, every
 * frame's payload walked as TLV and parsed as SPAWN. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "agent/proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void walk_payload(const unsigned char *p, size_t n) {
  struct hutch_tlv_iter it;
  uint8_t tag;
  const unsigned char *val;
  uint32_t len;
  hutch_tlv_iter_init(&it, p, n);
  while (hutch_tlv_next(&it, &tag, &val, &len) == 1) {
    uint32_t u;
    int32_t i;
    (void)hutch_tlv_u32(val, len, &u);
    (void)hutch_tlv_i32(val, len, &i);
    /* Touch every byte so ASan sees an out-of-bounds value. */
    volatile unsigned char sink = 0;
    for (uint32_t k = 0; k < len; k++) sink ^= val[k];
    (void)sink;
  }
  struct hutch_spawn s;
  hutch_err err = HUTCH_ERR_INIT;
  if (hutch_spawn_decode(p, n, &s, &err) == 0) {
    if (!s.argc || !s.argv[0] || s.argv[s.argc] != NULL || s.envp[s.envc] != NULL) abort();
    for (size_t k = 0; k < s.argc; k++) (void)strlen(s.argv[k]);
    for (size_t k = 0; k < s.envc; k++) (void)strlen(s.envp[k]);
    if (s.cwd) (void)strlen(s.cwd);
    hutch_spawn_free(&s);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  /* First byte: chunk size for feeding the decoder (1..256). */
  size_t chunk = (size_t)data[0] + 1;
  data++;
  size--;

  /* The whole input as one SPAWN payload too. */
  walk_payload(data, size);

  struct hutch_frame_decoder d;
  hutch_decoder_init(&d);
  size_t off = 0;
  int dead = 0;
  while (off < size && !dead) {
    size_t n = size - off < chunk ? size - off : chunk;
    hutch_decoder_feed(&d, data + off, n);
    off += n;
    for (;;) {
      struct hutch_frame_hdr h;
      const unsigned char *p;
      hutch_err err = HUTCH_ERR_INIT;
      int r = hutch_decoder_pop(&d, &h, &p, &err);
      if (r < 0) {
        if (h.len <= HUTCH_FRAME_MAX && h.type != 0) abort(); /* rejected a valid header */
        dead = 1;
        break;
      }
      if (r == 0) break;
      if (h.len > HUTCH_FRAME_MAX || h.type == 0) abort();
      walk_payload(p, h.len);
      hutch_decoder_consume(&d, &h);
    }
  }
  /* Bytes still buffered never exceed one maximal frame plus a chunk. */
  if (!dead && d.in.len > HUTCH_FRAME_HDR + HUTCH_FRAME_MAX + chunk) abort();
  hutch_decoder_free(&d);
  return 0;
}
