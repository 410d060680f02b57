"""Root pytest configuration: offline, quick mode for every test and notebook, and a per-notebook time report."""
import os
import time
from collections import defaultdict

os.environ.setdefault("COURSE_QUICK", "1")
os.environ.setdefault("COURSE_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

_notebook_seconds: dict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report):
    if report.when == "call" and report.nodeid.endswith(".ipynb") is False and ".ipynb::" in report.nodeid:
        _notebook_seconds[report.nodeid.split("::")[0]] += report.duration


def pytest_terminal_summary(terminalreporter):
    if _notebook_seconds:
        terminalreporter.section("notebook execution times (CPU quick mode)")
        for nb, secs in sorted(_notebook_seconds.items()):
            terminalreporter.write_line(f"{secs:7.1f} s  {nb}")
