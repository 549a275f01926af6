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

#define MAX_CLIENTS 256
#define MAX_ROUTES 4096

struct client {
  int fd;
  struct hutch_frame_decoder dec;
};

struct route {
  bool used;
  uint32_t gid;  /* id on the init channel */
  int client;    /* index into clients[], -1 once the client left */
  uint32_t lid;  /* the client's id */
};

static struct client clients[MAX_CLIENTS];
static struct route routes[MAX_ROUTES];
static uint32_t next_gid = 1;
static struct hutch_sandbox_spec spec;
static const struct hutch_runtime_ops *rt;
static struct hutch_runtime_instance inst = {.init_pid = -1, .channel_fd = -1};
static const char *sock_path;

static void drop_client(int i) {
  if (clients[i].fd < 0) return;
  close(clients[i].fd);
  clients[i].fd = -1;
  hutch_decoder_free(&clients[i].dec);
  for (int r = 0; r < MAX_ROUTES; r++)
    if (routes[r].used && routes[r].client == i) routes[r].client = -1;
}

static void client_send(int i, uint16_t type, uint32_t id, const void *p, size_t n) {
  if (i < 0 || clients[i].fd < 0) return;
  hutch_err err = HUTCH_ERR_INIT;
  if (hutch_frame_write(clients[i].fd, type, id, p, n, &err) < 0) {
    hutch_log(LOG_WARN, "client.dropped", "reason", err.msg, NULL);
    drop_client(i);
  }
}

static void client_error(int i, uint32_t id, int errnum, const char *msg) {
  struct hutch_buf b;
  hutch_buf_init(&b);
  hutch_tlv_put_u32(&b, HUTCH_TAG_ERRNO, (uint32_t)errnum);
  hutch_tlv_put_str(&b, HUTCH_TAG_MESSAGE, msg);
  client_send(i, HUTCH_MSG_ERROR, id, b.data, b.len);
  hutch_buf_free(&b);
}

static struct route *route_by_gid(uint32_t gid) {
  for (int r = 0; r < MAX_ROUTES; r++)
    if (routes[r].used && routes[r].gid == gid) return &routes[r];
  return NULL;
}

static struct route *route_by_client(int client, uint32_t lid) {
  for (int r = 0; r < MAX_ROUTES; r++)
    if (routes[r].used && routes[r].client == client && routes[r].lid == lid) return &routes[r];
  return NULL;
}

static void init_send(uint16_t type, uint32_t id, const void *p, size_t n) {
  hutch_err err = HUTCH_ERR_INIT;
  if (hutch_frame_write(inst.channel_fd, type, id, p, n, &err) < 0)
    hutch_log(LOG_ERROR, "channel.write_failed", "reason", err.msg, NULL);
}

static __attribute__((noreturn)) void shutdown_and_exit(int code, int ack_client) {
  hutch_err err = HUTCH_ERR_INIT;
  if (inst.init_pid > 0) {
    kill(inst.init_pid, SIGKILL);
    waitpid(inst.init_pid, NULL, 0);
  }
  if (rt && rt->destroy(&spec, &err) < 0) hutch_log(LOG_ERROR, "shim.destroy_failed", "reason", err.msg, NULL);
  if (sock_path) unlink(sock_path);
  hutch_log(LOG_INFO, "shim.exit", "id", spec.id, NULL);
  if (ack_client >= 0) client_send(ack_client, HUTCH_MSG_SHUTDOWN, 0, NULL, 0);
  exit(code);
}

static void handle_client_frame(int ci, const struct hutch_frame_hdr *h, const unsigned char *p) {
  struct route *r;
  switch (h->type) {
    case HUTCH_MSG_SPAWN: {
      if (route_by_client(ci, h->id)) {
        client_error(ci, h->id, EEXIST, "command id already in use on this connection");
        return;
      }
      int slot = -1;
      for (int i = 0; i < MAX_ROUTES; i++)
        if (!routes[i].used) {
          slot = i;
          break;
        }
      if (slot < 0) {
        client_error(ci, h->id, EAGAIN, "too many commands in flight");
        return;
      }
      routes[slot] = (struct route){.used = true, .gid = next_gid++, .client = ci, .lid = h->id};
      if (next_gid == 0) next_gid = 1;
      init_send(HUTCH_MSG_SPAWN, routes[slot].gid, p, h->len);
      return;
    }
    case HUTCH_MSG_STDIN:
    case HUTCH_MSG_STDIN_CLOSE:
    case HUTCH_MSG_SIGNAL:
      if (!(r = route_by_client(ci, h->id))) {
        client_error(ci, h->id, ESRCH, "no such command");
        return;
      }
      init_send(h->type, r->gid, p, h->len);
      return;
    case HUTCH_MSG_PING: client_send(ci, HUTCH_MSG_PONG, h->id, NULL, 0); return;
    case HUTCH_MSG_INFO: {
      struct hutch_buf b;
      hutch_buf_init(&b);
      hutch_tlv_put_u32(&b, HUTCH_TAG_INIT_PID, (uint32_t)inst.init_pid);
      hutch_tlv_put_u32(&b, HUTCH_TAG_SHIM_PID, (uint32_t)getpid());
      client_send(ci, HUTCH_MSG_INFO, h->id, b.data, b.len);
      hutch_buf_free(&b);
      return;
    }
    case HUTCH_MSG_SHUTDOWN: shutdown_and_exit(0, ci);
    default: client_error(ci, h->id, EPROTO, "unexpected frame type"); return;
  }
}

static void handle_init_frame(const struct hutch_frame_hdr *h, const unsigned char *p) {
  if (h->type == HUTCH_MSG_PONG || h->type == HUTCH_MSG_HELLO) return;
  struct route *r = route_by_gid(h->id);
  if (!r) {
    if (h->type == HUTCH_MSG_ERROR) hutch_log(LOG_WARN, "init.error", "id", spec.id, NULL);
    return;
  }
  client_send(r->client, h->type, r->lid, p, h->len);
  if (h->type == HUTCH_MSG_EXIT || (h->type == HUTCH_MSG_ERROR && r)) {
    /* ERROR on a command id ends it only if it never started; an ERROR about
     * stdin of a running command keeps the route. */
    if (h->type == HUTCH_MSG_EXIT) r->used = false;
    else {
      struct hutch_tlv_iter it;
      uint8_t tag;
      const unsigned char *v;
      uint32_t vl, e = 0;
      hutch_tlv_iter_init(&it, p, h->len);
      while (hutch_tlv_next(&it, &tag, &v, &vl) == 1)
        if (tag == HUTCH_TAG_ERRNO) hutch_tlv_u32(v, vl, &e);
      if (e != EPIPE && e != ENOBUFS) r->used = false;
    }
  }
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
  static const struct option opts[] = {
      {"config", required_argument, NULL, 'c'},
      {"socket", required_argument, NULL, 's'},
      {"ready-fd", required_argument, NULL, 'r'},
      {NULL, 0, NULL, 0},
  };
  int o;
  while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    if (o == 'c') config = optarg;
    else if (o == 's') sock_path = optarg;
    else if (o == 'r') ready_fd = atoi(optarg);
    else return 2;
  }
  if (!config || !sock_path) {
    fprintf(stderr, "usage: hutch-shim --config FILE --socket PATH [--ready-fd N]\n");
    return 2;
  }
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
  rt = hutch_runtime_get(spec.runtime);
  if (!rt) {
    report_ready(ready_fd, "error unknown runtime `%s`\n", spec.runtime);
    return 1;
  }
  /* Signals blocked above stay blocked in the sandbox's child until
   * hutch-init installs its own mask; init resets them for commands. */
  if (rt->start(&spec, &inst, &err) < 0) {
    hutch_log(LOG_ERROR, "sandbox.start_failed", "id", spec.id, "reason", err.msg, NULL);
    report_ready(ready_fd, "error %s\n", err.msg);
    return 1;
  }
  int lfd = listen_socket(sock_path, &err);
  if (lfd < 0) {
    report_ready(ready_fd, "error %s\n", err.msg);
    shutdown_and_exit(1, -1);
  }
  int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) {
    hutch_err_sys(&err, errno, "signalfd");
    report_ready(ready_fd, "error %s\n", err.msg);
    shutdown_and_exit(1, -1);
  }
  {
    char pidbuf[32];
    snprintf(pidbuf, sizeof pidbuf, "%d", (int)inst.init_pid);
    hutch_log(LOG_INFO, "sandbox.started", "id", spec.id, "init_pid", pidbuf, NULL);
  }
  report_ready(ready_fd, "ok %ld %ld\n", (long)inst.init_pid, (long)getpid());
  ready_fd = -1;

  for (int i = 0; i < MAX_CLIENTS; i++) clients[i].fd = -1;
  struct hutch_frame_decoder idec;
  hutch_decoder_init(&idec);
  static unsigned char buf[65536];
  struct pollfd pfd[3 + MAX_CLIENTS];
  for (;;) {
    size_t n = 0;
    pfd[n++] = (struct pollfd){.fd = sfd, .events = POLLIN};
    pfd[n++] = (struct pollfd){.fd = inst.channel_fd, .events = POLLIN};
    pfd[n++] = (struct pollfd){.fd = lfd, .events = POLLIN};
    for (int i = 0; i < MAX_CLIENTS; i++) pfd[n++] = (struct pollfd){.fd = clients[i].fd, .events = POLLIN};
    if (poll(pfd, n, -1) < 0) {
      if (errno == EINTR) continue;
      hutch_log(LOG_ERROR, "shim.poll_failed", NULL);
      shutdown_and_exit(1, -1);
    }
    if (pfd[0].revents & POLLIN) {
      struct signalfd_siginfo si;
      while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
        if (si.ssi_signo == SIGCHLD) {
          int st;
          pid_t p;
          while ((p = waitpid(-1, &st, WNOHANG)) > 0) {
            if (p == inst.init_pid) {
              hutch_log(LOG_ERROR, "sandbox.init_died", "id", spec.id, NULL);
              inst.init_pid = -1;
              shutdown_and_exit(1, -1);
            }
          }
        } else {
          shutdown_and_exit(0, -1);
        }
      }
    }
    if (pfd[1].revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t r = read(inst.channel_fd, buf, sizeof buf);
      if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) {
        hutch_log(LOG_ERROR, "channel.closed", "id", spec.id, NULL);
        shutdown_and_exit(1, -1);
      }
      if (r > 0) {
        hutch_decoder_feed(&idec, buf, (size_t)r);
        struct hutch_frame_hdr h;
        const unsigned char *p;
        int pr;
        while ((pr = hutch_decoder_pop(&idec, &h, &p, &err)) == 1) {
          handle_init_frame(&h, p);
          hutch_decoder_consume(&idec, &h);
        }
        if (pr < 0) {
          hutch_log(LOG_ERROR, "channel.protocol_error", "reason", err.msg, NULL);
          shutdown_and_exit(1, -1);
        }
      }
    }
    if (pfd[2].revents & POLLIN) {
      int cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
      if (cfd >= 0) {
        int slot = -1;
        for (int i = 0; i < MAX_CLIENTS; i++)
          if (clients[i].fd < 0) {
            slot = i;
            break;
          }
        if (slot < 0) {
          close(cfd);
        } else {
          struct timeval tv = {.tv_sec = 5};
          setsockopt(cfd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
          clients[slot].fd = cfd;
          hutch_decoder_init(&clients[slot].dec);
        }
      }
    }
    for (int i = 0; i < MAX_CLIENTS; i++) {
      if (clients[i].fd < 0 || !(pfd[3 + i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t r = read(clients[i].fd, buf, sizeof buf);
      if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) {
        drop_client(i);
        continue;
      }
      if (r < 0) continue;
      hutch_decoder_feed(&clients[i].dec, buf, (size_t)r);
      struct hutch_frame_hdr h;
      const unsigned char *p;
      int pr = 0;
      while (clients[i].fd >= 0 && (pr = hutch_decoder_pop(&clients[i].dec, &h, &p, &err)) == 1) {
        handle_client_frame(i, &h, p);
        if (clients[i].fd >= 0) hutch_decoder_consume(&clients[i].dec, &h);
      }
      if (clients[i].fd >= 0 && pr < 0) drop_client(i);
    }
  }
}
