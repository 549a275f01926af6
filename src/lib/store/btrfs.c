#include "store/btrfs.h"

#include <btrfsutil.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/btrfs.h>
#include <linux/btrfs_tree.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/statfs.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "common/util.h"

static int util_fail(hutch_err *err, enum btrfs_util_error e, const char *what, const char *path) {
  int en = errno ? errno : EIO;
  return hutch_err_sys(err, en, "%s `%s` (%s)", what, path, btrfs_util_strerror(e));
}

bool hutch_btrfs_is(const char *path) {
  struct statfs s;
  return statfs(path, &s) == 0 && s.f_type == BTRFS_SUPER_MAGIC;
}

bool hutch_btrfs_is_subvolume(const char *path) { return btrfs_util_is_subvolume(path) == BTRFS_UTIL_OK; }

int hutch_btrfs_subvol_create(const char *path, hutch_err *err) {
  errno = 0;
  enum btrfs_util_error e = btrfs_util_create_subvolume(path, 0, NULL, NULL);
  return e == BTRFS_UTIL_OK ? 0 : util_fail(err, e, "create subvolume", path);
}

int hutch_btrfs_snapshot(const char *src, const char *dst, bool readonly, hutch_err *err) {
  errno = 0;
  enum btrfs_util_error e =
      btrfs_util_create_snapshot(src, dst, readonly ? BTRFS_UTIL_CREATE_SNAPSHOT_READ_ONLY : 0, NULL, NULL);
  if (e == BTRFS_UTIL_OK) return 0;
  int en = errno ? errno : EIO;
  return hutch_err_sys(err, en, "snapshot `%s` to `%s` (%s)", src, dst, btrfs_util_strerror(e));
}

int hutch_btrfs_subvol_delete(const char *path, hutch_err *err) {
  struct stat st;
  if (lstat(path, &st) < 0 && errno == ENOENT) return 0;
  errno = 0;
  enum btrfs_util_error e = btrfs_util_delete_subvolume(path, BTRFS_UTIL_DELETE_SUBVOLUME_RECURSIVE);
  if (e == BTRFS_UTIL_OK || errno == ENOENT) return 0;
  return util_fail(err, e, "delete subvolume", path);
}

int hutch_btrfs_set_readonly(const char *path, bool ro, hutch_err *err) {
  errno = 0;
  enum btrfs_util_error e = btrfs_util_set_subvolume_read_only(path, ro);
  return e == BTRFS_UTIL_OK ? 0 : util_fail(err, e, ro ? "seal subvolume" : "unseal subvolume", path);
}

static void uuid_str(const uint8_t u[16], char out[37]) {
  static const uint8_t zero[16];
  if (!memcmp(u, zero, 16)) {
    out[0] = 0;
    return;
  }
  snprintf(out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2], u[3],
           u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

int hutch_btrfs_subvol_info(const char *path, struct hutch_btrfs_subvol *out, hutch_err *err) {
  struct btrfs_util_subvolume_info si;
  errno = 0;
  enum btrfs_util_error e = btrfs_util_subvolume_info(path, 0, &si);
  if (e != BTRFS_UTIL_OK) return util_fail(err, e, "subvolume info of", path);
  memset(out, 0, sizeof *out);
  out->id = si.id;
  out->generation = si.generation;
  out->readonly = (si.flags & BTRFS_ROOT_SUBVOL_RDONLY) != 0;
  uuid_str(si.uuid, out->uuid);
  uuid_str(si.parent_uuid, out->parent_uuid);
  uuid_str(si.received_uuid, out->received_uuid);
  return 0;
}

/* ---- quota groups -------------------------------------------------------- */

static int open_dir(const char *path, hutch_err *err) {
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) hutch_err_sys(err, errno, "open `%s`", path);
  return fd;
}

/* One item of the quota tree: key (0, type, offset). */
static int quota_item(int fd, uint8_t type, uint64_t offset, void *item, size_t item_len) {
  struct btrfs_ioctl_search_args a;
  memset(&a, 0, sizeof a);
  a.key.tree_id = BTRFS_QUOTA_TREE_OBJECTID;
  a.key.min_objectid = 0;
  a.key.max_objectid = 0;
  a.key.min_type = a.key.max_type = type;
  a.key.min_offset = a.key.max_offset = offset;
  a.key.max_transid = (uint64_t)-1;
  a.key.nr_items = 1;
  if (ioctl(fd, BTRFS_IOC_TREE_SEARCH, &a) < 0) return -1;
  if (a.key.nr_items < 1) {
    errno = ENOENT;
    return -1;
  }
  struct btrfs_ioctl_search_header h;
  memcpy(&h, a.buf, sizeof h);
  if (h.type != type || h.offset != offset || h.len < item_len) {
    errno = ENOENT;
    return -1;
  }
  memcpy(item, a.buf + sizeof h, item_len);
  return 0;
}

bool hutch_btrfs_quota_enabled(const char *mnt) {
  hutch_err e = HUTCH_ERR_INIT;
  cleanup_close int fd = open_dir(mnt, &e);
  if (fd < 0) return false;
  struct btrfs_qgroup_status_item st;
  return quota_item(fd, BTRFS_QGROUP_STATUS_KEY, 0, &st, sizeof st) == 0;
}

#ifndef BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA
#define BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA 4
#endif
#ifndef BTRFS_QGROUP_STATUS_FLAG_SIMPLE_MODE
#define BTRFS_QGROUP_STATUS_FLAG_SIMPLE_MODE (1ULL << 3)
#endif

int hutch_btrfs_quota_enable(const char *mnt, bool *simple, hutch_err *err) {
  cleanup_close int fd = open_dir(mnt, err);
  if (fd < 0) return -1;
  /* Simple quotas (Linux 6.7+) charge each extent to the subvolume that
   * wrote it: no backref walks when snapshots are made or deleted, which
   * full quota groups pay on every create and delete.  Older kernels: full. */
  struct btrfs_ioctl_quota_ctl_args a = {.cmd = BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA};
  if (ioctl(fd, BTRFS_IOC_QUOTA_CTL, &a) == 0) {
    if (simple) *simple = true;
    return 0;
  }
  a.cmd = BTRFS_QUOTA_CTL_ENABLE;
  if (ioctl(fd, BTRFS_IOC_QUOTA_CTL, &a) < 0) return hutch_err_sys(err, errno, "enable quotas on `%s`", mnt);
  if (simple) *simple = false;
  return 0;
}

bool hutch_btrfs_quota_simple(const char *mnt) {
  hutch_err e = HUTCH_ERR_INIT;
  cleanup_close int fd = open_dir(mnt, &e);
  if (fd < 0) return false;
  struct btrfs_qgroup_status_item st;
  if (quota_item(fd, BTRFS_QGROUP_STATUS_KEY, 0, &st, sizeof st) < 0) return false;
  return (le64toh(st.flags) & BTRFS_QGROUP_STATUS_FLAG_SIMPLE_MODE) != 0;
}

int hutch_btrfs_qgroup_limit(const char *path, uint64_t max_excl, hutch_err *err) {
  cleanup_close int fd = open_dir(path, err);
  if (fd < 0) return -1;
  struct btrfs_ioctl_qgroup_limit_args a;
  memset(&a, 0, sizeof a);
  a.qgroupid = 0; /* 0: the subvolume `fd` is in */
  a.lim.flags = BTRFS_QGROUP_LIMIT_MAX_EXCL;
  a.lim.max_excl = max_excl ? max_excl : (uint64_t)-1;
  if (ioctl(fd, BTRFS_IOC_QGROUP_LIMIT, &a) < 0) return hutch_err_sys(err, errno, "set quota of `%s`", path);
  return 0;
}

int hutch_btrfs_qgroup_usage(const char *mnt, uint64_t subvol_id, uint64_t *rfer, uint64_t *excl, hutch_err *err) {
  cleanup_close int fd = open_dir(mnt, err);
  if (fd < 0) return -1;
  struct btrfs_qgroup_info_item it;
  if (quota_item(fd, BTRFS_QGROUP_INFO_KEY, subvol_id, &it, sizeof it) < 0)
    return hutch_err_sys(err, errno, "quota usage of subvolume %llu on `%s`", (unsigned long long)subvol_id, mnt);
  if (rfer) *rfer = le64toh(it.rfer);
  if (excl) *excl = le64toh(it.excl);
  return 0;
}

int hutch_btrfs_sync(const char *mnt, hutch_err *err) {
  cleanup_close int fd = open_dir(mnt, err);
  if (fd < 0) return -1;
  if (ioctl(fd, BTRFS_IOC_SYNC, NULL) < 0) return hutch_err_sys(err, errno, "sync `%s`", mnt);
  return 0;
}

int hutch_btrfs_space(const char *mnt, uint64_t *used, uint64_t *size, hutch_err *err) {
  cleanup_close int fd = open_dir(mnt, err);
  if (fd < 0) return -1;
  enum { SLOTS = 16 };
  union {
    struct btrfs_ioctl_space_args a;
    char buf[sizeof(struct btrfs_ioctl_space_args) + SLOTS * sizeof(struct btrfs_ioctl_space_info)];
  } u;
  memset(&u, 0, sizeof u);
  u.a.space_slots = SLOTS;
  if (ioctl(fd, BTRFS_IOC_SPACE_INFO, &u) < 0) return hutch_err_sys(err, errno, "space info of `%s`", mnt);
  uint64_t total = 0;
  for (uint64_t i = 0; i < u.a.total_spaces && i < SLOTS; i++)
    if (u.a.spaces[i].flags & (BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_METADATA)) total += u.a.spaces[i].used_bytes;
  *used = total;
  struct statvfs v;
  if (fstatvfs(fd, &v) < 0) return hutch_err_sys(err, errno, "statvfs `%s`", mnt);
  *size = (uint64_t)v.f_blocks * v.f_frsize;
  return 0;
}

int hutch_btrfs_resize_max(const char *mnt, hutch_err *err) {
  cleanup_close int fd = open_dir(mnt, err);
  if (fd < 0) return -1;
  struct btrfs_ioctl_vol_args a;
  memset(&a, 0, sizeof a);
  snprintf(a.name, sizeof a.name, "1:max");
  if (ioctl(fd, BTRFS_IOC_RESIZE, &a) < 0) return hutch_err_sys(err, errno, "grow `%s`", mnt);
  return 0;
}

int hutch_btrfs_device_path(const char *mnt, char *out, size_t n, hutch_err *err) {
  cleanup_close int fd = open_dir(mnt, err);
  if (fd < 0) return -1;
  struct btrfs_ioctl_dev_info_args a;
  memset(&a, 0, sizeof a);
  a.devid = 1;
  if (ioctl(fd, BTRFS_IOC_DEV_INFO, &a) < 0) return hutch_err_sys(err, errno, "device of `%s`", mnt);
  snprintf(out, n, "%s", (const char *)a.path);
  return 0;
}
