"""Commands (docs/api.md "Commands"): start (argv or cmd, env, cwd, user,
tag, timeout), the 201 shape, attach (NDJSON, base64, binary-safe, exit
last, late attach from the ring with `dropped`, several clients, replay=false,
unknown ids), stdin (streamed, close), signal, resize (PTY), wait, list/get,
background commands, timeouts that kill the whole process group, bad bodies,
and attach tokens over TCP (scoped to one command, tamper-proof, expiring)."""

import calendar
import hashlib
import http.client
import os
import re
import socket
import time

import pytest

import hostutil
from daemon import finish_or_fail, start_or_fail
from hutch_client import check_error

RFC3339_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def _epoch(ts):
    assert RFC3339_MS.match(ts), ts
    return calendar.timegm(time.strptime(ts[:19], "%Y-%m-%dT%H:%M:%S")) + int(ts[20:23]) / 1000.0


def run(api, sid, argv=None, cmd=None, timeout=60, **fields):
    """Start a command, attach, read to the end: (201 body, AttachResult)."""
    started = api.start_command_ok(sid, argv=argv, cmd=cmd, **fields)
    return started, api.attach_all(sid, started["id"], timeout=timeout)


def sandbox_procs(hutchd, sid):
    """{pid: argv} of the processes in the sandbox's cgroup (host view)."""
    cg = hostutil.sandbox_cgroup_dir(hutchd.instance, sid, "pids", hutchd.health["cgroup"])
    out = {}
    for p in hostutil.cgroup_procs(cg):
        argv = hostutil.proc_cmdline(p)
        if argv is not None and hostutil.proc_alive(p):
            out[p] = argv
    return out


def procs_with(hutchd, sid, argv):
    return [p for p, a in sandbox_procs(hutchd, sid).items() if a == list(argv)]


def kill_quietly(api, sid, cid):
    api.command_signal(sid, cid, "KILL")
    api.command_wait(sid, cid, timeout_s=10)


# -- start: the 201 shape, argv and cmd, env, cwd, user, tag ------------------


def test_start_returns_id_pid_and_attach_token(api, sandbox):
    t0 = time.time()
    r = api.start_command(sandbox["id"], argv=["echo", "hi"], tag="shape")
    assert r.status == 201, r
    b = r.json
    assert set(b) == {"id", "pid", "tag", "attach_token", "attach_token_expires_at"}, b
    assert re.fullmatch(r"cmd_[a-z0-9]{8,}", b["id"]), b
    assert isinstance(b["pid"], int) and b["pid"] > 1, b  # pid inside: hutch-init is 1
    assert b["tag"] == "shape", b
    assert isinstance(b["attach_token"], str) and len(b["attach_token"]) >= 32, b
    # Default TTL 900 s.
    exp = _epoch(b["attach_token_expires_at"])
    assert t0 + 890 <= exp <= time.time() + 910, (t0, b)
    res = api.attach_all(sandbox["id"], b["id"])
    assert res.stdout == b"hi\n" and res.exit["exit_code"] == 0, res


def test_argv_is_not_shell_interpreted_and_cmd_is(api, sandbox):
    _, res = run(api, sandbox["id"], argv=["echo", "$HOME", "a;b", "*"])
    assert res.stdout == b"$HOME a;b *\n", res
    _, res = run(api, sandbox["id"], cmd="echo hello | tr a-z A-Z; echo $HOME; exit 4")
    assert res.stdout == b"HELLO\n/root\n", res
    assert res.exit == {"type": "exit", "exit_code": 4, "signal": None, "timed_out": False}, res


def test_env_and_cwd(api, sandbox):
    _, res = run(api, sandbox["id"], argv=["sh", "-c", 'echo "$FOO|$BAR"; pwd'],
                 env={"FOO": "bar", "BAR": "a b=c"}, cwd="/tmp")
    assert res.stdout == b"bar|a b=c\n/tmp\n", res
    _, res = run(api, sandbox["id"], argv=["pwd"])
    assert res.stdout == b"/root\n", res  # the documented default
    _, res = run(api, sandbox["id"], argv=["sh", "-c", 'echo "[$FOO]"'])
    assert res.stdout == b"[]\n", "env leaked into a later command: %r" % (res,)


def test_user_user_is_uid_1000(api, sandbox):
    # Explicit cwd: the uid switch itself.
    _, res = run(api, sandbox["id"], cmd="id -u; id -g; echo $HOME", user="user", cwd="/tmp")
    assert res.stdout == b"1000\n1000\n/home/user\n", res
    _, res = run(api, sandbox["id"], cmd="id -u; id -g", uid=1234, gid=4321, cwd="/tmp")
    assert res.stdout == b"1234\n4321\n", res
    _, res = run(api, sandbox["id"], cmd="id -u", user="root")
    assert res.stdout == b"0\n", res


def test_tag_is_kept(api, sandbox):
    s, res = run(api, sandbox["id"], argv=["true"], tag="x" * 64)
    assert s["tag"] == "x" * 64
    g = api.command(sandbox["id"], s["id"])
    assert g.status == 200 and g.json["tag"] == "x" * 64, g
    s, _ = run(api, sandbox["id"], argv=["true"])
    assert s["tag"] is None, s


# -- requests that take start's failure paths: each test on a daemon of its
# own, so that a crash there fails that test and not every test after it.


@pytest.fixture
def own_sb(start_hutchd):
    """(daemon, client, sandbox) on a daemon of this test's own."""
    d = start_hutchd()
    c = d.client()
    return d, c, c.create_ok()


def _call(d, fn, *a, **kw):
    try:
        return fn(*a, **kw)
    except OSError as e:
        pytest.fail("hutchd dropped the connection (%r); it is %s" % (
            e, "alive" if d.alive() else "dead (status %r)" % d.proc.poll()))


def test_start_in_unknown_sandbox_is_404(own_sb):
    d, c, _ = own_sb
    check_error(_call(d, c.start_command, "sb_doesnotexist000000", argv=["true"]), 404, "not_found")
    assert d.alive()


def test_user_user_without_cwd_starts(own_sb):
    """`{"user":"user"}` alone must start: the default cwd (/root, mode
    0700) is not the place for uid 1000; the user's home is."""
    d, c, sb = own_sb
    r = _call(d, c.start_command, sb["id"], cmd="id -u; pwd", user="user")
    assert r.status == 201, "user \"user\" without cwd: %r" % (r,)
    res = c.attach_all(sb["id"], r.json["id"])
    assert res.stdout.split(b"\n")[0] == b"1000", res
    assert res.exit["exit_code"] == 0, res


BAD_BODIES = [
    ({}, "argv"),
    ({"argv": ["ls"], "cmd": "ls"}, "argv"),
    ({"argv": "ls"}, "argv"),
    ({"argv": []}, "argv"),
    ({"argv": ["ls", 1]}, "argv"),
    ({"cmd": ""}, "cmd"),
    ({"cmd": 5}, "cmd"),
    ({"argv": ["ls"], "bogus": 1}, "bogus"),
    ({"argv": ["ls"], "timeout_s": -1}, "timeout_s"),
    ({"argv": ["ls"], "timeout_s": 7 * 24 * 3600 + 1}, "timeout_s"),
    ({"argv": ["ls"], "timeout_s": "10"}, "timeout_s"),
    ({"argv": ["ls"], "user": "admin"}, "user"),
    ({"argv": ["ls"], "uid": 70000}, "uid"),
    ({"argv": ["ls"], "gid": -1}, "gid"),
    ({"argv": ["ls"], "env": {"A=B": "x"}}, "env"),
    ({"argv": ["ls"], "env": {"A": 1}}, "env"),
    ({"argv": ["ls"], "env": ["A=1"]}, "env"),
    ({"argv": ["ls"], "cwd": "relative/dir"}, "cwd"),
    ({"argv": ["ls"], "stdin": "yes"}, "stdin"),
    ({"argv": ["ls"], "pty": "yes"}, "pty"),
    ({"argv": ["ls"], "pty": {"rows": 0, "cols": 80}}, "rows"),
    ({"argv": ["ls"], "pty": {"rows": 24, "cols": 80, "x": 1}}, "x"),
    ({"argv": ["ls"], "tag": "t" * 65}, "tag"),
]


def test_bad_bodies_are_400_naming_the_field(own_sb):
    d, c, input_sb = own_sb
    path = c.cmd_path(input_sb["id"])
    for body, field in BAD_BODIES:
        r = _call(d, c.request, "POST", path, body)
        check_error(r, 400, "invalid_argument", field)
    r = _call(d, c.raw, "POST", path, b"{not json", {"Content-Type": "application/json"})
    check_error(r, 400, "invalid_argument")
    r = _call(d, c.raw, "POST", path, b"[1,2]", {"Content-Type": "application/json"})
    check_error(r, 400, "invalid_argument")
    # Nothing was started by any of them.
    lst = c.commands(input_sb["id"])
    assert lst.status == 200 and lst.json["commands"] == [], lst
    # And a good body still works afterwards.
    s = c.start_command_ok(input_sb["id"], argv=["echo", "ok"])
    assert c.attach_all(input_sb["id"], s["id"]).stdout == b"ok\n"


def test_start_failures_are_reported(own_sb):
    """A program that does not exist or a cwd that does not exist: 400
    naming it, or (if reported after the start) exit 127/126 with the name."""
    d, c, input_sb = own_sb
    for fields, name in (({"argv": ["no-such-program-xyz"]}, "no-such-program-xyz"),
                         ({"argv": ["pwd"], "cwd": "/no/such/dir"}, "/no/such/dir")):
        r = _call(d, c.start_command, input_sb["id"], **fields)
        if r.status == 201:
            res = c.attach_all(input_sb["id"], r.json["id"])
            assert res.exit["exit_code"] in (126, 127), res
            assert name in res.exit.get("error", ""), res
        else:
            check_error(r, 400, "invalid_argument", name)
    assert d.alive()


def test_bad_control_bodies(api, sandbox):
    c = api
    sid = sandbox["id"]
    s = c.start_command_ok(sid, argv=["sleep", "30"])
    try:
        for bad in ("NOPE", "SIGNOPE", 0, 65, -9, "", True, [9], None):
            check_error(c.request("POST", c.cmd_path(sid, s["id"], "signal"), {"signal": bad}),
                        400, "invalid_argument", "signal")
        check_error(c.request("POST", c.cmd_path(sid, s["id"], "signal"), {"signal": "TERM", "x": 1}),
                    400, "invalid_argument", "x")
        for body, field in (({"rows": 0, "cols": 80}, "rows"), ({"rows": 24, "cols": 1001}, "cols"),
                            ({"rows": "24", "cols": 80}, "rows"), ({"rows": 24}, "cols")):
            check_error(c.request("POST", c.cmd_path(sid, s["id"], "resize"), body), 400,
                        "invalid_argument", field)
        for q in ("abc", "3601", "-1"):
            check_error(c.raw("POST", c.cmd_path(sid, s["id"], "wait") + "?timeout_s=" + q, None),
                        400, "invalid_argument", "timeout_s")
        # The command was not touched by any of it.
        g = c.command(sid, s["id"])
        assert g.json["state"] == "running", g
    finally:
        kill_quietly(c, sid, s["id"])


# -- attach -------------------------------------------------------------------


def test_attach_ndjson_streams_apart_exit_last(api, sandbox):
    prog = ("import sys\n"
            "for i in range(300):\n"
            "    sys.stdout.write('o%d\\n' % i); sys.stdout.flush()\n"
            "    sys.stderr.write('e%d\\n' % i); sys.stderr.flush()\n"
            "sys.exit(3)\n")
    s = api.start_command_ok(sandbox["id"], argv=["python3", "-c", prog])
    with api.attach(sandbox["id"], s["id"]) as a:
        assert a.status == 200, a.error_resp()
        assert a.headers.get("content-type", "").startswith("application/x-ndjson"), a.headers
        res = a.read_all(60)
    assert res.ended
    ev = res.events
    assert ev[0]["type"] == "attached" and ev[0]["command"] == s["id"], ev[:2]
    assert ev[0]["dropped"] == {"stdout": 0, "stderr": 0}, ev[0]
    assert ev[-1] == {"type": "exit", "exit_code": 3, "signal": None, "timed_out": False}, ev[-1]
    assert [e for e in ev if e["type"] == "exit"] == [ev[-1]], "exactly one exit event, last"
    assert {e["type"] for e in ev[1:-1]} <= {"stdout", "stderr", "keepalive"}, ev
    assert res.stdout == "".join("o%d\n" % i for i in range(300)).encode(), res
    assert res.stderr == "".join("e%d\n" % i for i in range(300)).encode(), res


def test_attach_reports_signal(api, sandbox):
    _, res = run(api, sandbox["id"], argv=["sh", "-c", "echo bye; kill -9 $$"])
    assert res.stdout == b"bye\n"
    assert res.exit == {"type": "exit", "exit_code": None, "signal": 9, "timed_out": False}, res


def test_binary_output_round_trips(api, sandbox):
    all256 = bytes(range(256))
    prog = ("import sys\n"
            "sys.stdout.buffer.write(bytes(range(256)) * 64); sys.stdout.flush()\n"
            "sys.stderr.buffer.write(bytes(reversed(range(256))) * 3); sys.stderr.flush()\n")
    _, res = run(api, sandbox["id"], argv=["python3", "-c", prog])
    assert res.exit["exit_code"] == 0, res
    assert res.stdout == all256 * 64, "stdout is not byte-identical (%d bytes)" % len(res.stdout)
    assert res.stderr == bytes(reversed(all256)) * 3, res


def test_late_attach_gets_buffered_output(api, sandbox):
    s = api.start_command_ok(sandbox["id"], argv=["sh", "-c", "echo early; echo err-early >&2; sleep 1; echo late"])
    # Attach while it runs, after its first output…
    assert hostutil.wait_until(
        lambda: api.command(sandbox["id"], s["id"]).json["output_bytes"]["stdout"] >= 6, 10)
    res = api.attach_all(sandbox["id"], s["id"])
    assert res.stdout == b"early\nlate\n" and res.stderr == b"err-early\n", res
    # …and again after it has finished: the same, from the ring.
    res2 = api.attach_all(sandbox["id"], s["id"])
    assert res2.stdout == b"early\nlate\n" and res2.stderr == b"err-early\n", res2
    assert res2.exit == res.exit == {"type": "exit", "exit_code": 0, "signal": None, "timed_out": False}
    assert res2.dropped == {"stdout": 0, "stderr": 0}, res2


def test_command_outlives_its_attached_client(api, sandbox):
    s = api.start_command_ok(sandbox["id"], argv=["sh", "-c", "echo one; read x; echo two $x"], stdin=True)
    a = api.attach(sandbox["id"], s["id"])
    assert a.status == 200
    a.read_until(lambda r: b"one\n" in r.stdout, 10)
    a.close()  # the client goes away mid-stream
    time.sleep(0.3)
    g = api.command(sandbox["id"], s["id"])
    assert g.json["state"] == "running", g
    assert api.command_stdin(sandbox["id"], s["id"], b"more\n").status == 200
    res = api.attach_all(sandbox["id"], s["id"])
    assert res.stdout == b"one\ntwo more\n", res
    assert res.exit["exit_code"] == 0, res


@pytest.fixture(scope="module")
def ringd():
    """A daemon with a 64 KiB ring per stream."""
    d = start_or_fail(args=["--output-buffer", "65536"])
    yield d
    finish_or_fail(d)


def test_ring_overflow_counts_dropped_bytes(ringd, leaks):
    c = ringd.client()
    before = leaks.snapshot(ringd)
    sb = c.create_ok()
    try:
        out = b"".join(b"%07d\n" % i for i in range(25000))  # 200000 bytes, every line distinct
        err = b"".join(b"E%06d\n" % i for i in range(12500))  # 100000 bytes
        prog = ("import sys\n"
                "sys.stdout.write(''.join('%07d\\n' % i for i in range(25000))); sys.stdout.flush()\n"
                "sys.stderr.write(''.join('E%06d\\n' % i for i in range(12500))); sys.stderr.flush()\n")
        s = c.start_command_ok(sb["id"], argv=["python3", "-c", prog])
        w = c.command_wait(sb["id"], s["id"], timeout_s=30)
        assert w.status == 200 and w.json["state"] == "exited", w
        assert w.json["output_bytes"] == {"stdout": len(out), "stderr": len(err)}, w
        res = c.attach_all(sb["id"], s["id"])
        d = res.dropped
        assert d["stdout"] > 0 and d["stderr"] > 0, res
        # What was dropped plus what came is everything; what came is the tail.
        assert d["stdout"] + len(res.stdout) == len(out), (d, len(res.stdout))
        assert d["stderr"] + len(res.stderr) == len(err), (d, len(res.stderr))
        assert 0 < len(res.stdout) <= 65536 and 0 < len(res.stderr) <= 65536, res
        assert out.endswith(res.stdout), "replayed stdout is not the tail of the output"
        assert err.endswith(res.stderr), "replayed stderr is not the tail of the output"
        assert w.json["dropped"] == d, (w.json, d)
        assert res.exit["exit_code"] == 0, res
        # replay=false: nothing from the ring, still the exit.
        res = c.attach_all(sb["id"], s["id"], replay=False)
        assert res.stdout == b"" and res.stderr == b"", res
        assert res.exit["exit_code"] == 0, res
    finally:
        c.delete_ok(sb["id"])
    leaks.assert_same(before, ringd)


def test_two_clients_attached_at_once_both_get_everything(api, sandbox):
    s = api.start_command_ok(sandbox["id"], argv=["sh", "-c", "read x; seq 1 20000; echo done >&2; exit 2"],
                             stdin=True)
    a1 = api.attach(sandbox["id"], s["id"])
    a2 = api.attach(sandbox["id"], s["id"])
    try:
        assert a1.status == 200 and a2.status == 200
        for a in (a1, a2):
            a.read_until(lambda r: r.attached is not None, 10)
        assert api.command_stdin(sandbox["id"], s["id"], b"go\n").status == 200
        r1, r2 = a1.read_all(60), a2.read_all(60)
    finally:
        a1.close()
        a2.close()
    want = "".join("%d\n" % i for i in range(1, 20001)).encode()
    for r in (r1, r2):
        assert r.stdout == want, "a client missed output: %d of %d bytes" % (len(r.stdout), len(want))
        assert r.stderr == b"done\n", r
        assert r.exit["exit_code"] == 2, r


def test_replay_false_skips_buffered_output(api, sandbox):
    s = api.start_command_ok(sandbox["id"], argv=["sh", "-c", "echo before; read x; echo after"], stdin=True)
    assert hostutil.wait_until(
        lambda: api.command(sandbox["id"], s["id"]).json["output_bytes"]["stdout"] >= 7, 10)
    a = api.attach(sandbox["id"], s["id"], replay=False)
    try:
        assert a.status == 200, a.error_resp()
        a.read_until(lambda r: r.attached is not None, 10)
        assert api.command_stdin(sandbox["id"], s["id"], b"x\n").status == 200
        res = a.read_all(30)
    finally:
        a.close()
    assert res.stdout == b"after\n", res
    assert res.exit["exit_code"] == 0
    # The default replays everything.
    assert api.attach_all(sandbox["id"], s["id"]).stdout == b"before\nafter\n"


def test_attach_to_unknown_or_foreign_command_is_404(api, sandbox, make_sandbox):
    sid = sandbox["id"]
    for cid in ("cmd_doesnotexist0000000", "nonsense", "cmd_" + "x" * 80):
        a = api.attach(sid, cid)
        try:
            check_error(a.error_resp(), 404, "not_found")
        finally:
            a.close()
    other = make_sandbox()
    s = api.start_command_ok(other["id"], argv=["sleep", "30"])
    try:
        # The command exists, but in another sandbox: 404 on every route.
        a = api.attach(sid, s["id"])
        a.close()
        check_error(a.error_resp(), 404, "not_found")
        check_error(api.command(sid, s["id"]), 404, "not_found")
        check_error(api.command_stdin(sid, s["id"], b"x"), 404, "not_found")
        check_error(api.command_signal(sid, s["id"], "KILL"), 404, "not_found")
        check_error(api.command_resize(sid, s["id"], 10, 10), 404, "not_found")
        check_error(api.command_wait(sid, s["id"], timeout_s=1), 404, "not_found")
        assert s["id"] not in [c["id"] for c in api.commands(sid).json["commands"]]
        # …and it was left alone.
        assert api.command(other["id"], s["id"]).json["state"] == "running"
    finally:
        kill_quietly(api, other["id"], s["id"])
    # Unknown sandbox.
    a = api.attach("sb_doesnotexist000000", s["id"])
    a.close()
    check_error(a.error_resp(), 404, "not_found")


# -- stdin ---------------------------------------------------------------------


def test_stdin_is_written_and_closed(api, sandbox):
    sid = sandbox["id"]
    s = api.start_command_ok(sid, argv=["cat"], stdin=True)
    r = api.command_stdin(sid, s["id"], b"hello ")
    assert r.status == 200 and r.json == {"written": 6, "closed": False}, r
    r = api.command_stdin(sid, s["id"], b"world\n")
    assert r.status == 200 and r.json["written"] == 6, r
    assert api.command(sid, s["id"]).json["state"] == "running"  # still open
    r = api.command_stdin(sid, s["id"], b"", close=True)
    assert r.status == 200 and r.json == {"written": 0, "closed": True}, r
    res = api.attach_all(sid, s["id"])
    assert res.stdout == b"hello world\n" and res.exit["exit_code"] == 0, res
    # Data and close in one request.
    s = api.start_command_ok(sid, argv=["cat"], stdin=True)
    r = api.command_stdin(sid, s["id"], b"abc", close=True)
    assert r.status == 200 and r.json == {"written": 3, "closed": True}, r
    assert api.attach_all(sid, s["id"]).stdout == b"abc"


def test_stdin_large_body_is_streamed(api, sandbox):
    sid = sandbox["id"]
    data = os.urandom(1 << 20) * 3 + b"tail"
    s = api.start_command_ok(sid, cmd="sha256sum | cut -d' ' -f1; echo", stdin=True)
    r = api.command_stdin(sid, s["id"], data, close=True, timeout=120)
    assert r.status == 200 and r.json["written"] == len(data), r
    res = api.attach_all(sid, s["id"])
    assert res.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest(), res


def test_stdin_conflicts(api, sandbox):
    sid = sandbox["id"]
    # Never opened.
    s = api.start_command_ok(sid, argv=["sleep", "30"])
    try:
        check_error(api.command_stdin(sid, s["id"], b"x"), 409, "conflict")
    finally:
        kill_quietly(api, sid, s["id"])
    # Closed.
    s = api.start_command_ok(sid, argv=["sh", "-c", "cat >/dev/null; sleep 30"], stdin=True)
    try:
        assert api.command_stdin(sid, s["id"], b"", close=True).status == 200
        check_error(api.command_stdin(sid, s["id"], b"x"), 409, "conflict")
    finally:
        kill_quietly(api, sid, s["id"])
    # Finished.
    s = api.start_command_ok(sid, argv=["true"], stdin=True)
    assert api.command_wait(sid, s["id"], timeout_s=10).json["state"] == "exited"
    check_error(api.command_stdin(sid, s["id"], b"x"), 409, "conflict")
    check_error(api.command_stdin(sid, s["id"], b"", close=True), 409, "conflict")
    check_error(api.command_stdin(sid, "cmd_doesnotexist0000000", b"x"), 404, "not_found")


def test_closing_stdin_that_was_never_opened_is_409(api, sandbox):
    """docs: `409` if … its stdin is closed or was never opened — for an
    empty body with close=true too."""
    sid = sandbox["id"]
    s = api.start_command_ok(sid, argv=["sleep", "30"])
    try:
        check_error(api.command_stdin(sid, s["id"], b"", close=True), 409, "conflict")
    finally:
        kill_quietly(api, sid, s["id"])


def test_closing_stdin_twice_is_409(api, sandbox):
    sid = sandbox["id"]
    s = api.start_command_ok(sid, argv=["sh", "-c", "cat >/dev/null; sleep 30"], stdin=True)
    try:
        assert api.command_stdin(sid, s["id"], b"", close=True).status == 200
        check_error(api.command_stdin(sid, s["id"], b"", close=True), 409, "conflict")
    finally:
        kill_quietly(api, sid, s["id"])


# -- signal ------------------------------------------------------------------------


@pytest.mark.parametrize("sig,num", [("TERM", 15), ("SIGKILL", 9), (9, 9), ("int", 2), ("SIGUSR1", 10)])
def test_signal_reaches_the_command(api, sandbox, sig, num):
    sid = sandbox["id"]
    s = api.start_command_ok(sid, argv=["sleep", "30"])
    r = api.command_signal(sid, s["id"], sig)
    assert r.status == 200 and r.json == {"id": s["id"], "signal": num}, r
    w = api.command_wait(sid, s["id"], timeout_s=10)
    assert w.status == 200 and w.json["state"] == "exited", w
    assert w.json["signal"] == num and w.json["exit_code"] is None, w
    # Finished: 409.
    check_error(api.command_signal(sid, s["id"], "TERM"), 409, "conflict")


def test_signal_reaches_the_process_group(api, sandbox, hutchd):
    sid = sandbox["id"]
    s = api.start_command_ok(sid, cmd="sleep 3161 & sleep 3162 & wait")
    assert hostutil.wait_until(lambda: procs_with(hutchd, sid, ["sleep", "3161"])
                               and procs_with(hutchd, sid, ["sleep", "3162"]), 5), sandbox_procs(hutchd, sid)
    assert api.command_signal(sid, s["id"], "TERM").status == 200
    assert api.command_wait(sid, s["id"], timeout_s=10).json["state"] == "exited"
    assert hostutil.wait_until(lambda: not procs_with(hutchd, sid, ["sleep", "3161"])
                               and not procs_with(hutchd, sid, ["sleep", "3162"]), 5), \
        "a process of the signalled group survived: %r" % sandbox_procs(hutchd, sid)


# -- PTY and resize ----------------------------------------------------------------


def test_pty_resize(api, sandbox):
    sid = sandbox["id"]
    s = api.start_command_ok(sid, argv=["sh", "-c", "stty size; read x; stty size"],
                             pty={"rows": 30, "cols": 100})
    with api.attach(sid, s["id"]) as a:
        assert a.status == 200
        a.read_until(lambda r: b"30 100" in r.stdout, 15)
        r = api.command_resize(sid, s["id"], 40, 120)
        assert r.status == 200 and r.json == {"id": s["id"], "rows": 40, "cols": 120}, r
        assert api.command_stdin(sid, s["id"], b"go\n").status == 200
        res = a.read_all(30)
    out = res.stdout
    assert b"30 100" in out and b"40 120" in out, res
    assert out.index(b"30 100") < out.index(b"40 120"), res
    assert res.stderr == b"", "a PTY command has one stream: %r" % (res,)
    assert res.exit["exit_code"] == 0, res
    g = api.command(sid, s["id"])
    assert g.json["pty"] is True, g


def test_pty_is_a_terminal_with_stdin(api, sandbox):
    sid = sandbox["id"]
    s = api.start_command_ok(sid, cmd="test -t 0 && test -t 1 && test -t 2 && echo is-a-tty; echo to-stderr >&2; "
                                      "read line; echo got:$line", pty={"rows": 24, "cols": 80})
    with api.attach(sid, s["id"]) as a:
        a.read_until(lambda r: b"to-stderr" in r.stdout, 15)
        assert api.command_stdin(sid, s["id"], b"hello\n").status == 200
        res = a.read_all(30)
    assert b"is-a-tty" in res.stdout and b"got:hello" in res.stdout, res
    assert res.stderr == b"", res
    # Without pty, not a terminal.
    _, res = run(api, sid, cmd="test -t 1 && echo tty || echo notty")
    assert res.stdout == b"notty\n", res


def test_resize_without_pty_is_409(api, sandbox):
    sid = sandbox["id"]
    s = api.start_command_ok(sid, argv=["sleep", "30"])
    try:
        check_error(api.command_resize(sid, s["id"], 40, 120), 409, "conflict")
    finally:
        kill_quietly(api, sid, s["id"])


# -- wait, list, get -----------------------------------------------------------------


def test_wait_returns_the_command_after_exit(api, sandbox):
    sid = sandbox["id"]
    s = api.start_command_ok(sid, argv=["sh", "-c", "sleep 1; echo x; exit 7"], tag="w")
    t0 = time.monotonic()
    w = api.command_wait(sid, s["id"])
    took = time.monotonic() - t0
    assert w.status == 200, w
    o = w.json
    assert o["id"] == s["id"] and o["state"] == "exited" and o["exit_code"] == 7 and o["signal"] is None, o
    assert o["tag"] == "w" and o["pid"] == s["pid"] and o["timed_out"] is False, o
    assert o["output_bytes"] == {"stdout": 2, "stderr": 0}, o
    assert _epoch(o["finished_at"]) >= _epoch(o["started_at"]) + 0.9, o
    assert 0.5 < took < 10, took
    # Again: at once.
    t0 = time.monotonic()
    assert api.command_wait(sid, s["id"]).json == o
    assert time.monotonic() - t0 < 2


def test_wait_timeout_returns_running(api, sandbox):
    sid = sandbox["id"]
    s = api.start_command_ok(sid, argv=["sleep", "30"])
    try:
        t0 = time.monotonic()
        w = api.command_wait(sid, s["id"], timeout_s=1)
        took = time.monotonic() - t0
        assert w.status == 200, w
        assert w.json["state"] == "running" and w.json["exit_code"] is None, w
        assert w.json["finished_at"] is None, w
        assert 0.8 < took < 5, "wait ?timeout_s=1 took %.1fs" % took
    finally:
        kill_quietly(api, sid, s["id"])
    check_error(api.command_wait(sid, "cmd_doesnotexist0000000", timeout_s=1), 404, "not_found")


def test_list_and_get(api, make_sandbox):
    sid = make_sandbox()["id"]
    assert api.commands(sid).json == {"commands": []}
    done = api.start_command_ok(sid, argv=["sh", "-c", "echo out; exit 5"], tag="done")
    api.command_wait(sid, done["id"], timeout_s=10)
    running = api.start_command_ok(sid, argv=["sleep", "3163"], tag="running")
    try:
        r = api.commands(sid)
        assert r.status == 200, r
        by_id = {c["id"]: c for c in r.json["commands"]}
        assert set(by_id) == {done["id"], running["id"]}, r
        keys = {"id", "pid", "tag", "argv", "pty", "state", "exit_code", "signal", "timed_out",
                "started_at", "finished_at", "output_bytes", "dropped"}
        d, g = by_id[done["id"]], by_id[running["id"]]
        assert set(d) == keys and set(g) == keys, r
        assert d["state"] == "exited" and d["exit_code"] == 5 and d["tag"] == "done", d
        assert d["argv"] == ["sh", "-c", "echo out; exit 5"] and d["pty"] is False, d
        assert d["output_bytes"] == {"stdout": 4, "stderr": 0}, d
        assert RFC3339_MS.match(d["finished_at"]), d
        assert g["state"] == "running" and g["exit_code"] is None and g["finished_at"] is None, g
        assert g["tag"] == "running" and g["pid"] == running["pid"], g
        assert api.command(sid, done["id"]).json == d
        assert api.command(sid, running["id"]).json["state"] == "running"
        # cmd is run by /bin/sh -c.
        c = api.start_command_ok(sid, cmd="true")
        api.command_wait(sid, c["id"], timeout_s=10)
        assert api.command(sid, c["id"]).json["argv"] == ["/bin/sh", "-c", "true"]
    finally:
        kill_quietly(api, sid, running["id"])
    g = api.command(sid, running["id"]).json
    assert g["state"] == "exited" and g["signal"] == 9, g
    check_error(api.command(sid, "cmd_doesnotexist0000000"), 404, "not_found")


# -- background commands, timeouts -----------------------------------------------------


def test_background_command_outlives_the_request(api, sandbox, hutchd):
    sid = sandbox["id"]
    s = api.start_command_ok(sid, cmd="sleep 3164 & exec sleep 3165", tag="bg")
    try:
        time.sleep(2)
        g = api.command(sid, s["id"])
        assert g.status == 200 and g.json["state"] == "running", g
        assert procs_with(hutchd, sid, ["sleep", "3164"]) and procs_with(hutchd, sid, ["sleep", "3165"]), \
            sandbox_procs(hutchd, sid)
        r = api.exec_ok(sid, argv=["sh", "-c", "kill -0 %d && echo alive" % s["pid"]])
        assert r["stdout"] == "alive\n", r
    finally:
        kill_quietly(api, sid, s["id"])
    assert hostutil.wait_until(lambda: not procs_with(hutchd, sid, ["sleep", "3164"]), 5), \
        "the background child survived a KILL of its group"


def test_timeout_kills_the_whole_process_group(api, sandbox, hutchd):
    sid = sandbox["id"]
    s = api.start_command_ok(sid, cmd="sleep 3166 & sleep 3167 & echo started; wait", timeout_s=2)
    assert hostutil.wait_until(lambda: procs_with(hutchd, sid, ["sleep", "3166"])
                               and procs_with(hutchd, sid, ["sleep", "3167"]), 1.5), \
        "positive control: the group's processes are visible: %r" % sandbox_procs(hutchd, sid)
    t0 = time.monotonic()
    res = api.attach_all(sid, s["id"], timeout=30)
    assert res.stdout == b"started\n", res
    assert res.exit["timed_out"] is True, res
    assert res.exit["exit_code"] != 0, res
    assert time.monotonic() - t0 < 10
    g = api.command(sid, s["id"]).json
    assert g["timed_out"] is True and g["state"] == "exited", g
    assert hostutil.wait_until(lambda: not procs_with(hutchd, sid, ["sleep", "3166"])
                               and not procs_with(hutchd, sid, ["sleep", "3167"]), 5), \
        "a process of the timed-out group survived: %r" % sandbox_procs(hutchd, sid)
    r = api.exec_ok(sid, cmd="ps -eo args | grep -c '^sleep 316[67]' || true")
    assert r["stdout"].strip() == "0", r


def test_command_leaves_nothing_behind(hutchd, api, make_sandbox, leaks):
    before = leaks.snapshot(hutchd)
    sb = make_sandbox()
    s = api.start_command_ok(sb["id"], cmd="sleep 3168 & sleep 3169", stdin=True)
    a = api.attach(sb["id"], s["id"])
    a.read_until(lambda r: r.attached is not None, 10)
    try:
        api.delete_ok(sb["id"])  # with a running command and an attached client
        # The attach stream ends (with or without an exit event, cleanly or
        # cut), within a bound.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if a.next_event(timeout=max(0.1, deadline - time.monotonic())) is None:
                    break
            except (http.client.HTTPException, OSError, ValueError) as e:
                assert not isinstance(e, socket.timeout), "attach stream still open 30 s after delete"
                break
        else:
            pytest.fail("attach stream still open 30 s after delete")
    finally:
        a.close()
    leaks.assert_same(before, hutchd)


# -- attach tokens over TCP --------------------------------------------------------------


@pytest.fixture(scope="module")
def tcpd():
    d = start_or_fail(listen="127.0.0.1:%d" % hostutil.free_port())
    yield d
    finish_or_fail(d)


@pytest.fixture(scope="module")
def tcp_key(tcpd):
    r = tcpd.client().create_key("commands")
    assert r.status == 201, r
    return r.json["key"]


@pytest.fixture(scope="module")
def tcp_sbs(tcpd):
    c = tcpd.client()
    sbs = [c.create_ok()["id"], c.create_ok()["id"]]
    yield sbs
    if tcpd.alive():
        for sid in sbs:
            c.delete(sid, wait=True)


def test_token_attaches_without_the_key(tcpd, tcp_key, tcp_sbs):
    sid = tcp_sbs[0]
    keyed = tcpd.tcp_client(key=tcp_key)
    s = keyed.start_command_ok(sid, argv=["sh", "-c", "echo token-ok; read x; echo $x"], stdin=True)
    tok = s["attach_token"]
    anon = tcpd.tcp_client()
    # Positive control: without anything it is 401…
    a = anon.attach(sid, s["id"])
    a.close()
    check_error(a.error_resp(), 401, "unauthorized")
    # …with the token as a Bearer header, and as ?token=, it works.
    bearer = tcpd.tcp_client(key=tok)
    a1 = bearer.attach(sid, s["id"])
    a2 = anon.attach(sid, s["id"], token=tok)
    try:
        assert a1.status == 200, a1.error_resp()
        assert a2.status == 200, a2.error_resp()
        a1.read_until(lambda r: b"token-ok\n" in r.stdout, 10)
        # The command's other routes take the token too.
        g = bearer.command(sid, s["id"])
        assert g.status == 200 and g.json["id"] == s["id"], g
        assert anon.command(sid, s["id"], token=tok).status == 200
        r = anon.command_stdin(sid, s["id"], b"via-token\n", token=tok)
        assert r.status == 200, r
        w = bearer.command_wait(sid, s["id"], timeout_s=10)
        assert w.status == 200 and w.json["state"] == "exited", w
        r1, r2 = a1.read_all(30), a2.read_all(30)
    finally:
        a1.close()
        a2.close()
    for r in (r1, r2):
        assert r.stdout == b"token-ok\nvia-token\n" and r.exit["exit_code"] == 0, r
    # signal and resize with a token (answers about the command, not 401).
    s2 = keyed.start_command_ok(sid, argv=["sleep", "30"])
    t2 = tcpd.tcp_client(key=s2["attach_token"])
    check_error(t2.command_resize(sid, s2["id"], 10, 10), 409, "conflict")
    r = t2.command_signal(sid, s2["id"], "KILL")
    assert r.status == 200, r
    assert t2.command_wait(sid, s2["id"], timeout_s=10).json["signal"] == 9


def test_token_is_scoped_to_its_command(tcpd, tcp_key, tcp_sbs):
    sid, other_sid = tcp_sbs
    keyed = tcpd.tcp_client(key=tcp_key)
    s = keyed.start_command_ok(sid, argv=["sleep", "30"])
    other = keyed.start_command_ok(sid, argv=["echo", "secret-output"])
    foreign = keyed.start_command_ok(other_sid, argv=["echo", "foreign-output"])
    tok = s["attach_token"]
    t = tcpd.tcp_client(key=tok)
    anon = tcpd.tcp_client()
    unix = tcpd.client()
    ids_before = {c["id"] for c in unix.commands(sid).json["commands"]}
    try:
        # Another command of the same sandbox, and the same id under another sandbox.
        for (x_sid, x_cid) in ((sid, other["id"]), (other_sid, foreign["id"]), (other_sid, s["id"])):
            for client, q in ((t, None), (anon, tok)):
                a = client.attach(x_sid, x_cid, token=q)
                body = a.body
                a.close()
                check_error(a.error_resp(), 401, "unauthorized")
                assert b"output" not in (body or b"")
                check_error(client.command(x_sid, x_cid, token=q), 401, "unauthorized")
                check_error(client.command_stdin(x_sid, x_cid, b"x", token=q), 401, "unauthorized")
                check_error(client.command_signal(x_sid, x_cid, "KILL", token=q), 401, "unauthorized")
                check_error(client.command_wait(x_sid, x_cid, timeout_s=1, token=q), 401, "unauthorized")
        # Everything that is not one of its command's routes.
        check_error(t.list(), 401, "unauthorized")
        check_error(t.get(sid), 401, "unauthorized")
        check_error(t.commands(sid), 401, "unauthorized")
        check_error(t.start_command(sid, argv=["true"]), 401, "unauthorized")
        check_error(t.exec(sid, argv=["true"]), 401, "unauthorized")
        check_error(t.files_get(sid, "/etc/hostname"), 401, "unauthorized")
        check_error(t.files_put(sid, "/root/by-token", b"x"), 401, "unauthorized")
        check_error(t.delete(sid, wait=False), 401, "unauthorized")
        check_error(t.create(wait=False), 401, "unauthorized")
        check_error(anon.raw("GET", "/v1/sandboxes?token=" + tok, None), 401, "unauthorized")
        check_error(anon.raw("POST", anon.cmd_path(sid, token=tok), b'{"argv":["true"]}',
                             {"Content-Type": "application/json"}), 401, "unauthorized")
        check_error(anon.raw("GET", "/v1/sandboxes/%s?token=%s" % (sid, tok), None), 401, "unauthorized")
        # Nothing happened: the sandbox lives, no command was added, no file written.
        assert unix.get(sid).json["state"] == "running"
        assert {c["id"] for c in unix.commands(sid).json["commands"]} == ids_before
        assert unix.command(sid, s["id"]).json["state"] == "running"
        assert unix.files_stat(sid, "/root/by-token").status == 404
    finally:
        kill_quietly(tcpd.client(), sid, s["id"])


def test_tampered_tokens_are_401(tcpd, tcp_key, tcp_sbs):
    sid = tcp_sbs[0]
    keyed = tcpd.tcp_client(key=tcp_key)
    s = keyed.start_command_ok(sid, argv=["echo", "x"])
    tok = s["attach_token"]
    other = keyed.start_command_ok(sid, argv=["echo", "y"])
    assert tcpd.tcp_client(key=tok).command(sid, s["id"]).status == 200  # positive control
    flip = lambda ch: "0" if ch != "0" else "1"
    m = re.fullmatch(r"(.*?)(\d{9,})(.*)", tok)
    bad = [tok[:-1] + flip(tok[-1]),  # signature
           tok[:-1],
           tok + "0",
           flip(tok[0]) + tok[1:],
           tok.upper() if tok.upper() != tok else tok.lower(),
           other["attach_token"],  # a valid token, for another command
           ""]
    if m:  # a later expiry with the old signature
        bad.append(m.group(1) + str(int(m.group(2)) + 86400) + m.group(3))
    for b in bad:
        if b == tok:
            continue
        c = tcpd.tcp_client(key=b) if b else tcpd.tcp_client()
        check_error(c.command(sid, s["id"]), 401, "unauthorized")
        a = tcpd.tcp_client().attach(sid, s["id"], token=b)
        a.close()
        check_error(a.error_resp(), 401, "unauthorized")


def test_expired_token_is_401(start_hutchd):
    d = start_hutchd(args=["--attach-token-ttl", "10"], listen="127.0.0.1:%d" % hostutil.free_port())
    r = d.client().create_key("ttl")
    assert r.status == 201
    key = r.json["key"]
    keyed = d.tcp_client(key=key)
    sb = keyed.create_ok()
    s = keyed.start_command_ok(sb["id"], argv=["sleep", "60"])
    tok = s["attach_token"]
    exp = _epoch(s["attach_token_expires_at"])
    assert exp <= time.time() + 11, s
    t = d.tcp_client(key=tok)
    assert t.command(sb["id"], s["id"]).status == 200  # positive control
    left = exp - time.time() + 1.2
    assert left < 12.5, left
    time.sleep(max(0.0, left))
    check_error(t.command(sb["id"], s["id"]), 401, "unauthorized")
    a = d.tcp_client().attach(sb["id"], s["id"], token=tok)
    a.close()
    check_error(a.error_resp(), 401, "unauthorized")
    # The key still works, and the command is untouched.
    assert keyed.command(sb["id"], s["id"]).json["state"] == "running"
    kill_quietly(keyed, sb["id"], s["id"])
    keyed.delete_ok(sb["id"])
