/* An in-process event bus: what the lifecycle publishes (state changes,
 * finished operations) and what GET /v1/events streams to its subscribers.
 *
 * Publishers never block on subscribers: each subscriber has a bounded
 * queue (HUTCH_EVENTS_QUEUE events); when it is full the oldest event is
 * dropped and counted, and the subscriber learns the count before its next
 * event.  An event is formatted once and shared (reference counted) by every
 * queue that holds it, so memory is bounded by subscribers x queue length.
 *
 * Thread safety: every function may be called from any thread.  One mutex
 * per bus guards the subscriber list and the queues; a publisher holds it
 * for O(subscribers) pointer moves.
 */
#ifndef HUTCH_EVENTS_H
#define HUTCH_EVENTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define HUTCH_EVENTS_QUEUE 1024      /* events kept per subscriber */
#define HUTCH_EVENTS_MAX_SUBS 1024   /* concurrent subscribers per bus */

struct hutch_events;     /* a bus */
struct hutch_events_sub; /* one subscriber */

/* One published event, shared by the queues that hold it.  Immutable. */
struct hutch_event {
  uint64_t seq;     /* 1, 2, ... per bus */
  char name[32];    /* "sandbox.state", "operation.finished" */
  char sandbox[64]; /* the sandbox it concerns ("" for none) */
  char *data;       /* JSON object text, one line */
  size_t data_len;
  int refs;         /* atomic */
};

/* A bus of its own (tests); queue_cap and max_subs of 0 take the defaults
 * above.  hutch_events_free requires that no subscriber is left. */
struct hutch_events *hutch_events_new(size_t queue_cap, size_t max_subs);
void hutch_events_free(struct hutch_events *b);
/* hutchd's bus (static; never freed). */
struct hutch_events *hutch_events_global(void);

/* Publish `data` (a JSON object text, copied) as event `name` about
 * `sandbox` (may be NULL).  Never blocks on subscribers. */
void hutch_events_publish(struct hutch_events *b, const char *name, const char *sandbox, const char *data);

/* Subscribe; `sandbox` (may be NULL) keeps only that sandbox's events.
 * Returns NULL with err filled (503) when the bus has max_subs subscribers. */
struct hutch_events_sub *hutch_events_subscribe(struct hutch_events *b, const char *sandbox, hutch_err *err);
/* Frees the subscriber and drops the events still queued for it. */
void hutch_events_unsubscribe(struct hutch_events_sub *s);
/* Wait up to timeout_ms for the next event.  Returns 1 with *out set (the
 * caller owns one reference: hutch_event_unref), or 0 on timeout.  *dropped
 * is set to the number of events dropped for this subscriber since the last
 * call that reported drops (0 mostly); drops are reported before the event
 * that follows them, so a call may return 0 with *dropped > 0. */
int hutch_events_next(struct hutch_events_sub *s, unsigned timeout_ms, struct hutch_event **out, uint64_t *dropped);
void hutch_event_unref(struct hutch_event *e);
size_t hutch_events_subscribers(struct hutch_events *b);

/* Operations finished, counted by (kind, result) as they pass the bus. */
struct hutch_events_op_count {
  char kind[16];
  char result[16];
  uint64_t count;
};
/* Copies up to max counters into out; returns how many there are. */
size_t hutch_events_op_counts(struct hutch_events *b, struct hutch_events_op_count *out, size_t max);

/* What the lifecycle publishes on hutchd's bus (docs/api.md, events):
 *   sandbox.state      {"sandbox","state","previous","at"}
 *   operation.finished {"operation","kind","sandbox","state","error"}
 *   snapshot.state     {"snapshot","sandbox","state","at"} (ready, deleted)
 * publish_state does nothing when state equals previous (a state set twice
 * is one change).  `previous` and `err` may be NULL. */
void hutch_events_publish_state(const char *sb_id, const char *state, const char *previous);
void hutch_events_publish_snapshot(const char *snap_id, const char *sb_id, const char *state);
void hutch_events_publish_op(const char *op_id, const char *kind, const char *sb_id, const char *state,
                             const hutch_err *err);

#endif
