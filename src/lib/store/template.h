/* Templates: the read-only roots sandboxes are made from, and the
 * sandboxes' own roots made from them (docs/storage.md).
 *
 * Sources:
 *   host     a minimal root whose /usr is the host's /usr (bind-mounted
 *            read-only and idmapped at start) and whose /etc is generated —
 *            passwd, group, hosts, the CA bundle and a short allowlist of
 *            harmless host files, never the host's shadow, ssh keys or
 *            other secrets.  Built at start-up.
 *   busybox  a static busybox and its applet links (tiny, instant).
 *   debian   debootstrap (minbase) of a suite, plus extra packages.
 *   oci      an OCI image archive or `docker save` tarball, layer by layer.
 *   snapshot a sandbox's snapshot (shares its blocks).
 *
 * Every template is built in the pool's staging area, owned by storage ids
 * (isolate/userns.h), sealed read-only, and renamed into templates/<name>:
 * a half-built template is never visible.
 */
#ifndef HUTCH_TEMPLATE_H
#define HUTCH_TEMPLATE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "store/oci.h"
#include "store/pool.h"

/* Present in a template whose sandboxes bind the host's /usr (the `host`
 * template and templates made from snapshots of its sandboxes). */
#define HUTCH_TEMPLATE_USR_MARKER ".hutch-usr-host"

struct hutch_template_source {
  const char *kind;                 /* host | busybox | debian | oci | snapshot */
  const char *suite, *mirror;       /* debian */
  const char *const *packages;      /* debian: extra packages */
  size_t npackages;
  const char *path, *ref;           /* oci: archive or layout directory on the host; image name */
  const char *snapshot_path;        /* snapshot: its volume */
};
typedef void (*hutch_template_progress_fn)(void *arg, const char *msg, double fraction);

bool hutch_template_valid_name(const char *name);
char *hutch_template_path(const struct hutch_pool *p, const char *name);
bool hutch_template_exists(const struct hutch_pool *p, const char *name);
/* Build (or rebuild) a template; *config_json gets the image's defaults
 * ({"env":{},"cwd":…,"user":…,"entrypoint":[],"cmd":[]}) for oci. */
int hutch_template_build(const struct hutch_pool *p, const char *name, const struct hutch_template_source *src,
                         hutch_template_progress_fn progress, void *arg, char **config_json, hutch_err *err);
/* Build `host` if missing or from an older hutch. */
int hutch_template_ensure_host(const struct hutch_pool *p, hutch_err *err);
int hutch_template_remove(const struct hutch_pool *p, const char *name, hutch_err *err);
/* Host directory to bind at /usr for a root made from `volume`, or NULL. */
char *hutch_template_usr_src(const struct hutch_pool *p, const char *volume);

/* The root of sandbox `id`: from a template, or from a snapshot volume when
 * from_volume is set; /etc/hostname and /etc/hosts personalised; limited
 * to disk_bytes (0: no limit) where the pool has quotas. */
char *hutch_rootfs_path(const struct hutch_pool *p, const char *id);
int hutch_rootfs_create(const struct hutch_pool *p, const char *template_name, const char *from_volume,
                        const char *id, const char *hostname, uint64_t disk_bytes, hutch_err *err);
int hutch_rootfs_remove(const struct hutch_pool *p, const char *id, hutch_err *err);
/* Write (or append to) a file of a sandbox's root, resolved inside it (a
 * missing parent directory or an odd entry there is left alone: 0). */
int hutch_rootfs_write(const struct hutch_pool *p, const char *id, const char *rel, const char *content, bool append,
                       hutch_err *err);

#endif
