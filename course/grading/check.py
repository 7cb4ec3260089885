"""The learner's check: run one notebook in a fresh kernel and report each visible test.

The tests come from the release (``exercises/<assignment>/<notebook>.ipynb`` of the course that
holds the notebook, or of the working directory's course), never from the learner's copy: a test
cell changed or deleted there is reported as ALTERED and the released one runs in its place. A
test that ran but published none of its records (course/grading/VERDICTS.md), or whose records
show a violation or a switched-off check, fails.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import cells
from .nbgrader_app import last_error_line, prepare_environment, find_config
from .integrity import audit_evidence
from .review import review_evidence
from .verdicts import learner_sources, records_of, show_stderr_unscored

HIDDEN_MARK = "### BEGIN HIDDEN TESTS"


@dataclass(frozen=True)
class Footprint:
    """A size-capped case's memory: the largest tensor its call allocated (elements of one
    storage, and the shape that had them) against the most the test allows (its
    ``max_elements``, course/grading/VERDICTS.md)."""

    case: str
    elements: int
    shape: tuple[int, ...]
    allowed: int

    def describe(self) -> str:
        """One line for the learner: how close the case came to its cap, or how far past it."""
        held = f"largest tensor {self.shape}, {self.elements} elements"
        if self.elements <= self.allowed:
            share = f"{self.elements / self.allowed:.0%} of the {self.allowed} allowed"
        else:
            share = f"{self.elements / self.allowed:.1f} times the {self.allowed} allowed"
        return f"memory: {held}, {share} (case {self.case!r})"


@dataclass(frozen=True)
class CellResult:
    """One test cell of a checked notebook."""

    grade_id: str
    points: float
    score: float | None          # None: hidden tests that only run when the notebook is graded
    message: str                 # the error's last line when the cell failed, else ""
    hidden: bool                 # the cell holds hidden tests (a solution notebook's)
    footprints: tuple[Footprint, ...] = ()   # its size-capped cases, as they ran

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
    edited_tests: tuple[str, ...]    # read-only cells changed or deleted (the released ones ran)
    release: Path | None = None      # the released notebook whose tests ran
    review: tuple[str, ...] = ()     # what the grader shows the instructor (costs no point)
    solution: bool = False           # the instructor's own notebook (solutions/), hidden tests run

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
            return "wrote to stderr: " + last_error_line(out.text)
    return ""


def _released(path: Path) -> tuple[Path | None, Path | None, bool]:
    """(course config, released notebook, is a solution) for a notebook: the course that holds
    it, else the working directory's; the release with the same assignment folder and name, else
    the one with the same name. A notebook in the course's source directory (``solutions/``) is
    the instructor's own: it is checked as it is, hidden tests included, with no release."""
    for config_path in (find_config(path), find_config(Path.cwd())):
        if config_path is None:
            continue
        from traitlets.config.loader import PyFileConfigLoader
        loaded = PyFileConfigLoader(config_path.name, path=str(config_path.parent)).load_config()
        directories = loaded.get("CourseDirectory", {})
        source = (config_path.parent / directories.get("source_directory", "source")).resolve()
        if source in path.parents:
            return config_path, None, True
        release = config_path.parent / directories.get("release_directory", "release")
        same = release / path.parent.name / path.name
        if same.is_file():
            return config_path, same, False
        found = sorted(release.glob(f"*/{path.name}"))
        if len(found) == 1:
            return config_path, found[0], False
    return None, None, False


def _restore_tests(nb, released) -> list[str]:
    """Put every read-only cell of the release (tests and given code) into ``nb`` in place of the
    learner's version; a deleted one is put back after its predecessor. Returns the grade_ids of
    the cells that were changed or missing."""
    def grade_id(cell):
        return cell.metadata.get("nbgrader", {}).get("grade_id")

    altered = []
    mine = {grade_id(c): i for i, c in enumerate(nb.cells) if grade_id(c)}
    previous = -1
    for cell in released.cells:
        gid = grade_id(cell)
        if gid is None:
            continue
        locked = cells.is_locked(cell) or (cells.is_grade(cell) and not cells.is_solution(cell))
        if gid in mine:
            index = mine[gid]
            if locked and (nb.cells[index].source != cell.source
                           or nb.cells[index].cell_type != cell.cell_type):
                altered.append(gid)
                nb.cells[index] = cell
            previous = index
        elif locked:
            altered.append(gid)
            nb.cells.insert(previous + 1, cell)
            mine = {grade_id(c): i for i, c in enumerate(nb.cells) if grade_id(c)}
            previous = mine[gid]
    return altered


def _config(config_path: Path | None, timeout: int | None):
    """The course's configuration (its nbgrader_config.py, read as nbgrader reads it, without
    nbgrader) with the cell timeout if given: the executor's and the sandbox's limits."""
    from traitlets.config import Config
    from traitlets.config.loader import PyFileConfigLoader
    config = Config()
    if config_path is not None:
        config.merge(PyFileConfigLoader(config_path.name,
                                        path=str(config_path.parent)).load_config())
    if timeout is not None:
        config.Execute.timeout = int(timeout)
    return config


def _execute(nb, config, folder: str, on_cell: Callable | None = None, standby: bool = False):
    """``nb`` executed in a fresh kernel by the grader's bounded executor (its sandbox, preloads
    and output cap; timed, course/grading/profiling.py), from ``folder``, with nbgrader's
    validation environment; ``on_cell(index, cell)`` after each code cell. ``standby``: the
    kernel is taken from this user's standby if one was made the same way, and a standby is
    left for the next check (course/grading/standby.py)."""
    from .profiling import ProfiledExecute   # here: importing the check imports no nbconvert
    from .standby import StandbyKernelManager, leave
    saved = {name: os.environ.get(name) for name in ("NBGRADER_VALIDATING", "NBGRADER_EXECUTION")}
    os.environ.update(NBGRADER_VALIDATING="1", NBGRADER_EXECUTION="validate")
    # a class of this check's own: its last_spec is this check's kernel, whatever other checks
    # of the process do
    manager = type("CheckKernelManager", (StandbyKernelManager,), {}) if standby else None
    try:
        executor = ProfiledExecute(config=config, **(
            {"kernel_manager_class": manager} if manager is not None else {}))
        executor.on_cell = on_cell
        executed, _ = executor.preprocess(nb, {"metadata": {"path": folder}})
        return executed
    finally:
        if manager is not None and manager.last_spec is not None:
            leave(manager.last_spec)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def check(notebook: str | os.PathLike, *, timeout: int | None = None,
          config_file: str | os.PathLike | None = None,
          on_test: Callable[["CellResult"], None] | None = None,
          standby: bool | None = None) -> CheckReport:
    """Run a notebook in a fresh kernel (nbclient, with the grader's limits and sandbox) with the
    release's test cells, and report every test cell: pass or fail with its message, and the
    points it is worth; ``on_test`` gets each test cell's result as soon as it has run. The
    instructor's own notebook (in ``solutions/``) runs as it is, hidden tests included. Needs no
    nbgrader (course/grading/cells.py reads its metadata). ``standby``: take the kernel a
    previous check started for this one and leave one for the next (course/grading/standby.py;
    None: unless ``COURSE_CHECK_STANDBY=0``)."""
    from .standby import enabled
    prepare_environment()
    standby = enabled() if standby is None else standby
    import tempfile

    import nbformat

    path = Path(notebook).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"check: no notebook at {notebook}")
    course_file, release, solution = _released(path)
    config = _config(Path(config_file) if config_file else
                     course_file or find_config(path) or find_config(Path.cwd()), timeout)
    altered: list[str] = []

    def ran(index, cell):
        if on_test is not None and cells.is_test(cell):
            on_test(_test_result(index, cell))

    try:
        nb = nbformat.read(str(path), as_version=4)
        if release is not None and release.resolve() != path:
            altered = _restore_tests(nb, nbformat.read(str(release), as_version=4))
        changed = cells.type_changes(nb)
        if changed:
            return CheckReport(path, (), (), tuple(f"a {old} cell became {new}"
                                                   for old, new in changed), release,
                               solution=solution)
        problems = cells.metadata_problems(nb)
        if problems:
            raise ValueError("the nbgrader metadata of the notebook is damaged: "
                             + "; ".join(problems))
        for cell in nb.cells:                      # nbconvert's ClearOutput, as nbgrader does
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
        with tempfile.TemporaryDirectory(prefix="course-check-") as folder:
            nbformat.write(nb, str(Path(folder) / path.name))
            executed = _execute(nb, config, folder, ran, standby)
    except Exception as error:          # the kernel died, or the notebook is not a notebook
        reason = f"{type(error).__name__}: {error}".strip().splitlines()[0]
        return CheckReport(path, (), (f"the notebook could not be run to the end ({reason})",),
                           tuple(altered), release, solution=solution)
    tests, errors = [], []
    for index, cell in enumerate(executed.cells):
        if cell.cell_type != "code":
            continue
        if cells.is_test(cell):
            tests.append(_test_result(index, cell))
        else:
            message = _error_text(cell)
            if message:
                first = (cell.source.strip().splitlines() or ["(empty)"])[0][:60]
                errors.append(f"cell {index} ({first}): {message}")
    evidence = review_evidence(learner_sources(executed)) + audit_evidence(executed.cells)
    return CheckReport(path, tuple(tests), tuple(errors), tuple(altered), release,
                       tuple(evidence), solution)


def _test_result(index: int, cell) -> CellResult:
    """One executed test cell's result (hidden tests of a release: None, run when graded)."""
    grade_id = cell.metadata.nbgrader.get("grade_id", f"cell {index}")
    hidden = HIDDEN_MARK in cell.source
    if not _code_lines(cell.source):
        return CellResult(grade_id, float(cell.metadata.nbgrader["points"]), None, "", True)
    if not any(out.get("output_type") == "error" for out in cell.outputs):
        show_stderr_unscored(cell)       # a warning is shown, not scored (idempotent)
    score, points = cells.test_score(cell)
    message = _error_text(cell) if score < points else ""
    if not message:
        message = _record_problem(cell)
    return CellResult(grade_id, points, 0.0 if message else float(score), message, hidden,
                      footprints(cell))


def footprints(cell) -> tuple[Footprint, ...]:
    """The memory of every size-capped case a test cell ran (its records with ``max_elements``),
    in the order they ran. The records are the learner's kernel's own: a figure to learn from,
    which the grader decides again against the solution's."""
    found = []
    for record in records_of(cell):
        options, largest = record.get("options"), record.get("largest")
        if not isinstance(options, dict) or not isinstance(largest, dict):
            continue
        allowed, elements = options.get("max_elements"), largest.get("elements")
        shape = largest.get("shape")
        if isinstance(allowed, int) and allowed > 0 and isinstance(elements, int) \
                and isinstance(shape, list) and all(isinstance(n, int) for n in shape):
            found.append(Footprint(str(record.get("case", "?")), elements, tuple(shape), allowed))
    return tuple(found)


def _record_problem(cell) -> str:
    """'' when a passing test cell's records hold up as far as the learner's side can tell (the
    expected values live with the grader), else why not."""
    if "Test(" not in cell.source:
        return ""                            # a test written before records (no harness)
    records = records_of(cell)
    if not records:
        return ("the test published none of its records, so it did not run as written (was it "
                "changed while the notebook ran?)")
    for record in records:
        if record.get("violations"):
            return str(record["violations"][0])
        canaries = record.get("canaries") or {}
        if not all(v is True for v in canaries.values()):
            off = ", ".join(sorted(k for k, v in canaries.items() if v is not True))
            return f"tampering detected: a check was switched off ({off})"
    return ""


def heading(report_or_path, release: Path | None = None, solution: bool = False) -> str:
    """The check's first line: which notebook, and whose tests."""
    name = Path(report_or_path).name
    if solution:
        return (f"Checked {name} in a fresh kernel: a solution notebook (solutions/), run with "
                "its own tests, hidden tests included.")
    return f"Checked {name} in a fresh kernel" + (f", with the tests of {release}." if release
                                                  else ".")


def format_test(test: CellResult) -> list[str]:
    """A test cell's lines in the report: its verdict, then its message and memory figures."""
    points = f"{test.points:g} point{'s' if test.points != 1 else ''}"
    if test.score is None:
        return [f"  HIDDEN  {test.grade_id}: {points}, run when the notebook is graded"]
    label = test.grade_id + (" (hidden tests)" if test.hidden else "")
    lines = [f"  {test.status:<6}  {label}: {test.score:g} of {points}"]
    if test.message:
        message = test.message if len(test.message) < 600 else test.message[:600] + " ..."
        lines.append("          " + message.replace("\n", "\n          "))
    lines.extend("          " + footprint.describe() for footprint in test.footprints)
    return lines


def format_report(report: CheckReport, *, streamed: bool = False) -> str:
    """The whole report; ``streamed``: without the heading and the tests' lines (printed as
    each test finished)."""
    lines = [] if streamed else [heading(report.notebook, report.release, report.solution)]
    if not streamed:
        for test in report.tests:
            lines.extend(format_test(test))
    elif report.release is not None:
        lines.append(f"  (the tests of {report.release} ran)")
    for error in report.cell_errors:
        lines.append(f"  ERROR   {error}")
    if report.review:
        lines.append("  NOTE    your code " + ", ".join(report.review[:5]) + ": the grader shows "
                     "this to your instructor for review (it costs no point)")
    for cell in report.edited_tests:
        lines.append(f"  ALTERED {cell}: your copy of this read-only cell differs from the release "
                     "(or is missing); the released one ran, and grading runs it too")
    hidden = f" ({report.hidden_points:g} more in hidden tests, run when graded)" \
        if report.hidden_points else ""
    lines.append(f"Points so far: {report.points:g} of {report.max_points:g}{hidden}.")
    lines.append(("All tests pass, hidden ones included." if report.solution else
                  "All visible tests pass.") if report.ok else
                 "Not done yet: fix what FAILs or ERRORs above and check again.")
    return "\n".join(lines)

