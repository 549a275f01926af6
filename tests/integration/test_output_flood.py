"""Memory stays flat under load (issue: "Output floods keep hutchd's and the
shim's memory flat"; "A 1 GiB file goes up and down streamed, with host
memory flat"):

- a background command (started with POST …/commands, nobody attached)
  floods stdout for FLOOD_SECONDS while the resident set of hutchd and of
  the sandbox's hutch-shim is sampled every 0.5 s (and their peak, VmHWM,
  is reset before and read after); a late attach then still works and
  reports the bytes the ring dropped;
- a BIG_FILE_BYTES file is uploaded (generated on the fly, sent chunked)
  and downloaded (read in 1 MiB pieces) through the Files API, hashed on
  both sides, while hutchd's, the shim's and hutch-init's peak memory is
  measured.

HUTCH_BIG_TESTS=0 skips the big file.  HUTCH_BIG_FILE_MIB overrides its
size (default 1024: on the 2-core development VM the round trip of 1 GiB
takes about 10 s, see the printed throughput)."""

import hashlib
import os
import struct
import threading
import time

import pytest

import hostutil

MiB = 1 << 20
FLOOD_SECONDS = 20
FLOOD_MAX_GROWTH = 32 * MiB
BIG_FILE_BYTES = int(os.environ.get("HUTCH_BIG_FILE_MIB", "1024")) * MiB
BIG_MAX_GROWTH = 64 * MiB


def _status_kib(pid, field):
    st = hostutil.read_file("/proc/%d/status" % pid)
    if st is None:
        return None
    for line in st.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return None


def rss(pid):
    k = _status_kib(pid, "VmRSS")
    return None if k is None else k * 1024


class MemWatch:
    """Samples VmRSS of some processes every `interval` seconds in a thread;
    resets their VmHWM at the start (clear_refs 5) so that the peak read at
    the end covers spikes between samples too."""

    def __init__(self, pids, interval=0.5):
        self.pids = dict(pids)  # name -> pid
        self.interval = interval
        self.samples = {n: [] for n in self.pids}
        self.hwm_reset = {}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def start(self):
        for n, pid in self.pids.items():
            try:
                with open("/proc/%d/clear_refs" % pid, "w") as f:
                    f.write("5")
                self.hwm_reset[n] = True
            except OSError:
                self.hwm_reset[n] = False
        self.base = {n: rss(pid) for n, pid in self.pids.items()}
        for n, v in self.base.items():
            assert v is not None, "process %s (%d) is gone" % (n, self.pids[n])
        self._t.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            for n, pid in self.pids.items():
                v = rss(pid)
                if v is not None:
                    self.samples[n].append(v)
            self._stop.wait(self.interval)

    def stop(self):
        self._stop.set()
        self._t.join(10)
        self.peak = {}
        for n, pid in self.pids.items():
            p = max(self.samples[n] + [self.base[n]])
            hwm = _status_kib(pid, "VmHWM")
            if self.hwm_reset[n] and hwm is not None:
                p = max(p, hwm * 1024)
            self.peak[n] = p
        return self

    def growth(self, n):
        return self.peak[n] - self.base[n]

    def report(self):
        return ", ".join("%s: base %.1f MiB, peak %.1f MiB (+%.1f), %d samples%s" % (
            n, self.base[n] / MiB, self.peak[n] / MiB, self.growth(n) / MiB, len(self.samples[n]),
            "" if self.hwm_reset[n] else ", no VmHWM reset") for n in self.pids)


def test_output_flood_keeps_memory_flat(api, hutchd, make_sandbox, leaks):
    before = leaks.snapshot(hutchd)
    sb = make_sandbox()
    sid = sb["id"]
    shim = sb["host"]["shim_pid"]
    # Warm the code paths once (first command, first attach) before the baseline.
    w = api.start_command_ok(sid, argv=["echo", "warm"])
    assert api.attach_all(sid, w["id"]).stdout == b"warm\n"
    watch = MemWatch({"hutchd": hutchd.pid, "shim": shim}).start()
    line = b"hutch-flood-0123456789\n"
    s = api.start_command_ok(sid, argv=["yes", line[:-1].decode()], timeout_s=FLOOD_SECONDS + 60, tag="flood")
    t0 = time.monotonic()
    slowest_health = 0.0
    try:
        while time.monotonic() - t0 < FLOOD_SECONDS:
            h0 = time.monotonic()
            assert api.healthz(timeout=10).status == 200
            slowest_health = max(slowest_health, time.monotonic() - h0)
            time.sleep(0.5)
        g = api.command(sid, s["id"])
        assert g.status == 200 and g.json["state"] == "running", g
        produced = g.json["output_bytes"]["stdout"]
        elapsed = time.monotonic() - t0
    finally:
        watch.stop()
    print("\nflood: %.1f GiB in %.1fs (%.0f MiB/s); slowest /healthz %.2fs; %s" % (
        produced / (1 << 30), elapsed, produced / MiB / elapsed, slowest_health, watch.report()))
    assert produced > 64 * MiB, "the flood produced only %d bytes" % produced
    assert slowest_health < 5, "hutchd stalled during the flood (%.1fs for /healthz)" % slowest_health
    for n in ("hutchd", "shim"):
        assert watch.growth(n) < FLOOD_MAX_GROWTH, "%s grew under the flood: %s" % (n, watch.report())
    # A late attach: the ring's tail, the count of what it lost, then live output.
    a = api.attach(sid, s["id"])
    try:
        assert a.status == 200, a.error_resp()
        a.read_until(lambda r: len(r.stdout) >= 256 * 1024, 30)
        res = a.result
        assert res.attached is not None and res.events[0]["type"] == "attached", res.events[:1]
        dropped = res.dropped["stdout"]
        assert dropped > 0, res.attached
        assert res.dropped["stderr"] == 0, res.attached
        # Whole lines after the first cut one.
        body = res.stdout[res.stdout.index(b"\n") + 1:]
        body = body[:body.rindex(b"\n") + 1]
        assert body == line * (len(body) // len(line)), "flood output garbled"
        r = api.command_signal(sid, s["id"], "KILL")
        assert r.status == 200, r
        # The stream ends with the exit after the ring drains (bounded).
        deadline = time.monotonic() + 60
        while a.result.exit is None:
            assert time.monotonic() < deadline, "no exit event within 60 s of KILL"
            ev = a.next_event(timeout=30)
            assert ev is not None, "attach ended without exit: %r" % (a.result,)
        assert a.result.exit["signal"] == 9, a.result.exit
    finally:
        a.close()
    print("late attach: dropped %.1f GiB, then %d bytes received" % (dropped / (1 << 30), len(a.result.stdout)))
    g = api.command(sid, s["id"]).json
    assert g["state"] == "exited" and g["dropped"]["stdout"] >= dropped, g
    api.delete_ok(sid)
    leaks.assert_same(before, hutchd)


def _chunks(total, block, hasher, chunk=MiB):
    """`total` bytes: `block` with the chunk number in its first 8 bytes."""
    i = 0
    left = total
    while left > 0:
        n = min(chunk, left)
        c = struct.pack("<Q", i) + block[8:n] if n >= 8 else block[:n]
        hasher.update(c)
        yield c
        i += 1
        left -= n


@pytest.mark.skipif(os.environ.get("HUTCH_BIG_TESTS") == "0", reason="HUTCH_BIG_TESTS=0")
def test_big_file_up_and_down_with_flat_memory(api, hutchd, make_sandbox):
    sb = make_sandbox()
    sid = sb["id"]
    pids = {"hutchd": hutchd.pid, "shim": sb["host"]["shim_pid"], "init": sb["host"]["init_pid"]}
    # Warm the file path once.
    assert api.files_put(sid, "/root/warm", b"w" * MiB).status == 201
    assert len(api.files_get(sid, "/root/warm").raw) == MiB
    block = os.urandom(MiB)
    up_hash = hashlib.sha256()
    watch = MemWatch(pids).start()
    try:
        t0 = time.monotonic()
        r = api.files_put(sid, "/root/big.bin", _chunks(BIG_FILE_BYTES, block, up_hash),
                          timeout=max(120, BIG_FILE_BYTES / MiB))
        up_s = time.monotonic() - t0
        assert r.status == 201, r
        assert r.json == {"path": "/root/big.bin", "size": BIG_FILE_BYTES}, r
        st = api.files_stat(sid, "/root/big.bin")
        assert st.json["size"] == BIG_FILE_BYTES, st
        down_hash = hashlib.sha256()
        got = 0
        t1 = time.monotonic()
        conn, resp = api.open_stream("GET", api.files_path(sid, path="/root/big.bin"),
                                     timeout=max(120, BIG_FILE_BYTES / MiB))
        try:
            assert resp.status == 200, (resp.status, resp.read(2000))
            assert resp.getheader("Content-Length") == str(BIG_FILE_BYTES), resp.getheaders()
            while True:
                c = resp.read(MiB)
                if not c:
                    break
                down_hash.update(c)
                got += len(c)
        finally:
            conn.close()
        down_s = time.monotonic() - t1
    finally:
        watch.stop()
    print("\nbig file: %d MiB up in %.1fs (%.0f MiB/s), down in %.1fs (%.0f MiB/s); %s" % (
        BIG_FILE_BYTES // MiB, up_s, BIG_FILE_BYTES / MiB / up_s, down_s, BIG_FILE_BYTES / MiB / down_s,
        watch.report()))
    assert got == BIG_FILE_BYTES, "downloaded %d of %d bytes" % (got, BIG_FILE_BYTES)
    assert down_hash.hexdigest() == up_hash.hexdigest(), "the downloaded file differs from the upload"
    for n in pids:
        assert watch.growth(n) < BIG_MAX_GROWTH, "%s grew during the transfer: %s" % (n, watch.report())
    assert api.files_delete(sid, "/root/big.bin").status == 204
