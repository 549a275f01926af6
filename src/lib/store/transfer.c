#include "store/transfer.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "store/archive.h"
#include "store/btrfs.h"

bool hutch_snapshot_id_valid(const char *id) {
  size_t n = strlen(id);
  if (n < 6 || n > 60 || strncmp(id, "snap_", 5)) return false;
  for (const char *p = id + 5; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9'))) return false;
  return true;
}

int hutch_snapshot_export(const struct hutch_pool *p, const char *snap_id, const char *parent_id,
                          const char *meta_json, int out_fd, struct hutch_export_stats *st, hutch_err *err) {
  if (p->kind != HUTCH_POOL_BTRFS)
    return hutch_err_set(err, 501, "not_supported", "export needs the btrfs storage backend (this pool: overlay)");
  cleanup_free char *snap = hutch_pool_path(p, "snapshots", snap_id);
  cleanup_free char *parent = parent_id ? hutch_pool_path(p, "snapshots", parent_id) : NULL;
  const char *argv[8];
  size_t a = 0;
  argv[a++] = "btrfs";
  argv[a++] = "send";
  argv[a++] = "-q";
  if (parent) {
    argv[a++] = "-p";
    argv[a++] = parent;
  }
  argv[a++] = snap;
  argv[a] = NULL;
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) < 0) return hutch_err_sys(err, errno, "pipe");
  struct hutch_child child;
  int rc = hutch_spawn(argv, -1, pipefd[1], &child, err);
  close(pipefd[1]);
  if (rc < 0) {
    close(pipefd[0]);
    return -1;
  }
  struct hutch_archive_stats as;
  rc = hutch_archive_write(out_fd, meta_json, pipefd[0], 0, &as, err);
  close(pipefd[0]); /* a send still writing gets EPIPE and ends */
  hutch_err e2 = HUTCH_ERR_INIT;
  int wrc = hutch_spawn_wait("btrfs send", &child, NULL, NULL, &e2);
  if (rc < 0) return hutch_err_wrap(err, "export snapshot %s", snap_id);
  if (wrc < 0) {
    *err = e2;
    return hutch_err_wrap(err, "export snapshot %s", snap_id);
  }
  if (st) {
    st->raw_bytes = as.raw_bytes;
    st->total_bytes = as.total_bytes;
    snprintf(st->sha256_hex, sizeof st->sha256_hex, "%s", as.sha256_hex);
  }
  return 0;
}

int hutch_snapshot_import_verify(int fd, char **meta_json, hutch_err *err) {
  struct hutch_archive_stats as;
  return hutch_archive_verify(fd, meta_json, &as, err);
}

/* The one subvolume `btrfs receive` made in `dir`. */
static char *received_volume(const char *dir, hutch_err *err) {
  DIR *d = opendir(dir);
  if (!d) {
    hutch_err_sys(err, errno, "open `%s`", dir);
    return NULL;
  }
  char *found = NULL;
  int count = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    count++;
    if (!found) found = xasprintf("%s/%s", dir, e->d_name);
  }
  closedir(d);
  if (count != 1 || !hutch_btrfs_is_subvolume(found)) {
    free(found);
    hutch_err_set(err, 400, "invalid_archive", "the stream does not hold exactly one snapshot");
    return NULL;
  }
  return found;
}

int hutch_snapshot_import_receive(const struct hutch_pool *p, int fd, const char *snap_id, hutch_err *err) {
  if (p->kind != HUTCH_POOL_BTRFS)
    return hutch_err_set(err, 501, "not_supported", "import needs the btrfs storage backend (this pool: overlay)");
  if (!hutch_snapshot_id_valid(snap_id)) return hutch_err_set(err, 400, "invalid_archive", "bad snapshot id");
  char rnd[32];
  hutch_random_id("r", rnd, sizeof rnd);
  cleanup_free char *name = xasprintf("import-%s", rnd);
  cleanup_free char *dir = hutch_pool_path(p, "staging", name);
  if (mkdir(dir, 0700) < 0) return hutch_err_sys(err, errno, "mkdir `%s`", dir);
  /* --chroot: a crafted stream cannot name paths outside the directory;
   * -e: stop at the end marker (one snapshot per stream). */
  const char *argv[] = {"btrfs", "receive", "-q", "-e", "--chroot", dir, NULL};
  int pipefd[2];
  int rc = -1;
  cleanup_free char *vol = NULL;
  cleanup_free char *dst = hutch_pool_path(p, "snapshots", snap_id);
  if (pipe2(pipefd, O_CLOEXEC) < 0) {
    hutch_err_sys(err, errno, "pipe");
    goto out;
  }
  struct hutch_child child;
  if (hutch_spawn(argv, pipefd[0], -1, &child, err) < 0) {
    close(pipefd[0]);
    close(pipefd[1]);
    goto out;
  }
  close(pipefd[0]);
  int xrc = hutch_archive_extract(fd, pipefd[1], err);
  close(pipefd[1]);
  hutch_err e2 = HUTCH_ERR_INIT;
  int wrc = hutch_spawn_wait("btrfs receive", &child, NULL, NULL, &e2);
  if (xrc < 0) goto out;
  if (wrc < 0) {
    *err = e2;
    /* The parent of an incremental stream must be here first. */
    if (strstr(e2.msg, "cannot find parent subvolume") || strstr(e2.msg, "could not find parent"))
      err->status = 409, snprintf(err->code, sizeof err->code, "conflict");
    else
      err->status = 400, snprintf(err->code, sizeof err->code, "invalid_archive");
    goto out;
  }
  vol = received_volume(dir, err);
  if (!vol) goto out;
  if (access(dst, F_OK) == 0) {
    hutch_err_set(err, 409, "conflict", "snapshot `%s` already exists", snap_id);
    goto out;
  }
  /* A read-only subvolume cannot change parent directory (its ".." would
   * change): unseal for the move (received_uuid stays, so later incremental
   * imports still find their parent), seal again. */
  if (hutch_btrfs_set_readonly(vol, false, err) < 0) goto out;
  if (rename(vol, dst) < 0) {
    hutch_err_sys(err, errno, "rename `%s`", vol);
    goto out;
  }
  if (hutch_btrfs_set_readonly(dst, true, err) < 0) {
    hutch_err e4 = HUTCH_ERR_INIT;
    hutch_pool_volume_remove(p, dst, &e4);
    goto out;
  }
  rc = 0;
out:;
  hutch_err e3 = HUTCH_ERR_INIT;
  DIR *d = opendir(dir);
  if (d) {
    struct dirent *e;
    while ((e = readdir(d))) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      cleanup_free char *path = xasprintf("%s/%s", dir, e->d_name);
      hutch_pool_volume_remove(p, path, &e3);
    }
    closedir(d);
  }
  rmdir(dir);
  if (rc < 0) hutch_err_wrap(err, "import snapshot %s", snap_id);
  return rc;
}
