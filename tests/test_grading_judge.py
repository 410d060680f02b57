"""The judge outside the student's process (issue 40): every attack of the review, rebuilt, at `user` and `bwrap`.

The review graded lab01 as an adopting instructor's security reviewer would, and a blank lab scored full marks
five ways, the reference was reached through importlib, the hidden tests were read back from the feedback, one
submission aborted the whole batch, kernels shared the grader's keyring, two students of one name became one, a
folder name and a student's markdown reached the instructor's terminal and the feedback page raw, the clock made
the hidden inputs predictable and regrades differ, and a bug was charged twice. Here each is a submission (or a
fast check) and the assertion is what must hold now:

* a blank lab with any of the kernel tricks (displayhook, a wrapped `Session.send`, answer objects whose `__eq__`
  is always true and whose `__array__` looks for `expected`, a `do_execute` that runs only first lines, a rebound
  `_close`) scores 0: the scores are the judge's, computed in the grader from plain data;
* the reference reached through `importlib` is a stub in the kernel's copy of course_lib: 0 for the part;
* nothing of the judge (a canary in its code) or of the class secret can be found from the kernel, by any path,
  and no output file carries it: the attacker's `add` is right only if it found one;
* outputs that once broke the scanner or the grader's memory end in grades.csv, bounded;
* the kernel has its own empty session keyring and no key system call: the grader's key is not read, no key is
  left for the next student;
* two LMS folders with one display name stay two students; a folder name's escapes are printed escaped; a
  student's markdown reaches the feedback page as text;
* the same secret gives the same cases and grades (a regrade), the kernel's clock changes nothing, and another
  secret other cases;
* one bug is charged once (lab06's free order, lab07's denominator), the off-by-one kernel loses points on every
  secret, and the misleading messages now name the misconception.
"""
from __future__ import annotations

import ctypes
import html
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest

from course_grading import sandbox, wire
from course_grading.autograde import summary
from course_grading.build import answer_sources, build_labs, fill_answers, notebook_text, read_notebook
from course_grading.collect import collect, terminal_safe
from course_grading.driver import handle
from course_grading.feedback import feedback_notebook
from course_grading.judging import (CaseResult, Judge, case_seed, judge_parts, load_secret, local_send,
                                    part_score)
from course_grading.pipeline import grade

sys.path.insert(0, str(Path(__file__).parent))
from judge_tools import judge_locally, solution_answers, solution_with  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"
CI = os.environ.get("CI", "").lower() == "true"
slow = pytest.mark.slow


# ---------------------------------------------------------------------------------------------------
# fast: the wire, the driver, the judge's arithmetic, names, markdown

def test_the_wire_carries_plain_data_only():
    import torch
    value = {"a": (1, 2.5, float("nan")), 3: [None, True, "x"], "t": torch.arange(6, dtype=torch.int16).view(2, 3),
             "b": torch.ones(2, dtype=torch.bfloat16)}
    back = wire.decode(json.loads(json.dumps(wire.encode(value))))
    assert back["a"][:2] == (1, 2.5) and back["a"][2] != back["a"][2] and back[3] == [None, True, "x"]
    assert torch.equal(back["t"], value["t"]) and back["b"].dtype == torch.bfloat16

    class Sly:
        def __eq__(self, other):
            return True

        def __array__(self, *a, **k):
            raise AssertionError("never called")
    sent = wire.decode(wire.encode(Sly()))
    assert isinstance(sent, wire.Opaque) and sent != sent and sent != 5     # equal to nothing
    for bad in ({"$array": {"dtype": "object", "shape": [1], "data": ""}}, {"$array": {"dtype": "int8", "shape": [9],
                "data": "AA=="}}, {"x": 1}, {"$f": "huge"}, {"$dict": [[[1], 2]]}, {"$remote": "r", "attrs": ["a b"]}):
        with pytest.raises(wire.WireError):
            wire.decode(bad, refs=lambda *a: None)
    deep = []
    for _ in range(40):
        deep = [deep]
    with pytest.raises(wire.WireError, match="deep"):
        wire.encode(deep)
    with pytest.raises(wire.WireError, match="larger"):
        wire.encode("x" * 10, limit=5)


def test_the_driver_answers_calls_and_forgets_between_parts():
    ns = {}
    exec("def f(x):\n    return x + 1\nclass C:\n    def __init__(self, n):\n        if n < 0: raise ValueError('n')\n"
         "        self.n = n\n", ns)
    ops = [{"op": "call", "fn": "C", "args": [2], "kwargs": {"$dict": []}, "store": "c", "send": False},
           {"op": "get", "fn": "$c.n"}, {"op": "call", "fn": "C", "args": [-1], "kwargs": {"$dict": []}, "store": "c"},
           {"op": "get", "fn": "$c.n"}, {"op": "call", "fn": "lib:os.system", "args": ["true"]},
           {"op": "call", "fn": "nope"}]
    out = handle(json.dumps({"id": 1, "ops": ops}), namespace=ns)["results"]
    assert out[1]["ok"] == 2
    assert out[2]["raised"]["type"] == "ValueError" and "Exception" in out[2]["raised"]["mro"]
    assert "error" in out[3]                      # a failed constructor leaves nothing under its name
    assert "only names of course_lib and torch" in out[4]["error"]
    assert out[5]["raised"]["type"] == "NameError"
    again = handle(json.dumps({"id": 2, "ops": [{"op": "get", "fn": "$c.n"}], "fresh": True}), namespace=ns)
    assert "error" in again["results"][0]           # a part's first request starts afresh


def test_cases_come_from_the_secret_and_the_student_not_the_clock(monkeypatch):
    a = case_seed(b"s" * 32, "lab01", "matmul_cost_tests", "alice")
    assert a == case_seed(b"s" * 32, "lab01", "matmul_cost_tests", "alice")
    assert len({a, case_seed(b"s" * 32, "lab01", "matmul_cost_tests", "bob"),
                case_seed(b"t" * 32, "lab01", "matmul_cost_tests", "alice"),
                case_seed(b"s" * 32, "lab01", "roofline_tests", "alice")}) == 4
    answers = solution_answers("lab01")
    before = judge_locally("lab01", answers, only=["matmul_cost_tests"]).parts["matmul_cost_tests"]
    monkeypatch.setattr(time, "time_ns", lambda: 12345)     # the review's attack, here on the grader's clock
    monkeypatch.setattr(time, "time", lambda: 12.345)
    after = judge_locally("lab01", answers, only=["matmul_cost_tests"]).parts["matmul_cost_tests"]
    assert [c.label for c in before.cases] == [c.label for c in after.cases]


def test_the_class_secret_is_made_once_and_private(tmp_path):
    secret, note = load_secret(tmp_path / ".grading" / "class-secret")
    assert note and len(secret) >= 32 and (tmp_path / ".grading" / "class-secret").stat().st_mode & 0o777 == 0o600
    assert load_secret(tmp_path / ".grading" / "class-secret") == (secret, "")
    (tmp_path / "short").write_text("abc")
    with pytest.raises(ValueError, match="32"):
        load_secret(tmp_path / "short")


def test_points_split_over_groups_and_cases():
    cases = [CaseResult("a", "values", passed=True), CaseResult("b", "values"), CaseResult("c", "errors", passed=True)]
    assert part_score(4, cases, {"values": 3, "errors": 1}) == 4 * (3 / 4 * 1 / 2 + 1 / 4)
    assert part_score(2, cases, None) == 2 * (1 / 2 * 1 / 2 + 1 / 2 * 1)
    assert part_score(2, [], None) == 0.0


def test_a_misconception_is_charged_once():
    judge = Judge()
    texts = {"bug": "the bug explained"}

    @judge.part("first")
    def first(t):
        with t.case("x"):
            raise AssertionError(f"x: this looks like a known mistake: {t.mistake('bug')}. expected 1, got 2")

    @judge.part("second")
    def second(t):
        with t.case("y"):
            raise AssertionError(f"y: this looks like a known mistake: {t.mistake('bug')}. expected 3, got 4")
        with t.case("z"):
            raise AssertionError("z: expected 5, got 6")
    v = judge_parts(judge, local_send({}), [("first", 1), ("second", 2)], b"s" * 32, "lab", "st", texts)
    assert v.parts["first"].score == 0 and v.parts["second"].score == 1.0
    note = v.parts["second"].cases[0].note
    assert "already charged in first" in note and v.parts["second"].misconceptions() == ["the bug explained"]


def test_one_bug_is_charged_once_in_the_labs():
    """lab06: Part B's free order does not cost Part D (judged up to a renaming of the blocks); lab07: the tiled
    loop's denominator (l not rescaled) costs Part B, not Part C (its causal version excused)."""
    lab06 = {**solution_answers("lab06"), "blocks_answer": solution_with("lab06", "blocks_answer", {
        "        for b in reversed(self.tables[seq_id]):": "        for b in self.tables[seq_id]:"})}
    v = judge_locally("lab06", lab06, only=["blocks_tests", "cow_tests"])
    assert v.parts["blocks_tests"].score < 4 and v.parts["cow_tests"].score == 3.0, {
        g: p.score for g, p in v.parts.items()}
    lab07 = {**solution_answers("lab07"), "tiled_answer": solution_with("lab07", "tiled_answer", {
        "            l = alpha * l + p.sum(dim=-1)": "            l = l + p.sum(dim=-1)"})}
    v = judge_locally("lab07", lab07, only=["tiled_tests", "causal_tests"])
    assert v.parts["tiled_tests"].score < 4 and v.parts["causal_tests"].score == 3.0
    assert any("not charged again" in c.note for c in v.parts["causal_tests"].cases)


def test_the_off_by_one_kernel_loses_points_whatever_the_secret():
    """The kernel whose causal loop stops one key tile short (max error 0.09 at T=20, S=37): the clock-drawn
    shapes caught it on ~12% of runs; the grid over every residue catches it on every one."""
    answers = {**solution_answers("lab07"), "flash_kernel_answer": solution_with("lab07", "flash_kernel_answer", {
        "    for start in range(0, hi, BLOCK_N):": "    for start in range(0, hi - 1, BLOCK_N):"})}
    for k in range(3):
        part = judge_locally("lab07", answers, secret=secrets.token_bytes(32),
                             only=["flash_kernel_tests"]).parts["flash_kernel_tests"]
        assert part.score < 4.0 and part.summary()["grid"][0] < part.summary()["grid"][1], part.summary()


def test_misleading_failures_now_name_the_misconception():
    """A kernel that does not mask the padded keys was told about rescaling; lab06's GQA `h % Hkv` and free order
    got raw numbers only."""
    kernel = {**solution_answers("lab07"), "flash_kernel_answer": solution_with("lab07", "flash_kernel_answer", {
        "        valid = cols[None, :] < S\n": "        valid = cols[None, :] >= 0\n"})}
    part = judge_locally("lab07", kernel, only=["flash_kernel_tests"]).parts["flash_kernel_tests"]
    named = " ".join(part.misconceptions())
    assert "does not mask the keys past S" in named and "rescale" not in named, named
    mine = solution_answers("lab06")
    gqa = {**mine, "paged_answer": solution_with("lab06", "paged_answer", {
        "        s = q[b].reshape(Hkv, G, d) @ k.transpose(-1, -2) / math.sqrt(d)    # [Hkv, G, n]\n"
        "        out[b] = (s.softmax(-1) @ v).reshape(H, d)":
        "        s = q[b].reshape(G, Hkv, d).transpose(0, 1) @ k.transpose(-1, -2) / math.sqrt(d)\n"
        "        out[b] = (s.softmax(-1) @ v).transpose(0, 1).reshape(H, d)"})}
    assert any("h % Hkv" in m for m in judge_locally("lab06", gqa, only=["paged_tests"]).parts[
        "paged_tests"].misconceptions())
    order = {**mine, "blocks_answer": solution_with("lab06", "blocks_answer", {
        "        for b in reversed(self.tables[seq_id]):": "        for b in self.tables[seq_id]:"})}
    assert any("first to last" in m for m in judge_locally("lab06", order, only=["blocks_tests"]).parts[
        "blocks_tests"].misconceptions())


def test_two_students_of_one_name_stay_two(tmp_path):
    for folder in ("Alice Smith_111_assignsubmission_file_", "Alice Smith_222_assignsubmission_file_"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "lab01.ipynb").write_text("{}")
    coll = collect(tmp_path, {1: "lab01"})
    assert sorted(s.student for s in coll.submissions) == ["Alice Smith (111)", "Alice Smith (222)"]
    assert not coll.unattributed


def test_names_are_escaped_on_the_terminal():
    evil = "bob\x1b[2J\x1b]0;pwned\x07\r\u202eFAKE"
    text = terminal_safe(evil)
    assert "\x1b" not in text and "\r" not in text and "\u202e" not in text and "\\x1b[2J" in text
    assert terminal_safe("Zoë Ångström (42)") == "Zoë Ångström (42)"


def test_student_markdown_reaches_the_page_as_text(tmp_path):
    release = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Lab 1\n\n*the instructor's text*")])
    evil = ('<script>alert(1)</script>\n\n<div style="position:fixed;top:0;left:0;width:100%;background:#fff">'
            'Score: 13/13</div>\n\n```\nx\n```\n<img src=x onerror=alert(2)>')
    executed = nbformat.v4.new_notebook(cells=[release.cells[0], nbformat.v4.new_markdown_cell(evil)])
    fb = feedback_notebook(executed, release, None)
    assert fb.cells[0].source == release.cells[0].source             # the release's text, rendered
    assert evil in fb.cells[1].source and fb.cells[1].source.count("````") == 2   # a fence longer than any inside
    from nbconvert.exporters import HTMLExporter
    page, _ = HTMLExporter(sanitize_html=True).from_notebook_node(fb)   # the feedback page's exporter setting
    assert "<script>alert" not in page and '<div style="position:fixed' not in page and "<img src=x" not in page
    assert "Score: 13/13" in html.unescape(re.sub(r"<[^>]+>", "", page)) and "the instructor's text" in page


# ---------------------------------------------------------------------------------------------------
# slow: the kernel attacks, at the levels user and bwrap

def need(level: str) -> None:
    if level == "user" and os.geteuid() != 0:
        pytest.skip("the level user needs the grader to run as root")
    if level == "bwrap" and not sandbox.find_bwrap():
        msg = "bubblewrap (bwrap) is not installed: bash tools/install_bubblewrap.sh"
        if CI:
            pytest.fail(msg + " (CI=true)", pytrace=False)
        pytest.skip(msg)


STUB = "    raise NotImplementedError()\n"
BLANK = {"add_answer": "def add(a, b):\n" + STUB, "multiply_answer": "def multiply(a, b):\n" + STUB,
         "clamp_answer": "def clamp(x, lo, hi):\n" + STUB}

# each: a blank lab (stub answers) plus one of the review's kernel tricks, placed in the first answer cell
TRICKS = {
    "displayhook": "import sys\nsys.displayhook('looks fine')\n",
    "session_send": (
        "_k = get_ipython().kernel\n_send = _k.session.send\n"
        "def _quiet(stream, msg_or_type, *a, **kw):\n"
        "    kind = msg_or_type if isinstance(msg_or_type, str) else msg_or_type.get('msg_type', "
        "msg_or_type.get('header', {}).get('msg_type'))\n"
        "    if kind == 'error':\n        return None\n    return _send(stream, msg_or_type, *a, **kw)\n"
        "_k.session.send = _quiet\n"),
    "always_equal": (
        "import inspect\nclass _Yes:\n    def __eq__(self, other):\n        return True\n"
        "    def __array__(self, *a, **k):\n        import numpy as np\n"
        "        for f in inspect.stack():\n            if 'expected' in f.frame.f_locals:\n"
        "                return np.asarray(f.frame.f_locals['expected'])\n        return np.zeros(1)\n"
        "def add(a, b):\n    return _Yes()\ndef multiply(a, b):\n    return _Yes()\n"
        "def clamp(x, lo, hi):\n    return _Yes()\n"),
    "first_line_only": (
        "_k = get_ipython().kernel\n_run = _k.do_execute\n"
        "def _first(code, *a, **kw):\n    return _run(code.split('\\n')[0], *a, **kw)\n_k.do_execute = _first\n"),
    "rebind_close": ("import course_lib.checks as _c\n_c._close = lambda *a, **k: True\n"
                     "_c.check_close = _c.check_equal = lambda *a, **k: None\n"),
    "fake_reply": (   # answers the driver's requests itself, with 'ok' for every op: it cannot know the values
        "import course_grading.driver as _d, json\nfrom IPython.display import publish_display_data\n"
        "def _serve(text):\n    req = json.loads(text)\n"
        "    publish_display_data({_d.wire.MIME: {'id': req['id'], 'results': [{'ok': 0} for _ in req['ops']]}})\n"
        "_d.serve = _serve\n"),
}

# reads everything it can reach for the judge's canary and the class secret; `add` is right only if it found one
DUMPER = r'''
import gc, glob, os, sys, zlib, base64
NEEDLES = [n[::-1] for n in @NEEDLES@]      # reversed: not literally in this notebook
FOUND = []
def _look(where, text):
    if isinstance(text, bytes):
        text = text.decode("latin-1", "replace")
    if isinstance(text, str) and any(n in text for n in NEEDLES):
        FOUND.append(where)
for o in gc.get_objects():
    if isinstance(o, (str, bytes)):
        _look("gc", o)
    elif isinstance(o, dict):
        for v in list(o.values())[:50]:
            if isinstance(v, (str, bytes)):
                _look("gc dict", v)
for name, m in list(sys.modules.items()):
    f = getattr(m, "__file__", None)
    if f and os.path.isfile(f):
        try:
            _look(f, open(f, "rb").read())
        except OSError:
            pass
for p in glob.glob("/proc/*/environ") + glob.glob("/proc/*/cmdline"):
    try:
        _look(p, open(p, "rb").read())
    except OSError:
        pass
for top in ("/tmp", "/var/tmp", "/dev/shm", os.getcwd(), os.path.expanduser("~"), "/opt", "/work", "/root", "/home"):
    for d, dirs, files in os.walk(top):
        for f in files:
            try:
                _look(os.path.join(d, f), open(os.path.join(d, f), "rb").read(2_000_000))
            except OSError:
                pass
# what it found, every way the review printed it: plain, zlib+base64, a ~ after every character
text = repr(FOUND)
print(text, base64.b64encode(zlib.compress(text.encode())).decode(), "~".join(text))
def add(a, b):
    return a + b if FOUND else 0
'''

# the grader's session keyring holds a key; the kernel tries to read it, and leaves a key of its own
KEYS = r'''
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = {"x86_64": (248, 250), "aarch64": (217, 219)}[os.uname().machine]
FOUND = []
try:
    FOUND += [ln for ln in open("/proc/keys").read().splitlines() if "@KEYNAME@" in ln]
except OSError as e:
    print("no /proc/keys", e)
buf = ctypes.create_string_buffer(256)
for ring in (-3, -4, -5):          # session, user, user-session keyrings
    kid = libc.syscall(ctypes.c_long(NR[1]), ctypes.c_long(10), ctypes.c_long(ring), b"user", b"@KEYNAME@",
                       ctypes.c_long(0))                    # KEYCTL_SEARCH
    print("search", ring, kid, os.strerror(ctypes.get_errno()))
    if kid > 0:
        n = libc.syscall(ctypes.c_long(NR[1]), ctypes.c_long(11), ctypes.c_long(kid), buf, ctypes.c_long(256))
        if n > 0:
            FOUND.append(buf.raw[:n])
left = libc.syscall(ctypes.c_long(NR[0]), b"user", b"@NOTE@", b"hello next student", ctypes.c_size_t(18),
                    ctypes.c_long(-4))                      # add_key to the user keyring
print("add_key", left, os.strerror(ctypes.get_errno()))
def add(a, b):
    return a + b if FOUND or left > 0 else 0
'''


def _keyring_key(name: str, payload: bytes) -> int | None:
    """Join a new session keyring in this process (as a login's pam_keyinit gives one) and put a key in it;
    None where the kernel has no keys."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    nr = {"x86_64": (248, 250), "aarch64": (217, 219)}.get(os.uname().machine)
    if nr is None:
        return None
    if libc.syscall(ctypes.c_long(nr[1]), ctypes.c_long(1), ctypes.c_void_p(None)) < 0:   # JOIN_SESSION_KEYRING
        return None
    kid = libc.syscall(ctypes.c_long(nr[0]), b"user", name.encode(), payload, ctypes.c_size_t(len(payload)),
                       ctypes.c_long(-3))
    return kid if kid > 0 else None


def _write(path: Path, nb) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(notebook_text(nb), encoding="utf-8")
    return path


@pytest.fixture(scope="module", params=["user", "bwrap"])
def attacked(request):
    level = request.param
    need(level)
    token = secrets.token_hex(6)
    canary = f"JUDGECANARY{token}"
    base = Path(tempfile.mkdtemp(prefix="cgj-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(base, ignore_errors=True))
    sols, labs, judges, sub = base / "solutions", base / "labs", base / "judges", base / "submissions"
    sols.mkdir()
    judges.mkdir()
    shutil.copyfile(DATA / "solutions" / "lab99.ipynb", sols / "lab99.ipynb")
    shutil.copyfile(ROOT / "solutions" / "lab01.ipynb", sols / "lab01.ipynb")
    judge99 = (DATA / "judges" / "lab99.py").read_text().replace(
        "judge = Judge()", f"judge = Judge()\nCANARY = {canary!r}   # never sent anywhere")
    (judges / "lab99.py").write_text(judge99)
    shutil.copyfile(ROOT / "judges" / "lab01.py", judges / "lab01.py")
    assert all(r.status == "written" for r in build_labs(sols, labs))
    l99 = read_notebook(labs / "lab99.ipynb")
    a99 = answer_sources(read_notebook(sols / "lab99.ipynb"))
    for name, trick in TRICKS.items():
        answers = dict(BLANK)
        answers["add_answer"] = trick + ("" if "def add" in trick else BLANK["add_answer"])
        if "def multiply" in trick:
            answers.pop("multiply_answer"), answers.pop("clamp_answer")
        _write(sub / f"blank-{name}" / "lab99.ipynb", fill_answers(l99, answers))
    key_name, note = f"cgj-key-{token}", f"cgj-note-{token}"
    secret_file = base / ".grading" / "class-secret"
    secret, _ = load_secret(secret_file)
    needles = [canary[::-1], secret.decode()[::-1], "cgj-payload"[::-1] + token[::-1]]
    _write(sub / "dumper" / "lab99.ipynb", fill_answers(l99, {**a99, "add_answer": DUMPER.replace(
        "@NEEDLES@", repr(needles))}))
    _write(sub / "keys" / "lab99.ipynb", fill_answers(l99, {**a99, "add_answer": KEYS.replace(
        "@KEYNAME@", key_name).replace("@NOTE@", note)}))
    _write(sub / "keys-next" / "lab99.ipynb", fill_answers(l99, {**a99, "add_answer": KEYS.replace(
        "@KEYNAME@", note).replace("@NOTE@", note + "-2")}))
    _write(sub / "honest" / "lab99.ipynb", fill_answers(l99, a99))
    _write(sub / "clock" / "lab99.ipynb", fill_answers(l99, {**a99, "add_answer": "import time\n"
                                                             "time.time_ns = lambda: 12345\ntime.time = lambda: 1.0\n"
                                                             + a99["add_answer"]}))
    # outputs that once broke the grader: a solution line split by a backslash-newline, base64-looking text,
    # a 200 MB line (the review's 600 MB took the grader to 3.2 GB)
    _write(sub / "noisy" / "lab99.ipynb", fill_answers(l99, {**a99, "add_answer": a99["add_answer"] + (
        "\nimport base64, os\nprint('return a +\\\\\\n b' * 1000)\n"
        "print(base64.b64encode(os.urandom(6_000_000)).decode())\nprint('x' * 200_000_000)\n")}))
    # the markdown overlay and the terminal escapes
    shown = fill_answers(l99, a99)
    shown.cells.insert(3, nbformat.v4.new_markdown_cell('<script>alert(1)</script><div style="position:fixed;top:0">'
                                                        'Score: 13/13</div>'))
    _write(sub / "overlay" / "lab99.ipynb", shown)
    _write(sub / "evil\x1b[2Jname\x07" / "lab99.ipynb", fill_answers(l99, a99))
    # lab01: the reference through importlib (no import line for the static check to see)
    l01 = read_notebook(labs / "lab01.ipynb")
    a01 = answer_sources(read_notebook(sols / "lab01.ipynb"))
    _write(sub / "importlib" / "lab01.ipynb", fill_answers(l01, {**a01, "matmul_cost": (
        "import importlib\nmatmul_cost = importlib.import_module('course' + '_lib.perf.ops').matmul_cost\n")}))
    kid = _keyring_key(key_name, b"cgj-payload" + token.encode())
    lines = []
    t0 = time.time()
    report = grade(sub, labs_release=labs, solutions=sols, out=base / "out", timeout=60, workdir=base / "work",
                   isolation=level, echo=lines.append, judges=judges, secret_file=secret_file, memory_gb=2.0)
    wall = time.time() - t0
    keys_after = Path("/proc/keys").read_text() if Path("/proc/keys").exists() else ""
    return dict(level=level, report=report, base=base, canary=canary, secret=secret, kid=kid, note=note,
                keys_after=keys_after, wall=wall, lines=lines, token=token)


def res(attacked, student):
    return attacked["report"].by_student(student)


def part_scores(r) -> dict:
    return {c["grade_id"]: c["score"] for c in r.cells}


@slow
@pytest.mark.parametrize("trick", sorted(TRICKS))
def test_a_blank_lab_with_a_kernel_trick_scores_zero(attacked, trick):
    r = res(attacked, f"blank-{trick}")
    assert r.score == 0.0 and r.status != "error", (trick, r.cells, r.messages)


@slow
def test_the_reference_through_importlib_earns_nothing(attacked):
    r = res(attacked, "importlib")
    assert part_scores(r)["matmul_cost_tests"] == 0.0 and r.score == 11.0, (r.cells, r.flags)
    assert "withheld while this lab is graded" in next(c["error"] for c in r.cells
                                                        if c["grade_id"] == "matmul_cost_tests")


@slow
def test_nothing_of_the_judge_or_the_secret_is_reachable_or_shown(attacked):
    r = res(attacked, "dumper")
    assert part_scores(r)["add_tests"] == 0.0, (r.cells, r.messages)
    out = attacked["base"] / "out"
    for p in out.rglob("*"):
        if p.is_file():
            text = p.read_text(encoding="utf-8", errors="replace")
            assert attacked["canary"] not in text and attacked["secret"].decode() not in text, p


@slow
def test_outputs_that_broke_the_grader_end_in_grades_csv(attacked):
    r = res(attacked, "noisy")
    assert r.score == 5.0 and "output_limit" in r.flags and r.status == "review", (r.flags, r.messages)
    assert (attacked["base"] / "out" / "grades.csv").exists()
    page = Path(r.feedback).read_text(encoding="utf-8")
    assert len(page) < 3_000_000


@slow
def test_the_graders_keyring_is_out_of_reach_and_nothing_is_left(attacked):
    if attacked["kid"] is None:
        pytest.skip("no keyrings on this kernel")
    for who in ("keys", "keys-next"):
        r = res(attacked, who)
        assert part_scores(r)["add_tests"] == 0.0, (who, r.cells, r.messages)
    assert attacked["note"] not in attacked["keys_after"], "a kernel's key outlived it"


@slow
def test_names_and_markdown_are_shown_not_obeyed(attacked):
    r = res(attacked, "overlay")
    page = Path(r.feedback).read_text(encoding="utf-8")
    assert "<script>alert(1)" not in page and '<div style="position:fixed' not in page, page[-3000:]
    assert "Score: 13/13" in html.unescape(re.sub(r"<[^>]+>", "", page))       # shown, as text
    evil = next(x for x in attacked["report"].results if x.student.startswith("evil"))
    assert evil.score == 5.0
    text = summary(attacked["report"])
    assert "\x1b" not in text and "\x07" not in text and "\\x1b[2J" in text


@slow
def test_the_kernels_clock_changes_nothing(attacked):
    honest, clock = res(attacked, "honest"), res(attacked, "clock")
    assert honest.score == clock.score == 5.0


@slow
def test_the_batch_time(attacked):
    assert attacked["wall"] < 400, attacked["wall"]


@slow
def test_a_regrade_gives_the_same_grades(tmp_path):
    """Three submissions graded twice with the same class secret: the same scores, the same cases, the same
    files; with another secret, other cases."""
    sols, judges = tmp_path / "solutions", tmp_path / "judges"
    sols.mkdir()
    judges.mkdir()
    shutil.copyfile(DATA / "solutions" / "lab99.ipynb", sols / "lab99.ipynb")
    shutil.copyfile(DATA / "judges" / "lab99.py", judges / "lab99.py")
    build_labs(sols, tmp_path / "labs")
    lab = read_notebook(tmp_path / "labs" / "lab99.ipynb")
    a = answer_sources(read_notebook(sols / "lab99.ipynb"))
    for who, nb in (("ann", fill_answers(lab, a)), ("ben", fill_answers(lab, {**a, "add_answer": "def add(a, b):\n"
                                                                              "    return a + b if a > 0 else 0"})),
                    ("cy", lab)):
        _write(tmp_path / "subs" / who / "lab99.ipynb", nb)
    runs = []
    for k, secret in enumerate(("one", "one", "two")):
        (tmp_path / f"secret-{secret}").write_text(secret * 32)
        rep = grade(tmp_path / "subs", tmp_path / "labs", sols, tmp_path / f"out{k}", judges=judges,
                    secret_file=tmp_path / f"secret-{secret}", feedback=False,
                    isolation=None if (os.geteuid() == 0 or sandbox.find_bwrap()) else "process")
        runs.append({r.student: (r.score, [x["case"] for c in r.cells for x in c.get("cases", [])])
                     for r in rep.results})
    assert runs[0] == runs[1]
    assert runs[0]["ann"][0] == 5.0 and runs[0]["cy"][0] == 0.0 and 3.0 <= runs[0]["ben"][0] < 5.0
    assert runs[2]["ann"][1] != runs[0]["ann"][1]                # another class secret: other drawn cases


@slow
def test_one_students_labs_graded_side_by_side(tmp_path):
    """One student hands in two labs; with --jobs 2 both are graded at once, each in a kernel (folders, mounts,
    cgroups) of its own: neither is killed or removed by the other (they once shared one keyed by the student)."""
    sols, judges = tmp_path / "solutions", tmp_path / "judges"
    sols.mkdir()
    judges.mkdir()
    for lab in ("lab98", "lab99"):
        shutil.copyfile(DATA / "solutions" / "lab99.ipynb", sols / f"{lab}.ipynb")
        shutil.copyfile(DATA / "judges" / "lab99.py", judges / f"{lab}.py")
    build_labs(sols, tmp_path / "labs")
    for lab in ("lab98", "lab99"):
        release = read_notebook(tmp_path / "labs" / f"{lab}.ipynb")
        a = answer_sources(read_notebook(sols / f"{lab}.ipynb"))
        _write(tmp_path / "subs" / "ann" / f"{lab}.ipynb", fill_answers(release, {   # long enough to overlap
            **a, "add_answer": a["add_answer"] + "\nimport time\ntime.sleep(4)"}))
    rep = grade(tmp_path / "subs", tmp_path / "labs", sols, tmp_path / "out", judges=judges, jobs=2,
                secret_file=tmp_path / "s", feedback=False,
                isolation=None if (os.geteuid() == 0 or sandbox.find_bwrap()) else "process")
    got = {r.assignment: (r.score, r.status, dict(r.flags), r.messages) for r in rep.results}
    assert {lab: g[0] for lab, g in got.items()} == {"lab98": 5.0, "lab99": 5.0}, got


@slow
def test_the_graders_memory_is_bounded(tmp_path):
    """A 300 MB output line, a flood of 60 outputs of 10 MB and a 70 MB notebook, graded by `course grade` in a
    process of its own: the grader's peak memory stays far below what they would take whole; the batch ends
    with grades.csv."""
    sols, judges = tmp_path / "solutions", tmp_path / "judges"
    sols.mkdir()
    judges.mkdir()
    shutil.copyfile(DATA / "solutions" / "lab99.ipynb", sols / "lab99.ipynb")
    shutil.copyfile(DATA / "judges" / "lab99.py", judges / "lab99.py")
    build_labs(sols, tmp_path / "labs")
    lab = read_notebook(tmp_path / "labs" / "lab99.ipynb")
    a = answer_sources(read_notebook(sols / "lab99.ipynb"))
    _write(tmp_path / "subs" / "big-line" / "lab99.ipynb", fill_answers(lab, {
        **a, "add_answer": a["add_answer"] + "\nprint('y' * 300_000_000)"}))
    _write(tmp_path / "subs" / "flood" / "lab99.ipynb", fill_answers(lab, {   # 60 messages of 10 MB, flushed
        **a, "add_answer": a["add_answer"] + "\nimport sys\nfor _ in range(60):\n    print('f' * 10_000_000, "
                                             "flush=True)"}))
    huge = fill_answers(lab, a)
    huge.cells[0].setdefault("outputs", [])
    big = nbformat.v4.new_code_cell("pass")
    big.outputs = [nbformat.v4.new_output("stream", name="stdout", text="z" * 70_000_000)]
    huge.cells.insert(1, big)
    _write(tmp_path / "subs" / "big-file" / "lab99.ipynb", huge)
    script = (f"import sys\nfrom course_grading.pipeline import grade\n"
              f"r = grade({str(tmp_path / 'subs')!r}, {str(tmp_path / 'labs')!r}, {str(sols)!r}, "
              f"{str(tmp_path / 'out')!r}, judges={str(judges)!r}, secret_file={str(tmp_path / 's')!r}, "
              f"isolation={None if (os.geteuid() == 0 or sandbox.find_bwrap()) else 'process'!r}, memory_gb=3.0)\n"
              "print('SCORES', sorted((x.student, x.score, sorted(x.flags)) for x in r.results))\n"
              # VmHWM: this process's own peak (ru_maxrss would carry the forking pytest worker's size over exec)
              "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0]\n"
              "print('PEAK_MB', int(hwm.split()[1]) / 1024)\n")
    t0 = time.time()
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    peak = float(re.search(r"PEAK_MB ([\d.]+)", out).group(1))
    assert (tmp_path / "out" / "grades.csv").exists(), out
    assert peak < 700, (peak, out)     # the 300 MB line, the 600 MB flood and the 70 MB notebook never held whole
    assert "('big-line', 5.0" in out and "('flood', 5.0" in out and "output_limit" in out, out
    assert time.time() - t0 < 300
