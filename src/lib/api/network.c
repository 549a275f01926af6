/* A sandbox's egress (docs/api.md "Network"): its policy, changed live, and
 * the gateway's decisions about it. */
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "common/util.h"
#include "lifecycle/egress.h"

void hutch_h_network_get(struct hutch_req *req, struct hutch_resp *resp) {
  hutch_err err = HUTCH_ERR_INIT;
  struct hutch_sandbox_rec r;
  if (hutch_lc_get(req->ctx, req->params[0], &r, &err) < 0) {
    hutch_api_error(resp, &err);
    return;
  }
  json_error_t je;
  json_t *rq = json_loads(r.request, 0, &je);
  json_t *net = json_object_get(rq, "network");
  resp->status = 200;
  resp->json = json_is_object(net) ? json_incref(net) : json_pack("{s:s}", "egress", "none");
  json_decref(rq);
  hutch_sandbox_rec_free(&r);
}

void hutch_h_network_put(struct hutch_req *req, struct hutch_resp *resp) {
  struct hutch_ctx *ctx = req->ctx;
  hutch_err err = HUTCH_ERR_INIT;
  json_t *body = hutch_api_body_object(req, &err);
  json_t *net = NULL;
  struct hutch_sandbox_rec r;
  if (!body || hutch_egress_parse(body, &net, &err) < 0 || hutch_lc_get(ctx, req->params[0], &r, &err) < 0) {
    json_decref(body);
    json_decref(net);
    hutch_api_error(resp, &err);
    return;
  }
  json_decref(body);
  if (hutch_egress_wanted_json(net) && (!ctx->cfg.egress || !strcmp(r.runtime, "gvisor"))) {
    hutch_sandbox_rec_free(&r);
    json_decref(net);
    if (!ctx->cfg.egress)
      hutch_api_errorf(resp, 409, "conflict", "egress is turned off on this hutchd (--no-egress)");
    else
      hutch_api_errorf(resp, 400, "invalid_argument", "field `egress`: the gvisor runtime has loopback only for now");
    return;
  }
  hutch_sandbox_rec_free(&r);
  cleanup_free char *s = json_dumps(net, JSON_COMPACT | JSON_SORT_KEYS);
  if (hutch_db_sandbox_set_field(ctx->db, req->params[0], "network", s, &err) < 0 ||
      hutch_lc_get(ctx, req->params[0], &r, &err) < 0) {
    json_decref(net);
    hutch_api_error(resp, &err);
    return;
  }
  /* Live: the gateway gets the new policy now (a sandbox that had none gets
   * its way out, one that gets none loses it). */
  int rc = hutch_egress_update(ctx, &r, &err);
  hutch_sandbox_rec_free(&r);
  if (rc < 0) {
    json_decref(net);
    hutch_api_error(resp, &err);
    return;
  }
  resp->status = 200;
  resp->json = net;
}

void hutch_h_egress_log(struct hutch_req *req, struct hutch_resp *resp) {
  hutch_err err = HUTCH_ERR_INIT;
  struct hutch_sandbox_rec r;
  if (hutch_lc_get(req->ctx, req->params[0], &r, &err) < 0) {
    hutch_api_error(resp, &err);
    return;
  }
  hutch_sandbox_rec_free(&r);
  uint64_t limit = 1000;
  const char *l = hutch_api_query(req, "limit");
  if (l && (parse_u64(l, 100000, &limit) < 0 || limit == 0)) {
    hutch_api_errorf(resp, 400, "invalid_argument", "query `limit`: an integer from 1 to 100000");
    return;
  }
  json_t *arr = hutch_egress_audit(req->ctx, req->params[0], (size_t)limit, &err);
  if (!arr) {
    hutch_api_error(resp, &err);
    return;
  }
  resp->status = 200;
  resp->json = json_pack("{s:o}", "decisions", arr);
}
