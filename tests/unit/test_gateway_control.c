/* hutch-gateway's control protocol and sandbox table
 * (src/lib/gateway/control.c): every malformed line next to a valid one,
 * the table's rules (one address per sandbox, moves, removal), the answers
 * gw_ctl_handle writes, and the audit line format and rotation
 * (src/lib/gateway/audit.c). */
#include <fcntl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"
#include "gateway/audit.h"
#include "gateway/control.h"
#include "tap.h"

static struct gw_ctl_cmd cmd;
static hutch_err err;

static int parse(const char *line) {
  hutch_err_clear(&err);
  gw_ctl_cmd_clear(&cmd);
  return gw_ctl_parse(line, strlen(line), &cmd, &err);
}

/* Refused with a message containing `why`. */
static bool refused(const char *line, const char *why) {
  int r = parse(line);
  bool ok_ = r < 0 && err.status == 400 && strstr(err.msg, why);
  if (!ok_) printf("#   result %d, message '%s', expected: %s\n", r, err.msg, why);
  return ok_;
}

static void test_ids(void) {
  ok(gw_sandbox_id_ok("sb_abc-DEF_123"), "a sandbox id");
  ok(!gw_sandbox_id_ok(""), "empty");
  ok(!gw_sandbox_id_ok("unknown"), "\"unknown\" is reserved");
  ok(!gw_sandbox_id_ok("../etc"), "a path");
  ok(!gw_sandbox_id_ok("a/b"), "a slash");
  ok(!gw_sandbox_id_ok("a.b"), "a dot");
  ok(!gw_sandbox_id_ok("a b"), "a space");
  ok(!gw_sandbox_id_ok(NULL), "NULL");
  char id[80];
  memset(id, 'a', 64);
  id[64] = 0;
  ok(gw_sandbox_id_ok(id), "64 characters");
  id[64] = 'a';
  id[65] = 0;
  ok(!gw_sandbox_id_ok(id), "65 characters");
}

static void test_parse(void) {
  ok(parse("{\"op\":\"set\",\"sandbox\":\"sb_a\",\"addr\":\"10.231.0.6\",\"policy\":{\"allow\":[\"Pypi.org\"]}}") == 0 &&
         cmd.op == GW_CTL_SET && !strcmp(cmd.sandbox, "sb_a") && cmd.policy && cmd.policy->n_allow == 1 &&
         !strcmp(cmd.policy->allow[0].text, "pypi.org"),
     "set with a list policy");
  ok(parse("{\"op\":\"set\",\"sandbox\":\"sb_a\",\"addr\":\"10.231.0.6\",\"policy\":\"none\"}") == 0 &&
         cmd.policy->mode == HUTCH_EGRESS_NONE,
     "set with \"none\"");
  ok(parse("{\"op\":\"remove\",\"sandbox\":\"sb_a\"}") == 0 && cmd.op == GW_CTL_REMOVE, "remove");
  ok(parse("{\"op\":\"list\"}") == 0 && cmd.op == GW_CTL_LIST, "list");

  ok(refused("", "invalid JSON"), "empty line");
  ok(refused("{\"op\":\"list\"", "invalid JSON"), "truncated JSON");
  ok(refused("[\"list\"]", "expected an object"), "an array");
  ok(refused("{}", "op:"), "no op");
  ok(refused("{\"op\":1}", "op:"), "op not a string");
  ok(refused("{\"op\":\"delete\",\"sandbox\":\"sb_a\"}", "op:"), "unknown op");
  ok(refused("{\"op\":\"list\",\"op\":\"set\"}", "invalid JSON"), "a duplicate member");
  ok(refused("{\"op\":\"list\",\"sandbox\":\"sb_a\"}", "unknown member `sandbox`"), "list with a sandbox");
  ok(refused("{\"op\":\"remove\",\"sandbox\":\"sb_a\",\"addr\":\"10.0.0.1\"}", "unknown member `addr`"),
     "remove with an addr");
  ok(refused("{\"op\":\"set\",\"sandbox\":\"sb_a\",\"addr\":\"10.231.0.6\",\"policy\":\"all\",\"x\":1}", "unknown member `x`"),
     "set with an extra member");
  ok(refused("{\"op\":\"remove\"}", "sandbox:"), "remove without a sandbox");
  ok(refused("{\"op\":\"remove\",\"sandbox\":7}", "sandbox:"), "sandbox a number");
  ok(refused("{\"op\":\"remove\",\"sandbox\":\"../x\"}", "sandbox:"), "sandbox a path");
  ok(refused("{\"op\":\"remove\",\"sandbox\":\"unknown\"}", "sandbox:"), "sandbox \"unknown\"");
  ok(refused("{\"op\":\"remove\",\"sandbox\":\"sb\\u0000x\"}", "invalid JSON"), "a NUL in the sandbox id");
  static const char *const bad_addrs[] = {"10.231.0.06", "10.231.6", "::ffff:10.0.0.1", "2001:db8::1", "example.com",
                                          "0.0.0.0", "255.255.255.255", "224.0.0.1", "10.0.0.1/32", " 10.0.0.1", NULL};
  for (size_t i = 0; bad_addrs[i]; i++) {
    char line[200];
    snprintf(line, sizeof line, "{\"op\":\"set\",\"sandbox\":\"sb_a\",\"addr\":\"%s\",\"policy\":\"all\"}", bad_addrs[i]);
    ok(refused(line, "addr:"), "addr `%s` refused", bad_addrs[i]);
  }
  ok(refused("{\"op\":\"set\",\"sandbox\":\"sb_a\",\"addr\":10,\"policy\":\"all\"}", "addr:"), "addr a number");
  ok(refused("{\"op\":\"set\",\"sandbox\":\"sb_a\",\"policy\":\"all\"}", "addr:"), "no addr");
  ok(refused("{\"op\":\"set\",\"sandbox\":\"sb_a\",\"addr\":\"10.231.0.6\"}", "policy: missing"), "no policy");
  ok(refused("{\"op\":\"set\",\"sandbox\":\"sb_a\",\"addr\":\"10.231.0.6\",\"policy\":\"some\"}", "policy:"),
     "policy neither none, all nor a list");
  ok(refused("{\"op\":\"set\",\"sandbox\":\"sb_a\",\"addr\":\"10.231.0.6\",\"policy\":{\"allow\":[\"ok.com\",\"127.1\"]}}",
             "policy.allow[1]"),
     "a bad rule is named by its index");
  ok(refused("{\"op\":\"set\",\"sandbox\":\"sb_a\",\"addr\":\"10.231.0.6\",\"policy\":{\"allowed\":[]}}", "unknown field"),
     "a misspelt policy list");

  /* Bounded: one byte over the limit is refused before parsing. */
  size_t n = GW_CTL_LINE_MAX + 1;
  char *big = xmalloc(n + 1);
  memset(big, ' ', n);
  memcpy(big, "{\"op\":\"list\"}", 13);
  big[n] = 0;
  hutch_err_clear(&err);
  ok(gw_ctl_parse(big, n, &cmd, &err) < 0 && strstr(err.msg, "longer than"), "a line over GW_CTL_LINE_MAX");
  ok(gw_ctl_parse(big, n - 1, &cmd, &err) == 0 && cmd.op == GW_CTL_LIST, "a line of exactly GW_CTL_LINE_MAX");
  free(big);
  gw_ctl_cmd_clear(&cmd);
}

static struct hutch_ip ip4(const char *s) {
  struct hutch_ip ip;
  hutch_ip_parse(s, strlen(s), &ip);
  return ip;
}

static char *handle(struct gw_table *t, const char *line, struct gw_ctl_effect *eff) {
  return gw_ctl_handle(t, line, strlen(line), eff);
}

static void test_table(void) {
  struct gw_table t;
  gw_table_init(&t);
  struct gw_ctl_effect eff;
  char *a = handle(&t, "{\"op\":\"set\",\"sandbox\":\"sb_a\",\"addr\":\"10.231.0.6\",\"policy\":\"all\"}", &eff);
  is_str(a, "{\"ok\":true}\n", "set answers ok");
  ok(eff.changed && !eff.addr_gone, "set changes the table");
  free(a);
  struct hutch_ip x = ip4("10.231.0.6"), y = ip4("10.231.0.10"), z = ip4("10.231.0.7");
  const struct gw_sandbox *s = gw_table_find_addr(&t, &x);
  ok(s && !strcmp(s->id, "sb_a") && s->policy->mode == HUTCH_EGRESS_ALL, "found by address");
  ok(!gw_table_find_addr(&t, &z), "another address is unknown");
  ok(!gw_table_find_addr(&t, NULL), "no address is unknown");

  a = handle(&t, "{\"op\":\"set\",\"sandbox\":\"sb_b\",\"addr\":\"10.231.0.6\",\"policy\":\"all\"}", &eff);
  ok(strstr(a, "\"ok\":false") && strstr(a, "already sandbox sb_a"), "an address belongs to one sandbox");
  ok(!eff.changed, "a refused set changes nothing");
  free(a);
  s = gw_table_find_addr(&t, &x);
  ok(s && !strcmp(s->id, "sb_a"), "sb_a keeps its address");

  a = handle(&t, "{\"op\":\"set\",\"sandbox\":\"sb_a\",\"addr\":\"10.231.0.6\",\"policy\":{\"allow\":[\"a.com\"]}}", &eff);
  ok(!strcmp(a, "{\"ok\":true}\n") && !eff.addr_gone, "a new policy for the same address");
  free(a);
  ok(gw_table_find_addr(&t, &x)->policy->mode == HUTCH_EGRESS_LIST, "the new policy is in force");

  a = handle(&t, "{\"op\":\"set\",\"sandbox\":\"sb_a\",\"addr\":\"10.231.0.10\",\"policy\":\"all\"}", &eff);
  ok(!strcmp(a, "{\"ok\":true}\n") && eff.addr_gone && hutch_ip_equal(&eff.gone, &x), "a move reports the old address");
  free(a);
  ok(!gw_table_find_addr(&t, &x) && gw_table_find_addr(&t, &y), "moved");
  ok(t.n == 1, "still one sandbox");

  a = handle(&t, "{\"op\":\"set\",\"sandbox\":\"sb_b\",\"addr\":\"10.231.0.6\",\"policy\":\"none\"}", &eff);
  ok(!strcmp(a, "{\"ok\":true}\n"), "the freed address can be given to another sandbox");
  free(a);

  a = handle(&t, "{\"op\":\"list\"}", &eff);
  json_t *j = json_loads(a, 0, NULL);
  ok(j && json_is_true(json_object_get(j, "ok")) && json_array_size(json_object_get(j, "sandboxes")) == 2, "list");
  json_t *first = json_array_get(json_object_get(j, "sandboxes"), 0);
  is_str(json_string_value(json_object_get(first, "sandbox")), "sb_a", "list: sandbox");
  is_str(json_string_value(json_object_get(first, "addr")), "10.231.0.10", "list: addr");
  is_str(json_string_value(json_object_get(first, "policy")), "all", "list: policy");
  ok(strchr(a, '\n') == a + strlen(a) - 1, "one line");
  json_decref(j);
  free(a);

  a = handle(&t, "{\"op\":\"remove\",\"sandbox\":\"sb_a\"}", &eff);
  ok(!strcmp(a, "{\"ok\":true}\n") && eff.addr_gone && hutch_ip_equal(&eff.gone, &y), "remove reports the address");
  free(a);
  a = handle(&t, "{\"op\":\"remove\",\"sandbox\":\"sb_a\"}", &eff);
  ok(!strcmp(a, "{\"ok\":true}\n") && !eff.addr_gone && !eff.changed, "removing an absent sandbox is ok, no effect");
  free(a);
  ok(!gw_table_find_addr(&t, &y) && !gw_table_find_id(&t, "sb_a") && gw_table_find_id(&t, "sb_b"), "removed");

  a = handle(&t, "{\"op\":\"set\",\"sandbox\":\"sb_\\\"x\",\"addr\":\"10.0.0.1\",\"policy\":\"all\"}", &eff);
  json_t *e = json_loads(a, 0, NULL);
  ok(e && json_is_false(json_object_get(e, "ok")) && strstr(json_string_value(json_object_get(e, "error")), "sandbox:"),
     "an error answer is valid JSON");
  json_decref(e);
  free(a);

  /* The table is bounded. */
  hutch_err_clear(&err);
  int fails = 0;
  for (unsigned i = 0; i < GW_MAX_SANDBOXES + 1; i++) {
    char id[32];
    snprintf(id, sizeof id, "sb_%u", i);
    struct hutch_ip ip = {.family = AF_INET, .b = {10, (uint8_t)(i >> 16), (uint8_t)(i >> 8), (uint8_t)i}};
    if (gw_table_set(&t, id, &ip, hutch_policy_none(), &err) < 0) fails++;
  }
  ok(fails == 2 && err.status == 503 && t.n == GW_MAX_SANDBOXES, "at most GW_MAX_SANDBOXES (sb_b holds one slot)");
  gw_table_free(&t);
  ok(t.n == 0 && !t.v, "freed");
}

static void test_audit(void) {
  struct gw_audit_rec r = {.sandbox = "sb_a",
                           .proto = "connect",
                           .name = "pypi.org",
                           .addr = "151.101.0.223",
                           .port = 443,
                           .decision = "allowed",
                           .rule = "*.pypi.org",
                           .reason = "allowed by rule",
                           .bytes_up = 10,
                           .bytes_down = 20};
  char *line = gw_audit_line(&r, 1764492000123ull);
  is_str(line,
         "{\"time\":\"2025-11-30T08:40:00.123Z\",\"sandbox\":\"sb_a\",\"proto\":\"connect\",\"name\":\"pypi.org\","
         "\"addr\":\"151.101.0.223\",\"port\":443,\"decision\":\"allowed\",\"rule\":\"*.pypi.org\","
         "\"reason\":\"allowed by rule\",\"bytes_up\":10,\"bytes_down\":20}\n",
         "the audit line, fields in order");
  free(line);
  struct gw_audit_rec u = {.proto = "dns", .name = "a\"b\xff", .decision = "denied", .reason = "unknown source"};
  line = gw_audit_line(&u, 0);
  json_t *j = json_loads(line, 0, NULL);
  ok(j && !strcmp(json_string_value(json_object_get(j, "sandbox")), "unknown") && json_is_null(json_object_get(j, "addr")) &&
         json_is_null(json_object_get(j, "port")) && json_is_null(json_object_get(j, "rule")),
     "unknown sandbox, nulls");
  is_str(json_string_value(json_object_get(j, "name")), "a\"b\xef\xbf\xbd", "a name that is not UTF-8 is escaped");
  json_decref(j);
  free(line);

  char dir[] = "/tmp/hutch-audit-XXXXXX";
  ok(mkdtemp(dir) != NULL, "a directory");
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  hutch_err_clear(&err);
  int rc = 0;
  for (int i = 0; i < 40; i++) rc |= gw_audit_write(dfd, &r, 4096, &err);
  ok(rc == 0, "40 lines written with a 4 KiB cap");
  struct stat st, st1;
  char p[128], p1[128];
  snprintf(p, sizeof p, "%s/sb_a.jsonl", dir);
  snprintf(p1, sizeof p1, "%s/sb_a.jsonl.1", dir);
  ok(stat(p, &st) == 0 && st.st_size <= 4096 && (st.st_mode & 0777) == 0640, "the file stays under the cap, mode 0640");
  ok(stat(p1, &st1) == 0 && st1.st_size <= 4096 && st1.st_size > 3000, "the previous one is .1");
  struct gw_audit_rec bad = r;
  bad.sandbox = "../evil";
  ok(gw_audit_write(dfd, &bad, 4096, &err) < 0, "a sandbox id that is a path is refused");
  char link[128];
  snprintf(link, sizeof link, "%s/sb_l.jsonl", dir);
  ok(symlink("/etc/passwd", link) == 0, "a symlink planted");
  bad.sandbox = "sb_l";
  ok(gw_audit_write(dfd, &bad, 4096, &err) < 0, "a symlinked log is not followed");
  bad.sandbox = NULL;
  ok(gw_audit_write(dfd, &bad, 4096, &err) == 0, "unknown.jsonl");
  close(dfd);
  hutch_err_clear(&err);
  ok(rm_rf(dir, &err) == 0, "cleaned up");
}

int main(void) {
  test_ids();
  test_parse();
  test_table();
  test_audit();
  return done_testing();
}
