/* The daemon's core: configuration, state, and the lifecycle of sandboxes.
 *
 * Lifecycle requests (create, delete) become operations: a row in the
 * database and an entry in a queue served by a small worker pool, so a slow
 * operation never blocks the API.  Operations on one sandbox run one at a
 * time, in the order they were accepted.
 */
#ifndef HUTCH_DAEMON_H
#define HUTCH_DAEMON_H

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "agent/shim_client.h"
#include "common/err.h"
#include "store/db.h"
#include "store/pool.h"

struct hutch_config {
  char *data_dir;     /* state.db, templates/, sandboxes/ */
  char *socket_path;  /* API unix socket */
  char *listen_addr;  /* optional HOST:PORT for TCP (API key required) */
  char *run_dir;      /* shim sockets; default /run/hutch/<instance> */
  char *uid_lock_dir; /* host-wide uid slot claims */
  char *libexec_dir;  /* where hutch-shim and hutch-init live */
  size_t max_body;
  int workers;
  uint32_t uid_first; /* first host uid handed to sandboxes */
  uint32_t uid_slots; /* number of 65536-id slots */
  uint32_t default_timeout_s;
  uint32_t max_timeout_s;
  uint32_t pool_size;   /* warm pool: sandboxes kept ready for default-shaped creates */
  char *pool_template;  /* template of the warm pool */
  size_t output_buffer; /* shim ring buffer per command output stream */
  uint32_t attach_token_ttl_s;
  char *storage_backend; /* auto | btrfs | overlay (docs/storage.md) */
  uint64_t storage_size; /* pool image size; 0: default (grows when raised) */
  char *storage_quota;   /* auto | on | off */
  uint32_t max_fork;     /* most sandboxes one fork call makes */
  char *runsc_path;      /* gvisor: runsc binary (NULL: from PATH) */
  char *runsc_platform;  /* gvisor: ptrace | kvm | systrap (NULL: ptrace) */
  bool egress;           /* sandboxes may have a way out, through hutch-gateway (docs/network.md); default on */
  char *gateway_dns;     /* IP:PORT the gateway resolves with (NULL: the host's first resolver) */
  char *gateway_upstream_ca; /* CA bundle the gateway verifies upstream TLS with (NULL: the host's) */
  char *gateway_public_cidr; /* a private range the gateway treats as public (test networks) */
};

void hutch_config_defaults(struct hutch_config *c);
void hutch_config_free(struct hutch_config *c);

struct hutch_busy;

struct hutch_ctx {
  struct hutch_config cfg;
  char instance[16]; /* 12 hex chars of sha256(realpath(data_dir)) */
  char cgroup_version[4];
  struct hutch_db *db;
  struct hutch_pool pool;
  pthread_mutex_t mu;
  pthread_cond_t work;    /* signalled when an operation is queued */
  pthread_cond_t done;    /* broadcast when an operation finishes */
  struct hutch_opq *queue_head, *queue_tail;
  char **busy;            /* sandbox ids with an operation in progress */
  size_t nbusy;
  size_t pool_running;    /* warm-pool refills in progress */
  bool stopping;
  pthread_t *threads;
  size_t nthreads;
  pthread_t reaper;
  uint64_t started_ms;
  unsigned char token_key[32]; /* HMAC key of attach tokens (DATA/secret.key) */
  uint32_t egress_ports[4];    /* the gateway's dns, proxy, http, tls ports */
  bool egress_ready;           /* ruleset loaded and gateway started (lifecycle/egress.c) */
};

/* Open the database, build the host template, reconcile state left by a
 * previous run, start workers. */
int hutch_ctx_start(struct hutch_ctx *ctx, hutch_err *err);
void hutch_ctx_stop(struct hutch_ctx *ctx);

struct hutch_create_req {
  const char *template_name;
  const char *runtime;
  double cpus;
  int64_t memory_mib, pids, disk_mib;
  json_t *env;    /* object of strings (borrowed) */
  json_t *labels; /* object of strings (borrowed) */
  int64_t timeout_s;
  const char *on_timeout; /* "delete" (default) or "suspend" */
  const char *from_snapshot; /* make the root from this snapshot, not the template */
  json_t *snapshots;         /* automatic snapshot policy (borrowed), or NULL */
  json_t *image;             /* the template's image defaults (borrowed), or NULL */
  json_t *network;           /* {"egress": …} normalised (borrowed), or NULL for none */
};

/* Accept a create: validates what can be checked now (template, runtime),
 * inserts the sandbox (accepted) and a pending operation, queues it. */
int hutch_lc_create(struct hutch_ctx *ctx, const struct hutch_create_req *req, char sb_id[64], char op_id[64],
                    hutch_err *err);
int hutch_lc_delete(struct hutch_ctx *ctx, const char *sb_id, char op_id[64], hutch_err *err);
/* Accept a lifecycle call (pause, resume, stop, start, suspend, restore,
 * wake): 409 naming the state when it does not fit; 1 when there is
 * nothing to do (the operation is recorded as succeeded); 0 when queued. */
int hutch_lc_verb(struct hutch_ctx *ctx, const char *sb_id, const char *verb, char op_id[64], hutch_err *err);
/* A user-visible sandbox (idle warm-pool members are not): 404 otherwise. */
int hutch_lc_get(struct hutch_ctx *ctx, const char *sb_id, struct hutch_sandbox_rec *out, hutch_err *err);
/* Default create request (what the warm pool holds), for `template_name`. */
void hutch_create_req_defaults(struct hutch_ctx *ctx, struct hutch_create_req *req, const char *template_name);
/* Wait up to timeout_ms for the operation to finish; fills *out either way. */
int hutch_lc_wait(struct hutch_ctx *ctx, const char *op_id, uint64_t timeout_ms, struct hutch_op_rec *out,
                  hutch_err *err);

struct hutch_exec_opts {
  const char *const *argv;
  json_t *env; /* extra variables (borrowed), may be NULL */
  const char *cwd;
  uint32_t timeout_s;
  const char *stdin_data;
  size_t stdin_len;
  size_t max_output;
};
int hutch_lc_exec(struct hutch_ctx *ctx, const char *sb_id, const struct hutch_exec_opts *o,
                  struct hutch_exec_result *res, hutch_err *err);

/* A running sandbox's record (the caller frees it), or -1 with 404 / 409
 * naming the state it is in. */
int hutch_lc_get_running(struct hutch_ctx *ctx, const char *sb_id, struct hutch_sandbox_rec *out, hutch_err *err);
/* The environment a command gets: defaults < sandbox env < `extra`.
 * Returns a NULL-terminated array of "K=V" (free with hutch_envp_free). */
char **hutch_lc_command_env(const struct hutch_sandbox_rec *r, json_t *extra);
void hutch_envp_free(char **envp);
/* Where a command runs when the caller names no directory: the image's
 * working directory, else the home of `uid` (caller frees). */
char *hutch_lc_default_cwd(const struct hutch_sandbox_rec *r, int64_t uid);

/* Queue operation `kind` on `key` (a sandbox id, or "template:<name>") with
 * `arg`; operations on one key run in order. */
int hutch_lc_queue(struct hutch_ctx *ctx, const char *kind, const char *key, const char *arg, char op_id[64],
                   hutch_err *err);

/* Paths (caller frees). */
char *hutch_sandbox_dir(struct hutch_ctx *ctx, const char *id);
char *hutch_shim_socket(struct hutch_ctx *ctx, const char *id);
uint32_t hutch_uid_base_for_slot(struct hutch_ctx *ctx, int64_t slot);

#endif
