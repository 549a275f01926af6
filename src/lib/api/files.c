#include "api/api.h"

#define STUB(name) \
  void name(struct hutch_req *req, struct hutch_resp *resp) { hutch_api_errorf(resp, 501, "not_implemented", "not implemented yet"); }
STUB(hutch_h_files_get)
STUB(hutch_h_files_delete)
STUB(hutch_h_files_stat)
STUB(hutch_h_files_list)
STUB(hutch_h_files_mkdir)
STUB(hutch_h_files_move)
STUB(hutch_h_files_tar_get)
static void *nb(struct hutch_req *req, struct hutch_resp *resp) {
  hutch_api_errorf(resp, 501, "not_implemented", "not implemented yet");
  return NULL;
}
const struct hutch_upload_ops hutch_u_files_put = {nb, NULL, NULL, NULL};
const struct hutch_upload_ops hutch_u_files_tar_put = {nb, NULL, NULL, NULL};
