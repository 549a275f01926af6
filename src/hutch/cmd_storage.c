/* hutch template list | get | delete | create, and hutch storage
 * (docs/api.md "Storage": GET|POST /v1/templates, GET|DELETE
 * /v1/templates/{name}, GET /v1/storage).
 *
 * `template create` waits by default: it POSTs without ?wait (so that the
 * request does not hold a connection for a long debootstrap) and polls GET
 * /v1/templates/{name} every POLL_MS, showing the build's progress on
 * stderr. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "args.h"
#include "cli.h"
#include "common/util.h"
#include "wire.h"

#define POLL_MS 500

static const char template_usage[] =
    "usage: hutch template list | get NAME | delete NAME\n"
    "       hutch template create NAME --source host|busybox|debian|oci|snapshot\n"
    "             [--suite S] [--mirror URL] [--package P]... [--oci PATH] [--image REF]\n"
    "             [--from-snapshot SNAP] [--no-wait] [--json]\n";
static const char template_help[] =
    "usage: hutch template list                   list templates\n"
    "       hutch template get NAME               show a template\n"
    "       hutch template delete NAME            delete a template, print its name\n"
    "       hutch template create NAME [OPTIONS]  build a template, print its name\n"
    "\n"
    "Templates are the root filesystems sandboxes start from (hutch create\n"
    "--template NAME).  create options:\n"
    "  --source S           host, busybox, debian, oci or snapshot\n"
    "  --suite S            debian: the suite (default bookworm)\n"
    "  --mirror URL         debian: the mirror, http:// or https://\n"
    "  --package P          debian: an extra package (repeatable)\n"
    "  --oci PATH           a docker-save tarball or an OCI layout (directory or\n"
    "                       tar) on this host; implies --source oci\n"
    "  --image REF          oci: which image of the archive (a name or tag)\n"
    "  --from-snapshot SNAP a snapshot's files; implies --source snapshot\n"
    "  --no-wait            return once hutchd accepted the build\n"
    "  --json               print hutchd's reply (create: the finished template)\n"
    "\n"
    "create waits until the template is ready, showing the build's progress on\n"
    "stderr; Ctrl-C stops waiting, not the build (see `hutch template get NAME`).\n"
    "It exits 1 with the build's error if the build fails.\n";

static const char storage_usage[] = "usage: hutch storage [--json]\n";
static const char storage_help[] =
    "usage: hutch storage [--json]\n"
    "Show hutchd's storage pool: its backend (btrfs, or overlay with the reason\n"
    "for the fallback), where it lives, whether quotas are on, its size and use\n"
    "in bytes.\n";

static int template_list(hutch_cli *cli, const hutch_template_args *a) {
  hutch_response r;
  if (hutch_call(cli, "GET", "/v1/templates", NULL, &r) < 0) return HUTCH_EXIT_FAIL;
  int rc = HUTCH_EXIT_OK;
  json_t *list = json_object_get(r.json, "templates");
  if (cli->json || a->json) {
    hutch_print_body(&r);
  } else if (!json_is_array(list)) {
    hutch_errorf("template list: hutchd's reply has no `templates` list");
    rc = HUTCH_EXIT_FAIL;
  } else {
    static const char *const header[] = {"NAME", "STATE", "SOURCE", "SIZE", "CREATED"};
    hutch_table t;
    hutch_table_init(&t, 5, header);
    size_t i;
    json_t *tpl;
    json_array_foreach(list, i, tpl) {
      char *row[5] = {
          hutch_display(json_object_get(tpl, "name")),
          hutch_display(json_object_get(tpl, "state")),
          hutch_display(json_object_get(json_object_get(tpl, "source"), "source")),
          hutch_size_display(json_object_get(tpl, "size_bytes")),
          hutch_display(json_object_get(tpl, "created_at")),
      };
      hutch_table_add(&t, row);
    }
    hutch_table_print(&t, stdout);
    hutch_table_free(&t);
  }
  hutch_response_free(&r);
  return rc;
}

static int template_get(hutch_cli *cli, const hutch_template_args *a) {
  cleanup_free char *path = hutch_id_path("/v1/templates/", a->name, NULL);
  hutch_response r;
  if (hutch_call(cli, "GET", path, NULL, &r) < 0) return HUTCH_EXIT_FAIL;
  if (cli->json || a->json)
    hutch_print_body(&r);
  else
    hutch_print_object(r.json, NULL, stdout);
  hutch_response_free(&r);
  return HUTCH_EXIT_OK;
}

static int template_delete(hutch_cli *cli, const hutch_template_args *a) {
  cleanup_free char *path = hutch_id_path("/v1/templates/", a->name, NULL);
  hutch_response r;
  if (hutch_call(cli, "DELETE", path, NULL, &r) < 0) return HUTCH_EXIT_FAIL;
  if ((cli->json || a->json) && r.len)
    hutch_print_body(&r);
  else if (!(cli->json || a->json))
    printf("%s\n", a->name);
  hutch_response_free(&r);
  return HUTCH_EXIT_OK;
}

/* The build's progress on stderr: one line per change, or one line
 * rewritten in place (\r) when stderr is a terminal. */
struct progress {
  bool tty;
  bool open;  /* tty: a line without its newline is on the screen */
  char *last; /* the last line shown */
};

static void progress_show(struct progress *p, const char *name, json_t *tpl) {
  json_t *prog = json_object_get(tpl, "progress");
  json_t *msg = json_object_get(prog, "message");
  double f = json_number_value(json_object_get(prog, "fraction"));
  int pct = isfinite(f) ? (int)floor(f * 100) : 0;
  if (pct < 0) pct = 0;
  if (pct > 100) pct = 100;
  cleanup_free char *text =
      hutch_display(json_is_string(msg) ? msg : json_object_get(tpl, "state"));
  cleanup_free char *shown = xstrdup(name);
  for (char *c = shown; *c; c++) /* the name was checked by hutchd; still, no controls */
    if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
  char *line = xasprintf("template %s: %s (%d%%)", shown, text, pct);
  if (p->last && strcmp(p->last, line) == 0) {
    free(line);
    return;
  }
  free(p->last);
  p->last = line;
  if (p->tty) {
    fprintf(stderr, "\r%s\033[K", line);
    p->open = true;
  } else {
    fprintf(stderr, "%s\n", line);
  }
  fflush(stderr);
}

static void progress_end(struct progress *p) {
  if (p->open) fputc('\n', stderr);
  p->open = false;
  free(p->last);
  p->last = NULL;
}

/* Sleeps ms milliseconds unless a stop signal arrives. */
static void nap(long ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
  while (!hutch_stop_signal && nanosleep(&ts, &ts) < 0 && errno == EINTR) {
  }
}

/* Polls the template until it is ready or failed.  `r` holds the first
 * observation (the POST's reply) and, on return, the last one. */
static int template_wait(hutch_cli *cli, const char *name, hutch_response *r) {
  cleanup_free char *path = hutch_id_path("/v1/templates/", name, NULL);
  struct progress p = {.tty = isatty(STDERR_FILENO) == 1};
  int rc = HUTCH_EXIT_FAIL;
  hutch_catch_stop_signals();
  cli->client.abort_flag = &hutch_stop_signal;
  for (;;) {
    const char *state = json_string_value(json_object_get(r->json, "state"));
    if (!state) {
      progress_end(&p);
      hutch_errorf("template %s: hutchd's reply has no state", name);
      break;
    }
    if (strcmp(state, "failed") == 0) {
      progress_end(&p);
      cleanup_free char *e = hutch_display(json_object_get(r->json, "error"));
      hutch_errorf("template %s: build failed: %s", name, e);
      break;
    }
    progress_show(&p, name, r->json);
    if (strcmp(state, "ready") == 0) {
      progress_end(&p);
      rc = HUTCH_EXIT_OK;
      break;
    }
    nap(POLL_MS);
    if (hutch_stop_signal) break;
    hutch_response next;
    hutch_err err = HUTCH_ERR_INIT;
    bool got = false;
    if (hutch_request(&cli->client, "GET", path, NULL, &next, &err) == 0) {
      got = true;
      if (hutch_response_check(&next, &err) == 0 && !json_is_object(next.json))
        hutch_err_set(&err, 0, "internal", "hutchd sent a reply that is not a JSON object");
    }
    if (err.msg[0]) {
      if (got) hutch_response_free(&next);
      if (hutch_stop_signal) break;
      progress_end(&p); /* the error on a line of its own */
      hutch_errorf("template %s: %s", name, err.msg);
      break;
    }
    hutch_response_free(r);
    *r = next;
  }
  cli->client.abort_flag = NULL;
  if (hutch_stop_signal) {
    progress_end(&p);
    hutch_errorf("interrupted; template %s may still be building (hutch template get %s)", name,
                 name);
    rc = 128 + hutch_stop_signal;
  }
  progress_end(&p);
  return rc;
}

static int template_create(hutch_cli *cli, hutch_template_args *a) {
  /* hutchd opens the path itself: make it absolute here, where the
   * caller's working directory means something. */
  json_t *path = json_object_get(a->body, "path");
  if (json_is_string(path)) {
    const char *given = json_string_value(path);
    cleanup_free char *abs = realpath(given, NULL);
    if (!abs) {
      hutch_errorf("--oci %s: %s", given, strerror(errno));
      return HUTCH_EXIT_FAIL;
    }
    json_t *v = json_string(abs);
    if (!v) {
      hutch_errorf("--oci %s: the path is not valid UTF-8", given);
      return HUTCH_EXIT_FAIL;
    }
    json_object_set_new(a->body, "path", v);
  }
  hutch_response r;
  if (hutch_call(cli, "POST", "/v1/templates", a->body, &r) < 0) return HUTCH_EXIT_FAIL;
  int rc = a->wait ? template_wait(cli, a->name, &r) : HUTCH_EXIT_OK;
  if (rc == HUTCH_EXIT_OK) {
    if (cli->json || a->json)
      hutch_print_body(&r);
    else
      printf("%s\n", a->name);
  }
  hutch_response_free(&r);
  return rc;
}

int hutch_cmd_template(hutch_cli *cli, int argc, char **argv) {
  hutch_err err = HUTCH_ERR_INIT;
  hutch_template_args a;
  int rc;
  if (hutch_parse_template_args(argc, argv, &a, &err) < 0) {
    rc = hutch_usage_fail(template_usage, &err);
  } else if (a.help) {
    rc = hutch_print_help(template_help);
  } else {
    switch (a.action) {
      case HUTCH_TPL_LIST: rc = template_list(cli, &a); break;
      case HUTCH_TPL_GET: rc = template_get(cli, &a); break;
      case HUTCH_TPL_DELETE: rc = template_delete(cli, &a); break;
      case HUTCH_TPL_CREATE: rc = template_create(cli, &a); break;
      default: rc = hutch_usage_fail(template_usage, &err); break;
    }
  }
  hutch_template_args_free(&a);
  return rc;
}

int hutch_cmd_storage(hutch_cli *cli, int argc, char **argv) {
  hutch_err err = HUTCH_ERR_INIT;
  hutch_plain_args a;
  if (hutch_parse_plain_args(argc, argv, &a, &err) < 0)
    return hutch_usage_fail(storage_usage, &err);
  if (a.help) return hutch_print_help(storage_help);
  hutch_response r;
  if (hutch_call(cli, "GET", "/v1/storage", NULL, &r) < 0) return HUTCH_EXIT_FAIL;
  if (cli->json || a.json)
    hutch_print_body(&r);
  else
    hutch_print_object(r.json, NULL, stdout);
  hutch_response_free(&r);
  return HUTCH_EXIT_OK;
}
