/* JSON validation helpers (src/lib/api/json.c): every rejection names the
 * field, absent/null members leave outputs untouched, and the lossy string
 * constructor turns arbitrary bytes into valid UTF-8. */
#include <ctype.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/json.h"
#include "common/util.h"
#include "tap.h"

static json_t *load(const char *text) {
  json_error_t je;
  json_t *j = json_loads(text, JSON_ALLOW_NUL, &je);
  if (!j) printf("# json_loads(%s): %s\n", text, je.text);
  return j;
}

static void expect_err(int r, const hutch_err *err, const char *want_msg, const char *what) {
  is_int(r, -1, "%s: rejected", what);
  is_str(err->msg, want_msg, "%s: message", what);
  ok(err->status == 400 && !strcmp(err->code, "invalid_argument"), "%s: 400 invalid_argument", what);
}

static void test_only(void) {
  json_t *o = load("{\"memory_mib\": 1, \"cpus\": 2, \"foo\": 3}");
  static const char *const allowed[] = {"memory_mib", "cpus", "foo", NULL};
  static const char *const fewer[] = {"memory_mib", "cpus", NULL};
  static const char *const none[] = {NULL};
  hutch_err err = HUTCH_ERR_INIT;
  is_int(hutch_json_only(o, "resources", allowed, &err), 0, "only: all members allowed");
  expect_err(hutch_json_only(o, "resources", fewer, &err), &err, "field `resources.foo`: unknown field",
             "only: unknown member under a prefix");
  hutch_err_clear(&err);
  expect_err(hutch_json_only(o, NULL, fewer, &err), &err, "field `foo`: unknown field", "only: NULL prefix");
  hutch_err_clear(&err);
  expect_err(hutch_json_only(o, "", fewer, &err), &err, "field `foo`: unknown field", "only: empty prefix");
  hutch_err_clear(&err);
  is_int(hutch_json_only(o, "x", none, &err), -1, "only: empty allow list rejects any member");
  json_decref(o);

  json_t *e = load("{}");
  is_int(hutch_json_only(e, "x", none, &err), 0, "only: empty object passes an empty allow list");
  json_decref(e);

  json_t *nested = load("{\"a\": {\"b\": 1}}");
  static const char *const just_b[] = {"b", NULL};
  static const char *const just_c[] = {"c", NULL};
  json_t *a = json_object_get(nested, "a");
  is_int(hutch_json_only(a, "a", just_b, &err), 0, "only: nested object with its own allow list");
  hutch_err_clear(&err);
  is_int(hutch_json_only(a, "a", just_c, &err), -1, "only: nested unknown member");
  is_str(err.msg, "field `a.b`: unknown field", "only: nested field named with its parent");
  json_decref(nested);

  /* A case difference is a different field. */
  json_t *c = load("{\"Memory_mib\": 1}");
  is_int(hutch_json_only(c, "resources", fewer, &err), -1, "only: field names are case-sensitive");
  json_decref(c);
}

static void test_string(void) {
  json_t *o = load("{\"name\": \"box\", \"n\": 5, \"nul\": \"a\\u0000b\", \"null\": null, \"long\": \"abcdef\","
                   " \"empty\": \"\", \"arr\": [\"x\"]}");
  hutch_err err = HUTCH_ERR_INIT;
  const char *out = "untouched";
  is_int(hutch_json_string(o, "p", "name", 64, &out, &err), 0, "string: present");
  is_str(out, "box", "string: value");
  out = "untouched";
  is_int(hutch_json_string(o, "p", "missing", 64, &out, &err), 0, "string: absent is fine");
  is_str(out, "untouched", "string: absent leaves out untouched");
  is_int(hutch_json_string(o, "p", "null", 64, &out, &err), 0, "string: null is fine");
  is_str(out, "untouched", "string: null leaves out untouched");
  expect_err(hutch_json_string(o, "p", "n", 64, &out, &err), &err, "field `p.n`: expected a string",
             "string: integer");
  hutch_err_clear(&err);
  expect_err(hutch_json_string(o, "p", "arr", 64, &out, &err), &err, "field `p.arr`: expected a string",
             "string: array");
  is_str(out, "untouched", "string: wrong type leaves out untouched");
  hutch_err_clear(&err);
  expect_err(hutch_json_string(o, NULL, "nul", 64, &out, &err), &err, "field `nul`: contains a NUL byte",
             "string: embedded NUL");
  hutch_err_clear(&err);
  expect_err(hutch_json_string(o, "p", "long", 5, &out, &err), &err, "field `p.long`: longer than 5 bytes",
             "string: over maxlen");
  is_int(hutch_json_string(o, "p", "long", 6, &out, &err), 0, "string: exactly maxlen is fine");
  is_str(out, "abcdef", "string: exactly maxlen value");
  is_int(hutch_json_string(o, "p", "empty", 0, &out, &err), 0, "string: empty string with maxlen 0");
  is_str(out, "", "string: empty value");
  json_decref(o);
}

static void test_int(void) {
  json_t *o = load("{\"i\": 42, \"neg\": -3, \"real\": 5.0, \"str\": \"5\", \"b\": true, \"big\": 9223372036854775807,"
                   " \"small\": -9223372036854775808, \"null\": null}");
  hutch_err err = HUTCH_ERR_INIT;
  int64_t v = 1234;
  is_int(hutch_json_int(o, "r", "i", 0, 100, &v, &err), 0, "int: in range");
  is_int(v, 42, "int: value");
  is_int(hutch_json_int(o, "r", "i", 42, 42, &v, &err), 0, "int: min == max == value");
  v = 1234;
  is_int(hutch_json_int(o, "r", "missing", 0, 1, &v, &err), 0, "int: absent");
  is_int(hutch_json_int(o, "r", "null", 0, 1, &v, &err), 0, "int: null");
  is_int(v, 1234, "int: absent/null leave out untouched");
  expect_err(hutch_json_int(o, "resources", "i", 43, 100, &v, &err), &err,
             "field `resources.i`: 42 is out of range [43, 100]", "int: below min");
  hutch_err_clear(&err);
  expect_err(hutch_json_int(o, "resources", "i", 0, 41, &v, &err), &err,
             "field `resources.i`: 42 is out of range [0, 41]", "int: above max");
  is_int(v, 1234, "int: out of range leaves out untouched");
  hutch_err_clear(&err);
  expect_err(hutch_json_int(o, "resources", "neg", 0, 10, &v, &err), &err,
             "field `resources.neg`: -3 is out of range [0, 10]", "int: negative");
  is_int(hutch_json_int(o, "resources", "neg", -3, -1, &v, &err), 0, "int: negative range");
  is_int(v, -3, "int: negative value");
  hutch_err_clear(&err);
  expect_err(hutch_json_int(o, "resources", "real", 0, 10, &v, &err), &err,
             "field `resources.real`: expected an integer", "int: 5.0 is not an integer");
  hutch_err_clear(&err);
  expect_err(hutch_json_int(o, "resources", "str", 0, 10, &v, &err), &err,
             "field `resources.str`: expected an integer", "int: string");
  hutch_err_clear(&err);
  expect_err(hutch_json_int(o, "resources", "b", 0, 10, &v, &err), &err, "field `resources.b`: expected an integer",
             "int: bool");
  is_int(hutch_json_int(o, NULL, "big", INT64_MIN, INT64_MAX, &v, &err), 0, "int: INT64_MAX");
  ok(v == INT64_MAX, "int: INT64_MAX value");
  is_int(hutch_json_int(o, NULL, "small", INT64_MIN, INT64_MAX, &v, &err), 0, "int: INT64_MIN");
  ok(v == INT64_MIN, "int: INT64_MIN value");
  hutch_err_clear(&err);
  is_int(hutch_json_int(o, NULL, "big", 0, INT64_MAX - 1, &v, &err), -1, "int: INT64_MAX above a max one less");
  json_decref(o);

  /* Numbers too big for int64 are a parse error in jansson, not a wrap. */
  json_error_t je;
  json_t *huge = json_loads("{\"x\": 9223372036854775808}", 0, &je);
  ok(huge == NULL, "jansson refuses integers beyond int64 (no silent wrap)");
  json_decref(huge);
}

static void test_number(void) {
  json_t *o = load("{\"f\": 0.5, \"i\": 3, \"s\": \"1\", \"neg\": -0.25, \"exp\": 1e300}");
  hutch_err err = HUTCH_ERR_INIT;
  double d = 99;
  is_int(hutch_json_number(o, "r", "f", 0, 1, &d, &err), 0, "number: real in range");
  ok(d == 0.5, "number: 0.5");
  is_int(hutch_json_number(o, "r", "i", 0, 4, &d, &err), 0, "number: an integer is a number");
  ok(d == 3.0, "number: 3");
  d = 99;
  is_int(hutch_json_number(o, "r", "missing", 0, 1, &d, &err), 0, "number: absent");
  ok(d == 99, "number: absent leaves out untouched");
  expect_err(hutch_json_number(o, "resources", "s", 0, 4, &d, &err), &err, "field `resources.s`: expected a number",
             "number: string");
  hutch_err_clear(&err);
  expect_err(hutch_json_number(o, "resources", "f", 1, 4, &d, &err), &err,
             "field `resources.f`: 0.5 is out of range [1, 4]", "number: below min");
  hutch_err_clear(&err);
  is_int(hutch_json_number(o, "resources", "neg", 0, 4, &d, &err), -1, "number: negative below 0");
  ok(strstr(err.msg, "field `resources.neg`") != NULL, "number: names the field (%s)", err.msg);
  hutch_err_clear(&err);
  is_int(hutch_json_number(o, "resources", "exp", 0, 1e6, &d, &err), -1, "number: 1e300 above max");
  is_int(hutch_json_number(o, "resources", "f", 0.5, 0.5, &d, &err), 0, "number: inclusive bounds");
  json_decref(o);
}

static void test_bool(void) {
  json_t *o = load("{\"t\": true, \"f\": false, \"zero\": 0, \"s\": \"true\", \"null\": null}");
  hutch_err err = HUTCH_ERR_INIT;
  bool b = false;
  is_int(hutch_json_bool(o, "x", "t", &b, &err), 0, "bool: true");
  ok(b == true, "bool: true value");
  is_int(hutch_json_bool(o, "x", "f", &b, &err), 0, "bool: false");
  ok(b == false, "bool: false value");
  b = true;
  is_int(hutch_json_bool(o, "x", "null", &b, &err), 0, "bool: null");
  ok(b == true, "bool: null leaves out untouched");
  expect_err(hutch_json_bool(o, "x", "zero", &b, &err), &err, "field `x.zero`: expected true or false", "bool: 0");
  hutch_err_clear(&err);
  expect_err(hutch_json_bool(o, "x", "s", &b, &err), &err, "field `x.s`: expected true or false", "bool: \"true\"");
  json_decref(o);
}

static bool env_key_ok(const char *k) {
  if (!*k || isdigit((unsigned char)*k)) return false;
  for (const char *p = k; *p; p++)
    if (!isalnum((unsigned char)*p) && *p != '_') return false;
  return true;
}
#define ENV_RULE "must match [A-Za-z_][A-Za-z0-9_]*"

static void test_string_map(void) {
  hutch_err err = HUTCH_ERR_INIT;
  json_t *o = load("{\"env\": {\"A\": \"1\", \"B_2\": \"\"}, \"badkey\": {\"1X\": \"v\"}, \"notstr\": {\"A\": 1},"
                   " \"long\": {\"A\": \"abcd\"}, \"nul\": {\"A\": \"x\\u0000y\"}, \"arr\": [\"A\"],"
                   " \"three\": {\"A\": \"1\", \"B\": \"2\", \"C\": \"3\"}, \"null\": null, \"empty\": {}}");
  json_t *out = NULL;
  is_int(hutch_json_string_map(o, "", "env", 8, 16, env_key_ok, ENV_RULE, &out, &err), 0, "map: valid");
  ok(out == json_object_get(o, "env"), "map: out is the (borrowed) object");
  out = (json_t *)1;
  is_int(hutch_json_string_map(o, "", "missing", 8, 16, env_key_ok, ENV_RULE, &out, &err), 0, "map: absent");
  is_int(hutch_json_string_map(o, "", "null", 8, 16, env_key_ok, ENV_RULE, &out, &err), 0, "map: null");
  ok(out == (json_t *)1, "map: absent/null leave out untouched");
  expect_err(hutch_json_string_map(o, "", "badkey", 8, 16, env_key_ok, ENV_RULE, &out, &err), &err,
             "field `badkey`: key `1X` " ENV_RULE, "map: key rule");
  hutch_err_clear(&err);
  is_int(hutch_json_string_map(o, "", "badkey", 8, 16, NULL, NULL, &out, &err), 0, "map: no key rule, any key");
  expect_err(hutch_json_string_map(o, "spec", "notstr", 8, 16, env_key_ok, ENV_RULE, &out, &err), &err,
             "field `spec.notstr.A`: expected a string", "map: non-string value");
  hutch_err_clear(&err);
  expect_err(hutch_json_string_map(o, "spec", "long", 8, 3, env_key_ok, ENV_RULE, &out, &err), &err,
             "field `spec.long.A`: longer than 3 bytes", "map: value too long");
  hutch_err_clear(&err);
  is_int(hutch_json_string_map(o, "spec", "long", 8, 4, env_key_ok, ENV_RULE, &out, &err), 0,
         "map: value exactly max_len");
  expect_err(hutch_json_string_map(o, "spec", "nul", 8, 16, env_key_ok, ENV_RULE, &out, &err), &err,
             "field `spec.nul.A`: contains a NUL byte", "map: NUL in value");
  hutch_err_clear(&err);
  expect_err(hutch_json_string_map(o, "spec", "arr", 8, 16, env_key_ok, ENV_RULE, &out, &err), &err,
             "field `spec.arr`: expected an object of strings", "map: array instead of object");
  hutch_err_clear(&err);
  expect_err(hutch_json_string_map(o, "spec", "three", 2, 16, env_key_ok, ENV_RULE, &out, &err), &err,
             "field `spec.three`: more than 2 entries", "map: too many entries");
  hutch_err_clear(&err);
  is_int(hutch_json_string_map(o, "spec", "three", 3, 16, env_key_ok, ENV_RULE, &out, &err), 0,
         "map: exactly max_entries");
  is_int(hutch_json_string_map(o, "spec", "empty", 0, 16, env_key_ok, ENV_RULE, &out, &err), 0,
         "map: empty object with max_entries 0");
  json_decref(o);

  /* A long key is cut in the message, not overflowing it. */
  char key[400];
  memset(key, 'k', sizeof key - 1);
  key[0] = '9';
  key[sizeof key - 1] = 0;
  json_t *lk = json_pack("{s:{s:s}}", "labels", key, "v");
  hutch_err_clear(&err);
  is_int(hutch_json_string_map(lk, "", "labels", 8, 16, env_key_ok, ENV_RULE, &out, &err), -1, "map: long bad key");
  ok(strlen(err.msg) < 200, "map: long key shortened in the message (%zu bytes)", strlen(err.msg));
  json_decref(lk);
}

static void test_string_array(void) {
  hutch_err err = HUTCH_ERR_INIT;
  json_t *o = load("{\"cmd\": [\"ls\", \"-l\", \"\"], \"empty\": [], \"mixed\": [\"a\", 1], \"nul\": [\"a\\u0000\"],"
                   " \"obj\": {\"a\": \"b\"}, \"str\": \"ls\", \"null\": null}");
  const char **a = NULL;
  size_t n = 99;
  is_int(hutch_json_string_array(o, "", "cmd", 8, &a, &n, &err), 0, "array: valid");
  is_int(n, 3, "array: 3 items");
  ok(a && !strcmp(a[0], "ls") && !strcmp(a[1], "-l") && !strcmp(a[2], "") && a[3] == NULL,
     "array: items in order, NULL-terminated");
  free((void *)a);
  a = NULL;
  is_int(hutch_json_string_array(o, "", "empty", 8, &a, &n, &err), 0, "array: empty");
  ok(n == 0 && a && a[0] == NULL, "array: empty gives n 0 and a lone NULL");
  free((void *)a);
  a = (const char **)1;
  n = 99;
  is_int(hutch_json_string_array(o, "", "missing", 8, &a, &n, &err), 0, "array: absent");
  is_int(hutch_json_string_array(o, "", "null", 8, &a, &n, &err), 0, "array: null");
  ok(a == (const char **)1 && n == 99, "array: absent/null leave outputs untouched");
  expect_err(hutch_json_string_array(o, "exec", "mixed", 8, &a, &n, &err), &err,
             "field `exec.mixed[1]`: expected a string", "array: non-string item named by index");
  hutch_err_clear(&err);
  expect_err(hutch_json_string_array(o, "exec", "nul", 8, &a, &n, &err), &err,
             "field `exec.nul[0]`: contains a NUL byte", "array: NUL in an item");
  hutch_err_clear(&err);
  expect_err(hutch_json_string_array(o, "exec", "obj", 8, &a, &n, &err), &err,
             "field `exec.obj`: expected an array of strings", "array: object");
  hutch_err_clear(&err);
  expect_err(hutch_json_string_array(o, "exec", "str", 8, &a, &n, &err), &err,
             "field `exec.str`: expected an array of strings", "array: bare string");
  hutch_err_clear(&err);
  expect_err(hutch_json_string_array(o, "exec", "cmd", 2, &a, &n, &err), &err, "field `exec.cmd`: more than 2 items",
             "array: too many items");
  ok(a == (const char **)1 && n == 99, "array: failures leave outputs untouched (nothing to free)");
  hutch_err_clear(&err);
  a = NULL;
  is_int(hutch_json_string_array(o, "exec", "cmd", 3, &a, &n, &err), 0, "array: exactly max_items");
  free((void *)a);
  json_decref(o);
}

/* ---- lossy UTF-8 ---- */

#define FFFD "\xef\xbf\xbd"

static void lossy(const char *in, size_t n, const char *want, size_t wn, const char *what) {
  json_t *j = hutch_json_string_lossy(in, n);
  ok(j && json_is_string(j), "lossy %s: a JSON string", what);
  if (!j) return;
  size_t got = json_string_length(j);
  int same = got == wn && !memcmp(json_string_value(j), want, wn);
  ok(same, "lossy %s: bytes", what);
  if (!same) {
    printf("#   got %zu bytes:", got);
    for (size_t i = 0; i < got && i < 64; i++) printf(" %02x", (unsigned char)json_string_value(j)[i]);
    printf("\n");
  }
  /* json_stringn re-validates, and the text must serialise. */
  char *dump = json_dumps(j, JSON_ENCODE_ANY);
  ok(dump != NULL, "lossy %s: serialises", what);
  free(dump);
  json_decref(j);
}
#define LOSSY(in, want, what) lossy(in, sizeof(in) - 1, want, sizeof(want) - 1, what)

static void test_lossy(void) {
  LOSSY("", "", "empty");
  LOSSY("hello, world", "hello, world", "ASCII");
  LOSSY("caf\xc3\xa9", "caf\xc3\xa9", "2-byte (é)");
  LOSSY("\xe2\x82\xac", "\xe2\x82\xac", "3-byte (€)");
  LOSSY("\xf0\x9f\x98\x80", "\xf0\x9f\x98\x80", "4-byte (U+1F600)");
  LOSSY("\xf4\x8f\xbf\xbf", "\xf4\x8f\xbf\xbf", "U+10FFFF, the last code point");
  LOSSY("\xef\xbf\xbf", "\xef\xbf\xbf", "U+FFFF (a noncharacter, still valid UTF-8)");
  LOSSY("\xc2\x80", "\xc2\x80", "U+0080, shortest 2-byte");
  LOSSY("\xe0\xa0\x80", "\xe0\xa0\x80", "U+0800, shortest 3-byte");
  LOSSY("\xf0\x90\x80\x80", "\xf0\x90\x80\x80", "U+10000, shortest 4-byte");
  LOSSY("\xed\x9f\xbf", "\xed\x9f\xbf", "U+D7FF, just below the surrogates");
  LOSSY("\xee\x80\x80", "\xee\x80\x80", "U+E000, just above the surrogates");
  LOSSY("a\0b", "a\0b", "embedded NUL kept (valid input)");
  LOSSY("\0", "\0", "a lone NUL");

  LOSSY("\xff", FFFD, "0xFF");
  LOSSY("\xfe", FFFD, "0xFE");
  LOSSY("a\xffz", "a" FFFD "z", "0xFF between ASCII");
  LOSSY("\x80", FFFD, "lone continuation byte");
  LOSSY("\x80\xbf", FFFD FFFD, "two continuation bytes");
  LOSSY("\xc0\x80", FFFD FFFD, "overlong NUL (C0 80)");
  LOSSY("\xc1\xbf", FFFD FFFD, "overlong 2-byte (C1 BF)");
  LOSSY("\xe0\x80\x80", FFFD FFFD FFFD, "overlong 3-byte (E0 80 80)");
  LOSSY("\xe0\x9f\xbf", FFFD FFFD FFFD, "overlong 3-byte (E0 9F BF)");
  LOSSY("\xf0\x80\x80\x80", FFFD FFFD FFFD FFFD, "overlong 4-byte (F0 80 80 80)");
  LOSSY("\xf0\x8f\xbf\xbf", FFFD FFFD FFFD FFFD, "overlong 4-byte (F0 8F BF BF)");
  LOSSY("\xed\xa0\x80", FFFD FFFD FFFD, "high surrogate U+D800");
  LOSSY("\xed\xbf\xbf", FFFD FFFD FFFD, "low surrogate U+DFFF");
  LOSSY("\xed\xa0\xbd\xed\xb8\x80", FFFD FFFD FFFD FFFD FFFD FFFD, "CESU-8 surrogate pair");
  LOSSY("\xf4\x90\x80\x80", FFFD FFFD FFFD FFFD, "U+110000, beyond Unicode");
  LOSSY("\xf5\x80\x80\x80", FFFD FFFD FFFD FFFD, "F5 lead byte");
  LOSSY("\xf8\x88\x80\x80\x80", FFFD FFFD FFFD FFFD FFFD, "5-byte form");
  LOSSY("\xe2\x82", FFFD FFFD, "truncated 3-byte at the end");
  LOSSY("\xf0\x9f\x98", FFFD FFFD FFFD, "truncated 4-byte at the end");
  LOSSY("\xc3", FFFD, "truncated 2-byte at the end");
  LOSSY("\xe2\x82" "A", FFFD FFFD "A", "truncated 3-byte followed by ASCII");
  LOSSY("\xc3" "\xc3\xa9", FFFD "\xc3\xa9", "bad lead then a valid sequence resynchronises");
  LOSSY("\xff\0a", FFFD "\0a", "embedded NUL kept (invalid input)");
  LOSSY("ok\xf0\x9f\x98\x80\xff\xe2\x82\xac", "ok\xf0\x9f\x98\x80" FFFD "\xe2\x82\xac", "mixed valid and invalid");

  /* Worst case: every byte invalid, output 3x the input. */
  size_t n = 5000;
  char *in = xmalloc(n);
  memset(in, 0xff, n);
  json_t *j = hutch_json_string_lossy(in, n);
  ok(j && json_string_length(j) == 3 * n, "5000 invalid bytes become 15000 bytes of U+FFFD");
  int all = j != NULL;
  for (size_t i = 0; all && i < n; i++) all = !memcmp(json_string_value(j) + 3 * i, FFFD, 3);
  ok(all, "... every one U+FFFD");
  json_decref(j);
  free(in);

  /* Pseudo-random bytes always give valid UTF-8 (json_stringn would return
   * NULL otherwise) and never read past the input (ASan). */
  srand(7);
  int all_ok = 1;
  for (int round = 0; round < 2000; round++) {
    size_t len = (size_t)(rand() % 24);
    unsigned char *buf = xmalloc(len ? len : 1);
    for (size_t i = 0; i < len; i++) {
      int r = rand() % 8;
      buf[i] = r < 3 ? (unsigned char)(0x80 | (rand() & 0x3f)) : r < 6 ? (unsigned char)(0xc0 + rand() % 0x40)
                                                                        : (unsigned char)(rand() & 0xff);
    }
    json_t *x = hutch_json_string_lossy((const char *)buf, len);
    if (!x) all_ok = 0;
    json_decref(x);
    free(buf);
  }
  ok(all_ok, "2000 random byte strings all become valid JSON strings");
}

int main(void) {
  test_only();
  test_string();
  test_int();
  test_number();
  test_bool();
  test_string_map();
  test_string_array();
  test_lossy();
  return done_testing();
}
