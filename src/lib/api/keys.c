#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "api/json.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/util.h"

void hutch_h_key_create(struct hutch_req *req, struct hutch_resp *resp) {
  hutch_err err = HUTCH_ERR_INIT;
  json_t *body = hutch_api_body_object(req, &err);
  const char *name = "";
  static const char *const allowed[] = {"name", NULL};
  if (!body || hutch_json_only(body, "", allowed, &err) < 0 || hutch_json_string(body, "", "name", 120, &name, &err) < 0) {
    hutch_api_error(resp, &err);
    json_decref(body);
    return;
  }
  unsigned char raw[32];
  char hex[65], key[80], hash[65], id[64];
  if (hutch_random_bytes(raw, sizeof raw) < 0) {
    hutch_api_errorf(resp, 500, "internal", "getrandom failed");
    json_decref(body);
    return;
  }
  hex_encode(raw, sizeof raw, hex);
  snprintf(key, sizeof key, "hutch_%s", hex);
  hutch_sha256_hex(key, strlen(key), hash);
  hutch_random_id("key", id, sizeof id);
  if (hutch_db_key_insert(req->ctx->db, id, name, hash, &err) < 0) {
    hutch_api_error(resp, &err);
    json_decref(body);
    return;
  }
  char ts[32];
  iso8601(now_ms(), ts);
  hutch_log(LOG_INFO, "key.created", "id", id, "name", name, NULL);
  resp->status = 201;
  resp->json = json_pack("{s:s, s:s, s:s, s:s}", "id", id, "name", name, "key", key, "created_at", ts);
  json_decref(body);
}

void hutch_h_key_list(struct hutch_req *req, struct hutch_resp *resp) {
  hutch_err err = HUTCH_ERR_INIT;
  struct hutch_key_rec *v;
  size_t n;
  if (hutch_db_key_list(req->ctx->db, &v, &n, &err) < 0) {
    hutch_api_error(resp, &err);
    return;
  }
  json_t *a = json_array();
  for (size_t i = 0; i < n; i++) {
    char ts[32];
    iso8601(v[i].created_at, ts);
    json_array_append_new(a, json_pack("{s:s, s:s, s:s}", "id", v[i].id, "name", v[i].name, "created_at", ts));
  }
  free(v);
  resp->status = 200;
  resp->json = json_pack("{s:o}", "keys", a);
}

void hutch_h_key_delete(struct hutch_req *req, struct hutch_resp *resp) {
  hutch_err err = HUTCH_ERR_INIT;
  if (hutch_db_key_delete(req->ctx->db, req->params[0], &err) < 0) {
    if (err.status == 404) snprintf(err.msg, sizeof err.msg, "key `%.200s` not found", req->params[0]);
    hutch_api_error(resp, &err);
    return;
  }
  hutch_log(LOG_INFO, "key.deleted", "id", req->params[0], NULL);
  resp->status = 204;
}
