"""The course site (tools/site.py, `make site`) on a small course made here: which executed copy a page
comes from, widgets' static stand-ins from a widget state nbclient recorded, labs as student versions only,
links rewritten, and the link check catching what a reader would hit. No kernel runs: execution is the
tests' own job (root conftest.py) and is replaced here by a stand-in that records its calls."""
import hashlib
import json
import re
import shutil
from pathlib import Path

import nbformat
import pytest

from tools import nbexec
from tools import site as site_tool

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "tests" / "data" / "site" / "widget_notebook.ipynb"  # executed by nbexec, widget state kept

SYLLABUS = """# Syllabus

Two modules.

## Module 00 — Basics  (available)
- Notebook `00_basics.ipynb`, lab `lab00.ipynb`; library [`course_lib/x.py`](course_lib/x.py).

## Module 01 — Widgets  (available)
- Notebook `notebooks/01_widgets.ipynb`, lab `labs/lab01.ipynb`.
"""


def _nb(*cells):
    nb = nbformat.v4.new_notebook()
    nb.metadata.kernelspec = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nb.cells = [nbformat.v4.new_markdown_cell(c) if c.startswith("#") else nbformat.v4.new_code_cell(c)
                for c in cells]
    return nb


def _executed(src: Path, dest_dir: Path, device="cpu", sha=None, text="out"):
    """An executed copy of `src` as nbexec writes one (outputs, metadata), recording `sha`."""
    nb = nbformat.read(src, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"{text}\n")]
    nb.metadata[nbexec.META_KEY] = {"source_sha256": sha or nbexec.source_sha256(src), "quick": device == "cpu",
                                    "device": device, "torch": "2.x", "date": "2026-01-01T00:00:00+00:00"}
    dest_dir.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, dest_dir / src.name)
    return dest_dir / src.name


@pytest.fixture
def course(tmp_path, monkeypatch):
    """A two-module course: syllabus, two notebooks (one with the recorded widget), two student labs, a
    solution that must never be published, executed copies from 'the tests'."""
    root = tmp_path / "course"
    (root / "notebooks").mkdir(parents=True)
    (root / "labs").mkdir()
    (root / "solutions").mkdir()
    (root / "course_lib").mkdir()
    (root / "course_lib" / "x.py").write_text("x = 1\n")
    (root / "README.md").write_text("# Tiny course — for the site tests\n")
    (root / "syllabus.md").write_text(SYLLABUS)
    nbformat.write(_nb("# Module 00 · Basics\n\nEnergy $E = mc^2$; see [the lab](../labs/lab00.ipynb#Exercise-1), "
                       "[the syllabus](../syllabus.md), [the library](../course_lib/x.py).",
                       "print('hello')"), root / "notebooks" / "00_basics.ipynb")
    recorded = nbformat.read(RECORDED, as_version=4)
    for cell in recorded.cells:          # the tracked notebook: the recorded one without its outputs
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    recorded.metadata = {"kernelspec": recorded.metadata.kernelspec}
    nbformat.write(recorded, root / "notebooks" / "01_widgets.ipynb")
    executed = nbformat.read(RECORDED, as_version=4)
    executed.metadata[nbexec.META_KEY]["source_sha256"] = nbexec.source_sha256(root / "notebooks" / "01_widgets.ipynb")
    (root / "build" / "executed").mkdir(parents=True)
    nbformat.write(executed, root / "build" / "executed" / "01_widgets.ipynb")
    _executed(root / "notebooks" / "00_basics.ipynb", root / "build" / "executed")
    for n in ("00", "01"):
        nbformat.write(_nb(f"# Lab {n} — exercises\n\n## Exercise 1", "def f():\n    # YOUR CODE HERE\n"
                           "    raise NotImplementedError()", "assert f() == 1"), root / "labs" / f"lab{n}.ipynb")
    nbformat.write(_nb("# Lab 00", "def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION",
                       "### BEGIN HIDDEN TESTS\nassert f() == 1\n### END HIDDEN TESTS"),
                   root / "solutions" / "lab00.ipynb")
    calls = []

    def execute(path, out_dir, timeout=nbexec.CELL_TIMEOUT_S):   # stands in for the kernel run
        calls.append(Path(path).name)
        return _executed(Path(path), Path(out_dir), text="fresh")
    monkeypatch.setattr(nbexec, "execute_notebook", execute)
    return root, calls


def _build(root):
    out = root / "build" / "site"
    site_tool.build(out, root, log=lambda *a: None)
    return out


def _pages(out):
    return {p.relative_to(out).as_posix(): p.read_text() for p in out.rglob("*.html") if "assets" not in p.parts}


def test_course_site_pages_navigation_and_links(course):
    root, calls = course
    out = _build(root)
    pages = _pages(out)
    assert sorted(pages) == ["index.html", "labs/lab00.html", "labs/lab01.html", "notebooks/00_basics.html",
                             "notebooks/01_widgets.html"]
    assert calls == [], "both executed copies were current: nothing should run"
    home, nb0 = pages["index.html"], pages["notebooks/00_basics.html"]
    # the syllabus is the home page; its code spans naming notebooks and labs link to their pages
    assert "Module 00 — Basics" in home and '<a href="notebooks/00_basics.html"><code>00_basics.ipynb</code></a>' in home
    assert '<a href="labs/lab01.html"><code>labs/lab01.ipynb</code></a>' in home
    # navigation: every module's pages, previous / next in reading order
    assert nb0.count('href="../labs/lab01.html"') >= 1 and 'href="../index.html"' in nb0
    assert re.search(r'class="course-prev" href="../index.html"', nb0)
    assert re.search(r'class="course-next" href="../labs/lab00.html">Lab 00 · Basics →', nb0)
    assert "<title>Module 00 · Basics</title>" in nb0
    # repository links: to the site page when there is one (anchor kept), else GitHub at the release tag
    assert 'href="../labs/lab00.html#Exercise-1"' in nb0 and 'href="../index.html"' in nb0
    from course_lib import RELEASE, REPO_URL
    assert f'href="{REPO_URL}/blob/{RELEASE}/course_lib/x.py"' in nb0
    assert f'href="{REPO_URL}/blob/{RELEASE}/course_lib/x.py"' in home
    # math is left to the bundled MathJax, code is highlighted, the outputs are the executed copy's
    assert "$E = mc^2$" in nb0 and (out / "assets" / "mathjax" / "MathJax.js").is_file()
    assert 'src="../assets/mathjax/MathJax.js?config=' in nb0 and "highlight" in nb0 and "out\n" in nb0
    assert "Outputs from a run on cpu, quick mode" in nb0
    assert site_tool.check(out) == []


def test_widget_becomes_its_figure_controls_and_a_colab_link(course):
    """From the state nbclient recorded (tests/data/site/widget_notebook.ipynb): the figure the Output widget
    holds, the HTML widget's text, the controls and their values, a Colab link; nothing of the widget
    renderer (no widget state, no view script) stays on the page."""
    root, _ = course
    nb = nbformat.read(RECORDED, as_version=4)
    assert nb.metadata["widgets"][site_tool.WIDGET_STATE]["state"], "the recording lost its widget state"
    assert site_tool.replace_widgets(nb, "https://colab.example/01") == 1
    standin = nb.cells[1].outputs[0].data
    assert list(standin) == ["text/html"] and "widgets" not in nb.metadata
    html = standin["text/html"]
    assert re.search(r'<img alt="figure" src="data:image/png;base64,[A-Za-z0-9+/=]{100,}">', html)
    assert "<b>blocks</b> used 3" in html
    assert "Controls: n = 3; mode = b; buttons: Go" in html
    assert '<a href="https://colab.example/01">run it on Colab</a>' in html
    page = _pages(_build(root))["notebooks/01_widgets.html"]
    from course_lib import colab_url
    assert "course-widget" in page and f'href="{colab_url("notebooks/01_widgets.ipynb")}"' in page
    assert site_tool.WIDGET_VIEW not in page and site_tool.WIDGET_STATE not in page


def test_progress_bar_becomes_a_static_bar_without_a_colab_link():
    """tqdm's notebook bar (HBox of HTML, FloatProgress, HTML) has no controls: it stays a finished bar."""
    def model(name, **state):
        return {"model_name": name, "model_module": "@jupyter-widgets/controls", "state": state}
    states = {"box": model("HBoxModel", children=["IPY_MODEL_d", "IPY_MODEL_p", "IPY_MODEL_n"], layout="IPY_MODEL_l"),
              "d": model("HTMLModel", value="train"), "p": model("FloatProgressModel", value=5.0, max=10.0),
              "n": model("HTMLModel", value="5/10 [00:01]"), "l": model("LayoutModel", width="auto")}
    html = site_tool.widget_standin("box", states, "https://colab.example/x")
    assert html == ('<div class="course-widget"><div class="course-widget-row"><div><div class="course-widget-text">'
                    'train</div></div><div><progress value="5.0" max="10.0"></progress></div><div>'
                    '<div class="course-widget-text">5/10 [00:01]</div></div></div></div>')


def test_widget_without_saved_state_still_gets_a_colab_link():
    html = site_tool.widget_standin("missing", {}, "https://colab.example/x")
    assert "not saved" in html and "https://colab.example/x" in html


def test_stale_copy_is_executed_again_and_a_current_one_is_not(course):
    root, calls = course
    _executed(root / "notebooks" / "00_basics.ipynb", root / "build" / "executed", sha="0" * 64, text="stale")
    out = _build(root)
    assert calls == ["00_basics.ipynb"]
    page = _pages(out)["notebooks/00_basics.html"]
    assert "fresh" in page and "stale" not in page
    calls.clear()
    _build(root)   # the fresh copy recorded the tracked sha: current now
    assert calls == []


def test_gpu_copy_is_preferred_when_current(course):
    root, calls = course
    src = root / "notebooks" / "00_basics.ipynb"
    _executed(src, root / "executed" / "gpu", device="NVIDIA H100 80GB HBM3", text="on the gpu")
    page = _pages(_build(root))["notebooks/00_basics.html"]
    assert "on the gpu" in page and "NVIDIA H100 80GB HBM3, full size" in page
    # a GPU copy of an older version of the notebook is not used: the tests' current copy is
    _executed(src, root / "executed" / "gpu", device="NVIDIA H100 80GB HBM3", sha="1" * 64, text="old gpu")
    page = _pages(_build(root))["notebooks/00_basics.html"]
    assert "old gpu" not in page and "out\n" in page and calls == []


def test_labs_are_student_versions_only(course):
    root, _ = course
    out = _build(root)
    text = "".join(_pages(out).values())
    assert "NotImplementedError" in text and "YOUR CODE HERE" in text
    assert not any(m in text for pair in site_tool.SECRET_MARKERS for m in pair) and not (out / "solutions").exists()
    shutil.copy(root / "solutions" / "lab00.ipynb", root / "labs" / "lab00.ipynb")   # a solution in labs/
    with pytest.raises(site_tool.SiteError, match=r"labs/lab00.ipynb: cell 1 holds 'BEGIN SOLUTION'"):
        _build(root)


def test_link_check_names_each_broken_link_and_external_asset(course):
    root, _ = course
    out = _build(root)
    lab = out / "labs" / "lab00.html"
    lab.write_text(lab.read_text().replace(
        "</main>", '<a href="../notebooks/99_missing.html">gone</a><a href="../index.html#no-such-anchor">x</a>'
                   '<script src="https://cdn.example.org/require.js"></script>'
                   '<link rel="stylesheet" href="//cdn.example.org/x.css">'
                   '<img src="../assets/nothing.png"></main>'))
    problems = site_tool.check(out)
    assert problems == [
        "labs/lab00.html: broken link ../notebooks/99_missing.html (no such file)",
        "labs/lab00.html: broken link ../index.html#no-such-anchor (no id 'no-such-anchor' in index.html)",
        "labs/lab00.html: external asset <script src=https://cdn.example.org/require.js> "
        "(pages must load nothing from outside the site)",
        "labs/lab00.html: external asset <link href=//cdn.example.org/x.css> "
        "(pages must load nothing from outside the site)",
        "labs/lab00.html: broken asset <img src=../assets/nothing.png> (no such file)"], problems
    assert site_tool.main(["check", str(out)]) == 1


def test_check_catches_urls_fetched_by_inline_script_and_css(course):
    root, _ = course
    out = _build(root)
    page = out / "index.html"
    page.write_text(page.read_text().replace("</main>", "<style>@import 'https://fonts.example/x.css';</style>"
                                            "<script>s.src = 'https://unpkg.example/embed.js';</script></main>"))
    assert site_tool.check(out) == [
        "index.html: external asset <style> https://fonts.example/x.css (pages must load nothing from outside the site)",
        "index.html: external asset <script> https://unpkg.example/embed.js (pages must load nothing from outside the site)"]


def test_link_to_a_missing_repository_file_fails_the_build(course):
    root, _ = course
    nb_path = root / "notebooks" / "00_basics.ipynb"
    nb = nbformat.read(nb_path, as_version=4)
    nb.cells[0].source += " And [module 13](13_future.ipynb)."
    nbformat.write(nb, nb_path)
    with pytest.raises(site_tool.SiteError, match=r"notebooks/00_basics.ipynb: the link '13_future.ipynb' points "
                                                  r"to notebooks/13_future.ipynb, which is not in the repository"):
        _build(root)


def test_build_refuses_to_empty_a_folder_it_did_not_build(course, tmp_path):
    root, _ = course
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("mine")
    with pytest.raises(site_tool.SiteError, match="--out .*mine: exists and is not a site built by tools/site.py"):
        site_tool.build(mine, root, log=lambda *a: None)
    assert (mine / "keep.txt").read_text() == "mine"


def test_the_real_course_plan_has_every_module_notebook_and_student_lab():
    plan = site_tool.plan(ROOT)
    srcs = [p.src for p in plan.pages]
    notebooks = sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("notebooks/*.ipynb"))
    labs = sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("labs/*.ipynb"))
    assert srcs[0] == "syllabus.md" and sorted(srcs[1:]) == sorted(notebooks + labs)
    assert [m.number for m in plan.modules] == [f"{i:02d}" for i in range(13)]
    assert all(m.title and m.notebook and m.lab for m in plan.modules)
    assert not any(s.startswith("solutions/") for s in srcs)


def test_site_url_is_derived_from_the_repository_and_linked_from_readme():
    from course_lib import REPO, SITE_URL
    owner, name = REPO.split("/")
    assert SITE_URL == f"https://{owner}.github.io/{name}/"
    assert SITE_URL in (ROOT / "README.md").read_text()


def test_executed_copy_records_the_tracked_sha(tmp_path):
    """nbexec.current_copy takes a copy only when it recorded exactly the tracked file's sha256."""
    src = tmp_path / "n.ipynb"
    nbformat.write(_nb("print(1)"), src)
    good, stale = tmp_path / "good", tmp_path / "stale"
    _executed(src, good)
    _executed(src, stale, sha=hashlib.sha256(b"other").hexdigest())
    assert nbexec.current_copy(src, [stale, good]) == good / "n.ipynb"
    assert nbexec.current_copy(src, [stale]) is None
    (good / "n.ipynb").write_text(json.dumps({"not": "a notebook"}))
    assert nbexec.current_copy(src, [good]) is None
