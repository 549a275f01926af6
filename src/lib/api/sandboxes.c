#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "api/json.h"
#include "api/resources.h"
#include "lifecycle/egress.h"
#include "lifecycle/ops.h"
#include "lifecycle/snapshots.h"
#include "runtime/runtime.h"
#include "store/template.h"
#include "common/util.h"

#define WAIT_LIFECYCLE_MS 120000

static bool env_key_ok(const char *k) { return *k && !strchr(k, '=') && strlen(k) <= 256; }

bool hutch_label_key_ok(const char *k) {
  size_t n = strlen(k);
  if (n == 0 || n > 63) return false;
  for (const char *p = k; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || strchr("_.-/", *p)))
      return false;
  return true;
}

json_t *hutch_sandbox_json(struct hutch_ctx *ctx, const struct hutch_sandbox_rec *r) {
  json_error_t je;
  json_t *req = json_loads(r->request ? r->request : "{}", 0, &je);
  if (!req) req = json_object();
  char c[32], u[32], e[32];
  iso8601(r->created_at, c);
  iso8601(r->updated_at, u);
  iso8601(r->expires_at, e);
  json_t *host = json_pack("{s:I, s:I, s:o}", "init_pid", (json_int_t)r->init_pid, "shim_pid",
                           (json_int_t)r->shim_pid, "uid_base",
                           r->uid_slot >= 0 ? json_integer(hutch_uid_base_for_slot(ctx, r->uid_slot)) : json_null());
  json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:O, s:O, s:O, s:O, s:s, s:s, s:o, s:o, s:o, s:b}", "id", r->id, "state",
                        r->state, "template", r->template_name, "runtime", r->runtime, "resources",
                        json_object_get(req, "resources"), "env", json_object_get(req, "env"), "labels",
                        json_object_get(req, "labels"), "timeout_s", json_object_get(req, "timeout_s"),
                        "created_at", c, "updated_at", u, "expires_at",
                        r->expires_at ? json_string(e) : json_null(), "error",
                        r->error ? json_string(r->error) : json_null(), "host", host, "from_pool",
                        !strcmp(r->origin, "pool"));
  json_object_set(o, "from_snapshot", json_object_get(req, "from_snapshot") ?: json_null());
  json_t *netw = json_object_get(req, "network");
  json_object_set_new(o, "network", json_is_object(netw) ? json_incref(netw) : json_pack("{s:s}", "egress", "none"));
  /* What its runtime can do (docs/api.md): e.g. whether suspend keeps memory. */
  const struct hutch_runtime_ops *rt = hutch_runtime_get(r->runtime);
  if (rt)
    json_object_set_new(o, "capabilities",
                        json_pack("{s:b, s:b, s:b}", "pause", (rt->caps & HUTCH_RT_CAP_PAUSE) != 0,
                                  "memory_checkpoint", (rt->caps & HUTCH_RT_CAP_MEMORY_CHECKPOINT) != 0,
                                  "fork_memory", (rt->caps & HUTCH_RT_CAP_FORK_MEMORY) != 0));
  json_object_set(o, "checkpoint", json_object_get(req, "checkpoint") ?: json_null());
  const char *ot = json_string_value(json_object_get(req, "on_timeout"));
  json_object_set_new(o, "on_timeout", json_string(ot ? ot : "delete"));
  json_decref(req);
  return o;
}

static int parse_create(struct hutch_ctx *ctx, json_t *body, struct hutch_create_req *cr, hutch_err *err) {
  static const char *const top[] = {"template", "runtime", "resources",  "env",          "labels",
                                    "timeout_s", "on_timeout", "network", "from_snapshot", "snapshots", NULL};
  static const char *const res_fields[] = {"cpus", "memory_mib", "pids", "disk_mib", NULL};
  memset(cr, 0, sizeof *cr);
  cr->template_name = "host";
  cr->runtime = "auto";
  cr->cpus = 1;
  cr->memory_mib = 512;
  cr->pids = 256;
  cr->disk_mib = 2048;
  cr->timeout_s = ctx->cfg.default_timeout_s;
  if (hutch_json_only(body, "", top, err) < 0 || hutch_json_string(body, "", "template", 63, &cr->template_name, err) < 0 ||
      hutch_json_string(body, "", "runtime", 15, &cr->runtime, err) < 0 ||
      hutch_json_int(body, "", "timeout_s", 1, ctx->cfg.max_timeout_s, &cr->timeout_s, err) < 0 ||
      hutch_json_string_map(body, "", "env", 256, 32768, env_key_ok, "must be non-empty and must not contain `=`",
                            &cr->env, err) < 0 ||
      hutch_json_string_map(body, "", "labels", 64, 255, hutch_label_key_ok, "must match [A-Za-z0-9_.-/]{1,63}",
                            &cr->labels, err) < 0)
    return -1;
  json_t *res = json_object_get(body, "resources");
  if (res && !json_is_null(res)) {
    if (!json_is_object(res)) return hutch_err_invalid(err, "field `resources`: expected an object");
    if (hutch_json_only(res, "resources", res_fields, err) < 0 ||
        hutch_json_number(res, "resources", "cpus", 0.01, 64, &cr->cpus, err) < 0 ||
        hutch_json_int(res, "resources", "memory_mib", 16, 262144, &cr->memory_mib, err) < 0 ||
        hutch_json_int(res, "resources", "pids", 8, 65536, &cr->pids, err) < 0 ||
        hutch_json_int(res, "resources", "disk_mib", 64, 1 << 20, &cr->disk_mib, err) < 0)
      return -1;
  }
  const char *on_timeout = "delete";
  if (hutch_json_string(body, "", "on_timeout", 16, &on_timeout, err) < 0) return -1;
  if (strcmp(on_timeout, "delete") && strcmp(on_timeout, "suspend"))
    return hutch_err_invalid(err, "field `on_timeout`: expected \"delete\" or \"suspend\"");
  cr->on_timeout = on_timeout;
  json_t *net = json_object_get(body, "network");
  json_t *netn = NULL;
  if (hutch_egress_parse(net, &netn, err) < 0) return -1;
  json_object_set_new(body, "__network", netn);
  cr->network = json_object_get(body, "__network");
  if (hutch_egress_wanted_json(cr->network)) {
    if (!ctx->cfg.egress)
      return hutch_err_set(err, 409, "conflict",
                           "field `network.egress`: egress is turned off on this hutchd (--no-egress)");
    if (!strcmp(cr->runtime, "gvisor"))
      return hutch_err_invalid(err, "field `network.egress`: the gvisor runtime has loopback only for now");
  }
  const char *snap = NULL;
  if (hutch_json_string(body, "", "from_snapshot", 63, &snap, err) < 0) return -1;
  if (snap) {
    /* The root comes from the snapshot; so does the template (its /usr). */
    struct hutch_snapshot_rec s;
    if (hutch_db_snapshot_get(ctx->db, snap, &s, err) < 0) return hutch_err_wrap(err, "field `from_snapshot`");
    bool ready = !strcmp(s.state, "ready");
    const char *tpl = json_string_value(json_object_get(body, "template"));
    bool clash = tpl && strcmp(tpl, s.template_name);
    char tname[64];
    snprintf(tname, sizeof tname, "%s", s.template_name);
    hutch_snapshot_rec_free(&s);
    if (!ready) return hutch_err_set(err, 409, "conflict", "field `from_snapshot`: snapshot `%s` is not ready", snap);
    if (clash)
      return hutch_err_invalid(err, "fields `template` and `from_snapshot`: snapshot `%s` is of template `%s`", snap,
                               tname);
    if (ctx->pool.kind == HUTCH_POOL_OVERLAY && !hutch_template_exists(&ctx->pool, tname))
      return hutch_err_set(err, 409, "conflict", "snapshot `%s` needs template `%s`, which is not on this host", snap,
                           tname);
    cr->from_snapshot = snap;
    json_object_set_new(body, "__tpl", json_string(tname));
    cr->template_name = json_string_value(json_object_get(body, "__tpl"));
  }
  json_t *pol = json_object_get(body, "snapshots");
  if (pol && !json_is_null(pol)) {
    json_t *norm = NULL;
    if (hutch_snapshot_policy_parse(pol, &norm, err) < 0) return -1;
    json_object_set_new(body, "__snapshots", norm);
    cr->snapshots = json_object_get(body, "__snapshots");
  }
  if (!cr->env) cr->env = json_object_get(body, "env");
  return 0;
}

static json_t *accepted_json(const char *id, const char *state, struct hutch_ctx *ctx, const char *op_id) {
  struct hutch_op_rec op;
  hutch_err err = HUTCH_ERR_INIT;
  json_t *opj = hutch_db_op_get(ctx->db, op_id, &op, &err) == 0 ? hutch_op_json(&op) : json_pack("{s:s}", "id", op_id);
  if (!err.msg[0]) hutch_op_rec_free(&op);
  return json_pack("{s:s, s:s, s:o}", "id", id, "state", state, "operation", opj);
}

static void failed_op(struct hutch_resp *resp, const struct hutch_op_rec *op) {
  hutch_err e = HUTCH_ERR_INIT;
  e.status = op->err_status ? op->err_status : 500;
  snprintf(e.code, sizeof e.code, "%s", op->err_code[0] ? op->err_code : "internal");
  snprintf(e.msg, sizeof e.msg, "%s", op->err_msg ? op->err_msg : "operation failed");
  hutch_api_error(resp, &e);
  json_object_set_new(resp->json, "operation", hutch_op_json(op));
}

void hutch_h_sandbox_create(struct hutch_req *req, struct hutch_resp *resp) {
  hutch_err err = HUTCH_ERR_INIT;
  json_t *body = hutch_api_body_object(req, &err);
  struct hutch_create_req cr;
  char sb[64], op[64];
  json_t *empty = json_object();
  if (!body || parse_create(req->ctx, body, &cr, &err) < 0) goto fail;
  if (!cr.env) cr.env = empty;
  if (!cr.labels) cr.labels = empty;
  if (hutch_lc_create(req->ctx, &cr, sb, op, &err) < 0) goto fail;
  json_decref(body);
  json_decref(empty);
  if (!hutch_api_wait(req)) {
    resp->status = 202;
    resp->json = accepted_json(sb, "accepted", req->ctx, op);
    return;
  }
  struct hutch_op_rec o;
  if (hutch_lc_wait(req->ctx, op, WAIT_LIFECYCLE_MS, &o, &err) < 0) {
    hutch_api_error(resp, &err);
    return;
  }
  if (!strcmp(o.state, "failed")) {
    failed_op(resp, &o);
  } else if (!strcmp(o.state, "succeeded")) {
    struct hutch_sandbox_rec r;
    if (hutch_db_sandbox_get(req->ctx->db, sb, &r, &err) < 0) {
      hutch_api_error(resp, &err);
    } else {
      resp->status = 201;
      resp->json = hutch_sandbox_json(req->ctx, &r);
      hutch_sandbox_rec_free(&r);
    }
  } else {
    resp->status = 202; /* still in progress after the wait bound */
    resp->json = accepted_json(sb, "creating", req->ctx, op);
  }
  hutch_op_rec_free(&o);
  return;
fail:
  json_decref(body);
  json_decref(empty);
  hutch_api_error(resp, &err);
}

void hutch_h_sandbox_list(struct hutch_req *req, struct hutch_resp *resp) {
  hutch_err err = HUTCH_ERR_INIT;
  const char *labels[16];
  size_t nl = hutch_api_query_all(req, "label", labels, 16);
  const char *state = hutch_api_query(req, "state");
  for (size_t i = 0; i < nl; i++)
    if (!strchr(labels[i], '=')) {
      hutch_api_errorf(resp, 400, "invalid_argument", "query `label`: expected key=value, got `%.100s`", labels[i]);
      return;
    }
  if (state && *state && !hutch_state_known(state)) {
    hutch_api_errorf(resp, 400, "invalid_argument",
                     "query `state`: unknown state `%.64s` (see docs/lifecycle.md)", state);
    return;
  }
  struct hutch_sandbox_rec *v;
  size_t n;
  if (hutch_db_sandbox_list(req->ctx->db, state && *state ? state : NULL, &v, &n, &err) < 0) {
    hutch_api_error(resp, &err);
    return;
  }
  json_t *a = json_array();
  for (size_t i = 0; i < n; i++) {
    if (!strcmp(v[i].origin, "pool") && strcmp(v[i].state, "running") && strcmp(v[i].state, "deleting") &&
        strcmp(v[i].state, "error")) {
      hutch_sandbox_rec_free(&v[i]); /* an idle warm-pool member is nobody's sandbox yet */
      continue;
    }
    json_t *o = hutch_sandbox_json(req->ctx, &v[i]);
    json_t *lab = json_object_get(o, "labels");
    bool ok = true;
    for (size_t l = 0; l < nl && ok; l++) {
      const char *eq = strchr(labels[l], '=');
      cleanup_free char *k = xstrndup(labels[l], (size_t)(eq - labels[l]));
      json_t *val = json_object_get(lab, k);
      ok = val && json_is_string(val) && !strcmp(json_string_value(val), eq + 1);
    }
    if (ok) json_array_append_new(a, o);
    else json_decref(o);
    hutch_sandbox_rec_free(&v[i]);
  }
  free(v);
  resp->status = 200;
  resp->json = json_pack("{s:o}", "sandboxes", a);
}

void hutch_h_sandbox_get(struct hutch_req *req, struct hutch_resp *resp) {
  hutch_err err = HUTCH_ERR_INIT;
  struct hutch_sandbox_rec r;
  if (hutch_lc_get(req->ctx, req->params[0], &r, &err) < 0) {
    hutch_api_error(resp, &err);
    return;
  }
  resp->status = 200;
  resp->json = hutch_sandbox_json(req->ctx, &r);
  hutch_sandbox_rec_free(&r);
}

void hutch_h_sandbox_delete(struct hutch_req *req, struct hutch_resp *resp) {
  hutch_err err = HUTCH_ERR_INIT;
  char op[64];
  const char *id = req->params[0];
  if (hutch_lc_delete(req->ctx, id, op, &err) < 0) {
    hutch_api_error(resp, &err);
    return;
  }
  if (!hutch_api_wait(req)) {
    resp->status = 202;
    resp->json = accepted_json(id, "deleting", req->ctx, op);
    return;
  }
  struct hutch_op_rec o;
  if (hutch_lc_wait(req->ctx, op, WAIT_LIFECYCLE_MS, &o, &err) < 0) {
    hutch_api_error(resp, &err);
    return;
  }
  if (!strcmp(o.state, "failed")) failed_op(resp, &o);
  else if (!strcmp(o.state, "succeeded")) {
    resp->status = 200;
    resp->json = json_pack("{s:s, s:s, s:o}", "id", id, "state", "deleted", "operation", hutch_op_json(&o));
  } else {
    resp->status = 202;
    resp->json = accepted_json(id, "deleting", req->ctx, op);
  }
  hutch_op_rec_free(&o);
}

void hutch_h_sandbox_exec(struct hutch_req *req, struct hutch_resp *resp) {
  static const char *const fields[] = {"argv", "cmd", "env", "cwd", "timeout_s", "stdin", "max_output_bytes", NULL};
  hutch_err err = HUTCH_ERR_INIT;
  json_t *body = hutch_api_body_object(req, &err);
  const char **argv = NULL;
  size_t argc = 0;
  const char *cmd = NULL, *cwd = NULL, *in = NULL;
  json_t *env = NULL;
  int64_t timeout_s = 60, max_out = 1 << 20;
  if (!body || hutch_json_only(body, "", fields, &err) < 0 ||
      hutch_json_string_array(body, "", "argv", 4096, &argv, &argc, &err) < 0 ||
      hutch_json_string(body, "", "cmd", 1 << 20, &cmd, &err) < 0 ||
      hutch_json_string(body, "", "cwd", 4096, &cwd, &err) < 0 ||
      hutch_json_string(body, "", "stdin", req->ctx->cfg.max_body, &in, &err) < 0 ||
      hutch_json_int(body, "", "timeout_s", 1, 86400, &timeout_s, &err) < 0 ||
      hutch_json_int(body, "", "max_output_bytes", 0, 16 << 20, &max_out, &err) < 0 ||
      hutch_json_string_map(body, "", "env", 256, 32768, env_key_ok, "must be non-empty and must not contain `=`",
                            &env, &err) < 0)
    goto fail;
  if ((argv != NULL) == (cmd != NULL)) {
    hutch_err_invalid(&err, "exactly one of `argv` and `cmd` is required");
    goto fail;
  }
  if (argv && (argc == 0 || !*argv[0])) {
    hutch_err_invalid(&err, "field `argv`: must contain at least a non-empty program name");
    goto fail;
  }
  if (cmd && !*cmd) {
    hutch_err_invalid(&err, "field `cmd`: must not be empty");
    goto fail;
  }
  if (cwd && cwd[0] != '/') {
    hutch_err_invalid(&err, "field `cwd`: must be an absolute path");
    goto fail;
  }
  const char *sh_argv[] = {"/bin/sh", "-c", cmd, NULL};
  struct hutch_exec_opts o = {
      .argv = argv ? argv : sh_argv,
      .env = env,
      .cwd = cwd,
      .timeout_s = (uint32_t)timeout_s,
      .stdin_data = in,
      .stdin_len = in ? strlen(in) : 0,
      .max_output = (size_t)max_out,
  };
  struct hutch_exec_result r = {0};
  if (hutch_lc_exec(req->ctx, req->params[0], &o, &r, &err) < 0) {
    hutch_exec_result_free(&r);
    goto fail;
  }
  resp->status = 200;
  resp->json = json_pack("{s:o, s:o, s:b, s:o, s:o, s:b, s:I}", "exit_code",
                         r.signo ? json_null() : json_integer(r.exit_code), "signal",
                         r.signo ? json_integer(r.signo) : json_null(), "timed_out", r.timed_out, "stdout",
                         hutch_json_string_lossy(r.out, r.out_len), "stderr", hutch_json_string_lossy(r.errb, r.err_len),
                         "truncated", r.truncated, "duration_ms", (json_int_t)(r.duration_us / 1000));
  if (r.spawn_error) json_object_set_new(resp->json, "error", json_string(r.spawn_error));
  hutch_exec_result_free(&r);
  free(argv);
  json_decref(body);
  return;
fail:
  free(argv);
  json_decref(body);
  hutch_api_error(resp, &err);
}
