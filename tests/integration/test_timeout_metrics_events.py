"""Sandbox timeout, metrics and events (docs/api.md, "Sandbox timeout,
metrics, events"):

- POST /v1/sandboxes/{id}/timeout moves expires_at; when it passes the
  sandbox is deleted and every host resource released; bad bodies are 400,
  unknown ids 404, a sandbox that is not running 409.
- GET /v1/sandboxes/{id}/metrics follows what happens inside: memory held
  by a process, its pids, CPU time, an OOM kill, a file written to disk.
- GET /metrics is valid Prometheus text with the documented series, and its
  request counters count exactly the requests made.
- GET /v1/events streams creating → running → deleting → deleted (and
  operation.finished) for a sandbox created after subscribing, filters by
  sandbox, serves many subscribers, sends keep-alives, never holds up
  publishers or hutchd's shutdown."""

import calendar
import json
import math
import re
import socket
import time

import pytest

import hostutil
from hutch_client import UnixHTTPConnection, check_error


def _epoch(rfc3339):
    """'2026-11-30T05:40:00.123Z' -> seconds since the epoch (float)."""
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.(\d{3})Z", rfc3339)
    assert m, rfc3339
    return calendar.timegm(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S")) + int(m.group(2)) / 1000.0


# -- server-sent events client -----------------------------------------------


class EventStream:
    """GET /v1/events over the unix socket, parsed as server-sent events."""

    def __init__(self, d, query="", timeout=30):
        self.conn = UnixHTTPConnection(d.socket, timeout=timeout)
        self.conn.request("GET", "/v1/events" + query)
        self.resp = self.conn.getresponse()
        self.status = self.resp.status
        self.headers = dict((k.lower(), v) for k, v in self.resp.getheaders())
        self.body = None
        if self.status != 200:
            self.body = self.resp.read()

    def next(self, timeout=30):
        """The next frame: ('comment', text) or (event name, data as parsed
        JSON).  Raises socket.timeout after `timeout` seconds without one,
        EOFError at the end of the stream."""
        self.conn.sock.settimeout(timeout)
        name, data, comment = None, [], None
        while True:
            line = self.resp.readline()
            if not line:
                raise EOFError("event stream ended")
            line = line.decode().rstrip("\n")
            if line == "":
                if comment is not None and name is None and not data:
                    return ("comment", comment)
                if name is not None or data:
                    return (name or "message", json.loads("\n".join(data)))
                continue
            if line.startswith(":"):
                comment = line[1:].strip()
            elif line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
            else:
                raise AssertionError("unexpected SSE line %r" % line)

    def events(self, until, timeout=60):
        """Frames (comments skipped) until `until(name, data)` is true for one
        of them (included); fails the test after `timeout` seconds."""
        out = []
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail("no matching event within %ss; got %r" % (timeout, out))
            try:
                name, data = self.next(timeout=left)
            except socket.timeout:
                pytest.fail("no matching event within %ss; got %r" % (timeout, out))
            if name == "comment":
                continue
            out.append((name, data))
            if until(name, data):
                return out

    def close(self):
        self.resp.close()
        self.conn.close()


def _open_stream(d, query=""):
    s = EventStream(d, query)
    assert s.status == 200, (s.status, s.body)
    assert s.headers.get("content-type", "").startswith("text/event-stream"), s.headers
    # The first frame comes at once: the subscription exists from here on.
    assert s.next(timeout=10) == ("comment", "subscribed")
    return s


def _states(frames, sid):
    return [(d["state"], d["previous"]) for n, d in frames if n == "sandbox.state" and d["sandbox"] == sid]


def _is_deleted(sid):
    return lambda n, d: n == "sandbox.state" and d["sandbox"] == sid and d["state"] == "deleted"


# -- Prometheus text parsing -------------------------------------------------

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
_SAMPLE = re.compile(r"^(%s)(?:\{((?:%s)(?:,%s)*)?\})? (\S+)$" % (_NAME, _LABEL, _LABEL))


def parse_prometheus(text):
    """{(name, frozenset(labels.items())): value} and {name: type}; asserts
    every line is valid text format 0.0.4."""
    samples, types = {}, {}
    assert text.endswith("\n"), "the exposition must end with a newline"
    for line in text.splitlines():
        if line.startswith("# HELP "):
            assert re.match(r"^# HELP %s .+$" % _NAME, line), line
            continue
        if line.startswith("# TYPE "):
            m = re.match(r"^# TYPE (%s) (counter|gauge|histogram|summary|untyped)$" % _NAME, line)
            assert m, line
            assert m.group(1) not in types, "TYPE given twice: %r" % line
            types[m.group(1)] = m.group(2)
            continue
        assert not line.startswith("#"), line
        m = _SAMPLE.match(line)
        assert m, "not a valid sample line: %r" % line
        labels = {}
        if m.group(2):
            for lm in re.finditer(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(2)):
                labels[lm.group(1)] = lm.group(2)
        value = float(m.group(3))  # accepts +Inf, NaN too
        key = (m.group(1), frozenset(labels.items()))
        assert key not in samples, "duplicate series %r" % line
        samples[key] = value
    return samples, types


def _series(samples, name, **labels):
    want = set(labels.items())
    return {k: v for k, v in samples.items() if k[0] == name and want <= set(k[1])}


def _value(samples, name, **labels):
    key = (name, frozenset(labels.items()))
    assert key in samples, "no series %s%r" % (name, labels)
    return samples[key]


def _scrape(api):
    r = api.request("GET", "/metrics")
    assert r.status == 200, r
    ct = r.header("Content-Type", "")
    assert ct.startswith("text/plain") and "version=0.0.4" in ct, ct
    return parse_prometheus(r.text)


# -- timeout ---------------------------------------------------------------------


def _set_timeout(api, sid, body):
    return api.request("POST", "/v1/sandboxes/%s/timeout" % sid, body)


def test_timeout_moves_expires_at_and_expiry_deletes_everything(hutchd, api, leaks):
    before = leaks.snapshot(hutchd)
    sb = api.create_ok(labels={"t": "expiry"})
    sid = sb["id"]
    assert sb["expires_at"] is not None
    assert _epoch(sb["expires_at"]) - time.time() > 600, "default timeout is 15 minutes: %r" % sb
    ev = _open_stream(hutchd, "?sandbox=" + sid)
    try:
        t0 = time.time()
        r = _set_timeout(api, sid, {"timeout_s": 2})
        assert r.status == 200, r
        assert r.json["id"] == sid and r.json["state"] == "running", r
        assert r.json["timeout_s"] == 2, r
        left = _epoch(r.json["expires_at"]) - t0
        assert 1.0 <= left <= 3.5, "expires_at should be ~2 s from now: %r" % r.json["expires_at"]
        assert api.get(sid).json["expires_at"] == r.json["expires_at"]
        # The reaper deletes it: events show it, then it is gone and nothing is left.
        frames = ev.events(_is_deleted(sid), timeout=30)
        assert _states(frames, sid) == [("deleting", "running"), ("deleted", "deleting")], frames
        assert time.time() - t0 < 30
        assert any(n == "operation.finished" and d["kind"] == "delete" and d["state"] == "succeeded"
                   for n, d in ev.events(lambda n, d: n == "operation.finished", timeout=10)), "delete op"
    finally:
        ev.close()
    assert hostutil.wait_until(lambda: api.get(sid).status == 404, 10), api.get(sid)
    leaks.assert_same(before, hutchd)


def test_timeout_extends_a_short_one(api, make_sandbox):
    sb = make_sandbox(timeout_s=2)
    r = _set_timeout(api, sb["id"], {"timeout_s": 600})
    assert r.status == 200, r
    assert r.json["timeout_s"] == 600
    time.sleep(4)
    g = api.get(sb["id"])
    assert g.status == 200 and g.json["state"] == "running", "the new timeout replaced the old one: %r" % (g,)
    assert _epoch(g.json["expires_at"]) - time.time() > 500, g


@pytest.mark.parametrize("body,mentions", [
    ({}, "timeout_s"),
    ({"timeout_s": None}, "timeout_s"),
    ({"timeout_s": 0}, "timeout_s"),
    ({"timeout_s": -5}, "timeout_s"),
    ({"timeout_s": 7 * 24 * 3600 + 1}, "timeout_s"),
    ({"timeout_s": "60"}, "timeout_s"),
    ({"timeout_s": 1.5}, "timeout_s"),
    ({"timeout_s": True}, "timeout_s"),
    ({"timeout_s": 60, "extra": 1}, "extra"),
    ([60], "object"),
])
def test_timeout_bad_values_are_400(api, sandbox, body, mentions):
    r = _set_timeout(api, sandbox["id"], body)
    check_error(r, 400, "invalid_argument", mentions)
    # Nothing changed.
    assert api.get(sandbox["id"]).json["expires_at"] == sandbox["expires_at"]


def test_timeout_malformed_json_is_400(api, sandbox):
    r = api.raw("POST", "/v1/sandboxes/%s/timeout" % sandbox["id"], b'{"timeout_s": ',
                {"Content-Type": "application/json"})
    check_error(r, 400, "invalid_argument", "JSON")


def test_timeout_unknown_sandbox_is_404(api):
    check_error(_set_timeout(api, "sb_doesnotexist", {"timeout_s": 60}), 404, "not_found", "sb_doesnotexist")


def test_timeout_wrong_method_is_405(api, sandbox):
    r = api.request("GET", "/v1/sandboxes/%s/timeout" % sandbox["id"])
    check_error(r, 405, "method_not_allowed")
    assert "POST" in r.header("Allow", ""), r.headers


def _call_while_not_running(api, call):
    """Create without waiting and call at once, while the sandbox is still
    accepted or creating; a few tries, since creation takes only ~20 ms."""
    for _ in range(10):
        r = api.create(wait=False)
        assert r.status == 202, r
        sid, oid = r.json["id"], r.json["operation"]["id"]
        try:
            c = call(sid)
        finally:
            api.operation(oid, wait=60)
            api.delete(sid, wait=True)
        if c.status == 409:
            return c
        assert c.status == 200, c
    pytest.fail("never caught a sandbox before it was running")


def test_timeout_not_running_is_409_naming_the_state(api):
    r = _call_while_not_running(api, lambda sid: _set_timeout(api, sid, {"timeout_s": 60}))
    err = check_error(r, 409, "conflict", "not running")
    assert re.search(r"is (accepted|creating)", err["message"]), err


# -- per-sandbox metrics ---------------------------------------------------------

FIELDS = ("cpu_usage_usec", "memory_bytes", "memory_peak_bytes", "pids", "oom_kills", "disk_bytes")
MiB = 1 << 20


def _metrics(api, sid):
    r = api.request("GET", "/v1/sandboxes/%s/metrics" % sid)
    assert r.status == 200, r
    m = r.json
    for f in FIELDS:
        assert isinstance(m.get(f), int) and not isinstance(m.get(f), bool) and m[f] >= 0, (f, m)
    assert m["disk_bytes_partial"] is False, m
    assert m["memory_peak_bytes"] >= m["memory_bytes"], m
    return m


def _poll_metrics(api, sid, cond, timeout=20):
    last = [None]

    def check():
        last[0] = _metrics(api, sid)
        return cond(last[0])

    hostutil.wait_until(check, timeout, interval=0.2)
    return last[0]


def test_sandbox_metrics_follow_memory_pids_cpu_and_disk(api, make_sandbox):
    sid = make_sandbox(resources={"memory_mib": 512})["id"]
    m0 = _metrics(api, sid)
    assert m0["pids"] >= 1, "hutch-init at least: %r" % m0
    assert m0["oom_kills"] == 0, m0

    # A background process that holds 96 MiB (written, so resident) and sleeps.
    hold = ("setsid python3 -c 'import time; b = b\"\\x01\" * (96 << 20); time.sleep(600)' "
            "</dev/null >/dev/null 2>&1 &")
    x = api.exec_ok(sid, cmd=hold)
    assert x["exit_code"] == 0, x
    m1 = _poll_metrics(api, sid, lambda m: m["memory_bytes"] >= m0["memory_bytes"] + 80 * MiB)
    assert m1["memory_bytes"] >= m0["memory_bytes"] + 80 * MiB, (m0, m1)
    assert m1["memory_peak_bytes"] >= m1["memory_bytes"], m1
    assert m1["pids"] >= m0["pids"] + 1, "the background python counts: %r %r" % (m0, m1)

    # CPU time: a second of busy work adds (at least a good part of) a second.
    api.exec_ok(sid, argv=["python3", "-c", "import time\nt=time.time()\nwhile time.time()-t < 1: pass"])
    m2 = _metrics(api, sid)
    assert m2["cpu_usage_usec"] >= m1["cpu_usage_usec"] + 300000, (m1, m2)

    # Disk: 5 MiB written to the sandbox's own root.  With btrfs quota groups
    # the number is as of the last commit (the pool commits every 5 s).
    api.exec_ok(sid, cmd="sync")
    m2 = _poll_metrics(api, sid, lambda m: True)
    api.exec_ok(sid, cmd="head -c %d /dev/urandom > /root/five-mib && sync" % (5 * MiB))
    m3 = _poll_metrics(api, sid, lambda m: m["disk_bytes"] >= m2["disk_bytes"] + 5 * MiB - 64 * 1024)
    assert m3["disk_bytes"] >= m2["disk_bytes"] + 5 * MiB - 64 * 1024, (m2, m3)
    assert m3["disk_bytes"] < m2["disk_bytes"] + 64 * MiB, (m2, m3)
    api.exec_ok(sid, cmd="rm /root/five-mib")
    m4 = _poll_metrics(api, sid, lambda m: m["disk_bytes"] <= m3["disk_bytes"] - 5 * MiB + 64 * 1024)
    assert m4["disk_bytes"] <= m3["disk_bytes"] - 5 * MiB + 64 * 1024, (m3, m4)

    # Killing the holder gives the memory back; the peak remembers it.
    api.exec_ok(sid, cmd="pkill -f 'time.sleep\\(600\\)'; true")
    m5 = _poll_metrics(api, sid, lambda m: m["memory_bytes"] < m1["memory_bytes"] - 64 * MiB)
    assert m5["memory_bytes"] < m1["memory_bytes"] - 64 * MiB, (m1, m5)
    assert m5["memory_peak_bytes"] >= m1["memory_bytes"], (m1, m5)


def test_sandbox_metrics_count_oom_kills(api, make_sandbox):
    sid = make_sandbox(resources={"memory_mib": 64})["id"]
    assert _metrics(api, sid)["oom_kills"] == 0
    x = api.exec(sid, argv=["python3", "-c", "b = []\nwhile True: b.append(b'x' * (1 << 20))"], timeout_s=60)
    assert x.status == 200, x
    assert x.json["signal"] == 9, "the OOM killer ends it: %r" % x.json
    m = _poll_metrics(api, sid, lambda m: m["oom_kills"] >= 1, timeout=10)
    assert m["oom_kills"] >= 1, m
    assert m["memory_peak_bytes"] >= 48 * MiB, m
    # The sandbox itself survives its command's OOM.
    assert api.exec_ok(sid, argv=["true"])["exit_code"] == 0


def test_sandbox_metrics_errors(api):
    check_error(api.request("GET", "/v1/sandboxes/sb_doesnotexist/metrics"), 404, "not_found")
    r = _call_while_not_running(api, lambda sid: api.request("GET", "/v1/sandboxes/%s/metrics" % sid))
    check_error(r, 409, "conflict", "not running")


# -- GET /metrics ------------------------------------------------------------------


def test_prometheus_exposition(api, sandbox):
    api.healthz()
    samples, types = _scrape(api)
    expected_types = {
        "hutch_build_info": "gauge", "hutch_uptime_seconds": "gauge", "hutch_sandboxes": "gauge",
        "hutch_operations_total": "counter", "hutch_http_requests_total": "counter",
        "hutch_http_request_duration_seconds": "histogram", "hutch_commands_started_total": "counter",
        "hutch_event_subscribers": "gauge",
    }
    for name, t in expected_types.items():
        assert types.get(name) == t, (name, types.get(name))

    build = _series(samples, "hutch_build_info")
    assert len(build) == 1 and list(build.values()) == [1.0], build
    assert dict(list(build)[0][1])["version"] == api.healthz().json["version"]
    assert 0 < _value(samples, "hutch_uptime_seconds") < 24 * 3600

    running = len(api.list(state="running").json["sandboxes"])
    assert running >= 1
    assert _value(samples, "hutch_sandboxes", state="running") == running
    for st in ("accepted", "creating", "deleting", "error", "pool"):
        assert _value(samples, "hutch_sandboxes", state=st) >= 0
    assert _value(samples, "hutch_operations_total", kind="create", result="succeeded") >= 1
    assert _value(samples, "hutch_operations_total", kind="delete", result="failed") == 0
    assert _value(samples, "hutch_commands_started_total") >= 0
    assert _value(samples, "hutch_http_requests_total", method="GET", route="/healthz", status="200") >= 1

    # Every histogram is consistent: cumulative buckets, +Inf == count.
    hist = {}
    for (name, labels), v in samples.items():
        if name.startswith("hutch_http_request_duration_seconds"):
            l = dict(labels)
            key = (l["method"], l["route"])
            h = hist.setdefault(key, {"buckets": {}})
            if name.endswith("_bucket"):
                h["buckets"][l["le"]] = v
            elif name.endswith("_sum"):
                h["sum"] = v
            elif name.endswith("_count"):
                h["count"] = v
    assert ("GET", "/healthz") in hist, sorted(hist)
    les = ["0.001", "0.005", "0.01", "0.05", "0.1", "0.5", "1", "5", "+Inf"]
    for key, h in hist.items():
        assert sorted(h["buckets"], key=lambda s: math.inf if s == "+Inf" else float(s)) == les, (key, h)
        vals = [h["buckets"][le] for le in les]
        assert vals == sorted(vals), "buckets must be cumulative: %r %r" % (key, h)
        assert vals[-1] == h["count"], (key, h)
        assert h["sum"] >= 0
        total = sum(v for (n, l), v in samples.items() if n == "hutch_http_requests_total"
                    and dict(l)["method"] == key[0] and dict(l)["route"] == key[1])
        assert total == h["count"], "requests_total and the histogram count the same requests: %r" % (key,)


def test_prometheus_request_counters_count_exactly(api):
    key = ("hutch_http_requests_total", dict(method="GET", route="/v1/sandboxes/*", status="404"))
    hkey = ("hutch_http_request_duration_seconds_count", dict(method="GET", route="/v1/sandboxes/*"))
    s0, _ = _scrape(api)
    n0 = _series(s0, key[0], **key[1])
    n0 = list(n0.values())[0] if n0 else 0
    h0 = list(_series(s0, hkey[0], **hkey[1]).values() or [0])[0]
    for _ in range(3):
        assert api.get("sb_nosuchthing").status == 404
    s1, _ = _scrape(api)
    assert _value(s1, key[0], **key[1]) == n0 + 3
    assert _value(s1, hkey[0], **hkey[1]) == h0 + 3
    # Paths without a route are one series, whatever the path.
    api.request("GET", "/no/such/path/%d" % time.monotonic_ns())
    api.request("GET", "/another/%d" % time.monotonic_ns())
    s2, _ = _scrape(api)
    unmatched = _series(s2, "hutch_http_requests_total", route="unmatched", status="404")
    assert sum(unmatched.values()) >= 2, unmatched
    assert not any("/no/such/path" in dict(l).get("route", "") for (_, l) in s2), "paths must not become labels"
    # The scrape itself is counted (after it answers).
    assert _value(s2, "hutch_http_requests_total", method="GET", route="/metrics", status="200") >= 2


# -- GET /v1/events ----------------------------------------------------------------


def test_events_lifecycle_of_a_sandbox_created_after_subscribing(hutchd, api):
    ev = _open_stream(hutchd)
    try:
        sb = api.create_ok(labels={"t": "events"})
        sid = sb["id"]
        api.delete_ok(sid)
        frames = ev.events(lambda n, d: n == "operation.finished" and d["sandbox"] == sid and d["kind"] == "delete")
    finally:
        ev.close()
    assert _states(frames, sid) == [("creating", "accepted"), ("running", "creating"),
                                    ("deleting", "running"), ("deleted", "deleting")], frames
    mine = [(n, d) for n, d in frames if d.get("sandbox") == sid]
    names = [(n, d.get("state") if n == "sandbox.state" else d["kind"]) for n, d in mine]
    # Each operation finishes after the state it leads to.
    assert names.index(("operation.finished", "create")) > names.index(("sandbox.state", "running")), names
    assert names.index(("operation.finished", "delete")) > names.index(("sandbox.state", "deleted")), names
    for n, d in mine:
        if n == "sandbox.state":
            assert set(d) == {"sandbox", "state", "previous", "at"}, d
            assert abs(_epoch(d["at"]) - time.time()) < 120, d
        else:
            assert set(d) == {"operation", "kind", "sandbox", "state", "error"}, d
            assert d["state"] == "succeeded" and d["error"] is None, d
            assert d["operation"].startswith("op_"), d
    create_op = [d for n, d in mine if n == "operation.finished" and d["kind"] == "create"][0]
    assert api.operation(create_op["operation"]).json["state"] == "succeeded"


def test_events_filter_by_sandbox(hutchd, api):
    a = api.create_ok(labels={"t": "filter-a"})["id"]
    ev = _open_stream(hutchd, "?sandbox=" + a)
    try:
        b = api.create_ok(labels={"t": "filter-b"})["id"]
        api.delete_ok(b)
        api.delete_ok(a)
        frames = ev.events(lambda n, d: n == "operation.finished" and d["kind"] == "delete")
    finally:
        ev.close()
    assert all(d["sandbox"] == a for _, d in frames), "only %s's events: %r" % (a, frames)
    assert _states(frames, a) == [("deleting", "running"), ("deleted", "deleting")], frames


def test_events_bad_filters(hutchd, api):
    s = EventStream(hutchd, "?sandbox=sb_doesnotexist")
    assert s.status == 404, (s.status, s.body)
    assert json.loads(s.body)["error"]["code"] == "not_found"
    s.close()
    s = EventStream(hutchd, "?sandbox=")
    assert s.status == 400, (s.status, s.body)
    assert json.loads(s.body)["error"]["code"] == "invalid_argument"
    s.close()
    r = api.request("POST", "/v1/events", {})
    check_error(r, 405, "method_not_allowed")


def _subscribers(api):
    samples, _ = _scrape(api)
    return _value(samples, "hutch_event_subscribers")


def test_events_many_subscribers_and_closed_ones_are_released(hutchd, api):
    # Streams closed by earlier tests are released within about a second.
    assert hostutil.wait_until(lambda: _subscribers(api) == 0, 10, interval=0.2), _subscribers(api)
    base = 0
    streams = [_open_stream(hutchd) for _ in range(20)]
    try:
        assert _subscribers(api) == base + 20
        sid = api.create_ok(labels={"t": "many"})["id"]
        api.delete_ok(sid)
        for i, s in enumerate(streams):
            frames = s.events(_is_deleted(sid), timeout=30)
            assert [st for st, _ in _states(frames, sid)] == ["creating", "running", "deleting", "deleted"], (i, frames)
    finally:
        for s in streams:
            s.close()
    # A client that goes away is noticed within about a second, not at the
    # next keep-alive.
    assert hostutil.wait_until(lambda: _subscribers(api) == base, 10, interval=0.2), _subscribers(api)


def test_events_a_subscriber_that_does_not_read_holds_nobody_up(hutchd, api):
    stuck = _open_stream(hutchd)
    try:
        ids = []
        t0 = time.monotonic()
        for i in range(5):
            ids.append(api.create_ok(labels={"t": "stuck"})["id"])
        for sid in ids:
            api.delete_ok(sid)
        assert time.monotonic() - t0 < 60
        # Its events waited for it, in order.
        frames = stuck.events(_is_deleted(ids[-1]), timeout=30)
        for sid in ids:
            assert [st for st, _ in _states(frames, sid)] == ["creating", "running", "deleting", "deleted"], frames
    finally:
        stuck.close()


def test_events_failed_create(start_hutchd):
    d = start_hutchd(env={"HUTCH_FAULT": "create.ready"})
    c = d.client()
    ev = _open_stream(d)
    try:
        r = c.create(wait=False)
        assert r.status == 202, r
        sid = r.json["id"]
        frames = ev.events(lambda n, dd: n == "operation.finished" and dd["sandbox"] == sid)
    finally:
        ev.close()
    assert _states(frames, sid) == [("creating", "accepted"), ("deleted", "creating")], frames
    op = frames[-1][1]
    assert op["kind"] == "create" and op["state"] == "failed", op
    assert op["error"]["code"] in ("internal", "unavailable") and "create.ready" in op["error"]["message"], op
    samples, _ = _scrape(c)
    assert _value(samples, "hutch_operations_total", kind="create", result="failed") == 1


def test_events_keepalive_and_shutdown_with_open_streams(start_hutchd):
    d = start_hutchd(env={"HUTCH_EVENTS_KEEPALIVE_S": "1"})
    ev = _open_stream(d)
    t0 = time.monotonic()
    got = []
    while len(got) < 3:
        got.append(ev.next(timeout=5))
    assert got == [("comment", "keep-alive")] * 3, got
    assert time.monotonic() - t0 < 6, "a keep-alive about every second"
    # hutchd stops promptly and cleanly with a stream still open.
    t0 = time.monotonic()
    problems = d.stop()
    d.expect_exit = True  # stopped here; the fixture's teardown only cleans up
    assert problems == [], problems
    assert time.monotonic() - t0 < 10
    with pytest.raises((EOFError, OSError, ValueError)):
        for _ in range(10):
            ev.next(timeout=5)
    ev.close()


def test_events_default_keepalive_is_not_sent_early(hutchd, make_sandbox):
    ev = _open_stream(hutchd, "?sandbox=" + make_sandbox()["id"])
    try:
        with pytest.raises(socket.timeout):
            ev.next(timeout=3)
    finally:
        ev.close()


def test_events_and_metrics_of_a_pool_claim(start_hutchd):
    d = start_hutchd(args=["--pool", "1"])
    c = d.client()
    assert hostutil.wait_until(lambda: c.healthz().json["pool"]["ready"] >= 1, 30), c.healthz()
    samples, _ = _scrape(c)
    assert _value(samples, "hutch_sandboxes", state="pool") == 1, _series(samples, "hutch_sandboxes")
    assert _value(samples, "hutch_sandboxes", state="running") == 0
    ev = _open_stream(d)
    try:
        sb = c.create_ok()
        assert sb["from_pool"] is True, sb
        frames = ev.events(lambda n, dd: n == "operation.finished" and dd["sandbox"] == sb["id"])
        # The claimed member goes from pool to running; it needs no creating.
        assert _states(frames, sb["id"]) == [("running", "pool")], frames
        assert frames[-1][1]["kind"] == "create" and frames[-1][1]["state"] == "succeeded", frames
        # The refill is visible too, as a pool member being made.
        refill = ev.events(lambda n, dd: n == "sandbox.state" and dd["state"] == "pool")
        assert refill[-1][1]["previous"] == "creating", refill
        samples, _ = _scrape(c)
        assert _value(samples, "hutch_sandboxes", state="running") == 1
        assert _value(samples, "hutch_sandboxes", state="pool") == 1
        # A sandbox from the pool takes a timeout like any other.
        r = _set_timeout(c, sb["id"], {"timeout_s": 30})
        assert r.status == 200 and r.json["timeout_s"] == 30, r
    finally:
        ev.close()
