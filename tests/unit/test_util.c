/* Shared helpers (src/lib/common/util.c, err.c): the error chain, number
 * parsing, random ids and the file-tree helpers that run on sandbox roots
 * (which must never follow a symlink out of the tree). */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/err.h"
#include "common/util.h"
#include "tap.h"

/* Regression tests for bugs found by these tests (now fixed); `why` names the bug. */
#define regression_ok(cond, why, ...) ok(cond, __VA_ARGS__)

static char root[] = "/tmp/hutch-test-util.XXXXXX";

static char *P(const char *rel) { return xasprintf("%s/%s", root, rel); }

static void put(const char *rel, const char *content, mode_t mode) {
  char *p = P(rel);
  int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd >= 0) {
    if (write_full(fd, content, strlen(content)) < 0) printf("# write %s failed\n", p);
    fchmod(fd, mode);
    close(fd);
  } else {
    printf("# open %s: %s\n", p, strerror(errno));
  }
  free(p);
}

static char *get(const char *rel) {
  char *p = P(rel);
  char *s = read_file(p, 1 << 20, NULL, NULL);
  free(p);
  return s;
}

static int exists(const char *rel) {
  char *p = P(rel);
  struct stat st;
  int r = lstat(p, &st) == 0;
  free(p);
  return r;
}

static mode_t mode_of(const char *rel) {
  char *p = P(rel);
  struct stat st;
  mode_t m = lstat(p, &st) == 0 ? st.st_mode : 0;
  free(p);
  return m;
}

static void mk(const char *rel, mode_t mode) {
  char *p = P(rel);
  if (mkdir(p, mode) < 0) printf("# mkdir %s: %s\n", p, strerror(errno));
  chmod(p, mode);
  free(p);
}

static void ln(const char *target, const char *rel) {
  char *p = P(rel);
  if (symlink(target, p) < 0) printf("# symlink %s: %s\n", p, strerror(errno));
  free(p);
}

/* ---- err.c ---- */

static void test_err(void) {
  hutch_err err = HUTCH_ERR_INIT;
  is_int(hutch_err_sys(&err, ENOENT, "open `%s`", "/x"), -1, "err_sys returns -1");
  is_str(err.msg, "open `/x`: No such file or directory", "err_sys appends strerror");
  ok(err.errnum == ENOENT && err.status == 500 && !strcmp(err.code, "internal"), "errnum, 500, internal");

  hutch_err_sys(&err, 0, "no errno here");
  is_str(err.msg, "no errno here", "err_sys with errnum 0 appends nothing");
  is_int(err.errnum, 0, "errnum 0");

  is_int(hutch_err_set(&err, 409, "conflict", "sandbox `%s` is %s", "sb_x", "busy"), -1, "err_set returns -1");
  ok(err.status == 409 && !strcmp(err.code, "conflict") && !strcmp(err.msg, "sandbox `sb_x` is busy") &&
         err.errnum == 0,
     "err_set: status, code, message, errnum 0");

  hutch_err_clear(&err);
  hutch_err_set(&err, 404, "not_found", "c");
  is_int(hutch_err_wrap(&err, "b"), -1, "err_wrap returns -1");
  hutch_err_wrap(&err, "a %d", 1);
  is_str(err.msg, "a 1: b: c", "wrap chains \"a: b: c\"");
  ok(err.status == 404 && !strcmp(err.code, "not_found"), "wrap keeps status and code");

  hutch_err_clear(&err);
  hutch_err_sys(&err, ENOSPC, "write");
  hutch_err_wrap(&err, "copy template `%s`", "python");
  hutch_err_wrap(&err, "create sandbox %s", "sb_x");
  is_str(err.msg, "create sandbox sb_x: copy template `python`: write: No space left on device",
         "the documented chain shape");
  is_int(err.errnum, ENOSPC, "wrap keeps errnum");

  hutch_err_clear(&err);
  ok(err.status == 0 && err.errnum == 0 && err.code[0] == 0 && err.msg[0] == 0, "clear zeroes everything");
  hutch_err_wrap(&err, "ctx");
  ok(err.status == 500 && !strcmp(err.code, "internal"), "wrap of an unset error defaults to 500 internal");

  /* NULL err is allowed everywhere. */
  ok(hutch_err_sys(NULL, EIO, "x") == -1 && hutch_err_set(NULL, 400, "c", "x") == -1 &&
         hutch_err_wrap(NULL, "x") == -1,
     "NULL err: still -1, no crash");
  hutch_err_clear(NULL);

  /* Long messages are cut, never overflow (ASan checks). */
  char big[5000];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = 0;
  hutch_err_sys(&err, EIO, "%s", big);
  is_int(strlen(err.msg), HUTCH_ERR_MSG_MAX - 1, "long message truncated to the buffer");
  for (int i = 0; i < 10; i++) hutch_err_wrap(&err, "%s", big);
  ok(strlen(err.msg) < HUTCH_ERR_MSG_MAX, "repeated wraps of long context stay bounded");
  hutch_err_set(&err, 400, "a_code_that_is_much_longer_than_forty_bytes_total", "m");
  ok(strlen(err.code) < sizeof err.code, "long code truncated");
}

/* ---- parse_u64 ---- */

static void test_parse_u64(void) {
  uint64_t v = 77;
  ok(parse_u64("0", 10, &v) == 0 && v == 0, "\"0\"");
  ok(parse_u64("123", 1000, &v) == 0 && v == 123, "\"123\"");
  ok(parse_u64("007", 10, &v) == 0 && v == 7, "leading zeros");
  ok(parse_u64("18446744073709551615", UINT64_MAX, &v) == 0 && v == UINT64_MAX, "UINT64_MAX");
  v = 77;
  is_int(parse_u64("18446744073709551616", UINT64_MAX, &v), -1, "UINT64_MAX + 1 overflows");
  is_int(parse_u64("18446744073709551620", UINT64_MAX, &v), -1, "UINT64_MAX + 5 overflows");
  is_int(parse_u64("99999999999999999999", UINT64_MAX, &v), -1, "20 nines overflow");
  is_int(parse_u64("184467440737095516150", UINT64_MAX, &v), -1, "UINT64_MAX * 10 overflows");
  is_int(v, 77, "failure leaves out untouched");
  is_int(parse_u64("", 10, &v), -1, "empty");
  is_int(parse_u64(NULL, 10, &v), -1, "NULL");
  is_int(parse_u64("12a", 1000, &v), -1, "trailing letter");
  is_int(parse_u64("a12", 1000, &v), -1, "leading letter");
  is_int(parse_u64("-1", 1000, &v), -1, "minus sign");
  is_int(parse_u64("+1", 1000, &v), -1, "plus sign");
  is_int(parse_u64(" 1", 1000, &v), -1, "leading space");
  is_int(parse_u64("1 ", 1000, &v), -1, "trailing space");
  is_int(parse_u64("1.5", 1000, &v), -1, "decimal point");
  is_int(parse_u64("0x10", 1000, &v), -1, "hex");
  ok(parse_u64("100", 100, &v) == 0 && v == 100, "exactly max");
  is_int(parse_u64("101", 100, &v), -1, "max + 1");
  is_int(parse_u64("1000", 100, &v), -1, "10 * max");
  ok(parse_u64("65535", 65535, &v) == 0 && v == 65535, "65535 with max 65535");
  is_int(parse_u64("65536", 65535, &v), -1, "65536 with max 65535");
  ok(parse_u64("0", 0, &v) == 0 && v == 0, "0 with max 0");
  /* A single digit larger than a small max: max - d wraps around. */
  v = 77;
  int r = parse_u64("7", 5, &v);
  regression_ok(r == -1, "util.c parse_u64: max - d underflows when d > max", "\"7\" with max 5 rejected (got %d, v=%llu)",
          r, (unsigned long long)v);
  r = parse_u64("9", 0, &v);
  regression_ok(r == -1, "util.c parse_u64: max - d underflows when d > max", "\"9\" with max 0 rejected (got %d)", r);
  r = parse_u64("1", 0, &v);
  regression_ok(r == -1, "util.c parse_u64: max - d underflows when d > max", "\"1\" with max 0 rejected (got %d)", r);
  r = parse_u64("19", 1, &v);
  regression_ok(r == -1, "util.c parse_u64: max - d underflows when d > max", "\"19\" with max 1 rejected (got %d)", r);
}

/* ---- random ids ---- */

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void test_random_id(void) {
  char id[64];
  hutch_random_id("sb", id, sizeof id);
  is_int(strlen(id), 3 + 20, "sb_ + 20 characters");
  ok(!strncmp(id, "sb_", 3), "prefix sb_ (%s)", id);

  enum { N = 1000 };
  char **ids = xcalloc(N, sizeof *ids);
  int format_ok = 1;
  for (int i = 0; i < N; i++) {
    hutch_random_id("op", id, sizeof id);
    ids[i] = xstrdup(id);
    if (strlen(id) != 23 || strncmp(id, "op_", 3)) format_ok = 0;
    for (int k = 3; k < 23 && id[k]; k++)
      if (!((id[k] >= 'a' && id[k] <= 'z') || (id[k] >= '2' && id[k] <= '7'))) format_ok = 0;
  }
  ok(format_ok, "1000 ids: all op_ + 20 chars of [a-z2-7]");
  qsort(ids, N, sizeof *ids, cmp_str);
  int unique = 1;
  for (int i = 1; i < N; i++)
    if (!strcmp(ids[i - 1], ids[i])) unique = 0;
  ok(unique, "1000 ids: all distinct");
  /* Every letter of the alphabet shows up over 20000 characters. */
  int seen[256] = {0};
  for (int i = 0; i < N; i++)
    for (int k = 3; k < 23; k++) seen[(unsigned char)ids[i][k]] = 1;
  int all = 1;
  for (const char *c = "abcdefghijklmnopqrstuvwxyz234567"; *c; c++)
    if (!seen[(unsigned char)*c]) all = 0;
  ok(all, "all 32 base32 characters occur");
  for (int i = 0; i < N; i++) free(ids[i]);
  free(ids);

  char small[8];
  memset(small, 'Z', sizeof small);
  hutch_random_id("sandbox", small, sizeof small);
  ok(memchr(small, 0, sizeof small) != NULL && !strncmp(small, "sandbox", 7), "a short buffer is truncated, terminated");
  hutch_random_id("", id, sizeof id);
  ok(strlen(id) == 21 && id[0] == '_', "empty prefix: _ + 20 chars");
}

/* ---- small helpers ---- */

static void test_misc(void) {
  char *s = xasprintf("%s-%d", "x", 42);
  is_str(s, "x-42", "xasprintf");
  free(s);
  char hex[9];
  hex_encode((const unsigned char *)"\x00\x01\xab\xff", 4, hex);
  is_str(hex, "0001abff", "hex_encode");
  char t[32];
  iso8601(0, t);
  is_str(t, "1970-01-01T00:00:00.000Z", "iso8601(0)");
  iso8601(1700000000123ull, t);
  is_str(t, "2023-11-14T22:13:20.123Z", "iso8601 with milliseconds");
  char *owned = xstrdup("x");
  char *taken = steal_pointer(&owned);
  ok(owned == NULL && taken && !strcmp(taken, "x"), "steal_pointer");
  free(taken);
  s = xstrndup("abcdef", 3);
  is_str(s, "abc", "xstrndup");
  free(s);
  s = xstrdup(NULL);
  is_str(s, "", "xstrdup(NULL) is \"\"");
  free(s);
  {
    cleanup_free char *auto_freed = xstrdup("freed at scope end (LSan checks)");
    cleanup_close int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    ok(auto_freed && fd >= 0, "cleanup_free / cleanup_close");
  }
  uint64_t a = mono_us(), b = mono_us();
  ok(b >= a, "mono_us is monotonic");
  ok(now_ms() > 1600000000000ull, "now_ms is a plausible wall clock");

  int p[2];
  if (pipe(p) == 0) {
    ok(write_full(p[1], "abcdef", 6) == 0, "write_full");
    close(p[1]);
    char buf[16];
    is_int(read_full(p[0], buf, sizeof buf), 6, "read_full returns fewer bytes at EOF");
    is_int(read_full(p[0], buf, sizeof buf), 0, "read_full at EOF: 0");
    close(p[0]);
  }
  is_int(read_full(-1, hex, 1), -1, "read_full on a bad fd: -1");
  is_int(write_full(-1, "x", 1), -1, "write_full on a bad fd: -1");
  unsigned char rb[64] = {0};
  ok(hutch_random_bytes(rb, sizeof rb) == 0, "random_bytes");
  int nonzero = 0;
  for (size_t i = 0; i < sizeof rb; i++) nonzero |= rb[i];
  ok(nonzero, "random_bytes filled something");
}

/* ---- files ---- */

static void test_mkdir_p(void) {
  hutch_err err = HUTCH_ERR_INIT;
  char *p = P("m/a/b/c");
  is_int(mkdir_p(p, 0750, &err), 0, "mkdir_p a/b/c");
  ok(S_ISDIR(mode_of("m/a/b/c")), "a/b/c is a directory");
  is_int(mkdir_p(p, 0750, &err), 0, "mkdir_p on an existing tree");
  free(p);
  p = P("m/x/y/");
  is_int(mkdir_p(p, 0755, &err), 0, "trailing slash");
  ok(S_ISDIR(mode_of("m/x/y")), "x/y created");
  free(p);
  mode_t old = umask(0);
  p = P("m/modes/inner");
  mkdir_p(p, 0711, &err);
  umask(old);
  is_int(mode_of("m/modes/inner") & 07777, 0711, "mode applied (umask 0)");
  is_int(mode_of("m/modes") & 07777, 0711, "... to the parents it creates as well");
  free(p);
  put("m/file", "x", 0644);
  p = P("m/file/sub");
  hutch_err_clear(&err);
  is_int(mkdir_p(p, 0755, &err), -1, "a regular file in the way fails");
  is_int(err.errnum, ENOTDIR, "... ENOTDIR");
  ok(strstr(err.msg, "m/file/sub") != NULL, "... naming the path (%s)", err.msg);
  free(p);
}

static void test_write_read(void) {
  hutch_err err = HUTCH_ERR_INIT;
  mode_t old = umask(022);
  char *p = P("w.txt");
  is_int(write_file(p, "hello\0world", 11, 0600, &err), 0, "write_file");
  is_int(mode_of("w.txt") & 07777, 0600, "mode 0600");
  size_t len = 0;
  char *s = read_file(p, 100, &len, &err);
  ok(s && len == 11 && !memcmp(s, "hello\0world", 11) && s[11] == 0, "read_file: 11 bytes incl. NUL, terminated");
  free(s);
  is_int(write_file(p, "hi", 2, 0644, &err), 0, "write_file over a longer file");
  s = read_file(p, 100, &len, &err);
  ok(s && len == 2 && !strcmp(s, "hi"), "truncated to the new content");
  free(s);
  is_int(mode_of("w.txt") & 07777, 0600, "an existing file keeps its mode");
  umask(old);

  /* O_NOFOLLOW: a symlink in place of the file is refused, target intact. */
  put("target.txt", "precious", 0644);
  ln("target.txt", "link.txt");
  char *l = P("link.txt");
  hutch_err_clear(&err);
  is_int(write_file(l, "pwned", 5, 0644, &err), -1, "write_file through a symlink is refused");
  is_int(err.errnum, ELOOP, "... ELOOP");
  char *t = get("target.txt");
  is_str(t, "precious", "symlink target unchanged");
  free(t);
  ok(S_ISLNK(mode_of("link.txt")), "the symlink is still a symlink");
  free(l);
  ln("created-through-link", "dangling");
  l = P("dangling");
  is_int(write_file(l, "x", 1, 0644, &err), -1, "write_file through a dangling symlink is refused");
  ok(!exists("created-through-link"), "... and did not create its target");
  free(l);

  hutch_err_clear(&err);
  char *missing = P("no/such/file");
  is_int(write_file(missing, "x", 1, 0644, &err), -1, "write_file into a missing directory fails");
  is_int(err.errnum, ENOENT, "... ENOENT");
  ok(read_file(missing, 10, NULL, &err) == NULL && err.errnum == ENOENT, "read_file of a missing file: NULL, ENOENT");
  free(missing);

  s = read_file(p, 100, NULL, &err);
  ok(s != NULL, "read_file with a NULL len_out");
  free(s);

  /* Bounds. */
  char *big = xmalloc(10000);
  for (int i = 0; i < 10000; i++) big[i] = (char)('a' + i % 26);
  char *bp = P("big.txt");
  write_file(bp, big, 10000, 0644, &err);
  hutch_err_clear(&err);
  ok(read_file(bp, 5000, NULL, &err) == NULL, "10000-byte file with max 5000: refused");
  is_int(err.errnum, EFBIG, "... EFBIG");
  ok(strstr(err.msg, "5000") != NULL, "... naming the bound (%s)", err.msg);
  s = read_file(bp, 20000, &len, &err);
  ok(s && len == 10000 && !memcmp(s, big, 10000), "10000-byte file with max 20000: read whole");
  free(s);
  hutch_err_clear(&err);
  ok(read_file(bp, 9999, NULL, &err) == NULL, "10000-byte file with max 9999: refused");
  hutch_err_clear(&err);
  s = read_file(bp, 10000, &len, &err);
  regression_ok(s && len == 10000, "util.c read_file: a file of exactly max bytes is refused",
          "10000-byte file with max 10000 (\"at most max\"): read whole");
  free(s);
  char *sp = P("small.txt");
  write_file(sp, big, 200, 0644, &err);
  hutch_err_clear(&err);
  s = read_file(sp, 100, &len, &err);
  regression_ok(s == NULL, "util.c read_file: the initial 4096-byte buffer ignores a smaller max",
          "200-byte file with max 100: refused (got %s, %zu bytes)", s ? "data" : "NULL", s ? len : 0);
  free(s);
  s = read_file(sp, 200, &len, &err);
  ok(s && len == 200, "200-byte file with max 200: read whole");
  free(s);
  char *ep = P("empty.txt");
  write_file(ep, "", 0, 0644, &err);
  s = read_file(ep, 0, &len, &err);
  ok(s && len == 0 && s[0] == 0, "empty file: \"\" with len 0");
  free(s);
  /* Growth across several reallocations up to a big bound. */
  char *hp = P("huge.bin");
  char *huge = xmalloc(300000);
  for (int i = 0; i < 300000; i++) huge[i] = (char)(i * 7);
  write_file(hp, huge, 300000, 0644, &err);
  s = read_file(hp, 1 << 20, &len, &err);
  ok(s && len == 300000 && !memcmp(s, huge, 300000), "300000-byte file read whole under a 1 MiB bound");
  free(s);
  free(huge);
  free(hp);
  free(ep);
  free(sp);
  free(bp);
  free(big);
  free(p);
}

static void test_rm_rf(void) {
  hutch_err err = HUTCH_ERR_INIT;
  /* Outside the tree: a directory with a file, and a lone file. */
  mk("outside", 0755);
  put("outside/keep.txt", "keep me", 0644);
  put("outside-file.txt", "keep me too", 0644);
  /* The tree to delete. */
  mk("tree", 0755);
  mk("tree/a", 0755);
  mk("tree/a/b", 0700);
  mk("tree/empty", 0755);
  put("tree/f1", "1", 0644);
  put("tree/a/f2", "2", 0600);
  put("tree/a/b/f3", "3", 0000);
  char *outside = P("outside");
  char *outside_file = P("outside-file.txt");
  ln(outside, "tree/a/link-to-dir");       /* absolute symlink to a directory */
  ln("../../outside", "tree/a/b/rel-link"); /* relative symlink to the same */
  ln(outside_file, "tree/link-to-file");
  ln("/nonexistent", "tree/dangling");
  char *fifo = P("tree/a/fifo");
  mkfifo(fifo, 0644);
  free(fifo);

  char *tree = P("tree");
  is_int(rm_rf(tree, &err), 0, "rm_rf a tree with files, dirs, symlinks and a fifo");
  ok(!exists("tree"), "tree is gone");
  ok(exists("outside") && S_ISDIR(mode_of("outside")), "the symlinked directory outside still exists");
  char *k = get("outside/keep.txt");
  is_str(k, "keep me", "... and its file, unchanged");
  free(k);
  k = get("outside-file.txt");
  is_str(k, "keep me too", "the symlinked file outside is unchanged");
  free(k);
  is_int(rm_rf(tree, &err), 0, "rm_rf of a missing path is not an error");

  /* The path itself a symlink to a directory: the link goes, not the target. */
  ln(outside, "top-link");
  char *top = P("top-link");
  is_int(rm_rf(top, &err), 0, "rm_rf on a symlink to a directory");
  ok(!exists("top-link"), "the symlink is removed");
  ok(exists("outside/keep.txt"), "the directory it pointed to is untouched");
  free(top);

  /* A plain file. */
  put("plain", "x", 0644);
  char *plain = P("plain");
  is_int(rm_rf(plain, &err), 0, "rm_rf on a regular file");
  ok(!exists("plain"), "file removed");
  free(plain);

  /* Deep nesting. */
  char *deep = P("deep");
  char *cur = xstrdup(deep);
  for (int i = 0; i < 50; i++) {
    char *n = xasprintf("%s/d%d", cur, i);
    free(cur);
    cur = n;
  }
  mkdir_p(cur, 0755, &err);
  free(cur);
  is_int(rm_rf(deep, &err), 0, "rm_rf 50 levels deep");
  ok(!exists("deep"), "deep tree gone");
  free(deep);

  free(tree);
  free(outside);
  free(outside_file);
}

static void test_copy_tree(void) {
  hutch_err err = HUTCH_ERR_INIT;
  mode_t old = umask(0);
  mk("src", 0755);
  mk("src/sub", 0750);
  mk("src/sub/deeper", 0700);
  mk("src/empty", 0711);
  put("src/a.txt", "alpha", 0644);
  put("src/exec.sh", "#!/bin/sh\necho hi\n", 0755);
  put("src/private", "secret", 0600);
  put("src/setuid", "s", 04755);
  put("src/sub/b.txt", "beta", 0640);
  put("src/sub/deeper/c.txt", "gamma", 0400);
  put("src/empty-file", "", 0644);
  ln("a.txt", "src/rel-link");
  ln("/etc/hostname", "src/abs-link");
  ln("does-not-exist", "src/dangling");
  ln("sub", "src/dir-link");
  char *bigp = P("src/sub/big.bin");
  char *big = xmalloc(200000);
  for (int i = 0; i < 200000; i++) big[i] = (char)(i * 13 + 5);
  write_file(bigp, big, 200000, 0644, &err);
  free(bigp);
  int root_user = geteuid() == 0;
  if (root_user) {
    char *own = P("src/sub/b.txt");
    if (chown(own, 1234, 5678) < 0) printf("# chown: %s\n", strerror(errno));
    free(own);
  }

  char *src = P("src"), *dst = P("dst");
  is_int(copy_tree(src, dst, &err), 0, "copy_tree");
  if (err.msg[0]) printf("# %s\n", err.msg);
  char *s;
  s = get("dst/a.txt");
  is_str(s, "alpha", "a.txt content");
  free(s);
  s = get("dst/sub/b.txt");
  is_str(s, "beta", "sub/b.txt content");
  free(s);
  s = get("dst/sub/deeper/c.txt");
  is_str(s, "gamma", "sub/deeper/c.txt content");
  free(s);
  s = get("dst/empty-file");
  is_str(s, "", "empty file");
  free(s);
  char *bp = P("dst/sub/big.bin");
  size_t len = 0;
  s = read_file(bp, 1 << 20, &len, &err);
  ok(s && len == 200000 && !memcmp(s, big, 200000), "200000-byte file content");
  free(s);
  free(bp);
  free(big);

  is_int(mode_of("dst/a.txt") & 07777, 0644, "mode 0644");
  is_int(mode_of("dst/exec.sh") & 07777, 0755, "mode 0755");
  is_int(mode_of("dst/private") & 07777, 0600, "mode 0600");
  is_int(mode_of("dst/setuid") & 07777, 04755, "mode 04755 (setuid kept)");
  is_int(mode_of("dst/sub/b.txt") & 07777, 0640, "mode 0640");
  is_int(mode_of("dst/sub/deeper/c.txt") & 07777, 0400, "mode 0400");
  is_int(mode_of("dst/sub") & 07777, 0750, "directory mode 0750");
  is_int(mode_of("dst/sub/deeper") & 07777, 0700, "directory mode 0700");
  ok(S_ISDIR(mode_of("dst/empty")) && (mode_of("dst/empty") & 07777) == 0711, "empty directory, mode 0711");

  struct {
    const char *rel, *target;
  } links[] = {{"dst/rel-link", "a.txt"},
               {"dst/abs-link", "/etc/hostname"},
               {"dst/dangling", "does-not-exist"},
               {"dst/dir-link", "sub"}};
  for (size_t i = 0; i < sizeof links / sizeof *links; i++) {
    char *lp = P(links[i].rel);
    char buf[256];
    ssize_t n = readlink(lp, buf, sizeof buf - 1);
    if (n >= 0) buf[n] = 0;
    ok(S_ISLNK(mode_of(links[i].rel)) && n >= 0 && !strcmp(buf, links[i].target),
       "%s is a symlink to %s (not followed)", links[i].rel, links[i].target);
    free(lp);
  }
  ok(!exists("dst/dir-link/b.txt") || S_ISLNK(mode_of("dst/dir-link")), "a symlinked directory is not copied as a directory");

  if (root_user) {
    struct stat st;
    char *own = P("dst/sub/b.txt");
    ok(lstat(own, &st) == 0 && st.st_uid == 1234 && st.st_gid == 5678, "ownership preserved (root)");
    free(own);
  }

  /* Copying into an existing destination merges (directories may exist). */
  char *dst2 = P("dst2");
  mk("dst2", 0755);
  put("dst2/preexisting", "p", 0644);
  is_int(copy_tree(src, dst2, &err), 0, "copy_tree into an existing directory");
  ok(exists("dst2/preexisting") && exists("dst2/sub/deeper/c.txt"), "old and new files both there");
  hutch_err_clear(&err);
  is_int(copy_tree(src, dst2, &err), -1, "copying over existing files fails (O_EXCL, nothing overwritten)");
  ok(err.errnum == EEXIST, "... EEXIST (%s)", err.msg);
  free(dst2);

  /* A symlink already in the destination is not written through. */
  put("victim", "untouched", 0644);
  mk("dst3", 0755);
  char *victim = P("victim");
  ln(victim, "dst3/a.txt");
  free(victim);
  char *dst3 = P("dst3");
  hutch_err_clear(&err);
  is_int(copy_tree(src, dst3, &err), -1, "a symlink planted in the destination makes the copy fail");
  s = get("victim");
  is_str(s, "untouched", "... and the file it points to is untouched");
  free(s);
  free(dst3);

  hutch_err_clear(&err);
  char *nosrc = P("no-such-src");
  is_int(copy_tree(nosrc, dst, &err), -1, "copy_tree from a missing source fails");
  is_int(err.errnum, ENOENT, "... ENOENT");
  free(nosrc);
  umask(old);

  /* As an unprivileged user, a read-only source directory (0555) must still
   * be copyable: the copy has to be created writable and chmod'ed after its
   * contents.  Run in a child as nobody when we are root. */
  if (root_user) {
    char *base = P("unpriv");
    chmod(root, 0711); /* mkdtemp made it 0700 */
    mkdir(base, 0777);
    chmod(base, 0777);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      if (setgid(65534) < 0 || setuid(65534) < 0) _exit(2);
      char *s2 = xasprintf("%s/src", base), *ro = xasprintf("%s/src/ro", base), *f = xasprintf("%s/src/ro/f", base);
      char *d2 = xasprintf("%s/dst", base);
      hutch_err e2 = HUTCH_ERR_INIT;
      if (mkdir(s2, 0755) < 0 || mkdir(ro, 0755) < 0 || write_file(f, "x", 1, 0644, &e2) < 0 || chmod(ro, 0555) < 0)
        _exit(3);
      int r = copy_tree(s2, d2, &e2);
      if (r < 0) printf("# unprivileged copy_tree: %s\n", e2.msg);
      fflush(stdout);
      _exit(r == 0 ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    regression_ok(WIFEXITED(status) && WEXITSTATUS(status) == 0,
            "util.c copy_tree_at: mkdirat with the source mode before filling the directory",
            "unprivileged copy_tree of a 0555 directory (exit %d)", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    free(base);
  }
  free(src);
  free(dst);
}

int main(void) {
  test_err();
  test_parse_u64();
  test_random_id();
  test_misc();
  if (!mkdtemp(root)) {
    ok(0, "mkdtemp: %s", strerror(errno));
    return done_testing();
  }
  test_mkdir_p();
  test_write_read();
  test_rm_rf();
  test_copy_tree();
  hutch_err err = HUTCH_ERR_INIT;
  is_int(rm_rf(root, &err), 0, "scratch directory removed");
  if (err.msg[0]) printf("# %s\n", err.msg);
  ok(access(root, F_OK) != 0, "scratch directory gone");
  return done_testing();
}
