/* Commands: start, attach (NDJSON stream), stdin (streamed body), signal,
 * resize, wait, list, get — and the attach tokens that scope a client to one
 * command.  The shim keeps the commands; this file translates. */
#include <errno.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>

#include "api/api.h"
#include "api/json.h"
#include "api/metrics.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/util.h"

/* ---- attach tokens ------------------------------------------------------- */
/* "hat1.<expiry unix seconds>.<hex HMAC-SHA256(key, sb \n cmd \n expiry)>" */

static void token_mac(struct hutch_ctx *ctx, const char *sb, const char *cmd, unsigned long long exp, char hex[65]) {
  char msg[256];
  int n = snprintf(msg, sizeof msg, "%s\n%s\n%llu", sb, cmd, exp);
  unsigned char md[32];
  unsigned int len = 0;
  HMAC(EVP_sha256(), ctx->token_key, sizeof ctx->token_key, (unsigned char *)msg, (size_t)n, md, &len);
  hex_encode(md, 32, hex);
}

static char *token_make(struct hutch_ctx *ctx, const char *sb, const char *cmd, uint64_t *exp_ms) {
  unsigned long long exp = now_ms() / 1000 + ctx->cfg.attach_token_ttl_s;
  char hex[65];
  token_mac(ctx, sb, cmd, exp, hex);
  *exp_ms = (uint64_t)exp * 1000;
  return xasprintf("hat1.%llu.%s", exp, hex);
}

bool hutch_attach_token_valid(struct hutch_ctx *ctx, const char *token, const char *sb_id, const char *cmd_id) {
  if (strncmp(token, "hat1.", 5) || strlen(sb_id) > 100 || strlen(cmd_id) > 100) return false;
  const char *p = token + 5, *dot = strchr(p, '.');
  if (!dot || dot - p > 20 || strlen(dot + 1) != 64) return false;
  char num[24];
  memcpy(num, p, (size_t)(dot - p));
  num[dot - p] = 0;
  uint64_t exp;
  if (parse_u64(num, UINT64_MAX / 2000, &exp) < 0 || exp * 1000 < now_ms()) return false;
  char hex[65];
  token_mac(ctx, sb_id, cmd_id, (unsigned long long)exp, hex);
  return hutch_ct_equal(hex, dot + 1, 64);
}

/* ---- helpers ------------------------------------------------------------- */

static bool valid_cmd_id(const char *s) { return !strncmp(s, "cmd_", 4) && strlen(s) < 64; }

static void name_payload(struct hutch_buf *b, const char *name) {
  hutch_buf_init(b);
  hutch_tlv_put_str(b, HUTCH_TAG_NAME, name);
}

/* One request to the shim about command params[1]; on success *out holds
 * the payload of the answer (caller frees with hutch_buf_free). */
static bool cmd_call(struct hutch_req *req, struct hutch_resp *resp, uint16_t type, struct hutch_buf *payload,
                     struct hutch_frame_hdr *h, struct hutch_buf *out) {
  const char *cid = req->params[1];
  if (cid && !valid_cmd_id(cid)) {
    hutch_api_errorf(resp, 404, "not_found", "command `%.64s` not found", cid);
    return false;
  }
  struct hutch_shim_conn c;
  if (!hutch_api_open_shim(req, resp, &c, 60, NULL)) return false;
  hutch_err err = HUTCH_ERR_INIT;
  bool ok = hutch_shim_conn_call(&c, type, payload->data, payload->len, h, &err) == 0;
  if (!ok) {
    if (err.errnum == ESRCH)
      hutch_err_set(&err, 404, "not_found", "command `%s` not found in sandbox `%s`", cid ? cid : "", req->params[0]);
    hutch_api_error(resp, &err);
  } else if (out) {
    *out = c.payload;
    hutch_buf_init(&c.payload);
  }
  hutch_shim_conn_close(&c);
  return ok;
}

static json_t *get_command(struct hutch_req *req, struct hutch_resp *resp) {
  struct hutch_buf b, out;
  struct hutch_frame_hdr h;
  name_payload(&b, req->params[1]);
  bool ok = cmd_call(req, resp, HUTCH_MSG_LIST, &b, &h, &out);
  hutch_buf_free(&b);
  if (!ok) return NULL;
  json_error_t je;
  json_t *o = json_loadb((const char *)out.data, out.len, 0, &je);
  hutch_buf_free(&out);
  if (!o) hutch_api_errorf(resp, 500, "internal", "the shim sent a malformed command: %s", je.text);
  return o;
}

/* ---- start --------------------------------------------------------------- */

static bool env_key_ok(const char *k) { return *k && !strchr(k, '=') && strlen(k) <= 256; }

void hutch_h_cmd_start(struct hutch_req *req, struct hutch_resp *resp) {
  static const char *const fields[] = {"argv", "cmd", "env", "cwd", "user", "uid", "gid", "stdin", "pty",
                                       "timeout_s", "tag", "lossless", NULL};
  hutch_err err = HUTCH_ERR_INIT;
  json_t *body = hutch_api_body_object(req, &err);
  const char **argv = NULL, *cmd = NULL, *cwd = NULL, *user = NULL, *tag = NULL;
  size_t argc = 0;
  json_t *env = NULL;
  int64_t uid = -1, gid = -1, timeout_s = 0, rows = 24, cols = 80;
  bool want_stdin = false, lossless = false;
  char **envp = NULL;
  json_t *pty = NULL;
  char *token = NULL; /* declared before any goto: the exits free it */
  cleanup_free char *dcwd = NULL;
  if (!body || hutch_json_only(body, "", fields, &err) < 0 ||
      hutch_json_string_array(body, "", "argv", 4096, &argv, &argc, &err) < 0 ||
      hutch_json_string(body, "", "cmd", 1 << 20, &cmd, &err) < 0 ||
      hutch_json_string(body, "", "cwd", 4096, &cwd, &err) < 0 ||
      hutch_json_string(body, "", "user", 32, &user, &err) < 0 ||
      hutch_json_string(body, "", "tag", 64, &tag, &err) < 0 ||
      hutch_json_int(body, "", "uid", 0, 65535, &uid, &err) < 0 ||
      hutch_json_int(body, "", "gid", 0, 65535, &gid, &err) < 0 ||
      hutch_json_int(body, "", "timeout_s", 0, 7 * 24 * 3600, &timeout_s, &err) < 0 ||
      hutch_json_bool(body, "", "stdin", &want_stdin, &err) < 0 ||
      hutch_json_bool(body, "", "lossless", &lossless, &err) < 0 ||
      hutch_json_string_map(body, "", "env", 256, 32768, env_key_ok, "must be non-empty and must not contain `=`",
                            &env, &err) < 0)
    goto fail;
  pty = json_object_get(body, "pty");
  if (pty && !json_is_null(pty)) {
    static const char *const pf[] = {"rows", "cols", NULL};
    if (!json_is_object(pty)) {
      hutch_err_invalid(&err, "field `pty`: expected an object {\"rows\":24,\"cols\":80}");
      goto fail;
    }
    if (hutch_json_only(pty, "pty", pf, &err) < 0 || hutch_json_int(pty, "pty", "rows", 1, 1000, &rows, &err) < 0 ||
        hutch_json_int(pty, "pty", "cols", 1, 1000, &cols, &err) < 0)
      goto fail;
  } else {
    pty = NULL;
  }
  if ((argv != NULL) == (cmd != NULL)) {
    hutch_err_invalid(&err, "exactly one of `argv` and `cmd` is required");
    goto fail;
  }
  if ((argv && (argc == 0 || !*argv[0])) || (cmd && !*cmd)) {
    hutch_err_invalid(&err, "field `%s`: must not be empty", argv ? "argv" : "cmd");
    goto fail;
  }
  if (cwd && cwd[0] != '/') {
    hutch_err_invalid(&err, "field `cwd`: must be an absolute path");
    goto fail;
  }
  if (user) {
    if (!strcmp(user, "root")) uid = uid < 0 ? 0 : uid, gid = gid < 0 ? 0 : gid;
    else if (!strcmp(user, "user")) uid = uid < 0 ? 1000 : uid, gid = gid < 0 ? 1000 : gid;
    else {
      hutch_err_invalid(&err, "field `user`: expected \"root\" or \"user\" (or give `uid`/`gid`)");
      goto fail;
    }
  }
  struct hutch_shim_conn c;
  struct hutch_sandbox_rec sbr;
  if (!hutch_api_open_shim(req, resp, &c, 30, &sbr)) goto out;
  envp = hutch_lc_command_env(&sbr, env);
  /* The default working directory: the image's, else the user's home. */
  dcwd = hutch_lc_default_cwd(&sbr, uid);
  if (!cwd) cwd = dcwd;
  hutch_sandbox_rec_free(&sbr);
  if (uid == 1000) {
    for (size_t i = 0; envp[i]; i++)
      if (!strncmp(envp[i], "HOME=/root", 10)) free(envp[i]), envp[i] = xstrdup("HOME=/home/user");
      else if (!strncmp(envp[i], "USER=root", 9)) free(envp[i]), envp[i] = xstrdup("USER=user");
  }
  const char *sh_argv[] = {"/bin/sh", "-c", cmd, NULL};
  char name[64];
  hutch_random_id("cmd", name, sizeof name);
  struct hutch_buf b;
  hutch_buf_init(&b);
  uint32_t flags = (want_stdin || pty ? HUTCH_SPAWN_STDIN : 0) | (pty ? HUTCH_SPAWN_PTY : 0) |
                   (lossless ? HUTCH_SPAWN_FLOW : 0);
  hutch_spawn_encode(&b, argv ? argv : sh_argv, (const char *const *)envp, cwd, (uint32_t)timeout_s * 1000u,
                     uid < 0 ? 0 : (uint32_t)uid, gid < 0 ? 0 : (uint32_t)gid, flags);
  hutch_tlv_put_str(&b, HUTCH_TAG_NAME, name);
  if (tag) hutch_tlv_put_str(&b, HUTCH_TAG_TAG, tag);
  if (pty) {
    hutch_tlv_put_u32(&b, HUTCH_TAG_ROWS, (uint32_t)rows);
    hutch_tlv_put_u32(&b, HUTCH_TAG_COLS, (uint32_t)cols);
  }
  struct hutch_frame_hdr h;
  int r = hutch_shim_conn_call(&c, HUTCH_MSG_SPAWN, b.data, b.len, &h, &err);
  hutch_buf_free(&b);
  uint32_t pid = 0;
  if (r == 0) hutch_tlv_find_u32(c.payload.data, c.payload.len, HUTCH_TAG_PID, &pid);
  hutch_shim_conn_close(&c);
  if (r < 0) {
    /* The program could not start: report it as the doc says for exec. */
    if (err.status == 404 || err.status == 403) err.status = 400, snprintf(err.code, sizeof err.code, "invalid_argument");
    goto fail;
  }
  uint64_t exp;
  token = token_make(req->ctx, req->params[0], name, &exp);
  char ts[32];
  iso8601(exp, ts);
  resp->status = 201;
  resp->json = json_pack("{s:s, s:I, s:s?, s:s, s:s}", "id", name, "pid", (json_int_t)pid, "tag", tag, "attach_token",
                         token, "attach_token_expires_at", ts);
  hutch_log(LOG_DEBUG, "command.started", "sandbox", req->params[0], "id", name, NULL);
  hutch_metrics_command_started();
  goto out;
fail:
  hutch_api_error(resp, &err);
out:
  free(token);
  hutch_envp_free(envp);
  free(argv);
  json_decref(body);
}

/* ---- list / get / signal / resize / wait ---------------------------------- */

/* Commands saved by suspends (docs/lifecycle.md), oldest first; never NULL. */
static json_t *history(struct hutch_ctx *ctx, const char *sb_id) {
  cleanup_free char *dir = hutch_sandbox_dir(ctx, sb_id);
  cleanup_free char *path = xasprintf("%s/commands.json", dir);
  json_error_t je;
  json_t *a = json_load_file(path, 0, &je);
  if (json_is_array(a)) return a;
  json_decref(a);
  return json_array();
}

/* Whether the sandbox is running (then the shim has the live list); fills
 * resp with 404 for an unknown sandbox. */
static int sandbox_running(struct hutch_req *req, struct hutch_resp *resp) {
  struct hutch_sandbox_rec r;
  hutch_err err = HUTCH_ERR_INIT;
  if (hutch_lc_get(req->ctx, req->params[0], &r, &err) < 0) {
    hutch_api_error(resp, &err);
    return -1;
  }
  int running = !strcmp(r.state, "running");
  hutch_sandbox_rec_free(&r);
  return running;
}

void hutch_h_cmd_list(struct hutch_req *req, struct hutch_resp *resp) {
  int running = sandbox_running(req, resp);
  if (running < 0) return;
  json_t *all = history(req->ctx, req->params[0]);
  if (running) {
    struct hutch_buf b, out;
    struct hutch_frame_hdr h;
    hutch_buf_init(&b);
    bool ok = cmd_call(req, resp, HUTCH_MSG_LIST, &b, &h, &out);
    hutch_buf_free(&b);
    if (!ok) {
      json_decref(all);
      return;
    }
    json_error_t je;
    json_t *a = json_loadb((const char *)out.data, out.len, 0, &je);
    hutch_buf_free(&out);
    if (!a) {
      json_decref(all);
      hutch_api_errorf(resp, 500, "internal", "the shim sent a malformed list: %s", je.text);
      return;
    }
    json_array_extend(all, a);
    json_decref(a);
  }
  resp->status = 200;
  resp->json = json_pack("{s:o}", "commands", all);
}

void hutch_h_cmd_get(struct hutch_req *req, struct hutch_resp *resp) {
  int running = sandbox_running(req, resp);
  if (running < 0) return;
  if (running) {
    json_t *o = get_command(req, resp);
    if (o) {
      resp->status = 200;
      resp->json = o;
      return;
    }
    if (resp->status != 404) return;
    json_decref(resp->json);
    resp->json = NULL;
  }
  /* Not running, or not known to the shim: a command from before a suspend? */
  json_t *all = history(req->ctx, req->params[0]);
  size_t i;
  json_t *c;
  json_array_foreach(all, i, c) {
    const char *id = json_string_value(json_object_get(c, "id"));
    if (id && !strcmp(id, req->params[1])) {
      resp->status = 200;
      resp->json = json_incref(c);
      json_decref(all);
      return;
    }
  }
  json_decref(all);
  hutch_api_errorf(resp, 404, "not_found", "command `%.64s` not found in sandbox `%s`", req->params[1], req->params[0]);
}

static int signal_number(json_t *v) {
  static const struct {
    const char *name;
    int sig;
  } names[] = {{"HUP", SIGHUP},   {"INT", SIGINT},   {"QUIT", SIGQUIT}, {"KILL", SIGKILL}, {"TERM", SIGTERM},
               {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"STOP", SIGSTOP}, {"CONT", SIGCONT}, {"ALRM", SIGALRM},
               {"PIPE", SIGPIPE}, {"WINCH", SIGWINCH}, {"ABRT", SIGABRT}, {"TSTP", SIGTSTP}};
  if (json_is_integer(v)) {
    json_int_t n = json_integer_value(v);
    return n >= 1 && n <= 64 ? (int)n : -1;
  }
  if (!json_is_string(v)) return -1;
  const char *s = json_string_value(v);
  if (!strncasecmp(s, "SIG", 3)) s += 3;
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    if (!strcasecmp(s, names[i].name)) return names[i].sig;
  return -1;
}

void hutch_h_cmd_signal(struct hutch_req *req, struct hutch_resp *resp) {
  static const char *const fields[] = {"signal", NULL};
  hutch_err err = HUTCH_ERR_INIT;
  json_t *body = hutch_api_body_object(req, &err);
  if (!body || hutch_json_only(body, "", fields, &err) < 0) {
    hutch_api_error(resp, &err);
    json_decref(body);
    return;
  }
  json_t *v = json_object_get(body, "signal");
  int sig = v ? signal_number(v) : SIGTERM;
  json_decref(body);
  if (sig < 0) {
    hutch_api_errorf(resp, 400, "invalid_argument", "field `signal`: expected a signal name (TERM, KILL, …) or number");
    return;
  }
  struct hutch_buf b;
  struct hutch_frame_hdr h;
  name_payload(&b, req->params[1]);
  hutch_tlv_put_u32(&b, HUTCH_TAG_SIGNO, (uint32_t)sig);
  bool ok = cmd_call(req, resp, HUTCH_MSG_SIGNAL, &b, &h, NULL);
  hutch_buf_free(&b);
  if (!ok) return;
  resp->status = 200;
  resp->json = json_pack("{s:s, s:i}", "id", req->params[1], "signal", sig);
}

void hutch_h_cmd_resize(struct hutch_req *req, struct hutch_resp *resp) {
  static const char *const fields[] = {"rows", "cols", NULL};
  hutch_err err = HUTCH_ERR_INIT;
  json_t *body = hutch_api_body_object(req, &err);
  int64_t rows = -1, cols = -1;
  if (!body || hutch_json_only(body, "", fields, &err) < 0 || hutch_json_int(body, "", "rows", 1, 1000, &rows, &err) < 0 ||
      hutch_json_int(body, "", "cols", 1, 1000, &cols, &err) < 0 || ((rows < 0 || cols < 0) &&
                                                                    hutch_err_invalid(&err, "`rows` and `cols` are required") < 0)) {
    hutch_api_error(resp, &err);
    json_decref(body);
    return;
  }
  json_decref(body);
  struct hutch_buf b;
  struct hutch_frame_hdr h;
  name_payload(&b, req->params[1]);
  hutch_tlv_put_u32(&b, HUTCH_TAG_ROWS, (uint32_t)rows);
  hutch_tlv_put_u32(&b, HUTCH_TAG_COLS, (uint32_t)cols);
  bool ok = cmd_call(req, resp, HUTCH_MSG_RESIZE, &b, &h, NULL);
  hutch_buf_free(&b);
  if (!ok) return;
  resp->status = 200;
  resp->json = json_pack("{s:s, s:I, s:I}", "id", req->params[1], "rows", (json_int_t)rows, "cols", (json_int_t)cols);
}

void hutch_h_cmd_wait(struct hutch_req *req, struct hutch_resp *resp) {
  uint64_t t = 60;
  const char *q = hutch_api_query(req, "timeout_s");
  if (q && parse_u64(q, 3600, &t) < 0) {
    hutch_api_errorf(resp, 400, "invalid_argument", "query `timeout_s`: expected seconds between 0 and 3600");
    return;
  }
  if (!valid_cmd_id(req->params[1])) {
    hutch_api_errorf(resp, 404, "not_found", "command `%.64s` not found", req->params[1]);
    return;
  }
  struct hutch_shim_conn c;
  if (!hutch_api_open_shim(req, resp, &c, (int)t + 1, NULL)) return;
  struct hutch_buf b;
  struct hutch_frame_hdr h;
  name_payload(&b, req->params[1]);
  hutch_err err = HUTCH_ERR_INIT;
  int r = hutch_shim_conn_call(&c, HUTCH_MSG_WAIT, b.data, b.len, &h, &err);
  hutch_buf_free(&b);
  hutch_shim_conn_close(&c);
  if (r < 0 && err.status != 503) { /* 503 here = our own wait bound passed */
    if (err.errnum == ESRCH) hutch_err_set(&err, 404, "not_found", "command `%s` not found", req->params[1]);
    hutch_api_error(resp, &err);
    return;
  }
  json_t *o = get_command(req, resp);
  if (!o) return;
  resp->status = 200;
  resp->json = o;
}

/* ---- attach: frames from the shim become NDJSON lines --------------------- */

struct attach_stream {
  struct hutch_shim_conn c;
  int client_fd;
  uint64_t last_out_us;
  struct hutch_buf line; /* pending output not yet handed to MHD */
  size_t off;
  bool done;
};

static void b64(const unsigned char *in, size_t n, struct hutch_buf *out) {
  size_t need = 4 * ((n + 2) / 3) + 1;
  unsigned char *tmp = xmalloc(need);
  int len = EVP_EncodeBlock(tmp, in, (int)n);
  hutch_buf_append(out, tmp, (size_t)len);
  free(tmp);
}

static void emit_json(struct hutch_buf *out, json_t *o) {
  char *s = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  hutch_buf_append(out, s, strlen(s));
  hutch_buf_append(out, "\n", 1);
  free(s);
}

/* Translate one frame into lines; returns false at the end of the stream. */
static bool attach_frame(struct attach_stream *a, const struct hutch_frame_hdr *h) {
  const unsigned char *p = a->c.payload.data;
  size_t n = a->c.payload.len;
  const unsigned char *v;
  uint32_t vl;
  uint64_t dout = 0, derr = 0;
  switch (h->type) {
    case HUTCH_MSG_ATTACHED: {
      if (hutch_tlv_find(p, n, HUTCH_TAG_DROPPED_OUT, &v, &vl) == 1) hutch_tlv_u64(v, vl, &dout);
      if (hutch_tlv_find(p, n, HUTCH_TAG_DROPPED_ERR, &v, &vl) == 1) hutch_tlv_u64(v, vl, &derr);
      cleanup_free char *name = hutch_tlv_find_str(p, n, HUTCH_TAG_NAME);
      emit_json(&a->line, json_pack("{s:s, s:s?, s:{s:I, s:I}}", "type", "attached", "command", name, "dropped", "stdout",
                                    (json_int_t)dout, "stderr", (json_int_t)derr));
      return true;
    }
    case HUTCH_MSG_STDOUT:
    case HUTCH_MSG_STDERR:
    {
      const char *pre = h->type == HUTCH_MSG_STDOUT ? "{\"type\":\"stdout\",\"data\":\"" : "{\"type\":\"stderr\",\"data\":\"";
      hutch_buf_append(&a->line, pre, strlen(pre));
    }
      b64(p, n, &a->line);
      hutch_buf_append(&a->line, "\"}\n", 3);
      return true;
    case HUTCH_MSG_EXIT: {
      struct hutch_exit e;
      hutch_exit_decode(p, n, &e);
      emit_json(&a->line, json_pack("{s:s, s:o, s:o, s:b}", "type", "exit", "exit_code",
                                    e.signo ? json_null() : json_integer(e.exit_code), "signal",
                                    e.signo ? json_integer(e.signo) : json_null(), "timed_out", e.timed_out));
      return false;
    }
    case HUTCH_MSG_ERROR: {
      cleanup_free char *msg = hutch_tlv_find_str(p, n, HUTCH_TAG_MESSAGE);
      uint32_t en = 0;
      hutch_tlv_find_u32(p, n, HUTCH_TAG_ERRNO, &en);
      emit_json(&a->line, json_pack("{s:s, s:i, s:s}", "type", "exit", "exit_code", en == ENOENT ? 127 : 126, "error",
                                    msg ? msg : "the command could not start"));
      return false;
    }
    default: return true;
  }
}

static ssize_t attach_read(void *cls, uint64_t pos, char *buf, size_t max) {
  struct attach_stream *a = cls;
  while (a->off >= a->line.len) {
    hutch_buf_reset(&a->line);
    a->off = 0;
    if (a->done) return HUTCH_STREAM_END;
    /* While waiting, watch the client too: a lossless command is blocked
     * until its reader reads, and must be ended when that reader leaves. */
    struct pollfd pf = {.fd = a->c.fd, .events = POLLIN};
    int pr = poll(&pf, 1, 1000);
    if (pr < 0 && errno == EINTR) continue;
    if (pr == 0) {
      if (hutch_api_peer_gone(a->client_fd)) return HUTCH_STREAM_ERROR;
      if (mono_us() - a->last_out_us >= 15000000u) {
        hutch_buf_append(&a->line, "{\"type\":\"keepalive\"}\n", 21);
        a->last_out_us = mono_us();
      }
      continue;
    }
    a->last_out_us = mono_us();
    struct hutch_frame_hdr h;
    hutch_err err = HUTCH_ERR_INIT;
    if (hutch_shim_conn_read(&a->c, &h, &err) <= 0) return HUTCH_STREAM_ERROR;
    if (!attach_frame(a, &h)) a->done = true;
  }
  size_t n = a->line.len - a->off;
  if (n > max) n = max;
  memcpy(buf, a->line.data + a->off, n);
  a->off += n;
  return (ssize_t)n;
}

static void attach_free(void *cls) {
  struct attach_stream *a = cls;
  hutch_shim_conn_close(&a->c);
  hutch_buf_free(&a->line);
  free(a);
}

void hutch_h_cmd_attach(struct hutch_req *req, struct hutch_resp *resp) {
  if (!valid_cmd_id(req->params[1])) {
    hutch_api_errorf(resp, 404, "not_found", "command `%.64s` not found", req->params[1]);
    return;
  }
  const char *rp = hutch_api_query(req, "replay");
  bool replay = !rp || strcmp(rp, "false");
  struct attach_stream *a = xcalloc(1, sizeof *a);
  a->client_fd = hutch_api_client_fd(req);
  a->last_out_us = mono_us();
  if (!hutch_api_open_shim(req, resp, &a->c, 0, NULL)) {
    free(a);
    return;
  }
  hutch_buf_init(&a->line);
  struct hutch_buf b;
  name_payload(&b, req->params[1]);
  hutch_tlv_put_u32(&b, HUTCH_TAG_FLAGS, replay ? 1 : 0);
  hutch_err err = HUTCH_ERR_INIT;
  uint32_t id = hutch_shim_conn_send(&a->c, HUTCH_MSG_ATTACH, b.data, b.len, &err);
  hutch_buf_free(&b);
  /* The first answer decides the status: ATTACHED, or an ERROR (404). */
  struct hutch_frame_hdr h;
  if (!id || hutch_shim_conn_read(&a->c, &h, &err) <= 0) {
    hutch_api_error(resp, &err);
    attach_free(a);
    return;
  }
  if (h.type == HUTCH_MSG_ERROR) {
    hutch_shim_error(a->c.payload.data, a->c.payload.len, &err);
    if (err.errnum == ESRCH) hutch_err_set(&err, 404, "not_found", "command `%s` not found", req->params[1]);
    hutch_api_error(resp, &err);
    attach_free(a);
    return;
  }
  if (!attach_frame(a, &h)) a->done = true;
  resp->status = 200;
  resp->stream = (struct hutch_stream){.read = attach_read, .free = attach_free, .cls = a, .size = HUTCH_SIZE_UNKNOWN,
                                       .content_type = "application/x-ndjson"};
}

/* ---- stdin: the raw body, streamed in chunks ------------------------------ */

struct stdin_up {
  struct hutch_shim_conn c;
  char name[64];
  uint64_t written;
  bool close_after;
};

static int stdin_chunk(struct stdin_up *u, const char *buf, size_t n, hutch_err *err) {
  struct hutch_buf b;
  name_payload(&b, u->name);
  hutch_tlv_put(&b, HUTCH_TAG_DATA, buf, (uint32_t)n);
  struct hutch_frame_hdr h;
  int r = hutch_shim_conn_call(&u->c, HUTCH_MSG_STDIN, b.data, b.len, &h, err);
  hutch_buf_free(&b);
  if (r < 0) return -1; /* EPIPE (closed, never opened, finished) is already 409 */
  u->written += n;
  return 0;
}

static void *stdin_begin(struct hutch_req *req, struct hutch_resp *resp) {
  if (!valid_cmd_id(req->params[1])) {
    hutch_api_errorf(resp, 404, "not_found", "command `%.64s` not found", req->params[1]);
    return NULL;
  }
  struct stdin_up *u = xcalloc(1, sizeof *u);
  if (!hutch_api_open_shim(req, resp, &u->c, 60, NULL)) {
    free(u);
    return NULL;
  }
  snprintf(u->name, sizeof u->name, "%s", req->params[1]);
  const char *cl = hutch_api_query(req, "close");
  u->close_after = cl && (!strcmp(cl, "true") || !strcmp(cl, "1"));
  /* Check the command exists and is running before taking a body. */
  struct hutch_buf b;
  struct hutch_frame_hdr h;
  hutch_err err = HUTCH_ERR_INIT;
  name_payload(&b, u->name);
  int r = hutch_shim_conn_call(&u->c, HUTCH_MSG_LIST, b.data, b.len, &h, &err);
  hutch_buf_free(&b);
  if (r == 0) {
    json_error_t je;
    json_t *o = json_loadb((const char *)u->c.payload.data, u->c.payload.len, 0, &je);
    const char *state = json_string_value(json_object_get(o, "state"));
    if (state && strcmp(state, "running")) {
      json_decref(o);
      hutch_api_errorf(resp, 409, "conflict", "command `%s` has finished", u->name);
      hutch_shim_conn_close(&u->c);
      free(u);
      return NULL;
    }
    json_decref(o);
  } else {
    if (err.errnum == ESRCH) hutch_err_set(&err, 404, "not_found", "command `%s` not found", u->name);
    hutch_api_error(resp, &err);
    hutch_shim_conn_close(&u->c);
    free(u);
    return NULL;
  }
  return u;
}

static int stdin_data(void *state, const char *buf, size_t n, struct hutch_resp *resp) {
  struct stdin_up *u = state;
  hutch_err err = HUTCH_ERR_INIT;
  while (n > 0) {
    size_t k = n > (256u << 10) ? (256u << 10) : n;
    if (stdin_chunk(u, buf, k, &err) < 0) {
      hutch_api_error(resp, &err);
      return -1;
    }
    buf += k;
    n -= k;
  }
  return 0;
}

static void stdin_abort(void *state) {
  struct stdin_up *u = state;
  if (!u) return;
  hutch_shim_conn_close(&u->c);
  free(u);
}

static void stdin_end(void *state, struct hutch_req *req, struct hutch_resp *resp) {
  struct stdin_up *u = state;
  if (u->close_after) {
    struct hutch_buf b;
    struct hutch_frame_hdr h;
    hutch_err err = HUTCH_ERR_INIT;
    name_payload(&b, u->name);
    int r = hutch_shim_conn_call(&u->c, HUTCH_MSG_STDIN_CLOSE, b.data, b.len, &h, &err);
    hutch_buf_free(&b);
    if (r < 0) {
      hutch_api_error(resp, &err);
      stdin_abort(u);
      return;
    }
  }
  resp->status = 200;
  resp->json = json_pack("{s:I, s:b}", "written", (json_int_t)u->written, "closed", u->close_after);
  stdin_abort(u);
}

const struct hutch_upload_ops hutch_u_cmd_stdin = {stdin_begin, stdin_data, stdin_end, stdin_abort};
