/* hutchd's side of hutch-shim: launching a shim detached, and talking to it
 * over its unix socket (one connection per call; calls may run in parallel
 * from any thread). */
#ifndef HUTCH_SHIM_CLIENT_H
#define HUTCH_SHIM_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "agent/proto.h"
#include "common/err.h"

struct hutch_shim_launch {
  const char *shim_path;   /* hutch-shim binary */
  const char *config_path; /* the sandbox spec (config.json) */
  const char *socket_path; /* where the shim listens */
  const char *log_path;    /* the shim's stderr */
  int timeout_ms;          /* bound on start-up */
  size_t output_buffer;    /* ring buffer per command output stream */
};

/* Start a shim in its own session (double fork, so it is not hutchd's child
 * and survives hutchd), and wait for its readiness line.  On failure the
 * shim has already cleaned up after itself. */
int hutch_shim_launch(const struct hutch_shim_launch *l, pid_t *shim_pid, pid_t *init_pid, hutch_err *err);

int hutch_shim_connect(const char *socket_path, hutch_err *err);

/* Ask the shim to stop the sandbox and exit; waits (bounded) for its ack. */
int hutch_shim_shutdown(const char *socket_path, hutch_err *err);
/* Round trip to the shim: true when it answers. */
bool hutch_shim_alive(const char *socket_path);

/* A connection to a shim for a sequence of requests (file transfers, stdin
 * streams, attach).  Requests are numbered from 1; replies carry the id. */
struct hutch_shim_conn {
  int fd;
  uint32_t next_id;
  struct hutch_buf payload; /* payload of the last frame read */
};
int hutch_shim_conn_open(struct hutch_shim_conn *c, const char *socket_path, int timeout_s, hutch_err *err);
void hutch_shim_conn_close(struct hutch_shim_conn *c);
/* Send a request; returns its id (0 on error, err set). */
uint32_t hutch_shim_conn_send(struct hutch_shim_conn *c, uint16_t type, const void *p, size_t n, hutch_err *err);
/* Read the next frame (any id).  1 ok, 0 EOF (err set: 503), -1 error. */
int hutch_shim_conn_read(struct hutch_shim_conn *c, struct hutch_frame_hdr *h, hutch_err *err);
/* Send a request and read frames until one answers it: returns 0 with *h
 * and c->payload set.  An ERROR answer becomes -1 with err mapped from the
 * errno (ENOENT/ESRCH 404, EINVAL 400, EEXIST/ENOTEMPTY/EISDIR/ENOTDIR/EPIPE/
 * ENOTTY 409, others 500), its message kept. */
int hutch_shim_conn_call(struct hutch_shim_conn *c, uint16_t type, const void *p, size_t n, struct hutch_frame_hdr *h,
                         hutch_err *err);
/* Turn an ERROR payload into err as above. */
int hutch_shim_error(const void *payload, size_t len, hutch_err *err);

struct hutch_exec_req {
  const char *const *argv;
  const char *const *envp;
  const char *cwd;
  uint32_t timeout_ms;
  const void *stdin_data; /* NULL: stdin is /dev/null */
  size_t stdin_len;
  size_t max_output; /* cap per stream */
  const char *name;  /* command id (cmd_…) */
};

struct hutch_exec_result {
  bool started;
  int exit_code; /* valid when signo == 0 */
  int signo;
  bool timed_out;
  char *out, *errb; /* owned, NUL-terminated */
  size_t out_len, err_len;
  bool truncated;
  char *spawn_error; /* set when the program could not be started */
  int spawn_errno;
  uint64_t duration_us;
};
void hutch_exec_result_free(struct hutch_exec_result *r);

/* Run one command to completion.  Returns -1 only for transport failures
 * (status 503 when the shim cannot be reached); a command that fails to
 * start is a successful call with spawn_error set. */
int hutch_shim_exec(const char *socket_path, const struct hutch_exec_req *req, struct hutch_exec_result *res,
                    hutch_err *err);

#endif
