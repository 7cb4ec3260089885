"""The grader's side of the harness's integrity check (``llmcheck/integrity.py``) and of the
kernel's audit hook (``llmcheck/audit.py``).

After every graded test cell the executor (:class:`course.grading.executor.BoundedExecute`) asks
the kernel :data:`HARNESS_CHANGES` (what of the harness changed since the kernel started) and
writes the answer into the cell's metadata under :data:`HARNESS_METADATA`; the verdicts
(:func:`course.grading.verdicts.judge_notebook`) turn it into evidence for review. The audit
hook's reports, taken out of the kernel's output stream as they arrive, go in each cell's
metadata under :data:`AUDIT_METADATA`, and become evidence the same way.
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

AUDIT_METADATA = "audit_events"
"""Cell metadata the executor writes: the kernel's audit reports that arrived while the cell ran
(llmcheck/audit.py), evidence for review."""
MAX_AUDIT_REPORTS = 20
"""Reports kept per cell."""


def audit_evidence(cells) -> list[str]:
    """Evidence sentences for the audit reports in the cells' metadata (one per report)."""
    evidence = []
    for index, cell in enumerate(cells):
        for report in cell.get("metadata", {}).get(AUDIT_METADATA, [])[:MAX_AUDIT_REPORTS]:
            if not isinstance(report, dict):
                continue
            grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            where = f"cell {grade_id}" if grade_id else f"cell {index + 1}"
            detail = f" ({report.get('detail')})" if report.get("detail") else ""
            evidence.append(f"the kernel's audit hook saw {report.get('event')}{detail} while "
                            f"{where} ran, from the learner's {report.get('function')} at line "
                            f"{report.get('line')}: {str(report.get('source', ''))[:120]!r}")
    return evidence
