"""One submission graded in a worker process: what the grader's worker does with its job.

The grader (course/grading/grade.py) writes a :class:`Job` into a scratch folder of its own and
starts ``python -c WORKER_COMMAND job.json``. The worker loads the job, runs nbgrader autograde
in the job's scratch course (its kernel in the sandbox, the notebook run by
:class:`course.grading.executor.BoundedExecute` and judged by
:class:`course.grading.judging.Verdicts`), writes the feedback page (a notebook that stopped
gets its page from the grader's record step), and answers an
:class:`course.grading.report.Outcome` in the job's outcome file. What the sandbox did to the
kernel (a limit it hit) comes back through the job's events file, never through process-global
state.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .nbgrader_app import (LogRecords, course_config, course_directory, last_error_line,
                           prepare_environment, quiet_gradebook, run_converter)
from .report import Outcome, notebook_reasons
from .verdicts import REVIEW_METADATA

WORKER_COMMAND = ("import sys; from course.grading.worker import main; "
                  "sys.exit(main(sys.argv[1]))")
"""What the grader runs (``python -c WORKER_COMMAND FOLDER/job.json``) in a job's folder."""


@dataclass(frozen=True)
class Job:
    """One submission to grade, as the grader hands it to a worker (``job.json`` in ``folder``).

    ``folder`` holds the job's files: job.json, gradebook.db (a copy of the run's template),
    outcome.json (the worker's answer) and events.jsonl (what the sandbox did); ``root`` is the
    scratch course (the submission and the assignment's source folder only)."""

    student: str
    assignment: str
    folder: str
    root: str
    config_file: str | None
    secret: str                    # the run's secret (secret.py): every worker judges alike
    verdict_cache: str             # the solutions' records, shared by the run's workers
    timeout: int | None = None     # seconds per cell
    notebook_timeout: int | None = None
    unsandboxed_trusted: bool = False
    feedback: bool = True
    links: tuple[str, ...] = field(default=())   # symbolic links left out of the submission
    profile: bool = False          # time the phases (course/grading/profiling.py)
    zygote: str = ""               # the socket of the run's zygote (sandbox/zygote.py), if any

    @property
    def gradebook(self) -> Path:
        return Path(self.folder) / "gradebook.db"

    @property
    def outcome_file(self) -> Path:
        return Path(self.folder) / "outcome.json"

    @property
    def events_file(self) -> Path:
        return Path(self.folder) / "events.jsonl"

    @property
    def job_file(self) -> Path:
        return Path(self.folder) / "job.json"

    def save(self) -> None:
        self.job_file.write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, path: str | Path) -> "Job":
        data = json.loads(Path(path).read_text())
        return cls(**{**data, "links": tuple(data.get("links", ()))})


def main(job_file: str) -> int:
    """A worker process: grade the submission of ``job_file``, write its outcome file."""
    job = Job.load(job_file)
    job.outcome_file.write_text(grade_submission(job).to_json())
    return 0


def grade_submission(job: Job) -> Outcome:
    """Grade one submission in the job's scratch course (a worker's whole task)."""
    prepare_environment()
    import nbformat
    from nbgrader.api import Gradebook, MissingEntry
    from nbgrader.converters import Autograde, GenerateFeedback

    from . import sandbox

    start = time.perf_counter()
    student, assignment = job.student, job.assignment
    config = course_config(job.root, gradebook=job.gradebook, timeout=job.timeout,
                           config_file=job.config_file)
    sandbox_settings(config, notebook_timeout=job.notebook_timeout,
                     unsandboxed_trusted=job.unsandboxed_trusted)
    config.SandboxedKernelManager.events_file = str(job.events_file)
    if job.profile:
        from .profiling import swap_executor
        swap_executor(config)
    coursedir = course_directory(config, assignment_id=assignment, student_id=student)
    submitted = Path(coursedir.format_path(coursedir.submitted_directory, student, assignment))
    autograded = Path(coursedir.format_path(coursedir.autograded_directory, student, assignment))
    outcome = Outcome(student, assignment)
    outcome.reasons += [f"{link}: a symbolic link, left out of the submission"
                        for link in job.links]
    outcome.reasons += _locked_cell_reasons(submitted, assignment, coursedir)
    outcome.reasons += _forget_unknown_cells(submitted, assignment, coursedir)

    app = Autograde(coursedir=coursedir, config=config)
    app.force = True
    app.create_student = True
    autograde_start = time.perf_counter()
    records = run_converter(app)
    autograde_seconds = time.perf_counter() - autograde_start
    notebooks = sorted(autograded.glob("*.ipynb"))
    if not notebooks:
        stopped = sandbox.stop_reason(sandbox.read_events(job.events_file))   # a limit hit
        if stopped:
            outcome.failure = stopped
        else:
            unreadable = [r for r in outcome.reasons if ": unreadable," in r]
            outcome.failure = unreadable[0] if unreadable else _stopped_reason(records)

    with quiet_gradebook(), Gradebook(coursedir.db_url, coursedir.course_id) as gb:
        try:
            submission = gb.find_submission(assignment, student)
        except MissingEntry:          # nbgrader stopped before recording it: every test is 0
            submission = None
        notebooks_graded = submission.notebooks if submission is not None else []
        if submission is not None and submission.timestamp:
            outcome.timestamp = submission.timestamp.isoformat()
        for nb in notebooks_graded:
            outcome.grades[nb.name] = {g.name: [float(g.auto_score or 0), bool(g.needs_manual_grade)]
                                       for g in nb.grades}
            outcome.comments[nb.name] = {c.name: c.auto_comment for c in nb.comments}

    memory = config.SandboxedKernelManager.get("memory_limit_mb", 2048)
    for path in notebooks:
        nb = nbformat.read(path, as_version=4)
        outcome.review += [f"{path.stem}: {item}" for item in nb.metadata.get(REVIEW_METADATA, [])]
        outcome.reasons += notebook_reasons(nb, outcome.grades.get(path.stem, {}),
                                            memory_limit_mb=memory, cell_timeout=job.timeout
                                            or config.Execute.get("timeout"))
    feedback_start = time.perf_counter()
    if job.feedback and not outcome.failure:   # a failure's page: the grader's record step
        run_converter(GenerateFeedback(coursedir=coursedir, config=config))
    outcome.seconds = time.perf_counter() - start
    if job.profile:
        _save_profile(job, outcome.seconds, autograde_seconds,
                      time.perf_counter() - feedback_start)
    return outcome


def _save_profile(job: Job, seconds: float, autograde: float, feedback: float) -> None:
    """The worker's phases into the job's folder: the kernel and its cells (timed by
    ProfiledExecute), nbgrader's own steps around them, the feedback page, the rest."""
    from .profiling import ACTIVE, PROFILE_FILE
    ran = sum(total for total, _ in ACTIVE.phases.values())
    ACTIVE.add("nbgrader autograde's own steps (verdicts outside the kernel included)",
               autograde - ran)
    ACTIVE.add("feedback page (nbgrader generate_feedback)", feedback)
    ACTIVE.add("worker: its job's cells checked, gradebook read", seconds - autograde - feedback)
    (Path(job.folder) / PROFILE_FILE).write_text(ACTIVE.to_json())


def sandbox_settings(config, *, notebook_timeout: int | None,
                      unsandboxed_trusted: bool) -> None:
    """Set the sandbox's per-notebook wall clock and the trusted-only escape in ``config``."""
    if notebook_timeout is not None:
        config.SandboxedKernelManager.notebook_timeout = int(notebook_timeout)
    if unsandboxed_trusted:
        config.SandboxedKernelManager.unsandboxed_trusted = True


def _locked_cell_reasons(submitted: Path, assignment: str, coursedir) -> list[str]:
    """Test cells of the instructor's notebook that the submission lacks or renamed (grading
    puts the instructor's cells back, so these never raise)."""
    import nbformat
    from nbgrader.api import Gradebook, MissingEntry
    reasons = []
    with Gradebook(coursedir.db_url, coursedir.course_id) as gb:
        for notebook in gb.find_assignment(assignment).notebooks:
            path = submitted / f"{notebook.name}.ipynb"
            if not path.is_file():
                reasons.append(f"{notebook.name}.ipynb: not submitted")
                continue
            try:
                nb = nbformat.read(path, as_version=4)
            except Exception as error:        # not a notebook: say why, in the learner's words
                detail = " ".join(str(error).split())[:200]
                reasons.append(f"{notebook.name}.ipynb: unreadable, not a Jupyter notebook "
                               f"({type(error).__name__}: {detail}); open it in JupyterLab, "
                               "save it, and submit it again")
                continue
            ids = {c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells}
            for cell in notebook.grade_cells:
                try:
                    if cell.name not in ids:
                        reasons.append(f"{cell.name}: locked test cell missing or its grade_id "
                                       "renamed; graded with the instructor's cell")
                except MissingEntry:
                    pass
    return reasons


def _forget_unknown_cells(submitted: Path, assignment: str, coursedir) -> list[str]:
    """Strip the nbgrader metadata of submitted cells whose grade_id the instructor's notebook
    does not have (a renamed test cell) or that repeat an earlier cell's grade_id (a cell copied
    in JupyterLab keeps its metadata): they become ordinary cells, and grading puts the
    instructor's cell back (nbgrader would stop on them with a KeyError and score 0). Returns a
    reason for each repeated id; notebooks that do not parse get theirs from
    :func:`_locked_cell_reasons`."""
    import nbformat
    from nbgrader.api import Gradebook
    with Gradebook(coursedir.db_url, coursedir.course_id) as gb:
        known = {nb.name: {c.name for c in nb.source_cells}
                 for nb in gb.find_assignment(assignment).notebooks}
    reasons = []
    for path in sorted(submitted.glob("*.ipynb")):
        if path.stem not in known:
            continue
        try:
            nb = nbformat.read(path, as_version=4)
        except Exception:          # not a notebook: reported by _locked_cell_reasons
            continue
        changed, seen = False, set()
        for cell in nb.cells:
            meta = cell.metadata.get("nbgrader")
            if meta is None:
                continue
            grade_id = meta.get("grade_id")
            if grade_id in seen:
                reasons.append(f"{path.stem}.ipynb: the cell id {grade_id!r} appears more than "
                               "once (a copied cell?); the first one is graded, the copies run "
                               "as ordinary cells")
            if grade_id not in known[path.stem] or grade_id in seen:
                del cell.metadata["nbgrader"]
                changed = True
            seen.add(grade_id)
        if changed:
            nbformat.write(nb, str(path))
    return list(dict.fromkeys(reasons))


def _stopped_reason(records: LogRecords) -> str:
    """Why nbgrader stopped running a notebook, in the learner's words."""
    text = "\n".join(message for _, message in records.records)
    if "CellTimeoutError" in text:
        return ("timeout: a cell ran past the time limit and did not stop when interrupted "
                "(a loop that ignores SIGINT?); the notebook's kernel was killed")
    if "No notebooks found" in text or "No notebooks were matched" in text:
        return "no notebook of this assignment was submitted (or only links to one)"
    if "DeadKernelError" in text or "Kernel died" in text:
        return "the kernel died (the notebook ended its own process)"
    found = _failure_reasons(records)
    return found[0] if found else "nbgrader could not run this notebook"


def _failure_reasons(records: LogRecords) -> list[str]:
    """The last line of each error that stopped nbgrader's processing of a submission."""
    reasons, current = [], False
    for level, message in records.records:
        if re.match(r"There was an error processing assignment", message):
            current = True
        elif current and level >= logging.ERROR and "Traceback" in message:
            reasons.append(last_error_line(message))
            current = False
    return reasons

