/* Import an OCI image layout or a `docker save` tarball (see oci.h). */
#include "store/oci.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <linux/openat2.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/hash.h"
#include "common/util.h"
#include "store/tarx.h"

#ifndef SYS_openat2
#define SYS_openat2 437
#endif

#define MT_OCI_INDEX "application/vnd.oci.image.index.v1+json"
#define MT_DOCKER_LIST "application/vnd.docker.distribution.manifest.list.v2+json"
#define ANN_REF "org.opencontainers.image.ref.name"
#define ANN_CONTAINERD "io.containerd.image.name"
#define INDEX_DEPTH_MAX 4

#if defined(__x86_64__)
#define HOST_ARCH "amd64"
#elif defined(__aarch64__)
#define HOST_ARCH "arm64"
#elif defined(__riscv) && __riscv_xlen == 64
#define HOST_ARCH "riscv64"
#elif defined(__powerpc64__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define HOST_ARCH "ppc64le"
#elif defined(__s390x__)
#define HOST_ARCH "s390x"
#else
#define HOST_ARCH "amd64"
#endif

typedef unsigned long long ull;

void hutch_image_config_free(struct hutch_image_config *c) {
  if (!c) return;
  for (size_t i = 0; i < c->n_env; i++) free(c->env[i]);
  for (size_t i = 0; i < c->n_entrypoint; i++) free(c->entrypoint[i]);
  for (size_t i = 0; i < c->n_cmd; i++) free(c->cmd[i]);
  free(c->env);
  free(c->entrypoint);
  free(c->cmd);
  free(c->cwd);
  free(c->user);
  memset(c, 0, sizeof *c);
}

/* ---- the image source: a directory or an indexed tar file -------------- */

struct bsrc {
  const char *name; /* as given, for messages */
  int dirfd;        /* layout (or unpacked docker save) directory, or -1 */
  int tarfd;        /* tar file, or -1 */
  struct hutch_tar_index idx;
};

static int open_beneath(int dirfd, const char *path) {
  struct open_how how;
  memset(&how, 0, sizeof how);
  how.flags = O_RDONLY | O_CLOEXEC;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
  for (int tries = 0;; tries++) {
    long r = syscall(SYS_openat2, dirfd, path, &how, sizeof how);
    if (r >= 0) return (int)r;
    if (errno == EINTR || (errno == EAGAIN && tries < 16)) continue;
    return -1;
  }
}

/* Member `path`: 1 and *fd (owned), *off, *len; 0 when missing; -1 error. */
static int bs_open(struct bsrc *b, const char *path, int *fd, uint64_t *off, uint64_t *len, hutch_err *err) {
  *fd = -1;
  if (b->tarfd >= 0) {
    const struct hutch_tar_member *m = hutch_tar_index_find(&b->idx, path);
    if (!m) return 0;
    *fd = fcntl(b->tarfd, F_DUPFD_CLOEXEC, 0);
    if (*fd < 0) return hutch_err_sys(err, errno, "dup");
    *off = m->off;
    *len = m->size;
    return 1;
  }
  int f = open_beneath(b->dirfd, path);
  if (f < 0) {
    if (errno == ENOENT || errno == ENOTDIR || errno == ELOOP) return 0;
    return hutch_err_sys(err, errno, "open `%.256s` in `%.256s`", path, b->name);
  }
  struct stat st;
  if (fstat(f, &st) < 0) {
    int e = errno;
    close(f);
    return hutch_err_sys(err, e, "stat `%.256s`", path);
  }
  if (!S_ISREG(st.st_mode)) {
    close(f);
    return hutch_err_invalid(err, "`%.256s` is not a regular file", path);
  }
  *fd = f;
  *off = 0;
  *len = (uint64_t)st.st_size;
  return 1;
}

/* A digest we can verify: "sha256:<64 lowercase hex>". */
static bool digest_ok(const char *d) {
  if (!d || strncmp(d, "sha256:", 7) || strlen(d) != 71) return false;
  for (const char *h = d + 7; *h; h++)
    if (!((*h >= '0' && *h <= '9') || (*h >= 'a' && *h <= 'f'))) return false;
  return true;
}

/* A small member (JSON), read whole, checked against `digest` and `size`
 * when given (size < 0: unknown). */
static json_t *bs_json(struct bsrc *b, const char *path, const char *what, const char *digest, int64_t size,
                       hutch_err *err) {
  int fd;
  uint64_t off, len;
  int r = bs_open(b, path, &fd, &off, &len, err);
  if (r < 0) return NULL;
  if (r == 0) {
    hutch_err_invalid(err, "%s: `%.256s` not found in `%.256s`", what, path, b->name);
    return NULL;
  }
  cleanup_close int cfd = fd;
  if (size >= 0 && len != (uint64_t)size) {
    hutch_err_invalid(err, "%s: size mismatch: descriptor says %lld bytes, blob has %llu", what, (long long)size,
                      (ull)len);
    return NULL;
  }
  if (len > HUTCH_OCI_JSON_MAX) {
    hutch_err_invalid(err, "%s: larger than %u bytes", what, HUTCH_OCI_JSON_MAX);
    return NULL;
  }
  cleanup_free char *buf = xmalloc(len + 1);
  size_t got = 0;
  while (got < len) {
    ssize_t n = pread(cfd, buf + got, len - got, (off_t)(off + got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      hutch_err_sys(err, errno, "%s: read", what);
      return NULL;
    }
    if (n == 0) {
      hutch_err_invalid(err, "%s: truncated", what);
      return NULL;
    }
    got += (size_t)n;
  }
  buf[len] = 0;
  if (digest) {
    char hex[65];
    hutch_sha256_hex(buf, len, hex);
    if (strcmp(hex, digest + 7)) {
      hutch_err_invalid(err, "%s: digest mismatch: expected %s, got sha256:%s", what, digest, hex);
      return NULL;
    }
  }
  json_error_t je;
  json_t *j = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
  if (!j) hutch_err_invalid(err, "%s: invalid JSON at line %d: %s", what, je.line, je.text);
  return j;
}

static bool bs_has(struct bsrc *b, const char *path) {
  int fd;
  uint64_t off, len;
  if (bs_open(b, path, &fd, &off, &len, NULL) <= 0) return false;
  close(fd);
  return true;
}

/* ---- what to import ---------------------------------------------------- */

struct layer_ref {
  char *path;   /* in the source */
  char *digest; /* of the stored bytes, or NULL */
  int64_t size; /* from the descriptor, or -1 */
};

struct plan {
  char *config_path, *config_digest;
  int64_t config_size;
  struct layer_ref *layers;
  size_t n;
};

static void plan_free(struct plan *p) {
  free(p->config_path);
  free(p->config_digest);
  for (size_t i = 0; i < p->n; i++) {
    free(p->layers[i].path);
    free(p->layers[i].digest);
  }
  free(p->layers);
  memset(p, 0, sizeof *p);
}

/* "busybox", "library/busybox:latest", "docker.io/library/busybox:latest"
 * all become "busybox:latest". */
static char *ref_norm(const char *r) {
  static const char *const prefixes[] = {"index.docker.io/library/", "docker.io/library/", "index.docker.io/",
                                         "docker.io/", "library/", NULL};
  for (int i = 0; prefixes[i]; i++)
    if (!strncmp(r, prefixes[i], strlen(prefixes[i]))) {
      r += strlen(prefixes[i]);
      break;
    }
  const char *slash = strrchr(r, '/');
  const char *tail = slash ? slash + 1 : r;
  if (!strchr(tail, ':') && !strchr(r, '@')) return xasprintf("%s:latest", r);
  return xstrdup(r);
}

/* 2: the same string, 1: the same image once normalised, 0: no. */
static int ref_match(const char *want, const char *have) {
  if (!strcmp(want, have)) return 2;
  cleanup_free char *a = ref_norm(want), *b = ref_norm(have);
  return !strcmp(a, b);
}

/* An OCI ref.name annotation may hold only the tag ("latest"). */
static bool tag_match(const char *want, const char *have) {
  if (strchr(have, '/') || strchr(have, ':') || strchr(want, '@')) return false;
  const char *slash = strrchr(want, '/');
  const char *colon = strchr(slash ? slash : want, ':');
  return !strcmp(colon ? colon + 1 : "latest", have);
}

static void append_name(char *list, size_t cap, const char *name) {
  size_t l = strlen(list);
  if (l + strlen(name) + 8 >= cap) {
    if (l + 5 < cap && !strstr(list, ", …")) snprintf(list + l, cap - l, ", …");
    return;
  }
  snprintf(list + l, cap - l, "%s`%s`", l ? ", " : "", name);
}

static const char *jstr(json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  return json_is_string(v) ? json_string_value(v) : NULL;
}

static bool sha256_name(const char *s, size_t n) {
  if (n != 64) return false;
  for (size_t i = 0; i < n; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
  return true;
}

/* The digest a docker save member's name implies: blobs/sha256/<hex>, or
 * <hex>.json for the config (an image id is its config's digest). */
static char *digest_from_name(const char *path, bool config) {
  cleanup_free char *c = hutch_tar_clean_path(path, xmalloc(strlen(path) + 1));
  if (!strncmp(c, "blobs/sha256/", 13) && sha256_name(c + 13, strlen(c + 13))) return xasprintf("sha256:%s", c + 13);
  const char *base = strrchr(c, '/') ? strrchr(c, '/') + 1 : c;
  size_t bl = strlen(base);
  if (config && bl == 69 && !strcmp(base + 64, ".json") && sha256_name(base, 64))
    return xasprintf("sha256:%.64s", base);
  return NULL;
}

static int docker_plan(struct bsrc *b, const char *ref, struct plan *p, hutch_err *err) {
  json_t *m = bs_json(b, "manifest.json", "manifest.json", NULL, -1, err);
  if (!m) return -1;
  int ret = -1;
  size_t n = json_is_array(m) ? json_array_size(m) : 0;
  json_t *pick = NULL;
  if (n == 0) {
    hutch_err_invalid(err, "manifest.json: expected a non-empty array");
    goto out;
  }
  if (!ref) {
    pick = json_array_get(m, 0);
  } else {
    int best = 0;
    char names[512] = "";
    for (size_t i = 0; i < n; i++) {
      json_t *tags = json_object_get(json_array_get(m, i), "RepoTags");
      for (size_t t = 0; json_is_array(tags) && t < json_array_size(tags); t++) {
        const char *tag = json_string_value(json_array_get(tags, t));
        if (!tag) continue;
        append_name(names, sizeof names, tag);
        int r = ref_match(ref, tag);
        if (r > best) best = r, pick = json_array_get(m, i);
      }
    }
    if (!pick) {
      hutch_err_set(err, 404, "not_found", "image `%.256s` not found in `%.256s` (it has: %s)", ref, b->name,
                    names[0] ? names : "no tagged images");
      goto out;
    }
  }
  const char *config = jstr(pick, "Config");
  json_t *layers = json_object_get(pick, "Layers");
  if (!config || !config[0]) {
    hutch_err_invalid(err, "manifest.json: `Config` must be a string");
    goto out;
  }
  if (!json_is_array(layers)) {
    hutch_err_invalid(err, "manifest.json: `Layers` must be an array");
    goto out;
  }
  if (json_array_size(layers) > HUTCH_OCI_LAYERS_MAX) {
    hutch_err_invalid(err, "manifest.json: more than %d layers", HUTCH_OCI_LAYERS_MAX);
    goto out;
  }
  p->config_path = xstrdup(config);
  p->config_digest = digest_from_name(config, true);
  p->config_size = -1;
  p->layers = xcalloc(json_array_size(layers) + 1, sizeof *p->layers);
  for (size_t i = 0; i < json_array_size(layers); i++) {
    const char *l = json_string_value(json_array_get(layers, i));
    if (!l || !l[0]) {
      hutch_err_invalid(err, "manifest.json: `Layers[%zu]` must be a string", i);
      goto out;
    }
    p->layers[p->n].path = xstrdup(l);
    p->layers[p->n].digest = digest_from_name(l, false);
    p->layers[p->n].size = -1;
    p->n++;
  }
  ret = 0;
out:
  json_decref(m);
  return ret;
}

/* A descriptor's digest and size; the blob's path. */
static int descriptor(json_t *d, const char *what, const char **digest, int64_t *size, char **path,
                      hutch_err *err) {
  if (!json_is_object(d)) return hutch_err_invalid(err, "%s: expected a descriptor object", what);
  *digest = jstr(d, "digest");
  if (!*digest) return hutch_err_invalid(err, "%s: `digest` missing", what);
  if (!digest_ok(*digest))
    return hutch_err_invalid(err, "%s: unsupported digest `%.100s` (only sha256:<64 hex digits>)", what, *digest);
  json_t *s = json_object_get(d, "size");
  *size = -1;
  if (s) {
    if (!json_is_integer(s) || json_integer_value(s) < 0)
      return hutch_err_invalid(err, "%s: `size` must be a non-negative integer", what);
    *size = json_integer_value(s);
  }
  if (path) *path = xasprintf("blobs/sha256/%s", *digest + 7);
  return 0;
}

static bool platform_is(json_t *d, const char *os, const char *arch) {
  json_t *pl = json_object_get(d, "platform");
  const char *o = jstr(pl, "os"), *a = jstr(pl, "architecture");
  return o && a && !strcmp(o, os) && (!arch || !strcmp(a, arch));
}

/* From an image index's manifests: linux/<host arch>, else the first one
 * that is not an attestation ("unknown/unknown"). */
static json_t *pick_platform(json_t *manifests) {
  size_t n = json_array_size(manifests);
  for (size_t i = 0; i < n; i++)
    if (platform_is(json_array_get(manifests, i), "linux", HOST_ARCH)) return json_array_get(manifests, i);
  for (size_t i = 0; i < n; i++)
    if (!platform_is(json_array_get(manifests, i), "unknown", NULL)) return json_array_get(manifests, i);
  return n ? json_array_get(manifests, 0) : NULL;
}

static json_t *pick_ref(json_t *manifests, const char *ref, char *names, size_t cap) {
  json_t *pick = NULL;
  int best = 0;
  for (size_t i = 0; i < json_array_size(manifests); i++) {
    json_t *d = json_array_get(manifests, i);
    json_t *ann = json_object_get(d, "annotations");
    const char *keys[] = {ANN_REF, ANN_CONTAINERD};
    for (int k = 0; k < 2; k++) {
      const char *name = jstr(ann, keys[k]);
      if (!name) continue;
      append_name(names, cap, name);
      int r = ref_match(ref, name);
      if (!r && k == 0 && tag_match(ref, name)) r = 1;
      if (r > best) best = r, pick = d;
    }
  }
  return pick;
}

static int oci_plan(struct bsrc *b, const char *ref, struct plan *p, hutch_err *err) {
  json_t *cur = bs_json(b, "index.json", "index.json", NULL, -1, err);
  if (!cur) return -1;
  int ret = -1;
  char what[128] = "index.json";
  json_t *manifests = json_object_get(cur, "manifests");
  if (!json_is_array(manifests) || json_array_size(manifests) == 0) {
    hutch_err_invalid(err, "index.json: `manifests` must be a non-empty array");
    goto out;
  }
  json_t *d;
  if (ref) {
    char names[512] = "";
    d = pick_ref(manifests, ref, names, sizeof names);
    if (!d) {
      hutch_err_set(err, 404, "not_found", "image `%.256s` not found in `%.256s` (it has: %s)", ref, b->name,
                    names[0] ? names : "no named images");
      goto out;
    }
  } else {
    d = json_array_get(manifests, 0);
  }
  for (int depth = 0;; depth++) {
    const char *digest;
    int64_t size;
    cleanup_free char *path = NULL;
    if (descriptor(d, what, &digest, &size, &path, err) < 0) goto out;
    snprintf(what, sizeof what, "manifest %.19s…", digest);
    json_t *next = bs_json(b, path, what, digest, size, err);
    if (!next) goto out;
    json_decref(cur); /* `d` pointed into it: done with it */
    cur = next;
    const char *mt = jstr(cur, "mediaType");
    json_t *list = json_object_get(cur, "manifests");
    if ((mt && (!strcmp(mt, MT_OCI_INDEX) || !strcmp(mt, MT_DOCKER_LIST))) || (!mt && json_is_array(list))) {
      if (depth >= INDEX_DEPTH_MAX) {
        hutch_err_invalid(err, "%s: image indexes nested more than %d deep", what, INDEX_DEPTH_MAX);
        goto out;
      }
      if (!json_is_array(list) || !(d = pick_platform(list))) {
        hutch_err_invalid(err, "%s: an image index without manifests", what);
        goto out;
      }
      continue;
    }
    json_t *config = json_object_get(cur, "config");
    json_t *layers = json_object_get(cur, "layers");
    if (!config || !json_is_array(layers)) {
      hutch_err_invalid(err, "%s: not an image manifest (`config` and `layers` expected; media type %.100s)", what,
                        mt ? mt : "not given");
      goto out;
    }
    if (json_array_size(layers) > HUTCH_OCI_LAYERS_MAX) {
      hutch_err_invalid(err, "%s: more than %d layers", what, HUTCH_OCI_LAYERS_MAX);
      goto out;
    }
    char cwhat[160];
    snprintf(cwhat, sizeof cwhat, "%s: config", what);
    if (descriptor(config, cwhat, &digest, &p->config_size, &p->config_path, err) < 0) goto out;
    p->config_digest = xstrdup(digest);
    p->layers = xcalloc(json_array_size(layers) + 1, sizeof *p->layers);
    for (size_t i = 0; i < json_array_size(layers); i++) {
      struct layer_ref *l = &p->layers[p->n];
      char lwhat[160];
      snprintf(lwhat, sizeof lwhat, "%s: layers[%zu]", what, i);
      if (descriptor(json_array_get(layers, i), lwhat, &digest, &l->size, &l->path, err) < 0) goto out;
      l->digest = xstrdup(digest);
      p->n++;
    }
    break;
  }
  ret = 0;
out:
  json_decref(cur);
  return ret;
}

/* ---- the image config -------------------------------------------------- */

static int str_array(json_t *o, const char *key, char ***out, size_t *n, hutch_err *err) {
  json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_array(v)) return hutch_err_invalid(err, "image config: `config.%s` must be an array of strings", key);
  size_t len = json_array_size(v);
  *out = xcalloc(len + 1, sizeof **out);
  for (size_t i = 0; i < len; i++) {
    json_t *s = json_array_get(v, i);
    if (!json_is_string(s) || strlen(json_string_value(s)) != json_string_length(s))
      return hutch_err_invalid(err, "image config: `config.%s[%zu]` must be a string without NUL bytes", key, i);
    (*out)[(*n)++] = xstrdup(json_string_value(s));
  }
  return 0;
}

static int opt_str(json_t *o, const char *key, char **out, hutch_err *err) {
  json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v))
    return hutch_err_invalid(err, "image config: `config.%s` must be a string", key);
  if (json_string_value(v)[0]) *out = xstrdup(json_string_value(v));
  return 0;
}

static int parse_config(json_t *j, struct hutch_image_config *cfg, hutch_err *err) {
  if (!json_is_object(j)) return hutch_err_invalid(err, "image config: expected an object");
  json_t *c = json_object_get(j, "config");
  if (!c || json_is_null(c)) return 0;
  if (!json_is_object(c)) return hutch_err_invalid(err, "image config: `config` must be an object");
  if (str_array(c, "Env", &cfg->env, &cfg->n_env, err) < 0) return -1;
  for (size_t i = 0; i < cfg->n_env; i++)
    if (!strchr(cfg->env[i], '=')) return hutch_err_invalid(err, "image config: `config.Env[%zu]` is not K=V", i);
  if (str_array(c, "Entrypoint", &cfg->entrypoint, &cfg->n_entrypoint, err) < 0) return -1;
  if (str_array(c, "Cmd", &cfg->cmd, &cfg->n_cmd, err) < 0) return -1;
  if (opt_str(c, "WorkingDir", &cfg->cwd, err) < 0) return -1;
  if (opt_str(c, "User", &cfg->user, err) < 0) return -1;
  return 0;
}

/* ---- import ------------------------------------------------------------ */

static int check_empty(int fd, const char *root, hutch_err *err) {
  int d2 = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (d2 < 0) return hutch_err_sys(err, errno, "dup");
  DIR *d = fdopendir(d2);
  if (!d) {
    close(d2);
    return hutch_err_sys(err, errno, "read `%s`", root);
  }
  struct dirent *de;
  bool empty = true;
  while ((de = readdir(d)))
    if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) empty = false;
  closedir(d);
  return empty ? 0 : hutch_err_sys(err, ENOTEMPTY, "import into `%s`", root);
}

static void layer_label(const struct layer_ref *l, char *out, size_t cap) {
  if (l->digest) snprintf(out, cap, "%.19s…", l->digest);
  else snprintf(out, cap, "%.200s", l->path);
}

static int import(struct bsrc *b, const char *ref, int rootfd, struct hutch_image_config *cfg,
                  hutch_oci_progress_fn progress, void *arg, hutch_err *err) {
  struct plan p;
  memset(&p, 0, sizeof p);
  json_t *config = NULL;
  int ret = -1;
  if (bs_has(b, "manifest.json")) {
    if (docker_plan(b, ref, &p, err) < 0) goto out;
  } else if (bs_has(b, "index.json")) {
    if (oci_plan(b, ref, &p, err) < 0) goto out;
  } else {
    hutch_err_invalid(err, "`%.256s`: neither manifest.json (docker save) nor index.json (OCI layout) found",
                      b->name);
    goto out;
  }
  config = bs_json(b, p.config_path, "image config", p.config_digest, p.config_size, err);
  if (!config || parse_config(config, cfg, err) < 0) goto out;
  json_t *diff_ids = json_object_get(json_object_get(config, "rootfs"), "diff_ids");
  if (diff_ids && !json_is_array(diff_ids)) {
    hutch_err_invalid(err, "image config: `rootfs.diff_ids` must be an array");
    goto out;
  }
  if (diff_ids && json_array_size(diff_ids) != p.n) {
    hutch_err_invalid(err, "image config lists %zu layers (rootfs.diff_ids), the manifest %zu",
                      json_array_size(diff_ids), p.n);
    goto out;
  }
  /* Every layer present, sizes as described, before anything is written. */
  uint64_t total = 0, done = 0;
  uint64_t *lens = xcalloc(p.n + 1, sizeof *lens);
  for (size_t i = 0; i < p.n; i++) {
    int fd;
    uint64_t off;
    int r = bs_open(b, p.layers[i].path, &fd, &off, &lens[i], err);
    if (r <= 0) {
      if (r == 0) hutch_err_invalid(err, "`%.256s` not found in `%.256s`", p.layers[i].path, b->name);
      hutch_err_wrap(err, "layer %zu/%zu", i + 1, p.n);
      free(lens);
      goto out;
    }
    close(fd);
    if (p.layers[i].size >= 0 && lens[i] != (uint64_t)p.layers[i].size) {
      hutch_err_invalid(err, "layer %zu/%zu: size mismatch: descriptor says %lld bytes, blob has %llu", i + 1, p.n,
                        (long long)p.layers[i].size, (ull)lens[i]);
      free(lens);
      goto out;
    }
    total += lens[i];
  }
  for (size_t i = 0; i < p.n; i++) {
    char label[256];
    layer_label(&p.layers[i], label, sizeof label);
    if (progress) {
      char msg[320];
      snprintf(msg, sizeof msg, "layer %zu/%zu (%s, %.1f MiB)", i + 1, p.n, label, (double)lens[i] / (1 << 20));
      progress(arg, msg, total ? (double)done / (double)total : (double)i / (double)p.n);
    }
    struct hutch_tar_layer L = {.fd = -1};
    int r = bs_open(b, p.layers[i].path, &L.fd, &L.off, &L.len, err);
    if (r <= 0) {
      if (r == 0) hutch_err_invalid(err, "`%.256s` vanished from `%.256s`", p.layers[i].path, b->name);
      hutch_err_wrap(err, "layer %zu/%zu", i + 1, p.n);
      free(lens);
      goto out;
    }
    L.digest = p.layers[i].digest;
    L.diff_id = diff_ids ? json_string_value(json_array_get(diff_ids, i)) : NULL;
    if (diff_ids && !L.diff_id) {
      close(L.fd);
      free(lens);
      hutch_err_invalid(err, "image config: `rootfs.diff_ids[%zu]` must be a string", i);
      goto out;
    }
    r = hutch_tar_apply(rootfd, &L, err);
    close(L.fd);
    if (r < 0) {
      hutch_err_wrap(err, "layer %zu/%zu (%s)", i + 1, p.n, label);
      free(lens);
      goto out;
    }
    done += lens[i];
  }
  free(lens);
  if (progress) progress(arg, "image imported", 1.0);
  ret = 0;
out:
  json_decref(config);
  plan_free(&p);
  return ret;
}

int hutch_oci_import(const char *src, const char *ref, const char *root, struct hutch_image_config *cfg,
                     hutch_oci_progress_fn progress, void *arg, hutch_err *err) {
  memset(cfg, 0, sizeof *cfg);
  if (ref && !ref[0]) ref = NULL;
  cleanup_close int rootfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (rootfd < 0) return hutch_err_sys(err, errno, "open root `%s`", root);
  if (check_empty(rootfd, root, err) < 0) return -1;
  /* O_NONBLOCK: a fifo must not block the open (it is refused below). */
  cleanup_close int fd = open(src, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    int e = errno;
    hutch_err_sys(err, e, "image `%s`", src);
    if (e == ENOENT || e == ENOTDIR || e == ELOOP) {
      err->status = 400;
      snprintf(err->code, sizeof err->code, "invalid_argument");
    }
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) < 0) return hutch_err_sys(err, errno, "stat `%s`", src);
  struct bsrc b = {.name = src, .dirfd = -1, .tarfd = -1};
  if (S_ISDIR(st.st_mode)) {
    b.dirfd = fd;
  } else if (S_ISREG(st.st_mode)) {
    if (hutch_tar_index_fd(fd, &b.idx, err) < 0) return hutch_err_wrap(err, "image archive `%s`", src);
    b.tarfd = fd;
  } else {
    return hutch_err_invalid(err, "image `%s`: not a file or directory", src);
  }
  int r = import(&b, ref, rootfd, cfg, progress, arg, err);
  hutch_tar_index_free(&b.idx);
  if (r < 0) hutch_image_config_free(cfg);
  return r;
}
