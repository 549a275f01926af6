/* The snapshot export stream (src/lib/store/archive.c): round trips through
 * pipes, and every kind of damage rejected as 400 invalid_archive. */
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zstd.h>

#include "common/err.h"
#include "common/util.h"
#include "store/archive.h"
#include "tap.h"

/* ---- helpers ---------------------------------------------------------- */

static int tmpfd(void) {
  int fd = memfd_create("test-archive", MFD_CLOEXEC);
  if (fd < 0) {
    printf("# memfd_create: %s\n", strerror(errno));
    exit(1);
  }
  return fd;
}

static int fd_from(const unsigned char *p, size_t n) {
  int fd = tmpfd();
  if (write_full(fd, p, n) < 0) printf("# write: %s\n", strerror(errno));
  return fd;
}

static unsigned char *slurp(int fd, size_t *n) {
  off_t size = lseek(fd, 0, SEEK_END);
  unsigned char *p = xmalloc((size_t)size + 1);
  ssize_t r = pread(fd, p, (size_t)size, 0);
  *n = r < 0 ? 0 : (size_t)r;
  return p;
}

/* Deterministic payloads: 0 incompressible, 1 compressible text. */
static void gen(int kind, uint64_t *state, unsigned char *buf, size_t n, uint64_t pos) {
  for (size_t i = 0; i < n; i++) {
    if (kind == 0) {
      uint64_t x = *state;
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      *state = x;
      buf[i] = (unsigned char)(x >> 24);
    } else {
      uint64_t k = pos + i;
      buf[i] = (unsigned char)("hutch snapshot line "[k % 20] + ((k / 4096) % 7 == 0 ? 1 : 0));
    }
  }
}

struct feed {
  int fd, kind;
  size_t size;
  unsigned char sha[32];
};

static void *feeder(void *arg) {
  struct feed *f = arg;
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  EVP_DigestInit_ex(md, EVP_sha256(), NULL);
  unsigned char buf[65536];
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (size_t done = 0; done < f->size;) {
    size_t n = f->size - done < sizeof buf ? f->size - done : sizeof buf;
    gen(f->kind, &state, buf, n, done);
    EVP_DigestUpdate(md, buf, n);
    if (write_full(f->fd, buf, n) < 0) break;
    done += n;
  }
  EVP_DigestFinal_ex(md, f->sha, NULL);
  EVP_MD_CTX_free(md);
  close(f->fd);
  return NULL;
}

struct writer {
  int out_fd, in_fd, level, rc;
  const char *meta;
  struct hutch_archive_stats st;
  hutch_err err;
};

static void *writer(void *arg) {
  struct writer *w = arg;
  w->rc = hutch_archive_write(w->out_fd, w->meta, w->in_fd, w->level, &w->st, &w->err);
  close(w->out_fd);
  close(w->in_fd);
  return NULL;
}

struct extractor {
  int fd, out_fd, rc;
  hutch_err err;
};

static void *extractor(void *arg) {
  struct extractor *x = arg;
  x->rc = hutch_archive_extract(x->fd, x->out_fd, &x->err);
  close(x->out_fd);
  return NULL;
}

/* SHA-256 of everything read from fd until EOF. */
static uint64_t drain_sha(int fd, unsigned char sha[32]) {
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  EVP_DigestInit_ex(md, EVP_sha256(), NULL);
  unsigned char buf[65536];
  uint64_t total = 0;
  ssize_t r;
  while ((r = read(fd, buf, sizeof buf)) != 0) {
    if (r < 0) {
      if (errno == EINTR) continue;
      break;
    }
    EVP_DigestUpdate(md, buf, (size_t)r);
    total += (uint64_t)r;
  }
  EVP_DigestFinal_ex(md, sha, NULL);
  EVP_MD_CTX_free(md);
  return total;
}

/* payload -> pipe -> hutch_archive_write -> pipe (or socket) -> receive ->
 * file; verify; extract -> pipe; compare. Returns the archive fd. */
static int round_trip(const char *name, int kind, size_t size, int level, bool sockets) {
  int pa[2], pb[2], pc[2];
  if (pipe2(pa, O_CLOEXEC) < 0) exit(1);
  if (sockets ? socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pb) < 0 : pipe2(pb, O_CLOEXEC) < 0) exit(1);
  const char *meta = "{\"sandbox\":\"sb_x\",\"snapshot\":\"snap_1\",\"n\":1}";
  struct feed f = {.fd = pa[1], .kind = kind, .size = size};
  struct writer w = {.out_fd = pb[1], .in_fd = pa[0], .level = level, .meta = meta};
  pthread_t tf, tw;
  pthread_create(&tf, NULL, feeder, &f);
  pthread_create(&tw, NULL, writer, &w);
  int file = tmpfd();
  hutch_err err = HUTCH_ERR_INIT;
  uint64_t got = 0;
  int rr = hutch_archive_receive(pb[0], file, 1ull << 40, &got, &err);
  close(pb[0]);
  pthread_join(tf, NULL);
  pthread_join(tw, NULL);
  ok(w.rc == 0 && rr == 0, "%s: written and received (%s)", name, w.rc ? w.err.msg : err.msg);
  is_int(w.st.raw_bytes, size, "%s: writer counts %zu raw bytes", name, size);
  is_int(got, w.st.total_bytes, "%s: total_bytes is what went over the pipe", name);
  is_int(w.st.total_bytes, 18 + strlen(meta) + w.st.compressed_bytes + 56, "%s: total = header+meta+payload+trailer",
         name);

  char *meta_out = NULL;
  struct hutch_archive_stats vs;
  memset(&vs, 0, sizeof vs);
  int vr = hutch_archive_verify(file, &meta_out, &vs, &err);
  ok(vr == 0, "%s: verifies (%s)", name, vr ? err.msg : "");
  is_str(meta_out, meta, "%s: meta comes back", name);
  free(meta_out);
  ok(vs.raw_bytes == w.st.raw_bytes && vs.compressed_bytes == w.st.compressed_bytes &&
         vs.total_bytes == w.st.total_bytes && strcmp(vs.sha256_hex, w.st.sha256_hex) == 0,
     "%s: verify's stats match the writer's", name);

  if (pipe2(pc, O_CLOEXEC) < 0) exit(1);
  struct extractor x = {.fd = file, .out_fd = pc[1]};
  pthread_t tx;
  pthread_create(&tx, NULL, extractor, &x);
  unsigned char sha[32];
  uint64_t n = drain_sha(pc[0], sha);
  close(pc[0]);
  pthread_join(tx, NULL);
  ok(x.rc == 0, "%s: extracts (%s)", name, x.rc ? x.err.msg : "");
  ok(n == size && memcmp(sha, f.sha, 32) == 0, "%s: extracted payload is identical (%llu bytes)", name,
     (unsigned long long)n);
  if (size > 0 && kind == 1)
    ok(w.st.compressed_bytes < size / 10, "%s: compressible payload compresses (%llu -> %llu)", name,
       (unsigned long long)size, (unsigned long long)w.st.compressed_bytes);
  return file;
}

/* Build an archive by hand; sha computed over the bytes given unless
 * bad_sha.  Lengths as given (so they can lie). */
struct craft {
  const char *magic;
  uint32_t version;
  const char *meta;
  size_t meta_n;
  int64_t meta_len_field; /* -1: meta_n */
  const unsigned char *payload;
  size_t payload_n;
  uint64_t raw_len;
  int64_t comp_len_field; /* -1: payload_n */
};

static size_t build(const struct craft *c, unsigned char *out) {
  size_t o = 0;
  memcpy(out, c->magic ? c->magic : HUTCH_ARCHIVE_MAGIC, 10);
  o = 10;
  uint32_t v = c->version ? c->version : 1;
  uint32_t ml = c->meta_len_field >= 0 ? (uint32_t)c->meta_len_field : (uint32_t)c->meta_n;
  for (int i = 3; i >= 0; i--) out[o++] = (unsigned char)(v >> (8 * i));
  for (int i = 3; i >= 0; i--) out[o++] = (unsigned char)(ml >> (8 * i));
  memcpy(out + o, c->meta, c->meta_n);
  o += c->meta_n;
  memcpy(out + o, c->payload, c->payload_n);
  o += c->payload_n;
  unsigned char sha[32];
  EVP_Digest(out, o, sha, NULL, EVP_sha256(), NULL);
  memcpy(out + o, "HUTCHEND", 8);
  o += 8;
  uint64_t cl = c->comp_len_field >= 0 ? (uint64_t)c->comp_len_field : c->payload_n;
  for (int i = 7; i >= 0; i--) out[o++] = (unsigned char)(c->raw_len >> (8 * i));
  for (int i = 7; i >= 0; i--) out[o++] = (unsigned char)(cl >> (8 * i));
  memcpy(out + o, sha, 32);
  return o + 32;
}

static hutch_err last_err;

/* Verify bytes; true when rejected as 400 invalid_archive whose message
 * contains `want` (any message when want is NULL). */
static bool rejected(const unsigned char *p, size_t n, const char *want) {
  int fd = fd_from(p, n);
  hutch_err err = HUTCH_ERR_INIT;
  char *meta = NULL;
  int r = hutch_archive_verify(fd, &meta, NULL, &err);
  last_err = err;
  bool good = r < 0 && err.status == 400 && strcmp(err.code, "invalid_archive") == 0 && meta == NULL &&
              (!want || strstr(err.msg, want));
  if (!good) printf("#   verify: rc %d status %d code %s msg '%s'\n", r, err.status, err.code, err.msg);
  /* extract must refuse the same bytes */
  int devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
  hutch_err e2 = HUTCH_ERR_INIT;
  int x = hutch_archive_extract(fd, devnull, &e2);
  close(devnull);
  if (x == 0 || e2.status != 400) {
    printf("#   extract accepted or wrong status: rc %d status %d msg '%s'\n", x, e2.status, e2.msg);
    good = false;
  }
  free(meta);
  close(fd);
  return good;
}

static bool accepted(const unsigned char *p, size_t n) {
  int fd = fd_from(p, n);
  hutch_err err = HUTCH_ERR_INIT;
  char *meta = NULL;
  int r = hutch_archive_verify(fd, &meta, NULL, &err);
  if (r < 0) printf("#   verify: %s\n", err.msg);
  free(meta);
  close(fd);
  return r == 0;
}

/* ---- tests ------------------------------------------------------------ */

static void test_round_trips(void) {
  close(round_trip("empty", 0, 0, 0, false));
  close(round_trip("small", 1, 1000, 0, false));
  close(round_trip("exactly one zstd input block", 0, ZSTD_CStreamInSize(), 0, false));
  close(round_trip("20 MiB incompressible", 0, 20u << 20, 1, false));
  close(round_trip("20 MiB compressible, socket", 1, 20u << 20, 0, true));
  close(round_trip("small, level 19", 1, 100000, 19, false));
}

static void test_corruption(void) {
  /* A real archive from the writer, small enough to flip every byte. */
  int pa[2];
  if (pipe2(pa, O_CLOEXEC) < 0) exit(1);
  struct feed f = {.fd = pa[1], .kind = 1, .size = 3000};
  pthread_t tf;
  pthread_create(&tf, NULL, feeder, &f);
  int file = tmpfd();
  hutch_err err = HUTCH_ERR_INIT;
  int wr = hutch_archive_write(file, "{\"a\":\"b\"}", pa[0], 0, NULL, &err);
  pthread_join(tf, NULL);
  close(pa[0]);
  ok(wr == 0, "write into a file (%s)", wr ? err.msg : "");
  size_t n;
  unsigned char *base = slurp(file, &n);
  close(file);
  ok(accepted(base, n), "the pristine archive verifies");
  size_t meta_off = 18, pay_off = 18 + 9, tr_off = n - 56;

  unsigned char *m = xmalloc(n + 4096);
#define FLIP(off, want, what)                                   \
  do {                                                          \
    memcpy(m, base, n);                                         \
    m[(off)] ^= 0x01;                                           \
    ok(rejected(m, n, want), "flip a byte in %s: %s", what, last_err.msg); \
  } while (0)
  FLIP(0, "bad magic", "the magic");
  FLIP(13, "unsupported version", "the version");
  FLIP(17, NULL, "meta_len");
  FLIP(14, "over the limit", "meta_len's high byte");
  FLIP(meta_off + 3, "checksum mismatch", "the meta");
  FLIP(pay_off + 5, "checksum mismatch", "the payload");
  FLIP(tr_off + 2, "trailer missing", "the trailer's magic");
  FLIP(tr_off + 15, NULL, "the trailer's raw length");
  FLIP(tr_off + 23, "length mismatch", "the trailer's compressed length");
  FLIP(tr_off + 40, "checksum mismatch", "the trailer's checksum");
  int all = 1;
  for (size_t i = 0; i < n; i++) {
    for (int bit = 0; bit < 8; bit += 7) {
      memcpy(m, base, n);
      m[i] ^= (unsigned char)(1u << bit);
      if (!rejected(m, n, NULL)) {
        printf("#   flip at %zu bit %d accepted\n", i, bit);
        all = 0;
      }
    }
  }
  ok(all, "every single-bit flip (bits 0 and 7) of all %zu bytes is rejected", n);

  /* Truncation. */
  struct {
    size_t at;
    const char *want;
  } cuts[] = {{0, "truncated: header"}, {5, "truncated: header"},  {10, "truncated: header"},
              {17, "truncated: header"}, {18, "truncated: meta"},  {22, "truncated: meta"},
              {pay_off, "trailer missing"}, {pay_off + 4, "trailer missing"}, {tr_off, "trailer missing"},
              {tr_off + 30, "trailer missing"}, {n - 1, "trailer missing"}};
  for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++)
    ok(rejected(base, cuts[i].at, cuts[i].want), "truncated to %zu bytes: %s", cuts[i].at, last_err.msg);
  all = 1;
  for (size_t i = 0; i < n; i++)
    if (!rejected(base, i, NULL)) all = 0;
  ok(all, "every truncation is rejected");

  /* Trailing garbage. */
  memcpy(m, base, n);
  memcpy(m + n, "garbage!", 8);
  ok(rejected(m, n + 8, "8 bytes of trailing data"), "trailing garbage: %s", last_err.msg);
  memset(m + n, 0, 100);
  ok(rejected(m, n + 100, "trailing data"), "trailing zeros: %s", last_err.msg);
  memcpy(m + n, base, n);
  ok(rejected(m, 2 * n, "trailing data"), "an archive followed by another: %s", last_err.msg);
  free(m);
  free(base);
}

static void test_crafted(void) {
  unsigned char payload[4096], frame2[4096];
  const char text[] = "hello, snapshot";
  size_t pn = ZSTD_compress(payload, sizeof payload, text, sizeof text - 1, 3);
  size_t pn2 = ZSTD_compress(frame2, sizeof frame2, "!!", 2, 3);
  unsigned char *buf = xmalloc(1 << 16);
  const char *meta = "{\"k\":1}";
  struct craft c = {.meta = meta, .meta_n = strlen(meta), .meta_len_field = -1, .payload = payload,
                    .payload_n = pn, .raw_len = sizeof text - 1, .comp_len_field = -1};
  size_t n = build(&c, buf);
  ok(accepted(buf, n), "a hand-built archive verifies");

  struct craft d = c;
  d.version = 2;
  n = build(&d, buf);
  ok(rejected(buf, n, "unsupported version 2"), "wrong version: %s", last_err.msg);

  d = c;
  d.meta_len_field = 0xffffffff;
  n = build(&d, buf);
  ok(rejected(buf, n, "meta_len 4294967295 over the limit"), "huge meta_len: %s", last_err.msg);
  d.meta_len_field = (1 << 20) + 1;
  n = build(&d, buf);
  ok(rejected(buf, n, "over the limit"), "meta_len 1 MiB + 1: %s", last_err.msg);
  d.meta_len_field = 1 << 20;
  n = build(&d, buf);
  ok(rejected(buf, n, "truncated: meta"), "meta_len 1 MiB in a small file: %s", last_err.msg);

  const char *bad_meta[][2] = {{"{\"k\":", "not JSON"},          {"[1,2]", "expected a JSON object"},
                               {"\"str\"", "not JSON"},          {"", "not JSON"},
                               {"{\"a\":\"\\u0000\"}", "not JSON"}, {"{} {}", "not JSON"}};
  for (size_t i = 0; i < sizeof bad_meta / sizeof bad_meta[0]; i++) {
    d = c;
    d.meta = bad_meta[i][0];
    d.meta_n = strlen(bad_meta[i][0]);
    n = build(&d, buf);
    ok(rejected(buf, n, bad_meta[i][1]), "meta '%s' (valid checksum): %s", bad_meta[i][0], last_err.msg);
  }
  d = c;
  d.meta = "{\"a\":1}\0";
  d.meta_n = 8;
  n = build(&d, buf);
  ok(rejected(buf, n, "NUL"), "meta with a NUL byte: %s", last_err.msg);

  d = c;
  d.raw_len = sizeof text;
  n = build(&d, buf);
  ok(rejected(buf, n, "decompresses to 15 bytes, trailer says 16"), "raw length too big: %s", last_err.msg);
  d.raw_len = 3;
  n = build(&d, buf);
  ok(rejected(buf, n, "more than payload_raw_len"), "raw length too small: %s", last_err.msg);

  d = c;
  d.payload_n = pn - 3;
  n = build(&d, buf);
  ok(rejected(buf, n, "payload"), "payload ends inside a frame (valid checksum): %s", last_err.msg);

  d = c;
  d.payload = (const unsigned char *)"not zstd at all";
  d.payload_n = 15;
  n = build(&d, buf);
  ok(rejected(buf, n, "zstd"), "payload not zstd (valid checksum): %s", last_err.msg);

  d = c;
  d.payload_n = 0;
  d.raw_len = 0;
  n = build(&d, buf);
  ok(rejected(buf, n, "empty payload"), "no zstd frame at all: %s", last_err.msg);

  d = c;
  d.comp_len_field = (int64_t)pn + 1;
  n = build(&d, buf);
  ok(rejected(buf, n, "length mismatch"), "compressed_len one too many: %s", last_err.msg);

  /* Two frames, and a skippable frame, are accepted. */
  unsigned char two[8192];
  memcpy(two, payload, pn);
  memcpy(two + pn, frame2, pn2);
  static const unsigned char skip[] = {0x50, 0x2a, 0x4d, 0x18, 4, 0, 0, 0, 'x', 'y', 'z', 'w'};
  memcpy(two + pn + pn2, skip, sizeof skip);
  d = c;
  d.payload = two;
  d.payload_n = pn + pn2 + sizeof skip;
  d.raw_len = sizeof text - 1 + 2;
  n = build(&d, buf);
  int fd = fd_from(buf, n);
  hutch_err err = HUTCH_ERR_INIT;
  int r = hutch_archive_verify(fd, NULL, NULL, &err);
  ok(r == 0, "several frames and a skippable frame verify (%s)", r ? err.msg : "");
  int pc[2];
  if (pipe2(pc, O_CLOEXEC) < 0) exit(1);
  r = hutch_archive_extract(fd, pc[1], &err);
  close(pc[1]);
  char out[64] = {0};
  ssize_t got = read_full(pc[0], out, sizeof out - 1);
  close(pc[0]);
  ok(r == 0 && got == 17 && strcmp(out, "hello, snapshot!!") == 0, "extract concatenates the frames: '%s'", out);
  close(fd);

  /* Frames that end exactly when the decoder's output buffer is full. */
  {
    size_t bs = ZSTD_DStreamOutSize();
    unsigned char *plain = xmalloc(bs);
    for (size_t i = 0; i < bs; i++) plain[i] = (unsigned char)(i % 251);
    size_t cap = ZSTD_compressBound(bs);
    unsigned char *z = xmalloc(2 * cap), *ab = xmalloc(2 * cap + 4096);
    size_t z1 = ZSTD_compress(z, cap, plain, bs, 3);
    size_t z2 = ZSTD_compress(z + z1, cap, plain, bs, 3);
    d = c;
    d.payload = z;
    d.payload_n = z1 + z2;
    d.raw_len = 2 * bs;
    n = build(&d, ab);
    ok(accepted(ab, n), "two frames of exactly one output buffer (%zu bytes) each verify", bs);
    d.payload_n = z1;
    d.raw_len = bs;
    n = build(&d, ab);
    ok(accepted(ab, n), "one frame of exactly one output buffer verifies");
    free(plain);
    free(z);
    free(ab);
  }

  /* A frame whose window is over the limit is refused. */
  ZSTD_CCtx *cc = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(cc, ZSTD_c_windowLog, 27);
  ZSTD_CCtx_setParameter(cc, ZSTD_c_compressionLevel, 1);
  size_t big_n = 40u << 20;
  unsigned char *big = xcalloc(1, big_n);
  unsigned char *zb = xmalloc(1 << 20);
  size_t zn = ZSTD_compress2(cc, zb, 1 << 20, big, big_n);
  ZSTD_freeCCtx(cc);
  free(big);
  ok(!ZSTD_isError(zn), "a 40 MiB zero frame with a 128 MiB window compresses (%zu bytes)", zn);
  unsigned char *abuf = xmalloc(zn + 4096);
  d = c;
  d.payload = zb;
  d.payload_n = zn;
  d.raw_len = big_n;
  n = build(&d, abuf);
  ok(rejected(abuf, n, "zstd"), "window over 32 MiB refused: %s", last_err.msg);
  free(abuf);
  free(zb);
  free(buf);
}

static void test_writer_errors(void) {
  int devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
  int in = open("/dev/null", O_RDONLY | O_CLOEXEC);
  hutch_err err = HUTCH_ERR_INIT;
  int r = hutch_archive_write(devnull, "[1]", in, 0, NULL, &err);
  ok(r < 0 && err.status == 400 && strcmp(err.code, "invalid_argument") == 0, "meta not an object: %s", err.msg);
  hutch_err_clear(&err);
  r = hutch_archive_write(devnull, "{", in, 0, NULL, &err);
  ok(r < 0 && err.status == 400, "meta not JSON: %s", err.msg);
  hutch_err_clear(&err);
  r = hutch_archive_write(devnull, "{}", in, 20, NULL, &err);
  ok(r < 0 && err.status == 400, "level 20: %s", err.msg);
  hutch_err_clear(&err);
  char *huge = xmalloc((1 << 20) + 10);
  memset(huge, ' ', (1 << 20) + 9);
  huge[0] = '{';
  huge[(1 << 20) + 8] = '}';
  huge[(1 << 20) + 9] = 0;
  r = hutch_archive_write(devnull, huge, in, 0, NULL, &err);
  ok(r < 0 && err.status == 400 && strstr(err.msg, "over the limit"), "meta over 1 MiB: %s", err.msg);
  free(huge);
  hutch_err_clear(&err);
  r = hutch_archive_write(devnull, "{}", in, -5, NULL, &err);
  ok(r == 0, "a negative (fast) level works (%s)", r ? err.msg : "");
  close(devnull);
  close(in);

  /* EPIPE on a socket with SIGPIPE at its default: an error, not death. */
  signal(SIGPIPE, SIG_DFL);
  int sp[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0) exit(1);
  close(sp[1]);
  in = open("/dev/zero", O_RDONLY | O_CLOEXEC);
  hutch_err_clear(&err);
  r = hutch_archive_write(sp[0], "{}", in, 0, NULL, &err);
  ok(r < 0 && err.errnum == EPIPE && err.status == 500, "closed socket: EPIPE error (%s)", err.msg);
  close(sp[0]);
  close(in);

  /* A pipe relies on SIGPIPE being ignored (as hutchd does). */
  signal(SIGPIPE, SIG_IGN);
  int pp[2];
  if (pipe2(pp, O_CLOEXEC) < 0) exit(1);
  close(pp[0]);
  in = open("/dev/zero", O_RDONLY | O_CLOEXEC);
  hutch_err_clear(&err);
  r = hutch_archive_write(pp[1], "{}", in, 0, NULL, &err);
  ok(r < 0 && err.errnum == EPIPE, "closed pipe: EPIPE error (%s)", err.msg);
  close(pp[1]);
  close(in);

  /* Extract into a closed pipe. */
  int file = round_trip("for extract into a closed pipe", 0, 1 << 20, 0, false);
  if (pipe2(pp, O_CLOEXEC) < 0) exit(1);
  close(pp[0]);
  hutch_err_clear(&err);
  r = hutch_archive_extract(file, pp[1], &err);
  ok(r < 0 && err.errnum == EPIPE && err.status == 500, "extract into a closed pipe: %s", err.msg);
  close(pp[1]);
  close(file);

  /* Not a regular file. */
  if (pipe2(pp, O_CLOEXEC) < 0) exit(1);
  hutch_err_clear(&err);
  r = hutch_archive_verify(pp[0], NULL, NULL, &err);
  ok(r < 0 && err.status == 500, "verify of a pipe refused: %s", err.msg);
  close(pp[0]);
  close(pp[1]);
}

static void test_receive(void) {
  int pp[2];
  if (pipe2(pp, O_CLOEXEC) < 0) exit(1);
  char data[5000];
  memset(data, 'x', sizeof data);
  if (write_full(pp[1], data, sizeof data) < 0) exit(1);
  close(pp[1]);
  int file = tmpfd();
  hutch_err err = HUTCH_ERR_INIT;
  uint64_t n = 0;
  int r = hutch_archive_receive(pp[0], file, 4999, &n, &err);
  ok(r < 0 && err.status == 413 && strcmp(err.code, "payload_too_large") == 0, "receive over the limit: %s",
     err.msg);
  close(pp[0]);
  close(file);

  if (pipe2(pp, O_CLOEXEC) < 0) exit(1);
  if (write_full(pp[1], data, sizeof data) < 0) exit(1);
  close(pp[1]);
  file = tmpfd();
  r = hutch_archive_receive(pp[0], file, 5000, &n, &err);
  ok(r == 0 && n == 5000 && lseek(file, 0, SEEK_END) == 5000, "receive exactly at the limit");
  close(pp[0]);
  close(file);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  test_round_trips();
  test_corruption();
  test_crafted();
  test_writer_errors();
  test_receive();
  return done_testing();
}
