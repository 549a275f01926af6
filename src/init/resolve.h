/* openat2(2)'s path resolution done in user space, for kernels without it:
 * gVisor (runsc 20221219) answers openat2 with ENOSYS.  files.c calls it
 * when openat2 is missing. */
#ifndef HUTCH_INIT_RESOLVE_H
#define HUTCH_INIT_RESOLVE_H

#include <stdint.h>

/* Open `path` relative to `dirfd` like openat2(dirfd, path, {flags, mode,
 * resolve}) with `resolve` a combination of RESOLVE_IN_ROOT,
 * RESOLVE_BENEATH, RESOLVE_NO_SYMLINKS, RESOLVE_NO_MAGICLINKS and
 * RESOLVE_NO_XDEV.  Every component is opened with O_NOFOLLOW from the fd
 * of its parent, ".." is taken from a stack of the fds walked (never
 * resolved by the kernel) and symlinks are expanded here, so nothing is
 * reached outside `dirfd` and /proc's magic links are never jumped through
 * (their text, such as "socket:[12]", is looked up as a path).  NO_XDEV
 * compares st_dev only.  Returns an fd (O_CLOEXEC) or -1 with errno. */
int init_resolve_open(int dirfd, const char *path, uint64_t flags, uint64_t mode, uint64_t resolve);

#endif
