#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"

/* "auto" takes the first available one: native first (which runtime "auto"
 * prefers is the lifecycle's decision, not this list's). */
static const struct hutch_runtime_ops *const all_runtimes[] = {&hutch_runtime_native, &hutch_runtime_gvisor, NULL};

const struct hutch_runtime_ops *const *hutch_runtimes(void) { return all_runtimes; }

const struct hutch_runtime_ops *hutch_runtime_get(const char *name) {
  if (!name || !strcmp(name, "auto")) {
    /* Strongest first: vm (KVM) > gvisor > native.  Only native exists yet. */
    for (size_t i = 0; all_runtimes[i]; i++) {
      char why[256];
      if (all_runtimes[i]->available(why, sizeof why)) return all_runtimes[i];
    }
    return NULL;
  }
  for (size_t i = 0; all_runtimes[i]; i++)
    if (!strcmp(all_runtimes[i]->name, name)) return all_runtimes[i];
  return NULL;
}

/* Every fault point, in the order the operations pass them (docs/testing.md).
 * Points starting with `shim.` fire inside hutch-shim. */
static const char *const fault_points[] = {
    "create.slot",     "create.rootfs",   "create.shim",    "create.ready",    "shim.cgroup",
    "shim.spawn",      "delete.begin",    "delete.shim",    "delete.files",    "delete.row",
    "pause.begin",     "pause.frozen",    "resume.begin",   "resume.thawed",   "stop.begin",
    "stop.shim",       "start.begin",     "start.shim",     "suspend.begin",   "suspend.history",
    "suspend.shim",    "suspend.slot",    "restore.begin",  "restore.slot",    "restore.shim",
    "snapshot.frozen", "snapshot.taken",  "rollback.down",  "rollback.aside",  "rollback.swapped",
    NULL,
};

const char *const *hutch_fault_points(void) { return fault_points; }

bool hutch_fault(const char *point) {
  const char *f = getenv("HUTCH_FAULT");
  if (!f || !*f) return false;
  size_t n = strlen(point);
  if (strncmp(f, point, n)) return false;
  if (f[n] == 0) return true;
  if (!strcmp(f + n, ":abort")) {
    /* A crash at exactly this step, for the crash-safety tests. */
    fprintf(stderr, "hutch: HUTCH_FAULT=%s: aborting at %s\n", f, point);
    abort();
  }
  return false;
}
