"""course/grading/cells.py reads nbgrader's cell metadata and scores test cells as nbgrader does,
without nbgrader (the learner's install has none): held against nbgrader itself on every cell of
the course's notebooks and on the outputs that decide a score. The last test runs the learner's
check in a process where nbgrader cannot be imported."""

from __future__ import annotations

import subprocess
import sys

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_output

from classroom import ROOT, submission
from course.grading import cells

nbgrader_utils = pytest.importorskip("nbgrader.utils", reason="the comparison needs nbgrader "
                                                                "(the instructor's install)")

NOTEBOOKS = sorted([*ROOT.glob("solutions/*/*.ipynb"), *ROOT.glob("exercises/*/*.ipynb")])


def _test_cell(outputs, points=3, **meta):
    cell = new_code_cell("x = 1")
    cell.metadata["nbgrader"] = {"grade": True, "solution": False, "locked": False,
                                 "grade_id": "t", "points": points, "schema_version": 3, **meta}
    cell.outputs = outputs
    return cell


def test_every_cell_of_the_course_reads_as_nbgrader_reads_it():
    assert NOTEBOOKS, "no notebooks found"
    seen_tests = 0
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            where = f"{path.relative_to(ROOT)}, {cell.metadata.get('nbgrader', {}).get('grade_id')}"
            assert cells.is_grade(cell) == bool(nbgrader_utils.is_grade(cell)), where
            assert cells.is_solution(cell) == bool(nbgrader_utils.is_solution(cell)), where
            assert cells.is_locked(cell) == bool(nbgrader_utils.is_locked(cell)), where
            if cells.is_test(cell):
                seen_tests += 1
                assert cells.test_score(cell) == nbgrader_utils.determine_grade(cell), where
        assert cells.metadata_problems(nb) == [] and cells.type_changes(nb) == [], path
    assert seen_tests >= 2 * len(NOTEBOOKS)


@pytest.mark.parametrize("outputs", [
    [],
    [new_output("stream", name="stdout", text="fine\n")],
    [new_output("stream", name="stderr", text="a warning\n")],
    [new_output("error", ename="AssertionError", evalue="no", traceback=[])],
    [new_output("execute_result", data={"text/plain": "1.5"}, execution_count=1)],
    [new_output("execute_result", data={"text/plain": "'a string'"}, execution_count=1)],
    [new_output("execute_result", data={"text/plain": "-2"}, execution_count=1)],
    [new_output("execute_result", data={"text/plain": "0"}, execution_count=1),
     new_output("error", ename="ValueError", evalue="late", traceback=[])],
    [new_output("stream", name="stdout", text="x"),
     new_output("error", ename="ValueError", evalue="", traceback=[])],
], ids=["nothing", "stdout", "stderr", "error", "partial", "not-a-number", "negative",
        "result-then-error", "stdout-then-error"])
def test_a_test_cell_scores_as_nbgrader_scores_it(outputs):
    cell = _test_cell(outputs)
    assert cells.test_score(cell) == nbgrader_utils.determine_grade(cell)


def test_partial_credit_above_the_points_is_refused_and_non_tests_have_no_score():
    above = _test_cell([new_output("execute_result", data={"text/plain": "4"}, execution_count=1)])
    with pytest.raises(ValueError, match="more than its 3 points"):
        cells.test_score(above)
    answer = _test_cell([], solution=True)
    with pytest.raises(ValueError, match="expected a test cell"):
        cells.test_score(answer)


def test_metadata_problems_and_type_changes_name_the_cell():
    first, copy = _test_cell([]), _test_cell([])
    no_points = _test_cell([], grade_id="p")
    del no_points.metadata["nbgrader"]["points"]
    made_markdown = new_markdown_cell("def f(): ...")
    made_markdown.metadata["nbgrader"] = {"grade": False, "solution": True, "locked": False,
                                          "grade_id": "f", "cell_type": "code"}
    nb = nbformat.v4.new_notebook(cells=[first, copy, no_points, made_markdown])
    problems = cells.metadata_problems(nb)
    assert problems == ["the grade_id t appears more than once (a copied cell?)",
                        "the grade cell p has no points"]
    assert cells.type_changes(nb) == [("code", "markdown")]


def test_the_executor_has_nbgrader_executes_settings():
    from nbgrader.preprocessors import Execute as NbgraderExecute
    ours, theirs = cells.execute_class()(), NbgraderExecute()
    for name in cells.EXECUTE_DEFAULTS:
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.kernel_manager_class is theirs.kernel_manager_class
    assert cells.execute_class().__name__ == "Execute"        # c.Execute.* configures it


@pytest.mark.slow
def test_the_learners_check_runs_without_nbgrader(tmp_path):
    """The learner's profile has no nbgrader: the check imports none of it and still grades
    exercise 1's visible tests (nbgrader blocked in the checking process)."""
    solved = tmp_path / "01_matmul" / "matmul.ipynb"
    solved.parent.mkdir()
    nbformat.write(submission("01_matmul", answered=True), str(solved))
    code = (
        "import sys\n"
        "sys.modules['nbgrader'] = None        # import nbgrader raises ImportError\n"
        "from course.grading.check import check, format_report\n"
        f"report = check({str(solved)!r}, timeout=60)\n"
        "print(format_report(report))\n"
        "assert not [m for m in sys.modules if m.startswith('nbgrader.')]\n"
        "sys.exit(0 if report.ok else 1)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Points so far: 5 of 5 (7 more in hidden tests, run when graded)." in done.stdout
