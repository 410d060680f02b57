r"""The course as a static site (`make site`): every module's notebook, executed, and its lab, offline.

    python tools/site.py build [--out build/site] [--strict]   build the site (default build/site)
    python tools/site.py check SITE                 check every link and asset of a built site (exit 1 if any fails)

Pages: the syllabus (syllabus.md) is the home page; then module by module the notebook, executed, and the
lab, its student version (labs/, never solutions/), each with the module list and previous/next links;
each module's slide deck (slides/NN_slug.slides.html, tools/slides.py), from the same executed notebook; and,
linked from every page's navigation, the bibliography (references.yaml) and the glossary (glossary.yaml).
A citation on a page (`[@key]` in a source, which tools/nb.py writes as the author and year linked to the
paper) links to its entry on the bibliography page, which says which pages cite it; the first use of each
glossary term on a notebook page links to the term (tools/references.py, tools/glossary.py).

Executed notebooks come from, in this order: a GPU-executed copy committed in executed/gpu/, then the copy
the tests left in build/executed/ (root conftest.py), each only if it recorded the sha256 of exactly the
tracked notebook; otherwise the notebook is executed here, by the same function the tests use
(tools/nbexec.py), in quick mode unless COURSE_QUICK says otherwise.

Builder: nbconvert's HTMLExporter with JupyterLab's template (tools/site_assets/templates/course), and the
navigation written here. Chosen because it needs no Node and no CDN, is already a dependency, and builds
the whole course in seconds; see README ("The course site"). Pages load nothing from outside: MathJax is
copied from the jupyter-server-mathjax package, require.js and the widget renderer are dropped, and each
widget is replaced by a static stand-in (its figure, its controls' values, a link to run it on Colab).
External URLs appear only as plain links (Colab, GitHub); `check` fails on anything else.

A build is all or nothing: it is written into a folder beside the destination and swapped in only once every
page is built, so a failed build leaves the previous site as it was and no half-built folder. A deck with a
problem (`tools/slides.py`'s limits: text a slide, figures shown, words lost) is a warning, as a claim that
did not hold is, and `--strict` refuses to build.
The plan, the executed copies, widget stand-ins, math and link rewriting are `tools/site_plan.py`'s, shared
with the decks' tool.

Pages never contradict their own text silently: a notebook states each timing claim through
course_lib.perf.claims, which marks its output with metadata `course_claim` (held or not). A notebook whose
executed copy holds a claim that did not hold is executed once more (a loaded moment passes); if a claim still
does not hold, the page gets a banner at its top naming each such claim and what was measured, the build
prints a warning naming the page and the claim, and `--strict` (the release check) refuses to build.

Math: MathJax 2 (the bundled one) shows `\text{kv\_heads}` with its backslash, because its `\text{}` only
unescapes `\$ \{ \} \\`; JupyterLab's MathJax 3 (with textmacros) shows `kv_heads`. Every markdown cell's
math is written the way MathJax 2 shows as JupyterLab does (`text_mode_escapes`).
"""
from __future__ import annotations

import argparse
import html
import os
import posixpath
import re
import shutil
import sys
import time
import urllib.parse
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from course_lib import RELEASE, REPO_URL, colab_url  # noqa: E402
from course_grading.build import SECRET_MARKERS  # noqa: E402  (nbgrader's delimiters, one list)
from tools import glossary, nbexec, references  # noqa: E402

from tools.site_plan import (ASSETS, EXECUTED_DIR, GPU_EXECUTED_DIR, Page, Plan, SiteError, check_out,  # noqa: E402
                             copy_assets, deck_path, executed_notebook, fix_math, plan, relative_link,
                             replace_widgets, rewrite_links, staging_dir, swap_in)
from tools.slides import exporter as slides_exporter, problems_of, render_deck  # noqa: E402

def check_student_lab(nb, rel: str) -> None:
    """A lab page shows the student version: refuse a notebook that holds solutions or hidden tests."""
    for i, cell in enumerate(nb.cells):
        for marker in (m for pair in SECRET_MARKERS for m in pair):
            if marker in cell.source:
                raise SiteError(f"{rel}: cell {i} holds {marker!r}: a lab page must be the student version "
                                "(labs/, built by `course build-labs`), never a solution")


# --- timing claims ---------------------------------------------------------------------------------------

CLAIM_KEY = "course_claim"   # output metadata written by course_lib.perf.claims.timing_claim


@dataclass
class Claim:
    """A claim a notebook states that did not hold on the run of its executed copy."""
    cell: int              # index of the cell whose output states it
    cell_id: str | None    # that cell's id (the page's anchor is "cell-id=<id>")
    claim: str
    measured: str


def claims_not_held(nb, rel: str) -> list[Claim]:
    """The claims the executed notebook `nb` states (outputs with metadata `course_claim`) that did not hold
    on its run, in page order. A `course_claim` without a true/false `held` is refused: the page could not
    say whether it contradicts its text."""
    failed = []
    for i, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            claim = output.get("metadata", {}).get(CLAIM_KEY)
            if claim is None:
                continue
            if not isinstance(claim, dict) or not isinstance(claim.get("held"), bool):
                raise SiteError(f"{rel}: cell {i} has an output whose {CLAIM_KEY} metadata has no true/false "
                                f"'held' (got {claim!r}); it is written by course_lib.perf.claims.timing_claim")
            if not claim["held"]:
                failed.append(Claim(i, cell.get("id"), str(claim.get("claim", "")), str(claim.get("measured", ""))))
    return failed


def page_notebook(src: Path, rel: str, root: Path, log) -> tuple[nbformat.NotebookNode, str, list[Claim], bool]:
    """The executed notebook a page shows, where it came from, the claims that did not hold on its run, and
    whether it was executed again for them. A copy holding a claim that did not hold is executed once more
    (a loaded moment passes), unless it is a GPU copy: a run here would replace its GPU outputs with quick
    CPU ones, so it is shown as it is."""
    nb, origin = executed_notebook(src, root)
    failed = claims_not_held(nb, rel)
    if not failed or origin == GPU_EXECUTED_DIR:
        return nb, origin, failed, False
    log(f"         {rel}: {len(failed)} claim(s) did not hold on the run of its copy ({origin}): executing it again")
    copy = nbexec.execute_notebook(src, root / EXECUTED_DIR)
    nb = nbformat.read(copy, as_version=4)
    return nb, "executed again", claims_not_held(nb, rel), True


def claims_banner(failed: list[Claim], nb, again: bool) -> str:
    """The banner at the top of a page some of whose claims did not hold on the run that made it: each
    claim (linked to its cell) and what was measured."""
    ex = nb.metadata.get(nbexec.META_KEY, {})
    run = f"{ex.get('device', '?')}, {str(ex.get('date', '?'))[:10]}"
    run += "; executed a second time for this page" if again else ""
    items = []
    for c in failed:
        name = html.escape(c.claim)
        if c.cell_id and re.fullmatch(r"[A-Za-z0-9_-]+", c.cell_id):
            name = f'<a href="#cell-id={c.cell_id}">{name}</a>'
        items.append(f"<li>{name}: measured {html.escape(c.measured)}</li>")
    n = len(failed)
    return (f'<div class="course-claims" role="note"><p><strong>{n} timing claim{"s" if n != 1 else ""} of this '
            f'page did not hold on the run that made it</strong> ({html.escape(run)}), so some numbers below '
            f'contradict the text beside them:</p><ul>{"".join(items)}</ul><p>Timings are noisy on a busy '
            f'machine: run the notebook yourself to measure on yours.</p></div>')


# --- bibliography and glossary -------------------------------------------------------------------------

@dataclass
class Scholarship:
    """The bibliography and glossary a build links to, and what it found while building the pages: which
    pages cite each work, which notebook pages link each term."""
    refs: dict
    terms: dict
    cited: dict = field(default_factory=dict)    # key -> [Page]
    used: dict = field(default_factory=dict)     # term id -> [Page]

    @classmethod
    def load(cls, root: Path) -> "Scholarship":
        try:
            return cls(references.load(root / "references.yaml"), glossary.load(root / "glossary.yaml"))
        except references.ReferenceError as e:
            raise SiteError(f"the bibliography or glossary is not valid:\n{e}") from None


def link_scholarship(nb, page: Page, sch: Scholarship) -> None:
    """Point each citation of the page's markdown at its bibliography entry, and (notebook pages) link the
    first use of each glossary term to the glossary; record both in `sch`. The links are written as links to
    references.yaml#key and glossary.yaml#term, which `rewrite_links` turns into the pages' URLs."""
    base = posixpath.dirname(page.src) or "."

    def to(src: str, anchor: str) -> str:
        return f"{posixpath.relpath(src, base)}#{anchor}"
    linker = glossary.Linker(sch.terms, lambda t: to("glossary.yaml", t)) if page.kind == "notebook" else None
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        try:
            cell.source, keys = references.link_citations(cell.source, sch.refs, lambda k: to("references.yaml", k))
        except references.ReferenceError as e:
            raise SiteError(f"{page.src}: cell {i}: {e}") from None
        for key in keys:
            if page not in sch.cited.setdefault(key, []):
                sch.cited[key].append(page)
        if linker is not None:
            cell.source = linker.link(cell.source)
    for term in linker.linked if linker is not None else []:
        sch.used.setdefault(term, []).append(page)


def _page_links(pages: list[Page]) -> str:
    return ", ".join(f'<a href="{html.escape(p.src)}">{html.escape(p.title)}</a>' for p in pages)


def bibliography_notebook(sch: Scholarship):
    """The bibliography page: every entry (anchor = its key), sorted by key (first author, year), with its
    links, what the course takes from it and the pages that cite it."""
    items = []
    for key in sorted(sch.refs):
        r = sch.refs[key]
        authors = ", ".join(r.authors[:-1]) + " " + r.authors[-1] if r.authors[-1] == references.ET_AL \
            else ", ".join(r.authors)
        links = " · ".join(f'<a href="{html.escape(url)}">{html.escape(label)}</a>' for label, url in r.links)
        cited = _page_links(sch.cited.get(key, [])) or "no page yet"
        items.append(f'<dt id="{key}">{html.escape(authors)}. <cite>{html.escape(r.title)}</cite>. '
                     f'{html.escape(r.venue)}, {r.year}.</dt>'
                     f'<dd><span class="course-bib-links">{links}</span><br>{html.escape(r.uses)}<br>'
                     f'<span class="course-bib-cited">Cited in: {cited}</span></dd>')
    text = ("# Bibliography\n\nEvery work the course's notebooks and labs cite, with what the course takes from it "
            "and where. In a notebook a citation reads as the author and year, linked to the work; on this site "
            "it links here. Each notebook ends with its own *Further reading*.\n\n"
            f'<dl class="course-bib">{"".join(items)}</dl>\n')
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(text)]
    return nb


def glossary_notebook(sch: Scholarship, site: Plan):
    """The glossary page: every term (anchor = its id), alphabetically, with its definition, the module that
    introduces it, the notebook pages whose first use of it links here, and related terms."""
    notebooks = {p.module: p for p in site.pages if p.kind == "notebook"}
    cells = ["# Glossary\n\nThe course's terms, each as the module that introduces it uses it. On a notebook page "
             "the first use of each term links here."]
    for tid, e in sorted(sch.terms.items(), key=lambda kv: kv[1].term.lower()):
        meta = []
        if e.module in notebooks:
            meta.append(f"Introduced in {_page_links([notebooks[e.module]])}")
        if sch.used.get(tid):
            meta.append(f"linked from {_page_links(sch.used[tid])}")
        if e.see:
            meta.append("see also " + ", ".join(f'<a href="#{s}">{html.escape(sch.terms[s].term)}</a>' for s in e.see))
        cells.append(f'<h3 id="{tid}">{html.escape(e.term)}</h3>\n\n{e.definition}\n\n'
                     f'<p class="course-gloss-meta">{"; ".join(meta)}.</p>')
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("\n\n".join(cells) + "\n")]
    return nb


# --- rendering ----------------------------------------------------------------------------------------

def _exporter():
    from nbconvert import HTMLExporter
    return HTMLExporter(template_name="course", extra_template_basedirs=[str(ASSETS / "templates")],
                        extra_template_paths=[str(ASSETS / "templates" / "shared")])   # macros shared with the decks


def _info(page: Page, nb) -> str:
    """The line under the navigation: where the outputs come from, and where to run or read the source."""
    src_link = f'<a href="{html.escape(f"{REPO_URL}/blob/{RELEASE}/{page.src}")}">source on GitHub</a>'
    colab = f'<a href="{html.escape(colab_url(page.src))}">run it on Colab</a>'
    if page.kind not in ("notebook", "lab"):
        return ""
    if page.kind == "lab":
        return f"The lab as a student gets it (autograded; open it in Jupyter or {colab}) · {src_link}"
    ex = nb.metadata.get(nbexec.META_KEY, {})
    mode = "quick mode (small sizes)" if ex.get("quick") else "full size"
    run = html.escape(f"{ex.get('device', '?')}, {mode}, torch {ex.get('torch', '?')}, {ex.get('date', '?')[:10]}")
    slides = f'<a href="{html.escape(relative_link(deck_path(page.src), page.out))}">slides</a>'
    return f"Outputs from a run on {run} · {colab} · {slides} · {src_link}"


def _link(page: Page) -> dict:
    return {"href": page.out, "title": page.title}


def _home_notebook(root: Path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell((root / "syllabus.md").read_text())]
    return nb


def _warn(msg: str) -> None:
    print(msg, file=sys.stderr)


def build(out: Path, root: Path = ROOT, log=print, strict: bool = False, warn=_warn) -> Plan:
    """Build the site from the course at `root` and put it at `out` (replacing the site there) only when
    every page is built: on any failure the previous site stays as it was and nothing half-built is left.
    A page some of whose claims did not hold (after one more execution) gets a banner and a warning
    (`warn`, also in the returned plan's `warnings`); with strict=True the build fails instead."""
    start = time.perf_counter()
    out = Path(out)
    site = plan(root)
    exporter = _exporter()
    check_out(out)
    staging = staging_dir(out)
    try:
        _build_pages(site, staging, root, exporter, log, warn)
        if strict and site.warnings:
            raise SiteError("strict build: claims that did not hold, or decks past their limits:\n  "
                            + "\n  ".join(site.warnings))
        swap_in(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log(f"built {len(site.pages)} pages into {out} in {time.perf_counter() - start:.1f} s"
        + (f", {len(site.warnings)} warning(s)" if site.warnings else ""))
    return site


def _build_pages(site: Plan, out: Path, root: Path, exporter, log, warn) -> None:
    copy_assets(out)
    deck_exporter = slides_exporter()
    site_pages = {p.src: p.out for p in site.pages + site.extras}
    modules = [vars(m) for m in site.modules]
    extras = [_link(p) for p in site.extras]
    sch = Scholarship.load(root)
    n, deck_problems = len(site.pages), []
    for i, page in enumerate(site.pages + site.extras):   # the reference pages last: they list the others
        t0 = time.perf_counter()
        origin, banner = "", ""
        if page.kind == "bibliography":
            nb = bibliography_notebook(sch)
        elif page.kind == "glossary":
            nb = glossary_notebook(sch, site)
        elif page.kind == "home":
            nb = _home_notebook(root)
        elif page.kind == "notebook":
            nb, origin, failed, again = page_notebook(root / page.src, page.src, root, log)
            replace_widgets(nb, colab_url(page.src))
            if failed:
                banner = claims_banner(failed, nb, again)
                for c in failed:
                    msg = (f"warning: {page.out}: the claim {c.claim!r} did not hold on the run that made the page "
                           f"({c.measured}); the page says so in a banner")
                    site.warnings.append(msg)
                    warn(msg)
        else:
            nb = nbformat.read(root / page.src, as_version=4)
            check_student_lab(nb, page.src)
        fix_math(nb)
        if page.kind in ("home", "notebook", "lab"):
            link_scholarship(nb, page, sch)
        nb.metadata["title"] = page.title if page.kind != "home" else site.course_title
        nav = {"base": "../" * page.out.count("/"), "course_title": site.course_title,
               "modules": modules, "module": page.module, "is_home": page.kind == "home",
               "info": _info(page, nb), "banner": banner, "extras": extras, "page": page.out,
               "prev": _link(site.pages[i - 1]) if 0 < i < n else None,
               "next": _link(site.pages[i + 1]) if i + 1 < n else None}
        body, _ = exporter.from_notebook_node(nb, resources={"site": nav})
        body = rewrite_links(body, page, site_pages, root)
        dest = out / page.out
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(body, encoding="utf-8")
        log(f"{time.perf_counter() - t0:6.1f} s  {page.out}" + (f"  ({origin})" if origin else ""))
        if page.kind == "notebook":   # its slide deck, from the same executed notebook
            t0 = time.perf_counter()
            deck = out / deck_path(page.src)
            deck.parent.mkdir(parents=True, exist_ok=True)
            html_deck = render_deck(nb, page.title, page.src, site_pages, root, deck_exporter, page.out)
            deck.write_text(html_deck, encoding="utf-8")
            deck_problems += problems_of(nb, html_deck, page.src)
            log(f"{time.perf_counter() - t0:6.1f} s  {deck_path(page.src)}")
    for problem in deck_problems:   # as a claim that did not hold: a warning, and `--strict` refuses
        msg = f"warning: slides: {problem} (tools/slides.py states the limits)"
        site.warnings.append(msg)
        warn(msg)


# --- the link check -------------------------------------------------------------------------------------

_EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:)?//", re.I)
_CSS_URL = re.compile(r"""(?:url\(\s*['"]?|@import\s+['"])\s*((?:https?:)?//[^'")\s]+)""", re.I)
_SCRIPT_URL = re.compile(r"""(?:import\s*\(|\.src\s*=|fetch\s*\(|\bsrc\s*:)\s*['"]((?:https?:)?//[^'"]+)""", re.I)


class _PageRefs(HTMLParser):
    """The references of one page: links (<a href>), assets (src=, <link href>, <object data>), ids, and the
    URLs that inline CSS or scripts would fetch."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.links, self.assets, self.fetched, self.ids = [], [], [], set()
        self._in = None

    def handle_starttag(self, tag, attrs):
        for key, value in attrs:
            value = value or ""
            if key == "id" or (tag == "a" and key == "name"):
                self.ids.add(value)
            elif tag == "a" and key == "href":
                self.links.append(value)
            elif key in ("src", "poster") or (key == "href" and tag == "link") or (key == "data" and tag == "object"):
                self.assets.append(f"<{tag} {key}={value}>")
            elif key == "srcset":
                self.assets += [f"<{tag} srcset={c.split()[0]}>" for c in value.split(",") if c.strip()]
            elif key == "style":
                self.fetched += [f"style={u}" for u in _CSS_URL.findall(value)]
        self._in = tag if tag in ("script", "style") else None

    def handle_endtag(self, tag):
        self._in = None

    def handle_data(self, data):
        if self._in == "style":
            self.fetched += [f"<style> {u}" for u in _CSS_URL.findall(data)]
        elif self._in == "script":
            self.fetched += [f"<script> {u}" for u in _SCRIPT_URL.findall(data)]


def check(site: Path) -> list[str]:
    """Every problem of the built site at `site`, one line each naming the page: a local link or asset that
    does not resolve (anchors included), and anything the browser would fetch from outside the site."""
    site = Path(site)
    if not (site / "index.html").is_file():
        return [f"{site}: no index.html (build it first: python tools/site.py build --out {site})"]
    pages = sorted(site.rglob("*.html"))
    parsed: dict[Path, _PageRefs] = {}

    def refs(path: Path) -> _PageRefs:
        if path not in parsed:
            parsed[path] = _PageRefs()
            parsed[path].feed(path.read_text(encoding="utf-8", errors="replace"))
        return parsed[path]

    def resolve(page: Path, url: str):
        """(file, fragment) for a local URL, or a reason it does not resolve."""
        parts = urllib.parse.urlsplit(url)
        path = urllib.parse.unquote(parts.path)
        target = (page.parent / path).resolve() if path else page.resolve()
        if site.resolve() not in (target, *target.parents):
            return None, None, "outside the site"
        if not target.is_file():
            return None, None, "no such file"
        return target, parts.fragment, None

    problems = []
    for page in pages:
        rel = page.relative_to(site).as_posix()
        r = refs(page)
        for url in r.links:
            if _EXTERNAL.match(url) or urllib.parse.urlsplit(url).scheme:   # a plain link out: allowed
                continue
            target, fragment, why = resolve(page, url)
            if why:
                problems.append(f"{rel}: broken link {url} ({why})")
            # as a browser looks for the fragment: as written, then percent-decoded (nbconvert's ids are encoded)
            elif (fragment and target.suffix == ".html"
                  and not {fragment, urllib.parse.unquote(fragment)} & refs(target).ids):
                where = target.relative_to(site.resolve())
                problems.append(f"{rel}: broken link {url} (no id {fragment!r} in {where})")
        for asset in r.assets:
            url = asset.split("=", 1)[1].rstrip(">")
            if url.startswith("data:"):
                continue
            if _EXTERNAL.match(url) or urllib.parse.urlsplit(url).scheme:
                problems.append(f"{rel}: external asset {asset} (pages must load nothing from outside the site)")
                continue
            _, _, why = resolve(page, url)
            if why:
                problems.append(f"{rel}: broken asset {asset} ({why})")
        problems += [f"{rel}: external asset {u} (pages must load nothing from outside the site)" for u in r.fetched]
    for css in sorted(site.rglob("*.css")):
        problems += [f"{css.relative_to(site).as_posix()}: external asset {u}"
                     for u in _CSS_URL.findall(css.read_text(encoding="utf-8", errors="replace"))]
    return problems


# --- command line ----------------------------------------------------------------------------------------

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/site.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the site")
    b.add_argument("--out", type=Path, default=ROOT / "build" / "site", help="output folder (default build/site)")
    b.add_argument("--strict", action="store_true",
                   help="fail when a claim did not hold on the run that made a page (the release check)")
    c = sub.add_parser("check", help="check a built site's links and assets")
    c.add_argument("site", type=Path, help="the built site's folder, e.g. build/site")
    args = parser.parse_args(argv)
    if args.command == "build":
        # the notebooks a build has to execute run as the tests run them: quick, offline
        for key, value in (("COURSE_QUICK", "1"), ("COURSE_OFFLINE", "1"), ("HF_HUB_OFFLINE", "1"),
                           ("TOKENIZERS_PARALLELISM", "false")):
            os.environ.setdefault(key, value)
        try:
            build(args.out, strict=args.strict)
        except (SiteError, nbexec.NotebookFailed) as e:
            print(f"site build failed: {e}", file=sys.stderr)
            return 1
        return 0
    problems = check(args.site)
    for p in problems:
        print(p)
    print(f"{args.site}: {len(problems)} problem(s)" if problems else f"{args.site}: every link and asset resolves")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
