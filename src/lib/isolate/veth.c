/* A sandbox's veth pair, through rtnetlink with libmnl (see veth.h). */
#include "isolate/veth.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <libmnl/libmnl.h>
#include <linux/if.h>
#include <linux/if_addr.h>
#include <linux/if_link.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/veth.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/util.h"

#define EGRESS_NET 0x0ae70000u /* 10.231.0.0/16 */
#define PREFIX_LEN 30
#define SANDBOX_IFNAME "eth0"

int hutch_egress_addr(uint32_t slot, uint32_t *host_be, uint32_t *sandbox_be) {
  if (slot >= HUTCH_EGRESS_SLOTS) {
    errno = EINVAL;
    return -1;
  }
  uint32_t base = EGRESS_NET + 4u * slot;
  if (host_be) *host_be = htonl(base + 1);
  if (sandbox_be) *sandbox_be = htonl(base + 2);
  return 0;
}

int hutch_egress_ifname(uint32_t slot, char out[16]) {
  out[0] = 0;
  if (slot >= HUTCH_EGRESS_SLOTS) {
    errno = EINVAL;
    return -1;
  }
  snprintf(out, 16, "hg%04x", (unsigned)slot);
  return 0;
}

/* -- rtnetlink ---------------------------------------------------------------- */

struct nl {
  struct mnl_socket *sock;
  unsigned portid, seq;
};

static int nl_open(struct nl *nl, hutch_err *err) {
  nl->sock = mnl_socket_open2(NETLINK_ROUTE, SOCK_CLOEXEC);
  if (!nl->sock) return hutch_err_sys(err, errno, "rtnetlink socket");
  int one = 1;
  /* Errors without the request echoed back, with the kernel's text. */
  (void)mnl_socket_setsockopt(nl->sock, NETLINK_CAP_ACK, &one, sizeof one);
  (void)mnl_socket_setsockopt(nl->sock, NETLINK_EXT_ACK, &one, sizeof one);
  if (mnl_socket_bind(nl->sock, 0, MNL_SOCKET_AUTOPID) < 0) {
    int e = errno;
    mnl_socket_close(nl->sock);
    nl->sock = NULL;
    return hutch_err_sys(err, e, "bind rtnetlink socket");
  }
  nl->portid = mnl_socket_get_portid(nl->sock);
  nl->seq = (unsigned)time(NULL);
  return 0;
}

static void nl_close(struct nl *nl) {
  if (nl->sock) mnl_socket_close(nl->sock);
  nl->sock = NULL;
}

static struct nlmsghdr *nl_msg(struct nl *nl, char *buf, uint16_t type, uint16_t flags) {
  struct nlmsghdr *h = mnl_nlmsg_put_header(buf);
  h->nlmsg_type = type;
  h->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK | flags;
  h->nlmsg_seq = ++nl->seq;
  return h;
}

/* Sends `req` and reads until its acknowledgement.  Each other message of
 * the answer goes to `cb` (may be NULL).  Returns 0, or the kernel's errno
 * (positive) with its extended-ack text in ext (may stay ""), or -1 on a
 * socket failure (errno set). */
static int nl_call(struct nl *nl, struct nlmsghdr *req, mnl_cb_t cb, void *arg, char *ext, size_t extlen) {
  ext[0] = 0;
  if (mnl_socket_sendto(nl->sock, req, req->nlmsg_len) < 0) return -1;
  char buf[MNL_SOCKET_BUFFER_SIZE] __attribute__((aligned(4)));
  for (;;) {
    ssize_t n = mnl_socket_recvfrom(nl->sock, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    int len = (int)n;
    for (struct nlmsghdr *h = (struct nlmsghdr *)buf; mnl_nlmsg_ok(h, len); h = mnl_nlmsg_next(h, &len)) {
      if (h->nlmsg_seq != req->nlmsg_seq || h->nlmsg_pid != nl->portid) continue;
      if (h->nlmsg_type == NLMSG_DONE) return 0;
      if (h->nlmsg_type != NLMSG_ERROR) {
        if (cb && cb(h, arg) < 0) return -1;
        continue;
      }
      if (h->nlmsg_len < mnl_nlmsg_size(sizeof(struct nlmsgerr))) {
        errno = EBADMSG;
        return -1;
      }
      const struct nlmsgerr *e = mnl_nlmsg_get_payload(h);
      if (e->error == 0) return 0;
      if ((h->nlmsg_flags & NLM_F_ACK_TLVS) && (h->nlmsg_flags & NLM_F_CAPPED)) {
        const struct nlattr *a;
        mnl_attr_for_each(a, h, sizeof(struct nlmsgerr)) {
          if (mnl_attr_get_type(a) == NLMSGERR_ATTR_MSG && mnl_attr_validate(a, MNL_TYPE_NUL_STRING) == 0)
            snprintf(ext, extlen, "%s", mnl_attr_get_str(a));
        }
      }
      return -e->error;
    }
  }
}

/* nl_call with the result in a hutch_err; `ok_errno` (0: none) counts as
 * success. */
static int nl_do(struct nl *nl, struct nlmsghdr *req, int ok_errno, const char *what, hutch_err *err) {
  char ext[256];
  int r = nl_call(nl, req, NULL, NULL, ext, sizeof ext);
  if (r == 0 || (ok_errno && r == ok_errno)) return 0;
  if (r < 0) return hutch_err_sys(err, errno, "%s: rtnetlink", what);
  if (ext[0]) return hutch_err_sys(err, r, "%s (%s)", what, ext);
  return hutch_err_sys(err, r, "%s", what);
}

static int got_index(const struct nlmsghdr *h, void *arg) {
  if (h->nlmsg_type == RTM_NEWLINK && h->nlmsg_len >= mnl_nlmsg_size(sizeof(struct ifinfomsg))) {
    const struct ifinfomsg *ifi = mnl_nlmsg_get_payload(h);
    *(int *)arg = ifi->ifi_index;
  }
  return 0;
}

static int link_index(struct nl *nl, const char *name, int *index, hutch_err *err) {
  char buf[512] __attribute__((aligned(4)));
  struct nlmsghdr *h = nl_msg(nl, buf, RTM_GETLINK, 0);
  struct ifinfomsg *ifi = mnl_nlmsg_put_extra_header(h, sizeof *ifi);
  ifi->ifi_family = AF_UNSPEC;
  mnl_attr_put_strz(h, IFLA_IFNAME, name);
  mnl_attr_put_u32(h, IFLA_EXT_MASK, RTEXT_FILTER_SKIP_STATS);
  *index = 0;
  char ext[256];
  int r = nl_call(nl, h, got_index, index, ext, sizeof ext);
  if (r < 0) return hutch_err_sys(err, errno, "get link `%s`: rtnetlink", name);
  if (r > 0) return hutch_err_sys(err, r, "get link `%s`%s%s", name, ext[0] ? ": " : "", ext);
  if (*index <= 0) return hutch_err_sys(err, ENODEV, "get link `%s`: no index in the answer", name);
  return 0;
}

static int link_del(struct nl *nl, const char *name, hutch_err *err) {
  char buf[512] __attribute__((aligned(4)));
  struct nlmsghdr *h = nl_msg(nl, buf, RTM_DELLINK, 0);
  struct ifinfomsg *ifi = mnl_nlmsg_put_extra_header(h, sizeof *ifi);
  ifi->ifi_family = AF_UNSPEC;
  mnl_attr_put_strz(h, IFLA_IFNAME, name);
  cleanup_free char *what = xasprintf("delete link `%s`", name);
  return nl_do(nl, h, ENODEV, what, err);
}

static int link_up(struct nl *nl, const char *name, hutch_err *err) {
  char buf[512] __attribute__((aligned(4)));
  struct nlmsghdr *h = nl_msg(nl, buf, RTM_NEWLINK, 0);
  struct ifinfomsg *ifi = mnl_nlmsg_put_extra_header(h, sizeof *ifi);
  ifi->ifi_family = AF_UNSPEC;
  ifi->ifi_flags = IFF_UP;
  ifi->ifi_change = IFF_UP;
  mnl_attr_put_strz(h, IFLA_IFNAME, name);
  cleanup_free char *what = xasprintf("set link `%s` up", name);
  return nl_do(nl, h, 0, what, err);
}

/* host (in the caller's namespace) <-> peer (created in netns_fd's). */
static int link_add_veth(struct nl *nl, const char *host, const char *peer, int netns_fd, hutch_err *err) {
  char buf[1024] __attribute__((aligned(4)));
  struct nlmsghdr *h = nl_msg(nl, buf, RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL);
  struct ifinfomsg *ifi = mnl_nlmsg_put_extra_header(h, sizeof *ifi);
  ifi->ifi_family = AF_UNSPEC;
  mnl_attr_put_strz(h, IFLA_IFNAME, host);
  struct nlattr *linkinfo = mnl_attr_nest_start(h, IFLA_LINKINFO);
  mnl_attr_put_strz(h, IFLA_INFO_KIND, "veth");
  struct nlattr *data = mnl_attr_nest_start(h, IFLA_INFO_DATA);
  struct nlattr *peer_nest = mnl_attr_nest_start(h, VETH_INFO_PEER);
  struct ifinfomsg *pifi = mnl_nlmsg_put_extra_header(h, sizeof *pifi);
  pifi->ifi_family = AF_UNSPEC;
  mnl_attr_put_strz(h, IFLA_IFNAME, peer);
  mnl_attr_put_u32(h, IFLA_NET_NS_FD, (uint32_t)netns_fd);
  mnl_attr_nest_end(h, peer_nest);
  mnl_attr_nest_end(h, data);
  mnl_attr_nest_end(h, linkinfo);
  cleanup_free char *what = xasprintf("create veth `%s` <-> `%s` (in the sandbox)", host, peer);
  return nl_do(nl, h, 0, what, err);
}

static int addr_add(struct nl *nl, int index, const char *name, uint32_t addr_be, hutch_err *err) {
  char buf[512] __attribute__((aligned(4)));
  struct nlmsghdr *h = nl_msg(nl, buf, RTM_NEWADDR, NLM_F_CREATE | NLM_F_REPLACE);
  struct ifaddrmsg *ifa = mnl_nlmsg_put_extra_header(h, sizeof *ifa);
  ifa->ifa_family = AF_INET;
  ifa->ifa_prefixlen = PREFIX_LEN;
  ifa->ifa_scope = RT_SCOPE_UNIVERSE;
  ifa->ifa_index = (unsigned)index;
  uint32_t bcast = addr_be | htonl((1u << (32 - PREFIX_LEN)) - 1);
  mnl_attr_put_u32(h, IFA_LOCAL, addr_be);
  mnl_attr_put_u32(h, IFA_ADDRESS, addr_be);
  mnl_attr_put_u32(h, IFA_BROADCAST, bcast);
  char ip[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &addr_be, ip, sizeof ip);
  cleanup_free char *what = xasprintf("add address %s/%d to `%s`", ip, PREFIX_LEN, name);
  return nl_do(nl, h, 0, what, err);
}

static int route_default(struct nl *nl, int index, uint32_t gw_be, hutch_err *err) {
  char buf[512] __attribute__((aligned(4)));
  struct nlmsghdr *h = nl_msg(nl, buf, RTM_NEWROUTE, NLM_F_CREATE | NLM_F_REPLACE);
  struct rtmsg *rtm = mnl_nlmsg_put_extra_header(h, sizeof *rtm);
  rtm->rtm_family = AF_INET;
  rtm->rtm_dst_len = 0;
  rtm->rtm_table = RT_TABLE_MAIN;
  rtm->rtm_protocol = RTPROT_STATIC;
  rtm->rtm_scope = RT_SCOPE_UNIVERSE;
  rtm->rtm_type = RTN_UNICAST;
  mnl_attr_put_u32(h, RTA_GATEWAY, gw_be);
  mnl_attr_put_u32(h, RTA_OIF, (uint32_t)index);
  return nl_do(nl, h, 0, "add the default route", err);
}

/* /proc/sys/net/<path> = value.  A missing IPv6 tree (ipv6.disable=1: no
 * IPv6 at all) is not an error when ipv6_optional. */
static int sysctl_net(const char *path, const char *value, bool ipv6_optional, hutch_err *err) {
  cleanup_free char *full = xasprintf("/proc/sys/net/%s", path);
  hutch_err e = HUTCH_ERR_INIT;
  if (write_file_str(full, value, &e) == 0) return 0;
  if (ipv6_optional && e.errnum == ENOENT && access("/proc/sys/net/ipv6", F_OK) != 0) return 0;
  *err = e;
  return hutch_err_wrap(err, "sysctl");
}

/* -- inside the sandbox's network namespace --------------------------------- */

struct ns_job {
  int netns_fd;
  uint32_t host_be, sandbox_be;
  int rc;
  hutch_err err;
};

static int configure_inside(struct ns_job *job) {
  hutch_err *err = &job->err;
  struct nl nl = {0};
  if (nl_open(&nl, err) < 0) return -1;
  int index = 0, r = -1;
  if (link_index(&nl, SANDBOX_IFNAME, &index, err) < 0) goto out;
  /* Before the link goes up: no IPv6 link-local address ever appears.
   * /proc/sys/net is the current thread's network namespace. */
  if (sysctl_net("ipv6/conf/" SANDBOX_IFNAME "/disable_ipv6", "1", true, err) < 0) goto out;
  if (addr_add(&nl, index, SANDBOX_IFNAME, job->sandbox_be, err) < 0) goto out;
  if (link_up(&nl, SANDBOX_IFNAME, err) < 0) goto out;
  if (route_default(&nl, index, job->host_be, err) < 0) goto out;
  r = 0;
out:
  nl_close(&nl);
  return r;
}

static void *ns_thread(void *arg) {
  struct ns_job *job = arg;
  if (setns(job->netns_fd, CLONE_NEWNET) < 0) {
    job->rc = hutch_err_sys(&job->err, errno, "setns into the sandbox's network namespace");
    return NULL;
  }
  job->rc = configure_inside(job);
  return NULL; /* the thread, and its namespace, end here */
}

/* -- the pair ------------------------------------------------------------------ */

static int host_side(struct nl *nl, const char *host, uint32_t host_be, hutch_err *err) {
  cleanup_free char *v6 = xasprintf("ipv6/conf/%s/disable_ipv6", host);
  cleanup_free char *rp = xasprintf("ipv4/conf/%s/rp_filter", host);
  cleanup_free char *al = xasprintf("ipv4/conf/%s/accept_local", host);
  cleanup_free char *fw = xasprintf("ipv4/conf/%s/forwarding", host);
  /* IPv6 off before the link is up (no link-local address).  rp_filter 1:
   * strict (the effective value is the maximum of this and conf/all: an
   * `all` of 2 makes it loose).  accept_local 0: a packet carrying one of
   * the host's own addresses as its source is a martian.  forwarding 0:
   * the kernel does not route what arrives here (defence in depth: a
   * later write to net.ipv4.ip_forward resets it; the nftables forward
   * chain is what guarantees it).  The gateway's redirect needs none of
   * them relaxed: redirected packets are delivered locally to the primary
   * address of this interface. */
  if (sysctl_net(v6, "1", true, err) < 0 || sysctl_net(rp, "1", false, err) < 0 ||
      sysctl_net(al, "0", false, err) < 0 || sysctl_net(fw, "0", false, err) < 0)
    return -1;
  int index = 0;
  if (link_index(nl, host, &index, err) < 0) return -1;
  if (addr_add(nl, index, host, host_be, err) < 0) return -1;
  return link_up(nl, host, err);
}

int hutch_veth_create_netns(uint32_t slot, int netns_fd, hutch_err *err) {
  char host[16];
  uint32_t host_be, sandbox_be;
  if (hutch_egress_ifname(slot, host) < 0 || hutch_egress_addr(slot, &host_be, &sandbox_be) < 0)
    return hutch_err_invalid(err, "egress slot %u out of range (0-%u)", slot, HUTCH_EGRESS_SLOTS - 1);
  /* The peer and its default route must never land in the host's own
   * namespace. */
  struct stat self_st, ns_st;
  if (fstat(netns_fd, &ns_st) < 0) return hutch_err_sys(err, errno, "stat the sandbox's network namespace");
  if (stat("/proc/thread-self/ns/net", &self_st) < 0) return hutch_err_sys(err, errno, "stat own network namespace");
  if (self_st.st_dev == ns_st.st_dev && self_st.st_ino == ns_st.st_ino)
    return hutch_err_invalid(err, "veth `%s`: the sandbox shares the host's network namespace", host);

  struct nl nl = {0};
  if (nl_open(&nl, err) < 0) return hutch_err_wrap(err, "veth `%s`", host);
  int r = -1;
  bool created = false;
  /* A leftover from a crashed sandbox in this slot. */
  if (link_del(&nl, host, err) < 0) goto out;
  if (link_add_veth(&nl, host, SANDBOX_IFNAME, netns_fd, err) < 0) goto out;
  created = true;
  if (host_side(&nl, host, host_be, err) < 0) goto out;
  {
    struct ns_job job = {.netns_fd = netns_fd, .host_be = host_be, .sandbox_be = sandbox_be, .rc = -1};
    pthread_t t;
    int pe = pthread_create(&t, NULL, ns_thread, &job);
    if (pe != 0) {
      hutch_err_sys(err, pe, "start the namespace thread");
      goto out;
    }
    pthread_join(t, NULL);
    if (job.rc < 0) {
      *err = job.err;
      hutch_err_wrap(err, "inside the sandbox");
      goto out;
    }
  }
  r = 0;
out:
  if (r < 0 && created) {
    hutch_err ignored = HUTCH_ERR_INIT;
    (void)link_del(&nl, host, &ignored);
  }
  nl_close(&nl);
  if (r < 0) hutch_err_wrap(err, "veth `%s`", host);
  return r;
}

int hutch_veth_create(uint32_t slot, pid_t sandbox_pid, hutch_err *err) {
  if (sandbox_pid <= 0) return hutch_err_invalid(err, "veth: invalid sandbox pid %d", (int)sandbox_pid);
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/ns/net", (int)sandbox_pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return hutch_err_sys(err, errno, "veth: open `%s`", path);
  int r = hutch_veth_create_netns(slot, fd, err);
  close(fd);
  return r;
}

int hutch_veth_delete(uint32_t slot, hutch_err *err) {
  char host[16];
  if (hutch_egress_ifname(slot, host) < 0)
    return hutch_err_invalid(err, "egress slot %u out of range (0-%u)", slot, HUTCH_EGRESS_SLOTS - 1);
  struct nl nl = {0};
  if (nl_open(&nl, err) < 0) return hutch_err_wrap(err, "veth `%s`", host);
  int r = link_del(&nl, host, err);
  nl_close(&nl);
  if (r < 0) hutch_err_wrap(err, "veth `%s`", host);
  return r;
}
