/* The egress firewall through libnftables (see nft.h, docs/network.md).
 *
 * libnftables quirks handled here:
 * - it is not thread-safe: every call holds nft_lock;
 * - nft_ctx_new() opens its netfilter netlink socket without SOCK_CLOEXEC,
 *   and calls exit() if it cannot open one.  So a socket is opened first
 *   (a failure is an error, not an exit), and right after nft_ctx_new()
 *   the library's socket gets FD_CLOEXEC (nft_cloexec_sockets);
 * - each command's error text is buffered (nft_ctx_buffer_error) and goes
 *   into the hutch_err. */
#include "isolate/nft.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <linux/netlink.h>
#include <nftables/libnftables.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/util.h"

/* Bump when the rule set below changes: a table with another marker is
 * replaced at the next hutch_nft_setup. */
#define RULESET_VERSION 1

static pthread_mutex_t nft_lock = PTHREAD_MUTEX_INITIALIZER;

/* hutch_egress or hutch_egress_<instance>. */
static int table_of(const char *instance, char out[64], hutch_err *err) {
  if (!instance) {
    snprintf(out, 64, "%s", HUTCH_NFT_TABLE);
    return 0;
  }
  size_t n = strlen(instance);
  bool ok = n >= 1 && n <= 40;
  for (size_t i = 0; ok && i < n; i++) {
    char c = instance[i];
    ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  }
  if (!ok) return hutch_err_invalid(err, "invalid hutch instance name `%.48s` for an nftables table", instance);
  snprintf(out, 64, "%s_%s", HUTCH_NFT_TABLE, instance);
  return 0;
}

static bool valid_ifname(const char *s) {
  size_t n = s ? strlen(s) : 0;
  if (n == 0 || n > 15) return false;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
      return false;
  }
  return true;
}

/* Sets FD_CLOEXEC on netfilter netlink sockets that lack it: libnftables'
 * own (every fd hutch opens is already close-on-exec). */
static void nft_cloexec_sockets(void) {
  DIR *d = opendir("/proc/self/fd");
  if (!d) return;
  struct dirent *de;
  while ((de = readdir(d))) {
    uint64_t v;
    if (parse_u64(de->d_name, INT32_MAX, &v) < 0) continue;
    int fd = (int)v;
    if (fd == dirfd(d)) continue;
    int fl = fcntl(fd, F_GETFD);
    if (fl < 0 || (fl & FD_CLOEXEC)) continue;
    int dom = 0, proto = 0;
    socklen_t l1 = sizeof dom, l2 = sizeof proto;
    if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &dom, &l1) < 0 || dom != AF_NETLINK) continue;
    if (getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &l2) < 0 || proto != NETLINK_NETFILTER) continue;
    (void)fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
  }
  closedir(d);
}

static struct nft_ctx *nft_open(hutch_err *err) {
  int probe = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER);
  if (probe < 0) {
    hutch_err_sys(err, errno, "nftables: netfilter netlink socket");
    return NULL;
  }
  close(probe);
  struct nft_ctx *ctx = nft_ctx_new(NFT_CTX_DEFAULT);
  nft_cloexec_sockets();
  if (!ctx) {
    hutch_err_sys(err, ENOMEM, "nftables: nft_ctx_new");
    return NULL;
  }
  if (nft_ctx_buffer_output(ctx) != 0 || nft_ctx_buffer_error(ctx) != 0) {
    nft_ctx_free(ctx);
    hutch_err_sys(err, ENOMEM, "nftables: buffer output");
    return NULL;
  }
  return ctx;
}

/* nft's error text, condensed to its "Error: …" lines (the echoed command
 * and the caret lines under it are left out), joined with "; ". */
static void condense_error(const char *text, char *out, size_t outlen) {
  size_t o = 0;
  out[0] = 0;
  const char *first = NULL;
  size_t first_len = 0;
  for (const char *p = text ? text : ""; *p;) {
    const char *nl = strchr(p, '\n');
    size_t len = nl ? (size_t)(nl - p) : strlen(p);
    if (!first && len) first = p, first_len = len;
    if (memmem(p, len, "Error", 5)) {
      int w = snprintf(out + o, outlen - o, "%s%.*s", o ? "; " : "", (int)len, p);
      if (w < 0 || (size_t)w >= outlen - o) return;
      o += (size_t)w;
    }
    p += len + (nl ? 1 : 0);
  }
  if (!o) snprintf(out, outlen, "%.*s", first ? (int)first_len : 0, first ? first : "");
  if (!out[0]) snprintf(out, outlen, "failed without a message");
}

/* Runs `cmd` (one transaction).  On failure the hutch_err says `what` and
 * nft's message. */
static int nft_cmd(struct nft_ctx *ctx, const char *cmd, const char *what, hutch_err *err) {
  int r = nft_run_cmd_from_buffer(ctx, cmd);
  const char *etext = nft_ctx_get_error_buffer(ctx);
  (void)nft_ctx_get_output_buffer(ctx); /* rewinds it for the next command */
  if (r != 0) {
    char msg[1024];
    condense_error(etext, msg, sizeof msg);
    return hutch_err_sys(err, 0, "%s: nft: %s", what, msg);
  }
  return 0;
}

/* Runs `cmd` and returns its output (JSON when json), copied. */
static char *nft_query(struct nft_ctx *ctx, const char *cmd, bool json, const char *what, hutch_err *err) {
  unsigned flags = json ? NFT_CTX_OUTPUT_JSON : NFT_CTX_OUTPUT_TERSE;
  nft_ctx_output_set_flags(ctx, flags);
  int r = nft_run_cmd_from_buffer(ctx, cmd);
  const char *etext = nft_ctx_get_error_buffer(ctx);
  const char *otext = nft_ctx_get_output_buffer(ctx);
  nft_ctx_output_set_flags(ctx, 0);
  if (r != 0) {
    char msg[1024];
    condense_error(etext, msg, sizeof msg);
    hutch_err_sys(err, 0, "%s: nft: %s", what, msg);
    return NULL;
  }
  return xstrdup(otext ? otext : "");
}

/* The "nftables" array of a JSON listing. */
static json_t *nft_json(const char *text, const char *what, hutch_err *err) {
  json_error_t jerr;
  json_t *root = json_loads(text, 0, &jerr);
  if (!root || !json_is_array(json_object_get(root, "nftables"))) {
    json_decref(root);
    hutch_err_sys(err, EINVAL, "%s: unexpected nft JSON output (%s)", what, root ? "no nftables array" : jerr.text);
    return NULL;
  }
  return root;
}

static int table_exists(struct nft_ctx *ctx, const char *table, bool *exists, hutch_err *err) {
  cleanup_free char *out = nft_query(ctx, "list tables inet", true, "list tables", err);
  if (!out) return -1;
  json_t *root = nft_json(out, "list tables", err);
  if (!root) return -1;
  *exists = false;
  size_t i;
  json_t *it;
  json_array_foreach(json_object_get(root, "nftables"), i, it) {
    json_t *t = json_object_get(it, "table");
    const char *name = json_string_value(json_object_get(t, "name"));
    const char *fam = json_string_value(json_object_get(t, "family"));
    if (name && fam && strcmp(name, table) == 0 && strcmp(fam, "inet") == 0) *exists = true;
  }
  json_decref(root);
  return 0;
}

static const char *ip_text(uint32_t be, char buf[INET_ADDRSTRLEN]) {
  struct in_addr a = {.s_addr = be};
  return inet_ntop(AF_INET, &a, buf, INET_ADDRSTRLEN);
}

/* Appends to *buf (grown as needed). */
static void append(char **buf, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void append(char **buf, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *add = NULL;
  if (vasprintf(&add, fmt, ap) < 0) abort();
  va_end(ap);
  char *n = xasprintf("%s%s", *buf ? *buf : "", add);
  free(add);
  free(*buf);
  *buf = n;
}

/* The elements of the existing table's sets, as `add element` commands
 * (NULL when there are none).  Elements that do not look like ours are left
 * out rather than passed back to nft. */
static char *saved_elements(struct nft_ctx *ctx, const char *table) {
  char *cmds = NULL;
  char *ifs = NULL, *src = NULL;
  static const char *const sets[] = {"sandbox_ifs", "sandbox_src"};
  for (int s = 0; s < 2; s++) {
    cleanup_free char *cmd = xasprintf("list set inet %s %s", table, sets[s]);
    hutch_err ignored = HUTCH_ERR_INIT;
    cleanup_free char *out = nft_query(ctx, cmd, true, "list set", &ignored);
    if (!out) continue; /* an older table without this set */
    json_t *root = nft_json(out, "list set", &ignored);
    if (!root) continue;
    size_t i, j;
    json_t *it, *el;
    json_array_foreach(json_object_get(root, "nftables"), i, it) {
      json_t *elems = json_object_get(json_object_get(it, "set"), "elem");
      json_array_foreach(elems, j, el) {
        if (s == 0) {
          const char *name = json_string_value(el);
          if (valid_ifname(name)) append(&ifs, "%s\"%s\"", ifs ? ", " : "", name);
        } else {
          json_t *c = json_object_get(el, "concat");
          const char *name = json_string_value(json_array_get(c, 0));
          const char *addr = json_string_value(json_array_get(c, 1));
          struct in_addr a;
          if (json_array_size(c) == 2 && valid_ifname(name) && addr && inet_pton(AF_INET, addr, &a) == 1) {
            char t[INET_ADDRSTRLEN];
            append(&src, "%s\"%s\" . %s", src ? ", " : "", name, ip_text(a.s_addr, t));
          }
        }
      }
    }
    json_decref(root);
  }
  if (ifs) append(&cmds, "add element inet %s sandbox_ifs { %s }\n", table, ifs);
  if (src) append(&cmds, "add element inet %s sandbox_src { %s }\n", table, src);
  free(ifs);
  free(src);
  return cmds;
}

static char *ruleset(const char *table, const struct hutch_nft_ports *p, const char *marker) {
  return xasprintf(
      "table inet %s {\n"
      "  comment \"%s\"\n"
      "  counter spoof {\n  }\n"
      "  counter input_other {\n  }\n"
      "  counter forward {\n  }\n"
      "  counter ipv6 {\n  }\n"
      "  set sandbox_ifs {\n    type ifname\n  }\n"
      "  set sandbox_src {\n    type ifname . ipv4_addr\n  }\n"
      /* Every packet, before conntrack and NAT. */
      "  chain raw_prerouting {\n"
      "    type filter hook prerouting priority raw; policy accept;\n"
      "    iifname @sandbox_ifs meta nfproto ipv6 counter name \"ipv6\" drop\n"
      "  }\n"
      /* The first packet of each connection. */
      "  chain prerouting {\n"
      "    type nat hook prerouting priority dstnat; policy accept;\n"
      "    iifname != @sandbox_ifs accept\n"
      "    meta nfproto ipv6 counter name \"ipv6\" drop\n"
      "    meta nfproto ipv4 udp dport 53 redirect to :%u\n"
      "    meta nfproto ipv4 tcp dport 53 redirect to :%u\n"
      "    meta nfproto ipv4 tcp dport 3128 redirect to :%u\n"
      "    meta nfproto ipv4 tcp dport 80 redirect to :%u\n"
      "    meta nfproto ipv4 tcp dport 443 redirect to :%u\n"
      "  }\n"
      "  chain input {\n"
      "    type filter hook input priority filter; policy accept;\n"
      "    iifname != @sandbox_ifs accept\n"
      "    meta nfproto ipv6 counter name \"ipv6\" drop\n"
      "    iifname . ip saddr != @sandbox_src counter name \"spoof\" drop\n"
      "    udp dport %u accept\n"
      "    tcp dport { %u, %u, %u, %u } accept\n"
      "    counter name \"input_other\" drop\n"
      "  }\n"
      "  chain forward {\n"
      "    type filter hook forward priority filter; policy accept;\n"
      "    iifname @sandbox_ifs meta nfproto ipv6 counter name \"ipv6\" drop\n"
      "    iifname @sandbox_ifs counter name \"forward\" drop\n"
      "    oifname @sandbox_ifs counter name \"forward\" drop\n"
      "  }\n"
      "}\n",
      table, marker, p->dns, p->dns, p->proxy, p->http, p->tls, p->dns, p->dns, p->proxy, p->http, p->tls);
}

static int setup_locked(const char *table, const struct hutch_nft_ports *ports, hutch_err *err) {
  struct nft_ctx *ctx = nft_open(err);
  if (!ctx) return -1;
  int ret = -1;
  char marker[128];
  snprintf(marker, sizeof marker, "hutch egress rules v%d; ports dns %u proxy %u http %u tls %u", RULESET_VERSION,
           ports->dns, ports->proxy, ports->http, ports->tls);
  bool exists = false;
  char *listing = NULL, *elems = NULL, *rules = NULL, *batch = NULL;
  if (table_exists(ctx, table, &exists, err) < 0) goto out;
  if (exists) {
    /* Terse: without set elements.  The comment is the table's first line. */
    cleanup_free char *cmd = xasprintf("list table inet %s", table);
    listing = nft_query(ctx, cmd, false, "list table", err);
    if (!listing) goto out;
    cleanup_free char *want = xasprintf("\tcomment \"%s\"\n", marker);
    if (strstr(listing, want)) {
      ret = 0; /* this version's table: leave it, elements and counters included */
      goto out;
    }
    elems = saved_elements(ctx, table);
  }
  rules = ruleset(table, ports, marker);
  /* "add; delete" makes the delete valid whether or not the table exists;
   * the whole buffer is one transaction. */
  batch = xasprintf("add table inet %s\ndelete table inet %s\n%s%s", table, table, rules, elems ? elems : "");
  ret = nft_cmd(ctx, batch, "load the egress rules", err);
out:
  free(listing);
  free(elems);
  free(rules);
  free(batch);
  nft_ctx_free(ctx);
  return ret;
}

int hutch_nft_setup(const char *instance, const struct hutch_nft_ports *ports, hutch_err *err) {
  static const struct hutch_nft_ports defaults = HUTCH_NFT_PORTS_DEFAULT;
  if (!ports) ports = &defaults;
  if (!ports->dns || !ports->proxy || !ports->http || !ports->tls)
    return hutch_err_invalid(err, "egress ports must be 1-65535");
  char table[64];
  if (table_of(instance, table, err) < 0) return -1;
  pthread_mutex_lock(&nft_lock);
  int r = setup_locked(table, ports, err);
  pthread_mutex_unlock(&nft_lock);
  if (r < 0) hutch_err_wrap(err, "nftables table inet %s", table);
  return r;
}

static int elements(const char *instance, const char *ifname, uint32_t ipv4_be, bool add, hutch_err *err) {
  if (!valid_ifname(ifname)) return hutch_err_invalid(err, "invalid interface name `%.32s`", ifname ? ifname : "");
  char t[64];
  if (table_of(instance, t, err) < 0) return -1;
  char ip[INET_ADDRSTRLEN];
  ip_text(ipv4_be, ip);
  /* Delete: "add; delete" in one transaction, so that a missing element
   * is not an error (nft 1.0.6 has no `destroy`). */
  cleanup_free char *adds = xasprintf("add element inet %s sandbox_ifs { \"%s\" }\n"
                                      "add element inet %s sandbox_src { \"%s\" . %s }\n",
                                      t, ifname, t, ifname, ip);
  cleanup_free char *dels = add ? NULL
                                : xasprintf("delete element inet %s sandbox_ifs { \"%s\" }\n"
                                            "delete element inet %s sandbox_src { \"%s\" . %s }\n",
                                            t, ifname, t, ifname, ip);
  cleanup_free char *batch = xasprintf("%s%s", adds, dels ? dels : "");
  pthread_mutex_lock(&nft_lock);
  int r = -1;
  struct nft_ctx *ctx = nft_open(err);
  if (ctx) {
    r = nft_cmd(ctx, batch, add ? "add sandbox elements" : "delete sandbox elements", err);
    if (r < 0 && !add) {
      bool exists = true;
      hutch_err ignored = HUTCH_ERR_INIT;
      if (table_exists(ctx, t, &exists, &ignored) == 0 && !exists) r = 0; /* no table, nothing to delete */
    }
    nft_ctx_free(ctx);
  }
  pthread_mutex_unlock(&nft_lock);
  if (r < 0) hutch_err_wrap(err, "nftables table inet %s: %s `%s` %s", t, add ? "add" : "delete", ifname, ip);
  return r;
}

int hutch_nft_add_sandbox(const char *instance, const char *ifname, uint32_t ipv4_be, hutch_err *err) {
  return elements(instance, ifname, ipv4_be, true, err);
}

int hutch_nft_del_sandbox(const char *instance, const char *ifname, uint32_t ipv4_be, hutch_err *err) {
  return elements(instance, ifname, ipv4_be, false, err);
}

static int counters_locked(const char *table, struct hutch_nft_counters *out, hutch_err *err) {
  struct nft_ctx *ctx = nft_open(err);
  if (!ctx) return -1;
  cleanup_free char *cmd = xasprintf("list counters table inet %s", table);
  cleanup_free char *text = nft_query(ctx, cmd, true, "list counters", err);
  nft_ctx_free(ctx);
  if (!text) return -1;
  json_t *root = nft_json(text, "list counters", err);
  if (!root) return -1;
  memset(out, 0, sizeof *out);
  int found = 0;
  size_t i;
  json_t *it;
  json_array_foreach(json_object_get(root, "nftables"), i, it) {
    json_t *c = json_object_get(it, "counter");
    const char *name = json_string_value(json_object_get(c, "name"));
    if (!name) continue;
    struct hutch_nft_counter *dst = strcmp(name, "spoof") == 0         ? &out->spoof
                                    : strcmp(name, "input_other") == 0 ? &out->input_other
                                    : strcmp(name, "forward") == 0     ? &out->forward
                                    : strcmp(name, "ipv6") == 0        ? &out->ipv6
                                                                       : NULL;
    if (!dst) continue;
    dst->packets = (uint64_t)json_integer_value(json_object_get(c, "packets"));
    dst->bytes = (uint64_t)json_integer_value(json_object_get(c, "bytes"));
    found++;
  }
  json_decref(root);
  if (found != 4) return hutch_err_sys(err, ENOENT, "list counters: %d of the 4 named counters found", found);
  return 0;
}

int hutch_nft_counters(const char *instance, struct hutch_nft_counters *out, hutch_err *err) {
  char table[64];
  if (table_of(instance, table, err) < 0) return -1;
  pthread_mutex_lock(&nft_lock);
  int r = counters_locked(table, out, err);
  pthread_mutex_unlock(&nft_lock);
  if (r < 0) hutch_err_wrap(err, "nftables table inet %s", table);
  return r;
}

int hutch_nft_teardown(const char *instance, hutch_err *err) {
  char table[64];
  if (table_of(instance, table, err) < 0) return -1;
  pthread_mutex_lock(&nft_lock);
  int r = -1;
  struct nft_ctx *ctx = nft_open(err);
  if (ctx) {
    cleanup_free char *cmd = xasprintf("add table inet %s\ndelete table inet %s\n", table, table);
    r = nft_cmd(ctx, cmd, "delete the table", err);
    nft_ctx_free(ctx);
  }
  pthread_mutex_unlock(&nft_lock);
  if (r < 0) hutch_err_wrap(err, "nftables table inet %s", table);
  return r;
}
