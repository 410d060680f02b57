"""The slide decks (tools/slides.py, `make slides`, and in `make site`): the slide structure derived from a
notebook by the documented rule, a cell's own `slideshow` metadata winning (and surviving tools/nb.py's
build and check), and a deck built from a small course: reveal.js from the local copy, slides from the
headings, nothing from a CDN. No kernel runs: the executed copy is written here, as in tests/test_site.py."""
import importlib.util
import re
import sys
from pathlib import Path

import nbformat
import pytest

from course_lib import colab_url
from tools import nbexec
from tools import site as site_tool
from tools import site_plan
from tools import slides

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("course_nb_tool", ROOT / "tools" / "nb.py")
nbt = sys.modules.setdefault("course_nb_tool", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(nbt)

CDN = re.compile(r"unpkg\.com|cdnjs|jsdelivr|cdn\.|googleapis|require\.js|jquery", re.I)

SOURCE = '''# %% [markdown] id="c002"
# # Module 00 · Basics
#
# What this module does, in one line. It does more, which the notes say ([a link. With a
# dot](https://example.org "A title. With dots.")).
#
# A second paragraph, only in the notes.

# %% id="c003" tags=["parameters"]
QUICK = True

# %% id="c004"
print("\\n".join(f"row {i}" for i in range(40)))

# %% [markdown] id="c005"
# ## 1. First section
#
# Energy $E = mc^2$.

# %% id="c006"
x = 1

# %% [markdown] id="c007"
# ### 1.1 A detail

# %% [markdown] id="c008" slideshow={"slide_type": "notes"}
# Tell them why.

# %% id="c009" slideshow={"slide_type": "fragment"}
print("revealed")

# %% [markdown] id="c010"
# ## 2. Second section
'''


def _executed(nb):
    """The notebook as an executed copy holds it: each code cell printed what it prints here."""
    nb = nbformat.from_dict(nbformat.validator.normalize(nb)[1]) if isinstance(nb, dict) else nb
    for cell in nb.cells:
        if cell.cell_type == "code":
            text = "\n".join(f"row {i}" for i in range(40)) if "row" in cell.source else "out"
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text + "\n")]
    return nb


def _types(nb):
    return {c.id: c.metadata["slideshow"]["slide_type"] for c in nb.cells}


def test_slideshow_field_of_a_source_header_survives_build_and_check(tmp_path):
    py = tmp_path / "notebooks" / "00_basics.py"
    py.parent.mkdir()
    py.write_text(SOURCE)
    nbt.build([py], say=lambda *a: None)
    nb = nbformat.read(py.with_suffix(".ipynb"), as_version=4)
    cells = {c.id: c for c in nb.cells}
    assert cells["c008"].metadata == {"slideshow": {"slide_type": "notes"}}
    assert cells["c009"].metadata == {"slideshow": {"slide_type": "fragment"}}
    assert nbt.check([py]) == [] and py.read_text() == SOURCE   # the header written back as it was


def test_slide_structure_from_headings_with_explicit_metadata_winning():
    nb = _executed(nbt.notebook(SOURCE, "notebooks/00_basics.ipynb"))
    before = nbformat.writes(nb)
    deck = slides.slide_deck_notebook(nb)
    assert nbformat.writes(nb) == before, "the notebook itself must not change"
    assert _types(deck) == {"c000": "skip", "c001": "skip",             # the Colab badge and install cells
                            "c002-0": "slide", "c002-1": "-",           # the title, then its lead sentence
                            "c002-1n": "notes",                         # the paragraphs in full
                            "c003": "skip",                             # the parameters cell
                            "c004-0": "-",                              # 40 lines, trimmed: a table, fits
                            "c005-0": "slide", "c005-1": "-", "c006-0": "-", "c007-0": "subslide",
                            "c008": "notes", "c009": "fragment", "c010-0": "slide"}
    cells = {c.id: c for c in deck.cells}
    # the lead sentence ends at the first full stop outside the link, whose text and title hold dots
    assert cells["c002-1"].source == "What this module does, in one line."
    assert "It does more" in cells["c002-1n"].source and "A second paragraph" in cells["c002-1n"].source
    assert cells["c005-1"].source == "Energy $E = mc^2$." and not any(c.id == "c005-1n" for c in deck.cells)
    # a long code cell shows only its output; a short plain one with a result, its code too
    assert cells["c004-0"].metadata["transient"] == {"remove_source": True}
    assert cells["c006-0"].source == "x = 1" and "transient" not in cells["c006-0"].metadata
    out = cells["c004-0"].outputs[0]["text"].splitlines()
    assert out[:slides.KEEP_OUTPUT_LINES] == [f"row {i}" for i in range(slides.KEEP_OUTPUT_LINES)]
    assert out[-1] == f"… {40 - slides.KEEP_OUTPUT_LINES} more lines (the module's page shows them all)"
    assert len(out) == slides.KEEP_OUTPUT_LINES + 1


MARKDOWN = """## 3. Tiles

Attention reads every key for every query, which is slow; the rest of this sentence is long enough that a \
slide would not hold it, so it is cut at a clause, never inside [a link, with commas, to a work](https://x.org \
"Title: with, commas. And dots.") or `code, with commas`.

A second paragraph that only the notes hold.

**A bold lead that stands alone.** And what follows it, only in the notes.

* **standard attention** (the paper's Algorithm 0) reads Q and K: all of it, in the notes
* tiled attention never writes S: the rest in the notes
  * a nested item, in the notes
* three
* four
* five
* six
* seven

How the saving grows with the SRAM:

<details><summary>Hint</summary>in the notes only</details>
"""


def test_markdown_points_keep_the_heading_and_the_point_and_put_the_prose_in_notes():
    points = slides.markdown_points(MARKDOWN.replace("\\\n", ""))
    shown = [p for p, _ in points]
    assert shown[0] == "## 3. Tiles"
    lead = shown[1]
    assert lead.endswith(" …") and slides._size(lead) <= slides.LEAD_CHARS and lead.startswith("Attention reads")
    assert lead.count("[") == lead.count("](") and lead.count("`") % 2 == 0   # no link or code cut open
    assert shown[2] == "**A bold lead that stands alone.**"
    assert shown[3].splitlines() == ["* **standard attention** (the paper's Algorithm 0) reads Q and K",
                                     "* tiled attention never writes S", "* three", "* four", "* five", "* six",
                                     "* … 1 more (in the notes)"]
    assert shown[4] == "How the saving grows with the SRAM:"
    assert len(points) == 5
    notes = "\n".join(n for _, n in points)
    for said in ("A second paragraph that only the notes hold.", "And what follows it", "a nested item",
                 "all of it, in the notes", "in the notes only", "seven"):
        assert said in notes, said
    assert points[0][1] == ""                 # the slide shows all of the heading: no notes
    assert "<details>" in points[4][1]        # a block that shows nothing joins the point before


def test_deck_problems_name_the_deck_and_what_is_wrong():
    ok = [slides.SlideStats(text=200, prose=150, figures=1, notes=300)] * 3
    assert slides.deck_problems(ok, 3, "d") == []
    long = ok + [slides.SlideStats(text=slides.MAX_TEXT + 1, prose=slides.MAX_PROSE + 1)]
    assert slides.deck_problems(long, 3, "d") == [
        f"d: slide 4 shows {slides.MAX_TEXT + 1} characters of text (at most {slides.MAX_TEXT})",
        f"d: slide 4 shows {slides.MAX_PROSE + 1} characters of prose (at most {slides.MAX_PROSE})"]
    wordy = [slides.SlideStats(text=slides.MEDIAN_TEXT + 1)] * 3
    assert slides.deck_problems(wordy, 0, "d") == [
        f"d: a median of {slides.MEDIAN_TEXT + 1} characters of text a slide (at most {slides.MEDIAN_TEXT})"]
    assert slides.deck_problems(ok, 4, "d") == ["d: 3 figures on its slides, 4 in the notebook"]
    assert slides.deck_problems(ok, 3, "d", ["alpha", "beta"]) == [
        "d: 2 words of the notebook neither on a slide nor in the notes: alpha, beta"]


def test_an_unknown_slide_type_names_the_cell_and_the_types():
    nb = nbt.notebook(SOURCE.replace('"fragment"', '"fragmnet"'), "notebooks/00_basics.ipynb")
    with pytest.raises(slides.SlidesError, match=r"cell c009: slideshow=.*fragmnet.*expected.*subslide"):
        slides.slide_deck_notebook(nb, "notebooks/00_basics.ipynb")


@pytest.fixture
def course(tmp_path):
    """One module: syllabus, the notebook built from SOURCE, its executed copy as the tests leave it."""
    root = tmp_path / "course"
    (root / "notebooks").mkdir(parents=True)
    (root / "README.md").write_text("# Tiny course — for the slides tests\n")
    (root / "syllabus.md").write_text("# Syllabus\n\n## Module 00 — Basics  (available)\n")
    src = root / "notebooks" / "00_basics.ipynb"
    nbformat.write(nbt.notebook(SOURCE, "notebooks/00_basics.ipynb"), src)
    nb = _executed(nbformat.read(src, as_version=4))
    nb.metadata[nbexec.META_KEY] = {"source_sha256": nbexec.source_sha256(src), "quick": True, "device": "cpu",
                                    "torch": "2.x", "date": "2026-01-01T00:00:00+00:00"}
    (root / "build" / "executed").mkdir(parents=True)
    nbformat.write(nb, root / "build" / "executed" / src.name)
    return root


def test_a_deck_is_built_offline_with_local_reveal_and_slides_from_headings(course, monkeypatch):
    def no_kernel(*a, **k):
        raise AssertionError("the executed copy is current: nothing should run")
    monkeypatch.setattr(nbexec, "execute_notebook", no_kernel)
    out = course / "build" / "slides"
    assert slides.build(out, course, log=lambda *a: None) == ["slides/00_basics.slides.html"]
    deck = (out / "slides" / "00_basics.slides.html").read_text()
    # reveal.js from the local copy, named relative to the deck, and there
    prefix = "../assets/reveal.js"
    for asset in ("dist/reveal.js", "dist/reveal.css", "dist/theme/white.css", "plugin/notes/notes.js"):
        assert f'"{prefix}/{asset}"' in deck, asset
        assert (out / "assets" / "reveal.js" / asset).is_file(), asset
    assert (out / "assets" / "reveal.js" / "LICENSE").is_file()
    assert 'src="../assets/mathjax/MathJax.js?config=' in deck
    # nothing from a CDN: no loader, no remote script, stylesheet or image, no CDN host anywhere
    assert not CDN.findall(deck), CDN.findall(deck)
    assert not re.findall(r"""<(?:script|link|img)\b[^>]*\b(?:src|href)=["']?(?:https?:)?//""", deck)
    assert site_tool.check(out) == []
    # the slides: the title and each `##` section a slide, the `###` one a sub-slide inside the first section
    sections = re.findall(r"<section\b|</section>", deck)
    assert sections.count("<section") == sections.count("</section>")
    subslides, depth = [], 0   # nbconvert nests each slide's cells in sub-slide sections, the first included
    for tag in sections:
        depth += 1 if tag == "<section" else -1
        if tag == "<section" and depth == 1:
            subslides.append(0)
        elif tag == "<section" and depth == 2:
            subslides[-1] += 1
    assert subslides == [1, 2, 1]   # the title (c004's table fits under it); section 1 (then its "###"); section 2
    assert '<aside class="notes">' in deck and "Tell them why." in deck and 'class="fragment"' in deck
    assert "A second paragraph, only in the notes." in deck.split('<aside class="notes">', 1)[1]
    stats = slides.deck_stats(deck)
    assert len(stats) == 4 and stats[0].tables == 1 and stats[0].table_text > 100 and stats[0].prose < 80
    assert all(s.notes for s in stats[:1]) and "In&nbsp;[" not in deck
    assert "QUICK = True" not in deck and "pip install" not in deck   # the skipped cells
    assert "Energy $E = mc^2$" in deck and "more lines (the module's page shows them all)" in deck
    assert '<a href="slides/00_basics.slides.html">Module 00 · Basics</a>' in (out / "index.html").read_text()


def test_a_deck_past_its_limits_fails_the_decks_build_and_warns_the_site(course, monkeypatch):
    """Both builds judge each deck with `problems_of`: `slides.build` refuses (nothing written), the site
    warns and its strict build refuses."""
    monkeypatch.setattr(slides, "MEDIAN_TEXT", 10)
    out = course / "build" / "slides"
    with pytest.raises(slides.SlidesError, match=r"notebooks/00_basics.ipynb: a median of \d+ characters of text"):
        slides.build(out, course, log=lambda *a: None)
    assert not out.exists()
    warnings = []
    site = site_tool.build(course / "build" / "site", course, log=lambda *a: None, warn=warnings.append)
    assert site.warnings == warnings and len(warnings) == 1
    assert warnings[0].startswith("warning: slides: notebooks/00_basics.ipynb: a median of ")
    with pytest.raises(site_tool.SiteError, match=r"strict build: .*\n  warning: slides: notebooks/00_basics"):
        site_tool.build(course / "build" / "site", course, log=lambda *a: None, strict=True, warn=lambda *a: None)


def test_build_names_a_module_that_has_no_notebook(course):
    with pytest.raises(slides.SlidesError, match=r"modules 07: expected module numbers among 00"):
        slides.build(course / "build" / "slides", course, log=lambda *a: None, modules=("07",))


def test_every_module_deck_is_one_to_present(capsys):
    """Each module's real deck, from its executed copy where a current one exists (the tests leave them in
    build/executed/; else the tracked notebook, without outputs: its text still measured): the median text
    a slide under MEDIAN_TEXT characters, none past MAX_TEXT (tables apart) or MAX_PROSE of prose, speaker
    notes on most slides, every figure of the notebook on a slide, no word of its text lost.
    COURSE_DECKS_NEED_OUTPUTS=1 (`make test` runs this test again so, after the notebooks have run) makes a
    missing executed copy a failure: the figures are then counted for every deck."""
    import os
    import statistics
    need_outputs = os.environ.get("COURSE_DECKS_NEED_OUTPUTS") == "1"
    exp, rows = slides.exporter(), []
    for src in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        rel = f"notebooks/{src.name}"
        copy_path = nbexec.current_copy(src, [ROOT / site_plan.GPU_EXECUTED_DIR, ROOT / site_plan.EXECUTED_DIR])
        assert copy_path or not need_outputs, f"{rel}: no current executed copy, so its figures cannot be counted"
        nb = nbformat.read(copy_path or src, as_version=4)
        site_plan.replace_widgets(nb, colab_url(rel))
        site_plan.fix_math(nb)
        deck = slides.render_deck(nb, src.stem, rel, {}, ROOT, exp)
        stats, figures = slides.deck_stats(deck), slides.notebook_figures(nb)
        assert slides.deck_problems(stats, figures, rel, slides.lost_words(nb, deck)) == []
        text = [s.text for s in stats]
        rows.append(f"{src.stem[:30]:30} {len(stats):4} {statistics.median(text):7.0f} {max(text):5} "
                    f"{max(s.prose for s in stats):6} {sum(s.figures for s in stats):3}/{figures:<3} "
                    f"{sum(s.tables for s in stats):6} {sum(1 for s in stats if s.notes):5}  "
                    f"{'executed' if copy_path else 'no outputs'}")
        assert statistics.median(text) <= slides.MEDIAN_TEXT and max(text) <= slides.MAX_TEXT, rows[-1]
        assert max(s.prose for s in stats) <= slides.MAX_PROSE, rows[-1]
        assert sum(s.figures for s in stats) >= figures and slides.lost_words(nb, deck) == [], rows[-1]
        assert sum(1 for s in stats if s.notes) >= len(stats) / 3, rows[-1]   # the prose went into notes
        if copy_path:
            assert figures >= 1, f"{rel}: the module's plots are missing from its executed copy"
    with capsys.disabled():
        print("\ndeck                          slides median   max  prose figures tables notes  from")
        print("\n".join(rows))
