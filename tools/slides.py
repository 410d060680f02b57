r"""Slide decks for instructors: one reveal.js deck per module, from its executed notebook, offline.

    python tools/slides.py build [--out build/slides]   the decks alone (`make slides`), as a small site:
                                                        OUT/index.html lists them, OUT/slides/NN_slug.slides.html
    python tools/site.py build                          the site builds them too, beside the pages
                                                        (build/site/slides/), linked from each module

A deck is nbconvert's slides exporter (reveal.js) with the course's template (tools/site_assets/templates/
course_slides): reveal.js comes from the copy vendored in tools/site_assets/reveal.js (version and licence in
its README.md), copied to the site's assets/reveal.js and named by the exporter's `reveal_url_prefix`,
relative to the deck; MathJax is the site's own. Nothing is fetched from a CDN; `tools/site.py check` and the
browser tier (e2e/test_site_pages.py) check it.

Slide structure, derived here from the notebook (on a copy: the tracked .ipynb files do not change):
- A cell's own `slideshow` metadata wins: in the .py source, a header field such as
      # %% [markdown] id="c031" slideshow={"slide_type": "notes"}
  (tools/nb.py writes header fields as the cell's metadata). Types: slide, subslide, fragment, "-"
  (continue), notes (speaker notes: key S), skip.
- Otherwise: the Colab badge and install cells (ids c000, c001) and the cell tagged `parameters` are skipped;
  a markdown cell whose first line is a heading `# ` or `## ` starts a slide, one whose first line is a
  deeper heading (`### `, ...) a sub-slide (reveal's vertical slides, under the section's slide); any other
  cell continues the slide, unless the slide would grow past LINE_BUDGET lines (`_lines` estimates a cell),
  when it starts a sub-slide. A slide still taller than the screen scrolls.
- A text output longer than MAX_OUTPUT_LINES lines is trimmed to its first KEEP_OUTPUT_LINES, with a line
  saying how many were left out (the module's page shows them all).
"""
from __future__ import annotations

import argparse
import copy
import html
import os
import posixpath
import re
import shutil
import sys
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tools import site as site_tool  # noqa: E402

REVEAL_DIR = site_tool.ASSETS / "reveal.js"     # the vendored reveal.js
TEMPLATES = site_tool.ASSETS / "templates"
SKIPPED_IDS = ("c000", "c001")                  # the Colab badge and install cells (tools/nb.py FIXED_IDS)
SLIDE_TYPES = ("slide", "subslide", "fragment", "-", "notes", "skip")
LINE_BUDGET = 22          # lines of a 960x700 slide at the template's 20 px text (about 26, less a heading)
MAX_OUTPUT_LINES = 16
KEEP_OUTPUT_LINES = 12
TEXT_WIDTH = 70           # characters in a line of a slide before it wraps (measured: 65-75 at 20 px)
FIGURE_LINES = 14         # what a figure counts as


class SlidesError(site_tool.SiteError):
    """A deck cannot be built as asked; the message says which notebook and cell."""


def deck_path(notebook: str) -> str:
    """The site path of the deck of `notebook` (a repository or site path): slides/NN_slug.slides.html."""
    name = posixpath.basename(notebook)
    return f"slides/{name.rsplit('.', 1)[0]}.slides.html"


# --- the slide structure -----------------------------------------------------------------------------------

_HEADING = re.compile(r"^(#{1,6})\s+\S")


def _heading_level(cell) -> int | None:
    if cell.cell_type != "markdown":
        return None
    first = next((line for line in cell.source.splitlines() if line.strip()), "")
    m = _HEADING.match(first)
    return len(m.group(1)) if m else None


def _text_lines(text: str) -> int:
    return sum(1 + len(line) // TEXT_WIDTH for line in text.splitlines())


def _lines(cell) -> int:
    """About how many lines of a slide the cell takes: its source, wrapped, and its outputs (a figure as
    FIGURE_LINES, a table as its rows)."""
    n = _text_lines(cell.source)
    for out in cell.get("outputs", []):
        data = out.get("data", {})
        if out.get("output_type") == "stream":
            n += _text_lines(out.get("text", ""))
        elif any(k.startswith("image/") for k in data):
            n += FIGURE_LINES
        elif "text/html" in data:
            body = data["text/html"]
            n += FIGURE_LINES * body.count("<img") + max(2, body.count("<tr"), body.count("<p"))
        elif "text/plain" in data:
            n += _text_lines(data["text/plain"])
    return n


def _trim(text: str) -> str:
    lines = text.splitlines()
    if len(lines) <= MAX_OUTPUT_LINES:
        return text
    left = len(lines) - KEEP_OUTPUT_LINES
    return "\n".join(lines[:KEEP_OUTPUT_LINES]) + f"\n… {left} more lines (the module's page shows them all)\n"


def trim_outputs(cell) -> None:
    """Trim the cell's long text outputs (streams, and plain-text results with no richer form)."""
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            out["text"] = _trim(out.get("text", ""))
        elif set(out.get("data", {})) == {"text/plain"}:
            out["data"]["text/plain"] = _trim(out["data"]["text/plain"])


def explicit_slide_type(cell, where: str) -> str | None:
    """The slide type the cell's metadata sets (`slideshow` = {"slide_type": ...}), checked, or None."""
    show = cell.get("metadata", {}).get("slideshow")
    if show is None:
        return None
    kind = show.get("slide_type") if isinstance(show, dict) else None
    if kind not in SLIDE_TYPES:
        raise SlidesError(f"{where}: cell {cell.get('id')}: slideshow={show!r}: expected "
                          f'{{"slide_type": one of {", ".join(SLIDE_TYPES)}}}')
    return kind


def slide_deck_notebook(nb, where: str = "notebook"):
    """A copy of the executed notebook `nb` with every cell's `slideshow` metadata set by the rule above and
    long outputs trimmed; `nb` itself is not changed."""
    nb = copy.deepcopy(nb)
    used = 0          # lines on the current (sub-)slide
    for cell in nb.cells:
        kind = explicit_slide_type(cell, where)
        if kind is None:
            level = _heading_level(cell)
            if cell.get("id") in SKIPPED_IDS or "parameters" in cell.get("metadata", {}).get("tags", []):
                kind = "skip"
            elif level is not None:
                kind = "slide" if level <= 2 else "subslide"
            elif used and used + _lines(cell) > LINE_BUDGET:
                kind = "subslide"
            else:
                kind = "-"
        if kind not in ("skip", "notes"):
            trim_outputs(cell)
            used = _lines(cell) if kind in ("slide", "subslide") else used + _lines(cell)
        cell.metadata["slideshow"] = {**cell.metadata.get("slideshow", {}), "slide_type": kind}
    return nb


# --- rendering ------------------------------------------------------------------------------------------

def exporter(reveal_url_prefix: str = "../assets/reveal.js"):
    """nbconvert's slides exporter with the course's template; `reveal_url_prefix` is where reveal.js is,
    relative to the deck (the site puts decks in slides/ and reveal.js in assets/reveal.js)."""
    from nbconvert import SlidesExporter
    return SlidesExporter(template_name="course_slides", extra_template_basedirs=[str(TEMPLATES)],
                          extra_template_paths=[str(TEMPLATES / "shared")], reveal_url_prefix=reveal_url_prefix,
                          reveal_theme="white", reveal_transition="none", reveal_width="960", reveal_height="700")


def render_deck(nb, title: str, rel: str, site_pages: dict[str, str], root: Path, exp=None,
                page: str | None = None) -> str:
    """The HTML of the deck of the executed notebook `nb` (repository path `rel`), titled `title`: `nb` is
    shown as the site shows it (widget stand-ins, math fixed) and is not changed. Its links are rewritten as
    the site's pages' are (`site_pages`: repository path -> site path); `page` is the site path of the
    module's page, linked from every slide (None: no link)."""
    exp = exp or exporter()
    deck = slide_deck_notebook(nb, rel)
    deck.metadata["title"] = title
    out = deck_path(rel)
    base = "../" * out.count("/")
    resources = {"deck": {"base": base, "page": site_tool._relative(page, out) if page else None,
                          "page_title": title}}
    body, _ = exp.from_notebook_node(deck, resources=resources)
    return site_tool.rewrite_links(body, site_tool.Page(rel, out, "slides", title), site_pages, root)


# --- the decks alone (`make slides`) ----------------------------------------------------------------------

def _index(course_title: str, decks: list[tuple[str, str]]) -> str:
    items = "".join(f'<li><a href="{html.escape(href)}">{html.escape(title)}</a></li>\n' for href, title in decks)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head><meta charset="utf-8"><link rel="icon" href="data:,">'
            f'<title>{html.escape(course_title)}: slides</title>'
            f'<link rel="stylesheet" href="assets/site.css"></head>\n<body>\n<main class="course-slides-index">'
            f"<h1>{html.escape(course_title)}: slides</h1>\n<p>One reveal.js deck per module, from its executed "
            f"notebook (arrows or space to move, S for speaker notes, F for full screen).</p>\n<ol>\n{items}</ol>"
            f"\n</main>\n</body>\n</html>\n")


def build(out: Path, root: Path = ROOT, log=print, modules: tuple[str, ...] = ()) -> list[str]:
    """Build every module's deck (or those whose numbers are in `modules`) into `out` as a small site:
    out/index.html, out/slides/, out/assets/ (reveal.js, MathJax). All or nothing, as the site's build.
    Links to other notebooks go to GitHub (the site's pages are not there). Returns the decks' paths."""
    start = time.perf_counter()
    out = Path(out)
    site = site_tool.plan(root)
    pages = [p for p in site.pages if p.kind == "notebook" and (not modules or p.module in modules)]
    if modules and {p.module for p in pages} != set(modules):
        raise SlidesError(f"modules {', '.join(modules)}: expected module numbers among "
                          f"{', '.join(m.number for m in site.modules if m.notebook)}")
    site_tool._check_out(out)
    staging = site_tool._staging(out)
    exp, decks = exporter(), []
    try:
        site_tool._copy_assets(staging)   # MathJax, reveal.js, the site's CSS
        for page in pages:
            t0 = time.perf_counter()
            nb, origin = site_tool.executed_notebook(root / page.src, root)
            site_tool.replace_widgets(nb, site_tool.colab_url(page.src))
            site_tool.fix_math(nb)
            dest = staging / deck_path(page.src)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(render_deck(nb, page.title, page.src, {}, root, exp), encoding="utf-8")
            decks.append((deck_path(page.src), page.title))
            log(f"{time.perf_counter() - t0:6.1f} s  {deck_path(page.src)}  ({origin})")
        (staging / "index.html").write_text(_index(site.course_title, decks), encoding="utf-8")
        site_tool._swap_in(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log(f"built {len(decks)} slide decks into {out} in {time.perf_counter() - start:.1f} s "
        f"(open {out / 'index.html'})")
    return [d for d, _ in decks]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/slides.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the slide decks")
    b.add_argument("--out", type=Path, default=ROOT / "build" / "slides", help="output folder (default build/slides)")
    b.add_argument("modules", nargs="*", help="module numbers (00 .. 12); default: every module")
    args = parser.parse_args(argv)
    for key, value in (("COURSE_QUICK", "1"), ("COURSE_OFFLINE", "1"), ("HF_HUB_OFFLINE", "1"),
                       ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(key, value)   # a notebook without a current executed copy runs as the tests run it
    try:
        build(args.out, modules=tuple(args.modules))
    except (site_tool.SiteError, site_tool.nbexec.NotebookFailed) as e:
        print(f"slides build failed: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
