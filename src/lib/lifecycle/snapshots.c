/* Snapshots, rollback, fork and automatic snapshots with tiered retention
 * (docs/storage.md).  The calls here validate and queue; the work that
 * touches a sandbox (freeze, snapshot, swap the root) runs as operations in
 * ops.c, in order with the sandbox's other operations. */
#include "lifecycle/snapshots.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "lifecycle/events.h"
#include "lifecycle/ops.h"
#include "runtime/runtime.h"
#include "store/retention.h"
#include "store/template.h"

static const struct hutch_retention default_retention = {.keep_last = 10, .hourly = 24, .daily = 7};

int hutch_snapshot_policy_parse(json_t *in, json_t **out, hutch_err *err) {
  *out = NULL;
  if (!json_is_object(in)) return hutch_err_invalid(err, "field `snapshots`: must be an object");
  json_t *copy = json_deep_copy(in);
  json_t *iv = json_object_get(copy, "interval_s");
  json_int_t interval = 0;
  if (iv) {
    if (!json_is_integer(iv) || json_integer_value(iv) < 0 || json_integer_value(iv) > 30 * 86400) {
      json_decref(copy);
      return hutch_err_invalid(err, "field `snapshots.interval_s`: an integer from 0 (off) to 2592000");
    }
    interval = json_integer_value(iv);
    json_object_del(copy, "interval_s");
  }
  json_t *kf = json_object_get(copy, "keep_full");
  json_int_t keep_full = 3;
  if (kf) {
    if (!json_is_integer(kf) || json_integer_value(kf) < 0 || json_integer_value(kf) > 10000) {
      json_decref(copy);
      return hutch_err_invalid(err, "field `snapshots.keep_full`: an integer from 0 to 10000");
    }
    keep_full = json_integer_value(kf);
    json_object_del(copy, "keep_full");
  }
  struct hutch_retention r = default_retention;
  if (hutch_retention_parse(copy, &r, err) < 0) {
    json_decref(copy);
    return hutch_err_wrap(err, "field `snapshots`");
  }
  json_decref(copy);
  json_t *o = hutch_retention_to_json(&r);
  json_object_set_new(o, "interval_s", json_integer(interval));
  json_object_set_new(o, "keep_full", json_integer(keep_full));
  *out = o;
  return 0;
}

json_t *hutch_snapshot_policy_of(const struct hutch_sandbox_rec *r) {
  json_error_t je;
  json_t *req = json_loads(r->request, 0, &je);
  json_t *p = json_object_get(req, "snapshots");
  json_t *out = NULL;
  if (json_is_object(p)) {
    out = json_incref(p);
  } else {
    out = hutch_retention_to_json(&default_retention);
    json_object_set_new(out, "interval_s", json_integer(0));
    json_object_set_new(out, "keep_full", json_integer(3));
  }
  json_decref(req);
  return out;
}

/* The newest ready snapshot of a sandbox (kind NULL: any), or 1 when none. */
static int newest(struct hutch_ctx *ctx, const char *sb_id, const char *kind, struct hutch_snapshot_rec *out,
                  hutch_err *err) {
  struct hutch_snapshot_rec *v = NULL;
  size_t n = 0;
  if (hutch_db_snapshot_list(ctx->db, sb_id, kind, &v, &n, err) < 0) return -1;
  int found = 1;
  for (size_t i = n; i-- > 0;) {
    if (found == 1 && !strcmp(v[i].state, "ready")) {
      *out = v[i];
      memset(&v[i], 0, sizeof v[i]);
      found = 0;
    }
    hutch_snapshot_rec_free(&v[i]);
  }
  free(v);
  return found;
}

int hutch_snapshot_row_new(struct hutch_ctx *ctx, const struct hutch_sandbox_rec *r, const char *kind,
                           json_t *labels, char snap_id[64], hutch_err *err) {
  struct hutch_snapshot_rec s;
  memset(&s, 0, sizeof s);
  hutch_random_id("snap", s.id, sizeof s.id);
  snprintf(s.sandbox_id, sizeof s.sandbox_id, "%s", r->id);
  snprintf(s.template_name, sizeof s.template_name, "%s", r->template_name);
  snprintf(s.kind, sizeof s.kind, "%s", kind);
  snprintf(s.state, sizeof s.state, "creating");
  /* Incremental to the sandbox's newest snapshot, or to the snapshot it
   * was made from. */
  struct hutch_snapshot_rec prev;
  hutch_err e2 = HUTCH_ERR_INIT;
  if (newest(ctx, r->id, NULL, &prev, &e2) == 0) {
    snprintf(s.parent_id, sizeof s.parent_id, "%s", prev.id);
    hutch_snapshot_rec_free(&prev);
  } else {
    json_error_t je;
    json_t *req = json_loads(r->request, 0, &je);
    const char *from = json_string_value(json_object_get(req, "from_snapshot"));
    if (from && hutch_db_snapshot_get(ctx->db, from, &prev, &e2) == 0) {
      snprintf(s.parent_id, sizeof s.parent_id, "%s", from);
      hutch_snapshot_rec_free(&prev);
    }
    json_decref(req);
  }
  s.labels = labels ? json_dumps(labels, JSON_COMPACT | JSON_SORT_KEYS) : xstrdup("{}");
  s.request = xstrdup(r->request);
  s.created_at = now_ms();
  int rc = hutch_db_snapshot_insert(ctx->db, &s, err);
  if (rc == 0) memcpy(snap_id, s.id, 64);
  hutch_snapshot_rec_free(&s);
  return rc;
}

int hutch_lc_snapshot(struct hutch_ctx *ctx, const char *sb_id, const char *kind, json_t *labels,
                      char snap_id[64], char op_id[64], hutch_err *err) {
  struct hutch_sandbox_rec r;
  if (hutch_lc_get(ctx, sb_id, &r, err) < 0) return -1;
  int ret = -1;
  if (hutch_ops_fit(!strcmp(kind, "full") ? "snapshot_full" : "snapshot", r.state, sb_id, err) != 0) goto out;
  if (!strcmp(kind, "full")) {
    const struct hutch_runtime_ops *rt = hutch_runtime_get(r.runtime);
    if (!rt || !rt->checkpoint || !(rt->caps & HUTCH_RT_CAP_MEMORY_CHECKPOINT)) {
      hutch_err_set(err, 409, "conflict",
                    "sandbox `%s` runs on `%s`, which cannot checkpoint memory: take a files snapshot, or use the "
                    "gvisor runtime",
                    sb_id, r.runtime);
      goto out;
    }
  }
  if (hutch_snapshot_row_new(ctx, &r, kind, labels, snap_id, err) < 0) goto out;
  if (hutch_lc_queue(ctx, "snapshot", sb_id, snap_id, op_id, err) < 0) {
    hutch_err e2 = HUTCH_ERR_INIT;
    hutch_db_snapshot_delete(ctx->db, snap_id, &e2);
    goto out;
  }
  ret = 0;
out:
  hutch_sandbox_rec_free(&r);
  return ret;
}

int hutch_lc_snapshot_delete(struct hutch_ctx *ctx, const char *snap_id, hutch_err *err) {
  struct hutch_snapshot_rec s;
  if (hutch_db_snapshot_get(ctx->db, snap_id, &s, err) < 0) return -1;
  bool creating = !strcmp(s.state, "creating");
  char sb[64];
  snprintf(sb, sizeof sb, "%s", s.sandbox_id);
  hutch_snapshot_rec_free(&s);
  if (creating) return hutch_err_set(err, 409, "conflict", "snapshot `%s` is being taken", snap_id);
  /* The row first: nothing new can start from it; then its blocks. */
  if (hutch_db_snapshot_delete(ctx->db, snap_id, err) < 0) return -1;
  cleanup_free char *path = hutch_pool_path(&ctx->pool, "snapshots", snap_id);
  cleanup_free char *ckpt = hutch_pool_path(&ctx->pool, "checkpoints", snap_id);
  if (hutch_pool_volume_remove(&ctx->pool, path, err) < 0 || hutch_pool_volume_remove(&ctx->pool, ckpt, err) < 0)
    return hutch_err_wrap(err, "delete snapshot %s", snap_id);
  hutch_events_publish_snapshot(snap_id, sb, "deleted");
  hutch_log(LOG_INFO, "snapshot.deleted", "id", snap_id, "sandbox", sb, NULL);
  return 0;
}

void hutch_snapshots_reconcile(struct hutch_ctx *ctx) {
  struct hutch_snapshot_rec *v = NULL;
  size_t n = 0;
  hutch_err err = HUTCH_ERR_INIT;
  if (hutch_db_snapshot_list(ctx->db, NULL, NULL, &v, &n, &err) < 0) return;
  for (size_t i = 0; i < n; i++) {
    cleanup_free char *path = hutch_pool_path(&ctx->pool, "snapshots", v[i].id);
    hutch_err e = HUTCH_ERR_INIT;
    if (!strcmp(v[i].state, "creating")) {
      /* Interrupted while it was taken: it may be half there; drop it. */
      if (hutch_pool_volume_remove(&ctx->pool, path, &e) == 0 && hutch_db_snapshot_delete(ctx->db, v[i].id, &e) == 0)
        hutch_log(LOG_WARN, "snapshot.reconciled", "id", v[i].id, "was", "creating", "now", "deleted", NULL);
    } else if (access(path, F_OK) < 0 && errno == ENOENT) {
      /* Its files are gone (removed by hand): the row would only mislead. */
      if (hutch_db_snapshot_delete(ctx->db, v[i].id, &e) == 0)
        hutch_log(LOG_WARN, "snapshot.reconciled", "id", v[i].id, "was", "missing", "now", "deleted", NULL);
    }
    hutch_snapshot_rec_free(&v[i]);
  }
  free(v);
}

void hutch_snapshots_retire_full(struct hutch_ctx *ctx, const char *sb_id, const char *keep) {
  struct hutch_sandbox_rec r;
  hutch_err err = HUTCH_ERR_INIT;
  uint32_t keep_full = 3;
  char pending[64] = "";
  if (hutch_db_sandbox_get(ctx->db, sb_id, &r, &err) == 0) {
    json_t *pol = hutch_snapshot_policy_of(&r);
    json_t *k = json_object_get(pol, "keep_full");
    if (json_is_integer(k)) keep_full = (uint32_t)json_integer_value(k);
    json_decref(pol);
    json_error_t je;
    json_t *req = json_loads(r.request, 0, &je);
    const char *c = json_string_value(json_object_get(req, "checkpoint"));
    if (c) snprintf(pending, sizeof pending, "%s", c);
    json_decref(req);
    hutch_sandbox_rec_free(&r);
  }
  struct hutch_snapshot_rec *v = NULL;
  size_t n = 0;
  if (hutch_db_snapshot_list(ctx->db, sb_id, "full", &v, &n, &err) < 0) return;
  /* Newest first: keep `keep_full` (and always `keep`, the one a restore needs). */
  uint32_t kept = 0;
  for (size_t i = n; i-- > 0;) {
    bool ready = !strcmp(v[i].state, "ready");
    if (ready && !strcmp(v[i].id, pending)) {
      /* A suspended sandbox's restore needs it, whatever the count. */
    } else if (ready && (!strcmp(v[i].id, keep) || kept < keep_full)) {
      kept++;
    } else if (ready) {
      hutch_err e = HUTCH_ERR_INIT;
      if (hutch_lc_snapshot_delete(ctx, v[i].id, &e) == 0)
        hutch_log(LOG_INFO, "snapshot.retired", "id", v[i].id, "sandbox", sb_id, "kind", "full", NULL);
    }
    hutch_snapshot_rec_free(&v[i]);
  }
  free(v);
}

void hutch_snapshots_drop_auto(struct hutch_ctx *ctx, const char *sb_id) {
  struct hutch_snapshot_rec *v = NULL;
  size_t n = 0;
  hutch_err err = HUTCH_ERR_INIT;
  if (hutch_db_snapshot_list(ctx->db, sb_id, "auto", &v, &n, &err) < 0) return;
  for (size_t i = 0; i < n; i++) {
    hutch_err e = HUTCH_ERR_INIT;
    if (hutch_lc_snapshot_delete(ctx, v[i].id, &e) < 0)
      hutch_log(LOG_WARN, "snapshot.delete_failed", "id", v[i].id, "reason", e.msg, NULL);
    hutch_snapshot_rec_free(&v[i]);
  }
  free(v);
}

int hutch_lc_rollback(struct hutch_ctx *ctx, const char *sb_id, const char *snap_id, char op_id[64],
                      hutch_err *err) {
  struct hutch_sandbox_rec r;
  if (hutch_lc_get(ctx, sb_id, &r, err) < 0) return -1;
  struct hutch_snapshot_rec s;
  int ret = -1;
  if (hutch_db_snapshot_get(ctx->db, snap_id, &s, err) < 0) goto out;
  bool mine = !strcmp(s.sandbox_id, sb_id), ready = !strcmp(s.state, "ready");
  hutch_snapshot_rec_free(&s);
  if (!mine) {
    hutch_err_invalid(err, "snapshot `%s` is not a snapshot of sandbox `%s`", snap_id, sb_id);
    goto out;
  }
  if (!ready) {
    hutch_err_set(err, 409, "conflict", "snapshot `%s` is not ready", snap_id);
    goto out;
  }
  if (hutch_ops_fit("rollback", r.state, sb_id, err) != 0) {
    if (!strcmp(r.state, "running"))
      hutch_err_set(err, 409, "conflict",
                    "sandbox `%s` is running: pause or stop it before a rollback (its processes cannot keep "
                    "running on changed files; a paused sandbox restarts on the snapshot's files)",
                    sb_id);
    goto out;
  }
  ret = hutch_lc_queue(ctx, "rollback", sb_id, snap_id, op_id, err);
out:
  hutch_sandbox_rec_free(&r);
  return ret;
}

/* A create request like the parent's, from `snap`. */
static int fork_request(const struct hutch_sandbox_rec *parent, json_t *req, const char *snap,
                        struct hutch_create_req *out, struct hutch_ctx *ctx) {
  hutch_create_req_defaults(ctx, out, parent->template_name);
  json_t *res = json_object_get(req, "resources");
  out->runtime = parent->runtime;
  out->cpus = json_number_value(json_object_get(res, "cpus"));
  out->memory_mib = json_integer_value(json_object_get(res, "memory_mib"));
  out->pids = json_integer_value(json_object_get(res, "pids"));
  out->disk_mib = json_integer_value(json_object_get(res, "disk_mib"));
  out->env = json_object_get(req, "env");
  out->labels = json_object_get(req, "labels");
  out->timeout_s = json_integer_value(json_object_get(req, "timeout_s"));
  out->on_timeout = json_string_value(json_object_get(req, "on_timeout"));
  out->from_snapshot = snap;
  json_t *img = json_object_get(req, "image");
  out->image = json_is_object(img) ? img : NULL;
  json_t *net = json_object_get(req, "network");
  out->network = json_is_object(net) ? net : NULL;
  json_t *pol = json_object_get(req, "snapshots");
  out->snapshots = json_is_object(pol) ? pol : NULL;
  return 0;
}

int hutch_lc_fork(struct hutch_ctx *ctx, const char *sb_id, uint32_t count, const char *snap_in, json_t *labels,
                  struct hutch_fork_result *out, hutch_err *err) {
  memset(out, 0, sizeof *out);
  if (count < 1 || count > ctx->cfg.max_fork)
    return hutch_err_invalid(err, "field `count`: from 1 to %u", ctx->cfg.max_fork);
  struct hutch_sandbox_rec r;
  if (hutch_lc_get(ctx, sb_id, &r, err) < 0) return -1;
  int ret = -1;
  json_t *req = NULL;
  if (snap_in) {
    struct hutch_snapshot_rec s;
    if (hutch_db_snapshot_get(ctx->db, snap_in, &s, err) < 0) goto out;
    bool mine = !strcmp(s.sandbox_id, sb_id), ready = !strcmp(s.state, "ready");
    hutch_snapshot_rec_free(&s);
    if (!mine) {
      hutch_err_invalid(err, "snapshot `%s` is not a snapshot of sandbox `%s`", snap_in, sb_id);
      goto out;
    }
    if (!ready) {
      hutch_err_set(err, 409, "conflict", "snapshot `%s` is not ready", snap_in);
      goto out;
    }
    snprintf(out->snapshot, sizeof out->snapshot, "%s", snap_in);
  } else {
    /* The current state, frozen for the few ms a snapshot takes. */
    char op[64];
    json_t *l = json_pack("{s:s}", "hutch.fork", "true");
    /* Where the runtime checkpoints memory, the copies continue the
     * parent's running processes: a full snapshot. */
    const struct hutch_runtime_ops *rt = hutch_runtime_get(r.runtime);
    bool memory = rt && rt->checkpoint && (rt->caps & HUTCH_RT_CAP_FORK_MEMORY) &&
                  (!strcmp(r.state, "running") || !strcmp(r.state, "paused"));
    int rc = hutch_lc_snapshot(ctx, sb_id, memory ? "full" : "fork", l, out->snapshot, op, err);
    json_decref(l);
    if (rc < 0) goto out;
    struct hutch_op_rec o;
    if (hutch_lc_wait(ctx, op, 120000, &o, err) < 0) goto out;
    bool ok = !strcmp(o.state, "succeeded");
    if (!ok) {
      hutch_err_set(err, o.err_status ? o.err_status : 500, o.err_code[0] ? o.err_code : "internal", "%s",
                    o.err_msg ? o.err_msg : "snapshot failed");
      hutch_err_wrap(err, "fork sandbox %s", sb_id);
    }
    hutch_op_rec_free(&o);
    if (!ok) goto out;
  }
  json_error_t je;
  req = json_loads(r.request, 0, &je);
  struct hutch_create_req cr;
  fork_request(&r, req, out->snapshot, &cr, ctx);
  json_t *merged = NULL;
  if (labels) {
    merged = json_is_object(cr.labels) ? json_deep_copy(cr.labels) : json_object();
    json_object_update(merged, labels);
    cr.labels = merged;
  }
  out->ids = xcalloc(count, sizeof *out->ids);
  out->ops = xcalloc(count, sizeof *out->ops);
  for (uint32_t i = 0; i < count; i++) {
    if (hutch_lc_create(ctx, &cr, out->ids[i], out->ops[i], err) < 0) {
      json_decref(merged);
      hutch_err_wrap(err, "fork %u of %u", i + 1, count);
      goto out;
    }
    out->n++;
  }
  json_decref(merged);
  hutch_log(LOG_INFO, "sandbox.forked", "id", sb_id, "snapshot", out->snapshot, NULL);
  ret = 0;
out:
  json_decref(req);
  hutch_sandbox_rec_free(&r);
  return ret;
}

void hutch_fork_result_free(struct hutch_fork_result *f) {
  free(f->ids);
  free(f->ops);
  f->ids = NULL;
  f->ops = NULL;
  f->n = 0;
}

/* ---- automatic snapshots --------------------------------------------------- */

static void apply_retention(struct hutch_ctx *ctx, const char *sb_id, json_t *policy) {
  struct hutch_retention ret = default_retention;
  json_t *copy = json_deep_copy(policy);
  json_object_del(copy, "interval_s");
  json_object_del(copy, "keep_full");
  hutch_err err = HUTCH_ERR_INIT;
  int bad = hutch_retention_parse(copy, &ret, &err);
  json_decref(copy);
  if (bad < 0) return;
  struct hutch_snapshot_rec *v = NULL;
  size_t n = 0;
  if (hutch_db_snapshot_list(ctx->db, sb_id, "auto", &v, &n, &err) < 0) return;
  uint64_t *times = xcalloc(n ? n : 1, sizeof *times);
  bool *keep = xcalloc(n ? n : 1, sizeof *keep);
  size_t m = 0;
  for (size_t i = 0; i < n; i++)
    if (!strcmp(v[i].state, "ready")) times[m++] = v[i].created_at;
  hutch_retention_select(times, m, now_ms(), &ret, keep);
  for (size_t i = 0, j = 0; i < n; i++) {
    if (strcmp(v[i].state, "ready")) continue;
    if (!keep[j++]) {
      hutch_err e = HUTCH_ERR_INIT;
      if (hutch_lc_snapshot_delete(ctx, v[i].id, &e) < 0)
        hutch_log(LOG_WARN, "snapshot.retention_failed", "id", v[i].id, "reason", e.msg, NULL);
      else
        hutch_log(LOG_INFO, "snapshot.retired", "id", v[i].id, "sandbox", sb_id, NULL);
    }
  }
  for (size_t i = 0; i < n; i++) hutch_snapshot_rec_free(&v[i]);
  free(v);
  free(times);
  free(keep);
}

void hutch_lc_auto_snapshots(struct hutch_ctx *ctx, const struct hutch_sandbox_rec *r, uint64_t now) {
  if (strcmp(r->state, "running") && strcmp(r->state, "paused")) return;
  if (!strstr(r->request, "\"snapshots\"")) return; /* the common case, cheaply */
  json_t *policy = hutch_snapshot_policy_of(r);
  json_int_t interval = json_integer_value(json_object_get(policy, "interval_s"));
  if (interval <= 0) {
    json_decref(policy);
    return;
  }
  struct hutch_snapshot_rec last;
  hutch_err err = HUTCH_ERR_INIT;
  int have = newest(ctx, r->id, "auto", &last, &err);
  if (have < 0) goto out;
  bool due = have == 1 || last.created_at + (uint64_t)interval * 1000u <= now;
  if (have == 0) hutch_snapshot_rec_free(&last);
  if (!due) goto out;
  /* Only when the root changed since the newest snapshot of any kind. */
  struct hutch_snapshot_rec any;
  if (newest(ctx, r->id, NULL, &any, &err) == 0) {
    uint64_t gen = any.generation;
    hutch_snapshot_rec_free(&any);
    cleanup_free char *root = hutch_rootfs_path(&ctx->pool, r->id);
    struct hutch_volume_usage u;
    if (ctx->pool.kind == HUTCH_POOL_BTRFS && gen && hutch_pool_volume_usage(&ctx->pool, root, &u, &err) == 0 &&
        u.generation == gen)
      goto retention;
  }
  char snap[64], op[64];
  if (hutch_lc_snapshot(ctx, r->id, "auto", NULL, snap, op, &err) < 0)
    hutch_log(LOG_WARN, "snapshot.auto_failed", "sandbox", r->id, "reason", err.msg, NULL);
retention:
  apply_retention(ctx, r->id, policy);
out:
  json_decref(policy);
}
