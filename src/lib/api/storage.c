/* Storage calls (docs/api.md "Storage"): templates, snapshots, rollback,
 * fork, the automatic snapshot policy, export and import, the pool. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/api.h"
#include "api/json.h"
#include "api/resources.h"
#include "common/log.h"
#include "common/util.h"
#include "lifecycle/events.h"
#include "lifecycle/snapshots.h"
#include "runtime/runtime.h"
#include "store/archive.h"
#include "store/template.h"
#include "store/transfer.h"

#define WAIT_SNAPSHOT_MS 120000
#define WAIT_FORK_MS 300000
#define IMPORT_MAX (64ull << 30)

/* ?wait=false asks for the operation instead of the result. */
static bool wait_unless_false(struct hutch_req *req) {
  const char *w = hutch_api_query(req, "wait");
  return !(w && (!strcmp(w, "false") || !strcmp(w, "0")));
}

static void op_failed(struct hutch_resp *resp, const struct hutch_op_rec *o) {
  hutch_err e = HUTCH_ERR_INIT;
  e.status = o->err_status ? o->err_status : 500;
  snprintf(e.code, sizeof e.code, "%s", o->err_code[0] ? o->err_code : "internal");
  snprintf(e.msg, sizeof e.msg, "%s", o->err_msg ? o->err_msg : "operation failed");
  hutch_api_error(resp, &e);
  json_object_set_new(resp->json, "operation", hutch_op_json(o));
}

/* ---- snapshots ------------------------------------------------------------ */

json_t *hutch_snapshot_json(struct hutch_ctx *ctx, const struct hutch_snapshot_rec *s) {
  char c[32];
  iso8601(s->created_at, c);
  json_error_t je;
  json_t *labels = json_loads(s->labels ? s->labels : "{}", 0, &je);
  json_t *o = json_pack("{s:s, s:s, s:o, s:s, s:s, s:s, s:o, s:s}", "id", s->id, "sandbox", s->sandbox_id, "parent",
                        s->parent_id[0] ? json_string(s->parent_id) : json_null(), "template", s->template_name,
                        "kind", s->kind, "state", s->state, "labels", labels ? labels : json_object(), "created_at",
                        c);
  if (!strcmp(s->kind, "full")) {
    cleanup_free char *ck = hutch_pool_path(&ctx->pool, "checkpoints", s->id);
    json_object_set_new(o, "memory", json_boolean(access(ck, F_OK) == 0));
  } else {
    json_object_set_new(o, "memory", json_false());
  }
  if (!strcmp(s->state, "ready")) {
    /* What the snapshot alone holds (what deleting it frees), and all it
     * references, as of the last btrfs commit. */
    cleanup_free char *path = hutch_pool_path(&ctx->pool, "snapshots", s->id);
    struct hutch_volume_usage u;
    hutch_err err = HUTCH_ERR_INIT;
    if (hutch_pool_volume_usage(&ctx->pool, path, &u, &err) == 0 && (ctx->pool.quotas || ctx->pool.kind == HUTCH_POOL_OVERLAY)) {
      json_object_set_new(o, "exclusive_bytes", json_integer((json_int_t)u.exclusive));
      json_object_set_new(o, "referenced_bytes", json_integer((json_int_t)u.referenced));
    }
  }
  return o;
}

static void snapshot_reply(struct hutch_req *req, struct hutch_resp *resp, const char *snap_id, int status) {
  hutch_err err = HUTCH_ERR_INIT;
  struct hutch_snapshot_rec s;
  if (hutch_db_snapshot_get(req->ctx->db, snap_id, &s, &err) < 0) {
    hutch_api_error(resp, &err);
    return;
  }
  resp->status = status;
  resp->json = hutch_snapshot_json(req->ctx, &s);
  hutch_snapshot_rec_free(&s);
}

void hutch_h_snapshot_create(struct hutch_req *req, struct hutch_resp *resp) {
  static const char *const fields[] = {"labels", "kind", NULL};
  hutch_err err = HUTCH_ERR_INIT;
  json_t *body = hutch_api_body_object(req, &err);
  json_t *labels = NULL;
  const char *kind = "files";
  char snap[64], op[64];
  if (body && hutch_json_string(body, "", "kind", 16, &kind, &err) == 0 && strcmp(kind, "files") &&
      strcmp(kind, "full"))
    hutch_err_invalid(&err, "field `kind`: \"files\" (the default) or \"full\" (memory and files)");
  if (!body || err.msg[0] || hutch_json_only(body, "", fields, &err) < 0 ||
      hutch_json_string_map(body, "", "labels", 64, 255, hutch_label_key_ok, "must match [A-Za-z0-9_.-/]{1,63}",
                            &labels, &err) < 0 ||
      hutch_lc_snapshot(req->ctx, req->params[0], !strcmp(kind, "full") ? "full" : "manual", labels, snap, op,
                        &err) < 0) {
    json_decref(body);
    hutch_api_error(resp, &err);
    return;
  }
  json_decref(body);
  struct hutch_op_rec o;
  bool wait = wait_unless_false(req);
  if (hutch_lc_wait(req->ctx, op, wait ? WAIT_SNAPSHOT_MS : 0, &o, &err) < 0) {
    hutch_api_error(resp, &err);
    return;
  }
  if (!strcmp(o.state, "failed")) {
    op_failed(resp, &o);
  } else if (!strcmp(o.state, "succeeded")) {
    snapshot_reply(req, resp, snap, 201);
    if (resp->json) json_object_set_new(resp->json, "operation", hutch_op_json(&o));
  } else {
    snapshot_reply(req, resp, snap, 202);
    if (resp->json) json_object_set_new(resp->json, "operation", hutch_op_json(&o));
  }
  hutch_op_rec_free(&o);
}

static void list_snapshots(struct hutch_req *req, struct hutch_resp *resp, const char *sb_id) {
  hutch_err err = HUTCH_ERR_INIT;
  const char *kind = hutch_api_query(req, "kind");
  if (kind && strcmp(kind, "manual") && strcmp(kind, "auto") && strcmp(kind, "fork") && strcmp(kind, "imported") &&
      strcmp(kind, "full")) {
    hutch_api_errorf(resp, 400, "invalid_argument", "query `kind`: manual, auto, fork, full or imported");
    return;
  }
  struct hutch_snapshot_rec *v = NULL;
  size_t n = 0;
  if (hutch_db_snapshot_list(req->ctx->db, sb_id, kind, &v, &n, &err) < 0) {
    hutch_api_error(resp, &err);
    return;
  }
  if (sb_id && n == 0) {
    /* Snapshots outlive their sandbox; an id that is neither is unknown. */
    struct hutch_sandbox_rec r;
    if (hutch_lc_get(req->ctx, sb_id, &r, &err) < 0) {
      free(v);
      hutch_api_error(resp, &err);
      return;
    }
    hutch_sandbox_rec_free(&r);
  }
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++) {
    json_array_append_new(arr, hutch_snapshot_json(req->ctx, &v[i]));
    hutch_snapshot_rec_free(&v[i]);
  }
  free(v);
  resp->status = 200;
  resp->json = json_pack("{s:o}", "snapshots", arr);
}

void hutch_h_snapshot_list(struct hutch_req *req, struct hutch_resp *resp) {
  list_snapshots(req, resp, req->params[0]);
}

void hutch_h_snapshot_list_all(struct hutch_req *req, struct hutch_resp *resp) {
  const char *sb = hutch_api_query(req, "sandbox");
  list_snapshots(req, resp, sb);
}

/* /v1/sandboxes/{id}/snapshots/{snap} or /v1/snapshots/{snap} */
static const char *snap_param(struct hutch_req *req, struct hutch_resp *resp, bool nested) {
  const char *snap = nested ? req->params[1] : req->params[0];
  hutch_err err = HUTCH_ERR_INIT;
  struct hutch_snapshot_rec s;
  if (hutch_db_snapshot_get(req->ctx->db, snap, &s, &err) < 0) {
    hutch_api_error(resp, &err);
    return NULL;
  }
  bool match = !nested || !strcmp(s.sandbox_id, req->params[0]);
  hutch_snapshot_rec_free(&s);
  if (!match) {
    hutch_api_errorf(resp, 404, "not_found", "snapshot `%.80s` not found in sandbox `%.80s`", snap, req->params[0]);
    return NULL;
  }
  return snap;
}

void hutch_h_snapshot_get(struct hutch_req *req, struct hutch_resp *resp) {
  const char *snap = snap_param(req, resp, req->params[1] != NULL);
  if (snap) snapshot_reply(req, resp, snap, 200);
}

void hutch_h_snapshot_delete(struct hutch_req *req, struct hutch_resp *resp) {
  const char *snap = snap_param(req, resp, req->params[1] != NULL);
  if (!snap) return;
  hutch_err err = HUTCH_ERR_INIT;
  if (hutch_lc_snapshot_delete(req->ctx, snap, &err) < 0) {
    hutch_api_error(resp, &err);
    return;
  }
  resp->status = 204;
}

/* ---- rollback, fork, policy ------------------------------------------------- */

void hutch_h_sandbox_rollback(struct hutch_req *req, struct hutch_resp *resp) {
  static const char *const fields[] = {"snapshot", NULL};
  hutch_err err = HUTCH_ERR_INIT;
  json_t *body = hutch_api_body_object(req, &err);
  const char *snap = NULL;
  char op[64];
  if (!body || hutch_json_only(body, "", fields, &err) < 0 ||
      hutch_json_string(body, "", "snapshot", 63, &snap, &err) < 0) {
    json_decref(body);
    hutch_api_error(resp, &err);
    return;
  }
  if (!snap) {
    json_decref(body);
    hutch_api_errorf(resp, 400, "invalid_argument", "field `snapshot`: required (the id of a snapshot)");
    return;
  }
  int rc = hutch_lc_rollback(req->ctx, req->params[0], snap, op, &err);
  json_decref(body);
  if (rc < 0) {
    hutch_api_error(resp, &err);
    return;
  }
  struct hutch_op_rec o;
  bool wait = hutch_api_wait(req);
  if (hutch_lc_wait(req->ctx, op, wait ? WAIT_SNAPSHOT_MS : 0, &o, &err) < 0) {
    hutch_api_error(resp, &err);
    return;
  }
  if (wait && !strcmp(o.state, "failed")) {
    op_failed(resp, &o);
    hutch_op_rec_free(&o);
    return;
  }
  struct hutch_sandbox_rec s;
  if (hutch_lc_get(req->ctx, req->params[0], &s, &err) < 0) {
    hutch_op_rec_free(&o);
    hutch_api_error(resp, &err);
    return;
  }
  bool done = !strcmp(o.state, "succeeded");
  resp->status = wait && done ? 200 : 202;
  resp->json = wait && done ? hutch_sandbox_json(req->ctx, &s)
                            : json_pack("{s:s, s:s}", "id", s.id, "state", s.state);
  json_object_set_new(resp->json, "operation", hutch_op_json(&o));
  hutch_sandbox_rec_free(&s);
  hutch_op_rec_free(&o);
}

void hutch_h_sandbox_fork(struct hutch_req *req, struct hutch_resp *resp) {
  static const char *const fields[] = {"count", "snapshot", "labels", NULL};
  hutch_err err = HUTCH_ERR_INIT;
  json_t *body = hutch_api_body_object(req, &err);
  const char *snap = NULL;
  json_t *labels = NULL;
  int64_t count = 1;
  struct hutch_fork_result f;
  memset(&f, 0, sizeof f);
  if (!body || hutch_json_only(body, "", fields, &err) < 0 ||
      hutch_json_int(body, "", "count", 1, req->ctx->cfg.max_fork, &count, &err) < 0 ||
      hutch_json_string(body, "", "snapshot", 63, &snap, &err) < 0 ||
      hutch_json_string_map(body, "", "labels", 64, 255, hutch_label_key_ok, "must match [A-Za-z0-9_.-/]{1,63}",
                            &labels, &err) < 0 ||
      hutch_lc_fork(req->ctx, req->params[0], (uint32_t)count, snap, labels, &f, &err) < 0) {
    json_decref(body);
    if (f.n) {
      /* Some copies were accepted before the failure: say which. */
      hutch_api_error(resp, &err);
      json_t *ids = json_array();
      for (uint32_t i = 0; i < f.n; i++) json_array_append_new(ids, json_string(f.ids[i]));
      json_object_set_new(resp->json, "accepted", ids);
    } else {
      hutch_api_error(resp, &err);
    }
    hutch_fork_result_free(&f);
    return;
  }
  json_decref(body);
  bool wait = hutch_api_wait(req);
  json_t *arr = json_array();
  bool all_ok = true;
  for (uint32_t i = 0; i < f.n; i++) {
    struct hutch_op_rec o;
    if (hutch_lc_wait(req->ctx, f.ops[i], wait ? WAIT_FORK_MS : 0, &o, &err) < 0) {
      json_array_append_new(arr, json_pack("{s:s}", "id", f.ids[i]));
      all_ok = false;
      continue;
    }
    struct hutch_sandbox_rec s;
    hutch_err e2 = HUTCH_ERR_INIT;
    json_t *sj;
    if (hutch_lc_get(req->ctx, f.ids[i], &s, &e2) == 0) {
      sj = wait ? hutch_sandbox_json(req->ctx, &s) : json_pack("{s:s, s:s}", "id", s.id, "state", s.state);
      hutch_sandbox_rec_free(&s);
    } else {
      sj = json_pack("{s:s, s:s}", "id", f.ids[i], "state", "deleted");
    }
    if (strcmp(o.state, "succeeded")) all_ok = false;
    json_object_set_new(sj, "operation", hutch_op_json(&o));
    json_array_append_new(arr, sj);
    hutch_op_rec_free(&o);
  }
  resp->status = wait ? (all_ok ? 201 : 500) : 202;
  resp->json = json_pack("{s:s, s:s, s:o}", "parent", req->params[0], "snapshot", f.snapshot, "sandboxes", arr);
  if (wait && !all_ok)
    json_object_set_new(resp->json, "error",
                        json_pack("{s:s, s:s}", "code", "internal", "message", "some copies failed: see their operations"));
  hutch_fork_result_free(&f);
}

void hutch_h_snapshot_policy_get(struct hutch_req *req, struct hutch_resp *resp) {
  hutch_err err = HUTCH_ERR_INIT;
  struct hutch_sandbox_rec r;
  if (hutch_lc_get(req->ctx, req->params[0], &r, &err) < 0) {
    hutch_api_error(resp, &err);
    return;
  }
  resp->status = 200;
  resp->json = hutch_snapshot_policy_of(&r);
  hutch_sandbox_rec_free(&r);
}

void hutch_h_snapshot_policy_put(struct hutch_req *req, struct hutch_resp *resp) {
  hutch_err err = HUTCH_ERR_INIT;
  json_t *body = hutch_api_body_object(req, &err);
  json_t *pol = NULL;
  struct hutch_sandbox_rec r;
  if (!body || hutch_snapshot_policy_parse(body, &pol, &err) < 0 || hutch_lc_get(req->ctx, req->params[0], &r, &err) < 0) {
    json_decref(body);
    json_decref(pol);
    hutch_api_error(resp, &err);
    return;
  }
  hutch_sandbox_rec_free(&r);
  json_decref(body);
  cleanup_free char *s = json_dumps(pol, JSON_COMPACT | JSON_SORT_KEYS);
  if (hutch_db_sandbox_set_snapshot_policy(req->ctx->db, req->params[0], s, &err) < 0) {
    json_decref(pol);
    hutch_api_error(resp, &err);
    return;
  }
  resp->status = 200;
  resp->json = pol;
}

/* ---- templates ---------------------------------------------------------------- */

static json_t *template_json(struct hutch_ctx *ctx, const struct hutch_template_rec *t) {
  char c[32], u[32];
  iso8601(t->created_at, c);
  iso8601(t->updated_at, u);
  json_error_t je;
  json_t *src = json_loads(t->source ? t->source : "{}", 0, &je);
  json_t *cfg = json_loads(t->config ? t->config : "{}", 0, &je);
  if (src) json_object_del(src, "name");
  json_t *o = json_pack("{s:s, s:s, s:o, s:o, s:{s:o, s:f}, s:o, s:s, s:s}", "name", t->name, "state", t->state,
                        "source", src ? src : json_object(), "config", cfg ? cfg : json_object(), "progress",
                        "message", t->progress ? json_string(t->progress) : json_null(), "fraction", t->fraction,
                        "error", t->error ? json_string(t->error) : json_null(), "created_at", c, "updated_at", u);
  if (!strcmp(t->state, "ready")) {
    cleanup_free char *path = hutch_template_path(&ctx->pool, t->name);
    struct hutch_volume_usage us;
    hutch_err err = HUTCH_ERR_INIT;
    if (ctx->pool.quotas && hutch_pool_volume_usage(&ctx->pool, path, &us, &err) == 0)
      json_object_set_new(o, "size_bytes", json_integer((json_int_t)us.referenced));
  }
  return o;
}

void hutch_h_template_list(struct hutch_req *req, struct hutch_resp *resp) {
  hutch_err err = HUTCH_ERR_INIT;
  struct hutch_template_rec *v = NULL;
  size_t n = 0;
  if (hutch_db_template_list(req->ctx->db, &v, &n, &err) < 0) {
    hutch_api_error(resp, &err);
    return;
  }
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++) {
    json_array_append_new(arr, template_json(req->ctx, &v[i]));
    hutch_template_rec_free(&v[i]);
  }
  free(v);
  resp->status = 200;
  resp->json = json_pack("{s:o}", "templates", arr);
}

void hutch_h_template_get(struct hutch_req *req, struct hutch_resp *resp) {
  hutch_err err = HUTCH_ERR_INIT;
  struct hutch_template_rec t;
  if (hutch_db_template_get(req->ctx->db, req->params[0], &t, &err) < 0) {
    hutch_api_error(resp, &err);
    return;
  }
  resp->status = 200;
  resp->json = template_json(req->ctx, &t);
  hutch_template_rec_free(&t);
}

void hutch_h_template_create(struct hutch_req *req, struct hutch_resp *resp) {
  hutch_err err = HUTCH_ERR_INIT;
  json_t *body = hutch_api_body_object(req, &err);
  char name[64], op[64];
  if (body && req->tcp && json_object_get(body, "path")) {
    /* A host path names the daemon's files: only local admins may. */
    json_decref(body);
    hutch_api_errorf(resp, 403, "forbidden", "field `path`: host paths are accepted over the unix socket only");
    return;
  }
  if (!body || hutch_lc_template_create(req->ctx, body, name, op, &err) < 0) {
    json_decref(body);
    hutch_api_error(resp, &err);
    return;
  }
  json_decref(body);
  struct hutch_op_rec o;
  bool wait = hutch_api_wait(req);
  if (hutch_lc_wait(req->ctx, op, wait ? 3600000 : 0, &o, &err) < 0) {
    hutch_api_error(resp, &err);
    return;
  }
  if (wait && !strcmp(o.state, "failed")) {
    op_failed(resp, &o);
    hutch_op_rec_free(&o);
    return;
  }
  struct hutch_template_rec t;
  if (hutch_db_template_get(req->ctx->db, name, &t, &err) < 0) {
    hutch_op_rec_free(&o);
    hutch_api_error(resp, &err);
    return;
  }
  resp->status = wait && !strcmp(o.state, "succeeded") ? 201 : 202;
  resp->json = template_json(req->ctx, &t);
  json_object_set_new(resp->json, "operation", hutch_op_json(&o));
  hutch_template_rec_free(&t);
  hutch_op_rec_free(&o);
}

void hutch_h_template_delete(struct hutch_req *req, struct hutch_resp *resp) {
  hutch_err err = HUTCH_ERR_INIT;
  if (hutch_lc_template_delete(req->ctx, req->params[0], &err) < 0) {
    hutch_api_error(resp, &err);
    return;
  }
  hutch_log(LOG_INFO, "template.deleted", "name", req->params[0], NULL);
  resp->status = 204;
}

/* ---- export / import --------------------------------------------------------------- */

struct file_stream {
  int fd;
};

static ssize_t file_stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
  struct file_stream *f = cls;
  ssize_t n;
  do n = pread(f->fd, buf, max, (off_t)pos);
  while (n < 0 && errno == EINTR);
  if (n < 0) return HUTCH_STREAM_ERROR;
  return n == 0 ? HUTCH_STREAM_END : n;
}

static void file_stream_free(void *cls) {
  struct file_stream *f = cls;
  close(f->fd);
  free(f);
}

void hutch_h_snapshot_export(struct hutch_req *req, struct hutch_resp *resp) {
  struct hutch_ctx *ctx = req->ctx;
  hutch_err err = HUTCH_ERR_INIT;
  struct hutch_snapshot_rec s, par;
  if (hutch_db_snapshot_get(ctx->db, req->params[0], &s, &err) < 0) {
    hutch_api_error(resp, &err);
    return;
  }
  const char *parent = hutch_api_query(req, "parent");
  const char *inc = hutch_api_query(req, "incremental");
  if (!parent && inc && (!strcmp(inc, "true") || !strcmp(inc, "1")) && s.parent_id[0]) parent = s.parent_id;
  if (parent && hutch_db_snapshot_get(ctx->db, parent, &par, &err) < 0) {
    hutch_snapshot_rec_free(&s);
    if (err.status == 404) err.status = 400, snprintf(err.code, sizeof err.code, "invalid_argument");
    hutch_err_wrap(&err, "query `parent`");
    hutch_api_error(resp, &err);
    return;
  }
  if (parent) hutch_snapshot_rec_free(&par);
  if (strcmp(s.state, "ready")) {
    hutch_snapshot_rec_free(&s);
    hutch_api_errorf(resp, 409, "conflict", "snapshot `%.80s` is not ready", req->params[0]);
    return;
  }
  json_error_t je;
  json_t *meta = json_pack("{s:i, s:o}", "format", 1, "snapshot", hutch_snapshot_json(ctx, &s));
  json_t *sj = json_object_get(meta, "snapshot");
  json_object_del(sj, "exclusive_bytes");
  json_object_del(sj, "referenced_bytes");
  json_object_set_new(sj, "request", json_loads(s.request ? s.request : "{}", 0, &je));
  json_object_set_new(meta, "incremental_to", parent ? json_string(parent) : json_null());
  cleanup_free char *meta_s = json_dumps(meta, JSON_COMPACT | JSON_SORT_KEYS);
  json_decref(meta);
  cleanup_free char *staging = hutch_pool_path(&ctx->pool, "staging", NULL);
  int fd = open(staging, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    hutch_snapshot_rec_free(&s);
    hutch_err_sys(&err, errno, "temporary file in `%s`", staging);
    hutch_api_error(resp, &err);
    return;
  }
  struct hutch_export_stats st;
  uint64_t t0 = mono_us();
  int rc = hutch_snapshot_export(&ctx->pool, s.id, parent, meta_s, fd, &st, &err);
  hutch_snapshot_rec_free(&s);
  if (rc < 0) {
    close(fd);
    hutch_api_error(resp, &err);
    return;
  }
  char ms[32], raw[32], tot[32];
  snprintf(ms, sizeof ms, "%.1f", (double)(mono_us() - t0) / 1000.0);
  snprintf(raw, sizeof raw, "%llu", (unsigned long long)st.raw_bytes);
  snprintf(tot, sizeof tot, "%llu", (unsigned long long)st.total_bytes);
  hutch_log(LOG_INFO, "snapshot.exported", "id", req->params[0], "parent", parent ? parent : "-", "send_bytes", raw,
            "archive_bytes", tot, "dur_ms", ms, NULL);
  struct file_stream *f = xmalloc(sizeof *f);
  f->fd = fd;
  resp->status = 200;
  resp->stream = (struct hutch_stream){.read = file_stream_read, .free = file_stream_free, .cls = f,
                                       .size = st.total_bytes, .content_type = "application/vnd.hutch.snapshot"};
}

struct import_upload {
  struct hutch_ctx *ctx;
  int fd;
  uint64_t size;
};

static void *import_begin(struct hutch_req *req, struct hutch_resp *resp) {
  struct hutch_ctx *ctx = req->ctx;
  if (ctx->pool.kind != HUTCH_POOL_BTRFS) {
    hutch_api_errorf(resp, 501, "not_supported", "import needs the btrfs storage backend (this pool: overlay)");
    return NULL;
  }
  cleanup_free char *staging = hutch_pool_path(&ctx->pool, "staging", NULL);
  int fd = open(staging, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    hutch_api_errorf(resp, 500, "internal", "temporary file in `%s`: %s", staging, strerror(errno));
    return NULL;
  }
  struct import_upload *u = xcalloc(1, sizeof *u);
  u->ctx = ctx;
  u->fd = fd;
  return u;
}

static int import_data(void *state, const char *buf, size_t n, struct hutch_resp *resp) {
  struct import_upload *u = state;
  if (u->size + n > IMPORT_MAX) {
    hutch_api_errorf(resp, 413, "payload_too_large", "an import is at most %llu bytes",
                     (unsigned long long)IMPORT_MAX);
    return -1;
  }
  if (write_full(u->fd, buf, n) < 0) {
    hutch_api_errorf(resp, 500, "internal", "write the upload: %s", strerror(errno));
    return -1;
  }
  u->size += n;
  return 0;
}

static void import_abort(void *state) {
  struct import_upload *u = state;
  if (!u) return;
  close(u->fd);
  free(u);
}

static const char *meta_str(json_t *o, const char *k) {
  const char *s = json_string_value(json_object_get(o, k));
  return s ? s : "";
}

static void import_end(void *state, struct hutch_req *req, struct hutch_resp *resp) {
  struct import_upload *u = state;
  struct hutch_ctx *ctx = u->ctx;
  hutch_err err = HUTCH_ERR_INIT;
  cleanup_free char *meta_s = NULL;
  json_t *meta = NULL;
  struct hutch_snapshot_rec s;
  memset(&s, 0, sizeof s);
  if (hutch_snapshot_import_verify(u->fd, &meta_s, &err) < 0) goto fail;
  json_error_t je;
  meta = json_loads(meta_s, 0, &je);
  json_t *sj = json_object_get(meta, "snapshot");
  const char *id = meta_str(sj, "id"), *sb = meta_str(sj, "sandbox"), *tpl = meta_str(sj, "template");
  const char *parent = json_string_value(json_object_get(meta, "incremental_to"));
  if (!json_is_object(sj) || !hutch_snapshot_id_valid(id) || strlen(sb) >= sizeof s.sandbox_id ||
      !hutch_template_valid_name(tpl) || (parent && !hutch_snapshot_id_valid(parent))) {
    hutch_err_set(&err, 400, "invalid_archive", "the archive's metadata does not describe a hutch snapshot");
    goto fail;
  }
  struct hutch_snapshot_rec have;
  if (hutch_db_snapshot_get(ctx->db, id, &have, &err) == 0) {
    hutch_snapshot_rec_free(&have);
    hutch_err_set(&err, 409, "conflict", "snapshot `%s` already exists on this host", id);
    goto fail;
  }
  hutch_err_clear(&err);
  if (parent && hutch_db_snapshot_get(ctx->db, parent, &have, &err) < 0) {
    hutch_err_set(&err, 409, "conflict", "snapshot `%s` is incremental to `%s`, which is not on this host: import it first",
                  id, parent);
    goto fail;
  }
  if (parent) hutch_snapshot_rec_free(&have);
  if (hutch_snapshot_import_receive(&ctx->pool, u->fd, id, &err) < 0) goto fail;
  snprintf(s.id, sizeof s.id, "%s", id);
  snprintf(s.sandbox_id, sizeof s.sandbox_id, "%s", sb);
  snprintf(s.parent_id, sizeof s.parent_id, "%s", parent ? parent : "");
  snprintf(s.template_name, sizeof s.template_name, "%s", tpl);
  snprintf(s.kind, sizeof s.kind, "imported");
  snprintf(s.state, sizeof s.state, "ready");
  json_t *labels = json_object_get(sj, "labels");
  json_t *request = json_object_get(sj, "request");
  s.labels = json_is_object(labels) ? json_dumps(labels, JSON_COMPACT | JSON_SORT_KEYS) : xstrdup("{}");
  s.request = json_is_object(request) ? json_dumps(request, JSON_COMPACT | JSON_SORT_KEYS) : xstrdup("{}");
  s.created_at = now_ms();
  if (hutch_db_snapshot_insert(ctx->db, &s, &err) < 0) {
    cleanup_free char *path = hutch_pool_path(&ctx->pool, "snapshots", id);
    hutch_err e2 = HUTCH_ERR_INIT;
    hutch_pool_volume_remove(&ctx->pool, path, &e2);
    goto fail;
  }
  hutch_log(LOG_INFO, "snapshot.imported", "id", id, "parent", parent ? parent : "-", NULL);
  hutch_events_publish_snapshot(id, sb, "ready");
  snapshot_reply(req, resp, id, 201);
  hutch_snapshot_rec_free(&s);
  json_decref(meta);
  import_abort(u);
  return;
fail:
  hutch_snapshot_rec_free(&s);
  json_decref(meta);
  import_abort(u);
  hutch_api_error(resp, &err);
}

const struct hutch_upload_ops hutch_u_snapshot_import = {import_begin, import_data, import_end, import_abort};

/* ---- the pool ---------------------------------------------------------------------- */

void hutch_h_storage(struct hutch_req *req, struct hutch_resp *resp) {
  struct hutch_ctx *ctx = req->ctx;
  hutch_err err = HUTCH_ERR_INIT;
  struct hutch_pool_stats st;
  const char *sync = hutch_api_query(req, "sync");
  if (hutch_pool_stats(&ctx->pool, sync && !strcmp(sync, "true"), &st, &err) < 0) {
    hutch_api_error(resp, &err);
    return;
  }
  resp->status = 200;
  resp->json = json_pack("{s:s, s:s, s:o, s:b, s:s, s:I, s:I, s:o}", "backend", hutch_pool_kind_name(&ctx->pool),
                         "path", ctx->pool.root, "image", ctx->pool.image ? json_string(ctx->pool.image) : json_null(),
                         "quotas", ctx->pool.quotas, "quota_mode",
                         !ctx->pool.quotas ? "off" : ctx->pool.quota_simple ? "simple" : "full", "size_bytes", (json_int_t)st.size_bytes, "used_bytes",
                         (json_int_t)st.used_bytes, "fallback_reason",
                         ctx->pool.why_overlay[0] ? json_string(ctx->pool.why_overlay) : json_null());
}

/* ---- runtimes ------------------------------------------------------------------- */

json_t *hutch_runtime_json(const struct hutch_runtime_ops *r) {
  char why[512] = "";
  bool ok = r->available(why, sizeof why);
  json_t *o = json_pack("{s:s, s:b, s:{s:b, s:b, s:b}}", "name", r->name, "available", ok, "capabilities", "pause",
                        (r->caps & HUTCH_RT_CAP_PAUSE) != 0, "memory_checkpoint",
                        (r->caps & HUTCH_RT_CAP_MEMORY_CHECKPOINT) != 0, "fork_memory",
                        (r->caps & HUTCH_RT_CAP_FORK_MEMORY) != 0);
  json_object_set_new(o, "reason", ok ? json_null() : json_string(why));
  return o;
}

void hutch_h_runtimes(struct hutch_req *req, struct hutch_resp *resp) {
  (void)req;
  json_t *arr = json_array();
  for (const struct hutch_runtime_ops *const *r = hutch_runtimes(); *r; r++)
    json_array_append_new(arr, hutch_runtime_json(*r));
  const struct hutch_runtime_ops *a = hutch_runtime_get("auto");
  resp->status = 200;
  resp->json = json_pack("{s:o, s:o}", "runtimes", arr, "auto", a ? json_string(a->name) : json_null());
}
