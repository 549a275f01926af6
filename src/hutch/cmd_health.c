/* hutch health: GET /healthz. */
#include "args.h"
#include "cli.h"

static const char health_usage[] = "usage: hutch health [--json]\n";
static const char health_help[] =
    "usage: hutch health [--json]\n"
    "Check that hutchd answers; show its version and runtimes.\n";

int hutch_cmd_health(hutch_cli *cli, int argc, char **argv) {
  hutch_err err = HUTCH_ERR_INIT;
  hutch_plain_args a;
  if (hutch_parse_plain_args(argc, argv, &a, &err) < 0) return hutch_usage_fail(health_usage, &err);
  if (a.help) return hutch_print_help(health_help);
  hutch_response r;
  if (hutch_call(cli, "GET", "/healthz", NULL, &r) < 0) return HUTCH_EXIT_FAIL;
  if (cli->json || a.json)
    hutch_print_body(&r);
  else
    hutch_print_object(r.json, NULL, stdout);
  hutch_response_free(&r);
  return HUTCH_EXIT_OK;
}
