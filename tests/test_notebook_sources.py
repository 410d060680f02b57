"""Every notebook and source lab has a percent-format source beside it (notebooks/NN_slug.py,
solutions/labNN.py), and the notebook is exactly what its source builds (tools/nb.py: check, sync)."""
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "nb.py"
_spec = importlib.util.spec_from_file_location("course_nb_tool", TOOL)
nbt = sys.modules.setdefault("course_nb_tool", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(nbt)

NOTEBOOKS = sorted([*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("solutions/*.ipynb")])


def _cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("ipynb", NOTEBOOKS, ids=[p.relative_to(ROOT).as_posix() for p in NOTEBOOKS])
def test_notebook_has_its_source_in_sync(ipynb):
    rel = ipynb.relative_to(ROOT).as_posix()
    py = ipynb.with_suffix(".py")
    assert py.exists(), f"{rel} has no source {py.name} beside it: run python tools/nb.py sync --from-ipynb {rel}"
    assert nbt.problem(nbt.Pair(py, ipynb)) is None, nbt.problem(nbt.Pair(py, ipynb))


def test_check_passes_on_the_repository_and_every_source_has_its_notebook():
    assert len(NOTEBOOKS) >= 16
    out = _cli("check")
    assert out.returncode == 0, out.stdout + out.stderr   # also a .py in notebooks/ or solutions/ with no .ipynb


def test_labs_and_grading_see_only_the_notebooks():
    from course_lib.grading.build import lab_names
    assert lab_names(ROOT / "solutions") == sorted(p.stem for p in ROOT.glob("solutions/lab*.ipynb"))


# ---- the format: an exact round trip -----------------------------------------------------------------

def _cell(kind, source, cid, **metadata):
    new = {"code": nbformat.v4.new_code_cell, "markdown": nbformat.v4.new_markdown_cell,
           "raw": nbformat.v4.new_raw_cell}[kind]
    c = new(source, metadata=metadata)
    c["id"] = cid
    return c


def _notebook(cells, relpath="notebooks/zz_synthetic.ipynb"):
    nb = nbformat.v4.new_notebook()
    nb.metadata = json.loads(json.dumps(nbt.NB_METADATA))
    nb.cells = nbt.fixed_cells(relpath) + cells
    return nb


def _nbgrader(grade_id, *, solution=False, grade=False, points=None, locked=None):
    g = {"grade": grade, "grade_id": grade_id, "locked": (not solution) if locked is None else locked,
         "schema_version": 3, "solution": solution, "task": False}
    if points is not None:
        g["points"] = points
    return g


def _round_trip(nb, relpath="notebooks/zz_synthetic.ipynb"):
    text = nbt.source_text(nb)
    back = nbt.notebook(text, relpath)
    assert nbt.render(back) == nbt.render(nb), text
    assert nbt.source_text(back) == text          # and the source is a fixed point
    return text


def test_round_trip_of_every_cell_kind_is_exact():
    cells = [
        _cell("markdown", "# Title\n\nSome *text*  \n## %% not a header\n%% neither\n#no space\n\n  indented", "c002"),
        _cell("code", "N = 4  # QUICK sizes", "c003", tags=["parameters"]),
        _cell("code", "# starts with a comment\nx = '''\n# %% inside a string\n## %% and this\n# %%\n'''", "c004"),
        _cell("code", "", "c005"),
        _cell("markdown", "", "c006"),
        _cell("code", "import os", "c007", nbgrader=_nbgrader("setup")),
        _cell("code", "def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION", "c008",
              nbgrader=_nbgrader("f", solution=True)),
        _cell("code", "assert f() == 1\n### BEGIN HIDDEN TESTS\nassert f()\n### END HIDDEN TESTS", "c009",
              nbgrader=_nbgrader("f_tests", grade=True, points=3)),
        _cell("markdown", "Explain.\n\n=== BEGIN MARK SCHEME ===\nx\n=== END MARK SCHEME ===", "c010",
              nbgrader=_nbgrader("f_text", solution=True, grade=True, points=2)),
        _cell("code", "z = 1", "c010a", tags=[], jupyter={"source_hidden": True}, **{"slideshow.x": "é"}),
        _cell("raw", "raw text\n# %% [markdown]", "3f2a-9b_c"),
        _cell("code", "trailing = 1   \n    ", "c011"),
    ]
    text = _round_trip(_notebook(cells))
    assert '# %% id="c003" tags=["parameters"]\n' in text
    assert '# %% id="c007" nbgrader={"grade_id": "setup", "locked": true}\n' in text
    assert '# %% id="c009" nbgrader={"grade_id": "f_tests", "grade": true, "points": 3}\n' in text
    assert ('# %% [markdown] id="c010" nbgrader={"grade_id": "f_text", "solution": true, "grade": true, '
            '"points": 2}\n') in text
    assert "\n## %% inside a string\n### %% and this\n## %%\n" in text   # escaped, not a header
    assert "\n## %% neither\n" in text                                 # the markdown line "%% neither"


def test_the_documented_short_forms_build_nbgraders_schema():
    text = ('# %%\nx = 1\n\n# %% nbgrader={"grade_id": "q1", "solution": true}\ny = 2\n\n'
            '# %% nbgrader={"grade_id": "q1_tests", "grade": true}\nassert y\n')
    nb = nbt.notebook(text, "solutions/lab99.ipynb")
    assert [c.id for c in nb.cells] == ["c000", "c001", "c001a", "c001b", "c001c"]
    assert nb.cells[3].metadata.nbgrader == _nbgrader("q1", solution=True)
    assert nb.cells[4].metadata.nbgrader == _nbgrader("q1_tests", grade=True, points=1)
    assert "solutions/lab99.ipynb" in nb.cells[0].source


try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:    # the student environment has no hypothesis
    given = None

if given is not None:
    _sources = st.text(alphabet="#% a[]=\"\n\t-", max_size=40).map(lambda s: s.strip("\n"))
    _metadata = st.sampled_from([{}, {"tags": ["parameters"]}, {"nbgrader": _nbgrader("a", solution=True)},
                                 {"nbgrader": _nbgrader("b", grade=True, points=2)},
                                 {"nbgrader": _nbgrader("c", solution=True, grade=True, points=1)},
                                 {"nbgrader": _nbgrader("d")}, {"tags": ["x"], "scrolled": True}])
    _cells = st.lists(st.tuples(st.sampled_from(["code", "markdown", "raw"]), _sources, _metadata), max_size=8)

    @settings(max_examples=300, deadline=None)
    @given(_cells)
    def test_round_trip_property(spec):
        _round_trip(_notebook([_cell(k, s, f"c{i + 2:03d}", **m) for i, (k, s, m) in enumerate(spec)]))


def test_what_a_source_cannot_hold_is_refused_by_name():
    ok = _cell("code", "x = 1", "c002")
    for cells, says in [([_cell("code", "a\rb", "c002")], "carriage return"),
                        ([ok, _cell("markdown", "![p](attachment:p.png)", "c003")], "attachments"),
                        ([ok], "install cell")]:
        nb = _notebook(cells)
        if "attachments" in says:
            nb.cells[-1]["attachments"] = {"p.png": {"image/png": "AAAA"}}
        if says == "install cell":
            nb.cells[1].source += "\n!pip install something-else"
        with pytest.raises(nbt.SourceError, match=says):
            nbt.source_text(nb, "x.ipynb")
    with pytest.raises(nbt.SourceError, match=r"src.py:3: cannot read the cell header"):
        nbt.notebook("# comment\n\n# %% Some title\nx = 1\n", "notebooks/x.ipynb", "src.py")
    with pytest.raises(nbt.SourceError, match="used twice"):
        nbt.notebook('# %% id="c002"\nx\n# %% id="c002"\ny\n', "notebooks/x.ipynb")


# ---- check and sync on a copy ------------------------------------------------------------------------

@pytest.fixture
def copy_pair(tmp_path):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    for suffix in (".py", ".ipynb"):
        shutil.copy(ROOT / "notebooks" / f"00_measuring_inference{suffix}", folder)
    return folder / "00_measuring_inference.py", folder / "00_measuring_inference.ipynb"


def test_check_reports_a_one_character_edit_and_sync_needs_a_direction(copy_pair):
    py, ipynb = copy_pair
    folder = py.parent
    assert nbt.check([folder]) == []
    original = py.read_text()
    i = original.index('# %% [markdown] id="c002"') + 40    # a character of the title
    py.write_text(original[:i] + ("X" if original[i] != "X" else "Y") + original[i + 1:])
    found = nbt.check([folder])
    assert len(found) == 1 and "00_measuring_inference.ipynb is not what" in found[0], found
    assert "00_measuring_inference.py builds" in found[0] and "sync --from-py" in found[0], found
    assert "cell 3, id 'c002'" in found[0], found

    out = _cli("check", folder)
    assert out.returncode == 1 and "00_measuring_inference.ipynb is not what" in out.stdout, out
    before = (py.read_text(), ipynb.read_text())
    out = _cli("sync", folder)
    assert out.returncode == 2 and "--from-py" in out.stderr, out
    assert (py.read_text(), ipynb.read_text()) == before        # no direction: nothing written
    out = _cli("sync", "--from-py", folder)
    assert out.returncode == 0 and "wrote" in out.stdout, out
    assert nbt.check([folder]) == []
    assert json.loads(ipynb.read_text())["cells"][2]["source"] != json.loads(
        (ROOT / "notebooks/00_measuring_inference.ipynb").read_text())["cells"][2]["source"]

    # and a one-character edit of the notebook
    py.write_text(original)
    shutil.copy(ROOT / "notebooks/00_measuring_inference.ipynb", ipynb)
    assert nbt.check([ipynb]) == []
    text = ipynb.read_text()
    ipynb.write_text(text.replace("c005", "c00x", 1))
    assert "00_measuring_inference.ipynb is not what" in nbt.check([py])[0]


def test_sync_from_ipynb_after_a_jupyterlab_session(copy_pair):
    """Outputs, execution counts and kernel metadata are dropped, an edit comes into the source."""
    py, ipynb = copy_pair
    nb = nbformat.read(str(ipynb), as_version=4)
    code = next(c for c in nb.cells[2:] if c.cell_type == "code")
    code.execution_count = 7
    code.outputs = [nbformat.v4.new_output("stream", text="hello\n")]
    nb.metadata.language_info.update(version="3.11.9", mimetype="text/x-python")
    nb.cells[2].source += "\n\nOne more line."
    nbformat.write(nb, str(ipynb))
    assert "not what" in nbt.check([py])[0]
    assert nbt.sync([py], "ipynb", say=lambda s: None) == 0
    assert "# One more line." in py.read_text()
    assert nbt.check([py]) == []
    rebuilt = json.loads(ipynb.read_text())
    assert rebuilt["metadata"] == nbt.NB_METADATA
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in rebuilt["cells"])


def test_missing_halves_and_new_cells(copy_pair):
    py, ipynb = copy_pair
    py.unlink()
    found = nbt.check([py.parent])
    assert len(found) == 1 and "has no source" in found[0] and "sync --from-ipynb" in found[0], found
    assert nbt.sync([ipynb], "ipynb", say=lambda s: None) == 0 and nbt.check([ipynb]) == []

    # a cell written without an id gets one on build, and sync --from-py puts it into the source
    text = py.read_text().replace('# %% id="c004"', '# %%\nprint("new")\n\n# %% id="c004"', 1)
    py.write_text(text)
    ipynb.unlink()
    found = nbt.check([py.parent])
    assert len(found) == 1 and "has no notebook" in found[0] and "sync --from-py" in found[0], found
    said = []
    assert nbt.sync([py], "py", say=said.append) == 0
    assert '# %% id="c003a"\nprint("new")' in py.read_text(), said
    assert nbt.check([py.parent]) == []
    ids = [c["id"] for c in json.loads(ipynb.read_text())["cells"]]
    assert ids[3:6] == ["c003", "c003a", "c004"], ids
