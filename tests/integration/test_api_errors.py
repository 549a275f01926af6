"""Bad input gets the documented 4xx with {"error":{"code","message"}}, and
never a sandbox or a crash."""

import json

import pytest

from hutch_client import check_error

JSON = {"Content-Type": "application/json"}


@pytest.fixture(autouse=True)
def _no_sandbox_appears(api):
    """No bad request may create a sandbox (checked around every test here)."""
    before = {s["id"] for s in api.list().json["sandboxes"]}
    yield
    after = {s["id"] for s in api.list().json["sandboxes"]}
    assert after == before, "sandboxes appeared: %r" % (after - before)


@pytest.mark.parametrize("body", [
    b"{", b"{\"template\":", b"not json", b"{\"template\":\"host\"} trailing", b"{'a':1}",
    b"\xff\xfe{}", b"{\"template\":\"h\xc3\x28\"}", b"[" * 5000 + b"]" * 5000,
])
def test_malformed_json_is_400(api, body):
    r = api.raw("POST", "/v1/sandboxes?wait=true", body, JSON)
    check_error(r, 400, "invalid_argument")


@pytest.mark.parametrize("body", [b"[]", b"\"host\"", b"42", b"null"])
def test_body_must_be_an_object(api, body):
    r = api.raw("POST", "/v1/sandboxes?wait=true", body, JSON)
    check_error(r, 400, "invalid_argument")


def test_unknown_field_is_named(api):
    r = api.request("POST", "/v1/sandboxes?wait=true", {"template": "host", "colour": "blue"})
    check_error(r, 400, "invalid_argument", "colour")
    r = api.request("POST", "/v1/sandboxes?wait=true", {"resources": {"memory": 64}})
    check_error(r, 400, "invalid_argument", "resources.memory")


@pytest.mark.parametrize("body,field", [
    ({"resources": {"memory_mib": "big"}}, "resources.memory_mib"),
    ({"resources": {"pids": 1.5}}, "resources.pids"),
    ({"resources": {"cpus": "2"}}, "resources.cpus"),
    ({"resources": []}, "resources"),
    ({"template": 7}, "template"),
    ({"labels": {"a": 1}}, "labels"),
    ({"labels": ["a"]}, "labels"),
    ({"env": {"K": None}}, "env"),
    ({"timeout_s": "soon"}, "timeout_s"),
])
def test_wrong_type_names_the_field(api, body, field):
    r = api.request("POST", "/v1/sandboxes?wait=true", body)
    check_error(r, 400, "invalid_argument", field)


@pytest.mark.parametrize("body,field", [
    ({"resources": {"memory_mib": 1}}, "resources.memory_mib"),
    ({"resources": {"memory_mib": 1 << 40}}, "resources.memory_mib"),
    ({"resources": {"pids": 2}}, "resources.pids"),
    ({"resources": {"cpus": 0}}, "resources.cpus"),
    ({"resources": {"cpus": 1000}}, "resources.cpus"),
    ({"labels": {"bad key!": "v"}}, "labels"),
    ({"env": {"A=B": "v"}}, "env"),
    ({"runtime": "nope"}, "runtime"),
])
def test_bad_values_are_400(api, body, field):
    r = api.request("POST", "/v1/sandboxes?wait=true", body)
    check_error(r, 400, "invalid_argument", field)


@pytest.mark.parametrize("wait", [True, False])
def test_unknown_template_is_404(api, wait):
    r = api.create(wait=wait, template="no-such-template")
    check_error(r, 404, "not_found", "no-such-template")


def test_oversized_body_is_413(api):
    body = json.dumps({"labels": {"k": "x" * (2 << 20)}}).encode()
    assert len(body) > 2 << 20
    r = api.raw("POST", "/v1/sandboxes?wait=true", body, JSON)
    check_error(r, 413, "payload_too_large")
    assert api.healthz().status == 200


def test_oversized_exec_body_is_413(api, sandbox):
    body = json.dumps({"argv": ["cat"], "stdin": "x" * (2 << 20)}).encode()
    r = api.raw("POST", "/v1/sandboxes/%s/exec" % sandbox["id"], body, JSON)
    check_error(r, 413, "payload_too_large")


def test_wrong_content_type_is_415(api):
    r = api.raw("POST", "/v1/sandboxes?wait=true", b"{}", {"Content-Type": "text/plain"})
    check_error(r, 415, "unsupported_media_type")


def test_unknown_sandbox_is_404(api):
    sid = "sb_doesnotexist0000"
    check_error(api.get(sid), 404, "not_found")
    check_error(api.delete(sid), 404, "not_found")
    check_error(api.delete(sid, wait=False), 404, "not_found")
    check_error(api.exec(sid, argv=["true"]), 404, "not_found")
    check_error(api.get("../../etc/passwd"), 404, "not_found")


def test_unknown_operation_is_404(api):
    check_error(api.operation("op_doesnotexist0000"), 404, "not_found")
    check_error(api.operation("op_doesnotexist0000", wait=1), 404, "not_found")


def test_unknown_route_is_404(api):
    check_error(api.request("GET", "/v1/nothing-here"), 404, "not_found")
    check_error(api.request("GET", "/v2/sandboxes"), 404, "not_found")


@pytest.mark.parametrize("method,path,allowed", [
    ("PUT", "/v1/sandboxes", {"GET", "POST"}),
    ("DELETE", "/v1/sandboxes", {"GET", "POST"}),
    ("DELETE", "/healthz", {"GET"}),
    ("POST", "/healthz", {"GET"}),
])
def test_wrong_method_is_405(api, method, path, allowed):
    r = api.raw(method, path, b"{}" if method in ("PUT", "POST") else None, JSON)
    check_error(r, 405, "method_not_allowed")
    allow = {m.strip() for m in (r.header("Allow") or "").split(",") if m.strip()}
    assert allowed <= allow, "Allow header %r should list %r" % (r.header("Allow"), allowed)
    assert method not in allow


def test_wrong_method_on_sandbox_paths_is_405(api, sandbox):
    r = api.raw("PUT", "/v1/sandboxes/%s" % sandbox["id"], b"{}", JSON)
    check_error(r, 405, "method_not_allowed")
    r = api.raw("GET", "/v1/sandboxes/%s/exec" % sandbox["id"])
    check_error(r, 405, "method_not_allowed")
    assert "POST" in (r.header("Allow") or "")


@pytest.mark.parametrize("body,field", [
    ({"argv": ["true"], "cmd": "true"}, None),
    ({}, None),
    ({"argv": []}, "argv"),
    ({"argv": "ls -l"}, "argv"),
    ({"argv": ["ls", 3]}, "argv"),
    ({"cmd": 5}, "cmd"),
    ({"argv": ["true"], "timeout_s": "x"}, "timeout_s"),
    ({"argv": ["true"], "timeout_s": -1}, "timeout_s"),
    ({"argv": ["true"], "max_output_bytes": "x"}, "max_output_bytes"),
    ({"argv": ["true"], "env": {"A": 1}}, "env"),
    ({"argv": ["true"], "cwd": 3}, "cwd"),
    ({"argv": ["true"], "stdin": 3}, "stdin"),
    ({"argv": ["true"], "bogus": 1}, "bogus"),
])
def test_bad_exec_request_is_400(api, sandbox, body, field):
    r = api.request("POST", "/v1/sandboxes/%s/exec" % sandbox["id"], body)
    check_error(r, 400, "invalid_argument", field or ())
    if body == {"argv": ["true"], "cmd": "true"} or body == {}:
        msg = r.json["error"]["message"]
        assert "argv" in msg and "cmd" in msg, msg


def test_malformed_exec_json_is_400(api, sandbox):
    r = api.raw("POST", "/v1/sandboxes/%s/exec" % sandbox["id"], b"{\"argv\":[", JSON)
    check_error(r, 400, "invalid_argument")


def test_daemon_survives_garbage(api, hutchd):
    """Requests that are not valid HTTP do not take hutchd down."""
    import socket as s_
    for junk in (b"\x00\x01\x02\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n", b"GET " + b"A" * 100000 +
                 b" HTTP/1.1\r\n\r\n", b"POST /v1/sandboxes HTTP/1.1\r\nContent-Length: -5\r\n\r\n"):
        c = s_.socket(s_.AF_UNIX, s_.SOCK_STREAM)
        c.settimeout(10)
        try:
            c.connect(hutchd.socket)
            c.sendall(junk)
            c.shutdown(s_.SHUT_WR)
            c.recv(65536)
        except OSError:
            pass
        finally:
            c.close()
    assert hutchd.alive()
    assert api.healthz().status == 200


def test_unknown_state_filter_is_400(api):
    check_error(api.raw("GET", "/v1/sandboxes?state=bogus"), 400, "invalid_argument", mentions=["state"])
