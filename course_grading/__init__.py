"""The instructor's pipeline: `course build-labs` (solutions/ -> labs/) and `course grade` (collect, check,
run each submission in a sandboxed kernel, judge it in the grader's process, feedback, CSV). Installed with
the `grading` extra (nbgrader and its Jupyter tools); a student's install needs none of it: labs import their
checks from `course_lib.checks`.

It imports nothing from `course_lib` (it runs untrusted student notebooks and must not depend on the code
they are graded on; `tests/test_import_graph.py`); the labs' judges (judges/labNN.py, loaded by path) do: they
compute the expected values with the course's references, in the grader's process. This face imports none of
its modules either: the grading kernel gets a copy of this file, `driver.py` and `wire.py` only (see
`sandbox.RunScratch`), not the pipeline.
"""
