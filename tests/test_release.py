"""`make release` (tools/release.py) on a small course in a temporary git repository: each check passes on a
release-ready commit and fails, saying what to do, on what a release must not have. No network; the site's
strict build is stood in for (tools/site.py's own tests cover it), except for the command it runs."""
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course_lib import INSTALL_SPEC, RELEASE, REPO, SITE_URL, colab_url
from tools import release

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ["notebooks/00_basics.ipynb", "labs/lab00.ipynb"]
GIT = ["git", "-c", "user.name=Course Test", "-c", "user.email=test@example.org", "-c", "commit.gpgsign=false",
       "-c", "tag.gpgsign=false"]


def git(root, *args):
    r = subprocess.run([*GIT, "-C", str(root), *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def _notebook(rel, install=INSTALL_SPEC):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(
                    f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab_url(rel)})"),
                nbformat.v4.new_code_cell('import sys\nif "google.colab" in sys.modules:\n'
                                          f'    !pip install -q "{install}"'),
                nbformat.v4.new_markdown_cell("# Basics\n\nSee [the source](https://github.com/"
                                              f"{REPO}/blob/{RELEASE}/course_lib/__init__.py).")]
    return nb


def _readme():
    badges = "\n".join(f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab_url(r)})"
                       for r in NOTEBOOKS)
    return f"# Course\n\nThe [course site]({SITE_URL}); issues at https://github.com/{REPO}/issues.\n\n{badges}\n"


@pytest.fixture
def repo(tmp_path):
    """A release-ready course: the real course_lib/__init__.py, a notebook and a lab with their badges and
    install cells, README with both badges and the site link; committed and tagged RELEASE."""
    root = tmp_path / "course"
    (root / "course_lib").mkdir(parents=True)
    shutil.copy(ROOT / "course_lib" / "__init__.py", root / "course_lib" / "__init__.py")
    version = RELEASE.removeprefix("v")
    (root / "pyproject.toml").write_text(f'[project]\nname = "course_lib"\nversion = "{version}"\n')
    (root / "README.md").write_text(_readme())
    (root / ".gitignore").write_text("build/\n__pycache__/\n")
    for rel in NOTEBOOKS:
        (root / rel).parent.mkdir(exist_ok=True)
        nbformat.write(_notebook(rel), root / rel)
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "course")
    git(root, "tag", "-a", RELEASE, "-m", RELEASE)
    return root


def site_ok(root, out):
    """Stands in for the strict build: a page with the links the real site writes."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "index.html").write_text(f'<a href="{colab_url(NOTEBOOKS[0])}">Colab</a> '
                                    f'<a href="https://github.com/{REPO}/blob/{RELEASE}/syllabus.md">source</a>')
    return True, ["site.py build: built 3 pages", "site.py check: every link and asset resolves"]


def _run(root, **kw):
    lines = []
    rc = release.run(root, builder=kw.pop("builder", site_ok), out=lines.append, **kw)
    return rc, "\n".join(lines)


def _line(report, name):
    return next(line for line in report.splitlines() if line.strip().split()[1:2] == [name])


def test_a_release_ready_repository_passes_every_check(repo):
    rc, report = _run(repo)
    assert rc == 0, report
    for name in ("version", "tag", "clean", "links", "site"):
        assert _line(report, name).strip().startswith("ok"), report
    assert f"{RELEASE} points at HEAD" in report
    assert "in 5 files (2 notebooks and labs, the built site)" in report
    # what cannot be checked offline is said, every time
    assert "not checked here (they need the network):" in report
    assert f"git ls-remote --tags https://github.com/{REPO} {RELEASE}" in report
    assert f"GitHub Pages serves the site at {SITE_URL}" in report and "that Colab opens the badges" in report
    assert report.endswith(f"ready to release {RELEASE}: publish build/student-edition as {REPO} with the tag, "
                           "then build/site (README, \"Publishing a release\")")
    assert _line(report, "edition").strip().startswith("ok"), report


def test_the_student_edition_holds_nothing_of_the_instructors(repo):
    """solutions/, judges/ and tests/ stay out; a lab that carries a solution marker or an answer key, or a judge
    put anywhere else, fails the check, named."""
    for rel, text in (("solutions/lab00.py", "### BEGIN SOLUTION\n"), ("judges/lab00.py", "judge = Judge()\n"),
                      ("tests/test_x.py", "def test(): pass\n")):
        (repo / rel).parent.mkdir(exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "instructor files")
    git(repo, "tag", "-f", "-a", RELEASE, "-m", RELEASE)
    rc, report = _run(repo)
    assert rc == 0, report
    edition = repo / "build" / "student-edition"
    assert (edition / "labs" / "lab00.ipynb").exists() and (edition / "STUDENT_EDITION.md").exists()
    assert not any((edition / d).exists() for d in ("solutions", "judges", "tests"))
    lab = nbformat.read(repo / "labs" / "lab00.ipynb", as_version=4)
    lab.cells.append(nbformat.v4.new_code_cell("### BEGIN SOLUTION\nx = 1\n### END SOLUTION"))
    nbformat.write(lab, repo / "labs" / "lab00.ipynb")
    (repo / "tools").mkdir()
    (repo / "tools" / "helper.py").write_text("from course_grading.judging import Judge\njudge = Judge()\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a leak")
    git(repo, "tag", "-f", "-a", RELEASE, "-m", RELEASE)
    rc, report = _run(repo)
    assert rc == 1 and _line(report, "edition").strip().startswith("FAIL"), report
    assert "labs/lab00.ipynb holds BEGIN SOLUTION" in report and "tools/helper.py is a lab's judge" in report


def test_no_tag_says_how_to_create_it(repo):
    git(repo, "tag", "-d", RELEASE)
    rc, report = _run(repo)
    assert rc == 1 and _line(report, "tag").strip() == (
        f'FAIL  tag      no tag {RELEASE} in this repository; on the release commit: git tag -a {RELEASE} '
        f'-m "{RELEASE}", then git push origin {RELEASE}')
    assert report.endswith("not ready: 1 check(s) failed (tag)")


def test_a_tag_on_another_commit_is_named(repo):
    tagged = git(repo, "rev-parse", "HEAD")[:12]
    (repo / "later.txt").write_text("after the tag\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "later")
    rc, report = _run(repo)
    head = git(repo, "rev-parse", "HEAD")[:12]
    assert rc == 1 and f"the tag {RELEASE} points at {tagged}, HEAD is {head}: check out the tag" in report
    assert _line(report, "clean").strip().startswith("ok")


def test_a_dirty_tree_lists_changed_and_untracked_files(repo):
    (repo / "README.md").write_text(_readme() + "\nedited\n")
    (repo / "notes.txt").write_text("untracked\n")
    (repo / "build").mkdir()
    (repo / "build" / "ignored.txt").write_text("ignored: not part of the tree\n")
    rc, report = _run(repo)
    assert rc == 1 and "FAIL  clean    2 changed or untracked file(s)" in report
    assert "-  M README.md" in report and "- ?? notes.txt" in report and "ignored.txt" not in report


def test_stale_badges_install_cells_and_links_are_each_named(repo):
    readme = _readme().replace(f"blob/{RELEASE}/labs", "blob/main/labs") + (
        "\nOld site: https://llm-inference-course.github.io/old-course/ and "
        "https://github.com/llm-inference-course/course-2024/tree/v0.0.9/notebooks; upstream "
        "https://github.com/vllm-project/vllm/blob/main/README.md is someone else's.\n")
    (repo / "README.md").write_text(readme)
    nbformat.write(_notebook(NOTEBOOKS[0], install=f"course_lib @ git+https://github.com/{REPO}@main"),
                   repo / NOTEBOOKS[0])
    git(repo, "commit", "-q", "-am", "stale")
    git(repo, "tag", "-f", "-a", RELEASE, "-m", RELEASE)

    def stale_site(root, out):
        site_ok(root, out)
        (out / "page.html").write_text(f'<a href="https://github.com/{REPO}/blob/v0.0.9/syllabus.md">x</a>')
        return True, []
    rc, report = _run(repo, builder=stale_site)
    assert rc == 1 and "FAIL  links    5 link(s) not at" in report, report
    for problem in (f"README.md: Colab badge of labs/lab00.ipynb opens {REPO}@main, not {REPO}@{RELEASE}",
                    "README.md: links the site at https://llm-inference-course.github.io/old-course/, "
                    f"not {SITE_URL}",
                    f"README.md: links llm-inference-course/course-2024, not {REPO}",
                    f"notebooks/00_basics.ipynb: installs course_lib from git+https://github.com/{REPO}@main, "
                    f"not {INSTALL_SPEC!r}",
                    f"build/site/page.html: links {REPO} at 'v0.0.9', not at the release {RELEASE}"):
        assert f"- {problem}" in report, report
    assert "vllm" not in report


def test_missing_badges_install_cells_and_site_link_are_named(repo):
    nb = _notebook(NOTEBOOKS[1])
    nb.cells = nb.cells[2:]                       # a lab without its badge and install cells
    nbformat.write(nb, repo / NOTEBOOKS[1])
    (repo / "README.md").write_text(f"# Course\n\n[![Open In Colab](x.svg)]({colab_url(NOTEBOOKS[0])})\n")
    problems = release.check_links(repo, release.published(repo)).problems
    assert problems == (f"labs/lab00.ipynb: its first cell is not its badge {colab_url(NOTEBOOKS[1])} "
                        "(python tools/nb.py build writes it)",
                        f"labs/lab00.ipynb: its second cell is not the install cell of {INSTALL_SPEC!r}",
                        f"README.md: no Colab badge for labs/lab00.ipynb ({colab_url(NOTEBOOKS[1])})",
                        f"README.md: no link to the site, {SITE_URL}")


def test_the_package_version_must_agree_with_the_tag(repo):
    (repo / "pyproject.toml").write_text('[project]\nname = "course_lib"\nversion = "0.2.0"\n')
    git(repo, "commit", "-q", "-am", "bump pyproject only")
    git(repo, "tag", "-f", "-a", RELEASE, "-m", RELEASE)
    rc, report = _run(repo)
    version = RELEASE.removeprefix("v")
    assert rc == 1 and "FAIL  version  the package version and the tag disagree" in report
    assert f"pyproject.toml says version '0.2.0', course_lib.__version__ '{version}'" in report


def test_a_failed_site_build_fails_the_release_and_shows_why(repo):
    def failing(root, out):
        return False, ["site.py build: site build failed: strict build: claims did not hold on the runs that "
                       "made these pages:", "site.py build:   warning: notebooks/05_kv_caching.html: ..."]
    rc, report = _run(repo, builder=failing)
    assert rc == 1 and "FAIL  site     the strict build of build/site or its link check failed" in report
    assert "- site.py build: site build failed: strict build: claims did not hold" in report
    assert _line(report, "links").strip().startswith("ok")   # the repository's own links are still checked


def test_skipping_the_site_is_never_ready(repo):
    rc, report = _run(repo, site=False, builder=None)
    assert rc == 1 and "skip  site     not built (--skip-site)" in report
    assert report.endswith("not ready: the site was not checked")


def test_build_site_runs_the_strict_build_then_the_check(tmp_path):
    """The command it runs: tools/site.py build --out build/site --strict, then check (here a stand-in
    script that records its arguments and fails when told to)."""
    (tmp_path / "tools").mkdir()
    log = tmp_path / "calls.txt"
    (tmp_path / "tools" / "site.py").write_text(
        "import sys, pathlib\n"
        f"pathlib.Path({str(log)!r}).open('a').write(' '.join(sys.argv[1:]) + '\\n')\n"
        "print('done', sys.argv[1])\n"
        "sys.exit(1 if (pathlib.Path.cwd() / 'fail').exists() else 0)\n")
    out = tmp_path / "build" / "site"
    assert release.build_site(tmp_path, out) == (True, ["site.py build: done build", "site.py check: done check"])
    assert log.read_text().splitlines() == [f"build --out {out} --strict", f"check {out}"]
    (tmp_path / "fail").write_text("")
    assert release.build_site(tmp_path, out) == (False, ["site.py build: done build"])


def test_the_command_line_exits_non_zero_on_a_failed_check(repo):
    git(repo, "tag", "-d", RELEASE)
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "release.py"), "--skip-site", "--root", str(repo)],
                       capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 1 and f"FAIL  tag      no tag {RELEASE}" in r.stdout, r.stdout + r.stderr
