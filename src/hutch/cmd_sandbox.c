/* hutch create | ls | get | rm | timeout | metrics */
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "cli.h"
#include "common/util.h"

static const char create_usage[] =
    "usage: hutch create [--template T] [--runtime R] [--cpus N] [--memory MIB] [--pids N]\n"
    "                    [--env K=V]... [--label K=V]... [--timeout SECONDS]\n"
    "                    [--on-timeout delete|suspend] [--from-snapshot SNAP]\n"
    "                    [--snapshot-every SECONDS] [--no-wait]\n";
static const char create_help[] =
    "usage: hutch create [OPTIONS]\n"
    "Create a sandbox, wait until it is running and print its id.\n"
    "\n"
    "  --template T        template (default host)\n"
    "  --runtime R         runtime (default auto: the strongest available)\n"
    "  --cpus N            CPUs, may be fractional (default 1)\n"
    "  --memory MIB        memory limit in MiB (default 512)\n"
    "  --pids N            process limit (default 256)\n"
    "  --env K=V           environment variable for commands (repeatable)\n"
    "  --label K=V         label (repeatable)\n"
    "  --timeout SECONDS   the sandbox expires after this long\n"
    "  --on-timeout WHAT   on expiry: delete (the default) or suspend it\n"
    "  --from-snapshot SNAP\n"
    "                      start on the files of snapshot SNAP (and its template)\n"
    "  --snapshot-every SECONDS\n"
    "                      take an automatic snapshot this often (0: off); older\n"
    "                      ones are pruned by hutchd's retention policy\n"
    "  --no-wait           return once hutchd accepted the request\n"
    "  --json              print hutchd's reply\n";

static const char ls_usage[] = "usage: hutch ls [--label K=V]... [--state S] [--json]\n";
static const char ls_help[] =
    "usage: hutch ls [--label K=V]... [--state S] [--json]\n"
    "List sandboxes; repeated --label filters must all match.\n";

static const char get_usage[] = "usage: hutch get [--json] ID\n";
static const char get_help[] = "usage: hutch get [--json] ID\nShow a sandbox.\n";

static const char rm_usage[] = "usage: hutch rm [--no-wait] [--json] ID...\n";
static const char rm_help[] =
    "usage: hutch rm [--no-wait] [--json] ID...\n"
    "Delete sandboxes and print each id deleted.  Waits until every resource\n"
    "is released unless --no-wait.\n";

int hutch_cmd_create(hutch_cli *cli, int argc, char **argv) {
  hutch_err err = HUTCH_ERR_INIT;
  hutch_create_args a;
  int rc = HUTCH_EXIT_FAIL;
  if (hutch_parse_create_args(argc, argv, &a, &err) < 0) {
    rc = hutch_usage_fail(create_usage, &err);
    goto out;
  }
  if (a.help) {
    rc = hutch_print_help(create_help);
    goto out;
  }
  hutch_response r;
  if (hutch_call(cli, "POST", a.wait ? "/v1/sandboxes?wait=true" : "/v1/sandboxes", a.body, &r) < 0)
    goto out;
  if (cli->json || a.json) {
    hutch_print_body(&r);
    rc = HUTCH_EXIT_OK;
  } else {
    const char *id = json_string_value(json_object_get(r.json, "id"));
    if (id) {
      printf("%s\n", id);
      rc = HUTCH_EXIT_OK;
    } else {
      hutch_errorf("create: hutchd's reply has no sandbox id");
    }
  }
  hutch_response_free(&r);
out:
  hutch_create_args_free(&a);
  return rc;
}

int hutch_cmd_ls(hutch_cli *cli, int argc, char **argv) {
  hutch_err err = HUTCH_ERR_INIT;
  hutch_ls_args a;
  char *path = NULL;
  int rc = HUTCH_EXIT_FAIL;
  if (hutch_parse_ls_args(argc, argv, &a, &err) < 0) {
    rc = hutch_usage_fail(ls_usage, &err);
    goto out;
  }
  if (a.help) {
    rc = hutch_print_help(ls_help);
    goto out;
  }
  path = xasprintf("/v1/sandboxes%s", a.query);
  hutch_response r;
  if (hutch_call(cli, "GET", path, NULL, &r) < 0) goto out;
  json_t *list = json_object_get(r.json, "sandboxes");
  if (cli->json || a.json) {
    hutch_print_body(&r);
    rc = HUTCH_EXIT_OK;
  } else if (!json_is_array(list)) {
    hutch_errorf("ls: hutchd's reply has no `sandboxes` list");
  } else {
    static const char *const header[] = {"ID", "STATE", "TEMPLATE", "RUNTIME", "CREATED", "LABELS"};
    hutch_table t;
    hutch_table_init(&t, 6, header);
    size_t i;
    json_t *sb;
    json_array_foreach(list, i, sb) {
      char *row[6] = {
          hutch_display(json_object_get(sb, "id")),
          hutch_display(json_object_get(sb, "state")),
          hutch_display(json_object_get(sb, "template")),
          hutch_display(json_object_get(sb, "runtime")),
          hutch_display(json_object_get(sb, "created_at")),
          hutch_kv_list(json_object_get(sb, "labels")),
      };
      hutch_table_add(&t, row);
    }
    hutch_table_print(&t, stdout);
    hutch_table_free(&t);
    rc = HUTCH_EXIT_OK;
  }
  hutch_response_free(&r);
out:
  free(path);
  hutch_ls_args_free(&a);
  return rc;
}

int hutch_cmd_get(hutch_cli *cli, int argc, char **argv) {
  hutch_err err = HUTCH_ERR_INIT;
  hutch_ids_args a;
  char *path = NULL;
  int rc = HUTCH_EXIT_FAIL;
  if (hutch_parse_get_args(argc, argv, &a, &err) < 0) {
    rc = hutch_usage_fail(get_usage, &err);
    goto out;
  }
  if (a.help) {
    rc = hutch_print_help(get_help);
    goto out;
  }
  path = hutch_id_path("/v1/sandboxes/", a.ids[0], NULL);
  hutch_response r;
  if (hutch_call(cli, "GET", path, NULL, &r) < 0) goto out;
  if (cli->json || a.json) {
    hutch_print_body(&r);
  } else {
    static const char *const inline_fields[] = {"env", "labels", NULL};
    hutch_print_object(r.json, inline_fields, stdout);
  }
  rc = HUTCH_EXIT_OK;
  hutch_response_free(&r);
out:
  free(path);
  hutch_ids_args_free(&a);
  return rc;
}

int hutch_cmd_rm(hutch_cli *cli, int argc, char **argv) {
  hutch_err err = HUTCH_ERR_INIT;
  hutch_ids_args a;
  int rc = HUTCH_EXIT_FAIL;
  if (hutch_parse_rm_args(argc, argv, &a, &err) < 0) {
    rc = hutch_usage_fail(rm_usage, &err);
    goto out;
  }
  if (a.help) {
    rc = hutch_print_help(rm_help);
    goto out;
  }
  /* Every id is tried; one failure makes the exit status 1. */
  rc = HUTCH_EXIT_OK;
  for (int i = 0; i < a.nids; i++) {
    cleanup_free char *path =
        hutch_id_path("/v1/sandboxes/", a.ids[i], a.wait ? "?wait=true" : NULL);
    hutch_response r;
    if (hutch_call(cli, "DELETE", path, NULL, &r) < 0) {
      rc = HUTCH_EXIT_FAIL;
      continue;
    }
    if (cli->json || a.json)
      hutch_print_body(&r);
    else
      printf("%s\n", a.ids[i]);
    fflush(stdout);
    hutch_response_free(&r);
  }
out:
  hutch_ids_args_free(&a);
  return rc;
}

static const char timeout_usage[] = "usage: hutch timeout [--json] ID SECONDS\n";
static const char timeout_help[] =
    "usage: hutch timeout [--json] ID SECONDS\n"
    "Make the sandbox expire SECONDS from now and print the new expiry time.\n"
    "It is deleted then, or suspended if it was created with --on-timeout suspend.\n";

static const char metrics_usage[] = "usage: hutch metrics [--json] ID\n";
static const char metrics_help[] =
    "usage: hutch metrics [--json] ID\n"
    "Show a sandbox's CPU time, memory (current and peak), pids, OOM kills and\n"
    "disk use.\n";

int hutch_cmd_timeout(hutch_cli *cli, int argc, char **argv) {
  hutch_err err = HUTCH_ERR_INIT;
  hutch_timeout_args a;
  char *path = NULL;
  int rc = HUTCH_EXIT_FAIL;
  if (hutch_parse_timeout_args(argc, argv, &a, &err) < 0) {
    rc = hutch_usage_fail(timeout_usage, &err);
    goto out;
  }
  if (a.help) {
    rc = hutch_print_help(timeout_help);
    goto out;
  }
  path = hutch_id_path("/v1/sandboxes/", a.id, "/timeout");
  hutch_response r;
  if (hutch_call(cli, "POST", path, a.body, &r) < 0) goto out;
  if (cli->json || a.json) {
    hutch_print_body(&r);
  } else {
    cleanup_free char *exp = hutch_display(json_object_get(r.json, "expires_at"));
    printf("%s\n", exp);
  }
  rc = HUTCH_EXIT_OK;
  hutch_response_free(&r);
out:
  free(path);
  hutch_timeout_args_free(&a);
  return rc;
}

int hutch_cmd_metrics(hutch_cli *cli, int argc, char **argv) {
  hutch_err err = HUTCH_ERR_INIT;
  hutch_ids_args a;
  char *path = NULL;
  int rc = HUTCH_EXIT_FAIL;
  if (hutch_parse_one_id_args("metrics", argc, argv, &a, &err) < 0) {
    rc = hutch_usage_fail(metrics_usage, &err);
    goto out;
  }
  if (a.help) {
    rc = hutch_print_help(metrics_help);
    goto out;
  }
  path = hutch_id_path("/v1/sandboxes/", a.ids[0], "/metrics");
  hutch_response r;
  if (hutch_call(cli, "GET", path, NULL, &r) < 0) goto out;
  if (cli->json || a.json)
    hutch_print_body(&r);
  else
    hutch_print_object(r.json, NULL, stdout);
  rc = HUTCH_EXIT_OK;
  hutch_response_free(&r);
out:
  free(path);
  hutch_ids_args_free(&a);
  return rc;
}
