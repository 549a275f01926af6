/* DNS messages for hutch-gateway (see dns.h). */
#include "gateway/dns.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static uint32_t get32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }
static void put16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)(v >> 8);
  p[1] = (uint8_t)v;
}
static void put32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24);
  p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8);
  p[3] = (uint8_t)v;
}

static bool host_char(uint8_t c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* Append one label to a presentation name (out has room for 255 bytes and
 * a NUL: a wire name is at most 255 bytes, its text at most 253).  Bytes
 * that a name may not hold become '?' and clear *ok. */
static void put_label(char *out, size_t *o, const uint8_t *lab, size_t n, bool *ok) {
  if (*o) out[(*o)++] = '.';
  for (size_t i = 0; i < n; i++) {
    uint8_t c = lab[i];
    if (!host_char(c)) {
      *ok = false;
      c = '?';
    }
    out[(*o)++] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
  }
  out[*o] = 0;
}

/* ---- the responder: queries in, answers out ---- */

enum gw_dns_parse gw_dns_parse_query(const uint8_t *msg, size_t len, struct gw_dns_query *q) {
  memset(q, 0, sizeof *q);
  if (!msg || len < GW_DNS_HDR) {
    q->why = "shorter than a DNS header";
    return GW_DNS_QUERY_DROP;
  }
  q->id = get16(msg);
  uint16_t flags = get16(msg + 2);
  q->rd = flags & 0x0100;
  if (flags & 0x8000) {
    q->why = "a response, not a query";
    return GW_DNS_QUERY_DROP;
  }
  if (len > GW_DNS_QUERY_MAX) {
    q->why = "query too long";
    return GW_DNS_QUERY_FORMERR;
  }
  if (((flags >> 11) & 0xf) != 0) {
    q->why = "opcode is not QUERY";
    return GW_DNS_QUERY_NOTIMP;
  }
  if (flags & 0x0200) {
    q->why = "TC set in a query";
    return GW_DNS_QUERY_FORMERR;
  }
  uint16_t qd = get16(msg + 4), an = get16(msg + 6), ns = get16(msg + 8), ar = get16(msg + 10);
  if (qd != 1) {
    q->why = "not exactly one question";
    return GW_DNS_QUERY_FORMERR;
  }
  if (an || ns) {
    q->why = "records in the answer or authority section";
    return GW_DNS_QUERY_FORMERR;
  }
  if (ar > 1) {
    q->why = "more than one additional record";
    return GW_DNS_QUERY_FORMERR;
  }
  size_t off = GW_DNS_HDR, wire = 0, o = 0;
  bool ok = true;
  q->name[0] = 0;
  for (;;) {
    if (off >= len) {
      q->why = "name runs past the message";
      return GW_DNS_QUERY_FORMERR;
    }
    uint8_t l = msg[off];
    if (l & 0xc0) {
      q->why = (l & 0xc0) == 0xc0 ? "compression in the question" : "unknown label type";
      return GW_DNS_QUERY_FORMERR;
    }
    wire += 1u + l;
    if (wire > 255) {
      q->why = "name longer than 255 bytes";
      return GW_DNS_QUERY_FORMERR;
    }
    off++;
    if (l == 0) break;
    if (off + l > len) {
      q->why = "label runs past the message";
      return GW_DNS_QUERY_FORMERR;
    }
    put_label(q->name, &o, msg + off, l, &ok);
    off += l;
  }
  if (off + 4 > len) {
    q->why = "question without type and class";
    return GW_DNS_QUERY_FORMERR;
  }
  q->qtype = get16(msg + off);
  q->qclass = get16(msg + off + 2);
  off += 4;
  q->qlen = off - GW_DNS_HDR;
  q->name_ok = ok && o > 0;
  if (ar == 1) {
    /* Only EDNS: root name, type OPT, class = UDP size, TTL, RDATA. */
    if (off + 11 > len || msg[off] != 0 || get16(msg + off + 1) != GW_DNS_TYPE_OPT) {
      q->why = "an additional record that is not EDNS OPT";
      return GW_DNS_QUERY_FORMERR;
    }
    size_t rdlen = get16(msg + off + 9);
    off += 11;
    if (off + rdlen > len) {
      q->why = "OPT record runs past the message";
      return GW_DNS_QUERY_FORMERR;
    }
    off += rdlen;
  }
  if (off != len) {
    q->why = "bytes after the last record";
    return GW_DNS_QUERY_FORMERR;
  }
  if (q->qclass != GW_DNS_CLASS_IN) {
    q->why = "class is not IN";
    return GW_DNS_QUERY_NOTIMP;
  }
  if (q->qtype == GW_DNS_TYPE_OPT || q->qtype == 0) {
    q->why = "query type not allowed";
    return GW_DNS_QUERY_FORMERR;
  }
  return GW_DNS_QUERY_OK;
}

size_t gw_dns_build_answer(const uint8_t *query, const struct gw_dns_query *q, int rcode, const uint8_t (*addrs)[4],
                           size_t n, uint32_t ttl, uint8_t *out, size_t cap) {
  if (cap < GW_DNS_HDR) return 0;
  bool with_q = q->qlen > 0 && query && GW_DNS_HDR + q->qlen <= cap;
  uint16_t flags = (uint16_t)(0x8000 | (q->rd ? 0x0100 : 0) | 0x0080 | (rcode & 0xf));
  put16(out, q->id);
  put16(out + 2, flags);
  put16(out + 4, with_q ? 1 : 0);
  put16(out + 6, 0);
  put16(out + 8, 0);
  put16(out + 10, 0);
  size_t off = GW_DNS_HDR;
  if (!with_q) return off;
  memcpy(out + off, query + GW_DNS_HDR, q->qlen);
  off += q->qlen;
  if (rcode != GW_DNS_NOERROR || !addrs) return off;
  if (ttl > GW_DNS_MAX_TTL) ttl = GW_DNS_MAX_TTL;
  uint16_t an = 0;
  for (size_t i = 0; i < n && off + 16 <= cap; i++) {
    put16(out + off, 0xc000 | GW_DNS_HDR); /* the question's name */
    put16(out + off + 2, GW_DNS_TYPE_A);
    put16(out + off + 4, GW_DNS_CLASS_IN);
    put32(out + off + 6, ttl);
    put16(out + off + 10, 4);
    memcpy(out + off + 12, addrs[i], 4);
    off += 16;
    an++;
  }
  put16(out + 6, an);
  return off;
}

/* ---- the resolver: queries out, answers in ---- */

size_t gw_dns_build_query(uint16_t id, const char *name, uint16_t qtype, uint8_t *out, size_t cap) {
  size_t nl = name ? strlen(name) : 0;
  if (nl == 0 || nl > GW_DNS_NAME_MAX || cap < GW_DNS_HDR + nl + 2 + 4) return 0;
  put16(out, id);
  put16(out + 2, 0x0100); /* RD */
  put16(out + 4, 1);
  put16(out + 6, 0);
  put16(out + 8, 0);
  put16(out + 10, 0);
  size_t off = GW_DNS_HDR;
  const char *p = name;
  while (*p) {
    const char *dot = strchr(p, '.');
    size_t l = dot ? (size_t)(dot - p) : strlen(p);
    if (l == 0 || l > 63) return 0;
    for (size_t i = 0; i < l; i++)
      if (!host_char((uint8_t)p[i])) return 0;
    out[off++] = (uint8_t)l;
    memcpy(out + off, p, l);
    off += l;
    p += l;
    if (*p == '.') {
      p++;
      if (!*p) return 0; /* a trailing dot: the caller normalises */
    }
  }
  out[off++] = 0;
  put16(out + off, qtype);
  put16(out + off + 2, GW_DNS_CLASS_IN);
  return off + 4;
}

/* Read a possibly compressed name at *off into out (lowercase text, 256
 * bytes).  *off moves past the name as it lies in place.  Pointers must go
 * to a position before every position read so far (so they cannot loop),
 * at most 64 of them, and the name is at most 255 bytes on the wire. */
static int read_name(const uint8_t *m, size_t len, size_t *off, char out[256]) {
  size_t pos = *off, lowest = *off, wire = 0, o = 0;
  bool jumped = false, ok = true;
  int jumps = 0;
  out[0] = 0;
  for (;;) {
    if (pos >= len) return -1;
    uint8_t l = m[pos];
    if ((l & 0xc0) == 0xc0) {
      if (pos + 1 >= len) return -1;
      size_t target = (size_t)((l & 0x3f) << 8 | m[pos + 1]);
      if (!jumped) *off = pos + 2;
      jumped = true;
      if (target >= lowest || ++jumps > 64) return -1;
      lowest = target;
      pos = target;
      continue;
    }
    if (l & 0xc0) return -1;
    wire += 1u + l;
    if (wire > 255) return -1;
    if (l == 0) {
      if (!jumped) *off = pos + 1;
      break;
    }
    if (pos + 1 + l > len) return -1;
    put_label(out, &o, m + pos + 1, l, &ok);
    pos += 1u + l;
  }
  return ok ? 0 : -1;
}

#define MAX_RRS 64
#define MAX_CHAIN 8

struct rr {
  size_t owner; /* offset of the owner name */
  uint16_t type;
  uint32_t ttl;
  size_t rdata, rdlen;
};

static int answer_fail(struct gw_dns_result *res, const char *why) {
  res->why = why;
  res->n = 0;
  return -1;
}

int gw_dns_parse_answer(const uint8_t *msg, size_t len, uint16_t id, const char *name, uint16_t qtype,
                        struct gw_dns_result *res) {
  memset(res, 0, sizeof *res);
  if (!msg || len < GW_DNS_HDR) return answer_fail(res, "shorter than a DNS header");
  if (get16(msg) != id) return answer_fail(res, "wrong ID");
  uint16_t flags = get16(msg + 2);
  if (!(flags & 0x8000)) return answer_fail(res, "not a response");
  if (((flags >> 11) & 0xf) != 0) return answer_fail(res, "opcode is not QUERY");
  if (get16(msg + 4) != 1) return answer_fail(res, "not exactly one question");
  size_t off = GW_DNS_HDR;
  char qn[256];
  if (read_name(msg, len, &off, qn) < 0) return answer_fail(res, "bad name in the question");
  if (off + 4 > len) return answer_fail(res, "question without type and class");
  if (strcasecmp(qn, name) != 0 || get16(msg + off) != qtype || get16(msg + off + 2) != GW_DNS_CLASS_IN)
    return answer_fail(res, "the question is not the one asked");
  off += 4;
  res->rcode = flags & 0xf;
  res->truncated = flags & 0x0200;
  if (res->truncated || res->rcode != GW_DNS_NOERROR) return 0;

  uint16_t an = get16(msg + 6);
  struct rr rrs[MAX_RRS];
  size_t nrr = 0;
  for (uint16_t i = 0; i < an; i++) {
    struct rr r;
    char tmp[256];
    r.owner = off;
    if (read_name(msg, len, &off, tmp) < 0) return answer_fail(res, "bad owner name in an answer");
    if (off + 10 > len) return answer_fail(res, "answer record runs past the message");
    r.type = get16(msg + off);
    uint16_t cls = get16(msg + off + 2);
    r.ttl = get32(msg + off + 4);
    if (r.ttl > 0x7fffffffu) r.ttl = 0; /* RFC 2181 8 */
    r.rdlen = get16(msg + off + 8);
    r.rdata = off + 10;
    off += 10 + r.rdlen;
    if (off > len) return answer_fail(res, "answer record runs past the message");
    if (cls != GW_DNS_CLASS_IN) continue;
    if (r.type == GW_DNS_TYPE_A && r.rdlen != 4) return answer_fail(res, "A record whose data is not 4 bytes");
    if (r.type == GW_DNS_TYPE_CNAME) {
      size_t e = r.rdata;
      if (read_name(msg, len, &e, tmp) < 0 || e != r.rdata + r.rdlen) return answer_fail(res, "bad CNAME data");
    }
    if ((r.type == GW_DNS_TYPE_A || r.type == GW_DNS_TYPE_CNAME) && nrr < MAX_RRS) rrs[nrr++] = r;
  }

  /* Follow the CNAME chain from the asked name. */
  char target[256], owner[256];
  snprintf(target, sizeof target, "%s", qn);
  uint32_t ttl = UINT32_MAX;
  for (int step = 0;; step++) {
    bool moved = false;
    for (size_t i = 0; i < nrr && !moved; i++) {
      if (rrs[i].type != GW_DNS_TYPE_CNAME) continue;
      size_t o = rrs[i].owner;
      if (read_name(msg, len, &o, owner) < 0) return answer_fail(res, "bad owner name in an answer");
      if (strcmp(owner, target) != 0) continue;
      if (step >= MAX_CHAIN) return answer_fail(res, "CNAME chain too long");
      size_t e = rrs[i].rdata;
      if (read_name(msg, len, &e, target) < 0) return answer_fail(res, "bad CNAME data");
      if (rrs[i].ttl < ttl) ttl = rrs[i].ttl;
      moved = true;
    }
    if (!moved) break;
  }
  if (qtype != GW_DNS_TYPE_A) return 0;
  for (size_t i = 0; i < nrr; i++) {
    if (rrs[i].type != GW_DNS_TYPE_A) continue;
    size_t o = rrs[i].owner;
    if (read_name(msg, len, &o, owner) < 0) return answer_fail(res, "bad owner name in an answer");
    if (strcmp(owner, target) != 0) continue;
    bool dup = false;
    for (size_t k = 0; k < res->n; k++)
      if (!memcmp(res->addr[k], msg + rrs[i].rdata, 4)) dup = true;
    if (dup || res->n >= GW_DNS_MAX_ADDRS) continue;
    memcpy(res->addr[res->n++], msg + rrs[i].rdata, 4);
    if (rrs[i].ttl < ttl) ttl = rrs[i].ttl;
  }
  res->ttl = res->n ? ttl : 0;
  return 0;
}
