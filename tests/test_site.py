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
from tools import site_plan

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
                             "notebooks/01_widgets.html", "slides/00_basics.slides.html",
                             "slides/01_widgets.slides.html"]
    assert calls == [], "both executed copies were current: nothing should run"
    home, nb0 = pages["index.html"], pages["notebooks/00_basics.html"]
    # the syllabus is the home page; its code spans naming notebooks and labs link to their pages
    assert "Module 00 — Basics" in home
    assert '<a href="notebooks/00_basics.html"><code>00_basics.ipynb</code></a>' in home
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


BIB = """shazeer2019fast:
  authors: [Noam Shazeer]
  title: "Fast Transformer Decoding: One Write-Head is All You Need"
  venue: arXiv preprint
  year: 2019
  arxiv: "1911.02150"
  uses: "Multi-query attention."
"""
GLOSSARY = """kv-cache:
  term: KV cache
  match: [KV cache]
  module: "00"
  definition: The keys and values of the tokens so far, kept for the next step.
  see: [prefill]

prefill:
  term: Prefill
  match: [prefill]
  module: "00"
  definition: The forward pass over the `prompt`.
"""


def test_bibliography_and_glossary_pages_and_the_links_to_them(course):
    """With references.yaml and glossary.yaml the site has a bibliography and a glossary page, in every page's
    navigation; a citation, in its source form or as tools/nb.py writes it, links to its entry, which lists
    the pages citing it; the first use of a term on a notebook page links to the glossary, never in code."""
    from tools import references
    root, _ = course
    (root / "references.yaml").write_text(BIB)
    (root / "glossary.yaml").write_text(GLOSSARY)
    nb_path = root / "notebooks" / "00_basics.ipynb"
    nb = nbformat.read(nb_path, as_version=4)
    nb.cells[0].source += "\n\nThe KV cache [@shazeer2019fast] after the prefill; the KV cache again; `KV cache`."
    built = references.render("## Further reading\n\n* [@shazeer2019fast]: MQA.",
                              references.load(root / "references.yaml"))
    assert "https://arxiv.org/abs/1911.02150" in built            # as tools/nb.py writes it
    nb.cells.append(nbformat.v4.new_markdown_cell(built))
    nbformat.write(nb, nb_path)
    _executed(nb_path, root / "build" / "executed")
    out = _build(root)
    pages = _pages(out)
    assert sorted(pages) == ["bibliography.html", "glossary.html", "index.html", "labs/lab00.html", "labs/lab01.html",
                             "notebooks/00_basics.html", "notebooks/01_widgets.html",
                             "slides/00_basics.slides.html", "slides/01_widgets.slides.html"]
    nb0 = pages["notebooks/00_basics.html"]
    assert nb0.count('href="../bibliography.html#shazeer2019fast"') == 2, nb0
    assert ">Shazeer, 2019</a>" in nb0 and "[@" not in nb0 and "arxiv.org" not in nb0
    assert nb0.count('href="../glossary.html#kv-cache"') == 1 and nb0.count('href="../glossary.html#prefill"') == 1
    assert "<code>KV cache</code>" in nb0
    for rel, page in pages.items():
        if rel.startswith("slides/"):   # a deck has no navigation: it links back to its module's page
            continue
        assert 'glossary.html">Glossary</a>' in page and 'bibliography.html">Bibliography</a>' in page, rel
    assert 'class="course-prev" href="labs/lab01.html"' not in pages["bibliography.html"]   # not in the reading order
    bib = pages["bibliography.html"]
    assert '<dt id="shazeer2019fast">Noam Shazeer. <cite>Fast Transformer Decoding: One Write-Head is All You ' \
           'Need</cite>. arXiv preprint, 2019.</dt>' in bib
    assert '<a href="https://arxiv.org/abs/1911.02150">arXiv:1911.02150</a>' in bib and "Multi-query attention." in bib
    assert 'Cited in: <a href="notebooks/00_basics.html">Module 00 · Basics</a>' in bib
    glossary_page = pages["glossary.html"]
    assert '<h3 id="kv-cache">KV cache</h3>' in glossary_page and "<code>prompt</code>" in glossary_page
    assert 'Introduced in <a href="notebooks/00_basics.html">Module 00 · Basics</a>' in glossary_page
    assert '<a href="#prefill">Prefill</a>' in glossary_page
    assert site_tool.check(out) == []


def test_a_citation_of_a_missing_entry_fails_the_build(course):
    root, _ = course
    (root / "references.yaml").write_text(BIB)
    nb_path = root / "labs" / "lab00.ipynb"
    nb = nbformat.read(nb_path, as_version=4)
    nb.cells[0].source += " See [@nosuch2020key]."
    nbformat.write(nb, nb_path)
    with pytest.raises(site_tool.SiteError, match=r"labs/lab00.ipynb: cell 0: the citation key 'nosuch2020key'"):
        _build(root)


def test_the_real_course_has_a_bibliography_and_a_glossary_page():
    plan = site_plan.plan(ROOT)
    assert [(p.src, p.out) for p in plan.extras] == [("references.yaml", "bibliography.html"),
                                                     ("glossary.yaml", "glossary.html")]


def test_each_module_has_its_slide_deck_linked_from_its_page_and_the_module_list(course):
    """`make site` builds a deck per notebook (tools/slides.py) from the same executed copy, beside the pages:
    reveal.js from the site's assets, links rewritten as on the pages, linked from the module's page and from
    every page's module list; the link check covers the decks."""
    root, calls = course
    out = _build(root)
    pages = _pages(out)
    nb0, home, deck = pages["notebooks/00_basics.html"], pages["index.html"], pages["slides/00_basics.slides.html"]
    assert calls == []
    assert '<a href="../slides/00_basics.slides.html">slides</a>' in nb0       # the info line
    assert '<a href="slides/01_widgets.slides.html">slides</a>' in home        # the module list
    assert 'src="../assets/reveal.js/dist/reveal.js"' in deck and (out / "assets/reveal.js/dist/reveal.js").is_file()
    assert "out\n" in deck and "Energy $E = mc^2$" in deck                    # the executed copy's outputs, the math
    assert 'href="../labs/lab00.html#Exercise-1"' in deck and 'href="../notebooks/00_basics.html"' in deck
    widgets = pages["slides/01_widgets.slides.html"]                             # widgets as their stand-ins
    assert 'class="course-widget"' in widgets and site_plan.WIDGET_STATE not in widgets
    assert site_tool.check(out) == []


def test_widget_becomes_its_figure_controls_and_a_colab_link(course):
    """From the state nbclient recorded (tests/data/site/widget_notebook.ipynb): the figure the Output widget
    holds, the HTML widget's text, the controls and their values, a Colab link; nothing of the widget
    renderer (no widget state, no view script) stays on the page."""
    root, _ = course
    nb = nbformat.read(RECORDED, as_version=4)
    assert nb.metadata["widgets"][site_plan.WIDGET_STATE]["state"], "the recording lost its widget state"
    assert site_plan.replace_widgets(nb, "https://colab.example/01") == 1
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
    assert site_plan.WIDGET_VIEW not in page and site_plan.WIDGET_STATE not in page


def test_a_stand_in_shows_the_widget_as_its_own_cell_left_it():
    """nbexec snapshots each displayed widget when its cell finishes: the recording's next cell sets n = 7
    and the text to "used 7" (the state at the end of the notebook), the stand-in shows the cell's n = 3."""
    nb = nbformat.read(RECORDED, as_version=4)
    end = nb.metadata["widgets"][site_plan.WIDGET_STATE]["state"]
    assert sorted(st["state"].get("value") for st in end.values() if st["model_name"] == "IntSliderModel") == [7]
    snapshot = nb.cells[1].metadata[nbexec.SNAPSHOT_KEY]["state"]
    assert [st["state"]["value"] for st in snapshot.values() if st["model_name"] == "IntSliderModel"] == [3]
    assert nbexec.SNAPSHOT_KEY not in nb.cells[2].metadata       # it displays no widget
    site_plan.replace_widgets(nb, "https://colab.example/01")
    html = nb.cells[1].outputs[0].data["text/html"]
    assert "Controls: n = 3;" in html and "<b>blocks</b> used 3" in html and "used 7" not in html
    assert all(nbexec.SNAPSHOT_KEY not in c.metadata for c in nb.cells)   # not carried into the page
    # a copy executed before snapshots existed: the state at the end of the notebook, as before
    old = nbformat.read(RECORDED, as_version=4)
    del old.cells[1].metadata[nbexec.SNAPSHOT_KEY]
    site_plan.replace_widgets(old, "https://colab.example/01")
    assert "Controls: n = 7;" in old.cells[1].outputs[0].data["text/html"]


def test_widget_snapshot_is_a_copy_of_the_models_a_view_reaches():
    """Children, layouts and the widgets an Output displays are reached; other widgets are not; the copy
    does not follow later changes (nbclient updates its dicts and Output lists in place)."""
    def model(name, **state):
        return {"_model_name": name, "_model_module": "@jupyter-widgets/controls", **state}
    outputs = [{"output_type": "display_data", "data": {nbexec.WIDGET_VIEW: {"model_id": "inner"}}}]
    live = {"box": model("VBoxModel", children=["IPY_MODEL_out", "IPY_MODEL_s"], layout="IPY_MODEL_l"),
            "out": model("OutputModel", outputs=outputs), "inner": model("HTMLModel", value="shown"),
            "s": model("IntSliderModel", value=1), "l": model("LayoutModel"), "other": model("IntSliderModel"),
            "nameless": {"value": 1}}
    snap = nbexec.widget_snapshot(live, {"s": {("x",): {"path": ["x"], "data": "AA==", "encoding": "base64"}}},
                                  ["box", "nameless"])
    assert sorted(snap["state"]) == ["box", "inner", "l", "out", "s"]
    assert snap["state"]["s"] == {"model_name": "IntSliderModel", "model_module": "@jupyter-widgets/controls",
                                  "model_module_version": None, "state": live["s"],
                                  "buffers": [{"path": ["x"], "data": "AA==", "encoding": "base64"}]}
    live["s"]["value"] = 9
    outputs.append({"output_type": "stream", "name": "stdout", "text": "later"})
    assert snap["state"]["s"]["state"]["value"] == 1 and len(snap["state"]["out"]["state"]["outputs"]) == 1


def test_progress_bar_becomes_a_static_bar_without_a_colab_link():
    """tqdm's notebook bar (HBox of HTML, FloatProgress, HTML) has no controls: it stays a finished bar."""
    def model(name, **state):
        return {"model_name": name, "model_module": "@jupyter-widgets/controls", "state": state}
    states = {"box": model("HBoxModel", children=["IPY_MODEL_d", "IPY_MODEL_p", "IPY_MODEL_n"], layout="IPY_MODEL_l"),
              "d": model("HTMLModel", value="train"), "p": model("FloatProgressModel", value=5.0, max=10.0),
              "n": model("HTMLModel", value="5/10 [00:01]"), "l": model("LayoutModel", width="auto")}
    html = site_plan.widget_standin("box", states, "https://colab.example/x")
    assert html == ('<div class="course-progress"><div class="course-widget-row"><div><div class="course-widget-text">'
                    'train</div></div><div><progress value="5.0" max="10.0"></progress></div><div>'
                    '<div class="course-widget-text">5/10 [00:01]</div></div></div></div>')
    # inside a widget (its Output captured a model loading), the bar is left out of the widget's stand-in
    states |= {"w": model("VBoxModel", children=["IPY_MODEL_o", "IPY_MODEL_s"]),
               "s": model("IntSliderModel", value=3, description="n"),
               "o": model("OutputModel", outputs=[
                   {"output_type": "display_data", "data": {site_plan.WIDGET_VIEW: {"model_id": "box"}}},
                   {"output_type": "display_data", "data": {"text/plain": "the widget's own text"}}])}
    html = site_plan.widget_standin("w", states, "https://colab.example/x")
    assert "the widget&#x27;s own text" in html and "Controls: n = 3" in html
    assert "progress" not in html and "train" not in html


def test_widget_without_saved_state_still_gets_a_colab_link():
    html = site_plan.widget_standin("missing", {}, "https://colab.example/x")
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
        "index.html: external asset <style> https://fonts.example/x.css "
        "(pages must load nothing from outside the site)",
        "index.html: external asset <script> https://unpkg.example/embed.js "
        "(pages must load nothing from outside the site)"]


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
    plan = site_plan.plan(ROOT)
    srcs = [p.src for p in plan.pages]
    notebooks = sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("notebooks/*.ipynb"))
    labs = sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("labs/*.ipynb"))
    assert srcs[0] == "syllabus.md" and sorted(srcs[1:]) == sorted(notebooks + labs)
    assert [m.number for m in plan.modules] == [f"{i:02d}" for i in range(13)]
    assert all(m.title and m.notebook and m.lab for m in plan.modules)
    assert not any(s.startswith("solutions/") for s in srcs)
    # the final project is Module 12's, after its lab, as its student version (the brief, not the grader)
    project = next(p for p in plan.pages if p.src == "labs/lab13.ipynb")
    assert project.module == "12" and project.kind == "lab" and project.title.startswith("Project · ")
    assert plan.modules[12].project == project.out and srcs.index(project.src) == srcs.index("labs/lab12.ipynb") + 1


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


# --- an all-or-nothing build --------------------------------------------------------------------------------

def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_build_that_fails_midway_leaves_the_previous_site_untouched(course):
    """The site is built beside the destination and swapped in only when every page is built: a build that
    fails on its third page (a solution in labs/) leaves the previous site byte for byte, and no folder of
    its own; the next good build replaces the site."""
    root, _ = course
    out = _build(root)
    before = _snapshot(out)
    (root / "syllabus.md").write_text(SYLLABUS.replace("Two modules.", "Two modules, changed."))
    shutil.copy(root / "solutions" / "lab00.ipynb", root / "labs" / "lab00.ipynb")
    with pytest.raises(site_tool.SiteError, match="BEGIN SOLUTION"):
        _build(root)   # index.html and the notebook page were already written when it failed
    assert _snapshot(out) == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["executed", "site"]
    _executed(root / "notebooks" / "00_basics.ipynb", root / "build" / "executed")
    nbformat.write(_nb("# Lab 00 — exercises", "raise NotImplementedError()"), root / "labs" / "lab00.ipynb")
    _build(root)
    assert "Two modules, changed." in (out / "index.html").read_text()
    assert sorted(p.name for p in out.parent.iterdir()) == ["executed", "site"]


def test_a_build_interrupted_by_any_exception_keeps_the_site(course, monkeypatch):
    root, _ = course
    out = _build(root)
    before = _snapshot(out)
    pages = []

    def rewrite(body, page, *args):
        pages.append(page.out)
        if len(pages) == 4:
            raise KeyboardInterrupt   # Ctrl-C on the fourth page
        return real(body, page, *args)
    real = site_plan.rewrite_links
    monkeypatch.setattr(site_tool, "rewrite_links", rewrite)
    with pytest.raises(KeyboardInterrupt):
        _build(root)
    assert len(pages) == 4 and _snapshot(out) == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["executed", "site"]


def test_a_killed_build_leaves_a_folder_that_the_next_build_removes(course):
    """A build killed outright (no cleanup runs) leaves its staging folder; the next build removes it,
    but never the folder of a build whose process is still running."""
    root, _ = course
    build_dir = root / "build"
    dead = build_dir / ".site.building-999999999-abc"      # no such process
    alive = build_dir / f".site.building-{__import__('os').getpid()}-abc"
    unmarked = build_dir / ".site.building-999999999-someone-elses"   # not a folder this tool made
    for d in (dead, alive, unmarked):
        d.mkdir(parents=True)
        if d != unmarked:
            (d / site_plan.SITE_MARK).write_text("")
    _build(root)
    assert not dead.exists() and alive.exists() and unmarked.exists()


def test_build_into_a_new_or_empty_folder(course, tmp_path):
    root, _ = course
    for out in (tmp_path / "new" / "site", tmp_path / "empty"):
        if out.name == "empty":
            out.mkdir()
        site_tool.build(out, root, log=lambda *a: None)
        assert (out / "index.html").is_file() and (out / site_plan.SITE_MARK).is_file()
        assert (out / ".nojekyll").is_file() and site_tool.check(out) == []


# --- math --------------------------------------------------------------------------------------------------

KV_BYTES = (r"$$\text{bytes} = 2 \times \text{layers} \times \text{kv\_heads} \times \text{head\_dim} \times"
            "\n" r"  \text{bytes per element}$$")


def test_text_mode_escapes_inside_math_are_written_as_mathjax_2_shows_them():
    """MathJax 2's \\text{} shows `\\_` with its backslash (it unescapes only \\$ \\{ \\} \\\\): inside the text
    arguments of math, `\\_ \\% \\& \\#` become plain; math mode, code and prose are left alone."""
    t = site_plan.text_mode_escapes
    assert t(KV_BYTES) == KV_BYTES.replace(r"kv\_heads", "kv_heads").replace(r"head\_dim", "head_dim")
    assert t(r"inline $\text{kv\_heads} + x\_1$ and \(\mbox{50\% \& \#1}\)") == \
        r"inline $\text{kv_heads} + x\_1$ and \(\mbox{50% & #1}\)"
    assert t(r"\[\textrm{a\_b {c\_d}} \text{\$5 \{x\}}\]") == r"\[\textrm{a_b {c_d}} \text{\$5 \{x\}}\]"
    kept = ["`$\\text{kv\\_heads}$` in code", "```\n$$\\text{a\\_b}$$\n```", r"prose \text{a\_b} \_ outside math",
            r"a \$5 and \$6 price"]
    for text in kept:
        assert t(text) == text, text


def test_a_page_with_text_escapes_in_math_shows_them_as_jupyterlab_does(course):
    root, _ = course
    nb_path = root / "notebooks" / "00_basics.ipynb"
    nb = nbformat.read(nb_path, as_version=4)
    nb.cells[0].source += "\n\nThe cache:\n\n" + KV_BYTES + "\n\nper token, inline $\\text{head\\_dim}$."
    nbformat.write(nb, nb_path)
    _executed(nb_path, root / "build" / "executed")
    page = _pages(_build(root))["notebooks/00_basics.html"]
    assert r"\text{kv_heads} \times \text{head_dim}" in page and r"$\text{head_dim}$" in page
    assert r"\_" not in page


def test_the_real_course_math_is_fixed_where_it_needs_it():
    """Module 05's KV-bytes formula is the course's case: its \\text{kv\\_heads} loses the backslash."""
    nb = nbformat.read(ROOT / "notebooks" / "05_kv_caching.ipynb", as_version=4)
    assert any(r"\text{kv\_heads}" in c.source for c in nb.cells if c.cell_type == "markdown")
    assert site_plan.fix_math(nb) >= 1
    text = "".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert r"\text{kv_heads}" in text and r"\text{head_dim}" in text and r"\text{kv\_heads}" not in text


# --- timing claims (course_lib.perf.claims writes them: /work/notes/claims.md's contract) ----------------

def _claim_output(claim: str, held: bool, measured: str):
    line = (f"Claim held: {claim} ({measured})" if held else f"Claim did not hold on this run: {claim} ({measured}). "
            "timings on a busy machine are noisy: close other programs and re-run this cell")
    return nbformat.v4.new_output("display_data", data={"text/plain": line, "text/html": f"<p>{line}</p>"},
                                  metadata={"course_claim": {"kind": "timing", "claim": claim, "held": held,
                                                             "measured": measured}})


CACHED = "cached decoding is faster than recomputing"


def _with_claims(src: Path, dest_dir: Path, *claims, device="cpu", sha=None):
    """An executed copy of `src` whose first code cell states `claims` ((claim, held, measured), ...)."""
    copy = _executed(src, dest_dir, device=device, sha=sha)
    nb = nbformat.read(copy, as_version=4)
    code = next(c for c in nb.cells if c.cell_type == "code")
    code.outputs += [_claim_output(*c) for c in claims]
    nbformat.write(nb, copy)
    return copy


@pytest.fixture
def claims_course(course, monkeypatch):
    """The course, with module 00's copy from the tests holding a claim that did not hold; each execution the
    build makes (recorded in `calls`) states the claims of the next entry of `runs`."""
    root, calls = course
    src = root / "notebooks" / "00_basics.ipynb"
    _with_claims(src, root / "build" / "executed", (CACHED, False, "cached 227 ms/token, recompute 14.5 ms/token"),
                 ("prefill is compute-bound", True, "3.1 TFLOP/s"))
    runs = []

    def execute(path, out_dir, timeout=nbexec.CELL_TIMEOUT_S):
        calls.append(Path(path).name)
        return _with_claims(Path(path), Path(out_dir), *runs.pop(0))
    monkeypatch.setattr(nbexec, "execute_notebook", execute)
    return root, calls, runs


def test_claims_that_held_need_nothing(course):
    root, calls = course
    _with_claims(root / "notebooks" / "00_basics.ipynb", root / "build" / "executed", (CACHED, True, "2.1x faster"))
    warnings = []
    site = site_tool.build(root / "build" / "site", root, log=lambda *a: None, warn=warnings.append)
    page = _pages(root / "build" / "site")["notebooks/00_basics.html"]
    assert calls == [] and site.warnings == warnings == [] and "course-claims" not in page
    assert "Claim held: cached decoding is faster than recomputing (2.1x faster)" in page


def test_a_claim_that_did_not_hold_is_executed_again_and_then_holds(claims_course):
    root, calls, runs = claims_course
    runs.append([(CACHED, True, "cached 14.1 ms/token, recompute 31.0 ms/token")])
    warnings = []
    site = site_tool.build(root / "build" / "site", root, log=lambda *a: None, warn=warnings.append)
    page = _pages(root / "build" / "site")["notebooks/00_basics.html"]
    assert calls == ["00_basics.ipynb"], "the copy with a claim that did not hold must be executed once more"
    assert site.warnings == warnings == [] and "course-claims" not in page and "227 ms" not in page
    assert "Claim held: cached decoding is faster than recomputing (cached 14.1 ms/token" in page
    calls.clear()
    site_tool.build(root / "build" / "site", root, log=lambda *a: None)   # the new copy is kept and current
    assert calls == []


def test_a_claim_that_still_does_not_hold_gets_a_banner_a_warning_and_fails_strict(claims_course):
    root, calls, runs = claims_course
    measured = "cached 198 ms/token, recompute 15.2 ms/token (fastest of 5, spread 40%)"
    runs.append([(CACHED, False, measured), ("prefill is compute-bound", True, "3.0 TFLOP/s")])
    warnings = []
    out = root / "build" / "site"
    site = site_tool.build(out, root, log=lambda *a: None, warn=warnings.append)
    assert calls == ["00_basics.ipynb"], "executed once more, not again and again"
    page = _pages(out)["notebooks/00_basics.html"]
    banner = re.search(r'<div class="course-claims" role="note">(.*?)</div>', page, re.S)
    assert banner, "no banner on a page whose claim did not hold"
    assert page.index("course-claims") < page.index(site_plan.CONTENT_START), "the banner is at the top"
    text = banner.group(1)
    assert ("<strong>1 timing claim of this page did not hold on the run that made it</strong> (cpu, 2026-01-01; "
            "executed a second time for this page), so some numbers below contradict the text beside them") in text
    cell_id = nbformat.read(root / "notebooks" / "00_basics.ipynb", as_version=4).cells[1].id
    assert f'<a href="#cell-id={cell_id}">{CACHED}</a>: measured {measured}' in text
    assert "compute-bound" not in text                 # a claim that held is not named
    claims = [w for w in site.warnings if "warning: slides: " not in w]   # this toy deck's own limits apart
    assert claims == [w for w in warnings if "warning: slides: " not in w] == [
        f"warning: notebooks/00_basics.html: the claim {CACHED!r} did not hold on "
        f"the run that made the page ({measured}); the page says so in a banner"]
    assert site_tool.check(out) == []                  # the banner's link to the claim's cell resolves
    before = _snapshot(out)
    runs.append([(CACHED, False, measured)])
    _with_claims(root / "notebooks" / "00_basics.ipynb", root / "build" / "executed", (CACHED, False, "227 ms"))
    with pytest.raises(site_tool.SiteError, match=r"strict build: claims that did not hold, or decks past their "
                                                  r"limits:\n  warning: notebooks/00_basics.html: the claim 'cached"):
        site_tool.build(out, root, log=lambda *a: None, strict=True, warn=lambda *a: None)
    assert _snapshot(out) == before and calls == ["00_basics.ipynb"] * 2


def test_a_gpu_copy_whose_claim_did_not_hold_is_shown_not_executed_here(claims_course):
    """Executing here would replace a GPU run's outputs with quick CPU ones: the page keeps the GPU run and
    says which claim did not hold on it."""
    root, calls, _ = claims_course
    _with_claims(root / "notebooks" / "00_basics.ipynb", root / "executed" / "gpu",
                 ("the Triton kernel beats SDPA", False, "0.91x"), device="NVIDIA H100 80GB HBM3")
    site = site_tool.build(root / "build" / "site", root, log=lambda *a: None, warn=lambda *a: None)
    page = _pages(root / "build" / "site")["notebooks/00_basics.html"]
    assert calls == [] and len(site.warnings) == 1
    assert "did not hold on the run that made it</strong> (NVIDIA H100 80GB HBM3, 2026-01-01)," in page
    assert "the Triton kernel beats SDPA</a>: measured 0.91x" in page


def test_a_claim_without_a_verdict_is_refused(course):
    root, _ = course
    copy = _executed(root / "notebooks" / "00_basics.ipynb", root / "build" / "executed")
    nb = nbformat.read(copy, as_version=4)
    nb.cells[1].outputs.append(nbformat.v4.new_output("display_data", data={"text/plain": "?"},
                                                      metadata={"course_claim": {"claim": "x", "held": "yes"}}))
    nbformat.write(nb, copy)
    with pytest.raises(site_tool.SiteError, match=r"notebooks/00_basics.ipynb: cell 1 has an output whose "
                                                  r"course_claim metadata has no true/false 'held'"):
        _build(root)
