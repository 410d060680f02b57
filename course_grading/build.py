"""`course build-labs`: generate the students' labs (labs/labNN.ipynb) from the instructor's
nbgrader source labs (solutions/labNN.ipynb) with nbgrader's generate_assignment.

Guarantees:
  * deterministic: the same source gives byte-identical labs (stable cell ids, sorted JSON keys,
    no outputs, no execution counts; nbgrader's checksums are stable md5s of source + metadata);
  * no solution text, hidden-test text or mark scheme reaches labs/ (checked on every build, see
    `find_leaks`);
  * duplicated grade_ids in a source lab stop the build with a message naming them;
  * the Colab badge of the lab points at the lab (labs/labNN.ipynb), not at its solution;
  * the ``python3`` kernelspec is kept.

Notebook helpers used by the grading side and the tests live here too: `grade_id`, `answer_sources`,
`fill_answers`, `lab_names`.
"""
from __future__ import annotations

import copy
import hashlib
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from .nbgrader_env import KERNELSPEC, CourseDir, find_config, result_log

LAB_RE = re.compile(r"^lab\d+$")
# nbgrader's own delimiters (it matches them anywhere in a line).
SECRET_MARKERS = (("BEGIN SOLUTION", "END SOLUTION"), ("BEGIN HIDDEN TESTS", "END HIDDEN TESTS"),
                  ("BEGIN MARK SCHEME", "END MARK SCHEME"))
# What nbgrader writes in place of a solution (ClearSolutions' defaults).
STUB_LINES = {"# YOUR CODE HERE", "raise NotImplementedError()", "YOUR ANSWER HERE"}
COLAB_URL_RE = re.compile(r"(https://colab\.research\.google\.com/github/[^\s)\"']+?/blob/[^/\s)\"']+/)"
                          r"([^\s)\"']+?\.ipynb)")


class LabBuildError(RuntimeError):
    """A source lab cannot be turned into a student lab (the message says which and why)."""


# ---------------------------------------------------------------------------------------------------
# notebook helpers

def nbgrader_meta(cell) -> dict | None:
    m = cell.get("metadata", {}).get("nbgrader")
    return m if isinstance(m, dict) and m.get("grade_id") else None


def grade_id(cell) -> str | None:
    m = nbgrader_meta(cell)
    return m["grade_id"] if m else None


def is_answer(cell) -> bool:
    m = nbgrader_meta(cell)
    return bool(m and m.get("solution"))


def is_test(cell) -> bool:
    m = nbgrader_meta(cell)
    return bool(m and m.get("grade") and not m.get("solution"))


def is_locked(cell) -> bool:
    """A cell whose source the student must not change (test cells and read-only cells)."""
    m = nbgrader_meta(cell)
    return bool(m and (m.get("locked") or (m.get("grade") and not m.get("solution"))))


ANSWER_KEY_TAG = "answer-key"


def is_answer_key(cell) -> bool:
    """A worked answer for the instructor (tag ``answer-key``): dropped from the student's lab, secret."""
    return ANSWER_KEY_TAG in (cell.get("metadata", {}).get("tags") or [])


def lab_names(folder: str | Path) -> list[str]:
    """Assignment names (labNN) of the notebooks in `folder`, sorted."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.glob("lab*.ipynb") if LAB_RE.match(p.stem))


def duplicate_grade_ids(nb) -> dict[str, list[int]]:
    """grade_id -> cell indices, for every grade_id used by more than one cell."""
    where: dict[str, list[int]] = {}
    for i, c in enumerate(nb.cells):
        g = grade_id(c)
        if g is not None:
            where.setdefault(g, []).append(i)
    return {g: idx for g, idx in where.items() if len(idx) > 1}


def _split_regions(source: str, begin: str, end: str) -> tuple[list[str], list[str], bool]:
    """(lines outside, lines inside) the begin/end regions; marker lines count as inside."""
    outside, inside, depth = [], [], False
    found = False
    for line in source.split("\n"):
        if begin in line:
            depth, found = True, True
            inside.append(line)
        elif end in line and depth:
            depth = False
            inside.append(line)
        elif depth:
            inside.append(line)
        else:
            outside.append(line)
    return outside, inside, found


def secret_and_public_lines(source_nb) -> tuple[set[str], set[str]]:
    """Lines (stripped) of a source lab that must never reach students, and the lines they see."""
    secret, public = set(), set()
    for c in source_nb.cells:
        text = c.source
        if is_answer_key(c):
            secret |= {ln.strip() for ln in text.split("\n")}
            continue
        lines_out = text.split("\n")
        lines_in: list[str] = []
        found_solution = False
        for begin, end in SECRET_MARKERS:
            joined = "\n".join(lines_out)
            lines_out, inside, found = _split_regions(joined, begin, end)
            lines_in += inside
            found_solution |= found and begin == "BEGIN SOLUTION"
        if is_answer(c) and not found_solution:  # nbgrader replaces the whole cell
            lines_in += lines_out
            lines_out = []
        secret |= {ln.strip() for ln in lines_in}
        public |= {ln.strip() for ln in lines_out}
    secret.discard("")
    return secret, public


def find_leaks(source_nb, lab_nb, stub_lines=STUB_LINES) -> list[str]:
    """Lines of `lab_nb` that exist in `source_nb` only inside a solution, hidden-test or mark-scheme
    region (or are such a region's marker). Empty when the lab gives nothing away. `stub_lines` are
    the lines nbgrader writes in place of solutions (they may legitimately appear in both)."""
    secret, public = secret_and_public_lines(source_nb)
    only_secret = secret - public - set(stub_lines)
    leaks = []
    for c in lab_nb.cells:
        for ln in c.source.split("\n"):
            s = ln.strip()
            if s in only_secret or any(m in ln for pair in SECRET_MARKERS for m in pair):
                leaks.append(s)
        for out in c.get("outputs", []):  # labs have none, but never ship an output with a secret
            text = str(out.get("text", "")) + str(out.get("data", {}).get("text/plain", ""))
            for ln in text.split("\n"):
                if ln.strip() in only_secret:
                    leaks.append(ln.strip())
    return sorted(set(leaks))


def answer_sources(source_nb) -> dict[str, str]:
    """grade_id -> the instructor's answer as a student would type it (solution delimiters removed),
    for every answer cell of a source lab."""
    out = {}
    for c in source_nb.cells:
        if is_answer(c):
            lines = [ln for ln in c.source.split("\n")
                     if "BEGIN SOLUTION" not in ln and "END SOLUTION" not in ln]
            out[grade_id(c)] = "\n".join(lines)
    return out


def fill_answers(lab_nb, answers: dict[str, str]):
    """A copy of a student lab with the answer cells named in `answers` replaced (a solved or a
    planted-wrong submission). Unknown grade_ids raise KeyError."""
    nb = copy.deepcopy(lab_nb)
    ids = {grade_id(c): c for c in nb.cells if is_answer(c)}
    unknown = sorted(set(answers) - set(ids))
    if unknown:
        raise KeyError(f"no answer cell with grade_id {', '.join(map(repr, unknown))} "
                       f"(answer cells: {', '.join(sorted(ids))})")
    for g, src in answers.items():
        ids[g].source = src
    return nb


def read_notebook(path: str | Path):
    return nbformat.read(str(path), as_version=4)


def notebook_text(nb) -> str:
    """The exact bytes (as text) the course writes for a notebook."""
    s = nbformat.writes(nb, version=4)
    return s if s.endswith("\n") else s + "\n"


# ---------------------------------------------------------------------------------------------------
# normalizing

def _stable_ids(nb) -> None:
    seen = set()
    for i, c in enumerate(nb.cells):
        cid = c.get("id")
        if not cid or cid in seen:
            base = hashlib.sha1(f"{i}:{c.cell_type}:{c.source}".encode()).hexdigest()[:8]
            cid = f"cell-{base}"
            while cid in seen:
                cid += "x"
        c["id"] = cid
        seen.add(cid)


def normalize_lab(nb, lab_relpath: str | None = None):
    """The canonical form of a student lab: nbformat 4.5, python3 kernelspec, stable ids, no outputs,
    the Colab badge pointing at `lab_relpath`."""
    nb.nbformat, nb.nbformat_minor = 4, 5
    meta = dict(nb.metadata)
    meta["kernelspec"] = dict(KERNELSPEC)
    nb.metadata = nbformat.from_dict(meta)
    _stable_ids(nb)
    for c in nb.cells:
        if c.cell_type == "code":
            c.outputs = []
            c.execution_count = None
        for k in ("execution", "collapsed", "scrolled"):
            c.metadata.pop(k, None)
    if lab_relpath and nb.cells and nb.cells[0].cell_type == "markdown":
        nb.cells[0].source = COLAB_URL_RE.sub(lambda m: m.group(1) + lab_relpath, nb.cells[0].source)
    return nb


def _repo_root(start: Path) -> Path | None:
    for p in [start, *start.parents]:
        if (p / ".git").exists() or (p / "pyproject.toml").exists():
            return p
    return None


def _lab_relpath(lab_path: Path) -> str:
    lab_path = lab_path.resolve()
    root = _repo_root(lab_path.parent)
    if root is not None:
        try:
            return lab_path.relative_to(root).as_posix()
        except ValueError:
            pass
    return f"labs/{lab_path.name}"


def check_source(name: str, source_nb, path: Path | str = "") -> None:
    """Raise LabBuildError for a source lab nbgrader would mishandle (duplicated grade_ids)."""
    dups = duplicate_grade_ids(source_nb)
    if dups:
        where = "; ".join(f"{g!r} in cells {', '.join(str(i) for i in idx)}" for g, idx in sorted(dups.items()))
        raise LabBuildError(f"{path or name}: duplicated grade_id ({where}). Every answer and test cell "
                            "needs its own grade_id; rename the copies.")
    if not any(nbgrader_meta(c) for c in source_nb.cells):
        raise LabBuildError(f"{path or name}: no nbgrader cells (answer cells need "
                            "nbgrader={\"grade_id\": ..., \"solution\": true}, test cells "
                            "nbgrader={\"grade_id\": ..., \"grade\": true, \"points\": N})")


def prepare_source(source_nb):
    """A copy of a source lab with the course's kernelspec and stable ids, ready for nbgrader; the
    instructor's answer-key cells are left out."""
    nb = copy.deepcopy(source_nb)
    nb.cells = [c for c in nb.cells if not is_answer_key(c)]
    nb.nbformat, nb.nbformat_minor = 4, 5
    meta = dict(nb.metadata)
    meta["kernelspec"] = dict(KERNELSPEC)
    nb.metadata = nbformat.from_dict(meta)
    _stable_ids(nb)
    return nb


def generate_release(course: CourseDir, name: str, source_nb, source_path: Path | str = "") -> object:
    """Run nbgrader generate_assignment for one lab in `course`; return the released notebook
    (not yet normalized). Raises LabBuildError with nbgrader's log on failure."""
    check_source(name, source_nb, source_path)
    course.add_source(name, prepare_source(source_nb))
    res = course.generate_assignment(name)
    if not res.get("success"):
        raise LabBuildError(f"{source_path or name}: nbgrader generate_assignment failed:\n{result_log(res)}")
    return read_notebook(course.release(name))


# ---------------------------------------------------------------------------------------------------
# building

def _stub_lines(course: CourseDir) -> set[str]:
    cs = course.config.ClearSolutions
    stubs = set(STUB_LINES)
    code = cs.get("code_stub", {})
    for text in (code.values() if isinstance(code, dict) else [str(code)]):
        stubs |= {ln.strip() for ln in str(text).split("\n")}
    if "text_stub" in cs:
        stubs |= {ln.strip() for ln in str(cs.text_stub).split("\n")}
    return stubs


@dataclass
class LabBuild:
    name: str
    source: Path | None
    lab: Path
    status: str  # written | unchanged | stale | missing | orphan | error
    message: str = ""
    text: str = field(default="", repr=False)


def build_labs(solutions: str | Path = "solutions", labs: str | Path = "labs", names=None,
               check: bool = False, config_file: str | Path | None = None,
               workdir: str | Path | None = None) -> list[LabBuild]:
    """Generate labs/labNN.ipynb for every solutions/labNN.ipynb (or only `names`).

    check=False writes the labs that changed; check=True writes nothing and reports each lab as
    ``unchanged``, ``stale`` (differs), ``missing`` (not generated yet) or ``orphan`` (a lab with no
    source). Source problems give status ``error`` with the reason in ``message``.
    """
    solutions, labs = Path(solutions), Path(labs)
    if not solutions.is_dir():
        raise FileNotFoundError(f"solutions folder {solutions} does not exist")
    all_names = lab_names(solutions)
    if names:
        unknown = sorted(set(names) - set(all_names))
        if unknown:
            raise FileNotFoundError(f"no source lab {', '.join(unknown)} in {solutions}/")
        todo = sorted(set(names))
    else:
        todo = all_names
    results: list[LabBuild] = []
    cfg = find_config(config_file, solutions)
    with tempfile.TemporaryDirectory(prefix="course-build-") as tmp:
        course = CourseDir(workdir or tmp, cfg)
        for name in todo:
            src_path = solutions / f"{name}.ipynb"
            lab_path = labs / f"{name}.ipynb"
            try:
                source_nb = read_notebook(src_path)
                released = generate_release(course, name, source_nb, src_path)
                lab_nb = normalize_lab(released, _lab_relpath(lab_path))
                leaks = find_leaks(source_nb, lab_nb, _stub_lines(course))
                if leaks:
                    raise LabBuildError(f"{src_path}: the generated lab would show solution or hidden-test "
                                        f"text: {leaks[:5]} (check the BEGIN/END delimiters)")
            except LabBuildError as e:
                results.append(LabBuild(name, src_path, lab_path, "error", str(e)))
                continue
            except Exception as e:  # unreadable source, nbformat errors
                results.append(LabBuild(name, src_path, lab_path, "error", f"{src_path}: {type(e).__name__}: {e}"))
                continue
            text = notebook_text(lab_nb)
            old = lab_path.read_text(encoding="utf-8") if lab_path.exists() else None
            if old == text:
                status = "unchanged"
            elif check:
                status = "missing" if old is None else "stale"
            else:
                lab_path.parent.mkdir(parents=True, exist_ok=True)
                lab_path.write_text(text, encoding="utf-8")
                status = "written"
            results.append(LabBuild(name, src_path, lab_path, status, text=text))
    if not names:
        for name in sorted(set(lab_names(labs)) - set(all_names)):
            results.append(LabBuild(name, None, labs / f"{name}.ipynb", "orphan",
                                    f"{labs / (name + '.ipynb')} has no source {solutions / (name + '.ipynb')}"))
    return results


def build_ok(results: list[LabBuild], check: bool) -> bool:
    bad = {"error", "stale", "missing", "orphan"} if check else {"error"}
    return not any(r.status in bad for r in results)
