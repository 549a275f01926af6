/* The egress firewall: one nftables table per hutchd instance,
 * `table inet hutch_egress_<instance>` (`hutch_egress` when instance is
 * NULL), as docs/network.md ("Plumbing and gateway") specifies, through
 * libnftables.  One table per instance because each hutchd runs its own
 * gateway on its own ports (two hutchd on one host, as in the integration
 * tests, must not redirect each other's sandboxes); sandbox interface names
 * are host-wide unique (uid slots), so the tables never overlap.
 *
 * hutchd loads the table once at start (hutch_nft_setup, idempotent); each
 * sandbox with egress then only adds and deletes elements of two sets
 * (hutch_nft_add_sandbox / hutch_nft_del_sandbox, one transaction each).
 * Every drop is counted in a named counter (spoof, input_other, forward,
 * ipv6) that hutch_nft_counters reads.
 *
 * Order for the lifecycle: hutch_nft_add_sandbox BEFORE hutch_veth_create
 * (the sets match interface names, so the rules apply from the moment the
 * interface exists: there is no window in which a sandbox's veth is
 * unfiltered), and hutch_veth_delete before hutch_nft_del_sandbox.
 *
 * Thread-safe (calls are serialised inside: libnftables is not).  Needs
 * CAP_NET_ADMIN in the host's network namespace. */
#ifndef HUTCH_NFT_H
#define HUTCH_NFT_H

#include <stdint.h>

#include "common/err.h"

#define HUTCH_NFT_TABLE "hutch_egress"

/* The gateway's ports the prerouting chain redirects to. */
struct hutch_nft_ports {
  uint16_t dns;   /* UDP and TCP 53   → dns   (default 15353) */
  uint16_t proxy; /* TCP 3128         → proxy (default 15128) */
  uint16_t http;  /* TCP 80           → http  (default 15080) */
  uint16_t tls;   /* TCP 443          → tls   (default 15443) */
};
#define HUTCH_NFT_PORTS_DEFAULT {15353, 15128, 15080, 15443}

struct hutch_nft_counter {
  uint64_t packets, bytes;
};
/* One named counter per drop reason. */
struct hutch_nft_counters {
  struct hutch_nft_counter spoof;       /* source is not the interface's own address */
  struct hutch_nft_counter input_other; /* to the host, not a gateway port */
  struct hutch_nft_counter forward;     /* would be routed (other sandboxes, the outside) */
  struct hutch_nft_counter ipv6;        /* any IPv6 from a sandbox interface */
};

/* Every function takes `instance` first: NULL (table hutch_egress), or 1-40
 * characters of [A-Za-z0-9_] (hutchd passes its 12 hex characters: table
 * hutch_egress_<instance>); anything else is refused.
 *
 * Creates the table (ports NULL: the defaults).  Idempotent: if the table
 * exists and carries this version's marker (a table comment naming the rule
 * set version and the ports) it is left alone, with its elements and
 * counters.  Otherwise it is deleted and recreated in ONE transaction (no
 * moment without the drop rules), and the elements the old table's sets
 * held are added back in that same transaction. */
int hutch_nft_setup(const char *instance, const struct hutch_nft_ports *ports, hutch_err *err);

/* Adds `ifname` to @sandbox_ifs and `ifname . ipv4` (network byte order) to
 * @sandbox_src, in one transaction.  Adding what is there is not an error.
 * ifname: 1-15 characters of [A-Za-z0-9_-] (anything else is refused before
 * nftables sees it). */
int hutch_nft_add_sandbox(const char *instance, const char *ifname, uint32_t ipv4_be, hutch_err *err);
/* Deletes them; a missing element (or a missing table) is not an error. */
int hutch_nft_del_sandbox(const char *instance, const char *ifname, uint32_t ipv4_be, hutch_err *err);

/* Packets and bytes of each named counter. */
int hutch_nft_counters(const char *instance, struct hutch_nft_counters *out, hutch_err *err);

/* Deletes the table (tests; a host being cleaned).  Missing is not an error. */
int hutch_nft_teardown(const char *instance, hutch_err *err);

#endif
