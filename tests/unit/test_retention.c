/* Tiered snapshot retention (src/lib/store/retention.c): the rules of
 * retention.h on hand-made cases, a brute-force reference on random ones,
 * and the JSON policy parser. */
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/util.h"
#include "store/retention.h"
#include "tap.h"

#define H 3600000ull
#define D 86400000ull
#define T0 (20000 * D) /* a UTC midnight */

static struct hutch_retention pol(uint32_t last, uint32_t hourly, uint32_t daily) {
  return (struct hutch_retention){last, hourly, daily};
}

/* "1,0,1": keep[] as a string. */
static char *kept(const bool *keep, size_t n) {
  static char s[256];
  size_t o = 0;
  for (size_t i = 0; i < n && o + 2 < sizeof s; i++) s[o++] = keep[i] ? '1' : '0';
  s[o] = 0;
  return s;
}

static const char *run(const uint64_t *t, size_t n, uint64_t now, struct hutch_retention p) {
  bool keep[64];
  memset(keep, 1, sizeof keep); /* select must write every entry */
  hutch_retention_select(t, n, now, &p, keep);
  return kept(keep, n);
}

/* Brute force: each rule straight from its definition. */
static bool newer(const uint64_t *t, size_t a, size_t b) { return t[a] > t[b] || (t[a] == t[b] && a > b); }

static void reference(const uint64_t *t, size_t n, uint64_t now, struct hutch_retention p, bool *keep) {
  for (size_t i = 0; i < n; i++) {
    keep[i] = t[i] > now;
    if (keep[i]) continue;
    /* keep_last: fewer than keep_last non-future snapshots are newer */
    size_t rank = 0;
    for (size_t j = 0; j < n; j++)
      if (j != i && t[j] <= now && newer(t, j, i)) rank++;
    if (rank < p.keep_last) keep[i] = true;
    uint64_t widths[2] = {H, D};
    uint32_t counts[2] = {p.hourly, p.daily};
    for (int r = 0; r < 2; r++) {
      uint64_t b = t[i] / widths[r];
      bool newest = true;
      for (size_t j = 0; j < n && newest; j++)
        if (j != i && t[j] <= now && t[j] / widths[r] == b && newer(t, j, i)) newest = false;
      if (!newest) continue;
      /* distinct buckets newer than b among non-future snapshots */
      size_t nb = 0;
      uint64_t *seen = xcalloc(n, sizeof *seen);
      for (size_t j = 0; j < n; j++) {
        if (t[j] > now) continue;
        uint64_t bj = t[j] / widths[r];
        if (bj <= b) continue;
        bool dup = false;
        for (size_t k = 0; k < nb && !dup; k++) dup = seen[k] == bj;
        if (!dup) seen[nb++] = bj;
      }
      free(seen);
      if (nb < counts[r]) keep[i] = true;
    }
  }
}

static uint64_t rng = 88172645463325252ull;
static uint64_t rnd(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static void test_select(void) {
  uint64_t now = T0 + 12 * H;
  struct hutch_retention p;

  p = pol(3, 0, 0);
  hutch_retention_select(NULL, 0, now, &p, NULL);
  ok(1, "n = 0 is a no-op");

  uint64_t a[] = {T0 + 1 * H, T0 + 5 * H, T0 + 3 * H, T0 + 2 * H, T0 + 4 * H};
  is_str(run(a, 5, now, pol(2, 0, 0)), "01001", "keep_last 2 keeps the two newest, input unordered");
  is_str(run(a, 5, now, pol(0, 0, 0)), "00000", "the zero policy keeps nothing");
  is_str(run(a, 5, now, pol(99, 0, 0)), "11111", "keep_last over n keeps all");
  is_str(run(a, 5, now, pol(10000, 10000, 10000)), "11111", "the largest policy keeps all");

  /* The example of retention.h: 10:50, 10:20, 09:40, keep_last 1, hourly 2. */
  uint64_t ex[] = {T0 + 10 * H + 50 * 60000, T0 + 10 * H + 20 * 60000, T0 + 9 * H + 40 * 60000};
  is_str(run(ex, 3, now, pol(1, 2, 0)), "101", "rules count independently (the header's example)");
  is_str(run(ex, 3, now, pol(0, 1, 0)), "100", "hourly 1: the newest of the latest hour");
  is_str(run(ex, 3, now, pol(0, 5, 0)), "101", "hourly 5 with two hours present keeps one per hour");
  is_str(run(ex, 3, now, pol(2, 0, 0)), "110", "keep_last 2");
  is_str(run(ex, 3, now, pol(0, 0, 1)), "100", "daily 1: the newest of the day");

  /* Day boundaries: 23:59:59.999 and 00:00:00.000 are different hours and days. */
  uint64_t db[] = {T0 - 1, T0, T0 + 30 * 60000, T0 - 2 * H, T0 - D - H, T0 - 3 * D};
  now = T0 + D;
  is_str(run(db, 6, now, pol(0, 2, 0)), "101000", "hourly 2 across midnight: 00:30 and 23:59:59.999");
  is_str(run(db, 6, now, pol(0, 3, 0)), "101100", "hourly 3 reaches 22:00 of the day before");
  is_str(run(db, 6, now, pol(0, 0, 2)), "101000", "daily 2: newest of today and of yesterday");
  is_str(run(db, 6, now, pol(0, 0, 3)), "101010", "daily 3: the newest of each of three days");
  is_str(run(db, 6, now, pol(0, 0, 4)), "101011", "daily 4: one per day, four days");
  is_str(run(db, 6, now, pol(1, 1, 2)), "101000", "keep_last 1, hourly 1, daily 2 overlap");
  is_str(run(db, 6, now, pol(0, 10, 10)), "101111", "every distinct hour and day; 00:00 is not its hour's newest");

  /* Future snapshots are kept and use up no count. */
  now = T0 + 10 * H;
  uint64_t fu[] = {T0 + 11 * H, T0 + 10 * H, T0 + 9 * H, T0 + 10 * H + 1};
  is_str(run(fu, 4, now, pol(0, 0, 0)), "1001", "future snapshots are kept by the zero policy");
  is_str(run(fu, 4, now, pol(1, 0, 0)), "1101", "keep_last 1 still keeps the newest past one (now itself is past)");
  is_str(run(fu, 4, now, pol(0, 2, 0)), "1111", "hourly 2 counts past hours only");

  /* Equal times: the later entry counts as newer. */
  uint64_t eq[] = {T0, T0, T0};
  is_str(run(eq, 3, T0, pol(1, 0, 0)), "001", "equal times: keep_last takes the last index");
  is_str(run(eq, 3, T0, pol(0, 1, 1)), "001", "equal times: one per bucket");
  is_str(run(eq, 3, T0, pol(2, 0, 0)), "011", "equal times: keep_last 2");

  /* Random cases against the brute-force reference. */
  int mismatches = 0;
  for (int round = 0; round < 300; round++) {
    size_t n = 1 + rnd() % 60;
    uint64_t t[64];
    uint64_t span = (rnd() % 3 == 0) ? 6 * H : 20 * D;
    uint64_t base = T0 - span;
    for (size_t i = 0; i < n; i++) t[i] = base + rnd() % (span + 2 * H);
    if (round % 5 == 0) t[rnd() % n] = t[rnd() % n]; /* a tie */
    struct hutch_retention q = pol(rnd() % 5, rnd() % 8, rnd() % 8);
    if (round % 7 == 0) q = pol(0, 0, 0);
    bool got[64], want[64];
    hutch_retention_select(t, n, T0, &q, got);
    reference(t, n, T0, q, want);
    if (memcmp(got, want, n * sizeof *got) != 0) {
      if (mismatches++ < 3) {
        printf("# round %d: policy %u/%u/%u\n", round, q.keep_last, q.hourly, q.daily);
        printf("#   got  %s\n", kept(got, n));
        printf("#   want %s\n", kept(want, n));
      }
    }
  }
  is_int(mismatches, 0, "300 random cases agree with the brute-force reference");

  /* 100000 snapshots, one a minute: hourly 24, daily 7, last 5. */
  size_t big = 100000;
  uint64_t *t = xmalloc(big * sizeof *t);
  bool *keep = xmalloc(big * sizeof *keep);
  for (size_t i = 0; i < big; i++) t[i] = T0 + (uint64_t)((i * 7919) % big) * 60000; /* a permutation */
  uint64_t end = T0 + (big - 1) * 60000;
  struct hutch_retention q = pol(5, 24, 7);
  uint64_t t1 = mono_us();
  hutch_retention_select(t, big, end, &q, keep);
  uint64_t t2 = mono_us();
  size_t nk = 0;
  for (size_t i = 0; i < big; i++) nk += keep[i];
  /* 5 newest (in the current hour), 24 hour-newest (one of them the overall
   * newest), 7 day-newest (the newest again) -> 5 + 23 + 6, unless a
   * day's newest is also an hour's newest: days end at 23:59 which is the
   * newest of hour 23 -- within the last 24 hours only for yesterday. */
  is_int(nk, 5 + 23 + 6 - 1, "100000 snapshots: %zu kept", nk);
  ok(t2 - t1 < 2000000, "100000 snapshots in %llu us", (unsigned long long)(t2 - t1));
  free(t);
  free(keep);
}

static void test_parse(void) {
  hutch_err err = HUTCH_ERR_INIT;
  struct hutch_retention r = pol(5, 24, 7);
  json_t *o = json_loads("{}", 0, NULL);
  ok(hutch_retention_parse(o, &r, &err) == 0 && r.keep_last == 5 && r.hourly == 24 && r.daily == 7,
     "{} keeps the defaults");
  json_decref(o);

  o = json_loads("{\"hourly\":0}", 0, NULL);
  ok(hutch_retention_parse(o, &r, &err) == 0 && r.keep_last == 5 && r.hourly == 0 && r.daily == 7,
     "one key changes only that field");
  json_decref(o);

  r = pol(5, 24, 7);
  o = json_loads("{\"keep_last\":10000,\"hourly\":0,\"daily\":1,\"daily\":null}", 0, NULL);
  ok(hutch_retention_parse(o, &r, &err) == 0 && r.keep_last == 10000 && r.hourly == 0,
     "all keys, 10000 and 0 accepted");
  json_decref(o);

  r = pol(5, 24, 7);
  o = json_loads("{\"daily\":null}", 0, NULL);
  ok(hutch_retention_parse(o, &r, &err) == 0 && r.daily == 7, "null keeps the default");
  json_decref(o);

  struct {
    const char *json, *want;
  } bad[] = {
      {"{\"keep_last\":-1}", "field `keep_last`: must be between 0 and 10000"},
      {"{\"hourly\":10001}", "field `hourly`: must be between 0 and 10000"},
      {"{\"daily\":9223372036854775807}", "field `daily`: must be between"},
      {"{\"weekly\":1}", "field `weekly`: unknown field"},
      {"{\"hourly\":1,\"keep-last\":2}", "`keep-last`"},
      {"{\"keep_last\":\"3\"}", "field `keep_last`: expected an integer"},
      {"{\"hourly\":1.5}", "field `hourly`: expected an integer"},
      {"{\"daily\":1.0}", "field `daily`: expected an integer"},
      {"{\"daily\":true}", "field `daily`: expected an integer"},
      {"{\"daily\":[1]}", "expected an integer"},
      {"[1,2,3]", "expected an object"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    r = pol(5, 24, 7);
    hutch_err_clear(&err);
    o = json_loads(bad[i].json, JSON_DECODE_ANY, NULL);
    int rc = hutch_retention_parse(o, &r, &err);
    ok(rc < 0 && err.status == 400 && strcmp(err.code, "invalid_argument") == 0 && strstr(err.msg, bad[i].want) &&
           r.keep_last == 5 && r.hourly == 24 && r.daily == 7,
       "%s rejected, policy untouched: %s", bad[i].json, err.msg);
    json_decref(o);
  }
  hutch_err_clear(&err);
  ok(hutch_retention_parse(NULL, &r, &err) < 0 && err.status == 400, "NULL rejected");

  /* partial update is all-or-nothing */
  r = pol(5, 24, 7);
  o = json_loads("{\"keep_last\":1,\"hourly\":-3}", 0, NULL);
  ok(hutch_retention_parse(o, &r, &err) < 0 && r.keep_last == 5, "a bad field leaves the good ones unapplied");
  json_decref(o);

  r = pol(3, 0, 10000);
  json_t *j = hutch_retention_to_json(&r);
  char *s = json_dumps(j, JSON_SORT_KEYS | JSON_COMPACT);
  is_str(s, "{\"daily\":10000,\"hourly\":0,\"keep_last\":3}", "to_json");
  struct hutch_retention back = pol(9, 9, 9);
  ok(hutch_retention_parse(j, &back, &err) == 0 && memcmp(&back, &r, sizeof r) == 0, "to_json round-trips");
  free(s);
  json_decref(j);
}

int main(void) {
  test_select();
  test_parse();
  return done_testing();
}
