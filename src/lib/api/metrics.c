/* GET /v1/sandboxes/{id}/metrics (one sandbox's cgroup and disk usage) and
 * GET /metrics (hutchd in the Prometheus text format 0.0.4).
 *
 * Request counters are kept here, fed by http.c after every request through
 * hutch_metrics_observe_request: a fixed open-addressing table under one
 * mutex, keyed by (method, route pattern, status).  Its keys are bounded:
 * routes are the router's patterns ("unmatched" for the rest), methods
 * outside the HTTP set become "other", so a client cannot grow it. */
#include "api/metrics.h"
#include "lifecycle/ops.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api/api.h"
#include "common/util.h"
#include "store/template.h"
#include "isolate/cgroup.h"
#include "lifecycle/events.h"

/* ---- request counters ---------------------------------------------------- */

static const double bucket_le[] = {0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5};
#define N_BUCKETS (sizeof bucket_le / sizeof *bucket_le) /* +Inf is the count */
#define REQ_SLOTS 1024
#define REQ_MAX_USED (REQ_SLOTS * 3 / 4)

struct req_stat {
  bool used;
  char method[8];
  char route[64];
  int status;
  uint64_t count;
  double sum;
  uint64_t in_bucket[N_BUCKETS]; /* not cumulative; the output sums them */
};

static pthread_mutex_t req_mu = PTHREAD_MUTEX_INITIALIZER;
static struct req_stat req_stats[REQ_SLOTS];
static size_t req_used;
static uint64_t commands_started;

static const char *norm_method(const char *m) {
  static const char *const known[] = {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"};
  for (size_t i = 0; i < sizeof known / sizeof *known; i++)
    if (m && !strcmp(m, known[i])) return known[i];
  return "other";
}

static uint32_t fnv1a(uint32_t h, const char *s) {
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
  return h;
}

void hutch_metrics_observe_request(const char *method, const char *route, int status, double seconds) {
  const char *m = norm_method(method);
  if (!route) route = "unmatched";
  if (status < 100 || status > 599) status = 0;
  if (seconds < 0) seconds = 0;
  uint32_t h = fnv1a(fnv1a(2166136261u, m), route) ^ (uint32_t)status * 2654435761u;
  pthread_mutex_lock(&req_mu);
  for (size_t i = 0; i < REQ_SLOTS; i++) {
    struct req_stat *r = &req_stats[(h + i) % REQ_SLOTS];
    if (!r->used) {
      if (req_used >= REQ_MAX_USED) break; /* cannot happen with bounded keys; never grow past it */
      r->used = true;
      req_used++;
      snprintf(r->method, sizeof r->method, "%s", m);
      snprintf(r->route, sizeof r->route, "%s", route);
      r->status = status;
    } else if (r->status != status || strcmp(r->method, m) || strcmp(r->route, route)) {
      continue;
    }
    r->count++;
    r->sum += seconds;
    for (size_t b = 0; b < N_BUCKETS; b++)
      if (seconds <= bucket_le[b]) {
        r->in_bucket[b]++;
        break;
      }
    break;
  }
  pthread_mutex_unlock(&req_mu);
}

void hutch_metrics_command_started(void) { __atomic_add_fetch(&commands_started, 1, __ATOMIC_RELAXED); }

/* ---- a text buffer and a response that serves it ------------------------- */

struct text {
  char *p;
  size_t len, cap;
};

__attribute__((format(printf, 2, 3))) static void text_printf(struct text *t, const char *fmt, ...) {
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->p ? t->p + t->len : NULL, t->p ? t->cap - t->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (t->p && (size_t)n < t->cap - t->len) {
      t->len += (size_t)n;
      return;
    }
    t->cap = (t->cap + (size_t)n + 1) * 2;
    t->p = xrealloc(t->p, t->cap);
  }
}

/* A Prometheus label value: backslash, double quote and newline escaped. */
static void text_label(struct text *t, const char *v) {
  for (; *v; v++) {
    if (*v == '\\') text_printf(t, "\\\\");
    else if (*v == '"') text_printf(t, "\\\"");
    else if (*v == '\n') text_printf(t, "\\n");
    else text_printf(t, "%c", *v);
  }
}

struct buf_stream {
  char *p;
  size_t len;
};

static ssize_t buf_read(void *cls, uint64_t pos, char *buf, size_t max) {
  struct buf_stream *b = cls;
  if (pos >= b->len) return HUTCH_STREAM_END;
  size_t n = b->len - (size_t)pos;
  if (n > max) n = max;
  memcpy(buf, b->p + pos, n);
  return (ssize_t)n;
}

static void buf_free(void *cls) {
  struct buf_stream *b = cls;
  free(b->p);
  free(b);
}

/* Answer with `t`'s text (taken over) as a fixed-size body. */
static void respond_text(struct hutch_resp *resp, struct text *t, const char *content_type) {
  struct buf_stream *b = xcalloc(1, sizeof *b);
  b->p = t->p ? t->p : xstrdup("");
  b->len = t->len;
  t->p = NULL;
  resp->status = 200;
  resp->stream = (struct hutch_stream){
      .read = buf_read, .free = buf_free, .cls = b, .size = b->len, .content_type = content_type};
}

/* ---- GET /metrics ---------------------------------------------------------- */

static int cmp_req(const void *a, const void *b) {
  const struct req_stat *x = a, *y = b;
  int c = strcmp(x->route, y->route);
  if (!c) c = strcmp(x->method, y->method);
  if (!c) c = x->status - y->status;
  return c;
}

static void render_requests(struct text *t) {
  struct req_stat *v = xcalloc(REQ_SLOTS, sizeof *v);
  size_t n = 0;
  pthread_mutex_lock(&req_mu);
  for (size_t i = 0; i < REQ_SLOTS; i++)
    if (req_stats[i].used) v[n++] = req_stats[i];
  pthread_mutex_unlock(&req_mu);
  qsort(v, n, sizeof *v, cmp_req);
  text_printf(t, "# HELP hutch_http_requests_total HTTP requests answered, by method, route pattern and status.\n"
                 "# TYPE hutch_http_requests_total counter\n");
  for (size_t i = 0; i < n; i++) {
    text_printf(t, "hutch_http_requests_total{method=\"%s\",route=\"", v[i].method);
    text_label(t, v[i].route);
    text_printf(t, "\",status=\"%d\"} %llu\n", v[i].status, (unsigned long long)v[i].count);
  }
  text_printf(t, "# HELP hutch_http_request_duration_seconds Time to answer a request (a stream: until its headers).\n"
                 "# TYPE hutch_http_request_duration_seconds histogram\n");
  for (size_t i = 0; i < n;) {
    /* One histogram per (method, route): merge its statuses. */
    size_t j = i;
    uint64_t in_bucket[N_BUCKETS] = {0}, count = 0;
    double sum = 0;
    for (; j < n && !strcmp(v[j].route, v[i].route) && !strcmp(v[j].method, v[i].method); j++) {
      for (size_t b = 0; b < N_BUCKETS; b++) in_bucket[b] += v[j].in_bucket[b];
      count += v[j].count;
      sum += v[j].sum;
    }
    uint64_t cum = 0;
    for (size_t b = 0; b <= N_BUCKETS; b++) {
      char le[32];
      if (b < N_BUCKETS) {
        cum += in_bucket[b];
        snprintf(le, sizeof le, "%g", bucket_le[b]);
      } else {
        cum = count;
        snprintf(le, sizeof le, "+Inf");
      }
      text_printf(t, "hutch_http_request_duration_seconds_bucket{method=\"%s\",route=\"", v[i].method);
      text_label(t, v[i].route);
      text_printf(t, "\",le=\"%s\"} %llu\n", le, (unsigned long long)cum);
    }
    text_printf(t, "hutch_http_request_duration_seconds_sum{method=\"%s\",route=\"", v[i].method);
    text_label(t, v[i].route);
    text_printf(t, "\"} %.6f\n", sum);
    text_printf(t, "hutch_http_request_duration_seconds_count{method=\"%s\",route=\"", v[i].method);
    text_label(t, v[i].route);
    text_printf(t, "\"} %llu\n", (unsigned long long)count);
    i = j;
  }
  free(v);
}

struct state_count {
  char state[16];
  uint64_t n;
};

static void count_state(struct state_count *v, size_t *n, size_t max, const char *state) {
  for (size_t i = 0; i < *n; i++)
    if (!strcmp(v[i].state, state)) {
      v[i].n++;
      return;
    }
  if (*n == max) return;
  snprintf(v[*n].state, sizeof v[*n].state, "%s", state);
  v[(*n)++].n = 1;
}

static int render_sandboxes(struct hutch_ctx *ctx, struct text *t, hutch_err *err) {
  /* Every known state is present (0 when empty), so rates and alerts have a series. */
  struct state_count counts[32];
  size_t nc = 0;
  for (size_t i = 0; hutch_states[i]; i++) {
    count_state(counts, &nc, 32, hutch_states[i]);
    counts[nc - 1].n = 0;
  }
  count_state(counts, &nc, 32, "pool");
  counts[nc - 1].n = 0;
  struct hutch_sandbox_rec *v = NULL;
  size_t n = 0;
  if (hutch_db_sandbox_list(ctx->db, NULL, &v, &n, err) < 0) return -1;
  for (size_t i = 0; i < n; i++) {
    /* Warm-pool members nobody has claimed (ready or being made) are "pool". */
    bool pool = !strcmp(v[i].origin, "pool") &&
                (!strcmp(v[i].state, "pool") || !strcmp(v[i].state, "accepted") || !strcmp(v[i].state, "creating"));
    count_state(counts, &nc, 32, pool ? "pool" : v[i].state);
    hutch_sandbox_rec_free(&v[i]);
  }
  free(v);
  text_printf(t, "# HELP hutch_sandboxes Sandboxes by state (pool: warm-pool members not yet claimed).\n"
                 "# TYPE hutch_sandboxes gauge\n");
  for (size_t i = 0; i < nc; i++) {
    text_printf(t, "hutch_sandboxes{state=\"");
    text_label(t, counts[i].state);
    text_printf(t, "\"} %llu\n", (unsigned long long)counts[i].n);
  }
  return 0;
}

static void render_operations(struct text *t) {
  struct hutch_events_op_count c[64];
  size_t n = hutch_events_op_counts(hutch_events_global(), c, 64);
  if (n > 64) n = 64;
  static const char *const kinds[] = {"create", "delete"}, *const results[] = {"succeeded", "failed"};
  text_printf(t, "# HELP hutch_operations_total Lifecycle operations finished since hutchd started, by kind and "
                 "result.\n# TYPE hutch_operations_total counter\n");
  for (size_t k = 0; k < 2; k++)
    for (size_t r = 0; r < 2; r++) {
      uint64_t v = 0;
      for (size_t i = 0; i < n; i++)
        if (!strcmp(c[i].kind, kinds[k]) && !strcmp(c[i].result, results[r])) v = c[i].count;
      text_printf(t, "hutch_operations_total{kind=\"%s\",result=\"%s\"} %llu\n", kinds[k], results[r],
                  (unsigned long long)v);
    }
  for (size_t i = 0; i < n; i++) {
    bool shown = false;
    for (size_t k = 0; k < 2; k++)
      for (size_t r = 0; r < 2; r++)
        if (!strcmp(c[i].kind, kinds[k]) && !strcmp(c[i].result, results[r])) shown = true;
    if (shown) continue;
    text_printf(t, "hutch_operations_total{kind=\"");
    text_label(t, c[i].kind);
    text_printf(t, "\",result=\"");
    text_label(t, c[i].result);
    text_printf(t, "\"} %llu\n", (unsigned long long)c[i].count);
  }
}

void hutch_h_metrics(struct hutch_req *req, struct hutch_resp *resp) {
  struct hutch_ctx *ctx = req->ctx;
  hutch_err err = HUTCH_ERR_INIT;
  struct text t = {0};
  text_printf(&t, "# HELP hutch_build_info hutchd's version.\n# TYPE hutch_build_info gauge\n"
                  "hutch_build_info{version=\"");
  text_label(&t, HUTCH_VERSION);
  text_printf(&t, "\",cgroup=\"%s\"} 1\n", ctx->cgroup_version);
  uint64_t now = now_ms();
  text_printf(&t, "# HELP hutch_uptime_seconds Seconds since hutchd started.\n# TYPE hutch_uptime_seconds gauge\n"
                  "hutch_uptime_seconds %.3f\n",
              now > ctx->started_ms ? (double)(now - ctx->started_ms) / 1000.0 : 0.0);
  if (render_sandboxes(ctx, &t, &err) < 0) {
    free(t.p);
    hutch_err_wrap(&err, "count sandboxes");
    hutch_api_error(resp, &err);
    return;
  }
  render_operations(&t);
  text_printf(&t, "# HELP hutch_commands_started_total Commands started in sandboxes since hutchd started.\n"
                  "# TYPE hutch_commands_started_total counter\nhutch_commands_started_total %llu\n",
              (unsigned long long)__atomic_load_n(&commands_started, __ATOMIC_RELAXED));
  text_printf(&t, "# HELP hutch_event_subscribers Open GET /v1/events streams.\n"
                  "# TYPE hutch_event_subscribers gauge\nhutch_event_subscribers %zu\n",
              hutch_events_subscribers(hutch_events_global()));
  render_requests(&t);
  respond_text(resp, &t, "text/plain; version=0.0.4; charset=utf-8");
}

/* ---- GET /v1/sandboxes/{id}/metrics ----------------------------------------- */

#define DISK_MAX_ENTRIES 100000
#define DISK_MAX_DEPTH 128

struct disk_walk {
  uint64_t bytes, entries;
  bool partial;
  dev_t dev;
};

/* Add up the blocks of everything below the directory `dfd` (taken over).
 * Opened relative to their parent with O_NOFOLLOW and checked against the
 * lstat result, so a sandbox that swaps a directory for a symlink while we
 * walk cannot send the walk outside its layer; mount points are not crossed. */
static void walk_dir(int dfd, unsigned depth, struct disk_walk *w) {
  DIR *d = fdopendir(dfd);
  if (!d) {
    close(dfd);
    return;
  }
  struct dirent *de;
  while ((de = readdir(d))) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    if (w->entries >= DISK_MAX_ENTRIES) {
      w->partial = true;
      break;
    }
    w->entries++;
    struct stat st;
    if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) continue; /* gone meanwhile */
    w->bytes += (uint64_t)st.st_blocks * 512u;
    if (!S_ISDIR(st.st_mode) || st.st_dev != w->dev) continue;
    if (depth >= DISK_MAX_DEPTH) {
      w->partial = true;
      continue;
    }
    int sub = openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub < 0) continue;
    struct stat st2;
    if (fstat(sub, &st2) < 0 || st2.st_ino != st.st_ino || st2.st_dev != st.st_dev) {
      close(sub);
      continue;
    }
    walk_dir(sub, depth + 1, w);
  }
  closedir(d);
}

static int disk_usage(struct hutch_ctx *ctx, const char *id, struct disk_walk *w, hutch_err *err) {
  memset(w, 0, sizeof *w);
  cleanup_free char *root = hutch_rootfs_path(&ctx->pool, id);
  if (ctx->pool.quotas) {
    /* What the sandbox alone holds (what its quota limits), as of the last
     * btrfs commit (at most ~30 s old). */
    struct hutch_volume_usage u;
    if (hutch_pool_volume_usage(&ctx->pool, root, &u, err) < 0) return -1;
    w->bytes = u.exclusive;
    return 0;
  }
  /* No quota groups: count the files the sandbox wrote (overlay: its upper
   * layer; btrfs without quotas: its whole root, bounded). */
  cleanup_free char *upper = ctx->pool.kind == HUTCH_POOL_OVERLAY ? xasprintf("%s/upper", root) : xstrdup(root);
  int fd = open(upper, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return hutch_err_sys(err, errno, "open `%s`", upper);
  struct stat st;
  if (fstat(fd, &st) < 0) {
    int e = errno;
    close(fd);
    return hutch_err_sys(err, e, "stat `%s`", upper);
  }
  w->dev = st.st_dev;
  w->bytes = (uint64_t)st.st_blocks * 512u;
  walk_dir(fd, 0, w);
  return 0;
}

void hutch_h_sandbox_metrics(struct hutch_req *req, struct hutch_resp *resp) {
  struct hutch_ctx *ctx = req->ctx;
  const char *id = req->params[0];
  hutch_err err = HUTCH_ERR_INIT;
  struct hutch_sandbox_rec r;
  if (hutch_lc_get(ctx, id, &r, &err) < 0) {
    hutch_api_error(resp, &err);
    return;
  }
  bool running = !strcmp(r.state, "running");
  if (!running) hutch_api_errorf(resp, 409, "conflict", "sandbox `%s` is %s, not running", id, r.state);
  hutch_sandbox_rec_free(&r);
  if (!running) return;
  struct hutch_cgroup_stats cs;
  struct disk_walk w;
  if (hutch_cgroup_stats(ctx->instance, id, &cs, &err) < 0 || disk_usage(ctx, id, &w, &err) < 0) {
    /* Deleted meanwhile: answer what a request a moment later would get. */
    hutch_err e2 = HUTCH_ERR_INIT;
    if (hutch_lc_get(ctx, id, &r, &e2) < 0) {
      hutch_api_error(resp, &e2);
      return;
    }
    running = !strcmp(r.state, "running");
    if (!running) hutch_api_errorf(resp, 409, "conflict", "sandbox `%s` is %s, not running", id, r.state);
    hutch_sandbox_rec_free(&r);
    if (!running) return;
    hutch_err_wrap(&err, "metrics of sandbox %s", id);
    hutch_api_error(resp, &err);
    return;
  }
  resp->status = 200;
  resp->json = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:b}", "cpu_usage_usec", (json_int_t)cs.cpu_usage_usec,
                         "memory_bytes", (json_int_t)cs.memory_current, "memory_peak_bytes",
                         (json_int_t)cs.memory_peak, "pids", (json_int_t)cs.pids_current, "oom_kills",
                         (json_int_t)cs.oom_kills, "disk_bytes", (json_int_t)w.bytes, "disk_bytes_partial",
                         w.partial);
}
