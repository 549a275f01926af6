#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "api/resources.h"
#include "common/util.h"

json_t *hutch_op_json(const struct hutch_op_rec *op) {
  char c[32], f[32];
  iso8601(op->created_at, c);
  iso8601(op->finished_at, f);
  json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:s, s:o}", "id", op->id, "kind", op->kind, "sandbox_id",
                        op->sandbox_id, "state", op->state, "created_at", c, "finished_at",
                        op->finished_at ? json_string(f) : json_null());
  if (!strcmp(op->state, "failed"))
    json_object_set_new(o, "error",
                        json_pack("{s:s, s:s, s:i}", "code", op->err_code[0] ? op->err_code : "internal", "message",
                                  op->err_msg ? op->err_msg : "", "status", op->err_status ? op->err_status : 500));
  else json_object_set_new(o, "error", json_null());
  return o;
}

void hutch_h_operation_get(struct hutch_req *req, struct hutch_resp *resp) {
  hutch_err err = HUTCH_ERR_INIT;
  uint64_t wait_s = 0;
  const char *w = hutch_api_query(req, "wait");
  if (w && parse_u64(w, 300, &wait_s) < 0) {
    hutch_api_errorf(resp, 400, "invalid_argument", "query `wait`: expected seconds between 0 and 300");
    return;
  }
  struct hutch_op_rec op;
  if (hutch_lc_wait(req->ctx, req->params[0], wait_s * 1000, &op, &err) < 0) {
    hutch_api_error(resp, &err);
    return;
  }
  resp->status = 200;
  resp->json = hutch_op_json(&op);
  hutch_op_rec_free(&op);
}
