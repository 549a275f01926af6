/* Import an OCI image or a `docker save` tarball into a directory.
 *
 * Sources (`src`):
 *   - a `docker save` tarball: manifest.json ([{Config, RepoTags, Layers}])
 *     with the config and layer files anywhere in the archive (symlinks and
 *     hard links between members are followed inside the archive);
 *   - an OCI image layout directory: oci-layout, index.json, blobs/<alg>/<hex>
 *     (a directory holding manifest.json is read as an unpacked docker save);
 *   - an OCI image layout packed as a tar file.
 * The outer archive must be an uncompressed tar (members are read in place);
 * a gzip/zstd/xz/bzip2-compressed one is refused with 400 ("decompress it
 * first").  Layers may be uncompressed, gzip or zstd (detected from their
 * bytes) and are streamed, never held in memory.
 *
 * Verification: every OCI blob (index, manifest, config, layer) is checked
 * against its sha256 digest and descriptor size; in a docker save, a member
 * stored as blobs/sha256/<hex> or named <hex>.json is checked against that
 * name; the layers' uncompressed digests are checked against the config's
 * rootfs.diff_ids whenever the config lists them.  Only sha256 is supported.
 * Bounds: manifest, index and config JSON <= 4 MiB, <= 1000 layers.
 *
 * Each layer is applied with hutch_tar_apply (store/tarx.h): every path is
 * resolved inside `root`, whiteouts act on the layers below.  On failure
 * `root` may hold part of the image: the caller removes it.
 */
#ifndef HUTCH_STORE_OCI_H
#define HUTCH_STORE_OCI_H

#include <stddef.h>

#include "common/err.h"

#define HUTCH_OCI_JSON_MAX (4u << 20)
#define HUTCH_OCI_LAYERS_MAX 1000

struct hutch_image_config {
  char **env;
  size_t n_env; /* "K=V" strings from config.Env */
  char *cwd;    /* config.WorkingDir or NULL */
  char *user;   /* config.User or NULL */
  char **entrypoint;
  size_t n_entrypoint;
  char **cmd;
  size_t n_cmd;
};
void hutch_image_config_free(struct hutch_image_config *c);

/* Progress callback: msg like "layer 2/5 (sha256:abcd…, 12.3 MiB)", fraction 0..1. */
typedef void (*hutch_oci_progress_fn)(void *arg, const char *msg, double fraction);

/* Import the image at `src` into the existing, empty directory `root`.
 * `ref` may be NULL (take the only/first image) or a tag/name to pick one
 * from manifest.json RepoTags or the index's org.opencontainers.image.ref.name
 * (or io.containerd.image.name) annotation; "busybox", "busybox:latest" and
 * "docker.io/library/busybox:latest" name the same image.  An index that
 * lists platforms yields linux/<this machine's architecture>, else the first.
 * Returns 0, or -1 with err set: 400 "invalid_argument" for a malformed or
 * unsupported archive (the message names what was wrong, e.g. "layer 3/5
 * (sha256:abcd…): entry `etc` at offset 1024: tar header checksum mismatch at
 * offset 1536"), 404 "not_found" for a missing `ref`, 500 for host failures.
 * *cfg is filled on success and must be freed with hutch_image_config_free
 * either way (it is zeroed first). */
int hutch_oci_import(const char *src, const char *ref, const char *root, struct hutch_image_config *cfg,
                     hutch_oci_progress_fn progress, void *arg, hutch_err *err);

#endif
