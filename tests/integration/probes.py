"""Python snippets run both inside a sandbox (through exec) and on the host
(the positive control), so that the same bytes make the same call."""

import json
import os
import subprocess

# Prefix of every snippet that could harm the machine if it ran outside a
# sandbox (mount over /tmp, umount, pivot_root, a fork bomb, kill): when
# HUTCH_PROBE_HOST_NS names the host's pid and mount namespaces and the
# snippet finds itself in either of them, it refuses and exits 99.  So a
# hutchd whose exec is not isolated fails these tests instead of damaging
# the host.  Positive controls on the host run without the variable.
GUARD = r'''
import os as _os, sys as _sys
_h = _os.environ.get("HUTCH_PROBE_HOST_NS", "")
if _h:
    _p, _m = _h.split(":")
    if (str(_os.stat("/proc/self/ns/pid").st_ino) == _p
            or str(_os.stat("/proc/self/ns/mnt").st_ino) == _m):
        print("NOT-ISOLATED: refusing to run in the host's namespaces", flush=True)
        _sys.exit(99)
'''
NOT_ISOLATED_EXIT = 99


def host_ns():
    return "%d:%d" % (os.stat("/proc/self/ns/pid").st_ino, os.stat("/proc/self/ns/mnt").st_ino)


def guard_env():
    """env for an exec that runs a guarded snippet inside a sandbox."""
    return {"HUTCH_PROBE_HOST_NS": host_ns()}


def shell_guard():
    """The same guard for a shell command line (prefix it)."""
    p, m = host_ns().split(":")
    return ('[ "$(stat -L -c %%i /proc/self/ns/pid)" != %s ] && '
            '[ "$(stat -L -c %%i /proc/self/ns/mnt)" != %s ] || '
            '{ echo NOT-ISOLATED; exit 99; }; ' % (p, m))

# argv[1] = syscall name, argv[2:] = paths.  Prints {"ret":…, "errno":…, "name":…}.
# x86_64 syscall numbers.
SYSCALL_PROBE = GUARD + r'''
import ctypes, errno, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = dict(mount=165, umount2=166, unshare=272, init_module=175, finit_module=313,
          keyctl=250, add_key=248, bpf=321, io_uring_setup=425, setns=308,
          pivot_root=155, perf_event_open=298, userfaultfd=323)
def sc(n, *a):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(NR[n]), *a)
    return r, ctypes.get_errno()
b = lambda s: ctypes.c_char_p(s.encode())
name, args = sys.argv[1], sys.argv[2:]
if name == "mount":          # mount("none", path, "tmpfs", 0, NULL)
    os.makedirs(args[0], exist_ok=True)
    r, e = sc(name, b("none"), b(args[0]), b("tmpfs"), ctypes.c_ulong(0), ctypes.c_void_p(0))
elif name == "umount2":      # umount2(path, MNT_DETACH)
    r, e = sc(name, b(args[0]), ctypes.c_int(2))
elif name == "unshare":      # unshare(CLONE_NEWUSER)
    r, e = sc(name, ctypes.c_int(0x10000000))
elif name == "unshare_ns":   # unshare(CLONE_NEWNS|CLONE_NEWNET|CLONE_NEWUTS)
    r, e = sc("unshare", ctypes.c_int(0x00020000 | 0x40000000 | 0x04000000))
elif name == "init_module":  # a 64-byte non-ELF image: at worst ENOEXEC, nothing loads
    buf = ctypes.create_string_buffer(64)
    r, e = sc(name, buf, ctypes.c_ulong(64), b(""))
elif name == "finit_module": # finit_module(open("/dev/null"), "", 0)
    fd = os.open("/dev/null", os.O_RDONLY)
    r, e = sc(name, ctypes.c_int(fd), b(""), ctypes.c_int(0))
elif name == "keyctl":       # keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, create)
    r, e = sc(name, ctypes.c_int(0), ctypes.c_int(-3), ctypes.c_int(1))
elif name == "add_key":      # add_key("user", …, KEY_SPEC_PROCESS_KEYRING)
    r, e = sc(name, b("user"), b("hutch-probe"), b("x"), ctypes.c_size_t(1), ctypes.c_int(-2))
elif name == "bpf":          # BPF_MAP_CREATE array, key 4, value 4, 1 entry
    attr = (ctypes.c_uint32 * 32)(2, 4, 4, 1)
    r, e = sc(name, ctypes.c_int(0), attr, ctypes.c_uint(128))
elif name == "io_uring_setup":
    params = ctypes.create_string_buffer(120)
    r, e = sc(name, ctypes.c_uint(4), params)
elif name == "setns":        # setns(open("/proc/self/ns/uts"), 0): into its own namespace
    fd = os.open("/proc/self/ns/uts", os.O_RDONLY)
    r, e = sc(name, ctypes.c_int(fd), ctypes.c_int(0))
elif name == "pivot_root":   # pivot_root(path, path)
    r, e = sc(name, b(args[0]), b(args[1]))
elif name == "perf_event_open":  # software cpu-clock, this thread, user only
    attr = ctypes.create_string_buffer(128)
    ctypes.c_uint32.from_buffer(attr, 0).value = 1
    ctypes.c_uint32.from_buffer(attr, 4).value = 128
    ctypes.c_uint64.from_buffer(attr, 40).value = 1 | (1 << 5) | (1 << 6)
    r, e = sc(name, attr, ctypes.c_int(0), ctypes.c_int(-1), ctypes.c_int(-1), ctypes.c_ulong(0))
elif name == "userfaultfd":
    r, e = sc(name, ctypes.c_int(0o2000000))
else:
    raise SystemExit("unknown probe " + name)
print(json.dumps({"ret": r, "errno": e, "name": errno.errorcode.get(e, str(e))}))
'''

# getpid through the i386 ABI (int 0x80, eax=20).  Prints the result and the
# real pid; a seccomp filter that refuses foreign ABIs kills it with SIGSYS.
INT80_PROBE = r'''
import ctypes, mmap, os
code = b"\xb8\x14\x00\x00\x00\xcd\x80\xc3"   # mov eax,20; int 0x80; ret
m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
m.write(code)
f = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))
print(f(), os.getpid())
'''


def parse(stdout):
    return json.loads(stdout.strip().splitlines()[-1])


def run_host(name, args=(), wrapper=(), shell_prefix=None, timeout=30):
    """Run SYSCALL_PROBE on the host (optionally under `wrapper`, e.g.
    ["unshare", "-Umr"], or after `shell_prefix` shell commands run in the
    same wrapper).  Returns (parsed result or None, CompletedProcess)."""
    if shell_prefix:
        script = shell_prefix + ' && exec python3 -c "$0" "$@"'
        cmd = list(wrapper) + ["sh", "-c", script, SYSCALL_PROBE, name] + list(args)
    else:
        cmd = list(wrapper) + ["python3", "-c", SYSCALL_PROBE, name] + list(args)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                       universal_newlines=True)
    try:
        return parse(p.stdout), p
    except (ValueError, IndexError):
        return None, p
