"""A test "internet" of the project's own: network namespaces that play
remote hosts, reachable from the host only, never any address outside this
machine.

    lab = NetLab(); lab.start()
    lab.host("web")  -> a namespace with HTTP on :80 and HTTPS on :443 (test CA)
    lab.dns          -> a DNS server that logs every query it sees
    lab.close()

Every host gets a /30 in 10.232.0.0/16 on a veth pair to the host netns;
the host routes to it.  Each server logs what it saw (connections, requests,
SNI, DNS names) so a test can check the far side saw nothing."""

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

SERVER = r'''
import json, os, socket, socketserver, ssl, struct, sys, threading, http.server
log_path, ip, certdir = sys.argv[1], sys.argv[2], sys.argv[3]
lock = threading.Lock()
def log(**kw):
    with lock, open(log_path, "a") as f:
        f.write(json.dumps(kw) + "\n")

class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def _go(self):
        log(kind="http", tls=isinstance(self.connection, ssl.SSLSocket), method=self.command, path=self.path,
            host=self.headers.get("Host"), client=self.client_address[0])
        if self.path.startswith("/redirect"):
            self.send_response(302); self.send_header("Location", self.path.split("?to=", 1)[1]); self.end_headers(); return
        body = ("hello from %s %s\n" % (ip, self.path)).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = do_HEAD = _go

class TS(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    def get_request(self):
        s, a = super().get_request()
        log(kind="connect", port=self.server_address[1], client=a[0])
        return s, a

http_srv = TS((ip, 80), H)
https_srv = TS((ip, 443), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(os.path.join(certdir, "server.crt"), os.path.join(certdir, "server.key"))
def sni_cb(sock, name, c):
    log(kind="sni", name=name)
ctx.sni_callback = sni_cb
https_srv.socket = ctx.wrap_socket(https_srv.socket, server_side=True)

def other_ports():
    # Anything else that reaches this host (direct TCP to another port, UDP).
    t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); t.bind((ip, 8080)); t.listen(16)
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind((ip, 9999))
    def tcp():
        while True:
            c, a = t.accept(); log(kind="connect", port=8080, client=a[0]); c.close()
    def udp():
        while True:
            d, a = u.recvfrom(2048); log(kind="udp", port=9999, client=a[0])
    threading.Thread(target=tcp, daemon=True).start(); threading.Thread(target=udp, daemon=True).start()

def dns():
    # Answers A queries from a zone file; logs every query (UDP and TCP).
    zone = json.load(open(os.path.join(certdir, "zone.json")))
    def answer(q):
        tid, flags, qd = struct.unpack(">HHH", q[:6])
        i = 12; labels = []
        while q[i]:
            labels.append(q[i+1:i+1+q[i]].decode()); i += 1 + q[i]
        name = ".".join(labels).lower(); qtype = struct.unpack(">H", q[i+1:i+3])[0]
        log(kind="dns", name=name, qtype=qtype)
        question = q[12:i+5]
        addrs = zone.get(name, []) if qtype == 1 else []
        rcode = 0 if name in zone else 3
        hdr = struct.pack(">HHHHHH", tid, 0x8180 | rcode, 1, len(addrs), 0, 0)
        ans = b"".join(b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 5, 4) + socket.inet_aton(a) for a in addrs)
        return hdr + question + ans
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind((ip, 53))
    t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); t.bind((ip, 53)); t.listen(16)
    def udp():
        while True:
            d, a = u.recvfrom(4096)
            try: u.sendto(answer(d), a)
            except Exception as e: log(kind="dns_error", error=str(e))
    def tcp():
        while True:
            c, a = t.accept()
            try:
                n = struct.unpack(">H", c.recv(2))[0]; d = c.recv(n); r = answer(d)
                c.sendall(struct.pack(">H", len(r)) + r)
            except Exception as e: log(kind="dns_error", error=str(e))
            c.close()
    threading.Thread(target=udp, daemon=True).start(); threading.Thread(target=tcp, daemon=True).start()

other_ports()
dns()
threading.Thread(target=https_srv.serve_forever, daemon=True).start()
log(kind="ready")
http_srv.serve_forever()
'''


def run(*cmd, check=True, **kw):
    return subprocess.run(list(cmd), check=check, capture_output=True, text=True, **kw)


class NetLab:
    """Hosts in namespaces `hl<n>` with addresses 10.232.<n>.2, gateway
    10.232.<n>.1 on the host side; one CA signs every server's certificate
    (names listed in `names`)."""

    def __init__(self, names, n_hosts=2):
        self.dir = tempfile.mkdtemp(prefix="hutch-netlab-", dir="/tmp")
        self.names = names  # {"allowed.test": host index, …}
        self.n_hosts = n_hosts
        self.procs = []
        self.hosts = []

    def _ca(self):
        d = self.dir
        run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", d + "/ca.key", "-out", d + "/ca.crt", "-days", "2", "-subj", "/CN=hutch test CA")
        sans = ",".join("DNS:" + n for n in self.names) + "," + ",".join(
            "IP:10.232.%d.2" % i for i in range(self.n_hosts))
        run("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", d + "/server.key", "-out", d + "/server.csr", "-subj", "/CN=test server")
        with open(d + "/ext.cnf", "w") as f:
            f.write("subjectAltName=%s\n" % sans)
        run("openssl", "x509", "-req", "-in", d + "/server.csr", "-CA", d + "/ca.crt", "-CAkey", d + "/ca.key",
            "-CAcreateserial", "-out", d + "/server.crt", "-days", "2", "-extfile", d + "/ext.cnf")
        # Bundle for the gateway's upstream verification: the test CA only.
        shutil.copy(d + "/ca.crt", d + "/upstream-ca.crt")

    def start(self):
        self._ca()
        zone = {n: ["10.232.%d.2" % i] for n, i in self.names.items() if i is not None}
        with open(self.dir + "/zone.json", "w") as f:
            json.dump(zone, f)
        for i in range(self.n_hosts):
            ns, hv, nv = "hl%d" % i, "hlh%d" % i, "hln%d" % i
            run("ip", "netns", "del", ns, check=False)
            run("ip", "link", "del", hv, check=False)
            run("ip", "netns", "add", ns)
            run("ip", "link", "add", hv, "type", "veth", "peer", "name", nv)
            run("ip", "link", "set", nv, "netns", ns)
            run("ip", "addr", "add", "10.232.%d.1/30" % i, "dev", hv)
            run("ip", "link", "set", hv, "up")
            run("ip", "-n", ns, "addr", "add", "10.232.%d.2/30" % i, "dev", nv)
            run("ip", "-n", ns, "link", "set", nv, "up")
            run("ip", "-n", ns, "link", "set", "lo", "up")
            run("ip", "-n", ns, "route", "add", "default", "via", "10.232.%d.1" % i)
            log = "%s/host%d.log" % (self.dir, i)
            open(log, "w").close()
            p = subprocess.Popen(["ip", "netns", "exec", ns, "/usr/bin/python3", "-c", SERVER, log,
                                  "10.232.%d.2" % i, self.dir], stdout=subprocess.DEVNULL,
                                 stderr=open(log + ".err", "w"), start_new_session=True)
            self.procs.append(p)
            self.hosts.append({"ns": ns, "ip": "10.232.%d.2" % i, "log": log})
        for h in self.hosts:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and "ready" not in open(h["log"]).read():
                time.sleep(0.05)
            assert "ready" in open(h["log"]).read(), open(h["log"] + ".err").read()
        return self

    @property
    def dns(self):
        return self.hosts[0]["ip"] + ":53"

    @property
    def ca(self):
        return self.dir + "/ca.crt"

    def seen(self, i, kind=None):
        out = []
        with open(self.hosts[i]["log"]) as f:
            for line in f:
                e = json.loads(line)
                if e["kind"] != "ready" and (kind is None or e["kind"] == kind):
                    out.append(e)
        return out

    def mark(self):
        """Positions in every host's log: compare with seen_since."""
        return [os.path.getsize(h["log"]) for h in self.hosts]

    def seen_since(self, marks, i, kind=None):
        out = []
        with open(self.hosts[i]["log"]) as f:
            f.seek(marks[i])
            for line in f:
                e = json.loads(line)
                if kind is None or e["kind"] == kind:
                    out.append(e)
        return out

    def close(self):
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
        for i in range(self.n_hosts):
            run("ip", "netns", "del", "hl%d" % i, check=False)
            run("ip", "link", "del", "hlh%d" % i, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)
