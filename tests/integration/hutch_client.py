"""A small client for the hutchd API (docs/api.md), stdlib only.

HTTP/1.1 over the unix socket (the default transport) or over TCP.  Every
call returns a `Resp`: a 3-tuple (status, parsed JSON or None, headers) that
also carries the raw body as `.raw`.  A fresh connection is used per request
so that one test's broken connection never leaks into the next call.
"""

import collections
import http.client
import json
import socket
import urllib.parse

DEFAULT_TIMEOUT = 60.0


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over an AF_UNIX stream socket."""

    def __init__(self, path, timeout=DEFAULT_TIMEOUT):
        super().__init__("hutch", timeout=timeout)
        self.unix_path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self.unix_path)
        except BaseException:
            s.close()
            raise
        self.sock = s


class Resp(collections.namedtuple("Resp", "status json headers")):
    """(status, json-or-None, headers); `.raw` holds the body bytes."""

    raw = b""

    @property
    def text(self):
        return self.raw.decode("utf-8", "replace")

    def header(self, name, default=None):
        return self.headers.get(name, default)

    def __repr__(self):
        body = self.text
        if len(body) > 2000:
            body = body[:2000] + "…(%d bytes)" % len(self.raw)
        return "Resp(status=%r, body=%r)" % (self.status, body)


def _read_response(conn):
    """The response on `conn`, its body parsed as JSON when it is JSON."""
    r = conn.getresponse()
    data = r.read()
    parsed = None
    if data:
        try:
            parsed = json.loads(data)
        except ValueError:
            parsed = None
    resp = Resp(r.status, parsed, _Headers(r.getheaders()))
    resp.raw = data
    return resp


class Client:
    """Client for one hutchd.  Either `socket_path` or `url` (http://host:port)."""

    def __init__(self, socket_path=None, url=None, key=None, timeout=DEFAULT_TIMEOUT):
        if (socket_path is None) == (url is None):
            raise ValueError("exactly one of socket_path and url")
        self.socket_path = socket_path
        self.url = url
        self.key = key
        self.timeout = timeout
        if url is not None:
            u = urllib.parse.urlsplit(url)
            if u.scheme != "http" or not u.hostname or not u.port:
                raise ValueError("url must be http://HOST:PORT, got %r" % url)
            self.host, self.port = u.hostname, u.port

    def with_key(self, key):
        return Client(socket_path=self.socket_path, url=self.url, key=key, timeout=self.timeout)

    def _conn(self, timeout):
        if self.socket_path is not None:
            return UnixHTTPConnection(self.socket_path, timeout=timeout)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    # -- transport ---------------------------------------------------------

    def raw(self, method, path, body=None, headers=None, timeout=None):
        """Send exactly `body` (bytes or None) with `headers`; for malformed
        input tests.  Content-Length is set from the body unless given.  A
        server that answers early and closes (e.g. 413 before reading a big
        body) is tolerated: the response is read after a failed send."""
        timeout = self.timeout if timeout is None else timeout
        headers = dict(headers or {})
        lower = {k.lower() for k in headers}
        if self.key is not None and "authorization" not in lower:
            headers["Authorization"] = "Bearer " + self.key
        if body is not None and "content-length" not in lower:
            headers["Content-Length"] = str(len(body))
        elif body is None and method in ("POST", "PUT", "PATCH") and "content-length" not in lower:
            headers["Content-Length"] = "0"
        conn = self._conn(timeout)
        try:
            conn.putrequest(method, path, skip_accept_encoding=True)
            for k, v in headers.items():
                conn.putheader(k, v)
            conn.endheaders()
            if body:
                try:
                    conn.send(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the server may answer before reading it all
            return _read_response(conn)
        finally:
            conn.close()

    def request(self, method, path, body=None, timeout=None, headers=None):
        """JSON request: `body` is a Python object (or None for no body)."""
        h = dict(headers or {})
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            h.setdefault("Content-Type", "application/json")
        return self.raw(method, path, data, h, timeout=timeout)

    # -- API ---------------------------------------------------------------

    def healthz(self, timeout=None):
        return self.request("GET", "/healthz", timeout=timeout)

    def create(self, wait=True, timeout=None, **fields):
        """POST /v1/sandboxes; fields: template, runtime, resources, env, labels, timeout_s."""
        path = "/v1/sandboxes" + ("?wait=true" if wait else "")
        return self.request("POST", path, fields, timeout=timeout or max(self.timeout, 120))

    def get(self, sid):
        return self.request("GET", "/v1/sandboxes/" + sid)

    def list(self, labels=(), state=None):
        q = [("label", l) for l in labels]
        if state is not None:
            q.append(("state", state))
        path = "/v1/sandboxes"
        if q:
            path += "?" + urllib.parse.urlencode(q, safe="=")
        return self.request("GET", path)

    def delete(self, sid, wait=True, timeout=None):
        path = "/v1/sandboxes/" + sid + ("?wait=true" if wait else "")
        return self.request("DELETE", path, timeout=timeout or max(self.timeout, 120))

    def operation(self, oid, wait=None, timeout=None):
        path = "/v1/operations/" + oid
        if wait is not None:
            path += "?wait=%s" % wait
        if timeout is None:
            timeout = self.timeout + (wait or 0)
        return self.request("GET", path, timeout=timeout)

    def exec(self, sid, argv=None, cmd=None, http_timeout=None, **kw):
        """POST /v1/sandboxes/{id}/exec.  kw: env, cwd, timeout_s, stdin,
        max_output_bytes, or any other (unknown) field for negative tests."""
        body = dict(kw)
        if argv is not None:
            body["argv"] = list(argv)
        if cmd is not None:
            body["cmd"] = cmd
        if http_timeout is None:
            http_timeout = max(self.timeout, float(kw.get("timeout_s") or 60) + 30)
        return self.request("POST", "/v1/sandboxes/%s/exec" % sid, body, timeout=http_timeout)

    def create_key(self, name="test"):
        return self.request("POST", "/v1/admin/keys", {"name": name})

    # -- asserting helpers ---------------------------------------------------

    def create_ok(self, **fields):
        r = self.create(wait=True, **fields)
        assert r.status == 201, "create ?wait=true: %r" % (r,)
        assert isinstance(r.json, dict) and r.json.get("state") == "running", r
        return r.json

    def exec_ok(self, sid, argv=None, cmd=None, **kw):
        r = self.exec(sid, argv=argv, cmd=cmd, **kw)
        assert r.status == 200, "exec %r: %r" % (argv or cmd, r)
        assert isinstance(r.json, dict), r
        return r.json

    def delete_ok(self, sid):
        r = self.delete(sid, wait=True)
        assert r.status == 200, "delete %s: %r" % (sid, r)
        assert r.json.get("id") == sid and r.json.get("state") == "deleted", r
        return r.json

    # -- commands (docs/api.md "Commands") -------------------------------------

    @staticmethod
    def _q(_base, **query):
        """_base + ?query, leaving out None values; True/False as true/false."""
        q = [(k, ("true" if v else "false") if isinstance(v, bool) else v)
             for k, v in query.items() if v is not None]
        return _base + ("?" + urllib.parse.urlencode(q) if q else "")

    def cmd_path(self, sid, cid=None, action=None, **query):
        p = "/v1/sandboxes/%s/commands" % sid
        if cid is not None:
            p += "/" + cid
        if action is not None:
            p += "/" + action
        return self._q(p, **query)

    def start_command(self, sid, argv=None, cmd=None, **fields):
        """POST /v1/sandboxes/{id}/commands.  fields: env, cwd, user, uid,
        gid, stdin, pty, timeout_s, tag (or anything, for negative tests)."""
        body = dict(fields)
        if argv is not None:
            body["argv"] = list(argv)
        if cmd is not None:
            body["cmd"] = cmd
        return self.request("POST", self.cmd_path(sid), body)

    def start_command_ok(self, sid, argv=None, cmd=None, **fields):
        r = self.start_command(sid, argv=argv, cmd=cmd, **fields)
        assert r.status == 201, "start command %r: %r" % (argv or cmd, r)
        assert isinstance(r.json, dict) and str(r.json.get("id", "")).startswith("cmd_"), r
        return r.json

    def command(self, sid, cid, token=None):
        """GET …/commands/{cid} (token: ?token= instead of a key)."""
        return self.request("GET", self.cmd_path(sid, cid, token=token))

    def commands(self, sid):
        return self.request("GET", self.cmd_path(sid))

    def command_stdin(self, sid, cid, data=b"", close=None, token=None, timeout=None):
        """POST …/stdin with `data` as the raw body."""
        return self.raw("POST", self.cmd_path(sid, cid, "stdin", close=close, token=token), data,
                        {"Content-Type": "application/octet-stream"}, timeout=timeout)

    def command_signal(self, sid, cid, signal="TERM", token=None):
        body = {} if signal is None else {"signal": signal}
        return self.request("POST", self.cmd_path(sid, cid, "signal", token=token), body)

    def command_resize(self, sid, cid, rows, cols, token=None):
        return self.request("POST", self.cmd_path(sid, cid, "resize", token=token),
                            {"rows": rows, "cols": cols})

    def command_wait(self, sid, cid, timeout_s=None, token=None):
        http_timeout = max(self.timeout, (60 if timeout_s is None else float(timeout_s)) + 30)
        return self.request("POST", self.cmd_path(sid, cid, "wait", timeout_s=timeout_s, token=token),
                            timeout=http_timeout)

    def attach(self, sid, cid, replay=None, token=None, timeout=30):
        """GET …/attach as an AttachStream (check .status first)."""
        return AttachStream(self, self.cmd_path(sid, cid, "attach", replay=replay, token=token),
                            timeout=timeout)

    def attach_all(self, sid, cid, replay=None, token=None, timeout=60):
        """Attach and read to the end of the stream (bounded): an
        AttachResult.  Fails if the status is not 200."""
        s = self.attach(sid, cid, replay=replay, token=token, timeout=timeout)
        try:
            assert s.status == 200, "attach %s: %r" % (cid, s.error_resp())
            return s.read_all(timeout)
        finally:
            s.close()

    # -- files (docs/api.md "Files") -------------------------------------------

    def files_path(self, sid, sub="", **query):
        return self._q("/v1/sandboxes/%s/files%s" % (sid, sub), **query)

    def files_get(self, sid, path, timeout=None):
        return self.raw("GET", self.files_path(sid, path=path), None, timeout=timeout)

    def files_put(self, sid, path, data, mode=None, parents=None, timeout=None, **query):
        """PUT …/files with `data` as the raw body: bytes (Content-Length),
        or an iterable of byte chunks (sent chunked, streamed)."""
        p = self.files_path(sid, path=path, mode=mode, parents=parents, **query)
        h = {"Content-Type": "application/octet-stream"}
        if isinstance(data, (bytes, bytearray)):
            return self.raw("PUT", p, bytes(data), h, timeout=timeout)
        return self.raw_chunked("PUT", p, data, h, timeout=timeout)

    def files_stat(self, sid, path):
        return self.request("GET", self.files_path(sid, "/stat", path=path))

    def files_list(self, sid, path, depth=None):
        return self.request("GET", self.files_path(sid, "/list", path=path, depth=depth))

    def files_mkdir(self, sid, path, **fields):
        body = dict(fields)
        body["path"] = path
        return self.request("POST", self.files_path(sid, "/mkdir"), body)

    def files_move(self, sid, src, dst, overwrite=None):
        body = {"from": src, "to": dst}
        if overwrite is not None:
            body["overwrite"] = overwrite
        return self.request("POST", self.files_path(sid, "/move"), body)

    def files_delete(self, sid, path, recursive=None):
        return self.raw("DELETE", self.files_path(sid, path=path, recursive=recursive), None)

    def files_tar_get(self, sid, path, timeout=None):
        return self.raw("GET", self.files_path(sid, "/tar", path=path), None, timeout=timeout)

    def files_tar_put(self, sid, path, data, timeout=None):
        return self.raw("PUT", self.files_path(sid, "/tar", path=path), bytes(data),
                        {"Content-Type": "application/x-tar"}, timeout=timeout)

    # -- streaming transport ---------------------------------------------------

    def open_stream(self, method, path, headers=None, timeout=None):
        """Send a body-less request and return (conn, response) without
        reading the body; the caller reads it and closes conn."""
        timeout = self.timeout if timeout is None else timeout
        headers = dict(headers or {})
        if self.key is not None and "authorization" not in {k.lower() for k in headers}:
            headers["Authorization"] = "Bearer " + self.key
        conn = self._conn(timeout)
        try:
            conn.putrequest(method, path, skip_accept_encoding=True)
            for k, v in headers.items():
                conn.putheader(k, v)
            conn.endheaders()
            return conn, conn.getresponse()
        except BaseException:
            conn.close()
            raise

    def raw_chunked(self, method, path, chunks, headers=None, timeout=None):
        """Send `chunks` (an iterable of bytes) with Transfer-Encoding:
        chunked, so that nothing is held in memory; returns a Resp."""
        timeout = self.timeout if timeout is None else timeout
        headers = dict(headers or {})
        if self.key is not None and "authorization" not in {k.lower() for k in headers}:
            headers["Authorization"] = "Bearer " + self.key
        headers["Transfer-Encoding"] = "chunked"
        conn = self._conn(timeout)
        try:
            conn.putrequest(method, path, skip_accept_encoding=True)
            for k, v in headers.items():
                conn.putheader(k, v)
            conn.endheaders()
            try:
                for c in chunks:
                    if c:
                        conn.send(b"%x\r\n" % len(c) + bytes(c) + b"\r\n")
                conn.send(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server answered early; read its answer
            return _read_response(conn)
        finally:
            conn.close()


class _Headers(dict):
    """Response headers with case-insensitive get."""

    def __init__(self, pairs):
        super().__init__()
        for k, v in pairs:
            lk = k.lower()
            if lk in self:
                self[lk] = self[lk] + ", " + v
            else:
                self[lk] = v

    def get(self, k, default=None):
        return super().get(k.lower(), default)

    def __getitem__(self, k):
        return super().__getitem__(k.lower())

    def __contains__(self, k):
        return super().__contains__(k.lower())


def check_error(resp, status, code, mentions=()):
    """Assert `resp` is an error of the documented shape
    {"error":{"code":..., "message":...}} with this status and code, and that
    the message mentions each string in `mentions`."""
    assert resp.status == status, "expected %d %s, got %r" % (status, code, resp)
    assert isinstance(resp.json, dict), "error body is not JSON: %r" % (resp,)
    err = resp.json.get("error")
    assert isinstance(err, dict), "no error object: %r" % (resp,)
    assert err.get("code") == code, "expected code %r: %r" % (code, resp)
    msg = err.get("message")
    assert isinstance(msg, str) and msg.strip(), "empty error message: %r" % (resp,)
    for m in ([mentions] if isinstance(mentions, str) else mentions):
        assert m in msg, "error message should mention %r: %r" % (m, msg)
    return err


# -- attach streams (docs/api.md "Attach") ---------------------------------------


class AttachResult:
    """What an attach stream carried: the `attached` event, stdout and stderr
    bytes (base64-decoded, in order), the `exit` event, every event in
    order, and whether the stream ended cleanly after `exit`."""

    def __init__(self):
        self.attached = None
        self.stdout = b""
        self.stderr = b""
        self.exit = None
        self.events = []
        self.ended = False

    @property
    def dropped(self):
        return (self.attached or {}).get("dropped")

    def __repr__(self):
        def cut(b):
            return b[:300] + (b"...(%d bytes)" % len(b) if len(b) > 300 else b"")
        return "AttachResult(attached=%r, stdout=%r, stderr=%r, exit=%r, events=%d, ended=%r)" % (
            self.attached, cut(self.stdout), cut(self.stderr), self.exit, len(self.events), self.ended)


class AttachStream:
    """One GET …/attach: `status`; for 200 the NDJSON events one by one
    (`next_event`), or all of them (`read_all`).  Every read is bounded."""

    def __init__(self, client, path, timeout=30):
        self.conn, self.resp = client.open_stream("GET", path, timeout=timeout)
        self.status = self.resp.status
        self.headers = _Headers(self.resp.getheaders())
        self.body = None
        if self.status != 200:
            self.body = self.resp.read()
        self.result = AttachResult()

    def error_resp(self):
        parsed = None
        if self.body:
            try:
                parsed = json.loads(self.body)
            except ValueError:
                pass
        r = Resp(self.status, parsed, self.headers)
        r.raw = self.body or b""
        return r

    def next_event(self, timeout=30):
        """The next event as a dict (also recorded in .result), or None at
        the end of the stream.  Raises socket.timeout after `timeout`
        seconds without a complete line."""
        import base64
        if self.conn.sock is not None:
            self.conn.sock.settimeout(timeout)
        line = self.resp.readline()
        if not line:
            self.result.ended = True
            return None
        assert line.endswith(b"\n"), "attach: partial NDJSON line at the end: %r" % line[:200]
        ev = json.loads(line)
        assert isinstance(ev, dict) and "type" in ev, "attach: not an event: %r" % line[:200]
        res = self.result
        res.events.append(ev)
        t = ev["type"]
        if t == "attached":
            res.attached = ev
        elif t in ("stdout", "stderr"):
            data = base64.b64decode(ev["data"], validate=True)
            if t == "stdout":
                res.stdout += data
            else:
                res.stderr += data
        elif t == "exit":
            res.exit = ev
        return ev

    def read_until(self, pred, timeout=30):
        """Read events until pred(result) is true; returns the result.  Fails
        (AssertionError) after `timeout` seconds or at the end of the stream."""
        import time
        deadline = time.monotonic() + timeout
        while not pred(self.result):
            left = deadline - time.monotonic()
            assert left > 0, "attach: condition not met within %ss: %r" % (timeout, self.result)
            try:
                ev = self.next_event(timeout=left)
            except socket.timeout:
                raise AssertionError("attach: condition not met within %ss: %r" % (timeout, self.result))
            assert ev is not None, "attach: stream ended before the condition: %r" % (self.result,)
        return self.result

    def read_all(self, timeout=60):
        """Read to the end of the stream (which follows `exit`)."""
        import time
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, "attach: stream did not end within %ss: %r" % (timeout, self.result)
            try:
                ev = self.next_event(timeout=left)
            except socket.timeout:
                raise AssertionError("attach: stream did not end within %ss: %r" % (timeout, self.result))
            if ev is None:
                return self.result

    def close(self):
        try:
            self.resp.close()
        finally:
            self.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# -- lifecycle (docs/api.md "Lifecycle", docs/lifecycle.md) ----------------------
#
# Added as Client methods from here (this file is extended append-only).

LIFECYCLE_VERBS = ("pause", "resume", "stop", "start", "suspend", "restore", "wake")
STABLE_STATES = ("running", "paused", "stopped", "suspended", "error")
TRANSITIONAL_STATES = ("accepted", "creating", "pausing", "resuming", "stopping", "starting",
                       "suspending", "restoring", "deleting")


def _lifecycle(self, sid, verb, wait=False, timeout=None, body=None):
    """POST /v1/sandboxes/{id}/{verb}[?wait=true] (no body unless given)."""
    path = "/v1/sandboxes/%s/%s%s" % (sid, verb, "?wait=true" if wait else "")
    if body is None:
        return self.raw("POST", path, None, timeout=timeout or max(self.timeout, 150))
    return self.request("POST", path, body, timeout=timeout or max(self.timeout, 150))


def _lifecycle_ok(self, sid, verb, expect_state=None, timeout=None):
    """`verb` with ?wait=true; asserts 200 and the sandbox object in
    `expect_state` (default: the verb's documented target); returns it."""
    target = {"pause": "paused", "resume": "running", "stop": "stopped", "start": "running",
              "suspend": "suspended", "restore": "running", "wake": "running"}[verb]
    expect_state = expect_state or target
    r = _lifecycle(self, sid, verb, wait=True, timeout=timeout)
    assert r.status == 200, "%s %s ?wait=true: %r" % (verb, sid, r)
    assert isinstance(r.json, dict) and r.json.get("id") == sid, "%s: not the sandbox object: %r" % (verb, r)
    assert r.json.get("state") == expect_state, "%s: expected state %r: %r" % (verb, expect_state, r)
    return r.json


def _state_of(self, sid):
    """The sandbox's state, or 'gone' (404); raises on anything else."""
    r = self.get(sid)
    if r.status == 404:
        return "gone"
    assert r.status == 200 and isinstance(r.json, dict), "GET %s: %r" % (sid, r)
    return r.json["state"]


def _wait_state(self, sid, states, timeout=30, interval=0.05):
    """Poll GET until the state is one of `states` ('gone' = 404); bounded.
    Returns the sandbox object (or None for 'gone'); fails with the last one."""
    import time as _t
    states = (states,) if isinstance(states, str) else tuple(states)
    deadline = _t.monotonic() + timeout
    last = None
    while True:
        r = self.get(sid)
        last = r
        if r.status == 404 and "gone" in states:
            return None
        if r.status == 200 and isinstance(r.json, dict) and r.json.get("state") in states:
            return r.json
        if _t.monotonic() >= deadline:
            raise AssertionError("sandbox %s not in %r within %ss; last: %r" % (sid, states, timeout, last))
        _t.sleep(interval)


def _wait_stable(self, sid, timeout=30):
    """Wait until the sandbox is gone or in a stable (non-transitional)
    state; returns that state ('gone' for 404)."""
    sb = _wait_state(self, sid, STABLE_STATES + ("gone",), timeout=timeout)
    return "gone" if sb is None else sb["state"]


def _sandbox_metrics(self, sid):
    return self.request("GET", "/v1/sandboxes/%s/metrics" % sid)


def _op_ok(self, oid, timeout=60):
    """Wait (bounded) for operation `oid` to end; returns its object."""
    import time as _t
    deadline = _t.monotonic() + timeout
    while True:
        left = max(0, int(deadline - _t.monotonic()))
        o = self.operation(oid, wait=min(left, 30))
        assert o.status == 200, "operation %s: %r" % (oid, o)
        if o.json["state"] in ("succeeded", "failed") or left <= 0:
            return o.json


def _set_timeout(self, sid, timeout_s):
    return self.request("POST", "/v1/sandboxes/%s/timeout" % sid, {"timeout_s": timeout_s})


Client.lifecycle = _lifecycle
Client.lifecycle_ok = _lifecycle_ok
Client.state_of = _state_of
Client.wait_state = _wait_state
Client.wait_stable = _wait_stable
Client.sandbox_metrics = _sandbox_metrics
Client.wait_operation = _op_ok
Client.set_timeout = _set_timeout
