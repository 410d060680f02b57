"""The page checker that the site test relies on finds each kind of problem, and passes a clean page:
without this, a checker that saw nothing would pass any site."""
from __future__ import annotations

import subprocess
import sys

from pagecheck import ROOT, check_pages

PAGES = {
    "clean.html": "<h1>fine</h1><link rel='stylesheet' href='sub/style.css'>",
    "sub/nested.html": "<p>a page in a subfolder is checked too</p>",
    "console.html": "<script>console.error('boom')</script>",
    "exception.html": "<script>throw new Error('kaboom')</script>",
    "missing.html": "<img src='nowhere.png'>",
    "external.html": "<script src='https://cdn.example.com/lib.js'></script>",
}


def test_checker_reports_each_kind_of_problem(browser, tmp_path):
    for rel, body in PAGES.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(f"<!doctype html><html><head><title>t</title></head><body>{body}</body></html>")
    (tmp_path / "sub" / "style.css").write_text("h1 { color: navy }")
    found = check_pages(browser, tmp_path)
    assert sorted(found) == sorted(PAGES)
    assert found["clean.html"] == [] and found["sub/nested.html"] == []
    assert len(found["console.html"]) == 1 and "boom" in found["console.html"][0]
    assert any("kaboom" in p for p in found["exception.html"])
    # one missing file is one problem (not also its console error and its aborted request)
    assert len(found["missing.html"]) == 1 and found["missing.html"][0].endswith("nowhere.png (HTTP 404)")
    # blocked and reported once, as a request off this machine, not again as a console error
    assert found["external.html"] == ["request off this machine (blocked) https://cdn.example.com/lib.js"]


def test_plain_nbconvert_page_is_flagged_for_its_cdns(browser, tmp_path):
    """A notebook exported by plain `jupyter nbconvert --to html` loads require.js and MathJax from a CDN
    (issue 20: blank offline): the kind of page the site must not have."""
    subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "html", "--output-dir", str(tmp_path),
                    str(ROOT / "notebooks" / "06_paged_attention.ipynb")], check=True, capture_output=True)
    problems = check_pages(browser, tmp_path)["06_paged_attention.html"]
    external = [p for p in problems if p.startswith("request off this machine")]
    assert any("require.js" in p for p in external), problems
    assert any("mathjax" in p.lower() for p in external), problems
