/* HTTP forwarding rewrites and request body framing (see forward.h). */
#include "gateway/forward.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

static bool name_is(const char *n, size_t len, const char *want) {
  return strlen(want) == len && strncasecmp(n, want, len) == 0;
}

static bool hop_by_hop(const char *n, size_t len) {
  return name_is(n, len, "connection") || name_is(n, len, "proxy-connection") || name_is(n, len, "keep-alive") ||
         name_is(n, len, "proxy-authorization") || name_is(n, len, "te");
}

struct out {
  char *p;
  size_t cap, len;
  bool full;
};

static void put(struct out *o, const char *s, size_t n) {
  if (o->full || o->len + n > o->cap) {
    o->full = true;
    return;
  }
  memcpy(o->p + o->len, s, n);
  o->len += n;
}
static void puts_(struct out *o, const char *s) { put(o, s, strlen(s)); }

size_t gw_http_rewrite_request(const struct hutch_http_request *req, char *out, size_t cap) {
  struct out o = {out, cap, 0, false};
  put(&o, req->method, req->method_len);
  puts_(&o, " ");
  if (req->form == HUTCH_HTTP_ABSOLUTE) {
    const char *t = req->target;
    size_t n = req->target_len, i = req->https ? 8 : 7;
    while (i < n && t[i] != '/' && t[i] != '?') i++;
    if (i == n || t[i] == '?') puts_(&o, "/");
    put(&o, t + i, n - i);
  } else if (req->form == HUTCH_HTTP_ORIGIN) {
    put(&o, req->target, req->target_len);
  } else {
    return 0; /* CONNECT is never forwarded */
  }
  puts_(&o, req->minor ? " HTTP/1.1\r\n" : " HTTP/1.0\r\n");
  for (size_t i = 0; i < req->n_fields; i++) {
    const struct hutch_http_field *f = &req->fields[i];
    if (hop_by_hop(f->name, f->name_len)) continue;
    put(&o, f->name, f->name_len);
    puts_(&o, ": ");
    put(&o, f->value, f->value_len);
    puts_(&o, "\r\n");
  }
  if (!req->has_host_header) {
    char host[HUTCH_AUTHORITY_MAX + 16];
    bool v6 = req->host.kind == HUTCH_HOST_IP && req->host.ip.family == AF_INET6;
    if (req->port_explicit)
      snprintf(host, sizeof host, "Host: %s\r\n", req->authority);
    else
      snprintf(host, sizeof host, v6 ? "Host: [%s]\r\n" : "Host: %s\r\n", req->host.text);
    puts_(&o, host);
  }
  puts_(&o, "Connection: close\r\n\r\n");
  return o.full ? 0 : o.len;
}

int gw_http_response_head(const char *buf, size_t len, size_t *head_len, int *status, const char **why) {
  size_t lim = len < HUTCH_HTTP_HEAD_MAX ? len : HUTCH_HTTP_HEAD_MAX;
  *why = NULL;
  size_t line = 0;
  bool first = true;
  for (size_t i = 0; i < lim; i++) {
    unsigned char c = (unsigned char)buf[i];
    if (c == 0) return *why = "NUL in the response head", -1;
    if (c == '\r') {
      if (i + 1 < lim && buf[i + 1] != '\n') return *why = "bare CR in the response head", -1;
      continue;
    }
    if (c != '\n') continue;
    if (i == 0 || buf[i - 1] != '\r') return *why = "bare LF in the response head", -1;
    const char *l = buf + line;
    size_t n = i - 1 - line;
    if (first) {
      /* HTTP/1.x SP 3DIGIT [SP reason] */
      if (n < 12 || memcmp(l, "HTTP/1.", 7) != 0 || (l[7] != '0' && l[7] != '1') || l[8] != ' ')
        return *why = "invalid status line", -1;
      for (int k = 9; k < 12; k++)
        if (l[k] < '0' || l[k] > '9') return *why = "invalid status code", -1;
      if (n > 12 && l[12] != ' ') return *why = "invalid status line", -1;
      *status = (l[9] - '0') * 100 + (l[10] - '0') * 10 + (l[11] - '0');
      if (*status < 100) return *why = "invalid status code", -1;
      first = false;
    } else if (n == 0) {
      *head_len = i + 1;
      return 1;
    } else {
      if (l[0] == ' ' || l[0] == '\t') return *why = "obs-fold in the response head", -1;
      const char *colon = memchr(l, ':', n);
      if (!colon || colon == l) return *why = "header line without a name", -1;
      for (const char *q = l; q < colon; q++)
        if (*q <= 0x20 || *q >= 0x7f) return *why = "invalid header name", -1;
    }
    line = i + 1;
  }
  if (len >= HUTCH_HTTP_HEAD_MAX) return *why = "response head larger than 16 KiB", -1;
  return 0;
}

size_t gw_http_rewrite_response(const char *head, size_t head_len, char *out, size_t cap) {
  struct out o = {out, cap, 0, false};
  const char *p = head, *end = head + head_len;
  const char *eol = memchr(p, '\r', (size_t)(end - p));
  if (!eol) return 0;
  put(&o, p, (size_t)(eol - p) + 2);
  for (p = eol + 2; p < end; p = eol + 2) {
    eol = memchr(p, '\r', (size_t)(end - p));
    if (!eol || eol == p) break;
    const char *colon = memchr(p, ':', (size_t)(eol - p));
    if (colon && (name_is(p, (size_t)(colon - p), "connection") || name_is(p, (size_t)(colon - p), "keep-alive") ||
                  name_is(p, (size_t)(colon - p), "proxy-connection")))
      continue;
    put(&o, p, (size_t)(eol - p) + 2);
  }
  puts_(&o, "Connection: close\r\n\r\n");
  return o.full ? 0 : o.len;
}

/* ---- request bodies ---- */

enum {
  CH_SIZE = 0,     /* hex digits */
  CH_SIZE_LF,      /* CR seen after the size */
  CH_DATA,
  CH_DATA_CR,
  CH_DATA_LF,
  CH_TRAILER,      /* start of a trailer line or of the final CRLF */
  CH_TRAILER_LINE,
  CH_TRAILER_LF,
  CH_END_LF,
};

#define TRAILER_LINE_MAX 8192
#define TRAILERS_MAX 32

void gw_body_init(struct gw_body *b, const struct hutch_http_request *req) {
  memset(b, 0, sizeof *b);
  if (req->chunked) {
    b->kind = GW_BODY_CHUNKED;
    b->st = CH_SIZE;
  } else if (req->has_length && req->content_length > 0) {
    b->kind = GW_BODY_LENGTH;
    b->left = req->content_length;
  } else {
    b->kind = GW_BODY_NONE;
    b->done = true;
  }
}

static int hexval(uint8_t c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

#define CHUNK_BAD(msg) \
  do {                 \
    b->why = (msg);    \
    return -1;         \
  } while (0)

ssize_t gw_body_feed(struct gw_body *b, const uint8_t *p, size_t n) {
  if (b->done) return 0;
  if (b->kind == GW_BODY_LENGTH) {
    size_t take = (uint64_t)n < b->left ? n : (size_t)b->left;
    b->left -= take;
    if (b->left == 0) b->done = true;
    return (ssize_t)take;
  }
  if (b->kind != GW_BODY_CHUNKED) {
    b->done = true;
    return 0;
  }
  size_t i = 0;
  while (i < n && !b->done) {
    uint8_t c = p[i];
    switch (b->st) {
    case CH_SIZE:
      if (c == '\r') {
        if (b->digits == 0) CHUNK_BAD("chunk size without digits");
        b->st = CH_SIZE_LF;
      } else {
        int h = hexval(c);
        if (h < 0) CHUNK_BAD(c == ';' ? "chunk extensions are not accepted" : "invalid character in chunk size");
        if (++b->digits > 16) CHUNK_BAD("chunk size too large");
        b->left = b->left << 4 | (uint64_t)h;
        /* Beyond 2^31-1 a 32-bit or signed reader upstream could disagree. */
        if (b->left > GW_CHUNK_MAX) CHUNK_BAD("chunk size too large");
      }
      i++;
      break;
    case CH_SIZE_LF:
      if (c != '\n') CHUNK_BAD("chunk size line not ended by CRLF");
      i++;
      b->digits = 0;
      b->st = b->left ? CH_DATA : CH_TRAILER;
      break;
    case CH_DATA: {
      size_t take = (uint64_t)(n - i) < b->left ? n - i : (size_t)b->left;
      i += take;
      b->left -= take;
      if (b->left == 0) b->st = CH_DATA_CR;
      break;
    }
    case CH_DATA_CR:
      if (c != '\r') CHUNK_BAD("chunk data not followed by CRLF");
      i++;
      b->st = CH_DATA_LF;
      break;
    case CH_DATA_LF:
      if (c != '\n') CHUNK_BAD("chunk data not followed by CRLF");
      i++;
      b->st = CH_SIZE;
      break;
    case CH_TRAILER:
      if (c == '\r') {
        b->st = CH_END_LF;
      } else {
        if (++b->trailers > TRAILERS_MAX) CHUNK_BAD("too many trailer fields");
        if (c <= 0x20 || c >= 0x7f || c == ':') CHUNK_BAD("invalid trailer field");
        b->line = 1;
        b->st = CH_TRAILER_LINE;
      }
      i++;
      break;
    case CH_TRAILER_LINE:
      if (c == '\r') {
        b->st = CH_TRAILER_LF;
      } else {
        if ((c < 0x20 && c != '\t') || c >= 0x7f) CHUNK_BAD("invalid character in a trailer field");
        if (++b->line > TRAILER_LINE_MAX) CHUNK_BAD("trailer field too long");
      }
      i++;
      break;
    case CH_TRAILER_LF:
      if (c != '\n') CHUNK_BAD("trailer field not ended by CRLF");
      i++;
      b->st = CH_TRAILER;
      break;
    case CH_END_LF:
      if (c != '\n') CHUNK_BAD("chunked body not ended by CRLF");
      i++;
      b->done = true;
      break;
    default: CHUNK_BAD("internal: bad state");
    }
  }
  return (ssize_t)i;
}
