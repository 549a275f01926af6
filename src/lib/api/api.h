/* The HTTP API: libmicrohttpd glue, routing, and one handler file per
 * resource (health.c, sandboxes.c, operations.c, keys.c).  See docs/api.md. */
#ifndef HUTCH_API_H
#define HUTCH_API_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"
#include "lifecycle/daemon.h"

struct MHD_Connection;

struct hutch_req {
  struct hutch_ctx *ctx;
  struct MHD_Connection *conn;
  const char *method;
  const char *path;
  const char *params[4]; /* path parameters captured by the router */
  const char *body;      /* NUL-terminated */
  size_t body_len;
  bool tcp;              /* arrived over TCP (API-key authenticated) */
};

/* A streamed response body (downloads, attach, events): MHD pulls it with
 * `read`, whose contract is MHD's content reader: return bytes written to
 * buf (may block, this is a thread per connection), HUTCH_STREAM_END at the
 * end, HUTCH_STREAM_ERROR to abort the connection. */
#define HUTCH_STREAM_END (-1)
#define HUTCH_STREAM_ERROR (-2)
#define HUTCH_SIZE_UNKNOWN UINT64_MAX
struct hutch_stream {
  ssize_t (*read)(void *cls, uint64_t pos, char *buf, size_t max);
  void (*free)(void *cls);
  void *cls;
  uint64_t size; /* HUTCH_SIZE_UNKNOWN: chunked */
  const char *content_type;
};

struct hutch_resp {
  int status;
  json_t *json; /* owned; NULL for an empty body */
  const char *allow; /* Allow header for 405 */
  struct hutch_stream stream; /* used when stream.read is set (json ignored) */
};

typedef void (*hutch_handler)(struct hutch_req *req, struct hutch_resp *resp);

/* Routes whose request body is streamed (stdin, uploads): no size limit,
 * the body goes to `data` as it arrives.  `begin` returns a state, or NULL
 * with resp filled (an error answered before the body is read); `data`
 * returns -1 with resp filled to stop; `end` fills resp.  `abort` frees the
 * state when the connection ends early (may be NULL). */
struct hutch_upload_ops {
  void *(*begin)(struct hutch_req *req, struct hutch_resp *resp);
  int (*data)(void *state, const char *buf, size_t n, struct hutch_resp *resp);
  void (*end)(void *state, struct hutch_req *req, struct hutch_resp *resp);
  void (*abort)(void *state);
};

/* Fill resp with the error convention's body from err. */
void hutch_api_error(struct hutch_resp *resp, const hutch_err *err);
void hutch_api_errorf(struct hutch_resp *resp, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Query string value or NULL. */
const char *hutch_api_query(struct hutch_req *req, const char *key);
/* Same, but false when the decoded value contains a NUL byte (a%00b), which
 * would otherwise silently truncate it. */
bool hutch_api_query_clean(struct hutch_req *req, const char *key, const char **out);
/* Every value of a repeated query key; returns the count (at most max). */
size_t hutch_api_query_all(struct hutch_req *req, const char *key, const char **out, size_t max);
/* The client's socket, for streams that must notice a client that left
 * while they wait for data (MHD only learns it from a failed write). */
int hutch_api_client_fd(struct hutch_req *req);
bool hutch_api_peer_gone(int fd);
/* ?wait=true|1 */
bool hutch_api_wait(struct hutch_req *req);
/* Parse the body as a JSON object (400 on anything else). */
json_t *hutch_api_body_object(struct hutch_req *req, hutch_err *err);

/* Attach tokens (api/commands.c): a token minted for (sandbox, command) and
 * not expired.  Constant-time. */
bool hutch_attach_token_valid(struct hutch_ctx *ctx, const char *token, const char *sb_id, const char *cmd_id);

/* Connect to the shim of running sandbox params[0] (api/shim_conn.c).
 * On failure resp is filled (404, 409 naming the state, 503).  With `rec`,
 * the sandbox's record is handed back too (the caller frees it), so a
 * handler reads the sandbox once. */
bool hutch_api_open_shim(struct hutch_req *req, struct hutch_resp *resp, struct hutch_shim_conn *c, int timeout_s,
                         struct hutch_sandbox_rec *rec);

/* Handlers */
void hutch_h_health(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_sandbox_create(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_sandbox_list(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_sandbox_get(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_sandbox_delete(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_sandbox_exec(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_sandbox_verb(struct hutch_req *req, struct hutch_resp *resp); /* api/lifecycle.c */
void hutch_h_operation_get(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_key_create(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_key_list(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_key_delete(struct hutch_req *req, struct hutch_resp *resp);
/* commands (api/commands.c) */
void hutch_h_cmd_start(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_cmd_list(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_cmd_get(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_cmd_attach(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_cmd_signal(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_cmd_resize(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_cmd_wait(struct hutch_req *req, struct hutch_resp *resp);
extern const struct hutch_upload_ops hutch_u_cmd_stdin;
/* files (api/files.c) */
void hutch_h_files_get(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_files_delete(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_files_stat(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_files_list(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_files_mkdir(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_files_move(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_files_tar_get(struct hutch_req *req, struct hutch_resp *resp);
extern const struct hutch_upload_ops hutch_u_files_put;
extern const struct hutch_upload_ops hutch_u_files_tar_put;
/* sandbox timeout, metrics, events (api/timeout.c, api/metrics.c, api/events.c) */
void hutch_h_sandbox_timeout(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_sandbox_metrics(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_metrics(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_events(struct hutch_req *req, struct hutch_resp *resp);
/* api/storage.c */
void hutch_h_snapshot_create(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_snapshot_list(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_snapshot_list_all(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_snapshot_get(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_snapshot_delete(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_snapshot_policy_get(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_snapshot_policy_put(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_snapshot_export(struct hutch_req *req, struct hutch_resp *resp);
extern const struct hutch_upload_ops hutch_u_snapshot_import;
void hutch_h_sandbox_rollback(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_sandbox_fork(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_template_list(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_template_get(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_template_create(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_template_delete(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_storage(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_runtimes(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_network_get(struct hutch_req *req, struct hutch_resp *resp); /* api/network.c */
void hutch_h_network_put(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_egress_log(struct hutch_req *req, struct hutch_resp *resp);
/* Called by http.c after each request, for GET /metrics (api/metrics.c). */
void hutch_metrics_observe_request(const char *method, const char *route, int status, double seconds);

/* Server */
struct hutch_server;
int hutch_server_start(struct hutch_ctx *ctx, struct hutch_server **out, hutch_err *err);
void hutch_server_stop(struct hutch_server *s);

#endif
