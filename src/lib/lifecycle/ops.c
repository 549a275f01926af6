#include "lifecycle/ops.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "agent/shim_client.h"
#include "common/log.h"
#include "common/util.h"
#include "isolate/cgroup.h"
#include "isolate/userns.h"
#include "lifecycle/egress.h"
#include "lifecycle/events.h"
#include "lifecycle/snapshots.h"
#include "runtime/runtime.h"
#include "store/btrfs.h"
#include "store/template.h"

void hutch_hostname_for(const char *id, char out[64]) {
  snprintf(out, 64, "%s", id);
  for (char *p = out; *p; p++)
    if (*p == '_') *p = '-';
}

bool hutch_is_shim_of(pid_t pid, const char *id) {
  if (pid <= 0) return false;
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
  size_t len = 0;
  hutch_err err = HUTCH_ERR_INIT;
  cleanup_free char *cmd = read_file(path, 8192, &len, &err);
  if (!cmd) return false;
  for (size_t i = 0; i < len; i++)
    if (!cmd[i]) cmd[i] = ' ';
  return strstr(cmd, "hutch-shim") && strstr(cmd, id);
}

/* Fails with "fault injected" when HUTCH_FAULT names `point` (and aborts
 * hutchd when it says `point:abort`, see runtime.c). */
#define FAULT(point)                                                  \
  do {                                                                \
    if (hutch_fault(point)) {                                         \
      hutch_err_sys(err, EIO, "fault injected at %s", point);         \
      goto fail;                                                      \
    }                                                                 \
  } while (0)

static char *create_checkpoint_source(struct hutch_ctx *ctx, const struct hutch_sandbox_rec *r);
static bool keeps_memory(const struct hutch_sandbox_rec *r);
static char *checkpoint_dir(struct hutch_ctx *ctx, const char *snap_id);
static int full_checkpoint(struct hutch_ctx *ctx, struct hutch_sandbox_rec *r, const char *snap_id,
                           bool resume_after, hutch_err *err);

static int set_state(struct hutch_ctx *ctx, const char *id, const char *state, const char *prev, const char *error,
                     hutch_err *err) {
  if (hutch_db_sandbox_set_state(ctx->db, id, state, error, err) < 0) return -1;
  hutch_events_publish_state(id, state, prev);
  return 0;
}

static int build_spec(struct hutch_ctx *ctx, const struct hutch_sandbox_rec *r, struct hutch_sandbox_spec *s,
                      hutch_err *err) {
  memset(s, 0, sizeof *s);
  json_error_t je;
  json_t *req = json_loads(r->request, 0, &je);
  if (!req) return hutch_err_sys(err, 0, "stored request of `%s` is corrupt: %s", r->id, je.text);
  json_t *res = json_object_get(req, "resources");
  double cpus = json_number_value(json_object_get(res, "cpus"));
  json_int_t mem = json_integer_value(json_object_get(res, "memory_mib"));
  json_int_t pids = json_integer_value(json_object_get(res, "pids"));
  json_decref(req);
  char hn[64];
  hutch_hostname_for(r->id, hn);
  s->id = xstrdup(r->id);
  s->instance = xstrdup(ctx->instance);
  s->runtime = xstrdup(r->runtime);
  s->rootfs = hutch_rootfs_path(&ctx->pool, r->id);
  /* btrfs: the root is the sandbox's own subvolume.  overlay: the template
   * is the lower layer under the sandbox's upper one. */
  if (ctx->pool.kind == HUTCH_POOL_OVERLAY) s->lower = hutch_template_path(&ctx->pool, r->template_name);
  s->usr_src = hutch_template_usr_src(&ctx->pool, s->lower ? s->lower : s->rootfs);
  s->init_path = xasprintf("%s/hutch-init", ctx->cfg.libexec_dir);
  s->hostname = xstrdup(hn);
  s->uid_base = r->uid_slot >= 0 ? hutch_uid_base_for_slot(ctx, r->uid_slot) : 0;
  s->uid_count = HUTCH_UID_SLOT_SIZE;
  s->limits.memory_bytes = (uint64_t)mem << 20;
  s->limits.pids = (uint64_t)pids;
  s->limits.cpu_millis = (uint32_t)(cpus * 1000 + 0.5);
  /* /tmp is tmpfs charged to the sandbox's memory cgroup: half the limit. */
  s->tmp_bytes = s->limits.memory_bytes / 2;
  if (!strcmp(r->runtime, "gvisor")) {
    cleanup_free char *dir = hutch_sandbox_dir(ctx, r->id);
    s->state_dir = xasprintf("%s/runsc", dir);
    s->bundle_dir = xasprintf("%s/bundle", dir);
    /* ptrace unless told otherwise: runsc's kvm platform needs a kvm that
     * works for it, which /dev/kvm existing does not prove (it hangs on
     * some nested hosts). */
    s->runsc_platform = xstrdup(ctx->cfg.runsc_platform ? ctx->cfg.runsc_platform : "ptrace");
    if (ctx->cfg.runsc_path) s->runsc_path = xstrdup(ctx->cfg.runsc_path);
  }
  return 0;
}

/* ---- building blocks (each idempotent) ---------------------------------- */

static int slot_claim(struct hutch_ctx *ctx, struct hutch_sandbox_rec *r, hutch_err *err) {
  cleanup_free char *owner = xasprintf("%s %s\n", ctx->cfg.data_dir, r->id);
  if (r->uid_slot >= 0) {
    /* Held in the database; after a reboot the host-wide claim may be gone
     * (or taken): claim it again, or take another range (files hold storage
     * ids, so any range works). */
    int rc = hutch_uid_slot_reclaim(ctx->cfg.uid_lock_dir, (uint32_t)r->uid_slot, owner, err);
    if (rc <= 0) return rc;
    r->uid_slot = -1;
  }
  uint32_t slot;
  if (hutch_uid_slot_claim(ctx->cfg.uid_lock_dir, ctx->cfg.uid_slots, owner, &slot, err) < 0)
    return -1;
  r->uid_slot = slot;
  return hutch_db_sandbox_set_host(ctx->db, r->id, r->uid_slot, 0, 0, err);
}

static void slot_release(struct hutch_ctx *ctx, struct hutch_sandbox_rec *r) {
  hutch_err e = HUTCH_ERR_INIT;
  if (r->uid_slot >= 0) hutch_uid_slot_release(ctx->cfg.uid_lock_dir, (uint32_t)r->uid_slot, &e);
  r->uid_slot = -1;
  hutch_db_sandbox_set_host(ctx->db, r->id, -1, 0, 0, &e);
}

/* Launch the sandbox's shim (its processes start fresh). */
/* Launch the sandbox's shim: its processes start fresh, or, with
 * `restore_from` (a memory checkpoint), continue from the checkpoint. */
static int shim_up_from(struct hutch_ctx *ctx, struct hutch_sandbox_rec *r, const char *restore_from,
                        uint64_t *shim_us, hutch_err *err) {
  struct hutch_sandbox_spec spec;
  if (build_spec(ctx, r, &spec, err) < 0) return -1;
  if (restore_from) spec.restore_from = xstrdup(restore_from);
  cleanup_free char *dir = hutch_sandbox_dir(ctx, r->id);
  cleanup_free char *cfg = xasprintf("%s/config.json", dir);
  cleanup_free char *log = xasprintf("%s/shim.log", dir);
  cleanup_free char *sock = hutch_shim_socket(ctx, r->id);
  cleanup_free char *shim = xasprintf("%s/hutch-shim", ctx->cfg.libexec_dir);
  cleanup_free char *json = hutch_spec_to_json(&spec);
  hutch_spec_free(&spec);
  if (!json) return hutch_err_sys(err, ENOMEM, "serialise sandbox spec");
  if (write_file(cfg, json, strlen(json), 0600, err) < 0) return -1;
  struct hutch_shim_launch l = {.shim_path = shim, .config_path = cfg, .socket_path = sock, .log_path = log,
                                .timeout_ms = 30000, .output_buffer = ctx->cfg.output_buffer};
  pid_t shim_pid = 0, init_pid = 0;
  uint64_t t = mono_us();
  if (hutch_shim_launch(&l, &shim_pid, &init_pid, err) < 0) return -1;
  if (shim_us) *shim_us = mono_us() - t;
  r->shim_pid = shim_pid;
  r->init_pid = init_pid;
  if (hutch_db_sandbox_set_host(ctx->db, r->id, r->uid_slot, shim_pid, init_pid, err) < 0) return -1;
  /* Its way out, if its policy gives it one (callers' failure paths release
   * it with the rest in runtime_down). */
  return hutch_egress_up(ctx, r, err);
}

static int shim_up(struct hutch_ctx *ctx, struct hutch_sandbox_rec *r, uint64_t *shim_us, hutch_err *err) {
  return shim_up_from(ctx, r, NULL, shim_us, err);
}

/* End the sandbox's processes and release its runtime resources (shim,
 * cgroup, socket); files and uid range stay. */
static int runtime_down(struct hutch_ctx *ctx, struct hutch_sandbox_rec *r, hutch_err *err) {
  cleanup_free char *sock = hutch_shim_socket(ctx, r->id);
  hutch_err e = HUTCH_ERR_INIT;
  if (hutch_egress_wanted(r)) hutch_egress_down(ctx, r);
  /* A frozen init cannot be reaped by its shim: thaw first.  r->state is the
   * state the operation started from (or was interrupted in); sandboxes
   * that were running or being made were never frozen, and they are the
   * hot path of delete: skip the freezer write for them. */
  bool maybe_frozen = strcmp(r->state, "running") && strcmp(r->state, "creating") && strcmp(r->state, "accepted") &&
                      strcmp(r->state, "starting") && strcmp(r->state, "restoring") && strcmp(r->state, "pool");
  if (maybe_frozen && hutch_cgroup_exists(ctx->instance, r->id)) hutch_cgroup_freeze(ctx->instance, r->id, false, &e);
  /* A pidfd of the shim, taken while it is surely ours (no pid-reuse race),
   * so that we can wait until it is gone: a caller told "deleted" must not
   * find the shim still exiting. */
  int pfd = -1;
  if (hutch_is_shim_of((pid_t)r->shim_pid, r->id)) {
    pfd = (int)syscall(SYS_pidfd_open, (pid_t)r->shim_pid, 0);
    if (pfd >= 0 && !hutch_is_shim_of((pid_t)r->shim_pid, r->id)) {
      close(pfd);
      pfd = -1;
    }
  }
  if (access(sock, F_OK) == 0 && hutch_shim_shutdown(sock, &e) < 0)
    hutch_log(LOG_WARN, "shim.shutdown_failed", "id", r->id, "reason", e.msg, NULL);
  if (pfd >= 0) {
    syscall(SYS_pidfd_send_signal, pfd, SIGKILL, NULL, 0);
    struct pollfd p = {.fd = pfd, .events = POLLIN};
    while (poll(&p, 1, 5000) < 0 && errno == EINTR) {
    }
    close(pfd);
  } else if (hutch_is_shim_of((pid_t)r->shim_pid, r->id)) {
    kill((pid_t)r->shim_pid, SIGKILL);
  }
  /* The cgroup holds every process of the sandbox, whatever the shim did. */
  if (hutch_cgroup_destroy(ctx->instance, r->id, err) < 0) return hutch_err_wrap(err, "release cgroup");
  unlink(sock);
  r->shim_pid = r->init_pid = 0;
  hutch_db_sandbox_set_host(ctx->db, r->id, r->uid_slot, 0, 0, &e);
  return 0;
}

int hutch_ops_release_all(struct hutch_ctx *ctx, const struct hutch_sandbox_rec *rec, hutch_err *err) {
  struct hutch_sandbox_rec r = *rec;
  if (runtime_down(ctx, &r, err) < 0) return -1;
  cleanup_free char *dir = hutch_sandbox_dir(ctx, r.id);
  if (rm_rf(dir, err) < 0) return hutch_err_wrap(err, "remove sandbox directory");
  if (hutch_rootfs_remove(&ctx->pool, r.id, err) < 0) return hutch_err_wrap(err, "remove sandbox root");
  if (r.uid_slot >= 0 && hutch_uid_slot_release(ctx->cfg.uid_lock_dir, (uint32_t)r.uid_slot, err) < 0) return -1;
  return 0;
}

/* Save the command history (docs/lifecycle.md: suspend keeps it): what the
 * shim knows, appended to what earlier suspends saved.  Commands still
 * running are recorded as ended by the suspend. */
static void save_history(struct hutch_ctx *ctx, const struct hutch_sandbox_rec *r) {
  cleanup_free char *sock = hutch_shim_socket(ctx, r->id);
  cleanup_free char *dir = hutch_sandbox_dir(ctx, r->id);
  cleanup_free char *path = xasprintf("%s/commands.json", dir);
  cleanup_free char *tmp = xasprintf("%s/commands.json.tmp", dir);
  hutch_err err = HUTCH_ERR_INIT;
  struct hutch_shim_conn c;
  if (hutch_shim_conn_open(&c, sock, 10, &err) < 0) return;
  struct hutch_frame_hdr h;
  int rc = hutch_shim_conn_call(&c, HUTCH_MSG_LIST, NULL, 0, &h, &err);
  json_error_t je;
  json_t *now = rc == 0 ? json_loadb((const char *)c.payload.data, c.payload.len, 0, &je) : NULL;
  hutch_shim_conn_close(&c);
  if (!json_is_array(now)) {
    json_decref(now);
    return;
  }
  json_t *all = json_load_file(path, 0, &je);
  if (!json_is_array(all)) {
    json_decref(all);
    all = json_array();
  }
  size_t i;
  json_t *cmd;
  json_array_foreach(now, i, cmd) {
    if (!strcmp(json_string_value(json_object_get(cmd, "state")) ?: "", "running")) {
      char ts[32];
      iso8601(now_ms(), ts);
      json_object_set_new(cmd, "state", json_string("exited"));
      json_object_set_new(cmd, "signal", json_integer(SIGKILL));
      json_object_set_new(cmd, "finished_at", json_string(ts));
      json_object_set_new(cmd, "ended_by", json_string("suspend"));
    }
    json_array_append(all, cmd);
  }
  /* Keep the newest 1000. */
  while (json_array_size(all) > 1000) json_array_remove(all, 0);
  if (json_dump_file(all, tmp, JSON_COMPACT) == 0) rename(tmp, path);
  json_decref(all);
  json_decref(now);
}

/* ---- fit -------------------------------------------------------------- */

struct verb_fit {
  const char *verb;
  const char *ok;   /* space-separated states from which it acts */
  const char *noop; /* state in which it is already done */
};

static const struct verb_fit fits[] = {
    {"pause", "running", "paused"},
    {"resume", "paused", "running"},
    {"stop", "running paused", "stopped"},
    {"start", "stopped", "running"},
    {"suspend", "running paused stopped", "suspended"},
    {"restore", "suspended", "running"},
    {"wake", "paused stopped suspended", "running"},
    /* Processes cannot survive their files changing under them: a running
     * sandbox is paused or stopped first (a paused one restarts). */
    {"rollback", "paused stopped suspended", ""},
    {"snapshot", "running paused stopped suspended error", ""}, /* error: files kept, to recover */
    {"snapshot_full", "running paused", ""}, /* memory too: there must be processes */
};

static bool word_in(const char *w, const char *list) {
  size_t n = strlen(w);
  for (const char *p = list; *p;) {
    const char *e = strchr(p, ' ');
    size_t l = e ? (size_t)(e - p) : strlen(p);
    if (l == n && !strncmp(p, w, n)) return true;
    p += l;
    if (*p) p++;
  }
  return false;
}

const char *const hutch_states[] = {
    "accepted", "creating", "running", "paused",   "stopped",   "suspended", "error",
    "pausing",  "resuming", "stopping", "starting", "suspending", "restoring", "deleting", "rolling_back", NULL,
};

static const char *const transitional_states[] = {"accepted",   "creating",  "pausing",  "resuming",
                                                  "stopping",   "starting",  "suspending", "restoring",
                                                  "deleting",   "rolling_back", NULL};

static bool in_list(const char *s, const char *const *list) {
  for (size_t i = 0; list[i]; i++)
    if (!strcmp(s, list[i])) return true;
  return false;
}

bool hutch_state_known(const char *state) { return in_list(state, hutch_states); }
bool hutch_state_transitional(const char *state) { return in_list(state, transitional_states); }

const char *hutch_ops_wake_verb(const char *state) {
  if (!strcmp(state, "paused")) return "resume";
  if (!strcmp(state, "stopped")) return "start";
  if (!strcmp(state, "suspended")) return "restore";
  return "wake";
}

int hutch_ops_fit(const char *verb, const char *state, const char *sb_id, hutch_err *err) {
  for (size_t i = 0; i < sizeof fits / sizeof *fits; i++) {
    if (strcmp(fits[i].verb, verb)) continue;
    if (word_in(state, fits[i].ok)) return 0;
    if (!strcmp(state, fits[i].noop)) return 1;
    hutch_err_set(err, 409, "conflict", "sandbox `%s` is %s: cannot %s it", sb_id, state, verb);
    return -1;
  }
  return hutch_err_invalid(err, "unknown lifecycle call `%s`", verb);
}

/* ---- operations --------------------------------------------------------- */

static int do_create(struct hutch_ctx *ctx, struct hutch_sandbox_rec *r, hutch_err *err) {
  const char *id = r->id;
  cleanup_free char *dir = hutch_sandbox_dir(ctx, id);
  uint64_t t0 = mono_us(), t_rootfs = 0, t_shim = 0;
  const char *final = strcmp(r->origin, "pool") ? "running" : "pool";

  if (set_state(ctx, id, "creating", r->state, NULL, err) < 0) goto fail;
  if (slot_claim(ctx, r, err) < 0) goto fail;
  FAULT("create.slot");
  if (mkdir(dir, 0700) < 0) {
    hutch_err_sys(err, errno, "mkdir `%s`", dir);
    goto fail;
  }
  {
    char hn[64];
    hutch_hostname_for(id, hn);
    json_error_t je;
    json_t *req = json_loads(r->request, 0, &je);
    uint64_t disk = (uint64_t)json_integer_value(json_object_get(json_object_get(req, "resources"), "disk_mib")) << 20;
    const char *snap = json_string_value(json_object_get(req, "from_snapshot"));
    cleanup_free char *from = snap ? hutch_pool_path(&ctx->pool, "snapshots", snap) : NULL;
    t_rootfs = mono_us();
    int rc = hutch_rootfs_create(&ctx->pool, r->template_name, from, id, hn, disk, err);
    json_decref(req);
    if (rc < 0) {
      if (from && access(from, F_OK) < 0) hutch_err_set(err, 404, "not_found", "snapshot `%s` not found", snap);
      goto fail;
    }
    t_rootfs = mono_us() - t_rootfs;
  }
  FAULT("create.rootfs");
  {
    /* From a full snapshot (memory + files) on a runtime that checkpoints
     * memory: the processes continue from it. */
    cleanup_free char *ckpt = create_checkpoint_source(ctx, r);
    if (shim_up_from(ctx, r, ckpt, &t_shim, err) < 0) goto fail;
  }
  FAULT("create.shim");
  FAULT("create.ready");
  /* A warm-pool member waits in state `pool` until a create claims it. */
  if (set_state(ctx, id, final, "creating", NULL, err) < 0) goto fail;
  char ms[32], rms[32], sms[32];
  snprintf(ms, sizeof ms, "%.3f", (double)(mono_us() - t0) / 1000.0);
  snprintf(rms, sizeof rms, "%.3f", (double)t_rootfs / 1000.0);
  snprintf(sms, sizeof sms, "%.3f", (double)t_shim / 1000.0);
  hutch_log(LOG_INFO, "sandbox.created", "id", id, "dur_ms", ms, "rootfs_ms", rms, "shim_ms", sms, NULL);
  return 0;

fail:
  hutch_err_wrap(err, "create sandbox %s", id);
  {
    /* Roll back: a failed create leaves nothing, not even its row. */
    hutch_err e2 = HUTCH_ERR_INIT;
    if (hutch_ops_release_all(ctx, r, &e2) < 0 || hutch_db_sandbox_delete(ctx->db, id, &e2) < 0) {
      hutch_log(LOG_ERROR, "sandbox.cleanup_failed", "id", id, "reason", e2.msg, NULL);
      set_state(ctx, id, "error", "creating", err->msg, &e2);
    } else {
      hutch_events_publish_state(id, "deleted", "creating");
    }
  }
  return -1;
}

static int do_delete(struct hutch_ctx *ctx, struct hutch_sandbox_rec *r, hutch_err *err) {
  const char *id = r->id;
  cleanup_free char *dir = hutch_sandbox_dir(ctx, id);
  if (set_state(ctx, id, "deleting", r->state, NULL, err) < 0) goto fail;
  FAULT("delete.begin");
  if (runtime_down(ctx, r, err) < 0) goto fail;
  FAULT("delete.shim");
  if (rm_rf(dir, err) < 0 || hutch_rootfs_remove(&ctx->pool, id, err) < 0) goto fail;
  hutch_snapshots_drop_auto(ctx, id);
  FAULT("delete.files");
  slot_release(ctx, r);
  FAULT("delete.row");
  if (hutch_db_sandbox_delete(ctx->db, id, err) < 0) goto fail;
  hutch_log(LOG_INFO, "sandbox.deleted", "id", id, NULL);
  hutch_events_publish_state(id, "deleted", "deleting");
  return 0;
fail:
  hutch_err_wrap(err, "delete sandbox %s", id);
  hutch_err e2 = HUTCH_ERR_INIT;
  /* `error` holds no runtime resources (docs/lifecycle.md); files that are
   * left stay until a delete succeeds. */
  runtime_down(ctx, r, &e2);
  slot_release(ctx, r);
  set_state(ctx, id, "error", "deleting", err->msg, &e2);
  return -1;
}

static int freeze(struct hutch_ctx *ctx, struct hutch_sandbox_rec *r, bool frozen, hutch_err *err) {
  struct hutch_sandbox_spec spec;
  if (build_spec(ctx, r, &spec, err) < 0) return -1;
  const struct hutch_runtime_ops *rt = hutch_runtime_get(r->runtime);
  int ret = !rt ? hutch_err_sys(err, 0, "unknown runtime `%s`", r->runtime)
                : frozen ? rt->pause(&spec, err) : rt->resume(&spec, err);
  hutch_spec_free(&spec);
  return ret;
}

static int do_pause(struct hutch_ctx *ctx, struct hutch_sandbox_rec *r, hutch_err *err) {
  if (set_state(ctx, r->id, "pausing", r->state, NULL, err) < 0) goto fail;
  FAULT("pause.begin");
  if (freeze(ctx, r, true, err) < 0) goto fail;
  FAULT("pause.frozen");
  return set_state(ctx, r->id, "paused", "pausing", NULL, err);
fail:
  hutch_err_wrap(err, "pause sandbox %s", r->id);
  hutch_err e2 = HUTCH_ERR_INIT;
  freeze(ctx, r, false, &e2);
  set_state(ctx, r->id, "running", "pausing", NULL, &e2);
  return -1;
}

static int do_resume(struct hutch_ctx *ctx, struct hutch_sandbox_rec *r, hutch_err *err) {
  if (set_state(ctx, r->id, "resuming", r->state, NULL, err) < 0) goto fail;
  FAULT("resume.begin");
  if (freeze(ctx, r, false, err) < 0) goto fail;
  FAULT("resume.thawed");
  return set_state(ctx, r->id, "running", "resuming", NULL, err);
fail:
  hutch_err_wrap(err, "resume sandbox %s", r->id);
  hutch_err e2 = HUTCH_ERR_INIT;
  /* The state must say what the freezer does: freeze again, or admit it runs. */
  if (freeze(ctx, r, true, &e2) == 0) set_state(ctx, r->id, "paused", "resuming", NULL, &e2);
  else set_state(ctx, r->id, "running", "resuming", NULL, &e2);
  return -1;
}

static int do_stop(struct hutch_ctx *ctx, struct hutch_sandbox_rec *r, hutch_err *err) {
  if (set_state(ctx, r->id, "stopping", r->state, NULL, err) < 0) goto fail;
  FAULT("stop.begin");
  if (runtime_down(ctx, r, err) < 0) goto fail;
  FAULT("stop.shim");
  return set_state(ctx, r->id, "stopped", "stopping", NULL, err);
fail:
  hutch_err_wrap(err, "stop sandbox %s", r->id);
  hutch_err e2 = HUTCH_ERR_INIT;
  /* Whatever step failed, finish releasing: stopped is the safe end. */
  if (runtime_down(ctx, r, &e2) == 0) set_state(ctx, r->id, "stopped", "stopping", NULL, &e2);
  else set_state(ctx, r->id, "error", "stopping", err->msg, &e2);
  return -1;
}

/* A sandbox that runs again gets a fresh deadline (its timeout_s from now):
 * one that expired into `suspended` must not run forever once restored. */
static void renew_deadline(struct hutch_ctx *ctx, const struct hutch_sandbox_rec *r) {
  json_error_t je;
  json_t *req = json_loads(r->request, 0, &je);
  json_int_t t = json_integer_value(json_object_get(req, "timeout_s"));
  json_decref(req);
  hutch_err e = HUTCH_ERR_INIT;
  if (t > 0) hutch_db_sandbox_set_expiry(ctx->db, r->id, now_ms() + (uint64_t)t * 1000u, t, &e);
}

static int do_start(struct hutch_ctx *ctx, struct hutch_sandbox_rec *r, hutch_err *err) {
  if (set_state(ctx, r->id, "starting", r->state, NULL, err) < 0) goto fail;
  FAULT("start.begin");
  if (slot_claim(ctx, r, err) < 0 || shim_up(ctx, r, NULL, err) < 0) goto fail;
  FAULT("start.shim");
  if (set_state(ctx, r->id, "running", "starting", NULL, err) < 0) return -1;
  renew_deadline(ctx, r);
  return 0;
fail:
  hutch_err_wrap(err, "start sandbox %s", r->id);
  hutch_err e2 = HUTCH_ERR_INIT;
  runtime_down(ctx, r, &e2);
  set_state(ctx, r->id, "stopped", "starting", NULL, &e2);
  return -1;
}

static int do_suspend(struct hutch_ctx *ctx, struct hutch_sandbox_rec *r, hutch_err *err) {
  bool live = strcmp(r->state, "stopped") != 0;
  char from[16];
  snprintf(from, sizeof from, "%s", r->state);
  if (set_state(ctx, r->id, "suspending", r->state, NULL, err) < 0) goto fail;
  FAULT("suspend.begin");
  if (live) {
    /* A paused sandbox's shim still answers: the freezer holds only the
     * sandbox's processes. */
    save_history(ctx, r);
  }
  FAULT("suspend.history");
  if (live && keeps_memory(r)) {
    /* The runtime keeps memory: a full snapshot (checkpoint + files) that
     * restore continues from. */
    char snap[64];
    json_t *l = json_pack("{s:s}", "hutch.suspend", "true");
    snprintf(r->state, sizeof r->state, "%s", from);
    int rc = hutch_snapshot_row_new(ctx, r, "full", l, snap, err);
    json_decref(l);
    if (rc < 0 || full_checkpoint(ctx, r, snap, false, err) < 0) {
      hutch_err e3 = HUTCH_ERR_INIT;
      if (rc == 0) hutch_db_snapshot_delete(ctx->db, snap, &e3);
      goto fail;
    }
    cleanup_free char *js = xasprintf("\"%s\"", snap);
    if (hutch_db_sandbox_set_field(ctx->db, r->id, "checkpoint", js, err) < 0) goto fail;
    hutch_snapshots_retire_full(ctx, r->id, snap);
  }
  if (runtime_down(ctx, r, err) < 0) goto fail;
  FAULT("suspend.shim");
  slot_release(ctx, r);
  FAULT("suspend.slot");
  return set_state(ctx, r->id, "suspended", "suspending", NULL, err);
fail:
  hutch_err_wrap(err, "suspend sandbox %s", r->id);
  hutch_err e2 = HUTCH_ERR_INIT;
  /* Suspending is releasing: finish it if the host lets us. */
  if (runtime_down(ctx, r, &e2) == 0) {
    slot_release(ctx, r);
    set_state(ctx, r->id, "suspended", "suspending", NULL, &e2);
  } else {
    set_state(ctx, r->id, "error", "suspending", err->msg, &e2);
  }
  return -1;
}

static int do_restore(struct hutch_ctx *ctx, struct hutch_sandbox_rec *r, hutch_err *err) {
  if (set_state(ctx, r->id, "restoring", r->state, NULL, err) < 0) goto fail;
  FAULT("restore.begin");
  if (slot_claim(ctx, r, err) < 0) goto fail;
  FAULT("restore.slot");
  {
    /* A memory checkpoint from the suspend: the processes continue. */
    json_error_t je;
    json_t *req = json_loads(r->request, 0, &je);
    const char *snap = json_string_value(json_object_get(req, "checkpoint"));
    cleanup_free char *ckpt = snap && keeps_memory(r) ? checkpoint_dir(ctx, snap) : NULL;
    json_decref(req);
    if (ckpt && access(ckpt, F_OK) < 0) {
      hutch_err_set(err, 409, "conflict", "the memory checkpoint of sandbox `%s` is gone", r->id);
      free(ckpt);
      ckpt = NULL;
      goto lost;
    }
    if (shim_up_from(ctx, r, ckpt, NULL, err) < 0) {
      if (ckpt) goto lost;
      goto fail;
    }
    /* Consumed: its files have moved on from the checkpoint. */
    hutch_err e2 = HUTCH_ERR_INIT;
    if (ckpt) hutch_db_sandbox_set_field(ctx->db, r->id, "checkpoint", NULL, &e2);
  }
  FAULT("restore.shim");
  if (set_state(ctx, r->id, "running", "restoring", NULL, err) < 0) return -1;
  renew_deadline(ctx, r);
  return 0;
lost : {
  /* The checkpoint cannot be restored: say so, and let the next restore
   * boot fresh on the files (which are intact). */
  hutch_err e2 = HUTCH_ERR_INIT;
  hutch_db_sandbox_set_field(ctx->db, r->id, "checkpoint", NULL, &e2);
  hutch_err_wrap(err, "its processes could not be restored (the next restore boots fresh on its files)");
}
fail:
  hutch_err_wrap(err, "restore sandbox %s", r->id);
  hutch_err e2 = HUTCH_ERR_INIT;
  runtime_down(ctx, r, &e2);
  slot_release(ctx, r);
  set_state(ctx, r->id, "suspended", "restoring", NULL, &e2);
  return -1;
}

/* ---- memory checkpoints (runtimes with HUTCH_RT_CAP_MEMORY_CHECKPOINT) ---- */

static const struct hutch_runtime_ops *runtime_of(const struct hutch_sandbox_rec *r) {
  return hutch_runtime_get(r->runtime);
}

static bool keeps_memory(const struct hutch_sandbox_rec *r) {
  const struct hutch_runtime_ops *rt = runtime_of(r);
  return rt && rt->checkpoint && (rt->caps & HUTCH_RT_CAP_MEMORY_CHECKPOINT);
}

/* The checkpoint image of a full snapshot, when it has one. */
static char *checkpoint_dir(struct hutch_ctx *ctx, const char *snap_id) {
  return hutch_pool_path(&ctx->pool, "checkpoints", snap_id);
}

static char *create_checkpoint_source(struct hutch_ctx *ctx, const struct hutch_sandbox_rec *r) {
  if (!keeps_memory(r)) return NULL;
  json_error_t je;
  json_t *req = json_loads(r->request, 0, &je);
  const char *snap = json_string_value(json_object_get(req, "from_snapshot"));
  char *dir = snap ? checkpoint_dir(ctx, snap) : NULL;
  json_decref(req);
  if (dir && access(dir, F_OK) < 0) {
    free(dir);
    dir = NULL;
  }
  return dir;
}

static int fsync_path(const char *path, hutch_err *err) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return hutch_err_sys(err, errno, "open `%s`", path);
  int rc = fsync(fd);
  int e = errno;
  close(fd);
  if (rc < 0) return hutch_err_sys(err, e, "fsync `%s`", path);
  return 0;
}

/* A full snapshot of a live sandbox: memory checkpoint and file snapshot of
 * the same instant.  The checkpoint stops the sandbox's processes; the
 * files are snapshotted then (nothing can write them), both are made
 * durable, and only then is the snapshot marked ready (restorable).  The
 * sandbox's runtime resources are released; with `resume_after`, it
 * continues from the checkpoint (a paused one is paused again). */
static int full_checkpoint(struct hutch_ctx *ctx, struct hutch_sandbox_rec *r, const char *snap_id,
                           bool resume_after, hutch_err *err) {
  const struct hutch_runtime_ops *rt = runtime_of(r);
  bool was_paused = !strcmp(r->state, "paused") || !strcmp(r->state, "pausing");
  cleanup_free char *ckpt = checkpoint_dir(ctx, snap_id);
  cleanup_free char *tmp = xasprintf("%s.tmp", ckpt);
  cleanup_free char *root = hutch_rootfs_path(&ctx->pool, r->id);
  cleanup_free char *snap = hutch_pool_path(&ctx->pool, "snapshots", snap_id);
  cleanup_free char *ckpts = hutch_pool_path(&ctx->pool, "checkpoints", NULL);
  struct hutch_sandbox_spec spec;
  uint64_t t0 = mono_us();
  hutch_err e2 = HUTCH_ERR_INIT;
  if (was_paused && freeze(ctx, r, false, err) < 0) return hutch_err_wrap(err, "resume before the checkpoint");
  if (build_spec(ctx, r, &spec, err) < 0) return -1;
  int rc = rt->checkpoint(&spec, tmp, err);
  hutch_spec_free(&spec);
  if (rc < 0) {
    hutch_pool_volume_remove(&ctx->pool, tmp, &e2);
    if (was_paused) freeze(ctx, r, true, &e2);
    return hutch_err_wrap(err, "memory checkpoint");
  }
  uint64_t t_mem = mono_us() - t0;
  if (hutch_pool_volume_clone(&ctx->pool, root, snap, true, err) < 0 || hutch_btrfs_sync(ctx->pool.root, err) < 0 ||
      rename(tmp, ckpt) < 0 || fsync_path(ckpts, err) < 0) {
    if (!err->msg[0]) hutch_err_sys(err, errno, "keep the checkpoint `%s`", ckpt);
    hutch_pool_volume_remove(&ctx->pool, tmp, &e2);
    hutch_pool_volume_remove(&ctx->pool, ckpt, &e2);
    hutch_pool_volume_remove(&ctx->pool, snap, &e2);
    goto down;
  }
  {
    struct hutch_volume_usage u;
    if (hutch_pool_volume_usage(&ctx->pool, root, &u, &e2) < 0) u.generation = 0;
    if (hutch_db_snapshot_set_ready(ctx->db, snap_id, u.generation, err) < 0) goto down;
  }
  char ms[32], mms[32];
  snprintf(ms, sizeof ms, "%.1f", (double)(mono_us() - t0) / 1000.0);
  snprintf(mms, sizeof mms, "%.1f", (double)t_mem / 1000.0);
  hutch_log(LOG_INFO, "snapshot.checkpointed", "id", snap_id, "sandbox", r->id, "dur_ms", ms, "memory_ms", mms,
            NULL);
  hutch_events_publish_snapshot(snap_id, r->id, "ready");
  rc = 0;
  goto release;
down:
  rc = -1;
release:
  /* The checkpoint stopped the processes: release what held them. */
  if (runtime_down(ctx, r, rc < 0 ? &e2 : err) < 0 && rc == 0) return -1;
  if (!resume_after) return rc;
  {
    /* Continue: from the checkpoint when it was kept, else boot fresh. */
    hutch_err e3 = HUTCH_ERR_INIT;
    int up = shim_up_from(ctx, r, rc == 0 ? ckpt : NULL, NULL, rc == 0 ? err : &e3);
    if (up == 0 && was_paused) freeze(ctx, r, true, &e3);
    if (up < 0 && rc == 0) return hutch_err_wrap(err, "continue after the checkpoint");
  }
  return rc;
}

/* ---- storage ------------------------------------------------------------ */

/* Where a sandbox's files are, for a snapshot: its root (btrfs), or its
 * upper layer (overlay: only the changes). */
static char *snapshot_source(struct hutch_ctx *ctx, const char *id) {
  cleanup_free char *root = hutch_rootfs_path(&ctx->pool, id);
  return ctx->pool.kind == HUTCH_POOL_BTRFS ? steal_pointer(&root) : xasprintf("%s/upper", root);
}

/* A consistent file snapshot: the sandbox is frozen while the read-only
 * snapshot is taken (a few ms on btrfs), so no write is half-seen.  The
 * row was made in state `creating` when the call was accepted. */
static int do_snapshot(struct hutch_ctx *ctx, struct hutch_sandbox_rec *r, const char *snap_id, hutch_err *err) {
  struct hutch_snapshot_rec row;
  if (hutch_db_snapshot_get(ctx->db, snap_id, &row, err) < 0) return -1;
  bool full = !strcmp(row.kind, "full");
  hutch_snapshot_rec_free(&row);
  if (full) {
    /* Memory and files: checkpoint, snapshot, continue from the checkpoint. */
    if (hutch_ops_fit("snapshot_full", r->state, r->id, err) != 0 || !keeps_memory(r) ||
        full_checkpoint(ctx, r, snap_id, true, err) < 0) {
      if (!err->msg[0]) hutch_err_set(err, 409, "conflict", "sandbox `%s` cannot checkpoint memory", r->id);
      hutch_err e2 = HUTCH_ERR_INIT;
      hutch_db_snapshot_delete(ctx->db, snap_id, &e2);
      return hutch_err_wrap(err, "full snapshot of sandbox %s", r->id);
    }
    /* Full snapshots have their own retention tier (policy keep_full); the
     * one a pending restore needs is never retired. */
    hutch_snapshots_retire_full(ctx, r->id, snap_id);
    return 0;
  }
  cleanup_free char *src = snapshot_source(ctx, r->id);
  cleanup_free char *root = hutch_rootfs_path(&ctx->pool, r->id);
  cleanup_free char *dst = hutch_pool_path(&ctx->pool, "snapshots", snap_id);
  bool frozen = false;
  uint64_t t0 = mono_us(), t_freeze = 0;
  if (!strcmp(r->state, "running")) {
    if (freeze(ctx, r, true, err) < 0) goto fail;
    frozen = true;
    t_freeze = mono_us();
  }
  FAULT("snapshot.frozen");
  if (hutch_pool_volume_clone(&ctx->pool, src, dst, true, err) < 0) goto fail;
  if (frozen) {
    frozen = false;
    t_freeze = mono_us() - t_freeze;
    if (freeze(ctx, r, false, err) < 0) goto fail;
  }
  FAULT("snapshot.taken");
  struct hutch_volume_usage u;
  if (hutch_pool_volume_usage(&ctx->pool, root, &u, err) < 0) u.generation = 0;
  hutch_err_clear(err);
  if (hutch_db_snapshot_set_ready(ctx->db, snap_id, u.generation, err) < 0) goto fail;
  char ms[32], fms[32];
  snprintf(ms, sizeof ms, "%.3f", (double)(mono_us() - t0) / 1000.0);
  snprintf(fms, sizeof fms, "%.3f", (double)t_freeze / 1000.0);
  hutch_log(LOG_INFO, "snapshot.created", "id", snap_id, "sandbox", r->id, "dur_ms", ms, "frozen_ms", fms, NULL);
  hutch_events_publish_snapshot(snap_id, r->id, "ready");
  return 0;
fail:
  hutch_err_wrap(err, "snapshot sandbox %s", r->id);
  {
    hutch_err e2 = HUTCH_ERR_INIT;
    if (frozen) freeze(ctx, r, false, &e2);
    if (hutch_pool_volume_remove(&ctx->pool, dst, &e2) < 0)
      hutch_log(LOG_ERROR, "snapshot.cleanup_failed", "id", snap_id, "reason", e2.msg, NULL);
    hutch_db_snapshot_delete(ctx->db, snap_id, &e2);
  }
  return -1;
}

/* Put the aside root back after a rollback that did not finish. */
static void rollback_undo(struct hutch_ctx *ctx, const char *id) {
  cleanup_free char *root = hutch_rootfs_path(&ctx->pool, id);
  cleanup_free char *aside = xasprintf("%s.rollback", root);
  hutch_err e = HUTCH_ERR_INIT;
  if (access(aside, F_OK) < 0) return;
  if (access(root, F_OK) == 0) {
    hutch_pool_volume_remove(&ctx->pool, aside, &e); /* the new root was complete */
    return;
  }
  if (rename(aside, root) < 0) hutch_log(LOG_ERROR, "rollback.undo_failed", "id", id, "reason", strerror(errno), NULL);
}

static int do_rollback(struct hutch_ctx *ctx, struct hutch_sandbox_rec *r, const char *snap_id, hutch_err *err) {
  struct hutch_snapshot_rec snap;
  if (hutch_db_snapshot_get(ctx->db, snap_id, &snap, err) < 0) return -1;
  bool mine = !strcmp(snap.sandbox_id, r->id), ready = !strcmp(snap.state, "ready");
  hutch_snapshot_rec_free(&snap);
  if (!mine)
    return hutch_err_invalid(err, "snapshot `%s` is not a snapshot of sandbox `%s`", snap_id, r->id);
  if (!ready) return hutch_err_set(err, 409, "conflict", "snapshot `%s` is not ready", snap_id);
  char was[16];
  snprintf(was, sizeof was, "%s", r->state);
  struct hutch_snapshot_rec srow;
  bool full = false;
  if (hutch_db_snapshot_get(ctx->db, snap_id, &srow, err) == 0) {
    full = !strcmp(srow.kind, "full") && keeps_memory(r);
    hutch_snapshot_rec_free(&srow);
  }
  /* A full snapshot brings its processes back too: the sandbox runs them. */
  cleanup_free char *ckpt = full ? checkpoint_dir(ctx, snap_id) : NULL;
  bool restart = !strcmp(was, "paused") || full;
  cleanup_free char *root = hutch_rootfs_path(&ctx->pool, r->id);
  cleanup_free char *aside = xasprintf("%s.rollback", root);
  cleanup_free char *from = hutch_pool_path(&ctx->pool, "snapshots", snap_id);
  json_error_t je;
  json_t *req = json_loads(r->request, 0, &je);
  uint64_t disk = (uint64_t)json_integer_value(json_object_get(json_object_get(req, "resources"), "disk_mib")) << 20;
  json_decref(req);
  char hn[64];
  hutch_hostname_for(r->id, hn);
  if (set_state(ctx, r->id, "rolling_back", was, NULL, err) < 0) goto fail;
  if (!strcmp(was, "paused") && runtime_down(ctx, r, err) < 0) goto fail;
  FAULT("rollback.down");
  if (rename(root, aside) < 0) {
    hutch_err_sys(err, errno, "set `%s` aside", root);
    goto fail;
  }
  FAULT("rollback.aside");
  if (hutch_rootfs_create(&ctx->pool, r->template_name, from, r->id, hn, disk, err) < 0) {
    rollback_undo(ctx, r->id);
    goto fail;
  }
  FAULT("rollback.swapped");
  {
    hutch_err e2 = HUTCH_ERR_INIT;
    if (hutch_pool_volume_remove(&ctx->pool, aside, &e2) < 0)
      hutch_log(LOG_WARN, "rollback.cleanup_failed", "id", r->id, "reason", e2.msg, NULL);
  }
  if (restart) {
    /* The paused processes ended with the old files: boot on the new ones. */
    if (slot_claim(ctx, r, err) < 0 || shim_up_from(ctx, r, ckpt, NULL, err) < 0) goto fail;
    hutch_err e4 = HUTCH_ERR_INIT;
    if (full) hutch_db_sandbox_set_field(ctx->db, r->id, "checkpoint", NULL, &e4);
    if (set_state(ctx, r->id, "running", "rolling_back", NULL, err) < 0) return -1;
    renew_deadline(ctx, r);
  } else if (set_state(ctx, r->id, was, "rolling_back", NULL, err) < 0) {
    return -1;
  }
  hutch_log(LOG_INFO, "sandbox.rolled_back", "id", r->id, "snapshot", snap_id, NULL);
  return 0;
fail:
  hutch_err_wrap(err, "roll back sandbox %s", r->id);
  {
    hutch_err e2 = HUTCH_ERR_INIT;
    rollback_undo(ctx, r->id);
    if (!restart) {
      set_state(ctx, r->id, was, "rolling_back", NULL, &e2);
    } else {
      runtime_down(ctx, r, &e2);
      set_state(ctx, r->id, "stopped", "rolling_back", NULL, &e2);
    }
  }
  return -1;
}

int hutch_ops_run(struct hutch_ctx *ctx, const char *kind, const char *sb_id, const char *arg, hutch_err *err) {
  if (!strcmp(kind, "template")) return hutch_ops_template_build(ctx, sb_id, arg, err);
  struct hutch_sandbox_rec r;
  if (hutch_db_sandbox_get(ctx->db, sb_id, &r, err) < 0) {
    /* Deleting what is already gone (a failed create removed it) is done. */
    if (!strcmp(kind, "delete") && err->status == 404) return 0;
    return -1;
  }
  int ret;
  if (!strcmp(kind, "create") || !strcmp(kind, "pool_fill")) {
    ret = do_create(ctx, &r, err);
  } else if (!strcmp(kind, "delete")) {
    ret = do_delete(ctx, &r, err);
  } else {
    /* Checked again now: an operation queued before this one may have
     * changed the state since the call was accepted. */
    const char *verb = !strcmp(kind, "wake") ? hutch_ops_wake_verb(r.state) : kind;
    int fit = hutch_ops_fit(verb, r.state, sb_id, err);
    if (fit != 0) {
      hutch_sandbox_rec_free(&r);
      return fit > 0 ? 0 : -1;
    }
    if (!strcmp(verb, "pause")) ret = do_pause(ctx, &r, err);
    else if (!strcmp(verb, "resume")) ret = do_resume(ctx, &r, err);
    else if (!strcmp(verb, "stop")) ret = do_stop(ctx, &r, err);
    else if (!strcmp(verb, "start")) ret = do_start(ctx, &r, err);
    else if (!strcmp(verb, "suspend")) ret = do_suspend(ctx, &r, err);
    else if (!strcmp(verb, "restore")) ret = do_restore(ctx, &r, err);
    else if (!strcmp(verb, "snapshot") && arg) ret = do_snapshot(ctx, &r, arg, err);
    else if (!strcmp(verb, "rollback") && arg) ret = do_rollback(ctx, &r, arg, err);
    else ret = hutch_err_invalid(err, "unknown operation `%s`", kind);
    if (ret == 0) hutch_log(LOG_INFO, "sandbox.lifecycle", "id", sb_id, "op", verb, NULL);
  }
  hutch_sandbox_rec_free(&r);
  return ret;
}

/* ---- failures found from outside ----------------------------------------- */

void hutch_ops_shim_lost(struct hutch_ctx *ctx, const struct hutch_sandbox_rec *rec) {
  struct hutch_sandbox_rec r = *rec;
  hutch_err e = HUTCH_ERR_INIT;
  runtime_down(ctx, &r, &e);
  slot_release(ctx, &r);
  set_state(ctx, r.id, "error", rec->state,
            "hutch-shim exited unexpectedly: the sandbox's processes ended (its files are kept)", &e);
  hutch_log(LOG_WARN, "sandbox.shim_lost", "id", r.id, NULL);
}

void hutch_ops_reconcile(struct hutch_ctx *ctx, struct hutch_sandbox_rec *r) {
  cleanup_free char *sock = hutch_shim_socket(ctx, r->id);
  bool alive = access(sock, F_OK) == 0 && hutch_shim_alive(sock);
  const char *s = r->state;
  hutch_err e = HUTCH_ERR_INIT;
  if (!strcmp(s, "accepted") || !strcmp(s, "creating") || !strcmp(s, "deleting")) {
    /* Roll back a create, roll forward a delete: both end with nothing. */
    if (hutch_ops_release_all(ctx, r, &e) == 0 && hutch_db_sandbox_delete(ctx->db, r->id, &e) == 0)
      hutch_log(LOG_WARN, "sandbox.reconciled", "id", r->id, "was", s, "now", "deleted", NULL);
    return;
  }
  if (!strcmp(s, "pool")) {
    if (!alive && hutch_ops_release_all(ctx, r, &e) == 0) hutch_db_sandbox_delete(ctx->db, r->id, &e);
    return;
  }
  if (!strcmp(s, "running") || !strcmp(s, "paused") || !strcmp(s, "pausing") || !strcmp(s, "resuming")) {
    if (!alive) {
      hutch_ops_shim_lost(ctx, r);
      return;
    }
    /* Finish an interrupted freeze or thaw (both idempotent).  `running`
     * means thawed: a crash while a snapshot held it frozen is undone. */
    if (!strcmp(s, "running") && hutch_cgroup_exists(ctx->instance, r->id)) {
      freeze(ctx, r, false, &e);
    } else if (!strcmp(s, "pausing")) {
      if (freeze(ctx, r, true, &e) == 0) set_state(ctx, r->id, "paused", s, NULL, &e);
      else set_state(ctx, r->id, "running", s, NULL, &e);
    } else if (!strcmp(s, "resuming")) {
      if (freeze(ctx, r, false, &e) == 0) set_state(ctx, r->id, "running", s, NULL, &e);
    }
    hutch_log(LOG_INFO, "sandbox.readopted", "id", r->id, NULL);
    return;
  }
  if (!strcmp(s, "rolling_back")) {
    /* Interrupted: keep whichever root is whole; nothing runs. */
    rollback_undo(ctx, r->id);
    cleanup_free char *root = hutch_rootfs_path(&ctx->pool, r->id);
    if (runtime_down(ctx, r, &e) == 0)
      set_state(ctx, r->id, access(root, F_OK) == 0 ? "stopped" : "error", s,
                access(root, F_OK) == 0 ? NULL : "rollback interrupted: the sandbox has no root", &e);
  } else if (!strcmp(s, "stopping")) {
    if (runtime_down(ctx, r, &e) == 0) set_state(ctx, r->id, "stopped", s, NULL, &e);
  } else if (!strcmp(s, "starting")) {
    if (alive) set_state(ctx, r->id, "running", s, NULL, &e);
    else if (runtime_down(ctx, r, &e) == 0) set_state(ctx, r->id, "stopped", s, NULL, &e);
  } else if (!strcmp(s, "restoring")) {
    if (alive) {
      set_state(ctx, r->id, "running", s, NULL, &e);
    } else if (runtime_down(ctx, r, &e) == 0) {
      slot_release(ctx, r);
      set_state(ctx, r->id, "suspended", s, NULL, &e);
    }
  } else if (!strcmp(s, "suspending")) {
    if (alive) save_history(ctx, r);
    if (runtime_down(ctx, r, &e) == 0) {
      slot_release(ctx, r);
      set_state(ctx, r->id, "suspended", s, NULL, &e);
    }
  } else if (!strcmp(s, "stopped") || !strcmp(s, "suspended") || !strcmp(s, "error")) {
    /* Nothing may run: make sure of it (a crash between steps).  A stopped
     * sandbox keeps its uid range: re-take the claim a reboot cleared. */
    runtime_down(ctx, r, &e);
    if (strcmp(s, "stopped")) slot_release(ctx, r);
    else if (slot_claim(ctx, r, &e) < 0) hutch_log(LOG_WARN, "sandbox.reclaim_failed", "id", r->id, NULL);
    return;
  }
  if (e.msg[0]) hutch_log(LOG_ERROR, "sandbox.reconcile_failed", "id", r->id, "reason", e.msg, NULL);
  else hutch_log(LOG_WARN, "sandbox.reconciled", "id", r->id, "was", s, NULL);
}
