"""The grading kernel's sandbox, attacked with real kernels at the levels `user` and `bwrap` (issue 29).

One grade run per level (module fixture, --memory-limit 1 GiB, TMPDIR inside a 0700 folder as `mktemp -d`
makes it) over a fixture lab (lab97: lab99 with a canary in the solution of `add` and in its judge). Each attacker is
a submission whose `add` is right only if its attack worked, so "contained"
reads as a score: 3/5 (its multiply and clamp are right, add earns nothing), never 5/5; its other
evidence (a connection received, a file left on the machine, the cgroup's count of processes killed
for memory) is checked beside. A victim (graded after the attackers, its file watched), a clean
submission, a blank one and a wrong one are the controls. The instructor's files (solutions, release,
submissions) are world-readable on purpose: the kernel must not reach them through the sandbox, not
because of their modes.

The attackers look for the judge's and the solution's text by every path the issue found and a few more:
the grader's scratch; /proc (the grader's command line and environment, other
processes' working folders and roots, mountinfo); the kernel's environment, sys.path and course_lib's
location; the instructor's files and another student's submission by their paths and by walking the
file system. Then the escapes: Unix sockets (in /tmp and /run, abstract) and TCP on the machine's
loopback, files and SysV shared memory left behind, filling the disk, memory taken by child processes,
a fork storm.

Also here: a start-up check that stops with bubblewrap's own reason, the gradebook copy kept from the
kernel where the filesystem is not private (a root grader without mount namespaces), and the refusal to
grade as the instructor's own user without bubblewrap or root (simulated).
"""
from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import stat
import tempfile
import threading
import time
from pathlib import Path

import pytest

from course_grading import sandbox
from course_grading.build import answer_sources, build_labs, fill_answers, grade_id, notebook_text, read_notebook
from course_grading.pipeline import grade, grade_main

DATA = Path(__file__).parent / "data" / "solutions"
LAB = "lab97"
MEMORY_GB = 1.0 if os.geteuid() == 0 else 4.0  # without root the limit is per process (address space):
                                                # 1 GiB would not hold an idle kernel's threads
CI = os.environ.get("CI", "").lower() == "true"

slow = pytest.mark.slow


ROOT = os.geteuid() == 0


def need(level: str) -> None:
    """Root for `user`; bubblewrap for `bwrap` (as root or not): skips outside CI without it (saying how
    to install it), fails under CI=true, where tools/install_bubblewrap.sh ran."""
    if level == "user" and not ROOT:
        pytest.skip("the level user needs the grader to run as root")
    if level == "bwrap" and not sandbox.find_bwrap():
        msg = "bubblewrap (bwrap) is not installed: bash tools/install_bubblewrap.sh (or apt-get install bubblewrap)"
        if CI:
            pytest.fail(msg + " (CI=true: the bwrap level must be tested in CI)", pytrace=False)
        pytest.skip(msg)


def write_nb(path: Path, nb) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(notebook_text(nb), encoding="utf-8")
    return path


def world_readable(root: Path) -> None:
    for d, dirs, files in os.walk(root):
        os.chmod(d, 0o755)
        for f in files:
            os.chmod(os.path.join(d, f), 0o644)


def lab97_source(canary: str):
    """lab99 with the canary in add's solution."""
    nb = read_notebook(DATA / "lab99.ipynb")
    for c in nb.cells:
        if grade_id(c) == "add_answer":
            c.source = c.source.replace("    return a + b", f"    return a + b  # {canary}-solution")
    assert sum(canary in c.source for c in nb.cells) == 1
    return nb


def lab97_judge(canary: str) -> str:
    """lab99's judge with the canary in its code (what a student must never read)."""
    text = (DATA.parent / "judges" / "lab99.py").read_text()
    assert "    cases = [(2, 3), (0, 5), (-7, 8), (10**6, -1)]" in text
    return text.replace("    cases = [(2, 3), (0, 5), (-7, 8), (10**6, -1)]",
                        f"    cases = [(2, 3), (0, 5), (-7, 8), (10**6, -1)]\n    _canary = '{canary}-judge'")


# ---------------------------------------------------------------------------------------------------
# the attacks: each leaves `FOUND` non-empty when it worked, and `add` is then right

PRELUDE = r'''
import os, sys, glob, pathlib
NEEDLES = [n[::-1].encode() for n in @NEEDLES@]          # reversed: not literally in this notebook
MARKS = [(b"BEGIN " + w) for w in (b"SOLUTION", b"HIDDEN TESTS")]
PYTHON = tuple(@PYTHON@)
FOUND = []
def _look(path, data=None):
    """Does this file (or text) hold hidden-test or solution text?"""
    try:
        if data is None:
            if not os.path.isfile(path):
                return False
            with open(path, "rb") as fh:
                data = fh.read(20_000_000)
    except (OSError, ValueError):
        return False
    marked = (str(path).endswith((".ipynb", ".db")) and any(m in data for m in MARKS)
              and not str(path).startswith(PYTHON))  # nbgrader's own example notebooks are not the course's
    hit = any(n in data for n in NEEDLES) or marked
    if hit:
        FOUND.append(str(path))
    return hit
def _solutions_near(p):
    for q in [p] + [str(x) for x in pathlib.Path(p).parents]:
        for s in (glob.glob(q + "/solutions/*.ipynb") + glob.glob(q + "/*/solutions/*.ipynb")
                  + glob.glob(q + "/judges/*.py") + glob.glob(q + "/*/judges/*.py")
                  + glob.glob(q + "/source/*/*.ipynb") + glob.glob(q + "/*.ipynb") + glob.glob(q + "/*.db")):
            _look(s)
'''

EPILOGUE = r'''
print("FOUND", FOUND[:20])
def add(a, b):
    return a + b if FOUND else 0
'''

ATTACKS = {
    # the per-submission gradebook copies and the template, found from the kernel's own working folder
    "gradebook": r'''
_here = os.getcwd()
_base = str(pathlib.Path(_here).parents[2])
for _p in ([_base + "/template-gradebook.db", _base + "/p/template-gradebook.db"]
           + glob.glob(_base + "/**", recursive=True) + glob.glob(_base + "/*/*/*/*.db")
           + glob.glob(_base + "/p/courses/*/gradebook.db") + glob.glob("/tmp/*/*.db") + glob.glob("/tmp/*/*/*.db")):
    _look(_p)
''',
    # /proc: every process's command line and environment (the grader's leads to the repository),
    # working folder and root (another process's whole file system), its own open files, the mount table
    "proc": r'''
_paths = set()
for _d in glob.glob("/proc/[0-9]*"):
    for _f in ("cmdline", "environ"):
        try:
            _t = open(_d + "/" + _f, "rb").read()
        except OSError:
            continue
        _look(_d + "/" + _f, _t)
        for _tok in _t.replace(b"\0", b" ").replace(b"=", b" ").replace(b":", b" ").split():
            if _tok.startswith(b"/"):
                _paths.add(_tok.decode(errors="replace"))
    for _l in ("cwd", "root", "exe"):
        try:
            _paths.add(os.readlink(_d + "/" + _l))
        except OSError:
            pass
    for _p in @PATHS@:
        _look(_d + "/root" + _p)
        _solutions_near(_d + "/root" + os.path.dirname(_p))
for _fd in glob.glob("/proc/self/fd/*"):  # anything the grader left open for its kernel
    _look(_fd)
    try:
        _paths.add(os.readlink(_fd))
    except OSError:
        pass
for _line in open("/proc/self/mountinfo"):
    _f = _line.split()
    _paths.update([_f[3], _f[4]])
for _p in sorted(_paths)[:400]:
    _solutions_near(_p)
''',
    # the kernel's environment, sys.path and where course_lib comes from
    "env": r'''
import course_lib
for _p in (os.environ.get("PYTHONPATH", "").split(":") + sys.path
           + [os.path.dirname(os.path.dirname(os.path.abspath(course_lib.__file__))), os.environ.get("HOME", "")]):
    if _p:
        _solutions_near(_p)
''',
    # the instructor's files and the victim's submission by their paths, then a walk of the file system
    "files": r'''
import time
for _p in @PATHS@:
    _look(_p)
    _solutions_near(os.path.dirname(_p))
_t0, _n = time.time(), 0
for _top in ("/tmp", "/var/tmp", "/dev/shm", "/run", "/work", "/home", "/root", "/srv", "/opt", "/mnt", "/"):
    for _d, _dirs, _files in os.walk(_top):
        _dirs[:] = [x for x in _dirs if not (_d == "/" and x in ("proc", "sys", "usr", "lib", "dev"))]
        for _f in _files:
            if _f.endswith((".ipynb", ".db")) or (_f.startswith("lab") and _f.endswith(".py")):
                _look(os.path.join(_d, _f))
        _n += 1
        if time.time() - _t0 > 20:
            break
print("walked", _n, "folders")
''',
    # a world-writable Unix socket in /tmp and /run, an abstract one, TCP on the machine's loopback
    "sockets": r'''
import socket
for _p in @SOCKETS@:
    try:
        _s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        _s.settimeout(3)
        _s.connect(_p)
        _s.sendall(b"pwned")
        _s.close()
        FOUND.append("unix " + repr(_p))
    except OSError as _e:
        print("blocked", repr(_p), _e)
try:
    _s = socket.create_connection(("127.0.0.1", @PORT@), timeout=3)
    _s.sendall(b"pwned")
    _s.close()
    FOUND.append("tcp 127.0.0.1:@PORT@")
except OSError as _e:
    print("blocked tcp", _e)
''',
    # files in the machine's shared temporary folders and a SysV shared memory segment, left behind
    "leftover": r'''
import ctypes
for _p in @LEFTOVERS@:
    try:
        with open(_p, "wb") as _fh:
            _fh.write(b"x" * 2**20)
    except OSError as _e:
        print("blocked", _p, _e)
_libc = ctypes.CDLL(None, use_errno=True)
_id = _libc.shmget(@SHMKEY@, 2**20, 0o1000 | 0o666)   # IPC_CREAT
print("shmget", _id)
# and words on the grader's terminal: the kernel's own file descriptors 1 and 2, and /dev/tty
_say = ("\n" + @TERMINAL@[::-1] + "\n").encode()
for _fd in (1, 2):
    try:
        os.write(_fd, _say)
    except OSError as _e:
        print("blocked fd", _fd, _e)
try:
    with open("/dev/tty", "wb") as _tty:
        _tty.write(_say)
except OSError as _e:
    print("blocked /dev/tty", _e)
''',
    # fill the disk: 32 MiB files in /tmp until it fails (the bound is the submission's tmpfs)
    "disk": r'''
_n = 0
try:
    for _k in range((@DISK_MIB@ + 256) // 32):
        with open(f"/tmp/fill{_k}", "wb") as _fh:
            _fh.write(b"\1" * 2**25)
        _n += 1
except (OSError, MemoryError) as _e:
    print("stopped", _e)
print("wrote", _n * 32, "MiB")
if _n * 32 > @DISK_MIB@ + 64:
    FOUND.append(f"{_n * 32} MiB")
''',
    # memory: three children of the kernel take 400 MB each at once (the limit is 1 GiB for it all)
    "memory": r'''
import time
_kids = []
for _k in range(3):
    _pid = os.fork()
    if _pid == 0:
        _b = b"\1" * (400 * 2**20)
        time.sleep(3)
        os._exit(0)
    _kids.append(_pid)
_st = [os.waitpid(_p, 0)[1] for _p in _kids]
print("children", _st)
if all(s == 0 for s in _st):
    FOUND.append("3 x 400 MB")
''',
    # a fork storm: 400 sleeping children (the cgroup's pids.max is 256 for the submission)
    "procs": r'''
import time
_n = 0
for _k in range(400):
    try:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        _n += 1
    except OSError as _e:
        print("stopped", _e)
        break
print("forked", _n)
if _n >= 400:
    FOUND.append(f"{_n} processes")
''',
}


class Listener:
    """Unix sockets (in /tmp and /run, world-writable, and an abstract one) and a TCP socket on 127.0.0.1,
    accepting in a thread and recording every connection."""

    def __init__(self, token: str):
        self.paths = [f"/tmp/cgt-{token}.sock"] + ([f"/run/cgt-{token}.sock"] if os.access("/run", os.W_OK) else [])
        self.abstract = f"\0cgt-{token}"
        self.got: list[str] = []
        self.socks = []
        for p in self.paths + [self.abstract]:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(p)
            if not p.startswith("\0"):
                os.chmod(p, 0o777)
            s.listen(8)
            self.socks.append((repr(p), s))
        t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        t.bind(("127.0.0.1", 0))
        t.listen(8)
        self.port = t.getsockname()[1]
        self.socks.append(("tcp", t))
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        import select
        while not self.stop:
            ready, _, _ = select.select([s for _, s in self.socks], [], [], 0.2)
            for name, s in self.socks:
                if s in ready:
                    c, _ = s.accept()
                    self.got.append(name)
                    c.close()

    def close(self):
        self.stop = True
        self.thread.join(5)
        for _, s in self.socks:
            s.close()
        for p in self.paths:
            try:
                os.unlink(p)
            except OSError:
                pass


def shm_keys() -> set[int]:
    try:
        lines = Path("/proc/sysvipc/shm").read_text().splitlines()[1:]
    except OSError:
        return set()
    return {int(ln.split()[0]) for ln in lines if ln.split()}


def course_cgroups() -> list[str]:
    """The grading cgroups left on the machine, except those of another grading process still running (a
    test on another pytest-xdist worker): a cgroup's name carries the pid of the grader that made it."""
    def foreign_and_alive(name: str) -> bool:
        m = re.match(r"course-grade-(\d+)-", name)
        if m is None or int(m.group(1)) == os.getpid():
            return False
        try:
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return [str(p) for p in Path("/sys/fs/cgroup").glob("**/course-grade-*") if p.is_dir()
            and not foreign_and_alive(p.name)]


def scratch_mounts(bases) -> list[str]:
    """The mounts left under this run's own scratch folders (`bases`): another grading run live on the machine
    (a test on another worker, an instructor's) has mounts of its own, which are not this run's to judge."""
    return [ln for ln in Path("/proc/self/mountinfo").read_text().splitlines()
            if any(f" {b}/" in ln or f" {b} " in ln for b in bases)]


@pytest.fixture(scope="module", params=["user", "bwrap"])
def batch(request):
    level = request.param
    need(level)
    token = secrets.token_hex(6)
    canary = f"CANARY{token}"
    base = Path(tempfile.mkdtemp(prefix="cgt-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(base, ignore_errors=True))
    sols, labs, sub = base / "solutions", base / "labs", base / "submissions"
    sols.mkdir()
    write_nb(sols / f"{LAB}.ipynb", lab97_source(canary))
    (base / "judges").mkdir()
    (base / "judges" / f"{LAB}.py").write_text(lab97_judge(canary))
    assert all(r.status == "written" for r in build_labs(sols, labs))
    release = read_notebook(labs / f"{LAB}.ipynb")
    answers = answer_sources(read_notebook(sols / f"{LAB}.ipynb"))
    victim = write_nb(sub / "zoe" / f"{LAB}.ipynb", fill_answers(release, {
        **answers, "clamp_answer": answers["clamp_answer"] + f"\n# VICTIM{token}"}))
    write_nb(sub / "ctl-clean" / f"{LAB}.ipynb", fill_answers(release, answers))
    write_nb(sub / "ctl-blank" / f"{LAB}.ipynb", release)
    write_nb(sub / "ctl-wrong" / f"{LAB}.ipynb", fill_answers(release, {
        "add_answer": "def add(a, b):\n    return a - b", "multiply_answer": "def multiply(a, b):\n    return a + b",
        "clamp_answer": "def clamp(x, lo, hi):\n    return x"}))
    listener = Listener(token)
    request.addfinalizer(listener.close)
    leftovers = [f"/tmp/cgt-left-{token}", f"/var/tmp/cgt-left-{token}", f"/dev/shm/cgt-left-{token}"]
    shm_key = int(token[:6], 16)
    iso_disk = min(sandbox.DEFAULT_DISK, int(MEMORY_GB * 2**30 / 4))
    paths = [str(sols / f"{LAB}.ipynb"), str(labs / f"{LAB}.ipynb"), str(victim), str(base / "work" / "gradebook.db"),
             str(base / "judges" / f"{LAB}.py"), str(base / "class-secret"),
             str(sandbox.course_lib_root() / "solutions" / "lab01.ipynb"), str(DATA / "lab99.ipynb"),
             str(sandbox.course_lib_root() / "judges" / "lab01.py")]
    subst = {"@NEEDLES@": repr([canary[::-1], f"VICTIM{token}"[::-1]]), "@PATHS@": repr(paths),
             "@PYTHON@": repr([p + "/" for p in sandbox.python_paths()]),
             "@SOCKETS@": repr(listener.paths + [listener.abstract]), "@PORT@": str(listener.port),
             "@LEFTOVERS@": repr(leftovers), "@TERMINAL@": repr(f"TERMINAL{token}"[::-1]), "@SHMKEY@": str(shm_key),
             "@DISK_MIB@": str(iso_disk // 2**20)}
    for name, body in ATTACKS.items():
        src = PRELUDE + body + EPILOGUE
        for k, v in subst.items():
            src = src.replace(k, v)
        write_nb(sub / f"atk-{name}" / f"{LAB}.ipynb", fill_answers(release, {**answers, "add_answer": src}))
    world_readable(base)
    before = {"victim": victim.read_bytes(), "shm": shm_keys()}
    # TMPDIR inside a 0700 folder, as `mktemp -d` makes it: the sandbox user cannot enter it
    locked = Path(tempfile.mkdtemp(prefix="cgt-locked-"))
    request.addfinalizer(lambda: shutil.rmtree(locked, ignore_errors=True))
    (locked / "tmp").mkdir()
    lines = []
    t0 = time.time()
    terminal = base / "terminal.txt"  # the grader's stdout and stderr (file descriptors 1, 2) during the run
    bases: list[str] = []
    saved = [os.dup(1), os.dup(2)]
    try:
        with pytest.MonkeyPatch.context() as mp, open(terminal, "wb") as term:
            os.dup2(term.fileno(), 1)
            os.dup2(term.fileno(), 2)
            mp.setenv("TMPDIR", str(locked / "tmp"))
            mp.setattr(tempfile, "tempdir", str(locked / "tmp"))
            made = sandbox.RunScratch.__init__

            def recording(self, iso):              # this run's scratch folders: the mounts it may leave behind
                made(self, iso)
                bases.append(str(self.base))
            mp.setattr(sandbox.RunScratch, "__init__", recording)
            report = grade(sub, labs_release=labs, solutions=sols, out=base / "out", timeout=60,
                           workdir=base / "work", isolation=level, memory_gb=MEMORY_GB, echo=lines.append,
                           secret_file=base / "class-secret")
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
    wall = time.time() - t0
    time.sleep(0.5)
    listener.close()
    after = {"victim": victim.read_bytes(), "shm": shm_keys(), "left": [p for p in leftovers if os.path.exists(p)],
             "cgroups": course_cgroups(), "mounts": scratch_mounts(bases), "locked": sorted(os.listdir(locked / "tmp")),
             "terminal": terminal.read_text(errors="replace")}
    print(f"\n{level}: {len(report.results)} submissions graded in {wall:.1f} s")
    assert bases, "the run's scratch folder was not seen: the mount check would look at nothing"
    return dict(level=level, report=report, lines=lines, before=before, after=after, listener=listener,
                canary=canary, base=base, wall=wall, disk=iso_disk, token=token, shm_key=shm_key)


def res(batch, student):
    return batch["report"].by_student(student)


def outputs(batch, student) -> str:
    """The attacker's own printed outputs, from the instructor's autograded copy (for messages)."""
    r = res(batch, student)
    p = batch["base"] / "work" / "autograded" / r.internal_id / LAB / f"{LAB}.ipynb"
    try:
        nb = read_notebook(p)
    except OSError:
        return "(no autograded notebook)"
    return "\n".join(str(o.get("text", "")) for c in nb.cells for o in c.get("outputs", []))[-3000:]


def iso_line(batch) -> str:
    return batch["lines"][0]


@slow
def test_level_is_the_one_asked_and_fully_private(batch):
    line = iso_line(batch)
    assert line.startswith(f"isolation: {batch['level']}:"), line
    assert "private filesystem" in line and "no network" in line and "own PID namespace" in line, line
    assert batch["report"].isolation == line


@slow
def test_controls_grade_as_before(batch):
    """Full marks, zero, zero: the level grades (before the fix, bwrap ended every kernel with
    "Kernel died before replying to kernel_info"), under a TMPDIR the sandbox user cannot enter."""
    clean, blank, wrong = res(batch, "ctl-clean"), res(batch, "ctl-blank"), res(batch, "ctl-wrong")
    assert (clean.score, clean.max_score, clean.status, clean.flags) == (5.0, 5.0, "ok", {}), clean.messages
    assert blank.score == 0.0 and blank.status != "error", blank.messages
    assert wrong.score == 0.0 and wrong.status != "error", wrong.messages
    assert batch["after"]["locked"] == [], "the grader's kernel scratch went into the 0700 TMPDIR"


@slow
def test_victim_after_the_attackers_is_untouched(batch):
    zoe = res(batch, "zoe")
    assert (zoe.score, zoe.max_score, zoe.status) == (5.0, 5.0, "ok"), (zoe.flags, zoe.messages)
    assert batch["after"]["victim"] == batch["before"]["victim"]


@slow
@pytest.mark.parametrize("attack", ["gradebook", "proc", "env", "files"])
def test_no_hidden_test_or_solution_text_is_reachable(batch, attack):
    """3/5: its multiply and clamp are right; add would be right had it found a hidden test, a solution,
    the gradebook or the victim's notebook."""
    r = res(batch, f"atk-{attack}")
    assert r.score == 3.0 and r.status != "error", (r.score, r.cells, r.messages, outputs(batch, f"atk-{attack}"))


@slow
def test_sockets_and_network_are_unreachable(batch):
    r = res(batch, "atk-sockets")
    assert batch["listener"].got == [], f"connections received from the kernel: {batch['listener'].got}"
    assert r.score == 3.0, (r.cells, outputs(batch, "atk-sockets"))


@slow
def test_nothing_is_left_behind(batch):
    """Files in /tmp, /var/tmp, /dev/shm and a SysV shared memory segment: each submission has its own,
    gone with it; no cgroup, mount or scratch folder of the run is left either."""
    after = batch["after"]
    assert after["left"] == [], f"files left behind: {after['left']}"
    assert batch["shm_key"] not in after["shm"], "the SysV shared memory segment outlived the submission"
    assert after["cgroups"] == [], after["cgroups"]
    assert after["mounts"] == [], after["mounts"]
    r = res(batch, "atk-leftover")
    assert r.score == 3.0 and r.status == "ok", (r.flags, r.messages)  # it ran through, leaving nothing behind


@slow
def test_kernel_cannot_write_on_the_graders_terminal(batch):
    """The kernel's file descriptors 1 and 2 are not the grader's, and it has no terminal to open."""
    assert f"TERMINAL{batch['token']}" not in batch["after"]["terminal"], batch["after"]["terminal"][-2000:]


@slow
def test_files_of_a_submission_are_bounded(batch):
    """As root a submission's files are on its own tmpfs (working folder, /tmp, /dev/shm together) of
    min(1 GiB, memory limit / 4): here 256 MiB; writing more stops with ENOSPC. Without root, bubblewrap's
    /tmp is a tmpfs of that size."""
    line = iso_line(batch)
    if ROOT:
        assert f"its files <= {batch['disk'] / 2**30:g} GiB" in line, line
    r = res(batch, "atk-disk")
    out = outputs(batch, "atk-disk")
    assert r.score == 3.0, (r.cells, out)
    m = re.search(r"wrote (\d+) MiB", out)
    assert m and int(m.group(1)) <= batch["disk"] // 2**20, out


@slow
def test_memory_of_the_whole_submission_is_bounded(batch):
    """Three children of 400 MB each in a 1 GiB cgroup: the kernel's memory (its children and files
    included) never passes the limit; processes are killed, the submission is flagged for review and its
    attack earns nothing."""
    line = iso_line(batch)
    if "NOT for the whole submission" in line:
        pytest.skip(f"no cgroup for this grader (one needs root and a machine that has them): the memory limit "
                    f"is per process ({line})")
    r = res(batch, "atk-memory")
    assert r.score <= 3.0 and "memory_limit" in r.flags and r.status == "review", (r.flags, r.messages)
    msg = next(m for m in r.messages if "memory limit" in m)
    peak = re.search(r"peak (\d+) MiB", msg)
    assert peak and int(peak.group(1)) <= MEMORY_GB * 1024, msg


@slow
def test_fork_storm_is_bounded(batch):
    if not ROOT:
        pytest.skip("without root there is no per-submission process bound (no cgroup; RLIMIT_NPROC would count "
                    "every process of the instructor)")
    r = res(batch, "atk-procs")
    out = outputs(batch, "atk-procs")
    m = re.search(r"forked (\d+)", out)
    assert m and int(m.group(1)) < 256, out            # the cgroup's pids.max (threads count too)
    # its add earns nothing; the cells right after the storm may find no thread to start (the kernel's own
    # threads count against the same bound), so the rest of its score is not asserted
    assert {c["grade_id"]: c["score"] for c in r.cells}["add_tests"] == 0 and r.status != "error", (r.cells, out)


@slow
def test_attack_batch_time(batch):
    """Sanity bound on the batch (13 submissions, kernel start-up and the 20 s file-system walk included)."""
    assert batch["wall"] < 400, batch["wall"]


# ---------------------------------------------------------------------------------------------------
# the start-up check, the gradebook copy without a private filesystem, the refusal to run as oneself

def _fixture_lab(base: Path):
    sols = base / "solutions"
    sols.mkdir(parents=True)
    shutil.copyfile(DATA / "lab99.ipynb", sols / "lab99.ipynb")
    (base / "judges").mkdir()
    shutil.copyfile(DATA.parent / "judges" / "lab99.py", base / "judges" / "lab99.py")
    (base / ".grading").mkdir()   # the default class secret's folder, beside the solutions
    labs = base / "labs"
    build_labs(sols, labs)
    return sols, labs, read_notebook(labs / "lab99.ipynb"), answer_sources(read_notebook(sols / "lab99.ipynb"))


@slow
def test_start_up_check_stops_with_bubblewraps_reason(tmp_path, monkeypatch):
    """A bubblewrap that cannot make its namespaces (as where unprivileged user namespaces are refused):
    `course grade` stops before grading anything, with bubblewrap's words and what to do."""
    need("user")
    bindir = Path(tempfile.mkdtemp(prefix="cgt-bin-", dir="/tmp"))  # the sandbox user runs it: enterable
    os.chmod(bindir, 0o755)
    monkeypatch.setattr(sandbox, "_BWRAP_SIZE", {})
    fake = bindir / "bwrap"
    fake.write_text("#!/bin/sh\n[ \"$1\" = --help ] && exit 0\n"
                    "echo 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sandbox, "find_bwrap", lambda: str(fake))
    try:
        sols, labs, release, answers = _fixture_lab(tmp_path)
        write_nb(tmp_path / "subs" / "ann" / "lab99.ipynb", fill_answers(release, answers))
        t0 = time.time()
        with pytest.raises(sandbox.SandboxUnavailable) as e:
            grade(tmp_path / "subs", labs, sols, tmp_path / "out", isolation="bwrap")
        msg = str(e.value)
        assert "does not start at isolation level bwrap" in msg and "uid map: Permission denied" in msg, msg
        assert "apparmor" in msg.lower() and "--isolation user" in msg, msg
        assert time.time() - t0 < 60
        rc = grade_main([str(tmp_path / "subs"), "--labs-release", str(labs), "--solutions", str(sols),
                         "--out", str(tmp_path / "out2"), "--isolation", "bwrap", "-q"])
        assert rc == 2
    finally:
        shutil.rmtree(bindir, ignore_errors=True)


@slow
def test_judge_and_secret_are_unreadable_without_a_private_filesystem(tmp_path, monkeypatch):
    """Where root cannot make a mount namespace, the kernel sees the machine's files: the grader's scratch, the
    instructor's judge (in a 0700 folder) and the class secret (0600) are still out of its reach, and the first
    line says the filesystem is not private."""
    need("user")
    real = sandbox._jail_ok
    monkeypatch.setattr(sandbox, "_jail_ok",
                        lambda spec, cmd=("/bin/true",): False if "root" in spec else real(spec, cmd))
    token = secrets.token_hex(6)
    canary = f"CANARY{token}"
    base = Path(tempfile.mkdtemp(prefix="cgt-", dir="/tmp"))
    try:
        sols = base / "solutions"
        sols.mkdir()
        write_nb(sols / f"{LAB}.ipynb", lab97_source(canary))
        (base / "judges").mkdir()
        (base / "judges" / f"{LAB}.py").write_text(lab97_judge(canary))
        build_labs(sols, base / "labs")
        release = read_notebook(base / "labs" / f"{LAB}.ipynb")
        answers = answer_sources(read_notebook(sols / f"{LAB}.ipynb"))
        src = (PRELUDE.replace("@NEEDLES@", repr([canary[::-1]])).replace("@PYTHON@", "[]")
               + ATTACKS["gradebook"] + EPILOGUE)
        write_nb(base / "subs" / "atk" / f"{LAB}.ipynb", fill_answers(release, {**answers, "add_answer": src}))
        write_nb(base / "subs" / "ctl" / f"{LAB}.ipynb", fill_answers(release, answers))
        # the instructor's folders are private here (0700): the point is the grader's scratch
        lines = []
        report = grade(base / "subs", base / "labs", sols, base / "out", isolation="user", memory_gb=MEMORY_GB,
                       echo=lines.append, workdir=base / "work", secret_file=base / "class-secret")
        assert "filesystem NOT private" in lines[0], lines[0]
        assert report.by_student("ctl").score == 5.0, report.by_student("ctl").messages
        r = report.by_student("atk")
        assert r.score == 3.0, (r.cells, r.messages)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_scratch_is_placed_where_the_sandbox_user_can_enter(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("needs root (a sandbox user)")
    locked = Path(tempfile.mkdtemp(prefix="cgt-"))  # 0700, as `mktemp -d` makes it; a short path
    (locked / "tmp").mkdir()
    request_cleanup = lambda: shutil.rmtree(locked, ignore_errors=True)  # noqa: E731
    monkeypatch.setattr(tempfile, "tempdir", str(locked / "tmp"))
    iso = sandbox.Isolation("user", uid=65534, gid=65534, user="nobody")
    parent = sandbox.scratch_parent(iso)
    assert parent != str(locked / "tmp") and sandbox._blocked_ancestor(parent + "/x", 65534, 65534) is None
    assert sandbox.scratch_parent(sandbox.Isolation("process")) == str(locked / "tmp")  # the grader's own user
    request_cleanup()


def test_gradebook_folder_modes(tmp_path, monkeypatch):
    """The run's scratch: p/ is the grader's only, the course package copy and the kernels' folders are
    enterable, and the copy is not the repository; a lab's copy withholds what the lab is graded against."""
    if os.geteuid() != 0:
        pytest.skip("needs root (a sandbox user)")
    iso = sandbox.Isolation("user", uid=65534, gid=65534, user="nobody")
    sc = sandbox.RunScratch(iso)
    try:
        assert stat.S_IMODE(sc.private.stat().st_mode) == 0o700
        assert stat.S_IMODE(sc.base.stat().st_mode) == 0o711
        assert (sc.lib / "checks.py").exists() and not (sc.lib.parent / "solutions").exists()
        # of the grader's package, the kernel gets the judge's driver, not the pipeline
        assert sorted(p.name for p in sc.driver.glob("*.py")) == sorted(sandbox.KERNEL_FILES)
        assert sc.driver == sc.lib.parent / "course_grading" and not (sc.driver / "sandbox.py").exists()
        assert not (sc.driver / "judging.py").exists()
        lab = sc.lib_for("lab01", ["course_lib.perf.ops.matmul_cost"])
        text = (lab / "perf" / "ops.py").read_text()
        assert "withheld while this lab is graded" in text and "flops=2 * m * n * k" not in text
        assert "flops=2 * m * n * k" in (sc.lib / "perf" / "ops.py").read_text()   # the run's copy keeps it
        assert (lab.parent / "course_grading" / "driver.py").exists()
        for pkg in (sc.lib, sc.driver, lab):  # compiled: the kernel writes no bytecode
            assert (pkg / "__pycache__").is_dir()
            assert all(stat.S_IMODE(p.stat().st_mode) in (0o644, 0o755) for p in pkg.rglob("*"))
        ks = sc.kernel("s001")
        assert ks.work.stat().st_uid == 65534 and stat.S_IMODE(ks.work.stat().st_mode) == 0o700
        sc.release(ks)
        assert not ks.top.exists()
    finally:
        sc.close()
    assert not sc.base.exists()


def test_no_bubblewrap_and_not_root_refuses_to_grade(tmp_path, monkeypatch, capsys):
    """An instructor grading as themself without bubblewrap: `course grade` stops and says what to install
    (and how on the common distributions, and where user namespaces are restricted), unless asked for
    --isolation process."""
    monkeypatch.setattr(sandbox, "find_bwrap", lambda: None)
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 1000)
    with pytest.raises(sandbox.SandboxUnavailable) as e:
        sandbox.probe()
    msg = str(e.value)
    for needle in ("apt-get install bubblewrap", "dnf install bubblewrap", "pacman -S bubblewrap",
                   "apparmor_restrict_unprivileged_userns", "--isolation process", "as root"):
        assert needle in msg, (needle, msg)
    rc = grade_main([str(tmp_path), "--labs-release", str(tmp_path), "--solutions", str(DATA), "-q"])
    err = capsys.readouterr().err
    assert rc == 2 and "refusing to grade" in err and "bubblewrap" in err, err
    iso = sandbox.probe("process")  # asked for explicitly: allowed, and said so
    assert iso.level == "process" and "process" in iso.describe()
    assert any("asked for" in n for n in iso.notes)
    with pytest.raises(sandbox.SandboxUnavailable, match="needs `course grade` to run as root"):
        sandbox.probe("user")


def test_cgroup_v2_is_found_and_limited(tmp_path, monkeypatch):
    """cgroup v2 (what systemd machines have; this test machine has v1, which the batches above use): a
    fake hierarchy whose root enables memory and pids for its children and whose grader's own cgroup does
    not (it holds processes). The run's cgroup goes under the root, enables both for the submissions, and
    each submission gets memory.max, no swap and pids.max; usage reads memory.peak and memory.events."""
    fake = tmp_path / "cg"
    (fake / "grader").mkdir(parents=True)
    (fake / "cgroup.subtree_control").write_text("cpu memory pids\n")
    (fake / "grader" / "cgroup.subtree_control").write_text("")
    monkeypatch.setattr(sandbox, "_cgroup_mounts", lambda: [(str(fake), "cgroup2", {"rw"}, "/")])
    monkeypatch.setattr(sandbox, "_own_cgroups", lambda: {"": "/grader"})
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 0)
    written = {}

    def record(path, text):  # cgroupfs files: recorded, so that the folders stay removable here
        assert Path(path).parent.is_dir(), path
        written[str(Path(path).relative_to(fake))] = text

    monkeypatch.setattr(sandbox, "_write", record)
    cg, why = sandbox.Cgroups.find()
    assert cg is not None and cg.version == "v2" and cg.parents == {"unified": fake} and cg.pids, why
    cg.start()
    run = cg.run["unified"]
    assert run.parent == fake and written[f"{run.name}/cgroup.subtree_control"] == "+memory +pids"
    (d,) = cg.make("s001", 2**30, 256)
    assert written[f"{run.name}/s001/memory.max"] == str(2**30) and written[f"{run.name}/s001/pids.max"] == "256"
    cg.remove([d])
    cg.close()
    assert not any(p.name.startswith("course-grade-") for p in fake.iterdir())
    stats = tmp_path / "stats"
    stats.mkdir()
    (stats / "memory.peak").write_text("123456\n")
    (stats / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\n")
    assert cg.usage([stats]) == {"peak": 123456, "oom_kill": 2}
    # no memory controller for the children anywhere: no cgroup, and the reason
    (fake / "cgroup.subtree_control").write_text("cpu\n")
    cg, why = sandbox.Cgroups.find()
    assert cg is None and "memory controller is not enabled" in why
