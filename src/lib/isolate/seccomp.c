/* Seccomp filter for sandboxed processes: a deny list on top of ALLOW, in the
 * spirit of Docker's default profile (see seccomp.h for the contract).
 *
 * Two filters are loaded:
 *   1. the libseccomp filter: unconditional EPERM for the names in
 *      `denied_syscalls`, per-flag EPERM rules for clone/unshare, ENOSYS for
 *      clone3, and KILL_PROCESS for any foreign architecture;
 *   2. a hand-written classic BPF filter for personality(2), because an
 *      "every value except these five" rule needs several comparisons on the
 *      same argument, which libseccomp 2.5 refuses (EINVAL) in one rule, and
 *      with a default of ALLOW it also refuses ALLOW rules for the exceptions.
 * The kernel runs every filter and applies the most restrictive verdict, so
 * the order of the two does not matter.
 *
 * x32: libseccomp 2.5.4 emits `if (nr >= 0x40000000 && nr != -1) goto badarch`
 * for a filter whose only architecture is x86_64, so x32 syscalls (same
 * AUDIT_ARCH, __X32_SYSCALL_BIT set) get the bad-arch action, KILL_PROCESS.
 * test_seccomp checks this.
 */
#include "isolate/seccomp.h"

#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <seccomp.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef CLONE_NEWTIME
#define CLONE_NEWTIME 0x00000080
#endif
#ifndef CLONE_NEWCGROUP
#define CLONE_NEWCGROUP 0x02000000
#endif

/* Refused with EPERM whatever the arguments.  Names unknown on the build's
 * architecture (umount, stime, *_time64 on 64-bit; iopl on aarch64, ...) are
 * skipped when the filter is built. */
static const char *const denied_syscalls[] = {
    /* mounts, including the new mount API */
    "mount", "umount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsconfig",
    "fsmount", "fspick", "mount_setattr",
    /* joining other namespaces (creating them: clone/unshare rules below) */
    "setns",
    /* kernel keyring: not namespaced */
    "keyctl", "add_key", "request_key",
    /* large attack surface, historically rich in privilege escalations */
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    /* file handles bypass path-based confinement (the "shocker" escape) */
    "open_by_handle_at", "name_to_handle_at",
    /* kernel modules, kexec, reboot */
    "init_module", "finit_module", "delete_module", "create_module", "query_module", "get_kernel_syms",
    "kexec_load", "kexec_file_load", "reboot",
    /* host-wide state: accounting, swap, clocks, log, tty, I/O ports, quotas */
    "acct", "swapon", "swapoff", "clock_settime", "clock_settime64", "settimeofday", "stime", "adjtimex",
    "clock_adjtime", "clock_adjtime64", "syslog", "vhangup", "iopl", "ioperm", "lookup_dcookie",
    "quotactl", "quotactl_fd", "nfsservctl", "uselib", "ustat", "sysfs", "_sysctl", "fanotify_init",
    NULL};

/* Namespace-creating flags.  CLONE_NEWTIME only for unshare: in clone(2) that
 * bit is part of the exit-signal byte (CSIGNAL), and clone cannot create a
 * time namespace anyway. */
static const uint64_t clone_ns_flags[] = {CLONE_NEWNS,  CLONE_NEWUTS, CLONE_NEWIPC,   CLONE_NEWUSER,
                                          CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWCGROUP};
static const uint64_t unshare_ns_flags[] = {CLONE_NEWNS,  CLONE_NEWUTS, CLONE_NEWIPC,    CLONE_NEWUSER,
                                            CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWCGROUP, CLONE_NEWTIME};

/* BTRFS_IOC_*: SNAP_CREATE 1, SUBVOL_CREATE 14, SNAP_DESTROY 15,
 * SNAP_CREATE_V2 23, SUBVOL_CREATE_V2 24, SUBVOL_SETFLAGS 26,
 * SET_RECEIVED_SUBVOL 37, SNAP_DESTROY_V2 63 (linux/btrfs.h). */
static const uint8_t btrfs_denied_ioctls[] = {1, 14, 15, 23, 24, 26, 37, 63};

const char *const *hutch_seccomp_denied_syscalls(void) { return denied_syscalls; }

static void seccomp_releasep(scmp_filter_ctx *ctx) {
  if (*ctx) seccomp_release(*ctx);
}
#define cleanup_seccomp __attribute__((cleanup(seccomp_releasep)))

/* Adds one rule; a name the architecture lacks is not an error.  libseccomp
 * returns negative errno values. */
static int add_rule(scmp_filter_ctx ctx, uint32_t action, const char *name, unsigned n,
                    const struct scmp_arg_cmp *cmp, hutch_err *err) {
  int nr = seccomp_syscall_resolve_name(name);
  /* __NR_SCMP_ERROR (unknown) or a negative pseudo-number (not on this arch) */
  if (nr < 0) return 0;
  int rc = seccomp_rule_add_array(ctx, action, nr, n, cmp);
  if (rc < 0) return hutch_err_sys(err, -rc, "seccomp rule for `%s`", name);
  return 0;
}

static int add_ns_flag_rules(scmp_filter_ctx ctx, const char *name, const uint64_t *flags, size_t n,
                             hutch_err *err) {
  /* With a default of ALLOW, "deny when any namespace bit is set" is one
   * EPERM rule per bit; flags the kernel also ignores stay allowed. */
  for (size_t i = 0; i < n; i++) {
    struct scmp_arg_cmp cmp = SCMP_A0(SCMP_CMP_MASKED_EQ, flags[i], flags[i]);
    if (add_rule(ctx, SCMP_ACT_ERRNO(EPERM), name, 1, &cmp, err) < 0) return -1;
  }
  return 0;
}

static int build_main_filter(scmp_filter_ctx ctx, hutch_err *err) {
  int rc = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS);
  if (rc < 0) return hutch_err_sys(err, -rc, "seccomp: set bad-arch action");
  /* Allowed syscalls would otherwise walk the whole deny list linearly; a
   * binary tree is cheaper (libseccomp >= 2.5; failure is harmless). */
#if SCMP_VER_MAJOR > 2 || (SCMP_VER_MAJOR == 2 && SCMP_VER_MINOR >= 5)
  (void)seccomp_attr_set(ctx, SCMP_FLTATR_CTL_OPTIMIZE, 2);
#endif

  for (const char *const *p = denied_syscalls; *p; p++)
    if (add_rule(ctx, SCMP_ACT_ERRNO(EPERM), *p, 0, NULL, err) < 0) return -1;
  if (add_ns_flag_rules(ctx, "clone", clone_ns_flags, sizeof clone_ns_flags / sizeof *clone_ns_flags, err) < 0)
    return -1;
  if (add_ns_flag_rules(ctx, "unshare", unshare_ns_flags, sizeof unshare_ns_flags / sizeof *unshare_ns_flags,
                        err) < 0)
    return -1;
  /* btrfs ioctls that make, delete or retag subvolumes: any owner of a
   * directory may call them, and a subvolume made inside the sandbox's root
   * would escape its quota group (and its snapshots).  Matched on the ioctl
   * type and number only (the size bits vary); reflink ioctls (FICLONE,
   * FICLONERANGE, FIDEDUPERANGE) share the type and stay allowed. */
  for (size_t i = 0; i < sizeof btrfs_denied_ioctls / sizeof *btrfs_denied_ioctls; i++) {
    struct scmp_arg_cmp cmp = SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffff, 0x9400u | btrfs_denied_ioctls[i]);
    if (add_rule(ctx, SCMP_ACT_ERRNO(EPERM), "ioctl", 1, &cmp, err) < 0) return -1;
  }
  /* clone3 passes its flags in a struct the filter cannot read; ENOSYS makes
   * glibc (>= 2.34) fall back to clone(2), whose flags are checked above. */
  if (add_rule(ctx, SCMP_ACT_ERRNO(ENOSYS), "clone3", 0, NULL, err) < 0) return -1;
  return 0;
}

#define PERSONALITY_ALLOW_IDX 11
static int install_personality_filter(hutch_err *err) {
  /* The kernel takes personality's argument as an unsigned int, so only the
   * low 32 bits matter.  Allowed: PER_LINUX (0), PER_LINUX_32BIT (8),
   * UNAME26 (0x20000), UNAME26|PER_LINUX32 (0x20008) and the query 0xffffffff,
   * as in Docker's profile.  Foreign architectures are left to the main
   * filter, which kills them. */
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  const uint32_t arg0_lo = offsetof(struct seccomp_data, args[0]);
#else
  const uint32_t arg0_lo = offsetof(struct seccomp_data, args[0]) + 4;
#endif
  struct sock_filter insns[] = {
      /* 0 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      /* 1 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, seccomp_arch_native(), 0, PERSONALITY_ALLOW_IDX - 2),
      /* 2 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      /* 3 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_personality, 0, PERSONALITY_ALLOW_IDX - 4),
      /* 4 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, arg0_lo),
      /* 5 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x0, PERSONALITY_ALLOW_IDX - 6, 0),
      /* 6 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x8, PERSONALITY_ALLOW_IDX - 7, 0),
      /* 7 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x20000, PERSONALITY_ALLOW_IDX - 8, 0),
      /* 8 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x20008, PERSONALITY_ALLOW_IDX - 9, 0),
      /* 9 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0xffffffff, PERSONALITY_ALLOW_IDX - 10, 0),
      /* 10 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      /* 11 = PERSONALITY_ALLOW_IDX */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  _Static_assert(sizeof insns / sizeof *insns == PERSONALITY_ALLOW_IDX + 1, "allow must be last");
  struct sock_fprog prog = {.len = sizeof insns / sizeof *insns, .filter = insns};
  if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) < 0)
    return hutch_err_sys(err, errno, "seccomp: load personality filter");
  return 0;
}

int hutch_seccomp_install(hutch_err *err) {
  /* Required for an unprivileged filter load, and keeps setuid binaries
   * inside the sandbox from regaining what was dropped. */
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) return hutch_err_sys(err, errno, "prctl(PR_SET_NO_NEW_PRIVS)");

  cleanup_seccomp scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (!ctx) return hutch_err_sys(err, ENOMEM, "seccomp_init");
  if (build_main_filter(ctx, err) < 0) return hutch_err_wrap(err, "build seccomp filter");
  int rc = seccomp_load(ctx);
  if (rc < 0) return hutch_err_sys(err, -rc, "seccomp_load");
  if (install_personality_filter(err) < 0) return -1;
  return 0;
}
