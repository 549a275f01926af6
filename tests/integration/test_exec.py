"""POST /v1/sandboxes/{id}/exec: output, exit status, signals, streams,
shell form, env, cwd, timeout, output cap, stdin, start failures."""

import os
import threading
import time

import hostutil


def run(api, sb, argv=None, cmd=None, **kw):
    return api.exec_ok(sb["id"], argv=argv, cmd=cmd, **kw)


def test_python_prints_42(api, sandbox):
    r = run(api, sandbox, ["python3", "-c", "print(6*7)"])
    assert r["stdout"] == "42\n", r
    assert r["stderr"] == "", r
    assert r["exit_code"] == 0 and r["signal"] is None, r
    assert r["timed_out"] is False and r["truncated"] is False, r
    assert isinstance(r["duration_ms"], int) and 0 <= r["duration_ms"] < 30000, r


def test_uname(api, sandbox):
    r = run(api, sandbox, ["uname", "-a"])
    assert r["exit_code"] == 0, r
    fields = r["stdout"].split()
    assert fields[0] == "Linux", r
    # Native runtime: same kernel as the host, but its own hostname.
    assert os.uname().release in fields, r
    assert fields[1] != os.uname().nodename, r


def test_exit_code_propagates(api, sandbox):
    for code in (0, 1, 3, 42, 255):
        r = run(api, sandbox, ["sh", "-c", "exit %d" % code])
        assert r["exit_code"] == code and r["signal"] is None, (code, r)
    r = run(api, sandbox, ["false"])
    assert r["exit_code"] == 1, r


def test_signal_term_propagates(api, sandbox):
    r = run(api, sandbox, ["sh", "-c", "kill -TERM $$"])
    assert r["exit_code"] is None, r
    assert r["signal"] == 15, r
    assert r["timed_out"] is False, r


def test_signal_kill_propagates(api, sandbox):
    r = run(api, sandbox, ["sh", "-c", "kill -9 $$"])
    assert r["exit_code"] is None, r
    assert r["signal"] == 9, r


def test_stdout_and_stderr_stay_apart(api, sandbox):
    r = run(api, sandbox, ["sh", "-c", "echo out; echo err >&2; echo out2; echo err2 >&2"])
    assert r["stdout"] == "out\nout2\n", r
    assert r["stderr"] == "err\nerr2\n", r
    # Larger, interleaved writes.
    prog = ("import sys\n"
            "for i in range(2000):\n"
            "    sys.stdout.write('o%d\\n' % i); sys.stdout.flush()\n"
            "    sys.stderr.write('e%d\\n' % i); sys.stderr.flush()\n")
    r = run(api, sandbox, ["python3", "-c", prog])
    assert r["exit_code"] == 0, r
    assert r["stdout"] == "".join("o%d\n" % i for i in range(2000))
    assert r["stderr"] == "".join("e%d\n" % i for i in range(2000))


def test_cmd_string_is_run_by_sh(api, sandbox):
    r = run(api, sandbox, cmd="echo hello | tr a-z A-Z; pwd; exit 4")
    assert r["stdout"] == "HELLO\n/root\n", r
    assert r["exit_code"] == 4, r
    r = run(api, sandbox, cmd="echo $HOME")
    assert r["stdout"] == "/root\n", r


def test_argv_is_not_shell_interpreted(api, sandbox):
    r = run(api, sandbox, ["echo", "$HOME", "a;b", "*"])
    assert r["stdout"] == "$HOME a;b *\n", r


def test_runs_as_root_in_root(api, sandbox):
    r = run(api, sandbox, ["sh", "-c", "id -u; id -g; pwd"])
    assert r["stdout"] == "0\n0\n/root\n", r


def test_env_and_cwd(api, sandbox):
    r = run(api, sandbox, ["sh", "-c", 'echo "$FOO|$BAR"; pwd'], env={"FOO": "bar", "BAR": "a b=c"},
            cwd="/tmp")
    assert r["stdout"] == "bar|a b=c\n/tmp\n", r
    r = run(api, sandbox, ["pwd"], cwd="/usr/bin")
    assert r["stdout"] == "/usr/bin\n", r
    # A request's env does not stick to later commands.
    r = run(api, sandbox, ["sh", "-c", 'echo "[$FOO]"'])
    assert r["stdout"] == "[]\n", r


def test_cwd_that_does_not_exist_is_reported(api, sandbox):
    r = api.exec(sandbox["id"], argv=["pwd"], cwd="/no/such/dir")
    # Either a 4xx naming cwd or a start failure reported in the result; never success.
    if r.status == 200:
        assert r.json["exit_code"] != 0, r
        assert "/no/such/dir" in (r.json.get("error") or "") + r.json["stderr"], r
    else:
        assert 400 <= r.status < 500, r


def test_timeout_kills_the_process_group(api, sandbox, hutchd):
    t0 = time.monotonic()
    r = run(api, sandbox, ["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $! > /tmp/bg.pid; sleep 30"],
            timeout_s=1)
    elapsed = time.monotonic() - t0
    assert r["timed_out"] is True, r
    assert elapsed < 10, "exec with timeout_s=1 took %.1fs" % elapsed
    assert r["exit_code"] != 0, r
    assert r["duration_ms"] >= 900, r
    # The whole process group is gone: the backgrounded sleep too.
    check = "kill -0 $(cat /tmp/bg.pid) 2>/dev/null && echo alive || echo gone"
    out = hostutil.wait_until(lambda: run(api, sandbox, ["sh", "-c", check])["stdout"] == "gone\n", 5)
    assert out, "the timed-out command's background child survived"
    # And from the host: no sleep left in the sandbox's cgroup.
    cg = hostutil.sandbox_cgroup_dir(hutchd.instance, sandbox["id"], "pids", hutchd.health["cgroup"])
    names = [(hostutil.proc_cmdline(p) or ["?"])[0] for p in hostutil.cgroup_procs(cg)]
    assert not [n for n in names if n.endswith("sleep")], names


def test_output_cap_truncates(api, sandbox):
    r = run(api, sandbox, ["python3", "-c", "import sys; sys.stdout.write('x'*100000); "
                                            "sys.stderr.write('y'*50000)"],
            max_output_bytes=1000)
    assert r["truncated"] is True, r
    assert r["stdout"] == "x" * 1000, len(r["stdout"])
    assert r["stderr"] == "y" * 1000, len(r["stderr"])
    # Output beyond the cap is read and dropped: the writer was not blocked.
    assert r["exit_code"] == 0 and r["timed_out"] is False, r


def test_output_exactly_at_cap_is_not_truncated(api, sandbox):
    r = run(api, sandbox, ["python3", "-c", "import sys; sys.stdout.write('x'*1000)"],
            max_output_bytes=1000)
    assert r["stdout"] == "x" * 1000
    assert r["truncated"] is False, r


def test_large_output_below_default_cap_is_complete(api, sandbox):
    r = run(api, sandbox, ["python3", "-c", "import sys\nfor i in range(50000): print(i)"])
    assert r["truncated"] is False
    assert r["stdout"] == "".join("%d\n" % i for i in range(50000))


def test_stdin(api, sandbox):
    r = run(api, sandbox, ["cat"], stdin="hello\nworld")
    assert r["stdout"] == "hello\nworld", r
    r = run(api, sandbox, ["python3", "-c", "import sys; print(sum(int(x) for x in sys.stdin))"],
            stdin="1\n2\n3\n")
    assert r["stdout"] == "6\n", r


def test_no_stdin_means_eof(api, sandbox):
    t0 = time.monotonic()
    r = run(api, sandbox, ["cat"], timeout_s=10)
    assert r["timed_out"] is False, "cat without stdin must see EOF, not hang: %r" % (r,)
    assert r["stdout"] == "" and r["exit_code"] == 0, r
    assert time.monotonic() - t0 < 9


def test_program_not_found(api, sandbox):
    r = run(api, sandbox, ["no-such-program-xyz", "arg"])
    assert r["exit_code"] == 127, r
    assert r["signal"] is None, r
    assert "no-such-program-xyz" in r["error"], r


def test_program_not_executable(api, sandbox):
    run(api, sandbox, ["sh", "-c", "printf 'echo hi\\n' > /tmp/noexec; chmod 644 /tmp/noexec"])
    r = run(api, sandbox, ["/tmp/noexec"])
    assert r["exit_code"] == 126, r
    assert "/tmp/noexec" in r["error"], r


def test_invalid_utf8_is_replaced(api, sandbox):
    r = run(api, sandbox, ["printf", "a\\377b"])
    assert r["stdout"] == "a\ufffdb", r


def test_files_persist_between_execs(api, sandbox):
    run(api, sandbox, ["sh", "-c", "echo data > /root/persist.txt"])
    r = run(api, sandbox, ["cat", "/root/persist.txt"])
    assert r["stdout"] == "data\n", r


def test_long_exec_does_not_block_the_api(api, sandbox):
    result = {}

    def slow():
        result["r"] = api.exec(sandbox["id"], argv=["sleep", "3"])

    t = threading.Thread(target=slow)
    t.start()
    try:
        time.sleep(0.5)
        t0 = time.monotonic()
        h = api.healthz(timeout=5)
        assert h.status == 200
        g = api.get(sandbox["id"])
        assert g.status == 200
        assert time.monotonic() - t0 < 1.5, "API blocked behind a running exec"
        # A second exec in the same sandbox runs concurrently.
        t1 = time.monotonic()
        r2 = api.exec_ok(sandbox["id"], argv=["echo", "concurrent"])
        assert r2["stdout"] == "concurrent\n"
        assert time.monotonic() - t1 < 2.0, "exec serialized behind another exec"
    finally:
        t.join(30)
    assert result["r"].status == 200 and result["r"].json["exit_code"] == 0, result
