"""Start, stop and clean up a real hutchd on temporary directories."""

import os
import signal
import subprocess
import tempfile
import time

import hostutil
from hutch_client import Client

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
READY_TIMEOUT = float(os.environ.get("HUTCH_READY_TIMEOUT", "90"))
STOP_TIMEOUT = 15.0

_log_dir = None


def build_dir():
    return os.path.abspath(os.environ.get("HUTCH_BUILD") or os.path.join(REPO, "build"))


def binary(name):
    return os.path.join(build_dir(), name)


def log_dir():
    """One directory per pytest session for daemon logs (they must outlive a
    daemon's temporary directory so that a failing teardown can show them)."""
    global _log_dir
    if _log_dir is None:
        _log_dir = tempfile.mkdtemp(prefix="hutch-itest-logs-", dir="/tmp")
    return _log_dir


def log_dir_if_created():
    return _log_dir


class HutchdError(Exception):
    pass


class Hutchd:
    """One hutchd process.  Paths are short (unix sockets < 108 bytes):
    /tmp/hXXXXXXXX/{data,run,api.sock}."""

    registry = []  # every Hutchd ever started in this session

    def __init__(self, env=None, args=(), listen=None):
        for b in ("hutchd", "hutch-shim", "hutch-init"):
            if not os.access(binary(b), os.X_OK):
                raise HutchdError("%s is not built (HUTCH_BUILD=%s); run `make`" % (b, build_dir()))
        self.root = tempfile.mkdtemp(prefix="h", dir="/tmp")
        self.data_dir = os.path.join(self.root, "data")
        self.run_dir = os.path.join(self.root, "run")
        self.socket = os.path.join(self.root, "api.sock")
        os.mkdir(self.data_dir, 0o700)
        os.mkdir(self.run_dir, 0o700)
        self.env = dict(env or {})
        self.args = list(args)
        self.listen = listen
        self.log_path = os.path.join(log_dir(), os.path.basename(self.root) + ".log")
        self.proc = None
        self.expect_exit = False  # a test killed it on purpose
        self.tolerate_leftovers = False  # a test orphaned sandboxes on purpose
        self.instance = None
        self.health = None
        self.starts = 0
        self.cleaned = False
        Hutchd.registry.append(self)

    # -- process -----------------------------------------------------------

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    @property
    def url(self):
        return "http://%s" % self.listen if self.listen else None

    def command(self):
        cmd = [binary("hutchd"), "--data-dir", self.data_dir, "--socket", self.socket,
               "--run-dir", self.run_dir, "--log-level", "debug"]
        if self.listen:
            cmd += ["--listen", self.listen]
        return cmd + self.args

    def start(self, timeout=READY_TIMEOUT):
        env = dict(os.environ)
        env.pop("HUTCH_FAULT", None)
        env.update(self.env)
        cmd = self.command()
        self.starts += 1
        with open(self.log_path, "ab") as logf:
            logf.write(("=== test harness: start #%d: %s%s\n" % (
                self.starts, " ".join(cmd),
                "".join(" %s=%s" % kv for kv in sorted(self.env.items())))).encode())
            logf.flush()
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                         env=env, start_new_session=True, cwd="/")
        self.expect_exit = False
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout):
        deadline = time.monotonic() + timeout
        last = None
        c = Client(socket_path=self.socket, timeout=5)
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                raise HutchdError("hutchd exited with %r before it was ready; log:\n%s" % (
                    rc, self.log_tail(80)))
            if os.path.exists(self.socket):
                try:
                    r = c.healthz()
                    if r.status == 200 and isinstance(r.json, dict):
                        self.health = r.json
                        self.instance = r.json.get("instance")
                        if not isinstance(self.instance, str) or not self.instance:
                            raise HutchdError("/healthz has no instance: %r" % (r,))
                        return
                    last = r
                except OSError as e:
                    last = e
            time.sleep(0.05)
        raise HutchdError("hutchd not ready after %ss (last: %r); log:\n%s" % (
            timeout, last, self.log_tail(80)))

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig=signal.SIGKILL, timeout=10):
        """Send `sig` to hutchd (on purpose) and wait for it to exit."""
        self.expect_exit = True
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)

    def stop(self):
        """SIGTERM, bounded wait, then SIGKILL.  Returns a list of problems
        (empty when hutchd exited 0 within the bound)."""
        problems = []
        if self.proc is None:
            return problems
        if self.proc.poll() is not None:
            if not self.expect_exit:
                problems.append("hutchd had already exited with %r" % self.proc.returncode)
            return problems
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait(10)
            problems.append("hutchd did not exit within %ss of SIGTERM (killed)" % STOP_TIMEOUT)
            return problems
        if rc != 0:
            problems.append("hutchd exited with status %r after SIGTERM" % rc)
        return problems

    # -- API -----------------------------------------------------------------

    def client(self, timeout=60):
        return Client(socket_path=self.socket, timeout=timeout)

    def tcp_client(self, key=None, timeout=60):
        assert self.listen, "started without --listen"
        return Client(url=self.url, key=key, timeout=timeout)

    def delete_all_sandboxes(self):
        problems = []
        c = self.client()
        try:
            r = c.list()
        except OSError as e:
            return ["list sandboxes: %r" % (e,)]
        if r.status != 200:
            return ["list sandboxes: %r" % (r,)]
        for sb in r.json.get("sandboxes", []):
            try:
                d = c.delete(sb["id"], wait=True)
                if d.status not in (200, 404):
                    problems.append("delete %s: %r" % (sb["id"], d))
            except OSError as e:
                problems.append("delete %s: %r" % (sb["id"], e))
        return problems

    # -- logs ------------------------------------------------------------------

    def log_size(self):
        try:
            return os.path.getsize(self.log_path)
        except OSError:
            return 0

    def log_since(self, offset=0, max_lines=400):
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except OSError:
            return ""
        lines = data.decode("utf-8", "replace").splitlines()
        if len(lines) > max_lines:
            lines = ["… (%d lines omitted)" % (len(lines) - max_lines)] + lines[-max_lines:]
        return "\n".join(lines)

    def log_tail(self, n=80):
        return self.log_since(0, n)

    # -- teardown ------------------------------------------------------------

    def shutdown(self):
        """Delete sandboxes, stop hutchd, then clean the host of anything
        hutchd left (processes, cgroups, mounts, files).  Returns problems
        with hutchd itself (deletes that failed, unclean exit)."""
        problems = []
        if self.alive():
            failed = self.delete_all_sandboxes()
            if not self.tolerate_leftovers:
                problems += failed
        problems += self.stop()
        self.cleanup_host()
        return problems

    def cleanup_host(self):
        """Best-effort removal of everything this instance may have left.
        Only processes that belong to this instance are killed, by pid."""
        if self.cleaned:
            return
        self.cleaned = True
        inst = self.instance
        for _ in range(3):
            victims = set(hostutil.instance_processes(self))
            victims.discard(os.getpid())
            if not victims:
                break
            for pid in victims:
                hostutil.kill_pid(pid)
            hostutil.wait_until(lambda: not any(hostutil.proc_alive(p) for p in victims), 5)
        if inst:
            for parent in hostutil.instance_cgroup_parents(inst):
                for dirpath, _, _ in sorted(os.walk(parent), key=lambda t: -len(t[0])):
                    hostutil.wait_until(lambda: _try_rmdir(dirpath), 3)
        mps = [m.split(" ")[0] for m in hostutil.mounts_under([self.root])]
        for mp in sorted(set(mps), key=lambda p: p.count("/"), reverse=True):
            if mp.startswith(self.root + "/"):
                hostutil.umount_lazy(mp)
        if os.environ.get("HUTCH_KEEP_TMP") != "1":
            hostutil.safe_rmtree(self.root)


def _try_rmdir(p):
    try:
        os.rmdir(p)
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


def start_or_fail(**kw):
    """Start a Hutchd(**kw) or fail the calling test/fixture with its log."""
    import pytest

    d = Hutchd(**kw)
    try:
        d.start()
    except HutchdError as e:
        d.expect_exit = True
        d.shutdown()
        pytest.fail(str(e), pytrace=False)
    return d


def finish_or_fail(d):
    """Shut `d` down; fail (in teardown) if hutchd misbehaved doing so."""
    import pytest

    problems = d.shutdown()
    if problems:
        pytest.fail("hutchd teardown (%s): %s" % (d.root, "; ".join(problems)), pytrace=False)
