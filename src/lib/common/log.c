#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/util.h"

static enum hutch_log_level min_level = HUTCH_LOG_INFO;
static const char *component = NULL;

void hutch_log_set_level(enum hutch_log_level lvl) { min_level = lvl; }
void hutch_log_set_component(const char *name) { component = name; }

static const char *level_name(enum hutch_log_level l) {
  switch (l) {
    case HUTCH_LOG_DEBUG: return "debug";
    case HUTCH_LOG_INFO: return "info";
    case HUTCH_LOG_WARN: return "warn";
    default: return "error";
  }
}

static void append(char *buf, size_t cap, size_t *len, const char *s, size_t n) {
  if (*len + n >= cap) n = cap - 1 - *len;
  memcpy(buf + *len, s, n);
  *len += n;
  buf[*len] = 0;
}

static void append_value(char *buf, size_t cap, size_t *len, const char *v) {
  if (!v) v = "";
  int quote = *v == 0 || strpbrk(v, " \"=\n\t\\") != NULL;
  if (!quote) {
    append(buf, cap, len, v, strlen(v));
    return;
  }
  append(buf, cap, len, "\"", 1);
  for (const char *p = v; *p; p++) {
    if (*p == '"' || *p == '\\') append(buf, cap, len, "\\", 1);
    if (*p == '\n') append(buf, cap, len, "\\n", 2);
    else if (*p == '\t') append(buf, cap, len, "\\t", 2);
    else append(buf, cap, len, p, 1);
  }
  append(buf, cap, len, "\"", 1);
}

void hutch_log_kv(enum hutch_log_level lvl, const char *event, const char *const *kv) {
  if (lvl < min_level) return;
  char line[4096];
  size_t len = 0;
  char ts[32];
  iso8601(now_ms(), ts);
  line[0] = 0;
  append(line, sizeof line, &len, "ts=", 3);
  append(line, sizeof line, &len, ts, strlen(ts));
  append(line, sizeof line, &len, " level=", 7);
  append(line, sizeof line, &len, level_name(lvl), strlen(level_name(lvl)));
  if (component) {
    append(line, sizeof line, &len, " comp=", 6);
    append(line, sizeof line, &len, component, strlen(component));
  }
  append(line, sizeof line, &len, " event=", 7);
  append_value(line, sizeof line, &len, event);
  for (size_t i = 0; kv && kv[i]; i += 2) {
    append(line, sizeof line, &len, " ", 1);
    append(line, sizeof line, &len, kv[i], strlen(kv[i]));
    append(line, sizeof line, &len, "=", 1);
    append_value(line, sizeof line, &len, kv[i + 1]);
    if (!kv[i + 1]) break;
  }
  append(line, sizeof line, &len, "\n", 1);
  fwrite(line, 1, len, stderr);
  fflush(stderr);
}

void hutch_log(enum hutch_log_level lvl, const char *event, ...) {
  const char *kv[64];
  size_t n = 0;
  va_list ap;
  va_start(ap, event);
  const char *s;
  while (n < 62 && (s = va_arg(ap, const char *))) kv[n++] = s;
  va_end(ap);
  if (n % 2) kv[n++] = "";
  kv[n] = NULL;
  hutch_log_kv(lvl, event, kv);
}
