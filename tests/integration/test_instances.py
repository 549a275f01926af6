"""Two hutchd instances side by side (ARCHITECTURE.md §7): nothing global
may collide — cgroups, run dirs, uid ranges, sockets."""


import hostutil


def test_two_instances_run_side_by_side(start_hutchd, leaks):
    a, b = start_hutchd(), start_hutchd()
    assert a.instance != b.instance
    before_a, before_b = leaks.snapshot(a), leaks.snapshot(b)
    ca, cb = a.client(), b.client()
    ra = ca.create(wait=True)
    rb = cb.create(wait=True)
    assert ra.status == 201 and rb.status == 201, (ra, rb)
    sa, sb = ra.json, rb.json
    # Each instance sees only its own sandbox.
    assert [x["id"] for x in ca.list().json["sandboxes"]] == [sa["id"]]
    assert [x["id"] for x in cb.list().json["sandboxes"]] == [sb["id"]]
    # Different host uid ranges: one sandbox's root is not the other's.
    assert sa["host"]["uid_base"] != sb["host"]["uid_base"]
    assert abs(sa["host"]["uid_base"] - sb["host"]["uid_base"]) >= 65536
    # Both work at once.
    for c, s in ((ca, sa), (cb, sb)):
        r = c.exec(s["id"], argv=["sh", "-c", "echo $(hostname)"])
        assert r.status == 200 and r.json["exit_code"] == 0, r
        assert r.json["stdout"].strip() == s["id"].replace("_", "-")
    # Deleting in one leaves the other running.
    assert ca.delete(sa["id"]).status == 200
    r = cb.exec(sb["id"], argv=["true"])
    assert r.status == 200 and r.json["exit_code"] == 0, r
    assert cb.delete(sb["id"]).status == 200
    leaks.assert_same(before_a, a)
    leaks.assert_same(before_b, b)


def test_uid_claim_names_its_owner(hutchd, api, make_sandbox):
    s = make_sandbox()
    claims = hostutil.uid_claims(hutchd.data_dir)
    assert len([c for c in claims if s["id"] in c]) == 1, claims
