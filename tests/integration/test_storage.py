"""Storage (docs/storage.md): the btrfs pool, templates, snapshots, rollback,
fork, from_snapshot, automatic snapshots, export/import, quotas, and the
overlay fallback.  Every call is also tried with bad input."""

import hashlib
import io
import json
import os
import subprocess
import tarfile
import time

import pytest

import hostutil

BTRFS_IOC_SUBVOL_CREATE = 0x5000940E  # _IOW(0x94, 14, struct btrfs_ioctl_vol_args) (4096 + 8 bytes)


def snap_of(api, sid, labels=None, wait=True):
    body = {} if labels is None else {"labels": labels}
    r = api.request("POST", "/v1/sandboxes/%s/snapshots%s" % (sid, "" if wait else "?wait=false"), body,
                    timeout=120)
    assert r.status in (201, 202), r
    return r.json


def op_wait(api, op_id, timeout=120):
    r = api.operation(op_id, wait=timeout)
    assert r.status == 200, r
    return r.json


def pause(api, sid):
    r = api.request("POST", "/v1/sandboxes/%s/pause?wait=true" % sid, None)
    assert r.status == 200 and r.json["state"] == "paused", r


def stop(api, sid):
    r = api.request("POST", "/v1/sandboxes/%s/stop?wait=true" % sid, None)
    assert r.status == 200 and r.json["state"] == "stopped", r


def out(api, sid, cmd):
    r = api.exec_ok(sid, cmd=cmd)
    assert r["exit_code"] == 0, r
    return r["stdout"]


def pool_dir(hutchd, area=None):
    p = os.path.join(hutchd.data_dir, "pool")
    return os.path.join(p, area) if area else p


# -- the pool ------------------------------------------------------------------


def test_pool_is_btrfs_on_a_loop_image_hutchd_made(hutchd, api):
    r = api.request("GET", "/v1/storage")
    assert r.status == 200, r
    s = r.json
    assert s["backend"] == "btrfs" and s["quotas"] is True, s
    assert s["image"] == os.path.join(os.path.realpath(hutchd.data_dir), "pool.img"), s
    assert s["size_bytes"] > 0 and 0 < s["used_bytes"] < s["size_bytes"], s
    mounts = hostutil.mounts_under([pool_dir(hutchd)])
    assert any(" btrfs " in m for m in mounts), mounts
    assert hostutil.loop_devices_under(hutchd.data_dir), "no loop device backs the pool"


def test_sandbox_root_is_a_snapshot_of_its_template(hutchd, api, make_sandbox):
    sb = make_sandbox(template="busybox")
    root = os.path.join(pool_dir(hutchd, "rootfs"), sb["id"])
    info = subprocess.run(["btrfs", "subvolume", "show", root], capture_output=True, text=True)
    assert info.returncode == 0, info.stderr
    tpl = subprocess.run(["btrfs", "subvolume", "show", os.path.join(pool_dir(hutchd, "templates"), "busybox")],
                         capture_output=True, text=True).stdout
    tpl_uuid = [l.split()[-1] for l in tpl.splitlines() if l.strip().startswith("UUID:")][0]
    parent = [l.split()[-1] for l in info.stdout.splitlines() if "Parent UUID" in l][0]
    assert parent == tpl_uuid, (info.stdout, tpl)
    assert "readonly" in tpl  # templates are sealed
    assert out(api, sb["id"], "cat /etc/hostname").strip() == sb["id"].replace("_", "-")


def test_delete_removes_the_root_subvolume(hutchd, api):
    sb = api.create_ok(template="busybox")
    root = os.path.join(pool_dir(hutchd, "rootfs"), sb["id"])
    assert os.path.isdir(root)
    api.delete_ok(sb["id"])
    assert not os.path.exists(root)


def test_failed_create_leaves_no_subvolume(start_hutchd, leaks):
    d = start_hutchd(env={"HUTCH_FAULT": "create.shim"})
    before = leaks.snapshot(d)
    r = d.client().create(template="busybox")
    assert r.status == 500, r
    leaks.assert_same(before, d)


def test_pool_restart_adopts_the_mounted_pool(start_hutchd):
    d = start_hutchd()
    c = d.client()
    sb = c.create_ok(template="busybox")
    c.exec_ok(sb["id"], cmd="echo kept > /root/f")
    d.kill()
    d.start()
    assert c.exec_ok(sb["id"], cmd="cat /root/f")["stdout"] == "kept\n"


def test_pool_image_grows_when_the_size_grows(start_hutchd):
    d = start_hutchd(args=["--storage-size", "2G"])
    c = d.client()
    size1 = c.request("GET", "/v1/storage").json["size_bytes"]
    assert 1.5 * 2**30 < size1 <= 2 * 2**30, size1
    d.stop()
    d.args = ["--storage-size", "3G"]
    d.start()
    size2 = c.request("GET", "/v1/storage").json["size_bytes"]
    assert size2 > size1 + 2**29, (size1, size2)
    assert os.path.getsize(os.path.join(d.data_dir, "pool.img")) == 3 * 2**30


def test_data_dir_on_btrfs_needs_no_image(start_hutchd, tmp_path):
    img = tmp_path / "fs.img"
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with open(img, "wb") as f:
        f.truncate(1 << 30)
    subprocess.run(["mkfs.btrfs", "-q", str(img)], check=True)
    subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], check=True)
    try:
        data = mnt / "data"
        data.mkdir()
        d = start_hutchd(args=["--data-dir", str(data)])
        c = d.client()
        s = c.request("GET", "/v1/storage").json
        assert s["backend"] == "btrfs" and s["image"] is None, s
        assert s["quotas"] is False, s  # not enabled on a filesystem hutchd does not own
        sb = c.create_ok(template="busybox")
        snap = snap_of(c, sb["id"])
        assert snap["state"] == "ready"
        assert d.shutdown() == []
        d.expect_exit = True  # stopped here, before the filesystem goes
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


# -- templates -----------------------------------------------------------------


def test_templates_list_has_host_and_busybox(api):
    r = api.request("GET", "/v1/templates")
    assert r.status == 200, r
    names = {t["name"]: t for t in r.json["templates"]}
    assert names["host"]["state"] == "ready" and names["busybox"]["state"] == "ready", names
    r = api.request("GET", "/v1/templates/busybox")
    assert r.status == 200 and r.json["source"]["source"] == "busybox", r
    assert api.request("GET", "/v1/templates/nope").status == 404


def test_busybox_sandbox_runs_busybox(make_sandbox, api):
    sb = make_sandbox(template="busybox")
    r = api.exec_ok(sb["id"], cmd="ls -l /bin/sh && echo ok")
    assert r["exit_code"] == 0 and "busybox" in r["stdout"] and r["stdout"].endswith("ok\n"), r


@pytest.mark.parametrize("body,status,needle", [
    ({}, 400, "name"),
    ({"name": "x"}, 400, "source"),
    ({"name": "Bad Name", "source": "busybox"}, 400, "name"),
    ({"name": ".hidden", "source": "busybox"}, 400, "name"),
    ({"name": "x", "source": "windows"}, 400, "source"),
    ({"name": "x", "source": "busybox", "extra": 1}, 400, "extra"),
    ({"name": "x", "source": "debian", "packages": ["ok", "bad;rm"]}, 400, "packages[1]"),
    ({"name": "x", "source": "debian", "packages": "python3"}, 400, "packages"),
    ({"name": "x", "source": "debian", "suite": "../x"}, 400, "suite"),
    ({"name": "x", "source": "debian", "mirror": "ftp://x"}, 400, "mirror"),
    ({"name": "x", "source": "oci", "path": "relative.tar"}, 400, "path"),
    ({"name": "x", "source": "oci", "path": "/nonexistent/image.tar"}, 400, "path"),
    ({"name": "x", "source": "snapshot", "snapshot": "snap_doesnotexist"}, 404, "snap_doesnotexist"),
    ({"name": "x", "source": "snapshot"}, 400, "snapshot"),
])
def test_template_create_bad_input(api, body, status, needle):
    r = api.request("POST", "/v1/templates", body)
    assert r.status == status and needle in r.json["error"]["message"], r
    assert api.request("GET", "/v1/templates/x").status == 404


def test_template_rebuild_and_delete(api):
    r = api.request("POST", "/v1/templates?wait=true", {"name": "bb2", "source": "busybox"}, timeout=120)
    assert r.status == 201 and r.json["state"] == "ready", r
    sb = api.create_ok(template="bb2")
    api.delete_ok(sb["id"])
    assert api.request("DELETE", "/v1/templates/bb2").status == 204
    assert api.request("DELETE", "/v1/templates/bb2").status == 404
    r = api.create(template="bb2")
    assert r.status == 404 and "bb2" in r.json["error"]["message"], r


def _tar_bytes(entries):
    """entries: (name, kind, data_or_target, mode)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, kind, data, mode in entries:
            ti = tarfile.TarInfo(name)
            ti.mode = mode
            ti.mtime = 1700000000
            if kind == "dir":
                ti.type = tarfile.DIRTYPE
                t.addfile(ti)
            elif kind == "sym":
                ti.type = tarfile.SYMTYPE
                ti.linkname = data
                t.addfile(ti)
            else:
                ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def make_docker_save(path, with_escape=False):
    busybox = open("/bin/busybox", "rb").read()
    l1 = [("bin", "dir", None, 0o755), ("bin/busybox", "file", busybox, 0o755), ("bin/sh", "sym", "busybox", 0o777),
          ("bin/cat", "sym", "busybox", 0o777), ("bin/ls", "sym", "busybox", 0o777),
          ("bin/env", "sym", "busybox", 0o777), ("bin/pwd", "sym", "busybox", 0o777),
          ("etc", "dir", None, 0o755), ("etc/hello", "file", b"from layer 1\n", 0o644),
          ("etc/gone", "file", b"deleted by layer 2\n", 0o644),
          ("opq", "dir", None, 0o755), ("opq/old", "file", b"hidden by opaque\n", 0o644),
          ("app", "dir", None, 0o755)]
    if with_escape:
        l1 += [("escape", "sym", "/", 0o777)]
    l2 = [("etc/.wh.gone", "file", b"", 0o644), ("opq/.wh..wh..opq", "file", b"", 0o644),
          ("opq/new", "file", b"layer 2\n", 0o644), ("etc/hello2", "file", b"from layer 2\n", 0o644)]
    if with_escape:
        l2 += [("escape/tmp/hutch-oci-escaped", "file", b"pwned\n", 0o644)]
    layers = [_tar_bytes(l1), _tar_bytes(l2)]
    config = {"architecture": "amd64", "os": "linux",
              "config": {"Env": ["PATH=/bin", "GREETING=hello-from-image"], "WorkingDir": "/app",
                         "Entrypoint": ["/bin/sh"], "Cmd": ["-c", "echo hi"]},
              "rootfs": {"type": "layers",
                         "diff_ids": ["sha256:" + hashlib.sha256(l).hexdigest() for l in layers]}}
    outer = [("config.json", "file", json.dumps(config).encode(), 0o644)]
    names = []
    for i, l in enumerate(layers):
        n = "layer%d/layer.tar" % i
        outer += [("layer%d" % i, "dir", None, 0o755), (n, "file", l, 0o644)]
        names.append(n)
    outer.append(("manifest.json", "file",
                  json.dumps([{"Config": "config.json", "RepoTags": ["test/img:1"], "Layers": names}]).encode(),
                  0o644))
    with open(path, "wb") as f:
        f.write(_tar_bytes(outer))


def test_oci_image_import(api, make_sandbox, tmp_path):
    path = str(tmp_path / "img.tar")
    make_docker_save(path)
    r = api.request("POST", "/v1/templates?wait=true", {"name": "img", "source": "oci", "path": path}, timeout=300)
    assert r.status == 201 and r.json["state"] == "ready", r
    cfg = r.json["config"]
    assert cfg["env"]["GREETING"] == "hello-from-image" and cfg["cwd"] == "/app", cfg
    assert cfg["entrypoint"] == ["/bin/sh"] and cfg["cmd"] == ["-c", "echo hi"], cfg
    sb = make_sandbox(template="img")
    assert out(api, sb["id"], "cat /etc/hello /etc/hello2") == "from layer 1\nfrom layer 2\n"
    r = api.exec_ok(sb["id"], cmd="ls /etc/gone; ls /opq")
    assert "No such file" in r["stderr"] and r["stdout"].split() == ["new"], r  # whiteout, opaque dir
    # The image's defaults: its env and working directory.
    assert out(api, sb["id"], "echo $GREETING; pwd") == "hello-from-image\n/app\n"
    assert api.request("DELETE", "/v1/templates/img").status in (204, 409)


def test_oci_import_cannot_write_outside_the_template(api, tmp_path):
    target = "/tmp/hutch-oci-escaped"
    if os.path.exists(target):
        os.unlink(target)
    path = str(tmp_path / "evil.tar")
    make_docker_save(path, with_escape=True)
    r = api.request("POST", "/v1/templates?wait=true", {"name": "evil", "source": "oci", "path": path}, timeout=300)
    # Either refused or confined to the template; never the host's /tmp.
    assert not os.path.exists(target), r
    if r.status == 201:
        api.request("DELETE", "/v1/templates/evil")
    # Positive control: the same path written through the host's "/" does land there.
    with open(os.path.join("/", "tmp/hutch-oci-escaped"), "w") as f:
        f.write("control")
    assert os.path.exists(target)
    os.unlink(target)


def test_oci_bad_archive_is_refused_and_leaves_nothing(hutchd, api, tmp_path, leaks):
    before = leaks.snapshot(hutchd)
    path = str(tmp_path / "junk.tar")
    with open(path, "wb") as f:
        f.write(b"this is not a tar archive" * 100)
    r = api.request("POST", "/v1/templates?wait=true", {"name": "junk", "source": "oci", "path": path}, timeout=120)
    assert r.status == 400, r
    t = api.request("GET", "/v1/templates/junk").json
    assert t["state"] == "failed" and t["error"], t
    leaks.assert_same(before, hutchd)
    assert not os.path.exists(os.path.join(pool_dir(hutchd, "templates"), "junk"))
    assert api.request("DELETE", "/v1/templates/junk").status == 204


def test_template_from_snapshot(api, make_sandbox):
    sb = make_sandbox(template="busybox")
    out(api, sb["id"], "echo baked > /root/baked")
    snap = snap_of(api, sb["id"])
    r = api.request("POST", "/v1/templates?wait=true", {"name": "baked", "source": "snapshot",
                                                         "snapshot": snap["id"]}, timeout=120)
    assert r.status == 201 and r.json["state"] == "ready", r
    sb2 = make_sandbox(template="baked")
    assert out(api, sb2["id"], "cat /root/baked; cat /etc/hostname") == "baked\n%s\n" % sb2["id"].replace("_", "-")


def test_host_template_snapshot_keeps_host_usr(api, make_sandbox):
    sb = make_sandbox()
    snap = snap_of(api, sb["id"])
    r = api.request("POST", "/v1/templates?wait=true", {"name": "hostish", "source": "snapshot",
                                                         "snapshot": snap["id"]}, timeout=120)
    assert r.status == 201, r
    sb2 = make_sandbox(template="hostish")
    assert out(api, sb2["id"], "python3 -c 'print(6*7)'") == "42\n"


@pytest.mark.skipif(os.environ.get("HUTCH_SKIP_DEBOOTSTRAP") == "1", reason="HUTCH_SKIP_DEBOOTSTRAP=1")
def test_debian_template_with_progress(api, make_sandbox):
    r = api.request("POST", "/v1/templates", {"name": "deb", "source": "debian", "suite": "bookworm",
                                              "packages": ["jq"]})
    assert r.status == 202 and r.json["state"] == "building", r
    assert api.request("POST", "/v1/templates", {"name": "deb", "source": "busybox"}).status == 409
    seen = set()
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        t = api.request("GET", "/v1/templates/deb").json
        if t["progress"]["message"]:
            seen.add((t["progress"]["message"], t["progress"]["fraction"]))
        if t["state"] != "building":
            break
        time.sleep(0.5)
    assert t["state"] == "ready", t
    fractions = sorted({f for _, f in seen})
    assert len(seen) >= 3 and fractions[0] < 0.5, seen  # progress was visible while it ran
    sb = make_sandbox(template="deb")
    assert out(api, sb["id"], "cat /etc/debian_version").startswith("12")
    assert out(api, sb["id"], "echo '{\"a\":42}' | jq .a") == "42\n"


# -- snapshots -------------------------------------------------------------------


def test_snapshot_create_list_get_delete(api, make_sandbox):
    sb = make_sandbox(template="busybox")
    s = snap_of(api, sb["id"], labels={"step": "one"})
    assert s["id"].startswith("snap_") and s["sandbox"] == sb["id"] and s["state"] == "ready", s
    assert s["kind"] == "manual" and s["labels"] == {"step": "one"} and s["template"] == "busybox", s
    assert s["operation"]["state"] == "succeeded", s
    s2 = snap_of(api, sb["id"])
    assert s2["parent"] == s["id"], s2  # incremental to the previous one
    lst = api.request("GET", "/v1/sandboxes/%s/snapshots" % sb["id"]).json["snapshots"]
    assert [x["id"] for x in lst] == [s["id"], s2["id"]], lst
    assert api.request("GET", "/v1/snapshots/" + s["id"]).json["id"] == s["id"]
    assert api.request("GET", "/v1/sandboxes/%s/snapshots/%s" % (sb["id"], s["id"])).status == 200
    all_ = api.request("GET", "/v1/snapshots?sandbox=" + sb["id"]).json["snapshots"]
    assert len(all_) == 2
    assert api.request("DELETE", "/v1/sandboxes/%s/snapshots/%s" % (sb["id"], s["id"])).status == 204
    assert api.request("GET", "/v1/snapshots/" + s["id"]).status == 404
    assert api.request("DELETE", "/v1/snapshots/" + s["id"]).status == 404


def test_snapshot_bad_input(api, make_sandbox):
    sb = make_sandbox(template="busybox")
    other = make_sandbox(template="busybox")
    s = snap_of(api, sb["id"])
    assert api.request("POST", "/v1/sandboxes/sb_nope/snapshots", {}).status == 404
    r = api.request("POST", "/v1/sandboxes/%s/snapshots" % sb["id"], {"labels": {"bad key!": "x"}})
    assert r.status == 400, r
    r = api.request("POST", "/v1/sandboxes/%s/snapshots" % sb["id"], {"colour": "red"})
    assert r.status == 400 and "colour" in r.json["error"]["message"], r
    assert api.request("GET", "/v1/snapshots/snap_unknown").status == 404
    # A snapshot asked for under the wrong sandbox is not found there.
    assert api.request("GET", "/v1/sandboxes/%s/snapshots/%s" % (other["id"], s["id"])).status == 404
    assert api.request("GET", "/v1/sandboxes/sb_nope/snapshots").status == 404
    assert api.request("GET", "/v1/snapshots?kind=weird").status == 400


def test_snapshot_stores_only_changes(hutchd, api, make_sandbox):
    sb = make_sandbox(template="busybox", resources={"disk_mib": 1024})
    out(api, sb["id"], "dd if=/dev/urandom of=/root/big bs=1M count=64 2>/dev/null")
    first = snap_of(api, sb["id"])
    used = lambda: api.request("GET", "/v1/storage?sync=true").json["used_bytes"]
    u0 = used()
    out(api, sb["id"], "dd if=/dev/urandom of=/root/big bs=1M count=1 seek=10 conv=notrunc 2>/dev/null")
    s = snap_of(api, sb["id"])
    u1 = used()
    assert s["parent"] == first["id"]
    # 1 MiB changed: the pool grew by about that, not by 64 MiB.
    assert u1 - u0 < 3 * 2**20, (u0, u1)


def test_snapshot_is_consistent_and_read_only(hutchd, api, make_sandbox):
    sb = make_sandbox(template="busybox")
    out(api, sb["id"], "echo before > /root/f")
    s = snap_of(api, sb["id"])
    out(api, sb["id"], "echo after > /root/f")
    path = os.path.join(pool_dir(hutchd, "snapshots"), s["id"], "root", "f")
    assert open(path).read() == "before\n"
    with pytest.raises(OSError):
        open(path, "w")


def test_snapshots_of_a_deleted_sandbox_remain_usable(api):
    sb = api.create_ok(template="busybox")
    out(api, sb["id"], "echo survives > /root/f")
    s = snap_of(api, sb["id"])
    api.delete_ok(sb["id"])
    assert api.request("GET", "/v1/snapshots/" + s["id"]).status == 200
    sb2 = api.create_ok(from_snapshot=s["id"])
    assert out(api, sb2["id"], "cat /root/f") == "survives\n"
    assert sb2["template"] == "busybox" and sb2["from_snapshot"] == s["id"], sb2
    api.delete_ok(sb2["id"])
    assert api.request("DELETE", "/v1/snapshots/" + s["id"]).status == 204


# -- rollback ----------------------------------------------------------------------


def test_rollback_of_a_running_sandbox_is_refused(api, make_sandbox):
    sb = make_sandbox(template="busybox")
    s = snap_of(api, sb["id"])
    r = api.request("POST", "/v1/sandboxes/%s/rollback" % sb["id"], {"snapshot": s["id"]})
    assert r.status == 409 and "running" in r.json["error"]["message"], r
    assert api.get(sb["id"]).json["state"] == "running"


def test_rollback_of_a_paused_sandbox_restarts_it_on_the_snapshot(api, make_sandbox):
    sb = make_sandbox(template="busybox")
    out(api, sb["id"], "echo v1 > /root/f")
    s = snap_of(api, sb["id"])
    out(api, sb["id"], "echo v2 > /root/f; echo new > /root/extra")
    r = api.request("POST", "/v1/sandboxes/%s/commands" % sb["id"], {"cmd": "sleep 1000"})
    assert r.status in (200, 201), r
    pause(api, sb["id"])
    r = api.request("POST", "/v1/sandboxes/%s/rollback?wait=true" % sb["id"], {"snapshot": s["id"]})
    assert r.status == 200 and r.json["state"] == "running", r
    assert out(api, sb["id"], "cat /root/f; ls /root") == "v1\nf\n"
    assert "sleep 1000" not in out(api, sb["id"], "ps")  # processes began again


def test_rollback_of_a_stopped_sandbox_keeps_it_stopped(api, make_sandbox):
    sb = make_sandbox(template="busybox")
    out(api, sb["id"], "echo v1 > /root/f")
    s = snap_of(api, sb["id"])
    out(api, sb["id"], "echo v2 > /root/f")
    stop(api, sb["id"])
    r = api.request("POST", "/v1/sandboxes/%s/rollback?wait=true" % sb["id"], {"snapshot": s["id"]})
    assert r.status == 200 and r.json["state"] == "stopped", r
    r = api.request("POST", "/v1/sandboxes/%s/start?wait=true" % sb["id"], None)
    assert r.status == 200, r
    assert out(api, sb["id"], "cat /root/f") == "v1\n"


def test_rollback_bad_input(api, make_sandbox):
    sb = make_sandbox(template="busybox")
    other = make_sandbox(template="busybox")
    s_other = snap_of(api, other["id"])
    pause(api, sb["id"])
    path = "/v1/sandboxes/%s/rollback" % sb["id"]
    r = api.request("POST", path, {})
    assert r.status == 400 and "snapshot" in r.json["error"]["message"], r
    r = api.request("POST", path, {"snapshot": "snap_unknown"})
    assert r.status == 404 and "snap_unknown" in r.json["error"]["message"], r
    r = api.request("POST", path, {"snapshot": s_other["id"]})
    assert r.status == 400 and other["id"] not in r.json["error"]["message"] or r.status == 400, r
    r = api.request("POST", path, {"snapshot": s_other["id"], "extra": 1})
    assert r.status == 400, r
    assert api.request("POST", "/v1/sandboxes/sb_nope/rollback", {"snapshot": "snap_x"}).status == 404
    assert api.get(sb["id"]).json["state"] == "paused"


# -- fork ----------------------------------------------------------------------------


def test_fork_makes_independent_copies_of_the_current_state(api, make_sandbox):
    parent = make_sandbox(template="busybox", labels={"team": "a"})
    out(api, parent["id"], "echo shared > /root/f")
    r = api.request("POST", "/v1/sandboxes/%s/fork?wait=true" % parent["id"], {"count": 3}, timeout=300)
    assert r.status == 201, r
    kids = r.json["sandboxes"]
    assert len(kids) == 3 and len({k["id"] for k in kids}) == 3, r
    try:
        assert r.json["snapshot"].startswith("snap_")
        for i, k in enumerate(kids):
            assert k["state"] == "running" and k["labels"] == {"team": "a"} and k["from_snapshot"] == r.json["snapshot"]
            assert out(api, k["id"], "cat /root/f") == "shared\n"
            out(api, k["id"], "echo kid%d > /root/f" % i)
        for i, k in enumerate(kids):
            assert out(api, k["id"], "cat /root/f") == "kid%d\n" % i
        assert out(api, parent["id"], "cat /root/f") == "shared\n"
    finally:
        for k in kids:
            api.delete(k["id"])


def test_fork_from_a_named_snapshot(api, make_sandbox):
    parent = make_sandbox(template="busybox")
    out(api, parent["id"], "echo old > /root/f")
    s = snap_of(api, parent["id"])
    out(api, parent["id"], "echo new > /root/f")
    r = api.request("POST", "/v1/sandboxes/%s/fork?wait=true" % parent["id"], {"count": 1, "snapshot": s["id"]})
    assert r.status == 201 and r.json["snapshot"] == s["id"], r
    kid = r.json["sandboxes"][0]
    assert out(api, kid["id"], "cat /root/f") == "old\n"
    api.delete(kid["id"])


@pytest.mark.parametrize("body,status", [
    ({"count": 0}, 400), ({"count": 1000}, 400), ({"count": -1}, 400), ({"count": "2"}, 400),
    ({"count": 1, "snapshot": "snap_unknown"}, 404), ({"count": 1, "bogus": True}, 400),
])
def test_fork_bad_input(api, sandbox, hutchd, body, status):
    before = api.list().json["sandboxes"]
    r = api.request("POST", "/v1/sandboxes/%s/fork" % sandbox["id"], body)
    assert r.status == status, r
    assert api.list().json["sandboxes"] == before


def test_fork_of_unknown_sandbox(api):
    assert api.request("POST", "/v1/sandboxes/sb_nope/fork", {"count": 1}).status == 404


def test_create_from_snapshot_bad_input(api, make_sandbox):
    r = api.create(from_snapshot="snap_unknown")
    assert r.status == 404 and "snap_unknown" in r.json["error"]["message"], r
    sb = make_sandbox(template="busybox")
    s = snap_of(api, sb["id"])
    r = api.create(from_snapshot=s["id"], template="host")
    assert r.status == 400 and "template" in r.json["error"]["message"], r


# -- automatic snapshots ------------------------------------------------------------


def test_automatic_snapshots_with_retention(api, make_sandbox):
    sb = make_sandbox(template="busybox", snapshots={"interval_s": 1, "keep_last": 2, "hourly": 0, "daily": 0})
    pol = api.request("GET", "/v1/sandboxes/%s/snapshot-policy" % sb["id"]).json
    assert pol == {"interval_s": 1, "keep_last": 2, "hourly": 0, "daily": 0, "keep_full": 3}, pol
    for i in range(4):
        out(api, sb["id"], "echo %d > /root/f" % i)
        time.sleep(1.5)
    autos = api.request("GET", "/v1/snapshots?sandbox=%s&kind=auto" % sb["id"]).json["snapshots"]
    assert 1 <= len(autos) <= 2, autos  # taken, and the older ones retired
    # Unchanged root: the list settles and then stays put.  (A change is seen
    # once btrfs commits it, at most 5 s later, and retention thins on the
    # tick after a snapshot.)
    autos_of = lambda: [s["id"] for s in api.request(
        "GET", "/v1/snapshots?sandbox=%s&kind=auto" % sb["id"]).json["snapshots"]]
    last, since, deadline = autos_of(), time.monotonic(), time.monotonic() + 30
    while time.monotonic() - since < 7:
        assert time.monotonic() < deadline, "automatic snapshots still changing after 30 s: %r" % last
        time.sleep(0.5)
        now = autos_of()
        if now != last:
            last, since = now, time.monotonic()
    assert 1 <= len(last) <= 2, last
    # Turned off per sandbox.
    r = api.request("PUT", "/v1/sandboxes/%s/snapshot-policy" % sb["id"], {"interval_s": 0})
    assert r.status == 200 and r.json["interval_s"] == 0, r


def test_deleting_a_sandbox_drops_its_automatic_snapshots_only(api):
    sb = api.create_ok(template="busybox", snapshots={"interval_s": 1, "keep_last": 5})
    out(api, sb["id"], "echo x > /root/f")
    manual = snap_of(api, sb["id"])
    assert hostutil.wait_until(lambda: api.request("GET", "/v1/snapshots?sandbox=%s&kind=auto" % sb["id"])
                               .json["snapshots"], 10, what="an automatic snapshot")
    api.delete_ok(sb["id"])
    left = api.request("GET", "/v1/snapshots?sandbox=" + sb["id"]).json["snapshots"]
    assert [s["id"] for s in left] == [manual["id"]], left
    api.request("DELETE", "/v1/snapshots/" + manual["id"])


@pytest.mark.parametrize("body", [
    {"interval_s": -1}, {"interval_s": "5"}, {"keep_last": 10001}, {"hourly": -2}, {"weekly": 1}, [],
])
def test_snapshot_policy_bad_input(api, sandbox, body):
    r = api.request("PUT", "/v1/sandboxes/%s/snapshot-policy" % sandbox["id"], body)
    assert r.status == 400, r
    r = api.create(template="busybox", snapshots=body)
    assert r.status == 400, r


# -- export / import ---------------------------------------------------------------


def export(api, snap_id, query=""):
    r = api.raw("GET", "/v1/snapshots/%s/export%s" % (snap_id, query), timeout=300)
    assert r.status == 200, r
    return r.raw


def import_(api, blob):
    return api.raw("POST", "/v1/snapshots/import", blob, {"Content-Type": "application/octet-stream"},
                   timeout=300)


def test_export_import_round_trip_and_incremental(hutchd, api, make_sandbox):
    sb = make_sandbox(template="busybox", resources={"disk_mib": 1024})
    out(api, sb["id"], "dd if=/dev/urandom of=/root/big bs=1M count=16 2>/dev/null; echo one > /root/f")
    s1 = snap_of(api, sb["id"])
    out(api, sb["id"], "dd if=/dev/urandom of=/root/big bs=1M count=1 seek=3 conv=notrunc 2>/dev/null; "
                       "echo two > /root/f")
    s2 = snap_of(api, sb["id"])
    full1 = export(api, s1["id"])
    inc2 = export(api, s2["id"], "?incremental=true")
    full2 = export(api, s2["id"])
    assert full1.startswith(b"HUTCHSNAP\n")
    assert len(inc2) < 3 * 2**20 < 16 * 2**20 < len(full2), (len(inc2), len(full2))
    # Gone from this host, then back from the streams (parent first).
    for s in (s2, s1):
        assert api.request("DELETE", "/v1/snapshots/" + s["id"]).status == 204
    r = import_(api, inc2)
    assert r.status == 409 and s1["id"] in r.json["error"]["message"], r  # its parent is missing
    r = import_(api, full1)
    assert r.status == 201 and r.json["id"] == s1["id"] and r.json["kind"] == "imported", r
    r = import_(api, inc2)
    assert r.status == 201 and r.json["id"] == s2["id"] and r.json["parent"] == s1["id"], r
    assert import_(api, inc2).status == 409  # already here
    sb2 = api.create_ok(from_snapshot=s2["id"])
    try:
        assert out(api, sb2["id"], "cat /root/f; wc -c < /root/big") == "two\n16777216\n"
    finally:
        api.delete(sb2["id"])


def test_corrupted_import_is_rejected_and_leaves_nothing(hutchd, api, make_sandbox, leaks):
    sb = make_sandbox(template="busybox")
    out(api, sb["id"], "echo data > /root/f")
    s = snap_of(api, sb["id"])
    blob = export(api, s["id"])
    assert api.request("DELETE", "/v1/snapshots/" + s["id"]).status == 204
    before = leaks.snapshot(hutchd)
    bad = [blob[:len(blob) // 2], blob[:-1], b"X" + blob[1:], blob + b"junk", b"",
           blob[:100] + bytes([blob[100] ^ 1]) + blob[101:],
           blob[:-40] + bytes([blob[-40] ^ 0x80]) + blob[-39:]]
    for b in bad:
        r = import_(api, b)
        assert r.status == 400 and r.json["error"]["code"] == "invalid_archive", (len(b), r)
    assert api.request("GET", "/v1/snapshots/" + s["id"]).status == 404
    leaks.assert_same(before, hutchd)
    assert import_(api, blob).status == 201  # positive control: the intact stream imports


def test_export_bad_input(api, make_sandbox):
    sb = make_sandbox(template="busybox")
    s = snap_of(api, sb["id"])
    assert api.raw("GET", "/v1/snapshots/snap_unknown/export").status == 404
    assert api.raw("GET", "/v1/snapshots/%s/export?parent=snap_unknown" % s["id"]).status == 400


# -- quotas -----------------------------------------------------------------------------


def test_disk_quota_gives_edquot_inside_and_nothing_breaks_outside(api, make_sandbox):
    small = make_sandbox(template="busybox", resources={"disk_mib": 64})
    r = api.exec_ok(small["id"], cmd="dd if=/dev/zero of=/root/fill bs=1M count=200 2>&1; sync; echo rc=$?")
    assert "Disk quota exceeded" in r["stdout"] or "No space left" in r["stdout"], r
    size = int(out(api, small["id"], "wc -c < /root/fill"))
    assert size <= 80 * 2**20, size
    # The sandbox still works, and so do its neighbours and the daemon.
    assert out(api, small["id"], "rm /root/fill && echo ok > /root/f && cat /root/f") == "ok\n"
    big = make_sandbox(template="busybox", resources={"disk_mib": 1024})
    # Positive control: the same write with room to spare succeeds.
    r = api.exec_ok(big["id"], cmd="dd if=/dev/zero of=/root/fill bs=1M count=200 2>&1 && echo done")
    assert r["stdout"].endswith("done\n"), r
    assert api.healthz().status == 200


def test_sandbox_cannot_make_a_subvolume_to_escape_its_quota(api, make_sandbox, hutchd):
    sb = make_sandbox()  # host template: python3
    code = ("import fcntl,os,struct,errno\n"
            "fd=os.open('/root',os.O_RDONLY)\n"
            "a=bytearray(struct.pack('q4088s',0,b'escape'))\n"
            "try:\n fcntl.ioctl(fd,%d,a); print('created')\n"
            "except OSError as e: print(errno.errorcode[e.errno])\n" % BTRFS_IOC_SUBVOL_CREATE)
    r = api.exec_ok(sb["id"], argv=["python3", "-c", code])
    assert r["stdout"].strip() == "EPERM", r
    # Positive control: the same ioctl works on the pool outside the sandbox.
    d = os.path.join(pool_dir(hutchd, "staging"))
    fd = os.open(d, os.O_RDONLY)
    try:
        import fcntl
        import struct
        fcntl.ioctl(fd, BTRFS_IOC_SUBVOL_CREATE, bytearray(struct.pack("q4088s", 0, b"control")))
    finally:
        os.close(fd)
    assert os.path.isdir(os.path.join(d, "control"))
    subprocess.run(["btrfs", "subvolume", "delete", os.path.join(d, "control")], capture_output=True, check=True)


def test_metrics_report_disk_bytes(api, make_sandbox):
    sb = make_sandbox(template="busybox", resources={"disk_mib": 1024})
    out(api, sb["id"], "dd if=/dev/urandom of=/root/f bs=1M count=20 2>/dev/null; sync")
    subprocess.run(["sync"])
    ok = hostutil.wait_until(
        lambda: api.request("GET", "/v1/sandboxes/%s/metrics" % sb["id"]).json["disk_bytes"] >= 20 * 2**20, 40,
        interval=1)
    assert ok, api.request("GET", "/v1/sandboxes/%s/metrics" % sb["id"]).json


# -- the overlay fallback ----------------------------------------------------------------


def test_overlay_backend_has_the_same_api(start_hutchd):
    d = start_hutchd(args=["--storage", "overlay"])
    c = d.client()
    s = c.request("GET", "/v1/storage").json
    assert s["backend"] == "overlay" and s["quotas"] is False and s["image"] is None, s
    sb = c.create_ok(template="busybox")
    c.exec_ok(sb["id"], cmd="echo v1 > /root/f")
    snap = snap_of(c, sb["id"])
    c.exec_ok(sb["id"], cmd="echo v2 > /root/f")
    pause(c, sb["id"])
    r = c.request("POST", "/v1/sandboxes/%s/rollback?wait=true" % sb["id"], {"snapshot": snap["id"]})
    assert r.status == 200, r
    assert c.exec_ok(sb["id"], cmd="cat /root/f")["stdout"] == "v1\n"
    r = c.request("POST", "/v1/sandboxes/%s/fork?wait=true" % sb["id"], {"count": 2}, timeout=300)
    assert r.status == 201, r
    for k in r.json["sandboxes"]:
        assert c.exec_ok(k["id"], cmd="cat /root/f")["stdout"] == "v1\n"
    r = c.raw("GET", "/v1/snapshots/%s/export" % snap["id"])
    assert r.status == 501, r


def test_symlinks_planted_in_a_snapshot_cannot_make_hutchd_write_the_host(hutchd, api, make_sandbox, tmp_path):
    """docs/storage.md: hutchd writes into a root made from a snapshot (its
    /etc/hostname and /etc/hosts, a template's stamp) only with in-root
    resolution, because that root is the sandbox's own work."""
    sentinel = tmp_path / "host-dir"
    sentinel.mkdir()
    sb = make_sandbox(template="busybox")
    out(api, sb["id"], "rm -rf /etc && ln -s %s /etc && ln -s %s/stamp /.hutch-template.new && "
                       "mv /.hutch-template.new /.hutch-template; echo ok" % (sentinel, sentinel))
    snap = snap_of(api, sb["id"])
    # Positive control: the naive host path of the snapshot's /etc leads to
    # the host directory.
    snap_etc = os.path.join(pool_dir(hutchd, "snapshots"), snap["id"], "etc")
    assert os.path.realpath(snap_etc) == str(sentinel)
    kid = api.create(from_snapshot=snap["id"])
    r = api.request("POST", "/v1/templates?wait=true", {"name": "planted", "source": "snapshot",
                                                         "snapshot": snap["id"]}, timeout=120)
    assert os.listdir(sentinel) == [], os.listdir(sentinel)
    if kid.status in (200, 201):
        api.delete(kid.json["id"])
    if r.status == 201:
        api.request("DELETE", "/v1/templates/planted")


def test_a_pool_keeps_the_backend_it_was_made_with(start_hutchd):
    d = start_hutchd()
    assert d.client().request("GET", "/v1/storage").json["backend"] == "btrfs"
    d.stop()
    d.args = ["--storage", "overlay"]
    d.start()
    assert d.client().request("GET", "/v1/storage").json["backend"] == "btrfs"


def test_a_failed_rebuild_keeps_the_previous_build(api, tmp_path):
    r = api.request("POST", "/v1/templates?wait=true", {"name": "keepme", "source": "busybox"}, timeout=120)
    assert r.status == 201, r
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"not a tar" * 200)
    r = api.request("POST", "/v1/templates?wait=true", {"name": "keepme", "source": "oci", "path": str(junk)},
                    timeout=120)
    assert r.status == 400, r
    t = api.request("GET", "/v1/templates/keepme").json
    assert t["state"] == "ready" and "previous build is kept" in t["error"], t
    sb = api.create_ok(template="keepme")
    assert out(api, sb["id"], "echo still") == "still\n"  # the busybox build
    api.delete_ok(sb["id"])
    assert api.request("DELETE", "/v1/templates/keepme").status == 204
