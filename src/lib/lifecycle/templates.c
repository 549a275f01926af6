/* Template builds as operations (POST /v1/templates), their progress, and
 * the templates every hutchd has (host, busybox). */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "lifecycle/ops.h"
#include "lifecycle/snapshots.h"
#include "store/template.h"

#define MAX_PACKAGES 200

static int ensure_row(struct hutch_ctx *ctx, const char *name, const char *source, hutch_err *err) {
  struct hutch_template_rec t;
  hutch_err e = HUTCH_ERR_INIT;
  if (hutch_db_template_get(ctx->db, name, &t, &e) == 0) {
    bool ready = !strcmp(t.state, "ready");
    hutch_template_rec_free(&t);
    if (ready) return 0;
  }
  if (hutch_db_template_begin(ctx->db, name, source, err) < 0) return -1;
  return hutch_db_template_finish(ctx->db, name, "ready", NULL, NULL, err);
}

int hutch_lc_templates_init(struct hutch_ctx *ctx, hutch_err *err) {
  hutch_db_template_fail_building(ctx->db, "hutchd restarted while the template was being built", err);
  if (hutch_template_ensure_host(&ctx->pool, err) < 0) return -1;
  if (ensure_row(ctx, "host", "{\"source\":\"host\"}", err) < 0) return -1;
  /* busybox is tiny: every hutchd has it when the host has busybox-static. */
  if (!hutch_template_exists(&ctx->pool, "busybox") &&
      (access("/bin/busybox", X_OK) == 0 || access("/usr/bin/busybox", X_OK) == 0)) {
    struct hutch_template_source src = {.kind = "busybox"};
    hutch_err e = HUTCH_ERR_INIT;
    if (hutch_template_build(&ctx->pool, "busybox", &src, NULL, NULL, NULL, &e) < 0)
      hutch_log(LOG_WARN, "template.busybox_failed", "reason", e.msg, NULL);
  }
  if (hutch_template_exists(&ctx->pool, "busybox") &&
      ensure_row(ctx, "busybox", "{\"source\":\"busybox\"}", err) < 0)
    return -1;
  /* Rows whose files are gone (a failed build's leftovers stay as `failed`). */
  struct hutch_template_rec *v = NULL;
  size_t n = 0;
  if (hutch_db_template_list(ctx->db, &v, &n, err) < 0) return -1;
  for (size_t i = 0; i < n; i++) {
    hutch_err e = HUTCH_ERR_INIT;
    if (!strcmp(v[i].state, "ready") && !hutch_template_exists(&ctx->pool, v[i].name))
      hutch_db_template_finish(ctx->db, v[i].name, "failed", NULL, "the template's files are missing", &e);
    hutch_template_rec_free(&v[i]);
  }
  free(v);
  return 0;
}

/* ---- accept -------------------------------------------------------------------- */

static bool valid_token(const char *s, size_t max, const char *extra) {
  size_t n = strlen(s);
  if (n == 0 || n > max || !isalnum((unsigned char)s[0])) return false;
  for (const char *p = s; *p; p++)
    if (!islower((unsigned char)*p) && !isdigit((unsigned char)*p) && !strchr(extra, *p)) return false;
  return true;
}

static int check_fields(json_t *body, const char *const *allowed, hutch_err *err) {
  const char *k;
  json_t *v;
  json_object_foreach(body, k, v) {
    bool ok = false;
    for (size_t i = 0; allowed[i]; i++)
      if (!strcmp(k, allowed[i])) ok = true;
    if (!ok) return hutch_err_invalid(err, "unknown field `%s`", k);
  }
  return 0;
}

/* The source as stored and handed to the build: validated, normalised. */
static json_t *normalise_source(struct hutch_ctx *ctx, json_t *body, hutch_err *err) {
  const char *source = json_string_value(json_object_get(body, "source"));
  if (!source && json_object_get(body, "from_snapshot")) source = "snapshot";
  if (!source) {
    hutch_err_invalid(err, "field `source`: required (host, busybox, debian, oci or snapshot)");
    return NULL;
  }
  json_t *o = json_pack("{s:s}", "source", source);
  if (!strcmp(source, "host") || !strcmp(source, "busybox")) {
    static const char *const allowed[] = {"name", "source", NULL};
    if (check_fields(body, allowed, err) < 0) goto bad;
  } else if (!strcmp(source, "debian")) {
    static const char *const allowed[] = {"name", "source", "suite", "mirror", "packages", NULL};
    if (check_fields(body, allowed, err) < 0) goto bad;
    json_t *suite = json_object_get(body, "suite");
    if (suite && (!json_is_string(suite) || !valid_token(json_string_value(suite), 32, "-"))) {
      hutch_err_invalid(err, "field `suite`: a Debian suite name such as bookworm");
      goto bad;
    }
    json_object_set_new(o, "suite", json_string(suite ? json_string_value(suite) : "bookworm"));
    json_t *mirror = json_object_get(body, "mirror");
    if (mirror) {
      const char *m = json_string_value(mirror);
      if (!m || (strncmp(m, "http://", 7) && strncmp(m, "https://", 8)) || strlen(m) > 512 || strpbrk(m, " \t\n'\"")) {
        hutch_err_invalid(err, "field `mirror`: an http:// or https:// URL");
        goto bad;
      }
      json_object_set(o, "mirror", mirror);
    }
    json_t *pk = json_object_get(body, "packages");
    json_t *pkgs = json_array();
    json_object_set_new(o, "packages", pkgs);
    if (pk) {
      if (!json_is_array(pk) || json_array_size(pk) > MAX_PACKAGES) {
        hutch_err_invalid(err, "field `packages`: an array of at most %d package names", MAX_PACKAGES);
        goto bad;
      }
      size_t i;
      json_t *p;
      json_array_foreach(pk, i, p) {
        if (!json_is_string(p) || !valid_token(json_string_value(p), 128, "+-.")) {
          hutch_err_invalid(err, "field `packages[%zu]`: not a Debian package name", i);
          goto bad;
        }
        json_array_append(pkgs, p);
      }
    }
  } else if (!strcmp(source, "oci")) {
    static const char *const allowed[] = {"name", "source", "path", "image", NULL};
    if (check_fields(body, allowed, err) < 0) goto bad;
    const char *path = json_string_value(json_object_get(body, "path"));
    struct stat st;
    if (!path || path[0] != '/' || strlen(path) > 4096) {
      hutch_err_invalid(err, "field `path`: the absolute path of an OCI image archive or layout on the host");
      goto bad;
    }
    if (stat(path, &st) < 0 || !(S_ISREG(st.st_mode) || S_ISDIR(st.st_mode))) {
      hutch_err_invalid(err, "field `path`: `%s` is not a file or directory on the host", path);
      goto bad;
    }
    json_object_set_new(o, "path", json_string(path));
    json_t *img = json_object_get(body, "image");
    if (img && !json_is_string(img)) {
      hutch_err_invalid(err, "field `image`: a string (a name or tag in the archive)");
      goto bad;
    }
    if (img) json_object_set(o, "image", img);
  } else if (!strcmp(source, "snapshot")) {
    static const char *const allowed[] = {"name", "source", "snapshot", "from_snapshot", NULL};
    if (check_fields(body, allowed, err) < 0) goto bad;
    json_t *sn = json_object_get(body, "snapshot");
    if (!sn) sn = json_object_get(body, "from_snapshot");
    if (!json_is_string(sn)) {
      hutch_err_invalid(err, "field `snapshot`: the id of a snapshot");
      goto bad;
    }
    if (ctx->pool.kind != HUTCH_POOL_BTRFS) {
      hutch_err_set(err, 501, "not_supported", "templates from snapshots need the btrfs storage backend (%s)",
                    ctx->pool.why_overlay);
      goto bad;
    }
    struct hutch_snapshot_rec s;
    if (hutch_db_snapshot_get(ctx->db, json_string_value(sn), &s, err) < 0) goto bad;
    bool ready = !strcmp(s.state, "ready");
    hutch_snapshot_rec_free(&s);
    if (!ready) {
      hutch_err_set(err, 409, "conflict", "snapshot `%s` is not ready", json_string_value(sn));
      goto bad;
    }
    json_object_set(o, "snapshot", sn);
  } else {
    hutch_err_invalid(err, "field `source`: unknown source `%s` (host, busybox, debian, oci or snapshot)", source);
    goto bad;
  }
  return o;
bad:
  json_decref(o);
  return NULL;
}

int hutch_lc_template_create(struct hutch_ctx *ctx, json_t *body, char name[64], char op_id[64], hutch_err *err) {
  if (!json_is_object(body)) return hutch_err_invalid(err, "body: a JSON object");
  const char *n = json_string_value(json_object_get(body, "name"));
  if (!n) return hutch_err_invalid(err, "field `name`: required");
  if (!hutch_template_valid_name(n))
    return hutch_err_invalid(err, "field `name`: `%.64s` is not a template name (1-63 of a-z 0-9 . _ -)", n);
  json_t *src = normalise_source(ctx, body, err);
  if (!src) return -1;
  json_object_set_new(src, "name", json_string(n));
  cleanup_free char *source = json_dumps(src, JSON_COMPACT | JSON_SORT_KEYS);
  json_decref(src);
  if (ctx->pool.kind == HUTCH_POOL_OVERLAY && hutch_template_exists(&ctx->pool, n)) {
    /* Overlay sandboxes read their template live: it cannot change under them. */
    struct hutch_sandbox_rec *v = NULL;
    size_t cnt = 0, users = 0;
    if (hutch_db_sandbox_list(ctx->db, NULL, &v, &cnt, err) < 0) return -1;
    for (size_t i = 0; i < cnt; i++) {
      if (!strcmp(v[i].template_name, n)) users++;
      hutch_sandbox_rec_free(&v[i]);
    }
    free(v);
    if (users)
      return hutch_err_set(err, 409, "conflict", "template `%s` is used by %zu sandbox(es) (overlay storage)", n,
                           users);
  }
  if (hutch_db_template_begin(ctx->db, n, source, err) < 0) return -1;
  cleanup_free char *key = xasprintf("template:%s", n);
  if (hutch_lc_queue(ctx, "template", key, source, op_id, err) < 0) {
    hutch_err e2 = HUTCH_ERR_INIT;
    hutch_db_template_finish(ctx->db, n, "failed", NULL, err->msg, &e2);
    return -1;
  }
  snprintf(name, 64, "%s", n);
  return 0;
}

int hutch_lc_template_delete(struct hutch_ctx *ctx, const char *name, hutch_err *err) {
  struct hutch_template_rec t;
  if (hutch_db_template_get(ctx->db, name, &t, err) < 0) return -1;
  bool building = !strcmp(t.state, "building");
  hutch_template_rec_free(&t);
  if (building) return hutch_err_set(err, 409, "conflict", "template `%s` is being built", name);
  if (!strcmp(name, ctx->cfg.pool_template) && ctx->cfg.pool_size)
    return hutch_err_set(err, 409, "conflict", "template `%s` is the warm pool's template", name);
  if (ctx->pool.kind == HUTCH_POOL_OVERLAY) {
    struct hutch_sandbox_rec *v = NULL;
    size_t cnt = 0, users = 0;
    if (hutch_db_sandbox_list(ctx->db, NULL, &v, &cnt, err) < 0) return -1;
    for (size_t i = 0; i < cnt; i++) {
      if (!strcmp(v[i].template_name, name)) users++;
      hutch_sandbox_rec_free(&v[i]);
    }
    free(v);
    if (users)
      return hutch_err_set(err, 409, "conflict", "template `%s` is used by %zu sandbox(es) (overlay storage)", name,
                           users);
  }
  hutch_err e2 = HUTCH_ERR_INIT;
  if (hutch_template_remove(&ctx->pool, name, &e2) < 0 && e2.status != 404) {
    *err = e2;
    return -1;
  }
  return hutch_db_template_delete(ctx->db, name, err);
}

/* ---- build --------------------------------------------------------------------- */

struct progress {
  struct hutch_ctx *ctx;
  const char *name;
  uint64_t last_us;
  double last_fraction;
};

static void on_progress(void *arg, const char *msg, double fraction) {
  struct progress *p = arg;
  uint64_t now = mono_us();
  /* At most ~5 writes a second: progress is for people watching. */
  if (now - p->last_us < 200000 && fraction - p->last_fraction < 0.05) return;
  p->last_us = now;
  p->last_fraction = fraction;
  hutch_err e = HUTCH_ERR_INIT;
  hutch_db_template_progress(p->ctx->db, p->name, msg, fraction, &e);
}

int hutch_ops_template_build(struct hutch_ctx *ctx, const char *key, const char *source_json, hutch_err *err) {
  json_error_t je;
  json_t *src = json_loads(source_json ? source_json : "", 0, &je);
  const char *name = json_string_value(json_object_get(src, "name"));
  if (!src || !name) {
    json_decref(src);
    return hutch_err_sys(err, EINVAL, "operation on `%s` has no template source", key);
  }
  struct hutch_template_source ts = {.kind = json_string_value(json_object_get(src, "source"))};
  ts.suite = json_string_value(json_object_get(src, "suite"));
  ts.mirror = json_string_value(json_object_get(src, "mirror"));
  json_t *pk = json_object_get(src, "packages");
  const char **pkgs = xcalloc(json_array_size(pk) + 1, sizeof *pkgs);
  for (size_t i = 0; i < json_array_size(pk); i++) pkgs[i] = json_string_value(json_array_get(pk, i));
  ts.packages = pkgs;
  ts.npackages = json_array_size(pk);
  ts.path = json_string_value(json_object_get(src, "path"));
  ts.ref = json_string_value(json_object_get(src, "image"));
  cleanup_free char *snap_path = NULL;
  const char *snap = json_string_value(json_object_get(src, "snapshot"));
  if (snap) ts.snapshot_path = snap_path = hutch_pool_path(&ctx->pool, "snapshots", snap);
  struct progress pr = {.ctx = ctx, .name = name};
  char *config = NULL;
  uint64_t t0 = mono_us();
  hutch_log(LOG_INFO, "template.build_started", "name", name, "source", ts.kind, NULL);
  int rc = hutch_template_build(&ctx->pool, name, &ts, on_progress, &pr, &config, err);
  hutch_err e2 = HUTCH_ERR_INIT;
  if (rc == 0) {
    hutch_db_template_progress(ctx->db, name, "ready", 1.0, &e2);
    rc = hutch_db_template_finish(ctx->db, name, "ready", config ? config : "{}", NULL, err);
    char ms[32];
    snprintf(ms, sizeof ms, "%.1f", (double)(mono_us() - t0) / 1000.0);
    hutch_log(LOG_INFO, "template.built", "name", name, "dur_ms", ms, NULL);
  } else if (hutch_template_exists(&ctx->pool, name)) {
    /* A failed rebuild leaves the previous build in place. */
    cleanup_free char *msg = xasprintf("the last rebuild failed (the previous build is kept): %s", err->msg);
    hutch_db_template_finish(ctx->db, name, "ready", NULL, msg, &e2);
  } else {
    hutch_db_template_finish(ctx->db, name, "failed", NULL, err->msg, &e2);
  }
  free(config);
  free(pkgs);
  json_decref(src);
  return rc;
}
