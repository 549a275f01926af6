#include "api/api.h"

void hutch_h_sandbox_timeout(struct hutch_req *req, struct hutch_resp *resp) {
  hutch_api_errorf(resp, 501, "not_implemented", "not implemented yet");
}
