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

from tools import nbexec
from tools import site as site_tool
from tools import slides

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("course_nb_tool", ROOT / "tools" / "nb.py")
nbt = sys.modules.setdefault("course_nb_tool", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(nbt)

CDN = re.compile(r"unpkg\.com|cdnjs|jsdelivr|cdn\.|googleapis|require\.js|jquery", re.I)

SOURCE = '''# %% [markdown] id="c002"
# # Module 00 · Basics
#
# What this module does.

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
    assert _types(deck) == {"c000": "skip", "c001": "skip",          # the Colab badge and install cells
                            "c002": "slide", "c003": "skip",         # the title; the parameters cell
                            "c004": "subslide",                      # 40 output lines: past the budget
                            "c005": "slide", "c006": "-", "c007": "subslide",
                            "c008": "notes", "c009": "fragment", "c010": "slide"}
    out = {c.id: c for c in deck.cells}["c004"].outputs[0]["text"].splitlines()
    assert out[:slides.KEEP_OUTPUT_LINES] == [f"row {i}" for i in range(slides.KEEP_OUTPUT_LINES)]
    assert out[-1] == f"… {40 - slides.KEEP_OUTPUT_LINES} more lines (the module's page shows them all)"
    assert len(out) == slides.KEEP_OUTPUT_LINES + 1


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
    assert subslides == [2, 2, 1]   # the title (then c004, past the budget); section 1 (then its "###"); section 2
    assert '<aside class="notes">' in deck and "Tell them why." in deck and 'class="fragment"' in deck
    assert "QUICK = True" not in deck and "pip install" not in deck   # the skipped cells
    assert "Energy $E = mc^2$" in deck and "more lines (the module's page shows them all)" in deck
    assert '<a href="slides/00_basics.slides.html">Module 00 · Basics</a>' in (out / "index.html").read_text()


def test_build_names_a_module_that_has_no_notebook(course):
    with pytest.raises(slides.SlidesError, match=r"modules 07: expected module numbers among 00"):
        slides.build(course / "build" / "slides", course, log=lambda *a: None, modules=("07",))
