/* hutch-init: PID 1 inside a sandbox, the guest agent.
 *
 * It owns fd 3, a byte stream to hutch-shim carrying the framed protocol of
 * docs/protocol.md.  It spawns commands on request (each in its own session
 * and process group), relays their stdout/stderr, feeds their stdin, enforces
 * their timeouts by killing the whole process group, reaps every orphan in
 * the sandbox and reports each command's exit status or signal.
 *
 * Single-threaded poll loop; statically linked so it runs in any rootfs.
 * When the channel closes (the shim is gone) init exits, and the kernel
 * kills everything else in the sandbox's pid namespace.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent/proto.h"
#include "common/util.h"

#define CHANNEL_FD 3
#define MAX_COMMANDS 1024
#define READ_CHUNK 65536
#define STDIN_QUEUE_MAX (8u << 20)
/* After a command's main process exits, output still buffered in its pipes
 * is drained; a background descendant that keeps the pipe open does not hold
 * the exit report back longer than this. */
#define DRAIN_GRACE_MS 100

struct command {
  uint32_t id;
  pid_t pid;
  int out_fd, err_fd, in_fd;
  struct hutch_buf stdin_q; /* bytes waiting to be written to in_fd */
  size_t stdin_off;
  bool stdin_close_pending;
  uint64_t deadline_ms; /* monotonic; 0 = none */
  bool timed_out;
  bool exited;
  int status;
  uint64_t exited_at_ms;
};

static struct command *cmds[MAX_COMMANDS];
static int sigfd = -1;
extern char **environ;

static uint64_t mono_ms(void) { return mono_us() / 1000; }

static void send_frame(uint16_t type, uint32_t id, const void *p, size_t n) {
  hutch_err err = HUTCH_ERR_INIT;
  if (hutch_frame_write(CHANNEL_FD, type, id, p, n, &err) < 0) {
    /* The shim is gone: nothing in this sandbox has anyone to report to. */
    _exit(1);
  }
}

static void send_error(uint32_t id, int errnum, const char *msg) {
  struct hutch_buf b;
  hutch_buf_init(&b);
  hutch_tlv_put_u32(&b, HUTCH_TAG_ERRNO, (uint32_t)errnum);
  hutch_tlv_put_str(&b, HUTCH_TAG_MESSAGE, msg);
  send_frame(HUTCH_MSG_ERROR, id, b.data, b.len);
  hutch_buf_free(&b);
}

static struct command *find_cmd(uint32_t id) {
  for (int i = 0; i < MAX_COMMANDS; i++)
    if (cmds[i] && cmds[i]->id == id) return cmds[i];
  return NULL;
}

static void close_fd(int *fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

static void finish_cmd(int slot) {
  struct command *c = cmds[slot];
  struct hutch_buf b;
  hutch_buf_init(&b);
  if (WIFSIGNALED(c->status)) hutch_tlv_put_i32(&b, HUTCH_TAG_SIGNO, WTERMSIG(c->status));
  else hutch_tlv_put_i32(&b, HUTCH_TAG_EXIT_CODE, WEXITSTATUS(c->status));
  hutch_tlv_put_u32(&b, HUTCH_TAG_TIMED_OUT, c->timed_out ? 1 : 0);
  send_frame(HUTCH_MSG_EXIT, c->id, b.data, b.len);
  hutch_buf_free(&b);
  close_fd(&c->out_fd);
  close_fd(&c->err_fd);
  close_fd(&c->in_fd);
  hutch_buf_free(&c->stdin_q);
  free(c);
  cmds[slot] = NULL;
}

enum { SPAWN_STEP_STDIO = 1, SPAWN_STEP_CREDS, SPAWN_STEP_CWD, SPAWN_STEP_EXEC };

static void child_exec(const struct hutch_spawn *sp, int out_w, int err_w, int in_r, int errpipe) {
  sigset_t all;
  sigemptyset(&all);
  sigprocmask(SIG_SETMASK, &all, NULL);
  for (int s = 1; s < NSIG; s++) signal(s, SIG_DFL);
  setsid();
  /* init runs with oom_score_adj -1000 so the OOM killer spares it; user
   * processes must be killable, so reset it for them. */
  int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (fd >= 0) {
    (void)!write(fd, "0", 1);
    close(fd);
  }
  int step = SPAWN_STEP_STDIO;
  if (in_r < 0) in_r = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (in_r < 0 || dup2(in_r, 0) < 0 || dup2(out_w, 1) < 0 || dup2(err_w, 2) < 0) goto fail;
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

static void do_spawn(uint32_t id, const unsigned char *payload, size_t len) {
  hutch_err err = HUTCH_ERR_INIT;
  struct hutch_spawn sp;
  if (find_cmd(id)) {
    send_error(id, EEXIST, "command id already in use");
    return;
  }
  int slot = -1;
  for (int i = 0; i < MAX_COMMANDS; i++)
    if (!cmds[i]) {
      slot = i;
      break;
    }
  if (slot < 0) {
    send_error(id, EAGAIN, "too many concurrent commands");
    return;
  }
  if (hutch_spawn_decode(payload, len, &sp, &err) < 0) {
    send_error(id, EINVAL, err.msg);
    return;
  }
  int out[2] = {-1, -1}, errp[2] = {-1, -1}, in[2] = {-1, -1}, ep[2] = {-1, -1};
  if (pipe2(out, O_CLOEXEC) < 0 || pipe2(errp, O_CLOEXEC) < 0 || pipe2(ep, O_CLOEXEC) < 0 ||
      ((sp.flags & HUTCH_SPAWN_STDIN) && pipe2(in, O_CLOEXEC) < 0)) {
    int e = errno;
    for (int i = 0; i < 2; i++) {
      if (out[i] >= 0) close(out[i]);
      if (errp[i] >= 0) close(errp[i]);
      if (in[i] >= 0) close(in[i]);
      if (ep[i] >= 0) close(ep[i]);
    }
    hutch_spawn_free(&sp);
    send_error(id, e, "pipe");
    return;
  }
  pid_t pid = fork();
  if (pid == 0) child_exec(&sp, out[1], errp[1], in[0], ep[1]);
  int fork_errno = errno;
  close(out[1]);
  close(errp[1]);
  close(ep[1]);
  if (in[0] >= 0) close(in[0]);
  int report[2] = {0, 0};
  if (pid > 0 && read_full(ep[0], report, sizeof report) != (ssize_t)sizeof report) report[1] = 0;
  close(ep[0]);
  if (pid < 0 || report[1]) {
    int e = pid < 0 ? fork_errno : report[1];
    char msg[512];
    if (pid < 0) snprintf(msg, sizeof msg, "fork: %s", strerror(e));
    else if (report[0] == SPAWN_STEP_CWD) snprintf(msg, sizeof msg, "chdir `%s`: %s", sp.cwd, strerror(e));
    else if (report[0] == SPAWN_STEP_CREDS) snprintf(msg, sizeof msg, "set uid/gid %u/%u: %s", sp.uid, sp.gid, strerror(e));
    else if (report[0] == SPAWN_STEP_STDIO) snprintf(msg, sizeof msg, "set up stdio: %s", strerror(e));
    else snprintf(msg, sizeof msg, "exec `%s`: %s", sp.argv[0], strerror(e));
    if (pid > 0) waitpid(pid, NULL, 0);
    close(out[0]);
    close(errp[0]);
    if (in[1] >= 0) close(in[1]);
    hutch_spawn_free(&sp);
    send_error(id, e, msg);
    return;
  }
  struct command *c = xcalloc(1, sizeof *c);
  c->id = id;
  c->pid = pid;
  c->out_fd = out[0];
  c->err_fd = errp[0];
  c->in_fd = in[1];
  if (c->in_fd >= 0) set_nonblock(c->in_fd, true);
  hutch_buf_init(&c->stdin_q);
  c->deadline_ms = sp.timeout_ms ? mono_ms() + sp.timeout_ms : 0;
  cmds[slot] = c;
  hutch_spawn_free(&sp);
  struct hutch_buf b;
  hutch_buf_init(&b);
  hutch_tlv_put_u32(&b, HUTCH_TAG_PID, (uint32_t)pid);
  send_frame(HUTCH_MSG_STARTED, id, b.data, b.len);
  hutch_buf_free(&b);
}

static void flush_stdin(struct command *c) {
  while (c->in_fd >= 0 && c->stdin_off < c->stdin_q.len) {
    ssize_t w = write(c->in_fd, c->stdin_q.data + c->stdin_off, c->stdin_q.len - c->stdin_off);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) return;
      /* EPIPE: the reader is gone; drop what is queued. */
      hutch_buf_reset(&c->stdin_q);
      c->stdin_off = 0;
      close_fd(&c->in_fd);
      return;
    }
    c->stdin_off += (size_t)w;
  }
  if (c->stdin_off == c->stdin_q.len) {
    hutch_buf_reset(&c->stdin_q);
    c->stdin_off = 0;
    if (c->stdin_close_pending) close_fd(&c->in_fd);
  }
}

static void handle_frame(const struct hutch_frame_hdr *h, const unsigned char *p) {
  struct command *c;
  switch (h->type) {
    case HUTCH_MSG_SPAWN: do_spawn(h->id, p, h->len); break;
    case HUTCH_MSG_STDIN:
      if (!(c = find_cmd(h->id)) || c->in_fd < 0) {
        send_error(h->id, EPIPE, "stdin of this command is closed");
        break;
      }
      if (c->stdin_q.len + h->len > STDIN_QUEUE_MAX) {
        send_error(h->id, ENOBUFS, "stdin queue full");
        break;
      }
      hutch_buf_append(&c->stdin_q, p, h->len);
      flush_stdin(c);
      break;
    case HUTCH_MSG_STDIN_CLOSE:
      if ((c = find_cmd(h->id))) {
        c->stdin_close_pending = true;
        flush_stdin(c);
      }
      break;
    case HUTCH_MSG_SIGNAL: {
      struct hutch_tlv_iter it;
      uint8_t tag;
      const unsigned char *v;
      uint32_t vl, sig = 0;
      hutch_tlv_iter_init(&it, p, h->len);
      while (hutch_tlv_next(&it, &tag, &v, &vl) == 1)
        if (tag == HUTCH_TAG_SIGNO) hutch_tlv_u32(v, vl, &sig);
      if ((c = find_cmd(h->id)) && !c->exited && sig > 0 && sig < NSIG) kill(-c->pid, (int)sig);
      break;
    }
    case HUTCH_MSG_PING: send_frame(HUTCH_MSG_PONG, h->id, NULL, 0); break;
    default: break;
  }
}

static void reap(void) {
  int status;
  pid_t pid;
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
    for (int i = 0; i < MAX_COMMANDS; i++) {
      struct command *c = cmds[i];
      if (c && c->pid == pid) {
        c->exited = true;
        c->status = status;
        c->exited_at_ms = mono_ms();
        close_fd(&c->in_fd);
      }
    }
  }
}

/* Returns false at EOF or error. */
static bool pump(struct command *c, int *fd, uint16_t type) {
  static unsigned char buf[READ_CHUNK];
  ssize_t r = read(*fd, buf, sizeof buf);
  if (r < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (r <= 0) {
    close_fd(fd);
    return false;
  }
  send_frame(type, c->id, buf, (size_t)r);
  return true;
}

int main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGHUP);
  sigaddset(&mask, SIGPIPE);
  sigprocmask(SIG_BLOCK, &mask, NULL);
  sigfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sigfd < 0) return 1;
  if (set_cloexec(CHANNEL_FD) < 0) return 1;

  struct hutch_buf hello;
  hutch_buf_init(&hello);
  hutch_tlv_put_u32(&hello, HUTCH_TAG_VERSION, HUTCH_PROTO_VERSION);
  hutch_tlv_put_u32(&hello, HUTCH_TAG_PID, (uint32_t)getpid());
  send_frame(HUTCH_MSG_HELLO, 0, hello.data, hello.len);
  hutch_buf_free(&hello);

  struct hutch_frame_decoder dec;
  hutch_decoder_init(&dec);
  set_nonblock(CHANNEL_FD, false);

  struct pollfd pfd[2 + 3 * MAX_COMMANDS];
  static unsigned char rbuf[READ_CHUNK];
  for (;;) {
    size_t n = 0;
    pfd[n++] = (struct pollfd){.fd = CHANNEL_FD, .events = POLLIN};
    pfd[n++] = (struct pollfd){.fd = sigfd, .events = POLLIN};
    uint64_t now = mono_ms();
    int timeout = -1;
    for (int i = 0; i < MAX_COMMANDS; i++) {
      struct command *c = cmds[i];
      if (!c) continue;
      pfd[n++] = (struct pollfd){.fd = c->out_fd, .events = POLLIN};
      pfd[n++] = (struct pollfd){.fd = c->err_fd, .events = POLLIN};
      pfd[n++] = (struct pollfd){.fd = c->stdin_q.len ? c->in_fd : -1, .events = POLLOUT};
      uint64_t wake = 0;
      if (c->exited) wake = c->exited_at_ms + DRAIN_GRACE_MS;
      else if (c->deadline_ms) wake = c->deadline_ms;
      if (wake) {
        int t = wake > now ? (int)(wake - now) : 0;
        if (timeout < 0 || t < timeout) timeout = t;
      }
    }
    int pr = poll(pfd, n, timeout);
    if (pr < 0 && errno != EINTR) return 1;

    if (pfd[1].revents & POLLIN) {
      struct signalfd_siginfo si;
      while (read(sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
        /* SIGTERM etc. to PID 1 from inside are ignored by design; the shim
         * stops the sandbox with SIGKILL from outside. */
      }
      reap();
    }
    size_t k = 2;
    for (int i = 0; i < MAX_COMMANDS; i++) {
      struct command *c = cmds[i];
      if (!c) continue;
      if (pfd[k].revents & (POLLIN | POLLHUP | POLLERR)) pump(c, &c->out_fd, HUTCH_MSG_STDOUT);
      if (pfd[k + 1].revents & (POLLIN | POLLHUP | POLLERR)) pump(c, &c->err_fd, HUTCH_MSG_STDERR);
      if (pfd[k + 2].revents & (POLLOUT | POLLERR | POLLHUP)) flush_stdin(c);
      k += 3;
    }
    now = mono_ms();
    for (int i = 0; i < MAX_COMMANDS; i++) {
      struct command *c = cmds[i];
      if (!c) continue;
      if (!c->exited && c->deadline_ms && now >= c->deadline_ms && !c->timed_out) {
        c->timed_out = true;
        kill(-c->pid, SIGKILL);
      }
      if (c->exited && ((c->out_fd < 0 && c->err_fd < 0) || now >= c->exited_at_ms + DRAIN_GRACE_MS)) {
        /* Read what is already in the pipes before reporting the exit. */
        set_nonblock(c->out_fd, true);
        set_nonblock(c->err_fd, true);
        while (c->out_fd >= 0 && pump(c, &c->out_fd, HUTCH_MSG_STDOUT) && now < c->exited_at_ms + DRAIN_GRACE_MS) {
          struct pollfd q = {.fd = c->out_fd, .events = POLLIN};
          if (poll(&q, 1, 0) <= 0) break;
        }
        while (c->err_fd >= 0 && pump(c, &c->err_fd, HUTCH_MSG_STDERR) && now < c->exited_at_ms + DRAIN_GRACE_MS) {
          struct pollfd q = {.fd = c->err_fd, .events = POLLIN};
          if (poll(&q, 1, 0) <= 0) break;
        }
        finish_cmd(i);
      }
    }

    if (pfd[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t r = read(CHANNEL_FD, rbuf, sizeof rbuf);
      if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) {
        /* The shim is gone; end the sandbox. */
        kill(-1, SIGKILL);
        return 0;
      }
      if (r > 0) {
        hutch_decoder_feed(&dec, rbuf, (size_t)r);
        struct hutch_frame_hdr h;
        const unsigned char *payload;
        hutch_err err = HUTCH_ERR_INIT;
        int pr2;
        while ((pr2 = hutch_decoder_pop(&dec, &h, &payload, &err)) == 1) {
          handle_frame(&h, payload);
          hutch_decoder_consume(&dec, &h);
        }
        if (pr2 < 0) {
          send_error(0, EPROTO, err.msg);
          kill(-1, SIGKILL);
          return 1;
        }
      }
    }
  }
}
