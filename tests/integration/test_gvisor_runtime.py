"""The gvisor runtime (src/lib/runtime/gvisor.c): the same hutch-init as PID 1
of a gVisor sandbox, behind the same API.  Commands (exit codes, stdin,
signals, streamed output), files, gVisor's own kernel, files that persist
across stop/start, storage ids on disk, the cgroup's memory limit around
runsc, pause/resume, and a delete that leaves nothing.

The module's daemon runs runsc with --platform ptrace (HUTCH_RUNSC_PLATFORM
overrides): it works everywhere runsc does.  Skipped where runsc is absent
or does not run, unless HUTCH_MUST_WORK=1."""

import hashlib
import os
import shutil
import subprocess
import time

import pytest

import hostutil
from daemon import finish_or_fail, start_or_fail

STORAGE_BASE = 134217728


def _runsc_works():
    exe = shutil.which("runsc")
    if not exe:
        return "runsc (gVisor) is not installed"
    try:
        r = subprocess.run([exe, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return "runsc --version: %s" % e
    if r.returncode != 0:
        return "runsc --version exited %d: %r" % (r.returncode, r.stdout[-300:])
    return None


@pytest.fixture(scope="module")
def hutchd():
    why = _runsc_works()
    if why:
        hostutil.skip_or_fail(why)
    platform = os.environ.get("HUTCH_RUNSC_PLATFORM", "ptrace")
    d = start_or_fail(args=["--runsc-platform", platform])
    yield d
    finish_or_fail(d)


@pytest.fixture(scope="module")
def gsb(hutchd):
    """One busybox sandbox on gvisor for the read-mostly tests."""
    c = hutchd.client()
    sb = c.create_ok(runtime="gvisor", template="busybox", labels={"fixture": "gvisor"})
    assert sb["runtime"] == "gvisor", sb
    yield sb
    if hutchd.alive():
        r = c.delete(sb["id"], wait=True)
        assert r.status == 200, "deleting the module sandbox: %r" % (r,)


def sh(api, sid, cmd, **kw):
    r = api.exec_ok(sid, cmd=cmd, **kw)
    assert r["exit_code"] == 0, "exec %r: %r" % (cmd, r)
    return r["stdout"]


def pool_path(hutchd, sid, rel):
    return os.path.join(hutchd.data_dir, "pool", "rootfs", sid, rel)


# -- commands --------------------------------------------------------------------


def test_exec_echo_exit_codes_stdin_signals(api, gsb):
    sid = gsb["id"]
    r = api.exec_ok(sid, argv=["echo", "hi"])
    assert r["stdout"] == "hi\n" and r["exit_code"] == 0 and r["signal"] is None, r
    r = api.exec_ok(sid, cmd="echo out; echo err >&2; exit 3")
    assert (r["stdout"], r["stderr"], r["exit_code"]) == ("out\n", "err\n", 3), r
    r = api.exec_ok(sid, argv=["cat"], stdin="hello\nworld")
    assert r["stdout"] == "hello\nworld" and r["exit_code"] == 0, r
    r = api.exec_ok(sid, cmd="kill -9 $$")
    assert r["signal"] == 9 and r["exit_code"] is None, r
    t0 = time.monotonic()
    r = api.exec_ok(sid, argv=["sleep", "30"], timeout_s=1)
    assert r["timed_out"] is True and time.monotonic() - t0 < 15, r
    # hutch-init is PID 1 of the sandbox, started with the stdio channel.
    assert sh(api, sid, "tr '\\0' ' ' < /proc/1/cmdline") == "/.hutch/init --stdio-channel ", r


def test_init_holds_no_host_file_the_sandbox_could_reopen(api, hutchd, gsb):
    """Under gVisor, sandbox root can open /proc/1/fd/N of hutch-init; init
    keeps only the channel (a socket: not reopenable), never the shim's log."""
    sid = gsb["id"]
    fds = sh(api, sid, "ls -l /proc/1/fd/")
    assert "host:" in fds, fds  # positive control: we look at init's fds
    r = api.exec_ok(sid, cmd="echo INJECTED-%s >> /proc/1/fd/2; for n in 0 1 3 64; do "
                             "echo x >> /proc/1/fd/$n; done; true" % sid)
    assert r["exit_code"] == 0, r
    log = hostutil.read_file(os.path.join(hutchd.data_dir, "sandboxes", sid, "shim.log")) or ""
    assert "INJECTED-" + sid not in log, "a sandbox process wrote into the shim's log"
    assert api.exec_ok(sid, argv=["echo", "alive"])["stdout"] == "alive\n"


def test_kernel_is_gvisors_not_the_hosts(api, gsb):
    sid = gsb["id"]
    inside = sh(api, sid, "uname -r").strip()
    assert inside and inside != os.uname().release, (inside, os.uname().release)
    assert "gVisor" in sh(api, sid, "dmesg"), "dmesg is not gVisor's"
    assert sh(api, sid, "uname -n").strip() == "sb-" + sid[3:], "hostname"


def test_host_template_runs_python(api, make_sandbox):
    sb = make_sandbox(runtime="gvisor", template="host")
    r = api.exec_ok(sb["id"], argv=["python3", "-c", "import os; print(6*7, os.getpid() > 1)"])
    assert r["stdout"] == "42 True\n", r
    assert sh(api, sb["id"], "uname -r").strip() != os.uname().release


def test_long_running_command_streams(api, gsb):
    sid = gsb["id"]
    started = api.start_command_ok(sid, cmd="for i in 1 2 3 4 5 6; do echo line$i; sleep 0.5; done")
    t0 = time.monotonic()
    with api.attach(sid, started["id"]) as st:
        assert st.status == 200, st.error_resp()
        res = st.read_until(lambda r: b"line1\n" in r.stdout, timeout=20)
        # The first line arrives while the command still runs (~3 s).
        assert res.exit is None and time.monotonic() - t0 < 2.5, res
        res = st.read_all(timeout=30)
    assert res.stdout == b"".join(b"line%d\n" % i for i in range(1, 7)), res
    assert res.exit["exit_code"] == 0, res


# -- files -------------------------------------------------------------------------


def test_files_api_upload_download(api, gsb):
    sid = gsb["id"]
    data = os.urandom(3 << 20) + b"end"
    r = api.files_put(sid, "/root/up.bin", data, mode="0640")
    assert r.status == 201, r
    g = api.files_get(sid, "/root/up.bin")
    assert g.status == 200 and g.raw == data, (g.status, len(g.raw))
    assert sh(api, sid, "md5sum /root/up.bin").split()[0] == hashlib.md5(data).hexdigest()
    s = api.files_stat(sid, "/root/up.bin")
    assert s.status == 200 and s.json["size"] == len(data), s
    assert api.files_mkdir(sid, "/root/d/e", parents=True).status in (200, 201)
    assert api.files_put(sid, "/root/d/e/f.txt", b"x").status == 201
    r = api.files_list(sid, "/root/d", depth=2)
    assert r.status == 200 and sorted(e["path"] for e in r.json["entries"]) == ["e", "e/f.txt"], r
    assert api.files_move(sid, "/root/d/e/f.txt", "/root/g.txt").status == 200
    assert sh(api, sid, "cat /root/g.txt") == "x"
    assert api.files_delete(sid, "/root/d", recursive=True).status in (200, 204)
    assert sh(api, sid, "test -e /root/d || echo gone") == "gone\n"
    # Paths resolve inside the sandbox (gVisor has no openat2: init resolves
    # in user space): a symlink climbing out lands at the sandbox's root...
    sh(api, sid, "ln -sfn /../../../.. /root/up && mkdir -p /srv")
    assert api.files_put(sid, "/root/up/srv/via-link", b"in").status == 201
    assert sh(api, sid, "cat /srv/via-link") == "in"
    # ...and /proc's magic links are not jumped through (fd 3 is the channel).
    r = api.files_get(sid, "/proc/self/fd/3")
    assert r.status >= 400, r
    r = api.files_put(sid, "/proc/self/fd/3", b"\x01\x00\x00\x00garbage")
    assert r.status >= 400, r
    assert api.exec_ok(sid, argv=["echo", "alive"])["stdout"] == "alive\n"


def test_files_persist_across_stop_start(api, hutchd, make_sandbox):
    sb = make_sandbox(runtime="gvisor", template="busybox")
    sid = sb["id"]
    sh(api, sid, "echo persist > /root/keep && mkdir -p /data && echo 2 > /data/x")
    assert api.files_put(sid, "/root/uploaded", b"up").status == 201
    api.lifecycle_ok(sid, "stop")
    assert api.get(sid).json["state"] == "stopped"
    # On disk in the sandbox's own root while it is stopped.
    assert hostutil.read_file(pool_path(hutchd, sid, "root/keep")) == "persist\n"
    assert not os.listdir(os.path.join(hutchd.data_dir, "sandboxes", sid, "runsc")), "runsc state left"
    api.lifecycle_ok(sid, "start")
    assert sh(api, sid, "cat /root/keep /data/x /root/uploaded") == "persist\n2\nup"
    sh(api, sid, "echo again >> /root/keep")
    api.lifecycle_ok(sid, "stop")
    api.lifecycle_ok(sid, "start")
    assert sh(api, sid, "cat /root/keep") == "persist\nagain\n"


def test_storage_ids_on_disk(hutchd, api, gsb):
    sid = gsb["id"]
    out = sh(api, sid, "echo x > /root/ids0 && touch /root/ids1000 && chown 1000:100 /root/ids1000 && "
                       "stat -c '%u %g' /root/ids0 /root/ids1000 /bin/busybox")
    assert out.split("\n")[:3] == ["0 0", "1000 100", "0 0"], out
    st = os.lstat(pool_path(hutchd, sid, "root/ids0"))
    assert (st.st_uid, st.st_gid) == (STORAGE_BASE, STORAGE_BASE), (st.st_uid, st.st_gid)
    st = os.lstat(pool_path(hutchd, sid, "root/ids1000"))
    assert (st.st_uid, st.st_gid) == (STORAGE_BASE + 1000, STORAGE_BASE + 100), (st.st_uid, st.st_gid)
    # Uploaded through the files API (hutch-init writes it as root inside).
    assert api.files_put(sid, "/root/ids-up", b"u").status == 201
    st = os.lstat(pool_path(hutchd, sid, "root/ids-up"))
    assert (st.st_uid, st.st_gid) == (STORAGE_BASE, STORAGE_BASE), (st.st_uid, st.st_gid)
    # A setuid-root file made inside is no setuid-root file on the host.
    sh(api, sid, "cp /bin/busybox /root/suid && chmod 4755 /root/suid")
    st = os.lstat(pool_path(hutchd, sid, "root/suid"))
    assert st.st_mode & 0o4000 and st.st_uid == STORAGE_BASE, (oct(st.st_mode), st.st_uid)


# -- cgroup ---------------------------------------------------------------------------


def _memory_limit_file(hutchd, sid):
    v = hutchd.health["cgroup"]
    d = hostutil.sandbox_cgroup_dir(hutchd.instance, sid, "memory", v)
    return d, os.path.join(d, "memory.max" if v == "v2" else "memory.limit_in_bytes")


def test_memory_limit_applies_to_runsc(api, hutchd, make_sandbox):
    sb = make_sandbox(runtime="gvisor", template="host", resources={"memory_mib": 256})
    sid = sb["id"]
    cg, limit_file = _memory_limit_file(hutchd, sid)
    assert int(hostutil.read_file(limit_file)) == 256 << 20
    # runsc and the sentry and gofer it started are in the sandbox's cgroup.
    names = sorted(os.path.basename((hostutil.proc_cmdline(p) or ["?"])[0]) for p in hostutil.cgroup_procs(cg))
    assert {"runsc", "runsc-sandbox", "runsc-gofer"} <= set(names), names
    r = api.exec_ok(sid, argv=["python3", "-c", "b = b'x' * (100 << 20); print(len(b))"])
    assert r["stdout"] == "%d\n" % (100 << 20), r
    if hutchd.health["cgroup"] == "v1":
        peak = int(hostutil.read_file(os.path.join(cg, "memory.max_usage_in_bytes")))
        assert 100 << 20 <= peak <= 256 << 20, peak
    # Past the limit: the host's OOM killer acts on the cgroup.  gVisor's
    # memory is the sentry's, so the sandbox ends as a whole (not just the
    # hog, as under native); the allocation never succeeds.
    r = api.exec(sid, argv=["python3", "-c", "b = b'x' * (1 << 30); print(len(b))"], timeout_s=60)
    assert not (r.status == 200 and r.json.get("exit_code") == 0), r
    assert hutchd.alive()
    assert api.healthz().status == 200


def test_delete_leaves_nothing(api, hutchd, leaks):
    before = leaks.snapshot(hutchd)
    sb = api.create_ok(runtime="gvisor", template="busybox")
    sid = sb["id"]
    assert sh(api, sid, "echo up") == "up\n"
    assert any("runsc" in " ".join(hostutil.proc_cmdline(p) or []) and sid in " ".join(hostutil.proc_cmdline(p))
               for p in hostutil.all_pids()), "no runsc process for the sandbox"
    t0 = time.monotonic()
    api.delete_ok(sid)
    assert time.monotonic() - t0 < 10
    leaks.assert_same(before, hutchd)
    left = [p for p in hostutil.all_pids() if sid in " ".join(hostutil.proc_cmdline(p) or [])]
    assert not left, "processes left: %r" % left
    assert not os.path.exists(os.path.join(hutchd.data_dir, "sandboxes", sid))


def test_delete_after_the_shim_died_leaves_nothing(api, hutchd, leaks):
    before = leaks.snapshot(hutchd)
    sb = api.create_ok(runtime="gvisor", template="busybox")
    sid = sb["id"]
    hostutil.kill_pid(sb["host"]["shim_pid"])
    assert hostutil.wait_until(lambda: not hostutil.proc_alive(sb["host"]["shim_pid"]), 10)
    r = api.delete(sid, wait=True)
    assert r.status == 200, r
    leaks.assert_same(before, hutchd)
    left = [p for p in hostutil.all_pids() if sid in " ".join(hostutil.proc_cmdline(p) or [])]
    assert not left, "processes left: %r" % left


# -- pause / resume -----------------------------------------------------------------------

COUNTER = ("i=0; while :; do i=$((i+1)); echo $i > /root/counter.tmp && mv /root/counter.tmp /root/counter; "
           "sleep 0.1; done")


def _counter(hutchd, sid):
    v = hostutil.wait_until(lambda: (hostutil.read_file(pool_path(hutchd, sid, "root/counter")) or "").strip(),
                            2, 0.01)
    assert v and v.isdigit(), "cannot read the counter: %r" % v
    return int(v)


def test_pause_stops_the_counter_and_resume_continues(api, hutchd, make_sandbox):
    sb = make_sandbox(runtime="gvisor", template="busybox")
    sid = sb["id"]
    c = api.start_command_ok(sid, cmd=COUNTER, tag="counter")
    assert hostutil.wait_until(lambda: (hostutil.read_file(pool_path(hutchd, sid, "root/counter")) or "").strip(), 10)
    v0 = _counter(hutchd, sid)
    time.sleep(1.0)
    v1 = _counter(hutchd, sid)
    assert v1 >= v0 + 3, "the counter does not count while running: %d -> %d" % (v0, v1)

    p = api.lifecycle_ok(sid, "pause")
    assert p["state"] == "paused", p
    vp = _counter(hutchd, sid)
    time.sleep(1.5)
    vp2 = _counter(hutchd, sid)
    assert vp2 == vp, "the counter moved while paused: %d -> %d" % (vp, vp2)

    r = api.lifecycle_ok(sid, "resume")
    assert r["state"] == "running", r
    assert hostutil.wait_until(lambda: _counter(hutchd, sid) > vp, 5), "the counter did not continue"
    # The same process continued (its count went on, it did not restart).
    assert _counter(hutchd, sid) > vp
    api.command_signal(sid, c["id"], "KILL")
    api.command_wait(sid, c["id"], timeout_s=10)
