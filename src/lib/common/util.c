#include "common/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <spawn.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void oom(size_t n) {
  fprintf(stderr, "hutch: out of memory allocating %zu bytes\n", n);
  abort();
}

void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) oom(n);
  return p;
}

void *xcalloc(size_t nmemb, size_t size) {
  void *p = calloc(nmemb ? nmemb : 1, size ? size : 1);
  if (!p) oom(nmemb * size);
  return p;
}

void *xrealloc(void *p, size_t n) {
  void *q = realloc(p, n ? n : 1);
  if (!q) oom(n);
  return q;
}

char *xstrdup(const char *s) {
  char *p = strdup(s ? s : "");
  if (!p) oom(strlen(s));
  return p;
}

char *xstrndup(const char *s, size_t n) {
  char *p = strndup(s, n);
  if (!p) oom(n);
  return p;
}

char *xasprintf(const char *fmt, ...) {
  va_list ap;
  char *p = NULL;
  va_start(ap, fmt);
  int r = vasprintf(&p, fmt, ap);
  va_end(ap);
  if (r < 0) oom(0);
  return p;
}

void hutch_freep(void *p) { free(*(void **)p); }

void hutch_closep(int *fd) {
  if (*fd >= 0) {
    int saved = errno;
    close(*fd);
    errno = saved;
  }
}

ssize_t read_full(int fd, void *buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, (char *)buf + got, n - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (r == 0) break;
    got += (size_t)r;
  }
  return (ssize_t)got;
}

int write_full(int fd, const void *buf, size_t n) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = write(fd, (const char *)buf + done, n - done);
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    done += (size_t)r;
  }
  return 0;
}

int write_file(const char *path, const void *data, size_t n, mode_t mode, hutch_err *err) {
  cleanup_close int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0) return hutch_err_sys(err, errno, "open `%s`", path);
  if (write_full(fd, data, n) < 0) return hutch_err_sys(err, errno, "write `%s`", path);
  return 0;
}

int write_file_str(const char *path, const char *s, hutch_err *err) {
  /* For /proc and /sys files: no O_CREAT/O_TRUNC, a single write. */
  cleanup_close int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return hutch_err_sys(err, errno, "open `%s`", path);
  size_t n = strlen(s);
  ssize_t r;
  do r = write(fd, s, n);
  while (r < 0 && errno == EINTR);
  if (r < 0) return hutch_err_sys(err, errno, "write `%s` to `%s`", s, path);
  if ((size_t)r != n) return hutch_err_sys(err, EIO, "short write to `%s`", path);
  return 0;
}

char *read_file(const char *path, size_t max, size_t *len_out, hutch_err *err) {
  cleanup_close int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    hutch_err_sys(err, errno, "open `%s`", path);
    return NULL;
  }
  size_t cap = max < 4096 ? max : 4096, len = 0;
  cleanup_free char *buf = xmalloc(cap + 1);
  for (;;) {
    if (len == cap) {
      if (cap >= max) {
        /* Exactly `max` bytes is allowed: fail only if one more byte exists. */
        char extra;
        ssize_t x;
        do x = read(fd, &extra, 1);
        while (x < 0 && errno == EINTR);
        if (x == 0) break;
        hutch_err_sys(err, x < 0 ? errno : EFBIG, "read `%s`: larger than %zu bytes", path, max);
        return NULL;
      }
      cap = cap * 2 > max ? max : cap * 2;
      buf = xrealloc(buf, cap + 1);
    }
    ssize_t r = read(fd, buf + len, cap - len);
    if (r < 0) {
      if (errno == EINTR) continue;
      hutch_err_sys(err, errno, "read `%s`", path);
      return NULL;
    }
    if (r == 0) break;
    len += (size_t)r;
  }
  buf[len] = 0;
  if (len_out) *len_out = len;
  return steal_pointer(&buf);
}

int mkdir_p(const char *path, mode_t mode, hutch_err *err) {
  cleanup_free char *p = xstrdup(path);
  for (char *s = p + 1; *s; s++) {
    if (*s != '/') continue;
    *s = 0;
    if (mkdir(p, mode) < 0 && errno != EEXIST) return hutch_err_sys(err, errno, "mkdir `%s`", p);
    *s = '/';
  }
  if (mkdir(p, mode) < 0 && errno != EEXIST) return hutch_err_sys(err, errno, "mkdir `%s`", p);
  return 0;
}

static int rm_rf_at(int dfd, const char *name, dev_t dev, hutch_err *err) {
  struct stat st;
  if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
    if (errno == ENOENT) return 0;
    return hutch_err_sys(err, errno, "stat `%s`", name);
  }
  if (!S_ISDIR(st.st_mode)) {
    if (unlinkat(dfd, name, 0) < 0 && errno != ENOENT)
      return hutch_err_sys(err, errno, "unlink `%s`", name);
    return 0;
  }
  if (st.st_dev != dev) return hutch_err_sys(err, EBUSY, "refusing to cross mount point at `%s`", name);
  int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return hutch_err_sys(err, errno, "open `%s`", name);
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return hutch_err_sys(err, errno, "fdopendir `%s`", name);
  }
  int ret = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    if (rm_rf_at(dirfd(d), de->d_name, dev, err) < 0) {
      hutch_err_wrap(err, "%s", name);
      ret = -1;
      break;
    }
  }
  closedir(d);
  if (ret == 0 && unlinkat(dfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
    return hutch_err_sys(err, errno, "rmdir `%s`", name);
  return ret;
}

int rm_rf(const char *path, hutch_err *err) {
  struct stat st;
  if (lstat(path, &st) < 0) {
    if (errno == ENOENT) return 0;
    return hutch_err_sys(err, errno, "stat `%s`", path);
  }
  return rm_rf_at(AT_FDCWD, path, st.st_dev, err);
}

static int copy_file(int sdir, int ddir, const char *name, const struct stat *st, hutch_err *err) {
  cleanup_close int in = openat(sdir, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (in < 0) return hutch_err_sys(err, errno, "open `%s`", name);
  cleanup_close int out =
      openat(ddir, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, st->st_mode & 07777);
  if (out < 0) return hutch_err_sys(err, errno, "create `%s`", name);
  off_t left = st->st_size;
  while (left > 0) {
    ssize_t r = copy_file_range(in, NULL, out, NULL, (size_t)left, 0);
    if (r < 0 && (errno == EXDEV || errno == ENOSYS || errno == EINVAL)) {
      char buf[65536];
      r = read(in, buf, sizeof buf);
      if (r > 0 && write_full(out, buf, (size_t)r) < 0) return hutch_err_sys(err, errno, "write `%s`", name);
    }
    if (r < 0) {
      if (errno == EINTR) continue;
      return hutch_err_sys(err, errno, "copy `%s`", name);
    }
    if (r == 0) break;
    left -= r;
  }
  if (fchown(out, st->st_uid, st->st_gid) < 0) return hutch_err_sys(err, errno, "chown `%s`", name);
  if (fchmod(out, st->st_mode & 07777) < 0) return hutch_err_sys(err, errno, "chmod `%s`", name);
  return 0;
}

static int copy_tree_at(int sdir, int ddir, hutch_err *err) {
  int fd = dup(sdir);
  if (fd < 0) return hutch_err_sys(err, errno, "dup");
  set_cloexec(fd);
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return hutch_err_sys(err, errno, "fdopendir");
  }
  rewinddir(d);
  int ret = 0;
  struct dirent *de;
  while (ret == 0 && (de = readdir(d))) {
    const char *n = de->d_name;
    if (!strcmp(n, ".") || !strcmp(n, "..")) continue;
    struct stat st;
    if (fstatat(sdir, n, &st, AT_SYMLINK_NOFOLLOW) < 0) {
      ret = hutch_err_sys(err, errno, "stat `%s`", n);
    } else if (S_ISDIR(st.st_mode)) {
      if (mkdirat(ddir, n, 0700) < 0 && errno != EEXIST) {
        ret = hutch_err_sys(err, errno, "mkdir `%s`", n);
        break;
      }
      cleanup_close int s2 = openat(sdir, n, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      cleanup_close int d2 = openat(ddir, n, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (s2 < 0 || d2 < 0) ret = hutch_err_sys(err, errno, "open `%s`", n);
      else if (copy_tree_at(s2, d2, err) < 0) ret = hutch_err_wrap(err, "%s", n);
      else if (fchown(d2, st.st_uid, st.st_gid) < 0) ret = hutch_err_sys(err, errno, "chown `%s`", n);
      else if (fchmod(d2, st.st_mode & 07777) < 0) ret = hutch_err_sys(err, errno, "chmod `%s`", n);
    } else if (S_ISLNK(st.st_mode)) {
      char target[4096];
      ssize_t l = readlinkat(sdir, n, target, sizeof target - 1);
      if (l < 0) {
        ret = hutch_err_sys(err, errno, "readlink `%s`", n);
      } else {
        target[l] = 0;
        if (symlinkat(target, ddir, n) < 0) ret = hutch_err_sys(err, errno, "symlink `%s`", n);
        else if (fchownat(ddir, n, st.st_uid, st.st_gid, AT_SYMLINK_NOFOLLOW) < 0)
          ret = hutch_err_sys(err, errno, "chown `%s`", n);
      }
    } else if (S_ISREG(st.st_mode)) {
      ret = copy_file(sdir, ddir, n, &st, err);
    }
  }
  closedir(d);
  return ret;
}

int copy_tree(const char *src, const char *dst, hutch_err *err) {
  cleanup_close int s = open(src, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (s < 0) return hutch_err_sys(err, errno, "open `%s`", src);
  if (mkdir(dst, 0755) < 0 && errno != EEXIST) return hutch_err_sys(err, errno, "mkdir `%s`", dst);
  cleanup_close int d = open(dst, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (d < 0) return hutch_err_sys(err, errno, "open `%s`", dst);
  if (copy_tree_at(s, d, err) < 0) return hutch_err_wrap(err, "copy `%s` to `%s`", src, dst);
  return 0;
}

uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint64_t mono_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

void iso8601(uint64_t ms, char out[32]) {
  time_t t = (time_t)(ms / 1000);
  struct tm tm;
  gmtime_r(&t, &tm);
  size_t n = strftime(out, 32, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(out + n, 32 - n, ".%03uZ", (unsigned)(ms % 1000));
}

int hutch_random_bytes(void *buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = getrandom((char *)buf + got, n - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    got += (size_t)r;
  }
  return 0;
}

void hutch_random_id(const char *prefix, char *out, size_t outlen) {
  static const char alphabet[] = "abcdefghijklmnopqrstuvwxyz234567";
  unsigned char raw[20];
  if (hutch_random_bytes(raw, sizeof raw) < 0) abort();
  char body[21];
  for (size_t i = 0; i < 20; i++) body[i] = alphabet[raw[i] & 31];
  body[20] = 0;
  snprintf(out, outlen, "%s_%s", prefix, body);
}

void hex_encode(const unsigned char *in, size_t n, char *out) {
  static const char h[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = h[in[i] >> 4];
    out[2 * i + 1] = h[in[i] & 15];
  }
  out[2 * n] = 0;
}

int set_cloexec(int fd) {
  int fl = fcntl(fd, F_GETFD);
  if (fl < 0) return -1;
  return fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
}

int set_nonblock(int fd, bool on) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0) return -1;
  return fcntl(fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
}

int parse_u64(const char *s, uint64_t max, uint64_t *out) {
  if (!s || !*s) return -1;
  uint64_t v = 0;
  for (const char *p = s; *p; p++) {
    if (*p < '0' || *p > '9') return -1;
    unsigned d = (unsigned)(*p - '0');
    if (d > max || v > (max - d) / 10) return -1;
    v = v * 10 + d;
  }
  *out = v;
  return 0;
}

/* ---- subprocesses ----------------------------------------------------------- */

/* The program's path, searched like execvp (before the clone: the child
 * must not allocate). */
static char *find_program(const char *name) {
  if (strchr(name, '/')) return xstrdup(name);
  const char *path = getenv("PATH");
  if (!path || !*path) path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
  for (const char *p = path; *p;) {
    size_t n = strcspn(p, ":");
    char *cand = xasprintf("%.*s/%s", (int)n, p, name);
    if (access(cand, X_OK) == 0) return cand;
    free(cand);
    p += n;
    if (*p) p++;
  }
  return NULL;
}

/* hutchd ignores SIGCHLD so that the kernel reaps its shims, which also
 * reaps these children before anyone can wait for them.  So a small middle
 * process (cloned raw: no atfork handlers, no allocation) starts the program,
 * waits for it, and writes its wait status to a pipe; the kernel reaps the
 * middle process. */
int hutch_spawn(const char *const argv[], int in_fd, int out_fd, struct hutch_child *child, hutch_err *err) {
  cleanup_free char *prog = find_program(argv[0]);
  if (!prog) return hutch_err_sys(err, ENOENT, "run `%s`: not found in PATH", argv[0]);
  int pipefd[2], statfd[2];
  if (pipe2(pipefd, O_CLOEXEC) < 0) return hutch_err_sys(err, errno, "pipe for `%s`", argv[0]);
  if (pipe2(statfd, O_CLOEXEC) < 0) {
    int e = errno;
    close(pipefd[0]);
    close(pipefd[1]);
    return hutch_err_sys(err, e, "pipe for `%s`", argv[0]);
  }
  int null_fd = in_fd >= 0 ? -1 : open("/dev/null", O_RDONLY | O_CLOEXEC);
  extern char **environ;
  pid_t c = (pid_t)syscall(SYS_clone, SIGCHLD, NULL, NULL, NULL, NULL);
  if (c < 0) {
    int e = errno;
    close(pipefd[0]);
    close(pipefd[1]);
    close(statfd[0]);
    close(statfd[1]);
    if (null_fd >= 0) close(null_fd);
    return hutch_err_sys(err, e, "clone for `%s`", argv[0]);
  }
  if (c == 0) {
    /* Async-signal-safe calls only from here on. */
    sigset_t none;
    sigemptyset(&none);
    for (int sig = 1; sig < 65; sig++) signal(sig, SIG_DFL);
    sigprocmask(SIG_SETMASK, &none, NULL);
    pid_t g = (pid_t)syscall(SYS_clone, SIGCHLD, NULL, NULL, NULL, NULL);
    if (g == 0) {
      int in = in_fd >= 0 ? in_fd : null_fd, out = out_fd >= 0 ? out_fd : pipefd[1];
      if (dup2(in, 0) < 0 || dup2(out, 1) < 0 || dup2(pipefd[1], 2) < 0) _exit(127);
      execve(prog, (char *const *)argv, environ);
      _exit(127);
    }
    int st = 127 << 8;
    /* The middle process keeps no end of the program's pipes open. */
    close(pipefd[0]);
    close(pipefd[1]);
    if (in_fd >= 0) close(in_fd);
    if (out_fd >= 0) close(out_fd);
    if (g > 0)
      while (waitpid(g, &st, 0) < 0 && errno == EINTR) {
      }
    (void)!write(statfd[1], &st, sizeof st);
    _exit(0);
  }
  close(pipefd[1]);
  close(statfd[1]);
  if (null_fd >= 0) close(null_fd);
  child->pid = c;
  child->output_fd = pipefd[0];
  child->status_fd = statfd[0];
  return 0;
}

int hutch_spawn_wait(const char *name, struct hutch_child *child, hutch_run_line_fn on_line, void *arg,
                     hutch_err *err) {
  int fd = child->output_fd;
  /* Keep the last line-ful of output for the error message; hand complete
   * lines to on_line as they come. */
  char tail[1024] = "", line[1024];
  size_t tl = 0, ll = 0;
  char buf[4096];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (ssize_t i = 0; i < n; i++) {
      char c = buf[i];
      if (c == '\n' || c == '\r' || ll == sizeof line - 1) {
        line[ll] = 0;
        if (ll) {
          if (on_line) on_line(arg, line);
          snprintf(tail, sizeof tail, "%s", line);
          tl = ll;
        }
        ll = 0;
        if (c == '\n' || c == '\r') continue;
      }
      line[ll++] = c;
    }
  }
  if (ll) {
    line[ll] = 0;
    if (on_line) on_line(arg, line);
    snprintf(tail, sizeof tail, "%s", line);
    tl = ll;
  }
  close(fd);
  int status = -1;
  ssize_t n;
  do n = read(child->status_fd, &status, sizeof status);
  while (n < 0 && errno == EINTR);
  close(child->status_fd);
  child->output_fd = child->status_fd = -1;
  if (n != (ssize_t)sizeof status) return hutch_err_sys(err, ECHILD, "`%s`: no exit status", name);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
  if (WIFSIGNALED(status))
    return hutch_err_sys(err, 0, "`%s` killed by signal %d%s%s", name, WTERMSIG(status), tl ? ": " : "", tail);
  return hutch_err_sys(err, 0, "`%s` exited with status %d%s%s", name, WEXITSTATUS(status), tl ? ": " : "", tail);
}

int hutch_run(const char *const argv[], int in_fd, int out_fd, hutch_run_line_fn on_line, void *arg,
              hutch_err *err) {
  struct hutch_child c;
  if (hutch_spawn(argv, in_fd, out_fd, &c, err) < 0) return -1;
  return hutch_spawn_wait(argv[0], &c, on_line, arg, err);
}
