/* Lifecycle operations on one sandbox, run by the workers of daemon.c, one
 * at a time per sandbox (docs/lifecycle.md).
 *
 * Each operation first records its intent (the transitional state), then
 * acts in idempotent steps, then records the result; a crash anywhere is
 * reconciled at the next start (hutch_ops_reconcile).  Fault points
 * (HUTCH_FAULT) sit between the steps. */
#ifndef HUTCH_OPS_H
#define HUTCH_OPS_H

#include <stdbool.h>
#include <sys/types.h>

#include "common/err.h"
#include "lifecycle/daemon.h"
#include "store/db.h"

/* Run operation `kind` (create, pool_fill, delete, pause, resume, stop,
 * start, suspend, restore, wake, snapshot, rollback) on sandbox `sb_id`;
 * `arg` is the snapshot id of snapshot and rollback.  Kind `template`
 * builds template `sb_id` (lifecycle/templates.c). */
int hutch_ops_run(struct hutch_ctx *ctx, const char *kind, const char *sb_id, const char *arg, hutch_err *err);

/* lifecycle/templates.c */
int hutch_ops_template_build(struct hutch_ctx *ctx, const char *key, const char *source_json, hutch_err *err);
/* lifecycle/snapshots.c: a deleted sandbox's automatic snapshots go with it. */
void hutch_snapshots_drop_auto(struct hutch_ctx *ctx, const char *sb_id);

/* Every state a user's sandbox can be in (docs/lifecycle.md), NULL-terminated.
 * Warm-pool members waiting to be claimed are in state "pool", not listed. */
extern const char *const hutch_states[];
bool hutch_state_known(const char *state);
/* A state an operation is moving the sandbox out of (pausing, creating, …). */
bool hutch_state_transitional(const char *state);

/* What `wake` means for a sandbox in `state` (resume, start, restore, or
 * "wake" itself when there is nothing to do). */
const char *hutch_ops_wake_verb(const char *state);

/* Whether `verb` fits a sandbox in `state`: 0 it does, 1 nothing to do
 * (idempotent repeat), -1 it does not (err: 409 naming the state). */
int hutch_ops_fit(const char *verb, const char *state, const char *sb_id, hutch_err *err);

/* Bring one sandbox found at start-up in line with the host. */
void hutch_ops_reconcile(struct hutch_ctx *ctx, struct hutch_sandbox_rec *r);

/* The shim of a running or paused sandbox died: mark it `error`, release
 * its runtime resources, keep its files. */
void hutch_ops_shim_lost(struct hutch_ctx *ctx, const struct hutch_sandbox_rec *r);

/* Is `pid` the shim of sandbox `id`?  (Guards against pid reuse.) */
bool hutch_is_shim_of(pid_t pid, const char *id);

/* Release everything a sandbox holds on this host, files included.
 * Idempotent. */
int hutch_ops_release_all(struct hutch_ctx *ctx, const struct hutch_sandbox_rec *r, hutch_err *err);

void hutch_hostname_for(const char *id, char out[64]);

#endif
