/* Cgroup backends against the real kernel (root only).
 *
 * The suite runs on the backend the probe picks.  On a hybrid host (v1
 * controllers plus a controller-less cgroup2 mount) it runs a second time on
 * that cgroup2 mount through hutch_cgroup_testing_use_v2, so the v2 code
 * (cgroup.kill, cgroup.freeze, cgroup.events) is exercised there too; limit
 * files of the missing controllers are then skipped. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/util.h"
#include "isolate/cgroup.h"
#include "tap.h"

#ifndef CGROUP2_SUPER_MAGIC
#define CGROUP2_SUPER_MAGIC 0x63677270
#endif

static char instance[64];
static enum hutch_cgroup_version version;
static bool relaxed; /* v2 pass on a controller-less cgroup2 */

/* Reads <path of controller>/<file>, trimmed; NULL if absent. */
static char *read_cg(const char *id, const char *controller, const char *file) {
  cleanup_free char *dir = hutch_cgroup_path(instance, id, controller);
  if (!dir) return NULL;
  cleanup_free char *p = xasprintf("%s/%s", dir, file);
  char *s = read_file(p, 1 << 16, NULL, NULL);
  if (s) {
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == ' ')) s[--n] = 0;
  }
  return s;
}

static bool cg_file_exists(const char *id, const char *controller, const char *file) {
  cleanup_free char *dir = hutch_cgroup_path(instance, id, controller);
  if (!dir) return false;
  cleanup_free char *p = xasprintf("%s/%s", dir, file);
  return access(p, F_OK) == 0;
}

static void check_file(const char *id, const char *controller, const char *file, const char *want) {
  cleanup_free char *got = read_cg(id, controller, file);
  is_str(got, want, "%s/%s = %s", controller, file, want);
}

/* A child that waits for a byte on `go`, then touches 4 MiB and burns a
 * little CPU (charges are not moved on attach, so only work done after it
 * counts), reports on `done`, and sleeps. */
static pid_t spawn_worker(int *go_w, int *done_r) {
  int go[2], done[2];
  if (pipe2(go, O_CLOEXEC) < 0 || pipe2(done, O_CLOEXEC) < 0) return -1;
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    char c;
    if (read(go[0], &c, 1) != 1) _exit(1);
    size_t n = 4u << 20;
    volatile char *mem = malloc(n);
    if (!mem) _exit(2);
    for (size_t i = 0; i < n; i += 4096) mem[i] = 1;
    uint64_t until = mono_us() + 30000;
    while (mono_us() < until) {
    }
    if (write(done[1], "r", 1) != 1) _exit(3);
    for (;;) pause();
  }
  close(go[0]);
  close(done[1]);
  *go_w = go[1];
  *done_r = done[0];
  return pid;
}

static void test_lifecycle(void) {
  const char *id = "sb_test";
  hutch_err err = HUTCH_ERR_INIT;
  struct hutch_cgroup_limits lim = {.memory_bytes = 64u << 20, .pids = 16, .cpu_millis = 500};

  int rc = hutch_cgroup_create(instance, id, &lim, &err);
  ok(rc == 0, "create %s/%s %s", instance, id, rc ? err.msg : "");
  if (rc) return;
  ok(hutch_cgroup_exists(instance, id), "exists after create");
  rc = hutch_cgroup_create(instance, id, &lim, &err);
  ok(rc < 0 && err.status == 409, "create again fails with a conflict (%s)", err.msg);
  ok(hutch_cgroup_exists(instance, id), "the failed second create left the first in place");

  if (version == HUTCH_CGROUP_V2) {
    if (!relaxed) {
      check_file(id, "memory", "memory.max", "67108864");
      check_file(id, "pids", "pids.max", "16");
      if (cg_file_exists(id, "memory", "memory.swap.max")) check_file(id, "memory", "memory.swap.max", "0");
      cleanup_free char *oom_group = read_cg(id, "memory", "memory.oom.group");
      is_str(oom_group, "0", "memory.oom.group stays 0: only the offending process dies");
    }
    if (cg_file_exists(id, "cpu", "cpu.max")) check_file(id, "cpu", "cpu.max", "50000 100000");
    else printf("# cpu controller not available: cpu.max not checked\n");
  } else {
    check_file(id, "memory", "memory.limit_in_bytes", "67108864");
    if (cg_file_exists(id, "memory", "memory.memsw.limit_in_bytes"))
      check_file(id, "memory", "memory.memsw.limit_in_bytes", "67108864");
    check_file(id, "memory", "memory.swappiness", "0");
    check_file(id, "pids", "pids.max", "16");
    check_file(id, "cpu", "cpu.cfs_period_us", "100000");
    check_file(id, "cpu", "cpu.cfs_quota_us", "50000");
    cleanup_free char *fz = hutch_cgroup_path(instance, id, "freezer");
    struct stat st;
    ok(fz && stat(fz, &st) == 0 && S_ISDIR(st.st_mode), "freezer directory %s exists", fz ? fz : "(null)");
  }

  int go, done;
  pid_t child = spawn_worker(&go, &done);
  ok(child > 0, "forked a worker");
  if (child <= 0) return;
  rc = hutch_cgroup_attach(instance, id, child, &err);
  ok(rc == 0, "attach pid %d %s", (int)child, rc ? err.msg : "");
  is_int(hutch_cgroup_nprocs(instance, id), 1, "nprocs == 1");
  if (version == HUTCH_CGROUP_V1) {
    /* Hybrid host: the sandbox also gets a leaf in the cgroup2 mount. */
    cleanup_free char *u = hutch_cgroup_path(instance, id, "unified");
    if (u) {
      cleanup_free char *procs = read_cg(id, "unified", "cgroup.procs");
      char want[16];
      snprintf(want, sizeof want, "%d", (int)child);
      is_str(procs, want, "the worker is in the unified leaf %s too", u);
    } else {
      printf("# no writable cgroup2 mount besides v1: no unified leaf\n");
    }
  }
  char c = 'g';
  ok(write(go, &c, 1) == 1 && read(done, &c, 1) == 1, "worker ran inside the cgroup");

  struct hutch_cgroup_stats st;
  rc = hutch_cgroup_stats(instance, id, &st, &err);
  ok(rc == 0, "stats %s", rc ? err.msg : "");
  printf("# stats: memory %llu peak %llu cpu %llu us pids %llu oom %llu\n", (unsigned long long)st.memory_current,
         (unsigned long long)st.memory_peak, (unsigned long long)st.cpu_usage_usec,
         (unsigned long long)st.pids_current, (unsigned long long)st.oom_kills);
  if (!relaxed) {
    ok(st.memory_current > 0, "memory usage is nonzero");
    ok(st.memory_peak >= st.memory_current, "memory peak >= current");
    is_int(st.pids_current, 1, "pids.current == 1");
    is_int(st.oom_kills, 0, "no OOM kill");
  }
  ok(st.cpu_usage_usec > 0, "cpu usage is nonzero");

  rc = hutch_cgroup_freeze(instance, id, true, &err);
  ok(rc == 0, "freeze %s", rc ? err.msg : "");
  if (version == HUTCH_CGROUP_V2) {
    cleanup_free char *ev = read_cg(id, "freezer", "cgroup.events");
    ok(ev && strstr(ev, "frozen 1"), "cgroup.events says frozen 1");
  } else {
    check_file(id, "freezer", "freezer.state", "FROZEN");
  }
  rc = hutch_cgroup_freeze(instance, id, false, &err);
  ok(rc == 0, "thaw %s", rc ? err.msg : "");
  if (version == HUTCH_CGROUP_V2) {
    cleanup_free char *ev = read_cg(id, "freezer", "cgroup.events");
    ok(ev && strstr(ev, "frozen 0"), "cgroup.events says frozen 0");
  } else {
    check_file(id, "freezer", "freezer.state", "THAWED");
  }

  /* Destroy while we have not reaped the worker: it must still succeed. */
  const char *ctrls[] = {"memory", "pids", "cpu", "freezer", "cpuacct", "unified"};
  char *paths[6];
  for (int i = 0; i < 6; i++) paths[i] = hutch_cgroup_path(instance, id, ctrls[i]);
  uint64_t t0 = mono_us();
  rc = hutch_cgroup_destroy(instance, id, &err);
  ok(rc == 0, "destroy %s", rc ? err.msg : "");
  printf("# destroy took %llu ms\n", (unsigned long long)((mono_us() - t0) / 1000));
  int wst = 0;
  ok(waitpid(child, &wst, 0) == child && WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL,
     "worker was killed by SIGKILL");
  ok(!hutch_cgroup_exists(instance, id), "gone after destroy");
  bool all_gone = true;
  for (int i = 0; i < 6; i++) {
    if (paths[i] && access(paths[i], F_OK) == 0) {
      printf("#   still there: %s\n", paths[i]);
      all_gone = false;
    }
    free(paths[i]);
  }
  ok(all_gone, "every hierarchy's directory was removed");
  rc = hutch_cgroup_destroy(instance, id, &err);
  ok(rc == 0, "destroy again succeeds %s", rc ? err.msg : "");
  close(go);
  close(done);
}

static void test_invalid_names(void) {
  hutch_err err = HUTCH_ERR_INIT;
  struct hutch_cgroup_limits lim = {0, 0, 0};
  int rc = hutch_cgroup_create(instance, "../x", &lim, &err);
  ok(rc < 0 && err.status == 400, "create with id ../x fails as invalid (%s)", err.msg);
  rc = hutch_cgroup_create("a/b", "sb_x", &lim, &err);
  ok(rc < 0 && err.status == 400, "create with instance a/b fails as invalid");
  rc = hutch_cgroup_create(instance, "", &lim, &err);
  ok(rc < 0 && err.status == 400, "create with an empty id fails");
  char longid[80];
  memset(longid, 'a', 65);
  longid[65] = 0;
  rc = hutch_cgroup_create(instance, longid, &lim, &err);
  ok(rc < 0 && err.status == 400, "create with a 65-character id fails");
  ok(hutch_cgroup_path(instance, "..", "memory") == NULL, "no path for id ..");
  ok(hutch_cgroup_destroy(instance, "x/../..", &err) < 0, "destroy refuses a bad id");
}

/* A process in a pids=4 cgroup forking 10 times: the 4th fork onwards gets
 * EAGAIN. */
static void test_pids_limit(void) {
  const char *id = "sb_pids";
  hutch_err err = HUTCH_ERR_INIT;
  struct hutch_cgroup_limits lim = {.memory_bytes = 0, .pids = 4, .cpu_millis = 0};
  int rc = hutch_cgroup_create(instance, id, &lim, &err);
  ok(rc == 0, "create %s with pids=4 %s", id, rc ? err.msg : "");
  if (rc) return;
  int go[2], res[2];
  if (pipe2(go, O_CLOEXEC) < 0 || pipe2(res, O_CLOEXEC) < 0) return;
  fflush(stdout);
  pid_t child = fork();
  if (child == 0) {
    char c;
    if (read(go[0], &c, 1) != 1) _exit(1);
    int forked = 0, eagain = 0;
    for (int i = 0; i < 10; i++) {
      pid_t p = fork();
      if (p == 0) {
        for (;;) pause();
      }
      if (p > 0) forked++;
      else if (errno == EAGAIN) eagain++;
    }
    char out[2] = {(char)forked, (char)eagain};
    if (write(res[1], out, 2) != 2) _exit(2);
    for (;;) pause();
  }
  rc = hutch_cgroup_attach(instance, id, child, &err);
  ok(rc == 0, "attach %s", rc ? err.msg : "");
  char c = 'g', out[2] = {0, 0};
  ok(write(go[1], &c, 1) == 1 && read(res[0], out, 2) == 2, "forker reported");
  is_int(out[0], 3, "3 forks succeeded (4 pids with the forker)");
  is_int(out[1], 7, "7 forks failed with EAGAIN");
  is_int(hutch_cgroup_nprocs(instance, id), 4, "nprocs == 4");
  rc = hutch_cgroup_destroy(instance, id, &err);
  ok(rc == 0, "destroy kills the forker and its children %s", rc ? err.msg : "");
  int wst = 0;
  ok(waitpid(child, &wst, 0) == child && WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL, "forker killed");
  close(go[0]);
  close(go[1]);
  close(res[0]);
  close(res[1]);
}

/* Destroying a paused sandbox must work: v1 frozen tasks only die once
 * thawed, and the thaw must not let them fork. */
static void test_destroy_frozen(void) {
  const char *id = "sb_frozen";
  hutch_err err = HUTCH_ERR_INIT;
  struct hutch_cgroup_limits lim = {.memory_bytes = 32u << 20, .pids = 8, .cpu_millis = 0};
  int rc = hutch_cgroup_create(instance, id, &lim, &err);
  ok(rc == 0, "create %s %s", id, rc ? err.msg : "");
  if (rc) return;
  int go, done;
  pid_t child = spawn_worker(&go, &done);
  if (child <= 0) return;
  char c = 'g';
  ok(hutch_cgroup_attach(instance, id, child, &err) == 0 && write(go, &c, 1) == 1 && read(done, &c, 1) == 1,
     "worker attached and ran");
  rc = hutch_cgroup_freeze(instance, id, true, &err);
  ok(rc == 0, "freeze %s", rc ? err.msg : "");
  rc = hutch_cgroup_destroy(instance, id, &err);
  ok(rc == 0, "destroy while frozen %s", rc ? err.msg : "");
  int wst = 0;
  ok(waitpid(child, &wst, 0) == child && WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL, "frozen worker killed");
  ok(!hutch_cgroup_exists(instance, id), "frozen cgroup removed");
  close(go);
  close(done);
}

static void test_create_without_limits(void) {
  const char *id = "sb_nolimits";
  hutch_err err = HUTCH_ERR_INIT;
  int rc = hutch_cgroup_create(instance, id, NULL, &err);
  ok(rc == 0, "create without limits %s", rc ? err.msg : "");
  if (!relaxed) {
    if (version == HUTCH_CGROUP_V2) check_file(id, "memory", "memory.max", "max");
    check_file(id, "pids", "pids.max", "max");
  }
  rc = hutch_cgroup_destroy(instance, id, &err);
  ok(rc == 0, "destroy an empty cgroup %s", rc ? err.msg : "");
}

/* A limit the kernel refuses (pids.max above PID_MAX_LIMIT) fails the create
 * after the directories were made: none may be left behind. */
static void test_create_all_or_nothing(void) {
  const char *id = "sb_bad";
  hutch_err err = HUTCH_ERR_INIT;
  struct hutch_cgroup_limits lim = {.memory_bytes = 16u << 20, .pids = 1ull << 40, .cpu_millis = 100};
  const char *ctrls[] = {"memory", "pids", "cpu", "freezer", "cpuacct", "unified"};
  int rc = hutch_cgroup_create(instance, id, &lim, &err);
  ok(rc < 0, "create with pids=2^40 fails (%s)", err.msg);
  ok(!hutch_cgroup_exists(instance, id), "nothing left after the failed create");
  bool parents_gone = true;
  for (int i = 0; i < 6; i++) {
    cleanup_free char *p = hutch_cgroup_path(instance, id, ctrls[i]);
    if (!p) continue;
    *strrchr(p, '/') = 0;
    if (access(p, F_OK) == 0) {
      printf("#   still there: %s\n", p);
      parents_gone = false;
    }
  }
  ok(parents_gone, "the per-instance parents it made were removed too");
}

static void suite(void) {
  /* First, so that the per-instance parents do not exist yet. */
  if (!relaxed) test_create_all_or_nothing();
  test_lifecycle();
  test_invalid_names();
  if (!relaxed) test_pids_limit();
  test_destroy_frozen();
  test_create_without_limits();

  hutch_cgroup_cleanup_instance(instance);
  cleanup_free char *p = hutch_cgroup_path(instance, "x", "memory");
  if (p) *strrchr(p, '/') = 0;
  ok(p && access(p, F_OK) < 0, "cleanup_instance removed %s", p ? p : "(null)");
}

int main(void) {
  if (geteuid() != 0) skip_all("needs root");
  snprintf(instance, sizeof instance, "unittest%d", (int)getpid());

  hutch_err err = HUTCH_ERR_INIT;
  int rc = hutch_cgroup_probe(&version, &err);
  ok(rc == 0, "probe %s", rc ? err.msg : "");
  if (rc) return done_testing();
  printf("# cgroup v%d\n", (int)version);
  suite();

  /* Hybrid host: exercise the v2 backend on the controller-less cgroup2. */
  struct statfs sf;
  const char *unified = "/sys/fs/cgroup/unified";
  if (version == HUTCH_CGROUP_V1 && statfs(unified, &sf) == 0 && (long)sf.f_type == CGROUP2_SUPER_MAGIC) {
    rc = hutch_cgroup_testing_use_v2(unified, &err);
    ok(rc == 0, "switch to the v2 backend on %s %s", unified, rc ? err.msg : "");
    if (rc == 0) {
      rc = hutch_cgroup_probe(&version, &err);
      ok(rc == 0 && version == HUTCH_CGROUP_V2, "probe now says v2");
      relaxed = true;
      printf("# v2 backend on %s (no controllers)\n", unified);
      snprintf(instance, sizeof instance, "unittest%dv2", (int)getpid());
      suite();
    }
  }
  return done_testing();
}
