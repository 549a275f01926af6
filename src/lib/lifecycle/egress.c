#include "lifecycle/egress.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "isolate/nft.h"
#include "isolate/veth.h"
#include "net/policy.h"
#include "store/template.h"

/* ---- policy ---------------------------------------------------------------- */

int hutch_egress_parse(json_t *network, json_t **out, hutch_err *err) {
  *out = NULL;
  if (!network || json_is_null(network)) {
    *out = json_pack("{s:s}", "egress", "none");
    return 0;
  }
  if (!json_is_object(network)) return hutch_err_invalid(err, "field `network`: expected an object");
  const char *k;
  json_t *v;
  json_object_foreach(network, k, v) {
    if (strcmp(k, "egress")) return hutch_err_invalid(err, "field `network.%s`: unknown field", k);
  }
  json_t *eg = json_object_get(network, "egress");
  struct hutch_policy *p = NULL;
  if (!eg) {
    p = hutch_policy_none();
  } else if (hutch_policy_parse(eg, "network.egress", &p, err) < 0) {
    return -1;
  }
  *out = json_pack("{s:o}", "egress", hutch_policy_to_json(p));
  hutch_policy_free(p);
  return 0;
}

static json_t *policy_of(const struct hutch_sandbox_rec *r) {
  json_error_t je;
  json_t *req = json_loads(r->request, 0, &je);
  json_t *eg = json_incref(json_object_get(json_object_get(req, "network"), "egress"));
  json_decref(req);
  return eg;
}

bool hutch_egress_wanted_json(json_t *network) {
  json_t *eg = json_object_get(network, "egress");
  return eg && !(json_is_string(eg) && !strcmp(json_string_value(eg), "none"));
}

bool hutch_egress_wanted(const struct hutch_sandbox_rec *r) {
  json_t *eg = policy_of(r);
  bool want = eg && !(json_is_string(eg) && !strcmp(json_string_value(eg), "none"));
  json_decref(eg);
  return want;
}

/* ---- the gateway process ------------------------------------------------------- */

static char *control_path(struct hutch_ctx *ctx) { return xasprintf("%s/gateway.sock", ctx->cfg.run_dir); }
static char *audit_dir(struct hutch_ctx *ctx) { return xasprintf("%s/egress", ctx->cfg.data_dir); }
static char *ca_dir(struct hutch_ctx *ctx) { return xasprintf("%s/gateway-ca", ctx->cfg.data_dir); }

/* One request, one answer line: the control protocol is tiny and rare. */
static int control_call(struct hutch_ctx *ctx, json_t *req, hutch_err *err) {
  cleanup_free char *path = control_path(ctx);
  cleanup_close int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return hutch_err_sys(err, errno, "socket");
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof a.sun_path) return hutch_err_sys(err, ENAMETOOLONG, "gateway socket `%s`", path);
  memcpy(a.sun_path, path, strlen(path) + 1);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) return hutch_err_sys(err, errno, "connect to the gateway");
  struct timeval tv = {.tv_sec = 5};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  cleanup_free char *line = json_dumps(req, JSON_COMPACT);
  cleanup_free char *msg = xasprintf("%s\n", line);
  if (write_full(fd, msg, strlen(msg)) < 0) return hutch_err_sys(err, errno, "write to the gateway");
  char buf[4096];
  size_t n = 0;
  while (n < sizeof buf - 1) {
    ssize_t r = read(fd, buf + n, sizeof buf - 1 - n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    n += (size_t)r;
    if (memchr(buf, '\n', n)) break;
  }
  buf[n] = 0;
  json_error_t je;
  json_t *ans = json_loads(buf, JSON_DISABLE_EOF_CHECK, &je);
  bool ok = json_is_true(json_object_get(ans, "ok"));
  if (!ok)
    hutch_err_sys(err, EPROTO, "the gateway refused: %s",
                  ans ? (json_string_value(json_object_get(ans, "error")) ?: "no reason") : "no answer");
  json_decref(ans);
  return ok ? 0 : -1;
}

/* Alive: its control socket accepts a connection (it serves nothing else). */
static bool gateway_alive(struct hutch_ctx *ctx) {
  cleanup_free char *path = control_path(ctx);
  cleanup_close int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof a.sun_path) return false;
  memcpy(a.sun_path, path, strlen(path) + 1);
  return connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
}

static int spawn_gateway(struct hutch_ctx *ctx, hutch_err *err) {
  cleanup_free char *bin = xasprintf("%s/hutch-gateway", ctx->cfg.libexec_dir);
  cleanup_free char *sock = control_path(ctx);
  cleanup_free char *audit = audit_dir(ctx);
  cleanup_free char *ca = ca_dir(ctx);
  cleanup_free char *log = xasprintf("%s/gateway.log", ctx->cfg.data_dir);
  cleanup_free char *ports = xasprintf("%u,%u,%u,%u", ctx->egress_ports[0], ctx->egress_ports[1],
                                       ctx->egress_ports[2], ctx->egress_ports[3]);
  if (mkdir_p(audit, 0700, err) < 0 || mkdir_p(ca, 0700, err) < 0) return -1;
  /* The gateway drops to `nobody` after binding: it must still write the
   * audit log (the CA is read before the drop). */
  struct passwd *pw = getpwnam("nobody");
  if (pw && chown(audit, pw->pw_uid, pw->pw_gid) < 0) return hutch_err_sys(err, errno, "chown `%s`", audit);
  unlink(sock);
  const char *argv[20];
  size_t a = 0;
  argv[a++] = bin;
  argv[a++] = "--control";
  argv[a++] = sock;
  argv[a++] = "--upstream-dns";
  argv[a++] = ctx->cfg.gateway_dns;
  argv[a++] = "--audit-dir";
  argv[a++] = audit;
  argv[a++] = "--ca-dir";
  argv[a++] = ca;
  argv[a++] = "--ports";
  argv[a++] = ports;
  if (ctx->cfg.gateway_upstream_ca) {
    argv[a++] = "--upstream-ca";
    argv[a++] = ctx->cfg.gateway_upstream_ca;
  }
  if (ctx->cfg.gateway_public_cidr) {
    argv[a++] = "--public-cidr";
    argv[a++] = ctx->cfg.gateway_public_cidr;
  }
  if (pw) {
    argv[a++] = "--user";
    argv[a++] = "nobody";
  }
  argv[a] = NULL;
  cleanup_close int logfd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (logfd < 0) return hutch_err_sys(err, errno, "open `%s`", log);
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t at;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&at);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&at, &none);
  posix_spawnattr_setsigdefault(&at, &all);
  /* Its own session: like the shims it outlives hutchd, so sandboxes keep
   * their egress across a hutchd restart. */
  posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, logfd, 1);
  posix_spawn_file_actions_adddup2(&fa, logfd, 2);
  char *const envp[] = {(char *)"PATH=/usr/sbin:/usr/bin:/sbin:/bin", NULL};
  pid_t pid;
  int rc = posix_spawn(&pid, bin, &fa, &at, (char *const *)argv, envp);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  if (rc != 0) return hutch_err_sys(err, rc, "start `%s`", bin);
  for (int i = 0; i < 200; i++) {
    if (gateway_alive(ctx)) {
      char p[16];
      snprintf(p, sizeof p, "%d", (int)pid);
      cleanup_free char *pidf = xasprintf("%s/gateway.pid", ctx->cfg.run_dir);
      hutch_err pe = HUTCH_ERR_INIT;
      write_file(pidf, p, strlen(p), 0600, &pe);
      hutch_log(LOG_INFO, "gateway.started", "pid", p, "ports", ports, NULL);
      return 0;
    }
    usleep(25000);
  }
  kill(pid, SIGKILL);
  return hutch_err_sys(err, ETIMEDOUT, "hutch-gateway did not answer on `%s` (see %s)", sock, log);
}

static int push(struct hutch_ctx *ctx, const struct hutch_sandbox_rec *r, hutch_err *err) {
  if (r->uid_slot < 0) return 0;
  uint32_t host, sb;
  if (hutch_egress_addr((uint32_t)r->uid_slot, &host, &sb) < 0)
    return hutch_err_sys(err, ERANGE, "no egress address for slot %lld", (long long)r->uid_slot);
  char ip[INET_ADDRSTRLEN];
  struct in_addr ia = {.s_addr = sb};
  inet_ntop(AF_INET, &ia, ip, sizeof ip);
  json_t *pol = policy_of(r);
  json_t *req = json_pack("{s:s, s:s, s:s, s:o}", "op", "set", "sandbox", r->id, "addr", ip, "policy",
                          pol ? pol : json_string("none"));
  int rc = control_call(ctx, req, err);
  json_decref(req);
  return rc;
}

/* Every sandbox that runs with egress, again (a gateway that restarted
 * knows nothing: everything is denied until this). */
static void push_all(struct hutch_ctx *ctx) {
  struct hutch_sandbox_rec *v = NULL;
  size_t n = 0;
  hutch_err err = HUTCH_ERR_INIT;
  if (hutch_db_sandbox_list(ctx->db, NULL, &v, &n, &err) < 0) return;
  for (size_t i = 0; i < n; i++) {
    bool live = !strcmp(v[i].state, "running") || !strcmp(v[i].state, "paused");
    hutch_err e = HUTCH_ERR_INIT;
    if (live && hutch_egress_wanted(&v[i]) && push(ctx, &v[i], &e) < 0)
      hutch_log(LOG_WARN, "gateway.push_failed", "id", v[i].id, "reason", e.msg, NULL);
    hutch_sandbox_rec_free(&v[i]);
  }
  free(v);
}

/* The ruleset and the gateway, made when the first sandbox with a way out
 * needs them (most hutchd never do), or at start when one exists. */
static pthread_mutex_t ensure_mu = PTHREAD_MUTEX_INITIALIZER;

static int ensure(struct hutch_ctx *ctx, hutch_err *err) {
  pthread_mutex_lock(&ensure_mu);
  int rc = 0;
  if (!ctx->egress_ready) {
    struct hutch_nft_ports ports = {.dns = (uint16_t)ctx->egress_ports[0], .proxy = (uint16_t)ctx->egress_ports[1],
                                    .http = (uint16_t)ctx->egress_ports[2], .tls = (uint16_t)ctx->egress_ports[3]};
    if (hutch_nft_setup(ctx->instance, &ports, err) < 0) rc = hutch_err_wrap(err, "egress ruleset");
    else if (!gateway_alive(ctx) && spawn_gateway(ctx, err) < 0) rc = hutch_err_wrap(err, "egress gateway");
    else ctx->egress_ready = true;
  }
  pthread_mutex_unlock(&ensure_mu);
  return rc;
}

int hutch_egress_start(struct hutch_ctx *ctx, hutch_err *err) {
  if (!ctx->cfg.egress) return 0;
  /* Ports from the instance name: two hutchd on one host do not collide. */
  uint32_t h = (uint32_t)strtoul(ctx->instance + 6, NULL, 16);
  uint32_t base = 20000 + (h % 9000) * 4;
  for (int i = 0; i < 4; i++) ctx->egress_ports[i] = base + (uint32_t)i;
  if (!ctx->cfg.gateway_dns) {
    /* The host's first resolver. */
    hutch_err e = HUTCH_ERR_INIT;
    cleanup_free char *rc = read_file("/etc/resolv.conf", 1 << 16, NULL, &e);
    char ns[64] = "";
    for (char *l = rc ? strtok(rc, "\n") : NULL; l; l = strtok(NULL, "\n"))
      if (sscanf(l, "nameserver %63s", ns) == 1) break;
    ctx->cfg.gateway_dns = xasprintf("%s:53", ns[0] ? ns : "127.0.0.1");
  }
  /* Sandboxes with a way out from before a restart: the gateway (which
   * outlives hutchd) gets their policies again. */
  struct hutch_sandbox_rec *v = NULL;
  size_t n = 0;
  bool any = gateway_alive(ctx);
  if (hutch_db_sandbox_list(ctx->db, NULL, &v, &n, err) < 0) return -1;
  for (size_t i = 0; i < n; i++) {
    if (hutch_egress_wanted(&v[i])) any = true;
    hutch_sandbox_rec_free(&v[i]);
  }
  free(v);
  if (!any) return 0;
  if (ensure(ctx, err) < 0) return -1;
  push_all(ctx);
  return 0;
}

void hutch_egress_stop(struct hutch_ctx *ctx) {
  /* The gateway outlives hutchd, like the shims, while sandboxes may need
   * it; with none left, it and the ruleset go. */
  if (!ctx->cfg.egress || !ctx->egress_ready || hutch_db_sandbox_count(ctx->db) != 0) return;
  cleanup_free char *pidf = xasprintf("%s/gateway.pid", ctx->cfg.run_dir);
  hutch_err e = HUTCH_ERR_INIT;
  cleanup_free char *pid = read_file(pidf, 32, NULL, &e);
  if (pid && atoi(pid) > 0) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/cmdline", atoi(pid));
    cleanup_free char *cmd = read_file(path, 8192, NULL, &e);
    cleanup_free char *sock = control_path(ctx);
    /* Only if that pid is still our gateway. */
    bool ours = false;
    if (cmd) {
      for (size_t i = 0; i + 1 < 8192 && (cmd[i] || cmd[i + 1]); i++)
        if (!cmd[i]) cmd[i] = ' ';
      ours = strstr(cmd, "hutch-gateway") && strstr(cmd, sock);
    }
    if (ours) kill(atoi(pid), SIGTERM);
  }
  unlink(pidf);
  hutch_nft_teardown(ctx->instance, &e);
}

void hutch_egress_tick(struct hutch_ctx *ctx) {
  if (!ctx->cfg.egress || !ctx->egress_ready || gateway_alive(ctx)) return;
  hutch_err err = HUTCH_ERR_INIT;
  hutch_log(LOG_WARN, "gateway.lost", "action", "restart", NULL);
  if (spawn_gateway(ctx, &err) < 0) {
    hutch_log(LOG_ERROR, "gateway.restart_failed", "reason", err.msg, NULL);
    return;
  }
  push_all(ctx);
}

/* ---- a sandbox's way out ---------------------------------------------------------- */

static int write_guest_files(struct hutch_ctx *ctx, const struct hutch_sandbox_rec *r, uint32_t host_be,
                             hutch_err *err) {
  char ip[INET_ADDRSTRLEN];
  struct in_addr ia = {.s_addr = host_be};
  inet_ntop(AF_INET, &ia, ip, sizeof ip);
  cleanup_free char *resolv = xasprintf("# hutch: DNS through the egress gateway\nnameserver %s\n", ip);
  if (hutch_rootfs_write(&ctx->pool, r->id, "etc/resolv.conf", resolv, false, err) < 0) return -1;
  /* hutch's CA, so that TLS the gateway terminates verifies inside. */
  cleanup_free char *ca_path = xasprintf("%s/gateway-ca/ca.crt", ctx->cfg.data_dir);
  hutch_err e2 = HUTCH_ERR_INIT;
  cleanup_free char *ca = read_file(ca_path, 1 << 16, NULL, &e2);
  if (ca) {
    if (hutch_rootfs_write(&ctx->pool, r->id, "usr/local/share/ca-certificates/hutch-egress.crt", ca, false, &e2) <
        0)
      hutch_log(LOG_DEBUG, "egress.ca_copy", "id", r->id, "reason", e2.msg, NULL);
    if (hutch_rootfs_write(&ctx->pool, r->id, "etc/ssl/certs/ca-certificates.crt", ca, true, &e2) < 0)
      hutch_log(LOG_DEBUG, "egress.ca_bundle", "id", r->id, "reason", e2.msg, NULL);
  }
  return 0;
}

int hutch_egress_up(struct hutch_ctx *ctx, const struct hutch_sandbox_rec *r, hutch_err *err) {
  if (!hutch_egress_wanted(r)) return 0;
  if (!ctx->cfg.egress)
    return hutch_err_set(err, 409, "conflict", "egress is turned off on this hutchd (--no-egress)");
  if (ensure(ctx, err) < 0) return -1;
  if (r->uid_slot < 0 || r->init_pid <= 0) return hutch_err_sys(err, EINVAL, "sandbox `%s` is not running", r->id);
  uint32_t host, sb;
  char ifname[16];
  if (hutch_egress_addr((uint32_t)r->uid_slot, &host, &sb) < 0)
    return hutch_err_sys(err, ERANGE, "no egress address for slot %lld", (long long)r->uid_slot);
  hutch_egress_ifname((uint32_t)r->uid_slot, ifname);
  /* The set elements first (they match by name): the interface is never up
   * without its filter. */
  if (hutch_nft_add_sandbox(ctx->instance, ifname, sb, err) < 0 ||
      hutch_veth_create((uint32_t)r->uid_slot, (pid_t)r->init_pid, err) < 0 || push(ctx, r, err) < 0 ||
      write_guest_files(ctx, r, host, err) < 0) {
    hutch_egress_down(ctx, r);
    return hutch_err_wrap(err, "egress");
  }
  return 0;
}

void hutch_egress_down(struct hutch_ctx *ctx, const struct hutch_sandbox_rec *r) {
  if (!ctx->cfg.egress || !ctx->egress_ready || r->uid_slot < 0) return;
  hutch_err e = HUTCH_ERR_INIT;
  uint32_t host, sb;
  char ifname[16];
  if (hutch_egress_addr((uint32_t)r->uid_slot, &host, &sb) < 0) return;
  hutch_egress_ifname((uint32_t)r->uid_slot, ifname);
  json_t *req = json_pack("{s:s, s:s}", "op", "remove", "sandbox", r->id);
  control_call(ctx, req, &e);
  json_decref(req);
  hutch_nft_del_sandbox(ctx->instance, ifname, sb, &e);
  hutch_veth_delete((uint32_t)r->uid_slot, &e);
}

int hutch_egress_update(struct hutch_ctx *ctx, const struct hutch_sandbox_rec *r, hutch_err *err) {
  bool live = !strcmp(r->state, "running") || !strcmp(r->state, "paused");
  if (!live || !ctx->cfg.egress) return 0;
  char ifname[16];
  hutch_egress_ifname((uint32_t)(r->uid_slot < 0 ? 0 : r->uid_slot), ifname);
  cleanup_free char *sys = xasprintf("/sys/class/net/%s", ifname);
  bool has_veth = access(sys, F_OK) == 0;
  if (!hutch_egress_wanted(r)) {
    hutch_egress_down(ctx, r);
    return 0;
  }
  if (!has_veth) return hutch_egress_up(ctx, r, err);
  return push(ctx, r, err);
}

json_t *hutch_egress_audit(struct hutch_ctx *ctx, const char *sb_id, size_t limit, hutch_err *err) {
  cleanup_free char *dir = audit_dir(ctx);
  cleanup_free char *path = xasprintf("%s/%s.jsonl", dir, sb_id);
  json_t *arr = json_array();
  size_t len = 0;
  hutch_err e2 = HUTCH_ERR_INIT;
  /* The newest lines: the file is capped by the gateway (rotated at 10 MiB). */
  cleanup_free char *text = read_file(path, 16u << 20, &len, &e2);
  if (!text) {
    if (e2.errnum == ENOENT) return arr;
    json_decref(arr);
    *err = e2;
    return NULL;
  }
  size_t lines = 0;
  for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
  size_t skip = lines > limit ? lines - limit : 0, seen = 0;
  for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
    if (seen++ < skip) continue;
    json_error_t je;
    json_t *o = json_loads(l, 0, &je);
    if (json_is_object(o)) json_array_append_new(arr, o);
    else json_decref(o);
  }
  return arr;
}
