/* hutch run: create a sandbox, run one command with the synchronous exec
 * endpoint (POST /v1/sandboxes/{id}/exec), delete the sandbox. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "cli.h"
#include "common/util.h"
#include "wire.h"

static const char run_usage[] =
    "usage: hutch run [--template T] [--runtime R] [--cpus N] [--memory MIB] [--pids N]\n"
    "                 [--label K=V]... [--env K=V]... [--cwd DIR] [--timeout SECONDS] [--sh]\n"
    "                 [--json] -- ARGV...\n";
static const char run_help[] =
    "usage: hutch run [OPTIONS] -- ARGV...\n"
    "Create a sandbox, run one command in it, delete the sandbox (also on\n"
    "failure and on Ctrl-C), and exit with the command's status.\n"
    "\n"
    "  --template T        template (default host)\n"
    "  --runtime R         runtime (default auto)\n"
    "  --cpus N            CPUs, may be fractional\n"
    "  --memory MIB        memory limit in MiB\n"
    "  --pids N            process limit\n"
    "  --label K=V         sandbox label (repeatable)\n"
    "  --env K=V           environment variable for the command (repeatable)\n"
    "  --cwd DIR           working directory\n"
    "  --timeout SECONDS   kill the command after this long (default 60); the\n"
    "                      sandbox itself expires a minute later at the latest\n"
    "  --sh                run one string with /bin/sh -c\n"
    "  --json              print the exec reply instead of the output\n";

static void write_stream(json_t *v, FILE *f) {
  const char *s = json_string_value(v);
  if (s) fwrite(s, 1, json_string_length(v), f);
  fflush(f);
}

/* Prints an exec reply (docs/api.md "Exec") and returns the exit status:
 * see hutch_command_status. */
static int exec_result(const hutch_response *r, bool json) {
  json_t *res = r->json;
  if (!json_is_object(res)) {
    hutch_errorf("exec: hutchd's reply is not a JSON object");
    return HUTCH_EXIT_FAIL;
  }
  json_t *code = json_object_get(res, "exit_code");
  json_t *sig = json_object_get(res, "signal");
  bool timed_out = json_is_true(json_object_get(res, "timed_out"));
  bool truncated = json_is_true(json_object_get(res, "truncated"));
  const char *error = json_string_value(json_object_get(res, "error"));

  int status = hutch_command_status(res);

  if (json) {
    hutch_print_body(r);
    fflush(stdout);
    return status;
  }
  write_stream(json_object_get(res, "stdout"), stdout);
  write_stream(json_object_get(res, "stderr"), stderr);
  if (error && *error) {
    cleanup_free char *e = hutch_display(json_object_get(res, "error"));
    hutch_errorf("%s", e);
  }
  if (timed_out)
    hutch_errorf("command timed out and was killed");
  else if (json_is_integer(sig) && json_integer_value(sig) > 0)
    hutch_errorf("command killed by signal %lld (%s)", (long long)json_integer_value(sig),
                 strsignal((int)json_integer_value(sig)));
  if (truncated)
    hutch_errorf("output truncated: more than max_output_bytes (default 1 MiB) per stream");
  if (!json_is_integer(code) && !json_is_integer(sig) && !timed_out)
    hutch_errorf("exec: hutchd's reply has neither exit_code nor signal");
  return status;
}

/* The first SIGINT/SIGTERM/SIGHUP is recorded here: requests in flight are
 * abandoned (client.abort_flag), the sandbox is deleted, and run exits
 * 128+signal.  A third signal gives up on the deletion at once. */
static volatile sig_atomic_t run_signal;
static volatile sig_atomic_t run_extra_signals;
static char run_giveup_msg[256] = "hutch: interrupted\n";
static volatile sig_atomic_t run_giveup_len = 19;

static void run_on_signal(int sig) {
  if (!run_signal) {
    run_signal = sig;
    return;
  }
  if (++run_extra_signals >= 2) {
    ssize_t w = write(STDERR_FILENO, run_giveup_msg, (size_t)run_giveup_len);
    (void)w;
    _exit(128 + run_signal);
  }
}

static void run_set_giveup_msg(const char *id) {
  sigset_t all, old;
  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, &old);
  int n = snprintf(run_giveup_msg, sizeof run_giveup_msg,
                   "hutch: interrupted; sandbox %s may be left behind (hutch rm %s)\n", id, id);
  run_giveup_len = n < 0 ? 0 : n >= (int)sizeof run_giveup_msg ? (int)sizeof run_giveup_msg - 1 : n;
  sigprocmask(SIG_SETMASK, &old, NULL);
}

static void run_install_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = run_on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0; /* no SA_RESTART: curl's poll() wakes up and sees the flag */
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
}

/* Like hutch_call, but an interrupted request returns -2 without a message. */
static int run_call(hutch_cli *cli, const char *method, const char *path, json_t *body,
                    hutch_response *r) {
  hutch_err err = HUTCH_ERR_INIT;
  if (hutch_request(&cli->client, method, path, body, r, &err) < 0) {
    if (strcmp(err.code, "interrupted") == 0) return -2;
    hutch_errorf("%s", err.msg);
    return -1;
  }
  if (hutch_response_check(r, &err) < 0 || (r->len && !r->json)) {
    if (r->len && !r->json && r->status / 100 == 2)
      hutch_errorf("%s %s: hutchd sent a reply that is not JSON (HTTP %ld)", method, path,
                   r->status);
    else
      hutch_errorf("%s", err.msg);
    hutch_response_free(r);
    return -1;
  }
  return 0;
}

/* Wait for the create operation.  0: succeeded; -1: failed (printed);
 * -2: interrupted. */
static int run_wait_created(hutch_cli *cli, const char *id, const char *op) {
  cleanup_free char *path = hutch_id_path("/v1/operations/", op, "?wait=300");
  for (;;) {
    hutch_response r;
    uint64_t started = mono_us();
    int c = run_call(cli, "GET", path, NULL, &r);
    if (c < 0) return c;
    const char *state = json_string_value(json_object_get(r.json, "state"));
    int ret = 1;
    if (state && strcmp(state, "succeeded") == 0) {
      ret = 0;
    } else if (state && strcmp(state, "failed") == 0) {
      json_t *e = json_object_get(r.json, "error");
      cleanup_free char *msg = hutch_display(json_object_get(e, "message"));
      cleanup_free char *code = hutch_display(json_object_get(e, "code"));
      hutch_errorf("create sandbox %s failed: %s (%s)", id, msg, code);
      ret = -1;
    } else if (!state) {
      hutch_errorf("create sandbox %s: operation %s has no state", id, op);
      ret = -1;
    }
    hutch_response_free(&r);
    if (ret <= 0) return ret;
    if (run_signal) return -2;
    /* Unfinished although ?wait did not block: do not spin on hutchd. */
    if (mono_us() - started < 200000) usleep(200000);
  }
}

/* Delete the sandbox and wait until it is gone.  While its creation is
 * still under way hutchd may answer 409; then wait for the create
 * operation (or a second) and try again.  404 means already gone. */
static int run_delete(hutch_cli *cli, const char *id, const char *op) {
  cleanup_free char *path = hutch_id_path("/v1/sandboxes/", id, "?wait=true");
  cleanup_free char *op_path = op ? hutch_id_path("/v1/operations/", op, "?wait=10") : NULL;
  hutch_err err = HUTCH_ERR_INIT;
  for (int attempt = 0; attempt < 60; attempt++) {
    hutch_response r;
    if (hutch_request(&cli->client, "DELETE", path, NULL, &r, &err) < 0) break;
    long status = r.status;
    if ((status >= 200 && status < 300) || status == 404) {
      hutch_response_free(&r);
      return 0;
    }
    hutch_response_check(&r, &err);
    hutch_response_free(&r);
    if (status != 409) break;
    bool waited = false;
    if (op_path && hutch_request(&cli->client, "GET", op_path, NULL, &r, &err) == 0) {
      const char *state = json_string_value(json_object_get(r.json, "state"));
      /* Still unfinished after ?wait=10: the wait was the pause. */
      waited = r.status == 200 && state &&
               (strcmp(state, "pending") == 0 || strcmp(state, "running") == 0);
      hutch_response_free(&r);
    }
    if (!waited) sleep(1);
  }
  hutch_errorf("could not delete sandbox %s: %s", id, err.msg);
  hutch_errorf("delete it with: hutch rm %s", id);
  return -1;
}

int hutch_cmd_run(hutch_cli *cli, int argc, char **argv) {
  hutch_err err = HUTCH_ERR_INIT;
  hutch_run_args a;
  char *id = NULL, *op = NULL, *exec_path = NULL;
  int rc = HUTCH_EXIT_FAIL;
  if (hutch_parse_run_args(argc, argv, &a, &err) < 0) {
    rc = hutch_usage_fail(run_usage, &err);
    goto out;
  }
  if (a.help) {
    rc = hutch_print_help(run_help);
    goto out;
  }
  run_install_signals();

  /* Create without ?wait=true: the 202 names the sandbox at once, so that
   * an interrupt at any later point knows what to delete.  The POST itself
   * is not abandoned on a signal (it returns quickly): abandoning it could
   * leave a sandbox whose id we never learnt. */
  hutch_response r;
  cli->client.abort_flag = NULL;
  if (run_call(cli, "POST", "/v1/sandboxes", a.create, &r) < 0) goto out;
  id = xstrdup(json_string_value(json_object_get(r.json, "id")) ?: "");
  const char *op_id =
      json_string_value(json_object_get(json_object_get(r.json, "operation"), "id"));
  op = op_id ? xstrdup(op_id) : NULL;
  hutch_response_free(&r);
  if (!*id) {
    hutch_errorf("create: hutchd's reply has no sandbox id");
    goto out;
  }
  run_set_giveup_msg(id);
  cli->client.abort_flag = &run_signal;

  int c = run_signal ? -2 : 0;
  if (c == 0 && op) c = run_wait_created(cli, id, op);
  if (c == 0 && run_signal) c = -2;
  if (c == 0) {
    exec_path = hutch_id_path("/v1/sandboxes/", id, "/exec");
    c = run_call(cli, "POST", exec_path, a.exec, &r);
    if (c == 0) {
      rc = exec_result(&r, cli->json || a.json);
      hutch_response_free(&r);
    }
  }

  cli->client.abort_flag = NULL;
  if (run_signal) hutch_errorf("interrupted; deleting sandbox %s", id);
  run_delete(cli, id, op);

out:
  if (run_signal) rc = 128 + run_signal;
  free(id);
  free(op);
  free(exec_path);
  hutch_run_args_free(&a);
  return rc;
}
