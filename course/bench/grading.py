"""Section ``grading``: a class graded at scale by the course's grader, measured (issue 24).

A class of students (40 by default) each submits every assignment of the course; each submission
is honest (tests/grading/honest.py: a correct answer written another way), wrong (the mutants of
tests/grading/mutants*.py) or hostile (the cheats of tests/grading/cheats.py and cheats_ops.py),
in a fixed mix. The whole class is graded in one run of the course's grader (sandboxed, with
feedback pages), as ``python -m course.grading grade`` grades it. Measured: wall time, notebooks
per minute, the peak memory of the grader's processes (the sum of their resident sets, sampled:
shared pages are counted once per process, so it is an upper bound), and the disk the run wrote
(gradebook, autograded notebooks, feedback pages). On paper, from the measured rate: a 16-core
machine and a hub of 500 students.

The submissions are the repository's test data (tests/grading, which the learner edition leaves
out) and are built by tests/classroom.py, which needs the dev install (pytest).
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import TextIO

import torch

NAME = "grading"
ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"

STUDENTS, QUICK_STUDENTS = 40, 2
MIX = ("honest", "honest", "wrong", "honest", "wrong", "hostile")
"""The kind of each student's submission, in turn (student i, assignment j: MIX[(i + j) % 6]):
half honest, a third wrong, a sixth hostile."""
HUB_STUDENTS, BIG_MACHINE_CORES = 500, 16


def _classroom():
    """tests/classroom.py and the test data modules, or an ImportError saying what is missing."""
    if not (TESTS / "classroom.py").is_file():
        raise ImportError(f"the grading benchmark needs the repository's tests/ (not found under "
                          f"{ROOT}; the learner edition has none)")
    sys.path[:0] = [p for p in (str(TESTS), str(TESTS / "grading")) if p not in sys.path]
    classroom = importlib.import_module("classroom")       # needs pytest: the dev install
    sys.modules.setdefault("mutants", classroom.mutants)   # cheats.py imports it by this name
    return classroom


def _pools(classroom) -> dict[str, dict[str, list]]:
    """kind -> assignment -> the submissions of that kind the test data holds."""
    honest = classroom.load_data("grading_honest", classroom.DATA / "honest.py")
    wrong = list(classroom.mutants.WRONG)
    for path in sorted(classroom.DATA.glob("mutants_*.py")):
        wrong += classroom.load_data(f"grading_{path.stem}", path).WRONG
    cheats = importlib.import_module("cheats")
    hostile = list(cheats.CHEATS) + list(importlib.import_module("cheats_ops").OP_CHEATS)
    pools: dict[str, dict[str, list]] = {}
    for kind, subs in (("honest", honest.HONEST_VARIANTS), ("wrong", wrong),
                       ("hostile", hostile)):
        for sub in subs:
            pools.setdefault(kind, {}).setdefault(sub.assignment, []).append(sub)
    return pools


def build_class(course: Path, students: int, assignments: list[str]) -> Counter:
    """Submit ``students`` x ``assignments`` notebooks into ``course`` (a new course folder);
    returns how many of each kind. A kind with no submission for an assignment falls back to
    the solution (honest)."""
    classroom = _classroom()
    classroom.new_course(course)
    pools = _pools(classroom)
    kinds: Counter = Counter()
    for i in range(students):
        for j, assignment in enumerate(assignments):
            kind = MIX[(i + j) % len(MIX)]
            pool = pools.get(kind, {}).get(assignment) or []
            if not pool:
                kind, pool = "honest", pools["honest"].get(assignment) or []
            if pool:
                sub = pool[(i * 7 + j) % len(pool)]
                nb = classroom.submission(assignment, answered=sub.answered, edits=sub.edits)
            else:                                    # no variant at all: the plain solution
                nb = classroom.submission(assignment, answered=True)
            classroom.submit(course, f"s{i:03d}_{kind}", assignment, nb)
            kinds[kind] += 1
    return kinds


class MemorySampler:
    """The peak of the summed resident set of this process and all its descendants (workers,
    kernels, sandboxes), sampled every ``interval`` seconds in a thread."""

    def __init__(self, interval: float = 0.5):
        self.interval, self.peak, self._stop = interval, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> int:
        import psutil
        me = psutil.Process()
        total = 0
        for proc in [me, *me.children(recursive=True)]:
            try:
                total += proc.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        return total

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._sample())
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def disk_bytes(folder: Path) -> int:
    """Bytes on disk (allocated blocks, as du counts) under ``folder``."""
    return sum(p.lstat().st_blocks * 512 for p in folder.rglob("*") if p.is_file())


def projection(rate_per_min: float, cores_used: int, notebooks: int, per_notebook_disk: float,
               peak_per_worker: float, assignments: int) -> list[str]:
    """On-paper lines from the measured rate: the same run on a 16-core machine, and a hub of
    500 students grading every assignment once (assuming the rate grows with the cores, which
    holds while grading is CPU-bound: each notebook's kernel runs on one core at a time)."""
    rate16 = rate_per_min * BIG_MACHINE_CORES / max(cores_used, 1)
    hub = HUB_STUDENTS * assignments
    return [
        f"on paper, {BIG_MACHINE_CORES} cores ({BIG_MACHINE_CORES} workers): about "
        f"{rate16:.0f} notebooks/min, this class ({notebooks} notebooks) in "
        f"{notebooks / rate16:.1f} min, peak memory about "
        f"{peak_per_worker * BIG_MACHINE_CORES / 2**30:.1f} GiB",
        f"on paper, a hub of {HUB_STUDENTS} students x {assignments} assignments = {hub} "
        f"notebooks: {hub / rate16 / 60:.1f} h on {BIG_MACHINE_CORES} cores "
        f"({hub / rate_per_min / 60:.1f} h at this run's rate), one assignment's "
        f"{HUB_STUDENTS} notebooks in {HUB_STUDENTS / rate16:.0f} min; disk about "
        f"{hub * per_notebook_disk / 2**30:.2f} GiB",
    ]


COMPARE_STUDENTS, COMPARE_ROUNDS = 2, 2
"""The worker-start comparison: this many honest students x every assignment, graded this many
rounds in each way, the ways alternating (a shared machine's load falls on both)."""


def compare_worker_start(out: TextIO, assignments: list[str], *, students: int, rounds: int,
                         workers: int) -> None:
    """Grade the same honest class in turn with a new interpreter per notebook (the grader's
    start before issue 34: ``worker_start="spawn"``) and with processes forked from the warm
    server (``"fork"``, the default); print each way's median rate and the ratio."""
    from course.grading import grade
    classroom = _classroom()
    rates: dict[str, list[float]] = {"spawn": [], "fork": []}
    notebooks = students * len(assignments)
    for round_ in range(rounds):
        for start in rates:
            with tempfile.TemporaryDirectory(prefix="course-bench-start-") as folder:
                course = classroom.new_course(Path(folder) / "course")
                for i in range(students):
                    for assignment in assignments:
                        classroom.submit(course, f"s{i}", assignment,
                                         classroom.submission(assignment, answered=True))
                began: dict[str, float] = {}

                def mark(message: str) -> None:
                    if message.startswith("grading ") and "submission" in message:
                        began.setdefault("submissions", time.perf_counter())

                result = grade(course, gradebook=course / "gradebook.db", workers=workers,
                               log=mark, worker_start=start)
                seconds = time.perf_counter() - began["submissions"]
                full = sum(r.score == r.max_score > 0 for r in result.rows)
            if full != notebooks:
                raise RuntimeError(f"worker start {start}: {full} of {notebooks} honest "
                                   "notebooks kept full marks; the comparison is void")
            rates[start].append(notebooks / seconds * 60)
            print(f"[worker start] round {round_ + 1}, {start}: {notebooks} notebooks in "
                  f"{seconds:.0f} s", file=sys.stderr, flush=True)
    spawn, fork = (sorted(rates[k])[len(rates[k]) // 2] for k in ("spawn", "fork"))
    out.write(f"worker start ({students} honest students x {len(assignments)} assignments = "
              f"{notebooks} notebooks, {workers} workers, {rounds} rounds alternating, median): "
              f"a new interpreter per notebook {spawn:.1f} notebooks/min, forked from the warm "
              f"server {fork:.1f} notebooks/min: {fork / spawn:.2f}x\n")
    out.flush()


def run(out: TextIO, *, quick: bool = False, device: torch.device | str | None = None,
        students: int | None = None, workers: int | None = None) -> None:
    """Grade a class and write the measurements to ``out`` (``device`` is unused: grading runs
    on the CPU; the grader's progress goes to stderr). --quick: 2 students x 2 assignments, a
    smoke run, not a measurement."""
    from course.grading import grade
    from course.grading.nbgrader_app import assignments_in
    from llmcore.device import usable_cores

    out.write(f"== {NAME}: a class graded by the course's grader (sandboxed) ==\n")
    try:
        _classroom()
    except ImportError as error:
        out.write(f"skipped: {error}\n")
        return
    known = _classroom().ALL_ASSIGNMENTS
    assignments = [a for a in assignments_in(ROOT / "solutions") if a in known]
    students = students or (QUICK_STUDENTS if quick else STUDENTS)
    if quick:
        assignments = assignments[:2]
    cores = usable_cores()
    workers = workers or cores
    compare_worker_start(out, assignments, students=1 if quick else COMPARE_STUDENTS,
                         rounds=1 if quick else COMPARE_ROUNDS, workers=workers)
    with tempfile.TemporaryDirectory(prefix="course-bench-grading-") as folder:
        course = Path(folder) / "course"
        kinds = build_class(course, students, assignments)
        notebooks = sum(kinds.values())
        before = disk_bytes(course)
        out.write(f"class: {students} students x {len(assignments)} assignments = {notebooks} "
                  f"notebooks ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}); "
                  f"{workers} workers on {cores} usable cores"
                  f"{'   (--quick: a smoke run, not a measurement)' if quick else ''}\n")
        out.flush()
        start = time.perf_counter()
        marks: dict[str, float] = {}

        def progress(message: str) -> None:
            now = time.perf_counter() - start
            if message.startswith("grading ") and "submission" in message:
                marks.setdefault("submissions", now)   # the solutions' records are done
            print(f"[{now:5.0f} s] {message}", file=sys.stderr, flush=True)

        with MemorySampler() as memory:
            result = grade(course, gradebook=course / "gradebook.db", workers=workers,
                           log=progress, progress=True)
        seconds = time.perf_counter() - start
        written = disk_bytes(course) - before
        pages = sorted((course / "feedback").rglob("*.html"))
        sizes = [p.stat().st_size for p in pages] or [0]
        statuses = Counter(r.status.state.value for r in result.rows)
    setup = marks.get("submissions", 0.0)
    rate = notebooks / (seconds - setup) * 60
    out.write(f"graded: {len(result.rows)} rows "
              f"({', '.join(f'{n} {s}' for s, n in sorted(statuses.items()))})\n")
    out.write(f"wall time: {seconds:.0f} s: the solutions' records {setup:.0f} s (once per "
              f"assignment, cached), then the submissions at {rate:.1f} notebooks/min "
              f"({notebooks / seconds * 60:.1f} notebooks/min overall)\n")
    out.write(f"peak memory (summed resident sets of the grader's processes): "
              f"{memory.peak / 2**30:.2f} GiB\n")
    out.write(f"disk written: {written / 2**20:.0f} MiB ({written / notebooks / 2**10:.0f} KiB per "
              f"notebook); feedback pages: {len(pages)}, largest {max(sizes) / 1e3:.0f} kB, "
              f"median {sorted(sizes)[len(sizes) // 2] / 1e3:.0f} kB\n")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    out.write(f"load average at the end: {load:.1f} on {cores} cores (a shared machine makes "
              f"every figure pessimistic)\n")
    out.write("the projections use the submissions' rate (the solutions' records add about "
              f"{setup / 60:.0f} min once, whatever the class size)\n")
    for line in projection(rate, min(workers, cores), notebooks, written / notebooks,
                           memory.peak / max(min(workers, cores), 1), len(assignments)):
        out.write(line + "\n")
