"""hutchd restart survival (docs/lifecycle.md "Crash safety", "A shim that
dies"): `kill -9` hutchd while sandboxes run and a command streams; a new
hutchd on the same directories re-adopts every sandbox from its shim, the
command keeps running and its buffered output and exit codes are still
there, the database agrees with the host.  `kill -9` one shim: that sandbox
becomes `error` with a reason and its runtime resources go, files stay.  A
simulated host reboot: suspended and stopped sandboxes come back, a running
one is `error` with its files kept."""

import signal
import threading
import time

import hostutil
from hutch_client import LIFECYCLE_VERBS, check_error

STREAM = "i=0; while [ $i -lt 1200 ]; do echo tick-$i; i=$((i+1)); sleep 0.05; done"


def _write(c, sid, name, content):
    r = c.exec_ok(sid, cmd="printf %%s '%s' > /root/%s && sync" % (content, name))
    assert r["exit_code"] == 0, r


def _read(c, sid, name):
    r = c.exec_ok(sid, argv=["cat", "/root/" + name])
    assert r["exit_code"] == 0, r
    return r["stdout"]


def _host_file(d, sid, name):
    for p in hostutil.find_sandbox_file(d, sid, name):
        if p.endswith("/root/" + name):
            return hostutil.read_file(p)
    return None


def _restart(d):
    """Start hutchd again on the same directories (after kill or stop)."""
    assert not d.alive()
    d.start()
    assert d.client().healthz().status == 200
    return d.client()


def _ticks(data):
    return [int(x[5:]) for x in data.decode().split("\n") if x.startswith("tick-") and x[5:].isdigit()]


def _error_text(sb):
    e = sb.get("error")
    if isinstance(e, dict):
        return " ".join(str(v) for v in e.values())
    return str(e or "")


def test_kill9_hutchd_readopts_sandboxes_and_commands(start_hutchd):
    d = start_hutchd()
    c = d.client()
    a, b = c.create_ok(labels={"r": "a"}), c.create_ok(labels={"r": "b"})
    sa, sb = a["id"], b["id"]
    base = hostutil.snapshot_excluding(d, [sa, sb])
    _write(c, sa, "kept.txt", "aaa")
    _write(c, sb, "kept.txt", "bbb")
    stream = c.start_command_ok(sa, cmd=STREAM, tag="stream")
    finishing = c.start_command_ok(sb, cmd="sleep 1; echo finished; exit 3", tag="finishing")

    # A client attached to the streaming command when hutchd dies.
    att = {"ticks_before": None, "broke": None}
    ready = threading.Event()

    def attached():
        s = c.attach(sa, stream["id"], timeout=20)
        try:
            s.read_until(lambda r: len(_ticks(r.stdout)) >= 5, 15)
            ready.set()
            while True:
                if s.next_event(timeout=20) is None:
                    att["broke"] = "eof"
                    break
        except Exception as e:
            att["broke"] = repr(e)
        finally:
            att["result"] = s.result
            ready.set()
            s.close()

    th = threading.Thread(target=attached, daemon=True)
    th.start()
    assert ready.wait(20), "the attached client saw no output"
    assert d.kill(signal.SIGKILL) == -signal.SIGKILL
    th.join(25)
    assert not th.is_alive(), "the attach stream did not break when hutchd died"
    before_kill = _ticks(att["result"].stdout)
    assert before_kill and att["result"].exit is None, att
    time.sleep(2.0)  # `finishing` ends during the outage; the stream keeps ticking

    # The sandboxes live on without hutchd.
    for x in (a, b):
        assert hostutil.proc_alive(x["host"]["shim_pid"]) and hostutil.proc_alive(x["host"]["init_pid"])

    c = _restart(d)
    for x in (a, b):
        g = c.get(x["id"])
        assert g.status == 200 and g.json["state"] == "running", g
        assert g.json["host"]["shim_pid"] == x["host"]["shim_pid"], "not re-adopted (new shim): %r" % g
        assert g.json["host"]["init_pid"] == x["host"]["init_pid"], "not re-adopted (new init): %r" % g
    hostutil.assert_host_state(d, base, {sa: "running", sb: "running"})
    # The database agrees with the host.
    rows = hostutil.db_rows(d.data_dir)
    for x in (a, b):
        row = rows[x["id"]]
        assert row["state"] == "running", row
        assert row["shim_pid"] == x["host"]["shim_pid"] and hostutil.proc_alive(row["shim_pid"]), row
        assert row["init_pid"] == x["host"]["init_pid"] and hostutil.proc_alive(row["init_pid"]), row
    assert hostutil.db_unfinished_operations(d.data_dir) == []

    assert _read(c, sa, "kept.txt") == "aaa"
    assert _read(c, sb, "kept.txt") == "bbb"
    assert c.exec_ok(sa, argv=["echo", "after"])["stdout"] == "after\n"

    # The streaming command kept running; a new attach replays its buffer
    # from the first line and goes on with output made after the restart.
    g = c.command(sa, stream["id"])
    assert g.status == 200 and g.json["state"] == "running", g
    with c.attach(sa, stream["id"], timeout=20) as s2:
        assert s2.status == 200, s2.error_resp()
        last = max(before_kill)
        res = s2.read_until(lambda r: _ticks(r.stdout) and max(_ticks(r.stdout)) > last + 40, 20)
    t = _ticks(res.stdout)
    assert t[0] == 0 and t == list(range(len(t))), "replayed output is not the whole stream in order: %r…" % t[:20]

    # The command that finished while hutchd was down reports its exit code.
    g = c.command(sb, finishing["id"])
    assert g.status == 200 and g.json["state"] == "exited" and g.json["exit_code"] == 3, g
    res = c.attach_all(sb, finishing["id"], timeout=20)
    assert res.stdout == b"finished\n" and res.exit and res.exit["exit_code"] == 3, res

    assert c.command_signal(sa, stream["id"], "KILL").status == 200
    for x in (sa, sb):
        c.delete_ok(x)
    hostutil.assert_host_state(d, base, {sa: "gone", sb: "gone"})


def test_kill9_hutchd_keeps_paused_stopped_suspended(start_hutchd):
    d = start_hutchd()
    c = d.client()
    want = {"paused": "pause", "stopped": "stop", "suspended": "suspend"}
    sbs = {}
    for st, verb in want.items():
        x = c.create_ok(labels={"keep": st})
        _write(c, x["id"], "kept.txt", st)
        c.lifecycle_ok(x["id"], verb)
        sbs[st] = x
    ids = [x["id"] for x in sbs.values()]
    base = hostutil.snapshot_excluding(d, ids)
    d.kill(signal.SIGKILL)
    c = _restart(d)
    hostutil.assert_host_state(d, base, {x["id"]: st for st, x in sbs.items()})
    p = c.get(sbs["paused"]["id"]).json
    assert p["host"]["init_pid"] == sbs["paused"]["host"]["init_pid"], "paused sandbox not re-adopted: %r" % p
    for st, x in sbs.items():
        c.lifecycle_ok(x["id"], "wake")
        assert _read(c, x["id"], "kept.txt") == st
    hostutil.assert_host_state(d, base, {i: "running" for i in ids})
    for i in ids:
        c.delete_ok(i)
    hostutil.assert_host_state(d, base, {i: "gone" for i in ids})


def test_kill9_shim_makes_error_and_releases_runtime_resources(start_hutchd):
    d = start_hutchd()
    c = d.client()
    a, b = c.create_ok(labels={"s": "victim"}), c.create_ok(labels={"s": "bystander"})
    sa, sb = a["id"], b["id"]
    base = hostutil.snapshot_excluding(d, [sa, sb])
    _write(c, sa, "kept.txt", "victim-work")
    c.start_command_ok(sa, argv=["sleep", "1000"])
    hostutil.kill_pid(a["host"]["shim_pid"], signal.SIGKILL)

    e = c.wait_state(sa, ("error",), timeout=10)
    assert "shim" in _error_text(e).lower(), "the error reason should mention the shim: %r" % e
    hostutil.assert_host_state(d, base, {sa: "error", sb: "running"}, timeout=10)
    assert not hostutil.proc_alive(a["host"]["init_pid"]), "the sandbox's processes outlived its shim"
    assert _host_file(d, sa, "kept.txt") == "victim-work", "an error sandbox keeps its files"

    # The bystander is untouched.
    g = c.get(sb).json
    assert g["state"] == "running" and g["host"] == b["host"], g
    assert c.exec_ok(sb, argv=["echo", "fine"])["stdout"] == "fine\n"

    # `error` fits no verb (docs/api.md: any other combination is 409).
    for verb in LIFECYCLE_VERBS:
        check_error(c.lifecycle(sa, verb, timeout=30), 409, "conflict", "error")
    check_error(c.exec(sa, argv=["true"]), 409, "conflict", "error")
    assert c.get(sa).json["state"] == "error"

    c.delete_ok(sa)
    hostutil.assert_host_state(d, base, {sa: "gone", sb: "running"})
    c.delete_ok(sb)
    hostutil.assert_host_state(d, base, {sa: "gone", sb: "gone"})


def test_shim_gone_while_hutchd_was_down_is_error_at_start(start_hutchd):
    """Reconciliation table: running, shim does not answer -> error."""
    d = start_hutchd()
    c = d.client()
    a = c.create_ok()
    sa = a["id"]
    base = hostutil.snapshot_excluding(d, [sa])
    _write(c, sa, "kept.txt", "x")
    d.kill(signal.SIGKILL)
    hostutil.kill_pid(a["host"]["shim_pid"], signal.SIGKILL)
    hostutil.kill_pid(a["host"]["init_pid"], signal.SIGKILL)
    assert hostutil.wait_until(lambda: not hostutil.proc_alive(a["host"]["shim_pid"]), 5)
    c = _restart(d)
    e = c.wait_state(sa, ("error",), timeout=10)
    assert "shim" in _error_text(e).lower(), e
    hostutil.assert_host_state(d, base, {sa: "error"}, timeout=10)
    assert _host_file(d, sa, "kept.txt") == "x"
    c.delete_ok(sa)
    hostutil.assert_host_state(d, base, {sa: "gone"})


def test_simulated_host_reboot(start_hutchd):
    d = start_hutchd()
    c = d.client()
    sus, stp, run = (c.create_ok(labels={"boot": n}) for n in ("suspended", "stopped", "running"))
    ids = {"suspended": sus["id"], "stopped": stp["id"], "running": run["id"]}
    for st, sid in ids.items():
        _write(c, sid, "kept.txt", "boot-" + st)
    c.lifecycle_ok(ids["suspended"], "suspend")
    c.lifecycle_ok(ids["stopped"], "stop")
    base = hostutil.snapshot_excluding(d, ids.values())

    # Reboot: hutchd stops, every process of the instance ends, /run is
    # emptied (shim sockets, uid claims), cgroups are gone; the data stays.
    d.expect_exit = True
    assert d.stop() == []
    hostutil.simulate_host_reboot(d)
    assert hostutil.uid_claims(d.data_dir) == []
    c = _restart(d)

    # The suspended sandbox restores with its file.
    assert c.get(ids["suspended"]).json["state"] == "suspended"
    r = c.lifecycle_ok(ids["suspended"], "restore")
    assert hostutil.proc_alive(r["host"]["init_pid"])
    assert _read(c, ids["suspended"], "kept.txt") == "boot-suspended"

    # The stopped one survives a reboot too (docs/lifecycle.md table).
    assert c.get(ids["stopped"]).json["state"] == "stopped"
    c.lifecycle_ok(ids["stopped"], "start")
    assert _read(c, ids["stopped"], "kept.txt") == "boot-stopped"

    # The running one lost its processes: error, files kept.
    e = c.wait_state(ids["running"], ("error",), timeout=10)
    assert "shim" in _error_text(e).lower(), e
    assert _host_file(d, ids["running"], "kept.txt") == "boot-running"

    hostutil.assert_host_state(d, base, {ids["suspended"]: "running", ids["stopped"]: "running",
                                         ids["running"]: "error"})
    for sid in ids.values():
        c.delete_ok(sid)
    hostutil.assert_host_state(d, base, {sid: "gone" for sid in ids.values()})


def test_simulated_host_reboot_stopped_keeps_state_before_start(start_hutchd):
    """After a reboot a stopped sandbox is still `stopped` and holds what
    docs/lifecycle.md says a stopped sandbox holds (its uid range claimed
    again) before anyone starts it."""
    d = start_hutchd()
    c = d.client()
    x = c.create_ok()
    sid = x["id"]
    c.lifecycle_ok(sid, "stop")
    base = hostutil.snapshot_excluding(d, [sid])
    d.expect_exit = True
    assert d.stop() == []
    hostutil.simulate_host_reboot(d)
    c = _restart(d)
    hostutil.assert_host_state(d, base, {sid: "stopped"})
    c.delete_ok(sid)
    hostutil.assert_host_state(d, base, {sid: "gone"})
