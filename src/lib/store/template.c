#include "store/template.h"

#include <jansson.h>
#include <linux/openat2.h>
#include <sys/syscall.h>

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"
#include "common/log.h"
#include "isolate/userns.h"
#include "store/pool.h"

#define HOST_TEMPLATE_VERSION "host-2\n" /* 2: files hold storage ids */

static const char passwd[] =
    "root:x:0:0:root:/root:/bin/bash\n"
    "daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n"
    "bin:x:2:2:bin:/bin:/usr/sbin/nologin\n"
    "sys:x:3:3:sys:/dev:/usr/sbin/nologin\n"
    "user:x:1000:1000:sandbox user:/home/user:/bin/bash\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";

static const char group[] =
    "root:x:0:\n"
    "daemon:x:1:\n"
    "bin:x:2:\n"
    "sys:x:3:\n"
    "tty:x:5:\n"
    "users:x:100:user\n"
    "user:x:1000:\n"
    "nogroup:x:65534:\n";

static const char nsswitch[] =
    "passwd: files\n"
    "group: files\n"
    "shadow: files\n"
    "hosts: files dns\n"
    "networks: files\n"
    "protocols: files\n"
    "services: files\n";

/* Harmless host files a userland expects.  Nothing secret may be added here:
 * no shadow/gshadow, ssh, sudoers, ssl/private, machine-id, credentials. */
static const char *const host_etc_allow[] = {
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "ssl/certs/ca-certificates.crt",
    "ssl/openssl.cnf", "profile", "bash.bashrc", "shells", "debian_version", "protocols", "services",
    "mime.types", "inputrc", "environment", "profile.d", "python3", "python3.11", "localtime", "timezone",
    "papersize", "ethertypes", "magic", "magic.mime", "host.conf", "issue", "login.defs",
};

static int put(const char *root, const char *rel, const char *content, mode_t mode, hutch_err *err) {
  cleanup_free char *p = xasprintf("%s/%s", root, rel);
  return write_file(p, content, strlen(content), mode, err);
}

static int copy_host_entry(const char *root, const char *rel, hutch_err *err) {
  cleanup_free char *src = xasprintf("/etc/%s", rel);
  cleanup_free char *dst = xasprintf("%s/etc/%s", root, rel);
  struct stat st;
  if (lstat(src, &st) < 0) return 0; /* absent on this host: fine */
  cleanup_free char *dir = xstrdup(dst);
  *strrchr(dir, '/') = 0;
  if (mkdir_p(dir, 0755, err) < 0) return -1;
  if (S_ISLNK(st.st_mode)) {
    char target[4096];
    ssize_t n = readlink(src, target, sizeof target - 1);
    if (n < 0) return hutch_err_sys(err, errno, "readlink `%s`", src);
    target[n] = 0;
    if (symlink(target, dst) < 0) return hutch_err_sys(err, errno, "symlink `%s`", dst);
    return 0;
  }
  if (S_ISDIR(st.st_mode)) return copy_tree(src, dst, err);
  if (!S_ISREG(st.st_mode) || st.st_size > (16 << 20)) return 0;
  size_t len;
  cleanup_free char *data = read_file(src, 16 << 20, &len, err);
  if (!data) return -1;
  return write_file(dst, data, len, st.st_mode & 0755, err);
}

/* Move every entry of a tree from container ids to storage ids (see
 * isolate/userns.h), without following symlinks. */
static int shift_entry(const char *path, const struct stat *st, int flag, struct FTW *f) {
  (void)flag;
  (void)f;
  if (st->st_uid >= 65536 || st->st_gid >= 65536) return 0; /* already shifted */
  return lchown(path, HUTCH_STORAGE_UID_BASE + st->st_uid, HUTCH_STORAGE_UID_BASE + st->st_gid) < 0 ? -1 : 0;
}

static int shift_tree(const char *root, hutch_err *err) {
  if (nftw(root, shift_entry, 64, FTW_PHYS) != 0) return hutch_err_sys(err, errno, "shift ownership of `%s`", root);
  return 0;
}

static int build_host(const char *root, hutch_err *err) {
  static const struct {
    const char *path;
    mode_t mode;
  } dirs[] = {
      {"", 0755},        {"etc", 0755},      {"usr", 0755},     {"root", 0700},   {"home", 0755},
      {"home/user", 0750}, {"tmp", 01777},   {"var", 0755},     {"var/tmp", 01777}, {"var/lib", 0755},
      {"var/log", 0755}, {"var/cache", 0755}, {"run", 0755},    {"proc", 0555},   {"dev", 0755},
      {"mnt", 0755},     {"opt", 0755},      {"srv", 0755},     {"etc/ssl", 0755}, {"etc/ssl/certs", 0755},
  };
  for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) {
    cleanup_free char *p = xasprintf("%s/%s", root, dirs[i].path);
    if (mkdir(p, dirs[i].mode) < 0 && errno != EEXIST) return hutch_err_sys(err, errno, "mkdir `%s`", p);
    if (chmod(p, dirs[i].mode) < 0) return hutch_err_sys(err, errno, "chmod `%s`", p);
  }
  cleanup_free char *home = xasprintf("%s/home/user", root);
  if (chown(home, 1000, 1000) < 0) return hutch_err_sys(err, errno, "chown `%s`", home);
  /* Debian is merged-/usr: the top-level directories are links into /usr. */
  static const char *const links[][2] = {
      {"usr/bin", "bin"}, {"usr/sbin", "sbin"}, {"usr/lib", "lib"}, {"usr/lib64", "lib64"}, {"usr/lib32", "lib32"}};
  for (size_t i = 0; i < sizeof links / sizeof *links; i++) {
    cleanup_free char *hostdir = xasprintf("/%s", links[i][0]);
    if (access(hostdir, F_OK) < 0) continue;
    cleanup_free char *p = xasprintf("%s/%s", root, links[i][1]);
    if (symlink(links[i][0], p) < 0) return hutch_err_sys(err, errno, "symlink `%s`", p);
  }
  if (put(root, "etc/passwd", passwd, 0644, err) < 0 || put(root, "etc/group", group, 0644, err) < 0 ||
      put(root, "etc/nsswitch.conf", nsswitch, 0644, err) < 0 ||
      /* Loopback only for now: no resolver is reachable; the network gateway
       * issue gives sandboxes a DNS server. */
      put(root, "etc/resolv.conf", "# hutch: no network egress configured\n", 0644, err) < 0 ||
      put(root, "etc/hostname", "sandbox\n", 0644, err) < 0 ||
      put(root, "etc/hosts", "127.0.0.1 localhost\n::1 localhost\n", 0644, err) < 0)
    return -1;
  for (size_t i = 0; i < sizeof host_etc_allow / sizeof *host_etc_allow; i++)
    if (copy_host_entry(root, host_etc_allow[i], err) < 0) return hutch_err_wrap(err, "copy /etc/%s", host_etc_allow[i]);
  cleanup_free char *osr = xasprintf("%s/etc/os-release", root);
  if (access("/usr/lib/os-release", F_OK) == 0 && symlink("../usr/lib/os-release", osr) < 0 && errno != EEXIST)
    return hutch_err_sys(err, errno, "symlink `%s`", osr);
  if (put(root, ".hutch-template", HOST_TEMPLATE_VERSION, 0644, err) < 0) return -1;
  /* Sandboxes of this template (and of templates made from their
   * snapshots) get the host's /usr, read-only. */
  if (put(root, HUTCH_TEMPLATE_USR_MARKER, "/usr\n", 0644, err) < 0) return -1;
  return shift_tree(root, err);
}


static int put_in_root(const char *root, const char *rel, const char *content, hutch_err *err);

/* ---- busybox --------------------------------------------------------------- */

static int build_busybox(const char *root, hutch_err *err) {
  static const char *const dirs[] = {"bin", "sbin", "usr", "usr/bin", "usr/sbin", "etc", "root", "home",
                                     "home/user", "tmp", "var", "var/tmp", "proc", "dev", "run", "mnt"};
  for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) {
    cleanup_free char *d = xasprintf("%s/%s", root, dirs[i]);
    mode_t m = !strcmp(dirs[i], "tmp") || !strcmp(dirs[i], "var/tmp") ? 01777 : !strcmp(dirs[i], "root") ? 0700 : 0755;
    if (mkdir(d, m) < 0 && errno != EEXIST) return hutch_err_sys(err, errno, "mkdir `%s`", d);
    if (chmod(d, m) < 0) return hutch_err_sys(err, errno, "chmod `%s`", d);
  }
  const char *bb = access("/bin/busybox", X_OK) == 0 ? "/bin/busybox" : "/usr/bin/busybox";
  size_t len;
  cleanup_free char *data = read_file(bb, 8 << 20, &len, err);
  if (!data) return hutch_err_wrap(err, "read busybox (install busybox-static)");
  cleanup_free char *dst = xasprintf("%s/bin/busybox", root);
  if (write_file(dst, data, len, 0755, err) < 0) return -1;
  /* One link per applet, where busybox says it lives. */
  const char *argv[] = {bb, "--list-full", NULL};
  char tmpl[] = "/tmp/hutch-bb-XXXXXX";
  cleanup_close int fd = mkostemp(tmpl, O_CLOEXEC);
  if (fd < 0) return hutch_err_sys(err, errno, "mkostemp");
  unlink(tmpl);
  if (hutch_run(argv, -1, fd, NULL, NULL, err) < 0) return hutch_err_wrap(err, "list busybox applets");
  char list[65536];
  ssize_t n = pread(fd, list, sizeof list - 1, 0);
  if (n < 0) return hutch_err_sys(err, errno, "read applet list");
  list[n] = 0;
  for (char *save = NULL, *l = strtok_r(list, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
    if (strstr(l, "..") || l[0] == '/' || !strcmp(l, "bin/busybox")) continue;
    cleanup_free char *link = xasprintf("%s/%s", root, l);
    if (symlink("/bin/busybox", link) < 0 && errno != EEXIST) return hutch_err_sys(err, errno, "symlink `%s`", link);
  }
  cleanup_free char *home = xasprintf("%s/home/user", root);
  if (chown(home, 1000, 1000) < 0) return hutch_err_sys(err, errno, "chown `%s`", home);
  if (put(root, "etc/passwd",
          "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:sandbox user:/home/user:/bin/sh\n"
          "nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
          0644, err) < 0 ||
      put(root, "etc/group", group, 0644, err) < 0 ||
      put(root, "etc/resolv.conf", "# hutch: no network egress configured\n", 0644, err) < 0 ||
      put(root, "etc/hostname", "sandbox\n", 0644, err) < 0 ||
      put(root, "etc/hosts", "127.0.0.1 localhost\n::1 localhost\n", 0644, err) < 0)
    return -1;
  return 0;
}

/* ---- debian (debootstrap) ----------------------------------------------------- */

struct progress_ctx {
  hutch_template_progress_fn fn;
  void *arg;
  unsigned got, total; /* packages retrieved / expected, from debootstrap's output */
  double base;
};

/* debootstrap prints "I: Retrieving <pkg> <ver>", then Validating,
 * Extracting, Unpacking, Configuring: weight the phases. */
static void debootstrap_line(void *arg, const char *line) {
  struct progress_ctx *pc = arg;
  if (strncmp(line, "I: ", 3) && strncmp(line, "W: ", 3) && strncmp(line, "E: ", 3)) return;
  static const struct {
    const char *prefix;
    double at;
  } phases[] = {{"I: Retrieving Release", 0.02}, {"I: Checking component", 0.04}, {"I: Retrieving", 0.05},
                {"I: Validating", 0.35},         {"I: Extracting", 0.45},         {"I: Installing", 0.55},
                {"I: Unpacking", 0.65},          {"I: Configuring", 0.8},         {"I: Base system installed", 0.97}};
  for (size_t i = 0; i < sizeof phases / sizeof *phases; i++) {
    if (strncmp(line, phases[i].prefix, strlen(phases[i].prefix))) continue;
    if (phases[i].at > pc->base) pc->base = phases[i].at;
    break;
  }
  if (pc->fn) pc->fn(pc->arg, line + 3, pc->base);
}

static int build_debian(const char *root, const struct hutch_template_source *src, struct progress_ctx *pc,
                        hutch_err *err) {
  const char *suite = src->suite ? src->suite : "bookworm";
  const char *mirror = src->mirror ? src->mirror : "http://deb.debian.org/debian";
  cleanup_free char *include = NULL;
  for (size_t i = 0; i < src->npackages; i++) {
    char *n = include ? xasprintf("%s,%s", include, src->packages[i]) : xstrdup(src->packages[i]);
    free(include);
    include = n;
  }
  cleanup_free char *inc_arg = include ? xasprintf("--include=%s", include) : NULL;
  const char *argv[8];
  size_t a = 0;
  argv[a++] = "debootstrap";
  argv[a++] = "--variant=minbase";
  if (inc_arg) argv[a++] = inc_arg;
  argv[a++] = suite;
  argv[a++] = root;
  argv[a++] = mirror;
  argv[a] = NULL;
  if (hutch_run(argv, -1, -1, debootstrap_line, pc, err) < 0) return hutch_err_wrap(err, "debootstrap %s", suite);
  /* Downloaded packages are not part of the template. */
  cleanup_free char *cache = xasprintf("%s/var/cache/apt/archives", root);
  const char *clean[] = {"find", cache, "-maxdepth", "1", "-name", "*.deb", "-delete", NULL};
  if (hutch_run(clean, -1, -1, NULL, NULL, err) < 0) return -1;
  cleanup_free char *passwd_path = xasprintf("%s/etc/passwd", root);
  cleanup_free char *pw = read_file(passwd_path, 1 << 20, NULL, err);
  if (!pw) return -1;
  if (!strstr(pw, "\nuser:")) {
    cleanup_free char *npw = xasprintf("%suser:x:1000:1000:sandbox user:/home/user:/bin/bash\n", pw);
    if (write_file(passwd_path, npw, strlen(npw), 0644, err) < 0) return -1;
    cleanup_free char *gpath = xasprintf("%s/etc/group", root);
    cleanup_free char *gr = read_file(gpath, 1 << 20, NULL, err);
    if (!gr) return -1;
    cleanup_free char *ngr = xasprintf("%suser:x:1000:\n", gr);
    if (write_file(gpath, ngr, strlen(ngr), 0644, err) < 0) return -1;
    cleanup_free char *home = xasprintf("%s/home/user", root);
    if (mkdir(home, 0750) < 0 && errno != EEXIST) return hutch_err_sys(err, errno, "mkdir `%s`", home);
    if (chown(home, 1000, 1000) < 0) return hutch_err_sys(err, errno, "chown `%s`", home);
  }
  if (put(root, "etc/resolv.conf", "# hutch: no network egress configured\n", 0644, err) < 0 ||
      put(root, "etc/hostname", "sandbox\n", 0644, err) < 0)
    return -1;
  return 0;
}

/* ---- the build ------------------------------------------------------------------ */

bool hutch_template_valid_name(const char *name) {
  size_t n = strlen(name);
  if (n == 0 || n > 63 || name[0] == '.' || name[0] == '-') return false;
  for (const char *p = name; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-' || *p == '_' || *p == '.'))
      return false;
  return true;
}

char *hutch_template_path(const struct hutch_pool *p, const char *name) {
  return hutch_pool_path(p, "templates", name);
}

bool hutch_template_exists(const struct hutch_pool *p, const char *name) {
  if (!hutch_template_valid_name(name)) return false;
  cleanup_free char *dir = hutch_template_path(p, name);
  cleanup_free char *ver = xasprintf("%s/.hutch-template", dir);
  return access(ver, F_OK) == 0;
}

char *hutch_template_usr_src(const struct hutch_pool *p, const char *volume) {
  (void)p;
  cleanup_free char *marker = xasprintf("%s/" HUTCH_TEMPLATE_USR_MARKER, volume);
  return access(marker, F_OK) == 0 ? xstrdup("/usr") : NULL;
}

static char *image_config_json(const struct hutch_image_config *c) {
  json_t *o = json_object();
  json_t *env = json_object();
  for (size_t i = 0; i < c->n_env; i++) {
    const char *eq = strchr(c->env[i], '=');
    if (!eq || eq == c->env[i]) continue;
    cleanup_free char *k = xstrndup(c->env[i], (size_t)(eq - c->env[i]));
    json_object_set_new(env, k, json_string(eq + 1));
  }
  json_object_set_new(o, "env", env);
  if (c->cwd && *c->cwd) json_object_set_new(o, "cwd", json_string(c->cwd));
  if (c->user && *c->user) json_object_set_new(o, "user", json_string(c->user));
  json_t *ep = json_array(), *cmd = json_array();
  for (size_t i = 0; i < c->n_entrypoint; i++) json_array_append_new(ep, json_string(c->entrypoint[i]));
  for (size_t i = 0; i < c->n_cmd; i++) json_array_append_new(cmd, json_string(c->cmd[i]));
  json_object_set_new(o, "entrypoint", ep);
  json_object_set_new(o, "cmd", cmd);
  char *s = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
  json_decref(o);
  return s;
}

int hutch_template_build(const struct hutch_pool *p, const char *name, const struct hutch_template_source *src,
                         hutch_template_progress_fn progress, void *arg, char **config_json, hutch_err *err) {
  if (config_json) *config_json = NULL;
  if (!hutch_template_valid_name(name))
    return hutch_err_invalid(err, "template name `%s`: use 1-63 of a-z 0-9 . _ - (not starting with . or -)", name);
  char rnd[32];
  hutch_random_id("b", rnd, sizeof rnd);
  /* Staged beside its final place: a sealed (read-only) subvolume can be
   * renamed within its directory, not moved to another. */
  cleanup_free char *stage_name = xasprintf(".build-%s-%s", name, rnd);
  cleanup_free char *stage = hutch_pool_path(p, "templates", stage_name);
  struct progress_ctx pc = {.fn = progress, .arg = arg};
  int rc = -1;
  if (!strcmp(src->kind, "snapshot")) {
    /* Already a finished root: share its blocks. */
    if (hutch_pool_volume_clone(p, src->snapshot_path, stage, false, err) < 0) return -1;
  } else if (hutch_pool_volume_new(p, stage, err) < 0) {
    return -1;
  }
  if (progress) progress(arg, "building", 0.01);
  if (!strcmp(src->kind, "host")) {
    rc = build_host(stage, err);
  } else if (!strcmp(src->kind, "busybox")) {
    rc = build_busybox(stage, err);
  } else if (!strcmp(src->kind, "debian")) {
    rc = build_debian(stage, src, &pc, err);
  } else if (!strcmp(src->kind, "oci")) {
    struct hutch_image_config cfg;
    memset(&cfg, 0, sizeof cfg);
    rc = hutch_oci_import(src->path, src->ref, stage, &cfg, progress, arg, err);
    if (rc == 0 && config_json) *config_json = image_config_json(&cfg);
    hutch_image_config_free(&cfg);
  } else if (!strcmp(src->kind, "snapshot")) {
    rc = 0;
  } else {
    rc = hutch_err_invalid(err, "template source `%s`: use host, busybox, debian, oci or snapshot", src->kind);
  }
  if (rc == 0 && strcmp(src->kind, "host")) {
    cleanup_free char *ver = xasprintf("%s\n", name);
    /* In root: a tree from a snapshot is a sandbox's work, and may hold a
     * symlink by that name aimed at the host. */
    rc = put_in_root(stage, ".hutch-template", ver, err);
    if (rc == 0) rc = shift_tree(stage, err);
  }
  if (progress && rc == 0) progress(arg, "sealing", 0.99);
  if (rc == 0) rc = hutch_pool_volume_seal(p, stage, err);
  cleanup_free char *dst = hutch_template_path(p, name);
  cleanup_free char *old = xasprintf("%s.old", stage);
  if (rc == 0 && rename(dst, old) < 0 && errno != ENOENT) rc = hutch_err_sys(err, errno, "rename `%s`", dst);
  if (rc == 0 && rename(stage, dst) < 0) rc = hutch_err_sys(err, errno, "rename `%s`", stage);
  hutch_err e2 = HUTCH_ERR_INIT;
  if (rc < 0) {
    if (hutch_pool_volume_remove(p, stage, &e2) < 0)
      hutch_log(LOG_WARN, "template.cleanup_failed", "path", stage, "reason", e2.msg, NULL);
    return hutch_err_wrap(err, "build template `%s`", name);
  }
  if (hutch_pool_volume_remove(p, old, &e2) < 0)
    hutch_log(LOG_WARN, "template.cleanup_failed", "path", old, "reason", e2.msg, NULL);
  return 0;
}

int hutch_template_ensure_host(const struct hutch_pool *p, hutch_err *err) {
  cleanup_free char *dir = hutch_template_path(p, "host");
  cleanup_free char *ver = xasprintf("%s/.hutch-template", dir);
  hutch_err e2 = HUTCH_ERR_INIT;
  cleanup_free char *have = read_file(ver, 64, NULL, &e2);
  if (have && !strcmp(have, HOST_TEMPLATE_VERSION)) return 0;
  struct hutch_template_source src = {.kind = "host"};
  return hutch_template_build(p, "host", &src, NULL, NULL, NULL, err);
}

int hutch_template_remove(const struct hutch_pool *p, const char *name, hutch_err *err) {
  if (!hutch_template_valid_name(name)) return hutch_err_set(err, 404, "not_found", "template `%s` not found", name);
  cleanup_free char *dir = hutch_template_path(p, name);
  char rnd[32];
  hutch_random_id("d", rnd, sizeof rnd);
  cleanup_free char *gone_name = xasprintf(".build-del-%s-%s", name, rnd);
  cleanup_free char *gone = hutch_pool_path(p, "templates", gone_name);
  /* Out of sight first (atomic), then removed. */
  if (rename(dir, gone) < 0) {
    if (errno == ENOENT) return hutch_err_set(err, 404, "not_found", "template `%s` not found", name);
    return hutch_err_sys(err, errno, "rename `%s`", dir);
  }
  return hutch_pool_volume_remove(p, gone, err);
}

/* ---- sandbox roots ---------------------------------------------------------------- */

char *hutch_rootfs_path(const struct hutch_pool *p, const char *id) { return hutch_pool_path(p, "rootfs", id); }

/* Write `content` to root/rel, resolving every component inside `root`: a
 * root made from a snapshot is the sandbox's own work, and its /etc may be a
 * symlink aimed at the host. */
static int put_in_root_mode(const char *root, const char *rel, const char *content, bool append, hutch_err *err) {
  cleanup_close int rfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (rfd < 0) return hutch_err_sys(err, errno, "open `%s`", root);
  struct open_how how = {.flags = O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC) | O_NOFOLLOW | O_CLOEXEC,
                         .mode = 0644,
                         .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV};
  int fd = (int)syscall(SYS_openat2, rfd, rel, &how, sizeof how);
  if (fd < 0) {
    if (errno == ENOENT || errno == ELOOP || errno == ENOTDIR || errno == EISDIR || errno == EXDEV)
      return 0; /* no /etc, or something odd there: the sandbox keeps what it made */
    return hutch_err_sys(err, errno, "open `%s/%s`", root, rel);
  }
  int rc = write_full(fd, content, strlen(content));
  int e = errno;
  struct stat st;
  if (rc == 0 && fstat(fd, &st) == 0 && st.st_uid < 65536)
    rc = fchown(fd, HUTCH_STORAGE_UID_BASE + st.st_uid, HUTCH_STORAGE_UID_BASE + st.st_gid), e = errno;
  close(fd);
  if (rc < 0) return hutch_err_sys(err, e, "write `%s/%s`", root, rel);
  return 0;
}

static int put_in_root(const char *root, const char *rel, const char *content, hutch_err *err) {
  return put_in_root_mode(root, rel, content, false, err);
}

int hutch_rootfs_write(const struct hutch_pool *p, const char *id, const char *rel, const char *content, bool append,
                       hutch_err *err) {
  cleanup_free char *root = hutch_rootfs_path(p, id);
  cleanup_free char *top = p->kind == HUTCH_POOL_OVERLAY ? xasprintf("%s/upper", root) : xstrdup(root);
  return put_in_root_mode(top, rel, content, append, err);
}

int hutch_rootfs_create(const struct hutch_pool *p, const char *template_name, const char *from_volume,
                        const char *id, const char *hostname, uint64_t disk_bytes, hutch_err *err) {
  if (!from_volume && !hutch_template_exists(p, template_name))
    return hutch_err_set(err, 404, "not_found", "template `%s` not found", template_name);
  cleanup_free char *root = hutch_rootfs_path(p, id);
  cleanup_free char *tpl = hutch_template_path(p, template_name);
  cleanup_free char *etc_dir = NULL;
  if (p->kind == HUTCH_POOL_BTRFS) {
    /* A writable snapshot: O(1) whatever the size of what it is made from. */
    if (hutch_pool_volume_clone(p, from_volume ? from_volume : tpl, root, false, err) < 0) return -1;
    etc_dir = xstrdup(root);
  } else {
    /* Overlay: the sandbox's directory holds the upper layer only (a
     * snapshot is a copy of one). */
    cleanup_free char *upper = xasprintf("%s/upper", root);
    cleanup_free char *work = xasprintf("%s/work", root);
    if (mkdir(root, 0755) < 0) return hutch_err_sys(err, errno, "mkdir `%s`", root);
    int rc = from_volume ? hutch_pool_volume_clone(p, from_volume, upper, false, err) : mkdir(upper, 0755);
    if (rc < 0 || mkdir(work, 0700) < 0) {
      if (rc == 0) hutch_err_sys(err, errno, "create the writable layer in `%s`", root);
      hutch_err e2 = HUTCH_ERR_INIT;
      rm_rf(root, &e2);
      return -1;
    }
    cleanup_free char *etc = xasprintf("%s/etc", upper);
    /* A fresh upper layer gets /etc (for hostname and hosts); one copied
     * from a snapshot has whatever the sandbox left there. */
    if (mkdir(etc, 0755) == 0 && chown(etc, HUTCH_STORAGE_UID_BASE, HUTCH_STORAGE_UID_BASE) < 0) rc = -1;
    if (rc < 0 || chown(upper, HUTCH_STORAGE_UID_BASE, HUTCH_STORAGE_UID_BASE) < 0 ||
        chown(work, HUTCH_STORAGE_UID_BASE, HUTCH_STORAGE_UID_BASE) < 0) {
      hutch_err_sys(err, errno, "chown `%s`", root);
      hutch_err e2 = HUTCH_ERR_INIT;
      rm_rf(root, &e2);
      return -1;
    }
    etc_dir = xstrdup(upper);
  }
  cleanup_free char *hn = xasprintf("%s\n", hostname);
  cleanup_free char *hosts = xasprintf("127.0.0.1 localhost\n127.0.1.1 %s\n::1 localhost\n", hostname);
  if (hutch_pool_volume_limit(p, root, disk_bytes, err) < 0 || put_in_root(etc_dir, "etc/hostname", hn, err) < 0 ||
      put_in_root(etc_dir, "etc/hosts", hosts, err) < 0) {
    hutch_err e2 = HUTCH_ERR_INIT;
    hutch_pool_volume_remove(p, root, &e2);
    return -1;
  }
  return 0;
}

int hutch_rootfs_remove(const struct hutch_pool *p, const char *id, hutch_err *err) {
  cleanup_free char *root = hutch_rootfs_path(p, id);
  return hutch_pool_volume_remove(p, root, err);
}
