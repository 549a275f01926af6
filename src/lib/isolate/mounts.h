/* The sandbox's filesystem view, assembled inside its own mount namespace
 * (child side, uid 0 of the sandbox's user namespace).  Nothing done here is
 * visible on the host: / is made private first. */
#ifndef HUTCH_MOUNTS_H
#define HUTCH_MOUNTS_H

#include <stdint.h>

#include "common/err.h"

struct hutch_rootfs_plan {
  int rootfs_fd;       /* idmapped detached mount of the writable layer */
  int lower_fd;        /* idmapped read-only template root for an overlay, or -1 */
  int usr_fd;          /* idmapped read-only detached mount for /usr, or -1 */
  uint64_t tmp_bytes;  /* size of /tmp (tmpfs); 0 = 64 MiB */
};

/* Attach the rootfs (the writable layer itself, or an overlay of it on the
 * template when lower_fd >= 0; overlayfs in a user namespace uses user.*
 * xattrs: `userxattr`), /usr, a fresh /proc, a minimal /dev (null, zero, full,
 * random, urandom, tty, ptmx + devpts, shm, fd links), /tmp on tmpfs, then
 * pivot_root into it and detach the old root.  On return cwd is "/". */
int hutch_mounts_setup_root(const struct hutch_rootfs_plan *plan, hutch_err *err);

#endif
