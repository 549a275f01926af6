/* hutchd's state in SQLite (WAL), with a schema version and migrations.
 *
 * The database is the source of truth for what hutch has promised: which
 * sandboxes exist and in which state, every operation and its outcome, API
 * key hashes.  Runtime facts (processes, cgroups) are reconciled against it
 * at start-up.
 *
 * Thread safety: one connection opened in serialized mode; every function
 * may be called from any thread.  Records are plain structs the caller owns
 * (free with the matching *_free).
 */
#ifndef HUTCH_DB_H
#define HUTCH_DB_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"

struct hutch_db;

#define HUTCH_DB_SCHEMA_VERSION 3

int hutch_db_open(const char *path, struct hutch_db **out, hutch_err *err);
void hutch_db_close(struct hutch_db *db);
int hutch_db_schema_version(struct hutch_db *db);

struct hutch_sandbox_rec {
  char id[64];
  char state[16];
  char template_name[64];
  char runtime[16];
  char *request;  /* normalized create request (JSON): resources, env, labels, timeout_s */
  char *error;    /* NULL unless state is error */
  int64_t uid_slot; /* -1 when none */
  int64_t shim_pid, init_pid;
  uint64_t created_at, updated_at, expires_at; /* ms since epoch */
  char origin[8]; /* "api", or "pool" for sandboxes made ahead of demand */
};
void hutch_sandbox_rec_free(struct hutch_sandbox_rec *r);

int hutch_db_sandbox_insert(struct hutch_db *db, const struct hutch_sandbox_rec *r, hutch_err *err);
/* 404 not_found when absent. */
int hutch_db_sandbox_get(struct hutch_db *db, const char *id, struct hutch_sandbox_rec *out, hutch_err *err);
/* All sandboxes (optionally only those in `state`), oldest first.  *out is
 * an array of *n records; free each and the array. */
int hutch_db_sandbox_list(struct hutch_db *db, const char *state, struct hutch_sandbox_rec **out, size_t *n,
                          hutch_err *err);
int hutch_db_sandbox_set_state(struct hutch_db *db, const char *id, const char *state, const char *error,
                               hutch_err *err);
int hutch_db_sandbox_set_host(struct hutch_db *db, const char *id, int64_t uid_slot, int64_t shim_pid,
                              int64_t init_pid, hutch_err *err);
int hutch_db_sandbox_delete(struct hutch_db *db, const char *id, hutch_err *err);
/* A running sandbox now expires at `expires_at` (ms since epoch); its stored
 * request's timeout_s becomes `timeout_s`.  One statement, conditional on
 * state 'running', so it cannot revive a sandbox being deleted.  Returns 0
 * when updated, 1 when no running sandbox has this id, -1 on error. */
/* The deadline has been acted on (expiry deletes or suspends once). */
int hutch_db_sandbox_clear_expiry(struct hutch_db *db, const char *id, hutch_err *err);
int hutch_db_sandbox_set_expiry(struct hutch_db *db, const char *id, uint64_t expires_at, int64_t timeout_s,
                                hutch_err *err);
int64_t hutch_db_sandbox_count(struct hutch_db *db);
/* Set (json_value: JSON text) or remove (NULL) a top-level field of the
 * stored request; `field` is a constant of hutch's, not user input. */
int hutch_db_sandbox_set_field(struct hutch_db *db, const char *id, const char *field, const char *json_value,
                               hutch_err *err);
/* The stored request's automatic snapshot policy becomes `policy_json`. */
int hutch_db_sandbox_set_snapshot_policy(struct hutch_db *db, const char *id, const char *policy_json,
                                         hutch_err *err);

/* Warm pool.  Claim the oldest idle pool sandbox of `template_name`: it
 * becomes running with `request` in one statement.  Returns 0 with id_out
 * set, 1 when the pool is empty, -1 on error. */
int hutch_db_pool_claim(struct hutch_db *db, const char *template_name, const char *request, uint64_t now,
                        uint64_t expires_at, char id_out[64], hutch_err *err);
/* Pool sandboxes of a template that exist or are being made. */
int64_t hutch_db_pool_count(struct hutch_db *db, const char *template_name);

struct hutch_op_rec {
  char id[64];
  char kind[16];
  char sandbox_id[64];
  char state[16]; /* pending | running | succeeded | failed */
  int err_status;
  char err_code[40];
  char *err_msg;
  uint64_t created_at, started_at, finished_at;
  char *arg; /* what the operation acts with (a snapshot id, a template build), or NULL */
};
void hutch_op_rec_free(struct hutch_op_rec *r);

int hutch_db_op_insert(struct hutch_db *db, const struct hutch_op_rec *r, hutch_err *err);
int hutch_db_op_get(struct hutch_db *db, const char *id, struct hutch_op_rec *out, hutch_err *err);
int hutch_db_op_set_state(struct hutch_db *db, const char *id, const char *state, const hutch_err *failure,
                          hutch_err *err);
/* Operations left pending/running by a previous hutchd process. */
int hutch_db_op_fail_unfinished(struct hutch_db *db, const char *message, hutch_err *err);

struct hutch_key_rec {
  char id[64];
  char name[128];
  uint64_t created_at;
};
int hutch_db_key_insert(struct hutch_db *db, const char *id, const char *name, const char *hash_hex,
                        hutch_err *err);
int hutch_db_key_list(struct hutch_db *db, struct hutch_key_rec **out, size_t *n, hutch_err *err);
int hutch_db_key_delete(struct hutch_db *db, const char *id, hutch_err *err);
/* true when a key with this hash exists. */
bool hutch_db_key_hash_exists(struct hutch_db *db, const char *hash_hex);

/* Templates (the pool holds their files; this, their build state). */
struct hutch_template_rec {
  char name[64];
  char state[16]; /* building | ready | failed */
  char *source;   /* JSON: what it is built from */
  char *config;   /* JSON: image defaults (env, cwd, user, entrypoint, cmd) */
  char *progress; /* last progress message, or NULL */
  double fraction;
  char *error;
  uint64_t created_at, updated_at;
};
void hutch_template_rec_free(struct hutch_template_rec *r);
/* 409 while a build of `name` is in progress. */
int hutch_db_template_begin(struct hutch_db *db, const char *name, const char *source, hutch_err *err);
int hutch_db_template_progress(struct hutch_db *db, const char *name, const char *msg, double fraction,
                               hutch_err *err);
/* config NULL keeps the stored one. */
int hutch_db_template_finish(struct hutch_db *db, const char *name, const char *state, const char *config,
                             const char *error, hutch_err *err);
int hutch_db_template_get(struct hutch_db *db, const char *name, struct hutch_template_rec *out, hutch_err *err);
int hutch_db_template_list(struct hutch_db *db, struct hutch_template_rec **out, size_t *n, hutch_err *err);
int hutch_db_template_delete(struct hutch_db *db, const char *name, hutch_err *err);
int hutch_db_template_fail_building(struct hutch_db *db, const char *message, hutch_err *err);

struct hutch_snapshot_rec {
  char id[64];
  char sandbox_id[64]; /* the sandbox it was taken of (may be gone) */
  char parent_id[64];  /* the snapshot it is incremental to, or "" */
  char template_name[64];
  char kind[16];  /* manual | auto | fork | imported */
  char state[16]; /* creating | ready */
  char *labels;   /* JSON object */
  char *request;  /* the sandbox's create request when taken (JSON) */
  uint64_t generation; /* btrfs generation of the root when taken */
  uint64_t created_at;
};
void hutch_snapshot_rec_free(struct hutch_snapshot_rec *r);
int hutch_db_snapshot_insert(struct hutch_db *db, const struct hutch_snapshot_rec *r, hutch_err *err);
int hutch_db_snapshot_get(struct hutch_db *db, const char *id, struct hutch_snapshot_rec *out, hutch_err *err);
/* Oldest first; sandbox_id and kind NULL for all. */
int hutch_db_snapshot_list(struct hutch_db *db, const char *sandbox_id, const char *kind,
                           struct hutch_snapshot_rec **out, size_t *n, hutch_err *err);
int hutch_db_snapshot_set_ready(struct hutch_db *db, const char *id, uint64_t generation, hutch_err *err);
int hutch_db_snapshot_delete(struct hutch_db *db, const char *id, hutch_err *err);

#endif
