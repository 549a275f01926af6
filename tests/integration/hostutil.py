"""Host-side helpers for the integration tests: processes, cgroups, mounts,
the leak snapshot, bounded waiting.  Stdlib only; Linux only; run as root."""

import errno
import os
import socket
import sqlite3
import subprocess
import time

HUTCH_PROCESS_NAMES = ("hutch-shim", "hutch-init", "hutch-gateway")
# The controllers hutch uses on cgroup v1 (docs: memory, pids, cpu, freezer).
V1_CONTROLLERS = ("memory", "pids", "cpu", "freezer")


def must_work():
    return os.environ.get("HUTCH_MUST_WORK") == "1"


def skip_or_fail(msg):
    """A host feature is missing: skip, unless HUTCH_MUST_WORK=1 (CI)."""
    import pytest

    if must_work():
        pytest.fail("HUTCH_MUST_WORK=1 and: " + msg)
    pytest.skip(msg)


def wait_until(fn, timeout, interval=0.05, what="condition"):
    """Poll fn() until it returns a truthy value or `timeout` seconds pass.
    Returns the last value (falsy on timeout); never waits longer."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v or time.monotonic() >= deadline:
            return v
        time.sleep(interval)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- processes ---------------------------------------------------------------


def read_file(path, mode="r"):
    try:
        with open(path, mode) as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
        return None
    except OSError as e:
        if e.errno in (errno.ESRCH, errno.ENOENT, errno.EINVAL):
            return None
        raise


def proc_cmdline(pid):
    raw = read_file("/proc/%d/cmdline" % pid, "rb")
    if raw is None:
        return None
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def proc_state(pid):
    """The one-letter state of /proc/<pid>/stat, or None if gone."""
    st = read_file("/proc/%d/stat" % pid)
    if st is None:
        return None
    return st[st.rindex(")") + 2]


def proc_alive(pid):
    """True if the process exists and is not a zombie."""
    s = proc_state(pid)
    return s is not None and s not in ("Z", "X")


def proc_status_ids(pid, field):
    """Uid/Gid line of /proc/<pid>/status as a list of 4 ints."""
    st = read_file("/proc/%d/status" % pid)
    if st is None:
        return None
    for line in st.splitlines():
        if line.startswith(field + ":"):
            return [int(x) for x in line.split()[1:]]
    return None


def all_pids():
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def hutch_processes():
    """{pid: 'argv0 args…'} for every hutch-shim / hutch-init process on the
    host (by argv[0] or by executable), zombies included."""
    out = {}
    for pid in all_pids():
        argv = proc_cmdline(pid)
        try:
            exe = os.readlink("/proc/%d/exe" % pid)
        except OSError:
            exe = ""
        names = [os.path.basename(argv[0]) if argv else "", os.path.basename(exe)]
        if any(n.startswith(h) for n in names for h in HUTCH_PROCESS_NAMES):
            out[pid] = " ".join(argv or [exe or "?"])[:300]
    return out


def proc_ppid(pid):
    st = read_file("/proc/%d/stat" % pid)
    if st is None:
        return None
    return int(st[st.rindex(")") + 2:].split()[1])


def instance_processes(d):
    """{pid: description} of the processes that belong to hutchd instance
    `d`: hutch-shim/hutch-init processes whose command line names the
    instance (its temporary root or instance id), everything in the
    instance's cgroups, every descendant of those, and hutch-shim/hutch-init
    descendants of hutchd.  Other hutch instances on the host (a developer's
    own daemon) are never counted."""
    named = hutch_processes()
    markers = [d.root] + ([d.instance] if d.instance else [])
    marked = {pid for pid, cmd in named.items() if any(m in cmd for m in markers)}
    if d.instance:
        marked |= instance_cgroup_procs(d.instance)
    parents = {}
    for pid in all_pids():
        pp = proc_ppid(pid)
        if pp is not None:
            parents[pid] = pp
    out = {}
    for pid in parents:
        chain, p = [], pid
        for _ in range(64):
            if p is None or p <= 1:
                break
            chain.append(p)
            p = parents.get(p)
        if pid in marked or any(a in marked for a in chain[1:]):
            out[pid] = named.get(pid) or "(descendant) " + " ".join(proc_cmdline(pid) or ["?"])[:300]
        elif pid in named and d.pid is not None and d.pid in chain[1:]:
            out[pid] = named[pid]
    out.pop(d.pid, None)
    return out


def kill_pid(pid, sig=9):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


# -- cgroups -----------------------------------------------------------------


def mountinfo():
    """Parsed /proc/self/mountinfo: list of dicts (mount_point, fstype, source, super_opts)."""
    res = []
    for line in read_file("/proc/self/mountinfo").splitlines():
        left, _, right = line.partition(" - ")
        lf = left.split()
        rf = right.split()
        res.append({
            "id": lf[0],
            "root": _unescape(lf[3]),
            "mount_point": _unescape(lf[4]),
            "fstype": rf[0] if rf else "",
            "source": _unescape(rf[1]) if len(rf) > 1 else "",
            "super_opts": rf[2] if len(rf) > 2 else "",
            "line": line,
        })
    return res


def _unescape(s):
    return s.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def cgroup_hierarchies():
    """[(mount_point, 'v1'|'v2', set(controllers))] of mounted cgroup hierarchies."""
    res = []
    for m in mountinfo():
        if m["fstype"] == "cgroup2":
            res.append((m["mount_point"], "v2", set()))
        elif m["fstype"] == "cgroup":
            opts = set(m["super_opts"].split(","))
            res.append((m["mount_point"], "v1", opts))
    return res


def host_cgroup_version():
    """'v2' if /sys/fs/cgroup itself is cgroup2, else 'v1' (legacy or hybrid)."""
    for m in mountinfo():
        if m["mount_point"] == "/sys/fs/cgroup":
            return "v2" if m["fstype"] == "cgroup2" else "v1"
    return "v1"


def instance_cgroup_parents(instance):
    """Every existing hutch-<instance> directory in every cgroup hierarchy
    (at the root of the hierarchy or one level below)."""
    name = "hutch-" + instance
    found = []
    for mp, _, _ in cgroup_hierarchies():
        cand = [os.path.join(mp, name)]
        try:
            for e in os.listdir(mp):
                p = os.path.join(mp, e)
                if os.path.isdir(p) and not e.startswith("hutch-"):
                    cand.append(os.path.join(p, name))
        except OSError:
            pass
        found.extend(c for c in cand if os.path.isdir(c))
    return sorted(set(found))


def instance_cgroup_dirs(instance):
    """All directories below the hutch-<instance> parents (the sandboxes'
    cgroups and anything under them), as absolute paths."""
    out = []
    for parent in instance_cgroup_parents(instance):
        for dirpath, dirnames, _ in os.walk(parent):
            for d in dirnames:
                out.append(os.path.join(dirpath, d))
    return sorted(out)


def sandbox_cgroup_dir(instance, sid, controller, version=None):
    """Path of a sandbox's cgroup in the hierarchy of `controller` per the
    documented layout: /sys/fs/cgroup/<ctrl>/hutch-<instance>/<id> on v1,
    /sys/fs/cgroup/hutch-<instance>/<id> on v2."""
    version = version or host_cgroup_version()
    if version == "v2":
        return "/sys/fs/cgroup/hutch-%s/%s" % (instance, sid)
    return "/sys/fs/cgroup/%s/hutch-%s/%s" % (controller, instance, sid)


def sandbox_cgroup_dirs_existing(instance, sid):
    return [d for d in instance_cgroup_dirs(instance) if os.path.basename(d) == sid]


def cgroup_procs(path):
    """Pids in the cgroup directory `path` and every cgroup below it."""
    pids = set()
    for dirpath, _, files in os.walk(path):
        txt = read_file(os.path.join(dirpath, "cgroup.procs"))
        if txt:
            pids.update(int(x) for x in txt.split())
    return pids


def instance_cgroup_procs(instance):
    pids = set()
    for parent in instance_cgroup_parents(instance):
        pids |= cgroup_procs(parent)
    return pids


# -- mounts, loop devices, rows ------------------------------------------------


def mounts_under(paths):
    """Sorted 'mount_point fstype source' for mounts that mention any of `paths`."""
    out = []
    for m in mountinfo():
        for p in paths:
            if p in m["mount_point"] or p in m["source"] or p in m["root"]:
                out.append("%s %s %s" % (m["mount_point"], m["fstype"], m["source"]))
                break
    return sorted(out)


def loop_devices_under(path):
    out = []
    base = "/sys/block"
    try:
        names = os.listdir(base)
    except OSError:
        return out
    for n in names:
        if not n.startswith("loop"):
            continue
        bf = read_file(os.path.join(base, n, "loop", "backing_file"))
        if bf and path in bf:
            out.append("%s %s" % (n, bf.strip()))
    return sorted(out)


def db_count(db_path, table="sandboxes"):
    """SELECT count(*) FROM table, read-only; a string describing the error
    if the database cannot be read (so that a snapshot still compares)."""
    if not os.path.exists(db_path):
        return "missing:" + db_path
    try:
        con = sqlite3.connect("file:%s?mode=ro" % db_path, uri=True, timeout=10)
        try:
            return con.execute("SELECT count(*) FROM %s" % table).fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error as e:
        return "error:%s" % e


def db_file_bytes(data_dir):
    """Concatenated bytes of state.db and its -wal/-journal files."""
    out = b""
    for suffix in ("", "-wal", "-journal", "-shm"):
        p = os.path.join(data_dir, "state.db" + suffix)
        b = read_file(p, "rb")
        if b:
            out += b
    return out


# -- the leak snapshot ---------------------------------------------------------


def snapshot(d):
    """Host resources that belong to hutchd instance `d` (a daemon.Hutchd),
    as a dict of comparable values."""
    s = {}
    s["cgroups"] = instance_cgroup_dirs(d.instance)
    sb = os.path.join(d.data_dir, "sandboxes")
    try:
        s["sandbox_dirs"] = sorted(os.listdir(sb))
    except FileNotFoundError:
        s["sandbox_dirs"] = []
    # The storage pool: sandbox roots, snapshots, half-made things.
    for area in ("rootfs", "snapshots", "staging"):
        try:
            s["pool_" + area] = sorted(os.listdir(os.path.join(d.data_dir, "pool", area)))
        except FileNotFoundError:
            s["pool_" + area] = []
    try:
        s["pool_template_builds"] = sorted(n for n in os.listdir(os.path.join(d.data_dir, "pool", "templates"))
                                           if n.startswith("."))
    except FileNotFoundError:
        s["pool_template_builds"] = []
    s["db_snapshot_rows"] = db_count(os.path.join(d.data_dir, "state.db"), "snapshots")
    run = []
    for dirpath, dirnames, files in os.walk(d.run_dir):
        for n in dirnames + files:
            run.append(os.path.relpath(os.path.join(dirpath, n), d.run_dir))
    s["run_dir"] = sorted(run)
    procs = instance_processes(d)
    s["processes"] = sorted("%d %s" % kv for kv in procs.items())
    s["mounts"] = mounts_under([d.data_dir, d.run_dir])
    s["loop_devices"] = loop_devices_under(d.data_dir)
    try:
        r = d.client().list()
        s["api_sandboxes"] = sorted(x["id"] for x in r.json["sandboxes"]) if r.status == 200 else \
            "status %d" % r.status
    except Exception as e:  # the comparison then shows the failure
        s["api_sandboxes"] = "error: %r" % (e,)
    s["db_sandbox_rows"] = db_count(os.path.join(d.data_dir, "state.db"))
    s["uid_claims"] = uid_claims(d.data_dir)
    return s


UID_LOCK_DIR = "/run/hutch/uids"


def uid_claims(data_dir):
    """Host-wide uid range claims (files in /run/hutch/uids) owned by the
    instance whose data directory is `data_dir`."""
    real = os.path.realpath(data_dir)
    out = []
    try:
        names = os.listdir(UID_LOCK_DIR)
    except FileNotFoundError:
        return out
    for n in names:
        c = read_file(os.path.join(UID_LOCK_DIR, n)) or ""
        if c.split(" ", 1)[0] == real:
            out.append("%s %s" % (n, c.strip()))
    return sorted(out)


def snapshot_diff(before, after):
    lines = []
    for k in before:
        b, a = before[k], after.get(k)
        if b == a:
            continue
        if isinstance(b, list) and isinstance(a, list):
            added = [x for x in a if x not in b]
            gone = [x for x in b if x not in a]
            lines.append("%s: +%r -%r" % (k, added, gone))
        else:
            lines.append("%s: %r -> %r" % (k, b, a))
    return "\n".join(lines)


class Leaks:
    """`before = leaks.snapshot(d)`; …; `leaks.assert_same(before, d)`."""

    def snapshot(self, d):
        return snapshot(d)

    def assert_same(self, before, d, timeout=5.0):
        """Asserts that the resources equal `before`, allowing `timeout`
        seconds for asynchronous exits (a detached shim's final exit)."""
        after = wait_until(lambda: (lambda s: s if s == before else None)(snapshot(d)), timeout,
                           interval=0.1)
        if after is None:
            after = snapshot(d)
            assert after == before, "host resources leaked (after vs before):\n" + \
                snapshot_diff(before, after)
        return after


# -- cleanup -------------------------------------------------------------------


def umount_lazy(path):
    subprocess.run(["umount", "-l", path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=20)


def safe_rmtree(path):
    """rm -rf that never crosses into another file system (a leftover bind
    mount of the host's /usr must not be emptied).  Returns True if `path`
    is gone."""
    try:
        dev = os.lstat(path).st_dev
    except FileNotFoundError:
        return True

    def rm(p):
        ok = True
        try:
            it = list(os.scandir(p))
        except OSError:
            return False
        for e in it:
            try:
                if e.is_dir(follow_symlinks=False):
                    if e.stat(follow_symlinks=False).st_dev != dev or os.path.ismount(e.path):
                        ok = False
                        continue
                    if rm(e.path):
                        os.rmdir(e.path)
                    else:
                        ok = False
                else:
                    os.unlink(e.path)
            except FileNotFoundError:
                pass
            except OSError:
                ok = False
        return ok

    if rm(path):
        try:
            os.rmdir(path)
            return True
        except OSError:
            return False
    return False


# -- lifecycle: what one sandbox holds on the host (docs/lifecycle.md) -----------
#
# The states table of docs/lifecycle.md, as host resources a leak snapshot
# sees.  "gone" is a deleted (or rolled-back) sandbox.

_LIVE = dict(cgroups=True, socket=True, processes=True, uid_claim=True, dir=True, row=True)
SANDBOX_FOOTPRINT = {
    "running": dict(_LIVE),
    "paused": dict(_LIVE),
    "stopped": dict(cgroups=False, socket=False, processes=False, uid_claim=True, dir=True, row=True),
    "suspended": dict(cgroups=False, socket=False, processes=False, uid_claim=False, dir=True, row=True),
    "error": dict(cgroups=False, socket=False, processes=False, uid_claim=False, dir=True, row=True),
    "gone": dict(cgroups=False, socket=False, processes=False, uid_claim=False, dir=False, row=False),
}


def db_rows(data_dir, table="sandboxes"):
    """{id: row dict} of a table of state.db, read-only ({} if missing)."""
    p = os.path.join(data_dir, "state.db")
    if not os.path.exists(p):
        return {}
    con = sqlite3.connect("file:%s?mode=ro" % p, uri=True, timeout=10)
    try:
        con.row_factory = sqlite3.Row
        return {r["id"]: dict(r) for r in con.execute("SELECT * FROM %s" % table)}
    finally:
        con.close()


def db_unfinished_operations(data_dir):
    """Operation rows still `pending` or `running`."""
    return sorted((o["id"], o["kind"], o["sandbox_id"], o["state"])
                  for o in db_rows(data_dir, "operations").values()
                  if o["state"] in ("pending", "running"))


def _ancestors(pid, parents):
    out, p = [], parents.get(pid)
    for _ in range(64):
        if p is None or p <= 1:
            break
        out.append(p)
        p = parents.get(p)
    return out


def sandbox_processes(d, sid, procs=None):
    """{pid: description} of instance `d`'s processes that belong to sandbox
    `sid`: its shim (the command line names the id), everything in its
    cgroups, and their descendants."""
    procs = instance_processes(d) if procs is None else procs
    roots = set()
    for pid in procs:
        if sid in " ".join(proc_cmdline(pid) or []):
            roots.add(pid)
    for cg in sandbox_cgroup_dirs_existing(d.instance, sid):
        roots |= cgroup_procs(cg)
    parents = {}
    for pid in all_pids():
        pp = proc_ppid(pid)
        if pp is not None:
            parents[pid] = pp
    return {pid: desc for pid, desc in procs.items()
            if pid in roots or any(a in roots for a in _ancestors(pid, parents))}


def sandbox_uid_claims(d, sid):
    return [c for c in uid_claims(d.data_dir) if c.split()[-1] == sid]


def sandbox_frozen(d, sid):
    """True/False: the sandbox's freezer cgroup is frozen; None: no cgroup."""
    if (d.health or {}).get("cgroup") == "v2":
        ev = read_file("/sys/fs/cgroup/hutch-%s/%s/cgroup.events" % (d.instance, sid))
        if ev is None:
            return None
        return "frozen 1" in ev.splitlines()
    st = read_file("/sys/fs/cgroup/freezer/hutch-%s/%s/freezer.state" % (d.instance, sid))
    if st is None:
        return None
    return st.strip() == "FROZEN"


def sandbox_cpu_usage_usec(d, sid):
    """CPU time of the sandbox's cgroup read on the host (µs), or None."""
    if (d.health or {}).get("cgroup") == "v2":
        st = read_file("/sys/fs/cgroup/hutch-%s/%s/cpu.stat" % (d.instance, sid))
        for line in (st or "").splitlines():
            k, _, v = line.partition(" ")
            if k == "usage_usec":
                return int(v)
        return None
    for ctrl in ("cpuacct", "cpu,cpuacct", "cpu"):
        u = read_file("/sys/fs/cgroup/%s/hutch-%s/%s/cpuacct.usage" % (ctrl, d.instance, sid))
        if u:
            return int(u) // 1000
    return None


def sandbox_footprint(d, sid, procs=None):
    """What sandbox `sid` of instance `d` holds on the host right now."""
    fp = {}
    fp["cgroups"] = sandbox_cgroup_dirs_existing(d.instance, sid)
    fp["root"] = os.path.lexists(os.path.join(d.data_dir, "pool", "rootfs", sid))
    run = []
    for dirpath, dirnames, files in os.walk(d.run_dir):
        for n in dirnames + files:
            rel = os.path.relpath(os.path.join(dirpath, n), d.run_dir)
            if sid in rel:
                run.append(rel)
    fp["socket"] = sorted(run)
    fp["processes"] = sorted("%d %s" % kv for kv in sandbox_processes(d, sid, procs).items())
    fp["uid_claim"] = sandbox_uid_claims(d, sid)
    fp["dir"] = os.path.isdir(os.path.join(d.data_dir, "sandboxes", sid))
    row = db_rows(d.data_dir).get(sid)
    fp["row"] = row is not None
    fp["row_state"] = row["state"] if row else None
    fp["frozen"] = sandbox_frozen(d, sid)
    fp["mounts"] = mounts_under([os.path.join(d.data_dir, "sandboxes", sid)])
    return fp


def footprint_problems(fp, state, files_optional=False):
    """Differences between footprint `fp` and what docs/lifecycle.md says a
    sandbox in `state` holds (empty list: it matches).  `files_optional`:
    the sandbox directory may or may not be there (a delete that failed
    half-way may already have removed the files it was asked to remove)."""
    want = dict(SANDBOX_FOOTPRINT[state])
    if files_optional:
        want["dir"] = fp["dir"]
    bad = []
    for k in ("cgroups", "socket", "processes", "uid_claim"):
        if bool(fp[k]) != want[k]:
            bad.append("%s: %s expected, found %r" % (k, "some" if want[k] else "none", fp[k]))
    if fp["dir"] != want["dir"]:
        bad.append("sandbox directory: expected %s" % ("present" if want["dir"] else "absent"))
    if not files_optional and fp["root"] != want["dir"]:
        bad.append("sandbox root in the pool: expected %s" % ("present" if want["dir"] else "absent"))
    if fp["row"] != want["row"]:
        bad.append("database row: expected %s, found %r" % ("present" if want["row"] else "absent",
                                                            fp["row_state"]))
    if want["row"] and fp["row_state"] != state:
        bad.append("database row state %r, expected %r" % (fp["row_state"], state))
    if state == "paused" and fp["frozen"] is not True:
        bad.append("paused but the freezer cgroup is not frozen (%r)" % fp["frozen"])
    if state == "running" and fp["frozen"] is not False:
        bad.append("running but the freezer cgroup is frozen or missing (%r)" % fp["frozen"])
    if state in ("stopped", "suspended", "error", "gone") and fp["mounts"]:
        bad.append("mounts left on the host: %r" % fp["mounts"])
    return bad


def snapshot_excluding(d, sids):
    """The leak snapshot of instance `d` without anything that belongs to
    the sandboxes `sids` (their state is checked by footprint instead)."""
    sids = list(sids)
    procs = instance_processes(d)
    theirs = set()
    for sid in sids:
        theirs |= set(sandbox_processes(d, sid, procs))
    s = snapshot(d)

    def mine(x):
        return not any(sid in x for sid in sids)

    s["cgroups"] = [c for c in s["cgroups"] if not any(sid in c.split("/") for sid in sids)]
    s["sandbox_dirs"] = [x for x in s["sandbox_dirs"] if x not in sids]
    s["pool_rootfs"] = [x for x in s["pool_rootfs"] if not any(x.startswith(sid) for sid in sids)]
    # Snapshots are the pool's, not a sandbox's (they outlive it): a
    # snapshot operation that succeeded adds one.  test_storage.py checks them.
    s.pop("pool_snapshots", None)
    s.pop("db_snapshot_rows", None)
    s["run_dir"] = [x for x in s["run_dir"] if mine(x)]
    s["processes"] = [x for x in s["processes"] if int(x.split(" ", 1)[0]) not in theirs]
    s["mounts"] = [x for x in s["mounts"] if mine(x)]
    s["loop_devices"] = [x for x in s["loop_devices"] if mine(x)]
    if isinstance(s["api_sandboxes"], list):
        s["api_sandboxes"] = [x for x in s["api_sandboxes"] if x not in sids]
    try:
        s["db_sandbox_rows"] = len([k for k in db_rows(d.data_dir) if k not in sids])
    except sqlite3.Error as e:
        s["db_sandbox_rows"] = "error:%s" % e
    s["uid_claims"] = [c for c in s["uid_claims"] if c.split()[-1] not in sids]
    return s


def assert_host_state(d, base, expected, timeout=5.0, files_optional=()):
    """Asserts, allowing `timeout` seconds for asynchronous exits, that the
    host holds exactly `base` (a snapshot_excluding(d, expected) taken
    earlier) plus, for each sandbox id in `expected`, what its state
    ({sid: state}, 'gone' for deleted) holds per docs/lifecycle.md.
    Returns {sid: footprint}."""
    sids = list(expected)

    def check():
        rest = snapshot_excluding(d, sids)
        procs = instance_processes(d)
        fps = {sid: sandbox_footprint(d, sid, procs) for sid in sids}
        problems = []
        if rest != base:
            problems.append("other host resources changed (now vs base):\n" + snapshot_diff(base, rest))
        for sid, st in expected.items():
            for p in footprint_problems(fps[sid], st, sid in files_optional):
                problems.append("%s (%s): %s" % (sid, st, p))
        return problems, fps

    last = [None]

    def ok():
        last[0] = check()
        return not last[0][0]

    wait_until(ok, timeout, interval=0.1)
    probs, fps = last[0]
    assert not probs, "host resources do not match the expected states %r:\n%s" % (
        expected, "\n".join(probs))
    return fps


def find_sandbox_file(d, sid, name):
    """Paths on the host below the sandbox's root in the pool
    (DATA/pool/rootfs/<sid>) whose base name is `name` (a file written inside
    the sandbox lands there), without crossing mount points."""
    top = os.path.join(d.data_dir, "pool", "rootfs", sid)
    out = []
    for dirpath, dirnames, files in os.walk(top):
        dirnames[:] = [x for x in dirnames if not os.path.ismount(os.path.join(dirpath, x))]
        if name in files:
            out.append(os.path.join(dirpath, name))
    return out


def simulate_host_reboot(d):
    """What a host reboot does to instance `d` (hutchd must be stopped):
    every process of the instance ends, its cgroups go, the run directory
    (tmpfs /run) is emptied and its uid range claims (in /run/hutch/uids)
    are gone.  The data directory stays.  Only this instance is touched."""
    assert not d.alive(), "stop hutchd before simulating a reboot"
    for _ in range(3):
        victims = set(instance_processes(d))
        victims.discard(os.getpid())
        if not victims:
            break
        for pid in victims:
            kill_pid(pid)
        wait_until(lambda: not any(proc_alive(p) for p in victims), 5)
    assert not instance_processes(d), "instance processes survived SIGKILL: %r" % instance_processes(d)
    for parent in instance_cgroup_parents(d.instance):
        for dirpath, _, _ in sorted(os.walk(parent), key=lambda t: -len(t[0])):
            def rm(p=dirpath):
                try:
                    os.rmdir(p)
                    return True
                except FileNotFoundError:
                    return True
                except OSError:
                    return False
            wait_until(rm, 3)
    for mp in sorted({m.split(" ")[0] for m in mounts_under([d.data_dir, d.run_dir])},
                     key=lambda p: p.count("/"), reverse=True):
        umount_lazy(mp)
    for n in os.listdir(d.run_dir):
        p = os.path.join(d.run_dir, n)
        if os.path.isdir(p) and not os.path.islink(p):
            safe_rmtree(p)
        else:
            os.unlink(p)
    real = os.path.realpath(d.data_dir)
    try:
        names = os.listdir(UID_LOCK_DIR)
    except FileNotFoundError:
        names = []
    for n in names:
        c = read_file(os.path.join(UID_LOCK_DIR, n)) or ""
        if c.split(" ", 1)[0] == real:
            try:
                os.unlink(os.path.join(UID_LOCK_DIR, n))
            except FileNotFoundError:
                pass
