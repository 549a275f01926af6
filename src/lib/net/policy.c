/* Egress policy: parsing and decisions (semantics in policy.h). */
#include "net/policy.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

/* ---- one rule ---- */

static int rule_fail(hutch_err *err, const char *where, const char *s, size_t n, const char *why) {
  bool printable = n <= HUTCH_RULE_MAX_LEN;
  for (size_t i = 0; printable && i < n; i++)
    if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e) printable = false;
  if (printable) return hutch_err_invalid(err, "%s: `%.*s`: %s", where, (int)n, s, why);
  return hutch_err_invalid(err, "%s: %s", where, why);
}

/* Decimal, no sign, no leading zero, 0..max. */
static int parse_small(const char *s, size_t n, unsigned max, unsigned *out) {
  if (n == 0 || n > 5 || (n > 1 && s[0] == '0')) return -1;
  unsigned v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9') return -1;
    v = v * 10 + (unsigned)(s[i] - '0');
  }
  if (v > max) return -1;
  *out = v;
  return 0;
}

static void mask_host_bits(struct hutch_ip *ip, unsigned prefix) {
  size_t len = ip->family == AF_INET ? 4 : 16;
  for (size_t i = 0; i < len; i++) {
    if (prefix >= 8 * (i + 1)) continue;
    unsigned keep = prefix > 8 * i ? prefix - 8 * i : 0;
    ip->b[i] &= (uint8_t)(keep ? 0xff << (8 - keep) : 0);
  }
}

static void rule_text(struct hutch_rule *r) {
  char port[8] = "";
  if (r->port) snprintf(port, sizeof port, ":%u", r->port);
  if (r->kind == HUTCH_RULE_NAME) {
    snprintf(r->text, sizeof r->text, "%s%s", r->name, port);
  } else if (r->kind == HUTCH_RULE_SUFFIX) {
    snprintf(r->text, sizeof r->text, "*.%s%s", r->name, port);
  } else if (r->kind == HUTCH_RULE_ANY_NAME) {
    snprintf(r->text, sizeof r->text, "*%s", port);
  } else {
    char a[HUTCH_IP_TEXT_MAX], len[8] = "";
    hutch_ip_to_text(&r->net, a);
    unsigned full = r->net.family == AF_INET ? 32 : 128;
    if (r->prefix != full) snprintf(len, sizeof len, "/%u", r->prefix);
    if (r->net.family == AF_INET6 && r->port)
      snprintf(r->text, sizeof r->text, "[%s%s]%s", a, len, port);
    else
      snprintf(r->text, sizeof r->text, "%s%s%s", a, len, port);
  }
}

int hutch_rule_parse(const char *s, size_t n, const char *where, struct hutch_rule *out, hutch_err *err) {
  memset(out, 0, sizeof *out);
  if (n == 0) return rule_fail(err, where, s, n, "empty rule");
  if (n > HUTCH_RULE_MAX_LEN) return hutch_err_invalid(err, "%s: longer than %d characters", where, HUTCH_RULE_MAX_LEN);
  char buf[HUTCH_RULE_MAX_LEN + 1];
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c >= 0x80)
      return rule_fail(err, where, s, n,
                       "non-ASCII character: internationalised names (IDNA) are not supported, use the xn-- form");
    if (c <= 0x20 || c == 0x7f) return rule_fail(err, where, s, n, "whitespace or control character");
    buf[i] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
  }
  buf[n] = 0;

  /* Split off the port: "[v6...]:port", "host:port"; two colons or more
   * without brackets is an IPv6 address and has no port. */
  const char *host = buf, *port = NULL;
  size_t hlen = n, plen = 0;
  bool bracket = false;
  if (buf[0] == '[') {
    const char *close = memchr(buf, ']', n);
    if (!close) return rule_fail(err, where, s, n, "missing `]`");
    host = buf + 1;
    hlen = (size_t)(close - host);
    size_t rest = n - (size_t)(close + 1 - buf);
    if (rest) {
      if (close[1] != ':') return rule_fail(err, where, s, n, "unexpected text after `]`");
      port = close + 2;
      plen = rest - 1;
    }
    bracket = true;
  } else {
    const char *colon = memchr(buf, ':', n);
    if (colon && !memchr(colon + 1, ':', n - (size_t)(colon + 1 - buf))) {
      hlen = (size_t)(colon - buf);
      port = colon + 1;
      plen = n - hlen - 1;
    }
  }
  if (port) {
    unsigned p;
    if (parse_small(port, plen, 65535, &p) < 0 || p == 0)
      return rule_fail(err, where, s, n, "invalid port (1 to 65535, no leading zeros)");
    out->port = (uint16_t)p;
  }
  if (hlen == 0) return rule_fail(err, where, s, n, "empty host");

  const char *slash = memchr(host, '/', hlen);
  size_t alen = slash ? (size_t)(slash - host) : hlen;
  struct hutch_ip ip;
  bool is_ip = hutch_ip_parse(host, alen, &ip) == 0;
  if (slash || bracket || is_ip) {
    if (!is_ip) return rule_fail(err, where, s, n, bracket ? "invalid IPv6 address in brackets" : "invalid address in CIDR");
    if (bracket && ip.family != AF_INET6) return rule_fail(err, where, s, n, "brackets are only for IPv6 addresses");
    unsigned full = ip.family == AF_INET ? 32 : 128, prefix = full;
    if (slash && parse_small(slash + 1, hlen - alen - 1, full, &prefix) < 0)
      return rule_fail(err, where, s, n, ip.family == AF_INET ? "invalid prefix length (0 to 32)" : "invalid prefix length (0 to 128)");
    struct hutch_ip net = ip;
    mask_host_bits(&net, prefix);
    if (!hutch_ip_equal(&net, &ip)) {
      char a[HUTCH_IP_TEXT_MAX];
      hutch_ip_to_text(&net, a);
      char why[128];
      snprintf(why, sizeof why, "host bits set (the network is %s/%u)", a, prefix);
      return rule_fail(err, where, s, n, why);
    }
    /* ::ffff:a.b.c.d/n is the IPv4 network a.b.c.d/(n-96): one form to match. */
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (net.family == AF_INET6 && prefix >= 96 && !memcmp(net.b, mapped, 12)) {
      hutch_ip_from_bytes(AF_INET, net.b + 12, &net);
      prefix -= 96;
    }
    out->kind = HUTCH_RULE_CIDR;
    out->net = net;
    out->prefix = (uint8_t)prefix;
  } else if (hlen == 1 && host[0] == '*') {
    out->kind = HUTCH_RULE_ANY_NAME;
  } else {
    bool wild = hlen > 2 && host[0] == '*' && host[1] == '.';
    const char *name = wild ? host + 2 : host;
    size_t nlen = wild ? hlen - 2 : hlen;
    if (memchr(name, '*', nlen)) return rule_fail(err, where, s, n, "`*` is allowed only as a whole leading label (`*.example.com`)");
    struct hutch_host h;
    const char *why = NULL;
    if (hutch_host_parse(name, nlen, &h, &why) < 0) return rule_fail(err, where, s, n, why);
    if (h.kind != HUTCH_HOST_NAME) return rule_fail(err, where, s, n, "a wildcard applies to names, not addresses");
    out->kind = wild ? HUTCH_RULE_SUFFIX : HUTCH_RULE_NAME;
    memcpy(out->name, h.text, sizeof out->name);
  }
  rule_text(out);
  return 0;
}

/* ---- the policy ---- */

struct hutch_policy *hutch_policy_none(void) {
  struct hutch_policy *p = xcalloc(1, sizeof *p);
  p->mode = HUTCH_EGRESS_NONE;
  return p;
}

void hutch_policy_free(struct hutch_policy *p) {
  if (!p) return;
  free(p->allow);
  free(p->deny);
  free(p);
}

static void policy_freep(struct hutch_policy **p) { hutch_policy_free(*p); }

static int parse_list(json_t *obj, const char *field, const char *key, bool deny, struct hutch_rule **out,
                      size_t *n_out, hutch_err *err) {
  json_t *a = json_object_get(obj, key);
  *out = NULL;
  *n_out = 0;
  if (!a || json_is_null(a)) return 0;
  if (!json_is_array(a)) return hutch_err_invalid(err, "%s.%s: expected an array of strings", field, key);
  size_t n = json_array_size(a);
  if (n > HUTCH_POLICY_MAX_RULES) return hutch_err_invalid(err, "%s: at most %d rules", field, HUTCH_POLICY_MAX_RULES);
  if (n == 0) return 0;
  cleanup_free struct hutch_rule *rules = xcalloc(n, sizeof *rules);
  for (size_t i = 0; i < n; i++) {
    json_t *e = json_array_get(a, i);
    char where[128];
    snprintf(where, sizeof where, "%s.%s[%zu]", field, key, i);
    if (!json_is_string(e)) return hutch_err_invalid(err, "%s: expected a string", where);
    if (hutch_rule_parse(json_string_value(e), json_string_length(e), where, &rules[i], err) < 0) return -1;
    rules[i].index = (uint16_t)i;
    rules[i].deny = deny;
  }
  *out = steal_pointer(&rules);
  *n_out = n;
  return 0;
}

int hutch_policy_parse(json_t *v, const char *field, struct hutch_policy **out, hutch_err *err) {
  if (!field) field = "egress";
  if (json_is_string(v)) {
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    enum hutch_egress_mode mode;
    if (n == 4 && !memcmp(s, "none", 4))
      mode = HUTCH_EGRESS_NONE;
    else if (n == 3 && !memcmp(s, "all", 3))
      mode = HUTCH_EGRESS_ALL;
    else
      return hutch_err_invalid(err, "%s: expected \"none\", \"all\" or an object with \"allow\" and \"deny\" lists",
                               field);
    struct hutch_policy *p = hutch_policy_none();
    p->mode = mode;
    *out = p;
    return 0;
  }
  if (!json_is_object(v))
    return hutch_err_invalid(err, "%s: expected \"none\", \"all\" or an object with \"allow\" and \"deny\" lists",
                             field);
  const char *k;
  json_t *m;
  json_object_foreach(v, k, m) {
    if (strcmp(k, "allow") != 0 && strcmp(k, "deny") != 0)
      return hutch_err_invalid(err, "%s: unknown field `%.64s` (expected \"allow\" and \"deny\")", field, k);
  }
  json_t *a = json_object_get(v, "allow"), *d = json_object_get(v, "deny");
  size_t total = (json_is_array(a) ? json_array_size(a) : 0) + (json_is_array(d) ? json_array_size(d) : 0);
  if (total > HUTCH_POLICY_MAX_RULES)
    return hutch_err_invalid(err, "%s: at most %d rules in all (got %zu)", field, HUTCH_POLICY_MAX_RULES, total);
  __attribute__((cleanup(policy_freep))) struct hutch_policy *p = hutch_policy_none();
  p->mode = HUTCH_EGRESS_LIST;
  if (parse_list(v, field, "allow", false, &p->allow, &p->n_allow, err) < 0) return -1;
  if (parse_list(v, field, "deny", true, &p->deny, &p->n_deny, err) < 0) return -1;
  *out = steal_pointer(&p);
  return 0;
}

json_t *hutch_policy_to_json(const struct hutch_policy *p) {
  if (!p || p->mode == HUTCH_EGRESS_NONE) return json_string("none");
  if (p->mode == HUTCH_EGRESS_ALL) return json_string("all");
  json_t *o = json_object(), *a = json_array(), *d = json_array();
  for (size_t i = 0; i < p->n_allow; i++) json_array_append_new(a, json_string(p->allow[i].text));
  for (size_t i = 0; i < p->n_deny; i++) json_array_append_new(d, json_string(p->deny[i].text));
  json_object_set_new(o, "allow", a);
  json_object_set_new(o, "deny", d);
  return o;
}

/* ---- decisions ---- */

static bool verdict(struct hutch_verdict *v, bool allow, const struct hutch_rule *rule, const char *why) {
  if (v) *v = (struct hutch_verdict){.allow = allow, .rule = rule, .why = why, .cls = HUTCH_ADDR_PUBLIC};
  return allow;
}

/* name is normalised (lowercase, no trailing dot). */
static bool name_match(const struct hutch_rule *r, const char *name, size_t len, uint16_t port) {
  if (r->port && r->port != port) return false;
  switch (r->kind) {
  case HUTCH_RULE_NAME: return strcmp(r->name, name) == 0;
  case HUTCH_RULE_ANY_NAME: return true;
  case HUTCH_RULE_SUFFIX: {
    size_t sl = strlen(r->name);
    return len > sl + 1 && name[len - sl - 1] == '.' && memcmp(name + len - sl, r->name, sl) == 0;
  }
  case HUTCH_RULE_CIDR: return false;
  }
  return false;
}

bool hutch_policy_allow_name(const struct hutch_policy *p, const char *name, uint16_t port, struct hutch_verdict *v) {
  struct hutch_host h;
  const char *why = "empty host";
  if (!name || hutch_host_parse(name, strlen(name), &h, &why) < 0) return verdict(v, false, NULL, why);
  if (h.kind == HUTCH_HOST_IP) return hutch_policy_allow_addr(p, &h.ip, port, v);
  if (port == 0) return verdict(v, false, NULL, "port 0");
  if (!p || p->mode == HUTCH_EGRESS_NONE) return verdict(v, false, NULL, "egress is none");
  size_t len = strlen(h.text);
  for (size_t i = 0; i < p->n_deny; i++)
    if (name_match(&p->deny[i], h.text, len, port)) return verdict(v, false, &p->deny[i], "denied by rule");
  if (p->mode == HUTCH_EGRESS_ALL) return verdict(v, true, NULL, "egress is all");
  for (size_t i = 0; i < p->n_allow; i++)
    if (name_match(&p->allow[i], h.text, len, port)) return verdict(v, true, &p->allow[i], "allowed by rule");
  return verdict(v, false, NULL, "no rule allows this name");
}

bool hutch_policy_allow_addr(const struct hutch_policy *p, const struct hutch_ip *ip, uint16_t port,
                             struct hutch_verdict *v) {
  struct hutch_verdict b;
  if (hutch_addr_blocked(p, ip, port, &b)) {
    if (v) *v = b;
    return false;
  }
  if (p->mode == HUTCH_EGRESS_ALL) {
    b.why = b.rule ? "special range allowed by rule" : "egress is all";
    if (v) *v = b;
    return true;
  }
  if (b.rule) { /* the rule that unlocked a special range also allows it */
    b.why = "allowed by rule";
    if (v) *v = b;
    return true;
  }
  struct hutch_ip norm;
  hutch_ip_normalize(ip, &norm);
  for (size_t i = 0; i < p->n_allow; i++) {
    const struct hutch_rule *r = &p->allow[i];
    if (hutch_rule_match_ip(r, ip, port) || hutch_rule_match_ip(r, &norm, port)) {
      if (v) *v = (struct hutch_verdict){.allow = true, .rule = r, .why = "allowed by rule", .cls = b.cls};
      return true;
    }
  }
  if (v) *v = (struct hutch_verdict){.allow = false, .rule = NULL, .why = "no rule allows this address", .cls = b.cls};
  return false;
}

bool hutch_policy_allow_sockaddr(const struct hutch_policy *p, const struct sockaddr *sa, socklen_t len,
                                 struct hutch_verdict *v) {
  struct hutch_ip ip;
  uint16_t port = 0;
  if (hutch_ip_from_sockaddr(sa, len, &ip, &port) < 0) return verdict(v, false, NULL, "not an IPv4 or IPv6 address");
  return hutch_policy_allow_addr(p, &ip, port, v);
}
