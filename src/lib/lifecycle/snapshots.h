/* Snapshots of sandboxes' files, rollback, fork, automatic snapshots
 * (docs/storage.md). */
#ifndef HUTCH_SNAPSHOTS_H
#define HUTCH_SNAPSHOTS_H

#include <jansson.h>
#include <stdint.h>

#include "common/err.h"
#include "lifecycle/daemon.h"

/* Validate an automatic snapshot policy {"interval_s","keep_last","hourly",
 * "daily"} (missing fields take the defaults) into *out (new reference). */
int hutch_snapshot_policy_parse(json_t *in, json_t **out, hutch_err *err);
/* The sandbox's policy (defaults, interval 0, when it has none). */
json_t *hutch_snapshot_policy_of(const struct hutch_sandbox_rec *r);

/* A snapshot row in state `creating` for sandbox `r` (parent: its newest
 * snapshot, or the one it was made from). */
int hutch_snapshot_row_new(struct hutch_ctx *ctx, const struct hutch_sandbox_rec *r, const char *kind,
                           json_t *labels, char snap_id[64], hutch_err *err);
/* Accept a snapshot of sandbox `sb_id` (kind manual, auto, fork or full —
 * memory and files, on runtimes that checkpoint memory): the row
 * is made in state `creating` and an operation queued. */
int hutch_lc_snapshot(struct hutch_ctx *ctx, const char *sb_id, const char *kind, json_t *labels,
                      char snap_id[64], char op_id[64], hutch_err *err);
int hutch_lc_snapshot_delete(struct hutch_ctx *ctx, const char *snap_id, hutch_err *err);
/* 409 for a running sandbox (pause or stop it first). */
int hutch_lc_rollback(struct hutch_ctx *ctx, const char *sb_id, const char *snap_id, char op_id[64],
                      hutch_err *err);

struct hutch_fork_result {
  char snapshot[64]; /* the snapshot the copies are made from */
  char (*ids)[64];
  char (*ops)[64];
  uint32_t n;
};
/* `count` new sandboxes from the sandbox's current state (a snapshot taken
 * now) or from its snapshot `snap` (may be NULL); labels merge over the
 * parent's.  On failure part-way, out->n says how many were accepted. */
int hutch_lc_fork(struct hutch_ctx *ctx, const char *sb_id, uint32_t count, const char *snap, json_t *labels,
                  struct hutch_fork_result *out, hutch_err *err);
void hutch_fork_result_free(struct hutch_fork_result *f);

/* Reaper tick: take a due automatic snapshot of `r` (when its root changed)
 * and apply the retention policy. */
void hutch_lc_auto_snapshots(struct hutch_ctx *ctx, const struct hutch_sandbox_rec *r, uint64_t now);

/* At start: snapshots left half-taken by a crash are removed, rows whose
 * files are gone dropped. */
void hutch_snapshots_reconcile(struct hutch_ctx *ctx);

/* Keep the newest `keep_full` (policy, default 3) full snapshots of a
 * sandbox, always `keep` and the one its pending restore needs; delete the
 * older ones. */
void hutch_snapshots_retire_full(struct hutch_ctx *ctx, const char *sb_id, const char *keep);

/* lifecycle/templates.c */
int hutch_lc_templates_init(struct hutch_ctx *ctx, hutch_err *err);
/* Accept a template build from a request body (docs/api.md). */
int hutch_lc_template_create(struct hutch_ctx *ctx, json_t *body, char name[64], char op_id[64], hutch_err *err);
int hutch_lc_template_delete(struct hutch_ctx *ctx, const char *name, hutch_err *err);

#endif
