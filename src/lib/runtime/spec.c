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
  free(s->runsc_path);
  free(s->runsc_platform);
  free(s->state_dir);
  free(s->bundle_dir);
  free(s->restore_from);
  memset(s, 0, sizeof *s);
}

char *hutch_spec_to_json(const struct hutch_sandbox_spec *s) {
  /* Optional strings use "s*": a NULL one is left out (from_json reads an
   * absent member as NULL). */
  json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:s*, s:s*, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I,"
                        " s:s*, s:s*, s:s*, s:s*, s:s*}",
                        "id", s->id, "instance", s->instance, "runtime", s->runtime, "rootfs", s->rootfs, "lower",
                        s->lower, "usr_src", s->usr_src, "init_path", s->init_path, "hostname", s->hostname,
                        "uid_base", (json_int_t)s->uid_base, "uid_count", (json_int_t)s->uid_count, "memory_bytes",
                        (json_int_t)s->limits.memory_bytes, "pids", (json_int_t)s->limits.pids, "cpu_millis",
                        (json_int_t)s->limits.cpu_millis, "tmp_bytes", (json_int_t)s->tmp_bytes, "runsc_path",
                        s->runsc_path, "runsc_platform", s->runsc_platform, "state_dir", s->state_dir, "bundle_dir",
                        s->bundle_dir, "restore_from", s->restore_from);
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
  const char *runsc = NULL, *platform = NULL, *state = NULL, *bundle = NULL, *restore = NULL;
  json_int_t uid_base, uid_count, mem, pids, cpu, tmp;
  if (json_unpack_ex(o, &je, JSON_STRICT,
                     "{s:s, s:s, s:s, s:s, s?s, s?s, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s?s, s?s, s?s, s?s, s?s}",
                     "id", &id, "instance", &instance, "runtime", &runtime, "rootfs", &rootfs, "lower", &lower,
                     "usr_src", &usr, "init_path", &init, "hostname", &hostname, "uid_base", &uid_base, "uid_count",
                     &uid_count, "memory_bytes", &mem, "pids", &pids, "cpu_millis", &cpu, "tmp_bytes", &tmp,
                     "runsc_path", &runsc, "runsc_platform", &platform, "state_dir", &state, "bundle_dir", &bundle,
                     "restore_from", &restore) < 0) {
    json_decref(o);
    return hutch_err_invalid(err, "sandbox spec: %s", je.text);
  }
  /* gvisor's paths are absolute; runsc is a path or a bare name for PATH;
   * the platform a plain word (it becomes one runsc flag value). */
  const char *bad = NULL;
  if ((state && state[0] != '/') || (bundle && bundle[0] != '/') || (restore && restore[0] != '/'))
    bad = "state_dir, bundle_dir and restore_from must be absolute paths";
  else if (runsc && (!*runsc || (strchr(runsc, '/') && runsc[0] != '/')))
    bad = "runsc_path must be an absolute path or a program name";
  else if (platform && (!*platform || platform[strspn(platform, "abcdefghijklmnopqrstuvwxyz0123456789_-")]))
    bad = "runsc_platform must be a word of [a-z0-9_-]";
  if (bad) {
    json_decref(o);
    return hutch_err_invalid(err, "sandbox spec: %s", bad);
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
  out->runsc_path = runsc ? xstrdup(runsc) : NULL;
  out->runsc_platform = platform ? xstrdup(platform) : NULL;
  out->state_dir = state ? xstrdup(state) : NULL;
  out->bundle_dir = bundle ? xstrdup(bundle) : NULL;
  out->restore_from = restore ? xstrdup(restore) : NULL;
  json_decref(o);
  return 0;
}
