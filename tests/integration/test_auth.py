"""The TCP listener requires an API key; keys are managed over the unix
socket only and stored as hashes."""

import hashlib
import os
import stat

import pytest

import hostutil
from daemon import finish_or_fail, start_or_fail
from hutch_client import check_error


@pytest.fixture(scope="module")
def tcpd():
    d = start_or_fail(listen="127.0.0.1:%d" % hostutil.free_port())
    yield d
    finish_or_fail(d)


@pytest.fixture(scope="module")
def key(tcpd):
    r = tcpd.client().create_key("ci")
    assert r.status == 201, r
    k = r.json
    assert k["id"].startswith("key_"), k
    assert k["name"] == "ci", k
    assert k["key"].startswith("hutch_") and len(k["key"]) >= 32, k
    return k


def test_unix_socket_is_restricted(tcpd):
    st = os.stat(tcpd.socket)
    assert stat.S_ISSOCK(st.st_mode)
    assert st.st_mode & 0o007 == 0, "API socket is accessible to others: %o" % st.st_mode
    assert st.st_uid == 0


def test_healthz_over_tcp_needs_no_key(tcpd):
    r = tcpd.tcp_client().healthz()
    assert r.status == 200 and r.json["status"] == "ok", r


def test_tcp_without_key_is_401(tcpd):
    c = tcpd.tcp_client()
    check_error(c.list(), 401, "unauthorized")
    check_error(c.create(wait=True), 401, "unauthorized")
    check_error(c.get("sb_whatever"), 401, "unauthorized")
    check_error(c.operation("op_whatever"), 401, "unauthorized")


@pytest.mark.parametrize("header", [
    "Bearer hutch_notarealkey000000000000000000000000",
    "Bearer ",
    "Bearer",
    "Basic aHV0Y2g6aHV0Y2g=",
    "hutch_notarealkey000000000000000000000000",
])
def test_tcp_with_bad_key_is_401(tcpd, key, header):
    r = tcpd.tcp_client().raw("GET", "/v1/sandboxes", None, {"Authorization": header})
    check_error(r, 401, "unauthorized")


def test_tcp_with_tampered_key_is_401(tcpd, key):
    k = key["key"]
    for bad in (k[:-1], k + "x", k[:-1] + ("A" if k[-1] != "A" else "B"), k.upper()):
        if bad == k:
            continue
        check_error(tcpd.tcp_client(key=bad).list(), 401, "unauthorized")


def test_key_created_over_unix_works_over_tcp(tcpd, key):
    c = tcpd.tcp_client(key=key["key"])
    r = c.list()
    assert r.status == 200, r
    assert isinstance(r.json["sandboxes"], list)
    sb = c.create_ok(labels={"via": "tcp"})
    try:
        res = c.exec_ok(sb["id"], argv=["python3", "-c", "print(6*7)"])
        assert res["stdout"] == "42\n", res
        assert c.get(sb["id"]).json["state"] == "running"
    finally:
        assert c.delete(sb["id"]).status == 200


def test_admin_endpoints_over_tcp_are_403(tcpd, key):
    c = tcpd.tcp_client(key=key["key"])
    check_error(c.request("GET", "/v1/admin/keys"), 403, "forbidden")
    check_error(c.create_key("sneaky"), 403, "forbidden")
    check_error(c.request("DELETE", "/v1/admin/keys/" + key["id"]), 403, "forbidden")
    # And without a key it is 401 first.
    check_error(tcpd.tcp_client().request("GET", "/v1/admin/keys"), 401, "unauthorized")
    names = [k["name"] for k in tcpd.client().request("GET", "/v1/admin/keys").json["keys"]]
    assert "sneaky" not in names


def test_key_list_never_shows_the_key(tcpd, key):
    r = tcpd.client().request("GET", "/v1/admin/keys")
    assert r.status == 200, r
    mine = [k for k in r.json["keys"] if k["id"] == key["id"]]
    assert len(mine) == 1, r
    assert "key" not in mine[0], mine
    assert key["key"] not in r.text


def test_key_is_stored_only_as_hash(tcpd, key):
    blob = hostutil.db_file_bytes(tcpd.data_dir)
    assert blob, "no state.db in %s" % tcpd.data_dir
    assert key["key"].encode() not in blob, "the API key is stored in plaintext"
    secret = key["key"][len("hutch_"):].encode()
    assert secret not in blob, "the key's secret part is stored in plaintext"
    digest = hashlib.sha256(key["key"].encode()).digest()
    assert digest in blob or digest.hex().encode() in blob or digest.hex().upper().encode() in blob, \
        "SHA-256 of the key not found in state.db (docs: stored as its SHA-256 hash)"
    log = open(tcpd.log_path, "rb").read()
    assert key["key"].encode() not in log, "the API key was logged"


def test_deleted_key_stops_working(tcpd):
    r = tcpd.client().create_key("short-lived")
    assert r.status == 201, r
    k = r.json
    c = tcpd.tcp_client(key=k["key"])
    assert c.list().status == 200
    d = tcpd.client().request("DELETE", "/v1/admin/keys/" + k["id"])
    assert d.status == 204, d
    check_error(c.list(), 401, "unauthorized")
    check_error(tcpd.client().request("DELETE", "/v1/admin/keys/" + k["id"]), 404, "not_found")


def test_bad_key_create_request(tcpd):
    r = tcpd.client().request("POST", "/v1/admin/keys", {"name": "x", "extra": 1})
    check_error(r, 400, "invalid_argument", "extra")
