#include "lifecycle/daemon.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/hash.h"
#include "common/log.h"
#include "common/util.h"
#include "isolate/cgroup.h"
#include "isolate/userns.h"
#include "lifecycle/egress.h"
#include "lifecycle/events.h"
#include "lifecycle/ops.h"
#include "lifecycle/snapshots.h"
#include "runtime/runtime.h"
#include "store/template.h"

struct hutch_opq {
  char op_id[64];
  char sb_id[64];
  char kind[16];
  char *arg; /* the operation's argument (snapshot id, template name), or NULL */
  struct hutch_opq *next;
};

void hutch_config_defaults(struct hutch_config *c) {
  memset(c, 0, sizeof *c);
  c->data_dir = xstrdup("/var/lib/hutch");
  c->socket_path = xstrdup("/run/hutch/hutchd.sock");
  c->uid_lock_dir = xstrdup("/run/hutch/uids");
  c->max_body = 1 << 20;
  c->workers = 4;
  c->uid_first = 1u << 28; /* 268435456: far above any /etc/subuid range in common use */
  c->uid_slots = 4096;
  c->default_timeout_s = 900;
  c->max_timeout_s = 7 * 24 * 3600;
  c->pool_template = xstrdup("host");
  c->output_buffer = 1u << 20;
  c->attach_token_ttl_s = 900;
  c->storage_backend = xstrdup("auto");
  c->storage_quota = xstrdup("auto");
  c->max_fork = 100;
  c->egress = true;
}

void hutch_config_free(struct hutch_config *c) {
  free(c->storage_backend);
  free(c->storage_quota);
  free(c->runsc_path);
  free(c->runsc_platform);
  free(c->gateway_dns);
  free(c->gateway_upstream_ca);
  free(c->gateway_public_cidr);
  free(c->data_dir);
  free(c->socket_path);
  free(c->listen_addr);
  free(c->run_dir);
  free(c->uid_lock_dir);
  free(c->libexec_dir);
  free(c->pool_template);
  memset(c, 0, sizeof *c);
}

char *hutch_sandbox_dir(struct hutch_ctx *ctx, const char *id) {
  return xasprintf("%s/sandboxes/%s", ctx->cfg.data_dir, id);
}

char *hutch_shim_socket(struct hutch_ctx *ctx, const char *id) { return xasprintf("%s/%s.sock", ctx->cfg.run_dir, id); }

uint32_t hutch_uid_base_for_slot(struct hutch_ctx *ctx, int64_t slot) {
  return ctx->cfg.uid_first + (uint32_t)slot * HUTCH_UID_SLOT_SIZE;
}


/* ---- operation queue ---------------------------------------------------- */

static void enqueue_arg(struct hutch_ctx *ctx, const char *op_id, const char *sb_id, const char *kind,
                        const char *arg) {
  struct hutch_opq *q = xcalloc(1, sizeof *q);
  q->arg = arg ? xstrdup(arg) : NULL;
  snprintf(q->op_id, sizeof q->op_id, "%s", op_id);
  snprintf(q->sb_id, sizeof q->sb_id, "%s", sb_id);
  snprintf(q->kind, sizeof q->kind, "%s", kind);
  pthread_mutex_lock(&ctx->mu);
  if (ctx->queue_tail) ctx->queue_tail->next = q;
  else ctx->queue_head = q;
  ctx->queue_tail = q;
  pthread_cond_broadcast(&ctx->work);
  pthread_mutex_unlock(&ctx->mu);
}

static void enqueue(struct hutch_ctx *ctx, const char *op_id, const char *sb_id, const char *kind) {
  enqueue_arg(ctx, op_id, sb_id, kind, NULL);
}

static bool is_busy(struct hutch_ctx *ctx, const char *sb_id);
static bool is_busy_locked(struct hutch_ctx *ctx, const char *sb_id) {
  pthread_mutex_lock(&ctx->mu);
  bool b = is_busy(ctx, sb_id);
  for (struct hutch_opq *q = ctx->queue_head; q && !b; q = q->next)
    if (!strcmp(q->sb_id, sb_id)) b = true;
  pthread_mutex_unlock(&ctx->mu);
  return b;
}

static bool is_busy(struct hutch_ctx *ctx, const char *sb_id) {
  for (size_t i = 0; i < ctx->nbusy; i++)
    if (!strcmp(ctx->busy[i], sb_id)) return true;
  return false;
}

/* Take the first queued operation whose sandbox is idle (per-sandbox FIFO).
 * Users' operations go before warm-pool refills, and refills never occupy
 * every worker, so a create that finds the pool empty does not queue
 * behind the refills its neighbours' claims triggered. */
static struct hutch_opq *dequeue_pass(struct hutch_ctx *ctx, bool refills) {
  struct hutch_opq *prev = NULL;
  size_t max_refills = ctx->nthreads > 1 ? ctx->nthreads - 1 : 1;
  if (refills && ctx->pool_running >= max_refills) return NULL;
  for (struct hutch_opq *q = ctx->queue_head; q; prev = q, q = q->next) {
    if (refills != !strcmp(q->kind, "pool_fill")) continue;
    if (is_busy(ctx, q->sb_id)) continue;
    bool earlier_same = false;
    for (struct hutch_opq *e = ctx->queue_head; e != q; e = e->next)
      if (!strcmp(e->sb_id, q->sb_id)) earlier_same = true;
    if (earlier_same) continue;
    if (prev) prev->next = q->next;
    else ctx->queue_head = q->next;
    if (ctx->queue_tail == q) ctx->queue_tail = prev;
    q->next = NULL;
    ctx->busy = xrealloc(ctx->busy, (ctx->nbusy + 1) * sizeof *ctx->busy);
    ctx->busy[ctx->nbusy++] = xstrdup(q->sb_id);
    if (refills) ctx->pool_running++;
    return q;
  }
  return NULL;
}

static struct hutch_opq *dequeue_locked(struct hutch_ctx *ctx) {
  struct hutch_opq *q = dequeue_pass(ctx, false);
  return q ? q : dequeue_pass(ctx, true);
}

static void release_busy(struct hutch_ctx *ctx, const char *sb_id) {
  pthread_mutex_lock(&ctx->mu);
  for (size_t i = 0; i < ctx->nbusy; i++)
    if (!strcmp(ctx->busy[i], sb_id)) {
      free(ctx->busy[i]);
      ctx->busy[i] = ctx->busy[--ctx->nbusy];
      break;
    }
  pthread_cond_broadcast(&ctx->done);
  pthread_cond_broadcast(&ctx->work);
  pthread_mutex_unlock(&ctx->mu);
}

static void *worker_main(void *arg) {
  struct hutch_ctx *ctx = arg;
  for (;;) {
    pthread_mutex_lock(&ctx->mu);
    struct hutch_opq *q;
    while (!(q = dequeue_locked(ctx)) && !ctx->stopping) pthread_cond_wait(&ctx->work, &ctx->mu);
    if (!q) {
      pthread_mutex_unlock(&ctx->mu);
      return NULL;
    }
    pthread_mutex_unlock(&ctx->mu);
    hutch_err err = HUTCH_ERR_INIT, e2 = HUTCH_ERR_INIT;
    hutch_db_op_set_state(ctx->db, q->op_id, "running", NULL, &e2);
    int r = hutch_ops_run(ctx, q->kind, q->sb_id, q->arg, &err);
    if (r < 0) hutch_log(LOG_ERROR, "operation.failed", "op", q->op_id, "kind", q->kind, "reason", err.msg, NULL);
    if (hutch_db_op_set_state(ctx->db, q->op_id, r < 0 ? "failed" : "succeeded", r < 0 ? &err : NULL, &e2) < 0)
      hutch_log(LOG_ERROR, "operation.record_failed", "op", q->op_id, "reason", e2.msg, NULL);
    hutch_events_publish_op(q->op_id, q->kind, q->sb_id, r < 0 ? "failed" : "succeeded", r < 0 ? &err : NULL);
    if (!strcmp(q->kind, "pool_fill")) {
      pthread_mutex_lock(&ctx->mu);
      ctx->pool_running--;
      pthread_mutex_unlock(&ctx->mu);
    }
    release_busy(ctx, q->sb_id);
    free(q->arg);
    free(q);
  }
}

static int new_op_arg(struct hutch_ctx *ctx, const char *kind, const char *sb_id, const char *arg, char op_id[64],
                      hutch_err *err) {
  struct hutch_op_rec op = {0};
  op.arg = (char *)arg;
  hutch_random_id("op", op.id, sizeof op.id);
  snprintf(op.kind, sizeof op.kind, "%s", kind);
  snprintf(op.sandbox_id, sizeof op.sandbox_id, "%s", sb_id);
  snprintf(op.state, sizeof op.state, "pending");
  op.created_at = now_ms();
  if (hutch_db_op_insert(ctx->db, &op, err) < 0) return -1;
  memcpy(op_id, op.id, 64);
  return 0;
}

static int new_op(struct hutch_ctx *ctx, const char *kind, const char *sb_id, char op_id[64], hutch_err *err) {
  return new_op_arg(ctx, kind, sb_id, NULL, op_id, err);
}

int hutch_lc_queue(struct hutch_ctx *ctx, const char *kind, const char *key, const char *arg, char op_id[64],
                   hutch_err *err) {
  if (new_op_arg(ctx, kind, key, arg, op_id, err) < 0) return -1;
  enqueue_arg(ctx, op_id, key, kind, arg);
  return 0;
}

void hutch_create_req_defaults(struct hutch_ctx *ctx, struct hutch_create_req *req, const char *template_name) {
  memset(req, 0, sizeof *req);
  req->template_name = template_name;
  req->runtime = "auto";
  req->cpus = 1;
  req->memory_mib = 512;
  req->pids = 256;
  req->disk_mib = 2048;
  req->timeout_s = ctx->cfg.default_timeout_s;
}

static char *normalized_request(const struct hutch_create_req *req) {
  json_t *empty = json_object();
  json_t *norm = json_pack("{s:{s:f, s:I, s:I, s:I}, s:O, s:O, s:I, s:s}", "resources", "cpus", req->cpus,
                           "memory_mib", (json_int_t)req->memory_mib, "pids", (json_int_t)req->pids, "disk_mib",
                           (json_int_t)req->disk_mib, "env", req->env ? req->env : empty, "labels",
                           req->labels ? req->labels : empty, "timeout_s", (json_int_t)req->timeout_s, "on_timeout",
                           req->on_timeout ? req->on_timeout : "delete");
  json_decref(empty);
  if (!norm) return NULL;
  if (req->from_snapshot) json_object_set_new(norm, "from_snapshot", json_string(req->from_snapshot));
  if (req->snapshots) json_object_set(norm, "snapshots", req->snapshots);
  if (req->image) json_object_set(norm, "image", req->image);
  if (req->network) json_object_set(norm, "network", req->network);
  char *s = json_dumps(norm, JSON_COMPACT | JSON_SORT_KEYS);
  json_decref(norm);
  return s;
}

static int insert_sandbox(struct hutch_ctx *ctx, const struct hutch_create_req *req, const char *runtime,
                          const char *origin, const char *kind, char sb_id[64], char op_id[64], hutch_err *err) {
  struct hutch_sandbox_rec r = {0};
  hutch_random_id("sb", r.id, sizeof r.id);
  snprintf(r.state, sizeof r.state, "accepted");
  snprintf(r.template_name, sizeof r.template_name, "%s", req->template_name);
  snprintf(r.runtime, sizeof r.runtime, "%s", runtime);
  snprintf(r.origin, sizeof r.origin, "%s", origin);
  r.request = normalized_request(req);
  if (!r.request) return hutch_err_sys(err, ENOMEM, "normalise request");
  r.uid_slot = -1;
  r.created_at = r.updated_at = now_ms();
  r.expires_at = !strcmp(origin, "pool") || req->timeout_s <= 0 ? 0 : r.created_at + (uint64_t)req->timeout_s * 1000u;
  int ret = hutch_db_sandbox_insert(ctx->db, &r, err);
  if (ret == 0) ret = new_op(ctx, kind, r.id, op_id, err);
  if (ret == 0) {
    memcpy(sb_id, r.id, 64);
    enqueue(ctx, op_id, r.id, kind);
  } else {
    hutch_err e2 = HUTCH_ERR_INIT;
    hutch_db_sandbox_delete(ctx->db, r.id, &e2);
  }
  free(r.request);
  return ret;
}

/* Top the warm pool up to its configured size (creations run on workers). */
static void pool_fill(struct hutch_ctx *ctx) {
  if (!ctx->cfg.pool_size) return;
  int64_t have = hutch_db_pool_count(ctx->db, ctx->cfg.pool_template);
  struct hutch_create_req req;
  hutch_create_req_defaults(ctx, &req, ctx->cfg.pool_template);
  for (int64_t i = have; i >= 0 && i < (int64_t)ctx->cfg.pool_size; i++) {
    char sb[64], op[64];
    hutch_err err = HUTCH_ERR_INIT;
    if (insert_sandbox(ctx, &req, hutch_runtime_native.name, "pool", "pool_fill", sb, op, &err) < 0) {
      hutch_log(LOG_WARN, "pool.fill_failed", "reason", err.msg, NULL);
      return;
    }
  }
}

/* Whether a create can be served by the warm pool: same template, the
 * pool's runtime, the pool's resources (env and labels are applied per
 * command and per record, so they never prevent a match). */
static bool pool_matches(struct hutch_ctx *ctx, const struct hutch_create_req *req, const char *runtime) {
  struct hutch_create_req d;
  hutch_create_req_defaults(ctx, &d, ctx->cfg.pool_template);
  return ctx->cfg.pool_size && !req->from_snapshot && !req->snapshots && !hutch_egress_wanted_json(req->network) &&
         !strcmp(req->template_name, ctx->cfg.pool_template) &&
         !strcmp(runtime, hutch_runtime_native.name) && req->cpus == d.cpus && req->memory_mib == d.memory_mib &&
         req->pids == d.pids && req->disk_mib == d.disk_mib;
}

static int pool_claim(struct hutch_ctx *ctx, const struct hutch_create_req *req, char sb_id[64], char op_id[64],
                      hutch_err *err) {
  cleanup_free char *request = normalized_request(req);
  if (!request) return hutch_err_sys(err, ENOMEM, "normalise request");
  uint64_t now = now_ms();
  uint64_t expires = req->timeout_s > 0 ? now + (uint64_t)req->timeout_s * 1000u : 0;
  int r = hutch_db_pool_claim(ctx->db, req->template_name, request, now, expires, sb_id, err);
  if (r != 0) return r;
  hutch_events_publish_state(sb_id, "running", "pool");
  /* The create is already done: record it as an operation that succeeded. */
  if (new_op(ctx, "create", sb_id, op_id, err) < 0 || hutch_db_op_set_state(ctx->db, op_id, "succeeded", NULL, err) < 0)
    return -1;
  hutch_events_publish_op(op_id, "create", sb_id, "succeeded", NULL);
  hutch_log(LOG_INFO, "sandbox.claimed_from_pool", "id", sb_id, NULL);
  pool_fill(ctx);
  return 0;
}

int hutch_lc_get(struct hutch_ctx *ctx, const char *sb_id, struct hutch_sandbox_rec *out, hutch_err *err) {
  if (hutch_db_sandbox_get(ctx->db, sb_id, out, err) < 0) return -1;
  if (!strcmp(out->origin, "pool") && (!strcmp(out->state, "pool") || !strcmp(out->state, "accepted") ||
                                       !strcmp(out->state, "creating"))) {
    hutch_sandbox_rec_free(out);
    return hutch_err_set(err, 404, "not_found", "sandbox `%s` not found", sb_id);
  }
  return 0;
}

int hutch_lc_create(struct hutch_ctx *ctx, const struct hutch_create_req *req, char sb_id[64], char op_id[64],
                    hutch_err *err) {
  if (!req->from_snapshot && !hutch_template_exists(&ctx->pool, req->template_name))
    return hutch_err_set(err, 404, "not_found", "template `%s` not found", req->template_name);
  const struct hutch_runtime_ops *rt = hutch_runtime_get(req->runtime);
  if (!rt) {
    if (!strcmp(req->runtime, "auto"))
      return hutch_err_set(err, 503, "unavailable", "no runtime is available on this host");
    return hutch_err_invalid(err, "field `runtime`: unknown runtime `%s` (known: auto, native)", req->runtime);
  }
  char why[512];
  if (!rt->available(why, sizeof why))
    return hutch_err_set(err, 503, "unavailable", "runtime `%s` is not available on this host: %s", rt->name, why);
  if (pool_matches(ctx, req, rt->name)) {
    int r = pool_claim(ctx, req, sb_id, op_id, err);
    if (r <= 0) return r; /* claimed, or a real error; 1 = pool empty: create normally */
  }
  /* An imported image's defaults (env, working directory) travel in the
   * sandbox's request, so commands find them without the template. */
  struct hutch_create_req with_image = *req;
  struct hutch_template_rec t;
  hutch_err te = HUTCH_ERR_INIT;
  json_t *cfg = NULL;
  if (!req->image && hutch_db_template_get(ctx->db, req->template_name, &t, &te) == 0) {
    json_error_t je;
    cfg = json_loads(t.config ? t.config : "{}", 0, &je);
    if (json_is_object(cfg) && json_object_size(cfg)) with_image.image = cfg;
    hutch_template_rec_free(&t);
  }
  int rc = insert_sandbox(ctx, &with_image, rt->name, "api", "create", sb_id, op_id, err);
  json_decref(cfg);
  return rc;
}

int hutch_lc_delete(struct hutch_ctx *ctx, const char *sb_id, char op_id[64], hutch_err *err) {
  struct hutch_sandbox_rec r;
  if (hutch_lc_get(ctx, sb_id, &r, err) < 0) return -1;
  hutch_sandbox_rec_free(&r);
  if (new_op(ctx, "delete", sb_id, op_id, err) < 0) return -1;
  enqueue(ctx, op_id, sb_id, "delete");
  return 0;
}

int hutch_lc_verb(struct hutch_ctx *ctx, const char *sb_id, const char *verb, char op_id[64], hutch_err *err) {
  struct hutch_sandbox_rec r;
  if (hutch_lc_get(ctx, sb_id, &r, err) < 0) return -1;
  const char *eff = !strcmp(verb, "wake") ? hutch_ops_wake_verb(r.state) : verb;
  int fit = hutch_ops_fit(eff, r.state, sb_id, err);
  /* A transitional state may be on its way to one that fits: leave the
   * final word to the worker, which checks again in order. */
  bool transitional = hutch_state_transitional(r.state);
  hutch_sandbox_rec_free(&r);
  if (fit < 0 && !transitional) return -1;
  if (new_op(ctx, verb, sb_id, op_id, err) < 0) return -1;
  if (fit > 0 && !transitional && !is_busy_locked(ctx, sb_id)) {
    /* Already there: an idempotent repeat is an operation that succeeded. */
    if (hutch_db_op_set_state(ctx->db, op_id, "succeeded", NULL, err) < 0) return -1;
    hutch_events_publish_op(op_id, verb, sb_id, "succeeded", NULL);
    return 1;
  }
  hutch_err_clear(err);
  enqueue(ctx, op_id, sb_id, verb);
  return 0;
}

int hutch_lc_wait(struct hutch_ctx *ctx, const char *op_id, uint64_t timeout_ms, struct hutch_op_rec *out,
                  hutch_err *err) {
  uint64_t deadline = mono_us() + timeout_ms * 1000u;
  for (;;) {
    if (hutch_db_op_get(ctx->db, op_id, out, err) < 0) return -1;
    if (!strcmp(out->state, "succeeded") || !strcmp(out->state, "failed")) return 0;
    uint64_t now = mono_us();
    if (now >= deadline) return 0;
    hutch_op_rec_free(out);
    /* Wake on any operation's completion, and re-check at least every 100 ms. */
    uint64_t wait_us = deadline - now < 100000 ? deadline - now : 100000;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)(wait_us % 1000000) * 1000;
    ts.tv_sec += (time_t)(wait_us / 1000000) + ts.tv_nsec / 1000000000;
    ts.tv_nsec %= 1000000000;
    pthread_mutex_lock(&ctx->mu);
    pthread_cond_timedwait(&ctx->done, &ctx->mu, &ts);
    pthread_mutex_unlock(&ctx->mu);
  }
}

int hutch_lc_get_running(struct hutch_ctx *ctx, const char *sb_id, struct hutch_sandbox_rec *out, hutch_err *err) {
  if (hutch_lc_get(ctx, sb_id, out, err) < 0) return -1;
  if (!strcmp(out->state, "running")) return 0;
  hutch_err_set(err, 409, "conflict", "sandbox `%s` is %s, not running", sb_id, out->state);
  hutch_sandbox_rec_free(out);
  return -1;
}

char **hutch_lc_command_env(const struct hutch_sandbox_rec *r, json_t *extra) {
  json_error_t je;
  json_t *req = json_loads(r->request, 0, &je);
  json_t *env = json_object();
  char hn[64];
  hutch_hostname_for(r->id, hn);
  json_object_set_new(env, "PATH", json_string("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"));
  json_object_set_new(env, "HOME", json_string("/root"));
  json_object_set_new(env, "USER", json_string("root"));
  json_object_set_new(env, "LANG", json_string("C.UTF-8"));
  json_object_set_new(env, "HOSTNAME", json_string(hn));
  /* An image's defaults (OCI config Env) come under the sandbox's own. */
  json_t *img_env = json_object_get(json_object_get(req, "image"), "env");
  if (json_is_object(img_env)) json_object_update(env, img_env);
  if (req) json_object_update(env, json_object_get(req, "env"));
  if (extra) json_object_update(env, extra);
  json_decref(req);
  size_t n = json_object_size(env), i = 0;
  char **envp = xcalloc(n + 1, sizeof *envp);
  const char *k;
  json_t *v;
  json_object_foreach(env, k, v) envp[i++] = xasprintf("%s=%s", k, json_string_value(v));
  json_decref(env);
  return envp;
}

char *hutch_lc_default_cwd(const struct hutch_sandbox_rec *r, int64_t uid) {
  json_error_t je;
  json_t *req = json_loads(r->request, 0, &je);
  json_t *img = json_object_get(req, "image");
  const char *c = json_string_value(json_object_get(img, "cwd"));
  /* An image without a WorkingDir runs in / (OCI's default): it may have
   * no home directories at all. */
  char *out = c && c[0] == '/' ? xstrdup(c)
              : img              ? xstrdup("/")
                                 : xstrdup(uid <= 0 ? "/root" : uid == 1000 ? "/home/user" : "/");
  json_decref(req);
  return out;
}

void hutch_envp_free(char **envp) {
  for (size_t i = 0; envp && envp[i]; i++) free(envp[i]);
  free(envp);
}

int hutch_lc_exec(struct hutch_ctx *ctx, const char *sb_id, const struct hutch_exec_opts *o,
                  struct hutch_exec_result *res, hutch_err *err) {
  memset(res, 0, sizeof *res);
  struct hutch_sandbox_rec r;
  if (hutch_lc_get_running(ctx, sb_id, &r, err) < 0) return -1;
  cleanup_free char *sock = hutch_shim_socket(ctx, sb_id);
  char **envp = hutch_lc_command_env(&r, o->env);
  char *cwd = hutch_lc_default_cwd(&r, 0);
  hutch_sandbox_rec_free(&r);
  char name[64];
  hutch_random_id("cmd", name, sizeof name);
  struct hutch_exec_req x = {
      .argv = o->argv,
      .envp = (const char *const *)envp,
      .cwd = o->cwd ? o->cwd : cwd,
      .timeout_ms = o->timeout_s * 1000u,
      .stdin_data = o->stdin_data,
      .stdin_len = o->stdin_len,
      .max_output = o->max_output,
      .name = name,
  };
  int ret = hutch_shim_exec(sock, &x, res, err);
  free(cwd);
  if (ret < 0) hutch_err_wrap(err, "exec in sandbox %s", sb_id);
  hutch_envp_free(envp);
  return ret;
}

/* ---- start-up, reconciliation, expiry ----------------------------------- */

/* Bring the database in line with the host after a restart: sandboxes whose
 * shim answers stay running; anything mid-operation or without a shim is
 * cleaned up (creating) or marked error (running). */
/* Host-wide uid claims that name this data directory but no sandbox that
 * holds a range (a crash between claim and row, or a row since removed). */
static void drop_orphan_claims(struct hutch_ctx *ctx) {
  DIR *d = opendir(ctx->cfg.uid_lock_dir);
  if (!d) return;
  cleanup_free char *prefix = xasprintf("%s ", ctx->cfg.data_dir);
  struct dirent *de;
  while ((de = readdir(d))) {
    uint64_t slot;
    if (parse_u64(de->d_name, UINT32_MAX, &slot) < 0) continue;
    cleanup_free char *path = xasprintf("%s/%s", ctx->cfg.uid_lock_dir, de->d_name);
    hutch_err e = HUTCH_ERR_INIT;
    cleanup_free char *owner = read_file(path, 8192, NULL, &e);
    if (!owner) continue;
    if (strncmp(owner, prefix, strlen(prefix))) {
      /* Another instance's claim: leave it, unless that instance's data
       * directory no longer exists (nobody can own the sandbox then). */
      char *sp = strchr(owner, ' ');
      if (sp && sp != owner) {
        *sp = 0;
        if (owner[0] == '/' && access(owner, F_OK) < 0 && errno == ENOENT && unlink(path) == 0)
          hutch_log(LOG_INFO, "uid_slot.released_stale", "slot", de->d_name, "data_dir", owner, NULL);
      }
      continue;
    }
    char *id = owner + strlen(prefix);
    id[strcspn(id, "\n")] = 0;
    struct hutch_sandbox_rec r;
    if (hutch_db_sandbox_get(ctx->db, id, &r, &e) == 0) {
      bool held = r.uid_slot == (int64_t)slot;
      hutch_sandbox_rec_free(&r);
      if (held) continue;
    } else if (e.status != 404) {
      continue; /* cannot tell: keep it */
    }
    if (unlink(path) == 0) hutch_log(LOG_INFO, "uid_slot.released_orphan", "slot", de->d_name, "id", id, NULL);
  }
  closedir(d);
}

static void reconcile(struct hutch_ctx *ctx) {
  hutch_err err = HUTCH_ERR_INIT;
  hutch_db_op_fail_unfinished(ctx->db, "hutchd restarted while the operation was in progress", &err);
  struct hutch_sandbox_rec *v = NULL;
  size_t n = 0;
  if (hutch_db_sandbox_list(ctx->db, NULL, &v, &n, &err) < 0) {
    hutch_log(LOG_ERROR, "reconcile.failed", "reason", err.msg, NULL);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    hutch_ops_reconcile(ctx, &v[i]);
    hutch_sandbox_rec_free(&v[i]);
  }
  free(v);
  drop_orphan_claims(ctx);
  hutch_snapshots_reconcile(ctx);
}

/* A smaller pool (or another template) after a restart: delete the extras. */
static void trim_pool(struct hutch_ctx *ctx) {
  struct hutch_sandbox_rec *v = NULL;
  size_t n = 0, kept = 0;
  hutch_err err = HUTCH_ERR_INIT;
  if (hutch_db_sandbox_list(ctx->db, "pool", &v, &n, &err) < 0) return;
  for (size_t i = 0; i < n; i++) {
    if (!strcmp(v[i].template_name, ctx->cfg.pool_template) && kept < ctx->cfg.pool_size) {
      kept++;
    } else {
      char op[64];
      if (new_op(ctx, "delete", v[i].id, op, &err) == 0) enqueue(ctx, op, v[i].id, "delete");
    }
    hutch_sandbox_rec_free(&v[i]);
  }
  free(v);
}

static void *reaper_main(void *arg) {
  struct hutch_ctx *ctx = arg;
  for (;;) {
    pthread_mutex_lock(&ctx->mu);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 1;
    if (!ctx->stopping) pthread_cond_timedwait(&ctx->work, &ctx->mu, &ts);
    bool stop = ctx->stopping;
    pthread_mutex_unlock(&ctx->mu);
    if (stop) return NULL;
    struct hutch_sandbox_rec *v = NULL;
    size_t n = 0;
    hutch_err err = HUTCH_ERR_INIT;
    pool_fill(ctx);
    hutch_egress_tick(ctx);
    if (hutch_db_sandbox_list(ctx->db, NULL, &v, &n, &err) < 0) continue;
    uint64_t now = now_ms();
    for (size_t i = 0; i < n; i++) {
      struct hutch_sandbox_rec *r = &v[i];
      bool live = !strcmp(r->state, "running") || !strcmp(r->state, "paused");
      /* A shim that died took the sandbox's processes with it. */
      if (live && !is_busy_locked(ctx, r->id) && !hutch_is_shim_of((pid_t)r->shim_pid, r->id)) {
        struct hutch_sandbox_rec tmp;
        hutch_err e = HUTCH_ERR_INIT;
        /* Re-read: an operation may have moved it since the list. */
        if (hutch_db_sandbox_get(ctx->db, r->id, &tmp, &e) == 0) {
          if (!strcmp(tmp.state, r->state) && !is_busy_locked(ctx, r->id) &&
              !hutch_is_shim_of((pid_t)tmp.shim_pid, tmp.id))
            hutch_ops_shim_lost(ctx, &tmp);
          hutch_sandbox_rec_free(&tmp);
        }
        live = false;
      }
      if (!is_busy_locked(ctx, r->id)) hutch_lc_auto_snapshots(ctx, r, now);
      bool expirable = live || !strcmp(r->state, "stopped");
      if (expirable && r->expires_at && r->expires_at <= now && strcmp(r->origin, "pool") != 0) {
        char op[64];
        hutch_err e = HUTCH_ERR_INIT;
        json_error_t je;
        json_t *req = json_loads(r->request, 0, &je);
        bool suspend = req && !strcmp(json_string_value(json_object_get(req, "on_timeout")) ?: "delete", "suspend");
        json_decref(req);
        /* Expiry acts once: clear the deadline (a later timeout call sets a new one). */
        hutch_db_sandbox_clear_expiry(ctx->db, r->id, &e);
        if ((suspend ? hutch_lc_verb(ctx, r->id, "suspend", op, &e) : hutch_lc_delete(ctx, r->id, op, &e)) >= 0)
          hutch_log(LOG_INFO, "sandbox.expired", "id", r->id, "op", op, "action", suspend ? "suspend" : "delete",
                    NULL);
      }
      hutch_sandbox_rec_free(r);
    }
    free(v);
  }
}

/* The attach-token key survives restarts, so tokens handed out stay valid
 * until they expire. */
static int load_token_key(struct hutch_ctx *ctx, hutch_err *err) {
  cleanup_free char *path = xasprintf("%s/secret.key", ctx->cfg.data_dir);
  size_t len = 0;
  hutch_err e2 = HUTCH_ERR_INIT;
  cleanup_free char *have = read_file(path, sizeof ctx->token_key, &len, &e2);
  if (have && len == sizeof ctx->token_key) {
    memcpy(ctx->token_key, have, sizeof ctx->token_key);
    return 0;
  }
  if (hutch_random_bytes(ctx->token_key, sizeof ctx->token_key) < 0) return hutch_err_sys(err, errno, "getrandom");
  cleanup_free char *tmp = xasprintf("%s.tmp", path);
  if (write_file(tmp, ctx->token_key, sizeof ctx->token_key, 0600, err) < 0 || rename(tmp, path) < 0)
    return hutch_err_wrap(err, "write `%s`", path);
  return 0;
}

int hutch_ctx_start(struct hutch_ctx *ctx, hutch_err *err) {
  pthread_mutex_init(&ctx->mu, NULL);
  pthread_cond_init(&ctx->work, NULL);
  pthread_cond_init(&ctx->done, NULL);
  ctx->started_ms = now_ms();
  if (mkdir_p(ctx->cfg.data_dir, 0700, err) < 0) return hutch_err_wrap(err, "data directory");
  char real[PATH_MAX];
  if (!realpath(ctx->cfg.data_dir, real)) return hutch_err_sys(err, errno, "realpath `%s`", ctx->cfg.data_dir);
  free(ctx->cfg.data_dir);
  ctx->cfg.data_dir = xstrdup(real);
  char hex[65];
  hutch_sha256_hex(real, strlen(real), hex);
  snprintf(ctx->instance, sizeof ctx->instance, "%.12s", hex);
  if (!ctx->cfg.run_dir) ctx->cfg.run_dir = xasprintf("/run/hutch/%s", ctx->instance);
  if (mkdir_p(ctx->cfg.run_dir, 0700, err) < 0) return hutch_err_wrap(err, "run directory");
  enum hutch_cgroup_version cv;
  if (hutch_cgroup_probe(&cv, err) < 0) return hutch_err_wrap(err, "cgroups");
  snprintf(ctx->cgroup_version, sizeof ctx->cgroup_version, "v%d", (int)cv);
  cleanup_free char *sbdir = xasprintf("%s/sandboxes", ctx->cfg.data_dir);
  if (mkdir_p(sbdir, 0700, err) < 0) return -1;
  if (load_token_key(ctx, err) < 0) return -1;
  cleanup_free char *dbpath = xasprintf("%s/state.db", ctx->cfg.data_dir);
  if (hutch_db_open(dbpath, &ctx->db, err) < 0) return -1;
  struct hutch_pool_opts po = {.backend = ctx->cfg.storage_backend, .size_bytes = ctx->cfg.storage_size,
                               .quota = ctx->cfg.storage_quota};
  if (hutch_pool_open(&ctx->pool, ctx->cfg.data_dir, &po, err) < 0) return -1;
  if (hutch_lc_templates_init(ctx, err) < 0) return hutch_err_wrap(err, "templates");
  reconcile(ctx);
  if (hutch_egress_start(ctx, err) < 0) return -1;
  ctx->nthreads = (size_t)(ctx->cfg.workers > 0 ? ctx->cfg.workers : 1);
  ctx->threads = xcalloc(ctx->nthreads, sizeof *ctx->threads);
  for (size_t i = 0; i < ctx->nthreads; i++)
    if (pthread_create(&ctx->threads[i], NULL, worker_main, ctx) != 0)
      return hutch_err_sys(err, errno, "start worker thread");
  if (pthread_create(&ctx->reaper, NULL, reaper_main, ctx) != 0)
    return hutch_err_sys(err, errno, "start expiry thread");
  trim_pool(ctx);
  pool_fill(ctx);
  return 0;
}

void hutch_ctx_stop(struct hutch_ctx *ctx) {
  pthread_mutex_lock(&ctx->mu);
  ctx->stopping = true;
  pthread_cond_broadcast(&ctx->work);
  pthread_mutex_unlock(&ctx->mu);
  for (size_t i = 0; i < ctx->nthreads; i++) pthread_join(ctx->threads[i], NULL);
  pthread_join(ctx->reaper, NULL);
  free(ctx->threads);
  ctx->threads = NULL;
  /* Operations still queued stay pending in the database and are failed by
   * the next start's reconciliation; sandboxes keep running under their shims. */
  while (ctx->queue_head) {
    struct hutch_opq *q = ctx->queue_head;
    ctx->queue_head = q->next;
    free(q->arg);
    free(q);
  }
  for (size_t i = 0; i < ctx->nbusy; i++) free(ctx->busy[i]);
  free(ctx->busy);
  hutch_egress_stop(ctx);
  /* Leave no empty per-instance cgroup parents behind when nothing runs. */
  if (hutch_db_sandbox_count(ctx->db) == 0) {
    hutch_cgroup_cleanup_instance(ctx->instance);
    rmdir(ctx->cfg.run_dir); /* only when empty */
  }
  hutch_db_close(ctx->db);
  ctx->db = NULL;
  hutch_pool_close(&ctx->pool);
}
