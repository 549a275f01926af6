/* Image import (src/lib/store/oci.c) and the safe tar extractor
 * (src/lib/store/tarx.c).  Every archive is built here, in C: tar headers
 * written by hand, gzip with zlib, zstd with libzstd.
 *
 * The escape tests put a sentinel directory next to the root and check that
 * nothing in it changed; each has a positive control that writes through
 * the same path the naive way (open() on the joined path, following
 * symlinks) and shows that the sentinel check does see that write. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include "common/err.h"
#include "common/hash.h"
#include "common/util.h"
#include "store/oci.h"
#include "store/tarx.h"
#include "tap.h"

static char T[] = "/tmp/hutch-test-oci.XXXXXX";
#define MTIME 1234567890LL

/* ---- byte buffers ------------------------------------------------------ */

struct buf {
  unsigned char *p;
  size_t n, cap;
};

static void bput(struct buf *b, const void *d, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 1024;
    b->p = xrealloc(b->p, b->cap);
  }
  if (n) memcpy(b->p + b->n, d, n);
  b->n += n;
}

static void bfree(struct buf *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}

static char *sha(const void *p, size_t n) {
  char hex[65];
  hutch_sha256_hex(p, n, hex);
  return xasprintf("sha256:%s", hex);
}

/* ---- tar writer -------------------------------------------------------- */

static void octal(unsigned char *f, size_t w, unsigned long long v) {
  /* w-1 digits and a NUL */
  for (size_t i = w - 1; i-- > 0; v >>= 3) f[i] = (unsigned char)('0' + (v & 7));
  f[w - 1] = 0;
}

static void raw_hdr(struct buf *b, const char *name, char type, unsigned mode, unsigned uid, unsigned gid,
                    long long mtime, const char *link, unsigned long long size) {
  unsigned char h[512];
  memset(h, 0, sizeof h);
  memcpy(h, name, strlen(name) < 100 ? strlen(name) : 100);
  octal(h + 100, 8, mode & 07777);
  octal(h + 108, 8, uid);
  octal(h + 116, 8, gid);
  octal(h + 124, 12, size);
  octal(h + 136, 12, (unsigned long long)mtime);
  h[156] = (unsigned char)type;
  if (link) memcpy(h + 157, link, strlen(link) < 100 ? strlen(link) : 100);
  memcpy(h + 257, "ustar", 6);
  memcpy(h + 263, "00", 2);
  memcpy(h + 265, "root", 4);
  memcpy(h + 297, "root", 4);
  memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (int i = 0; i < 512; i++) sum += h[i];
  octal(h + 148, 7, sum);
  h[155] = ' ';
  bput(b, h, 512);
}

static void pad(struct buf *b) {
  static const unsigned char z[512];
  if (b->n % 512) bput(b, z, 512 - b->n % 512);
}

struct ent {
  char type;
  const char *name, *link;
  const void *data;
  size_t size;
  unsigned mode, uid, gid;
  long long mtime;
};

static void tadd_e(struct buf *b, const struct ent *e) {
  if (strlen(e->name) > 100) { /* GNU long name */
    raw_hdr(b, "././@LongLink", 'L', 0, 0, 0, 0, NULL, strlen(e->name) + 1);
    bput(b, e->name, strlen(e->name) + 1);
    pad(b);
  }
  if (e->link && strlen(e->link) > 100) {
    raw_hdr(b, "././@LongLink", 'K', 0, 0, 0, 0, NULL, strlen(e->link) + 1);
    bput(b, e->link, strlen(e->link) + 1);
    pad(b);
  }
  raw_hdr(b, e->name, e->type, e->mode, e->uid, e->gid, e->mtime, e->link, e->size);
  bput(b, e->data, e->size);
  pad(b);
}

/* Common case: root-owned, MTIME; data is a string. */
static void tadd(struct buf *b, char type, const char *name, const char *link, const char *data, unsigned mode) {
  struct ent e = {type, name, link, data, data ? strlen(data) : 0, mode, 0, 0, MTIME};
  tadd_e(b, &e);
}
#define TDIR(b, n) tadd(b, '5', n, NULL, NULL, 0755)
#define TFILE(b, n, d) tadd(b, '0', n, NULL, d, 0644)
#define TSYM(b, n, l) tadd(b, '2', n, l, NULL, 0777)
#define TLINK(b, n, l) tadd(b, '1', n, l, NULL, 0644)

static void tmember(struct buf *b, const char *name, const struct buf *data) {
  struct ent e = {'0', name, NULL, data->p, data->n, 0644, 0, 0, MTIME};
  tadd_e(b, &e);
}

/* A pax 'x' header with one record for the next entry. */
static void tpax(struct buf *b, const char *key, const char *val) {
  size_t body = 1 + strlen(key) + 1 + strlen(val) + 1, len = body + 1;
  for (;;) {
    size_t digits = (size_t)snprintf(NULL, 0, "%zu", len);
    if (digits + body == len) break;
    len = digits + body;
  }
  char *rec = xasprintf("%zu %s=%s\n", len, key, val);
  raw_hdr(b, "PaxHeaders/x", 'x', 0644, 0, 0, 0, NULL, strlen(rec));
  bput(b, rec, strlen(rec));
  pad(b);
  free(rec);
}

static void tend(struct buf *b) {
  static const unsigned char z[1024];
  bput(b, z, sizeof z);
}

static struct buf gz(const struct buf *in) {
  z_stream z;
  memset(&z, 0, sizeof z);
  deflateInit2(&z, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
  struct buf out = {0};
  out.cap = deflateBound(&z, in->n) + 64;
  out.p = xmalloc(out.cap);
  z.next_in = in->p;
  z.avail_in = (uInt)in->n;
  z.next_out = out.p;
  z.avail_out = (uInt)out.cap;
  deflate(&z, Z_FINISH);
  out.n = out.cap - z.avail_out;
  deflateEnd(&z);
  return out;
}

static struct buf zst(const struct buf *in) {
  struct buf out = {0};
  out.cap = ZSTD_compressBound(in->n);
  out.p = xmalloc(out.cap);
  out.n = ZSTD_compress(out.p, out.cap, in->p, in->n, 3);
  return out;
}

/* ---- files ------------------------------------------------------------- */

static char *P(const char *fmt, const char *a) { return xasprintf(fmt, a); }

static void write_buf(const char *path, const void *p, size_t n) {
  if (write_file(path, p, n, 0644, NULL) < 0) printf("# write %s failed\n", path);
}

static char *slurp(const char *dir, const char *rel) {
  char *p = xasprintf("%s/%s", dir, rel);
  char *s = read_file(p, 1 << 20, NULL, NULL);
  free(p);
  return s;
}

static int lstat_at(const char *dir, const char *rel, struct stat *st) {
  char *p = xasprintf("%s/%s", dir, rel);
  int r = lstat(p, st);
  free(p);
  return r;
}

static bool exists_at(const char *dir, const char *rel) {
  struct stat st;
  return lstat_at(dir, rel, &st) == 0;
}

static int n_made;
static char *new_dir(const char *what) {
  char *p = xasprintf("%s/%s-%d", T, what, ++n_made);
  if (mkdir(p, 0700) < 0) printf("# mkdir %s: %s\n", p, strerror(errno));
  return p;
}

static bool dir_empty(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return false;
  struct dirent *de;
  bool empty = true;
  while ((de = readdir(d)))
    if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) empty = false;
  closedir(d);
  return empty;
}

/* Any name starting with ".wh." anywhere under dir? */
static bool has_whiteout_files(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return false;
  struct dirent *de;
  bool found = false;
  while (!found && (de = readdir(d))) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    if (!strncmp(de->d_name, ".wh.", 4)) found = true;
    else if (de->d_type == DT_DIR) {
      char *sub = xasprintf("%s/%s", dir, de->d_name);
      found = has_whiteout_files(sub);
      free(sub);
    }
  }
  closedir(d);
  return found;
}

/* ---- image builders ---------------------------------------------------- */

static const char *CONFIG_FMT =
    "{\"architecture\":\"amd64\",\"os\":\"linux\",\"config\":{\"Env\":[\"PATH=/usr/bin:/bin\",\"FOO=bar=baz\"],"
    "\"WorkingDir\":\"/srv\",\"User\":\"1000:1000\",\"Entrypoint\":[\"/bin/sh\",\"-c\"],\"Cmd\":[\"echo hi\"]},"
    "\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[%s]}}";

/* diff_ids JSON list of the uncompressed layers. */
static char *diff_ids(struct buf *const *plain, size_t n) {
  char *s = xstrdup("");
  for (size_t i = 0; i < n; i++) {
    char *d = sha(plain[i]->p, plain[i]->n);
    char *t = xasprintf("%s%s\"%s\"", s, i ? "," : "", d);
    free(s);
    free(d);
    s = t;
  }
  return s;
}

/* A docker save tarball at `path`: layers l<i>/layer.tar (uncompressed as
 * given), manifest.json with RepoTags, the config as <sha>.json.  `extra`
 * members are appended (name, data) pairs. */
static void docker_save(const char *path, struct buf *const *layers, size_t n, const char *tags_json,
                        const char *config_override) {
  struct buf out = {0};
  char *ids = diff_ids(layers, n);
  char *config = config_override ? xstrdup(config_override) : xasprintf(CONFIG_FMT, ids);
  char *chex = sha(config, strlen(config));
  char *cname = xasprintf("%s.json", chex + 7);
  char *ljson = xstrdup("");
  for (size_t i = 0; i < n; i++) {
    char *t = xasprintf("%s%s\"l%zu/layer.tar\"", ljson, i ? "," : "", i + 1);
    free(ljson);
    ljson = t;
  }
  char *manifest = xasprintf("[{\"Config\":\"%s\",\"RepoTags\":%s,\"Layers\":[%s]}]", cname, tags_json, ljson);
  struct buf mb = {0}, cb = {0};
  bput(&mb, manifest, strlen(manifest));
  bput(&cb, config, strlen(config));
  tmember(&out, cname, &cb);
  for (size_t i = 0; i < n; i++) {
    char *dn = xasprintf("l%zu/", i + 1), *ln = xasprintf("l%zu/layer.tar", i + 1);
    TDIR(&out, dn);
    tmember(&out, ln, layers[i]);
    free(dn);
    free(ln);
  }
  tmember(&out, "manifest.json", &mb);
  tend(&out);
  write_buf(path, out.p, out.n);
  bfree(&out);
  bfree(&mb);
  bfree(&cb);
  free(ids);
  free(config);
  free(chex);
  free(cname);
  free(ljson);
  free(manifest);
}

/* Blob into an OCI layout directory; returns its digest. */
static char *put_blob(const char *dir, const void *p, size_t n) {
  char *d = sha(p, n);
  char *bdir = xasprintf("%s/blobs/sha256", dir);
  mkdir_p(bdir, 0755, NULL);
  char *path = xasprintf("%s/%s", bdir, d + 7);
  write_buf(path, p, n);
  free(bdir);
  free(path);
  return d;
}

/* An image manifest for `layers` (already compressed as they should be
 * stored) and `plain` (their uncompressed forms, for diff_ids); returns
 * the manifest's descriptor JSON (without annotations/platform: the
 * caller wraps it). */
static char *oci_image(const char *dir, struct buf *const *stored, struct buf *const *plain, size_t n,
                       size_t *msize) {
  char *ids = diff_ids(plain, n);
  char *config = xasprintf(CONFIG_FMT, ids);
  char *cd = put_blob(dir, config, strlen(config));
  char *lj = xstrdup("");
  for (size_t i = 0; i < n; i++) {
    char *ld = put_blob(dir, stored[i]->p, stored[i]->n);
    char *t = xasprintf("%s%s{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar+gzip\",\"digest\":\"%s\","
                        "\"size\":%zu}",
                        lj, i ? "," : "", ld, stored[i]->n);
    free(lj);
    free(ld);
    lj = t;
  }
  char *manifest = xasprintf("{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\","
                             "\"config\":{\"mediaType\":\"application/vnd.oci.image.config.v1+json\","
                             "\"digest\":\"%s\",\"size\":%zu},\"layers\":[%s]}",
                             cd, strlen(config), lj);
  char *md = put_blob(dir, manifest, strlen(manifest));
  *msize = strlen(manifest);
  free(ids);
  free(config);
  free(cd);
  free(lj);
  free(manifest);
  return md;
}

static void oci_index(const char *dir, const char *manifests_json) {
  char *p = xasprintf("%s/oci-layout", dir);
  write_buf(p, "{\"imageLayoutVersion\":\"1.0.0\"}", 30);
  free(p);
  char *idx = xasprintf("{\"schemaVersion\":2,\"manifests\":[%s]}", manifests_json);
  p = xasprintf("%s/index.json", dir);
  write_buf(p, idx, strlen(idx));
  free(p);
  free(idx);
}

struct progress_log {
  int calls;
  char first[256], last[256];
  double last_fraction;
  bool monotonic;
};

static void on_progress(void *arg, const char *msg, double fraction) {
  struct progress_log *l = arg;
  if (l->calls == 0) snprintf(l->first, sizeof l->first, "%s", msg), l->monotonic = true;
  else if (fraction < l->last_fraction) l->monotonic = false;
  snprintf(l->last, sizeof l->last, "%s", msg);
  l->last_fraction = fraction;
  l->calls++;
}

/* ---- tests ------------------------------------------------------------- */

static void test_clean_path(void) {
  struct {
    const char *in, *out;
  } c[] = {{"a/b", "a/b"},         {"./a/./b/", "a/b"},  {"/etc/passwd", "etc/passwd"}, {"../../x", "x"},
           {"a/../../b", "b"},      {"a/b/../c", "a/c"}, {"", ""},                        {"./", ""},
           {"//a//b//", "a/b"},     {"..", ""},          {"a/..", ""},                    {"...", "..."},
           {"a/.wh..wh..opq", "a/.wh..wh..opq"}};
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    char out[64];
    is_str(hutch_tar_clean_path(c[i].in, out), c[i].out, "clean `%s`", c[i].in);
  }
  char inplace[] = "x/../y/./z";
  is_str(hutch_tar_clean_path(inplace, inplace), "y/z", "clean in place");
}

/* A path of n-1 bytes: prefix, then components of 50 `c`s. */
static void long_name(char *out, size_t n, const char *prefix, char c) {
  memset(out, c, n - 1);
  out[n - 1] = 0;
  memcpy(out, prefix, strlen(prefix));
  for (size_t i = strlen(prefix) + 50; i < n - 1; i += 51) out[i] = '/';
  if (out[n - 2] == '/') out[n - 2] = c;
}

/* Two layers: whiteouts, an opaque directory, every entry type, metadata. */
static void make_docker_layers(struct buf *l1, struct buf *l2) {
  TDIR(l1, "./");
  TDIR(l1, "etc/");
  TFILE(l1, "etc/passwd", "root:x:0:0::/root:/bin/sh\n");
  TDIR(l1, "bin/");
  tadd(l1, '0', "bin/sh", NULL, "#!shell", 0755);
  tadd(l1, '0', "bin/su", NULL, "setuid", 04755);
  TSYM(l1, "bin/ls", "sh");
  TLINK(l1, "bin/hardsh", "bin/sh");
  struct ent big = {'0', "big-ids", NULL, "x", 1, 0640, 100000, 200000, MTIME};
  tadd_e(l1, &big);
  struct ent mid = {'0', "mid-ids", NULL, "x", 1, 0600, 1000, 65535, MTIME};
  tadd_e(l1, &mid);
  TDIR(l1, "usr/share/doc/");
  TFILE(l1, "usr/share/doc/a", "a");
  TFILE(l1, "usr/share/doc/b", "b");
  TDIR(l1, "opq/");
  TFILE(l1, "opq/old1", "o");
  TDIR(l1, "opq/sub/");
  TFILE(l1, "opq/sub/old2", "o2");
  TFILE(l1, "gone", "g");
  TDIR(l1, "gonedir/");
  TDIR(l1, "gonedir/deep/");
  TFILE(l1, "gonedir/deep/x", "x");
  TSYM(l1, "gonedir/deep/link", "/etc");
  TFILE(l1, "repl", "file becomes dir");
  TDIR(l1, "d2/");
  TFILE(l1, "d2/x", "dir becomes file");
  tadd(l1, '6', "run/fifo", NULL, NULL, 0620);
  tadd(l1, '3', "dev/null", NULL, NULL, 0666);
  tadd(l1, '4', "dev/sda", NULL, NULL, 0660);
  char longname[300];
  long_name(longname, sizeof longname, "long/", 'n');
  tadd(l1, '0', longname, NULL, "gnu long name", 0644);
  char paxname[400];
  long_name(paxname, sizeof paxname, "pax/", 'p');
  tpax(l1, "path", paxname);
  tadd(l1, '0', "short-name-overridden", NULL, "pax long name", 0644);
  tpax(l1, "mtime", "1500000000.25");
  tadd(l1, '0', "paxtime", NULL, "t", 0644);
  tend(l1);

  TFILE(l2, "etc/passwd", "root:x:0:0::/root:/bin/bash\n");
  TFILE(l2, ".wh.gone", "");
  TFILE(l2, ".wh.gonedir", "");
  TFILE(l2, ".wh.never-existed", "");
  TFILE(l2, "usr/share/doc/.wh.a", "");
  TDIR(l2, "opq/");
  TFILE(l2, "opq/new", "new");
  TFILE(l2, "opq/.wh..wh..opq", ""); /* after opq/new: must not remove it */
  TFILE(l2, "same-layer", "kept");
  TFILE(l2, ".wh.same-layer", ""); /* whiteouts only hide lower layers */
  TDIR(l2, "repl/");
  TFILE(l2, "repl/inner", "in");
  TFILE(l2, "d2", "now a file");
  TFILE(l2, "newdir/auto/parents", "p"); /* parents not in the archive */
  tend(l2);
}

static void test_docker_save(void) {
  struct buf l1 = {0}, l2 = {0};
  make_docker_layers(&l1, &l2);
  struct buf *ls[] = {&l1, &l2};
  char *img = P("%s/docker.tar", T);
  docker_save(img, ls, 2, "[\"hutch/test:1\",\"hutch/test:latest\"]", NULL);

  char *root = new_dir("docker");
  struct hutch_image_config cfg;
  struct progress_log pl = {0};
  hutch_err err = HUTCH_ERR_INIT;
  int r = hutch_oci_import(img, NULL, root, &cfg, on_progress, &pl, &err);
  is_int(r, 0, "docker save: import (%s)", err.msg);

  char *s = slurp(root, "etc/passwd");
  is_str(s, "root:x:0:0::/root:/bin/bash\n", "layer 2 replaced etc/passwd");
  free(s);
  ok(!exists_at(root, "gone"), "whiteout removed a file of layer 1");
  ok(!exists_at(root, "gonedir"), "whiteout removed a directory tree of layer 1");
  ok(!exists_at(root, "usr/share/doc/a") && exists_at(root, "usr/share/doc/b"), "nested whiteout: a gone, b kept");
  ok(exists_at(root, "opq/new"), "opaque dir keeps what its own layer adds (marker after the entry)");
  ok(!exists_at(root, "opq/old1") && !exists_at(root, "opq/sub"), "opaque dir drops lower layers' contents");
  ok(exists_at(root, "same-layer"), "a whiteout does not hide an entry of its own layer");
  ok(!has_whiteout_files(root), "no .wh. file created anywhere");
  struct stat st;
  ok(lstat_at(root, "repl", &st) == 0 && S_ISDIR(st.st_mode) && exists_at(root, "repl/inner"),
     "a file replaced by a directory");
  ok(lstat_at(root, "d2", &st) == 0 && S_ISREG(st.st_mode), "a directory replaced by a file");
  ok(exists_at(root, "newdir/auto/parents"), "missing parent directories created");
  ok(lstat_at(root, "newdir/auto", &st) == 0 && (st.st_mode & 07777) == 0755, "created parents are 0755");

  ok(lstat_at(root, "bin/su", &st) == 0 && (st.st_mode & 07777) == 04755 && st.st_uid == 0,
     "setuid bit kept (mode %o)", st.st_mode & 07777);
  ok(lstat_at(root, "bin/sh", &st) == 0 && st.st_mtime == MTIME && st.st_nlink == 2, "mtime and a hard link");
  struct stat st2;
  ok(lstat_at(root, "bin/hardsh", &st2) == 0 && st2.st_ino == st.st_ino, "hard link shares the inode");
  char target[64] = "";
  char *lp = P("%s/bin/ls", root);
  ssize_t tl = readlink(lp, target, sizeof target - 1);
  if (tl > 0) target[tl] = 0;
  free(lp);
  is_str(target, "sh", "symlink target");
  ok(lstat_at(root, "bin/ls", &st) == 0 && S_ISLNK(st.st_mode) && st.st_mtime == MTIME, "symlink mtime (lutimes)");
  ok(lstat_at(root, "big-ids", &st) == 0 && st.st_uid == 65534 && st.st_gid == 65534 && (st.st_mode & 0777) == 0640,
     "ids >= 65536 clamped to 65534 (%u:%u)", st.st_uid, st.st_gid);
  ok(lstat_at(root, "mid-ids", &st) == 0 && st.st_uid == 1000 && st.st_gid == 65535, "ids below 65536 kept");
  ok(lstat_at(root, "run/fifo", &st) == 0 && S_ISFIFO(st.st_mode) && (st.st_mode & 07777) == 0620, "fifo created");
  ok(!exists_at(root, "dev/null") && !exists_at(root, "dev/sda"), "devices skipped");
  ok(lstat_at(root, "bin", &st) == 0 && st.st_mtime == MTIME, "directory mtime set after its contents");
  ok(lstat_at(root, "", &st) == 0 && (st.st_mode & 07777) == 0755, "`./` entry sets the root's mode");
  char longname[300];
  long_name(longname, sizeof longname, "long/", 'n');
  s = slurp(root, longname);
  is_str(s, "gnu long name", "GNU long name ('L')");
  free(s);
  char paxname[400];
  long_name(paxname, sizeof paxname, "pax/", 'p');
  s = slurp(root, paxname);
  is_str(s, "pax long name", "pax path");
  free(s);
  ok(!exists_at(root, "short-name-overridden"), "pax path overrides the header name");
  ok(lstat_at(root, "paxtime", &st) == 0 && st.st_mtim.tv_sec == 1500000000 && st.st_mtim.tv_nsec == 250000000,
     "pax mtime with fraction");

  is_int(cfg.n_env, 2, "config: 2 env entries");
  if (cfg.n_env == 2) {
    is_str(cfg.env[0], "PATH=/usr/bin:/bin", "config: Env[0]");
    is_str(cfg.env[1], "FOO=bar=baz", "config: Env[1]");
  }
  is_str(cfg.cwd, "/srv", "config: WorkingDir");
  is_str(cfg.user, "1000:1000", "config: User");
  ok(cfg.n_entrypoint == 2 && !strcmp(cfg.entrypoint[0], "/bin/sh") && !strcmp(cfg.entrypoint[1], "-c"),
     "config: Entrypoint");
  ok(cfg.n_cmd == 1 && !strcmp(cfg.cmd[0], "echo hi"), "config: Cmd");
  hutch_image_config_free(&cfg);

  ok(pl.calls == 3 && !strncmp(pl.first, "layer 1/2 (l1/layer.tar, ", 25) && pl.last_fraction == 1.0 && pl.monotonic,
     "progress: per layer then 1.0 (first `%s`, %d calls)", pl.first, pl.calls);

  /* By name. */
  const char *refs[] = {"hutch/test:1", "hutch/test", "docker.io/hutch/test:latest"};
  for (size_t i = 0; i < 3; i++) {
    char *rt = new_dir("docker-ref");
    hutch_err_clear(&err);
    r = hutch_oci_import(img, refs[i], rt, &cfg, NULL, NULL, &err);
    ok(r == 0 && exists_at(rt, "opq/new"), "ref `%s` found (%s)", refs[i], err.msg);
    hutch_image_config_free(&cfg);
    free(rt);
  }
  char *rt = new_dir("docker-ref");
  hutch_err_clear(&err);
  r = hutch_oci_import(img, "hutch/other:2", rt, &cfg, NULL, NULL, &err);
  ok(r == -1 && err.status == 404 && !strcmp(err.code, "not_found") && strstr(err.msg, "hutch/test:1"),
     "unknown ref: 404 naming what there is (%s)", err.msg);
  ok(dir_empty(rt), "unknown ref: nothing written");
  free(rt);

  /* Not empty root. */
  hutch_err_clear(&err);
  r = hutch_oci_import(img, NULL, root, &cfg, NULL, NULL, &err);
  ok(r == -1 && err.status == 500 && strstr(err.msg, "not empty"), "a non-empty root is refused (%s)", err.msg);

  free(root);
  free(img);
  bfree(&l1);
  bfree(&l2);
}

/* docker save of newer Docker: layers as blobs/sha256/<hex>, and a layer
 * that is a symlink to another member. */
static void test_docker_blobs_and_links(void) {
  struct buf l1 = {0};
  TFILE(&l1, "hello", "world");
  tend(&l1);
  char *ld = sha(l1.p, l1.n);
  char *ids = xasprintf("\"%s\",\"%s\"", ld, ld);
  char *config = xasprintf(CONFIG_FMT, ids);
  char *cd = sha(config, strlen(config));
  char *bl = xasprintf("blobs/sha256/%s", ld + 7), *bc = xasprintf("blobs/sha256/%s", cd + 7);
  char *manifest = xasprintf("[{\"Config\":\"%s\",\"RepoTags\":null,\"Layers\":[\"%s\",\"dup/layer.tar\"]}]", bc, bl);
  struct buf out = {0}, cb = {0}, mb = {0};
  bput(&cb, config, strlen(config));
  bput(&mb, manifest, strlen(manifest));
  char *rel = xasprintf("../%s", bl);
  tmember(&out, bc, &cb);
  tmember(&out, bl, &l1);
  TSYM(&out, "dup/layer.tar", rel);
  tmember(&out, "manifest.json", &mb);
  tend(&out);
  char *img = P("%s/docker-blobs.tar", T);
  write_buf(img, out.p, out.n);
  char *root = new_dir("docker-blobs");
  struct hutch_image_config cfg;
  hutch_err err = HUTCH_ERR_INIT;
  int r = hutch_oci_import(img, NULL, root, &cfg, NULL, NULL, &err);
  is_int(r, 0, "docker save with blobs/ layout and a symlinked layer (%s)", err.msg);
  char *s = slurp(root, "hello");
  is_str(s, "world", "content");
  free(s);
  hutch_image_config_free(&cfg);

  /* Same archive, corrupted blob name: the name is its digest. */
  bfree(&out);
  struct buf bad = {0};
  TFILE(&bad, "hello", "WORLD");
  tend(&bad);
  tmember(&out, bc, &cb);
  tmember(&out, bl, &bad);
  TSYM(&out, "dup/layer.tar", rel);
  tmember(&out, "manifest.json", &mb);
  tend(&out);
  write_buf(img, out.p, out.n);
  char *root2 = new_dir("docker-blobs");
  hutch_err_clear(&err);
  r = hutch_oci_import(img, NULL, root2, &cfg, NULL, NULL, &err);
  ok(r == -1 && err.status == 400 && strstr(err.msg, "layer 1/2") && strstr(err.msg, "digest mismatch"),
     "docker save: blob not matching its sha256 name: 400 (%s)", err.msg);
  ok(dir_empty(root2), "digest mismatch: nothing of the layer written");
  hutch_image_config_free(&cfg);

  free(root);
  free(root2);
  free(img);
  free(ld);
  free(ids);
  free(config);
  free(cd);
  free(bl);
  free(bc);
  free(manifest);
  free(rel);
  bfree(&out);
  bfree(&cb);
  bfree(&mb);
  bfree(&l1);
  bfree(&bad);
}

static void oci_layers(struct buf *p1, struct buf *p2, struct buf *g1, struct buf *z2) {
  TDIR(p1, "etc/");
  TFILE(p1, "etc/os-release", "ID=hutch\n");
  TFILE(p1, "etc/old", "old");
  tend(p1);
  TFILE(p2, "etc/.wh.old", "");
  TFILE(p2, "etc/zstd", "from a zstd layer");
  tend(p2);
  *g1 = gz(p1);
  *z2 = zst(p2);
}

static void test_oci_layout(void) {
  struct buf p1 = {0}, p2 = {0}, g1, z2;
  oci_layers(&p1, &p2, &g1, &z2);
  struct buf *stored[] = {&g1, &z2}, *plain[] = {&p1, &p2};
  char *dir = new_dir("oci-layout");
  size_t ms;
  char *md = oci_image(dir, stored, plain, 2, &ms);
  char *desc = xasprintf("{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"digest\":\"%s\",\"size\":%zu,"
                         "\"annotations\":{\"org.opencontainers.image.ref.name\":\"v1\"}}",
                         md, ms);
  oci_index(dir, desc);

  char *root = new_dir("oci-root");
  struct hutch_image_config cfg;
  struct progress_log pl = {0};
  hutch_err err = HUTCH_ERR_INIT;
  int r = hutch_oci_import(dir, NULL, root, &cfg, on_progress, &pl, &err);
  is_int(r, 0, "OCI layout dir with gzip and zstd layers (%s)", err.msg);
  char *s = slurp(root, "etc/os-release");
  is_str(s, "ID=hutch\n", "gzip layer content");
  free(s);
  s = slurp(root, "etc/zstd");
  is_str(s, "from a zstd layer", "zstd layer content");
  free(s);
  ok(!exists_at(root, "etc/old"), "whiteout across gzip/zstd layers");
  ok(!strncmp(pl.first, "layer 1/2 (sha256:", 18) && strstr(pl.first, "…, ") && strstr(pl.first, " MiB)"),
     "progress names the digest and size: `%s`", pl.first);
  is_str(cfg.cwd, "/srv", "OCI config: WorkingDir");
  hutch_image_config_free(&cfg);

  /* By annotation. */
  char *root2 = new_dir("oci-root");
  hutch_err_clear(&err);
  r = hutch_oci_import(dir, "example.com/img:v1", root2, &cfg, NULL, NULL, &err);
  ok(r == 0 && exists_at(root2, "etc/zstd"), "ref matched against the tag annotation (%s)", err.msg);
  hutch_image_config_free(&cfg);
  char *root3 = new_dir("oci-root");
  hutch_err_clear(&err);
  r = hutch_oci_import(dir, "img:v2", root3, &cfg, NULL, NULL, &err);
  ok(r == -1 && err.status == 404 && strstr(err.msg, "`v1`"), "OCI: missing ref is 404 (%s)", err.msg);
  hutch_image_config_free(&cfg);

  /* Packed as a tar. */
  struct buf t = {0};
  TFILE(&t, "oci-layout", "{\"imageLayoutVersion\":\"1.0.0\"}");
  char *idx = slurp(dir, "index.json");
  TFILE(&t, "index.json", idx);
  TDIR(&t, "blobs/");
  TDIR(&t, "blobs/sha256/");
  DIR *d = opendir(s = P("%s/blobs/sha256", dir));
  free(s);
  struct dirent *de;
  while (d && (de = readdir(d))) {
    if (de->d_name[0] == '.') continue;
    char *rel = xasprintf("blobs/sha256/%s", de->d_name);
    char *path = xasprintf("%s/%s", dir, rel);
    size_t n;
    char *data = read_file(path, 1 << 20, &n, NULL);
    struct buf bb = {0};
    bput(&bb, data, n);
    tmember(&t, rel, &bb);
    bfree(&bb);
    free(data);
    free(rel);
    free(path);
  }
  if (d) closedir(d);
  tend(&t);
  char *tarpath = P("%s/oci.tar", T);
  write_buf(tarpath, t.p, t.n);
  char *root4 = new_dir("oci-root");
  hutch_err_clear(&err);
  r = hutch_oci_import(tarpath, "v1", root4, &cfg, NULL, NULL, &err);
  ok(r == 0 && exists_at(root4, "etc/zstd") && !exists_at(root4, "etc/old"), "OCI layout packed as a tar (%s)",
     err.msg);
  hutch_image_config_free(&cfg);

  /* A compressed outer archive is refused, clearly. */
  struct buf tg = gz(&t);
  char *tgz = P("%s/oci.tar.gz", T);
  write_buf(tgz, tg.p, tg.n);
  char *root5 = new_dir("oci-root");
  hutch_err_clear(&err);
  r = hutch_oci_import(tgz, NULL, root5, &cfg, NULL, NULL, &err);
  ok(r == -1 && err.status == 400 && strstr(err.msg, "gzip-compressed archive is not supported"),
     "gzip outer archive: 400 (%s)", err.msg);
  hutch_image_config_free(&cfg);

  /* Digest check: one byte of the zstd layer changed (same size). */
  char *ld = sha(z2.p, z2.n);
  char *lpath = xasprintf("%s/blobs/sha256/%s", dir, ld + 7);
  struct buf z2bad = {0};
  bput(&z2bad, z2.p, z2.n);
  z2bad.p[z2bad.n - 5] ^= 0x40;
  write_buf(lpath, z2bad.p, z2bad.n);
  char *root6 = new_dir("oci-root");
  hutch_err_clear(&err);
  r = hutch_oci_import(dir, NULL, root6, &cfg, NULL, NULL, &err);
  ok(r == -1 && err.status == 400 && strstr(err.msg, "layer 2/2 (sha256:") && strstr(err.msg, "digest mismatch") &&
         strstr(err.msg, ld),
     "OCI: a layer whose bytes do not match its digest: 400 (%s)", err.msg);
  ok(exists_at(root6, "etc/old"), "digest mismatch: layer 2 not applied (its whiteout neither)");
  hutch_image_config_free(&cfg);
  /* Size mismatch (descriptor says otherwise). */
  bput(&z2bad, "x", 1);
  write_buf(lpath, z2bad.p, z2bad.n);
  char *root7 = new_dir("oci-root");
  hutch_err_clear(&err);
  r = hutch_oci_import(dir, NULL, root7, &cfg, NULL, NULL, &err);
  ok(r == -1 && err.status == 400 && strstr(err.msg, "size mismatch") && dir_empty(root7),
     "OCI: size mismatch found before anything is written (%s)", err.msg);
  hutch_image_config_free(&cfg);
  write_buf(lpath, z2.p, z2.n);
  /* The manifest blob tampered. */
  char *mpath = xasprintf("%s/blobs/sha256/%s", dir, md + 7);
  char *m = slurp(dir, mpath + strlen(dir) + 1);
  m[strlen(m) - 1] = ' '; /* "}" -> " ": same size */
  write_buf(mpath, m, strlen(m));
  char *root8 = new_dir("oci-root");
  hutch_err_clear(&err);
  r = hutch_oci_import(dir, NULL, root8, &cfg, NULL, NULL, &err);
  ok(r == -1 && err.status == 400 && strstr(err.msg, "manifest sha256:") && strstr(err.msg, "digest mismatch"),
     "OCI: tampered manifest: 400 (%s)", err.msg);
  hutch_image_config_free(&cfg);

  free(m);
  free(mpath);
  free(ld);
  free(lpath);
  bfree(&z2bad);
  free(tgz);
  bfree(&tg);
  free(tarpath);
  free(idx);
  bfree(&t);
  free(root);
  free(root2);
  free(root3);
  free(root4);
  free(root5);
  free(root6);
  free(root7);
  free(root8);
  free(desc);
  free(md);
  free(dir);
  bfree(&p1);
  bfree(&p2);
  bfree(&g1);
  bfree(&z2);
}

/* index.json -> image index (two platforms) -> manifests. */
static void test_oci_platforms(void) {
  char *dir = new_dir("oci-multi");
  struct buf a = {0}, b = {0};
  TFILE(&a, "arch", "arm64");
  tend(&a);
  TFILE(&b, "arch", "amd64");
  tend(&b);
  struct buf *sa[] = {&a}, *sb[] = {&b};
  size_t na, nb;
  char *ma = oci_image(dir, sa, sa, 1, &na), *mb = oci_image(dir, sb, sb, 1, &nb);
  char *list = xasprintf(
      "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.index.v1+json\",\"manifests\":["
      "{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"digest\":\"%s\",\"size\":%zu,"
      "\"platform\":{\"os\":\"linux\",\"architecture\":\"arm64\"}},"
      "{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"digest\":\"%s\",\"size\":%zu,"
      "\"platform\":{\"os\":\"linux\",\"architecture\":\"amd64\"}}]}",
      ma, na, mb, nb);
  char *ld = put_blob(dir, list, strlen(list));
  char *desc = xasprintf("{\"mediaType\":\"application/vnd.oci.image.index.v1+json\",\"digest\":\"%s\",\"size\":%zu}",
                         ld, strlen(list));
  oci_index(dir, desc);
  char *root = new_dir("oci-multi-root");
  struct hutch_image_config cfg;
  hutch_err err = HUTCH_ERR_INIT;
  int r = hutch_oci_import(dir, NULL, root, &cfg, NULL, NULL, &err);
  is_int(r, 0, "image index with two platforms (%s)", err.msg);
#if defined(__x86_64__)
  char *s = slurp(root, "arch");
  is_str(s, "amd64", "linux/amd64 picked, not the first entry");
  free(s);
#endif
  hutch_image_config_free(&cfg);
  free(root);
  free(desc);
  free(ld);
  free(list);
  free(ma);
  free(mb);
  free(dir);
  bfree(&a);
  bfree(&b);
}

/* A one-layer docker save of `layer`; returns the import's result. */
static int import_one(struct buf *layer, hutch_err *err, char **root_out) {
  char *img = P("%s/one.tar", T);
  struct buf *ls[] = {layer};
  docker_save(img, ls, 1, "[]", NULL);
  char *root = new_dir("bad");
  struct hutch_image_config cfg;
  hutch_err_clear(err);
  int r = hutch_oci_import(img, NULL, root, &cfg, NULL, NULL, err);
  hutch_image_config_free(&cfg);
  free(img);
  if (root_out) *root_out = root;
  else free(root);
  return r;
}

static void test_bad_inputs(void) {
  hutch_err err = HUTCH_ERR_INIT;
  char *root;
  struct hutch_image_config cfg;

  /* Header checksum. */
  struct buf l = {0};
  TFILE(&l, "a", "aaaa");
  TFILE(&l, "b", "bbbb");
  tend(&l);
  l.p[1024 + 10] ^= 1; /* the second header (a's header + one data block before it) */
  int r = import_one(&l, &err, &root);
  ok(r == -1 && err.status == 400 && !strcmp(err.code, "invalid_argument") && strstr(err.msg, "layer 1/1") &&
         strstr(err.msg, "tar header checksum mismatch at offset 1024"),
     "bad checksum: 400 naming layer and offset (%s)", err.msg);
  ok(dir_empty(root), "bad checksum: the layer changed nothing (checked before extraction)");
  free(root);
  bfree(&l);

  /* Truncated in a file's data. */
  TFILE(&l, "a", "aaaa");
  char big[3000];
  memset(big, 'z', sizeof big - 1);
  big[sizeof big - 1] = 0;
  TFILE(&l, "b", big);
  l.n = 1024 + 512 + 700;
  r = import_one(&l, &err, NULL);
  ok(r == -1 && err.status == 400 && strstr(err.msg, "unexpected end of archive"), "truncated data: 400 (%s)",
     err.msg);
  /* Truncated in a header. */
  l.n = 1024 + 100;
  r = import_one(&l, &err, NULL);
  ok(r == -1 && err.status == 400 && strstr(err.msg, "truncated tar header at offset 1024"),
     "truncated header: 400 (%s)", err.msg);
  bfree(&l);

  /* Truncated gzip / zstd. */
  TFILE(&l, "a", big);
  tend(&l);
  struct buf g = gz(&l), z = zst(&l);
  g.n -= 20;
  z.n -= 20;
  r = import_one(&g, &err, NULL);
  ok(r == -1 && err.status == 400 && strstr(err.msg, "gzip"), "truncated gzip: 400 (%s)", err.msg);
  r = import_one(&z, &err, NULL);
  ok(r == -1 && err.status == 400 && strstr(err.msg, "zstd"), "truncated zstd: 400 (%s)", err.msg);
  bfree(&g);
  bfree(&z);
  /* xz is refused by name. */
  struct buf xz = {0};
  bput(&xz, "\xfd" "7zXZ\0\0\0\0\0\0\0\0\0\0\0\0", 16);
  r = import_one(&xz, &err, NULL);
  ok(r == -1 && err.status == 400 && strstr(err.msg, "xz compression is not supported"), "xz layer: 400 (%s)",
     err.msg);
  bfree(&xz);
  bfree(&l);

  /* Names too long: GNU 'L', pax path. */
  char longname[5000];
  memset(longname, 'a', sizeof longname - 1);
  longname[sizeof longname - 1] = 0;
  TFILE(&l, longname, "x");
  tend(&l);
  r = import_one(&l, &err, NULL);
  ok(r == -1 && err.status == 400 && strstr(err.msg, "name longer than 4096 bytes"), "GNU long name > 4096: 400 (%s)",
     err.msg);
  bfree(&l);
  tpax(&l, "path", longname);
  TFILE(&l, "short", "x");
  tend(&l);
  r = import_one(&l, &err, NULL);
  ok(r == -1 && err.status == 400 && strstr(err.msg, "`path` longer than 4096 bytes"), "pax path > 4096: 400 (%s)",
     err.msg);
  bfree(&l);
  /* A pax header over 1 MiB. */
  raw_hdr(&l, "PaxHeaders/x", 'x', 0644, 0, 0, 0, NULL, (2u << 20));
  r = import_one(&l, &err, NULL);
  ok(r == -1 && err.status == 400 && strstr(err.msg, "pax header larger than"), "pax header > 1 MiB: 400 (%s)",
     err.msg);
  bfree(&l);
  /* Malformed pax record. */
  raw_hdr(&l, "PaxHeaders/x", 'x', 0644, 0, 0, 0, NULL, 12);
  bput(&l, "99 path=abc\n", 12);
  pad(&l);
  TFILE(&l, "x", "x");
  tend(&l);
  r = import_one(&l, &err, NULL);
  ok(r == -1 && err.status == 400 && strstr(err.msg, "malformed pax header at offset 0"), "bad pax record: 400 (%s)",
     err.msg);
  bfree(&l);
  /* Unsupported entry type, sparse. */
  tadd(&l, 'S', "sparse", NULL, "", 0644);
  tend(&l);
  r = import_one(&l, &err, NULL);
  ok(r == -1 && err.status == 400 && strstr(err.msg, "entry `sparse` at offset 0: sparse files are not supported"),
     "sparse entry: 400 (%s)", err.msg);
  bfree(&l);
  /* Hard link to nothing. */
  TLINK(&l, "hl", "missing");
  tend(&l);
  r = import_one(&l, &err, NULL);
  ok(r == -1 && err.status == 400 && strstr(err.msg, "hard link target `missing`"), "hard link to nothing: 400 (%s)",
     err.msg);
  bfree(&l);
  /* A file where a directory is needed. */
  TFILE(&l, "f", "x");
  TFILE(&l, "f/g", "x");
  tend(&l);
  r = import_one(&l, &err, NULL);
  ok(r == -1 && err.status == 400 && strstr(err.msg, "entry `f/g`") && strstr(err.msg, "Not a directory"),
     "a file as a parent: 400 (%s)", err.msg);
  bfree(&l);

  /* diff_id mismatch (docker save config). */
  TFILE(&l, "a", "a");
  tend(&l);
  char *bad_config = xasprintf(CONFIG_FMT, "\"sha256:0000000000000000000000000000000000000000000000000000000000000000\"");
  char *img = P("%s/diffid.tar", T);
  struct buf *ls[] = {&l};
  docker_save(img, ls, 1, "[]", bad_config);
  root = new_dir("bad");
  hutch_err_clear(&err);
  r = hutch_oci_import(img, NULL, root, &cfg, NULL, NULL, &err);
  ok(r == -1 && err.status == 400 && strstr(err.msg, "diff_id") && strstr(err.msg, "mismatch"),
     "diff_id mismatch: 400 (%s)", err.msg);
  hutch_image_config_free(&cfg);
  free(root);
  free(bad_config);
  /* diff_ids count wrong. */
  bad_config = xasprintf(CONFIG_FMT, "");
  docker_save(img, ls, 1, "[]", bad_config);
  root = new_dir("bad");
  hutch_err_clear(&err);
  r = hutch_oci_import(img, NULL, root, &cfg, NULL, NULL, &err);
  ok(r == -1 && err.status == 400 && strstr(err.msg, "lists 0 layers"), "diff_ids count: 400 (%s)", err.msg);
  hutch_image_config_free(&cfg);
  free(root);
  free(bad_config);
  /* Bad config types. */
  docker_save(img, ls, 1, "[]", "{\"config\":{\"Env\":\"PATH=/bin\"}}");
  root = new_dir("bad");
  hutch_err_clear(&err);
  r = hutch_oci_import(img, NULL, root, &cfg, NULL, NULL, &err);
  ok(r == -1 && err.status == 400 && strstr(err.msg, "`config.Env` must be an array of strings"),
     "config Env not an array: 400 (%s)", err.msg);
  hutch_image_config_free(&cfg);
  free(root);
  bfree(&l);

  /* Missing manifest. */
  TFILE(&l, "hello", "not an image");
  tend(&l);
  write_buf(img, l.p, l.n);
  root = new_dir("bad");
  hutch_err_clear(&err);
  r = hutch_oci_import(img, NULL, root, &cfg, NULL, NULL, &err);
  ok(r == -1 && err.status == 400 && strstr(err.msg, "neither manifest.json (docker save) nor index.json"),
     "no manifest.json, no index.json: 400 (%s)", err.msg);
  hutch_image_config_free(&cfg);
  free(root);
  bfree(&l);
  /* manifest.json not JSON; layer missing. */
  TFILE(&l, "manifest.json", "[{\"Config\":");
  tend(&l);
  write_buf(img, l.p, l.n);
  root = new_dir("bad");
  hutch_err_clear(&err);
  r = hutch_oci_import(img, NULL, root, &cfg, NULL, NULL, &err);
  ok(r == -1 && err.status == 400 && strstr(err.msg, "manifest.json: invalid JSON"), "manifest.json not JSON: 400 (%s)",
     err.msg);
  hutch_image_config_free(&cfg);
  free(root);
  bfree(&l);
  TFILE(&l, "manifest.json", "[{\"Config\":\"c.json\",\"Layers\":[\"nope/layer.tar\"]}]");
  TFILE(&l, "c.json", "{}");
  tend(&l);
  write_buf(img, l.p, l.n);
  root = new_dir("bad");
  hutch_err_clear(&err);
  r = hutch_oci_import(img, NULL, root, &cfg, NULL, NULL, &err);
  ok(r == -1 && err.status == 400 && strstr(err.msg, "layer 1/1: `nope/layer.tar` not found"),
     "a layer missing from the archive: 400 (%s)", err.msg);
  hutch_image_config_free(&cfg);
  free(root);
  bfree(&l);
  /* Outer tar truncated. */
  TFILE(&l, "manifest.json", big);
  l.n = 512 + 100;
  write_buf(img, l.p, l.n);
  root = new_dir("bad");
  hutch_err_clear(&err);
  r = hutch_oci_import(img, NULL, root, &cfg, NULL, NULL, &err);
  ok(r == -1 && err.status == 400 && strstr(err.msg, "truncated"), "truncated outer archive: 400 (%s)", err.msg);
  hutch_image_config_free(&cfg);
  free(root);
  bfree(&l);
  /* Source missing. */
  root = new_dir("bad");
  hutch_err_clear(&err);
  r = hutch_oci_import("/nonexistent/image.tar", NULL, root, &cfg, NULL, NULL, &err);
  ok(r == -1 && err.status == 400, "missing source: 400 (%s)", err.msg);
  hutch_image_config_free(&cfg);
  free(root);
  free(img);

  /* Garbage straight into the extractor. */
  root = new_dir("bad");
  int rfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  unsigned char junk[2048];
  for (size_t i = 0; i < sizeof junk; i++) junk[i] = (unsigned char)(i * 7 + 3);
  hutch_err_clear(&err);
  r = hutch_tar_extract_mem(junk, sizeof junk, rfd, &err);
  ok(r == -1 && err.status == 400 && strstr(err.msg, "checksum mismatch at offset 0"), "garbage: 400 (%s)", err.msg);
  hutch_err_clear(&err);
  r = hutch_tar_extract_mem("", 0, rfd, &err);
  ok(r == 0 && dir_empty(root), "an empty layer is an empty tar");
  close(rfd);
  free(root);
}

/* ---- escapes ----------------------------------------------------------- */

/* A state string of base/ (its names) and base/sentinel (everything). */
static void snap_dir(const char *dir, const char *rel, char **acc) {
  char *path = rel[0] ? xasprintf("%s/%s", dir, rel) : xstrdup(dir);
  DIR *d = opendir(path);
  struct dirent *de;
  char *names[64];
  int n = 0;
  while (d && (de = readdir(d)) && n < 64)
    if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) names[n++] = xstrdup(de->d_name);
  if (d) closedir(d);
  for (int i = 0; i < n; i++)
    for (int k = i + 1; k < n; k++)
      if (strcmp(names[i], names[k]) > 0) {
        char *t = names[i];
        names[i] = names[k];
        names[k] = t;
      }
  for (int i = 0; i < n; i++) {
    char *r = rel[0] ? xasprintf("%s/%s", rel, names[i]) : xstrdup(names[i]);
    struct stat st;
    char *full = xasprintf("%s/%s", dir, r);
    lstat(full, &st);
    char *content = S_ISREG(st.st_mode) ? read_file(full, 1 << 20, NULL, NULL) : NULL;
    /* The root itself changes, of course: only its name counts. */
    char *t = !strcmp(r, "root") ? xasprintf("%sroot\n", *acc)
                                 : xasprintf("%s%s %o %lu %lld %ld %s\n", *acc, r, st.st_mode,
                                             (unsigned long)st.st_nlink, (long long)st.st_size, (long)st.st_mtime,
                                             content ? content : "");
    free(*acc);
    *acc = t;
    if (S_ISDIR(st.st_mode) && strcmp(r, "root")) snap_dir(dir, r, acc);
    free(content);
    free(full);
    free(r);
    free(names[i]);
  }
  free(path);
}

static char *snap(const char *base) {
  char *acc = xstrdup("");
  snap_dir(base, "", &acc);
  return acc;
}

static void make_sentinel(const char *base) {
  char *s = xasprintf("%s/sentinel", base), *f = xasprintf("%s/sentinel/host-file", base);
  rm_rf(s, NULL);
  mkdir(s, 0755);
  write_buf(f, "original", 8);
  struct timespec ts[2] = {{1000000000, 0}, {1000000000, 0}};
  utimensat(AT_FDCWD, f, ts, 0);
  utimensat(AT_FDCWD, s, ts, 0);
  free(s);
  free(f);
}

struct esc {
  char *base, *root, *before;
  int rootfd;
};

static void esc_begin(struct esc *e) {
  e->base = new_dir("escape");
  e->root = xasprintf("%s/root", e->base);
  mkdir(e->root, 0755);
  make_sentinel(e->base);
  e->before = snap(e->base);
  e->rootfd = open(e->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

static bool esc_untouched(struct esc *e) {
  char *now = snap(e->base);
  bool same = !strcmp(now, e->before);
  if (!same) printf("# before:\n%s# now:\n%s", e->before, now);
  free(now);
  return same;
}

/* Positive control: writing through `rel` the naive way changes the
 * sentinel, and the check sees it.  Restores the sentinel. */
static bool naive_write_escapes(struct esc *e, const char *joined) {
  int fd = open(joined, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd >= 0) {
    if (write(fd, "pwned", 5) != 5) printf("# short write\n");
    close(fd);
  }
  char *now = snap(e->base);
  bool changed = strcmp(now, e->before) != 0;
  free(now);
  make_sentinel(e->base);
  char *again = snap(e->base);
  if (strcmp(again, e->before)) printf("# sentinel not restored\n");
  free(again);
  return changed;
}

static void esc_end(struct esc *e) {
  close(e->rootfd);
  free(e->base);
  free(e->root);
  free(e->before);
}

static int extract(struct esc *e, struct buf *l, hutch_err *err) {
  hutch_err_clear(err);
  return hutch_tar_extract_mem(l->p, l->n, e->rootfd, err);
}

static void test_escapes(void) {
  hutch_err err = HUTCH_ERR_INIT;
  struct esc e;
  struct buf l = {0};
  int r;

  /* 1. "../sentinel/host-file" */
  esc_begin(&e);
  TFILE(&l, "../sentinel/host-file", "pwned");
  tend(&l);
  r = extract(&e, &l, &err);
  ok(r == 0 && esc_untouched(&e), "`../` entry: sentinel untouched (%s)", err.msg);
  char *s = slurp(e.root, "sentinel/host-file");
  is_str(s, "pwned", "`../` entry landed inside the root");
  free(s);
  char *j = xasprintf("%s/../sentinel/host-file", e.root);
  ok(naive_write_escapes(&e, j), "positive control: the joined `../` path reaches the sentinel");
  free(j);
  esc_end(&e);
  bfree(&l);

  /* 2. absolute path */
  esc_begin(&e);
  char *abs = xasprintf("%s/sentinel/host-file", e.base);
  TFILE(&l, abs, "pwned");
  tend(&l);
  r = extract(&e, &l, &err);
  ok(r == 0 && esc_untouched(&e), "absolute entry: sentinel untouched (%s)", err.msg);
  ok(exists_at(e.root, abs + 1), "absolute entry landed inside the root");
  ok(naive_write_escapes(&e, abs), "positive control: the absolute path is the sentinel");
  free(abs);
  esc_end(&e);
  bfree(&l);

  /* 3. symlink then write, same layer: relative ".." and absolute. */
  esc_begin(&e);
  char *absdir = xasprintf("%s/sentinel", e.base);
  TSYM(&l, "up", "..");
  TFILE(&l, "up/sentinel/host-file", "pwned");
  TSYM(&l, "deep", "../../../../../../../../..");
  TFILE(&l, "deep/x", "pwned");
  TSYM(&l, "abs", absdir);
  TFILE(&l, "abs/host-file", "pwned");
  tend(&l);
  r = extract(&e, &l, &err);
  ok(esc_untouched(&e), "symlink then write in one layer: sentinel untouched (r=%d, %s)", r, err.msg);
  ok(r == -1 && err.status == 400 && strstr(err.msg, "entry `abs/host-file`"),
     "a write through a symlink whose in-root target is missing: 400 (%s)", err.msg);
  s = slurp(e.root, "sentinel/host-file");
  is_str(s, "pwned", "`up/` (up -> ..) resolved to the root itself");
  free(s);
  ok(exists_at(e.root, "x"), "`deep/x` (deep -> ../../..) landed at the root");
  j = xasprintf("%s/up/sentinel/host-file", e.root);
  ok(naive_write_escapes(&e, j), "positive control: open() through the planted `up` symlink reaches the sentinel");
  free(j);
  j = xasprintf("%s/abs/host-file", e.root);
  ok(naive_write_escapes(&e, j), "positive control: open() through the planted `abs` symlink reaches the sentinel");
  free(j);
  esc_end(&e);
  bfree(&l);

  /* 4. across layers (through a full docker save import): layer 1 plants
   * symlinks, layer 2 writes, hard-links and whites out through them. */
  esc_begin(&e);
  free(absdir);
  absdir = xasprintf("%s/sentinel", e.base);
  struct buf l1 = {0}, l2 = {0};
  TSYM(&l1, "up", "..");
  TSYM(&l1, "abs", absdir);
  TDIR(&l1, absdir); /* so that abs/ exists inside the root too */
  TDIR(&l1, "sentinel/");
  TFILE(&l1, "sentinel/host-file", "in-root copy");
  tend(&l1);
  TFILE(&l2, "abs/host-file", "pwned via abs");
  TFILE(&l2, "up/sentinel/other", "pwned via up");
  TLINK(&l2, "hl", "up/sentinel/host-file");
  TFILE(&l2, "up/.wh.nothing", "");
  tend(&l2);
  char *img = P("%s/escape.tar", e.base);
  struct buf *ls[] = {&l1, &l2};
  docker_save(img, ls, 2, "[]", NULL);
  struct hutch_image_config cfg;
  hutch_err_clear(&err);
  r = hutch_oci_import(img, NULL, e.root, &cfg, NULL, NULL, &err);
  hutch_image_config_free(&cfg);
  unlink(img);
  free(img);
  ok(r == 0, "cross-layer symlink writes import (%s)", err.msg);
  ok(esc_untouched(&e), "cross-layer: sentinel untouched");
  char *inroot = xasprintf("%s/host-file", absdir + 1);
  s = slurp(e.root, inroot);
  is_str(s, "pwned via abs", "abs/host-file landed at root/<abs target>");
  free(s);
  free(inroot);
  s = slurp(e.root, "sentinel/other");
  is_str(s, "pwned via up", "up/sentinel/other landed at root/sentinel/other");
  free(s);
  struct stat st1, st2;
  ok(lstat_at(e.root, "hl", &st1) == 0 && lstat_at(e.root, "sentinel/host-file", &st2) == 0 &&
         st1.st_ino == st2.st_ino,
     "hard link through `up` linked the in-root file");
  j = xasprintf("%s/abs/host-file", e.root);
  ok(naive_write_escapes(&e, j), "positive control: open() through layer 1's `abs` reaches the sentinel");
  free(j);
  j = xasprintf("%s/up/sentinel/host-file", e.root);
  ok(naive_write_escapes(&e, j), "positive control: open() through layer 1's `up` reaches the sentinel");
  free(j);
  esc_end(&e);
  bfree(&l1);
  bfree(&l2);

  /* 5. hard links to outside. */
  esc_begin(&e);
  free(absdir);
  absdir = xasprintf("%s/sentinel", e.base);
  TLINK(&l, "hl1", "../sentinel/host-file");
  tend(&l);
  r = extract(&e, &l, &err);
  ok(r == -1 && err.status == 400 && esc_untouched(&e), "hard link to `../sentinel/host-file`: 400, untouched (%s)",
     err.msg);
  bfree(&l);
  char *abstarget = xasprintf("%s/sentinel/host-file", e.base);
  TSYM(&l, "s", absdir);
  TLINK(&l, "hl2", "s/host-file");
  TLINK(&l, "hl3", abstarget);
  tend(&l);
  r = extract(&e, &l, &err);
  ok(r == -1 && err.status == 400 && esc_untouched(&e), "hard link through a symlink to outside: 400 (%s)", err.msg);
  bfree(&l);
  TLINK(&l, "hl3", abstarget);
  tend(&l);
  r = extract(&e, &l, &err);
  ok(r == -1 && err.status == 400 && esc_untouched(&e), "hard link to an absolute host path: 400 (%s)", err.msg);
  bfree(&l);
  /* Positive control: the naive link(2) of the joined path does link the
   * sentinel (its link count, in the snapshot, changes). */
  char *from = xasprintf("%s/s/host-file", e.root), *to = xasprintf("%s/naive-hl", e.root);
  int lr = link(from, to);
  if (lr < 0) printf("# link %s: %s\n", from, strerror(errno));
  char *now = snap(e.base);
  ok(lr == 0 && strcmp(now, e.before), "positive control: link() through `s` links the sentinel");
  free(now);
  unlink(to);
  ok(esc_untouched(&e), "sentinel back to its state");
  free(from);
  free(to);
  free(abstarget);
  /* Writes through an in-root hard link do not reach the host either. */
  TFILE(&l, "inroot", "x");
  TLINK(&l, "hl4", "inroot");
  TLINK(&l, "hl5", "../../inroot");
  tend(&l);
  r = extract(&e, &l, &err);
  ok(r == 0 && esc_untouched(&e), "in-root hard links (`../../inroot` cleaned) (%s)", err.msg);
  ok(lstat_at(e.root, "hl5", &st1) == 0 && lstat_at(e.root, "inroot", &st2) == 0 && st1.st_ino == st2.st_ino &&
         st1.st_nlink == 3,
     "three names, one inode");
  esc_end(&e);
  bfree(&l);

  /* 6. whiteouts through symlinks and `..`. */
  esc_begin(&e);
  free(absdir);
  absdir = xasprintf("%s/sentinel", e.base);
  TSYM(&l1, "up", "..");
  TSYM(&l1, "abs", absdir);
  TDIR(&l1, "sentinel/");
  TFILE(&l1, "sentinel/host-file", "in-root");
  tend(&l1);
  r = extract(&e, &l1, &err);
  ok(r == 0, "whiteout escape: layer 1 (%s)", err.msg);
  TFILE(&l2, "up/sentinel/.wh.host-file", "");
  TFILE(&l2, "abs/.wh.host-file", "");
  TFILE(&l2, "../.wh.sentinel", "");
  TFILE(&l2, "up/.wh..wh..opq", "");
  tend(&l2);
  r = extract(&e, &l2, &err);
  ok(r == 0 && esc_untouched(&e), "whiteouts through `up`, `abs` and `..`: sentinel untouched (%s)", err.msg);
  ok(dir_empty(e.root), "the opaque marker through `up` emptied the root, not its parent");
  /* Positive control: the naive removal of the joined path (layer 1's
   * symlink again, the root having been emptied). */
  bfree(&l1);
  TSYM(&l1, "up", "..");
  tend(&l1);
  extract(&e, &l1, &err);
  char *naive = xasprintf("%s/up/sentinel/host-file", e.root);
  unlink(naive);
  now = snap(e.base);
  ok(strcmp(now, e.before) != 0, "positive control: unlink() through `up` removes the sentinel file");
  free(now);
  free(naive);
  make_sentinel(e.base);
  esc_end(&e);
  bfree(&l1);
  bfree(&l2);
  free(absdir);

  /* 7. a symlink as the last component is replaced, never followed. */
  esc_begin(&e);
  char *hostfile = xasprintf("%s/sentinel/host-file", e.base);
  TSYM(&l, "f", hostfile);
  TFILE(&l, "f", "replaced");
  TSYM(&l, "d", absdir = xasprintf("%s/sentinel", e.base));
  tadd(&l, '5', "d", NULL, NULL, 0700);
  TSYM(&l, "p", hostfile);
  tadd(&l, '6', "p", NULL, NULL, 0600);
  tend(&l);
  r = extract(&e, &l, &err);
  ok(r == 0 && esc_untouched(&e), "file/dir/fifo over a symlink to the host: sentinel untouched (%s)", err.msg);
  ok(lstat_at(e.root, "f", &st1) == 0 && S_ISREG(st1.st_mode) && lstat_at(e.root, "d", &st2) == 0 &&
         S_ISDIR(st2.st_mode) && (st2.st_mode & 0777) == 0700,
     "the symlinks were replaced");
  j = xasprintf("%s/naive-f", e.root);
  if (symlink(hostfile, j) < 0) printf("# symlink: %s\n", strerror(errno));
  ok(naive_write_escapes(&e, j), "positive control: open() without O_NOFOLLOW on such a symlink writes the sentinel");
  free(j);
  free(hostfile);
  free(absdir);
  esc_end(&e);
  bfree(&l);
}

/* Regressions and corners: found by fuzz_tar or worth pinning down. */
static void test_corners(void) {
  hutch_err err = HUTCH_ERR_INIT;
  struct buf l = {0};
  char *root = new_dir("corners");
  int rfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

  /* fuzz_tar: the message of a malformed whiteout used a freed name. */
  TFILE(&l, "d/.wh.", "");
  tend(&l);
  hutch_err_clear(&err);
  int r = hutch_tar_extract_mem(l.p, l.n, rfd, &err);
  ok(r == -1 && err.status == 400 && strstr(err.msg, "malformed whiteout name `.wh.`"),
     "malformed whiteout name: 400 (%s)", err.msg);
  bfree(&l);
  TFILE(&l, "a/.wh.b/c", "x");
  tend(&l);
  hutch_err_clear(&err);
  r = hutch_tar_extract_mem(l.p, l.n, rfd, &err);
  ok(r == -1 && err.status == 400 && strstr(err.msg, "whiteout name `.wh.b` used as a directory"),
     "a whiteout name as a directory: 400 (%s)", err.msg);
  ok(dir_empty(root), "nothing written by either");
  bfree(&l);

  /* A deep tree removed by a whiteout (iterative, one fd at a time). */
  char *p = xstrdup(root);
  for (int i = 0; i < 300; i++) {
    char *q = xasprintf("%s/%s", p, i ? "d" : "deep");
    free(p);
    p = q;
    if (mkdir(p, 0755) < 0) break;
  }
  char *f = xasprintf("%s/file", p);
  write_buf(f, "x", 1);
  free(f);
  free(p);
  TFILE(&l, ".wh.deep", "");
  tend(&l);
  hutch_err_clear(&err);
  r = hutch_tar_extract_mem(l.p, l.n, rfd, &err);
  ok(r == 0 && dir_empty(root), "whiteout of a 300-level tree (%s)", err.msg);
  bfree(&l);

  /* gzip with two members (concatenated), zstd with two frames. */
  struct buf a = {0}, b = {0};
  TFILE(&a, "one", "1");
  TFILE(&b, "two", "2");
  tend(&b);
  struct buf ga = gz(&a), gb = gz(&b), za = zst(&a), zb = zst(&b);
  bput(&ga, gb.p, gb.n);
  bput(&za, zb.p, zb.n);
  hutch_err_clear(&err);
  r = hutch_tar_extract_mem(ga.p, ga.n, rfd, &err);
  ok(r == 0 && exists_at(root, "one") && exists_at(root, "two"), "multi-member gzip (%s)", err.msg);
  char *one = xasprintf("%s/one", root), *two = xasprintf("%s/two", root);
  unlink(one);
  unlink(two);
  hutch_err_clear(&err);
  r = hutch_tar_extract_mem(za.p, za.n, rfd, &err);
  ok(r == 0 && exists_at(root, "one") && exists_at(root, "two"), "multi-frame zstd (%s)", err.msg);
  unlink(one);
  unlink(two);
  free(one);
  free(two);
  bfree(&a);
  bfree(&b);
  bfree(&ga);
  bfree(&gb);
  bfree(&za);
  bfree(&zb);

  /* Base-256 numbers (GNU) for uid and size, v7 header without magic. */
  struct ent e = {'0', "b256", NULL, "abc", 3, 0644, 0, 0, MTIME};
  tadd_e(&l, &e);
  l.p[108] = 0x80; /* uid field: base-256 */
  memset(l.p + 109, 0, 6);
  l.p[115] = 42;
  memset(l.p + 257, 0, 8); /* no ustar magic */
  memset(l.p + 148, ' ', 8);
  unsigned sum = 0;
  for (int i = 0; i < 512; i++) sum += l.p[i];
  octal(l.p + 148, 7, sum);
  l.p[155] = ' ';
  tend(&l);
  hutch_err_clear(&err);
  r = hutch_tar_extract_mem(l.p, l.n, rfd, &err);
  struct stat st;
  ok(r == 0 && lstat_at(root, "b256", &st) == 0 && st.st_uid == 42 && st.st_size == 3,
     "base-256 uid in a v7 header (%s)", err.msg);
  bfree(&l);

  /* A fifo as the image source is refused, without blocking. */
  char *fifo = xasprintf("%s/fifo", T);
  mkfifo(fifo, 0600);
  char *r2 = new_dir("corners");
  struct hutch_image_config cfg;
  hutch_err_clear(&err);
  r = hutch_oci_import(fifo, NULL, r2, &cfg, NULL, NULL, &err);
  ok(r == -1 && err.status == 400 && strstr(err.msg, "not a file or directory"), "a fifo as source: 400 (%s)",
     err.msg);
  hutch_image_config_free(&cfg);
  free(r2);
  free(fifo);
  close(rfd);
  free(root);
}

int main(void) {
  if (geteuid() != 0) skip_all("needs root (chown, hard links of other users' files)");
  if (!mkdtemp(T)) skip_all("mkdtemp failed");
  umask(022);
  test_clean_path();
  test_docker_save();
  test_docker_blobs_and_links();
  test_oci_layout();
  test_oci_platforms();
  test_bad_inputs();
  test_escapes();
  test_corners();
  rm_rf(T, NULL);
  return done_testing();
}
