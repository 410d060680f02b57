"""How `course grade` runs a student's code: one scratch copy and one least-privileged kernel per submission.

Isolation levels (the strongest one available is used; `course grade` prints which):

``bwrap``    bubblewrap is installed: on top of everything in ``user``, the kernel runs in its own
             mount namespace with a read-only view of the system (/usr, /etc, /lib*, the Python
             installation, the course library) and a writable scratch folder only; nothing else of the
             machine exists in it (no home folders, no repository, no other submissions, no
             instructor sources, no gradebook). ``--require-sandbox`` refuses to grade without it.
``user``     the grader runs as root: the kernel runs as an unprivileged user (``--sandbox-user``,
             default ``nobody``) that owns only its scratch folder; it cannot write the submissions,
             the release, the gradebook, the outputs or any file of the grader, cannot read
             anything private to the grader (the per-submission course folder, gradebook and
             autograded notebooks are root-only), has no network, runs in its own PID namespace (all
             its processes die with it) under resource limits. It can still *read* world-readable
             files (for instance the repository, when the course lives in a world-readable folder).
``process``  the grader is not root and bubblewrap is missing: the kernel runs as the grader's own
             user, in a scratch folder, with resource limits, in its own process group, and (where the
             system allows unprivileged user namespaces) without network and in its own PID namespace.
             It can read and write whatever the grader's user can: use this level only for trusted
             notebooks, or run `course grade` as root or install bubblewrap.

Every level grades each submission in its own scratch copy (its own nbgrader course folder and
gradebook; the grader merges the scores into the instructor's gradebook afterwards, computing them
itself from the executed notebook), gives the kernel a working folder holding only that notebook,
limits the time of each cell and of the whole notebook, and kills every process of the kernel at the
end.
"""
from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager
from traitlets import Dict as TDict

JAIL = str(Path(__file__).with_name("jail.py"))
LEVELS = ("bwrap", "user", "process")
DEFAULT_MEMORY_GB = 8.0
DEFAULT_NPROC = 256
DEFAULT_FSIZE = 512 * 2**20
DEFAULT_NOFILE = 1024
PATH = "/usr/local/bin:/usr/bin:/bin"


class SandboxUnavailable(RuntimeError):
    """The isolation asked for (``--require-sandbox``, ``--isolation``) is not available here."""


@dataclass
class Isolation:
    """What the grader can do on this machine, decided once per `course grade` run."""
    level: str                       # bwrap | user | process
    uid: int | None = None           # the sandbox user (root only)
    gid: int | None = None
    user: str | None = None
    unshare_net: bool = False
    unshare_pid: bool = False
    bwrap: str | None = None         # path of the bwrap executable
    memory_gb: float | None = DEFAULT_MEMORY_GB
    notes: list = field(default_factory=list)
    expose: list = field(default_factory=list)  # [ancestor, path]: see jail.expose

    def describe(self) -> str:
        what = {"bwrap": "bubblewrap sandbox (read-only system, writable scratch only)",
                "user": f"unprivileged user {self.user} (uid {self.uid})",
                "process": "the grader's own user (no sandbox: use for trusted notebooks only)"}[self.level]
        extra = []
        extra.append("no network" if self.unshare_net or self.level == "bwrap" else "network NOT isolated")
        extra.append("own PID namespace" if self.unshare_pid or self.level == "bwrap" else "process group only")
        extra.append(f"address space <= {self.memory_gb:g} GiB" if self.memory_gb else "no memory limit")
        return f"isolation: {self.level}: {what}; " + ", ".join(extra)


def find_bwrap() -> str | None:
    return shutil.which("bwrap")


def _jail_ok(spec: dict, cmd=("/bin/true",)) -> bool:
    """Can the jail start `cmd` with this spec? (Run once per grade run, per option.)"""
    import tempfile
    with tempfile.TemporaryDirectory(prefix="cg-probe-") as stage:
        spec = {"cwd": "/", "env": {"PATH": PATH}, **spec, "stage": stage}
        try:
            r = subprocess.run([sys.executable, "-I", "-S", JAIL, json.dumps(spec), "--", *cmd],
                               capture_output=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return False
    return r.returncode == 0


def _blocked_ancestor(path: str, uid: int, gid: int) -> str | None:
    """The highest ancestor of `path` that user `uid` cannot enter (no x bit for it), or None."""
    p = Path(path).resolve()
    for a in reversed(p.parents):
        try:
            st = a.stat()
        except OSError:
            return None
        if st.st_uid == uid:
            ok = st.st_mode & 0o100
        elif st.st_gid == gid:
            ok = st.st_mode & 0o010
        else:
            ok = st.st_mode & 0o001
        if not ok:
            return str(a)
    return None


def exposed_paths(uid: int, gid: int) -> list[list[str]]:
    """[ancestor, path] pairs the jail must bind for the sandbox user to run Python and import
    course_lib (see jail.expose); empty when everything is reachable."""
    paths = {str(Path(p).resolve()) for p in (sys.base_prefix, sys.prefix, sys.exec_prefix,
                                              sysconfig.get_paths()["purelib"], str(course_lib_root()))}
    paths.add(str(Path(sys.executable).resolve().parent))
    out = []
    for p in sorted(paths):
        a = _blocked_ancestor(p, uid, gid)
        if a is not None and [a, p] not in out and not any(p.startswith(q + "/") for _, q in out):
            out.append([a, p])
    return out


def resolve_user(name: str | int | None) -> tuple[int, int, str]:
    if name is None:
        name = "nobody"
    try:
        uid = int(name)
        try:
            pw = pwd.getpwuid(uid)
            return uid, pw.pw_gid, pw.pw_name
        except KeyError:
            return uid, uid, str(uid)
    except ValueError:
        pass
    try:
        pw = pwd.getpwnam(str(name))
    except KeyError:
        raise SandboxUnavailable(f"--sandbox-user {name}: no such user") from None
    if pw.pw_uid == 0:
        raise SandboxUnavailable(f"--sandbox-user {name}: must not be root")
    return pw.pw_uid, pw.pw_gid, pw.pw_name


def probe(level: str | None = None, require_sandbox: bool = False, sandbox_user=None,
          memory_gb: float | None = DEFAULT_MEMORY_GB) -> Isolation:
    """The isolation to use: `level` (or the strongest available); raises SandboxUnavailable when
    `require_sandbox` (bubblewrap) or the level asked for cannot be had."""
    if level is not None and level not in LEVELS:
        raise ValueError(f"isolation level must be one of {', '.join(LEVELS)}, got {level!r}")
    bwrap = find_bwrap()
    root = os.geteuid() == 0
    if require_sandbox and not bwrap:
        raise SandboxUnavailable("--require-sandbox: bubblewrap (bwrap) is not installed; install it (e.g. "
                                 "`apt-get install bubblewrap`) or grade without --require-sandbox")
    if require_sandbox and level not in (None, "bwrap"):
        raise SandboxUnavailable(f"--require-sandbox and --isolation {level} contradict each other")
    explicit = level is not None
    if level is None:
        level = "bwrap" if bwrap else ("user" if root else "process")
    if level == "bwrap" and not bwrap:
        raise SandboxUnavailable("--isolation bwrap: bubblewrap (bwrap) is not installed")
    if level == "user" and not root:
        raise SandboxUnavailable("--isolation user: needs `course grade` to run as root (to switch to an "
                                 "unprivileged user); run as root, install bubblewrap, or use --isolation process")
    iso = Isolation(level, bwrap=bwrap, memory_gb=memory_gb or None)
    if root and level in ("bwrap", "user"):
        iso.uid, iso.gid, iso.user = resolve_user(sandbox_user)
        iso.expose = exposed_paths(iso.uid, iso.gid)
        spec = {"uid": iso.uid, "gid": iso.gid, "expose": iso.expose,
                "env": {"PATH": PATH, "PYTHONPATH": str(course_lib_root()), "PYTHONDONTWRITEBYTECODE": "1"}}
        if not _jail_ok(spec, (sys.executable, "-c", "import course_lib.grading.guard"),):
            why = (f"the sandbox user {iso.user} cannot run {sys.executable} and import course_lib "
                   f"(from {course_lib_root()})")
            if explicit:
                raise SandboxUnavailable(f"--isolation {level}: {why}")
            iso = Isolation("process", bwrap=bwrap, memory_gb=memory_gb or None,
                            notes=[f"{why}: fell back to isolation level 'process'"])
    if iso.level != "bwrap":  # bubblewrap makes its own namespaces
        base = {"uid": iso.uid, "gid": iso.gid}
        iso.unshare_net = _jail_ok({**base, "unshare_net": True})
        iso.unshare_pid = _jail_ok({**base, "unshare_pid": True})
        if not iso.unshare_net:
            iso.notes.append("cannot make a network namespace here: the kernel keeps network access")
        if not iso.unshare_pid:
            iso.notes.append("cannot make a PID namespace here: leftover processes are killed by process "
                             "group and marker instead")
    return iso


BWRAP_LIB = "/opt/course"


def bwrap_argv(bwrap: str, work: Path, run: Path, package: Path, marker: str = "") -> list[str]:
    """bubblewrap's arguments: a read-only system, the Python installation and the course library,
    the scratch folders `work` (the kernel's home and working folder) and `run` (its connection
    file and sockets) writable, no network, own PID/IPC/UTS namespaces, dies with the grader."""
    argv = [bwrap, "--die-with-parent", "--new-session", "--unshare-all", "--cap-drop", "ALL",
            "--clearenv", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    ro = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/alternatives",
          "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/ssl", "/etc/localtime",
          "/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/matplotlibrc"]
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    for p in ro:
        argv += ["--ro-bind-try", p, p]
    for p in sorted(prefixes):
        if not any(p.startswith(r + "/") for r in ro if r.startswith("/usr")):
            argv += ["--ro-bind", p, p]
    argv += ["--ro-bind", str(package), f"{BWRAP_LIB}/course_lib"]  # the package only, not the repository
    argv += ["--bind", str(work), str(work), "--bind", str(run), str(run), "--chdir", str(work)]
    for k, v in sorted(kernel_env(work, BWRAP_LIB, marker).items()):
        argv += ["--setenv", k, v]
    argv.append("--")
    return argv


def kernel_env(work: Path, pythonpath: str | Path | None, marker: str = "") -> dict:
    """The kernel's whole environment (nothing of the grader's is inherited)."""
    env = {"PATH": PATH, "HOME": str(work), "TMPDIR": str(work / "tmp"), "USER": "student",
           "LOGNAME": "student", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "IPYTHONDIR": str(work / ".ipython"),
           "MPLCONFIGDIR": str(work / ".matplotlib"), "MPLBACKEND": "Agg", "PYTHONDONTWRITEBYTECODE": "1",
           "COURSE_OFFLINE": "1", "COURSE_QUICK": "1", "NBGRADER_EXECUTION": "autograde",
           "OMP_NUM_THREADS": "2", "JPY_PARENT_PID": str(os.getpid())}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    if marker:
        env["COURSE_GRADE_KERNEL"] = marker
    return env


def course_lib_root() -> Path:
    """The folder holding the `course_lib` package the grader runs (what the kernel imports)."""
    return Path(__file__).resolve().parents[2]


def make_scratch(base: Path, key: str, iso: Isolation) -> tuple[Path, Path]:
    """(work, run) folders of one kernel, owned by the sandbox user; `base` stays the grader's."""
    top = base / key
    if top.exists():
        shutil.rmtree(top)
    work, run = top / "work", top / "run"
    for d in (top, work, run, work / "tmp"):
        d.mkdir(parents=True)
    if iso.uid is not None:
        os.chmod(top, 0o711)
        for d in (work, run, work / "tmp"):
            os.chown(d, iso.uid, iso.gid)
            os.chmod(d, 0o700)
    return work, run


def kernel_spec(iso: Isolation, work: Path, run: Path, connection_file: Path, marker: str,
                cpu_seconds: int | None) -> dict:
    lib = course_lib_root()
    rl = {"core": 0, "fsize": DEFAULT_FSIZE, "nofile": DEFAULT_NOFILE}
    if iso.memory_gb:
        rl["as"] = int(iso.memory_gb * 2**30)
    if cpu_seconds:
        rl["cpu"] = int(cpu_seconds)
    if iso.uid is not None:
        rl["nproc"] = DEFAULT_NPROC  # per user: only meaningful for a dedicated user
    spec = {"uid": iso.uid, "gid": iso.gid, "cwd": str(work), "rlimits": rl,
            "env": kernel_env(work, lib, marker), "chown": [str(connection_file)] if iso.uid is not None else [],
            "unshare_net": iso.unshare_net, "unshare_pid": iso.unshare_pid,
            "expose": iso.expose, "stage": str(run.parent / "mnt")}
    if iso.level == "bwrap":
        spec["bwrap"] = bwrap_argv(iso.bwrap, work, run, lib / "course_lib", marker)
        spec["unshare_net"] = spec["unshare_pid"] = False
    return spec


def jail_command(spec: dict, cmd: list[str]) -> list[str]:
    return [sys.executable, "-I", "-S", JAIL, json.dumps(spec), "--"] + list(cmd)


class SandboxKernelManager(AsyncKernelManager):
    """A kernel manager whose kernel starts through the jail (`jail.py`) with `sandbox_spec`, talking
    over Unix sockets in the scratch (TCP would not cross the network namespace)."""
    sandbox_spec = TDict(allow_none=True, default_value=None).tag(config=True)

    def format_kernel_cmd(self, extra_arguments=None):
        cmd = super().format_kernel_cmd(extra_arguments)
        if not self.sandbox_spec:
            return cmd
        return jail_command(self.sandbox_spec, cmd)


def kill_leftovers(marker: str, uid: int | None = None, pgids=()) -> list[int]:
    """Kill what is left of one kernel: processes in its process groups, and processes whose
    environment carries `marker` (root can read every environment; a user its own). Returns the pids
    killed. With a PID namespace nothing should be left; this is the fallback."""
    killed = []
    for pg in pgids:
        try:
            os.killpg(pg, signal.SIGKILL)
        except OSError:
            pass
    needle = f"COURSE_GRADE_KERNEL={marker}".encode()
    me = os.getpid()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == me:
            continue
        try:
            if uid is not None and (d / "status").read_text().split("Uid:")[1].split()[1] != str(uid):
                continue
            if needle not in (d / "environ").read_bytes().split(b"\0"):
                continue
            os.kill(int(d.name), signal.SIGKILL)
            killed.append(int(d.name))
        except (OSError, IndexError):
            continue
    return killed


def alive_with_marker(marker: str) -> list[int]:
    """Pids of processes still carrying the marker in their environment (for the tests)."""
    needle = f"COURSE_GRADE_KERNEL={marker}".encode()
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if needle in (d / "environ").read_bytes().split(b"\0"):
                    out.append(int(d.name))
            except OSError:
                pass
    return out
