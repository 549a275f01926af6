/* Addresses and host names as the egress gateway sees them (issue 8).
 *
 * Pure functions, no I/O, no allocation: parse a host (name or IP literal)
 * strictly, normalise IPv6 forms that embed an IPv4 address, classify an
 * address (loopback, private, metadata, ...) and say whether a resolved
 * address may be connected to under a policy.  docs/network.md describes
 * the rules and why each one is there.
 *
 * Textual forms: an IP literal is exactly a dotted quad of decimal octets
 * without leading zeros ("10.0.0.1"), or an IPv6 address as inet_pton reads
 * it (no zone "%eth0", no brackets: the caller strips those).  Everything
 * else is a name, and a name whose last label is a number ("127.1",
 * "0x7f.1", "0177.0.0.1", "2130706433", "1.2.3.4.") is refused: some
 * resolvers (inet_aton, getaddrinfo, browsers) read those as IPv4 addresses,
 * so accepting them as names would let a policy check see a name while the
 * connection goes to an address. */
#ifndef HUTCH_NET_ADDR_H
#define HUTCH_NET_ADDR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define HUTCH_NAME_MAX 253      /* a DNS name without the trailing dot */
#define HUTCH_IP_TEXT_MAX 46    /* INET6_ADDRSTRLEN */

struct hutch_ip {
  int family; /* AF_INET or AF_INET6 */
  uint8_t b[16]; /* network order; AF_INET uses b[0..4) */
};

enum hutch_host_kind { HUTCH_HOST_NAME = 1, HUTCH_HOST_IP = 2 };

struct hutch_host {
  enum hutch_host_kind kind;
  /* NAME: lowercase, trailing dot stripped.  IP: canonical text (inet_ntop;
   * IPv6 without brackets). */
  char text[HUTCH_NAME_MAX + 1];
  struct hutch_ip ip; /* IP only */
};

/* Parse the n bytes at s (not NUL-terminated; an embedded NUL is refused) as
 * a host.  Names: ASCII letters, digits, '-' and '_' in dot-separated labels
 * of 1..63 characters that neither start nor end with '-', at most 253
 * characters after one trailing dot is stripped; non-ASCII is refused (IDNA
 * is not supported: use the xn-- form).  Returns 0, or -1 with *why set to a
 * static message (out is then zeroed). */
int hutch_host_parse(const char *s, size_t n, struct hutch_host *out, const char **why);

/* Strict IP literal only (the same rules as above); 0 or -1. */
int hutch_ip_parse(const char *s, size_t n, struct hutch_ip *out);
void hutch_ip_to_text(const struct hutch_ip *ip, char out[HUTCH_IP_TEXT_MAX]);
/* From a sockaddr_in / sockaddr_in6 (port in host order, may be NULL);
 * -1 for another family or a short length. */
int hutch_ip_from_sockaddr(const struct sockaddr *sa, socklen_t len, struct hutch_ip *ip, uint16_t *port);
/* family AF_INET (4 bytes) or AF_INET6 (16 bytes); -1 for another family. */
int hutch_ip_from_bytes(int family, const void *bytes, struct hutch_ip *ip);
bool hutch_ip_equal(const struct hutch_ip *a, const struct hutch_ip *b);
/* Whether ip lies in net/prefix (same family; prefix 0..32 or 0..128). */
bool hutch_ip_in_prefix(const struct hutch_ip *ip, const struct hutch_ip *net, unsigned prefix);

/* The IPv4 address an IPv6 address stands for, if any:
 *   ::ffff:a.b.c.d      IPv4-mapped (what a dual-stack socket connects to)
 *   ::ffff:0:a.b.c.d    IPv4-translated (SIIT)
 *   ::a.b.c.d           IPv4-compatible (deprecated), except :: and ::1
 *   64:ff9b::a.b.c.d    NAT64 well-known prefix
 *   2002:AABB:CCDD::/48 6to4, a.b.c.d = AA.BB.CC.DD
 * Returns true and fills *v4 for those; false otherwise (and for AF_INET). */
bool hutch_ip_embedded_v4(const struct hutch_ip *ip, struct hutch_ip *v4);
/* The address that decides the class: the embedded IPv4 when there is one,
 * else ip itself. */
void hutch_ip_normalize(const struct hutch_ip *ip, struct hutch_ip *out);

enum hutch_addr_class {
  HUTCH_ADDR_PUBLIC = 0,
  HUTCH_ADDR_LOOPBACK,    /* 127/8, ::1 */
  HUTCH_ADDR_LINK_LOCAL,  /* 169.254/16, fe80::/10 */
  HUTCH_ADDR_PRIVATE,     /* 10/8, 172.16/12, 192.168/16, fc00::/7, fec0::/10 */
  HUTCH_ADDR_CGNAT,       /* 100.64/10 */
  HUTCH_ADDR_UNSPECIFIED, /* 0.0.0.0, :: */
  HUTCH_ADDR_MULTICAST,   /* 224/4, ff00::/8 */
  HUTCH_ADDR_BROADCAST,   /* 255.255.255.255 */
  HUTCH_ADDR_RESERVED,    /* 0/8, 240/4, 192.0.0/24, 198.18/15, documentation, IPv6 outside 2000::/3, ... */
  HUTCH_ADDR_METADATA,    /* cloud metadata services: 169.254.169.254, fd00:ec2::254, ... */
};

const char *hutch_addr_class_name(enum hutch_addr_class c);

/* Class of ip after hutch_ip_normalize.  The most specific range wins
 * (169.254.169.254 is METADATA, not LINK_LOCAL).  When range/prefix are not
 * NULL they receive that range (for PUBLIC: the address itself, /0). */
enum hutch_addr_class hutch_addr_classify(const struct hutch_ip *ip, struct hutch_ip *range, unsigned *prefix);

struct hutch_policy;
struct hutch_rule;

/* The outcome of a decision, for the gateway and its audit log. */
struct hutch_verdict {
  bool allow;
  const struct hutch_rule *rule; /* the rule that decided, or NULL (the policy's mode, no rule matched, a special range) */
  const char *why;               /* static text: "denied by rule", "loopback address", ... */
  enum hutch_addr_class cls;     /* address decisions: the class of the (normalised) address */
};

/* Whether an address that an allowed name resolved to must NOT be connected
 * to on `port`.  Blocked: a NULL policy or egress "none"; an address
 * (or its embedded IPv4) matched by a deny CIDR rule; an address in a
 * special range (any class but PUBLIC) unless an allow CIDR rule lying
 * inside that range covers it (so "10.0.0.0/8" unlocks 10/8 but
 * "0.0.0.0/0" unlocks nothing, and 169.254.169.254 needs exactly
 * "169.254.169.254/32").  Port 0 is always blocked.  Names' rules play no
 * part here.  v (may be NULL) receives the verdict, allow = !blocked. */
bool hutch_addr_blocked(const struct hutch_policy *p, const struct hutch_ip *ip, uint16_t port,
                        struct hutch_verdict *v);

/* Whether CIDR rule r covers ip (as given, not normalised) on port (a rule
 * without a port covers every port).  False for a name rule. */
bool hutch_rule_match_ip(const struct hutch_rule *r, const struct hutch_ip *ip, uint16_t port);

#endif
