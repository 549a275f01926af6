#include "store/pool.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <linux/loop.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "store/btrfs.h"

#define MARKER ".hutch-pool"
#define MIN_IMAGE (1ull << 30)
#define MAX_DEFAULT_IMAGE (1ull << 40)

const char *hutch_pool_kind_name(const struct hutch_pool *p) {
  return p->kind == HUTCH_POOL_BTRFS ? "btrfs" : "overlay";
}

char *hutch_pool_path(const struct hutch_pool *p, const char *area, const char *name) {
  return name ? xasprintf("%s/%s/%s", p->root, area, name) : xasprintf("%s/%s", p->root, area);
}

static bool is_mountpoint(const char *path) {
  struct stat a, b;
  cleanup_free char *parent = xasprintf("%s/..", path);
  return stat(path, &a) == 0 && stat(parent, &b) == 0 && a.st_dev != b.st_dev;
}

static bool kernel_has_btrfs(void) {
  hutch_err e = HUTCH_ERR_INIT;
  cleanup_free char *fs = read_file("/proc/filesystems", 1 << 16, NULL, &e);
  return fs && strstr(fs, "\tbtrfs\n");
}

/* Attach `image` to a free loop device (autoclear: it detaches when the
 * filesystem is unmounted).  Returns the open device fd; keep it open until
 * the mount holds the device. */
static int loop_attach(const char *image, char *dev, size_t n, hutch_err *err) {
  cleanup_close int img = open(image, O_RDWR | O_CLOEXEC);
  if (img < 0) return hutch_err_sys(err, errno, "open `%s`", image);
  cleanup_close int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
  if (ctl < 0) return hutch_err_sys(err, errno, "open /dev/loop-control");
  uint32_t flags = LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO;
  for (int tries = 0; tries < 32; tries++) {
    int nr = ioctl(ctl, LOOP_CTL_GET_FREE);
    if (nr < 0) return hutch_err_sys(err, errno, "find a free loop device");
    snprintf(dev, n, "/dev/loop%d", nr);
    int lfd = open(dev, O_RDWR | O_CLOEXEC);
    if (lfd < 0 && errno == ENOENT) {
      /* No devtmpfs node (some containers): make it. */
      if (mknod(dev, S_IFBLK | 0660, makedev(7, (unsigned)nr)) < 0 && errno != EEXIST)
        return hutch_err_sys(err, errno, "mknod `%s`", dev);
      lfd = open(dev, O_RDWR | O_CLOEXEC);
    }
    if (lfd < 0) return hutch_err_sys(err, errno, "open `%s`", dev);
    struct loop_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.fd = (uint32_t)img;
    cfg.info.lo_flags = flags;
    snprintf((char *)cfg.info.lo_file_name, LO_NAME_SIZE, "%s", image);
    if (ioctl(lfd, LOOP_CONFIGURE, &cfg) == 0) return lfd;
    int e = errno;
    close(lfd);
    if (e == EBUSY) continue; /* another process took it first */
    if (e == EINVAL && (flags & LO_FLAGS_DIRECT_IO)) {
      flags &= ~LO_FLAGS_DIRECT_IO; /* the host filesystem cannot do direct I/O */
      tries--;
      continue;
    }
    return hutch_err_sys(err, e, "attach `%s` to `%s`", image, dev);
  }
  return hutch_err_sys(err, EBUSY, "no free loop device for `%s`", image);
}

static int mount_image(const char *image, const char *root, hutch_err *err) {
  char dev[64];
  int lfd = loop_attach(image, dev, sizeof dev, err);
  if (lfd < 0) return -1;
  /* Not nodev/nosuid: debootstrap refuses such a target, and DATA is 0700;
   * sandboxes see the pool only through their own nodev,nosuid mounts. */
  int rc = mount(dev, root, "btrfs", MS_NOATIME, "discard=async,commit=5");
  int e = errno;
  close(lfd);
  if (rc < 0) return hutch_err_sys(err, e, "mount btrfs `%s` (%s) on `%s`", image, dev, root);
  return 0;
}

static uint64_t default_size(const char *data_dir) {
  struct statvfs v;
  if (statvfs(data_dir, &v) < 0) return MIN_IMAGE * 16;
  uint64_t avail = (uint64_t)v.f_bavail * v.f_frsize / 10 * 8;
  if (avail > MAX_DEFAULT_IMAGE) avail = MAX_DEFAULT_IMAGE;
  if (avail < MIN_IMAGE) avail = MIN_IMAGE;
  return avail & ~((1ull << 20) - 1);
}

static int make_image(const char *image, uint64_t size, hutch_err *err) {
  cleanup_free char *tmp = xasprintf("%s.tmp", image);
  unlink(tmp);
  int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return hutch_err_sys(err, errno, "create `%s`", tmp);
  if (ftruncate(fd, (off_t)size) < 0) {
    int e = errno;
    close(fd);
    unlink(tmp);
    return hutch_err_sys(err, e, "size `%s`", tmp);
  }
  close(fd);
  const char *argv[] = {"mkfs.btrfs", "-q", "-m", "single", "-L", "hutch-pool", tmp, NULL};
  if (hutch_run(argv, -1, -1, NULL, NULL, err) < 0) {
    unlink(tmp);
    return hutch_err_wrap(err, "make the btrfs pool image");
  }
  if (rename(tmp, image) < 0) return hutch_err_sys(err, errno, "rename `%s`", tmp);
  return 0;
}

static int grow_image(const char *image, const char *root, uint64_t size, hutch_err *err) {
  struct stat st;
  if (stat(image, &st) < 0) return hutch_err_sys(err, errno, "stat `%s`", image);
  if ((uint64_t)st.st_size >= size) return 0;
  if (truncate(image, (off_t)size) < 0) return hutch_err_sys(err, errno, "grow `%s`", image);
  char dev[4096];
  if (hutch_btrfs_device_path(root, dev, sizeof dev, err) < 0) return -1;
  cleanup_close int lfd = open(dev, O_RDWR | O_CLOEXEC);
  if (lfd < 0) return hutch_err_sys(err, errno, "open `%s`", dev);
  if (ioctl(lfd, LOOP_SET_CAPACITY, 0) < 0) return hutch_err_sys(err, errno, "resize `%s`", dev);
  if (hutch_btrfs_resize_max(root, err) < 0) return -1;
  char sz[32];
  snprintf(sz, sizeof sz, "%llu", (unsigned long long)size);
  hutch_log(LOG_INFO, "pool.grown", "image", image, "size_bytes", sz, NULL);
  return 0;
}

/* Make DATA/pool a btrfs filesystem: the data directory's own, or an image. */
static int open_btrfs(struct hutch_pool *p, const char *data_dir, const struct hutch_pool_opts *o, hutch_err *err) {
  if (hutch_btrfs_is(p->root)) {
    /* Mounted already (a restart), or the data directory is on btrfs. */
    cleanup_free char *image = xasprintf("%s/pool.img", data_dir);
    if (is_mountpoint(p->root) && access(image, F_OK) == 0) p->image = steal_pointer(&image);
  } else {
    if (!kernel_has_btrfs()) return hutch_err_sys(err, ENODEV, "the kernel has no btrfs");
    p->image = xasprintf("%s/pool.img", data_dir);
    if (access(p->image, F_OK) < 0) {
      uint64_t size = o->size_bytes ? o->size_bytes : default_size(data_dir);
      if (size < MIN_IMAGE / 4) return hutch_err_invalid(err, "storage size %llu is below 256 MiB", (unsigned long long)size);
      if (make_image(p->image, size, err) < 0) return -1;
      char sz[32];
      snprintf(sz, sizeof sz, "%llu", (unsigned long long)size);
      hutch_log(LOG_INFO, "pool.created", "image", p->image, "size_bytes", sz, NULL);
    }
    if (mount_image(p->image, p->root, err) < 0) return -1;
  }
  if (p->image && o->size_bytes && grow_image(p->image, p->root, o->size_bytes, err) < 0) return -1;
  const char *q = o->quota ? o->quota : "auto";
  bool want = !strcmp(q, "on") || (!strcmp(q, "auto") && p->image);
  if (want && !hutch_btrfs_quota_enabled(p->root) && hutch_btrfs_quota_enable(p->root, NULL, err) < 0) return -1;
  p->quotas = strcmp(q, "off") && hutch_btrfs_quota_enabled(p->root);
  p->quota_simple = p->quotas && hutch_btrfs_quota_simple(p->root);
  return 0;
}

/* Remove what an interrupted build, import or checkpoint left in `area`:
 * every entry whose name starts with `prefix` and ends with `suffix` (NULL:
 * any): all of staging, templates/.build-…, checkpoints/….tmp. */
static int clear_area(const struct hutch_pool *p, const char *area, const char *prefix, const char *suffix,
                      hutch_err *err) {
  cleanup_free char *dir = hutch_pool_path(p, area, NULL);
  DIR *d = opendir(dir);
  if (!d) return hutch_err_sys(err, errno, "open `%s`", dir);
  struct dirent *e;
  int rc = 0;
  size_t sl = suffix ? strlen(suffix) : 0;
  while ((e = readdir(d))) {
    size_t n = strlen(e->d_name);
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    if (prefix && strncmp(e->d_name, prefix, strlen(prefix))) continue;
    if (suffix && (n <= sl || strcmp(e->d_name + n - sl, suffix))) continue;
    cleanup_free char *path = xasprintf("%s/%s", dir, e->d_name);
    if (hutch_pool_volume_remove(p, path, err) < 0) rc = -1;
  }
  closedir(d);
  return rc;
}

int hutch_pool_open(struct hutch_pool *p, const char *data_dir, const struct hutch_pool_opts *o, hutch_err *err) {
  memset(p, 0, sizeof *p);
  p->root = xasprintf("%s/pool", data_dir);
  const char *backend = o->backend ? o->backend : "auto";
  if (strcmp(backend, "auto") && strcmp(backend, "btrfs") && strcmp(backend, "overlay"))
    return hutch_err_invalid(err, "storage backend `%s`: use auto, btrfs or overlay", backend);
  if (mkdir(p->root, 0700) < 0 && errno != EEXIST) return hutch_err_sys(err, errno, "mkdir `%s`", p->root);
  cleanup_free char *marker = xasprintf("%s/" MARKER, p->root);
  cleanup_free char *image = xasprintf("%s/pool.img", data_dir);
  hutch_err e2 = HUTCH_ERR_INIT;
  cleanup_free char *was = read_file(marker, 64, NULL, &e2);
  /* A pool keeps the backend it was made with. */
  bool want_btrfs = !strcmp(backend, "btrfs") || access(image, F_OK) == 0 ||
                    (!strcmp(backend, "auto") && !(was && !strcmp(was, "overlay\n")));
  p->kind = HUTCH_POOL_OVERLAY;
  if (want_btrfs) {
    hutch_err be = HUTCH_ERR_INIT;
    if (open_btrfs(p, data_dir, o, &be) == 0) {
      p->kind = HUTCH_POOL_BTRFS;
    } else if (!strcmp(backend, "btrfs") || access(image, F_OK) == 0) {
      *err = be;
      return hutch_err_wrap(err, "storage pool");
    } else {
      snprintf(p->why_overlay, sizeof p->why_overlay, "%.200s", be.msg);
      hutch_log(LOG_WARN, "pool.btrfs_unavailable", "reason", be.msg, "fallback", "overlay", NULL);
      free(p->image);
      p->image = NULL;
    }
  } else if (!strcmp(backend, "auto")) {
    snprintf(p->why_overlay, sizeof p->why_overlay, "the pool was made with the overlay backend");
  }
  if (p->kind == HUTCH_POOL_BTRFS && was && strcmp(was, "btrfs\n"))
    return hutch_err_sys(err, EINVAL, "pool `%s` was made with backend %.*s", p->root, (int)strcspn(was, "\n"), was);
  if (!was && write_file(marker, p->kind == HUTCH_POOL_BTRFS ? "btrfs\n" : "overlay\n",
                         p->kind == HUTCH_POOL_BTRFS ? 6 : 8, 0600, err) < 0)
    return -1;
  static const char *const areas[] = {"templates", "rootfs", "snapshots", "checkpoints", "staging"};
  for (size_t i = 0; i < sizeof areas / sizeof *areas; i++) {
    cleanup_free char *d = hutch_pool_path(p, areas[i], NULL);
    if (mkdir(d, 0700) < 0 && errno != EEXIST) return hutch_err_sys(err, errno, "mkdir `%s`", d);
  }
  if (clear_area(p, "staging", NULL, NULL, err) < 0 || clear_area(p, "templates", ".build-", NULL, err) < 0 ||
      clear_area(p, "checkpoints", NULL, ".tmp", err) < 0)
    return hutch_err_wrap(err, "clear the pool's staging area");
  hutch_log(LOG_INFO, "pool.ready", "path", p->root, "backend", hutch_pool_kind_name(p), "image",
            p->image ? p->image : "-", "quotas", !p->quotas ? "off" : p->quota_simple ? "simple" : "full", NULL);
  return 0;
}

void hutch_pool_close(struct hutch_pool *p) {
  free(p->root);
  free(p->image);
  p->root = p->image = NULL;
}

int hutch_pool_unmount(const char *data_dir, hutch_err *err) {
  cleanup_free char *root = xasprintf("%s/pool", data_dir);
  if (!is_mountpoint(root)) return 0;
  if (umount2(root, 0) < 0) return hutch_err_sys(err, errno, "unmount `%s`", root);
  return 0;
}

/* ---- volumes ------------------------------------------------------------------ */

int hutch_pool_volume_new(const struct hutch_pool *p, const char *path, hutch_err *err) {
  if (p->kind == HUTCH_POOL_BTRFS) return hutch_btrfs_subvol_create(path, err);
  if (mkdir(path, 0755) < 0) return hutch_err_sys(err, errno, "mkdir `%s`", path);
  return 0;
}

int hutch_pool_volume_clone(const struct hutch_pool *p, const char *src, const char *dst, bool readonly,
                            hutch_err *err) {
  if (p->kind == HUTCH_POOL_BTRFS) return hutch_btrfs_snapshot(src, dst, readonly, err);
  const char *argv[] = {"cp", "-a", "--reflink=auto", "--no-target-directory", src, dst, NULL};
  if (hutch_run(argv, -1, -1, NULL, NULL, err) < 0) {
    hutch_err e2 = HUTCH_ERR_INIT;
    rm_rf(dst, &e2);
    return hutch_err_wrap(err, "copy `%s`", src);
  }
  return 0;
}

int hutch_pool_volume_remove(const struct hutch_pool *p, const char *path, hutch_err *err) {
  if (p->kind == HUTCH_POOL_BTRFS && hutch_btrfs_is_subvolume(path)) return hutch_btrfs_subvol_delete(path, err);
  return rm_rf(path, err);
}

int hutch_pool_volume_seal(const struct hutch_pool *p, const char *path, hutch_err *err) {
  if (p->kind == HUTCH_POOL_BTRFS) return hutch_btrfs_set_readonly(path, true, err);
  return 0;
}

int hutch_pool_volume_limit(const struct hutch_pool *p, const char *path, uint64_t bytes, hutch_err *err) {
  if (!p->quotas) return 0;
  return hutch_btrfs_qgroup_limit(path, bytes, err);
}

static __thread uint64_t du_total;
static int du_entry(const char *path, const struct stat *st, int flag, struct FTW *f) {
  (void)path;
  (void)flag;
  (void)f;
  du_total += (uint64_t)st->st_blocks * 512u;
  return 0;
}

int hutch_pool_volume_usage(const struct hutch_pool *p, const char *path, struct hutch_volume_usage *u,
                            hutch_err *err) {
  memset(u, 0, sizeof *u);
  if (p->kind == HUTCH_POOL_BTRFS) {
    struct hutch_btrfs_subvol sv;
    if (hutch_btrfs_subvol_info(path, &sv, err) < 0) return -1;
    u->generation = sv.generation;
    if (!p->quotas) return 0;
    return hutch_btrfs_qgroup_usage(p->root, sv.id, &u->referenced, &u->exclusive, err);
  }
  du_total = 0;
  if (nftw(path, du_entry, 32, FTW_PHYS | FTW_MOUNT) != 0) return hutch_err_sys(err, errno, "size of `%s`", path);
  u->exclusive = u->referenced = du_total;
  return 0;
}

int hutch_pool_stats(const struct hutch_pool *p, bool sync, struct hutch_pool_stats *s, hutch_err *err) {
  memset(s, 0, sizeof *s);
  if (p->kind == HUTCH_POOL_BTRFS) {
    if (sync && hutch_btrfs_sync(p->root, err) < 0) return -1;
    return hutch_btrfs_space(p->root, &s->used_bytes, &s->size_bytes, err);
  }
  struct statvfs v;
  if (statvfs(p->root, &v) < 0) return hutch_err_sys(err, errno, "statvfs `%s`", p->root);
  s->size_bytes = (uint64_t)v.f_blocks * v.f_frsize;
  s->used_bytes = (uint64_t)(v.f_blocks - v.f_bfree) * v.f_frsize;
  return 0;
}
