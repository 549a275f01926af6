"""A failed create leaves nothing behind.

HUTCH_FAULT=<point> makes hutchd (and the shims it starts) fail at that step
of sandbox creation as if a real error happened there.  For each point: the
create fails with a 5xx and the documented error shape, and afterwards the
host holds exactly what it held before: cgroups, sandbox directories,
run-dir sockets, shim/init processes, mounts, loop devices, API and
database rows.  Then the same daemon still creates nothing but failures,
and a daemon without the fault creates fine (the snapshot machinery does
see a sandbox, so "after == before" is meaningful)."""

import pytest

from daemon import finish_or_fail, start_or_fail
from hutch_client import check_error

POINTS = ["create.rootfs", "shim.cgroup", "shim.spawn", "create.ready"]


@pytest.fixture(scope="module", params=POINTS)
def faulty(request):
    d = start_or_fail(env={"HUTCH_FAULT": request.param})
    d.fault = request.param
    yield d
    finish_or_fail(d)


def _check_5xx(r):
    assert 500 <= r.status < 600, "expected a 5xx for an injected fault: %r" % (r,)
    assert isinstance(r.json, dict) and isinstance(r.json.get("error"), dict), r
    err = r.json["error"]
    assert isinstance(err.get("code"), str) and err["code"], r
    assert isinstance(err.get("message"), str) and err["message"], r
    return err


def test_failed_create_wait_leaves_nothing(faulty, leaks):
    c = faulty.client()
    before = leaks.snapshot(faulty)
    assert isinstance(before["db_sandbox_rows"], int), before["db_sandbox_rows"]
    r = c.create(wait=True, labels={"fault": faulty.fault})
    err = _check_5xx(r)
    assert err["code"] in ("internal", "unavailable"), err
    # The create failed at the injected point (not for some other reason),
    # and the message carries the chain of causes.
    assert faulty.fault in err["message"], err
    leaks.assert_same(before, faulty)
    assert c.list(labels=["fault=" + faulty.fault]).json["sandboxes"] == []
    assert faulty.alive() and c.healthz().status == 200


def test_failed_create_async_operation_fails_and_leaves_nothing(faulty, leaks):
    c = faulty.client()
    before = leaks.snapshot(faulty)
    r = c.create(wait=False)
    assert r.status == 202, r
    sid, oid = r.json["id"], r.json["operation"]["id"]
    o = c.operation(oid, wait=60)
    assert o.status == 200, o
    assert o.json["state"] == "failed", o
    assert isinstance(o.json["error"], dict) and faulty.fault in o.json["error"]["message"], o
    assert o.json["sandbox_id"] == sid
    leaks.assert_same(before, faulty)
    check_error(c.get(sid), 404, "not_found")


def test_repeated_failures_do_not_accumulate(faulty, leaks):
    c = faulty.client()
    before = leaks.snapshot(faulty)
    for _ in range(3):
        assert faulty.fault in _check_5xx(c.create(wait=True))["message"]
    leaks.assert_same(before, faulty)


def test_snapshot_sees_a_real_sandbox(hutchd, api, leaks):
    """Control for the tests above: without a fault the same snapshot
    changes in every category a sandbox occupies."""
    before = leaks.snapshot(hutchd)
    sb = api.create_ok()
    during = leaks.snapshot(hutchd)
    try:
        for k in ("cgroups", "sandbox_dirs", "run_dir", "processes", "api_sandboxes",
                  "db_sandbox_rows"):
            assert during[k] != before[k], "snapshot category %s does not see a sandbox" % k
    finally:
        assert api.delete(sb["id"]).status == 200
    leaks.assert_same(before, hutchd)
