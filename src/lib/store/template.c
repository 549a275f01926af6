#include "store/template.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"
#include "isolate/userns.h"

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
  return shift_tree(root, err);
}

int hutch_template_ensure_host(const char *data_dir, hutch_err *err) {
  cleanup_free char *dir = xasprintf("%s/templates", data_dir);
  cleanup_free char *root = xasprintf("%s/host", dir);
  cleanup_free char *ver = xasprintf("%s/.hutch-template", root);
  hutch_err e2 = HUTCH_ERR_INIT;
  cleanup_free char *have = read_file(ver, 64, NULL, &e2);
  if (have && !strcmp(have, HOST_TEMPLATE_VERSION)) return 0;
  if (mkdir_p(dir, 0700, err) < 0) return hutch_err_wrap(err, "template directory");
  cleanup_free char *tmp = xasprintf("%s/.host.tmp-%d", dir, (int)getpid());
  if (rm_rf(tmp, err) < 0) return -1;
  if (build_host(tmp, err) < 0) {
    hutch_err e3 = HUTCH_ERR_INIT;
    rm_rf(tmp, &e3);
    return hutch_err_wrap(err, "build template `host`");
  }
  cleanup_free char *old = xasprintf("%s/.host.old-%d", dir, (int)getpid());
  if (rename(root, old) < 0 && errno != ENOENT) return hutch_err_sys(err, errno, "rename `%s`", root);
  if (rename(tmp, root) < 0) return hutch_err_sys(err, errno, "rename `%s`", tmp);
  return rm_rf(old, err);
}

static bool valid_name(const char *name) {
  size_t n = strlen(name);
  if (n == 0 || n > 63 || name[0] == '.') return false;
  for (const char *p = name; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-' || *p == '_' || *p == '.'))
      return false;
  return true;
}

bool hutch_template_exists(const char *data_dir, const char *name) {
  if (!valid_name(name)) return false;
  cleanup_free char *ver = xasprintf("%s/templates/%s/.hutch-template", data_dir, name);
  return access(ver, F_OK) == 0;
}

const char *hutch_template_usr_src(const char *name) { return !strcmp(name, "host") ? "/usr" : NULL; }

int hutch_rootfs_create(const char *data_dir, const char *template_name, const char *rootfs, const char *hostname,
                        hutch_err *err) {
  if (!hutch_template_exists(data_dir, template_name))
    return hutch_err_set(err, 404, "not_found", "template `%s` not found", template_name);
  /* The root is an overlay of the template (see isolate/mounts.c): the
   * sandbox's directory holds only the upper layer, so creation costs the
   * same for any template.  The storage issue replaces this with btrfs. */
  cleanup_free char *upper = xasprintf("%s/upper", rootfs);
  cleanup_free char *etc = xasprintf("%s/upper/etc", rootfs);
  cleanup_free char *work = xasprintf("%s/work", rootfs);
  if (mkdir(rootfs, 0755) < 0 || mkdir(upper, 0755) < 0 || mkdir(etc, 0755) < 0 || mkdir(work, 0700) < 0)
    return hutch_err_sys(err, errno, "create the writable layer in `%s`", rootfs);
  cleanup_free char *hn = xasprintf("%s\n", hostname);
  cleanup_free char *hosts = xasprintf("127.0.0.1 localhost\n127.0.1.1 %s\n::1 localhost\n", hostname);
  if (put(upper, "etc/hostname", hn, 0644, err) < 0 || put(upper, "etc/hosts", hosts, 0644, err) < 0) return -1;
  return shift_tree(rootfs, err);
}
