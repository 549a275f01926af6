/* Cgroup management: a v2 (unified) and a v1 backend behind one function
 * table, chosen once by probing the host (see cgroup.h).
 *
 * Layout:
 *   v2: <root>/hutch-<instance>/<id>, controllers enabled top-down through
 *       cgroup.subtree_control.
 *   v1: <hierarchy>/hutch-<instance>/<id> in each of the memory, pids, cpu and
 *       freezer hierarchies, plus cpuacct (for CPU usage) when it is a separate
 *       hierarchy, plus a leaf in a controller-less cgroup2 ("unified") mount
 *       when a hybrid host has one, so that tools which look there (systemd)
 *       see the sandbox.  Co-mounted controllers (cpu,cpuacct) share one dir.
 *
 * Kernel facts the code relies on:
 *   - The root of a v1 pids or freezer hierarchy has no pids.max or
 *     freezer.state, so hierarchies are found from /proc/self/mountinfo
 *     super options, not from files at their root.
 *   - Charges are not moved when a process changes memory cgroup (v2, and v1
 *     with the default move_charge_at_immigrate=0): only memory touched after
 *     attach counts.
 *   - cgroup.kill (v2, Linux 5.14) kills the whole subtree atomically; v1 has
 *     nothing like it, so the cgroup is frozen first to stop fork races.
 *   - v1 frozen tasks keep a pending SIGKILL until thawed.
 */
#include "isolate/cgroup.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <linux/magic.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"

#ifndef CGROUP2_SUPER_MAGIC
#define CGROUP2_SUPER_MAGIC 0x63677270
#endif
#ifndef CGROUP_SUPER_MAGIC
#define CGROUP_SUPER_MAGIC 0x27e0eb
#endif

#define CG_FS "/sys/fs/cgroup"
#define CPU_PERIOD_US 100000u
#define CPU_MIN_QUOTA_US 1000u /* the kernel refuses quotas under 1 ms */
#define POLL_MS 10
#define FREEZE_TIMEOUT_MS 2000
#define V1_FREEZE_BEFORE_KILL_MS 1000
#define EMPTY_TIMEOUT_MS 5000
#define RMDIR_TIMEOUT_MS 1000
#define NAME_MAX_LEN 64

struct cg_backend {
  int (*create)(const char *instance, const char *id, const struct hutch_cgroup_limits *lim, hutch_err *err);
  int (*attach)(const char *instance, const char *id, pid_t pid, hutch_err *err);
  int (*destroy)(const char *instance, const char *id, hutch_err *err);
  int (*freeze)(const char *instance, const char *id, bool frozen, hutch_err *err);
  int (*stats)(const char *instance, const char *id, struct hutch_cgroup_stats *st, hutch_err *err);
  bool (*exists)(const char *instance, const char *id);
  long (*nprocs)(const char *instance, const char *id);
  void (*cleanup_instance)(const char *instance);
  char *(*path)(const char *instance, const char *id, const char *controller);
};

/* v1 hierarchies; the first V1_REQUIRED are mandatory. */
enum { V1_MEMORY, V1_PIDS, V1_CPU, V1_FREEZER, V1_REQUIRED, V1_CPUACCT = V1_REQUIRED, V1_UNIFIED, V1_N };
static const char *const v1_names[V1_N] = {"memory", "pids", "cpu", "freezer", "cpuacct", "unified"};

static struct {
  enum hutch_cgroup_version version;
  const struct cg_backend *be;
  /* Tests only: missing controllers (and their files) are skipped. */
  bool relaxed;
  bool cpu_warned;
  char v2_root[PATH_MAX];
  /* v1: mount point of the hierarchy holding each controller, "" if none. */
  char v1_mnt[V1_N][PATH_MAX];
  /* v1: true when the hierarchy is the same as an earlier entry's. */
  bool v1_dup[V1_N];
} cg;

static pthread_once_t cg_once = PTHREAD_ONCE_INIT;
static int cg_probe_rc;
static hutch_err cg_probe_err;

/* ---- small helpers ------------------------------------------------------ */

static void sleep_ms(unsigned ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
  }
}

static bool valid_name(const char *s) {
  if (!s) return false;
  size_t n = strlen(s);
  if (n < 1 || n > NAME_MAX_LEN) return false;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
      return false;
  }
  return true;
}

static int check_names(const char *instance, const char *id, hutch_err *err) {
  if (!valid_name(instance)) return hutch_err_invalid(err, "invalid cgroup instance name `%s`", instance ? instance : "");
  if (!valid_name(id)) return hutch_err_invalid(err, "invalid cgroup name `%s`", id ? id : "");
  return 0;
}

static bool path_exists(const char *p) { return access(p, F_OK) == 0; }

static bool file_exists_in(const char *dir, const char *file) {
  cleanup_free char *p = xasprintf("%s/%s", dir, file);
  return path_exists(p);
}

static int cg_write(const char *dir, const char *file, const char *val, hutch_err *err) {
  cleanup_free char *p = xasprintf("%s/%s", dir, file);
  return write_file_str(p, val, err);
}

/* Like cg_write, but a missing file or any error is ignored (best effort). */
static void cg_write_quiet(const char *dir, const char *file, const char *val) {
  cg_write(dir, file, val, NULL);
}

static char *cg_read(const char *dir, const char *file, hutch_err *err) {
  cleanup_free char *p = xasprintf("%s/%s", dir, file);
  return read_file(p, 1 << 20, NULL, err);
}

static void trim(char *s) {
  size_t n = strlen(s);
  while (n && (s[n - 1] == '\n' || s[n - 1] == ' ')) s[--n] = 0;
}

/* Reads a file holding one number ("max" reads as UINT64_MAX). */
static int cg_read_u64(const char *dir, const char *file, uint64_t *out, hutch_err *err) {
  cleanup_free char *s = cg_read(dir, file, err);
  if (!s) return -1;
  trim(s);
  if (!strcmp(s, "max")) {
    *out = UINT64_MAX;
    return 0;
  }
  if (parse_u64(s, UINT64_MAX, out) < 0) return hutch_err_sys(err, EINVAL, "parse `%s/%s`: `%s`", dir, file, s);
  return 0;
}

/* Finds "key value" in a flat-keyed file (cpu.stat, memory.events,
 * cgroup.events, memory.oom_control).  Returns 1 if found, 0 if not, -1 on
 * error. */
static int cg_read_key(const char *dir, const char *file, const char *key, uint64_t *out, hutch_err *err) {
  cleanup_free char *s = cg_read(dir, file, err);
  if (!s) return -1;
  size_t klen = strlen(key);
  for (char *line = s; line && *line;) {
    char *nl = strchr(line, '\n');
    if (nl) *nl = 0;
    if (!strncmp(line, key, klen) && line[klen] == ' ') {
      if (parse_u64(line + klen + 1, UINT64_MAX, out) < 0)
        return hutch_err_sys(err, EINVAL, "parse `%s` in `%s/%s`", key, dir, file);
      return 1;
    }
    line = nl ? nl + 1 : NULL;
  }
  return 0;
}

/* Optional statistic: a missing file or key reads as 0. */
static int stat_u64(const char *dir, const char *file, uint64_t *out, hutch_err *err) {
  *out = 0;
  if (!file_exists_in(dir, file)) return 0;
  return cg_read_u64(dir, file, out, err);
}

static int stat_key(const char *dir, const char *file, const char *key, uint64_t *out, hutch_err *err) {
  *out = 0;
  if (!file_exists_in(dir, file)) return 0;
  return cg_read_key(dir, file, key, out, err) < 0 ? -1 : 0;
}

static bool has_word(const char *list, const char *word) {
  size_t n = strlen(word);
  for (const char *p = list; (p = strstr(p, word)); p += n) {
    bool start = p == list || p[-1] == ' ' || p[-1] == '\n';
    bool end = p[n] == 0 || p[n] == ' ' || p[n] == '\n';
    if (start && end) return true;
  }
  return false;
}

/* Sends SIGKILL to every process in `dir`'s cgroup.procs and in its
 * descendants'.  Returns how many pids were listed (0 when the directory is
 * gone). */
static long kill_tree(const char *dir, int depth) {
  long n = 0;
  cleanup_free char *procs = xasprintf("%s/cgroup.procs", dir);
  FILE *f = fopen(procs, "re");
  if (f) {
    long pid;
    while (fscanf(f, "%ld", &pid) == 1) {
      if (pid > 0) kill((pid_t)pid, SIGKILL);
      n++;
    }
    fclose(f);
  }
  if (depth > 32) return n;
  DIR *d = opendir(dir);
  if (!d) return n;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (de->d_type != DT_DIR || de->d_name[0] == '.') continue;
    cleanup_free char *sub = xasprintf("%s/%s", dir, de->d_name);
    n += kill_tree(sub, depth + 1);
  }
  closedir(d);
  return n;
}

/* Number of lines in `dir`/cgroup.procs, or -1. */
static long count_procs(const char *dir) {
  cleanup_free char *procs = xasprintf("%s/cgroup.procs", dir);
  FILE *f = fopen(procs, "re");
  if (!f) return -1;
  long n = 0;
  int c, last = '\n';
  while ((c = getc(f)) != EOF) {
    if (c == '\n') n++;
    last = c;
  }
  if (last != '\n') n++;
  fclose(f);
  return n;
}

/* rmdir of a cgroup directory and its sub-cgroups, deepest first.  Cgroup
 * directories hold only kernel files, which rmdir ignores.  A cgroup whose
 * last task just exited can report EBUSY briefly: retried until the deadline. */
static int rmdir_tree(const char *dir, uint64_t deadline_us, int depth, hutch_err *err) {
  DIR *d = opendir(dir);
  if (!d) {
    if (errno == ENOENT) return 0;
    return hutch_err_sys(err, errno, "open `%s`", dir);
  }
  int ret = 0;
  struct dirent *de;
  while (ret == 0 && (de = readdir(d))) {
    if (de->d_type != DT_DIR || de->d_name[0] == '.') continue;
    if (depth > 32) {
      ret = hutch_err_sys(err, ELOOP, "cgroup tree under `%s` too deep", dir);
      break;
    }
    cleanup_free char *sub = xasprintf("%s/%s", dir, de->d_name);
    ret = rmdir_tree(sub, deadline_us, depth + 1, err);
  }
  closedir(d);
  if (ret < 0) return -1;
  for (;;) {
    if (rmdir(dir) == 0 || errno == ENOENT) return 0;
    if (errno != EBUSY || mono_us() >= deadline_us) return hutch_err_sys(err, errno, "rmdir `%s`", dir);
    sleep_ms(POLL_MS);
  }
}

static void warn_no_cpu_controller(void) {
  /* Once per process: a sandbox silently running without its CPU limit
   * should at least be visible in the log. */
  if (cg.relaxed || __atomic_exchange_n(&cg.cpu_warned, true, __ATOMIC_RELAXED)) return;
  hutch_log(LOG_WARN, "cgroup.cpu_unavailable", "msg", "cpu controller not available; CPU limits are not enforced",
            NULL);
}

/* ---- v2 ----------------------------------------------------------------- */

static char *v2_parent(const char *instance) { return xasprintf("%s/hutch-%s", cg.v2_root, instance); }
static char *v2_dir(const char *instance, const char *id) {
  return xasprintf("%s/hutch-%s/%s", cg.v2_root, instance, id);
}

/* Enables memory, pids and cpu for `dir`'s children.  memory and pids are
 * required; cpu is skipped when unavailable or refused (the kernel refuses it
 * while realtime threads live outside the root cgroup). */
static int v2_enable_controllers(const char *dir, hutch_err *err) {
  static const struct {
    const char *name;
    bool required;
  } want[] = {{"memory", true}, {"pids", true}, {"cpu", false}};
  cleanup_free char *avail = cg_read(dir, "cgroup.controllers", err);
  if (!avail) return -1;
  cleanup_free char *enabled = cg_read(dir, "cgroup.subtree_control", err);
  if (!enabled) return -1;
  for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
    bool required = want[i].required && !cg.relaxed;
    if (has_word(enabled, want[i].name)) continue;
    if (!has_word(avail, want[i].name)) {
      if (required)
        return hutch_err_sys(err, ENOTSUP, "cgroup controller `%s` is not available in `%s`", want[i].name, dir);
      continue;
    }
    char buf[32];
    snprintf(buf, sizeof buf, "+%s", want[i].name);
    if (required) {
      if (cg_write(dir, "cgroup.subtree_control", buf, err) < 0) return -1;
    } else {
      cg_write_quiet(dir, "cgroup.subtree_control", buf);
    }
  }
  return 0;
}

/* Writes a limit file; in relaxed (test) mode a missing file is skipped. */
static int v2_limit(const char *dir, const char *file, const char *val, hutch_err *err) {
  if (cg.relaxed && !file_exists_in(dir, file)) return 0;
  return cg_write(dir, file, val, err);
}

static int v2_set_limits(const char *dir, const struct hutch_cgroup_limits *lim, hutch_err *err) {
  char buf[64];
  if (lim->memory_bytes) snprintf(buf, sizeof buf, "%llu", (unsigned long long)lim->memory_bytes);
  else snprintf(buf, sizeof buf, "max");
  if (v2_limit(dir, "memory.max", buf, err) < 0) return -1;
  /* Absent when the kernel has no swap accounting: nothing to disable then. */
  if (file_exists_in(dir, "memory.swap.max") && cg_write(dir, "memory.swap.max", "0", err) < 0) return -1;

  if (lim->pids) snprintf(buf, sizeof buf, "%llu", (unsigned long long)lim->pids);
  else snprintf(buf, sizeof buf, "max");
  if (v2_limit(dir, "pids.max", buf, err) < 0) return -1;

  if (lim->cpu_millis) {
    if (!file_exists_in(dir, "cpu.max")) {
      warn_no_cpu_controller();
    } else {
      uint64_t quota = (uint64_t)lim->cpu_millis * (CPU_PERIOD_US / 1000);
      if (quota < CPU_MIN_QUOTA_US) quota = CPU_MIN_QUOTA_US;
      snprintf(buf, sizeof buf, "%llu %u", (unsigned long long)quota, CPU_PERIOD_US);
      if (cg_write(dir, "cpu.max", buf, err) < 0) return -1;
    }
  }
  return 0;
}

static int v2_create(const char *instance, const char *id, const struct hutch_cgroup_limits *lim,
                     hutch_err *err) {
  cleanup_free char *parent = v2_parent(instance);
  cleanup_free char *dir = v2_dir(instance, id);
  if (v2_enable_controllers(cg.v2_root, err) < 0) return -1;

  bool made_parent = false;
  /* A concurrent cleanup_instance (or a failing create that made the parent)
   * may remove the parent between our mkdirs: start over a few times. */
  for (int attempt = 0;; attempt++) {
    if (mkdir(parent, 0755) == 0) made_parent = true;
    else if (errno != EEXIST) return hutch_err_sys(err, errno, "mkdir `%s`", parent);
    if (v2_enable_controllers(parent, err) < 0) {
      if (err && err->errnum == ENOENT && attempt < 3) continue;
      goto fail_parent;
    }
    if (mkdir(dir, 0755) == 0) break;
    if (errno == ENOENT && attempt < 3) continue;
    if (errno == EEXIST) {
      hutch_err_set(err, 409, "conflict", "cgroup `%s` already exists", dir);
      goto fail_parent;
    }
    hutch_err_sys(err, errno, "mkdir `%s`", dir);
    goto fail_parent;
  }
  if (v2_set_limits(dir, lim, err) < 0) goto fail_dir;
  return 0;

fail_dir:
  rmdir(dir);
fail_parent:
  if (made_parent) rmdir(parent); /* fails harmlessly if another sandbox is inside */
  return -1;
}

static int v2_attach(const char *instance, const char *id, pid_t pid, hutch_err *err) {
  cleanup_free char *dir = v2_dir(instance, id);
  char buf[32];
  snprintf(buf, sizeof buf, "%d", (int)pid);
  return cg_write(dir, "cgroup.procs", buf, err);
}

/* Waits until cgroup.events says `key` is `want`. */
static bool v2_wait_event(const char *dir, const char *key, uint64_t want, unsigned timeout_ms) {
  uint64_t deadline = mono_us() + (uint64_t)timeout_ms * 1000u;
  for (;;) {
    uint64_t v;
    if (cg_read_key(dir, "cgroup.events", key, &v, NULL) == 1 && v == want) return true;
    if (mono_us() >= deadline) return false;
    sleep_ms(POLL_MS);
  }
}

static int v2_destroy(const char *instance, const char *id, hutch_err *err) {
  cleanup_free char *dir = v2_dir(instance, id);
  if (!path_exists(dir)) return 0;

  bool have_kill = file_exists_in(dir, "cgroup.kill");
  bool have_freeze = file_exists_in(dir, "cgroup.freeze");
  if (have_kill) {
    if (cg_write(dir, "cgroup.kill", "1", err) < 0) {
      if (!path_exists(dir)) return 0;
      return -1;
    }
  } else {
    /* Before 5.14: freeze so nothing forks between reading and killing. */
    if (have_freeze) {
      cg_write_quiet(dir, "cgroup.freeze", "1");
      v2_wait_event(dir, "frozen", 1, V1_FREEZE_BEFORE_KILL_MS);
    }
    kill_tree(dir, 0);
    if (have_freeze) cg_write_quiet(dir, "cgroup.freeze", "0");
  }

  uint64_t start = mono_us(), deadline = start + EMPTY_TIMEOUT_MS * 1000u;
  for (unsigned round = 0;; round++) {
    uint64_t populated = 1;
    int r = cg_read_key(dir, "cgroup.events", "populated", &populated, NULL);
    if (r < 0 && !path_exists(dir)) return 0;
    if (r == 1 && populated == 0) break;
    if (mono_us() >= deadline) return hutch_err_sys(err, EBUSY, "processes of `%s` did not exit", dir);
    sleep_ms(POLL_MS);
    if (round % 10 == 9) { /* re-kill: stragglers that were mid-fork */
      if (have_kill) cg_write_quiet(dir, "cgroup.kill", "1");
      else kill_tree(dir, 0);
    }
  }
  return rmdir_tree(dir, mono_us() + RMDIR_TIMEOUT_MS * 1000u, 0, err);
}

static int v2_freeze(const char *instance, const char *id, bool frozen, hutch_err *err) {
  cleanup_free char *dir = v2_dir(instance, id);
  if (cg_write(dir, "cgroup.freeze", frozen ? "1" : "0", err) < 0) return -1;
  if (v2_wait_event(dir, "frozen", frozen ? 1 : 0, FREEZE_TIMEOUT_MS)) return 0;
  /* Leave the sandbox running rather than half-frozen. */
  if (frozen) cg_write_quiet(dir, "cgroup.freeze", "0");
  return hutch_err_sys(err, ETIMEDOUT, "%s `%s`", frozen ? "freeze" : "thaw", dir);
}

static int v2_stats(const char *instance, const char *id, struct hutch_cgroup_stats *st, hutch_err *err) {
  cleanup_free char *dir = v2_dir(instance, id);
  if (!path_exists(dir)) return hutch_err_sys(err, ENOENT, "cgroup `%s`", dir);
  memset(st, 0, sizeof *st);
  if (stat_u64(dir, "memory.current", &st->memory_current, err) < 0) return -1;
  /* memory.peak appeared in 5.19. */
  if (stat_u64(dir, "memory.peak", &st->memory_peak, err) < 0) return -1;
  if (st->memory_peak < st->memory_current) st->memory_peak = st->memory_current;
  if (stat_key(dir, "cpu.stat", "usage_usec", &st->cpu_usage_usec, err) < 0) return -1;
  if (stat_u64(dir, "pids.current", &st->pids_current, err) < 0) return -1;
  if (stat_key(dir, "memory.events", "oom_kill", &st->oom_kills, err) < 0) return -1;
  return 0;
}

static bool v2_exists(const char *instance, const char *id) {
  cleanup_free char *dir = v2_dir(instance, id);
  return path_exists(dir);
}

static long v2_nprocs(const char *instance, const char *id) {
  cleanup_free char *dir = v2_dir(instance, id);
  return count_procs(dir);
}

static void v2_cleanup_instance(const char *instance) {
  cleanup_free char *parent = v2_parent(instance);
  rmdir(parent);
}

static char *v2_path(const char *instance, const char *id, const char *controller) { return v2_dir(instance, id); }

static const struct cg_backend v2_backend = {
    .create = v2_create,
    .attach = v2_attach,
    .destroy = v2_destroy,
    .freeze = v2_freeze,
    .stats = v2_stats,
    .exists = v2_exists,
    .nprocs = v2_nprocs,
    .cleanup_instance = v2_cleanup_instance,
    .path = v2_path,
};

/* ---- v1 ----------------------------------------------------------------- */

/* Whether hierarchy `c` gets its own directory (present and not co-mounted
 * with an earlier one). */
static bool v1_own(int c) { return cg.v1_mnt[c][0] && !cg.v1_dup[c]; }

static char *v1_parent(int c, const char *instance) { return xasprintf("%s/hutch-%s", cg.v1_mnt[c], instance); }
static char *v1_dir(int c, const char *instance, const char *id) {
  return xasprintf("%s/hutch-%s/%s", cg.v1_mnt[c], instance, id);
}

static int v1_set_limits(const char *instance, const char *id, const struct hutch_cgroup_limits *lim,
                         hutch_err *err) {
  char buf[64];
  cleanup_free char *mem = v1_dir(V1_MEMORY, instance, id);
  if (lim->memory_bytes) {
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)lim->memory_bytes);
    if (cg_write(mem, "memory.limit_in_bytes", buf, err) < 0) return -1;
    /* memory+swap = memory: no swap.  The file exists only with swap
     * accounting; it must be written after limit_in_bytes (memsw >= mem). */
    if (file_exists_in(mem, "memory.memsw.limit_in_bytes")) cg_write_quiet(mem, "memory.memsw.limit_in_bytes", buf);
  }
  cg_write_quiet(mem, "memory.swappiness", "0");

  cleanup_free char *pids = v1_dir(V1_PIDS, instance, id);
  if (lim->pids) snprintf(buf, sizeof buf, "%llu", (unsigned long long)lim->pids);
  else snprintf(buf, sizeof buf, "max");
  if (cg_write(pids, "pids.max", buf, err) < 0) return -1;

  if (lim->cpu_millis) {
    cleanup_free char *cpu = v1_dir(V1_CPU, instance, id);
    uint64_t quota = (uint64_t)lim->cpu_millis * (CPU_PERIOD_US / 1000);
    if (quota < CPU_MIN_QUOTA_US) quota = CPU_MIN_QUOTA_US;
    snprintf(buf, sizeof buf, "%u", CPU_PERIOD_US);
    if (cg_write(cpu, "cpu.cfs_period_us", buf, err) < 0) return -1;
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)quota);
    if (cg_write(cpu, "cpu.cfs_quota_us", buf, err) < 0) return -1;
  }
  return 0;
}

static int v1_create(const char *instance, const char *id, const struct hutch_cgroup_limits *lim,
                     hutch_err *err) {
  bool made_parent[V1_N] = {false}, made_dir[V1_N] = {false};
  for (int c = 0; c < V1_N; c++) {
    if (!v1_own(c)) continue;
    bool optional = c >= V1_REQUIRED;
    cleanup_free char *parent = v1_parent(c, instance);
    cleanup_free char *dir = v1_dir(c, instance, id);
    for (int attempt = 0;; attempt++) {
      if (mkdir(parent, 0755) == 0) made_parent[c] = true;
      else if (errno != EEXIST) {
        if (optional) break;
        hutch_err_sys(err, errno, "mkdir `%s`", parent);
        goto fail;
      }
      if (mkdir(dir, 0755) == 0) {
        made_dir[c] = true;
        break;
      }
      if (errno == ENOENT && attempt < 3) continue; /* parent removed concurrently */
      if (optional) break;
      if (errno == EEXIST) hutch_err_set(err, 409, "conflict", "cgroup `%s` already exists", dir);
      else hutch_err_sys(err, errno, "mkdir `%s`", dir);
      goto fail;
    }
  }
  if (v1_set_limits(instance, id, lim, err) < 0) goto fail;
  return 0;

fail:
  for (int c = 0; c < V1_N; c++) {
    if (made_dir[c]) {
      cleanup_free char *dir = v1_dir(c, instance, id);
      rmdir(dir);
    }
    if (made_parent[c]) {
      cleanup_free char *parent = v1_parent(c, instance);
      rmdir(parent);
    }
  }
  return -1;
}

static int v1_attach(const char *instance, const char *id, pid_t pid, hutch_err *err) {
  char buf[32];
  snprintf(buf, sizeof buf, "%d", (int)pid);
  for (int c = 0; c < V1_N; c++) {
    if (!v1_own(c)) continue;
    cleanup_free char *dir = v1_dir(c, instance, id);
    if (c >= V1_REQUIRED) {
      if (path_exists(dir)) cg_write_quiet(dir, "cgroup.procs", buf);
      continue;
    }
    if (cg_write(dir, "cgroup.procs", buf, err) < 0) return -1;
  }
  return 0;
}

/* Waits until freezer.state reads `want`. */
static bool v1_wait_state(const char *dir, const char *want, unsigned timeout_ms) {
  uint64_t deadline = mono_us() + (uint64_t)timeout_ms * 1000u;
  for (;;) {
    cleanup_free char *s = cg_read(dir, "freezer.state", NULL);
    if (s) {
      trim(s);
      if (!strcmp(s, want)) return true;
    }
    if (mono_us() >= deadline) return false;
    sleep_ms(POLL_MS);
  }
}

struct v1_dirs {
  char *d[V1_N]; /* NULL for hierarchies without their own directory */
};

static void v1_dirs_free(struct v1_dirs *ds) {
  for (int c = 0; c < V1_N; c++) free(ds->d[c]);
}

static int v1_kill_and_remove(const struct v1_dirs *ds, const char *freezer, hutch_err *err) {
  /* Freeze so nothing forks between reading cgroup.procs and killing; a
   * frozen task keeps the SIGKILL pending until the thaw.  An empty cgroup
   * (the usual case: the shim already killed and reaped init) needs no
   * freeze, and each freeze costs an IPI to every CPU. */
  long present = 0;
  for (int c = 0; c < V1_N && !present; c++)
    if (ds->d[c]) {
      cleanup_free char *procs = cg_read(ds->d[c], "cgroup.procs", NULL);
      present = procs && *procs;
    }
  bool frozen = present && path_exists(freezer);
  if (frozen) {
    cg_write_quiet(freezer, "freezer.state", "FROZEN");
    v1_wait_state(freezer, "FROZEN", V1_FREEZE_BEFORE_KILL_MS);
  }
  uint64_t deadline = mono_us() + EMPTY_TIMEOUT_MS * 1000u;
  for (unsigned round = 0;; round++) {
    long n = 0;
    for (int c = 0; c < V1_N; c++)
      if (ds->d[c]) n += kill_tree(ds->d[c], 0);
    if (frozen) {
      cg_write_quiet(freezer, "freezer.state", "THAWED");
      frozen = false;
    }
    if (n == 0) break;
    if (mono_us() >= deadline)
      return hutch_err_sys(err, EBUSY, "%ld processes of cgroup `%s` did not exit", n, ds->d[V1_MEMORY]);
    sleep_ms(round < 10 ? 1 : POLL_MS);
  }

  uint64_t rm_deadline = mono_us() + RMDIR_TIMEOUT_MS * 1000u;
  for (int c = 0; c < V1_N; c++) {
    if (!ds->d[c]) continue;
    if (rmdir_tree(ds->d[c], rm_deadline, 0, err) < 0) return -1;
  }
  return 0;
}

static int v1_destroy(const char *instance, const char *id, hutch_err *err) {
  __attribute__((cleanup(v1_dirs_free))) struct v1_dirs ds = {{NULL}};
  bool any = false;
  for (int c = 0; c < V1_N; c++) {
    if (!v1_own(c)) continue;
    ds.d[c] = v1_dir(c, instance, id);
    if (path_exists(ds.d[c])) any = true;
  }
  if (!any) return 0;
  cleanup_free char *freezer = v1_dir(V1_FREEZER, instance, id);
  return v1_kill_and_remove(&ds, freezer, err);
}

static int v1_freeze(const char *instance, const char *id, bool frozen, hutch_err *err) {
  cleanup_free char *dir = v1_dir(V1_FREEZER, instance, id);
  const char *want = frozen ? "FROZEN" : "THAWED";
  /* The v1 freezer can stay in FREEZING when tasks fork while it works (a
   * new child escapes the first pass): write the request again until it
   * holds, as runc does. */
  uint64_t deadline = mono_us() + (uint64_t)FREEZE_TIMEOUT_MS * 1000u;
  do {
    if (cg_write(dir, "freezer.state", want, err) < 0) return -1;
    if (v1_wait_state(dir, want, 20)) return 0;
  } while (mono_us() < deadline);
  /* Stuck in FREEZING (a task in uninterruptible sleep): back off. */
  if (frozen) cg_write_quiet(dir, "freezer.state", "THAWED");
  return hutch_err_sys(err, ETIMEDOUT, "%s `%s`", frozen ? "freeze" : "thaw", dir);
}

static int v1_stats(const char *instance, const char *id, struct hutch_cgroup_stats *st, hutch_err *err) {
  cleanup_free char *mem = v1_dir(V1_MEMORY, instance, id);
  cleanup_free char *pids = v1_dir(V1_PIDS, instance, id);
  if (!path_exists(mem)) return hutch_err_sys(err, ENOENT, "cgroup `%s`", mem);
  memset(st, 0, sizeof *st);
  if (stat_u64(mem, "memory.usage_in_bytes", &st->memory_current, err) < 0) return -1;
  if (stat_u64(mem, "memory.max_usage_in_bytes", &st->memory_peak, err) < 0) return -1;
  if (stat_key(mem, "memory.oom_control", "oom_kill", &st->oom_kills, err) < 0) return -1;
  if (stat_u64(pids, "pids.current", &st->pids_current, err) < 0) return -1;
  if (cg.v1_mnt[V1_CPUACCT][0]) {
    cleanup_free char *acct = v1_dir(V1_CPUACCT, instance, id);
    uint64_t ns;
    if (stat_u64(acct, "cpuacct.usage", &ns, err) < 0) return -1;
    st->cpu_usage_usec = ns / 1000u;
  }
  return 0;
}

static bool v1_exists(const char *instance, const char *id) {
  for (int c = 0; c < V1_N; c++) {
    if (!v1_own(c)) continue;
    cleanup_free char *dir = v1_dir(c, instance, id);
    if (path_exists(dir)) return true;
  }
  return false;
}

static long v1_nprocs(const char *instance, const char *id) {
  cleanup_free char *dir = v1_dir(V1_MEMORY, instance, id);
  return count_procs(dir);
}

static void v1_cleanup_instance(const char *instance) {
  for (int c = 0; c < V1_N; c++) {
    if (!v1_own(c)) continue;
    cleanup_free char *parent = v1_parent(c, instance);
    rmdir(parent);
  }
}

static char *v1_path(const char *instance, const char *id, const char *controller) {
  for (int c = 0; c < V1_N; c++)
    if (!strcmp(controller, v1_names[c]) && cg.v1_mnt[c][0]) return v1_dir(c, instance, id);
  return NULL;
}

static const struct cg_backend v1_backend = {
    .create = v1_create,
    .attach = v1_attach,
    .destroy = v1_destroy,
    .freeze = v1_freeze,
    .stats = v1_stats,
    .exists = v1_exists,
    .nprocs = v1_nprocs,
    .cleanup_instance = v1_cleanup_instance,
    .path = v1_path,
};

/* ---- probe -------------------------------------------------------------- */

static bool fs_is(const char *path, long magic) {
  struct statfs sf;
  return statfs(path, &sf) == 0 && (long)sf.f_type == magic;
}

/* Decodes mountinfo's octal escapes (\040 for a space) in place. */
static void unescape_mount(char *s) {
  char *o = s;
  for (char *i = s; *i; i++) {
    if (i[0] == '\\' && i[1] >= '0' && i[1] <= '3' && i[2] >= '0' && i[2] <= '7' && i[3] >= '0' && i[3] <= '7') {
      *o++ = (char)((i[1] - '0') * 64 + (i[2] - '0') * 8 + (i[3] - '0'));
      i += 3;
    } else {
      *o++ = *i;
    }
  }
  *o = 0;
}

static bool under_sys_fs_cgroup(const char *p) { return !strncmp(p, CG_FS "/", sizeof CG_FS); }

/* Records `mnt` for slot `c` unless a better one is known: mounts under
 * /sys/fs/cgroup win over others (bind mounts elsewhere, containers). */
static void take_mount(char *slot, const char *mnt) {
  if (slot[0] && (under_sys_fs_cgroup(slot) || !under_sys_fs_cgroup(mnt))) return;
  snprintf(slot, PATH_MAX, "%s", mnt);
}

/* Fills cg.v1_mnt from /proc/self/mountinfo (v1 hierarchies by their super
 * options; the first cgroup2 mount as "unified") and *v2_other with a cgroup2
 * mount point, if any. */
static void scan_mountinfo(char *v2_other) {
  FILE *f = fopen("/proc/self/mountinfo", "re");
  if (!f) return;
  char *line = NULL;
  size_t cap = 0;
  while (getline(&line, &cap, f) > 0) {
    /* id parent maj:min root mountpoint opts [optional...] - fstype source superopts */
    char *sep = strstr(line, " - ");
    if (!sep) continue;
    *sep = 0;
    char *fields[5] = {NULL};
    char *save = NULL, *tok = strtok_r(line, " ", &save);
    for (int i = 0; tok && i < 5; i++, tok = strtok_r(NULL, " ", &save)) fields[i] = tok;
    if (!fields[4]) continue;
    char *mnt = fields[4];
    unescape_mount(mnt);
    char *save2 = NULL;
    char *fstype = strtok_r(sep + 3, " ", &save2);
    strtok_r(NULL, " ", &save2); /* source */
    char *superopts = strtok_r(NULL, " \n", &save2);
    if (!fstype || strlen(mnt) >= PATH_MAX - 128) continue;
    if (!strcmp(fstype, "cgroup2")) {
      take_mount(v2_other, mnt);
      continue;
    }
    if (strcmp(fstype, "cgroup") || !superopts) continue;
    char *save3 = NULL;
    for (char *o = strtok_r(superopts, ",", &save3); o; o = strtok_r(NULL, ",", &save3))
      for (int c = 0; c < V1_UNIFIED; c++)
        if (!strcmp(o, v1_names[c])) take_mount(cg.v1_mnt[c], mnt);
  }
  free(line);
  fclose(f);
}

static int probe_v2_at(const char *root, hutch_err *err) {
  cleanup_free char *avail = cg_read(root, "cgroup.controllers", err);
  if (!avail) return -1;
  if (!has_word(avail, "memory") || !has_word(avail, "pids"))
    return hutch_err_sys(err, ENOTSUP, "cgroup2 at `%s` lacks the memory or pids controller (has: %s)", root,
                         avail);
  snprintf(cg.v2_root, sizeof cg.v2_root, "%s", root);
  cg.version = HUTCH_CGROUP_V2;
  cg.be = &v2_backend;
  return 0;
}

static int probe_v1(hutch_err *err) {
  for (int c = 0; c < V1_N; c++) {
    if (!cg.v1_mnt[c][0]) {
      if (c < V1_REQUIRED) return hutch_err_sys(err, ENOTSUP, "no cgroup v1 `%s` hierarchy mounted", v1_names[c]);
      continue;
    }
    long magic = c == V1_UNIFIED ? CGROUP2_SUPER_MAGIC : CGROUP_SUPER_MAGIC;
    struct stat st;
    if (!fs_is(cg.v1_mnt[c], magic) || stat(cg.v1_mnt[c], &st) < 0) {
      if (c < V1_REQUIRED) return hutch_err_sys(err, ENOTSUP, "`%s` is not a cgroup hierarchy", cg.v1_mnt[c]);
      cg.v1_mnt[c][0] = 0;
      continue;
    }
    /* Same superblock as an earlier controller: co-mounted (cpu,cpuacct). */
    for (int d = 0; d < c; d++) {
      struct stat sd;
      if (cg.v1_mnt[d][0] && !cg.v1_dup[d] && stat(cg.v1_mnt[d], &sd) == 0 && sd.st_dev == st.st_dev) {
        snprintf(cg.v1_mnt[c], PATH_MAX, "%s", cg.v1_mnt[d]);
        cg.v1_dup[c] = true;
        break;
      }
    }
  }
  /* The controller-less cgroup2 of a hybrid host is optional: only if we may write there. */
  if (cg.v1_mnt[V1_UNIFIED][0] && access(cg.v1_mnt[V1_UNIFIED], W_OK) < 0) cg.v1_mnt[V1_UNIFIED][0] = 0;
  cg.version = HUTCH_CGROUP_V1;
  cg.be = &v1_backend;
  return 0;
}

static int probe(hutch_err *err) {
  if (fs_is(CG_FS, CGROUP2_SUPER_MAGIC)) return probe_v2_at(CG_FS, err);

  char v2_other[PATH_MAX] = "";
  scan_mountinfo(v2_other);
  snprintf(cg.v1_mnt[V1_UNIFIED], PATH_MAX, "%s", v2_other);
  hutch_err v1err = HUTCH_ERR_INIT;
  if (probe_v1(&v1err) == 0) return 0;
  /* No complete v1 set: a cgroup2 mounted elsewhere that holds the
   * controllers (e.g. a hybrid host where memory and pids were moved). */
  memset(cg.v1_mnt, 0, sizeof cg.v1_mnt);
  memset(cg.v1_dup, 0, sizeof cg.v1_dup);
  if (v2_other[0] && probe_v2_at(v2_other, NULL) == 0) return 0;
  return hutch_err_sys(err, v1err.errnum, "no usable cgroup hierarchy: %s", v1err.msg);
}

static void probe_once(void) {
  cg_probe_rc = probe(&cg_probe_err);
  if (cg_probe_rc == 0) {
    char ver[4];
    snprintf(ver, sizeof ver, "%d", (int)cg.version);
    hutch_log(LOG_DEBUG, "cgroup.probe", "version", ver, "root",
              cg.version == HUTCH_CGROUP_V2 ? cg.v2_root : cg.v1_mnt[V1_MEMORY], NULL);
  }
}

/* ---- public API --------------------------------------------------------- */

int hutch_cgroup_probe(enum hutch_cgroup_version *out, hutch_err *err) {
  pthread_once(&cg_once, probe_once);
  if (cg_probe_rc < 0) {
    if (err) *err = cg_probe_err;
    return -1;
  }
  if (out) *out = cg.version;
  return 0;
}

int hutch_cgroup_testing_use_v2(const char *root, hutch_err *err) {
  pthread_once(&cg_once, probe_once);
  if (!fs_is(root, CGROUP2_SUPER_MAGIC)) return hutch_err_sys(err, EINVAL, "`%s` is not a cgroup2 mount", root);
  snprintf(cg.v2_root, sizeof cg.v2_root, "%s", root);
  cg.version = HUTCH_CGROUP_V2;
  cg.be = &v2_backend;
  cg.relaxed = true;
  cg_probe_rc = 0;
  return 0;
}

/* Validates names and makes sure the backend is chosen. */
static int prepare(const char *instance, const char *id, hutch_err *err) {
  if (check_names(instance, id, err) < 0) return -1;
  return hutch_cgroup_probe(NULL, err);
}

int hutch_cgroup_create(const char *instance, const char *id, const struct hutch_cgroup_limits *lim,
                        hutch_err *err) {
  static const struct hutch_cgroup_limits none = {0, 0, 0};
  if (prepare(instance, id, err) < 0) return -1;
  if (cg.be->create(instance, id, lim ? lim : &none, err) < 0)
    return hutch_err_wrap(err, "create cgroup %s/%s", instance, id);
  return 0;
}

int hutch_cgroup_attach(const char *instance, const char *id, pid_t pid, hutch_err *err) {
  if (prepare(instance, id, err) < 0) return -1;
  if (pid <= 0) return hutch_err_invalid(err, "invalid pid %d", (int)pid);
  if (cg.be->attach(instance, id, pid, err) < 0) return hutch_err_wrap(err, "attach pid %d to cgroup %s", (int)pid, id);
  return 0;
}

int hutch_cgroup_destroy(const char *instance, const char *id, hutch_err *err) {
  if (prepare(instance, id, err) < 0) return -1;
  if (cg.be->destroy(instance, id, err) < 0) return hutch_err_wrap(err, "destroy cgroup %s", id);
  return 0;
}

int hutch_cgroup_freeze(const char *instance, const char *id, bool frozen, hutch_err *err) {
  if (prepare(instance, id, err) < 0) return -1;
  if (cg.be->freeze(instance, id, frozen, err) < 0) return hutch_err_wrap(err, "%s cgroup %s", frozen ? "freeze" : "thaw", id);
  return 0;
}

int hutch_cgroup_stats(const char *instance, const char *id, struct hutch_cgroup_stats *st, hutch_err *err) {
  if (prepare(instance, id, err) < 0) return -1;
  if (cg.be->stats(instance, id, st, err) < 0) return hutch_err_wrap(err, "stats of cgroup %s", id);
  return 0;
}

bool hutch_cgroup_exists(const char *instance, const char *id) {
  if (prepare(instance, id, NULL) < 0) return false;
  return cg.be->exists(instance, id);
}

long hutch_cgroup_nprocs(const char *instance, const char *id) {
  if (prepare(instance, id, NULL) < 0) return -1;
  return cg.be->nprocs(instance, id);
}

void hutch_cgroup_cleanup_instance(const char *instance) {
  if (!valid_name(instance) || hutch_cgroup_probe(NULL, NULL) < 0) return;
  cg.be->cleanup_instance(instance);
}

char *hutch_cgroup_path(const char *instance, const char *id, const char *controller) {
  if (!controller || prepare(instance, id, NULL) < 0) return NULL;
  return cg.be->path(instance, id, controller);
}
