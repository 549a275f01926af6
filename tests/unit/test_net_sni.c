/* TLS ClientHello SNI extraction (src/lib/net/sni.c): ClientHellos built
 * here byte by byte, and two captured from real clients on loopback
 * (`openssl s_client -connect 127.0.0.1:PORT -servername Hutch-Gateway.test`,
 * OpenSSL 3.0; `curl --resolve www.hutch.test:PORT:127.0.0.1
 * https://www.hutch.test:PORT/`, curl 7.88), fed whole, in every prefix and
 * in fragments; then each refusal, with the legitimate form accepted next
 * to it. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "net/sni.h"
#include "tap.h"

/* Captured on 127.0.0.1 (see the top of this file). */
static const uint8_t openssl_hello[] = {
    0x16, 0x03, 0x01, 0x01, 0x3f, 0x01, 0x00, 0x01, 0x3b, 0x03, 0x03, 0xe1, 0x99, 0x59, 0x5a, 0x8a,
    0x8b, 0x10, 0x58, 0x56, 0x3a, 0xdf, 0x96, 0xed, 0xf6, 0xcf, 0x5c, 0x83, 0x3f, 0xe4, 0x25, 0x7a,
    0xf0, 0x38, 0xaa, 0xa3, 0xfa, 0x13, 0xc4, 0x91, 0x12, 0x55, 0x0c, 0x20, 0x7a, 0x2e, 0xa8, 0x08,
    0x62, 0x6e, 0xc7, 0xf0, 0x26, 0x87, 0xe0, 0x47, 0x57, 0x25, 0x28, 0xa6, 0x16, 0x49, 0x67, 0x65,
    0xf0, 0xfe, 0xeb, 0xd3, 0x71, 0xd6, 0xdc, 0x2e, 0x5c, 0x03, 0x64, 0x65, 0x00, 0x3e, 0x13, 0x02,
    0x13, 0x03, 0x13, 0x01, 0xc0, 0x2c, 0xc0, 0x30, 0x00, 0x9f, 0xcc, 0xa9, 0xcc, 0xa8, 0xcc, 0xaa,
    0xc0, 0x2b, 0xc0, 0x2f, 0x00, 0x9e, 0xc0, 0x24, 0xc0, 0x28, 0x00, 0x6b, 0xc0, 0x23, 0xc0, 0x27,
    0x00, 0x67, 0xc0, 0x0a, 0xc0, 0x14, 0x00, 0x39, 0xc0, 0x09, 0xc0, 0x13, 0x00, 0x33, 0x00, 0x9d,
    0x00, 0x9c, 0x00, 0x3d, 0x00, 0x3c, 0x00, 0x35, 0x00, 0x2f, 0x00, 0xff, 0x01, 0x00, 0x00, 0xb4,
    0x00, 0x00, 0x00, 0x17, 0x00, 0x15, 0x00, 0x00, 0x12, 0x48, 0x75, 0x74, 0x63, 0x68, 0x2d, 0x47,
    0x61, 0x74, 0x65, 0x77, 0x61, 0x79, 0x2e, 0x74, 0x65, 0x73, 0x74, 0x00, 0x0b, 0x00, 0x04, 0x03,
    0x00, 0x01, 0x02, 0x00, 0x0a, 0x00, 0x16, 0x00, 0x14, 0x00, 0x1d, 0x00, 0x17, 0x00, 0x1e, 0x00,
    0x19, 0x00, 0x18, 0x01, 0x00, 0x01, 0x01, 0x01, 0x02, 0x01, 0x03, 0x01, 0x04, 0x00, 0x23, 0x00,
    0x00, 0x00, 0x16, 0x00, 0x00, 0x00, 0x17, 0x00, 0x00, 0x00, 0x0d, 0x00, 0x2a, 0x00, 0x28, 0x04,
    0x03, 0x05, 0x03, 0x06, 0x03, 0x08, 0x07, 0x08, 0x08, 0x08, 0x09, 0x08, 0x0a, 0x08, 0x0b, 0x08,
    0x04, 0x08, 0x05, 0x08, 0x06, 0x04, 0x01, 0x05, 0x01, 0x06, 0x01, 0x03, 0x03, 0x03, 0x01, 0x03,
    0x02, 0x04, 0x02, 0x05, 0x02, 0x06, 0x02, 0x00, 0x2b, 0x00, 0x09, 0x08, 0x03, 0x04, 0x03, 0x03,
    0x03, 0x02, 0x03, 0x01, 0x00, 0x2d, 0x00, 0x02, 0x01, 0x01, 0x00, 0x33, 0x00, 0x26, 0x00, 0x24,
    0x00, 0x1d, 0x00, 0x20, 0x6a, 0x48, 0x81, 0x43, 0xa2, 0x59, 0x59, 0x5d, 0x01, 0x73, 0xa6, 0x77,
    0x48, 0x7a, 0x0b, 0xb9, 0x03, 0xe4, 0x9d, 0x62, 0x0b, 0x4e, 0xa4, 0x47, 0x0b, 0x1a, 0xc0, 0xe2,
    0x54, 0xa4, 0x39, 0x25,
};

static const uint8_t curl_hello[] = {
    0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03, 0x8a, 0xfa, 0xb4, 0xe0, 0xe3,
    0xea, 0x9b, 0xb5, 0x96, 0x33, 0xbb, 0x77, 0x31, 0xbd, 0x94, 0xb5, 0xfc, 0x59, 0x79, 0xb7, 0x24,
    0x8b, 0x99, 0xc7, 0xa0, 0xf5, 0x31, 0x06, 0x28, 0x27, 0x95, 0x8d, 0x20, 0x0c, 0x38, 0x66, 0x9e,
    0xe2, 0xd7, 0xe5, 0x93, 0xb2, 0x42, 0xd0, 0xcd, 0x72, 0x79, 0x88, 0xe5, 0x5d, 0x24, 0x1c, 0xe2,
    0x71, 0xb7, 0xb5, 0x42, 0xa8, 0xe3, 0xdf, 0xd1, 0x20, 0x3b, 0x38, 0xd6, 0x00, 0x3e, 0x13, 0x02,
    0x13, 0x03, 0x13, 0x01, 0xc0, 0x2c, 0xc0, 0x30, 0x00, 0x9f, 0xcc, 0xa9, 0xcc, 0xa8, 0xcc, 0xaa,
    0xc0, 0x2b, 0xc0, 0x2f, 0x00, 0x9e, 0xc0, 0x24, 0xc0, 0x28, 0x00, 0x6b, 0xc0, 0x23, 0xc0, 0x27,
    0x00, 0x67, 0xc0, 0x0a, 0xc0, 0x14, 0x00, 0x39, 0xc0, 0x09, 0xc0, 0x13, 0x00, 0x33, 0x00, 0x9d,
    0x00, 0x9c, 0x00, 0x3d, 0x00, 0x3c, 0x00, 0x35, 0x00, 0x2f, 0x00, 0xff, 0x01, 0x00, 0x01, 0x75,
    0x00, 0x00, 0x00, 0x13, 0x00, 0x11, 0x00, 0x00, 0x0e, 0x77, 0x77, 0x77, 0x2e, 0x68, 0x75, 0x74,
    0x63, 0x68, 0x2e, 0x74, 0x65, 0x73, 0x74, 0x00, 0x0b, 0x00, 0x04, 0x03, 0x00, 0x01, 0x02, 0x00,
    0x0a, 0x00, 0x16, 0x00, 0x14, 0x00, 0x1d, 0x00, 0x17, 0x00, 0x1e, 0x00, 0x19, 0x00, 0x18, 0x01,
    0x00, 0x01, 0x01, 0x01, 0x02, 0x01, 0x03, 0x01, 0x04, 0x00, 0x10, 0x00, 0x0e, 0x00, 0x0c, 0x02,
    0x68, 0x32, 0x08, 0x68, 0x74, 0x74, 0x70, 0x2f, 0x31, 0x2e, 0x31, 0x00, 0x16, 0x00, 0x00, 0x00,
    0x17, 0x00, 0x00, 0x00, 0x31, 0x00, 0x00, 0x00, 0x0d, 0x00, 0x2a, 0x00, 0x28, 0x04, 0x03, 0x05,
    0x03, 0x06, 0x03, 0x08, 0x07, 0x08, 0x08, 0x08, 0x09, 0x08, 0x0a, 0x08, 0x0b, 0x08, 0x04, 0x08,
    0x05, 0x08, 0x06, 0x04, 0x01, 0x05, 0x01, 0x06, 0x01, 0x03, 0x03, 0x03, 0x01, 0x03, 0x02, 0x04,
    0x02, 0x05, 0x02, 0x06, 0x02, 0x00, 0x2b, 0x00, 0x09, 0x08, 0x03, 0x04, 0x03, 0x03, 0x03, 0x02,
    0x03, 0x01, 0x00, 0x2d, 0x00, 0x02, 0x01, 0x01, 0x00, 0x33, 0x00, 0x26, 0x00, 0x24, 0x00, 0x1d,
    0x00, 0x20, 0x8b, 0x82, 0x55, 0xb9, 0x65, 0x10, 0xd2, 0xcd, 0x35, 0xc7, 0x8d, 0x1a, 0xe0, 0x19,
    0xb5, 0x58, 0x20, 0x10, 0xf5, 0x82, 0xaa, 0x78, 0x54, 0x0f, 0xef, 0x25, 0x48, 0x89, 0x99, 0xe3,
    0xc6, 0x56, 0x00, 0x15, 0x00, 0xaf, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00,
};

/* ---- builders ---- */

struct w {
  uint8_t *p;
  size_t n;
};

static void u8(struct w *w, unsigned v) { w->p[w->n++] = (uint8_t)v; }
static void u16(struct w *w, unsigned v) {
  u8(w, v >> 8);
  u8(w, v);
}
static void u24(struct w *w, unsigned v) {
  u8(w, v >> 16);
  u16(w, v);
}
static void raw(struct w *w, const void *d, size_t n) {
  if (n) memcpy(w->p + w->n, d, n);
  w->n += n;
}

/* One extension. */
static void ext(struct w *w, unsigned type, const void *data, size_t len) {
  u16(w, type);
  u16(w, (unsigned)len);
  if (len) raw(w, data, len);
}

/* server_name with the given entries: each {type, name, len}. */
struct entry {
  unsigned type;
  const char *name;
  size_t len;
};
static void ext_sni(struct w *w, const struct entry *e, size_t n) {
  uint8_t d[2048];
  struct w x = {d, 0};
  size_t list = 0;
  for (size_t i = 0; i < n; i++) list += 3 + e[i].len;
  u16(&x, (unsigned)list);
  for (size_t i = 0; i < n; i++) {
    u8(&x, e[i].type);
    u16(&x, (unsigned)e[i].len);
    raw(&x, e[i].name, e[i].len);
  }
  ext(w, 0x0000, d, x.n);
}
static void sni1(struct w *w, const char *name) {
  struct entry e = {0, name, strlen(name)};
  ext_sni(w, &e, 1);
}

/* Extensions a TLS 1.3 client sends around the name (GREASE first). */
static void ext_common(struct w *w) {
  static const uint8_t versions[] = {0x04, 0x03, 0x04, 0x03, 0x03};
  static const uint8_t groups[] = {0x00, 0x04, 0x00, 0x1d, 0x00, 0x17};
  ext(w, 0x0a0a, NULL, 0);
  ext(w, 0x002b, versions, sizeof versions);
  ext(w, 0x000a, groups, sizeof groups);
}

/* A ClientHello handshake message with the extensions block exts[0..n)
 * (no block at all when n == SIZE_MAX). */
static size_t hello(uint8_t *out, const uint8_t *exts, size_t n) {
  uint8_t body[70000];
  struct w b = {body, 0};
  u16(&b, 0x0303);
  for (int i = 0; i < 32; i++) u8(&b, (unsigned)i);
  u8(&b, 32);
  for (int i = 0; i < 32; i++) u8(&b, 0xaa);
  u16(&b, 4);
  u16(&b, 0x1301);
  u16(&b, 0xc02f);
  u8(&b, 1);
  u8(&b, 0);
  if (n != SIZE_MAX) {
    u16(&b, (unsigned)n);
    raw(&b, exts, n);
  }
  struct w h = {out, 0};
  u8(&h, 1);
  u24(&h, (unsigned)b.n);
  raw(&h, body, b.n);
  return h.n;
}

/* Handshake bytes as records of at most frag bytes. */
static size_t records(uint8_t *out, const uint8_t *hs, size_t n, size_t frag) {
  struct w r = {out, 0};
  for (size_t off = 0; off < n; off += frag) {
    size_t k = n - off < frag ? n - off : frag;
    u8(&r, 22);
    u16(&r, off ? 0x0303 : 0x0301);
    u16(&r, (unsigned)k);
    raw(&r, hs + off, k);
  }
  return r.n;
}

static uint8_t E[70000], HS[70000], R[140000];

/* A whole record stream for a ClientHello naming `name` (NULL: no SNI). */
static size_t stream(const char *name, size_t frag) {
  struct w e = {E, 0};
  ext_common(&e);
  if (name) sni1(&e, name);
  size_t hn = hello(HS, E, e.n);
  return records(R, HS, hn, frag);
}

static enum hutch_sni_result run(const uint8_t *b, size_t n, struct hutch_sni *s) { return hutch_sni_parse(b, n, s); }

static bool malformed(const uint8_t *b, size_t n, const char *why) {
  struct hutch_sni s;
  enum hutch_sni_result r = run(b, n, &s);
  bool ok_ = r == HUTCH_SNI_MALFORMED && s.why && strstr(s.why, why) && s.host[0] == 0;
  if (!ok_) printf("#   got %s (%s), expected malformed: %s\n", hutch_sni_result_name(r), s.why ? s.why : "-", why);
  return ok_;
}

/* ---- tests ---- */

static void test_real_clients(void) {
  struct hutch_sni s;
  ok(run(openssl_hello, sizeof openssl_hello, &s) == HUTCH_SNI_OK, "openssl s_client's ClientHello");
  is_str(s.host, "hutch-gateway.test", "its name, lowercased");
  ok(s.consumed == sizeof openssl_hello && s.legacy_version == 0x0303, "consumed the whole record, legacy 3.3");
  ok(run(curl_hello, sizeof curl_hello, &s) == HUTCH_SNI_OK, "curl's ClientHello");
  is_str(s.host, "www.hutch.test", "its name");
  size_t need = 0;
  for (size_t n = 0; n < sizeof curl_hello; n++)
    if (run(curl_hello, n, &s) != HUTCH_SNI_NEED_MORE) need++;
  ok(need == 0, "every proper prefix of curl's ClientHello needs more bytes (%zu did not)", need);
  /* Re-fragment the real handshake into records of every size from 1 up. */
  size_t hn = sizeof curl_hello - 5, bad = 0;
  for (size_t frag = 1; frag <= hn; frag += (frag < 40 ? 1 : 37)) {
    size_t n = records(R, curl_hello + 5, hn, frag);
    if (run(R, n, &s) != HUTCH_SNI_OK || strcmp(s.host, "www.hutch.test") || s.consumed != n) bad++;
  }
  ok(bad == 0, "curl's ClientHello fragmented into records of 1..%zu bytes (%zu failures)", hn, bad);
  /* Bytes after the ClientHello's last record are not ours to judge. */
  memcpy(R, openssl_hello, sizeof openssl_hello);
  static const uint8_t ccs[] = {0x14, 0x03, 0x03, 0x00, 0x01, 0x01, 0x17, 0x03};
  memcpy(R + sizeof openssl_hello, ccs, sizeof ccs);
  ok(run(R, sizeof openssl_hello + sizeof ccs, &s) == HUTCH_SNI_OK && s.consumed == sizeof openssl_hello,
     "records after the ClientHello are left alone (consumed stops before them)");
}

static void test_built(void) {
  struct hutch_sni s;
  size_t n = stream("Example.COM", 16384);
  ok(run(R, n, &s) == HUTCH_SNI_OK && !strcmp(s.host, "example.com") && s.consumed == n, "built ClientHello");
  n = stream("example.com.", 16384);
  ok(run(R, n, &s) == HUTCH_SNI_OK && !strcmp(s.host, "example.com"), "a trailing dot is stripped");
  n = stream("xn--bcher-kva.example", 16384);
  ok(run(R, n, &s) == HUTCH_SNI_OK && !strcmp(s.host, "xn--bcher-kva.example"), "punycode name");
  size_t bad = 0;
  for (size_t frag = 1; frag <= 64; frag++) {
    n = stream("a.example.com", frag);
    if (run(R, n, &s) != HUTCH_SNI_OK || strcmp(s.host, "a.example.com")) bad++;
    for (size_t k = 0; k < n; k += 1 + k / 8)
      if (run(R, k, &s) != HUTCH_SNI_NEED_MORE) bad++;
  }
  ok(bad == 0, "fragments of 1..64 bytes, and their prefixes need more (%zu failures)", bad);

  /* No SNI */
  n = stream(NULL, 16384);
  ok(run(R, n, &s) == HUTCH_SNI_NONE && s.host[0] == 0 && s.consumed == n, "no server_name: NONE");
  size_t hn = hello(HS, NULL, SIZE_MAX);
  n = records(R, HS, hn, 16384);
  ok(run(R, n, &s) == HUTCH_SNI_NONE, "no extensions block at all: NONE");
  hn = hello(HS, NULL, 0);
  n = records(R, HS, hn, 16384);
  ok(run(R, n, &s) == HUTCH_SNI_NONE, "an empty extensions block: NONE");

  /* A 16 KiB ClientHello (padded), in two records: accepted; one byte more: refused. */
  for (int extra = 0; extra <= 1; extra++) {
    struct w e = {E, 0};
    ext_common(&e);
    sni1(&e, "big.example.com");
    size_t base = hello(HS, E, e.n) - 4; /* body length so far */
    static uint8_t pad[20000];
    size_t padlen = 16384 - base - 4 + (size_t)extra;
    ext(&e, 0x0015, pad, padlen);
    hn = hello(HS, E, e.n);
    n = records(R, HS, hn, 16384);
    enum hutch_sni_result r = run(R, n, &s);
    if (!extra)
      ok(hn == 4 + 16384 && r == HUTCH_SNI_OK && !strcmp(s.host, "big.example.com"), "a 16 KiB ClientHello over two records");
    else
      ok(r == HUTCH_SNI_MALFORMED && strstr(s.why, "longer than 16 KiB"), "a 16 KiB + 1 ClientHello refused");
    /* The refusal comes as soon as the handshake header is seen. */
    if (extra) ok(run(R, 9, &s) == HUTCH_SNI_MALFORMED, "... from its first 9 bytes");
  }
}

static void test_not_tls(void) {
  struct hutch_sni s;
  static const char get[] = "GET / HTTP/1.1\r\nHost: example.com\r\n\r\n";
  ok(run((const uint8_t *)get, strlen(get), &s) == HUTCH_SNI_NOT_TLS, "HTTP is not TLS");
  ok(run((const uint8_t *)"G", 1, &s) == HUTCH_SNI_NOT_TLS, "one byte is enough to say so");
  static const uint8_t sslv2[] = {0x80, 0x2e, 0x01, 0x00, 0x02};
  ok(run(sslv2, sizeof sslv2, &s) == HUTCH_SNI_NOT_TLS, "an SSLv2 ClientHello is not TLS");
  static const uint8_t v2[] = {0x16, 0x02, 0x00, 0x00, 0x10};
  ok(run(v2, sizeof v2, &s) == HUTCH_SNI_NOT_TLS, "record version 2.x");
  static const uint8_t v35[] = {0x16, 0x03, 0x05, 0x00, 0x10};
  ok(run(v35, sizeof v35, &s) == HUTCH_SNI_NOT_TLS, "record version 3.5");
  static const uint8_t alert[] = {0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28};
  ok(run(alert, sizeof alert, &s) == HUTCH_SNI_NOT_TLS, "an alert record first");
  ok(run(NULL, 0, &s) == HUTCH_SNI_NEED_MORE, "nothing yet: need more");
  static const uint8_t start[] = {0x16, 0x03};
  ok(run(start, 1, &s) == HUTCH_SNI_NEED_MORE && run(start, 2, &s) == HUTCH_SNI_NEED_MORE,
     "positive control: the start of a handshake record needs more");
}

static void test_refusals(void) {
  struct hutch_sni s;
  struct w e;
  size_t hn, n;

  /* multiple names */
  {
    struct entry two[] = {{0, "allowed.com", 11}, {0, "denied.com", 10}};
    e = (struct w){E, 0};
    ext_sni(&e, two, 2);
    hn = hello(HS, E, e.n);
    n = records(R, HS, hn, 16384);
    ok(malformed(R, n, "more than one entry"), "two host_name entries refused");
    e = (struct w){E, 0};
    ext_sni(&e, two, 1);
    hn = hello(HS, E, e.n);
    n = records(R, HS, hn, 16384);
    ok(run(R, n, &s) == HUTCH_SNI_OK && !strcmp(s.host, "allowed.com"), "positive control: one entry");
    struct entry other[] = {{0, "allowed.com", 11}, {1, "x", 1}};
    e = (struct w){E, 0};
    ext_sni(&e, other, 2);
    hn = hello(HS, E, e.n);
    n = records(R, HS, hn, 16384);
    ok(malformed(R, n, "more than one entry"), "a host_name and another type refused");
    e = (struct w){E, 0};
    sni1(&e, "allowed.com");
    sni1(&e, "denied.com");
    hn = hello(HS, E, e.n);
    n = records(R, HS, hn, 16384);
    ok(malformed(R, n, "duplicate extension"), "two server_name extensions refused");
    struct entry t1 = {1, "example.com", 11};
    e = (struct w){E, 0};
    ext_sni(&e, &t1, 1);
    hn = hello(HS, E, e.n);
    n = records(R, HS, hn, 16384);
    ok(malformed(R, n, "not host_name"), "name type 1 refused");
  }

  /* invalid names */
  static const struct {
    const char *name;
    size_t len;
    const char *why;
  } names[] = {
      {"exa mple.com", 12, "invalid character"},
      {"evil.com\0allowed.com", 20, "NUL"},
      {"b\xc3\xbc" "cher.de", 9, "IDNA"},
      {"a/b.com", 7, "invalid character"},
      {"allowed.com\\", 12, "invalid character"},
      {"*.example.com", 13, "invalid character"},
      {"127.0.0.1", 9, "IP address"},
      {"::1", 3, "IP address"},
      {"127.1", 5, "numeric name"},
      {"2130706433", 10, "numeric name"},
      {"a..b", 4, "empty label"},
      {"", 0, "empty host_name"},
  };
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    struct entry en = {0, names[i].name, names[i].len};
    e = (struct w){E, 0};
    ext_sni(&e, &en, 1);
    hn = hello(HS, E, e.n);
    n = records(R, HS, hn, 16384);
    ok(malformed(R, n, names[i].why), "SNI name %zu refused (%s)", i, names[i].why);
  }
  {
    char longname[300];
    memset(longname, 'a', 260);
    for (int i = 50; i < 260; i += 50) longname[i] = '.';
    struct entry en = {0, longname, 260};
    e = (struct w){E, 0};
    ext_sni(&e, &en, 1);
    hn = hello(HS, E, e.n);
    n = records(R, HS, hn, 16384);
    ok(malformed(R, n, "longer than 253"), "a 260-character name refused");
  }

  /* ECH and ESNI */
  static const uint8_t ech[] = {0x00, 0x00, 0x01, 0x00, 0x01, 0x07, 0x00, 0x00, 0x00};
  e = (struct w){E, 0};
  ext_common(&e);
  sni1(&e, "public.example.com");
  ext(&e, 0xfe0d, ech, sizeof ech);
  hn = hello(HS, E, e.n);
  n = records(R, HS, hn, 16384);
  ok(malformed(R, n, "encrypted_client_hello"), "ECH after the outer SNI refused");
  e = (struct w){E, 0};
  ext(&e, 0xfe0d, ech, sizeof ech);
  sni1(&e, "public.example.com");
  hn = hello(HS, E, e.n);
  n = records(R, HS, hn, 16384);
  ok(malformed(R, n, "encrypted_client_hello"), "ECH before the SNI refused");
  e = (struct w){E, 0};
  ext(&e, 0xfe0d, ech, sizeof ech);
  hn = hello(HS, E, e.n);
  n = records(R, HS, hn, 16384);
  ok(malformed(R, n, "encrypted_client_hello"), "ECH without SNI refused");
  e = (struct w){E, 0};
  sni1(&e, "public.example.com");
  ext(&e, 0xffce, ech, sizeof ech);
  hn = hello(HS, E, e.n);
  n = records(R, HS, hn, 16384);
  ok(malformed(R, n, "ESNI"), "draft ESNI refused");
  e = (struct w){E, 0};
  sni1(&e, "public.example.com");
  ext(&e, 0xfe0c, ech, sizeof ech);
  hn = hello(HS, E, e.n);
  n = records(R, HS, hn, 16384);
  ok(run(R, n, &s) == HUTCH_SNI_OK, "positive control: a neighbouring unknown extension (0xfe0c) is fine");

  /* records */
  n = stream("example.com", 40);
  R[45] = 0x17; /* the second record's type: application_data */
  ok(malformed(R, n, "another record type"), "another record type inside the ClientHello");
  n = stream("example.com", 40);
  R[45] = 0x15;
  ok(malformed(R, 46, "another record type"), "an alert inside, seen from its first byte");
  n = stream("example.com", 40);
  R[46] = 0x02;
  ok(malformed(R, n, "record version"), "a later record with version 2.x");
  n = stream("example.com", 16384);
  R[3] = 0;
  R[4] = 0;
  ok(malformed(R, n, "empty handshake record"), "a zero-length record");
  R[3] = 0x40;
  R[4] = 0x01;
  ok(malformed(R, 5, "longer than 16 KiB"), "a record over 16 KiB, refused from its header");
  n = stream("example.com", 16384);
  R[n] = 0x00;
  R[4]++;
  ok(malformed(R, n + 1, "data after the ClientHello"), "a byte after the ClientHello in its record");
  R[4] += 20;
  ok(malformed(R, 5 + 4, "data after the ClientHello"), "... refused once the lengths say so");
  n = stream("example.com", 16384);
  R[5] = 2;
  ok(malformed(R, n, "not a ClientHello"), "a ServerHello");
  n = stream("example.com", 16384);
  R[6] = 0;
  R[7] = 0;
  R[8] = 10;
  ok(malformed(R, n, "too short"), "a ClientHello too short to be one");
  /* A small ClientHello in 1-byte records grows past 20 KiB of input. */
  e = (struct w){E, 0};
  sni1(&e, "example.com");
  static uint8_t pad[4000];
  ext(&e, 0x0015, pad, sizeof pad);
  hn = hello(HS, E, e.n);
  n = records(R, HS, hn, 1);
  ok(malformed(R, n, "20 KiB"), "a ClientHello spread over more than 20 KiB of records");
  n = records(R, HS, hn, 1000);
  ok(run(R, n, &s) == HUTCH_SNI_OK, "positive control: the same in 1000-byte records");

  /* ClientHello structure */
  n = stream("example.com", 16384);
  R[9] = 0x02;
  ok(malformed(R, n, "legacy_version"), "legacy_version 2.x");
  n = stream("example.com", 16384);
  R[5 + 4 + 2 + 32] = 33;
  ok(malformed(R, n, "session_id"), "session_id of 33 bytes");
  n = stream("example.com", 16384);
  R[5 + 4 + 2 + 32 + 1 + 32 + 1] = 3;
  ok(malformed(R, n, "cipher_suites"), "an odd cipher_suites length");
  n = stream("example.com", 16384);
  R[5 + 4 + 2 + 32 + 1 + 32 + 2 + 4] = 0;
  ok(malformed(R, n, "compression_methods"), "no compression methods");
  n = stream("example.com", 16384);
  R[5 + 4 + 2 + 32 + 1 + 32 + 2 + 4 + 2 + 1]++;
  ok(malformed(R, n, "extensions length"), "extensions length one too long");
  /* server_name list length that disagrees with its extension */
  e = (struct w){E, 0};
  sni1(&e, "example.com");
  E[5]++; /* list length */
  hn = hello(HS, E, e.n);
  n = records(R, HS, hn, 16384);
  ok(malformed(R, n, "list length"), "server_name list length mismatch");
  e = (struct w){E, 0};
  sni1(&e, "example.com");
  E[8]++; /* the name's length */
  hn = hello(HS, E, e.n);
  n = records(R, HS, hn, 16384);
  ok(malformed(R, n, "truncated entry"), "server_name entry longer than its list");
  e = (struct w){E, 0};
  ext(&e, 0x0000, NULL, 0);
  hn = hello(HS, E, e.n);
  n = records(R, HS, hn, 16384);
  ok(malformed(R, n, "list length"), "an empty server_name extension");
}

int main(void) {
  test_real_clients();
  test_built();
  test_not_tls();
  test_refusals();
  return done_testing();
}
