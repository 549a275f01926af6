/* hutch-gateway: the egress gateway process (issue 8, docs/network.md).
 * One thread, one epoll loop; every socket non-blocking; TLS through
 * memory BIOs so that OpenSSL never touches a socket. */
#ifndef HUTCH_GATEWAY_GATEWAY_H
#define HUTCH_GATEWAY_GATEWAY_H

#include <netinet/in.h>
#include <openssl/ssl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "gateway/audit.h"
#include "gateway/control.h"
#include "gateway/dns.h"
#include "net/addr.h"
#include "net/policy.h"

enum gw_io_kind {
  IO_LISTEN_PROXY = 1,
  IO_LISTEN_HTTP,
  IO_LISTEN_TLS,
  IO_DNS_UDP,
  IO_DNS_TCP_LISTEN,
  IO_DNS_TCP,
  IO_CTL_LISTEN,
  IO_CTL,
  IO_CONN_CLIENT,
  IO_CONN_UP,
  IO_RES,
  IO_SIGNAL,
};

/* What epoll's data.ptr points at. */
struct gw_io {
  enum gw_io_kind kind;
  int fd;
  uint32_t events; /* registered interest; 0 when not registered */
  void *owner;
};

struct gw_config {
  const char *control;
  struct sockaddr_in upstream_dns;
  const char *audit_dir;
  const char *ca_dir;
  const char *upstream_ca;
  struct in_addr listen_ip;
  uint16_t port_dns, port_proxy, port_http, port_tls;
  const char *user;
  size_t audit_cap;
  struct hutch_rule public_cidr[16]; /* --public-cidr */
  size_t n_public;
};

struct gw_state {
  struct gw_config cfg;
  int epfd;
  int audit_dirfd;
  struct gw_table table;
  bool stop;
};

extern struct gw_state G;

/* ---- epoll helpers (main.c) ---- */
int gw_io_add(struct gw_io *io, uint32_t events);
/* Change the interest; registers the fd when needed. */
void gw_io_set(struct gw_io *io, uint32_t events);
/* Deregister and close; io->fd becomes -1. */
void gw_io_close(struct gw_io *io);
/* Free p with fn after the current batch of events. */
void gw_defer_free(void (*fn)(void *), void *p);
uint64_t gw_now(void); /* monotonic milliseconds */
/* accept() failed for want of fds: stop watching the listener for a while
 * (level-triggered, it would be reported again and again). */
void gw_listener_pause(struct gw_io *io);

/* ---- policy helpers (main.c) ---- */
const struct gw_sandbox *gw_lookup(const struct hutch_ip *src);
/* Is the name allowed on at least one port?  (DNS answers for it.) */
bool gw_name_allowed_any_port(const struct hutch_policy *p, const char *name, struct hutch_verdict *v);
/* May the address be connected to on at least one port? */
bool gw_addr_ok_any_port(const struct hutch_policy *p, const struct hutch_ip *ip, struct hutch_verdict *v);
/* The core's address decisions, except that addresses inside a
 * --public-cidr network are judged as public ones (deny rules, "none" and
 * port 0 still apply; a direct address in a list still needs an allow rule). */
bool gw_addr_blocked(const struct hutch_policy *p, const struct hutch_ip *ip, uint16_t port, struct hutch_verdict *v);
/* hutch_policy_allow_name with the same exception for IP literals. */
bool gw_allow_name(const struct hutch_policy *p, const char *name, uint16_t port, struct hutch_verdict *v);
/* Write an audit line; -1 when it could not be written (the caller denies). */
int gw_audit(const struct gw_audit_rec *r);

/* ---- TLS (tls.c) ---- */
int gw_tls_init(const char *ca_dir, const char *upstream_ca, hutch_err *err);
/* A server-side SSL presenting a certificate for `name` (minted on the
 * first use, cached), with memory BIOs; NULL on failure. */
SSL *gw_tls_server(const char *name, void *app, hutch_err *err);
/* A client-side SSL for `name` (SNI, chain and host name verified). */
SSL *gw_tls_client(const char *name, hutch_err *err);
/* The name the server-side SSL's connection must ask for (set by conn.c). */
const char *gw_tls_expected_name(void *app);

/* ---- resolver (resolver.c) ---- */
struct gw_query;
/* status: 0 answered (res valid, rcode may be NXDOMAIN...), -1 failed (why). */
typedef void (*gw_resolve_cb)(void *arg, int status, const struct gw_dns_result *res, const char *why);
/* NULL when no query can be started (why set); cb is never called from
 * inside gw_resolve. */
struct gw_query *gw_resolve(const char *name, uint16_t qtype, gw_resolve_cb cb, void *arg, const char **why);
void gw_resolve_cancel(struct gw_query *q);
void gw_resolver_event(struct gw_io *io, uint32_t ev);
void gw_resolver_tick(uint64_t now);

/* ---- DNS responder (dnsd.c) ---- */
int gw_dnsd_init(hutch_err *err);
void gw_dnsd_event(struct gw_io *io, uint32_t ev);
void gw_dnsd_tick(uint64_t now);

/* ---- proxy connections (conn.c) ---- */
int gw_conn_init(hutch_err *err);
void gw_conn_accept(struct gw_io *listener);
void gw_conn_event(struct gw_io *io, uint32_t ev);
void gw_conn_tick(uint64_t now);
/* Close every connection from this source (its sandbox was removed). */
void gw_conn_kill_src(const struct hutch_ip *src);

/* ---- control socket (ctl.c) ---- */
int gw_ctl_init(hutch_err *err);
void gw_ctl_event(struct gw_io *io, uint32_t ev);
void gw_ctl_cleanup(void);

/* Listening sockets (main.c). */
int gw_listen_tcp(uint16_t port, hutch_err *err);
int gw_listen_udp(uint16_t port, hutch_err *err);

#endif
