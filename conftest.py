"""Root pytest configuration: offline, quick mode for every test and notebook; the notebooks as tests; and a
per-notebook time budget.

Each notebook directly in notebooks/ is one test item: it runs as committed through nbclient (the one
executor, tools/nbexec.py, which the site's build uses too), and a failure shows the failing cell's source
and traceback. A notebook that runs through leaves its executed copy, widget state included, in
build/executed/ (under pytest's rootdir), from which `make site` builds the course's pages.

Each notebook must run in COURSE_NOTEBOOK_BUDGET_S seconds (default 120, the course's promise of "two
minutes per notebook on a 2-core CPU"); one that takes longer fails the run, named."""
import os
from collections import defaultdict

import pytest

os.environ.setdefault("COURSE_QUICK", "1")
os.environ.setdefault("COURSE_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

_notebook_seconds: dict[str, float] = defaultdict(float)


def notebook_budget_s() -> float:
    raw = os.environ.get("COURSE_NOTEBOOK_BUDGET_S", "120")
    try:
        budget = float(raw)
    except ValueError:
        raise pytest.UsageError(f"COURSE_NOTEBOOK_BUDGET_S must be a number of seconds, got {raw!r}") from None
    if budget <= 0:
        raise pytest.UsageError(f"COURSE_NOTEBOOK_BUDGET_S must be > 0, got {raw!r}")
    return budget


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
        nbexec.execute_notebook(self.path, self.config.rootpath / "build" / "executed")

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


def _over_budget() -> dict[str, float]:
    budget = notebook_budget_s()
    return {nb: s for nb, s in _notebook_seconds.items() if s > budget}


def pytest_terminal_summary(terminalreporter):
    if _notebook_seconds:
        budget = notebook_budget_s()
        terminalreporter.section(f"notebook execution times (CPU quick mode; budget {budget:.0f} s each)")
        for nb, secs in sorted(_notebook_seconds.items()):
            flag = "  OVER BUDGET" if secs > budget else ""
            terminalreporter.write_line(f"{secs:7.1f} s  {nb}{flag}")
        over = _over_budget()
        if over:
            names = ", ".join(f"{nb} ({s:.0f} s)" for nb, s in sorted(over.items()))
            terminalreporter.write_line(f"FAILED: over the {budget:.0f} s budget per notebook: {names} "
                                        "(the run's exit status is 1)", red=True, bold=True)


def pytest_sessionfinish(session, exitstatus):
    if _over_budget() and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED   # reported in the summary section above
