"""The built site (build/site, from `python tools/site.py build`) in a real browser: every page loads
from localhost with no console error, no failed request and no request off this machine (the site must
work offline: no CDN at view time), and its math renders as JupyterLab renders it."""
from __future__ import annotations

import pytest

from pagecheck import ARTIFACTS, ROOT, check_pages, serve_directory, skip_or_fail

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


def test_math_with_text_escapes_renders_as_in_jupyterlab(page):
    """Module 05's KV-bytes formula has \\text{kv\\_heads}: the bundled MathJax 2 showed "kv\\_heads" (its
    \\text{} unescapes only \\$ \\{ \\} \\\\), JupyterLab shows "kv_heads"; the site must show what JupyterLab
    shows, with no backslash left in any rendered formula of the page."""
    rel = "notebooks/05_kv_caching.html"
    if not (SITE / rel).is_file():
        skip_or_fail(f"no {rel} in {SITE}: build the site first with {BUILD}")
    with serve_directory(SITE) as base:
        page.goto(base + rel, wait_until="networkidle")
        page.evaluate("() => new Promise(done => MathJax.Hub.Queue(done))")   # after the typesetting
        shown = page.locator(".MathJax_Display .MathJax, .MathJax").all_inner_texts()
    formula = [t for t in shown if "heads" in t]
    assert formula, f"{rel}: no rendered formula mentions kv_heads (rendered: {shown[:5]})"
    assert all("kv_heads" in t and "head_dim" in t and "\\" not in t for t in formula), formula
    assert not [t for t in shown if "\\" in t], "a formula still shows a backslash"
    assert not page.log.problems(), page.log.problems()


def test_every_slide_deck_starts_reveal_and_moves_through_its_slides(page):
    """Each module's deck (slides/, tools/slides.py) starts reveal.js from the site's own copy: the test
    above checks that it loads clean; here reveal must be running, with slides from the notebook's headings,
    and move to the next slide, still with no console error and no request off this machine."""
    decks = sorted((SITE / "slides").glob("*.slides.html"))
    if not decks:
        skip_or_fail(f"no slide deck in {SITE / 'slides'}: build the site first with {BUILD}")
    with serve_directory(SITE) as base:
        for deck in decks:
            rel = deck.relative_to(SITE).as_posix()
            page.goto(base + rel, wait_until="networkidle")
            page.wait_for_function("document.body.dataset.courseDeck === 'ready'", timeout=15_000)
            total, horizontal = page.evaluate("[Reveal.getTotalSlides(), Reveal.getHorizontalSlides().length]")
            assert horizontal >= 3 and total >= horizontal, f"{rel}: {total} slides, {horizontal} horizontal"
            page.evaluate("Reveal.next()")
            assert page.evaluate("Reveal.getIndices().h + Reveal.getIndices().v") == 1, f"{rel}: did not move on"
            first = page.locator(".reveal .slides > section").first
            assert first.locator("h1").count() == 1, f"{rel}: the first slide is not the notebook's # title"
    assert not page.log.problems(), page.log.problems()
