#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "runtime/runtime.h"

void hutch_spec_free(struct hutch_sandbox_spec *s) {
  free(s->id);
  free(s->instance);
  free(s->runtime);
  free(s->rootfs);
  free(s->lower);
  free(s->usr_src);
  free(s->init_path);
  free(s->hostname);
  memset(s, 0, sizeof *s);
}

char *hutch_spec_to_json(const struct hutch_sandbox_spec *s) {
  json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:s*, s:s*, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I}", "id", s->id,
                        "instance", s->instance, "runtime", s->runtime, "rootfs", s->rootfs, "lower", s->lower, "usr_src",
                        s->usr_src, "init_path", s->init_path, "hostname", s->hostname, "uid_base",
                        (json_int_t)s->uid_base, "uid_count", (json_int_t)s->uid_count, "memory_bytes",
                        (json_int_t)s->limits.memory_bytes, "pids", (json_int_t)s->limits.pids, "cpu_millis",
                        (json_int_t)s->limits.cpu_millis, "tmp_bytes", (json_int_t)s->tmp_bytes);
  if (!o) return NULL;
  char *text = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  return text;
}

int hutch_spec_from_json(const char *text, struct hutch_sandbox_spec *out, hutch_err *err) {
  memset(out, 0, sizeof *out);
  json_error_t je;
  json_t *o = json_loads(text, JSON_REJECT_DUPLICATES, &je);
  if (!o) return hutch_err_invalid(err, "sandbox spec: %s (line %d)", je.text, je.line);
  const char *id, *instance, *runtime, *rootfs, *lower = NULL, *usr = NULL, *init, *hostname;
  json_int_t uid_base, uid_count, mem, pids, cpu, tmp;
  if (json_unpack_ex(o, &je, JSON_STRICT, "{s:s, s:s, s:s, s:s, s?s, s?s, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I}", "id",
                     &id, "instance", &instance, "runtime", &runtime, "rootfs", &rootfs, "lower", &lower, "usr_src", &usr,
                     "init_path", &init, "hostname", &hostname, "uid_base", &uid_base, "uid_count", &uid_count,
                     "memory_bytes", &mem, "pids", &pids, "cpu_millis", &cpu, "tmp_bytes", &tmp) < 0) {
    json_decref(o);
    return hutch_err_invalid(err, "sandbox spec: %s", je.text);
  }
  if (uid_base <= 0 || uid_base > 0xffffffffLL || uid_count <= 0 || uid_count > 65536 || mem < 0 || pids < 0 ||
      cpu < 0 || cpu > 1000000 || tmp < 0) {
    json_decref(o);
    return hutch_err_invalid(err, "sandbox spec: value out of range");
  }
  out->id = xstrdup(id);
  out->instance = xstrdup(instance);
  out->runtime = xstrdup(runtime);
  out->rootfs = xstrdup(rootfs);
  out->lower = lower ? xstrdup(lower) : NULL;
  out->usr_src = usr ? xstrdup(usr) : NULL;
  out->init_path = xstrdup(init);
  out->hostname = xstrdup(hostname);
  out->uid_base = (uint32_t)uid_base;
  out->uid_count = (uint32_t)uid_count;
  out->limits.memory_bytes = (uint64_t)mem;
  out->limits.pids = (uint64_t)pids;
  out->limits.cpu_millis = (uint32_t)cpu;
  out->tmp_bytes = (uint64_t)tmp;
  json_decref(o);
  return 0;
}
