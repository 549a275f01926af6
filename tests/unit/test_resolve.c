/* hutch-init's user-space openat2 (src/init/resolve.c, used where the
 * kernel lacks openat2: gVisor) checked against the kernel's openat2 on a
 * tree of hostile symlinks: same file opened, or the same errno. */
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../../src/init/resolve.c"
#include "tap.h"

#ifndef SYS_openat2
#define SYS_openat2 437
#endif

static int kernel_openat2(int dirfd, const char *path, uint64_t flags, uint64_t mode, uint64_t resolve) {
  struct open_how how = {.flags = flags | O_CLOEXEC, .mode = mode, .resolve = resolve};
  return (int)syscall(SYS_openat2, dirfd, path, &how, sizeof how);
}

static char top[] = "/tmp/hutch-resolve-test.XXXXXX";
static int root_fd = -1;

static void mk(const char *kind, const char *path, const char *target) {
  char p[512];
  snprintf(p, sizeof p, "%s/root/%s", top, path);
  int r = 0;
  if (!strcmp(kind, "dir")) r = mkdir(p, 0755);
  else if (!strcmp(kind, "file")) {
    int fd = open(p, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    r = fd < 0 ? -1 : close(fd);
  } else r = symlink(target, p);
  if (r < 0) printf("# setup %s %s: %s\n", kind, path, strerror(errno));
}

/* One case: both ways, compare. */
static void same(const char *path, uint64_t flags, uint64_t resolve, const char *what) {
  errno = 0;
  uint64_t mode = (flags & O_CREAT) ? 0644 : 0;
  int k = kernel_openat2(root_fd, path, flags, mode, resolve);
  int ke = errno;
  errno = 0;
  int u = init_resolve_open(root_fd, path, flags, mode, resolve);
  int ue = errno;
  if (k >= 0 && u >= 0) {
    struct stat a, b;
    fstat(k, &a);
    fstat(u, &b);
    ok(a.st_dev == b.st_dev && a.st_ino == b.st_ino, "%s `%s`: the same file", what, path);
    int fl = fcntl(u, F_GETFD);
    ok(fl >= 0 && (fl & FD_CLOEXEC), "... close-on-exec");
  } else {
    ok(k < 0 && u < 0 && ke == ue, "%s `%s`: kernel %s, user space %s", what, path,
       k < 0 ? strerror(ke) : "opens it", u < 0 ? strerror(ue) : "opens it");
  }
  if (k >= 0) close(k);
  if (u >= 0) close(u);
}

int main(void) {
  if (!mkdtemp(top)) skip_all("mkdtemp");
  char p[512];
  snprintf(p, sizeof p, "%s/root", top);
  mkdir(p, 0755);
  snprintf(p, sizeof p, "%s/outside", top);
  mkdir(p, 0755);
  root_fd = open(top, O_PATH | O_DIRECTORY | O_CLOEXEC);
  snprintf(p, sizeof p, "%s/root", top);
  root_fd = open(p, O_PATH | O_DIRECTORY | O_CLOEXEC);
  {
    struct open_how how = {.flags = O_PATH, .resolve = RESOLVE_IN_ROOT};
    if (syscall(SYS_openat2, root_fd, ".", &how, sizeof how) < 0 && errno == ENOSYS)
      skip_all("this kernel has no openat2 to compare with");
  }
  mk("dir", "a", NULL);
  mk("dir", "a/b", NULL);
  mk("file", "a/f", NULL);
  mk("file", "top", NULL);
  mk("link", "abs", "/a");
  mk("link", "rel", "a/b");
  mk("link", "up", "../../../..");
  mk("link", "a/esc", "/../../outside");
  mk("link", "a/esc2", "../../../outside");
  mk("link", "loop", "loop");
  mk("link", "dangling", "nothere");
  mk("link", "fl", "a/f");
  mk("link", "a/b/chain", "../../abs/b/../f");
  mk("link", "self", "/proc/self/root");
  mk("link", "empty_dir_link", "a/b/");

  static const char *const paths[] = {
      "a",          "a/f",        "/a/f",         "a/../a/f",    "../../a/f",         "/../../..",
      "abs",        "abs/f",      "abs/b",        "rel",         "rel/..",            "up",
      "up/top",     "a/esc",      "a/esc2",       "a/esc/x",     "a/esc2/..",         "loop",
      "loop/x",     "dangling",   "fl",           "fl/",         "a/f/",              "a/b/chain",
      "a//b///",    ".",          "/",            "..",          "a/./b/.",           "nope/x",
      "self",       "self/a/f",   "empty_dir_link", "empty_dir_link/..", "top/..",     "a/b/chain/..",
      NULL,
  };
  const uint64_t IN_ROOT = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
  const uint64_t BENEATH = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  for (size_t i = 0; paths[i]; i++) {
    same(paths[i], O_PATH, IN_ROOT, "O_PATH in root");
    same(paths[i], O_PATH | O_NOFOLLOW, IN_ROOT, "O_PATH|O_NOFOLLOW in root");
    same(paths[i], O_RDONLY, IN_ROOT, "O_RDONLY in root");
    same(paths[i], O_RDONLY | O_DIRECTORY, IN_ROOT, "O_DIRECTORY in root");
    same(paths[i], O_PATH | O_NOFOLLOW, BENEATH, "beneath, no symlinks");
    same(paths[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW, BENEATH | RESOLVE_NO_XDEV, "beneath, no xdev");
  }

  /* Creation: O_EXCL never follows; O_CREAT follows a dangling link to its
   * target, inside the root. */
  same("dangling", O_WRONLY | O_CREAT | O_EXCL, IN_ROOT, "O_CREAT|O_EXCL");
  snprintf(p, sizeof p, "%s/root/a/new", top);
  int u = init_resolve_open(root_fd, "a/new", O_WRONLY | O_CREAT | O_EXCL, 0600, IN_ROOT);
  struct stat st;
  ok(u >= 0 && stat(p, &st) == 0 && (st.st_mode & 07777) == 0600, "user space creates a/new with mode 0600");
  if (u >= 0) close(u);
  mk("link", "a/esc_new", "/../../created");
  u = init_resolve_open(root_fd, "a/esc_new", O_WRONLY | O_CREAT, 0600, IN_ROOT);
  snprintf(p, sizeof p, "%s/created", top);
  ok(access(p, F_OK) < 0, "O_CREAT through an escaping symlink creates nothing outside the root");
  snprintf(p, sizeof p, "%s/root/created", top);
  ok(u >= 0 && access(p, F_OK) == 0, "... it lands at the root instead, as openat2 does");
  if (u >= 0) close(u);
  u = init_resolve_open(root_fd, "a/", O_WRONLY | O_CREAT, 0600, IN_ROOT);
  ok(u < 0 && errno == EISDIR, "O_CREAT with a trailing slash: EISDIR");
  u = init_resolve_open(root_fd, "", O_PATH, 0, IN_ROOT);
  ok(u < 0 && errno == ENOENT, "an empty path: ENOENT");

  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", top);
  (void)!system(cmd);
  printf("1..%d\n", tap_n);
  return tap_failed ? 1 : 0;
}
