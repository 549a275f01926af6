"""The warm pool (hutchd --pool N): creates of the pool's shape are served
from sandboxes made ahead of demand, which are refilled in the background
and are nobody's sandbox until claimed."""

import sqlite3
import os

import hostutil


def pool_ready(c):
    return c.request("GET", "/healthz").json["pool"]["ready"]


def wait_pool(c, n, timeout=30):
    assert hostutil.wait_until(lambda: pool_ready(c) >= n, timeout), "pool never reached %d" % n


def test_pool_serves_default_creates_and_refills(start_hutchd):
    d = start_hutchd(args=["--pool", "2"])
    c = d.client()
    wait_pool(c, 2)
    assert c.list().json["sandboxes"] == []  # idle members are not listed
    r = c.create(wait=True, env={"GREETING": "hi"}, labels={"team": "a"}, timeout_s=120)
    assert r.status == 201, r
    s = r.json
    assert s["from_pool"] is True and s["state"] == "running"
    assert s["labels"] == {"team": "a"} and s["timeout_s"] == 120
    # The claimed sandbox works and gets this request's env.
    x = c.exec(s["id"], cmd="echo $GREETING; hostname")
    assert x.status == 200 and x.json["stdout"] == "hi\n%s\n" % s["id"].replace("_", "-"), x
    assert [z["id"] for z in c.list(labels=["team=a"]).json["sandboxes"]] == [s["id"]]
    # The pool refills in the background.
    wait_pool(c, 2)
    assert c.delete(s["id"]).status == 200


def test_non_default_shape_is_not_served_from_pool(start_hutchd):
    d = start_hutchd(args=["--pool", "1"])
    c = d.client()
    wait_pool(c, 1)
    r = c.create(wait=True, resources={"memory_mib": 256})
    assert r.status == 201 and r.json["from_pool"] is False, r
    assert pool_ready(c) == 1
    assert c.delete(r.json["id"]).status == 200


def test_idle_pool_member_is_not_reachable_by_id(start_hutchd):
    d = start_hutchd(args=["--pool", "1"])
    c = d.client()
    wait_pool(c, 1)
    con = sqlite3.connect(os.path.join(d.data_dir, "state.db"))
    (sid,) = con.execute("SELECT id FROM sandboxes WHERE state='pool'").fetchone()
    con.close()
    assert c.get(sid).status == 404
    assert c.delete(sid).status == 404
    assert c.exec(sid, argv=["true"]).status == 404


def test_empty_pool_falls_back_to_a_normal_create(start_hutchd):
    d = start_hutchd(args=["--pool", "1"])
    c = d.client()
    wait_pool(c, 1)
    a = c.create(wait=True)
    b = c.create(wait=True)  # the pool may not have refilled yet: either way it must work
    assert a.status == 201 and b.status == 201, (a, b)
    assert a.json["from_pool"] is True
    for s in (a.json, b.json):
        x = c.exec(s["id"], argv=["true"])
        assert x.status == 200 and x.json["exit_code"] == 0
        assert c.delete(s["id"]).status == 200
