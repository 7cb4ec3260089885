"""The instructor's grade: every submission autograded in a sandbox, in parallel, recorded safely.

How a class is graded (``grade``):

1. Each assignment is registered in the course's gradebook and in a scratch template gradebook.
2. Every submission not yet in the gradebook (all of them with ``force``) is graded by a worker
   process (``workers`` at a time, default: the number of cores) in a scratch course of its own:
   a copy of its submission, of the assignment's source folder and of the template gradebook.
   The worker runs nbgrader autograde, whose kernel runs in the sandbox of
   :mod:`course.grading.sandbox`, then the feedback page, and answers an :class:`Outcome`.
3. The grader (this process, the only writer) copies the autograded notebook and the feedback
   into the course and then records the outcome in the gradebook in one transaction. sqlite is
   never written by two processes at once and a submission is either wholly recorded or absent:
   a grader killed mid-run keeps everything recorded so far, and the same command grades the rest.
"""

from __future__ import annotations

import concurrent.futures
import html
import json
import logging
import os
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from .nbgrader_app import (_course_directory, _generate_assignment, _LogRecords,
                           _last_error_line, _prepare_environment, _quiet_gradebook,
                           _run_converter, assignments_in, course_config)
from .report import (GRADES_CSV, OUTCOME_FILE, GradeRow, Outcome, _gradebook_rows, graded_pairs,
                     notebook_reasons, record, write_grades)
from .secret import SECRET_ENV
from .verdicts import REVIEW_METADATA


REFUSED_LINK = "refused: the submission's folder is a symbolic link"


@dataclass(frozen=True)
class GradeRun:
    """What a grade run did: the table's rows and how long it took."""

    rows: list[GradeRow]
    graded: int                  # submissions graded in this run
    notebooks: int               # notebooks run in this run
    seconds: float               # wall time of the grading (workers), start to last record
    per_notebook: list[float]    # each worker's wall time divided by its notebooks
    workers: int

    def summary(self) -> str:
        if not self.notebooks:
            return "nothing new to grade"
        rate = 60 * self.notebooks / self.seconds if self.seconds else float("inf")
        each = statistics.median(self.per_notebook)
        return (f"graded {self.notebooks} notebook(s) of {self.graded} submission(s) in "
                f"{self.seconds:.1f} s with {self.workers} worker(s): {rate:.1f} notebooks/min, "
                f"{each:.1f} s per notebook (median; max {max(self.per_notebook):.1f} s)")


def _submissions(course: Path, submitted_dir: str) -> list[tuple[str, str]]:
    """(student, assignment) for every folder submitted/<student>/<assignment>/ with a notebook."""
    root = course / submitted_dir
    if not root.is_dir():
        raise FileNotFoundError(f"grade: no submissions folder {root} (expected "
                                f"{root}/<student>/<assignment>/<notebook>.ipynb)")
    return [(student.name, assignment) for student in sorted(root.iterdir())
            if student.is_dir() and not student.name.startswith(".")
            for assignment in assignments_in(student)]


def _failure_reasons(records: _LogRecords) -> list[str]:
    """The last line of each error that stopped nbgrader's processing of a submission."""
    reasons, current = [], False
    for level, message in records.records:
        if re.match(r"There was an error processing assignment", message):
            current = True
        elif current and level >= logging.ERROR and "Traceback" in message:
            reasons.append(_last_error_line(message))
            current = False
    return reasons


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


# ------------------------------------------------------------------------------------------------
# One submission, in a worker process
# ------------------------------------------------------------------------------------------------

def _sandbox_settings(config, *, notebook_timeout: int | None,
                      unsandboxed_trusted: bool) -> None:
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


def _stopped_reason(records: _LogRecords) -> str:
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


def grade_one(job: dict) -> Outcome:
    """Grade one submission in the scratch course ``job["root"]`` (a worker's whole task)."""
    _prepare_environment()
    import nbformat
    from nbgrader.api import Gradebook, MissingEntry
    from nbgrader.converters import Autograde, GenerateFeedback

    from . import sandbox

    start = time.perf_counter()
    student, assignment = job["student"], job["assignment"]
    config = course_config(job["root"], gradebook=job["gradebook"], timeout=job["timeout"],
                           config_file=job["config_file"])
    _sandbox_settings(config, notebook_timeout=job["notebook_timeout"],
                      unsandboxed_trusted=job["unsandboxed_trusted"])
    coursedir = _course_directory(config, assignment_id=assignment, student_id=student)
    submitted = Path(coursedir.format_path(coursedir.submitted_directory, student, assignment))
    autograded = Path(coursedir.format_path(coursedir.autograded_directory, student, assignment))
    feedback = Path(coursedir.format_path(coursedir.feedback_directory, student, assignment))
    outcome = Outcome(student, assignment)
    outcome.reasons += [f"{link}: a symbolic link, left out of the submission"
                        for link in job.get("links", [])]
    outcome.reasons += _locked_cell_reasons(submitted, assignment, coursedir)
    outcome.reasons += _forget_unknown_cells(submitted, assignment, coursedir)

    app = Autograde(coursedir=coursedir, config=config)
    app.force = True
    app.create_student = True
    records = _run_converter(app)
    notebooks = sorted(autograded.glob("*.ipynb"))
    if not notebooks:
        stopped = sandbox.stop_reason()     # a limit the sandbox hit: time, memory, disk
        if stopped:
            outcome.failure = stopped
        else:
            unreadable = [r for r in outcome.reasons if ": unreadable," in r]
            outcome.failure = unreadable[0] if unreadable else _stopped_reason(records)

    with _quiet_gradebook(), Gradebook(coursedir.db_url, coursedir.course_id) as gb:
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
                                            memory_limit_mb=memory, cell_timeout=job["timeout"]
                                            or config.Execute.get("timeout"))
    if job["feedback"]:
        if outcome.failure:
            for nb in sorted(submitted.glob("*.ipynb")):
                _failure_feedback(feedback / f"{nb.stem}.html", student, assignment,
                                  outcome.failure)
        else:
            _run_converter(GenerateFeedback(coursedir=coursedir, config=config))
            from .feedback import finish_feedback_pages
            finish_feedback_pages(feedback)
    outcome.seconds = time.perf_counter() - start
    return outcome


def _worker_main(job_file: str) -> int:
    """A worker process: grade the submission of JOB.json, write its outcome file."""
    job = json.loads(Path(job_file).read_text())
    outcome = grade_one(job)
    Path(job["outcome"]).write_text(outcome.to_json())
    return 0


def _die_with_parent() -> None:
    """In a worker: get SIGKILL when the grader dies (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


# ------------------------------------------------------------------------------------------------
# The class
# ------------------------------------------------------------------------------------------------

def grade(course_dir: str | os.PathLike = ".", *, gradebook: str | os.PathLike | None = None,
          csv_path: str | os.PathLike | None = None, timeout: int | None = None,
          force: bool = False, assignments: Sequence[str] | None = None,
          config_file: str | os.PathLike | None = None, feedback: bool = True,
          log: Callable[[str], None] | None = None, verbose: bool = False,
          workers: int | None = None, notebook_timeout: int | None = None,
          unsandboxed_trusted: bool = False) -> GradeRun:
    """Grade every submission in ``course_dir/submitted/<student>/<assignment>/``.

    Each submission is autograded in its own sandboxed kernel by a worker process (``workers``
    at a time, default: the number of cores); one that raises, hangs, exhausts its memory or
    kills its kernel is graded 0 where it stopped, with the reason, and the run goes on.
    Submissions already in the gradebook are kept unless ``force``. Feedback HTML goes to
    ``feedback/<student>/<assignment>/``, the table to ``csv_path`` (default
    ``course_dir/course_grades.csv``). timeout: seconds per cell; notebook_timeout: seconds per
    notebook (its kernel is then killed); unsandboxed_trusted: run kernels without the sandbox
    where bwrap cannot start (trusted notebooks only). Returns the rows and the timings.
    """
    _prepare_environment()
    from . import sandbox
    from .verdicts import expected_records

    say = log or (lambda message: None)

    def report(records: _LogRecords) -> None:
        if verbose:
            for level, message in records.records:
                if level >= logging.WARNING:
                    say(f"  nbgrader {logging.getLevelName(level).lower()}: {message}")

    config = course_config(course_dir, gradebook=gradebook, timeout=timeout,
                           config_file=config_file)
    _sandbox_settings(config, notebook_timeout=notebook_timeout,
                      unsandboxed_trusted=unsandboxed_trusted)
    trusted = bool(config.SandboxedKernelManager.get("unsandboxed_trusted", False))
    problem = sandbox.sandbox_problem()
    if problem and not trusted:
        raise sandbox.SandboxUnavailable(
            f"grade: cannot run submissions in a sandbox: {problem}. Refusing to grade "
            "untrusted notebooks without one; for trusted notebooks only, pass "
            "--unsandboxed-trusted.")
    if problem:
        say(f"WARNING: grading WITHOUT a sandbox ({problem}): trusted submissions only")
    coursedir = _course_directory(config)
    course = Path(coursedir.root)
    config_path = config_file or _config_path(course)

    known = set(assignments_in(course / coursedir.source_directory))
    pairs = _submissions(course, coursedir.submitted_directory)
    if assignments:
        pairs = [(s, a) for s, a in pairs if a in set(assignments)]
    status: dict[tuple[str, str], str] = {}
    for student, assignment in pairs:
        if assignment not in known:
            status[(student, assignment)] = "unknown assignment"
            say(f"{student}/{assignment}: no such assignment in {coursedir.source_directory}/")
    pairs = [(s, a) for s, a in pairs if a in known]
    submitted_root = course / coursedir.submitted_directory
    for student, assignment in list(pairs):
        if (submitted_root / student).is_symlink() or \
                (submitted_root / student / assignment).is_symlink():
            status[(student, assignment)] = REFUSED_LINK
            pairs.remove((student, assignment))
            say(f"{student}/{assignment}: {REFUSED_LINK}")
    needed = sorted({a for _, a in pairs})
    for assignment in needed:
        report(_register(config, assignment))
    done = graded_pairs(coursedir.db_url, coursedir.course_id) if not force else set()
    todo = [p for p in pairs if p not in done]
    for pair in pairs:
        if pair in done:
            status[pair] = "graded earlier"
    workers = max(1, workers or os.cpu_count() or 1)
    reasons: dict[tuple[str, str], str] = {}
    per_notebook: list[float] = []
    notebooks = 0
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="course-grade-") as scratch_dir:
        scratch = Path(scratch_dir)
        template = scratch / "template.db"
        verdict_cache = scratch / "verdicts"      # the solutions' records, run once per run
        secret = secrets.token_hex(32)            # this run's fresh inputs (secret.py)
        if todo:
            template_config = course_config(course, gradebook=template, config_file=config_path)
            for assignment in sorted({a for _, a in todo}):
                _register(template_config, assignment)
                for source in sorted((course / coursedir.source_directory / assignment)
                                     .glob("*.ipynb")):
                    expected_records(source, config, verdict_cache / assignment, secret)
            say(f"grading {len(todo)} submission(s) with {workers} worker(s)")
        jobs = [_prepare_job(scratch / f"job{i}", course, coursedir, template, config_path,
                             student, assignment, timeout=timeout,
                             notebook_timeout=notebook_timeout, trusted=trusted,
                             feedback=feedback, verdict_cache=verdict_cache, secret=secret)
                for i, (student, assignment) in enumerate(todo)]
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            running = [pool.submit(_run_worker, job) for job in jobs]
            for future in concurrent.futures.as_completed(running):
                job, outcome = future.result()
                key = (outcome.student, outcome.assignment)
                _store(job, outcome, course, coursedir)
                status[key] = (f"failed: {outcome.failure}" if outcome.failure
                               else "review: " + "; ".join(outcome.review) if outcome.review
                               else "graded")
                reasons[key] = "; ".join(outcome.reasons)
                count = max(1, len(outcome.grades))
                notebooks += count
                per_notebook += [outcome.seconds / count] * count
                say(f"{outcome.student}/{outcome.assignment}: {status[key]} "
                    f"({outcome.seconds:.1f} s)")
        seconds = time.perf_counter() - start
    rows = _gradebook_rows(coursedir, status, reasons)
    write_grades(rows, Path(csv_path) if csv_path else course / GRADES_CSV)
    return GradeRun(rows, len(todo), notebooks, seconds, per_notebook, workers)


def _config_path(course: Path) -> str | None:
    from .nbgrader_app import find_config
    found = find_config(course)
    return str(found) if found else None


def _prepare_job(folder: Path, course: Path, coursedir, template: Path, config_path,
                 student: str, assignment: str, *, timeout, notebook_timeout, trusted,
                 feedback, verdict_cache: Path, secret: str) -> dict:
    """A worker's scratch course: its submission, the assignment's source folder and a copy of
    the template gradebook."""
    root = folder / "course"
    rel = lambda step, who: Path(coursedir.format_path(step, who, assignment)).relative_to(course)
    links = _copy_plain_files(course / rel(coursedir.submitted_directory, student),
                              root / rel(coursedir.submitted_directory, student))
    shutil.copytree(course / coursedir.source_directory / assignment,
                    root / coursedir.source_directory / assignment)
    shutil.copy(template, folder / "gradebook.db")
    job = {"root": str(root), "gradebook": str(folder / "gradebook.db"),
           "student": student, "assignment": assignment, "config_file": config_path,
           "timeout": timeout, "notebook_timeout": notebook_timeout,
           "unsandboxed_trusted": trusted, "feedback": feedback,
           "outcome": str(folder / "outcome.json"), "folder": str(folder), "links": links,
           "verdict_cache": str(verdict_cache), "secret": secret}
    (folder / "job.json").write_text(json.dumps(job))
    return job


_WORKER = "import sys; from course.grading.grade import _worker_main; sys.exit(_worker_main(sys.argv[1]))"


def _copy_plain_files(source: Path, target: Path) -> list[str]:
    """Copy the regular files and folders of a submission; symbolic links are left out (one
    could point at another student's notebook or the course's files). Returns them."""
    links = []
    for folder, dirs, files in os.walk(source):
        here = Path(folder)
        (target / here.relative_to(source)).mkdir(parents=True, exist_ok=True)
        for name in [*dirs, *files]:
            path = here / name
            if path.is_symlink():
                links.append(path.relative_to(source).as_posix())
            elif path.is_file():
                shutil.copy2(path, target / path.relative_to(source))
        dirs[:] = [d for d in dirs if not (here / d).is_symlink()]
    return links


def _run_worker(job: dict) -> tuple[dict, Outcome]:
    started = time.perf_counter()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parents[2]), *filter(None, [env.get("PYTHONPATH")])])
    env["COURSE_VERDICTS_CACHE"] = job["verdict_cache"]     # shared: no worker reruns a solution
    env[SECRET_ENV] = job["secret"]                         # the run's: workers judge alike
    try:
        done = subprocess.run([sys.executable, "-c", _WORKER, str(Path(job["folder"]) / "job.json")],
                              cwd=job["folder"], env=env, capture_output=True, text=True,
                              preexec_fn=_die_with_parent, timeout=3600)
        text = Path(job["outcome"]).read_text() if Path(job["outcome"]).is_file() else None
        if text:
            return job, Outcome.from_json(text)
        reason = _last_error_line(done.stderr or done.stdout or f"exit {done.returncode}")
    except subprocess.TimeoutExpired:
        reason = "the worker ran past an hour"
    outcome = Outcome(job["student"], job["assignment"],
                      failure=f"the grader's worker failed: {reason}",
                      seconds=time.perf_counter() - started)
    return job, outcome


def _store(job: dict, outcome: Outcome, course: Path, coursedir) -> None:
    """Copy a worker's autograded notebooks and feedback into the course, then record the
    outcome in the gradebook (last: a submission counts as graded once it is recorded)."""
    root = Path(job["root"])
    for step in (coursedir.autograded_directory, coursedir.feedback_directory):
        target = Path(coursedir.format_path(step, outcome.student, outcome.assignment))
        source = root / target.relative_to(course)
        shutil.rmtree(target, ignore_errors=True)
        if source.is_dir():
            shutil.copytree(source, target)
    folder = Path(coursedir.format_path(coursedir.autograded_directory, outcome.student,
                                        outcome.assignment))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / OUTCOME_FILE).write_text(outcome.to_json())
    if outcome.failure and not Path(coursedir.format_path(
            coursedir.feedback_directory, outcome.student, outcome.assignment)).is_dir() \
            and job["feedback"]:
        pages = Path(coursedir.format_path(coursedir.feedback_directory, outcome.student,
                                           outcome.assignment))
        for nb in sorted((Path(coursedir.format_path(coursedir.submitted_directory,
                                                     outcome.student, outcome.assignment))
                          ).glob("*.ipynb")):
            _failure_feedback(pages / f"{nb.stem}.html", outcome.student, outcome.assignment,
                              outcome.failure)
    record(coursedir.db_url, coursedir.course_id, outcome)

