"""Start one grading kernel with least privilege (run by `course grade` as a script, stdlib only).

    python -I -S jail.py '<spec as JSON>' -- <kernel command ...>

The grader (jupyter_client) launches this script instead of the kernel; it applies the spec, in this
order, and then runs the kernel command:

1. ``chown``: hand the kernel's scratch folders and connection file to the sandbox user;
   ``expose`` (root only): in a private mount namespace, make the Python installation reachable for
   the sandbox user when it sits in a folder that user cannot enter (``/root/.pyenv``);
2. ``unshare``: new network namespace (no network; its own loopback interface is brought up, as
   bubblewrap does, so that programs talking to 127.0.0.1, like torch.distributed's gloo, work inside
   it) and new PID namespace
   (the kernel is its init: when it dies, every process it started dies with it, whatever it did to
   escape its process group); as root directly, otherwise inside a new user namespace when the system
   allows one;
3. ``rlimits``: address space, processes, CPU seconds, file size, open files, no core dumps;
4. drop privileges (``uid``/``gid``, no supplementary groups) when started as root;
5. ``cwd`` and a clean environment (``env``: nothing of the grader's is inherited);
6. ``bwrap``: when given, exec bubblewrap with that argument list in front of the kernel command.

With a PID namespace this process stays as the namespace's parent: it forwards SIGINT (interrupts) and
SIGTERM to the kernel, kills it when it is itself terminated, and exits with the kernel's status.
Every step that is asked for and fails stops the launch (exit status 70, the reason on stderr): the
grader probes what works once, up front, and only asks for that (`probe`).
"""
import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
FAIL = 70

RLIMITS = {"as": resource.RLIMIT_AS, "nproc": resource.RLIMIT_NPROC, "cpu": resource.RLIMIT_CPU,
           "fsize": resource.RLIMIT_FSIZE, "nofile": resource.RLIMIT_NOFILE, "core": resource.RLIMIT_CORE}


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _die(msg: str) -> None:
    sys.stderr.write(f"course grade jail: {msg}\n")
    sys.stderr.flush()
    os._exit(FAIL)


def unshare(flags: int) -> None:
    if _libc().unshare(flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


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


def enter_namespaces(net: bool, pid: bool) -> None:
    flags = (CLONE_NEWNET if net else 0) | (CLONE_NEWPID if pid else 0)
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


def mount(source, target, flags: int) -> None:
    src = source.encode() if source else None
    if _libc().mount(src, target.encode(), None, flags, None) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount {source} -> {target}: {os.strerror(e)}")


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
        set_rlimits(spec.get("rlimits") or {})
        drop_privileges(spec.get("uid"), spec.get("gid"))
        _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after setuid, which clears it
        os.chdir(spec["cwd"])
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT):
            signal.signal(s, signal.SIG_DFL)
        argv = list(spec.get("bwrap") or []) + list(cmd)
        os.execve(argv[0], argv, dict(spec.get("env") or {}))
    except Exception as e:  # noqa: BLE001 - report any failure to start
        _die(f"cannot start the kernel: {type(e).__name__}: {e}")


def main(argv: list) -> None:
    if len(argv) < 4 or argv[2] != "--":
        _die("usage: jail.py SPEC_JSON -- CMD ...")
    spec, cmd = json.loads(argv[1]), argv[3:]
    try:
        for p in spec.get("chown") or []:
            if os.geteuid() == 0 and spec.get("uid") is not None:
                os.chown(p, int(spec["uid"]), int(spec["gid"]))
        if spec.get("expose") and os.geteuid() == 0:
            expose(spec["expose"], spec["stage"])
        enter_namespaces(bool(spec.get("unshare_net")), bool(spec.get("unshare_pid")))
    except Exception as e:  # noqa: BLE001
        _die(f"{type(e).__name__}: {e}")
    if not spec.get("unshare_pid"):
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
