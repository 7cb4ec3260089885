"""The instructor's grade: every submission autograded in a sandbox, in parallel, recorded safely.

How a class is graded (:func:`grade`), in three steps:

1. **select**: the submissions in ``submitted/<student>/<assignment>/`` that are to be graded
   (an unknown assignment, a symbolic link and, unless ``force``, one already in the gradebook
   get a status instead); each assignment is registered in the course's gradebook.
2. **run**: each submission becomes a :class:`course.grading.worker.Job` in a scratch folder (a
   copy of its submission, of the assignment's source folder and of a template gradebook) and a
   worker process grades it (``workers`` at a time, default: the number of cores): nbgrader
   autograde, whose kernel runs in the sandbox of :mod:`course.grading.sandbox`, then the
   feedback page; the worker answers an :class:`course.grading.report.Outcome`.
3. **record**: the grader (this process, the only writer) copies the autograded notebook and the
   feedback into the course, then records the outcome in the gradebook in one transaction.
   sqlite is never written by two processes at once and a submission is either wholly recorded
   or absent: a grader killed mid-run keeps everything recorded so far, and the same command
   grades the rest.

course/grading/VERDICTS.md has the whole pipeline as a table.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import pickle
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from .nbgrader_app import (LogRecords, assignments_in, course_config, course_directory,
                           find_config, generate_assignment, last_error_line, prepare_environment)
from .report import (GRADES_CSV, OUTCOME_FILE, REFUSED_LINK, UNKNOWN_ASSIGNMENT, GradeRow,
                     Outcome, Status, gradebook_rows, graded_pairs, record, write_grades)
from .secret import SECRET_ENV
from .worker import Job, sandbox_settings
from .workers import ForkServer, WorkerStart, spawn_job

if TYPE_CHECKING:                             # profiling imports nbconvert: only when asked
    from .profiling import Profile


@dataclass(frozen=True)
class GradeOptions:
    """How a class is graded (every field has the command line's default)."""

    gradebook: str | os.PathLike | None = None   # default: course_dir/gradebook.db
    csv_path: str | os.PathLike | None = None    # default: course_dir/course_grades.csv
    config_file: str | os.PathLike | None = None  # default: the nearest nbgrader_config.py
    timeout: int | None = None                   # seconds per cell
    notebook_timeout: int | None = None          # seconds per notebook (its kernel is killed)
    force: bool = False                          # grade again what the gradebook has
    assignments: Sequence[str] | None = None     # only these assignments
    feedback: bool = True                        # write feedback pages
    workers: int | None = None                   # default: the number of cores
    unsandboxed_trusted: bool = False            # where bwrap cannot start: trusted only
    verbose: bool = False                        # show nbgrader's warnings
    progress: bool = False                       # a progress bar (course/grading/progress.py)
    profile: bool = False                        # time each phase (course/grading/profiling.py)
    worker_start: WorkerStart = "fork"           # each job's process: forked warm, or spawned
    zygote: bool = True                          # fork the kernels from one warm sandbox


@dataclass(frozen=True)
class GradeRun:
    """What a grade run did: the table's rows and how long it took."""

    rows: list[GradeRow]
    graded: int                  # submissions graded in this run
    notebooks: int               # notebooks run in this run
    seconds: float               # wall time of the grading (workers), start to last record
    per_notebook: list[float]    # each worker's wall time divided by its notebooks
    workers: int
    profile: "Profile | None" = None   # with options.profile: where the seconds went

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


def _register(config, assignment: str) -> LogRecords:
    """Record an assignment's cells (tests, points, checksums, hidden tests) in the gradebook
    (nbgrader generate_assignment into a scratch folder: exercises/ is not touched)."""
    with tempfile.TemporaryDirectory() as scratch:
        coursedir = course_directory(config, assignment_id=assignment, release_directory=scratch)
        records, _ = generate_assignment(
            config, coursedir, no_database=False,
            failure=f"grade: nbgrader could not register {assignment}")
    return records


@dataclass
class Selection:
    """What a run will grade (``todo``) and the status of every submission it refuses (a
    submission graded earlier keeps its recorded status)."""

    todo: list[tuple[str, str]]
    status: dict[tuple[str, str], Status] = field(default_factory=dict)


def select(config, coursedir, options: GradeOptions, say: Callable[[str], None]) -> Selection:
    """Step 1: the (student, assignment) pairs to grade; an unknown assignment and a symbolic
    link get a status instead, and (unless ``force``) a submission already in the gradebook is
    left as recorded."""
    course = Path(coursedir.root)
    known = set(assignments_in(course / coursedir.source_directory))
    pairs = _submissions(course, coursedir.submitted_directory)
    if options.assignments:
        pairs = [(s, a) for s, a in pairs if a in set(options.assignments)]
    selection = Selection([])
    submitted_root = course / coursedir.submitted_directory
    for student, assignment in pairs:
        key = (student, assignment)
        if assignment not in known:
            selection.status[key] = UNKNOWN_ASSIGNMENT
            say(f"{student}/{assignment}: no such assignment in {coursedir.source_directory}/")
        elif (submitted_root / student).is_symlink() or \
                (submitted_root / student / assignment).is_symlink():
            selection.status[key] = REFUSED_LINK
            say(f"{student}/{assignment}: {REFUSED_LINK}")
        else:
            selection.todo.append(key)
    for assignment in sorted({a for _, a in selection.todo}):
        _log_warnings(_register(config, assignment), options, say)
    done = set() if options.force else graded_pairs(coursedir.db_url, coursedir.course_id)
    selection.todo = [p for p in selection.todo if p not in done]
    return selection


def _log_warnings(records: LogRecords, options: GradeOptions, say: Callable[[str], None]) -> None:
    if options.verbose:
        for level, message in records.records:
            if level >= logging.WARNING:
                say(f"  nbgrader {logging.getLevelName(level).lower()}: {message}")


def run(todo: list[tuple[str, str]], config, coursedir, options: GradeOptions,
        scratch: Path, say: Callable[[str], None],
        profile: "Profile | None" = None) -> Iterator[tuple[Job, Outcome]]:
    """Step 2: grade each pair in a worker process, ``options.workers`` at a time, in scratch
    folders under ``scratch``; yields each job with its outcome as it finishes. With
    ``profile``, the solutions' records and the assignments' registration are timed there."""
    timed = (lambda phase: profile.time(phase)) if profile is not None \
        else (lambda phase: contextlib.nullcontext())

    course = Path(coursedir.root)
    config_path = str(options.config_file) if options.config_file else _config_path(course)
    trusted = bool(config.SandboxedKernelManager.get("unsandboxed_trusted", False))
    template = scratch / "template.db"
    verdict_cache = scratch / "verdicts"      # the solutions' records, run once per run
    secret = secrets.token_hex(32)            # this run's fresh inputs (secret.py)
    template_config = course_config(course, gradebook=template, config_file=config_path)
    assignments = sorted({a for _, a in todo})
    for assignment in assignments:
        with timed("nbgrader: the assignments registered (grader)"):
            _register(template_config, assignment)
    sources = [(assignment, source) for assignment in assignments for source in
               sorted((course / coursedir.source_directory / assignment).glob("*.ipynb"))]
    workers = _workers(options)
    with contextlib.ExitStack() as stack:
        zygote = _start_zygote(stack, options, workers, trusted, say)
        server = stack.enter_context(ForkServer(worker_environment(workers=workers))) \
            if options.worker_start == "fork" else None
        with timed(f"the solutions' records, once per assignment, {workers} at a time (grader)"):
            solution_records(sources, config, verdict_cache, secret, server, workers, scratch,
                             zygote)
        say(f"grading {len(todo)} submission(s) with {workers} worker(s)")
        jobs = [_prepare_job(scratch / f"job{i}", coursedir, template, student, assignment,
                             Job(student, assignment, folder="", root="",
                                 config_file=config_path, secret=secret,
                                 verdict_cache=str(verdict_cache), timeout=options.timeout,
                                 notebook_timeout=options.notebook_timeout,
                                 unsandboxed_trusted=trusted, feedback=options.feedback,
                                 profile=options.profile, zygote=zygote))
                for i, (student, assignment) in enumerate(todo)]
        pool = stack.enter_context(concurrent.futures.ThreadPoolExecutor(workers))
        running = [pool.submit(_run_worker, job, server, workers) for job in jobs]
        for future in concurrent.futures.as_completed(running):
            yield future.result()


def _start_zygote(stack: contextlib.ExitStack, options: GradeOptions, workers: int,
                  trusted: bool, say: Callable[[str], None]) -> str:
    """The socket of the run's zygote (course/grading/sandbox/zygote.py), stopped when the
    run ends; "" when it is off, where kernels are not sandboxed, or where it cannot start
    (then each kernel starts fresh, as it would without it)."""
    from .sandbox import sandbox_problem
    from .sandbox.zygote import Zygote, ZygoteUnavailable
    if not options.zygote or sandbox_problem() is not None and trusted:
        return ""
    try:
        zygote = Zygote(environ=worker_environment(workers=workers)).start()
    except ZygoteUnavailable as error:
        say(f"note: each kernel starts fresh ({error})")
        return ""
    stack.callback(zygote.stop)
    return zygote.socket_path


def solution_records(sources: list[tuple[str, Path]], config, cache: Path, secret: str,
                     server: ForkServer | None, workers: int, scratch: Path,
                     zygote: str = "") -> None:
    """Run each (assignment, solution notebook) once with its tests (the records every
    submission of the assignment is judged against: course/grading/judging.py) into
    ``cache/<assignment>``, where the workers look for them: ``workers`` at a
    time in processes forked by ``server``, or one after another in this process without one.
    Raises RuntimeError, naming the solution, when one fails its own tests."""
    from .judging import RECORDS_ERROR, expected_records    # nbconvert: only when grading
    if server is None:
        for assignment, source in sources:
            expected_records(source, config, cache / assignment, secret)
        return

    def run_one(index: int, assignment: str, source: Path) -> None:
        job = scratch / "records" / f"{index}" / "records.pickle"
        job.parent.mkdir(parents=True)
        job.write_bytes(pickle.dumps((str(source), config, str(cache / assignment), secret)))
        ended = server.run_job(job, worker_environment(workers=workers, zygote=zygote),
                               timeout=WORKER_TIMEOUT, target="course.grading.judging:records_job")
        error = job.with_name(job.name + RECORDS_ERROR)
        if error.is_file():
            raise RuntimeError(error.read_text())
        if ended.returncode != 0:
            how = "past the timeout" if ended.returncode is None else f"exit {ended.returncode}"
            raise RuntimeError(f"the solution {source} could not be run for its records "
                               f"({how}): {last_error_line(ended.output or 'no output')}")

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for done in [pool.submit(run_one, i, *pair) for i, pair in enumerate(sources)]:
            done.result()

def _workers(options: GradeOptions) -> int:
    return max(1, options.workers or os.cpu_count() or 1)


def grade(course_dir: str | os.PathLike = ".", options: GradeOptions | None = None, *,
          log: Callable[[str], None] | None = None, **settings) -> GradeRun:
    """Grade every submission in ``course_dir/submitted/<student>/<assignment>/``.

    ``options`` (or its fields as keywords, e.g. ``timeout=10``) says how: see
    :class:`GradeOptions`. Each submission is autograded in its own sandboxed kernel by a worker
    process; one that raises, hangs, exhausts its memory or kills its kernel is graded 0 where
    it stopped, with the reason, and the run goes on. Submissions already in the gradebook are
    kept unless ``force``. Feedback HTML goes to ``feedback/<student>/<assignment>/``, the table
    to the CSV. Returns the rows and the timings.
    """
    options = replace(options or GradeOptions(), **settings)
    prepare_environment()
    from . import sandbox

    say = log or (lambda message: None)
    config = course_config(course_dir, gradebook=options.gradebook, timeout=options.timeout,
                           config_file=options.config_file)
    sandbox_settings(config, notebook_timeout=options.notebook_timeout,
                     unsandboxed_trusted=options.unsandboxed_trusted)
    trusted = bool(config.SandboxedKernelManager.get("unsandboxed_trusted", False))
    problem = sandbox.sandbox_problem()
    if problem and not trusted:
        raise sandbox.SandboxUnavailable(
            f"grade: cannot run submissions in a sandbox: {problem}. Refusing to grade "
            "untrusted notebooks without one; for trusted notebooks only, pass "
            "--unsandboxed-trusted.")
    if problem:
        say(f"WARNING: grading WITHOUT a sandbox ({problem}): trusted submissions only")
    coursedir = course_directory(config)
    course = Path(coursedir.root)

    profile = None
    if options.profile:
        from .profiling import Profile
        profile = Profile()
    started = time.perf_counter()
    selection = select(config, coursedir, options, say)
    if profile is not None:
        profile.add("selecting and registering the submissions (grader)",
                    time.perf_counter() - started)
    status, reasons = dict(selection.status), {}
    per_notebook: list[float] = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="course-grade-") as scratch:
        if selection.todo:
            bar = _progress(course, coursedir, selection.todo, options)
            try:
                for job, outcome in run(selection.todo, config, coursedir, options,
                                        Path(scratch), say, profile):
                    record_outcome(job, outcome, coursedir)          # step 3
                    key = (outcome.student, outcome.assignment)
                    status[key], reasons[key] = Status.of(outcome), "; ".join(outcome.reasons)
                    count = max(1, len(outcome.grades))
                    per_notebook += [outcome.seconds / count] * count
                    message = (f"{outcome.student}/{outcome.assignment}: {status[key]} "
                               f"({outcome.seconds:.1f} s)")
                    if bar is None:
                        say(message)
                    else:
                        bar.write(message, say)
                        bar.update(count)
                    if profile is not None:
                        _add_worker_profile(profile, job, outcome)
            finally:
                if bar is not None:
                    bar.close()
    seconds = time.perf_counter() - start
    rows = gradebook_rows(coursedir, status, reasons)
    write_grades(rows, Path(options.csv_path) if options.csv_path else course / GRADES_CSV)
    return GradeRun(rows, len(selection.todo), len(per_notebook), seconds, per_notebook,
                    _workers(options), profile)


def _progress(course: Path, coursedir, todo: list[tuple[str, str]], options: GradeOptions):
    """The run's progress bar over its notebooks (the source notebooks of each assignment), or
    None when ``options.progress`` is off."""
    if not options.progress:
        return None
    from .progress import Progress
    source = course / coursedir.source_directory
    counts = {a: max(1, len(list((source / a).glob("*.ipynb")))) for _, a in todo}
    return Progress(sum(counts[a] for _, a in todo), desc="grading")


def _add_worker_profile(profile, job: Job, outcome: Outcome) -> None:
    """A worker's phases (course/grading/profiling.py), summed into the run's ``profile``, and
    its process's start (Python, nbgrader's imports) and end."""
    from .profiling import read
    found = read(job.folder)
    if found is not None:
        profile.merge(found)
    wall = Path(job.folder) / "worker-seconds"
    if wall.is_file():
        profile.add("worker process: Python, imports, exit", float(wall.read_text())
                    - outcome.seconds)


# ------------------------------------------------------------------------------------------------
# Jobs
# ------------------------------------------------------------------------------------------------

def _config_path(course: Path) -> str | None:
    found = find_config(course)
    return str(found) if found else None


def _prepare_job(folder: Path, coursedir, template: Path, student: str, assignment: str,
                 settings: Job) -> Job:
    """A worker's scratch course in ``folder``: its submission (plain files only), the
    assignment's source folder and a copy of the template gradebook; the job saved there."""
    course = Path(coursedir.root)
    root = folder / "course"
    rel = lambda step, who: Path(coursedir.format_path(step, who, assignment)).relative_to(course)
    links = _copy_plain_files(course / rel(coursedir.submitted_directory, student),
                              root / rel(coursedir.submitted_directory, student))
    shutil.copytree(course / coursedir.source_directory / assignment,
                    root / coursedir.source_directory / assignment)
    job = replace(settings, folder=str(folder), root=str(root), links=tuple(links))
    shutil.copy(template, job.gradebook)
    job.save()
    return job


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


def _run_worker(job: Job, server: ForkServer | None, workers: int) -> tuple[Job, Outcome]:
    """Grade ``job`` in a process of its own (one of ``workers`` at a time): forked by ``server``,
    or a new interpreter (also where the server has stopped: it never takes the rest of the
    class with it)."""
    started = time.perf_counter()
    env = worker_environment(job, workers)
    ended = server.run_job(job.job_file, env, timeout=WORKER_TIMEOUT) \
        if server is not None and server.alive \
        else spawn_job(job.job_file, env, timeout=WORKER_TIMEOUT)
    if job.profile:
        (Path(job.folder) / "worker-seconds").write_text(str(time.perf_counter() - started))
    text = job.outcome_file.read_text() if job.outcome_file.is_file() else None
    if text:
        return job, Outcome.from_json(text)
    if ended.returncode is None:
        reason = "the worker ran past an hour"
    else:
        reason = last_error_line(ended.output or f"exit {ended.returncode}")
    outcome = Outcome(job.student, job.assignment,
                      failure=f"the grader's worker failed: {reason}",
                      seconds=time.perf_counter() - started)
    return job, outcome


def kernel_threads(workers: int) -> int:
    """torch's threads for each kernel when ``workers`` kernels run at once: the machine's cores
    shared out, at least one each. With a thread per core in every kernel, two kernels on two
    cores fight for them (OpenMP's threads wait spinning for work): on the 2-core machine the
    test cells of 12 notebooks took 21-22 s on 2 workers with 2 threads per kernel, 16 s with
    1 (the grading profile, one run each way, twice)."""
    return max(1, (os.cpu_count() or 1) // max(1, workers))


def worker_environment(job: Job | None = None, workers: int = 1,
                       zygote: str = "") -> dict[str, str]:
    """A worker's environment: the grader's, with the course importable (PYTHONPATH), the
    kernels' share of the cores (``OMP_NUM_THREADS``, :func:`kernel_threads`, unless the grader's
    environment sets it; the sandbox passes it on), the run's zygote (``zygote``, or the
    ``job``'s) and the run's shared records and secret when there is a ``job``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parents[2]), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("OMP_NUM_THREADS", str(kernel_threads(workers)))
    zygote = job.zygote if job is not None and job.zygote else zygote
    if zygote:
        from .sandbox.zygote import ZYGOTE_ENV
        env[ZYGOTE_ENV] = zygote
    if job is not None:
        env["COURSE_VERDICTS_CACHE"] = job.verdict_cache   # shared: no worker reruns a solution
        env[SECRET_ENV] = job.secret                       # the run's: workers judge alike
    return env


WORKER_TIMEOUT = 3600
"""Seconds a worker may take for one submission (its kernel has its own, shorter limits)."""


def record_outcome(job: Job, outcome: Outcome, coursedir) -> None:
    """Step 3: copy a worker's autograded notebooks and feedback into the course, then record the
    outcome in the gradebook (last: a submission counts as graded once it is recorded)."""
    course, root = Path(coursedir.root), Path(job.root)
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
    if outcome.failure and job.feedback:      # the worker wrote no page: the notebook stopped
        from .feedback import write_failure_pages
        notebooks = Path(coursedir.format_path(coursedir.submitted_directory, outcome.student,
                                               outcome.assignment)).glob("*.ipynb")
        write_failure_pages(Path(coursedir.format_path(coursedir.feedback_directory,
                                                       outcome.student, outcome.assignment)),
                            [nb.stem for nb in notebooks], outcome.student, outcome.assignment,
                            outcome.failure)
    record(coursedir.db_url, coursedir.course_id, outcome)

