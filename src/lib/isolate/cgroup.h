/* Cgroup management for sandboxes, on cgroup v2 (unified) and v1/hybrid hosts.
 *
 * Like crun's cgroup managers, the backends are a table of functions chosen
 * once at start-up by probing the host:
 *   - v2: /sys/fs/cgroup is cgroup2 (or cgroup2 is mounted elsewhere with the
 *     memory controller available).  A sandbox is one leaf directory.
 *   - v1: memory, pids, cpu and freezer hierarchies under /sys/fs/cgroup/<ctrl>;
 *     a sandbox is one directory in each.
 *
 * Names never collide between two hutchd instances: every path lives under
 * a per-instance parent "hutch-<instance>" (the instance name is derived from
 * the data directory).  A sandbox's cgroup is "<parent>/<sandbox id>".
 *
 * Thread safety: functions are reentrant; distinct sandboxes may be handled
 * concurrently.
 */
#ifndef HUTCH_CGROUP_H
#define HUTCH_CGROUP_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"

struct hutch_cgroup_limits {
  uint64_t memory_bytes; /* 0 = unlimited; swap is disabled where the host allows */
  uint64_t pids;         /* 0 = unlimited */
  uint32_t cpu_millis;   /* 1000 = one CPU; 0 = unlimited */
};

struct hutch_cgroup_stats {
  uint64_t memory_current, memory_peak, cpu_usage_usec, pids_current, oom_kills;
};

enum hutch_cgroup_version { HUTCH_CGROUP_V1 = 1, HUTCH_CGROUP_V2 = 2 };

/* Detects the host layout (once; cached).  Fails if neither a usable v2
 * hierarchy with memory+pids nor v1 memory+pids+cpu+freezer exists. */
int hutch_cgroup_probe(enum hutch_cgroup_version *out, hutch_err *err);

/* Create the sandbox's cgroup(s) under hutch-<instance>/<id>, enabling the
 * needed controllers on v2, and apply limits.  On failure nothing is left. */
int hutch_cgroup_create(const char *instance, const char *id, const struct hutch_cgroup_limits *lim,
                        hutch_err *err);
/* Move a process into the sandbox's cgroup(s). */
int hutch_cgroup_attach(const char *instance, const char *id, pid_t pid, hutch_err *err);
/* Kill every process in the cgroup (cgroup.kill on v2; freeze, SIGKILL each
 * pid, thaw on v1), wait until empty (bounded), and remove the directories.
 * Succeeds if the cgroup does not exist. */
int hutch_cgroup_destroy(const char *instance, const char *id, hutch_err *err);
/* Freeze/thaw (pause/resume).  */
int hutch_cgroup_freeze(const char *instance, const char *id, bool frozen, hutch_err *err);
int hutch_cgroup_stats(const char *instance, const char *id, struct hutch_cgroup_stats *st, hutch_err *err);
/* Whether the sandbox's cgroup exists (any hierarchy). */
bool hutch_cgroup_exists(const char *instance, const char *id);
/* Number of processes currently in the sandbox's cgroup, or -1. */
long hutch_cgroup_nprocs(const char *instance, const char *id);
/* Remove the per-instance parent(s) when empty (best effort). */
void hutch_cgroup_cleanup_instance(const char *instance);

/* Path of the sandbox's directory in the hierarchy that holds `controller`
 * ("memory", "pids", "cpu", "freezer"; on v2 all are the same; on v1 also
 * "cpuacct" and "unified", the leaf in a hybrid host's cgroup2 mount).  NULL
 * for an invalid name or a hierarchy the host lacks.  Caller frees. */
char *hutch_cgroup_path(const char *instance, const char *id, const char *controller);

/* Tests only: use the cgroup2 hierarchy mounted at `root` as the v2 backend,
 * even when it has no controllers (memory/pids/cpu limits whose files are
 * missing are then skipped).  Lets the v2 code run on hybrid hosts, whose
 * cgroup2 mount has no controllers.  Not thread-safe: call it while no other
 * cgroup function runs. */
int hutch_cgroup_testing_use_v2(const char *root, hutch_err *err);

#endif
