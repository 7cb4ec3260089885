"""The instructor's grade table: one row per submission, written as CSV."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence


@dataclass(frozen=True)
class GradeRow:
    """One line of grades.csv."""

    student: str
    assignment: str
    score: float
    max_score: float
    status: str          # "graded", "failed: ...", "unknown assignment", "not submitted"



def _gradebook_rows(coursedir, status: dict[tuple[str, str], str]) -> list[GradeRow]:
    """Every submission in the gradebook (this run's and earlier ones), plus the submissions of
    unknown assignments, sorted by assignment and student."""
    from nbgrader.api import Gradebook, MissingEntry
    rows = []
    with Gradebook(coursedir.db_url, coursedir.course_id) as gb:
        for assignment in gb.assignments:
            for student in gb.students:
                try:
                    submission = gb.find_submission(assignment.name, student.id)
                except MissingEntry:
                    continue
                note = status.get((student.id, assignment.name), "graded earlier")
                rows.append(GradeRow(student.id, assignment.name, float(submission.score),
                                     float(assignment.max_score), note))
    rows += [GradeRow(student, assignment, 0.0, 0.0, note)
             for (student, assignment), note in status.items() if note == "unknown assignment"]
    return sorted(rows, key=lambda r: (r.assignment, r.student))


def write_grades(rows: Sequence[GradeRow], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["student_id", "assignment", "score", "max_score", "status"])
        for r in rows:
            writer.writerow([r.student, r.assignment, f"{r.score:g}", f"{r.max_score:g}", r.status])

