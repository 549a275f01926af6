/* libFuzzer entry point for the gateway's text parsers (part of `make
 * fuzz`): the HTTP/1.x request head parser, authorities, host names,
 * hutch_http_names_agree and egress policy rules.  Build by hand:
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -std=gnu11 -D_GNU_SOURCE \
 *     -Isrc/lib fuzz/fuzz_http.c src/lib/net/http.c src/lib/net/addr.c \
 *     src/lib/net/policy.c src/lib/common/err.c src/lib/common/util.c \
 *     -ljansson -o build/fuzz_http
 *   ./build/fuzz_http -max_len=20000 corpus/
 *
 * Properties checked: an accepted head is well-formed and does not depend
 * on what follows it, and its proper prefixes need more bytes; what comes
 * out of a parser goes back in unchanged (hosts, rule texts); agreement of
 * three names implies agreement of each pair; decisions never crash and a
 * deny rule always wins over the same allow rule. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "net/addr.h"
#include "net/http.h"
#include "net/policy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct hutch_http_request req, req2;

static void check_host(const struct hutch_host *h) {
  struct hutch_host again;
  const char *why;
  size_t n = strlen(h->text);
  if (n == 0 || n > HUTCH_NAME_MAX) abort();
  if (hutch_host_parse(h->text, n, &again, &why) < 0 || again.kind != h->kind || strcmp(again.text, h->text) != 0)
    abort();
  if (h->kind == HUTCH_HOST_IP && !hutch_ip_equal(&again.ip, &h->ip)) abort();
}

static void http(const char *buf, size_t size) {
  enum hutch_http_result r = hutch_http_parse(buf, size, &req);
  if (r == HUTCH_HTTP_NEED_MORE) {
    if (size >= HUTCH_HTTP_HEAD_MAX) abort();
    return;
  }
  if (r == HUTCH_HTTP_BAD) {
    if (!req.why) abort();
    return;
  }
  if (r != HUTCH_HTTP_OK || req.why) abort();
  if (req.head_len < 4 || req.head_len > size || req.head_len > HUTCH_HTTP_HEAD_MAX) abort();
  if (memcmp(buf + req.head_len - 4, "\r\n\r\n", 4) != 0) abort();
  if (req.port == 0 || !req.authority[0] || req.n_fields > HUTCH_HTTP_FIELDS_MAX) abort();
  if (req.connect != (req.form == HUTCH_HTTP_AUTHORITY)) abort();
  if (req.chunked && req.has_length) abort();
  check_host(&req.host);
  for (size_t i = 0; i < req.n_fields; i++) {
    const struct hutch_http_field *f = &req.fields[i];
    if (f->name < buf || f->name + f->name_len > buf + req.head_len || f->value + f->value_len > buf + req.head_len)
      abort();
    if (memchr(f->value, '\r', f->value_len) || memchr(f->value, '\n', f->value_len) || memchr(f->value, 0, f->value_len))
      abort();
  }
  /* The authority, parsed again, is the same destination. */
  struct hutch_host h;
  uint16_t port;
  if (hutch_http_authority(req.authority, strlen(req.authority), true, &h, &port, NULL) < 0 || port != req.port ||
      strcmp(h.text, req.host.text) != 0)
    abort();
  size_t head = req.head_len;
  char auth[sizeof req.authority];
  memcpy(auth, req.authority, sizeof auth);
  if (hutch_http_parse(buf, head, &req2) != HUTCH_HTTP_OK || strcmp(req2.authority, auth) != 0) abort();
  if (hutch_http_parse(buf, head - 1, &req2) != HUTCH_HTTP_NEED_MORE) abort();
}

static void names(const char *buf, size_t size) {
  /* Three NUL-terminated pieces separated by '\n'; an empty piece is NULL. */
  char s[3][300];
  size_t k = 0, o = 0;
  memset(s, 0, sizeof s);
  for (size_t i = 0; i < size && k < 3; i++) {
    if (buf[i] == '\n') {
      k++;
      o = 0;
    } else if (o + 1 < sizeof s[0]) {
      s[k][o++] = buf[i];
    }
  }
  const char *c = s[0][0] ? s[0] : NULL, *sn = s[1][0] ? s[1] : NULL, *h = s[2][0] ? s[2] : NULL;
  const char *why = NULL;
  bool all = hutch_http_names_agree(c, sn, h, &why);
  if (!all && !why) abort();
  if (all && c && sn && h &&
      !(hutch_http_names_agree(c, sn, NULL, NULL) && hutch_http_names_agree(c, NULL, h, NULL) &&
        hutch_http_names_agree(NULL, sn, h, NULL)))
    abort();
  struct hutch_host hh;
  if (hutch_host_parse(buf, size < 300 ? size : 300, &hh, &why) == 0) check_host(&hh);
}

static void rules(const char *buf, size_t size) {
  if (size > 400) size = 400;
  struct hutch_rule r, again;
  hutch_err err = HUTCH_ERR_INIT;
  if (hutch_rule_parse(buf, size, "rule", &r, &err) < 0) {
    if (err.status != 400) abort();
    return;
  }
  /* The canonical text is a fixed point. */
  if (hutch_rule_parse(r.text, strlen(r.text), "rule", &again, &err) < 0 || strcmp(again.text, r.text) != 0 ||
      again.kind != r.kind || again.port != r.port || again.prefix != r.prefix)
    abort();
  if (r.kind == HUTCH_RULE_CIDR && !hutch_ip_equal(&again.net, &r.net)) abort();

  /* Decisions with the rule allowed, then also denied. */
  struct hutch_rule both[2] = {r, r};
  both[1].deny = true;
  struct hutch_policy p = {.mode = HUTCH_EGRESS_LIST, .n_allow = 1, .allow = &both[0]};
  static const char *const probes[] = {"example.com", "a.example.com", "10.1.2.3", "::ffff:127.0.0.1", "8.8.8.8",
                                       "169.254.169.254", "2001:db8::1"};
  const char *target = r.kind == HUTCH_RULE_CIDR ? NULL : r.name;
  uint16_t port = r.port ? r.port : 443;
  struct hutch_verdict v;
  for (int deny = 0; deny <= 1; deny++) {
    if (deny) {
      p.n_deny = 1;
      p.deny = &both[1];
    }
    for (size_t i = 0; i < sizeof probes / sizeof *probes; i++) {
      bool a = hutch_policy_allow_name(&p, probes[i], port, &v);
      if (!v.why || (a && deny)) abort();
    }
    if (target && target[0]) {
      /* NAME: allows its own name unless denied; SUFFIX: never its apex. */
      bool a = hutch_policy_allow_name(&p, target, port, &v);
      if (!v.why || a != (r.kind == HUTCH_RULE_NAME && !deny)) abort();
    }
    if (r.kind == HUTCH_RULE_CIDR) {
      bool a = hutch_policy_allow_addr(&p, &r.net, port, &v);
      if (!v.why || (a && deny)) abort();
    }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *buf = (const char *)data;
  http(buf, size);
  names(buf, size);
  rules(buf, size);
  return 0;
}
