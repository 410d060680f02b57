"""The bibliography (references.yaml), the citations `[@key]` in notebook and lab sources, the glossary
(glossary.yaml), and each notebook's closing "Further reading" (tools/references.py, tools/glossary.py; the
build in tools/nb.py, the pages in tools/site.py)."""
import re
from pathlib import Path

import nbformat
import pytest

from tools import glossary, references

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted([*ROOT.glob("notebooks/[0-9][0-9]_*.py"), *ROOT.glob("solutions/lab*.py")])
BUILT = sorted([*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("solutions/*.ipynb"), *ROOT.glob("labs/*.ipynb")])
NOTEBOOK_SOURCES = sorted(ROOT.glob("notebooks/[0-9][0-9]_*.py"))


def _nb_tool():
    import importlib.util
    import sys
    spec = importlib.util.spec_from_file_location("course_nb_tool", ROOT / "tools" / "nb.py")
    module = sys.modules.setdefault("course_nb_tool", importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)
    return module


nbt = _nb_tool()


def _markdown_cells(py: Path):
    """(cell id, source) of each markdown cell of a percent-format source, as tools/nb.py reads it."""
    _, cells, _ = nbt.parse(py.read_text(encoding="utf-8"), py.name)
    return [(c["id"], c.source) for c in cells if c.cell_type == "markdown"]


def _rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


# --- the bibliography ------------------------------------------------------------------------------------

GOOD = {"authors": ["Noam Shazeer"], "title": "Fast Transformer Decoding: One Write-Head is All You Need",
        "venue": "arXiv preprint", "year": 2019, "arxiv": "1911.02150", "uses": "Multi-query attention."}


def test_the_bibliography_is_valid_and_its_keys_are_in_alphabetical_order():
    refs = references.load()
    assert refs, "references.yaml is missing or empty"
    keys = re.findall(r"^([a-z][a-z0-9]*):\s*$", (ROOT / "references.yaml").read_text(), re.M)
    assert keys == list(refs), "every entry is a top-level key at the start of a line"
    assert keys == sorted(keys), "keys in alphabetical order, so that helpers' additions merge cleanly"


def test_an_entry_without_an_identifier_is_refused_by_key():
    bad = {k: v for k, v in GOOD.items() if k != "arxiv"}
    problems = references.validate({"shazeer2019fast": bad})
    assert problems == ["references.yaml: shazeer2019fast: no identifier: give at least one of arxiv, doi, url"]
    with pytest.raises(references.ReferenceError, match="shazeer2019fast: no identifier"):
        references.references_from({"shazeer2019fast": bad})
    for ident in ({"doi": "10.1145/1498765.1498785"}, {"url": "https://horace.io/brrr_intro.html"}):
        assert references.validate({"shazeer2019fast": {**bad, **ident}}) == []


@pytest.mark.parametrize("change, expected", [
    ({"title": None}, "missing title"),
    ({"uses": ""}, "missing uses"),
    ({"authors": "Noam Shazeer"}, "authors must be a list"),
    ({"year": "2019"}, "year must be a year"),
    ({"year": 2020}, "does not hold the year 2020"),
    ({"arxiv": 1911.0215}, "arxiv must be a quoted string"),         # what YAML reads from 1911.02150 unquoted
    ({"arxiv": "arXiv:1911.02150"}, "is not an arXiv identifier"),
    ({"arxiv": "1911.2150"}, "is not an arXiv identifier"),             # 2015 on: five digits
    ({"arxiv": "1312.12345"}, "is not an arXiv identifier"),            # before 2015: four
    ({"arxiv": "1913.02150"}, "is not an arXiv identifier"),            # month 13
    ({"arxiv": "2011.02150"}, "posted in 2020, after the year 2019"),
    ({"doi": "https://doi.org/10.1145/1498765.1498785"}, "is not a DOI"),
    ({"url": "horace.io/brrr_intro.html"}, "is not an http(s) URL"),
    ({"arxive": "1911.02150"}, "unknown field(s) arxive"),
])
def test_the_validator_names_the_key_and_the_problem(change, expected):
    entry = {**GOOD, **change}
    problems = references.validate({"shazeer2019fast": entry})
    assert problems and all(p.startswith("references.yaml: shazeer2019fast: ") for p in problems), problems
    assert any(expected in p for p in problems), problems


def test_old_style_arxiv_ids_and_version_suffixes_are_accepted():
    for arxiv in ("hep-th/9901001", "math.GT/0309136", "1911.02150v2", "0704.0001"):
        entry = {**GOOD, "arxiv": arxiv, "year": 2019}
        assert references.validate({"shazeer2019fast": entry}) == [], arxiv


def test_one_work_under_two_keys_and_a_key_twice_are_refused(tmp_path):
    problems = references.validate({"shazeer2019fast": GOOD, "shazeer2019one": GOOD})
    assert problems == ["references.yaml: shazeer2019one: arxiv 1911.02150 is also shazeer2019fast's: one entry "
                        "per work"], problems
    twice = tmp_path / "references.yaml"
    twice.write_text("a2019x:\n  year: 2019\n\na2019x:\n  year: 2019\n")   # PyYAML alone keeps the last one
    with pytest.raises(references.ReferenceError, match=r"references.yaml: line 4: the key 'a2019x' appears twice"):
        references.load(twice)


def test_labels_and_links():
    refs = references.references_from({
        "shazeer2019fast": GOOD,
        "dao2024transformers": {**GOOD, "authors": ["Tri Dao", "Albert Gu"], "year": 2024, "arxiv": "2405.21060"},
        "touvron2023llama": {**GOOD, "authors": ["Hugo Touvron", "Louis Martin", "et al."], "year": 2023,
                             "arxiv": "2307.09288"},
        "williams2009roofline": {**GOOD, "authors": ["Samuel Williams", "Andrew Waterman", "David Patterson"],
                                 "year": 2009, "arxiv": None, "doi": "10.1145/1498765.1498785"}})
    assert [r.label for r in refs.values()] == ["Shazeer, 2019", "Dao and Gu, 2024", "Touvron et al., 2023",
                                                "Williams et al., 2009"]
    assert refs["williams2009roofline"].link == "https://doi.org/10.1145/1498765.1498785"
    assert refs["shazeer2019fast"].link == "https://arxiv.org/abs/1911.02150"


# --- citations ---------------------------------------------------------------------------------------------

REFS = references.references_from({
    "shazeer2019fast": GOOD,
    "ainslie2023gqa": {**GOOD, "authors": ["Joshua Ainslie", "James Lee-Thorp", "Michiel de Jong"], "year": 2023,
                       "title": 'GQA: "Grouped" (queries)', "arxiv": "2305.13245"}})


def test_citations_render_as_author_and_year_linked_to_the_work_and_come_back_exactly():
    md = ("MQA [@shazeer2019fast] and GQA [@ainslie2023gqa; @shazeer2019fast, §3].\n\n"
          "`[@not_a_citation]` and\n```\n[@nor_this]\n```\n")
    out = references.render(md, REFS)
    assert out.startswith('MQA ([Shazeer, 2019](https://arxiv.org/abs/1911.02150 "Fast Transformer Decoding: '
                          'One Write-Head is All You Need. arXiv preprint, 2019.")) and GQA ([Ainslie et al., 2023]'
                          '(https://arxiv.org/abs/2305.13245 "GQA: \\"Grouped\\" (queries). arXiv preprint, 2023."); '
                          '[Shazeer, 2019, §3](https://arxiv.org/abs/1911.02150 '), out
    assert "`[@not_a_citation]`" in out and "[@nor_this]" in out
    assert references.unrender(out, REFS) == md
    assert references.cited_keys(md) == ["shazeer2019fast", "ainslie2023gqa", "shazeer2019fast"]
    # separate citations stay separate
    two = "[@shazeer2019fast]; [@ainslie2023gqa]"
    assert references.unrender(references.render(two, REFS), REFS) == two


def test_an_unknown_key_or_a_malformed_citation_is_an_error_naming_it():
    with pytest.raises(references.ReferenceError, match=r"the citation key 'nosuch2020key' is not in references.yaml"):
        references.render("see [@shazeer2019fast; @nosuch2020key]", REFS)
    with pytest.raises(references.ReferenceError, match=r"'\[@shazeer2019fast @ainslie2023gqa\]' is not a citation"):
        references.find_citations("[@shazeer2019fast @ainslie2023gqa]")


def test_the_build_fails_on_an_unknown_key_naming_the_cell():
    text = ('# %% [markdown] id="c002"\n# Intro [@shazeer2019fast].\n\n'
            '# %% [markdown] id="c003"\n# See [@nosuch2020key].\n')
    with pytest.raises(nbt.SourceError, match=r"src.py: cell 2 \(id 'c003'\): the citation key 'nosuch2020key'"):
        nbt.notebook(text, "notebooks/zz.ipynb", "src.py")


def test_a_built_notebook_links_its_citations_and_its_source_comes_back():
    key = next(iter(references.load()))
    text = f'# %% [markdown] id="c002"\n# A result [@{key}].\n'
    nb = nbt.notebook(text, "notebooks/zz.ipynb")
    assert "[@" not in nb.cells[2].source and references.load()[key].link in nb.cells[2].source
    assert nbt.source_text(nb) == text


def test_every_citation_key_in_the_notebook_and_lab_sources_exists():
    refs = references.load()
    missing = [f"{_rel(py)} cell {cid}: [@{key}]" for py in SOURCES for cid, md in _markdown_cells(py)
               for key in references.cited_keys(md) if key not in refs]
    assert not missing, "citation keys not in references.yaml:\n" + "\n".join(missing)


def test_no_built_notebook_holds_a_citation_in_its_source_form():
    """A `[@key]` left in an .ipynb means it was not built from its source (python tools/nb.py build, then
    course build-labs): a student would read the raw key."""
    raw = [f"{_rel(p)} cell {c.get('id')}" for p in BUILT for c in nbformat.read(p, as_version=4).cells
           if c.cell_type == "markdown" and references.find_citations(c.source)]
    assert not raw, "unbuilt citations (run python tools/nb.py build and course build-labs):\n" + "\n".join(raw)


def test_every_entry_is_cited_by_a_notebook_or_a_lab():
    """The bibliography is what the course uses: an entry nothing cites (not even a Further reading) goes."""
    cited = {key for py in SOURCES for _, md in _markdown_cells(py) for key in references.cited_keys(md)}
    unused = sorted(set(references.load()) - cited)
    assert not unused, f"entries of references.yaml no notebook or lab cites: {unused}"


# --- Further reading ------------------------------------------------------------------------------------------

def _further_reading_problem(py: Path) -> str | None:
    _, cells, _ = nbt.parse(py.read_text(encoding="utf-8"), py.name)
    starts = [i for i, c in enumerate(cells) if c.cell_type == "markdown"
              and re.search(r"^## Further reading\s*$", c.source, re.M)]
    if not starts:
        return "no '## Further reading' section"
    section = cells[starts[-1]:]
    if any(c.cell_type != "markdown" for c in section):
        return "'## Further reading' is not at the end (a code cell follows it)"
    text = "\n".join(c.source for c in section)
    after = text.split("## Further reading", 1)[1]
    if re.search(r"^#{1,2} ", after, re.M):
        return "another section follows '## Further reading'"
    if not references.cited_keys(after):
        return "'## Further reading' cites nothing ([@key] entries of references.yaml)"
    return None


@pytest.mark.parametrize("py", NOTEBOOK_SOURCES, ids=[p.stem for p in NOTEBOOK_SOURCES])
def test_every_notebook_ends_with_further_reading(py):
    problem = _further_reading_problem(py)
    assert problem is None, f"{_rel(py)}: {problem}"


def test_the_further_reading_check_catches_each_problem(tmp_path):
    def problem(cells):
        p = tmp_path / "nb.py"
        p.write_text("".join(f'# %% {"[markdown] " if md else ""}id="c{i:03d}"\n'
                             + "".join(f"# {line}\n" if md else f"{line}\n" for line in src.split("\n")) + "\n"
                             for i, (md, src) in enumerate(cells, start=2)))
        return _further_reading_problem(p)
    key = next(iter(references.load()))
    good = (True, f"## Further reading\n\n* [@{key}]: what it gives.")
    assert problem([(True, "# T"), (False, "x = 1"), good]) is None
    assert problem([(True, "# T"), (False, "x = 1")]) == "no '## Further reading' section"
    assert "a code cell follows" in problem([good, (False, "x = 1")])
    assert "another section follows" in problem([good, (True, "## Summary")])
    assert "cites nothing" in problem([(True, "## Further reading\n\nRead more.")])


# --- the glossary ----------------------------------------------------------------------------------------------

def test_the_glossary_is_valid_and_has_the_course_terms():
    terms = glossary.load()
    assert len(terms) >= 40, len(terms)
    for needed in ("ttft", "tpot", "inter-token-latency", "goodput", "throughput", "arithmetic-intensity",
                   "ridge-point", "roofline", "kv-cache", "block-table", "paged-attention", "prefill", "decode",
                   "continuous-batching", "speculative-decoding", "acceptance-rate", "group-size", "zero-point",
                   "nf4", "fp8", "bits-per-byte", "perplexity", "tensor-parallelism", "pipeline-parallelism",
                   "all-reduce", "online-softmax"):
        assert needed in terms, needed
    ids = re.findall(r"^([a-z0-9-]+):\s*$", (ROOT / "glossary.yaml").read_text(), re.M)
    assert ids == sorted(ids), "anchors in alphabetical order (merges)"


def test_each_term_is_used_in_the_notebook_of_the_module_said_to_teach_it():
    terms = glossary.load()
    notebooks = {p.name[:2]: p for p in NOTEBOOK_SOURCES}
    absent = []
    for tid, entry in terms.items():
        linker = glossary.Linker({tid: entry}, lambda t: f"#{t}")
        for _, md in _markdown_cells(notebooks[entry.module]):
            linker.link(md)
        if not linker.linked:
            absent.append(f"{tid}: none of {list(entry.match)} in {notebooks[entry.module].name}'s prose")
    assert not absent, "\n".join(absent)


def test_the_glossary_validator_names_the_problems():
    good = {"term": "TTFT", "match": ["TTFT"], "module": "00", "definition": "Time to first token."}
    assert glossary.validate({"ttft": good}) == []
    problems = glossary.validate({"TTFT": {**good, "module": 0, "see": ["nope"], "extra": 1},
                                  "ttft2": {**good, "definition": ""}})
    assert any("TTFT: an anchor is lowercase" in p for p in problems), problems
    assert any("module must be a quoted two-digit" in p for p in problems), problems
    assert any("unknown field(s) extra" in p for p in problems), problems
    assert any("ttft2: missing definition" in p for p in problems), problems
    assert any("ttft2: the form 'TTFT' is also TTFT's" in p for p in problems), problems
    assert any("see: 'nope' is not an entry" in p for p in problems), problems


def test_first_use_is_linked_once_in_prose_only():
    entries = {"kv-cache": glossary.Entry("kv-cache", "KV cache", ("KV cache",), "05", "d"),
               "prefill": glossary.Entry("prefill", "Prefill", ("prefill",), "01", "d"),
               "ttft": glossary.Entry("ttft", "TTFT", ("TTFT", "time to first token"), "00", "d")}
    linker = glossary.Linker(entries, lambda t: f"../glossary.yaml#{t}")
    cell1 = ("## The KV cache and TTFT\n\n`KV cache` in code, $TTFT$ in math, [a TTFT link](x.md), "
             "<span title=\"prefill\">x</span>, https://example.org/prefill, and ([Kwon et al., 2023]"
             "(https://arxiv.org/abs/2309.06180 \"TTFT and the KV cache\")).\n\n"
             "<div>\nKV cache in an HTML block\n</div>\n\n"
             "Prose: the KV caches, Prefill, the time\nto first token.")
    out = linker.link(cell1)
    assert out.startswith(cell1[:cell1.index("Prose")]), out        # nothing linked before the prose
    assert out.endswith("Prose: the [KV caches](../glossary.yaml#kv-cache), [Prefill](../glossary.yaml#prefill), "
                        "the [time\nto first token](../glossary.yaml#ttft)."), out
    assert linker.linked == ["kv-cache", "prefill", "ttft"]
    again = "TTFT, the KV cache and the prefill, once more."
    assert linker.link(again) == again                              # first use only, across cells
    assert glossary.Linker(entries, str).link("the kv cache, the prefills, TTFTs")[-len("TTFTs](ttft)"):] == \
        "TTFTs](ttft)"
