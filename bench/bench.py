#!/usr/bin/python3
"""hutch benchmarks: what a user of the public API sees, beside baselines
measured in the same invocation (issue 3).  See bench/README.md.

    make bench                                 # default sizes (a few minutes)
    /usr/bin/python3 bench/bench.py --quick    # smoke run, ~30-60 s
    /usr/bin/python3 bench/bench.py --only storage   # one section: api, pool, storage, gvisor, egress

Every client talks HTTP/1.1 to hutchd over its unix socket.  Unless a row
says otherwise, each client thread keeps ONE keep-alive connection for all
its requests (what an SDK with a connection pool does); the "new connection"
rows open a connection per request (what `curl` or the CLI does).

Everything this program starts it stops: sandboxes are deleted through the
API, warm-pool members by restarting hutchd with --pool 0, and a last sweep
kills any process of its instances by pid, removes their cgroups, uid
claims and temporary directories.  Every loop is bounded in count and in
time (--max-seconds, enforced by a deadline and a SIGALRM backstop).

Stdlib only; Linux; run as root.
"""

import argparse
import datetime
import http.client
import json
import math
import os
import platform
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "bench", "results")

# The issue's targets for the native runtime on the 2-core build machine.
TARGETS = [
    # key, description, metric path, comparison, bound, unit
    ("create_p50", "create-to-ready p50, no pool, sequential", ("create_seq_nopool", "p50"), "<=", 10.0, "ms"),
    ("create_p99", "create-to-ready p99, no pool, sequential", ("create_seq_nopool", "p99"), "<=", 30.0, "ms"),
    ("pool_p50", "create-to-ready p50, pool claims (paced sequential)", ("create_seq_pool_claims", "p50"), "<=", 2.0, "ms"),
    ("exec_p50", "exec round trip of `true` p50 (keep-alive)", ("exec_keepalive", "p50"), "<=", 2.0, "ms"),
    ("cycles", "create+exec+delete cycles per second, concurrency 8", ("cycles_c8", "per_s"), ">=", 100.0, "/s"),
    ("density", "host memory per idle sandbox (at the largest density point)", ("density_max", "per_sandbox_mib"), "<=", 3.0, "MiB"),
    # The storage section (btrfs pool).  "≈ 1.0" for the create ratio is read as <= 1.2 (noise).
    ("storage_create_ratio", "create p50 from a 1 GiB template / from busybox", ("storage", "create_ratio_p50"), "<=", 1.2, "x"),
    ("storage_snapshot_p50", "snapshot of a running 1 GiB root after a 1 MiB change, p50", ("storage_snapshot", "p50"), "<=", 50.0, "ms"),
    ("storage_snapshot_p99", "snapshot of a running 1 GiB root after a 1 MiB change, p99", ("storage_snapshot", "p99"), "<=", 50.0, "ms"),
    ("storage_bytes", "pool bytes stored per such snapshot (mean)", ("storage", "stored_mib_per_snapshot_mean"), "<=", 1.2, "MiB"),
    # The gvisor section: an idle Python process holding state in memory.
    ("gvisor_restore_p50", "gvisor restore of an idle Python process, p50", ("gvisor_restore", "p50"), "<=", 300.0, "ms"),
    ("gvisor_fork_p50", "gvisor fork ×4 of a running sandbox until all run, p50", ("gvisor_fork", "p50"), "<=", 1000.0, "ms"),
]

SECTIONS = ("api", "pool", "storage", "gvisor", "egress")

BWRAP_ARGV = ["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr",
              "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin",
              "--proc", "/proc", "--dev", "/dev", "/bin/true"]


class Timeout(Exception):
    pass


class Budget:
    """The run's deadline.  Loops ask `left()` and stop early (marking their
    result truncated) rather than overrun; SIGALRM is the backstop."""

    def __init__(self, seconds):
        self.t0 = time.monotonic()
        self.end = self.t0 + seconds

    def left(self):
        return self.end - time.monotonic()

    def ok(self, reserve=0.0):
        return self.left() > reserve

    def elapsed(self):
        return time.monotonic() - self.t0


def log(msg):
    sys.stderr.write("[bench %s] %s\n" % (time.strftime("%H:%M:%S"), msg))
    sys.stderr.flush()


# -- statistics ----------------------------------------------------------------


def pct(sorted_v, p):
    """Percentile with linear interpolation between closest ranks."""
    if not sorted_v:
        return None
    if len(sorted_v) == 1:
        return sorted_v[0]
    k = (len(sorted_v) - 1) * p / 100.0
    f = math.floor(k)
    c = min(f + 1, len(sorted_v) - 1)
    return sorted_v[f] + (sorted_v[c] - sorted_v[f]) * (k - f)


def summarize(samples_ms, **extra):
    s = sorted(samples_ms)
    out = {"n": len(s)}
    if s:
        out.update({
            "min": round(s[0], 3), "p50": round(pct(s, 50), 3), "p90": round(pct(s, 90), 3),
            "p99": round(pct(s, 99), 3), "max": round(s[-1], 3), "mean": round(sum(s) / len(s), 3),
        })
    out.update(extra)
    return out


# -- HTTP over the unix socket --------------------------------------------------


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=60.0):
        super().__init__("hutch", timeout=timeout)
        self.unix_path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self.unix_path)
        except BaseException:
            s.close()
            raise
        self.sock = s


class ApiError(Exception):
    pass


class Client:
    """One client connection.  keepalive=True reuses the connection for every
    request (reconnecting, and counting it, if hutchd closed it);
    keepalive=False opens and closes a connection per request."""

    def __init__(self, sock_path, keepalive=True, timeout=120.0):
        self.path = sock_path
        self.keepalive = keepalive
        self.timeout = timeout
        self.conn = None
        self.reconnects = 0

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def request(self, method, url, body=None):
        """Returns (status, parsed JSON or None, elapsed ms).  The time runs
        from just before the request is written to the end of the body."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        if data is None and method in ("POST", "PUT"):
            headers["Content-Length"] = "0"
        for attempt in (0, 1):
            fresh = self.conn is None
            if fresh:
                self.conn = UnixHTTPConnection(self.path, self.timeout)
            t0 = time.perf_counter()
            try:
                self.conn.request(method, url, body=data, headers=headers)
                r = self.conn.getresponse()
                raw = r.read()
                t1 = time.perf_counter()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
                self.close()
                if fresh or attempt:
                    raise ApiError("%s %s: %r" % (method, url, e))
                self.reconnects += 1
                continue
            if not self.keepalive or r.will_close:
                self.close()
            try:
                js = json.loads(raw) if raw else None
            except ValueError:
                js = None
            return r.status, js, (t1 - t0) * 1000.0
        raise ApiError("unreachable")

    # API calls ---------------------------------------------------------------

    def healthz(self):
        return self.request("GET", "/healthz")

    def create(self, body=None):
        st, js, ms = self.request("POST", "/v1/sandboxes?wait=true", body if body is not None else {})
        if st != 201 or not isinstance(js, dict) or js.get("state") != "running":
            raise ApiError("create: %s %s" % (st, json.dumps(js)[:500]))
        return js, ms

    def exec_true(self, sid):
        st, js, ms = self.request("POST", "/v1/sandboxes/%s/exec" % sid, {"argv": ["true"]})
        if st != 200 or not isinstance(js, dict) or js.get("exit_code") != 0:
            raise ApiError("exec: %s %s" % (st, json.dumps(js)[:500]))
        return js, ms

    def delete(self, sid):
        st, js, ms = self.request("DELETE", "/v1/sandboxes/%s?wait=true" % sid)
        if st not in (200, 404):
            raise ApiError("delete %s: %s %s" % (sid, st, json.dumps(js)[:500]))
        return js, ms

    def list_ids(self):
        st, js, _ = self.request("GET", "/v1/sandboxes")
        if st != 200:
            raise ApiError("list: %s %s" % (st, js))
        return [s["id"] for s in js.get("sandboxes", [])]


# -- host helpers -----------------------------------------------------------------


def read(path, default=None):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return default


def proc_cmdline(pid):
    raw = read("/proc/%d/cmdline" % pid)
    return raw.replace("\0", " ").strip() if raw else ""


def pids():
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def smaps_pss_kib(pid):
    txt = read("/proc/%d/smaps_rollup" % pid)
    if not txt:
        return None
    for line in txt.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return None


def status_kib(pid, field):
    txt = read("/proc/%d/status" % pid) or ""
    for line in txt.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return None


def meminfo_kib(field):
    for line in (read("/proc/meminfo") or "").splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return None


def cgroup_mounts():
    """{controller or 'unified': mount point} from /proc/self/mountinfo."""
    out = {}
    for line in (read("/proc/self/mountinfo") or "").splitlines():
        left, _, right = line.partition(" - ")
        lf, rf = left.split(), right.split()
        if not rf:
            continue
        if rf[0] == "cgroup2":
            out.setdefault("unified", lf[4])
        elif rf[0] == "cgroup" and len(rf) > 2:
            for o in rf[2].split(","):
                if o in ("memory", "pids", "cpu", "cpuacct", "freezer", "cpuset", "devices", "blkio") or o.startswith("name="):
                    out.setdefault(o, lf[4])
    return out


def host_cgroup_version():
    for line in (read("/proc/self/mountinfo") or "").splitlines():
        f = line.split()
        if len(f) > 4 and f[4] == "/sys/fs/cgroup":
            return "v2" if " - cgroup2 " in line else "v1"
    return "unknown"


def sandbox_cgroup_memory(instance, sid, version):
    """(bytes, breakdown dict) of the sandbox cgroup's own memory charge."""
    m = cgroup_mounts()
    if version == "v1" and "memory" in m:
        d = os.path.join(m["memory"], "hutch-" + instance, sid)
        usage = read(os.path.join(d, "memory.usage_in_bytes"))
        stat = read(os.path.join(d, "memory.stat")) or ""
        keys = ("rss", "cache", "mapped_file", "shmem")
        br = {}
        for line in stat.splitlines():
            k, _, v = line.partition(" ")
            if k in keys:
                br[k] = int(v)
        kmem = read(os.path.join(d, "memory.kmem.usage_in_bytes"))
        if kmem is not None:
            br["kmem"] = int(kmem)
        return (int(usage) if usage else None), br
    root = m.get("unified", "/sys/fs/cgroup") if version == "v1" else "/sys/fs/cgroup"
    d = os.path.join(root, "hutch-" + instance, sid)
    cur = read(os.path.join(d, "memory.current"))
    stat = read(os.path.join(d, "memory.stat")) or ""
    br = {}
    for line in stat.splitlines():
        k, _, v = line.partition(" ")
        if k in ("anon", "file", "kernel", "kernel_stack", "pagetables", "slab", "sock", "shmem"):
            br[k] = int(v)
    return (int(cur) if cur else None), br


def git_facts(build_dir):
    """Commit of the tree the measured binaries were built from (the
    parent of the build directory when it is a git checkout, else this
    repository), and whether its src/ had uncommitted changes."""
    src = os.path.dirname(os.path.abspath(build_dir))
    if not os.path.exists(os.path.join(src, ".git")):
        src = REPO

    def g(*a):
        try:
            return subprocess.run(["git", "-C", src] + list(a), capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    return {"source": src, "commit": g("rev-parse", "--short=12", "HEAD"),
            "src_dirty": bool(g("status", "--porcelain", "--", "src"))}


def tool_version(argv):
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        return (r.stdout or r.stderr).strip().splitlines()[0] if (r.stdout or r.stderr).strip() else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def other_hutch_processes(mine):
    """hutch-shim/hutchd processes on the host that are not this run's: a
    noise indicator on a shared machine."""
    n = 0
    for pid in pids():
        c = proc_cmdline(pid)
        if not c or any(m in c for m in mine):
            continue
        base = os.path.basename(c.split()[0])
        if base in ("hutch-shim", "hutchd"):
            n += 1
    return n


def machine_facts():
    cpu = ""
    for line in (read("/proc/cpuinfo") or "").splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "kernel": platform.release(),
        "os": "Debian " + (read("/etc/debian_version", "?").strip()),
        "mem_total_mib": round((meminfo_kib("MemTotal") or 0) / 1024),
        "cgroup_host": host_cgroup_version(),
        "python": platform.python_version(),
        "bwrap": tool_version(["bwrap", "--version"]),
        "runsc": tool_version(["runsc", "--version"]),
    }


# -- CPU accounting (noise indicator) ----------------------------------------------------

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_snapshot(tags=()):
    """(host busy ticks, host total ticks, {pid: (starttime, cpu ticks incl.
    reaped children, ppid, comm)}, {pids whose command line names one of
    `tags`: this run's directories})."""
    f = (read("/proc/stat") or "cpu 0 0 0 0").splitlines()[0].split()[1:]
    v = [int(x) for x in f]
    total = sum(v[:8])
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    procs = {}
    for pid in pids():
        st = read("/proc/%d/stat" % pid)
        if not st:
            continue
        comm = st[st.index("(") + 1:st.rindex(")")]
        r = st[st.rindex(")") + 2:].split()
        # fields after comm: state ppid ... utime(14) stime(15) cutime(16) cstime(17) ... starttime(22)
        procs[pid] = (int(r[19]), int(r[11]) + int(r[12]) + int(r[13]) + int(r[14]), int(r[1]), comm)
    tagged = set()
    if tags:
        for pid in procs:
            c = read("/proc/%d/cmdline" % pid, "") or ""
            if any(t in c for t in tags):
                tagged.add(pid)
    return total - idle, total, procs, tagged


def cpu_since(a, b, ours):
    """Share of the machine (percent of all CPUs) that was busy between
    snapshots a and b, and the share used by processes that are not this
    benchmark's (others: user processes; kthreads: kernel threads, some of
    them working for us, e.g. namespace and cgroup teardown).  Processes born
    and reaped inside the interval count towards their parent; orphans reaped
    by pid 1 (shims are, by design) are not counted as others.  A process is
    this benchmark's when it is in `ours`, its command line names this
    run's directories (hutchd, hutch-shim, runsc of our sandboxes and
    baselines), or an ancestor's does.  Without the directories (old
    snapshots), hutch/runsc/bwrap process names count as ours, which also
    hides other instances' (another hutchd's gVisor sandboxes, say)."""
    busy = b[0] - a[0]
    total = max(1, b[1] - a[1])
    others = kth = 0
    tagged = (a[3] | b[3]) if len(a) > 3 and len(b) > 3 else None

    def mine(pid):
        p = pid
        for _ in range(64):
            if p in ours or p in tagged:
                return True
            info = b[2].get(p) or a[2].get(p)
            if not info or info[2] <= 1:
                return False
            p = info[2]
        return False

    for pid, (start, t, ppid, comm) in b[2].items():
        old = a[2].get(pid)
        if not old or old[0] != start or pid == 1 or pid in ours:
            continue
        dt = t - old[1]
        if dt <= 0:
            continue
        if ppid == 2 or pid == 2:
            kth += dt
        elif tagged is not None:
            if not mine(pid):
                others += dt
        elif not comm.startswith("hutch-") and comm not in ("hutchd", "runsc", "exe", "bwrap", "MHD-connection"):
            others += dt
    # A parent that reaps a child inside the interval is charged all of the
    # child's CPU, some of it from before: clamp to what the host did.
    others = min(others, busy)
    kth = min(kth, busy - others)
    return {"host_busy_pct": round(100.0 * busy / total, 1), "others_pct": round(100.0 * others / total, 1),
            "kthreads_pct": round(100.0 * kth / total, 1), "busy_cpu_s": round(busy / CLK_TCK, 3),
            "others_cpu_s": round(others / CLK_TCK, 3)}


# -- hutchd ---------------------------------------------------------------------------


class Hutchd:
    """One hutchd on short temporary paths: /tmp/hbXXXX/{data,run,api.sock}."""

    def __init__(self, build, label, pool=0, workers=None, extra_args=()):
        self.build = build
        self.label = label
        self.pool = pool
        self.workers = workers
        self.extra_args = list(extra_args)
        self.root = tempfile.mkdtemp(prefix="hbench-", dir="/tmp")
        self.data = os.path.join(self.root, "data")
        self.run = os.path.join(self.root, "run")
        self.sock = os.path.join(self.root, "api.sock")
        os.mkdir(self.data, 0o700)
        os.mkdir(self.run, 0o700)
        self.logf = os.path.join(self.root, "hutchd.log")
        self.proc = None
        self.instance = None
        self.cgroup = None
        self.created = set()  # ids this run created and has not yet deleted
        self.snapshots = set()  # snapshot ids this run made (snapshots outlive their sandbox)
        self.templates = set()  # template names this run made
        self.cleaned = False
        self.pool_unmounted = False

    def start(self, pool=None, timeout=60):
        pool = self.pool if pool is None else pool
        cmd = [os.path.join(self.build, "hutchd"), "--data-dir", self.data, "--socket", self.sock,
               "--run-dir", self.run, "--pool", str(pool)]
        if self.workers:
            cmd += ["--workers", str(self.workers)]
        cmd += self.extra_args
        with open(self.logf, "ab") as lf:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=lf, stderr=lf,
                                         start_new_session=True, cwd="/")
        c = Client(self.sock, keepalive=False, timeout=5)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError("hutchd exited with %s; log tail:\n%s" % (self.proc.returncode, self.log_tail()))
            if os.path.exists(self.sock):
                try:
                    st, js, _ = c.healthz()
                    if st == 200 and isinstance(js, dict):
                        self.instance = js["instance"]
                        self.cgroup = js.get("cgroup")
                        return js
                except (OSError, ApiError):
                    pass
            time.sleep(0.02)
        raise RuntimeError("hutchd not ready after %ss; log tail:\n%s" % (timeout, self.log_tail()))

    def log_tail(self, n=30):
        txt = read(self.logf, "") or ""
        return "\n".join(txt.splitlines()[-n:])

    def health(self):
        st, js, _ = Client(self.sock, keepalive=False, timeout=10).healthz()
        if st != 200:
            raise ApiError("healthz: %s" % st)
        return js

    def pool_ready(self):
        return self.health()["pool"]["ready"]

    def wait_pool(self, n, timeout, interval=0.01):
        """Seconds until healthz pool.ready >= n, or None on timeout."""
        t0 = time.monotonic()
        c = Client(self.sock, keepalive=True, timeout=10)
        try:
            while time.monotonic() - t0 < timeout:
                st, js, _ = c.healthz()
                if st == 200 and js["pool"]["ready"] >= n:
                    return time.monotonic() - t0
                time.sleep(interval)
        finally:
            c.close()
        return None

    def rss_kib(self):
        return status_kib(self.proc.pid, "VmRSS") if self.proc else None

    def my_shims(self):
        return [p for p in pids() if self.data in proc_cmdline(p) and "hutch-shim" in proc_cmdline(p)]

    def delete_all(self, conc=8, budget_s=120):
        """Delete every sandbox this run created (and any other the API lists)."""
        c = Client(self.sock)
        try:
            ids = set(c.list_ids()) | set(self.created)
        finally:
            c.close()
        ids = sorted(ids)
        lat = run_concurrent(self.sock, len(ids), conc, lambda cl, i: cl.delete(ids[i])[1], budget_s)
        for sid in ids:
            self.created.discard(sid)
        return lat

    def delete_storage(self, budget_s=120):
        """Delete the snapshots (every one the API lists: fork snapshots
        too) and the templates this run made.  Call after delete_all: a
        template is not deleted while sandboxes use it.  Returns a list of
        failures."""
        end = time.monotonic() + budget_s
        c = Client(self.sock, timeout=60)
        bad = []
        try:
            st, js, _ = c.request("GET", "/v1/snapshots")
            ids = set(self.snapshots)
            if st == 200 and isinstance(js, dict):
                ids |= {x["id"] for x in js.get("snapshots", [])}
            elif st != 404:
                bad.append("GET /v1/snapshots: %s" % st)
            for sid in sorted(ids):
                if time.monotonic() > end:
                    bad.append("snapshot deletes stopped by the time bound")
                    break
                st, js, _ = c.request("DELETE", "/v1/snapshots/%s" % sid)
                if st in (200, 204, 404):
                    self.snapshots.discard(sid)
                else:
                    bad.append("DELETE snapshot %s: %s %s" % (sid, st, json.dumps(js)[:200]))
            for name in sorted(self.templates):
                if time.monotonic() > end:
                    bad.append("template deletes stopped by the time bound")
                    break
                st, js, _ = c.request("DELETE", "/v1/templates/%s" % name)
                if st in (200, 204, 404):
                    self.templates.discard(name)
                else:
                    bad.append("DELETE template %s: %s %s" % (name, st, json.dumps(js)[:200]))
        finally:
            c.close()
        return bad

    def unmount_pool(self):
        """hutchd leaves its storage pool (DATA/pool, a loop-mounted btrfs
        image unless the data directory is on btrfs) mounted when it stops,
        by design: sandboxes outlive it.  Once it is stopped and its
        sandboxes are gone, unmount it; the loop device detaches itself
        (autoclear).  Not a leftover."""
        mp = os.path.join(self.data, "pool")
        for line in (read("/proc/self/mountinfo") or "").splitlines():
            if line.split()[4] == mp:
                r = subprocess.run(["umount", mp], capture_output=True, text=True, timeout=30)
                if r.returncode != 0:
                    log("umount %s: %s" % (mp, r.stderr.strip()))
                    return False
                self.pool_unmounted = True
                return True
        return False

    def stop(self, drain_pool):
        """Stop hutchd.  A pool's members outlive hutchd, so with drain_pool
        hutchd is restarted with --pool 0, whose start-up deletes them, and
        stopped once their shims are gone."""
        if self.proc is None:
            return
        if drain_pool and self.proc.poll() is None:
            self._term()
            try:
                self.start(pool=0, timeout=30)
                end = time.monotonic() + 60
                while self.my_shims() and time.monotonic() < end:
                    time.sleep(0.05)
            except RuntimeError as e:
                log("restart to drain the pool failed: %s" % e)
        self._term()

    def _term(self):
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            log("hutchd (%s) ignored SIGTERM for 20 s: killed" % self.label)
            self.proc.kill()
            self.proc.wait(10)

    def cleanup_host(self):
        """Last sweep: anything of this instance still on the host goes, by
        pid, then its cgroups, uid claims and directories.  Returns a list of
        what had to be removed (empty when hutchd cleaned up after itself)."""
        if self.cleaned:
            return []
        self.cleaned = True
        leftovers = []
        if self.proc is not None and self.proc.poll() is None:
            self._term()
        cg = cgroup_mounts()
        cg_dirs = []
        if self.instance:
            for k, mnt in cg.items():
                d = os.path.join(mnt, "hutch-" + self.instance)
                if os.path.isdir(d):
                    cg_dirs.append(d)
        for _ in range(3):
            victims = set()
            for p in pids():
                c = proc_cmdline(p)
                if self.data in c or self.root in c:
                    victims.add(p)
            for d in cg_dirs:
                for dp, _, _ in os.walk(d):
                    for line in (read(os.path.join(dp, "cgroup.procs"), "") or "").split():
                        victims.add(int(line))
            victims.discard(os.getpid())
            if not victims:
                break
            leftovers.append("killed processes %s" % sorted(victims))
            for p in victims:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.3)
        for d in cg_dirs:
            subdirs = sorted((dp for dp, _, _ in os.walk(d)), key=len, reverse=True)
            for dp in subdirs:
                for _ in range(30):
                    try:
                        os.rmdir(dp)
                        if dp != d:
                            leftovers.append("removed cgroup %s" % dp)
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.1)
        # The storage pool stays mounted after hutchd by design: unmount it
        # now that nothing of the instance runs (only what fails is a leftover).
        self.unmount_pool()
        # uid range claims (shared directory; only files naming our data dir)
        ud = "/run/hutch/uids"
        if os.path.isdir(ud):
            for f in os.listdir(ud):
                p = os.path.join(ud, f)
                if (read(p, "") or "").startswith(self.data + " "):
                    leftovers.append("removed uid claim %s" % p)
                    try:
                        os.unlink(p)
                    except OSError:
                        pass
        for line in (read("/proc/self/mountinfo") or "").splitlines():
            mp = line.split()[4]
            if mp.startswith(self.root + "/"):
                leftovers.append("unmounted %s" % mp)
                subprocess.run(["umount", "-l", mp], capture_output=True, timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)
        return leftovers


# -- drivers --------------------------------------------------------------------------


def run_concurrent(sock, n, conc, fn, budget_s, keepalive=True):
    """Run fn(client, i) for i in 0..n-1 on `conc` threads, each with its own
    client connection.  fn returns a value (usually ms) or raises.  Stops
    handing out work after budget_s.  Returns dict(results, errors, wall_s,
    truncated, reconnects)."""
    lock = threading.Lock()
    nxt = [0]
    results = [None] * n
    errors = []
    stop_at = time.monotonic() + budget_s
    clients = []

    def worker():
        cl = Client(sock, keepalive=keepalive)
        with lock:
            clients.append(cl)
        while True:
            with lock:
                if nxt[0] >= n or time.monotonic() > stop_at or len(errors) > 10:
                    break
                i = nxt[0]
                nxt[0] += 1
            try:
                results[i] = fn(cl, i)
            except Exception as e:  # noqa: BLE001 — recorded, reported
                with lock:
                    errors.append(repr(e)[:300])
        cl.close()

    t0 = time.monotonic()
    ths = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, min(conc, n)))]
    for t in ths:
        t.start()
    for t in ths:
        t.join(budget_s + 150)
    wall = time.monotonic() - t0
    done = [r for r in results if r is not None]
    return {"results": done, "errors": errors, "wall_s": wall, "truncated": len(done) + len(errors) < n,
            "reconnects": sum(c.reconnects for c in clients)}


def run_baseline(argv, timeout=30):
    t0 = time.perf_counter()
    r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       timeout=timeout)
    ms = (time.perf_counter() - t0) * 1000.0
    if r.returncode != 0:
        raise RuntimeError("%s exited %d: %s" % (argv[0], r.returncode, r.stderr.decode(errors="replace")[:300]))
    return ms


def stream_get(sock, url, timeout):
    """GET url and count the body's bytes without keeping them (an export
    of a 1 GiB root is streamed).  Returns (status, bytes, ms, error text)."""
    conn = UnixHTTPConnection(sock, timeout)
    try:
        t0 = time.perf_counter()
        conn.request("GET", url)
        r = conn.getresponse()
        if r.status != 200:
            body = r.read(4096)
            return r.status, 0, (time.perf_counter() - t0) * 1000.0, body.decode(errors="replace")[:300]
        n = 0
        while True:
            chunk = r.read(1 << 20)
            if not chunk:
                break
            n += len(chunk)
        return r.status, n, (time.perf_counter() - t0) * 1000.0, None
    finally:
        conn.close()


def disk_io_ms(path):
    """(device name, ms the block device holding `path` spent doing I/O,
    from /proc/diskstats), or (None, None).  Two readings give how busy the
    disk was in between: a noise indicator for the storage rows (the pool
    image shares its disk with everything else on the host)."""
    try:
        st = os.stat(path)
        name = os.path.basename(os.path.realpath("/sys/dev/block/%d:%d" % (os.major(st.st_dev), os.minor(st.st_dev))))
    except OSError:
        return None, None
    for line in (read("/proc/diskstats") or "").splitlines():
        f = line.split()
        if len(f) > 12 and f[2] == name:
            return name, int(f[12])
    return name, None


def log_events(logf, offset, event):
    """hutchd's log lines `event=<event>` from byte offset on, as dicts of
    their key=value fields (values as strings)."""
    try:
        with open(logf, "rb") as f:
            f.seek(offset)
            txt = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    out = []
    for line in txt.splitlines():
        if " event=%s " % event not in line + " ":
            continue
        kv = {}
        for m in re.finditer(r'(\w+)=("[^"]*"|\S+)', line):
            kv[m.group(1)] = m.group(2).strip('"')
        out.append(kv)
    return out


# -- the egress section's test network ---------------------------------------------------
#
# Two network namespaces of the bench's own (the pattern of
# tests/integration/netlab.py, with names and addresses of their own so that
# a test suite running beside the bench is not disturbed): a "server" that
# plays the internet (HTTP on :80, HTTPS on :443 with a certificate of a test
# CA, DNS on :53 answering allowed.test) and a "client" that reaches it
# directly, routed through the host netns like the gateway's traffic but
# with no gateway in the way.  Forwarding is switched on for those two
# host-side interfaces only (net.ipv4.conf.<if>.forwarding; the global
# ip_forward is left alone), and neither namespace has a default route: no
# packet of the bench leaves this machine.

EGRESS_NAME = "allowed.test"

EGRESS_SERVER = r'''
import os, socket, socketserver, ssl, struct, sys, threading, http.server
ip, d, small, big, name = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
BODIES = {"/small": (b"0123456789abcdef" * (small // 16 + 1))[:small], "/big": memoryview(bytes(big))}

class H(http.server.BaseHTTPRequestHandler):
    disable_nagle_algorithm = True
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self):
        body = BODIES.get(self.path.split("?", 1)[0])
        self.close_connection = True
        if body is None:
            self.wfile.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"); return
        head = ("HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n"
                "Connection: close\r\n\r\n" % len(body)).encode()
        if len(body) <= 65536:
            self.wfile.write(head + bytes(body))  # one write: no Nagle/delayed-ACK stall
        else:
            self.wfile.write(head); self.wfile.write(body)

class TS(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

http_srv = TS((ip, 80), H)
https_srv = TS((ip, 443), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(os.path.join(d, "server.crt"), os.path.join(d, "server.key"))
https_srv.socket = ctx.wrap_socket(https_srv.socket, server_side=True)

def dns():
    def answer(q):
        tid, flags, qd = struct.unpack(">HHH", q[:6])
        i = 12; labels = []
        while q[i]:
            labels.append(q[i+1:i+1+q[i]].decode()); i += 1 + q[i]
        qname = ".".join(labels).lower(); qtype = struct.unpack(">H", q[i+1:i+3])[0]
        addrs = [ip] if qname == name and qtype == 1 else []
        rcode = 0 if qname == name else 3
        hdr = struct.pack(">HHHHHH", tid, 0x8180 | rcode, 1, len(addrs), 0, 0)
        return hdr + q[12:i+5] + b"".join(b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 30, 4) + socket.inet_aton(a)
                                          for a in addrs)
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind((ip, 53))
    t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); t.bind((ip, 53)); t.listen(16)
    def udp():
        while True:
            q, a = u.recvfrom(4096)
            try: u.sendto(answer(q), a)
            except Exception: pass
    def tcp():
        while True:
            c, a = t.accept()
            try:
                c.settimeout(5); n = struct.unpack(">H", c.recv(2))[0]; r = answer(c.recv(n))
                c.sendall(struct.pack(">H", len(r)) + r)
            except Exception: pass
            c.close()
    threading.Thread(target=udp, daemon=True).start(); threading.Thread(target=tcp, daemon=True).start()

dns()
threading.Thread(target=https_srv.serve_forever, daemon=True).start()
open(os.path.join(d, "ready"), "w").close()
http_srv.serve_forever()
'''

# The client, the same code on both paths: in the sandbox (exec; through the
# gateway) and in the bench's client namespace (`ip netns exec`; direct).  It
# times each request itself (time.perf_counter, from before connect() to the
# last byte of the body), so neither the API round trip nor Python's start-up
# is counted.  One argument, JSON: mode get|dns, host, addr (an IPv4, or
# "resolve": getaddrinfo(host) once before the loop, or "resolv": the first
# nameserver of /etc/resolv.conf), port, path, tls, cafile, size (expected
# body bytes), n, warm (untimed requests first), limit_s.  Prints one JSON
# line: {"ms": [...], "warm_ms": [...], "errors": [...], "truncated", "addr"}.
EGRESS_CLIENT = r'''
import json, random, socket, ssl, struct, sys, time
cfg = json.loads(sys.argv[1])
end = time.monotonic() + cfg["limit_s"]
out = {"ms": [], "warm_ms": [], "errors": [], "truncated": False}
addr, port, host = cfg["addr"], cfg.get("port", 53), cfg["host"]
if addr == "resolv":
    for line in open("/etc/resolv.conf"):
        f = line.split()
        if len(f) >= 2 and f[0] == "nameserver":
            addr = f[1]; break
elif addr == "resolve":
    addr = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
out["addr"] = addr
ctx = ssl.create_default_context(cafile=cfg.get("cafile")) if cfg.get("tls") else None
buf = bytearray(1 << 20)
req = ("GET %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: hbench\r\nAccept: */*\r\nConnection: close\r\n\r\n"
       % (cfg.get("path", "/"), host)).encode()
qname = b"".join(bytes([len(p)]) + p.encode() for p in host.split(".")) + b"\0"

def get():
    t0 = time.perf_counter()
    s = socket.create_connection((addr, port), timeout=30)
    try:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if ctx is not None:
            s = ctx.wrap_socket(s, server_hostname=host)
        s.sendall(req)
        head = b""
        while b"\r\n\r\n" not in head:
            k = s.recv_into(buf)
            if not k:
                raise EOFError("connection closed in the response head: %r" % head[:200])
            head += bytes(buf[:k])
            if len(head) > (1 << 21):
                raise ValueError("response head too long")
        head, _, rest = head.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        if lines[0].split(b" ")[1:2] != [b"200"]:
            raise ValueError("status %r" % lines[0][:120])
        clen = None
        for l in lines[1:]:
            k_, _, v = l.partition(b":")
            if k_.strip().lower() == b"content-length":
                clen = int(v.strip())
        got = len(rest)
        while clen is None or got < clen:
            try:
                k = s.recv_into(buf)
            except (ssl.SSLEOFError, ssl.SSLZeroReturnError):
                k = 0
            if not k:
                if clen is None:
                    break
                raise EOFError("closed after %d of %d body bytes" % (got, clen))
            got += k
        t1 = time.perf_counter()
    finally:
        s.close()
    if cfg.get("size") is not None and got != cfg["size"]:
        raise ValueError("body %d bytes, expected %d" % (got, cfg["size"]))
    return (t1 - t0) * 1000.0

def dns():
    qid = random.getrandbits(16)
    q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0) + qname + struct.pack(">HH", 1, 1)
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.settimeout(2)
    try:
        t0 = time.perf_counter()
        u.sendto(q, (addr, port))
        while True:
            r, _ = u.recvfrom(4096)
            if r[:2] == q[:2]:
                break
        t1 = time.perf_counter()
    finally:
        u.close()
    rcode, an = r[3] & 15, struct.unpack(">H", r[6:8])[0]
    if rcode or not an:
        raise ValueError("DNS rcode %d, %d answers" % (rcode, an))
    return (t1 - t0) * 1000.0

fn = dns if cfg["mode"] == "dns" else get
for key, count in (("warm_ms", cfg.get("warm", 0)), ("ms", cfg["n"])):
    for i in range(count):
        if time.monotonic() > end:
            out["truncated"] = True
            break
        try:
            out[key].append(fn())
        except Exception as e:
            out["errors"].append(repr(e)[:300])
            if len(out["errors"]) > 5:
                break
print(json.dumps(out))
'''


class EgressLab:
    """The egress section's namespaces: `hbench-s<pid>` (server) and
    `hbench-c<pid>` (direct client), each on a /30 of 10.232.B.0/24 (B the
    first of 200..254 no address or route on the host uses), veth pairs
    `hbs<pid>h`/`hbs<pid>n` and `hbc<pid>h`/`hbc<pid>n`.  close() removes
    everything; it is safe to call at any point of start()."""

    def __init__(self, small_bytes, big_bytes):
        self.dir = tempfile.mkdtemp(prefix="hbench-lab-", dir="/tmp")
        pid = os.getpid()
        self.ns_srv, self.ns_cli = "hbench-s%d" % pid, "hbench-c%d" % pid
        self.hv_srv, self.nv_srv = "hbs%dh" % pid, "hbs%dn" % pid
        self.hv_cli, self.nv_cli = "hbc%dh" % pid, "hbc%dn" % pid
        self.small, self.big = small_bytes, big_bytes
        self.proc = None
        self.net = None
        self.made = []  # namespaces and links made, for close()

    def _ip(self, *args):
        r = subprocess.run(["ip"] + list(args), capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError("ip %s: %s" % (" ".join(args), r.stderr.strip()[:300]))

    def _pick_net(self):
        used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, timeout=10).stdout + \
            subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True, timeout=10).stdout
        for b in range(200, 255):
            if "10.232.%d." % b not in used:
                return b
        raise RuntimeError("no free 10.232.B.0/24 (B in 200..254) for the egress lab")

    def start(self):
        d = self.dir
        run = lambda *c: subprocess.run(list(c), check=True, capture_output=True, timeout=60)  # noqa: E731
        run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", d + "/ca.key", "-out", d + "/ca.crt", "-days", "2", "-subj", "/CN=hutch bench test CA")
        for ns, hv in ((self.ns_srv, self.hv_srv), (self.ns_cli, self.hv_cli)):
            # Only a crashed earlier run with this very pid could have left these.
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
            subprocess.run(["ip", "link", "del", hv], capture_output=True, timeout=30)
        b = self._pick_net()
        self.net = b
        self.srv_ip, self.srv_host_ip = "10.232.%d.2" % b, "10.232.%d.1" % b
        self.cli_ip, self.cli_host_ip = "10.232.%d.6" % b, "10.232.%d.5" % b
        run("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", d + "/server.key", "-out", d + "/server.csr", "-subj", "/CN=bench server")
        with open(d + "/ext.cnf", "w") as f:
            f.write("subjectAltName=DNS:%s,IP:%s\n" % (EGRESS_NAME, self.srv_ip))
        run("openssl", "x509", "-req", "-in", d + "/server.csr", "-CA", d + "/ca.crt", "-CAkey", d + "/ca.key",
            "-CAcreateserial", "-out", d + "/server.crt", "-days", "2", "-extfile", d + "/ext.cnf")
        for ns, hv, nv, hip, nip, other in (
                (self.ns_srv, self.hv_srv, self.nv_srv, self.srv_host_ip, self.srv_ip, "10.232.%d.4/30" % b),
                (self.ns_cli, self.hv_cli, self.nv_cli, self.cli_host_ip, self.cli_ip, "10.232.%d.0/30" % b)):
            self._ip("netns", "add", ns)
            self.made.append(("netns", ns))
            self._ip("link", "add", hv, "type", "veth", "peer", "name", nv)
            self.made.append(("link", hv))
            self._ip("link", "set", nv, "netns", ns)
            self._ip("addr", "add", hip + "/30", "dev", hv)
            self._ip("link", "set", hv, "up")
            self._ip("-n", ns, "addr", "add", nip + "/30", "dev", nv)
            self._ip("-n", ns, "link", "set", nv, "up")
            self._ip("-n", ns, "link", "set", "lo", "up")
            # Only the other lab namespace is routed: no default route.
            self._ip("-n", ns, "route", "add", other, "via", hip)
            with open("/proc/sys/net/ipv4/conf/%s/forwarding" % hv, "w") as f:
                f.write("1\n")
        errf = open(d + "/server.err", "w")
        try:
            self.proc = subprocess.Popen(["ip", "netns", "exec", self.ns_srv, "/usr/bin/python3", "-c", EGRESS_SERVER,
                                          self.srv_ip, d, str(self.small), str(self.big), EGRESS_NAME],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errf,
                                         start_new_session=True)
        finally:
            errf.close()
        end = time.monotonic() + 30
        while not os.path.exists(d + "/ready"):
            if self.proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError("egress lab server did not start: %s" % (read(d + "/server.err", "") or "")[-500:])
            time.sleep(0.05)
        return self

    @property
    def dns(self):
        return self.srv_ip + ":53"

    @property
    def ca(self):
        return self.dir + "/ca.crt"

    def client(self, cfg, timeout):
        """The client script in the client namespace (the direct path)."""
        r = subprocess.run(["ip", "netns", "exec", self.ns_cli, "/usr/bin/python3", "-c", EGRESS_CLIENT,
                            json.dumps(cfg)], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=timeout)
        return r.returncode, r.stdout, r.stderr

    def close(self):
        """Stop the server, delete the namespaces and links.  Returns what
        could not be removed."""
        bad = []
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                bad.append("lab server %d did not exit" % self.proc.pid)
        for kind, name in reversed(self.made):
            args = ["netns", "del", name] if kind == "netns" else ["link", "del", name]
            r = subprocess.run(["ip"] + args, capture_output=True, text=True, timeout=30)
            # Deleting a namespace deletes its end of the veth, and so the pair.
            if r.returncode != 0 and "Cannot find device" not in r.stderr and "No such file" not in r.stderr:
                bad.append("ip %s: %s" % (" ".join(args), r.stderr.strip()[:200]))
        if os.path.exists("/run/netns/" + self.ns_srv) or os.path.exists("/run/netns/" + self.ns_cli):
            bad.append("a lab namespace is still there")
        shutil.rmtree(self.dir, ignore_errors=True)
        return bad


class Bench:
    def __init__(self, args):
        self.a = args
        self.build = os.path.abspath(os.environ.get("HUTCH_BUILD") or os.path.join(REPO, "build"))
        self.budget = Budget(args.max_seconds)
        self.stats = {}      # name -> summary dict
        self.samples = {}    # name -> list of ms
        self.notes = []
        self.daemons = []
        self.density = []
        self.storage = {}    # the storage section's non-latency results
        self.storage_raw = {}  # its raw samples (timestamped JSON only)
        self.gvisor = {}     # the gvisor section's non-latency results
        self.gv_execs = {}   # sandbox id -> execs it has run (gvisor section)
        self.gvisor_raw = {}  # its raw samples (timestamped JSON only)
        self.egress = {}     # the egress section's non-latency results
        self.egress_raw = {}  # its raw samples (timestamped JSON only)
        self.lab_dir = None  # the egress section's test network (its processes are ours)
        self.runsc_root = None

    def note(self, s):
        log("note: " + s)
        self.notes.append(s)

    def run_tags(self):
        """This run's directories: every process of ours names one."""
        return tuple(x for x in [d.root for d in self.daemons] + [self.runsc_root, getattr(self, "bin_dir", None),
                                                                 self.lab_dir] if x)

    def mark(self):
        self._mark = cpu_snapshot(self.run_tags())

    def cpu(self):
        """CPU use since the last mark(); see cpu_since."""
        ours = {os.getpid()} | {d.proc.pid for d in self.daemons if d.proc is not None}
        return cpu_since(self._mark, cpu_snapshot(self.run_tags()), ours)

    def record(self, name, samples, cpu=None, **extra):
        self.samples[name] = list(samples)
        self.stats[name] = summarize(samples, **extra)
        if cpu is not None:
            self.stats[name]["cpu"] = cpu
        s = self.stats[name]
        log("%-28s n=%-4d p50=%s p99=%s max=%s %s" % (name, s["n"], s.get("p50"), s.get("p99"), s.get("max"),
                                                     " ".join("%s=%s" % kv for kv in extra.items())))

    def check_errors(self, name, r):
        if r["errors"]:
            self.note("%s: %d errors, first: %s" % (name, len(r["errors"]), r["errors"][0]))
        if r["truncated"]:
            self.note("%s: stopped early by the time budget (%d done)" % (name, len(r["results"])))

    def phase_budget(self):
        """Seconds a phase may take: what is left minus the reserve kept for
        cleanup (a phase past the deadline still gets 0.2 s, so that every
        row has at least a few samples and says it was cut short)."""
        return max(0.2, self.budget.left() - self.a.reserve_s)

    # -- phases ---------------------------------------------------------------------

    def warmup(self, d, n):
        c = Client(d.sock)
        try:
            for _ in range(n):
                sb, _ = c.create()
                d.created.add(sb["id"])
                c.exec_true(sb["id"])
                c.delete(sb["id"])
                d.created.discard(sb["id"])
        finally:
            c.close()

    def density_point(self, d, live, base):
        time.sleep(self.a.settle_s)
        shim, init, cgm, brs = [], [], [], []
        for sb in live:
            h = sb.get("host") or {}
            shim.append(smaps_pss_kib(h.get("shim_pid", -1)) or 0)
            init.append(smaps_pss_kib(h.get("init_pid", -1)) or 0)
            b, br = sandbox_cgroup_memory(d.instance, sb["id"], d.cgroup)
            cgm.append((b or 0) / 1024.0)
            brs.append(br)
        n = len(live)
        rss = d.rss_kib() or 0
        avail = meminfo_kib("MemAvailable") or 0
        mean = lambda v: sum(v) / len(v) if v else 0.0  # noqa: E731
        hutchd_growth = (rss - base["rss_kib"]) / n
        br_mean = {}
        for br in brs:
            for k, v in br.items():
                br_mean[k] = br_mean.get(k, 0) + v / n / 1048576.0
        p = {
            "live": n,
            "shim_pss_mib": round(mean(shim) / 1024, 3),
            "init_pss_mib": round(mean(init) / 1024, 3),
            "cgroup_mib": round(mean(cgm) / 1024, 3),
            "cgroup_breakdown_mib": {k: round(v, 3) for k, v in sorted(br_mean.items())},
            "hutchd_rss_growth_mib": round(hutchd_growth / 1024, 3),
            "hutchd_rss_mib": round(rss / 1024, 1),
            "host_memavailable_drop_mib": round((base["avail_kib"] - avail) / n / 1024, 3),
        }
        p["per_sandbox_mib"] = round(p["shim_pss_mib"] + p["init_pss_mib"] + p["cgroup_mib"] + p["hutchd_rss_growth_mib"], 3)
        p["per_sandbox_mib_without_init_pss"] = round(p["per_sandbox_mib"] - p["init_pss_mib"], 3)
        self.density.append(p)
        log("density at %d live: %s" % (n, json.dumps(p)))
        return p

    def run_nopool(self):
        a = self.a
        d = Hutchd(self.build, "no-pool", pool=0)
        self.daemons.append(d)
        h = d.start()
        self.cgroup_version = h.get("cgroup")
        log("hutchd (no pool) instance %s, cgroup %s" % (d.instance, d.cgroup))
        self.warmup(d, a.warmup)

        # API floor: GET /healthz, keep-alive.
        self.mark()
        r = run_concurrent(d.sock, a.n_health, 1, lambda c, i: c.healthz()[2], self.phase_budget())
        self.check_errors("healthz", r)
        self.record("healthz_keepalive", r["results"], cpu=self.cpu())

        # Sequential creates (kept alive), bwrap/runsc interleaved, density points on the way.
        base = {"rss_kib": d.rss_kib() or 0, "avail_kib": meminfo_kib("MemAvailable") or 0}
        points = sorted({p for p in a.density if 0 < p <= a.n_create})
        n_total = max([a.n_create] + points)
        runsc_every = max(1, n_total // max(1, a.n_runsc)) if a.n_runsc else 0
        c = Client(d.sock)
        create_ms, bwrap_ms, runsc_ms, live = [], [], [], []
        errors = []
        log_offset = os.path.getsize(d.logf)
        stop_at = time.monotonic() + self.phase_budget()
        self.mark()
        for i in range(n_total):
            if time.monotonic() > stop_at:
                self.note("sequential creates stopped early by the time budget at %d" % i)
                break
            try:
                sb, ms = c.create()
            except (ApiError, OSError) as e:
                errors.append(repr(e))
                if len(errors) > 5:
                    break
                continue
            d.created.add(sb["id"])
            live.append(sb)
            create_ms.append(ms)
            if len(bwrap_ms) < a.n_bwrap:
                try:
                    bwrap_ms.append(run_baseline(BWRAP_ARGV))
                except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                    self.note("bwrap failed: %s" % e)
                    a.n_bwrap = 0
            if runsc_every and i % runsc_every == 0 and len(runsc_ms) < a.n_runsc:
                try:
                    runsc_ms.append(run_baseline(self.runsc_argv(), timeout=60))
                except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                    self.note("runsc failed: %s" % e)
                    a.n_runsc = 0
            if len(live) in points:
                self.density_point(d, live, base)
        cpu = self.cpu()
        if errors:
            self.note("sequential creates: %d errors, first: %s" % (len(errors), errors[0]))
        # Baselines not finished in the interleaved loop (N larger than creates).
        while len(bwrap_ms) < a.n_bwrap and self.budget.ok(a.reserve_s):
            bwrap_ms.append(run_baseline(BWRAP_ARGV))
        while len(runsc_ms) < a.n_runsc and self.budget.ok(a.reserve_s):
            runsc_ms.append(run_baseline(self.runsc_argv(), timeout=60))
        self.record("create_seq_nopool", create_ms, cpu=cpu, live_at_end=len(live))
        if bwrap_ms:
            self.record("bwrap", bwrap_ms)
        if runsc_ms:
            self.record("runsc", runsc_ms)
        self.server_breakdown(d, log_offset)
        if a.probes:
            self.probe_cgroup_attach()

        # Exec round trips, with every sandbox above still alive.
        if live:
            sid = live[0]["id"]
            self.mark()
            r = run_concurrent(d.sock, a.n_exec, 1, lambda cl, i: cl.exec_true(sid)[1], self.phase_budget())
            self.check_errors("exec", r)
            self.record("exec_keepalive", r["results"], cpu=self.cpu(), live=len(live), reconnects=r["reconnects"])
            self.mark()
            r = run_concurrent(d.sock, a.n_exec_fresh, 1, lambda cl, i: cl.exec_true(sid)[1], self.phase_budget(),
                               keepalive=False)
            self.check_errors("exec (new connection)", r)
            self.record("exec_newconn", r["results"], cpu=self.cpu(), live=len(live))
            self.mark()
            r = run_concurrent(d.sock, a.n_exec, a.concurrency,
                               lambda cl, i: cl.exec_true(live[i % len(live)]["id"])[1], self.phase_budget())
            self.check_errors("exec c8", r)
            self.record("exec_c%d" % a.concurrency, r["results"], cpu=self.cpu(),
                        per_s=round(len(r["results"]) / r["wall_s"], 1))
        c.close()

        # Sequential deletes of everything above.
        c = Client(d.sock)
        del_ms = []
        self.mark()
        for sb in live:
            if not self.budget.ok(a.reserve_s / 2):
                break
            try:
                del_ms.append(c.delete(sb["id"])[1])
                d.created.discard(sb["id"])
            except (ApiError, OSError) as e:
                self.note("delete: %s" % e)
        c.close()
        self.record("delete_seq", del_ms, cpu=self.cpu())

        # Creates at concurrency 8 (kept alive), then deletes at concurrency 8.
        def create_one(cl, i):
            sb, ms = cl.create()
            with self.lock:
                d.created.add(sb["id"])
            return ms
        self.mark()
        r = run_concurrent(d.sock, a.n_create, a.concurrency, create_one, self.phase_budget())
        self.check_errors("create c8", r)
        self.record("create_c%d_nopool" % a.concurrency, r["results"], cpu=self.cpu(),
                    per_s=round(len(r["results"]) / r["wall_s"], 1))
        self.mark()
        r = d.delete_all(conc=a.concurrency, budget_s=self.phase_budget())
        self.check_errors("delete c8", r)
        self.record("delete_c%d" % a.concurrency, r["results"], cpu=self.cpu(),
                    per_s=round(len(r["results"]) / r["wall_s"], 1))

        # create + exec + delete cycles at concurrency 8.
        def cycle(cl, i):
            t0 = time.perf_counter()
            sb, _ = cl.create()
            with self.lock:
                d.created.add(sb["id"])
            cl.exec_true(sb["id"])
            cl.delete(sb["id"])
            with self.lock:
                d.created.discard(sb["id"])
            return (time.perf_counter() - t0) * 1000.0
        self.mark()
        r = run_concurrent(d.sock, a.n_cycles, a.concurrency, cycle, self.phase_budget())
        cpu = self.cpu()
        self.check_errors("cycles", r)
        done = len(r["results"])
        ours_cpu_s = max(0.0, cpu["busy_cpu_s"] - cpu["others_cpu_s"])
        cpu_per_cycle = ours_cpu_s / done * 1000.0 if done else None
        self.record("cycles_c%d" % a.concurrency, r["results"], cpu=cpu, per_s=round(done / r["wall_s"], 1),
                    wall_s=round(r["wall_s"], 3),
                    cpu_ms_per_cycle=round(cpu_per_cycle, 2) if cpu_per_cycle else None,
                    quiet_machine_estimate_per_s=round(1000.0 * (os.cpu_count() or 1) / cpu_per_cycle, 1)
                    if cpu_per_cycle else None)
        self.stats["cycles_c8"] = self.stats["cycles_c%d" % a.concurrency]

        d.delete_all(conc=a.concurrency, budget_s=60)
        d.stop(drain_pool=False)
        left = d.cleanup_host()
        if left:
            self.note("hutchd (no pool) left behind after SIGTERM: %s" % "; ".join(left)[:500])

    def server_breakdown(self, d, offset):
        """hutchd's own account of each create (its `sandbox.created` log
        line: dur_ms from dequeue to running, of which rootfs_ms preparing the
        root and shim_ms from launching hutch-shim to its ready report)."""
        try:
            with open(d.logf, "rb") as f:
                f.seek(offset)
                txt = f.read().decode("utf-8", "replace")
        except OSError:
            return
        cols = {"dur_ms": [], "rootfs_ms": [], "shim_ms": []}
        for line in txt.splitlines():
            if "event=sandbox.created" not in line:
                continue
            for k in cols:
                i = line.find(" %s=" % k)
                if i >= 0:
                    try:
                        cols[k].append(float(line[i + len(k) + 2:].split()[0].strip('"')))
                    except ValueError:
                        pass
        for k, v in cols.items():
            if v:
                self.record("server_create_" + k.replace("_ms", ""), v)

    def probe_cgroup_attach(self):
        """Kernel floor: moving a process into a cgroup by writing
        cgroup.procs, the step every native create takes once.  On a kernel
        without favordynmods the write waits for an RCU grace period unless
        another migration happened within the last one, so the probe runs
        both spaced out (like sequential creates) and back to back."""
        m = cgroup_mounts()
        ctrl = "memory" if self.cgroup_version == "v1" and "memory" in m else None
        root = m.get(ctrl) if ctrl else (m.get("unified") if self.cgroup_version == "v1" else "/sys/fs/cgroup")
        if not root:
            return
        cg = os.path.join(root, "hbench-probe-%d" % os.getpid())
        try:
            os.mkdir(cg)
        except OSError as e:
            self.note("cgroup attach probe skipped: %s" % e)
            return
        try:
            for label, gap in (("spaced", 0.05), ("b2b", 0.0)):
                ts = []
                for _ in range(self.a.n_probe):
                    p = subprocess.Popen(["sleep", "30"], stdin=subprocess.DEVNULL)
                    try:
                        time.sleep(gap)
                        t0 = time.perf_counter()
                        with open(os.path.join(cg, "cgroup.procs"), "w") as f:
                            f.write(str(p.pid))
                        ts.append((time.perf_counter() - t0) * 1000.0)
                    finally:
                        p.kill()
                        p.wait()
                self.record("probe_cgroup_attach_" + label, ts, gap_ms=gap * 1000, hierarchy=ctrl or "v2")
        finally:
            for _ in range(50):
                try:
                    os.rmdir(cg)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)

    def run_pool(self):
        a = self.a
        P = a.pool
        d = Hutchd(self.build, "pool", pool=P)
        self.daemons.append(d)
        d.start()
        log("hutchd (--pool %d) instance %s" % (P, d.instance))
        t = d.wait_pool(P, 120)
        if t is None:
            self.note("pool never reached %d ready in 120 s" % P)
            return
        self.stats["pool_initial_fill_s"] = round(t, 3)
        # Warm-up: one claim, delete, refill.
        self.warmup(d, 1)
        d.wait_pool(P, 60)

        def seq(name, n, pace_s):
            c = Client(d.sock)
            ms_all, claims, normal = [], [], []
            stop_at = time.monotonic() + self.phase_budget()
            for i in range(n):
                if time.monotonic() > stop_at:
                    self.note("%s stopped early by the time budget at %d" % (name, i))
                    break
                try:
                    sb, ms = c.create()
                except (ApiError, OSError) as e:
                    self.note("%s: %s" % (name, e))
                    break
                d.created.add(sb["id"])
                ms_all.append(ms)
                (claims if sb.get("from_pool") else normal).append(ms)
                if pace_s:
                    time.sleep(pace_s)
            c.close()
            return ms_all, claims, normal

        # 1. Back-to-back sequential creates: the pool drains, then refills behind.
        self.mark()
        ms_all, claims, normal = seq("pool back-to-back", a.n_create, 0)
        cpu = self.cpu()
        refill = d.wait_pool(P, 120)
        self.record("create_seq_pool_b2b", ms_all, cpu=cpu, from_pool=len(claims))
        if claims:
            self.record("create_seq_pool_b2b_claims", claims)
        if normal:
            self.record("create_seq_pool_b2b_fallback", normal)
        d.delete_all(conc=a.concurrency, budget_s=self.phase_budget())
        if refill is not None:
            self.stats["pool_refill"] = {"size": P, "seconds": round(refill, 3),
                                         "per_s": round(P / refill, 1) if refill > 0 else None,
                                         "live_while_refilling": len(ms_all)}
        refill_interval = (refill / P) if refill else 0.05
        d.wait_pool(P, 120)

        # 2. Paced sequential creates, a pause between them so that the pool can keep up.
        pace = a.pool_pace_ms / 1000.0 if a.pool_pace_ms is not None else max(0.02, 1.25 * refill_interval)
        self.mark()
        ms_all, claims, normal = seq("pool paced", a.n_create, pace)
        self.record("create_seq_pool_paced", ms_all, cpu=self.cpu(), from_pool=len(claims), pace_ms=round(pace * 1000, 1))
        self.record("create_seq_pool_claims", claims, pace_ms=round(pace * 1000, 1), of=len(ms_all))
        if normal:
            self.record("create_seq_pool_paced_fallback", normal)
        d.delete_all(conc=a.concurrency, budget_s=self.phase_budget())
        d.wait_pool(P, 120)

        # 3. Concurrency 8, back-to-back.
        fp = [0]

        def create_one(cl, i):
            sb, ms = cl.create()
            with self.lock:
                d.created.add(sb["id"])
                if sb.get("from_pool"):
                    fp[0] += 1
            return ms
        self.mark()
        r = run_concurrent(d.sock, a.n_create, a.concurrency, create_one, self.phase_budget())
        self.check_errors("pool create c8", r)
        self.record("create_c%d_pool" % a.concurrency, r["results"], cpu=self.cpu(), from_pool=fp[0],
                    per_s=round(len(r["results"]) / r["wall_s"], 1))
        d.delete_all(conc=a.concurrency, budget_s=max(30, self.phase_budget()))
        d.stop(drain_pool=True)
        left = d.cleanup_host()
        if left:
            self.note("hutchd (pool) left behind after draining and SIGTERM: %s" % "; ".join(left)[:500])

    # -- storage: the btrfs pool ----------------------------------------------------

    STORAGE_TEMPLATE = "hbench-big"

    def run_storage(self):
        """Templates, snapshots, fork and export on hutchd's btrfs pool, on a
        hutchd of its own: (1) create latency from a template holding
        --storage-mib MiB of random data vs from `busybox`, interleaved;
        (2) snapshot time and bytes stored after changing 1 MiB of that
        root; (4) incremental vs full export size; (3) fork of
        --fork-count copies of a running sandbox.  Everything it makes is
        deleted at the end."""
        a = self.a
        mib = a.storage_mib
        d = Hutchd(self.build, "storage", pool=0)
        self.daemons.append(d)
        h = d.start()
        if not getattr(self, "cgroup_version", None):
            self.cgroup_version = h.get("cgroup")
        log("hutchd (storage) instance %s" % d.instance)
        S = self.storage
        end = time.monotonic() + self.phase_budget()

        def left():
            return end - time.monotonic()

        def over(what, done):
            if left() > 0:
                return False
            self.note("storage: %s stopped early by the time budget (%d done)" % (what, done))
            return True

        c = Client(d.sock, timeout=120)
        try:
            info, _ = self.storage_info(c)
            S.update({"backend": info.get("backend"), "quotas": info.get("quotas"), "image": info.get("image"),
                      "path": info.get("path"),
                      "pool_size_bytes": info.get("size_bytes"), "template_mib": mib})
            if info.get("backend") != "btrfs":
                self.note("storage: the pool is `%s` (%s): section skipped" % (info.get("backend"),
                                                                              info.get("fallback_reason")))
                return
            self.storage_setup(d, c, mib, left)
            if left() > 0:
                self.storage_creates(d, c, over)
            if left() > 0:
                sid, chain = self.storage_snapshots(d, c, mib, over)
                if len(chain) >= 2 and left() > 0:
                    self.storage_export(d, chain, mib, left)
                if left() > 0:
                    self.storage_fork(d, c, sid, over)
        finally:
            c.close()
            self.retire_daemon(d, "storage", conc=4, budget_s=60)

    def retire_daemon(self, d, what, conc, budget_s):
        """Delete a section's sandboxes, snapshots and templates, stop its
        hutchd, and note anything left on the host."""
        try:
            d.delete_all(conc=conc, budget_s=budget_s)
            bad = d.delete_storage(budget_s=60)
            if bad:
                self.note("%s cleanup: %s" % (what, "; ".join(bad)[:500]))
        except (ApiError, OSError) as e:
            self.note("%s cleanup through the API failed: %r" % (what, e))
        d.stop(drain_pool=False)
        lo = d.cleanup_host()
        if lo:
            self.note("hutchd (%s) left behind after SIGTERM: %s" % (what, "; ".join(lo)[:500]))

    def storage_info(self, c):
        """GET /v1/storage?sync=true: the pool, after a btrfs commit (so
        used_bytes is exact)."""
        st, js, ms = c.request("GET", "/v1/storage?sync=true")
        if st != 200 or not isinstance(js, dict):
            raise ApiError("storage: %s %s" % (st, json.dumps(js)[:300]))
        return js, ms

    def storage_settle(self, c, timeout=30.0):
        """Wait until btrfs has finished cleaning deleted subvolumes (a
        delete frees its space in the background, which would shrink the
        next used_bytes deltas).  The cleaner runs after a transaction
        commit, so: commit (GET /v1/storage?sync=true), `btrfs subvolume
        sync` on the pool for up to 2 s, again until it returns; then until
        two synced used_bytes 0.3 s apart agree.  Returns seconds."""
        t0 = time.monotonic()
        path = self.storage.get("path")
        if path and shutil.which("btrfs"):
            while time.monotonic() - t0 < timeout:
                self.storage_info(c)
                try:
                    r = subprocess.run(["btrfs", "subvolume", "sync", path], capture_output=True, timeout=2)
                    if r.returncode == 0:
                        break
                except subprocess.TimeoutExpired:
                    continue
                except (OSError, subprocess.SubprocessError):
                    break
        prev = None
        while time.monotonic() - t0 < timeout:
            u = self.storage_info(c)[0]["used_bytes"]
            if u == prev:
                break
            prev = u
            time.sleep(0.3)
        return round(time.monotonic() - t0, 2)

    def take_snapshot(self, d, c, sid):
        st, js, ms = c.request("POST", "/v1/sandboxes/%s/snapshots" % sid, {})
        if isinstance(js, dict) and js.get("id"):
            d.snapshots.add(js["id"])
        if st != 201 or not isinstance(js, dict) or js.get("state") != "ready":
            raise ApiError("snapshot: %s %s" % (st, json.dumps(js)[:500]))
        return js, ms

    def exec_ok(self, c, sid, argv, timeout_s=60):
        st, js, ms = c.request("POST", "/v1/sandboxes/%s/exec" % sid, {"argv": argv, "timeout_s": int(timeout_s)})
        if st != 200 or not isinstance(js, dict) or js.get("exit_code") != 0:
            raise ApiError("exec %s: %s %s" % (" ".join(argv), st, json.dumps(js)[:500]))
        return js, ms

    def storage_setup(self, d, c, mib, left):
        """The big template: a busybox sandbox writes `mib` MiB of random
        data (incompressible) to /root/big, is snapshotted, and a template is
        made from the snapshot.  The writer and the snapshot are deleted."""
        S = self.storage
        t0 = time.monotonic()
        w, _ = c.create({"template": "busybox", "resources": {"disk_mib": max(4096, 2 * mib + 1024)}})
        d.created.add(w["id"])
        tmo = max(30, min(600, int(left())))
        cw = Client(d.sock, timeout=tmo + 30)
        try:
            _, ms_write = self.exec_ok(cw, w["id"], ["dd", "if=/dev/urandom", "of=/root/big", "bs=1M",
                                                     "count=%d" % mib], timeout_s=tmo)
            js, _ = self.exec_ok(cw, w["id"], ["stat", "-c", "%s", "/root/big"])
            if int(js["stdout"].strip()) != mib << 20:
                raise ApiError("the writer's /root/big is %s bytes, not %d" % (js["stdout"].strip(), mib << 20))
            snap0, ms_snap0 = self.take_snapshot(d, cw, w["id"])
            d.templates.add(self.STORAGE_TEMPLATE)
            st, js, ms_tpl = cw.request("POST", "/v1/templates?wait=true", {
                "name": self.STORAGE_TEMPLATE, "source": "snapshot", "snapshot": snap0["id"]})
            if st != 201 or not isinstance(js, dict) or js.get("state") != "ready":
                raise ApiError("template from snapshot: %s %s" % (st, json.dumps(js)[:500]))
        finally:
            cw.close()
        S["setup"] = {"write_ms": round(ms_write, 1), "first_snapshot_ms": round(ms_snap0, 1),
                      "template_from_snapshot_ms": round(ms_tpl, 1), "template_size_bytes": js.get("size_bytes"),
                      "wall_s": round(time.monotonic() - t0, 2)}
        c.delete(w["id"])
        d.created.discard(w["id"])
        st, _, _ = c.request("DELETE", "/v1/snapshots/%s" % snap0["id"])
        if st in (200, 204, 404):
            d.snapshots.discard(snap0["id"])
        log("storage: %d MiB template `%s` ready: %s" % (mib, self.STORAGE_TEMPLATE, json.dumps(S["setup"])))

    def storage_creates(self, d, c, over):
        """(1) create-to-ready (?wait=true) from the big template and from
        busybox, alternating which goes first, each deleted at once."""
        a = self.a
        bodies = {"tiny": {"template": "busybox"}, "big": {"template": self.STORAGE_TEMPLATE}}
        for k in ("tiny", "big", "tiny", "big"):  # warm-up, untimed
            sb, _ = c.create(bodies[k])
            d.created.add(sb["id"])
            c.delete(sb["id"])
            d.created.discard(sb["id"])
        lat = {"tiny": [], "big": []}
        kind = {}
        log_off = os.path.getsize(d.logf)
        self.mark()
        for i in range(a.storage_creates):
            if over("creates", i):
                break
            for k in (("tiny", "big") if i % 2 == 0 else ("big", "tiny")):
                sb, ms = c.create(bodies[k])
                d.created.add(sb["id"])
                kind[sb["id"]] = k
                lat[k].append(ms)
                c.delete(sb["id"])
                d.created.discard(sb["id"])
        cpu = self.cpu()
        self.record("storage_create_tiny", lat["tiny"], cpu=cpu, template="busybox")
        self.record("storage_create_big", lat["big"], cpu=cpu, template=self.STORAGE_TEMPLATE)
        # hutchd's view: rootfs_ms (the root: a btrfs snapshot of the template) of each kind.
        rootfs = {"tiny": [], "big": []}
        for e in log_events(d.logf, log_off, "sandbox.created"):
            k = kind.get(e.get("id"))
            try:
                if k:
                    rootfs[k].append(float(e["rootfs_ms"]))
            except (KeyError, ValueError):
                pass
        for k, v in rootfs.items():
            if v:
                self.record("storage_create_%s_rootfs" % k, v)
        t, b = self.stats["storage_create_tiny"], self.stats["storage_create_big"]
        if t.get("n") and b.get("n"):
            self.storage["create_ratio"] = {q: round(b[q] / t[q], 3) for q in ("p50", "p90", "p99")}
            self.storage["create_ratio_p50"] = self.storage["create_ratio"]["p50"]

    def storage_snapshots(self, d, c, mib, over):
        """(2) a sandbox from the big template, a first snapshot, then K
        times: pool used_bytes (synced), overwrite 1 MiB of /root/big at a
        random MiB offset, POST a snapshot (timed), used_bytes again."""
        a = self.a
        sb, _ = c.create({"template": self.STORAGE_TEMPLATE, "resources": {"disk_mib": 4096}})
        sid = sb["id"]
        d.created.add(sid)
        first, _ = self.take_snapshot(d, c, sid)
        chain = [first["id"]]
        # The creates above deleted subvolumes: let btrfs finish freeing them.
        self.storage["settle_s_before_snapshots"] = self.storage_settle(c)
        log_off = os.path.getsize(d.logf)
        rng = random.Random(a.storage_seed)
        snap_ms, stored, exec_ms, offsets = [], [], [], []
        dev, io0 = disk_io_ms(self.storage.get("image") or d.data)
        t_io0 = time.monotonic()
        self.mark()
        for i in range(a.storage_snapshots):
            if over("snapshots", i):
                break
            off = rng.randrange(mib)
            before, _ = self.storage_info(c)
            _, ems = self.exec_ok(c, sid, ["dd", "if=/dev/urandom", "of=/root/big", "bs=1M", "count=1",
                                           "seek=%d" % off, "conv=notrunc"])
            js, ms = self.take_snapshot(d, c, sid)
            after, _ = self.storage_info(c)
            chain.append(js["id"])
            snap_ms.append(ms)
            exec_ms.append(ems)
            offsets.append(off)
            stored.append(after["used_bytes"] - before["used_bytes"])
        cpu = self.cpu()
        _, io1 = disk_io_ms(self.storage.get("image") or d.data)
        extra = {}
        if io0 is not None and io1 is not None:
            extra = {"disk": dev, "disk_busy_pct": round(100.0 * (io1 - io0) / 1000.0 / max(1e-3, time.monotonic() - t_io0), 1)}
        js, _ = self.exec_ok(c, sid, ["stat", "-c", "%s", "/root/big"])
        if int(js["stdout"].strip()) != mib << 20:
            self.note("storage: /root/big changed size to %s bytes during the snapshot loop" % js["stdout"].strip())
        self.record("storage_snapshot", snap_ms, cpu=cpu, changed_mib=1, root_mib=mib, **extra)
        ev = {e.get("id"): e for e in log_events(d.logf, log_off, "snapshot.created")}
        dur, frz = [], []
        for s in chain[1:]:
            e = ev.get(s)
            try:
                dur.append(float(e["dur_ms"]))
                frz.append(float(e["frozen_ms"]))
            except (TypeError, KeyError, ValueError):
                pass
        if dur:
            self.record("storage_snapshot_server", dur)
        if frz:
            self.record("storage_snapshot_frozen", frz)
        if exec_ms:
            self.record("storage_change_exec", exec_ms)
        if stored:
            mibs = sorted(x / 1048576.0 for x in stored)
            self.storage["stored_per_snapshot"] = {
                "n": len(mibs), "unit": "MiB", "changed_mib": 1, "min": round(mibs[0], 3),
                "p50": round(pct(mibs, 50), 3), "mean": round(sum(mibs) / len(mibs), 3), "max": round(mibs[-1], 3),
                "how": "GET /v1/storage?sync=true used_bytes (data + metadata) after the snapshot minus before the change"}
            self.storage["stored_mib_per_snapshot_mean"] = round(sum(mibs) / len(mibs), 3)
            self.storage_raw = {"stored_bytes": stored, "change_offsets_mib": offsets}
            log("storage: stored per snapshot (MiB): %s" % json.dumps(self.storage["stored_per_snapshot"]))
        return sid, chain

    def storage_export(self, d, chain, mib, left):
        """(4) the last snapshot exported incrementally against the one
        before (1 MiB changed between them), then in full."""
        last, prev = chain[-1], chain[-2]
        log_off = os.path.getsize(d.logf)
        out = {"snapshot": last, "parent": prev, "changed_bytes": 1 << 20}
        tmo = max(30, min(600, left()))
        st, n, ms, err = stream_get(d.sock, "/v1/snapshots/%s/export?parent=%s" % (last, prev), tmo)
        if st != 200:
            self.note("storage: incremental export: %s %s" % (st, err))
            return
        out.update({"incremental_bytes": n, "incremental_ms": round(ms, 1),
                    "incremental_vs_changed": round(n / float(1 << 20), 3)})
        if left() > 0:
            st, n, ms, err = stream_get(d.sock, "/v1/snapshots/%s/export" % last, max(30, min(600, left() + 60)))
            if st == 200:
                out.update({"full_bytes": n, "full_ms": round(ms, 1), "root_bytes": mib << 20,
                            "full_vs_root": round(n / float(mib << 20), 3),
                            "incremental_vs_full": round(out["incremental_bytes"] / float(n), 5) if n else None})
            else:
                self.note("storage: full export: %s %s" % (st, err))
        ev = log_events(d.logf, log_off, "snapshot.exported")
        for e in ev:
            which = "incremental" if e.get("parent") not in (None, "-") else "full"
            try:
                out[which + "_send_bytes"] = int(e["send_bytes"])
                out[which + "_server_ms"] = float(e["dur_ms"])
            except (KeyError, ValueError):
                pass
        self.storage["export"] = out
        log("storage: export %s" % json.dumps(out))

    def storage_fork(self, d, c, sid, over):
        """(3) POST /fork?wait=true {"count": N} of the running sandbox with
        the big root: wall time until all N copies run; then the copies and
        the fork's snapshot are deleted (timed)."""
        a = self.a
        n = a.fork_count
        cf = Client(d.sock, timeout=max(120, 10 * n))
        fork_ms, per_copy, del_ms = [], [], []
        try:
            for j in range(a.storage_forks):
                if over("forks", j):
                    break
                st, js, ms = cf.request("POST", "/v1/sandboxes/%s/fork?wait=true" % sid, {"count": n})
                ids = [x.get("id") for x in (js or {}).get("sandboxes", []) if x.get("id")] if isinstance(js, dict) else []
                d.created.update(ids)
                snap = js.get("snapshot") if isinstance(js, dict) else None
                if snap:
                    d.snapshots.add(snap)
                running = sum(1 for x in js.get("sandboxes", []) if x.get("state") == "running") if isinstance(js, dict) else 0
                if st != 201 or running != n:
                    self.note("storage: fork: %s, %d/%d copies running: %s" % (st, running, n, json.dumps(js)[:300]))
                    break
                fork_ms.append(ms)
                per_copy.append(ms / n)
                for x in ids:
                    _, dms = c.delete(x)
                    d.created.discard(x)
                    del_ms.append(dms)
                st, _, _ = c.request("DELETE", "/v1/snapshots/%s" % snap)
                if st in (200, 204, 404):
                    d.snapshots.discard(snap)
        finally:
            cf.close()
        if fork_ms:
            self.record("storage_fork", fork_ms, count=n)
            self.record("storage_fork_per_copy", per_copy, count=n)
            self.record("storage_fork_delete", del_ms)

    # -- gvisor: the runtime that keeps memory ---------------------------------------

    # A process that holds state only in memory (tests/integration/
    # test_gvisor_memory.py): a counter it advances on request, an open file,
    # a listening socket on loopback.  GV_ASK talks to it: "add N" or "get"
    # → "<counter> pid=<pid>".
    GV_SERVER = r"""
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
    GV_ASK = ("import socket,sys; c=socket.create_connection(('127.0.0.1',7777),timeout=10); "
              "c.sendall(sys.argv[1].encode()); print(c.recv(100).decode().strip())")
    GV_BODY = {"runtime": "gvisor", "template": "host", "resources": {"memory_mib": 1024}}
    GV_FORK_COUNT = 4

    def gv_ask(self, c, sid, cmd):
        """(counter, pid) from the server in sandbox sid, or raises ApiError."""
        self.gv_execs[sid] = self.gv_execs.get(sid, 0) + 1
        js, _ = self.exec_ok(c, sid, ["python3", "-c", self.GV_ASK, cmd], timeout_s=60)
        try:
            n, pid = js["stdout"].split()
            return int(n), pid
        except (KeyError, ValueError):
            raise ApiError("ask %s: unexpected answer %r" % (cmd, js.get("stdout")))

    def gv_start_server(self, c, sid, timeout=90.0):
        st, js, _ = c.request("POST", "/v1/sandboxes/%s/commands" % sid, {"argv": ["python3", "-c", self.GV_SERVER]})
        if st not in (200, 201):
            raise ApiError("start the server: %s %s" % (st, json.dumps(js)[:300]))
        end = time.monotonic() + timeout
        while True:
            try:
                return self.gv_ask(c, sid, "get")
            except ApiError:
                if time.monotonic() > end:
                    raise
                time.sleep(0.3)

    def gv_lifecycle(self, c, sid, verb):
        st, js, ms = c.request("POST", "/v1/sandboxes/%s/%s?wait=true" % (sid, verb))
        if st != 200 or not isinstance(js, dict):
            raise ApiError("%s: %s %s" % (verb, st, json.dumps(js)[:500]))
        return js, ms

    def gv_image_bytes(self, snap_id):
        """(allocated bytes, apparent bytes) of a full snapshot's memory
        image: POOL/checkpoints/<snap>/, walked."""
        root = os.path.join(self.gvisor.get("pool_path") or "", "checkpoints", snap_id)
        if not os.path.isdir(root):
            return None, None
        alloc = size = 0
        for dp, dns, fns in os.walk(root):
            for fn in fns:
                try:
                    st = os.lstat(os.path.join(dp, fn))
                except OSError:
                    continue
                alloc += st.st_blocks * 512
                size += st.st_size
        return alloc, size

    def run_gvisor(self):
        """The gvisor runtime (runsc, ptrace platform) on a hutchd of its
        own: (1) create to ready, gvisor vs native, interleaved; (2) exec
        `true`; (3) suspend/restore of a sandbox whose Python process holds
        a counter in memory, checking after each restore that it continued;
        (4) full snapshots: memory image size and checkpoint time; (5) fork
        of 4 copies of that running sandbox, checking each copy answers.
        Everything it makes is deleted at the end."""
        G = self.gvisor
        if not shutil.which("runsc"):
            self.note("gvisor: runsc not found: section skipped")
            G["skipped"] = "runsc not found"
            return
        d = Hutchd(self.build, "gvisor", pool=0)
        self.daemons.append(d)
        h = d.start()
        if not getattr(self, "cgroup_version", None):
            self.cgroup_version = h.get("cgroup")
        log("hutchd (gvisor) instance %s" % d.instance)
        end = time.monotonic() + self.phase_budget()

        def over(what, done):
            if end - time.monotonic() > 0:
                return False
            self.note("gvisor: %s stopped early by the time budget (%d done)" % (what, done))
            return True

        c = Client(d.sock, timeout=300)
        try:
            st, js, _ = c.request("GET", "/v1/runtimes")
            rts = {x.get("name"): x for x in (js or {}).get("runtimes", [])} if st == 200 and isinstance(js, dict) else {}
            gv = rts.get("gvisor")
            if not gv or not gv.get("available"):
                self.note("gvisor: hutchd has no available gvisor runtime (%s): section skipped" % (
                    (gv or {}).get("reason") or "GET /v1/runtimes: %s" % st))
                G["skipped"] = "runtime not available"
                return
            G["capabilities"] = gv.get("capabilities")
            G["runsc"] = self.machine.get("runsc")
            try:
                G["pool_path"] = self.storage_info(c)[0].get("path")
            except ApiError:
                G["pool_path"] = os.path.join(d.data, "pool")
            self.gvisor_creates(d, c, over)
            if not over("exec", 0):
                self.gvisor_memory(d, c, over)
        except (ApiError, OSError) as e:
            self.note("gvisor: section stopped: %s" % str(e)[:500])
            G["error"] = str(e)[:500]
        finally:
            c.close()
            self.retire_daemon(d, "gvisor", conc=2, budget_s=120)

    def gvisor_creates(self, d, c, over):
        """(1) POST /v1/sandboxes?wait=true with runtime gvisor and with
        runtime native (template host both), alternating which goes first,
        each deleted at once (the gvisor deletes are timed too)."""
        a = self.a
        bodies = {"gvisor": {"runtime": "gvisor", "template": "host"},
                  "native": {"runtime": "native", "template": "host"}}
        for k in ("gvisor", "native"):  # warm-up, untimed
            sb, _ = c.create(bodies[k])
            d.created.add(sb["id"])
            c.delete(sb["id"])
            d.created.discard(sb["id"])
        lat = {"gvisor": [], "native": []}
        del_ms = []
        kind = {}
        log_off = os.path.getsize(d.logf)
        self.mark()
        for i in range(a.gvisor_creates):
            if over("creates", i):
                break
            for k in (("gvisor", "native") if i % 2 == 0 else ("native", "gvisor")):
                sb, ms = c.create(bodies[k])
                d.created.add(sb["id"])
                if sb.get("runtime") != k:
                    raise ApiError("asked for runtime %s, got %s" % (k, sb.get("runtime")))
                kind[sb["id"]] = k
                lat[k].append(ms)
                _, dms = c.delete(sb["id"])
                d.created.discard(sb["id"])
                if k == "gvisor":
                    del_ms.append(dms)
        cpu = self.cpu()
        self.record("gvisor_create", lat["gvisor"], cpu=cpu, template="host")
        self.record("gvisor_create_native", lat["native"], cpu=cpu, template="host")
        self.record("gvisor_delete", del_ms)
        srv = {"gvisor": [], "native": []}
        for e in log_events(d.logf, log_off, "sandbox.created"):
            k = kind.get(e.get("id"))
            try:
                if k:
                    srv[k].append(float(e["dur_ms"]))
            except (KeyError, ValueError):
                pass
        if srv["gvisor"]:
            self.record("gvisor_create_server", srv["gvisor"])
        g, n = self.stats["gvisor_create"], self.stats["gvisor_create_native"]
        if g.get("n") and n.get("n"):
            self.gvisor["create_ratio_vs_native"] = {q: round(g[q] / n[q], 2) for q in ("p50", "p90", "p99")}
        r = self.stats.get("runsc")
        if g.get("n") and r and r.get("n"):
            self.gvisor["create_ratio_vs_runsc_do"] = {q: round(g[q] / r[q], 2) for q in ("p50", "p90", "p99")}

    def gvisor_memory(self, d, c, over):
        """(2)-(5) on one gvisor sandbox running the Python server."""
        a = self.a
        G = self.gvisor
        # (2) exec round trips of `true`, in a sandbox of their own: every
        # exec a gvisor sandbox ever ran makes its later checkpoints bigger
        # and slower, so that sandbox is suspended and restored once before
        # and once after them (G["exec_growth"]), and then deleted.
        sb, _ = c.create(dict(self.GV_BODY))
        eid = sb["id"]
        d.created.add(eid)
        growth = {}

        def cycle_once(when):
            s, ms_s = self.gv_lifecycle(c, eid, "suspend")
            ck = s.get("checkpoint")
            if ck:
                d.snapshots.add(ck)
            img = self.gv_image_bytes(ck) if ck else (None, None)
            _, ms_r = self.gv_lifecycle(c, eid, "restore")
            growth[when] = {"suspend_ms": round(ms_s, 1), "restore_ms": round(ms_r, 1), "image_allocated_bytes": img[0]}
            if ck:
                st, _, _ = c.request("DELETE", "/v1/snapshots/%s" % ck)
                if st in (200, 204, 404):
                    d.snapshots.discard(ck)
        try:
            cycle_once("before")
        except ApiError as e:
            self.note("gvisor: suspend/restore of the fresh exec sandbox: %s" % str(e)[:300])
        self.mark()
        ex = []
        for i in range(a.gvisor_execs):
            if over("exec", i):
                break
            ex.append(c.exec_true(eid)[1])
        self.record("gvisor_exec", ex, cpu=self.cpu())
        if growth.get("before") and ex and not over("exec growth", 0):
            try:
                cycle_once("after")
                G["exec_growth"] = dict(growth, execs=len(ex))
                log("gvisor: suspend/restore before and after %d execs: %s" % (len(ex), json.dumps(growth)))
            except ApiError as e:
                self.note("gvisor: suspend/restore after %d execs: %s" % (len(ex), str(e)[:300]))
        c.delete(eid)
        d.created.discard(eid)
        if over("server", 0):
            return
        # (3)-(5) on a fresh sandbox running the server.
        sb, _ = c.create(dict(self.GV_BODY))
        sid = sb["id"]
        d.created.add(sid)
        n0, pid0 = self.gv_start_server(c, sid)
        G["server"] = "python3 -c <a counter held in memory, an open file, a socket on 127.0.0.1:7777>"
        try:
            js, _ = self.exec_ok(c, sid, ["sh", "-c", "grep -E '^Vm(RSS|Size)' /proc/%s/status" % pid0.split("=")[-1]])
            G["server_status"] = " ".join(js["stdout"].split())
            self.gv_execs[sid] = self.gv_execs.get(sid, 0) + 1
        except (ApiError, KeyError):
            pass
        # (3) suspend / restore cycles.
        log_off = os.path.getsize(d.logf)
        sus, res, first_exec, imgs, ckpts, execs_before = [], [], [], [], [], []
        ok = bad = 0
        failures = []
        self.mark()
        expect, pid = n0, pid0
        for i in range(a.gvisor_cycles):
            if over("suspend/restore", i):
                break
            ck = None
            try:
                expect, pid = self.gv_ask(c, sid, "add 1")
                execs_before.append(self.gv_execs.get(sid, 0))
                s, ms_s = self.gv_lifecycle(c, sid, "suspend")
                ck = s.get("checkpoint")
                if s.get("state") != "suspended" or not ck:
                    raise ApiError("suspend: state %s, checkpoint %s" % (s.get("state"), ck))
                d.snapshots.add(ck)
                ckpts.append(ck)
                imgs.append(self.gv_image_bytes(ck))
                s, ms_r = self.gv_lifecycle(c, sid, "restore")
                if s.get("state") != "running":
                    raise ApiError("restore: state %s" % s.get("state"))
                sus.append(ms_s)
                res.append(ms_r)
                first_exec.append(c.exec_true(sid)[1])
                self.gv_execs[sid] = self.gv_execs.get(sid, 0) + 1
                n1, pid1 = self.gv_ask(c, sid, "add 1")
                if (n1, pid1) == (expect + 1, pid):
                    ok += 1
                else:
                    bad += 1
                    failures.append("cycle %d: counter %d %s after restore, expected %d %s" % (i, n1, pid1, expect + 1, pid))
                expect = n1
            except (ApiError, OSError) as e:
                bad += 1
                failures.append("cycle %d: %s" % (i, str(e)[:400]))
                self.note("gvisor: suspend/restore cycle %d failed: %s" % (i, str(e)[:400]))
                # Bring the sandbox back (running, the server listening) and go on, up to 3 failures.
                if bad >= 3 or not self.gv_recover(c, sid):
                    break
                try:
                    expect, pid = self.gv_ask(c, sid, "get")
                except ApiError as e2:
                    self.note("gvisor: the server does not answer after recovery: %s" % str(e2)[:300])
                    break
            if ck:
                # Not needed once restored: delete it (not timed; hutchd may keep it).
                st, _, _ = c.request("DELETE", "/v1/snapshots/%s" % ck)
                if st in (200, 204, 404):
                    d.snapshots.discard(ck)
        cpu = self.cpu()
        verdict = {"continued": ok, "of": ok + bad}
        if bad:
            verdict["failed"] = True
            self.note("gvisor: %d of %d suspend/restore cycles FAILED (suspend, restore, or the process did not continue): %s" % (
                bad, ok + bad, "; ".join(failures)[:500]))
        self.record("gvisor_suspend", sus, cpu=cpu, **verdict)
        self.record("gvisor_restore", res, cpu=cpu, **verdict)
        if first_exec:
            self.record("gvisor_restore_first_exec", first_exec)
        G["suspend_restore"] = dict(verdict, failures=failures,
                                    execs_before_suspend=[execs_before[0], execs_before[-1]] if execs_before else None)
        self.gvisor_raw["execs_before_suspend"] = execs_before
        self.gvisor_raw["suspend_ms"], self.gvisor_raw["restore_ms"] = sus, res
        ev = {e.get("id"): e for e in log_events(d.logf, log_off, "snapshot.checkpointed")}
        self.gvisor_ckpt_rows("suspend", ckpts, imgs, ev)
        # (4) full snapshots of the running sandbox (POST …/snapshots {"kind":"full"}).
        log_off = os.path.getsize(d.logf)
        full_ms, full_ids, full_imgs = [], [], []
        for i in range(a.gvisor_full_snapshots):
            if over("full snapshots", i):
                break
            st, js, ms = c.request("POST", "/v1/sandboxes/%s/snapshots" % sid, {"kind": "full"})
            if isinstance(js, dict) and js.get("id"):
                d.snapshots.add(js["id"])
            if st != 201 or not isinstance(js, dict) or js.get("kind") != "full" or not js.get("memory"):
                self.note("gvisor: full snapshot: %s %s" % (st, json.dumps(js)[:300]))
                break
            full_ms.append(ms)
            full_ids.append(js["id"])
            full_imgs.append(self.gv_image_bytes(js["id"]))
        if full_ms:
            try:
                n2, pid2 = self.gv_ask(c, sid, "add 1")
                if (n2, pid2) != (expect + 1, pid):
                    self.note("gvisor: after full snapshots the counter is %d %s, expected %d %s" % (
                        n2, pid2, expect + 1, pid))
                expect = n2
            except ApiError as e:
                self.note("gvisor: the server did not answer after the full snapshots: %s" % e)
            self.record("gvisor_full_snapshot", full_ms)
            ev = {e.get("id"): e for e in log_events(d.logf, log_off, "snapshot.checkpointed")}
            self.gvisor_ckpt_rows("full", full_ids, full_imgs, ev)
            for s in full_ids:
                st, _, _ = c.request("DELETE", "/v1/snapshots/%s" % s)
                if st in (200, 204, 404):
                    d.snapshots.discard(s)
        # (5) fork of 4 copies of the running sandbox, until all run; the copies must answer.
        self.gvisor_fork(d, c, sid, over)

    def gv_recover(self, c, sid):
        """After a failed cycle: the sandbox running again (restore or wake
        as its state needs) and the server answering.  False if not."""
        try:
            st, js, _ = c.request("GET", "/v1/sandboxes/%s" % sid)
            state = js.get("state") if st == 200 and isinstance(js, dict) else None
            if state != "running":
                self.gv_lifecycle(c, sid, "restore" if state == "suspended" else "wake")
            try:
                self.gv_ask(c, sid, "get")
            except ApiError:
                self.note("gvisor: the server's process was lost with the failed cycle: started again")
                self.gv_start_server(c, sid)
            return True
        except (ApiError, OSError) as e:
            self.note("gvisor: could not bring the sandbox back after a failed cycle: %s" % str(e)[:300])
            return False

    def gvisor_ckpt_rows(self, which, ids, imgs, ev):
        """hutchd's snapshot.checkpointed dur_ms / memory_ms of the given
        snapshots, and their memory images' sizes."""
        dur, mem = [], []
        for s in ids:
            e = ev.get(s)
            try:
                dur.append(float(e["dur_ms"]))
                mem.append(float(e["memory_ms"]))
            except (TypeError, KeyError, ValueError):
                pass
        if dur:
            self.record("gvisor_%s_checkpoint_server" % which, dur)
            self.record("gvisor_%s_checkpoint_memory" % which, mem)
        alloc = sorted(x[0] for x in imgs if x and x[0] is not None)
        size = sorted(x[1] for x in imgs if x and x[1] is not None)
        if alloc:
            self.gvisor["image_%s" % which] = {
                "n": len(alloc), "allocated_bytes_p50": int(pct(alloc, 50)), "allocated_bytes_min": alloc[0],
                "allocated_bytes_max": alloc[-1], "apparent_bytes_p50": int(pct(size, 50)),
                "how": "os.walk of POOL/checkpoints/<snap>: st_blocks × 512 (allocated) and st_size (apparent)"}
            self.gvisor_raw.setdefault("image_bytes", {})[which] = [list(x) for x in imgs]
            log("gvisor: %s memory image %s" % (which, json.dumps(self.gvisor["image_%s" % which])))

    def gvisor_fork(self, d, c, sid, over):
        a = self.a
        n = self.GV_FORK_COUNT
        cf = Client(d.sock, timeout=300)
        fork_ms, del_ms, imgs = [], [], []
        answered = copies = 0
        try:
            for j in range(a.gvisor_forks):
                if over("forks", j):
                    break
                try:
                    base, _ = self.gv_ask(c, sid, "add 1")
                except ApiError as e:
                    self.note("gvisor: the parent's server did not answer before fork %d: %s" % (j, e))
                    break
                st, js, ms = cf.request("POST", "/v1/sandboxes/%s/fork?wait=true" % sid, {"count": n})
                ids = [x.get("id") for x in (js or {}).get("sandboxes", []) if x.get("id")] if isinstance(js, dict) else []
                d.created.update(ids)
                snap = js.get("snapshot") if isinstance(js, dict) else None
                if snap:
                    d.snapshots.add(snap)
                    imgs.append(self.gv_image_bytes(snap))
                running = sum(1 for x in js.get("sandboxes", []) if x.get("state") == "running") if isinstance(js, dict) else 0
                if st != 201 or running != n:
                    self.note("gvisor: fork: %s, %d/%d copies running: %s" % (st, running, n, json.dumps(js)[:300]))
                    break
                fork_ms.append(ms)
                # Each copy continues the parent's process: it answers with the parent's counter.
                for k, x in enumerate(ids):
                    copies += 1
                    try:
                        v, _ = self.gv_ask(c, x, "add %d" % (k + 1))
                        if v == base + k + 1:
                            answered += 1
                        else:
                            self.note("gvisor: fork copy %s answered %d, expected %d" % (x, v, base + k + 1))
                    except ApiError as e:
                        self.note("gvisor: fork copy %s did not answer: %s" % (x, e))
                for x in ids:
                    _, dms = c.delete(x)
                    d.created.discard(x)
                    del_ms.append(dms)
                st, _, _ = c.request("DELETE", "/v1/snapshots/%s" % snap)
                if st in (200, 204, 404):
                    d.snapshots.discard(snap)
        finally:
            cf.close()
        if fork_ms:
            extra = {"count": n, "copies_answered": answered, "copies": copies}
            if answered != copies:
                extra["failed"] = True
            self.record("gvisor_fork", fork_ms, **extra)
            self.record("gvisor_fork_per_copy", [x / n for x in fork_ms], count=n)
            self.record("gvisor_fork_delete", del_ms)
            self.gvisor["fork"] = {"count": n, "copies_answered": answered, "copies": copies}
            alloc = sorted(x[0] for x in imgs if x and x[0] is not None)
            if alloc:
                self.gvisor["fork"]["image_allocated_bytes_p50"] = int(pct(alloc, 50))

    # -- egress (hutch-gateway) ------------------------------------------------------

    def eg_client(self, where, cfg, c, sid, lab):
        """Run EGRESS_CLIENT once on one path ("gw": exec in the sandbox, so
        through the gateway; "direct": in the lab's client namespace) and
        return its parsed output."""
        timeout = int(cfg["limit_s"]) + 30
        if where == "gw":
            st, js, _ = c.request("POST", "/v1/sandboxes/%s/exec" % sid,
                                  {"argv": ["python3", "-c", EGRESS_CLIENT, json.dumps(cfg)], "timeout_s": timeout})
            if st != 200 or not isinstance(js, dict):
                raise ApiError("exec of the egress client: %s %s" % (st, json.dumps(js)[:300]))
            rc, out, err = js.get("exit_code"), js.get("stdout") or "", js.get("stderr") or ""
        else:
            rc, out, err = lab.client(cfg, timeout)
        try:
            return json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise RuntimeError("egress client (%s) exited %s: %s %s" % (where, rc, out[-300:], err[-600:]))

    def eg_stop_gateway(self, d):
        """Stop this instance's hutch-gateway if it is still running after
        hutchd (hutchd stops it when it exits with no sandbox left; older
        builds left it running by design), by pid: its command line names
        the instance's run dir."""
        mine = lambda: [p for p in pids() if "hutch-gateway" in proc_cmdline(p)  # noqa: E731
                        and (d.run + "/") in proc_cmdline(p)]
        victims = mine()
        for p in victims:
            try:
                os.kill(p, signal.SIGTERM)
            except ProcessLookupError:
                pass
        end = time.monotonic() + 5
        while mine() and time.monotonic() < end:
            time.sleep(0.05)
        for p in mine():
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return victims

    def run_egress(self):
        """Egress through hutch-gateway (docs/network.md) against a test
        network of the bench's own namespaces (EgressLab), beside the same
        client on a direct path with no gateway: (1) GET of a small page,
        new connection per request, HTTP (transparent :80) and HTTPS (:443,
        TLS terminated by the gateway); (2) download of a large body,
        MiB/s; (3) a DNS A query for the allowed name.  Everything it makes
        (sandbox, hutchd, gateway, nftables table, namespaces) is removed at
        the end."""
        a = self.a
        E = self.egress
        missing = [t for t in ("nft", "ip", "openssl") if not shutil.which(t)]
        if not os.access(os.path.join(self.build, "hutch-gateway"), os.X_OK):
            missing.append("hutch-gateway (not built)")
        if missing:
            self.note("egress: %s missing: section skipped" % ", ".join(missing))
            E["skipped"] = "missing: " + ", ".join(missing)
            return
        small, big = a.egress_page_bytes, a.egress_mib * 1048576
        E.update({"page_bytes": small, "download_mib": a.egress_mib, "nft": tool_version(["nft", "--version"])})
        lab = EgressLab(small, big)
        self.lab_dir = lab.dir
        d = c = None
        try:
            lab.start()
            E["lab"] = {"server": lab.srv_ip, "direct_client": lab.cli_ip, "name": EGRESS_NAME}
            log("egress lab: server %s (ns %s), direct client %s (ns %s)" % (lab.srv_ip, lab.ns_srv, lab.cli_ip,
                                                                             lab.ns_cli))
            d = Hutchd(self.build, "egress", pool=0, extra_args=[
                "--egress", "--gateway-dns", lab.dns, "--gateway-upstream-ca", lab.ca,
                "--gateway-public-cidr", "10.232.0.0/16"])
            self.daemons.append(d)
            h = d.start()
            if not getattr(self, "cgroup_version", None):
                self.cgroup_version = h.get("cgroup")
            log("hutchd (egress) instance %s" % d.instance)
            c = Client(d.sock, timeout=600)
            policy = {"allow": ["%s:80" % EGRESS_NAME, "%s:443" % EGRESS_NAME]}
            sb, ms = c.create({"template": "host", "network": {"egress": policy}})
            d.created.add(sb["id"])
            E["policy"] = policy
            E["sandbox_create_ms"] = round(ms, 2)
            self.egress_measure(c, sb["id"], lab, small, big)
            st, js, _ = c.request("GET", "/v1/sandboxes/%s/egress?limit=100000" % sb["id"])
            if st == 200 and isinstance(js, dict):
                counts = {}
                for x in js.get("decisions", []):
                    k = "%s %s" % (x.get("proto"), x.get("decision"))
                    counts[k] = counts.get(k, 0) + 1
                E["audit_decisions"] = counts
        except (ApiError, OSError, RuntimeError, subprocess.SubprocessError) as e:
            self.note("egress: section stopped: %s" % str(e)[:500])
            E["error"] = str(e)[:500]
        finally:
            if c is not None:
                c.close()
            if d is not None:
                try:
                    d.delete_all(conc=2, budget_s=60)
                except (ApiError, OSError) as e:
                    self.note("egress cleanup through the API failed: %r" % e)
                d.stop(drain_pool=False)
                self.eg_stop_gateway(d)
                lo = d.cleanup_host()
                if lo:
                    self.note("hutchd (egress) left behind after SIGTERM: %s" % "; ".join(lo)[:500])
                if d.instance:
                    # The instance's nftables table, if hutchd left it (older builds did, by design).
                    t = "hutch_egress_" + d.instance
                    if subprocess.run(["nft", "list", "table", "inet", t], capture_output=True, timeout=30).returncode == 0:
                        r = subprocess.run(["nft", "delete", "table", "inet", t], capture_output=True, text=True,
                                           timeout=30)
                        if r.returncode != 0:
                            self.note("egress cleanup: nft delete table inet %s: %s" % (t, r.stderr.strip()[:200]))
            bad = lab.close()
            if bad:
                self.note("egress lab cleanup: %s" % "; ".join(bad)[:500])
            self.lab_dir = None

    def egress_measure(self, c, sid, lab, small, big):
        a = self.a
        E = self.egress
        end = time.monotonic() + self.phase_budget()

        def left():
            return end - time.monotonic()

        paths = ("gw", "direct")
        # The same client on both paths; in the sandbox the name is resolved
        # through the gateway's DNS once before the loop, the direct client
        # is given the server's address.
        base = {
            "http": {"gw": {"mode": "get", "host": EGRESS_NAME, "addr": "resolve", "port": 80, "tls": False},
                     "direct": {"mode": "get", "host": EGRESS_NAME, "addr": lab.srv_ip, "port": 80, "tls": False}},
            "https": {"gw": {"mode": "get", "host": EGRESS_NAME, "addr": "resolve", "port": 443, "tls": True},
                      "direct": {"mode": "get", "host": EGRESS_NAME, "addr": lab.srv_ip, "port": 443, "tls": True,
                                 "cafile": lab.ca}},
            "dns": {"gw": {"mode": "dns", "host": EGRESS_NAME, "addr": "resolv", "port": 53},
                    "direct": {"mode": "dns", "host": EGRESS_NAME, "addr": lab.srv_ip, "port": 53}},
        }
        counts = {"http": a.egress_requests, "https": a.egress_requests, "dns": a.egress_dns}
        rounds = max(1, a.egress_rounds)
        lat = {(k, p): [] for k in base for p in paths}
        warm = {(k, p): [] for k in base for p in paths}
        errors, truncated = [], False

        def take(kind, where, res, into, winto=None):
            into.extend(res.get("ms", []))
            if winto is not None:
                winto.extend(res.get("warm_ms", []))
            for e in res.get("errors", []):
                errors.append("%s %s: %s" % (kind, where, e))
            return res.get("truncated")

        # (1) and (3): blocks of each path in turn, the order alternating per
        # round, so that both see the same machine.
        log("egress: %d requests per path (HTTP, HTTPS) and %d DNS queries, in %d rounds" % (
            counts["http"], counts["dns"], rounds))
        self.mark()
        for r in range(rounds):
            for kind in ("http", "https", "dns"):
                per = counts[kind] // rounds + (1 if r < counts[kind] % rounds else 0)
                if per <= 0:
                    continue
                for where in (paths if r % 2 == 0 else paths[::-1]):
                    if left() <= 0 or len(errors) > 20:
                        truncated = True
                        break
                    cfg = dict(base[kind][where], path="/small", size=small, n=per, warm=1,
                               limit_s=max(1, min(300, int(left()))))
                    truncated |= bool(take(kind, where, self.eg_client(where, cfg, c, sid, lab),
                                           lat[(kind, where)], warm[(kind, where)]))
        cpu = self.cpu()
        if truncated:
            self.note("egress: latency rows stopped early (time budget or errors)")
        for kind in ("http", "https", "dns"):
            for where in paths:
                self.record("egress_%s_%s" % (kind, where), lat[(kind, where)], cpu=cpu)
        E["first_request_ms"] = {"%s_%s" % k: round(v[0], 3) for k, v in warm.items() if v}
        ratio, added = {}, {}
        for kind in ("http", "https", "dns"):
            g, dr = self.stats.get("egress_%s_gw" % kind), self.stats.get("egress_%s_direct" % kind)
            if g and dr and g.get("n") and dr.get("n"):
                ratio[kind] = {q: round(g[q] / dr[q], 2) for q in ("p50", "p90", "p99") if dr[q]}
                added[kind] = {q: round(g[q] - dr[q], 3) for q in ("p50", "p90", "p99")}
        E["latency_ratio_gw_over_direct"] = ratio
        E["added_ms_gw_minus_direct"] = added

        # (2) downloads of the big body, one per client run, alternating.
        dl = {(k, p): [] for k in ("http", "https") for p in paths}
        truncated = False
        log("egress: %d downloads of %d MiB per path (HTTP, HTTPS)" % (a.egress_downloads, a.egress_mib))
        self.mark()
        for r in range(a.egress_downloads):
            for kind in ("http", "https"):
                for where in (paths if r % 2 == 0 else paths[::-1]):
                    if left() <= 0 or len(errors) > 20:
                        truncated = True
                        break
                    cfg = dict(base[kind][where], path="/big", size=big, n=1, warm=0,
                               limit_s=max(1, min(300, int(left()))))
                    take(kind + " download", where, self.eg_client(where, cfg, c, sid, lab), dl[(kind, where)])
        cpu = self.cpu()
        if truncated:
            self.note("egress: downloads stopped early by the time budget or errors (%d of %d done)" % (
                sum(len(v) for v in dl.values()), 4 * a.egress_downloads))
        tp = {}
        for kind in ("http", "https"):
            row = {}
            for where in paths:
                mib_s = [round(a.egress_mib / (ms / 1000.0), 1) for ms in dl[(kind, where)] if ms > 0]
                med = round(pct(sorted(mib_s), 50), 1) if mib_s else None
                row[where] = {"mib_s_median": med, "mib_s": mib_s}
                self.record("egress_download_%s_%s" % (kind, where), dl[(kind, where)], cpu=cpu, mib_s=med)
            if row["gw"]["mib_s_median"] and row["direct"]["mib_s_median"]:
                row["ratio_gw_over_direct"] = round(row["gw"]["mib_s_median"] / row["direct"]["mib_s_median"], 2)
            tp[kind] = row
        E["throughput"] = tp
        if errors:
            self.note("egress: %d client errors, first: %s" % (len(errors), errors[0][:300]))
            E["errors"] = errors[:20]
        self.egress_raw = {"warm_ms": {"%s_%s" % k: v for k, v in warm.items()},
                           "download_ms": {"%s_%s" % k: v for k, v in dl.items()}}

    def snapshot_binaries(self):
        """Run private copies of the binaries: a `make` elsewhere during the
        run (others work in this tree) must not swap them mid-measurement."""
        src = self.build
        self.bin_dir = tempfile.mkdtemp(prefix="hbench-bin-", dir="/tmp")
        for b in ("hutchd", "hutch-shim", "hutch-init", "hutch-gateway"):
            if b == "hutch-gateway" and not os.path.exists(os.path.join(src, b)):
                continue  # optional: the egress section is skipped without it
            shutil.copy2(os.path.join(src, b), os.path.join(self.bin_dir, b))
        self.build = self.bin_dir
        try:
            self.machine["hutchd_version"] = subprocess.run(
                [os.path.join(self.bin_dir, "hutchd"), "--version"], capture_output=True, text=True,
                timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
        self.machine["build_dir"] = src

    def runsc_argv(self):
        if self.runsc_root is None:
            self.runsc_root = tempfile.mkdtemp(prefix="hbench-rs-", dir="/tmp")
        return ["runsc", "--root", self.runsc_root, "--platform=ptrace", "--network=none", "do", "/bin/true"]

    # -- the whole run ---------------------------------------------------------------

    def run(self):
        self.lock = threading.Lock()
        self.started = datetime.datetime.now(datetime.timezone.utc)
        self.machine = machine_facts()
        self.machine["loadavg_start"] = (read("/proc/loadavg", "") or "").split()[:3]
        self.machine["other_hutch_processes_start"] = other_hutch_processes(["/tmp/hbench-"])
        for tool in ("bwrap", "runsc"):
            if not shutil.which(tool):
                self.note("%s not found: its baseline is skipped" % tool)
                setattr(self.a, "n_" + tool, 0)
        try:
            self.snapshot_binaries()
            if "api" in self.a.only:
                self.run_nopool()
            if "pool" in self.a.only and self.a.pool > 0 and self.budget.ok(self.a.reserve_s):
                self.run_pool()
            if "storage" in self.a.only and self.budget.ok(self.a.reserve_s):
                self.run_storage()
            if "gvisor" in self.a.only and self.budget.ok(self.a.reserve_s):
                self.run_gvisor()
            if "egress" in self.a.only and self.budget.ok(self.a.reserve_s):
                self.run_egress()
        finally:
            for d in self.daemons:
                try:
                    if d.proc is not None and d.proc.poll() is None:
                        try:
                            d.delete_all(conc=4, budget_s=30)
                            bad = d.delete_storage(budget_s=30)
                            if bad:
                                self.note("cleanup (%s): %s" % (d.label, "; ".join(bad)[:500]))
                        except Exception as e:  # noqa: BLE001
                            log("delete_all (%s): %r" % (d.label, e))
                        d.stop(drain_pool=d.pool > 0)
                finally:
                    left = d.cleanup_host()
                    if left:
                        self.note("cleanup (%s): %s" % (d.label, "; ".join(left)[:500]))
            if self.runsc_root:
                self.cleanup_runsc()
            if getattr(self, "bin_dir", None):
                shutil.rmtree(self.bin_dir, ignore_errors=True)
        self.machine["loadavg_end"] = (read("/proc/loadavg", "") or "").split()[:3]
        self.elapsed = self.budget.elapsed()

    def cleanup_runsc(self):
        for p in pids():
            if self.runsc_root in proc_cmdline(p):
                try:
                    os.kill(p, signal.SIGKILL)
                    self.note("killed leftover runsc process %d" % p)
                except ProcessLookupError:
                    pass
        shutil.rmtree(self.runsc_root, ignore_errors=True)


# -- report ----------------------------------------------------------------------------


def fmt(v, nd=2):
    if v is None:
        return "-"
    if isinstance(v, float):
        return ("%%.%df" % nd) % v
    return str(v)


def evaluate_targets(b):
    out = []
    for key, desc, (name, field), op, bound, unit in TARGETS:
        if name == "density_max":
            v = b.density[-1]["per_sandbox_mib"] if b.density else None
        elif name == "storage":
            v = (getattr(b, "storage", None) or {}).get(field)
        else:
            v = (b.stats.get(name) or {}).get(field)
        if v is None:
            verdict = "n/a"
        elif (b.stats.get(name) or {}).get("failed"):
            verdict = "failed"  # measured, but the row's check failed (e.g. the process did not continue)
        else:
            verdict = "met" if (v <= bound if op == "<=" else v >= bound) else "missed"
        out.append({"target": key, "what": desc, "bound": "%s %s %s" % (op, bound, unit), "value": v, "unit": unit,
                    "result": verdict})
    return out


def ratios(b):
    out = {}
    for base in ("bwrap", "runsc"):
        bs = b.stats.get(base)
        if not bs or not bs.get("n"):
            continue
        for name in ("create_seq_nopool", "create_c8_nopool", "create_seq_pool_claims"):
            s = b.stats.get(name)
            if s and s.get("n"):
                out["%s/%s" % (name, base)] = {"p50": round(s["p50"] / bs["p50"], 2), "p90": round(s["p90"] / bs["p90"], 2),
                                               "p99": round(s["p99"] / bs["p99"], 2)}
    return out


def table(b, targets, rat):
    L = []
    a = b.a
    m = b.machine
    g = getattr(b, "git", {}) or {}
    L.append("hutch benchmark  %s  commit %s%s  (%d cores, %s, kernel %s, cgroup %s, %s)" % (
        b.started.strftime("%Y-%m-%d %H:%M UTC"), g.get("commit") or "?", " +uncommitted src" if g.get("src_dirty") else "",
        m["nproc"], m["cpu"], m["kernel"], getattr(b, "cgroup_version", "?"), m["os"]))
    L.append("transport: HTTP/1.1 over hutchd's unix socket; one keep-alive connection per client thread "
             "unless a row says `new connection`; times are request-write to response-end in this Python client")
    L.append("")
    hdr = "%-46s %5s %8s %8s %8s %8s %7s  %s" % ("latency (ms)", "n", "p50", "p90", "p99", "max", "others", "notes")
    L.append(hdr)
    L.append("-" * len(hdr))
    rows = [
        ("GET /healthz (API floor)", "healthz_keepalive", ""),
        ("create, no pool, sequential", "create_seq_nopool", "all kept alive (0 → %d live)" % b.stats.get("create_seq_nopool", {}).get("live_at_end", 0)),
        ("create, no pool, concurrency %d" % a.concurrency, "create_c%d_nopool" % a.concurrency, ""),
        ("create, pool %d, sequential back-to-back" % a.pool, "create_seq_pool_b2b", ""),
        ("  of which pool claims", "create_seq_pool_b2b_claims", ""),
        ("  of which ordinary creates (pool empty)", "create_seq_pool_b2b_fallback", ""),
        ("create, pool %d, sequential paced" % a.pool, "create_seq_pool_paced", ""),
        ("  of which pool claims", "create_seq_pool_claims", ""),
        ("create, pool %d, concurrency %d" % (a.pool, a.concurrency), "create_c%d_pool" % a.concurrency, ""),
        ("exec `true`, keep-alive", "exec_keepalive", ""),
        ("exec `true`, new connection per request", "exec_newconn", ""),
        ("exec `true`, concurrency %d over live sandboxes" % a.concurrency, "exec_c%d" % a.concurrency, ""),
        ("delete, sequential", "delete_seq", ""),
        ("delete, concurrency %d" % a.concurrency, "delete_c%d" % a.concurrency, ""),
        ("create+exec+delete cycle, concurrency %d" % a.concurrency, "cycles_c%d" % a.concurrency, ""),
        ("baseline: bwrap --unshare-all /bin/true", "bwrap", "interleaved with the sequential creates"),
        ("baseline: runsc (gVisor, ptrace) do /bin/true", "runsc", "interleaved with the sequential creates"),
        ("hutchd's view of the sequential creates:", None, ""),
        ("  dequeue → running (sandbox.created dur_ms)", "server_create_dur", ""),
        ("  of which root preparation (rootfs_ms)", "server_create_rootfs", ""),
        ("  of which hutch-shim launch → ready (shim_ms)", "server_create_shim", ""),
        ("kernel probe: write cgroup.procs, 50 ms apart", "probe_cgroup_attach_spaced", "one migration per create"),
        ("kernel probe: write cgroup.procs, back to back", "probe_cgroup_attach_b2b", ""),
    ]
    st = getattr(b, "storage", None) or {}
    if any(k.startswith("storage_") for k in b.stats):
        big = "%s MiB" % st.get("template_mib", "?")
        rows += [
            ("storage (btrfs pool, its own hutchd):", None, ""),
            ("create from busybox template", "storage_create_tiny", "interleaved with the next row; deleted after each"),
            ("create from a %s template" % big, "storage_create_big", "random data"),
            ("  root preparation (rootfs_ms), busybox", "storage_create_tiny_rootfs", "hutchd's log"),
            ("  root preparation (rootfs_ms), %s" % big, "storage_create_big_rootfs", "hutchd's log"),
            ("snapshot, %s root, 1 MiB changed" % big, "storage_snapshot", "running sandbox; POST …/snapshots"),
            ("  hutchd's view (snapshot.created dur_ms)", "storage_snapshot_server", ""),
            ("  of which frozen (frozen_ms)", "storage_snapshot_frozen", ""),
            ("  the change: exec dd 1 MiB conv=notrunc", "storage_change_exec", "not part of the snapshot time"),
            ("fork ×%s of a running %s sandbox" % (b.a.fork_count, big), "storage_fork", "POST …/fork?wait=true, until all run"),
            ("  per copy (fork wall / count)", "storage_fork_per_copy", ""),
            ("  delete a fork copy", "storage_fork_delete", ""),
        ]
    if any(k.startswith("gvisor_") for k in b.stats):
        rows += [
            ("gvisor (runsc, ptrace; its own hutchd):", None, ""),
            ("create, runtime gvisor, template host", "gvisor_create", "interleaved with the next row; deleted after each"),
            ("create, runtime native, template host", "gvisor_create_native", "the same hutchd"),
            ("  hutchd's view, gvisor (created dur_ms)", "gvisor_create_server", ""),
            ("  delete, gvisor", "gvisor_delete", ""),
            ("exec `true` in a gvisor sandbox, keep-alive", "gvisor_exec", ""),
            ("suspend, gvisor, idle Python process", "gvisor_suspend", "memory checkpoint + file snapshot"),
            ("restore, gvisor, idle Python process", "gvisor_restore", "until running"),
            ("  then the first exec `true`", "gvisor_restore_first_exec", ""),
            ("  suspend: checkpointed dur_ms (log)", "gvisor_suspend_checkpoint_server", ""),
            ("  of which memory (memory_ms)", "gvisor_suspend_checkpoint_memory", ""),
            ("full snapshot of the running sandbox", "gvisor_full_snapshot", 'POST …/snapshots {"kind":"full"}'),
            ("  checkpointed dur_ms (log)", "gvisor_full_checkpoint_server", ""),
            ("  of which memory (memory_ms)", "gvisor_full_checkpoint_memory", ""),
            ("fork ×4 of the running gvisor sandbox", "gvisor_fork", "POST …/fork?wait=true, until all run"),
            ("  per copy (fork wall / 4)", "gvisor_fork_per_copy", ""),
            ("  delete a fork copy", "gvisor_fork_delete", ""),
        ]
    if any(k.startswith("egress_") for k in b.stats):
        eg = getattr(b, "egress", None) or {}
        pg, mib = eg.get("page_bytes", "?"), eg.get("download_mib", "?")
        rows += [
            ("egress (hutch-gateway; its own hutchd, lab netns):", None, ""),
            ("GET %s B, HTTP :80, sandbox → gateway" % pg, "egress_http_gw", "transparent; new connection each"),
            ("GET %s B, HTTP :80, direct (no gateway)" % pg, "egress_http_direct", "lab client netns → server netns"),
            ("GET %s B, HTTPS :443, sandbox → gateway" % pg, "egress_https_gw", "TLS terminated by the gateway"),
            ("GET %s B, HTTPS :443, direct (no gateway)" % pg, "egress_https_direct", ""),
            ("download %s MiB, HTTP, sandbox → gateway" % mib, "egress_download_http_gw", ""),
            ("download %s MiB, HTTP, direct" % mib, "egress_download_http_direct", ""),
            ("download %s MiB, HTTPS, sandbox → gateway" % mib, "egress_download_https_gw", ""),
            ("download %s MiB, HTTPS, direct" % mib, "egress_download_https_direct", ""),
            ("DNS A %s, sandbox → gateway" % EGRESS_NAME, "egress_dns_gw", "the gateway asks the lab DNS"),
            ("DNS A %s, direct to the lab DNS" % EGRESS_NAME, "egress_dns_direct", ""),
        ]
    for i, (label, key, note) in enumerate(rows):
        if key is None:
            # a heading: only when a row under it has data
            nxt = [k for _, k, _ in rows[i + 1:]]
            nxt = nxt[:nxt.index(None)] if None in nxt else nxt
            if any((b.stats.get(k) or {}).get("n") for k in nxt):
                L.append(label)
            continue
        s = b.stats.get(key)
        if not s or not s.get("n"):
            continue
        extra = []
        if "from_pool" in s:
            extra.append("from_pool %d/%d" % (s["from_pool"], s["n"]))
        if "disk_busy_pct" in s:
            extra.append("disk %s busy %.0f%% meanwhile" % (s["disk"], s["disk_busy_pct"]))
        if "pace_ms" in s:
            extra.append("pause %s ms between creates" % s["pace_ms"])
        if "per_s" in s:
            extra.append("%s/s" % s["per_s"])
        if s.get("mib_s") is not None:
            extra.append("%.0f MiB/s (median)" % s["mib_s"])
        if "continued" in s:
            extra.append("process continued %d/%d" % (s["continued"], s["of"]))
        if "copies_answered" in s:
            extra.append("copies answered %d/%d" % (s["copies_answered"], s["copies"]))
        if s.get("failed"):
            extra.append("FAILED")
        if s.get("cpu_ms_per_cycle"):
            extra.append("%.1f ms CPU per cycle → ~%s/s on an idle %d-core host" % (
                s["cpu_ms_per_cycle"], s["quiet_machine_estimate_per_s"], b.machine["nproc"]))
        if note:
            extra.append(note)
        cpu = s.get("cpu")
        others = "%.0f%%" % cpu["others_pct"] if cpu else ""
        L.append("%-46s %5d %8s %8s %8s %8s %7s  %s" % (label, s["n"], fmt(s["p50"]), fmt(s["p90"]), fmt(s["p99"]),
                                                        fmt(s["max"]), others, "; ".join(extra)))
    L.append("%-46s %5s %8s %8s %8s %8s %7s  %s" % ("baseline: QEMU boot to agent", "-", "n/a", "", "", "", "",
                                                    "n/a (no vm runtime yet)"))
    L.append("others = share of the machine's CPU used by processes that are not this benchmark's during that row")
    pr = b.stats.get("pool_refill")
    if pr:
        L.append("pool refill: %d members back in %.2f s (%s/s) after a back-to-back run, %d live" % (
            pr["size"], pr["seconds"], pr["per_s"], pr["live_while_refilling"]))
    L.append("")
    if rat:
        L.append("ratios hutch / baseline (p50, p90, p99):")
        for k, v in rat.items():
            L.append("  %-40s %6.2f %6.2f %6.2f" % (k, v["p50"], v["p90"], v["p99"]))
        L.append("  QEMU: n/a (no vm runtime yet)")
        L.append("")
    if b.density:
        L.append("density (MiB per idle sandbox)   live  shim PSS  init PSS  cgroup  hutchd RSS growth  total  (total w/o init PSS)  host MemAvailable drop")
        for p in b.density:
            L.append("                                 %4d  %8.3f  %8.3f  %6.3f  %17.3f  %5.2f  %21.2f  %22.2f" % (
                p["live"], p["shim_pss_mib"], p["init_pss_mib"], p["cgroup_mib"], p["hutchd_rss_growth_mib"],
                p["per_sandbox_mib"], p["per_sandbox_mib_without_init_pss"], p["host_memavailable_drop_mib"]))
        L.append("  cgroup breakdown at %d live: %s" % (b.density[-1]["live"], json.dumps(b.density[-1]["cgroup_breakdown_mib"])))
        L.append("")
    if st:
        L.append("storage: backend %s, quotas %s, pool image %s (%.1f GiB sparse)" % (
            st.get("backend"), "on" if st.get("quotas") else "off", st.get("image") or "-",
            (st.get("pool_size_bytes") or 0) / 2.0 ** 30))
        su = st.get("setup")
        if su:
            L.append("  %s MiB template: written by dd in %.1f s; first snapshot %.0f ms; template from it %.0f ms" % (
                st.get("template_mib"), su["write_ms"] / 1000.0, su["first_snapshot_ms"], su["template_from_snapshot_ms"]))
        cr = st.get("create_ratio")
        if cr:
            L.append("  create ratio %s MiB template / busybox:  p50 %.2f  p90 %.2f  p99 %.2f" % (
                st.get("template_mib"), cr["p50"], cr["p90"], cr["p99"]))
        sp = st.get("stored_per_snapshot")
        if sp:
            L.append("  stored per snapshot after a 1 MiB change (MiB, pool used_bytes growth, synced, n=%d):"
                     "  p50 %.3f  mean %.3f  min %.3f  max %.3f" % (sp["n"], sp["p50"], sp["mean"], sp["min"], sp["max"]))
            L.append("    (measured after waiting %s s for btrfs to free the subvolumes the creates deleted)" % (
                st.get("settle_s_before_snapshots"),))
        ex = st.get("export")
        if ex:
            L.append("  export, incremental to the previous snapshot: %d bytes = %.2f × the 1 MiB changed (send stream %s bytes), %.0f ms" % (
                ex["incremental_bytes"], ex["incremental_vs_changed"], ex.get("incremental_send_bytes", "?"), ex["incremental_ms"]))
            if "full_bytes" in ex:
                L.append("  export, full: %d bytes = %.3f × the %s MiB root (send stream %s bytes), %.0f ms" % (
                    ex["full_bytes"], ex["full_vs_root"], st.get("template_mib"), ex.get("full_send_bytes", "?"), ex["full_ms"]))
        L.append("")
    gv = getattr(b, "gvisor", None) or {}
    if gv and not gv.get("skipped"):
        L.append("gvisor: %s; capabilities %s" % (gv.get("runsc") or "runsc", json.dumps(gv.get("capabilities"))))
        cr = gv.get("create_ratio_vs_native")
        if cr:
            L.append("  create gvisor / native:  p50 %.2f  p90 %.2f  p99 %.2f" % (cr["p50"], cr["p90"], cr["p99"]))
        cr = gv.get("create_ratio_vs_runsc_do")
        if cr:
            L.append("  create gvisor / runsc do /bin/true (the api section's baseline):  p50 %.2f  p90 %.2f  p99 %.2f" % (
                cr["p50"], cr["p90"], cr["p99"]))
        elif "runsc" not in b.stats:
            L.append("  (the `runsc do /bin/true` baseline is the api section's row; not run in this invocation)")
        eg = gv.get("exec_growth")
        if eg:
            b0, b1 = eg["before"], eg["after"]
            L.append("  exec sandbox suspend / restore: fresh %.0f / %.0f ms (image %.2f MiB); after %d execs %.0f / %.0f ms"
                     " (image %.2f MiB): +%.1f / +%.1f ms, +%.1f KiB per exec" % (
                         b0["suspend_ms"], b0["restore_ms"], (b0["image_allocated_bytes"] or 0) / 1048576.0, eg["execs"],
                         b1["suspend_ms"], b1["restore_ms"], (b1["image_allocated_bytes"] or 0) / 1048576.0,
                         (b1["suspend_ms"] - b0["suspend_ms"]) / eg["execs"], (b1["restore_ms"] - b0["restore_ms"]) / eg["execs"],
                         ((b1["image_allocated_bytes"] or 0) - (b0["image_allocated_bytes"] or 0)) / 1024.0 / eg["execs"]))
        sr = gv.get("suspend_restore")
        if sr and sr.get("execs_before_suspend"):
            L.append("  the measured sandbox had run %d execs before its first suspend, %d before its last" % tuple(
                sr["execs_before_suspend"]))
        if gv.get("server_status"):
            L.append("  the idle Python server inside: %s" % gv["server_status"])
        for which, what in (("suspend", "suspend checkpoints"), ("full", "full snapshots")):
            im = gv.get("image_" + which)
            if im:
                L.append("  memory image, %s (n=%d): %.1f MiB allocated p50 (%.1f–%.1f), %.1f MiB apparent" % (
                    what, im["n"], im["allocated_bytes_p50"] / 1048576.0, im["allocated_bytes_min"] / 1048576.0,
                    im["allocated_bytes_max"] / 1048576.0, im["apparent_bytes_p50"] / 1048576.0))
        fk = gv.get("fork")
        if fk and fk.get("image_allocated_bytes_p50"):
            L.append("  memory image, fork snapshots: %.1f MiB allocated p50" % (fk["image_allocated_bytes_p50"] / 1048576.0))
        sr = gv.get("suspend_restore")
        if sr and sr.get("failures"):
            L.append("  suspend/restore FAILED: %s" % "; ".join(sr["failures"])[:400])
        L.append("")
    eg = getattr(b, "egress", None) or {}
    if eg and not eg.get("skipped"):
        L.append("egress: hutch-gateway against the bench's lab namespaces (%s → server %s), policy %s" % (
            EGRESS_NAME, (eg.get("lab") or {}).get("server", "?"), json.dumps(eg.get("policy"))))
        for kind, what in (("http", "GET, HTTP"), ("https", "GET, HTTPS"), ("dns", "DNS A query")):
            r, ad = (eg.get("latency_ratio_gw_over_direct") or {}).get(kind), (eg.get("added_ms_gw_minus_direct") or {}).get(kind)
            if r and ad:
                L.append("  %-12s gateway / direct:  p50 %.2f  p90 %.2f  p99 %.2f;  added p50 %+.2f ms, p99 %+.2f ms" % (
                    what, r.get("p50", 0), r.get("p90", 0), r.get("p99", 0), ad["p50"], ad["p99"]))
        for kind in ("http", "https"):
            t = (eg.get("throughput") or {}).get(kind)
            if t and t["gw"]["mib_s_median"] and t["direct"]["mib_s_median"]:
                L.append("  download %s MiB, %-5s MiB/s (median of %d): gateway %.0f, direct %.0f, ratio %.2f  (gateway %s; direct %s)" % (
                    eg.get("download_mib"), kind.upper(), len(t["gw"]["mib_s"]), t["gw"]["mib_s_median"],
                    t["direct"]["mib_s_median"], t.get("ratio_gw_over_direct", 0),
                    " ".join("%.0f" % x for x in t["gw"]["mib_s"]), " ".join("%.0f" % x for x in t["direct"]["mib_s"])))
        fr = eg.get("first_request_ms")
        if fr:
            L.append("  untimed warm-up request of the first run on each path (leaf certificate, caches): %s" % ", ".join(
                "%s %.1f ms" % (k, v) for k, v in sorted(fr.items())))
        if eg.get("audit_decisions"):
            L.append("  the gateway's audit log for the sandbox: %s" % json.dumps(eg["audit_decisions"], sort_keys=True))
        if eg.get("error"):
            L.append("  section stopped: %s" % eg["error"][:300])
        L.append("")
    L.append("targets (issue 3; storage; gvisor):")
    for t in targets:
        L.append("  %-7s %-62s %-12s %s" % (t["result"], t["what"], t["bound"],
                                           fmt(t["value"]) + (" " + t["unit"] if t["value"] is not None else "")))
    if b.notes:
        L.append("")
        L.append("notes:")
        for n in b.notes:
            L.append("  - " + n)
    L.append("")
    L.append("total %.1f s; load average %s → %s; other hutchd/hutch-shim processes on the host at start: %d" % (
        b.elapsed, " ".join(b.machine["loadavg_start"]), " ".join(b.machine["loadavg_end"]),
        b.machine["other_hutch_processes_start"]))
    return "\n".join(L)


def plot(b, out_png):
    series = [("create, no pool (seq)", "create_seq_nopool"), ("create, no pool (c8)", "create_c8_nopool"),
              ("create, pool claims (paced)", "create_seq_pool_claims"), ("exec true (keep-alive)", "exec_keepalive"),
              ("bwrap /bin/true", "bwrap"), ("runsc do /bin/true", "runsc"),
              ("create, busybox template (storage)", "storage_create_tiny"),
              ("create, 1 GiB template (storage)", "storage_create_big"),
              ("snapshot after a 1 MiB change", "storage_snapshot"),
              ("create, gvisor (gvisor section)", "gvisor_create"),
              ("exec true, gvisor", "gvisor_exec"),
              ("restore, gvisor (idle Python)", "gvisor_restore"),
              ("fork ×4, gvisor", "gvisor_fork"),
              ("GET, HTTP via the egress gateway", "egress_http_gw"), ("GET, HTTP direct", "egress_http_direct"),
              ("GET, HTTPS via the egress gateway", "egress_https_gw"), ("GET, HTTPS direct", "egress_https_direct")]
    series = [(t, k) for t, k in series if b.samples.get(k)]
    if not series or not shutil.which("gnuplot"):
        return False
    tmp = tempfile.mkdtemp(prefix="hbench-plot-", dir="/tmp")
    try:
        plots = []
        for i, (title, key) in enumerate(series):
            s = sorted(b.samples[key])
            fn = os.path.join(tmp, "%d.dat" % i)
            with open(fn, "w") as f:
                for j, v in enumerate(s):
                    f.write("%.4f %.5f\n" % (max(v, 0.01), (j + 1) / len(s)))
            plots.append("'%s' using 1:2 with steps lw 2 dt %d title '%s (n=%d, p50 %.2f ms)'" % (
                fn, 1 + i // 8, title, len(s), pct(s, 50)))  # dashed once the 8 colours repeat
        gp = os.path.join(tmp, "plot.gp")
        with open(gp, "w") as f:
            f.write("set terminal pngcairo size 1000,600 font 'sans,10'\n")
            f.write("set output '%s'\n" % out_png)
            f.write("set title 'hutch latency distributions (CDF), %s, %d cores'\n" % (
                b.started.strftime("%Y-%m-%d"), b.machine["nproc"]))
            f.write("set logscale x\nset xlabel 'milliseconds (log scale)'\nset ylabel 'fraction of requests'\n")
            f.write("set yrange [0:1]\nset grid\nset key bottom right\n")
            f.write("plot " + ", \\\n  ".join(plots) + "\n")
        r = subprocess.run(["gnuplot", gp], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            log("gnuplot failed: %s" % r.stderr[:500])
            return False
        return True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small N everywhere: a smoke run of ~30-60 s")
    ap.add_argument("--n-create", type=int, default=200, help="creates per create row (default 200)")
    ap.add_argument("--n-exec", type=int, default=1000, help="exec round trips (default 1000)")
    ap.add_argument("--n-exec-fresh", type=int, default=200, help="execs with a new connection each (default 200)")
    ap.add_argument("--n-health", type=int, default=200, help="GET /healthz round trips (default 200)")
    ap.add_argument("--n-cycles", type=int, default=200, help="create+exec+delete cycles (default 200)")
    ap.add_argument("--n-bwrap", type=int, default=200, help="bwrap runs (default 200; 0 skips)")
    ap.add_argument("--n-runsc", type=int, default=30, help="runsc runs (default 30; 0 skips)")
    ap.add_argument("--density", default="50,200", help="live counts at which to measure memory (default 50,200)")
    ap.add_argument("--concurrency", type=int, default=8, help="client threads for the concurrent rows (default 8)")
    ap.add_argument("--pool", type=int, default=16, help="warm pool size of the second hutchd (default 16; 0 skips)")
    ap.add_argument("--pool-pace-ms", type=float, default=None,
                    help="pause between paced pool creates (default: 1.25 x the measured refill interval)")
    ap.add_argument("--no-probes", dest="probes", action="store_false",
                    help="skip the kernel probe (cgroup migration cost)")
    ap.add_argument("--n-probe", type=int, default=30, help="samples per kernel probe (default 30)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed create+exec+delete before measuring (default 5)")
    ap.add_argument("--settle-s", type=float, default=1.0, help="pause before a density measurement (default 1)")
    ap.add_argument("--only", default=",".join(SECTIONS),
                    help="comma-separated sections to run: api (no pool), pool, storage, gvisor, egress (default: all)")
    ap.add_argument("--storage-mib", type=int, default=1024, help="size of the big template's random file (default 1024)")
    ap.add_argument("--storage-creates", type=int, default=50,
                    help="creates from each of the big and the busybox template (default 50)")
    ap.add_argument("--storage-snapshots", type=int, default=20, help="1 MiB change + snapshot rounds (default 20)")
    ap.add_argument("--storage-forks", type=int, default=3, help="fork calls (default 3)")
    ap.add_argument("--fork-count", type=int, default=10, help="copies per fork call (default 10)")
    ap.add_argument("--storage-seed", type=int, default=1, help="seed of the random change offsets (default 1)")
    ap.add_argument("--gvisor-creates", type=int, default=20,
                    help="creates of each runtime, gvisor and native, interleaved (default 20)")
    ap.add_argument("--gvisor-execs", type=int, default=200, help="exec round trips in a gvisor sandbox (default 200)")
    ap.add_argument("--gvisor-cycles", type=int, default=10, help="suspend+restore cycles (default 10)")
    ap.add_argument("--gvisor-full-snapshots", type=int, default=3,
                    help="full snapshots (memory + files) of the running sandbox (default 3)")
    ap.add_argument("--gvisor-forks", type=int, default=3, help="fork ×4 calls (default 3)")
    ap.add_argument("--egress-requests", type=int, default=200,
                    help="GETs of the small page per path, HTTP and HTTPS each (default 200)")
    ap.add_argument("--egress-dns", type=int, default=200, help="DNS queries per path (default 200)")
    ap.add_argument("--egress-page-bytes", type=int, default=100, help="size of the small page (default 100)")
    ap.add_argument("--egress-mib", type=int, default=64, help="size of the downloaded body in MiB (default 64)")
    ap.add_argument("--egress-downloads", type=int, default=3, help="downloads per path and protocol (default 3)")
    ap.add_argument("--egress-rounds", type=int, default=4,
                    help="blocks the requests are split into, alternating the paths (default 4)")
    ap.add_argument("--max-seconds", type=float, default=900, help="hard bound on the whole run (default 900)")
    ap.add_argument("--reserve-s", type=float, default=60, help="part of the bound kept for cleanup (default 60)")
    ap.add_argument("--results-dir", default=RESULTS, help="where JSON and PNG go (default bench/results)")
    ap.add_argument("--no-save", action="store_true", help="print the table only; write no files")
    a = ap.parse_args()
    if a.quick:
        a.n_create, a.n_exec, a.n_exec_fresh, a.n_health = min(a.n_create, 20), min(a.n_exec, 100), 20, 20
        a.n_cycles, a.n_bwrap, a.n_runsc, a.density = min(a.n_cycles, 24), min(a.n_bwrap, 20), min(a.n_runsc, 3), "5,20"
        a.pool, a.warmup, a.settle_s, a.n_probe = min(a.pool, 4), 2, 0.3, min(a.n_probe, 10)
        a.storage_creates, a.storage_snapshots, a.storage_forks = min(a.storage_creates, 10), min(a.storage_snapshots, 5), 1
        a.gvisor_creates, a.gvisor_execs, a.gvisor_cycles = min(a.gvisor_creates, 5), min(a.gvisor_execs, 20), min(a.gvisor_cycles, 3)
        a.gvisor_full_snapshots, a.gvisor_forks = min(a.gvisor_full_snapshots, 1), min(a.gvisor_forks, 1)
        a.egress_requests, a.egress_dns = min(a.egress_requests, 30), min(a.egress_dns, 30)
        a.egress_mib, a.egress_rounds = min(a.egress_mib, 16), min(a.egress_rounds, 2)
        a.max_seconds = min(a.max_seconds, 180)
        a.reserve_s = min(a.reserve_s, 30)
    a.density = [int(x) for x in str(a.density).split(",") if x.strip()]
    a.only = [x.strip() for x in a.only.split(",") if x.strip()]
    for x in a.only:
        if x not in SECTIONS:
            sys.exit("bench: --only: unknown section `%s` (%s)" % (x, ", ".join(SECTIONS)))
    if a.storage_mib < 2 or a.fork_count < 1:
        sys.exit("bench: --storage-mib >= 2 and --fork-count >= 1")
    if a.egress_mib < 1 or a.egress_page_bytes < 1 or min(a.egress_requests, a.egress_dns, a.egress_downloads) < 0:
        sys.exit("bench: --egress-mib >= 1, --egress-page-bytes >= 1, egress counts >= 0")
    if os.geteuid() != 0:
        sys.exit("bench: must run as root (hutchd needs it)")
    b = Bench(a)
    for binary in ("hutchd", "hutch-shim", "hutch-init"):
        if not os.access(os.path.join(b.build, binary), os.X_OK):
            sys.exit("bench: %s/%s is not built; run `make`" % (b.build, binary))

    def on_alarm(signum, frame):
        raise Timeout("hard time bound (--max-seconds %s + grace) reached" % a.max_seconds)
    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(int(a.max_seconds + 120))
    failed = None
    try:
        b.run()
    except (Timeout, KeyboardInterrupt, Exception) as e:  # noqa: BLE001 — report what was measured
        failed = repr(e)
        b.note("run aborted: %s" % failed)
        b.machine.setdefault("loadavg_end", (read("/proc/loadavg", "") or "").split()[:3])
        b.elapsed = b.budget.elapsed()
    finally:
        signal.alarm(0)

    targets = evaluate_targets(b)
    rat = ratios(b)
    b.git = git_facts(b.machine.get("build_dir") or b.build)
    print(table(b, targets, rat))
    if a.no_save:
        return 1 if failed else 0
    os.makedirs(a.results_dir, exist_ok=True)
    stamp = b.started.strftime("%Y%m%dT%H%M%SZ")
    doc = {
        "date": b.started.isoformat(timespec="seconds"),
        "command": "make bench" if not a.quick else "bench/bench.py --quick",
        "argv": sys.argv[1:],
        "hutch": b.git,
        "machine": b.machine,
        "cgroup_version": getattr(b, "cgroup_version", None),
        "transport": "HTTP/1.1 over the unix socket; one keep-alive connection per client thread unless the row says newconn",
        "percentiles": "linear interpolation between closest ranks; milliseconds",
        "params": {k: v for k, v in vars(a).items() if k not in ("results_dir",)},
        "latency_ms": b.stats,
        "density": b.density,
        "storage": b.storage,
        "gvisor": b.gvisor,
        "egress": b.egress,
        "ratios": rat,
        "qemu": "n/a (no vm runtime yet)",
        "targets": targets,
        "notes": b.notes,
        "aborted": failed,
        "elapsed_s": round(b.elapsed, 1),
    }
    latest = os.path.join(a.results_dir, "latest.json")
    with open(os.path.join(a.results_dir, stamp + ".json"), "w") as f:
        json.dump(dict(doc, samples_ms={k: [round(x, 3) for x in v] for k, v in b.samples.items()},
                       storage_raw=b.storage_raw, gvisor_raw=b.gvisor_raw,
                       egress_raw=b.egress_raw), f)
    with open(latest, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=False)
        f.write("\n")
    png = os.path.join(a.results_dir, "latest.png")
    if plot(b, png):
        shutil.copyfile(png, os.path.join(a.results_dir, stamp + ".png"))
    log("wrote %s, %s.json%s" % (latest, stamp, ", latest.png" if os.path.exists(png) else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
