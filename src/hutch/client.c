/* HTTP client for hutchd's API; see client.h. */
#include "client.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

int hutch_client_init(hutch_client *c, const char *socket_path, const char *url,
                      const char *api_key, hutch_err *err) {
  memset(c, 0, sizeof *c);
  if (url) {
    if (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0)
      return hutch_err_invalid(err, "--url `%s`: expected http://HOST:PORT or https://...", url);
    size_t n = strlen(url);
    while (n > 0 && url[n - 1] == '/') n--;
    c->base = xstrndup(url, n);
    c->where = xstrdup(url);
    if (api_key) c->auth = xasprintf("Authorization: Bearer %s", api_key);
  } else {
    /* Over the socket the host part is only a placeholder (docs/api.md). */
    c->base = xstrdup("http://hutch");
    c->socket = xstrdup(socket_path);
    c->where = xstrdup(socket_path);
  }
  c->curl = curl_easy_init();
  if (!c->curl) {
    hutch_client_free(c);
    return hutch_err_sys(err, 0, "cannot initialise libcurl");
  }
  return 0;
}

void hutch_client_free(hutch_client *c) {
  if (c->curl) curl_easy_cleanup(c->curl);
  free(c->base);
  free(c->socket);
  free(c->where);
  if (c->auth) {
    /* The key should not linger in freed memory longer than needed. */
    explicit_bzero(c->auth, strlen(c->auth));
    free(c->auth);
  }
  memset(c, 0, sizeof *c);
}

int hutch_client_dup(const hutch_client *src, hutch_client *dst, hutch_err *err) {
  memset(dst, 0, sizeof *dst);
  dst->base = xstrdup(src->base);
  dst->socket = src->socket ? xstrdup(src->socket) : NULL;
  dst->where = xstrdup(src->where);
  dst->auth = src->auth ? xstrdup(src->auth) : NULL;
  dst->curl = curl_easy_init();
  if (!dst->curl) {
    hutch_client_free(dst);
    return hutch_err_sys(err, 0, "cannot initialise libcurl");
  }
  return 0;
}

/* Largest error body kept while a sink takes the 2xx bodies. */
#define ERROR_BODY_MAX (1u << 20)

struct body_buf {
  char *data;
  size_t len, cap;
  bool too_big;
};

static size_t body_append(struct body_buf *b, const char *ptr, size_t n, size_t max) {
  if (n > max - b->len) {
    b->too_big = true;
    return 0; /* curl fails the transfer with CURLE_WRITE_ERROR */
  }
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 16384;
    while (cap < b->len + n + 1) cap *= 2;
    if (cap > max + 1) cap = max + 1;
    b->data = xrealloc(b->data, cap);
    b->cap = cap;
  }
  memcpy(b->data + b->len, ptr, n);
  b->len += n;
  b->data[b->len] = '\0';
  return n;
}

struct xfer_state {
  hutch_client *c;
  const hutch_xfer *x;
  struct body_buf b;
  size_t max;
  long status;
  bool sink_failed, source_failed;
  hutch_err xerr; /* the sink's or source's error */
};

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *userdata) {
  struct xfer_state *st = userdata;
  size_t n = size * nmemb;
  if (st->x->sink) {
    /* Headers are complete when the body starts: the status is known. */
    if (!st->status) curl_easy_getinfo(st->c->curl, CURLINFO_RESPONSE_CODE, &st->status);
    if (st->status >= 200 && st->status < 300) {
      if (st->x->sink(st->x->sink_ctx, ptr, n, &st->xerr) < 0) {
        st->sink_failed = true;
        return 0;
      }
      return n;
    }
  }
  return body_append(&st->b, ptr, n, st->max);
}

static size_t on_read(char *buf, size_t size, size_t nitems, void *userdata) {
  struct xfer_state *st = userdata;
  ssize_t r = st->x->source(st->x->source_ctx, buf, size * nitems, &st->xerr);
  if (r < 0) {
    st->source_failed = true;
    return CURL_READFUNC_ABORT;
  }
  return (size_t)r;
}

/* Called by curl about once a second even while waiting for a reply, and
 * sooner when a signal interrupts its poll(). */
static int on_progress(void *userdata, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow) {
  hutch_client *c = userdata;
  return c->abort_flag && *c->abort_flag ? 1 : 0;
}

static int transport_error(hutch_client *c, const char *method, const char *path, CURLcode rc,
                           const char *errbuf, const struct xfer_state *st, hutch_err *err) {
  long oserr = 0;
  curl_easy_getinfo(c->curl, CURLINFO_OS_ERRNO, &oserr);
  const char *detail = *errbuf ? errbuf : curl_easy_strerror(rc);
  if ((rc == CURLE_WRITE_ERROR && st->sink_failed) ||
      ((rc == CURLE_ABORTED_BY_CALLBACK || rc == CURLE_READ_ERROR) && st->source_failed)) {
    *err = st->xerr;
    return -1;
  }
  switch (rc) {
    case CURLE_ABORTED_BY_CALLBACK:
      return hutch_err_set(err, 0, "interrupted", "%s %s: interrupted", method, path);
    case CURLE_COULDNT_CONNECT: {
      const char *hint = !c->socket        ? "is hutchd running with --listen?"
                         : oserr == EACCES ? "is your user in the `hutch` group?"
                                           : "is hutchd running?";
      if (oserr)
        return hutch_err_set(err, 0, "unavailable", "cannot connect to hutchd at %s: %s (%s)",
                             c->where, strerror((int)oserr), hint);
      return hutch_err_set(err, 0, "unavailable", "cannot connect to hutchd at %s: %s (%s)",
                           c->where, detail, hint);
    }
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_OPERATION_TIMEDOUT:
      return hutch_err_set(err, 0, "unavailable", "cannot connect to hutchd at %s: %s", c->where,
                           detail);
    case CURLE_GOT_NOTHING:
      return hutch_err_set(err, 0, "unavailable",
                           "%s %s: hutchd at %s closed the connection without a reply", method,
                           path, c->where);
    case CURLE_WRITE_ERROR:
    case CURLE_FILESIZE_EXCEEDED:
      if (rc == CURLE_FILESIZE_EXCEEDED || st->b.too_big)
        return hutch_err_set(err, 0, "internal",
                             "%s %s: response from hutchd is larger than %zu MiB", method, path,
                             st->max >> 20);
      /* fall through */
    default:
      return hutch_err_set(err, 0, "unavailable", "%s %s: request to hutchd at %s failed: %s",
                           method, path, c->where, detail);
  }
}

int hutch_transfer(hutch_client *c, const hutch_xfer *x, hutch_response *resp, hutch_err *err) {
  memset(resp, 0, sizeof *resp);
  const char *method = x->method, *path = x->path;
  cleanup_free char *payload = NULL;
  if (x->json) {
    payload = json_dumps(x->json, JSON_COMPACT);
    if (!payload) return hutch_err_sys(err, 0, "%s %s: cannot encode the request", method, path);
  }
  cleanup_free char *url = xasprintf("%s%s", c->base, path);
  char errbuf[CURL_ERROR_SIZE] = "";
  struct xfer_state st = {.c = c, .x = x};
  st.max = x->sink ? ERROR_BODY_MAX : HUTCH_CLIENT_MAX_RESPONSE;
  CURL *h = c->curl;

  /* reset keeps the connection cache: one connection serves all calls. */
  curl_easy_reset(h);
  curl_easy_setopt(h, CURLOPT_URL, url);
  if (c->socket) {
    curl_easy_setopt(h, CURLOPT_UNIX_SOCKET_PATH, c->socket);
    curl_easy_setopt(h, CURLOPT_PROXY, "");
  } else {
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
  }
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(h, CURLOPT_USERAGENT, "hutch-cli");
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &st);
  if (!x->sink)
    curl_easy_setopt(h, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)HUTCH_CLIENT_MAX_RESPONSE);
  else /* fewer, larger callbacks for streams */
    curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 256L * 1024);
  curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(h, CURLOPT_XFERINFODATA, c);

  struct curl_slist *headers = NULL;
  cleanup_free char *accept = xasprintf("Accept: %s", x->accept ? x->accept : "application/json");
  headers = curl_slist_append(headers, accept);
  /* No "Expect: 100-continue" round trip before larger bodies. */
  headers = curl_slist_append(headers, "Expect:");
  cleanup_free char *ctype = NULL;
  if (payload) {
    headers = curl_slist_append(headers, "Content-Type: application/json");
  } else if (x->raw || x->source) {
    ctype = xasprintf("Content-Type: %s",
                      x->content_type ? x->content_type : "application/octet-stream");
    headers = curl_slist_append(headers, ctype);
  }
  if (x->source && x->source_size < 0)
    headers = curl_slist_append(headers, "Transfer-Encoding: chunked");
  if (c->auth) headers = curl_slist_append(headers, c->auth);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);

  const void *body = payload ? payload : x->raw ? (x->data ? x->data : "") : NULL;
  size_t body_len = payload ? strlen(payload) : x->raw ? x->len : 0;
  if (x->source) {
    curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(h, CURLOPT_UPLOAD_BUFFERSIZE, 256L * 1024);
    curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
    curl_easy_setopt(h, CURLOPT_READDATA, &st);
    if (x->source_size >= 0)
      curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)x->source_size);
    if (strcmp(method, "PUT") != 0) curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
  } else if (strcmp(method, "GET") == 0) {
    curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
  } else if (strcmp(method, "POST") == 0) {
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body ? body : "");
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
  } else {
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    if (body) {
      curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
      curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
    }
  }

  CURLcode rc = curl_easy_perform(h);
  curl_slist_free_all(headers);
  /* errbuf and st live on this stack frame; curl must not keep them. */
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, NULL);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, NULL);
  curl_easy_setopt(h, CURLOPT_READDATA, NULL);
  if (rc != CURLE_OK) {
    int r = transport_error(c, method, path, rc, errbuf, &st, err);
    free(st.b.data);
    return r;
  }
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &resp->status);
  resp->body = st.b.data ? st.b.data : xstrdup("");
  resp->len = st.b.len;
  if (resp->len > 0) {
    json_error_t jerr;
    resp->json = json_loadb(resp->body, resp->len, JSON_ALLOW_NUL, &jerr);
  }
  return 0;
}

int hutch_request(hutch_client *c, const char *method, const char *path, json_t *body,
                  hutch_response *resp, hutch_err *err) {
  hutch_xfer x = {.method = method, .path = path, .json = body};
  return hutch_transfer(c, &x, resp, err);
}

int hutch_response_check(const hutch_response *resp, hutch_err *err) {
  if (resp->status >= 200 && resp->status < 300) return 0;
  json_t *e = json_object_get(resp->json, "error");
  const char *msg = json_string_value(json_object_get(e, "message"));
  if (!msg || !*msg) msg = json_string_value(json_object_get(e, "code"));
  const char *code = json_string_value(json_object_get(e, "code"));
  if (msg && *msg) {
    hutch_err_set(err, (int)resp->status, code ? code : "", "%s (HTTP %ld)", msg, resp->status);
  } else if (resp->len) {
    /* Not hutchd's error shape (a proxy?): show the start of the body,
     * without control characters. */
    char excerpt[201];
    size_t n = resp->len < 200 ? resp->len : 200;
    for (size_t i = 0; i < n; i++) {
      unsigned char ch = (unsigned char)resp->body[i];
      excerpt[i] = ch < 0x20 || ch == 0x7f ? ' ' : (char)ch;
    }
    excerpt[n] = '\0';
    hutch_err_set(err, (int)resp->status, "", "%s%s (HTTP %ld)", excerpt,
                  resp->len > n ? "..." : "", resp->status);
  } else {
    hutch_err_set(err, (int)resp->status, "", "request failed (HTTP %ld)", resp->status);
  }
  return -1;
}

void hutch_response_free(hutch_response *resp) {
  free(resp->body);
  json_decref(resp->json);
  memset(resp, 0, sizeof *resp);
}
