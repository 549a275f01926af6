/* Files: every path is resolved inside the sandbox by hutch-init (openat2
 * with RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS); hutchd never joins a
 * sandbox path onto a host path.  Transfers are streamed one chunk at a
 * time (pulled from init for downloads, acknowledged by init for uploads),
 * so a transfer of any size holds at most a chunk in each process.
 * Directories move as tar streams produced and consumed by the sandbox's own
 * `tar`, paced by the client (FLOW), so nothing is buffered or lost. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "api/json.h"
#include "common/log.h"
#include "common/util.h"

#define CHUNK (512u << 10)

static const char *type_name(uint32_t t) {
  switch (t) {
    case 1: return "file";
    case 2: return "dir";
    case 3: return "symlink";
    default: return "other";
  }
}

/* ENTRY TLV -> JSON stat object. */
static json_t *entry_json(const unsigned char *p, uint32_t n) {
  char *path = hutch_tlv_find_str(p, n, HUTCH_TAG_PATH);
  char *link = hutch_tlv_find_str(p, n, HUTCH_TAG_E_LINK);
  uint32_t type = 4, mode = 0, uid = 0, gid = 0;
  uint64_t size = 0, mtime = 0;
  const unsigned char *v;
  uint32_t vl;
  hutch_tlv_find_u32(p, n, HUTCH_TAG_E_TYPE, &type);
  hutch_tlv_find_u32(p, n, HUTCH_TAG_MODE, &mode);
  hutch_tlv_find_u32(p, n, HUTCH_TAG_UID, &uid);
  hutch_tlv_find_u32(p, n, HUTCH_TAG_GID, &gid);
  if (hutch_tlv_find(p, n, HUTCH_TAG_E_SIZE, &v, &vl) == 1) hutch_tlv_u64(v, vl, &size);
  if (hutch_tlv_find(p, n, HUTCH_TAG_E_MTIME, &v, &vl) == 1) hutch_tlv_u64(v, vl, &mtime);
  char m[8], ts[32];
  snprintf(m, sizeof m, "%04o", mode & 07777);
  iso8601(mtime * 1000, ts);
  const char *base = path ? strrchr(path, '/') : NULL;
  json_t *o = json_pack("{s:s, s:s, s:s, s:I, s:s, s:s, s:I, s:I, s:o}", "path", path ? path : "", "name",
                        base ? base + 1 : (path ? path : ""), "type", type_name(type), "size", (json_int_t)size, "mode",
                        m, "mtime", ts, "uid", (json_int_t)uid, "gid", (json_int_t)gid, "link_target",
                        link ? json_string(link) : json_null());
  free(path);
  free(link);
  return o;
}

/* The `path` query parameter, checked; NULL with resp filled. */
static const char *path_param(struct hutch_req *req, struct hutch_resp *resp, const char *key) {
  const char *p;
  if (!hutch_api_query_clean(req, key, &p)) {
    hutch_api_errorf(resp, 400, "invalid_argument", "query `%s`: the path contains a NUL byte", key);
    return NULL;
  }
  if (!p || !*p) {
    hutch_api_errorf(resp, 400, "invalid_argument", "query `%s`: a path is required", key);
    return NULL;
  }
  if (strlen(p) > 4096) {
    hutch_api_errorf(resp, 400, "invalid_argument", "query `%s`: longer than 4096 bytes", key);
    return NULL;
  }
  return p;
}

static bool flag_param(struct hutch_req *req, const char *key) {
  const char *v = hutch_api_query(req, key);
  return v && (!strcmp(v, "true") || !strcmp(v, "1"));
}

/* One file request; on success c->payload holds the FS_RESULT. */
static bool fs_call(struct hutch_shim_conn *c, uint16_t type, struct hutch_buf *b, struct hutch_resp *resp) {
  struct hutch_frame_hdr h;
  hutch_err err = HUTCH_ERR_INIT;
  int r = hutch_shim_conn_call(c, type, b->data, b->len, &h, &err);
  hutch_buf_free(b);
  if (r < 0) {
    hutch_api_error(resp, &err);
    return false;
  }
  return true;
}

/* ---- simple calls --------------------------------------------------------- */

void hutch_h_files_stat(struct hutch_req *req, struct hutch_resp *resp) {
  const char *path = path_param(req, resp, "path");
  struct hutch_shim_conn c;
  if (!path || !hutch_api_open_shim(req, resp, &c, 120, NULL)) return;
  struct hutch_buf b;
  hutch_buf_init(&b);
  hutch_tlv_put_str(&b, HUTCH_TAG_PATH, path);
  if (fs_call(&c, HUTCH_MSG_FS_STAT, &b, resp)) {
    const unsigned char *v;
    uint32_t vl;
    if (hutch_tlv_find(c.payload.data, c.payload.len, HUTCH_TAG_ENTRY, &v, &vl) == 1) {
      resp->status = 200;
      resp->json = entry_json(v, vl);
      json_object_set_new(resp->json, "path", json_string(path));
    } else {
      hutch_api_errorf(resp, 500, "internal", "stat `%s`: no entry in the answer", path);
    }
  }
  hutch_shim_conn_close(&c);
}

void hutch_h_files_list(struct hutch_req *req, struct hutch_resp *resp) {
  const char *path = path_param(req, resp, "path");
  uint64_t depth = 1;
  const char *d = hutch_api_query(req, "depth");
  if (path && d && (parse_u64(d, 10, &depth) < 0 || depth < 1)) {
    hutch_api_errorf(resp, 400, "invalid_argument", "query `depth`: expected 1 to 10");
    return;
  }
  struct hutch_shim_conn c;
  if (!path || !hutch_api_open_shim(req, resp, &c, 120, NULL)) return;
  struct hutch_buf b;
  hutch_buf_init(&b);
  hutch_tlv_put_str(&b, HUTCH_TAG_PATH, path);
  hutch_tlv_put_u32(&b, HUTCH_TAG_DEPTH, (uint32_t)depth);
  if (fs_call(&c, HUTCH_MSG_FS_LIST, &b, resp)) {
    json_t *a = json_array();
    struct hutch_tlv_iter it;
    uint8_t tag;
    const unsigned char *v;
    uint32_t vl;
    bool truncated = false;
    hutch_tlv_iter_init(&it, c.payload.data, c.payload.len);
    while (hutch_tlv_next(&it, &tag, &v, &vl) == 1) {
      uint32_t fl = 0;
      if (tag == HUTCH_TAG_ENTRY) json_array_append_new(a, entry_json(v, vl));
      else if (tag == HUTCH_TAG_FLAGS && hutch_tlv_u32(v, vl, &fl) == 0) truncated = fl & 1;
    }
    resp->status = 200;
    resp->json = json_pack("{s:s, s:o, s:b}", "path", path, "entries", a, "truncated", truncated);
  }
  hutch_shim_conn_close(&c);
}

void hutch_h_files_delete(struct hutch_req *req, struct hutch_resp *resp) {
  const char *path = path_param(req, resp, "path");
  struct hutch_shim_conn c;
  if (!path || !hutch_api_open_shim(req, resp, &c, 120, NULL)) return;
  struct hutch_buf b;
  hutch_buf_init(&b);
  hutch_tlv_put_str(&b, HUTCH_TAG_PATH, path);
  hutch_tlv_put_u32(&b, HUTCH_TAG_FLAGS, flag_param(req, "recursive") ? 1 : 0);
  if (fs_call(&c, HUTCH_MSG_FS_REMOVE, &b, resp)) resp->status = 204;
  hutch_shim_conn_close(&c);
}

static int parse_mode(json_t *body, const char *key, uint32_t def, uint32_t *out, hutch_err *err) {
  json_t *v = json_object_get(body, key);
  *out = def;
  if (!v || json_is_null(v)) return 0;
  if (json_is_string(v)) {
    char *end;
    unsigned long m = strtoul(json_string_value(v), &end, 8);
    if (*json_string_value(v) && !*end && m <= 07777) {
      *out = (uint32_t)m;
      return 0;
    }
  } else if (json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) <= 07777) {
    *out = (uint32_t)json_integer_value(v);
    return 0;
  }
  return hutch_err_invalid(err, "field `%s`: expected an octal mode such as \"0755\"", key);
}

void hutch_h_files_mkdir(struct hutch_req *req, struct hutch_resp *resp) {
  static const char *const fields[] = {"path", "mode", "parents", NULL};
  hutch_err err = HUTCH_ERR_INIT;
  json_t *body = hutch_api_body_object(req, &err);
  const char *path = NULL;
  bool parents = false;
  uint32_t mode;
  if (!body || hutch_json_only(body, "", fields, &err) < 0 || hutch_json_string(body, "", "path", 4096, &path, &err) < 0 ||
      hutch_json_bool(body, "", "parents", &parents, &err) < 0 || parse_mode(body, "mode", 0755, &mode, &err) < 0 ||
      (!path && hutch_err_invalid(&err, "field `path`: required") < 0) ||
      (!*path && hutch_err_invalid(&err, "field `path`: must not be empty") < 0)) {
    hutch_api_error(resp, &err);
    json_decref(body);
    return;
  }
  struct hutch_shim_conn c;
  if (hutch_api_open_shim(req, resp, &c, 120, NULL)) {
    struct hutch_buf b;
    hutch_buf_init(&b);
    hutch_tlv_put_str(&b, HUTCH_TAG_PATH, path);
    hutch_tlv_put_u32(&b, HUTCH_TAG_MODE, mode);
    hutch_tlv_put_u32(&b, HUTCH_TAG_FLAGS, parents ? 1 : 0);
    if (fs_call(&c, HUTCH_MSG_FS_MKDIR, &b, resp)) {
      resp->status = 201;
      resp->json = json_pack("{s:s}", "path", path);
    }
    hutch_shim_conn_close(&c);
  }
  json_decref(body);
}

void hutch_h_files_move(struct hutch_req *req, struct hutch_resp *resp) {
  static const char *const fields[] = {"from", "to", "overwrite", NULL};
  hutch_err err = HUTCH_ERR_INIT;
  json_t *body = hutch_api_body_object(req, &err);
  const char *from = NULL, *to = NULL;
  bool overwrite = false;
  if (!body || hutch_json_only(body, "", fields, &err) < 0 || hutch_json_string(body, "", "from", 4096, &from, &err) < 0 ||
      hutch_json_string(body, "", "to", 4096, &to, &err) < 0 ||
      hutch_json_bool(body, "", "overwrite", &overwrite, &err) < 0 ||
      ((!from || !*from || !to || !*to) && hutch_err_invalid(&err, "fields `from` and `to` are required") < 0)) {
    hutch_api_error(resp, &err);
    json_decref(body);
    return;
  }
  struct hutch_shim_conn c;
  if (hutch_api_open_shim(req, resp, &c, 120, NULL)) {
    struct hutch_buf b;
    hutch_buf_init(&b);
    hutch_tlv_put_str(&b, HUTCH_TAG_PATH, from);
    hutch_tlv_put_str(&b, HUTCH_TAG_PATH2, to);
    hutch_tlv_put_u32(&b, HUTCH_TAG_FLAGS, overwrite ? 1 : 0);
    if (fs_call(&c, HUTCH_MSG_FS_MOVE, &b, resp)) {
      resp->status = 200;
      resp->json = json_pack("{s:s, s:s}", "from", from, "to", to);
    }
    hutch_shim_conn_close(&c);
  }
  json_decref(body);
}

/* ---- download --------------------------------------------------------------- */

struct download {
  struct hutch_shim_conn c;
  uint32_t handle;
  uint64_t size, sent;
  struct hutch_buf chunk;
  size_t off;
  bool closed;
};

static void download_close_handle(struct download *d) {
  if (d->closed || d->c.fd < 0) return;
  d->closed = true;
  struct hutch_buf b;
  hutch_buf_init(&b);
  hutch_tlv_put_u32(&b, HUTCH_TAG_HANDLE, d->handle);
  struct hutch_frame_hdr h;
  hutch_err err = HUTCH_ERR_INIT;
  hutch_shim_conn_call(&d->c, HUTCH_MSG_FS_CLOSE, b.data, b.len, &h, &err);
  hutch_buf_free(&b);
}

static ssize_t download_read(void *cls, uint64_t pos, char *buf, size_t max) {
  struct download *d = cls;
  if (d->sent >= d->size) {
    download_close_handle(d);
    return HUTCH_STREAM_END;
  }
  if (d->off >= d->chunk.len) {
    struct hutch_buf b;
    hutch_buf_init(&b);
    hutch_tlv_put_u32(&b, HUTCH_TAG_HANDLE, d->handle);
    uint64_t want = d->size - d->sent < CHUNK ? d->size - d->sent : CHUNK;
    hutch_tlv_put_u32(&b, HUTCH_TAG_LEN, (uint32_t)want);
    struct hutch_frame_hdr h;
    hutch_err err = HUTCH_ERR_INIT;
    int r = hutch_shim_conn_call(&d->c, HUTCH_MSG_FS_READ, b.data, b.len, &h, &err);
    hutch_buf_free(&b);
    /* The file shrank or vanished under us: the promised length cannot be
     * met, so abort the transfer rather than send something else. */
    if (r < 0 || h.type != HUTCH_MSG_FS_DATA || d->c.payload.len == 0) return HUTCH_STREAM_ERROR;
    hutch_buf_reset(&d->chunk);
    hutch_buf_append(&d->chunk, d->c.payload.data, d->c.payload.len);
    d->off = 0;
  }
  size_t n = d->chunk.len - d->off;
  if (n > max) n = max;
  if (n > d->size - d->sent) n = (size_t)(d->size - d->sent);
  memcpy(buf, d->chunk.data + d->off, n);
  d->off += n;
  d->sent += n;
  return (ssize_t)n;
}

static void download_free(void *cls) {
  struct download *d = cls;
  download_close_handle(d);
  hutch_shim_conn_close(&d->c);
  hutch_buf_free(&d->chunk);
  free(d);
}

void hutch_h_files_get(struct hutch_req *req, struct hutch_resp *resp) {
  const char *path = path_param(req, resp, "path");
  if (!path) return;
  struct download *d = xcalloc(1, sizeof *d);
  hutch_buf_init(&d->chunk);
  if (!hutch_api_open_shim(req, resp, &d->c, 120, NULL)) {
    free(d);
    return;
  }
  struct hutch_buf b;
  hutch_buf_init(&b);
  hutch_tlv_put_str(&b, HUTCH_TAG_PATH, path);
  hutch_tlv_put_u32(&b, HUTCH_TAG_FLAGS, HUTCH_FS_O_READ);
  if (!fs_call(&d->c, HUTCH_MSG_FS_OPEN, &b, resp)) {
    d->closed = true;
    download_free(d);
    return;
  }
  const unsigned char *v;
  uint32_t vl;
  uint32_t type = 0;
  if (hutch_tlv_find_u32(d->c.payload.data, d->c.payload.len, HUTCH_TAG_HANDLE, &d->handle) != 1 ||
      hutch_tlv_find(d->c.payload.data, d->c.payload.len, HUTCH_TAG_ENTRY, &v, &vl) != 1) {
    d->closed = true;
    download_free(d);
    hutch_api_errorf(resp, 500, "internal", "open `%s`: malformed answer", path);
    return;
  }
  const unsigned char *sv;
  uint32_t svl;
  if (hutch_tlv_find(v, vl, HUTCH_TAG_E_SIZE, &sv, &svl) == 1) hutch_tlv_u64(sv, svl, &d->size);
  hutch_tlv_find_u32(v, vl, HUTCH_TAG_E_TYPE, &type);
  if (type != 1) {
    download_free(d);
    hutch_api_errorf(resp, 409, "conflict", "`%s` is a %s, not a regular file", path, type_name(type));
    return;
  }
  resp->status = 200;
  resp->stream = (struct hutch_stream){
      .read = download_read, .free = download_free, .cls = d, .size = d->size, .content_type = "application/octet-stream"};
}

/* ---- upload: into a temporary file, renamed over the target at the end ------ */

struct upload {
  struct hutch_shim_conn c;
  uint32_t handle;
  char *path, *tmp;
  uint64_t size;
  bool open;
};

static void upload_abort(void *state) {
  struct upload *u = state;
  if (!u) return;
  hutch_err err = HUTCH_ERR_INIT;
  struct hutch_frame_hdr h;
  struct hutch_buf b;
  if (u->open) {
    hutch_buf_init(&b);
    hutch_tlv_put_u32(&b, HUTCH_TAG_HANDLE, u->handle);
    hutch_shim_conn_call(&u->c, HUTCH_MSG_FS_CLOSE, b.data, b.len, &h, &err);
    hutch_buf_free(&b);
  }
  if (u->tmp && u->c.fd >= 0) { /* leave nothing half-written behind */
    hutch_buf_init(&b);
    hutch_tlv_put_str(&b, HUTCH_TAG_PATH, u->tmp);
    hutch_tlv_put_u32(&b, HUTCH_TAG_FLAGS, 0);
    hutch_shim_conn_call(&u->c, HUTCH_MSG_FS_REMOVE, b.data, b.len, &h, &err);
    hutch_buf_free(&b);
  }
  hutch_shim_conn_close(&u->c);
  free(u->path);
  free(u->tmp);
  free(u);
}

static void *upload_begin(struct hutch_req *req, struct hutch_resp *resp) {
  const char *path = path_param(req, resp, "path");
  if (!path) return NULL;
  size_t plen = strlen(path);
  if (path[plen - 1] == '/') {
    hutch_api_errorf(resp, 400, "invalid_argument", "query `path`: `%s` names a directory", path);
    return NULL;
  }
  uint32_t mode = 0644;
  const char *m = hutch_api_query(req, "mode");
  if (m) {
    char *end;
    unsigned long v = strtoul(m, &end, 8);
    if (!*m || *end || v > 07777) {
      hutch_api_errorf(resp, 400, "invalid_argument", "query `mode`: expected an octal mode such as 0644");
      return NULL;
    }
    mode = (uint32_t)v;
  }
  struct upload *u = xcalloc(1, sizeof *u);
  if (!hutch_api_open_shim(req, resp, &u->c, 120, NULL)) {
    free(u);
    return NULL;
  }
  u->path = xstrdup(path);
  /* A sibling temporary name (resolved inside the sandbox like any path). */
  const char *slash = strrchr(path, '/');
  char rnd[64];
  hutch_random_id("tmp", rnd, sizeof rnd);
  u->tmp = slash ? xasprintf("%.*s/.hutch-upload-%s", (int)(slash - path), path, rnd)
                 : xasprintf(".hutch-upload-%s", rnd);
  if (slash == path) {
    free(u->tmp);
    u->tmp = xasprintf("/.hutch-upload-%s", rnd);
  }
  struct hutch_buf b;
  hutch_buf_init(&b);
  hutch_tlv_put_str(&b, HUTCH_TAG_PATH, u->tmp);
  hutch_tlv_put_u32(&b, HUTCH_TAG_FLAGS, HUTCH_FS_O_WRITE | (flag_param(req, "parents") ? HUTCH_FS_O_PARENTS : 0));
  hutch_tlv_put_u32(&b, HUTCH_TAG_MODE, mode);
  if (!fs_call(&u->c, HUTCH_MSG_FS_OPEN, &b, resp) ||
      hutch_tlv_find_u32(u->c.payload.data, u->c.payload.len, HUTCH_TAG_HANDLE, &u->handle) != 1) {
    if (!resp->status) hutch_api_errorf(resp, 500, "internal", "open `%s`: malformed answer", path);
    free(u->tmp);
    u->tmp = NULL;
    upload_abort(u);
    return NULL;
  }
  u->open = true;
  return u;
}

static int upload_data(void *state, const char *buf, size_t n, struct hutch_resp *resp) {
  struct upload *u = state;
  while (n > 0) {
    size_t k = n > CHUNK ? CHUNK : n;
    struct hutch_buf b;
    hutch_buf_init(&b);
    hutch_tlv_put_u32(&b, HUTCH_TAG_HANDLE, u->handle);
    hutch_tlv_put(&b, HUTCH_TAG_DATA, buf, (uint32_t)k);
    if (!fs_call(&u->c, HUTCH_MSG_FS_WRITE, &b, resp)) return -1;
    u->size += k;
    buf += k;
    n -= k;
  }
  return 0;
}

static void upload_end(void *state, struct hutch_req *req, struct hutch_resp *resp) {
  struct upload *u = state;
  struct hutch_buf b;
  hutch_buf_init(&b);
  hutch_tlv_put_u32(&b, HUTCH_TAG_HANDLE, u->handle);
  u->open = false;
  if (!fs_call(&u->c, HUTCH_MSG_FS_CLOSE, &b, resp)) {
    upload_abort(u);
    return;
  }
  hutch_buf_init(&b);
  hutch_tlv_put_str(&b, HUTCH_TAG_PATH, u->tmp);
  hutch_tlv_put_str(&b, HUTCH_TAG_PATH2, u->path);
  hutch_tlv_put_u32(&b, HUTCH_TAG_FLAGS, 1); /* replace an existing file */
  if (!fs_call(&u->c, HUTCH_MSG_FS_MOVE, &b, resp)) {
    upload_abort(u);
    return;
  }
  resp->status = 201;
  resp->json = json_pack("{s:s, s:I}", "path", u->path, "size", (json_int_t)u->size);
  free(u->tmp);
  u->tmp = NULL;
  upload_abort(u); /* nothing left to undo: just frees */
}

const struct hutch_upload_ops hutch_u_files_put = {upload_begin, upload_data, upload_end, upload_abort};

/* ---- tar: the sandbox's own tar, streamed ---------------------------------- */

static bool start_tar(const struct hutch_sandbox_rec *sb, struct hutch_resp *resp, struct hutch_shim_conn *c,
                      const char *dir, bool extract, uint32_t *spawn_id, char name[64]) {
  hutch_err err = HUTCH_ERR_INIT;
  char **envp = hutch_lc_command_env(sb, NULL);
  const char *create[] = {"tar", "-C", dir, "-cf", "-", ".", NULL};
  /* GNU tar refuses members with `..`, strips leading `/`, and replaces
   * symlinks to outside targets with placeholders until the end, so it never
   * writes through a link the archive itself made. */
  const char *xtract[] = {"tar", "-C", dir, "-xf", "-", "--no-same-owner", "--no-overwrite-dir", NULL};
  hutch_random_id("cmd", name, 64);
  struct hutch_buf b;
  hutch_buf_init(&b);
  hutch_spawn_encode(&b, extract ? xtract : create, (const char *const *)envp, "/", 0, 0, 0,
                     HUTCH_SPAWN_ATTACH | (extract ? HUTCH_SPAWN_STDIN : HUTCH_SPAWN_FLOW));
  hutch_tlv_put_str(&b, HUTCH_TAG_NAME, name);
  hutch_tlv_put_str(&b, HUTCH_TAG_TAG, extract ? "hutch:tar-extract" : "hutch:tar-create");
  hutch_envp_free(envp);
  *spawn_id = hutch_shim_conn_send(c, HUTCH_MSG_SPAWN, b.data, b.len, &err);
  hutch_buf_free(&b);
  if (!*spawn_id) {
    hutch_api_error(resp, &err);
    return false;
  }
  return true;
}

static bool require_dir(struct hutch_shim_conn *c, const char *dir, struct hutch_resp *resp) {
  struct hutch_buf b;
  hutch_buf_init(&b);
  hutch_tlv_put_str(&b, HUTCH_TAG_PATH, dir);
  if (!fs_call(c, HUTCH_MSG_FS_STAT, &b, resp)) return false;
  const unsigned char *v;
  uint32_t vl, type = 0;
  if (hutch_tlv_find(c->payload.data, c->payload.len, HUTCH_TAG_ENTRY, &v, &vl) == 1)
    hutch_tlv_find_u32(v, vl, HUTCH_TAG_E_TYPE, &type);
  if (type != 2) {
    hutch_api_errorf(resp, 409, "conflict", "`%s` is a %s, not a directory", dir, type_name(type));
    return false;
  }
  return true;
}

/* tar's exit code: 0 only for a clean exit (a signal or a failed start is 1). */
static int32_t tar_exit_status(uint16_t type, const struct hutch_buf *payload) {
  if (type != HUTCH_MSG_EXIT) return 1;
  struct hutch_exit e;
  hutch_exit_decode(payload->data, payload->len, &e);
  return e.signo ? 1 : e.exit_code;
}

struct tar_out {
  struct hutch_shim_conn c;
  uint32_t id;
  struct hutch_buf data;
  size_t off;
  bool done, failed;
  char stderr_tail[512];
};

static ssize_t tar_read(void *cls, uint64_t pos, char *buf, size_t max) {
  struct tar_out *t = cls;
  while (t->off >= t->data.len) {
    hutch_buf_reset(&t->data);
    t->off = 0;
    if (t->done) return t->failed ? HUTCH_STREAM_ERROR : HUTCH_STREAM_END;
    struct hutch_frame_hdr h;
    hutch_err err = HUTCH_ERR_INIT;
    if (hutch_shim_conn_read(&t->c, &h, &err) <= 0) return HUTCH_STREAM_ERROR;
    if (h.id != t->id) continue;
    if (h.type == HUTCH_MSG_STDOUT) {
      hutch_buf_append(&t->data, t->c.payload.data, t->c.payload.len);
    } else if (h.type == HUTCH_MSG_STDERR) {
      size_t n = t->c.payload.len < sizeof t->stderr_tail - 1 ? t->c.payload.len : sizeof t->stderr_tail - 1;
      memcpy(t->stderr_tail, t->c.payload.data + t->c.payload.len - n, n);
      t->stderr_tail[n] = 0;
    } else if (h.type == HUTCH_MSG_EXIT || h.type == HUTCH_MSG_ERROR) {
      t->done = true;
      t->failed = tar_exit_status(h.type, &t->c.payload) != 0;
      if (t->failed) hutch_log(LOG_WARN, "files.tar_failed", "stderr", t->stderr_tail, NULL);
    }
  }
  size_t n = t->data.len - t->off;
  if (n > max) n = max;
  memcpy(buf, t->data.data + t->off, n);
  t->off += n;
  return (ssize_t)n;
}

static void tar_free(void *cls) {
  struct tar_out *t = cls;
  hutch_shim_conn_close(&t->c); /* a FLOW command dies with its reader */
  hutch_buf_free(&t->data);
  free(t);
}

void hutch_h_files_tar_get(struct hutch_req *req, struct hutch_resp *resp) {
  const char *dir = path_param(req, resp, "path");
  if (!dir) return;
  struct tar_out *t = xcalloc(1, sizeof *t);
  hutch_buf_init(&t->data);
  char name[64];
  struct hutch_sandbox_rec sb;
  if (!hutch_api_open_shim(req, resp, &t->c, 120, &sb)) {
    free(t);
    return;
  }
  bool ok = require_dir(&t->c, dir, resp) && start_tar(&sb, resp, &t->c, dir, false, &t->id, name);
  hutch_sandbox_rec_free(&sb);
  if (!ok) {
    tar_free(t);
    return;
  }
  resp->status = 200;
  resp->stream = (struct hutch_stream){
      .read = tar_read, .free = tar_free, .cls = t, .size = HUTCH_SIZE_UNKNOWN, .content_type = "application/x-tar"};
}

struct tar_in {
  struct hutch_shim_conn c;
  uint32_t id;
  char name[64];
  bool exited;
  int32_t code;
  char stderr_tail[1024];
};

/* Read frames until the answer to `want` (or the tar's exit). */
static int tar_in_pump(struct tar_in *t, uint32_t want, hutch_err *err) {
  for (;;) {
    struct hutch_frame_hdr h;
    if (hutch_shim_conn_read(&t->c, &h, err) <= 0) return -1;
    if (h.id == t->id) {
      if (h.type == HUTCH_MSG_STDERR) {
        size_t have = strlen(t->stderr_tail), n = t->c.payload.len;
        if (have + n >= sizeof t->stderr_tail) n = sizeof t->stderr_tail - 1 - have;
        memcpy(t->stderr_tail + have, t->c.payload.data, n);
        t->stderr_tail[have + n] = 0;
      } else if (h.type == HUTCH_MSG_EXIT || h.type == HUTCH_MSG_ERROR) {
        t->code = tar_exit_status(h.type, &t->c.payload);
        t->exited = true;
        if (!want) return 0;
      }
      continue;
    }
    if (want && h.id == want) {
      if (h.type == HUTCH_MSG_ERROR) return hutch_shim_error(t->c.payload.data, t->c.payload.len, err);
      return 0;
    }
  }
}

static void tar_in_abort(void *state) {
  struct tar_in *t = state;
  if (!t) return;
  hutch_shim_conn_close(&t->c);
  free(t);
}

static void *tar_in_begin(struct hutch_req *req, struct hutch_resp *resp) {
  const char *dir = path_param(req, resp, "path");
  if (!dir) return NULL;
  struct tar_in *t = xcalloc(1, sizeof *t);
  struct hutch_sandbox_rec sb;
  if (!hutch_api_open_shim(req, resp, &t->c, 120, &sb)) {
    free(t);
    return NULL;
  }
  struct hutch_buf b;
  hutch_buf_init(&b);
  hutch_tlv_put_str(&b, HUTCH_TAG_PATH, dir);
  hutch_tlv_put_u32(&b, HUTCH_TAG_MODE, 0755);
  hutch_tlv_put_u32(&b, HUTCH_TAG_FLAGS, 1);
  if (!fs_call(&t->c, HUTCH_MSG_FS_MKDIR, &b, resp) || !require_dir(&t->c, dir, resp) ||
      !start_tar(&sb, resp, &t->c, dir, true, &t->id, t->name)) {
    hutch_sandbox_rec_free(&sb);
    tar_in_abort(t);
    return NULL;
  }
  hutch_sandbox_rec_free(&sb);
  return t;
}

static int tar_in_data(void *state, const char *buf, size_t n, struct hutch_resp *resp) {
  struct tar_in *t = state;
  while (n > 0 && !t->exited) {
    size_t k = n > (256u << 10) ? (256u << 10) : n;
    struct hutch_buf b;
    hutch_buf_init(&b);
    hutch_tlv_put_str(&b, HUTCH_TAG_NAME, t->name);
    hutch_tlv_put(&b, HUTCH_TAG_DATA, buf, (uint32_t)k);
    hutch_err err = HUTCH_ERR_INIT;
    uint32_t id = hutch_shim_conn_send(&t->c, HUTCH_MSG_STDIN, b.data, b.len, &err);
    hutch_buf_free(&b);
    if (!id || tar_in_pump(t, id, &err) < 0) {
      /* tar stopped reading (it may stop at the end-of-archive blocks,
       * before the record's padding): the shim can answer "finished"
       * before the exit frame is read.  Its exit says whether it worked. */
      hutch_err e2 = HUTCH_ERR_INIT;
      if (!t->exited && id && err.errnum == EPIPE) tar_in_pump(t, 0, &e2);
      if (t->exited) break;
      hutch_api_error(resp, &err);
      return -1;
    }
    buf += k;
    n -= k;
  }
  return 0;
}

static void tar_in_end(void *state, struct hutch_req *req, struct hutch_resp *resp) {
  struct tar_in *t = state;
  hutch_err err = HUTCH_ERR_INIT;
  if (!t->exited) {
    struct hutch_buf b;
    hutch_buf_init(&b);
    hutch_tlv_put_str(&b, HUTCH_TAG_NAME, t->name);
    uint32_t id = hutch_shim_conn_send(&t->c, HUTCH_MSG_STDIN_CLOSE, b.data, b.len, &err);
    hutch_buf_free(&b);
    if (!id || tar_in_pump(t, id, &err) < 0 || (!t->exited && tar_in_pump(t, 0, &err) < 0)) {
      hutch_err e2 = HUTCH_ERR_INIT;
      if (!t->exited && id && err.errnum == EPIPE) tar_in_pump(t, 0, &e2); /* as in tar_in_data */
      if (!t->exited) {
        hutch_api_error(resp, &err);
        tar_in_abort(t);
        return;
      }
    }
  }
  if (t->code != 0) {
    char *nl = strrchr(t->stderr_tail, '\n');
    if (nl && nl[1] == 0) *nl = 0;
    hutch_api_errorf(resp, 400, "invalid_argument", "the archive could not be extracted (tar exit %d): %s", t->code,
                     t->stderr_tail[0] ? t->stderr_tail : "no message");
  } else {
    resp->status = 200;
    resp->json = json_pack("{s:s}", "path", req->params[0] ? hutch_api_query(req, "path") : "");
  }
  tar_in_abort(t);
}

const struct hutch_upload_ops hutch_u_files_tar_put = {tar_in_begin, tar_in_data, tar_in_end, tar_in_abort};
