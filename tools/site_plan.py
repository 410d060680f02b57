r"""The course site's plan and the page machinery its pages (tools/site.py) and its slide decks (tools/slides.py)
share: which pages and decks the site holds and where (`plan`, `deck_path`), the executed notebook behind
each, the notebook made ready to render (widgets replaced by static stand-ins, math written for MathJax 2),
the links of a rendered page pointed at the site or GitHub, and the all-or-nothing build folder (a staging
folder beside the destination, swapped in once complete).

Both tools import this module and neither imports the other's internals, so the site (which builds the decks
too) imports the decks' tool, and the decks' tool imports only this.
"""
from __future__ import annotations

import html
import os
import posixpath
import re
import shutil
import sys
import tempfile
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from course_lib import RELEASE, REPO_URL  # noqa: E402
from tools import nbexec  # noqa: E402

ASSETS = Path(__file__).resolve().parent / "site_assets"
EXECUTED_DIR = "build/executed"    # what the tests leave (root conftest.py)
GPU_EXECUTED_DIR = "executed/gpu"  # committed copies executed on a GPU (tools/gpu_check.sh collects them)
SITE_MARK = ".course-site"         # marks a folder this tool built, so that a rebuild may empty it
COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


class SiteError(Exception):
    """The site cannot be built as asked; the message says which file and why."""


# --- what the site holds ---------------------------------------------------------------------------------

@dataclass
class Page:
    src: str                  # repository path: syllabus.md, notebooks/NN_slug.ipynb, labs/labNN.ipynb
    out: str                  # site path: index.html, notebooks/NN_slug.html, labs/labNN.html
    kind: str                 # "home", "notebook", "lab", "bibliography", "glossary"
    title: str
    module: str | None = None


@dataclass
class Module:
    number: str
    title: str
    notebook: str | None = None   # site path of its notebook page
    lab: str | None = None
    slides: str | None = None     # site path of its slide deck (tools/slides.py)
    project: str | None = None    # site path of the project it ends in (a student lab too: PROJECTS)


@dataclass
class Plan:
    course_title: str
    pages: list[Page]
    modules: list[Module] = field(default_factory=list)
    extras: list[Page] = field(default_factory=list)    # bibliography and glossary: in the navigation, not in
    #                                                     the reading order (no previous / next)
    warnings: list[str] = field(default_factory=list)   # filled by build: claims that did not hold, per page


# the reference pages, each built from a data file at the repository root when it exists
EXTRAS = (("references.yaml", "bibliography.html", "bibliography", "Bibliography"),
          ("glossary.yaml", "glossary.html", "glossary", "Glossary"))


def _first_heading(text: str) -> str | None:
    m = re.search(r"^#\s+(.+?)\s*$", text, re.M)
    return m.group(1) if m else None


def _notebook_title(nb) -> str | None:
    for cell in nb.cells:
        if cell.cell_type == "markdown" and (title := _first_heading(cell.source)):
            return title
    return None


def deck_path(notebook: str) -> str:
    """The site path of the deck of `notebook` (a repository or site path): slides/NN_slug.slides.html."""
    name = posixpath.basename(notebook)
    return f"slides/{name.rsplit('.', 1)[0]}.slides.html"


# Labs that are a module's project rather than a module of their own: lab number -> the module it ends.
# Its page is the student version, like every lab's (its grader and hidden tests never reach the site).
PROJECTS = {"13": "12"}


def plan(root: Path = ROOT) -> Plan:
    """The site's pages in reading order (home, then each module's notebook and lab) and its modules."""
    syllabus = root / "syllabus.md"
    if not syllabus.is_file():
        raise SiteError(f"{syllabus}: the home page is built from syllabus.md, which is missing")
    text = syllabus.read_text()
    titles = dict(re.findall(r"^## Module (\d\d)\s*[—-]\s*(.+?)(?:\s+\((?:available|planned)\))?\s*$", text, re.M))
    readme = root / "README.md"
    course_title = (_first_heading(readme.read_text()) if readme.is_file() else None) or "The course"
    course_title = course_title.split(" — ")[0]
    notebooks = {p.name[:2]: p for p in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))}
    labs = {p.stem[3:]: p for p in sorted((root / "labs").glob("lab[0-9][0-9].ipynb"))}
    projects = {PROJECTS[n]: labs.pop(n) for n in list(labs) if n in PROJECTS}
    pages = [Page("syllabus.md", "index.html", "home", _first_heading(text) or "Syllabus")]
    modules = []
    for num in sorted(notebooks.keys() | labs.keys()):
        path = notebooks.get(num) or labs[num]
        # named as the syllabus names it; a module it does not list yet, by its notebook's first heading
        module = Module(num, titles.get(num) or _notebook_title(nbformat.read(path, as_version=4)) or path.stem)
        for path, kind, label in ((notebooks.get(num), "notebook", "Module"), (labs.get(num), "lab", "Lab")):
            if path is not None:
                rel = path.relative_to(root).as_posix()
                page = Page(rel, rel[:-len(".ipynb")] + ".html", kind, f"{label} {num} · {module.title}", num)
                pages.append(page)
                setattr(module, kind, page.out)
                if kind == "notebook":
                    module.slides = deck_path(rel)
        if num in projects:
            rel = projects[num].relative_to(root).as_posix()
            title = _notebook_title(nbformat.read(projects[num], as_version=4)) or projects[num].stem
            title = re.sub(r"^Lab \d+ · ", "", title)      # "Lab 13 · The final project: ..." -> "The final ..."
            page = Page(rel, rel[:-len(".ipynb")] + ".html", "lab", f"Project · {title}", num)
            pages.append(page)
            module.project = page.out
        modules.append(module)
    extras = [Page(src, out, kind, title) for src, out, kind, title in EXTRAS if (root / src).is_file()]
    return Plan(course_title, pages, modules, extras)


# --- executed notebooks ----------------------------------------------------------------------------------

def executed_notebook(src: Path, root: Path = ROOT) -> tuple[nbformat.NotebookNode, str]:
    """The executed notebook for the tracked `src` and where it came from: a current GPU copy, else a
    current copy from the tests, else a fresh execution (written where the tests write theirs)."""
    copy_path = nbexec.current_copy(src, [root / GPU_EXECUTED_DIR, root / EXECUTED_DIR])
    if copy_path is None:
        copy_path = nbexec.execute_notebook(src, root / EXECUTED_DIR)
        origin = "executed now"
    else:
        origin = copy_path.parent.relative_to(root).as_posix()
    return nbformat.read(copy_path, as_version=4), origin


# --- math ---------------------------------------------------------------------------------------------

# text-mode arguments inside math, and the escapes MathJax 3's textmacros (JupyterLab) reads there but
# MathJax 2 (this site) shows with their backslash; MathJax 2 itself unescapes \$ \{ \} \\ there
_TEXT_MACRO = re.compile(r"\\(?:text|textrm|textit|textbf|textsf|texttt|textup|textnormal|mbox|hbox)\s*\{")
_TEXT_ESCAPES = re.compile(r"\\([_%&#])")
# fenced code, code spans, then the math delimiters MathJax is configured with
_MD_MATH = re.compile(r"(?P<code>^[ \t]*(?P<fence>```+|~~~+).*?^[ \t]*(?P=fence)[ \t]*$|(?P<ticks>`+).+?(?P=ticks))"
                      r"|(?P<math>\$\$.+?\$\$|\\\[.+?\\\]|\\\(.+?\\\)|(?<![\\$])\$(?!\$).+?(?<!\\)\$)",
                      re.S | re.M)


def _unescape_text_args(math: str) -> str:
    out, i = [], 0
    for m in _TEXT_MACRO.finditer(math):
        if m.start() < i:      # inside an argument already rewritten
            continue
        depth, j = 1, m.end()
        while j < len(math) and depth:
            if math[j] == "\\":
                j += 2
                continue
            depth += {"{": 1, "}": -1}.get(math[j], 0)
            j += 1
        out += [math[i:m.end()], _TEXT_ESCAPES.sub(r"\1", math[m.end():j])]
        i = j
    return "".join(out) + math[i:]


def text_mode_escapes(markdown: str) -> str:
    """`markdown` with `\\_ \\% \\& \\#` inside the text-mode arguments of its math (`\\text{kv\\_heads}`)
    written plainly (`\\text{kv_heads}`), as MathJax 3's textmacros reads them, so that the site's MathJax 2
    shows what JupyterLab shows; code and text outside math are left as they are."""
    return _MD_MATH.sub(lambda m: m.group(0) if m.group("code") else _unescape_text_args(m.group(0)), markdown)


def fix_math(nb) -> int:
    """Rewrite every markdown cell's math with `text_mode_escapes`; returns how many cells changed."""
    n = 0
    for cell in nb.cells:
        if cell.cell_type == "markdown" and (fixed := text_mode_escapes(cell.source)) != cell.source:
            cell.source, n = fixed, n + 1
    return n


# --- widgets: a static stand-in for each view --------------------------------------------------------------

_SELECTIONS = ("Dropdown", "RadioButtons", "ToggleButtons", "Select", "SelectionSlider", "SelectionRangeSlider")
_TEXTS = {"HTMLModel": "html", "HTMLMathModel": "html", "LabelModel": "text"}


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "–".join(_fmt(v) for v in value)
    return str(value)


def _output_html(output: dict, states: dict, seen: set) -> list[str]:
    """HTML for one output held by an Output widget (a figure, text, or a nested widget)."""
    data = output.get("data", {})
    if output.get("output_type") == "stream":
        return [f'<pre class="course-widget-text">{html.escape(output.get("text", ""))}</pre>']
    if WIDGET_VIEW in data:
        if _is_progress_bar(data[WIDGET_VIEW]["model_id"], states):
            return []   # a progress bar (tqdm) that ran while the widget captured output: not the widget's view
        return _tree_html(data[WIDGET_VIEW]["model_id"], states, seen)[0]
    for mime in ("image/png", "image/jpeg"):
        if mime in data:
            return [f'<img alt="figure" src="data:{mime};base64,{data[mime].strip()}">']
    if "image/svg+xml" in data:
        return [data["image/svg+xml"]]
    if "text/html" in data:
        return [f'<div class="course-widget-text">{data["text/html"]}</div>']
    if "text/plain" in data:
        return [f'<pre class="course-widget-text">{html.escape(data["text/plain"])}</pre>']
    return []


def _is_progress_bar(model_id: str, states: dict) -> bool:
    """A progress bar: a progress model, or tqdm's notebook bar (a box of texts around one)."""
    name = states.get(model_id, {}).get("model_name", "")
    if name in ("IntProgressModel", "FloatProgressModel"):
        return True
    children = states.get(model_id, {}).get("state", {}).get("children", [])
    kids = [states.get(r, {}).get("model_name", "") for r in nbexec.model_refs(children, views=False)]
    return (name == "HBoxModel" and any(k in ("IntProgressModel", "FloatProgressModel") for k in kids)
            and all(k in ("IntProgressModel", "FloatProgressModel", "HTMLModel", "LabelModel") for k in kids))


def _tree_html(model_id: str, states: dict, seen: set) -> tuple[list[str], list[str], list[str]]:
    """Walk the widget tree under `model_id`: (what it shows, its controls with their values, its buttons)."""
    shown, controls, buttons = [], [], []
    if model_id in seen or model_id not in states:
        return shown, controls, buttons
    seen.add(model_id)
    name = states[model_id].get("model_name", "")
    st = states[model_id].get("state", {})
    label = st.get("description") or name.removesuffix("Model")
    if name == "OutputModel":
        for output in st.get("outputs", []):
            shown += _output_html(output, states, seen)
    elif name in _TEXTS and st.get("value"):
        value = st["value"] if _TEXTS[name] == "html" else html.escape(st["value"])
        shown.append(f'<div class="course-widget-text">{value}</div>')
    elif name in ("IntProgressModel", "FloatProgressModel"):
        shown.append(f'<progress value="{st.get("value", 0)}" max="{st.get("max", 100)}"></progress>')
    elif name == "ButtonModel":
        buttons.append(label)
    elif name.removesuffix("Model") in _SELECTIONS and "_options_labels" in st:
        index, labels = st.get("index"), st["_options_labels"]
        picked = ([labels[i] for i in index] if isinstance(index, (list, tuple))
                  else labels[index] if index is not None else "none")
        controls.append(f"{label} = {_fmt(picked)}")
    elif "value" in st and not name.endswith(("LayoutModel", "StyleModel")):
        controls.append(f"{label} = {_fmt(st['value'])}")
    parts = [_tree_html(ref, states, seen) for ref in nbexec.model_refs(st, views=False)]
    cells = ["".join(s) for s, _, _ in parts if s]
    if name == "HBoxModel" and len(cells) > 1:   # side by side, as the widget lays them out
        shown.append('<div class="course-widget-row">' + "".join(f"<div>{c}</div>" for c in cells) + "</div>")
    else:
        shown += cells
    for _, c, b in parts:
        controls, buttons = controls + c, buttons + b
    return shown, controls, buttons


def widget_standin(model_id: str, states: dict, colab: str) -> str:
    """The static stand-in for the widget view `model_id`: the figures and text its Output and HTML widgets
    hold, one line with its controls and their values, and a link to run it on Colab (only when it has
    controls). A progress bar alone is shown as a bar, without the widget's frame; a progress bar inside a
    widget (one that ran while the widget captured output) is left out."""
    shown, controls, buttons = _tree_html(model_id, states, set())
    if _is_progress_bar(model_id, states):   # a finished bar (tqdm, a model loading): a line, not a widget box
        return f'<div class="course-progress">{"".join(shown)}</div>'
    if model_id not in states:
        shown = ["<em>An interactive widget (its state was not saved with the notebook).</em>"]
    parts = [*shown]
    if controls or buttons:
        summary = "; ".join(controls + ([f"buttons: {', '.join(buttons)}"] if buttons else []))
        parts.append(f'<p class="course-widget-controls">Controls: {html.escape(summary)}</p>')
    if controls or buttons or model_id not in states:
        parts.append(f'<p class="course-widget-run">A static snapshot of an interactive widget: '
                     f'<a href="{html.escape(colab)}">run it on Colab</a> to use the controls.</p>')
    return f'<div class="course-widget">{"".join(parts)}</div>'


def replace_widgets(nb, colab: str) -> int:
    """Replace every widget view among the outputs of `nb` by its static stand-in and drop the saved
    widget state (which would pull in a widget renderer from a CDN); returns how many were replaced.
    Each stand-in shows its widget as the cell that displayed it left it (the cell's snapshot, written by
    tools/nbexec.py), not as later cells changed it; a copy without snapshots (executed before they
    existed) falls back to the state at the end of the notebook."""
    at_end = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    n = 0
    for cell in nb.cells:
        snapshot = cell.get("metadata", {}).pop(nbexec.SNAPSHOT_KEY, None)
        states = snapshot["state"] if snapshot else at_end
        for output in cell.get("outputs", []):
            view = output.get("data", {}).get(WIDGET_VIEW)
            if view is not None:
                output["data"] = {"text/html": widget_standin(view["model_id"], states, colab)}
                n += 1
    nb.metadata.pop("widgets", None)
    return n


# --- links -------------------------------------------------------------------------------------------

CONTENT_START, CONTENT_END = "<!-- course:content -->", "<!-- /course:content -->"   # set by the template
_HREF = re.compile(r'(<a\b[^>]*?\bhref=")([^"]*)(")', re.S)
_CODE_OR_LINK = re.compile(r"(<a\b.*?</a>)|<code>([^<]+)</code>", re.S)


def relative_link(target: str, page_out: str) -> str:
    return posixpath.relpath(target, posixpath.dirname(page_out) or ".")


def rewrite_links(body: str, page: Page, site_pages: dict[str, str], root: Path) -> str:
    """Point the page's links at the site: a link to a repository file that has a page goes to that page,
    any other repository file to its GitHub page at the release tag; a code span naming a notebook or lab
    (`lab01.ipynb`, `notebooks/05_kv_caching.ipynb`) becomes a link to its page. A link to a file that does
    not exist is an error, never a dangling link."""
    def href(m):
        url = html.unescape(m.group(2))
        parts = urllib.parse.urlsplit(url)
        if parts.scheme or parts.netloc or not parts.path:   # external, mailto:, or #anchor on this page
            return m.group(0)
        target = posixpath.normpath(posixpath.join(posixpath.dirname(page.src), urllib.parse.unquote(parts.path)))
        if target.startswith("../") or not (root / target).exists():
            raise SiteError(f"{page.src}: the link {url!r} points to {target}, which is not in the repository")
        if target in site_pages:
            new = relative_link(site_pages[target], page.out) + (f"#{parts.fragment}" if parts.fragment else "")
        else:
            kind = "tree" if (root / target).is_dir() else "blob"
            new = f"{REPO_URL}/{kind}/{RELEASE}/{target}" + (f"#{parts.fragment}" if parts.fragment else "")
        return m.group(1) + html.escape(new) + m.group(3)

    by_name = {}
    for src, out in site_pages.items():
        if src.endswith(".ipynb"):
            by_name[src] = by_name[posixpath.basename(src)] = out

    def code(m):
        if m.group(1) or html.unescape(m.group(2)) not in by_name:
            return m.group(0)
        return f'<a href="{relative_link(by_name[html.unescape(m.group(2))], page.out)}">{m.group(0)}</a>'

    head, rest = body.split(CONTENT_START, 1)   # only the notebook's own content: not the navigation
    content, tail = rest.split(CONTENT_END, 1)
    content = _CODE_OR_LINK.sub(code, _HREF.sub(href, content))
    content = content.replace(f'src="{COLAB_BADGE}"', f'src="{relative_link("assets/colab-badge.svg", page.out)}"')
    return head + CONTENT_START + content + CONTENT_END + tail


def copy_assets(out: Path) -> None:
    import importlib.util
    spec = importlib.util.find_spec("jupyter_server_mathjax")
    if spec is None or not spec.origin:
        raise SiteError("MathJax is bundled from the jupyter-server-mathjax package, which is not installed: "
                        "pip install -e '.[dev]' (or pip install jupyter-server-mathjax)")
    assets = out / "assets"
    shutil.copytree(Path(spec.origin).parent / "static", assets / "mathjax")
    shutil.copytree(ASSETS / "reveal.js", assets / "reveal.js")   # the slide decks' (tools/slides.py)
    for name in ("site.css", "colab-badge.svg"):
        shutil.copy2(ASSETS / name, assets / name)


def check_out(out: Path) -> None:
    """Refuse an `out` that is not a folder this tool built (or an empty or new one): a build replaces it."""
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / SITE_MARK).exists())):
        raise SiteError(f"--out {out}: exists and is not a site built by tools/site.py; "
                        "give a new or empty folder")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # someone else's process
        return True
    return True


def staging_dir(out: Path) -> Path:
    """A new folder beside `out` (same file system, so the swap is a rename) to build into; folders that
    an earlier build left there when it was killed (its process is gone) are removed first."""
    out.parent.mkdir(parents=True, exist_ok=True)
    for old in out.parent.glob(f".{out.name}.*-*"):
        m = re.fullmatch(rf"\.{re.escape(out.name)}\.(?:building|replaced)-(\d+)-.*", old.name)
        if m and (old / SITE_MARK).is_file() and not _pid_alive(int(m.group(1))):
            shutil.rmtree(old, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-{os.getpid()}-", dir=out.parent))
    (staging / SITE_MARK).write_text("built by tools/site.py; replaced by each build\n")
    (staging / ".nojekyll").write_text("")   # GitHub Pages serves the files as they are (no Jekyll)
    return staging


def swap_in(staging: Path, out: Path) -> None:
    """Put the finished build at `out`, replacing the previous site (two renames; the old one is deleted
    only once the new one is in place, and put back if the second rename fails)."""
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.replaced-{os.getpid()}-", dir=out.parent))
        old.rmdir()
        out.rename(old)
    try:
        staging.rename(out)
    except OSError:
        if old is not None:
            old.rename(out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
