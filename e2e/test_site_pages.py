"""The built site (build/site, from `python tools/site.py build`) in a real browser: every page loads
from localhost with no console error, no failed request and no request off this machine (the site must
work offline: no CDN at view time)."""
from __future__ import annotations

import pytest

from pagecheck import ARTIFACTS, ROOT, check_pages, skip_or_fail

SITE = ROOT / "build" / "site"
BUILD = "python tools/site.py build (or make site)"


def test_every_site_page_loads_clean(browser):
    if not SITE.is_dir():
        skip_or_fail(f"no built site at {SITE}: build it first with {BUILD}")
    results = check_pages(browser, SITE, artifacts=ARTIFACTS)
    assert results, f"{SITE} holds no *.html page: rebuild it with {BUILD}"
    bad = {page: problems for page, problems in results.items() if problems}
    report = "\n".join(f"{page}:\n" + "".join(f"  - {p}\n" for p in problems) for page, problems in bad.items())
    if bad:
        pytest.fail(f"{len(bad)} of {len(results)} pages of {SITE} have problems (screenshots and logs in "
                    f"{ARTIFACTS}):\n{report}", pytrace=False)
