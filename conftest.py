"""Root pytest configuration: offline, quick mode for every test and notebook, and a per-notebook time
budget: each notebook must run in COURSE_NOTEBOOK_BUDGET_S seconds (default 120, the course's promise
of "two minutes per notebook on a 2-core CPU"); one that takes longer fails the run, named."""
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
