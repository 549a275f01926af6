"""Dangerous syscalls fail with EPERM inside a sandbox.

Each case has a positive control: the very same Python snippet runs on the
host (in a throwaway user/mount namespace where the call needs one) and
must NOT fail with EPERM there, so a test cannot pass because the call was
malformed.  The foreign-ABI case (i386 int 0x80) is killed with SIGSYS
inside and returns the pid on the host."""

import errno
import os
import shutil
import subprocess
import tempfile

import pytest

import hostutil
import probes

USERNS_MNT = ["unshare", "-Umr"]  # a fresh user + mount namespace, mapped root

# name: (sandbox args, host wrapper, host shell prefix (with {d} = a temp dir), host args,
#        host must succeed (ret >= 0))
CASES = {
    "mount": (["/tmp/hutch-probe-mnt"], USERNS_MNT, None, ["{d}"], True),
    "umount2": (["/tmp"], USERNS_MNT, "mount -t tmpfs none {d}", ["{d}"], True),
    "pivot_root": (["/tmp", "/tmp"], USERNS_MNT, "mount -t tmpfs none {d}", ["{d}", "{d}"], True),
    "unshare": ([], ["unshare", "-Ur"], None, [], True),
    "unshare_ns": ([], [], None, [], True),
    "setns": ([], [], None, [], True),
    # No module is ever loaded: the image is 64 zero bytes / /dev/null.  A
    # kernel without module support answers ENOSYS, which is still "not EPERM".
    "init_module": ([], [], None, [], False),
    "finit_module": ([], [], None, [], False),
    "keyctl": ([], [], None, [], True),
    "add_key": ([], [], None, [], True),
    "bpf": ([], [], None, [], True),
    "io_uring_setup": ([], [], None, [], True),
    "perf_event_open": ([], [], None, [], True),
    "userfaultfd": ([], [], None, [], True),
}


def _host_control(name):
    _, wrapper, prefix, hargs, must_succeed = CASES[name]
    if wrapper and not shutil.which(wrapper[0]):
        hostutil.skip_or_fail("no %s on the host for the positive control" % wrapper[0])
    d = tempfile.mkdtemp(prefix="hp", dir="/tmp")
    try:
        args = [a.format(d=d) for a in hargs]
        pre = prefix.format(d=d) if prefix else None
        res, p = probes.run_host(name, args, wrapper=wrapper, shell_prefix=pre)
    finally:
        # The mounts lived in the child's namespace only.
        os.rmdir(d)
    assert res is not None, "host control did not run: rc=%r stderr=%r" % (p.returncode, p.stderr)
    return res, must_succeed


@pytest.mark.parametrize("name", sorted(CASES))
def test_syscall_refused_with_eperm(api, sandbox, name):
    host, must_succeed = _host_control(name)
    if host["errno"] == errno.EPERM:
        hostutil.skip_or_fail("the host itself refuses %s with EPERM (sysctl?); no control" % name)
    if must_succeed:
        if host["errno"] == errno.ENOSYS:
            hostutil.skip_or_fail("kernel lacks %s" % name)
        assert host["ret"] >= 0, "positive control: %s fails on the host too: %r" % (name, host)

    sargs = CASES[name][0]
    r = api.exec_ok(sandbox["id"], argv=["python3", "-c", probes.SYSCALL_PROBE, name] + sargs,
                    env=probes.guard_env())
    assert r["exit_code"] != probes.NOT_ISOLATED_EXIT, "exec runs in the host's namespaces: %r" % (r,)
    assert r["exit_code"] == 0, "probe did not run inside: %r" % (r,)
    inside = probes.parse(r["stdout"])
    assert inside["ret"] == -1 and inside["errno"] == errno.EPERM, \
        "%s inside the sandbox: %r (host: %r)" % (name, inside, host)


def test_unshare_command_fails_inside(api, sandbox):
    p = subprocess.run(["unshare", "-U", "true"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=30)
    assert p.returncode == 0, "positive control: unshare -U true fails on the host: %r" % (p,)
    r = api.exec_ok(sandbox["id"], argv=["unshare", "-U", "true"])
    assert r["exit_code"] not in (0, None), r
    assert "Operation not permitted" in r["stderr"], r


def test_mount_command_fails_inside(api, sandbox):
    r = api.exec_ok(sandbox["id"], cmd=probes.shell_guard() +
                    "mkdir -p /tmp/m && mount -t tmpfs none /tmp/m")
    assert r["exit_code"] != probes.NOT_ISOLATED_EXIT, "exec runs in the host's namespaces: %r" % (r,)
    assert r["exit_code"] not in (0, None), r
    assert "ermission denied" in r["stderr"] or "not permitted" in r["stderr"], r
    d = tempfile.mkdtemp(prefix="hp", dir="/tmp")
    try:
        p = subprocess.run(USERNS_MNT + ["mount", "-t", "tmpfs", "none", d],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
        assert p.returncode == 0, "positive control: %r" % (p,)
    finally:
        os.rmdir(d)


def test_i386_syscall_kills_with_sigsys(api, sandbox):
    p = subprocess.run(["python3", "-c", probes.INT80_PROBE], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True, timeout=30)
    if p.returncode == -11 or p.returncode == -4:
        hostutil.skip_or_fail("host kernel has no i386 emulation (int 0x80 faults)")
    assert p.returncode == 0, "positive control: %r" % (p,)
    got, pid = p.stdout.split()
    assert got == pid, "positive control: int 0x80 getpid returned %s, pid is %s" % (got, pid)

    r = api.exec_ok(sandbox["id"], argv=["python3", "-c", probes.INT80_PROBE])
    assert r["exit_code"] is None, r
    assert r["signal"] == 31, "expected SIGSYS (31): %r" % (r,)
    assert r["stdout"] == "", r
