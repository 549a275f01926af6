/* hutch-gateway: the only path from a sandbox to the outside (issue 8).
 *
 *   hutch-gateway --control SOCK --upstream-dns IP:PORT --audit-dir DIR
 *                 [--ca-dir DIR] [--upstream-ca FILE] [--listen-ip IP]
 *                 [--ports DNS,PROXY,HTTP,TLS] [--user NAME]
 *                 [--log-level debug|info|warn|error] [--audit-max-bytes N]
 *                 [--public-cidr CIDR]...
 *
 * --ca-dir defaults to /var/lib/hutch/gateway-ca, --upstream-ca to the
 * host's /etc/ssl/certs/ca-certificates.crt, --ports to 15353,15128,15080,15443.
 *
 * It binds its ports and the control socket, opens the audit directory,
 * loads (or creates) hutch's CA and the upstream CA bundle, then drops to
 * --user when given, and serves until SIGTERM/SIGINT.  It starts with no
 * sandbox known: every source is denied until hutchd pushes policies.
 * docs/network.md describes what it decides and how. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <dirent.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "gateway.h"

struct gw_state G = {.epfd = -1, .audit_dirfd = -1};

/* ---- epoll ---- */

int gw_io_add(struct gw_io *io, uint32_t events) {
  struct epoll_event ev = {.events = events, .data.ptr = io};
  if (epoll_ctl(G.epfd, EPOLL_CTL_ADD, io->fd, &ev) < 0) return -1;
  io->events = events | 0x80000000u; /* registered */
  return 0;
}

void gw_io_set(struct gw_io *io, uint32_t events) {
  if (io->fd < 0) return;
  if (!(io->events & 0x80000000u)) {
    (void)gw_io_add(io, events);
    return;
  }
  if ((io->events & ~0x80000000u) == events) return;
  struct epoll_event ev = {.events = events, .data.ptr = io};
  if (epoll_ctl(G.epfd, EPOLL_CTL_MOD, io->fd, &ev) == 0) io->events = events | 0x80000000u;
}

void gw_io_close(struct gw_io *io) {
  if (io->fd < 0) return;
  if (io->events & 0x80000000u) epoll_ctl(G.epfd, EPOLL_CTL_DEL, io->fd, NULL);
  close(io->fd);
  io->fd = -1;
  io->events = 0;
}

struct deferred {
  void (*fn)(void *);
  void *p;
};
static struct deferred *defer_v;
static size_t defer_n, defer_cap;

void gw_defer_free(void (*fn)(void *), void *p) {
  if (defer_n == defer_cap) {
    defer_cap = defer_cap ? defer_cap * 2 : 64;
    defer_v = xrealloc(defer_v, defer_cap * sizeof *defer_v);
  }
  defer_v[defer_n++] = (struct deferred){fn, p};
}

static void run_deferred(void) {
  for (size_t i = 0; i < defer_n; i++) defer_v[i].fn(defer_v[i].p);
  defer_n = 0;
}

uint64_t gw_now(void) { return mono_us() / 1000; }

#define MAX_PAUSED 8
static struct {
  struct gw_io *io;
  uint32_t events;
  uint64_t until;
} paused[MAX_PAUSED];

void gw_listener_pause(struct gw_io *io) {
  for (size_t i = 0; i < MAX_PAUSED; i++)
    if (paused[i].io == io) return;
  for (size_t i = 0; i < MAX_PAUSED; i++)
    if (!paused[i].io) {
      paused[i].io = io;
      paused[i].events = io->events & ~0x80000000u;
      paused[i].until = gw_now() + 500;
      gw_io_set(io, 0);
      hutch_log(LOG_WARN, "gateway.out_of_fds", "reason", "accept paused for 500 ms", NULL);
      return;
    }
}

static void resume_listeners(uint64_t now) {
  for (size_t i = 0; i < MAX_PAUSED; i++)
    if (paused[i].io && now >= paused[i].until) {
      gw_io_set(paused[i].io, paused[i].events);
      paused[i].io = NULL;
    }
}

/* ---- policy helpers ---- */

const struct gw_sandbox *gw_lookup(const struct hutch_ip *src) { return gw_table_find_addr(&G.table, src); }

/* --public-cidr: a test network (or a site's own) that stands for "the
 * internet" although its addresses are in a special range. */
static bool in_public(const struct hutch_ip *ip) {
  struct hutch_ip norm;
  hutch_ip_normalize(ip, &norm);
  for (size_t i = 0; i < G.cfg.n_public; i++)
    if (hutch_rule_match_ip(&G.cfg.public_cidr[i], ip, 1) || hutch_rule_match_ip(&G.cfg.public_cidr[i], &norm, 1))
      return true;
  return false;
}

static bool verdict(struct hutch_verdict *v, bool allow, const struct hutch_rule *r, const char *why) {
  if (v) *v = (struct hutch_verdict){.allow = allow, .rule = r, .why = why, .cls = HUTCH_ADDR_PUBLIC};
  return allow;
}

bool gw_addr_blocked(const struct hutch_policy *p, const struct hutch_ip *ip, uint16_t port, struct hutch_verdict *v) {
  if (!in_public(ip)) return hutch_addr_blocked(p, ip, port, v);
  if (!p || p->mode == HUTCH_EGRESS_NONE) return !verdict(v, false, NULL, "egress is none");
  if (port == 0) return !verdict(v, false, NULL, "port 0");
  struct hutch_ip norm;
  hutch_ip_normalize(ip, &norm);
  for (size_t i = 0; i < p->n_deny; i++)
    if (hutch_rule_match_ip(&p->deny[i], ip, port) || hutch_rule_match_ip(&p->deny[i], &norm, port))
      return !verdict(v, false, &p->deny[i], "denied by rule");
  return !verdict(v, true, NULL, "public address (--public-cidr)");
}

bool gw_allow_name(const struct hutch_policy *p, const char *name, uint16_t port, struct hutch_verdict *v) {
  struct hutch_host h;
  const char *why = NULL;
  if (!name || hutch_host_parse(name, strlen(name), &h, &why) < 0 || h.kind != HUTCH_HOST_IP || !in_public(&h.ip))
    return hutch_policy_allow_name(p, name, port, v);
  if (gw_addr_blocked(p, &h.ip, port, v)) return false;
  if (p->mode == HUTCH_EGRESS_ALL) return verdict(v, true, NULL, "egress is all");
  struct hutch_ip norm;
  hutch_ip_normalize(&h.ip, &norm);
  for (size_t i = 0; i < p->n_allow; i++)
    if (hutch_rule_match_ip(&p->allow[i], &h.ip, port) || hutch_rule_match_ip(&p->allow[i], &norm, port))
      return verdict(v, true, &p->allow[i], "allowed by rule");
  return verdict(v, false, NULL, "no rule allows this address");
}

/* Decisions for ports no rule names are all alike; so a question "on any
 * port?" needs only the ports the rules name and one other. */
static size_t candidate_ports(const struct hutch_policy *p, uint16_t *out, size_t cap) {
  size_t n = 0;
  const struct hutch_rule *lists[2] = {p ? p->allow : NULL, p ? p->deny : NULL};
  size_t counts[2] = {p ? p->n_allow : 0, p ? p->n_deny : 0};
  for (int l = 0; l < 2; l++)
    for (size_t i = 0; i < counts[l]; i++) {
      uint16_t port = lists[l][i].port;
      bool seen = port == 0;
      for (size_t k = 0; k < n && !seen; k++) seen = out[k] == port;
      if (!seen && n + 1 < cap) out[n++] = port;
    }
  for (uint16_t cand = 1; cand; cand++) {
    bool named = false;
    for (size_t k = 0; k < n && !named; k++) named = out[k] == cand;
    if (!named) {
      out[n++] = cand;
      break;
    }
  }
  return n;
}

bool gw_name_allowed_any_port(const struct hutch_policy *p, const char *name, struct hutch_verdict *v) {
  uint16_t ports[2 * HUTCH_POLICY_MAX_RULES + 2];
  size_t n = candidate_ports(p, ports, sizeof ports / sizeof *ports);
  struct hutch_verdict last = {0};
  for (size_t i = n; i-- > 0;) { /* the unnamed port first: its verdict is the general one */
    struct hutch_verdict t;
    if (gw_allow_name(p, name, ports[i], &t)) {
      if (v) *v = t;
      return true;
    }
    if (i == n - 1) last = t;
  }
  if (v) *v = last;
  return false;
}

bool gw_addr_ok_any_port(const struct hutch_policy *p, const struct hutch_ip *ip, struct hutch_verdict *v) {
  uint16_t ports[2 * HUTCH_POLICY_MAX_RULES + 2];
  size_t n = candidate_ports(p, ports, sizeof ports / sizeof *ports);
  struct hutch_verdict last = {0};
  for (size_t i = n; i-- > 0;) {
    struct hutch_verdict t;
    if (!gw_addr_blocked(p, ip, ports[i], &t)) {
      if (v) *v = t;
      return true;
    }
    if (i == n - 1) last = t;
  }
  if (v) *v = last;
  return false;
}

int gw_audit(const struct gw_audit_rec *r) {
  hutch_err err = HUTCH_ERR_INIT;
  if (gw_audit_write(G.audit_dirfd, r, G.cfg.audit_cap, &err) < 0) {
    hutch_log(LOG_ERROR, "audit.failed", "reason", err.msg, NULL);
    return -1;
  }
  return 0;
}

/* ---- sockets ---- */

int gw_listen_tcp(uint16_t port, hutch_err *err) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return hutch_err_sys(err, errno, "socket");
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr = G.cfg.listen_ip};
  if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(fd, 512) < 0) {
    int e = errno;
    close(fd);
    return hutch_err_sys(err, e, "listen on TCP port %u", port);
  }
  return fd;
}

int gw_listen_udp(uint16_t port, hutch_err *err) {
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return hutch_err_sys(err, errno, "socket");
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr = G.cfg.listen_ip};
  if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0) {
    int e = errno;
    close(fd);
    return hutch_err_sys(err, e, "bind UDP port %u", port);
  }
  return fd;
}

/* ---- setup ---- */

static int parse_ipport(const char *s, struct sockaddr_in *out) {
  const char *colon = strrchr(s, ':');
  if (!colon || colon == s) return -1;
  char ip[INET_ADDRSTRLEN];
  size_t n = (size_t)(colon - s);
  if (n >= sizeof ip) return -1;
  memcpy(ip, s, n);
  ip[n] = 0;
  struct hutch_ip hip;
  uint64_t port;
  if (hutch_ip_parse(ip, n, &hip) < 0 || hip.family != AF_INET || parse_u64(colon + 1, 65535, &port) < 0 || port == 0)
    return -1;
  memset(out, 0, sizeof *out);
  out->sin_family = AF_INET;
  out->sin_port = htons((uint16_t)port);
  memcpy(&out->sin_addr, hip.b, 4);
  return 0;
}

/* A network to judge as public.  Never one that holds loopback or a
 * metadata address, nor a huge one. */
static int parse_public(const char *s) {
  if (G.cfg.n_public >= sizeof G.cfg.public_cidr / sizeof *G.cfg.public_cidr) return -1;
  struct hutch_rule r;
  hutch_err err = HUTCH_ERR_INIT;
  if (hutch_rule_parse(s, strlen(s), "--public-cidr", &r, &err) < 0 || r.kind != HUTCH_RULE_CIDR || r.port) return -1;
  if (r.prefix < (r.net.family == AF_INET ? 8 : 16)) return -1;
  static const char *const never[] = {"127.0.0.1", "169.254.169.254", "169.254.170.2", "100.100.100.200",
                                      "168.63.129.16", "::1", "fd00:ec2::254", "::ffff:127.0.0.1", NULL};
  for (size_t i = 0; never[i]; i++) {
    struct hutch_ip ip;
    hutch_ip_parse(never[i], strlen(never[i]), &ip);
    if (hutch_rule_match_ip(&r, &ip, 1)) return -1;
  }
  enum hutch_addr_class c = hutch_addr_classify(&r.net, NULL, NULL);
  if (c == HUTCH_ADDR_LOOPBACK || c == HUTCH_ADDR_METADATA || c == HUTCH_ADDR_MULTICAST || c == HUTCH_ADDR_BROADCAST ||
      c == HUTCH_ADDR_UNSPECIFIED)
    return -1;
  G.cfg.public_cidr[G.cfg.n_public++] = r;
  return 0;
}

static int parse_ports(const char *s) {
  uint16_t v[4];
  const char *p = s;
  for (int i = 0; i < 4; i++) {
    const char *e = strchr(p, ',');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    if ((i < 3) != (e != NULL) || n == 0 || n > 5) return -1;
    char buf[8];
    memcpy(buf, p, n);
    buf[n] = 0;
    uint64_t x;
    if (parse_u64(buf, 65535, &x) < 0 || x == 0) return -1;
    v[i] = (uint16_t)x;
    p = e ? e + 1 : p + n;
  }
  G.cfg.port_dns = v[0];
  G.cfg.port_proxy = v[1];
  G.cfg.port_http = v[2];
  G.cfg.port_tls = v[3];
  return 0;
}

/* The audit directory is opened once (its fd outlives the privilege drop);
 * with --user it and the logs in it are handed to that user. */
static int open_audit_dir(uid_t uid, gid_t gid, bool chown_it, hutch_err *err) {
  if (mkdir_p(G.cfg.audit_dir, 0750, err) < 0) return hutch_err_wrap(err, "audit directory");
  int fd = open(G.cfg.audit_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return hutch_err_sys(err, errno, "open `%s`", G.cfg.audit_dir);
  G.audit_dirfd = fd;
  if (!chown_it) return 0;
  if (fchown(fd, uid, gid) < 0) return hutch_err_sys(err, errno, "chown `%s`", G.cfg.audit_dir);
  int dfd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (dfd < 0) return hutch_err_sys(err, errno, "dup");
  DIR *d = fdopendir(dfd);
  if (!d) {
    close(dfd);
    return hutch_err_sys(err, errno, "read `%s`", G.cfg.audit_dir);
  }
  struct dirent *de;
  size_t seen = 0;
  while ((de = readdir(d)) && seen++ < 100000) {
    size_t n = strlen(de->d_name);
    bool log = (n > 6 && !strcmp(de->d_name + n - 6, ".jsonl")) || (n > 8 && !strcmp(de->d_name + n - 8, ".jsonl.1"));
    if (log) (void)fchownat(fd, de->d_name, uid, gid, AT_SYMLINK_NOFOLLOW);
  }
  closedir(d);
  return 0;
}

static int drop_privileges(uid_t uid, gid_t gid, hutch_err *err) {
  if (setgroups(1, &gid) < 0) return hutch_err_sys(err, errno, "setgroups");
  if (setresgid(gid, gid, gid) < 0) return hutch_err_sys(err, errno, "setresgid");
  if (setresuid(uid, uid, uid) < 0) return hutch_err_sys(err, errno, "setresuid");
  if (uid != 0 && (setuid(0) == 0 || seteuid(0) == 0)) return hutch_err_sys(err, 0, "privileges could be regained");
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) return hutch_err_sys(err, errno, "no_new_privs");
  /* Other processes of the same user must not read the CA key out of our
   * memory (ptrace, /proc/PID/mem). */
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0) return hutch_err_sys(err, errno, "PR_SET_DUMPABLE");
  return 0;
}

static void usage(void) {
  fprintf(stderr,
          "usage: hutch-gateway --control SOCK --upstream-dns IP:PORT --audit-dir DIR\n"
          "                     [--ca-dir DIR] [--upstream-ca FILE] [--listen-ip IP]\n"
          "                     [--ports DNS,PROXY,HTTP,TLS] [--user NAME] [--log-level LEVEL]\n"
          "                     [--audit-max-bytes N] [--public-cidr CIDR]...\n");
}

int main(int argc, char **argv) {
  G.cfg.upstream_ca = "/etc/ssl/certs/ca-certificates.crt";
  G.cfg.port_dns = 15353;
  G.cfg.port_proxy = 15128;
  G.cfg.port_http = 15080;
  G.cfg.port_tls = 15443;
  G.cfg.audit_cap = GW_AUDIT_CAP_DEFAULT;
  G.cfg.listen_ip.s_addr = htonl(INADDR_ANY);
  bool have_dns = false;
  static const struct option opts[] = {
      {"control", required_argument, NULL, 'c'},   {"upstream-dns", required_argument, NULL, 'd'},
      {"audit-dir", required_argument, NULL, 'a'}, {"ca-dir", required_argument, NULL, 'C'},
      {"upstream-ca", required_argument, NULL, 'u'}, {"listen-ip", required_argument, NULL, 'l'},
      {"ports", required_argument, NULL, 'p'},     {"user", required_argument, NULL, 'U'},
      {"log-level", required_argument, NULL, 'L'}, {"audit-max-bytes", required_argument, NULL, 'M'},
      {"public-cidr", required_argument, NULL, 'P'},
      {"help", no_argument, NULL, 'h'},            {NULL, 0, NULL, 0},
  };
  int o;
  while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (o) {
    case 'c': G.cfg.control = optarg; break;
    case 'd':
      if (parse_ipport(optarg, &G.cfg.upstream_dns) < 0) {
        fprintf(stderr, "hutch-gateway: --upstream-dns: expected IPv4:PORT\n");
        return 2;
      }
      have_dns = true;
      break;
    case 'a': G.cfg.audit_dir = optarg; break;
    case 'C': G.cfg.ca_dir = optarg; break;
    case 'u': G.cfg.upstream_ca = optarg; break;
    case 'l': {
      struct hutch_ip ip;
      if (hutch_ip_parse(optarg, strlen(optarg), &ip) < 0 || ip.family != AF_INET) {
        fprintf(stderr, "hutch-gateway: --listen-ip: expected an IPv4 address\n");
        return 2;
      }
      memcpy(&G.cfg.listen_ip, ip.b, 4);
      break;
    }
    case 'p':
      if (parse_ports(optarg) < 0) {
        fprintf(stderr, "hutch-gateway: --ports: expected DNS,PROXY,HTTP,TLS (four ports)\n");
        return 2;
      }
      break;
    case 'U': G.cfg.user = optarg; break;
    case 'L':
      if (!strcmp(optarg, "debug")) hutch_log_set_level(LOG_DEBUG);
      else if (!strcmp(optarg, "info")) hutch_log_set_level(LOG_INFO);
      else if (!strcmp(optarg, "warn")) hutch_log_set_level(LOG_WARN);
      else if (!strcmp(optarg, "error")) hutch_log_set_level(LOG_ERROR);
      else {
        fprintf(stderr, "hutch-gateway: --log-level: debug, info, warn or error\n");
        return 2;
      }
      break;
    case 'M': {
      uint64_t v;
      if (parse_u64(optarg, 1ull << 40, &v) < 0 || v < 4096) {
        fprintf(stderr, "hutch-gateway: --audit-max-bytes: at least 4096\n");
        return 2;
      }
      G.cfg.audit_cap = (size_t)v;
      break;
    }
    case 'P':
      if (parse_public(optarg) < 0) {
        fprintf(stderr, "hutch-gateway: --public-cidr `%s`: a CIDR (at least /8, IPv6 /16) that holds no loopback, "
                        "metadata or multicast address; at most 16\n", optarg);
        return 2;
      }
      break;
    case 'h': usage(); return 0;
    default: usage(); return 2;
    }
  }
  if (!G.cfg.control || !have_dns || !G.cfg.audit_dir || optind != argc) {
    usage();
    return 2;
  }
  if (!G.cfg.ca_dir) G.cfg.ca_dir = "/var/lib/hutch/gateway-ca";
  hutch_log_set_component("gateway");
  signal(SIGPIPE, SIG_IGN);

  /* Every fd a long-lived proxy may hold. */
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max && rl.rlim_cur < 16384) {
    rl.rlim_cur = rl.rlim_max < 16384 ? rl.rlim_max : 16384;
    setrlimit(RLIMIT_NOFILE, &rl);
  }

  hutch_err err = HUTCH_ERR_INIT;
  uid_t uid = geteuid();
  gid_t gid = getegid();
  if (G.cfg.user) {
    struct passwd *pw = getpwnam(G.cfg.user);
    if (!pw) {
      fprintf(stderr, "hutch-gateway: --user: no user `%s`\n", G.cfg.user);
      return 1;
    }
    uid = pw->pw_uid;
    gid = pw->pw_gid;
  }
  bool dropping = G.cfg.user && uid != geteuid();
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGHUP);
  sigprocmask(SIG_BLOCK, &mask, NULL);
  G.epfd = epoll_create1(EPOLL_CLOEXEC);
  int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  struct gw_io sig_io = {.kind = IO_SIGNAL, .fd = sfd};
  gw_table_init(&G.table);
  if (G.epfd < 0 || sfd < 0 || gw_io_add(&sig_io, EPOLLIN) < 0) {
    hutch_err_sys(&err, errno, "epoll/signalfd");
  } else if (open_audit_dir(uid, gid, dropping, &err) < 0 || gw_tls_init(G.cfg.ca_dir, G.cfg.upstream_ca, &err) < 0 ||
             gw_ctl_init(&err) < 0 || gw_dnsd_init(&err) < 0 || gw_conn_init(&err) < 0 ||
             (dropping && drop_privileges(uid, gid, &err) < 0)) {
    /* err says which */
  } else {
    err.msg[0] = 0;
  }
  if (err.msg[0]) {
    hutch_log(LOG_ERROR, "gateway.start_failed", "reason", err.msg, NULL);
    fprintf(stderr, "hutch-gateway: %s\n", err.msg);
    gw_ctl_cleanup();
    return 1;
  }
  {
    char ports[64], u[32];
    snprintf(ports, sizeof ports, "%u,%u,%u,%u", G.cfg.port_dns, G.cfg.port_proxy, G.cfg.port_http, G.cfg.port_tls);
    snprintf(u, sizeof u, "%u", (unsigned)geteuid());
    hutch_log(LOG_INFO, "gateway.started", "ports", ports, "uid", u, "control", G.cfg.control, NULL);
  }

  struct epoll_event evs[256];
  uint64_t last_tick = 0;
  while (!G.stop) {
    int n = epoll_wait(G.epfd, evs, 256, 250);
    if (n < 0 && errno != EINTR) {
      hutch_log(LOG_ERROR, "gateway.epoll_failed", "reason", strerror(errno), NULL);
      break;
    }
    for (int i = 0; i < n; i++) {
      struct gw_io *io = evs[i].data.ptr;
      uint32_t ev = evs[i].events;
      switch (io->kind) {
      case IO_LISTEN_PROXY:
      case IO_LISTEN_HTTP:
      case IO_LISTEN_TLS: gw_conn_accept(io); break;
      case IO_CONN_CLIENT:
      case IO_CONN_UP: gw_conn_event(io, ev); break;
      case IO_DNS_UDP:
      case IO_DNS_TCP_LISTEN:
      case IO_DNS_TCP: gw_dnsd_event(io, ev); break;
      case IO_CTL_LISTEN:
      case IO_CTL: gw_ctl_event(io, ev); break;
      case IO_RES: gw_resolver_event(io, ev); break;
      case IO_SIGNAL: {
        struct signalfd_siginfo si;
        while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si)
          if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT) G.stop = true;
        break;
      }
      }
    }
    run_deferred();
    uint64_t now = gw_now();
    if (now - last_tick >= 250) {
      last_tick = now;
      resume_listeners(now);
      gw_resolver_tick(now);
      gw_dnsd_tick(now);
      gw_conn_tick(now);
      run_deferred();
    }
  }
  hutch_log(LOG_INFO, "gateway.exit", NULL);
  gw_ctl_cleanup();
  return 0;
}
