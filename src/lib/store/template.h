/* Templates: the read-only roots sandboxes are made from.
 *
 * For now one template exists, `host`: a minimal root whose /usr is the
 * host's /usr (bind-mounted read-only and idmapped at start) and whose /etc
 * is generated — passwd, group, hosts, resolv.conf, the CA bundle and a short
 * allowlist of harmless host files (ld.so.cache, alternatives, …), never the
 * host's shadow, ssh keys or other secrets.  Storage (btrfs, more templates)
 * generalises this module.
 *
 * Layout: DATA/templates/<name>/ holds the root; a sandbox's root is an
 * overlay of it with DATA/sandboxes/<id>/rootfs/{upper,work}, made by
 * hutch_rootfs_create().
 */
#ifndef HUTCH_TEMPLATE_H
#define HUTCH_TEMPLATE_H

#include <stdbool.h>

#include "common/err.h"

/* Build DATA/templates/host if missing or from an older hutch (atomic rename). */
int hutch_template_ensure_host(const char *data_dir, hutch_err *err);
bool hutch_template_exists(const char *data_dir, const char *name);
/* Host directory to bind at /usr for this template, or NULL. */
const char *hutch_template_usr_src(const char *name);
/* Make a sandbox's writable root from a template and personalise /etc. */
int hutch_rootfs_create(const char *data_dir, const char *template_name, const char *rootfs, const char *hostname,
                        hutch_err *err);

#endif
