/* User-space openat2() resolution (see resolve.h).
 *
 * The walk holds an O_PATH fd per directory below `dirfd` (a stack, so ".."
 * pops one and can never climb above `dirfd`), opens each component with
 * O_NOFOLLOW relative to its parent's fd, and expands symlinks by reading
 * them and splicing their text in front of what is left of the path: an
 * absolute target restarts at `dirfd`.  A component renamed or replaced
 * meanwhile is at worst looked up in the directory we hold, never outside.
 */
#include "resolve.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define RESOLVE_MAX_LINKS 40 /* as the kernel's MAXSYMLINKS */
#define RESOLVE_MAX_DEPTH 256
#define RESOLVE_MAX_TEXT 65536

struct walk {
  int root;
  int stack[RESOLVE_MAX_DEPTH];
  int depth;
};

static int cur(const struct walk *w) { return w->depth ? w->stack[w->depth - 1] : w->root; }

static void to_root(struct walk *w) {
  while (w->depth) close(w->stack[--w->depth]);
}

static bool is_link(int dir, const char *name) {
  struct stat st;
  return fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode);
}

static bool same_dev(int fd, dev_t dev) {
  struct stat st;
  return fstat(fd, &st) == 0 && st.st_dev == dev;
}

int init_resolve_open(int dirfd, const char *path, uint64_t flags, uint64_t mode, uint64_t resolve) {
  const bool beneath = resolve & RESOLVE_BENEATH, no_links = resolve & RESOLVE_NO_SYMLINKS,
             no_xdev = resolve & RESOLVE_NO_XDEV;
  if (!(resolve & (RESOLVE_IN_ROOT | RESOLVE_BENEATH)))
    return openat(dirfd, path, (int)(flags | O_CLOEXEC), (mode_t)mode);
  if (!*path) {
    errno = ENOENT;
    return -1;
  }
  if (beneath && path[0] == '/') {
    errno = EXDEV;
    return -1;
  }
  struct stat rst;
  if (fstat(dirfd, &rst) < 0) return -1;
  struct walk w = {.root = dirfd};
  char *rest = strdup(path);
  if (!rest) return -1;
  size_t pos = 0;
  int links = 0, result = -1, err = 0;
  char name[NAME_MAX + 1];

  for (;;) {
    while (rest[pos] == '/') pos++;
    if (!rest[pos]) {
      /* The path ends at a directory we hold ("/", "a/..", "a/."). */
      if ((flags & O_CREAT) && !(flags & O_EXCL) && !(flags & O_PATH)) {
        err = EISDIR;
        break;
      }
      result = openat(cur(&w), ".", (int)((flags & ~(uint64_t)O_CREAT) | O_CLOEXEC), (mode_t)mode);
      if (result < 0) err = errno;
      if (result >= 0 && (flags & O_CREAT) && (flags & O_EXCL)) {
        close(result);
        result = -1;
        err = EEXIST;
      }
      break;
    }
    size_t end = pos + strcspn(rest + pos, "/");
    size_t len = end - pos, after = end;
    while (rest[after] == '/') after++;
    const bool last = rest[after] == 0, trailing_slash = last && after > end;
    if (len > NAME_MAX) {
      err = ENAMETOOLONG;
      break;
    }
    memcpy(name, rest + pos, len);
    name[len] = 0;
    if (!strcmp(name, ".")) {
      pos = end;
      continue;
    }
    if (!strcmp(name, "..")) {
      if (w.depth) close(w.stack[--w.depth]);
      else if (beneath) {
        err = EXDEV;
        break;
      }
      pos = end;
      continue;
    }
    int dir = cur(&w);
    bool follow = false;
    if (!last) {
      int fd = openat(dir, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0) {
        err = errno;
        if ((err == ENOTDIR || err == ELOOP) && is_link(dir, name)) follow = true;
        else break;
      } else if (no_xdev && !same_dev(fd, rst.st_dev)) {
        close(fd);
        err = EXDEV;
        break;
      } else if (w.depth == RESOLVE_MAX_DEPTH) {
        close(fd);
        err = ENAMETOOLONG;
        break;
      } else {
        w.stack[w.depth++] = fd;
        pos = end;
        continue;
      }
    } else {
      if (trailing_slash && (flags & O_CREAT)) {
        err = EISDIR;
        break;
      }
      uint64_t of = flags | O_CLOEXEC | O_NOFOLLOW | (trailing_slash ? O_DIRECTORY : 0);
      int fd = openat(dir, name, (int)of, (mode_t)mode);
      if (fd >= 0) {
        struct stat st;
        if (fstat(fd, &st) < 0) {
          err = errno;
          close(fd);
          break;
        }
        /* O_PATH|O_NOFOLLOW opens a symlink itself: right only when the
         * caller asked for O_NOFOLLOW. */
        if (S_ISLNK(st.st_mode) && !(flags & O_NOFOLLOW)) {
          close(fd);
          follow = true;
        } else if (no_xdev && st.st_dev != rst.st_dev) {
          close(fd);
          err = EXDEV;
          break;
        } else {
          result = fd;
          break;
        }
      } else {
        err = errno;
        /* O_CREAT|O_EXCL never follows (EEXIST), nor does O_NOFOLLOW, unless
         * a trailing slash asks for the directory the link names. */
        if ((err == ELOOP || err == ENOTDIR) && (!(flags & O_NOFOLLOW) || trailing_slash) && is_link(dir, name))
          follow = true;
        else break;
      }
    }
    if (!follow) break;
    /* A symlink: its target, then what followed it. */
    if (no_links || ++links > RESOLVE_MAX_LINKS) {
      err = ELOOP;
      break;
    }
    char target[PATH_MAX];
    ssize_t n = readlinkat(dir, name, target, sizeof target - 1);
    if (n < 0) {
      err = errno;
      break;
    }
    if (n == 0) {
      err = ENOENT;
      break;
    }
    target[n] = 0;
    if (target[0] == '/') {
      if (beneath) {
        err = EXDEV;
        break;
      }
      to_root(&w);
    }
    size_t tail = strlen(rest + end);
    if ((size_t)n + tail + 2 > RESOLVE_MAX_TEXT) {
      err = ENAMETOOLONG;
      break;
    }
    char *next = malloc((size_t)n + tail + 2);
    if (!next) {
      err = ENOMEM;
      break;
    }
    memcpy(next, target, (size_t)n);
    memcpy(next + n, rest + end, tail + 1);
    free(rest);
    rest = next;
    pos = 0;
    err = 0;
  }
  to_root(&w);
  free(rest);
  if (result < 0) errno = err ? err : ENOENT;
  return result;
}
