/* libmicrohttpd glue: listeners, body accumulation with a bound, API-key
 * authentication on TCP, routing and JSON responses. */
#include <arpa/inet.h>
#include <errno.h>
#include <grp.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "api/api.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/util.h"

struct hutch_server {
  struct hutch_ctx *ctx;
  struct MHD_Daemon *unix_d, *tcp_d;
  int unix_fd;
};

struct conn_state {
  char *body;
  size_t len, cap;
  bool too_large;
  bool rejected; /* a response was queued before the body (413 by length) */
  uint64_t t0;
};

void hutch_api_error(struct hutch_resp *resp, const hutch_err *err) {
  resp->status = err->status >= 400 ? err->status : 500;
  json_decref(resp->json);
  resp->json = json_pack("{s:{s:s, s:s}}", "error", "code", err->code[0] ? err->code : "internal", "message",
                         err->msg[0] ? err->msg : "unknown error");
}

void hutch_api_errorf(struct hutch_resp *resp, int status, const char *code, const char *fmt, ...) {
  hutch_err err = HUTCH_ERR_INIT;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err.msg, sizeof err.msg, fmt, ap);
  va_end(ap);
  err.status = status;
  snprintf(err.code, sizeof err.code, "%s", code);
  hutch_api_error(resp, &err);
}

const char *hutch_api_query(struct hutch_req *req, const char *key) {
  return MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, key);
}

struct query_iter {
  const char *key;
  const char **out;
  size_t max, n;
};

static enum MHD_Result collect_query(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
  struct query_iter *it = cls;
  if (!strcmp(key, it->key) && it->n < it->max) it->out[it->n++] = value ? value : "";
  return MHD_YES;
}

size_t hutch_api_query_all(struct hutch_req *req, const char *key, const char **out, size_t max) {
  struct query_iter it = {key, out, max, 0};
  MHD_get_connection_values(req->conn, MHD_GET_ARGUMENT_KIND, collect_query, &it);
  return it.n;
}

bool hutch_api_wait(struct hutch_req *req) {
  const char *w = hutch_api_query(req, "wait");
  return w && (!strcmp(w, "true") || !strcmp(w, "1") || !*w);
}

json_t *hutch_api_body_object(struct hutch_req *req, hutch_err *err) {
  if (req->body_len == 0) {
    json_t *o = json_object();
    return o;
  }
  json_error_t je;
  json_t *o = json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &je);
  if (!o) {
    hutch_err_invalid(err, "malformed JSON body: %s at line %d column %d", je.text, je.line, je.column);
    return NULL;
  }
  if (!json_is_object(o)) {
    json_decref(o);
    hutch_err_invalid(err, "the request body must be a JSON object");
    return NULL;
  }
  return o;
}

/* ---- routing ------------------------------------------------------------ */

struct route {
  const char *method;
  const char *pattern; /* segments; "*" captures one */
  hutch_handler fn;
  bool admin;          /* unix socket only */
};

static const struct route routes[] = {
    {"GET", "/healthz", hutch_h_health, false},
    {"POST", "/v1/sandboxes", hutch_h_sandbox_create, false},
    {"GET", "/v1/sandboxes", hutch_h_sandbox_list, false},
    {"GET", "/v1/sandboxes/*", hutch_h_sandbox_get, false},
    {"DELETE", "/v1/sandboxes/*", hutch_h_sandbox_delete, false},
    {"POST", "/v1/sandboxes/*/exec", hutch_h_sandbox_exec, false},
    {"GET", "/v1/operations/*", hutch_h_operation_get, false},
    {"POST", "/v1/admin/keys", hutch_h_key_create, true},
    {"GET", "/v1/admin/keys", hutch_h_key_list, true},
    {"DELETE", "/v1/admin/keys/*", hutch_h_key_delete, true},
};
#define N_ROUTES (sizeof routes / sizeof *routes)

/* Match `path` against `pattern` segment by segment; "*" captures one
 * non-empty segment into caps (copies the caller frees). */
static bool match(const char *pattern, const char *path, char **caps, size_t *ncaps) {
  *ncaps = 0;
  const char *p = pattern, *s = path;
  for (;;) {
    if (*p != '/' || *s != '/') break;
    p++, s++;
    size_t plen = strcspn(p, "/"), slen = strcspn(s, "/");
    if (plen == 1 && *p == '*') {
      if (slen == 0 || *ncaps >= 4) break;
      caps[(*ncaps)++] = xstrndup(s, slen);
    } else if (plen != slen || strncmp(p, s, plen)) {
      break;
    }
    p += plen, s += slen;
    if (!*p && !*s) return true;
  }
  for (size_t i = 0; i < *ncaps; i++) free(caps[i]);
  *ncaps = 0;
  return false;
}

static void dispatch(struct hutch_req *req, struct hutch_resp *resp) {
  char allow[128] = "";
  static __thread char allow_hdr[128];
  bool path_known = false;
  for (size_t i = 0; i < N_ROUTES; i++) {
    char *caps[4];
    size_t n;
    if (!match(routes[i].pattern, req->path, caps, &n)) continue;
    path_known = true;
    bool ok = !strcmp(routes[i].method, req->method);
    if (!ok && !strstr(allow, routes[i].method)) {
      if (*allow) strncat(allow, ", ", sizeof allow - strlen(allow) - 1);
      strncat(allow, routes[i].method, sizeof allow - strlen(allow) - 1);
    }
    if (ok) {
      if (routes[i].admin && req->tcp)
        hutch_api_errorf(resp, 403, "forbidden", "admin calls are only accepted on the unix socket");
      else {
        for (size_t c = 0; c < n; c++) req->params[c] = caps[c];
        routes[i].fn(req, resp);
      }
    }
    for (size_t c = 0; c < n; c++) free(caps[c]);
    if (ok) return;
  }
  if (path_known) {
    snprintf(allow_hdr, sizeof allow_hdr, "%s", allow);
    resp->allow = allow_hdr;
    hutch_api_errorf(resp, 405, "method_not_allowed", "method %s is not allowed on %s (allowed: %s)", req->method,
                     req->path, allow);
    return;
  }
  hutch_api_errorf(resp, 404, "not_found", "no route for %s %s", req->method, req->path);
}

/* ---- MHD callbacks ------------------------------------------------------ */

static enum MHD_Result send_json(struct MHD_Connection *conn, struct hutch_resp *resp) {
  char *text = resp->json ? json_dumps(resp->json, JSON_COMPACT) : NULL;
  size_t len = text ? strlen(text) : 0;
  if (text) {
    text = xrealloc(text, len + 2);
    text[len++] = '\n';
    text[len] = 0;
  }
  struct MHD_Response *r =
      MHD_create_response_from_buffer(len, text ? text : (void *)"", text ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
  if (!r) {
    free(text);
    return MHD_NO;
  }
  if (text) MHD_add_response_header(r, "Content-Type", "application/json");
  if (resp->allow) MHD_add_response_header(r, "Allow", resp->allow);
  enum MHD_Result ret = MHD_queue_response(conn, (unsigned)resp->status, r);
  MHD_destroy_response(r);
  return ret;
}

static bool authorized(struct hutch_ctx *ctx, struct MHD_Connection *conn) {
  const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
  if (!h || strncmp(h, "Bearer ", 7)) return false;
  const char *key = h + 7;
  if (strlen(key) < 16 || strlen(key) > 256) return false;
  char hex[65];
  hutch_sha256_hex(key, strlen(key), hex);
  return hutch_db_key_hash_exists(ctx->db, hex);
}

static bool content_type_ok(struct MHD_Connection *conn) {
  const char *ct = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Type");
  if (!ct || !*ct) return true;
  /* curl -d sends form-urlencoded unless told otherwise; the body is JSON. */
  return !strncasecmp(ct, "application/json", 16) || !strncasecmp(ct, "application/x-www-form-urlencoded", 33);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls,
                                  bool tcp) {
  struct hutch_ctx *ctx = cls;
  struct conn_state *st = *con_cls;
  if (!st) {
    st = xcalloc(1, sizeof *st);
    st->t0 = mono_us();
    *con_cls = st;
    /* Decide what can be decided before reading a body. */
    struct hutch_resp resp = {0};
    if (tcp && strcmp(url, "/healthz") && !authorized(ctx, conn)) {
      hutch_api_errorf(&resp, 401, "unauthorized", "missing or invalid API key (Authorization: Bearer <key>)");
    } else {
      const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
      uint64_t n;
      if (cl && parse_u64(cl, UINT64_MAX, &n) == 0 && n > ctx->cfg.max_body)
        hutch_api_errorf(&resp, 413, "payload_too_large", "request body of %llu bytes exceeds the %zu byte limit",
                         (unsigned long long)n, ctx->cfg.max_body);
      else if (cl && n > 0 && !content_type_ok(conn))
        hutch_api_errorf(&resp, 415, "unsupported_media_type", "request bodies must be application/json");
    }
    if (resp.status) {
      st->rejected = true;
      enum MHD_Result r = send_json(conn, &resp);
      json_decref(resp.json);
      return r;
    }
    return MHD_YES;
  }
  if (st->rejected) {
    *upload_size = 0;
    return MHD_YES;
  }
  if (*upload_size) {
    if (!st->too_large) {
      if (st->len + *upload_size > ctx->cfg.max_body) {
        st->too_large = true;
        free(st->body);
        st->body = NULL;
        st->len = st->cap = 0;
      } else {
        if (st->len + *upload_size + 1 > st->cap) {
          st->cap = (st->len + *upload_size + 1) * 2;
          if (st->cap > ctx->cfg.max_body + 1) st->cap = ctx->cfg.max_body + 1;
          st->body = xrealloc(st->body, st->cap);
        }
        memcpy(st->body + st->len, upload, *upload_size);
        st->len += *upload_size;
      }
    }
    *upload_size = 0;
    return MHD_YES;
  }
  struct hutch_resp resp = {.status = 200};
  if (st->too_large) {
    hutch_api_errorf(&resp, 413, "payload_too_large", "request body exceeds the %zu byte limit", ctx->cfg.max_body);
  } else {
    struct hutch_req req = {.ctx = ctx, .conn = conn, .method = method, .path = url, .tcp = tcp};
    req.body = st->body ? st->body : "";
    if (st->body) st->body[st->len] = 0;
    req.body_len = st->len;
    dispatch(&req, &resp);
  }
  enum MHD_Result r = send_json(conn, &resp);
  char status[8], ms[32];
  snprintf(status, sizeof status, "%d", resp.status);
  snprintf(ms, sizeof ms, "%.3f", (double)(mono_us() - st->t0) / 1000.0);
  hutch_log(resp.status >= 500 ? LOG_WARN : LOG_DEBUG, "http.request", "method", method, "path", url, "status",
            status, "dur_ms", ms, "via", tcp ? "tcp" : "unix", NULL);
  json_decref(resp.json);
  return r;
}

static enum MHD_Result on_unix(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                               const char *version, const char *upload, size_t *upload_size, void **con_cls) {
  return on_request(cls, conn, url, method, version, upload, upload_size, con_cls, false);
}

static enum MHD_Result on_tcp(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **con_cls) {
  return on_request(cls, conn, url, method, version, upload, upload_size, con_cls, true);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode t) {
  struct conn_state *st = *con_cls;
  if (!st) return;
  free(st->body);
  free(st);
  *con_cls = NULL;
}

static int unix_listener(const char *path, hutch_err *err) {
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof a.sun_path) return hutch_err_sys(err, ENAMETOOLONG, "socket path `%s`", path);
  strcpy(a.sun_path, path);
  cleanup_free char *dir = xstrdup(path);
  char *slash = strrchr(dir, '/');
  if (slash && slash != dir) {
    *slash = 0;
    if (mkdir_p(dir, 0755, err) < 0) return hutch_err_wrap(err, "socket directory");
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return hutch_err_sys(err, errno, "socket");
  /* Refuse to steal the socket of a running hutchd. */
  if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
    close(fd);
    return hutch_err_set(err, 500, "internal", "another hutchd is listening on `%s`", path);
  }
  unlink(path);
  /* Root, or the `hutch` group when it exists; nobody else. */
  struct group *g = getgrnam("hutch");
  mode_t old = umask(g ? 0117 : 0177);
  int r = bind(fd, (struct sockaddr *)&a, sizeof a);
  umask(old);
  if (r < 0 || (g && chown(path, 0, g->gr_gid) < 0) || listen(fd, 128) < 0) {
    int e = errno;
    close(fd);
    return hutch_err_sys(err, e, "listen on `%s`", path);
  }
  return fd;
}

int hutch_server_start(struct hutch_ctx *ctx, struct hutch_server **out, hutch_err *err) {
  struct hutch_server *s = xcalloc(1, sizeof *s);
  s->ctx = ctx;
  s->unix_fd = unix_listener(ctx->cfg.socket_path, err);
  if (s->unix_fd < 0) {
    free(s);
    return -1;
  }
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG;
  s->unix_d = MHD_start_daemon(flags, 0, NULL, NULL, on_unix, ctx, MHD_OPTION_LISTEN_SOCKET, s->unix_fd,
                               MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL, MHD_OPTION_CONNECTION_TIMEOUT,
                               (unsigned)120, MHD_OPTION_END);
  if (!s->unix_d) {
    close(s->unix_fd);
    free(s);
    return hutch_err_sys(err, errno, "start HTTP server on `%s`", ctx->cfg.socket_path);
  }
  if (ctx->cfg.listen_addr) {
    cleanup_free char *host = xstrdup(ctx->cfg.listen_addr);
    char *colon = strrchr(host, ':');
    uint64_t port;
    if (!colon || parse_u64(colon + 1, 65535, &port) < 0) {
      hutch_server_stop(s);
      return hutch_err_invalid(err, "--listen `%s`: expected HOST:PORT", ctx->cfg.listen_addr);
    }
    *colon = 0;
    const char *h = host;
    if (*h == '[') {
      h++;
      size_t l = strlen(h);
      if (l && h[l - 1] == ']') host[strlen(host) - 1] = 0;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST};
    struct addrinfo *ai = NULL;
    if (getaddrinfo(h, colon + 1, &hints, &ai) != 0 || !ai) {
      hutch_server_stop(s);
      return hutch_err_invalid(err, "--listen `%s`: HOST must be a numeric address", ctx->cfg.listen_addr);
    }
    unsigned tflags = flags | (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    s->tcp_d = MHD_start_daemon(tflags, (uint16_t)port, NULL, NULL, on_tcp, ctx, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                                MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL, MHD_OPTION_CONNECTION_TIMEOUT,
                                (unsigned)120, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->tcp_d) {
      hutch_server_stop(s);
      return hutch_err_sys(err, errno, "listen on `%s`", ctx->cfg.listen_addr);
    }
  }
  *out = s;
  return 0;
}

void hutch_server_stop(struct hutch_server *s) {
  if (!s) return;
  if (s->tcp_d) MHD_stop_daemon(s->tcp_d);
  if (s->unix_d) MHD_stop_daemon(s->unix_d);
  else if (s->unix_fd >= 0) close(s->unix_fd);
  unlink(s->ctx->cfg.socket_path);
  free(s);
}
