"""The course's grader, on nbgrader: release (instructors), check (learners), grade (instructors).

One audience per module: :mod:`.check` (the learner's visible tests), :mod:`.grade` and
:mod:`.report` (the instructor's grade: select, run, record; the gradebook and grade table),
:mod:`.worker` (one submission graded in a worker process, its :class:`~.worker.Job`),
:mod:`.release` (solutions/ -> exercises/), :mod:`.edition` (the learner edition),
:mod:`.executor` (the bounded executor that runs every notebook, without nbgrader),
:mod:`.integrity` (what the executor asks the harness after each test cell),
:mod:`.sandbox` (what a notebook's kernel may see and use), :mod:`.standby` (the kernel a
learner's check leaves started for the next), :mod:`.secret` (the grade run's
secret), :mod:`.verdicts` (each test cell judged against the solution's records),
:mod:`.judging` (the solution's records and the ``Verdicts`` step of nbgrader's autograde),
:mod:`.review` (evidence for the instructor's review, never a lost point), :mod:`.feedback` and
:mod:`.hidden` (the feedback pages), :mod:`.nbgrader_app` (nbgrader's applications for a course
directory), :mod:`.cli` (the commands). Importing the package imports no nbgrader.
course/grading/VERDICTS.md opens with the pipeline as a table and is the contract between a test cell, the kernel-side harness (``llmcheck``) and the verdicts.
"""

from .check import check, format_report
from .grade import grade
from .release import release

__all__ = ["check", "format_report", "grade", "release"]
