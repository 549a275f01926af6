/* hutch cp: files and directories into and out of a sandbox (docs/api.md
 * "Files").  Everything streams: a file goes through GET/PUT .../files with
 * curl reading or writing the local file descriptor; a directory goes
 * through GET/PUT .../files/tar with a local `tar` process on the other end
 * of a pipe.  Memory stays flat whatever the size.
 *
 * Where a copy lands (as with docker cp): into DST/BASENAME(SRC) when DST is
 * an existing directory (or ends with '/'), else at DST; SRC ending in "/."
 * copies a directory's contents.  A downloaded file is written to a
 * temporary file next to its destination and renamed into place. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "args.h"
#include "cli.h"
#include "common/util.h"
#include "wire.h"

static const char cp_usage[] =
    "usage: hutch cp LOCAL ID:PATH\n"
    "       hutch cp ID:PATH LOCAL\n";
static const char cp_help[] =
    "usage: hutch cp LOCAL ID:PATH     copy into a sandbox\n"
    "       hutch cp ID:PATH LOCAL     copy out of a sandbox\n"
    "Copy a file or a directory (recursively).  Like docker cp: when the\n"
    "destination is an existing directory or ends with '/', the copy goes\n"
    "inside it under the source's name; a source ending in /. copies a\n"
    "directory's contents.  LOCAL may be - for stdin or stdout (a file's bytes;\n"
    "for a directory, a tar stream on stdout).  Missing parent directories are\n"
    "created in the sandbox.  Paths in the sandbox are relative to /root.\n"
    "A word is ID:PATH when it has a ':' with no '/' before it; write ./a:b for a\n"
    "local file named a:b.\n";

/* ---- requests ------------------------------------------------------------ */

struct cp_ctx {
  hutch_cli *cli;
  const char *id;
};

/* "/v1/sandboxes/ID/files<suffix>?path=P" + extra query */
static char *files_path(const struct cp_ctx *c, const char *suffix, const char *path,
                        const char *extra) {
  cleanup_free char *sb = hutch_id_path("/v1/sandboxes/", c->id, suffix);
  cleanup_free char *p = hutch_url_escape(path, "/");
  return xasprintf("%s?path=%s%s", sb, p, extra ? extra : "");
}

/* A transfer with the usual error reporting: "ID:PATH: message".  Returns 0
 * on a 2xx reply, else -1, printed unless `quiet_type` and the status is
 * 400 or 409 (a directory where a file was expected: the caller tries tar). */
static int cp_transfer(const struct cp_ctx *c, hutch_xfer *x, const char *path, long *status,
                       bool quiet_type) {
  hutch_response r;
  hutch_err err = HUTCH_ERR_INIT;
  if (status) *status = 0;
  if (hutch_transfer(&c->cli->client, x, &r, &err) < 0) {
    if (strcmp(err.code, "interrupted") == 0 || hutch_stop_signal)
      hutch_errorf("interrupted");
    else
      hutch_errorf("%s:%s: %s", c->id, path, err.msg);
    return -1;
  }
  if (status) *status = r.status;
  int rc = 0;
  if (hutch_response_check(&r, &err) < 0) {
    if (!quiet_type || (r.status != 400 && r.status != 409))
      hutch_errorf("%s:%s: %s", c->id, path, err.msg);
    rc = -1;
  }
  hutch_response_free(&r);
  return rc;
}

/* GET .../files/stat.  Returns the object (caller decrefs), or NULL:
 * with *status 404 quietly (missing_msg, when given, gets hutchd's
 * message: no such file, or no such sandbox), else printed. */
static json_t *remote_stat(const struct cp_ctx *c, const char *path, long *status,
                           char **missing_msg) {
  cleanup_free char *url = files_path(c, "/files/stat", path, NULL);
  hutch_response r;
  hutch_err err = HUTCH_ERR_INIT;
  *status = 0;
  if (hutch_request(&c->cli->client, "GET", url, NULL, &r, &err) < 0) {
    hutch_errorf("%s:%s: %s", c->id, path, err.msg);
    return NULL;
  }
  *status = r.status;
  json_t *st = NULL;
  if (r.status == 404) {
    hutch_response_check(&r, &err);
    if (missing_msg) *missing_msg = xstrdup(err.msg);
  } else if (hutch_response_check(&r, &err) < 0) {
    hutch_errorf("%s:%s: %s", c->id, path, err.msg);
  } else if (!json_is_object(r.json)) {
    hutch_errorf("%s:%s: hutchd's stat reply is not a JSON object", c->id, path);
  } else {
    st = json_incref(r.json);
  }
  hutch_response_free(&r);
  return st;
}

static bool stat_is(json_t *st, const char *type) {
  const char *t = json_string_value(json_object_get(st, "type"));
  return t && strcmp(t, type) == 0;
}

/* ---- local tar --------------------------------------------------------------- */

/* Starts tar with its stdin (to_child) or stdout (from_child) on a pipe;
 * *fd is our end.  Returns the pid or -1 (printed). */
static pid_t spawn_tar(char *const argv[], bool to_child, int *fd) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) < 0) {
    hutch_errorf("pipe: %s", strerror(errno));
    return -1;
  }
  pid_t pid = fork();
  if (pid < 0) {
    hutch_errorf("fork: %s", strerror(errno));
    close(p[0]);
    close(p[1]);
    return -1;
  }
  if (pid == 0) {
    signal(SIGPIPE, SIG_DFL);
    if (dup2(to_child ? p[0] : p[1], to_child ? STDIN_FILENO : STDOUT_FILENO) < 0) _exit(127);
    execvp("tar", argv);
    dprintf(STDERR_FILENO, "hutch: cannot run tar: %s\n", strerror(errno));
    _exit(127);
  }
  close(to_child ? p[0] : p[1]);
  *fd = to_child ? p[1] : p[0];
  return pid;
}

/* Waits for tar; 0 when it exited 0, else -1 (printed unless `quiet`). */
static int wait_tar(pid_t pid, bool quiet) {
  int ws;
  while (waitpid(pid, &ws, 0) < 0)
    if (errno != EINTR) {
      hutch_errorf("waitpid: %s", strerror(errno));
      return -1;
    }
  if (WIFEXITED(ws) && WEXITSTATUS(ws) == 0) return 0;
  if (!quiet) {
    if (WIFEXITED(ws))
      hutch_errorf("tar failed (exit status %d)", WEXITSTATUS(ws));
    else
      hutch_errorf("tar killed by signal %d", WTERMSIG(ws));
  }
  return -1;
}

/* ---- into the sandbox -------------------------------------------------------- */

/* PUT .../files from fd (size -1: until EOF, chunked). mode < 0: none. */
static int put_file(const struct cp_ctx *c, const char *path, int fd, const char *what,
                    long long size, int mode) {
  char extra[48] = "&parents=true";
  if (mode >= 0) snprintf(extra, sizeof extra, "&parents=true&mode=%04o", (unsigned)mode);
  cleanup_free char *url = files_path(c, "/files", path, extra);
  hutch_fd_io io = {.fd = fd, .what = what, .left = size};
  hutch_xfer x = {.method = "PUT",
                  .path = url,
                  .source = hutch_fd_source,
                  .source_ctx = &io,
                  .source_size = size};
  return cp_transfer(c, &x, path, NULL, false);
}

/* PUT .../files/tar with `tar -C dir -cf - .` streaming into it. */
static int put_dir(const struct cp_ctx *c, const char *path, const char *dir) {
  char *argv[] = {"tar",     "-C",          (char *)dir, "-cf", "-", "--owner=0",
                  "--group=0", "--numeric-owner", ".",   NULL};
  int fd = -1;
  pid_t pid = spawn_tar(argv, false, &fd);
  if (pid < 0) return -1;
  cleanup_free char *url = files_path(c, "/files/tar", path, NULL);
  hutch_fd_io io = {.fd = fd, .what = "tar's output", .left = -1};
  hutch_xfer x = {.method = "PUT",
                  .path = url,
                  .source = hutch_fd_source,
                  .source_ctx = &io,
                  .source_size = -1,
                  .content_type = "application/x-tar"};
  int rc = cp_transfer(c, &x, path, NULL, false);
  close(fd); /* a tar still writing gets EPIPE */
  if (wait_tar(pid, rc < 0) < 0) rc = -1;
  return rc;
}

/* The last component of a local source, or NULL when the source means
 * "its contents" (dir/., ., .., /). */
static char *source_name(const char *path) {
  if (hutch_path_is_contents(path)) return NULL;
  char *b = hutch_path_base(path);
  if (!*b || strcmp(b, ".") == 0 || strcmp(b, "..") == 0) {
    free(b);
    return NULL;
  }
  return b;
}

static int cp_upload(const struct cp_ctx *c, const hutch_cp_args *a) {
  if (strcmp(a->local, "-") == 0) return put_file(c, a->remote, STDIN_FILENO, "stdin", -1, -1);
  struct stat st;
  if (stat(a->local, &st) < 0) {
    hutch_errorf("%s: %s", a->local, strerror(errno));
    return -1;
  }
  bool dir = S_ISDIR(st.st_mode);
  cleanup_free char *name = source_name(a->local);
  if (!name && !dir) name = hutch_path_base(a->local);

  /* Into an existing directory (or DST/), under the source's name. */
  cleanup_free char *target = NULL;
  size_t rl = strlen(a->remote);
  bool into = rl > 0 && a->remote[rl - 1] == '/';
  if (!into && name) {
    long status;
    json_t *rst = remote_stat(c, a->remote, &status, NULL);
    if (!rst && status != 404) return -1;
    into = rst && stat_is(rst, "dir");
    json_decref(rst);
  }
  target = into && name ? hutch_path_join(a->remote, name) : xstrdup(a->remote);

  if (dir) return put_dir(c, target, a->local);
  int fd = open(a->local, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    hutch_errorf("%s: %s", a->local, strerror(errno));
    return -1;
  }
  int rc = put_file(c, target, fd, a->local, S_ISREG(st.st_mode) ? (long long)st.st_size : -1,
                    (int)(st.st_mode & 07777));
  close(fd);
  return rc;
}

/* ---- out of the sandbox ------------------------------------------------------- */

/* GET .../files into fd.  *status: the HTTP status of a failed reply. */
static int get_file_fd(const struct cp_ctx *c, const char *path, int fd, const char *what,
                       long *status, bool quiet_type) {
  cleanup_free char *url = files_path(c, "/files", path, NULL);
  hutch_fd_io io = {.fd = fd, .what = what, .left = -1};
  hutch_xfer x = {
      .method = "GET", .path = url, .sink = hutch_fd_sink, .sink_ctx = &io, .accept = "*/*"};
  return cp_transfer(c, &x, path, status, quiet_type);
}

/* GET .../files into a temporary file next to `dest`, renamed into place.
 * mode: the remote file's permission bits, or -1. */
static int get_file(const struct cp_ctx *c, const char *path, const char *dest, int mode,
                    long *status, bool quiet_type) {
  cleanup_free char *tmp = hutch_temp_beside(dest);
  int fd = mkostemp(tmp, O_CLOEXEC);
  if (fd < 0) {
    hutch_errorf("%s: %s", dest, strerror(errno));
    return -1;
  }
  int rc = get_file_fd(c, path, fd, dest, status, quiet_type);
  if (rc == 0 && mode >= 0) {
    mode_t um = umask(0);
    umask(um);
    if (fchmod(fd, (mode_t)mode & 0777 & ~um) < 0) {
      hutch_errorf("%s: chmod: %s", dest, strerror(errno));
      rc = -1;
    }
  }
  if (close(fd) < 0 && rc == 0) {
    hutch_errorf("%s: %s", dest, strerror(errno));
    rc = -1;
  }
  if (rc == 0 && rename(tmp, dest) < 0) {
    hutch_errorf("%s: %s", dest, strerror(errno));
    rc = -1;
  }
  if (rc < 0) unlink(tmp);
  return rc;
}

/* GET .../files/tar into `tar -C dir -xf -` (dir NULL: the tar stream to
 * stdout). */
static int get_dir(const struct cp_ctx *c, const char *path, const char *dir) {
  cleanup_free char *url = files_path(c, "/files/tar", path, NULL);
  hutch_fd_io io = {.fd = STDOUT_FILENO, .what = "stdout", .left = -1};
  hutch_xfer x = {
      .method = "GET", .path = url, .sink = hutch_fd_sink, .sink_ctx = &io, .accept = "*/*"};
  if (!dir) return cp_transfer(c, &x, path, NULL, false);
  /* Files belong to whoever runs hutch, not to the uids inside. */
  char *argv[] = {"tar", "-C", (char *)dir, "-xf", "-", "--no-same-owner", NULL};
  pid_t pid = spawn_tar(argv, true, &io.fd);
  if (pid < 0) return -1;
  io.what = "tar";
  int rc = cp_transfer(c, &x, path, NULL, false);
  close(io.fd); /* EOF for tar */
  if (wait_tar(pid, false) < 0) rc = -1;
  return rc;
}

static int cp_download_dir(const struct cp_ctx *c, const hutch_cp_args *a) {
  if (strcmp(a->local, "-") == 0) return get_dir(c, a->remote, NULL);
  cleanup_free char *name = source_name(a->remote);
  cleanup_free char *dest = NULL;
  struct stat st;
  if (stat(a->local, &st) == 0) {
    if (!S_ISDIR(st.st_mode)) {
      hutch_errorf("%s: exists and is not a directory", a->local);
      return -1;
    }
    dest = name ? hutch_path_join(a->local, name) : xstrdup(a->local);
  } else if (errno == ENOENT) {
    dest = xstrdup(a->local);
  } else {
    hutch_errorf("%s: %s", a->local, strerror(errno));
    return -1;
  }
  if (mkdir(dest, 0777) < 0 && errno != EEXIST) {
    hutch_errorf("%s: %s", dest, strerror(errno));
    return -1;
  }
  if (stat(dest, &st) < 0 || !S_ISDIR(st.st_mode)) {
    hutch_errorf("%s: exists and is not a directory", dest);
    return -1;
  }
  return get_dir(c, a->remote, dest);
}

static int cp_download(const struct cp_ctx *c, const hutch_cp_args *a) {
  long status;
  cleanup_free char *missing = NULL;
  json_t *rst = remote_stat(c, a->remote, &status, &missing);
  if (!rst) {
    if (status == 404) hutch_errorf("%s:%s: %s", c->id, a->remote, missing);
    return -1;
  }
  bool dir = stat_is(rst, "dir"), link = stat_is(rst, "symlink");
  int mode = -1;
  const char *ms = json_string_value(json_object_get(rst, "mode"));
  if (ms) {
    char *end;
    long m = strtol(ms, &end, 8);
    if (*ms && !*end && m >= 0 && m <= 07777) mode = (int)m;
  }
  json_decref(rst);
  if (dir) return cp_download_dir(c, a);
  if (link) mode = -1; /* the link's own mode says nothing about its target */

  if (strcmp(a->local, "-") == 0) {
    int rc = get_file_fd(c, a->remote, STDOUT_FILENO, "stdout", &status, link);
    if (rc < 0 && link && (status == 400 || status == 409)) return cp_download_dir(c, a);
    return rc;
  }
  cleanup_free char *dest = NULL;
  struct stat st;
  size_t ll = strlen(a->local);
  if (stat(a->local, &st) == 0 && S_ISDIR(st.st_mode)) {
    cleanup_free char *name = hutch_path_base(a->remote);
    dest = hutch_path_join(a->local, name);
  } else if (ll > 0 && a->local[ll - 1] == '/') {
    hutch_errorf("%s: no such directory", a->local);
    return -1;
  } else {
    dest = xstrdup(a->local);
  }
  int rc = get_file(c, a->remote, dest, mode, &status, link);
  /* A symlink to a directory: the file endpoint refuses it. */
  if (rc < 0 && link && (status == 400 || status == 409)) return cp_download_dir(c, a);
  return rc;
}

int hutch_cmd_cp(hutch_cli *cli, int argc, char **argv) {
  hutch_err err = HUTCH_ERR_INIT;
  hutch_cp_args a;
  int rc = HUTCH_EXIT_FAIL;
  if (hutch_parse_cp_args(argc, argv, &a, &err) < 0) {
    rc = hutch_usage_fail(cp_usage, &err);
  } else if (a.help) {
    rc = hutch_print_help(cp_help);
  } else {
    hutch_catch_stop_signals();
    cli->client.abort_flag = &hutch_stop_signal;
    struct cp_ctx c = {.cli = cli, .id = a.id};
    rc = (a.upload ? cp_upload(&c, &a) : cp_download(&c, &a)) < 0 ? HUTCH_EXIT_FAIL
                                                                   : HUTCH_EXIT_OK;
    cli->client.abort_flag = NULL;
    if (hutch_stop_signal) rc = 128 + hutch_stop_signal;
  }
  hutch_cp_args_free(&a);
  return rc;
}
