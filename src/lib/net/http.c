/* HTTP/1.x request head parser for the gateway (rules in http.h). */
#include "net/http.h"

#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

static bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

/* RFC 9110 tchar. */
static bool is_tchar(unsigned char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c)) return true;
  return c && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static bool ieq(const char *a, size_t an, const char *b) {
  size_t bn = strlen(b);
  if (an != bn) return false;
  for (size_t i = 0; i < an; i++) {
    unsigned char x = (unsigned char)a[i], y = (unsigned char)b[i];
    if (x >= 'A' && x <= 'Z') x = (unsigned char)(x + 32);
    if (y >= 'A' && y <= 'Z') y = (unsigned char)(y + 32);
    if (x != y) return false;
  }
  return true;
}

/* Equal to b (lowercase, with '-') when every '_' of a is read as '-', but
 * not equal as written. */
static bool underscore_alias(const char *a, size_t an, const char *b) {
  if (!memchr(a, '_', an) || an != strlen(b)) return false;
  for (size_t i = 0; i < an; i++) {
    unsigned char x = (unsigned char)a[i];
    if (x == '_') x = '-';
    if (x >= 'A' && x <= 'Z') x = (unsigned char)(x + 32);
    if (x != (unsigned char)b[i]) return false;
  }
  return true;
}

static int parse_port(const char *s, size_t n, uint16_t *out) {
  if (n == 0 || n > 5 || s[0] == '0') return -1;
  unsigned v = 0;
  for (size_t i = 0; i < n; i++) {
    if (!is_digit((unsigned char)s[i])) return -1;
    v = v * 10 + (unsigned)(s[i] - '0');
  }
  if (v < 1 || v > 65535) return -1;
  *out = (uint16_t)v;
  return 0;
}

/* The body of hutch_http_authority: NULL or the reason. */
static const char *authority(const char *s, size_t n, bool need_port, struct hutch_host *host, uint16_t *port) {
  if (n == 0) return "empty authority";
  if (n > HUTCH_AUTHORITY_MAX) return "authority too long";
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '@') return "userinfo (`@`) in authority";
    if (c == ' ' || c == '\t') return "whitespace in authority";
  }
  const char *h = s, *p = NULL;
  size_t hl = n, pl = 0;
  bool bracket = s[0] == '[';
  if (bracket) {
    const char *close = memchr(s, ']', n);
    if (!close) return "missing `]` in authority";
    h = s + 1;
    hl = (size_t)(close - h);
    size_t rest = n - (size_t)(close + 1 - s);
    if (rest) {
      if (close[1] != ':') return "unexpected text after `]` in authority";
      p = close + 2;
      pl = rest - 1;
    }
  } else {
    const char *colon = memchr(s, ':', n);
    if (colon) {
      if (memchr(colon + 1, ':', n - (size_t)(colon + 1 - s))) return "IPv6 address without brackets in authority";
      hl = (size_t)(colon - s);
      p = colon + 1;
      pl = n - hl - 1;
    }
  }
  if (p && parse_port(p, pl, port) < 0) return "invalid port (1 to 65535, no leading zeros)";
  if (need_port && !p) return "no port in authority (CONNECT needs host:port)";
  const char *why = NULL;
  if (hutch_host_parse(h, hl, host, &why) < 0) return why;
  if (bracket != (host->kind == HUTCH_HOST_IP && host->ip.family == AF_INET6))
    return bracket ? "brackets hold only an IPv6 address" : "IPv6 address without brackets in authority";
  return NULL;
}

int hutch_http_authority(const char *s, size_t n, bool need_port, struct hutch_host *host, uint16_t *port,
                         const char **why) {
  memset(host, 0, sizeof *host);
  *port = 0;
  const char *w = authority(s, n, need_port, host, port);
  if (!w) return 0;
  memset(host, 0, sizeof *host);
  *port = 0;
  if (why) *why = w;
  return -1;
}

static void authority_text(const struct hutch_host *h, uint16_t port, char out[HUTCH_AUTHORITY_MAX + 1]) {
  if (h->kind == HUTCH_HOST_IP && h->ip.family == AF_INET6)
    snprintf(out, HUTCH_AUTHORITY_MAX + 1, "[%s]:%u", h->text, port);
  else
    snprintf(out, HUTCH_AUTHORITY_MAX + 1, "%s:%u", h->text, port);
}

static bool same_host(const struct hutch_host *a, const struct hutch_host *b) {
  return a->kind == b->kind && strcmp(a->text, b->text) == 0;
}

bool hutch_http_names_agree(const char *connect_host, const char *sni, const char *host_header, const char **why) {
  const char *w = NULL;
  struct hutch_host c, s, h;
  uint16_t cport = 0, hport = 0;
  if (why) *why = NULL;
#define DISAGREE(msg) \
  do {                \
    if (why) *why = (msg); \
    return false;     \
  } while (0)
  if (!connect_host && !sni && !host_header) DISAGREE("no name to compare");
  if (connect_host && hutch_http_authority(connect_host, strlen(connect_host), true, &c, &cport, &w) < 0)
    DISAGREE("invalid CONNECT target");
  if (sni) {
    if (hutch_host_parse(sni, strlen(sni), &s, &w) < 0) DISAGREE("invalid SNI");
    if (s.kind != HUTCH_HOST_NAME) DISAGREE("SNI is an IP address");
  }
  if (host_header && hutch_http_authority(host_header, strlen(host_header), false, &h, &hport, &w) < 0)
    DISAGREE("invalid Host");
  if (connect_host && sni && !same_host(&c, &s)) DISAGREE("SNI differs from the CONNECT target");
  if (connect_host && host_header) {
    if (!same_host(&c, &h)) DISAGREE("Host differs from the CONNECT target");
    if (hport ? hport != cport : cport != 80 && cport != 443) DISAGREE("Host port differs from the CONNECT port");
  }
  if (sni && host_header && !same_host(&s, &h)) DISAGREE("Host differs from SNI");
  return true;
#undef DISAGREE
}

/* ---- the request head ---- */

#define BAD(msg)          \
  do {                    \
    req->why = (msg);     \
    return HUTCH_HTTP_BAD; \
  } while (0)

/* Find the end of the head in buf[start, lim): returns the offset after the
 * empty line, 0 when not (yet) there, or -1 for a refusal (req->why). */
static long scan_head(const char *buf, size_t start, size_t lim, struct hutch_http_request *req) {
  size_t line = start;
  bool first = true;
  for (size_t i = start; i < lim; i++) {
    unsigned char c = (unsigned char)buf[i];
    if (c == 0) {
      req->why = "NUL byte in the request head";
      return -1;
    }
    if (c == '\r') {
      if (i + 1 < lim && buf[i + 1] != '\n') {
        req->why = "bare CR in the request head";
        return -1;
      }
      continue;
    }
    if (c == '\n') {
      if (i == start || buf[i - 1] != '\r') {
        req->why = "bare LF in the request head";
        return -1;
      }
      if (first && i - 1 - line > HUTCH_HTTP_LINE_MAX) {
        req->why = "request line too long";
        return -1;
      }
      if (i - 1 == line) return (long)(i + 1); /* the empty line */
      first = false;
      line = i + 1;
    }
  }
  /* Without its end yet, the request line may already be too long. */
  if (first && lim - line > HUTCH_HTTP_LINE_MAX + 1) {
    req->why = "request line too long";
    return -1;
  }
  return 0;
}

static enum hutch_http_result request_line(const char *p, size_t n, struct hutch_http_request *req) {
  const char *sp1 = memchr(p, ' ', n);
  if (!sp1) BAD("request line without spaces");
  const char *t = sp1 + 1;
  const char *sp2 = memchr(t, ' ', n - (size_t)(t - p));
  if (!sp2) BAD("request line without a version");
  const char *v = sp2 + 1;
  size_t vl = n - (size_t)(v - p);
  req->method = p;
  req->method_len = (size_t)(sp1 - p);
  req->target = t;
  req->target_len = (size_t)(sp2 - t);
  if (req->method_len == 0) BAD("empty method");
  for (size_t i = 0; i < req->method_len; i++)
    if (!is_tchar((unsigned char)p[i])) BAD("invalid character in method");
  if (req->target_len == 0) BAD("empty request target (more than one space?)");
  for (size_t i = 0; i < req->target_len; i++) {
    unsigned char c = (unsigned char)t[i];
    if (c <= 0x20 || c >= 0x7f) BAD("invalid character in request target");
    if (c == '#') BAD("fragment (`#`) in request target");
  }
  if (vl == 8 && !memcmp(v, "HTTP/1.1", 8))
    req->minor = 1;
  else if (vl == 8 && !memcmp(v, "HTTP/1.0", 8))
    req->minor = 0;
  else
    BAD("unsupported HTTP version (HTTP/1.0 and HTTP/1.1 only, single spaces)");
  req->connect = req->method_len == 7 && !memcmp(p, "CONNECT", 7);
  return HUTCH_HTTP_OK;
}

/* Target forms; fills host/port from the target when it names one. */
static enum hutch_http_result target_form(struct hutch_http_request *req, bool *target_host) {
  const char *t = req->target;
  size_t n = req->target_len;
  const char *why = NULL;
  *target_host = false;
  if (req->connect) {
    if (hutch_http_authority(t, n, true, &req->host, &req->port, &why) < 0) {
      req->why = why;
      return HUTCH_HTTP_BAD;
    }
    req->form = HUTCH_HTTP_AUTHORITY;
    req->port_explicit = true;
    *target_host = true;
    return HUTCH_HTTP_OK;
  }
  if (t[0] == '/') {
    req->form = HUTCH_HTTP_ORIGIN;
    return HUTCH_HTTP_OK;
  }
  if (n == 1 && t[0] == '*') BAD("asterisk-form (OPTIONS *) is not supported");
  size_t skip;
  if (n >= 7 && ieq(t, 7, "http://"))
    skip = 7;
  else if (n >= 8 && ieq(t, 8, "https://"))
    skip = 8, req->https = true;
  else
    BAD("unsupported request target (origin-form, http:// or https:// absolute-form, or CONNECT host:port)");
  const char *a = t + skip;
  size_t al = 0;
  while (skip + al < n && a[al] != '/' && a[al] != '?') al++;
  if (al == 0) BAD("absolute-form target without a host");
  if (hutch_http_authority(a, al, false, &req->host, &req->port, &why) < 0) {
    req->why = why;
    return HUTCH_HTTP_BAD;
  }
  req->form = HUTCH_HTTP_ABSOLUTE;
  req->port_explicit = req->port != 0;
  if (!req->port) req->port = req->https ? 443 : 80;
  *target_host = true;
  return HUTCH_HTTP_OK;
}

enum hutch_http_result hutch_http_parse(const char *buf, size_t len, struct hutch_http_request *req) {
  memset(req, 0, sizeof *req);
  size_t lim = len < HUTCH_HTTP_HEAD_MAX ? len : HUTCH_HTTP_HEAD_MAX;
  size_t start = 0;
  while (start + 1 < lim && buf[start] == '\r' && buf[start + 1] == '\n') start += 2;
  long end = scan_head(buf, start, lim, req);
  if (end < 0) return HUTCH_HTTP_BAD;
  if (end == 0) {
    if (len >= HUTCH_HTTP_HEAD_MAX) BAD("request head larger than 16 KiB");
    req->why = "need more bytes";
    return HUTCH_HTTP_NEED_MORE;
  }
  req->head_len = (size_t)end;

  /* Every line now ends in CRLF and holds no CR, LF or NUL. */
  const char *p = buf + start;
  const char *eol = memchr(p, '\r', (size_t)end - start);
  if (request_line(p, (size_t)(eol - p), req) != HUTCH_HTTP_OK) return HUTCH_HTTP_BAD;
  bool target_host;
  if (target_form(req, &target_host) != HUTCH_HTTP_OK) return HUTCH_HTTP_BAD;

  const char *host_v = NULL;
  size_t host_l = 0;
  bool has_te = false;
  for (p = eol + 2;; p = eol + 2) {
    eol = memchr(p, '\r', (size_t)(buf + end - p));
    size_t n = (size_t)(eol - p);
    if (n == 0) break; /* the empty line */
    if (p[0] == ' ' || p[0] == '\t') BAD("obs-fold (a header line starting with whitespace)");
    const char *colon = memchr(p, ':', n);
    if (!colon) BAD("header line without `:`");
    size_t nl = (size_t)(colon - p);
    if (nl == 0) BAD("empty header name");
    for (size_t i = 0; i < nl; i++)
      if (!is_tchar((unsigned char)p[i])) BAD("invalid character in header name");
    const char *v = colon + 1, *ve = eol;
    while (v < ve && (*v == ' ' || *v == '\t')) v++;
    while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t')) ve--;
    for (const char *q = v; q < ve; q++) {
      unsigned char c = (unsigned char)*q;
      if ((c < 0x20 && c != '\t') || c == 0x7f) BAD("control character in header value");
    }
    size_t vl = (size_t)(ve - v);
    if (req->n_fields == HUTCH_HTTP_FIELDS_MAX) BAD("too many header fields");
    req->fields[req->n_fields++] = (struct hutch_http_field){p, v, nl, vl};

    if (underscore_alias(p, nl, "content-length") || underscore_alias(p, nl, "transfer-encoding"))
      BAD("header name with `_` for `-` (a Content-Length or Transfer-Encoding look-alike)");
    if (ieq(p, nl, "host")) {
      if (req->has_host_header) BAD("duplicate Host header");
      req->has_host_header = true;
      host_v = v;
      host_l = vl;
    } else if (ieq(p, nl, "content-length")) {
      if (req->has_length) BAD("multiple Content-Length headers");
      if (vl == 0) BAD("empty Content-Length");
      for (size_t i = 0; i < vl; i++)
        if (!is_digit((unsigned char)v[i])) BAD(memchr(v, ',', vl) ? "multiple Content-Length values" : "Content-Length is not a number");
      if (vl > 18) BAD("Content-Length too large");
      req->has_length = true;
      for (size_t i = 0; i < vl; i++) req->content_length = req->content_length * 10 + (uint64_t)(v[i] - '0');
    } else if (ieq(p, nl, "transfer-encoding")) {
      if (has_te) BAD("multiple Transfer-Encoding headers");
      has_te = true;
      if (vl != 7 || memcmp(v, "chunked", 7) != 0) BAD("Transfer-Encoding other than exactly `chunked`");
      req->chunked = true;
    } else if (ieq(p, nl, "upgrade")) {
      req->upgrade = true;
    }
  }
  if (req->has_length && has_te) BAD("both Content-Length and Transfer-Encoding");
  if (has_te && req->minor == 0) BAD("Transfer-Encoding in an HTTP/1.0 request");

  if (req->has_host_header) {
    struct hutch_host h;
    uint16_t hport;
    const char *why = NULL;
    if (host_l == 0) BAD("empty Host header");
    if (hutch_http_authority(host_v, host_l, false, &h, &hport, &why) < 0) {
      req->why = why;
      return HUTCH_HTTP_BAD;
    }
    if (!target_host) {
      req->host = h;
      req->port = hport ? hport : 80;
      req->port_explicit = hport != 0;
    } else if (req->connect) {
      if (!same_host(&h, &req->host)) BAD("Host differs from the CONNECT target");
      if (hport ? hport != req->port : req->port != 80 && req->port != 443)
        BAD("Host port differs from the CONNECT port");
    } else {
      /* RFC 9112 3.2.2: a server uses the absolute-form target and ignores
       * Host, a front end may route on Host: both must say the same. */
      if (!same_host(&h, &req->host)) BAD("absolute-form target and Host name different hosts");
      if ((hport ? hport : (req->https ? 443 : 80)) != req->port) BAD("absolute-form target and Host name different ports");
    }
  } else if (req->minor == 1) {
    BAD("HTTP/1.1 request without a Host header");
  } else if (!target_host) {
    BAD("no Host header and no host in the target");
  }
  authority_text(&req->host, req->port, req->authority);
  req->why = NULL;
  return HUTCH_HTTP_OK;
}
