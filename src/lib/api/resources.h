/* JSON views of hutch's resources, shared by the handlers. */
#ifndef HUTCH_API_RESOURCES_H
#define HUTCH_API_RESOURCES_H

#include <jansson.h>
#include <stdbool.h>

#include "lifecycle/daemon.h"
#include "store/db.h"

json_t *hutch_op_json(const struct hutch_op_rec *op);
json_t *hutch_sandbox_json(struct hutch_ctx *ctx, const struct hutch_sandbox_rec *r);
json_t *hutch_snapshot_json(struct hutch_ctx *ctx, const struct hutch_snapshot_rec *s); /* api/storage.c */
struct hutch_runtime_ops;
/* {"name","available","capabilities":{…},"reason"} (api/storage.c). */
json_t *hutch_runtime_json(const struct hutch_runtime_ops *r);
/* A label key: [A-Za-z0-9_.-/]{1,63}. */
bool hutch_label_key_ok(const char *k);

#endif
