/* DNS messages for hutch-gateway (src/lib/gateway/dns.c): the responder's
 * strict query parser (each malformed form next to the valid one), the
 * answer encoder, the resolver's query encoder and its answer checker
 * (spoofed IDs and questions, compression loops, CNAME chains, limits). */
#include <arpa/inet.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/dns.h"
#include "tap.h"

struct msg {
  uint8_t b[4096];
  size_t n;
};

static void put(struct msg *m, const void *p, size_t n) {
  memcpy(m->b + m->n, p, n);
  m->n += n;
}
static void put8(struct msg *m, uint8_t v) { put(m, &v, 1); }
static void put16(struct msg *m, uint16_t v) {
  uint8_t b[2] = {(uint8_t)(v >> 8), (uint8_t)v};
  put(m, b, 2);
}
static void put32(struct msg *m, uint32_t v) {
  put16(m, (uint16_t)(v >> 16));
  put16(m, (uint16_t)v);
}
static void name(struct msg *m, const char *s) {
  while (*s) {
    const char *dot = strchr(s, '.');
    size_t l = dot ? (size_t)(dot - s) : strlen(s);
    put8(m, (uint8_t)l);
    put(m, s, l);
    s += l;
    if (*s == '.') s++;
  }
  put8(m, 0);
}
static void header(struct msg *m, uint16_t id, uint16_t flags, uint16_t qd, uint16_t an, uint16_t ns, uint16_t ar) {
  m->n = 0;
  put16(m, id);
  put16(m, flags);
  put16(m, qd);
  put16(m, an);
  put16(m, ns);
  put16(m, ar);
}
static void query(struct msg *m, const char *qname, uint16_t qtype) {
  header(m, 0xbeef, 0x0100, 1, 0, 0, 0);
  name(m, qname);
  put16(m, qtype);
  put16(m, 1);
}

static struct gw_dns_query q;

static enum gw_dns_parse parse(const struct msg *m) { return gw_dns_parse_query(m->b, m->n, &q); }

static bool formerr(const struct msg *m, const char *why) {
  enum gw_dns_parse r = parse(m);
  bool ok_ = r == GW_DNS_QUERY_FORMERR && q.why && strstr(q.why, why) && q.id == 0xbeef;
  if (!ok_) printf("#   result %d (%s), expected FORMERR: %s\n", r, q.why ? q.why : "-", why);
  return ok_;
}

static void test_query_valid(void) {
  struct msg m;
  query(&m, "Pypi.ORG", 1);
  ok(parse(&m) == GW_DNS_QUERY_OK, "a plain A query");
  is_str(q.name, "pypi.org", "name lowercased");
  ok(q.id == 0xbeef && q.rd && q.qtype == 1 && q.qclass == 1 && q.name_ok, "id, rd, type, class");
  ok(q.qlen == m.n - GW_DNS_HDR, "question length");

  query(&m, "a_b-c.example.com", 28);
  ok(parse(&m) == GW_DNS_QUERY_OK && q.name_ok && q.qtype == 28, "AAAA, '_' and '-' in labels");

  /* EDNS: one OPT record in the additional section. */
  query(&m, "example.com", 1);
  m.b[11] = 1;
  put8(&m, 0);
  put16(&m, 41);
  put16(&m, 1232);
  put32(&m, 0);
  put16(&m, 4);
  put32(&m, 0x000a0000);
  ok(parse(&m) == GW_DNS_QUERY_OK, "EDNS OPT with an option");

  /* The longest name: 253 characters of text, 255 bytes on the wire. */
  char longname[300];
  memset(longname, 'a', 253);
  longname[63] = longname[127] = longname[191] = '.'; /* 63.63.63.61 */
  longname[253] = 0;
  ok(strlen(longname) == 253, "the long name is 253 characters");
  query(&m, longname, 1);
  ok(parse(&m) == GW_DNS_QUERY_OK && strlen(q.name) == 253, "a 255-byte wire name");
  strcat(longname, "a");
  query(&m, longname, 1);
  ok(formerr(&m, "longer than 255"), "a 256-byte wire name: FORMERR");

  /* Well-formed but not a name anyone may be allowed: name_ok false. */
  header(&m, 0xbeef, 0x0100, 1, 0, 0, 0);
  put8(&m, 3);
  put(&m, "a.b", 3);
  put8(&m, 3);
  put(&m, "com", 3);
  put8(&m, 0);
  put16(&m, 1);
  put16(&m, 1);
  ok(parse(&m) == GW_DNS_QUERY_OK && !q.name_ok, "a '.' inside a label: parsed, name not ok");
  header(&m, 0xbeef, 0x0100, 1, 0, 0, 0);
  put8(&m, 4);
  put(&m, "a\0bc", 4);
  put8(&m, 0);
  put16(&m, 1);
  put16(&m, 1);
  ok(parse(&m) == GW_DNS_QUERY_OK && !q.name_ok && !memchr(q.name, 0, 4), "a NUL inside a label: name not ok");
  query(&m, "", 1);
  ok(parse(&m) == GW_DNS_QUERY_OK && !q.name_ok && q.name[0] == 0, "the root name: not ok");
}

static void test_query_refused(void) {
  struct msg m;
  query(&m, "example.com", 1);
  ok(gw_dns_parse_query(m.b, 11, &q) == GW_DNS_QUERY_DROP, "shorter than a header: dropped");
  ok(gw_dns_parse_query(NULL, 0, &q) == GW_DNS_QUERY_DROP, "nothing: dropped");
  m.b[2] |= 0x80;
  ok(parse(&m) == GW_DNS_QUERY_DROP, "QR set (a response): dropped, never answered");

  query(&m, "example.com", 1);
  m.b[2] |= 0x08; /* opcode 1 */
  ok(parse(&m) == GW_DNS_QUERY_NOTIMP && q.id == 0xbeef, "opcode IQUERY: NOTIMP");
  query(&m, "example.com", 1);
  m.b[m.n - 1] = 3; /* class CH */
  ok(parse(&m) == GW_DNS_QUERY_NOTIMP, "class CH: NOTIMP");

  query(&m, "example.com", 1);
  m.b[5] = 0;
  ok(formerr(&m, "one question"), "no question");
  query(&m, "example.com", 1);
  m.b[5] = 2;
  ok(formerr(&m, "one question"), "two questions claimed");
  query(&m, "example.com", 1);
  m.b[7] = 1;
  ok(formerr(&m, "answer or authority"), "an answer record in a query");
  query(&m, "example.com", 1);
  m.b[9] = 1;
  ok(formerr(&m, "answer or authority"), "an authority record in a query");
  query(&m, "example.com", 1);
  m.b[11] = 2;
  ok(formerr(&m, "more than one additional"), "two additional records");
  query(&m, "example.com", 1);
  m.b[3] |= 0x00;
  m.b[2] |= 0x02;
  ok(formerr(&m, "TC"), "TC set in a query");

  /* Compression in the question: a pointer to itself would loop. */
  header(&m, 0xbeef, 0x0100, 1, 0, 0, 0);
  put16(&m, 0xc00c);
  put16(&m, 1);
  put16(&m, 1);
  ok(formerr(&m, "compression"), "a compression pointer (to itself) in the question");
  header(&m, 0xbeef, 0x0100, 1, 0, 0, 0);
  put8(&m, 0x41);
  put8(&m, 0);
  put16(&m, 1);
  put16(&m, 1);
  ok(formerr(&m, "label type"), "an extended label type");

  query(&m, "example.com", 1);
  ok(gw_dns_parse_query(m.b, m.n - 4, &q) == GW_DNS_QUERY_FORMERR, "no type and class");
  ok(gw_dns_parse_query(m.b, 15, &q) == GW_DNS_QUERY_FORMERR, "label runs past the end");
  ok(gw_dns_parse_query(m.b, 12 + 13, &q) == GW_DNS_QUERY_FORMERR, "no terminating label");
  query(&m, "example.com", 1);
  put8(&m, 0);
  ok(formerr(&m, "bytes after"), "a byte after the question");

  query(&m, "example.com", 1);
  m.b[11] = 1;
  name(&m, "x");
  put16(&m, 1);
  put16(&m, 1);
  put32(&m, 0);
  put16(&m, 0);
  ok(formerr(&m, "not EDNS"), "an additional A record");
  query(&m, "example.com", 1);
  m.b[11] = 1;
  put8(&m, 0);
  put16(&m, 41);
  put16(&m, 1232);
  put32(&m, 0);
  put16(&m, 10);
  ok(formerr(&m, "OPT record runs past"), "an OPT record whose data is missing");

  query(&m, "example.com", 41);
  ok(formerr(&m, "type"), "QTYPE OPT");
  query(&m, "example.com", 0);
  ok(formerr(&m, "type"), "QTYPE 0");

  uint8_t big[GW_DNS_QUERY_MAX + 1];
  query(&m, "example.com", 1);
  memset(big, 0, sizeof big);
  memcpy(big, m.b, m.n);
  ok(gw_dns_parse_query(big, sizeof big, &q) == GW_DNS_QUERY_FORMERR, "longer than GW_DNS_QUERY_MAX");
}

static void test_answer_build(void) {
  struct msg m;
  query(&m, "Example.com", 1);
  ok(parse(&m) == GW_DNS_QUERY_OK, "query");
  uint8_t addrs[3][4] = {{93, 184, 216, 34}, {93, 184, 216, 35}, {1, 2, 3, 4}};
  uint8_t out[512];
  size_t n = gw_dns_build_answer(m.b, &q, GW_DNS_NOERROR, (const uint8_t(*)[4])addrs, 2, 3600, out, sizeof out);
  ok(n == 12 + q.qlen + 2 * 16, "two A records");
  ok(out[0] == 0xbe && out[1] == 0xef && (out[2] & 0x80) && (out[2] & 0x01) && (out[3] & 0x80) && (out[3] & 0xf) == 0,
     "id, QR, RD echoed, RA, NOERROR");
  ok(!memcmp(out + 12, m.b + 12, q.qlen), "the question echoed as sent (case kept)");
  struct gw_dns_result res;
  ok(gw_dns_parse_answer(out, n, 0xbeef, "example.com", 1, &res) == 0 && res.n == 2 && res.ttl == 30,
     "the answer reads back; TTL capped at 30");
  ok(!memcmp(res.addr[1], addrs[1], 4), "addresses");
  n = gw_dns_build_answer(m.b, &q, GW_DNS_NOERROR, (const uint8_t(*)[4])addrs, 3, 5, out, 12 + q.qlen + 2 * 16);
  ok(n == 12 + q.qlen + 2 * 16 && out[7] == 2, "records that do not fit are left out");
  n = gw_dns_build_answer(m.b, &q, GW_DNS_REFUSED, (const uint8_t(*)[4])addrs, 2, 5, out, sizeof out);
  ok(n == 12 + q.qlen && (out[3] & 0xf) == 5 && out[7] == 0, "REFUSED: no records");
  header(&m, 0xbeef, 0x0100, 1, 0, 0, 0);
  put16(&m, 0xc00c);
  parse(&m);
  n = gw_dns_build_answer(m.b, &q, GW_DNS_FORMERR, NULL, 0, 0, out, sizeof out);
  ok(n == 12 && out[5] == 0 && (out[3] & 0xf) == 1, "FORMERR for an unreadable question: the header alone");
  ok(gw_dns_build_answer(m.b, &q, GW_DNS_FORMERR, NULL, 0, 0, out, 11) == 0, "no room for a header");
}

static void test_query_build(void) {
  uint8_t out[300];
  size_t n = gw_dns_build_query(7, "pypi.org", 1, out, sizeof out);
  ok(n == 12 + 10 + 4 && out[2] == 0x01 && out[5] == 1, "query for pypi.org");
  ok(gw_dns_parse_query(out, n, &q) == GW_DNS_QUERY_OK && !strcmp(q.name, "pypi.org"), "our parser reads it");
  ok(gw_dns_build_query(7, "", 1, out, sizeof out) == 0, "empty name");
  ok(gw_dns_build_query(7, "a..b", 1, out, sizeof out) == 0, "empty label");
  ok(gw_dns_build_query(7, "a.b.", 1, out, sizeof out) == 0, "trailing dot");
  ok(gw_dns_build_query(7, "a b.c", 1, out, sizeof out) == 0, "a space");
  ok(gw_dns_build_query(7, "pypi.org", 1, out, 20) == 0, "no room");
  char l64[80];
  memset(l64, 'a', 64);
  strcpy(l64 + 64, ".com");
  ok(gw_dns_build_query(7, l64, 1, out, sizeof out) == 0, "a 64-character label");
}

/* An upstream answer for `qn` with the given records appended by fill(). */
static void answer_head(struct msg *m, uint16_t id, uint16_t flags, const char *qn, uint16_t qtype, uint16_t an) {
  header(m, id, flags, 1, an, 0, 0);
  name(m, qn);
  put16(m, qtype);
  put16(m, 1);
}
static void rr_a(struct msg *m, uint16_t owner_ptr, uint32_t ttl, uint32_t addr) {
  put16(m, owner_ptr);
  put16(m, 1);
  put16(m, 1);
  put32(m, ttl);
  put16(m, 4);
  put32(m, addr);
}

static void test_answer_parse(void) {
  struct msg m;
  struct gw_dns_result res;
  answer_head(&m, 9, 0x8180, "Pypi.org", 1, 2);
  rr_a(&m, 0xc00c, 300, 0x01020304);
  rr_a(&m, 0xc00c, 60, 0x01020305);
  ok(gw_dns_parse_answer(m.b, m.n, 9, "pypi.org", 1, &res) == 0 && res.n == 2 && res.ttl == 60 && res.rcode == 0,
     "two A records, the smaller TTL, the name compared without case");
  ok(gw_dns_parse_answer(m.b, m.n, 10, "pypi.org", 1, &res) < 0 && strstr(res.why, "ID"), "a wrong ID is ignored");
  ok(gw_dns_parse_answer(m.b, m.n, 9, "pypi.com", 1, &res) < 0 && strstr(res.why, "question"),
     "an answer to another name is ignored");
  ok(gw_dns_parse_answer(m.b, m.n, 9, "pypi.org", 28, &res) < 0, "an answer to another type is ignored");
  ok(gw_dns_parse_answer(m.b, m.n - 1, 9, "pypi.org", 1, &res) < 0, "truncated record");
  m.b[2] &= 0x7f;
  ok(gw_dns_parse_answer(m.b, m.n, 9, "pypi.org", 1, &res) < 0, "QR clear: not an answer");

  answer_head(&m, 9, 0x8383, "nx.org", 1, 0);
  ok(gw_dns_parse_answer(m.b, m.n, 9, "nx.org", 1, &res) == 0 && res.rcode == 3 && res.n == 0, "NXDOMAIN");
  answer_head(&m, 9, 0x8380, "big.org", 1, 0);
  m.b[2] |= 0x02;
  ok(gw_dns_parse_answer(m.b, m.n, 9, "big.org", 1, &res) == 0 && res.truncated, "TC: ask over TCP");

  /* A CNAME chain: www -> cdn -> edge, A records for edge only count. */
  answer_head(&m, 9, 0x8180, "www.a.org", 1, 4);
  size_t cname1 = m.n + 12;
  put16(&m, 0xc00c);
  put16(&m, 5);
  put16(&m, 1);
  put32(&m, 100);
  put16(&m, 9);
  name(&m, "cdn.org");
  size_t cname2 = m.n + 12;
  put16(&m, (uint16_t)(0xc000 | cname1));
  put16(&m, 5);
  put16(&m, 1);
  put32(&m, 50);
  put16(&m, 10);
  name(&m, "edge.org");
  rr_a(&m, (uint16_t)(0xc000 | cname2), 200, 0x05060708);
  rr_a(&m, 0xc00c, 200, 0x09090909); /* an A for the first name next to its CNAME: not used */
  ok(gw_dns_parse_answer(m.b, m.n, 9, "www.a.org", 1, &res) == 0 && res.n == 1 && res.addr[0][0] == 5 && res.ttl == 50,
     "CNAME chain followed; the TTL is the chain's smallest");

  /* A CNAME loop ends. */
  answer_head(&m, 9, 0x8180, "a.org", 1, 2);
  size_t c1 = m.n + 12;
  put16(&m, 0xc00c);
  put16(&m, 5);
  put16(&m, 1);
  put32(&m, 10);
  put16(&m, 7);
  name(&m, "b.org");
  put16(&m, (uint16_t)(0xc000 | c1));
  put16(&m, 5);
  put16(&m, 1);
  put32(&m, 10);
  put16(&m, 2);
  put16(&m, 0xc00c);
  ok(gw_dns_parse_answer(m.b, m.n, 9, "a.org", 1, &res) < 0 && strstr(res.why, "CNAME chain"), "a CNAME loop is refused");

  /* Compression loops: a pointer to itself, a forward pointer. */
  answer_head(&m, 9, 0x8180, "p.org", 1, 1);
  size_t self = m.n;
  put16(&m, (uint16_t)(0xc000 | self));
  put16(&m, 1);
  put16(&m, 1);
  put32(&m, 1);
  put16(&m, 4);
  put32(&m, 1);
  ok(gw_dns_parse_answer(m.b, m.n, 9, "p.org", 1, &res) < 0, "a pointer to itself");
  answer_head(&m, 9, 0x8180, "p.org", 1, 1);
  put8(&m, 1);
  put8(&m, 'x');
  put16(&m, (uint16_t)(0xc000 | (m.n - 2)));
  put16(&m, 1);
  put16(&m, 1);
  put32(&m, 1);
  put16(&m, 4);
  put32(&m, 1);
  ok(gw_dns_parse_answer(m.b, m.n, 9, "p.org", 1, &res) < 0, "a label then a pointer back to it (a loop)");
  answer_head(&m, 9, 0x8180, "p.org", 1, 1);
  put16(&m, (uint16_t)(0xc000 | (m.n + 2)));
  put16(&m, 1);
  put16(&m, 1);
  put32(&m, 1);
  put16(&m, 4);
  put32(&m, 1);
  ok(gw_dns_parse_answer(m.b, m.n, 9, "p.org", 1, &res) < 0, "a forward pointer");

  answer_head(&m, 9, 0x8180, "p.org", 1, 1);
  put16(&m, 0xc00c);
  put16(&m, 1);
  put16(&m, 1);
  put32(&m, 1);
  put16(&m, 5);
  put32(&m, 1);
  put8(&m, 0);
  ok(gw_dns_parse_answer(m.b, m.n, 9, "p.org", 1, &res) < 0, "an A record of 5 bytes");

  /* Limits and odd records. */
  answer_head(&m, 9, 0x8180, "many.org", 1, 40);
  for (uint32_t i = 0; i < 40; i++) rr_a(&m, 0xc00c, 0x80000000u, 0x0a000000u + i);
  ok(gw_dns_parse_answer(m.b, m.n, 9, "many.org", 1, &res) == 0 && res.n == GW_DNS_MAX_ADDRS && res.ttl == 0,
     "at most 16 addresses; a TTL with the high bit set is 0");
  answer_head(&m, 9, 0x8180, "dup.org", 1, 3);
  rr_a(&m, 0xc00c, 9, 0x0a000001);
  rr_a(&m, 0xc00c, 9, 0x0a000001);
  put16(&m, 0xc00c); /* class CH: ignored */
  put16(&m, 1);
  put16(&m, 3);
  put32(&m, 9);
  put16(&m, 4);
  put32(&m, 0x0a000002);
  ok(gw_dns_parse_answer(m.b, m.n, 9, "dup.org", 1, &res) == 0 && res.n == 1, "duplicates and class CH ignored");
  answer_head(&m, 9, 0x8180, "other.org", 1, 1);
  name(&m, "evil.org");
  put16(&m, 1);
  put16(&m, 1);
  put32(&m, 9);
  put16(&m, 4);
  put32(&m, 0x7f000001);
  ok(gw_dns_parse_answer(m.b, m.n, 9, "other.org", 1, &res) == 0 && res.n == 0,
     "an A record for a name not asked is not taken");
}

int main(void) {
  test_query_valid();
  test_query_refused();
  test_answer_build();
  test_query_build();
  test_answer_parse();
  return done_testing();
}
