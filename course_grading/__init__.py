"""The instructor's pipeline: `course build-labs` (solutions/ -> labs/) and `course grade` (collect, check,
autograde in a sandbox, feedback, CSV). Installed with the `grading` extra (nbgrader and its Jupyter
tools); a student's install needs none of it: labs import their checks from `course_lib.checks`.

It imports nothing from `course_lib` (it runs untrusted notebooks and must not depend on the code they are
graded on; `tests/test_import_graph.py`). This face imports none of its modules either: the grading kernel
gets a copy of this file and `guard.py` only (see `sandbox.RunScratch`), not the pipeline.
"""
