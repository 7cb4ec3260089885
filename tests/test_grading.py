"""The graded exercises end to end, with the real nbgrader and a real gradebook (sqlite in a
temporary folder): release, the learner's check, the instructor's grade.

One class is graded in one run (one nbgrader autograde per assignment): a student with every
solution, a student with every untouched release, and the wrong and broken submissions of
tests/grading/mutants.py, each of which states its score and which test cells fail. The fast
tests at the top check the helpers the notebooks' test cells use.
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import llmcore
import llmcore.reference
from course import grading
from course.grading.report import State, Status
from llmcheck.recorder import (ATTENTIONS, PRODUCTS, SOFTMAXES, NotAllowedError, forbid,
                             watch_torch_calls)
from class_runs import ClassRun
from classroom import (ALL_ASSIGNMENTS, ASSIGNMENTS, DATA, ROOT, cell_scores, check, count_grades,
                       load_data, mutants, nbgrader_meta, needs_assignment, read, row_of,
                       selected, submission, submit, submit_all)

CELL_TIMEOUT = 20          # seconds; the submission that loops forever costs one of these
                           # (a first test cell pays the recorder's warm-up: a few seconds)



ASSIGNMENT_MUTANTS = [load_data(f"grading_{path.stem}", path)
                      for path in sorted(DATA.glob("mutants_*.py"))]
"""Exercises 5-11 keep their wrong submissions in a module each (mutants_<notebook>.py)."""
SUBMISSIONS = selected(mutants.WRONG + mutants.BROKEN
                       + [sub for module in ASSIGNMENT_MUTANTS for sub in module.WRONG])


# ------------------------------------------------------------------------------------------------
# The test cells' helpers (no kernel, fast)
# ------------------------------------------------------------------------------------------------

X = torch.arange(12.0).reshape(3, 4) / 10


@pytest.mark.parametrize("call", [
    lambda: torch.softmax(X, -1), lambda: F.softmax(X, -1), lambda: X.softmax(-1),
    lambda: torch.nn.Softmax(dim=-1)(X), lambda: X.log_softmax(-1).exp(),
    lambda: llmcore.softmax(X), lambda: llmcore.softmax_loop(X),
    lambda: torch.from_numpy(llmcore.reference.softmax(X.numpy())),
], ids=["torch", "F", "method", "module", "log_softmax", "llmcore", "llmcore_loop", "reference"])
def test_forbid_catches_every_softmax(call):
    with pytest.raises(NotAllowedError, match="(softmax|NumPy).*compute it yourself.*Use exp"):
        with forbid(*SOFTMAXES, hint="Use exp."):
            call()


@pytest.mark.parametrize("call", [
    lambda: X @ X.T, lambda: torch.matmul(X, X.T), lambda: torch.mm(X, X.T),
    lambda: torch.einsum("ij,kj->ik", X, X), lambda: X[0].dot(X[1]), lambda: F.linear(X, X),
    lambda: np.dot(X.numpy(), X.numpy().T), lambda: llmcore.matmul_loop(X, X.T),
    lambda: llmcore.dot_loop(X[0], X[1]), lambda: torch.ops.aten.mm(X, X.T),
    lambda: torch.linalg.matmul(X, X.T), lambda: torch.linalg.vecdot(X[0], X[1]),
    lambda: np.dot(X.tolist(), X.T.tolist()), lambda: torch.tensordot(X, X.T, 1),
], ids=["@", "matmul", "mm", "einsum", "dot", "F.linear", "numpy", "llmcore_loop", "llmcore_dot",
        "aten.mm", "linalg.matmul", "linalg.vecdot", "numpy_lists", "tensordot"])
def test_forbid_catches_every_product(call):
    with pytest.raises(NotAllowedError):
        with forbid(*PRODUCTS):
            call()


def test_forbid_allows_the_rest_and_restores_everything():
    original = llmcore.softmax
    with forbid(*PRODUCTS, *SOFTMAXES):
        total = (X[0] * X[1]).sum()
        exps = torch.exp(X - X.amax(dim=-1, keepdim=True))
    torch.testing.assert_close(total, X[0] @ X[1])
    torch.testing.assert_close(exps / exps.sum(-1, keepdim=True), llmcore.softmax(X))
    assert np.dot(np.ones(2), np.ones(2)) == 2.0                    # the patched names are back
    assert llmcore.softmax is original and sys.modules["llmcore.softmax"].softmax is original


def test_forbid_names_the_function_the_student_called():
    q = torch.randn(2, 3, 4)
    with pytest.raises(NotAllowedError, match=r"llmcore\.attention\.attention was used"):
        with forbid(*ATTENTIONS):
            llmcore.attention(q, q, q, causal=True)          # through llmcore's own helpers
    with pytest.raises(ValueError, match="must be 'aten.OP'"):
        with forbid("softmax"):
            pass


def test_watch_torch_calls_counts_products_and_rows():
    w = torch.randn(4, 6)
    with watch_torch_calls() as calls:
        y = torch.randn(5, 4) @ w + 1                     # one product of 5 rows
        z = torch.stack([row @ w for row in torch.randn(3, 4)])
    products = [c for c in calls if c.is_product]
    assert [c.name for c in products] == ["mm"] * 4      # aten's name, whatever Python called
    assert [c.rows for c in products] == [5, 1, 1, 1]
    assert all(c.uses(w) for c in products) and not products[0].uses(torch.randn(2))
    assert y.shape == (5, 6) and z.shape == (3, 6)


def test_importing_llmcore_or_the_grader_does_not_import_nbgrader():
    code = ("import sys, llmcore, llmcheck.recorder, course.grading; "
            "assert not [m for m in sys.modules if m.startswith('nbgrader')], 'nbgrader imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# ------------------------------------------------------------------------------------------------
# The notebooks themselves
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_solution_notebooks_are_well_formed(assignment):
    nb = read("solutions", assignment)
    ids = [nbgrader_meta(c).get("grade_id") for c in nb.cells]
    assert None not in ids and len(set(ids)) == len(ids), f"grade ids missing or repeated: {ids}"
    tests = [c for c in nb.cells if nbgrader_meta(c).get("grade")]
    answers = [c for c in nb.cells if nbgrader_meta(c).get("solution")]
    assert answers and all("### BEGIN SOLUTION" in c.source and "### END SOLUTION" in c.source
                           for c in answers)
    assert all(nbgrader_meta(c)["locked"] and nbgrader_meta(c)["points"] > 0 for c in tests)
    hidden = [c for c in tests if "### BEGIN HIDDEN TESTS" in c.source]
    visible = [c for c in tests if "### BEGIN HIDDEN TESTS" not in c.source]
    assert hidden and visible, "each assignment has visible tests to learn from and hidden ones"
    chapters = re.findall(r"\(\.\./\.\./(chapters/[\w.]+\.md)\)", nb.cells[0].source)
    assert chapters, "the recap links to its chapter"
    link = f"../exercises/{assignment}/{ASSIGNMENTS[assignment]}.ipynb"
    for chapter in chapters:
        text = (ROOT / chapter).read_text(encoding="utf-8")
        assert "\n## Practise it\n" in text and link in text.split("\n## Practise it\n")[-1], \
            f"{chapter} does not end with a link to {link} (its section 'Practise it')"


def test_committed_exercises_equal_a_fresh_release(tmp_path):
    written = grading.release(ROOT, release_dir=tmp_path / "exercises")
    assert sorted(p.relative_to(tmp_path / "exercises").as_posix() for p in written) == \
        sorted(f"{a}/{n}.ipynb" for a, n in ALL_ASSIGNMENTS.items())

    def content(nb):
        return {"metadata": nb.metadata,
                "cells": [(c.get("id"), c.cell_type, c.source, c.metadata) for c in nb.cells]}

    for path in written:
        committed = ROOT / "exercises" / path.relative_to(tmp_path / "exercises")
        assert committed.is_file(), f"{committed} is missing: run `make exercises` and commit it"
        assert content(nbformat.read(committed, as_version=4)) == \
            content(nbformat.read(path, as_version=4)), (
            f"{committed} differs from a fresh release of solutions/: run `make exercises` and "
            "commit exercises/")
    for nb_path in written:
        nb = nbformat.read(nb_path, as_version=4)
        text = "\n".join(c.source for c in nb.cells)
        assert "### BEGIN SOLUTION" not in text and "### BEGIN HIDDEN TESTS" not in text


# ------------------------------------------------------------------------------------------------
# The learner's check
# ------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_check_passes_a_solved_notebook_and_prints_each_test(tmp_path):
    solved = tmp_path / "matmul.ipynb"
    nbformat.write(submission("01_matmul", answered=True), str(solved))
    done = check(solved)
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("test_dot", "test_matmul", "test_matmul_error", "test_project"):
        assert f"PASS    {name}:" in done.stdout, done.stdout
    assert "HIDDEN  test_project_hidden: 2 points, run when the notebook is graded" in done.stdout
    assert "Points so far: 5 of 5 (7 more in hidden tests, run when graded)." in done.stdout
    assert "All visible tests pass." in done.stdout


@pytest.mark.slow
def test_check_fails_an_unanswered_notebook_with_the_reason():
    done = check(ROOT / "exercises" / "01_matmul" / "matmul.ipynb")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL    test_dot: 0 of 1 point" in done.stdout, done.stdout
    assert "NotImplementedError: replace this line with your code" in done.stdout
    assert "HIDDEN  test_matmul_hidden: 3 points, run when the notebook is graded" in done.stdout
    assert "Points so far: 0 of 5 (7 more in hidden tests, run when graded)." in done.stdout


def test_check_reports_a_notebook_it_cannot_run(tmp_path):
    broken = tmp_path / "broken.ipynb"
    broken.write_text("{not a notebook")
    report = grading.check(broken)
    assert not report.ok and "could not be run to the end" in report.cell_errors[0]
    assert "ERROR" in grading.format_report(report)


def test_check_refuses_a_missing_notebook():
    done = subprocess.run([sys.executable, "-m", "course.grading", "check", "no/such.ipynb"],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2 and "no notebook at no/such.ipynb" in done.stderr


# ------------------------------------------------------------------------------------------------
# The instructor's grade: one class, one run
# ------------------------------------------------------------------------------------------------

def build_class(course: Path) -> None:
    """The class: a student with every solution, one with every untouched release, and the
    wrong and broken submissions."""
    for assignment in ASSIGNMENTS:
        submit(course, "full_marks", assignment, submission(assignment, answered=True))
        submit(course, "untouched", assignment, submission(assignment, answered=False))
    submit_all(course, SUBMISSIONS)


CLASS = ClassRun("test_grading", "graded", timeout=CELL_TIMEOUT,
                 what=f"notebooks (including one {CELL_TIMEOUT} s cell timeout)")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The whole class graded once (tests/class_runs.py); returns (course folder, gradebook
    path, CSV rows, seconds)."""
    run = CLASS.graded(tmp_path_factory, build_class)
    return run.course, run.course / "gradebook.db", run.rows, run.seconds


@pytest.mark.slow
@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_every_solution_scores_full_marks(graded, assignment):
    course, gradebook, rows, _ = graded
    row = row_of(rows, "full_marks", assignment)
    assert row.status == Status(State.GRADED) and row.max_score > 0 \
        and row.score == row.max_score, row
    failed = {name for name, (score, top) in cell_scores(gradebook, "full_marks", assignment).items()
              if score < top}
    assert not failed


@pytest.mark.slow
@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_every_untouched_release_scores_zero(graded, assignment):
    course, gradebook, rows, _ = graded
    row = row_of(rows, "untouched", assignment)
    assert row.status == Status(State.GRADED) and row.score == 0 and row.max_score > 0, row


@pytest.mark.slow
@pytest.mark.parametrize("sub", SUBMISSIONS, ids=[s.student for s in SUBMISSIONS])
def test_wrong_and_broken_submissions_get_their_score(graded, sub):
    course, gradebook, rows, _ = graded
    cells = cell_scores(gradebook, sub.student, sub.assignment)
    points = {name: top for name, (_, top) in cells.items()}
    assert sub.failing <= set(points), f"unknown test cells {sub.failing - set(points)}"
    assert sub.score == sum(points.values()) - sum(points[name] for name in sub.failing), \
        "the stated score must equal the points of the test cells that pass"
    failed = {name for name, (score, top) in cells.items() if score < top}
    assert failed == sub.failing, f"{sub.why}: expected {sorted(sub.failing)} to fail, " \
                                  f"got {sorted(failed)}"
    row = row_of(rows, sub.student, sub.assignment)
    assert row.score == sub.score, row
    assert (row.status.state is State.FAILED) == sub.stops_grader, row


@pytest.mark.slow
@needs_assignment("01_matmul")
@needs_assignment("02_attention")
@needs_assignment("04_kv_cache")
def test_a_broken_submission_does_not_stop_the_run(graded):
    course, gradebook, rows, _ = graded
    students = {(r.student, r.assignment) for r in rows}
    expected = {("full_marks", a) for a in ASSIGNMENTS} | {("untouched", a) for a in ASSIGNMENTS} \
        | {(s.student, s.assignment) for s in SUBMISSIONS}
    assert students == expected
    dead = row_of(rows, "kernel_dies", "04_kv_cache")
    assert dead.status.state is State.FAILED and "kernel" in dead.status.detail.lower(), dead
    for student, assignment in expected:
        page = course / "feedback" / student / assignment / f"{ASSIGNMENTS[assignment]}.html"
        assert page.is_file() and page.stat().st_size > 0, f"no feedback for {student}/{assignment}"
    flooded = course / "autograded" / "prints" / "02_attention" / "attention.ipynb"
    assert flooded.stat().st_size < 500_000, "a cell's megabytes of output must be cut short"
    assert "output truncated by the grader" in flooded.read_text()
    hung = json.loads((course / "autograded" / "loops_forever" / "01_matmul" /
                       "matmul.ipynb").read_text())
    errors = [o.get("ename") for c in hung["cells"] for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert "CellTimeoutError" in errors or "KeyboardInterrupt" in errors, errors
    with open(course / "course_grades.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert {(r["student_id"], r["assignment"]) for r in table} == expected
    assert list(table[0]) == ["student_id", "assignment", "score", "max_score", "status",
                              "reasons"]


@pytest.mark.slow
@needs_assignment("01_matmul")
def test_grading_again_keeps_every_grade(graded):
    """A later run (the instructor's command line) grades only the new submission; nothing
    already in the gradebook changes."""
    course, gradebook, rows, _ = graded
    before = count_grades(gradebook)
    submit(course, "late", "01_matmul", submission("01_matmul", answered=True))
    grades = course / "second.csv"
    done = subprocess.run(
        [sys.executable, "-m", "course.grading", "grade", "--course-dir", str(course),
         "--gradebook", str(gradebook), "--csv", str(grades), "--timeout", str(CELL_TIMEOUT),
         "--no-feedback"], cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout + done.stderr
    with open(grades, newline="") as f:
        again = {(r["student_id"], r["assignment"]): r for r in csv.DictReader(f)}
    late = again.pop(("late", "01_matmul"))
    assert late["status"] == "graded" and late["score"] == late["max_score"] == "12", late
    assert {key: float(r["score"]) for key, r in again.items()} == \
        {(r.student, r.assignment): r.score for r in rows}
    assert not [r for r in again.values() if r["status"] == "graded"], \
        "only the new submission is graded again"
    assert "late" in done.stdout and "grades:" in done.stdout
    assert count_grades(gradebook) == before + len(cell_scores(gradebook, "late", "01_matmul"))
