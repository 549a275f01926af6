"""hutch-gateway on its own (issue 8, docs/network.md), without hutchd.

Everything runs in a network namespace of its own with only a loopback
interface, so no packet can leave the machine:

- a tiny upstream world: a DNS server (127.0.0.53:53, UDP and TCP), an HTTP
  server (127.0.0.2:80) and an HTTPS server (127.0.0.3:443, a certificate
  for secure.test from a test CA made with the openssl CLI); they record
  what reaches them, so a test can show that a denied name was never
  looked up and a refused request never arrived;
- hutch-gateway on 127.0.0.1 with high ports, started as root with
  `--user nobody` (the test checks the drop), its upstream CA the test CA;
- nftables in the namespace redirects 127.0.0.9:80 and :443 to the
  transparent ports, as the real plumbing does for a sandbox's veth.

The "sandboxes" are loopback source addresses: 127.0.0.1 (sb_main: its
policy allows the test names and 127.0.0.0/8 explicitly, since every test
server is on loopback, which the address check blocks otherwise), 127.0.0.21
(sb_nocidr: the same names without the CIDR rule) and 127.0.0.66 (unknown).
Every refusal is checked next to a positive control that differs in the one
thing refused.  Test servers, clients and the gateway talk through the
namespace's loopback only; the thread pool `NS` runs client code inside it.
"""

import ctypes
import http.server
import json
import os
import pwd
import shutil
import signal
import socket
import socketserver
import ssl
import struct
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import hostutil

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("HUTCH_BUILD", os.path.join(REPO, "build"))
GATEWAY = os.path.join(BUILD, "hutch-gateway")

PORT_DNS, PORT_PROXY, PORT_HTTP, PORT_TLS = 25353, 23128, 23080, 23443
GW = "127.0.0.1"
SRC_MAIN, SRC_NOCIDR, SRC_UNKNOWN = "127.0.0.1", "127.0.0.21", "127.0.0.66"
HTTP_ADDR, HTTPS_ADDR, DNS_ADDR, REDIRECT_ADDR = "127.0.0.2", "127.0.0.3", "127.0.0.53", "127.0.0.9"
# A public-class address given to the namespace's loopback: "this host's
# public address" (the namespace has no other interface: nothing leaves).
SELF_ADDR = "11.22.33.44"
# A private network the gateway is told to treat as public (--public-cidr),
# as a lab standing in for the internet, and a private one it is not told
# of; both reached over the namespace's loopback.
LAB_NET, LAB_ADDR, PRIV_ADDR = "10.99.0.0/16", "10.99.0.2", "10.98.0.2"

RECORDS = {
    "ok.test": ["127.0.0.2"],
    "denied.test": ["127.0.0.2"],
    "secure.test": ["127.0.0.3"],
    "badcert.test": ["127.0.0.3"],
    "tcp.test": ["127.0.0.2"],
    "local.test": ["127.0.0.1"],
    "self.test": [SELF_ADDR],
    "lab.test": [LAB_ADDR],
    "priv.test": [PRIV_ADDR],  # truncated over UDP: the gateway must ask again over TCP
    "alias.test": ("CNAME", "ok.test"),
}

POLICY_MAIN = {
    "allow": ["ok.test", "secure.test", "badcert.test", "tcp.test", "alias.test", "nx.test", "local.test",
              "self.test", "127.0.0.0/8"],
    "deny": ["gist.ok.test"],
}
POLICY_NOCIDR = {"allow": ["ok.test", "secure.test", "local.test", "lab.test", "priv.test"]}

TIMEOUT = 10


# ---- the namespace ----------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNET = 0x40000000


class Netns:
    def __init__(self, name):
        self.name = name
        self.pool = None

    def _enter(self):
        fd = os.open("/run/netns/" + self.name, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if _libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns")
        finally:
            os.close(fd)

    def start(self):
        subprocess.run(["ip", "netns", "add", self.name], check=True, capture_output=True)
        subprocess.run(["ip", "-n", self.name, "link", "set", "lo", "up"], check=True, capture_output=True)
        subprocess.run(["ip", "-n", self.name, "addr", "add", SELF_ADDR + "/32", "dev", "lo"], check=True,
                       capture_output=True)
        # The lab networks: reachable on loopback (local routes) without
        # being addresses of an interface, like a host elsewhere.
        for net in (LAB_ADDR, PRIV_ADDR):
            subprocess.run(["ip", "-n", self.name, "route", "add", "local", net + "/32", "dev", "lo", "src", "127.0.0.1",
                            "table", "local"], check=True, capture_output=True)
        # setns(CLONE_NEWNET) moves only the calling thread: these workers
        # (and threads they start) live in the namespace.
        self.pool = ThreadPoolExecutor(max_workers=64, initializer=self._enter)

    def __call__(self, fn, *args, **kw):
        return self.pool.submit(fn, *args, **kw).result(timeout=120)

    def map(self, fn, items):
        futs = [self.pool.submit(fn, i) for i in items]
        return [f.result(timeout=120) for f in futs]

    def cmd(self, argv, **kw):
        return subprocess.run(["ip", "netns", "exec", self.name] + argv, **kw)

    def popen(self, argv, **kw):
        return subprocess.Popen(["ip", "netns", "exec", self.name] + argv, **kw)

    def stop(self):
        if self.pool:
            self.pool.shutdown(wait=False, cancel_futures=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)


# ---- the upstream world -----------------------------------------------------


class World:
    def __init__(self):
        self.dns_log = []  # (name, qtype, transport)
        self.requests = []  # what the HTTP(S) servers received
        self.lock = threading.Lock()
        self.servers = []

    def queried(self, name):
        with self.lock:
            return [q for q in self.dns_log if q[0] == name]

    def stop(self):
        for s in self.servers:
            s.shutdown()
            s.server_close()

    def requests_for(self, marker):
        with self.lock:
            return [r for r in self.requests if marker in r["path"]]


def _dns_name(name):
    out = b""
    for label in name.split("."):
        out += bytes([len(label)]) + label.encode()
    return out + b"\0"


def dns_answer(world, q, transport):
    qid, flags, qd = struct.unpack("!HHH", q[:6])
    off, labels = 12, []
    while q[off]:
        n = q[off]
        labels.append(q[off + 1 : off + 1 + n].decode("ascii", "replace"))
        off += 1 + n
    off += 1
    qtype, _qclass = struct.unpack("!HH", q[off : off + 4])
    off += 4
    name = ".".join(labels).lower()
    question = q[12:off]
    with world.lock:
        world.dns_log.append((name, qtype, transport))
    rcode, tc, rrs = 0, False, []
    rec = RECORDS.get(name)
    if rec is None:
        rcode = 3
    elif name == "tcp.test" and transport == "udp":
        tc = True
    elif qtype == 1:
        if isinstance(rec, tuple):  # CNAME, then the target's A records
            target = _dns_name(rec[1])
            rrs.append(struct.pack("!HHHIH", 0xC00C, 5, 1, 60, len(target)) + target)
            target_off = 12 + len(question) + 12
            for a in RECORDS[rec[1]]:
                rrs.append(struct.pack("!HHHIH", 0xC000 | target_off, 1, 1, 300, 4) + socket.inet_aton(a))
        else:
            for a in rec:
                rrs.append(struct.pack("!HHHIH", 0xC00C, 1, 1, 300, 4) + socket.inet_aton(a))
    hdr = struct.pack("!HHHHHH", qid, 0x8180 | rcode | (0x0200 if tc else 0), 1, len(rrs), 0, 0)
    return hdr + question + b"".join(rrs)


def start_world(ns, tmp):
    world = World()

    class Udp(socketserver.BaseRequestHandler):
        def handle(self):
            data, sock = self.request
            sock.sendto(dns_answer(world, data, "udp"), self.client_address)

    class Tcp(socketserver.BaseRequestHandler):
        def handle(self):
            self.request.settimeout(5)
            n = struct.unpack("!H", self._read(2))[0]
            ans = dns_answer(world, self._read(n), "tcp")
            self.request.sendall(struct.pack("!H", len(ans)) + ans)

        def _read(self, n):
            b = b""
            while len(b) < n:
                c = self.request.recv(n - len(b))
                if not c:
                    raise EOFError
                b += c
            return b

    class Echo(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            self._reply()

        do_POST = do_PUT = do_HEAD = do_GET

        def _reply(self):
            body = b""
            if self.headers.get("Content-Length"):
                body = self.rfile.read(int(self.headers["Content-Length"]))
            elif self.headers.get("Transfer-Encoding") == "chunked":
                while True:
                    size = int(self.rfile.readline().strip(), 16)
                    if size == 0:
                        self.rfile.readline()
                        break
                    body += self.rfile.read(size)
                    self.rfile.readline()
            rec = {
                "method": self.command,
                "path": self.path,
                "headers": [[k, v] for k, v in self.headers.items()],
                "body": body.decode("latin-1"),
                "tls": isinstance(self.connection, ssl.SSLSocket),
            }
            with world.lock:
                world.requests.append(rec)
            out = json.dumps(rec).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.send_header("Keep-Alive", "timeout=5")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(out)

        def log_message(self, *a):
            pass

    class ThreadingUDP(socketserver.ThreadingMixIn, socketserver.UDPServer):
        daemon_threads = True

    class ThreadingTCP(socketserver.ThreadingMixIn, socketserver.TCPServer):
        daemon_threads = True
        allow_reuse_address = True

    class HTTPS(http.server.ThreadingHTTPServer):
        daemon_threads = True

        def get_request(self):
            sock, addr = super().get_request()
            return self.ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr

    def make():
        servers = [
            ThreadingUDP((DNS_ADDR, 53), Udp),
            ThreadingTCP((DNS_ADDR, 53), Tcp),
            http.server.ThreadingHTTPServer((HTTP_ADDR, 80), Echo),
            http.server.ThreadingHTTPServer((SELF_ADDR, 80), Echo),
            http.server.ThreadingHTTPServer((LAB_ADDR, 80), Echo),
            http.server.ThreadingHTTPServer((PRIV_ADDR, 80), Echo),
        ]
        https = HTTPS((HTTPS_ADDR, 443), Echo)
        https.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        https.ctx.load_cert_chain(os.path.join(tmp, "srv.crt"), os.path.join(tmp, "srv.key"))
        servers.append(https)
        for s in servers:
            threading.Thread(target=s.serve_forever, daemon=True).start()
        return servers

    world.servers = ns(make)
    return world


def make_test_ca(tmp):
    def run(*argv):
        subprocess.run(argv, check=True, capture_output=True, cwd=tmp)

    run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", "upca.key", "-out", "upca.crt", "-days", "2", "-subj", "/CN=hutch test upstream CA")
    run("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", "srv.key", "-out", "srv.csr", "-subj", "/CN=secure.test")
    with open(os.path.join(tmp, "san.ext"), "w") as f:
        f.write("subjectAltName=DNS:secure.test\nextendedKeyUsage=serverAuth\n")
    run("openssl", "x509", "-req", "-in", "srv.csr", "-CA", "upca.crt", "-CAkey", "upca.key",
        "-CAcreateserial", "-out", "srv.crt", "-days", "2", "-extfile", "san.ext")


# ---- the gateway ------------------------------------------------------------


class Gateway:
    def __init__(self, ns, tmp):
        self.ns, self.tmp = ns, tmp
        self.ctl = os.path.join(tmp, "ctl.sock")
        self.audit = os.path.join(tmp, "audit")
        self.ca = os.path.join(tmp, "ca")
        self.proc = None
        self.log = os.path.join(tmp, "gateway.log")

    def start(self, user="nobody"):
        argv = [GATEWAY, "--control", self.ctl, "--upstream-dns", "%s:53" % DNS_ADDR, "--audit-dir", self.audit,
                "--ca-dir", self.ca, "--upstream-ca", os.path.join(self.tmp, "upca.crt"), "--listen-ip", GW,
                "--ports", "%d,%d,%d,%d" % (PORT_DNS, PORT_PROXY, PORT_HTTP, PORT_TLS), "--log-level", "debug",
                "--public-cidr", LAB_NET]
        if user:
            argv += ["--user", user]
        logf = open(self.log, "ab")
        self.proc = self.ns.popen(argv, stdout=logf, stderr=logf)
        logf.close()
        deadline = time.time() + 15
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("hutch-gateway exited %s: %s" % (self.proc.returncode, self.log_text()[-2000:]))
            try:
                self.control({"op": "list"})
                return
            except OSError:
                time.sleep(0.05)
        raise AssertionError("hutch-gateway did not start: " + self.log_text()[-2000:])

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        rc = self.proc.returncode if self.proc else None
        self.proc = None
        return rc

    def log_text(self):
        try:
            with open(self.log, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def control_raw(self, data, timeout=TIMEOUT):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect(self.ctl)
            s.sendall(data)
            buf = b""
            while buf.count(b"\n") < data.count(b"\n"):
                c = s.recv(65536)
                if not c:
                    break
                buf += c
            return buf
        finally:
            s.close()

    def control(self, obj):
        line = self.control_raw((json.dumps(obj) + "\n").encode())
        return json.loads(line)

    def push(self):
        assert self.control({"op": "set", "sandbox": "sb_main", "addr": SRC_MAIN, "policy": POLICY_MAIN}) == {"ok": True}
        assert self.control({"op": "set", "sandbox": "sb_nocidr", "addr": SRC_NOCIDR, "policy": POLICY_NOCIDR}) == {"ok": True}

    def audit_lines(self, sandbox):
        try:
            with open(os.path.join(self.audit, sandbox + ".jsonl")) as f:
                return [json.loads(line) for line in f]
        except FileNotFoundError:
            return []


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    if os.geteuid() != 0:
        hostutil.skip_or_fail("the gateway test needs root (network namespace, nftables)")
    for tool in ("ip", "nft", "openssl", "curl"):
        if not shutil.which(tool):
            hostutil.skip_or_fail("%s is not installed" % tool)
    if not os.access(GATEWAY, os.X_OK):
        pytest.fail("%s not built (make)" % GATEWAY)
    tmp = str(tmp_path_factory.mktemp("gw"))
    os.chmod(tmp, 0o755)
    make_test_ca(tmp)
    ns = Netns("hgwt%d" % os.getpid())
    try:
        ns.start()
    except subprocess.CalledProcessError as e:
        hostutil.skip_or_fail("cannot make a network namespace: %s" % e.stderr)
    try:
        rules = (
            "table ip hgwt {\n chain out {\n  type nat hook output priority -100; policy accept;\n"
            "  ip daddr %s tcp dport 80 redirect to :%d\n"
            "  ip daddr %s tcp dport 443 redirect to :%d\n }\n}\n" % (REDIRECT_ADDR, PORT_HTTP, REDIRECT_ADDR, PORT_TLS)
        )
        r = ns.cmd(["nft", "-f", "-"], input=rules.encode(), capture_output=True)
        if r.returncode != 0:
            hostutil.skip_or_fail("nftables in a namespace: %s" % r.stderr.decode())
        world = start_world(ns, tmp)
        gw = Gateway(ns, tmp)
        try:
            gw.start()
            gw.push()
            yield ns, world, gw
        finally:
            rc = gw.stop()
            world.stop()
        assert rc == 0, "hutch-gateway exited %r: %s" % (rc, gw.log_text()[-3000:])
    finally:
        ns.stop()


@pytest.fixture
def ns(env):
    return env[0]


@pytest.fixture
def world(env):
    return env[1]


@pytest.fixture
def gw(env):
    g = env[2]
    yield g
    if g.proc is None or g.proc.poll() is not None:
        # A test that stopped it restarts it with the usual policies.
        g.start()
        g.push()


# ---- clients (run inside the namespace) -------------------------------------


def _recv_all(s, limit=1 << 22):
    buf = b""
    try:
        while len(buf) < limit:
            c = s.recv(65536)
            if not c:
                break
            buf += c
    except (socket.timeout, ConnectionResetError, ssl.SSLError, OSError):
        pass
    return buf


def _recv_head(s):
    buf = b""
    while b"\r\n\r\n" not in buf and len(buf) < 65536:
        c = s.recv(4096)
        if not c:
            break
        buf += c
    return buf


def raw(data, port=PORT_PROXY, src=SRC_MAIN, host=GW, half_close=False):
    """Send bytes to a gateway port, return everything it answers."""
    s = socket.create_connection((host, port), timeout=TIMEOUT, source_address=(src, 0))
    try:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        return _recv_all(s)
    finally:
        s.close()


def status_of(resp):
    line = resp.split(b"\r\n", 1)[0]
    parts = line.split(b" ")
    return int(parts[1]) if len(parts) > 1 and parts[0].startswith(b"HTTP/1.") else None


def body_of(resp):
    return resp.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in resp else b""


def get(url, src=SRC_MAIN, extra=""):
    host = url.split("/")[2]
    return raw(("GET %s HTTP/1.1\r\nHost: %s\r\n%sUser-Agent: t\r\n\r\n" % (url, host, extra)).encode(), src=src)


def tunnel(target, sni, request, cafile, src=SRC_MAIN, port=PORT_PROXY, connect=True):
    """CONNECT target (or, connect=False, the transparent TLS port), TLS with
    `sni`, send `request`: ("ok", response) | ("refused", what) | ("tls", error)."""
    s = socket.create_connection((GW if connect else REDIRECT_ADDR, port if connect else 443), timeout=TIMEOUT,
                                 source_address=(src, 0))
    try:
        if connect:
            s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
            head = _recv_head(s)
            if status_of(head) != 200:
                return ("refused", head)
        ctx = ssl.create_default_context(cafile=cafile)
        try:
            t = ctx.wrap_socket(s, server_hostname=sni)
        except (ssl.SSLError, OSError) as e:
            return ("tls", str(e))
        t.sendall(request)
        return ("ok", _recv_all(t))
    finally:
        s.close()


def dns_query_bytes(name, qtype=1, qid=0x1234):
    return struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0) + _dns_name(name) + struct.pack("!HH", qtype, 1)


def dns(name=None, qtype=1, src=SRC_MAIN, tcp=False, data=None, expect_answer=True):
    """Ask the gateway's DNS responder: (rcode, [(type, ttl, rdata)]) or None (no answer)."""
    q = data if data is not None else dns_query_bytes(name, qtype)
    if tcp:
        s = socket.create_connection((GW, PORT_DNS), timeout=TIMEOUT, source_address=(src, 0))
        s.sendall(struct.pack("!H", len(q)) + q)
        head = b""
        while len(head) < 2:
            c = s.recv(2 - len(head))
            if not c:
                break
            head += c
        resp = b""
        while len(head) == 2 and len(resp) < struct.unpack("!H", head)[0]:
            c = s.recv(65536)
            if not c:
                break
            resp += c
    else:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((src, 0))
        s.settimeout(3 if expect_answer else 1)
        s.sendto(q, (GW, PORT_DNS))
        try:
            resp = s.recv(4096)
        except socket.timeout:
            resp = None
    s.close()
    if not resp:
        return None
    qid, flags, qd, an = struct.unpack("!HHHH", resp[:8])
    assert qid == struct.unpack("!H", q[:2])[0] and flags & 0x8000
    off = 12
    for _ in range(qd):
        while resp[off]:
            off += 1 + resp[off]
        off += 5
    rrs = []
    for _ in range(an):
        assert resp[off] & 0xC0 == 0xC0
        off += 2
        t, _c, ttl, rl = struct.unpack("!HHIH", resp[off : off + 10])
        off += 10
        rrs.append((t, ttl, resp[off : off + rl]))
        off += rl
    return flags & 0xF, rrs


def curl(ns, args, src=SRC_MAIN):
    r = ns.cmd(["curl", "-sS", "--max-time", str(TIMEOUT), "--interface", src] + args, capture_output=True)
    return r.returncode, r.stdout, r.stderr.decode("utf-8", "replace")


# ---- the tests ---------------------------------------------------------------


def test_control_protocol(gw):
    bad = [
        (b"not json\n", "invalid JSON"),
        (b'{"op":"frobnicate"}\n', "op:"),
        (b'{"op":"list","extra":1}\n', "unknown member"),
        (b'{"op":"set","sandbox":"a/b","addr":"10.231.0.6","policy":"all"}\n', "sandbox:"),
        (b'{"op":"set","sandbox":"unknown","addr":"10.231.0.6","policy":"all"}\n', "sandbox:"),
        (b'{"op":"set","sandbox":"sb_x","addr":"10.231.0.06","policy":"all"}\n', "addr:"),
        (b'{"op":"set","sandbox":"sb_x","addr":"::1","policy":"all"}\n', "addr:"),
        (b'{"op":"set","sandbox":"sb_x","addr":"10.231.0.6","policy":{"allow":["a.*.com"]}}\n', "policy.allow[0]"),
        (b'{"op":"set","sandbox":"sb_x","addr":"10.231.0.6"}\n', "policy: missing"),
        (b'{"op":"set","sandbox":"sb_x","addr":"127.0.0.1","policy":"all"}\n', "already sandbox sb_main"),
        (b'{"op":"remove"}\n', "sandbox:"),
    ]
    for line, why in bad:
        ans = json.loads(gw.control_raw(line))
        assert ans["ok"] is False and why in ans["error"], (line, ans)
    # Positive controls: the same shapes, valid.
    assert gw.control({"op": "set", "sandbox": "sb_x", "addr": "10.231.0.6", "policy": {"allow": ["*.com"]}}) == {"ok": True}
    listed = {s["sandbox"]: s for s in gw.control({"op": "list"})["sandboxes"]}
    assert listed["sb_x"] == {"sandbox": "sb_x", "addr": "10.231.0.6", "policy": {"allow": ["*.com"], "deny": []}}
    assert listed["sb_main"]["addr"] == SRC_MAIN
    assert gw.control({"op": "remove", "sandbox": "sb_x"}) == {"ok": True}
    assert gw.control({"op": "remove", "sandbox": "sb_x"}) == {"ok": True}  # idempotent
    assert "sb_x" not in {s["sandbox"] for s in gw.control({"op": "list"})["sandboxes"]}
    # Several lines in one write are answered in order.
    two = gw.control_raw(b'{"op":"list"}\n{"op":"bad"}\n').splitlines()
    assert json.loads(two[0])["ok"] is True and json.loads(two[1])["ok"] is False
    assert oct(os.stat(gw.ctl).st_mode & 0o777) == "0o600"


def test_privileges_dropped(gw):
    with open("/proc/%d/status" % gw.proc.pid) as f:
        status = f.read()
    uid = pwd.getpwnam("nobody").pw_uid
    line = [l for l in status.splitlines() if l.startswith("Uid:")][0]
    assert line.split()[1:] == [str(uid)] * 4, line
    assert [l for l in status.splitlines() if l.startswith("CapEff:")][0].split()[1] == "0000000000000000"
    # Not dumpable: its /proc files stay root's, so other processes of the
    # same user cannot read the CA key out of its memory.
    assert os.stat("/proc/%d/mem" % gw.proc.pid).st_uid == 0
    # The CA was made by root before the drop: the key stays root's, 0600.
    st = os.stat(os.path.join(gw.ca, "ca.key"))
    assert st.st_uid == 0 and st.st_mode & 0o777 == 0o600
    cert = subprocess.run(["openssl", "x509", "-in", os.path.join(gw.ca, "ca.crt"), "-noout", "-text"],
                          capture_output=True, text=True, check=True).stdout
    assert "CA:TRUE" in cert and "prime256v1" in cert and "hutch egress CA" in cert


def test_get_via_proxy_allowed(ns, world, gw):
    rc, out, err = curl(ns, ["--proxy", "http://%s:%d" % (GW, PORT_PROXY), "http://ok.test/hello?x=1"])
    assert rc == 0, err
    rec = json.loads(out)
    assert rec["path"] == "/hello?x=1", "absolute-form rewritten to origin-form"
    headers = {k.lower(): v for k, v in rec["headers"]}
    assert headers["host"] == "ok.test" and headers["connection"] == "close"
    assert "proxy-connection" not in headers
    assert [k.lower() for k, _ in rec["headers"]].count("host") == 1
    resp = ns(get, "http://ok.test/conn-close")
    assert status_of(resp) == 200 and b"\r\nConnection: close\r\n" in resp.split(b"\r\n\r\n")[0] + b"\r\n"
    assert b"Keep-Alive" not in resp.split(b"\r\n\r\n")[0]


def test_denied_name_never_resolved(ns, world, gw):
    resp = ns(get, "http://denied.test/secret")
    assert status_of(resp) == 403 and b"no rule allows this name" in resp
    assert world.queried("denied.test") == []
    assert world.requests_for("/secret") == []
    # A deny rule beats an allow rule (gist.ok.test is also under no allow
    # rule, but the deny rule is what the audit names).
    resp = ns(get, "http://gist.ok.test/")
    assert status_of(resp) == 403 and b"denied by rule" in resp
    assert world.queried("gist.ok.test") == []
    # Positive control: an allowed name is resolved and reached.
    resp = ns(get, "http://nx.test/")
    assert status_of(resp) == 502 and b"NXDOMAIN" in resp and world.queried("nx.test")
    resp = ns(get, "http://ok.test/allowed-control")
    assert status_of(resp) == 200 and world.queried("ok.test") and world.requests_for("/allowed-control")


def test_connect_tls_terminated(ns, world, gw):
    ca = os.path.join(gw.ca, "ca.crt")
    rc, out, err = curl(ns, ["--proxy", "http://%s:%d" % (GW, PORT_PROXY), "--cacert", ca, "https://secure.test/tls?a=b"])
    assert rc == 0, err
    rec = json.loads(out)
    assert rec["path"] == "/tls?a=b" and rec["tls"] is True
    assert dict((k.lower(), v) for k, v in rec["headers"])["host"] == "secure.test"
    # The certificate curl accepted came from hutch's CA: with the test
    # upstream CA alone it is refused (so the gateway did terminate TLS).
    rc, _, err = curl(ns, ["--proxy", "http://%s:%d" % (GW, PORT_PROXY), "--cacert",
                           os.path.join(gw.tmp, "upca.crt"), "https://secure.test/x"])
    assert rc == 60, err


def test_connect_sni_mismatch_refused(ns, world, gw):
    ca = os.path.join(gw.ca, "ca.crt")
    req = b"GET /sni HTTP/1.1\r\nHost: secure.test\r\n\r\n"
    kind, what = ns(tunnel, "secure.test:443", "ok.test", req, ca)
    assert kind == "tls", (kind, what)
    kind, what = ns(tunnel, "secure.test:443", "denied.test", req, ca)
    assert kind == "tls", (kind, what)
    assert world.queried("denied.test") == []
    kind, what = ns(tunnel, "secure.test:443", "secure.test", req, ca)
    assert kind == "ok" and status_of(what) == 200, what
    lines = gw.audit_lines("sb_main")
    assert any(l["decision"] == "denied" and "SNI differs" in l["reason"] for l in lines)


def test_host_mismatch_inside_tls_refused(ns, world, gw):
    ca = os.path.join(gw.ca, "ca.crt")
    kind, what = ns(tunnel, "secure.test:443", "secure.test", b"GET /fronted HTTP/1.1\r\nHost: ok.test\r\n\r\n", ca)
    assert kind == "ok" and status_of(what) == 403 and b"Host differs" in what, what
    kind, what = ns(tunnel, "secure.test:443", "secure.test",
                    b"GET https://ok.test/fronted HTTP/1.1\r\nHost: ok.test\r\n\r\n", ca)
    assert kind == "ok" and status_of(what) == 403, what
    kind, what = ns(tunnel, "secure.test:443", "secure.test",
                    b"GET /fronted HTTP/1.1\r\nHost: secure.test\r\nHost: ok.test\r\n\r\n", ca)
    assert kind == "ok" and status_of(what) == 400, what
    assert world.requests_for("/fronted") == []
    kind, what = ns(tunnel, "secure.test:443", "secure.test", b"GET /fronted-ok HTTP/1.1\r\nHost: secure.test\r\n\r\n", ca)
    assert kind == "ok" and status_of(what) == 200, what


def test_smuggling_forms_refused(ns, world, gw):
    cases = [
        b"GET http://ok.test/smuggle1 HTTP/1.1\r\nHost: ok.test\r\nHost: ok.test\r\n\r\n",
        b"POST http://ok.test/smuggle2 HTTP/1.1\r\nHost: ok.test\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"GET http://ok.test/smuggle3 HTTP/1.1\r\nHost: denied.test\r\n\r\n",
        b"GET http://ok.test:80@denied.test/smuggle4 HTTP/1.1\r\nHost: ok.test\r\n\r\n",
        b"GET http://127.1/smuggle5 HTTP/1.1\r\nHost: 127.1\r\n\r\n",
        b"GET /smuggle6 HTTP/1.1\r\nHost: ok.test\r\n\r\n",  # origin-form to a proxy
        b"GET http://ok.test/smuggle7 HTTP/1.1\r\nHost: ok.test\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n",
    ]
    for data in cases:
        resp = ns(raw, data)
        assert status_of(resp) in (400, 403), (data, resp)
    assert [r for r in world.requests if "/smuggle" in r["path"]] == []
    # A pipelined second request is never forwarded (one request per
    # connection), even to the same host.
    resp = ns(raw, b"GET http://ok.test/pipe1 HTTP/1.1\r\nHost: ok.test\r\n\r\n"
                   b"GET http://ok.test/pipe2 HTTP/1.1\r\nHost: denied.test\r\n\r\n")
    assert status_of(resp) == 200
    assert world.requests_for("/pipe1") and not world.requests_for("/pipe2")
    # Bodies: exactly the framing announced, chunked checked strictly.
    resp = ns(raw, b"POST http://ok.test/body HTTP/1.1\r\nHost: ok.test\r\nContent-Length: 5\r\n\r\nhelloEXTRA")
    assert status_of(resp) == 200 and json.loads(body_of(resp))["body"] == "hello"
    resp = ns(raw, b"POST http://ok.test/chunked HTTP/1.1\r\nHost: ok.test\r\nTransfer-Encoding: chunked\r\n\r\n"
                   b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
    assert status_of(resp) == 200 and json.loads(body_of(resp))["body"] == "hello world"
    resp = ns(raw, b"POST http://ok.test/badchunk HTTP/1.1\r\nHost: ok.test\r\nTransfer-Encoding: chunked\r\n\r\n"
                   b"5;ext=1\r\nhello\r\n0\r\n\r\n")
    assert status_of(resp) in (400, None) and not world.requests_for("/badchunk")
    # Positive control: the same request once, well formed.
    resp = ns(raw, b"GET http://ok.test/smuggle-control HTTP/1.1\r\nHost: ok.test\r\n\r\n")
    assert status_of(resp) == 200


def test_loopback_needs_cidr_rule(ns, world, gw):
    resp = ns(get, "http://ok.test/nocidr", src=SRC_NOCIDR)
    assert status_of(resp) == 403 and b"loopback" in resp, resp
    assert world.requests_for("/nocidr") == []
    # A name that resolves to 127.0.0.1: refused without the CIDR rule; with
    # it the address passes (and the connection fails: nothing listens there).
    resp = ns(get, "http://local.test/", src=SRC_NOCIDR)
    assert status_of(resp) == 403 and b"loopback" in resp, resp
    resp = ns(get, "http://local.test/", src=SRC_MAIN)
    assert status_of(resp) == 502 and b"cannot connect" in resp, resp
    # Direct addresses need a CIDR rule too.
    resp = ns(get, "http://127.0.0.2/nocidr-direct", src=SRC_NOCIDR)
    assert status_of(resp) == 403
    # Positive control: the same from the sandbox whose policy allows 127.0.0.0/8.
    resp = ns(get, "http://ok.test/cidr", src=SRC_MAIN)
    assert status_of(resp) == 200 and world.requests_for("/cidr")
    resp = ns(get, "http://127.0.0.2/cidr-direct", src=SRC_MAIN)
    assert status_of(resp) == 200
    lines = gw.audit_lines("sb_nocidr")
    assert any(l["decision"] == "denied" and l["name"] == "ok.test" and "loopback" in l["reason"]
               and l["addr"] == "127.0.0.2" for l in lines), lines


def test_dns_responder(ns, world, gw):
    rcode, rrs = ns(dns, "ok.test")
    assert rcode == 0 and [(t, r) for t, _, r in rrs] == [(1, socket.inet_aton("127.0.0.2"))]
    assert all(ttl <= 30 for _, ttl, _ in rrs)
    rcode, rrs = ns(dns, "OK.Test", tcp=True)
    assert rcode == 0 and [r for _, _, r in rrs] == [socket.inet_aton("127.0.0.2")]
    rcode, rrs = ns(dns, "alias.test")  # through a CNAME
    assert rcode == 0 and [r for _, _, r in rrs] == [socket.inet_aton("127.0.0.2")]
    rcode, rrs = ns(dns, "tcp.test")  # upstream truncated: the gateway asked over TCP
    assert rcode == 0 and [r for _, _, r in rrs] == [socket.inet_aton("127.0.0.2")]
    assert ("tcp.test", 1, "tcp") in world.dns_log
    # Denied: REFUSED, and never asked upstream.
    assert ns(dns, "denied.test") == (5, [])
    assert ns(dns, "denied.test", tcp=True) == (5, [])
    assert ns(dns, "gist.ok.test") == (5, [])
    assert world.queried("denied.test") == [] and world.queried("gist.ok.test") == []
    # An allowed name that does not exist: NXDOMAIN passed on.
    assert ns(dns, "nx.test") == (3, [])
    # AAAA for an allowed name: empty NOERROR (and not asked upstream).
    assert ns(dns, "ok.test", qtype=28) == (0, [])
    assert ("ok.test", 28, "udp") not in world.dns_log
    # Allowed name whose addresses are blocked (loopback, no CIDR rule): REFUSED.
    assert ns(dns, "ok.test", src=SRC_NOCIDR) == (5, [])
    # Unknown source: REFUSED.
    assert ns(dns, "ok.test", src=SRC_UNKNOWN) == (5, [])
    # Malformed: FORMERR; a response (QR set) or a runt: no answer.
    q = dns_query_bytes("ok.test")
    assert ns(dns, data=q + b"junk")[0] == 1
    assert ns(dns, data=q[:4] + b"\x00\x02" + q[6:])[0] == 1  # two questions claimed
    ptr = struct.pack("!HHHHHH", 7, 0x0100, 1, 0, 0, 0) + b"\xc0\x0c" + struct.pack("!HH", 1, 1)
    assert ns(dns, data=ptr)[0] == 1  # a compression pointer (to itself) in the question
    assert ns(dns, data=q[:2] + b"\x81\x80" + q[4:], expect_answer=False) is None
    assert ns(dns, data=b"\x00\x01", expect_answer=False) is None
    # Positive control after the garbage: still answering.
    assert ns(dns, "ok.test")[0] == 0
    lines = gw.audit_lines("sb_main")
    assert any(l["proto"] == "dns" and l["name"] == "denied.test" and l["decision"] == "denied" for l in lines)
    assert any(l["proto"] == "dns" and l["name"] == "ok.test" and l["decision"] == "allowed" and l["addr"] == "127.0.0.2"
               for l in lines)


def test_unknown_source_denied(ns, world, gw):
    resp = ns(get, "http://ok.test/unknown-src", src=SRC_UNKNOWN)
    assert status_of(resp) == 403 and b"unknown source" in resp
    rc, out, _ = curl(ns, ["--proxy", "http://%s:%d" % (GW, PORT_PROXY), "-o", "/dev/null", "-w", "%{http_code}",
                           "https://secure.test/"], src=SRC_UNKNOWN)
    assert rc != 0
    assert world.requests_for("/unknown-src") == []
    lines = gw.audit_lines("unknown")
    assert any(l["sandbox"] == "unknown" and l["reason"] == "unknown source" and l["name"] == "ok.test" for l in lines)
    # Positive control: the same request from a known source.
    resp = ns(get, "http://ok.test/known-src", src=SRC_MAIN)
    assert status_of(resp) == 200


def test_transparent_http(ns, world, gw):
    req = b"GET /transparent HTTP/1.1\r\nHost: ok.test\r\n\r\n"
    resp = ns(raw, req, port=80, host=REDIRECT_ADDR)
    assert status_of(resp) == 200 and world.requests_for("/transparent"), resp
    resp = ns(raw, b"GET /transparent-denied HTTP/1.1\r\nHost: denied.test\r\n\r\n", port=80, host=REDIRECT_ADDR)
    assert status_of(resp) == 403 and not world.requests_for("/transparent-denied")
    resp = ns(raw, b"GET /transparent-port HTTP/1.1\r\nHost: ok.test:8080\r\n\r\n", port=80, host=REDIRECT_ADDR)
    assert status_of(resp) == 403 and not world.requests_for("/transparent-port")
    # The transparent port reached directly (not redirected from port 80).
    resp = ns(raw, b"GET /transparent-direct HTTP/1.1\r\nHost: ok.test\r\n\r\n", port=PORT_HTTP)
    assert status_of(resp) == 403 and b"not a redirected" in resp
    assert not world.requests_for("/transparent-direct")


def test_transparent_tls(ns, world, gw):
    ca = os.path.join(gw.ca, "ca.crt")
    kind, what = ns(tunnel, None, "secure.test", b"GET /tt HTTP/1.1\r\nHost: secure.test\r\n\r\n", ca, connect=False)
    assert kind == "ok" and status_of(what) == 200 and world.requests_for("/tt"), what
    kind, what = ns(tunnel, None, "denied.test", b"GET /tt-denied HTTP/1.1\r\nHost: denied.test\r\n\r\n", ca,
                    connect=False)
    assert kind == "tls" and not world.requests_for("/tt-denied")
    kind, what = ns(tunnel, None, "secure.test", b"GET /tt-front HTTP/1.1\r\nHost: ok.test\r\n\r\n", ca, connect=False)
    assert kind == "ok" and status_of(what) == 403 and not world.requests_for("/tt-front")
    kind, what = ns(tunnel, None, "secure.test", b"GET /tt-direct HTTP/1.1\r\nHost: secure.test\r\n\r\n", ca,
                    connect=True, port=PORT_TLS)
    assert kind != "ok" or status_of(what) != 200


def test_upstream_certificate_verified(ns, world, gw):
    ca = os.path.join(gw.ca, "ca.crt")
    kind, what = ns(tunnel, "badcert.test:443", "badcert.test", b"GET /badcert HTTP/1.1\r\nHost: badcert.test\r\n\r\n", ca)
    assert kind == "ok" and status_of(what) == 502 and b"not trusted" in what, what
    assert not world.requests_for("/badcert")
    kind, what = ns(tunnel, "secure.test:443", "secure.test", b"GET /goodcert HTTP/1.1\r\nHost: secure.test\r\n\r\n", ca)
    assert kind == "ok" and status_of(what) == 200


def test_connect_plain_http_inside(ns, world, gw):
    def plain(target, host, path):
        s = socket.create_connection((GW, PORT_PROXY), timeout=TIMEOUT)
        s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
        head = _recv_head(s)
        if status_of(head) != 200:
            return head
        s.sendall(("GET %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (path, host)).encode())
        rest = head.split(b"\r\n\r\n", 1)[1] + _recv_all(s)
        s.close()
        return rest

    resp = ns(plain, "ok.test:80", "denied.test", "/plain-front")
    assert status_of(resp) == 403 and not world.requests_for("/plain-front")
    resp = ns(plain, "denied.test:80", "denied.test", "/plain-denied")
    assert status_of(resp) == 403
    resp = ns(plain, "ok.test:80", "ok.test", "/plain-ok")
    assert status_of(resp) == 200 and world.requests_for("/plain-ok")
    resp = ns(plain, "127.0.0.2:80", "127.0.0.2", "/plain-ip")
    assert status_of(resp) == 200


def test_audit_lines(ns, world, gw):
    resp = ns(get, "http://ok.test/audited")
    assert status_of(resp) == 200
    deadline = time.time() + 5
    while time.time() < deadline:
        lines = gw.audit_lines("sb_main")
        close = [l for l in lines if l["decision"] == "closed" and l["proto"] == "http" and l["bytes_down"] > 0]
        if close:
            break
        time.sleep(0.05)
    keys = ["time", "sandbox", "proto", "name", "addr", "port", "decision", "rule", "reason", "bytes_up", "bytes_down"]
    for l in lines:
        assert list(l.keys()) == keys, l
    allow = [l for l in lines if l["decision"] == "allowed" and l["proto"] == "http" and l["name"] == "ok.test"]
    assert allow and allow[-1]["addr"] == "127.0.0.2" and allow[-1]["port"] == 80 and allow[-1]["rule"] == "ok.test"
    assert allow[-1]["sandbox"] == "sb_main" and allow[-1]["time"].endswith("Z")
    assert close and close[-1]["bytes_up"] > 0 and close[-1]["bytes_down"] > 100
    deny = [l for l in lines if l["decision"] == "denied" and l["name"] == "denied.test"]
    assert deny and deny[-1]["rule"] is None and deny[-1]["reason"] == "no rule allows this name"
    deny = [l for l in lines if l["decision"] == "denied" and l["name"] == "gist.ok.test"]
    assert deny and deny[-1]["rule"] == "gist.ok.test" and deny[-1]["reason"] == "denied by rule"
    st = os.stat(os.path.join(gw.audit, "sb_main.jsonl"))
    assert st.st_uid == pwd.getpwnam("nobody").pw_uid and st.st_mode & 0o777 == 0o640


def test_many_concurrent_connections(ns, world, gw):
    """Hundreds at once: each holds its connection open until all are in."""
    n = 300
    barrier = threading.Barrier(n, timeout=60)

    def one(i):
        s = socket.create_connection((GW, PORT_PROXY), timeout=60)
        try:
            s.sendall(b"GET http://ok.test/many-%d HTTP/1.1\r\nHost: ok.test\r\n" % i)
            barrier.wait()
            s.sendall(b"\r\n")
            return status_of(_recv_all(s))
        finally:
            s.close()

    def run():
        with ThreadPoolExecutor(max_workers=n) as ex:
            return list(ex.map(one, range(n)))

    statuses = ns(run)
    assert statuses == [200] * n


def test_remove_then_denied(ns, world, gw):
    assert gw.control({"op": "set", "sandbox": "sb_tmp", "addr": "127.0.0.30", "policy": POLICY_MAIN}) == {"ok": True}
    assert status_of(ns(get, "http://ok.test/tmp-before", src="127.0.0.30")) == 200
    assert gw.control({"op": "remove", "sandbox": "sb_tmp"}) == {"ok": True}
    resp = ns(get, "http://ok.test/tmp-after", src="127.0.0.30")
    assert status_of(resp) == 403 and b"unknown source" in resp


def test_restart_denies_until_pushed(ns, world, gw):
    with open(os.path.join(gw.ca, "ca.crt"), "rb") as f:
        ca_before = f.read()
    assert gw.stop() == 0
    gw.start()
    assert gw.control({"op": "list"}) == {"ok": True, "sandboxes": []}
    resp = ns(get, "http://ok.test/after-restart")
    assert status_of(resp) == 403 and b"unknown source" in resp
    assert ns(dns, "ok.test") == (5, [])
    assert not world.requests_for("/after-restart")
    gw.push()
    resp = ns(get, "http://ok.test/after-push")
    assert status_of(resp) == 200
    with open(os.path.join(gw.ca, "ca.crt"), "rb") as f:
        assert f.read() == ca_before, "the CA is kept across restarts"


def test_this_host_refused(ns, world, gw):
    """A name (or "all") that leads to one of the host's own public
    addresses would reach the host's services: refused unless a CIDR rule
    names the address."""
    assert gw.control({"op": "set", "sandbox": "sb_all", "addr": "127.0.0.22", "policy": "all"}) == {"ok": True}
    assert gw.control({"op": "set", "sandbox": "sb_self", "addr": "127.0.0.23",
                       "policy": {"allow": ["self.test", SELF_ADDR + "/32"]}}) == {"ok": True}
    try:
        resp = ns(get, "http://self.test/self-name", src=SRC_MAIN)
        assert status_of(resp) == 403 and b"this host" in resp, resp
        resp = ns(get, "http://%s/self-all" % SELF_ADDR, src="127.0.0.22")
        assert status_of(resp) == 403 and b"this host" in resp, resp
        assert not world.requests_for("/self-")
        # Positive control: the address named by a CIDR rule.
        resp = ns(get, "http://self.test/explicit-self", src="127.0.0.23")
        assert status_of(resp) == 200 and world.requests_for("/explicit-self"), resp
    finally:
        gw.control({"op": "remove", "sandbox": "sb_all"})
        gw.control({"op": "remove", "sandbox": "sb_self"})


def test_public_cidr(ns, world, gw):
    """--public-cidr: a lab network judged as public addresses (an allowed
    name may resolve there without a CIDR rule); other private networks
    stay blocked, and a direct address still needs an allow rule."""
    resp = ns(get, "http://lab.test/lab-name", src=SRC_NOCIDR)
    assert status_of(resp) == 200 and world.requests_for("/lab-name"), resp
    assert ns(dns, "lab.test", src=SRC_NOCIDR) == (0, [(1, 30, socket.inet_aton(LAB_ADDR))])
    resp = ns(get, "http://priv.test/priv-name", src=SRC_NOCIDR)
    assert status_of(resp) == 403 and b"private" in resp, resp
    assert ns(dns, "priv.test", src=SRC_NOCIDR) == (5, [])
    resp = ns(get, "http://%s/lab-direct" % LAB_ADDR, src=SRC_NOCIDR)
    assert status_of(resp) == 403 and b"no rule allows this address" in resp, resp
    assert not world.requests_for("/priv-name") and not world.requests_for("/lab-direct")
    # Networks that would unlock loopback, metadata or everything are refused.
    for bad in ("0.0.0.0/0", "127.0.0.0/8", "169.254.0.0/16", "100.64.0.0/10", "8.0.0.0/7", "::/0", "10.0.0.1/8",
                "example.com", "10.99.0.0/16:80"):
        r = subprocess.run([GATEWAY, "--control", "/nonexistent/x", "--upstream-dns", "127.0.0.1:53", "--audit-dir",
                            "/nonexistent/y", "--public-cidr", bad], capture_output=True, text=True, timeout=10)
        assert r.returncode == 2 and "--public-cidr" in r.stderr, (bad, r)
