/* POST /v1/sandboxes/{id}/{pause|resume|stop|start|suspend|restore|wake}
 * (docs/api.md "Lifecycle", docs/lifecycle.md). */
#include <string.h>

#include "api/api.h"
#include "api/resources.h"
#include "common/util.h"

#define WAIT_LIFECYCLE_MS 120000

void hutch_h_sandbox_verb(struct hutch_req *req, struct hutch_resp *resp) {
  const char *verb = strrchr(req->path, '/') + 1;
  hutch_err err = HUTCH_ERR_INIT;
  json_t *body = hutch_api_body_object(req, &err);
  if (!body || json_object_size(body)) {
    if (body) hutch_err_invalid(&err, "field `%s`: unknown field (this call takes no body)", json_object_iter_key(json_object_iter(body)));
    json_decref(body);
    hutch_api_error(resp, &err);
    return;
  }
  json_decref(body);
  char op[64];
  int r = hutch_lc_verb(req->ctx, req->params[0], verb, op, &err);
  if (r < 0) {
    hutch_api_error(resp, &err);
    return;
  }
  struct hutch_op_rec o;
  if (hutch_lc_wait(req->ctx, op, hutch_api_wait(req) ? WAIT_LIFECYCLE_MS : 0, &o, &err) < 0) {
    hutch_api_error(resp, &err);
    return;
  }
  bool done = !strcmp(o.state, "succeeded") || !strcmp(o.state, "failed");
  if (hutch_api_wait(req) && !strcmp(o.state, "failed")) {
    err.status = o.err_status ? o.err_status : 500;
    snprintf(err.code, sizeof err.code, "%s", o.err_code[0] ? o.err_code : "internal");
    snprintf(err.msg, sizeof err.msg, "%s", o.err_msg ? o.err_msg : "operation failed");
    hutch_api_error(resp, &err);
    json_object_set_new(resp->json, "operation", hutch_op_json(&o));
    hutch_op_rec_free(&o);
    return;
  }
  struct hutch_sandbox_rec s;
  if (hutch_lc_get(req->ctx, req->params[0], &s, &err) < 0) {
    hutch_op_rec_free(&o);
    hutch_api_error(resp, &err);
    return;
  }
  if (hutch_api_wait(req) && done) {
    resp->status = 200;
    resp->json = hutch_sandbox_json(req->ctx, &s);
    json_object_set_new(resp->json, "operation", hutch_op_json(&o));
  } else {
    resp->status = 202;
    resp->json = json_pack("{s:s, s:s, s:o}", "id", s.id, "state", s.state, "operation", hutch_op_json(&o));
  }
  hutch_sandbox_rec_free(&s);
  hutch_op_rec_free(&o);
}
