#include "isolate/userns.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"

static int write_maps(pid_t pid, uint32_t ns_first, uint32_t base, uint32_t count, hutch_err *err) {
  char path[64], map[64];
  snprintf(map, sizeof map, "%u %u %u\n", ns_first, base, count);
  snprintf(path, sizeof path, "/proc/%d/uid_map", (int)pid);
  if (write_file_str(path, map, err) < 0) return hutch_err_wrap(err, "write uid map");
  snprintf(path, sizeof path, "/proc/%d/gid_map", (int)pid);
  if (write_file_str(path, map, err) < 0) return hutch_err_wrap(err, "write gid map");
  return 0;
}

int hutch_userns_write_maps(pid_t pid, uint32_t base, uint32_t count, hutch_err *err) {
  return write_maps(pid, 0, base, count, err);
}

int hutch_userns_fd(uint32_t ns_first, uint32_t host_first, uint32_t count, hutch_err *err) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) < 0) return hutch_err_sys(err, errno, "pipe");
  pid_t pid = (pid_t)syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, NULL, NULL, NULL, NULL);
  if (pid < 0) {
    int e = errno;
    close(p[0]);
    close(p[1]);
    return hutch_err_sys(err, e, "clone user namespace");
  }
  if (pid == 0) {
    char c;
    close(p[1]);
    (void)!read(p[0], &c, 1); /* hold the namespace until the parent has its fd */
    _exit(0);
  }
  close(p[0]);
  int fd = -1;
  if (write_maps(pid, ns_first, host_first, count, err) == 0) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/ns/user", (int)pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) hutch_err_sys(err, errno, "open `%s`", path);
  }
  close(p[1]);
  waitpid(pid, NULL, 0);
  return fd;
}

int hutch_userns_idmapped_tree(const char *path, int userns_fd, uint64_t attr_set, hutch_err *err) {
  int fd = open_tree(AT_FDCWD, path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
  if (fd < 0) return hutch_err_sys(err, errno, "open_tree `%s`", path);
  struct mount_attr attr = {
      .attr_set = MOUNT_ATTR_IDMAP | attr_set,
      .userns_fd = (uint64_t)userns_fd,
      .propagation = MS_PRIVATE,
  };
  if (mount_setattr(fd, "", AT_EMPTY_PATH | AT_RECURSIVE, &attr, sizeof attr) < 0) {
    int e = errno;
    close(fd);
    return hutch_err_sys(err, e, "idmap mount of `%s`", path);
  }
  return fd;
}

int hutch_uid_slot_claim(const char *lockdir, uint32_t nslots, const char *owner, uint32_t *slot_out,
                         hutch_err *err) {
  if (mkdir_p(lockdir, 0700, err) < 0) return hutch_err_wrap(err, "uid slot directory");
  /* Start at a random slot so concurrent instances rarely race for the same one. */
  uint32_t start = 0;
  hutch_random_bytes(&start, sizeof start);
  for (uint32_t i = 0; i < nslots; i++) {
    uint32_t slot = (start + i) % nslots;
    char path[4096];
    snprintf(path, sizeof path, "%s/%u", lockdir, slot);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
      if (errno == EEXIST) continue;
      return hutch_err_sys(err, errno, "claim uid slot `%s`", path);
    }
    int r = write_full(fd, owner, strlen(owner));
    close(fd);
    if (r < 0) {
      unlink(path);
      return hutch_err_sys(err, errno, "write uid slot `%s`", path);
    }
    *slot_out = slot;
    return 0;
  }
  return hutch_err_set(err, 503, "unavailable", "no free uid range (all %u slots are in use)", nslots);
}

int hutch_uid_slot_reclaim(const char *lockdir, uint32_t slot, const char *owner, hutch_err *err) {
  if (mkdir_p(lockdir, 0700, err) < 0) return hutch_err_wrap(err, "uid slot directory");
  char path[4096];
  snprintf(path, sizeof path, "%s/%u", lockdir, slot);
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd >= 0) {
    int r = write_full(fd, owner, strlen(owner));
    close(fd);
    if (r < 0) {
      unlink(path);
      return hutch_err_sys(err, errno, "write uid slot `%s`", path);
    }
    return 0;
  }
  if (errno != EEXIST) return hutch_err_sys(err, errno, "claim uid slot `%s`", path);
  hutch_err e2 = HUTCH_ERR_INIT;
  cleanup_free char *have = read_file(path, 8192, NULL, &e2);
  return have && !strcmp(have, owner) ? 0 : 1;
}

int hutch_uid_slot_release(const char *lockdir, uint32_t slot, hutch_err *err) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%u", lockdir, slot);
  if (unlink(path) < 0 && errno != ENOENT) return hutch_err_sys(err, errno, "release uid slot `%s`", path);
  return 0;
}
