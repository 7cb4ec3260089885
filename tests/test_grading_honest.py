"""Honest answers written differently from the solutions get full marks (issue 20: the grader is
fair). The corpus is tests/grading/honest.py: correct answers with other loop orders, helpers,
dataclasses, in-place updates, and what honest learners write around them (print, display,
warnings, os.environ, getattr/setattr/__class__/globals() on their own objects, words such as
"exercise" or "llmcheck" in strings and docstrings).

The fast tests check the corpus itself (its size, its coverage, that every edit applies to the
released notebook). The slow test grades every variant in one run, with the real nbgrader and a
real gradebook, as tests/test_grading.py grades its class, and asks for full marks.
"""

from __future__ import annotations

import ast
import json
from collections import Counter
from pathlib import Path

import pytest

from class_runs import ClassRun
from classroom import (ALL_ASSIGNMENTS, ASSIGNMENTS, DATA, answers, cell_scores, load_data,
                       mutants, nbgrader_meta, read, row_of, selected, submission, submit_all)

from course.grading.report import State, Status

GRADED_NOW = Status(State.GRADED)
CELL_TIMEOUT = 60          # seconds per cell: an honest answer is never cut short for speed

honest = load_data("grading_honest", DATA / "honest.py")
HONEST = honest.HONEST_VARIANTS
IDS = [sub.student for sub in HONEST]
GRADED = selected(HONEST)
"""The variants the class run grades (GRADING_TEST_ASSIGNMENTS may narrow it)."""


# ------------------------------------------------------------------------------------------------
# The corpus (fast)
# ------------------------------------------------------------------------------------------------

def _full_marks(assignment: str) -> float:
    return sum(float(nbgrader_meta(c)["points"]) for c in read("solutions", assignment).cells
               if nbgrader_meta(c).get("grade") and not nbgrader_meta(c).get("solution"))


def test_the_corpus_covers_every_assignment_with_full_marks():
    assert len(HONEST) >= 30, f"only {len(HONEST)} honest variants"
    counts = Counter(sub.assignment for sub in HONEST)
    assert set(counts) == set(ALL_ASSIGNMENTS), f"assignments without a variant: " \
                                                f"{set(ALL_ASSIGNMENTS) - set(counts)}"
    assert min(counts.values()) >= 3, f"fewer than 3 variants: {counts}"
    assert len(set(IDS)) == len(IDS), "student names repeat"
    for assignment in ALL_ASSIGNMENTS:
        assert honest.FULL_MARKS[assignment] == _full_marks(assignment), assignment
    for sub in HONEST:
        assert isinstance(sub, mutants.Submission), sub.student
        assert sub.score == _full_marks(sub.assignment) and sub.failing == frozenset(), sub.student
        assert sub.answered and not sub.stops_grader and sub.why and sub.edits, sub.student


@pytest.mark.parametrize("sub", HONEST, ids=IDS)
def test_every_edit_applies_to_an_answer_cell_of_the_release(sub):
    """Each edit names an answer cell of the released notebook (never a test or given code), a
    Replace finds its text exactly once, the result differs from the solution and is Python."""
    released = {nbgrader_meta(c).get("grade_id"): c for c in read("exercises", sub.assignment).cells}
    for grade_id in sub.edits:
        assert grade_id in released, f"{sub.assignment} has no cell {grade_id}"
        assert nbgrader_meta(released[grade_id]).get("solution"), \
            f"{grade_id} is not an answer cell: an honest learner edits only answers"
    nb = submission(sub.assignment, answered=True, edits=sub.edits)   # asserts Replace counts
    solution = answers(sub.assignment)
    cells = {nbgrader_meta(c).get("grade_id"): c for c in nb.cells}
    for grade_id, edit in sub.edits.items():
        assert isinstance(edit, (mutants.Replace, mutants.Source, mutants.Prepend)), edit
        source = cells[grade_id].source
        assert source != solution[grade_id], f"{grade_id}: the same as the solution"
        ast.parse(source)


# ------------------------------------------------------------------------------------------------
# The class of honest learners, graded in one run (slow)
# ------------------------------------------------------------------------------------------------

def build_class(course: Path) -> None:
    """The class: every honest variant."""
    submit_all(course, GRADED)


CLASS = ClassRun("test_grading_honest", "graded_honest", timeout=CELL_TIMEOUT,
                 what="honest notebooks", feedback=False)    # its tests read no feedback page


@pytest.fixture(scope="module")
def graded_honest(tmp_path_factory):
    """Every honest variant graded once (tests/class_runs.py); returns (course folder, gradebook
    path, CSV rows)."""
    run = CLASS.graded(tmp_path_factory, build_class)
    return run.course, run.course / "gradebook.db", run.rows


def _why_cells_failed(course: Path, sub, names: set[str]) -> list[str]:
    """For each failed test cell: the grader's verdict, else its first error or stderr line."""
    path = course / "autograded" / sub.student / sub.assignment / \
        f"{ASSIGNMENTS[sub.assignment]}.ipynb"
    if not path.is_file():
        return [f"no autograded notebook at {path}"]
    lines = []
    for cell in json.loads(path.read_text())["cells"]:
        name = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if name not in names:
            continue
        verdict = cell.get("metadata", {}).get("verdict") or {}
        outputs = cell.get("outputs", [])
        errors = [f"{o.get('ename')}: {' '.join(str(o.get('evalue', '')).split())[:300]}"
                  for o in outputs if o.get("output_type") == "error"]
        stderr = [" ".join(str(o.get("text", "")).split())[:300] for o in outputs
                  if o.get("output_type") == "stream" and o.get("name") == "stderr"]
        lines.append(f"{name}: verdict {verdict.get('reason') or verdict or '-'}; errors {errors}; "
                     f"stderr {stderr}")
    return lines


@pytest.mark.slow
@pytest.mark.parametrize("sub", GRADED, ids=[sub.student for sub in GRADED])
def test_an_honest_answer_gets_full_marks(graded_honest, sub):
    course, gradebook, rows = graded_honest
    row = row_of(rows, sub.student, sub.assignment)
    cells = cell_scores(gradebook, sub.student, sub.assignment) if row.status == GRADED_NOW \
        else {}
    failed = {name for name, (score, top) in cells.items() if score < top}
    message = "\n".join([f"{sub.student} ({sub.assignment}): {sub.why}",
                         f"score {row.score:g} of {row.max_score:g}, status {str(row.status)!r}",
                         f"CSV reasons: {row.reasons or '-'}",
                         *_why_cells_failed(course, sub, failed)])
    assert row.status == GRADED_NOW, message
    assert not failed and row.score == row.max_score == sub.score, message


@pytest.mark.slow
@pytest.mark.parametrize("student", sorted(s.student for s in GRADED if s.student in honest.WRITES))
def test_the_variants_really_write_what_they_claim(graded_honest, student):
    """A variant about warnings must have shown one (else it tests nothing: torch may stop
    warning there one day), a variant about display() must have displayed something."""
    course, _, _ = graded_honest
    sub = next(s for s in HONEST if s.student == student)
    path = course / "autograded" / student / sub.assignment / f"{ASSIGNMENTS[sub.assignment]}.ipynb"
    assert path.is_file(), f"{student}: not graded (no {path.name} in autograded/)"
    seen = set()
    for cell in json.loads(path.read_text())["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and meta.get("grade"):
                text = "".join(out.get("text", ""))
                seen.add("warning" if "Warning: " in text else out.get("name"))
            if out.get("output_type") == "display_data" and meta.get("solution") \
                    and not any("record" in mime for mime in out.get("data", {})):
                seen.add("display")
    assert honest.WRITES[student] <= seen, f"{student}: expected {honest.WRITES[student]}, " \
                                           f"the graded notebook shows {seen or 'nothing'}"
