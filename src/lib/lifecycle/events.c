#include "lifecycle/events.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/util.h"

#define MAX_OP_COUNTERS 64

struct hutch_events_sub {
  struct hutch_events *bus;
  struct hutch_events_sub *prev, *next;
  char sandbox[64]; /* "" = every sandbox */
  pthread_cond_t cond;
  struct hutch_event **ring; /* bus->queue_cap slots */
  size_t head, len;
  uint64_t dropped; /* not yet reported */
};

struct hutch_events {
  pthread_mutex_t mu;
  size_t queue_cap, max_subs;
  struct hutch_events_sub *subs;
  size_t nsubs;
  uint64_t seq;
  struct hutch_events_op_count ops[MAX_OP_COUNTERS];
  size_t nops;
};

static struct hutch_events global_bus = {
    .mu = PTHREAD_MUTEX_INITIALIZER, .queue_cap = HUTCH_EVENTS_QUEUE, .max_subs = HUTCH_EVENTS_MAX_SUBS};

struct hutch_events *hutch_events_global(void) { return &global_bus; }

struct hutch_events *hutch_events_new(size_t queue_cap, size_t max_subs) {
  struct hutch_events *b = xcalloc(1, sizeof *b);
  pthread_mutex_init(&b->mu, NULL);
  b->queue_cap = queue_cap ? queue_cap : HUTCH_EVENTS_QUEUE;
  b->max_subs = max_subs ? max_subs : HUTCH_EVENTS_MAX_SUBS;
  return b;
}

void hutch_events_free(struct hutch_events *b) {
  if (!b || b == &global_bus) return;
  pthread_mutex_destroy(&b->mu);
  free(b);
}

void hutch_event_unref(struct hutch_event *e) {
  if (!e) return;
  if (__atomic_sub_fetch(&e->refs, 1, __ATOMIC_ACQ_REL) == 0) {
    free(e->data);
    free(e);
  }
}

static void count_op_locked(struct hutch_events *b, const char *kind, const char *result) {
  for (size_t i = 0; i < b->nops; i++)
    if (!strcmp(b->ops[i].kind, kind) && !strcmp(b->ops[i].result, result)) {
      b->ops[i].count++;
      return;
    }
  if (b->nops == MAX_OP_COUNTERS) return; /* kinds are hutchd's own: never this many */
  struct hutch_events_op_count *c = &b->ops[b->nops++];
  snprintf(c->kind, sizeof c->kind, "%s", kind);
  snprintf(c->result, sizeof c->result, "%s", result);
  c->count = 1;
}

void hutch_events_publish(struct hutch_events *b, const char *name, const char *sandbox, const char *data) {
  struct hutch_event *e = NULL;
  pthread_mutex_lock(&b->mu);
  b->seq++;
  for (struct hutch_events_sub *s = b->subs; s; s = s->next) {
    if (s->sandbox[0] && (!sandbox || strcmp(s->sandbox, sandbox))) continue;
    if (!e) {
      /* Made only when someone listens; under the lock so that seq order is
       * queue order. */
      e = xcalloc(1, sizeof *e);
      e->seq = b->seq;
      snprintf(e->name, sizeof e->name, "%s", name);
      snprintf(e->sandbox, sizeof e->sandbox, "%s", sandbox ? sandbox : "");
      e->data_len = strlen(data);
      e->data = xstrndup(data, e->data_len);
      e->refs = 1; /* the publisher's, dropped below */
    }
    if (s->len == b->queue_cap) {
      /* Full: drop the oldest, so a slow reader sees the newest state. */
      hutch_event_unref(s->ring[s->head]);
      s->head = (s->head + 1) % b->queue_cap;
      s->len--;
      s->dropped++;
    }
    __atomic_add_fetch(&e->refs, 1, __ATOMIC_RELAXED);
    s->ring[(s->head + s->len) % b->queue_cap] = e;
    s->len++;
    pthread_cond_signal(&s->cond);
  }
  pthread_mutex_unlock(&b->mu);
  hutch_event_unref(e);
}

struct hutch_events_sub *hutch_events_subscribe(struct hutch_events *b, const char *sandbox, hutch_err *err) {
  pthread_mutex_lock(&b->mu);
  if (b->nsubs >= b->max_subs) {
    size_t n = b->nsubs;
    pthread_mutex_unlock(&b->mu);
    hutch_err_set(err, 503, "unavailable", "too many event subscribers (%zu)", n);
    return NULL;
  }
  struct hutch_events_sub *s = xcalloc(1, sizeof *s);
  s->bus = b;
  snprintf(s->sandbox, sizeof s->sandbox, "%s", sandbox ? sandbox : "");
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&s->cond, &ca);
  pthread_condattr_destroy(&ca);
  s->ring = xcalloc(b->queue_cap, sizeof *s->ring);
  s->next = b->subs;
  if (b->subs) b->subs->prev = s;
  b->subs = s;
  b->nsubs++;
  pthread_mutex_unlock(&b->mu);
  return s;
}

void hutch_events_unsubscribe(struct hutch_events_sub *s) {
  if (!s) return;
  struct hutch_events *b = s->bus;
  pthread_mutex_lock(&b->mu);
  if (s->prev) s->prev->next = s->next;
  else b->subs = s->next;
  if (s->next) s->next->prev = s->prev;
  b->nsubs--;
  pthread_mutex_unlock(&b->mu);
  for (size_t i = 0; i < s->len; i++) hutch_event_unref(s->ring[(s->head + i) % b->queue_cap]);
  pthread_cond_destroy(&s->cond);
  free(s->ring);
  free(s);
}

int hutch_events_next(struct hutch_events_sub *s, unsigned timeout_ms, struct hutch_event **out, uint64_t *dropped) {
  struct hutch_events *b = s->bus;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_sec += timeout_ms / 1000;
  ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  *out = NULL;
  *dropped = 0;
  pthread_mutex_lock(&b->mu);
  while (!s->len && !s->dropped)
    if (pthread_cond_timedwait(&s->cond, &b->mu, &ts) != 0) break; /* ETIMEDOUT */
  /* Drops first: they happened before anything still queued. */
  if (s->dropped) {
    *dropped = s->dropped;
    s->dropped = 0;
  } else if (s->len) {
    *out = s->ring[s->head];
    s->ring[s->head] = NULL;
    s->head = (s->head + 1) % b->queue_cap;
    s->len--;
  }
  pthread_mutex_unlock(&b->mu);
  return *out ? 1 : 0;
}

size_t hutch_events_subscribers(struct hutch_events *b) {
  pthread_mutex_lock(&b->mu);
  size_t n = b->nsubs;
  pthread_mutex_unlock(&b->mu);
  return n;
}

size_t hutch_events_op_counts(struct hutch_events *b, struct hutch_events_op_count *out, size_t max) {
  pthread_mutex_lock(&b->mu);
  size_t n = b->nops;
  for (size_t i = 0; i < n && i < max; i++) out[i] = b->ops[i];
  pthread_mutex_unlock(&b->mu);
  return n;
}

/* ---- what hutchd publishes ---------------------------------------------- */

static void publish_json(const char *name, const char *sb_id, json_t *o) {
  if (!o) return;
  char *text = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  if (!text) return;
  hutch_events_publish(&global_bus, name, sb_id, text);
  free(text);
}

void hutch_events_publish_state(const char *sb_id, const char *state, const char *previous) {
  if (previous && !strcmp(state, previous)) return;
  char at[32];
  iso8601(now_ms(), at);
  publish_json("sandbox.state", sb_id,
               json_pack("{s:s, s:s, s:o, s:s}", "sandbox", sb_id, "state", state, "previous",
                         previous && *previous ? json_string(previous) : json_null(), "at", at));
}

void hutch_events_publish_snapshot(const char *snap_id, const char *sb_id, const char *state) {
  char at[32];
  iso8601(now_ms(), at);
  publish_json("snapshot.state", sb_id,
               json_pack("{s:s, s:s, s:s, s:s}", "snapshot", snap_id, "sandbox", sb_id, "state", state, "at", at));
}

void hutch_events_publish_op(const char *op_id, const char *kind, const char *sb_id, const char *state,
                             const hutch_err *err) {
  pthread_mutex_lock(&global_bus.mu);
  count_op_locked(&global_bus, kind, state);
  pthread_mutex_unlock(&global_bus.mu);
  json_t *e = err ? json_pack("{s:s, s:s, s:i}", "code", err->code[0] ? err->code : "internal", "message", err->msg,
                              "status", err->status ? err->status : 500)
                  : json_null();
  publish_json("operation.finished", sb_id,
               json_pack("{s:s, s:s, s:s, s:s, s:o}", "operation", op_id, "kind", kind, "sandbox", sb_id, "state",
                         state, "error", e));
}
