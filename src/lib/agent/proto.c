#include "agent/proto.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/util.h"

static void put_le32(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)v;
  p[1] = (unsigned char)(v >> 8);
  p[2] = (unsigned char)(v >> 16);
  p[3] = (unsigned char)(v >> 24);
}
static uint32_t get_le32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static void put_le16(unsigned char *p, uint16_t v) {
  p[0] = (unsigned char)v;
  p[1] = (unsigned char)(v >> 8);
}
static uint16_t get_le16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }

void hutch_frame_hdr_encode(const struct hutch_frame_hdr *h, unsigned char out[HUTCH_FRAME_HDR]) {
  put_le32(out, h->len);
  put_le16(out + 4, h->type);
  put_le16(out + 6, h->flags);
  put_le32(out + 8, h->id);
}

int hutch_frame_hdr_decode(const unsigned char in[HUTCH_FRAME_HDR], struct hutch_frame_hdr *h, hutch_err *err) {
  h->len = get_le32(in);
  h->type = get_le16(in + 4);
  h->flags = get_le16(in + 6);
  h->id = get_le32(in + 8);
  if (h->len > HUTCH_FRAME_MAX)
    return hutch_err_set(err, 400, "protocol", "frame of %u bytes exceeds the %u byte limit", h->len,
                         HUTCH_FRAME_MAX);
  if (h->type == 0) return hutch_err_set(err, 400, "protocol", "frame type 0 is invalid");
  return 0;
}

void hutch_buf_init(struct hutch_buf *b) { memset(b, 0, sizeof *b); }
void hutch_buf_free(struct hutch_buf *b) {
  free(b->data);
  memset(b, 0, sizeof *b);
}
void hutch_buf_reset(struct hutch_buf *b) { b->len = 0; }
void hutch_buf_append(struct hutch_buf *b, const void *p, size_t n) {
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n) cap *= 2;
    b->data = xrealloc(b->data, cap);
    b->cap = cap;
  }
  if (n) memcpy(b->data + b->len, p, n);
  b->len += n;
}

void hutch_tlv_put(struct hutch_buf *b, uint8_t tag, const void *val, uint32_t len) {
  unsigned char h[5];
  h[0] = tag;
  put_le32(h + 1, len);
  hutch_buf_append(b, h, 5);
  hutch_buf_append(b, val, len);
}
void hutch_tlv_put_str(struct hutch_buf *b, uint8_t tag, const char *s) {
  hutch_tlv_put(b, tag, s, (uint32_t)strlen(s));
}
void hutch_tlv_put_u32(struct hutch_buf *b, uint8_t tag, uint32_t v) {
  unsigned char p[4];
  put_le32(p, v);
  hutch_tlv_put(b, tag, p, 4);
}
void hutch_tlv_put_i32(struct hutch_buf *b, uint8_t tag, int32_t v) { hutch_tlv_put_u32(b, tag, (uint32_t)v); }

void hutch_tlv_iter_init(struct hutch_tlv_iter *it, const void *payload, size_t len) {
  it->p = payload;
  it->left = len;
}

int hutch_tlv_next(struct hutch_tlv_iter *it, uint8_t *tag, const unsigned char **val, uint32_t *len) {
  if (it->left == 0) return 0;
  if (it->left < 5) return -1;
  uint32_t l = get_le32(it->p + 1);
  if (l > it->left - 5) return -1;
  *tag = it->p[0];
  *len = l;
  *val = it->p + 5;
  it->p += 5 + l;
  it->left -= 5 + (size_t)l;
  return 1;
}

int hutch_tlv_u32(const unsigned char *val, uint32_t len, uint32_t *out) {
  if (len != 4) return -1;
  *out = get_le32(val);
  return 0;
}
int hutch_tlv_i32(const unsigned char *val, uint32_t len, int32_t *out) {
  uint32_t u;
  if (hutch_tlv_u32(val, len, &u) < 0) return -1;
  *out = (int32_t)u;
  return 0;
}

void hutch_tlv_put_u64(struct hutch_buf *b, uint8_t tag, uint64_t v) {
  unsigned char p[8];
  put_le32(p, (uint32_t)v);
  put_le32(p + 4, (uint32_t)(v >> 32));
  hutch_tlv_put(b, tag, p, 8);
}

int hutch_tlv_u64(const unsigned char *val, uint32_t len, uint64_t *out) {
  if (len != 8) return -1;
  *out = (uint64_t)get_le32(val) | (uint64_t)get_le32(val + 4) << 32;
  return 0;
}

int hutch_tlv_find(const void *payload, size_t len, uint8_t tag, const unsigned char **val, uint32_t *vlen) {
  struct hutch_tlv_iter it;
  uint8_t t;
  int r;
  hutch_tlv_iter_init(&it, payload, len);
  while ((r = hutch_tlv_next(&it, &t, val, vlen)) == 1)
    if (t == tag) return 1;
  return r;
}

char *hutch_tlv_find_str(const void *payload, size_t len, uint8_t tag) {
  const unsigned char *v;
  uint32_t vl;
  if (hutch_tlv_find(payload, len, tag, &v, &vl) != 1 || memchr(v, 0, vl)) return NULL;
  return xstrndup((const char *)v, vl);
}

int hutch_tlv_find_u32(const void *payload, size_t len, uint8_t tag, uint32_t *out) {
  const unsigned char *v;
  uint32_t vl;
  int r = hutch_tlv_find(payload, len, tag, &v, &vl);
  if (r != 1) return r;
  return hutch_tlv_u32(v, vl, out) < 0 ? -1 : 1;
}

int hutch_frame_read(int fd, struct hutch_frame_hdr *h, struct hutch_buf *payload, hutch_err *err) {
  unsigned char hdr[HUTCH_FRAME_HDR];
  ssize_t r = read_full(fd, hdr, sizeof hdr);
  if (r < 0) return hutch_err_sys(err, errno, "read frame header");
  if (r == 0) return 0;
  if (r != (ssize_t)sizeof hdr) return hutch_err_sys(err, EPIPE, "truncated frame header");
  if (hutch_frame_hdr_decode(hdr, h, err) < 0) return -1;
  hutch_buf_reset(payload);
  if (h->len) {
    hutch_buf_append(payload, NULL, 0);
    if (payload->cap < h->len) {
      payload->data = xrealloc(payload->data, h->len);
      payload->cap = h->len;
    }
    r = read_full(fd, payload->data, h->len);
    if (r < 0) return hutch_err_sys(err, errno, "read frame payload");
    if ((uint32_t)r != h->len) return hutch_err_sys(err, EPIPE, "truncated frame payload");
    payload->len = h->len;
  }
  return 1;
}

int hutch_frame_write(int fd, uint16_t type, uint32_t id, const void *payload, size_t len, hutch_err *err) {
  if (len > HUTCH_FRAME_MAX) return hutch_err_sys(err, EMSGSIZE, "frame payload of %zu bytes", len);
  unsigned char hdr[HUTCH_FRAME_HDR];
  struct hutch_frame_hdr h = {.len = (uint32_t)len, .type = type, .flags = 0, .id = id};
  hutch_frame_hdr_encode(&h, hdr);
  struct iovec iov[2] = {{hdr, sizeof hdr}, {(void *)payload, len}};
  size_t total = sizeof hdr + len, done = 0;
  int idx = 0;
  while (done < total) {
    ssize_t w = writev(fd, iov + idx, 2 - idx);
    if (w < 0) {
      if (errno == EINTR) continue;
      return hutch_err_sys(err, errno, "write frame");
    }
    done += (size_t)w;
    while (idx < 2 && (size_t)w >= iov[idx].iov_len) {
      w -= (ssize_t)iov[idx].iov_len;
      iov[idx].iov_len = 0;
      idx++;
    }
    if (idx < 2) {
      iov[idx].iov_base = (char *)iov[idx].iov_base + w;
      iov[idx].iov_len -= (size_t)w;
    }
  }
  return 0;
}

void hutch_decoder_init(struct hutch_frame_decoder *d) { hutch_buf_init(&d->in); }
void hutch_decoder_free(struct hutch_frame_decoder *d) { hutch_buf_free(&d->in); }

void hutch_decoder_feed(struct hutch_frame_decoder *d, const void *p, size_t n) { hutch_buf_append(&d->in, p, n); }

int hutch_decoder_pop(struct hutch_frame_decoder *d, struct hutch_frame_hdr *h, const unsigned char **payload,
                      hutch_err *err) {
  if (d->in.len < HUTCH_FRAME_HDR) return 0;
  if (hutch_frame_hdr_decode(d->in.data, h, err) < 0) return -1;
  if (d->in.len < HUTCH_FRAME_HDR + (size_t)h->len) return 0;
  *payload = d->in.data + HUTCH_FRAME_HDR;
  return 1;
}

void hutch_decoder_consume(struct hutch_frame_decoder *d, const struct hutch_frame_hdr *h) {
  size_t n = HUTCH_FRAME_HDR + (size_t)h->len;
  memmove(d->in.data, d->in.data + n, d->in.len - n);
  d->in.len -= n;
}

void hutch_exit_encode(struct hutch_buf *b, const struct hutch_exit *e) {
  if (e->signo) hutch_tlv_put_i32(b, HUTCH_TAG_SIGNO, e->signo);
  else hutch_tlv_put_i32(b, HUTCH_TAG_EXIT_CODE, e->exit_code);
  hutch_tlv_put_u32(b, HUTCH_TAG_TIMED_OUT, e->timed_out ? 1 : 0);
}

void hutch_exit_decode(const void *payload, size_t len, struct hutch_exit *out) {
  const unsigned char *v;
  uint32_t vl, to = 0;
  memset(out, 0, sizeof *out);
  if (hutch_tlv_find(payload, len, HUTCH_TAG_SIGNO, &v, &vl) != 1 || hutch_tlv_i32(v, vl, &out->signo) < 0)
    out->signo = 0;
  if (!out->signo && hutch_tlv_find(payload, len, HUTCH_TAG_EXIT_CODE, &v, &vl) == 1)
    hutch_tlv_i32(v, vl, &out->exit_code);
  hutch_tlv_find_u32(payload, len, HUTCH_TAG_TIMED_OUT, &to);
  out->timed_out = to != 0;
}

void hutch_spawn_encode(struct hutch_buf *b, const char *const *argv, const char *const *envp, const char *cwd,
                        uint32_t timeout_ms, uint32_t uid, uint32_t gid, uint32_t flags) {
  for (size_t i = 0; argv && argv[i]; i++) hutch_tlv_put_str(b, HUTCH_TAG_ARG, argv[i]);
  for (size_t i = 0; envp && envp[i]; i++) hutch_tlv_put_str(b, HUTCH_TAG_ENV, envp[i]);
  if (cwd) hutch_tlv_put_str(b, HUTCH_TAG_CWD, cwd);
  hutch_tlv_put_u32(b, HUTCH_TAG_TIMEOUT_MS, timeout_ms);
  hutch_tlv_put_u32(b, HUTCH_TAG_UID, uid);
  hutch_tlv_put_u32(b, HUTCH_TAG_GID, gid);
  hutch_tlv_put_u32(b, HUTCH_TAG_FLAGS, flags);
}

int hutch_spawn_decode(const void *payload, size_t len, struct hutch_spawn *out, hutch_err *err) {
  memset(out, 0, sizeof *out);
  struct hutch_tlv_iter it;
  uint8_t tag;
  const unsigned char *val;
  uint32_t vlen;
  size_t nargs = 0, nenv = 0, strbytes = 0;
  int r;
  /* First pass: count and validate, so allocation is bounded by the payload. */
  hutch_tlv_iter_init(&it, payload, len);
  while ((r = hutch_tlv_next(&it, &tag, &val, &vlen)) == 1) {
    if (tag == HUTCH_TAG_ARG || tag == HUTCH_TAG_ENV || tag == HUTCH_TAG_CWD) {
      if (memchr(val, 0, vlen)) return hutch_err_set(err, 400, "protocol", "string field contains NUL");
      strbytes += vlen + 1;
    }
    if (tag == HUTCH_TAG_ARG) nargs++;
    if (tag == HUTCH_TAG_ENV) nenv++;
  }
  if (r < 0) return hutch_err_set(err, 400, "protocol", "malformed SPAWN payload");
  if (nargs == 0) return hutch_err_set(err, 400, "protocol", "SPAWN without argv");
  if (nargs > HUTCH_SPAWN_MAX_ARGS || nenv > HUTCH_SPAWN_MAX_ENV)
    return hutch_err_set(err, 400, "protocol", "SPAWN with too many arguments or variables");
  out->argv = xcalloc(nargs + 1, sizeof(char *));
  out->envp = xcalloc(nenv + 1, sizeof(char *));
  out->store = xmalloc(strbytes + 1);
  char *s = out->store;
  hutch_tlv_iter_init(&it, payload, len);
  while (hutch_tlv_next(&it, &tag, &val, &vlen) == 1) {
    const char *str = NULL;
    if (tag == HUTCH_TAG_ARG || tag == HUTCH_TAG_ENV || tag == HUTCH_TAG_CWD) {
      memcpy(s, val, vlen);
      s[vlen] = 0;
      str = s;
      s += vlen + 1;
    }
    switch (tag) {
      case HUTCH_TAG_ARG: out->argv[out->argc++] = str; break;
      case HUTCH_TAG_ENV: out->envp[out->envc++] = str; break;
      case HUTCH_TAG_CWD: out->cwd = str; break;
      case HUTCH_TAG_TIMEOUT_MS:
      case HUTCH_TAG_UID:
      case HUTCH_TAG_GID:
      case HUTCH_TAG_FLAGS: {
        uint32_t v;
        if (hutch_tlv_u32(val, vlen, &v) < 0) {
          hutch_spawn_free(out);
          return hutch_err_set(err, 400, "protocol", "SPAWN field %u has the wrong size", tag);
        }
        if (tag == HUTCH_TAG_TIMEOUT_MS) out->timeout_ms = v;
        else if (tag == HUTCH_TAG_UID) out->uid = v;
        else if (tag == HUTCH_TAG_GID) out->gid = v;
        else out->flags = v;
        break;
      }
      default: break; /* unknown tags are skipped */
    }
  }
  return 0;
}

void hutch_spawn_free(struct hutch_spawn *s) {
  free((void *)s->argv);
  free((void *)s->envp);
  free(s->store);
  memset(s, 0, sizeof *s);
}
