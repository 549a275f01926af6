/* The `native` runtime: Linux namespaces, an idmapped rootfs, seccomp,
 * reduced capabilities and cgroup limits.
 *
 * start() runs in hutch-shim (host root).  The order below is the checklist
 * a reviewer audits (as nsjail's contain.c):
 *
 *   parent (host root)                      child (new user/mnt/pid/uts/ipc/net ns)
 *   ------------------                      ---------------------------------------
 *   cgroup create + limits
 *   clone(NEWUSER|NEWNS|NEWPID|…) ───────►  wait for the parent
 *   write uid/gid maps
 *   move child into the cgroup
 *   oom_score_adj -1000 (init only)
 *   idmapped mounts: template (ro), writable layer, /usr (ro)
 *   send the mount fds ──────────────────►  become uid/gid 0 of the namespace
 *                                           unshare(NEWCGROUP) (rooted at its cgroup)
 *                                           hostname, loopback up
 *                                           overlay root, /usr, /proc, /dev, /tmp; pivot_root
 *                                           drop capabilities, no_new_privs, seccomp
 *   wait: error text, or EOF on exec  ◄───  execveat(hutch-init) with the channel on fd 3
 *   wait for hutch-init's HELLO
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/close_range.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/proto.h"
#include "common/util.h"
#include "isolate/caps.h"
#include "isolate/cgroup.h"
#include "isolate/mounts.h"
#include "isolate/netns.h"
#include "isolate/seccomp.h"
#include "isolate/userns.h"
#include "runtime/runtime.h"

#define HELLO_TIMEOUT_MS 10000

static int send_fds(int sock, const int *fds, int n, hutch_err *err) {
  char byte = 'F';
  struct iovec iov = {&byte, 1};
  union {
    char buf[CMSG_SPACE(sizeof(int) * 4)];
    struct cmsghdr align;
  } u;
  memset(&u, 0, sizeof u);
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                       .msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)n)};
  struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n);
  memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)n);
  ssize_t r;
  do r = sendmsg(sock, &msg, MSG_NOSIGNAL);
  while (r < 0 && errno == EINTR);
  if (r < 0) return hutch_err_sys(err, errno, "send mount fds to the sandbox");
  return 0;
}

static int recv_fds(int sock, int *fds, int n) {
  char byte;
  struct iovec iov = {&byte, 1};
  union {
    char buf[CMSG_SPACE(sizeof(int) * 4)];
    struct cmsghdr align;
  } u;
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
  ssize_t r;
  do r = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  while (r < 0 && errno == EINTR);
  if (r <= 0) return -1;
  struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
  if (!c || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(sizeof(int) * (size_t)n)) return -1;
  memcpy(fds, CMSG_DATA(c), sizeof(int) * (size_t)n);
  return 0;
}

/* Child side.  Never returns: execs hutch-init or reports and exits. */
static __attribute__((noreturn)) void child_main(const struct hutch_sandbox_spec *spec, int sync_fd, int chan_fd,
                                                 int init_fd) {
  hutch_err err = HUTCH_ERR_INIT;
  int fds[3] = {-1, -1, -1};
  /* If the shim dies during setup (or later), the sandbox goes with it. */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (recv_fds(sync_fd, fds, 3) < 0) {
    hutch_err_sys(&err, errno ? errno : EPIPE, "receive mount fds");
    goto fail;
  }
  if (setgroups(0, NULL) < 0 || setresgid(0, 0, 0) < 0 || setresuid(0, 0, 0) < 0) {
    hutch_err_sys(&err, errno, "become root of the user namespace");
    goto fail;
  }
  if (unshare(CLONE_NEWCGROUP) < 0) {
    hutch_err_sys(&err, errno, "unshare cgroup namespace");
    goto fail;
  }
  if (sethostname(spec->hostname, strlen(spec->hostname)) < 0) {
    hutch_err_sys(&err, errno, "sethostname");
    goto fail;
  }
  if (hutch_netns_loopback_up(&err) < 0) goto fail;
  struct hutch_rootfs_plan plan = {
      .rootfs_fd = fds[0], .usr_fd = fds[1], .lower_fd = fds[2], .tmp_bytes = spec->tmp_bytes};
  if (spec->usr_src == NULL) plan.usr_fd = -1;
  if (spec->lower == NULL) plan.lower_fd = -1;
  if (hutch_mounts_setup_root(&plan, &err) < 0) goto fail;
  for (int i = 0; i < 3; i++) close(fds[i]);
  /* The channel becomes fd 3 of hutch-init; everything else is close-on-exec. */
  if (chan_fd != 3) {
    if (dup3(chan_fd, 3, 0) < 0) {
      hutch_err_sys(&err, errno, "dup channel");
      goto fail;
    }
  } else {
    int fl = fcntl(3, F_GETFD);
    fcntl(3, F_SETFD, fl & ~FD_CLOEXEC);
  }
  if (syscall(SYS_close_range, 4, ~0u, CLOSE_RANGE_CLOEXEC) < 0) {
    hutch_err_sys(&err, errno, "close_range");
    goto fail;
  }
  if (hutch_caps_drop(&err) < 0) goto fail;
  if (hutch_seccomp_install(&err) < 0) goto fail;
  {
    char *const argv[] = {"hutch-init", NULL};
    char *const envp[] = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", NULL};
    syscall(SYS_execveat, init_fd, "", argv, envp, AT_EMPTY_PATH);
    hutch_err_sys(&err, errno, "exec hutch-init");
  }
fail:
  (void)!write(sync_fd, err.msg, strlen(err.msg));
  _exit(1);
}

/* Wait for the child's verdict: EOF means exec succeeded (the sync socket is
 * close-on-exec); bytes are an error message. */
static int wait_child_setup(int sync_fd, hutch_err *err) {
  char msg[HUTCH_ERR_MSG_MAX];
  ssize_t r = read_full(sync_fd, msg, sizeof msg - 1);
  if (r < 0) return hutch_err_sys(err, errno, "read sandbox setup result");
  if (r > 0) {
    msg[r] = 0;
    return hutch_err_sys(err, 0, "sandbox setup: %s", msg);
  }
  return 0;
}

static int wait_hello(int chan, hutch_err *err) {
  struct pollfd p = {.fd = chan, .events = POLLIN};
  int r;
  do r = poll(&p, 1, HELLO_TIMEOUT_MS);
  while (r < 0 && errno == EINTR);
  if (r == 0) return hutch_err_sys(err, ETIMEDOUT, "waiting for hutch-init");
  if (r < 0) return hutch_err_sys(err, errno, "poll hutch-init channel");
  struct hutch_frame_hdr h;
  struct hutch_buf b;
  hutch_buf_init(&b);
  r = hutch_frame_read(chan, &h, &b, err);
  hutch_buf_free(&b);
  if (r < 0) return hutch_err_wrap(err, "read hutch-init hello");
  if (r == 0) return hutch_err_sys(err, EPIPE, "hutch-init exited before saying hello");
  if (h.type != HUTCH_MSG_HELLO) return hutch_err_sys(err, EPROTO, "hutch-init sent frame type %u first", h.type);
  return 0;
}

/* Moving a process between cgroups waits for an RCU grace period in the
 * kernel (several ms when the cgroup lock was idle).  Nothing else in the
 * parent's setup depends on it, so it runs on a thread while the parent
 * prepares the mounts; the child only proceeds once both are done. */
struct attach_job {
  const struct hutch_sandbox_spec *spec;
  pid_t pid;
  int rc;
  hutch_err err;
};

static void *attach_thread(void *arg) {
  struct attach_job *j = arg;
  j->rc = hutch_cgroup_attach(j->spec->instance, j->spec->id, j->pid, &j->err);
  return NULL;
}

static int native_start(const struct hutch_sandbox_spec *spec, struct hutch_runtime_instance *out, hutch_err *err) {
  int chan[2] = {-1, -1}, sync[2] = {-1, -1};
  cleanup_close int init_fd = -1;
  cleanup_close int userns_fd = -1;
  cleanup_close int storage_fd = -1;
  int mfds[3] = {-1, -1, -1};
  pid_t pid = -1;
  struct attach_job job = {.spec = spec, .rc = -1};
  pthread_t attacher;
  bool attaching = false;

  if (hutch_cgroup_create(spec->instance, spec->id, &spec->limits, err) < 0) return hutch_err_wrap(err, "cgroup");
  if (hutch_fault("shim.cgroup")) {
    hutch_err_sys(err, EIO, "fault injected at shim.cgroup");
    goto fail;
  }
  init_fd = open(spec->init_path, O_PATH | O_CLOEXEC);
  if (init_fd < 0) {
    hutch_err_sys(err, errno, "open hutch-init `%s`", spec->init_path);
    goto fail;
  }
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, chan) < 0 ||
      socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sync) < 0) {
    hutch_err_sys(err, errno, "socketpair");
    goto fail;
  }
  pid = (pid_t)syscall(SYS_clone, CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWUTS | CLONE_NEWIPC |
                                      CLONE_NEWNET | SIGCHLD,
                       NULL, NULL, NULL, NULL);
  if (pid < 0) {
    hutch_err_sys(err, errno, "clone sandbox namespaces");
    goto fail;
  }
  if (pid == 0) {
    close(chan[0]);
    close(sync[0]);
    child_main(spec, sync[1], chan[1], init_fd);
  }
  close(chan[1]);
  chan[1] = -1;
  close(sync[1]);
  sync[1] = -1;

  if (hutch_userns_write_maps(pid, spec->uid_base, spec->uid_count, err) < 0) goto fail;
  job.pid = pid;
  if (pthread_create(&attacher, NULL, attach_thread, &job) != 0) {
    hutch_err_sys(err, EAGAIN, "start cgroup attach thread");
    goto fail;
  }
  attaching = true;
  {
    char path[64];
    /* Spare hutch-init from the OOM killer so a memory hog kills the hog,
     * not the sandbox.  Needs CAP_SYS_RESOURCE, which some hosts (containers)
     * withhold: then init is merely small, and if it is killed anyway the
     * shim reports the sandbox as failed. */
    snprintf(path, sizeof path, "/proc/%d/oom_score_adj", (int)pid);
    hutch_err oerr = HUTCH_ERR_INIT;
    if (write_file_str(path, "-1000", &oerr) < 0 && oerr.errnum != EACCES && oerr.errnum != EPERM) {
      *err = oerr;
      goto fail;
    }
    snprintf(path, sizeof path, "/proc/%d/ns/user", (int)pid);
    userns_fd = open(path, O_RDONLY | O_CLOEXEC);
    if (userns_fd < 0) {
      hutch_err_sys(err, errno, "open `%s`", path);
      goto fail;
    }
  }
  /* /usr is the host's (owned by real uid 0): idmapped with the sandbox's
   * own namespace.  Template and writable layer hold storage ids: idmapped
   * with a namespace mapping storage ids onto the sandbox's range. */
  storage_fd = hutch_userns_fd(HUTCH_STORAGE_UID_BASE, spec->uid_base, spec->uid_count, err);
  if (storage_fd < 0) goto fail;
  mfds[0] = hutch_userns_idmapped_tree(spec->rootfs, storage_fd, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, err);
  if (mfds[0] < 0) goto fail;
  if (spec->usr_src) {
    mfds[1] = hutch_userns_idmapped_tree(spec->usr_src, userns_fd,
                                         MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, err);
    if (mfds[1] < 0) goto fail;
  } else {
    mfds[1] = open("/dev/null", O_RDONLY | O_CLOEXEC); /* placeholder; the child ignores it */
  }
  if (spec->lower) {
    mfds[2] = hutch_userns_idmapped_tree(spec->lower, storage_fd,
                                         MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, err);
    if (mfds[2] < 0) goto fail;
  } else {
    mfds[2] = open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
  pthread_join(attacher, NULL);
  attaching = false;
  if (job.rc < 0) {
    *err = job.err;
    goto fail;
  }
  if (hutch_fault("shim.spawn")) {
    hutch_err_sys(err, EIO, "fault injected at shim.spawn");
    goto fail;
  }
  if (send_fds(sync[0], mfds, 3, err) < 0) goto fail;
  for (int i = 0; i < 3; i++) close(mfds[i]), mfds[i] = -1;
  if (wait_child_setup(sync[0], err) < 0) goto fail;
  if (wait_hello(chan[0], err) < 0) goto fail;
  close(sync[0]);
  out->init_pid = pid;
  out->channel_fd = chan[0];
  return 0;

fail:
  if (attaching) pthread_join(attacher, NULL);
  for (int i = 0; i < 3; i++)
    if (mfds[i] >= 0) close(mfds[i]);
  for (int i = 0; i < 2; i++) {
    if (sync[i] >= 0) close(sync[i]);
    if (chan[i] >= 0) close(chan[i]);
  }
  if (pid > 0) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
  }
  hutch_err cerr = HUTCH_ERR_INIT;
  hutch_cgroup_destroy(spec->instance, spec->id, &cerr);
  return -1;
}

static int native_pause(const struct hutch_sandbox_spec *spec, hutch_err *err) {
  return hutch_cgroup_freeze(spec->instance, spec->id, true, err);
}

static int native_resume(const struct hutch_sandbox_spec *spec, hutch_err *err) {
  return hutch_cgroup_freeze(spec->instance, spec->id, false, err);
}

static int native_destroy(const struct hutch_sandbox_spec *spec, hutch_err *err) {
  if (hutch_cgroup_destroy(spec->instance, spec->id, err) < 0) return hutch_err_wrap(err, "destroy sandbox cgroup");
  return 0;
}

static bool native_available(char *why, size_t n) {
  hutch_err err = HUTCH_ERR_INIT;
  enum hutch_cgroup_version v;
  if (hutch_cgroup_probe(&v, &err) < 0) {
    snprintf(why, n, "%s", err.msg);
    return false;
  }
  size_t len = 0;
  hutch_err e2 = HUTCH_ERR_INIT;
  char *s = read_file("/proc/sys/user/max_user_namespaces", 64, &len, &e2);
  bool ok = s && atol(s) > 0;
  free(s);
  if (!ok) {
    snprintf(why, n, "user namespaces are disabled (/proc/sys/user/max_user_namespaces)");
    return false;
  }
  return true;
}

const struct hutch_runtime_ops hutch_runtime_native = {
    .name = "native",
    .caps = HUTCH_RT_CAP_PAUSE,
    .available = native_available,
    .start = native_start,
    .pause = native_pause,
    .resume = native_resume,
    .destroy = native_destroy,
};
