/* hutch-gateway's audit log (issue 8): one JSON line per decision, appended
 * to DIR/<sandbox>.jsonl (traffic from unknown sources: unknown.jsonl).
 *
 *   {"time":"2026-12-01T10:00:00.123Z","sandbox":"sb_x","proto":"connect",
 *    "name":"pypi.org","addr":"151.101.0.223","port":443,"decision":"allowed",
 *    "rule":"pypi.org","reason":"allowed by rule","bytes_up":0,"bytes_down":0}
 *
 * decision is "allowed" or "denied" (the decision, written when it is
 * made), "error" (allowed, but the gateway could not complete it:
 * resolution, connection or upstream TLS failed) or "closed" (an allowed
 * connection ended: its byte counts; bytes_up went to the destination,
 * bytes_down to the sandbox, both plaintext).  name, addr, port and rule are null when there is none.
 * A file that reaches the size cap is renamed to <file>.1 (replacing the
 * previous one) and a new one is started. */
#ifndef HUTCH_GATEWAY_AUDIT_H
#define HUTCH_GATEWAY_AUDIT_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define GW_AUDIT_CAP_DEFAULT (10u << 20)

struct gw_audit_rec {
  const char *sandbox;  /* NULL: "unknown" */
  const char *proto;    /* "dns", "http", "connect", "tls" */
  const char *name;     /* may be NULL */
  const char *addr;     /* may be NULL */
  int port;             /* 0: null */
  const char *decision; /* "allowed", "denied", "error", "closed" */
  const char *rule;     /* canonical rule text or NULL */
  const char *reason;
  uint64_t bytes_up, bytes_down;
};

/* The line, newline included (free it).  Strings that are not UTF-8 are
 * written with U+FFFD. */
char *gw_audit_line(const struct gw_audit_rec *r, uint64_t time_ms);

/* Append one line to dirfd/<sandbox>.jsonl (O_APPEND, O_NOFOLLOW, 0640),
 * rotating first when the file is at least `cap` bytes. */
int gw_audit_write(int dirfd, const struct gw_audit_rec *r, size_t cap, hutch_err *err);

#endif
