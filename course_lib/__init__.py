"""course_lib: the shared library of the LLM inference-optimization course.

Every technique of the course has a readable reference implementation here (plain PyTorch, shape
comments, tested), and a fast GPU path where it matters, tested against the reference.
"""
__version__ = "0.1.0"

# Where the course is published: the one place that drives the Colab badges (README and notebooks),
# the notebooks' install cells, the site's links and the site's address (GitHub Pages of REPO). Students
# get the release, never `main`: a badge opens the notebook at the tag RELEASE and its install cell
# installs the library at the same tag, so a push in mid-term changes nothing they run. To publish a
# release: set __version__, run `make notebooks` and `course build-labs` (every badge
# and install cell follows), commit, then tag that commit RELEASE and push the tag (README, "Publishing").
REPO = "llm-inference-course/course"
REPO_URL = f"https://github.com/{REPO}"
RELEASE = f"v{__version__}"
INSTALL_SPEC = f"course_lib @ git+{REPO_URL}@{RELEASE}"
SITE_URL = "https://{}.github.io/{}/".format(*REPO.split("/"))   # `make site`, pushed to GitHub Pages at RELEASE


def colab_url(relpath: str) -> str:
    """The Colab link of a notebook at `relpath` in the repository, at the release tag."""
    return f"https://colab.research.google.com/github/{REPO}/blob/{RELEASE}/{relpath}"
