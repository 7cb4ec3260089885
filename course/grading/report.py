"""The instructor's records: the gradebook (written by the trusted grader only), the reasons a
submission lost points, and the grade table (``course_grades.csv``).

A worker grades one submission in a scratch course of its own and hands back a
:class:`Outcome` (plain data). :func:`record` writes it into the course's gradebook in ONE
transaction, after the submission's kernel is gone, so a grader killed at any moment leaves every
submission either fully recorded or absent (graded again by the next run).
"""

from __future__ import annotations

import csv
import enum
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

GRADES_CSV = "course_grades.csv"
"""The course's grade table; nbgrader's own ``nbgrader export`` writes grades.csv."""
OUTCOME_FILE = ".course_outcome.json"
"""Written beside an autograded notebook: the reasons of its grade, read back by later runs."""
TAMPER_METADATA = "course_tampering"
"""Hook for the trusted verdicts: a test cell whose metadata holds this key (a message) was
tampered with; its reason reads "tampering detected: <message>"."""


@dataclass
class Outcome:
    """What grading one submission produced (a worker's answer; JSON-serialisable).

    grades: notebook -> grade cell -> [auto_score, needs_manual_grade];
    comments: notebook -> solution cell -> auto comment;
    failure: why the notebook could not be run to the end (then every test scores 0), or None;
    reasons: one line per lost point's cause, e.g. "test_dot: AssertionError: ...";
    review: evidence for the instructor's review (course/grading/review.py; costs no point).
    """

    student: str
    assignment: str
    grades: dict = field(default_factory=dict)
    comments: dict = field(default_factory=dict)
    timestamp: str | None = None
    failure: str | None = None
    reasons: list[str] = field(default_factory=list)
    seconds: float = 0.0
    review: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Outcome":
        return cls(**json.loads(text))


def record(db_url: str, course_id: str, outcome: Outcome) -> None:
    """Write one graded submission into the gradebook in a single transaction, replacing an
    earlier grade of the same submission (``--force``). Test cells the worker has no score for
    (the notebook stopped) score 0."""
    from datetime import datetime

    from nbgrader.api import (Comment, Grade, Gradebook, MissingEntry, SubmittedAssignment,
                              SubmittedNotebook)
    from .nbgrader_app import quiet_gradebook

    with quiet_gradebook(), Gradebook(db_url, course_id) as gb:
        gb.update_or_create_student(outcome.student)
        db = gb.db
        try:
            old = gb.find_submission(outcome.assignment, outcome.student)
        except MissingEntry:
            old = None
        try:
            if old is not None:
                for notebook in old.notebooks:
                    for item in [*notebook.grades, *notebook.comments]:
                        db.delete(item)
                    db.delete(notebook)
                db.delete(old)
                db.flush()
            timestamp = (datetime.fromisoformat(outcome.timestamp) if outcome.timestamp
                         else None)
            submission = SubmittedAssignment(
                assignment=gb.find_assignment(outcome.assignment),
                student=gb.find_student(outcome.student), timestamp=timestamp)
            for notebook in submission.assignment.notebooks:
                scores = outcome.grades.get(notebook.name, {})
                comments = outcome.comments.get(notebook.name, {})
                submitted = SubmittedNotebook(notebook=notebook, assignment=submission)
                for cell in notebook.grade_cells:
                    score, manual = scores.get(cell.name, [0.0, False])
                    Grade(cell=cell, notebook=submitted,
                          auto_score=0.0 if outcome.failure else score,
                          needs_manual_grade=False if outcome.failure else bool(manual))
                for cell in notebook.solution_cells:
                    Comment(cell=cell, notebook=submitted, auto_comment=comments.get(cell.name))
            db.add(submission)
            db.commit()
        except Exception:
            db.rollback()
            raise


def graded_pairs(db_url: str, course_id: str) -> set[tuple[str, str]]:
    """(student, assignment) of every submission in the gradebook."""
    from nbgrader.api import Gradebook
    with Gradebook(db_url, course_id) as gb:
        return {(s.student.id, s.assignment.name)
                for a in gb.assignments for s in a.submissions}


# ------------------------------------------------------------------------------------------------
# Why a notebook lost points (read from the notebook the sandboxed kernel ran)
# ------------------------------------------------------------------------------------------------

TRUNCATED = "output truncated by the grader"


def cell_reason(cell, *, memory_limit_mb: int, cell_timeout: int | None) -> str:
    """The reason a cell failed, from its outputs: timeout, memory cap, output cap, the error's
    last line, or tampering flagged by the grader's verdicts ("" when nothing went wrong)."""
    tampered = cell.get("metadata", {}).get(TAMPER_METADATA)
    if tampered:
        return f"tampering detected: {tampered}"
    outputs = cell.get("outputs", [])
    errors = [o for o in outputs if o.get("output_type") == "error"]
    names = {o.get("ename") for o in errors}
    if names & {"CellTimeoutError", "KeyboardInterrupt"}:
        limit = f" of {cell_timeout} s" if cell_timeout else ""
        return f"timeout: the cell ran past the time limit{limit} and was interrupted"
    values = " ".join(str(o.get("evalue", "")) for o in errors)
    if "MemoryError" in names or "can't allocate memory" in values:
        return f"memory cap: the cell allocated past the {memory_limit_mb} MiB limit (MemoryError)"
    for words, what in (("No space left on device", "a sandbox folder is full"),
                        ("File too large", "a file reached the sandbox's size limit per file"),
                        ("Read-only file system", "the sandbox's root is read-only")):
        if words in values:
            return f"disk: {what} ({words})"
    if errors:
        error = errors[-1]
        value = " ".join(str(error.get("evalue", "")).split())[:300]
        return f"{error.get('ename')}: {value}" if value else str(error.get("ename"))
    if any(o.get("output_type") == "stream" and TRUNCATED in o.get("text", "") for o in outputs):
        return "output cap: the cell printed more than the grader keeps (output cut short)"
    for o in outputs:
        if o.get("output_type") == "stream" and o.get("name") == "stderr":
            from .nbgrader_app import last_error_line      # the learner's check says the same
            return "wrote to stderr: " + last_error_line(str(o.get("text", "")))[:300]
    return ""


def notebook_reasons(nb, scores: dict, *, memory_limit_mb: int,
                     cell_timeout: int | None) -> list[str]:
    """One line per test cell that lost points (with its reason) and per other cell that
    failed or hit a limit (which usually explains the tests after it)."""
    reasons = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        meta = cell.metadata.get("nbgrader", {})
        name = meta.get("grade_id", f"cell {index}")
        reason = cell_reason(cell, memory_limit_mb=memory_limit_mb, cell_timeout=cell_timeout)
        if meta.get("grade") and not meta.get("solution"):
            score = scores.get(name, [None, False])[0]
            if score is not None and float(score) < float(meta.get("points", 0)):
                reasons.append(f"{name}: {reason or 'failed'}")
        elif reason:
            reasons.append(f"{name}: {reason}")
    return reasons


# ------------------------------------------------------------------------------------------------
# The grade table
# ------------------------------------------------------------------------------------------------

class State(enum.Enum):
    """What became of a submission (the first word of its status in the grade table)."""

    GRADED = "graded"
    REVIEW = "review"                   # graded; evidence for the instructor's review, no point lost
    FAILED = "failed"                   # graded 0 from where the notebook stopped
    REFUSED = "refused"                 # not graded, not in the gradebook
    UNKNOWN = "unknown assignment"      # not graded: the course has no such assignment


@dataclass(frozen=True)
class Status:
    """A submission's status: its state, the evidence (review) or the reason (failed, refused),
    and whether an earlier run recorded it. Read its fields; ``str()`` is the CSV's text
    ("graded", "review: ...", "failed: ...", "refused: ...", "unknown assignment",
    "graded earlier", "graded earlier, failed: ...")."""

    state: State
    detail: str = ""
    earlier: bool = False

    @classmethod
    def of(cls, outcome: Outcome, *, earlier: bool = False) -> "Status":
        """The status of a graded submission: failed, review (evidence; no point lost), or
        graded."""
        if outcome.failure:
            return cls(State.FAILED, outcome.failure, earlier)
        if outcome.review:
            return cls(State.REVIEW, "; ".join(outcome.review), earlier)
        return cls(State.GRADED, earlier=earlier)

    @property
    def recorded(self) -> bool:
        """Whether the submission is in the gradebook (graded, in this run or an earlier one)."""
        return self.state in (State.GRADED, State.REVIEW, State.FAILED)

    def __str__(self) -> str:
        text = self.state.value + (f": {self.detail}" if self.detail else "")
        if not self.earlier:
            return text
        return "graded earlier" + ("" if self.state is State.GRADED else f", {text}")


REFUSED_LINK = Status(State.REFUSED, "the submission's folder is a symbolic link")
UNKNOWN_ASSIGNMENT = Status(State.UNKNOWN)


@dataclass(frozen=True)
class GradeRow:
    """One line of course_grades.csv."""

    student: str
    assignment: str
    score: float
    max_score: float
    status: Status
    reasons: str = ""    # why points were lost, "; "-separated


def gradebook_rows(coursedir, status: dict[tuple[str, str], Status],
                    reasons: dict[tuple[str, str], str] | None = None) -> list[GradeRow]:
    """Every submission in the gradebook (this run's, with its ``status``, and earlier ones),
    plus the submissions this run did not grade (unknown assignments, refused), sorted by
    assignment and student. The status and reasons of earlier runs are read from the outcome
    file beside the autograded notebooks."""
    from nbgrader.api import Gradebook
    reasons = dict(reasons or {})
    rows = []
    with Gradebook(coursedir.db_url, coursedir.course_id) as gb:
        for assignment in gb.assignments:
            for submission in assignment.submissions:
                key = (submission.student.id, assignment.name)
                note, why = status.get(key), reasons.get(key)
                if note is None or why is None:
                    saved = Path(coursedir.format_path(coursedir.autograded_directory, key[0],
                                                       key[1])) / OUTCOME_FILE
                    old = Outcome.from_json(saved.read_text()) if saved.is_file() else None
                    if note is None:
                        note = Status.of(old, earlier=True) if old else \
                            Status(State.GRADED, earlier=True)
                    if why is None:
                        why = "; ".join(old.reasons) if old else ""
                rows.append(GradeRow(key[0], assignment.name, float(submission.score),
                                     float(assignment.max_score), note, why))
    rows += [GradeRow(student, assignment, 0.0, 0.0, note)
             for (student, assignment), note in status.items() if not note.recorded]
    return sorted(rows, key=lambda r: (r.assignment, r.student))


def write_grades(rows: Sequence[GradeRow], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["student_id", "assignment", "score", "max_score", "status", "reasons"])
        for r in rows:
            writer.writerow([r.student, r.assignment, f"{r.score:g}", f"{r.max_score:g}",
                             str(r.status), r.reasons])
