#include "api/json.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/util.h"

static void field_name(char *out, size_t n, const char *prefix, const char *key) {
  if (prefix && *prefix) snprintf(out, n, "%s.%s", prefix, key);
  else snprintf(out, n, "%s", key);
}

int hutch_json_only(json_t *obj, const char *prefix, const char *const *allowed, hutch_err *err) {
  const char *k;
  json_t *v;
  json_object_foreach(obj, k, v) {
    bool ok = false;
    for (size_t i = 0; allowed[i]; i++)
      if (!strcmp(k, allowed[i])) ok = true;
    if (!ok) {
      char f[256];
      field_name(f, sizeof f, prefix, k);
      return hutch_err_invalid(err, "field `%s`: unknown field", f);
    }
  }
  return 0;
}

int hutch_json_string(json_t *obj, const char *prefix, const char *key, size_t maxlen, const char **out,
                      hutch_err *err) {
  json_t *v = json_object_get(obj, key);
  if (!v || json_is_null(v)) return 0;
  char f[256];
  field_name(f, sizeof f, prefix, key);
  if (!json_is_string(v)) return hutch_err_invalid(err, "field `%s`: expected a string", f);
  if (json_string_length(v) > maxlen) return hutch_err_invalid(err, "field `%s`: longer than %zu bytes", f, maxlen);
  if (strlen(json_string_value(v)) != json_string_length(v))
    return hutch_err_invalid(err, "field `%s`: contains a NUL byte", f);
  *out = json_string_value(v);
  return 0;
}

int hutch_json_int(json_t *obj, const char *prefix, const char *key, int64_t min, int64_t max, int64_t *out,
                   hutch_err *err) {
  json_t *v = json_object_get(obj, key);
  if (!v || json_is_null(v)) return 0;
  char f[256];
  field_name(f, sizeof f, prefix, key);
  if (!json_is_integer(v)) return hutch_err_invalid(err, "field `%s`: expected an integer", f);
  json_int_t i = json_integer_value(v);
  if (i < min || i > max)
    return hutch_err_invalid(err, "field `%s`: %lld is out of range [%lld, %lld]", f, (long long)i, (long long)min,
                             (long long)max);
  *out = i;
  return 0;
}

int hutch_json_number(json_t *obj, const char *prefix, const char *key, double min, double max, double *out,
                      hutch_err *err) {
  json_t *v = json_object_get(obj, key);
  if (!v || json_is_null(v)) return 0;
  char f[256];
  field_name(f, sizeof f, prefix, key);
  if (!json_is_number(v)) return hutch_err_invalid(err, "field `%s`: expected a number", f);
  double d = json_number_value(v);
  if (!isfinite(d) || d < min || d > max)
    return hutch_err_invalid(err, "field `%s`: %g is out of range [%g, %g]", f, d, min, max);
  *out = d;
  return 0;
}

int hutch_json_bool(json_t *obj, const char *prefix, const char *key, bool *out, hutch_err *err) {
  json_t *v = json_object_get(obj, key);
  if (!v || json_is_null(v)) return 0;
  char f[256];
  field_name(f, sizeof f, prefix, key);
  if (!json_is_boolean(v)) return hutch_err_invalid(err, "field `%s`: expected true or false", f);
  *out = json_is_true(v);
  return 0;
}

int hutch_json_string_map(json_t *obj, const char *prefix, const char *key, size_t max_entries, size_t max_len,
                          bool (*key_ok)(const char *k), const char *key_rule, json_t **out, hutch_err *err) {
  json_t *v = json_object_get(obj, key);
  if (!v || json_is_null(v)) return 0;
  char f[256];
  field_name(f, sizeof f, prefix, key);
  if (!json_is_object(v)) return hutch_err_invalid(err, "field `%s`: expected an object of strings", f);
  if (json_object_size(v) > max_entries) return hutch_err_invalid(err, "field `%s`: more than %zu entries", f, max_entries);
  const char *k;
  json_t *e;
  json_object_foreach(v, k, e) {
    if (key_ok && !key_ok(k)) return hutch_err_invalid(err, "field `%s`: key `%.64s` %s", f, k, key_rule);
    if (!json_is_string(e)) return hutch_err_invalid(err, "field `%s.%.64s`: expected a string", f, k);
    if (json_string_length(e) > max_len)
      return hutch_err_invalid(err, "field `%s.%.64s`: longer than %zu bytes", f, k, max_len);
    if (strlen(json_string_value(e)) != json_string_length(e))
      return hutch_err_invalid(err, "field `%s.%.64s`: contains a NUL byte", f, k);
  }
  *out = v;
  return 0;
}

int hutch_json_string_array(json_t *obj, const char *prefix, const char *key, size_t max_items, const char ***out,
                            size_t *n, hutch_err *err) {
  json_t *v = json_object_get(obj, key);
  if (!v || json_is_null(v)) return 0;
  char f[256];
  field_name(f, sizeof f, prefix, key);
  if (!json_is_array(v)) return hutch_err_invalid(err, "field `%s`: expected an array of strings", f);
  size_t len = json_array_size(v);
  if (len > max_items) return hutch_err_invalid(err, "field `%s`: more than %zu items", f, max_items);
  for (size_t i = 0; i < len; i++) {
    json_t *e = json_array_get(v, i);
    if (!json_is_string(e)) return hutch_err_invalid(err, "field `%s[%zu]`: expected a string", f, i);
    if (strlen(json_string_value(e)) != json_string_length(e))
      return hutch_err_invalid(err, "field `%s[%zu]`: contains a NUL byte", f, i);
  }
  const char **a = xcalloc(len + 1, sizeof *a);
  for (size_t i = 0; i < len; i++) a[i] = json_string_value(json_array_get(v, i));
  *out = a;
  *n = len;
  return 0;
}

/* Length of a valid UTF-8 sequence at p (1..4), or 0 if invalid. */
static size_t utf8_seq(const unsigned char *p, size_t left) {
  unsigned char c = p[0];
  if (c < 0x80) return 1;
  size_t n;
  unsigned int cp;
  if ((c & 0xe0) == 0xc0) n = 2, cp = c & 0x1f;
  else if ((c & 0xf0) == 0xe0) n = 3, cp = c & 0x0f;
  else if ((c & 0xf8) == 0xf0) n = 4, cp = c & 0x07;
  else return 0;
  if (left < n) return 0;
  for (size_t i = 1; i < n; i++) {
    if ((p[i] & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (p[i] & 0x3f);
  }
  if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10ffff ||
      (cp >= 0xd800 && cp <= 0xdfff))
    return 0;
  return n;
}

json_t *hutch_json_string_lossy(const char *s, size_t n) {
  const unsigned char *p = (const unsigned char *)s;
  size_t i = 0;
  while (i < n) {
    size_t l = utf8_seq(p + i, n - i);
    if (!l) break;
    i += l;
  }
  if (i == n) return json_stringn(s, n);
  /* Worst case every byte becomes 3 bytes of U+FFFD. */
  char *out = xmalloc(n * 3 + 1);
  size_t o = 0;
  i = 0;
  while (i < n) {
    size_t l = utf8_seq(p + i, n - i);
    if (l) {
      memcpy(out + o, p + i, l);
      o += l;
      i += l;
    } else {
      memcpy(out + o, "\xef\xbf\xbd", 3);
      o += 3;
      i++;
    }
  }
  json_t *j = json_stringn(out, o);
  free(out);
  return j;
}
