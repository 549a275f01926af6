/* Command-line parsing for the `hutch` CLI; see args.h. */
#include "args.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

/* Client-side bound on integer options: keeps them well inside json_int_t.
 * The real ranges are hutchd's to enforce (docs/api.md), so that they live
 * in one place. */
#define HUTCH_ARG_INT_MAX 1000000000000LL

enum {
  K_HELP = HUTCH_ARG_POSITIONAL + 1,
  K_JSON,
  K_SOCKET,
  K_URL,
  K_API_KEY,
  K_VERSION,
  K_TEMPLATE,
  K_RUNTIME,
  K_CPUS,
  K_MEMORY,
  K_PIDS,
  K_ENV,
  K_LABEL,
  K_TIMEOUT,
  K_NO_WAIT,
  K_CWD,
  K_SH,
  K_STATE,
  K_NAME,
  K_INTERACTIVE,
  K_TTY,
  K_DETACH,
  K_TAG,
  K_USER,
  K_NO_REPLAY,
  K_SIGNAL,
  K_ON_TIMEOUT,
  K_FROM_SNAPSHOT,
  K_SNAPSHOT_EVERY,
  K_SOURCE,
  K_SUITE,
  K_MIRROR,
  K_PACKAGE,
  K_OCI,
  K_IMAGE,
  K_KIND,
  K_OUTPUT,
  K_PARENT,
  K_INCREMENTAL,
  K_FULL,
  K_COUNT,
  K_SNAPSHOT,
};

#define OPT_HELP \
  { "help", 'h', false, K_HELP }
#define OPT_JSON \
  { "json", 0, false, K_JSON }
#define OPT_END \
  { NULL, 0, false, 0 }
#define CREATE_OPTS                                                                              \
  {"template", 0, true, K_TEMPLATE}, {"runtime", 0, true, K_RUNTIME}, {"cpus", 0, true, K_CPUS}, \
      {"memory", 0, true, K_MEMORY}, {"pids", 0, true, K_PIDS}, {                                \
    "label", 0, true, K_LABEL                                                                    \
  }
#define EXEC_OPTS                                                                      \
  {"env", 0, true, K_ENV}, {"cwd", 0, true, K_CWD}, {"timeout", 0, true, K_TIMEOUT}, { \
    "sh", 0, false, K_SH                                                               \
  }

void hutch_argp_init(hutch_argp *p, int argc, char **argv, const hutch_opt *opts,
                     int max_positional) {
  memset(p, 0, sizeof *p);
  p->argc = argc;
  p->argv = argv;
  p->opts = opts;
  p->max_positional = max_positional;
  p->i = 1;
}

/* The next short option of a cluster such as -it or -nVALUE: flags may be
 * grouped; an option with a value takes the rest of the word, or the next
 * word. */
static int short_opt(hutch_argp *p, hutch_err *err) {
  const char *c = p->cluster;
  p->cluster = NULL;
  const hutch_opt *o;
  for (o = p->opts; o->name; o++)
    if (o->short_name && o->short_name == *c) break;
  if (!o->name) return hutch_err_invalid(err, "unknown option `-%c`", *c);
  if (o->has_arg) {
    if (c[1])
      p->arg = c + 1;
    else if (p->i < p->argc)
      p->arg = p->argv[p->i++];
    else
      return hutch_err_invalid(err, "option `-%c` needs a value", *c);
  } else if (c[1]) {
    p->cluster = c + 1;
  }
  return o->key;
}

int hutch_argp_next(hutch_argp *p, hutch_err *err) {
  p->arg = NULL;
  if (p->cluster) return short_opt(p, err);
  for (;;) {
    if (p->done || p->i >= p->argc) {
      p->done = true;
      return HUTCH_ARG_END;
    }
    const char *w = p->argv[p->i];
    if (!p->only_positional && strcmp(w, "--") == 0) {
      p->i++;
      if (p->max_positional >= 0) {
        p->done = true;
        return HUTCH_ARG_END;
      }
      p->only_positional = true;
      continue;
    }
    if (p->only_positional || w[0] != '-' || w[1] == '\0') {
      if (p->max_positional >= 0 && p->npos >= p->max_positional) {
        p->done = true;
        return HUTCH_ARG_END;
      }
      p->npos++;
      p->i++;
      p->arg = w;
      return HUTCH_ARG_POSITIONAL;
    }
    break;
  }

  const char *w = p->argv[p->i++];
  if (w[1] != '-') {
    p->cluster = w + 1;
    return short_opt(p, err);
  }
  const hutch_opt *o;
  const char *name = w + 2;
  const char *eq = strchr(name, '=');
  size_t n = eq ? (size_t)(eq - name) : strlen(name);
  for (o = p->opts; o->name; o++)
    if (strlen(o->name) == n && strncmp(o->name, name, n) == 0) break;
  if (!o->name) return hutch_err_invalid(err, "unknown option `--%.*s`", (int)n, name);
  if (eq && !o->has_arg) return hutch_err_invalid(err, "option `--%s` takes no value", o->name);
  if (o->has_arg) {
    if (eq)
      p->arg = eq + 1;
    else if (p->i < p->argc)
      p->arg = p->argv[p->i++];
    else
      return hutch_err_invalid(err, "option `--%s` needs a value", o->name);
  }
  return o->key;
}

/* json_string() refuses invalid UTF-8 (NULL); say which argument it was. */
static json_t *utf8_string(const char *what, const char *s, hutch_err *err) {
  json_t *j = json_string(s);
  if (!j) hutch_err_invalid(err, "%s: not valid UTF-8", what);
  return j;
}

static int check_kv(const char *opt, const char *s, size_t *keylen, hutch_err *err) {
  const char *eq = strchr(s, '=');
  if (!eq) return hutch_err_invalid(err, "--%s `%s`: expected KEY=VALUE", opt, s);
  if (eq == s) return hutch_err_invalid(err, "--%s `%s`: empty key", opt, s);
  *keylen = (size_t)(eq - s);
  return 0;
}

int hutch_parse_kv(const char *opt, const char *s, json_t *obj, hutch_err *err) {
  size_t klen;
  if (check_kv(opt, s, &klen, err) < 0) return -1;
  cleanup_free char *key = xstrndup(s, klen);
  json_t *v = json_string(s + klen + 1);
  /* json_object_set_new() checks the key's UTF-8 and drops v on failure. */
  if (!v || json_object_set_new(obj, key, v) < 0)
    return hutch_err_invalid(err, "--%s `%s`: not valid UTF-8", opt, s);
  return 0;
}

int hutch_parse_int(const char *opt, const char *s, long long max, long long *out, hutch_err *err) {
  uint64_t v = 0;
  if (parse_u64(s, (uint64_t)max, &v) < 0)
    return hutch_err_invalid(err, "--%s `%s`: expected a whole number from 0 to %lld", opt, s, max);
  *out = (long long)v;
  return 0;
}

int hutch_parse_number(const char *opt, const char *s, double *out, hutch_err *err) {
  /* digits, optionally one '.' followed by digits: strtod alone would also
   * take "inf", "0x10", "1e9" and leading blanks. */
  size_t int_digits = strspn(s, "0123456789");
  const char *rest = s + int_digits;
  size_t frac_digits = 0;
  bool dot = *rest == '.';
  if (dot) {
    frac_digits = strspn(rest + 1, "0123456789");
    rest += 1 + frac_digits;
  }
  double v = 0;
  if (*rest || (dot && frac_digits == 0) || int_digits + frac_digits == 0 || int_digits > 15 ||
      (v = strtod(s, NULL), !isfinite(v)) || v <= 0)
    return hutch_err_invalid(err, "--%s `%s`: expected a positive number such as 2 or 0.5", opt, s);
  *out = v;
  return 0;
}

char *hutch_url_escape(const char *s, const char *keep) {
  static const char hex[] = "0123456789ABCDEF";
  size_t n = strlen(s);
  char *out = xmalloc(3 * n + 1), *o = out;
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    if ((*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') ||
        strchr("-._~", *c) || (keep && strchr(keep, *c))) {
      *o++ = (char)*c;
    } else {
      *o++ = '%';
      *o++ = hex[*c >> 4];
      *o++ = hex[*c & 15];
    }
  }
  *o = '\0';
  return out;
}

static int nonempty(const char *opt, const char *s, hutch_err *err) {
  if (!*s) return hutch_err_invalid(err, "--%s: must not be empty", opt);
  return 0;
}

static json_t *sub_object(json_t *body, const char *name) {
  json_t *o = json_object_get(body, name);
  if (!o) {
    o = json_object();
    json_object_set_new(body, name, o);
  }
  return o;
}

static int set_string(json_t *obj, const char *field, const char *opt, const char *s,
                      hutch_err *err) {
  if (nonempty(opt, s, err) < 0) return -1;
  cleanup_free char *what = xasprintf("--%s", opt);
  json_t *v = utf8_string(what, s, err);
  if (!v) return -1;
  json_object_set_new(obj, field, v);
  return 0;
}

static int set_int(json_t *obj, const char *field, const char *opt, const char *s, hutch_err *err) {
  long long v = 0;
  if (hutch_parse_int(opt, s, HUTCH_ARG_INT_MAX, &v, err) < 0) return -1;
  json_object_set_new(obj, field, json_integer(v));
  return 0;
}

/* A create option into the POST /v1/sandboxes body.  Returns 1 when `key`
 * is one, 0 when it is not, -1 on a bad value. */
static int create_opt(json_t *body, int key, const char *arg, hutch_err *err) {
  switch (key) {
    case K_TEMPLATE: return set_string(body, "template", "template", arg, err) < 0 ? -1 : 1;
    case K_RUNTIME: return set_string(body, "runtime", "runtime", arg, err) < 0 ? -1 : 1;
    case K_CPUS: {
      double v;
      if (hutch_parse_number("cpus", arg, &v, err) < 0) return -1;
      /* Whole numbers go out as JSON integers ("cpus": 2), the form
       * docs/api.md shows. */
      json_t *j = v == floor(v) ? json_integer((json_int_t)v) : json_real(v);
      json_object_set_new(sub_object(body, "resources"), "cpus", j);
      return 1;
    }
    case K_MEMORY:
      return set_int(sub_object(body, "resources"), "memory_mib", "memory", arg, err) < 0 ? -1 : 1;
    case K_PIDS:
      return set_int(sub_object(body, "resources"), "pids", "pids", arg, err) < 0 ? -1 : 1;
    case K_LABEL: return hutch_parse_kv("label", arg, sub_object(body, "labels"), err) < 0 ? -1 : 1;
    default: return 0;
  }
}

/* An exec option into the POST .../exec body; same returns as create_opt. */
static int exec_opt(json_t *body, int key, const char *arg, hutch_err *err) {
  switch (key) {
    case K_ENV: return hutch_parse_kv("env", arg, sub_object(body, "env"), err) < 0 ? -1 : 1;
    case K_CWD: return set_string(body, "cwd", "cwd", arg, err) < 0 ? -1 : 1;
    case K_TIMEOUT: return set_int(body, "timeout_s", "timeout", arg, err) < 0 ? -1 : 1;
    default: return 0;
  }
}

/* The command line: {"argv": [...]} or, with --sh, {"cmd": "..."}. */
static int set_command(json_t *body, bool sh, int n, char **words, hutch_err *err) {
  if (n == 0) return hutch_err_invalid(err, "missing command (after `--`)");
  if (sh) {
    if (n != 1)
      return hutch_err_invalid(err, "--sh takes the command as one argument (quote it), got %d", n);
    json_t *cmd = utf8_string("command", words[0], err);
    if (!cmd) return -1;
    json_object_set_new(body, "cmd", cmd);
    return 0;
  }
  json_t *arr = json_array();
  for (int i = 0; i < n; i++) {
    cleanup_free char *what = xasprintf("command argument %d", i + 1);
    json_t *s = utf8_string(what, words[i], err);
    if (!s) {
      json_decref(arr);
      return -1;
    }
    json_array_append_new(arr, s);
  }
  json_object_set_new(body, "argv", arr);
  return 0;
}

int hutch_parse_global_args(int argc, char **argv, hutch_global_args *g, hutch_err *err) {
  static const hutch_opt opts[] = {
      {"socket", 0, true, K_SOCKET},
      {"url", 0, true, K_URL},
      {"api-key", 0, true, K_API_KEY},
      {"version", 0, false, K_VERSION},
      OPT_JSON,
      OPT_HELP,
      OPT_END,
  };
  memset(g, 0, sizeof *g);
  hutch_argp p;
  hutch_argp_init(&p, argc, argv, opts, 0);
  int k;
  while ((k = hutch_argp_next(&p, err)) > HUTCH_ARG_END) {
    switch (k) {
      case K_SOCKET:
        if (nonempty("socket", p.arg, err) < 0) return -1;
        g->socket = p.arg;
        break;
      case K_URL:
        if (nonempty("url", p.arg, err) < 0) return -1;
        g->url = p.arg;
        break;
      case K_API_KEY:
        if (nonempty("api-key", p.arg, err) < 0) return -1;
        g->api_key = p.arg;
        break;
      case K_VERSION: g->version = true; break;
      case K_JSON: g->json = true; break;
      case K_HELP: g->help = true; break;
    }
  }
  if (k < 0) return -1;
  if (g->socket && g->url) return hutch_err_invalid(err, "--socket and --url exclude each other");
  g->cmd_index = p.i;
  return 0;
}

int hutch_parse_create_args(int argc, char **argv, hutch_create_args *a, hutch_err *err) {
  static const hutch_opt opts[] = {
      CREATE_OPTS,
      {"env", 0, true, K_ENV},
      {"timeout", 0, true, K_TIMEOUT},
      {"on-timeout", 0, true, K_ON_TIMEOUT},
      {"from-snapshot", 0, true, K_FROM_SNAPSHOT},
      {"snapshot-every", 0, true, K_SNAPSHOT_EVERY},
      {"no-wait", 0, false, K_NO_WAIT},
      OPT_JSON,
      OPT_HELP,
      OPT_END,
  };
  memset(a, 0, sizeof *a);
  a->body = json_object();
  a->wait = true;
  hutch_argp p;
  hutch_argp_init(&p, argc, argv, opts, -1);
  int k;
  while ((k = hutch_argp_next(&p, err)) > HUTCH_ARG_END) {
    switch (k) {
      case HUTCH_ARG_POSITIONAL: return hutch_err_invalid(err, "unexpected argument `%s`", p.arg);
      case K_HELP: a->help = true; return 0;
      case K_JSON: a->json = true; break;
      case K_NO_WAIT: a->wait = false; break;
      case K_ENV:
        if (hutch_parse_kv("env", p.arg, sub_object(a->body, "env"), err) < 0) return -1;
        break;
      case K_TIMEOUT:
        if (set_int(a->body, "timeout_s", "timeout", p.arg, err) < 0) return -1;
        break;
      case K_ON_TIMEOUT:
        /* A closed set (docs/api.md): a typo is a usage error here rather
         * than a 400 after the round trip. */
        if (strcmp(p.arg, "delete") != 0 && strcmp(p.arg, "suspend") != 0)
          return hutch_err_invalid(err, "--on-timeout `%s`: expected delete or suspend", p.arg);
        json_object_set_new(a->body, "on_timeout", json_string(p.arg));
        break;
      case K_FROM_SNAPSHOT:
        if (set_string(a->body, "from_snapshot", "from-snapshot", p.arg, err) < 0) return -1;
        break;
      case K_SNAPSHOT_EVERY:
        /* 0 turns automatic snapshots off; hutchd bounds the interval. */
        if (set_int(sub_object(a->body, "snapshots"), "interval_s", "snapshot-every", p.arg, err) < 0)
          return -1;
        break;
      default:
        if (create_opt(a->body, k, p.arg, err) < 0) return -1;
    }
  }
  return k < 0 ? -1 : 0;
}

void hutch_create_args_free(hutch_create_args *a) {
  json_decref(a->body);
  a->body = NULL;
}

/* --user root|user|UID[:GID] into the POST .../commands body. */
static int set_user(json_t *body, const char *s, hutch_err *err) {
  if (nonempty("user", s, err) < 0) return -1;
  if (*s >= '0' && *s <= '9') {
    const char *colon = strchr(s, ':');
    cleanup_free char *uid = colon ? xstrndup(s, (size_t)(colon - s)) : xstrdup(s);
    uint64_t u = 0, g = 0;
    if (parse_u64(uid, 65535, &u) < 0 || (colon && parse_u64(colon + 1, 65535, &g) < 0))
      return hutch_err_invalid(err, "--user `%s`: expected root, user or UID[:GID] (0-65535)", s);
    json_object_set_new(body, "uid", json_integer((json_int_t)u));
    if (colon) json_object_set_new(body, "gid", json_integer((json_int_t)g));
    return 0;
  }
  return set_string(body, "user", "user", s, err);
}

/* Options of exec and shell; K_* keys that are not theirs return 0. */
static int command_opt(hutch_exec_args *a, int key, const char *arg, bool *sh, hutch_err *err) {
  switch (key) {
    case K_INTERACTIVE: a->interactive = true; return 1;
    case K_TTY: a->tty = true; return 1;
    case K_DETACH: a->detach = true; return 1;
    case K_SH: *sh = true; return 1;
    case K_TAG: return set_string(a->body, "tag", "tag", arg, err) < 0 ? -1 : 1;
    case K_USER: return set_user(a->body, arg, err) < 0 ? -1 : 1;
    case K_JSON: a->json = true; return 1;
    default: return exec_opt(a->body, key, arg, err);
  }
}

/* exec and shell: options before and after the ID; the next word (or the
 * word after `--`) starts the command line.  `shell_argv` is the default
 * command for shell (NULL: exec, a command is required). */
static int parse_command_args(int argc, char **argv, const hutch_opt *opts,
                              const char *const *shell_argv, hutch_exec_args *a, hutch_err *err) {
  memset(a, 0, sizeof *a);
  a->body = json_object();
  bool sh = false;
  hutch_argp p;
  hutch_argp_init(&p, argc, argv, opts, 1);
  int k;
  while ((k = hutch_argp_next(&p, err)) > HUTCH_ARG_END) {
    if (k == HUTCH_ARG_POSITIONAL) {
      a->id = p.arg;
    } else if (k == K_HELP) {
      a->help = true;
      return 0;
    } else if (command_opt(a, k, p.arg, &sh, err) < 0) {
      return -1;
    }
  }
  if (k < 0) return -1;
  if (!a->id && p.i < argc) a->id = argv[p.i++];
  if (!a->id) return hutch_err_invalid(err, "missing sandbox ID");
  if (!*a->id) return hutch_err_invalid(err, "empty sandbox ID");
  if (shell_argv && p.i >= argc) {
    json_t *arr = json_array();
    for (const char *const *w = shell_argv; *w; w++) json_array_append_new(arr, json_string(*w));
    json_object_set_new(a->body, "argv", arr);
  } else if (set_command(a->body, sh, argc - p.i, argv + p.i, err) < 0) {
    return -1;
  }
  if (a->interactive) json_object_set_new(a->body, "stdin", json_true());
  return 0;
}

int hutch_parse_exec_args(int argc, char **argv, hutch_exec_args *a, hutch_err *err) {
  static const hutch_opt opts[] = {EXEC_OPTS,
                                   {"interactive", 'i', false, K_INTERACTIVE},
                                   {"tty", 't', false, K_TTY},
                                   {"detach", 'd', false, K_DETACH},
                                   {"tag", 0, true, K_TAG},
                                   {"user", 'u', true, K_USER},
                                   OPT_JSON,
                                   OPT_HELP,
                                   OPT_END};
  return parse_command_args(argc, argv, opts, NULL, a, err);
}

int hutch_parse_shell_args(int argc, char **argv, hutch_exec_args *a, hutch_err *err) {
  static const hutch_opt opts[] = {{"env", 0, true, K_ENV}, {"cwd", 0, true, K_CWD},
                                   {"user", 'u', true, K_USER}, {"tag", 0, true, K_TAG},
                                   OPT_HELP, OPT_END};
  static const char *const shell_argv[] = {HUTCH_SHELL_ARGV, NULL};
  if (parse_command_args(argc, argv, opts, shell_argv, a, err) < 0) return -1;
  if (!a->help) {
    a->interactive = a->tty = true;
    json_object_set_new(a->body, "stdin", json_true());
  }
  return 0;
}

void hutch_exec_args_free(hutch_exec_args *a) {
  json_decref(a->body);
  a->body = NULL;
}

int hutch_parse_run_args(int argc, char **argv, hutch_run_args *a, hutch_err *err) {
  static const hutch_opt opts[] = {CREATE_OPTS, EXEC_OPTS, OPT_JSON, OPT_HELP, OPT_END};
  memset(a, 0, sizeof *a);
  a->create = json_object();
  a->exec = json_object();
  bool sh = false;
  hutch_argp p;
  hutch_argp_init(&p, argc, argv, opts, 0);
  int k;
  while ((k = hutch_argp_next(&p, err)) > HUTCH_ARG_END) {
    switch (k) {
      case K_HELP: a->help = true; return 0;
      case K_JSON: a->json = true; break;
      case K_SH: sh = true; break;
      case K_TIMEOUT: {
        long long t = 0;
        if (hutch_parse_int("timeout", p.arg, HUTCH_ARG_INT_MAX, &t, err) < 0) return -1;
        json_object_set_new(a->exec, "timeout_s", json_integer(t));
        json_object_set_new(a->create, "timeout_s", json_integer(t + HUTCH_RUN_TIMEOUT_GRACE_S));
        break;
      }
      default: {
        int r = create_opt(a->create, k, p.arg, err);
        if (r == 0) r = exec_opt(a->exec, k, p.arg, err);
        if (r < 0) return -1;
      }
    }
  }
  if (k < 0) return -1;
  return set_command(a->exec, sh, argc - p.i, argv + p.i, err);
}

void hutch_run_args_free(hutch_run_args *a) {
  json_decref(a->create);
  json_decref(a->exec);
  a->create = a->exec = NULL;
}

static void query_add(char **query, const char *name, const char *value) {
  cleanup_free char *old = *query;
  cleanup_free char *v = hutch_url_escape(value, "=/");
  *query = xasprintf("%s%c%s=%s", old, *old ? '&' : '?', name, v);
}

int hutch_parse_ls_args(int argc, char **argv, hutch_ls_args *a, hutch_err *err) {
  static const hutch_opt opts[] = {
      {"label", 0, true, K_LABEL}, {"state", 0, true, K_STATE}, OPT_JSON, OPT_HELP, OPT_END,
  };
  memset(a, 0, sizeof *a);
  a->query = xstrdup("");
  hutch_argp p;
  hutch_argp_init(&p, argc, argv, opts, -1);
  int k;
  while ((k = hutch_argp_next(&p, err)) > HUTCH_ARG_END) {
    size_t klen;
    switch (k) {
      case HUTCH_ARG_POSITIONAL: return hutch_err_invalid(err, "unexpected argument `%s`", p.arg);
      case K_HELP: a->help = true; return 0;
      case K_JSON: a->json = true; break;
      case K_LABEL:
        if (check_kv("label", p.arg, &klen, err) < 0) return -1;
        query_add(&a->query, "label", p.arg);
        break;
      case K_STATE:
        if (nonempty("state", p.arg, err) < 0) return -1;
        query_add(&a->query, "state", p.arg);
        break;
    }
  }
  return k < 0 ? -1 : 0;
}

void hutch_ls_args_free(hutch_ls_args *a) {
  free(a->query);
  a->query = NULL;
}

static int parse_ids(int argc, char **argv, const hutch_opt *opts, hutch_ids_args *a,
                     hutch_err *err) {
  memset(a, 0, sizeof *a);
  a->ids = xcalloc((size_t)argc, sizeof *a->ids);
  a->wait = true;
  hutch_argp p;
  hutch_argp_init(&p, argc, argv, opts, -1);
  int k;
  while ((k = hutch_argp_next(&p, err)) > HUTCH_ARG_END) {
    switch (k) {
      case HUTCH_ARG_POSITIONAL:
        if (!*p.arg) return hutch_err_invalid(err, "empty sandbox ID");
        a->ids[a->nids++] = p.arg;
        break;
      case K_HELP: a->help = true; return 0;
      case K_JSON: a->json = true; break;
      case K_NO_WAIT: a->wait = false; break;
    }
  }
  if (k < 0) return -1;
  if (a->nids == 0) return hutch_err_invalid(err, "missing sandbox ID");
  return 0;
}

int hutch_parse_get_args(int argc, char **argv, hutch_ids_args *a, hutch_err *err) {
  static const hutch_opt opts[] = {OPT_JSON, OPT_HELP, OPT_END};
  if (parse_ids(argc, argv, opts, a, err) < 0) return -1;
  if (!a->help && a->nids > 1)
    return hutch_err_invalid(err, "unexpected argument `%s` (get takes one ID)", a->ids[1]);
  return 0;
}

int hutch_parse_rm_args(int argc, char **argv, hutch_ids_args *a, hutch_err *err) {
  static const hutch_opt opts[] = {{"no-wait", 0, false, K_NO_WAIT}, OPT_JSON, OPT_HELP, OPT_END};
  return parse_ids(argc, argv, opts, a, err);
}

const char *const hutch_lifecycle_verbs[] = {"pause",   "resume",  "stop", "start",
                                              "suspend", "restore", "wake", NULL};

bool hutch_is_lifecycle_verb(const char *name) {
  for (const char *const *v = hutch_lifecycle_verbs; *v; v++)
    if (strcmp(*v, name) == 0) return true;
  return false;
}

int hutch_parse_lifecycle_args(int argc, char **argv, hutch_ids_args *a, hutch_err *err) {
  static const hutch_opt opts[] = {{"no-wait", 0, false, K_NO_WAIT}, OPT_JSON, OPT_HELP, OPT_END};
  return parse_ids(argc, argv, opts, a, err);
}

void hutch_ids_args_free(hutch_ids_args *a) {
  free(a->ids);
  a->ids = NULL;
}

int hutch_parse_admin_args(int argc, char **argv, hutch_admin_args *a, hutch_err *err) {
  static const hutch_opt opts[] = {{"name", 0, true, K_NAME}, OPT_JSON, OPT_HELP, OPT_END};
  memset(a, 0, sizeof *a);
  const char *words[3] = {NULL, NULL, NULL};
  int nwords = 0;
  hutch_argp p;
  hutch_argp_init(&p, argc, argv, opts, -1);
  int k;
  while ((k = hutch_argp_next(&p, err)) > HUTCH_ARG_END) {
    switch (k) {
      case HUTCH_ARG_POSITIONAL:
        if (nwords == 3) return hutch_err_invalid(err, "unexpected argument `%s`", p.arg);
        words[nwords++] = p.arg;
        break;
      case K_HELP: a->help = true; return 0;
      case K_JSON: a->json = true; break;
      case K_NAME:
        if (nonempty("name", p.arg, err) < 0) return -1;
        a->name = p.arg;
        break;
    }
  }
  if (k < 0) return -1;
  if (nwords == 0) return hutch_err_invalid(err, "missing admin command (key)");
  if (strcmp(words[0], "key") != 0 && strcmp(words[0], "keys") != 0)
    return hutch_err_invalid(err, "unknown admin command `%s`", words[0]);
  if (nwords == 1) return hutch_err_invalid(err, "missing action (create, ls or rm)");
  int want_words = 2;
  if (strcmp(words[1], "create") == 0) {
    a->action = HUTCH_KEY_CREATE;
  } else if (strcmp(words[1], "ls") == 0 || strcmp(words[1], "list") == 0) {
    a->action = HUTCH_KEY_LS;
  } else if (strcmp(words[1], "rm") == 0 || strcmp(words[1], "delete") == 0) {
    a->action = HUTCH_KEY_RM;
    want_words = 3;
    if (nwords < 3) return hutch_err_invalid(err, "missing key ID");
    if (!*words[2]) return hutch_err_invalid(err, "empty key ID");
    a->id = words[2];
  } else {
    return hutch_err_invalid(err, "unknown action `%s` (create, ls or rm)", words[1]);
  }
  if (nwords > want_words)
    return hutch_err_invalid(err, "unexpected argument `%s`", words[want_words]);
  if (a->name && a->action != HUTCH_KEY_CREATE)
    return hutch_err_invalid(err, "--name applies only to `key create`");
  return 0;
}

int hutch_parse_plain_args(int argc, char **argv, hutch_plain_args *a, hutch_err *err) {
  static const hutch_opt opts[] = {OPT_JSON, OPT_HELP, OPT_END};
  memset(a, 0, sizeof *a);
  hutch_argp p;
  hutch_argp_init(&p, argc, argv, opts, -1);
  int k;
  while ((k = hutch_argp_next(&p, err)) > HUTCH_ARG_END) {
    switch (k) {
      case HUTCH_ARG_POSITIONAL: return hutch_err_invalid(err, "unexpected argument `%s`", p.arg);
      case K_HELP: a->help = true; return 0;
      case K_JSON: a->json = true; break;
    }
  }
  return k < 0 ? -1 : 0;
}

int hutch_parse_one_id_args(const char *verb, int argc, char **argv, hutch_ids_args *a,
                            hutch_err *err) {
  static const hutch_opt opts[] = {OPT_JSON, OPT_HELP, OPT_END};
  if (parse_ids(argc, argv, opts, a, err) < 0) return -1;
  if (!a->help && a->nids > 1)
    return hutch_err_invalid(err, "unexpected argument `%s` (%s takes one ID)", a->ids[1], verb);
  return 0;
}

/* Parses options with `handle` and collects exactly `want` positionals
 * into words[], named in messages by names[]. */
typedef int (*opt_handler)(void *a, int key, const char *arg, hutch_err *err);
static int parse_words(int argc, char **argv, const hutch_opt *opts, opt_handler handle, void *a,
                       bool *help, const char **words, int want, const char *const *names,
                       hutch_err *err) {
  int nwords = 0;
  hutch_argp p;
  hutch_argp_init(&p, argc, argv, opts, -1);
  int k;
  while ((k = hutch_argp_next(&p, err)) > HUTCH_ARG_END) {
    if (k == K_HELP) {
      *help = true;
      return 0;
    }
    if (k == HUTCH_ARG_POSITIONAL) {
      if (nwords == want) return hutch_err_invalid(err, "unexpected argument `%s`", p.arg);
      if (!*p.arg) return hutch_err_invalid(err, "empty %s", names[nwords]);
      words[nwords++] = p.arg;
    } else if (handle(a, k, p.arg, err) < 0) {
      return -1;
    }
  }
  if (k < 0) return -1;
  if (nwords < want) return hutch_err_invalid(err, "missing %s", names[nwords]);
  return 0;
}

static int cmd_opt(void *arg, int key, const char *val, hutch_err *err) {
  hutch_cmd_args *a = arg;
  switch (key) {
    case K_JSON: a->json = true; return 0;
    case K_NO_REPLAY: a->replay = false; return 0;
    case K_SIGNAL: {
      if (nonempty("signal", val, err) < 0) return -1;
      json_t *v;
      if (*val >= '0' && *val <= '9') {
        long long n = 0;
        if (hutch_parse_int("signal", val, 255, &n, err) < 0) return -1;
        v = json_integer(n);
      } else if (!(v = utf8_string("--signal", val, err))) {
        return -1;
      }
      json_object_set_new(a->body, "signal", v);
      return 0;
    }
    default: return 0;
  }
}

static const char *const cmd_words[] = {"sandbox ID", "command ID"};

int hutch_parse_attach_args(int argc, char **argv, hutch_cmd_args *a, hutch_err *err) {
  static const hutch_opt opts[] = {{"no-replay", 0, false, K_NO_REPLAY}, OPT_JSON, OPT_HELP,
                                   OPT_END};
  memset(a, 0, sizeof *a);
  a->replay = true;
  const char *w[2] = {NULL, NULL};
  if (parse_words(argc, argv, opts, cmd_opt, a, &a->help, w, 2, cmd_words, err) < 0) return -1;
  a->id = w[0];
  a->cmd_id = w[1];
  return 0;
}

int hutch_parse_kill_args(int argc, char **argv, hutch_cmd_args *a, hutch_err *err) {
  static const hutch_opt opts[] = {{"signal", 's', true, K_SIGNAL}, OPT_JSON, OPT_HELP, OPT_END};
  memset(a, 0, sizeof *a);
  a->body = json_pack("{s:s}", "signal", "TERM");
  const char *w[2] = {NULL, NULL};
  if (parse_words(argc, argv, opts, cmd_opt, a, &a->help, w, 2, cmd_words, err) < 0) return -1;
  a->id = w[0];
  a->cmd_id = w[1];
  return 0;
}

void hutch_cmd_args_free(hutch_cmd_args *a) {
  json_decref(a->body);
  a->body = NULL;
}

static int timeout_opt(void *arg, int key, const char *val, hutch_err *err) {
  hutch_timeout_args *a = arg;
  if (key == K_JSON) a->json = true;
  return 0;
}

int hutch_parse_timeout_args(int argc, char **argv, hutch_timeout_args *a, hutch_err *err) {
  static const hutch_opt opts[] = {OPT_JSON, OPT_HELP, OPT_END};
  static const char *const names[] = {"sandbox ID", "SECONDS"};
  memset(a, 0, sizeof *a);
  const char *w[2] = {NULL, NULL};
  if (parse_words(argc, argv, opts, timeout_opt, a, &a->help, w, 2, names, err) < 0) return -1;
  if (a->help) return 0;
  a->id = w[0];
  long long t = 0;
  if (hutch_parse_int("timeout", w[1], HUTCH_ARG_INT_MAX, &t, err) < 0)
    return hutch_err_invalid(err, "SECONDS `%s`: expected a whole number of seconds", w[1]);
  a->body = json_pack("{s:I}", "timeout_s", (json_int_t)t);
  return 0;
}

void hutch_timeout_args_free(hutch_timeout_args *a) {
  json_decref(a->body);
  a->body = NULL;
}

bool hutch_cp_split(const char *arg, char **id, const char **path) {
  const char *colon = strchr(arg, ':');
  if (!colon || colon == arg || memchr(arg, '/', (size_t)(colon - arg))) return false;
  *id = xstrndup(arg, (size_t)(colon - arg));
  *path = colon + 1;
  return true;
}

static int cp_opt(void *arg, int key, const char *val, hutch_err *err) {
  hutch_cp_args *a = arg;
  if (key == K_JSON) a->json = true;
  return 0;
}

int hutch_parse_cp_args(int argc, char **argv, hutch_cp_args *a, hutch_err *err) {
  static const hutch_opt opts[] = {OPT_HELP, OPT_END};
  static const char *const names[] = {"source", "destination"};
  memset(a, 0, sizeof *a);
  const char *w[2] = {NULL, NULL};
  if (parse_words(argc, argv, opts, cp_opt, a, &a->help, w, 2, names, err) < 0) return -1;
  if (a->help) return 0;
  char *src_id = NULL, *dst_id = NULL;
  const char *src_path = NULL, *dst_path = NULL;
  bool src_remote = hutch_cp_split(w[0], &src_id, &src_path);
  bool dst_remote = hutch_cp_split(w[1], &dst_id, &dst_path);
  if (src_remote && dst_remote) {
    free(src_id);
    free(dst_id);
    return hutch_err_invalid(err, "copying between two sandboxes is not supported");
  }
  if (!src_remote && !dst_remote)
    return hutch_err_invalid(err, "one of SRC and DST must be SANDBOX_ID:PATH");
  a->upload = dst_remote;
  a->id = a->upload ? dst_id : src_id;
  a->remote = a->upload ? dst_path : src_path;
  a->local = a->upload ? w[0] : w[1];
  if (!*a->remote)
    return hutch_err_invalid(err, "empty path after `%s:` (use %s:/path)", a->id, a->id);
  return 0;
}

void hutch_cp_args_free(hutch_cp_args *a) {
  free(a->id);
  a->id = NULL;
}

/* ---- storage: template, snapshot, rollback, fork -------------------------- */

/* The template sources hutchd builds from (docs/api.md "Storage"). */
static const char *const template_sources[] = {"host", "busybox", "debian", "oci", "snapshot", NULL};
/* Snapshot kinds, for `snapshot list --kind`. */
static const char *const snapshot_kinds[] = {"manual", "auto", "fork", "full", "imported", NULL};

static bool in_set(const char *const *set, const char *s) {
  for (; *set; set++)
    if (strcmp(*set, s) == 0) return true;
  return false;
}

/* An option given to an action it does not apply to. */
static int only_for(const char *opt, const char *what, hutch_err *err) {
  return hutch_err_invalid(err, "--%s applies only to `%s`", opt, what);
}

int hutch_parse_template_args(int argc, char **argv, hutch_template_args *a, hutch_err *err) {
  static const hutch_opt opts[] = {
      {"source", 0, true, K_SOURCE},   {"suite", 0, true, K_SUITE},
      {"mirror", 0, true, K_MIRROR},   {"package", 0, true, K_PACKAGE},
      {"oci", 0, true, K_OCI},         {"image", 0, true, K_IMAGE},
      {"from-snapshot", 0, true, K_FROM_SNAPSHOT},
      {"no-wait", 0, false, K_NO_WAIT},
      OPT_JSON,
      OPT_HELP,
      OPT_END,
  };
  memset(a, 0, sizeof *a);
  a->wait = true;
  a->body = json_object();
  json_t *packages = json_array();
  json_object_set_new(a->body, "packages", packages); /* freed with the body on any error */
  const char *words[2] = {NULL, NULL};
  int nwords = 0;
  const char *source = NULL, *suite = NULL, *mirror = NULL, *oci = NULL, *image = NULL,
             *snap = NULL;
  const char *create_only = NULL; /* the first option that only `create` takes */
  hutch_argp p;
  hutch_argp_init(&p, argc, argv, opts, -1);
  int k;
  while ((k = hutch_argp_next(&p, err)) > HUTCH_ARG_END) {
    const char *opt = NULL; /* create options: for the value checks below */
    switch (k) {
      case HUTCH_ARG_POSITIONAL:
        if (nwords == 2) return hutch_err_invalid(err, "unexpected argument `%s`", p.arg);
        words[nwords++] = p.arg;
        continue;
      case K_HELP: a->help = true; return 0;
      case K_JSON: a->json = true; continue;
      case K_NO_WAIT: a->wait = false; opt = "no-wait"; break;
      case K_SOURCE: opt = "source"; source = p.arg; break;
      case K_SUITE: opt = "suite"; suite = p.arg; break;
      case K_MIRROR: opt = "mirror"; mirror = p.arg; break;
      case K_OCI: opt = "oci"; oci = p.arg; break;
      case K_IMAGE: opt = "image"; image = p.arg; break;
      case K_FROM_SNAPSHOT: opt = "from-snapshot"; snap = p.arg; break;
      case K_PACKAGE: {
        opt = "package";
        if (nonempty(opt, p.arg, err) < 0) return -1;
        json_t *v = utf8_string("--package", p.arg, err);
        if (!v) return -1;
        json_array_append_new(packages, v);
        break;
      }
    }
    if (!create_only) create_only = opt;
    if (p.arg && nonempty(opt, p.arg, err) < 0) return -1;
  }
  if (k < 0) return -1;
  if (nwords == 0) return hutch_err_invalid(err, "missing template command (list, get, delete or create)");
  const char *act = words[0];
  if (strcmp(act, "list") == 0 || strcmp(act, "ls") == 0)
    a->action = HUTCH_TPL_LIST;
  else if (strcmp(act, "get") == 0)
    a->action = HUTCH_TPL_GET;
  else if (strcmp(act, "delete") == 0 || strcmp(act, "rm") == 0)
    a->action = HUTCH_TPL_DELETE;
  else if (strcmp(act, "create") == 0)
    a->action = HUTCH_TPL_CREATE;
  else
    return hutch_err_invalid(err, "unknown template command `%s` (list, get, delete or create)", act);
  if (a->action == HUTCH_TPL_LIST) {
    if (nwords > 1) return hutch_err_invalid(err, "unexpected argument `%s`", words[1]);
  } else {
    if (nwords < 2) return hutch_err_invalid(err, "missing template NAME");
    if (!*words[1]) return hutch_err_invalid(err, "empty template NAME");
    a->name = words[1];
  }
  if (a->action != HUTCH_TPL_CREATE) {
    if (create_only) return only_for(create_only, "template create", err);
    json_decref(a->body);
    a->body = NULL;
    return 0;
  }

  /* The source: given, or implied by --from-snapshot or --oci. */
  if (source && !in_set(template_sources, source))
    return hutch_err_invalid(err, "--source `%s`: expected host, busybox, debian, oci or snapshot",
                             source);
  if (snap && source && strcmp(source, "snapshot") != 0)
    return hutch_err_invalid(err, "--from-snapshot implies --source snapshot, not `%s`", source);
  if (oci && source && strcmp(source, "oci") != 0)
    return hutch_err_invalid(err, "--oci implies --source oci, not `%s`", source);
  if (snap && oci) return hutch_err_invalid(err, "--from-snapshot and --oci exclude each other");
  if (!source) source = snap ? "snapshot" : oci ? "oci" : NULL;
  if (!source)
    return hutch_err_invalid(err, "missing --source (host, busybox, debian, oci or snapshot)");
  bool debian = strcmp(source, "debian") == 0, is_oci = strcmp(source, "oci") == 0;
  if (!debian && (suite || mirror || json_array_size(packages)))
    return only_for(suite ? "suite" : mirror ? "mirror" : "package", "--source debian", err);
  if (!is_oci && image) return only_for("image", "--source oci", err);
  if (is_oci && !oci) return hutch_err_invalid(err, "--source oci needs --oci PATH");
  if (strcmp(source, "snapshot") == 0 && !snap)
    return hutch_err_invalid(err, "--source snapshot needs --from-snapshot SNAP");

  /* name and source first, then the source's own fields. */
  json_t *name = utf8_string("template NAME", a->name, err);
  if (!name) return -1;
  json_t *body = json_object();
  json_object_set_new(body, "name", name);
  json_object_set_new(body, "source", json_string(source));
  if ((suite && set_string(body, "suite", "suite", suite, err) < 0) ||
      (mirror && set_string(body, "mirror", "mirror", mirror, err) < 0) ||
      (oci && set_string(body, "path", "oci", oci, err) < 0) ||
      (image && set_string(body, "image", "image", image, err) < 0) ||
      (snap && set_string(body, "snapshot", "from-snapshot", snap, err) < 0)) {
    json_decref(body);
    return -1;
  }
  if (json_array_size(packages)) json_object_set(body, "packages", packages);
  json_decref(a->body);
  a->body = body;
  return 0;
}

void hutch_template_args_free(hutch_template_args *a) {
  json_decref(a->body);
  a->body = NULL;
}

int hutch_parse_snapshot_args(int argc, char **argv, hutch_snapshot_args *a, hutch_err *err) {
  static const hutch_opt opts[] = {
      {"label", 0, true, K_LABEL},       {"kind", 0, true, K_KIND},
      {"output", 'o', true, K_OUTPUT},   {"parent", 0, true, K_PARENT},
      {"incremental", 0, false, K_INCREMENTAL},
      {"full", 0, false, K_FULL},
      OPT_JSON,
      OPT_HELP,
      OPT_END,
  };
  memset(a, 0, sizeof *a);
  a->ids = xcalloc((size_t)argc + 1, sizeof *a->ids);
  a->body = json_object();
  a->query = xstrdup("");
  const char *action = NULL, *kind = NULL, *parent = NULL;
  bool incremental = false, labels = false, full = false;
  hutch_argp p;
  hutch_argp_init(&p, argc, argv, opts, -1);
  int k;
  while ((k = hutch_argp_next(&p, err)) > HUTCH_ARG_END) {
    switch (k) {
      case HUTCH_ARG_POSITIONAL:
        if (!action) {
          action = p.arg;
        } else {
          if (!*p.arg) return hutch_err_invalid(err, "empty argument");
          a->ids[a->nids++] = p.arg;
        }
        break;
      case K_HELP: a->help = true; return 0;
      case K_JSON: a->json = true; break;
      case K_LABEL:
        labels = true;
        if (hutch_parse_kv("label", p.arg, sub_object(a->body, "labels"), err) < 0) return -1;
        break;
      case K_KIND:
        if (!in_set(snapshot_kinds, p.arg))
          return hutch_err_invalid(err, "--kind `%s`: expected manual, auto, fork, full or imported",
                                   p.arg);
        kind = p.arg;
        break;
      case K_OUTPUT:
        if (nonempty("output", p.arg, err) < 0) return -1;
        a->output = p.arg;
        break;
      case K_PARENT:
        if (nonempty("parent", p.arg, err) < 0) return -1;
        parent = p.arg;
        break;
      case K_INCREMENTAL: incremental = true; break;
      case K_FULL: full = true; break;
    }
  }
  if (k < 0) return -1;
  static const char actions[] = "create, list, get, delete, export or import";
  if (!action) return hutch_err_invalid(err, "missing snapshot command (%s)", actions);
  struct {
    const char *name;
    enum hutch_snap_action action;
    int min, max; /* words after the action */
    const char *word;
  } const table[] = {
      {"create", HUTCH_SNAP_CREATE, 1, 1, "sandbox ID"},
      {"list", HUTCH_SNAP_LIST, 0, 1, NULL},
      {"ls", HUTCH_SNAP_LIST, 0, 1, NULL},
      {"get", HUTCH_SNAP_GET, 1, 1, "snapshot ID"},
      {"delete", HUTCH_SNAP_DELETE, 1, -1, "snapshot ID"},
      {"rm", HUTCH_SNAP_DELETE, 1, -1, "snapshot ID"},
      {"export", HUTCH_SNAP_EXPORT, 1, 1, "snapshot ID"},
      {"import", HUTCH_SNAP_IMPORT, 1, 1, "FILE"},
  };
  size_t t;
  for (t = 0; t < sizeof table / sizeof *table; t++)
    if (strcmp(table[t].name, action) == 0) break;
  if (t == sizeof table / sizeof *table)
    return hutch_err_invalid(err, "unknown snapshot command `%s` (%s)", action, actions);
  a->action = table[t].action;
  if (a->nids < table[t].min) return hutch_err_invalid(err, "missing %s", table[t].word);
  if (table[t].max >= 0 && a->nids > table[t].max)
    return hutch_err_invalid(err, "unexpected argument `%s`", a->ids[table[t].max]);
  if (labels && a->action != HUTCH_SNAP_CREATE) return only_for("label", "snapshot create", err);
  if (full && a->action != HUTCH_SNAP_CREATE) return only_for("full", "snapshot create", err);
  if (full) json_object_set_new(a->body, "kind", json_string("full"));
  if (kind && a->action != HUTCH_SNAP_LIST) return only_for("kind", "snapshot list", err);
  if (a->action != HUTCH_SNAP_EXPORT) {
    if (a->output) return only_for("output", "snapshot export", err);
    if (parent) return only_for("parent", "snapshot export", err);
    if (incremental) return only_for("incremental", "snapshot export", err);
  }
  if (parent && incremental) return hutch_err_invalid(err, "--parent and --incremental exclude each other");
  if (a->action == HUTCH_SNAP_EXPORT && a->json)
    return hutch_err_invalid(err, "--json does not apply to `snapshot export` (it writes the stream)");
  if (kind) query_add(&a->query, "kind", kind);
  if (parent) query_add(&a->query, "parent", parent);
  if (incremental) query_add(&a->query, "incremental", "true");
  return 0;
}

void hutch_snapshot_args_free(hutch_snapshot_args *a) {
  free(a->ids);
  json_decref(a->body);
  free(a->query);
  a->ids = NULL;
  a->body = NULL;
  a->query = NULL;
}

static int body_opt(void *arg, int key, const char *val, hutch_err *err) {
  hutch_body_args *a = arg;
  switch (key) {
    case K_JSON: a->json = true; return 0;
    case K_LABEL: return hutch_parse_kv("label", val, sub_object(a->body, "labels"), err);
    case K_SNAPSHOT: return set_string(a->body, "snapshot", "snapshot", val, err);
    case K_COUNT: {
      long long n = 0;
      if (hutch_parse_int("count", val, HUTCH_ARG_INT_MAX, &n, err) < 0) return -1;
      if (n == 0) return hutch_err_invalid(err, "--count `%s`: at least 1", val);
      json_object_set_new(a->body, "count", json_integer(n));
      return 0;
    }
    default: return 0;
  }
}

int hutch_parse_rollback_args(int argc, char **argv, hutch_body_args *a, hutch_err *err) {
  static const hutch_opt opts[] = {OPT_JSON, OPT_HELP, OPT_END};
  static const char *const names[] = {"sandbox ID", "snapshot ID"};
  memset(a, 0, sizeof *a);
  a->body = json_object();
  const char *w[2] = {NULL, NULL};
  if (parse_words(argc, argv, opts, body_opt, a, &a->help, w, 2, names, err) < 0) return -1;
  if (a->help) return 0;
  a->id = w[0];
  json_t *snap = utf8_string("snapshot ID", w[1], err);
  if (!snap) return -1;
  json_object_set_new(a->body, "snapshot", snap);
  return 0;
}

int hutch_parse_fork_args(int argc, char **argv, hutch_body_args *a, hutch_err *err) {
  static const hutch_opt opts[] = {{"count", 'n', true, K_COUNT},
                                   {"snapshot", 0, true, K_SNAPSHOT},
                                   {"label", 0, true, K_LABEL},
                                   OPT_JSON,
                                   OPT_HELP,
                                   OPT_END};
  static const char *const names[] = {"sandbox ID"};
  memset(a, 0, sizeof *a);
  a->body = json_object();
  const char *w[1] = {NULL};
  if (parse_words(argc, argv, opts, body_opt, a, &a->help, w, 1, names, err) < 0) return -1;
  a->id = w[0];
  return 0;
}

void hutch_body_args_free(hutch_body_args *a) {
  json_decref(a->body);
  a->body = NULL;
}
