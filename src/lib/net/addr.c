/* Host parsing, address normalisation and classification (see addr.h).
 *
 * No <ctype.h>: its answers depend on the locale, and a byte >= 0x80 must
 * never be taken for a letter here. */
#include "net/addr.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>

#include "net/policy.h"

static bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static bool is_alpha(unsigned char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static bool is_hex(unsigned char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
static unsigned char lower(unsigned char c) { return c >= 'A' && c <= 'Z' ? (unsigned char)(c + 32) : c; }

/* Exactly four decimal octets, no leading zeros, nothing else. */
static int parse_v4(const char *s, size_t n, uint8_t out[4]) {
  size_t i = 0;
  for (int part = 0; part < 4; part++) {
    if (part) {
      if (i >= n || s[i] != '.') return -1;
      i++;
    }
    size_t start = i;
    unsigned v = 0;
    while (i < n && is_digit((unsigned char)s[i]) && i - start < 3) v = v * 10 + (unsigned)(s[i++] - '0');
    size_t d = i - start;
    if (d == 0 || (d > 1 && s[start] == '0') || v > 255) return -1;
    out[part] = (uint8_t)v;
  }
  return i == n ? 0 : -1;
}

/* inet_pton over a copy; only hex digits, ':' and '.' may appear (no zone
 * id, no brackets, no spaces).  glibc's and musl's inet_pton refuse leading
 * zeros in an embedded dotted quad. */
static int parse_v6(const char *s, size_t n, uint8_t out[16]) {
  if (n < 2 || n >= HUTCH_IP_TEXT_MAX) return -1;
  char buf[HUTCH_IP_TEXT_MAX];
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (!is_hex(c) && c != ':' && c != '.') return -1;
    buf[i] = (char)c;
  }
  buf[n] = 0;
  return inet_pton(AF_INET6, buf, out) == 1 ? 0 : -1;
}

int hutch_ip_parse(const char *s, size_t n, struct hutch_ip *out) {
  memset(out, 0, sizeof *out);
  if (parse_v4(s, n, out->b) == 0) {
    out->family = AF_INET;
    return 0;
  }
  if (memchr(s, ':', n) && parse_v6(s, n, out->b) == 0) {
    out->family = AF_INET6;
    return 0;
  }
  memset(out, 0, sizeof *out);
  return -1;
}

void hutch_ip_to_text(const struct hutch_ip *ip, char out[HUTCH_IP_TEXT_MAX]) {
  if (!inet_ntop(ip->family == AF_INET ? AF_INET : AF_INET6, ip->b, out, HUTCH_IP_TEXT_MAX)) out[0] = 0;
}

int hutch_ip_from_bytes(int family, const void *bytes, struct hutch_ip *ip) {
  struct hutch_ip t = {.family = family}; /* bytes may point into *ip */
  if (family == AF_INET)
    memcpy(t.b, bytes, 4);
  else if (family == AF_INET6)
    memcpy(t.b, bytes, 16);
  else
    t.family = 0;
  *ip = t;
  return t.family ? 0 : -1;
}

int hutch_ip_from_sockaddr(const struct sockaddr *sa, socklen_t len, struct hutch_ip *ip, uint16_t *port) {
  memset(ip, 0, sizeof *ip);
  if (!sa || len < (socklen_t)sizeof(sa_family_t)) return -1;
  if (sa->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
    struct sockaddr_in sin;
    memcpy(&sin, sa, sizeof sin);
    if (port) *port = ntohs(sin.sin_port);
    return hutch_ip_from_bytes(AF_INET, &sin.sin_addr, ip);
  }
  if (sa->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
    struct sockaddr_in6 sin6;
    memcpy(&sin6, sa, sizeof sin6);
    if (port) *port = ntohs(sin6.sin6_port);
    return hutch_ip_from_bytes(AF_INET6, &sin6.sin6_addr, ip);
  }
  return -1;
}

static size_t ip_len(int family) { return family == AF_INET ? 4 : 16; }

bool hutch_ip_equal(const struct hutch_ip *a, const struct hutch_ip *b) {
  return a->family == b->family && (a->family == AF_INET || a->family == AF_INET6) &&
         memcmp(a->b, b->b, ip_len(a->family)) == 0;
}

bool hutch_ip_in_prefix(const struct hutch_ip *ip, const struct hutch_ip *net, unsigned prefix) {
  if (ip->family != net->family || (ip->family != AF_INET && ip->family != AF_INET6)) return false;
  if (prefix > 8 * ip_len(ip->family)) return false;
  size_t whole = prefix / 8;
  if (memcmp(ip->b, net->b, whole) != 0) return false;
  unsigned bits = prefix % 8;
  if (!bits) return true;
  uint8_t mask = (uint8_t)(0xff << (8 - bits));
  return (ip->b[whole] & mask) == (net->b[whole] & mask);
}

/* ---- hosts ---- */

#define FAIL(msg)               \
  do {                          \
    memset(out, 0, sizeof *out); \
    if (why) *why = (msg);      \
    return -1;                  \
  } while (0)

/* WHATWG URL's "ends in a number": a last label of digits only, or "0x"
 * followed by hex digits only (also "0x" alone), is read as IPv4 by URL
 * parsers, and inet_aton reads 127.1, 0x7f.1 and 0177.0.0.1 the same way. */
static bool numeric_label(const char *l, size_t n) {
  if (n >= 2 && l[0] == '0' && (l[1] == 'x' || l[1] == 'X')) {
    for (size_t i = 2; i < n; i++)
      if (!is_hex((unsigned char)l[i])) return false;
    return true;
  }
  for (size_t i = 0; i < n; i++)
    if (!is_digit((unsigned char)l[i])) return false;
  return n > 0;
}

int hutch_host_parse(const char *s, size_t n, struct hutch_host *out, const char **why) {
  memset(out, 0, sizeof *out);
  if (!s || n == 0) FAIL("empty host");
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c >= 0x80) FAIL("non-ASCII character: internationalised names (IDNA) are not supported, use the xn-- form");
    if (c == 0) FAIL("NUL byte in host");
  }
  if (hutch_ip_parse(s, n, &out->ip) == 0) {
    out->kind = HUTCH_HOST_IP;
    hutch_ip_to_text(&out->ip, out->text);
    return 0;
  }
  if (memchr(s, ':', n)) FAIL("invalid IPv6 address");
  if (s[n - 1] == '.') n--;
  if (n == 0) FAIL("empty name");
  if (n > HUTCH_NAME_MAX) FAIL("name longer than 253 characters");
  size_t label = 0; /* start of the current label */
  for (size_t i = 0; i <= n; i++) {
    if (i == n || s[i] == '.') {
      size_t len = i - label;
      if (len == 0) FAIL("empty label in name");
      if (len > 63) FAIL("label longer than 63 characters in name");
      if (s[label] == '-' || s[i - 1] == '-') FAIL("label starts or ends with '-' in name");
      if (i < n) out->text[i] = '.';
      label = i + 1;
      continue;
    }
    unsigned char c = (unsigned char)s[i];
    if (!is_alpha(c) && !is_digit(c) && c != '-' && c != '_') FAIL("invalid character in name");
    out->text[i] = (char)lower(c);
  }
  out->text[n] = 0;
  const char *last = strrchr(out->text, '.');
  last = last ? last + 1 : out->text;
  if (numeric_label(last, strlen(last)))
    FAIL("numeric name (read as an IPv4 address by some resolvers): write the address in dotted-quad form");
  out->kind = HUTCH_HOST_NAME;
  return 0;
}

#undef FAIL

/* ---- normalisation and classes ---- */

static const uint8_t zero12[12];

bool hutch_ip_embedded_v4(const struct hutch_ip *ip, struct hutch_ip *v4) {
  if (ip->family != AF_INET6) return false;
  const uint8_t *b = ip->b;
  static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  static const uint8_t translated[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0};
  static const uint8_t nat64[12] = {0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0};
  const uint8_t *src = NULL;
  if (!memcmp(b, mapped, 12) || !memcmp(b, translated, 12) || !memcmp(b, nat64, 12))
    src = b + 12;
  else if (!memcmp(b, zero12, 12) && !(b[12] == 0 && b[13] == 0 && b[14] == 0 && b[15] <= 1))
    src = b + 12; /* IPv4-compatible; :: and ::1 are themselves */
  else if (b[0] == 0x20 && b[1] == 0x02)
    src = b + 2; /* 6to4 */
  if (!src) return false;
  if (v4) hutch_ip_from_bytes(AF_INET, src, v4);
  return true;
}

void hutch_ip_normalize(const struct hutch_ip *ip, struct hutch_ip *out) {
  struct hutch_ip v4;
  if (hutch_ip_embedded_v4(ip, &v4))
    *out = v4;
  else
    *out = *ip;
}

struct special {
  uint8_t b[16];
  uint8_t prefix;
  uint8_t cls;
};

#define V4(a, b, c, d, len, cl) {{a, b, c, d}, len, HUTCH_ADDR_##cl}
static const struct special special_v4[] = {
    V4(0, 0, 0, 0, 8, RESERVED),         /* "this network" */
    V4(0, 0, 0, 0, 32, UNSPECIFIED),
    V4(10, 0, 0, 0, 8, PRIVATE),
    V4(100, 64, 0, 0, 10, CGNAT),
    V4(100, 100, 100, 200, 32, METADATA), /* Alibaba Cloud */
    V4(127, 0, 0, 0, 8, LOOPBACK),
    V4(168, 63, 129, 16, 32, METADATA),   /* Azure wireserver (a public address) */
    V4(169, 254, 0, 0, 16, LINK_LOCAL),
    V4(169, 254, 169, 254, 32, METADATA), /* AWS, GCP, Azure, OpenStack, ... */
    V4(169, 254, 170, 2, 32, METADATA),   /* AWS ECS task metadata */
    V4(172, 16, 0, 0, 12, PRIVATE),
    V4(192, 0, 0, 0, 24, RESERVED),       /* IETF protocol assignments */
    V4(192, 0, 2, 0, 24, RESERVED),       /* TEST-NET-1 */
    V4(192, 88, 99, 0, 24, RESERVED),     /* 6to4 relay anycast */
    V4(192, 168, 0, 0, 16, PRIVATE),
    V4(198, 18, 0, 0, 15, RESERVED),      /* benchmarking */
    V4(198, 51, 100, 0, 24, RESERVED),    /* TEST-NET-2 */
    V4(203, 0, 113, 0, 24, RESERVED),     /* TEST-NET-3 */
    V4(224, 0, 0, 0, 4, MULTICAST),
    V4(240, 0, 0, 0, 4, RESERVED),
    V4(255, 255, 255, 255, 32, BROADCAST),
};
#undef V4

#define V6(b0, b1, b2, b3, b14, b15, len, cl) \
  {{b0, b1, b2, b3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, b14, b15}, len, HUTCH_ADDR_##cl}
static const struct special special_v6[] = {
    /* Outside global unicast 2000::/3 is nothing a sandbox needs: ::/3
     * covers ::/8 (mapped, compatible, discard 100::/64, NAT64's local-use
     * 64:ff9b:1::/48), 4000::/2 and 8000::/1 the rest; the more specific
     * entries below name what is inside them. */
    V6(0, 0, 0, 0, 0, 0, 3, RESERVED),
    V6(0x40, 0, 0, 0, 0, 0, 2, RESERVED),
    V6(0x80, 0, 0, 0, 0, 0, 1, RESERVED),
    V6(0, 0, 0, 0, 0, 0, 128, UNSPECIFIED),
    V6(0, 0, 0, 0, 0, 1, 128, LOOPBACK),
    V6(0x20, 0x01, 0, 0, 0, 0, 23, RESERVED),           /* IETF protocol assignments, Teredo 2001::/32 */
    V6(0x20, 0x01, 0x0d, 0xb8, 0, 0, 32, RESERVED),     /* documentation */
    V6(0x3f, 0xff, 0, 0, 0, 0, 20, RESERVED),           /* documentation (RFC 9637) */
    V6(0xfc, 0, 0, 0, 0, 0, 7, PRIVATE),                /* unique local */
    V6(0xfd, 0, 0x0e, 0xc2, 0x02, 0x54, 128, METADATA), /* fd00:ec2::254, AWS IMDS over IPv6 */
    V6(0xfe, 0x80, 0, 0, 0, 0, 10, LINK_LOCAL),
    V6(0xfe, 0xc0, 0, 0, 0, 0, 10, PRIVATE),            /* site-local (deprecated) */
    V6(0xff, 0, 0, 0, 0, 0, 8, MULTICAST),
};
#undef V6

static bool special_match(const struct special *sp, int family, const struct hutch_ip *ip) {
  struct hutch_ip net = {.family = family};
  memcpy(net.b, sp->b, 16);
  return hutch_ip_in_prefix(ip, &net, sp->prefix);
}

enum hutch_addr_class hutch_addr_classify(const struct hutch_ip *ip, struct hutch_ip *range, unsigned *prefix) {
  struct hutch_ip a;
  hutch_ip_normalize(ip, &a);
  const struct special *tab = a.family == AF_INET ? special_v4 : special_v6;
  size_t n = a.family == AF_INET ? sizeof special_v4 / sizeof *special_v4 : sizeof special_v6 / sizeof *special_v6;
  const struct special *best = NULL;
  if (a.family == AF_INET || a.family == AF_INET6)
    for (size_t i = 0; i < n; i++)
      if (special_match(&tab[i], a.family, &a) && (!best || tab[i].prefix > best->prefix)) best = &tab[i];
  if (range) {
    memset(range, 0, sizeof *range);
    range->family = a.family;
    if (best) memcpy(range->b, best->b, 16);
  }
  if (prefix) *prefix = best ? best->prefix : 0;
  return best ? (enum hutch_addr_class)best->cls : HUTCH_ADDR_PUBLIC;
}

const char *hutch_addr_class_name(enum hutch_addr_class c) {
  switch (c) {
  case HUTCH_ADDR_PUBLIC: return "public";
  case HUTCH_ADDR_LOOPBACK: return "loopback";
  case HUTCH_ADDR_LINK_LOCAL: return "link-local";
  case HUTCH_ADDR_PRIVATE: return "private";
  case HUTCH_ADDR_CGNAT: return "cgnat";
  case HUTCH_ADDR_UNSPECIFIED: return "unspecified";
  case HUTCH_ADDR_MULTICAST: return "multicast";
  case HUTCH_ADDR_BROADCAST: return "broadcast";
  case HUTCH_ADDR_RESERVED: return "reserved";
  case HUTCH_ADDR_METADATA: return "metadata";
  }
  return "unknown";
}

static const char *class_why(enum hutch_addr_class c) {
  switch (c) {
  case HUTCH_ADDR_PUBLIC: return "public address";
  case HUTCH_ADDR_LOOPBACK: return "loopback address";
  case HUTCH_ADDR_LINK_LOCAL: return "link-local address";
  case HUTCH_ADDR_PRIVATE: return "private address";
  case HUTCH_ADDR_CGNAT: return "shared (CGNAT) address";
  case HUTCH_ADDR_UNSPECIFIED: return "unspecified address";
  case HUTCH_ADDR_MULTICAST: return "multicast address";
  case HUTCH_ADDR_BROADCAST: return "broadcast address";
  case HUTCH_ADDR_RESERVED: return "reserved address";
  case HUTCH_ADDR_METADATA: return "cloud metadata address";
  }
  return "unknown address";
}

/* ---- decisions that need only the address ---- */

bool hutch_rule_match_ip(const struct hutch_rule *r, const struct hutch_ip *ip, uint16_t port) {
  if (r->kind != HUTCH_RULE_CIDR) return false;
  if (r->port && r->port != port) return false;
  return hutch_ip_in_prefix(ip, &r->net, r->prefix);
}

static bool verdict(struct hutch_verdict *v, bool allow, const struct hutch_rule *rule, const char *why,
                    enum hutch_addr_class cls) {
  if (v) *v = (struct hutch_verdict){.allow = allow, .rule = rule, .why = why, .cls = cls};
  return allow;
}

/* When not blocked, v->rule is the allow rule that unlocked a special
 * range (or NULL for a public address): policy.c reports it. */
bool hutch_addr_blocked(const struct hutch_policy *p, const struct hutch_ip *ip, uint16_t port,
                        struct hutch_verdict *v) {
  struct hutch_ip norm, range;
  unsigned rlen = 0;
  if (ip->family != AF_INET && ip->family != AF_INET6)
    return !verdict(v, false, NULL, "not an IP address", HUTCH_ADDR_RESERVED);
  enum hutch_addr_class cls = hutch_addr_classify(ip, &range, &rlen);
  hutch_ip_normalize(ip, &norm);
  if (port == 0) return !verdict(v, false, NULL, "port 0", cls);
  if (!p || p->mode == HUTCH_EGRESS_NONE) return !verdict(v, false, NULL, "egress is none", cls);
  for (size_t i = 0; i < p->n_deny; i++) {
    const struct hutch_rule *r = &p->deny[i];
    if (hutch_rule_match_ip(r, ip, port) || hutch_rule_match_ip(r, &norm, port))
      return !verdict(v, false, r, "denied by rule", cls);
  }
  if (cls == HUTCH_ADDR_PUBLIC) return !verdict(v, true, NULL, "public address", cls);
  for (size_t i = 0; i < p->n_allow; i++) {
    const struct hutch_rule *r = &p->allow[i];
    /* Only a rule lying inside the special range unlocks it: "0.0.0.0/0"
     * says "anything on the internet", not "my loopback". */
    if (r->kind == HUTCH_RULE_CIDR && r->net.family == norm.family && r->prefix >= rlen &&
        hutch_rule_match_ip(r, &norm, port))
      return !verdict(v, true, r, "special range allowed by rule", cls);
  }
  return !verdict(v, false, NULL, class_why(cls), cls);
}
