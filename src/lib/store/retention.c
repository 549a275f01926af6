/* Tiered snapshot retention (semantics in retention.h). */
#include "store/retention.h"

#include <stdlib.h>
#include <string.h>

#include "common/util.h"

#define HOUR_MS 3600000ull
#define DAY_MS 86400000ull

struct item {
  uint64_t ms;
  size_t idx;
};

/* Newest first; equal times: larger index first. */
static int cmp_newest(const void *a, const void *b) {
  const struct item *x = a, *y = b;
  if (x->ms != y->ms) return x->ms > y->ms ? -1 : 1;
  if (x->idx != y->idx) return x->idx > y->idx ? -1 : 1;
  return 0;
}

/* One bucket rule: the newest snapshot of each of the `count` most recent
 * buckets. */
static void keep_buckets(const struct item *v, size_t m, uint64_t width, uint32_t count, bool *keep) {
  uint32_t used = 0;
  bool have = false;
  uint64_t last = 0;
  for (size_t i = 0; i < m && used < count; i++) {
    uint64_t b = v[i].ms / width;
    if (have && b == last) continue;
    have = true;
    last = b;
    keep[v[i].idx] = true;
    used++;
  }
}

void hutch_retention_select(const uint64_t *created_ms, size_t n, uint64_t now_ms, const struct hutch_retention *p,
                            bool *keep) {
  if (n == 0) return;
  memset(keep, 0, n * sizeof *keep);
  struct item *v = xcalloc(n, sizeof *v);
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    if (created_ms[i] > now_ms)
      keep[i] = true;
    else
      v[m++] = (struct item){created_ms[i], i};
  }
  qsort(v, m, sizeof *v, cmp_newest);
  for (size_t i = 0; i < m && i < p->keep_last; i++) keep[v[i].idx] = true;
  keep_buckets(v, m, HOUR_MS, p->hourly, keep);
  keep_buckets(v, m, DAY_MS, p->daily, keep);
  free(v);
}

static const char *const fields[] = {"keep_last", "hourly", "daily"};

int hutch_retention_parse(json_t *obj, struct hutch_retention *out, hutch_err *err) {
  if (!json_is_object(obj)) return hutch_err_invalid(err, "retention: expected an object");
  uint32_t vals[3] = {out->keep_last, out->hourly, out->daily};
  const char *k;
  json_t *v;
  json_object_foreach(obj, k, v) {
    size_t f = 0;
    while (f < 3 && strcmp(k, fields[f]) != 0) f++;
    if (f == 3) return hutch_err_invalid(err, "field `%.64s`: unknown field", k);
    if (json_is_null(v)) continue;
    if (!json_is_integer(v)) return hutch_err_invalid(err, "field `%s`: expected an integer", fields[f]);
    json_int_t x = json_integer_value(v);
    if (x < 0 || x > HUTCH_RETENTION_MAX)
      return hutch_err_invalid(err, "field `%s`: must be between 0 and %d", fields[f], HUTCH_RETENTION_MAX);
    vals[f] = (uint32_t)x;
  }
  out->keep_last = vals[0];
  out->hourly = vals[1];
  out->daily = vals[2];
  return 0;
}

json_t *hutch_retention_to_json(const struct hutch_retention *p) {
  return json_pack("{s:I,s:I,s:I}", "keep_last", (json_int_t)p->keep_last, "hourly", (json_int_t)p->hourly, "daily",
                   (json_int_t)p->daily);
}
