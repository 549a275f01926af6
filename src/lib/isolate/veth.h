/* A sandbox's veth pair to the egress gateway (docs/network.md, "Plumbing
 * and gateway"), through rtnetlink.
 *
 * Slot S (the sandbox's host-wide uid slot, < HUTCH_EGRESS_SLOTS) gives the
 * /30 number S in 10.231.0.0/16: host side `hg<S as 4 hex digits>` with
 * 10.231.0.0 + 4S + 1, sandbox side `eth0` with + 2 and a default route via
 * the host side.  IPv6 is disabled on both ends.
 *
 * Lifecycle order: hutch_nft_add_sandbox first (isolate/nft.h), then
 * hutch_veth_create; at the end hutch_veth_delete, then
 * hutch_nft_del_sandbox.  Needs CAP_NET_ADMIN and CAP_SYS_ADMIN on the host
 * (hutchd or the shim as root). */
#ifndef HUTCH_VETH_H
#define HUTCH_VETH_H

#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"

#define HUTCH_EGRESS_SLOTS 16384u /* /30s in a /16 */

/* The host side's and the sandbox side's addresses (network byte order).
 * Returns 0, or -1 (errno EINVAL) for slot >= HUTCH_EGRESS_SLOTS. */
int hutch_egress_addr(uint32_t slot, uint32_t *host_be, uint32_t *sandbox_be);
/* The host side's interface name, "hg%04x".  Returns 0, or -1 (errno
 * EINVAL, out = "") for slot >= HUTCH_EGRESS_SLOTS. */
int hutch_egress_ifname(uint32_t slot, char out[16]);

/* Creates and configures the pair for `slot`, the peer inside the network
 * namespace of `sandbox_pid` (opened as /proc/<pid>/ns/net; refused if that
 * is the caller's own namespace):
 *   host:    hgXXXX, 10.231.x.y+1/30, up; ipv6 disable_ipv6=1, ipv4
 *            rp_filter=1 (strict), accept_local=0, forwarding=0;
 *   sandbox: eth0, 10.231.x.y+2/30, up, default via the host side,
 *            disable_ipv6=1.
 * The peer is created directly in the sandbox's namespace under its final
 * name (IFLA_NET_NS_FD in the veth peer's attributes): it never exists in
 * the host's namespace and is never renamed.  A leftover hgXXXX (a crashed
 * predecessor in the same slot) is deleted first.  On failure nothing is
 * left behind.
 *
 * The in-namespace part runs on a short-lived thread that setns()'s into
 * the sandbox's network namespace, configures eth0 there and exits; the
 * calling thread never changes namespace.  A thread rather than fork():
 * hutchd and the shim are multithreaded, and a forked child of a
 * multithreaded process may not allocate; a thread's setns(CLONE_NEWNET)
 * affects only that thread and ends with it. */
int hutch_veth_create(uint32_t slot, pid_t sandbox_pid, hutch_err *err);
/* The same with an open network namespace fd (not consumed). */
int hutch_veth_create_netns(uint32_t slot, int netns_fd, hutch_err *err);

/* Deletes hgXXXX (and with it the sandbox's eth0).  Missing is not an
 * error (the pair also disappears by itself when the sandbox's network
 * namespace ends). */
int hutch_veth_delete(uint32_t slot, hutch_err *err);

#endif
