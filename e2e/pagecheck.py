"""What a page did in the browser: its console, its failed requests, and the requests it tried to send
off this machine (blocked: the course's pages must work offline, and CI cannot reach the internet).

Shared by the JupyterLab widget tests (which save the log as an artifact) and the site test (which fails
on any entry).
"""
from __future__ import annotations

import contextlib
import functools
import http.server
import os
import re
import threading
from pathlib import Path
from urllib.parse import urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "build" / "browser-artifacts"   # screenshots and logs of failures, kept by CI
LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "[::1]"}
LOCAL_SCHEMES = {"data", "blob", "about", "file"}


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def skip_or_fail(reason: str):
    """Outside CI a missing prerequisite skips (a student's `pytest e2e` needs no browser); in CI it fails."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: the browser tier must run in CI)", pytrace=False)
    pytest.skip(reason)


def is_local(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in LOCAL_SCHEMES or parts.hostname in LOCAL_HOSTS


class PageLog:
    """Attach to a Playwright page before it navigates; it records what the page did, and `problems()`
    names each problem once (one missing file shows up as a response, a failed request and a console
    error: it is reported as the failed request)."""

    def __init__(self, page):
        self.console: list[str] = []              # every console message, for the artifact
        self.errors: list[tuple[str, str]] = []   # (console error or uncaught exception, its source URL)
        self.failed: dict[str, str] = {}          # URL -> why: HTTP error status or network failure
        self.external: list[str] = []             # requests to other hosts, blocked
        page.on("console", self._on_console)
        page.on("pageerror", lambda exc: self.errors.append((f"uncaught exception: {exc}", "")))
        page.on("requestfailed", lambda req: self.failed.setdefault(req.url, str(req.failure)))
        page.on("response", self._on_response)
        page.route("**/*", self._route)

    def _route(self, route):
        url = route.request.url
        if is_local(url):
            route.continue_()
        else:
            self.external.append(url)
            route.abort("blockedbyclient")

    def _on_console(self, msg):
        where = msg.location.get("url", "")
        line = f"{msg.type}: {msg.text}" + (f"  ({where}:{msg.location.get('lineNumber')})" if where else "")
        self.console.append(line)
        if msg.type == "error":
            self.errors.append((line, where))

    def _on_response(self, response):
        if response.status >= 400:
            self.failed[response.url] = f"HTTP {response.status}"   # more telling than the abort after it

    def problems(self) -> list[str]:
        external = set(self.external)
        reported = external | set(self.failed)
        return ([f"console {e}" for e, url in self.errors
                 if not (e.startswith("error: Failed to load resource") and url in reported)]
                + [f"failed request {url} ({why})" for url, why in self.failed.items() if url not in external]
                + [f"request off this machine (blocked) {u}" for u in self.external])

    def text(self) -> str:
        sections = {"console": self.console, "failed requests": [f"{u} ({w})" for u, w in self.failed.items()],
                    "blocked external requests": self.external, "problems": self.problems()}
        return "\n".join(f"== {name} ({len(lines)})\n" + "".join(f"{line}\n" for line in lines)
                         for name, lines in sections.items())


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):   # pytest shows the failures; the access log is noise
        pass


@contextlib.contextmanager
def serve_directory(root: Path):
    """Serve `root` over HTTP on a free localhost port; yields the base URL (ending in /)."""
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def check_pages(browser, root: Path, artifacts: Path | None = None) -> dict[str, list[str]]:
    """Open every *.html under `root`, served from localhost, and wait until its network is idle; returns
    {page's path under root: its problems}, pages without problems included. Each page with problems
    leaves a screenshot and its log in `artifacts` when given."""
    pages = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.html"))
    found = {}
    with serve_directory(root) as base:
        context = browser.new_context()
        try:
            for rel in pages:
                page = context.new_page()
                log = PageLog(page)
                try:
                    page.goto(base + rel, wait_until="networkidle")
                except Exception as exc:   # a page that never loads is a problem, not a crash of the test
                    # (message, source URL), as problems() reads it
                    log.errors.append((f"navigation failed: {exc}", ""))
                found[rel] = log.problems()
                if found[rel] and artifacts is not None:
                    artifacts.mkdir(parents=True, exist_ok=True)
                    stem = artifacts / ("site-" + re.sub(r"[^\w.-]+", "_", rel))
                    page.screenshot(path=f"{stem}.png", full_page=True)
                    Path(f"{stem}.log").write_text(f"{base}{rel}\n{log.text()}")
                page.close()
        finally:
            context.close()
    return found
