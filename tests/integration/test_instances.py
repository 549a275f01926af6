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


def test_orphan_and_stale_uid_claims_are_released_at_start(start_hutchd):
    """A claim naming this instance but no sandbox of it (a crash between
    claim and row), and a claim of an instance whose data directory is gone,
    are released when hutchd starts; a live instance's claim is kept."""
    import os
    import tempfile
    a, b = start_hutchd(), start_hutchd()
    sb = b.client().create(wait=True)
    assert sb.status == 201, sb
    lock = hostutil.UID_LOCK_DIR
    dead_dir = tempfile.mkdtemp(prefix="hdead", dir="/tmp")
    os.rmdir(dead_dir)  # an instance whose data directory is gone
    planted = {}
    for slot, owner in ((4001, "%s sb_orphanorphanorphan01\n" % os.path.realpath(a.data_dir)),
                        (4002, "%s sb_staleinstance000000\n" % dead_dir)):
        path = os.path.join(lock, str(slot))
        assert not os.path.exists(path), "slot %d is in use on this host; pick another" % slot
        with open(path, "w") as f:
            f.write(owner)
        planted[slot] = path
    try:
        before_b = hostutil.uid_claims(b.data_dir)
        assert len(before_b) == 1, before_b
        a.stop()
        a.expect_exit = False
        a.start()
        assert a.client().healthz().status == 200
        for slot, path in planted.items():
            assert not os.path.exists(path), "claim %d survived the start" % slot
        assert hostutil.uid_claims(b.data_dir) == before_b  # a live instance's claim is kept
    finally:
        for path in planted.values():
            if os.path.exists(path):
                os.unlink(path)
        b.client().delete(sb.json["id"])


def test_stop_with_no_sandboxes_leaves_no_cgroup_parent_or_run_dir(start_hutchd):
    """docs/operations.md: an instance that stops with nothing left removes
    its empty hutch-<instance> cgroup parents and its run directory."""
    import os
    d = start_hutchd()
    c = d.client()
    s = c.create(wait=True)
    assert s.status == 201, s
    assert hostutil.instance_cgroup_parents(d.instance), "a sandbox's cgroup parents exist while it runs"
    assert c.delete(s.json["id"]).status == 200
    assert d.stop() == []
    d.expect_exit = True  # stopped on purpose: teardown must not object
    assert hostutil.instance_cgroup_parents(d.instance) == []
    assert not os.path.exists(d.run_dir)
