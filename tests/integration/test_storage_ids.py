"""Files a sandbox writes are stored under unprivileged "storage ids" on the
host (container id c -> 134217728 + c): a setuid-root binary made inside is
not a setuid-root binary on the host."""

import os
import stat

STORAGE_BASE = 134217728


def host_path(hutchd, sid, rel):
    root = os.path.join(hutchd.data_dir, "pool", "rootfs", sid)
    if os.path.isdir(os.path.join(root, "upper")) and os.path.isdir(os.path.join(root, "work")):
        root = os.path.join(root, "upper")  # overlay backend
    return os.path.join(root, rel)


def test_setuid_root_file_made_inside_is_not_root_owned_on_host(hutchd, api, make_sandbox):
    s = make_sandbox()
    r = api.exec(s["id"], cmd="cp /bin/true /root/suid && chmod 4755 /root/suid && stat -c '%u %a' /root/suid")
    assert r.status == 200 and r.json["exit_code"] == 0, r
    # Inside: root-owned and setuid, as the sandbox asked.
    assert r.json["stdout"].split() == ["0", "4755"], r
    st = os.lstat(host_path(hutchd, s["id"], "root/suid"))
    # The same file on the host: still setuid (positive control: we look at
    # the right file), but owned by the storage id of container root.
    assert st.st_mode & stat.S_ISUID
    assert st.st_uid == STORAGE_BASE and st.st_gid == STORAGE_BASE, (st.st_uid, st.st_gid)


def test_container_ids_map_one_to_one(hutchd, api, make_sandbox):
    s = make_sandbox()
    r = api.exec(s["id"], cmd="touch /root/f && chown 1000:100 /root/f && stat -c '%u %g' /root/f")
    assert r.status == 200 and r.json["stdout"].split() == ["1000", "100"], r
    st = os.lstat(host_path(hutchd, s["id"], "root/f"))
    assert (st.st_uid, st.st_gid) == (STORAGE_BASE + 1000, STORAGE_BASE + 100)


def test_template_is_never_written(hutchd, api, make_sandbox):
    s = make_sandbox()
    tpl = os.path.join(hutchd.data_dir, "pool", "templates", "host", "etc", "passwd")
    before = open(tpl, "rb").read()
    r = api.exec(s["id"], cmd="echo evil:x:0:0::/:/bin/sh >> /etc/passwd && tail -1 /etc/passwd")
    assert r.status == 200 and r.json["stdout"] == "evil:x:0:0::/:/bin/sh\n", r
    assert open(tpl, "rb").read() == before
    # The change lives in the sandbox's own layer.
    assert b"evil" in open(host_path(hutchd, s["id"], "etc/passwd"), "rb").read()
