"""A class for the grading tests: a course folder, submissions built from the releases, one
graded run, and the results read back. Written once for tests/test_grading*.py.

A submission starts from a released notebook (exercises/), either untouched or with every answer
cell filled from solutions/ (``answered``), then applies the cell-level edits of
tests/grading/mutants.py (``Replace``, ``Source``, ``Prepend``, ``Delete``, ``Duplicate``),
keyed by the cell's nbgrader grade_id.

``GRADING_TEST_ASSIGNMENTS`` (comma-separated assignment folders, e.g. ``09_sampling``) limits the
class runs to those assignments while an exercise is being written; unset, every assignment of
mutants.ASSIGNMENTS is graded (as CI does).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib.util
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from course import grading
from course.grading.authoring import answers_of

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "grading"


def load_data(name: str, path: Path):
    """Execute a test-data module of tests/grading under ``name`` (the data modules import each
    other by these names, e.g. ``from grading_mutants import Submission``)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module             # dataclasses look their module up while building
    spec.loader.exec_module(module)
    return module


mutants = sys.modules.get("grading_mutants") or load_data("grading_mutants", DATA / "mutants.py")
ALL_ASSIGNMENTS: dict[str, str] = mutants.ASSIGNMENTS
"""Assignment folder -> its notebook's name (without .ipynb), every assignment of the course."""


def _selected(assignments: dict[str, str]) -> dict[str, str]:
    wanted = [a.strip() for a in os.environ.get("GRADING_TEST_ASSIGNMENTS", "").split(",")
              if a.strip()]
    unknown = set(wanted) - set(assignments)
    if unknown:
        raise ValueError(f"GRADING_TEST_ASSIGNMENTS names {sorted(unknown)}; the course has "
                         f"{sorted(assignments)}")
    return {a: n for a, n in assignments.items() if not wanted or a in wanted}


ASSIGNMENTS = _selected(ALL_ASSIGNMENTS)
"""The assignments the class runs grade (all, unless GRADING_TEST_ASSIGNMENTS narrows them)."""


def selected(submissions: list) -> list:
    """The submissions whose assignment the class runs grade."""
    return [s for s in submissions if s.assignment in ASSIGNMENTS]


def needs_assignment(assignment: str):
    """Skip a test about one assignment's submission when the run leaves that assignment out."""
    return pytest.mark.skipif(assignment not in ASSIGNMENTS,
                              reason=f"GRADING_TEST_ASSIGNMENTS leaves out {assignment}")


# ------------------------------------------------------------------------------ notebooks

def nbgrader_meta(cell) -> dict:
    return cell.metadata.get("nbgrader", {})


def read(folder: str, assignment: str):
    """The notebook of ``assignment`` in ``folder`` (``solutions`` or ``exercises``)."""
    return nbformat.read(ROOT / folder / assignment / f"{ALL_ASSIGNMENTS[assignment]}.ipynb",
                         as_version=4)


def answers(assignment: str) -> dict[str, str]:
    """The solution of every answer cell, without nbgrader's markers (what a student types)."""
    return answers_of(read("solutions", assignment))


def submission(assignment: str, *, answered: bool, edits: dict | None = None):
    """A released notebook, its answer cells filled in (answered), then edited cell by cell."""
    nb = read("exercises", assignment)
    solved = answers(assignment)
    cells = []
    for cell in nb.cells:
        grade_id = nbgrader_meta(cell).get("grade_id")
        if answered and grade_id in solved:
            cell.source = solved[grade_id]
        edit = (edits or {}).get(grade_id)
        if isinstance(edit, mutants.Delete):
            continue
        if isinstance(edit, mutants.Replace):
            assert cell.source.count(edit.old) == 1, f"{grade_id}: {edit.old!r} must occur once"
            cell.source = cell.source.replace(edit.old, edit.new)
        elif isinstance(edit, mutants.Source):
            cell.source = edit.text.strip("\n")
        elif isinstance(edit, mutants.Prepend):
            cell.source = edit.text + cell.source
        elif isinstance(edit, mutants.Duplicate):
            cells.append(cell)
            cell = copy.deepcopy(cell)
            cell.source = cell.source if edit.text is None else edit.text.strip("\n")
        elif edit is not None:
            raise TypeError(f"{grade_id}: unknown edit {edit!r} (edits come from {mutants.__name__})")
        cells.append(cell)
    missing = set(edits or {}) - {nbgrader_meta(c).get("grade_id") for c in nb.cells}
    assert not missing, f"edits of cells that {assignment} does not have: {missing}"
    nb.cells = cells
    return nb


# ------------------------------------------------------------------------------ the course

def new_course(folder: Path) -> Path:
    """A course folder as an instructor has it: the solutions and nbgrader_config.py."""
    shutil.copytree(ROOT / "solutions", folder / "solutions")
    shutil.copy2(ROOT / "nbgrader_config.py", folder / "nbgrader_config.py")
    return folder


def submit(course: Path, student: str, assignment: str, nb) -> None:
    folder = course / "submitted" / student / assignment
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(folder / f"{ALL_ASSIGNMENTS[assignment]}.ipynb"))


def submit_all(course: Path, submissions) -> None:
    """Submit each Submission (mutants.py's form) built from its assignment's release."""
    for sub in submissions:
        submit(course, sub.student, sub.assignment,
               submission(sub.assignment, answered=sub.answered, edits=sub.edits))


def grade_class(course: Path, *, timeout: float, what: str, feedback: bool = True):
    """Grade every submission of ``course`` in one run into ``course/gradebook.db``; prints the
    run's summary and its time. Returns the run (its ``rows`` are the CSV's). ``feedback=False``
    skips the feedback pages (about half a second a notebook) for a class whose tests read none."""
    start = time.perf_counter()
    run = grading.grade(course, gradebook=course / "gradebook.db", timeout=timeout,
                        feedback=feedback, log=lambda message: print(message, flush=True))
    seconds = time.perf_counter() - start
    count = len(run.rows)
    print(run.summary())
    print(f"graded {count} {what} in {seconds:.0f} s ({seconds / max(count, 1):.1f} s each)")
    return run


# ------------------------------------------------------------------------------ results

def cell_scores(gradebook: Path, student: str, assignment: str) -> dict[str, tuple[float, float]]:
    """grade_id -> (score, max score) of one submission, straight from the sqlite gradebook."""
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{gradebook}") as gb:
        notebook = gb.find_submission_notebook(ALL_ASSIGNMENTS[assignment], assignment, student)
        return {g.name: (float(g.score), float(g.max_score)) for g in notebook.grades}


def count_grades(gradebook: Path) -> int:
    with contextlib.closing(sqlite3.connect(gradebook)) as db:
        return db.execute("select count(*) from grade").fetchone()[0]


def row_of(rows, student: str, assignment: str):
    """The one CSV row of ``student``'s ``assignment``."""
    found = [r for r in rows if r.student == student and r.assignment == assignment]
    assert len(found) == 1, f"expected one grade for {student}/{assignment}, got {found}"
    return found[0]


GRADER_OUTPUTS = {"gradebook.db", "autograded", "feedback", "course_grades.csv"}
"""What the grader writes in the course; everything else must be byte-identical afterwards."""


def tree_hash(course: Path) -> dict[str, str]:
    """Path -> sha256 of every file of the course except the grader's outputs."""
    hashes = {}
    for path in sorted(course.rglob("*")):
        rel = path.relative_to(course)
        if rel.parts[0] in GRADER_OUTPUTS or not path.is_file():
            continue
        hashes[rel.as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return hashes


def check(notebook: Path) -> subprocess.CompletedProcess:
    """The learner's check (``course-check``) on one notebook."""
    return subprocess.run([sys.executable, "-m", "course.grading", "check", str(notebook),
                           "--timeout", "60"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
