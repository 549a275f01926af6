#include "api/api.h"

#define STUB(name) \
  void name(struct hutch_req *req, struct hutch_resp *resp) { hutch_api_errorf(resp, 501, "not_implemented", "not implemented yet"); }
STUB(hutch_h_cmd_start)
STUB(hutch_h_cmd_list)
STUB(hutch_h_cmd_get)
STUB(hutch_h_cmd_attach)
STUB(hutch_h_cmd_signal)
STUB(hutch_h_cmd_resize)
STUB(hutch_h_cmd_wait)
static void *nb(struct hutch_req *req, struct hutch_resp *resp) {
  hutch_api_errorf(resp, 501, "not_implemented", "not implemented yet");
  return NULL;
}
const struct hutch_upload_ops hutch_u_cmd_stdin = {nb, NULL, NULL, NULL};
bool hutch_attach_token_valid(struct hutch_ctx *ctx, const char *token, const char *sb_id, const char *cmd_id) {
  return false;
}
