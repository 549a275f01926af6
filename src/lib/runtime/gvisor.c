/* The `gvisor` runtime: hutch-init as PID 1 of a gVisor sandbox (runsc).
 *
 * start() runs in hutch-shim (host root):
 *
 *   shim (host root)                                  runsc / gVisor
 *   ----------------                                  --------------
 *   refuse the overlay backend (no `lower`)
 *   own mount namespace, / rslave (once)
 *   cgroup create + limits (as native)
 *   fresh runsc state dir (--root)
 *   idmapped root at <bundle>/rootfs:
 *     disk BASE+c <-> host c (the gofer is host root)
 *   <bundle>/config.json (OCI 1.0)
 *   socketpair; fork ──────────────────────────────►  join the cgroup
 *                                                     stdin = stdout = socket
 *                                                     exec runsc run|restore (foreground,
 *                                                       --ignore-cgroups: sentry and gofer
 *                                                       stay in the sandbox's cgroup)
 *                                                     hutch-init --stdio-channel: fd 0 -> 3
 *   wait: HELLO (boot) or PING -> PONG (restore) ◄──
 *
 * The shim waits on the `runsc run` process (it exits when the sandbox
 * does); everything else talks to runsc through the state dir, so pause,
 * resume, checkpoint and destroy work from hutchd with only the spec.
 * Destroy's cgroup kill is the safety net for whatever runsc leaves.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/proto.h"
#include "common/log.h"
#include "common/util.h"
#include "isolate/cgroup.h"
#include "isolate/userns.h"
#include "runtime/runtime.h"

#define GV_READY_TIMEOUT_MS 30000 /* gVisor boots (and restores) slower than namespaces */
#define GV_PING_ID 0x67760001u    /* the PING a restored hutch-init answers */
#define GV_ARGV_MAX 32

/* ---- runsc command lines ------------------------------------------------- */

struct runsc_cmd {
  const char *argv[GV_ARGV_MAX];
  int n;
  char debug_log[4200];
};

static const char *runsc_bin(const struct hutch_sandbox_spec *spec) {
  return spec->runsc_path ? spec->runsc_path : "runsc";
}

static void rs_add(struct runsc_cmd *c, const char *arg) {
  if (c->n < GV_ARGV_MAX - 1) c->argv[c->n++] = arg;
  c->argv[c->n] = NULL;
}

/* Global flags: the same for every command, so restore sees the flags the
 * checkpointed sandbox ran with.  --overlay2 none: writes go through to the
 * sandbox's btrfs root, not to a memory overlay.  --ignore-cgroups: the
 * shim put runsc into the sandbox's cgroup itself. */
static void rs_init(struct runsc_cmd *c, const struct hutch_sandbox_spec *spec) {
  c->n = 0;
  rs_add(c, runsc_bin(spec));
  rs_add(c, "--root");
  rs_add(c, spec->state_dir);
  rs_add(c, "--platform");
  rs_add(c, spec->runsc_platform ? spec->runsc_platform : "ptrace");
  rs_add(c, "--network");
  rs_add(c, "none");
  rs_add(c, "--overlay2");
  rs_add(c, "none");
  rs_add(c, "--host-uds");
  rs_add(c, "none");
  rs_add(c, "--ignore-cgroups");
  /* HUTCH_RUNSC_DEBUG=1 in the environment of hutchd: runsc's debug logs,
   * one file per runsc command, in /tmp/hutch-runsc-debug/ (kept after the sandbox). */
  const char *dbg = getenv("HUTCH_RUNSC_DEBUG");
  if (dbg && !strcmp(dbg, "1")) {
    snprintf(c->debug_log, sizeof c->debug_log, "--debug-log=/tmp/hutch-runsc-debug/%s.%%TIMESTAMP%%.%%COMMAND%%.log", spec->id);
    rs_add(c, "--debug");
    rs_add(c, c->debug_log);
  }
}

static int check_paths(const struct hutch_sandbox_spec *spec, hutch_err *err) {
  if (!spec->state_dir || !spec->bundle_dir)
    return hutch_err_sys(err, EINVAL, "gvisor runtime: the sandbox spec has no state_dir or bundle_dir");
  return 0;
}

static int runsc_run(struct runsc_cmd *c, const char *step, hutch_err *err) {
  if (hutch_run(c->argv, -1, -1, NULL, NULL, err) < 0) return hutch_err_wrap(err, "%s", step);
  return 0;
}

/* ---- the OCI bundle ------------------------------------------------------- */

static json_t *strings(const char *const *v) {
  json_t *a = json_array();
  for (; *v; v++) json_array_append_new(a, json_string(*v));
  return a;
}

static json_t *oci_mount(const char *dst, const char *type, const char *src, const char *const *opts) {
  json_t *m = json_pack("{s:s, s:s, s:s}", "destination", dst, "type", type, "source", src);
  json_object_set_new(m, "options", strings(opts));
  return m;
}

/* Docker's default capability set. */
static const char *const default_caps[] = {
    "CAP_CHOWN",   "CAP_DAC_OVERRIDE", "CAP_FSETID",  "CAP_FOWNER",           "CAP_MKNOD",
    "CAP_NET_RAW", "CAP_SETGID",       "CAP_SETUID",  "CAP_SETFCAP",          "CAP_SETPCAP",
    "CAP_KILL",    "CAP_AUDIT_WRITE",  "CAP_SYS_CHROOT", "CAP_NET_BIND_SERVICE", NULL,
};

static char *oci_config(const struct hutch_sandbox_spec *spec, const char *root) {
  static const char *const args[] = {"/.hutch/init", "--stdio-channel", NULL};
  static const char *const env[] = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", NULL};
  json_t *caps = json_pack("{s:o, s:o, s:o}", "bounding", strings(default_caps), "effective", strings(default_caps),
                           "permitted", strings(default_caps));
  json_t *process = json_pack("{s:b, s:{s:i, s:i}, s:o, s:o, s:s, s:o, s:b}", "terminal", 0, "user", "uid", 0, "gid",
                              0, "args", strings(args), "env", strings(env), "cwd", "/", "capabilities", caps,
                              "noNewPrivileges", 1);
  json_t *mounts = json_array();
  static const char *const proc_o[] = {"nosuid", "noexec", "nodev", NULL};
  static const char *const dev_o[] = {"nosuid", "strictatime", "mode=755", "size=65536k", NULL};
  static const char *const pts_o[] = {"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", NULL};
  static const char *const shm_o[] = {"nosuid", "noexec", "nodev", "mode=1777", NULL};
  static const char *const usr_o[] = {"rbind", "ro", "nosuid", "nodev", NULL};
  static const char *const init_o[] = {"bind", "ro", "nosuid", "nodev", NULL};
  json_array_append_new(mounts, oci_mount("/proc", "proc", "proc", proc_o));
  json_array_append_new(mounts, oci_mount("/dev", "tmpfs", "tmpfs", dev_o));
  json_array_append_new(mounts, oci_mount("/dev/pts", "devpts", "devpts", pts_o));
  json_array_append_new(mounts, oci_mount("/dev/shm", "tmpfs", "shm", shm_o));
  char size[48];
  snprintf(size, sizeof size, "size=%llu", (unsigned long long)spec->tmp_bytes);
  const char *tmp_o[] = {"nosuid", "nodev", "mode=1777", spec->tmp_bytes ? size : NULL, NULL};
  json_array_append_new(mounts, oci_mount("/tmp", "tmpfs", "tmpfs", tmp_o));
  if (spec->usr_src) json_array_append_new(mounts, oci_mount("/usr", "bind", spec->usr_src, usr_o));
  json_array_append_new(mounts, oci_mount("/.hutch/init", "bind", spec->init_path, init_o));
  json_t *o = json_pack("{s:s, s:o, s:{s:s, s:b}, s:s, s:o, s:{s:[{s:s}, {s:s}, {s:s}, {s:s}, {s:s}]}}",
                        "ociVersion", "1.0.0", "process", process, "root", "path", root, "readonly", 0, "hostname",
                        spec->hostname, "mounts", mounts, "linux", "namespaces", "type", "pid", "type", "ipc", "type",
                        "uts", "type", "mount", "type", "network");
  if (!o) return NULL;
  char *text = json_dumps(o, JSON_INDENT(1));
  json_decref(o);
  return text;
}

/* ---- the shim's mount namespace and the idmapped root --------------------- */

/* The root mount lives in a mount namespace of the shim's own, so it goes
 * away with the shim (and with runsc, which inherits it). */
static int private_mount_ns(hutch_err *err) {
  static bool done;
  if (done) return 0;
  if (unshare(CLONE_NEWNS) < 0) return hutch_err_sys(err, errno, "unshare mount namespace");
  if (mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) < 0) return hutch_err_sys(err, errno, "make / rslave");
  done = true;
  return 0;
}

/* Files on disk hold storage ids (BASE + c); the gofer, host root, must
 * see them as c and create c's files as BASE + c: an idmapped mount whose
 * namespace maps ns id BASE + c to host id c. */
static int mount_root(const struct hutch_sandbox_spec *spec, const char *target, hutch_err *err) {
  cleanup_close int userns = hutch_userns_fd(HUTCH_STORAGE_UID_BASE, 0, HUTCH_UID_SLOT_SIZE, err);
  if (userns < 0) return hutch_err_wrap(err, "storage id namespace");
  cleanup_close int tree = hutch_userns_idmapped_tree(spec->rootfs, userns, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, err);
  if (tree < 0) return -1;
  if (move_mount(tree, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH) < 0)
    return hutch_err_sys(err, errno, "attach the sandbox root at `%s`", target);
  return 0;
}

/* ---- state dir ------------------------------------------------------------ */

/* Remove what is inside `dir` (not `dir`): runsc's state of an earlier run. */
static int empty_dir(const char *dir, hutch_err *err) {
  DIR *d = opendir(dir);
  if (!d) {
    if (errno == ENOENT) return 0;
    return hutch_err_sys(err, errno, "open `%s`", dir);
  }
  int rc = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    cleanup_free char *p = xasprintf("%s/%s", dir, e->d_name);
    if (rm_rf(p, err) < 0) {
      rc = -1;
      break;
    }
  }
  closedir(d);
  return rc;
}

/* ---- readiness ------------------------------------------------------------ */

/* runsc reports on its stderr, the shim's: when that is a file (shim.log),
 * its last line names what went wrong. */
static void last_log_line(char *out, size_t n) {
  out[0] = 0;
  struct stat st;
  if (fstat(2, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) return;
  /* stderr is open write-only: read the file through a new description. */
  cleanup_close int fd = open("/proc/self/fd/2", O_RDONLY | O_CLOEXEC);
  if (fd < 0 || fstat(fd, &st) < 0) return;
  char buf[1024];
  off_t off = st.st_size > (off_t)sizeof buf - 1 ? st.st_size - (off_t)(sizeof buf - 1) : 0;
  ssize_t r = pread(fd, buf, sizeof buf - 1, off);
  if (r <= 0) return;
  buf[r] = 0;
  while (r > 0 && (buf[r - 1] == '\n' || buf[r - 1] == '\r')) buf[--r] = 0;
  const char *line = strrchr(buf, '\n');
  line = line ? line + 1 : buf;
  size_t l = strlen(line);
  if (l >= n) l = n - 1;
  memcpy(out, line, l);
  out[l] = 0;
}

/* The channel failed (EOF or error) before init answered: if runsc ended,
 * say how, with its last word. */
static int runsc_failed(pid_t runsc, const char *what, hutch_err *err) {
  int st = 0;
  pid_t r = 0;
  for (int i = 0; i < 100 && r == 0; i++) { /* it is exiting: give it 1 s */
    r = waitpid(runsc, &st, WNOHANG);
    if (r == 0) usleep(10000);
  }
  if (r != runsc) return hutch_err_sys(err, EPIPE, "hutch-init's channel closed before its %s", what);
  char last[512];
  last_log_line(last, sizeof last);
  if (WIFEXITED(st))
    return hutch_err_sys(err, 0, "runsc exited with status %d before hutch-init's %s%s%s", WEXITSTATUS(st), what,
                         last[0] ? ": " : "", last);
  return hutch_err_sys(err, 0, "runsc killed by signal %d before hutch-init's %s", WTERMSIG(st), what);
}

/* Read frames until one of `want` (with id `id` unless id is 0) arrives;
 * others are dropped (after a restore: output of commands whose shim is
 * gone).  Within GV_READY_TIMEOUT_MS. */
static int wait_frame(int chan, pid_t runsc, uint16_t want, uint32_t id, hutch_err *err) {
  uint64_t deadline = mono_us() / 1000 + GV_READY_TIMEOUT_MS;
  const char *what = want == HUTCH_MSG_HELLO ? "hello" : "pong";
  for (;;) {
    uint64_t now = mono_us() / 1000;
    if (now >= deadline)
      return hutch_err_sys(err, ETIMEDOUT, "waiting %d s for hutch-init's %s", GV_READY_TIMEOUT_MS / 1000, what);
    struct pollfd p = {.fd = chan, .events = POLLIN};
    int r = poll(&p, 1, (int)(deadline - now));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return hutch_err_sys(err, errno, "poll hutch-init channel");
    if (r == 0) continue;
    struct hutch_frame_hdr h;
    struct hutch_buf b;
    hutch_buf_init(&b);
    hutch_err rerr = HUTCH_ERR_INIT;
    r = hutch_frame_read(chan, &h, &b, &rerr);
    hutch_buf_free(&b);
    if (r < 0 && rerr.errnum != ECONNRESET && rerr.errnum != EPIPE) {
      *err = rerr;
      return hutch_err_wrap(err, "read hutch-init %s", what);
    }
    if (r <= 0) return runsc_failed(runsc, what, err);
    if (h.type == want && (!id || h.id == id)) return 0;
    if (want == HUTCH_MSG_HELLO) return hutch_err_sys(err, EPROTO, "hutch-init sent frame type %u first", h.type);
  }
}

/* ---- start ---------------------------------------------------------------- */

/* The runsc child: joins the cgroup, takes the socket as stdin and stdout,
 * execs runsc.  Errors go to `report` (close-on-exec: EOF means exec'd). */
static __attribute__((noreturn)) void runsc_child(const struct hutch_sandbox_spec *spec, struct runsc_cmd *c,
                                                  int sock, int report) {
  hutch_err err = HUTCH_ERR_INIT;
  /* If the shim dies, runsc goes; hutch-init then sees its channel close
   * and ends the sandbox. */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (hutch_cgroup_attach(spec->instance, spec->id, getpid(), &err) < 0) goto fail;
  sigset_t none;
  sigemptyset(&none);
  for (int sig = 1; sig < 65; sig++) signal(sig, SIG_DFL);
  sigprocmask(SIG_SETMASK, &none, NULL);
  if (dup2(sock, 0) < 0 || dup2(sock, 1) < 0) {
    hutch_err_sys(&err, errno, "dup the channel onto runsc's stdio");
    goto fail;
  }
  execvp(c->argv[0], (char *const *)c->argv);
  hutch_err_sys(&err, errno, "exec `%s`", c->argv[0]);
fail:
  (void)!write(report, err.msg, strlen(err.msg));
  _exit(127);
}

static int gvisor_start(const struct hutch_sandbox_spec *spec, struct hutch_runtime_instance *out, hutch_err *err) {
  int chan[2] = {-1, -1}, rep[2] = {-1, -1};
  pid_t pid = -1;
  bool mounted = false;
  cleanup_free char *root = NULL;

  if (check_paths(spec, err) < 0) return -1;
  if (spec->lower)
    return hutch_err_set(err, 400, "invalid_argument",
                         "the gvisor runtime needs the btrfs storage backend (this sandbox is on overlay)");
  root = xasprintf("%s/rootfs", spec->bundle_dir);
  if (private_mount_ns(err) < 0) return -1;
  if (hutch_cgroup_create(spec->instance, spec->id, &spec->limits, err) < 0) return hutch_err_wrap(err, "cgroup");
  if (hutch_fault("shim.cgroup")) {
    hutch_err_sys(err, EIO, "fault injected at shim.cgroup");
    goto fail;
  }
  /* A state dir left by an earlier run (its processes went with the cgroup)
   * would make runsc refuse the id. */
  if (empty_dir(spec->state_dir, err) < 0 || mkdir_p(spec->state_dir, 0700, err) < 0 ||
      mkdir_p(root, 0755, err) < 0) {
    hutch_err_wrap(err, "runsc directories");
    goto fail;
  }
  if (mount_root(spec, root, err) < 0) goto fail;
  mounted = true;
  {
    cleanup_free char *cfg = oci_config(spec, root);
    cleanup_free char *path = xasprintf("%s/config.json", spec->bundle_dir);
    if (!cfg) {
      hutch_err_sys(err, ENOMEM, "build the OCI config");
      goto fail;
    }
    if (write_file(path, cfg, strlen(cfg), 0600, err) < 0) goto fail;
  }
  struct runsc_cmd c;
  rs_init(&c, spec);
  if (spec->restore_from) {
    rs_add(&c, "restore");
    rs_add(&c, "--image-path");
    rs_add(&c, spec->restore_from);
  } else {
    rs_add(&c, "run");
  }
  rs_add(&c, "--bundle");
  rs_add(&c, spec->bundle_dir);
  rs_add(&c, spec->id);
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, chan) < 0 || pipe2(rep, O_CLOEXEC) < 0) {
    hutch_err_sys(err, errno, "socketpair");
    goto fail;
  }
  if (hutch_fault("shim.spawn")) {
    hutch_err_sys(err, EIO, "fault injected at shim.spawn");
    goto fail;
  }
  pid = fork();
  if (pid < 0) {
    hutch_err_sys(err, errno, "fork runsc");
    goto fail;
  }
  if (pid == 0) runsc_child(spec, &c, chan[1], rep[1]);
  close(chan[1]);
  chan[1] = -1;
  close(rep[1]);
  rep[1] = -1;
  {
    char msg[HUTCH_ERR_MSG_MAX];
    ssize_t r = read_full(rep[0], msg, sizeof msg - 1);
    if (r < 0) {
      hutch_err_sys(err, errno, "read runsc start result");
      goto fail;
    }
    if (r > 0) {
      msg[r] = 0;
      hutch_err_sys(err, 0, "start runsc: %s", msg);
      goto fail;
    }
  }
  if (spec->restore_from) {
    /* A restored hutch-init says no HELLO: it carries on from the image,
     * now on the new socket (runsc restore hands the container the stdio
     * it was given, as run does). */
    hutch_err werr = HUTCH_ERR_INIT;
    int w = hutch_frame_write(chan[0], HUTCH_MSG_PING, GV_PING_ID, NULL, 0, &werr);
    if ((w < 0 && runsc_failed(pid, "pong", err) < 0) ||
        (w == 0 && wait_frame(chan[0], pid, HUTCH_MSG_PONG, GV_PING_ID, err) < 0)) {
      hutch_err_wrap(err, "restore from `%s`", spec->restore_from);
      goto fail;
    }
  } else if (wait_frame(chan[0], pid, HUTCH_MSG_HELLO, 0, err) < 0) {
    goto fail;
  }
  close(rep[0]);
  out->init_pid = pid;
  out->channel_fd = chan[0];
  return 0;

fail:
  for (int i = 0; i < 2; i++) {
    if (chan[i] >= 0) close(chan[i]);
    if (rep[i] >= 0) close(rep[i]);
  }
  if (pid > 0) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
  }
  hutch_err cerr = HUTCH_ERR_INIT;
  hutch_runtime_gvisor.destroy(spec, &cerr);
  if (mounted) umount2(root, MNT_DETACH);
  return -1;
}

/* ---- pause, resume, destroy, checkpoint ----------------------------------- */

static int gvisor_pause(const struct hutch_sandbox_spec *spec, hutch_err *err) {
  if (check_paths(spec, err) < 0) return -1;
  struct runsc_cmd c;
  rs_init(&c, spec);
  rs_add(&c, "pause");
  rs_add(&c, spec->id);
  return runsc_run(&c, "runsc pause", err);
}

static int gvisor_resume(const struct hutch_sandbox_spec *spec, hutch_err *err) {
  if (check_paths(spec, err) < 0) return -1;
  struct runsc_cmd c;
  rs_init(&c, spec);
  rs_add(&c, "resume");
  rs_add(&c, spec->id);
  return runsc_run(&c, "runsc resume", err);
}

static int gvisor_destroy(const struct hutch_sandbox_spec *spec, hutch_err *err) {
  if (check_paths(spec, err) < 0) return -1;
  /* `runsc kill` reaches the sandbox through its control socket, and only
   * while the sandbox's cgroup still holds processes (the state dir may be
   * stale: after a reboot its pids may be anyone's).  It fails when the
   * sandbox is already going (the shim killed `runsc run`): the cgroup kill
   * below ends whatever is left either way.  `runsc delete --force` is not
   * used: it adds ~1.1 s (it waits for the sandbox to stop) and does nothing
   * on the host that the cgroup kill and removing the state dir do not. */
  if (hutch_cgroup_nprocs(spec->instance, spec->id) > 0) {
    struct runsc_cmd c;
    hutch_err e = HUTCH_ERR_INIT;
    rs_init(&c, spec);
    rs_add(&c, "kill");
    rs_add(&c, spec->id);
    rs_add(&c, "KILL");
    if (hutch_run(c.argv, -1, -1, NULL, NULL, &e) < 0)
      hutch_log(HUTCH_LOG_DEBUG, "gvisor.kill_failed", "id", spec->id, "reason", e.msg, NULL);
  }
  if (hutch_cgroup_destroy(spec->instance, spec->id, err) < 0) return hutch_err_wrap(err, "destroy sandbox cgroup");
  if (empty_dir(spec->state_dir, err) < 0) return hutch_err_wrap(err, "remove runsc state");
  return 0;
}

/* fsync every file below the directory `fd` (closed), then the directory. */
static int fsync_tree(int fd, const char *path, int depth, hutch_err *err) {
  DIR *d = fdopendir(fd);
  if (!d) {
    int e = errno;
    close(fd);
    return hutch_err_sys(err, e, "open `%s`", path);
  }
  int rc = 0;
  struct dirent *e;
  while (rc == 0 && (e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
      rc = hutch_err_sys(err, errno, "stat `%s/%s`", path, e->d_name);
      break;
    }
    if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) continue;
    int f = openat(dirfd(d), e->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (f < 0) {
      rc = hutch_err_sys(err, errno, "open `%s/%s`", path, e->d_name);
      break;
    }
    if (S_ISDIR(st.st_mode)) {
      cleanup_free char *sub = xasprintf("%s/%s", path, e->d_name);
      if (depth > 16) {
        close(f);
        rc = hutch_err_sys(err, ELOOP, "`%s`: too deep", sub);
      } else {
        rc = fsync_tree(f, sub, depth + 1, err);
      }
    } else {
      if (fsync(f) < 0) rc = hutch_err_sys(err, errno, "fsync `%s/%s`", path, e->d_name);
      close(f);
    }
  }
  if (rc == 0 && fsync(dirfd(d)) < 0) rc = hutch_err_sys(err, errno, "fsync `%s`", path);
  closedir(d);
  return rc;
}

static void find_paused(void *arg, const char *line) {
  if (strstr(line, "\"status\"") && strstr(line, "\"paused\"")) *(bool *)arg = true;
}

static int gvisor_checkpoint(const struct hutch_sandbox_spec *spec, const char *dir, hutch_err *err) {
  if (check_paths(spec, err) < 0) return -1;
  if (mkdir_p(dir, 0700, err) < 0) return hutch_err_wrap(err, "checkpoint directory");
  struct runsc_cmd c;
  /* A paused sandbox is saved as it is, but only stops once its kernel runs
   * again: resumed after the checkpoint, it exits instead of running on. */
  bool paused = false;
  rs_init(&c, spec);
  rs_add(&c, "state");
  rs_add(&c, spec->id);
  if (hutch_run(c.argv, -1, -1, find_paused, &paused, err) < 0) return hutch_err_wrap(err, "runsc state");
  rs_init(&c, spec);
  rs_add(&c, "checkpoint");
  rs_add(&c, "--image-path");
  rs_add(&c, dir);
  rs_add(&c, spec->id);
  if (runsc_run(&c, "runsc checkpoint", err) < 0) return -1;
  if (paused) {
    hutch_err e = HUTCH_ERR_INIT;
    rs_init(&c, spec);
    rs_add(&c, "resume");
    rs_add(&c, spec->id);
    if (hutch_run(c.argv, -1, -1, NULL, NULL, &e) < 0) /* usually "EOF": the sandbox ended */
      hutch_log(HUTCH_LOG_DEBUG, "gvisor.resume_after_checkpoint", "id", spec->id, "reason", e.msg, NULL);
  }
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return hutch_err_sys(err, errno, "open `%s`", dir);
  if (fsync_tree(fd, dir, 0, err) < 0) return hutch_err_wrap(err, "sync checkpoint");
  /* The new directory's own entry, in its parent. */
  cleanup_free char *parent = xstrdup(dir);
  char *slash = strrchr(parent, '/');
  if (slash) {
    if (slash == parent) slash[1] = 0;
    else *slash = 0;
    cleanup_close int pfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (pfd < 0 || fsync(pfd) < 0) return hutch_err_sys(err, errno, "sync checkpoint: fsync `%s`", parent);
  }
  return 0;
}

/* ---- availability --------------------------------------------------------- */

static bool gvisor_available(char *why, size_t n) {
  static int ok_cached; /* runsc worked once: it stays installed */
  if (__atomic_load_n(&ok_cached, __ATOMIC_ACQUIRE)) return true;
  hutch_err err = HUTCH_ERR_INIT;
  enum hutch_cgroup_version v;
  if (hutch_cgroup_probe(&v, &err) < 0) {
    snprintf(why, n, "%s", err.msg);
    return false;
  }
  const char *argv[] = {"runsc", "--version", NULL};
  if (hutch_run(argv, -1, -1, NULL, NULL, &err) < 0) {
    snprintf(why, n, "runsc (gVisor) does not run: %s", err.msg);
    return false;
  }
  __atomic_store_n(&ok_cached, 1, __ATOMIC_RELEASE);
  return true;
}

const struct hutch_runtime_ops hutch_runtime_gvisor = {
    .name = "gvisor",
    .caps = HUTCH_RT_CAP_PAUSE | HUTCH_RT_CAP_MEMORY_CHECKPOINT | HUTCH_RT_CAP_FORK_MEMORY,
    .available = gvisor_available,
    .start = gvisor_start,
    .pause = gvisor_pause,
    .resume = gvisor_resume,
    .destroy = gvisor_destroy,
    .checkpoint = gvisor_checkpoint,
};
