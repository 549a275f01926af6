/* Egress policy (src/lib/net/policy.c): the JSON grammar with its limits
 * and messages, canonical rule texts, and the decisions -- deny overriding
 * allow, `*.suffix` matching strict subdomains only, ports, names that are
 * addresses, and the address path with its special ranges.  Each refusal
 * has a positive control next to it. */
#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

#include "common/err.h"
#include "common/util.h"
#include "net/policy.h"
#include "tap.h"

static hutch_err err;

static struct hutch_policy *parse(const char *json) {
  json_error_t je;
  json_t *v = json_loads(json, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
  if (!v) {
    printf("# bad test JSON %s: %s\n", json, je.text);
    abort();
  }
  struct hutch_policy *p = NULL;
  hutch_err_clear(&err);
  if (hutch_policy_parse(v, "egress", &p, &err) < 0) p = NULL;
  json_decref(v);
  return p;
}

static struct hutch_policy *POL(const char *json) {
  struct hutch_policy *p = parse(json);
  if (!p) {
    printf("# bad test policy %s: %s\n", json, err.msg);
    abort();
  }
  return p;
}

/* The canonical text of a one-rule allow list, or "ERR: message". */
static const char *canon(const char *rule) {
  static char out[HUTCH_ERR_MSG_MAX + 16];
  char *json = xasprintf("{\"allow\":[\"%s\"]}", rule);
  struct hutch_policy *p = parse(json);
  free(json);
  if (!p)
    snprintf(out, sizeof out, "ERR: %s", err.msg);
  else
    snprintf(out, sizeof out, "%s", p->n_allow == 1 ? p->allow[0].text : "?");
  hutch_policy_free(p);
  return out;
}

/* The rule is refused, with 400 invalid_argument and a message that names
 * the index and contains `why`. */
static bool refused(const char *rule, const char *why) {
  const char *r = canon(rule);
  bool ok_ = !strncmp(r, "ERR: egress.allow[0]: ", 22) && strstr(r, why) && err.status == 400 &&
             !strcmp(err.code, "invalid_argument");
  if (!ok_) printf("#   `%s` gave: %s\n", rule, r);
  return ok_;
}

static void test_parse_modes(void) {
  struct hutch_policy *p = POL("\"none\"");
  ok(p->mode == HUTCH_EGRESS_NONE, "\"none\"");
  hutch_policy_free(p);
  p = POL("\"all\"");
  ok(p->mode == HUTCH_EGRESS_ALL, "\"all\"");
  hutch_policy_free(p);
  p = POL("{}");
  ok(p->mode == HUTCH_EGRESS_LIST && p->n_allow == 0 && p->n_deny == 0, "{}: a list with no rules");
  hutch_policy_free(p);
  p = POL("{\"allow\":null,\"deny\":[]}");
  ok(p->mode == HUTCH_EGRESS_LIST && p->n_allow == 0, "null and empty lists");
  hutch_policy_free(p);

  static const char *const bad[] = {"\"None\"", "\"any\"", "null", "42", "true", "[\"example.com\"]", "\"\""};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    ok(!parse(bad[i]) && err.status == 400 && strstr(err.msg, "egress: expected \"none\", \"all\" or an object"),
       "%s refused: %s", bad[i], err.msg);
  }
  ok(!parse("{\"allowed\":[]}") && strstr(err.msg, "unknown field `allowed`"), "unknown key: %s", err.msg);
  ok(!parse("{\"allow\":\"example.com\"}") && strstr(err.msg, "egress.allow: expected an array of strings"),
     "allow not an array: %s", err.msg);
  ok(!parse("{\"deny\":[\"a.com\",7]}") && strstr(err.msg, "egress.deny[1]: expected a string"),
     "a non-string rule names its index: %s", err.msg);
  ok(!parse("{\"allow\":[\"a.com\"],\"deny\":[\"b.com\",\"c d\"]}") && strstr(err.msg, "egress.deny[1]: `c d`"),
     "an invalid deny rule names its list and index: %s", err.msg);

  /* The field name is the caller's. */
  json_t *v = json_loads("{\"allow\":[\"127.1\"]}", 0, NULL);
  struct hutch_policy *q = NULL;
  hutch_err_clear(&err);
  ok(hutch_policy_parse(v, "network.egress", &q, &err) < 0 && strstr(err.msg, "network.egress.allow[0]: `127.1`: numeric name"),
     "field prefix in messages: %s", err.msg);
  ok(q == NULL, "nothing returned on failure");
  json_decref(v);
}

static void test_limits(void) {
  /* 256 rules in all: accepted; 257: refused before anything is parsed. */
  for (int extra = 0; extra <= 1; extra++) {
    json_t *o = json_object(), *a = json_array(), *d = json_array();
    for (int i = 0; i < 200; i++) json_array_append_new(a, json_sprintf("h%d.example.com", i));
    for (int i = 0; i < 56 + extra; i++) json_array_append_new(d, json_sprintf("10.%d.0.0/16", i));
    json_object_set_new(o, "allow", a);
    json_object_set_new(o, "deny", d);
    struct hutch_policy *p = NULL;
    hutch_err_clear(&err);
    int r = hutch_policy_parse(o, "egress", &p, &err);
    if (!extra)
      ok(r == 0 && p->n_allow == 200 && p->n_deny == 56 && p->deny[55].index == 55 && p->deny[55].deny,
         "256 rules accepted");
    else
      ok(r < 0 && strstr(err.msg, "at most 256 rules"), "257 rules refused: %s", err.msg);
    hutch_policy_free(p);
    json_decref(o);
  }
  char rule[300];
  /* a 253-character name: 63.63.63.61 */
  memset(rule, 'a', 253);
  rule[63] = rule[127] = rule[191] = '.';
  rule[253] = 0;
  ok(!strcmp(canon(rule), rule), "a 253-character rule");
  rule[253] = 'a';
  rule[254] = 0;
  ok(refused(rule, "longer than 253 characters"), "a 254-character rule refused");
  strcpy(rule, "example.com:443");
  ok(!strcmp(canon(rule), rule), "positive control: a short rule with a port");
}

static void test_rule_forms(void) {
  static const struct {
    const char *in, *out;
  } t[] = {
      {"example.com", "example.com"},
      {"Example.COM.", "example.com"},
      {"*.Example.com", "*.example.com"},
      {"*.example.com.", "*.example.com"},
      {"example.com:8443", "example.com:8443"},
      {"*.example.com:443", "*.example.com:443"},
      {"*", "*"},
      {"*:443", "*:443"},
      {"xn--bcher-kva.example", "xn--bcher-kva.example"},
      {"10.0.0.0/8", "10.0.0.0/8"},
      {"10.0.0.0/8:443", "10.0.0.0/8:443"},
      {"192.168.1.5:8080", "192.168.1.5:8080"},
      {"192.168.1.5/32", "192.168.1.5"},
      {"0.0.0.0/0", "0.0.0.0/0"},
      {"2001:DB8::/32", "2001:db8::/32"},
      {"[2001:db8::/32]:443", "[2001:db8::/32]:443"},
      {"[2001:db8::1]:443", "[2001:db8::1]:443"},
      {"[2001:db8::1]", "2001:db8::1"},
      {"2001:db8::1/128", "2001:db8::1"},
      {"::ffff:10.0.0.0/104", "10.0.0.0/8"},
      {"[::ffff:127.0.0.1]:80", "127.0.0.1:80"},
      {"::/0", "::/0"},
      /* Without brackets a trailing ":443" is part of the IPv6 address. */
      {"2001:db8::1:443", "2001:db8::1:443"},
  };
  for (size_t i = 0; i < sizeof t / sizeof *t; i++) is_str(canon(t[i].in), t[i].out, "rule `%s`", t[i].in);

  struct hutch_policy *p = POL("{\"allow\":[\"*.example.com:443\",\"10.0.0.0/8\"],\"deny\":[\"bad.example.com\"]}");
  ok(p->allow[0].kind == HUTCH_RULE_SUFFIX && !strcmp(p->allow[0].name, "example.com") && p->allow[0].port == 443,
     "suffix rule fields");
  ok(p->allow[1].kind == HUTCH_RULE_CIDR && p->allow[1].prefix == 8 && p->allow[1].port == 0, "CIDR rule fields");
  ok(p->deny[0].kind == HUTCH_RULE_NAME && p->deny[0].deny && p->deny[0].index == 0, "deny rule fields");
  json_t *j = hutch_policy_to_json(p);
  char *s = json_dumps(j, JSON_COMPACT);
  is_str(s, "{\"allow\":[\"*.example.com:443\",\"10.0.0.0/8\"],\"deny\":[\"bad.example.com\"]}", "to_json");
  struct hutch_policy *q = NULL;
  ok(hutch_policy_parse(j, "egress", &q, &err) == 0 && q->n_allow == 2 && !strcmp(q->allow[1].text, "10.0.0.0/8") &&
         hutch_ip_equal(&q->allow[1].net, &p->allow[1].net),
     "to_json parses back to the same rules");
  free(s);
  json_decref(j);
  hutch_policy_free(q);
  hutch_policy_free(p);
  p = hutch_policy_none();
  j = hutch_policy_to_json(p);
  ok(json_is_string(j) && !strcmp(json_string_value(j), "none"), "none to_json");
  json_decref(j);
  hutch_policy_free(p);
}

static void test_rule_refusals(void) {
  ok(refused("b\xc3\xbc" "cher.de", "IDNA"), "non-ASCII names: IDNA not supported");
  ok(refused("*.b\xc3\xbc" "cher.de", "IDNA"), "non-ASCII after a wildcard");
  ok(!strcmp(canon("xn--bcher-kva.de"), "xn--bcher-kva.de"), "positive control: the xn-- form");
  ok(refused("exa mple.com", "whitespace"), "space");
  ok(refused("example.com\\t", "whitespace or control"), "tab");
  ok(refused("a\\u0000b.com", "control"), "NUL");
  ok(refused("", "empty rule"), "empty");
  ok(refused("exa_mple..com", "empty label"), "empty label");
  ok(refused("a!b.com", "invalid character"), "invalid character");
  /* wildcards */
  ok(refused("a.*.com", "leading"), "wildcard in the middle");
  ok(refused("*example.com", "leading"), "wildcard without a dot");
  ok(refused("**.example.com", "leading"), "double wildcard");
  ok(refused("*.*.example.com", "leading"), "two wildcard labels");
  ok(refused("*.", "leading"), "a wildcard of nothing");
  ok(refused("*.10.0.0.1", "names, not addresses"), "wildcard on an address");
  ok(refused("example.*", "leading"), "trailing wildcard");
  /* ambiguous numeric forms: neither an address nor a name */
  ok(refused("127.1", "numeric name"), "127.1");
  ok(refused("0x7f.1", "numeric name"), "0x7f.1");
  ok(refused("0177.0.0.1", "numeric name"), "0177.0.0.1");
  ok(refused("2130706433", "numeric name"), "2130706433");
  ok(refused("0x7f000001:443", "numeric name"), "0x7f000001 with a port");
  ok(refused("*.1", "numeric name"), "*.1");
  ok(!strcmp(canon("127.0.0.1"), "127.0.0.1"), "positive control: the strict dotted quad");
  /* CIDRs */
  ok(refused("10.0.0.1/8", "host bits set (the network is 10.0.0.0/8)"), "host bits set");
  ok(refused("2001:db8::1/32", "host bits set (the network is 2001:db8::/32)"), "IPv6 host bits set");
  ok(refused("10.0.0.0/33", "prefix length (0 to 32)"), "/33");
  ok(refused("2001:db8::/129", "prefix length (0 to 128)"), "/129");
  ok(refused("10.0.0.0/08", "prefix length"), "leading zero in a prefix");
  ok(refused("10.0.0.0/", "prefix length"), "empty prefix");
  ok(refused("10.0.0.0/-1", "prefix length"), "negative prefix");
  ok(refused("010.0.0.0/8", "invalid address in CIDR"), "octal-looking CIDR address");
  ok(refused("10.0.0/8", "invalid address in CIDR"), "three-part CIDR address");
  ok(refused("example.com/8", "invalid address in CIDR"), "a name with a prefix");
  ok(refused("[10.0.0.0/8]:443", "brackets are only for IPv6"), "IPv4 in brackets");
  ok(refused("[2001:db8::/32", "missing `]`"), "missing ]");
  ok(refused("[2001:db8::/32]443", "unexpected text after `]`"), "no colon after ]");
  ok(refused("[example.com]:443", "invalid IPv6 address in brackets"), "a name in brackets");
  ok(refused("2001:db8::/32:443", "prefix length"), "IPv6 CIDR with a port needs brackets");
  ok(refused("fe80::1%eth0", "invalid"), "zone id");
  /* ports */
  ok(refused("example.com:0", "invalid port"), "port 0");
  ok(refused("example.com:65536", "invalid port"), "port 65536");
  ok(refused("example.com:080", "invalid port"), "port with a leading zero");
  ok(refused("example.com:", "invalid port"), "empty port");
  ok(refused("example.com:http", "invalid port"), "port by name");
  ok(refused("10.0.0.0/8:-1", "invalid port"), "negative port");
  ok(refused(":443", "empty host"), "port without a host");
  ok(!strcmp(canon("example.com:65535"), "example.com:65535"), "positive control: port 65535");
  ok(!strcmp(canon("example.com:1"), "example.com:1"), "positive control: port 1");
}

/* ---- decisions ---- */

static bool name(const struct hutch_policy *p, const char *n, uint16_t port, struct hutch_verdict *v) {
  return hutch_policy_allow_name(p, n, port, v);
}

static bool addr(const struct hutch_policy *p, const char *a, uint16_t port, struct hutch_verdict *v) {
  struct hutch_ip ip;
  if (hutch_ip_parse(a, strlen(a), &ip) < 0) abort();
  return hutch_policy_allow_addr(p, &ip, port, v);
}

static void test_none_all(void) {
  struct hutch_verdict v;
  struct hutch_policy *p = POL("\"none\"");
  ok(!name(p, "example.com", 443, &v) && !strcmp(v.why, "egress is none") && !v.rule, "none: a name denied");
  ok(!addr(p, "8.8.8.8", 443, &v) && !strcmp(v.why, "egress is none"), "none: an address denied");
  hutch_policy_free(p);
  ok(!name(NULL, "example.com", 443, &v) && !addr(NULL, "8.8.8.8", 443, &v), "no policy: denied");

  p = POL("\"all\"");
  ok(name(p, "example.com", 443, &v) && !strcmp(v.why, "egress is all") && !v.rule, "all: a name allowed");
  ok(name(p, "anything.example", 22, &v), "all: any port");
  ok(!name(p, "127.1", 80, &v) && strstr(v.why, "numeric name"), "all: an ambiguous numeric name is still refused");
  ok(!name(p, "exa mple.com", 80, &v), "all: an invalid name is still refused");
  ok(!name(p, "example.com", 0, &v) && !strcmp(v.why, "port 0"), "all: port 0 refused");
  ok(addr(p, "8.8.8.8", 443, &v) && !strcmp(v.why, "egress is all"), "all: a public address allowed");
  ok(!addr(p, "127.0.0.1", 443, &v) && !strcmp(v.why, "loopback address"), "all: loopback refused");
  ok(!addr(p, "::ffff:127.0.0.1", 443, &v), "all: mapped loopback refused");
  ok(!addr(p, "169.254.169.254", 80, &v) && v.cls == HUTCH_ADDR_METADATA, "all: metadata refused");
  ok(!addr(p, "10.0.0.1", 443, &v) && !addr(p, "100.64.0.1", 443, &v) && !addr(p, "fd00::1", 443, &v),
     "all: private, CGNAT and ULA refused");
  ok(!name(p, "127.0.0.1", 80, &v) && v.cls == HUTCH_ADDR_LOOPBACK, "all: a name that is a loopback literal refused");
  ok(!name(p, "::1", 80, &v), "all: an IPv6 loopback literal as a name refused");
  ok(name(p, "8.8.8.8", 80, &v), "positive control: a public literal as a name");
  hutch_policy_free(p);
}

static void test_lists(void) {
  struct hutch_verdict v;
  struct hutch_policy *p =
      POL("{\"allow\":[\"example.com\",\"*.example.org\",\"api.test:443\",\"10.0.0.0/8:443\",\"[2001:db8::/32]:443\","
          "\"8.8.8.8\"],"
          "\"deny\":[\"bad.example.org\",\"10.9.0.0/16\",\"api.test:443\"]}");
  /* exact names */
  ok(name(p, "example.com", 443, &v) && v.rule == &p->allow[0] && !strcmp(v.why, "allowed by rule"), "exact name");
  ok(name(p, "EXAMPLE.COM.", 80, &v) && v.rule == &p->allow[0], "case and trailing dot do not matter");
  ok(!name(p, "sub.example.com", 443, &v) && !strcmp(v.why, "no rule allows this name") && !v.rule,
     "an exact rule does not cover subdomains");
  ok(!name(p, "example.com.evil.net", 443, &v), "nor names that merely start with it");
  ok(!name(p, "xexample.com", 443, &v), "nor names that merely end with it");
  /* suffixes: strict subdomains only */
  ok(name(p, "a.example.org", 443, &v) && v.rule == &p->allow[1], "*.example.org covers a.example.org");
  ok(name(p, "a.b.example.org", 443, &v) && v.rule == &p->allow[1], "and a.b.example.org");
  ok(!name(p, "example.org", 443, &v), "but not the apex example.org");
  ok(!name(p, "notexample.org", 443, &v), "nor notexample.org (a label boundary is needed)");
  ok(!name(p, ".example.org", 443, &v), "nor .example.org (an invalid name)");
  ok(!name(p, "a.example.org.evil.net", 443, &v), "nor a.example.org.evil.net");
  /* deny overrides allow */
  ok(!name(p, "bad.example.org", 443, &v) && v.rule == &p->deny[0] && !strcmp(v.why, "denied by rule"),
     "deny overrides *.example.org");
  ok(!name(p, "BAD.example.org.", 443, &v) && v.rule == &p->deny[0], "whatever the case and trailing dot");
  ok(name(p, "x.bad.example.org", 443, &v) && v.rule == &p->allow[1],
     "an exact deny does not cover its subdomains (documented: deny *.bad.example.org too)");
  ok(!name(p, "api.test", 443, &v) && v.rule == &p->deny[2], "a name both allowed and denied is denied");
  /* ports on names */
  ok(!name(p, "api.test", 80, &v) && !strcmp(v.why, "no rule allows this name"), "api.test:443 does not allow port 80");
  ok(name(p, "example.com", 8443, &v), "a rule without a port allows every port");
  /* addresses */
  ok(addr(p, "10.1.2.3", 443, &v) && v.rule == &p->allow[3] && !strcmp(v.why, "allowed by rule"),
     "10.0.0.0/8:443 allows 10.1.2.3:443 (private range unlocked)");
  ok(!addr(p, "10.1.2.3", 80, &v), "but not port 80");
  ok(!addr(p, "10.9.1.1", 443, &v) && v.rule == &p->deny[1], "deny CIDR overrides the allow CIDR");
  ok(!addr(p, "::ffff:10.9.1.1", 443, &v) && v.rule == &p->deny[1], "also for the mapped form");
  ok(addr(p, "::ffff:10.1.2.3", 443, &v) && v.rule == &p->allow[3], "positive control: mapped allowed address");
  ok(addr(p, "8.8.8.8", 53, &v) && v.rule == &p->allow[5], "a /32 rule");
  ok(addr(p, "64:ff9b::8.8.8.8", 443, &v) && v.rule == &p->allow[5], "its NAT64 form");
  ok(!addr(p, "8.8.4.4", 443, &v) && !strcmp(v.why, "no rule allows this address"), "an address no rule allows");
  ok(addr(p, "2001:db8::5", 443, &v) && v.rule == &p->allow[4], "an IPv6 rule inside a reserved range unlocks it");
  ok(!addr(p, "2001:db8::5", 80, &v), "for its port only");
  ok(!addr(p, "127.0.0.1", 443, &v) && v.cls == HUTCH_ADDR_LOOPBACK, "loopback refused");
  /* names that are addresses are decided as addresses */
  ok(name(p, "10.1.2.3", 443, &v) && v.rule == &p->allow[3], "a literal as a name goes through CIDR rules");
  ok(!name(p, "10.9.1.1", 443, &v) && v.rule == &p->deny[1], "and through deny CIDR rules");
  ok(!name(p, "127.0.0.1", 443, &v), "loopback literal refused");
  static const char *const ambiguous[] = {"127.1", "0x7f.1", "0177.0.0.1", "2130706433", "10.1", "012.1.2.3"};
  for (size_t i = 0; i < sizeof ambiguous / sizeof *ambiguous; i++)
    ok(!name(p, ambiguous[i], 443, &v) && strstr(v.why, "numeric name"), "`%s` refused, never read as an address",
       ambiguous[i]);
  ok(!name(p, "b\xc3\xbc" "cher.example.org", 443, &v) && strstr(v.why, "IDNA"), "a non-ASCII name refused");
  ok(!name(p, "", 443, &v) && !name(p, NULL, 443, &v), "empty and NULL names refused");
  hutch_policy_free(p);

  /* "everything but" */
  p = POL("{\"allow\":[\"*\"],\"deny\":[\"evil.com\",\"*.evil.com\",\"*:25\"]}");
  ok(name(p, "example.com", 443, &v) && v.rule == &p->allow[0], "* allows any name");
  ok(!name(p, "evil.com", 443, &v) && v.rule == &p->deny[0], "deny the apex");
  ok(!name(p, "www.evil.com", 443, &v) && v.rule == &p->deny[1], "deny its subdomains");
  ok(name(p, "notevil.com", 443, &v), "positive control: notevil.com");
  ok(!name(p, "example.com", 25, &v) && v.rule == &p->deny[2], "deny a port for every name");
  ok(!addr(p, "8.8.8.8", 443, &v), "* says nothing about addresses");
  hutch_policy_free(p);

  /* a list without allow rules allows nothing */
  p = POL("{\"deny\":[\"evil.com\"]}");
  ok(!name(p, "example.com", 443, &v) && !strcmp(v.why, "no rule allows this name"), "deny-only list allows nothing");
  hutch_policy_free(p);
}

static void test_sockaddr(void) {
  struct hutch_verdict v;
  struct hutch_policy *p = POL("\"all\"");
  struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(443)};
  inet_pton(AF_INET, "8.8.8.8", &sin.sin_addr);
  ok(hutch_policy_allow_sockaddr(p, (struct sockaddr *)&sin, sizeof sin, &v), "sockaddr_in 8.8.8.8:443");
  sin.sin_port = 0;
  ok(!hutch_policy_allow_sockaddr(p, (struct sockaddr *)&sin, sizeof sin, &v), "port 0 from the sockaddr");
  struct sockaddr_in6 sin6 = {.sin6_family = AF_INET6, .sin6_port = htons(443)};
  inet_pton(AF_INET6, "::ffff:127.0.0.1", &sin6.sin6_addr);
  ok(!hutch_policy_allow_sockaddr(p, (struct sockaddr *)&sin6, sizeof sin6, &v) && v.cls == HUTCH_ADDR_LOOPBACK,
     "sockaddr_in6 ::ffff:127.0.0.1 refused");
  inet_pton(AF_INET6, "2606:4700::1111", &sin6.sin6_addr);
  ok(hutch_policy_allow_sockaddr(p, (struct sockaddr *)&sin6, sizeof sin6, &v), "positive control: a public IPv6");
  struct sockaddr_un sun = {.sun_family = AF_UNIX};
  ok(!hutch_policy_allow_sockaddr(p, (struct sockaddr *)&sun, sizeof sun, &v), "AF_UNIX refused");
  hutch_policy_free(p);
}

int main(void) {
  test_parse_modes();
  test_limits();
  test_rule_forms();
  test_rule_refusals();
  test_none_all();
  test_lists();
  test_sockaddr();
  return done_testing();
}
