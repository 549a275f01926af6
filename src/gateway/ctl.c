/* hutch-gateway's control socket: JSON lines from hutchd (control.h).
 *
 * A unix socket of mode 0600; a client must also be root or the gateway's
 * own user (SO_PEERCRED).  At most MAX_CTL clients, each line at most
 * GW_CTL_LINE_MAX bytes (a longer one is answered with an error and the
 * client is dropped), answers in order. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "gateway.h"

#define MAX_CTL 8
#define OUT_MAX (64u << 20)

struct ctl {
  struct gw_io io;
  char *in;
  size_t in_len;
  char *out;
  size_t out_len, out_off, out_cap;
  bool closing; /* close once the output is out */
  bool dead;
};

static struct gw_io listen_io = {.kind = IO_CTL_LISTEN, .fd = -1};
static struct ctl *ctls[MAX_CTL];
static char *sock_path;

int gw_ctl_init(hutch_err *err) {
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  if (strlen(G.cfg.control) >= sizeof a.sun_path) return hutch_err_invalid(err, "--control: path too long");
  strcpy(a.sun_path, G.cfg.control);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return hutch_err_sys(err, errno, "socket");
  struct stat st;
  if (lstat(G.cfg.control, &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      close(fd);
      return hutch_err_sys(err, EEXIST, "`%s` exists and is not a socket", G.cfg.control);
    }
    unlink(G.cfg.control);
  }
  mode_t old = umask(0177);
  int r = bind(fd, (struct sockaddr *)&a, sizeof a);
  umask(old);
  if (r < 0 || chmod(G.cfg.control, 0600) < 0 || listen(fd, 16) < 0) {
    int e = errno;
    close(fd);
    return hutch_err_sys(err, e, "listen on `%s`", G.cfg.control);
  }
  listen_io.fd = fd;
  sock_path = xstrdup(G.cfg.control);
  if (gw_io_add(&listen_io, EPOLLIN) < 0) return hutch_err_sys(err, errno, "epoll");
  return 0;
}

void gw_ctl_cleanup(void) {
  if (sock_path) unlink(sock_path);
}

static void ctl_free(void *p) {
  struct ctl *c = p;
  free(c->in);
  free(c->out);
  free(c);
}

static void ctl_close(struct ctl *c) {
  if (c->dead) return;
  c->dead = true;
  gw_io_close(&c->io);
  for (size_t i = 0; i < MAX_CTL; i++)
    if (ctls[i] == c) ctls[i] = NULL;
  gw_defer_free(ctl_free, c);
}

static void ctl_queue(struct ctl *c, const char *s) {
  size_t n = strlen(s);
  if (c->out_len - c->out_off + n > OUT_MAX) {
    hutch_log(LOG_WARN, "control.dropped", "reason", "answers not read", NULL);
    ctl_close(c);
    return;
  }
  if (c->out_off && c->out_off == c->out_len) c->out_off = c->out_len = 0;
  if (c->out_len + n > c->out_cap) {
    if (c->out_off) {
      memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
      c->out_len -= c->out_off;
      c->out_off = 0;
    }
    if (c->out_len + n > c->out_cap) {
      c->out_cap = c->out_len + n + 4096;
      c->out = xrealloc(c->out, c->out_cap);
    }
  }
  memcpy(c->out + c->out_len, s, n);
  c->out_len += n;
}

static void ctl_line(struct ctl *c, const char *line, size_t n) {
  struct gw_ctl_effect eff;
  char *ans = gw_ctl_handle(&G.table, line, n, &eff);
  if (eff.addr_gone) gw_conn_kill_src(&eff.gone);
  if (eff.changed) {
    char cnt[32];
    snprintf(cnt, sizeof cnt, "%zu", G.table.n);
    hutch_log(LOG_INFO, "control.changed", "sandboxes", cnt, NULL);
  }
  ctl_queue(c, ans);
  free(ans);
}

static void ctl_event(struct ctl *c, uint32_t ev) {
  /* write */
  while (c->out_off < c->out_len) {
    ssize_t w = send(c->io.fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EAGAIN || errno == EINTR) break;
      ctl_close(c);
      return;
    }
    c->out_off += (size_t)w;
  }
  if (c->closing && c->out_off == c->out_len) {
    ctl_close(c);
    return;
  }
  /* read, unless answers pile up */
  if (!c->closing && c->out_len - c->out_off < (1u << 20)) {
    for (;;) {
      size_t room = GW_CTL_LINE_MAX + 1 - c->in_len;
      ssize_t r = recv(c->io.fd, c->in + c->in_len, room, 0);
      if (r < 0) {
        if (errno == EAGAIN || errno == EINTR) break;
        ctl_close(c);
        return;
      }
      if (r == 0) {
        c->closing = true;
        break;
      }
      c->in_len += (size_t)r;
      size_t start = 0;
      for (;;) {
        char *nl = memchr(c->in + start, '\n', c->in_len - start);
        if (!nl) break;
        size_t n = (size_t)(nl - (c->in + start));
        if (n && c->in[start + n - 1] == '\r') n--;
        if (n) ctl_line(c, c->in + start, n);
        if (c->dead) return;
        start = (size_t)(nl - c->in) + 1;
      }
      memmove(c->in, c->in + start, c->in_len - start);
      c->in_len -= start;
      if (c->in_len > GW_CTL_LINE_MAX) {
        ctl_queue(c, "{\"ok\":false,\"error\":\"line too long\"}\n");
        c->closing = true;
        break;
      }
      if (c->out_len - c->out_off >= (1u << 20)) break;
    }
  }
  if (c->dead) return;
  if (c->closing && c->out_off == c->out_len) {
    ctl_close(c);
    return;
  }
  uint32_t want = c->out_off < c->out_len ? EPOLLOUT : 0;
  if (!c->closing && c->out_len - c->out_off < (1u << 20)) want |= EPOLLIN;
  gw_io_set(&c->io, want);
}

static void ctl_accept(void) {
  for (;;) {
    int fd = accept4(listen_io.fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) gw_listener_pause(&listen_io);
      return;
    }
    struct ucred cr;
    socklen_t cl = sizeof cr;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) < 0 || (cr.uid != 0 && cr.uid != geteuid())) {
      hutch_log(LOG_WARN, "control.refused", "reason", "peer is neither root nor the gateway's user", NULL);
      close(fd);
      continue;
    }
    size_t slot = MAX_CTL;
    for (size_t i = 0; i < MAX_CTL; i++)
      if (!ctls[i]) {
        slot = i;
        break;
      }
    if (slot == MAX_CTL) {
      close(fd);
      continue;
    }
    struct ctl *c = xcalloc(1, sizeof *c);
    c->io = (struct gw_io){.kind = IO_CTL, .fd = fd, .owner = c};
    c->in = xmalloc(GW_CTL_LINE_MAX + 1);
    if (gw_io_add(&c->io, EPOLLIN) < 0) {
      close(fd);
      free(c->in);
      free(c);
      continue;
    }
    ctls[slot] = c;
  }
}

void gw_ctl_event(struct gw_io *io, uint32_t ev) {
  if (io->kind == IO_CTL_LISTEN) {
    ctl_accept();
    return;
  }
  struct ctl *c = io->owner;
  if (!c->dead) ctl_event(c, ev);
}
