#include "api/api.h"
#include "runtime/runtime.h"

void hutch_h_health(struct hutch_req *req, struct hutch_resp *resp) {
  json_t *rts = json_object();
  for (const struct hutch_runtime_ops *const *r = hutch_runtimes(); *r; r++) {
    char why[512] = "";
    bool ok = (*r)->available(why, sizeof why);
    json_t *o = json_pack("{s:b, s:{s:b, s:b, s:b}}", "available", ok, "capabilities", "pause",
                          ((*r)->caps & HUTCH_RT_CAP_PAUSE) != 0, "memory_checkpoint",
                          ((*r)->caps & HUTCH_RT_CAP_MEMORY_CHECKPOINT) != 0, "fork_memory",
                          ((*r)->caps & HUTCH_RT_CAP_FORK_MEMORY) != 0);
    if (!ok) json_object_set_new(o, "reason", json_string(why));
    json_object_set_new(rts, (*r)->name, o);
  }
  resp->status = 200;
  resp->json = json_pack("{s:s, s:s, s:s, s:s, s:o}", "status", "ok", "version", HUTCH_VERSION, "instance",
                         req->ctx->instance, "cgroup", req->ctx->cgroup_version, "runtimes", rts);
}
