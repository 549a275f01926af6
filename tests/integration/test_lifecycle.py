"""Sandbox lifecycle over the API: create (202 + operation, and ?wait=true),
get, list with filters, delete, and that delete releases every host resource."""

import os
import re
import time

import hostutil
from hutch_client import check_error

RFC3339_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def test_healthz(hutchd, api):
    r = api.healthz()
    assert r.status == 200, r
    h = r.json
    assert h["status"] == "ok"
    assert isinstance(h["version"], str) and h["version"]
    assert re.fullmatch(r"[0-9a-f]{12}", h["instance"]), h
    assert h["cgroup"] == hostutil.host_cgroup_version(), h


def test_create_async_returns_operation_then_running(api):
    t0 = time.monotonic()
    r = api.create(wait=False, labels={"t": "async"})
    assert r.status == 202, r
    assert time.monotonic() - t0 < 10, "202 must come at once, not after the sandbox is ready"
    body = r.json
    sid = body["id"]
    assert sid.startswith("sb_"), body
    assert body["state"] == "accepted", body
    op = body["operation"]
    assert op["id"].startswith("op_"), body
    try:
        # Poll with ?wait=10; bounded to 12 rounds (~2 minutes at most).
        for _ in range(12):
            o = api.operation(op["id"], wait=10)
            assert o.status == 200, o
            if o.json["state"] in ("succeeded", "failed"):
                break
            assert o.json["state"] in ("pending", "running"), o
        assert o.json["state"] == "succeeded", o
        assert o.json["id"] == op["id"]
        assert o.json["kind"] == "create", o
        assert o.json["sandbox_id"] == sid, o
        assert o.json["error"] is None, o
        assert RFC3339_MS.match(o.json["finished_at"]), o
        g = api.get(sid)
        assert g.status == 200, g
        assert g.json["state"] == "running", g
        assert hostutil.proc_alive(g.json["host"]["init_pid"])
    finally:
        api.delete(sid, wait=True)


def test_operation_wait_returns_state_when_time_passes(api):
    r = api.create(wait=False)
    assert r.status == 202, r
    try:
        t0 = time.monotonic()
        o = api.operation(r.json["operation"]["id"], wait=0)
        assert o.status == 200, o
        assert time.monotonic() - t0 < 5, "wait=0 must not block"
        assert o.json["state"] in ("pending", "running", "succeeded"), o
        o = api.operation(r.json["operation"]["id"], wait=60)
        assert o.json["state"] == "succeeded", o
    finally:
        api.delete(r.json["id"], wait=True)


def test_create_wait_true_returns_201_running_object(api):
    r = api.create(wait=True, labels={"team": "a"}, env={"K": "V"})
    assert r.status == 201, r
    sb = r.json
    try:
        assert sb["id"].startswith("sb_")
        assert sb["state"] == "running"
        assert sb["template"] == "host"
        assert sb["runtime"] == "native"
        assert sb["resources"]["memory_mib"] == 512, sb
        assert sb["resources"]["pids"] == 256, sb
        assert sb["resources"]["cpus"] == 1, sb
        assert sb["labels"] == {"team": "a"}
        assert sb["env"] == {"K": "V"}
        assert sb["error"] is None
        for k in ("created_at", "updated_at", "expires_at"):
            assert RFC3339_MS.match(sb[k]), (k, sb[k])
        host = sb["host"]
        assert hostutil.proc_alive(host["init_pid"]), host
        assert hostutil.proc_alive(host["shim_pid"]), host
        assert host["uid_base"] >= 100000, host
        g = api.get(sb["id"])
        assert g.status == 200 and g.json["id"] == sb["id"] and g.json["state"] == "running", g
        # The sandbox-level env reaches commands.
        res = api.exec_ok(sb["id"], argv=["sh", "-c", "echo $K"])
        assert res["stdout"] == "V\n", res
    finally:
        api.delete(sb["id"], wait=True)


def test_resources_are_applied_as_cgroup_limits(api, hutchd, make_sandbox):
    sb = make_sandbox(resources={"cpus": 0.5, "memory_mib": 200, "pids": 100})
    assert sb["resources"] == {"cpus": 0.5, "memory_mib": 200, "pids": 100} or (
        sb["resources"]["cpus"] == 0.5 and sb["resources"]["memory_mib"] == 200
        and sb["resources"]["pids"] == 100), sb
    inst, sid = hutchd.instance, sb["id"]
    v = hutchd.health["cgroup"]
    mem = hostutil.sandbox_cgroup_dir(inst, sid, "memory", v)
    pids = hostutil.sandbox_cgroup_dir(inst, sid, "pids", v)
    cpu = hostutil.sandbox_cgroup_dir(inst, sid, "cpu", v)
    if v == "v1":
        assert int(open(mem + "/memory.limit_in_bytes").read()) == 200 << 20
        assert open(pids + "/pids.max").read().strip() == "100"
        quota = int(open(cpu + "/cpu.cfs_quota_us").read())
        period = int(open(cpu + "/cpu.cfs_period_us").read())
        assert quota > 0 and abs(quota / period - 0.5) < 0.01, (quota, period)
        assert os.path.isdir(hostutil.sandbox_cgroup_dir(inst, sid, "freezer", v))
    else:
        assert int(open(mem + "/memory.max").read()) == 200 << 20
        assert open(pids + "/pids.max").read().strip() == "100"
        quota, period = open(cpu + "/cpu.max").read().split()
        assert abs(int(quota) / int(period) - 0.5) < 0.01, (quota, period)
    # hutch-init lives in that cgroup.
    assert sb["host"]["init_pid"] in hostutil.cgroup_procs(pids)


def test_list_filters_by_label_and_state(api, make_sandbox):
    a = make_sandbox(labels={"team": "a", "tier": "x"})
    b = make_sandbox(labels={"team": "b", "tier": "x"})

    def ids(r):
        assert r.status == 200, r
        return {s["id"] for s in r.json["sandboxes"]}

    every = ids(api.list())
    assert {a["id"], b["id"]} <= every
    assert ids(api.list(labels=["team=a"])) == {a["id"]}
    assert ids(api.list(labels=["team=b"])) == {b["id"]}
    assert ids(api.list(labels=["tier=x"])) == {a["id"], b["id"]}
    assert ids(api.list(labels=["tier=x", "team=b"])) == {b["id"]}
    assert ids(api.list(labels=["team=c"])) == set()
    running = ids(api.list(state="running"))
    assert {a["id"], b["id"]} <= running
    assert ids(api.list(state="deleting")) & {a["id"], b["id"]} == set()
    assert ids(api.list(labels=["team=a"], state="running")) == {a["id"]}
    for s in api.list(labels=["team=a"]).json["sandboxes"]:
        assert s["labels"] == {"team": "a", "tier": "x"}
        assert s["state"] == "running"


def test_delete_releases_everything(api, hutchd, leaks):
    before = leaks.snapshot(hutchd)
    sb = api.create_ok()
    sid, host = sb["id"], sb["host"]
    during = leaks.snapshot(hutchd)
    # The snapshot does see a sandbox's resources (so "after == before" means something).
    assert sid in during["api_sandboxes"], during
    assert sid in during["sandbox_dirs"], during
    assert any(c.endswith("/" + sid) for c in during["cgroups"]), during
    assert during["db_sandbox_rows"] == before["db_sandbox_rows"] + 1, (before, during)
    assert any(p.startswith("%d " % host["init_pid"]) for p in during["processes"]), during

    r = api.delete(sid, wait=True)
    assert r.status == 200, r
    assert r.json["id"] == sid and r.json["state"] == "deleted", r
    check_error(api.get(sid), 404, "not_found")
    check_error(api.exec(sid, argv=["true"]), 404, "not_found")
    check_error(api.delete(sid), 404, "not_found")
    assert sid not in {s["id"] for s in api.list().json["sandboxes"]}
    # "once every resource is released": the processes are gone now, not later.
    assert not hostutil.proc_alive(host["init_pid"]), "hutch-init still running after delete"
    assert not hostutil.proc_alive(host["shim_pid"]), "hutch-shim still running after delete"
    assert hostutil.sandbox_cgroup_dirs_existing(hutchd.instance, sid) == []
    assert not os.path.exists(os.path.join(hutchd.data_dir, "sandboxes", sid))
    leaks.assert_same(before, hutchd)


def test_delete_async_returns_operation(api, hutchd, leaks):
    before = leaks.snapshot(hutchd)
    sb = api.create_ok()
    r = api.delete(sb["id"], wait=False)
    assert r.status == 202, r
    assert r.json["id"] == sb["id"], r
    assert r.json["state"] == "deleting", r
    oid = r.json["operation"]["id"]
    assert oid.startswith("op_")
    o = api.operation(oid, wait=60)
    assert o.status == 200, o
    assert o.json["state"] == "succeeded", o
    assert o.json["kind"] == "delete", o
    check_error(api.get(sb["id"]), 404, "not_found")
    leaks.assert_same(before, hutchd)


def test_two_daemons_side_by_side(hutchd, api, start_hutchd, leaks):
    other = start_hutchd()
    assert other.instance != hutchd.instance
    c2 = other.client()
    before1 = leaks.snapshot(hutchd)
    s1 = api.create_ok()
    s2 = c2.create_ok()
    try:
        assert s1["host"]["uid_base"] != s2["host"]["uid_base"], "uid ranges must not collide"
        assert api.exec_ok(s1["id"], argv=["echo", "one"])["stdout"] == "one\n"
        assert c2.exec_ok(s2["id"], argv=["echo", "two"])["stdout"] == "two\n"
        assert [x["id"] for x in c2.list().json["sandboxes"]] == [s2["id"]]
        check_error(api.get(s2["id"]), 404, "not_found")
        assert hostutil.sandbox_cgroup_dirs_existing(other.instance, s2["id"])
        assert not hostutil.sandbox_cgroup_dirs_existing(hutchd.instance, s2["id"])
    finally:
        c2.delete(s2["id"])
        api.delete(s1["id"])
    leaks.assert_same(before1, hutchd)
