"""The learner's check: run one notebook in a fresh kernel and report each visible test."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .limits import bounded_execute
from .nbgrader_app import _last_error_line, _prepare_environment, course_config

HIDDEN_MARK = "### BEGIN HIDDEN TESTS"


@dataclass(frozen=True)
class CellResult:
    """One test cell of a checked notebook."""

    grade_id: str
    points: float
    score: float | None          # None: hidden tests that only run when the notebook is graded
    message: str                 # the error's last line when the cell failed, else ""
    hidden: bool                 # the cell holds hidden tests (a solution notebook's)

    @property
    def status(self) -> str:
        if self.score is None:
            return "HIDDEN"
        return "PASS" if self.score >= self.points else "FAIL"


@dataclass(frozen=True)
class CheckReport:
    notebook: Path
    tests: tuple[CellResult, ...]
    cell_errors: tuple[str, ...]     # errors in cells that are not tests (your code)
    edited_tests: tuple[str, ...]    # read-only cells changed (grading restores them)

    @property
    def points(self) -> float:
        return sum(t.score for t in self.tests if t.score is not None)

    @property
    def max_points(self) -> float:
        return sum(t.points for t in self.tests if t.score is not None)

    @property
    def hidden_points(self) -> float:
        return sum(t.points for t in self.tests if t.score is None)

    @property
    def ok(self) -> bool:
        return (all(t.status != "FAIL" for t in self.tests) and not self.cell_errors
                and not self.edited_tests)


def _code_lines(source: str) -> list[str]:
    return [line for line in source.splitlines()
            if line.strip() and not line.strip().startswith("#")]



def _error_text(cell) -> str:
    errors = [out.ename for out in cell.get("outputs", []) if out.output_type == "error"]
    if "CellTimeoutError" in errors or "KeyboardInterrupt" in errors:
        return ("CellTimeoutError: the cell ran past the time limit and was interrupted (a loop "
                "that never ends?)")
    for out in cell.get("outputs", []):
        if out.output_type == "error":
            return f"{out.ename}: {out.evalue}" if out.evalue else out.ename
    for out in cell.get("outputs", []):
        if out.output_type == "stream" and out.name == "stderr":
            return "wrote to stderr: " + _last_error_line(out.text)
    return ""


def check(notebook: str | os.PathLike, *, timeout: int | None = None,
          config_file: str | os.PathLike | None = None) -> CheckReport:
    """Run a notebook in a fresh kernel (nbgrader's Validator, bounded like the grader) and
    report every test cell: pass or fail with its message, and the points it is worth."""
    _prepare_environment()
    from nbgrader import utils
    from nbgrader.preprocessors import CheckCellMetadata, ClearOutput
    from nbgrader.validator import Validator
    from traitlets import List

    path = Path(notebook).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"check: no notebook at {notebook}")
    config = course_config(path.parent, timeout=timeout, config_file=config_file)

    class Checker(Validator):
        preprocessors = List([CheckCellMetadata, ClearOutput, bounded_execute()])

        def _preprocess(self, nb):
            self.executed = super()._preprocess(nb)
            return self.executed

    checker = Checker(config=config)
    checker.ignore_checksums = False
    try:
        found = checker.validate(str(path))
    except Exception as error:          # the kernel died, or the notebook is not a notebook
        reason = f"{type(error).__name__}: {error}".strip().splitlines()[0]
        return CheckReport(path, (), (f"the notebook could not be run to the end ({reason})",), ())
    edited = tuple(c["source"].splitlines()[0] if c["source"] else "(empty cell)"
                   for c in found.get("changed", []))
    if "type_changed" in found:
        changed = tuple(f"a {c['old_type']} cell became {c['new_type']}"
                        for c in found["type_changed"])
        return CheckReport(path, (), (), changed)
    tests, errors = [], []
    for index, cell in enumerate(checker.executed.cells):
        if cell.cell_type != "code":
            continue
        if utils.is_grade(cell) and not utils.is_solution(cell):
            grade_id = cell.metadata.nbgrader.get("grade_id", f"cell {index}")
            hidden = HIDDEN_MARK in cell.source
            if not _code_lines(cell.source):
                tests.append(CellResult(grade_id, float(cell.metadata.nbgrader["points"]), None,
                                        "", True))
                continue
            score, points = utils.determine_grade(cell)
            message = _error_text(cell) if score < points else ""
            tests.append(CellResult(grade_id, points, float(score), message, hidden))
        else:
            message = _error_text(cell)
            if message:
                first = (cell.source.strip().splitlines() or ["(empty)"])[0][:60]
                errors.append(f"cell {index} ({first}): {message}")
    return CheckReport(path, tuple(tests), tuple(errors), edited)


def format_report(report: CheckReport) -> str:
    lines = [f"Checked {report.notebook.name} in a fresh kernel."]
    for test in report.tests:
        points = f"{test.points:g} point{'s' if test.points != 1 else ''}"
        if test.score is None:
            lines.append(f"  HIDDEN  {test.grade_id}: {points}, run when the notebook is graded")
            continue
        label = test.grade_id + (" (hidden tests)" if test.hidden else "")
        lines.append(f"  {test.status:<6}  {label}: {test.score:g} of {points}")
        if test.message:
            message = test.message if len(test.message) < 600 else test.message[:600] + " ..."
            lines.append("          " + message.replace("\n", "\n          "))
    for error in report.cell_errors:
        lines.append(f"  ERROR   {error}")
    for cell in report.edited_tests:
        lines.append(f"  EDITED  a read-only cell was changed ({cell!r}); grading runs the "
                     "original, so undo the change")
    hidden = f" ({report.hidden_points:g} more in hidden tests, run when graded)" \
        if report.hidden_points else ""
    lines.append(f"Points so far: {report.points:g} of {report.max_points:g}{hidden}.")
    lines.append("All visible tests pass." if report.ok else
                 "Not done yet: fix what FAILs or ERRORs above and check again.")
    return "\n".join(lines)

