/* Seccomp filter for sandboxed processes (native runtime).
 *
 * Semantics follow Docker's default profile: the process may use ordinary
 * syscalls; kernel-administration and namespace-escape syscalls fail with
 * EPERM (mount, umount2, pivot_root, move_mount/open_tree/fs*, unshare and
 * clone with namespace flags, setns, keyctl/add_key/request_key, bpf,
 * perf_event_open, userfaultfd, io_uring_*, open_by_handle_at, name_to_handle_at,
 * init_module/finit_module/delete_module, kexec_*, reboot, acct, swapon/off,
 * clock_settime/settimeofday/adjtimex/clock_adjtime, ptrace of other trees is
 * left to the pid namespace, personality other than the defaults, lookup_dcookie,
 * quotactl, nfsservctl, vhangup, iopl/ioperm, ...); clone3 returns ENOSYS so
 * libc falls back to clone(2), whose flags the filter can inspect.
 * Any other architecture (i386 via int 0x80, x32) kills the process.
 *
 * hutch_seccomp_install must be called after PR_SET_NO_NEW_PRIVS (it sets it
 * itself too) and immediately before exec of hutch-init.
 */
#ifndef HUTCH_SECCOMP_H
#define HUTCH_SECCOMP_H

#include "common/err.h"

int hutch_seccomp_install(hutch_err *err);

/* For tests and docs: NULL-terminated list of syscall names refused with EPERM. */
const char *const *hutch_seccomp_denied_syscalls(void);

#endif
