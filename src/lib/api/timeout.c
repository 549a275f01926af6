/* POST /v1/sandboxes/{id}/timeout {"timeout_s":N}: the sandbox now expires
 * N seconds from now.  The reaper (lifecycle/daemon.c) deletes running
 * sandboxes whose expires_at has passed. */
#include <string.h>

#include "api/api.h"
#include "api/json.h"
#include "api/resources.h"
#include "common/util.h"

static void not_running(struct hutch_resp *resp, const char *id, const char *state) {
  hutch_api_errorf(resp, 409, "conflict", "sandbox `%s` is %s, not running", id, state);
}

void hutch_h_sandbox_timeout(struct hutch_req *req, struct hutch_resp *resp) {
  static const char *const fields[] = {"timeout_s", NULL};
  struct hutch_ctx *ctx = req->ctx;
  const char *id = req->params[0];
  hutch_err err = HUTCH_ERR_INIT;
  int64_t timeout_s = -1;
  json_t *body = hutch_api_body_object(req, &err);
  if (!body || hutch_json_only(body, "", fields, &err) < 0 ||
      hutch_json_int(body, "", "timeout_s", 1, ctx->cfg.max_timeout_s, &timeout_s, &err) < 0) {
    json_decref(body);
    hutch_api_error(resp, &err);
    return;
  }
  json_decref(body);
  if (timeout_s < 0) {
    hutch_api_errorf(resp, 400, "invalid_argument", "field `timeout_s`: required (seconds, 1 to %u)",
                     ctx->cfg.max_timeout_s);
    return;
  }
  struct hutch_sandbox_rec r;
  if (hutch_lc_get(ctx, id, &r, &err) < 0) {
    hutch_api_error(resp, &err);
    return;
  }
  bool running = !strcmp(r.state, "running");
  if (!running) not_running(resp, id, r.state);
  hutch_sandbox_rec_free(&r);
  if (!running) return;
  int rc = hutch_db_sandbox_set_expiry(ctx->db, id, now_ms() + (uint64_t)timeout_s * 1000u, timeout_s, &err);
  if (rc == 0) rc = hutch_lc_get(ctx, id, &r, &err);
  if (rc < 0) {
    hutch_api_error(resp, &err);
    return;
  }
  if (rc == 1) { /* it left `running` between the two statements */
    if (hutch_lc_get(ctx, id, &r, &err) < 0) {
      hutch_api_error(resp, &err);
      return;
    }
    not_running(resp, id, r.state);
    hutch_sandbox_rec_free(&r);
    return;
  }
  resp->status = 200;
  resp->json = hutch_sandbox_json(ctx, &r);
  hutch_sandbox_rec_free(&r);
}
