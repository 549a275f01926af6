/* The in-process event bus (src/lib/lifecycle/events.c): order, filters,
 * the bounded queue that drops the oldest and reports the count, the
 * subscriber limit, waking a blocked reader, hutchd's own events on the
 * global bus, and publishers and readers on several threads at once. */
#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "lifecycle/events.h"
#include "tap.h"

static json_t *data_of(const struct hutch_event *e) {
  json_error_t je;
  return json_loadb(e->data, e->data_len, 0, &je);
}

static void test_order_and_filter(void) {
  struct hutch_events *b = hutch_events_new(16, 4);
  hutch_err err = HUTCH_ERR_INIT;
  struct hutch_events_sub *all = hutch_events_subscribe(b, NULL, &err);
  struct hutch_events_sub *one = hutch_events_subscribe(b, "sb_a", &err);
  ok(all && one, "two subscribers");
  is_int(hutch_events_subscribers(b), 2, "the bus counts them");
  hutch_events_publish(b, "x", "sb_a", "{\"n\":1}");
  hutch_events_publish(b, "x", "sb_b", "{\"n\":2}");
  hutch_events_publish(b, "y", NULL, "{\"n\":3}");
  hutch_events_publish(b, "x", "sb_a", "{\"n\":4}");
  struct hutch_event *e;
  uint64_t dropped;
  int got[8], n = 0;
  while (n < 8 && hutch_events_next(all, 0, &e, &dropped) == 1) {
    json_t *d = data_of(e);
    got[n++] = (int)json_integer_value(json_object_get(d, "n"));
    json_decref(d);
    hutch_event_unref(e);
  }
  is_int(n, 4, "the unfiltered subscriber gets every event");
  ok(n == 4 && got[0] == 1 && got[1] == 2 && got[2] == 3 && got[3] == 4, "in publication order");
  n = 0;
  uint64_t last_seq = 0;
  bool increasing = true;
  while (n < 8 && hutch_events_next(one, 0, &e, &dropped) == 1) {
    json_t *d = data_of(e);
    got[n++] = (int)json_integer_value(json_object_get(d, "n"));
    if (e->seq <= last_seq) increasing = false;
    last_seq = e->seq;
    is_str(e->sandbox, "sb_a", "filtered event %d is sb_a's", n);
    json_decref(d);
    hutch_event_unref(e);
  }
  is_int(n, 2, "the filtered subscriber gets only its sandbox's events");
  ok(increasing, "sequence numbers increase");
  is_int(hutch_events_next(one, 0, &e, &dropped), 0, "then nothing");
  ok(e == NULL && dropped == 0, "no event, no drops");
  hutch_events_unsubscribe(all);
  hutch_events_unsubscribe(one);
  is_int(hutch_events_subscribers(b), 0, "unsubscribed");
  hutch_events_free(b);
}

static void test_drop_oldest(void) {
  struct hutch_events *b = hutch_events_new(8, 4);
  hutch_err err = HUTCH_ERR_INIT;
  struct hutch_events_sub *s = hutch_events_subscribe(b, NULL, &err);
  struct hutch_events_sub *fast = hutch_events_subscribe(b, NULL, &err);
  char data[32];
  int fast_got = 0;
  for (int i = 1; i <= 20; i++) {
    snprintf(data, sizeof data, "{\"n\":%d}", i);
    hutch_events_publish(b, "x", "sb", data);
    struct hutch_event *e;
    uint64_t d;
    /* A reader that keeps up loses nothing while the other overflows. */
    while (hutch_events_next(fast, 0, &e, &d) == 1) {
      fast_got++;
      hutch_event_unref(e);
    }
  }
  is_int(fast_got, 20, "a subscriber that keeps up gets all 20");
  struct hutch_event *e;
  uint64_t dropped = 0;
  is_int(hutch_events_next(s, 0, &e, &dropped), 0, "the slow subscriber first learns of drops");
  is_int(dropped, 12, "12 of 20 dropped with a queue of 8");
  int first = -1, count = 0;
  while (hutch_events_next(s, 0, &e, &dropped) == 1) {
    json_t *d = data_of(e);
    if (first < 0) first = (int)json_integer_value(json_object_get(d, "n"));
    json_decref(d);
    hutch_event_unref(e);
    count++;
  }
  is_int(first, 13, "the oldest were dropped: the first kept is #13");
  is_int(count, 8, "the newest 8 are kept");
  is_int(dropped, 0, "drops are reported once");
  /* Events still queued are released with the subscriber (ASan checks). */
  hutch_events_publish(b, "x", "sb", "{}");
  hutch_events_publish(b, "x", "sb", "{}");
  hutch_events_unsubscribe(s);
  hutch_events_unsubscribe(fast);
  hutch_events_free(b);
}

static void test_limit(void) {
  struct hutch_events *b = hutch_events_new(4, 2);
  hutch_err err = HUTCH_ERR_INIT;
  struct hutch_events_sub *a = hutch_events_subscribe(b, NULL, &err);
  struct hutch_events_sub *c = hutch_events_subscribe(b, NULL, &err);
  struct hutch_events_sub *d = hutch_events_subscribe(b, NULL, &err);
  ok(a && c && !d, "a third subscriber is refused at a limit of 2");
  is_int(err.status, 503, "with 503");
  hutch_events_unsubscribe(a);
  hutch_err_clear(&err);
  d = hutch_events_subscribe(b, NULL, &err);
  ok(d != NULL, "a slot that frees up can be taken again");
  hutch_events_unsubscribe(c);
  hutch_events_unsubscribe(d);
  hutch_events_free(b);
}

struct waker {
  struct hutch_events *b;
  unsigned delay_ms;
};

static void *publish_later(void *arg) {
  struct waker *w = arg;
  struct timespec ts = {0, (long)w->delay_ms * 1000000L};
  nanosleep(&ts, NULL);
  hutch_events_publish(w->b, "x", "sb", "{\"late\":true}");
  return NULL;
}

static void test_wait(void) {
  struct hutch_events *b = hutch_events_new(4, 4);
  hutch_err err = HUTCH_ERR_INIT;
  struct hutch_events_sub *s = hutch_events_subscribe(b, NULL, &err);
  struct hutch_event *e;
  uint64_t dropped;
  uint64_t t0 = mono_us();
  is_int(hutch_events_next(s, 100, &e, &dropped), 0, "nothing published: times out");
  uint64_t waited = mono_us() - t0;
  ok(waited >= 90000 && waited < 2000000, "after about the timeout (%llu us)", (unsigned long long)waited);
  pthread_t th;
  struct waker w = {b, 50};
  pthread_create(&th, NULL, publish_later, &w);
  t0 = mono_us();
  int r = hutch_events_next(s, 5000, &e, &dropped);
  waited = mono_us() - t0;
  is_int(r, 1, "a blocked reader is woken by a publication");
  ok(waited < 2000000, "at once, not at the timeout (%llu us)", (unsigned long long)waited);
  if (r == 1) hutch_event_unref(e);
  pthread_join(th, NULL);
  hutch_events_unsubscribe(s);
  hutch_events_free(b);
}

static void test_global(void) {
  hutch_err err = HUTCH_ERR_INIT;
  struct hutch_events *g = hutch_events_global();
  struct hutch_events_sub *s = hutch_events_subscribe(g, NULL, &err);
  struct hutch_events_sub *f = hutch_events_subscribe(g, "sb_other", &err);
  hutch_events_publish_state("sb_1", "running", "creating");
  hutch_events_publish_state("sb_1", "deleting", "deleting"); /* not a change */
  hutch_events_publish_state("sb_1", "creating", NULL);
  hutch_err fail = HUTCH_ERR_INIT;
  hutch_err_set(&fail, 503, "unavailable", "no uid range left");
  hutch_events_publish_op("op_1", "create", "sb_1", "failed", &fail);
  hutch_events_publish_op("op_2", "delete", "sb_1", "succeeded", NULL);
  hutch_events_publish_op("op_3", "delete", "sb_1", "succeeded", NULL);
  struct hutch_event *e;
  uint64_t dropped;
  ok(hutch_events_next(s, 0, &e, &dropped) == 1, "a state event");
  is_str(e->name, "sandbox.state", "named sandbox.state");
  json_t *d = data_of(e);
  is_str(json_string_value(json_object_get(d, "sandbox")), "sb_1", "sandbox");
  is_str(json_string_value(json_object_get(d, "state")), "running", "state");
  is_str(json_string_value(json_object_get(d, "previous")), "creating", "previous");
  const char *at = json_string_value(json_object_get(d, "at"));
  ok(at && strlen(at) == 24 && at[23] == 'Z', "at is RFC 3339 with milliseconds (%s)", at ? at : "null");
  json_decref(d);
  hutch_event_unref(e);
  ok(hutch_events_next(s, 0, &e, &dropped) == 1, "the same state twice was not published");
  d = data_of(e);
  is_str(json_string_value(json_object_get(d, "state")), "creating", "next is the creating event");
  ok(json_is_null(json_object_get(d, "previous")), "an unknown previous state is null");
  json_decref(d);
  hutch_event_unref(e);
  ok(hutch_events_next(s, 0, &e, &dropped) == 1, "an operation event");
  is_str(e->name, "operation.finished", "named operation.finished");
  d = data_of(e);
  is_str(json_string_value(json_object_get(d, "operation")), "op_1", "operation");
  is_str(json_string_value(json_object_get(d, "kind")), "create", "kind");
  is_str(json_string_value(json_object_get(d, "state")), "failed", "state");
  json_t *er = json_object_get(d, "error");
  is_str(json_string_value(json_object_get(er, "code")), "unavailable", "error code");
  is_str(json_string_value(json_object_get(er, "message")), "no uid range left", "error message");
  is_int(json_integer_value(json_object_get(er, "status")), 503, "error status");
  json_decref(d);
  hutch_event_unref(e);
  ok(hutch_events_next(s, 0, &e, &dropped) == 1, "a successful operation");
  d = data_of(e);
  ok(json_is_null(json_object_get(d, "error")), "has a null error");
  json_decref(d);
  hutch_event_unref(e);
  ok(hutch_events_next(s, 0, &e, &dropped) == 1, "the last operation");
  hutch_event_unref(e);
  is_int(hutch_events_next(f, 0, &e, &dropped), 0, "another sandbox's subscriber got nothing");
  struct hutch_events_op_count c[8];
  size_t n = hutch_events_op_counts(g, c, 8);
  uint64_t cf = 0, ds = 0;
  for (size_t i = 0; i < n && i < 8; i++) {
    if (!strcmp(c[i].kind, "create") && !strcmp(c[i].result, "failed")) cf = c[i].count;
    if (!strcmp(c[i].kind, "delete") && !strcmp(c[i].result, "succeeded")) ds = c[i].count;
  }
  ok(cf == 1 && ds == 2, "operations are counted by kind and result (create/failed %llu, delete/succeeded %llu)",
     (unsigned long long)cf, (unsigned long long)ds);
  hutch_events_unsubscribe(s);
  hutch_events_unsubscribe(f);
  /* Publishing with nobody listening only counts. */
  hutch_events_publish_op("op_4", "delete", "sb_1", "succeeded", NULL);
  n = hutch_events_op_counts(g, c, 8);
  for (size_t i = 0; i < n && i < 8; i++)
    if (!strcmp(c[i].kind, "delete") && !strcmp(c[i].result, "succeeded")) ds = c[i].count;
  is_int(ds, 3, "counted without subscribers too");
}

/* ---- threads ------------------------------------------------------------- */

#define PUBLISHERS 4
#define PER_PUBLISHER 20000
#define READERS 3

static struct hutch_events *tb;

static void *publisher(void *arg) {
  long id = (long)arg;
  char sb[16];
  snprintf(sb, sizeof sb, "sb_%ld", id);
  for (int i = 0; i < PER_PUBLISHER; i++) hutch_events_publish(tb, "x", sb, "{}");
  return NULL;
}

struct reader {
  struct hutch_events_sub *sub;
  uint64_t got, dropped, expect;
  bool ordered;
};

static void *reader_main(void *arg) {
  struct reader *r = arg;
  uint64_t last = 0;
  r->ordered = true;
  uint64_t deadline = mono_us() + 60 * 1000000ull;
  while (r->got + r->dropped < r->expect && mono_us() < deadline) {
    struct hutch_event *e;
    uint64_t d;
    if (hutch_events_next(r->sub, 100, &e, &d) == 1) {
      if (e->seq <= last) r->ordered = false;
      last = e->seq;
      r->got++;
      hutch_event_unref(e);
    }
    r->dropped += d;
  }
  return NULL;
}

static void test_threads(void) {
  tb = hutch_events_new(64, 16);
  hutch_err err = HUTCH_ERR_INIT;
  struct reader rd[READERS + 1] = {0};
  for (int i = 0; i < READERS; i++) {
    rd[i].sub = hutch_events_subscribe(tb, NULL, &err);
    rd[i].expect = PUBLISHERS * PER_PUBLISHER;
  }
  /* One filtered reader: only publisher 0's events. */
  rd[READERS].sub = hutch_events_subscribe(tb, "sb_0", &err);
  rd[READERS].expect = PER_PUBLISHER;
  pthread_t pt[PUBLISHERS], rt[READERS + 1];
  for (int i = 0; i <= READERS; i++) pthread_create(&rt[i], NULL, reader_main, &rd[i]);
  for (long i = 0; i < PUBLISHERS; i++) pthread_create(&pt[i], NULL, publisher, (void *)i);
  for (int i = 0; i < PUBLISHERS; i++) pthread_join(pt[i], NULL);
  for (int i = 0; i <= READERS; i++) pthread_join(rt[i], NULL);
  for (int i = 0; i <= READERS; i++) {
    is_int(rd[i].got + rd[i].dropped, rd[i].expect, "reader %d: received + dropped = published (%llu + %llu)", i,
           (unsigned long long)rd[i].got, (unsigned long long)rd[i].dropped);
    ok(rd[i].ordered, "reader %d: in sequence order", i);
    ok(rd[i].got > 0, "reader %d received events", i);
    hutch_events_unsubscribe(rd[i].sub);
  }
  hutch_events_free(tb);
}

int main(void) {
  test_order_and_filter();
  test_drop_oldest();
  test_limit();
  test_wait();
  test_global();
  test_threads();
  return done_testing();
}
