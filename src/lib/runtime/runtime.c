#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"

static const struct hutch_runtime_ops *const all_runtimes[] = {&hutch_runtime_native, NULL};

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

bool hutch_fault(const char *point) {
  const char *f = getenv("HUTCH_FAULT");
  return f && *f && !strcmp(f, point);
}
