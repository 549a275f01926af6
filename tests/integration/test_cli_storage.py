"""The `hutch` storage verbs against a real hutchd: template, snapshot,
rollback, fork, storage, and `hutch create --from-snapshot/--snapshot-every`
(docs/api.md "Storage").

Each verb prints ids (or a table, or "key: value" lines), --json prints
hutchd's reply, and any API error exits 1 with hutchd's message on stderr;
usage errors exit 2."""

import json
import os
import re
import subprocess

import pytest

import hostutil
from daemon import binary

SB_ID = re.compile(r"^sb_[A-Za-z0-9_-]+$")
SNAP_ID = re.compile(r"^snap_[A-Za-z0-9_-]+$")
PROGRESS = re.compile(r"^template (\S+): (.*) \((\d+)%\)$")


def hutch(*args, sock=None, timeout=180, stdin=subprocess.DEVNULL, text=True):
    e = dict(os.environ)
    for k in ("HUTCH_SOCKET", "HUTCH_URL", "HUTCH_API_KEY"):
        e.pop(k, None)
    argv = [binary("hutch")] + (["--socket", sock] if sock else []) + list(args)
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e,
                          timeout=timeout, universal_newlines=text, stdin=stdin)


@pytest.fixture(scope="module")
def sock(hutchd):
    return hutchd.socket


@pytest.fixture(scope="module")
def backend(api):
    r = api.request("GET", "/v1/storage")
    assert r.status == 200, r
    return r.json["backend"]


@pytest.fixture
def need_btrfs(backend):
    if backend != "btrfs":
        hostutil.skip_or_fail("the storage pool is %s, not btrfs (templates from snapshots, "
                              "import)" % backend)


@pytest.fixture
def doomed(api, hutchd):
    """Sandbox ids the CLI created (create, fork), deleted after the test."""
    ids = []
    yield ids
    if hutchd.alive():
        for sid in ids:
            r = api.delete(sid, wait=True)
            assert r.status in (200, 404), "deleting %s: %r" % (sid, r)


def run_ok(sock, *args, **kw):
    p = hutch(*args, sock=sock, **kw)
    assert p.returncode == 0, p
    return p


def fails(sock, *args, code=1):
    """A failing call: exit status `code`, nothing on stdout, "hutch: ..." on stderr."""
    p = hutch(*args, sock=sock)
    assert p.returncode == code, p
    assert p.stdout == "", p
    assert p.stderr.startswith("hutch: "), p
    return p


def write(api, sid, path, text):
    api.exec_ok(sid, ["sh", "-c", "printf %s \"$1\" > \"$2\"", "sh", text, path])


def read(api, sid, path):
    return api.exec_ok(sid, ["cat", path])["stdout"]


def snapshot(sock, sid, *extra):
    p = run_ok(sock, "snapshot", "create", sid, *extra)
    snap = p.stdout.strip()
    assert SNAP_ID.match(snap) and p.stdout == snap + "\n", p
    return snap


def table(stdout):
    """Rows of an `ls`-style table as lists of cells (header first)."""
    return [line.split() for line in stdout.splitlines()]


# -- template -------------------------------------------------------------------


def test_template_list_shows_host_and_busybox(sock):
    p = run_ok(sock, "template", "list")
    rows = table(p.stdout)
    assert rows[0] == ["NAME", "STATE", "SOURCE", "SIZE", "CREATED"], p
    by_name = {r[0]: r for r in rows[1:]}
    for name in ("host", "busybox"):
        assert name in by_name, p
        assert by_name[name][1] == "ready" and by_name[name][2] == name, p
    # --json (after the verb or global) is hutchd's reply.
    for args in (("template", "list", "--json"), ("--json", "template", "ls")):
        doc = json.loads(run_ok(sock, *args).stdout)
        assert {"host", "busybox"} <= {t["name"] for t in doc["templates"]}, doc


def test_template_get(sock):
    p = run_ok(sock, "template", "get", "busybox")
    assert "name:" in p.stdout and "busybox" in p.stdout, p
    assert re.search(r"^state: +ready$", p.stdout, re.M), p
    doc = json.loads(run_ok(sock, "template", "get", "busybox", "--json").stdout)
    assert doc["name"] == "busybox" and doc["source"]["source"] == "busybox", doc


def test_template_from_snapshot_then_create(api, sock, make_sandbox, doomed, need_btrfs):
    sid = make_sandbox()["id"]
    write(api, sid, "/root/marker", "from the snapshot")
    snap = snapshot(sock, sid)
    p = run_ok(sock, "template", "create", "t1", "--from-snapshot", snap)
    assert p.stdout == "t1\n", p
    # Progress on stderr (not a terminal: one line per change), ending with
    # the finished build.
    lines = p.stderr.splitlines()
    assert lines and all(PROGRESS.match(l) for l in lines), p
    assert PROGRESS.match(lines[-1]).groups() == ("t1", "ready", "100"), p
    assert len(lines) == len(set(lines)), p  # no repeats
    t = api.request("GET", "/v1/templates/t1")
    assert t.status == 200 and t.json["state"] == "ready", t
    assert t.json["source"] == {"source": "snapshot", "snapshot": snap}, t

    new = run_ok(sock, "create", "--template", "t1").stdout.strip()
    assert SB_ID.match(new), new
    doomed.append(new)
    assert api.get(new).json["template"] == "t1"
    assert read(api, new, "/root/marker") == "from the snapshot"

    assert api.delete(new, wait=True).status == 200
    p = run_ok(sock, "template", "delete", "t1")
    assert p.stdout == "t1\n", p
    assert api.request("GET", "/v1/templates/t1").status == 404
    p = fails(sock, "template", "delete", "t1")
    assert "not found" in p.stderr and "404" in p.stderr, p


def test_template_progress_on_a_terminal(api, sock):
    """With stderr a terminal, progress rewrites one line (\r ... ESC[K)
    and ends with a newline."""
    master, slave = os.openpty()
    try:
        p = subprocess.run([binary("hutch"), "--socket", sock, "template", "create", "bb-tty",
                            "--source", "busybox"], stdout=subprocess.PIPE, stderr=slave,
                           stdin=subprocess.DEVNULL, universal_newlines=True, timeout=180)
        os.close(slave)
        slave = None
        out = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the other side is closed
                break
            if not chunk:
                break
            out += chunk
    finally:
        if slave is not None:
            os.close(slave)
        os.close(master)
    assert p.returncode == 0 and p.stdout == "bb-tty\n", (p, out)
    text = out.decode()
    assert text.startswith("\rtemplate bb-tty: "), text
    assert "\x1b[K" in text and text.rstrip("\r\n").endswith("ready (100%)\x1b[K"), text
    assert text.count("\n") == 1, text
    run_ok(sock, "template", "delete", "bb-tty")


def test_template_create_no_wait_and_json(api, sock):
    p = run_ok(sock, "template", "create", "bb-nowait", "--source", "busybox", "--no-wait")
    assert p.stdout == "bb-nowait\n" and p.stderr == "", p
    p = run_ok(sock, "template", "create", "bb-json", "--source", "busybox", "--json")
    doc = json.loads(p.stdout)
    assert doc["name"] == "bb-json" and doc["state"] == "ready", doc
    assert hostutil.wait_until(
        lambda: api.request("GET", "/v1/templates/bb-nowait").json["state"] == "ready",
        timeout=120, what="template bb-nowait built")
    for name in ("bb-nowait", "bb-json"):
        p = run_ok(sock, "template", "delete", name)
        assert p.stdout == name + "\n", p


def test_template_build_failure(api, sock, tmp_path):
    bogus = tmp_path / "not-an-image.tar"
    bogus.write_text("this is not a tar archive\n")
    # A relative --oci path is made absolute by the CLI.
    p = subprocess.run([binary("hutch"), "--socket", sock, "template", "create", "broken",
                        "--oci", bogus.name], cwd=str(tmp_path), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True, timeout=180)
    assert p.returncode == 1 and p.stdout == "", p
    assert "hutch: template broken: build failed:" in p.stderr, p
    t = api.request("GET", "/v1/templates/broken")
    assert t.status == 200 and t.json["state"] == "failed", t
    assert t.json["source"]["path"] == str(bogus), t
    run_ok(sock, "template", "delete", "broken")


def test_template_bad_input(sock, tmp_path):
    p = fails(sock, "template", "get", "no-such-template")
    assert "not found" in p.stderr and "404" in p.stderr, p
    p = fails(sock, "template", "create", "t2", "--from-snapshot", "snap_nope")
    assert "snap_nope" in p.stderr and "not found" in p.stderr, p
    p = fails(sock, "template", "create", "t2", "--source", "debian", "--mirror", "ftp://x")
    assert "mirror" in p.stderr and "400" in p.stderr, p
    p = fails(sock, "template", "create", "t2", "--oci", str(tmp_path / "missing.tar"))
    assert "missing.tar" in p.stderr and "No such file" in p.stderr, p
    # Usage errors: exit 2, the usage on stderr.
    p = fails(sock, "template", "create", "t2", code=2)
    assert "missing --source" in p.stderr and "usage: hutch template" in p.stderr, p
    p = fails(sock, "template", "frob", code=2)
    assert "unknown template command `frob`" in p.stderr, p
    p = fails(sock, "template", "create", "t2", "--source", "busybox", "--package", "git", code=2)
    assert "--package applies only to `--source debian`" in p.stderr, p


# -- snapshot -------------------------------------------------------------------


def test_snapshot_create_list_get_delete(api, sock, make_sandbox):
    sid = make_sandbox()["id"]
    snap = snapshot(sock, sid, "--label", "step=one")
    other = snapshot(sock, sid)

    p = run_ok(sock, "snapshot", "list", sid)
    rows = table(p.stdout)
    assert rows[0] == ["ID", "SANDBOX", "KIND", "STATE", "SIZE", "CREATED", "LABELS"], p
    mine = {r[0]: r for r in rows[1:]}
    assert set(mine) == {snap, other}, p
    assert mine[snap][1] == sid and mine[snap][2] == "manual" and mine[snap][3] == "ready", p
    assert mine[snap][-1] == "step=one" and mine[other][-1] == "-", p
    # All snapshots, and filtered by kind.
    assert snap in run_ok(sock, "snapshot", "list").stdout
    assert snap in run_ok(sock, "snapshot", "ls", "--kind", "manual").stdout
    assert snap not in run_ok(sock, "snapshot", "list", "--kind", "fork").stdout
    doc = json.loads(run_ok(sock, "snapshot", "list", sid, "--json").stdout)
    assert {s["id"] for s in doc["snapshots"]} == {snap, other}, doc

    p = run_ok(sock, "snapshot", "get", snap)
    assert re.search(r"^id: +%s$" % snap, p.stdout, re.M), p
    assert re.search(r"^sandbox: +%s$" % sid, p.stdout, re.M), p
    assert re.search(r"^kind: +manual$", p.stdout, re.M), p
    assert re.search(r"^labels: +step=one$", p.stdout, re.M), p
    doc = json.loads(run_ok(sock, "snapshot", "get", snap, "--json").stdout)
    assert doc["id"] == snap and doc["labels"] == {"step": "one"}, doc
    doc = json.loads(run_ok(sock, "snapshot", "create", sid, "--json").stdout)
    assert SNAP_ID.match(doc["id"]) and doc["sandbox"] == sid and doc["state"] == "ready", doc

    p = run_ok(sock, "snapshot", "delete", snap, other, doc["id"])
    assert p.stdout == "%s\n%s\n%s\n" % (snap, other, doc["id"]) and p.stderr == "", p
    p = fails(sock, "snapshot", "get", snap)
    assert p.stderr == "hutch: snapshot `%s` not found (HTTP 404)\n" % snap, p
    assert json.loads(run_ok(sock, "snapshot", "list", sid, "--json").stdout)["snapshots"] == []
    # Deleting one that is gone: exit 1, the others are still tried.
    fresh = snapshot(sock, sid)
    p = hutch("snapshot", "delete", snap, fresh, sock=sock)
    assert p.returncode == 1 and p.stdout == fresh + "\n", p
    assert "`%s` not found" % snap in p.stderr, p


def test_rollback_paused_restores_file(api, sock, make_sandbox):
    sid = make_sandbox()["id"]
    write(api, sid, "/root/f", "one")
    snap = snapshot(sock, sid)
    write(api, sid, "/root/f", "two")
    write(api, sid, "/root/extra", "later")
    run_ok(sock, "pause", sid)
    p = run_ok(sock, "rollback", sid, snap)
    state = api.get(sid).json["state"]
    assert p.stdout == "%s %s\n" % (sid, state) and p.stderr == "", p
    if state == "paused":
        run_ok(sock, "resume", sid)
    assert read(api, sid, "/root/f") == "one"
    r = api.exec(sid, ["test", "-e", "/root/extra"])
    assert r.json["exit_code"] == 1, r


def test_rollback_running_fails_with_409(api, sock, make_sandbox):
    sid = make_sandbox()["id"]
    write(api, sid, "/root/f", "one")
    snap = snapshot(sock, sid)
    write(api, sid, "/root/f", "two")
    p = fails(sock, "rollback", sid, snap)
    assert "is running: pause or stop it before a rollback" in p.stderr, p
    assert "(HTTP 409)" in p.stderr and sid in p.stderr, p
    assert api.get(sid).json["state"] == "running"
    assert read(api, sid, "/root/f") == "two"
    p = fails(sock, "rollback", "--json", sid, snap)  # errors stay on stderr
    assert "409" in p.stderr, p


def test_fork_count_2(api, sock, make_sandbox, doomed):
    sid = make_sandbox()["id"]
    write(api, sid, "/root/parent", "hello from the parent")
    p = run_ok(sock, "fork", sid, "--count", "2", "--label", "copy=yes")
    ids = p.stdout.split()
    doomed.extend(ids)
    assert len(ids) == 2 and len(set(ids)) == 2 and sid not in ids, p
    assert p.stdout == "".join(i + "\n" for i in ids), p
    for new in ids:
        assert SB_ID.match(new), p
        sb = api.get(new).json
        assert sb["state"] == "running" and sb["labels"].get("copy") == "yes", sb
        assert read(api, new, "/root/parent") == "hello from the parent"
    # The copies are independent of each other and of the parent.
    write(api, ids[0], "/root/parent", "changed")
    assert read(api, ids[1], "/root/parent") == "hello from the parent"
    assert read(api, sid, "/root/parent") == "hello from the parent"


def test_fork_from_snapshot_json(api, sock, make_sandbox, doomed):
    sid = make_sandbox()["id"]
    write(api, sid, "/root/f", "old")
    snap = snapshot(sock, sid)
    write(api, sid, "/root/f", "new")
    doc = json.loads(run_ok(sock, "fork", sid, "--snapshot", snap, "--json").stdout)
    doomed.extend(s["id"] for s in doc["sandboxes"])
    assert doc["parent"] == sid and doc["snapshot"] == snap, doc
    assert len(doc["sandboxes"]) == 1 and doc["sandboxes"][0]["state"] == "running", doc
    assert read(api, doc["sandboxes"][0]["id"], "/root/f") == "old"


def test_export_delete_import(api, sock, make_sandbox, tmp_path, need_btrfs):
    sid = make_sandbox()["id"]
    write(api, sid, "/root/f", "exported")
    snap = snapshot(sock, sid, "--label", "k=v")
    out = tmp_path / "snap.hutch"
    p = run_ok(sock, "snapshot", "export", snap, "-o", str(out))
    assert p.stdout == "" and p.stderr == "", p
    assert out.stat().st_size > 0
    assert [f.name for f in tmp_path.iterdir()] == ["snap.hutch"]  # no temporary left

    # To stdout (a pipe), the same kind of stream.
    p = hutch("snapshot", "export", snap, sock=sock, text=False)
    assert p.returncode == 0 and len(p.stdout) > 0, p.stderr

    run_ok(sock, "snapshot", "delete", snap)
    fails(sock, "snapshot", "get", snap)
    p = run_ok(sock, "snapshot", "import", str(out))
    assert p.stdout == snap + "\n", p
    doc = json.loads(run_ok(sock, "snapshot", "get", snap, "--json").stdout)
    assert doc["id"] == snap and doc["kind"] == "imported" and doc["state"] == "ready", doc
    assert doc["labels"] == {"k": "v"}, doc
    # Importing it again: hutchd's 409, exit 1.
    p = fails(sock, "snapshot", "import", str(out))
    assert "already exists" in p.stderr and "409" in p.stderr, p
    # From stdin.
    run_ok(sock, "snapshot", "delete", snap)
    with open(str(out), "rb") as f:
        p = run_ok(sock, "snapshot", "import", "-", stdin=f)
    assert p.stdout == snap + "\n", p

    # The imported snapshot is usable: a sandbox from it has the file.
    new = run_ok(sock, "create", "--from-snapshot", snap, "--snapshot-every", "3600").stdout.strip()
    try:
        assert SB_ID.match(new), new
        assert read(api, new, "/root/f") == "exported"
        sb = api.get(new).json
        assert sb["from_snapshot"] == snap, sb
        pol = api.request("GET", "/v1/sandboxes/%s/snapshot-policy" % new)
        assert pol.status == 200 and pol.json["interval_s"] == 3600, pol
    finally:
        api.delete(new, wait=True)


def test_export_refuses_a_terminal(api, sock, make_sandbox):
    sid = make_sandbox()["id"]
    snap = snapshot(sock, sid)
    master, slave = os.openpty()
    try:
        p = subprocess.run([binary("hutch"), "--socket", sock, "snapshot", "export", snap],
                           stdout=slave, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                           universal_newlines=True, timeout=60)
    finally:
        os.close(slave)
        os.close(master)
    assert p.returncode == 2, p
    assert "stdout is a terminal; use -o FILE" in p.stderr, p
    run_ok(sock, "snapshot", "delete", snap)


def test_storage(api, sock):
    p = run_ok(sock, "storage")
    want = api.request("GET", "/v1/storage").json
    assert re.search(r"^backend: +%s$" % want["backend"], p.stdout, re.M), p
    assert re.search(r"^path: +%s$" % re.escape(want["path"]), p.stdout, re.M), p
    assert re.search(r"^used_bytes: +\d+$", p.stdout, re.M), p
    doc = json.loads(run_ok(sock, "storage", "--json").stdout)
    assert doc["backend"] == want["backend"] and doc["path"] == want["path"], doc


def test_bad_input(api, sock, make_sandbox, tmp_path):
    sid = make_sandbox()["id"]
    p = fails(sock, "snapshot", "get", "snap_nope")
    assert p.stderr == "hutch: snapshot `snap_nope` not found (HTTP 404)\n", p
    p = fails(sock, "snapshot", "delete", "snap_nope")
    assert "snap_nope" in p.stderr and "404" in p.stderr, p
    p = fails(sock, "rollback", sid, "snap_nope")
    assert "snapshot `snap_nope` not found" in p.stderr, p
    p = fails(sock, "fork", sid, "--snapshot", "snap_nope")
    assert "snap_nope" in p.stderr and "not found" in p.stderr, p
    p = fails(sock, "create", "--from-snapshot", "snap_nope")
    assert "from_snapshot" in p.stderr and "snap_nope" in p.stderr, p
    p = fails(sock, "snapshot", "create", "sb_nope")
    assert "sandbox `sb_nope` not found" in p.stderr, p
    p = fails(sock, "snapshot", "list", "sb_nope")
    assert "sandbox `sb_nope` not found" in p.stderr, p
    p = fails(sock, "fork", "sb_nope")
    assert "sandbox `sb_nope` not found" in p.stderr, p
    # A failed export leaves no file behind.
    out = tmp_path / "x.snap"
    p = fails(sock, "snapshot", "export", "snap_nope", "-o", str(out))
    assert "snapshot `snap_nope` not found" in p.stderr, p
    assert list(tmp_path.iterdir()) == []
    p = fails(sock, "snapshot", "import", str(tmp_path / "missing"))
    assert "No such file" in p.stderr, p
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"not a snapshot stream" * 100)
    p = fails(sock, "snapshot", "import", str(garbage))
    assert "(HTTP 4" in p.stderr or "(HTTP 5" in p.stderr, p

    # Usage errors: exit 2 with the usage line.
    for args, msg in [
        (("snapshot",), "missing snapshot command"),
        (("snapshot", "take", sid), "unknown snapshot command `take`"),
        (("snapshot", "export", "s", "--parent", "p", "--incremental"), "exclude each other"),
        (("rollback", sid), "missing snapshot ID"),
        (("fork", sid, "--count", "0"), "--count `0`: at least 1"),
        (("fork", "--bogus", sid), "unknown option `--bogus`"),
        (("create", "--snapshot-every", "1h"), "--snapshot-every `1h`"),
        (("storage", "extra"), "unexpected argument `extra`"),
    ]:
        p = fails(sock, *args, code=2)
        assert msg in p.stderr and "usage: hutch" in p.stderr, (args, p)


def test_help(sock):
    p = run_ok(sock, "--help")
    for verb in ("snapshot", "rollback", "fork", "template", "storage"):
        assert re.search(r"^  %s " % verb, p.stdout, re.M), (verb, p.stdout)
        h = run_ok(sock, verb, "--help")
        assert h.stdout.startswith("usage: hutch %s" % verb) and h.stderr == "", h
    assert "--from-snapshot" in run_ok(sock, "create", "--help").stdout
    assert "--snapshot-every" in run_ok(sock, "create", "--help").stdout
