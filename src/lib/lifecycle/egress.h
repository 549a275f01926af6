/* Egress: a sandbox's way out, through hutch-gateway only (docs/network.md).
 *
 * hutchd starts hutch-gateway (unprivileged), loads the nftables ruleset,
 * and for each sandbox whose policy is not "none": a veth pair into its
 * network namespace (address from its uid slot), the interface and address
 * added to the ruleset's sets, the policy pushed to the gateway, and
 * /etc/resolv.conf plus hutch's CA written into its root.  A gateway that
 * restarts starts empty (everything denied) until hutchd pushes again.
 */
#ifndef HUTCH_EGRESS_H
#define HUTCH_EGRESS_H

#include <jansson.h>
#include <stdbool.h>

#include "common/err.h"
#include "lifecycle/daemon.h"

/* At hutchd start: ruleset, gateway process, control connection. */
int hutch_egress_start(struct hutch_ctx *ctx, hutch_err *err);
void hutch_egress_stop(struct hutch_ctx *ctx);
/* Reaper tick: restart a gateway that died and push every policy again. */
void hutch_egress_tick(struct hutch_ctx *ctx);

/* Validate and normalise `network` of a create request or a PUT body
 * ({"egress": "none"|"all"|{"allow":[…],"deny":[…]}}); *out is the stored
 * form (new reference). */
int hutch_egress_parse(json_t *network, json_t **out, hutch_err *err);
/* The sandbox's policy is not "none". */
bool hutch_egress_wanted(const struct hutch_sandbox_rec *r);
bool hutch_egress_wanted_json(json_t *network); /* {"egress": …} */

/* A sandbox's processes started (init_pid known) / are going away. */
int hutch_egress_up(struct hutch_ctx *ctx, const struct hutch_sandbox_rec *r, hutch_err *err);
void hutch_egress_down(struct hutch_ctx *ctx, const struct hutch_sandbox_rec *r);
/* The policy of a running sandbox changed (stored already). */
int hutch_egress_update(struct hutch_ctx *ctx, const struct hutch_sandbox_rec *r, hutch_err *err);

/* The audit lines of a sandbox, newest last, at most `limit`. */
json_t *hutch_egress_audit(struct hutch_ctx *ctx, const char *sb_id, size_t limit, hutch_err *err);

#endif
