/* hutch-gateway's audit log (see audit.h). */
#include "gateway/audit.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api/json.h"
#include "common/util.h"
#include "gateway/control.h"

static json_t *str_or_null(const char *s) { return s ? hutch_json_string_lossy(s, strlen(s)) : json_null(); }

char *gw_audit_line(const struct gw_audit_rec *r, uint64_t time_ms) {
  char ts[32];
  iso8601(time_ms, ts);
  json_t *o = json_object();
  json_object_set_new(o, "time", json_string(ts));
  json_object_set_new(o, "sandbox", str_or_null(r->sandbox ? r->sandbox : "unknown"));
  json_object_set_new(o, "proto", str_or_null(r->proto));
  json_object_set_new(o, "name", str_or_null(r->name && *r->name ? r->name : NULL));
  json_object_set_new(o, "addr", str_or_null(r->addr && *r->addr ? r->addr : NULL));
  json_object_set_new(o, "port", r->port > 0 ? json_integer(r->port) : json_null());
  json_object_set_new(o, "decision", str_or_null(r->decision));
  json_object_set_new(o, "rule", str_or_null(r->rule));
  json_object_set_new(o, "reason", str_or_null(r->reason));
  json_object_set_new(o, "bytes_up", json_integer((json_int_t)r->bytes_up));
  json_object_set_new(o, "bytes_down", json_integer((json_int_t)r->bytes_down));
  char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(o);
  if (!s) return NULL;
  char *line = xasprintf("%s\n", s);
  free(s);
  return line;
}

int gw_audit_write(int dirfd, const struct gw_audit_rec *r, size_t cap, hutch_err *err) {
  const char *sb = r->sandbox ? r->sandbox : "unknown";
  if (r->sandbox && !gw_sandbox_id_ok(r->sandbox)) return hutch_err_invalid(err, "audit: invalid sandbox id");
  char name[GW_SANDBOX_ID_MAX + 16], old[GW_SANDBOX_ID_MAX + 16];
  snprintf(name, sizeof name, "%s.jsonl", sb);
  snprintf(old, sizeof old, "%s.jsonl.1", sb);
  cleanup_free char *line = gw_audit_line(r, now_ms());
  if (!line) return hutch_err_sys(err, 0, "audit: encode the line");
  size_t n = strlen(line);
  for (int attempt = 0; attempt < 2; attempt++) {
    cleanup_close int fd = openat(dirfd, name, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY, 0640);
    if (fd < 0) return hutch_err_sys(err, errno, "audit: open `%s`", name);
    struct stat st;
    if (fstat(fd, &st) < 0) return hutch_err_sys(err, errno, "audit: stat `%s`", name);
    if (!S_ISREG(st.st_mode)) return hutch_err_sys(err, 0, "audit: `%s` is not a regular file", name);
    if (attempt == 0 && cap && (uint64_t)st.st_size + n > cap && st.st_size > 0) {
      if (renameat(dirfd, name, dirfd, old) < 0) return hutch_err_sys(err, errno, "audit: rotate `%s`", name);
      continue;
    }
    if (write_full(fd, line, n) < 0) return hutch_err_sys(err, errno, "audit: write `%s`", name);
    return 0;
  }
  return hutch_err_sys(err, 0, "audit: rotate `%s`", name);
}
