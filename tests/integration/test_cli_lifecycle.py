"""The `hutch` lifecycle verbs against a real hutchd: pause, resume, stop,
start, suspend, restore, wake (docs/api.md "Lifecycle", docs/lifecycle.md),
and `hutch create --on-timeout`.

Each verb POSTs /v1/sandboxes/{id}/{verb}?wait=true and prints "ID STATE"
per sandbox; --no-wait prints "ID OPERATION_ID"; --json prints hutchd's
reply; any API error exits 1 with hutchd's message (a 409 names the state)."""

import json
import os
import re
import subprocess
import time

import pytest

from daemon import binary

SB_ID = re.compile(r"^sb_[A-Za-z0-9_-]+$")
OP_ID = re.compile(r"^op_[A-Za-z0-9_-]+$")
VERBS = ("pause", "resume", "stop", "start", "suspend", "restore", "wake")


def hutch(*args, sock=None, timeout=180):
    e = dict(os.environ)
    for k in ("HUTCH_SOCKET", "HUTCH_URL", "HUTCH_API_KEY"):
        e.pop(k, None)
    argv = [binary("hutch")] + (["--socket", sock] if sock else []) + list(args)
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e,
                          timeout=timeout, universal_newlines=True, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def sock(hutchd):
    return hutchd.socket


def state(api, sid):
    r = api.get(sid)
    assert r.status == 200, r
    return r.json["state"]


def run_ok(sock, *args):
    p = hutch(*args, sock=sock)
    assert p.returncode == 0, p
    assert p.stderr == "", p
    return p


def verb_ok(api, sock, verb, sid, want):
    """`hutch VERB ID` prints "ID WANT", exits 0, and hutchd agrees."""
    p = run_ok(sock, verb, sid)
    assert p.stdout == "%s %s\n" % (sid, want), p
    assert state(api, sid) == want
    return p


def test_pause_resume(api, sock, make_sandbox):
    sid = make_sandbox()["id"]
    verb_ok(api, sock, "pause", sid, "paused")
    verb_ok(api, sock, "pause", sid, "paused")  # repeating is a no-op
    verb_ok(api, sock, "resume", sid, "running")
    verb_ok(api, sock, "resume", sid, "running")
    assert api.exec_ok(sid, ["echo", "awake"])["stdout"] == "awake\n"


def test_stop_start(api, sock, make_sandbox):
    sid = make_sandbox()["id"]
    verb_ok(api, sock, "stop", sid, "stopped")
    verb_ok(api, sock, "stop", sid, "stopped")
    verb_ok(api, sock, "start", sid, "running")
    verb_ok(api, sock, "start", sid, "running")
    assert api.exec_ok(sid, ["echo", "booted"])["stdout"] == "booted\n"


def test_suspend_restore(api, sock, make_sandbox):
    sid = make_sandbox()["id"]
    verb_ok(api, sock, "suspend", sid, "suspended")
    verb_ok(api, sock, "suspend", sid, "suspended")
    verb_ok(api, sock, "restore", sid, "running")
    verb_ok(api, sock, "restore", sid, "running")
    assert api.exec_ok(sid, ["echo", "restored"])["stdout"] == "restored\n"


@pytest.mark.parametrize("first", ["pause", "stop", "suspend"])
def test_wake(api, sock, make_sandbox, first):
    sid = make_sandbox()["id"]
    run_ok(sock, first, sid)
    assert state(api, sid) != "running"
    verb_ok(api, sock, "wake", sid, "running")
    verb_ok(api, sock, "wake", sid, "running")  # running: no-op


def test_pause_stopped_is_409_naming_the_state(api, sock, make_sandbox):
    sid = make_sandbox()["id"]
    run_ok(sock, "stop", sid)
    p = hutch("pause", sid, sock=sock)
    assert p.returncode == 1, p
    assert p.stdout == "", p
    assert "stopped" in p.stderr and "409" in p.stderr, p
    assert p.stderr.startswith("hutch: pause"), p
    assert sid in p.stderr, p
    assert state(api, sid) == "stopped"
    # --json changes nothing for errors: the message is on stderr, exit 1.
    p = hutch("pause", "--json", sid, sock=sock)
    assert p.returncode == 1 and p.stdout == "" and "stopped" in p.stderr, p


@pytest.mark.parametrize("setup,verb,named", [
    ("stop", "resume", "stopped"),
    ("suspend", "pause", "suspended"),
    ("pause", "start", "paused"),
])
def test_conflicts_name_the_state(api, sock, make_sandbox, setup, verb, named):
    sid = make_sandbox()["id"]
    run_ok(sock, setup, sid)
    p = hutch(verb, sid, sock=sock)
    assert p.returncode == 1, p
    assert p.stdout == "" and named in p.stderr, p
    assert state(api, sid) == named


def test_json(api, sock, make_sandbox):
    sid = make_sandbox()["id"]
    p = run_ok(sock, "pause", "--json", sid)
    v = json.loads(p.stdout)
    assert v["id"] == sid and v["state"] == "paused", v
    p = run_ok(sock, "--json", "resume", sid)  # the global form
    v = json.loads(p.stdout)
    assert v["id"] == sid and v["state"] == "running", v
    # One JSON document per line, per sandbox.
    sid2 = make_sandbox()["id"]
    p = run_ok(sock, "stop", "--json", sid, sid2)
    lines = p.stdout.splitlines()
    assert len(lines) == 2, p
    assert [(json.loads(l)["id"], json.loads(l)["state"]) for l in lines] == \
        [(sid, "stopped"), (sid2, "stopped")], p


def test_no_wait_prints_the_operation(api, sock, make_sandbox):
    sid = make_sandbox()["id"]
    p = run_ok(sock, "stop", "--no-wait", sid)
    words = p.stdout.split()
    assert len(words) == 2 and p.stdout.endswith("\n"), p
    assert words[0] == sid and OP_ID.match(words[1]), p
    o = api.operation(words[1], wait=60)
    assert o.status == 200 and o.json["state"] == "succeeded", o
    assert o.json["sandbox_id"] == sid, o
    assert state(api, sid) == "stopped"

    p = run_ok(sock, "start", "--no-wait", "--json", sid)
    v = json.loads(p.stdout)
    assert v["id"] == sid and OP_ID.match(v["operation"]["id"]), v
    o = api.operation(v["operation"]["id"], wait=60)
    assert o.json["state"] == "succeeded", o
    assert state(api, sid) == "running"


def test_many_ids_one_bad(api, sock, make_sandbox):
    a, b = make_sandbox()["id"], make_sandbox()["id"]
    bad = "sb_doesnotexist0000"
    p = hutch("pause", a, bad, b, sock=sock)
    assert p.returncode == 1, p
    assert p.stdout == "%s paused\n%s paused\n" % (a, b), p
    assert bad in p.stderr and "404" in p.stderr, p
    assert a not in p.stderr and b not in p.stderr, p
    assert state(api, a) == "paused" and state(api, b) == "paused"


@pytest.mark.parametrize("verb", VERBS)
def test_unknown_sandbox_exits_1(sock, verb):
    p = hutch(verb, "sb_doesnotexist0000", sock=sock)
    assert p.returncode == 1, p
    assert p.stdout == "" and "sb_doesnotexist0000" in p.stderr, p
    assert "not found" in p.stderr.lower(), p


@pytest.mark.parametrize("verb", VERBS)
def test_usage_and_help(sock, verb):
    p = hutch(verb, sock=sock)
    assert p.returncode == 2 and "missing sandbox ID" in p.stderr, p
    p = hutch(verb, "--bogus", "sb_x", sock=sock)
    assert p.returncode == 2 and "--bogus" in p.stderr, p
    p = hutch(verb, "--help", sock=sock)
    assert p.returncode == 0, p
    assert p.stdout.startswith("usage: hutch %s [--no-wait] [--json] ID...\n" % verb), p
    p = hutch("--help")
    assert re.search(r"^  %s " % verb, p.stdout, re.M), p


def test_connection_failure_exits_1():
    p = hutch("pause", "sb_x", sock="/tmp/no-such-hutchd.sock")
    assert p.returncode == 1 and p.stdout == "" and p.stderr.startswith("hutch: pause"), p


# -- hutch create --on-timeout ---------------------------------------------------


@pytest.fixture
def cli_created(api):
    made = []
    yield made
    for sid in made:
        r = api.delete(sid, wait=True)
        assert r.status in (200, 404), "deleting %s: %r" % (sid, r)


def test_create_on_timeout(api, sock, cli_created):
    p = run_ok(sock, "create", "--on-timeout", "suspend")
    sid = p.stdout.strip()
    assert SB_ID.match(sid), p
    cli_created.append(sid)
    assert api.get(sid).json["on_timeout"] == "suspend"

    p = run_ok(sock, "create", "--json", "--on-timeout=delete")
    v = json.loads(p.stdout)
    cli_created.append(v["id"])
    assert v["on_timeout"] == "delete", v

    p = hutch("create", "--on-timeout", "hibernate", sock=sock)
    assert p.returncode == 2 and "--on-timeout" in p.stderr, p


def test_create_on_timeout_suspend_expires_into_suspended(api, sock, cli_created):
    p = run_ok(sock, "create", "--timeout", "2", "--on-timeout", "suspend")
    sid = p.stdout.strip()
    cli_created.append(sid)
    deadline = time.time() + 30
    while state(api, sid) != "suspended":
        assert time.time() < deadline, "not suspended 30 s after expiry: %r" % api.get(sid)
        time.sleep(0.2)
    verb_ok(api, sock, "wake", sid, "running")
