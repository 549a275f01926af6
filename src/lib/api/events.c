#include "api/api.h"

void hutch_h_events(struct hutch_req *req, struct hutch_resp *resp) {
  hutch_api_errorf(resp, 501, "not_implemented", "not implemented yet");
}
