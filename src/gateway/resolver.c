/* hutch-gateway's own DNS client: A (or other) queries to --upstream-dns.
 *
 * Each query has its own UDP socket, connected to the resolver (so the
 * kernel drops datagrams from anywhere else and picks a random source
 * port), a random ID, and is retried once after RETRY_MS; an answer whose
 * ID or question differs from ours is ignored (dns.c checks), a truncated
 * one makes us ask again over TCP.  At most MAX_QUERIES at a time, each
 * finished or failed within QUERY_MS.  Callbacks run from the event loop,
 * never from inside gw_resolve. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "gateway.h"

#define MAX_QUERIES 512
#define RETRY_MS 2000
#define QUERY_MS 5000
#define TCP_ANSWER_MAX 16384

struct gw_query {
  struct gw_io io;
  char name[GW_DNS_NAME_MAX + 1];
  uint16_t qtype, id;
  uint8_t pkt[GW_DNS_HDR + GW_DNS_NAME_MAX + 2 + 4];
  size_t pktlen;
  bool tcp, tcp_connected;
  size_t tcp_sent;
  uint8_t *tcp_buf; /* 2 + TCP_ANSWER_MAX, TCP only */
  size_t tcp_have;
  uint64_t started, resent;
  gw_resolve_cb cb;
  void *arg;
  bool dead;
  size_t slot;
};

static struct gw_query *queries[MAX_QUERIES];
static size_t n_queries;

static void query_free(void *p) {
  struct gw_query *q = p;
  free(q->tcp_buf);
  free(q);
}

static void query_end(struct gw_query *q) {
  if (q->dead) return;
  q->dead = true;
  gw_io_close(&q->io);
  queries[q->slot] = queries[--n_queries];
  queries[q->slot]->slot = q->slot;
  gw_defer_free(query_free, q);
}

static void query_finish(struct gw_query *q, int status, const struct gw_dns_result *res, const char *why) {
  gw_resolve_cb cb = q->cb;
  void *arg = q->arg;
  query_end(q);
  if (cb) cb(arg, status, res, why);
}

static int new_id(struct gw_query *q) {
  if (hutch_random_bytes(&q->id, sizeof q->id) < 0) return -1;
  q->pktlen = gw_dns_build_query(q->id, q->name, q->qtype, q->pkt, sizeof q->pkt);
  return q->pktlen ? 0 : -1;
}

static int udp_open(struct gw_query *q) {
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (connect(fd, (struct sockaddr *)&G.cfg.upstream_dns, sizeof G.cfg.upstream_dns) < 0) {
    close(fd);
    return -1;
  }
  q->io.fd = fd;
  if (gw_io_add(&q->io, EPOLLIN) < 0) {
    close(fd);
    q->io.fd = -1;
    return -1;
  }
  return 0;
}

static int udp_send(struct gw_query *q) {
  ssize_t w = send(q->io.fd, q->pkt, q->pktlen, MSG_NOSIGNAL);
  return w == (ssize_t)q->pktlen ? 0 : -1;
}

struct gw_query *gw_resolve(const char *name, uint16_t qtype, gw_resolve_cb cb, void *arg, const char **why) {
  if (n_queries >= MAX_QUERIES) {
    *why = "too many DNS queries in flight";
    return NULL;
  }
  struct gw_query *q = xcalloc(1, sizeof *q);
  q->io = (struct gw_io){.kind = IO_RES, .fd = -1, .owner = q};
  snprintf(q->name, sizeof q->name, "%s", name);
  q->qtype = qtype;
  q->cb = cb;
  q->arg = arg;
  q->started = q->resent = gw_now();
  if (strlen(name) > GW_DNS_NAME_MAX || new_id(q) < 0) {
    free(q);
    *why = "name cannot be asked";
    return NULL;
  }
  if (udp_open(q) < 0 || udp_send(q) < 0) {
    *why = "cannot send the DNS query";
    if (q->io.fd >= 0) gw_io_close(&q->io);
    free(q);
    return NULL;
  }
  q->slot = n_queries;
  queries[n_queries++] = q;
  return q;
}

void gw_resolve_cancel(struct gw_query *q) {
  if (!q) return;
  q->cb = NULL;
  query_end(q);
}

static void to_tcp(struct gw_query *q) {
  gw_io_close(&q->io);
  q->tcp = true;
  if (new_id(q) < 0) {
    query_finish(q, -1, NULL, "cannot ask over TCP");
    return;
  }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    query_finish(q, -1, NULL, "cannot ask over TCP");
    return;
  }
  q->io.fd = fd;
  int r = connect(fd, (struct sockaddr *)&G.cfg.upstream_dns, sizeof G.cfg.upstream_dns);
  if ((r < 0 && errno != EINPROGRESS) || gw_io_add(&q->io, EPOLLOUT) < 0) {
    query_finish(q, -1, NULL, "cannot connect to the resolver over TCP");
    return;
  }
  q->tcp_buf = xmalloc(2 + TCP_ANSWER_MAX);
  q->tcp_have = 0;
  q->tcp_sent = 0;
}

static void answer(struct gw_query *q, const uint8_t *msg, size_t len) {
  struct gw_dns_result res;
  if (gw_dns_parse_answer(msg, len, q->id, q->name, q->qtype, &res) < 0) {
    hutch_log(LOG_DEBUG, "resolver.ignored", "name", q->name, "reason", res.why, NULL);
    if (q->tcp) query_finish(q, -1, NULL, res.why); /* over TCP nobody else can answer */
    return;
  }
  if (res.truncated) {
    if (q->tcp) {
      query_finish(q, -1, NULL, "truncated answer over TCP");
      return;
    }
    to_tcp(q);
    return;
  }
  query_finish(q, 0, &res, NULL);
}

static void tcp_event(struct gw_query *q, uint32_t ev) {
  if (!q->tcp_connected) {
    int e = 0;
    socklen_t el = sizeof e;
    if (getsockopt(q->io.fd, SOL_SOCKET, SO_ERROR, &e, &el) < 0 || e) {
      query_finish(q, -1, NULL, "cannot connect to the resolver over TCP");
      return;
    }
    q->tcp_connected = true;
  }
  if (q->tcp_sent < q->pktlen + 2) {
    uint8_t out[2 + sizeof q->pkt];
    out[0] = (uint8_t)(q->pktlen >> 8);
    out[1] = (uint8_t)q->pktlen;
    memcpy(out + 2, q->pkt, q->pktlen);
    ssize_t w = send(q->io.fd, out + q->tcp_sent, q->pktlen + 2 - q->tcp_sent, MSG_NOSIGNAL);
    if (w < 0 && errno != EAGAIN && errno != EINTR) {
      query_finish(q, -1, NULL, "cannot send to the resolver over TCP");
      return;
    }
    if (w > 0) q->tcp_sent += (size_t)w;
    gw_io_set(&q->io, q->tcp_sent < q->pktlen + 2 ? EPOLLOUT : EPOLLIN);
    return;
  }
  for (;;) {
    size_t need = 2;
    if (q->tcp_have >= 2) {
      need = 2 + (size_t)(q->tcp_buf[0] << 8 | q->tcp_buf[1]);
      if (need - 2 > TCP_ANSWER_MAX || need < 2 + GW_DNS_HDR) {
        query_finish(q, -1, NULL, "TCP answer too long or too short");
        return;
      }
    }
    if (q->tcp_have == need) {
      answer(q, q->tcp_buf + 2, need - 2);
      return;
    }
    ssize_t r = recv(q->io.fd, q->tcp_buf + q->tcp_have, need - q->tcp_have, 0);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (r <= 0) {
      query_finish(q, -1, NULL, "the resolver closed the TCP connection");
      return;
    }
    q->tcp_have += (size_t)r;
  }
}

void gw_resolver_event(struct gw_io *io, uint32_t ev) {
  struct gw_query *q = io->owner;
  if (q->dead) return;
  if (q->tcp) {
    tcp_event(q, ev);
    return;
  }
  for (int i = 0; i < 8 && !q->dead && !q->tcp; i++) {
    uint8_t buf[4096];
    ssize_t r = recv(q->io.fd, buf, sizeof buf, MSG_TRUNC);
    if (r < 0) {
      if (errno == EAGAIN || errno == EINTR) return;
      /* ICMP port unreachable and the like: keep waiting for the retry. */
      return;
    }
    if ((size_t)r > sizeof buf) continue;
    answer(q, buf, (size_t)r);
  }
}

void gw_resolver_tick(uint64_t now) {
  for (size_t i = 0; i < n_queries;) {
    struct gw_query *q = queries[i];
    if (now - q->started >= QUERY_MS) {
      query_finish(q, -1, NULL, "the resolver did not answer in time");
      continue; /* slot i now holds another query */
    }
    if (!q->tcp && now - q->resent >= RETRY_MS) {
      q->resent = now;
      (void)udp_send(q);
    }
    i++;
  }
}
