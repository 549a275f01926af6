"""The `hutch` CLI against a real hutchd: run, exec (streams and exit
status), create / ls / get / rm, --json, HUTCH_SOCKET, and TCP with an API key."""

import json
import os
import re
import subprocess

import pytest

import hostutil
from daemon import binary
from hutch_client import check_error

SB_ID = re.compile(r"^sb_[A-Za-z0-9_-]+$")


def hutch(*args, env=None, timeout=120, sock=None):
    e = dict(os.environ)
    for k in ("HUTCH_SOCKET", "HUTCH_URL", "HUTCH_API_KEY"):
        e.pop(k, None)
    e.update(env or {})
    argv = [binary("hutch")] + (["--socket", sock] if sock else []) + list(args)
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e,
                          timeout=timeout, universal_newlines=True, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def sock(hutchd):
    return hutchd.socket


def ids(api):
    return {s["id"] for s in api.list().json["sandboxes"]}


def test_run_prints_42(api, sock):
    before = ids(api)
    p = hutch("run", "--", "python3", "-c", "print(6*7)", sock=sock)
    assert p.returncode == 0, p
    assert p.stdout == "42\n", p
    assert ids(api) == before, "hutch run left a sandbox behind"


def test_run_propagates_exit_code_and_cleans_up(api, sock):
    before = ids(api)
    p = hutch("run", "--", "sh", "-c", "echo bye; echo oops >&2; exit 7", sock=sock)
    assert p.returncode == 7, p
    assert p.stdout == "bye\n", p
    assert "oops\n" in p.stderr and "oops" not in p.stdout, p
    assert ids(api) == before


def test_exec_streams_and_exit_code(api, sock, sandbox):
    p = hutch("exec", sandbox["id"], "--", "sh", "-c", "echo out; echo err >&2; exit 3", sock=sock)
    assert p.returncode == 3, p
    assert p.stdout == "out\n", p
    assert "err\n" in p.stderr, p
    assert "out" not in p.stderr and "err" not in p.stdout, p


def test_exec_without_double_dash(sock, sandbox):
    p = hutch("exec", sandbox["id"], "echo", "hi", "-n", sock=sock)
    assert p.returncode == 0, p
    assert p.stdout == "hi -n\n", p


def test_exec_killed_by_signal_is_128_plus_n(sock, sandbox):
    p = hutch("exec", sandbox["id"], "--", "sh", "-c", "kill -9 $$", sock=sock)
    assert p.returncode == 128 + 9, p


def test_exec_json(sock, sandbox):
    p = hutch("exec", "--json", sandbox["id"], "--", "sh", "-c", "echo j; exit 2", sock=sock)
    v = json.loads(p.stdout)
    assert v["exit_code"] == 2 and v["state"] == "exited", v


def test_exec_unknown_sandbox_fails(sock):
    p = hutch("exec", "sb_doesnotexist0000", "--", "true", sock=sock)
    assert p.returncode == 1, p
    assert "not" in p.stderr.lower() and p.stdout == "", p


def test_create_ls_get_rm(api, sock):
    p = hutch("create", "--label", "via=cli", "--memory", "256", sock=sock)
    assert p.returncode == 0, p
    sid = p.stdout.strip()
    assert SB_ID.match(sid), p
    try:
        g = api.get(sid)
        assert g.status == 200 and g.json["state"] == "running", g
        assert g.json["labels"] == {"via": "cli"} and g.json["resources"]["memory_mib"] == 256, g

        p = hutch("ls", sock=sock)
        assert p.returncode == 0 and sid in p.stdout, p
        p = hutch("ls", "--json", "--label", "via=cli", sock=sock)
        assert p.returncode == 0, p
        v = json.loads(p.stdout)
        assert [s["id"] for s in v["sandboxes"]] == [sid], v
        p = hutch("ls", "--label", "via=nothing", "--json", sock=sock)
        assert json.loads(p.stdout)["sandboxes"] == [], p

        p = hutch("get", "--json", sid, sock=sock)
        assert p.returncode == 0, p
        v = json.loads(p.stdout)
        assert v["id"] == sid and v["state"] == "running", v
        p = hutch("get", sid, sock=sock)
        assert p.returncode == 0 and sid in p.stdout and "running" in p.stdout, p
        p = hutch("--json", "get", sid, sock=sock)
        assert json.loads(p.stdout)["id"] == sid, p

        p = hutch("rm", sid, sock=sock)
        assert p.returncode == 0, p
        check_error(api.get(sid), 404, "not_found")
    finally:
        api.delete(sid)
    p = hutch("rm", sid, sock=sock)
    assert p.returncode == 1, p
    p = hutch("get", sid, sock=sock)
    assert p.returncode == 1 and p.stdout == "", p


def test_create_json(api, sock):
    p = hutch("create", "--json", sock=sock)
    assert p.returncode == 0, p
    v = json.loads(p.stdout)
    try:
        assert SB_ID.match(v["id"]) and v["state"] == "running", v
    finally:
        assert api.delete(v["id"]).status == 200


def test_hutch_socket_env(api, hutchd):
    p = hutch("ls", "--json", env={"HUTCH_SOCKET": hutchd.socket})
    assert p.returncode == 0, p
    assert {s["id"] for s in json.loads(p.stdout)["sandboxes"]} == ids(api)


def test_usage_errors_exit_2(sock):
    assert hutch("frobnicate", sock=sock).returncode == 2
    assert hutch("create", "--memory", "lots", sock=sock).returncode == 2
    p = hutch("exec", sock=sock)
    assert p.returncode == 2, p


def test_connection_failure_exits_1():
    p = hutch("ls", sock="/tmp/no-such-hutchd.sock")
    assert p.returncode == 1, p
    assert p.stderr.strip(), p


def test_tcp_with_api_key(start_hutchd):
    d = start_hutchd(listen="127.0.0.1:%d" % hostutil.free_port())
    p = hutch("admin", "key", "create", "--name", "cli", sock=d.socket)
    assert p.returncode == 0, p
    key = p.stdout.strip()
    assert key.startswith("hutch_"), p
    url = d.url
    p = hutch("--url", url, "ls", "--json")
    assert p.returncode == 1, "TCP without a key must fail: %r" % (p,)
    p = hutch("--url", url, "--api-key", key, "ls", "--json")
    assert p.returncode == 0, p
    assert json.loads(p.stdout)["sandboxes"] == []
    p = hutch("run", "--", "echo", "over-tcp", env={"HUTCH_URL": url, "HUTCH_API_KEY": key})
    assert p.returncode == 0 and p.stdout == "over-tcp\n", p
    p = hutch("admin", "key", "create", "--name", "nope",
              env={"HUTCH_URL": url, "HUTCH_API_KEY": key})
    assert p.returncode == 1, "admin over TCP must be refused: %r" % (p,)
