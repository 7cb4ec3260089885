"""The course's grader, on nbgrader: release (instructors), check (learners), grade (instructors).

One audience per module: :mod:`.check` (the learner's visible tests), :mod:`.grade` and
:mod:`.report` (the instructor's autograde, feedback and grade table), :mod:`.release`
(solutions/ -> exercises/), :mod:`.limits` (what a notebook's kernel may use), :mod:`.nbgrader_app`
(nbgrader's applications for a course directory). Importing the package imports no nbgrader.
"""

from .check import check, format_report
from .grade import grade
from .release import release

__all__ = ["check", "format_report", "grade", "release"]
