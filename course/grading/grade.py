"""The instructor's grade: autograde every submission, write feedback and the grade table."""

from __future__ import annotations

import html
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Sequence

from .nbgrader_app import (_course_directory, _generate_assignment, _LogRecords,
                           _last_error_line, _prepare_environment, _quiet_gradebook,
                           _run_converter, assignments_in, course_config)
from .report import GradeRow, _gradebook_rows, write_grades


def _submissions(course: Path, submitted_dir: str) -> list[tuple[str, str]]:
    """(student, assignment) for every folder submitted/<student>/<assignment>/ with a notebook."""
    root = course / submitted_dir
    if not root.is_dir():
        raise FileNotFoundError(f"grade: no submissions folder {root} (expected "
                                f"{root}/<student>/<assignment>/<notebook>.ipynb)")
    return [(student.name, assignment) for student in sorted(root.iterdir())
            if student.is_dir() and not student.name.startswith(".")
            for assignment in assignments_in(student)]


def _failure_reasons(records: _LogRecords) -> dict[str, str]:
    """Submission folder -> the last line of the error that stopped its grading."""
    reasons, current = {}, None
    for level, message in records.records:
        found = re.match(r"There was an error processing assignment: (.*)", message)
        if found:
            current = found.group(1).strip()
        elif current is not None and level >= logging.ERROR and "Traceback" in message:
            reasons[os.path.normpath(current)] = _last_error_line(message)
            current = None
    return reasons


def _zero_failed(db_url: str, course_id: str, assignment: str, student: str) -> None:
    """Record 0 points for every test of a submission nbgrader could not run to the end."""
    from nbgrader.api import Gradebook
    with _quiet_gradebook(), Gradebook(db_url, course_id) as gb:
        gb.update_or_create_student(student)
        submission = gb.update_or_create_submission(assignment, student)
        for notebook in submission.notebooks:
            for grade in notebook.grades:
                grade.auto_score = 0
                grade.needs_manual_grade = False
        gb.db.commit()


def _failure_feedback(path: Path, student: str, assignment: str, reason: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>Feedback</title></head><body>\n"
        f"<h1>{html.escape(assignment)}: {html.escape(student)}</h1>\n"
        "<p>Your notebook could not be run to the end, so every test scored 0. The grader "
        f"reported: <code>{html.escape(reason)}</code></p>\n"
        "<p>Run <code>course-check NOTEBOOK</code> on your notebook to see "
        "what goes wrong, then submit it again.</p>\n</body></html>\n", encoding="utf-8")



def _register(config, assignment: str) -> _LogRecords:
    """Record an assignment's cells (tests, points, checksums, hidden tests) in the gradebook
    (nbgrader generate_assignment into a scratch folder: exercises/ is not touched)."""
    with tempfile.TemporaryDirectory() as scratch:
        coursedir = _course_directory(config, assignment_id=assignment, release_directory=scratch)
        records, _ = _generate_assignment(
            config, coursedir, no_database=False,
            failure=f"grade: nbgrader could not register {assignment}")
    return records


def grade(course_dir: str | os.PathLike = ".", *, gradebook: str | os.PathLike | None = None,
          csv_path: str | os.PathLike | None = None, timeout: int | None = None,
          force: bool = False, assignments: Sequence[str] | None = None,
          config_file: str | os.PathLike | None = None, feedback: bool = True,
          log: Callable[[str], None] | None = None, verbose: bool = False) -> list[GradeRow]:
    """Grade every submission in ``course_dir/submitted/<student>/<assignment>/``.

    One nbgrader autograde run per assignment grades all its students; a submission that
    raises, hangs, exhausts its memory or kills its kernel is graded 0 where it stopped and the
    run goes on. Submissions graded by an earlier run are kept unless ``force``. Then writes
    feedback HTML (``feedback/<student>/<assignment>/``) and the CSV (default
    ``course_dir/grades.csv``) of every submission in the gradebook, which it returns.
    log: called with a line of progress; verbose: also pass it nbgrader's warnings and errors.
    """
    _prepare_environment()
    from nbgrader.converters import Autograde, GenerateFeedback

    say = log or (lambda message: None)

    def report(records: _LogRecords) -> None:
        if verbose:
            for level, message in records.records:
                if level >= logging.WARNING:
                    say(f"  nbgrader {logging.getLevelName(level).lower()}: {message}")

    config = course_config(course_dir, gradebook=gradebook, timeout=timeout,
                           config_file=config_file)
    coursedir = _course_directory(config)
    course = Path(coursedir.root)

    def folder(step: str, student: str, assignment: str) -> Path:
        return Path(coursedir.format_path(step, student, assignment))

    known = set(assignments_in(course / coursedir.source_directory))
    pairs = _submissions(course, coursedir.submitted_directory)
    if assignments:
        pairs = [(s, a) for s, a in pairs if a in set(assignments)]
    status: dict[tuple[str, str], str] = {}
    for student, assignment in pairs:
        if assignment not in known:
            status[(student, assignment)] = "unknown assignment"
            say(f"{student}/{assignment}: no such assignment in {coursedir.source_directory}/")

    for assignment in sorted({a for s, a in pairs if a in known}):
        students = [s for s, a in pairs if a == assignment]
        report(_register(config, assignment))

        def graded_files(student: str) -> list[tuple[Path, int]]:
            return [(p, p.stat().st_mtime_ns) for p in sorted(
                folder(coursedir.autograded_directory, student, assignment).glob("*.ipynb"))]

        before = {student: graded_files(student) for student in students}
        say(f"{assignment}: grading {len(students)} submission(s)")
        app = Autograde(coursedir=_course_directory(config, assignment_id=assignment,
                                                    student_id="*"), config=config)
        app.force = force
        app.create_student = True
        records = _run_converter(app)
        report(records)
        reasons = _failure_reasons(records)
        for student in students:
            files = graded_files(student)
            if files and files != before[student]:
                status[(student, assignment)] = "graded"
                shutil.rmtree(folder(coursedir.feedback_directory, student, assignment),
                              ignore_errors=True)
                continue
            if files:
                status[(student, assignment)] = "graded earlier"
                continue
            submitted = folder(coursedir.submitted_directory, student, assignment)
            reason = reasons.get(os.path.normpath(submitted),
                                 "nbgrader could not run this notebook to the end")
            status[(student, assignment)] = f"failed: {reason}"
            say(f"{student}/{assignment}: graded 0, the notebook stopped the grader ({reason})")
            _zero_failed(coursedir.db_url, coursedir.course_id, assignment, student)
            if feedback:
                for nb in sorted(submitted.glob("*.ipynb")):
                    pages = folder(coursedir.feedback_directory, student, assignment)
                    _failure_feedback(pages / f"{nb.stem}.html", student, assignment, reason)
        if feedback:
            app = GenerateFeedback(coursedir=_course_directory(
                config, assignment_id=assignment, student_id="*"), config=config)
            report(_run_converter(app))

    rows = _gradebook_rows(coursedir, status)
    write_grades(rows, Path(csv_path) if csv_path else course / "grades.csv")
    return rows

