/* Command-line parsing for the `hutch` CLI.
 *
 * Pure functions: they turn argv into request bodies and flags and never
 * print, touch the network or exit, so tests/unit/test_cli_args.c can check
 * them directly.  A parse function returns 0, or -1 with `err` holding a
 * one-line message for a usage error (the caller prints it and exits 2).
 * When `--help` is seen, parsing stops with `help` set and 0 returned.
 *
 * Option syntax: `--name VALUE` or `--name=VALUE`, `-h`; `--` ends the
 * options.  For commands that take a command line (exec, run) the options
 * end at `--` or at the first word of that command line, so that
 * `hutch exec sb_x ls -l` runs `ls -l`.
 */
#ifndef HUTCH_CLI_ARGS_H
#define HUTCH_CLI_ARGS_H

#include <jansson.h>
#include <stdbool.h>

#include "common/err.h"

enum { HUTCH_ARG_END = 0, HUTCH_ARG_POSITIONAL = 1 };

typedef struct hutch_opt {
  const char *name; /* long name without "--" */
  char short_name;  /* 0 for none */
  bool has_arg;
  int key; /* returned by hutch_argp_next; must be > HUTCH_ARG_POSITIONAL */
} hutch_opt;

typedef struct hutch_argp {
  int argc;
  char **argv;
  const hutch_opt *opts; /* terminated by an entry with name == NULL */
  /* -1: positionals may be mixed with options anywhere before `--`.
   * n >= 0: after n positionals, the next positional or `--` ends parsing
   * and i is left at the first word that was not parsed. */
  int max_positional;
  int i;
  int npos;
  bool only_positional; /* after `--` when max_positional < 0 */
  bool done;
  const char *cluster; /* rest of a short-option cluster (-it) still to parse */
  const char *arg; /* value of the last option, or the positional */
} hutch_argp;

/* Parsing starts at argv[1] (argv[0] is the program or command name). */
void hutch_argp_init(hutch_argp *p, int argc, char **argv, const hutch_opt *opts,
                     int max_positional);
/* Returns an option's key, HUTCH_ARG_POSITIONAL (p->arg is the word),
 * HUTCH_ARG_END (p->i: first word not parsed), or -1 with err set. */
int hutch_argp_next(hutch_argp *p, hutch_err *err);

/* `K=V` for --env/--label: K non-empty, split at the first '=', V may be
 * empty; both must be valid UTF-8 (JSON strings).  Sets obj[K] = V. */
int hutch_parse_kv(const char *opt, const char *s, json_t *obj, hutch_err *err);
/* Decimal integer in [0, max]. */
int hutch_parse_int(const char *opt, const char *s, long long max, long long *out, hutch_err *err);
/* A positive decimal number such as 2 or 0.5 (no sign, exponent, hex, inf). */
int hutch_parse_number(const char *opt, const char *s, double *out, hutch_err *err);

/* Percent-encode s for a URL path segment (keep = NULL) or a query value
 * (keep = "=/" keeps those too).  Unreserved characters are kept.
 * Returns a malloc'ed string. */
char *hutch_url_escape(const char *s, const char *keep);

typedef struct hutch_global_args {
  const char *socket;  /* --socket, NULL if not given */
  const char *url;     /* --url */
  const char *api_key; /* --api-key */
  bool json, help, version;
  int cmd_index; /* argv index of the command; argc when there is none */
} hutch_global_args;
int hutch_parse_global_args(int argc, char **argv, hutch_global_args *g, hutch_err *err);

/* hutch create: body is the POST /v1/sandboxes request (--on-timeout sets
 * "on_timeout": "delete" or "suspend"; --from-snapshot sets "from_snapshot";
 * --snapshot-every N sets "snapshots": {"interval_s": N}). */
typedef struct hutch_create_args {
  json_t *body;
  bool wait;
  bool json, help;
} hutch_create_args;
int hutch_parse_create_args(int argc, char **argv, hutch_create_args *a, hutch_err *err);
void hutch_create_args_free(hutch_create_args *a);

/* hutch exec: body is the POST /v1/sandboxes/{id}/commands request, with
 * "argv" (or "cmd" with --sh) filled in, "stdin": true with -i.  The PTY
 * size ("pty") depends on the terminal and is added when the command
 * starts. */
typedef struct hutch_exec_args {
  json_t *body;
  const char *id; /* points into argv */
  bool interactive; /* -i: forward stdin */
  bool tty;         /* -t: a PTY */
  bool detach;      /* -d: start, print the id and token, do not attach */
  bool json, help;
} hutch_exec_args;
int hutch_parse_exec_args(int argc, char **argv, hutch_exec_args *a, hutch_err *err);
/* hutch shell ID [-- ARGV...]: exec -it, argv defaulting to bash -l. */
#define HUTCH_SHELL_ARGV "/bin/bash", "-l"
int hutch_parse_shell_args(int argc, char **argv, hutch_exec_args *a, hutch_err *err);
void hutch_exec_args_free(hutch_exec_args *a);

/* hutch attach ID CMD_ID / hutch kill ID CMD_ID (ids point into argv).
 * kill: body is the POST .../signal request ({"signal":"TERM"} by
 * default; a number is sent as a JSON integer). */
typedef struct hutch_cmd_args {
  const char *id, *cmd_id;
  bool replay; /* attach: false with --no-replay */
  json_t *body;
  bool json, help;
} hutch_cmd_args;
int hutch_parse_attach_args(int argc, char **argv, hutch_cmd_args *a, hutch_err *err);
int hutch_parse_kill_args(int argc, char **argv, hutch_cmd_args *a, hutch_err *err);
void hutch_cmd_args_free(hutch_cmd_args *a);

/* hutch timeout ID SECONDS: body is {"timeout_s":N}. */
typedef struct hutch_timeout_args {
  const char *id;
  json_t *body;
  bool json, help;
} hutch_timeout_args;
int hutch_parse_timeout_args(int argc, char **argv, hutch_timeout_args *a, hutch_err *err);
void hutch_timeout_args_free(hutch_timeout_args *a);

/* hutch cp SRC DST: exactly one side is SANDBOX_ID:PATH (a word with a ':'
 * whose part before the first ':' is non-empty and has no '/'; write
 * ./a:b for a local file named a:b).  The local side may be "-" (stdin or
 * stdout). */
typedef struct hutch_cp_args {
  char *id;           /* malloc'ed */
  const char *remote; /* path inside the sandbox (points into argv) */
  const char *local;  /* local path or "-" */
  bool upload;        /* local -> sandbox */
  bool json, help;
} hutch_cp_args;
int hutch_parse_cp_args(int argc, char **argv, hutch_cp_args *a, hutch_err *err);
void hutch_cp_args_free(hutch_cp_args *a);
/* Splits "ID:PATH": returns true and sets *id (malloc'ed) and *path for a
 * sandbox path, false for a local one. */
bool hutch_cp_split(const char *arg, char **id, const char **path);

/* hutch run: create options go to `create`, the command and its --env,
 * --cwd, --timeout to `exec`.  --timeout N also sets the sandbox's own
 * timeout_s to N + HUTCH_RUN_TIMEOUT_GRACE_S, so that hutchd reaps the
 * sandbox if this client dies without deleting it, but never before the
 * command's own deadline. */
#define HUTCH_RUN_TIMEOUT_GRACE_S 60
typedef struct hutch_run_args {
  json_t *create;
  json_t *exec;
  bool json, help;
} hutch_run_args;
int hutch_parse_run_args(int argc, char **argv, hutch_run_args *a, hutch_err *err);
void hutch_run_args_free(hutch_run_args *a);

/* hutch ls: query is "" or "?label=k=v&state=s" (escaped). */
typedef struct hutch_ls_args {
  char *query;
  bool json, help;
} hutch_ls_args;
int hutch_parse_ls_args(int argc, char **argv, hutch_ls_args *a, hutch_err *err);
void hutch_ls_args_free(hutch_ls_args *a);

/* hutch get ID / hutch rm ID... (ids point into argv). */
typedef struct hutch_ids_args {
  const char **ids;
  int nids;
  bool wait; /* rm: false with --no-wait */
  bool json, help;
} hutch_ids_args;
int hutch_parse_get_args(int argc, char **argv, hutch_ids_args *a, hutch_err *err);
int hutch_parse_rm_args(int argc, char **argv, hutch_ids_args *a, hutch_err *err);
/* hutch pause|resume|stop|start|suspend|restore|wake [--no-wait] [--json]
 * ID...: argv[0] is the verb.  Same shape as rm. */
int hutch_parse_lifecycle_args(int argc, char **argv, hutch_ids_args *a, hutch_err *err);
/* The lifecycle verbs, NULL-terminated, in the order of docs/api.md; each is
 * also the last path segment of POST /v1/sandboxes/{id}/{verb}. */
extern const char *const hutch_lifecycle_verbs[];
bool hutch_is_lifecycle_verb(const char *name);
/* Verbs that take exactly one sandbox ID (ps, metrics); `verb` names it in
 * messages. */
int hutch_parse_one_id_args(const char *verb, int argc, char **argv, hutch_ids_args *a,
                            hutch_err *err);
void hutch_ids_args_free(hutch_ids_args *a);

/* hutch admin key create|ls|rm: argv[0] is "admin". */
enum hutch_key_action { HUTCH_KEY_NONE, HUTCH_KEY_CREATE, HUTCH_KEY_LS, HUTCH_KEY_RM };
typedef struct hutch_admin_args {
  enum hutch_key_action action;
  const char *name; /* create --name */
  const char *id;   /* rm ID */
  bool json, help;
} hutch_admin_args;
int hutch_parse_admin_args(int argc, char **argv, hutch_admin_args *a, hutch_err *err);

/* hutch template list | get NAME | delete NAME | create NAME --source S ...
 * create: body is the POST /v1/templates request.  --from-snapshot implies
 * --source snapshot and --oci --source oci; --suite, --mirror, --package
 * apply to debian only, --image to oci only.  --oci's PATH goes into
 * "path" as given: the command makes it absolute before sending. */
enum hutch_tpl_action {
  HUTCH_TPL_NONE,
  HUTCH_TPL_LIST,
  HUTCH_TPL_GET,
  HUTCH_TPL_DELETE,
  HUTCH_TPL_CREATE
};
typedef struct hutch_template_args {
  enum hutch_tpl_action action;
  const char *name; /* get, delete, create (points into argv) */
  json_t *body;     /* create */
  bool wait;        /* create: false with --no-wait */
  bool json, help;
} hutch_template_args;
int hutch_parse_template_args(int argc, char **argv, hutch_template_args *a, hutch_err *err);
void hutch_template_args_free(hutch_template_args *a);

/* hutch snapshot create ID [--label K=V]... | list [ID] [--kind K] |
 * get SNAP | delete SNAP... | export SNAP [-o FILE] [--parent SNAP |
 * --incremental] | import FILE. */
enum hutch_snap_action {
  HUTCH_SNAP_NONE,
  HUTCH_SNAP_CREATE,
  HUTCH_SNAP_LIST,
  HUTCH_SNAP_GET,
  HUTCH_SNAP_DELETE,
  HUTCH_SNAP_EXPORT,
  HUTCH_SNAP_IMPORT
};
typedef struct hutch_snapshot_args {
  enum hutch_snap_action action;
  /* The words after the action (point into argv): create: the sandbox ID;
   * list: the sandbox ID or none; get, export: the snapshot; delete: one or
   * more snapshots; import: the file ("-" for stdin). */
  const char **ids;
  int nids;
  json_t *body;       /* create: {"labels": {...}} ({} without --label) */
  char *query;        /* list: "" or "?kind=K"; export: "", "?parent=P" or "?incremental=true" */
  const char *output; /* export -o FILE ("-" or NULL: stdout) */
  bool json, help;
} hutch_snapshot_args;
int hutch_parse_snapshot_args(int argc, char **argv, hutch_snapshot_args *a, hutch_err *err);
void hutch_snapshot_args_free(hutch_snapshot_args *a);

/* hutch rollback ID SNAP: body {"snapshot": SNAP}.
 * hutch fork ID [--count N] [--snapshot SNAP] [--label K=V]...: body
 * {"count": N, "snapshot": SNAP, "labels": {...}} (only what was given). */
typedef struct hutch_body_args {
  const char *id; /* the sandbox (points into argv) */
  json_t *body;
  bool json, help;
} hutch_body_args;
int hutch_parse_rollback_args(int argc, char **argv, hutch_body_args *a, hutch_err *err);
int hutch_parse_fork_args(int argc, char **argv, hutch_body_args *a, hutch_err *err);
void hutch_body_args_free(hutch_body_args *a);

/* Commands without options of their own (health, storage): only --json and
 * --help. */
typedef struct hutch_plain_args {
  bool json, help;
} hutch_plain_args;
int hutch_parse_plain_args(int argc, char **argv, hutch_plain_args *a, hutch_err *err);

#endif
