/* hutchd: the hutch daemon.  Thin: options, then the library does the work
 * (lifecycle/daemon.c for state and operations, api/ for HTTP). */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/api.h"
#include "common/log.h"
#include "common/util.h"
#include "lifecycle/daemon.h"
#include "runtime/runtime.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: hutchd [OPTIONS]\n"
          "  --data-dir DIR      state, templates, sandboxes (default /var/lib/hutch)\n"
          "  --socket PATH       API unix socket (default /run/hutch/hutchd.sock)\n"
          "  --listen HOST:PORT  also listen on TCP (requires API keys)\n"
          "  --run-dir DIR       shim sockets (default /run/hutch/<instance>)\n"
          "  --uid-lock-dir DIR  host-wide uid range claims (default /run/hutch/uids)\n"
          "  --libexec-dir DIR   where hutch-shim and hutch-init are (default: next to hutchd)\n"
          "  --workers N         lifecycle worker threads (default 4)\n"
          "  --max-body BYTES    request body limit (default 1048576)\n"
          "  --pool N            keep N sandboxes of the default shape ready (default 0)\n"
          "  --output-buffer B   ring buffer per command output stream (default 1048576)\n"
          "  --attach-token-ttl S  lifetime of attach tokens in seconds (default 900)\n"
          "  --pool-template T   template of the warm pool (default host)\n"
          "  --storage B         storage backend: auto|btrfs|overlay (default auto: btrfs, else overlay)\n"
          "  --storage-size SIZE size of the pool image hutchd makes, e.g. 64G (default 80%% of free\n"
          "                      space, at most 1T); a larger size grows an existing image\n"
          "  --storage-quota Q   per-sandbox disk limits: auto|on|off (default auto: on for hutchd's image)\n"
          "  --max-fork N        most sandboxes one fork call makes (default 100)\n"
          "  --no-egress         no sandbox gets a way out, whatever its network.egress (default:\n"
          "                      hutch-gateway starts when the first sandbox needs it; docs/network.md)\n"
          "  --gateway-dns IP:PORT  the resolver the gateway uses (default: the host's first)\n"
          "  --gateway-upstream-ca FILE  CA bundle for upstream TLS (default: the host's)\n"
          "  --gateway-public-cidr CIDR  a private range the gateway treats as public (test networks)\n"
          "  --runsc PATH        the gvisor runtime's runsc (default: runsc from PATH)\n"
          "  --runsc-platform P  ptrace|kvm|systrap (default ptrace; kvm is faster where runsc's kvm works)\n"
          "  --log-level LEVEL   debug|info|warn|error (default info)\n"
          "  --version\n");
}

static char *self_dir(void) {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return xstrdup(".");
  buf[n] = 0;
  char *slash = strrchr(buf, '/');
  if (slash) *slash = 0;
  return xstrdup(buf);
}

int main(int argc, char **argv) {
  struct hutch_ctx ctx;
  memset(&ctx, 0, sizeof ctx);
  hutch_config_defaults(&ctx.cfg);
  static const struct option opts[] = {
      {"data-dir", required_argument, NULL, 'd'},   {"socket", required_argument, NULL, 's'},
      {"listen", required_argument, NULL, 'l'},     {"run-dir", required_argument, NULL, 'r'},
      {"uid-lock-dir", required_argument, NULL, 'u'}, {"libexec-dir", required_argument, NULL, 'x'},
      {"workers", required_argument, NULL, 'w'},    {"max-body", required_argument, NULL, 'b'},
      {"log-level", required_argument, NULL, 'L'},  {"pool", required_argument, NULL, 'p'},
      {"pool-template", required_argument, NULL, 'P'}, {"output-buffer", required_argument, NULL, 'O'},
      {"attach-token-ttl", required_argument, NULL, 'T'}, {"fault-points", no_argument, NULL, 'F'},  {"version", no_argument, NULL, 'V'},
      {"storage", required_argument, NULL, 'S'},   {"storage-size", required_argument, NULL, 'Z'},
      {"storage-quota", required_argument, NULL, 'Q'}, {"max-fork", required_argument, NULL, 'K'},
      {"runsc", required_argument, NULL, 'R'},      {"runsc-platform", required_argument, NULL, 'G'},
      {"egress", no_argument, NULL, 'E'},           {"no-egress", no_argument, NULL, 'N'},           {"gateway-dns", required_argument, NULL, 'D'},
      {"gateway-upstream-ca", required_argument, NULL, 'C'},
      {"gateway-public-cidr", required_argument, NULL, 'Y'},
      {"help", no_argument, NULL, 'h'},             {NULL, 0, NULL, 0},
  };
  int o;
  uint64_t n;
  while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (o) {
      case 'd': free(ctx.cfg.data_dir), ctx.cfg.data_dir = xstrdup(optarg); break;
      case 's': free(ctx.cfg.socket_path), ctx.cfg.socket_path = xstrdup(optarg); break;
      case 'l': free(ctx.cfg.listen_addr), ctx.cfg.listen_addr = xstrdup(optarg); break;
      case 'r': free(ctx.cfg.run_dir), ctx.cfg.run_dir = xstrdup(optarg); break;
      case 'u': free(ctx.cfg.uid_lock_dir), ctx.cfg.uid_lock_dir = xstrdup(optarg); break;
      case 'x': free(ctx.cfg.libexec_dir), ctx.cfg.libexec_dir = xstrdup(optarg); break;
      case 'w':
        if (parse_u64(optarg, 64, &n) < 0 || n == 0) return fprintf(stderr, "hutchd: --workers: 1..64\n"), 2;
        ctx.cfg.workers = (int)n;
        break;
      case 'b':
        if (parse_u64(optarg, 1u << 30, &n) < 0 || n < 1024) return fprintf(stderr, "hutchd: --max-body: 1024..1GiB\n"), 2;
        ctx.cfg.max_body = (size_t)n;
        break;
      case 'L':
        if (!strcmp(optarg, "debug")) hutch_log_set_level(LOG_DEBUG);
        else if (!strcmp(optarg, "info")) hutch_log_set_level(LOG_INFO);
        else if (!strcmp(optarg, "warn")) hutch_log_set_level(LOG_WARN);
        else if (!strcmp(optarg, "error")) hutch_log_set_level(LOG_ERROR);
        else return fprintf(stderr, "hutchd: --log-level: debug|info|warn|error\n"), 2;
        break;
      case 'p':
        if (parse_u64(optarg, 1024, &n) < 0) return fprintf(stderr, "hutchd: --pool: 0..1024\n"), 2;
        ctx.cfg.pool_size = (uint32_t)n;
        break;
      case 'P': free(ctx.cfg.pool_template), ctx.cfg.pool_template = xstrdup(optarg); break;
      case 'O':
        if (parse_u64(optarg, 1u << 30, &n) < 0 || n < 4096)
          return fprintf(stderr, "hutchd: --output-buffer: 4096..1GiB\n"), 2;
        ctx.cfg.output_buffer = (size_t)n;
        break;
      case 'T':
        if (parse_u64(optarg, 7 * 24 * 3600, &n) < 0 || n < 10)
          return fprintf(stderr, "hutchd: --attach-token-ttl: 10..604800\n"), 2;
        ctx.cfg.attach_token_ttl_s = (uint32_t)n;
        break;
      case 'S':
        if (strcmp(optarg, "auto") && strcmp(optarg, "btrfs") && strcmp(optarg, "overlay"))
          return fprintf(stderr, "hutchd: --storage: auto|btrfs|overlay\n"), 2;
        free(ctx.cfg.storage_backend), ctx.cfg.storage_backend = xstrdup(optarg);
        break;
      case 'Q':
        if (strcmp(optarg, "auto") && strcmp(optarg, "on") && strcmp(optarg, "off"))
          return fprintf(stderr, "hutchd: --storage-quota: auto|on|off\n"), 2;
        free(ctx.cfg.storage_quota), ctx.cfg.storage_quota = xstrdup(optarg);
        break;
      case 'Z': {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(optarg, &end, 10);
        unsigned shift = 0;
        if (*end == 'K' || *end == 'k') shift = 10, end++;
        else if (*end == 'M' || *end == 'm') shift = 20, end++;
        else if (*end == 'G' || *end == 'g') shift = 30, end++;
        else if (*end == 'T' || *end == 't') shift = 40, end++;
        if (errno || end == optarg || *end || v == 0 || v > (1ull << 50) >> shift || (v << shift) < (256ull << 20))
          return fprintf(stderr, "hutchd: --storage-size: a size from 256M to 1P, e.g. 64G\n"), 2;
        ctx.cfg.storage_size = v << shift;
        break;
      }
      case 'E': ctx.cfg.egress = true; break;
      case 'N': ctx.cfg.egress = false; break;
      case 'D': free(ctx.cfg.gateway_dns), ctx.cfg.gateway_dns = xstrdup(optarg); break;
      case 'Y': free(ctx.cfg.gateway_public_cidr), ctx.cfg.gateway_public_cidr = xstrdup(optarg); break;
      case 'C': free(ctx.cfg.gateway_upstream_ca), ctx.cfg.gateway_upstream_ca = xstrdup(optarg); break;
      case 'R': free(ctx.cfg.runsc_path), ctx.cfg.runsc_path = xstrdup(optarg); break;
      case 'G':
        if (strcmp(optarg, "ptrace") && strcmp(optarg, "kvm") && strcmp(optarg, "systrap"))
          return fprintf(stderr, "hutchd: --runsc-platform: ptrace|kvm|systrap\n"), 2;
        free(ctx.cfg.runsc_platform), ctx.cfg.runsc_platform = xstrdup(optarg);
        break;
      case 'K':
        if (parse_u64(optarg, 10000, &n) < 0 || n == 0) return fprintf(stderr, "hutchd: --max-fork: 1..10000\n"), 2;
        ctx.cfg.max_fork = (uint32_t)n;
        break;
      case 'F':
        for (const char *const *p = hutch_fault_points(); *p; p++) printf("%s\n", *p);
        return 0;
      case 'V': printf("hutchd %s\n", HUTCH_VERSION); return 0;
      case 'h': usage(stdout); return 0;
      default: usage(stderr); return 2;
    }
  }
  if (optind < argc) {
    usage(stderr);
    return 2;
  }
  if (!ctx.cfg.libexec_dir) ctx.cfg.libexec_dir = self_dir();
  hutch_log_set_component("hutchd");
  if (geteuid() != 0) {
    fprintf(stderr, "hutchd: must run as root (it creates namespaces, cgroups and idmapped mounts)\n");
    return 1;
  }
  signal(SIGPIPE, SIG_IGN);
  /* Shims are spawned as our children but never waited for: let the kernel
   * reap them (they detach into their own session and outlive us). */
  signal(SIGCHLD, SIG_IGN);
  /* SIGTERM/SIGINT are taken synchronously by the main thread below. */
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &mask, NULL);

  hutch_err err = HUTCH_ERR_INIT;
  if (hutch_ctx_start(&ctx, &err) < 0) {
    hutch_log(LOG_ERROR, "hutchd.start_failed", "reason", err.msg, NULL);
    return 1;
  }
  struct hutch_server *srv = NULL;
  if (hutch_server_start(&ctx, &srv, &err) < 0) {
    hutch_log(LOG_ERROR, "hutchd.start_failed", "reason", err.msg, NULL);
    hutch_ctx_stop(&ctx);
    return 1;
  }
  hutch_log(LOG_INFO, "hutchd.ready", "version", HUTCH_VERSION, "socket", ctx.cfg.socket_path, "listen",
            ctx.cfg.listen_addr ? ctx.cfg.listen_addr : "", "data_dir", ctx.cfg.data_dir, "instance", ctx.instance,
            "cgroup", ctx.cgroup_version, NULL);
  int sig = 0;
  while (sigwait(&mask, &sig) == 0 && sig == SIGHUP) {
  }
  char s[8];
  snprintf(s, sizeof s, "%d", sig);
  hutch_log(LOG_INFO, "hutchd.stopping", "signal", s, NULL);
  hutch_server_stop(srv);
  hutch_ctx_stop(&ctx);
  hutch_config_free(&ctx.cfg);
  hutch_log(LOG_INFO, "hutchd.stopped", NULL);
  return 0;
}
