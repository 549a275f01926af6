"""What a sandbox can see and touch: user mapping, processes, network,
hostname, host secrets, read-only /usr."""

import glob
import hashlib
import json
import os
import socket
import threading

import hostutil


def run(api, sb, argv=None, cmd=None, **kw):
    return api.exec_ok(sb["id"], argv=argv, cmd=cmd, **kw)


def test_root_inside_is_unprivileged_on_host(api, sandbox):
    r = run(api, sandbox, ["id", "-u"])
    assert r["stdout"] == "0\n", r
    host = sandbox["host"]
    base = host["uid_base"]
    assert base >= 100000, host
    pid = host["init_pid"]
    uids = hostutil.proc_status_ids(pid, "Uid")
    gids = hostutil.proc_status_ids(pid, "Gid")
    assert uids is not None, "hutch-init (pid %d) not found on the host" % pid
    assert uids == [base] * 4, "host view of sandbox root: Uid %r, uid_base %d" % (uids, base)
    assert all(g >= 100000 for g in gids), gids
    # The mapping never includes a host uid below 100000 (root in particular).
    uid_map = hostutil.read_file("/proc/%d/uid_map" % pid).split("\n")
    rows = [list(map(int, l.split())) for l in uid_map if l.strip()]
    assert rows and rows[0][0] == 0 and rows[0][1] == base, rows
    for inside, outside, count in rows:
        assert outside >= 100000, rows
    r = run(api, sandbox, ["sh", "-c", "cat /proc/self/uid_map"])
    assert r["stdout"].split()[:2] == ["0", str(base)], r


def test_command_process_uid_on_host(api, sandbox, hutchd):

    t = threading.Thread(target=lambda: api.exec(sandbox["id"], argv=["sleep", "4.321"]))
    t.start()
    try:
        cg = hostutil.sandbox_cgroup_dir(hutchd.instance, sandbox["id"], "pids",
                                         hutchd.health["cgroup"])

        def find():
            for p in hostutil.cgroup_procs(cg):
                if (hostutil.proc_cmdline(p) or [])[-1:] == ["4.321"]:
                    return p
            return None

        pid = hostutil.wait_until(find, 5)
        assert pid, "the sleep did not appear in the sandbox's cgroup %s" % cg
        assert hostutil.proc_status_ids(pid, "Uid") == [sandbox["host"]["uid_base"]] * 4
        # Capabilities against the host: none effective in the init user namespace.
        st = hostutil.read_file("/proc/%d/status" % pid)
        caps = dict(l.split(":\t") for l in st.splitlines() if l.startswith("Cap"))
        assert int(caps["CapAmb"], 16) == 0, caps
        bnd = int(caps["CapBnd"], 16)
        for bit, name in ((21, "SYS_ADMIN"), (16, "SYS_MODULE"), (19, "SYS_PTRACE"),
                          (12, "NET_ADMIN"), (13, "NET_RAW"), (27, "MKNOD")):
            assert not bnd & (1 << bit), "CAP_%s in the bounding set: %s" % (name, caps)
        nnp = [l for l in st.splitlines() if l.startswith("NoNewPrivs")]
        assert nnp == ["NoNewPrivs:\t1"], nnp
        sec = [l for l in st.splitlines() if l.startswith("Seccomp:")]
        assert sec == ["Seccomp:\t2"], sec
    finally:
        t.join(20)


def test_sees_only_its_own_processes(api, sandbox, hutchd):
    prog = ("import os, json\n"
            "pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
            "cmds = {}\n"
            "for p in pids:\n"
            "    try: cmds[p] = open('/proc/%d/cmdline' % p, 'rb').read().replace(b'\\0', b' ').decode()\n"
            "    except OSError: pass\n"
            "print(json.dumps({'pids': pids, 'cmds': cmds, 'me': os.getpid()}))\n")
    r = run(api, sandbox, ["python3", "-c", prog])
    assert r["exit_code"] == 0, r
    v = json.loads(r["stdout"])
    pids = v["pids"]
    assert 1 in pids, v
    assert "hutch-init" in v["cmds"]["1"], v
    assert len(pids) <= 5, "sandbox sees %d processes: %r" % (len(pids), v["cmds"])
    assert not any("hutchd" in c or "hutch-shim" in c for c in v["cmds"].values()), v
    assert v["me"] < 100, v
    # Nothing of the host: hutchd's pid (and pytest's) are not there with their cmdline.
    for hp in (hutchd.pid, os.getpid()):
        assert str(hp) not in v["cmds"] or "hutchd" not in v["cmds"][str(hp)], v
    r = run(api, sandbox, ["sh", "-c", "kill -0 %d" % hutchd.pid])
    assert r["exit_code"] != 0, "hutchd's pid is signalable from inside: %r" % (r,)
    r = run(api, sandbox, ["ps", "-e", "-o", "pid=,comm="])
    if r["exit_code"] == 0:
        lines = [l for l in r["stdout"].splitlines() if l.strip()]
        assert len(lines) <= 5, lines
        assert lines[0].split()[0] == "1", lines


def test_only_loopback(api, sandbox):
    prog = "import socket, json; print(json.dumps(socket.if_nameindex()))"
    r = run(api, sandbox, ["python3", "-c", prog])
    assert r["exit_code"] == 0, r
    names = [n for _, n in json.loads(r["stdout"])]
    assert names == ["lo"], names
    r = run(api, sandbox, ["sh", "-c", "ls /sys/class/net 2>/dev/null || echo nosys"])
    assert r["stdout"].split() in (["lo"], ["nosys"]), r
    # No route anywhere: connecting to an outside address fails at once.
    prog = ("import socket\n"
            "s = socket.socket(); s.settimeout(3)\n"
            "try:\n    s.connect(('1.1.1.1', 80)); print('connected')\n"
            "except OSError as e:\n    print('error', e.errno)\n")
    r = run(api, sandbox, ["python3", "-c", prog])
    assert r["stdout"].startswith("error "), r


def test_hostname_is_not_the_hosts(api, sandbox):
    r = run(api, sandbox, ["python3", "-c", "import socket; print(socket.gethostname())"])
    inside = r["stdout"].strip()
    assert inside and inside != socket.gethostname(), (inside, socket.gethostname())
    r = run(api, sandbox, ["uname", "-n"])
    assert r["stdout"].strip() == inside


def test_host_secrets_not_visible(api, sandbox):
    files = ["/etc/shadow", "/etc/gshadow"] + sorted(glob.glob("/etc/ssh/ssh_host_*_key"))
    checked = 0
    for f in files:
        host = hostutil.read_file(f, "rb")
        if host is None:
            continue
        checked += 1
        r = run(api, sandbox, ["python3", "-c",
                               "import sys, hashlib\n"
                               "try: print(hashlib.sha256(open(sys.argv[1],'rb').read()).hexdigest())\n"
                               "except OSError as e: print('unreadable', e.errno)", f])
        out = r["stdout"].strip()
        assert out != hashlib.sha256(host).hexdigest(), "%s of the host is readable inside" % f
    assert checked >= 1, "no host secret file to compare (no /etc/shadow?)"
    # The generated /etc/passwd exists and has root.
    r = run(api, sandbox, ["sh", "-c", "grep '^root:' /etc/passwd"])
    assert r["exit_code"] == 0, r


def test_usr_read_only_tmp_and_root_writable(api, sandbox):
    probe = "/usr/hutch-rw-probe-%d" % os.getpid()
    try:
        r = run(api, sandbox, ["touch", probe])
        assert r["exit_code"] != 0, "/usr is writable inside: %r" % (r,)
        assert "Read-only file system" in r["stderr"] or "Permission denied" in r["stderr"], r
        assert not os.path.exists(probe), "a sandbox created a file in the host's /usr"
    finally:
        if os.path.exists(probe):
            os.unlink(probe)
    r = run(api, sandbox, ["sh", "-c", "echo a > /tmp/w && echo b > /root/w && cat /tmp/w /root/w"])
    assert r["stdout"] == "a\nb\n" and r["exit_code"] == 0, r
    r = run(api, sandbox, ["sh", "-c", "stat -f -c %T /tmp"])
    assert r["stdout"].strip() == "tmpfs", r


def test_minimal_dev(api, sandbox):
    r = run(api, sandbox, ["sh", "-c", "ls /dev"])
    assert r["exit_code"] == 0, r
    names = set(r["stdout"].split())
    for n in ("null", "zero", "full", "random", "urandom", "tty", "ptmx", "pts", "shm"):
        assert n in names, (n, names)
    for n in ("sda", "vda", "mem", "kmem", "kmsg", "port"):
        assert n not in names, (n, names)
    r = run(api, sandbox, ["sh", "-c", "head -c 8 /dev/urandom | wc -c; echo x > /dev/null && echo ok"])
    assert r["stdout"] == "8\nok\n", r


def test_sandboxes_cannot_see_each_other(api, sandbox, make_sandbox):
    other = make_sandbox()
    run(api, other, ["sh", "-c", "echo secret > /root/other.txt; echo s2 > /tmp/other.txt"])
    r = run(api, sandbox, ["sh", "-c", "ls /root/other.txt /tmp/other.txt 2>&1; echo done"])
    assert r["stdout"].count("No such file") == 2, r
    assert other["host"]["init_pid"] != sandbox["host"]["init_pid"]


PTRACE_PROBE = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
PTRACE_ATTACH, PTRACE_DETACH = 16, 17
def attach(pid):
    r = libc.ptrace(PTRACE_ATTACH, pid, 0, 0)
    e = ctypes.get_errno()
    if r == 0:
        os.waitpid(pid, 0)
        libc.ptrace(PTRACE_DETACH, pid, 0, 0)
    return r, e
child = os.fork()
if child == 0:
    time.sleep(30)
    os._exit(0)
try:
    print("child", *attach(child))
    print("init", *attach(int(sys.argv[1])))
finally:
    os.kill(child, 9)
"""


def test_init_cannot_be_ptraced_from_inside(api, sandbox):
    """hutch-init holds the channel to the shim; sandbox root must not be
    able to take it over.  Positive control: the same probe attaches to an
    ordinary process of the sandbox."""
    r = api.exec(sandbox["id"], argv=["python3", "-c", PTRACE_PROBE, "1"])
    assert r.status == 200 and r.json["exit_code"] == 0, r
    lines = dict(l.split(" ", 1) for l in r.json["stdout"].strip().splitlines())
    assert lines["child"] == "0 0", r.json  # attach works on an ordinary process
    assert lines["init"].split()[0] == "-1" and lines["init"].split()[1] == "1", r.json  # EPERM on init


def test_sys_is_not_mounted(api, sandbox):
    """docs/threat-model.md: /sys is not mounted inside.  Positive control:
    the host's /sys has entries."""
    import os
    assert os.listdir("/sys")
    r = api.exec(sandbox["id"], cmd="ls -A /sys 2>/dev/null | wc -l; grep -c ' /sys ' /proc/self/mounts")
    assert r.status == 200, r
    assert r.json["stdout"].split() == ["0", "0"], r.json
