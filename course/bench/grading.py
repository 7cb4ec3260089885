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
import json
import os
import statistics
import subprocess
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


BASELINE = "72599b74f76a0a2c24857f729c21d846017f8131"
"""The course as it was when issue 34 (the learner's and the instructor's loop) was taken up,
before its first commit: "today's pipeline", which the goals are ratios against. It is run from
a copy of that revision (``git archive``), in the same run as the current code."""

COMPARE_STUDENTS, COMPARE_ROUNDS, CHECK_ROUNDS = 2, 2, 3
"""The comparison: this many honest students x every assignment, graded this many rounds by
each pipeline, the pipelines alternating (a shared machine's load falls on both); the learner's
check timed this many times each."""

CHECK_NOTEBOOK = "exercises/01_matmul/matmul.ipynb"

_CLASS_DRIVER = """
import json, sys, time
sys.path[:0] = ["tests", "tests/grading"]
from pathlib import Path
import classroom
from course.grading import grade
course = classroom.new_course(Path(sys.argv[1]))
students, assignments, workers = int(sys.argv[2]), sys.argv[3].split(","), int(sys.argv[4])
for i in range(students):
    for a in assignments:
        classroom.submit(course, f"s{i}", a, classroom.submission(a, answered=True))
began = {}
def mark(message):
    if message.startswith("grading ") and "submission" in message:
        began.setdefault("submissions", time.perf_counter())
start = time.perf_counter()
run = grade(course, gradebook=course / "gradebook.db", workers=workers, log=mark)
end = time.perf_counter()
print(json.dumps({"notebooks": len(run.rows), "whole": end - start,
                  "submissions": end - began["submissions"],
                  "full": sum(r.score == r.max_score > 0 for r in run.rows)}))
"""
"""Grades an honest class with the grader of the tree it runs in (argv: course folder,
students, assignments, workers); prints the times as JSON. Both pipelines have this API."""


def baseline_tree(folder: Path) -> Path:
    """The BASELINE revision's files in ``folder`` (from this checkout's git history)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", BASELINE], capture_output=True)
    if archive.returncode != 0:
        raise RuntimeError(f"cannot read revision {BASELINE[:10]} from {ROOT} (a git checkout "
                           f"with its history is needed): {archive.stderr.decode().strip()}")
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder


def _in_tree(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])}


def _grade_class(tree: Path, course: Path, students: int, assignments: list[str],
                 workers: int) -> dict:
    done = subprocess.run([sys.executable, "-c", _CLASS_DRIVER, str(course), str(students),
                           ",".join(assignments), str(workers)], cwd=tree, env=_in_tree(tree),
                          capture_output=True, text=True, timeout=7200)
    if done.returncode != 0:
        raise RuntimeError(f"grading a class with the pipeline in {tree} failed: "
                           f"{done.stderr.strip().splitlines()[-1:] or done.returncode}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    if figures["full"] != figures["notebooks"]:
        raise RuntimeError(f"the pipeline in {tree}: {figures['full']} of {figures['notebooks']}"
                           " honest notebooks kept full marks; the comparison is void")
    return figures


def _time_check(tree: Path, *options: str, env: dict[str, str] | None = None
                ) -> tuple[float, float]:
    """(seconds to the check's first line, seconds to its end) for the untouched exercise."""
    start = time.perf_counter()
    first = None
    with subprocess.Popen([sys.executable, "-m", "course.grading", "check", *options,
                           CHECK_NOTEBOOK], cwd=tree, env={**_in_tree(tree), **(env or {})},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as check:
        for line in check.stdout:
            if first is None and line.strip():
                first = time.perf_counter() - start
    total = time.perf_counter() - start
    return (total if first is None else first), total


def _time_checks(old: Path, rounds: int) -> dict[str, list[tuple[float, float]]]:
    """The learner's check timed ``rounds`` times each way, the ways alternating: BASELINE's
    pipeline ("then"); this checkout's with no kernel ready ("cold", ``--no-standby``); and this
    checkout's in the learner's loop, where the previous check left a standby kernel
    (course/grading/standby.py; one untimed check leaves the first). Before each timing the
    standby has finished starting, so no run shares the machine with one."""
    from course.grading import standby
    loop = {standby.SWITCH: "1"}
    ways = {"then": (old, (), None), "cold": (ROOT, ("--no-standby",), None),
            "loop": (ROOT, (), loop)}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
    try:
        _time_check(ROOT, env=loop)                       # leaves the first standby
        for _ in range(rounds):
            for name, (tree, options, env) in ways.items():
                standby.settle()
                times[name].append(_time_check(tree, *options, env=env))
    finally:
        standby.stop_all()
    return times


def compare_with_baseline(out: TextIO, assignments: list[str], *, students: int, rounds: int,
                          check_rounds: int, workers: int) -> None:
    """The goals of issue 34 as ratios in one run: the learner's check on an untouched exercise
    and an honest class graded, by BASELINE's pipeline and by this checkout's, alternating."""
    with tempfile.TemporaryDirectory(prefix="course-bench-baseline-") as folder:
        try:
            old = baseline_tree(Path(folder) / "baseline")
        except (RuntimeError, OSError) as error:
            out.write(f"against the earlier pipeline: skipped ({error})\n")
            return
        assignments = [a for a in assignments if (old / "solutions" / a).is_dir()]
        trees = {"then": old, "now": ROOT}
        checks = _time_checks(old, check_rounds)
        classes: dict[str, list[dict]] = {name: [] for name in trees}
        for round_ in range(rounds):
            for name, tree in trees.items():
                course = Path(folder) / f"class-{name}-{round_}"
                classes[name].append(_grade_class(tree, course, students, assignments, workers))
                figures = classes[name][-1]
                print(f"[against {BASELINE[:10]}] round {round_ + 1}, {name}: "
                      f"{figures['notebooks']} notebooks in {figures['whole']:.0f} s",
                      file=sys.stderr, flush=True)
    first = {n: statistics.median_high([c[0] for c in times]) for n, times in checks.items()}
    whole = {n: statistics.median_high([c[1] for c in times]) for n, times in checks.items()}
    out.write(f"against the pipeline of {BASELINE[:10]} (before issue 34), in this run, "
              f"medians:\n")
    out.write(f"  the learner's check on the untouched {CHECK_NOTEBOOK}: {whole['then']:.1f} s "
              f"then; now {whole['loop']:.1f} s in the learner's loop (the kernel the previous "
              f"check left ready): {whole['then'] / whole['loop']:.2f}x faster (goal 3x); "
              f"{whole['cold']:.1f} s with none ready (--no-standby): "
              f"{whole['then'] / whole['cold']:.2f}x; first line after {first['then']:.1f} s "
              f"then, {first['loop']:.1f} s now\n")
    notebooks = classes["now"][0]["notebooks"]
    for part, label in (("submissions", "the submissions"),
                        ("whole", "the whole run (the solutions' records included)")):
        rate = {n: statistics.median_high([notebooks / c[part] * 60 for c in classes[n]]) for n in trees}
        out.write(f"  a class of {students} honest students x {len(assignments)} assignments "
                  f"= {notebooks} notebooks on {workers} workers, {label}: "
                  f"{rate['then']:.1f} notebooks/min then, {rate['now']:.1f} now: "
                  f"{rate['now'] / rate['then']:.2f}x (goal 3x)\n")
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
    compare_with_baseline(out, assignments, students=1 if quick else COMPARE_STUDENTS,
                          rounds=1 if quick else COMPARE_ROUNDS,
                          check_rounds=1 if quick else CHECK_ROUNDS, workers=workers)
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
