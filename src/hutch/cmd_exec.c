/* hutch exec | shell | attach | ps | kill: commands in a sandbox
 * (docs/api.md "Commands").
 *
 * exec starts a command (POST .../commands) and attaches to it
 * (GET .../commands/{cid}/attach, NDJSON): output is written as it arrives,
 * one event line at a time, so memory stays flat however long the stream.
 * Alongside the attach, in threads with their own connections:
 *   - stdin (-i): the CLI's stdin goes to POST .../stdin in chunks, then
 *     POST .../stdin?close=true at EOF;
 *   - control: SIGWINCH becomes POST .../resize (-t), SIGINT/SIGTERM/SIGHUP
 *     become POST .../signal; a third such signal gives up at once.
 * With -t and -i on a terminal, the terminal is raw: Ctrl-C, Ctrl-D and
 * Ctrl-Z are bytes for the remote side. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "args.h"
#include "cli.h"
#include "common/util.h"
#include "tty.h"
#include "wire.h"

#define STDIN_CHUNK (64 * 1024)
/* POST .../wait blocks at most an hour per call (docs/api.md). */
#define WAIT_QUERY "/wait?timeout_s=3600"
/* Signals forwarded to the command before the CLI gives up waiting. */
#define GIVE_UP_SIGNALS 3

static const char exec_usage[] =
    "usage: hutch exec [-i] [-t] [-d] [--env K=V]... [--cwd DIR] [--user U] [--timeout SECONDS]\n"
    "                  [--tag TAG] [--json] ID -- ARGV...\n"
    "       hutch exec [OPTIONS] --sh ID 'SHELL COMMAND'\n";
static const char exec_help[] =
    "usage: hutch exec [OPTIONS] ID -- ARGV...\n"
    "       hutch exec [OPTIONS] --sh ID 'SHELL COMMAND'\n"
    "Run a command in a sandbox, stream its output as it comes and exit with\n"
    "its status (128+N when signal N killed it, 124 when it timed out).\n"
    "Options go before the command.\n"
    "\n"
    "  -i, --interactive   forward stdin to the command (EOF closes its stdin)\n"
    "  -t, --tty           give the command a terminal of this terminal's size;\n"
    "                      with -i on a terminal, keys (Ctrl-C too) go to it raw\n"
    "  -d, --detach        start the command, print its id and attach token, and\n"
    "                      return (see `hutch attach`, `hutch ps`, `hutch kill`)\n"
    "  --env K=V           environment variable (repeatable)\n"
    "  --cwd DIR           working directory\n"
    "  -u, --user U        root, user (uid 1000) or UID[:GID]\n"
    "  --timeout SECONDS   kill the command's process group after this long\n"
    "                      (default: no timeout)\n"
    "  --tag TAG           a label of yours, shown by `hutch ps`\n"
    "  --sh                run one string with /bin/sh -c\n"
    "  --json              print the command object (exit status, times) when it\n"
    "                      ends instead of its output; with -d, the start reply\n"
    "\n"
    "SIGINT (Ctrl-C, except with -it on a terminal, where it is a key for the\n"
    "command), SIGTERM and SIGHUP are sent on to the command; the third gives\n"
    "up waiting and leaves the command running.\n";

static const char shell_usage[] =
    "usage: hutch shell [--env K=V]... [--cwd DIR] [--user U] [--tag TAG] ID [-- ARGV...]\n";
static const char shell_help[] =
    "usage: hutch shell [OPTIONS] ID [-- ARGV...]\n"
    "An interactive shell in a sandbox: `hutch exec -it ID -- /bin/bash -l`, or\n"
    "ARGV instead of bash.  Options as for exec.\n";

static const char attach_usage[] = "usage: hutch attach [--no-replay] [--json] ID CMD_ID\n";
static const char attach_help[] =
    "usage: hutch attach [--no-replay] [--json] ID CMD_ID\n"
    "Stream a command's output (first what is still buffered) until it exits,\n"
    "and exit with its status.  Ctrl-C detaches; the command keeps running.\n"
    "\n"
    "  --no-replay   skip the buffered output, show only what comes next\n"
    "  --json        print the attach events (NDJSON) as they arrive\n"
    "\n"
    "Over TCP, the attach token that `hutch exec -d` prints may stand in for the\n"
    "API key: hutch --url URL --api-key TOKEN attach ID CMD_ID.\n";

static const char ps_usage[] = "usage: hutch ps [--json] ID\n";
static const char ps_help[] =
    "usage: hutch ps [--json] ID\n"
    "List a sandbox's commands: running ones and the most recent finished ones.\n";

static const char kill_usage[] = "usage: hutch kill [-s SIGNAL] [--json] ID CMD_ID\n";
static const char kill_help[] =
    "usage: hutch kill [-s SIGNAL] [--json] ID CMD_ID\n"
    "Send a signal to a command's process group.\n"
    "\n"
    "  -s, --signal SIGNAL   a name (TERM, SIGKILL, ...) or a number (default TERM)\n";

/* ---- state shared with signal handlers and threads ----------------------- */

static int sig_pipe[2] = {-1, -1}; /* handler -> control thread */
static int wake_pipe[2] = {-1, -1}; /* main -> threads: stop */
static volatile sig_atomic_t stop_flag; /* aborts the threads' requests in flight */
static volatile sig_atomic_t forwarded_signals;
static char give_up_msg[512] = "hutch: interrupted\n";
static volatile sig_atomic_t give_up_len = 19;

static void on_signal(int sig) {
  int saved = errno;
  unsigned char b = (unsigned char)sig;
  ssize_t w = write(sig_pipe[1], &b, 1);
  (void)w;
  if (sig != SIGWINCH && ++forwarded_signals >= GIVE_UP_SIGNALS) {
    hutch_tty_restore();
    w = write(STDERR_FILENO, give_up_msg, (size_t)give_up_len);
    _exit(128 + sig);
  }
  errno = saved;
}

static void set_give_up_msg(const char *id, const char *cmd_id) {
  sigset_t all, old;
  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, &old);
  int n = snprintf(give_up_msg, sizeof give_up_msg,
                   "\r\nhutch: gave up waiting; command %s may still be running "
                   "(hutch kill -s KILL %s %s)\r\n",
                   cmd_id, id, cmd_id);
  give_up_len = n < 0 ? 0 : n >= (int)sizeof give_up_msg ? (int)sizeof give_up_msg - 1 : n;
  sigprocmask(SIG_SETMASK, &old, NULL);
}

static int install_signals(bool tty) {
  if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) < 0 || pipe2(wake_pipe, O_CLOEXEC) < 0) {
    hutch_errorf("pipe: %s", strerror(errno));
    return -1;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  if (tty) sigaction(SIGWINCH, &sa, NULL);
  return 0;
}

/* ---- commands ------------------------------------------------------------- */

/* "/v1/sandboxes/ID/commands/CID" + suffix */
static char *cmd_path(const char *id, const char *cmd_id, const char *suffix) {
  cleanup_free char *sb = hutch_id_path("/v1/sandboxes/", id, "/commands/");
  cleanup_free char *e = hutch_url_escape(cmd_id, NULL);
  return xasprintf("%s%s%s", sb, e, suffix ? suffix : "");
}

/* POST .../signal {"signal": name}, quietly (best effort) unless `loud`. */
static void send_signal(hutch_client *c, const char *id, const char *cmd_id, const char *name,
                        bool loud) {
  cleanup_free char *path = cmd_path(id, cmd_id, "/signal");
  json_t *body = json_pack("{s:s}", "signal", name);
  hutch_response r;
  hutch_err err = HUTCH_ERR_INIT;
  if (hutch_request(c, "POST", path, body, &r, &err) == 0) {
    if (hutch_response_check(&r, &err) < 0 && loud && r.status != 409)
      hutch_errorf("signal %s: %s", name, err.msg);
    hutch_response_free(&r);
  } else if (loud && strcmp(err.code, "interrupted") != 0) {
    hutch_errorf("signal %s: %s", name, err.msg);
  }
  json_decref(body);
}

/* ---- the attach stream ----------------------------------------------------- */

struct attach {
  hutch_lines lines;
  bool raw_events;  /* attach --json: copy the lines to stdout */
  json_t *exit_ev;  /* the exit event, once seen */
  bool stdout_gone; /* EPIPE on stdout */
  bool attached;    /* the first `attached` event was seen */
  long long lost[2]; /* bytes reported lost later (stdout, stderr) */
  unsigned char *dec;
  size_t dec_cap;
};

static int out_write(struct attach *at, int fd, const void *data, size_t n, hutch_err *err) {
  if (write_full(fd, data, n) == 0) return 0;
  if (errno == EPIPE && fd == STDOUT_FILENO) {
    at->stdout_gone = true;
    return hutch_err_set(err, 0, "epipe", "stdout closed");
  }
  return hutch_err_sys(err, errno, "write to %s", fd == STDOUT_FILENO ? "stdout" : "stderr");
}

static const char *const stream_names[] = {"stdout", "stderr"};

/* The first `attached` event counts what had left the ring buffer before
 * this client came; later ones (sent by hutchd when the command writes
 * faster than this client reads and the ring buffer overtakes it) count
 * bytes skipped since, summed up by note_lost at the end. */
static void note_dropped(struct attach *at, json_t *dropped) {
  for (size_t i = 0; i < 2; i++) {
    json_t *v = json_object_get(dropped, stream_names[i]);
    if (!json_is_integer(v) || json_integer_value(v) <= 0) continue;
    if (!at->attached)
      hutch_errorf("note: the first %lld bytes of %s were no longer buffered",
                   (long long)json_integer_value(v), stream_names[i]);
    else
      at->lost[i] += (long long)json_integer_value(v);
  }
  at->attached = true;
}

static void note_lost(const struct attach *at) {
  for (size_t i = 0; i < 2; i++)
    if (at->lost[i] > 0)
      hutch_errorf("note: %lld bytes of %s were lost: the command wrote faster than they were "
                   "read, and hutchd keeps a bounded buffer",
                   at->lost[i], stream_names[i]);
}

static int on_event(void *ctx, const char *line, size_t len, hutch_err *err) {
  struct attach *at = ctx;
  if (len == 0 || (len == 1 && line[0] == '\r')) return 0;
  if (at->raw_events) {
    if (out_write(at, STDOUT_FILENO, line, len, err) < 0) return -1;
    if (out_write(at, STDOUT_FILENO, "\n", 1, err) < 0) return -1;
  }
  json_error_t jerr;
  json_t *ev = json_loadb(line, len, 0, &jerr);
  if (!json_is_object(ev)) {
    json_decref(ev);
    return hutch_err_set(err, 0, "internal", "attach: an event from hutchd is not a JSON object: %s",
                         jerr.text);
  }
  const char *type = json_string_value(json_object_get(ev, "type"));
  int rc = 0;
  if (!type) {
    /* not ours to interpret */
  } else if (strcmp(type, "exit") == 0) {
    at->exit_ev = json_incref(ev);
    /* The stream ends after exit; do not wait for the server to close it. */
    rc = hutch_err_set(err, 0, "done", "exit");
  } else if (at->raw_events) {
    /* printed above */
  } else if (strcmp(type, "stdout") == 0 || strcmp(type, "stderr") == 0) {
    json_t *data = json_object_get(ev, "data");
    const char *b64 = json_string_value(data);
    size_t n = b64 ? json_string_length(data) : 0;
    if (n) {
      size_t need = hutch_b64_max_decoded(n);
      if (need > at->dec_cap) {
        at->dec = xrealloc(at->dec, need);
        at->dec_cap = need;
      }
      long m = hutch_b64_decode(b64, n, at->dec);
      if (m < 0)
        rc = hutch_err_set(err, 0, "internal", "attach: %s event with invalid base64 data", type);
      else
        rc = out_write(at, strcmp(type, "stdout") == 0 ? STDOUT_FILENO : STDERR_FILENO, at->dec,
                       (size_t)m, err);
    }
  } else if (strcmp(type, "attached") == 0) {
    note_dropped(at, json_object_get(ev, "dropped"));
  }
  json_decref(ev);
  return rc;
}

static int attach_sink(void *ctx, const char *data, size_t n, hutch_err *err) {
  struct attach *at = ctx;
  return hutch_lines_feed(&at->lines, data, n, on_event, at, err);
}

/* Streams GET .../attach until the exit event.  Returns 0 with *exit_ev set
 * (caller decrefs), 1 when stdout was closed (EPIPE), or -1 (printed). */
static int attach_stream(hutch_cli *cli, const char *id, const char *cmd_id, bool replay,
                         bool raw_events, json_t **exit_ev) {
  cleanup_free char *path = cmd_path(id, cmd_id, replay ? "/attach" : "/attach?replay=false");
  struct attach at = {.raw_events = raw_events};
  hutch_lines_init(&at.lines, HUTCH_MAX_EVENT_LINE);
  hutch_xfer x = {.method = "GET",
                  .path = path,
                  .sink = attach_sink,
                  .sink_ctx = &at,
                  .accept = "application/x-ndjson"};
  hutch_response r;
  hutch_err err = HUTCH_ERR_INIT;
  int rc = -1;
  int t = hutch_transfer(&cli->client, &x, &r, &err);
  if (t == 0) {
    if (hutch_response_check(&r, &err) < 0) {
      hutch_errorf("attach %s: %s", cmd_id, err.msg);
      hutch_response_free(&r);
      goto out;
    }
    hutch_response_free(&r);
    /* The stream ended: a last line may lack its '\n'. */
    if (hutch_lines_pending(&at.lines))
      t = on_event(&at, at.lines.buf, hutch_lines_pending(&at.lines), &err);
  }
  if (at.exit_ev) {
    *exit_ev = at.exit_ev;
    rc = 0;
  } else if (at.stdout_gone) {
    rc = 1;
  } else if (t < 0) {
    hutch_errorf("attach %s: %s", cmd_id, err.msg);
  } else {
    hutch_errorf("attach %s: the stream ended before the command exited (again: hutch attach %s %s)",
                 cmd_id, id, cmd_id);
  }
out:
  hutch_tty_restore(); /* before any note */
  note_lost(&at);
  hutch_lines_free(&at.lines);
  free(at.dec);
  return rc;
}

/* Notes on stderr about how a command ended. */
static void note_exit(json_t *ev) {
  json_t *sig = json_object_get(ev, "signal");
  const char *error = json_string_value(json_object_get(ev, "error"));
  if (error && *error) {
    cleanup_free char *e = hutch_display(json_object_get(ev, "error"));
    hutch_errorf("%s", e);
  }
  if (json_is_true(json_object_get(ev, "timed_out")))
    hutch_errorf("command timed out and was killed");
  else if (json_is_integer(sig) && json_integer_value(sig) > 0 && json_integer_value(sig) < 128)
    hutch_errorf("command killed by signal %lld (%s)", (long long)json_integer_value(sig),
                 strsignal((int)json_integer_value(sig)));
}

/* ---- threads: stdin and control ------------------------------------------ */

struct session {
  hutch_cli *cli;
  const char *id, *cmd_id;
  bool tty;
  hutch_client in_client, ctl_client;
  pthread_t in_thread, ctl_thread;
  bool in_started, ctl_started;
};

static bool stopping(void) {
  struct pollfd p = {.fd = wake_pipe[0], .events = POLLIN};
  return stop_flag || poll(&p, 1, 0) > 0;
}

/* POST .../stdin with `n` bytes (close: ?close=true).  Returns 0, 1 when
 * the command no longer takes input (409), -1 on another failure. */
static int post_stdin(struct session *s, const char *path, const char *data, size_t n) {
  hutch_xfer x = {.method = "POST", .path = path, .data = data, .len = n, .raw = true};
  hutch_response r;
  hutch_err err = HUTCH_ERR_INIT;
  if (hutch_transfer(&s->in_client, &x, &r, &err) < 0) {
    if (!stopping()) hutch_errorf("stdin: %s", err.msg);
    return -1;
  }
  int rc = 0;
  if (r.status == 409) {
    rc = 1;
  } else if (hutch_response_check(&r, &err) < 0) {
    if (!stopping()) hutch_errorf("stdin: %s", err.msg);
    rc = -1;
  }
  hutch_response_free(&r);
  return rc;
}

static void *stdin_main(void *arg) {
  struct session *s = arg;
  cleanup_free char *path = cmd_path(s->id, s->cmd_id, "/stdin");
  cleanup_free char *close_path = cmd_path(s->id, s->cmd_id, "/stdin?close=true");
  cleanup_free char *buf = xmalloc(STDIN_CHUNK);
  char last = '\n';
  for (;;) {
    struct pollfd p[2] = {{.fd = STDIN_FILENO, .events = POLLIN},
                          {.fd = wake_pipe[0], .events = POLLIN}};
    if (poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (p[1].revents) return NULL;
    ssize_t n = read(STDIN_FILENO, buf, STDIN_CHUNK);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) break; /* EOF, or stdin unreadable (EIO: the terminal is gone) */
    if (post_stdin(s, path, buf, (size_t)n) != 0) return NULL;
    last = buf[n - 1];
  }
  /* A terminal has no end of input: closing its stdin only stops writing.
   * Type the EOF character instead, twice after a partial line (the first
   * only hands the line over). */
  if (s->tty && post_stdin(s, path, "\x04\x04", last == '\n' ? 1 : 2) != 0) return NULL;
  post_stdin(s, close_path, NULL, 0);
  return NULL;
}

static void resize(struct session *s) {
  unsigned rows, cols;
  hutch_tty_size(&rows, &cols);
  cleanup_free char *path = cmd_path(s->id, s->cmd_id, "/resize");
  json_t *body = json_pack("{s:I,s:I}", "rows", (json_int_t)rows, "cols", (json_int_t)cols);
  hutch_response r;
  hutch_err err = HUTCH_ERR_INIT;
  if (hutch_request(&s->ctl_client, "POST", path, body, &r, &err) == 0) hutch_response_free(&r);
  json_decref(body);
}

static void *control_main(void *arg) {
  struct session *s = arg;
  for (;;) {
    struct pollfd p[2] = {{.fd = sig_pipe[0], .events = POLLIN},
                          {.fd = wake_pipe[0], .events = POLLIN}};
    if (poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return NULL;
    }
    if (p[1].revents) return NULL;
    unsigned char sigs[64];
    ssize_t n = read(sig_pipe[0], sigs, sizeof sigs);
    bool winch = false;
    for (ssize_t i = 0; i < n; i++) {
      switch (sigs[i]) {
        case SIGWINCH: winch = true; break;
        case SIGINT: send_signal(&s->ctl_client, s->id, s->cmd_id, "INT", true); break;
        case SIGTERM: send_signal(&s->ctl_client, s->id, s->cmd_id, "TERM", true); break;
        case SIGHUP: send_signal(&s->ctl_client, s->id, s->cmd_id, "HUP", true); break;
      }
    }
    if (winch && s->tty) resize(s);
  }
}

static int start_threads(struct session *s, bool interactive) {
  hutch_err err = HUTCH_ERR_INIT;
  if (hutch_client_dup(&s->cli->client, &s->ctl_client, &err) < 0) {
    hutch_errorf("%s", err.msg);
    return -1;
  }
  s->ctl_client.abort_flag = &stop_flag;
  if (pthread_create(&s->ctl_thread, NULL, control_main, s) != 0) {
    hutch_errorf("cannot start a thread");
    return -1;
  }
  s->ctl_started = true;
  if (!interactive) return 0;
  if (hutch_client_dup(&s->cli->client, &s->in_client, &err) < 0) {
    hutch_errorf("%s", err.msg);
    return -1;
  }
  s->in_client.abort_flag = &stop_flag;
  if (pthread_create(&s->in_thread, NULL, stdin_main, s) != 0) {
    hutch_errorf("cannot start a thread");
    return -1;
  }
  s->in_started = true;
  return 0;
}

/* Wakes the threads, abandons their requests (curl notices within about a
 * second) and joins them. */
static void stop_threads(struct session *s) {
  if (wake_pipe[1] >= 0) {
    char b = 1;
    ssize_t w = write(wake_pipe[1], &b, 1);
    (void)w;
  }
  if (s->in_started) {
    /* A POST of stdin may wait for the command to read; let a finished
     * command's last input and the close go out first. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 2;
    if (pthread_timedjoin_np(s->in_thread, NULL, &ts) != 0) {
      stop_flag = 1;
      pthread_join(s->in_thread, NULL);
    }
  }
  stop_flag = 1;
  if (s->ctl_started) pthread_join(s->ctl_thread, NULL);
  s->in_started = s->ctl_started = false;
  if (s->in_client.curl) hutch_client_free(&s->in_client);
  if (s->ctl_client.curl) hutch_client_free(&s->ctl_client);
}

/* ---- exec ---------------------------------------------------------------- */

/* exec --json: wait (POST .../wait, in slices) and print the final object. */
static int wait_and_print(hutch_cli *cli, const char *id, const char *cmd_id) {
  cleanup_free char *path = cmd_path(id, cmd_id, WAIT_QUERY);
  for (;;) {
    hutch_response r;
    if (hutch_call(cli, "POST", path, NULL, &r) < 0) return HUTCH_EXIT_FAIL;
    const char *state = json_string_value(json_object_get(r.json, "state"));
    if (!state) {
      hutch_errorf("wait %s: hutchd's reply has no state", cmd_id);
      hutch_response_free(&r);
      return HUTCH_EXIT_FAIL;
    }
    if (strcmp(state, "running") != 0) {
      hutch_print_body(&r);
      int rc = hutch_command_status(r.json);
      hutch_response_free(&r);
      return rc;
    }
    hutch_response_free(&r);
  }
}

static int run_command(hutch_cli *cli, hutch_exec_args *a) {
  bool json = cli->json || a->json;
  /* -it on a terminal: raw.  -t alone: only output processing is off, so
   * that Ctrl-C still interrupts (it is forwarded as SIGINT). */
  bool raw = a->tty && a->interactive && !json && isatty(STDIN_FILENO);
  bool raw_output = a->tty && !raw && !json && isatty(STDOUT_FILENO);
  if (a->tty) {
    unsigned rows, cols;
    hutch_tty_size(&rows, &cols);
    json_object_set_new(a->body, "pty",
                        json_pack("{s:I,s:I}", "rows", (json_int_t)rows, "cols", (json_int_t)cols));
  }
  /* A foreground exec is lossless: the command's output is paced by this
   * client (hutch exec ID -- cat big > out must copy every byte). */
  if (!a->detach) json_object_set_new(a->body, "lossless", json_true());
  /* Output to a closed pipe is an error to handle (and tell the command
   * about), not a silent death with the terminal left raw. */
  signal(SIGPIPE, SIG_IGN);
  if (!a->detach && install_signals(a->tty) < 0) return HUTCH_EXIT_FAIL;

  cleanup_free char *start_path = hutch_id_path("/v1/sandboxes/", a->id, "/commands");
  hutch_response r;
  if (hutch_call(cli, "POST", start_path, a->body, &r) < 0) return HUTCH_EXIT_FAIL;
  const char *cid = json_string_value(json_object_get(r.json, "id"));
  if (!cid || !*cid) {
    hutch_errorf("exec: hutchd's reply has no command id");
    hutch_response_free(&r);
    return HUTCH_EXIT_FAIL;
  }
  cleanup_free char *cmd_id = xstrdup(cid);
  if (a->detach) {
    if (json) {
      hutch_print_body(&r);
    } else {
      cleanup_free char *token = hutch_display(json_object_get(r.json, "attach_token"));
      printf("%s\n%s\n", cmd_id, token);
    }
    hutch_response_free(&r);
    return HUTCH_EXIT_OK;
  }
  hutch_response_free(&r);
  set_give_up_msg(a->id, cmd_id);

  struct session s = {.cli = cli, .id = a->id, .cmd_id = cmd_id, .tty = a->tty};
  int rc = HUTCH_EXIT_FAIL;
  if (start_threads(&s, a->interactive) < 0) {
    send_signal(&cli->client, a->id, cmd_id, "KILL", false);
    goto out;
  }
  if (raw)
    hutch_tty_raw(STDIN_FILENO, false);
  else if (raw_output)
    hutch_tty_raw(STDOUT_FILENO, true);

  if (json) {
    rc = wait_and_print(cli, a->id, cmd_id);
  } else {
    json_t *ev = NULL;
    int c = attach_stream(cli, a->id, cmd_id, true, false, &ev);
    hutch_tty_restore();
    if (c == 0) {
      note_exit(ev);
      rc = hutch_command_status(ev);
      json_decref(ev);
    } else if (c == 1) {
      /* Like a local pipeline: the producer learns that nobody reads. */
      send_signal(&cli->client, a->id, cmd_id, "PIPE", false);
      rc = 128 + SIGPIPE;
    }
  }
out:
  hutch_tty_restore();
  stop_threads(&s);
  return rc;
}

int hutch_cmd_exec(hutch_cli *cli, int argc, char **argv) {
  hutch_err err = HUTCH_ERR_INIT;
  hutch_exec_args a;
  int rc;
  if (hutch_parse_exec_args(argc, argv, &a, &err) < 0)
    rc = hutch_usage_fail(exec_usage, &err);
  else if (a.help)
    rc = hutch_print_help(exec_help);
  else
    rc = run_command(cli, &a);
  hutch_exec_args_free(&a);
  return rc;
}

int hutch_cmd_shell(hutch_cli *cli, int argc, char **argv) {
  hutch_err err = HUTCH_ERR_INIT;
  hutch_exec_args a;
  int rc;
  if (hutch_parse_shell_args(argc, argv, &a, &err) < 0)
    rc = hutch_usage_fail(shell_usage, &err);
  else if (a.help)
    rc = hutch_print_help(shell_help);
  else {
    a.json = false;
    cli->json = false; /* a shell is for a terminal */
    rc = run_command(cli, &a);
  }
  hutch_exec_args_free(&a);
  return rc;
}

/* ---- attach, ps, kill ------------------------------------------------------ */

int hutch_cmd_attach(hutch_cli *cli, int argc, char **argv) {
  hutch_err err = HUTCH_ERR_INIT;
  hutch_cmd_args a;
  int rc = HUTCH_EXIT_FAIL;
  if (hutch_parse_attach_args(argc, argv, &a, &err) < 0) {
    rc = hutch_usage_fail(attach_usage, &err);
  } else if (a.help) {
    rc = hutch_print_help(attach_help);
  } else {
    signal(SIGPIPE, SIG_IGN);
    json_t *ev = NULL;
    bool raw_events = cli->json || a.json;
    int c = attach_stream(cli, a.id, a.cmd_id, a.replay, raw_events, &ev);
    if (c == 0) {
      if (!raw_events) note_exit(ev);
      rc = hutch_command_status(ev);
      json_decref(ev);
    } else if (c == 1) {
      rc = 128 + SIGPIPE;
    }
  }
  hutch_cmd_args_free(&a);
  return rc;
}

/* EXIT column: the code, "sig N" (signal), "timeout"; "-" while running. */
static char *exit_cell(json_t *c) {
  json_t *code = json_object_get(c, "exit_code");
  json_t *sig = json_object_get(c, "signal");
  char *s;
  if (json_is_integer(code))
    s = xasprintf("%lld", (long long)json_integer_value(code));
  else if (json_is_integer(sig))
    s = xasprintf("sig %lld", (long long)json_integer_value(sig));
  else
    s = xstrdup("-");
  if (json_is_true(json_object_get(c, "timed_out"))) {
    char *t = xasprintf("%s (timeout)", s);
    free(s);
    s = t;
  }
  return s;
}

int hutch_cmd_ps(hutch_cli *cli, int argc, char **argv) {
  hutch_err err = HUTCH_ERR_INIT;
  hutch_ids_args a;
  char *path = NULL;
  int rc = HUTCH_EXIT_FAIL;
  if (hutch_parse_one_id_args("ps", argc, argv, &a, &err) < 0) {
    rc = hutch_usage_fail(ps_usage, &err);
    goto out;
  }
  if (a.help) {
    rc = hutch_print_help(ps_help);
    goto out;
  }
  path = hutch_id_path("/v1/sandboxes/", a.ids[0], "/commands");
  hutch_response r;
  if (hutch_call(cli, "GET", path, NULL, &r) < 0) goto out;
  json_t *list = json_object_get(r.json, "commands");
  if (cli->json || a.json) {
    hutch_print_body(&r);
    rc = HUTCH_EXIT_OK;
  } else if (!json_is_array(list)) {
    hutch_errorf("ps: hutchd's reply has no `commands` list");
  } else {
    static const char *const header[] = {"ID",  "PID",     "STATE",  "EXIT",
                                         "TAG", "STARTED", "COMMAND"};
    hutch_table t;
    hutch_table_init(&t, 7, header);
    size_t i;
    json_t *c;
    json_array_foreach(list, i, c) {
      char *row[7] = {
          hutch_display(json_object_get(c, "id")),
          hutch_display(json_object_get(c, "pid")),
          hutch_display(json_object_get(c, "state")),
          exit_cell(c),
          hutch_display(json_object_get(c, "tag")),
          hutch_display(json_object_get(c, "started_at")),
          hutch_argv_display(json_object_get(c, "argv")),
      };
      hutch_table_add(&t, row);
    }
    hutch_table_print(&t, stdout);
    hutch_table_free(&t);
    rc = HUTCH_EXIT_OK;
  }
  hutch_response_free(&r);
out:
  free(path);
  hutch_ids_args_free(&a);
  return rc;
}

int hutch_cmd_kill(hutch_cli *cli, int argc, char **argv) {
  hutch_err err = HUTCH_ERR_INIT;
  hutch_cmd_args a;
  int rc = HUTCH_EXIT_FAIL;
  if (hutch_parse_kill_args(argc, argv, &a, &err) < 0) {
    rc = hutch_usage_fail(kill_usage, &err);
  } else if (a.help) {
    rc = hutch_print_help(kill_help);
  } else {
    cleanup_free char *path = cmd_path(a.id, a.cmd_id, "/signal");
    hutch_response r;
    if (hutch_call(cli, "POST", path, a.body, &r) == 0) {
      if (cli->json || a.json) hutch_print_body(&r);
      hutch_response_free(&r);
      rc = HUTCH_EXIT_OK;
    }
  }
  hutch_cmd_args_free(&a);
  return rc;
}
