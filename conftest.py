"""Root pytest configuration: offline, quick mode for every test and notebook; the notebooks as tests; and a
per-notebook budget.

Each notebook directly in notebooks/ is one test item: it runs as committed through nbclient (the one
executor, tools/nbexec.py, which the site's build uses too), and a failure shows the failing cell's source
and traceback. A notebook that runs through leaves its executed copy, widget state included, in
build/executed/ (under pytest's rootdir), from which `make site` builds the course's pages.

The budget. Each notebook may use COURSE_NOTEBOOK_BUDGET_S seconds of CPU time (default 120, the course's
promise of "two minutes per notebook on a 2-core CPU"): the user + system time of its kernel and of every
process the kernel started (gloo ranks, their fork server, compilers). One that uses more fails the run,
named. CPU time, not wall time, because a machine busy with other work (a shared CI runner, other jobs
beside the tests) stretches a notebook's wall time several-fold while the work it does stays the same; the
terminal summary shows both. On a quiet machine a notebook within the budget computes for at most two
minutes of wall time (less where it keeps both cores busy), plus whatever it spends waiting (sleeps, I/O).

One more thing a busy machine does: PyTorch's CPU threads (OpenMP, one per core) busy-wait for each other
at the end of every parallel operation. When another job holds a core, the waiting thread burns its time
slice while the thread it waits for is not running. Measured on a 2-core machine beside two busy loops:
all notebooks took 457 s of wall time (notebook 05: 68 s wall, 66 s CPU) with the default wait policy and
199 s (05: 23 s wall, 20 s CPU) with OMP_WAIT_POLICY=PASSIVE, where a waiting thread sleeps; on the quiet
machine PASSIVE costs about 20% of wall time in the notebooks that keep both cores busy (04, 05: 16 -> 19
and 19 -> 24 s) and leaves CPU time unchanged. So the tests set it unless OMP_WAIT_POLICY is set already
(set ACTIVE on a machine that runs nothing else); it also keeps the CPU-time budget independent of the load."""
import os
import threading
from collections import defaultdict

import pytest

try:
    import resource
except ImportError:   # not on Windows: the budget falls back to wall time there
    resource = None

os.environ.setdefault("COURSE_QUICK", "1")
os.environ.setdefault("COURSE_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # before torch is imported here or in a kernel (see above)

_notebook_seconds: dict[str, float] = defaultdict(float)   # wall: setup + call + teardown
_notebook_cpu: dict[str, float] = {}                        # CPU seconds of the kernel's process tree


def notebook_budget_s() -> float:
    """COURSE_NOTEBOOK_BUDGET_S: the CPU seconds one notebook may use (default 120)."""
    raw = os.environ.get("COURSE_NOTEBOOK_BUDGET_S", "120")
    try:
        budget = float(raw)
    except ValueError:
        raise pytest.UsageError(f"COURSE_NOTEBOOK_BUDGET_S must be a number of seconds, got {raw!r}") from None
    if budget <= 0:
        raise pytest.UsageError(f"COURSE_NOTEBOOK_BUDGET_S must be > 0, got {raw!r}")
    return budget


def children_cpu_s() -> float | None:
    """User + system seconds of this process's children that have exited and been waited for, each with its
    own waited-for children: a notebook's kernel, and what it ran, once nbclient has shut it down."""
    if resource is None:
        return None
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class KernelTreeCPU:
    """CPU seconds of a notebook's kernel and everything it started, sampled while it runs.

    The kernel is this process's child: once it has exited and been waited for, its user + system time and
    that of the descendants it waited for are in this process's RUSAGE_CHILDREN (exact). A process it did
    not wait for escapes that count: ipykernel terminates its children at shutdown without waiting for
    them, and the client kills a kernel that takes longer than 5 s to go, so a fork server (with the gloo
    ranks it waited for) or a resource tracker ends as an orphan of init. So a thread also samples the tree
    (psutil) every `interval` seconds: the kernel and each live descendant, its own time plus that of the
    children it waited for. The result is the larger of the two (each is a lower bound of the truth; the
    sample misses at most the last `interval` and processes shorter than it)."""

    def __init__(self, interval: float = 0.25):
        self.interval, self.sampled, self._stop = interval, 0.0, threading.Event()
        self._known = set()

    def __enter__(self):
        self._rusage0, self._thread = children_cpu_s(), None
        try:
            import psutil
        except ImportError:                    # no sampling: the kernel and what it waited for
            return self
        self._me = psutil.Process()
        self._known = {c.pid for c in self._me.children()}
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        import psutil
        total = 0.0
        for kernel in self._me.children():
            if kernel.pid in self._known:      # not started by this notebook
                continue
            try:
                for p in [kernel, *kernel.children(recursive=True)]:
                    t = p.cpu_times()
                    total += t.user + t.system + t.children_user + t.children_system
            except psutil.Error:               # exited between the listing and the reading
                return
        self.sampled = max(self.sampled, total)

    def _run(self):
        while not self._stop.wait(self.interval):
            self._sample()

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.seconds = max(children_cpu_s() - self._rusage0, self.sampled)
        return False


def budgeted_seconds(wall: dict[str, float], cpu: dict[str, float]) -> dict[str, float]:
    """What the budget is checked against, per notebook: its CPU seconds, or its wall seconds where no CPU
    time was measured (no `resource` module)."""
    return {nb: cpu.get(nb, w) for nb, w in wall.items()}


def over_budget(wall: dict[str, float], cpu: dict[str, float], budget: float) -> dict[str, float]:
    """The notebooks whose budgeted seconds exceed `budget`, with those seconds."""
    return {nb: s for nb, s in budgeted_seconds(wall, cpu).items() if s > budget}


def pytest_configure(config):
    notebook_budget_s()   # a bad value is refused before anything runs
    config.addinivalue_line("markers", "notebook: executes a notebook (each notebook in notebooks/ is one)")


def pytest_collect_file(file_path, parent):
    # only the course's notebooks: not build/executed/ copies, checkpoints or test data
    if file_path.suffix == ".ipynb" and file_path.parent == parent.config.rootpath / "notebooks":
        return NotebookFile.from_parent(parent, path=file_path)
    return None


class NotebookFile(pytest.File):
    def collect(self):
        yield NotebookItem.from_parent(self, name="execute")


class NotebookItem(pytest.Item):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_marker("notebook")

    def runtest(self):
        from tools import nbexec
        if resource is None:   # no CPU accounting here: the budget falls back to wall time
            nbexec.execute_notebook(self.path, self.config.rootpath / "build" / "executed")
            return
        try:
            with KernelTreeCPU() as cpu:
                nbexec.execute_notebook(self.path, self.config.rootpath / "build" / "executed")
        finally:   # a failed notebook's time is reported too; through the report, so that under pytest-xdist
            # the controller (which prints the table and checks the budget) gets it from the worker
            self.user_properties.append(("notebook_cpu_s", cpu.seconds))

    def repr_failure(self, excinfo, style=None):
        from tools import nbexec
        if isinstance(excinfo.value, nbexec.NotebookFailed):
            return str(excinfo.value)   # the cell and its traceback, not nbclient's internals
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, f"{self.path.name} (executed)"


def pytest_runtest_logreport(report):
    if ".ipynb::" in report.nodeid and report.when in ("setup", "call", "teardown"):
        _notebook_seconds[report.nodeid.split("::")[0]] += report.duration
        for key, value in report.user_properties:
            if key == "notebook_cpu_s":
                _notebook_cpu[report.nodeid.split("::")[0]] = value


def _over_budget() -> dict[str, float]:
    return over_budget(_notebook_seconds, _notebook_cpu, notebook_budget_s())


def pytest_terminal_summary(terminalreporter):
    if _notebook_seconds:
        budget = notebook_budget_s()
        kind = "CPU" if _notebook_cpu else "wall"
        terminalreporter.section(f"notebook execution times (CPU quick mode; budget {budget:.0f} {kind} seconds each)")
        terminalreporter.write_line(f"{'wall s':>8}{'CPU s':>8}  notebook")
        over = _over_budget()
        for nb, secs in sorted(_notebook_seconds.items()):
            cpu = f"{_notebook_cpu[nb]:8.1f}" if nb in _notebook_cpu else f"{'-':>8}"
            terminalreporter.write_line(f"{secs:8.1f}{cpu}  {nb}{'  OVER BUDGET' if nb in over else ''}")
        if over:
            names = ", ".join(f"{nb} ({s:.0f} s)" for nb, s in sorted(over.items()))
            terminalreporter.write_line(f"FAILED: over the {budget:.0f} {kind}-second budget per notebook: {names} "
                                        "(the run's exit status is 1)", red=True, bold=True)


def pytest_sessionfinish(session, exitstatus):
    if _over_budget() and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED   # reported in the summary section above
