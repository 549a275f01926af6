"""Files (docs/api.md "Files"): download and upload (streamed, byte-exact,
Content-Length, mode, parents, atomic replacement through a temporary file
that never stays behind), stat (symlinks not followed), list with depth,
mkdir, move, delete, and directories as tar streams both ways; every error
with its documented status."""

import calendar
import hashlib
import io
import os
import socket
import tarfile
import time

import pytest

import hostutil
from hutch_client import check_error


def sh(api, sid, cmd, **kw):
    r = api.exec_ok(sid, cmd=cmd, **kw)
    assert r["exit_code"] == 0, "exec %r: %r" % (cmd, r)
    return r["stdout"]


def names(api, sid, path):
    r = api.files_list(sid, path)
    assert r.status == 200, r
    return sorted(e["name"] for e in r.json["entries"])


def temp_leftovers(api, sid, path):
    return [n for n in names(api, sid, path) if n.startswith(".hutch-upload-")]


@pytest.fixture
def sb(make_sandbox):
    """A fresh sandbox per test: file tests leave files around."""
    return make_sandbox()


# -- download / upload ------------------------------------------------------------


def test_put_then_get_round_trip(api, sb):
    sid = sb["id"]
    data = os.urandom(1536 * 1024 + 7)  # crosses the 512 KiB chunk boundary
    r = api.files_put(sid, "/root/blob.bin", data)
    assert r.status == 201, r
    assert r.json == {"path": "/root/blob.bin", "size": len(data)}, r
    g = api.files_get(sid, "/root/blob.bin")
    assert g.status == 200, g
    assert g.header("content-type", "").startswith("application/octet-stream"), g.headers
    assert g.header("content-length") == str(len(data)), g.headers
    assert g.raw == data, "downloaded bytes differ (%d vs %d bytes)" % (len(g.raw), len(data))
    # The sandbox sees the same bytes.
    out = sh(api, sid, "sha256sum /root/blob.bin")
    assert out.split()[0] == hashlib.sha256(data).hexdigest(), out
    # Every byte value, and an empty file.
    all256 = bytes(range(256)) * 17
    assert api.files_put(sid, "/root/all256", all256).status == 201
    assert api.files_get(sid, "/root/all256").raw == all256
    r = api.files_put(sid, "/root/empty", b"")
    assert r.status == 201 and r.json["size"] == 0, r
    g = api.files_get(sid, "/root/empty")
    assert g.status == 200 and g.raw == b"" and g.header("content-length") == "0", g


def test_chunked_upload(api, sb):
    sid = sb["id"]
    parts = [os.urandom(n) for n in (1, 1000, 65536, 700000, 3)]
    r = api.files_put(sid, "/root/chunked.bin", iter(parts))
    assert r.status == 201 and r.json["size"] == sum(map(len, parts)), r
    assert api.files_get(sid, "/root/chunked.bin").raw == b"".join(parts)


def test_relative_paths_are_relative_to_root(api, sb):
    sid = sb["id"]
    assert api.files_put(sid, "rel.txt", b"relative\n").status == 201
    assert sh(api, sid, "cat /root/rel.txt") == "relative\n"
    assert api.files_get(sid, "rel.txt").raw == b"relative\n"
    assert api.files_stat(sid, "rel.txt").json["type"] == "file"


def test_put_mode_is_honoured(api, sb):
    sid = sb["id"]
    r = api.files_put(sid, "/root/run.sh", b"#!/bin/sh\necho ran\n", mode="0755")
    assert r.status == 201, r
    assert api.files_stat(sid, "/root/run.sh").json["mode"] == "0755"
    assert sh(api, sid, "stat -c %a /root/run.sh; /root/run.sh") == "755\nran\n"
    assert api.files_put(sid, "/root/secret", b"s", mode="600").status == 201
    assert sh(api, sid, "stat -c %a /root/secret") == "600\n"
    # Default 0644.
    assert api.files_put(sid, "/root/plain", b"p").status == 201
    assert api.files_stat(sid, "/root/plain").json["mode"] == "0644"
    for bad in ("abc", "0999", "99999", ""):
        check_error(api.files_put(sid, "/root/badmode", b"x", mode=bad), 400, "invalid_argument", "mode")
    assert api.files_stat(sid, "/root/badmode").status == 404


def test_put_parents(api, sb):
    sid = sb["id"]
    check_error(api.files_put(sid, "/root/new/a/b.txt", b"x"), 404, "not_found")
    assert api.files_stat(sid, "/root/new").status == 404, "a failed upload created a directory"
    r = api.files_put(sid, "/root/new/a/b.txt", b"deep", parents=True)
    assert r.status == 201, r
    assert api.files_stat(sid, "/root/new/a").json["type"] == "dir"
    assert sh(api, sid, "cat /root/new/a/b.txt") == "deep"
    assert temp_leftovers(api, sid, "/root/new/a") == []


def test_overwrite_replaces_the_file(api, sb):
    sid = sb["id"]
    assert api.files_put(sid, "/root/f", b"old contents, longer than the new ones").status == 201
    ino = sh(api, sid, "stat -c %i /root/f")
    assert api.files_put(sid, "/root/f", b"new").status == 201
    assert api.files_get(sid, "/root/f").raw == b"new"
    # Replaced by a rename (a new inode), not truncated in place.
    assert sh(api, sid, "stat -c %i /root/f") != ino
    assert temp_leftovers(api, sid, "/root") == []


def test_overwrite_is_atomic_for_readers(api, sb):
    """While a 4 MiB file is replaced, a reader inside the sandbox only ever
    sees the whole old or the whole new file."""
    sid = sb["id"]
    size = 4 << 20
    v1, v2 = b"A" * size, b"B" * size
    assert api.files_put(sid, "/root/atomic", v1).status == 201
    reader = ("import os, time\n"
              "ok = bad = 0\n"
              "end = time.time() + 30\n"
              "while not os.path.exists('/tmp/stop-reader') and time.time() < end:\n"
              "    try:\n"
              "        d = open('/root/atomic', 'rb').read()\n"
              "    except FileNotFoundError:\n"
              "        bad += 1; continue\n"
              "    if len(d) == %d and d.count(d[:1]) == len(d) and d[:1] in (b'A', b'B'):\n"
              "        ok += 1\n"
              "    else:\n"
              "        bad += 1\n"
              "print(ok, bad)\n" % size)
    s = api.start_command_ok(sid, argv=["python3", "-c", reader])
    try:
        time.sleep(0.3)
        for i in range(4):
            assert api.files_put(sid, "/root/atomic", v2 if i % 2 == 0 else v1).status == 201
    finally:
        sh(api, sid, "touch /tmp/stop-reader")
    res = api.attach_all(sid, s["id"], timeout=60)
    ok, bad = map(int, res.stdout.split())
    assert ok > 0, "the reader never read the file: %r" % (res,)
    assert bad == 0, "a reader saw a partial or missing file %d times (%d good reads)" % (bad, ok)
    assert temp_leftovers(api, sid, "/root") == []


def test_failed_uploads_leave_no_temporary_file(api, sb):
    sid = sb["id"]
    sh(api, sid, "echo file > /root/afile; mkdir /root/adir; echo keep > /root/adir/keep")
    before = names(api, sid, "/root")
    # Parent is a file: 409 (wrong type), with and without parents.
    check_error(api.files_put(sid, "/root/afile/x", b"x"), 409, "conflict")
    check_error(api.files_put(sid, "/root/afile/x/y", b"x", parents=True), 409, "conflict")
    # The target is a directory: 409, and the directory is untouched.
    check_error(api.files_put(sid, "/root/adir", b"x" * 100000), 409, "conflict")
    assert sh(api, sid, "cat /root/adir/keep") == "keep\n"
    # A path that names a directory by its form.
    check_error(api.files_put(sid, "/root/adir/", b"x"), 400, "invalid_argument")
    assert names(api, sid, "/root") == before, "a failed upload left something behind"
    assert names(api, sid, "/root/adir") == ["keep"]
    assert sh(api, sid, "cat /root/afile") == "file\n"


def test_aborted_upload_leaves_no_temporary_file(api, sb, hutchd):
    """The client promises 1 MiB, sends 200 KiB and goes away: the target is
    unchanged and the temporary file is removed."""
    sid = sb["id"]
    assert api.files_put(sid, "/root/target", b"original").status == 201
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    try:
        s.connect(hutchd.socket)
        s.sendall(("PUT %s HTTP/1.1\r\nHost: hutch\r\nContent-Type: application/octet-stream\r\n"
                   "Content-Length: %d\r\n\r\n" % (api.files_path(sid, path="/root/target"), 1 << 20)).encode())
        s.sendall(b"z" * (200 << 10))
        time.sleep(0.5)  # let the upload start (the temporary file exists now)
    finally:
        s.close()
    gone = hostutil.wait_until(lambda: temp_leftovers(api, sid, "/root") == [], 10, interval=0.2)
    assert gone, "temporary upload file left behind: %r" % temp_leftovers(api, sid, "/root")
    assert api.files_get(sid, "/root/target").raw == b"original"


def test_get_errors(api, sb):
    sid = sb["id"]
    sh(api, sid, "mkdir -p /root/d")
    check_error(api.files_get(sid, "/root/d"), 409, "conflict")
    check_error(api.files_get(sid, "/root/missing"), 404, "not_found")
    check_error(api.files_get(sid, "/root/missing/deeper"), 404, "not_found")
    check_error(api.files_get(sid, ""), 400, "invalid_argument", "path")
    check_error(api.raw("GET", "/v1/sandboxes/%s/files" % sid, None), 400, "invalid_argument", "path")
    check_error(api.files_get(sid, "/" + "a" * 5000), 400, "invalid_argument", "path")
    check_error(api.files_get("sb_doesnotexist000000", "/etc/hostname"), 404, "not_found")


def test_nul_in_path_is_400_not_truncated(api, sb):
    """`a%00b` must be refused, not silently become `a`."""
    sid = sb["id"]
    assert api.files_put(sid, "/root/nul", b"victim").status == 201
    base = "/v1/sandboxes/%s/files" % sid
    check_error(api.raw("GET", base + "?path=/root/nul%00.bak", None), 400, "invalid_argument")
    check_error(api.raw("PUT", base + "?path=/root/nul%00.bak", b"overwritten",
                        {"Content-Type": "application/octet-stream"}), 400, "invalid_argument")
    check_error(api.raw("DELETE", base + "?path=/root/nul%00.bak", None), 400, "invalid_argument")
    assert api.files_get(sid, "/root/nul").raw == b"victim"


# -- stat, list ------------------------------------------------------------------------


def test_stat(api, sb):
    sid = sb["id"]
    t0 = time.time()
    sh(api, sid, "printf hello > /root/f; chmod 640 /root/f; chown 1000:1000 /root/f; "
                 "mkdir -m 750 /root/d; ln -s /etc/hostname /root/l; ln -s /root/d /root/ld")
    keys = {"path", "name", "type", "size", "mode", "mtime", "uid", "gid", "link_target"}
    f = api.files_stat(sid, "/root/f")
    assert f.status == 200, f
    f = f.json
    assert set(f) == keys, f
    assert f["path"] == "/root/f" and f["name"] == "f" and f["type"] == "file", f
    assert f["size"] == 5 and f["mode"] == "0640" and f["uid"] == 1000 and f["gid"] == 1000, f
    assert f["link_target"] is None, f
    mt = calendar.timegm(time.strptime(f["mtime"][:19], "%Y-%m-%dT%H:%M:%S"))
    assert t0 - 5 <= mt <= time.time() + 5, f
    d = api.files_stat(sid, "/root/d").json
    assert d["type"] == "dir" and d["mode"] == "0750", d
    # Symlinks are not followed.
    link = api.files_stat(sid, "/root/l").json
    assert link["type"] == "symlink" and link["link_target"] == "/etc/hostname", link
    assert link["size"] == len("/etc/hostname"), link
    assert api.files_stat(sid, "/root/ld").json["type"] == "symlink"
    # …but a symlink in the middle of a path is (inside the sandbox).
    sh(api, sid, "echo in > /root/d/inner")
    assert api.files_stat(sid, "/root/ld/inner").json["type"] == "file"
    check_error(api.files_stat(sid, "/root/missing"), 404, "not_found")
    check_error(api.files_stat(sid, ""), 400, "invalid_argument", "path")


def test_list_depth(api, sb):
    sid = sb["id"]
    sh(api, sid, "mkdir -p /root/t/a/b/c; echo 1 > /root/t/top; echo 2 > /root/t/a/mid; "
                 "echo 3 > /root/t/a/b/low; echo 4 > /root/t/a/b/c/deep; "
                 "mkdir -p /root/elsewhere/x; ln -s /root/elsewhere /root/t/link")
    r = api.files_list(sid, "/root/t")
    assert r.status == 200, r
    assert r.json["path"] == "/root/t"
    e1 = {e["path"]: e for e in r.json["entries"]}
    assert set(e1) == {"a", "top", "link"}, r
    assert e1["a"]["type"] == "dir" and e1["top"]["type"] == "file" and e1["top"]["size"] == 2
    assert e1["link"]["type"] == "symlink" and e1["link"]["link_target"] == "/root/elsewhere"
    r2 = api.files_list(sid, "/root/t", depth=2)
    assert r2.status == 200, r2
    assert {e["path"] for e in r2.json["entries"]} == {"a", "top", "link", "a/b", "a/mid"}, r2
    r4 = api.files_list(sid, "/root/t", depth=10)
    paths = {e["path"] for e in r4.json["entries"]}
    assert paths == {"a", "top", "link", "a/b", "a/mid", "a/b/c", "a/b/low", "a/b/c/deep"}, r4
    assert not any(p.startswith("link/") for p in paths), "a symlink was followed by list"
    assert {e["name"] for e in r4.json["entries"] if e["path"] == "a/b/c/deep"} == {"deep"}
    for bad in ("0", "11", "x", "-1"):
        check_error(api.raw("GET", api.files_path(sid, "/list", path="/root/t") + "&depth=" + bad, None),
                    400, "invalid_argument", "depth")
    check_error(api.files_list(sid, "/root/t/top"), 409, "conflict")
    check_error(api.files_list(sid, "/root/nope"), 404, "not_found")
    # (hutchd adds "truncated"; a listing this small is complete.)
    assert r.json.get("truncated", False) is False, "a 3-entry listing is not truncated: %r" % (r,)


# -- mkdir, move, delete ---------------------------------------------------------------------


def test_mkdir(api, sb):
    sid = sb["id"]
    check_error(api.files_mkdir(sid, "/root/m1/m2"), 404, "not_found")
    r = api.files_mkdir(sid, "/root/m1/m2/m3", parents=True, mode="0700")
    assert r.status == 201, r
    assert api.files_stat(sid, "/root/m1/m2/m3").json["mode"] == "0700"
    assert api.files_stat(sid, "/root/m1").json["type"] == "dir"
    assert api.files_mkdir(sid, "/root/plain").status == 201
    assert api.files_stat(sid, "/root/plain").json["mode"] == "0755"
    # mkdir -p of an existing directory is fine; without parents it is a conflict.
    assert api.files_mkdir(sid, "/root/m1/m2/m3", parents=True).status == 201
    check_error(api.files_mkdir(sid, "/root/plain"), 409, "conflict")
    sh(api, sid, "echo f > /root/afile")
    check_error(api.files_mkdir(sid, "/root/afile", parents=True), 409, "conflict")
    check_error(api.files_mkdir(sid, "/root/afile/sub", parents=True), 409, "conflict")
    check_error(api.files_mkdir(sid, ""), 400, "invalid_argument", "path")
    check_error(api.request("POST", api.files_path(sid, "/mkdir"), {"path": "/root/z", "bogus": 1}),
                400, "invalid_argument", "bogus")
    check_error(api.files_mkdir(sid, "/root/z", mode="rwx"), 400, "invalid_argument", "mode")


def test_move(api, sb):
    sid = sb["id"]
    sh(api, sid, "echo A > /root/a; echo B > /root/b; mkdir -p /root/dir/sub; echo s > /root/dir/sub/s")
    check_error(api.files_move(sid, "/root/a", "/root/b"), 409, "conflict")
    check_error(api.files_move(sid, "/root/a", "/root/b", overwrite=False), 409, "conflict")
    assert sh(api, sid, "cat /root/a /root/b") == "A\nB\n", "a refused move changed something"
    r = api.files_move(sid, "/root/a", "/root/b", overwrite=True)
    assert r.status == 200, r
    assert sh(api, sid, "cat /root/b; test -e /root/a || echo gone") == "A\ngone\n"
    r = api.files_move(sid, "/root/b", "/root/renamed")
    assert r.status == 200, r
    assert api.files_get(sid, "/root/renamed").raw == b"A\n"
    assert api.files_move(sid, "/root/dir", "/root/dir2").status == 200
    assert sh(api, sid, "cat /root/dir2/sub/s") == "s\n"
    check_error(api.files_move(sid, "/root/nope", "/root/x"), 404, "not_found")
    check_error(api.files_move(sid, "/root/renamed", "/root/no/such/dir/x"), 404, "not_found")
    check_error(api.request("POST", api.files_path(sid, "/move"), {"from": "/root/renamed"}),
                400, "invalid_argument", "to")


def test_delete(api, sb):
    sid = sb["id"]
    sh(api, sid, "echo f > /root/f; mkdir /root/empty; mkdir -p /root/full/sub; echo x > /root/full/sub/x; "
                 "mkdir -p /root/target; echo keep > /root/target/keep; ln -s /root/target /root/link")
    r = api.files_delete(sid, "/root/f")
    assert r.status == 204 and r.raw == b"", r
    check_error(api.files_get(sid, "/root/f"), 404, "not_found")
    check_error(api.files_delete(sid, "/root/f"), 404, "not_found")
    assert api.files_delete(sid, "/root/empty").status == 204
    check_error(api.files_delete(sid, "/root/full"), 409, "conflict")
    assert sh(api, sid, "cat /root/full/sub/x") == "x\n"
    assert api.files_delete(sid, "/root/full", recursive=True).status == 204
    assert api.files_stat(sid, "/root/full").status == 404
    # A symlink is removed, never followed, even recursively.
    assert api.files_delete(sid, "/root/link", recursive=True).status == 204
    assert api.files_stat(sid, "/root/link").status == 404
    assert sh(api, sid, "cat /root/target/keep") == "keep\n"
    check_error(api.files_delete(sid, ""), 400, "invalid_argument", "path")


# -- tar ----------------------------------------------------------------------------------------


def test_tar_download(api, sb):
    sid = sb["id"]
    blob = os.urandom(300000)
    assert api.files_put(sid, "/root/tree/bin/blob", blob, parents=True).status == 201
    sh(api, sid, "cd /root/tree && echo hello > a.txt && : > empty && mkdir -p x/y && echo deep > x/y/z "
                 "&& ln -s a.txt alink && chmod 755 a.txt")
    r = api.files_tar_get(sid, "/root/tree")
    assert r.status == 200, r
    assert r.header("content-type", "").startswith("application/x-tar"), r.headers
    tf = tarfile.open(fileobj=io.BytesIO(r.raw))
    members = {os.path.normpath(m.name): m for m in tf.getmembers()}
    want = {".", "a.txt", "empty", "x", "x/y", "x/y/z", "alink", "bin", "bin/blob"}
    assert set(members) == want, sorted(members)
    assert tf.extractfile(members["a.txt"]).read() == b"hello\n"
    assert members["a.txt"].mode & 0o777 == 0o755
    assert tf.extractfile(members["empty"]).read() == b""
    assert tf.extractfile(members["x/y/z"]).read() == b"deep\n"
    assert tf.extractfile(members["bin/blob"]).read() == blob
    assert members["alink"].issym() and members["alink"].linkname == "a.txt"
    assert members["x/y"].isdir()
    check_error(api.files_tar_get(sid, "/root/tree/a.txt"), 409, "conflict")
    check_error(api.files_tar_get(sid, "/root/nope"), 404, "not_found")


def _tar(entries):
    """entries: (name, bytes) for files, (name, None) for dirs, (name, '->target') for symlinks."""
    bio = io.BytesIO()
    with tarfile.open(fileobj=bio, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for name, data in entries:
            ti = tarfile.TarInfo(name)
            ti.mtime = int(time.time())
            if data is None:
                ti.type, ti.mode = tarfile.DIRTYPE, 0o755
                tf.addfile(ti)
            elif isinstance(data, str) and data.startswith("->"):
                ti.type, ti.linkname = tarfile.SYMTYPE, data[2:]
                tf.addfile(ti)
            else:
                ti.size, ti.mode = len(data), 0o644
                tf.addfile(ti, io.BytesIO(data))
    return bio.getvalue()


def test_tar_upload(api, sb):
    sid = sb["id"]
    blob = os.urandom(700000)
    body = _tar([("top.txt", b"top\n"), ("d", None), ("d/e", None), ("d/e/f.bin", blob),
                 ("d/link", "->../top.txt")])
    r = api.files_tar_put(sid, "/root/unpacked/here", body)
    assert r.status == 200, r
    assert sh(api, sid, "cd /root/unpacked/here && cat top.txt && readlink d/link && cat d/link") == \
        "top\n../top.txt\ntop\n"
    assert api.files_get(sid, "/root/unpacked/here/d/e/f.bin").raw == blob
    # Into an existing directory, next to what is there.
    assert api.files_tar_put(sid, "/root/unpacked/here", _tar([("second", b"2")])).status == 200
    assert sorted(names(api, sid, "/root/unpacked/here")) == ["d", "second", "top.txt"]
    # A round trip: download the tree and upload it elsewhere.
    t = api.files_tar_get(sid, "/root/unpacked")
    assert t.status == 200
    assert api.files_tar_put(sid, "/root/copy", t.raw).status == 200
    assert api.files_get(sid, "/root/copy/here/d/e/f.bin").raw == blob


def test_tar_upload_into_a_file_is_409(api, sb):
    sid = sb["id"]
    sh(api, sid, "echo f > /root/afile")
    r = api.files_tar_put(sid, "/root/afile", _tar([("x", b"x")]))
    check_error(r, 409, "conflict")
    assert sh(api, sid, "cat /root/afile") == "f\n"


def test_corrupt_tar_is_400(api, sb):
    sid = sb["id"]
    r = api.files_tar_put(sid, "/root/bad", os.urandom(10240))
    err = check_error(r, 400, "invalid_argument")
    assert "archive" in err["message"] or "tar" in err["message"], err
    assert names(api, sid, "/root/bad") == []
    # Truncated in the middle of a member: 400 as well (GNU tar may have
    # written the members before the cut).
    good = _tar([("first", b"1" * 100), ("second", os.urandom(20000))])
    r = api.files_tar_put(sid, "/root/cut", good[:5000])
    check_error(r, 400, "invalid_argument")


def test_file_operations_leave_nothing_behind(hutchd, api, make_sandbox, leaks):
    before = leaks.snapshot(hutchd)
    sid = make_sandbox()["id"]
    assert api.files_put(sid, "/root/x/y", os.urandom(100000), parents=True).status == 201
    assert api.files_get(sid, "/root/x/y").status == 200
    assert api.files_tar_get(sid, "/root").status == 200
    assert api.files_tar_put(sid, "/root/t", _tar([("a", b"a")])).status == 200
    assert api.files_tar_put(sid, "/root/t2", b"garbage" * 100).status == 400
    # A download abandoned half-way (the client closes early).
    conn, resp = api.open_stream("GET", api.files_path(sid, path="/root/x/y"))
    assert resp.status == 200
    resp.read(1000)
    conn.close()
    api.delete_ok(sid)
    leaks.assert_same(before, hutchd)
