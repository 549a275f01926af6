#include "agent/shim_client.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/proto.h"
#include "common/util.h"

int hutch_shim_launch(const struct hutch_shim_launch *l, pid_t *shim_pid, pid_t *init_pid, hutch_err *err) {
  int pfd[2];
  if (pipe2(pfd, O_CLOEXEC) < 0) return hutch_err_sys(err, errno, "pipe");
  cleanup_close int logfd = open(l->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (logfd < 0) {
    close(pfd[0]);
    close(pfd[1]);
    return hutch_err_sys(err, errno, "open shim log `%s`", l->log_path);
  }
  /* Everything the child needs is prepared before fork: after it, only
   * async-signal-safe calls (hutchd is multi-threaded). */
  char ring[32];
  snprintf(ring, sizeof ring, "%zu", l->output_buffer ? l->output_buffer : (size_t)1 << 20);
  char *const argv[] = {(char *)"hutch-shim", (char *)"--config",       (char *)l->config_path,
                        (char *)"--socket",   (char *)l->socket_path,  (char *)"--ready-fd",
                        (char *)"3",          (char *)"--output-buffer", ring,
                        NULL};
  const char *fault = getenv("HUTCH_FAULT");
  char fault_env[256];
  snprintf(fault_env, sizeof fault_env, "HUTCH_FAULT=%s", fault ? fault : "");
  const char *dbg = getenv("HUTCH_RUNSC_DEBUG");
  char dbg_env[64];
  snprintf(dbg_env, sizeof dbg_env, "HUTCH_RUNSC_DEBUG=%s", dbg ? dbg : "");
  char *envp[4] = {(char *)"PATH=/usr/sbin:/usr/bin:/sbin:/bin", NULL, NULL, NULL};
  size_t ne = 1;
  if (fault) envp[ne++] = fault_env;
  if (dbg) envp[ne++] = dbg_env;
  /* posix_spawn (vfork + exec) is far cheaper than forking hutchd twice.
   * The shim gets its own session; hutchd ignores SIGCHLD (main.c) so the
   * kernel reaps a shim that exits while hutchd lives, and a shim outlives
   * hutchd like any orphan. */
  cleanup_close int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  posix_spawn_file_actions_adddup2(&fa, devnull, 0);
  posix_spawn_file_actions_adddup2(&fa, logfd, 1);
  posix_spawn_file_actions_adddup2(&fa, logfd, 2);
  posix_spawn_file_actions_adddup2(&fa, pfd[1], 3);
  pid_t child;
  int se = devnull < 0 ? errno : posix_spawn(&child, l->shim_path, &fa, &attr, argv, envp);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  close(pfd[1]);
  if (se != 0) {
    close(pfd[0]);
    return hutch_err_sys(err, se, "start hutch-shim `%s`", l->shim_path);
  }
  char line[HUTCH_ERR_MSG_MAX + 64];
  size_t len = 0;
  uint64_t deadline = mono_us() + (uint64_t)l->timeout_ms * 1000u;
  for (;;) {
    uint64_t now = mono_us();
    if (now >= deadline) {
      close(pfd[0]);
      return hutch_err_sys(err, ETIMEDOUT, "waiting for hutch-shim to report ready");
    }
    struct pollfd p = {.fd = pfd[0], .events = POLLIN};
    int r = poll(&p, 1, (int)((deadline - now) / 1000) + 1);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    ssize_t n = read(pfd[0], line + len, sizeof line - 1 - len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || len + (size_t)n >= sizeof line - 1) {
      if (n > 0) len += (size_t)n;
      break;
    }
    len += (size_t)n;
  }
  close(pfd[0]);
  line[len] = 0;
  char *nl = strchr(line, '\n');
  if (nl) *nl = 0;
  long ipid = 0, spid = 0;
  if (sscanf(line, "ok %ld %ld", &ipid, &spid) == 2 && ipid > 0 && spid > 0) {
    *init_pid = (pid_t)ipid;
    *shim_pid = (pid_t)spid;
    return 0;
  }
  if (!strncmp(line, "error ", 6)) return hutch_err_sys(err, 0, "hutch-shim: %s", line + 6);
  return hutch_err_sys(err, 0, "hutch-shim exited without reporting ready (see `%s`)", l->log_path);
}

int hutch_shim_connect(const char *socket_path, hutch_err *err) {
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  if (strlen(socket_path) >= sizeof a.sun_path)
    return hutch_err_sys(err, ENAMETOOLONG, "shim socket path `%s`", socket_path);
  strcpy(a.sun_path, socket_path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return hutch_err_sys(err, errno, "socket");
  if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
    int e = errno;
    close(fd);
    hutch_err_sys(err, e, "connect to shim `%s`", socket_path);
    err->status = 503;
    snprintf(err->code, sizeof err->code, "unavailable");
    return -1;
  }
  return fd;
}

static void set_timeouts(int fd, int seconds) {
  struct timeval tv = {.tv_sec = seconds};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

int hutch_shim_shutdown(const char *socket_path, hutch_err *err) {
  cleanup_close int fd = hutch_shim_connect(socket_path, err);
  if (fd < 0) return -1;
  set_timeouts(fd, 15);
  if (hutch_frame_write(fd, HUTCH_MSG_SHUTDOWN, 0, NULL, 0, err) < 0) return hutch_err_wrap(err, "shutdown shim");
  struct hutch_frame_hdr h;
  struct hutch_buf b;
  hutch_buf_init(&b);
  int r;
  /* The ack, or EOF when the shim exits: both mean it is done. */
  while ((r = hutch_frame_read(fd, &h, &b, err)) == 1 && h.type != HUTCH_MSG_SHUTDOWN) {
  }
  hutch_buf_free(&b);
  if (r < 0) return hutch_err_wrap(err, "wait for shim shutdown");
  return 0;
}

bool hutch_shim_alive(const char *socket_path) {
  hutch_err err = HUTCH_ERR_INIT;
  cleanup_close int fd = hutch_shim_connect(socket_path, &err);
  if (fd < 0) return false;
  set_timeouts(fd, 5);
  if (hutch_frame_write(fd, HUTCH_MSG_PING, 0, NULL, 0, &err) < 0) return false;
  struct hutch_frame_hdr h;
  struct hutch_buf b;
  hutch_buf_init(&b);
  int r = hutch_frame_read(fd, &h, &b, &err);
  hutch_buf_free(&b);
  return r == 1 && h.type == HUTCH_MSG_PONG;
}

void hutch_exec_result_free(struct hutch_exec_result *r) {
  free(r->out);
  free(r->errb);
  free(r->spawn_error);
  memset(r, 0, sizeof *r);
}

static void capture(struct hutch_buf *dst, const unsigned char *p, size_t n, size_t cap, bool *truncated) {
  if (dst->len >= cap) {
    if (n) *truncated = true;
    return;
  }
  size_t take = n < cap - dst->len ? n : cap - dst->len;
  if (take < n) *truncated = true;
  hutch_buf_append(dst, p, take);
}

static char *buf_to_str(struct hutch_buf *b, size_t *len) {
  hutch_buf_append(b, "", 1);
  *len = b->len - 1;
  char *s = (char *)b->data;
  b->data = NULL;
  b->len = b->cap = 0;
  return s;
}

int hutch_shim_conn_open(struct hutch_shim_conn *c, const char *socket_path, int timeout_s, hutch_err *err) {
  memset(c, 0, sizeof *c);
  c->next_id = 1;
  hutch_buf_init(&c->payload);
  c->fd = hutch_shim_connect(socket_path, err);
  if (c->fd < 0) return -1;
  if (timeout_s > 0) set_timeouts(c->fd, timeout_s);
  return 0;
}

void hutch_shim_conn_close(struct hutch_shim_conn *c) {
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
  hutch_buf_free(&c->payload);
}

uint32_t hutch_shim_conn_send(struct hutch_shim_conn *c, uint16_t type, const void *p, size_t n, hutch_err *err) {
  uint32_t id = c->next_id++;
  if (hutch_frame_write(c->fd, type, id, p, n, err) < 0) {
    err->status = 503;
    snprintf(err->code, sizeof err->code, "unavailable");
    return 0;
  }
  return id;
}

int hutch_shim_conn_read(struct hutch_shim_conn *c, struct hutch_frame_hdr *h, hutch_err *err) {
  int r = hutch_frame_read(c->fd, h, &c->payload, err);
  if (r == 0) hutch_err_set(err, 503, "unavailable", "the sandbox's shim closed the connection (sandbox stopped?)");
  else if (r < 0 && err->errnum == EAGAIN)
    hutch_err_set(err, 503, "unavailable", "the sandbox did not answer in time");
  else if (r < 0) { /* reset or broken: the sandbox went away under us */
    err->status = 503;
    snprintf(err->code, sizeof err->code, "unavailable");
  }
  return r;
}

int hutch_shim_error(const void *payload, size_t len, hutch_err *err) {
  uint32_t en = 0;
  hutch_tlv_find_u32(payload, len, HUTCH_TAG_ERRNO, &en);
  cleanup_free char *msg = hutch_tlv_find_str(payload, len, HUTCH_TAG_MESSAGE);
  int status = 500;
  const char *code = "internal";
  switch (en) {
    case ENOENT:
    case ESRCH: status = 404, code = "not_found"; break;
    case EINVAL:
    case ENAMETOOLONG:
    case ELOOP:
    case EXDEV: status = 400, code = "invalid_argument"; break;
    case EEXIST:
    case ENOTEMPTY:
    case EISDIR:
    case ENOTDIR:
    case EPIPE:  /* the command has finished, or its stdin is closed */
    case ENOTTY: /* a terminal call on a command without one */
    case EBUSY: status = 409, code = "conflict"; break;
    case EACCES:
    case EPERM:
    case EROFS: status = 403, code = "forbidden"; break;
    case ENOSPC:
    case EDQUOT: status = 507, code = "insufficient_storage"; break;
    case EAGAIN:
    case EMFILE: status = 503, code = "unavailable"; break;
    default: break;
  }
  hutch_err_set(err, status, code, "%s", msg ? msg : strerror((int)en));
  err->errnum = (int)en;
  return -1;
}

int hutch_shim_conn_call(struct hutch_shim_conn *c, uint16_t type, const void *p, size_t n, struct hutch_frame_hdr *h,
                         hutch_err *err) {
  uint32_t id = hutch_shim_conn_send(c, type, p, n, err);
  if (!id) return -1;
  for (;;) {
    if (hutch_shim_conn_read(c, h, err) <= 0) return -1;
    if (h->id != id) continue;
    if (h->type == HUTCH_MSG_ERROR) return hutch_shim_error(c->payload.data, c->payload.len, err);
    return 0;
  }
}

int hutch_shim_exec(const char *socket_path, const struct hutch_exec_req *req, struct hutch_exec_result *res,
                    hutch_err *err) {
  memset(res, 0, sizeof *res);
  uint64_t t0 = mono_us();
  struct hutch_shim_conn c;
  if (hutch_shim_conn_open(&c, socket_path, 0, err) < 0) return -1;
  /* Sends must not hang forever if the shim wedges. */
  struct timeval stv = {.tv_sec = 30};
  setsockopt(c.fd, SOL_SOCKET, SO_SNDTIMEO, &stv, sizeof stv);
  struct hutch_buf b;
  hutch_buf_init(&b);
  /* FLOW: the command's output is paced by this reader, so nothing is lost
   * between the command and the caps below; ATTACH: stream it here. */
  hutch_spawn_encode(&b, req->argv, req->envp, req->cwd, req->timeout_ms, 0, 0,
                     HUTCH_SPAWN_FLOW | HUTCH_SPAWN_ATTACH | (req->stdin_data ? HUTCH_SPAWN_STDIN : 0));
  hutch_tlv_put_str(&b, HUTCH_TAG_NAME, req->name);
  uint32_t spawn_id = hutch_shim_conn_send(&c, HUTCH_MSG_SPAWN, b.data, b.len, err);
  hutch_buf_free(&b);
  if (!spawn_id) {
    hutch_shim_conn_close(&c);
    return hutch_err_wrap(err, "send command to shim");
  }
  int ret = 0;
  if (req->stdin_data) {
    /* Bounded by the request body limit, well under init's stdin queue. */
    const unsigned char *p = req->stdin_data;
    size_t left = req->stdin_len;
    while (left > 0 && ret == 0) {
      size_t chunk = left > 65536 ? 65536 : left;
      hutch_buf_init(&b);
      hutch_tlv_put_str(&b, HUTCH_TAG_NAME, req->name);
      hutch_tlv_put(&b, HUTCH_TAG_DATA, p, (uint32_t)chunk);
      if (!hutch_shim_conn_send(&c, HUTCH_MSG_STDIN, b.data, b.len, err)) ret = hutch_err_wrap(err, "send stdin");
      hutch_buf_free(&b);
      p += chunk;
      left -= chunk;
    }
    hutch_buf_init(&b);
    hutch_tlv_put_str(&b, HUTCH_TAG_NAME, req->name);
    if (ret == 0 && !hutch_shim_conn_send(&c, HUTCH_MSG_STDIN_CLOSE, b.data, b.len, err))
      ret = hutch_err_wrap(err, "close stdin");
    hutch_buf_free(&b);
  }
  struct hutch_buf out, errb;
  hutch_buf_init(&out);
  hutch_buf_init(&errb);
  uint64_t limit_ms = req->timeout_ms ? (uint64_t)req->timeout_ms + 30000 : 0;
  while (ret == 0) {
    if (limit_ms) {
      uint64_t elapsed = (mono_us() - t0) / 1000;
      if (elapsed >= limit_ms) {
        ret = hutch_err_sys(err, ETIMEDOUT, "no exit report from the sandbox");
        break;
      }
      struct pollfd p = {.fd = c.fd, .events = POLLIN};
      int pr = poll(&p, 1, (int)(limit_ms - elapsed));
      if (pr < 0 && errno == EINTR) continue;
      if (pr == 0) continue;
    }
    struct hutch_frame_hdr h;
    if (hutch_shim_conn_read(&c, &h, err) <= 0) {
      ret = hutch_err_wrap(err, "read from shim");
      break;
    }
    if (h.id != spawn_id) continue; /* stdin acknowledgements */
    const unsigned char *pd = c.payload.data;
    size_t pl = c.payload.len;
    if (h.type == HUTCH_MSG_STARTED) {
      res->started = true;
    } else if (h.type == HUTCH_MSG_ATTACHED) {
      uint64_t d = 0;
      const unsigned char *v;
      uint32_t vl;
      if ((hutch_tlv_find(pd, pl, HUTCH_TAG_DROPPED_OUT, &v, &vl) == 1 && hutch_tlv_u64(v, vl, &d) == 0 && d) ||
          (hutch_tlv_find(pd, pl, HUTCH_TAG_DROPPED_ERR, &v, &vl) == 1 && hutch_tlv_u64(v, vl, &d) == 0 && d))
        res->truncated = true;
    } else if (h.type == HUTCH_MSG_STDOUT) {
      capture(&out, pd, pl, req->max_output, &res->truncated);
    } else if (h.type == HUTCH_MSG_STDERR) {
      capture(&errb, pd, pl, req->max_output, &res->truncated);
    } else if (h.type == HUTCH_MSG_EXIT) {
      struct hutch_exit e;
      hutch_exit_decode(pd, pl, &e);
      res->signo = e.signo;
      res->exit_code = e.exit_code;
      res->timed_out = e.timed_out;
      break;
    } else if (h.type == HUTCH_MSG_ERROR) {
      uint32_t en = 0;
      hutch_tlv_find_u32(pd, pl, HUTCH_TAG_ERRNO, &en);
      if (res->started) continue;
      res->spawn_errno = (int)en;
      res->spawn_error = hutch_tlv_find_str(pd, pl, HUTCH_TAG_MESSAGE);
      if (!res->spawn_error) res->spawn_error = xstrdup("the command could not start");
      if (en == EEXIST || en == EINVAL || en == EAGAIN) {
        ret = hutch_shim_error(pd, pl, err);
        break;
      }
      res->exit_code = en == ENOENT ? 127 : 126;
      break;
    }
  }
  res->out = buf_to_str(&out, &res->out_len);
  res->errb = buf_to_str(&errb, &res->err_len);
  hutch_shim_conn_close(&c);
  res->duration_us = mono_us() - t0;
  return ret;
}
