/* Capability drop for sandboxed processes (see caps.h).
 *
 * Called as uid 0 in a fresh user namespace (all capabilities in that
 * namespace) right before exec.  On execve by uid 0 the kernel recomputes
 * the permitted set as roughly (inheritable | bounding) and the effective set
 * from it, so the bounding set is what actually limits the sandbox; the other
 * sets are made equal to the keep list so the state is consistent before
 * exec too, and ambient is cleared so nothing is carried over implicitly.
 */
#include "isolate/caps.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/capability.h>
#include <sys/prctl.h>

#include "common/util.h"

static const cap_value_t keep_caps[] = {
    CAP_CHOWN,  CAP_DAC_OVERRIDE, CAP_FOWNER,           CAP_FSETID,     CAP_KILL,    CAP_SETGID,
    CAP_SETUID, CAP_SETPCAP,      CAP_NET_BIND_SERVICE, CAP_SYS_CHROOT, CAP_SETFCAP, CAP_AUDIT_WRITE,
};
#define N_KEEP ((int)(sizeof keep_caps / sizeof *keep_caps))

static bool is_kept(int cap) {
  for (int i = 0; i < N_KEEP; i++)
    if (keep_caps[i] == cap) return true;
  return false;
}

/* Highest capability the running kernel knows, which may exceed the
 * CAP_LAST_CAP this was compiled with. */
static int last_cap(void) {
  cleanup_free char *s = read_file("/proc/sys/kernel/cap_last_cap", 64, NULL, NULL);
  if (s) {
    uint64_t v;
    size_t n = strcspn(s, "\n");
    s[n] = 0;
    if (parse_u64(s, 63, &v) == 0) return (int)v;
  }
  /* /proc unavailable (e.g. not mounted yet): ask the kernel directly. */
  int c = 0;
  while (c < 63 && prctl(PR_CAPBSET_READ, c + 1, 0, 0, 0) >= 0) c++;
  return c;
}

static void cap_freep(cap_t *c) {
  if (*c) cap_free(*c);
}

int hutch_caps_drop(hutch_err *err) {
  int last = last_cap();
  /* Needs CAP_SETPCAP in the effective set, so it goes before capset. */
  for (int c = 0; c <= last; c++) {
    if (is_kept(c)) continue;
    if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) < 0 && errno != EINVAL)
      return hutch_err_sys(err, errno, "drop capability %d from the bounding set", c);
  }
  /* EINVAL: kernel older than 4.3, which has no ambient set. */
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
    return hutch_err_sys(err, errno, "clear ambient capabilities");

  __attribute__((cleanup(cap_freep))) cap_t caps = cap_init();
  if (!caps) return hutch_err_sys(err, errno, "cap_init");
  if (cap_set_flag(caps, CAP_PERMITTED, N_KEEP, keep_caps, CAP_SET) < 0 ||
      cap_set_flag(caps, CAP_EFFECTIVE, N_KEEP, keep_caps, CAP_SET) < 0 ||
      cap_set_flag(caps, CAP_INHERITABLE, N_KEEP, keep_caps, CAP_SET) < 0)
    return hutch_err_sys(err, errno, "cap_set_flag");
  if (cap_set_proc(caps) < 0) return hutch_err_sys(err, errno, "capset");
  return 0;
}
