#include "isolate/mounts.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/util.h"

#define STAGING "/tmp"

static int do_mount(const char *src, const char *dst, const char *type, unsigned long flags, const char *data,
                    hutch_err *err) {
  if (mount(src, dst, type, flags, data) < 0)
    return hutch_err_sys(err, errno, "mount %s on `%s`", type ? type : (src ? src : "bind"), dst);
  return 0;
}

static int attach(int fd, const char *dst, hutch_err *err) {
  if (move_mount(fd, "", AT_FDCWD, dst, MOVE_MOUNT_F_EMPTY_PATH) < 0)
    return hutch_err_sys(err, errno, "attach mount at `%s`", dst);
  return 0;
}

static int ensure_dir(const char *path, mode_t mode, hutch_err *err) {
  if (mkdir(path, mode) < 0 && errno != EEXIST) return hutch_err_sys(err, errno, "mkdir `%s`", path);
  return 0;
}

/* Device nodes cannot be created in a user namespace; bind the host's. */
static int bind_dev(const char *name, hutch_err *err) {
  char src[64], dst[64];
  snprintf(src, sizeof src, "/dev/%s", name);
  snprintf(dst, sizeof dst, "dev/%s", name);
  int fd = open(dst, O_CREAT | O_WRONLY | O_CLOEXEC | O_NOFOLLOW, 0666);
  if (fd < 0) return hutch_err_sys(err, errno, "create `/%s`", dst);
  close(fd);
  return do_mount(src, dst, NULL, MS_BIND, NULL, err);
}

static int setup_dev(hutch_err *err) {
  if (do_mount("tmpfs", "dev", "tmpfs", MS_NOSUID | MS_NOEXEC | MS_STRICTATIME, "mode=755,size=64k,nr_inodes=64",
               err) < 0)
    return -1;
  static const char *const nodes[] = {"null", "zero", "full", "random", "urandom", "tty"};
  for (size_t i = 0; i < sizeof nodes / sizeof *nodes; i++)
    if (bind_dev(nodes[i], err) < 0) return -1;
  if (ensure_dir("dev/pts", 0755, err) < 0 || ensure_dir("dev/shm", 01777, err) < 0) return -1;
  /* gid 5 is "tty" in the generated /etc/group. */
  if (do_mount("devpts", "dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5",
               err) < 0)
    return -1;
  if (do_mount("shm", "dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=1777,size=64m", err) < 0)
    return -1;
  static const char *const links[][2] = {{"pts/ptmx", "dev/ptmx"},       {"/proc/self/fd", "dev/fd"},
                                         {"/proc/self/fd/0", "dev/stdin"}, {"/proc/self/fd/1", "dev/stdout"},
                                         {"/proc/self/fd/2", "dev/stderr"}};
  for (size_t i = 0; i < sizeof links / sizeof *links; i++) {
    if (symlink(links[i][0], links[i][1]) < 0) return hutch_err_sys(err, errno, "symlink `/%s`", links[i][1]);
  }
  return 0;
}

int hutch_mounts_setup_root(const struct hutch_rootfs_plan *plan, hutch_err *err) {
  /* Nothing below may propagate back to the host's mount namespace. */
  if (do_mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL, err) < 0) return -1;
  /* Sandbox root cannot traverse the host path of its own rootfs (the data
   * directory is 0700 root), so assemble on a private staging tmpfs, as
   * bubblewrap does; it disappears with the old root. */
  if (do_mount("tmpfs", STAGING, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=16k,nr_inodes=16", err) < 0)
    return -1;
  if (ensure_dir(STAGING "/root", 0755, err) < 0) return -1;
  if (plan->lower_fd >= 0) {
    /* The sandbox's root is an overlay: the shared read-only template under
     * the sandbox's own upper layer.  Creation is O(1) whatever the size
     * of the template, and the sandbox's directory holds only its changes. */
    if (ensure_dir(STAGING "/lower", 0755, err) < 0 || ensure_dir(STAGING "/rw", 0755, err) < 0 ||
        attach(plan->lower_fd, STAGING "/lower", err) < 0 || attach(plan->rootfs_fd, STAGING "/rw", err) < 0 ||
        do_mount("overlay", STAGING "/root", "overlay", MS_NOSUID | MS_NODEV,
                 "lowerdir=" STAGING "/lower,upperdir=" STAGING "/rw/upper,workdir=" STAGING "/rw/work,userxattr",
                 err) < 0)
      return -1;
  } else if (attach(plan->rootfs_fd, STAGING "/root", err) < 0) {
    return -1;
  }
  if (chdir(STAGING "/root") < 0) return hutch_err_sys(err, errno, "chdir `%s`", STAGING "/root");
  if (plan->usr_fd >= 0) {
    if (ensure_dir("usr", 0755, err) < 0 || attach(plan->usr_fd, "usr", err) < 0) return -1;
  }
  if (ensure_dir("proc", 0555, err) < 0 ||
      do_mount("proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL, err) < 0)
    return -1;
  if (ensure_dir("dev", 0755, err) < 0 || setup_dev(err) < 0) return -1;
  char opts[64];
  snprintf(opts, sizeof opts, "mode=1777,size=%llu",
           (unsigned long long)(plan->tmp_bytes ? plan->tmp_bytes : 64ull << 20));
  if (ensure_dir("tmp", 01777, err) < 0 || do_mount("tmpfs", "tmp", "tmpfs", MS_NOSUID | MS_NODEV, opts, err) < 0)
    return -1;
  /* pivot_root(".", ".") stacks the old root under the new one; detaching
   * it leaves no path back to the host's filesystem (as in runc/crun). */
  if (syscall(SYS_pivot_root, ".", ".") < 0) return hutch_err_sys(err, errno, "pivot_root");
  if (umount2(".", MNT_DETACH) < 0) return hutch_err_sys(err, errno, "detach old root");
  if (chdir("/") < 0) return hutch_err_sys(err, errno, "chdir /");
  return 0;
}
