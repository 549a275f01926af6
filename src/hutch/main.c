/* hutch: the command-line client of hutchd.  Global options, then one verb
 * (cmd_*.c).  See `hutch --help` and docs/api.md. */
#include <curl/curl.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "cli.h"

#define DEFAULT_SOCKET "/run/hutch/hutchd.sock"

static const char usage[] =
    "usage: hutch [--socket PATH | --url URL [--api-key KEY]] [--json] COMMAND [ARGS...]\n"
    "Try `hutch --help`.\n";

static const char help[] =
    "usage: hutch [--socket PATH | --url URL [--api-key KEY]] [--json] COMMAND [ARGS...]\n"
    "\n"
    "Commands:\n"
    "  create     create a sandbox and print its id\n"
    "  ls         list sandboxes\n"
    "  get ID     show a sandbox\n"
    "  rm ID...   delete sandboxes\n"
    "  pause      freeze sandboxes; their processes keep their memory\n"
    "  resume     continue paused sandboxes\n"
    "  stop       end sandboxes' processes, keeping their files\n"
    "  start      boot stopped sandboxes again\n"
    "  suspend    save sandboxes and release their processes and resources\n"
    "  restore    start suspended sandboxes again\n"
    "  wake       resume, restore or start sandboxes, whichever applies\n"
    "             (these seven take ID..., wait unless --no-wait, print ID STATE)\n"
    "  exec       run a command in a sandbox, streaming its output (-i, -t, -d)\n"
    "  shell ID   an interactive shell in a sandbox\n"
    "  attach     stream the output of a running or finished command\n"
    "  ps ID      list a sandbox's commands\n"
    "  kill       send a signal to a command\n"
    "  cp         copy files and directories in or out: cp SRC ID:PATH, cp ID:PATH DST\n"
    "  timeout    set when a sandbox expires: timeout ID SECONDS\n"
    "  metrics ID a sandbox's CPU, memory, pids and disk use\n"
    "  run        create a sandbox, run a command in it, delete it\n"
    "  snapshot   snapshots of sandboxes: snapshot create|list|get|delete|export|import\n"
    "  rollback   put a sandbox's files back to a snapshot: rollback ID SNAP\n"
    "  fork       copies of a sandbox that run at once: fork ID [--count N]\n"
    "  template   root filesystems to create from: template list|get|delete|create\n"
    "  storage    hutchd's storage pool: backend, size, use\n"
    "  admin      manage API keys: admin key create|ls|rm\n"
    "  health     check that hutchd answers\n"
    "\n"
    "Global options:\n"
    "  --socket PATH   hutchd's unix socket (default $HUTCH_SOCKET, else " DEFAULT_SOCKET
    ")\n"
    "  --url URL       talk to hutchd over TCP instead (default $HUTCH_URL)\n"
    "  --api-key KEY   API key sent over TCP (default $HUTCH_API_KEY)\n"
    "  --json          print hutchd's JSON replies (also accepted after COMMAND)\n"
    "  -h, --help      this help\n"
    "  --version       print the version\n"
    "\n"
    "`hutch COMMAND --help` shows a command's options.  Without --socket or\n"
    "--url, a non-empty $HUTCH_URL wins over $HUTCH_SOCKET.\n"
    "Exit status: 0 ok, 1 error from hutchd or the connection, 2 usage error;\n"
    "exec, shell, attach and run exit with the command's status (128+N if killed\n"
    "by signal N, 124 if it timed out).\n";

struct verb {
  const char *name;
  int (*fn)(hutch_cli *, int, char **);
};

static const struct verb verbs[] = {
    {"create", hutch_cmd_create}, {"ls", hutch_cmd_ls},
    {"list", hutch_cmd_ls},       {"get", hutch_cmd_get},
    {"rm", hutch_cmd_rm},         {"exec", hutch_cmd_exec},
    {"run", hutch_cmd_run},       {"admin", hutch_cmd_admin},
    {"health", hutch_cmd_health}, {"shell", hutch_cmd_shell},
    {"attach", hutch_cmd_attach}, {"ps", hutch_cmd_ps},
    {"kill", hutch_cmd_kill},     {"cp", hutch_cmd_cp},
    {"timeout", hutch_cmd_timeout}, {"metrics", hutch_cmd_metrics},
    {"pause", hutch_cmd_lifecycle}, {"resume", hutch_cmd_lifecycle},
    {"stop", hutch_cmd_lifecycle},  {"start", hutch_cmd_lifecycle},
    {"suspend", hutch_cmd_lifecycle}, {"restore", hutch_cmd_lifecycle},
    {"wake", hutch_cmd_lifecycle},  {"snapshot", hutch_cmd_snapshot},
    {"rollback", hutch_cmd_rollback}, {"fork", hutch_cmd_fork},
    {"template", hutch_cmd_template}, {"storage", hutch_cmd_storage},
    {NULL, NULL},
};

static const char *env_nonempty(const char *name) {
  const char *v = getenv(name);
  return v && *v ? v : NULL;
}

int main(int argc, char **argv) {
  hutch_err err = HUTCH_ERR_INIT;
  hutch_global_args g;
  if (hutch_parse_global_args(argc, argv, &g, &err) < 0) return hutch_usage_fail(usage, &err);
  if (g.help) return hutch_print_help(help);
  if (g.version) {
    printf("hutch %s\n", HUTCH_VERSION);
    return HUTCH_EXIT_OK;
  }
  if (g.cmd_index >= argc) {
    fputs(usage, stderr);
    return HUTCH_EXIT_USAGE;
  }
  const char *name = argv[g.cmd_index];
  if (strcmp(name, "help") == 0) return hutch_print_help(help);
  const struct verb *v;
  for (v = verbs; v->name; v++)
    if (strcmp(v->name, name) == 0) break;
  if (!v->name) {
    hutch_err_invalid(&err, "unknown command `%s`", name);
    return hutch_usage_fail(usage, &err);
  }

  /* Where hutchd is: flags first, then the environment, then the default. */
  const char *url = g.url, *sock = g.socket;
  if (!url && !sock) {
    url = env_nonempty("HUTCH_URL");
    if (!url) sock = env_nonempty("HUTCH_SOCKET");
    if (!url && !sock) sock = DEFAULT_SOCKET;
  }
  const char *api_key = g.api_key ? g.api_key : env_nonempty("HUTCH_API_KEY");

  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
    hutch_errorf("cannot initialise libcurl");
    return HUTCH_EXIT_FAIL;
  }
  hutch_cli cli = {.json = g.json};
  if (hutch_client_init(&cli.client, url ? NULL : sock, url, api_key, &err) < 0) {
    curl_global_cleanup();
    return err.status == 400 ? hutch_usage_fail(usage, &err)
                             : (hutch_errorf("%s", err.msg), HUTCH_EXIT_FAIL);
  }
  int rc = v->fn(&cli, argc - g.cmd_index, argv + g.cmd_index);
  hutch_client_free(&cli.client);
  curl_global_cleanup();

  /* Output that could not be written is a failure, not a silent loss
   * (`hutch ls > /full/disk`). */
  if (fflush(stdout) != 0 || ferror(stdout)) {
    hutch_errorf("write error on stdout: %s", strerror(errno));
    if (rc == HUTCH_EXIT_OK) rc = HUTCH_EXIT_FAIL;
  }
  return rc;
}
