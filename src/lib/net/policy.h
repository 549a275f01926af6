/* A sandbox's egress policy (issue 8) and the decisions made with it.
 *
 * JSON: "none" | "all" | {"allow": [rule, ...], "deny": [rule, ...]}
 * (each list optional; at most HUTCH_POLICY_MAX_RULES rules in all, each at
 * most HUTCH_RULE_MAX_LEN characters).  A rule is one of:
 *
 *   example.com           that name exactly
 *   *.example.com         strict subdomains of example.com (a.example.com,
 *                         a.b.example.com) -- NOT example.com itself: list
 *                         both to allow both
 *   10.0.0.0/8            an IPv4 or IPv6 network (host bits must be zero)
 *   192.168.1.5           one address (/32 or /128)
 *   2001:db8::/32         IPv6 without a port needs no brackets
 *   [2001:db8::/32]:443   with a port it does
 *   *                     every name (for "everything but": allow ["*"] with
 *                         deny rules; addresses still need CIDR rules)
 *   10.0.0.0/8:443, example.com:8443, *.example.com:443
 *                         any rule may name one port (1..65535); without
 *                         one it matches every port
 *
 * Names are lowercased and one trailing dot is stripped; non-ASCII is
 * refused (IDNA is not supported: write the xn-- form); names whose last
 * label is numeric are refused (see net/addr.h).  IPv4-mapped networks
 * (::ffff:a.b.c.d/n with n >= 96) are stored as the IPv4 network.
 *
 * Decisions: deny rules are checked first and override allow rules; then
 * "none" denies everything, "all" allows every valid name (addresses still
 * go through hutch_addr_blocked), and a list allows what its first matching
 * allow rule allows (a list without allow rules allows nothing).  Name rules decide names, CIDR rules decide addresses.
 * Invalid input to a decision (a bad name, port 0) is denied, never an
 * error: the gateway fails closed. */
#ifndef HUTCH_NET_POLICY_H
#define HUTCH_NET_POLICY_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "common/err.h"
#include "net/addr.h"

#define HUTCH_POLICY_MAX_RULES 256
#define HUTCH_RULE_MAX_LEN 253
#define HUTCH_RULE_TEXT_MAX (HUTCH_NAME_MAX + 16) /* "*." name ":65535" */

enum hutch_egress_mode { HUTCH_EGRESS_NONE = 0, HUTCH_EGRESS_ALL, HUTCH_EGRESS_LIST };
enum hutch_rule_kind { HUTCH_RULE_NAME = 1, HUTCH_RULE_SUFFIX, HUTCH_RULE_ANY_NAME, HUTCH_RULE_CIDR };

struct hutch_rule {
  enum hutch_rule_kind kind;
  bool deny;
  uint16_t index;  /* position in its list (allow or deny) */
  uint16_t port;   /* 0: every port */
  uint8_t prefix;  /* CIDR */
  struct hutch_ip net;             /* CIDR: the network, host bits zero */
  char name[HUTCH_NAME_MAX + 1];   /* NAME: the name; SUFFIX: what follows "*." */
  char text[HUTCH_RULE_TEXT_MAX];  /* canonical form, as hutch_policy_to_json writes it */
};

struct hutch_policy {
  enum hutch_egress_mode mode;
  size_t n_allow, n_deny;
  struct hutch_rule *allow, *deny; /* LIST only; owned */
};

/* Parse a policy.  `field` names it in messages ("egress").  On failure:
 * 400 "invalid_argument" naming the list, the index and why, e.g.
 * "egress.allow[2]: `exa mple.com`: invalid character in name", and *out is
 * untouched.  The result is freed with hutch_policy_free. */
int hutch_policy_parse(json_t *v, const char *field, struct hutch_policy **out, hutch_err *err);
/* One rule from n bytes (not NUL-terminated); `where` names it in messages.
 * index and deny are left for the caller. */
int hutch_rule_parse(const char *s, size_t n, const char *where, struct hutch_rule *out, hutch_err *err);
/* "none" | "all" | {"allow":[...],"deny":[...]} with canonical rule texts;
 * parsing it again gives the same policy.  A new reference. */
json_t *hutch_policy_to_json(const struct hutch_policy *p);
struct hutch_policy *hutch_policy_none(void);
void hutch_policy_free(struct hutch_policy *p);

/* May the sandbox reach `name` on `port`?  The name is normalised here
 * (case, trailing dot); an IP literal is decided as an address
 * (hutch_policy_allow_addr); an invalid or ambiguous name is denied.  When
 * this allows, the gateway resolves the name itself and still checks every
 * address it would connect to with hutch_addr_blocked.  v may be NULL. */
bool hutch_policy_allow_name(const struct hutch_policy *p, const char *name, uint16_t port, struct hutch_verdict *v);

/* May the sandbox reach this address directly (an IP literal in CONNECT,
 * Host or a transparent connection without a name)?  Deny CIDR rules match
 * the address or its embedded IPv4; then "none" denies; special ranges are
 * blocked as in hutch_addr_blocked; "all" allows; a list needs an allow CIDR
 * rule covering the address or its embedded IPv4 (the rule that unlocked a
 * special range is reported in preference). */
bool hutch_policy_allow_addr(const struct hutch_policy *p, const struct hutch_ip *ip, uint16_t port,
                             struct hutch_verdict *v);
/* The same for a sockaddr_in/sockaddr_in6 (its port); another family is denied. */
bool hutch_policy_allow_sockaddr(const struct hutch_policy *p, const struct sockaddr *sa, socklen_t len,
                                 struct hutch_verdict *v);

#endif
