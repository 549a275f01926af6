/* hutch-gateway's control protocol and its table of sandboxes (issue 8).
 *
 * hutchd speaks JSON lines over the gateway's unix socket (mode 0600), one
 * request per line, each answered with one line:
 *
 *   {"op":"set","sandbox":"sb_x","addr":"10.231.0.6","policy":<egress>}
 *       -> {"ok":true}
 *   {"op":"remove","sandbox":"sb_x"}      -> {"ok":true}  (also when absent)
 *   {"op":"list"}  -> {"ok":true,"sandboxes":[{"sandbox","addr","policy"},...]}
 *   anything else  -> {"ok":false,"error":"..."}
 *
 * A sandbox id is 1..64 of [A-Za-z0-9_-] and not "unknown" (it names the
 * audit file; "unknown" is where traffic from unknown sources is logged).
 * An address is one IPv4 unicast address, the sandbox's source address; it
 * belongs to one sandbox at a time (setting it for another is an error:
 * remove the old one first).  `set` for a known sandbox replaces its policy
 * and may move it to another address.  The policy is net/policy.h's JSON.
 * Unknown members are refused.  Lines are at most GW_CTL_LINE_MAX bytes. */
#ifndef HUTCH_GATEWAY_CONTROL_H
#define HUTCH_GATEWAY_CONTROL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "net/addr.h"
#include "net/policy.h"

#define GW_SANDBOX_ID_MAX 64
#define GW_MAX_SANDBOXES 16384
#define GW_CTL_LINE_MAX (256u << 10)
#define GW_CTL_LIST_MAX (16u << 20) /* a list answer longer than this is an error */

struct gw_sandbox {
  char id[GW_SANDBOX_ID_MAX + 1];
  struct hutch_ip addr; /* AF_INET */
  struct hutch_policy *policy;
};

struct gw_table {
  struct gw_sandbox *v;
  size_t n, cap;
};

void gw_table_init(struct gw_table *t);
void gw_table_free(struct gw_table *t);
/* The sandbox whose source address is ip (AF_INET), or NULL: unknown. */
const struct gw_sandbox *gw_table_find_addr(const struct gw_table *t, const struct hutch_ip *ip);
const struct gw_sandbox *gw_table_find_id(const struct gw_table *t, const char *id);
/* Takes the policy (freed on failure too).  400 when the address is
 * another sandbox's, 503 when the table is full. */
int gw_table_set(struct gw_table *t, const char *id, const struct hutch_ip *addr, struct hutch_policy *policy,
                 hutch_err *err);
/* 1 removed (its address in *addr when not NULL), 0 not there. */
int gw_table_remove(struct gw_table *t, const char *id, struct hutch_ip *addr);

bool gw_sandbox_id_ok(const char *s);

enum gw_ctl_op { GW_CTL_SET = 1, GW_CTL_REMOVE, GW_CTL_LIST };

struct gw_ctl_cmd {
  enum gw_ctl_op op;
  char sandbox[GW_SANDBOX_ID_MAX + 1];
  struct hutch_ip addr;
  struct hutch_policy *policy; /* SET; owned */
};

/* Parse one line (without its newline).  400 with a message naming the
 * field on failure. */
int gw_ctl_parse(const char *line, size_t len, struct gw_ctl_cmd *cmd, hutch_err *err);
void gw_ctl_cmd_clear(struct gw_ctl_cmd *cmd);

/* What a handled line changed, for the event loop. */
struct gw_ctl_effect {
  bool addr_gone;          /* an address stopped belonging to a sandbox: close its connections */
  struct hutch_ip gone;
  bool changed;            /* the table changed */
};

/* Parse and apply one line; the answer line, newline included (free it). */
char *gw_ctl_handle(struct gw_table *t, const char *line, size_t len, struct gw_ctl_effect *eff);

#endif
