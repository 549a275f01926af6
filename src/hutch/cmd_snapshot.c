/* hutch snapshot create | list | get | delete | export | import, hutch
 * rollback, hutch fork (docs/api.md "Storage").
 *
 * export and import stream: the export is written to the file (through a
 * temporary file next to it, renamed into place when complete) or to stdout
 * as it arrives; import sends the file as the request body with curl
 * reading it.  Memory stays flat whatever the size. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "args.h"
#include "cli.h"
#include "common/util.h"
#include "wire.h"

#define SNAPSHOT_TYPE "application/vnd.hutch.snapshot"

static const char snapshot_usage[] =
    "usage: hutch snapshot create ID [--full] [--label K=V]... | list [ID] [--kind K] | get SNAP\n"
    "       hutch snapshot delete SNAP... | import FILE\n"
    "       hutch snapshot export SNAP [-o FILE] [--parent SNAP | --incremental]\n";
static const char snapshot_help[] =
    "usage: hutch snapshot create ID [--full] [--label K=V]...   snapshot a sandbox, print the id\n"
    "       hutch snapshot list [ID] [--kind K]         list snapshots (of one sandbox)\n"
    "       hutch snapshot get SNAP                     show a snapshot\n"
    "       hutch snapshot delete SNAP...               delete snapshots, print each id\n"
    "       hutch snapshot export SNAP [-o FILE] [--parent SNAP | --incremental]\n"
    "                                                   write a snapshot as a stream\n"
    "       hutch snapshot import FILE                  add an exported snapshot, print its id\n"
    "\n"
    "A snapshot is a read-only copy of a sandbox's files.  Use one with\n"
    "`hutch rollback ID SNAP`, `hutch fork ID --snapshot SNAP`, `hutch create\n"
    "--from-snapshot SNAP` or `hutch template create NAME --from-snapshot SNAP`.\n"
    "\n"
    "  --label K=V       create: label (repeatable)\n"
    "  --full            create: memory and files (runtimes that checkpoint memory:\n"
    "                    gvisor); rollback to it brings the processes back\n"
    "  --kind K          list: only manual, auto, fork, full or imported snapshots\n"
    "  -o, --output FILE export: write to FILE (mode 0600, put in place when\n"
    "                    complete) instead of stdout\n"
    "  --parent SNAP     export: only the changes since SNAP (which the importing\n"
    "                    host must have)\n"
    "  --incremental     export: only the changes since the snapshot's parent\n"
    "  --json            print hutchd's reply (not for export)\n"
    "\n"
    "FILE may be - for stdin (import).  export refuses to write to a terminal.\n";

static const char rollback_usage[] = "usage: hutch rollback [--json] ID SNAP\n";
static const char rollback_help[] =
    "usage: hutch rollback [--json] ID SNAP\n"
    "Put a sandbox's files back to those of its snapshot SNAP, wait, and print\n"
    "\"ID STATE\".  The sandbox must not be running: pause or stop it first (a\n"
    "paused sandbox restarts on the snapshot's files).\n";

static const char fork_usage[] =
    "usage: hutch fork [--count N] [--snapshot SNAP] [--label K=V]... [--json] ID\n";
static const char fork_help[] =
    "usage: hutch fork [OPTIONS] ID\n"
    "Make copies of a sandbox, wait until they run, and print their ids, one per\n"
    "line.  Each copy starts on the sandbox's files as they are now (a new\n"
    "snapshot), or as they were in SNAP; its processes are new.\n"
    "\n"
    "  -n, --count N     how many copies (default 1)\n"
    "  --snapshot SNAP   start from this snapshot of the sandbox\n"
    "  --label K=V       label for the copies (repeatable)\n"
    "  --json            print hutchd's reply\n"
    "\n"
    "If some copies fail, those that run are printed and the exit status is 1.\n";

/* "ID STATE"-style reply to a request made with ?wait=true: 202 means
 * hutchd's wait bound passed with the operation still running. */
static int unfinished(const char *verb, const char *id, const hutch_response *r) {
  if (r->status != 202) return 0;
  cleanup_free char *op = hutch_display(json_object_get(json_object_get(r->json, "operation"), "id"));
  hutch_errorf("%s %s: not finished within hutchd's wait bound; operation %s is still running",
               verb, id, op);
  return -1;
}

/* ---- snapshot --------------------------------------------------------------- */

static int snap_create(hutch_cli *cli, const hutch_snapshot_args *a) {
  cleanup_free char *path = hutch_id_path("/v1/sandboxes/", a->ids[0], "/snapshots");
  hutch_response r;
  if (hutch_call(cli, "POST", path, a->body, &r) < 0) return HUTCH_EXIT_FAIL;
  int rc = HUTCH_EXIT_OK;
  const char *id = json_string_value(json_object_get(r.json, "id"));
  if (cli->json || a->json) {
    hutch_print_body(&r);
  } else if (id) {
    printf("%s\n", id);
  } else {
    hutch_errorf("snapshot create: hutchd's reply has no snapshot id");
    rc = HUTCH_EXIT_FAIL;
  }
  if (rc == HUTCH_EXIT_OK && unfinished("snapshot create", a->ids[0], &r) < 0)
    rc = HUTCH_EXIT_FAIL;
  hutch_response_free(&r);
  return rc;
}

static int snap_list(hutch_cli *cli, const hutch_snapshot_args *a) {
  cleanup_free char *path = a->nids ? hutch_id_path("/v1/sandboxes/", a->ids[0], "/snapshots")
                                    : xstrdup("/v1/snapshots");
  cleanup_free char *url = xasprintf("%s%s", path, a->query);
  hutch_response r;
  if (hutch_call(cli, "GET", url, NULL, &r) < 0) return HUTCH_EXIT_FAIL;
  int rc = HUTCH_EXIT_OK;
  json_t *list = json_object_get(r.json, "snapshots");
  if (cli->json || a->json) {
    hutch_print_body(&r);
  } else if (!json_is_array(list)) {
    hutch_errorf("snapshot list: hutchd's reply has no `snapshots` list");
    rc = HUTCH_EXIT_FAIL;
  } else {
    static const char *const header[] = {"ID",   "SANDBOX", "KIND",   "STATE",
                                         "SIZE", "CREATED", "LABELS"};
    hutch_table t;
    hutch_table_init(&t, 7, header);
    size_t i;
    json_t *s;
    json_array_foreach(list, i, s) {
      char *row[7] = {
          hutch_display(json_object_get(s, "id")),
          hutch_display(json_object_get(s, "sandbox")),
          hutch_display(json_object_get(s, "kind")),
          hutch_display(json_object_get(s, "state")),
          /* What deleting it would free. */
          hutch_size_display(json_object_get(s, "exclusive_bytes")),
          hutch_display(json_object_get(s, "created_at")),
          hutch_kv_list(json_object_get(s, "labels")),
      };
      hutch_table_add(&t, row);
    }
    hutch_table_print(&t, stdout);
    hutch_table_free(&t);
  }
  hutch_response_free(&r);
  return rc;
}

static int snap_get(hutch_cli *cli, const hutch_snapshot_args *a) {
  cleanup_free char *path = hutch_id_path("/v1/snapshots/", a->ids[0], NULL);
  hutch_response r;
  if (hutch_call(cli, "GET", path, NULL, &r) < 0) return HUTCH_EXIT_FAIL;
  if (cli->json || a->json) {
    hutch_print_body(&r);
  } else {
    static const char *const inline_fields[] = {"labels", NULL};
    hutch_print_object(r.json, inline_fields, stdout);
  }
  hutch_response_free(&r);
  return HUTCH_EXIT_OK;
}

/* Every snapshot is tried; one failure makes the exit status 1. */
static int snap_delete(hutch_cli *cli, const hutch_snapshot_args *a) {
  int rc = HUTCH_EXIT_OK;
  for (int i = 0; i < a->nids; i++) {
    cleanup_free char *path = hutch_id_path("/v1/snapshots/", a->ids[i], NULL);
    hutch_response r;
    if (hutch_call(cli, "DELETE", path, NULL, &r) < 0) {
      rc = HUTCH_EXIT_FAIL;
      continue;
    }
    if ((cli->json || a->json) && r.len)
      hutch_print_body(&r);
    else if (!(cli->json || a->json))
      printf("%s\n", a->ids[i]);
    fflush(stdout);
    hutch_response_free(&r);
  }
  return rc;
}

/* "hutch: snapshot VERB WHAT: msg", or "hutch: snapshot VERB: msg" when msg
 * already names WHAT. */
static void snap_error(const char *verb, const char *what, const char *msg) {
  if (strstr(msg, what))
    hutch_errorf("snapshot %s: %s", verb, msg);
  else
    hutch_errorf("snapshot %s %s: %s", verb, what, msg);
}

/* A streamed transfer with the usual error printing (snap_error).  With a
 * sink, a 2xx reply has no body; without one, the reply is left in *resp
 * (the caller frees it). */
static int snap_transfer(hutch_cli *cli, const hutch_xfer *x, const char *verb, const char *what,
                         hutch_response *resp) {
  hutch_response r;
  hutch_err err = HUTCH_ERR_INIT;
  if (hutch_transfer(&cli->client, x, &r, &err) < 0) {
    if (strcmp(err.code, "interrupted") == 0 || hutch_stop_signal)
      hutch_errorf("interrupted");
    else
      snap_error(verb, what, err.msg);
    return -1;
  }
  if (hutch_response_check(&r, &err) < 0) {
    snap_error(verb, what, err.msg);
    hutch_response_free(&r);
    return -1;
  }
  if (resp)
    *resp = r;
  else
    hutch_response_free(&r);
  return 0;
}

static int snap_export(hutch_cli *cli, const hutch_snapshot_args *a) {
  const char *snap = a->ids[0];
  bool to_stdout = !a->output || strcmp(a->output, "-") == 0;
  if (to_stdout && isatty(STDOUT_FILENO) == 1) {
    hutch_errorf("snapshot export: stdout is a terminal; use -o FILE or a redirection");
    fputs(snapshot_usage, stderr);
    return HUTCH_EXIT_USAGE;
  }
  cleanup_free char *base = hutch_id_path("/v1/snapshots/", snap, "/export");
  cleanup_free char *path = xasprintf("%s%s", base, a->query);
  cleanup_free char *tmp = NULL;
  hutch_fd_io io = {.fd = STDOUT_FILENO, .what = "stdout", .left = -1};
  if (!to_stdout) {
    tmp = hutch_temp_beside(a->output);
    io.fd = mkostemp(tmp, O_CLOEXEC);
    io.what = a->output;
    if (io.fd < 0) {
      hutch_errorf("%s: %s", a->output, strerror(errno));
      return HUTCH_EXIT_FAIL;
    }
  }
  hutch_catch_stop_signals();
  cli->client.abort_flag = &hutch_stop_signal;
  hutch_xfer x = {.method = "GET",
                  .path = path,
                  .sink = hutch_fd_sink,
                  .sink_ctx = &io,
                  .accept = SNAPSHOT_TYPE ", application/json"};
  int rc = snap_transfer(cli, &x, "export", snap, NULL);
  cli->client.abort_flag = NULL;
  if (!to_stdout) {
    if (close(io.fd) < 0 && rc == 0) {
      hutch_errorf("%s: %s", a->output, strerror(errno));
      rc = -1;
    }
    if (rc == 0 && !hutch_stop_signal && rename(tmp, a->output) < 0) {
      hutch_errorf("%s: %s", a->output, strerror(errno));
      rc = -1;
    }
    if (rc < 0 || hutch_stop_signal) unlink(tmp);
  }
  if (hutch_stop_signal) return 128 + hutch_stop_signal;
  return rc < 0 ? HUTCH_EXIT_FAIL : HUTCH_EXIT_OK;
}

static int snap_import(hutch_cli *cli, const hutch_snapshot_args *a) {
  const char *file = a->ids[0];
  bool from_stdin = strcmp(file, "-") == 0;
  int fd = STDIN_FILENO;
  long long size = -1;
  if (!from_stdin) {
    fd = open(file, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
      hutch_errorf("%s: %s", file, strerror(errno));
      if (fd >= 0) close(fd);
      return HUTCH_EXIT_FAIL;
    }
    if (S_ISDIR(st.st_mode)) {
      hutch_errorf("%s: is a directory", file);
      close(fd);
      return HUTCH_EXIT_FAIL;
    }
    if (S_ISREG(st.st_mode)) size = (long long)st.st_size;
  }
  hutch_catch_stop_signals();
  cli->client.abort_flag = &hutch_stop_signal;
  hutch_fd_io io = {.fd = fd, .what = from_stdin ? "stdin" : file, .left = size};
  hutch_xfer x = {.method = "POST",
                  .path = "/v1/snapshots/import",
                  .source = hutch_fd_source,
                  .source_ctx = &io,
                  .source_size = size,
                  .content_type = SNAPSHOT_TYPE};
  hutch_response r;
  int rc = snap_transfer(cli, &x, "import", from_stdin ? "-" : file, &r);
  cli->client.abort_flag = NULL;
  if (!from_stdin) close(fd);
  if (hutch_stop_signal) {
    if (rc == 0) hutch_response_free(&r);
    return 128 + hutch_stop_signal;
  }
  if (rc < 0) return HUTCH_EXIT_FAIL;
  rc = HUTCH_EXIT_OK;
  const char *id = json_string_value(json_object_get(r.json, "id"));
  if (cli->json || a->json) {
    hutch_print_body(&r);
  } else if (id) {
    printf("%s\n", id);
  } else {
    hutch_errorf("snapshot import: hutchd's reply has no snapshot id");
    rc = HUTCH_EXIT_FAIL;
  }
  hutch_response_free(&r);
  return rc;
}

int hutch_cmd_snapshot(hutch_cli *cli, int argc, char **argv) {
  hutch_err err = HUTCH_ERR_INIT;
  hutch_snapshot_args a;
  int rc;
  if (hutch_parse_snapshot_args(argc, argv, &a, &err) < 0) {
    rc = hutch_usage_fail(snapshot_usage, &err);
  } else if (a.help) {
    rc = hutch_print_help(snapshot_help);
  } else {
    switch (a.action) {
      case HUTCH_SNAP_CREATE: rc = snap_create(cli, &a); break;
      case HUTCH_SNAP_LIST: rc = snap_list(cli, &a); break;
      case HUTCH_SNAP_GET: rc = snap_get(cli, &a); break;
      case HUTCH_SNAP_DELETE: rc = snap_delete(cli, &a); break;
      case HUTCH_SNAP_EXPORT: rc = snap_export(cli, &a); break;
      case HUTCH_SNAP_IMPORT: rc = snap_import(cli, &a); break;
      default: rc = hutch_usage_fail(snapshot_usage, &err); break;
    }
  }
  hutch_snapshot_args_free(&a);
  return rc;
}

/* ---- rollback, fork ------------------------------------------------------------ */

int hutch_cmd_rollback(hutch_cli *cli, int argc, char **argv) {
  hutch_err err = HUTCH_ERR_INIT;
  hutch_body_args a;
  char *path = NULL;
  int rc = HUTCH_EXIT_FAIL;
  if (hutch_parse_rollback_args(argc, argv, &a, &err) < 0) {
    rc = hutch_usage_fail(rollback_usage, &err);
    goto out;
  }
  if (a.help) {
    rc = hutch_print_help(rollback_help);
    goto out;
  }
  path = hutch_id_path("/v1/sandboxes/", a.id, "/rollback?wait=true");
  hutch_response r;
  if (hutch_call(cli, "POST", path, a.body, &r) < 0) goto out;
  if (cli->json || a.json) {
    hutch_print_body(&r);
  } else {
    cleanup_free char *sid = hutch_display(json_object_get(r.json, "id"));
    cleanup_free char *st = hutch_display(json_object_get(r.json, "state"));
    printf("%s %s\n", strcmp(sid, "-") ? sid : a.id, st);
  }
  rc = unfinished("rollback", a.id, &r) < 0 ? HUTCH_EXIT_FAIL : HUTCH_EXIT_OK;
  hutch_response_free(&r);
out:
  free(path);
  hutch_body_args_free(&a);
  return rc;
}

/* The copies of a fork reply that run (their ids on stdout) and those that
 * failed (on stderr, with their operation's error).  Returns how many
 * failed. */
static int fork_report(json_t *reply, bool print_ids) {
  int failed = 0;
  size_t i;
  json_t *sb;
  json_array_foreach(json_object_get(reply, "sandboxes"), i, sb) {
    json_t *op = json_object_get(sb, "operation");
    const char *op_state = json_string_value(json_object_get(op, "state"));
    cleanup_free char *id = hutch_display(json_object_get(sb, "id"));
    if (op_state && strcmp(op_state, "succeeded") == 0) {
      if (print_ids) printf("%s\n", id);
      continue;
    }
    failed++;
    json_t *e = json_object_get(op, "error");
    cleanup_free char *msg =
        hutch_display(json_is_object(e) ? json_object_get(e, "message") : e);
    hutch_errorf("fork: copy %s failed: %s", id, strcmp(msg, "-") ? msg : "no operation result");
  }
  return failed;
}

int hutch_cmd_fork(hutch_cli *cli, int argc, char **argv) {
  hutch_err err = HUTCH_ERR_INIT;
  hutch_body_args a;
  char *path = NULL;
  int rc = HUTCH_EXIT_FAIL;
  if (hutch_parse_fork_args(argc, argv, &a, &err) < 0) {
    rc = hutch_usage_fail(fork_usage, &err);
    goto out;
  }
  if (a.help) {
    rc = hutch_print_help(fork_help);
    goto out;
  }
  bool json = cli->json || a.json;
  path = hutch_id_path("/v1/sandboxes/", a.id, "/fork?wait=true");
  hutch_response r;
  if (hutch_request(&cli->client, "POST", path, a.body, &r, &err) < 0) {
    hutch_errorf("%s", err.msg);
    goto out;
  }
  if (hutch_response_check(&r, &err) < 0) {
    hutch_errorf("%s", err.msg);
    /* Some copies may exist all the same: say which. */
    if (json_is_array(json_object_get(r.json, "sandboxes"))) {
      if (json)
        hutch_print_body(&r);
      fork_report(r.json, !json);
    }
    json_t *accepted = json_object_get(r.json, "accepted");
    if (json_array_size(accepted)) {
      cleanup_free char *ids = hutch_display(accepted);
      hutch_errorf("fork: copies accepted before the failure (delete them with hutch rm): %s",
                   ids);
    }
  } else if (!json_is_array(json_object_get(r.json, "sandboxes"))) {
    hutch_errorf("fork: hutchd's reply has no `sandboxes` list (HTTP %ld)", r.status);
  } else {
    if (json) hutch_print_body(&r);
    rc = fork_report(r.json, !json) ? HUTCH_EXIT_FAIL : HUTCH_EXIT_OK;
  }
  hutch_response_free(&r);
out:
  free(path);
  hutch_body_args_free(&a);
  return rc;
}
