"""The egress plumbing against the real kernel, without hutchd: veth pairs
(src/lib/isolate/veth.c) and the nftables table (src/lib/isolate/nft.c).

The checks live in the C unit test tests/unit/test_veth_nft.c; with
HUTCH_EGRESS_LIVE=1 it creates two throwaway user + network namespaces,
gives them veths (slots 16000, 16001) and elements in the table
`inet hutch_egress_livetest`, and checks from inside them that DNS and the
proxy ports are redirected to listeners on the host, that other host ports,
spoofed sources, traffic to the other namespace and IPv6 are dropped (each
counted in its named counter), and that everything is removed again.  Every
packet stays on the test's veths.  This module builds that binary, runs it
and checks that nothing is left on the host."""

import os
import shutil
import subprocess

import daemon
import hostutil

TABLE = "hutch_egress_livetest"
IFNAMES = ("hg3e80", "hg3e81", "hg3e82")


def _run(argv, timeout=30):
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout,
                          universal_newlines=True)


def _leftovers():
    left = [n for n in IFNAMES if os.path.exists("/sys/class/net/" + n)]
    if shutil.which("nft"):
        r = _run(["nft", "list", "tables", "inet"])
        if ("table inet %s\n" % TABLE) in (r.stdout + "\n"):
            left.append("table inet " + TABLE)
    return left


def _cleanup():
    for n in IFNAMES:
        if os.path.exists("/sys/class/net/" + n):
            _run(["ip", "link", "del", n])
    if shutil.which("nft"):
        _run(["nft", "add table inet %s; delete table inet %s" % (TABLE, TABLE)])


def _require_host():
    if os.geteuid() != 0:
        hostutil.skip_or_fail("needs root (veth pairs, nftables)")
    if not shutil.which("ip"):
        hostutil.skip_or_fail("iproute2 (`ip`) is not installed")
    r = _run(["ip", "link", "add", "hgprobe0", "type", "veth", "peer", "name", "hgprobe0p"])
    if r.returncode != 0:
        hostutil.skip_or_fail("cannot create a veth pair: " + r.stdout.strip())
    _run(["ip", "link", "del", "hgprobe0"])
    if shutil.which("nft"):
        t = "hutch_probe_%d" % os.getpid()
        r = _run(["nft", "add table inet %s; delete table inet %s" % (t, t)])
        if r.returncode != 0:
            hostutil.skip_or_fail("nftables is not usable: " + r.stdout.strip())


def test_egress_plumbing_live():
    _require_host()
    build = daemon.build_dir()
    binary = os.path.join(build, "tests", "test_veth_nft")
    r = _run(["make", "-s", "-C", daemon.REPO, "BUILD=" + build, binary], timeout=300)
    assert r.returncode == 0, "building %s failed:\n%s" % (binary, r.stdout[-4000:])
    _cleanup()
    try:
        env = dict(os.environ, HUTCH_EGRESS_LIVE="1")
        p = subprocess.run([binary], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=240, env=env,
                           universal_newlines=True)
        out = p.stdout
        failed = [l for l in out.splitlines() if l.startswith("not ok")]
        assert p.returncode == 0 and not failed, "test_veth_nft (rc %d):\n%s" % (p.returncode, out[-8000:])
        assert "# live veth/nftables checks skipped" not in out, out
        plan = [l for l in out.splitlines() if l.startswith("1..")]
        assert plan and int(plan[-1][3:]) > 60, "the live checks did not run:\n" + out[-4000:]
        left = _leftovers()
        assert not left, "left on the host after the run: %r" % left
    finally:
        _cleanup()
