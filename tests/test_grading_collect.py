"""Collection never follows a link out of a submission and drops nothing silently (issue 29, items 2-3).

No kernel starts here: the one notebook that could be graded is invalid JSON, so `course grade` runs
end to end in seconds over a submissions folder holding links (to another student's notebook, to a
private file of the grader's, to /etc/shadow, to a folder, dangling, deep inside a student's folder),
hidden files and folders, a FIFO named like a notebook, and the leftovers of zip tools.
"""
from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

from course_grading.collect import UnsafeSubmission, collect, read_submission
from course_grading.build import build_labs
from course_grading.pipeline import grade_main

DATA = Path(__file__).parent / "data" / "solutions"
LABS = {99: "lab99"}
MARKER = "decoy-8b1f0c2e: the grader's private file"


def make_tree(base: Path) -> dict:
    """A submissions folder with every kind of entry; returns named paths."""
    sub = base / "subs"
    (sub / "zoe").mkdir(parents=True)
    victim = sub / "zoe" / "lab99.ipynb"
    victim.write_text("{not json")                                  # the one attributable notebook
    private = base / "private.txt"
    private.write_text(MARKER + "\n")
    os.chmod(private, 0o600)
    (sub / "copycat").mkdir()
    os.symlink(victim, sub / "copycat" / "lab99.ipynb")             # another student's notebook
    os.symlink(private, sub / "eve_lab99.ipynb")                   # flat: a private file of the grader
    os.symlink("/etc/shadow", sub / "root_lab99.ipynb")             # flat: the machine's passwords
    os.symlink(sub / "zoe", sub / "mallory")                       # a student folder that is a link
    (sub / "deep" / "a" / "b").mkdir(parents=True)
    os.symlink(private, sub / "deep" / "a" / "b" / "lab99.ipynb")  # a link deep inside a student's folder
    os.symlink(base / "nowhere", sub / "ghost_lab99.ipynb")        # dangling
    (sub / ".carl").mkdir()
    (sub / ".carl" / "lab99.ipynb").write_text("{}")                 # a hidden student folder
    (sub / "dora" / ".hidden").mkdir(parents=True)
    (sub / "dora" / ".hidden" / "lab99.ipynb").write_text("{}")      # a hidden folder inside a student's
    (sub / "dora" / ".notes.txt").write_text("x")
    os.mkfifo(sub / "fifo_lab99.ipynb")                             # opening it would hang a reader
    (sub / "zoe" / "._lab99.ipynb").write_text("AppleDouble")
    (sub / ".DS_Store").write_text("x")
    (sub / "__MACOSX" / "zoe").mkdir(parents=True)
    (sub / "__MACOSX" / "zoe" / "._lab99.ipynb").write_text("x")
    (sub / "zoe" / ".ipynb_checkpoints").mkdir()
    (sub / "zoe" / ".ipynb_checkpoints" / "lab99-checkpoint.ipynb").write_text("{}")
    return dict(sub=sub, victim=victim, private=private)


EXPECTED_NOT_GRADED = {  # relative path -> a word the reason must contain
    "copycat/lab99.ipynb": "symbolic link", "eve_lab99.ipynb": "symbolic link", "root_lab99.ipynb": "symbolic link",
    "mallory": "symbolic link", "deep/a/b/lab99.ipynb": "symbolic link", "ghost_lab99.ipynb": "symbolic link",
    ".carl/lab99.ipynb": "hidden folder", "dora/.hidden/lab99.ipynb": "hidden folder", "fifo_lab99.ipynb": "FIFO",
}
EXPECTED_SKIPPED = {
    "zoe/._lab99.ipynb": "resource-fork", ".DS_Store": "macOS", "__MACOSX": "macOS",
    "zoe/.ipynb_checkpoints": "checkpoints",
    "dora/.notes.txt": "hidden file",
}


def rel(paths, sub: Path) -> dict:
    return {str(Path(p).relative_to(sub.resolve())): why for p, why in paths}


def test_collect_follows_no_link_and_lists_everything(tmp_path):
    t = make_tree(tmp_path)
    coll = collect(t["sub"], LABS)
    assert [(s.student, s.path.name) for s in coll.submissions] == [("zoe", "lab99.ipynb")]
    not_graded, skipped = rel(coll.unattributed, t["sub"]), rel(coll.ignored, t["sub"])
    assert set(not_graded) == set(EXPECTED_NOT_GRADED), not_graded
    for p, word in EXPECTED_NOT_GRADED.items():
        assert word in not_graded[p], (p, not_graded[p])
    assert set(skipped) == set(EXPECTED_SKIPPED), skipped
    for p, word in EXPECTED_SKIPPED.items():
        assert word in skipped[p], (p, skipped[p])
    assert "never followed" in not_graded["copycat/lab99.ipynb"]


def test_read_submission_opens_regular_files_only(tmp_path):
    t = make_tree(tmp_path)
    assert read_submission(t["victim"]) == "{not json"
    for p in ("copycat/lab99.ipynb", "eve_lab99.ipynb", "root_lab99.ipynb"):
        with pytest.raises(UnsafeSubmission, match="symbolic link"):
            read_submission(t["sub"] / p)
    done = []
    th = threading.Thread(target=lambda: done.append(pytest.raises(UnsafeSubmission, read_submission,
                                                                   t["sub"] / "fifo_lab99.ipynb")), daemon=True)
    th.start()
    th.join(10)
    assert done, "reading a FIFO hung"


def test_grade_lists_links_and_hidden_entries_and_quotes_nothing(tmp_path, capsys):
    t = make_tree(tmp_path)
    labs = tmp_path / "labs"
    sols = tmp_path / "solutions"
    sols.mkdir()
    shutil.copyfile(DATA / "lab99.ipynb", sols / "lab99.ipynb")
    build_labs(sols, labs)
    out = tmp_path / "out"
    rc = grade_main([str(t["sub"]), "--labs-release", str(labs), "--solutions", str(sols), "--out", str(out),
                     "--timeout", "5", "--isolation", "process", "-q"])
    text = capsys.readouterr().out
    assert rc == 1  # some entries were not graded
    # nothing a link points at is read: neither the grader's private file nor /etc/shadow is quoted
    secrets = [MARKER]
    if Path("/etc/shadow").is_file() and os.access("/etc/shadow", os.R_OK):
        secrets += [ln.split(":")[1] for ln in Path("/etc/shadow").read_text().splitlines()
                    if ln.count(":") > 2 and len(ln.split(":")[1]) > 10]
    written = {p.name: p.read_text(errors="replace") for p in out.rglob("*") if p.is_file()}
    for name, body in [*written.items(), ("terminal", text)]:
        for s in secrets:
            assert s not in body, f"{name} quotes the target of a link"
    # every entry is in the terminal summary and in not_graded.txt, with its reason
    listing = written["not_graded.txt"]
    for p, word in [*EXPECTED_NOT_GRADED.items(), *EXPECTED_SKIPPED.items()]:
        assert p.split("/")[-1] in text and word in text, (p, word)
        assert str(t["sub"].resolve() / p) in listing, p
    assert "NOT GRADED (9" in text and "skipped (5)" in text
    # the one attributable notebook was graded (an error: invalid JSON), and only once
    assert text.count("zoe") >= 1 and "copycat" not in [ln.split()[0] for ln in text.splitlines() if ln.strip()]
