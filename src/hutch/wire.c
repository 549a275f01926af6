/* Pure helpers for the streaming verbs; see wire.h. */
#include "wire.h"

#include <stdlib.h>
#include <string.h>

#include "common/util.h"

static int b64_value(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

long hutch_b64_decode(const char *in, size_t n, unsigned char *out) {
  /* Padding: at most two '=' at the very end. */
  size_t pad = 0;
  while (n > 0 && in[n - 1] == '=' && pad < 2) {
    n--;
    pad++;
  }
  if (pad && (n + pad) % 4 != 0) return -1;
  if (n % 4 == 1) return -1;
  size_t o = 0;
  unsigned acc = 0;
  int bits = 0;
  for (size_t i = 0; i < n; i++) {
    int v = b64_value((unsigned char)in[i]);
    if (v < 0) return -1;
    acc = (acc << 6) | (unsigned)v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out[o++] = (unsigned char)(acc >> bits);
      acc &= (1u << bits) - 1;
    }
  }
  return (long)o;
}

void hutch_lines_init(hutch_lines *l, size_t max) {
  memset(l, 0, sizeof *l);
  l->max = max;
}

void hutch_lines_free(hutch_lines *l) {
  free(l->buf);
  memset(l, 0, sizeof *l);
}

static int too_long(const hutch_lines *l, hutch_err *err) {
  return hutch_err_set(err, 0, "internal", "an event line from hutchd is longer than %zu bytes",
                       l->max);
}

/* Append to the partial line, growing the buffer only up to max. */
static int hold(hutch_lines *l, const char *data, size_t n, hutch_err *err) {
  if (n > l->max - l->len) return too_long(l, err);
  if (l->len + n > l->cap) {
    size_t cap = l->cap ? l->cap : 4096;
    while (cap < l->len + n) cap *= 2;
    if (cap > l->max) cap = l->max;
    l->buf = xrealloc(l->buf, cap);
    l->cap = cap;
  }
  memcpy(l->buf + l->len, data, n);
  l->len += n;
  return 0;
}

int hutch_lines_feed(hutch_lines *l, const char *data, size_t n, hutch_line_fn fn, void *ctx,
                     hutch_err *err) {
  while (n > 0) {
    const char *nl = memchr(data, '\n', n);
    if (!nl) return hold(l, data, n, err);
    size_t part = (size_t)(nl - data);
    if (l->len) {
      if (hold(l, data, part, err) < 0) return -1;
      size_t len = l->len;
      l->len = 0; /* before fn: it may fail */
      if (fn(ctx, l->buf, len, err) < 0) return -1;
    } else {
      if (part > l->max) return too_long(l, err);
      if (fn(ctx, data, part, err) < 0) return -1;
    }
    data = nl + 1;
    n -= part + 1;
  }
  return 0;
}

int hutch_command_status(json_t *obj) {
  json_t *code = json_object_get(obj, "exit_code");
  json_t *sig = json_object_get(obj, "signal");
  if (json_is_integer(code) && json_integer_value(code) >= 0 && json_integer_value(code) <= 255)
    return (int)json_integer_value(code);
  if (json_is_true(json_object_get(obj, "timed_out"))) return 124;
  if (json_is_integer(sig) && json_integer_value(sig) > 0 && json_integer_value(sig) < 128)
    return 128 + (int)json_integer_value(sig);
  return 1;
}

struct strbuf {
  char *s;
  size_t len, cap;
};

static void sb_add(struct strbuf *b, const char *s, size_t n) {
  if (b->len + n + 1 > b->cap) {
    b->cap = (b->len + n + 1) * 2;
    b->s = xrealloc(b->s, b->cap);
  }
  memcpy(b->s + b->len, s, n);
  b->len += n;
  b->s[b->len] = '\0';
}

/* Control characters (C0, DEL, UTF-8 C1) would let sandbox data drive the
 * terminal: show them as '?'.  NULs inside strings end the text. */
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

char *hutch_argv_display(json_t *argv) {
  if (!json_is_array(argv) || json_array_size(argv) == 0) return xstrdup("-");
  struct strbuf b = {0};
  size_t i;
  json_t *w;
  json_array_foreach(argv, i, w) {
    const char *s = json_string_value(w);
    if (!s) s = "?";
    size_t n = strlen(s);
    if (i) sb_add(&b, " ", 1);
    bool quote = n == 0 || strcspn(s, " \t\n'\"\\$`|&;<>()*?[]{}~#!") < n;
    if (!quote) {
      sb_add(&b, s, n);
      continue;
    }
    sb_add(&b, "'", 1);
    for (size_t j = 0; j < n; j++) {
      if (s[j] == '\'')
        sb_add(&b, "'\\''", 4);
      else
        sb_add(&b, s + j, 1);
    }
    sb_add(&b, "'", 1);
  }
  make_safe(b.s);
  return b.s;
}

char *hutch_size_display(json_t *v) {
  if (!json_is_integer(v) || json_integer_value(v) < 0) return xstrdup("-");
  static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  json_int_t n = json_integer_value(v);
  if (n < 1024) return xasprintf("%lld B", (long long)n);
  double d = (double)n / 1024;
  size_t u = 0;
  /* 1023.95 KiB would print as "1024.0 KiB": move up a unit first. */
  while (d >= 1023.95 && u + 1 < sizeof units / sizeof *units) {
    d /= 1024;
    u++;
  }
  return xasprintf("%.1f %s", d, units[u]);
}

char *hutch_path_join(const char *dir, const char *name) {
  size_t n = strlen(dir);
  while (n > 1 && dir[n - 1] == '/') n--;
  while (*name == '/') name++;
  if (n == 0) return xstrdup(name);
  if (n == 1 && dir[0] == '/') return xasprintf("/%s", name);
  return xasprintf("%.*s/%s", (int)n, dir, name);
}

char *hutch_path_base(const char *path) {
  size_t n = strlen(path);
  while (n > 0 && path[n - 1] == '/') n--;
  size_t start = n;
  while (start > 0 && path[start - 1] != '/') start--;
  return xstrndup(path + start, n - start);
}

bool hutch_path_is_contents(const char *path) {
  size_t n = strlen(path);
  return (n == 1 && path[0] == '.') || (n >= 2 && path[n - 1] == '.' && path[n - 2] == '/');
}
