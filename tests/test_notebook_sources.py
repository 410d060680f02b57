"""Every notebook and source lab is built from a percent-format source beside it (notebooks/NN_slug.py,
solutions/labNN.py), read by jupytext, and is exactly what its source builds (tools/nb.py: build, check)."""
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
    py = ipynb.with_suffix(".py")
    assert py.exists(), f"{ipynb.relative_to(ROOT).as_posix()} has no source {py.name} beside it"
    assert nbt.problem(nbt.Pair(py, ipynb)) is None, nbt.problem(nbt.Pair(py, ipynb))


def test_check_passes_on_the_repository_and_every_source_has_its_notebook():
    assert len(NOTEBOOKS) >= 16
    out = _cli("check")
    assert out.returncode == 0, out.stdout + out.stderr   # also a .py in notebooks/ or solutions/ with no .ipynb


def test_labs_and_grading_see_only_the_notebooks():
    from course_grading.build import lab_names
    assert lab_names(ROOT / "solutions") == sorted(p.stem for p in ROOT.glob("solutions/lab*.ipynb"))


# ---- the format: jupytext's percent format, plus ids, badge and install cells -----------------------

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
        _cell("markdown", "# Title\n\nSome *text*  \n## %% not a header\n#no space\n\n  indented", "c002"),
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
        _cell("code", "z = 1", "c010a", jupyter={"source_hidden": True}, **{"slideshow.x": "é"}),
        _cell("raw", "raw text\n# %% [markdown]", "3f2a-9b_c"),
        _cell("code", "trailing = 1   ", "c011"),
        _cell("code", "%timeit f()\n!ls\n# %matplotlib is a comment here", "c012"),
        _cell("code", "\n\nclass A:\n    pass", "c013"),                 # blank lines before, kept
    ]
    text = _round_trip(_notebook(cells))
    assert '# %% id="c003" tags=["parameters"]\n' in text
    assert ('# %% id="c007" nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, '
            '"solution": false, "task": false}\n') in text
    assert '# %% [markdown] id="c010" nbgrader={"grade": true, "grade_id": "f_text", "locked": false' in text
    assert "\n# !ls\n" in text                     # jupytext comments a magic out; reading it back restores it
    assert not text.startswith("# ---")           # no YAML header: nothing jupytext writes changes per version


def test_the_short_forms_build_ids_badge_and_install_cells():
    text = '# %%\nx = 1\n\n# %% tags=["parameters"]\ny = 2\n\n# %% [markdown] id="intro"\n# Hi\n\n# %%\nz = 3\n'
    nb = nbt.notebook(text, "solutions/lab99.ipynb")
    assert [c.id for c in nb.cells] == ["c000", "c001", "c001a", "c001b", "intro", "introa"]
    assert nb.cells[3].metadata == {"tags": ["parameters"]} and nb.cells[4].source == "Hi"
    assert "solutions/lab99.ipynb" in nb.cells[0].source and "!pip install" in nb.cells[1].source
    assert nb.metadata == nbt.NB_METADATA and "jupytext" not in nbt.render(nb)
    assert all(c.outputs == [] and c.execution_count is None for c in nb.cells if c.cell_type == "code")


def test_blank_lines_between_cells_are_layout_not_metadata():
    one = nbt.notebook('# %% id="a1"\ndef f():\n    pass\n\n# %% id="a2"\nx = 1\n', "notebooks/x.ipynb")
    two = nbt.notebook('# %% id="a1"\ndef f():\n    pass\n\n\n# %% id="a2"\nx = 1\n', "notebooks/x.ipynb")
    assert nbt.render(one) == nbt.render(two) and one.cells[2].metadata == {}   # jupytext: lines_to_next_cell


try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:    # the student environment has no hypothesis
    given = None

if given is not None:
    # No "%" (magics, "%%" markers) and no quotes (a string left open runs over the next header): there
    # every source text comes back exactly, "#" lines, brackets and "key=value" lookalikes included.
    _sources = st.text(alphabet="# a[]=\n\t-", max_size=40).map(lambda s: s.rstrip())
    _metadata = st.sampled_from([{}, {"tags": ["parameters"]}, {"nbgrader": _nbgrader("a", solution=True)},
                                 {"nbgrader": _nbgrader("b", grade=True, points=2)},
                                 {"nbgrader": _nbgrader("c", solution=True, grade=True, points=1)},
                                 {"nbgrader": _nbgrader("d")}, {"tags": ["x"], "jupyter": {"source_hidden": True}}])
    _cells = st.lists(st.tuples(st.sampled_from(["code", "markdown", "raw"]), _sources, _metadata), max_size=8)

    @settings(max_examples=300, deadline=None)
    @given(_cells)
    def test_round_trip_property(spec):
        _round_trip(_notebook([_cell(k, s, f"c{i + 2:03d}", **m) for i, (k, s, m) in enumerate(spec)]))


def test_what_jupytext_cannot_hold_is_refused_by_cell():
    ok = _cell("code", "x = 1", "c002")
    for bad in [_cell("code", "y = 2", "c003", tags=[]),              # jupytext drops empty tags
                _cell("markdown", "%% a line read as a header", "c003"),
                _cell("code", "x = 1\n# %%\ny = 2", "c003"),          # a marker outside a string splits the cell
                _cell("code", "y = 2\n    ", "c003")]:                 # a whitespace-only last line is dropped
        with pytest.raises(nbt.SourceError, match=r"x.ipynb: cell 3 \(id 'c003'\) would not come back"):
            nbt.source_text(_notebook([bad, ok]), "x.ipynb")
    run = _notebook([ok])
    run.cells[2].outputs = [nbformat.v4.new_output("stream", text="hello\n")]
    with pytest.raises(nbt.SourceError, match=r"cell 3 \(id 'c002'\).*no outputs"):
        nbt.source_text(run, "x.ipynb")
    with pytest.raises(nbt.SourceError, match="badge and install cells"):
        nbt.source_text(nbformat.v4.new_notebook(cells=[ok]), "x.ipynb")


def test_bad_ids_are_refused_by_name():
    with pytest.raises(nbt.SourceError, match=r"src.py: cell 2: cell id 'c002' is used twice"):
        nbt.notebook('# %% id="c002"\nx\n\n# %% id="c002"\ny\n', "notebooks/x.ipynb", "src.py")
    with pytest.raises(nbt.SourceError, match="c000 and c001 are the badge"):
        nbt.notebook('# %% id="c001"\nx\n', "notebooks/x.ipynb")
    with pytest.raises(nbt.SourceError, match=r'id="a b" is not a cell id'):
        nbt.notebook('# %% id="a b"\nx\n', "notebooks/x.ipynb")
    with pytest.raises(nbt.SourceError, match=r"id=3 is not a cell id"):
        nbt.notebook('# %% id=3\nx\n', "notebooks/x.ipynb")


# ---- check and build on a copy -----------------------------------------------------------------------

@pytest.fixture
def copy_pair(tmp_path):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    for suffix in (".py", ".ipynb"):
        shutil.copy(ROOT / "notebooks" / f"00_measuring_inference{suffix}", folder)
    return folder / "00_measuring_inference.py", folder / "00_measuring_inference.ipynb"


def test_check_reports_a_one_character_edit_and_build_fixes_it(copy_pair):
    py, ipynb = copy_pair
    folder = py.parent
    assert nbt.check([folder]) == []
    original = py.read_text()
    i = original.index('# %% [markdown] id="c002"') + 40    # a character of the title
    py.write_text(original[:i] + ("X" if original[i] != "X" else "Y") + original[i + 1:])
    found = nbt.check([folder])
    assert len(found) == 1 and "00_measuring_inference.ipynb is not what" in found[0], found
    assert "00_measuring_inference.py builds" in found[0] and "tools/nb.py build" in found[0], found
    assert "cell 3, id 'c002'" in found[0], found

    out = _cli("check", folder)
    assert out.returncode == 1 and "00_measuring_inference.ipynb is not what" in out.stdout, out
    out = _cli("build", folder)
    assert out.returncode == 0 and "wrote" in out.stdout, out
    assert nbt.check([folder]) == [] and py.read_text() != original
    assert json.loads(ipynb.read_text())["cells"][2]["source"] != json.loads(
        (ROOT / "notebooks/00_measuring_inference.ipynb").read_text())["cells"][2]["source"]

    # an edit made in the notebook is reported, and build puts back what the source says
    py.write_text(original)
    shutil.copy(ROOT / "notebooks/00_measuring_inference.ipynb", ipynb)
    assert nbt.check([ipynb]) == []
    ipynb.write_text(ipynb.read_text().replace('"id": "c005"', '"id": "c00x"', 1))
    assert "00_measuring_inference.ipynb is not what" in nbt.check([py])[0]
    assert nbt.build([py], say=lambda s: None) == 0
    assert ipynb.read_text() == (ROOT / "notebooks/00_measuring_inference.ipynb").read_text()


def test_missing_halves_and_new_cells(copy_pair):
    py, ipynb = copy_pair
    original = py.read_text()
    py.unlink()
    found = nbt.check([py.parent])
    assert len(found) == 1 and "has no source" in found[0], found
    assert nbt.build([ipynb], say=lambda s: None) == 1             # nothing to build it from
    py.write_text(nbt.source_text(nbformat.read(str(ipynb), as_version=4)))
    assert py.read_text() == original and nbt.check([ipynb]) == []

    # a cell written without an id gets one on build, and build writes it into the source
    py.write_text(original.replace('# %% id="c004"', '# %%\nprint("new")\n\n# %% id="c004"', 1))
    ipynb.unlink()
    found = nbt.check([py.parent])
    assert len(found) == 1 and "has no notebook" in found[0] and "tools/nb.py build" in found[0], found
    said = []
    assert nbt.build([py], say=said.append) == 0
    assert '# %% id="c003a"\nprint("new")' in py.read_text(), said
    assert nbt.check([py.parent]) == []
    ids = [c["id"] for c in json.loads(ipynb.read_text())["cells"]]
    assert ids[3:6] == ["c003", "c003a", "c004"], ids
    # until then the check names the source
    py.write_text(py.read_text().replace('# %% id="c003a"', "# %%", 1))
    assert "1 cell(s) without an id=" in nbt.check([py])[0]


def test_a_source_opened_and_saved_in_jupyterlab_is_unchanged_and_a_new_cell_gets_an_id(tmp_path):
    """JupyterLab with jupytext opens the .py as a notebook (its contents manager) and saves the .py."""
    from jupytext import TextFileContentsManager
    shutil.copy(ROOT / "solutions" / "lab01.py", tmp_path)
    shutil.copy(ROOT / "solutions" / "lab01.ipynb", tmp_path)
    py, before = tmp_path / "lab01.py", (ROOT / "solutions" / "lab01.py").read_text()
    cm = TextFileContentsManager(root_dir=str(tmp_path))
    nb = cm.get("lab01.py", type="notebook")["content"]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    cm.save({"type": "notebook", "content": nb}, "lab01.py")
    assert py.read_text() == before and sorted(p.name for p in tmp_path.iterdir()) == ["lab01.ipynb", "lab01.py"]
    nb.cells.insert(3, nbformat.v4.new_code_cell("print('new')"))
    cm.save({"type": "notebook", "content": nb}, "lab01.py")
    assert nbt.build([py], say=lambda s: None) == 0 and nbt.check([py]) == []
    cells = json.loads((tmp_path / "lab01.ipynb").read_text())["cells"]
    assert [c["id"] for c in cells[4:7]] == ["c004", "c004a", "c005"] and cells[5]["source"] == ["print('new')"]
