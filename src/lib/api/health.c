#include <stdlib.h>
#include <string.h>

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
  struct hutch_sandbox_rec *v = NULL;
  size_t n = 0, ready = 0;
  hutch_err err = HUTCH_ERR_INIT;
  if (hutch_db_sandbox_list(req->ctx->db, "pool", &v, &n, &err) == 0)
    for (size_t i = 0; i < n; i++) {
      if (!strcmp(v[i].template_name, req->ctx->cfg.pool_template)) ready++;
      hutch_sandbox_rec_free(&v[i]);
    }
  free(v);
  resp->status = 200;
  resp->json = json_pack("{s:s, s:s, s:s, s:s, s:o, s:{s:s, s:i, s:i}}", "status", "ok", "version", HUTCH_VERSION,
                         "instance", req->ctx->instance, "cgroup", req->ctx->cgroup_version, "runtimes", rts, "pool",
                         "template", req->ctx->cfg.pool_template, "size", (int)req->ctx->cfg.pool_size, "ready",
                         (int)ready);
}
