/* Helpers shared by the `hutch` verbs: error printing, calls, output. */
#include "cli.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "common/util.h"
#include "wire.h"

void hutch_errorf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("hutch: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

int hutch_usage_fail(const char *usage, const hutch_err *err) {
  hutch_errorf("%s", err->msg);
  fputs(usage, stderr);
  return HUTCH_EXIT_USAGE;
}

int hutch_print_help(const char *help) {
  fputs(help, stdout);
  return HUTCH_EXIT_OK;
}

int hutch_call(hutch_cli *cli, const char *method, const char *path, json_t *body,
               hutch_response *resp) {
  hutch_err err = HUTCH_ERR_INIT;
  if (hutch_request(&cli->client, method, path, body, resp, &err) < 0) {
    hutch_errorf("%s", err.msg);
    return -1;
  }
  if (hutch_response_check(resp, &err) < 0) {
    hutch_errorf("%s", err.msg);
    hutch_response_free(resp);
    return -1;
  }
  if (resp->len && !resp->json) {
    hutch_errorf("%s %s: hutchd sent a reply that is not JSON (HTTP %ld)", method, path,
                 resp->status);
    hutch_response_free(resp);
    return -1;
  }
  return 0;
}

void hutch_print_body(const hutch_response *resp) {
  fwrite(resp->body, 1, resp->len, stdout);
  if (resp->len == 0 || resp->body[resp->len - 1] != '\n') fputc('\n', stdout);
}

volatile sig_atomic_t hutch_stop_signal;

static void on_stop_signal(int sig) {
  if (!hutch_stop_signal) hutch_stop_signal = sig;
}

void hutch_catch_stop_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0; /* no SA_RESTART: a blocked read returns and sees the flag */
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
}

int hutch_fd_sink(void *ctx, const char *data, size_t n, hutch_err *err) {
  hutch_fd_io *io = ctx;
  if (write_full(io->fd, data, n) < 0) {
    if (errno == EPIPE) return hutch_err_set(err, 0, "epipe", "%s: closed early", io->what);
    return hutch_err_sys(err, errno, "write to %s", io->what);
  }
  return 0;
}

ssize_t hutch_fd_source(void *ctx, char *buf, size_t n, hutch_err *err) {
  hutch_fd_io *io = ctx;
  if (io->left >= 0 && (long long)n > io->left) n = (size_t)io->left;
  if (n == 0) return 0;
  for (;;) {
    ssize_t r = read(io->fd, buf, n);
    if (r < 0 && errno == EINTR) {
      if (hutch_stop_signal) return hutch_err_set(err, 0, "interrupted", "interrupted");
      continue;
    }
    if (r < 0) return hutch_err_sys(err, errno, "read %s", io->what);
    if (r == 0 && io->left > 0)
      return hutch_err_set(err, 0, "internal", "%s: the file shrank while it was copied",
                           io->what);
    if (io->left >= 0) io->left -= r;
    return r;
  }
}

char *hutch_temp_beside(const char *dest) {
  const char *slash = strrchr(dest, '/');
  cleanup_free char *base = hutch_path_base(dest);
  if (!slash) return xasprintf(".%s.hutch-XXXXXX", base);
  if (slash == dest) return xasprintf("/.%s.hutch-XXXXXX", base);
  return xasprintf("%.*s/.%s.hutch-XXXXXX", (int)(slash - dest), dest, base);
}

char *hutch_id_path(const char *prefix, const char *id, const char *suffix) {
  cleanup_free char *e = hutch_url_escape(id, NULL);
  return xasprintf("%s%s%s", prefix, e, suffix ? suffix : "");
}

/* Replace C0 controls, DEL and the C1 controls (UTF-8 C2 80..C2 9F) with
 * '?', in place: labels and names are caller-chosen bytes, and a terminal
 * would act on escape sequences in them. */
static void make_safe(char *s) {
  for (unsigned char *p = (unsigned char *)s; *p; p++) {
    if (*p < 0x20 || *p == 0x7f) {
      *p = '?';
    } else if (*p == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f) {
      p[0] = '?';
      memmove(p + 1, p + 2, strlen((char *)p + 2) + 1);
    }
  }
}

char *hutch_display(json_t *v) {
  if (!v) return xstrdup("-");
  char *s;
  switch (json_typeof(v)) {
    case JSON_STRING: s = xstrdup(json_string_value(v)); break; /* stops at a NUL */
    case JSON_INTEGER: s = xasprintf("%lld", (long long)json_integer_value(v)); break;
    case JSON_REAL: s = xasprintf("%.15g", json_real_value(v)); break;
    case JSON_TRUE: s = xstrdup("true"); break;
    case JSON_FALSE: s = xstrdup("false"); break;
    case JSON_OBJECT:
    case JSON_ARRAY: {
      char *d = json_dumps(v, JSON_COMPACT);
      s = xstrdup(d ? d : "?");
      free(d);
      break;
    }
    default: s = xstrdup("-"); break; /* null */
  }
  make_safe(s);
  return s;
}

char *hutch_kv_list(json_t *obj) {
  if (!json_is_object(obj) || json_object_size(obj) == 0) return xstrdup("-");
  char *out = xstrdup("");
  const char *k;
  json_t *v;
  json_object_foreach(obj, k, v) {
    cleanup_free char *old = out;
    cleanup_free char *val = hutch_display(v);
    cleanup_free char *key = xstrdup(k);
    make_safe(key);
    out = xasprintf("%s%s%s=%s", old, *old ? "," : "", key, val);
  }
  return out;
}

/* Display width: UTF-8 continuation bytes take no column. */
static size_t width(const char *s) {
  size_t w = 0;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++)
    if ((*p & 0xc0) != 0x80) w++;
  return w;
}

void hutch_table_init(hutch_table *t, size_t ncols, const char *const *header) {
  memset(t, 0, sizeof *t);
  t->ncols = ncols;
  char **row = xcalloc(ncols, sizeof *row);
  for (size_t i = 0; i < ncols; i++) row[i] = xstrdup(header[i]);
  hutch_table_add(t, row);
  free(row);
}

void hutch_table_add(hutch_table *t, char **row) {
  t->cells = xrealloc(t->cells, (t->nrows + 1) * t->ncols * sizeof *t->cells);
  memcpy(t->cells + t->nrows * t->ncols, row, t->ncols * sizeof *row);
  t->nrows++;
}

void hutch_table_print(const hutch_table *t, FILE *f) {
  cleanup_free size_t *w = xcalloc(t->ncols, sizeof *w);
  for (size_t r = 0; r < t->nrows; r++)
    for (size_t c = 0; c < t->ncols; c++) {
      size_t cw = width(t->cells[r * t->ncols + c]);
      if (cw > w[c]) w[c] = cw;
    }
  for (size_t r = 0; r < t->nrows; r++) {
    for (size_t c = 0; c < t->ncols; c++) {
      const char *cell = t->cells[r * t->ncols + c];
      fputs(cell, f);
      if (c + 1 < t->ncols)
        for (size_t pad = width(cell); pad < w[c] + 3; pad++) fputc(' ', f);
    }
    fputc('\n', f);
  }
}

void hutch_table_free(hutch_table *t) {
  for (size_t i = 0; i < t->nrows * t->ncols; i++) free(t->cells[i]);
  free(t->cells);
  memset(t, 0, sizeof *t);
}

struct kv_lines {
  char **keys, **vals;
  size_t n;
};

static void kv_add(struct kv_lines *l, char *key, char *val) {
  l->keys = xrealloc(l->keys, (l->n + 1) * sizeof *l->keys);
  l->vals = xrealloc(l->vals, (l->n + 1) * sizeof *l->vals);
  make_safe(key);
  l->keys[l->n] = key;
  l->vals[l->n] = val;
  l->n++;
}

static bool is_inline(const char *key, const char *const *inline_objects) {
  for (; inline_objects && *inline_objects; inline_objects++)
    if (strcmp(*inline_objects, key) == 0) return true;
  return false;
}

static void flatten(struct kv_lines *l, const char *prefix, json_t *obj,
                    const char *const *inline_objects) {
  const char *k;
  json_t *v;
  json_object_foreach(obj, k, v) {
    char *key = xasprintf("%s%s", prefix, k);
    if (json_is_object(v) && !*prefix && is_inline(k, inline_objects)) {
      kv_add(l, key, hutch_kv_list(v));
    } else if (json_is_object(v) && json_object_size(v) > 0) {
      cleanup_free char *sub = xasprintf("%s.", key);
      free(key);
      flatten(l, sub, v, NULL);
    } else if (json_is_object(v)) {
      kv_add(l, key, xstrdup("-"));
    } else {
      kv_add(l, key, hutch_display(v));
    }
  }
}

void hutch_print_object(json_t *obj, const char *const *inline_objects, FILE *f) {
  struct kv_lines l = {0};
  if (json_is_object(obj)) flatten(&l, "", obj, inline_objects);
  size_t w = 0;
  for (size_t i = 0; i < l.n; i++)
    if (width(l.keys[i]) > w) w = width(l.keys[i]);
  for (size_t i = 0; i < l.n; i++) {
    fprintf(f, "%s:", l.keys[i]);
    for (size_t pad = width(l.keys[i]); pad < w + 1; pad++) fputc(' ', f);
    fprintf(f, "%s\n", l.vals[i]);
    free(l.keys[i]);
    free(l.vals[i]);
  }
  free(l.keys);
  free(l.vals);
}
