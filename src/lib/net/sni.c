/* TLS ClientHello server_name extraction (rules in sni.h).
 *
 * Structure (RFC 8446 4.1.2, RFC 5246 7.4.1.2, RFC 6066 3):
 *   record:       type(1)=22 version(2)=3.x length(2) fragment
 *   handshake:    msg_type(1)=1 length(3) body
 *   ClientHello:  legacy_version(2) random(32) session_id<0..32>
 *                 cipher_suites<2..2^16-2> compression_methods<1..2^8-1>
 *                 extensions<8..2^16-1> (absent in old clients)
 *   extension:    type(2) data<0..2^16-1>
 *   server_name:  ServerNameList<1..2^16-1> of name_type(1) HostName<1..2^16-1>
 */
#include "net/sni.h"

#include <string.h>

#define REC_HDR 5
#define REC_MAX 16384
#define HS_HDR 4
#define EXT_SERVER_NAME 0x0000
#define EXT_ECH 0xfe0d
#define EXT_ESNI 0xffce

const char *hutch_sni_result_name(enum hutch_sni_result r) {
  switch (r) {
  case HUTCH_SNI_OK: return "ok";
  case HUTCH_SNI_NEED_MORE: return "need_more";
  case HUTCH_SNI_NOT_TLS: return "not_tls";
  case HUTCH_SNI_NONE: return "no_sni";
  case HUTCH_SNI_MALFORMED: return "malformed";
  }
  return "unknown";
}

static enum hutch_sni_result fail(struct hutch_sni *out, enum hutch_sni_result r, const char *why) {
  out->host[0] = 0;
  out->why = why;
  return r;
}

/* A bounds-checked reader over the reassembled handshake body. */
struct rd {
  const uint8_t *p;
  size_t n, off;
};

static int rd_u8(struct rd *r, unsigned *v) {
  if (r->n - r->off < 1) return -1;
  *v = r->p[r->off++];
  return 0;
}

static int rd_u16(struct rd *r, unsigned *v) {
  if (r->n - r->off < 2) return -1;
  *v = (unsigned)r->p[r->off] << 8 | r->p[r->off + 1];
  r->off += 2;
  return 0;
}

static int rd_skip(struct rd *r, size_t k) {
  if (r->n - r->off < k) return -1;
  r->off += k;
  return 0;
}

#define MALFORMED(msg) return fail(out, HUTCH_SNI_MALFORMED, msg)

static enum hutch_sni_result parse_server_name(const uint8_t *p, size_t n, struct hutch_sni *out) {
  struct rd r = {p, n, 0};
  unsigned list, type, len;
  if (rd_u16(&r, &list) < 0 || list != n - 2) MALFORMED("server_name: list length does not match the extension");
  if (list == 0) MALFORMED("server_name: empty list");
  if (rd_u8(&r, &type) < 0 || rd_u16(&r, &len) < 0 || len > n - r.off) MALFORMED("server_name: truncated entry");
  const uint8_t *name = p + r.off;
  r.off += len;
  if (r.off != n) MALFORMED("server_name: more than one entry");
  if (type != 0) MALFORMED("server_name: name type is not host_name");
  if (len == 0) MALFORMED("server_name: empty host_name");
  if (len > HUTCH_NAME_MAX + 1) MALFORMED("server_name: host_name longer than 253 characters");
  struct hutch_host h;
  const char *why = NULL;
  if (hutch_host_parse((const char *)name, len, &h, &why) < 0) {
    out->why = why;
    out->host[0] = 0;
    return HUTCH_SNI_MALFORMED;
  }
  if (h.kind != HUTCH_HOST_NAME) MALFORMED("server_name: an IP address (RFC 6066 allows only names)");
  memcpy(out->host, h.text, sizeof out->host);
  return HUTCH_SNI_OK;
}

static enum hutch_sni_result parse_hello(const uint8_t *p, size_t n, struct hutch_sni *out) {
  struct rd r = {p, n, 0};
  unsigned ver, sid, cs, comp, ext_total;
  if (rd_u16(&r, &ver) < 0 || (ver >> 8) != 3) MALFORMED("ClientHello: legacy_version is not 3.x");
  out->legacy_version = (uint16_t)ver;
  if (rd_skip(&r, 32) < 0) MALFORMED("ClientHello: truncated random");
  if (rd_u8(&r, &sid) < 0 || sid > 32 || rd_skip(&r, sid) < 0) MALFORMED("ClientHello: bad session_id");
  if (rd_u16(&r, &cs) < 0 || cs < 2 || cs % 2 || rd_skip(&r, cs) < 0) MALFORMED("ClientHello: bad cipher_suites");
  if (rd_u8(&r, &comp) < 0 || comp < 1 || rd_skip(&r, comp) < 0) MALFORMED("ClientHello: bad compression_methods");
  if (r.off == n) return fail(out, HUTCH_SNI_NONE, "no extensions");
  if (rd_u16(&r, &ext_total) < 0 || ext_total != n - r.off) MALFORMED("ClientHello: extensions length does not match");
  uint8_t seen[65536 / 8];
  memset(seen, 0, sizeof seen);
  enum hutch_sni_result res = HUTCH_SNI_NONE;
  char host[HUTCH_NAME_MAX + 1] = "";
  while (r.off < n) {
    unsigned type, len;
    if (rd_u16(&r, &type) < 0 || rd_u16(&r, &len) < 0 || len > n - r.off) MALFORMED("ClientHello: truncated extension");
    if (seen[type / 8] & (1u << (type % 8))) MALFORMED("ClientHello: duplicate extension");
    seen[type / 8] |= (uint8_t)(1u << (type % 8));
    if (type == EXT_ECH) MALFORMED("encrypted_client_hello (ECH): the real server name is hidden from the gateway");
    if (type == EXT_ESNI) MALFORMED("encrypted_server_name (ESNI): the real server name is hidden from the gateway");
    if (type == EXT_SERVER_NAME) {
      res = parse_server_name(p + r.off, len, out);
      if (res != HUTCH_SNI_OK) return res;
      memcpy(host, out->host, sizeof host);
    }
    r.off += len;
  }
  /* Later extensions (ECH) may follow the server_name: decide at the end. */
  memcpy(out->host, host, sizeof out->host);
  out->why = res == HUTCH_SNI_OK ? NULL : "no server_name extension";
  return res;
}

enum hutch_sni_result hutch_sni_parse(const uint8_t *buf, size_t len, struct hutch_sni *out) {
  memset(out, 0, sizeof *out);
  uint8_t hs[HS_HDR + HUTCH_SNI_HELLO_MAX];
  size_t have = 0;  /* handshake bytes gathered */
  size_t total = 0; /* HS_HDR + body length, once the header is known */
  size_t off = 0;
  for (bool first = true;; first = false) {
    size_t avail = len - off;
    /* What of the record header has arrived must be right. */
    if (avail >= 1 && buf[off] != 22)
      return first ? fail(out, HUTCH_SNI_NOT_TLS, "not a TLS handshake record")
                   : fail(out, HUTCH_SNI_MALFORMED, "another record type inside the ClientHello");
    if (avail >= 2 && buf[off + 1] != 3)
      return first ? fail(out, HUTCH_SNI_NOT_TLS, "not TLS (record version is not 3.x)")
                   : fail(out, HUTCH_SNI_MALFORMED, "record version is not 3.x");
    if (avail >= 3 && buf[off + 2] > 4)
      return fail(out, first ? HUTCH_SNI_NOT_TLS : HUTCH_SNI_MALFORMED, "unknown record version");
    if (off + REC_HDR > HUTCH_SNI_INPUT_MAX) MALFORMED("ClientHello spread over more than 20 KiB of records");
    if (avail < REC_HDR) return fail(out, HUTCH_SNI_NEED_MORE, "need more bytes");
    size_t rlen = (size_t)buf[off + 3] << 8 | buf[off + 4];
    if (rlen == 0) MALFORMED("empty handshake record");
    if (rlen > REC_MAX) MALFORMED("record longer than 16 KiB");
    if (off + REC_HDR + rlen > HUTCH_SNI_INPUT_MAX) MALFORMED("ClientHello spread over more than 20 KiB of records");
    if (total && rlen > total - have) MALFORMED("data after the ClientHello in its record");
    const uint8_t *rec = buf + off + REC_HDR;
    size_t got = avail - REC_HDR < rlen ? avail - REC_HDR : rlen;
    size_t pos = 0;
    while (pos < got) {
      if (!total) {
        hs[have++] = rec[pos++];
        if (have < HS_HDR) continue;
        if (hs[0] != 1) MALFORMED("the first handshake message is not a ClientHello");
        size_t body = (size_t)hs[1] << 16 | (size_t)hs[2] << 8 | hs[3];
        if (body > HUTCH_SNI_HELLO_MAX) MALFORMED("ClientHello longer than 16 KiB");
        if (body < 2 + 32 + 1 + 2 + 2 + 1 + 1) MALFORMED("ClientHello too short");
        total = HS_HDR + body;
        if (rlen - pos > total - have) MALFORMED("data after the ClientHello in its record");
        continue;
      }
      size_t take = got - pos; /* <= total - have, checked above */
      memcpy(hs + have, rec + pos, take);
      have += take;
      pos += take;
    }
    if (got < rlen) return fail(out, HUTCH_SNI_NEED_MORE, "need more bytes");
    off += REC_HDR + rlen;
    if (total && have == total) break;
  }
  out->consumed = off;
  return parse_hello(hs + HS_HDR, total - HS_HDR, out);
}
