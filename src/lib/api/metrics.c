#include "api/api.h"

void hutch_h_sandbox_metrics(struct hutch_req *req, struct hutch_resp *resp) {
  hutch_api_errorf(resp, 501, "not_implemented", "not implemented yet");
}
void hutch_h_metrics(struct hutch_req *req, struct hutch_resp *resp) {
  hutch_api_errorf(resp, 501, "not_implemented", "not implemented yet");
}
void hutch_metrics_observe_request(const char *method, const char *route, int status, double seconds) {}
