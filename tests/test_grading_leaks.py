"""Hidden tests and solutions never reach a student, whatever the kernel does (issue 29, item 1).

Fast (no kernel): the scanner (`leaks.py`) finds a hidden-test line in every encoding it claims and
does not flag what a failing test shows by design (its message, its expected values) nor a student's
own solution; `feedback_notebook` withholds each planted output kind; `write_checked` refuses a file.

Slow: one grade run (module fixture) of the fixture lab with attackers that get the hidden tests (and a
world-readable copy of the solutions) into their outputs in many forms, beside controls (a solution, a
blank, a wrong answer whose hidden test fails with its message, and a victim graded after the
attackers). Every file the grader wrote is then searched -- independently of the scanner -- for each
hidden-test and solution line and for encodings of each hidden block.
"""
from __future__ import annotations

import base64
import codecs
import hashlib
import html
import json
import os
import re
import shutil
import sys
import zlib
from pathlib import Path

import nbformat
import pytest

from course_grading.build import answer_sources, build_labs, fill_answers, grade_id, notebook_text, read_notebook
from course_grading.feedback import (HIDDEN_NOTE, WIDGET_STATE, LeakBlocked, feedback_notebook, scrub_value,
                                         write_checked)
from course_grading.leaks import LabSecrets, normalize, png_texts
from course_grading.pipeline import grade

DATA = Path(__file__).parent / "data" / "solutions"
FIX = "lab99"
FULL = 5.0

# ---------------------------------------------------------------------------------------------------
# the attacks (answer-cell sources; each keeps the right answer so its score shows it is scored as usual)

ADD = "def add(a, b):\n    return a + b\n"
MUL = "def multiply(a, b):\n    return a * b\n"
CLAMP = "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n"

# The attack: the in-kernel guard undoes it before the hidden tests run (flag: tamper).
HOOK = ADD + 'get_ipython().events.register("post_run_cell", lambda r: print(r.info.raw_cell))\n'

# Past the guard: IPython's EventManager.trigger wrapped on the instance; each hidden block the kernel
# runs is shown in many forms, each as an output of its own; widget state; an error in a later cell.
TRIGGER = ADD + r'''
import ast, base64, codecs, json, struct, types, zlib
from IPython.display import display
_ip, _stash = get_ipython(), []

def _hidden_bodies(src):
    out = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "compile" and node.args \
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            out.append(node.args[0].value)
    return out

def _png(text):
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"tEXt", b"Comment\0" + text.encode())
            + chunk(b"IDAT", zlib.compress(b"\0\0")) + chunk(b"IEND", b""))

def _leak(body):
    b = body.encode()
    forms = [
        {"text/plain": body},
        {"text/plain": base64.b64encode(b).decode()},
        {"text/plain": body[::-1]},
        {"text/plain": codecs.encode(body, "rot13")},
        {"text/plain": b.hex()},
        {"text/plain": base64.b64encode(zlib.compress(b)).decode()},
        {"text/plain": "\u200b".join(body.upper())},
        {"text/plain": str(list(b))},
        {"text/html": '<img alt="%s" src="x.png">' % body.replace('"', "&quot;"), "text/plain": "an image"},
        {"application/json": {"k": body}, "text/plain": "{}"},
        {"image/png": base64.b64encode(_png(body)).decode(), "text/plain": "<Figure>"},
    ]
    for data in forms:
        display(data, raw=True)
    display({"text/plain": "ok"}, raw=True, metadata={"note": body})
    for k in range(0, len(body), 9):  # printed in pieces, each an output of its own
        display({"text/plain": body[k:k + 9]}, raw=True)
    from comm import create_comm
    create_comm(target_name="jupyter.widget", data={"state": {"_model_name": "LeakModel", "_model_module": "leak",
                                                              "_model_module_version": "1", "value": body},
                                                    "buffer_paths": []})

_orig_trigger = type(_ip.events).trigger

def _trigger(self, event, *args, **kwargs):
    if event == "post_run_cell" and args:
        for body in _hidden_bodies(args[0].info.raw_cell or ""):
            _stash.append(body)
            _leak(body)
    return _orig_trigger(self, event, *args, **kwargs)

_ip.events.trigger = types.MethodType(_trigger, _ip.events)
'''
# ... and, two exercises later, a traceback in an answer cell carrying what was stashed
TRIGGER_LATER = CLAMP + 'if _stash:\n    raise RuntimeError(base64.b64encode("\\n".join(_stash).encode()).decode())\n'

# A wrong answer whose repr is the hidden test it is called from (read from the calling frames' code
# constants): the hidden test's own assertion message would quote it.
REPR = r'''
import sys

class _Sly:
    def __eq__(self, other):
        return False
    def __repr__(self):
        f = sys._getframe(1)
        while f is not None:
            for c in f.f_code.co_consts:
                if isinstance(c, str) and "_rng" in c:
                    return c
            f = f.f_back
        return "nothing"

def multiply(a, b):
    return _Sly()
'''

# An audit hook (it would see every compiled source), then IPython's copies of the cells run so far.
AUDIT = ADD + "import sys\nsys.addaudithook(lambda event, args: None)\n"
HISTORY = CLAMP + "print('\\n'.join(In))\nprint('\\n'.join(get_ipython().history_manager.input_hist_raw))\n"

# The solutions, readable where the repository is world-readable (level user reads them, README says):
# a copy is planted where the kernel's user can read it.
SOLUTIONS = r'''
import json
for _c in json.load(open({path!r}))["cells"]:
    if (_c.get("metadata", {{}}).get("nbgrader") or {{}}).get("solution"):
        print("".join(_c["source"]))
'''


def write_nb(path: Path, nb) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(notebook_text(nb), encoding="utf-8")
    return path


def hidden_blocks(source_nb) -> list[str]:
    """Each hidden region's body as the grader passes it to the kernel (its lines, joined)."""
    out = []
    for c in source_nb.cells:
        inside, cur = False, []
        for ln in c.source.split("\n"):
            if "BEGIN HIDDEN TESTS" in ln:
                inside, cur = True, []
            elif "END HIDDEN TESTS" in ln:
                inside = False
                out.append("\n".join(cur))
            elif inside:
                cur.append(ln)
    return out


def secret_only_lines(source_nb, release_nb, *public_nbs) -> set[str]:
    """Lines (stripped, at least 20 characters) of hidden-test and solution regions that neither the
    release nor `public_nbs` (the student's own submission) show."""
    shown = {ln.strip() for nb in (release_nb, *public_nbs) for c in nb.cells for ln in c.source.split("\n")}
    out = set()
    for c in source_nb.cells:
        inside = False
        for ln in c.source.split("\n"):
            if "BEGIN HIDDEN TESTS" in ln or "BEGIN SOLUTION" in ln:
                inside = True
            elif "END HIDDEN TESTS" in ln or "END SOLUTION" in ln:
                inside = False
            elif inside and len(ln.strip()) >= 20 and ln.strip() not in shown:
                out.add(ln.strip())
    return out


def visible_text(path: Path) -> str:
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix == ".html":
        text = text + "\n" + html.unescape(re.sub(r"<[^>]+>", "", text))
    return text


def leaks_in(text: str, lines: set[str], blocks: list[str]) -> list[str]:
    """What of the hidden tests / solutions `text` shows: a line (whitespace ignored), or a hidden block in
    one of the attack's encodings (its first 40 characters)."""
    flat = re.sub(r"\s+", "", text)
    found = [f"line {ln!r}" for ln in sorted(lines) if re.sub(r"\s+", "", ln) in flat]
    for b in blocks:
        enc = {"base64": base64.b64encode(b.encode()).decode(), "hex": b.encode().hex(), "reversed": b[::-1],
               "rot13": codecs.encode(b, "rot13"), "zlib+base64": base64.b64encode(zlib.compress(b.encode())).decode(),
               "codes": str(list(b.encode()))}
        for name, e in enc.items():
            probe = re.sub(r"\s+", "", e)[:40]
            if probe and probe in flat:
                found.append(f"hidden block as {name}")
    return found


# ---------------------------------------------------------------------------------------------------
# fast: the scanner, the feedback notebook, the checked writer

@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    base = tmp_path_factory.mktemp("leaks-fixture")
    sols = base / "solutions"
    sols.mkdir()
    shutil.copyfile(DATA / f"{FIX}.ipynb", sols / f"{FIX}.ipynb")
    labs = base / "labs"
    assert [r.status for r in build_labs(sols, labs)] == ["written"]
    source, release = read_notebook(sols / f"{FIX}.ipynb"), read_notebook(labs / f"{FIX}.ipynb")
    return dict(base=base, sols=sols, labs=labs, source=source, release=release,
                answers=answer_sources(source), secrets=LabSecrets(source, release))


LINE = 'assert add(_a, _b) == _a + _b, f"add({_a}, {_b}): expected {_a + _b}, got {add(_a, _b)!r}"'


def _png_with_text(text: str) -> bytes:
    import struct

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
            + chunk(b"zTXt", b"Comment\0\0" + zlib.compress(text.encode())) + chunk(b"IEND", b""))


ENCODINGS = {
    "plain": lambda s: s,
    "indented and wrapped": lambda s: "    " + s.replace(" == ", "\n    ==  "),
    "upper case": str.upper,
    "zero-width spaces": lambda s: "\u200b".join(s),
    "fullwidth": lambda s: "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in s),
    "reversed": lambda s: s[::-1],
    "rot13": lambda s: codecs.encode(s, "rot13"),
    "rot7": lambda s: s.translate(str.maketrans("abcdefghijklmnopqrstuvwxyz", "hijklmnopqrstuvwxyzabcdefg")),
    "base64": lambda s: base64.b64encode(s.encode()).decode(),
    "base64, wrapped at 20": lambda s: "\n".join(re.findall(".{1,20}", base64.b64encode(s.encode()).decode())),
    "base64 glued to text": lambda s: "xyz" + base64.b64encode(s.encode()).decode(),
    "base64url": lambda s: base64.urlsafe_b64encode(s.encode()).decode(),
    "base32": lambda s: base64.b32encode(s.encode()).decode(),
    "hex": lambda s: s.encode().hex(),
    "base64 of reversed": lambda s: base64.b64encode(s[::-1].encode()).decode(),
    "base64 of base64": lambda s: base64.b64encode(base64.b64encode(s.encode())).decode(),
    "zlib in base64": lambda s: base64.b64encode(zlib.compress(s.encode())).decode(),
    "html spans": lambda s: "".join(f"<span>{html.escape(c)}</span>" for c in s),
    "html entities": lambda s: "".join(f"&#{ord(c)};" for c in s),
    "alt text": lambda s: f'<img src="a.png" alt="{html.escape(s)}">',
    "url-quoted": lambda s: "".join(f"%{b:02x}" for b in s.encode()),
    "json escapes": lambda s: json.dumps(s).replace("a", "\\u0061"),
    "python bytes": lambda s: repr(s.encode()).replace("a", "\\x61"),
    "character codes": lambda s: str([ord(c) for c in s]),
    "PNG text chunk": lambda s: base64.b64encode(_png_with_text(s)).decode(),
}


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
def test_scanner_finds_a_hidden_line_in_every_encoding(fixture, encoding):
    scan = fixture["secrets"].scanner()
    text = "some output before\n" + ENCODINGS[encoding](LINE) + "\nsome output after"
    hits = scan.find(text)
    assert hits and hits[0].kind == "hidden test" and hits[0].where == "add_tests", (encoding, hits)


def test_scanner_finds_a_line_split_across_outputs_and_marks_only_those(fixture):
    scan = fixture["secrets"].scanner()
    pieces = [LINE[k:k + 9] for k in range(0, len(LINE), 9)]
    marked = scan.find_in_parts(["an honest output"] + pieces + ["another honest one"])
    assert set(marked) == set(range(1, len(pieces) + 1))
    b64 = base64.b64encode(LINE.encode()).decode()
    marked = scan.find_in_parts(["first,", b64[:30], b64[30:70], b64[70:], "; last"])
    assert {2, 3} <= set(marked) and 4 not in marked


def test_scanner_finds_solution_text(fixture):
    scan = fixture["secrets"].scanner()  # no submission: the solution is not the student's own
    assert [h.kind for h in scan.find("def clamp(x, lo, hi):\n    return max(lo, min(x, hi))")] == ["solution"]


@pytest.mark.parametrize("text", [
    "AssertionError: add(12, -7): expected 5, got 19",            # a failing hidden test's own message
    "AssertionError: multiply(3, 4): expected 12, got 7",
    "<random.Random object at 0x7f3a2c1d>",                       # a short run of a hidden line
    "random.Random(20) gave 0.9056396761745207 in my own printout",
    "assert add(2, 3) == 5, f\"add(2, 3): expected 5, got {add(2, 3)!r}\"",  # the visible test
    "# Hidden tests run here when your lab is graded.",
    "x" * 100_000,
    base64.b64encode(os.urandom(3000)).decode(),
])
def test_scanner_leaves_what_a_student_may_see(fixture, text):
    assert fixture["secrets"].scanner().find(text) == []


def test_a_students_own_solution_is_not_a_leak(fixture):
    sol = fill_answers(fixture["release"], fixture["answers"])
    text = "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))"
    assert fixture["secrets"].scanner().find(text)
    assert fixture["secrets"].scanner(sol).find(text) == []
    assert fixture["secrets"].scanner(sol).find(LINE)  # the hidden tests stay secret for everyone


def test_literals_of_hidden_tests_are_public():
    """A hidden test's message and expected values are written to be shown when it fails."""
    src = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        'check_close(f(x), [0.12345, 0.67891, 0.23456, 0.78912], "the attention output with a causal mask")\n'
        '### BEGIN HIDDEN TESTS\n'
        'check_close(g(_secret_input_tensor), [0.12345, 0.67891, 0.23456, 0.78912], "g of the hidden tensor, '
        'causal and grouped")\n### END HIDDEN TESTS',
        metadata={"nbgrader": {"grade": True, "grade_id": "t", "points": 1, "solution": False}})])
    rel = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        'check_close(f(x), [0.12345, 0.67891, 0.23456, 0.78912], "the attention output with a causal mask")',
        metadata={"nbgrader": {"grade": True, "grade_id": "t", "points": 1, "solution": False}})])
    scan = LabSecrets(src, rel).scanner()
    assert scan.find("AssertionError: g of the hidden tensor, causal and grouped: expected [0.12345 0.67891 ...")  == []
    assert scan.find("check_close(g(_secret_input_tensor), [0.12345")


def test_rendered_markdown_of_the_release_is_public():
    """The feedback page renders the release's markdown, and the scanner reads a page without its tags:
    "raise `OutOfBlocks(1, 0)`" reads back as "raise OutOfBlocks(1, 0)", a solution line of lab06 word for
    word. The student was told that much; the page must not be withheld for it (it was, for 4 real labs)."""
    meta = {"nbgrader": {"solution": True, "grade": False, "grade_id": "f", "locked": False}}
    md = nbformat.v4.new_markdown_cell("When no block is free, raise `OutOfBlocks(1, 0)`.")
    src = nbformat.v4.new_notebook(cells=[md, nbformat.v4.new_code_cell(
        "def alloc(self):\n    ### BEGIN SOLUTION\n    raise OutOfBlocks(1, 0)\n    ### END SOLUTION", metadata=meta)])
    rel = nbformat.v4.new_notebook(cells=[md, nbformat.v4.new_code_cell(
        "def alloc(self):\n    # YOUR CODE HERE\n    raise NotImplementedError()", metadata=meta)])
    scan = LabSecrets(src, rel).scanner()
    assert scan.find("<p>When no block is free, raise <code>OutOfBlocks(1, 0)</code>.</p>") == []
    assert scan.find("<pre>    ### BEGIN SOLUTION</pre>")  # the rest of the solution cell stays secret
    bare = LabSecrets(src, nbformat.v4.new_notebook(cells=rel.cells[1:])).scanner()
    assert bare.find("<p>raise <code>OutOfBlocks(1, 0)</code></p>")  # not said in the release: secret


def test_png_text_chunks():
    assert png_texts(_png_with_text("hello there")) == ["Comment hello there"]


def _executed(fixture, outputs_by_gid: dict, extra_cells=()):
    """An 'executed' notebook: the solved submission with planted outputs, and the submission itself."""
    sub = fill_answers(fixture["release"], fixture["answers"])
    for c in extra_cells:
        sub.cells.append(c)
    ex = nbformat.from_dict(json.loads(json.dumps(sub)))
    for c in ex.cells:
        if grade_id(c) in outputs_by_gid:
            c.outputs = outputs_by_gid[grade_id(c)]
    # the executed notebook carries the instructor's test sources (hidden tests in), as autograde leaves it
    src = {grade_id(c): c for c in fixture["source"].cells if grade_id(c)}
    for c in ex.cells:
        g = grade_id(c)
        if g and not c.metadata.nbgrader.get("solution"):
            c.source = src[g].source
    return ex, sub


def test_feedback_notebook_withholds_each_planted_kind(fixture):
    out = nbformat.v4.new_output
    b64 = base64.b64encode(LINE.encode()).decode()
    outputs = {
        "add_answer": [out("stream", name="stdout", text="my own debugging print\n"),
                       out("stream", name="stderr", text=LINE[::-1])],
        "add_tests": [out("error", ename="AssertionError", evalue="add(1, 2): expected 3, got 4",
                          traceback=["Traceback ...", "exec(compile('" + LINE + "', '<hidden tests>', 'exec'))"])],
        "multiply_answer": [out("display_data", data={"text/html": f'<img alt="{LINE}">', "text/plain": "img"}),
                            out("display_data", data={"image/png": base64.b64encode(_png_with_text(LINE)).decode()}),
                            out("display_data", data={"text/plain": "fine"}, metadata={"x": b64}),
                            out("execute_result", data={"text/plain": "42"}, execution_count=3)],
        "multiply_tests": [out("error", ename="AssertionError", evalue="got " + codecs.encode(LINE, "rot13"),
                               traceback=[])],
        "clamp_answer": [out("error", ename="RuntimeError", evalue=b64, traceback=["RuntimeError: " + b64]),
                         out("display_data", data={"image/png": base64.b64encode(b"\x89PNG....").decode()})],
    }
    ex, sub = _executed(fixture, outputs)
    ex.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {"m": {"value": LINE}}}}
    scan = fixture["secrets"].scanner(sub)
    nb, withheld = feedback_notebook(ex, sub, fixture["release"], fixture["source"], scan)
    cells = {grade_id(c): c for c in nb.cells if grade_id(c)}
    texts = {g: json.dumps(c.get("outputs", [])) for g, c in cells.items()}
    assert set(withheld) == {"add_answer", "multiply_answer", "multiply_tests", "clamp_answer", WIDGET_STATE}
    assert "my own debugging print" in texts["add_answer"] and "[output withheld" in texts["add_answer"]
    # a failing hidden test shows its message, and nothing of the traceback that quotes its source
    assert "add(1, 2): expected 3, got 4" in texts["add_tests"] and "exec(compile" not in texts["add_tests"]
    assert "42" in texts["multiply_answer"] and "image output: not shown" not in texts["multiply_answer"]
    # the alt text, the PNG's text chunk and the metadata each carried the line: one note for the three
    assert texts["multiply_answer"].count("[output withheld") == 1
    assert '"img"' not in texts["multiply_answer"] and '"fine"' not in texts["multiply_answer"]
    assert "image output: not shown in feedback" in texts["clamp_answer"]
    # sources: the release's test cells (hidden tests replaced by one note), the student's answers
    assert HIDDEN_NOTE in cells["add_tests"].source and "_rng" not in cells["add_tests"].source
    assert cells["add_answer"].source == sub.cells[[grade_id(c) for c in sub.cells].index("add_answer")].source
    assert "widgets" not in nb.metadata
    whole = json.dumps(nb)
    assert not leaks_in(whole, secret_only_lines(fixture["source"], fixture["release"], sub), [LINE])


def test_feedback_without_kernel_outputs(fixture):
    out = nbformat.v4.new_output
    ex, sub = _executed(fixture, {"add_answer": [out("stream", name="stdout", text="hello\n")]})
    nb, withheld = feedback_notebook(ex, sub, fixture["release"], fixture["source"],
                                     fixture["secrets"].scanner(sub), outputs="none")
    assert "hello" not in json.dumps(nb) and "[outputs are not shown in feedback]" in json.dumps(nb)
    with pytest.raises(ValueError, match="outputs must be one of"):
        feedback_notebook(ex, sub, fixture["release"], fixture["source"], fixture["secrets"].scanner(sub), "all")


def test_write_checked_refuses_and_scrub_value_replaces(fixture, tmp_path):
    scan = fixture["secrets"].scanner()
    with pytest.raises(LeakBlocked, match="hidden test text of add_tests"):
        write_checked(tmp_path / "f.html", "<p>" + base64.b64encode(LINE.encode()).decode() + "</p>", scan)
    assert not (tmp_path / "f.html").exists()
    data = {"messages": ["fine", "got " + LINE[:40], LINE[40:]], "n": 3}
    clean, hits = scrub_value(data, scan)
    assert hits and clean["messages"][0] == "fine" and "withheld" in clean["messages"][1] and clean["n"] == 3
    write_checked(tmp_path / "r.json", json.dumps(clean), scan)


# ---------------------------------------------------------------------------------------------------
# slow: one grade run with the attacks, real kernels

@pytest.fixture(scope="module")
def leaked(fixture, tmp_path_factory):
    base = tmp_path_factory.mktemp("leaks")
    release, a = fixture["release"], fixture["answers"]
    # a copy of the instructor's source where any user can read it (a world-readable repository)
    public_dir = Path(f"/tmp/course-grade-test-{os.getpid()}-{hashlib.sha1(str(base).encode()).hexdigest()[:6]}")
    public_dir.mkdir(mode=0o755, exist_ok=True)
    os.chmod(public_dir, 0o755)
    readable = public_dir / "lab99.ipynb"
    shutil.copyfile(fixture["sols"] / f"{FIX}.ipynb", readable)
    os.chmod(readable, 0o644)
    sub = base / "submissions"
    write_nb(sub / "alice" / "lab99.ipynb", fill_answers(release, a))                            # solution
    write_nb(sub / "bob" / "lab99.ipynb", release)                                                # blank
    write_nb(sub / "peggy" / "lab99.ipynb", fill_answers(release, {**a, "multiply_answer":
                                                                  "def multiply(a, b):\n    return a + b"}))
    write_nb(sub / "hook" / "lab99.ipynb", fill_answers(release, {**a, "add_answer": HOOK}))
    write_nb(sub / "mallory" / "lab99.ipynb", fill_answers(release, {**a, "add_answer": TRIGGER,
                                                                    "clamp_answer": TRIGGER_LATER}))
    write_nb(sub / "repr" / "lab99.ipynb", fill_answers(release, {**a, "multiply_answer": REPR}))
    write_nb(sub / "solreader" / "lab99.ipynb", fill_answers(release, {
        **a, "clamp_answer": CLAMP + SOLUTIONS.format(path=str(readable))}))
    write_nb(sub / "history" / "lab99.ipynb", fill_answers(release, {**a, "add_answer": AUDIT,
                                                                    "clamp_answer": HISTORY}))
    victim = write_nb(sub / "zoe" / "lab99.ipynb", fill_answers(release, a))
    before = victim.read_bytes()
    out = base / "out"
    lines = []
    try:
        report = grade(sub, labs_release=fixture["labs"], solutions=fixture["sols"], out=out, timeout=30,
                       workdir=base / "work", echo=lines.append)
    finally:
        shutil.rmtree(public_dir, ignore_errors=True)
    subs = {s: read_notebook(sub / s / "lab99.ipynb") for s in ("alice", "bob", "peggy", "hook", "mallory", "repr",
                                                                "solreader", "history", "zoe")}
    return {**fixture, **dict(report=report, out=out, base=base, lines=lines, subs=subs, victim=victim,
                              before=before, workdir=base / "work")}


slow = pytest.mark.slow


def res(leaked, student):
    return leaked["report"].by_student(student, FIX)


@slow
def test_no_file_given_back_shows_hidden_tests_or_solutions(leaked):
    """Every file in --out, searched for every hidden-test and solution line and each hidden block in the
    attack's encodings; for a student's feedback, lines of their own submission do not count."""
    out, report = leaked["out"], leaked["report"]
    blocks = hidden_blocks(leaked["source"])
    assert blocks and all(len(b) > 50 for b in blocks)
    everyone = secret_only_lines(leaked["source"], leaked["release"])
    files = sorted(p for p in out.rglob("*") if p.is_file())
    assert any(p.suffix == ".html" for p in files) and any(p.suffix == ".log" for p in files)
    problems = {}
    for p in files:
        lines = everyone
        for r in report.results:
            if r.feedback and Path(r.feedback) == p:
                lines = secret_only_lines(leaked["source"], leaked["release"], leaked["subs"][r.student])
        found = leaks_in(visible_text(p), lines, blocks)
        if found:
            problems[str(p.relative_to(out))] = found[:5]
    assert not problems, problems


@slow
def test_the_attacks_did_get_the_hidden_tests(leaked):
    """The search above means something: in the instructor's executed notebooks (never given back) the
    attacks' outputs do carry the hidden tests."""
    blocks = hidden_blocks(leaked["source"])
    for student in ("mallory", "repr"):
        text = _executed_outputs(leaked, student)
        lines = secret_only_lines(leaked["source"], leaked["release"])
        assert leaks_in(text, lines, blocks), f"{student}'s attack leaked nothing: the test proves nothing"


def _executed_outputs(run, student) -> str:
    """The outputs of a student's executed notebook, in the instructor's folder (never given back)."""
    ex = run["workdir"] / "autograded" / run["report"].by_student(student, FIX).internal_id / FIX / f"{FIX}.ipynb"
    outputs = json.dumps([c.get("outputs", []) for c in read_notebook(ex).cells])
    return outputs.encode().decode("unicode_escape", errors="ignore")


@slow
@pytest.mark.parametrize("student, score, flags", [
    ("mallory", FULL, {"feedback_withheld"}),
    ("repr", 3.0, {"feedback_withheld"}),
    ("hook", FULL, {"tamper"}),
])
def test_attackers_are_flagged_and_scored_as_usual(leaked, student, score, flags):
    r = res(leaked, student)
    assert r.status == "review" and flags <= set(r.flags), (r.flags, r.messages)
    assert (r.score, r.max_score) == (score, FULL), r.cells
    if "feedback_withheld" in flags:
        assert any("feedback: the output of" in m and "withheld" in m for m in r.messages)
        assert "[output withheld: it carried text of the instructor's" in visible_text(Path(r.feedback))


@slow
def test_solution_reader_finds_nothing_or_is_withheld(leaked):
    """The instructor's source, world-readable in /tmp: out of the kernel's reach where its filesystem is
    private (bwrap; user as root); where it is not, what it prints is withheld from the feedback."""
    r = res(leaked, "solreader")
    outputs = _executed_outputs(leaked, "solreader")
    got = "BEGIN SOLUTION" in outputs  # the attack prints the source's solution cells, markers and all
    if "private filesystem" in leaked["report"].isolation:
        assert not got and "No such file or directory" in outputs, outputs[-2000:]
        assert (r.score, "feedback_withheld" in r.flags) == (FULL, False), (r.flags, r.messages)
    else:
        assert got and "feedback_withheld" in r.flags and any("solutions of" in m for m in r.messages), r.messages


@pytest.fixture(scope="module")
def solread_process(fixture, tmp_path_factory):
    """The solution reader at level process (the kernel is the grader's own user and sees its files): its
    attack works there, so the feedback scan must stop it."""
    base = tmp_path_factory.mktemp("solread")
    release, a = fixture["release"], fixture["answers"]
    sub = base / "submissions"
    write_nb(sub / "alice" / "lab99.ipynb", fill_answers(release, a))
    write_nb(sub / "solreader" / "lab99.ipynb", fill_answers(release, {
        **a, "clamp_answer": CLAMP + SOLUTIONS.format(path=str(fixture["sols"] / f"{FIX}.ipynb"))}))
    report = grade(sub, labs_release=fixture["labs"], solutions=fixture["sols"], out=base / "out", timeout=30,
                   workdir=base / "work", isolation="process")
    subs = {s: read_notebook(sub / s / "lab99.ipynb") for s in ("alice", "solreader")}
    return {**fixture, "report": report, "out": base / "out", "workdir": base / "work", "subs": subs}


@slow
def test_solution_reader_at_level_process_is_withheld_and_named(solread_process):
    run = solread_process
    lines = secret_only_lines(run["source"], run["release"])
    assert "BEGIN SOLUTION" in _executed_outputs(run, "solreader"), "the attack read nothing: the test proves nothing"
    r = run["report"].by_student("solreader", FIX)
    assert r.status == "review" and "feedback_withheld" in r.flags, (r.flags, r.messages)
    assert (r.score, r.max_score) == (FULL, FULL), r.cells
    assert any("solutions of" in m for m in r.messages), r.messages
    assert "[output withheld: it carried text of the instructor's" in visible_text(Path(r.feedback))
    for p in sorted(run["out"].rglob("*")):
        if p.is_file():
            own = [x for x in run["report"].results if x.feedback and Path(x.feedback) == p]
            want = secret_only_lines(run["source"], run["release"], run["subs"][own[0].student]) if own else lines
            assert not leaks_in(visible_text(p), want, []), p
    alice = run["report"].by_student("alice", FIX)
    assert (alice.score, alice.status) == (FULL, "ok"), alice.messages


@slow
def test_audit_hook_refused_and_history_forgotten(leaked):
    """The guard refuses a second audit hook (flag: tamper) and leaves no hidden test in ``In`` or the
    history: the cell that prints them shows the release's test cells only, so nothing is withheld."""
    r = res(leaked, "history")
    assert r.status == "review" and set(r.flags) == {"tamper"}, (r.flags, r.messages)
    assert any("audit hook" in m for m in r.messages) and r.score == FULL
    ex = leaked["workdir"] / "autograded" / r.internal_id / FIX / f"{FIX}.ipynb"
    cell = next(c for c in read_notebook(ex).cells if grade_id(c) == "clamp_answer")
    printed = "".join(o.get("text", "") for o in cell.outputs)
    assert "add(2, 3) == 5" in printed and "verify(" in printed   # it did print the test cells run so far
    lines = secret_only_lines(leaked["source"], leaked["release"], leaked["subs"]["history"])
    assert not leaks_in(printed, lines, hidden_blocks(leaked["source"])), printed


@slow
def test_hook_is_undone_in_the_kernel(leaked):
    r = res(leaked, "hook")
    assert any("'post_run_cell' were changed" in m for m in r.messages), r.messages


@slow
@pytest.mark.parametrize("student, score", [("alice", FULL), ("bob", 0.0), ("peggy", 3.0), ("zoe", FULL)])
def test_controls(leaked, student, score):
    r = res(leaked, student)
    assert (r.score, r.max_score, r.status, r.flags) == (score, FULL, "ok", {}), (r.flags, r.messages)


@slow
def test_failing_hidden_test_still_shows_its_message(leaked):
    text = visible_text(Path(res(leaked, "peggy").feedback))
    assert re.search(r"multiply\(-?\d+, -?\d+\): expected -?\d+, got -?\d+", text), "the hidden test's message is gone"
    assert "[output withheld" not in text and HIDDEN_NOTE in text


@slow
def test_victim_file_unchanged(leaked):
    assert leaked["victim"].read_bytes() == leaked["before"]


@slow
def test_report_names_the_files_for_students_and_for_the_instructor(leaked):
    data = json.loads((leaked["out"] / "report.json").read_text())
    assert {r["student"] for r in data["results"]} == set(leaked["subs"])
    # every feedback page sits in its student's own folder
    for r in leaked["report"].results:
        assert Path(r.feedback).parent.name == r.file_key


@slow
def test_report_json_is_scrubbed(leaked):
    """The hidden test quoted in an assertion message (the repr attack) reaches report.json's per-cell
    errors only as a withheld note."""
    data = json.loads((leaked["out"] / "report.json").read_text())
    r = next(x for x in data["results"] if x["student"] == "repr")
    errors = {c["grade_id"]: c.get("error") for c in r["cells"]}
    assert errors["multiply_hidden"] == "[withheld: carried text of the instructor's tests]", errors
    assert errors["multiply_tests"].startswith("AssertionError: multiply(3, 4): expected 12")
