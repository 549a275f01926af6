/* hutchd's SQLite store (src/lib/store/db.c) on a scratch database under
 * /tmp: schema and WAL, sandboxes, operations, API keys, and refusing a
 * database written by a newer hutchd. */
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "store/db.h"
#include "tap.h"

static char dir[] = "/tmp/hutch-test-db.XXXXXX";

static char *pragma_text(const char *path, const char *sql) {
  sqlite3 *h = NULL;
  char *out = NULL;
  if (sqlite3_open_v2(path, &h, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK) {
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(h, sql, -1, &st, NULL) == SQLITE_OK) {
      if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0))
        out = xstrdup((const char *)sqlite3_column_text(st, 0));
      sqlite3_finalize(st);
    }
  }
  sqlite3_close(h);
  return out;
}

static int exec_direct(const char *path, const char *sql) {
  sqlite3 *h = NULL;
  int rc = sqlite3_open_v2(path, &h, SQLITE_OPEN_READWRITE, NULL);
  if (rc == SQLITE_OK) rc = sqlite3_exec(h, sql, NULL, NULL, NULL);
  sqlite3_close(h);
  return rc == SQLITE_OK ? 0 : -1;
}

static void sb(struct hutch_sandbox_rec *r, const char *id, const char *state, uint64_t created) {
  memset(r, 0, sizeof *r);
  snprintf(r->id, sizeof r->id, "%s", id);
  snprintf(r->state, sizeof r->state, "%s", state);
  snprintf(r->template_name, sizeof r->template_name, "python");
  snprintf(r->runtime, sizeof r->runtime, "native");
  r->request = (char *)"{\"resources\":{\"memory_mib\":512},\"env\":{\"A\":\"b\"}}";
  r->uid_slot = -1;
  r->created_at = created;
  r->updated_at = created;
  r->expires_at = created + 3600000;
}

static void test_open(const char *path) {
  struct hutch_db *db = NULL;
  hutch_err err = HUTCH_ERR_INIT;
  is_int(hutch_db_open(path, &db, &err), 0, "open creates a new database");
  if (!db) {
    printf("# %s\n", err.msg);
    return;
  }
  is_int(hutch_db_schema_version(db), HUTCH_DB_SCHEMA_VERSION, "schema version is HUTCH_DB_SCHEMA_VERSION");
  ok(access(path, F_OK) == 0, "database file exists");
  char *mode = pragma_text(path, "PRAGMA journal_mode");
  is_str(mode, "wal", "journal_mode is WAL (seen from another connection)");
  free(mode);
  char *uv = pragma_text(path, "PRAGMA user_version");
  char want[16];
  snprintf(want, sizeof want, "%d", HUTCH_DB_SCHEMA_VERSION);
  is_str(uv, want, "user_version on disk is the schema version");
  free(uv);
  char *tables = pragma_text(path,
                             "SELECT group_concat(name, ',') FROM (SELECT name FROM sqlite_master WHERE type='table' "
                             "ORDER BY name)");
  is_str(tables, "api_keys,operations,sandboxes,snapshots,templates",
         "tables api_keys, operations, sandboxes, snapshots, templates");
  free(tables);
  is_int(hutch_db_sandbox_count(db), 0, "no sandboxes yet");
  hutch_db_close(db);
  hutch_db_close(NULL); /* harmless */

  db = NULL;
  is_int(hutch_db_open(path, &db, &err), 0, "reopening an up-to-date database");
  if (db) is_int(hutch_db_schema_version(db), HUTCH_DB_SCHEMA_VERSION, "schema version unchanged on reopen");
  hutch_db_close(db);

  db = NULL;
  hutch_err_clear(&err);
  is_int(hutch_db_open("/nonexistent-hutch-dir/sub/db.sqlite", &db, &err), -1, "open in a missing directory fails");
  ok(db == NULL, "... and leaves out unset");
  ok(strstr(err.msg, "/nonexistent-hutch-dir/sub/db.sqlite") != NULL, "... naming the path (%s)", err.msg);
}

static void test_sandboxes(struct hutch_db *db) {
  hutch_err err = HUTCH_ERR_INIT;
  struct hutch_sandbox_rec r, g;
  sb(&r, "sb_one", "running", 1000);
  r.uid_slot = 3;
  r.shim_pid = 4242;
  r.init_pid = 4243;
  is_int(hutch_db_sandbox_insert(db, &r, &err), 0, "insert sandbox sb_one");
  is_int(hutch_db_sandbox_get(db, "sb_one", &g, &err), 0, "get sb_one");
  ok(!strcmp(g.id, "sb_one") && !strcmp(g.state, "running") && !strcmp(g.template_name, "python") &&
         !strcmp(g.runtime, "native"),
     "id, state, template, runtime");
  is_str(g.request, r.request, "request JSON");
  ok(g.error == NULL, "error NULL");
  ok(g.uid_slot == 3 && g.shim_pid == 4242 && g.init_pid == 4243, "uid_slot, shim_pid, init_pid");
  ok(g.created_at == 1000 && g.updated_at == 1000 && g.expires_at == 3601000, "created/updated/expires");
  hutch_sandbox_rec_free(&g);
  ok(g.request == NULL && g.error == NULL, "rec_free clears the strings");

  hutch_err_clear(&err);
  is_int(hutch_db_sandbox_insert(db, &r, &err), -1, "inserting the same id again fails");
  ok(err.msg[0] != 0, "... with a message (%s)", err.msg);

  /* request NULL is stored as "{}". */
  sb(&r, "sb_two", "creating", 2000);
  r.request = NULL;
  is_int(hutch_db_sandbox_insert(db, &r, &err), 0, "insert sb_two without a request");
  is_int(hutch_db_sandbox_get(db, "sb_two", &g, &err), 0, "get sb_two");
  is_str(g.request, "{}", "absent request stored as {}");
  ok(g.uid_slot == -1 && g.shim_pid == 0 && g.init_pid == 0, "no host facts yet");
  hutch_sandbox_rec_free(&g);

  sb(&r, "sb_three", "running", 1500);
  is_int(hutch_db_sandbox_insert(db, &r, &err), 0, "insert sb_three");
  sb(&r, "sb_four", "error", 500);
  r.error = (char *)"create: ENOSPC";
  is_int(hutch_db_sandbox_insert(db, &r, &err), 0, "insert sb_four in state error");
  is_int(hutch_db_sandbox_count(db), 4, "count 4");

  /* Not found. */
  hutch_err_clear(&err);
  memset(&g, 0, sizeof g);
  is_int(hutch_db_sandbox_get(db, "sb_nope", &g, &err), -1, "get unknown id fails");
  is_int(err.status, 404, "... status 404");
  is_str(err.code, "not_found", "... code not_found");
  ok(strstr(err.msg, "sb_nope") != NULL, "... naming the id (%s)", err.msg);

  /* List, oldest first, and filtered by state. */
  struct hutch_sandbox_rec *v = NULL;
  size_t n = 0;
  is_int(hutch_db_sandbox_list(db, NULL, &v, &n, &err), 0, "list all");
  is_int(n, 4, "4 sandboxes");
  ok(n == 4 && !strcmp(v[0].id, "sb_four") && !strcmp(v[1].id, "sb_one") && !strcmp(v[2].id, "sb_three") &&
         !strcmp(v[3].id, "sb_two"),
     "ordered by created_at");
  if (n == 4) is_str(v[0].error, "create: ENOSPC", "error stored on insert");
  for (size_t i = 0; i < n; i++) hutch_sandbox_rec_free(&v[i]);
  free(v);
  is_int(hutch_db_sandbox_list(db, "running", &v, &n, &err), 0, "list running");
  ok(n == 2 && !strcmp(v[0].id, "sb_one") && !strcmp(v[1].id, "sb_three"), "only the running ones, oldest first");
  for (size_t i = 0; i < n; i++) hutch_sandbox_rec_free(&v[i]);
  free(v);
  is_int(hutch_db_sandbox_list(db, "deleting", &v, &n, &err), 0, "list a state with no sandboxes");
  is_int(n, 0, "none");
  free(v);

  /* Ties in created_at fall back to id order. */
  sb(&r, "sb_b_tie", "paused", 7000);
  hutch_db_sandbox_insert(db, &r, &err);
  sb(&r, "sb_a_tie", "paused", 7000);
  hutch_db_sandbox_insert(db, &r, &err);
  is_int(hutch_db_sandbox_list(db, "paused", &v, &n, &err), 0, "list paused");
  ok(n == 2 && !strcmp(v[0].id, "sb_a_tie") && !strcmp(v[1].id, "sb_b_tie"), "same created_at: ordered by id");
  for (size_t i = 0; i < n; i++) hutch_sandbox_rec_free(&v[i]);
  free(v);

  /* Many rows: the list grows past its initial capacity. */
  for (int i = 0; i < 40; i++) {
    char id[32];
    snprintf(id, sizeof id, "sb_bulk%02d", i);
    sb(&r, id, "bulk", 10000 + (uint64_t)i);
    hutch_db_sandbox_insert(db, &r, &err);
  }
  is_int(hutch_db_sandbox_list(db, "bulk", &v, &n, &err), 0, "list 40 rows");
  int order = n == 40;
  for (size_t i = 0; order && i < n; i++) {
    char id[32];
    snprintf(id, sizeof id, "sb_bulk%02zu", i);
    order = !strcmp(v[i].id, id);
  }
  ok(order, "all 40, in order");
  for (size_t i = 0; i < n; i++) hutch_sandbox_rec_free(&v[i]);
  free(v);

  /* set_state */
  uint64_t before = now_ms();
  is_int(hutch_db_sandbox_set_state(db, "sb_two", "error", "boom: ENOMEM", &err), 0, "set_state sb_two error");
  is_int(hutch_db_sandbox_get(db, "sb_two", &g, &err), 0, "get sb_two");
  is_str(g.state, "error", "state error");
  is_str(g.error, "boom: ENOMEM", "error message stored");
  ok(g.updated_at >= before && g.created_at == 2000, "updated_at bumped, created_at kept");
  hutch_sandbox_rec_free(&g);
  is_int(hutch_db_sandbox_set_state(db, "sb_two", "running", NULL, &err), 0, "set_state sb_two running");
  hutch_db_sandbox_get(db, "sb_two", &g, &err);
  ok(!strcmp(g.state, "running") && g.error == NULL, "state running, error cleared");
  hutch_sandbox_rec_free(&g);
  hutch_err_clear(&err);
  is_int(hutch_db_sandbox_set_state(db, "sb_nope", "running", NULL, &err), -1, "set_state unknown id");
  ok(err.status == 404 && !strcmp(err.code, "not_found"), "... 404 not_found");

  /* set_host */
  is_int(hutch_db_sandbox_set_host(db, "sb_two", 17, 100, 101, &err), 0, "set_host sb_two");
  hutch_db_sandbox_get(db, "sb_two", &g, &err);
  ok(g.uid_slot == 17 && g.shim_pid == 100 && g.init_pid == 101, "uid_slot 17, shim 100, init 101");
  is_str(g.state, "running", "set_host leaves state alone");
  hutch_sandbox_rec_free(&g);
  is_int(hutch_db_sandbox_set_host(db, "sb_two", -1, 0, 0, &err), 0, "set_host back to none");
  hutch_db_sandbox_get(db, "sb_two", &g, &err);
  ok(g.uid_slot == -1 && g.shim_pid == 0 && g.init_pid == 0, "uid_slot -1, pids 0");
  hutch_sandbox_rec_free(&g);
  hutch_err_clear(&err);
  is_int(hutch_db_sandbox_set_host(db, "sb_nope", 1, 2, 3, &err), -1, "set_host unknown id");
  ok(err.status == 404 && !strcmp(err.code, "not_found"), "... 404 not_found");

  /* delete */
  int64_t count = hutch_db_sandbox_count(db);
  is_int(hutch_db_sandbox_delete(db, "sb_one", &err), 0, "delete sb_one");
  is_int(hutch_db_sandbox_count(db), count - 1, "count drops by one");
  hutch_err_clear(&err);
  is_int(hutch_db_sandbox_get(db, "sb_one", &g, &err), -1, "deleted sandbox is gone");
  is_int(err.status, 404, "... 404");

  /* Ids are bound, never spliced into SQL. */
  sb(&r, "sb_'; DROP TABLE sandboxes; --", "running", 1);
  is_int(hutch_db_sandbox_insert(db, &r, &err), 0, "insert an id with SQL in it");
  is_int(hutch_db_sandbox_get(db, "sb_'; DROP TABLE sandboxes; --", &g, &err), 0, "... and get it back");
  hutch_sandbox_rec_free(&g);
  ok(hutch_db_sandbox_count(db) == count, "table intact");
}

static void test_operations(struct hutch_db *db) {
  hutch_err err = HUTCH_ERR_INIT;
  struct hutch_op_rec o, g;
  memset(&o, 0, sizeof o);
  snprintf(o.id, sizeof o.id, "op_create1");
  snprintf(o.kind, sizeof o.kind, "create");
  snprintf(o.sandbox_id, sizeof o.sandbox_id, "sb_two");
  snprintf(o.state, sizeof o.state, "pending");
  o.created_at = 5000;
  is_int(hutch_db_op_insert(db, &o, &err), 0, "insert operation");
  is_int(hutch_db_op_get(db, "op_create1", &g, &err), 0, "get operation");
  ok(!strcmp(g.id, "op_create1") && !strcmp(g.kind, "create") && !strcmp(g.sandbox_id, "sb_two") &&
         !strcmp(g.state, "pending"),
     "id, kind, sandbox_id, state");
  ok(g.created_at == 5000 && g.started_at == 0 && g.finished_at == 0, "created_at set, not started or finished");
  ok(g.err_status == 0 && g.err_code[0] == 0 && g.err_msg == NULL, "no error");
  hutch_op_rec_free(&g);
  hutch_err_clear(&err);
  is_int(hutch_db_op_insert(db, &o, &err), -1, "duplicate operation id rejected");

  hutch_err_clear(&err);
  is_int(hutch_db_op_get(db, "op_nope", &g, &err), -1, "get unknown operation");
  ok(err.status == 404 && !strcmp(err.code, "not_found"), "... 404 not_found");

  uint64_t t0 = now_ms();
  is_int(hutch_db_op_set_state(db, "op_create1", "running", NULL, &err), 0, "set running");
  hutch_db_op_get(db, "op_create1", &g, &err);
  is_str(g.state, "running", "state running");
  ok(g.started_at >= t0 && g.finished_at == 0, "started_at set, finished_at still 0");
  uint64_t started = g.started_at;
  hutch_op_rec_free(&g);

  is_int(hutch_db_op_set_state(db, "op_create1", "succeeded", NULL, &err), 0, "set succeeded");
  hutch_db_op_get(db, "op_create1", &g, &err);
  is_str(g.state, "succeeded", "state succeeded");
  ok(g.finished_at >= started && g.finished_at != 0, "finished_at set on succeeded");
  is_int(g.started_at, started, "started_at kept from the first transition");
  ok(g.err_status == 0 && g.err_msg == NULL, "no error on success");
  hutch_op_rec_free(&g);

  /* A failure carries status, code and message. */
  snprintf(o.id, sizeof o.id, "op_create2");
  is_int(hutch_db_op_insert(db, &o, &err), 0, "insert op_create2");
  hutch_err failure = HUTCH_ERR_INIT;
  hutch_err_set(&failure, 507, "insufficient_storage", "copy template `python`: %s", "No space left on device");
  is_int(hutch_db_op_set_state(db, "op_create2", "failed", &failure, &err), 0, "set failed with an error");
  hutch_db_op_get(db, "op_create2", &g, &err);
  is_str(g.state, "failed", "state failed");
  is_int(g.err_status, 507, "err_status");
  is_str(g.err_code, "insufficient_storage", "err_code");
  is_str(g.err_msg, "copy template `python`: No space left on device", "err_msg");
  ok(g.finished_at != 0 && g.started_at != 0, "finished_at set on failed (and started_at filled)");
  hutch_op_rec_free(&g);
  ok(g.err_msg == NULL, "op_rec_free clears err_msg");

  hutch_err_clear(&err);
  is_int(hutch_db_op_set_state(db, "op_nope", "failed", NULL, &err), -1, "set_state unknown operation");
  ok(err.status == 404 && !strcmp(err.code, "not_found"), "... 404 not_found");

  /* fail_unfinished: pending and running become failed, finished ones stay. */
  static const char *const states[] = {"pending", "running", "succeeded", "failed"};
  for (int i = 0; i < 4; i++) {
    snprintf(o.id, sizeof o.id, "op_u%d", i);
    snprintf(o.state, sizeof o.state, "%s", states[i]);
    hutch_db_op_insert(db, &o, &err);
  }
  is_int(hutch_db_op_fail_unfinished(db, "hutchd restarted", &err), 0, "fail_unfinished");
  for (int i = 0; i < 4; i++) {
    char id[16];
    snprintf(id, sizeof id, "op_u%d", i);
    memset(&g, 0, sizeof g);
    hutch_db_op_get(db, id, &g, &err);
    if (i < 2) {
      ok(!strcmp(g.state, "failed") && g.err_status == 500 && !strcmp(g.err_code, "internal") && g.err_msg &&
             !strcmp(g.err_msg, "hutchd restarted") && g.finished_at != 0,
         "%s operation is now failed 500 internal \"hutchd restarted\"", states[i]);
    } else {
      ok(!strcmp(g.state, states[i]) && g.err_msg == NULL && g.finished_at == 0,
         "%s operation (inserted as such) untouched", states[i]);
    }
    hutch_op_rec_free(&g);
  }
  hutch_db_op_get(db, "op_create1", &g, &err);
  ok(!strcmp(g.state, "succeeded") && g.err_msg == NULL, "op_create1 still succeeded");
  hutch_op_rec_free(&g);
  hutch_db_op_get(db, "op_create2", &g, &err);
  ok(!strcmp(g.state, "failed") && g.err_status == 507, "op_create2 keeps its own failure");
  hutch_op_rec_free(&g);
  is_int(hutch_db_op_fail_unfinished(db, "again", &err), 0, "fail_unfinished with nothing to do");
}

static void test_keys(struct hutch_db *db) {
  hutch_err err = HUTCH_ERR_INIT;
  const char *h1 = "aaaa000000000000000000000000000000000000000000000000000000000001";
  const char *h2 = "bbbb000000000000000000000000000000000000000000000000000000000002";
  struct hutch_key_rec *v = NULL;
  size_t n = 99;
  is_int(hutch_db_key_list(db, &v, &n, &err), 0, "list keys on an empty table");
  is_int(n, 0, "no keys");
  free(v);
  ok(!hutch_db_key_hash_exists(db, h1), "hash_exists false on an empty table");

  is_int(hutch_db_key_insert(db, "key_1", "ci", h1, &err), 0, "insert key_1");
  usleep(2000); /* distinct created_at, so the order is by time */
  is_int(hutch_db_key_insert(db, "key_2", "laptop", h2, &err), 0, "insert key_2");
  hutch_err_clear(&err);
  is_int(hutch_db_key_insert(db, "key_3", "dup", h1, &err), -1, "a duplicate hash is rejected");
  ok(err.msg[0] != 0, "... with a message (%s)", err.msg);
  hutch_err_clear(&err);
  is_int(hutch_db_key_insert(db, "key_1", "dup id", "cccc", &err), -1, "a duplicate id is rejected");

  is_int(hutch_db_key_list(db, &v, &n, &err), 0, "list keys");
  ok(n == 2 && !strcmp(v[0].id, "key_1") && !strcmp(v[0].name, "ci") && !strcmp(v[1].id, "key_2") &&
         !strcmp(v[1].name, "laptop"),
     "key_1 ci, key_2 laptop, oldest first");
  ok(n == 2 && v[0].created_at != 0 && v[0].created_at <= v[1].created_at, "created_at set");
  free(v);

  ok(hutch_db_key_hash_exists(db, h1), "hash 1 exists");
  ok(hutch_db_key_hash_exists(db, h2), "hash 2 exists");
  ok(!hutch_db_key_hash_exists(db, "cccc"), "unknown hash does not");
  ok(!hutch_db_key_hash_exists(db, ""), "empty hash does not");

  is_int(hutch_db_key_delete(db, "key_1", &err), 0, "delete key_1");
  ok(!hutch_db_key_hash_exists(db, h1), "its hash no longer exists");
  ok(hutch_db_key_hash_exists(db, h2), "the other one still does");
  hutch_db_key_list(db, &v, &n, &err);
  ok(n == 1 && !strcmp(v[0].id, "key_2"), "one key left");
  free(v);
  hutch_err_clear(&err);
  is_int(hutch_db_key_delete(db, "key_1", &err), -1, "deleting it again fails");
  ok(err.status == 404 && !strcmp(err.code, "not_found"), "... 404 not_found");
  is_int(hutch_db_key_insert(db, "key_4", "reuse", h1, &err), 0, "a deleted key's hash can be inserted again");
}

static void test_storage(struct hutch_db *db) {
  hutch_err err = HUTCH_ERR_INIT;
  /* Operations carry an argument. */
  struct hutch_op_rec op = {0}, got;
  snprintf(op.id, sizeof op.id, "op_arg");
  snprintf(op.kind, sizeof op.kind, "rollback");
  snprintf(op.sandbox_id, sizeof op.sandbox_id, "sb_a");
  snprintf(op.state, sizeof op.state, "pending");
  op.arg = (char *)"snap_one";
  op.created_at = 1;
  is_int(hutch_db_op_insert(db, &op, &err), 0, "operation with an argument inserted");
  is_int(hutch_db_op_get(db, "op_arg", &got, &err), 0, "and read back");
  is_str(got.arg, "snap_one", "its argument survives");
  hutch_op_rec_free(&got);

  /* Templates: one build at a time per name; progress; finish; list. */
  is_int(hutch_db_template_begin(db, "t1", "{\"source\":\"busybox\"}", &err), 0, "template build begins");
  hutch_err_clear(&err);
  is_int(hutch_db_template_begin(db, "t1", "{}", &err), -1, "a second build of the same name is refused");
  is_int(err.status, 409, "... with 409");
  is_int(hutch_db_template_progress(db, "t1", "I: Retrieving", 0.25, &err), 0, "progress recorded");
  struct hutch_template_rec t;
  is_int(hutch_db_template_get(db, "t1", &t, &err), 0, "template read");
  is_str(t.state, "building", "state building");
  is_str(t.progress, "I: Retrieving", "progress message");
  ok(t.fraction > 0.24 && t.fraction < 0.26, "progress fraction");
  hutch_template_rec_free(&t);
  is_int(hutch_db_template_finish(db, "t1", "ready", "{\"cwd\":\"/app\"}", NULL, &err), 0, "build finished");
  hutch_db_template_get(db, "t1", &t, &err);
  is_str(t.state, "ready", "state ready");
  is_str(t.config, "{\"cwd\":\"/app\"}", "image config stored");
  ok(t.fraction == 1.0, "fraction 1 when ready");
  hutch_template_rec_free(&t);
  is_int(hutch_db_template_begin(db, "t1", "{}", &err), 0, "a finished template can be rebuilt");
  is_int(hutch_db_template_fail_building(db, "restarted", &err), 0, "unfinished builds failed at start");
  hutch_db_template_get(db, "t1", &t, &err);
  is_str(t.state, "failed", "the interrupted build is failed");
  is_str(t.error, "restarted", "with the reason");
  hutch_template_rec_free(&t);
  struct hutch_template_rec *tv = NULL;
  size_t tn = 0;
  is_int(hutch_db_template_list(db, &tv, &tn, &err), 0, "templates listed");
  is_int((int)tn, 1, "one template");
  for (size_t i = 0; i < tn; i++) hutch_template_rec_free(&tv[i]);
  free(tv);
  is_int(hutch_db_template_delete(db, "t1", &err), 0, "template deleted");
  hutch_err_clear(&err);
  is_int(hutch_db_template_get(db, "t1", &t, &err), -1, "then not found");
  is_int(err.status, 404, "... 404");

  /* Snapshots. */
  struct hutch_snapshot_rec s = {0};
  snprintf(s.id, sizeof s.id, "snap_a");
  snprintf(s.sandbox_id, sizeof s.sandbox_id, "sb_a");
  snprintf(s.template_name, sizeof s.template_name, "busybox");
  snprintf(s.kind, sizeof s.kind, "manual");
  snprintf(s.state, sizeof s.state, "creating");
  s.labels = (char *)"{\"k\":\"v\"}";
  s.request = (char *)"{}";
  s.created_at = 10;
  is_int(hutch_db_snapshot_insert(db, &s, &err), 0, "snapshot inserted");
  hutch_err_clear(&err);
  is_int(hutch_db_snapshot_insert(db, &s, &err), -1, "the same id twice is refused");
  is_int(err.status, 409, "... with 409");
  snprintf(s.id, sizeof s.id, "snap_b");
  snprintf(s.parent_id, sizeof s.parent_id, "snap_a");
  snprintf(s.kind, sizeof s.kind, "auto");
  s.created_at = 20;
  is_int(hutch_db_snapshot_insert(db, &s, &err), 0, "a second, incremental snapshot");
  is_int(hutch_db_snapshot_set_ready(db, "snap_a", 77, &err), 0, "first one ready");
  struct hutch_snapshot_rec g;
  is_int(hutch_db_snapshot_get(db, "snap_a", &g, &err), 0, "snapshot read");
  is_str(g.state, "ready", "state ready");
  ok(g.generation == 77, "generation recorded");
  is_str(g.labels, "{\"k\":\"v\"}", "labels kept");
  is_str(g.parent_id, "", "no parent");
  hutch_snapshot_rec_free(&g);
  hutch_db_snapshot_get(db, "snap_b", &g, &err);
  is_str(g.parent_id, "snap_a", "parent kept");
  hutch_snapshot_rec_free(&g);
  struct hutch_snapshot_rec *v = NULL;
  size_t n = 0;
  hutch_db_snapshot_list(db, "sb_a", NULL, &v, &n, &err);
  ok(n == 2 && !strcmp(v[0].id, "snap_a") && !strcmp(v[1].id, "snap_b"), "listed oldest first");
  for (size_t i = 0; i < n; i++) hutch_snapshot_rec_free(&v[i]);
  free(v);
  hutch_db_snapshot_list(db, "sb_a", "auto", &v, &n, &err);
  ok(n == 1 && !strcmp(v[0].id, "snap_b"), "filtered by kind");
  for (size_t i = 0; i < n; i++) hutch_snapshot_rec_free(&v[i]);
  free(v);
  hutch_db_snapshot_list(db, "sb_other", NULL, &v, &n, &err);
  is_int((int)n, 0, "another sandbox has none");
  free(v);
  is_int(hutch_db_snapshot_delete(db, "snap_a", &err), 0, "snapshot deleted");
  hutch_err_clear(&err);
  is_int(hutch_db_snapshot_delete(db, "snap_a", &err), -1, "deleting it again");
  is_int(err.status, 404, "... 404");
}

static void test_reopen(const char *path) {
  struct hutch_db *db = NULL;
  hutch_err err = HUTCH_ERR_INIT;
  is_int(hutch_db_open(path, &db, &err), 0, "reopen after writes");
  if (!db) return;
  struct hutch_sandbox_rec g;
  is_int(hutch_db_sandbox_get(db, "sb_two", &g, &err), 0, "sandbox survives reopen");
  ok(!strcmp(g.state, "running") && g.created_at == 2000, "with its state and timestamps");
  hutch_sandbox_rec_free(&g);
  struct hutch_op_rec o;
  is_int(hutch_db_op_get(db, "op_create2", &o, &err), 0, "operation survives reopen");
  ok(o.err_status == 507 && o.err_msg && strstr(o.err_msg, "No space") != NULL, "with its error");
  hutch_op_rec_free(&o);
  ok(hutch_db_key_hash_exists(db, "bbbb000000000000000000000000000000000000000000000000000000000002"),
     "key survives reopen");
  hutch_db_close(db);
}

static void test_newer_schema(const char *path) {
  is_int(exec_direct(path, "PRAGMA user_version=999;"), 0, "set user_version=999 with sqlite3 directly");
  struct hutch_db *db = NULL;
  hutch_err err = HUTCH_ERR_INIT;
  is_int(hutch_db_open(path, &db, &err), -1, "a database from a newer hutchd is refused");
  ok(db == NULL, "... out left unset");
  ok(strstr(err.msg, "newer") != NULL && strstr(err.msg, "999") != NULL, "... saying why (%s)", err.msg);
  ok(strstr(err.msg, path) != NULL, "... naming the database");
  char *uv = pragma_text(path, "PRAGMA user_version");
  is_str(uv, "999", "the refused database is not modified");
  free(uv);

  /* Exactly the current version opens; one above does not. */
  char sql[64];
  snprintf(sql, sizeof sql, "PRAGMA user_version=%d;", HUTCH_DB_SCHEMA_VERSION + 1);
  exec_direct(path, sql);
  is_int(hutch_db_open(path, &db, &err), -1, "HUTCH_DB_SCHEMA_VERSION + 1 is refused");
  snprintf(sql, sizeof sql, "PRAGMA user_version=%d;", HUTCH_DB_SCHEMA_VERSION);
  exec_direct(path, sql);
  db = NULL;
  is_int(hutch_db_open(path, &db, &err), 0, "HUTCH_DB_SCHEMA_VERSION opens again");
  hutch_db_close(db);
}

static void test_garbage(void) {
  char *path = xasprintf("%s/garbage.db", dir);
  hutch_err err = HUTCH_ERR_INIT;
  static const char junk[] = "this is not a sqlite database, just some text that is long enough";
  write_file(path, junk, sizeof junk - 1, 0600, &err);
  struct hutch_db *db = NULL;
  is_int(hutch_db_open(path, &db, &err), -1, "a file that is not a database is refused");
  ok(db == NULL, "... out left unset");
  free(path);
}

int main(void) {
  if (!mkdtemp(dir)) skip_all("mkdtemp failed");
  char *path = xasprintf("%s/hutch.db", dir);
  test_open(path);
  struct hutch_db *db = NULL;
  hutch_err err = HUTCH_ERR_INIT;
  if (hutch_db_open(path, &db, &err) < 0) {
    ok(0, "open for the record tests: %s", err.msg);
  } else {
    test_sandboxes(db);
    test_operations(db);
    test_keys(db);
    test_storage(db);
    hutch_db_close(db);
  }
  test_reopen(path);
  test_newer_schema(path);
  test_garbage();
  free(path);
  hutch_err_clear(&err);
  ok(rm_rf(dir, &err) == 0 && access(dir, F_OK) != 0, "scratch directory removed");
  return done_testing();
}
