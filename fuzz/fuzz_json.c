/* libFuzzer entry point for the JSON validation helpers, the lossy UTF-8
 * constructor and the sandbox spec parser (not built by default).  Build:
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -std=gnu11 -D_GNU_SOURCE \
 *     -Isrc/lib fuzz/fuzz_json.c src/lib/api/json.c src/lib/runtime/spec.c \
 *     src/lib/common/err.c src/lib/common/util.c -ljansson -o build/fuzz_json
 *   ./build/fuzz_json corpus/
 */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/json.h"
#include "common/util.h"
#include "runtime/runtime.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool key_ok(const char *k) { return *k && strlen(k) < 64; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* Arbitrary bytes must always become a valid JSON string. */
  json_t *s = hutch_json_string_lossy((const char *)data, size);
  if (!s) abort();
  if (json_string_length(s) < size || json_string_length(s) > 3 * size) abort();
  char *dump = json_dumps(s, JSON_ENCODE_ANY);
  if (!dump) abort();
  free(dump);
  json_decref(s);

  /* As a request body: run every validator over every member. */
  json_t *o = json_loadb((const char *)data, size, JSON_ALLOW_NUL, NULL);
  if (o && json_is_object(o)) {
    static const char *const allowed[] = {"template", "runtime", "resources", "env", "labels", "timeout_s", NULL};
    hutch_err err = HUTCH_ERR_INIT;
    (void)hutch_json_only(o, "", allowed, &err);
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
      const char *str = NULL;
      int64_t i = 0;
      double d = 0;
      bool b = false;
      json_t *map = NULL;
      const char **arr = NULL;
      size_t n = 0;
      hutch_err_clear(&err);
      if (hutch_json_string(o, "req", k, 4096, &str, &err) == 0 && str) (void)strlen(str);
      (void)hutch_json_int(o, "req", k, -1000, 1000, &i, &err);
      (void)hutch_json_number(o, "req", k, 0, 64, &d, &err);
      (void)hutch_json_bool(o, "req", k, &b, &err);
      (void)hutch_json_string_map(o, "req", k, 16, 256, key_ok, "is bad", &map, &err);
      if (hutch_json_string_array(o, "req", k, 16, &arr, &n, &err) == 0 && arr) {
        if (arr[n] != NULL) abort();
        free((void *)arr);
      }
      if (json_is_object(v)) (void)hutch_json_only(v, k, allowed, &err);
    }
  }
  json_decref(o);

  /* As a sandbox spec (NUL-terminated text). */
  char *text = xmalloc(size + 1);
  memcpy(text, data, size);
  text[size] = 0;
  struct hutch_sandbox_spec spec;
  hutch_err err = HUTCH_ERR_INIT;
  if (hutch_spec_from_json(text, &spec, &err) == 0) {
    char *again = hutch_spec_to_json(&spec);
    if (!again) abort();
    free(again);
    hutch_spec_free(&spec);
  }
  free(text);
  return 0;
}
