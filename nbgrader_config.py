"""nbgrader settings for `course build-labs` and `course grade` (read by course_grading).

The course does not use nbgrader's folder layout (its labs are flat: solutions/labNN.ipynb ->
labs/labNN.ipynb), so run the course's commands, not `nbgrader ...`, from the repository root:

    course build-labs            # or: make labs
    course grade SUBMISSIONS     # or: make grade SUBMISSIONS=...

They build an nbgrader course folder in a temporary directory and load this file into it. The
course folder, database path, course id and exchange are set by the pipeline and cannot be set here.
Precedence: built-in defaults < this file < command-line flags (e.g. `course grade --timeout 120`).
"""
c = get_config()  # noqa: F821  (provided by traitlets when it loads this file)

# Time limit of each cell when grading, and of each call of the judge, in seconds (`course grade --timeout`
# overrides it). A cell that runs longer is interrupted, the rest of the notebook still runs, and the
# submission is flagged for review. (Grading runs its own kernels, not nbgrader's autograde: see README,
# "How a submission is graded".)
c.Execute.timeout = 60

# What students see in place of a solution. Lab tests rely on the code stub raising.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"


# Every lab keeps the `python3` kernelspec: the pipeline writes it into the labs and the submissions'
# working copies; nbgrader's OverwriteKernelspec then takes it from the source lab.
