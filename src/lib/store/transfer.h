/* Moving snapshots between hosts: export a snapshot as one checksummed,
 * zstd-compressed stream (store/archive.h) whose payload is `btrfs send`
 * output, incremental against a parent snapshot when one is given; import
 * verifies the whole stream before `btrfs receive` makes anything, in the
 * pool's staging area, and only a complete snapshot is renamed into place.
 */
#ifndef HUTCH_TRANSFER_H
#define HUTCH_TRANSFER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "store/pool.h"

/* snap_ followed by 1-55 of [a-z0-9]: safe as a path component. */
bool hutch_snapshot_id_valid(const char *id);

struct hutch_export_stats {
  uint64_t raw_bytes;   /* the send stream */
  uint64_t total_bytes; /* the archive */
  char sha256_hex[65];
};
/* Write the archive of snapshot `snap_id` (incremental to `parent_id` when
 * not NULL: both must be in the pool) with `meta_json` to out_fd. */
int hutch_snapshot_export(const struct hutch_pool *p, const char *snap_id, const char *parent_id,
                          const char *meta_json, int out_fd, struct hutch_export_stats *st, hutch_err *err);
/* Check a whole uploaded archive (a seekable file); *meta_json on success. */
int hutch_snapshot_import_verify(int fd, char **meta_json, hutch_err *err);
/* Receive a verified archive as snapshots/<snap_id>.  409 when the
 * snapshot exists or the parent of an incremental stream is missing; 400
 * for a stream btrfs rejects.  Nothing is left behind on failure. */
int hutch_snapshot_import_receive(const struct hutch_pool *p, int fd, const char *snap_id, hutch_err *err);

#endif
