"""How `course grade` runs a student's code: one scratch copy and one least-privileged kernel per submission.

Isolation levels (the strongest one available is used; `course grade` prints which, first):

``bwrap``    bubblewrap is installed: the kernel runs in bubblewrap's namespaces (user, mount, PID,
             network, IPC, UTS, cgroup) with a read-only view of the system (/usr, /etc's basics,
             /lib*, the Python installation), a private copy of the `course_lib` package and of
             the judge's kernel-side driver (`course_grading`'s `driver.py` and `wire.py`, not the pipeline), and its
             writable scratch folders only; /proc shows its own processes, /tmp, /var/tmp and
             /dev/shm are its own. Nothing else of the machine exists in it (no home folders, no
             repository, no other submissions, no instructor sources, no gradebook, no /run and its
             sockets). As root, bubblewrap runs as the unprivileged ``--sandbox-user``.
             ``--require-sandbox`` refuses to grade without it.
``user``     the grader runs as root: the same private filesystem, built by the jail itself (`jail.py`:
             mount, PID, network, IPC and UTS namespaces and pivot_root), and the kernel runs as an
             unprivileged user (``--sandbox-user``, default ``nobody``) with no_new_privs. Where root
             cannot make a mount namespace (a container without CAP_SYS_ADMIN), the filesystem is not
             private: the kernel can then read world-readable files; `course grade` says so.
``process``  the grader's own user, in a scratch folder with resource limits (and no network and its
             own PID namespace where unprivileged user namespaces are allowed). It can read and write
             whatever the grader's user can: only on request (``--isolation process``), for trusted
             notebooks; without bubblewrap or root `course grade` stops and says what to install.

Every level grades each submission in its own scratch copy (its own nbgrader course folder and
gradebook in a folder only the grader can enter; the grader merges the scores into the instructor's
gradebook afterwards, computing them itself from the executed notebook), gives the kernel a working
folder holding only that notebook and a clean environment, limits the time of each cell and of the
whole notebook, and kills every process of the kernel at the end. Where the grader is root and the
machine allows it, a submission also gets its own cgroup (memory and process count of the whole
submission: all its processes together, its tmpfs files included) and its own size-bounded tmpfs for
its files (working folder, /tmp, /var/tmp, /dev/shm), removed after it; otherwise the limits are per
process and `course grade`'s first line says so.
"""
from __future__ import annotations

import ctypes
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
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
DEFAULT_DISK = 1 * 2**30          # a submission's files in all (working folder, /tmp, /dev/shm), when on tmpfs;
                                  # at most a quarter of the memory limit (tmpfs files are memory)
PATH = "/usr/local/bin:/usr/bin:/bin"
LIB_MOUNT = "/opt/course"         # where the kernel finds its copy of course_lib at the bwrap and user levels
# What the kernel gets of this package: the judge's driver and its wire format, not the pipeline (a kernel
# that imports course_grading.sandbox or course_grading.judging finds nothing; execute.check_kernel checks it).
KERNEL_FILES = ("__init__.py", "driver.py", "wire.py")
BWRAP_LIB = LIB_MOUNT
SCRATCH_PATH_MAX = 60             # the scratch folder's path length: Unix socket paths end at 107 bytes
SYSTEM_RO = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/alternatives",
             "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/ssl", "/etc/localtime",
             "/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/matplotlibrc")

USERNS_HELP = """\
Where unprivileged user namespaces are restricted, bubblewrap needs them allowed for itself: on Ubuntu
23.10 and later (AppArmor, kernel.apparmor_restrict_unprivileged_userns = 1) add a profile that lets
/usr/bin/bwrap create them, e.g. /etc/apparmor.d/bwrap with
    abi <abi/4.0>,
    include <tunables/global>
    profile bwrap /usr/bin/bwrap flags=(unconfined) {
      userns,
    }
and load it with `sudo apparmor_parser -r /etc/apparmor.d/bwrap`; on Debian before 11, `sudo sysctl
kernel.unprivileged_userns_clone=1`; elsewhere check `sysctl user.max_user_namespaces` (> 0)."""
INSTALL_BWRAP = """\
Install bubblewrap:
  Debian, Ubuntu:  sudo apt-get install bubblewrap
  Fedora, RHEL:    sudo dnf install bubblewrap
  Arch:            sudo pacman -S bubblewrap
  openSUSE:        sudo zypper install bubblewrap
""" + USERNS_HELP + "\nOr run `course grade` as root (isolation level 'user')."

NO_SANDBOX = ("refusing to grade: students' code would run as you (isolation level 'process': it could read "
              "and write everything you can, your keys and the solutions included), because bubblewrap is "
              "not installed and `course grade` is not running as root.\n" + INSTALL_BWRAP + "\n"
              "To grade trusted notebooks as yourself anyway, pass --isolation process.")


class SandboxUnavailable(RuntimeError):
    """The isolation asked for (``--require-sandbox``, ``--isolation``) is not available here, or the
    grading kernel cannot start at the chosen level."""


# ---------------------------------------------------------------------------------------------------
# cgroups: one per submission, bounding the memory and the process count of all its processes together

def _write(path: Path | str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def _read(path: Path | str) -> str:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


def _cgroup_mounts() -> list[tuple[str, str, set, str]]:
    """(mount point, fstype, super options, root of the mount) of every cgroup file system."""
    out = []
    for line in _read("/proc/self/mountinfo").splitlines():
        parts = line.split()
        if "-" not in parts:
            continue
        sep = parts.index("-")
        fstype = parts[sep + 1]
        if fstype in ("cgroup", "cgroup2"):
            out.append((parts[4], fstype, set(parts[sep + 3].split(",")), parts[3]))
    return out


def _own_cgroups() -> dict[str, str]:
    """controller (or "" for cgroup v2) -> this process's cgroup path, from /proc/self/cgroup."""
    out = {}
    for line in _read("/proc/self/cgroup").splitlines():
        _, ctrls, path = line.split(":", 2)
        for c in (ctrls.split(",") if ctrls else [""]):
            out[c] = path
    return out


def _under(mount: str, root: str, path: str) -> Path:
    rel = path[len(root):] if root != "/" and path.startswith(root) else path
    return Path(mount + rel.rstrip("/")) if rel not in ("", "/") else Path(mount)


@dataclass
class Cgroups:
    """Where this run makes its per-submission cgroups: ``v2`` (memory.max, pids.max) or ``v1`` (the
    memory controller's memory.limit_in_bytes, and the pids controller's pids.max where mounted). Each also
    counts the CPU time of all its processes, the exited ones included (v2's cpu.stat; v1's cpuacct where
    mounted): the project's judge times its calls by it (`cpu_seconds`)."""
    version: str
    parents: dict                     # "memory"/"pids"/"cpuacct" (v1) or "unified" (v2) -> parent folder
    pids: bool = False
    run: dict = field(default_factory=dict)   # the same keys -> this run's folder

    @classmethod
    def find(cls) -> tuple[Cgroups | None, str]:
        """The cgroups this machine lets the grader make, checked by making and removing one; (None, why)
        when there are none."""
        if os.geteuid() != 0:
            return None, "not root"
        mounts, own = _cgroup_mounts(), _own_cgroups()
        why = []
        for mnt, fstype, opts, root in mounts:
            if fstype != "cgroup2":
                continue
            for parent in dict.fromkeys([_under(mnt, root, own.get("", "/")), Path(mnt)]):
                enabled = _read(parent / "cgroup.subtree_control").split()
                if "memory" not in enabled:
                    why.append(f"{parent}: the memory controller is not enabled for its children")
                    continue
                cg = cls("v2", {"unified": parent}, pids="pids" in enabled)
                err = cg._try()
                if err is None:
                    return cg, ""
                why.append(err)
        v1 = {}
        for mnt, fstype, opts, root in mounts:
            for c in ("memory", "pids", "cpuacct"):
                if fstype == "cgroup" and c in opts and c in own and c not in v1:
                    where = _under(mnt, root, own[c])
                    if where not in v1.values():   # controllers mounted together: one folder
                        v1[c] = where
        if "memory" in v1:
            cg = cls("v1", v1, pids="pids" in v1)
            err = cg._try()
            if err is None:
                return cg, ""
            why.append(err)
        elif not why:
            why.append("no cgroup v2 with the memory controller and no cgroup v1 memory controller is mounted")
        return None, "; ".join(why)

    def _try(self) -> str | None:
        try:
            self.start()
            dirs = self.make("probe", 64 * 2**20, 8)
            self.remove(dirs)
            self.close()
            return None
        except OSError as e:
            self.close()
            return f"cannot make a cgroup ({self.version}): {e}"

    def start(self) -> None:
        tag = f"course-grade-{os.getpid()}-{secrets.token_hex(3)}"
        for k, parent in self.parents.items():
            d = parent / tag
            d.mkdir()
            self.run[k] = d
            if self.version == "v2":
                _write(d / "cgroup.subtree_control", " ".join("+" + c for c in ("memory", "pids")
                                                               if c == "memory" or self.pids))

    def make(self, key: str, memory: int | None, pids: int | None) -> list[Path]:
        """A cgroup per controller hierarchy for one submission, its limits set; the jail joins them."""
        dirs = []
        for k, run in self.run.items():
            d = run / key
            if d.exists():
                self.remove([d])
            d.mkdir()
            dirs.append(d)
            if k in ("unified", "memory") and memory:
                if self.version == "v2":
                    _write(d / "memory.max", str(int(memory)))
                    if (d / "memory.swap.max").exists():
                        _write(d / "memory.swap.max", "0")
                else:
                    _write(d / "memory.limit_in_bytes", str(int(memory)))
                    if (d / "memory.memsw.limit_in_bytes").exists():  # memory + swap: no swapping around it
                        try:
                            _write(d / "memory.memsw.limit_in_bytes", str(int(memory)))
                        except OSError:
                            pass
            if k in ("unified", "pids") and pids and self.pids:
                _write(d / "pids.max", str(int(pids)))
        return dirs

    @staticmethod
    def cpu_seconds(dirs) -> float | None:
        """CPU seconds used by every process that ever ran in these cgroups (nanosecond counters), or None
        where none of them counts CPU time."""
        for d in map(Path, dirs):
            t = _read(d / "cpuacct.usage").strip()
            if t.isdigit():
                return int(t) / 1e9
            for line in _read(d / "cpu.stat").splitlines():
                k, _, v = line.partition(" ")
                if k == "usage_usec" and v.strip().isdigit():
                    return int(v) / 1e6
        return None

    def usage(self, dirs: list[Path]) -> dict:
        """{"peak": bytes or None, "oom_kill": processes killed for memory} of one submission."""
        out = {"peak": None, "oom_kill": 0}
        for d in dirs:
            for name in ("memory.peak", "memory.max_usage_in_bytes"):
                t = _read(d / name).strip()
                if t.isdigit():
                    out["peak"] = int(t)
            for name in ("memory.events", "memory.oom_control"):
                for line in _read(d / name).splitlines():
                    k, _, v = line.partition(" ")
                    if k == "oom_kill" and v.strip().isdigit():
                        out["oom_kill"] = max(out["oom_kill"], int(v))
        return out

    @staticmethod
    def kill(dirs: list[Path], wait: float = 10.0) -> int:
        """SIGKILL every process in the cgroups until none is left; returns how many were killed."""
        killed = set()
        for d in dirs:
            if (d / "cgroup.kill").exists():
                try:
                    _write(d / "cgroup.kill", "1")
                except OSError:
                    pass
        t0 = time.monotonic()
        while True:
            pids = {int(p) for d in dirs for p in _read(d / "cgroup.procs").split() if p.isdigit()}
            if not pids or time.monotonic() - t0 > wait:
                return len(killed | pids)
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                    killed.add(p)
                except OSError:
                    pass
            time.sleep(0.02)

    @staticmethod
    def _rmdir(d: Path, deadline: float) -> None:
        """Remove one cgroup folder, killing what is still in it, until `deadline`: a killed process (a
        fork storm's hundreds, on a busy machine) leaves its cgroup a while after the signal, and a
        parent can be removed only once its children are gone."""
        while True:
            try:
                d.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    return
                Cgroups.kill([d], wait=0.5)
                time.sleep(0.05)

    def remove(self, dirs: list[Path], wait: float = 30.0) -> None:
        self.kill(dirs)
        deadline = time.monotonic() + wait
        for d in dirs:
            self._rmdir(d, deadline)

    def close(self) -> None:
        for d in self.run.values():
            if d.exists():
                self.remove([c for c in d.iterdir() if c.is_dir()])
                self._rmdir(d, time.monotonic() + 10.0)
        self.run = {}


# ---------------------------------------------------------------------------------------------------
# mounts made by the grader itself (root only): one tmpfs per submission

MS_NOSUID, MS_NODEV, MNT_DETACH = 2, 4, 2


def mount_tmpfs(path: Path, size: int, mode: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"tmpfs", str(path).encode(), b"tmpfs", ctypes.c_ulong(MS_NOSUID | MS_NODEV),
                  f"size={int(size)},mode={mode}".encode()) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount tmpfs on {path}: {os.strerror(e)}")


def umount(path: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.umount2(str(path).encode(), MNT_DETACH)


def _can_mount() -> bool:
    if os.geteuid() != 0:
        return False
    d = tempfile.mkdtemp(prefix="cg-probe-")
    try:
        mount_tmpfs(Path(d), 2**20, "0700")
        umount(Path(d))
        return True
    except OSError:
        return False
    finally:
        os.rmdir(d)


# ---------------------------------------------------------------------------------------------------
# what the grader can do here

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
    private_fs: bool = False         # level user: the jail builds a private filesystem
    cgroup: Cgroups | None = None    # per-submission cgroups (root, where the machine allows one)
    tmpfs: bool = False              # per-submission tmpfs for the kernel's files (root)
    disk: int = DEFAULT_DISK

    @property
    def private(self) -> bool:
        """Does the kernel see only its own filesystem (no repository, no /tmp or /run of the machine)?"""
        return self.level == "bwrap" or (self.level == "user" and self.private_fs)

    def memory_text(self) -> str:
        if not self.memory_gb:
            return "no memory limit"
        if self.cgroup is not None:
            return (f"memory <= {self.memory_gb:g} GiB for the whole submission (all its processes and files "
                    f"together: cgroup {self.cgroup.version})")
        return (f"memory <= {self.memory_gb:g} GiB per process, NOT for the whole submission (no cgroup here: "
                f"a notebook's processes together can use more)")

    def describe(self) -> str:
        who = f"user {self.user} (uid {self.uid})" if self.uid is not None else "your own user"
        what = {"bwrap": f"bubblewrap sandbox as {who}",
                "user": f"unprivileged {who}",
                "process": "the grader's own user (no sandbox: use for trusted notebooks only)"}[self.level]
        extra = []
        if self.private:
            extra.append("private filesystem (read-only system and Python, a copy of course_lib and the "
                         "judge's driver, its scratch "
                         "folder; own /proc, /tmp, /var/tmp, /dev/shm; no /run, repository or home folders)")
        elif self.level == "user":
            extra.append("filesystem NOT private (it can read world-readable files and use the machine's /tmp)")
        extra.append("no network" if self.unshare_net or self.private else "network NOT isolated")
        extra.append("own PID namespace" if self.unshare_pid or self.private else "process group only")
        extra.append(self.memory_text())
        if self.tmpfs:
            extra.append(f"its files <= {self.disk / 2**30:g} GiB (tmpfs, removed after it)")
        return f"isolation: {self.level}: {what}; " + "; ".join(extra)


def find_bwrap() -> str | None:
    return shutil.which("bwrap")


_BWRAP_SIZE: dict = {}


def bwrap_has_size(bwrap: str) -> bool:
    """Does this bubblewrap know ``--size`` (0.8.0 and later) for its tmpfs mounts?"""
    if bwrap not in _BWRAP_SIZE:
        try:
            out = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        _BWRAP_SIZE[bwrap] = "--size" in out
    return _BWRAP_SIZE[bwrap]


def _jail_ok(spec: dict, cmd=("/bin/true",)) -> bool:
    """Can the jail start `cmd` with this spec? (Run once per grade run, per option.)"""
    with tempfile.TemporaryDirectory(prefix="cg-probe-") as stage:
        spec = {"cwd": "/", "env": {"PATH": PATH}, **spec, "stage": stage}
        if "root" in spec:
            os.mkdir(Path(stage) / "root", 0o700)
            spec["root"] = {**spec["root"], "stage": str(Path(stage) / "root")}
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


def python_paths() -> list[str]:
    """The folders of the Python installation the kernel runs (outside the system's /usr, /lib...)."""
    paths = {str(Path(p).resolve()) for p in (sys.base_prefix, sys.prefix, sys.exec_prefix, sys.base_exec_prefix,
                                              sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"])}
    paths.add(str(Path(sys.executable).resolve().parent))
    out = []
    for p in sorted(paths):
        if any(p == q or p.startswith(q + "/") for q in out + list(SYSTEM_RO)):
            continue
        out.append(p)
    return out


def exposed_paths(uid: int, gid: int, extra=()) -> list[list[str]]:
    """[ancestor, path] pairs the jail must bind for the sandbox user to run Python (see jail.expose),
    for bubblewrap run as that user; empty when everything is reachable."""
    out = []
    for p in sorted(set(python_paths()) | {str(Path(e).resolve()) for e in extra}):
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
    `require_sandbox` (bubblewrap) or the level asked for cannot be had, and when nothing but the
    grader's own user is available and ``process`` was not asked for. What this checks is what the jail
    can set up; `execute.check_kernel` then starts a real kernel at that level."""
    if level is not None and level not in LEVELS:
        raise ValueError(f"isolation level must be one of {', '.join(LEVELS)}, got {level!r}")
    if memory_gb is not None and memory_gb < 0:
        raise ValueError(f"memory limit must be >= 0 GiB (0: none), got {memory_gb}")
    bwrap = find_bwrap()
    root = os.geteuid() == 0
    if require_sandbox and not bwrap:
        raise SandboxUnavailable("--require-sandbox: bubblewrap (bwrap) is not installed.\n" + INSTALL_BWRAP)
    if require_sandbox and level not in (None, "bwrap"):
        raise SandboxUnavailable(f"--require-sandbox and --isolation {level} contradict each other")
    explicit = level is not None
    if level is None:
        level = "bwrap" if bwrap else ("user" if root else None)
        if level is None:
            raise SandboxUnavailable(NO_SANDBOX)
    if level == "bwrap" and not bwrap:
        raise SandboxUnavailable("--isolation bwrap: bubblewrap (bwrap) is not installed.\n" + INSTALL_BWRAP)
    if level == "user" and not root:
        raise SandboxUnavailable("--isolation user: needs `course grade` to run as root (to switch to an "
                                 "unprivileged user); run as root, install bubblewrap, or use --isolation process")
    iso = Isolation(level, bwrap=bwrap, memory_gb=memory_gb or None)
    if iso.memory_gb:
        iso.disk = min(DEFAULT_DISK, int(iso.memory_gb * 2**30 / 4))
    if root:
        iso.tmpfs = _can_mount()
        if iso.memory_gb:
            iso.cgroup, why = Cgroups.find()
            if iso.cgroup is None:
                iso.notes.append(f"no cgroup for the submissions ({why}): the memory limit is per process")
        if not iso.tmpfs:
            iso.notes.append("cannot mount a tmpfs here: a submission's files are on disk (each file <= "
                             f"{DEFAULT_FSIZE // 2**20} MiB), removed after it")
    if root and level in ("bwrap", "user"):
        iso.uid, iso.gid, iso.user = resolve_user(sandbox_user)
    if level == "bwrap" and root:
        iso.expose = exposed_paths(iso.uid, iso.gid)
    if level == "user":
        lib = course_lib_root() / "course_lib"
        env = {"PATH": PATH, "PYTHONPATH": LIB_MOUNT, "PYTHONDONTWRITEBYTECODE": "1"}
        spec = {"uid": iso.uid, "gid": iso.gid, "env": env,
                "root": {"ops": root_ops(None, lib)}}
        iso.private_fs = _jail_ok(spec, (sys.executable, "-c", "import course_lib.checks, course_grading.driver"))
        if not iso.private_fs:
            iso.notes.append("cannot build a private filesystem for the kernel here (no mount namespace): it can "
                             "read world-readable files, e.g. a world-readable repository and its solutions/")
            # the Python installation may sit where the sandbox user cannot enter (/root/.pyenv): bound
            # there in a mount namespace of its own where one can be made (see jail.expose); the kernel
            # imports the scratch's copy of course_lib, which that user can enter (RunScratch)
            spec = {"uid": iso.uid, "gid": iso.gid, "env": {"PATH": PATH}}
            runs = (sys.executable, "-c", "import json")
            iso.expose = exposed_paths(iso.uid, iso.gid)
            if iso.expose and not _jail_ok({**spec, "expose": iso.expose}, runs):
                iso.expose = []
            if not _jail_ok({**spec, "expose": iso.expose}, runs):
                raise SandboxUnavailable(
                    f"--isolation user: the sandbox user {iso.user} cannot run {sys.executable}, and no private "
                    "filesystem can be built here to show it to that user; install bubblewrap, or install "
                    "Python where that user can run it")
    if level in ("user", "process") and not iso.private:
        base = {"uid": iso.uid, "gid": iso.gid}
        iso.unshare_net = _jail_ok({**base, "unshare_net": True})
        iso.unshare_pid = _jail_ok({**base, "unshare_pid": True})
        if not iso.unshare_net:
            iso.notes.append("cannot make a network namespace here: the kernel keeps network access")
        if not iso.unshare_pid:
            iso.notes.append("cannot make a PID namespace here: leftover processes are killed by process "
                             "group and marker instead")
    if level == "process" and explicit:
        iso.notes.append("isolation level 'process' (asked for): students' code runs as you and can read and "
                         "write what you can")
    return iso


# ---------------------------------------------------------------------------------------------------
# the scratch folders

def scratch_parent(iso: Isolation) -> str:
    """Where this run's scratch goes: TMPDIR if the kernel's user can enter it (a `mktemp -d` TMPDIR is
    0700: the sandbox user cannot) and its path is short enough for Unix sockets, else /tmp, /var/tmp,
    /dev/shm."""
    tried = []
    for c in dict.fromkeys([tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm"]):
        why = None
        if not os.path.isdir(c) or not os.access(c, os.W_OK | os.X_OK):
            why = "not a writable folder"
        elif len(c) > SCRATCH_PATH_MAX - 12:
            why = "path too long for the kernel's Unix sockets"
        elif iso.uid is not None and _blocked_ancestor(os.path.join(c, "x"), iso.uid, iso.gid):
            why = f"{iso.user} cannot enter {_blocked_ancestor(os.path.join(c, 'x'), iso.uid, iso.gid)}"
        if why is None:
            return c
        tried.append(f"{c}: {why}")
    raise SandboxUnavailable("no folder for the grading scratch: " + "; ".join(tried))


@dataclass
class KernelScratch:
    """One submission's kernel folders: `work` (its home and working folder), `run` (connection file and
    sockets), `tmp` and `shm` (its /tmp and /var/tmp, its /dev/shm), all under `top`, and its cgroups."""
    key: str
    top: Path
    work: Path
    run: Path
    tmp: Path
    shm: Path
    report: Path                     # the jail writes why it could not start the kernel here
    mounted: bool = False
    cgroups: list = field(default_factory=list)


class RunScratch:
    """One grade run's scratch folder (made by the grader, whatever TMPDIR's modes are):

        <base>/        0711  (0700 at level process)
          p/           0700  the grader's only: the gradebook copy, the per-submission course folders
          lib/course_lib     a copy of the course package (the kernel imports this, not the repository)
          lib/course_grading the judge's driver only (KERNEL_FILES): what the grader's requests call in the kernel
          lib-<lab>/         a lab's copy: course_lib with what the lab is graded against withheld (`withhold`)
          k/<key>/     0711  one submission's kernel folders (a tmpfs where the grader can mount one)
    """

    def __init__(self, iso: Isolation):
        self.iso = iso
        self.base = Path(tempfile.mkdtemp(prefix="cg-", dir=scratch_parent(iso)))
        self.kernels_open: dict[str, KernelScratch] = {}
        self.cgroups = None
        try:
            os.chmod(self.base, 0o711 if iso.uid is not None else 0o700)
            self.private = self.base / "p"
            self.private.mkdir(mode=0o700)
            self.lib = self.base / "lib" / "course_lib"
            copy_package(course_lib_root() / "course_lib", self.lib)
            self.driver = driver_copy(self.lib)
            copy_package(Path(__file__).resolve().parent, self.driver, only=KERNEL_FILES)
            self.kernels = self.base / "k"
            self.kernels.mkdir(mode=0o711)
            if iso.cgroup is not None:
                self.cgroups = Cgroups(iso.cgroup.version, iso.cgroup.parents, iso.cgroup.pids)
                self.cgroups.start()
        except BaseException:
            self.close()
            raise

    def lib_for(self, name: str, withheld=()) -> Path:
        """The course_lib copy the kernels of lab `name` import: the run's copy with each name of `withheld`
        (``course_lib.a.b.Name``, what the lab's parts are graded against) replaced by a stub that raises
        (`withhold`), and the driver beside it. Made once per lab, before any worker starts."""
        if not withheld:
            return self.lib
        top = self.base / f"lib-{name}"
        lib = top / "course_lib"
        if not lib.exists():
            top.mkdir(mode=0o755)
            shutil.copytree(self.lib, lib)
            withhold(lib, withheld)
            copy_package(lib, lib, compile_only=True)
            shutil.copytree(self.driver, driver_copy(lib))
        return lib

    def kernel(self, key: str, iso: Isolation | None = None) -> KernelScratch:
        """One submission's kernel folders, owned by `iso`'s sandbox user (default: the run's; with
        ``--jobs`` each worker passes its own, see jobs.py)."""
        iso = iso or self.iso
        top = self.kernels / key
        if key in self.kernels_open:
            self.release(self.kernels_open[key])
        elif top.exists():
            shutil.rmtree(top)
        top.mkdir(mode=0o711)
        ks = KernelScratch(key, top, top / "work", top / "run", top / "tmp", top / "shm",
                           self.private / f"jail-{key}.txt")
        self.kernels_open[key] = ks
        if iso.tmpfs:
            mount_tmpfs(top, iso.disk, "0711")
            ks.mounted = True
        for d, mode in ((ks.work, 0o700), (ks.run, 0o700), (ks.tmp, 0o1777), (ks.shm, 0o1777)):
            d.mkdir()
            if iso.uid is not None:
                os.chown(d, iso.uid, iso.gid)
            os.chmod(d, mode)
        (ks.work / "tmp").mkdir()  # the kernel's TMPDIR where it has no /tmp of its own
        if iso.uid is not None:
            os.chown(ks.work / "tmp", iso.uid, iso.gid)
        (top / "root").mkdir(mode=0o700)
        if self.cgroups is not None:
            mem = int(iso.memory_gb * 2**30) if iso.memory_gb else None
            ks.cgroups = self.cgroups.make(key, mem, DEFAULT_NPROC)
        return ks

    def release(self, ks: KernelScratch) -> dict:
        """Kill what is left of the kernel, remove its folders and cgroups; its memory use (see
        Cgroups.usage: empty without cgroups)."""
        usage = {}
        if ks.cgroups and self.cgroups is not None:
            self.cgroups.kill(ks.cgroups)
            usage = self.cgroups.usage(ks.cgroups)
        if ks.mounted:
            umount(ks.top)
            ks.mounted = False
        shutil.rmtree(ks.top, ignore_errors=True)
        if ks.cgroups and self.cgroups is not None:
            self.cgroups.remove(ks.cgroups)
        try:
            ks.report.unlink()
        except OSError:
            pass
        self.kernels_open.pop(ks.key, None)
        return usage

    def close(self) -> None:
        for ks in list(self.kernels_open.values()):
            self.release(ks)
        if self.cgroups is not None:
            self.cgroups.close()
        shutil.rmtree(self.base, ignore_errors=True)


def copy_package(src: Path, dst: Path, only: tuple[str, ...] | None = None, compile_only: bool = False) -> None:
    """A readable copy of a package (of its files named in `only`, if given), compiled (the kernel writes
    no bytecode, and compiling what a lab imports from course_lib costs each kernel about a second),
    folders 0755 and files 0644 whatever the modes in the checkout (safetensors writes 0600).
    `compile_only`: `dst` is there already (src == dst): compile what changed and set the modes."""
    import compileall
    if compile_only:
        pass
    elif only is None:
        shutil.copytree(src, dst)  # with __pycache__: copy2 keeps the sources' times, so those stay valid
    else:
        dst.mkdir(parents=True)
        for name in only:
            shutil.copy2(src / name, dst / name)
    compileall.compile_dir(str(dst), quiet=2)
    os.chmod(dst.parent, 0o755)
    for d, dirs, files in os.walk(dst):
        os.chmod(d, 0o755)
        for f in files:
            os.chmod(os.path.join(d, f), 0o644)


WITHHELD_MESSAGE = ("{name} is withheld while this lab is graded: it is what the lab's answers are graded "
                    "against, and an answer must be the student's own code")


def _module_file(package: Path, dotted: str) -> Path | None:
    rel = dotted.split(".")[1:]
    p = package.joinpath(*rel)
    if p.with_suffix(".py").is_file():
        return p.with_suffix(".py")
    if (p / "__init__.py").is_file():
        return p / "__init__.py"
    return None


def withhold(package: Path, names) -> None:
    """Replace each top-level definition ``course_lib.a.b.Name`` (a function, a class or an assignment, with
    its decorators) in the copy `package` of course_lib by a stub of the same name that raises
    RuntimeError (a class stub raises when instantiated, so the library's own imports and subclasses still
    load). The name must be defined where it is named, not re-exported (ValueError otherwise)."""
    import ast
    by_file: dict = {}
    for full in names:
        mod, _, name = full.rpartition(".")
        f = _module_file(package, mod) if mod.startswith("course_lib") else None
        if f is None:
            raise ValueError(f"withheld name {full}: no module {mod} in course_lib")
        by_file.setdefault(f, []).append((full, name))
    for f, items in by_file.items():
        lines = f.read_text(encoding="utf-8").split("\n")
        tree = ast.parse("\n".join(lines))
        spans = []
        for full, name in items:
            node = next((n for n in tree.body
                         if (isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name)
                         or (isinstance(n, (ast.Assign, ast.AnnAssign)) and any(
                             isinstance(t, ast.Name) and t.id == name
                             for t in (n.targets if isinstance(n, ast.Assign) else [n.target])))), None)
            if node is None:
                raise ValueError(f"withheld name {full}: not defined at the top of {f.name} (name the module "
                                 "that defines it, not one that re-exports it)")
            start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            msg = WITHHELD_MESSAGE.format(name=full)
            if isinstance(node, ast.ClassDef):
                stub = [f"class {name}:", "    \"\"\"Withheld while this lab is graded.\"\"\"",
                        "    def __init__(self, *args, **kwargs):", f"        raise RuntimeError({msg!r})"]
            else:
                stub = [f"def {name}(*args, **kwargs):", "    \"\"\"Withheld while this lab is graded.\"\"\"",
                        f"    raise RuntimeError({msg!r})"]
            spans.append((start, node.end_lineno, stub))
        for start, end, stub in sorted(spans, reverse=True):
            lines[start - 1:end] = stub
        f.write_text("\n".join(lines), encoding="utf-8")


# ---------------------------------------------------------------------------------------------------
# the kernel's launch

def kernel_env(work: Path, pythonpath: str | Path | None, marker: str = "", tmpdir: str | Path | None = None) -> dict:
    """The kernel's whole environment (nothing of the grader's is inherited). OMP_WAIT_POLICY=PASSIVE: torch's
    threads sleep while they wait for each other instead of spinning, so kernels graded side by side (--jobs)
    or on a busy machine do not slow each other down many times over (root conftest.py measures it).
    JPY_PARENT_PID is 1,
    ipykernel's "my parent is init" (no polling, no banner on the terminal): in a PID namespace the
    kernel's parent is pid 1, and with the grader's pid ipykernel takes that for its parent having exited
    and shuts down ("Kernel died before replying to kernel_info"). The jail and bubblewrap kill the
    kernel when the grader goes."""
    env = {"PATH": PATH, "HOME": str(work), "TMPDIR": str(tmpdir or work / "tmp"), "USER": "student",
           "LOGNAME": "student", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "IPYTHONDIR": str(work / ".ipython"),
           "MPLCONFIGDIR": str(work / ".matplotlib"), "MPLBACKEND": "Agg", "PYTHONDONTWRITEBYTECODE": "1",
           "COURSE_OFFLINE": "1", "COURSE_QUICK": "1", "NBGRADER_EXECUTION": "autograde",
           "OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE", "JPY_PARENT_PID": "1"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    if marker:
        env["COURSE_GRADE_KERNEL"] = marker
    return env


def driver_copy(package: Path) -> Path:
    """Where the driver's copy sits beside `package`, the kernel's copy of course_lib (RunScratch)."""
    return package.parent / "course_grading"


def kernel_packages(package: Path) -> list[tuple[str, str]]:
    """(source, where the kernel sees it) for the packages the kernel imports at the bwrap and user levels:
    `package` (the copy of course_lib) and the driver's copy beside it; nothing else of the grader."""
    return [(str(package), f"{LIB_MOUNT}/course_lib"), (str(driver_copy(package)), f"{LIB_MOUNT}/course_grading")]


def bwrap_argv(bwrap: str, work: Path, run: Path, package: Path, marker: str = "", tmp: Path | None = None,
               shm: Path | None = None, size: int | None = DEFAULT_DISK) -> list[str]:
    """bubblewrap's arguments: a read-only system, the Python installation and the course package
    (`package`, a copy: not the repository) with the driver's copy beside it, the scratch folders `work` (the
    kernel's home and working
    folder) and `run` (its connection file and sockets) writable, /tmp and /var/tmp (`tmp`) and /dev/shm
    (`shm`) its own (the submission's folders where given, else tmpfs of `size` bytes), no network, its
    own PID/IPC/UTS/cgroup namespaces, dies with its parent. No --new-session: the kernel must stay in
    the jail's process group to get the grader's interrupts, and that group is already a session of its
    own without a terminal (jupyter_client starts it with start_new_session)."""
    argv = [bwrap, "--die-with-parent", "--unshare-all", "--cap-drop", "ALL", "--clearenv",
            "--proc", "/proc", "--dev", "/dev"]
    sized = ["--size", str(int(size))] if size and bwrap_has_size(bwrap) else []
    for p, to in ((tmp, "/tmp"), (tmp, "/var/tmp"), (shm, "/dev/shm")):
        argv += ["--bind", str(p), to] if p is not None else sized + ["--tmpfs", to]
    for p in SYSTEM_RO:
        argv += ["--ro-bind-try", p, p]
    for p in python_paths():
        argv += ["--ro-bind", p, p]
    for src, dst in kernel_packages(package):
        argv += ["--ro-bind", src, dst]
    argv += ["--bind", str(work), str(work), "--bind", str(run), str(run), "--chdir", str(work)]
    for k, v in sorted(kernel_env(work, LIB_MOUNT, marker, "/tmp").items()):
        argv += ["--setenv", k, v]
    argv.append("--")
    return argv


def root_ops(ks: KernelScratch | None, package: Path) -> list[list]:
    """The jail's operations that build the kernel's private filesystem at level user (see
    jail.build_root): the same view as bubblewrap's. Targets deeper in the tree come after the mounts
    they sit in (the scratch may live in /tmp)."""
    ops = []
    if ks is not None:
        ops += [["rw", str(ks.tmp), "/tmp"], ["rw", str(ks.tmp), "/var/tmp"]]
    else:
        ops += [["tmpfs", 2**20, "1777", "/tmp"]]
    ops += [["ro-try", p, p] for p in SYSTEM_RO]
    ops += [["ro", p, p] for p in python_paths()]
    ops += [["ro", src, dst] for src, dst in kernel_packages(package)]
    ops += [["dev", "/dev"], ["proc", "/proc"]]
    if ks is not None:
        ops += [["rw", str(ks.shm), "/dev/shm"], ["rw", str(ks.work), str(ks.work)], ["rw", str(ks.run), str(ks.run)]]
    return ops


def kernel_spec(iso: Isolation, ks: KernelScratch, connection_file: Path, marker: str, cpu_seconds: int | None,
                package: Path) -> dict:
    """The jail's spec for one submission's kernel (see jail.py); `package` is the course_lib copy (the
    driver's copy beside it)."""
    rl = {"core": 0, "fsize": DEFAULT_FSIZE, "nofile": DEFAULT_NOFILE}
    if iso.memory_gb and iso.cgroup is None:
        # the fallback: address space per process (with a cgroup it is not needed, and it is not memory:
        # torch alone reserves 1.5 GB of it)
        rl["as"] = int(iso.memory_gb * 2**30)
    if cpu_seconds:
        rl["cpu"] = int(cpu_seconds)
    if iso.uid is not None and not (ks.cgroups and iso.cgroup is not None and iso.cgroup.pids):
        rl["nproc"] = DEFAULT_NPROC  # per user, not per submission: the fallback without a pids cgroup
    env = kernel_env(ks.work, LIB_MOUNT if iso.private else package.parent, marker,
                     "/tmp" if iso.private else None)
    spec = {"uid": iso.uid, "gid": iso.gid, "cwd": str(ks.work), "rlimits": rl, "env": env,
            "chown": [str(connection_file)] if iso.uid is not None else [],
            "cgroup": [str(d) for d in ks.cgroups], "report": str(ks.report)}
    if iso.level == "bwrap":
        spec["bwrap"] = bwrap_argv(iso.bwrap, ks.work, ks.run, package, marker,
                                   tmp=ks.tmp if ks.mounted else None, shm=ks.shm if ks.mounted else None,
                                   size=iso.disk)
        spec["expose"], spec["stage"] = iso.expose, str(ks.top / "mnt")
    elif iso.private:
        spec["root"] = {"stage": str(ks.top / "root"), "ops": root_ops(ks, package)}
    else:
        spec["unshare_net"], spec["unshare_pid"] = iso.unshare_net, iso.unshare_pid
        if iso.expose:
            spec["expose"], spec["stage"] = iso.expose, str(ks.top / "mnt")
    return spec


def course_lib_root() -> Path:
    """The folder holding the `course_lib` package beside this one (one distribution installs both; the
    repository in a checkout): the kernel gets a copy of that course_lib, found without importing it."""
    return Path(__file__).resolve().parents[1]


def jail_command(spec: dict, cmd: list[str]) -> list[str]:
    return [sys.executable, "-I", "-S", JAIL, json.dumps(spec), "--"] + list(cmd)


class SandboxKernelManager(AsyncKernelManager):
    """A kernel manager whose kernel starts through the jail (`jail.py`) with `sandbox_spec`, talking
    over Unix sockets in the scratch (TCP would not cross the network namespace). The kernel's stdout
    and stderr go to /dev/null unless the caller gives them: inherited, they would be the grader's
    terminal, where a student's code could print fake progress lines or terminal escape sequences
    (what a kernel says to the grader goes over its sockets)."""
    sandbox_spec = TDict(allow_none=True, default_value=None).tag(config=True)

    def format_kernel_cmd(self, extra_arguments=None):
        cmd = super().format_kernel_cmd(extra_arguments)
        if not self.sandbox_spec:
            return cmd
        return jail_command(self.sandbox_spec, cmd)

    async def _async_pre_start_kernel(self, **kw):
        cmd, kw = await super()._async_pre_start_kernel(**kw)
        if self.sandbox_spec:
            kw.setdefault("stdout", subprocess.DEVNULL)
            kw.setdefault("stderr", subprocess.DEVNULL)
        return cmd, kw


def kill_leftovers(marker: str, uid: int | None = None, pgids=()) -> list[int]:
    """Kill what is left of one kernel: processes in its process groups, and processes whose
    environment carries `marker` (root can read every environment; a user its own). Returns the pids
    killed. With a PID namespace or a cgroup nothing should be left; this is the fallback."""
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
