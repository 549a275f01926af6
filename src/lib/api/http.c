/* libmicrohttpd glue: listeners, body accumulation with a bound, API-key
 * authentication on TCP, routing and JSON responses. */
#include <arpa/inet.h>
#include <errno.h>
#include <grp.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
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

struct route;

struct conn_state {
  char *body;
  size_t len, cap;
  bool too_large;
  bool rejected;          /* a response was queued before the body */
  uint64_t t0;
  const struct route *route; /* NULL: no route (404/405 answered at the end) */
  struct hutch_req req;
  char *params[4];
  void *upload;           /* state of a streamed upload */
  bool upload_failed;     /* `data` said stop: drain the rest, answer with resp */
  struct hutch_resp resp; /* response being built by a streamed upload */
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

bool hutch_api_query_clean(struct hutch_req *req, const char *key, const char **out) {
  const char *v = NULL;
  size_t n = 0;
  *out = NULL;
  if (MHD_lookup_connection_value_n(req->conn, MHD_GET_ARGUMENT_KIND, key, strlen(key), &v, &n) != MHD_YES || !v)
    return true;
  if (strlen(v) != n) return false;
  *out = v;
  return true;
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

int hutch_api_client_fd(struct hutch_req *req) {
  const union MHD_ConnectionInfo *ci =
      req->conn ? MHD_get_connection_info(req->conn, MHD_CONNECTION_INFO_CONNECTION_FD) : NULL;
  return ci ? ci->connect_fd : -1;
}

bool hutch_api_peer_gone(int fd) {
  if (fd < 0) return false;
  struct pollfd p = {.fd = fd, .events = POLLRDHUP};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
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
  hutch_handler fn;    /* buffered JSON body, or */
  const struct hutch_upload_ops *upload; /* streamed body */
  bool admin;          /* unix socket only */
  bool token;          /* an attach token for params (sandbox, command) may replace the API key */
};

static const struct route routes[] = {
    {"GET", "/healthz", hutch_h_health, NULL, false, false},
    {"GET", "/metrics", hutch_h_metrics, NULL, false, false},
    {"GET", "/v1/events", hutch_h_events, NULL, false, false},
    {"POST", "/v1/sandboxes", hutch_h_sandbox_create, NULL, false, false},
    {"GET", "/v1/sandboxes", hutch_h_sandbox_list, NULL, false, false},
    {"GET", "/v1/sandboxes/*", hutch_h_sandbox_get, NULL, false, false},
    {"DELETE", "/v1/sandboxes/*", hutch_h_sandbox_delete, NULL, false, false},
    {"POST", "/v1/sandboxes/*/exec", hutch_h_sandbox_exec, NULL, false, false},
    {"POST", "/v1/sandboxes/*/timeout", hutch_h_sandbox_timeout, NULL, false, false},
    {"POST", "/v1/sandboxes/*/pause", hutch_h_sandbox_verb, NULL, false, false},
    {"POST", "/v1/sandboxes/*/resume", hutch_h_sandbox_verb, NULL, false, false},
    {"POST", "/v1/sandboxes/*/stop", hutch_h_sandbox_verb, NULL, false, false},
    {"POST", "/v1/sandboxes/*/start", hutch_h_sandbox_verb, NULL, false, false},
    {"POST", "/v1/sandboxes/*/suspend", hutch_h_sandbox_verb, NULL, false, false},
    {"POST", "/v1/sandboxes/*/restore", hutch_h_sandbox_verb, NULL, false, false},
    {"POST", "/v1/sandboxes/*/wake", hutch_h_sandbox_verb, NULL, false, false},
    {"GET", "/v1/sandboxes/*/metrics", hutch_h_sandbox_metrics, NULL, false, false},
    {"POST", "/v1/sandboxes/*/commands", hutch_h_cmd_start, NULL, false, false},
    {"GET", "/v1/sandboxes/*/commands", hutch_h_cmd_list, NULL, false, false},
    {"GET", "/v1/sandboxes/*/commands/*", hutch_h_cmd_get, NULL, false, true},
    {"GET", "/v1/sandboxes/*/commands/*/attach", hutch_h_cmd_attach, NULL, false, true},
    {"POST", "/v1/sandboxes/*/commands/*/stdin", NULL, &hutch_u_cmd_stdin, false, true},
    {"POST", "/v1/sandboxes/*/commands/*/signal", hutch_h_cmd_signal, NULL, false, true},
    {"POST", "/v1/sandboxes/*/commands/*/resize", hutch_h_cmd_resize, NULL, false, true},
    {"POST", "/v1/sandboxes/*/commands/*/wait", hutch_h_cmd_wait, NULL, false, true},
    {"GET", "/v1/sandboxes/*/files", hutch_h_files_get, NULL, false, false},
    {"PUT", "/v1/sandboxes/*/files", NULL, &hutch_u_files_put, false, false},
    {"DELETE", "/v1/sandboxes/*/files", hutch_h_files_delete, NULL, false, false},
    {"GET", "/v1/sandboxes/*/files/stat", hutch_h_files_stat, NULL, false, false},
    {"GET", "/v1/sandboxes/*/files/list", hutch_h_files_list, NULL, false, false},
    {"POST", "/v1/sandboxes/*/files/mkdir", hutch_h_files_mkdir, NULL, false, false},
    {"POST", "/v1/sandboxes/*/files/move", hutch_h_files_move, NULL, false, false},
    {"GET", "/v1/sandboxes/*/files/tar", hutch_h_files_tar_get, NULL, false, false},
    {"PUT", "/v1/sandboxes/*/files/tar", NULL, &hutch_u_files_tar_put, false, false},
    {"GET", "/v1/operations/*", hutch_h_operation_get, NULL, false, false},
    {"POST", "/v1/sandboxes/*/snapshots", hutch_h_snapshot_create, NULL, false, false},
    {"GET", "/v1/sandboxes/*/snapshots", hutch_h_snapshot_list, NULL, false, false},
    {"GET", "/v1/sandboxes/*/snapshots/*", hutch_h_snapshot_get, NULL, false, false},
    {"DELETE", "/v1/sandboxes/*/snapshots/*", hutch_h_snapshot_delete, NULL, false, false},
    {"GET", "/v1/sandboxes/*/snapshot-policy", hutch_h_snapshot_policy_get, NULL, false, false},
    {"PUT", "/v1/sandboxes/*/snapshot-policy", hutch_h_snapshot_policy_put, NULL, false, false},
    {"POST", "/v1/sandboxes/*/rollback", hutch_h_sandbox_rollback, NULL, false, false},
    {"POST", "/v1/sandboxes/*/fork", hutch_h_sandbox_fork, NULL, false, false},
    {"GET", "/v1/snapshots", hutch_h_snapshot_list_all, NULL, false, false},
    {"POST", "/v1/snapshots/import", NULL, &hutch_u_snapshot_import, false, false},
    {"GET", "/v1/snapshots/*", hutch_h_snapshot_get, NULL, false, false},
    {"DELETE", "/v1/snapshots/*", hutch_h_snapshot_delete, NULL, false, false},
    {"GET", "/v1/snapshots/*/export", hutch_h_snapshot_export, NULL, false, false},
    {"GET", "/v1/templates", hutch_h_template_list, NULL, false, false},
    {"POST", "/v1/templates", hutch_h_template_create, NULL, false, false},
    {"GET", "/v1/templates/*", hutch_h_template_get, NULL, false, false},
    {"DELETE", "/v1/templates/*", hutch_h_template_delete, NULL, false, false},
    {"GET", "/v1/storage", hutch_h_storage, NULL, false, false},
    {"GET", "/v1/runtimes", hutch_h_runtimes, NULL, false, false},
    {"GET", "/v1/sandboxes/*/network", hutch_h_network_get, NULL, false, false},
    {"PUT", "/v1/sandboxes/*/network", hutch_h_network_put, NULL, false, false},
    {"GET", "/v1/sandboxes/*/egress", hutch_h_egress_log, NULL, false, false},
    {"POST", "/v1/admin/keys", hutch_h_key_create, NULL, true, false},
    {"GET", "/v1/admin/keys", hutch_h_key_list, NULL, true, false},
    {"DELETE", "/v1/admin/keys/*", hutch_h_key_delete, NULL, true, false},
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

/* Find the route for (method, path).  Returns it with params captured into
 * st, or NULL with resp filled (404, or 405 with Allow). */
static const struct route *lookup(struct conn_state *st, const char *method, const char *path,
                                  struct hutch_resp *resp) {
  char allow[128] = "";
  static __thread char allow_hdr[128];
  bool path_known = false;
  for (size_t i = 0; i < N_ROUTES; i++) {
    char *caps[4];
    size_t n;
    if (!match(routes[i].pattern, path, caps, &n)) continue;
    path_known = true;
    if (!strcmp(routes[i].method, method)) {
      for (size_t c = 0; c < n; c++) st->params[c] = caps[c];
      return &routes[i];
    }
    for (size_t c = 0; c < n; c++) free(caps[c]);
    if (!strstr(allow, routes[i].method)) {
      if (*allow) strncat(allow, ", ", sizeof allow - strlen(allow) - 1);
      strncat(allow, routes[i].method, sizeof allow - strlen(allow) - 1);
    }
  }
  if (path_known) {
    snprintf(allow_hdr, sizeof allow_hdr, "%s", allow);
    resp->allow = allow_hdr;
    hutch_api_errorf(resp, 405, "method_not_allowed", "method %s is not allowed on %s (allowed: %s)", method, path,
                     allow);
  } else {
    hutch_api_errorf(resp, 404, "not_found", "no route for %s %s", method, path);
  }
  return NULL;
}

/* ---- MHD callbacks ------------------------------------------------------ */

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
  struct hutch_stream *s = cls;
  return s->read(s->cls, pos, buf, max);
}

static void stream_free(void *cls) {
  struct hutch_stream *s = cls;
  if (s->free) s->free(s->cls);
  free(s);
}

static enum MHD_Result send_json(struct MHD_Connection *conn, struct hutch_resp *resp) {
  if (resp->stream.read) {
    struct hutch_stream *s = xmalloc(sizeof *s);
    *s = resp->stream;
    resp->stream.read = NULL; /* ownership moves to MHD */
    struct MHD_Response *r = MHD_create_response_from_callback(
        s->size == HUTCH_SIZE_UNKNOWN ? MHD_SIZE_UNKNOWN : s->size, 64 * 1024, stream_reader, s, stream_free);
    if (!r) {
      stream_free(s);
      return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", s->content_type ? s->content_type : "application/octet-stream");
    MHD_add_response_header(r, "Cache-Control", "no-store");
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)(resp->status ? resp->status : 200), r);
    MHD_destroy_response(r);
    return ret;
  }
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

static bool authorized(struct hutch_ctx *ctx, struct MHD_Connection *conn, const struct conn_state *st) {
  const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
  const char *q = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "token");
  const char *key = h && !strncmp(h, "Bearer ", 7) ? h + 7 : NULL;
  /* An attach token opens only its own command's routes. */
  if (st->route && st->route->token && st->params[0] && st->params[1]) {
    if (q && hutch_attach_token_valid(ctx, q, st->params[0], st->params[1])) return true;
    if (key && hutch_attach_token_valid(ctx, key, st->params[0], st->params[1])) return true;
  }
  if (!key) return false;
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

static void log_request(const char *method, const struct conn_state *st, const char *url, int status, bool tcp) {
  char code[8], ms[32];
  double secs = (double)(mono_us() - st->t0) / 1e6;
  snprintf(code, sizeof code, "%d", status);
  snprintf(ms, sizeof ms, "%.3f", secs * 1000.0);
  hutch_log(status >= 500 ? LOG_WARN : LOG_DEBUG, "http.request", "method", method, "path", url, "status", code,
            "dur_ms", ms, "via", tcp ? "tcp" : "unix", NULL);
  hutch_metrics_observe_request(method, st->route ? st->route->pattern : "unmatched", status, secs);
}

static enum MHD_Result finish(struct conn_state *st, struct MHD_Connection *conn, const char *method, const char *url,
                              struct hutch_resp *resp, bool tcp) {
  int status = resp->status ? resp->status : 200;
  enum MHD_Result r = send_json(conn, resp);
  log_request(method, st, url, status, tcp);
  json_decref(resp->json);
  resp->json = NULL;
  if (resp->stream.read && resp->stream.free) resp->stream.free(resp->stream.cls);
  resp->stream.read = NULL;
  return r;
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
    st->req = (struct hutch_req){.ctx = ctx, .conn = conn, .method = method, .path = url, .tcp = tcp};
    /* Decide what can be decided before reading a body. */
    struct hutch_resp resp = {0};
    st->route = lookup(st, method, url, &resp);
    for (size_t i = 0; i < 4; i++) st->req.params[i] = st->params[i];
    if (tcp && strcmp(url, "/healthz") && !authorized(ctx, conn, st)) {
      json_decref(resp.json);
      resp = (struct hutch_resp){0};
      hutch_api_errorf(&resp, 401, "unauthorized", "missing or invalid API key (Authorization: Bearer <key>)");
    } else if (st->route && st->route->admin && tcp) {
      hutch_api_errorf(&resp, 403, "forbidden", "admin calls are only accepted on the unix socket");
    } else if (st->route && st->route->upload) {
      st->upload = st->route->upload->begin(&st->req, &resp);
      if (!st->upload && !resp.status) hutch_api_errorf(&resp, 500, "internal", "upload could not start");
    } else if (st->route) {
      const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
      uint64_t n = 0;
      if (cl && parse_u64(cl, UINT64_MAX, &n) == 0 && n > ctx->cfg.max_body)
        hutch_api_errorf(&resp, 413, "payload_too_large", "request body of %llu bytes exceeds the %zu byte limit",
                         (unsigned long long)n, ctx->cfg.max_body);
      else if (cl && n > 0 && !content_type_ok(conn))
        hutch_api_errorf(&resp, 415, "unsupported_media_type", "request bodies must be application/json");
    }
    if (resp.status) {
      st->rejected = true;
      return finish(st, conn, method, url, &resp, tcp);
    }
    return MHD_YES;
  }
  if (st->rejected) {
    *upload_size = 0;
    return MHD_YES;
  }
  if (*upload_size) {
    if (st->upload) {
      if (!st->upload_failed && st->route->upload->data(st->upload, upload, *upload_size, &st->resp) < 0)
        st->upload_failed = true;
    } else if (st->route && !st->too_large) {
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
  if (!st->route) {
    lookup(st, method, url, &resp); /* 404 or 405 */
  } else if (st->upload) {
    if (st->upload_failed) {
      resp = st->resp;
      st->resp = (struct hutch_resp){0};
      if (st->route->upload->abort) st->route->upload->abort(st->upload);
    } else {
      st->route->upload->end(st->upload, &st->req, &resp); /* `end` frees the state */
    }
    st->upload = NULL;
  } else if (st->too_large) {
    hutch_api_errorf(&resp, 413, "payload_too_large", "request body exceeds the %zu byte limit", ctx->cfg.max_body);
  } else {
    st->req.body = st->body ? st->body : "";
    if (st->body) st->body[st->len] = 0;
    st->req.body_len = st->len;
    st->route->fn(&st->req, &resp);
  }
  return finish(st, conn, method, url, &resp, tcp);
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
  if (st->upload && st->route->upload->abort) st->route->upload->abort(st->upload);
  for (size_t i = 0; i < 4; i++) free(st->params[i]);
  json_decref(st->resp.json);
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
  /* One thread per connection: bound them (streams are long-lived). */
  s->unix_d = MHD_start_daemon(flags, 0, NULL, NULL, on_unix, ctx, MHD_OPTION_LISTEN_SOCKET, s->unix_fd,
                               MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL, MHD_OPTION_CONNECTION_TIMEOUT,
                               (unsigned)120, MHD_OPTION_CONNECTION_LIMIT, (unsigned)1000, MHD_OPTION_END);
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
                                (unsigned)120, MHD_OPTION_CONNECTION_LIMIT, (unsigned)1000,
                                MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)256, MHD_OPTION_END);
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
