/* hutch-gateway's TCP connections: the explicit proxy (absolute-form HTTP
 * and CONNECT), transparent HTTP (Host) and transparent TLS (SNI).
 *
 * One state machine per connection:
 *
 *   proxy, HTTP      HEAD -> RESOLVE -> CONNECT -> FORWARD
 *   proxy, CONNECT   HEAD -> RESOLVE -> CONNECT -> (200) PEEK
 *                      PEEK, TLS:   TLS_ACCEPT -> INNER_HEAD -> UP_TLS -> FORWARD
 *                      PEEK, plain: INNER_HEAD -> FORWARD
 *   transparent TLS  HELLO -> RESOLVE -> CONNECT -> PEEK (as CONNECT to SNI:443)
 *
 * Every decision: the sandbox from the source address, the name (or IP
 * literal) through hutch_policy_allow_name, the gateway's own resolution,
 * every address through hutch_addr_blocked (gw_ wrappers: --public-cidr),
 * and a connection to exactly an
 * address that passed.  Inside a CONNECT tunnel the CONNECT target, the
 * SNI and the Host must agree (hutch_http_names_agree); TLS inside a
 * tunnel is always terminated (whatever the port: a raw TLS tunnel would
 * leave the Host unchecked), so a tunnel carries HTTP or HTTPS only.
 * One request per connection (forward.h): the request goes upstream with
 * "Connection: close", exactly its body, then the response comes back with
 * "Connection: close" and the connection ends.
 *
 * Buffers: BUF_CAP each way, TLS memory BIOs filled only below BIO_CAP. */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <linux/netfilter_ipv4.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "gateway.h"
#include "gateway/forward.h"
#include "net/http.h"
#include "net/sni.h"

#ifndef SO_ORIGINAL_DST
#define SO_ORIGINAL_DST 80
#endif

#define MAX_CONNS 4096
#define MAX_PER_SRC 512     /* one sandbox cannot take every slot */
#define BUF_CAP (64u << 10)
#define BIO_CAP (64u << 10)
#define TLS_CHUNK 16384
#define HEAD_MS 30000u      /* to send a request head (or ClientHello) */
#define SETUP_MS 15000u     /* to resolve and connect */
#define HANDSHAKE_MS 30000u
#define IDLE_MS 300000u     /* an established connection with no traffic */
#define CLOSING_MS 5000u    /* to deliver a refusal */

enum conn_kind { CK_PROXY = 1, CK_HTTP, CK_TLS };
enum stage { ST_HEAD = 1, ST_HELLO, ST_RESOLVE, ST_CONNECT, ST_PEEK, ST_TLS_ACCEPT, ST_INNER_HEAD, ST_UP_TLS, ST_FORWARD, ST_CLOSING };

struct buf {
  uint8_t *d;
  size_t off, len;
};

struct side {
  struct gw_io io;
  SSL *ssl;
  bool eof;       /* no more bytes will come from it */
  bool want_read; /* a handshake waits for bytes */
  uint32_t hup;   /* EPOLLHUP/EPOLLERR seen */
};

struct conn {
  struct side c, u;
  enum conn_kind kind;
  enum stage st;
  struct hutch_ip src;
  char sandbox[GW_SANDBOX_ID_MAX + 1];
  bool orig_ok;
  uint16_t orig_port;
  const char *proto;
  char name[HUTCH_NAME_MAX + 1];
  uint16_t port;
  char connect_auth[HUTCH_AUTHORITY_MAX + 1];
  char sni[HUTCH_NAME_MAX + 1];
  struct hutch_ip addrs[GW_DNS_MAX_ADDRS];
  size_t naddr, next_addr;
  bool self_refused; /* an address was this host's own */
  char addr_text[HUTCH_IP_TEXT_MAX];
  char rule[HUTCH_RULE_TEXT_MAX];
  const char *allow_why; /* the verdict's reason for allowing the name */
  struct gw_query *q;
  struct buf in, out; /* in: client -> upstream; out: upstream -> client (plaintext) */
  size_t out_ready;   /* bytes at the front of out that may go to the client */
  bool http_ok;       /* the client would read an HTTP response now */
  bool resp_head_done;
  struct gw_body body;
  bool req_done;
  bool allowed; /* an "allowed" line was written: a "closed" line follows */
  uint64_t up, down;
  uint64_t deadline;
  bool dead;
  size_t slot;
};

static struct conn *conns[MAX_CONNS];
static size_t n_conns;
static size_t max_conns = MAX_CONNS; /* lowered to what the fd limit allows */
static struct gw_io listen_io[3];
static struct hutch_http_request req; /* one at a time: parsing never yields */

static void conn_run(struct conn *c);
static void conn_interest(struct conn *c);

/* ---- buffers ---- */

static uint8_t *buf_data(struct buf *b) { return b->d + b->off; }
static size_t buf_room(struct buf *b) {
  if (b->off && b->off + b->len > BUF_CAP / 2) {
    memmove(b->d, b->d + b->off, b->len);
    b->off = 0;
  }
  return BUF_CAP - b->off - b->len;
}
static uint8_t *buf_tail(struct buf *b) { return b->d + b->off + b->len; }
static void buf_consume(struct buf *b, size_t n) {
  b->off += n;
  b->len -= n;
  if (!b->len) b->off = 0;
}

/* ---- the two sides: raw sockets or TLS through memory BIOs ---- */

static const char *ssl_reason(void) {
  static char msg[200];
  unsigned long e = ERR_get_error();
  if (!e) return "TLS error";
  ERR_error_string_n(e, msg, sizeof msg);
  ERR_clear_error();
  return msg;
}

/* Socket bytes into the read BIO: 1 some, 0 EOF, -1 nothing now, -2 error. */
static int side_fill(struct side *s) {
  if (BIO_ctrl_pending(SSL_get_rbio(s->ssl)) >= BIO_CAP) return -1;
  uint8_t tmp[TLS_CHUNK];
  for (;;) {
    ssize_t r = recv(s->io.fd, tmp, sizeof tmp, 0);
    if (r > 0) return BIO_write(SSL_get_rbio(s->ssl), tmp, (int)r) == (int)r ? 1 : -2;
    if (r == 0) return 0;
    if (errno == EINTR) continue;
    return errno == EAGAIN ? -1 : -2;
  }
}

/* Write BIO bytes onto the socket: 1 all out, 0 some left, -2 error. */
static int side_flush(struct side *s) {
  if (!s->ssl) return 1;
  BIO *w = SSL_get_wbio(s->ssl);
  while (BIO_ctrl_pending(w) > 0) {
    char *p;
    long n = BIO_get_mem_data(w, &p);
    if (n <= 0) return 1;
    ssize_t r = send(s->io.fd, p, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN ? 0 : -2;
    }
    uint8_t scratch[TLS_CHUNK];
    for (ssize_t left = r; left > 0;) {
      int k = BIO_read(w, scratch, (int)(left < (ssize_t)sizeof scratch ? left : (ssize_t)sizeof scratch));
      if (k <= 0) return -2;
      left -= k;
    }
  }
  return 1;
}

static size_t side_pending_out(struct side *s) { return s->ssl ? BIO_ctrl_pending(SSL_get_wbio(s->ssl)) : 0; }

/* Plaintext from a side: >0 bytes, 0 EOF, -1 nothing now, -2 error. */
static ssize_t side_read(struct side *s, uint8_t *dst, size_t n) {
  if (n == 0) return -1;
  if (!s->ssl) {
    for (;;) {
      ssize_t r = recv(s->io.fd, dst, n, 0);
      if (r >= 0) return r;
      if (errno == EINTR) continue;
      return errno == EAGAIN ? -1 : -2;
    }
  }
  for (;;) {
    ERR_clear_error();
    int r = SSL_read(s->ssl, dst, (int)(n > TLS_CHUNK ? TLS_CHUNK : n));
    if (r > 0) return r;
    int e = SSL_get_error(s->ssl, r);
    if (e == SSL_ERROR_ZERO_RETURN) return 0;
    if (e != SSL_ERROR_WANT_READ) return -2;
    if (side_flush(s) == -2) return -2; /* TLS 1.3 may have something to say */
    int f = side_fill(s);
    if (f == 1) continue;
    if (f == 0) return 0; /* EOF without close_notify */
    return f;
  }
}

/* Plaintext to a side: >0 bytes taken, -1 not now, -2 error. */
static ssize_t side_write(struct side *s, const uint8_t *src, size_t n) {
  if (!s->ssl) {
    for (;;) {
      ssize_t r = send(s->io.fd, src, n, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (r >= 0) return r > 0 ? r : -1;
      if (errno == EINTR) continue;
      return errno == EAGAIN ? -1 : -2;
    }
  }
  if (side_flush(s) == -2) return -2;
  if (side_pending_out(s) >= BIO_CAP) return -1;
  ERR_clear_error();
  int r = SSL_write(s->ssl, src, (int)(n > TLS_CHUNK ? TLS_CHUNK : n));
  if (r <= 0) return -2;
  if (side_flush(s) == -2) return -2;
  return r;
}

/* 1 done, 0 in progress, -1 failed. */
static int side_handshake(struct side *s) {
  for (;;) {
    ERR_clear_error();
    int r = SSL_do_handshake(s->ssl);
    if (side_flush(s) == -2) return -1;
    if (r == 1) {
      s->want_read = false;
      return 1;
    }
    int e = SSL_get_error(s->ssl, r);
    if (e != SSL_ERROR_WANT_READ) return -1;
    int f = side_fill(s);
    if (f == 1) continue;
    if (f != -1) return -1;
    s->want_read = true;
    return 0;
  }
}

static void side_close(struct side *s) {
  if (s->ssl) {
    SSL_free(s->ssl);
    s->ssl = NULL;
  }
  gw_io_close(&s->io);
}

/* ---- audit ---- */

static int conn_audit(struct conn *c, const char *decision, const char *reason, const char *rule) {
  struct gw_audit_rec a = {.sandbox = c->sandbox[0] ? c->sandbox : NULL,
                           .proto = c->proto,
                           .name = c->name[0] ? c->name : NULL,
                           .addr = c->addr_text[0] ? c->addr_text : NULL,
                           .port = c->port,
                           .decision = decision,
                           .rule = rule && *rule ? rule : NULL,
                           .reason = reason,
                           .bytes_up = c->up,
                           .bytes_down = c->down};
  return gw_audit(&a);
}

/* ---- ending ---- */

static void conn_free(void *p) {
  struct conn *c = p;
  free(c->in.d);
  free(c->out.d);
  free(c);
}

static void conn_close(struct conn *c, const char *reason) {
  if (c->dead) return;
  c->dead = true;
  if (c->allowed) conn_audit(c, "closed", reason, c->rule);
  if (c->q) gw_resolve_cancel(c->q);
  c->q = NULL;
  if (c->c.ssl && SSL_is_init_finished(c->c.ssl)) {
    SSL_shutdown(c->c.ssl); /* close_notify, best effort */
    (void)side_flush(&c->c);
  }
  side_close(&c->c);
  side_close(&c->u);
  conns[c->slot] = conns[--n_conns];
  conns[c->slot]->slot = c->slot;
  gw_defer_free(conn_free, c);
}

static const char *status_text(int status) {
  switch (status) {
  case 400: return "Bad Request";
  case 403: return "Forbidden";
  case 408: return "Request Timeout";
  case 502: return "Bad Gateway";
  case 503: return "Service Unavailable";
  default: return "Gateway Timeout";
  }
}

/* A refusal: audited, answered with an HTTP status when the client would
 * read one, then the connection ends. */
static void conn_fail(struct conn *c, int status, const char *decision, const char *reason, const char *rule) {
  if (c->dead) return;
  hutch_log(LOG_DEBUG, "conn.refused", "sandbox", c->sandbox[0] ? c->sandbox : "unknown", "name", c->name, "reason",
            reason, NULL);
  conn_audit(c, decision, reason, rule);
  if (c->q) gw_resolve_cancel(c->q);
  c->q = NULL;
  side_close(&c->u);
  if (!c->http_ok) {
    conn_close(c, reason);
    return;
  }
  char body[512];
  int bl = snprintf(body, sizeof body, "hutch egress: %s\n", reason);
  if (bl < 0 || (size_t)bl >= sizeof body) bl = (int)sizeof body - 1;
  char head[256];
  int hl = snprintf(head, sizeof head,
                    "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n"
                    "Cache-Control: no-store\r\n\r\n",
                    status, status_text(status), bl);
  c->out.off = 0;
  c->out.len = 0;
  memcpy(c->out.d, head, (size_t)hl);
  memcpy(c->out.d + hl, body, (size_t)bl);
  c->out.len = c->out_ready = (size_t)hl + (size_t)bl;
  c->http_ok = false;
  c->st = ST_CLOSING;
  c->deadline = gw_now() + CLOSING_MS;
}

static void deny(struct conn *c, int status, const char *reason, const char *rule) {
  conn_fail(c, status, "denied", reason, rule);
}

/* ---- decisions ---- */

static void start_connect(struct conn *c);

static void resolved(void *arg, int status, const struct gw_dns_result *res, const char *why) {
  struct conn *c = arg;
  c->q = NULL;
  if (c->dead) return;
  char reason[200];
  if (status < 0) {
    snprintf(reason, sizeof reason, "cannot resolve the name: %s", why);
    conn_fail(c, 502, "error", reason, c->rule);
  } else if (res->rcode == GW_DNS_NXDOMAIN || (res->rcode == GW_DNS_NOERROR && res->n == 0)) {
    conn_fail(c, 502, "error", res->rcode ? "no such name (NXDOMAIN)" : "the name has no IPv4 address", c->rule);
  } else if (res->rcode != GW_DNS_NOERROR) {
    snprintf(reason, sizeof reason, "cannot resolve the name: upstream rcode %d", res->rcode);
    conn_fail(c, 502, "error", reason, c->rule);
  } else {
    const struct gw_sandbox *sb = gw_lookup(&c->src);
    if (!sb) {
      deny(c, 403, "unknown source (the sandbox was removed)", NULL);
    } else {
      struct hutch_verdict first = {0};
      bool blocked = false;
      c->naddr = 0;
      for (size_t i = 0; i < res->n; i++) {
        struct hutch_ip ip;
        struct hutch_verdict v;
        hutch_ip_from_bytes(AF_INET, res->addr[i], &ip);
        if (gw_addr_blocked(sb->policy, &ip, c->port, &v)) {
          if (!blocked) {
            first = v;
            hutch_ip_to_text(&ip, c->addr_text);
          }
          blocked = true;
          continue;
        }
        c->addrs[c->naddr++] = ip;
      }
      if (c->naddr == 0) {
        snprintf(reason, sizeof reason, "the name resolves to a blocked address: %s", first.why ? first.why : "blocked");
        deny(c, 403, reason, first.rule ? first.rule->text : NULL);
      } else {
        c->addr_text[0] = 0;
        start_connect(c);
      }
    }
  }
  if (!c->dead) conn_run(c);
}

/* The target (c->name, c->port) is known: decide, then resolve or connect. */
static void decide(struct conn *c) {
  const struct gw_sandbox *sb = gw_lookup(&c->src);
  if (!sb) {
    c->sandbox[0] = 0;
    deny(c, 403, "unknown source", NULL);
    return;
  }
  snprintf(c->sandbox, sizeof c->sandbox, "%s", sb->id);
  struct hutch_verdict v;
  if (!gw_allow_name(sb->policy, c->name, c->port, &v)) {
    deny(c, 403, v.why ? v.why : "denied", v.rule ? v.rule->text : NULL);
    return;
  }
  snprintf(c->rule, sizeof c->rule, "%s", v.rule ? v.rule->text : "");
  c->allow_why = v.why ? v.why : "allowed";
  struct hutch_host h;
  const char *why = NULL;
  if (hutch_host_parse(c->name, strlen(c->name), &h, &why) < 0) {
    deny(c, 403, why, NULL);
    return;
  }
  if (h.kind == HUTCH_HOST_IP) { /* allow_name decided it as an address, blocked ranges included */
    c->addrs[0] = h.ip;
    c->naddr = 1;
    start_connect(c);
    return;
  }
  c->st = ST_RESOLVE;
  c->deadline = gw_now() + SETUP_MS;
  c->q = gw_resolve(h.text, GW_DNS_TYPE_A, resolved, c, &why);
  if (!c->q) conn_fail(c, 502, "error", why, c->rule);
}

/* ---- this host's own addresses ----
 *
 * A public address can be this host's: an allowed name (or "all") that
 * resolves to it would let a sandbox reach the host's own services (hutchd's
 * API, sshd) through the gateway.  Such a destination is refused unless an
 * allow CIDR rule names it, as for loopback.  Checked before connecting
 * (the host's interface addresses, re-read every 2 s) and after (a
 * connection whose two ends have the same address went to this host). */

#define LOCAL_MAX 256
static struct hutch_ip local_addrs[LOCAL_MAX];
static size_t n_local;
static uint64_t local_read_at;

static bool is_local(const struct hutch_ip *ip) {
  uint64_t now = gw_now();
  if (!local_read_at || now - local_read_at > 2000) {
    struct ifaddrs *ifa = NULL;
    if (getifaddrs(&ifa) == 0) {
      n_local = 0;
      for (struct ifaddrs *i = ifa; i && n_local < LOCAL_MAX; i = i->ifa_next) {
        if (!i->ifa_addr) continue;
        socklen_t l = i->ifa_addr->sa_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
        if (hutch_ip_from_sockaddr(i->ifa_addr, l, &local_addrs[n_local], NULL) == 0) n_local++;
      }
      freeifaddrs(ifa);
      local_read_at = now;
    }
  }
  struct hutch_ip norm;
  hutch_ip_normalize(ip, &norm);
  for (size_t i = 0; i < n_local; i++)
    if (hutch_ip_equal(&local_addrs[i], ip) || hutch_ip_equal(&local_addrs[i], &norm)) return true;
  return false;
}

/* May the connection go to `ip`, one of this host's addresses?  Loopback is
 * decided by the address check already (it needs a CIDR rule). */
static bool self_ok(struct conn *c, const struct hutch_ip *ip) {
  if (hutch_addr_classify(ip, NULL, NULL) == HUTCH_ADDR_LOOPBACK) return true;
  const struct gw_sandbox *sb = gw_lookup(&c->src);
  if (!sb || !sb->policy) return false;
  struct hutch_ip norm;
  hutch_ip_normalize(ip, &norm);
  for (size_t i = 0; i < sb->policy->n_allow; i++) {
    const struct hutch_rule *r = &sb->policy->allow[i];
    if (hutch_rule_match_ip(r, ip, c->port) || hutch_rule_match_ip(r, &norm, c->port)) return true;
  }
  return false;
}

static void start_connect(struct conn *c) {
  side_close(&c->u);
  while (c->next_addr < c->naddr) {
    const struct hutch_ip *ip = &c->addrs[c->next_addr++];
    if (is_local(ip) && !self_ok(c, ip)) {
      hutch_ip_to_text(ip, c->addr_text);
      c->self_refused = true;
      continue;
    }
    struct sockaddr_storage ss;
    socklen_t sl;
    memset(&ss, 0, sizeof ss);
    if (ip->family == AF_INET) {
      struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
      s4->sin_family = AF_INET;
      s4->sin_port = htons(c->port);
      memcpy(&s4->sin_addr, ip->b, 4);
      sl = sizeof *s4;
    } else {
      struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
      s6->sin6_family = AF_INET6;
      s6->sin6_port = htons(c->port);
      memcpy(&s6->sin6_addr, ip->b, 16);
      sl = sizeof *s6;
    }
    hutch_ip_to_text(ip, c->addr_text);
    int fd = socket(ip->family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    if (connect(fd, (struct sockaddr *)&ss, sl) < 0 && errno != EINPROGRESS) {
      close(fd);
      continue;
    }
    c->u.io.fd = fd;
    c->u.eof = false;
    if (gw_io_add(&c->u.io, EPOLLOUT) < 0) {
      close(fd);
      c->u.io.fd = -1;
      continue;
    }
    c->st = ST_CONNECT;
    c->deadline = gw_now() + SETUP_MS;
    return;
  }
  if (c->self_refused)
    deny(c, 403, "the destination is this host (an allow CIDR rule must name it)", c->rule);
  else
    conn_fail(c, 502, "error", "cannot connect to the destination", c->rule);
}

/* Rewrite the parsed head in c->in (req) for upstream and start tracking
 * its body.  0, or -1 after refusing. */
static int prepare_forward(struct conn *c) {
  static char tmp[HUTCH_HTTP_HEAD_MAX + GW_HEAD_REWRITE_EXTRA];
  size_t n = gw_http_rewrite_request(&req, tmp, sizeof tmp);
  if (n == 0) {
    deny(c, 400, "request head too large", NULL);
    return -1;
  }
  uint8_t *rest = buf_data(&c->in) + req.head_len;
  size_t rest_len = c->in.len - req.head_len;
  gw_body_init(&c->body, &req);
  ssize_t k = gw_body_feed(&c->body, rest, rest_len);
  if (k < 0) {
    deny(c, 400, c->body.why, NULL);
    return -1;
  }
  /* The body bytes that came with the head follow the new head. */
  memmove(c->in.d + n, rest, (size_t)k);
  memcpy(c->in.d, tmp, n);
  c->in.off = 0;
  c->in.len = n + (size_t)k;
  c->req_done = c->body.done;
  return 0;
}

static bool field_value(const char *name, char *out, size_t cap) {
  for (size_t i = 0; i < req.n_fields; i++) {
    const struct hutch_http_field *f = &req.fields[i];
    if (f->name_len == strlen(name) && !strncasecmp(f->name, name, f->name_len)) {
      if (f->value_len >= cap) return false;
      memcpy(out, f->value, f->value_len);
      out[f->value_len] = 0;
      return true;
    }
  }
  return false;
}

/* ---- stages ---- */

/* Read client bytes into c->in up to `limit`: 1 some, 0 none now, -1 EOF
 * or error (the connection is closed). */
static int client_fill(struct conn *c, size_t limit) {
  if (c->in.len >= limit) return 0;
  size_t room = buf_room(&c->in);
  size_t want = limit - c->in.len < room ? limit - c->in.len : room;
  ssize_t r = side_read(&c->c, buf_tail(&c->in), want);
  if (r > 0) {
    c->in.len += (size_t)r;
    return 1;
  }
  if (r == -1) return 0;
  if (r == 0 && (c->allowed || c->in.len == 0)) conn_close(c, "client closed");
  else if (r == 0) conn_fail(c, 400, "denied", "the client closed before its request was complete", c->rule);
  else conn_close(c, "client connection error");
  return -1;
}

static int on_head(struct conn *c) {
  if (c->kind == CK_HTTP && !c->orig_ok) {
    char why[120];
    snprintf(why, sizeof why, "not a redirected port-80 connection (original port %u)", c->orig_port);
    deny(c, 403, why, NULL);
    return 0;
  }
  if (req.upgrade) {
    deny(c, 403, "Upgrade is not supported (one HTTP/1.1 request per connection)", NULL);
    return 0;
  }
  snprintf(c->name, sizeof c->name, "%s", req.host.text);
  c->port = req.port;
  if (req.connect) {
    if (c->kind != CK_PROXY) {
      deny(c, 400, "CONNECT on a transparent port", NULL);
      return 0;
    }
    c->proto = "connect";
    snprintf(c->connect_auth, sizeof c->connect_auth, "%s", req.authority);
    buf_consume(&c->in, req.head_len); /* early tunnel bytes stay */
    decide(c);
    return 0;
  }
  c->proto = "http";
  if (req.https) {
    deny(c, 400, "https:// in a plain request: use CONNECT", NULL);
    return 0;
  }
  if (c->kind == CK_PROXY && req.form != HUTCH_HTTP_ABSOLUTE) {
    deny(c, 400, "the proxy needs absolute-form (GET http://host/path) or CONNECT", NULL);
    return 0;
  }
  if (c->kind == CK_HTTP && req.port != c->orig_port) {
    deny(c, 403, "Host port differs from the connection's destination port", NULL);
    return 0;
  }
  if (prepare_forward(c) < 0) return 0;
  decide(c);
  return 0;
}

static int stage_head(struct conn *c) {
  enum hutch_http_result r = hutch_http_parse((const char *)buf_data(&c->in), c->in.len, &req);
  if (r == HUTCH_HTTP_BAD) {
    deny(c, 400, req.why, NULL);
    return 0;
  }
  if (r == HUTCH_HTTP_OK) return on_head(c);
  return client_fill(c, HUTCH_HTTP_HEAD_MAX) == 1;
}

static int stage_hello(struct conn *c) {
  struct hutch_sni s;
  enum hutch_sni_result r = hutch_sni_parse(buf_data(&c->in), c->in.len, &s);
  if (r == HUTCH_SNI_NEED_MORE) return client_fill(c, HUTCH_SNI_INPUT_MAX) == 1;
  if (!c->orig_ok) {
    char why[120];
    snprintf(why, sizeof why, "not a redirected port-443 connection (original port %u)", c->orig_port);
    deny(c, 403, why, NULL);
    return 0;
  }
  if (r != HUTCH_SNI_OK) {
    char why[200];
    snprintf(why, sizeof why, "%s", r == HUTCH_SNI_NONE ? "TLS without a server name (SNI)" : r == HUTCH_SNI_NOT_TLS ? "not TLS" : s.why ? s.why : "malformed ClientHello");
    deny(c, 403, why, NULL);
    return 0;
  }
  snprintf(c->name, sizeof c->name, "%s", s.host);
  snprintf(c->sni, sizeof c->sni, "%s", s.host);
  c->port = 443;
  snprintf(c->connect_auth, sizeof c->connect_auth, "%s:443", s.host);
  decide(c);
  return 0;
}

static void on_connected(struct conn *c) {
  c->u.want_read = false;
  if (!strcmp(c->proto, "http")) {
    if (conn_audit(c, "allowed", c->allow_why, c->rule) < 0) {
      deny(c, 503, "the audit log cannot be written", NULL);
      return;
    }
    c->allowed = true;
    c->st = ST_FORWARD;
    c->deadline = gw_now() + IDLE_MS;
    return;
  }
  if (!strcmp(c->proto, "connect")) {
    static const char ok[] = "HTTP/1.1 200 Connection established\r\n\r\n";
    memcpy(c->out.d, ok, sizeof ok - 1);
    c->out.off = 0;
    c->out.len = c->out_ready = sizeof ok - 1;
    c->http_ok = false;
  }
  c->st = ST_PEEK;
  c->deadline = gw_now() + HEAD_MS;
}

static int stage_connect(struct conn *c) {
  int e = 0;
  socklen_t el = sizeof e;
  if (getsockopt(c->u.io.fd, SOL_SOCKET, SO_ERROR, &e, &el) < 0) e = errno;
  if (e == EINPROGRESS || e == EALREADY) return 0;
  if (e) {
    if (c->next_addr < c->naddr) {
      start_connect(c);
      return 1;
    }
    char why[160];
    snprintf(why, sizeof why, "cannot connect to the destination: %s", strerror(e));
    conn_fail(c, 502, "error", why, c->rule);
    return 0;
  }
  /* Writable with no error is connected, unless the event is only pending. */
  struct sockaddr_storage ss, ls;
  socklen_t sl = sizeof ss, ll = sizeof ls;
  if (getpeername(c->u.io.fd, (struct sockaddr *)&ss, &sl) < 0) return 0;
  struct hutch_ip peer, local;
  if (getsockname(c->u.io.fd, (struct sockaddr *)&ls, &ll) < 0 ||
      hutch_ip_from_sockaddr((struct sockaddr *)&ss, sl, &peer, NULL) < 0 ||
      hutch_ip_from_sockaddr((struct sockaddr *)&ls, ll, &local, NULL) < 0 ||
      (hutch_ip_equal(&peer, &local) && !self_ok(c, &peer))) {
    deny(c, 403, "the destination is this host (an allow CIDR rule must name it)", c->rule);
    return 0;
  }
  on_connected(c);
  return 1;
}

/* Output queued for the client (the 200 to a CONNECT, a refusal). */
static int client_flush_out(struct conn *c) {
  int progress = 0;
  while (c->out_ready) {
    ssize_t w = side_write(&c->c, buf_data(&c->out), c->out_ready);
    if (w == -2) {
      conn_close(c, "client connection error");
      return 0;
    }
    if (w < 0) break;
    buf_consume(&c->out, (size_t)w);
    c->out_ready -= (size_t)w;
    progress = 1;
  }
  if (side_flush(&c->c) == -2) {
    conn_close(c, "client connection error");
    return 0;
  }
  return progress;
}

static int stage_peek(struct conn *c) {
  if (c->out_ready) return client_flush_out(c);
  if (c->in.len == 0) return client_fill(c, HUTCH_SNI_INPUT_MAX) == 1;
  struct hutch_sni s;
  enum hutch_sni_result r = hutch_sni_parse(buf_data(&c->in), c->in.len, &s);
  if (r == HUTCH_SNI_NEED_MORE) return client_fill(c, HUTCH_SNI_INPUT_MAX) == 1;
  if (r == HUTCH_SNI_NOT_TLS) {
    c->http_ok = true;
    c->st = ST_INNER_HEAD;
    return 1;
  }
  if (r == HUTCH_SNI_NONE) {
    deny(c, 403, "TLS without a server name (SNI)", NULL);
    return 0;
  }
  if (r != HUTCH_SNI_OK) {
    deny(c, 403, s.why ? s.why : "malformed ClientHello", NULL);
    return 0;
  }
  const char *why = NULL;
  if (!hutch_http_names_agree(c->connect_auth, s.host, NULL, &why)) {
    char reason[HUTCH_NAME_MAX + 64];
    snprintf(reason, sizeof reason, "%s (SNI %s)", why, s.host);
    deny(c, 403, reason, NULL);
    return 0;
  }
  snprintf(c->sni, sizeof c->sni, "%s", s.host);
  hutch_err err = HUTCH_ERR_INIT;
  c->c.ssl = gw_tls_server(c->sni, c, &err);
  if (!c->c.ssl) {
    conn_fail(c, 502, "error", err.msg, c->rule);
    return 0;
  }
  /* The ClientHello already read is the start of the TLS stream. */
  if (BIO_write(SSL_get_rbio(c->c.ssl), buf_data(&c->in), (int)c->in.len) != (int)c->in.len) {
    conn_fail(c, 502, "error", "internal: TLS buffer", c->rule);
    return 0;
  }
  c->in.off = c->in.len = 0;
  c->st = ST_TLS_ACCEPT;
  c->deadline = gw_now() + HANDSHAKE_MS;
  return 1;
}

const char *gw_tls_expected_name(void *app) {
  struct conn *c = app;
  return c && c->sni[0] ? c->sni : NULL;
}

static int stage_tls_accept(struct conn *c) {
  int r = side_handshake(&c->c);
  if (r == 0) return 0;
  if (r < 0) {
    char why[260];
    snprintf(why, sizeof why, "TLS handshake with the client failed: %s", ssl_reason());
    deny(c, 403, why, NULL);
    return 0;
  }
  c->http_ok = true;
  c->st = ST_INNER_HEAD;
  c->deadline = gw_now() + HEAD_MS;
  return 1;
}

static int stage_inner_head(struct conn *c) {
  enum hutch_http_result r = hutch_http_parse((const char *)buf_data(&c->in), c->in.len, &req);
  if (r == HUTCH_HTTP_NEED_MORE) return client_fill(c, HUTCH_HTTP_HEAD_MAX) == 1;
  if (r == HUTCH_HTTP_BAD) {
    deny(c, 400, req.why, NULL);
    return 0;
  }
  if (req.connect) {
    deny(c, 400, "CONNECT inside a tunnel", NULL);
    return 0;
  }
  if (req.upgrade) {
    deny(c, 403, "Upgrade is not supported (one HTTP/1.1 request per connection)", NULL);
    return 0;
  }
  const char *sni = c->sni[0] ? c->sni : NULL;
  char host[HUTCH_AUTHORITY_MAX + 1];
  bool has_host = req.has_host_header && field_value("host", host, sizeof host);
  if (req.has_host_header && !has_host) {
    deny(c, 400, "Host too long", NULL);
    return 0;
  }
  const char *why = NULL;
  if (!hutch_http_names_agree(c->connect_auth, sni, has_host ? host : NULL, &why) ||
      (req.form == HUTCH_HTTP_ABSOLUTE && !hutch_http_names_agree(c->connect_auth, sni, req.authority, &why))) {
    char reason[HUTCH_AUTHORITY_MAX + 80];
    snprintf(reason, sizeof reason, "%s (Host %s)", why, has_host ? host : req.authority);
    deny(c, 403, reason, NULL);
    return 0;
  }
  if (req.form == HUTCH_HTTP_ABSOLUTE && req.https != (c->c.ssl != NULL)) {
    deny(c, 403, "the request's scheme differs from the tunnel's", NULL);
    return 0;
  }
  if (prepare_forward(c) < 0) return 0;
  if (conn_audit(c, "allowed", c->allow_why, c->rule) < 0) {
    deny(c, 503, "the audit log cannot be written", NULL);
    return 0;
  }
  c->allowed = true;
  if (c->c.ssl) {
    hutch_err err = HUTCH_ERR_INIT;
    c->u.ssl = gw_tls_client(c->name, &err);
    if (!c->u.ssl) {
      conn_fail(c, 502, "error", err.msg, c->rule);
      return 0;
    }
    c->st = ST_UP_TLS;
    c->deadline = gw_now() + HANDSHAKE_MS;
    return 1;
  }
  c->st = ST_FORWARD;
  c->deadline = gw_now() + IDLE_MS;
  return 1;
}

static int stage_up_tls(struct conn *c) {
  int r = side_handshake(&c->u);
  if (r == 0) return 0;
  if (r < 0) {
    char why[300];
    long v = SSL_get_verify_result(c->u.ssl);
    if (v != X509_V_OK)
      snprintf(why, sizeof why, "upstream certificate not trusted: %s", X509_verify_cert_error_string(v));
    else
      snprintf(why, sizeof why, "upstream TLS handshake failed: %s", ssl_reason());
    conn_fail(c, 502, "error", why, c->rule);
    return 0;
  }
  c->st = ST_FORWARD;
  c->deadline = gw_now() + IDLE_MS;
  return 1;
}

/* The response head(s) at out[out_ready..]: interim 1xx pass unchanged,
 * the final one gets "Connection: close".  0 wait, 1 progress, -1 closed. */
static int response_head(struct conn *c) {
  while (!c->resp_head_done) {
    uint8_t *p = buf_data(&c->out) + c->out_ready;
    size_t avail = c->out.len - c->out_ready, hl = 0;
    int status = 0;
    const char *why = NULL;
    int r = gw_http_response_head((const char *)p, avail, &hl, &status, &why);
    if (r == 0) return 0;
    if (r < 0 || status == 101) {
      conn_fail(c, 502, "error", r < 0 ? why : "upstream switched protocols", c->rule);
      return -1;
    }
    if (status < 200) {
      c->out_ready += hl;
      continue;
    }
    static char tmp[HUTCH_HTTP_HEAD_MAX + GW_HEAD_REWRITE_EXTRA];
    size_t nl = gw_http_rewrite_response((const char *)p, hl, tmp, sizeof tmp);
    size_t rest = avail - hl;
    if (nl == 0 || c->out.off + c->out_ready + nl + rest > BUF_CAP) {
      conn_fail(c, 502, "error", "response head too large", c->rule);
      return -1;
    }
    memmove(p + nl, p + hl, rest);
    memcpy(p, tmp, nl);
    c->out.len = c->out_ready + nl + rest;
    c->out_ready = c->out.len;
    c->resp_head_done = true;
  }
  return 1;
}

/* How much may be read from upstream now. */
static size_t up_room(struct conn *c) {
  size_t room = buf_room(&c->out);
  if (!c->resp_head_done) {
    size_t unproc = c->out.len - c->out_ready;
    size_t lim = unproc < HUTCH_HTTP_HEAD_MAX ? HUTCH_HTTP_HEAD_MAX - unproc : 0;
    room = room > 1024 ? room - 1024 : 0; /* space for the rewrite */
    if (room > lim) room = lim;
  }
  return room;
}

static int stage_forward(struct conn *c) {
  int progress = 0;
  /* client -> c->in */
  if (!c->c.eof) {
    if (!c->req_done) {
      size_t room = buf_room(&c->in);
      if (room) {
        uint8_t *t = buf_tail(&c->in);
        ssize_t r = side_read(&c->c, t, room);
        if (r > 0) {
          ssize_t k = gw_body_feed(&c->body, t, (size_t)r);
          if (k < 0) {
            conn_close(c, c->body.why);
            return 0;
          }
          c->in.len += (size_t)k; /* bytes after the body (a second request) are dropped */
          c->req_done = c->body.done;
          progress = 1;
        } else if (r == 0) {
          conn_close(c, "the client closed before its request body ended");
          return 0;
        } else if (r == -2) {
          conn_close(c, "client connection error");
          return 0;
        }
      }
    } else {
      uint8_t scratch[4096];
      ssize_t r = side_read(&c->c, scratch, sizeof scratch);
      if (r > 0) progress = 1; /* after the request: discarded */
      else if (r == 0) c->c.eof = true, progress = 1;
      else if (r == -2) {
        conn_close(c, "client connection error");
        return 0;
      }
    }
  }
  /* c->in -> upstream */
  while (c->in.len) {
    ssize_t w = side_write(&c->u, buf_data(&c->in), c->in.len);
    if (w == -2) {
      conn_close(c, "upstream connection error");
      return 0;
    }
    if (w < 0) break;
    buf_consume(&c->in, (size_t)w);
    c->up += (uint64_t)w;
    progress = 1;
  }
  if (side_flush(&c->u) == -2) {
    conn_close(c, "upstream connection error");
    return 0;
  }
  /* upstream -> c->out */
  if (!c->u.eof) {
    size_t room = up_room(c);
    if (room) {
      ssize_t r = side_read(&c->u, buf_tail(&c->out), room);
      if (r > 0) {
        c->out.len += (size_t)r;
        if (c->resp_head_done) c->out_ready = c->out.len;
        else if (response_head(c) < 0) return 0;
        progress = 1;
      } else if (r == 0 || r == -2) {
        c->u.eof = true;
        progress = 1;
        if (!c->resp_head_done) {
          if (c->down == 0 && c->out_ready == 0) {
            conn_fail(c, 502, "error", r == 0 ? "the destination closed without a response" : "upstream connection error",
                      c->rule);
          } else {
            conn_close(c, "incomplete response");
          }
          return 0;
        }
      }
    }
  }
  /* c->out -> client */
  while (c->out_ready) {
    ssize_t w = side_write(&c->c, buf_data(&c->out), c->out_ready);
    if (w == -2) {
      conn_close(c, "client connection error");
      return 0;
    }
    if (w < 0) break;
    buf_consume(&c->out, (size_t)w);
    c->out_ready -= (size_t)w;
    c->down += (uint64_t)w;
    c->http_ok = false;
    progress = 1;
  }
  if (side_flush(&c->c) == -2) {
    conn_close(c, "client connection error");
    return 0;
  }
  if (c->u.eof && c->out.len == 0 && side_pending_out(&c->c) == 0) {
    conn_close(c, "done");
    return 0;
  }
  if (progress) c->deadline = gw_now() + IDLE_MS;
  return progress;
}

static int stage_closing(struct conn *c) {
  int p = client_flush_out(c);
  if (c->dead) return 0;
  if (c->out_ready == 0 && side_pending_out(&c->c) == 0) {
    conn_close(c, "refused");
    return 0;
  }
  return p;
}

static int step(struct conn *c) {
  switch (c->st) {
  case ST_HEAD: return stage_head(c);
  case ST_HELLO: return stage_hello(c);
  case ST_RESOLVE: return 0;
  case ST_CONNECT: return 0; /* driven by the upstream's events */
  case ST_PEEK: return stage_peek(c);
  case ST_TLS_ACCEPT: return stage_tls_accept(c);
  case ST_INNER_HEAD: return stage_inner_head(c);
  case ST_UP_TLS: return stage_up_tls(c);
  case ST_FORWARD: return stage_forward(c);
  case ST_CLOSING: return stage_closing(c);
  }
  return 0;
}

static void conn_run(struct conn *c) {
  for (int i = 0; i < 64 && !c->dead; i++) {
    enum stage before = c->st;
    int p = step(c);
    if (c->dead) return;
    /* A refusal queued in a stage other than CLOSING: deliver it now. */
    if (!p && c->st == before) break;
  }
  if (!c->dead) conn_interest(c);
}

static void conn_interest(struct conn *c) {
  uint32_t ce = 0, ue = 0;
  size_t cpend = side_pending_out(&c->c), upend = side_pending_out(&c->u);
  switch (c->st) {
  case ST_HEAD:
  case ST_INNER_HEAD: ce = c->in.len < HUTCH_HTTP_HEAD_MAX ? EPOLLIN : 0; break;
  case ST_HELLO: ce = c->in.len < HUTCH_SNI_INPUT_MAX ? EPOLLIN : 0; break;
  case ST_PEEK:
    if (c->out_ready) ce = EPOLLOUT;
    else ce = c->in.len < HUTCH_SNI_INPUT_MAX ? EPOLLIN : 0;
    break;
  case ST_TLS_ACCEPT: ce = c->c.want_read ? EPOLLIN : 0; break;
  case ST_CONNECT: ue = EPOLLOUT; break;
  case ST_UP_TLS: ue = c->u.want_read ? EPOLLIN : 0; break;
  case ST_FORWARD:
    if (!c->c.eof && (c->req_done || BUF_CAP - c->in.len > 0)) ce |= EPOLLIN;
    if (c->out_ready) ce |= EPOLLOUT;
    if (!c->u.eof && up_room(c)) ue |= EPOLLIN;
    if (c->in.len) ue |= EPOLLOUT;
    break;
  case ST_CLOSING: ce = c->out_ready ? EPOLLOUT : 0; break;
  case ST_RESOLVE: break;
  }
  if (cpend) ce |= EPOLLOUT;
  if (upend) ue |= EPOLLOUT;
  if (c->c.io.fd >= 0) gw_io_set(&c->c.io, ce);
  if (c->u.io.fd >= 0) gw_io_set(&c->u.io, ue);
}

/* ---- events ---- */

void gw_conn_event(struct gw_io *io, uint32_t ev) {
  struct conn *c = io->owner;
  if (c->dead) return;
  struct side *s = io->kind == IO_CONN_CLIENT ? &c->c : &c->u;
  if (s == &c->u && c->st == ST_CONNECT) {
    if (stage_connect(c) && !c->dead) conn_run(c);
    else if (!c->dead) conn_interest(c);
    return;
  }
  conn_run(c);
  if (c->dead) return;
  /* A hang-up or error on a side we are not waiting on would be reported
   * again and again: that side is gone. */
  if ((ev & (EPOLLHUP | EPOLLERR)) && s->io.fd >= 0 && s->hup++ > 4) {
    if (s == &c->c) conn_close(c, "client connection closed");
    else conn_fail(c, 502, "error", "upstream connection closed", c->rule);
    if (!c->dead) conn_interest(c);
  }
}

void gw_conn_accept(struct gw_io *l) {
  for (int i = 0; i < 64; i++) {
    struct sockaddr_in peer;
    socklen_t pl = sizeof peer;
    int fd = accept4(l->fd, (struct sockaddr *)&peer, &pl, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) gw_listener_pause(l);
      return;
    }
    size_t same = 0;
    for (size_t k = 0; k < n_conns && peer.sin_family == AF_INET; k++)
      same += !memcmp(conns[k]->src.b, &peer.sin_addr, 4);
    if (n_conns >= max_conns || same >= MAX_PER_SRC || peer.sin_family != AF_INET) {
      hutch_log(LOG_WARN, "conn.rejected", "reason",
                n_conns >= max_conns ? "too many connections" : "too many connections from one source", NULL);
      close(fd);
      continue;
    }
    struct conn *c = xcalloc(1, sizeof *c);
    c->kind = l->kind == IO_LISTEN_PROXY ? CK_PROXY : l->kind == IO_LISTEN_HTTP ? CK_HTTP : CK_TLS;
    c->c.io = (struct gw_io){.kind = IO_CONN_CLIENT, .fd = fd, .owner = c};
    c->u.io = (struct gw_io){.kind = IO_CONN_UP, .fd = -1, .owner = c};
    hutch_ip_from_bytes(AF_INET, &peer.sin_addr, &c->src);
    const struct gw_sandbox *sb = gw_lookup(&c->src); /* for the audit of refusals before a decision */
    if (sb) snprintf(c->sandbox, sizeof c->sandbox, "%s", sb->id);
    c->in.d = xmalloc(BUF_CAP);
    c->out.d = xmalloc(BUF_CAP);
    c->proto = c->kind == CK_TLS ? "tls" : "http";
    c->http_ok = c->kind != CK_TLS;
    c->st = c->kind == CK_TLS ? ST_HELLO : ST_HEAD;
    c->deadline = gw_now() + HEAD_MS;
    if (c->kind != CK_PROXY) {
      struct sockaddr_in od;
      socklen_t ol = sizeof od;
      uint16_t want = c->kind == CK_HTTP ? 80 : 443;
      if (getsockopt(fd, SOL_IP, SO_ORIGINAL_DST, &od, &ol) == 0 && od.sin_family == AF_INET) {
        c->orig_port = ntohs(od.sin_port);
        c->orig_ok = c->orig_port == want;
      }
    }
    c->slot = n_conns;
    conns[n_conns++] = c;
    if (gw_io_add(&c->c.io, EPOLLIN) < 0) {
      conn_close(c, "epoll");
      continue;
    }
  }
}

void gw_conn_tick(uint64_t now) {
  for (size_t i = 0; i < n_conns;) {
    struct conn *c = conns[i];
    if (now < c->deadline) {
      i++;
      continue;
    }
    switch (c->st) {
    case ST_HEAD:
    case ST_INNER_HEAD: deny(c, 408, "no complete request in time", NULL); break;
    case ST_HELLO:
    case ST_PEEK:
    case ST_TLS_ACCEPT: deny(c, 408, "no TLS handshake in time", NULL); break;
    case ST_RESOLVE:
    case ST_CONNECT:
    case ST_UP_TLS: conn_fail(c, 504, "error", "the destination did not answer in time", c->rule); break;
    case ST_FORWARD: conn_close(c, "idle timeout"); break;
    case ST_CLOSING: conn_close(c, "refused"); break;
    }
    if (!c->dead) conn_run(c);
    if (i < n_conns && conns[i] == c) i++;
  }
}

void gw_conn_kill_src(const struct hutch_ip *src) {
  for (size_t i = 0; i < n_conns;) {
    struct conn *c = conns[i];
    if (hutch_ip_equal(&c->src, src)) {
      conn_close(c, "sandbox removed");
      continue;
    }
    i++;
  }
}

int gw_conn_init(hutch_err *err) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    /* Two fds a connection; the rest for DNS, control and the resolver. */
    size_t fit = rl.rlim_cur > 1024 + 32 ? (size_t)(rl.rlim_cur - 1024) / 2 : 16;
    if (fit < max_conns) max_conns = fit;
  }
  const uint16_t ports[3] = {G.cfg.port_proxy, G.cfg.port_http, G.cfg.port_tls};
  const enum gw_io_kind kinds[3] = {IO_LISTEN_PROXY, IO_LISTEN_HTTP, IO_LISTEN_TLS};
  for (int i = 0; i < 3; i++) {
    listen_io[i] = (struct gw_io){.kind = kinds[i], .fd = -1};
    listen_io[i].fd = gw_listen_tcp(ports[i], err);
    if (listen_io[i].fd < 0) return -1;
    if (gw_io_add(&listen_io[i], EPOLLIN) < 0) return hutch_err_sys(err, errno, "epoll");
  }
  return 0;
}
