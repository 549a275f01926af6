/* Validation helpers for untrusted JSON: every failure names the field
 * ("field `resources.memory_mib`: expected an integer"). */
#ifndef HUTCH_API_JSON_H
#define HUTCH_API_JSON_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* Reject members of `obj` not in the NULL-terminated `allowed` list. */
int hutch_json_only(json_t *obj, const char *prefix, const char *const *allowed, hutch_err *err);
/* Each getter leaves *out untouched when the member is absent or null. */
int hutch_json_string(json_t *obj, const char *prefix, const char *key, size_t maxlen, const char **out,
                      hutch_err *err);
int hutch_json_int(json_t *obj, const char *prefix, const char *key, int64_t min, int64_t max, int64_t *out,
                   hutch_err *err);
int hutch_json_number(json_t *obj, const char *prefix, const char *key, double min, double max, double *out,
                      hutch_err *err);
int hutch_json_bool(json_t *obj, const char *prefix, const char *key, bool *out, hutch_err *err);
/* An object of string values; keys checked by `key_ok` when given. */
int hutch_json_string_map(json_t *obj, const char *prefix, const char *key, size_t max_entries, size_t max_len,
                          bool (*key_ok)(const char *k), const char *key_rule, json_t **out, hutch_err *err);
/* An array of strings (at most max_items), NULL-terminated copy into *out
 * (an array of borrowed pointers the caller frees). */
int hutch_json_string_array(json_t *obj, const char *prefix, const char *key, size_t max_items, const char ***out,
                            size_t *n, hutch_err *err);

/* A JSON string from bytes that may not be UTF-8: invalid sequences become
 * U+FFFD. */
json_t *hutch_json_string_lossy(const char *p, size_t n);

#endif
