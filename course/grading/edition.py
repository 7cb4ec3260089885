"""The learner edition of the course: everything a learner needs, nothing that grades them.

``course-edition OUT`` (``python -m course.grading edition OUT``, ``make learner-edition``) copies
the course into OUT without the instructor's material: ``solutions/`` (answers and hidden tests),
the grading tests and their data (``tests/test_grading*.py``, ``tests/grading/``), class data
(gradebook, submissions, autograded notebooks, feedback, grade tables) and build or tool state.
Every notebook copied is checked to hold no solution and no hidden test.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
from pathlib import Path

LEFT_OUT = (
    "solutions", "tests/grading", "tests/test_grading*.py",
    "gradebook.db", "submitted", "autograded", "feedback", "grades.csv", "course_grades.csv",
    ".exercises-backup", "exercises/.release.json",
    ".git", ".venv", "_build", "build", "runs", "learner-edition", ".pytest_cache",
    ".hypothesis", "*.egg-info", "__pycache__", ".ipynb_checkpoints", "*.pyc",
)
"""Course-relative paths (glob patterns) the learner edition leaves out."""
SECRETS = ("### BEGIN SOLUTION", "### BEGIN HIDDEN TESTS")


def _left_out(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatch(rel, pattern) or fnmatch.fnmatch(name, pattern)
               for pattern in LEFT_OUT)


def learner_edition(course_dir: str | os.PathLike, out: str | os.PathLike) -> list[Path]:
    """Copy the course at ``course_dir`` into the new folder ``out`` (which must not exist or be
    empty), leaving out :data:`LEFT_OUT`. Returns the files written. Raises ValueError if a
    notebook still holds a solution or hidden tests (nothing is left half-written)."""
    course = Path(course_dir).resolve()
    target = Path(out).resolve()
    if not (course / "exercises").is_dir() or not (course / "llmcore").is_dir():
        raise FileNotFoundError(f"edition: {course} is not the course (expected exercises/ and "
                                "llmcore/ in it)")
    if target == course or course in target.parents and not _left_out(
            target.relative_to(course).parts[0]):
        raise ValueError(f"edition: {target} must be outside the course, or in a folder it "
                         f"leaves out (e.g. {course / 'learner-edition'})")
    if target.exists() and any(target.iterdir()):
        raise FileExistsError(f"edition: {target} exists and is not empty")
    written: list[Path] = []
    for folder, dirs, files in os.walk(course):
        rel_folder = Path(folder).relative_to(course)
        dirs[:] = sorted(d for d in dirs if not _left_out((rel_folder / d).as_posix()))
        for name in sorted(files):
            rel = (rel_folder / name).as_posix()
            if _left_out(rel):
                continue
            source = Path(folder) / name
            if source.suffix == ".ipynb" and any(s in source.read_text(errors="replace")
                                                 for s in SECRETS):
                shutil.rmtree(target, ignore_errors=True)
                raise ValueError(f"edition: {rel} holds a solution or hidden tests; it must "
                                 "not reach learners (release it from solutions/ first)")
            copy = target / rel
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy, follow_symlinks=False)
            written.append(copy)
    return written
