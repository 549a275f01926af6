/* hutch-gateway's DNS responder (UDP and TCP on the dns port).
 *
 * The source address names the sandbox (unknown: REFUSED).  A query is
 * parsed strictly (dns.h); malformed: FORMERR, a response or a runt:
 * dropped.  A name the policy denies on every port: REFUSED, and it is
 * never sent upstream.  An allowed name: A queries are resolved through
 * the gateway's own resolver and answered with the addresses that pass
 * the address check (hutch_addr_blocked) on at least one port, TTL at most
 * 30 s; when none passes the answer is REFUSED (the name is allowed, its
 * addresses are not: the same answer as for a denied name).  Upstream
 * NXDOMAIN is passed on; an upstream failure is SERVFAIL.  Other types for
 * an allowed name (AAAA included): an empty NOERROR answer.  Every answered
 * query is audited (proto "dns"). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "gateway.h"

#define MAX_PENDING 256
#define MAX_TCP 64
#define TCP_IDLE_MS 10000

struct dns_tcp;

struct dns_req {
  bool used;
  struct gw_query *q;
  struct dns_tcp *tc;          /* TCP: the connection to answer on; NULL for UDP */
  struct sockaddr_in peer;     /* UDP */
  struct in_pktinfo pi;        /* UDP: where the query arrived, to answer from there */
  bool have_pi;
  uint8_t query[GW_DNS_QUERY_MAX];
  size_t len;
  struct gw_dns_query pq;
  struct hutch_ip src;
  char rule[HUTCH_RULE_TEXT_MAX];
  const char *why; /* why the name was allowed */
};

struct dns_tcp {
  struct gw_io io;
  uint8_t in[2 + GW_DNS_QUERY_MAX];
  size_t have;
  uint8_t out[2 + GW_DNS_UDP_MAX];
  size_t out_len, out_off;
  struct dns_req *req; /* the query being answered */
  uint64_t deadline;
  bool dead;
};

static struct gw_io udp_io = {.kind = IO_DNS_UDP, .fd = -1};
static struct gw_io tcp_listen_io = {.kind = IO_DNS_TCP_LISTEN, .fd = -1};
static struct dns_req reqs[MAX_PENDING];
static struct dns_tcp *tcps[MAX_TCP];

int gw_dnsd_init(hutch_err *err) {
  udp_io.fd = gw_listen_udp(G.cfg.port_dns, err);
  if (udp_io.fd < 0) return -1;
  int one = 1;
  if (setsockopt(udp_io.fd, IPPROTO_IP, IP_PKTINFO, &one, sizeof one) < 0)
    return hutch_err_sys(err, errno, "IP_PKTINFO");
  tcp_listen_io.fd = gw_listen_tcp(G.cfg.port_dns, err);
  if (tcp_listen_io.fd < 0) return -1;
  if (gw_io_add(&udp_io, EPOLLIN) < 0 || gw_io_add(&tcp_listen_io, EPOLLIN) < 0)
    return hutch_err_sys(err, errno, "epoll");
  return 0;
}

/* ---- answering ---- */

static void tcp_close(struct dns_tcp *t);

static void req_release(struct dns_req *r) {
  if (r->q) gw_resolve_cancel(r->q);
  if (r->tc) r->tc->req = NULL;
  memset(r, 0, sizeof *r);
}

static void send_answer(struct dns_req *r, const uint8_t *buf, size_t n) {
  if (n == 0) return;
  if (r->tc) {
    struct dns_tcp *t = r->tc;
    if (n > GW_DNS_UDP_MAX) return;
    t->out[0] = (uint8_t)(n >> 8);
    t->out[1] = (uint8_t)n;
    memcpy(t->out + 2, buf, n);
    t->out_len = n + 2;
    t->out_off = 0;
    gw_io_set(&t->io, EPOLLOUT);
    return;
  }
  struct iovec iov = {.iov_base = (void *)buf, .iov_len = n};
  union {
    char b[CMSG_SPACE(sizeof(struct in_pktinfo))];
    struct cmsghdr align;
  } cm;
  struct msghdr mh = {.msg_name = &r->peer, .msg_namelen = sizeof r->peer, .msg_iov = &iov, .msg_iovlen = 1};
  if (r->have_pi) {
    memset(&cm, 0, sizeof cm);
    mh.msg_control = cm.b;
    mh.msg_controllen = sizeof cm.b;
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = IPPROTO_IP;
    c->cmsg_type = IP_PKTINFO;
    c->cmsg_len = CMSG_LEN(sizeof(struct in_pktinfo));
    struct in_pktinfo pi = {.ipi_ifindex = 0, .ipi_spec_dst = r->pi.ipi_addr};
    memcpy(CMSG_DATA(c), &pi, sizeof pi);
  }
  if (sendmsg(udp_io.fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
    hutch_log(LOG_DEBUG, "dns.send_failed", "reason", strerror(errno), NULL);
}

static void respond(struct dns_req *r, int rcode, const uint8_t (*addrs)[4], size_t n, uint32_t ttl) {
  uint8_t out[GW_DNS_UDP_MAX];
  size_t len = gw_dns_build_answer(r->query, &r->pq, rcode, addrs, n, ttl, out, sizeof out);
  send_answer(r, out, len);
}

static void audit_dns(struct dns_req *r, const char *sandbox, const char *decision, const char *rule,
                      const char *reason, const char *addrs) {
  struct gw_audit_rec a = {.sandbox = sandbox,
                           .proto = "dns",
                           .name = r->pq.name[0] ? r->pq.name : NULL,
                           .addr = addrs,
                           .decision = decision,
                           .rule = rule,
                           .reason = reason};
  (void)gw_audit(&a);
}

static const char *rcode_name(int rc) {
  switch (rc) {
  case GW_DNS_NOERROR: return "NOERROR";
  case GW_DNS_FORMERR: return "FORMERR";
  case GW_DNS_SERVFAIL: return "SERVFAIL";
  case GW_DNS_NXDOMAIN: return "NXDOMAIN";
  case GW_DNS_NOTIMP: return "NOTIMP";
  default: return "REFUSED";
  }
}

static void resolved(void *arg, int status, const struct gw_dns_result *res, const char *why) {
  struct dns_req *r = arg;
  r->q = NULL;
  const struct gw_sandbox *sb = gw_lookup(&r->src);
  if (!sb) { /* removed while we asked */
    respond(r, GW_DNS_REFUSED, NULL, 0, 0);
    audit_dns(r, NULL, "denied", NULL, "unknown source", NULL);
    req_release(r);
    return;
  }
  if (status < 0 || (res->rcode != GW_DNS_NOERROR && res->rcode != GW_DNS_NXDOMAIN)) {
    respond(r, GW_DNS_SERVFAIL, NULL, 0, 0);
    char reason[160];
    snprintf(reason, sizeof reason, "upstream: %s", status < 0 ? why : rcode_name(res->rcode));
    audit_dns(r, sb->id, "error", r->rule[0] ? r->rule : NULL, reason, NULL);
    req_release(r);
    return;
  }
  if (res->rcode == GW_DNS_NXDOMAIN) {
    respond(r, GW_DNS_NXDOMAIN, NULL, 0, 0);
    audit_dns(r, sb->id, "allowed", r->rule[0] ? r->rule : NULL, "NXDOMAIN", NULL);
    req_release(r);
    return;
  }
  uint8_t keep[GW_DNS_MAX_ADDRS][4];
  size_t n = 0;
  char list[GW_DNS_MAX_ADDRS * 17] = "";
  struct hutch_verdict first_block = {0};
  bool blocked_any = false;
  for (size_t i = 0; i < res->n; i++) {
    struct hutch_ip ip;
    hutch_ip_from_bytes(AF_INET, res->addr[i], &ip);
    struct hutch_verdict v;
    if (!gw_addr_ok_any_port(sb->policy, &ip, &v)) {
      if (!blocked_any) first_block = v;
      blocked_any = true;
      continue;
    }
    memcpy(keep[n++], res->addr[i], 4);
    char t[HUTCH_IP_TEXT_MAX];
    hutch_ip_to_text(&ip, t);
    if (list[0]) strcat(list, ",");
    strcat(list, t);
  }
  if (n == 0 && blocked_any) {
    respond(r, GW_DNS_REFUSED, NULL, 0, 0);
    char reason[160];
    snprintf(reason, sizeof reason, "every address blocked: %s", first_block.why ? first_block.why : "blocked");
    audit_dns(r, sb->id, "denied", first_block.rule ? first_block.rule->text : NULL, reason, NULL);
    req_release(r);
    return;
  }
  respond(r, GW_DNS_NOERROR, keep, n, res->ttl);
  audit_dns(r, sb->id, "allowed", r->rule[0] ? r->rule : NULL, n ? r->why : "no A records", list[0] ? list : NULL);
  req_release(r);
}

/* Decide one query; the request r holds it (and is released here unless a
 * resolution is pending). */
static void handle(struct dns_req *r) {
  enum gw_dns_parse pr = gw_dns_parse_query(r->query, r->len, &r->pq);
  const struct gw_sandbox *sb = gw_lookup(&r->src);
  if (pr == GW_DNS_QUERY_DROP) {
    req_release(r);
    return;
  }
  if (pr != GW_DNS_QUERY_OK) {
    int rc = pr == GW_DNS_QUERY_NOTIMP ? GW_DNS_NOTIMP : GW_DNS_FORMERR;
    respond(r, rc, NULL, 0, 0);
    audit_dns(r, sb ? sb->id : NULL, "denied", NULL, r->pq.why, NULL);
    req_release(r);
    return;
  }
  if (!sb) {
    respond(r, GW_DNS_REFUSED, NULL, 0, 0);
    audit_dns(r, NULL, "denied", NULL, "unknown source", NULL);
    req_release(r);
    return;
  }
  struct hutch_host h;
  const char *why = NULL;
  struct hutch_verdict v = {0};
  bool ok = r->pq.name_ok && hutch_host_parse(r->pq.name, strlen(r->pq.name), &h, &why) == 0;
  if (ok && h.kind != HUTCH_HOST_NAME) ok = false, why = "an IP address is not a name to look up";
  if (!ok) {
    respond(r, GW_DNS_REFUSED, NULL, 0, 0);
    audit_dns(r, sb->id, "denied", NULL, why ? why : "invalid name", NULL);
    req_release(r);
    return;
  }
  if (!gw_name_allowed_any_port(sb->policy, h.text, &v)) {
    respond(r, GW_DNS_REFUSED, NULL, 0, 0);
    audit_dns(r, sb->id, "denied", v.rule ? v.rule->text : NULL, v.why, NULL);
    req_release(r);
    return;
  }
  snprintf(r->rule, sizeof r->rule, "%s", v.rule ? v.rule->text : "");
  r->why = v.why ? v.why : "allowed";
  if (r->pq.qtype != GW_DNS_TYPE_A) {
    respond(r, GW_DNS_NOERROR, NULL, 0, 0);
    audit_dns(r, sb->id, "allowed", r->rule[0] ? r->rule : NULL, "not an A query: empty answer", NULL);
    req_release(r);
    return;
  }
  r->q = gw_resolve(h.text, GW_DNS_TYPE_A, resolved, r, &why);
  if (!r->q) {
    respond(r, GW_DNS_SERVFAIL, NULL, 0, 0);
    audit_dns(r, sb->id, "error", r->rule[0] ? r->rule : NULL, why, NULL);
    req_release(r);
  }
}

static struct dns_req *req_new(void) {
  for (size_t i = 0; i < MAX_PENDING; i++)
    if (!reqs[i].used) {
      memset(&reqs[i], 0, sizeof reqs[i]);
      reqs[i].used = true;
      return &reqs[i];
    }
  return NULL;
}

/* A request slot, or an immediate SERVFAIL when all are in use. */
static struct dns_req overflow;

static void udp_read(void) {
  for (int i = 0; i < 64; i++) {
    struct dns_req *r = req_new();
    bool full = !r;
    if (full) {
      r = &overflow;
      memset(r, 0, sizeof *r);
    }
    union {
      char b[CMSG_SPACE(sizeof(struct in_pktinfo))];
      struct cmsghdr align;
    } cm;
    struct iovec iov = {.iov_base = r->query, .iov_len = sizeof r->query};
    struct msghdr mh = {.msg_name = &r->peer,
                        .msg_namelen = sizeof r->peer,
                        .msg_iov = &iov,
                        .msg_iovlen = 1,
                        .msg_control = cm.b,
                        .msg_controllen = sizeof cm.b};
    ssize_t n = recvmsg(udp_io.fd, &mh, MSG_DONTWAIT | MSG_TRUNC | MSG_CMSG_CLOEXEC);
    if (n < 0) {
      memset(r, 0, sizeof *r);
      return;
    }
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
      if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
        memcpy(&r->pi, CMSG_DATA(c), sizeof r->pi);
        r->have_pi = true;
      }
    if (mh.msg_namelen < sizeof(struct sockaddr_in) || r->peer.sin_family != AF_INET ||
        (size_t)n > sizeof r->query) {
      memset(r, 0, sizeof *r); /* an oversized datagram: dropped */
      continue;
    }
    r->len = (size_t)n;
    hutch_ip_from_bytes(AF_INET, &r->peer.sin_addr, &r->src);
    if (full) {
      if (gw_dns_parse_query(r->query, r->len, &r->pq) != GW_DNS_QUERY_DROP) respond(r, GW_DNS_SERVFAIL, NULL, 0, 0);
      memset(r, 0, sizeof *r);
      continue;
    }
    handle(r);
  }
}

/* ---- TCP ---- */

static void tcp_free(void *p) { free(p); }

static void tcp_close(struct dns_tcp *t) {
  if (t->dead) return;
  t->dead = true;
  if (t->req) req_release(t->req);
  gw_io_close(&t->io);
  for (size_t i = 0; i < MAX_TCP; i++)
    if (tcps[i] == t) tcps[i] = NULL;
  gw_defer_free(tcp_free, t);
}

static void tcp_accept(void) {
  for (int i = 0; i < 16; i++) {
    struct sockaddr_in peer;
    socklen_t pl = sizeof peer;
    int fd = accept4(tcp_listen_io.fd, (struct sockaddr *)&peer, &pl, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) gw_listener_pause(&tcp_listen_io);
      return;
    }
    size_t slot = MAX_TCP;
    for (size_t k = 0; k < MAX_TCP; k++)
      if (!tcps[k]) {
        slot = k;
        break;
      }
    if (slot == MAX_TCP || peer.sin_family != AF_INET) {
      close(fd);
      continue;
    }
    struct dns_tcp *t = xcalloc(1, sizeof *t);
    t->io = (struct gw_io){.kind = IO_DNS_TCP, .fd = fd, .owner = t};
    t->deadline = gw_now() + TCP_IDLE_MS;
    if (gw_io_add(&t->io, EPOLLIN) < 0) {
      close(fd);
      free(t);
      continue;
    }
    tcps[slot] = t;
  }
}

static void tcp_event(struct dns_tcp *t, uint32_t ev) {
  if (ev & (EPOLLHUP | EPOLLERR)) { /* reported whatever the interest: it would come back */
    tcp_close(t);
    return;
  }
  if (t->out_len) {
    while (t->out_off < t->out_len) {
      ssize_t w = send(t->io.fd, t->out + t->out_off, t->out_len - t->out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w < 0) {
        if (errno == EAGAIN || errno == EINTR) return;
        tcp_close(t);
        return;
      }
      t->out_off += (size_t)w;
    }
    t->out_len = t->out_off = 0;
    t->deadline = gw_now() + TCP_IDLE_MS;
    gw_io_set(&t->io, EPOLLIN);
  }
  if (t->req) { /* an answer is pending: read nothing more */
    gw_io_set(&t->io, 0);
    return;
  }
  if (!(ev & (EPOLLIN | EPOLLHUP | EPOLLERR))) return;
  for (;;) {
    size_t need = 2;
    if (t->have >= 2) {
      need = 2 + (size_t)(t->in[0] << 8 | t->in[1]);
      if (need - 2 > GW_DNS_QUERY_MAX || need - 2 < GW_DNS_HDR) {
        tcp_close(t);
        return;
      }
    }
    if (t->have == need) break;
    ssize_t r = recv(t->io.fd, t->in + t->have, need - t->have, 0);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (r <= 0) {
      tcp_close(t);
      return;
    }
    t->have += (size_t)r;
  }
  struct dns_req *r = req_new();
  if (!r) {
    tcp_close(t);
    return;
  }
  struct sockaddr_in peer;
  socklen_t pl = sizeof peer;
  if (getpeername(t->io.fd, (struct sockaddr *)&peer, &pl) < 0 || peer.sin_family != AF_INET) {
    memset(r, 0, sizeof *r);
    tcp_close(t);
    return;
  }
  hutch_ip_from_bytes(AF_INET, &peer.sin_addr, &r->src);
  r->len = t->have - 2;
  memcpy(r->query, t->in + 2, r->len);
  t->have = 0;
  r->tc = t;
  t->req = r;
  gw_io_set(&t->io, 0);
  handle(r); /* may answer at once: send_answer sets EPOLLOUT */
}

void gw_dnsd_event(struct gw_io *io, uint32_t ev) {
  if (io->kind == IO_DNS_UDP) {
    udp_read();
  } else if (io->kind == IO_DNS_TCP_LISTEN) {
    tcp_accept();
  } else {
    struct dns_tcp *t = io->owner;
    if (!t->dead) tcp_event(t, ev);
  }
}

void gw_dnsd_tick(uint64_t now) {
  for (size_t i = 0; i < MAX_TCP; i++)
    if (tcps[i] && !tcps[i]->req && now > tcps[i]->deadline) tcp_close(tcps[i]);
}
