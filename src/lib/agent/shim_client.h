/* hutchd's side of hutch-shim: launching a shim detached, and talking to it
 * over its unix socket (one connection per call; calls may run in parallel
 * from any thread). */
#ifndef HUTCH_SHIM_CLIENT_H
#define HUTCH_SHIM_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"

struct hutch_shim_launch {
  const char *shim_path;   /* hutch-shim binary */
  const char *config_path; /* the sandbox spec (config.json) */
  const char *socket_path; /* where the shim listens */
  const char *log_path;    /* the shim's stderr */
  int timeout_ms;          /* bound on start-up */
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

struct hutch_exec_req {
  const char *const *argv;
  const char *const *envp;
  const char *cwd;
  uint32_t timeout_ms;
  const void *stdin_data; /* NULL: stdin is /dev/null */
  size_t stdin_len;
  size_t max_output; /* cap per stream */
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
