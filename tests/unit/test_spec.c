/* The sandbox spec (src/lib/runtime/spec.c): hutchd writes it as
 * config.json and hutch-shim parses it back, validating every field. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "runtime/runtime.h"
#include "tap.h"

/* Regression tests for bugs found by these tests (now fixed); `why` names the bug. */
#define regression_ok(cond, why, ...) ok(cond, __VA_ARGS__)

static void fill(struct hutch_sandbox_spec *s) {
  memset(s, 0, sizeof *s);
  s->id = xstrdup("sb_abcdefghijklmnopqrst");
  s->instance = xstrdup("test");
  s->runtime = xstrdup("native");
  s->rootfs = xstrdup("/var/lib/hutch/sandboxes/sb_x/root");
  s->lower = xstrdup("/var/lib/hutch/templates/python/root");
  s->usr_src = xstrdup("/usr");
  s->init_path = xstrdup("/usr/libexec/hutch/hutch-init");
  s->hostname = xstrdup("sandbox \"quoted\" \xc3\xa9");
  s->uid_base = 100000;
  s->uid_count = 65536;
  s->limits.memory_bytes = 512ull << 20;
  s->limits.pids = 256;
  s->limits.cpu_millis = 1500;
  s->tmp_bytes = 64ull << 20;
  s->runsc_path = xstrdup("/usr/bin/runsc");
  s->runsc_platform = xstrdup("ptrace");
  s->state_dir = xstrdup("/var/lib/hutch/sandboxes/sb_x/runsc");
  s->bundle_dir = xstrdup("/var/lib/hutch/sandboxes/sb_x/bundle");
  s->restore_from = xstrdup("/var/lib/hutch/pool/checkpoints/snap_x");
}

static int same_str(const char *a, const char *b) { return (!a && !b) || (a && b && !strcmp(a, b)); }

static int same(const struct hutch_sandbox_spec *a, const struct hutch_sandbox_spec *b) {
  return same_str(a->id, b->id) && same_str(a->instance, b->instance) && same_str(a->runtime, b->runtime) &&
         same_str(a->rootfs, b->rootfs) && same_str(a->lower, b->lower) &&
         same_str(a->usr_src, b->usr_src) &&
         same_str(a->init_path, b->init_path) && same_str(a->hostname, b->hostname) && a->uid_base == b->uid_base &&
         a->uid_count == b->uid_count && a->limits.memory_bytes == b->limits.memory_bytes &&
         a->limits.pids == b->limits.pids && a->limits.cpu_millis == b->limits.cpu_millis &&
         a->tmp_bytes == b->tmp_bytes && same_str(a->runsc_path, b->runsc_path) &&
         same_str(a->runsc_platform, b->runsc_platform) && same_str(a->state_dir, b->state_dir) &&
         same_str(a->bundle_dir, b->bundle_dir) && same_str(a->restore_from, b->restore_from);
}

/* Serialise the reference spec, let `edit` change the JSON object, and
 * return the text (caller frees). */
static char *edited(void (*edit)(json_t *o, const char *key, json_t *val), const char *key, json_t *val) {
  struct hutch_sandbox_spec s;
  fill(&s);
  char *text = hutch_spec_to_json(&s);
  hutch_spec_free(&s);
  json_t *o = json_loads(text, 0, NULL);
  free(text);
  edit(o, key, val);
  char *out = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  return out;
}
static void set_member(json_t *o, const char *key, json_t *val) { json_object_set_new(o, key, val); }
static void del_member(json_t *o, const char *key, json_t *val) { json_object_del(o, key); }

static void expect_reject(const char *text, const char *what) {
  struct hutch_sandbox_spec s;
  hutch_err err = HUTCH_ERR_INIT;
  int r = hutch_spec_from_json(text, &s, &err);
  is_int(r, -1, "rejects %s", what);
  ok(err.status == 400 && !strcmp(err.code, "invalid_argument") && !strncmp(err.msg, "sandbox spec: ", 14),
     "... 400 invalid_argument \"%s\"", err.msg);
  ok(s.id == NULL && s.rootfs == NULL && s.usr_src == NULL, "... nothing allocated");
  if (r == 0) hutch_spec_free(&s);
}

static void expect_accept(const char *text, const char *what, struct hutch_sandbox_spec *keep) {
  struct hutch_sandbox_spec s;
  hutch_err err = HUTCH_ERR_INIT;
  int r = hutch_spec_from_json(text, &s, &err);
  is_int(r, 0, "accepts %s", what);
  if (r < 0) printf("#   %s\n", err.msg);
  if (r == 0 && keep) *keep = s;
  else if (r == 0) hutch_spec_free(&s);
}

static void test_round_trip(void) {
  struct hutch_sandbox_spec a, b;
  fill(&a);
  char *text = hutch_spec_to_json(&a);
  ok(text != NULL, "to_json produces text");
  hutch_err err = HUTCH_ERR_INIT;
  is_int(hutch_spec_from_json(text, &b, &err), 0, "from_json parses it back");
  ok(same(&a, &b), "every field round trips");
  hutch_spec_free(&b);
  free(text);

  /* Extremes of each numeric range. */
  a.uid_base = 0xffffffffu;
  a.uid_count = 1;
  a.limits.memory_bytes = 0;
  a.limits.pids = 0;
  a.limits.cpu_millis = 1000000;
  a.tmp_bytes = (uint64_t)INT64_MAX;
  text = hutch_spec_to_json(&a);
  memset(&b, 0, sizeof b);
  is_int(hutch_spec_from_json(text, &b, &err), 0, "extreme values parse");
  ok(same(&a, &b), "extreme values round trip (uid_base 2^32-1, cpu 10^6, tmp INT64_MAX)");
  hutch_spec_free(&b);
  free(text);
  hutch_spec_free(&a);
  ok(a.id == NULL && a.usr_src == NULL, "spec_free clears the struct");
  hutch_spec_free(&a); /* twice is harmless */

  /* The optional strings, absent from the JSON. */
  static const char *const optional[] = {"lower", "usr_src"};
  for (size_t i = 0; i < 2; i++) {
    char *absent = edited(del_member, optional[i], NULL);
    char what[64];
    snprintf(what, sizeof what, "a spec without `%s`", optional[i]);
    memset(&b, 0, sizeof b);
    expect_accept(absent, what, &b);
    ok((i == 0 ? b.lower : b.usr_src) == NULL, "absent %s parses as NULL", optional[i]);
    ok((i == 0 ? b.usr_src : b.lower) != NULL, "... the other optional field is still there");
    ok(b.id && !strcmp(b.id, "sb_abcdefghijklmnopqrst"), "... and the required ones");
    hutch_spec_free(&b);
    free(absent);
  }

  /* NULL through the whole round trip: what hutchd writes for a template
   * without /usr or without an overlay (daemon.c).  to_json writes
   * "usr_src": null / "lower": null ("s:s?") and from_json's "s?s" refuses
   * null, so hutch-shim cannot read its config.  Known bug (spec.c
   * hutch_spec_to_json: use "s:s*", which omits the member), TODO until
   * fixed. */
  for (int which = 0; which < 3; which++) {
    static const char *const names[] = {"lower", "usr_src", "lower and usr_src"};
    fill(&a);
    if (which != 1) {
      free(a.lower);
      a.lower = NULL;
    }
    if (which != 0) {
      free(a.usr_src);
      a.usr_src = NULL;
    }
    text = hutch_spec_to_json(&a);
    ok(text != NULL, "to_json with %s NULL", names[which]);
    memset(&b, 0, sizeof b);
    hutch_err_clear(&err);
    int r = text ? hutch_spec_from_json(text, &b, &err) : -1;
    regression_ok(r == 0 && same(&a, &b), "spec.c to_json writes null for a NULL optional string, from_json rejects it",
            "%s NULL round trips through to_json/from_json", names[which]);
    if (r < 0) printf("#   error %s\n", err.msg);
    if (r == 0) hutch_spec_free(&b);
    free(text);
    hutch_spec_free(&a);
  }
}

/* The gvisor fields (runtime.h): optional, NULL when absent, left out of
 * the JSON when NULL; a native spec has none of them. */
static void test_gvisor_fields(void) {
  static const char *const keys[] = {"runsc_path", "runsc_platform", "state_dir", "bundle_dir", "restore_from"};
  for (size_t i = 0; i < 5; i++) {
    char *absent = edited(del_member, keys[i], NULL);
    char what[64];
    snprintf(what, sizeof what, "a spec without `%s`", keys[i]);
    struct hutch_sandbox_spec b;
    memset(&b, 0, sizeof b);
    expect_accept(absent, what, &b);
    char *const got[] = {b.runsc_path, b.runsc_platform, b.state_dir, b.bundle_dir, b.restore_from};
    ok(got[i] == NULL, "absent %s parses as NULL", keys[i]);
    ok(got[(i + 1) % 5] != NULL, "... the others are still there");
    hutch_spec_free(&b);
    free(absent);
  }
  struct hutch_sandbox_spec a, b;
  fill(&a);
  free(a.runsc_path), a.runsc_path = NULL;
  free(a.runsc_platform), a.runsc_platform = NULL;
  free(a.state_dir), a.state_dir = NULL;
  free(a.bundle_dir), a.bundle_dir = NULL;
  free(a.restore_from), a.restore_from = NULL;
  char *text = hutch_spec_to_json(&a);
  ok(text && !strstr(text, "runsc") && !strstr(text, "state_dir") && !strstr(text, "bundle_dir") &&
         !strstr(text, "restore_from"),
     "NULL gvisor fields are left out of the JSON");
  hutch_err err = HUTCH_ERR_INIT;
  memset(&b, 0, sizeof b);
  is_int(text ? hutch_spec_from_json(text, &b, &err) : -1, 0, "... and a spec without them parses");
  ok(same(&a, &b), "... to the same spec");
  hutch_spec_free(&b);
  free(text);
  hutch_spec_free(&a);

  /* A bare program name is a valid runsc_path (found in PATH). */
  char *t = edited(set_member, "runsc_path", json_string("runsc"));
  expect_accept(t, "runsc_path `runsc` (from PATH)", NULL);
  free(t);
  t = edited(set_member, "runsc_platform", json_string("systrap"));
  expect_accept(t, "runsc_platform `systrap`", NULL);
  free(t);
}

static const char *const required[] = {"id",        "instance", "runtime", "rootfs",       "init_path",
                                       "hostname",  "uid_base", "uid_count", "memory_bytes", "pids",
                                       "cpu_millis", "tmp_bytes", NULL};

static void test_rejects(void) {
  char *t;
  t = edited(set_member, "extra", json_integer(1));
  expect_reject(t, "an unknown field (JSON_STRICT)");
  free(t);
  t = edited(set_member, "Hostname", json_string("x"));
  expect_reject(t, "a field differing only in case");
  free(t);

  for (size_t i = 0; required[i]; i++) {
    t = edited(del_member, required[i], NULL);
    char what[64];
    snprintf(what, sizeof what, "a spec without `%s`", required[i]);
    expect_reject(t, what);
    free(t);
  }

  struct {
    const char *key;
    json_t *val;
    const char *what;
  } bad[] = {
      {"uid_count", json_integer(0), "uid_count 0"},
      {"uid_count", json_integer(65537), "uid_count 65537"},
      {"uid_count", json_integer(-1), "uid_count -1"},
      {"uid_base", json_integer(0), "uid_base 0 (would map to host root)"},
      {"uid_base", json_integer(-5), "uid_base -5"},
      {"uid_base", json_integer(0x100000000LL), "uid_base 2^32"},
      {"memory_bytes", json_integer(-1), "memory_bytes -1"},
      {"pids", json_integer(-1), "pids -1"},
      {"cpu_millis", json_integer(1000001), "cpu_millis 1000001"},
      {"cpu_millis", json_integer(-1), "cpu_millis -1"},
      {"tmp_bytes", json_integer(-1), "tmp_bytes -1"},
      {"id", json_integer(5), "id as an integer"},
      {"id", json_null(), "id null"},
      {"rootfs", json_true(), "rootfs as a bool"},
      {"uid_count", json_string("100"), "uid_count as a string"},
      {"uid_count", json_real(100.0), "uid_count as a real"},
      {"usr_src", json_integer(1), "usr_src as an integer"},
      {"lower", json_false(), "lower as a bool"},
      {"state_dir", json_string("runsc"), "a relative state_dir"},
      {"bundle_dir", json_string(""), "an empty bundle_dir"},
      {"restore_from", json_string("ckpt/x"), "a relative restore_from"},
      {"restore_from", json_null(), "restore_from null"},
      {"runsc_path", json_string("bin/runsc"), "a relative runsc_path with a slash"},
      {"runsc_path", json_string(""), "an empty runsc_path"},
      {"runsc_platform", json_string("kvm --debug"), "runsc_platform with a space (one flag value)"},
      {"runsc_platform", json_string(""), "an empty runsc_platform"},
      {"runsc_platform", json_integer(1), "runsc_platform as an integer"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    t = edited(set_member, bad[i].key, bad[i].val);
    expect_reject(t, bad[i].what);
    free(t);
  }

  t = edited(set_member, "uid_count", json_integer(65536));
  expect_accept(t, "uid_count 65536 (the upper bound)", NULL);
  free(t);

  expect_reject("", "empty text");
  expect_reject("{", "truncated JSON");
  expect_reject("[]", "an array");
  expect_reject("null", "null");
  expect_reject("{}", "an empty object");
  expect_reject("{\"id\": \"a\", \"id\": \"b\"}", "a duplicate key");

  /* A duplicated key in an otherwise complete spec. */
  struct hutch_sandbox_spec s;
  fill(&s);
  char *text = hutch_spec_to_json(&s);
  hutch_spec_free(&s);
  size_t n = strlen(text);
  char *dup = xasprintf("{\"id\":\"sb_other\",%s", text + 1);
  expect_reject(dup, "a complete spec with `id` twice");
  free(dup);
  /* Trailing garbage. */
  char *trail = xasprintf("%s x", text);
  expect_reject(trail, "trailing garbage");
  free(trail);
  ok(n > 2, "reference text is non-trivial");
  free(text);
}

int main(void) {
  test_round_trip();
  test_gvisor_fields();
  test_rejects();
  return done_testing();
}
