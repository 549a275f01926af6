/* GET /v1/events[?sandbox=ID]: the event bus (lifecycle/events.h) as
 * server-sent events.
 *
 * MHD pulls the body from stream_read in the connection's own thread, so the
 * reader blocks there waiting for the next event.  It wakes at least every
 * second to look at the socket: a client that went away (or MHD shutting
 * the connection down at exit) shows as POLLRDHUP/POLLHUP and ends the
 * stream at once, instead of at the next failed write.  A `: keep-alive`
 * comment every 15 s (HUTCH_EVENTS_KEEPALIVE_S) keeps idle proxies from
 * closing the stream and makes a vanished peer fail a write. */
#include <microhttpd.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "common/util.h"
#include "lifecycle/events.h"

#define WAKE_MS 1000u
#define DEFAULT_KEEPALIVE_S 15u

struct sse {
  struct hutch_events_sub *sub;
  int fd; /* the connection's socket (MHD owns it), -1 if unknown */
  char *frame; /* text not yet handed to MHD */
  size_t frame_len, frame_off;
  uint64_t last_out_us;
  uint64_t keepalive_us;
};

static unsigned keepalive_s(void) {
  /* For tests and operators behind proxies with short idle timeouts. */
  const char *v = getenv("HUTCH_EVENTS_KEEPALIVE_S");
  uint64_t n;
  if (v && parse_u64(v, 3600, &n) == 0 && n > 0) return (unsigned)n;
  return DEFAULT_KEEPALIVE_S;
}


static void set_frame(struct sse *s, char *text) {
  free(s->frame);
  s->frame = text;
  s->frame_len = strlen(text);
  s->frame_off = 0;
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
  struct sse *s = cls;
  while (s->frame_off == s->frame_len) {
    if (hutch_api_peer_gone(s->fd)) return HUTCH_STREAM_ERROR;
    uint64_t now = mono_us(), due = s->last_out_us + s->keepalive_us;
    if (now >= due) {
      set_frame(s, xstrdup(": keep-alive\n\n"));
      break;
    }
    unsigned wait_ms = (unsigned)((due - now) / 1000u) + 1;
    if (wait_ms > WAKE_MS) wait_ms = WAKE_MS;
    struct hutch_event *e = NULL;
    uint64_t dropped = 0;
    hutch_events_next(s->sub, wait_ms, &e, &dropped);
    if (dropped) {
      set_frame(s, xasprintf("event: dropped\ndata: {\"count\":%llu}\n\n", (unsigned long long)dropped));
    } else if (e) {
      set_frame(s, xasprintf("event: %s\ndata: %s\n\n", e->name, e->data));
      hutch_event_unref(e);
    }
  }
  size_t n = s->frame_len - s->frame_off;
  if (n > max) n = max;
  memcpy(buf, s->frame + s->frame_off, n);
  s->frame_off += n;
  s->last_out_us = mono_us();
  return (ssize_t)n;
}

static void sse_free(void *cls) {
  struct sse *s = cls;
  hutch_events_unsubscribe(s->sub);
  free(s->frame);
  free(s);
}

void hutch_h_events(struct hutch_req *req, struct hutch_resp *resp) {
  hutch_err err = HUTCH_ERR_INIT;
  const char *sb = hutch_api_query(req, "sandbox");
  if (sb) {
    if (!*sb || strlen(sb) > 63) {
      hutch_api_errorf(resp, 400, "invalid_argument", "query `sandbox`: expected a sandbox id");
      return;
    }
    struct hutch_sandbox_rec r;
    if (hutch_lc_get(req->ctx, sb, &r, &err) < 0) {
      hutch_api_error(resp, &err);
      return;
    }
    hutch_sandbox_rec_free(&r);
  }
  struct hutch_events_sub *sub = hutch_events_subscribe(hutch_events_global(), sb, &err);
  if (!sub) {
    hutch_api_error(resp, &err);
    return;
  }
  struct sse *s = xcalloc(1, sizeof *s);
  s->sub = sub;
  s->fd = hutch_api_client_fd(req);
  s->keepalive_us = (uint64_t)keepalive_s() * 1000000u;
  s->last_out_us = mono_us();
  /* Sent at once, so the client sees the headers and knows it is subscribed. */
  set_frame(s, xstrdup(": subscribed\n\n"));
  resp->status = 200;
  resp->stream = (struct hutch_stream){
      .read = sse_read, .free = sse_free, .cls = s, .size = HUTCH_SIZE_UNKNOWN, .content_type = "text/event-stream"};
}
