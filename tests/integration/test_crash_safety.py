"""Crash-safe operations (docs/lifecycle.md "Crash safety"): for every
fault point `hutchd --fault-points` lists (except `shim.*`, which fire
inside hutch-shim and only fail):

- abort form (`HUTCH_FAULT=<point>:abort`): the sandbox is prepared by a
  daemon without the fault, hutchd is restarted with the fault on the same
  directories, the operation is triggered and hutchd must die of SIGABRT;
  a daemon without the fault then reconciles: the sandbox is gone (create,
  delete) or in a stable state the operation could have left it in (never
  a transitional one, never `error`), the host holds exactly what that
  state holds, nothing else leaked, no operation is left pending/running,
  files written before are still there, and the sandbox can still be
  woken, used and deleted, leaving nothing;
- failure form (`HUTCH_FAULT=<point>`): the operation fails with a 5xx
  naming the point and the sandbox stays in a consistent state (the same
  checks, with `error` allowed as docs/lifecycle.md's "any step failing").

Each case is lean: hutchd starts in ~0.1 s and the preparation is one
create plus at most one verb."""

import resource
import signal
import subprocess
import time

import pytest

import daemon as daemon_mod
import hostutil
from hutch_client import TRANSITIONAL_STATES

OPERATIONS = ("create", "delete", "pause", "resume", "stop", "start", "suspend", "restore", "snapshot", "rollback")
# The state each operation needs, and the verb that gets a running sandbox there.
NEEDS = {"create": None, "delete": "running", "pause": "running", "resume": "paused",
         "stop": "running", "start": "stopped", "suspend": "running", "restore": "suspended",
         "snapshot": "running", "rollback": "paused"}
PREPARE = {"paused": "pause", "stopped": "stop", "suspended": "suspend"}
TARGET = {"create": "running", "delete": "gone", "pause": "paused", "resume": "running",
          "stop": "stopped", "start": "running", "suspend": "suspended", "restore": "running",
          "snapshot": "running", "rollback": "running"}
# After a crash and reconciliation (docs/lifecycle.md table): rolled back
# to where it was, or forward to where it was going; create and delete
# always end with the sandbox gone.
AFTER_CRASH = {op: {NEEDS[op], TARGET[op]} for op in OPERATIONS}
AFTER_CRASH["create"] = {"gone"}
AFTER_CRASH["delete"] = {"gone"}
# A rollback interrupted after the processes ended leaves the sandbox stopped.
AFTER_CRASH["rollback"] = {"paused", "running", "stopped"}
SNAPSHOT_OF = {}  # sid -> the snapshot a rollback case goes back to


def _fault_points():
    try:
        p = subprocess.run([daemon_mod.binary("hutchd"), "--fault-points"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, "hutchd --fault-points: %r" % (e,)
    out = p.stdout.decode("utf-8", "replace")
    if p.returncode != 0:
        return None, "hutchd --fault-points exited %d: %s" % (p.returncode, out.strip()[:500])
    pts = [l.strip() for l in out.splitlines() if l.strip()]
    return pts, None


_POINTS, _POINTS_ERR = _fault_points()
CASES = [p for p in (_POINTS or []) if not p.startswith("shim.")] or ["(no fault points)"]


@pytest.fixture(scope="module", autouse=True)
def _no_core_dumps():
    """hutchd aborts on purpose here: no core files (RLIMIT_CORE is inherited)."""
    old = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (0, old[1]))
    yield
    resource.setrlimit(resource.RLIMIT_CORE, old)


def test_fault_points_are_listed():
    assert _POINTS is not None, _POINTS_ERR
    assert _POINTS, "hutchd --fault-points printed nothing"
    bad = [p for p in _POINTS if p.count(".") < 1 or p.split(".")[0] not in OPERATIONS + ("shim",)]
    assert not bad, "fault points must be <operation>.<step> for a known operation: %r" % bad
    assert len(set(_POINTS)) == len(_POINTS), "duplicate fault points: %r" % _POINTS
    ops = {p.split(".")[0] for p in _POINTS}
    # Every multi-step operation of the issue has points to crash at.
    for op in ("create", "delete", "suspend", "restore"):
        assert op in ops, "no fault point for %s: %r" % (op, _POINTS)


def _op_of(point):
    if point == "(no fault points)":
        pytest.fail("no fault points: %s" % (_POINTS_ERR or "hutchd --fault-points listed none"))
    op = point.split(".")[0]
    if op not in OPERATIONS:
        pytest.fail("fault point %r: unknown operation %r (the test knows %r)" % (point, op, OPERATIONS))
    return op


def _write(c, sid, content):
    r = c.exec_ok(sid, cmd="printf %%s '%s' > /root/kept.txt && sync" % content)
    assert r["exit_code"] == 0, r


def _host_file(d, sid):
    for p in hostutil.find_sandbox_file(d, sid, "kept.txt"):
        if p.endswith("/root/kept.txt"):
            return hostutil.read_file(p)
    return None


def _prepare(d, op, point):
    """With a fault-free daemon: a sandbox in the state `op` needs, holding
    a file.  Returns (sid or None, content, base snapshot)."""
    c = d.client()
    if op == "create":
        return None, None, hostutil.snapshot_excluding(d, [])
    sb = c.create_ok(labels={"crash": point})
    sid = sb["id"]
    content = "kept-" + point
    _write(c, sid, content)
    if op == "rollback":
        r = c.request("POST", "/v1/sandboxes/%s/snapshots" % sid, {})
        assert r.status == 201, r
        SNAPSHOT_OF[sid] = r.json["id"]
    need = NEEDS[op]
    if need != "running":
        c.lifecycle_ok(sid, PREPARE[need])
    base = hostutil.snapshot_excluding(d, [sid])
    hostutil.assert_host_state(d, base, {sid: need})
    return sid, content, base


def _restart_with(d, env):
    if d.alive():
        d.expect_exit = True
        problems = d.stop()
        assert problems == [], problems
    d.env = dict(env)
    d.start()


def _trigger(c, op, sid, wait):
    """Start `op`; returns the Resp, or the exception if the connection broke."""
    try:
        if op == "create":
            return c.create(wait=wait, labels={"crash": "create"}, timeout=60)
        if op == "delete":
            return c.delete(sid, wait=wait, timeout=60)
        if op == "snapshot":
            return c.request("POST", "/v1/sandboxes/%s/snapshots?wait=%s" % (sid, "true" if wait else "false"), {},
                             timeout=60)
        if op == "rollback":
            return c.request("POST", "/v1/sandboxes/%s/rollback%s" % (sid, "?wait=true" if wait else ""),
                             {"snapshot": SNAPSHOT_OF[sid]}, timeout=60)
        return c.lifecycle(sid, op, wait=wait, timeout=60)
    except Exception as e:  # hutchd died under the request
        return e


def _new_sandboxes(d, base_ids):
    rows = hostutil.db_rows(d.data_dir)
    return sorted(set(rows) - set(base_ids))


def _check_and_drive(d, sid, state, content, base, deleting=False):
    """The sandbox is in `state`: the host matches it, its file is there, it
    can be woken, used and deleted, and then nothing is left.  `deleting`:
    a delete failed half-way, so the files may already be gone."""
    c = d.client()
    hostutil.assert_host_state(d, base, {sid: state}, timeout=5,
                               files_optional=[sid] if deleting and state == "error" else ())
    assert hostutil.db_unfinished_operations(d.data_dir) == [], "operations left unfinished"
    if state == "gone":
        return
    if not (deleting and state == "error"):
        assert _host_file(d, sid) == content, "the file written before the operation is lost"
    if state == "error":
        g = c.get(sid).json
        assert g.get("error"), "an error sandbox must carry a reason: %r" % g
    else:
        if state != "running":
            c.lifecycle_ok(sid, "wake")
        r = c.exec_ok(sid, argv=["cat", "/root/kept.txt"])
        assert r["stdout"] == content, r
        hostutil.assert_host_state(d, base, {sid: "running"})
    c.delete_ok(sid)
    hostutil.assert_host_state(d, base, {sid: "gone"})


@pytest.fixture
def fault_free_at_end():
    """Daemons registered here are restarted without HUTCH_FAULT when the
    test ends with the fault still set, so that teardown's deletes work."""
    ds = []
    yield ds.append
    for d in ds:
        if d.env.get("HUTCH_FAULT"):
            d.expect_exit = True
            if d.alive():
                d.stop()
            d.env = {}
            d.start()


@pytest.mark.parametrize("point", CASES)
def test_crash_at_point_is_reconciled(start_hutchd, fault_free_at_end, point):
    op = _op_of(point)
    d = start_hutchd()
    fault_free_at_end(d)
    sid, content, base = _prepare(d, op, point)
    _restart_with(d, {"HUTCH_FAULT": point + ":abort"})
    c = d.client()
    d.expect_exit = True
    t0 = time.monotonic()
    r = _trigger(c, op, sid, wait=False)
    oid = None
    if not isinstance(r, Exception):
        assert r.status == 202, "%s under HUTCH_FAULT=%s:abort: %r" % (op, point, r)
        oid = r.json["operation"]["id"]
        if op == "create":
            sid = r.json["id"]
    try:
        rc = d.proc.wait(15)
    except subprocess.TimeoutExpired:
        pytest.fail("HUTCH_FAULT=%s:abort: hutchd did not abort within 15 s of the %s (point never "
                    "reached?); last answer %r" % (point, op, r))
    assert rc == -signal.SIGABRT, "hutchd exited with %r, expected SIGABRT at %s" % (rc, point)
    crash_s = time.monotonic() - t0

    _restart_with(d, {})
    c = d.client()
    if sid is None:  # create: the 202 was lost with hutchd
        new = _new_sandboxes(d, [])
        assert len(new) <= 1, new
        sid = new[0] if new else "sb_none"
    state = c.wait_stable(sid, timeout=10)
    print("crash at %s: reconciled to %s" % (point, state))
    assert state not in TRANSITIONAL_STATES
    assert state in AFTER_CRASH[op], \
        "after a crash at %s and reconciliation the sandbox is %r, expected one of %r" % (
            point, state, sorted(AFTER_CRASH[op]))
    if oid:
        o = c.operation(oid)
        assert o.status == 200, o
        assert o.json["state"] == "failed" and o.json["error"], \
            "an operation interrupted by a crash is marked failed with a reason: %r" % o
    listed = [x["id"] for x in c.list().json["sandboxes"]]
    assert listed == ([] if state == "gone" else [sid]), listed
    _check_and_drive(d, sid, state, content, base)
    assert crash_s < 15


@pytest.mark.parametrize("point", CASES)
def test_failure_at_point_is_5xx_and_consistent(start_hutchd, fault_free_at_end, point):
    op = _op_of(point)
    d = start_hutchd()
    fault_free_at_end(d)
    sid, content, base = _prepare(d, op, point)
    _restart_with(d, {"HUTCH_FAULT": point})
    c = d.client()
    r = _trigger(c, op, sid, wait=True)
    assert not isinstance(r, Exception), "HUTCH_FAULT=%s (failure form) broke the request: %r" % (point, r)
    assert 500 <= r.status < 600, "%s with HUTCH_FAULT=%s: expected a 5xx, got %r" % (op, point, r)
    err = (r.json or {}).get("error") or {}
    assert isinstance(err.get("code"), str) and err["code"], r
    assert point in (err.get("message") or ""), "the error should name the failed step %s: %r" % (point, r)
    assert d.alive(), "a failure (not :abort) must not kill hutchd"
    if op == "create":
        # The failed create left nothing (docs/api.md): no row, no resources.
        new = _new_sandboxes(d, [])
        assert new == [], "a failed create left rows: %r" % new
        hostutil.assert_host_state(d, base, {}, timeout=10)
        _restart_with(d, {})
        hostutil.assert_host_state(d, base, {}, timeout=10)
        return
    # Where it was, where it was going, or `error` ("any step failing").
    allowed = {NEEDS[op], TARGET[op], "error"} | (AFTER_CRASH[op] if op == "rollback" else set())
    state = c.wait_stable(sid, timeout=10)
    print("failure at %s: %s" % (point, state))
    assert state in allowed, "after %s failed at %s the sandbox is %r, expected one of %r" % (
        op, point, state, sorted(allowed))
    deleting = op == "delete"
    hostutil.assert_host_state(d, base, {sid: state}, timeout=5,
                               files_optional=[sid] if deleting and state == "error" else ())
    # A daemon without the fault agrees, and can drive the sandbox.
    _restart_with(d, {})
    state2 = d.client().wait_stable(sid, timeout=10)
    assert state2 == state, "a restart changed the state of a consistent sandbox: %r -> %r" % (state, state2)
    _check_and_drive(d, sid, state, content, base, deleting=deleting)


def test_crash_while_two_sandboxes_exist_touches_only_one(start_hutchd, fault_free_at_end):
    """A crash in one sandbox's operation leaves a neighbour untouched
    (same shim, same init, still running, its file intact)."""
    pts = [p for p in (_POINTS or []) if p.startswith("suspend.")]
    if not pts:
        pytest.fail("no suspend.* fault point: %r" % (_POINTS_ERR or _POINTS))
    point = pts[len(pts) // 2]
    d = start_hutchd()
    fault_free_at_end(d)
    c = d.client()
    other = c.create_ok(labels={"crash": "neighbour"})
    _write(c, other["id"], "neighbour")
    sid, content, base = _prepare(d, "suspend", point)
    base = hostutil.snapshot_excluding(d, [sid, other["id"]])
    _restart_with(d, {"HUTCH_FAULT": point + ":abort"})
    d.expect_exit = True
    _trigger(d.client(), "suspend", sid, wait=False)
    try:
        assert d.proc.wait(15) == -signal.SIGABRT
    except subprocess.TimeoutExpired:
        pytest.fail("hutchd did not abort at %s" % point)
    _restart_with(d, {})
    c = d.client()
    state = c.wait_stable(sid, timeout=10)
    assert state in AFTER_CRASH["suspend"], state
    hostutil.assert_host_state(d, base, {sid: state, other["id"]: "running"}, timeout=10)
    g = c.get(other["id"]).json
    assert g["host"] == other["host"], "the neighbour was not re-adopted as it was: %r vs %r" % (g, other)
    assert c.exec_ok(other["id"], argv=["cat", "/root/kept.txt"])["stdout"] == "neighbour"
    c.delete_ok(other["id"])
    _check_and_drive(d, sid, state, content, base)
