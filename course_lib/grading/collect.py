"""Collect submissions: find each notebook's student and assignment from how students download files.

Accepted layouts (both may be mixed in one SUBMISSIONS folder):

1. One folder per student:  SUBMISSIONS/<student>/<any name with labNN>.ipynb
   The student id is the folder's name (an LMS folder such as ``Alice Smith_12345_assignsubmission_file_``
   gives ``Alice Smith``). Notebooks may sit deeper inside the student's folder.
2. Flat:  SUBMISSIONS/<file>.ipynb, with the student id in the file name:
     <student>_labNN.ipynb   <student>-labNN.ipynb   <student> - labNN.ipynb   <student> labNN.ipynb
     labNN_<student>.ipynb   labNN-<student>.ipynb   labNN - <student>.ipynb
     LMS exports:  <name>_<number>_<number>_<original file name>.ipynb       (Canvas)
                   <name>_LATE_<number>_<number>_<original file name>.ipynb  (Canvas, late; flagged)
                   <name>_<number>_assignsubmission_file_<original>.ipynb     (Moodle)
   where the student id is <name>.

The assignment is the ``labNN`` token anywhere in the name, case-insensitive, with an optional
separator and leading zeros (``lab01``, ``Lab1``, ``lab_01``, ``LAB 01`` -> lab01). Copy decorations
added by browsers, Colab, Windows and macOS are ignored:
``Copy of lab01.ipynb``, ``lab01 (1).ipynb``, ``lab01(2).ipynb``, ``lab01 - Copy.ipynb``,
``lab01 - Copy (2).ipynb``, ``lab01 copy.ipynb``, ``lab01 copy 2.ipynb``, ``lab01-1.ipynb`` (Canvas
resubmission), ``lab01.ipynb.ipynb``.

With ``--assignment labNN`` every notebook without a lab token is taken as that assignment (a flat
file's whole cleaned name is then the student id); notebooks whose token names another lab are
skipped and listed. Without it, a notebook in a student folder with no lab token is identified by its
content (the release's grade_ids and locked cells) when exactly one lab matches.

Nothing is dropped silently: notebooks that cannot be attributed are returned in `Collection.unattributed`,
other files in `Collection.ignored`. When a student has several notebooks for one lab, the most
recently modified one is graded, the others are listed, and the submission is flagged for review.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

LAB_TOKEN_RE = re.compile(r"(?<![A-Za-z0-9])lab[ _-]?(\d{1,3})(?![0-9])", re.IGNORECASE)
# Copy decorations, applied repeatedly.
_COPY_PREFIX_RE = re.compile(r"^\s*copy\s+of\s+", re.IGNORECASE)
_COPY_SUFFIX_RES = [
    re.compile(r"\s*\(\d+\)\s*$"),                          # "x (1)", "x(2)"
    re.compile(r"\s+-\s+copy(\s*\(\d+\))?\s*$", re.IGNORECASE),  # "x - Copy", "x - Copy (2)"
    re.compile(r"\s+copy(\s+\d+)?\s*$", re.IGNORECASE),      # macOS "x copy", "x copy 2"
]
_INNER_COPY_RE = re.compile(r"(^|[\s_\-.])copy\s+of\s+", re.IGNORECASE)
_LMS_RES = [
    re.compile(r"^(?P<name>.+?)_(?P<late>LATE_)?\d+_\d+_?$"),                 # Canvas
    re.compile(r"^(?P<name>.+?)_\d+_assignsubmission_[a-z]+_?$", re.IGNORECASE),  # Moodle
]
_SEPARATORS = " _-.\t"
IGNORED_DIRS = {".ipynb_checkpoints", "__MACOSX", "__pycache__"}


@dataclass
class Submission:
    path: Path
    student: str
    assignment: str
    layout: str  # "folder" or "flat"
    flags: list[str] = field(default_factory=list)
    superseded: list[Path] = field(default_factory=list)  # other files of the same student and lab


@dataclass
class Collection:
    submissions: list[Submission]
    unattributed: list[tuple[Path, str]]   # (file, why)
    ignored: list[tuple[Path, str]]        # (file, why): not notebooks, other assignments


def strip_copy_decorations(stem: str) -> str:
    """'Copy of lab01 (1)' -> 'lab01'; 'lab01 - Copy (2)' -> 'lab01'; 'lab01.ipynb' -> 'lab01'."""
    s = stem
    for _ in range(10):
        before = s
        while s.lower().endswith(".ipynb"):
            s = s[: -len(".ipynb")]
        s = _COPY_PREFIX_RE.sub("", s)
        s = _INNER_COPY_RE.sub(lambda m: m.group(1), s)
        for rx in _COPY_SUFFIX_RES:
            s = rx.sub("", s)
        s = s.strip()
        if s == before:
            break
    return s


def lab_tokens(name: str) -> list[int]:
    return [int(m.group(1)) for m in LAB_TOKEN_RE.finditer(name)]


def _clean_student(s: str) -> str:
    s = s.strip(_SEPARATORS)
    for rx in _LMS_RES:
        m = rx.match(s)
        if m:
            return m.group("name").strip(_SEPARATORS)
    return s


def _is_late(s: str) -> bool:
    return bool(re.search(r"_LATE_\d+_\d+", s))


def parse_name(filename: str, labs: dict[int, str], assignment: str | None = None,
               flat: bool = True) -> tuple[str | None, str | None, str]:
    """(student, assignment, why) from a file name.

    `labs` maps lab numbers to assignment names ({1: "lab01"}). For folder-layout files (flat=False)
    the student is not looked for in the name. `why` explains a None.
    """
    stem = filename[:-len(".ipynb")] if filename.lower().endswith(".ipynb") else filename
    stem = strip_copy_decorations(stem)
    tokens = list(LAB_TOKEN_RE.finditer(stem))
    numbers = {int(m.group(1)) for m in tokens}
    if len(numbers) > 1:
        return None, None, f"names several labs ({', '.join('lab%02d' % n for n in sorted(numbers))})"
    if numbers:
        n = numbers.pop()
        if n not in labs:
            return None, None, f"lab{n:02d} is not a released lab ({', '.join(sorted(labs.values())) or 'none'})"
        lab = labs[n]
        m = tokens[0]
        before, after = stem[: m.start()], stem[m.end():]
        # Canvas resubmission suffix "lab01-1" and leftover decorations right after the token
        after = re.sub(r"^-\d+(?=$|[\s_.])", "", after)
        after = strip_copy_decorations(after)
    else:
        if assignment is None:
            return None, None, "no labNN in the name"
        lab, before, after = assignment, stem, ""
    if not flat:
        return None, lab, ""
    student = _clean_student(before)
    if not student:
        a = after.strip(_SEPARATORS)
        if a and not re.fullmatch(r"[\d\s_\-.]+", a):
            student = _clean_student(a)
    if not student:
        return None, lab, "no student id in the name (expected e.g. <student>_" + lab + ".ipynb)"
    return student, lab, ""


def identify_by_content(path: Path, release_keys: dict[str, tuple[set, set]]) -> str | None:
    """The one assignment whose release this notebook resembles (grade_ids or locked cell sources)."""
    try:
        nb = json.loads(path.read_text(encoding="utf-8", errors="replace"))
        cells = nb.get("cells", [])
    except Exception:
        return None
    ids, srcs = set(), set()
    for c in cells:
        if not isinstance(c, dict):
            continue
        g = (c.get("metadata") or {}).get("nbgrader", {})
        if isinstance(g, dict) and g.get("grade_id"):
            ids.add(g["grade_id"])
        src = c.get("source", "")
        srcs.add(("".join(src) if isinstance(src, list) else str(src)).strip())
    scores = {}
    for name, (rel_ids, rel_srcs) in release_keys.items():
        s = max(len(ids & rel_ids) / max(len(rel_ids), 1), len(srcs & rel_srcs) / max(len(rel_srcs), 1))
        if s >= 0.5:
            scores[name] = s
    if len(scores) == 1:
        return next(iter(scores))
    if scores:
        best = sorted(scores.values())
        if best[-1] > best[-2] + 0.25:
            return max(scores, key=scores.get)
    return None


def _student_folder_name(name: str) -> str:
    return _clean_student(name) or name


def collect(submissions: str | Path, labs: dict[int, str], assignment: str | None = None,
            release_keys: dict[str, tuple[set, set]] | None = None) -> Collection:
    """Walk `submissions` and attribute every notebook (see the module docstring for the forms)."""
    root = Path(submissions)
    if not root.exists():
        raise FileNotFoundError(f"submissions folder {root} does not exist")
    found: list[Submission] = []
    unattributed: list[tuple[Path, str]] = []
    ignored: list[tuple[Path, str]] = []

    def consider(path: Path, student_folder: str | None):
        if path.suffix.lower() != ".ipynb":
            ignored.append((path, "not a notebook (.ipynb)"))
            return
        flat = student_folder is None
        student, lab, why = parse_name(path.name, labs, assignment, flat=flat)
        if lab is None and not flat and release_keys and "no labNN" in why:
            lab = identify_by_content(path, release_keys)
            why = "" if lab else "no labNN in the name and its content matches no released lab"
            flags = ["assignment_from_content"] if lab else []
        else:
            flags = []
        if not flat:
            student = student_folder
        if lab is not None and assignment is not None and lab != assignment:
            ignored.append((path, f"{lab}, not {assignment}"))
            return
        if lab is None or not student:
            unattributed.append((path, why or "cannot tell the student"))
            return
        if flat and _is_late(path.name):
            flags.append("late")
        found.append(Submission(path, student, lab, "flat" if flat else "folder", flags))

    def walk(folder: Path):
        for p in sorted(folder.rglob("*")):
            rel_parts = p.relative_to(folder).parts
            if any(part in IGNORED_DIRS or part.startswith(".") for part in rel_parts):
                continue
            if p.is_file():
                yield p

    if root.is_file():
        consider(root, None)
    else:
        for entry in sorted(root.iterdir()):
            if entry.name in IGNORED_DIRS or entry.name.startswith("."):
                continue
            if entry.is_dir():
                student = _student_folder_name(entry.name)
                for p in walk(entry):
                    consider(p, student)
            elif entry.is_file():
                consider(entry, None)

    # one submission per (student, assignment): the newest file wins, the others are listed
    by_key: dict[tuple[str, str], list[Submission]] = {}
    for s in found:
        by_key.setdefault((s.student, s.assignment), []).append(s)
    chosen = []
    for key in sorted(by_key):
        group = sorted(by_key[key], key=lambda s: (s.path.stat().st_mtime, str(s.path)))
        best = group[-1]
        if len(group) > 1:
            best.superseded = [s.path for s in group[:-1]]
            best.flags.append("several_files")
        chosen.append(best)
    return Collection(chosen, unattributed, ignored)
