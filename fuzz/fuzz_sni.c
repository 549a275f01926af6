/* libFuzzer entry point for the TLS ClientHello SNI parser and the host
 * parser it uses (part of `make fuzz`).  Build by hand:
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -std=gnu11 -D_GNU_SOURCE \
 *     -Isrc/lib fuzz/fuzz_sni.c src/lib/net/sni.c src/lib/net/addr.c \
 *     src/lib/common/err.c src/lib/common/util.c -o build/fuzz_sni
 *   ./build/fuzz_sni -max_len=20000 corpus/
 *
 * Each input is used twice: as the raw bytes a client sent, and as a
 * handshake message that the driver wraps in records of a size taken from
 * the first byte, so that the ClientHello parser is reached without the
 * fuzzer having to discover record framing.  Properties checked: results
 * and names are well-formed; a result does not depend on bytes after the
 * records it consumed; every shorter prefix of an accepted stream needs
 * more bytes; the record fragmentation does not change the answer. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/addr.h"
#include "net/sni.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_name(const char *host) {
  size_t n = strlen(host);
  if (n == 0 || n > HUTCH_NAME_MAX) abort();
  struct hutch_host h;
  const char *why;
  /* A name that came out must go back in unchanged. */
  if (hutch_host_parse(host, n, &h, &why) < 0 || h.kind != HUTCH_HOST_NAME || strcmp(h.text, host) != 0) abort();
}

static enum hutch_sni_result check(const uint8_t *b, size_t n, struct hutch_sni *s) {
  enum hutch_sni_result r = hutch_sni_parse(b, n, s);
  switch (r) {
  case HUTCH_SNI_OK:
    check_name(s->host);
    /* fallthrough */
  case HUTCH_SNI_NONE:
    if (s->consumed == 0 || s->consumed > n || s->consumed > HUTCH_SNI_INPUT_MAX) abort();
    if (r == HUTCH_SNI_NONE && s->host[0]) abort();
    break;
  case HUTCH_SNI_NEED_MORE:
    if (n >= HUTCH_SNI_INPUT_MAX) abort();
    break;
  case HUTCH_SNI_NOT_TLS:
  case HUTCH_SNI_MALFORMED:
    if (!s->why || s->host[0]) abort();
    break;
  default:
    abort();
  }
  return r;
}

static uint8_t rec[2 * HUTCH_SNI_INPUT_MAX + 64];

static size_t wrap(const uint8_t *hs, size_t n, size_t frag) {
  size_t o = 0;
  for (size_t off = 0; off < n && o + 5 + frag < sizeof rec; off += frag) {
    size_t k = n - off < frag ? n - off : frag;
    rec[o++] = 22;
    rec[o++] = 3;
    rec[o++] = 3;
    rec[o++] = (uint8_t)(k >> 8);
    rec[o++] = (uint8_t)k;
    memcpy(rec + o, hs + off, k);
    o += k;
  }
  return o;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct hutch_sni s, t;
  enum hutch_sni_result r = check(data, size, &s);
  if (r == HUTCH_SNI_OK || r == HUTCH_SNI_NONE) {
    size_t c = s.consumed;
    if (check(data, c, &t) != r || strcmp(s.host, t.host) != 0 || t.consumed != c) abort();
    if (check(data, c - 1, &t) != HUTCH_SNI_NEED_MORE) abort();
    if (check(data, c / 2, &t) != HUTCH_SNI_NEED_MORE) abort();
  }

  if (size < 2) return 0;
  size_t frag = (size_t)data[0] * 64 + 1;
  const uint8_t *hs = data + 1;
  size_t n = size - 1;
  if (n > HUTCH_SNI_HELLO_MAX + 4) n = HUTCH_SNI_HELLO_MAX + 4;
  /* Only the handshake message: a byte after it would sit in the same
   * record (refused) or in a record of its own (not looked at). */
  if (n >= 4) {
    size_t whole = 4 + ((size_t)hs[1] << 16 | (size_t)hs[2] << 8 | hs[3]);
    if (whole < n) n = whole;
  }
  size_t one = wrap(hs, n, 16384);
  enum hutch_sni_result a = check(rec, one, &s);
  size_t many = wrap(hs, n, frag);
  if (many > HUTCH_SNI_INPUT_MAX - 5) return 0; /* the input limit may speak first */
  enum hutch_sni_result b = check(rec, many, &t);
  if (a != b || strcmp(s.host, t.host) != 0) abort();
  return 0;
}
