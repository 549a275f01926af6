/* hutch pause | resume | stop | start | suspend | restore | wake ID...
 *
 * Thin over POST /v1/sandboxes/{id}/{verb}[?wait=true] (docs/api.md
 * "Lifecycle", docs/lifecycle.md).  Every ID is tried in order; one failure
 * makes the exit status 1. */
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "cli.h"
#include "common/util.h"

struct lc_verb {
  const char *name;
  const char *what; /* one line for --help */
};

static const struct lc_verb lc_verbs[] = {
    {"pause", "Freeze every process of each sandbox: they keep their memory and use no CPU."},
    {"resume", "Continue the frozen processes of each paused sandbox where they were."},
    {"stop", "End every process of each sandbox; its files stay."},
    {"start", "Boot each stopped sandbox again from its own files (no processes from before)."},
    {"suspend",
     "Save each sandbox's files and command history and release its processes,\n"
     "memory, cgroup and uid range (processes do not survive a suspend)."},
    {"restore", "Start each suspended sandbox again."},
    {"wake", "Bring each sandbox back to running: resume, restore or start, whichever applies."},
    {NULL, NULL},
};

static const char lc_help_tail[] =
    "\n"
    "  --no-wait   return once hutchd accepted each operation\n"
    "  --json      print hutchd's reply for each sandbox, one per line\n"
    "\n"
    "Prints \"ID STATE\" for each sandbox once its operation is done; with\n"
    "--no-wait, \"ID OPERATION_ID\" as soon as hutchd accepted it (follow it with\n"
    "GET /v1/operations/OPERATION_ID).  A call that does not fit a sandbox's\n"
    "state fails naming the state (see docs/lifecycle.md); repeating one is a\n"
    "no-op.  Every ID is tried; the exit status is 1 if any failed.\n";

/* "hutch: VERB ID: msg", or "hutch: VERB: msg" when msg already names ID. */
static void lc_error(const char *verb, const char *id, const char *msg) {
  if (strstr(msg, id))
    hutch_errorf("%s: %s", verb, msg);
  else
    hutch_errorf("%s %s: %s", verb, id, msg);
}

/* One sandbox.  Returns the exit status for it. */
static int lc_one(hutch_cli *cli, const char *verb, const char *id, bool wait, bool json) {
  hutch_err err = HUTCH_ERR_INIT;
  cleanup_free char *suffix = xasprintf("/%s%s", verb, wait ? "?wait=true" : "");
  cleanup_free char *path = hutch_id_path("/v1/sandboxes/", id, suffix);
  hutch_response r;
  if (hutch_request(&cli->client, "POST", path, NULL, &r, &err) < 0) {
    lc_error(verb, id, err.msg);
    return HUTCH_EXIT_FAIL;
  }
  int rc = HUTCH_EXIT_FAIL;
  if (hutch_response_check(&r, &err) < 0) {
    lc_error(verb, id, err.msg);
    goto out;
  }
  if (!json_is_object(r.json)) {
    hutch_errorf("%s %s: hutchd sent a reply that is not a JSON object (HTTP %ld)", verb, id,
                 r.status);
    goto out;
  }
  json_t *op = json_object_get(r.json, "operation");
  json_t *op_id = json_object_get(op, "id");
  /* 202 under ?wait=true: hutchd's wait bound passed with the operation
   * still running.  The sandbox is not yet where the caller asked. */
  bool unfinished = wait && r.status == 202;
  if (json) {
    hutch_print_body(&r);
  } else {
    cleanup_free char *sid = hutch_display(json_object_get(r.json, "id"));
    cleanup_free char *col =
        !wait && json_is_string(op_id) ? hutch_display(op_id)
                                       : hutch_display(json_object_get(r.json, "state"));
    printf("%s %s\n", strcmp(sid, "-") ? sid : id, col);
  }
  if (unfinished) {
    cleanup_free char *o = hutch_display(op_id);
    hutch_errorf("%s %s: not finished within hutchd's wait bound; operation %s is still running",
                 verb, id, o);
  } else {
    rc = HUTCH_EXIT_OK;
  }
out:
  fflush(stdout);
  hutch_response_free(&r);
  return rc;
}

int hutch_cmd_lifecycle(hutch_cli *cli, int argc, char **argv) {
  hutch_err err = HUTCH_ERR_INIT;
  const char *verb = argv[0];
  const struct lc_verb *v;
  for (v = lc_verbs; v->name; v++)
    if (strcmp(v->name, verb) == 0) break;
  if (!v->name || !hutch_is_lifecycle_verb(verb)) {
    hutch_errorf("unknown lifecycle command `%s`", verb);
    return HUTCH_EXIT_USAGE;
  }
  cleanup_free char *usage = xasprintf("usage: hutch %s [--no-wait] [--json] ID...\n", verb);
  hutch_ids_args a;
  int rc;
  if (hutch_parse_lifecycle_args(argc, argv, &a, &err) < 0) {
    rc = hutch_usage_fail(usage, &err);
  } else if (a.help) {
    fputs(usage, stdout);
    fprintf(stdout, "%s\n", v->what);
    rc = hutch_print_help(lc_help_tail);
  } else {
    rc = HUTCH_EXIT_OK;
    for (int i = 0; i < a.nids; i++)
      if (lc_one(cli, verb, a.ids[i], a.wait, cli->json || a.json) != HUTCH_EXIT_OK)
        rc = HUTCH_EXIT_FAIL;
  }
  hutch_ids_args_free(&a);
  return rc;
}
