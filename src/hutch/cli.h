/* The `hutch` command-line front end: one file per verb (cmd_*.c), shared
 * helpers in cli.c, HTTP in client.c, argv parsing in args.c.
 *
 * Exit status: 0 success, 1 hutchd or transport error, 2 usage error; exec,
 * shell, attach and run exit with the command's own status (128+N when
 * killed by signal N, 124 when it timed out). */
#ifndef HUTCH_CLI_H
#define HUTCH_CLI_H

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>

#include "client.h"
#include "common/err.h"

#ifndef HUTCH_VERSION
#define HUTCH_VERSION "0.1.0"
#endif

#define HUTCH_EXIT_OK 0
#define HUTCH_EXIT_FAIL 1
#define HUTCH_EXIT_USAGE 2

typedef struct hutch_cli {
  hutch_client client;
  bool json; /* global --json */
} hutch_cli;

/* Verbs: argv[0] is the verb itself.  Each returns the process exit status. */
int hutch_cmd_create(hutch_cli *cli, int argc, char **argv);
int hutch_cmd_ls(hutch_cli *cli, int argc, char **argv);
int hutch_cmd_get(hutch_cli *cli, int argc, char **argv);
int hutch_cmd_rm(hutch_cli *cli, int argc, char **argv);
/* pause, resume, stop, start, suspend, restore, wake (argv[0] says which). */
int hutch_cmd_lifecycle(hutch_cli *cli, int argc, char **argv);
int hutch_cmd_exec(hutch_cli *cli, int argc, char **argv);
int hutch_cmd_run(hutch_cli *cli, int argc, char **argv);
int hutch_cmd_shell(hutch_cli *cli, int argc, char **argv);
int hutch_cmd_attach(hutch_cli *cli, int argc, char **argv);
int hutch_cmd_ps(hutch_cli *cli, int argc, char **argv);
int hutch_cmd_kill(hutch_cli *cli, int argc, char **argv);
int hutch_cmd_cp(hutch_cli *cli, int argc, char **argv);
int hutch_cmd_timeout(hutch_cli *cli, int argc, char **argv);
int hutch_cmd_metrics(hutch_cli *cli, int argc, char **argv);
int hutch_cmd_admin(hutch_cli *cli, int argc, char **argv);
int hutch_cmd_health(hutch_cli *cli, int argc, char **argv);

/* "hutch: <msg>" on stderr. */
void hutch_errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Usage error: "hutch: <err>", the usage line, a pointer to --help, on
 * stderr.  Returns HUTCH_EXIT_USAGE. */
int hutch_usage_fail(const char *usage, const hutch_err *err);
/* `help` on stdout; returns HUTCH_EXIT_OK. */
int hutch_print_help(const char *help);

/* Request + status check: on a transport failure or a non-2xx reply prints
 * the error and returns -1 (resp then holds nothing); a 2xx reply whose
 * body is not JSON is also an error.  On 0 the caller frees resp. */
int hutch_call(hutch_cli *cli, const char *method, const char *path, json_t *body,
               hutch_response *resp);

/* The raw response body on stdout, newline-terminated (--json). */
void hutch_print_body(const hutch_response *resp);

/* prefix + the id percent-escaped as one path segment + suffix (may be NULL). */
char *hutch_id_path(const char *prefix, const char *id, const char *suffix);

/* A JSON scalar as display text ("-" for null/missing), with control
 * characters replaced so that hutchd data cannot drive the terminal.
 * Returns a malloc'ed string. */
char *hutch_display(json_t *v);

/* Columns for `ls`-style output: column widths from the widest cell. */
typedef struct hutch_table {
  size_t ncols, nrows;
  char **cells; /* nrows * ncols, owned */
} hutch_table;
void hutch_table_init(hutch_table *t, size_t ncols, const char *const *header);
/* Takes ownership of the ncols malloc'ed strings in `row`. */
void hutch_table_add(hutch_table *t, char **row);
void hutch_table_print(const hutch_table *t, FILE *f);
void hutch_table_free(hutch_table *t);

/* An object as aligned "key: value" lines, nested objects flattened with
 * dotted keys (resources.cpus); `inline_objects` names fields printed on one
 * line as k=v,k=v (labels, env). */
void hutch_print_object(json_t *obj, const char *const *inline_objects, FILE *f);
/* A string->string object as "k=v,k2=v2" (display-safe); "-" when empty. */
char *hutch_kv_list(json_t *obj);

#endif
