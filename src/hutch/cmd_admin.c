/* hutch admin key create | ls | rm  (API keys; unix socket only) */
#include <stdlib.h>

#include "args.h"
#include "cli.h"
#include "common/util.h"

static const char admin_usage[] =
    "usage: hutch admin key create [--name NAME] | hutch admin key ls | hutch admin key rm ID\n";
static const char admin_help[] =
    "usage: hutch admin key create [--name NAME]   create an API key and print it\n"
    "       hutch admin key ls                     list API keys\n"
    "       hutch admin key rm ID                  revoke an API key\n"
    "API keys authenticate TCP clients (hutch --url); they are managed only\n"
    "over the unix socket.  A key is shown once, when it is created.\n";

static int key_create(hutch_cli *cli, const hutch_admin_args *a) {
  json_t *body = json_object();
  if (a->name) json_object_set_new(body, "name", json_string(a->name));
  hutch_response r;
  int c = hutch_call(cli, "POST", "/v1/admin/keys", body, &r);
  json_decref(body);
  if (c < 0) return HUTCH_EXIT_FAIL;
  int rc = HUTCH_EXIT_OK;
  if (cli->json || a->json) {
    hutch_print_body(&r);
  } else {
    const char *key = json_string_value(json_object_get(r.json, "key"));
    if (key) {
      /* Only the key on stdout, so that KEY=$(hutch admin key create) works. */
      printf("%s\n", key);
      cleanup_free char *id = hutch_display(json_object_get(r.json, "id"));
      hutch_errorf("created API key %s; this is the only time the key is shown, store it now", id);
    } else {
      hutch_errorf("admin key create: hutchd's reply has no key");
      rc = HUTCH_EXIT_FAIL;
    }
  }
  hutch_response_free(&r);
  return rc;
}

static int key_ls(hutch_cli *cli, const hutch_admin_args *a) {
  hutch_response r;
  if (hutch_call(cli, "GET", "/v1/admin/keys", NULL, &r) < 0) return HUTCH_EXIT_FAIL;
  int rc = HUTCH_EXIT_OK;
  json_t *keys = json_object_get(r.json, "keys");
  if (cli->json || a->json) {
    hutch_print_body(&r);
  } else if (!json_is_array(keys)) {
    hutch_errorf("admin key ls: hutchd's reply has no `keys` list");
    rc = HUTCH_EXIT_FAIL;
  } else {
    static const char *const header[] = {"ID", "NAME", "CREATED"};
    hutch_table t;
    hutch_table_init(&t, 3, header);
    size_t i;
    json_t *k;
    json_array_foreach(keys, i, k) {
      char *row[3] = {
          hutch_display(json_object_get(k, "id")),
          hutch_display(json_object_get(k, "name")),
          hutch_display(json_object_get(k, "created_at")),
      };
      hutch_table_add(&t, row);
    }
    hutch_table_print(&t, stdout);
    hutch_table_free(&t);
  }
  hutch_response_free(&r);
  return rc;
}

static int key_rm(hutch_cli *cli, const hutch_admin_args *a) {
  cleanup_free char *path = hutch_id_path("/v1/admin/keys/", a->id, NULL);
  hutch_response r;
  if (hutch_call(cli, "DELETE", path, NULL, &r) < 0) return HUTCH_EXIT_FAIL;
  if ((cli->json || a->json) && r.len)
    hutch_print_body(&r);
  else if (!(cli->json || a->json))
    printf("%s\n", a->id);
  hutch_response_free(&r);
  return HUTCH_EXIT_OK;
}

int hutch_cmd_admin(hutch_cli *cli, int argc, char **argv) {
  hutch_err err = HUTCH_ERR_INIT;
  hutch_admin_args a;
  if (hutch_parse_admin_args(argc, argv, &a, &err) < 0) return hutch_usage_fail(admin_usage, &err);
  if (a.help) return hutch_print_help(admin_help);
  switch (a.action) {
    case HUTCH_KEY_CREATE: return key_create(cli, &a);
    case HUTCH_KEY_LS: return key_ls(cli, &a);
    case HUTCH_KEY_RM: return key_rm(cli, &a);
    default: return hutch_usage_fail(admin_usage, &err);
  }
}
