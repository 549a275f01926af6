"""Fixtures for the hutch integration tests.

- `hutchd`: a daemon per test module on temporary directories (stopped with
  SIGTERM, SIGKILL after a bound; teardown fails if it did not exit 0).
- `start_hutchd(env=..., args=..., listen=...)`: a daemon of the test's own,
  stopped after the test (fault points, TCP listener, crash tests).
- `api`: a Client for the module daemon.
- `sandbox`: one running sandbox for the module (create ?wait=true, deleted
  at the end); `make_sandbox(**fields)`: a fresh one, deleted after the test.
- `leaks`: host resource snapshots (cgroups, sandbox dirs, run-dir entries,
  shim/init processes, mounts, loop devices, API and database rows).

The daemon's log is attached to the report of every failed test.  Any wait is
bounded.  Tests that need a host feature skip when it is missing, unless
HUTCH_MUST_WORK=1.

Environment:
  HUTCH_BUILD          directory with hutchd, hutch, hutch-shim, hutch-init
                       (default: <repo>/build)
  HUTCH_MUST_WORK=1    a missing host feature fails instead of skipping (CI)
  HUTCH_KEEP_TMP=1     keep each daemon's /tmp/hXXXXXXXX directory
  HUTCH_READY_TIMEOUT  seconds to wait for /healthz after start (default 90)
Daemon logs go to /tmp/hutch-itest-logs-*/ and are kept when the run fails.

Snippets that would harm the host if a sandbox were not isolated (mount,
umount, pivot_root, fork bomb, kill) carry a guard (probes.GUARD): they
refuse to run, and the test fails, when they find themselves in the host's
pid or mount namespace.
"""

import os
import shutil

import pytest

import daemon as daemon_mod
import hostutil
from daemon import Hutchd, finish_or_fail as _finish, start_or_fail as _start


@pytest.fixture(scope="module")
def hutchd():
    d = _start()
    yield d
    _finish(d)


@pytest.fixture(scope="module")
def api(hutchd):
    return hutchd.client()


@pytest.fixture
def start_hutchd():
    started = []

    def start(env=None, args=(), listen=None):
        d = _start(env=env, args=args, listen=listen)
        started.append(d)
        return d

    yield start
    problems = []
    for d in reversed(started):
        problems += ["%s: %s" % (d.root, p) for p in d.shutdown()]
    if problems:
        pytest.fail("hutchd teardown: " + "; ".join(problems), pytrace=False)


@pytest.fixture(scope="module")
def sandbox(hutchd):
    c = hutchd.client()
    sb = c.create_ok(labels={"fixture": "module"})
    yield sb
    if hutchd.alive():
        r = c.delete(sb["id"], wait=True)
        assert r.status == 200, "deleting the module sandbox: %r" % (r,)


@pytest.fixture
def make_sandbox(hutchd):
    c = hutchd.client()
    made = []

    def make(**fields):
        sb = c.create_ok(**fields)
        made.append(sb["id"])
        return sb

    yield make
    if hutchd.alive():
        for sid in made:
            r = c.delete(sid, wait=True)
            assert r.status in (200, 404), "deleting %s: %r" % (sid, r)


@pytest.fixture
def leaks():
    return hostutil.Leaks()


# -- watching daemons and attaching their logs to failures ---------------------


@pytest.fixture(autouse=True)
def _hutchd_watch(request):
    """Fails the test if a daemon that was running when it started died
    during it without the test meaning to kill it."""
    before = [d for d in Hutchd.registry if d.alive()]
    yield
    died = [d for d in before if not d.alive() and not d.expect_exit]
    for d in died:
        d.expect_exit = True  # report once
    if died:
        pytest.fail("hutchd died during this test: " + ", ".join(
            "%s (status %r)" % (d.root, d.proc.returncode) for d in died), pytrace=False)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item._hutch_log_offsets = {id(d): d.log_size() for d in Hutchd.registry}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if not rep.failed:
        return
    offsets = getattr(item, "_hutch_log_offsets", {})
    for d in Hutchd.registry:
        off = offsets.get(id(d), 0)
        if d.log_size() <= off:
            continue
        rep.sections.append(("hutchd log %s (%s)" % (d.root, rep.when), d.log_since(off)))


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    # Safety net: a daemon whose fixture never finalized (interrupted run).
    for d in Hutchd.registry:
        if d.alive():
            d.expect_exit = True
            d.stop()
        d.cleanup_host()
    ld = daemon_mod.log_dir_if_created()
    if ld and exitstatus == 0:
        shutil.rmtree(ld, ignore_errors=True)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    ld = daemon_mod.log_dir_if_created()
    if ld and os.path.isdir(ld) and exitstatus != 0:
        terminalreporter.write_line("hutchd logs kept in %s" % ld)
