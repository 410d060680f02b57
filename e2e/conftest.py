"""The browser tier: Playwright drives Debian's Chromium (never a browser Playwright downloads itself).

Run with `make browser-test` (installs Chromium when missing), or `python -m pytest e2e` once it is there.
Without Chromium or Playwright the tests skip, saying how to install them, except under CI=true, where
they fail. On a failure, a screenshot and the page's console log go to build/browser-artifacts/.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from pagecheck import ARTIFACTS, ROOT, PageLog, skip_or_fail

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
INSTALL_HINT = "bash tools/install_chromium.sh (or make browser-test)"
# Known to work headless as root in a container; the last four keep Chromium from calling home.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="session")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        skip_or_fail("Playwright is not installed: pip install -e '.[dev]' (it is in the dev extra)")
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        skip_or_fail(f"no Chromium at {CHROMIUM}: install Debian's with {INSTALL_HINT}, "
                     "or point CHROMIUM at another Chromium binary")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, f"report_{report.when}", report)   # the page fixture reads it to keep artifacts
    return report


@pytest.fixture
def page(browser, request):
    """A fresh page whose console and requests are logged (see pagecheck.PageLog); on failure its
    screenshot and log are written to build/browser-artifacts/<test>.png / .log."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    pg.log = PageLog(pg)
    yield pg
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        stem = ARTIFACTS / re.sub(r"[^\w.-]+", "_", request.node.name)
        try:
            pg.screenshot(path=f"{stem}.png")
        except Exception as exc:   # a crashed page still gets its log
            pg.log.console.append(f"(no screenshot: {exc})")
        Path(f"{stem}.log").write_text(f"{request.node.nodeid}\n{pg.url}\n{pg.log.text()}")
    context.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JupyterLab:
    def __init__(self, url: str, token: str):
        self.url, self.token = url, token

    def api(self, path: str, method: str = "GET") -> bytes:
        req = urllib.request.Request(f"{self.url}{path}", method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.read()

    def notebook_url(self, name: str) -> str:
        # ?reset: a clean workspace, not the tabs the previous test left open
        return f"{self.url}lab/tree/{name}?reset&token={self.token}"

    def shutdown_kernels(self):
        for k in json.loads(self.api("api/kernels")):
            self.api(f"api/kernels/{k['id']}", method="DELETE")


@pytest.fixture(scope="session")
def jupyter_lab(tmp_path_factory, browser, request):
    """JupyterLab, headless, on a temporary copy of notebooks/ (the run must not write outputs into the
    tracked files), offline and in quick mode, on a free localhost port with a random token. Depends on
    `browser` so that a missing Chromium skips before the server starts."""
    work = tmp_path_factory.mktemp("lab")
    notebooks = work / "notebooks"
    shutil.copytree(ROOT / "notebooks", notebooks, ignore=shutil.ignore_patterns("*.py", ".ipynb_checkpoints"))
    port, token = _free_port(), secrets.token_hex(16)
    settings = work / "settings"
    # no "get notified about Jupyter news?" toast over the widgets' controls
    news = settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text('{"fetchNews": "false"}')
    env = {**os.environ, "COURSE_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "COURSE_QUICK": "1",
           "TOKENIZERS_PARALLELISM": "false",
           # this checkout's course_lib, not whichever one the venv has installed
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           # no user settings or workspaces from this machine
           "JUPYTER_CONFIG_DIR": str(work / "config"), "JUPYTER_RUNTIME_DIR": str(work / "runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(settings)}
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--port={port}",
           "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={notebooks}",
           f"--LabApp.workspaces_dir={work / 'workspaces'}", "--LabApp.news_url=None",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log_path = work / "jupyterlab.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=notebooks, env=env, stdout=log, stderr=subprocess.STDOUT)
    lab = JupyterLab(f"http://127.0.0.1:{port}/", token)
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"JupyterLab exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                lab.api("api/status")
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not answer within 90 s:\n{log_path.read_text()[-3000:]}")
                time.sleep(0.5)
        yield lab
    finally:
        proc.terminate()    # SIGTERM: the server shuts its kernels down
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if request.session.testsfailed:   # the kernels' side of a failure
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            shutil.copy(log_path, ARTIFACTS / "jupyterlab.log")
