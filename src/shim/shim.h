/* hutch-shim internals: the event loop that serves clients and keeps every
 * command of the sandbox (server.c), started by main.c once the runtime has
 * the sandbox running. */
#ifndef HUTCH_SHIM_H
#define HUTCH_SHIM_H

#include <stddef.h>
#include <sys/types.h>

#include "runtime/runtime.h"

struct shim_config {
  const struct hutch_runtime_ops *rt;
  struct hutch_sandbox_spec *spec;
  struct hutch_runtime_instance *inst;
  const char *sock_path;
  int listen_fd;
  int signal_fd;
  size_t ring_bytes; /* ring buffer per output stream */
};

/* Serve until the sandbox ends or SHUTDOWN; never returns. */
__attribute__((noreturn)) void shim_serve(struct shim_config *cfg);

/* Stop the sandbox, release its runtime resources, exit(code). */
__attribute__((noreturn)) void shim_shutdown_and_exit(struct shim_config *cfg, int code);

#endif
