/* Addresses and hosts for the egress gateway (src/lib/net/addr.c): strict
 * host parsing (numeric forms that resolvers read as IPv4 are refused as
 * names), IPv6 forms that embed IPv4, the special ranges, and
 * hutch_addr_blocked.  Every refused form sits next to a legitimate one
 * that is accepted (the positive control). */
#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "net/addr.h"
#include "net/policy.h"
#include "tap.h"

static struct hutch_ip IP(const char *s) {
  struct hutch_ip ip;
  if (hutch_ip_parse(s, strlen(s), &ip) < 0) {
    printf("# bad test address %s\n", s);
    abort();
  }
  return ip;
}

static struct hutch_policy *POL(const char *json) {
  json_t *v = json_loads(json, JSON_DECODE_ANY, NULL);
  struct hutch_policy *p = NULL;
  hutch_err err = HUTCH_ERR_INIT;
  if (!v || hutch_policy_parse(v, "egress", &p, &err) < 0) {
    printf("# bad test policy %s: %s\n", json, err.msg);
    abort();
  }
  json_decref(v);
  return p;
}

/* "name:text", "ip:text" or "bad:why" */
static const char *host(const char *s) {
  static char out[512];
  struct hutch_host h;
  const char *why = NULL;
  if (hutch_host_parse(s, strlen(s), &h, &why) < 0)
    snprintf(out, sizeof out, "bad:%s", why);
  else
    snprintf(out, sizeof out, "%s:%s", h.kind == HUTCH_HOST_NAME ? "name" : "ip", h.text);
  return out;
}

static bool bad(const char *s) { return strncmp(host(s), "bad:", 4) == 0; }

static void test_hosts(void) {
  /* names, normalised */
  is_str(host("example.com"), "name:example.com", "a name");
  is_str(host("WWW.Example.COM."), "name:www.example.com", "lowercased, one trailing dot stripped");
  is_str(host("xn--bcher-kva.example"), "name:xn--bcher-kva.example", "punycode (xn--) is plain ASCII");
  is_str(host("a_b.example.com"), "name:a_b.example.com", "underscore in a label");
  is_str(host("localhost"), "name:localhost", "single label");
  is_str(host("123.example.com"), "name:123.example.com", "numeric labels are fine unless last");
  is_str(host("example.123abc"), "name:example.123abc", "a last label with letters and digits is a name");
  is_str(host("1e3.example"), "name:1e3.example", "1e3 is not a number to inet_aton");
  is_str(host("0xg.com"), "name:0xg.com", "0x followed by a non-hex letter is a name");
  ok(bad("a..b"), "empty label");
  ok(bad(".a.com"), "leading dot");
  ok(bad("example.com.."), "two trailing dots");
  ok(bad("."), "a lone dot");
  ok(bad(""), "empty");
  ok(bad("-a.com") && bad("a-.com"), "label starting or ending with -");
  ok(!bad("a-b.com"), "positive control: inner hyphen");
  ok(bad("exa mple.com") && bad("exa%mple.com") && bad("a/b.com") && bad("a@b.com") && bad("evil.com\\.ok.com"),
     "space, %%, /, @ and backslash are not name characters");
  ok(bad("*.example.com"), "a wildcard is not a host");

  /* IDNA */
  is_str(host("b\xc3\xbc" "cher.de"),
         "bad:non-ASCII character: internationalised names (IDNA) are not supported, use the xn-- form",
         "non-ASCII refused with the IDNA message");
  {
    const char nul[] = "evil.com\0good.com";
    struct hutch_host h;
    const char *why = NULL;
    ok(hutch_host_parse(nul, sizeof nul - 1, &h, &why) < 0 && strstr(why, "NUL"), "embedded NUL refused");
    ok(hutch_host_parse(nul, 8, &h, &why) == 0 && !strcmp(h.text, "evil.com"), "positive control: the bytes before it");
  }

  /* lengths */
  {
    char name[300];
    memset(name, 'a', 63);
    strcpy(name + 63, ".com");
    ok(!bad(name), "63-character label");
    memset(name, 'a', 64);
    strcpy(name + 64, ".com");
    ok(bad(name), "64-character label refused");
    /* 253 characters: 63.63.63.61 */
    memset(name, 'a', 253);
    name[63] = name[127] = name[191] = '.';
    name[253] = 0;
    ok(!bad(name), "253-character name");
    strcpy(name + 253, ".");
    ok(!bad(name), "253 characters and a trailing dot");
    strcpy(name + 253, "a");
    ok(bad(name), "254-character name refused");
  }

  /* IP literals, strict */
  is_str(host("10.0.0.1"), "ip:10.0.0.1", "dotted quad");
  is_str(host("0.0.0.0"), "ip:0.0.0.0", "zeros");
  is_str(host("255.255.255.255"), "ip:255.255.255.255", "max");
  is_str(host("::1"), "ip:::1", "IPv6");
  is_str(host("::FFFF:127.0.0.1"), "ip:::ffff:127.0.0.1", "IPv6 with a dotted quad, canonical text");
  is_str(host("2001:DB8:0:0:0:0:0:1"), "ip:2001:db8::1", "IPv6 canonical text");
  ok(bad("[::1]"), "brackets are the caller's");
  ok(bad("fe80::1%eth0") && bad("fe80::1%25eth0"), "zone id refused");
  ok(bad("::ffff:127.000.0.1"), "leading zeros inside IPv6's dotted quad refused");
  ok(bad("1:2:3:4:5:6:7:8:9"), "too many IPv6 groups");

  /* The ambiguous numeric forms: never an address, never a name. */
  static const char *const ambiguous[] = {
      "127.1",      "0x7f.1",     "0177.0.0.1", "2130706433", "0x7f000001", "0x7F.0.0.1", "127.0.0.1.",
      "01.2.3.4",   "1.2.3.04",   "1.2.3.256",  "1.2.3.4.5",  "127.0.1",    "0x",         "a.0x1f",
      "017700000001", "0",        "example.1",  "1.2.3.4.",
  };
  for (size_t i = 0; i < sizeof ambiguous / sizeof *ambiguous; i++) {
    const char *r = host(ambiguous[i]);
    ok(strstr(r, "bad:numeric name") == r, "`%s` refused as an ambiguous numeric name (%s)", ambiguous[i], r);
  }
  is_str(host("127.0.0.1"), "ip:127.0.0.1", "positive control: the strict form of the same address");
}

static void test_ip_helpers(void) {
  struct hutch_ip a = IP("10.1.2.3"), n = IP("10.0.0.0");
  ok(hutch_ip_in_prefix(&a, &n, 8), "10.1.2.3 in 10/8");
  ok(!hutch_ip_in_prefix(&a, &n, 16), "10.1.2.3 not in 10.0/16");
  struct hutch_ip b = IP("172.31.255.255"), c = IP("172.32.0.0"), net = IP("172.16.0.0");
  ok(hutch_ip_in_prefix(&b, &net, 12) && !hutch_ip_in_prefix(&c, &net, 12), "172.16/12 edges");
  struct hutch_ip v6 = IP("::ffff:10.1.2.3");
  ok(!hutch_ip_in_prefix(&v6, &n, 8), "families never match each other in in_prefix");
  ok(hutch_ip_in_prefix(&a, &n, 0), "/0 matches everything of the family");
  ok(!hutch_ip_in_prefix(&a, &n, 33), "an impossible prefix matches nothing");

  struct sockaddr_in6 sin6 = {.sin6_family = AF_INET6, .sin6_port = htons(443)};
  inet_pton(AF_INET6, "::ffff:127.0.0.1", &sin6.sin6_addr);
  struct hutch_ip ip;
  uint16_t port = 0;
  ok(hutch_ip_from_sockaddr((struct sockaddr *)&sin6, sizeof sin6, &ip, &port) == 0 && port == 443 &&
         ip.family == AF_INET6,
     "sockaddr_in6");
  ok(hutch_ip_from_sockaddr((struct sockaddr *)&sin6, sizeof(struct sockaddr_in), &ip, &port) < 0,
     "a short sockaddr_in6 refused");
  struct sockaddr sa = {.sa_family = AF_UNIX};
  ok(hutch_ip_from_sockaddr(&sa, sizeof sa, &ip, &port) < 0, "AF_UNIX refused");
}

static const char *embedded(const char *s) {
  static char out[64];
  struct hutch_ip ip = IP(s), v4;
  if (!hutch_ip_embedded_v4(&ip, &v4)) return "-";
  hutch_ip_to_text(&v4, out);
  return out;
}

static void test_embedded(void) {
  is_str(embedded("::ffff:127.0.0.1"), "127.0.0.1", "IPv4-mapped");
  is_str(embedded("::ffff:7f00:1"), "127.0.0.1", "IPv4-mapped written in hex");
  is_str(embedded("::ffff:0:a9fe:a9fe"), "169.254.169.254", "IPv4-translated (SIIT)");
  is_str(embedded("::127.0.0.1"), "127.0.0.1", "IPv4-compatible");
  is_str(embedded("::a00:1"), "10.0.0.1", "IPv4-compatible in hex");
  is_str(embedded("64:ff9b::127.0.0.1"), "127.0.0.1", "NAT64 well-known prefix");
  is_str(embedded("64:ff9b::a9fe:a9fe"), "169.254.169.254", "NAT64 in hex");
  is_str(embedded("2002:7f00:1::1"), "127.0.0.1", "6to4");
  is_str(embedded("2002:a9fe:a9fe:1234::1"), "169.254.169.254", "6to4 with a subnet and host part");
  is_str(embedded("::1"), "-", "::1 is IPv6 loopback, not compatible 0.0.0.1");
  is_str(embedded("::"), "-", ":: is unspecified, not compatible 0.0.0.0");
  is_str(embedded("::2"), "0.0.0.2", "::2 is compatible 0.0.0.2");
  is_str(embedded("2001:db8::1"), "-", "positive control: an ordinary IPv6 address embeds nothing");
  is_str(embedded("64:ff9b:1::a00:1"), "-", "local-use NAT64 (no fixed embedding) embeds nothing");
  is_str(embedded("10.0.0.1"), "-", "IPv4 embeds nothing");
}

static enum hutch_addr_class cls(const char *s) {
  struct hutch_ip ip = IP(s);
  return hutch_addr_classify(&ip, NULL, NULL);
}

static void test_classes(void) {
  static const struct {
    const char *addr;
    enum hutch_addr_class c;
  } t[] = {
      /* public: positive controls, including the edges of special ranges */
      {"8.8.8.8", HUTCH_ADDR_PUBLIC},
      {"1.1.1.1", HUTCH_ADDR_PUBLIC},
      {"9.255.255.255", HUTCH_ADDR_PUBLIC},
      {"11.0.0.0", HUTCH_ADDR_PUBLIC},
      {"100.63.255.255", HUTCH_ADDR_PUBLIC},
      {"100.128.0.0", HUTCH_ADDR_PUBLIC},
      {"126.255.255.255", HUTCH_ADDR_PUBLIC},
      {"128.0.0.0", HUTCH_ADDR_PUBLIC},
      {"169.253.255.255", HUTCH_ADDR_PUBLIC},
      {"169.255.0.0", HUTCH_ADDR_PUBLIC},
      {"172.15.255.255", HUTCH_ADDR_PUBLIC},
      {"172.32.0.0", HUTCH_ADDR_PUBLIC},
      {"192.0.1.0", HUTCH_ADDR_PUBLIC},
      {"192.167.255.255", HUTCH_ADDR_PUBLIC},
      {"192.169.0.0", HUTCH_ADDR_PUBLIC},
      {"198.17.255.255", HUTCH_ADDR_PUBLIC},
      {"198.20.0.0", HUTCH_ADDR_PUBLIC},
      {"223.255.255.255", HUTCH_ADDR_PUBLIC},
      {"2606:4700::1111", HUTCH_ADDR_PUBLIC},
      {"2a00:1450::1", HUTCH_ADDR_PUBLIC},
      {"::ffff:8.8.8.8", HUTCH_ADDR_PUBLIC},
      {"64:ff9b::8.8.8.8", HUTCH_ADDR_PUBLIC},
      {"2002:808:808::1", HUTCH_ADDR_PUBLIC},
      /* loopback, in every form */
      {"127.0.0.1", HUTCH_ADDR_LOOPBACK},
      {"127.255.255.254", HUTCH_ADDR_LOOPBACK},
      {"::1", HUTCH_ADDR_LOOPBACK},
      {"::ffff:127.0.0.1", HUTCH_ADDR_LOOPBACK},
      {"::ffff:7f00:1", HUTCH_ADDR_LOOPBACK},
      {"::ffff:0:127.0.0.1", HUTCH_ADDR_LOOPBACK},
      {"::127.0.0.1", HUTCH_ADDR_LOOPBACK},
      {"64:ff9b::127.0.0.1", HUTCH_ADDR_LOOPBACK},
      {"2002:7f00:1::", HUTCH_ADDR_LOOPBACK},
      /* link-local */
      {"169.254.0.1", HUTCH_ADDR_LINK_LOCAL},
      {"169.254.255.255", HUTCH_ADDR_LINK_LOCAL},
      {"fe80::1", HUTCH_ADDR_LINK_LOCAL},
      {"febf::1", HUTCH_ADDR_LINK_LOCAL},
      {"::ffff:169.254.1.1", HUTCH_ADDR_LINK_LOCAL},
      /* private */
      {"10.0.0.0", HUTCH_ADDR_PRIVATE},
      {"10.255.255.255", HUTCH_ADDR_PRIVATE},
      {"172.16.0.0", HUTCH_ADDR_PRIVATE},
      {"172.31.255.255", HUTCH_ADDR_PRIVATE},
      {"192.168.0.1", HUTCH_ADDR_PRIVATE},
      {"fc00::1", HUTCH_ADDR_PRIVATE},
      {"fd12:3456::1", HUTCH_ADDR_PRIVATE},
      {"fec0::1", HUTCH_ADDR_PRIVATE},
      {"::ffff:10.0.0.1", HUTCH_ADDR_PRIVATE},
      {"64:ff9b::192.168.1.1", HUTCH_ADDR_PRIVATE},
      {"2002:c0a8:101::1", HUTCH_ADDR_PRIVATE},
      /* CGNAT */
      {"100.64.0.0", HUTCH_ADDR_CGNAT},
      {"100.127.255.255", HUTCH_ADDR_CGNAT},
      /* unspecified */
      {"0.0.0.0", HUTCH_ADDR_UNSPECIFIED},
      {"::", HUTCH_ADDR_UNSPECIFIED},
      {"::ffff:0.0.0.0", HUTCH_ADDR_UNSPECIFIED},
      /* multicast, broadcast */
      {"224.0.0.1", HUTCH_ADDR_MULTICAST},
      {"239.255.255.255", HUTCH_ADDR_MULTICAST},
      {"ff02::1", HUTCH_ADDR_MULTICAST},
      {"255.255.255.255", HUTCH_ADDR_BROADCAST},
      {"::ffff:255.255.255.255", HUTCH_ADDR_BROADCAST},
      /* reserved */
      {"0.1.2.3", HUTCH_ADDR_RESERVED},
      {"240.0.0.1", HUTCH_ADDR_RESERVED},
      {"255.255.255.254", HUTCH_ADDR_RESERVED},
      {"192.0.0.8", HUTCH_ADDR_RESERVED},
      {"192.0.2.1", HUTCH_ADDR_RESERVED},
      {"192.88.99.1", HUTCH_ADDR_RESERVED},
      {"198.18.0.1", HUTCH_ADDR_RESERVED},
      {"198.19.255.255", HUTCH_ADDR_RESERVED},
      {"198.51.100.1", HUTCH_ADDR_RESERVED},
      {"203.0.113.1", HUTCH_ADDR_RESERVED},
      {"::2", HUTCH_ADDR_RESERVED}, /* compatible 0.0.0.2 */
      {"::1:0:0:0", HUTCH_ADDR_RESERVED},
      {"100::1", HUTCH_ADDR_RESERVED},
      {"64:ff9b:1::a00:1", HUTCH_ADDR_RESERVED},
      {"2001::1", HUTCH_ADDR_RESERVED}, /* Teredo */
      {"2001:0:4136:e378:8000:63bf:3fff:fdd2", HUTCH_ADDR_RESERVED},
      {"2001:db8::1", HUTCH_ADDR_RESERVED},
      {"3fff::1", HUTCH_ADDR_RESERVED},
      {"4000::1", HUTCH_ADDR_RESERVED},
      {"5f00::1", HUTCH_ADDR_RESERVED},
      {"8000::1", HUTCH_ADDR_RESERVED},
      {"1fff:ffff::1", HUTCH_ADDR_RESERVED},
      /* metadata, in every form */
      {"169.254.169.254", HUTCH_ADDR_METADATA},
      {"::ffff:169.254.169.254", HUTCH_ADDR_METADATA},
      {"::ffff:a9fe:a9fe", HUTCH_ADDR_METADATA},
      {"::169.254.169.254", HUTCH_ADDR_METADATA},
      {"64:ff9b::a9fe:a9fe", HUTCH_ADDR_METADATA},
      {"2002:a9fe:a9fe::1", HUTCH_ADDR_METADATA},
      {"169.254.170.2", HUTCH_ADDR_METADATA},
      {"100.100.100.200", HUTCH_ADDR_METADATA},
      {"168.63.129.16", HUTCH_ADDR_METADATA},
      {"fd00:ec2::254", HUTCH_ADDR_METADATA},
      {"fd00:ec2::253", HUTCH_ADDR_PRIVATE},
  };
  for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
    enum hutch_addr_class c = cls(t[i].addr);
    ok(c == t[i].c, "%s is %s (got %s)", t[i].addr, hutch_addr_class_name(t[i].c), hutch_addr_class_name(c));
  }
  struct hutch_ip ip = IP("169.254.169.254"), range;
  unsigned prefix = 99;
  hutch_addr_classify(&ip, &range, &prefix);
  char txt[HUTCH_IP_TEXT_MAX];
  hutch_ip_to_text(&range, txt);
  ok(prefix == 32 && !strcmp(txt, "169.254.169.254"), "the range is the most specific one (%s/%u)", txt, prefix);
  ip = IP("::ffff:10.9.8.7");
  hutch_addr_classify(&ip, &range, &prefix);
  hutch_ip_to_text(&range, txt);
  ok(prefix == 8 && !strcmp(txt, "10.0.0.0"), "a mapped address's range is the IPv4 range (%s/%u)", txt, prefix);
}

static bool blocked(const struct hutch_policy *p, const char *addr, uint16_t port, struct hutch_verdict *v) {
  struct hutch_ip ip = IP(addr);
  return hutch_addr_blocked(p, &ip, port, v);
}

static void test_blocked(void) {
  struct hutch_verdict v;
  struct hutch_policy *all = POL("\"all\"");
  ok(!blocked(all, "8.8.8.8", 443, &v) && v.allow && v.cls == HUTCH_ADDR_PUBLIC, "all: a public address may be reached");
  ok(blocked(all, "127.0.0.1", 443, &v) && !strcmp(v.why, "loopback address") && !v.rule, "all: loopback blocked");
  ok(blocked(all, "::ffff:127.0.0.1", 443, &v) && v.cls == HUTCH_ADDR_LOOPBACK, "all: mapped loopback blocked");
  ok(blocked(all, "64:ff9b::7f00:1", 443, &v), "all: NAT64 loopback blocked");
  ok(blocked(all, "2002:7f00:1::", 443, &v), "all: 6to4 loopback blocked");
  ok(blocked(all, "::127.0.0.1", 443, &v), "all: compatible loopback blocked");
  ok(blocked(all, "169.254.169.254", 80, &v) && v.cls == HUTCH_ADDR_METADATA &&
         !strcmp(v.why, "cloud metadata address"),
     "all: metadata blocked");
  ok(blocked(all, "fd00:ec2::254", 80, &v), "all: IPv6 metadata blocked");
  ok(blocked(all, "10.0.0.1", 443, &v) && v.cls == HUTCH_ADDR_PRIVATE, "all: private blocked");
  ok(blocked(all, "8.8.8.8", 0, &v) && !strcmp(v.why, "port 0"), "port 0 blocked");
  hutch_policy_free(all);

  struct hutch_policy *none = POL("\"none\"");
  ok(blocked(none, "8.8.8.8", 443, &v) && !strcmp(v.why, "egress is none"), "none: everything blocked");
  hutch_policy_free(none);
  ok(blocked(NULL, "8.8.8.8", 443, &v), "no policy: blocked (fail closed)");

  /* Unlocking a special range needs a rule inside it. */
  struct hutch_policy *p = POL("{\"allow\":[\"10.0.0.0/8\",\"169.254.0.0/16\",\"192.168.1.0/24:8080\",\"2002::/16\"]}");
  ok(!blocked(p, "10.1.2.3", 443, &v) && v.rule == &p->allow[0], "10/8 unlocks 10.1.2.3 (rule reported)");
  ok(!blocked(p, "::ffff:10.1.2.3", 443, &v) && v.rule == &p->allow[0], "and its mapped form");
  ok(!blocked(p, "169.254.1.1", 443, &v) && v.rule == &p->allow[1], "169.254/16 unlocks link-local");
  ok(blocked(p, "169.254.169.254", 80, &v) && v.cls == HUTCH_ADDR_METADATA, "but not the metadata address inside it");
  ok(!blocked(p, "192.168.1.7", 8080, &v), "192.168.1.0/24:8080 unlocks its port");
  ok(blocked(p, "192.168.1.7", 80, &v), "and no other port");
  ok(blocked(p, "192.168.2.7", 8080, &v), "nor another network");
  ok(blocked(p, "2002:c0a8:201::1", 443, &v) && v.cls == HUTCH_ADDR_PRIVATE,
     "2002::/16 does not unlock the private IPv4 a 6to4 address embeds");
  ok(!blocked(p, "2002:808:808::1", 443, &v), "positive control: 6to4 of a public address");
  hutch_policy_free(p);

  p = POL("{\"allow\":[\"0.0.0.0/0\",\"::/0\"]}");
  ok(blocked(p, "127.0.0.1", 443, &v), "0.0.0.0/0 unlocks no special range");
  ok(blocked(p, "::1", 443, &v), "::/0 unlocks no special range");
  ok(blocked(p, "fe80::1", 443, &v), "::/0 does not unlock link-local");
  ok(!blocked(p, "8.8.8.8", 443, &v), "positive control: a public address");
  hutch_policy_free(p);

  p = POL("{\"allow\":[\"169.254.169.254\",\"127.0.0.1:8080\",\"::1\"]}");
  ok(!blocked(p, "169.254.169.254", 80, &v) && v.rule == &p->allow[0], "metadata reachable with its exact /32");
  ok(!blocked(p, "::ffff:169.254.169.254", 80, &v), "and its mapped form");
  ok(!blocked(p, "127.0.0.1", 8080, &v) && blocked(p, "127.0.0.1", 8081, &v), "loopback with an exact port rule");
  ok(!blocked(p, "::1", 80, &v) && blocked(p, "::ffff:127.0.0.2", 80, &v), "::1 unlocked, 127.0.0.2 not");
  hutch_policy_free(p);

  /* Deny CIDR rules see through embedded IPv4 too. */
  p = POL("{\"allow\":[\"*\"],\"deny\":[\"8.8.8.0/24\",\"[2606:4700::/32]:443\"]}");
  ok(blocked(p, "8.8.8.8", 443, &v) && v.rule == &p->deny[0] && !strcmp(v.why, "denied by rule"), "deny CIDR");
  ok(blocked(p, "::ffff:8.8.8.8", 443, &v) && v.rule == &p->deny[0], "deny CIDR on a mapped address");
  ok(blocked(p, "64:ff9b::808:808", 443, &v), "deny CIDR on a NAT64 address");
  ok(blocked(p, "2002:808:808::1", 443, &v), "deny CIDR on a 6to4 address");
  ok(!blocked(p, "8.8.4.4", 443, &v), "positive control: outside the denied network");
  ok(blocked(p, "2606:4700::1111", 443, &v) && !blocked(p, "2606:4700::1111", 80, &v), "deny rule with a port");
  hutch_policy_free(p);
}

int main(void) {
  test_hosts();
  test_ip_helpers();
  test_embedded();
  test_classes();
  test_blocked();
  return done_testing();
}
