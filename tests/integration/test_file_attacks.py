"""Path attacks on the Files API (docs/api.md "Files", docs/threat-model.md):
`..` and absolute paths, symlinks to host-looking paths and to
/proc/*/root, uploads through a symlinked parent, tar archives with `..`,
absolute names and a symlink followed by a file written through it, and a
directory swapped for a symlink 10,000 times while downloads and uploads run.

The host is watched with sentinels: a directory `/hutch-sentinel-<rand>`
holding a secret, and an empty `/tmp/outside-<rand>`, at the very paths the
attacks aim at inside the sandbox, so an escape would read the secret or
leave a file on the host.  The host's /etc/shadow is compared before and
after.  Where the attack has a legitimate twin (a symlink to a sandbox file,
a benign tar), that runs too, as the positive control."""

import io
import os
import secrets
import shutil
import tarfile
import threading
import time

import pytest


class HostSentinels:
    def __init__(self):
        tag = secrets.token_hex(6)
        self.secret = ("HOST-SECRET-%s" % secrets.token_hex(12)).encode()
        self.sdir = "/hutch-sentinel-%s" % tag  # holds f (the secret)
        self.outside = "/tmp/outside-%s" % tag  # must stay empty
        os.mkdir(self.sdir, 0o755)
        with open(os.path.join(self.sdir, "f"), "wb") as f:
            f.write(self.secret + b"\n")
        os.mkdir(self.outside, 0o777)
        self.shadow = self._file_state("/etc/shadow")
        self.before = self.state()

    @staticmethod
    def _file_state(p):
        try:
            st = os.lstat(p)
            with open(p, "rb") as f:
                return (st.st_mtime_ns, st.st_size, st.st_ino, f.read())
        except FileNotFoundError:
            return None

    def state(self):
        out = {}
        for d in (self.sdir, self.outside):
            for dirpath, dirnames, files in os.walk(d):
                for n in dirnames + files:
                    p = os.path.join(dirpath, n)
                    out[p] = self._file_state(p) if n in files else "dir"
        out["/etc/shadow"] = self._file_state("/etc/shadow")
        for p in ("/etc/evil", "/etc/evil-abs", "/evil-dotdot", "/root/evil-dotdot"):
            out[p] = os.path.lexists(p)
        return out

    def assert_untouched(self):
        now = self.state()
        assert now == self.before, "the HOST changed: %r" % (
            {k: (self.before.get(k), now.get(k)) for k in set(now) | set(self.before)
             if now.get(k) != self.before.get(k)},)

    def assert_not_leaked(self, resp):
        body = resp.raw or b""
        assert self.secret not in body, "host secret leaked through the API: %r" % (resp,)
        if self.shadow and len(self.shadow[3]) > 20:
            assert self.shadow[3] not in body, "the host's /etc/shadow leaked: %r" % (resp,)

    def cleanup(self):
        shutil.rmtree(self.sdir, ignore_errors=True)
        shutil.rmtree(self.outside, ignore_errors=True)


@pytest.fixture
def host():
    h = HostSentinels()
    try:
        yield h
        h.assert_untouched()
    finally:
        h.cleanup()


@pytest.fixture
def sb(make_sandbox):
    return make_sandbox()


def sh(api, sid, cmd):
    r = api.exec_ok(sid, cmd=cmd)
    assert r["exit_code"] == 0, "exec %r: %r" % (cmd, r)
    return r["stdout"]


def sandbox_file(api, sid, path):
    """The sandbox's own bytes at `path` (via exec), or None if absent."""
    r = api.exec_ok(sid, argv=["python3", "-c",
                               "import sys,os\n"
                               "p=sys.argv[1]\n"
                               "sys.stdout.write(open(p,'rb').read().hex() if os.path.isfile(p) else 'ABSENT')",
                               path])
    return None if r["stdout"] == "ABSENT" else bytes.fromhex(r["stdout"])


def assert_inside_or_refused(api, sid, host, resp, inside_path, what):
    """A download is refused (4xx) or returns the sandbox's own file."""
    host.assert_not_leaked(resp)
    if resp.status == 200:
        mine = sandbox_file(api, sid, inside_path)
        assert mine is not None and resp.raw == mine, \
            "%s: 200 with bytes that are not the sandbox's %s: %r" % (what, inside_path, resp)
    else:
        assert 400 <= resp.status < 500, "%s: %r" % (what, resp)


# -- `..` and absolute paths ----------------------------------------------------------


def test_dotdot_and_absolute_paths_stay_inside(api, sb, host):
    sid = sb["id"]
    sd = host.sdir
    # Positive control: `..` works, and is clamped at the sandbox's /.
    sh(api, sid, "echo inside > /root/inside.txt")
    for p in ("../root/inside.txt", "../../../../../root/inside.txt", "/../../root/inside.txt",
              "/tmp/../root/./inside.txt"):
        r = api.files_get(sid, p)
        assert r.status == 200 and r.raw == b"inside\n", (p, r)
    for p in ("../../../../etc/shadow", "/etc/shadow", "/../../../etc/shadow", "//etc//shadow",
              "/root/../../../../../../etc/shadow", "../../../.." + sd + "/f", sd + "/f",
              "/root/../.." + sd + "/f"):
        assert_inside_or_refused(api, sid, host, api.files_get(sid, p),
                                 "/etc/shadow" if "shadow" in p else sd + "/f", p)
        host.assert_not_leaked(api.files_stat(sid, p))
    # Now give the sandbox its own file at the sentinel's path: that one is served.
    sh(api, sid, "mkdir -p %s && echo sandbox-copy > %s/f" % (sd, sd))
    r = api.files_get(sid, "../../../.." + sd + "/f")
    assert r.status == 200 and r.raw == b"sandbox-copy\n", r
    # Writes land inside.
    r = api.files_put(sid, "../../../../.." + host.outside + "/evil", b"written", parents=True)
    assert r.status == 201, r
    assert sandbox_file(api, sid, host.outside + "/evil") == b"written"
    r = api.files_put(sid, sd + "/f", b"overwritten-inside")
    assert r.status == 201, r
    assert sandbox_file(api, sid, sd + "/f") == b"overwritten-inside"
    assert api.files_mkdir(sid, "../../.." + host.outside + "/newdir", parents=True).status == 201
    assert api.files_delete(sid, "../../.." + sd + "/f").status == 204  # the sandbox's copy
    sh(api, sid, "echo m > /tmp/m")  # (a move is a rename: same file system)
    assert api.files_move(sid, "/tmp/m", "../../.." + host.outside + "/moved").status == 200
    assert sandbox_file(api, sid, host.outside + "/moved") == b"m\n"
    host.assert_untouched()
    list_r = api.files_list(sid, "../../../..", depth=1)
    assert list_r.status == 200
    host.assert_not_leaked(list_r)


# -- symlinks to host-looking paths and magic links -------------------------------------------


def test_symlink_to_etc_shadow_and_sentinel(api, sb, host):
    sid = sb["id"]
    sd = host.sdir
    sh(api, sid, "echo real > /root/real.txt; ln -s /root/real.txt /root/ok; "
                 "ln -s /etc/shadow /root/shadow; ln -s %s/f /root/sent; "
                 "ln -s ../../../../../../..%s/f /root/sent-rel; ln -s %s /root/sentdir" % (sd, sd, sd))
    # Positive control: a symlink to a sandbox file is followed (inside).
    r = api.files_get(sid, "/root/ok")
    assert r.status == 200 and r.raw == b"real\n", r
    for p, inside in (("/root/shadow", "/etc/shadow"), ("/root/sent", sd + "/f"),
                      ("/root/sent-rel", sd + "/f"), ("/root/sentdir/f", sd + "/f")):
        assert_inside_or_refused(api, sid, host, api.files_get(sid, p), inside, p)
    # Writes through those links stay inside too.
    r = api.files_put(sid, "/root/sentdir/g", b"via-link")
    assert r.status in (201, 404), r
    sh(api, sid, "mkdir -p %s" % sd)
    r = api.files_put(sid, "/root/sentdir/g", b"via-link")
    assert r.status == 201, r
    assert sandbox_file(api, sid, sd + "/g") == b"via-link"
    r = api.files_get(sid, "/root/sent")
    assert_inside_or_refused(api, sid, host, r, sd + "/f", "/root/sent after mkdir")


@pytest.mark.parametrize("path", [
    "/proc/self/root/etc/shadow",
    "/proc/1/root/etc/shadow",
    "/proc/self/root/%(sd)s/f",
    "/proc/1/root/%(sd)s/f",
    "/proc/self/cwd/../../../../etc/shadow",
    "/root/p1/etc/shadow",
    "/root/p1/%(sd)s/f",
    "/root/pself/%(sd)s/f",
    "/root/pself-rel/%(sd)s/f",
])
def test_proc_root_links_are_refused_or_local(api, sb, host, path):
    sid = sb["id"]
    sd = host.sdir
    sh(api, sid, "ln -s /proc/1/root /root/p1; ln -s /proc/self/root /root/pself; "
                 "ln -s ../proc/self/root /root/pself-rel")
    p = path % {"sd": sd}
    r = api.files_get(sid, p)
    inside = "/etc/shadow" if p.endswith("shadow") else sd + "/f"
    assert_inside_or_refused(api, sid, host, r, inside, p)
    host.assert_not_leaked(api.files_stat(sid, p))
    # Writing through them: refused or inside.
    target = p.replace("/etc/shadow", host.outside + "/evil").replace(sd + "/f", host.outside + "/evil")
    r = api.files_put(sid, target, b"evil", parents=True)
    host.assert_not_leaked(r)
    assert r.status in (201, 400, 403, 404, 409), r
    host.assert_untouched()


# -- upload through a symlinked parent ---------------------------------------------------------


def test_upload_through_symlinked_parent(api, sb, host):
    sid = sb["id"]
    out = host.outside
    sh(api, sid, "mkdir -p %s && ln -s %s /root/link" % (out, out))
    r = api.files_put(sid, "/root/link/x", b"through-the-link")
    assert r.status == 201, r
    assert sh(api, sid, "cat %s/x" % out) == "through-the-link"
    assert os.listdir(out) == [], "the upload landed on the HOST: %r" % os.listdir(out)
    # With parents through the link, and a dangling link whose target only
    # exists on the host.
    r = api.files_put(sid, "/root/link/a/b/y", b"deep", parents=True)
    assert r.status == 201, r
    assert sh(api, sid, "cat %s/a/b/y" % out) == "deep"
    sh(api, sid, "ln -s %s /root/hostonly" % host.sdir)
    r = api.files_put(sid, "/root/hostonly/z", b"dangling")
    assert r.status == 404, r
    r = api.files_put(sid, "/root/hostonly/z", b"dangling", parents=True)
    assert r.status in (201, 404, 409), r
    if r.status == 201:
        assert sandbox_file(api, sid, host.sdir + "/z") == b"dangling"
    # mkdir, move and delete through the links: inside as well.
    assert api.files_mkdir(sid, "/root/link/made", parents=True).status == 201
    assert api.files_move(sid, "/root/link/x", "/root/link/x2").status == 200
    assert api.files_delete(sid, "/root/link/a", recursive=True).status == 204
    assert sh(api, sid, "ls %s" % out).split() == ["made", "x2"]
    host.assert_untouched()


# -- tar archives ---------------------------------------------------------------------------------


def _tar(entries):
    """(name, bytes) files, (name, None) dirs, (name, '->t') symlinks, (name, '=>t') hard links."""
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
            elif isinstance(data, str) and data.startswith("=>"):
                ti.type, ti.linkname = tarfile.LNKTYPE, data[2:]
                tf.addfile(ti)
            else:
                ti.size, ti.mode = len(data), 0o644
                tf.addfile(ti, io.BytesIO(data))
    return bio.getvalue()


def test_benign_tar_positive_control(api, sb):
    sid = sb["id"]
    r = api.files_tar_put(sid, "/root/tx", _tar([("d", None), ("d/f", b"ok"), ("l", "->d"), ("l2", "->d/f")]))
    assert r.status == 200, r
    assert sh(api, sid, "cat /root/tx/d/f /root/tx/l/f /root/tx/l2") == "okokok"


def test_tar_with_dotdot_entries(api, sb, host):
    sid = sb["id"]
    out = host.outside
    sh(api, sid, "mkdir -p %s /root/tx/inner" % out)
    body = _tar([("fine", b"fine"),
                 ("../evil-dotdot", b"evil"),
                 ("inner/../../evil-dotdot2", b"evil"),
                 ("../../../../../../.." + out + "/evil-tar", b"evil")])
    r = api.files_tar_put(sid, "/root/tx/inner", body)
    host.assert_not_leaked(r)
    assert r.status in (200, 400), r
    for p in ("/root/tx/evil-dotdot", "/root/tx/evil-dotdot2", "/root/evil-dotdot", "/evil-dotdot",
              out + "/evil-tar"):
        assert sandbox_file(api, sid, p) is None, "tar wrote %s in the sandbox" % p
    assert sh(api, sid, "find / -xdev -name 'evil-*' 2>/dev/null || true") == ""
    host.assert_untouched()


def test_tar_with_absolute_names(api, sb, host):
    sid = sb["id"]
    out = host.outside
    sh(api, sid, "mkdir -p %s" % out)
    etc_before = sh(api, sid, "ls -a /etc")
    body = _tar([("/etc/evil-abs", b"evil"), (out + "/evil-abs2", b"evil"), ("/root/evil-abs3", b"evil")])
    r = api.files_tar_put(sid, "/root/tabs", body)
    host.assert_not_leaked(r)
    assert r.status in (200, 400), r
    for p in ("/etc/evil-abs", out + "/evil-abs2", "/root/evil-abs3"):
        assert sandbox_file(api, sid, p) is None, "an absolute member was written at %s" % p
    assert sh(api, sid, "ls -a /etc") == etc_before
    # If accepted, the names were made relative: under the target directory.
    if r.status == 200:
        assert sandbox_file(api, sid, "/root/tabs/etc/evil-abs") == b"evil"
    host.assert_untouched()


def test_tar_symlink_then_write_through_it(api, sb, host):
    sid = sb["id"]
    out = host.outside
    sh(api, sid, "mkdir -p %s /root/tsym/in" % out)
    hostname = sandbox_file(api, sid, "/etc/hostname")
    etc_before = sh(api, sid, "ls -a /etc")
    body = _tar([("link", "->/etc"), ("link/evil", b"through /etc"),
                 ("olink", "->" + out), ("olink/evil2", b"through outside"),
                 ("up", "->../.."), ("up/evil3", b"through up"),
                 ("hl", "=>/etc/hostname"), ("hl", b"pwned-hostname"),
                 ("dl", None), ("dl", "->/etc"), ("dl/evil4", b"dir then link")])
    r = api.files_tar_put(sid, "/root/tsym/in", body)
    host.assert_not_leaked(r)
    assert r.status in (200, 400), r
    for p in ("/etc/evil", out + "/evil2", "/root/evil3", "/etc/evil4"):
        assert sandbox_file(api, sid, p) is None, "tar wrote through a symlink it made: %s" % p
    assert sh(api, sid, "ls -a /etc") == etc_before
    assert sandbox_file(api, sid, "/etc/hostname") == hostname, "tar wrote through a hard link"
    host.assert_untouched()


# -- the swap race ------------------------------------------------------------------------------------


SWAPPER = r"""
import os, sys, time
target, n_min, limit = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
os.chdir("/root/race")


def clear(d):
    # d may receive uploads (and their temporary files) at any moment.
    for _ in range(1000):
        try:
            for x in os.listdir(d):
                os.unlink(d + "/" + x)
            os.rmdir(d)
            return
        except FileNotFoundError:
            return
        except OSError:
            continue
    raise SystemExit("could not empty " + d)


# d alternates between a directory holding f ("ok") and a symlink to
# `target`, each state lasting a few system calls.
n = 0
end = time.time() + limit
while (n < n_min or not os.path.exists("/root/race-stop")) and time.time() < end:
    os.mkdir("d.new")                         # d: symlink (or absent at first)
    with open("d.new/.t", "w") as f:
        f.write("ok\n")
    os.rename("d.new/.t", "d.new/f")          # f is never seen half-written
    try:
        os.unlink("d")
    except FileNotFoundError:
        pass
    os.rename("d.new", "d")                   # d: directory
    clear("d.old")
    os.symlink(target, "d.lnk")
    os.rename("d", "d.old")
    os.rename("d.lnk", "d")                   # d: symlink
    n += 1
print(n)
"""


def test_swap_directory_for_symlink_while_transferring(api, sb, host):
    """A directory swapped for a symlink to a host-looking path 10,000+
    times while GETs and PUTs of d/f and d/g run: every answer is an error
    or the sandbox's own bytes; the host's secret never shows, the host's
    directory never gets a file."""
    sid = sb["id"]
    sd = host.sdir
    # The sandbox has its own file at the symlink's target: following the
    # link inside is legitimate and yields "inside".
    sh(api, sid, "mkdir -p /root/race %s && echo inside > %s/f" % (sd, sd))
    # Positive controls: both states serve their own file.
    sh(api, sid, "mkdir /root/race/d && echo ok > /root/race/d/f")
    assert api.files_get(sid, "/root/race/d/f").raw == b"ok\n"
    sh(api, sid, "rm -r /root/race/d && ln -s %s /root/race/d" % sd)
    assert api.files_get(sid, "/root/race/d/f").raw == b"inside\n"
    s = api.start_command_ok(sid, argv=["python3", "-c", SWAPPER, sd, "10000", "60"], timeout_s=90)
    seen = {}
    errors = []
    puts = 0
    t0 = time.monotonic()
    try:
        i = 0
        while i < 300 and time.monotonic() - t0 < 20:
            i += 1
            if i % 4 == 0:
                r = api.files_put(sid, "/root/race/d/g", b"race-put\n")
                host.assert_not_leaked(r)
                assert r.status in (201, 404, 409), r
                puts += r.status == 201
                continue
            r = api.files_get(sid, "/root/race/d/f")
            host.assert_not_leaked(r)
            if r.status == 200:
                assert r.raw in (b"ok\n", b"inside\n"), "a download returned foreign bytes: %r" % (r,)
                seen[r.raw] = seen.get(r.raw, 0) + 1
            else:
                assert r.status in (404, 409, 400), r
                errors.append(r.status)
            st = api.files_stat(sid, "/root/race/d/f")
            host.assert_not_leaked(st)
            assert st.status in (200, 404, 409, 400), st
    finally:
        sh(api, sid, "touch /root/race-stop")
    res = api.attach_all(sid, s["id"], timeout=90)
    assert res.exit["exit_code"] == 0, res
    swaps = int(res.stdout.split()[-1])
    assert swaps >= 10000, "only %d swaps" % swaps
    # The race was real: downloads met the swapped tree.
    assert sum(seen.values()) > 0, (seen, errors[:10], puts)
    assert not [n for n in os.listdir(sd) if n != "f"], "a PUT landed on the HOST: %r" % os.listdir(sd)
    host.assert_untouched()
    print("swap race: %d swaps, GET 200s %r, errors %d, PUT 201s %d, %.1fs" % (
        swaps, seen, len(errors), puts, time.monotonic() - t0))


def test_concurrent_swap_with_parallel_clients(api, sb, host):
    """The same race with four clients at once (the API serves them from
    several threads)."""
    sid = sb["id"]
    sd = host.sdir
    sh(api, sid, "mkdir -p /root/race %s && echo inside > %s/f" % (sd, sd))
    s = api.start_command_ok(sid, argv=["python3", "-c", SWAPPER, sd, "10000", "60"], timeout_s=90)
    bad = []
    stop = time.monotonic() + 10

    def worker():
        while time.monotonic() < stop and not bad:
            try:
                r = api.files_get(sid, "/root/race/d/f")
            except OSError as e:
                bad.append(repr(e))
                return
            if host.secret in r.raw or (r.status == 200 and r.raw not in (b"ok\n", b"inside\n")) or \
                    r.status not in (200, 400, 404, 409):
                bad.append(r)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    sh(api, sid, "touch /root/race-stop")
    res = api.attach_all(sid, s["id"], timeout=90)
    assert not bad, bad[:5]
    assert res.exit["exit_code"] == 0, res
    host.assert_untouched()
