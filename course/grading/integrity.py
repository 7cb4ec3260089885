"""The grader's side of the harness's integrity check (``llmcheck/integrity.py``).

After every graded test cell the executor (:class:`course.grading.executor.BoundedExecute`) asks
the kernel :data:`HARNESS_CHANGES` (what of the harness changed since the kernel started) and
writes the answer into the cell's metadata under :data:`HARNESS_METADATA`; the verdicts
(:func:`course.grading.verdicts.judge_notebook`) turn it into evidence for review.
"""

from __future__ import annotations


HARNESS_METADATA = "harness_changes"
"""Test-cell metadata the executor writes: what of the harness changed while the cell ran
(llmcheck/integrity.py), evidence for review."""
HARNESS_CHANGES = ("(lambda: 0).__builtins__['__import__']('llmcheck.integrity', "
                   "fromlist=['changes']).changes()")
"""The expression the executor evaluates in the kernel after a test cell: a list of changes. It
names nothing of the learner's (a learner's global ``__import__`` cannot stand in for the
builtin: see course/grading/executor.py, ``HARNESS``)."""
