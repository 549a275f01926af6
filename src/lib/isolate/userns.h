/* User namespaces: uid/gid maps and idmapped mounts (parent side, host root).
 *
 * Sandbox uid/gid 0..count-1 map to host base..base+count-1, a range no
 * host user owns.  The rootfs on disk stays owned by uid 0..65535 ("container
 * ids"); an idmapped mount presents it to the sandbox's user namespace, so a
 * rootfs is never chown-ed and can move between uid ranges (after a restore,
 * on another host). */
#ifndef HUTCH_USERNS_H
#define HUTCH_USERNS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"

/* Sandbox files are stored on disk under this unprivileged range
 * ("storage ids"): container id c is disk id HUTCH_STORAGE_UID_BASE + c, so
 * nothing a sandbox creates (a setuid binary, say) is owned by a real host
 * user, and a rootfs can move between sandboxes' uid ranges unchanged. */
#define HUTCH_STORAGE_UID_BASE 134217728u /* 1 << 27, below the sandbox ranges */

/* Write /proc/<pid>/{uid_map,gid_map} ("0 base count"). */
int hutch_userns_write_maps(pid_t pid, uint32_t base, uint32_t count, hutch_err *err);

/* A user namespace fd whose maps are "ns_first host_first count", made by a
 * short-lived child; used only to idmap mounts (storage ids -> sandbox ids). */
int hutch_userns_fd(uint32_t ns_first, uint32_t host_first, uint32_t count, hutch_err *err);

/* Clone the tree at `path` into a detached mount, idmapped to the user
 * namespace `userns_fd`, with the given extra MOUNT_ATTR_* flags.  Returns
 * an O_CLOEXEC mount fd to be attached with move_mount(2). */
int hutch_userns_idmapped_tree(const char *path, int userns_fd, uint64_t attr_set, hutch_err *err);

/* Slots of host uids: each sandbox holds one slot of 65536 ids at
 * base + slot*65536.  A slot is claimed host-wide (across hutchd instances)
 * by creating <lockdir>/<slot> with O_EXCL; its content names the owner. */
#define HUTCH_UID_SLOT_SIZE 65536u
int hutch_uid_slot_claim(const char *lockdir, uint32_t nslots, const char *owner, uint32_t *slot_out,
                         hutch_err *err);
int hutch_uid_slot_release(const char *lockdir, uint32_t slot, hutch_err *err);
/* Make sure `slot` is claimed by `owner` (after a reboot cleared the lock
 * directory): 0 when it is ours now, 1 when someone else holds it. */
int hutch_uid_slot_reclaim(const char *lockdir, uint32_t slot, const char *owner, hutch_err *err);

#endif
