/* GET /metrics (src/lib/api/metrics.c) rendered against a scratch database:
 * sandboxes by state (warm-pool members as "pool"), request counters and
 * the cumulative latency histogram, bounded label values (methods, routes)
 * and their escaping, the commands counter, and observing from several
 * threads at once. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/api.h"
#include "api/metrics.h"
#include "common/util.h"
#include "store/db.h"
#include "tap.h"

static char dir[] = "/tmp/hutch-test-metrics.XXXXXX";

static void add_sandbox(struct hutch_db *db, const char *id, const char *state, const char *origin) {
  struct hutch_sandbox_rec r;
  memset(&r, 0, sizeof r);
  snprintf(r.id, sizeof r.id, "%s", id);
  snprintf(r.state, sizeof r.state, "%s", state);
  snprintf(r.template_name, sizeof r.template_name, "host");
  snprintf(r.runtime, sizeof r.runtime, "native");
  snprintf(r.origin, sizeof r.origin, "%s", origin);
  r.request = "{}";
  r.uid_slot = -1;
  r.created_at = r.updated_at = now_ms();
  hutch_err err = HUTCH_ERR_INIT;
  if (hutch_db_sandbox_insert(db, &r, &err) < 0) printf("# insert %s: %s\n", id, err.msg);
}

/* The whole body of GET /metrics, or NULL. */
static char *scrape(struct hutch_ctx *ctx, char *content_type, size_t ct_len) {
  struct hutch_req req = {.ctx = ctx, .method = "GET", .path = "/metrics"};
  struct hutch_resp resp = {0};
  hutch_h_metrics(&req, &resp);
  if (resp.status != 200 || !resp.stream.read) {
    json_decref(resp.json);
    return NULL;
  }
  snprintf(content_type, ct_len, "%s", resp.stream.content_type ? resp.stream.content_type : "");
  size_t cap = 4096, len = 0;
  char *out = xmalloc(cap);
  for (;;) {
    if (cap - len < 100) out = xrealloc(out, cap *= 2);
    ssize_t n = resp.stream.read(resp.stream.cls, len, out + len, 37); /* small reads: offsets must work */
    if (n == HUTCH_STREAM_END) break;
    if (n < 0) {
      free(out);
      out = NULL;
      break;
    }
    len += (size_t)n;
  }
  if (out) out[len] = 0;
  if (out && resp.stream.size != len) printf("# size %llu but %zu bytes\n", (unsigned long long)resp.stream.size, len);
  resp.stream.free(resp.stream.cls);
  return out;
}

static bool has_line(const char *text, const char *line) {
  size_t n = strlen(line);
  for (const char *p = text; (p = strstr(p, line)); p += n)
    if ((p == text || p[-1] == '\n') && p[n] == '\n') return true;
  return false;
}

#define line_ok(text, line) ok(has_line(text, line), "has `%s`", line)

#define OBSERVERS 4
#define PER_OBSERVER 10000

static void *observer(void *arg) {
  for (int i = 0; i < PER_OBSERVER; i++) hutch_metrics_observe_request("DELETE", "/v1/threads", 204, 0.002);
  return NULL;
}

int main(void) {
  if (!mkdtemp(dir)) skip_all("mkdtemp");
  char *path = xasprintf("%s/state.db", dir);
  hutch_err err = HUTCH_ERR_INIT;
  struct hutch_ctx ctx;
  memset(&ctx, 0, sizeof ctx);
  snprintf(ctx.cgroup_version, sizeof ctx.cgroup_version, "v2");
  ctx.started_ms = now_ms() - 5000;
  ok(hutch_db_open(path, &ctx.db, &err) == 0, "scratch database");
  add_sandbox(ctx.db, "sb_r1", "running", "api");
  add_sandbox(ctx.db, "sb_r2", "running", "api");
  add_sandbox(ctx.db, "sb_e", "error", "api");
  add_sandbox(ctx.db, "sb_p1", "pool", "pool");
  add_sandbox(ctx.db, "sb_p2", "creating", "pool");  /* a pool member being made */
  add_sandbox(ctx.db, "sb_claimed", "running", "pool");
  add_sandbox(ctx.db, "sb_x", "paused", "api");      /* a state this version does not list */

  hutch_metrics_observe_request("GET", "/healthz", 200, 0.0005);
  hutch_metrics_observe_request("GET", "/healthz", 200, 0.003);
  hutch_metrics_observe_request("GET", "/healthz", 200, 0.7);
  hutch_metrics_observe_request("GET", "/healthz", 200, 10);
  hutch_metrics_observe_request("GET", "/healthz", 503, 0.001); /* a bucket's bound is inclusive */
  hutch_metrics_observe_request("POST", "/v1/sandboxes", 201, 0.02);
  hutch_metrics_observe_request("BREW", "unmatched", 404, 0.0001);
  hutch_metrics_observe_request("X-ANYTHING", "unmatched", 404, 0.0001);
  hutch_metrics_observe_request("GET", NULL, 404, 0.0001);
  hutch_metrics_observe_request("GET", "/quote\"back\\slash\nnl", 200, 0.0001);
  hutch_metrics_command_started();
  hutch_metrics_command_started();
  hutch_metrics_command_started();

  char ct[128];
  char *t = scrape(&ctx, ct, sizeof ct);
  ok(t != NULL, "GET /metrics answers 200 with a body");
  if (!t) return done_testing();
  is_str(ct, "text/plain; version=0.0.4; charset=utf-8", "Prometheus text 0.0.4");
  ok(t[strlen(t) - 1] == '\n', "ends with a newline");
  line_ok(t, "hutch_build_info{version=\"" HUTCH_VERSION "\",cgroup=\"v2\"} 1");
  line_ok(t, "# TYPE hutch_build_info gauge");
  ok(strstr(t, "\nhutch_uptime_seconds 5.") || strstr(t, "\nhutch_uptime_seconds 4."), "uptime ~5 s");
  line_ok(t, "# TYPE hutch_sandboxes gauge");
  line_ok(t, "hutch_sandboxes{state=\"running\"} 3");
  line_ok(t, "hutch_sandboxes{state=\"error\"} 1");
  line_ok(t, "hutch_sandboxes{state=\"pool\"} 2");
  line_ok(t, "hutch_sandboxes{state=\"accepted\"} 0");
  line_ok(t, "hutch_sandboxes{state=\"creating\"} 0");
  line_ok(t, "hutch_sandboxes{state=\"deleting\"} 0");
  line_ok(t, "hutch_sandboxes{state=\"paused\"} 1");
  line_ok(t, "# TYPE hutch_operations_total counter");
  line_ok(t, "hutch_operations_total{kind=\"create\",result=\"succeeded\"} 0");
  line_ok(t, "hutch_operations_total{kind=\"delete\",result=\"failed\"} 0");
  line_ok(t, "# TYPE hutch_commands_started_total counter");
  line_ok(t, "hutch_commands_started_total 3");
  line_ok(t, "hutch_event_subscribers 0");
  line_ok(t, "# TYPE hutch_http_requests_total counter");
  line_ok(t, "hutch_http_requests_total{method=\"GET\",route=\"/healthz\",status=\"200\"} 4");
  line_ok(t, "hutch_http_requests_total{method=\"GET\",route=\"/healthz\",status=\"503\"} 1");
  line_ok(t, "hutch_http_requests_total{method=\"POST\",route=\"/v1/sandboxes\",status=\"201\"} 1");
  line_ok(t, "hutch_http_requests_total{method=\"other\",route=\"unmatched\",status=\"404\"} 2");
  line_ok(t, "hutch_http_requests_total{method=\"GET\",route=\"unmatched\",status=\"404\"} 1");
  line_ok(t, "hutch_http_requests_total{method=\"GET\",route=\"/quote\\\"back\\\\slash\\nnl\",status=\"200\"} 1");
  ok(!strstr(t, "BREW") && !strstr(t, "X-ANYTHING"), "unknown methods do not become label values");
  line_ok(t, "# TYPE hutch_http_request_duration_seconds histogram");
  /* /healthz: 0.0005, 0.001 (503), 0.003, 0.7, 10 — statuses merged. */
  line_ok(t, "hutch_http_request_duration_seconds_bucket{method=\"GET\",route=\"/healthz\",le=\"0.001\"} 2");
  line_ok(t, "hutch_http_request_duration_seconds_bucket{method=\"GET\",route=\"/healthz\",le=\"0.005\"} 3");
  line_ok(t, "hutch_http_request_duration_seconds_bucket{method=\"GET\",route=\"/healthz\",le=\"0.01\"} 3");
  line_ok(t, "hutch_http_request_duration_seconds_bucket{method=\"GET\",route=\"/healthz\",le=\"0.5\"} 3");
  line_ok(t, "hutch_http_request_duration_seconds_bucket{method=\"GET\",route=\"/healthz\",le=\"1\"} 4");
  line_ok(t, "hutch_http_request_duration_seconds_bucket{method=\"GET\",route=\"/healthz\",le=\"5\"} 4");
  line_ok(t, "hutch_http_request_duration_seconds_bucket{method=\"GET\",route=\"/healthz\",le=\"+Inf\"} 5");
  line_ok(t, "hutch_http_request_duration_seconds_count{method=\"GET\",route=\"/healthz\"} 5");
  line_ok(t, "hutch_http_request_duration_seconds_sum{method=\"GET\",route=\"/healthz\"} 10.704500");
  line_ok(t, "hutch_http_request_duration_seconds_bucket{method=\"POST\",route=\"/v1/sandboxes\",le=\"0.01\"} 0");
  line_ok(t, "hutch_http_request_duration_seconds_bucket{method=\"POST\",route=\"/v1/sandboxes\",le=\"0.05\"} 1");
  ok(strstr(t, "# TYPE hutch_http_request_duration_seconds histogram") == strstr(t, "# TYPE hutch_http_request_duration"),
     "each TYPE once");
  free(t);

  pthread_t th[OBSERVERS];
  for (int i = 0; i < OBSERVERS; i++) pthread_create(&th[i], NULL, observer, NULL);
  for (int i = 0; i < OBSERVERS; i++) pthread_join(th[i], NULL);
  t = scrape(&ctx, ct, sizeof ct);
  ok(t && has_line(t, "hutch_http_requests_total{method=\"DELETE\",route=\"/v1/threads\",status=\"204\"} 40000"),
     "observations from 4 threads all counted");
  ok(t && has_line(t, "hutch_http_request_duration_seconds_bucket{method=\"DELETE\",route=\"/v1/threads\",le=\"0.005\"} "
                      "40000"),
     "and in their bucket");
  free(t);

  /* A client cannot grow the table: routes are the router's patterns, and
   * methods and statuses outside their sets collapse. */
  for (int i = 0; i < 5000; i++) hutch_metrics_observe_request("GET", "unmatched", 100 + i % 500, 0.0001);
  t = scrape(&ctx, ct, sizeof ct);
  ok(t != NULL, "still answers after 500 distinct statuses");
  free(t);

  hutch_db_close(ctx.db);
  cleanup_free char *rm = xasprintf("rm -rf '%s'", dir);
  if (system(rm) != 0) printf("# could not remove %s\n", dir);
  free(path);
  return done_testing();
}
