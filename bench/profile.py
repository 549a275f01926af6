#!/usr/bin/python3
"""Where the time of a native create and of a create+exec+delete cycle goes.

    /usr/bin/python3 bench/profile.py [--creates 60] [--cycles 300]

Two measurements, both on a private hutchd (no pool) like bench.py's:

1. `perf trace -a -e write` during sequential creates: how long each
   hutch-shim's write of the sandbox's pid into cgroup.procs takes inside a
   real create (the cgroup migration, which on a kernel without
   favordynmods waits for an RCU grace period).
2. `perf record -e cpu-clock -a -g` during create+exec+delete cycles at
   concurrency 8 (software clock: this VM has no hardware PMU), folded into
   the CPU share per process name and per kernel path (fork of hutchd, freezer
   static-key flips, network namespace setup and teardown, ext4 inode churn,
   ...).  The categories overlap where stacks do; `others` is everything not
   ours (a compile in another session, say).

3. An A/B of sequential creates, alternating blocks with and without a
   "keeper": a helper that moves a sleeping process between two cgroups of
   its own every 2 ms, which keeps the kernel's cgroup_threadgroup_rwsem in
   writer mode, so that hutch-shim's migration does not wait for an RCU
   grace period -- what mounting a cgroup hierarchy with `favordynmods`
   (or CONFIG_CGROUP_FAVOR_DYNMODS) would give, without changing the host.

Needs perf (linux-perf) and root; prints a report; leaves nothing behind
(the perf data lives in a temporary directory that is removed).
"""

import argparse
import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

OURS = ("hutchd", "MHD-connection", "hutch-shim", "hutch-init", "true", "python3")

CATEGORIES = [
    ("hutchd forks itself to launch hutch-shim (dup_mmap, COW faults, TLB shootdowns, exit_mmap)",
     lambda c, st: c in ("hutchd", "MHD-connection") and any(
         f in st for f in ("dup_mmap", "do_wp_page", "exit_mmap", "flush_tlb_mm_range"))),
    ("cgroup v1 freezer FROZEN/THAWED on delete (static key flip: text patching IPIs)",
     lambda c, st: "freezer_write" in st),
    ("network namespace creation (copy_net_ns)", lambda c, st: "copy_net_ns" in st),
    ("network namespace teardown (cleanup_net, kworker)", lambda c, st: "cleanup_net" in st),
    ("ext4 inode allocation/eviction in the data dir", lambda c, st: any(
        f in st for f in ("__ext4_new_inode", "ext4_evict_inode"))),
    ("exec of hutch-shim / hutch-init (load_elf_binary)", lambda c, st: c in ("hutch-shim", "hutch-init") and
     "bprm_execve" in st),
    ("cgroup mkdir/rmdir", lambda c, st: any(f in st for f in ("cgroup_mkdir", "cgroup_rmdir"))),
    ("overlay mount (ovl_fill_super)", lambda c, st: "ovl_fill_super" in st),
    ("process exit / mm teardown (do_exit)", lambda c, st: "do_exit" in st),
    ("SQLite", lambda c, st: any(f.startswith("sqlite3") for f in st)),
    ("seccomp filter / BPF JIT", lambda c, st: any(f in st for f in ("do_jit", "seccomp_set_mode_filter"))),
]


def snapshot(build):
    d = tempfile.mkdtemp(prefix="hbench-bin-", dir="/tmp")
    for b in ("hutchd", "hutch-shim", "hutch-init"):
        shutil.copy2(os.path.join(build, b), os.path.join(d, b))
    return d


def attach_times(d, n, tmp):
    """Sequential creates under perf trace; returns (client ms, first
    cgroup.procs write ms) per matched create."""
    out = os.path.join(tmp, "trace.txt")
    c = bench.Client(d.sock)
    shims = {}
    tr = subprocess.Popen(["perf", "trace", "-a", "-e", "write", "-o", out],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(2)
        for _ in range(n):
            sb, ms = c.create()
            d.created.add(sb["id"])
            shims[sb["host"]["shim_pid"]] = (ms, len(str(sb["host"]["init_pid"])))
            time.sleep(0.02)
        time.sleep(0.3)
    finally:
        tr.send_signal(signal.SIGINT)
        tr.wait(30)
        c.close()
    # The shim writes init's pid into cgroup.procs of each hierarchy; the
    # first of those writes migrates (and waits), the others are quick.  The
    # slowest write of exactly that length is taken as the migration.
    att = {}
    pat = re.compile(r"\(\s*([0-9.]+) ms\): hutch-shim/(\d+) write\(fd: \d+, buf: \S+, count: (\d+)\)")
    for line in open(out, errors="replace"):
        m = pat.search(line)
        if not m:
            continue
        pid, ms, count = int(m.group(2)), float(m.group(1)), int(m.group(3))
        if pid in shims and count == shims[pid][1]:
            att[pid] = max(att.get(pid, 0.0), ms)
    return [(shims[p][0], att[p]) for p in att]


KEEPER = r"""
import os, signal, subprocess, sys, time
a, b, limit = sys.argv[1], sys.argv[2], float(sys.argv[3])
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
p = subprocess.Popen(["sleep", str(int(limit) + 5)])
end = time.monotonic() + limit
try:
    while time.monotonic() < end:
        for d in (a, b):
            with open(os.path.join(d, "cgroup.procs"), "w") as f:
                f.write(str(p.pid))
            time.sleep(0.002)
finally:
    p.kill()
    p.wait()
"""


def keeper_ab(d, blocks, per_block):
    """Alternating blocks of sequential creates without / with the keeper."""
    mnt = bench.cgroup_mounts()
    root = mnt.get("memory") if d.cgroup == "v1" else (mnt.get("unified") or "/sys/fs/cgroup")
    cgs = [os.path.join(root, "hbench-keep%s-%d" % (x, os.getpid())) for x in "AB"]
    for cg in cgs:
        os.mkdir(cg)
    res = {False: [], True: []}
    c = bench.Client(d.sock)
    try:
        for blk in range(blocks):
            keep = blk % 2 == 1
            k = None
            if keep:
                k = subprocess.Popen([sys.executable, "-c", KEEPER, cgs[0], cgs[1], "60"])
                time.sleep(0.2)
            try:
                for _ in range(per_block):
                    sb, ms = c.create()
                    d.created.add(sb["id"])
                    res[keep].append(ms)
                    time.sleep(0.02)
            finally:
                if k:
                    k.terminate()
                    k.wait(10)
            for sid in list(d.created):
                c.delete(sid)
                d.created.discard(sid)
    finally:
        c.close()
        for cg in cgs:
            for pid in (bench.read(os.path.join(cg, "cgroup.procs"), "") or "").split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for cg in cgs:
            for _ in range(50):
                try:
                    os.rmdir(cg)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
    return res


def cycles_profile(d, n, conc, tmp):
    data = os.path.join(tmp, "perf.data")

    def cycle(cl, i):
        t0 = time.perf_counter()
        sb, _ = cl.create()
        cl.exec_true(sb["id"])
        cl.delete(sb["id"])
        return (time.perf_counter() - t0) * 1000.0
    rec = subprocess.Popen(["perf", "record", "-e", "cpu-clock", "-F", "1999", "-a", "-g", "-o", data],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1)
        r = bench.run_concurrent(d.sock, n, conc, cycle, 300)
    finally:
        rec.send_signal(signal.SIGINT)
        rec.wait(60)
    txt = subprocess.run(["perf", "script", "-i", data, "-F", "comm,ip,sym"], capture_output=True, text=True,
                         errors="replace", timeout=300).stdout
    samples, cur = [], None
    for line in txt.splitlines():
        if not line.strip():
            if cur:
                samples.append(cur)
            cur = None
            continue
        if not line[0].isspace():
            cur = (line.split()[0] if line.split() else "?", [])
        elif cur is not None:
            p = line.strip().split(None, 1)
            cur[1].append(p[1] if len(p) > 1 else "?")
    if cur:
        samples.append(cur)
    return r, samples


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--creates", type=int, default=60)
    ap.add_argument("--cycles", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--ab-blocks", type=int, default=10, help="A/B blocks (alternating; default 10)")
    ap.add_argument("--ab-per-block", type=int, default=25, help="creates per A/B block (default 25)")
    a = ap.parse_args()
    if os.geteuid() != 0 or not shutil.which("perf"):
        sys.exit("profile: needs root and perf")
    build = os.path.abspath(os.environ.get("HUTCH_BUILD") or os.path.join(bench.REPO, "build"))
    bins = snapshot(build)
    tmp = tempfile.mkdtemp(prefix="hbench-prof-", dir="/tmp")
    d = bench.Hutchd(bins, "profile")
    try:
        d.start()
        c = bench.Client(d.sock)
        for _ in range(3):
            sb, _ = c.create()
            c.delete(sb["id"])
        c.close()
        pairs = attach_times(d, a.creates, tmp)
        d.delete_all()
        r, samples = cycles_profile(d, a.cycles, a.concurrency, tmp)
        d.delete_all()
        ab = keeper_ab(d, a.ab_blocks, a.ab_per_block)
    finally:
        try:
            d.delete_all(budget_s=60)
        except Exception as e:  # noqa: BLE001
            print("delete_all: %r" % e)
        d.stop(drain_pool=False)
        left = d.cleanup_host()
        if left:
            print("cleanup: %s" % left)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(bins, ignore_errors=True)

    print("== 1. cgroup migration inside real creates (perf trace; tracing slows everything) ==")
    if pairs:
        cl = sorted(p[0] for p in pairs)
        at = sorted(p[1] for p in pairs)
        rest = sorted(p[0] - p[1] for p in pairs)
        print("creates matched: %d" % len(pairs))
        print("client create-to-ready      p50 %6.2f  p90 %6.2f ms" % (bench.pct(cl, 50), bench.pct(cl, 90)))
        print("shim's cgroup.procs write   p50 %6.2f  p90 %6.2f ms  (share of the p50: %.0f%%)" % (
            bench.pct(at, 50), bench.pct(at, 90), 100 * bench.pct(at, 50) / bench.pct(cl, 50)))
        print("everything else             p50 %6.2f  p90 %6.2f ms" % (bench.pct(rest, 50), bench.pct(rest, 90)))
    print()
    print("== 2. CPU profile of create+exec+delete cycles, concurrency %d ==" % a.concurrency)
    done = len(r["results"])
    print("cycles: %d in %.2f s = %.1f/s; errors: %d" % (done, r["wall_s"], done / r["wall_s"], len(r["errors"])))
    total = len(samples)
    by = collections.Counter(s[0] for s in samples)
    ours = [s for s in samples if s[0] in OURS or s[0].startswith(("kworker", "ksoftirqd"))]
    idle = by.get("swapper", 0)
    print("samples: %d; idle %.1f%%; ours (incl. kernel workers) %.1f%%; others %.1f%%" % (
        total, 100.0 * idle / total, 100.0 * len(ours) / total, 100.0 * (total - idle - len(ours)) / total))
    if done:
        print("our CPU per cycle ≈ %.1f ms" % (len(ours) / total * r["wall_s"] * (os.cpu_count() or 1) * 1000.0 /
                                              done))
    print("-- by process name (share of all samples)")
    for k, v in by.most_common(12):
        print("  %5.1f%%  %s" % (100.0 * v / total, k))
    print("-- by kernel path (share of our samples; categories overlap)")
    for name, pred in CATEGORIES:
        n = sum(1 for s in ours if pred(s[0], s[1]))
        print("  %5.1f%%  %s" % (100.0 * n / max(1, len(ours)), name))
    print()
    print("== 3. sequential creates, A/B: without / with the rwsem keeper (favordynmods stand-in) ==")
    for keep in (False, True):
        v = sorted(ab[keep])
        if v:
            print("  %-16s n=%-4d p50 %6.2f  p90 %6.2f  p99 %6.2f ms" % (
                "with keeper" if keep else "without keeper", len(v), bench.pct(v, 50), bench.pct(v, 90),
                bench.pct(v, 99)))


if __name__ == "__main__":
    main()
