"""Lifecycle verbs (docs/api.md "Lifecycle", docs/lifecycle.md): pause/resume
keeps processes and their memory and uses no CPU while paused; stop/start
keeps files and ends processes; suspend/restore releases every active
resource and keeps files and the command history; wake; the state table
(409 for every misfit naming the state, no-op repeats); 202 + operation and
?wait=true; unknown ids; on_timeout "suspend"; concurrent pause + delete +
exec; deleting a paused sandbox.

Host resources are checked against docs/lifecycle.md's table with
hostutil.assert_host_state: the rest of the instance must equal a snapshot
taken before, and each sandbox must hold exactly what its state holds
(cgroup, shim and init processes, shim socket, uid claim, directory, row)."""

import os
import threading
import time

import pytest

import hostutil
from hutch_client import LIFECYCLE_VERBS, TRANSITIONAL_STATES, check_error

TARGET = {"pause": "paused", "resume": "running", "stop": "stopped", "start": "running",
          "suspend": "suspended", "restore": "running", "wake": "running"}
# docs/api.md, the lifecycle table: the states each verb acts on...
FITS = {"pause": {"running"}, "resume": {"paused"}, "stop": {"running", "paused"},
        "start": {"stopped"}, "suspend": {"running", "paused", "stopped"},
        "restore": {"suspended"}, "wake": {"paused", "stopped", "suspended"}}
# ...and the state in which repeating it is a no-op.  Everything else is 409.
NOOP = {"pause": "paused", "resume": "running", "stop": "stopped", "start": "running",
        "suspend": "suspended", "restore": "running", "wake": "running"}

COUNTER = r'''
import os, sys, time
i = 0
while True:
    i += 1
    with open("/root/counter.tmp", "w") as f:
        f.write("%d" % i)
    os.rename("/root/counter.tmp", "/root/counter")
    sum(range(20000))   # a little CPU every tick, so that a non-frozen counter shows
    time.sleep(0.1)
'''


def _host_file(hutchd, sid, name):
    """Contents of a file the sandbox wrote under /root, read on the host
    from its writable layer (works while paused, stopped, suspended)."""
    for p in hostutil.find_sandbox_file(hutchd, sid, name):
        if p.endswith("/root/" + name):
            return hostutil.read_file(p)
    return None


def _counter(hutchd, sid):
    """The counter's current value (retrying a read that races the rename)."""
    v = hostutil.wait_until(lambda: (_host_file(hutchd, sid, "counter") or "").strip(), 2, 0.01)
    assert v and v.isdigit(), "cannot read the counter: %r" % v
    return int(v)


def _procs_by_marker(hutchd, sid, marker):
    """Host pids of the sandbox's processes whose command line has `marker`."""
    out = []
    for cg in hostutil.sandbox_cgroup_dirs_existing(hutchd.instance, sid):
        for p in hostutil.cgroup_procs(cg):
            if marker in " ".join(hostutil.proc_cmdline(p) or []) and p not in out:
                out.append(p)
    return sorted(out)


def _write(api, sid, name, content):
    r = api.exec_ok(sid, cmd="printf %%s '%s' > /root/%s && sync" % (content, name))
    assert r["exit_code"] == 0, r


def _read(api, sid, name):
    r = api.exec_ok(sid, argv=["cat", "/root/" + name])
    assert r["exit_code"] == 0, r
    return r["stdout"]


def _to_state(api, sid, state):
    """Bring a running sandbox to `state` with ?wait=true verbs."""
    if state == "running":
        return
    verb = {"paused": "pause", "stopped": "stop", "suspended": "suspend"}[state]
    api.lifecycle_ok(sid, verb)


# -- pause / resume -----------------------------------------------------------


def test_pause_freezes_and_resume_continues_the_counter(api, hutchd, make_sandbox, leaks):
    sb = make_sandbox(labels={"t": "pause"})
    sid = sb["id"]
    base = hostutil.snapshot_excluding(hutchd, [sid])
    c = api.start_command_ok(sid, argv=["python3", "-c", COUNTER], tag="counter")
    assert hostutil.wait_until(lambda: (_host_file(hutchd, sid, "counter") or "0").strip() not in ("", "0"), 10)
    pids0 = hostutil.wait_until(lambda: _procs_by_marker(hutchd, sid, "counter.tmp"), 5)
    assert len(pids0) == 1, "the counter process on the host: %r" % pids0

    # Positive control: a running counter advances and uses CPU.
    cpu0, v0 = hostutil.sandbox_cpu_usage_usec(hutchd, sid), _counter(hutchd, sid)
    assert cpu0 is not None, "cannot read the sandbox's CPU usage on the host"
    time.sleep(1.0)
    cpu1, v1 = hostutil.sandbox_cpu_usage_usec(hutchd, sid), _counter(hutchd, sid)
    assert v1 >= v0 + 5, "the counter does not count while running: %d -> %d" % (v0, v1)
    assert cpu1 > cpu0, "no CPU use seen while running"

    p = api.lifecycle_ok(sid, "pause")
    assert p["host"]["init_pid"] == sb["host"]["init_pid"], p
    assert api.get(sid).json["state"] == "paused"
    hostutil.assert_host_state(hutchd, base, {sid: "paused"})
    vp, cpu_p = _counter(hutchd, sid), hostutil.sandbox_cpu_usage_usec(hutchd, sid)
    m = api.sandbox_metrics(sid)
    assert m.status in (200, 409), m
    if m.status == 409:
        check_error(m, 409, "conflict", "paused")
    time.sleep(2.0)
    vp2, cpu_p2 = _counter(hutchd, sid), hostutil.sandbox_cpu_usage_usec(hutchd, sid)
    assert vp2 == vp, "the counter moved while paused: %d -> %d" % (vp, vp2)
    assert cpu_p2 == cpu_p, "the paused sandbox used CPU: %d -> %d usec" % (cpu_p, cpu_p2)
    if m.status == 200:
        m2 = api.sandbox_metrics(sid)
        assert m2.status == 200 and m2.json["cpu_usage_usec"] == m.json["cpu_usage_usec"], (m, m2)
    # The process is still there (frozen, memory kept), with the same pid.
    assert _procs_by_marker(hutchd, sid, "counter.tmp") == pids0
    assert hostutil.proc_alive(pids0[0])

    r = api.lifecycle_ok(sid, "resume")
    assert r["host"]["init_pid"] == sb["host"]["init_pid"], r
    first = hostutil.wait_until(lambda: (lambda v: v if v != vp else None)(_counter(hutchd, sid)), 5, 0.01)
    assert first, "the counter did not continue after resume (stuck at %d)" % vp
    assert vp < first <= vp + 5, "after resume the counter went %d -> %d: not a continuation" % (vp, first)
    time.sleep(0.5)
    later = _counter(hutchd, sid)
    assert later > first, (first, later)
    assert _procs_by_marker(hutchd, sid, "counter.tmp") == pids0, "the counter is not the same process"
    g = api.command(sid, c["id"])
    assert g.status == 200 and g.json["state"] == "running" and g.json["pid"] == c["pid"], g
    hostutil.assert_host_state(hutchd, base, {sid: "running"})
    assert api.exec_ok(sid, argv=["echo", "ok"])["stdout"] == "ok\n"


def test_exec_commands_files_on_paused_are_409_naming_paused(api, make_sandbox):
    sb = make_sandbox()
    sid = sb["id"]
    _write(api, sid, "f", "x")
    api.lifecycle_ok(sid, "pause")
    try:
        t0 = time.monotonic()
        check_error(api.exec(sid, argv=["true"], http_timeout=20), 409, "conflict", "paused")
        check_error(api.start_command(sid, argv=["true"]), 409, "conflict", "paused")
        check_error(api.files_get(sid, "/root/f", timeout=20), 409, "conflict", "paused")
        check_error(api.files_put(sid, "/root/g", b"y", timeout=20), 409, "conflict", "paused")
        check_error(api.files_stat(sid, "/root/f"), 409, "conflict", "paused")
        check_error(api.files_list(sid, "/root"), 409, "conflict", "paused")
        assert time.monotonic() - t0 < 15, "refusals must come at once, not after a frozen shim times out"
    finally:
        api.lifecycle_ok(sid, "resume")
    assert _read(api, sid, "f") == "x"


# -- stop / start ---------------------------------------------------------------


def test_stop_start_keeps_files_and_ends_processes(api, hutchd, make_sandbox):
    sb = make_sandbox()
    sid, init0 = sb["id"], sb["host"]["init_pid"]
    base = hostutil.snapshot_excluding(hutchd, [sid])
    _write(api, sid, "kept.txt", "before-stop")
    api.start_command_ok(sid, argv=["sleep", "1000"], tag="old")
    sleepers = hostutil.wait_until(lambda: _procs_by_marker(hutchd, sid, "sleep 1000"), 5)
    assert sleepers, "the background command is not running"

    r = api.lifecycle(sid, "stop")
    assert r.status == 202, r
    assert r.json["id"] == sid and r.json["operation"]["id"].startswith("op_"), r
    seen = [r.json["state"]]
    deadline = time.monotonic() + 30
    while seen[-1] != "stopped" and time.monotonic() < deadline:
        s = api.get(sid).json["state"]
        if s != seen[-1]:
            seen.append(s)
        time.sleep(0.01)
    assert seen[-1] == "stopped", "not stopped within 30 s: %r" % seen
    assert set(seen) <= {"running", "stopping", "stopped"}, "states seen while stopping: %r" % seen
    o = api.wait_operation(r.json["operation"]["id"])
    assert o["state"] == "succeeded" and o["sandbox_id"] == sid, o

    fps = hostutil.assert_host_state(hutchd, base, {sid: "stopped"})
    assert not hostutil.proc_alive(init0), "hutch-init still alive in a stopped sandbox"
    for p in sleepers:
        assert not hostutil.proc_alive(p), "a process from before the stop survived"
    assert _host_file(hutchd, sid, "kept.txt") == "before-stop", fps
    check_error(api.exec(sid, argv=["true"]), 409, "conflict", "stopped")

    s = api.lifecycle_ok(sid, "start")
    assert s["host"]["init_pid"] != init0, "start must boot a fresh hutch-init: %r" % s
    assert hostutil.proc_alive(s["host"]["init_pid"])
    hostutil.assert_host_state(hutchd, base, {sid: "running"})
    assert _read(api, sid, "kept.txt") == "before-stop"
    assert _procs_by_marker(hutchd, sid, "sleep 1000") == [], "processes from before the stop are back"
    r = api.exec_ok(sid, cmd="ps -eo args 2>/dev/null || ls /proc")
    assert "sleep 1000" not in r["stdout"], r
    assert api.exec_ok(sid, argv=["echo", "up"])["stdout"] == "up\n"


# -- suspend / restore ------------------------------------------------------------


def test_suspend_releases_everything_and_restore_brings_it_back(api, hutchd, make_sandbox):
    sb = make_sandbox()
    sid, init0 = sb["id"], sb["host"]["init_pid"]
    base = hostutil.snapshot_excluding(hutchd, [sid])
    _write(api, sid, "kept.txt", "before-suspend")
    done = api.start_command_ok(sid, cmd="echo history-marker; exit 7", tag="done")
    assert api.command_wait(sid, done["id"], timeout_s=10).json["exit_code"] == 7
    long = api.start_command_ok(sid, argv=["sleep", "1000"], tag="long")
    claims = hostutil.sandbox_uid_claims(hutchd, sid)
    assert len(claims) == 1, "a running sandbox holds one uid claim: %r" % claims

    s = api.lifecycle_ok(sid, "suspend")
    assert s["state"] == "suspended"
    hostutil.assert_host_state(hutchd, base, {sid: "suspended"})
    assert hostutil.sandbox_uid_claims(hutchd, sid) == [], "the uid range claim was not released"
    assert not hostutil.proc_alive(init0)
    assert _host_file(hutchd, sid, "kept.txt") == "before-suspend"
    assert os.path.isfile(os.path.join(hutchd.data_dir, "sandboxes", sid, "commands.json")), \
        "suspend must save the command history to commands.json"
    for verb_call in (lambda: api.exec(sid, argv=["true"]), lambda: api.start_command(sid, argv=["true"]),
                      lambda: api.files_get(sid, "/root/kept.txt")):
        check_error(verb_call(), 409, "conflict", "suspended")

    # The saved history answers while suspended.
    h = api.commands(sid)
    assert h.status == 200, h
    by_id = {x["id"]: x for x in h.json["commands"]}
    assert done["id"] in by_id, "finished command missing from the saved history: %r" % h
    assert by_id[done["id"]]["exit_code"] == 7 and by_id[done["id"]]["state"] == "exited", by_id[done["id"]]
    assert by_id[done["id"]]["tag"] == "done"
    assert long["id"] in by_id, h
    assert by_id[long["id"]]["state"] == "exited", "a command running at suspend is recorded as ended: %r" % (
        by_id[long["id"]],)
    g = api.command(sid, done["id"])
    assert g.status == 200 and g.json["exit_code"] == 7, g

    r = api.lifecycle_ok(sid, "restore")
    assert r["host"]["init_pid"] != init0 and hostutil.proc_alive(r["host"]["init_pid"]), r
    hostutil.assert_host_state(hutchd, base, {sid: "running"})
    assert len(hostutil.sandbox_uid_claims(hutchd, sid)) == 1, "restore must claim a uid range"
    assert _read(api, sid, "kept.txt") == "before-suspend"
    assert api.exec_ok(sid, argv=["id", "-u"])["stdout"] == "0\n"
    # Files written before suspend are usable (owned by sandbox root) under the new range.
    assert api.exec_ok(sid, cmd="echo more >> /root/kept.txt && cat /root/kept.txt")["stdout"] == \
        "before-suspendmore\n"


# -- wake -----------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["running", "paused", "stopped", "suspended"])
def test_wake_from_every_state(api, hutchd, make_sandbox, state):
    sb = make_sandbox(labels={"wake": state})
    sid, init0 = sb["id"], sb["host"]["init_pid"]
    base = hostutil.snapshot_excluding(hutchd, [sid])
    _write(api, sid, "kept.txt", "w-" + state)
    _to_state(api, sid, state)
    w = api.lifecycle_ok(sid, "wake")
    if state in ("running", "paused"):
        assert w["host"]["init_pid"] == init0, "wake from %s must not reboot the sandbox: %r" % (state, w)
    else:
        assert w["host"]["init_pid"] != init0, w
    hostutil.assert_host_state(hutchd, base, {sid: "running"})
    assert _read(api, sid, "kept.txt") == "w-" + state
    again = api.lifecycle_ok(sid, "wake")
    assert again["host"]["init_pid"] == w["host"]["init_pid"], "wake on running is a no-op"


# -- the state table: misfits are 409, repeats are no-ops ---------------------------------


def test_state_table_misfits_409_and_noops(api, hutchd, make_sandbox):
    sbs = {}
    for st in ("running", "paused", "stopped", "suspended"):
        sb = make_sandbox(labels={"table": st})
        _to_state(api, sb["id"], st)
        sbs[st] = api.get(sb["id"]).json
        assert sbs[st]["state"] == st
    problems = []
    for st, sb in sbs.items():
        sid = sb["id"]
        for verb in LIFECYCLE_VERBS:
            if st in FITS[verb]:
                continue
            for wait in (False, True):
                r = api.lifecycle(sid, verb, wait=wait, timeout=60)
                if NOOP[verb] == st:
                    ok = (r.status == 200 and r.json.get("state") == st) if wait else r.status == 202
                    if not ok:
                        problems.append("%s on %s (wait=%s): expected a no-op %s, got %r" % (
                            verb, st, wait, 200 if wait else 202, r))
                    elif not wait:
                        o = api.wait_operation(r.json["operation"]["id"])
                        if o["state"] != "succeeded":
                            problems.append("%s on %s: no-op operation did not succeed: %r" % (verb, st, o))
                else:
                    try:
                        check_error(r, 409, "conflict", st)
                    except AssertionError as e:
                        problems.append("%s on %s (wait=%s): %s" % (verb, st, wait, e))
            now = api.get(sid).json
            if now["state"] != st:
                problems.append("%s on %s changed the state to %s" % (verb, st, now["state"]))
                break
            if (now.get("host") or {}).get("init_pid") != (sb.get("host") or {}).get("init_pid"):
                problems.append("%s on %s changed the sandbox (init %r -> %r)" % (
                    verb, st, sb.get("host"), now.get("host")))
    assert not problems, "\n".join(problems)
    for st in ("paused", "stopped", "suspended"):
        api.lifecycle_ok(sbs[st]["id"], "wake")


def test_repeats_are_idempotent(api, hutchd, make_sandbox):
    sb = make_sandbox()
    sid = sb["id"]
    base = hostutil.snapshot_excluding(hutchd, [sid])
    _write(api, sid, "kept.txt", "rep")
    for verb in ("pause", "pause", "resume", "resume", "stop", "stop", "start", "start",
                 "suspend", "suspend", "restore", "restore"):
        api.lifecycle_ok(sid, verb)
        hostutil.assert_host_state(hutchd, base, {sid: TARGET[verb]})
    assert _read(api, sid, "kept.txt") == "rep"


@pytest.mark.parametrize("verb", LIFECYCLE_VERBS)
def test_every_verb_202_operation_then_wait_200(api, make_sandbox, verb):
    sb = make_sandbox(labels={"verb": verb})
    sid = sb["id"]
    frm = sorted(FITS[verb])[0] if verb != "stop" else "running"
    _to_state(api, sid, frm)
    t0 = time.monotonic()
    r = api.lifecycle(sid, verb, wait=False, timeout=30)
    assert r.status == 202, r
    assert time.monotonic() - t0 < 10, "202 must come at once"
    assert r.json["id"] == sid, r
    assert isinstance(r.json["state"], str) and r.json["state"], r
    op = r.json["operation"]
    assert op["id"].startswith("op_"), r
    assert op["state"] in ("pending", "running", "succeeded"), r
    kinds = {verb} | ({"resume", "restore", "start"} if verb == "wake" else set())
    assert op["kind"] in kinds, r
    o = api.wait_operation(op["id"])
    assert o["state"] == "succeeded" and o["error"] is None and o["sandbox_id"] == sid, o
    assert api.get(sid).json["state"] == TARGET[verb]
    # ?wait=true: 200 and the sandbox object once the operation ended.
    _to_state_from(api, sid, TARGET[verb], frm)
    w = api.lifecycle(sid, verb, wait=True, timeout=130)
    assert w.status == 200, w
    assert w.json["id"] == sid and w.json["state"] == TARGET[verb], w
    for k in ("template", "runtime", "resources", "created_at", "host"):
        assert k in w.json, "not the sandbox object: %r" % w


def _to_state_from(api, sid, cur, want):
    """Drive a sandbox from `cur` back to `want` (both stable states)."""
    if cur == want:
        return
    if cur != "running":
        api.lifecycle_ok(sid, "wake")
    _to_state(api, sid, want)


@pytest.mark.parametrize("verb", LIFECYCLE_VERBS)
def test_unknown_sandbox_is_404(api, verb):
    for wait in (False, True):
        check_error(api.lifecycle("sb_doesnotexist000000", verb, wait=wait, timeout=30), 404, "not_found")


# -- on_timeout: suspend ------------------------------------------------------------------


def test_on_timeout_suspend_suspends_and_restores(api, hutchd):
    r = api.create(wait=True, timeout_s=2, on_timeout="suspend", labels={"t": "on_timeout"})
    assert r.status == 201, r
    sb = r.json
    sid = sb["id"]
    try:
        assert sb.get("on_timeout") == "suspend", sb
        _write(api, sid, "kept.txt", "expiring")
        s = api.wait_state(sid, ("suspended", "gone", "error"), timeout=20)
        assert s is not None and s["state"] == "suspended", \
            "on_timeout suspend must suspend (not delete) at expiry: %r" % s
        fps = hostutil.assert_host_state(hutchd, hostutil.snapshot_excluding(hutchd, [sid]), {sid: "suspended"})
        assert _host_file(hutchd, sid, "kept.txt") == "expiring", fps
        # Still suspended (not deleted) a while later.
        time.sleep(1.5)
        assert api.get(sid).json["state"] == "suspended"
        w = api.lifecycle_ok(sid, "restore")
        assert w["state"] == "running"
        # A restored sandbox gets a fresh deadline rather than none.
        assert w["expires_at"] is not None, w
        assert _read(api, sid, "kept.txt") == "expiring"
    finally:
        api.delete(sid, wait=True)


# -- concurrency, delete of a paused sandbox ---------------------------------------------


def test_concurrent_pause_delete_exec_end_consistent(api, hutchd, leaks):
    before = leaks.snapshot(hutchd)
    outcomes = []
    for rnd in range(4):
        sb = api.create_ok(labels={"t": "race"})
        sid = sb["id"]
        res = {}
        barrier = threading.Barrier(3)

        def run(name, fn):
            try:
                barrier.wait(10)
                if name == "delete" and rnd % 2:
                    time.sleep(0.02)  # vary who goes first
                res[name] = fn()
            except Exception as e:  # reported below
                res[name] = e

        calls = {
            "pause": lambda: api.lifecycle(sid, "pause", wait=True, timeout=60),
            "delete": lambda: api.delete(sid, wait=True, timeout=60),
            "exec": lambda: api.exec(sid, cmd="sleep 0.2; echo done", http_timeout=60),
        }
        threads = [threading.Thread(target=run, args=(n, f), daemon=True) for n, f in calls.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(70)
        hung = [n for n, t in zip(calls, threads) if t.is_alive()]
        assert not hung, "round %d: calls still blocked after 70 s (deadlock?): %r; results %r" % (rnd, hung, res)
        for n, v in res.items():
            assert not isinstance(v, Exception), "round %d: %s raised %r" % (rnd, n, v)
        assert res["delete"].status == 200 and res["delete"].json["state"] == "deleted", res["delete"]
        # A pause that fails (5xx) is not an inconsistency; that pause is
        # reliable under exec churn is test_pause_is_reliable_while_commands_spawn.
        assert res["pause"].status in (200, 202, 404, 409) or 500 <= res["pause"].status < 600, \
            "round %d pause: %r" % (rnd, res["pause"])
        assert res["exec"].status in (200, 404, 409, 503), "round %d exec: %r" % (rnd, res["exec"])
        if res["exec"].status == 200:
            # It ran to completion, or was ended by the delete.
            assert res["exec"].json["stdout"] in ("done\n", ""), res["exec"]
        outcomes.append((res["pause"].status, res["exec"].status))
        check_error(api.get(sid), 404, "not_found")
    leaks.assert_same(before, hutchd, timeout=10)
    assert hutchd.alive() and api.healthz().status == 200, outcomes


def test_pause_is_reliable_while_commands_spawn(api, hutchd, make_sandbox):
    """Processes forking and exec'ing (a shell starting `sleep`) while the
    freezer runs must not make pause fail: a cgroup v1 freezer can linger
    in FREEZING, and pause has to see it through (retry), not give up."""
    sb = make_sandbox()
    sid = sb["id"]
    stop = threading.Event()
    seen = {}

    def churn():
        while not stop.is_set():
            r = api.exec(sid, cmd="sleep 0.02; echo x", http_timeout=30)
            seen[r.status] = seen.get(r.status, 0) + 1
            if r.status != 200:
                time.sleep(0.01)

    threads = [threading.Thread(target=churn, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    failures = []
    try:
        for i in range(40):
            r = api.lifecycle(sid, "pause", wait=True, timeout=60)
            if r.status != 200:
                failures.append((i, r))
                hostutil.wait_until(lambda: api.state_of(sid) in ("running", "paused"), 10)
            if api.state_of(sid) == "paused":
                w = api.lifecycle(sid, "resume", wait=True, timeout=60)
                assert w.status == 200, w
            time.sleep(0.03)
    finally:
        stop.set()
        for t in threads:
            t.join(40)
    assert not any(t.is_alive() for t in threads), "exec calls hung"
    assert seen.get(200, 0) > 0, seen
    assert not failures, "%d of 40 pauses failed under exec churn; first: %r" % (len(failures), failures[0])
    assert api.state_of(sid) == "running"
    assert api.exec_ok(sid, argv=["echo", "ok"])["stdout"] == "ok\n"


def test_delete_of_a_paused_sandbox_leaks_nothing(api, hutchd, leaks):
    before = leaks.snapshot(hutchd)
    sb = api.create_ok()
    sid = sb["id"]
    api.start_command_ok(sid, argv=["sleep", "1000"])
    api.lifecycle_ok(sid, "pause")
    assert hostutil.sandbox_frozen(hutchd, sid) is True
    t0 = time.monotonic()
    api.delete_ok(sid)
    assert time.monotonic() - t0 < 30
    for what in ("init_pid", "shim_pid"):
        pid = sb["host"][what]
        assert not hostutil.proc_alive(pid), "%s %d still alive after delete: state %r, cmdline %r" % (
            what, pid, hostutil.proc_state(pid), hostutil.proc_cmdline(pid))
    leaks.assert_same(before, hutchd)


@pytest.mark.parametrize("state", ["stopped", "suspended"])
def test_delete_of_a_stopped_or_suspended_sandbox_leaks_nothing(api, hutchd, leaks, state):
    before = leaks.snapshot(hutchd)
    sb = api.create_ok()
    _to_state(api, sb["id"], state)
    api.delete_ok(sb["id"])
    leaks.assert_same(before, hutchd)


def test_states_listed_and_filterable(api, make_sandbox):
    """GET /v1/sandboxes?state= knows the new states."""
    sb = make_sandbox(labels={"t": "listing"})
    api.lifecycle_ok(sb["id"], "stop")
    r = api.list(labels=["t=listing"], state="stopped")
    assert r.status == 200 and [x["id"] for x in r.json["sandboxes"]] == [sb["id"]], r
    r = api.list(labels=["t=listing"], state="running")
    assert r.status == 200 and r.json["sandboxes"] == [], r
    assert api.get(sb["id"]).json["state"] not in TRANSITIONAL_STATES


def test_a_suspended_sandbox_does_not_expire(api):
    """docs/lifecycle.md: running, paused and stopped sandboxes expire; a
    suspended one is kept.  Positive control: the same timeout deletes a
    running sandbox."""
    control = api.create(wait=True, timeout_s=2)
    kept = api.create(wait=True, timeout_s=2)
    assert control.status == 201 and kept.status == 201, (control, kept)
    try:
        assert api.lifecycle_ok(kept.json["id"], "suspend")["state"] == "suspended"
        deadline = time.monotonic() + 15
        while api.get(control.json["id"]).status != 404 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert api.get(control.json["id"]).status == 404, "the running sandbox did not expire"
        time.sleep(1.5)  # well past the suspended one's deadline too
        assert api.get(kept.json["id"]).json["state"] == "suspended"
    finally:
        api.delete(kept.json["id"], wait=True)
        api.delete(control.json["id"], wait=True)
