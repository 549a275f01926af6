/* The storage pool: where templates, sandboxes' root filesystems and
 * snapshots live (docs/storage.md).
 *
 * Backend `btrfs` (preferred): DATA/pool is a btrfs filesystem — the data
 * directory's own when it is on btrfs, else an image file DATA/pool.img that
 * hutchd creates (sparse, size configurable, grown when the configured size
 * grows) and loop-mounts at DATA/pool.  Templates are read-only subvolumes,
 * a sandbox's root is a writable snapshot of one (O(1)), a file snapshot is
 * a read-only snapshot of the root (stores only what changed), and a
 * per-sandbox quota group bounds what one sandbox can write.
 *
 * Backend `overlay` (fallback where btrfs cannot be had): templates are
 * plain directories, a sandbox's root is an overlay of its template under
 * its own upper layer, and snapshots, rollback and fork copy that upper
 * layer (which holds only the sandbox's changes).  No quotas, no export.
 *
 * Layout under DATA/pool:
 *   templates/<name>      template roots (read-only subvolumes)
 *   rootfs/<sandbox id>   sandbox roots (btrfs: the root; overlay: upper/ and work/)
 *   snapshots/<snap id>   snapshots (read-only subvolumes; overlay: copies of upper/)
 *   checkpoints/<snap id> memory images of full snapshots (runtimes that checkpoint memory)
 *   staging/              half-made things (builds, imports), cleared at start
 */
#ifndef HUTCH_POOL_H
#define HUTCH_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"

enum hutch_pool_kind { HUTCH_POOL_BTRFS, HUTCH_POOL_OVERLAY };

struct hutch_pool_opts {
  const char *backend; /* "auto" (default), "btrfs", "overlay" */
  uint64_t size_bytes; /* image size when hutchd makes one; 0: default */
  const char *quota;   /* "auto" (on for hutchd's own image), "on", "off" */
};

struct hutch_pool {
  enum hutch_pool_kind kind;
  char *root;  /* DATA/pool */
  char *image; /* DATA/pool.img when loop-backed, else NULL */
  bool quotas; /* per-sandbox disk limits are enforced */
  bool quota_simple; /* simple quotas: an extent counts for the volume that wrote it */
  char why_overlay[256]; /* why btrfs was not used (auto fallback) */
};

/* Find, create or mount the pool under data_dir.  Idempotent: a pool that is
 * already mounted (hutchd restarted, sandboxes still running) is adopted. */
int hutch_pool_open(struct hutch_pool *p, const char *data_dir, const struct hutch_pool_opts *o, hutch_err *err);
/* Frees memory only: the pool stays mounted (shims outlive hutchd). */
void hutch_pool_close(struct hutch_pool *p);
/* Unmount a loop-backed pool (tests, `hutchd --unmount-pool`). */
int hutch_pool_unmount(const char *data_dir, hutch_err *err);

const char *hutch_pool_kind_name(const struct hutch_pool *p);
/* DATA/pool/<area>/<name> (caller frees); area: templates, rootfs, snapshots, staging. */
char *hutch_pool_path(const struct hutch_pool *p, const char *area, const char *name);

/* A new empty volume (btrfs subvolume, or directory). */
int hutch_pool_volume_new(const struct hutch_pool *p, const char *path, hutch_err *err);
/* Copy volume src to dst: a btrfs snapshot (O(1)), or `cp -a` (overlay). */
int hutch_pool_volume_clone(const struct hutch_pool *p, const char *src, const char *dst, bool readonly,
                            hutch_err *err);
/* Remove a volume; absent is not an error. */
int hutch_pool_volume_remove(const struct hutch_pool *p, const char *path, hutch_err *err);
/* Make a finished template or snapshot read-only. */
int hutch_pool_volume_seal(const struct hutch_pool *p, const char *path, hutch_err *err);
/* Limit what the volume alone may hold (0 = none).  No-op without quotas. */
int hutch_pool_volume_limit(const struct hutch_pool *p, const char *path, uint64_t bytes, hutch_err *err);

struct hutch_volume_usage {
  uint64_t exclusive; /* bytes only this volume holds (what deleting it frees) */
  uint64_t referenced; /* bytes it references, shared or not */
  uint64_t generation; /* btrfs transaction of its last change (0 on overlay) */
};
/* Usage as of the last commit (sync first for exact numbers). */
int hutch_pool_volume_usage(const struct hutch_pool *p, const char *path, struct hutch_volume_usage *u,
                            hutch_err *err);

struct hutch_pool_stats {
  uint64_t size_bytes, used_bytes;
};
int hutch_pool_stats(const struct hutch_pool *p, bool sync, struct hutch_pool_stats *s, hutch_err *err);

#endif
