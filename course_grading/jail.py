"""Start one grading kernel with least privilege (run by `course grade` as a script, stdlib only).

    python -I -S jail.py '<spec as JSON>' -- <kernel command ...>

The grader (jupyter_client) launches this script instead of the kernel; it applies the spec, in this
order, and then runs the kernel command:

1. ``cgroup``: join the submission's cgroups (memory and process count of the whole submission: every
   process the kernel starts inherits them); ``chown``: hand the connection file to the sandbox user;
2. ``root`` (root only; the ``user`` level): new mount, PID, network, IPC and UTS namespaces, and in
   them a private filesystem built from the spec's operations on an empty tmpfs: read-only binds of the
   system, the Python installation and the course package, the submission's writable folders, a
   minimal /dev, a /proc of the new PID namespace only; then pivot_root into it. Nothing else of the
   machine exists for the kernel (no repository, no home folders, no other submission, no /run, and
   /tmp, /var/tmp, /dev/shm are the submission's own);
   ``expose`` (root only; the ``bwrap`` level): in a private mount namespace, make the Python
   installation reachable for the sandbox user when it sits in a folder that user cannot enter
   (``/root/.pyenv``), for bubblewrap to bind it;
   ``unshare_net``/``unshare_pid`` (without ``root``): new network namespace (no network; its own
   loopback interface is brought up, as bubblewrap does, so that programs talking to 127.0.0.1, like
   torch.distributed's gloo, work inside it) and new PID namespace, as root directly, otherwise inside
   a new user namespace when the system allows one;
3. ``rlimits``: address space, processes, CPU seconds, file size, open files, no core dumps;
4. drop privileges (``uid``/``gid``, no supplementary groups) when started as root; then a new, empty
   session keyring of the kernel's own, no_new_privs, and a seccomp filter that refuses ``add_key``,
   ``request_key`` and ``keyctl`` (EPERM): the kernel can neither read the grader's session keyring (an
   instructor's login gives one) nor leave a key for the next kernel of the same user;
5. ``cwd`` and a clean environment (``env``: nothing of the grader's is inherited);
6. ``bwrap``: when given, exec bubblewrap with that argument list in front of the kernel command.

With a PID namespace this process stays as the namespace's parent: the kernel is the namespace's init
(when it dies, every process it started dies with it, whatever it did to escape its process group);
this process forwards SIGTERM to it, kills it when it is itself terminated, and exits with the
kernel's status. Every step that is asked for and fails stops the launch (exit status 70, the reason
on stderr and in the ``report`` file): the grader probes what works once, up front, and only asks for
that (`sandbox.probe`).
"""
import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MNT_DETACH = 2
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217, "riscv64": 41}
DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")
FAIL = 70

RLIMITS = {"as": resource.RLIMIT_AS, "nproc": resource.RLIMIT_NPROC, "cpu": resource.RLIMIT_CPU,
           "fsize": resource.RLIMIT_FSIZE, "nofile": resource.RLIMIT_NOFILE, "core": resource.RLIMIT_CORE}

_report = None  # the spec's report file: where a failure is written for the grader


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _die(msg: str) -> None:
    text = f"course grade jail: {msg}\n"
    sys.stderr.write(text)
    sys.stderr.flush()
    if _report:
        try:
            with open(_report, "a") as fh:
                fh.write(text)
        except OSError:
            pass
    os._exit(FAIL)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def unshare(flags: int) -> None:
    _check(_libc().unshare(flags), "unshare")


def _write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def loopback_up() -> None:
    """Bring up ``lo`` in this (new) network namespace: SIOCGIFFLAGS, then SIOCSIFFLAGS with IFF_UP.
    Best effort: a failure is reported on stderr and the kernel starts anyway (without localhost)."""
    import fcntl
    import socket
    import struct
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            ifr = fcntl.ioctl(s, 0x8913, struct.pack("16sH14s", b"lo", 0, b""))     # SIOCGIFFLAGS
            flags = struct.unpack("16sH14s", ifr)[1]
            fcntl.ioctl(s, 0x8914, struct.pack("16sH14s", b"lo", flags | 0x1, b""))  # SIOCSIFFLAGS, IFF_UP
    except OSError as e:
        sys.stderr.write(f"course grade jail: loopback not up in the network namespace: {e}\n")


def enter_namespaces(net: bool, pid: bool, extra: int = 0) -> None:
    flags = (CLONE_NEWNET if net else 0) | (CLONE_NEWPID if pid else 0) | extra
    if not flags:
        return
    if os.geteuid() == 0:
        unshare(flags)
    else:
        uid, gid = os.geteuid(), os.getegid()
        unshare(CLONE_NEWUSER | flags)  # a user namespace lets an unprivileged user make the others
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    if net:
        loopback_up()  # still privileged in the new namespaces (before dropping privileges and exec)


def mount(source, target, flags: int, fstype=None, data=None) -> None:
    enc = (lambda s: s.encode() if s is not None else None)
    _check(_libc().mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           f"mount {source} -> {target}")


def join_cgroups(dirs: list) -> None:
    """Put this process (and so everything it starts) into each cgroup of the submission."""
    for d in dirs:
        _write(os.path.join(d, "cgroup.procs"), str(os.getpid()))


def expose(pairs: list, stage: str) -> None:
    """Root only, in a new mount namespace: make each path P visible to the sandbox user although its
    ancestor A is not traversable (e.g. a Python installed under /root): A is covered by a folder that
    holds only P (bound read-only from the original), so nothing else of A shows."""
    unshare(CLONE_NEWNS)
    mount(None, "/", MS_REC | MS_PRIVATE)
    by_top: dict = {}
    for a, p in pairs:
        by_top.setdefault(a, []).append(p)
    for k, (a, ps) in enumerate(sorted(by_top.items())):
        top = os.path.join(stage, str(k))
        os.makedirs(top, exist_ok=True)
        os.chmod(top, 0o755)
        for p in ps:
            rel = os.path.relpath(p, a)
            d = top
            for part in rel.split(os.sep):
                d = os.path.join(d, part)
                os.makedirs(d, exist_ok=True)
                os.chmod(d, 0o755)
            mount(p, d, MS_BIND | MS_REC)
        mount(top, a, MS_BIND | MS_REC)


# ---------------------------------------------------------------------------------------------------
# the private filesystem of the `user` level

def _makedirs(path: str) -> None:
    """Create `path` and its missing parents, each 0755 (the new root's folders, owned by root)."""
    missing = []
    p = path
    while not os.path.lexists(p):
        missing.append(p)
        p = os.path.dirname(p)
    for d in reversed(missing):
        os.mkdir(d)
        os.chmod(d, 0o755)


def _mountpoint(src: str, target: str) -> None:
    if os.path.isdir(src):
        _makedirs(target)
    else:
        _makedirs(os.path.dirname(target))
        if not os.path.lexists(target):
            with open(target, "w"):
                pass


def _bind(src: str, target: str, readonly: bool) -> None:
    _mountpoint(src, target)
    mount(src, target, MS_BIND | MS_REC)
    # a bind mount takes new flags only on a remount; no set-user-ID programs, no device files
    mount(None, target, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | (MS_RDONLY if readonly else 0))


def build_root(new: str, ops: list) -> None:
    """An empty tmpfs at `new`, then the operations in order (each target is a path inside `new`):
    ["ro"|"ro-try"|"rw", src, dst], ["tmpfs", size_bytes, mode, dst], ["proc", dst], ["dev", dst],
    ["symlink", text, dst] (the target last). A target's parents are made as needed (in what earlier
    operations mounted)."""
    mount("tmpfs", new, MS_NOSUID | MS_NODEV, "tmpfs", "mode=0755,size=8m")
    for op in ops:
        kind, target = op[0], new + op[-1]
        if kind in ("ro", "ro-try", "rw"):
            src = op[1]
            if not os.path.lexists(src):
                if kind == "ro-try":
                    continue
                raise FileNotFoundError(f"{src} (to bind at {op[-1]}) does not exist")
            if kind == "ro-try" and os.path.islink(src):  # /bin -> usr/bin on a merged-/usr system
                _makedirs(os.path.dirname(target))
                os.symlink(os.readlink(src), target)
                continue
            _bind(src, target, readonly=kind != "rw")
        elif kind == "tmpfs":
            _makedirs(target)
            mount("tmpfs", target, MS_NOSUID | MS_NODEV, "tmpfs", f"size={int(op[1])},mode={op[2]}")
        elif kind == "proc":  # after the fork: the PID namespace's own processes only
            _makedirs(target)
            mount("proc", target, MS_NOSUID | MS_NODEV | MS_NOEXEC, "proc")
        elif kind == "dev":
            _makedirs(target)
            mount("tmpfs", target, MS_NOSUID | MS_NOEXEC, "tmpfs", "mode=0755,size=64k")
            for n in DEV_NODES:
                if os.path.exists(f"/dev/{n}"):
                    _mountpoint(f"/dev/{n}", f"{target}/{n}")
                    mount(f"/dev/{n}", f"{target}/{n}", MS_BIND)
            for name, to in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                             ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
                os.symlink(to, f"{target}/{name}")
        elif kind == "symlink":
            _makedirs(os.path.dirname(target))
            os.symlink(op[1], target)
        else:
            raise ValueError(f"unknown root operation {kind!r}")
    mount(None, new, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None)  # the root itself: read-only


def pivot_into(new: str) -> None:
    """Make `new` the root of this mount namespace and drop the old root entirely (pivot_root(".", ".")
    and a lazy unmount of the old root stacked beneath); chroot where pivot_root is not available."""
    os.chdir(new)
    nr = SYS_PIVOT_ROOT.get(os.uname().machine)
    libc = _libc()
    if nr is not None and libc.syscall(nr, b".", b".") == 0:
        _check(libc.umount2(b".", MNT_DETACH), "umount the old root")
    else:  # e.g. a root file system that is the initramfs: pivot_root refuses it
        os.chroot(".")
    os.chdir("/")


# ---------------------------------------------------------------------------------------------------

def set_rlimits(limits: dict) -> None:
    for name, value in limits.items():
        if value is None:
            continue
        which = RLIMITS[name]
        soft, hard = resource.getrlimit(which)
        value = int(value)
        if hard != resource.RLIM_INFINITY and value > hard:
            value = hard
        resource.setrlimit(which, (value, value))


# seccomp: the key-management system calls refused (classic BPF over struct seccomp_data)
SYSCALLS_KEYS = {"x86_64": (0xC000003E, (248, 249, 250)), "aarch64": (0xC00000B7, (217, 218, 219))}
SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}
KEYCTL_JOIN_SESSION_KEYRING = 1
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
SECCOMP_RET_ALLOW, SECCOMP_RET_EPERM = 0x7FFF0000, 0x00050000 | 1
X32_SYSCALL_BIT = 0x40000000


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def keyring_filter(machine: str) -> list[tuple[int, int, int, int]]:
    """The BPF program: another architecture's system calls (a 32-bit binary) and the x32 ABI refused
    whole; add_key, request_key and keyctl refused; everything else allowed."""
    arch, (add_key, request_key, keyctl) = SYSCALLS_KEYS[machine]
    ld_abs, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06
    return [(ld_abs, 0, 0, 4),                     # 0: A = seccomp_data.arch
            (jeq, 1, 0, arch),                     # 1: native? -> 3
            (ret, 0, 0, SECCOMP_RET_EPERM),        # 2: another architecture: refused
            (ld_abs, 0, 0, 0),                     # 3: A = seccomp_data.nr
            (jset, 4, 0, X32_SYSCALL_BIT),         # 4: x32 -> 9
            (jeq, 3, 0, add_key),                  # 5
            (jeq, 2, 0, request_key),              # 6
            (jeq, 1, 0, keyctl),                   # 7
            (ret, 0, 0, SECCOMP_RET_ALLOW),        # 8
            (ret, 0, 0, SECCOMP_RET_EPERM)]        # 9


def isolate_keyrings() -> None:
    """A new, empty session keyring (the grader's is left behind), then no_new_privs and the seccomp
    filter: no key system call works in the kernel or anything it starts (filters survive exec and fork)."""
    machine = os.uname().machine
    if machine not in SYSCALLS_KEYS:
        raise OSError(f"no seccomp filter for the keyrings on {machine}")
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    rc = libc.syscall(ctypes.c_long(SYS_KEYCTL[machine]), ctypes.c_long(KEYCTL_JOIN_SESSION_KEYRING),
                      ctypes.c_void_p(None))
    if rc < 0 and ctypes.get_errno() not in (38,):   # ENOSYS: a kernel without keys has no keyring to leak
        e = ctypes.get_errno()
        raise OSError(e, f"a new session keyring: {os.strerror(e)}")
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    prog = keyring_filter(machine)
    arr = (_SockFilter * len(prog))(*[_SockFilter(*ins) for ins in prog])
    fprog = _SockFprog(len(prog), ctypes.cast(arr, ctypes.POINTER(_SockFilter)))
    _check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp filter")


def drop_privileges(uid, gid) -> None:
    if uid is None or os.geteuid() != 0:
        return
    os.setgroups([])
    os.setgid(int(gid))
    os.setuid(int(uid))
    if os.getuid() != int(uid) or os.geteuid() != int(uid):
        raise OSError("setuid did not take effect")


def _child(spec: dict, cmd: list) -> None:
    try:
        root = spec.get("root")
        if root:
            build_root(root["stage"], root["ops"])
            pivot_into(root["stage"])
            _libc().sethostname(b"sandbox", 7)
        set_rlimits(spec.get("rlimits") or {})
        drop_privileges(spec.get("uid"), spec.get("gid"))
        libc = _libc()
        # no set-user-ID program gives the kernel's user privileges back (no_new_privs), no keyring of the
        # grader's or of another kernel reachable
        isolate_keyrings()
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after setuid, which clears it
        os.chdir(spec["cwd"])
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT):
            signal.signal(s, signal.SIG_DFL)
        if spec.get("bwrap"):
            # the grader interrupts a cell with SIGINT to the process group: bubblewrap's own processes
            # are in it and would die of it (and the kernel with them); ignored, the disposition is
            # inherited through them, and ipykernel installs its own handler while it runs a cell
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        argv = list(spec.get("bwrap") or []) + list(cmd)
        os.execve(argv[0], argv, dict(spec.get("env") or {}))
    except Exception as e:  # noqa: BLE001 - report any failure to start
        _die(f"cannot start the kernel: {type(e).__name__}: {e}")


def main(argv: list) -> None:
    global _report
    if len(argv) < 4 or argv[2] != "--":
        _die("usage: jail.py SPEC_JSON -- CMD ...")
    spec, cmd = json.loads(argv[1]), argv[3:]
    _report = spec.get("report")
    root = spec.get("root")
    if root and os.geteuid() != 0:
        _die("a private filesystem (the 'user' level) needs root")
    pidns = bool(spec.get("unshare_pid") or root)
    try:
        join_cgroups(spec.get("cgroup") or [])
        for p in spec.get("chown") or []:
            if os.geteuid() == 0 and spec.get("uid") is not None:
                os.chown(p, int(spec["uid"]), int(spec["gid"]))
        if root:
            enter_namespaces(True, True, CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS)
            mount(None, "/", MS_REC | MS_PRIVATE)  # nothing mounted here shows outside, and back
        else:
            if spec.get("expose") and os.geteuid() == 0:
                expose(spec["expose"], spec["stage"])
            enter_namespaces(bool(spec.get("unshare_net")), bool(spec.get("unshare_pid")))
    except Exception as e:  # noqa: BLE001
        _die(f"{type(e).__name__}: {e}")
    if not pidns:
        _child(spec, cmd)
    # PID namespace: the first child is the namespace's init; stay as its parent.
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the kernel gets the process group's SIGINT itself
    pid = os.fork()
    if pid == 0:
        _child(spec, cmd)

    def forward(signum, frame):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGHUP, forward)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
        except ChildProcessError:
            os._exit(0)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


if __name__ == "__main__":
    main(sys.argv)
