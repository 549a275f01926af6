"""The gvisor runtime keeps memory (docs/lifecycle.md, docs/storage.md):
suspend/restore continue the processes, fork copies them, full snapshots
hold memory and files, and rollback to one brings its processes back.
Skipped only where runsc is absent (HUTCH_MUST_WORK=1 makes that a failure)."""

import shutil
import time

import pytest

import hostutil

pytestmark = pytest.mark.skipif(shutil.which("runsc") is None and not hostutil.must_work(),
                                reason="runsc (gVisor) is not installed")

# A process that holds state only in memory: a counter it advances on
# request, an open file it keeps writing, and a listening socket on
# loopback.  `ask` talks to it.
SERVER = r"""
import os, socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 7777)); s.listen(8)
f = open("/tmp/log", "a")
n = 0
while True:
    c, _ = s.accept()
    cmd = c.recv(100).decode().strip()
    if cmd.startswith("add"):
        n += int(cmd.split()[1])
    f.write("%d\n" % n); f.flush()
    c.sendall(b"%d pid=%d\n" % (n, os.getpid())); c.close()
"""
ASK = ("import socket,sys; c=socket.create_connection(('127.0.0.1',7777),timeout=10); "
       "c.sendall(sys.argv[1].encode()); print(c.recv(100).decode().strip())")


def start_server(api, sid):
    r = api.request("POST", "/v1/sandboxes/%s/commands" % sid, {"argv": ["python3", "-c", SERVER]})
    assert r.status in (200, 201), r
    ok = hostutil.wait_until(lambda: api.exec(sid, argv=["python3", "-c", ASK, "get"]).json.get("exit_code") == 0,
                             60, interval=0.3, what="the server listens")
    assert ok


def ask(api, sid, cmd):
    r = api.exec(sid, argv=["python3", "-c", ASK, cmd], timeout_s=60)
    assert r.status == 200 and r.json["exit_code"] == 0, r
    n, pid = r.json["stdout"].split()
    return int(n), pid


def lifecycle(api, sid, verb, status=200):
    r = api.request("POST", "/v1/sandboxes/%s/%s?wait=true" % (sid, verb), None, timeout=300)
    assert r.status == status, r
    return r.json


@pytest.fixture
def gsb(make_sandbox):
    return make_sandbox(runtime="gvisor", template="host", resources={"memory_mib": 1024})


# runsc 20221219 (Debian's) on the ptrace platform sometimes loses its
# Sentry during `runsc checkpoint` ("urpc method containerManager.Checkpoint
# failed: EOF"; about 1 in 10, not seen with --debug).  hutch reports it as
# a failed operation (docs/lifecycle.md).  A scenario that hits it is run
# again on a fresh sandbox, at most twice more; any other failure fails.
RUNSC_FLAKE = "containerManager.Checkpoint"


def with_retries(make_sandbox, scenario, **fields):
    fields = dict(dict(runtime="gvisor", template="host", resources={"memory_mib": 1024}), **fields)
    for attempt in range(3):
        sb = make_sandbox(**fields)
        try:
            return scenario(sb)
        except AssertionError as e:
            if RUNSC_FLAKE not in str(e) or "EOF" not in str(e) or attempt == 2:
                raise
            print("runsc checkpoint flake (attempt %d): retrying on a fresh sandbox" % (attempt + 1))


def test_capabilities_say_what_each_runtime_keeps(api, gsb, make_sandbox):
    r = api.request("GET", "/v1/runtimes")
    assert r.status == 200, r
    rts = {x["name"]: x for x in r.json["runtimes"]}
    assert rts["native"]["capabilities"]["memory_checkpoint"] is False
    assert rts["gvisor"]["capabilities"] == {"pause": True, "memory_checkpoint": True, "fork_memory": True}
    assert gsb["capabilities"]["memory_checkpoint"] is True
    nat = make_sandbox(runtime="native", template="busybox")
    assert nat["capabilities"]["memory_checkpoint"] is False


def test_suspend_restore_keeps_running_processes(api, make_sandbox):
    with_retries(make_sandbox, lambda sb: _suspend_restore(api, sb))


def _suspend_restore(api, gsb):
    sid = gsb["id"]
    start_server(api, sid)
    n, pid = ask(api, sid, "add 5")
    assert n == 5
    s = lifecycle(api, sid, "suspend")
    assert s["state"] == "suspended" and s["checkpoint"], s
    snap = api.request("GET", "/v1/snapshots/" + s["checkpoint"]).json
    assert snap["kind"] == "full" and snap["memory"] is True and snap["state"] == "ready", snap
    t0 = time.monotonic()
    s = lifecycle(api, sid, "restore")
    assert s["state"] == "running" and s["checkpoint"] is None, s
    n2, pid2 = ask(api, sid, "add 2")
    assert (n2, pid2) == (7, pid), "the counter and the process continued"
    assert api.exec_ok(sid, cmd="tail -1 /tmp/log")["stdout"] == "7\n"  # its open file too
    assert time.monotonic() - t0 < 120


def test_native_suspend_keeps_files_only(api, make_sandbox):
    sb = make_sandbox(runtime="native", template="busybox")
    api.exec_ok(sb["id"], cmd="echo kept > /root/f")
    s = lifecycle(api, sb["id"], "suspend")
    assert s["checkpoint"] is None
    lifecycle(api, sb["id"], "restore")
    assert api.exec_ok(sb["id"], cmd="cat /root/f")["stdout"] == "kept\n"


def test_fork_with_memory_diverges(api, make_sandbox):
    with_retries(make_sandbox, lambda sb: _fork(api, sb))


def _fork(api, gsb):
    sid = gsb["id"]
    start_server(api, sid)
    ask(api, sid, "add 10")
    r = api.request("POST", "/v1/sandboxes/%s/fork?wait=true" % sid, {"count": 2}, timeout=600)
    assert r.status == 201, r
    a, b = [x["id"] for x in r.json["sandboxes"]]
    try:
        assert api.request("GET", "/v1/snapshots/" + r.json["snapshot"]).json["kind"] == "full"
        assert ask(api, a, "add 1")[0] == 11
        assert ask(api, b, "add 100")[0] == 110
        assert ask(api, a, "get")[0] == 11  # independent copies
        assert ask(api, sid, "get")[0] == 10  # the parent continued too
    finally:
        api.delete(a)
        api.delete(b)


def test_full_snapshot_and_rollback_restore_processes(api, make_sandbox):
    with_retries(make_sandbox, lambda sb: _full_and_rollback(api, sb))


def _full_and_rollback(api, gsb):
    sid = gsb["id"]
    start_server(api, sid)
    ask(api, sid, "add 3")
    api.exec_ok(sid, cmd="echo before > /root/f")
    r = api.request("POST", "/v1/sandboxes/%s/snapshots" % sid, {"kind": "full"}, timeout=300)
    assert r.status == 201 and r.json["kind"] == "full" and r.json["memory"] is True, r
    snap = r.json["id"]
    ask(api, sid, "add 40")
    api.exec_ok(sid, cmd="echo after > /root/f")
    lifecycle(api, sid, "pause")
    r = api.request("POST", "/v1/sandboxes/%s/rollback?wait=true" % sid, {"snapshot": snap}, timeout=300)
    assert r.status == 200 and r.json["state"] == "running", r
    assert ask(api, sid, "get")[0] == 3
    assert api.exec_ok(sid, cmd="cat /root/f")["stdout"] == "before\n"


def test_full_snapshot_refused_on_native(api, make_sandbox):
    sb = make_sandbox(runtime="native", template="busybox")
    r = api.request("POST", "/v1/sandboxes/%s/snapshots" % sb["id"], {"kind": "full"})
    assert r.status == 409 and "memory" in r.json["error"]["message"], r
    r = api.request("POST", "/v1/sandboxes/%s/snapshots" % sb["id"], {"kind": "everything"})
    assert r.status == 400, r


def test_full_snapshots_have_their_own_retention_tier(api, make_sandbox):
    with_retries(make_sandbox, lambda sb: _retention(api, sb), template="busybox", snapshots={"keep_full": 2})


def _retention(api, sb):
    sid = sb["id"]
    ids = []
    for i in range(3):
        api.exec_ok(sid, cmd="echo %d > /root/f" % i)
        r = api.request("POST", "/v1/sandboxes/%s/snapshots" % sid, {"kind": "full"}, timeout=300)
        assert r.status == 201, r
        ids.append(r.json["id"])
    files = api.request("POST", "/v1/sandboxes/%s/snapshots" % sid, {}).json["id"]
    full = [s["id"] for s in api.request("GET", "/v1/snapshots?sandbox=%s&kind=full" % sid).json["snapshots"]]
    assert full == ids[1:], (full, ids)  # the oldest full one retired
    assert api.request("GET", "/v1/snapshots/" + files).status == 200  # files-only snapshots are another tier
