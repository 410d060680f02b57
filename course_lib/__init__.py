"""course_lib: the shared library of the LLM inference-optimization course.

Every technique of the course has a readable reference implementation here (plain PyTorch, shape
comments, tested), and a fast GPU path where it matters, tested against the reference.
"""
__version__ = "0.1.0"

# Where the course lives; the notebooks' Colab badges and install cells point here.
REPO = "llm-inference-course/course"
REPO_URL = f"https://github.com/{REPO}"
