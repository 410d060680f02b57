"""What a page did in the browser: its console, its failed requests, and the requests it tried to send
off this machine (blocked: the course's pages must work offline, and CI cannot reach the internet).

Shared by the JupyterLab widget tests (which save the log as an artifact) and the site test (which fails
on any entry).
"""
from __future__ import annotations

import contextlib
import functools
import http.server
import threading
from pathlib import Path
from urllib.parse import urlsplit

LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "[::1]"}
LOCAL_SCHEMES = {"data", "blob", "about", "file"}


def is_local(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in LOCAL_SCHEMES or parts.hostname in LOCAL_HOSTS


class PageLog:
    """Attach to a Playwright page before it navigates; every event lands in one of four lists."""

    def __init__(self, page):
        self.console: list[str] = []    # every console message, for the artifact
        self.errors: list[str] = []     # console errors and uncaught exceptions
        self.failed: list[str] = []     # requests that failed or answered with an HTTP error
        self.external: list[str] = []   # requests to other hosts, blocked
        page.on("console", self._on_console)
        page.on("pageerror", lambda exc: self.errors.append(f"uncaught exception: {exc}"))
        page.on("requestfailed", self._on_request_failed)
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
        # a blocked external load also logs "Failed to load resource": it is reported once, as external
        if msg.type == "error" and where not in self.external:
            self.errors.append(line)

    def _on_request_failed(self, request):
        if request.url not in self.external:
            self.failed.append(f"{request.url} ({request.failure})")

    def _on_response(self, response):
        if response.status >= 400:
            self.failed.append(f"{response.url} (HTTP {response.status})")

    def problems(self) -> list[str]:
        return ([f"console {e}" for e in self.errors] + [f"failed request {f}" for f in self.failed]
                + [f"request off this machine (blocked) {u}" for u in self.external])

    def text(self) -> str:
        sections = {"console": self.console, "errors": self.errors, "failed requests": self.failed,
                    "blocked external requests": self.external}
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
