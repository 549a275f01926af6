#include <stdlib.h>

#include "api/api.h"

bool hutch_api_open_shim(struct hutch_req *req, struct hutch_resp *resp, struct hutch_shim_conn *c, int timeout_s,
                         struct hutch_sandbox_rec *rec) {
  hutch_err err = HUTCH_ERR_INIT;
  struct hutch_sandbox_rec r;
  if (hutch_lc_get_running(req->ctx, req->params[0], &r, &err) < 0) {
    hutch_api_error(resp, &err);
    return false;
  }
  char *sock = hutch_shim_socket(req->ctx, req->params[0]);
  int rc = hutch_shim_conn_open(c, sock, timeout_s, &err);
  free(sock);
  if (rc < 0) {
    hutch_sandbox_rec_free(&r);
    hutch_api_error(resp, &err);
    return false;
  }
  if (rec) *rec = r;
  else hutch_sandbox_rec_free(&r);
  return true;
}
