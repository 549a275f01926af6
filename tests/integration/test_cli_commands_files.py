"""The `hutch` CLI's streaming commands and file copies against a real hutchd:
exec (live output, exit status, stdin with -i, a PTY with -t, --json, -d),
shell (bash driven through a pseudo-terminal), attach, ps, kill, cp (files and
directories, both ways, stdin/stdout), timeout and metrics."""

import errno
import fcntl
import hashlib
import io
import json
import os
import pty
import re
import select
import signal
import stat
import struct
import subprocess
import tarfile
import termios
import time

import pytest

import hostutil
from daemon import binary

CMD_ID = re.compile(r"^cmd_[A-Za-z0-9_-]+$")


def hutch_argv(sock, *args):
    return [binary("hutch"), "--socket", sock] + list(args)


def clean_env():
    e = dict(os.environ)
    for k in ("HUTCH_SOCKET", "HUTCH_URL", "HUTCH_API_KEY"):
        e.pop(k, None)
    return e


def hutch(sock, *args, input=None, timeout=60, text=True):
    """Run the CLI; stdin is `input` (bytes or str) or /dev/null."""
    kw = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env(), timeout=timeout)
    if input is None:
        kw["stdin"] = subprocess.DEVNULL
    else:
        kw["input"] = input
    if text:
        kw["universal_newlines"] = True
    return subprocess.run(hutch_argv(sock, *args), **kw)


@pytest.fixture(scope="module")
def sock(hutchd):
    return hutchd.socket


@pytest.fixture(scope="module")
def sid(sandbox):
    return sandbox["id"]


def sh(api, sid, cmd):
    """Run a shell command in the sandbox through the synchronous API."""
    r = api.exec_ok(sid, cmd=cmd)
    assert r["exit_code"] == 0, r
    return r["stdout"]


# -- a process on a pseudo-terminal ------------------------------------------


class PtyProc:
    """argv run with a new pseudo-terminal as its controlling terminal and
    stdin/stdout/stderr (what `hutch shell` sees in a real terminal)."""

    def __init__(self, argv, rows=24, cols=80):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # child
            try:
                fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
                os.execve(argv[0], argv, clean_env())
            finally:
                os._exit(127)
        self.out = b""
        self.status = None

    def set_size(self, rows, cols):
        # The kernel sends SIGWINCH to the terminal's foreground process group.
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def write(self, data):
        os.write(self.fd, data)

    def _read(self, timeout):
        r, _, _ = select.select([self.fd], [], [], timeout)
        if not r:
            return True
        try:
            d = os.read(self.fd, 65536)
        except OSError as e:
            if e.errno == errno.EIO:  # every slave fd closed
                return False
            raise
        if not d:
            return False
        self.out += d
        return True

    def read_until(self, pattern, timeout=30):
        """Read until `pattern` (bytes regex) matches the output so far."""
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern)
        while not rx.search(self.out):
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(min(left, 0.2)):
                break
        m = rx.search(self.out)
        assert m, "no %r in the terminal output after %ss: %r" % (pattern, timeout, self.out)
        return m

    def wait(self, timeout=30):
        """Read everything until the process exits; returns its exit status."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, st = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                while self._read(0.05):
                    pass
                self.status = os.waitstatus_to_exitcode(st)
                os.close(self.fd)
                return self.status
            self._read(0.1)
        self.kill()
        pytest.fail("process on the pty did not exit within %ss; output: %r" % (timeout, self.out))

    def kill(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except OSError:
            pass
        try:
            os.close(self.fd)
        except OSError:
            pass


@pytest.fixture
def on_pty():
    procs = []

    def start(argv, rows=24, cols=80):
        p = PtyProc(argv, rows, cols)
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.status is None:
            p.kill()


# -- exec: output, exit status -------------------------------------------------


def test_exec_stdout_stderr_and_exit_code(sock, sid):
    p = hutch(sock, "exec", sid, "--", "sh", "-c", "echo out; echo err >&2; exit 3")
    assert p.returncode == 3, p
    assert p.stdout == "out\n", p
    assert p.stderr == "err\n", p


def test_exec_output_is_binary_safe(sock, sid):
    prog = "import sys; sys.stdout.buffer.write(bytes(range(256)) * 64); sys.stdout.flush()"
    p = hutch(sock, "exec", sid, "--", "python3", "-c", prog, text=False)
    assert p.returncode == 0, p
    assert p.stdout == bytes(range(256)) * 64
    assert p.stderr == b"", p


def test_exec_streams_live(sock, sid):
    """The first line arrives while the command is still running."""
    proc = subprocess.Popen(
        hutch_argv(sock, "exec", sid, "--", "sh", "-c", "echo first; sleep 5; echo second"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        env=clean_env())
    try:
        t0 = time.monotonic()
        r, _, _ = select.select([proc.stdout], [], [], 4)
        assert r, "no output within 4 s: exec does not stream"
        assert proc.stdout.readline() == b"first\n"
        assert time.monotonic() - t0 < 4
        assert proc.poll() is None, "exec ended before the command did"
        out, err = proc.communicate(timeout=30)
        assert out == b"second\n" and proc.returncode == 0, (out, err)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_exec_killed_by_signal_exits_128_plus_n(sock, sid):
    p = hutch(sock, "exec", sid, "--", "sh", "-c", "kill -9 $$")
    assert p.returncode == 128 + 9, p
    assert "signal 9" in p.stderr, p


def test_exec_timeout_exits_124(sock, sid):
    t0 = time.monotonic()
    p = hutch(sock, "exec", "--timeout", "1", sid, "--", "sleep", "30")
    assert p.returncode == 124, p
    assert "timed out" in p.stderr, p
    assert time.monotonic() - t0 < 20


def test_exec_sh_env_cwd_user(sock, sid):
    p = hutch(sock, "exec", "--env", "GREETING=hi there", "--cwd", "/tmp", "--sh", sid,
              'echo "$GREETING"; pwd; id -u')
    assert p.returncode == 0, p
    assert p.stdout == "hi there\n/tmp\n0\n", p
    p = hutch(sock, "exec", "--user", "user", "--cwd", "/tmp", sid, "--", "id", "-u")
    assert p.returncode == 0 and p.stdout == "1000\n", p


def test_exec_missing_program(sock, sid):
    p = hutch(sock, "exec", sid, "--", "/no/such/program")
    assert p.returncode in (1, 127), p
    assert "No such file" in p.stderr and "/no/such/program" in p.stderr, p


def test_exec_unknown_sandbox(sock):
    p = hutch(sock, "exec", "sb_doesnotexist0000", "--", "true")
    assert p.returncode == 1, p
    assert "not found" in p.stderr.lower() and p.stdout == "", p


def test_exec_json_prints_the_command_object(sock, sid):
    p = hutch(sock, "exec", "--json", sid, "--", "sh", "-c", "echo j; exit 2")
    assert p.returncode == 2, p
    v = json.loads(p.stdout)
    assert CMD_ID.match(v["id"]), v
    assert v["state"] == "exited" and v["exit_code"] == 2 and v["signal"] is None, v
    assert v["argv"] == ["sh", "-c", "echo j; exit 2"], v


def test_exec_output_to_a_closed_pipe(sock, sid, api):
    """`hutch exec ID -- yes | head -1` ends, and so does `yes`."""
    cmd = "%s exec %s -- yes | head -n 1" % (" ".join(hutch_argv(sock)), sid)
    p = subprocess.run(["sh", "-c", cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       stdin=subprocess.DEVNULL, env=clean_env(), timeout=60,
                       universal_newlines=True)
    assert p.stdout == "y\n", p
    deadline = time.monotonic() + 10
    while True:
        cmds = json.loads(hutch(sock, "ps", "--json", sid).stdout)["commands"]
        running = [c for c in cmds if c["argv"] == ["yes"] and c["state"] == "running"]
        if not running or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not running, "`yes` still runs after its reader went away: %r" % running


# -- exec -i: stdin ------------------------------------------------------------


def test_exec_i_forwards_piped_stdin(sock, sid):
    p = subprocess.run(["sh", "-c", "echo hello | %s exec -i %s -- cat" % (
        " ".join(hutch_argv(sock)), sid)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=clean_env(), timeout=60, universal_newlines=True)
    assert p.returncode == 0, p
    assert p.stdout == "hello\n", p


def test_exec_i_large_binary_stdin(sock, sid):
    data = os.urandom(3 * 1024 * 1024 + 17)
    p = hutch(sock, "exec", "-i", sid, "--", "sha256sum", input=data, text=False)
    assert p.returncode == 0, p
    assert p.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest(), p


def test_exec_i_empty_stdin_is_eof(sock, sid):
    p = hutch(sock, "exec", "-i", sid, "--", "wc", "-c", input="", timeout=30)
    assert p.returncode == 0 and p.stdout.strip() == "0", p


def test_exec_without_i_has_no_stdin(sock, sid):
    p = hutch(sock, "exec", sid, "--", "cat", input="not forwarded\n", timeout=30)
    assert p.returncode == 0 and p.stdout == "", p


def test_exec_i_command_that_stops_reading(sock, sid):
    data = b"x" * (4 * 1024 * 1024)
    p = hutch(sock, "exec", "-i", sid, "--", "head", "-c", "3", input=data, text=False,
              timeout=60)
    assert p.returncode == 0 and p.stdout == b"xxx", p


# -- exec -t and shell: a terminal -----------------------------------------------


def test_exec_t_gives_a_pty(sock, sid, on_pty):
    p = on_pty(hutch_argv(sock, "exec", "-t", sid, "--", "tty"))
    assert p.wait() == 0, p.out
    assert re.search(rb"^/dev/pts/\d+\r?\r?\n", p.out), p.out


def test_exec_without_t_has_no_tty(sock, sid):
    p = hutch(sock, "exec", sid, "--", "sh", "-c", "tty; true")
    assert "not a tty" in p.stdout, p


def test_exec_t_takes_the_window_size(sock, sid, on_pty):
    p = on_pty(hutch_argv(sock, "exec", "-t", sid, "--", "stty", "size"), rows=33, cols=101)
    assert p.wait() == 0, p.out
    assert b"33 101" in p.out, p.out


def test_exec_t_forwards_window_changes(sock, sid, on_pty):
    p = on_pty(hutch_argv(sock, "exec", "-it", sid, "--", "sh", "-c",
                          "stty size; read x; stty size"), rows=24, cols=80)
    p.read_until(rb"24 80")
    p.set_size(50, 132)
    time.sleep(1)  # the resize is a request of its own; let it land first
    p.write(b"go\r")
    p.read_until(rb"50 132")
    assert p.wait() == 0, p.out


def test_exec_t_merges_stderr_and_keeps_exit_code(sock, sid, on_pty):
    p = on_pty(hutch_argv(sock, "exec", "-t", sid, "--", "sh", "-c", "echo e >&2; exit 5"))
    assert p.wait() == 5, p.out
    # One stream; the remote terminal's "\r\n" is not translated again.
    assert p.out == b"e\r\n", p.out


def test_exec_it_with_piped_stdin_ends_at_eof(sock, sid):
    """A terminal has no end of input; at EOF of a pipe the CLI types ^D."""
    p = hutch(sock, "exec", "-it", sid, "--", "cat", input="hello\n", timeout=30)
    assert p.returncode == 0, p
    assert p.stdout.replace("\r", "") == "hello\nhello\n", p  # the terminal's echo, then cat
    p = hutch(sock, "exec", "-it", sid, "--", "sh", "-c", "read x; echo got=$x", input="abc",
              timeout=30)
    assert p.returncode == 0 and "got=abc" in p.stdout, p


def test_shell_drives_bash(sock, sid, on_pty):
    p = on_pty(hutch_argv(sock, "shell", sid))
    p.read_until(rb"[#$] ")  # the prompt
    p.write(b"echo $((6*7))\n")
    p.read_until(rb"\r\n42\r\n")
    p.write(b"exit\n")
    assert p.wait() == 0, p.out


def test_shell_ctrl_c_goes_to_the_remote_side(sock, sid, on_pty):
    p = on_pty(hutch_argv(sock, "shell", sid))
    p.read_until(rb"[#$] ")
    p.write(b"sleep 60; echo slept\n")
    time.sleep(1)
    p.write(b"\x03")  # Ctrl-C: a byte for the remote terminal, not SIGINT for hutch
    time.sleep(0.5)
    p.write(b"echo still-$((40+2))\n")
    p.read_until(rb"still-42")
    assert b"\nslept" not in p.out, p.out
    p.write(b"exit 3\n")
    assert p.wait() == 3, p.out


def test_shell_restores_the_terminal(sock, sid, on_pty):
    script = 'stty -g; "$@"; echo "rc=$?"; stty -g'
    p = on_pty(["/bin/sh", "-c", script, "sh"] + hutch_argv(sock, "shell", sid))
    p.read_until(rb"[#$] ")
    p.write(b"exit\n")
    assert p.wait() == 0, p.out
    lines = [l for l in p.out.replace(b"\r", b"").split(b"\n") if re.match(rb"^[0-9a-f:]+$", l)]
    assert len(lines) == 2 and lines[0] == lines[1], p.out
    assert b"rc=0" in p.out, p.out


def test_shell_with_a_command(sock, sid, on_pty):
    p = on_pty(hutch_argv(sock, "shell", sid, "--", "sh", "-c", "echo via-shell; exit 4"))
    assert p.wait() == 4, p.out
    assert b"via-shell" in p.out, p.out


# -- detached commands: attach, ps, kill ------------------------------------------


def start_detached(sock, sid, *cmd, tag=None):
    args = ["exec", "-d"] + (["--tag", tag] if tag else []) + [sid, "--"] + list(cmd)
    p = hutch(sock, *args)
    assert p.returncode == 0, p
    lines = p.stdout.splitlines()
    assert len(lines) == 2 and CMD_ID.match(lines[0]) and lines[1], p
    return lines[0], lines[1]


def test_detach_then_attach(sock, sid):
    cid, token = start_detached(sock, sid, "sh", "-c",
                                "for i in 1 2 3; do echo tick $i; sleep 0.3; done; "
                                "echo done >&2; exit 6")
    p = hutch(sock, "attach", sid, cid)
    assert p.returncode == 6, p
    assert p.stdout == "tick 1\ntick 2\ntick 3\n", p
    assert p.stderr == "done\n", p
    # Attaching again replays the buffered output; --no-replay skips it.
    p = hutch(sock, "attach", sid, cid)
    assert p.returncode == 6 and p.stdout == "tick 1\ntick 2\ntick 3\n", p
    p = hutch(sock, "attach", "--no-replay", sid, cid)
    assert p.returncode == 6 and p.stdout == "", p


def test_attach_json_prints_events(sock, sid):
    cid, _ = start_detached(sock, sid, "sh", "-c", "echo hi")
    p = hutch(sock, "attach", "--json", sid, cid)
    assert p.returncode == 0, p
    events = [json.loads(l) for l in p.stdout.splitlines()]
    types = [e["type"] for e in events if e["type"] != "keepalive"]
    assert types[0] == "attached" and types[-1] == "exit", events
    assert {"type": "stdout", "data": "aGkK"} in events, events


def test_detach_json(sock, sid):
    p = hutch(sock, "exec", "-d", "--json", sid, "--", "true")
    assert p.returncode == 0, p
    v = json.loads(p.stdout)
    assert CMD_ID.match(v["id"]) and v["attach_token"], v


def test_ps_lists_commands(sock, sid):
    cid, _ = start_detached(sock, sid, "sleep", "60", tag="sleeper")
    try:
        p = hutch(sock, "ps", sid)
        assert p.returncode == 0, p
        lines = p.stdout.splitlines()
        assert lines[0].split() == ["ID", "PID", "STATE", "EXIT", "TAG", "STARTED", "COMMAND"], p
        row = [l for l in lines if l.startswith(cid)]
        assert len(row) == 1, p
        cells = row[0].split()
        assert cells[2] == "running" and cells[3] == "-" and cells[4] == "sleeper", row
        assert row[0].endswith("sleep 60"), row
        v = json.loads(hutch(sock, "ps", "--json", sid).stdout)
        mine = [c for c in v["commands"] if c["id"] == cid]
        assert mine and mine[0]["tag"] == "sleeper" and mine[0]["state"] == "running", v
    finally:
        hutch(sock, "kill", "-s", "KILL", sid, cid)


def test_kill(sock, sid):
    cid, _ = start_detached(sock, sid, "sleep", "60")
    p = hutch(sock, "kill", sid, cid)
    assert p.returncode == 0 and p.stdout == "", p
    p = hutch(sock, "attach", sid, cid, timeout=30)
    assert p.returncode == 128 + 15, p
    p = hutch(sock, "ps", sid)
    row = [l for l in p.stdout.splitlines() if l.startswith(cid)]
    assert row and row[0].split()[2:5] == ["exited", "sig", "15"], p
    # A finished command cannot be signalled.
    p = hutch(sock, "kill", "-s", "KILL", sid, cid)
    assert p.returncode == 1 and "409" in p.stderr, p


def test_kill_with_a_signal_number_and_a_trap(sock, sid):
    cid, _ = start_detached(sock, sid, "sh", "-c", "trap 'echo got-usr1; exit 9' USR1; "
                            "while :; do sleep 0.1; done")
    time.sleep(0.5)  # let the trap be set
    p = hutch(sock, "kill", "-s", str(signal.SIGUSR1.value), sid, cid)
    assert p.returncode == 0, p
    p = hutch(sock, "attach", sid, cid, timeout=30)
    assert p.returncode == 9 and "got-usr1" in p.stdout, p


def test_unknown_command_and_bad_signal(sock, sid):
    p = hutch(sock, "attach", sid, "cmd_doesnotexist")
    assert p.returncode == 1 and "not found" in p.stderr, p
    p = hutch(sock, "kill", sid, "cmd_doesnotexist")
    assert p.returncode == 1 and p.stderr.strip(), p
    cid, _ = start_detached(sock, sid, "sleep", "60")
    try:
        p = hutch(sock, "kill", "-s", "NOSUCHSIGNAL", sid, cid)
        assert p.returncode == 1 and "400" in p.stderr, p
    finally:
        hutch(sock, "kill", "-s", "KILL", sid, cid)
    p = hutch(sock, "ps", "sb_doesnotexist0000")
    assert p.returncode == 1, p


def test_exec_ctrl_c_is_forwarded_without_a_tty(sock, sid):
    proc = subprocess.Popen(hutch_argv(sock, "exec", sid, "--", "sh", "-c",
                                       "trap 'echo got-int; exit 7' INT; echo ready; "
                                       "while :; do sleep 0.1; done"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=clean_env())
    try:
        r, _, _ = select.select([proc.stdout], [], [], 30)
        assert r and proc.stdout.readline() == b"ready\n"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 7 and out == b"got-int\n", (out, err)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_attach_token_over_tcp(start_hutchd):
    """The attach token printed by `exec -d` opens that command's stream over
    TCP in place of the API key, and nothing else."""
    d = start_hutchd(listen="127.0.0.1:%d" % hostutil.free_port())
    p = hutch(d.socket, "admin", "key", "create", "--name", "cli")
    assert p.returncode == 0, p
    key = p.stdout.strip()
    sb = d.client().create_ok()
    tcp = [binary("hutch"), "--url", d.url, "--api-key"]
    run = lambda *a: subprocess.run(list(a), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    stdin=subprocess.DEVNULL, env=clean_env(), timeout=60,
                                    universal_newlines=True)
    p = run(*tcp, key, "exec", "-d", sb["id"], "--", "sh", "-c", "echo over-tcp; exit 4")
    assert p.returncode == 0, p
    cid, token = p.stdout.split()
    p = run(*tcp, token, "attach", sb["id"], cid)
    assert p.returncode == 4 and p.stdout == "over-tcp\n", p
    p = run(*tcp, token, "ps", sb["id"])
    assert p.returncode == 1 and "401" in p.stderr, p
    p = run(*tcp, key, "exec", sb["id"], "--", "echo", "streamed")
    assert p.returncode == 0 and p.stdout == "streamed\n", p


# -- cp -----------------------------------------------------------------------------


def test_cp_file_both_ways(sock, sid, api, tmp_path):
    src = tmp_path / "data.bin"
    data = os.urandom(5 * 1024 * 1024 + 3)
    src.write_bytes(data)
    os.chmod(src, 0o750)
    p = hutch(sock, "cp", str(src), "%s:/root/cp1/deeper/data.bin" % sid)
    assert p.returncode == 0, p
    out = sh(api, sid, "sha256sum /root/cp1/deeper/data.bin; stat -c %a /root/cp1/deeper/data.bin")
    assert out.split()[0] == hashlib.sha256(data).hexdigest(), out
    assert out.split()[2] == "750", out

    back = tmp_path / "back.bin"
    p = hutch(sock, "cp", "%s:/root/cp1/deeper/data.bin" % sid, str(back))
    assert p.returncode == 0, p
    assert back.read_bytes() == data
    assert not [n for n in os.listdir(tmp_path) if ".hutch-" in n], "temporary file left behind"


def test_cp_into_existing_directories(sock, sid, api, tmp_path):
    src = tmp_path / "note.txt"
    src.write_text("into a directory\n")
    sh(api, sid, "mkdir -p /root/cp2")
    p = hutch(sock, "cp", str(src), "%s:/root/cp2" % sid)
    assert p.returncode == 0, p
    assert sh(api, sid, "cat /root/cp2/note.txt") == "into a directory\n"
    # Relative sandbox paths are relative to /root.
    p = hutch(sock, "cp", str(src), "%s:cp2/rel.txt" % sid)
    assert p.returncode == 0, p
    assert sh(api, sid, "cat /root/cp2/rel.txt") == "into a directory\n"

    dest = tmp_path / "down"
    dest.mkdir()
    p = hutch(sock, "cp", "%s:/root/cp2/note.txt" % sid, str(dest))
    assert p.returncode == 0, p
    assert (dest / "note.txt").read_text() == "into a directory\n"


def make_tree(root):
    (root / "sub" / "deep").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "top.txt").write_text("top\n")
    (root / "sub" / "run.sh").write_bytes(b"#!/bin/sh\necho run\n")
    os.chmod(root / "sub" / "run.sh", 0o755)
    (root / "sub" / "deep" / "blob").write_bytes(os.urandom(300000))
    (root / "sub" / "deep" / "zero").write_bytes(b"")
    os.symlink("../top.txt", root / "sub" / "link")


def tree(root):
    """{relative path: (kind, mode bits, content or link target)}"""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", None, os.readlink(full))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", None, None)
            else:
                with open(full, "rb") as f:
                    out[rel] = ("file", stat.S_IMODE(st.st_mode) & 0o111, f.read())
    return out


def test_cp_directory_both_ways(sock, sid, api, tmp_path):
    src = tmp_path / "tree"
    make_tree(src)
    p = hutch(sock, "cp", str(src), "%s:/root/cp3" % sid)  # /root/cp3 does not exist yet
    assert p.returncode == 0, p
    listing = sh(api, sid, "cd /root/cp3 && find . | sort")
    assert listing.split() == sorted(["."] + ["./" + k for k in tree(src)]), listing
    assert sh(api, sid, "/root/cp3/sub/run.sh") == "run\n"
    assert sh(api, sid, "readlink /root/cp3/sub/link") == "../top.txt\n"

    # Into an existing directory: lands under the source's name.
    p = hutch(sock, "cp", str(src), "%s:/root/cp3" % sid)
    assert p.returncode == 0, p
    assert sh(api, sid, "cat /root/cp3/tree/top.txt") == "top\n"

    down = tmp_path / "down"
    p = hutch(sock, "cp", "%s:/root/cp3/tree" % sid, str(down))  # does not exist: becomes it
    assert p.returncode == 0, p
    assert tree(down) == tree(src)

    into = tmp_path / "into"
    into.mkdir()
    p = hutch(sock, "cp", "%s:/root/cp3/tree" % sid, str(into))  # exists: goes inside
    assert p.returncode == 0, p
    assert tree(into / "tree") == tree(src)

    contents = tmp_path / "contents"
    contents.mkdir()
    p = hutch(sock, "cp", "%s:/root/cp3/tree/." % sid, str(contents))  # dir/. : the contents
    assert p.returncode == 0, p
    assert tree(contents) == tree(src)


def test_cp_stdin_and_stdout(sock, sid, api):
    data = os.urandom(200000)
    p = hutch(sock, "cp", "-", "%s:/root/cp4/from-stdin" % sid, input=data, text=False)
    assert p.returncode == 0, p
    p = hutch(sock, "cp", "%s:/root/cp4/from-stdin" % sid, "-", text=False)
    assert p.returncode == 0 and p.stdout == data, p.stderr
    # A directory to stdout is a tar stream.
    sh(api, sid, "mkdir -p /root/cp4/d/e && echo inner > /root/cp4/d/e/f")
    p = hutch(sock, "cp", "%s:/root/cp4/d" % sid, "-", text=False)
    assert p.returncode == 0, p.stderr
    with tarfile.open(fileobj=io.BytesIO(p.stdout)) as t:
        names = {os.path.normpath(n) for n in t.getnames()}
        assert "e/f" in names, names
        member = [m for m in t.getmembers() if os.path.normpath(m.name) == "e/f"][0]
        assert t.extractfile(member).read() == b"inner\n"


def test_cp_errors(sock, sid, tmp_path):
    p = hutch(sock, "cp", "%s:/root/no/such/file" % sid, str(tmp_path / "x"))
    assert p.returncode == 1 and "no such file" in p.stderr.lower(), p
    assert not os.path.exists(tmp_path / "x")
    p = hutch(sock, "cp", str(tmp_path / "missing"), "%s:/root/x" % sid)
    assert p.returncode == 1 and "missing" in p.stderr, p
    p = hutch(sock, "cp", "a", "b")
    assert p.returncode == 2, p
    p = hutch(sock, "cp", "sb_doesnotexist0000:/x", str(tmp_path / "y"))
    assert p.returncode == 1 and "sandbox" in p.stderr.lower(), p
    p = hutch(sock, "cp", str(tmp_path / "missing"), "sb_doesnotexist0000:/x")
    assert p.returncode == 1, p
    f0 = tmp_path / "f0"
    f0.write_text("x")
    p = hutch(sock, "cp", str(f0), "sb_doesnotexist0000:/x")
    assert p.returncode == 1 and "sandbox" in p.stderr.lower(), p
    # A file where a directory is needed in the sandbox.
    f = tmp_path / "f"
    f.write_text("f\n")
    p = hutch(sock, "cp", str(f), "%s:/etc/hostname/child" % sid)
    assert p.returncode == 1 and p.stderr.strip(), p


# -- timeout, metrics ---------------------------------------------------------------


def test_timeout_and_metrics(sock, make_sandbox):
    sb = make_sandbox()
    t0 = time.time()
    p = hutch(sock, "timeout", sb["id"], "600")
    assert p.returncode == 0, p
    exp = time.mktime(time.strptime(p.stdout.strip()[:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
    assert t0 + 590 < exp < t0 + 620, p
    p = hutch(sock, "timeout", "--json", sb["id"], "700")
    assert p.returncode == 0 and json.loads(p.stdout)["id"] == sb["id"], p
    p = hutch(sock, "timeout", sb["id"], "0")
    assert p.returncode == 1 and "400" in p.stderr, p
    p = hutch(sock, "timeout", sb["id"], "soon")
    assert p.returncode == 2, p

    p = hutch(sock, "metrics", sb["id"])
    assert p.returncode == 0, p
    keys = {l.split(":")[0] for l in p.stdout.splitlines()}
    assert {"cpu_usage_usec", "memory_bytes", "pids"} <= keys, p
    v = json.loads(hutch(sock, "metrics", "--json", sb["id"]).stdout)
    assert isinstance(v["memory_bytes"], int) and v["pids"] >= 1, v
