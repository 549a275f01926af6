/* The egress plumbing: isolate/veth.c (addresses, names, the veth pair) and
 * isolate/nft.c (the nftables table).
 *
 * Always: address and interface-name arithmetic and its bounds, and the
 * arguments both modules refuse before touching the kernel.
 *
 * With HUTCH_EGRESS_LIVE=1 (root; tests/integration/test_egress_plumbing.py
 * runs it so): the real thing on this machine, on table
 * hutch_egress_livetest and slots 16000 and 16001.  Two "sandboxes" (a child
 * each in a fresh user + network namespace, as the native runtime makes
 * them) get their veth and nft elements; the checks then run inside their
 * namespaces (fork + setns) against listeners the test opens on the host:
 *   - UDP and TCP 53, TCP 3128, 80, 443 to the host side are redirected to
 *     the gateway ports (and the DNS answer comes back from port 53);
 *   - TCP to another host port (open on the host: positive control over
 *     loopback) and to port 22 times out: dropped, input_other counted;
 *   - a datagram from a second address inside the sandbox (routed back
 *     through the veth, so rp_filter lets it through) is dropped: spoof;
 *   - the other sandbox receives nothing from this one, even with
 *     forwarding enabled on the veth (then: forward counted), while it does
 *     receive from the host (positive control);
 *   - IPv6 is disabled on both ends, and an IPv6 frame injected on the
 *     sandbox's eth0 is dropped: ipv6 counted;
 *   - setup again leaves the table alone; with other ports it is replaced
 *     and the sandboxes' elements survive;
 *   - deletes of what is missing are not errors, and nothing is left.
 * Nothing is sent to any address outside this machine: every packet goes
 * over the test's own veths.  Children die with the test (PDEATHSIG), their
 * namespaces and veths with them; the table is deleted at start and end. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "isolate/netns.h"
#include "isolate/nft.h"
#include "isolate/veth.h"
#include "tap.h"

#define INSTANCE "livetest"
#define SLOT_A 16000u
#define SLOT_B 16001u
#define SPOOF_IP "192.0.2.77" /* TEST-NET-1; routed only into the test's veth */

static uint32_t ip4(const char *s) {
  struct in_addr a;
  if (inet_pton(AF_INET, s, &a) != 1) abort();
  return a.s_addr;
}

static const char *ipstr(uint32_t be) {
  static char buf[4][INET_ADDRSTRLEN];
  static int n;
  char *b = buf[n++ % 4];
  struct in_addr a = {.s_addr = be};
  return inet_ntop(AF_INET, &a, b, INET_ADDRSTRLEN);
}

/* -- always ------------------------------------------------------------------ */

static void test_arithmetic(void) {
  uint32_t h, s;
  char name[16];
  ok(hutch_egress_addr(0, &h, &s) == 0, "slot 0");
  is_str(ipstr(h), "10.231.0.1", "slot 0: host side");
  is_str(ipstr(s), "10.231.0.2", "slot 0: sandbox side");
  ok(hutch_egress_ifname(0, name) == 0, "slot 0 name");
  is_str(name, "hg0000", "slot 0: hg0000");
  hutch_egress_addr(1, &h, &s);
  is_str(ipstr(h), "10.231.0.5", "slot 1: host side");
  is_str(ipstr(s), "10.231.0.6", "slot 1: sandbox side");
  hutch_egress_addr(0x0a1f, &h, &s);
  hutch_egress_ifname(0x0a1f, name);
  is_str(name, "hg0a1f", "slot 0x0a1f: hg0a1f (the example in docs/network.md)");
  is_str(ipstr(h), "10.231.40.125", "slot 0x0a1f: 10.231.0.0 + 4*0xa1f + 1");
  is_str(ipstr(s), "10.231.40.126", "slot 0x0a1f: + 2");
  hutch_egress_addr(64, &h, &s);
  is_str(ipstr(h), "10.231.1.1", "slot 64: the next /24");
  ok(hutch_egress_addr(16383, &h, &s) == 0, "slot 16383 is the last");
  is_str(ipstr(h), "10.231.255.253", "slot 16383: host side");
  is_str(ipstr(s), "10.231.255.254", "slot 16383: sandbox side (below the /16's broadcast)");
  hutch_egress_ifname(16383, name);
  is_str(name, "hg3fff", "slot 16383: hg3fff");
  uint32_t keep_h = h;
  errno = 0;
  ok(hutch_egress_addr(16384, &h, &s) < 0 && errno == EINVAL, "slot 16384 refused (EINVAL)");
  ok(h == keep_h, "outputs untouched on refusal");
  ok(hutch_egress_ifname(16384, name) < 0 && name[0] == 0, "slot 16384: no name");
  ok(hutch_egress_addr(UINT32_MAX, &h, &s) < 0, "slot UINT32_MAX refused (no wrap-around)");
  ok(hutch_egress_addr(0x40000000u, &h, &s) < 0, "slot 2^30 refused (4*slot would wrap)");
  ok(hutch_egress_ifname(UINT32_MAX, name) < 0, "slot UINT32_MAX: no name");

  /* Every slot: inside 10.231/16, its own /30, host = net+1, sandbox = net+2,
   * names distinct and at most 15 characters. */
  bool good = true;
  static unsigned char seen[HUTCH_EGRESS_SLOTS];
  for (uint32_t i = 0; i < HUTCH_EGRESS_SLOTS; i++) {
    hutch_egress_addr(i, &h, &s);
    hutch_egress_ifname(i, name);
    uint32_t hh = ntohl(h), ss = ntohl(s);
    if ((hh >> 16) != 0x0ae7 || (hh & 3) != 1 || ss != hh + 1 || strlen(name) != 6) good = false;
    uint32_t net = (hh & 0xffff) >> 2;
    if (net != i || seen[net]++) good = false;
    unsigned parsed = 0;
    if (sscanf(name, "hg%4x", &parsed) != 1 || parsed != i) good = false;
  }
  ok(good, "all %u slots: distinct /30s of 10.231.0.0/16, names hg%%04x", HUTCH_EGRESS_SLOTS);
}

static void test_refusals(void) {
  hutch_err err = HUTCH_ERR_INIT;
  ok(hutch_nft_add_sandbox(NULL, "hg0001\"; flush ruleset", ip4("10.231.0.6"), &err) < 0 &&
         strcmp(err.code, "invalid_argument") == 0,
     "nft: an interface name with a quote is refused before nft sees it");
  hutch_err_clear(&err);
  ok(hutch_nft_add_sandbox(NULL, "", ip4("10.231.0.6"), &err) < 0 && strcmp(err.code, "invalid_argument") == 0,
     "nft: empty interface name refused");
  hutch_err_clear(&err);
  ok(hutch_nft_del_sandbox(NULL, "0123456789abcdef", ip4("10.231.0.6"), &err) < 0 &&
         strcmp(err.code, "invalid_argument") == 0,
     "nft: a 16-character interface name refused");
  hutch_err_clear(&err);
  ok(hutch_nft_setup("x y", NULL, &err) < 0 && strcmp(err.code, "invalid_argument") == 0,
     "nft: instance with a space refused");
  hutch_err_clear(&err);
  ok(hutch_nft_teardown("a;b", &err) < 0 && strcmp(err.code, "invalid_argument") == 0,
     "nft: instance with a semicolon refused");
  hutch_err_clear(&err);
  struct hutch_nft_ports zero = {0, 1, 2, 3};
  ok(hutch_nft_setup(NULL, &zero, &err) < 0 && strcmp(err.code, "invalid_argument") == 0, "nft: port 0 refused");
  hutch_err_clear(&err);
  ok(hutch_veth_create(HUTCH_EGRESS_SLOTS, 1, &err) < 0, "veth: slot 16384 refused");
  hutch_err_clear(&err);
  ok(hutch_veth_create(1, 0, &err) < 0 && strcmp(err.code, "invalid_argument") == 0, "veth: pid 0 refused");
  hutch_err_clear(&err);
  ok(hutch_veth_delete(HUTCH_EGRESS_SLOTS, &err) < 0, "veth delete: slot 16384 refused");
}

/* -- live ------------------------------------------------------------------------ */

struct sandbox {
  pid_t pid;
  uint32_t slot, host_be, sb_be;
  char ifname[16];
};
static struct sandbox A = {.slot = SLOT_A}, B = {.slot = SLOT_B};

static void live_cleanup(void) {
  hutch_err e = HUTCH_ERR_INIT;
  hutch_veth_delete(SLOT_A, &e);
  hutch_veth_delete(SLOT_B, &e);
  hutch_veth_delete(SLOT_B + 1, &e);
  hutch_nft_teardown(INSTANCE, &e);
  struct sandbox *sbs[] = {&A, &B};
  for (int i = 0; i < 2; i++) {
    if (sbs[i]->pid > 0) {
      kill(sbs[i]->pid, SIGKILL);
      waitpid(sbs[i]->pid, NULL, 0);
      sbs[i]->pid = 0;
    }
  }
}

static void on_signal(int sig) {
  live_cleanup(); /* not async-signal-safe; a test being killed anyway */
  signal(sig, SIG_DFL);
  raise(sig);
}

/* A child in a fresh user + network namespace (uid 0 inside mapped to an
 * unprivileged host uid), loopback up, sleeping until killed or until the
 * test exits. */
static pid_t spawn_sandbox(void) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) < 0) return -1;
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    if (unshare(CLONE_NEWUSER | CLONE_NEWNET) < 0) _exit(2);
    hutch_err e = HUTCH_ERR_INIT;
    if (hutch_netns_loopback_up(&e) < 0) _exit(3);
    if (write(p[1], "r", 1) != 1) _exit(4);
    close(p[1]);
    for (;;) pause();
  }
  close(p[1]);
  char c = 0;
  ssize_t n = pid > 0 ? read(p[0], &c, 1) : -1;
  close(p[0]);
  if (n != 1) return -1;
  char path[64];
  hutch_err e = HUTCH_ERR_INIT;
  snprintf(path, sizeof path, "/proc/%d/uid_map", (int)pid);
  if (write_file_str(path, "0 3999000000 1\n", &e) < 0) printf("# uid_map: %s\n", e.msg);
  snprintf(path, sizeof path, "/proc/%d/gid_map", (int)pid);
  if (write_file_str(path, "0 3999000000 1\n", &e) < 0) printf("# gid_map: %s\n", e.msg);
  return pid;
}

/* Runs fn(arg) in a child that has joined `pid`'s network namespace;
 * returns its exit status (-1 if it did not exit normally). */
typedef int (*ns_fn)(void *arg);
static int in_ns(pid_t pid, ns_fn fn, void *arg) {
  fflush(stdout);
  pid_t c = fork();
  if (c == 0) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/ns/net", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) < 0) _exit(120);
    close(fd);
    _exit(fn(arg));
  }
  int st;
  if (c < 0 || waitpid(c, &st, 0) < 0) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Like in_ns, but returns at once with the child's pid (wait with reap()). */
static pid_t in_ns_async(pid_t pid, ns_fn fn, void *arg, int ready_fd) {
  fflush(stdout);
  pid_t c = fork();
  if (c == 0) {
    if (pid > 0) {
      char path[64];
      snprintf(path, sizeof path, "/proc/%d/ns/net", (int)pid);
      int fd = open(path, O_RDONLY | O_CLOEXEC);
      if (fd < 0 || setns(fd, CLONE_NEWNET) < 0) _exit(120);
      close(fd);
    }
    (void)ready_fd;
    _exit(fn(arg));
  }
  return c;
}

static int reap(pid_t c) {
  int st;
  if (c < 0 || waitpid(c, &st, 0) < 0) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static struct sockaddr_in sin_of(uint32_t be, uint16_t port) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = be};
  return a;
}

static int wait_readable(int fd, int ms) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  return poll(&p, 1, ms);
}

/* A listener of `type` on 0.0.0.0:port (0: any free port, written back). */
static int listener(int type, uint16_t *port) {
  int fd = socket(AF_INET, type | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = sin_of(htonl(INADDR_ANY), *port);
  socklen_t l = sizeof a;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || (type == SOCK_STREAM && listen(fd, 16) < 0) ||
      getsockname(fd, (struct sockaddr *)&a, &l) < 0) {
    close(fd);
    return -1;
  }
  *port = ntohs(a.sin_port);
  return fd;
}

/* What the checks inside a namespace are given. */
struct probe {
  uint32_t dst_be;
  uint16_t port;
  uint32_t src_be; /* 0: the kernel's choice */
  int timeout_ms;
  int count;
};

/* UDP: send "ping", wait for "pong" from dst:port.  0 answered, 1 no answer,
 * 2+ errors. */
static int udp_ping(void *arg) {
  struct probe *p = arg;
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 10;
  if (p->src_be) {
    struct sockaddr_in s = sin_of(p->src_be, 0);
    if (bind(fd, (struct sockaddr *)&s, sizeof s) < 0) return 11;
  }
  struct sockaddr_in d = sin_of(p->dst_be, p->port);
  for (int i = 0; i < (p->count ? p->count : 1); i++)
    if (sendto(fd, "ping", 4, 0, (struct sockaddr *)&d, sizeof d) != 4) return 12;
  if (wait_readable(fd, p->timeout_ms) <= 0) return 1;
  char buf[16];
  struct sockaddr_in from;
  socklen_t l = sizeof from;
  ssize_t n = recvfrom(fd, buf, sizeof buf, 0, (struct sockaddr *)&from, &l);
  if (n != 4 || memcmp(buf, "pong", 4) != 0) return 13;
  if (from.sin_addr.s_addr != p->dst_be || ntohs(from.sin_port) != p->port) return 14; /* un-NATed */
  return 0;
}

/* TCP connect: 0 connected, 1 timed out (dropped), 2 refused, 3+ errors. */
static int tcp_connect(void *arg) {
  struct probe *p = arg;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return 10;
  struct sockaddr_in d = sin_of(p->dst_be, p->port);
  if (connect(fd, (struct sockaddr *)&d, sizeof d) < 0 && errno != EINPROGRESS) return errno == ECONNREFUSED ? 2 : 11;
  struct pollfd pf = {.fd = fd, .events = POLLOUT};
  if (poll(&pf, 1, p->timeout_ms) <= 0) return 1;
  int e = 0;
  socklen_t l = sizeof e;
  getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &l);
  if (e == ECONNREFUSED) return 2;
  if (e) return 12;
  (void)!write(fd, "x", 1);
  return 0;
}

/* UDP listener on dst:port for timeout_ms: 0 nothing received, 1 received,
 * 2+ errors.  Tells the parent it is ready through the fd in `count`. */
static int udp_listen_once(void *arg) {
  struct probe *p = arg;
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = sin_of(p->dst_be, p->port);
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) < 0) return 10;
  if (write(p->count, "r", 1) != 1) return 11;
  return wait_readable(fd, p->timeout_ms) > 0 ? 1 : 0;
}

static char *read_trim(const char *path) {
  char *s = read_file(path, 4096, NULL, NULL);
  if (s) s[strcspn(s, "\n")] = 0;
  return s;
}

/* Inside a sandbox: eth0 has its address, is up, the default route is via
 * the host side, IPv6 is off.  Returns a bit per failed check. */
static uint32_t expect_host_be, expect_sb_be;
static int inside_config(void *arg) {
  (void)arg;
  int bad = 0;
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "eth0");
  if (ioctl(s, SIOCGIFADDR, &ifr) < 0 || ((struct sockaddr_in *)&ifr.ifr_addr)->sin_addr.s_addr != expect_sb_be)
    bad |= 1;
  if (ioctl(s, SIOCGIFNETMASK, &ifr) < 0 || ((struct sockaddr_in *)&ifr.ifr_netmask)->sin_addr.s_addr != htonl(0xfffffffc))
    bad |= 2;
  if (ioctl(s, SIOCGIFFLAGS, &ifr) < 0 || !(ifr.ifr_flags & IFF_UP)) bad |= 4;
  close(s);
  /* /proc/net/route: "eth0 00000000 <gw hex, host byte order of the be value>". */
  char *rt = read_file("/proc/net/route", 1 << 16, NULL, NULL);
  char want[64];
  snprintf(want, sizeof want, "eth0\t00000000\t%08X", expect_host_be);
  if (!rt || !strstr(rt, want)) bad |= 8;
  free(rt);
  char *v6 = read_trim("/proc/sys/net/ipv6/conf/eth0/disable_ipv6");
  if (v6 && strcmp(v6, "1") != 0) bad |= 16;
  free(v6);
  char *if6 = read_file("/proc/net/if_inet6", 1 << 16, NULL, NULL);
  if (if6 && strstr(if6, "eth0")) bad |= 32;
  free(if6);
  return bad;
}

static int inside_no_eth0(void *arg) {
  (void)arg;
  return if_nametoindex("eth0") == 0 ? 0 : 1;
}

/* Inside A: a second address, SPOOF_IP/32, on eth0. */
static int inside_add_spoof_addr(void *arg) {
  (void)arg;
  const char *argv[] = {"ip", "addr", "add", SPOOF_IP "/32", "dev", "eth0", NULL};
  hutch_err e = HUTCH_ERR_INIT;
  return hutch_run(argv, -1, -1, NULL, NULL, &e) < 0 ? 1 : 0;
}

/* Inside A: one IPv6/UDP frame to ff02::1 on eth0 through a packet socket. */
static int inside_send_ipv6(void *arg) {
  (void)arg;
  int ifindex = (int)if_nametoindex("eth0");
  int fd = socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, htons(ETH_P_IPV6));
  if (!ifindex || fd < 0) return 10;
  unsigned char f[14 + 40 + 12];
  memset(f, 0, sizeof f);
  static const unsigned char dmac[6] = {0x33, 0x33, 0, 0, 0, 1}, smac[6] = {0x02, 0, 0, 0, 0, 0x02};
  memcpy(f, dmac, 6);
  memcpy(f + 6, smac, 6);
  f[12] = 0x86, f[13] = 0xdd;
  unsigned char *ip6 = f + 14;
  ip6[0] = 0x60;
  ip6[5] = 12; /* payload length */
  ip6[6] = 17; /* UDP */
  ip6[7] = 1;  /* hop limit */
  ip6[8] = 0xfe, ip6[9] = 0x80, ip6[23] = 2; /* fe80::2 */
  ip6[24] = 0xff, ip6[25] = 0x02, ip6[39] = 1; /* ff02::1 */
  unsigned char *udp = ip6 + 40;
  udp[1] = 9, udp[3] = 9, udp[5] = 12;
  memcpy(udp + 8, "ping", 4);
  uint32_t sum = 0; /* pseudo-header + UDP */
  for (int i = 8; i < 40; i += 2) sum += (uint32_t)(ip6[i] << 8 | ip6[i + 1]);
  sum += 12 + 17;
  for (int i = 0; i < 12; i += 2) sum += (uint32_t)(udp[i] << 8 | udp[i + 1]);
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  uint16_t c = (uint16_t)~sum;
  udp[6] = (unsigned char)(c >> 8), udp[7] = (unsigned char)c;
  struct sockaddr_ll ll = {.sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_IPV6), .sll_ifindex = ifindex,
                           .sll_halen = 6};
  memcpy(ll.sll_addr, dmac, 6);
  for (int i = 0; i < 3; i++)
    if (sendto(fd, f, sizeof f, 0, (struct sockaddr *)&ll, sizeof ll) != (ssize_t)sizeof f) return 11;
  return 0;
}

static struct hutch_nft_counters counters(void) {
  struct hutch_nft_counters c;
  memset(&c, 0, sizeof c);
  hutch_err e = HUTCH_ERR_INIT;
  if (hutch_nft_counters(INSTANCE, &c, &e) < 0) printf("# counters: %s\n", e.msg);
  return c;
}

static int sysctl_set(const char *path, const char *v) {
  hutch_err e = HUTCH_ERR_INIT;
  return write_file_str(path, v, &e);
}

/* The host's listeners (the gateway's stand-ins). */
struct gw {
  struct hutch_nft_ports ports;
  int udp_dns, tcp_dns, proxy, http, tls;
  int other; /* an open host port that is not the gateway's */
  uint16_t other_port;
};

static int open_gateway(struct gw *g) {
  memset(g, 0, sizeof *g);
  for (int tries = 0; tries < 50; tries++) {
    uint16_t p = 0;
    int u = listener(SOCK_DGRAM, &p);
    if (u < 0) continue;
    uint16_t q = p;
    int t = listener(SOCK_STREAM, &q);
    if (t >= 0) {
      g->udp_dns = u, g->tcp_dns = t, g->ports.dns = p;
      break;
    }
    close(u);
  }
  if (!g->ports.dns) return -1;
  g->proxy = listener(SOCK_STREAM, &g->ports.proxy);
  g->http = listener(SOCK_STREAM, &g->ports.http);
  g->tls = listener(SOCK_STREAM, &g->ports.tls);
  g->other = listener(SOCK_STREAM, &g->other_port);
  return g->proxy < 0 || g->http < 0 || g->tls < 0 || g->other < 0 ? -1 : 0;
}

/* UDP 53 from sandbox `sb` arrives at the DNS listener and the answer gets
 * back.  Returns true when both happened. */
static bool dns_roundtrip(struct gw *g, struct sandbox *sb) {
  struct probe p = {.dst_be = sb->host_be, .port = 53, .timeout_ms = 3000};
  pid_t c = in_ns_async(sb->pid, udp_ping, &p, -1);
  bool got = false;
  if (wait_readable(g->udp_dns, 3000) > 0) {
    char buf[16];
    struct sockaddr_in from;
    socklen_t l = sizeof from;
    ssize_t n = recvfrom(g->udp_dns, buf, sizeof buf, 0, (struct sockaddr *)&from, &l);
    got = n == 4 && from.sin_addr.s_addr == sb->sb_be;
    if (got) sendto(g->udp_dns, "pong", 4, 0, (struct sockaddr *)&from, l);
  }
  int rc = reap(c);
  if (!got || rc != 0) printf("# dns roundtrip: received %d, sender status %d\n", got, rc);
  return got && rc == 0;
}

/* TCP `port` from sandbox `sb` lands on listener `lfd` (accepted from the
 * sandbox's address). */
static bool tcp_redirected(struct sandbox *sb, uint16_t port, int lfd) {
  struct probe p = {.dst_be = sb->host_be, .port = port, .timeout_ms = 3000};
  int rc = in_ns(sb->pid, tcp_connect, &p);
  if (rc != 0) {
    printf("# tcp %u: connect status %d\n", port, rc);
    return false;
  }
  if (wait_readable(lfd, 2000) <= 0) return false;
  struct sockaddr_in from;
  socklen_t l = sizeof from;
  int c = accept4(lfd, (struct sockaddr *)&from, &l, SOCK_CLOEXEC);
  if (c < 0) return false;
  close(c);
  return from.sin_addr.s_addr == sb->sb_be;
}

/* Nothing pending on a UDP listener within ms. */
static bool udp_silent(int fd, int ms) {
  if (wait_readable(fd, ms) <= 0) return true;
  char buf[64];
  struct sockaddr_in from;
  socklen_t l = sizeof from;
  ssize_t n = recvfrom(fd, buf, sizeof buf, 0, (struct sockaddr *)&from, &l);
  printf("# unexpected datagram (%zd bytes) from %s\n", n, ipstr(from.sin_addr.s_addr));
  return false;
}

/* A UDP listener in `dst`'s namespace (or the host's: dst NULL... never) on
 * dst's address; `send` runs; returns the listener's status (0 silent,
 * 1 received). */
static int b_receives(struct sandbox *dst, pid_t from_pid, uint16_t port, int ms) {
  int rp[2];
  if (pipe2(rp, O_CLOEXEC) < 0) return -1;
  struct probe lp = {.dst_be = dst->sb_be, .port = port, .timeout_ms = ms, .count = rp[1]};
  pid_t l = in_ns_async(dst->pid, udp_listen_once, &lp, -1);
  close(rp[1]);
  char c;
  bool ready = read(rp[0], &c, 1) == 1;
  close(rp[0]);
  if (ready) {
    struct probe sp = {.dst_be = dst->sb_be, .port = port, .timeout_ms = 1, .count = 3};
    if (from_pid > 0)
      (void)in_ns(from_pid, udp_ping, &sp);
    else
      (void)udp_ping(&sp); /* from the host */
  }
  return reap(l);
}

static void live(void) {
  hutch_err err = HUTCH_ERR_INIT;
  live_cleanup();
  atexit(live_cleanup);
  signal(SIGTERM, on_signal);
  signal(SIGINT, on_signal);
  signal(SIGPIPE, SIG_IGN);

  hutch_egress_addr(SLOT_A, &A.host_be, &A.sb_be);
  hutch_egress_ifname(SLOT_A, A.ifname);
  hutch_egress_addr(SLOT_B, &B.host_be, &B.sb_be);
  hutch_egress_ifname(SLOT_B, B.ifname);
  is_str(A.ifname, "hg3e80", "slot 16000 is hg3e80");

  struct gw g;
  ok(open_gateway(&g) == 0, "gateway stand-in listeners on the host (dns %u, proxy %u, http %u, tls %u)", g.ports.dns,
     g.ports.proxy, g.ports.http, g.ports.tls);

  /* The table. */
  int r = hutch_nft_setup(INSTANCE, &g.ports, &err);
  ok(r == 0, "hutch_nft_setup: %s", r ? err.msg : "table loaded");
  if (r) return;
  ok(hutch_nft_setup(INSTANCE, &g.ports, &err) == 0, "hutch_nft_setup again: idempotent");
  struct hutch_nft_counters c0 = counters();
  ok(c0.spoof.packets == 0 && c0.input_other.packets == 0 && c0.forward.packets == 0 && c0.ipv6.packets == 0,
     "four named counters at zero");

  /* The sandboxes: elements first, then the veths. */
  A.pid = spawn_sandbox();
  B.pid = spawn_sandbox();
  ok(A.pid > 0 && B.pid > 0, "two sandboxes (user + network namespaces)");
  if (A.pid <= 0 || B.pid <= 0) return;
  char *host_eth0_v6 = read_trim("/proc/sys/net/ipv6/conf/eth0/disable_ipv6");
  r = hutch_nft_add_sandbox(INSTANCE, A.ifname, A.sb_be, &err);
  ok(r == 0, "add sandbox A elements: %s", r ? err.msg : "ok");
  ok(hutch_nft_add_sandbox(INSTANCE, A.ifname, A.sb_be, &err) == 0, "adding them again is not an error");
  ok(hutch_nft_add_sandbox(INSTANCE, B.ifname, B.sb_be, &err) == 0, "add sandbox B elements");
  r = hutch_veth_create(SLOT_A, A.pid, &err);
  ok(r == 0, "veth for A: %s", r ? err.msg : "created");
  if (r) return;
  r = hutch_veth_create(SLOT_A, A.pid, &err);
  ok(r == 0, "veth for A again (a leftover is replaced): %s", r ? err.msg : "ok");
  r = hutch_veth_create(SLOT_B, B.pid, &err);
  ok(r == 0, "veth for B: %s", r ? err.msg : "created");
  if (r) return;

  /* Refusals with nothing left behind. */
  hutch_err_clear(&err);
  ok(hutch_veth_create(SLOT_B + 1, getpid(), &err) < 0 && strcmp(err.code, "invalid_argument") == 0,
     "veth into the host's own namespace refused (%s)", err.msg);
  char nm[16];
  hutch_egress_ifname(SLOT_B + 1, nm);
  ok(if_nametoindex(nm) == 0, "... and no %s left", nm);
  ok(hutch_veth_create(SLOT_B + 1, 999999999, &err) < 0, "veth for a process that does not exist: error");

  /* The host side. */
  char path[128];
  char *v;
  snprintf(path, sizeof path, "/proc/sys/net/ipv6/conf/%s/disable_ipv6", A.ifname);
  v = read_trim(path);
  ok(!v || strcmp(v, "1") == 0, "host side: disable_ipv6 = 1");
  free(v);
  snprintf(path, sizeof path, "/proc/sys/net/ipv4/conf/%s/rp_filter", A.ifname);
  v = read_trim(path);
  is_str(v, "1", "host side: rp_filter = 1 (strict)");
  free(v);
  snprintf(path, sizeof path, "/proc/sys/net/ipv4/conf/%s/forwarding", A.ifname);
  v = read_trim(path);
  is_str(v, "0", "host side: forwarding = 0");
  free(v);
  {
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", A.ifname);
    ok(ioctl(s, SIOCGIFADDR, &ifr) == 0 && ((struct sockaddr_in *)&ifr.ifr_addr)->sin_addr.s_addr == A.host_be,
       "host side has %s", ipstr(A.host_be));
    ok(ioctl(s, SIOCGIFFLAGS, &ifr) == 0 && (ifr.ifr_flags & IFF_UP), "host side is up");
    close(s);
  }
  v = read_trim("/proc/sys/net/ipv6/conf/eth0/disable_ipv6");
  ok((!v && !host_eth0_v6) || (v && host_eth0_v6 && strcmp(v, host_eth0_v6) == 0),
     "the host's own eth0 untouched (the in-namespace sysctl went to the sandbox)");
  free(v);
  free(host_eth0_v6);

  /* Inside. */
  expect_host_be = A.host_be, expect_sb_be = A.sb_be;
  r = in_ns(A.pid, inside_config, NULL);
  is_int(r, 0, "inside A: eth0 %s/30 up, default via %s, IPv6 off (bitmask of failures)", ipstr(A.sb_be),
         ipstr(A.host_be));
  expect_host_be = B.host_be, expect_sb_be = B.sb_be;
  is_int(in_ns(B.pid, inside_config, NULL), 0, "inside B: likewise");

  /* Redirects. */
  ok(dns_roundtrip(&g, &A), "UDP %s:53 from the sandbox reaches the DNS port, the answer comes back from :53",
     ipstr(A.host_be));
  ok(tcp_redirected(&A, 53, g.tcp_dns), "TCP 53 -> DNS port");
  ok(tcp_redirected(&A, 3128, g.proxy), "TCP 3128 -> proxy port");
  ok(tcp_redirected(&A, 80, g.http), "TCP 80 -> http port");
  ok(tcp_redirected(&A, 443, g.tls), "TCP 443 -> tls port");
  ok(tcp_redirected(&B, 443, g.tls), "TCP 443 from B too");

  /* Dropped to the host. */
  struct hutch_nft_counters c1 = counters();
  struct probe other = {.dst_be = htonl(INADDR_LOOPBACK), .port = g.other_port, .timeout_ms = 2000};
  is_int(tcp_connect(&other), 0, "positive control: host port %u is open (from the host)", g.other_port);
  other.dst_be = A.host_be;
  other.timeout_ms = 400;
  is_int(in_ns(A.pid, tcp_connect, &other), 1, "TCP to host port %u from the sandbox: times out (dropped)",
         g.other_port);
  struct probe ssh = {.dst_be = A.host_be, .port = 22, .timeout_ms = 400};
  is_int(in_ns(A.pid, tcp_connect, &ssh), 1, "TCP to host port 22 from the sandbox: times out (not even refused)");
  struct hutch_nft_counters c2 = counters();
  ok(c2.input_other.packets >= c1.input_other.packets + 2, "input_other counted (%llu -> %llu)",
     (unsigned long long)c1.input_other.packets, (unsigned long long)c2.input_other.packets);

  /* Spoofing: a source routed back through the veth (so strict rp_filter
   * passes it) that is not the sandbox's address. */
  {
    const char *argv[] = {"ip", "route", "add", SPOOF_IP "/32", "dev", A.ifname, NULL};
    ok(hutch_run(argv, -1, -1, NULL, NULL, &err) == 0, "host: route %s via %s (test only)", SPOOF_IP, A.ifname);
  }
  is_int(in_ns(A.pid, inside_add_spoof_addr, NULL), 0, "inside A: second address %s", SPOOF_IP);
  struct probe sp = {.dst_be = A.host_be, .port = 53, .src_be = ip4(SPOOF_IP), .timeout_ms = 300};
  is_int(in_ns(A.pid, udp_ping, &sp), 1, "UDP 53 from %s: no answer", SPOOF_IP);
  ok(udp_silent(g.udp_dns, 300), "... and the DNS port received nothing");
  struct hutch_nft_counters c3 = counters();
  ok(c3.spoof.packets >= c2.spoof.packets + 1, "spoof counted (%llu -> %llu)", (unsigned long long)c2.spoof.packets,
     (unsigned long long)c3.spoof.packets);
  ok(dns_roundtrip(&g, &A), "positive control: from its own address the same datagram gets through");

  /* Another sandbox: nothing is routed. */
  is_int(b_receives(&B, 0, 9999, 1500), 1, "positive control: B receives a datagram from the host");
  is_int(b_receives(&B, A.pid, 9999, 600), 0, "B receives nothing from A (forwarding off on the veth)");
  snprintf(path, sizeof path, "/proc/sys/net/ipv4/conf/%s/forwarding", A.ifname);
  ok(sysctl_set(path, "1") == 0, "test only: forwarding on for %s, so packets reach the forward hook", A.ifname);
  struct hutch_nft_counters c4 = counters();
  is_int(b_receives(&B, A.pid, 9999, 600), 0, "B receives nothing from A (forward chain)");
  struct hutch_nft_counters c5 = counters();
  ok(c5.forward.packets >= c4.forward.packets + 1, "forward counted (%llu -> %llu)",
     (unsigned long long)c4.forward.packets, (unsigned long long)c5.forward.packets);
  sysctl_set(path, "0");

  /* IPv6. */
  snprintf(path, sizeof path, "/proc/sys/net/ipv6/conf/%s/disable_ipv6", A.ifname);
  if (access(path, F_OK) == 0) {
    ok(sysctl_set(path, "0") == 0, "test only: IPv6 on for %s, so frames reach netfilter", A.ifname);
    is_int(in_ns(A.pid, inside_send_ipv6, NULL), 0, "inside A: IPv6 frames to ff02::1 sent on eth0");
    usleep(100000);
    struct hutch_nft_counters c6 = counters();
    ok(c6.ipv6.packets >= c5.ipv6.packets + 1, "ipv6 counted (%llu -> %llu)", (unsigned long long)c5.ipv6.packets,
       (unsigned long long)c6.ipv6.packets);
    sysctl_set(path, "1");
  } else {
    ok(1, "# SKIP no IPv6 in this kernel");
  }

  /* Setup again: the same marker leaves the table (and counters) alone;
   * other ports replace it and keep the sandboxes' elements. */
  struct hutch_nft_counters c7 = counters();
  ok(hutch_nft_setup(INSTANCE, &g.ports, &err) == 0, "setup again with the same ports");
  struct hutch_nft_counters c8 = counters();
  ok(c8.spoof.packets == c7.spoof.packets && c8.input_other.packets == c7.input_other.packets,
     "... left the table alone (counters kept)");
  struct hutch_nft_ports other_ports = {(uint16_t)(g.ports.dns ^ 1), g.ports.proxy, g.ports.http, g.ports.tls};
  r = hutch_nft_setup(INSTANCE, &other_ports, &err);
  ok(r == 0, "setup with another DNS port: %s", r ? err.msg : "replaced");
  struct hutch_nft_counters c9 = counters();
  ok(c9.input_other.packets == 0, "... a new table (counters from zero)");
  is_int(in_ns(A.pid, tcp_connect, &ssh), 1, "... A still filtered (its elements were carried over)");
  r = hutch_nft_setup(INSTANCE, &g.ports, &err);
  ok(r == 0, "setup with the original ports: %s", r ? err.msg : "replaced");
  ok(dns_roundtrip(&g, &A), "... DNS redirect from A works again");
  ok(tcp_redirected(&B, 80, g.http), "... and B's elements survived two replacements");

  /* Deleting. */
  r = hutch_nft_del_sandbox(INSTANCE, A.ifname, A.sb_be, &err);
  ok(r == 0, "delete A's elements: %s", r ? err.msg : "ok");
  ok(hutch_nft_del_sandbox(INSTANCE, A.ifname, A.sb_be, &err) == 0, "delete them again: not an error");
  other.timeout_ms = 2000;
  is_int(in_ns(A.pid, tcp_connect, &other), 0, "without its elements, A is no longer filtered (reaches host port %u)",
         g.other_port);
  ok(hutch_veth_delete(SLOT_A, &err) == 0, "delete A's veth");
  ok(if_nametoindex(A.ifname) == 0, "%s is gone", A.ifname);
  is_int(in_ns(A.pid, inside_no_eth0, NULL), 0, "inside A: eth0 is gone with it");
  ok(hutch_veth_delete(SLOT_A, &err) == 0, "delete it again: not an error");
  /* B: its namespace ends first; the pair goes with it. */
  kill(B.pid, SIGKILL);
  waitpid(B.pid, NULL, 0);
  B.pid = 0;
  bool gone = false;
  for (int i = 0; i < 100 && !gone; i++) {
    gone = if_nametoindex(B.ifname) == 0;
    if (!gone) usleep(20000);
  }
  ok(gone, "B's namespace ended: %s went with it", B.ifname);
  ok(hutch_veth_delete(SLOT_B, &err) == 0, "deleting it anyway: not an error");
  ok(hutch_nft_del_sandbox(INSTANCE, B.ifname, B.sb_be, &err) == 0, "delete B's elements");
  ok(hutch_nft_teardown(INSTANCE, &err) == 0, "teardown");
  struct hutch_nft_counters cz;
  hutch_err_clear(&err);
  ok(hutch_nft_counters(INSTANCE, &cz, &err) < 0 && strstr(err.msg, "nft:"),
     "no table: counters fail with nft's message (%s)", err.msg);
  ok(hutch_nft_teardown(INSTANCE, &err) == 0, "teardown again: not an error");
  ok(hutch_nft_del_sandbox(INSTANCE, B.ifname, B.sb_be, &err) == 0, "deleting elements without a table: not an error");
  hutch_err_clear(&err);
  ok(hutch_nft_add_sandbox(INSTANCE, B.ifname, B.sb_be, &err) < 0 && strstr(err.msg, "nft:"),
     "adding without a table: an error with nft's message");
  close(g.udp_dns), close(g.tcp_dns), close(g.proxy), close(g.http), close(g.tls), close(g.other);
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  test_arithmetic();
  test_refusals();
  const char *live_env = getenv("HUTCH_EGRESS_LIVE");
  if (live_env && strcmp(live_env, "1") == 0) {
    if (geteuid() != 0) {
      ok(0, "HUTCH_EGRESS_LIVE=1 needs root");
    } else {
      live();
      live_cleanup();
    }
  } else {
    printf("# live veth/nftables checks skipped (HUTCH_EGRESS_LIVE=1 as root runs them)\n");
  }
  return done_testing();
}
