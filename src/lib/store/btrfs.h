/* Thin wrappers over the btrfs ioctls hutch needs on its hot paths
 * (libbtrfsutil for subvolumes, raw ioctls for quota groups and resize).
 *
 * Every function takes host paths inside a mounted btrfs and reports
 * failures in the hutch error convention with the path named.
 */
#ifndef HUTCH_BTRFS_H
#define HUTCH_BTRFS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"

/* Whether `path` lives on a btrfs filesystem. */
bool hutch_btrfs_is(const char *path);
/* Whether `path` is the root of a btrfs subvolume. */
bool hutch_btrfs_is_subvolume(const char *path);

int hutch_btrfs_subvol_create(const char *path, hutch_err *err);
/* Snapshot subvolume `src` at `dst` (O(1): shares every block). */
int hutch_btrfs_snapshot(const char *src, const char *dst, bool readonly, hutch_err *err);
/* Delete a subvolume and any subvolumes beneath it.  Absent: 0. */
int hutch_btrfs_subvol_delete(const char *path, hutch_err *err);
int hutch_btrfs_set_readonly(const char *path, bool ro, hutch_err *err);

struct hutch_btrfs_subvol {
  uint64_t id;
  uint64_t generation; /* transaction that last changed the subvolume */
  char uuid[37];
  char parent_uuid[37];   /* "" when not a snapshot */
  char received_uuid[37]; /* "" unless made by receive */
  bool readonly;
};
int hutch_btrfs_subvol_info(const char *path, struct hutch_btrfs_subvol *out, hutch_err *err);

/* Quota groups (level 0: one per subvolume). */
bool hutch_btrfs_quota_enabled(const char *mnt);
/* Simple quotas where the kernel has them (*simple set), else full ones. */
int hutch_btrfs_quota_enable(const char *mnt, bool *simple, hutch_err *err);
bool hutch_btrfs_quota_simple(const char *mnt);
/* Limit the bytes only this subvolume references (0 = no limit).  Writes
 * beyond it fail with EDQUOT inside the subvolume. */
int hutch_btrfs_qgroup_limit(const char *path, uint64_t max_excl, hutch_err *err);
/* Referenced and exclusive bytes of subvolume `subvol_id` as of the last
 * committed transaction. */
int hutch_btrfs_qgroup_usage(const char *mnt, uint64_t subvol_id, uint64_t *rfer, uint64_t *excl, hutch_err *err);

/* Commit the current transaction (qgroup numbers become current). */
int hutch_btrfs_sync(const char *mnt, hutch_err *err);
/* Bytes allocated to data and metadata that are in use, and the device size. */
int hutch_btrfs_space(const char *mnt, uint64_t *used, uint64_t *size, hutch_err *err);
/* Grow the filesystem to its device's size (after the loop file grew). */
int hutch_btrfs_resize_max(const char *mnt, hutch_err *err);
/* Path of device 1 (e.g. /dev/loop3), for the loop-backed pool. */
int hutch_btrfs_device_path(const char *mnt, char *out, size_t n, hutch_err *err);

#endif
