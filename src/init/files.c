/* hutch-init: file operations (FS_STAT .. FS_CLOSE, docs/protocol.md).
 *
 * Every path comes from the client and is resolved inside the sandbox:
 * openat2() from a directory fd of "/" with RESOLVE_IN_ROOT (".." and
 * absolute symlinks cannot climb above "/") and RESOLVE_NO_MAGICLINKS
 * (/proc/self/root-style links are refused).  Operations on the last
 * component (stat, mkdir, remove, rename) open its parent that way and act
 * with the *at() call on the name, so a symlink as the last component is
 * never followed by them.  Paths are never joined on the host
 * (CVE-2024-21626, CVE-2018-15664 are the cautionary tales).
 *
 * Answers: FS_RESULT or FS_DATA on success, ERROR(ERRNO, MESSAGE) on failure
 * with a message naming the operation and the path as the client gave it:
 * "open `/etc/x`: No such file or directory".
 *
 * Requests are served one at a time on the poll loop; reads and writes move
 * at most one frame (1 MiB) per request, so a transfer of any size holds one
 * chunk in init.  All fds are close-on-exec.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/util.h"
#include "init.h"
#include "resolve.h"

#ifndef SYS_openat2
#define SYS_openat2 437
#endif

#define FS_PATH_MAX 4096
#define FS_MAX_HANDLES 64
#define FS_LIST_MAX_DEPTH 10
#define FS_LIST_MAX_ENTRIES 10000
/* An FS_RESULT of FS_LIST stays below the frame limit; room for FLAGS. */
#define FS_LIST_MAX_BYTES (HUTCH_FRAME_MAX - 64)
#define FS_REMOVE_MAX_DEPTH 512
#define FS_REMOVE_BATCH 256
#define FS_IO_MAX HUTCH_FRAME_MAX

#define IN_ROOT (RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
/* Below an fd we opened ourselves: no way out, no symlinks at all. */
#define BENEATH (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)

static int root_fd = -1;

struct fs_handle {
  uint32_t id; /* 0 = free */
  int fd;
  char *path; /* as the client gave it, for messages */
};
static struct fs_handle handles[FS_MAX_HANDLES];
static uint32_t next_handle = 1;

void fs_init(void) { root_fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC); }

/* Fail with `errnum` and a message of our own (no strerror appended). */
__attribute__((format(printf, 3, 4))) static int fs_fail(hutch_err *err, int errnum, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err->msg, sizeof err->msg, fmt, ap);
  va_end(ap);
  err->errnum = errnum;
  err->status = 400;
  return -1;
}

/* Messages quote paths up to this many bytes. */
#define Q "`%.1024s`"

static int fs_openat2(int dirfd, const char *path, uint64_t flags, uint64_t mode, uint64_t resolve) {
  struct open_how how;
  memset(&how, 0, sizeof how);
  how.flags = flags | O_CLOEXEC;
  how.mode = mode;
  how.resolve = resolve;
  /* Kernels without openat2 (gVisor): the same resolution in user space. */
  static bool no_openat2;
  for (int tries = 0;; tries++) {
    long r = no_openat2 ? -1 : syscall(SYS_openat2, dirfd, path, &how, sizeof how);
    if (r < 0 && (no_openat2 || errno == ENOSYS)) {
      no_openat2 = true;
      r = init_resolve_open(dirfd, path, flags, mode, resolve);
    }
    if (r >= 0) return (int)r;
    /* EAGAIN: RESOLVE_IN_ROOT saw a concurrent rename or mount and refused
     * to guess; a retry resolves against the new state. */
    if (errno == EINTR || (errno == EAGAIN && tries < 16)) continue;
    return -1;
  }
}

/* A request's path: checked (present, not empty, no NUL, at most
 * FS_PATH_MAX bytes).  *shown is the client's text, *eff the path to
 * resolve from the root (a relative path is relative to /root).  Both are
 * allocated; the caller frees them. */
static int req_path(const unsigned char *p, size_t len, uint8_t tag, const char *op, char **shown, char **eff,
                    hutch_err *err) {
  const unsigned char *v;
  uint32_t vl;
  int r = hutch_tlv_find(p, len, tag, &v, &vl);
  const char *which = tag == HUTCH_TAG_PATH2 ? "PATH2" : "PATH";
  if (r < 0) return fs_fail(err, EINVAL, "%s: malformed request", op);
  if (r == 0) return fs_fail(err, EINVAL, "%s: missing %s", op, which);
  if (vl == 0) return fs_fail(err, EINVAL, "%s: empty path", op);
  if (memchr(v, 0, vl)) return fs_fail(err, EINVAL, "%s: path contains a NUL byte", op);
  if (vl > FS_PATH_MAX) return fs_fail(err, EINVAL, "%s: path longer than %d bytes", op, FS_PATH_MAX);
  *shown = xstrndup((const char *)v, vl);
  *eff = v[0] == '/' ? xstrdup(*shown) : xasprintf("/root/%s", *shown);
  return 0;
}

/* Optional u32 field: 1 found, 0 absent, -1 (err set) malformed. */
static int req_u32(const unsigned char *p, size_t len, uint8_t tag, const char *op, uint32_t *out, hutch_err *err) {
  int r = hutch_tlv_find_u32(p, len, tag, out);
  if (r < 0) return fs_fail(err, EINVAL, "%s: malformed field %u", op, tag);
  return r;
}

/* Open (O_PATH) the directory holding the last component of `eff`; *last
 * points at that component inside *buf (allocated, caller frees).  Trailing
 * slashes are dropped; "/" itself, "." and ".." have no parent to act in. */
static int open_parent(const char *eff, const char *op, const char *shown, char **buf, const char **last,
                       hutch_err *err) {
  char *b = xstrdup(eff);
  size_t n = strlen(b);
  while (n > 1 && b[n - 1] == '/') b[--n] = 0;
  char *slash = strrchr(b, '/');
  if (!slash || !slash[1]) {
    free(b);
    return fs_fail(err, EINVAL, "%s " Q ": not allowed on the root directory", op, shown);
  }
  if (!strcmp(slash + 1, ".") || !strcmp(slash + 1, "..")) {
    free(b);
    return fs_fail(err, EINVAL, "%s " Q ": the last component may not be `.` or `..`", op, shown);
  }
  *last = slash + 1;
  const char *parent = b;
  if (slash == b) parent = "/";
  else *slash = 0;
  int fd = fs_openat2(root_fd, parent, O_PATH | O_DIRECTORY, 0, IN_ROOT);
  if (fd < 0) {
    int e = errno;
    free(b);
    return hutch_err_sys(err, e, "%s " Q, op, shown);
  }
  *buf = b;
  return fd;
}

static void put_entry(struct hutch_buf *out, const char *path, const struct stat *st, int dirfd, const char *name) {
  struct hutch_buf e;
  hutch_buf_init(&e);
  uint32_t type = S_ISREG(st->st_mode) ? 1 : S_ISDIR(st->st_mode) ? 2 : S_ISLNK(st->st_mode) ? 3 : 4;
  hutch_tlv_put_str(&e, HUTCH_TAG_PATH, path);
  hutch_tlv_put_u32(&e, HUTCH_TAG_E_TYPE, type);
  hutch_tlv_put_u64(&e, HUTCH_TAG_E_SIZE, st->st_size > 0 ? (uint64_t)st->st_size : 0);
  hutch_tlv_put_u32(&e, HUTCH_TAG_MODE, st->st_mode & 07777);
  hutch_tlv_put_u64(&e, HUTCH_TAG_E_MTIME, st->st_mtim.tv_sec > 0 ? (uint64_t)st->st_mtim.tv_sec : 0);
  hutch_tlv_put_u32(&e, HUTCH_TAG_UID, st->st_uid);
  hutch_tlv_put_u32(&e, HUTCH_TAG_GID, st->st_gid);
  if (type == 3) {
    char target[FS_PATH_MAX];
    ssize_t n = readlinkat(dirfd, name, target, sizeof target);
    if (n >= 0) hutch_tlv_put(&e, HUTCH_TAG_E_LINK, target, (uint32_t)n);
  }
  hutch_tlv_put(out, HUTCH_TAG_ENTRY, e.data, (uint32_t)e.len);
  hutch_buf_free(&e);
}

static void send_result(uint32_t id, const struct hutch_buf *b) {
  init_send(HUTCH_MSG_FS_RESULT, id, b ? b->data : NULL, b ? b->len : 0);
}

/* ---- stat, list ------------------------------------------------------- */

static int fs_stat(uint32_t id, const unsigned char *p, size_t len, hutch_err *err) {
  cleanup_free char *shown = NULL, *eff = NULL;
  if (req_path(p, len, HUTCH_TAG_PATH, "stat", &shown, &eff, err) < 0) return -1;
  /* O_PATH|O_NOFOLLOW: a symlink as the last component is the link itself. */
  cleanup_close int fd = fs_openat2(root_fd, eff, O_PATH | O_NOFOLLOW, 0, IN_ROOT);
  struct stat st;
  if (fd < 0 || fstatat(fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0)
    return hutch_err_sys(err, errno, "stat " Q, shown);
  struct hutch_buf b;
  hutch_buf_init(&b);
  put_entry(&b, shown, &st, fd, "");
  send_result(id, &b);
  hutch_buf_free(&b);
  return 0;
}

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Up to `max` names of an open directory (not . and ..), from its start;
 * *more says whether there were others.  Returns an allocated array of
 * allocated names (count in *n), or NULL with errno set. */
static char **read_names(int dfd, size_t max, size_t *n, bool *more) {
  *n = 0;
  *more = false;
  int fd = fcntl(dfd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return NULL;
  DIR *d = fdopendir(fd);
  if (!d) {
    int e = errno;
    close(fd);
    errno = e;
    return NULL;
  }
  rewinddir(d); /* the dup shares the offset with dfd */
  char **names = xcalloc(max + 1, sizeof *names);
  struct dirent *de;
  errno = 0;
  while ((de = readdir(d))) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    if (*n == max) {
      *more = true;
      break;
    }
    names[(*n)++] = xstrdup(de->d_name);
  }
  closedir(d);
  return names;
}

static void free_names(char **names, size_t n) {
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
}

/* Breadth first, so a truncated listing is complete for the levels it
 * covers; each directory's entries are sorted by name.  The answer is
 * bounded by FS_LIST_MAX_ENTRIES entries and by the frame size: beyond
 * either it is cut and FLAGS bit 0 (truncated) is set.  Symlinks are listed,
 * never followed; a subdirectory that cannot be opened (permissions, gone)
 * is listed but not descended into. */
static int fs_list(uint32_t id, const unsigned char *p, size_t len, hutch_err *err) {
  cleanup_free char *shown = NULL, *eff = NULL;
  if (req_path(p, len, HUTCH_TAG_PATH, "list", &shown, &eff, err) < 0) return -1;
  uint32_t depth = 1;
  int r = req_u32(p, len, HUTCH_TAG_DEPTH, "list", &depth, err);
  if (r < 0) return -1;
  if (depth < 1 || depth > FS_LIST_MAX_DEPTH)
    return fs_fail(err, EINVAL, "list " Q ": DEPTH must be 1-%d", shown, FS_LIST_MAX_DEPTH);
  cleanup_close int top = fs_openat2(root_fd, eff, O_RDONLY | O_DIRECTORY, 0, IN_ROOT);
  if (top < 0) return hutch_err_sys(err, errno, "list " Q, shown);

  struct dirq {
    char *rel; /* relative to top; "" = top */
    uint32_t depth;
  };
  size_t qlen = 1, qcap = 16, qhead = 0, count = 0;
  struct dirq *q = xcalloc(qcap, sizeof *q);
  q[0] = (struct dirq){xstrdup(""), 1};
  struct hutch_buf b, e;
  hutch_buf_init(&b);
  hutch_buf_init(&e);
  bool truncated = false;
  for (; qhead < qlen && !truncated; qhead++) {
    struct dirq *dq = &q[qhead];
    int dfd = dq->rel[0] ? fs_openat2(top, dq->rel, O_RDONLY | O_DIRECTORY | O_NOFOLLOW, 0, BENEATH)
                         : fcntl(top, F_DUPFD_CLOEXEC, 0);
    if (dfd < 0) continue;
    size_t n;
    bool more;
    char **names = read_names(dfd, FS_LIST_MAX_ENTRIES - count, &n, &more);
    if (!names) {
      close(dfd);
      if (qhead == 0) {
        int e2 = errno;
        hutch_buf_free(&b);
        hutch_buf_free(&e);
        free(q[0].rel);
        free(q);
        return hutch_err_sys(err, e2, "list " Q, shown);
      }
      continue;
    }
    if (more) truncated = true;
    qsort(names, n, sizeof *names, cmp_names);
    for (size_t i = 0; i < n; i++) {
      struct stat st;
      if (fstatat(dfd, names[i], &st, AT_SYMLINK_NOFOLLOW) < 0) continue; /* gone meanwhile */
      cleanup_free char *rel = dq->rel[0] ? xasprintf("%s/%s", dq->rel, names[i]) : xstrdup(names[i]);
      hutch_buf_reset(&e);
      put_entry(&e, rel, &st, dfd, names[i]);
      if (b.len + e.len > FS_LIST_MAX_BYTES) {
        truncated = true;
        break;
      }
      hutch_buf_append(&b, e.data, e.len);
      count++;
      if (S_ISDIR(st.st_mode) && dq->depth < depth) {
        if (qlen == qcap) {
          qcap *= 2;
          q = xrealloc(q, qcap * sizeof *q);
          dq = &q[qhead];
        }
        q[qlen++] = (struct dirq){steal_pointer(&rel), dq->depth + 1};
      }
    }
    free_names(names, n);
    close(dfd);
    /* Once the entry budget is spent, the remaining directories are still
     * opened: read_names() with no budget says whether they hold anything. */
  }
  for (size_t i = 0; i < qlen; i++) free(q[i].rel);
  free(q);
  hutch_tlv_put_u32(&b, HUTCH_TAG_FLAGS, truncated ? 1 : 0);
  send_result(id, &b);
  hutch_buf_free(&b);
  hutch_buf_free(&e);
  return 0;
}

/* ---- mkdir ------------------------------------------------------------ */

/* mkdir of `path` (already absolute): a directory that exists is fine when
 * exist_ok (a non-directory there is ENOTDIR when it is a parent). */
static int make_dir(const char *path, mode_t mode, bool exist_ok, const char *op, const char *shown, hutch_err *err) {
  cleanup_free char *buf = NULL;
  const char *last;
  cleanup_close int pfd = open_parent(path, op, shown, &buf, &last, err);
  if (pfd < 0) return -1;
  if (mkdirat(pfd, last, mode) == 0) return 0;
  int e = errno;
  if (e == EEXIST && exist_ok) {
    struct stat st;
    if (fstatat(pfd, last, &st, 0) == 0 && S_ISDIR(st.st_mode)) return 0;
    return fs_fail(err, EEXIST, "%s " Q ": `%.1024s` exists and is not a directory", op, shown, path);
  }
  return hutch_err_sys(err, e, "%s " Q, op, shown);
}

/* Create the missing directories above the last component of `eff` (0755),
 * each resolved from the root again, so ".." and symlinks on the way behave
 * as they do for the final open. */
static int make_parents(const char *eff, const char *op, const char *shown, hutch_err *err) {
  cleanup_free char *b = xstrdup(eff);
  size_t n = strlen(b);
  while (n > 1 && b[n - 1] == '/') b[--n] = 0;
  char *slash = strrchr(b, '/');
  if (!slash || slash == b) return 0;
  *slash = 0; /* b is the parent now */
  for (size_t i = 0;;) {
    while (b[i] == '/') i++;
    if (!b[i]) return 0;
    size_t j = i;
    while (b[j] && b[j] != '/') j++;
    char saved = b[j];
    b[j] = 0;
    if (strcmp(b + i, ".") && strcmp(b + i, "..") && make_dir(b, 0755, true, op, shown, err) < 0) return -1;
    b[j] = saved;
    i = j;
  }
}

static int fs_mkdir(uint32_t id, const unsigned char *p, size_t len, hutch_err *err) {
  cleanup_free char *shown = NULL, *eff = NULL;
  if (req_path(p, len, HUTCH_TAG_PATH, "mkdir", &shown, &eff, err) < 0) return -1;
  uint32_t mode = 0755, flags = 0;
  if (req_u32(p, len, HUTCH_TAG_MODE, "mkdir", &mode, err) < 0 ||
      req_u32(p, len, HUTCH_TAG_FLAGS, "mkdir", &flags, err) < 0)
    return -1;
  bool parents = flags & 1;
  if (parents && make_parents(eff, "mkdir", shown, err) < 0) return -1;
  /* init's umask is 0: the mode is the one asked for. */
  if (make_dir(eff, mode & 07777, parents, "mkdir", shown, err) < 0) return -1;
  send_result(id, NULL);
  return 0;
}

/* ---- remove ----------------------------------------------------------- */

/* Remove directory `name` in `pfd` and everything below it.  Never follows
 * a symlink (each level is opened with RESOLVE_NO_SYMLINKS, entries are
 * lstat'ed and unlinked as they are) and never crosses a mount point
 * (RESOLVE_NO_XDEV, which also catches bind mounts of the same filesystem):
 * that is EBUSY, and nothing under the mount is touched.  Names are read in
 * batches and the directory is reread after each, so only one fd per level
 * is held open. */
static int remove_tree(int pfd, const char *name, unsigned depth, const char *shown, hutch_err *err) {
  if (depth > FS_REMOVE_MAX_DEPTH)
    return fs_fail(err, ELOOP, "remove " Q ": more than %d nested directories", shown, FS_REMOVE_MAX_DEPTH);
  cleanup_close int fd = fs_openat2(pfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW, 0, BENEATH | RESOLVE_NO_XDEV);
  if (fd < 0) {
    if (errno == EXDEV)
      return fs_fail(err, EBUSY, "remove " Q ": `%.256s` is a mount point; not crossing it", shown, name);
    return hutch_err_sys(err, errno, "remove " Q ": open `%.256s`", shown, name);
  }
  for (;;) {
    size_t n;
    bool more;
    char **names = read_names(fd, FS_REMOVE_BATCH, &n, &more);
    if (!names) return hutch_err_sys(err, errno, "remove " Q ": read `%.256s`", shown, name);
    int ret = 0;
    for (size_t i = 0; i < n && ret == 0; i++) {
      struct stat st;
      if (fstatat(fd, names[i], &st, AT_SYMLINK_NOFOLLOW) < 0) {
        if (errno != ENOENT) ret = hutch_err_sys(err, errno, "remove " Q ": stat `%.256s`", shown, names[i]);
      } else if (S_ISDIR(st.st_mode)) {
        ret = remove_tree(fd, names[i], depth + 1, shown, err);
      } else if (unlinkat(fd, names[i], 0) < 0 && errno != ENOENT) {
        ret = hutch_err_sys(err, errno, "remove " Q ": unlink `%.256s`", shown, names[i]);
      }
    }
    free_names(names, n);
    if (ret < 0) return -1;
    if (n == 0) break;
  }
  if (unlinkat(pfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
    return hutch_err_sys(err, errno, "remove " Q ": rmdir `%.256s`", shown, name);
  return 0;
}

static int fs_remove(uint32_t id, const unsigned char *p, size_t len, hutch_err *err) {
  cleanup_free char *shown = NULL, *eff = NULL, *buf = NULL;
  if (req_path(p, len, HUTCH_TAG_PATH, "remove", &shown, &eff, err) < 0) return -1;
  uint32_t flags = 0;
  if (req_u32(p, len, HUTCH_TAG_FLAGS, "remove", &flags, err) < 0) return -1;
  const char *last;
  cleanup_close int pfd = open_parent(eff, "remove", shown, &buf, &last, err);
  if (pfd < 0) return -1;
  struct stat st;
  if (fstatat(pfd, last, &st, AT_SYMLINK_NOFOLLOW) < 0) return hutch_err_sys(err, errno, "remove " Q, shown);
  if (S_ISDIR(st.st_mode) && (flags & 1)) {
    if (remove_tree(pfd, last, 1, shown, err) < 0) return -1;
  } else if (unlinkat(pfd, last, S_ISDIR(st.st_mode) ? AT_REMOVEDIR : 0) < 0) {
    /* POSIX allows EEXIST for a non-empty directory; say it one way. */
    return hutch_err_sys(err, errno == EEXIST ? ENOTEMPTY : errno, "remove " Q, shown);
  }
  send_result(id, NULL);
  return 0;
}

/* ---- move ------------------------------------------------------------- */

static int fs_move(uint32_t id, const unsigned char *p, size_t len, hutch_err *err) {
  cleanup_free char *shown = NULL, *eff = NULL, *shown2 = NULL, *eff2 = NULL, *buf = NULL, *buf2 = NULL;
  if (req_path(p, len, HUTCH_TAG_PATH, "move", &shown, &eff, err) < 0 ||
      req_path(p, len, HUTCH_TAG_PATH2, "move", &shown2, &eff2, err) < 0)
    return -1;
  uint32_t flags = 0;
  if (req_u32(p, len, HUTCH_TAG_FLAGS, "move", &flags, err) < 0) return -1;
  const char *last, *last2;
  cleanup_close int pfd = open_parent(eff, "move", shown, &buf, &last, err);
  if (pfd < 0) return -1;
  cleanup_close int pfd2 = open_parent(eff2, "move", shown2, &buf2, &last2, err);
  if (pfd2 < 0) return -1;
  bool overwrite = flags & 1;
  int r = renameat2(pfd, last, pfd2, last2, overwrite ? 0 : RENAME_NOREPLACE);
  if (r < 0 && errno == EINVAL && !overwrite) {
    /* A filesystem without RENAME_NOREPLACE (or a real EINVAL, which the
     * plain rename below reports again): check, then rename.  Racy, but
     * only against the sandbox's own processes. */
    struct stat st;
    if (fstatat(pfd2, last2, &st, AT_SYMLINK_NOFOLLOW) == 0) errno = EEXIST;
    else r = renameat(pfd, last, pfd2, last2);
  }
  if (r < 0) return hutch_err_sys(err, errno, "move " Q " to " Q, shown, shown2);
  send_result(id, NULL);
  return 0;
}

/* ---- open, read, write, close ----------------------------------------- */

static struct fs_handle *find_handle(const unsigned char *p, size_t len, const char *op, hutch_err *err) {
  uint32_t h;
  int r = req_u32(p, len, HUTCH_TAG_HANDLE, op, &h, err);
  if (r < 0) return NULL;
  if (r == 0) {
    fs_fail(err, EINVAL, "%s: missing HANDLE", op);
    return NULL;
  }
  for (int i = 0; i < FS_MAX_HANDLES; i++)
    if (h && handles[i].id == h) return &handles[i];
  fs_fail(err, EBADF, "%s: no open handle %u", op, h);
  return NULL;
}

/* FLAGS: 1 read, 2 write (create or truncate; a new file gets MODE, default
 * 0644, exactly: init's umask is 0; an existing file keeps its mode unless
 * MODE is given), 4 create missing parents (0755).  Only regular files: a
 * directory is EISDIR, anything else EINVAL.  O_NONBLOCK and O_NOCTTY keep a
 * FIFO or a terminal from blocking init or becoming its controlling tty
 * before the type check refuses it.  The last component may be a symlink
 * (followed inside the root, like any open). */
static int fs_open(uint32_t id, const unsigned char *p, size_t len, hutch_err *err) {
  cleanup_free char *shown = NULL, *eff = NULL;
  if (req_path(p, len, HUTCH_TAG_PATH, "open", &shown, &eff, err) < 0) return -1;
  uint32_t flags = 0, mode = 0644;
  int has_mode;
  if (req_u32(p, len, HUTCH_TAG_FLAGS, "open", &flags, err) < 0 ||
      (has_mode = req_u32(p, len, HUTCH_TAG_MODE, "open", &mode, err)) < 0)
    return -1;
  mode &= 07777;
  bool rd = flags & HUTCH_FS_O_READ, wr = flags & HUTCH_FS_O_WRITE;
  if (!rd && !wr) return fs_fail(err, EINVAL, "open " Q ": FLAGS must ask for read, write or both", shown);
  struct fs_handle *slot = NULL;
  for (int i = 0; i < FS_MAX_HANDLES && !slot; i++)
    if (!handles[i].id) slot = &handles[i];
  if (!slot) return fs_fail(err, EMFILE, "open " Q ": %d handles are open already", shown, FS_MAX_HANDLES);
  if ((flags & HUTCH_FS_O_PARENTS) && make_parents(eff, "open", shown, err) < 0) return -1;

  uint64_t base = (rd && wr ? O_RDWR : wr ? O_WRONLY : O_RDONLY) | O_NOCTTY | O_NONBLOCK;
  int fd;
  bool created = false;
  if (!wr) {
    fd = fs_openat2(root_fd, eff, base, 0, IN_ROOT);
  } else {
    fd = fs_openat2(root_fd, eff, base | O_CREAT | O_EXCL, mode, IN_ROOT);
    created = fd >= 0;
    if (fd < 0 && errno == EEXIST) fd = fs_openat2(root_fd, eff, base | O_TRUNC, 0, IN_ROOT);
    /* Gone in between, or a dangling symlink (O_EXCL does not follow it). */
    if (fd < 0 && errno == ENOENT) fd = fs_openat2(root_fd, eff, base | O_CREAT | O_TRUNC, mode, IN_ROOT);
  }
  if (fd < 0) return hutch_err_sys(err, errno, "open " Q, shown);
  struct stat st;
  if (fstat(fd, &st) < 0) {
    int e = errno;
    close(fd);
    return hutch_err_sys(err, e, "open " Q, shown);
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    if (S_ISDIR(st.st_mode)) return hutch_err_sys(err, EISDIR, "open " Q, shown);
    return fs_fail(err, EINVAL, "open " Q ": not a regular file", shown);
  }
  if (wr && !created && has_mode == 1 && (st.st_mode & 07777) != mode) {
    if (fchmod(fd, mode) < 0 || fstat(fd, &st) < 0) {
      int e = errno;
      close(fd);
      return hutch_err_sys(err, e, "open " Q ": chmod", shown);
    }
  }
  slot->id = next_handle++;
  if (next_handle == 0) next_handle = 1;
  slot->fd = fd;
  slot->path = steal_pointer(&shown);
  struct hutch_buf b;
  hutch_buf_init(&b);
  hutch_tlv_put_u32(&b, HUTCH_TAG_HANDLE, slot->id);
  put_entry(&b, slot->path, &st, fd, "");
  send_result(id, &b);
  hutch_buf_free(&b);
  return 0;
}

/* Reads fill the chunk unless the file ends: a short FS_DATA is the last
 * one before the empty one. */
static int fs_read(uint32_t id, const unsigned char *p, size_t len, hutch_err *err) {
  static unsigned char *chunk;
  static size_t chunk_cap;
  struct fs_handle *h = find_handle(p, len, "read", err);
  if (!h) return -1;
  uint32_t want = 0;
  if (req_u32(p, len, HUTCH_TAG_LEN, "read", &want, err) < 0) return -1;
  if (want == 0 || want > FS_IO_MAX)
    return fs_fail(err, EINVAL, "read " Q ": LEN must be 1-%u", h->path, (unsigned)FS_IO_MAX);
  if (chunk_cap < want) {
    chunk = xrealloc(chunk, want);
    chunk_cap = want;
  }
  ssize_t n = read_full(h->fd, chunk, want);
  if (n < 0) return hutch_err_sys(err, errno, "read " Q, h->path);
  init_send(HUTCH_MSG_FS_DATA, id, chunk, (size_t)n);
  return 0;
}

static int fs_write(uint32_t id, const unsigned char *p, size_t len, hutch_err *err) {
  struct fs_handle *h = find_handle(p, len, "write", err);
  if (!h) return -1;
  const unsigned char *data;
  uint32_t dl;
  int r = hutch_tlv_find(p, len, HUTCH_TAG_DATA, &data, &dl);
  if (r != 1) return fs_fail(err, EINVAL, "write " Q ": missing DATA", h->path);
  if (write_full(h->fd, data, dl) < 0) return hutch_err_sys(err, errno, "write " Q, h->path);
  send_result(id, NULL);
  return 0;
}

static int fs_close(uint32_t id, const unsigned char *p, size_t len, hutch_err *err) {
  struct fs_handle *h = find_handle(p, len, "close", err);
  if (!h) return -1;
  int r = close(h->fd);
  int e = errno;
  cleanup_free char *path = h->path;
  *h = (struct fs_handle){.id = 0, .fd = -1, .path = NULL};
  /* The fd is gone either way (Linux closes it even when close fails);
   * the error is what a deferred write (NFS, quota) reports. */
  if (r < 0 && e != EINTR) return hutch_err_sys(err, e, "close " Q, path);
  send_result(id, NULL);
  return 0;
}

void fs_handle(uint16_t type, uint32_t id, const unsigned char *p, size_t len) {
  hutch_err err = HUTCH_ERR_INIT;
  int r;
  if (root_fd < 0) {
    init_send_error(id, EIO, "file operations: `/` could not be opened");
    return;
  }
  switch (type) {
    case HUTCH_MSG_FS_STAT: r = fs_stat(id, p, len, &err); break;
    case HUTCH_MSG_FS_LIST: r = fs_list(id, p, len, &err); break;
    case HUTCH_MSG_FS_MKDIR: r = fs_mkdir(id, p, len, &err); break;
    case HUTCH_MSG_FS_REMOVE: r = fs_remove(id, p, len, &err); break;
    case HUTCH_MSG_FS_MOVE: r = fs_move(id, p, len, &err); break;
    case HUTCH_MSG_FS_OPEN: r = fs_open(id, p, len, &err); break;
    case HUTCH_MSG_FS_READ: r = fs_read(id, p, len, &err); break;
    case HUTCH_MSG_FS_WRITE: r = fs_write(id, p, len, &err); break;
    case HUTCH_MSG_FS_CLOSE: r = fs_close(id, p, len, &err); break;
    default: return;
  }
  if (r < 0) init_send_error(id, err.errnum ? err.errnum : EIO, err.msg);
}
