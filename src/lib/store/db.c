#include "store/db.h"

#include <errno.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

struct hutch_db {
  sqlite3 *h;
  pthread_mutex_t mu;
};

/* Migration i brings the schema from version i to i+1.  Never edit a
 * released entry; append a new one. */
static const char *const migrations[] = {
    "CREATE TABLE sandboxes ("
    "  id TEXT PRIMARY KEY,"
    "  state TEXT NOT NULL,"
    "  template TEXT NOT NULL,"
    "  runtime TEXT NOT NULL,"
    "  request TEXT NOT NULL,"
    "  error TEXT,"
    "  uid_slot INTEGER NOT NULL DEFAULT -1,"
    "  shim_pid INTEGER NOT NULL DEFAULT 0,"
    "  init_pid INTEGER NOT NULL DEFAULT 0,"
    "  created_at INTEGER NOT NULL,"
    "  updated_at INTEGER NOT NULL,"
    "  expires_at INTEGER NOT NULL DEFAULT 0);"
    "CREATE INDEX sandboxes_state ON sandboxes(state);"
    "CREATE TABLE operations ("
    "  id TEXT PRIMARY KEY,"
    "  kind TEXT NOT NULL,"
    "  sandbox_id TEXT NOT NULL,"
    "  state TEXT NOT NULL,"
    "  err_status INTEGER NOT NULL DEFAULT 0,"
    "  err_code TEXT,"
    "  err_msg TEXT,"
    "  created_at INTEGER NOT NULL,"
    "  started_at INTEGER NOT NULL DEFAULT 0,"
    "  finished_at INTEGER NOT NULL DEFAULT 0);"
    "CREATE INDEX operations_sandbox ON operations(sandbox_id);"
    "CREATE TABLE api_keys ("
    "  id TEXT PRIMARY KEY,"
    "  name TEXT NOT NULL,"
    "  hash TEXT NOT NULL UNIQUE,"
    "  created_at INTEGER NOT NULL);",
    /* 2: warm pool.  origin 'pool' marks sandboxes made ahead of demand. */
    "ALTER TABLE sandboxes ADD COLUMN origin TEXT NOT NULL DEFAULT 'api';",
    /* 3: storage.  An operation's argument (the snapshot of a rollback, the
     * template of a build); templates with their build state; snapshots. */
    "ALTER TABLE operations ADD COLUMN arg TEXT;"
    "CREATE TABLE templates ("
    "  name TEXT PRIMARY KEY,"
    "  state TEXT NOT NULL,"
    "  source TEXT NOT NULL,"
    "  config TEXT NOT NULL DEFAULT '{}',"
    "  progress TEXT,"
    "  fraction REAL NOT NULL DEFAULT 0,"
    "  error TEXT,"
    "  created_at INTEGER NOT NULL,"
    "  updated_at INTEGER NOT NULL);"
    "CREATE TABLE snapshots ("
    "  id TEXT PRIMARY KEY,"
    "  sandbox_id TEXT NOT NULL,"
    "  parent_id TEXT,"
    "  template TEXT NOT NULL,"
    "  kind TEXT NOT NULL,"
    "  state TEXT NOT NULL,"
    "  labels TEXT NOT NULL DEFAULT '{}',"
    "  request TEXT NOT NULL,"
    "  generation INTEGER NOT NULL DEFAULT 0,"
    "  created_at INTEGER NOT NULL);"
    "CREATE INDEX snapshots_sandbox ON snapshots(sandbox_id, created_at);",
};
#define N_MIGRATIONS (sizeof migrations / sizeof *migrations)

static int db_fail(struct hutch_db *db, hutch_err *err, const char *what) {
  return hutch_err_sys(err, 0, "sqlite %s: %s", what, sqlite3_errmsg(db->h));
}

static int exec_sql(struct hutch_db *db, const char *sql, hutch_err *err) {
  char *msg = NULL;
  if (sqlite3_exec(db->h, sql, NULL, NULL, &msg) != SQLITE_OK) {
    hutch_err_sys(err, 0, "sqlite: %s", msg ? msg : "error");
    sqlite3_free(msg);
    return -1;
  }
  return 0;
}

static int user_version(struct hutch_db *db) {
  sqlite3_stmt *st;
  int v = -1;
  if (sqlite3_prepare_v2(db->h, "PRAGMA user_version", -1, &st, NULL) != SQLITE_OK) return -1;
  if (sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_int(st, 0);
  sqlite3_finalize(st);
  return v;
}

int hutch_db_schema_version(struct hutch_db *db) {
  pthread_mutex_lock(&db->mu);
  int v = user_version(db);
  pthread_mutex_unlock(&db->mu);
  return v;
}

static int migrate(struct hutch_db *db, hutch_err *err) {
  int v = user_version(db);
  if (v < 0) return db_fail(db, err, "read schema version");
  if ((size_t)v > N_MIGRATIONS)
    return hutch_err_sys(err, 0, "database schema version %d is newer than this hutchd (%zu)", v, N_MIGRATIONS);
  for (size_t i = (size_t)v; i < N_MIGRATIONS; i++) {
    char pragma[64];
    snprintf(pragma, sizeof pragma, "PRAGMA user_version=%zu;", i + 1);
    if (exec_sql(db, "BEGIN IMMEDIATE;", err) < 0) return -1;
    if (exec_sql(db, migrations[i], err) < 0 || exec_sql(db, pragma, err) < 0) {
      hutch_err e2 = HUTCH_ERR_INIT;
      exec_sql(db, "ROLLBACK;", &e2);
      return hutch_err_wrap(err, "migration %zu", i + 1);
    }
    if (exec_sql(db, "COMMIT;", err) < 0) return -1;
  }
  return 0;
}

int hutch_db_open(const char *path, struct hutch_db **out, hutch_err *err) {
  struct hutch_db *db = xcalloc(1, sizeof *db);
  pthread_mutex_init(&db->mu, NULL);
  if (sqlite3_open_v2(path, &db->h,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX | SQLITE_OPEN_EXRESCODE,
                      NULL) != SQLITE_OK) {
    hutch_err_sys(err, 0, "open database `%s`: %s", path, db->h ? sqlite3_errmsg(db->h) : "out of memory");
    hutch_db_close(db);
    return -1;
  }
  sqlite3_busy_timeout(db->h, 5000);
  /* WAL: readers never block the writer; NORMAL sync is durable across a
   * hutchd crash (the WAL is fsync'd at checkpoints, not every commit). */
  if (exec_sql(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;", err) < 0 ||
      migrate(db, err) < 0) {
    hutch_err_wrap(err, "database `%s`", path);
    hutch_db_close(db);
    return -1;
  }
  *out = db;
  return 0;
}

void hutch_db_close(struct hutch_db *db) {
  if (!db) return;
  if (db->h) sqlite3_close(db->h);
  pthread_mutex_destroy(&db->mu);
  free(db);
}

static void copy_col(char *dst, size_t n, sqlite3_stmt *st, int col) {
  const unsigned char *s = sqlite3_column_text(st, col);
  snprintf(dst, n, "%s", s ? (const char *)s : "");
}

static char *dup_col(sqlite3_stmt *st, int col) {
  const unsigned char *s = sqlite3_column_text(st, col);
  return s ? xstrdup((const char *)s) : NULL;
}

void hutch_sandbox_rec_free(struct hutch_sandbox_rec *r) {
  free(r->request);
  free(r->error);
  r->request = r->error = NULL;
}

#define SANDBOX_COLS \
  "id, state, template, runtime, request, error, uid_slot, shim_pid, init_pid, created_at, updated_at, expires_at, " \
  "origin"

static void read_sandbox(sqlite3_stmt *st, struct hutch_sandbox_rec *r) {
  memset(r, 0, sizeof *r);
  copy_col(r->id, sizeof r->id, st, 0);
  copy_col(r->state, sizeof r->state, st, 1);
  copy_col(r->template_name, sizeof r->template_name, st, 2);
  copy_col(r->runtime, sizeof r->runtime, st, 3);
  r->request = dup_col(st, 4);
  r->error = dup_col(st, 5);
  r->uid_slot = sqlite3_column_int64(st, 6);
  r->shim_pid = sqlite3_column_int64(st, 7);
  r->init_pid = sqlite3_column_int64(st, 8);
  r->created_at = (uint64_t)sqlite3_column_int64(st, 9);
  r->updated_at = (uint64_t)sqlite3_column_int64(st, 10);
  r->expires_at = (uint64_t)sqlite3_column_int64(st, 11);
  copy_col(r->origin, sizeof r->origin, st, 12);
}

/* Prepare under the lock; on failure unlock and fill err. */
static sqlite3_stmt *prep(struct hutch_db *db, const char *sql, hutch_err *err) {
  sqlite3_stmt *st = NULL;
  pthread_mutex_lock(&db->mu);
  if (sqlite3_prepare_v2(db->h, sql, -1, &st, NULL) != SQLITE_OK) {
    db_fail(db, err, "prepare");
    pthread_mutex_unlock(&db->mu);
    return NULL;
  }
  return st;
}

/* Step a statement that returns no rows, finalize it and unlock. */
static int step_done(struct hutch_db *db, sqlite3_stmt *st, hutch_err *err, const char *what) {
  int rc = sqlite3_step(st);
  int ret = 0;
  if (rc != SQLITE_DONE) ret = db_fail(db, err, what);
  sqlite3_finalize(st);
  pthread_mutex_unlock(&db->mu);
  return ret;
}

static void bind_text(sqlite3_stmt *st, int i, const char *s) {
  if (s) sqlite3_bind_text(st, i, s, -1, SQLITE_TRANSIENT);
  else sqlite3_bind_null(st, i);
}

int hutch_db_sandbox_insert(struct hutch_db *db, const struct hutch_sandbox_rec *r, hutch_err *err) {
  sqlite3_stmt *st = prep(db, "INSERT INTO sandboxes (" SANDBOX_COLS ") VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", err);
  if (!st) return -1;
  bind_text(st, 1, r->id);
  bind_text(st, 2, r->state);
  bind_text(st, 3, r->template_name);
  bind_text(st, 4, r->runtime);
  bind_text(st, 5, r->request ? r->request : "{}");
  bind_text(st, 6, r->error);
  sqlite3_bind_int64(st, 7, r->uid_slot);
  sqlite3_bind_int64(st, 8, r->shim_pid);
  sqlite3_bind_int64(st, 9, r->init_pid);
  sqlite3_bind_int64(st, 10, (sqlite3_int64)r->created_at);
  sqlite3_bind_int64(st, 11, (sqlite3_int64)r->updated_at);
  sqlite3_bind_int64(st, 12, (sqlite3_int64)r->expires_at);
  bind_text(st, 13, r->origin[0] ? r->origin : "api");
  return step_done(db, st, err, "insert sandbox");
}

int hutch_db_sandbox_get(struct hutch_db *db, const char *id, struct hutch_sandbox_rec *out, hutch_err *err) {
  sqlite3_stmt *st = prep(db, "SELECT " SANDBOX_COLS " FROM sandboxes WHERE id=?", err);
  if (!st) return -1;
  bind_text(st, 1, id);
  int rc = sqlite3_step(st), ret = 0;
  if (rc == SQLITE_ROW) read_sandbox(st, out);
  else if (rc == SQLITE_DONE) ret = hutch_err_set(err, 404, "not_found", "sandbox `%s` not found", id);
  else ret = db_fail(db, err, "get sandbox");
  sqlite3_finalize(st);
  pthread_mutex_unlock(&db->mu);
  return ret;
}

int hutch_db_sandbox_list(struct hutch_db *db, const char *state, struct hutch_sandbox_rec **out, size_t *n,
                          hutch_err *err) {
  sqlite3_stmt *st = prep(db,
                          state ? "SELECT " SANDBOX_COLS " FROM sandboxes WHERE state=? ORDER BY created_at, id"
                                : "SELECT " SANDBOX_COLS " FROM sandboxes ORDER BY created_at, id",
                          err);
  if (!st) return -1;
  if (state) bind_text(st, 1, state);
  size_t cap = 16, len = 0;
  struct hutch_sandbox_rec *v = xcalloc(cap, sizeof *v);
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    if (len == cap) v = xrealloc(v, (cap *= 2) * sizeof *v);
    read_sandbox(st, &v[len++]);
  }
  int ret = 0;
  if (rc != SQLITE_DONE) {
    ret = db_fail(db, err, "list sandboxes");
    for (size_t i = 0; i < len; i++) hutch_sandbox_rec_free(&v[i]);
    free(v);
    v = NULL;
    len = 0;
  }
  sqlite3_finalize(st);
  pthread_mutex_unlock(&db->mu);
  *out = v;
  *n = len;
  return ret;
}

static int changed_or_404(struct hutch_db *db, sqlite3_stmt *st, const char *id, hutch_err *err, const char *what) {
  int rc = sqlite3_step(st), ret = 0;
  if (rc != SQLITE_DONE) ret = db_fail(db, err, what);
  else if (sqlite3_changes(db->h) == 0) ret = hutch_err_set(err, 404, "not_found", "`%s` not found", id);
  sqlite3_finalize(st);
  pthread_mutex_unlock(&db->mu);
  return ret;
}

int hutch_db_sandbox_set_state(struct hutch_db *db, const char *id, const char *state, const char *error,
                               hutch_err *err) {
  sqlite3_stmt *st = prep(db, "UPDATE sandboxes SET state=?, error=?, updated_at=? WHERE id=?", err);
  if (!st) return -1;
  bind_text(st, 1, state);
  bind_text(st, 2, error);
  sqlite3_bind_int64(st, 3, (sqlite3_int64)now_ms());
  bind_text(st, 4, id);
  return changed_or_404(db, st, id, err, "update sandbox state");
}

int hutch_db_sandbox_set_host(struct hutch_db *db, const char *id, int64_t uid_slot, int64_t shim_pid,
                              int64_t init_pid, hutch_err *err) {
  sqlite3_stmt *st =
      prep(db, "UPDATE sandboxes SET uid_slot=?, shim_pid=?, init_pid=?, updated_at=? WHERE id=?", err);
  if (!st) return -1;
  sqlite3_bind_int64(st, 1, uid_slot);
  sqlite3_bind_int64(st, 2, shim_pid);
  sqlite3_bind_int64(st, 3, init_pid);
  sqlite3_bind_int64(st, 4, (sqlite3_int64)now_ms());
  bind_text(st, 5, id);
  return changed_or_404(db, st, id, err, "update sandbox host");
}

int hutch_db_sandbox_delete(struct hutch_db *db, const char *id, hutch_err *err) {
  sqlite3_stmt *st = prep(db, "DELETE FROM sandboxes WHERE id=?", err);
  if (!st) return -1;
  bind_text(st, 1, id);
  return step_done(db, st, err, "delete sandbox");
}

int hutch_db_sandbox_set_snapshot_policy(struct hutch_db *db, const char *id, const char *policy_json,
                                         hutch_err *err) {
  sqlite3_stmt *st = prep(db,
                          "UPDATE sandboxes SET request=json_set(request, '$.snapshots', json(?)), updated_at=? "
                          "WHERE id=?",
                          err);
  if (!st) return -1;
  bind_text(st, 1, policy_json);
  sqlite3_bind_int64(st, 2, (sqlite3_int64)now_ms());
  bind_text(st, 3, id);
  return changed_or_404(db, st, id, err, "set snapshot policy");
}

int hutch_db_sandbox_set_field(struct hutch_db *db, const char *id, const char *field, const char *json_value,
                               hutch_err *err) {
  /* `field` comes from hutch's code, never from a request. */
  cleanup_free char *sql =
      json_value ? xasprintf("UPDATE sandboxes SET request=json_set(request, '$.%s', json(?)), updated_at=? WHERE id=?",
                             field)
                 : xasprintf("UPDATE sandboxes SET request=json_remove(request, '$.%s'), updated_at=? WHERE id=?",
                             field);
  sqlite3_stmt *st = prep(db, sql, err);
  if (!st) return -1;
  int i = 1;
  if (json_value) bind_text(st, i++, json_value);
  sqlite3_bind_int64(st, i++, (sqlite3_int64)now_ms());
  bind_text(st, i, id);
  return changed_or_404(db, st, id, err, "update sandbox request");
}

int hutch_db_sandbox_set_expiry(struct hutch_db *db, const char *id, uint64_t expires_at, int64_t timeout_s,
                                hutch_err *err) {
  sqlite3_stmt *st = prep(db,
                          "UPDATE sandboxes SET expires_at=?, request=json_set(request, '$.timeout_s', ?), "
                          "updated_at=? WHERE id=? AND state='running'",
                          err);
  if (!st) return -1;
  sqlite3_bind_int64(st, 1, (sqlite3_int64)expires_at);
  sqlite3_bind_int64(st, 2, timeout_s);
  sqlite3_bind_int64(st, 3, (sqlite3_int64)now_ms());
  bind_text(st, 4, id);
  int rc = sqlite3_step(st), ret = 0;
  if (rc != SQLITE_DONE) ret = db_fail(db, err, "set sandbox expiry");
  else if (sqlite3_changes(db->h) == 0) ret = 1;
  sqlite3_finalize(st);
  pthread_mutex_unlock(&db->mu);
  return ret;
}

int hutch_db_sandbox_clear_expiry(struct hutch_db *db, const char *id, hutch_err *err) {
  sqlite3_stmt *st = prep(db, "UPDATE sandboxes SET expires_at=0, updated_at=? WHERE id=?", err);
  if (!st) return -1;
  sqlite3_bind_int64(st, 1, (sqlite3_int64)now_ms());
  bind_text(st, 2, id);
  return step_done(db, st, err, "clear sandbox expiry");
}

int hutch_db_pool_claim(struct hutch_db *db, const char *template_name, const char *request, uint64_t now,
                        uint64_t expires_at, char id_out[64], hutch_err *err) {
  /* One statement, so two concurrent claims can never take the same row. */
  sqlite3_stmt *st = prep(db,
                          "UPDATE sandboxes SET state='running', request=?, created_at=?, updated_at=?, expires_at=? "
                          "WHERE id=(SELECT id FROM sandboxes WHERE state='pool' AND origin='pool' AND template=? "
                          "ORDER BY created_at LIMIT 1) RETURNING id",
                          err);
  if (!st) return -1;
  bind_text(st, 1, request);
  sqlite3_bind_int64(st, 2, (sqlite3_int64)now);
  sqlite3_bind_int64(st, 3, (sqlite3_int64)now);
  sqlite3_bind_int64(st, 4, (sqlite3_int64)expires_at);
  bind_text(st, 5, template_name);
  int rc = sqlite3_step(st), ret = 0;
  if (rc == SQLITE_ROW) copy_col(id_out, 64, st, 0);
  else if (rc == SQLITE_DONE) ret = 1;
  else ret = db_fail(db, err, "claim pool sandbox");
  sqlite3_finalize(st);
  pthread_mutex_unlock(&db->mu);
  return ret;
}

int64_t hutch_db_pool_count(struct hutch_db *db, const char *template_name) {
  hutch_err err = HUTCH_ERR_INIT;
  sqlite3_stmt *st = prep(db,
                          "SELECT count(*) FROM sandboxes WHERE origin='pool' AND template=? AND "
                          "state IN ('accepted','creating','pool')",
                          &err);
  if (!st) return -1;
  bind_text(st, 1, template_name);
  int64_t n = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
  sqlite3_finalize(st);
  pthread_mutex_unlock(&db->mu);
  return n;
}

int64_t hutch_db_sandbox_count(struct hutch_db *db) {
  hutch_err err = HUTCH_ERR_INIT;
  sqlite3_stmt *st = prep(db, "SELECT count(*) FROM sandboxes", &err);
  if (!st) return -1;
  int64_t n = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
  sqlite3_finalize(st);
  pthread_mutex_unlock(&db->mu);
  return n;
}

void hutch_op_rec_free(struct hutch_op_rec *r) {
  free(r->err_msg);
  free(r->arg);
  r->err_msg = r->arg = NULL;
}

int hutch_db_op_insert(struct hutch_db *db, const struct hutch_op_rec *r, hutch_err *err) {
  sqlite3_stmt *st =
      prep(db, "INSERT INTO operations (id, kind, sandbox_id, state, created_at, arg) VALUES (?,?,?,?,?,?)", err);
  if (!st) return -1;
  bind_text(st, 1, r->id);
  bind_text(st, 2, r->kind);
  bind_text(st, 3, r->sandbox_id);
  bind_text(st, 4, r->state);
  sqlite3_bind_int64(st, 5, (sqlite3_int64)r->created_at);
  bind_text(st, 6, r->arg);
  return step_done(db, st, err, "insert operation");
}

int hutch_db_op_get(struct hutch_db *db, const char *id, struct hutch_op_rec *out, hutch_err *err) {
  sqlite3_stmt *st = prep(db,
                          "SELECT id, kind, sandbox_id, state, err_status, err_code, err_msg, created_at, "
                          "started_at, finished_at, arg FROM operations WHERE id=?",
                          err);
  if (!st) return -1;
  bind_text(st, 1, id);
  int rc = sqlite3_step(st), ret = 0;
  if (rc == SQLITE_ROW) {
    memset(out, 0, sizeof *out);
    copy_col(out->id, sizeof out->id, st, 0);
    copy_col(out->kind, sizeof out->kind, st, 1);
    copy_col(out->sandbox_id, sizeof out->sandbox_id, st, 2);
    copy_col(out->state, sizeof out->state, st, 3);
    out->err_status = sqlite3_column_int(st, 4);
    copy_col(out->err_code, sizeof out->err_code, st, 5);
    out->err_msg = dup_col(st, 6);
    out->created_at = (uint64_t)sqlite3_column_int64(st, 7);
    out->started_at = (uint64_t)sqlite3_column_int64(st, 8);
    out->finished_at = (uint64_t)sqlite3_column_int64(st, 9);
    out->arg = dup_col(st, 10);
  } else if (rc == SQLITE_DONE) {
    ret = hutch_err_set(err, 404, "not_found", "operation `%s` not found", id);
  } else {
    ret = db_fail(db, err, "get operation");
  }
  sqlite3_finalize(st);
  pthread_mutex_unlock(&db->mu);
  return ret;
}

int hutch_db_op_set_state(struct hutch_db *db, const char *id, const char *state, const hutch_err *failure,
                          hutch_err *err) {
  bool finished = !strcmp(state, "succeeded") || !strcmp(state, "failed");
  sqlite3_stmt *st = prep(db,
                          "UPDATE operations SET state=?, err_status=?, err_code=?, err_msg=?, "
                          "started_at=CASE WHEN started_at=0 THEN ? ELSE started_at END, "
                          "finished_at=? WHERE id=?",
                          err);
  if (!st) return -1;
  uint64_t now = now_ms();
  bind_text(st, 1, state);
  sqlite3_bind_int(st, 2, failure ? failure->status : 0);
  bind_text(st, 3, failure ? failure->code : NULL);
  bind_text(st, 4, failure ? failure->msg : NULL);
  sqlite3_bind_int64(st, 5, (sqlite3_int64)now);
  sqlite3_bind_int64(st, 6, finished ? (sqlite3_int64)now : 0);
  bind_text(st, 7, id);
  return changed_or_404(db, st, id, err, "update operation");
}

int hutch_db_op_fail_unfinished(struct hutch_db *db, const char *message, hutch_err *err) {
  sqlite3_stmt *st = prep(db,
                          "UPDATE operations SET state='failed', err_status=500, err_code='internal', err_msg=?, "
                          "finished_at=? WHERE state IN ('pending','running')",
                          err);
  if (!st) return -1;
  bind_text(st, 1, message);
  sqlite3_bind_int64(st, 2, (sqlite3_int64)now_ms());
  return step_done(db, st, err, "fail unfinished operations");
}

int hutch_db_key_insert(struct hutch_db *db, const char *id, const char *name, const char *hash_hex,
                        hutch_err *err) {
  sqlite3_stmt *st = prep(db, "INSERT INTO api_keys (id, name, hash, created_at) VALUES (?,?,?,?)", err);
  if (!st) return -1;
  bind_text(st, 1, id);
  bind_text(st, 2, name);
  bind_text(st, 3, hash_hex);
  sqlite3_bind_int64(st, 4, (sqlite3_int64)now_ms());
  return step_done(db, st, err, "insert key");
}

int hutch_db_key_list(struct hutch_db *db, struct hutch_key_rec **out, size_t *n, hutch_err *err) {
  sqlite3_stmt *st = prep(db, "SELECT id, name, created_at FROM api_keys ORDER BY created_at, id", err);
  if (!st) return -1;
  size_t cap = 8, len = 0;
  struct hutch_key_rec *v = xcalloc(cap, sizeof *v);
  while (sqlite3_step(st) == SQLITE_ROW) {
    if (len == cap) v = xrealloc(v, (cap *= 2) * sizeof *v);
    copy_col(v[len].id, sizeof v[len].id, st, 0);
    copy_col(v[len].name, sizeof v[len].name, st, 1);
    v[len].created_at = (uint64_t)sqlite3_column_int64(st, 2);
    len++;
  }
  sqlite3_finalize(st);
  pthread_mutex_unlock(&db->mu);
  *out = v;
  *n = len;
  return 0;
}

int hutch_db_key_delete(struct hutch_db *db, const char *id, hutch_err *err) {
  sqlite3_stmt *st = prep(db, "DELETE FROM api_keys WHERE id=?", err);
  if (!st) return -1;
  bind_text(st, 1, id);
  return changed_or_404(db, st, id, err, "delete key");
}

bool hutch_db_key_hash_exists(struct hutch_db *db, const char *hash_hex) {
  hutch_err err = HUTCH_ERR_INIT;
  sqlite3_stmt *st = prep(db, "SELECT 1 FROM api_keys WHERE hash=?", &err);
  if (!st) return false;
  bind_text(st, 1, hash_hex);
  bool found = sqlite3_step(st) == SQLITE_ROW;
  sqlite3_finalize(st);
  pthread_mutex_unlock(&db->mu);
  return found;
}

/* ---- templates ----------------------------------------------------------------- */

void hutch_template_rec_free(struct hutch_template_rec *r) {
  free(r->source);
  free(r->config);
  free(r->progress);
  free(r->error);
  r->source = r->config = r->progress = r->error = NULL;
}

#define TEMPLATE_COLS "name, state, source, config, progress, fraction, error, created_at, updated_at"

static void read_template(sqlite3_stmt *st, struct hutch_template_rec *r) {
  memset(r, 0, sizeof *r);
  copy_col(r->name, sizeof r->name, st, 0);
  copy_col(r->state, sizeof r->state, st, 1);
  r->source = dup_col(st, 2);
  r->config = dup_col(st, 3);
  r->progress = dup_col(st, 4);
  r->fraction = sqlite3_column_double(st, 5);
  r->error = dup_col(st, 6);
  r->created_at = (uint64_t)sqlite3_column_int64(st, 7);
  r->updated_at = (uint64_t)sqlite3_column_int64(st, 8);
}

int hutch_db_template_begin(struct hutch_db *db, const char *name, const char *source, hutch_err *err) {
  /* A new build: insert, or restart a finished one (never one in progress). */
  sqlite3_stmt *st = prep(db,
                          "INSERT INTO templates (name, state, source, created_at, updated_at) VALUES (?,'building',?,?,?) "
                          "ON CONFLICT(name) DO UPDATE SET state='building', source=excluded.source, progress=NULL, "
                          "fraction=0, error=NULL, updated_at=excluded.updated_at WHERE templates.state != 'building'",
                          err);
  if (!st) return -1;
  uint64_t now = now_ms();
  bind_text(st, 1, name);
  bind_text(st, 2, source);
  sqlite3_bind_int64(st, 3, (sqlite3_int64)now);
  sqlite3_bind_int64(st, 4, (sqlite3_int64)now);
  int rc = sqlite3_step(st), ret = 0;
  if (rc != SQLITE_DONE) ret = db_fail(db, err, "insert template");
  else if (sqlite3_changes(db->h) == 0)
    ret = hutch_err_set(err, 409, "conflict", "template `%s` is being built", name);
  sqlite3_finalize(st);
  pthread_mutex_unlock(&db->mu);
  return ret;
}

int hutch_db_template_progress(struct hutch_db *db, const char *name, const char *msg, double fraction,
                               hutch_err *err) {
  sqlite3_stmt *st = prep(db, "UPDATE templates SET progress=?, fraction=?, updated_at=? WHERE name=?", err);
  if (!st) return -1;
  bind_text(st, 1, msg);
  sqlite3_bind_double(st, 2, fraction);
  sqlite3_bind_int64(st, 3, (sqlite3_int64)now_ms());
  bind_text(st, 4, name);
  return step_done(db, st, err, "update template progress");
}

int hutch_db_template_finish(struct hutch_db *db, const char *name, const char *state, const char *config,
                             const char *error, hutch_err *err) {
  sqlite3_stmt *st = prep(db,
                          "UPDATE templates SET state=?, config=COALESCE(?, config), error=?, "
                          "fraction=CASE WHEN ?='ready' THEN 1 ELSE fraction END, updated_at=? WHERE name=?",
                          err);
  if (!st) return -1;
  bind_text(st, 1, state);
  bind_text(st, 2, config);
  bind_text(st, 3, error);
  bind_text(st, 4, state);
  sqlite3_bind_int64(st, 5, (sqlite3_int64)now_ms());
  bind_text(st, 6, name);
  return step_done(db, st, err, "finish template");
}

int hutch_db_template_get(struct hutch_db *db, const char *name, struct hutch_template_rec *out, hutch_err *err) {
  sqlite3_stmt *st = prep(db, "SELECT " TEMPLATE_COLS " FROM templates WHERE name=?", err);
  if (!st) return -1;
  bind_text(st, 1, name);
  int rc = sqlite3_step(st), ret = 0;
  if (rc == SQLITE_ROW) read_template(st, out);
  else if (rc == SQLITE_DONE) ret = hutch_err_set(err, 404, "not_found", "template `%s` not found", name);
  else ret = db_fail(db, err, "get template");
  sqlite3_finalize(st);
  pthread_mutex_unlock(&db->mu);
  return ret;
}

int hutch_db_template_list(struct hutch_db *db, struct hutch_template_rec **out, size_t *n, hutch_err *err) {
  sqlite3_stmt *st = prep(db, "SELECT " TEMPLATE_COLS " FROM templates ORDER BY name", err);
  if (!st) return -1;
  size_t cap = 8, len = 0;
  struct hutch_template_rec *v = xcalloc(cap, sizeof *v);
  while (sqlite3_step(st) == SQLITE_ROW) {
    if (len == cap) v = xrealloc(v, (cap *= 2) * sizeof *v);
    read_template(st, &v[len++]);
  }
  sqlite3_finalize(st);
  pthread_mutex_unlock(&db->mu);
  *out = v;
  *n = len;
  return 0;
}

int hutch_db_template_delete(struct hutch_db *db, const char *name, hutch_err *err) {
  sqlite3_stmt *st = prep(db, "DELETE FROM templates WHERE name=?", err);
  if (!st) return -1;
  bind_text(st, 1, name);
  return changed_or_404(db, st, name, err, "delete template");
}

int hutch_db_template_fail_building(struct hutch_db *db, const char *message, hutch_err *err) {
  sqlite3_stmt *st =
      prep(db, "UPDATE templates SET state='failed', error=?, updated_at=? WHERE state='building'", err);
  if (!st) return -1;
  bind_text(st, 1, message);
  sqlite3_bind_int64(st, 2, (sqlite3_int64)now_ms());
  return step_done(db, st, err, "fail unfinished template builds");
}

/* ---- snapshots ----------------------------------------------------------------- */

void hutch_snapshot_rec_free(struct hutch_snapshot_rec *r) {
  free(r->labels);
  free(r->request);
  r->labels = r->request = NULL;
}

#define SNAPSHOT_COLS "id, sandbox_id, parent_id, template, kind, state, labels, request, generation, created_at"

static void read_snapshot(sqlite3_stmt *st, struct hutch_snapshot_rec *r) {
  memset(r, 0, sizeof *r);
  copy_col(r->id, sizeof r->id, st, 0);
  copy_col(r->sandbox_id, sizeof r->sandbox_id, st, 1);
  copy_col(r->parent_id, sizeof r->parent_id, st, 2);
  copy_col(r->template_name, sizeof r->template_name, st, 3);
  copy_col(r->kind, sizeof r->kind, st, 4);
  copy_col(r->state, sizeof r->state, st, 5);
  r->labels = dup_col(st, 6);
  r->request = dup_col(st, 7);
  r->generation = (uint64_t)sqlite3_column_int64(st, 8);
  r->created_at = (uint64_t)sqlite3_column_int64(st, 9);
}

int hutch_db_snapshot_insert(struct hutch_db *db, const struct hutch_snapshot_rec *r, hutch_err *err) {
  sqlite3_stmt *st = prep(db, "INSERT INTO snapshots (" SNAPSHOT_COLS ") VALUES (?,?,?,?,?,?,?,?,?,?)", err);
  if (!st) return -1;
  bind_text(st, 1, r->id);
  bind_text(st, 2, r->sandbox_id);
  bind_text(st, 3, r->parent_id[0] ? r->parent_id : NULL);
  bind_text(st, 4, r->template_name);
  bind_text(st, 5, r->kind);
  bind_text(st, 6, r->state);
  bind_text(st, 7, r->labels ? r->labels : "{}");
  bind_text(st, 8, r->request ? r->request : "{}");
  sqlite3_bind_int64(st, 9, (sqlite3_int64)r->generation);
  sqlite3_bind_int64(st, 10, (sqlite3_int64)r->created_at);
  int rc = sqlite3_step(st), ret = 0;
  if (rc == SQLITE_CONSTRAINT_PRIMARYKEY || rc == SQLITE_CONSTRAINT)
    ret = hutch_err_set(err, 409, "conflict", "snapshot `%s` already exists", r->id);
  else if (rc != SQLITE_DONE) ret = db_fail(db, err, "insert snapshot");
  sqlite3_finalize(st);
  pthread_mutex_unlock(&db->mu);
  return ret;
}

int hutch_db_snapshot_get(struct hutch_db *db, const char *id, struct hutch_snapshot_rec *out, hutch_err *err) {
  sqlite3_stmt *st = prep(db, "SELECT " SNAPSHOT_COLS " FROM snapshots WHERE id=?", err);
  if (!st) return -1;
  bind_text(st, 1, id);
  int rc = sqlite3_step(st), ret = 0;
  if (rc == SQLITE_ROW) read_snapshot(st, out);
  else if (rc == SQLITE_DONE) ret = hutch_err_set(err, 404, "not_found", "snapshot `%s` not found", id);
  else ret = db_fail(db, err, "get snapshot");
  sqlite3_finalize(st);
  pthread_mutex_unlock(&db->mu);
  return ret;
}

int hutch_db_snapshot_list(struct hutch_db *db, const char *sandbox_id, const char *kind,
                           struct hutch_snapshot_rec **out, size_t *n, hutch_err *err) {
  sqlite3_stmt *st = prep(db,
                          "SELECT " SNAPSHOT_COLS " FROM snapshots WHERE (?1 IS NULL OR sandbox_id=?1) "
                          "AND (?2 IS NULL OR kind=?2) ORDER BY created_at, id",
                          err);
  if (!st) return -1;
  bind_text(st, 1, sandbox_id);
  bind_text(st, 2, kind);
  size_t cap = 8, len = 0;
  struct hutch_snapshot_rec *v = xcalloc(cap, sizeof *v);
  while (sqlite3_step(st) == SQLITE_ROW) {
    if (len == cap) v = xrealloc(v, (cap *= 2) * sizeof *v);
    read_snapshot(st, &v[len++]);
  }
  sqlite3_finalize(st);
  pthread_mutex_unlock(&db->mu);
  *out = v;
  *n = len;
  return 0;
}

int hutch_db_snapshot_set_ready(struct hutch_db *db, const char *id, uint64_t generation, hutch_err *err) {
  sqlite3_stmt *st = prep(db, "UPDATE snapshots SET state='ready', generation=? WHERE id=?", err);
  if (!st) return -1;
  sqlite3_bind_int64(st, 1, (sqlite3_int64)generation);
  bind_text(st, 2, id);
  return changed_or_404(db, st, id, err, "update snapshot");
}

int hutch_db_snapshot_delete(struct hutch_db *db, const char *id, hutch_err *err) {
  sqlite3_stmt *st = prep(db, "DELETE FROM snapshots WHERE id=?", err);
  if (!st) return -1;
  bind_text(st, 1, id);
  return changed_or_404(db, st, id, err, "delete snapshot");
}
