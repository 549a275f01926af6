/* Capabilities kept by sandboxed processes (native runtime).
 *
 * Inside its user namespace sandbox root keeps only Docker's default set
 * minus NET_RAW and MKNOD: CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, SETGID,
 * SETUID, SETPCAP, NET_BIND_SERVICE, SYS_CHROOT, SETFCAP, AUDIT_WRITE.
 * Everything else (notably SYS_ADMIN, SYS_PTRACE, SYS_MODULE, NET_ADMIN,
 * SYS_RESOURCE) is removed from the bounding, permitted, effective,
 * inheritable and ambient sets.  Capabilities held in a user namespace never
 * grant anything over host resources; dropping them narrows the kernel
 * surface reachable from inside (e.g. netfilter, mount, ptrace).
 */
#ifndef HUTCH_CAPS_H
#define HUTCH_CAPS_H

#include "common/err.h"

int hutch_caps_drop(hutch_err *err);

#endif
