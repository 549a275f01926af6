/* Seccomp filter: each case runs in a forked child, which reports the errno
 * of the attempted call through its exit status (0 = the call succeeded).
 * Every refused call also runs without the filter where that is harmless, as
 * a positive control: the filter, not the host, must be what refuses it. */
#include <errno.h>
#include <fcntl.h>
#include <linux/keyctl.h>
#include <linux/io_uring.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/personality.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <seccomp.h>

#include "isolate/seccomp.h"
#include "tap.h"

#ifndef CLONE_NEWTIME
#define CLONE_NEWTIME 0x00000080
#endif

#define EXIT_INSTALL_FAILED 250
#define EXIT_SETUP_FAILED 251

static char tmpdir[64];

/* ---- running a case ---------------------------------------------------- */

struct result {
  bool exited;
  int code; /* exit status, or signal number */
};

static int errno_of(long r) { return r < 0 ? errno : 0; }

/* Runs fn in a child; `setup` runs before the filter is installed. */
static struct result run_case(bool filter, int (*setup)(void), int (*fn)(void)) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    if (setup && setup() != 0) _exit(EXIT_SETUP_FAILED);
    if (filter) {
      hutch_err err = HUTCH_ERR_INIT;
      if (hutch_seccomp_install(&err) < 0) {
        fprintf(stderr, "install: %s\n", err.msg);
        _exit(EXIT_INSTALL_FAILED);
      }
    }
    _exit(fn());
  }
  struct result res = {false, -1};
  int st;
  if (pid < 0 || waitpid(pid, &st, 0) < 0) return res;
  if (WIFEXITED(st)) {
    res.exited = true;
    res.code = WEXITSTATUS(st);
  } else if (WIFSIGNALED(st)) {
    res.code = WTERMSIG(st);
  }
  return res;
}

static const char *describe(struct result r, char *buf, size_t n) {
  if (!r.exited) snprintf(buf, n, "killed by signal %d", r.code);
  else if (r.code == 0) snprintf(buf, n, "success");
  else if (r.code >= EXIT_INSTALL_FAILED) snprintf(buf, n, "child setup failed (%d)", r.code);
  else snprintf(buf, n, "errno %d (%s)", r.code, strerror(r.code));
  return buf;
}

/* The call must fail with EPERM under the filter and, when `control`, must not
 * fail with EPERM without it. */
static void check_denied(const char *name, int (*setup)(void), int (*fn)(void), bool control) {
  char b1[64], b2[64];
  struct result with = run_case(true, setup, fn);
  ok(with.exited && with.code == EPERM, "%s: EPERM with the filter (%s)", name, describe(with, b1, sizeof b1));
  if (!control) return;
  struct result without = run_case(false, setup, fn);
  if (without.exited && without.code == EPERM) {
    printf("ok %d - # SKIP %s: the host itself refuses it with EPERM\n", ++tap_n, name);
    return;
  }
  ok(without.exited && without.code != EPERM && without.code < EXIT_INSTALL_FAILED,
     "%s: positive control, not EPERM without the filter (%s)", name, describe(without, b2, sizeof b2));
}

/* ---- setups ------------------------------------------------------------ */

static int setup_private_mountns(void) {
  if (unshare(CLONE_NEWNS) < 0) return -1;
  return mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
}

static int setup_mounted_tmpfs(void) {
  if (setup_private_mountns() < 0) return -1;
  return mount("hutch-test", tmpdir, "tmpfs", 0, "size=64k");
}

/* ---- denied calls ------------------------------------------------------ */

static int do_mount(void) { return errno_of(mount("hutch-test", tmpdir, "tmpfs", 0, "size=64k")); }
static int do_umount2(void) { return errno_of(umount2(tmpdir, 0)); }
static int do_unshare_user(void) { return errno_of(unshare(CLONE_NEWUSER)); }
static int do_unshare_net(void) { return errno_of(unshare(CLONE_NEWNET)); }
static int do_unshare_time(void) { return errno_of(unshare(CLONE_NEWTIME)); }

static int do_clone_newpid(void) {
  long r = syscall(SYS_clone, CLONE_NEWPID | SIGCHLD, 0, 0, 0, 0);
  if (r == 0) _exit(0);
  if (r < 0) return errno;
  waitpid((pid_t)r, NULL, 0);
  return 0;
}

static int do_setns(void) {
  int fd = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 200;
  return errno_of(setns(fd, CLONE_NEWNET));
}

static int do_keyctl(void) {
  return errno_of(syscall(SYS_keyctl, KEYCTL_GET_KEYRING_ID, KEY_SPEC_PROCESS_KEYRING, 1));
}

static int do_add_key(void) {
  return errno_of(syscall(SYS_add_key, "user", "hutch-test", "x", 1, KEY_SPEC_PROCESS_KEYRING));
}

/* An unknown command: EINVAL from the kernel, never a BPF object. */
static int do_bpf(void) { return errno_of(syscall(SYS_bpf, 0x7fff, NULL, 0)); }
static int do_perf_event_open(void) { return errno_of(syscall(SYS_perf_event_open, NULL, 0, -1, -1, 0)); }
static int do_userfaultfd(void) { return errno_of(syscall(SYS_userfaultfd, O_CLOEXEC)); }

static int do_io_uring_setup(void) {
  struct io_uring_params p;
  memset(&p, 0, sizeof p);
  return errno_of(syscall(SYS_io_uring_setup, 1, &p));
}

static int do_init_module(void) { return errno_of(syscall(SYS_init_module, NULL, 0, "")); }
static int do_finit_module(void) { return errno_of(syscall(SYS_finit_module, -1, "", 0)); }

/* Unknown flag bits, too many segments and no entry: EINVAL before anything
 * is loaded or unloaded. */
static int do_kexec_load(void) { return errno_of(syscall(SYS_kexec_load, 0, 1000, NULL, 0x0000ff00UL)); }

/* Wrong magic: EINVAL after the capability check, nothing happens. */
static int do_reboot(void) { return errno_of(syscall(SYS_reboot, 0, 0, 0, NULL)); }
static int do_swapon(void) { return errno_of(syscall(SYS_swapon, "/nonexistent-hutch-swap", 0)); }
static int do_clock_settime(void) {
  struct timespec ts = {1, 0};
  return errno_of(clock_settime(CLOCK_MONOTONIC, &ts)); /* EINVAL: MONOTONIC cannot be set */
}
static int do_settimeofday(void) {
  /* Raw syscall: glibc validates tv_usec itself and emulates settimeofday
   * with clock_settime.  The kernel answers EINVAL (tv_usec out of range). */
  struct timeval tv = {1, 2000000};
  return errno_of(syscall(SYS_settimeofday, &tv, NULL));
}
static int do_open_by_handle_at(void) { return errno_of(syscall(SYS_open_by_handle_at, -1, NULL, 0)); }
static int do_pivot_root(void) {
  return errno_of(syscall(SYS_pivot_root, "/nonexistent-hutch-a", "/nonexistent-hutch-b"));
}
static int do_move_mount(void) { return errno_of(syscall(SYS_move_mount, -1, "", -1, "", 0)); }
static int do_personality_bad(void) { return errno_of(personality(ADDR_NO_RANDOMIZE)); }

/* ---- calls that must keep working -------------------------------------- */

static void *thread_fn(void *arg) { return arg; }

static int do_ordinary(void) {
  if (getpid() <= 0) return 1;
  int p[2];
  if (pipe2(p, O_CLOEXEC) < 0) return 2;
  char c = 'x';
  if (write(p[1], &c, 1) != 1 || read(p[0], &c, 1) != 1 || c != 'x') return 3;
  pid_t pid = fork();
  if (pid < 0) return 4;
  if (pid == 0) _exit(7);
  int st;
  if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 7) return 5;
  /* glibc tries clone3 first and must fall back to clone on ENOSYS. */
  pthread_t t;
  void *ret = NULL;
  if (pthread_create(&t, NULL, thread_fn, &c) != 0 || pthread_join(t, &ret) != 0 || ret != &c) return 6;
  return 0;
}

static int do_unshare_files(void) { return errno_of(unshare(CLONE_FILES | CLONE_FS | CLONE_SYSVSEM)); }

struct clone_args_min {
  uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls;
};

static int do_clone3(void) {
  struct clone_args_min a;
  memset(&a, 0, sizeof a);
  a.exit_signal = SIGCHLD;
  long r = syscall(SYS_clone3, &a, sizeof a);
  if (r == 0) _exit(0);
  if (r < 0) return errno;
  waitpid((pid_t)r, NULL, 0);
  return 0;
}

static int do_personality_ok(void) {
  int cur = personality(0xffffffff);
  if (cur < 0) return errno;
  if (personality(PER_LINUX) < 0) return errno;
  if (personality(0xffffffff) < 0) return errno;
  return 0;
}

/* Every name in the deny list, called with junk arguments, must be refused.
 * Guarded: if mount is not refused the filter is not in force and nothing
 * else is attempted (vhangup or acct would act on the host).  Names of calls
 * that were not refused go to deny_pipe. */
static int deny_pipe = -1;
static int do_all_denied(void) {
  if (mount("hutch-test", tmpdir, "tmpfs", 0, NULL) == 0 || errno != EPERM) return 1;
  int bad = 0;
  for (const char *const *p = hutch_seccomp_denied_syscalls(); *p; p++) {
    int nr = seccomp_syscall_resolve_name(*p);
    if (nr < 0) continue; /* not on this architecture */
    errno = 0;
    long r = syscall(nr, -1L, -1L, -1L, -1L, -1L, -1L);
    if (r != -1 || errno != EPERM) {
      dprintf(deny_pipe, "%s=%ld/%d ", *p, r, errno);
      bad = 2;
    }
  }
  return bad;
}

#ifdef __x86_64__
/* getpid through the i386 entry point: arch AUDIT_ARCH_I386, nr 20. */
static int do_int80_getpid(void) {
  long ret;
  __asm__ volatile("int $0x80" : "=a"(ret) : "a"(20L) : "memory", "cc");
  return ret == (long)getpid() ? 0 : 100;
}

#define X32_SYSCALL_BIT 0x40000000L
static int do_x32_getpid(void) {
  long r = syscall(X32_SYSCALL_BIT | SYS_getpid);
  if (r == (long)getpid()) return 0;
  return r < 0 ? errno : 100;
}
#endif

int main(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/hutch-test-seccomp-XXXXXX");
  if (!mkdtemp(tmpdir)) {
    perror("mkdtemp");
    return 1;
  }
  bool root = geteuid() == 0;
  char b[64];

  /* The filter must not break ordinary programs. */
  struct result r = run_case(true, NULL, do_ordinary);
  ok(r.exited && r.code == 0, "getpid, pipe read/write, fork, pthread_create work with the filter (%s)",
     r.exited ? (r.code ? "step failed" : "ok") : describe(r, b, sizeof b));
  r = run_case(true, NULL, do_unshare_files);
  ok(r.exited && r.code == 0, "unshare(CLONE_FILES|CLONE_FS|CLONE_SYSVSEM) works with the filter (%s)",
     describe(r, b, sizeof b));
  r = run_case(true, NULL, do_clone3);
  ok(r.exited && r.code == ENOSYS, "clone3 fails with ENOSYS under the filter (%s)", describe(r, b, sizeof b));
  r = run_case(false, NULL, do_clone3);
  ok(r.exited && r.code != ENOSYS, "clone3 positive control: not ENOSYS without the filter (%s)",
     describe(r, b, sizeof b));
  r = run_case(true, NULL, do_personality_ok);
  ok(r.exited && r.code == 0, "personality query and PER_LINUX allowed (%s)", describe(r, b, sizeof b));

  /* Refused calls.  The positive controls need root (CAP_SYS_ADMIN etc.);
   * without it the host itself answers EPERM to most of them. */
  check_denied("mount", setup_private_mountns, do_mount, root);
  check_denied("umount2", setup_mounted_tmpfs, do_umount2, root);
  check_denied("unshare(CLONE_NEWUSER)", NULL, do_unshare_user, true);
  check_denied("unshare(CLONE_NEWNET)", NULL, do_unshare_net, root);
  check_denied("unshare(CLONE_NEWTIME)", NULL, do_unshare_time, root);
  check_denied("clone(CLONE_NEWPID)", NULL, do_clone_newpid, root);
  check_denied("setns", NULL, do_setns, root);
  check_denied("keyctl", NULL, do_keyctl, true);
  check_denied("add_key", NULL, do_add_key, true);
  check_denied("bpf", NULL, do_bpf, true);
  check_denied("perf_event_open", NULL, do_perf_event_open, true);
  check_denied("userfaultfd", NULL, do_userfaultfd, root);
  check_denied("io_uring_setup", NULL, do_io_uring_setup, true);
  check_denied("init_module", NULL, do_init_module, root);
  check_denied("finit_module", NULL, do_finit_module, root);
  check_denied("kexec_load", NULL, do_kexec_load, root);
  check_denied("reboot", NULL, do_reboot, root);
  check_denied("swapon", NULL, do_swapon, root);
  check_denied("clock_settime", NULL, do_clock_settime, true);
  check_denied("settimeofday", NULL, do_settimeofday, root);
  check_denied("open_by_handle_at", NULL, do_open_by_handle_at, root);
  check_denied("pivot_root", NULL, do_pivot_root, true);
  check_denied("move_mount", NULL, do_move_mount, true);
  check_denied("personality(ADDR_NO_RANDOMIZE)", NULL, do_personality_bad, true);

  /* Every listed name. */
  int p[2];
  if (pipe2(p, O_CLOEXEC) < 0) return 1;
  deny_pipe = p[1];
  r = run_case(true, NULL, do_all_denied);
  close(p[1]);
  char names[4096] = "";
  ssize_t n = read(p[0], names, sizeof names - 1);
  if (n > 0) names[n] = 0;
  close(p[0]);
  ok(r.exited && r.code == 0, "every name in hutch_seccomp_denied_syscalls() is refused (%s) %s",
     describe(r, b, sizeof b), names);
  int count = 0;
  for (const char *const *q = hutch_seccomp_denied_syscalls(); *q; q++) count++;
  ok(count >= 50, "deny list has %d names", count);

#ifdef __x86_64__
  /* Foreign ABIs: i386 via int 0x80 and x32 must kill the process. */
  struct result int80_plain = run_case(false, NULL, do_int80_getpid);
  if (int80_plain.exited && int80_plain.code == 0) {
    ok(1, "int 0x80 getpid works without the filter (positive control)");
    r = run_case(true, NULL, do_int80_getpid);
    ok(!r.exited && r.code == SIGSYS, "int 0x80 getpid with the filter is killed by SIGSYS (%s)",
       describe(r, b, sizeof b));
  } else {
    printf("ok %d - # SKIP no i386 emulation on this kernel (%s)\n", ++tap_n, describe(int80_plain, b, sizeof b));
  }
  struct result x32_plain = run_case(false, NULL, do_x32_getpid);
  printf("# x32 getpid without the filter: %s\n", describe(x32_plain, b, sizeof b));
  r = run_case(true, NULL, do_x32_getpid);
  ok((!r.exited && r.code == SIGSYS) || (r.exited && r.code != 0 && r.code < EXIT_INSTALL_FAILED),
     "x32 getpid with the filter fails or is killed (%s)", describe(r, b, sizeof b));
  ok(!r.exited && r.code == SIGSYS, "x32 syscalls get the bad-arch action (SIGSYS) from libseccomp");
#endif

  rmdir(tmpdir);
  return done_testing();
}
