/* hutch-init (src/init/) driven over its channel, without hutchd or a shim.
 *
 * The driver starts build/hutch-init (or $HUTCH_INIT) with one end of a
 * socketpair on fd 3, as PID 1 of a new pid namespace (so init's "kill
 * everything" when the channel closes stays inside it) and in a private
 * mount namespace holding one tmpfs of the test's own (for the
 * mount-crossing test).  It is not chrooted: "/" of the file operations is
 * the host's root, so every write stays under a mkdtemp directory, and the
 * ".." tests only stat or read harmless files.  Containment under a real
 * sandbox root is the integration suite's job.
 *
 * Covered: HELLO v2, PING, spawn/exit/errors, stdin and STDIN_WRITTEN,
 * EPIPE, timeouts, signals, the exit report with a background child, PTY
 * commands (tty, size, RESIZE, stdin), FLOW commands (no output without
 * credit, exactly the credit granted, drained after exit, a background
 * child holding the pipe), and every file operation with its errors.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent/proto.h"
#include "common/util.h"
#include "tap.h"

static int chan = -1;
static pid_t holder = -1; /* the process whose child is init (PID 1) */
static char tmp[] = "/tmp/hutch-init-test.XXXXXX";
static bool have_mount; /* the private tmpfs at <tmp>/m/mnt */
static uint32_t next_id = 100;

static uint64_t ms_now(void) { return mono_us() / 1000; }

/* ---- frames ----------------------------------------------------------- */

struct cmdrun {
  uint32_t id;
  struct hutch_buf out, err;
  bool started, exited;
  uint32_t pid;
  int exit_code, signo, timed_out;
  int error_errno, errors;
  char error_msg[512];
  uint64_t written;
  int written_frames;
};

struct fsresp {
  uint32_t id;
  bool done;
  uint16_t type;
  struct hutch_buf payload;
  int errnum;
  char msg[1200];
};

#define MAX_WATCH 16
static struct cmdrun *runs[MAX_WATCH];
static struct fsresp *fsw;
static struct hutch_frame_hdr last_other; /* a frame no one waited for */
static int others;

static void send_frame(uint16_t type, uint32_t id, const void *p, size_t n) {
  hutch_err err = HUTCH_ERR_INIT;
  if (hutch_frame_write(chan, type, id, p, n, &err) < 0) printf("# send: %s\n", err.msg);
}

static uint32_t tlv_u32_or(const unsigned char *p, size_t len, uint8_t tag, uint32_t dflt) {
  uint32_t v;
  return hutch_tlv_find_u32(p, len, tag, &v) == 1 ? v : dflt;
}

static void dispatch(const struct hutch_frame_hdr *h, const unsigned char *p) {
  for (int i = 0; i < MAX_WATCH; i++) {
    struct cmdrun *r = runs[i];
    if (!r || r->id != h->id) continue;
    switch (h->type) {
      case HUTCH_MSG_STARTED:
        r->started = true;
        r->pid = tlv_u32_or(p, h->len, HUTCH_TAG_PID, 0);
        break;
      case HUTCH_MSG_STDOUT: hutch_buf_append(&r->out, p, h->len); break;
      case HUTCH_MSG_STDERR: hutch_buf_append(&r->err, p, h->len); break;
      case HUTCH_MSG_EXIT:
        r->exited = true;
        r->exit_code = (int)tlv_u32_or(p, h->len, HUTCH_TAG_EXIT_CODE, 0xffff);
        r->signo = (int)tlv_u32_or(p, h->len, HUTCH_TAG_SIGNO, 0);
        r->timed_out = (int)tlv_u32_or(p, h->len, HUTCH_TAG_TIMED_OUT, 0xffff);
        break;
      case HUTCH_MSG_STDIN_WRITTEN:
        r->written += tlv_u32_or(p, h->len, HUTCH_TAG_BYTES, 0);
        r->written_frames++;
        break;
      case HUTCH_MSG_ERROR: {
        r->errors++;
        r->error_errno = (int)tlv_u32_or(p, h->len, HUTCH_TAG_ERRNO, 0);
        cleanup_free char *m = hutch_tlv_find_str(p, h->len, HUTCH_TAG_MESSAGE);
        snprintf(r->error_msg, sizeof r->error_msg, "%s", m ? m : "");
        break;
      }
      default: printf("# unexpected frame type %u for command %u\n", h->type, h->id);
    }
    return;
  }
  if (fsw && fsw->id == h->id) {
    fsw->done = true;
    fsw->type = h->type;
    hutch_buf_reset(&fsw->payload);
    hutch_buf_append(&fsw->payload, p, h->len);
    if (h->type == HUTCH_MSG_ERROR) {
      fsw->errnum = (int)tlv_u32_or(p, h->len, HUTCH_TAG_ERRNO, 0);
      cleanup_free char *m = hutch_tlv_find_str(p, h->len, HUTCH_TAG_MESSAGE);
      snprintf(fsw->msg, sizeof fsw->msg, "%s", m ? m : "");
    }
    return;
  }
  last_other = *h;
  others++;
  printf("# frame type %u id %u that nobody waits for\n", h->type, h->id);
}

/* Read and dispatch frames until cond(arg) holds or ms pass; returns cond. */
static bool pump_until(int ms, bool (*cond)(void *), void *arg) {
  static struct hutch_buf pl;
  uint64_t end = ms_now() + (uint64_t)ms;
  while (!(cond && cond(arg))) {
    uint64_t now = ms_now();
    if (now >= end) break;
    struct pollfd q = {.fd = chan, .events = POLLIN};
    if (poll(&q, 1, (int)(end - now)) <= 0) continue;
    struct hutch_frame_hdr h;
    hutch_err err = HUTCH_ERR_INIT;
    if (hutch_frame_read(chan, &h, &pl, &err) != 1) {
      printf("# channel closed: %s\n", err.msg);
      return cond && cond(arg);
    }
    dispatch(&h, pl.data);
  }
  return cond && cond(arg);
}
static void settle(int ms) { pump_until(ms, NULL, NULL); }

static bool run_exited(void *a) { return ((struct cmdrun *)a)->exited; }
static bool run_started(void *a) {
  struct cmdrun *r = a;
  return r->started || r->errors;
}
static bool run_errored(void *a) { return ((struct cmdrun *)a)->errors > 0; }
static size_t want_bytes;
static bool run_has_bytes(void *a) {
  struct cmdrun *r = a;
  return r->out.len + r->err.len >= want_bytes || r->exited;
}
static const char *want_text;
static bool run_has_text(void *a) {
  struct cmdrun *r = a;
  hutch_buf_append(&r->out, "", 1);
  r->out.len--;
  return strstr((char *)r->out.data, want_text) || r->exited;
}
static uint64_t want_written;
static bool run_written(void *a) {
  struct cmdrun *r = a;
  return r->written >= want_written || r->errors;
}
static bool run_two_reports(void *a) { return ((struct cmdrun *)a)->written_frames >= 2; }
static bool fs_done(void *a) { return ((struct fsresp *)a)->done; }

static struct cmdrun *watch(uint32_t id) {
  struct cmdrun *r = xcalloc(1, sizeof *r);
  r->id = id;
  hutch_buf_init(&r->out);
  hutch_buf_init(&r->err);
  for (int i = 0; i < MAX_WATCH; i++)
    if (!runs[i]) {
      runs[i] = r;
      return r;
    }
  abort();
}

static void unwatch(struct cmdrun *r) {
  for (int i = 0; i < MAX_WATCH; i++)
    if (runs[i] == r) runs[i] = NULL;
  hutch_buf_free(&r->out);
  hutch_buf_free(&r->err);
  free(r);
}

struct spawn_opts {
  uint32_t flags, timeout_ms, rows, cols;
};

/* SPAWN argv (NULL-terminated); waits for STARTED or ERROR. */
static struct cmdrun *spawn(const char *const *argv, const struct spawn_opts *o) {
  static const char *const env[] = {"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "LC_ALL=C", NULL};
  struct spawn_opts none = {0};
  if (!o) o = &none;
  struct hutch_buf b;
  hutch_buf_init(&b);
  hutch_spawn_encode(&b, argv, env, NULL, o->timeout_ms, 0, 0, o->flags);
  if (o->rows) hutch_tlv_put_u32(&b, HUTCH_TAG_ROWS, o->rows);
  if (o->cols) hutch_tlv_put_u32(&b, HUTCH_TAG_COLS, o->cols);
  struct cmdrun *r = watch(next_id++);
  send_frame(HUTCH_MSG_SPAWN, r->id, b.data, b.len);
  hutch_buf_free(&b);
  pump_until(5000, run_started, r);
  return r;
}

static struct cmdrun *sh(const char *script, const struct spawn_opts *o) {
  const char *argv[] = {"/bin/sh", "-c", script, NULL};
  return spawn(argv, o);
}

static void send_u32(uint16_t type, uint32_t id, uint8_t tag, uint32_t v) {
  struct hutch_buf b;
  hutch_buf_init(&b);
  hutch_tlv_put_u32(&b, tag, v);
  send_frame(type, id, b.data, b.len);
  hutch_buf_free(&b);
}

static void resize(uint32_t id, uint32_t rows, uint32_t cols) {
  struct hutch_buf b;
  hutch_buf_init(&b);
  hutch_tlv_put_u32(&b, HUTCH_TAG_ROWS, rows);
  hutch_tlv_put_u32(&b, HUTCH_TAG_COLS, cols);
  send_frame(HUTCH_MSG_RESIZE, id, b.data, b.len);
  hutch_buf_free(&b);
}

static char *out_str(struct cmdrun *r) {
  char *s = xmalloc(r->out.len + 1);
  if (r->out.len) memcpy(s, r->out.data, r->out.len);
  s[r->out.len] = 0;
  return s;
}

/* ---- starting init ---------------------------------------------------- */

static const char *find_init(void) {
  static char path[4200];
  const char *env = getenv("HUTCH_INIT");
  if (env && *env) return env;
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    self[n] = 0;
    char *slash = strrchr(self, '/');
    if (slash) {
      *slash = 0; /* <build>/tests */
      snprintf(path, sizeof path, "%s/../hutch-init", self);
      if (access(path, X_OK) == 0) return path;
    }
  }
  /* build-asan/ has no hutch-init: init is never built with sanitizers. */
  if (access("build/hutch-init", X_OK) == 0) return "build/hutch-init";
  return NULL;
}

static int start_init(const char *init_path) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) return -1;
  cleanup_free char *mnt = xasprintf("%s/m/mnt", tmp);
  mkdir_p(mnt, 0755, NULL);
  holder = fork();
  if (holder < 0) return -1;
  if (holder == 0) {
    if (unshare(CLONE_NEWPID | CLONE_NEWNS) < 0) _exit(77);
    /* Private: the tmpfs below is seen by init only, never by the host. */
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0 &&
        mount("tmpfs", mnt, "tmpfs", 0, "size=1m,mode=0755") == 0) {
      cleanup_free char *keep = xasprintf("%s/keep", mnt);
      int fd = open(keep, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
      if (fd >= 0) close(fd);
    }
    pid_t init = fork();
    if (init == 0) {
      if (dup2(sv[1], 3) < 0) _exit(126);
      int null = open("/dev/null", O_RDWR);
      if (null > 0) {
        dup2(null, 0);
        close(null);
      }
      execl(init_path, "hutch-init", (char *)NULL);
      _exit(127);
    }
    close(sv[0]);
    close(sv[1]);
    int st = 0;
    while (init > 0 && waitpid(init, &st, 0) < 0 && errno == EINTR) {
    }
    _exit(init < 0 ? 125 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
  }
  close(sv[1]);
  chan = sv[0];
  return 0;
}

/* Close the channel: init must exit (and take its namespace with it).
 * Returns whether it did within 5 s. */
static bool stop_init(void) {
  if (chan >= 0) close(chan);
  chan = -1;
  int st;
  if (holder <= 0) return false;
  for (int i = 0; i < 500; i++) {
    if (waitpid(holder, &st, WNOHANG) == holder) return true;
    usleep(10000);
  }
  kill(holder, SIGKILL);
  waitpid(holder, &st, 0);
  return false;
}

/* init's pid on the host: the holder's only child. */
static int init_host_pid(void) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)holder, (int)holder);
  cleanup_free char *kids = read_file(path, 64, NULL, NULL);
  return kids ? atoi(kids) : -1;
}

static int init_fds(void) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd", init_host_pid());
  int n = 0;
  DIR *d = opendir(path);
  for (struct dirent *de; d && (de = readdir(d));) n += de->d_name[0] != '.';
  if (d) closedir(d);
  return n;
}

/* ---- commands --------------------------------------------------------- */

static void test_hello(void) {
  struct hutch_frame_hdr h;
  struct hutch_buf pl;
  hutch_buf_init(&pl);
  hutch_err err = HUTCH_ERR_INIT;
  struct pollfd q = {.fd = chan, .events = POLLIN};
  int r = poll(&q, 1, 5000) == 1 ? hutch_frame_read(chan, &h, &pl, &err) : -1;
  ok(r == 1 && h.type == HUTCH_MSG_HELLO, "init says HELLO first");
  if (r == 1) {
    is_int(tlv_u32_or(pl.data, pl.len, HUTCH_TAG_VERSION, 0), 2, "HELLO: protocol version 2");
    is_int(tlv_u32_or(pl.data, pl.len, HUTCH_TAG_PID, 0), 1, "HELLO: init is PID 1 of its namespace");
  }
  hutch_buf_free(&pl);

  struct cmdrun *dummy = watch(77);
  send_frame(HUTCH_MSG_PING, 9999, NULL, 0);
  settle(200);
  ok(others == 1 && last_other.type == HUTCH_MSG_PONG && last_other.id == 9999, "PING is answered by PONG on its id");
  others = 0;
  unwatch(dummy);
}

static void test_spawn_basic(void) {
  struct cmdrun *r = sh("echo out; echo err >&2; exit 3", NULL);
  ok(r->started && r->pid > 1, "STARTED with a pid (%u)", r->pid);
  ok(pump_until(5000, run_exited, r), "EXIT arrives");
  is_int(r->exit_code, 3, "exit code 3");
  is_int(r->timed_out, 0, "not timed out");
  ok(r->out.len == 4 && !memcmp(r->out.data, "out\n", 4), "STDOUT is `out\\n`");
  ok(r->err.len == 4 && !memcmp(r->err.data, "err\n", 4), "STDERR is `err\\n`");
  unwatch(r);

  /* ls opens fd 3 for the directory itself: nothing else is inherited. */
  r = sh("ls /proc/self/fd", NULL);
  pump_until(5000, run_exited, r);
  cleanup_free char *fds = out_str(r);
  is_str(fds, "0\n1\n2\n3\n", "a command has only fds 0-2 of init's");
  unwatch(r);
  struct spawn_opts pty = {.flags = HUTCH_SPAWN_PTY | HUTCH_SPAWN_FLOW};
  r = sh("ls -1 /proc/self/fd", &pty);
  send_u32(HUTCH_MSG_CREDIT, r->id, HUTCH_TAG_BYTES, 1000);
  pump_until(5000, run_exited, r);
  cleanup_free char *pfds = out_str(r);
  is_str(pfds, "0\r\n1\r\n2\r\n3\r\n", "... also on a PTY (no master, no slave copy)");
  unwatch(r);

  const char *missing[] = {"/nonexistent/prog", NULL};
  r = spawn(missing, NULL);
  ok(!r->started && r->errors == 1, "a missing program does not start");
  is_int(r->error_errno, ENOENT, "ERROR ENOENT");
  ok(strstr(r->error_msg, "exec `/nonexistent/prog`") != NULL, "message names exec and the program (%s)", r->error_msg);
  unwatch(r);
}

static void test_stdin(void) {
  const char *cat[] = {"cat", NULL};
  struct spawn_opts o = {.flags = HUTCH_SPAWN_STDIN};
  struct cmdrun *r = spawn(cat, &o);
  send_frame(HUTCH_MSG_STDIN, r->id, "hello\n", 6);
  want_written = 6;
  ok(pump_until(5000, run_written, r), "STDIN_WRITTEN after the queue drained");
  is_int(r->written, 6, "STDIN_WRITTEN BYTES = 6");
  is_int(r->written_frames, 1, "one STDIN_WRITTEN");
  want_text = "hello\n";
  pump_until(5000, run_has_text, r);
  send_frame(HUTCH_MSG_STDIN, r->id, NULL, 0);
  pump_until(3000, run_two_reports, r);
  is_int(r->written_frames, 2, "an empty STDIN is answered too (BYTES 0)");
  is_int(r->written, 6, "... with 0 bytes");
  send_frame(HUTCH_MSG_STDIN_CLOSE, r->id, NULL, 0);
  ok(pump_until(5000, run_exited, r) && r->exit_code == 0, "STDIN_CLOSE ends cat");
  ok(r->out.len == 6 && !memcmp(r->out.data, "hello\n", 6), "cat echoed the input");
  is_int(r->errors, 0, "no errors");
  unwatch(r);

  /* 1 MiB in four frames, sent back to back: the writer does not wait. */
  const char *wc[] = {"wc", "-c", NULL};
  r = spawn(wc, &o);
  static unsigned char chunk[256 * 1024];
  memset(chunk, 'x', sizeof chunk);
  for (int i = 0; i < 4; i++) send_frame(HUTCH_MSG_STDIN, r->id, chunk, sizeof chunk);
  want_written = 4 * sizeof chunk;
  ok(pump_until(10000, run_written, r), "1 MiB of stdin reported written");
  is_int(r->written, 4 * sizeof chunk, "STDIN_WRITTEN frames add up to 1 MiB");
  ok(r->written_frames >= 1 && r->written_frames <= 4, "%d STDIN_WRITTEN frames (one per drain)", r->written_frames);
  send_frame(HUTCH_MSG_STDIN_CLOSE, r->id, NULL, 0);
  pump_until(5000, run_exited, r);
  cleanup_free char *s = out_str(r);
  is_int(atoi(s), 4 * sizeof chunk, "wc counted 1 MiB");
  unwatch(r);

  /* A reader that goes away: the queued rest is an ERROR EPIPE. */
  const char *head[] = {"head", "-c", "1", NULL};
  r = spawn(head, &o);
  send_frame(HUTCH_MSG_STDIN, r->id, chunk, sizeof chunk);
  ok(pump_until(5000, run_errored, r), "stdin to a reader that exits: ERROR");
  is_int(r->error_errno, EPIPE, "ERROR EPIPE (%s)", r->error_msg);
  ok(pump_until(5000, run_exited, r) && r->exit_code == 0, "head exited 0");
  r->errors = 0;
  send_frame(HUTCH_MSG_STDIN, r->id, "x", 1);
  pump_until(2000, run_errored, r);
  is_int(r->error_errno, EPIPE, "STDIN to a finished command: ERROR EPIPE");
  unwatch(r);
}

static void test_timeout_signal(void) {
  const char *slp[] = {"sleep", "10", NULL};
  struct spawn_opts o = {.timeout_ms = 200};
  uint64_t t0 = ms_now();
  struct cmdrun *r = spawn(slp, &o);
  ok(pump_until(5000, run_exited, r), "a timed out command exits");
  ok(r->signo == SIGKILL && r->timed_out == 1, "SIGKILL, TIMED_OUT 1");
  ok(ms_now() - t0 < 3000, "within the timeout (%llu ms)", (unsigned long long)(ms_now() - t0));
  unwatch(r);

  r = spawn(slp, NULL);
  send_u32(HUTCH_MSG_SIGNAL, r->id, HUTCH_TAG_SIGNO, SIGTERM);
  ok(pump_until(5000, run_exited, r) && r->signo == SIGTERM && r->timed_out == 0,
     "SIGNAL 15 ends the command: SIGNO 15");
  unwatch(r);

  /* A background child holding stdout does not hold the exit report back. */
  t0 = ms_now();
  r = sh("echo a; sleep 5 &", NULL);
  ok(pump_until(3000, run_exited, r), "EXIT with a background child holding the pipe");
  ok(ms_now() - t0 < 2000, "... after the grace, not after the child (%llu ms)", (unsigned long long)(ms_now() - t0));
  ok(r->out.len == 2 && !memcmp(r->out.data, "a\n", 2), "... and with the output before it");
  unwatch(r);
}

static void test_pty(void) {
  struct spawn_opts o = {.flags = HUTCH_SPAWN_PTY};
  struct cmdrun *r = sh("tty; stty size", &o);
  ok(r->started, "PTY command started %s", r->error_msg);
  ok(pump_until(5000, run_exited, r) && r->exit_code == 0, "PTY command exits 0");
  cleanup_free char *s = out_str(r);
  ok(!strncmp(s, "/dev/pts/", 9), "tty is /dev/pts/N");
  ok(strstr(s, "\r\n24 80\r\n") != NULL, "default size 24x80");
  ok(r->err.len == 0, "no STDERR frames for a PTY");
  unwatch(r);

  o.rows = 30;
  o.cols = 100;
  r = sh("stty size", &o);
  pump_until(5000, run_exited, r);
  cleanup_free char *s2 = out_str(r);
  is_str(s2, "30 100\r\n", "SPAWN ROWS/COLS set the size");
  unwatch(r);

  o.rows = o.cols = 0;
  r = sh("read x; stty size; echo \"got $x\"", &o);
  resize(r->id, 40, 120);
  send_frame(HUTCH_MSG_STDIN, r->id, "go\n", 3);
  want_written = 3;
  ok(pump_until(5000, run_written, r) && r->written == 3, "STDIN to a PTY command (no STDIN flag): STDIN_WRITTEN 3");
  ok(pump_until(5000, run_exited, r) && r->exit_code == 0, "exits after reading a line");
  cleanup_free char *s3 = out_str(r);
  ok(strstr(s3, "40 120\r\n") != NULL, "RESIZE changed the size");
  ok(strstr(s3, "got go\r\n") != NULL, "the line was read");
  ok(strstr(s3, "go\r\n") == s3, "the terminal echoed the input first");
  is_int(r->errors, 0, "no errors");
  unwatch(r);

  /* ^D at the start of a line is the terminal's end of input. */
  const char *cat[] = {"cat", NULL};
  r = spawn(cat, &o);
  send_frame(HUTCH_MSG_STDIN, r->id, "abc\n", 4);
  want_text = "abc\r\nabc\r\n";
  ok(pump_until(5000, run_has_text, r), "cat on a PTY: echo and output");
  send_frame(HUTCH_MSG_STDIN, r->id, "\x04", 1);
  ok(pump_until(5000, run_exited, r) && r->exit_code == 0, "^D ends cat");
  unwatch(r);

  /* RESIZE errors. */
  const char *slp[] = {"sleep", "10", NULL};
  r = spawn(slp, NULL);
  resize(r->id, 10, 10);
  ok(pump_until(2000, run_errored, r) && r->error_errno == EINVAL, "RESIZE of a command without a PTY: EINVAL (%s)",
     r->error_msg);
  send_u32(HUTCH_MSG_SIGNAL, r->id, HUTCH_TAG_SIGNO, SIGKILL);
  pump_until(5000, run_exited, r);
  unwatch(r);
  struct cmdrun *u = watch(55555);
  resize(55555, 10, 10);
  ok(pump_until(2000, run_errored, u) && u->error_errno == ESRCH, "RESIZE of an unknown command: ESRCH");
  unwatch(u);
  r = sh("sleep 10", &o);
  resize(r->id, 70000, 10);
  ok(pump_until(2000, run_errored, r) && r->error_errno == EINVAL, "RESIZE to 70000 rows: EINVAL");
  r->errors = 0;
  resize(r->id, 0, 10);
  ok(pump_until(2000, run_errored, r) && r->error_errno == EINVAL, "RESIZE to 0 rows: EINVAL");
  send_u32(HUTCH_MSG_SIGNAL, r->id, HUTCH_TAG_SIGNO, SIGKILL);
  ok(pump_until(5000, run_exited, r) && r->signo == SIGKILL, "SIGNAL reaches a PTY command");
  unwatch(r);
}

static void test_flow(void) {
  struct spawn_opts o = {.flags = HUTCH_SPAWN_FLOW};
  struct cmdrun *r = sh("head -c 200000 /dev/zero", &o);
  settle(300);
  ok(r->out.len == 0 && !r->exited, "FLOW: no output and no exit without credit");
  send_u32(HUTCH_MSG_CREDIT, r->id, HUTCH_TAG_BYTES, 1000);
  want_bytes = 1000;
  pump_until(3000, run_has_bytes, r);
  settle(200);
  is_int(r->out.len, 1000, "FLOW: exactly the 1000 bytes of credit arrive");
  send_u32(HUTCH_MSG_CREDIT, r->id, HUTCH_TAG_BYTES, 150000);
  send_u32(HUTCH_MSG_CREDIT, r->id, HUTCH_TAG_BYTES, 49000);
  ok(pump_until(5000, run_exited, r), "FLOW: EXIT once the credit covers the output");
  is_int(r->out.len, 200000, "FLOW: all 200000 bytes, none lost, none extra");
  is_int(r->exit_code, 0, "exit 0");
  unwatch(r);

  /* The command exits with its output still in the pipes: EXIT waits. */
  r = sh("printf abc; printf def >&2", &o);
  settle(400);
  ok(r->out.len + r->err.len == 0 && !r->exited, "FLOW: exited command with unread output is not reported yet");
  send_u32(HUTCH_MSG_CREDIT, r->id, HUTCH_TAG_BYTES, 2);
  want_bytes = 2;
  pump_until(3000, run_has_bytes, r);
  settle(100);
  ok(r->out.len + r->err.len == 2 && !r->exited, "2 bytes of credit: 2 bytes, still no EXIT");
  send_u32(HUTCH_MSG_CREDIT, r->id, HUTCH_TAG_BYTES, 100);
  ok(pump_until(3000, run_exited, r), "the rest of the credit drains it: EXIT");
  ok(r->out.len == 3 && r->err.len == 3 && !memcmp(r->out.data, "abc", 3) && !memcmp(r->err.data, "def", 3),
     "stdout `abc`, stderr `def` (one credit for both)");
  unwatch(r);

  /* Output fully consumed (none at all): EXIT without any credit. */
  const char *tru[] = {"true", NULL};
  uint64_t t0 = ms_now();
  r = spawn(tru, &o);
  ok(pump_until(3000, run_exited, r) && r->exit_code == 0, "FLOW: an empty command exits without credit");
  printf("# exit report after %llu ms\n", (unsigned long long)(ms_now() - t0));
  unwatch(r);

  /* A background child holds the pipe: the grace applies once the main
   * process's output is read. */
  r = sh("echo hi; sleep 5 &", &o);
  settle(400);
  ok(!r->exited && r->out.len == 0, "FLOW: pending output and a background child: no EXIT yet");
  t0 = ms_now();
  send_u32(HUTCH_MSG_CREDIT, r->id, HUTCH_TAG_BYTES, 100);
  ok(pump_until(3000, run_exited, r), "FLOW: EXIT after the output is read, although the child holds the pipe");
  ok(ms_now() - t0 < 1000, "... promptly (%llu ms)", (unsigned long long)(ms_now() - t0));
  ok(r->out.len == 3 && !memcmp(r->out.data, "hi\n", 3), "... with the output");
  unwatch(r);

  /* FLOW on a PTY. */
  o.flags = HUTCH_SPAWN_FLOW | HUTCH_SPAWN_PTY;
  r = sh("echo hello", &o);
  settle(300);
  ok(r->out.len == 0, "FLOW PTY: nothing without credit");
  send_u32(HUTCH_MSG_CREDIT, r->id, HUTCH_TAG_BYTES, 4);
  want_bytes = 4;
  pump_until(2000, run_has_bytes, r);
  settle(150);
  is_int(r->out.len, 4, "FLOW PTY: 4 bytes for 4 of credit");
  send_u32(HUTCH_MSG_CREDIT, r->id, HUTCH_TAG_BYTES, 1000);
  ok(pump_until(3000, run_exited, r), "FLOW PTY: EXIT");
  cleanup_free char *s = out_str(r);
  is_str(s, "hello\r\n", "FLOW PTY: the whole output");
  unwatch(r);

  /* Credit in odd pieces over both streams: never a byte more than
   * granted, nothing lost, order kept per stream. */
  o.flags = HUTCH_SPAWN_FLOW;
  r = sh("seq 1 20000; seq 1 5000 >&2", &o);
  size_t granted = 0, expect = 108894 + 23893;
  bool never_over = true;
  srand(42);
  while (!r->exited && granted < expect + 10) {
    uint32_t piece = 1 + (uint32_t)(rand() % 4000);
    send_u32(HUTCH_MSG_CREDIT, r->id, HUTCH_TAG_BYTES, piece);
    granted += piece;
    want_bytes = granted < expect ? granted : expect;
    pump_until(2000, run_has_bytes, r);
    never_over &= r->out.len + r->err.len <= granted;
  }
  pump_until(2000, run_exited, r);
  ok(never_over, "FLOW: output never exceeded the credit (%zu granted)", granted);
  ok(r->exited && r->out.len == 108894 && r->err.len == 23893, "FLOW: all of both streams (%zu + %zu)", r->out.len,
     r->err.len);
  bool in_order = true;
  char *line = (char *)r->out.data;
  for (int i = 1; i <= 20000 && in_order; i++) {
    char *nl = memchr(line, '\n', r->out.len - (size_t)(line - (char *)r->out.data));
    in_order = nl && atoi(line) == i;
    if (nl) line = nl + 1;
  }
  ok(in_order, "FLOW: stdout complete and in order");
  unwatch(r);

  /* A FLOW command with credit to spare behaves like any other. */
  o.flags = HUTCH_SPAWN_FLOW;
  r = sh("sleep 0.2; echo late", &o);
  send_u32(HUTCH_MSG_CREDIT, r->id, HUTCH_TAG_BYTES, 1 << 20);
  ok(pump_until(3000, run_exited, r) && r->out.len == 5, "FLOW with credit ahead: output and EXIT");
  unwatch(r);
}

/* ---- files ------------------------------------------------------------ */

static struct fsresp resp;

static struct fsresp *fs(uint16_t type, const struct hutch_buf *b) {
  hutch_buf_reset(&resp.payload);
  resp.id = next_id++;
  resp.done = false;
  resp.errnum = 0;
  resp.msg[0] = 0;
  fsw = &resp;
  send_frame(type, resp.id, b ? b->data : NULL, b ? b->len : 0);
  if (!pump_until(10000, fs_done, &resp)) printf("# no answer to FS request %u\n", type);
  fsw = NULL;
  return &resp;
}

static bool fs_ok(const struct fsresp *r, uint16_t type) {
  if (r->type == HUTCH_MSG_ERROR) printf("#   error %d: %s\n", r->errnum, r->msg);
  return r->done && r->type == type;
}

static bool fs_err(const struct fsresp *r, int errnum) {
  if (!(r->done && r->type == HUTCH_MSG_ERROR && r->errnum == errnum))
    printf("#   got type %u errno %d (%s), wanted errno %d\n", r->type, r->errnum, r->msg, errnum);
  return r->done && r->type == HUTCH_MSG_ERROR && r->errnum == errnum;
}

struct entry {
  char path[4200];
  char link[4200];
  uint32_t type, mode, uid, gid;
  uint64_t size, mtime;
};

static int parse_entry(const unsigned char *v, uint32_t vl, struct entry *e) {
  memset(e, 0, sizeof *e);
  struct hutch_tlv_iter it;
  uint8_t tag;
  const unsigned char *x;
  uint32_t xl;
  hutch_tlv_iter_init(&it, v, vl);
  while (hutch_tlv_next(&it, &tag, &x, &xl) == 1) {
    switch (tag) {
      case HUTCH_TAG_PATH: snprintf(e->path, sizeof e->path, "%.*s", (int)xl, (const char *)x); break;
      case HUTCH_TAG_E_LINK: snprintf(e->link, sizeof e->link, "%.*s", (int)xl, (const char *)x); break;
      case HUTCH_TAG_E_TYPE: hutch_tlv_u32(x, xl, &e->type); break;
      case HUTCH_TAG_MODE: hutch_tlv_u32(x, xl, &e->mode); break;
      case HUTCH_TAG_UID: hutch_tlv_u32(x, xl, &e->uid); break;
      case HUTCH_TAG_GID: hutch_tlv_u32(x, xl, &e->gid); break;
      case HUTCH_TAG_E_SIZE: hutch_tlv_u64(x, xl, &e->size); break;
      case HUTCH_TAG_E_MTIME: hutch_tlv_u64(x, xl, &e->mtime); break;
      default: break;
    }
  }
  return 0;
}

/* All ENTRY fields of an FS_RESULT (at most max). */
static size_t entries(const struct fsresp *r, struct entry *out, size_t max) {
  struct hutch_tlv_iter it;
  uint8_t tag;
  const unsigned char *v;
  uint32_t vl;
  size_t n = 0;
  hutch_tlv_iter_init(&it, r->payload.data, r->payload.len);
  while (hutch_tlv_next(&it, &tag, &v, &vl) == 1)
    if (tag == HUTCH_TAG_ENTRY) {
      if (n < max) parse_entry(v, vl, &out[n]);
      n++;
    }
  return n;
}

static struct hutch_buf req;
static struct hutch_buf *path_req(const char *path) {
  hutch_buf_reset(&req);
  hutch_tlv_put_str(&req, HUTCH_TAG_PATH, path);
  return &req;
}

static struct fsresp *stat_path(const char *path, struct entry *e) {
  struct fsresp *r = fs(HUTCH_MSG_FS_STAT, path_req(path));
  memset(e, 0, sizeof *e);
  if (r->type == HUTCH_MSG_FS_RESULT) entries(r, e, 1);
  return r;
}

static struct fsresp *mkdir_req(const char *path, int mode, uint32_t flags) {
  path_req(path);
  if (mode >= 0) hutch_tlv_put_u32(&req, HUTCH_TAG_MODE, (uint32_t)mode);
  hutch_tlv_put_u32(&req, HUTCH_TAG_FLAGS, flags);
  return fs(HUTCH_MSG_FS_MKDIR, &req);
}

static struct fsresp *open_req(const char *path, uint32_t flags, int mode, uint32_t *handle) {
  path_req(path);
  hutch_tlv_put_u32(&req, HUTCH_TAG_FLAGS, flags);
  if (mode >= 0) hutch_tlv_put_u32(&req, HUTCH_TAG_MODE, (uint32_t)mode);
  struct fsresp *r = fs(HUTCH_MSG_FS_OPEN, &req);
  *handle = r->type == HUTCH_MSG_FS_RESULT ? tlv_u32_or(r->payload.data, r->payload.len, HUTCH_TAG_HANDLE, 0) : 0;
  return r;
}

static struct fsresp *handle_req(uint16_t type, uint32_t handle, uint32_t len, const void *data, size_t dlen) {
  hutch_buf_reset(&req);
  hutch_tlv_put_u32(&req, HUTCH_TAG_HANDLE, handle);
  if (len) hutch_tlv_put_u32(&req, HUTCH_TAG_LEN, len);
  if (data) hutch_tlv_put(&req, HUTCH_TAG_DATA, data, (uint32_t)dlen);
  return fs(type, &req);
}

static struct fsresp *flags_req(uint16_t type, const char *path, const char *path2, uint32_t flags) {
  path_req(path);
  if (path2) hutch_tlv_put_str(&req, HUTCH_TAG_PATH2, path2);
  hutch_tlv_put_u32(&req, HUTCH_TAG_FLAGS, flags);
  return fs(type, &req);
}

static char *T(const char *rel) { return xasprintf("%s/%s", tmp, rel); }

static void put_file(const char *path, const char *s, hutch_err *err) {
  if (write_file(path, s, strlen(s), 0644, err) < 0) printf("# write %s failed\n", path);
}

static void test_fs_paths(void) {
  struct entry e;
  struct fsresp *r;
  r = fs(HUTCH_MSG_FS_STAT, path_req(""));
  ok(fs_err(r, EINVAL), "stat of an empty path: EINVAL (%s)", r->msg);
  hutch_buf_reset(&req);
  hutch_tlv_put(&req, HUTCH_TAG_PATH, "/tmp\0x", 6);
  ok(fs_err(fs(HUTCH_MSG_FS_STAT, &req), EINVAL), "a path with a NUL: EINVAL");
  char *longp = xmalloc(5001);
  memset(longp, 'a', 5000);
  longp[0] = '/';
  longp[5000] = 0;
  ok(fs_err(fs(HUTCH_MSG_FS_STAT, path_req(longp)), EINVAL), "a path over 4096 bytes: EINVAL");
  free(longp);
  ok(fs_err(fs(HUTCH_MSG_FS_STAT, NULL), EINVAL), "no PATH: EINVAL");

  cleanup_free char *missing = T("missing");
  r = stat_path(missing, &e);
  ok(fs_err(r, ENOENT), "stat of a missing file: ENOENT");
  cleanup_free char *want = xasprintf("stat `%s`: No such file or directory", missing);
  is_str(r->msg, want, "message names the operation and the path");

  r = stat_path("/", &e);
  ok(fs_ok(r, HUTCH_MSG_FS_RESULT) && e.type == 2 && !strcmp(e.path, "/"), "stat of `/`");
  r = fs(HUTCH_MSG_FS_LIST, path_req("/"));
  ok(fs_ok(r, HUTCH_MSG_FS_RESULT) && entries(r, &e, 1) > 0, "list of `/`");
  struct stat st;
  if (stat("/root", &st) == 0) {
    r = stat_path(".", &e);
    ok(fs_ok(r, HUTCH_MSG_FS_RESULT) && e.type == 2, "a relative path is relative to /root: `.` is a directory");
  }

  /* ".." cannot climb above "/" (here the host's root: reads only). */
  struct stat pw;
  if (stat("/etc/passwd", &pw) == 0) {
    cleanup_free char *esc = xasprintf("%s/../../../../../../../../../../etc/passwd", tmp);
    r = stat_path(esc, &e);
    ok(fs_ok(r, HUTCH_MSG_FS_RESULT) && e.type == 1 && e.size == (uint64_t)pw.st_size,
       "`..` beyond the root stays at the root: %s is /etc/passwd", esc);
    r = stat_path("/../../etc/passwd", &e);
    ok(fs_ok(r, HUTCH_MSG_FS_RESULT) && e.size == (uint64_t)pw.st_size, "`/../../etc/passwd` is /etc/passwd");
    /* Positive control first: the host can go through the magic link. */
    ok(stat("/proc/self/root/etc/passwd", &st) == 0, "control: /proc/self/root/etc/passwd works on the host");
    r = stat_path("/proc/self/root/etc/passwd", &e);
    ok(fs_err(r, ELOOP), "through a magic link: refused with ELOOP (%s)", r->msg);
    uint32_t h;
    r = open_req("/proc/self/root/etc/passwd", HUTCH_FS_O_READ, -1, &h);
    ok(fs_err(r, ELOOP), "open through a magic link: ELOOP");
  }
}

static void test_fs_mkdir_stat(void) {
  struct entry e;
  struct fsresp *r;
  cleanup_free char *d = T("d");
  ok(fs_ok(mkdir_req(d, 0700, 0), HUTCH_MSG_FS_RESULT), "mkdir");
  r = stat_path(d, &e);
  ok(fs_ok(r, HUTCH_MSG_FS_RESULT), "stat the new directory");
  is_int(e.type, 2, "E_TYPE 2 (dir)");
  is_int(e.mode, 0700, "MODE 0700 exactly (no umask)");
  is_str(e.path, d, "PATH is the path asked for");
  ok(e.mtime > 1600000000, "E_MTIME is seconds since the epoch");
  is_int(e.uid, geteuid(), "UID");
  r = mkdir_req(d, -1, 0);
  ok(fs_err(r, EEXIST), "mkdir of an existing directory: EEXIST");
  cleanup_free char *want = xasprintf("mkdir `%s`: File exists", d);
  is_str(r->msg, want, "message");
  ok(fs_ok(mkdir_req(d, -1, 1), HUTCH_MSG_FS_RESULT), "with parents, an existing directory is fine");

  cleanup_free char *abc = T("a/b/c");
  ok(fs_err(mkdir_req(abc, -1, 0), ENOENT), "mkdir a/b/c without parents: ENOENT");
  ok(fs_ok(mkdir_req(abc, 0750, 1), HUTCH_MSG_FS_RESULT), "mkdir a/b/c with parents");
  cleanup_free char *a = T("a");
  stat_path(a, &e);
  is_int(e.mode, 0755, "parents are made 0755");
  stat_path(abc, &e);
  is_int(e.mode, 0750, "the directory itself gets MODE");
  cleanup_free char *dot = T("a/.");
  ok(fs_err(mkdir_req(dot, -1, 0), EINVAL), "mkdir of `a/.`: EINVAL");
  ok(fs_err(mkdir_req("/", -1, 0), EINVAL), "mkdir of `/`: EINVAL");

  cleanup_free char *f = T("file");
  close(open(f, O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
  cleanup_free char *under = T("file/x/y");
  ok(fs_err(mkdir_req(under, -1, 1), EEXIST) || resp.errnum == ENOTDIR, "mkdir -p through a file fails (%s)", resp.msg);

  cleanup_free char *ln = T("link");
  ok(symlink("dangling-target", ln) == 0, "made a dangling symlink");
  r = stat_path(ln, &e);
  ok(fs_ok(r, HUTCH_MSG_FS_RESULT) && e.type == 3, "stat of a symlink: E_TYPE 3, not followed");
  is_str(e.link, "dangling-target", "E_LINK is the target");
  stat_path(f, &e);
  ok(e.type == 1 && e.size == 0 && e.mode == 0600, "a file: E_TYPE 1, size 0, mode 0600");
}

static void test_fs_io(void) {
  struct entry e;
  struct fsresp *r;
  uint32_t h = 0;
  cleanup_free char *f = T("d/data.bin");
  r = open_req(f, HUTCH_FS_O_WRITE, -1, &h);
  ok(fs_ok(r, HUTCH_MSG_FS_RESULT) && h != 0, "open for writing creates the file: HANDLE %u", h);
  entries(r, &e, 1);
  ok(e.type == 1 && e.size == 0 && e.mode == 0644, "... ENTRY of the new file (mode 0%o)", e.mode);
  /* 3 MiB + 5 bytes in chunks that fit a frame. */
  size_t total = 3 * (1 << 20) + 5, chunk = 512 * 1024;
  unsigned char *data = xmalloc(total);
  for (size_t i = 0; i < total; i++) data[i] = (unsigned char)(i * 7 + i / 251);
  bool all = true;
  for (size_t off = 0; off < total; off += chunk) {
    size_t n = total - off < chunk ? total - off : chunk;
    all &= fs_ok(handle_req(HUTCH_MSG_FS_WRITE, h, 0, data + off, n), HUTCH_MSG_FS_RESULT);
  }
  ok(all, "FS_WRITE of 3 MiB in 512 KiB chunks");
  ok(fs_ok(handle_req(HUTCH_MSG_FS_CLOSE, h, 0, NULL, 0), HUTCH_MSG_FS_RESULT), "FS_CLOSE");
  ok(fs_err(handle_req(HUTCH_MSG_FS_CLOSE, h, 0, NULL, 0), EBADF), "FS_CLOSE again: EBADF");
  size_t got = 0;
  cleanup_free char *host = read_file(f, total + 1, &got, NULL);
  ok(host && got == total && !memcmp(host, data, total), "the host sees the same bytes");

  r = open_req(f, HUTCH_FS_O_READ, -1, &h);
  entries(r, &e, 1);
  ok(fs_ok(r, HUTCH_MSG_FS_RESULT) && e.size == total, "open for reading: ENTRY size %llu", (unsigned long long)e.size);
  size_t off = 0;
  bool same = true;
  int frames = 0;
  for (;;) {
    r = handle_req(HUTCH_MSG_FS_READ, h, 1 << 20, NULL, 0);
    if (r->type != HUTCH_MSG_FS_DATA) break;
    frames++;
    if (r->payload.len == 0) break;
    if (off + r->payload.len > total || memcmp(data + off, r->payload.data, r->payload.len)) same = false;
    off += r->payload.len;
  }
  ok(r->type == HUTCH_MSG_FS_DATA && r->payload.len == 0, "FS_READ until an empty FS_DATA");
  ok(same && off == total, "read back %zu bytes, equal", off);
  is_int(frames, 5, "1 MiB per FS_READ: 4 chunks and the empty one");
  ok(fs_err(handle_req(HUTCH_MSG_FS_READ, h, (1 << 20) + 1, NULL, 0), EINVAL), "LEN over 1 MiB: EINVAL");
  ok(fs_err(handle_req(HUTCH_MSG_FS_READ, h, 0, NULL, 0), EINVAL), "no LEN: EINVAL");
  ok(fs_err(handle_req(HUTCH_MSG_FS_WRITE, h, 0, "x", 1), EBADF), "FS_WRITE on a read handle: EBADF");
  ok(fs_ok(handle_req(HUTCH_MSG_FS_CLOSE, h, 0, NULL, 0), HUTCH_MSG_FS_RESULT), "close");
  ok(fs_err(handle_req(HUTCH_MSG_FS_READ, h, 10, NULL, 0), EBADF), "FS_READ on a closed handle: EBADF");
  free(data);

  /* Modes. */
  cleanup_free char *g = T("d/secret");
  r = open_req(g, HUTCH_FS_O_WRITE, 0600, &h);
  entries(r, &e, 1);
  is_int(e.mode, 0600, "a new file gets MODE exactly");
  handle_req(HUTCH_MSG_FS_WRITE, h, 0, "0123456789", 10);
  handle_req(HUTCH_MSG_FS_CLOSE, h, 0, NULL, 0);
  r = open_req(g, HUTCH_FS_O_WRITE, -1, &h);
  entries(r, &e, 1);
  ok(e.mode == 0600 && e.size == 0, "reopened for writing without MODE: truncated, mode kept");
  handle_req(HUTCH_MSG_FS_CLOSE, h, 0, NULL, 0);
  r = open_req(g, HUTCH_FS_O_WRITE | HUTCH_FS_O_READ, 0640, &h);
  entries(r, &e, 1);
  is_int(e.mode, 0640, "reopened with MODE: mode changed");
  handle_req(HUTCH_MSG_FS_WRITE, h, 0, "abc", 3);
  handle_req(HUTCH_MSG_FS_CLOSE, h, 0, NULL, 0);

  /* Parents, wrong types, missing. */
  cleanup_free char *deep = T("p/q/r.txt");
  ok(fs_err(open_req(deep, HUTCH_FS_O_WRITE, -1, &h), ENOENT), "open for writing under a missing dir: ENOENT");
  r = open_req(deep, HUTCH_FS_O_WRITE | HUTCH_FS_O_PARENTS, -1, &h);
  ok(fs_ok(r, HUTCH_MSG_FS_RESULT), "... with FLAGS 4 the parents are created");
  handle_req(HUTCH_MSG_FS_CLOSE, h, 0, NULL, 0);
  cleanup_free char *p = T("p");
  stat_path(p, &e);
  ok(e.type == 2 && e.mode == 0755, "parent p is a directory, 0755");
  cleanup_free char *d = T("d");
  r = open_req(d, HUTCH_FS_O_READ, -1, &h);
  ok(fs_err(r, EISDIR), "open of a directory: EISDIR (%s)", r->msg);
  ok(fs_err(open_req(d, HUTCH_FS_O_WRITE, -1, &h), EISDIR), "open of a directory for writing: EISDIR");
  cleanup_free char *fifo = T("fifo");
  mkfifo(fifo, 0600);
  uint64_t t0 = ms_now();
  r = open_req(fifo, HUTCH_FS_O_READ, -1, &h);
  ok(fs_err(r, EINVAL) && ms_now() - t0 < 2000, "open of a FIFO: EINVAL at once (%s)", r->msg);
  cleanup_free char *missing = T("missing");
  r = open_req(missing, HUTCH_FS_O_READ, -1, &h);
  cleanup_free char *want = xasprintf("open `%s`: No such file or directory", missing);
  ok(fs_err(r, ENOENT), "open of a missing file: ENOENT");
  is_str(r->msg, want, "message");
  ok(fs_err(open_req(f, 0, -1, &h), EINVAL), "FLAGS 0: EINVAL");

  /* 64 handles at most. */
  uint32_t hs[64];
  int opened = 0;
  for (int i = 0; i < 64; i++)
    if (fs_ok(open_req(f, HUTCH_FS_O_READ, -1, &hs[i]), HUTCH_MSG_FS_RESULT)) opened++;
  is_int(opened, 64, "64 handles open");
  ok(fs_err(open_req(f, HUTCH_FS_O_READ, -1, &h), EMFILE), "the 65th: EMFILE");
  int closed = 0;
  for (int i = 0; i < 64; i++)
    if (fs_ok(handle_req(HUTCH_MSG_FS_CLOSE, hs[i], 0, NULL, 0), HUTCH_MSG_FS_RESULT)) closed++;
  is_int(closed, 64, "all closed");
  r = open_req(f, HUTCH_FS_O_READ, -1, &h);
  ok(fs_ok(r, HUTCH_MSG_FS_RESULT), "a handle can be opened again");
  ok(h != hs[0], "handles are not reused at once");
  handle_req(HUTCH_MSG_FS_CLOSE, h, 0, NULL, 0);
}

static void test_fs_list(void) {
  struct fsresp *r;
  static struct entry es[16];
  cleanup_free char *l = T("l");
  cleanup_free char *sub = T("l/sub/deeper");
  mkdir_p(sub, 0755, NULL);
  cleanup_free char *f1 = T("l/b.txt"), *f2 = T("l/a.txt"), *f3 = T("l/sub/c.txt"), *f4 = T("l/sub/deeper/x");
  put_file(f1, "bb", NULL);
  put_file(f2, "a", NULL);
  put_file(f3, "ccc", NULL);
  put_file(f4, "", NULL);
  cleanup_free char *ln = T("l/zlink"), *target = T("l/sub");
  symlink(target, ln);

  path_req(l);
  r = fs(HUTCH_MSG_FS_LIST, &req);
  size_t n = entries(r, es, 16);
  ok(fs_ok(r, HUTCH_MSG_FS_RESULT), "list, DEPTH absent (1)");
  is_int(n, 4, "4 entries at depth 1");
  ok(n == 4 && !strcmp(es[0].path, "a.txt") && !strcmp(es[1].path, "b.txt") && !strcmp(es[2].path, "sub") &&
         !strcmp(es[3].path, "zlink"),
     "sorted, PATH relative to the directory");
  ok(n == 4 && es[1].size == 2 && es[2].type == 2 && es[3].type == 3 && !strcmp(es[3].link, target),
     "sizes, types, the symlink's target");
  is_int(tlv_u32_or(r->payload.data, r->payload.len, HUTCH_TAG_FLAGS, 99), 0, "FLAGS 0: not truncated");

  hutch_tlv_put_u32(&req, HUTCH_TAG_DEPTH, 2);
  r = fs(HUTCH_MSG_FS_LIST, &req);
  n = entries(r, es, 16);
  is_int(n, 6, "depth 2: 6 entries (the symlinked dir is not followed)");
  ok(n == 6 && !strcmp(es[4].path, "sub/c.txt") && !strcmp(es[5].path, "sub/deeper"), "depth 2: breadth first");
  path_req(l);
  hutch_tlv_put_u32(&req, HUTCH_TAG_DEPTH, 10);
  n = entries(fs(HUTCH_MSG_FS_LIST, &req), es, 16);
  ok(n == 7 && !strcmp(es[6].path, "sub/deeper/x"), "depth 10: everything");
  path_req(l);
  hutch_tlv_put_u32(&req, HUTCH_TAG_DEPTH, 0);
  ok(fs_err(fs(HUTCH_MSG_FS_LIST, &req), EINVAL), "DEPTH 0: EINVAL");
  path_req(l);
  hutch_tlv_put_u32(&req, HUTCH_TAG_DEPTH, 11);
  ok(fs_err(fs(HUTCH_MSG_FS_LIST, &req), EINVAL), "DEPTH 11: EINVAL");
  ok(fs_err(fs(HUTCH_MSG_FS_LIST, path_req(f1)), ENOTDIR), "list of a file: ENOTDIR");
  n = entries(fs(HUTCH_MSG_FS_LIST, path_req(ln)), es, 16);
  is_int(n, 2, "list of a symlink to a directory lists the directory");

  /* Over 10000 entries: cut, and said so. */
  cleanup_free char *many = T("many");
  mkdir(many, 0755);
  bool made = true;
  for (int i = 0; i < 10001 && made; i++) {
    char name[64];
    snprintf(name, sizeof name, "%s/f%05d", many, i);
    int fd = open(name, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    made = fd >= 0;
    if (fd >= 0) close(fd);
  }
  r = fs(HUTCH_MSG_FS_LIST, path_req(many));
  n = entries(r, es, 16);
  ok(made && n == 10000, "10001 files: 10000 entries (%zu)", n);
  is_int(tlv_u32_or(r->payload.data, r->payload.len, HUTCH_TAG_FLAGS, 99), 1, "FLAGS 1: truncated");
  ok(r->payload.len <= HUTCH_FRAME_MAX, "the answer fits a frame (%zu bytes)", r->payload.len);
}

static void test_fs_move_remove(void) {
  struct entry e;
  struct fsresp *r;
  cleanup_free char *a = T("mv-a"), *b = T("mv-b"), *c = T("mv-c");
  put_file(a, "A", NULL);
  put_file(c, "C", NULL);
  ok(fs_ok(flags_req(HUTCH_MSG_FS_MOVE, a, b, 0), HUTCH_MSG_FS_RESULT), "move a -> b");
  ok(access(a, F_OK) < 0 && access(b, F_OK) == 0, "b exists, a does not");
  r = flags_req(HUTCH_MSG_FS_MOVE, b, c, 0);
  ok(fs_err(r, EEXIST), "move onto an existing file without overwrite: EEXIST (%s)", r->msg);
  ok(fs_ok(flags_req(HUTCH_MSG_FS_MOVE, b, c, 1), HUTCH_MSG_FS_RESULT), "... with overwrite");
  size_t n = 0;
  cleanup_free char *cc = read_file(c, 10, &n, NULL);
  ok(cc && n == 1 && cc[0] == 'A', "c has a's content");
  ok(fs_err(flags_req(HUTCH_MSG_FS_MOVE, a, b, 0), ENOENT), "move of a missing file: ENOENT");
  cleanup_free char *ln = T("mv-link"), *ln2 = T("mv-link2");
  symlink(c, ln);
  ok(fs_ok(flags_req(HUTCH_MSG_FS_MOVE, ln, ln2, 0), HUTCH_MSG_FS_RESULT), "move a symlink");
  struct stat st;
  ok(lstat(ln2, &st) == 0 && S_ISLNK(st.st_mode) && stat(c, &st) == 0, "the link moved, its target stayed");
  ok(fs_err(flags_req(HUTCH_MSG_FS_MOVE, "/", b, 0), EINVAL), "move of `/`: EINVAL");

  /* remove */
  ok(fs_ok(flags_req(HUTCH_MSG_FS_REMOVE, c, NULL, 0), HUTCH_MSG_FS_RESULT), "remove a file");
  ok(access(c, F_OK) < 0, "it is gone");
  ok(fs_err(flags_req(HUTCH_MSG_FS_REMOVE, c, NULL, 0), ENOENT), "remove again: ENOENT");
  cleanup_free char *outside = T("outside"), *keep = T("outside/keep");
  mkdir(outside, 0755);
  put_file(keep, "k", NULL);
  cleanup_free char *tree = T("tree/x/y"), *tf = T("tree/x/y/f"), *tl = T("tree/x/link");
  mkdir_p(tree, 0755, NULL);
  put_file(tf, "f", NULL);
  symlink(outside, tl);
  cleanup_free char *top = T("tree");
  r = flags_req(HUTCH_MSG_FS_REMOVE, top, NULL, 0);
  ok(fs_err(r, ENOTEMPTY), "remove a non-empty directory without recursive: ENOTEMPTY (%s)", r->msg);
  ok(fs_ok(flags_req(HUTCH_MSG_FS_REMOVE, top, NULL, 1), HUTCH_MSG_FS_RESULT), "recursive remove");
  ok(access(top, F_OK) < 0, "the tree is gone");
  ok(access(keep, F_OK) == 0, "the symlink inside was removed, not followed: its target's file is there");
  cleanup_free char *dl = T("dirlink");
  symlink(outside, dl);
  ok(fs_ok(flags_req(HUTCH_MSG_FS_REMOVE, dl, NULL, 1), HUTCH_MSG_FS_RESULT), "recursive remove of a symlink to a dir");
  ok(lstat(dl, &st) < 0 && access(keep, F_OK) == 0, "removed the link only");
  cleanup_free char *trailing = xasprintf("%s/", outside);
  ok(fs_ok(flags_req(HUTCH_MSG_FS_REMOVE, trailing, NULL, 1), HUTCH_MSG_FS_RESULT), "a trailing slash is fine");
  ok(access(outside, F_OK) < 0, "removed");
  cleanup_free char *empty = T("emptydir");
  mkdir(empty, 0755);
  ok(fs_ok(flags_req(HUTCH_MSG_FS_REMOVE, empty, NULL, 0), HUTCH_MSG_FS_RESULT), "an empty dir needs no recursive");
  ok(fs_err(flags_req(HUTCH_MSG_FS_REMOVE, "/", NULL, 1), EINVAL), "remove of `/`: EINVAL");

  /* Mount points: never crossed. */
  if (!have_mount) {
    ok(getenv("HUTCH_MUST_WORK") == NULL, "# SKIP no private tmpfs for the mount test");
    return;
  }
  cleanup_free char *m = T("m"), *mk = T("m/mnt/keep"), *mnt = T("m/mnt");
  r = flags_req(HUTCH_MSG_FS_REMOVE, m, NULL, 1);
  ok(fs_err(r, EBUSY), "recursive remove over a mount point: EBUSY (%s)", r->msg);
  ok(fs_ok(stat_path(mk, &e), HUTCH_MSG_FS_RESULT), "the file on the mount is still there");
  ok(fs_err(flags_req(HUTCH_MSG_FS_REMOVE, mnt, NULL, 1), EBUSY), "recursive remove of the mount point: EBUSY");
  ok(fs_err(flags_req(HUTCH_MSG_FS_REMOVE, mnt, NULL, 0), EBUSY), "rmdir of the mount point: EBUSY");
}

int main(void) {
  if (geteuid() != 0) skip_all("needs root (a pid namespace for init)");
  const char *init_path = find_init();
  if (!init_path) {
    if (getenv("HUTCH_MUST_WORK")) {
      ok(0, "build/hutch-init not found (make build/hutch-init)");
      return done_testing();
    }
    skip_all("build/hutch-init not found (make build/hutch-init)");
  }
  if (!mkdtemp(tmp)) skip_all("mkdtemp failed");
  signal(SIGPIPE, SIG_IGN);
  printf("# init %s, temp dir %s\n", init_path, tmp);
  if (start_init(init_path) < 0) {
    ok(0, "start init: %s", strerror(errno));
    return done_testing();
  }
  hutch_buf_init(&req);
  hutch_buf_init(&resp.payload);
  test_hello();
  int base_fds = init_fds();
  ok(base_fds >= 6, "init's fds counted: %d", base_fds);
  {
    /* Did the holder manage the private tmpfs?  Init sees keep, the host does not. */
    struct entry e;
    cleanup_free char *mk = T("m/mnt/keep");
    have_mount = access(mk, F_OK) < 0 && stat_path(mk, &e)->type == HUTCH_MSG_FS_RESULT;
  }
  test_spawn_basic();
  test_stdin();
  test_timeout_signal();
  test_pty();
  test_flow();
  test_fs_paths();
  test_fs_mkdir_stat();
  test_fs_io();
  test_fs_list();
  test_fs_move_remove();
  is_int(others, 0, "no stray frames");
  int nfd = init_fds();
  if (nfd != base_fds) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "ls -l /proc/%d/fd >&2", init_host_pid());
    (void)!system(cmd);
  }
  is_int(nfd, base_fds, "init holds as many fds as it started with: no leaks");
  ok(stop_init(), "init exits when its channel closes");
  hutch_err err = HUTCH_ERR_INIT;
  if (rm_rf(tmp, &err) < 0) printf("# cleanup: %s\n", err.msg);
  hutch_buf_free(&req);
  hutch_buf_free(&resp.payload);
  return done_testing();
}
