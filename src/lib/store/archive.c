/* The snapshot export stream (format and guarantees in archive.h). */
#include "store/archive.h"

#include <errno.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include "common/util.h"

#define INVALID(err, ...) hutch_err_set((err), 400, "invalid_archive", __VA_ARGS__)
#define IO_CHUNK (128u * 1024)

static void put_be32(unsigned char *p, uint32_t v) {
  for (int i = 3; i >= 0; i--, v >>= 8) p[i] = (unsigned char)v;
}
static void put_be64(unsigned char *p, uint64_t v) {
  for (int i = 7; i >= 0; i--, v >>= 8) p[i] = (unsigned char)v;
}
static uint32_t get_be32(const unsigned char *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static uint64_t get_be64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = v << 8 | p[i];
  return v;
}

/* Wait for a non-blocking fd instead of failing with EAGAIN. */
static int wait_fd(int fd, short events) {
  struct pollfd p = {.fd = fd, .events = events};
  int r;
  do r = poll(&p, 1, -1);
  while (r < 0 && errno == EINTR);
  return r < 0 ? -1 : 0;
}

/* Whole buffer to out_fd; sockets with MSG_NOSIGNAL (see archive.h). */
static int out_write(int fd, bool sock, const void *buf, size_t n) {
  const char *p = buf;
  while (n > 0) {
    ssize_t r = sock ? send(fd, p, n, MSG_NOSIGNAL) : write(fd, p, n);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (wait_fd(fd, POLLOUT) < 0) return -1;
        continue;
      }
      return -1;
    }
    if (r == 0) {
      errno = EIO;
      return -1;
    }
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

/* Fill buf from a stream; returns bytes read (< n only at EOF) or -1. */
static ssize_t in_read(int fd, void *buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, (char *)buf + got, n - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (wait_fd(fd, POLLIN) < 0) return -1;
        continue;
      }
      return -1;
    }
    if (r == 0) break;
    got += (size_t)r;
  }
  return (ssize_t)got;
}

/* pread all of [off, off+n); returns bytes read (< n only at EOF) or -1. */
static ssize_t pread_full(int fd, void *buf, size_t n, uint64_t off) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(off + got));
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (r == 0) break;
    got += (size_t)r;
  }
  return (ssize_t)got;
}

static bool fd_is_socket(int fd) {
  struct stat st;
  return fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode);
}

/* ---- writing ---------------------------------------------------------- */

int hutch_archive_write(int out_fd, const char *meta_json, int payload_fd, int level,
                        struct hutch_archive_stats *st, hutch_err *err) {
  if (!meta_json) return hutch_err_invalid(err, "archive meta: missing");
  size_t meta_len = strlen(meta_json);
  if (meta_len > HUTCH_ARCHIVE_META_MAX)
    return hutch_err_invalid(err, "archive meta: %zu bytes, over the limit of %u", meta_len,
                             HUTCH_ARCHIVE_META_MAX);
  json_error_t jerr;
  json_t *m = json_loadb(meta_json, meta_len, 0, &jerr);
  bool is_obj = m && json_is_object(m);
  json_decref(m);
  if (!is_obj) return hutch_err_invalid(err, "archive meta: expected a JSON object");
  if (level == 0) level = 3;
  if (level < ZSTD_minCLevel() || level > HUTCH_ARCHIVE_LEVEL_MAX)
    return hutch_err_invalid(err, "archive: compression level %d out of range %d..%d", level, ZSTD_minCLevel(),
                             HUTCH_ARCHIVE_LEVEL_MAX);

  bool sock = fd_is_socket(out_fd);
  size_t in_cap = ZSTD_CStreamInSize(), out_cap = ZSTD_CStreamOutSize();
  unsigned char *in = xmalloc(in_cap), *out = xmalloc(out_cap);
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  ZSTD_CCtx *cc = ZSTD_createCCtx();
  uint64_t raw = 0, comp = 0;
  unsigned char digest[32], trailer[HUTCH_ARCHIVE_TRAILER_LEN], head[HUTCH_ARCHIVE_HEADER_LEN];
  int rc = -1;
  if (!md || !cc) {
    fprintf(stderr, "hutch: out of memory\n");
    abort();
  }
  if (EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
    hutch_err_sys(err, 0, "archive: SHA-256 init failed");
    goto out;
  }
  size_t zr = ZSTD_CCtx_setParameter(cc, ZSTD_c_compressionLevel, level);
  if (!ZSTD_isError(zr)) zr = ZSTD_CCtx_setParameter(cc, ZSTD_c_checksumFlag, 1);
  if (ZSTD_isError(zr)) {
    hutch_err_sys(err, 0, "archive: zstd setup: %s", ZSTD_getErrorName(zr));
    goto out;
  }

  memcpy(head, HUTCH_ARCHIVE_MAGIC, HUTCH_ARCHIVE_MAGIC_LEN);
  put_be32(head + 10, HUTCH_ARCHIVE_VERSION);
  put_be32(head + 14, (uint32_t)meta_len);
  EVP_DigestUpdate(md, head, sizeof head);
  EVP_DigestUpdate(md, meta_json, meta_len);
  if (out_write(out_fd, sock, head, sizeof head) < 0 || out_write(out_fd, sock, meta_json, meta_len) < 0) {
    hutch_err_sys(err, errno, "archive: write header");
    goto out;
  }

  for (bool eof = false; !eof;) {
    ssize_t n = in_read(payload_fd, in, in_cap);
    if (n < 0) {
      hutch_err_sys(err, errno, "archive: read payload");
      goto out;
    }
    raw += (uint64_t)n;
    eof = (size_t)n < in_cap;
    ZSTD_EndDirective mode = eof ? ZSTD_e_end : ZSTD_e_continue;
    ZSTD_inBuffer ib = {in, (size_t)n, 0};
    for (;;) {
      ZSTD_outBuffer ob = {out, out_cap, 0};
      size_t left = ZSTD_compressStream2(cc, &ob, &ib, mode);
      if (ZSTD_isError(left)) {
        hutch_err_sys(err, 0, "archive: zstd compress: %s", ZSTD_getErrorName(left));
        goto out;
      }
      if (ob.pos) {
        EVP_DigestUpdate(md, out, ob.pos);
        if (out_write(out_fd, sock, out, ob.pos) < 0) {
          hutch_err_sys(err, errno, "archive: write payload");
          goto out;
        }
        comp += ob.pos;
      }
      /* continue: done once the input is consumed; end: once flushed. */
      if (eof ? left == 0 : ib.pos == ib.size) break;
    }
  }

  unsigned int dlen = 0;
  if (EVP_DigestFinal_ex(md, digest, &dlen) != 1 || dlen != 32) {
    hutch_err_sys(err, 0, "archive: SHA-256 failed");
    goto out;
  }
  memcpy(trailer, HUTCH_ARCHIVE_TRAILER_MAGIC, 8);
  put_be64(trailer + 8, raw);
  put_be64(trailer + 16, comp);
  memcpy(trailer + 24, digest, 32);
  if (out_write(out_fd, sock, trailer, sizeof trailer) < 0) {
    hutch_err_sys(err, errno, "archive: write trailer");
    goto out;
  }
  if (st) {
    st->raw_bytes = raw;
    st->compressed_bytes = comp;
    st->total_bytes = HUTCH_ARCHIVE_HEADER_LEN + meta_len + comp + HUTCH_ARCHIVE_TRAILER_LEN;
    hex_encode(digest, 32, st->sha256_hex);
  }
  rc = 0;
out:
  ZSTD_freeCCtx(cc);
  EVP_MD_CTX_free(md);
  free(in);
  free(out);
  return rc;
}

/* ---- reading ---------------------------------------------------------- */

struct layout {
  uint64_t size;     /* the whole file */
  uint32_t meta_len;
  uint64_t comp_off; /* header + meta */
  uint64_t comp_len;
  uint64_t raw_len;
  unsigned char sha[32];
};

/* Header and trailer: everything that can be checked without reading the
 * payload.  Bounded reads only. */
static int parse_layout(int fd, struct layout *L, hutch_err *err) {
  struct stat st;
  if (fstat(fd, &st) < 0) return hutch_err_sys(err, errno, "archive: fstat");
  if (!S_ISREG(st.st_mode)) return hutch_err_sys(err, EINVAL, "archive: not a regular file");
  memset(L, 0, sizeof *L);
  L->size = (uint64_t)st.st_size;

  unsigned char head[HUTCH_ARCHIVE_HEADER_LEN];
  size_t want = L->size < sizeof head ? (size_t)L->size : sizeof head;
  ssize_t got = pread_full(fd, head, want, 0);
  if (got < 0) return hutch_err_sys(err, errno, "archive: read header");
  size_t mlen = (size_t)got < HUTCH_ARCHIVE_MAGIC_LEN ? (size_t)got : HUTCH_ARCHIVE_MAGIC_LEN;
  if (memcmp(head, HUTCH_ARCHIVE_MAGIC, mlen) != 0) return INVALID(err, "invalid archive: bad magic");
  if ((size_t)got < sizeof head)
    return INVALID(err, "invalid archive: truncated: header (%zd of %zu bytes)", got, sizeof head);
  uint32_t version = get_be32(head + 10);
  if (version != HUTCH_ARCHIVE_VERSION)
    return INVALID(err, "invalid archive: unsupported version %u (expected %u)", version, HUTCH_ARCHIVE_VERSION);
  L->meta_len = get_be32(head + 14);
  if (L->meta_len > HUTCH_ARCHIVE_META_MAX)
    return INVALID(err, "invalid archive: meta_len %u over the limit of %u bytes", L->meta_len,
                   HUTCH_ARCHIVE_META_MAX);
  L->comp_off = HUTCH_ARCHIVE_HEADER_LEN + (uint64_t)L->meta_len;
  if (L->size < L->comp_off)
    return INVALID(err, "invalid archive: truncated: meta (%u bytes declared, %llu present)", L->meta_len,
                   (unsigned long long)(L->size - HUTCH_ARCHIVE_HEADER_LEN));
  if (L->size < L->comp_off + HUTCH_ARCHIVE_TRAILER_LEN) return INVALID(err, "invalid archive: truncated: trailer missing");

  unsigned char tr[HUTCH_ARCHIVE_TRAILER_LEN];
  uint64_t tr_off = L->size - HUTCH_ARCHIVE_TRAILER_LEN;
  got = pread_full(fd, tr, sizeof tr, tr_off);
  if (got < 0) return hutch_err_sys(err, errno, "archive: read trailer");
  if ((size_t)got < sizeof tr) return INVALID(err, "invalid archive: truncated while reading (file changed?)");
  uint64_t have = tr_off - L->comp_off;
  bool end_magic = memcmp(tr, HUTCH_ARCHIVE_TRAILER_MAGIC, 8) == 0;
  if (!end_magic || get_be64(tr + 16) != have) {
    /* Tell trailing data from truncation or a damaged trailer: look for a
     * consistent trailer before the end, within the last 64 KiB. */
    uint64_t w = have + HUTCH_ARCHIVE_TRAILER_LEN;
    if (w > 65536) w = 65536;
    unsigned char *buf = xmalloc((size_t)w);
    uint64_t base = L->size - w;
    got = pread_full(fd, buf, (size_t)w, base);
    if (got < 0) {
      free(buf);
      return hutch_err_sys(err, errno, "archive: read trailer");
    }
    uint64_t extra = 0;
    for (size_t i = (size_t)got >= 24 ? (size_t)got - 24 + 1 : 0; i-- > 0;) {
      uint64_t at = base + i;
      if (memcmp(buf + i, HUTCH_ARCHIVE_TRAILER_MAGIC, 8) == 0 && at >= L->comp_off &&
          get_be64(buf + i + 16) == at - L->comp_off && at + HUTCH_ARCHIVE_TRAILER_LEN < L->size) {
        extra = L->size - (at + HUTCH_ARCHIVE_TRAILER_LEN);
        break;
      }
    }
    free(buf);
    if (extra)
      return INVALID(err, "invalid archive: %llu bytes of trailing data after the trailer", (unsigned long long)extra);
    if (!end_magic) return INVALID(err, "invalid archive: truncated: trailer missing");
  }
  L->raw_len = get_be64(tr + 8);
  L->comp_len = get_be64(tr + 16);
  memcpy(L->sha, tr + 24, 32);
  if (L->comp_len != have)
    return INVALID(err, "invalid archive: length mismatch: trailer says compressed_len %llu, archive holds %llu",
                   (unsigned long long)L->comp_len, (unsigned long long)have);
  if (L->comp_len == 0) return INVALID(err, "invalid archive: empty payload (no zstd frame)");
  return 0;
}

/* One pass over the archive: hash header, meta and payload, decompress the
 * payload (into out_fd when >= 0), and check the result against the
 * trailer.  *meta_out (when not NULL) gets the meta on success.  Report order:
 * a checksum mismatch first (it explains any other symptom), then the
 * meta, then the payload. */
static int scan(int fd, const struct layout *L, int out_fd, char **meta_out, hutch_err *err) {
  bool sock = out_fd >= 0 && fd_is_socket(out_fd);
  size_t in_cap = IO_CHUNK, out_cap = ZSTD_DStreamOutSize();
  size_t head_len = (size_t)L->comp_off;
  char *head = xmalloc(head_len + 1);
  unsigned char *in = xmalloc(in_cap), *out = xmalloc(out_cap);
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  ZSTD_DCtx *dc = ZSTD_createDCtx();
  char derr[256] = "", merr[256] = "";
  int rc = -1;
  if (!md || !dc) {
    fprintf(stderr, "hutch: out of memory\n");
    abort();
  }
  if (EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
    hutch_err_sys(err, 0, "archive: SHA-256 init failed");
    goto out;
  }
  size_t zr = ZSTD_DCtx_setParameter(dc, ZSTD_d_windowLogMax, HUTCH_ARCHIVE_WINDOW_LOG_MAX);
  if (ZSTD_isError(zr)) {
    hutch_err_sys(err, 0, "archive: zstd setup: %s", ZSTD_getErrorName(zr));
    goto out;
  }

  ssize_t got = pread_full(fd, head, head_len, 0);
  if (got < 0) {
    hutch_err_sys(err, errno, "archive: read meta");
    goto out;
  }
  if ((size_t)got < head_len) {
    INVALID(err, "invalid archive: truncated while reading (file changed?)");
    goto out;
  }
  head[head_len] = 0;
  EVP_DigestUpdate(md, head, head_len);
  const char *meta = head + HUTCH_ARCHIVE_HEADER_LEN;
  json_error_t jerr;
  json_t *m = NULL;
  if (memchr(meta, 0, L->meta_len))
    snprintf(merr, sizeof merr, "meta: contains a NUL byte");
  else if (!(m = json_loadb(meta, L->meta_len, 0, &jerr)))
    snprintf(merr, sizeof merr, "meta: not JSON: %s (line %d)", jerr.text, jerr.line);
  else if (!json_is_object(m))
    snprintf(merr, sizeof merr, "meta: expected a JSON object");
  json_decref(m);

  uint64_t off = L->comp_off, left = L->comp_len, raw = 0;
  size_t hint = 1; /* ZSTD_decompressStream's last result: 0 at a frame's end */
  while (left > 0) {
    size_t n = left < in_cap ? (size_t)left : in_cap;
    got = pread_full(fd, in, n, off);
    if (got < 0) {
      hutch_err_sys(err, errno, "archive: read payload");
      goto out;
    }
    if ((size_t)got < n) {
      INVALID(err, "invalid archive: truncated while reading (file changed?)");
      goto out;
    }
    off += n;
    left -= n;
    EVP_DigestUpdate(md, in, n);
    if (derr[0]) continue; /* keep hashing: a mismatch explains the error */
    ZSTD_inBuffer ib = {in, n, 0};
    for (;;) {
      ZSTD_outBuffer ob = {out, out_cap, 0};
      size_t r = ZSTD_decompressStream(dc, &ob, &ib);
      if (ZSTD_isError(r)) {
        snprintf(derr, sizeof derr, "payload: zstd: %s", ZSTD_getErrorName(r));
        break;
      }
      hint = r;
      if (ob.pos > L->raw_len - raw) {
        snprintf(derr, sizeof derr, "payload: decompresses to more than payload_raw_len (%llu bytes)",
                 (unsigned long long)L->raw_len);
        break;
      }
      raw += ob.pos;
      if (out_fd >= 0 && ob.pos && out_write(out_fd, sock, out, ob.pos) < 0) {
        hutch_err_sys(err, errno, "archive: write payload");
        goto out;
      }
      /* Input used up and output flushed.  r == 0 (a frame just ended)
       * must stop the loop too: another call would start a new frame and
       * leave a nonzero hint behind. */
      if (ib.pos == ib.size && (ob.pos < ob.size || r == 0)) break;
    }
  }

  unsigned char digest[32];
  unsigned int dlen = 0;
  if (EVP_DigestFinal_ex(md, digest, &dlen) != 1 || dlen != 32) {
    hutch_err_sys(err, 0, "archive: SHA-256 failed");
    goto out;
  }
  if (memcmp(digest, L->sha, 32) != 0) {
    INVALID(err, "invalid archive: checksum mismatch");
    goto out;
  }
  if (merr[0]) {
    INVALID(err, "invalid archive: %s", merr);
    goto out;
  }
  if (derr[0]) {
    INVALID(err, "invalid archive: %s", derr);
    goto out;
  }
  if (hint != 0) {
    INVALID(err, "invalid archive: payload: truncated zstd frame");
    goto out;
  }
  if (raw != L->raw_len) {
    INVALID(err, "invalid archive: payload: decompresses to %llu bytes, trailer says %llu",
            (unsigned long long)raw, (unsigned long long)L->raw_len);
    goto out;
  }
  if (meta_out) {
    memmove(head, meta, L->meta_len + 1);
    *meta_out = steal_pointer(&head);
  }
  rc = 0;
out:
  ZSTD_freeDCtx(dc);
  EVP_MD_CTX_free(md);
  free(head);
  free(in);
  free(out);
  return rc;
}

int hutch_archive_verify(int fd, char **meta_json, struct hutch_archive_stats *st, hutch_err *err) {
  struct layout L;
  if (parse_layout(fd, &L, err) < 0) return -1;
  char *meta = NULL;
  if (scan(fd, &L, -1, &meta, err) < 0) return -1;
  if (meta_json)
    *meta_json = meta;
  else
    free(meta);
  if (st) {
    st->raw_bytes = L.raw_len;
    st->compressed_bytes = L.comp_len;
    st->total_bytes = L.size;
    hex_encode(L.sha, 32, st->sha256_hex);
  }
  return 0;
}

int hutch_archive_extract(int fd, int out_fd, hutch_err *err) {
  struct layout L;
  if (parse_layout(fd, &L, err) < 0) return -1;
  return scan(fd, &L, out_fd, NULL, err);
}

int hutch_archive_receive(int in_fd, int file_fd, uint64_t max_bytes, uint64_t *n_out, hutch_err *err) {
  unsigned char *buf = xmalloc(IO_CHUNK);
  uint64_t total = 0;
  int rc = -1;
  for (;;) {
    ssize_t n = in_read(in_fd, buf, IO_CHUNK);
    if (n < 0) {
      hutch_err_sys(err, errno, "archive: read upload");
      goto out;
    }
    if (n == 0) break;
    if ((uint64_t)n > max_bytes - total) {
      hutch_err_set(err, 413, "payload_too_large", "archive over the limit of %llu bytes",
                    (unsigned long long)max_bytes);
      goto out;
    }
    total += (uint64_t)n;
    if (out_write(file_fd, false, buf, (size_t)n) < 0) {
      hutch_err_sys(err, errno, "archive: write upload");
      goto out;
    }
    if ((size_t)n < IO_CHUNK) break; /* in_read stops short only at EOF */
  }
  if (n_out) *n_out = total;
  rc = 0;
out:
  free(buf);
  return rc;
}
