/* JSON views of hutch's resources, shared by the handlers. */
#ifndef HUTCH_API_RESOURCES_H
#define HUTCH_API_RESOURCES_H

#include <jansson.h>

#include "lifecycle/daemon.h"
#include "store/db.h"

json_t *hutch_op_json(const struct hutch_op_rec *op);
json_t *hutch_sandbox_json(struct hutch_ctx *ctx, const struct hutch_sandbox_rec *r);

#endif
