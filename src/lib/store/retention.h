/* Tiered retention of a sandbox's automatic snapshots, in the style of
 * `restic forget --keep-last N --keep-hourly H --keep-daily D`.
 *
 * Semantics of hutch_retention_select (a pure function):
 *
 *  - Snapshots created after now_ms (clock skew) are always kept and take
 *    no part in the rules below: they use up no rule's count.
 *  - The others are ordered newest first: by created_ms descending; equal
 *    times by index descending (the later entry counts as newer).
 *  - Each rule walks that order on its own, and a snapshot is kept if any
 *    rule keeps it (the rules do not see each other's choices):
 *      keep_last  keeps the keep_last newest snapshots;
 *      hourly     keeps the newest snapshot of each of the `hourly` most
 *                 recent clock hours that contain a snapshot, the hour
 *                 being floor(created_ms / 3600000) (UTC);
 *      daily      likewise for the `daily` most recent UTC days,
 *                 floor(created_ms / 86400000).
 *    So with keep_last=1, hourly=2 and snapshots at 10:50, 10:20, 09:40,
 *    the kept ones are 10:50 (by keep_last and by hourly) and 09:40
 *    (hourly): hours count even when another rule already kept their
 *    newest snapshot, as in restic.
 *  - A zero policy {0,0,0} keeps nothing (but future snapshots).
 *
 * O(n log n): one sort of an index copy; n up to 100000.
 */
#ifndef HUTCH_STORE_RETENTION_H
#define HUTCH_STORE_RETENTION_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define HUTCH_RETENTION_MAX 10000 /* per field */

struct hutch_retention {
  uint32_t keep_last;
  uint32_t hourly;
  uint32_t daily;
};

/* created_ms[0..n): creation times in any order.  keep[0..n) is fully
 * written: true for the snapshots to keep. */
void hutch_retention_select(const uint64_t *created_ms, size_t n, uint64_t now_ms, const struct hutch_retention *p,
                            bool *keep);

/* {"keep_last":N,"hourly":H,"daily":D}: each an integer 0..10000; a missing
 * (or null) key leaves that field of *out as it was (the caller's
 * defaults).  A non-object, an unknown key, a non-integer or an
 * out-of-range value is 400 "invalid_argument" naming the field, and then
 * *out is left untouched. */
int hutch_retention_parse(json_t *obj, struct hutch_retention *out, hutch_err *err);

/* {"keep_last":N,"hourly":H,"daily":D} (a new reference). */
json_t *hutch_retention_to_json(const struct hutch_retention *p);

#endif
