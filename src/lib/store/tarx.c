/* Safe extraction of untrusted tar layers; see tarx.h for the rules. */
#include "store/tarx.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include "common/util.h"

#ifndef SYS_openat2
#define SYS_openat2 437
#endif

#define IN_ROOT (RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
/* One level down from a directory we hold: no symlinks, no mounts. */
#define BENEATH (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)
#define IBUF (64 * 1024)
#define BLOCK 512
/* Whiteouts of one layer, collected in pass 1 and applied before pass 2. */
#define WHITEOUT_MAX 65536
#define WHITEOUT_BYTES (16u << 20)
/* Directory mtimes deferred to the end of a layer; beyond, set at once. */
#define DIRTIME_MAX 65536
#define DIRTIME_BYTES (16u << 20)
#define ID_NOBODY 65534
#define LINK_HOPS 16

#define Q "`%.256s`"

typedef unsigned long long ull;

/* ---- compression ------------------------------------------------------- */

int hutch_compression_detect(const unsigned char *p, size_t n) {
  if (n >= 2 && p[0] == 0x1f && p[1] == 0x8b) return HUTCH_COMP_GZIP;
  if (n >= 4 && p[0] == 0x28 && p[1] == 0xb5 && p[2] == 0x2f && p[3] == 0xfd) return HUTCH_COMP_ZSTD;
  if (n >= 6 && !memcmp(p, "\xfd" "7zXZ\0", 6)) return HUTCH_COMP_XZ;
  if (n >= 3 && !memcmp(p, "BZh", 3)) return HUTCH_COMP_BZIP2;
  return HUTCH_COMP_NONE;
}

const char *hutch_compression_name(int kind) {
  switch (kind) {
  case HUTCH_COMP_GZIP: return "gzip";
  case HUTCH_COMP_ZSTD: return "zstd";
  case HUTCH_COMP_XZ: return "xz";
  case HUTCH_COMP_BZIP2: return "bzip2";
  default: return "none";
  }
}

/* ---- errors ------------------------------------------------------------ */

/* A filesystem call failed.  Errors the archive's content causes (a parent
 * that is a file, a hard link to nothing, a name too long) are the caller's
 * (400); the rest (ENOSPC, EIO, EMFILE, ...) are ours (500). */
__attribute__((format(printf, 3, 4))) static int fs_fail(hutch_err *err, int e, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  hutch_err_sys(err, e, "%s", msg);
  switch (e) {
  case ENOENT: case ENOTDIR: case ELOOP: case EXDEV: case EEXIST: case EISDIR:
  case ENAMETOOLONG: case EINVAL: case ENOTEMPTY: case EMLINK:
    if (err) {
      err->status = 400;
      snprintf(err->code, sizeof err->code, "invalid_argument");
    }
    break;
  default: break;
  }
  return -1;
}

static int openat2_fd(int dirfd, const char *path, uint64_t flags, uint64_t resolve) {
  struct open_how how;
  memset(&how, 0, sizeof how);
  how.flags = flags | O_CLOEXEC;
  how.resolve = resolve;
  for (int tries = 0;; tries++) {
    long r = syscall(SYS_openat2, dirfd, path, &how, sizeof how);
    if (r >= 0) return (int)r;
    if (errno == EINTR || (errno == EAGAIN && tries < 16)) continue;
    return -1;
  }
}

/* An in-root directory: "" is the root itself. */
static int open_in_root(int root, const char *rel, uint64_t flags) {
  return openat2_fd(root, rel[0] ? rel : ".", flags | O_DIRECTORY, IN_ROOT);
}

/* ---- digests ----------------------------------------------------------- */

static bool digest_valid(const char *d) {
  if (strncmp(d, "sha256:", 7)) return false;
  const char *h = d + 7;
  size_t i = 0;
  for (; h[i]; i++)
    if (!((h[i] >= '0' && h[i] <= '9') || (h[i] >= 'a' && h[i] <= 'f'))) return false;
  return i == 64;
}

static EVP_MD_CTX *md_new(void) {
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  if (!md || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) abort();
  return md;
}

static void md_hex(EVP_MD_CTX *md, char out[72]) {
  unsigned char b[32];
  unsigned int n = 0;
  EVP_DigestFinal_ex(md, b, &n);
  memcpy(out, "sha256:", 7);
  hex_encode(b, 32, out + 7);
}

/* ---- byte source: raw bytes (hashed), decompressed (hashed) ------------ */

struct src {
  int fd;
  const unsigned char *mem;
  uint64_t off, len, rpos; /* raw bytes: [off, off+len) of fd or mem */
  EVP_MD_CTX *raw_md, *plain_md;
  int codec;
  z_stream z;
  bool z_live;
  ZSTD_DStream *zs;
  size_t zret; /* last ZSTD_decompressStream result: 0 at a frame's end */
  unsigned char *ibuf, *scratch;
  size_t ipos, ilen;
  bool raw_eof, out_eof;
  uint64_t plain_total, max_size;
};

static int raw_pread(struct src *s, unsigned char *buf, size_t n, hutch_err *err) {
  if (s->mem) {
    memcpy(buf, s->mem + s->rpos, n);
  } else {
    size_t got = 0;
    while (got < n) {
      ssize_t r = pread(s->fd, buf + got, n - got, (off_t)(s->off + s->rpos + got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return hutch_err_sys(err, errno, "read at offset %llu", (ull)(s->off + s->rpos + got));
      if (r == 0)
        return hutch_err_invalid(err, "unexpected end of file at offset %llu (%llu bytes expected)",
                                 (ull)(s->off + s->rpos + got), (ull)(s->off + s->len));
      got += (size_t)r;
    }
  }
  if (s->raw_md) EVP_DigestUpdate(s->raw_md, buf, n);
  s->rpos += n;
  return 0;
}

static int raw_fill(struct src *s, hutch_err *err) {
  s->ipos = s->ilen = 0;
  if (s->rpos >= s->len) {
    s->raw_eof = true;
    return 0;
  }
  size_t n = s->len - s->rpos < IBUF ? (size_t)(s->len - s->rpos) : IBUF;
  if (raw_pread(s, s->ibuf, n, err) < 0) return -1;
  s->ilen = n;
  return 0;
}

static ssize_t plain_read(struct src *s, unsigned char *out, size_t n, hutch_err *err) {
  if (s->ipos == s->ilen) {
    if (s->raw_eof) return 0;
    if (n >= IBUF) { /* large read, nothing buffered: straight into `out` */
      if (s->rpos >= s->len) {
        s->raw_eof = true;
        return 0;
      }
      size_t k = s->len - s->rpos < n ? (size_t)(s->len - s->rpos) : n;
      if (raw_pread(s, out, k, err) < 0) return -1;
      return (ssize_t)k;
    }
    if (raw_fill(s, err) < 0) return -1;
    if (s->ilen == 0) return 0;
  }
  size_t k = s->ilen - s->ipos < n ? s->ilen - s->ipos : n;
  memcpy(out, s->ibuf + s->ipos, k);
  s->ipos += k;
  return (ssize_t)k;
}

static ssize_t gz_read(struct src *s, unsigned char *out, size_t n, hutch_err *err) {
  if (n > UINT_MAX) n = UINT_MAX;
  for (;;) {
    if (s->out_eof) return 0;
    if (s->ipos == s->ilen && !s->raw_eof && raw_fill(s, err) < 0) return -1;
    size_t avail = s->ilen - s->ipos;
    s->z.next_in = s->ibuf + s->ipos;
    s->z.avail_in = (uInt)avail;
    s->z.next_out = out;
    s->z.avail_out = (uInt)n;
    int r = inflate(&s->z, Z_NO_FLUSH);
    s->ipos += avail - s->z.avail_in;
    size_t got = n - s->z.avail_out;
    if (r == Z_STREAM_END) {
      /* Another member may follow (concatenated gzip); anything else after
       * the stream (padding) is read for the digest and otherwise ignored. */
      if (s->ipos == s->ilen && !s->raw_eof && raw_fill(s, err) < 0) return -1;
      if (s->ipos < s->ilen && s->ibuf[s->ipos] == 0x1f) {
        if (inflateReset(&s->z) != Z_OK) return hutch_err_invalid(err, "gzip: cannot reset the stream");
      } else {
        s->out_eof = true;
      }
      if (got) return (ssize_t)got;
      continue;
    }
    if (r == Z_OK || r == Z_BUF_ERROR) {
      if (got) return (ssize_t)got;
      if (s->raw_eof && s->ipos == s->ilen) return hutch_err_invalid(err, "gzip: unexpected end of data");
      continue;
    }
    if (r == Z_MEM_ERROR) return hutch_err_sys(err, ENOMEM, "gzip");
    return hutch_err_invalid(err, "gzip: %s", s->z.msg ? s->z.msg : "corrupt data");
  }
}

static ssize_t zst_read(struct src *s, unsigned char *out, size_t n, hutch_err *err) {
  for (;;) {
    if (s->ipos == s->ilen && !s->raw_eof && raw_fill(s, err) < 0) return -1;
    if (s->ipos == s->ilen && s->raw_eof && s->zret == 0) return 0; /* ended with a whole frame */
    ZSTD_inBuffer in = {s->ibuf, s->ilen, s->ipos};
    ZSTD_outBuffer o = {out, n, 0};
    size_t r = ZSTD_decompressStream(s->zs, &o, &in);
    s->ipos = in.pos;
    if (ZSTD_isError(r)) return hutch_err_invalid(err, "zstd: %s", ZSTD_getErrorName(r));
    s->zret = r;
    if (o.pos) return (ssize_t)o.pos;
    if (s->ipos == s->ilen && s->raw_eof) {
      if (r != 0) return hutch_err_invalid(err, "zstd: unexpected end of data");
      return 0;
    }
  }
}

static ssize_t src_read(struct src *s, void *buf, size_t n, hutch_err *err) {
  ssize_t r;
  if (s->codec == HUTCH_COMP_GZIP) r = gz_read(s, buf, n, err);
  else if (s->codec == HUTCH_COMP_ZSTD) r = zst_read(s, buf, n, err);
  else r = plain_read(s, buf, n, err);
  if (r > 0) {
    if (s->plain_md) EVP_DigestUpdate(s->plain_md, buf, (size_t)r);
    s->plain_total += (uint64_t)r;
    if (s->max_size && s->plain_total > s->max_size)
      return hutch_err_invalid(err, "larger than %llu bytes uncompressed", (ull)s->max_size);
  }
  return r;
}

/* Read n bytes unless the stream ends first; returns what was read. */
static ssize_t src_read_full(struct src *s, void *buf, size_t n, hutch_err *err) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = src_read(s, (char *)buf + got, n - got, err);
    if (r < 0) return -1;
    if (r == 0) break;
    got += (size_t)r;
  }
  return (ssize_t)got;
}

/* Skip n bytes; *done gets how many there were. */
static int src_skip(struct src *s, uint64_t n, uint64_t *done, hutch_err *err) {
  *done = 0;
  if (s->codec == HUTCH_COMP_NONE && !s->raw_md && !s->plain_md && !s->max_size) {
    size_t take = s->ilen - s->ipos < n ? s->ilen - s->ipos : (size_t)n;
    s->ipos += take;
    uint64_t rest = n - take, avail = s->len - s->rpos;
    uint64_t adv = rest < avail ? rest : avail;
    s->rpos += adv;
    *done = take + adv;
    return 0;
  }
  while (*done < n) {
    size_t want = n - *done < IBUF ? (size_t)(n - *done) : IBUF;
    ssize_t r = src_read(s, s->scratch, want, err);
    if (r < 0) return -1;
    if (r == 0) break;
    *done += (uint64_t)r;
  }
  return 0;
}

static void src_close(struct src *s) {
  if (s->z_live) inflateEnd(&s->z);
  if (s->zs) ZSTD_freeDStream(s->zs);
  if (s->raw_md) EVP_MD_CTX_free(s->raw_md);
  if (s->plain_md) EVP_MD_CTX_free(s->plain_md);
  free(s->ibuf);
  free(s->scratch);
  memset(s, 0, sizeof *s);
  s->fd = -1;
}

static int src_open(struct src *s, const struct hutch_tar_layer *l, bool check, hutch_err *err) {
  memset(s, 0, sizeof *s);
  s->fd = l->fd;
  s->mem = l->fd < 0 ? l->mem : NULL;
  s->off = l->fd < 0 ? 0 : l->off;
  s->len = l->len;
  s->max_size = l->max_size;
  s->ibuf = xmalloc(IBUF);
  s->scratch = xmalloc(IBUF);
  if (check && l->digest) s->raw_md = md_new();
  if (check && l->diff_id) s->plain_md = md_new();
  if (l->fd < 0 && !l->mem && l->len) return hutch_err_sys(err, EINVAL, "layer without data");
  if (raw_fill(s, err) < 0) return -1;
  s->codec = hutch_compression_detect(s->ibuf, s->ilen);
  switch (s->codec) {
  case HUTCH_COMP_NONE: break;
  case HUTCH_COMP_GZIP:
    if (inflateInit2(&s->z, 16 + MAX_WBITS) != Z_OK) return hutch_err_sys(err, ENOMEM, "gzip: inflateInit2");
    s->z_live = true;
    break;
  case HUTCH_COMP_ZSTD:
    s->zs = ZSTD_createDStream();
    if (!s->zs) return hutch_err_sys(err, ENOMEM, "zstd: create stream");
    ZSTD_initDStream(s->zs);
    /* The window bounds the decoder's memory: 128 MiB at most. */
    ZSTD_DCtx_setParameter(s->zs, ZSTD_d_windowLogMax, 27);
    s->zret = 1;
    break;
  default:
    return hutch_err_invalid(err, "%s compression is not supported (use none, gzip or zstd)",
                             hutch_compression_name(s->codec));
  }
  return 0;
}

/* Read to the end (the tar's trailing blocks, anything after a compressed
 * stream) and compare the digests. */
static int src_finish(struct src *s, const struct hutch_tar_layer *l, hutch_err *err) {
  ssize_t r;
  while ((r = src_read(s, s->scratch, IBUF, err)) > 0) {
  }
  if (r < 0) return hutch_err_wrap(err, "after the end of the archive");
  while (!s->raw_eof) {
    s->ipos = s->ilen;
    if (raw_fill(s, err) < 0) return -1;
  }
  char got[72];
  if (s->raw_md) {
    md_hex(s->raw_md, got);
    if (strcmp(got, l->digest))
      return hutch_err_invalid(err, "digest mismatch: expected %.71s, got %s", l->digest, got);
  }
  if (s->plain_md) {
    md_hex(s->plain_md, got);
    if (strcmp(got, l->diff_id))
      return hutch_err_invalid(err, "uncompressed digest (diff_id) mismatch: expected %.71s, got %s", l->diff_id,
                               got);
  }
  return 0;
}

/* ---- tar headers ------------------------------------------------------- */

struct tar_ent {
  char type;
  char *path, *link; /* as in the archive */
  int64_t size, mode, uid, gid, mtime;
  long mtime_ns;
  uint64_t off; /* offset of the entry's first header (extended ones included) */
};

struct pax {
  char *path, *link;
  bool has_size, has_uid, has_gid, has_mtime;
  int64_t size, uid, gid, mtime;
  long mtime_ns;
};

struct tar_rd {
  struct src *s;
  uint64_t pos;                /* offset in the tar stream */
  uint64_t data_left, pad_left; /* of the current entry */
  bool done;
};

static void ent_clear(struct tar_ent *e) {
  free(e->path);
  free(e->link);
  memset(e, 0, sizeof *e);
}

static void pax_clear(struct pax *p) {
  free(p->path);
  free(p->link);
  memset(p, 0, sizeof *p);
}

/* A numeric header field: octal (leading spaces, ended by space or NUL) or
 * GNU base-256 (high bit of the first byte set; 0xff: negative). */
static int parse_num(const unsigned char *f, size_t n, int64_t *out) {
  if (f[0] & 0x80) {
    bool neg = f[0] == 0xff;
    uint64_t v = neg ? 0 : (f[0] & 0x7f);
    for (size_t i = 1; i < n; i++) {
      if (v > (UINT64_MAX >> 8)) return -1;
      v = (v << 8) | (uint8_t)(neg ? ~f[i] : f[i]);
    }
    if (v > INT64_MAX) return -1;
    *out = neg ? -(int64_t)v - 1 : (int64_t)v;
    return 0;
  }
  size_t i = 0;
  while (i < n && f[i] == ' ') i++;
  uint64_t v = 0;
  for (; i < n && f[i] >= '0' && f[i] <= '7'; i++) {
    if (v > ((uint64_t)INT64_MAX >> 3)) return -1;
    v = (v << 3) | (uint64_t)(f[i] - '0');
  }
  for (; i < n; i++)
    if (f[i] != ' ' && f[i] != 0) return -1;
  *out = (int64_t)v;
  return 0;
}

static bool all_zero(const unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i]) return false;
  return true;
}

static bool checksum_ok(const unsigned char *h) {
  int64_t want;
  if (parse_num(h + 148, 8, &want) < 0) return false;
  int64_t u = 0, sg = 0;
  for (int i = 0; i < BLOCK; i++) {
    unsigned char c = (i >= 148 && i < 156) ? ' ' : h[i];
    u += c;
    sg += (signed char)c;
  }
  return want == u || want == sg;
}

static int rd_data(struct tar_rd *tr, void *buf, size_t n, hutch_err *err) {
  ssize_t got = src_read_full(tr->s, buf, n, err);
  if (got < 0) return -1;
  tr->pos += (uint64_t)got;
  if ((size_t)got < n) return hutch_err_invalid(err, "unexpected end of archive at offset %llu", (ull)tr->pos);
  return 0;
}

static int rd_skip(struct tar_rd *tr, uint64_t n, hutch_err *err) {
  uint64_t done;
  if (src_skip(tr->s, n, &done, err) < 0) return -1;
  tr->pos += done;
  if (done < n) return hutch_err_invalid(err, "unexpected end of archive at offset %llu", (ull)tr->pos);
  return 0;
}

static uint64_t pad_of(uint64_t size) { return (BLOCK - size % BLOCK) % BLOCK; }

/* The data of an extended header ('L', 'K', 'x', 'g'), NUL-terminated. */
static char *rd_ext(struct tar_rd *tr, int64_t size, hutch_err *err) {
  char *buf = xmalloc((size_t)size + 1);
  if (rd_data(tr, buf, (size_t)size, err) < 0 || rd_skip(tr, pad_of((uint64_t)size), err) < 0) {
    free(buf);
    return NULL;
  }
  buf[size] = 0;
  return buf;
}

static int pax_decimal(const char *v, size_t n, int64_t *out) {
  if (n == 0 || n > 18) return -1;
  int64_t x = 0;
  for (size_t i = 0; i < n; i++) {
    if (v[i] < '0' || v[i] > '9') return -1;
    x = x * 10 + (v[i] - '0');
  }
  *out = x;
  return 0;
}

static int pax_time(const char *v, size_t n, int64_t *sec, long *ns) {
  bool neg = n && v[0] == '-';
  if (neg) v++, n--;
  const char *dot = memchr(v, '.', n);
  size_t ni = dot ? (size_t)(dot - v) : n;
  if (pax_decimal(v, ni, sec) < 0) return -1;
  long f = 0;
  if (dot) {
    size_t nf = n - ni - 1;
    for (size_t i = 0; i < nf; i++) {
      if (dot[1 + i] < '0' || dot[1 + i] > '9') return -1;
      if (i < 9) f = f * 10 + (dot[1 + i] - '0');
    }
    for (size_t i = nf; i < 9; i++) f *= 10;
  }
  if (neg) { /* -1.25 is 2 s before -1 + 0.75 */
    *sec = -*sec;
    if (f) {
      *sec -= 1;
      f = 1000000000L - f;
    }
  }
  *ns = f;
  return 0;
}

static int pax_str(char **dst, const char *v, size_t n, const char *key, uint64_t off, hutch_err *err) {
  if (memchr(v, 0, n)) return hutch_err_invalid(err, "pax header at offset %llu: `%s` contains a NUL byte", (ull)off, key);
  if (n > HUTCH_TAR_NAME_MAX)
    return hutch_err_invalid(err, "pax header at offset %llu: `%s` longer than %d bytes", (ull)off, key,
                             HUTCH_TAR_NAME_MAX);
  free(*dst);
  *dst = n ? xstrndup(v, n) : NULL;
  return 0;
}

/* Records "<len> <key>=<value>\n"; the keys hutch uses override the header. */
static int pax_parse(const char *p, size_t n, struct pax *px, uint64_t off, hutch_err *err) {
  while (n > 0) {
    if (p[0] == 0 && all_zero((const unsigned char *)p, n)) break;
    size_t i = 0, len = 0;
    while (i < n && i < 8 && p[i] >= '0' && p[i] <= '9') len = len * 10 + (size_t)(p[i++] - '0');
    if (i == 0 || i >= n || p[i] != ' ' || len > n || len < i + 4 || p[len - 1] != '\n')
      return hutch_err_invalid(err, "malformed pax header at offset %llu", (ull)off);
    const char *kv = p + i + 1;
    size_t kvlen = len - i - 2;
    const char *eq = memchr(kv, '=', kvlen);
    if (!eq || eq == kv) return hutch_err_invalid(err, "malformed pax record at offset %llu", (ull)off);
    size_t klen = (size_t)(eq - kv);
    const char *v = eq + 1;
    size_t vlen = kvlen - klen - 1;
#define KEY(s) (klen == sizeof(s) - 1 && !memcmp(kv, s, klen))
    if (KEY("path")) {
      if (pax_str(&px->path, v, vlen, "path", off, err) < 0) return -1;
    } else if (KEY("linkpath")) {
      if (pax_str(&px->link, v, vlen, "linkpath", off, err) < 0) return -1;
    } else if ((KEY("size") || KEY("uid") || KEY("gid")) && vlen) {
      int64_t x;
      if (pax_decimal(v, vlen, &x) < 0)
        return hutch_err_invalid(err, "pax header at offset %llu: bad `%.*s`", (ull)off, (int)klen, kv);
      if (KEY("size")) px->size = x, px->has_size = true;
      else if (KEY("uid")) px->uid = x, px->has_uid = true;
      else px->gid = x, px->has_gid = true;
    } else if (KEY("mtime")) {
      if (vlen && pax_time(v, vlen, &px->mtime, &px->mtime_ns) < 0)
        return hutch_err_invalid(err, "pax header at offset %llu: bad `mtime`", (ull)off);
      px->has_mtime = vlen > 0;
    } else if (klen > 11 && !memcmp(kv, "GNU.sparse.", 11)) {
      return hutch_err_invalid(err, "pax header at offset %llu: sparse files are not supported", (ull)off);
    }
#undef KEY
    p += len;
    n -= len;
  }
  return 0;
}

static bool header_only(char t) { return t == '1' || t == '2' || t == '3' || t == '4' || t == '5' || t == '6'; }

/* Skip what is left of the current entry. */
static int tar_skip_rest(struct tar_rd *tr, hutch_err *err) {
  uint64_t n = tr->data_left + tr->pad_left;
  tr->data_left = tr->pad_left = 0;
  return n ? rd_skip(tr, n, err) : 0;
}

/* Read the current entry's data. */
static ssize_t tar_read(struct tar_rd *tr, void *buf, size_t n, hutch_err *err) {
  if (n > tr->data_left) n = (size_t)tr->data_left;
  if (n == 0) return 0;
  if (rd_data(tr, buf, n, err) < 0) return -1;
  tr->data_left -= n;
  return (ssize_t)n;
}

/* Next entry: 1, 0 at the end, -1 with err set. */
static int tar_next(struct tar_rd *tr, struct tar_ent *e, hutch_err *err) {
  ent_clear(e);
  if (tar_skip_rest(tr, err) < 0) return -1;
  if (tr->done) return 0;
  char *lname = NULL, *llink = NULL;
  struct pax px;
  memset(&px, 0, sizeof px);
  bool ext = false;
  uint64_t first = tr->pos;
  int ret = -1;
  for (;;) {
    unsigned char h[BLOCK];
    uint64_t off = tr->pos;
    ssize_t got = src_read_full(tr->s, h, BLOCK, err);
    if (got < 0) goto out;
    tr->pos += (uint64_t)got;
    if (got == 0 && !ext) { /* the end without an end-of-archive marker */
      tr->done = true;
      ret = 0;
      goto out;
    }
    if (got < BLOCK) {
      hutch_err_invalid(err, "truncated tar header at offset %llu", (ull)off);
      goto out;
    }
    if (all_zero(h, BLOCK)) {
      if (ext) {
        hutch_err_invalid(err, "end of archive right after an extended header at offset %llu", (ull)first);
        goto out;
      }
      tr->done = true;
      ret = 0;
      goto out;
    }
    if (!checksum_ok(h)) {
      hutch_err_invalid(err, "tar header checksum mismatch at offset %llu", (ull)off);
      goto out;
    }
    char type = (char)h[156];
    int64_t size;
    if (parse_num(h + 124, 12, &size) < 0) {
      hutch_err_invalid(err, "bad size field in tar header at offset %llu", (ull)off);
      goto out;
    }
    if (size < 0) {
      hutch_err_invalid(err, "negative size in tar header at offset %llu", (ull)off);
      goto out;
    }
    if (type == 'L' || type == 'K') {
      if (size > HUTCH_TAR_NAME_MAX + 1) {
        hutch_err_invalid(err, "name longer than %d bytes in tar header at offset %llu", HUTCH_TAR_NAME_MAX, (ull)off);
        goto out;
      }
      char *s = rd_ext(tr, size, err);
      if (!s) goto out;
      if (strlen(s) > HUTCH_TAR_NAME_MAX) {
        free(s);
        hutch_err_invalid(err, "name longer than %d bytes in tar header at offset %llu", HUTCH_TAR_NAME_MAX, (ull)off);
        goto out;
      }
      char **dst = type == 'L' ? &lname : &llink;
      free(*dst);
      *dst = s;
      ext = true;
      continue;
    }
    if (type == 'x' || type == 'X' || type == 'g') { /* 'X': Solaris' name for 'x' */
      if (size > (int64_t)HUTCH_TAR_PAX_MAX) {
        hutch_err_invalid(err, "pax header larger than %u bytes at offset %llu", HUTCH_TAR_PAX_MAX, (ull)off);
        goto out;
      }
      char *s = rd_ext(tr, size, err);
      if (!s) goto out;
      int r = type != 'g' ? pax_parse(s, (size_t)size, &px, off, err) : 0;
      free(s);
      if (r < 0) goto out;
      ext = true;
      continue;
    }
    /* A real entry. */
    e->off = first;
    e->type = type;
    if (parse_num(h + 100, 8, &e->mode) < 0 || parse_num(h + 108, 8, &e->uid) < 0 ||
        parse_num(h + 116, 8, &e->gid) < 0 || parse_num(h + 136, 12, &e->mtime) < 0) {
      hutch_err_invalid(err, "bad numeric field in tar header at offset %llu", (ull)off);
      goto out;
    }
    if (px.path) e->path = steal_pointer(&px.path);
    else if (lname) e->path = steal_pointer(&lname);
    else {
      size_t nl = strnlen((const char *)h, 100);
      if (!memcmp(h + 257, "ustar\0", 6) && h[345]) {
        size_t pl = strnlen((const char *)h + 345, 155);
        e->path = xasprintf("%.*s/%.*s", (int)pl, (const char *)h + 345, (int)nl, (const char *)h);
      } else {
        e->path = xstrndup((const char *)h, nl);
      }
    }
    if (px.link) e->link = steal_pointer(&px.link);
    else if (llink) e->link = steal_pointer(&llink);
    else e->link = xstrndup((const char *)h + 157, strnlen((const char *)h + 157, 100));
    if (px.has_size) size = px.size;
    if (px.has_uid) e->uid = px.uid;
    if (px.has_gid) e->gid = px.gid;
    e->mtime_ns = 0;
    if (px.has_mtime) e->mtime = px.mtime, e->mtime_ns = px.mtime_ns;
    if ((type == '0' || type == 0) && e->path[0] && e->path[strlen(e->path) - 1] == '/') e->type = type = '5';
    if (type == 0 || type == '7') e->type = type = '0';
    if (size < 0) {
      hutch_err_invalid(err, "negative size in pax header at offset %llu", (ull)first);
      goto out;
    }
    e->size = header_only(type) ? 0 : size;
    tr->data_left = (uint64_t)e->size;
    tr->pad_left = pad_of((uint64_t)e->size);
    ret = 1;
    goto out;
  }
out:
  free(lname);
  free(llink);
  pax_clear(&px);
  return ret;
}

/* ---- paths ------------------------------------------------------------- */

char *hutch_tar_clean_path(const char *in, char *out) {
  size_t o = 0;
  const char *p = in;
  while (*p) {
    while (*p == '/') p++;
    if (!*p) break;
    const char *c = p;
    while (*p && *p != '/') p++;
    size_t n = (size_t)(p - c);
    if (n == 1 && c[0] == '.') continue;
    if (n == 2 && c[0] == '.' && c[1] == '.') {
      while (o > 0 && out[o - 1] != '/') o--;
      if (o > 0) o--; /* the slash before the dropped component */
      continue;
    }
    if (o) out[o++] = '/';
    memmove(out + o, c, n);
    o += n;
  }
  out[o] = 0;
  return out;
}

/* Split a cleaned, non-empty path in place: *dir ("" for the root), *name. */
static void split_path(char *p, const char **dir, const char **name) {
  char *s = strrchr(p, '/');
  if (s) {
    *s = 0;
    *dir = p;
    *name = s + 1;
  } else {
    *dir = "";
    *name = p;
  }
}

#define WH_PREFIX ".wh."
#define WH_OPAQUE ".wh..wh..opq"

static bool is_whiteout(const char *name) { return !strncmp(name, WH_PREFIX, 4); }

/* ---- removal inside the root ------------------------------------------- */

/* Empty the directory `fd` (owned, closed here) without following symlinks
 * and without crossing into another filesystem.  Iterative, one fd held at
 * a time: a subdirectory is entered, emptied, and removed from its parent
 * reached through ".." (the tree is ours and nothing else changes it). */
static int clear_dir(int fd, dev_t dev, hutch_err *err) {
  char **stack = NULL;
  size_t depth = 0, cap = 0;
  int ret = -1;
  for (;;) {
    int dfd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dfd < 0) {
      hutch_err_sys(err, errno, "dup");
      break;
    }
    DIR *d = fdopendir(dfd);
    if (!d) {
      close(dfd);
      hutch_err_sys(err, errno, "fdopendir");
      break;
    }
    rewinddir(d);
    char *sub = NULL;
    bool failed = false;
    struct dirent *de;
    while ((de = readdir(d))) {
      const char *n = de->d_name;
      if (!strcmp(n, ".") || !strcmp(n, "..")) continue;
      struct stat st;
      if (fstatat(fd, n, &st, AT_SYMLINK_NOFOLLOW) < 0) {
        if (errno == ENOENT) continue;
        failed = true;
        hutch_err_sys(err, errno, "stat `%s`", n);
        break;
      }
      if (S_ISDIR(st.st_mode)) {
        if (st.st_dev != dev) {
          failed = true;
          hutch_err_sys(err, EXDEV, "refusing to cross a mount point at `%s`", n);
          break;
        }
        sub = xstrdup(n);
        break;
      }
      if (unlinkat(fd, n, 0) < 0 && errno != ENOENT) {
        failed = true;
        hutch_err_sys(err, errno, "unlink `%s`", n);
        break;
      }
    }
    closedir(d);
    if (failed) break;
    if (sub) {
      /* No symlink, no mount (bind mounts of the same filesystem included):
       * so that ".." below leads back here. */
      int nfd = openat2_fd(fd, sub, O_RDONLY | O_DIRECTORY | O_NOFOLLOW, BENEATH);
      if (nfd < 0) {
        hutch_err_sys(err, errno, "open `%s`", sub);
        free(sub);
        break;
      }
      if (depth == cap) {
        cap = cap ? cap * 2 : 16;
        stack = xrealloc(stack, cap * sizeof *stack);
      }
      stack[depth++] = sub;
      close(fd);
      fd = nfd;
      continue;
    }
    /* `fd` is empty. */
    if (depth == 0) {
      ret = 0;
      break;
    }
    int up = openat(fd, "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (up < 0) {
      hutch_err_sys(err, errno, "open `..`");
      break;
    }
    close(fd);
    fd = up;
    char *name = stack[--depth];
    int r = unlinkat(fd, name, AT_REMOVEDIR);
    if (r < 0 && errno != ENOENT) hutch_err_sys(err, errno, "rmdir `%s`", name);
    free(name);
    if (r < 0 && errno != ENOENT) break;
  }
  while (depth) free(stack[--depth]);
  free(stack);
  close(fd);
  return ret;
}

/* Remove `name` in the directory `dfd`, recursively, if it exists. */
static int remove_at(int dfd, const char *name, hutch_err *err) {
  struct stat st;
  if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
    if (errno == ENOENT) return 0;
    return hutch_err_sys(err, errno, "stat `%s`", name);
  }
  if (!S_ISDIR(st.st_mode)) {
    if (unlinkat(dfd, name, 0) < 0 && errno != ENOENT) return hutch_err_sys(err, errno, "unlink `%s`", name);
    return 0;
  }
  int fd = openat2_fd(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW, BENEATH);
  if (fd < 0) return hutch_err_sys(err, errno, "open `%s`", name);
  if (clear_dir(fd, st.st_dev, err) < 0) return hutch_err_wrap(err, "remove `%s`", name);
  if (unlinkat(dfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT) return hutch_err_sys(err, errno, "rmdir `%s`", name);
  return 0;
}

/* ---- extraction -------------------------------------------------------- */

struct dirtime {
  char *path;
  struct timespec ts[2];
};

struct xstate {
  int root;
  char **wh; /* whiteouts of this layer: cleaned paths */
  size_t n_wh, cap_wh, wh_bytes;
  struct dirtime *dt;
  size_t n_dt, cap_dt, dt_bytes;
  unsigned char *buf;
};

static uid_t clamp_id(int64_t v) { return v < 0 || v >= 65536 ? ID_NOBODY : (uid_t)v; }

static void ent_times(const struct tar_ent *e, struct timespec ts[2]) {
  ts[0].tv_sec = ts[1].tv_sec = (time_t)e->mtime;
  ts[0].tv_nsec = ts[1].tv_nsec = e->mtime_ns;
}

/* The in-root directory `dir`, created (0755, like its missing parents)
 * when missing.  Returns an O_PATH fd. */
static int make_parents(int root, const char *dir, hutch_err *err) {
  int fd = open_in_root(root, dir, O_PATH);
  if (fd >= 0) return fd;
  if (errno != ENOENT) return fs_fail(err, errno, "parent directory " Q, dir);
  cleanup_free char *p = xstrdup(dir);
  int cur = open_in_root(root, "", O_PATH);
  if (cur < 0) return hutch_err_sys(err, errno, "open the root");
  char *c = p;
  for (;;) {
    char *slash = strchr(c, '/');
    if (slash) *slash = 0;
    int next = open_in_root(root, p, O_PATH);
    if (next < 0 && errno == ENOENT) {
      if (mkdirat(cur, c, 0755) == 0) {
        fchmodat(cur, c, 0755, 0); /* whatever the umask; it is our new directory */
      } else if (errno != EEXIST) {
        int e = errno;
        close(cur);
        return fs_fail(err, e, "create directory " Q, p);
      }
      next = open_in_root(root, p, O_PATH);
    }
    if (next < 0) {
      int e = errno;
      close(cur);
      return fs_fail(err, e, "parent directory " Q, p);
    }
    close(cur);
    cur = next;
    if (!slash) break;
    *slash = '/';
    c = slash + 1;
  }
  return cur;
}

static int set_dir_meta(struct xstate *x, int dfd, const char *path, const struct tar_ent *e, hutch_err *err) {
  if (fchown(dfd, clamp_id(e->uid), clamp_id(e->gid)) < 0) return hutch_err_sys(err, errno, "chown");
  if (fchmod(dfd, (mode_t)(e->mode & 07777)) < 0) return hutch_err_sys(err, errno, "chmod");
  struct timespec ts[2];
  ent_times(e, ts);
  size_t l = strlen(path);
  if (x->n_dt < DIRTIME_MAX && x->dt_bytes + l < DIRTIME_BYTES) {
    if (x->n_dt == x->cap_dt) {
      x->cap_dt = x->cap_dt ? x->cap_dt * 2 : 16;
      x->dt = xrealloc(x->dt, x->cap_dt * sizeof *x->dt);
    }
    x->dt[x->n_dt].path = xstrdup(path);
    memcpy(x->dt[x->n_dt].ts, ts, sizeof ts);
    x->n_dt++;
    x->dt_bytes += l + 1;
  } else if (futimens(dfd, ts) < 0) {
    return hutch_err_sys(err, errno, "set times");
  }
  return 0;
}

static int apply_dirtimes(struct xstate *x, hutch_err *err) {
  for (size_t i = 0; i < x->n_dt; i++) {
    char *p = x->dt[i].path;
    int r;
    if (!p[0]) {
      int fd = open_in_root(x->root, "", O_RDONLY);
      if (fd < 0) return hutch_err_sys(err, errno, "open the root");
      r = futimens(fd, x->dt[i].ts);
      close(fd);
    } else {
      const char *dir, *name;
      split_path(p, &dir, &name);
      int pfd = open_in_root(x->root, dir, O_PATH);
      if (pfd < 0) continue; /* replaced by a later entry */
      r = utimensat(pfd, name, x->dt[i].ts, AT_SYMLINK_NOFOLLOW);
      if (r < 0 && errno == ENOENT) r = 0;
      close(pfd);
    }
    if (r < 0) return hutch_err_sys(err, errno, "set times of " Q, p);
  }
  return 0;
}

static void xstate_free(struct xstate *x) {
  for (size_t i = 0; i < x->n_wh; i++) free(x->wh[i]);
  free(x->wh);
  for (size_t i = 0; i < x->n_dt; i++) free(x->dt[i].path);
  free(x->dt);
  free(x->buf);
}

/* Apply a whiteout: `path` is cleaned and its last component starts with
 * ".wh.".  Only what lower layers put there exists at this point. */
static int apply_whiteout(int root, char *path, hutch_err *err) {
  const char *dir, *name;
  split_path(path, &dir, &name);
  if (!strcmp(name, WH_OPAQUE)) {
    int fd = open_in_root(root, dir, O_RDONLY);
    if (fd < 0) {
      if (errno == ENOENT || errno == ENOTDIR) return 0;
      return fs_fail(err, errno, "opaque directory " Q, dir);
    }
    struct stat st;
    if (fstat(fd, &st) < 0) {
      int e = errno;
      close(fd);
      return hutch_err_sys(err, e, "stat " Q, dir);
    }
    if (clear_dir(fd, st.st_dev, err) < 0) return hutch_err_wrap(err, "opaque directory `%.256s`", dir);
    return 0;
  }
  const char *victim = name + 4;
  int pfd = open_in_root(root, dir, O_PATH);
  if (pfd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return 0;
    return fs_fail(err, errno, "whiteout in " Q, dir);
  }
  int r = remove_at(pfd, victim, err);
  close(pfd);
  return r < 0 ? hutch_err_wrap(err, "whiteout of `%.256s` in `%.256s`", victim, dir) : 0;
}

/* Checks shared by both passes; *clean gets the cleaned path (allocated). */
static int check_entry(const struct tar_ent *e, char **clean, hutch_err *err) {
  *clean = NULL;
  switch (e->type) {
  case '0': case '1': case '2': case '3': case '4': case '5': case '6': break;
  case 'S': return hutch_err_invalid(err, "sparse files are not supported");
  case 'V': break; /* a volume label: skipped */
  default:
    if (e->type >= 0x20 && e->type < 0x7f) return hutch_err_invalid(err, "unsupported entry type '%c'", e->type);
    return hutch_err_invalid(err, "unsupported entry type 0x%02x", (unsigned char)e->type);
  }
  char *c = hutch_tar_clean_path(e->path, xmalloc(strlen(e->path) + 1));
  if (!c[0] && e->type != '5' && e->type != 'V' && e->type != '3' && e->type != '4') {
    free(c);
    return hutch_err_invalid(err, "a non-directory entry names the root directory");
  }
  const char *base = strrchr(c, '/') ? strrchr(c, '/') + 1 : c;
  for (const char *q = c; q < base; q = strchr(q, '/') + 1)
    if (is_whiteout(q)) { /* a whiteout name as a directory */
      hutch_err_invalid(err, "whiteout name `%.*s` used as a directory", (int)(strchr(q, '/') - q), q);
      free(c);
      return -1;
    }
  if (is_whiteout(base) && strcmp(base, WH_OPAQUE) && strncmp(base, WH_PREFIX WH_PREFIX, 8)) {
    const char *v = base + 4;
    if (!v[0] || !strcmp(v, ".") || !strcmp(v, "..")) {
      hutch_err_invalid(err, "malformed whiteout name `%s`", base);
      free(c);
      return -1;
    }
  }
  if ((e->type == '1' || e->type == '2') && !e->link[0]) {
    free(c);
    return hutch_err_invalid(err, "empty link target");
  }
  *clean = c;
  return 0;
}

static int write_data(struct xstate *x, struct tar_rd *tr, int fd, hutch_err *err) {
  for (;;) {
    ssize_t n = tar_read(tr, x->buf, IBUF, err);
    if (n < 0) return -1;
    if (n == 0) return 0;
    if (write_full(fd, x->buf, (size_t)n) < 0) return hutch_err_sys(err, errno, "write");
  }
}

static int extract_entry(struct xstate *x, struct tar_rd *tr, const struct tar_ent *e, char *path, hutch_err *err) {
  if (e->type == '3' || e->type == '4' || e->type == 'V') return 0;
  const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
  if (path[0] && is_whiteout(base)) return 0; /* applied before this pass */
  if (!path[0]) { /* the root directory itself */
    cleanup_close int fd = open_in_root(x->root, "", O_RDONLY);
    if (fd < 0) return hutch_err_sys(err, errno, "open the root");
    return set_dir_meta(x, fd, "", e, err);
  }
  cleanup_free char *full = xstrdup(path);
  const char *dir, *name;
  split_path(path, &dir, &name);
  /* A hard link's target, resolved in the root before anything changes. */
  cleanup_free char *tpath = NULL;
  cleanup_close int tpfd = -1;
  const char *tdir = NULL, *tname = NULL;
  if (e->type == '1') {
    tpath = hutch_tar_clean_path(e->link, xmalloc(strlen(e->link) + 1));
    if (!tpath[0]) return hutch_err_invalid(err, "hard link to the root directory");
    if (!strcmp(tpath, full)) return 0; /* a link to itself: nothing to do */
    split_path(tpath, &tdir, &tname);
    tpfd = open_in_root(x->root, tdir, O_PATH);
    if (tpfd < 0) return fs_fail(err, errno, "hard link target `%.256s`", e->link);
    struct stat tst;
    if (fstatat(tpfd, tname, &tst, AT_SYMLINK_NOFOLLOW) < 0)
      return fs_fail(err, errno, "hard link target `%.256s`", e->link);
    if (S_ISDIR(tst.st_mode)) return hutch_err_invalid(err, "hard link target `%.256s` is a directory", e->link);
  }
  cleanup_close int pfd = make_parents(x->root, dir, err);
  if (pfd < 0) return -1;
  struct stat st;
  bool exists = fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0;
  if (!exists && errno != ENOENT) return fs_fail(err, errno, "stat");
  if (e->type == '5') {
    if (!exists || !S_ISDIR(st.st_mode)) {
      if (exists && remove_at(pfd, name, err) < 0) return -1;
      if (mkdirat(pfd, name, 0700) < 0) return fs_fail(err, errno, "mkdir");
    }
    cleanup_close int dfd = openat(pfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0) return fs_fail(err, errno, "open directory");
    return set_dir_meta(x, dfd, full, e, err);
  }
  if (exists && remove_at(pfd, name, err) < 0) return -1;
  struct timespec ts[2];
  ent_times(e, ts);
  uid_t uid = clamp_id(e->uid);
  gid_t gid = clamp_id(e->gid);
  switch (e->type) {
  case '0': {
    cleanup_close int fd = openat(pfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return fs_fail(err, errno, "create");
    if (write_data(x, tr, fd, err) < 0) return -1;
    /* chown first: it clears the setuid bits chmod then sets. */
    if (fchown(fd, uid, gid) < 0) return hutch_err_sys(err, errno, "chown");
    if (fchmod(fd, (mode_t)(e->mode & 07777)) < 0) return hutch_err_sys(err, errno, "chmod");
    if (futimens(fd, ts) < 0) return hutch_err_sys(err, errno, "set times");
    return 0;
  }
  case '6': {
    if (mkfifoat(pfd, name, 0600) < 0) return fs_fail(err, errno, "mkfifo");
    /* Opening a fifo to read without blocking needs no writer. */
    cleanup_close int fd = openat(pfd, name, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return hutch_err_sys(err, errno, "open fifo");
    if (fchown(fd, uid, gid) < 0) return hutch_err_sys(err, errno, "chown");
    if (fchmod(fd, (mode_t)(e->mode & 07777)) < 0) return hutch_err_sys(err, errno, "chmod");
    if (futimens(fd, ts) < 0) return hutch_err_sys(err, errno, "set times");
    return 0;
  }
  case '2':
    if (symlinkat(e->link, pfd, name) < 0) return fs_fail(err, errno, "symlink");
    if (fchownat(pfd, name, uid, gid, AT_SYMLINK_NOFOLLOW) < 0) return hutch_err_sys(err, errno, "chown");
    if (utimensat(pfd, name, ts, AT_SYMLINK_NOFOLLOW) < 0) return hutch_err_sys(err, errno, "set times");
    return 0;
  case '1':
    if (linkat(tpfd, tname, pfd, name, 0) < 0) return fs_fail(err, errno, "hard link to `%.256s`", e->link);
    return 0;
  default: return 0;
  }
}

static int collect_whiteout(struct xstate *x, char *path, hutch_err *err) {
  size_t l = strlen(path);
  if (x->n_wh >= WHITEOUT_MAX || x->wh_bytes + l >= WHITEOUT_BYTES)
    return hutch_err_invalid(err, "more than %d whiteouts in one layer", WHITEOUT_MAX);
  if (x->n_wh == x->cap_wh) {
    x->cap_wh = x->cap_wh ? x->cap_wh * 2 : 16;
    x->wh = xrealloc(x->wh, x->cap_wh * sizeof *x->wh);
  }
  x->wh[x->n_wh++] = path;
  x->wh_bytes += l + 1;
  return 0;
}

static int wrap_entry(hutch_err *err, const struct tar_ent *e) {
  return hutch_err_wrap(err, "entry `%.256s` at offset %llu", e->path, (ull)e->off);
}

/* Pass 1: check everything, digests included; collect the whiteouts. */
static int pass_check(struct xstate *x, const struct hutch_tar_layer *l, hutch_err *err) {
  struct src s;
  struct tar_rd tr;
  struct tar_ent e;
  memset(&tr, 0, sizeof tr);
  memset(&e, 0, sizeof e);
  int ret = -1, r;
  if (src_open(&s, l, true, err) < 0) goto out;
  tr.s = &s;
  while ((r = tar_next(&tr, &e, err)) > 0) {
    char *c;
    if (check_entry(&e, &c, err) < 0) {
      wrap_entry(err, &e);
      goto out;
    }
    const char *base = strrchr(c, '/') ? strrchr(c, '/') + 1 : c;
    if (c[0] && is_whiteout(base) && (!strcmp(base, WH_OPAQUE) || strncmp(base, WH_PREFIX WH_PREFIX, 8))) {
      if (collect_whiteout(x, c, err) < 0) {
        free(c);
        goto out;
      }
    } else {
      free(c);
    }
  }
  if (r < 0) goto out;
  ret = src_finish(&s, l, err);
out:
  if (ret < 0 && s.raw_md && !s.raw_eof) {
    /* Damaged bytes are better reported as such: finish the digest. */
    hutch_err e2 = HUTCH_ERR_INIT;
    while (!s.raw_eof) {
      s.ipos = s.ilen;
      if (raw_fill(&s, &e2) < 0) break;
    }
    char got[72];
    if (s.raw_eof) {
      md_hex(s.raw_md, got);
      if (strcmp(got, l->digest)) {
        hutch_err_clear(err);
        hutch_err_invalid(err, "digest mismatch: expected %.71s, got %s", l->digest, got);
      }
    }
  }
  ent_clear(&e);
  src_close(&s);
  return ret;
}

static int pass_extract(struct xstate *x, const struct hutch_tar_layer *l, hutch_err *err) {
  struct src s;
  struct tar_rd tr;
  struct tar_ent e;
  memset(&tr, 0, sizeof tr);
  memset(&e, 0, sizeof e);
  int ret = -1, r;
  if (src_open(&s, l, false, err) < 0) goto out;
  tr.s = &s;
  while ((r = tar_next(&tr, &e, err)) > 0) {
    char *c;
    if (check_entry(&e, &c, err) < 0) {
      wrap_entry(err, &e);
      goto out;
    }
    r = extract_entry(x, &tr, &e, c, err);
    free(c);
    if (r < 0) {
      wrap_entry(err, &e);
      goto out;
    }
  }
  if (r < 0) goto out;
  ret = apply_dirtimes(x, err);
out:
  ent_clear(&e);
  src_close(&s);
  return ret;
}

int hutch_tar_apply(int root_dirfd, const struct hutch_tar_layer *l, hutch_err *err) {
  if (l->digest && !digest_valid(l->digest))
    return hutch_err_invalid(err, "unsupported digest `%.80s` (expected sha256:<64 hex digits>)", l->digest);
  if (l->diff_id && !digest_valid(l->diff_id))
    return hutch_err_invalid(err, "unsupported diff_id `%.80s` (expected sha256:<64 hex digits>)", l->diff_id);
  struct xstate x;
  memset(&x, 0, sizeof x);
  x.root = root_dirfd;
  x.buf = xmalloc(IBUF);
  int ret = -1;
  if (pass_check(&x, l, err) < 0) goto out;
  for (size_t i = 0; i < x.n_wh; i++) {
    cleanup_free char *shown = xstrdup(x.wh[i]);
    if (apply_whiteout(root_dirfd, x.wh[i], err) < 0) {
      hutch_err_wrap(err, "entry `%.256s`", shown);
      goto out;
    }
  }
  ret = pass_extract(&x, l, err);
out:
  xstate_free(&x);
  return ret;
}

int hutch_tar_extract_fd(int fd, int root_dirfd, hutch_err *err) {
  struct stat st;
  if (fstat(fd, &st) < 0) return hutch_err_sys(err, errno, "stat layer");
  if (!S_ISREG(st.st_mode)) return hutch_err_invalid(err, "layer is not a regular file");
  struct hutch_tar_layer l = {.fd = fd, .off = 0, .len = (uint64_t)st.st_size};
  return hutch_tar_apply(root_dirfd, &l, err);
}

int hutch_tar_extract_mem(const void *data, size_t n, int root_dirfd, hutch_err *err) {
  struct hutch_tar_layer l = {.fd = -1, .mem = data, .len = n};
  return hutch_tar_apply(root_dirfd, &l, err);
}

/* ---- member index of an uncompressed tar file -------------------------- */

static int member_cmp(const void *a, const void *b) {
  const struct hutch_tar_member *x = a, *y = b;
  int c = strcmp(x->path, y->path);
  if (c) return c;
  return x->seq < y->seq ? -1 : x->seq > y->seq;
}

void hutch_tar_index_free(struct hutch_tar_index *idx) {
  for (size_t i = 0; i < idx->n; i++) {
    free(idx->m[i].path);
    free(idx->m[i].link);
  }
  free(idx->m);
  idx->m = NULL;
  idx->n = 0;
}

int hutch_tar_index_fd(int fd, struct hutch_tar_index *idx, hutch_err *err) {
  memset(idx, 0, sizeof *idx);
  struct stat st;
  if (fstat(fd, &st) < 0) return hutch_err_sys(err, errno, "stat");
  if (!S_ISREG(st.st_mode)) return hutch_err_invalid(err, "not a regular file");
  struct hutch_tar_layer l = {.fd = fd, .len = (uint64_t)st.st_size};
  struct src s;
  struct tar_rd tr;
  struct tar_ent e;
  memset(&tr, 0, sizeof tr);
  memset(&e, 0, sizeof e);
  int ret = -1, r;
  size_t cap = 0, seq = 0;
  if (src_open(&s, &l, false, err) < 0) goto out;
  if (s.codec != HUTCH_COMP_NONE) {
    hutch_err_invalid(err, "a %s-compressed archive is not supported: decompress it first",
                      hutch_compression_name(s.codec));
    goto out;
  }
  tr.s = &s;
  while ((r = tar_next(&tr, &e, err)) > 0) {
    seq++;
    if (e.type != '0' && e.type != '1' && e.type != '2') continue;
    if (idx->n >= HUTCH_TAR_INDEX_MAX) {
      hutch_err_invalid(err, "more than %d members", HUTCH_TAR_INDEX_MAX);
      goto out;
    }
    if ((uint64_t)e.size > l.len - tr.pos) {
      hutch_err_invalid(err, "member `%.256s` at offset %llu: truncated (%llu bytes, file ends before)", e.path,
                        (ull)e.off, (ull)e.size);
      goto out;
    }
    if (idx->n == cap) {
      cap = cap ? cap * 2 : 64;
      idx->m = xrealloc(idx->m, cap * sizeof *idx->m);
    }
    struct hutch_tar_member *m = &idx->m[idx->n++];
    m->path = hutch_tar_clean_path(e.path, xmalloc(strlen(e.path) + 1));
    m->type = e.type;
    m->link = steal_pointer(&e.link);
    m->off = tr.pos;
    m->size = (uint64_t)e.size;
    m->seq = seq;
  }
  if (r < 0) goto out;
  qsort(idx->m, idx->n, sizeof *idx->m, member_cmp);
  ret = 0;
out:
  ent_clear(&e);
  src_close(&s);
  if (ret < 0) hutch_tar_index_free(idx);
  return ret;
}

/* The last member named `path` (sorted by path, then seq). */
static const struct hutch_tar_member *index_lookup(const struct hutch_tar_index *idx, const char *path) {
  size_t lo = 0, hi = idx->n;
  while (lo < hi) { /* first index with path > `path` */
    size_t mid = lo + (hi - lo) / 2;
    if (strcmp(idx->m[mid].path, path) <= 0) lo = mid + 1;
    else hi = mid;
  }
  if (lo == 0 || strcmp(idx->m[lo - 1].path, path)) return NULL;
  return &idx->m[lo - 1];
}

const struct hutch_tar_member *hutch_tar_index_find(const struct hutch_tar_index *idx, const char *path) {
  cleanup_free char *cur = hutch_tar_clean_path(path, xmalloc(strlen(path) + 1));
  for (int hop = 0; hop <= LINK_HOPS; hop++) {
    const struct hutch_tar_member *m = index_lookup(idx, cur);
    if (!m || m->type == '0') return m;
    char *next;
    if (m->type == '1' || m->link[0] == '/') {
      next = xstrdup(m->link);
    } else { /* relative to the symlink's directory */
      const char *slash = strrchr(m->path, '/');
      next = slash ? xasprintf("%.*s/%s", (int)(slash - m->path), m->path, m->link) : xstrdup(m->link);
    }
    free(cur);
    cur = hutch_tar_clean_path(next, next);
  }
  return NULL;
}
