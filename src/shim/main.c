/* hutch-shim: one per sandbox, detached from hutchd (own session), so that a
 * hutchd crash or upgrade never kills a sandbox.
 *
 * It starts the sandbox through its runtime, owns the byte channel to
 * hutch-init, and serves hutchd's connections on a unix socket (mode 0600),
 * multiplexing every client's commands onto the one channel: each client
 * numbers its own commands; the shim maps them to channel-wide ids.
 *
 *   hutch-shim --config FILE --socket PATH [--ready-fd N]
 *
 * Readiness is reported on --ready-fd as one line, "ok <init_pid>" or
 * "error <message>", then the fd is closed.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/proto.h"
#include "common/log.h"
#include "common/util.h"
#include "runtime/runtime.h"
#include "shim.h"

static struct hutch_sandbox_spec spec;
static struct hutch_runtime_instance inst = {.init_pid = -1, .channel_fd = -1};
static struct shim_config cfg = {.spec = &spec, .inst = &inst, .listen_fd = -1, .signal_fd = -1};

void shim_shutdown_and_exit(struct shim_config *c, int code) {
  hutch_err err = HUTCH_ERR_INIT;
  if (c->inst->init_pid > 0) {
    kill(c->inst->init_pid, SIGKILL);
    waitpid(c->inst->init_pid, NULL, 0);
    c->inst->init_pid = -1;
  }
  if (c->rt && c->rt->destroy(c->spec, &err) < 0)
    hutch_log(LOG_ERROR, "shim.destroy_failed", "reason", err.msg, NULL);
  if (c->sock_path) unlink(c->sock_path);
  hutch_log(LOG_INFO, "shim.exit", "id", c->spec->id ? c->spec->id : "", NULL);
  exit(code);
}

static int listen_socket(const char *path, hutch_err *err) {
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof a.sun_path) return hutch_err_sys(err, ENAMETOOLONG, "socket path `%s`", path);
  strcpy(a.sun_path, path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return hutch_err_sys(err, errno, "socket");
  unlink(path);
  mode_t old = umask(0177);
  int r = bind(fd, (struct sockaddr *)&a, sizeof a);
  umask(old);
  if (r < 0 || listen(fd, 64) < 0) {
    int e = errno;
    close(fd);
    return hutch_err_sys(err, e, "listen on `%s`", path);
  }
  return fd;
}

static void report_ready(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void report_ready(int fd, const char *fmt, ...) {
  if (fd < 0) return;
  char line[HUTCH_ERR_MSG_MAX + 64];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (n > 0) (void)!write_full(fd, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
  close(fd);
}

int main(int argc, char **argv) {
  const char *config = NULL;
  int ready_fd = -1;
  uint64_t ring = 1u << 20;
  static const struct option opts[] = {
      {"config", required_argument, NULL, 'c'},
      {"socket", required_argument, NULL, 's'},
      {"ready-fd", required_argument, NULL, 'r'},
      {"output-buffer", required_argument, NULL, 'o'},
      {NULL, 0, NULL, 0},
  };
  int o;
  while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    if (o == 'c') config = optarg;
    else if (o == 's') cfg.sock_path = optarg;
    else if (o == 'r') ready_fd = atoi(optarg);
    else if (o == 'o') {
      if (parse_u64(optarg, 1u << 30, &ring) < 0 || ring < 4096) return 2;
    } else return 2;
  }
  if (!config || !cfg.sock_path) {
    fprintf(stderr, "usage: hutch-shim --config FILE --socket PATH [--ready-fd N] [--output-buffer BYTES]\n");
    return 2;
  }
  cfg.ring_bytes = (size_t)ring;
  if (ready_fd >= 0) set_cloexec(ready_fd);
  hutch_log_set_component("shim");
  signal(SIGPIPE, SIG_IGN);
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGHUP);
  sigprocmask(SIG_BLOCK, &mask, NULL);

  hutch_err err = HUTCH_ERR_INIT;
  cleanup_free char *text = read_file(config, 1 << 20, NULL, &err);
  if (!text || hutch_spec_from_json(text, &spec, &err) < 0) {
    hutch_err_wrap(&err, "read config `%s`", config);
    report_ready(ready_fd, "error %s\n", err.msg);
    return 1;
  }
  cfg.rt = hutch_runtime_get(spec.runtime);
  if (!cfg.rt) {
    report_ready(ready_fd, "error unknown runtime `%s`\n", spec.runtime);
    return 1;
  }
  /* Signals blocked above stay blocked in the sandbox's child until
   * hutch-init installs its own mask; init resets them for commands. */
  if (cfg.rt->start(&spec, &inst, &err) < 0) {
    hutch_log(LOG_ERROR, "sandbox.start_failed", "id", spec.id, "reason", err.msg, NULL);
    report_ready(ready_fd, "error %s\n", err.msg);
    return 1;
  }
  cfg.listen_fd = listen_socket(cfg.sock_path, &err);
  if (cfg.listen_fd < 0) {
    report_ready(ready_fd, "error %s\n", err.msg);
    shim_shutdown_and_exit(&cfg, 1);
  }
  cfg.signal_fd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  if (cfg.signal_fd < 0) {
    hutch_err_sys(&err, errno, "signalfd");
    report_ready(ready_fd, "error %s\n", err.msg);
    shim_shutdown_and_exit(&cfg, 1);
  }
  {
    char pidbuf[32];
    snprintf(pidbuf, sizeof pidbuf, "%d", (int)inst.init_pid);
    hutch_log(LOG_INFO, "sandbox.started", "id", spec.id, "init_pid", pidbuf, NULL);
  }
  report_ready(ready_fd, "ok %ld %ld\n", (long)inst.init_pid, (long)getpid());
  shim_serve(&cfg);
}
