/* Runtimes: the isolation drivers behind one function table.
 *
 * hutch-shim calls a runtime to start a sandbox's isolation and hutch-init
 * inside it; every runtime hands back one byte stream to hutch-init, so
 * commands and files work the same everywhere (ARCHITECTURE.md §2).
 *
 * `native` (namespaces, native.c) and `gvisor` (runsc, gvisor.c) exist;
 * `vm` plugs in here.
 */
#ifndef HUTCH_RUNTIME_H
#define HUTCH_RUNTIME_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"
#include "isolate/cgroup.h"

/* Capability bits reported by the API. */
#define HUTCH_RT_CAP_PAUSE (1u << 0)             /* freeze processes in memory */
#define HUTCH_RT_CAP_MEMORY_CHECKPOINT (1u << 1) /* suspend keeps running processes */
#define HUTCH_RT_CAP_FORK_MEMORY (1u << 2)       /* fork copies running processes */

/* Everything a runtime needs to start one sandbox.  hutchd writes it as
 * config.json in the sandbox directory; hutch-shim reads it back. */
struct hutch_sandbox_spec {
  char *id;        /* sb_… */
  char *instance;  /* hutchd instance name (cgroup/uid namespacing) */
  char *runtime;   /* "native" */
  char *rootfs;    /* host dir of the sandbox's writable layer: the root itself, or
                      upper/ and work/ of an overlay when `lower` is set */
  char *lower;     /* read-only template root under the overlay, or NULL */
  char *usr_src;   /* host directory bind-mounted read-only at /usr, or NULL */
  char *init_path; /* host path of the hutch-init binary */
  char *hostname;
  uint32_t uid_base;  /* host uid/gid that sandbox uid/gid 0 maps to */
  uint32_t uid_count; /* size of the mapped range */
  struct hutch_cgroup_limits limits;
  uint64_t tmp_bytes; /* size of the /tmp tmpfs */
  /* gvisor only (NULL elsewhere; optional in the JSON): */
  char *runsc_path;     /* runsc binary; NULL = "runsc" from PATH */
  char *runsc_platform; /* runsc --platform; NULL = "ptrace" */
  char *state_dir;      /* runsc --root for this sandbox (DATA/sandboxes/<id>/runsc) */
  char *bundle_dir;     /* the OCI bundle: config.json, rootfs/ (DATA/sandboxes/<id>/bundle) */
  char *restore_from;   /* a checkpoint image directory: start() restores it instead of booting */
};

void hutch_spec_free(struct hutch_sandbox_spec *s);
/* Serialise to / parse from JSON text.  Parsing validates every field. */
char *hutch_spec_to_json(const struct hutch_sandbox_spec *s);
int hutch_spec_from_json(const char *text, struct hutch_sandbox_spec *out, hutch_err *err);

/* A started sandbox, as seen by the shim. */
struct hutch_runtime_instance {
  pid_t init_pid;  /* host pid of hutch-init */
  int channel_fd;  /* stream to hutch-init (O_CLOEXEC), owned by the caller */
};

struct hutch_runtime_ops {
  const char *name;
  unsigned caps;
  /* Whether this host can run the runtime; fills `why` when not. */
  bool (*available)(char *why, size_t whylen);
  /* Start isolation and hutch-init.  On failure everything it made is
   * released (processes killed, cgroup removed). Called by the shim. */
  int (*start)(const struct hutch_sandbox_spec *spec, struct hutch_runtime_instance *out, hutch_err *err);
  /* Freeze / thaw every process of the sandbox. */
  int (*pause)(const struct hutch_sandbox_spec *spec, hutch_err *err);
  int (*resume)(const struct hutch_sandbox_spec *spec, hutch_err *err);
  /* Kill everything and release the runtime's resources.  Idempotent, and
   * works without the shim (hutchd calls it to clean up after a dead shim). */
  int (*destroy)(const struct hutch_sandbox_spec *spec, hutch_err *err);
  /* Write a memory checkpoint of the running sandbox into `dir` (created;
   * on success every file in it and `dir` itself are fsync'd); the
   * sandbox's processes stop.  Works from any host-root process (hutchd),
   * with only the spec.  NULL when the runtime cannot. */
  int (*checkpoint)(const struct hutch_sandbox_spec *spec, const char *dir, hutch_err *err);
};

extern const struct hutch_runtime_ops hutch_runtime_native;
extern const struct hutch_runtime_ops hutch_runtime_gvisor;

/* Look a runtime up by name; "auto" picks the strongest available. */
const struct hutch_runtime_ops *hutch_runtime_get(const char *name);
/* NULL-terminated list of every runtime compiled in. */
const struct hutch_runtime_ops *const *hutch_runtimes(void);

/* Fault injection for tests (docs/testing.md): returns true when the
 * environment variable HUTCH_FAULT names `point`. */
bool hutch_fault(const char *point);
/* NULL-terminated list of every fault point (`hutchd --fault-points`). */
const char *const *hutch_fault_points(void);

#endif
