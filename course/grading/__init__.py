"""The course's grader, on nbgrader: release (instructors), check (learners), grade (instructors).

One audience per module: :mod:`.check` (the learner's visible tests), :mod:`.grade` and
:mod:`.report` (the instructor's autograde, feedback and grade table), :mod:`.release`
(solutions/ -> exercises/), :mod:`.edition` (the learner edition), :mod:`.limits` (the bounded
executor: output caps, preloads, each test cell's secret and the harness check after it),
:mod:`.sandbox` (what a notebook's kernel may see and use), :mod:`.secret` (the grade run's
secret), :mod:`.verdicts` (each test cell judged against the solution's records),
:mod:`.review` (evidence for the instructor's review, never a lost point), :mod:`.feedback` and
:mod:`.hidden` (the feedback pages), :mod:`.nbgrader_app` (nbgrader's applications for a course
directory). Importing the package imports no nbgrader. course/grading/VERDICTS.md is the
contract between a test cell, the kernel-side harness (``llmcheck``) and the verdicts.
"""

from .check import check, format_report
from .grade import grade
from .release import release

__all__ = ["check", "format_report", "grade", "release"]
