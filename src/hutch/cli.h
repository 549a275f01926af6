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

/* Verbs of the storage API (cmd_storage.c, cmd_snapshot.c). */
int hutch_cmd_template(hutch_cli *cli, int argc, char **argv);
int hutch_cmd_storage(hutch_cli *cli, int argc, char **argv);
int hutch_cmd_snapshot(hutch_cli *cli, int argc, char **argv);
int hutch_cmd_rollback(hutch_cli *cli, int argc, char **argv);
int hutch_cmd_fork(hutch_cli *cli, int argc, char **argv);

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

/* Ctrl-C for the streaming verbs (cp, snapshot export/import, template
 * create): hutch_catch_stop_signals() records the first SIGINT, SIGTERM or
 * SIGHUP in hutch_stop_signal (no SA_RESTART, so a blocked read or sleep
 * returns) and ignores SIGPIPE (a closed pipe is an error to report).  Point
 * client.abort_flag at hutch_stop_signal to abandon a request in flight. */
extern volatile sig_atomic_t hutch_stop_signal;
void hutch_catch_stop_signals(void);

/* A file descriptor as a streamed body: hutch_fd_sink writes a response
 * into fd, hutch_fd_source reads a request body from it (`left` bytes, or
 * until EOF when -1; a regular file that shrinks meanwhile is an error). */
typedef struct hutch_fd_io {
  int fd;
  const char *what; /* for messages */
  long long left;
} hutch_fd_io;
int hutch_fd_sink(void *ctx, const char *data, size_t n, hutch_err *err);
ssize_t hutch_fd_source(void *ctx, char *buf, size_t n, hutch_err *err);

/* A temporary file name next to `dest` (same directory, so that a
 * rename() puts it in place): "DIR/.BASE.hutch-XXXXXX" for mkostemp.
 * Returns a malloc'ed string. */
char *hutch_temp_beside(const char *dest);

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
