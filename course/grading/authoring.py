"""Instructors' own graded exercises: a scaffold to start from, and a mutation check.

* :func:`scaffold` writes ``solutions/<assignment>/<notebook>.ipynb``: a small complete exercise
  in the course's layout (a recap with its chapter link, an answer cell, a visible and a hidden
  test cell on ``llmcheck``), to be edited into the instructor's own. It never overwrites.
* :func:`mutation_check` grades wrong solutions against the hidden tests, with the course's real
  grader (sandboxed), next to the solution itself: each mutant must lose points. A mutant is a
  file of answer cells only (:func:`read_mutant`); every answer cell it does not name keeps the
  solution's code. The result says, per mutant, its score and the tests that caught it.

course/grading/AUTHORING.md is the guide; ``python -m course.grading scaffold`` and
``python -m course.grading mutation-check`` are the commands.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .report import Status

CELL_MARK = re.compile(r"^# %% \[(?P<grade_id>[\w.-]+)\][ \t]*$", re.MULTILINE)
"""The line that opens one answer cell in a mutant file: ``# %% [grade_id]``."""

SOLUTION_BEGIN, SOLUTION_END = "### BEGIN SOLUTION", "### END SOLUTION"
HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"


# ------------------------------------------------------------------------------ the scaffold

INTRO = """# Exercise: {title}

**Recap** ([{chapter_title}]({chapter})). Replace this text with what the exercise recalls from
its chapter, and what the learner writes. Say which library calls are allowed: here, no matrix
product (`@`, `torch.matmul`, `mm`, `einsum`...) may be used; elementwise operations and sums are
fine.

Run `course-check {notebook}.ipynb` to run the visible tests; hidden tests with other shapes
decide the grade."""

ANSWER = '''def row_dots(a, b):
    """The dot product of each row of a with the same row of b.

    a, b: (n, k) -> (n,).
    """
    ### BEGIN SOLUTION
    if a.shape != b.shape or a.dim() != 2:
        raise ValueError(f"expected two (n, k) tensors of one shape, got {tuple(a.shape)} "
                         f"and {tuple(b.shape)}")
    return (a * b).sum(dim=1)
    ### END SOLUTION'''

VISIBLE_TEST = '''import torch
from llmcheck.cases import Test
from llmcheck.recorder import PRODUCTS
from llmcore.testing import assert_close

test = Test("test_row_dots", forbid=PRODUCTS, hint="Multiply elementwise, then sum each row.")
a = torch.tensor([[1.0, 2.0], [3.0, 4.0], [0.5, -1.0]])
b = torch.tensor([[5.0, 6.0], [7.0, 8.0], [2.0, 2.0]])
got = test.call(row_dots, a, b, case="3 rows of 2")
assert_close(got, torch.tensor([17.0, 53.0, -1.0]), name="row_dots of 3 rows")
error = test.raises(ValueError, row_dots, a, b[:2], case="shapes differ", match=r"\\(3, 2\\)",
                    explain="the message names both shapes")'''

HIDDEN_TEST = '''# Hidden tests (they run when the notebook is graded): other shapes, float64.
### BEGIN HIDDEN TESTS
import numpy as np
import torch
from llmcheck.cases import Test
from llmcheck.recorder import PRODUCTS
from llmcore.testing import assert_close, randn

test = Test("test_row_dots_hidden", forbid=PRODUCTS)
rng = np.random.default_rng(7)
for n, k in [(1, 5), (6, 3), (4, 17)]:
    a = randn(rng, n, k).double()
    b = randn(rng, n, k).double()
    got = test.call(row_dots, a, b, case=f"{n}x{k} float64")
    assert_close(got, (a * b).sum(dim=1), name=f"row_dots of {n}x{k}")
### END HIDDEN TESTS'''


def _meta(grade_id: str, *, solution: bool = False, points: int = 0) -> dict:
    meta = {"grade": points > 0, "grade_id": grade_id, "locked": not solution,
            "schema_version": 3, "solution": solution, "task": False}
    if points:
        meta["points"] = points
    cell = {"nbgrader": meta}
    if not solution:
        cell.update(deletable=False, editable=False)
    return cell


def scaffold(course_dir: str | Path, assignment: str, *, notebook: str | None = None,
             title: str | None = None, chapter: str = "chapters/02_vectors_to_matrices.md",
             chapter_title: str = "Chapter 2, From vectors of vectors to matrices") -> Path:
    """Write ``solutions/<assignment>/<notebook>.ipynb`` (notebook: the assignment's name without
    a leading number) from the template; refuse if it exists. Returns its path."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    if not re.fullmatch(r"[A-Za-z0-9][\w-]*", assignment):
        raise ValueError(f"scaffold: an assignment name is letters, digits, _ and -, got "
                         f"{assignment!r}")
    notebook = notebook or re.sub(r"^\d+_", "", assignment)
    path = Path(course_dir) / "solutions" / assignment / f"{notebook}.ipynb"
    if path.exists():
        raise FileExistsError(f"scaffold: {path} exists; choose another assignment name")
    nb = new_notebook(metadata={"kernelspec": {"display_name": "Python 3 (ipykernel)",
                                               "language": "python", "name": "python3"},
                                "language_info": {"name": "python"}})
    intro = INTRO.format(title=title or notebook.replace("_", " "), chapter=f"../../{chapter}",
                         chapter_title=chapter_title, notebook=notebook)
    nb.cells = [
        new_markdown_cell(intro, id="intro", metadata=_meta("intro")),
        new_code_cell("import torch", id="setup", metadata=_meta("setup")),
        new_code_cell(ANSWER, id="row_dots", metadata=_meta("row_dots", solution=True)),
        new_code_cell(VISIBLE_TEST, id="test_row_dots", metadata=_meta("test_row_dots", points=2)),
        new_code_cell(HIDDEN_TEST, id="test_row_dots_hidden",
                      metadata=_meta("test_row_dots_hidden", points=3)),
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


# ------------------------------------------------------------------------------ mutants

def read_mutant(text: str, source: str = "mutant") -> dict[str, str]:
    """grade_id -> source of each answer cell in a mutant file: cells opened by a line
    ``# %% [grade_id]`` (anything before the first one is a comment for the reader)."""
    marks = list(CELL_MARK.finditer(text))
    if not marks:
        raise ValueError(f"{source}: no answer cell; open each with a line '# %% [grade_id]'")
    cells = {}
    for mark, following in zip(marks, [*marks[1:], None]):
        grade_id = mark["grade_id"]
        if grade_id in cells:
            raise ValueError(f"{source}: answer cell {grade_id!r} given twice")
        end = following.start() if following else len(text)
        cells[grade_id] = text[mark.end():end].strip("\n")
    return cells


def answers_of(solution) -> dict[str, str]:
    """grade_id -> the solution's code of each answer cell, without nbgrader's markers."""
    from .cells import is_solution
    return {cell.metadata["nbgrader"]["grade_id"]: "\n".join(
                line for line in cell.source.splitlines()
                if line.strip() not in (SOLUTION_BEGIN, SOLUTION_END))
            for cell in solution.cells if is_solution(cell)}


def submission_with(release, answers: dict[str, str], changed: dict[str, str], *,
                    source: str = "mutant"):
    """The released notebook with every answer cell filled: ``changed``'s code where it names
    the cell, the solution's ``answers`` elsewhere. A name that is no answer cell is an error."""
    import copy
    nb = copy.deepcopy(release)
    unknown = set(changed) - set(answers)
    if unknown:
        raise ValueError(f"{source}: {sorted(unknown)} are not answer cells of the notebook "
                         f"(its answer cells: {sorted(answers)})")
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell.source = changed.get(grade_id, answers[grade_id])
    return nb


@dataclass(frozen=True)
class MutantResult:
    """One graded mutant: its score, the full marks, and the test cells that caught it."""

    name: str
    score: float
    max_score: float
    caught_by: tuple[str, ...]
    status: Status

    @property
    def survived(self) -> bool:
        """Full marks: no test told this wrong solution from the right one."""
        return self.max_score > 0 and self.score >= self.max_score


@dataclass(frozen=True)
class MutationReport:
    solution: MutantResult
    mutants: list[MutantResult]

    @property
    def ok(self) -> bool:
        """The solution scores full marks and every mutant loses points."""
        return self.solution.survived and not any(m.survived for m in self.mutants)

    def format(self) -> str:
        width = max([len(m.name) for m in self.mutants] + [len("solution")])
        lines = [f"{'solution':<{width}}  {self.solution.score:g} / {self.solution.max_score:g}"
                 f"  {'full marks' if self.solution.survived else f'NOT FULL MARKS: {self.solution.status}'}"]
        for m in self.mutants:
            verdict = ("SURVIVED: full marks, no test caught it" if m.survived
                       else "caught by " + ", ".join(m.caught_by) if m.caught_by
                       else str(m.status))
            lines.append(f"{m.name:<{width}}  {m.score:g} / {m.max_score:g}  {verdict}")
        survivors = [m.name for m in self.mutants if m.survived]
        lines.append(f"{len(self.mutants) - len(survivors)} of {len(self.mutants)} mutant(s) "
                     "caught" + (f"; survived: {', '.join(survivors)}" if survivors else ""))
        return "\n".join(lines)


SOLUTION_STUDENT = "solution"


def mutation_check(course_dir: str | Path, assignment: str, mutants: dict[str, dict[str, str]],
                   *, timeout: int | None = None, workers: int | None = None,
                   unsandboxed_trusted: bool = False,
                   log: Callable[[str], None] | None = None,
                   progress: bool = False) -> MutationReport:
    """Grade the solution and each mutant (name -> its answer cells) of ``assignment`` of the
    course in ``course_dir``, in one run of the course's grader, in a scratch copy of the course
    (its gradebook and submissions are untouched). Returns each one's score and the test cells
    that caught it; ``progress``: a progress bar (course/grading/progress.py)."""
    import nbformat

    from .grade import grade
    from .nbgrader_app import find_config
    from .release import release

    course = Path(course_dir).resolve()
    source_dir = course / "solutions" / assignment
    notebooks = sorted(source_dir.glob("*.ipynb"))
    if len(notebooks) != 1:
        raise FileNotFoundError(f"mutation-check: expected one notebook in {source_dir}, found "
                                f"{[p.name for p in notebooks] or 'none'}")
    if SOLUTION_STUDENT in mutants:
        raise ValueError(f"mutation-check: a mutant may not be called {SOLUTION_STUDENT!r}")
    solution = nbformat.read(notebooks[0], as_version=4)
    answers = answers_of(solution)
    config = find_config(course)
    with tempfile.TemporaryDirectory(prefix="mutation-check-") as scratch_dir:
        scratch = Path(scratch_dir)
        shutil.copytree(source_dir, scratch / "solutions" / assignment)
        if config is not None:
            shutil.copy2(config, scratch / config.name)
        released = release(scratch, force=True)
        release_nb = nbformat.read(next(p for p in released if p.parent.name == assignment),
                                   as_version=4)
        for student, changed in [(SOLUTION_STUDENT, {}), *mutants.items()]:
            nb = submission_with(release_nb, answers, changed, source=student)
            folder = scratch / "submitted" / student / assignment
            folder.mkdir(parents=True)
            nbformat.write(nb, str(folder / notebooks[0].name))
        run = grade(scratch, timeout=timeout, workers=workers, feedback=False,
                    unsandboxed_trusted=unsandboxed_trusted, log=log, progress=progress)
        caught = _failed_tests(scratch / "gradebook.db", assignment, [SOLUTION_STUDENT, *mutants])
    results = {row.student: MutantResult(row.student, row.score, row.max_score,
                                         tuple(caught.get(row.student, ())), row.status)
               for row in run.rows if row.assignment == assignment}
    return MutationReport(results[SOLUTION_STUDENT], [results[name] for name in mutants])


def _failed_tests(gradebook: Path, assignment: str, students: list[str]) -> dict[str, list[str]]:
    """student -> the test cells that scored below their points."""
    from nbgrader.api import Gradebook, MissingEntry

    from .nbgrader_app import quiet_gradebook
    failed = {}
    with quiet_gradebook(), Gradebook(f"sqlite:///{gradebook}") as gb:
        for student in students:
            try:
                submission = gb.find_submission(assignment, student)
            except MissingEntry:
                failed[student] = []
                continue
            failed[student] = sorted(g.name for nb in submission.notebooks for g in nb.grades
                                     if (g.score or 0) < (g.max_score or 0))
    return failed


def read_mutants(folder: str | Path) -> dict[str, dict[str, str]]:
    """Every ``*.py`` mutant file of ``folder``: file stem -> its answer cells."""
    paths = sorted(Path(folder).glob("*.py"))
    if not paths:
        raise FileNotFoundError(f"mutation-check: no mutant files (*.py) in {folder}")
    return {path.stem: read_mutant(path.read_text(encoding="utf-8"), str(path)) for path in paths}
