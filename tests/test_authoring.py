"""Instructors' own exercises (issue 24): the scaffold, mutant files and the mutation check.

The fast tests read mutant files and judge reports. The slow ones run the command as an
instructor does: a new exercise made with ``scaffold``, released, and checked with two mutants;
and the course's own wrong solutions of exercise 1 (tests/grading/mutants.py) through the same
command, each with the score and the failing tests that file states.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course.grading import sandbox
from course.grading.authoring import (MutantResult, MutationReport, answers_of, read_mutant,
                                      submission_with)
from classroom import ROOT, mutants, nbgrader_meta, read

needs_sandbox = pytest.mark.skipif(sandbox.sandbox_problem() is not None,
                                   reason=f"no sandbox here: {sandbox.sandbox_problem()}")


def _command(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "course.grading", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=1800)


# ------------------------------------------------------------------------------ fast

def test_a_mutant_file_is_read_cell_by_cell():
    text = ("# forgets the sum\n"
            "# %% [row_dots]\n"
            "def row_dots(a, b):\n    return a * b\n\n"
            "# %% [helper]\nX = 1\n")
    assert read_mutant(text) == {"row_dots": "def row_dots(a, b):\n    return a * b",
                                 "helper": "X = 1"}
    with pytest.raises(ValueError, match="no answer cell.*# %% \\[grade_id\\]"):
        read_mutant("def f(): pass\n", "m.py")
    with pytest.raises(ValueError, match="'a' given twice"):
        read_mutant("# %% [a]\nx\n# %% [a]\ny\n")


def test_a_mutant_may_change_answer_cells_only():
    solution = read("solutions", "01_matmul")
    answers = answers_of(solution)
    assert set(answers) == {nbgrader_meta(c)["grade_id"] for c in solution.cells
                            if nbgrader_meta(c).get("solution")}
    assert all("### BEGIN SOLUTION" not in code for code in answers.values())
    release = read("exercises", "01_matmul")
    nb = submission_with(release, answers, {"dot": "def dot(a, b):\n    return 0"})
    cells = {nbgrader_meta(c).get("grade_id"): c.source for c in nb.cells}
    assert cells["dot"] == "def dot(a, b):\n    return 0" and cells["matmul"] == answers["matmul"]
    with pytest.raises(ValueError, match=r"\['test_dot'\] are not answer cells"):
        submission_with(release, answers, {"test_dot": "pass"})


def test_a_report_fails_when_a_mutant_keeps_full_marks():
    solution = MutantResult("solution", 5, 5, (), "graded")
    caught = MutantResult("forgets_sum", 2, 5, ("test_row_dots_hidden",), "graded")
    survivor = MutantResult("same_thing", 5, 5, (), "graded")
    assert MutationReport(solution, [caught]).ok
    report = MutationReport(solution, [caught, survivor])
    assert not report.ok
    text = report.format()
    assert "forgets_sum  2 / 5  caught by test_row_dots_hidden" in text
    assert "same_thing   5 / 5  SURVIVED" in text and "1 of 2 mutant(s) caught" in text
    assert not MutationReport(MutantResult("solution", 3, 5, ("t",), "graded"), [caught]).ok


# ------------------------------------------------------------------------------ slow

FORGETS_THE_SUM = """\
# Multiplies the rows but never sums them: (n, k) instead of (n,).
# %% [row_dots]
def row_dots(a, b):
    if a.shape != b.shape or a.dim() != 2:
        raise ValueError(f"expected two (n, k) tensors of one shape, got {tuple(a.shape)} "
                         f"and {tuple(b.shape)}")
    return a * b
"""

USES_A_PRODUCT = """\
# The right numbers through a batched matrix product, which the exercise forbids.
# %% [row_dots]
def row_dots(a, b):
    if a.shape != b.shape or a.dim() != 2:
        raise ValueError(f"expected two (n, k) tensors of one shape, got {tuple(a.shape)} "
                         f"and {tuple(b.shape)}")
    return (a.unsqueeze(1) @ b.unsqueeze(2)).reshape(-1)
"""


@needs_sandbox
@pytest.mark.slow
def test_a_scaffolded_exercise_is_released_and_mutation_checked(tmp_path):
    course = tmp_path / "course"
    course.mkdir()
    shutil.copy2(ROOT / "nbgrader_config.py", course / "nbgrader_config.py")
    done = _command("scaffold", "12_row_dots", "--course-dir", str(course))
    assert done.returncode == 0, done.stdout + done.stderr
    notebook = course / "solutions" / "12_row_dots" / "row_dots.ipynb"
    assert notebook.is_file() and "wrote" in done.stdout
    again = _command("scaffold", "12_row_dots", "--course-dir", str(course))
    assert again.returncode == 2 and "exists" in again.stderr, "a scaffold never overwrites"

    done = _command("release", "--course-dir", str(course))
    assert done.returncode == 0, done.stdout + done.stderr
    released = nbformat.read(course / "exercises" / "12_row_dots" / "row_dots.ipynb", as_version=4)
    text = "\n".join(c.source for c in released.cells)
    assert "### BEGIN SOLUTION" not in text and "### BEGIN HIDDEN TESTS" not in text

    folder = tmp_path / "mutants"
    folder.mkdir()
    (folder / "forgets_the_sum.py").write_text(FORGETS_THE_SUM)
    (folder / "uses_a_product.py").write_text(USES_A_PRODUCT)
    done = _command("mutation-check", "12_row_dots", str(folder), "--course-dir", str(course),
                    "--timeout", "60")
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines() if line.strip()}
    assert lines["solution"].split()[1:4] == ["5", "/", "5"] and "full marks" in lines["solution"]
    assert lines["forgets_the_sum"].split()[1:4] == ["0", "/", "5"], lines["forgets_the_sum"]
    assert "caught by test_row_dots, test_row_dots_hidden" in lines["forgets_the_sum"]
    assert lines["uses_a_product"].split()[1:4] == ["0", "/", "5"], lines["uses_a_product"]
    assert "2 of 2 mutant(s) caught" in done.stdout
    assert not (course / "submitted").exists() and not (course / "gradebook.db").exists(), \
        "the check grades in a scratch copy, never in the course"


def _answer_cell_mutants(assignment: str) -> list:
    """The course's wrong solutions of ``assignment`` whose edits change answer cells only."""
    answer_ids = set(answers_of(read("solutions", assignment)))
    return [sub for sub in mutants.WRONG
            if sub.assignment == assignment and sub.answered and set(sub.edits) <= answer_ids
            and all(isinstance(e, (mutants.Replace, mutants.Source)) for e in sub.edits.values())]


def _mutant_file(sub, answers: dict[str, str]) -> str:
    lines = [f"# {sub.why}"]
    for grade_id, edit in sub.edits.items():
        code = answers[grade_id]
        if isinstance(edit, mutants.Replace):
            assert code.count(edit.old) == 1, (sub.student, edit.old)
            code = code.replace(edit.old, edit.new)
        else:
            code = edit.text.strip("\n")
        lines += [f"# %% [{grade_id}]", code]
    return "\n".join(lines) + "\n"


@needs_sandbox
@pytest.mark.slow
def test_the_course_mutants_of_exercise_1_through_the_command(tmp_path):
    wrong = _answer_cell_mutants("01_matmul")
    assert len(wrong) >= 2, "exercise 1 has wrong solutions that change answer cells only"
    answers = answers_of(read("solutions", "01_matmul"))
    for sub in wrong:
        (tmp_path / f"{sub.student}.py").write_text(_mutant_file(sub, answers))
    done = _command("mutation-check", "01_matmul", str(tmp_path), "--timeout", "60")
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines() if line.strip()}
    for sub in wrong:
        line = lines[sub.student]
        assert float(line.split()[1]) == sub.score, (sub.student, line)
        assert f"caught by {', '.join(sorted(sub.failing))}" in line, (sub.student, line)


AUTHORING = ROOT / "course" / "grading" / "AUTHORING.md"


def authoring_commands() -> list[str]:
    """Every command AUTHORING.md gives, as written: the lines of its ```bash blocks (comments
    dropped) and its inline code that starts with the environment's `.venv/bin/`."""
    import re
    text = AUTHORING.read_text()
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        found += [line.split("  #")[0].strip() for line in block.splitlines()
                  if line.strip() and not line.strip().startswith("#")]
    found += re.findall(r"`(\.venv/bin/[^`]+)`", text.replace("\n   ", " "))
    return found


def test_authoring_names_only_commands_that_run_in_the_course_environment():
    commands = authoring_commands()
    assert len(commands) >= 6, commands
    for command in commands:
        assert command.startswith(".venv/bin/"), \
            f"{command!r}: a bare python or course-check may not be the course's environment"
        program = command.split()[0]
        assert (ROOT / program).exists(), f"{command!r}: no {program} here"


@needs_sandbox
@pytest.mark.slow
def test_authoring_commands_run_as_written(tmp_path):
    """AUTHORING.md, section by section, in a scratch course whose .venv is this one's: scaffold,
    release, course-check on the solution (passes, hidden tests included) and on the release
    (fails every visible test), mutation-check with the page's own mutant, grade."""
    import re
    course = tmp_path / "course"
    course.mkdir()
    shutil.copy2(ROOT / "nbgrader_config.py", course / "nbgrader_config.py")
    (course / ".venv").symlink_to(ROOT / ".venv")
    mutant = re.search(r"```python\n(   # Multiplies.*?)```", AUTHORING.read_text(), re.S)
    (course / "mutants").mkdir()
    (course / "mutants" / "forgets_the_sum.py").write_text(
        "\n".join(line[3:] for line in mutant.group(1).splitlines()) + "\n")
    places = {"<assignment>": "12_row_dots", "<notebook>": "row_dots", "<folder>": "mutants"}
    ran = {}
    for command in authoring_commands():
        for placeholder, value in places.items():
            command = command.replace(placeholder, value)
        if command.endswith(" grade"):              # a class of one: the release, unanswered
            submitted = course / "submitted" / "alice" / "12_row_dots"
            submitted.mkdir(parents=True)
            shutil.copy2(course / "exercises" / "12_row_dots" / "row_dots.ipynb", submitted)
        done = subprocess.run(command, shell=True, cwd=course, capture_output=True, text=True,
                              timeout=1200)
        ran[command] = done
        print(f"$ {command}\n{done.stdout}{done.stderr}")
        assert "No module named" not in done.stderr, command
        assert "KeyboardInterrupt" not in done.stdout + done.stderr, command

    def result(start: str) -> subprocess.CompletedProcess:
        return next(done for command, done in ran.items() if command.startswith(start))

    assert result(".venv/bin/python -m course.grading scaffold").returncode == 0
    assert result(".venv/bin/python -m course.grading release").returncode == 0
    solution = result(".venv/bin/course-check solutions/")
    assert solution.returncode == 0, solution.stdout
    assert "ALTERED" not in solution.stdout and "hidden tests" in solution.stdout
    assert "All tests pass, hidden ones included." in solution.stdout
    release = result(".venv/bin/course-check exercises/")
    assert release.returncode == 1 and "PASS" not in release.stdout
    assert "FAIL    test_row_dots" in release.stdout
    checked = result(".venv/bin/python -m course.grading mutation-check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "1 of 1 mutant(s) caught" in checked.stdout
    assert checked.stdout.startswith("mutation-check: grading the solution of 12_row_dots")
    assert "grading: 2 of 2 notebooks" in checked.stderr, "progress, a line off a terminal"
    graded = result(".venv/bin/python -m course.grading grade")
    assert graded.returncode == 0, graded.stdout + graded.stderr
    assert re.search(r"12_row_dots\s+alice\s+0 / 5", graded.stdout), graded.stdout
    assert "grading: 1 of 1 notebooks" in graded.stderr
