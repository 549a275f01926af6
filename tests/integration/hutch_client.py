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
