/* hutch-init: commands.
 *
 * A command is a process spawned on request (SPAWN), in its own session and
 * process group, with either three pipes (stdin only with HUTCH_SPAWN_STDIN,
 * else /dev/null) or a new PTY from the sandbox's own devpts as its
 * controlling terminal and stdin/stdout/stderr (HUTCH_SPAWN_PTY).  init
 * relays its output as STDOUT/STDERR frames, queues its stdin and reports
 * STDIN_WRITTEN whenever the queue has drained into the pipe, kills its
 * process group on timeout or SIGNAL, and reports EXIT once the main
 * process has exited and its output has been drained (rules below).
 *
 * Output without FLOW is read as fast as it comes; the channel's own
 * backpressure (init blocks writing fd 3) bounds memory.  Output of a FLOW
 * command is read only as far as the shim's CREDIT allows, so a slow client
 * stops the command (it blocks on a full pipe) instead of losing output.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "common/util.h"
#include "init.h"

#define READ_CHUNK 65536
#define STDIN_QUEUE_MAX (8u << 20)
/* After a command's main process exits, output still buffered in its pipes
 * is drained; a background descendant that keeps the pipe open does not hold
 * the exit report back longer than this. */
#define DRAIN_GRACE_MS 100
#define PTY_DEFAULT_ROWS 24
#define PTY_DEFAULT_COLS 80

#ifndef TIOCGPTPEER
#define TIOCGPTPEER _IO('T', 0x41)
#endif

/* When is a command's EXIT reported?
 *
 * Always after its main process has exited (SIGCHLD, reaped) and after the
 * output that process wrote: EXIT is the last frame of a command.
 *
 * Without FLOW (today's v1 rule): when both output fds reached EOF, or
 * DRAIN_GRACE_MS after the exit, whichever comes first.  A background
 * grandchild that inherited stdout (`sh -c 'daemon &'`) keeps the pipe open
 * forever; the grace keeps it from holding the exit report back.  At the
 * grace, the bytes the pipe holds at that moment (FIONREAD) are read and
 * sent, then the pipes are closed.
 *
 * With FLOW, init may not read without credit, so "read what is left at the
 * grace" can take arbitrarily long, and nothing may be dropped.  The rule:
 *   - EOF on an output fd ends it as usual.  A pipe whose writers are all
 *     gone and that is empty (POLLHUP without POLLIN) is EOF too, even with
 *     no credit left: no read is needed to know it, so a FLOW command whose
 *     output was fully consumed reports EXIT at once, not when the next
 *     CREDIT arrives.
 *   - DRAIN_GRACE_MS after the exit, init notes how many bytes each
 *     still-open fd holds (FIONREAD): the "owed" bytes.  Everything the main
 *     process wrote is in the pipe by then (a process's pipe writes are
 *     complete when it exits) and at its front (FIFO), so once the owed
 *     bytes have been read (as credit allows, however long that takes) all
 *     of it has been sent.  Then the fds are closed and EXIT is sent; what a
 *     background grandchild writes later is lost, exactly as without FLOW.
 *     The owed count is taken once, so a grandchild writing without end
 *     (`yes &`) cannot keep the command from finishing.
 *   - An empty pipe held open by a grandchild therefore costs the grace and
 *     no more, whether or not there is credit; a pipe with unread bytes and
 *     no credit waits for CREDIT, and the exit report waits with it.
 * For a PTY the POLLHUP shortcut is not used: the slave's last writes may
 * still sit in the tty layer's flip buffer when POLLHUP is seen, and only a
 * read of the master (which flushes it before returning EIO) is sure.  A
 * FLOW PTY command with no credit left is reported at the grace (owed 0).
 */
struct command {
  uint32_t id;
  pid_t pid;
  int out_fd, err_fd; /* read ends; for a PTY out_fd is the master, err_fd -1 */
  int in_fd;          /* stdin write end; for a PTY a dup of the master */
  bool pty, flow;
  uint64_t credit;   /* FLOW: output bytes init may still read */
  bool owed_set;     /* FLOW: owed[] taken at the grace (see above) */
  uint64_t owed[2];  /* [0] out_fd, [1] err_fd */
  struct hutch_buf stdin_q; /* bytes waiting to be written to in_fd */
  size_t stdin_off;
  uint64_t stdin_written;    /* bytes written since the last STDIN_WRITTEN */
  bool stdin_report_pending; /* a STDIN frame was queued since the last report */
  bool stdin_close_pending;
  uint64_t deadline_ms; /* monotonic; 0 = none */
  bool timed_out;
  bool exited;
  int status;
  uint64_t exited_at_ms;
};

static struct command *cmds[MAX_COMMANDS];
/* cmd_poll_fill's order: triple k of the pollfd array belongs to cmds[poll_slot[k]]. */
static int poll_slot[MAX_COMMANDS];
static size_t poll_count;
extern char **environ;

static struct command *find_cmd(uint32_t id) {
  for (int i = 0; i < MAX_COMMANDS; i++)
    if (cmds[i] && cmds[i]->id == id) return cmds[i];
  return NULL;
}

static void close_fd(int *fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

static uint64_t fd_unread(int fd) {
  int n = 0;
  if (fd < 0 || ioctl(fd, FIONREAD, &n) < 0 || n < 0) return 0;
  return (uint64_t)n;
}

static void finish_cmd(int slot) {
  struct command *c = cmds[slot];
  struct hutch_buf b;
  hutch_buf_init(&b);
  struct hutch_exit e = {.timed_out = c->timed_out};
  if (WIFSIGNALED(c->status)) e.signo = WTERMSIG(c->status);
  else e.exit_code = WEXITSTATUS(c->status);
  hutch_exit_encode(&b, &e);
  init_send(HUTCH_MSG_EXIT, c->id, b.data, b.len);
  hutch_buf_free(&b);
  close_fd(&c->out_fd);
  close_fd(&c->err_fd);
  close_fd(&c->in_fd);
  hutch_buf_free(&c->stdin_q);
  free(c);
  cmds[slot] = NULL;
}

/* ---- spawn ------------------------------------------------------------ */

enum { SPAWN_STEP_STDIO = 1, SPAWN_STEP_CREDS, SPAWN_STEP_CWD, SPAWN_STEP_EXEC };

struct child_stdio {
  int out_w, err_w, in_r; /* pipes; in_r -1 = /dev/null */
  int pty_slave;          /* >= 0: a PTY command, the other three unused */
};

static void child_exec(const struct hutch_spawn *sp, const struct child_stdio *io, int errpipe) {
  sigset_t all;
  sigemptyset(&all);
  sigprocmask(SIG_SETMASK, &all, NULL);
  for (int s = 1; s < NSIG; s++) signal(s, SIG_DFL);
  setsid();
  umask(init_cmd_umask);
  /* init runs with oom_score_adj -1000 so the OOM killer spares it; user
   * processes must be killable, so reset it for them. */
  int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (fd >= 0) {
    (void)!write(fd, "0", 1);
    close(fd);
  }
  int step = SPAWN_STEP_STDIO;
  if (io->pty_slave >= 0) {
    /* A new session has no controlling terminal; the slave (opened
     * O_NOCTTY) becomes ours.  fds 0-2 are never the slave (init keeps its
     * own 0-2 open), so dup2 clears close-on-exec on each. */
    if (ioctl(io->pty_slave, TIOCSCTTY, 0) < 0) goto fail;
    if (dup2(io->pty_slave, 0) < 0 || dup2(io->pty_slave, 1) < 0 || dup2(io->pty_slave, 2) < 0) goto fail;
  } else {
    int in_r = io->in_r;
    if (in_r < 0) in_r = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (in_r < 0 || dup2(in_r, 0) < 0 || dup2(io->out_w, 1) < 0 || dup2(io->err_w, 2) < 0) goto fail;
  }
  /* Whatever init inherited without close-on-exec (from a runtime or a
   * debugging parent) is not the command's business.  CLOEXEC, not close:
   * errpipe must survive until exec.  Kernels before 5.11 lack the flag;
   * then init's own fds are close-on-exec anyway. */
  (void)close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
  step = SPAWN_STEP_CREDS;
  if (sp->gid && (setgroups(0, NULL) < 0 || setresgid(sp->gid, sp->gid, sp->gid) < 0)) goto fail;
  if (sp->uid && setresuid(sp->uid, sp->uid, sp->uid) < 0) goto fail;
  step = SPAWN_STEP_CWD;
  if (sp->cwd && chdir(sp->cwd) < 0) goto fail;
  step = SPAWN_STEP_EXEC;
  environ = (char **)sp->envp;
  execvp(sp->argv[0], (char *const *)sp->argv);
fail:;
  int report[2] = {step, errno};
  (void)!write(errpipe, report, sizeof report);
  _exit(127);
}

/* A new PTY of rows x cols: the master (O_NONBLOCK) in *master, the slave
 * (O_NOCTTY, close-on-exec) in *slave.  Returns 0, or -1 with errno and the
 * failing step in *what. */
static int open_pty(unsigned rows, unsigned cols, uid_t uid, int *master, int *slave, const char **what) {
  *master = *slave = -1;
  /* /dev/ptmx is the sandbox's own (pts/ptmx of a devpts newinstance). */
  *what = "open /dev/ptmx";
  int m = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (m < 0) return -1;
  *what = "unlock pty";
  if (grantpt(m) < 0 || unlockpt(m) < 0) goto fail;
  /* TIOCGPTPEER opens the slave through the master, without a path lookup
   * in /dev/pts that a process in the sandbox could race; older kernels
   * (and some runtimes) lack it, then the slave is opened by name. */
  int s = ioctl(m, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (s < 0) {
    char name[128];
    *what = "pty name";
    if (ptsname_r(m, name, sizeof name) != 0) goto fail;
    *what = "open pty slave";
    s = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (s < 0) goto fail;
  }
  /* Like login(1): the terminal belongs to the user running on it. */
  if (uid) (void)!fchown(s, uid, (gid_t)-1);
  struct winsize ws = {.ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols};
  *what = "set the pty size";
  if (ioctl(m, TIOCSWINSZ, &ws) < 0 || set_nonblock(m, true) < 0) {
    int e = errno;
    close(s);
    errno = e;
    goto fail;
  }
  *master = m;
  *slave = s;
  return 0;
fail:;
  int e = errno;
  close(m);
  errno = e;
  return -1;
}

/* ROWS/COLS of a SPAWN or RESIZE payload: 1 found (1-65535), 0 absent (or
 * 0, which SPAWN takes as "the default"), -1 malformed or too big. */
static int parse_size(const unsigned char *p, size_t len, uint8_t tag, unsigned *out) {
  uint32_t v;
  int r = hutch_tlv_find_u32(p, len, tag, &v);
  if (r != 1) return r;
  if (v == 0) return 0;
  if (v > 0xffff) return -1;
  *out = v;
  return 1;
}

static void close_pair(int p[2]) {
  close_fd(&p[0]);
  close_fd(&p[1]);
}

void cmd_spawn(uint32_t id, const unsigned char *payload, size_t len) {
  hutch_err err = HUTCH_ERR_INIT;
  struct hutch_spawn sp;
  if (find_cmd(id)) {
    init_send_error(id, EEXIST, "command id already in use");
    return;
  }
  int slot = -1;
  for (int i = 0; i < MAX_COMMANDS; i++)
    if (!cmds[i]) {
      slot = i;
      break;
    }
  if (slot < 0) {
    init_send_error(id, EAGAIN, "too many concurrent commands");
    return;
  }
  if (hutch_spawn_decode(payload, len, &sp, &err) < 0) {
    init_send_error(id, EINVAL, err.msg);
    return;
  }
  bool pty = sp.flags & HUTCH_SPAWN_PTY;
  unsigned rows = PTY_DEFAULT_ROWS, cols = PTY_DEFAULT_COLS;
  if (pty &&
      (parse_size(payload, len, HUTCH_TAG_ROWS, &rows) < 0 || parse_size(payload, len, HUTCH_TAG_COLS, &cols) < 0)) {
    hutch_spawn_free(&sp);
    init_send_error(id, EINVAL, "SPAWN: ROWS and COLS must be at most 65535");
    return;
  }

  int out[2] = {-1, -1}, errp[2] = {-1, -1}, in[2] = {-1, -1}, ep[2] = {-1, -1};
  int master = -1, slave = -1;
  char msg[512];
  if (pty) {
    const char *what;
    if (open_pty(rows, cols, sp.uid, &master, &slave, &what) < 0) {
      snprintf(msg, sizeof msg, "%s: %s", what, strerror(errno));
      hutch_spawn_free(&sp);
      init_send_error(id, errno, msg);
      return;
    }
  }
  if ((!pty && (pipe2(out, O_CLOEXEC) < 0 || pipe2(errp, O_CLOEXEC) < 0 ||
                ((sp.flags & HUTCH_SPAWN_STDIN) && pipe2(in, O_CLOEXEC) < 0))) ||
      pipe2(ep, O_CLOEXEC) < 0 || (pty && (in[1] = fcntl(master, F_DUPFD_CLOEXEC, 0)) < 0)) {
    int e = errno;
    close_pair(out);
    close_pair(errp);
    close_pair(in);
    close_pair(ep);
    close_fd(&master);
    close_fd(&slave);
    hutch_spawn_free(&sp);
    snprintf(msg, sizeof msg, "pipe: %s", strerror(e));
    init_send_error(id, e, msg);
    return;
  }
  struct child_stdio io = {.out_w = out[1], .err_w = errp[1], .in_r = in[0], .pty_slave = slave};
  pid_t pid = fork();
  if (pid == 0) child_exec(&sp, &io, ep[1]);
  int fork_errno = errno;
  close_fd(&out[1]);
  close_fd(&errp[1]);
  close_fd(&ep[1]);
  close_fd(&in[0]);
  close_fd(&slave);
  int report[2] = {0, 0};
  if (pid > 0 && read_full(ep[0], report, sizeof report) != (ssize_t)sizeof report) report[1] = 0;
  close_fd(&ep[0]);
  if (pid < 0 || report[1]) {
    int e = pid < 0 ? fork_errno : report[1];
    if (pid < 0) snprintf(msg, sizeof msg, "fork: %s", strerror(e));
    else if (report[0] == SPAWN_STEP_CWD) snprintf(msg, sizeof msg, "chdir `%s`: %s", sp.cwd, strerror(e));
    else if (report[0] == SPAWN_STEP_CREDS)
      snprintf(msg, sizeof msg, "set uid/gid %u/%u: %s", sp.uid, sp.gid, strerror(e));
    else if (report[0] == SPAWN_STEP_STDIO)
      snprintf(msg, sizeof msg, "set up %s: %s", pty ? "the terminal" : "stdio", strerror(e));
    else snprintf(msg, sizeof msg, "exec `%s`: %s", sp.argv[0], strerror(e));
    if (pid > 0) waitpid(pid, NULL, 0);
    close_fd(&out[0]);
    close_fd(&errp[0]);
    close_fd(&in[1]);
    close_fd(&master);
    hutch_spawn_free(&sp);
    init_send_error(id, e, msg);
    return;
  }
  struct command *c = xcalloc(1, sizeof *c);
  c->id = id;
  c->pid = pid;
  c->pty = pty;
  c->flow = sp.flags & HUTCH_SPAWN_FLOW;
  c->out_fd = pty ? master : out[0];
  c->err_fd = errp[0];
  c->in_fd = in[1];
  /* Reads never block: a FLOW read or a drain at the grace reads without
   * poll having said so.  (For a PTY the flag is shared with in_fd.) */
  set_nonblock(c->out_fd, true);
  if (c->err_fd >= 0) set_nonblock(c->err_fd, true);
  if (c->in_fd >= 0) set_nonblock(c->in_fd, true);
  hutch_buf_init(&c->stdin_q);
  c->deadline_ms = sp.timeout_ms ? init_mono_ms() + sp.timeout_ms : 0;
  cmds[slot] = c;
  hutch_spawn_free(&sp);
  struct hutch_buf b;
  hutch_buf_init(&b);
  hutch_tlv_put_u32(&b, HUTCH_TAG_PID, (uint32_t)pid);
  init_send(HUTCH_MSG_STARTED, id, b.data, b.len);
  hutch_buf_free(&b);
}

/* ---- stdin ------------------------------------------------------------ */

/* The pipe broke (EPIPE, or EIO from a PTY master nobody holds the slave of)
 * or the process exited: drop the queue and close.  If anything queued had
 * not been reported written, the shim is waiting for STDIN_WRITTEN: answer
 * ERROR EPIPE instead. */
static void stdin_broken(struct command *c, int errnum) {
  bool owed = c->stdin_report_pending;
  hutch_buf_reset(&c->stdin_q);
  c->stdin_off = 0;
  c->stdin_written = 0;
  c->stdin_report_pending = false;
  close_fd(&c->in_fd);
  if (owed) {
    char msg[128];
    snprintf(msg, sizeof msg, "write stdin: %s", strerror(errnum));
    init_send_error(c->id, EPIPE, msg);
  }
}

static void flush_stdin(struct command *c) {
  while (c->in_fd >= 0 && c->stdin_off < c->stdin_q.len) {
    ssize_t w = write(c->in_fd, c->stdin_q.data + c->stdin_off, c->stdin_q.len - c->stdin_off);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) return;
      stdin_broken(c, errno);
      return;
    }
    c->stdin_off += (size_t)w;
    c->stdin_written += (uint64_t)w;
  }
  if (c->in_fd < 0) return;
  /* Drained: give a big queue's memory back rather than keep it for the
   * command's lifetime. */
  if (c->stdin_q.cap > READ_CHUNK) hutch_buf_free(&c->stdin_q);
  hutch_buf_reset(&c->stdin_q);
  c->stdin_off = 0;
  if (c->stdin_report_pending) {
    /* The queue is bounded by STDIN_QUEUE_MAX, so the count fits a u32. */
    struct hutch_buf b;
    hutch_buf_init(&b);
    hutch_tlv_put_u32(&b, HUTCH_TAG_BYTES, (uint32_t)c->stdin_written);
    init_send(HUTCH_MSG_STDIN_WRITTEN, c->id, b.data, b.len);
    hutch_buf_free(&b);
    c->stdin_written = 0;
    c->stdin_report_pending = false;
  }
  if (c->stdin_close_pending) close_fd(&c->in_fd);
}

void cmd_stdin(uint32_t id, const unsigned char *p, size_t len) {
  struct command *c = find_cmd(id);
  if (!c || c->in_fd < 0 || c->stdin_close_pending) {
    init_send_error(id, EPIPE, "stdin of this command is closed");
    return;
  }
  if (c->stdin_q.len + len > STDIN_QUEUE_MAX) {
    init_send_error(id, ENOBUFS, "stdin queue full");
    return;
  }
  hutch_buf_append(&c->stdin_q, p, len);
  c->stdin_report_pending = true;
  flush_stdin(c);
}

/* For a PTY this stops init's writing to the terminal (later STDIN is
 * ERROR EPIPE); the terminal itself stays open, as a terminal has no end of
 * input: a client that wants one sends the EOF character (^D). */
void cmd_stdin_close(uint32_t id) {
  struct command *c = find_cmd(id);
  if (!c) return;
  c->stdin_close_pending = true;
  flush_stdin(c);
}

/* ---- signals, credit, resize ------------------------------------------ */

void cmd_signal(uint32_t id, const unsigned char *p, size_t len) {
  uint32_t sig = 0;
  struct command *c = find_cmd(id);
  if (hutch_tlv_find_u32(p, len, HUTCH_TAG_SIGNO, &sig) == 1 && c && !c->exited && sig > 0 && sig < NSIG)
    kill(-c->pid, (int)sig);
}

void cmd_credit(uint32_t id, const unsigned char *p, size_t len) {
  uint32_t bytes;
  if (hutch_tlv_find_u32(p, len, HUTCH_TAG_BYTES, &bytes) != 1) {
    init_send_error(id, EINVAL, "CREDIT without a valid BYTES field");
    return;
  }
  /* An unknown command has just finished (credit crosses EXIT on the wire);
   * a non-FLOW command reads without credit. */
  struct command *c = find_cmd(id);
  if (!c || !c->flow) return;
  c->credit = c->credit > UINT64_MAX - bytes ? UINT64_MAX : c->credit + bytes;
}

/* No answer on success: the shim knows which commands have a PTY and
 * acknowledges its client itself; these errors only come from races. */
void cmd_resize(uint32_t id, const unsigned char *p, size_t len) {
  struct command *c = find_cmd(id);
  unsigned rows, cols;
  if (!c) {
    init_send_error(id, ESRCH, "resize: no such command");
    return;
  }
  if (!c->pty) {
    init_send_error(id, EINVAL, "resize: the command has no terminal");
    return;
  }
  if (parse_size(p, len, HUTCH_TAG_ROWS, &rows) != 1 || parse_size(p, len, HUTCH_TAG_COLS, &cols) != 1) {
    init_send_error(id, EINVAL, "resize: ROWS and COLS must be 1-65535");
    return;
  }
  int fd = c->out_fd >= 0 ? c->out_fd : c->in_fd;
  struct winsize ws = {.ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols};
  if (fd < 0) {
    init_send_error(id, EIO, "resize: the terminal is closed");
    return;
  }
  if (ioctl(fd, TIOCSWINSZ, &ws) < 0) {
    char msg[128];
    int e = errno;
    snprintf(msg, sizeof msg, "resize: %s", strerror(e));
    init_send_error(id, e, msg);
  }
}

/* ---- output, exit ----------------------------------------------------- */

void cmd_reap(void) {
  int status;
  pid_t pid;
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
    for (int i = 0; i < MAX_COMMANDS; i++) {
      struct command *c = cmds[i];
      if (c && c->pid == pid && !c->exited) {
        c->exited = true;
        c->status = status;
        c->exited_at_ms = init_mono_ms();
        if (c->in_fd >= 0) stdin_broken(c, EPIPE);
      }
    }
  }
}

/* Read one chunk (at most the credit, for FLOW) from out_fd (which 0) or
 * err_fd (1) and send it.  Returns false once the fd is closed: EOF, or EIO
 * from a PTY master whose slave nobody holds any more. */
static bool pump(struct command *c, int which) {
  static unsigned char buf[READ_CHUNK];
  int *fd = which ? &c->err_fd : &c->out_fd;
  if (*fd < 0) return false;
  size_t want = sizeof buf;
  if (c->flow) {
    if (c->credit == 0) return true;
    if (c->credit < want) want = (size_t)c->credit;
  }
  ssize_t r = read(*fd, buf, want);
  if (r < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (r <= 0) {
    close_fd(fd);
    return false;
  }
  if (c->flow) c->credit -= (uint64_t)r;
  if (c->owed_set) c->owed[which] -= c->owed[which] < (uint64_t)r ? c->owed[which] : (uint64_t)r;
  init_send(which ? HUTCH_MSG_STDERR : HUTCH_MSG_STDOUT, c->id, buf, (size_t)r);
  return true;
}

/* Non-FLOW: EOF on both, or the grace is over and what the pipes held then
 * has been sent. */
static bool exit_ready_plain(struct command *c, uint64_t now) {
  if (c->out_fd < 0 && c->err_fd < 0) return true;
  if (now < c->exited_at_ms + DRAIN_GRACE_MS) return false;
  for (int which = 0; which < 2; which++) {
    int *fd = which ? &c->err_fd : &c->out_fd;
    uint64_t left = fd_unread(*fd);
    c->owed_set = true;
    c->owed[which] = left;
    while (*fd >= 0 && c->owed[which] > 0) {
      uint64_t before = c->owed[which];
      if (!pump(c, which) || c->owed[which] == before) break;
    }
  }
  return true;
}

/* FLOW: see the comment at the top. */
static bool exit_ready_flow(struct command *c, uint64_t now) {
  if (!c->pty && c->credit == 0) {
    for (int which = 0; which < 2; which++) {
      int *fd = which ? &c->err_fd : &c->out_fd;
      if (*fd < 0) continue;
      struct pollfd q = {.fd = *fd, .events = POLLIN};
      if (poll(&q, 1, 0) == 1 && (q.revents & POLLHUP) && !(q.revents & POLLIN)) close_fd(fd);
    }
  }
  if (!c->owed_set && now >= c->exited_at_ms + DRAIN_GRACE_MS) {
    c->owed[0] = fd_unread(c->out_fd);
    c->owed[1] = fd_unread(c->err_fd);
    c->owed_set = true;
  }
  for (int which = 0; which < 2; which++) {
    int fd = which ? c->err_fd : c->out_fd;
    if (fd >= 0 && !(c->owed_set && c->owed[which] == 0)) return false;
  }
  return true;
}

size_t cmd_poll_fill(struct pollfd *pfd, int *timeout_ms) {
  uint64_t now = init_mono_ms();
  size_t n = 0;
  poll_count = 0;
  for (int i = 0; i < MAX_COMMANDS; i++) {
    struct command *c = cmds[i];
    if (!c) continue;
    bool can_read = !c->flow || c->credit > 0;
    pfd[n++] = (struct pollfd){.fd = can_read ? c->out_fd : -1, .events = POLLIN};
    pfd[n++] = (struct pollfd){.fd = can_read ? c->err_fd : -1, .events = POLLIN};
    pfd[n++] = (struct pollfd){.fd = c->stdin_off < c->stdin_q.len ? c->in_fd : -1, .events = POLLOUT};
    poll_slot[poll_count++] = i;
    uint64_t wake = 0;
    if (c->exited && !c->owed_set) wake = c->exited_at_ms + DRAIN_GRACE_MS;
    else if (!c->exited && c->deadline_ms && !c->timed_out) wake = c->deadline_ms;
    if (wake) {
      int t = wake > now ? (int)(wake - now) : 0;
      if (*timeout_ms < 0 || t < *timeout_ms) *timeout_ms = t;
    }
  }
  return n;
}

void cmd_poll_handle(const struct pollfd *pfd, size_t n) {
  for (size_t k = 0; k < poll_count && CMD_POLLFDS * k < n; k++) {
    struct command *c = cmds[poll_slot[k]];
    const struct pollfd *p = pfd + CMD_POLLFDS * k;
    if (!c) continue;
    if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) pump(c, 0);
    if (p[1].revents & (POLLIN | POLLHUP | POLLERR)) pump(c, 1);
    if (p[2].revents & (POLLOUT | POLLERR | POLLHUP)) flush_stdin(c);
  }
  uint64_t now = init_mono_ms();
  for (int i = 0; i < MAX_COMMANDS; i++) {
    struct command *c = cmds[i];
    if (!c) continue;
    if (!c->exited && c->deadline_ms && now >= c->deadline_ms && !c->timed_out) {
      c->timed_out = true;
      kill(-c->pid, SIGKILL);
    }
    if (c->exited && (c->flow ? exit_ready_flow(c, now) : exit_ready_plain(c, now))) finish_cmd(i);
  }
}

void cmd_kill_all(void) {
  /* As PID 1 of the sandbox's pid namespace, -1 is everything in it.  Run
   * anywhere else (by hand, or by a test), -1 would be every process the
   * caller may signal on the machine: then only the commands' groups. */
  if (getpid() == 1) {
    kill(-1, SIGKILL);
    return;
  }
  for (int i = 0; i < MAX_COMMANDS; i++)
    if (cmds[i]) kill(-cmds[i]->pid, SIGKILL);
}
