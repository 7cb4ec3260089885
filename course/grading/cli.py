"""The grader's command line: ``python -m course.grading {release,edition,check,grade,scaffold,
mutation-check}``, and the entry points ``course-release``, ``course-edition``, ``course-check``
(learners) and ``course-grade`` (instructors)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from .authoring import mutation_check, read_mutants, scaffold
from .check import check, format_report, format_test
from .grade import grade
from .edition import learner_edition
from .release import release
from .report import GRADES_CSV


CHECK_HELP = ("Run an exercise notebook in a fresh, sandboxed kernel and print each visible "
              "test's result as it finishes, then the points so far. Example: course-check "
              "exercises/01_matmul/matmul.ipynb (an instructor's solutions/ notebook runs with "
              "its hidden tests).")


def main(argv: Sequence[str] | None = None, *, prog: str = "python -m course.grading",
         command: str | None = None) -> int:
    """The command line; ``command`` with ``prog``: one command's own program (the entry
    points: ``course-check`` is ``check``), whose usage and errors name that program."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=CHECK_HELP if command == "check" else
        "Release, check and grade the course's nbgrader exercises.")
    if command is not None:
        class One:                   # the subparsers' interface, for one command's own parser
            def add_parser(self, name, help=""):
                return parser if name == command else argparse.ArgumentParser()
        commands = One()
    else:
        commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("release",
                            help="generate exercises/ (student notebooks) from solutions/")
    p.add_argument("--course-dir", default=".", help="course root (default: .)")
    p.add_argument("--release-dir", default=None,
                   help="write here instead of the course's exercises/")
    p.add_argument("--force", action="store_true",
                   help="overwrite notebooks edited since the last release (a backup is kept "
                        "in .exercises-backup/)")

    p = commands.add_parser("edition", help="copy the learner edition of the course (book, "
                                            "exercises, llmcore; no solutions/, no hidden "
                                            "tests, no grading data) into OUT")
    p.add_argument("out", help="the new folder (must not exist or be empty)")
    p.add_argument("--course-dir", default=".", help="course root (default: .)")

    p = commands.add_parser("check", help="run a notebook and print each visible test's result")
    p.add_argument("notebook", nargs="?" if command == "check" else None,
                   help="path to an .ipynb (for example exercises/01_matmul/matmul.ipynb)")
    p.add_argument("--timeout", type=int, default=None, help="seconds per cell (default: config)")
    p.add_argument("--no-standby", action="store_true",
                   help="start this check's kernel itself and leave none started for the next "
                        "(by default a check takes the kernel the previous one left ready and "
                        "leaves one: course/grading/standby.py; COURSE_CHECK_STANDBY=0 too)")
    p.add_argument("--profile", action="store_true",
                   help="print where the seconds went (kernel start, cells, tests)")

    p = commands.add_parser("grade", help="grade submitted/<student>/<assignment>/ (autograde, "
                                          "feedback HTML, grades CSV)")
    p.add_argument("--course-dir", default=".", help="course root (default: .)")
    p.add_argument("--gradebook", default=None,
                   help="sqlite gradebook (default: COURSE/gradebook.db)")
    p.add_argument("--csv", default=None,
                   help="grades file (default: COURSE/course_grades.csv; nbgrader's own "
                        "`nbgrader export` writes grades.csv)")
    p.add_argument("--timeout", type=int, default=None, help="seconds per cell (default: config)")
    p.add_argument("--assignment", action="append", default=None,
                   help="grade only this assignment (repeatable; default: all)")
    p.add_argument("--force", action="store_true", help="grade again what was graded before")
    p.add_argument("--no-feedback", action="store_true", help="skip the feedback HTML")
    p.add_argument("--verbose", action="store_true",
                   help="also show nbgrader's warnings and errors")
    p.add_argument("--profile", action="store_true",
                   help="print where the seconds went (the solutions' records, kernel start, "
                        "cells, nbgrader's own steps, feedback), summed over the notebooks")
    p.add_argument("--workers", type=int, default=None,
                   help="submissions graded at once (default: the number of cores)")
    p.add_argument("--notebook-timeout", type=int, default=None,
                   help="seconds a notebook's kernel may live before its sandbox is killed "
                        "(default: config)")
    p.add_argument("--unsandboxed-trusted", action="store_true",
                   help="where the sandbox (bubblewrap) cannot start, run kernels without it: "
                        "ONLY for trusted submissions")
    p.add_argument("--fresh-kernels", action="store_true",
                   help="start each kernel from nothing instead of forking it from the run's "
                        "zygote (the same sandbox, about a second slower per notebook; "
                        "course/grading/sandbox/zygote.py)")

    p = commands.add_parser("scaffold", help="start a new graded exercise: write "
                                             "solutions/ASSIGNMENT/NOTEBOOK.ipynb from a small "
                                             "complete template (course/grading/AUTHORING.md)")
    p.add_argument("assignment", help="the new assignment's folder name, e.g. 12_row_dots")
    p.add_argument("--notebook", default=None,
                   help="the notebook's name without .ipynb (default: the assignment's name "
                        "without its leading number)")
    p.add_argument("--course-dir", default=".", help="course root (default: .)")

    p = commands.add_parser("mutation-check",
                            help="grade wrong solutions (files of answer cells, MUTANTS/*.py) "
                                 "against an assignment's hidden tests; fails when one keeps "
                                 "full marks")
    p.add_argument("assignment", help="the assignment folder in solutions/")
    p.add_argument("mutants", help="a folder of mutant files, each '# %% [grade_id]' + code")
    p.add_argument("--course-dir", default=".", help="course root (default: .)")
    p.add_argument("--timeout", type=int, default=None, help="seconds per cell (default: config)")
    p.add_argument("--workers", type=int, default=None,
                   help="submissions graded at once (default: the number of cores)")
    p.add_argument("--unsandboxed-trusted", action="store_true",
                   help="where the sandbox cannot start, run kernels without it (your own "
                        "mutants are trusted code)")

    if command is not None:
        parser.set_defaults(command=command)
    args = parser.parse_args(argv)
    if command == "check" and args.notebook is None:      # course-check alone: say what it wants
        parser.print_help(sys.stderr)
        return 2
    try:
        return COMMANDS[args.command](args)
    except (FileNotFoundError, FileExistsError, RuntimeError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def _release(args) -> int:
    for path in release(args.course_dir, release_dir=args.release_dir, force=args.force):
        print(f"wrote {path}")
    return 0


def _edition(args) -> int:
    written = learner_edition(args.course_dir, args.out)
    print(f"wrote the learner edition ({len(written)} files) to {Path(args.out).resolve()}")
    return 0


def _check(args) -> int:
    import time
    start = time.perf_counter()
    print(f"Checking {Path(args.notebook).name} in a fresh kernel (starting it: sandbox, torch, "
          "llmcore; each test's result follows as it finishes) ...", flush=True)
    report = check(args.notebook, timeout=args.timeout,
                   standby=False if args.no_standby else None,
                   on_test=lambda test: print("\n".join(format_test(test)), flush=True))
    print(format_report(report, streamed=True))
    if args.profile:
        from .profiling import ACTIVE
        print(ACTIVE.format("Where the seconds went (--profile):",
                            wall=time.perf_counter() - start))
    return 0 if report.ok else 1


def _grade(args) -> int:
    run = grade(args.course_dir, gradebook=args.gradebook, csv_path=args.csv,
                timeout=args.timeout, force=args.force, assignments=args.assignment,
                feedback=not args.no_feedback, log=lambda m: print(m, flush=True),
                verbose=args.verbose, workers=args.workers,
                notebook_timeout=args.notebook_timeout,
                unsandboxed_trusted=args.unsandboxed_trusted, profile=args.profile,
                progress=True, zygote=not args.fresh_kernels)
    rows = run.rows
    width = max([len(r.student) for r in rows] + [7])
    for r in rows:
        print(f"{r.assignment:<16} {r.student:<{width}} {r.score:>5g} / {r.max_score:<4g} "
              f"{r.status}")
    course = Path(args.course_dir).resolve()
    print(f"grades: {Path(args.csv) if args.csv else course / GRADES_CSV}; "
          f"feedback: {course / 'feedback'}")
    print(run.summary())
    if run.profile is not None:
        print(run.profile.format(f"Where the seconds went (--profile; {run.workers} worker(s) "
                                 "at once, so the phases add up to more than the run's "
                                 f"{run.seconds:.1f} s):", notebooks=run.notebooks))
    return 0


def _scaffold(args) -> int:
    path = scaffold(args.course_dir, args.assignment, notebook=args.notebook)
    python = Path(sys.executable)             # the interpreter that has the grader's packages
    if Path.cwd() in python.parents:
        python = python.relative_to(Path.cwd())
    print(f"wrote {path}\nedit it, then: {python} -m course.grading release --course-dir "
          f"{args.course_dir}; {python} -m course.grading mutation-check {args.assignment} "
          "MUTANTS_FOLDER (course/grading/AUTHORING.md, section 5)")
    return 0


def _mutation_check(args) -> int:
    mutants = read_mutants(args.mutants)
    print(f"mutation-check: grading the solution of {args.assignment} and {len(mutants)} "
          "mutant(s) against its hidden tests, each in a fresh sandboxed kernel ...", flush=True)
    report = mutation_check(args.course_dir, args.assignment, mutants,
                            timeout=args.timeout, workers=args.workers,
                            unsandboxed_trusted=args.unsandboxed_trusted,
                            log=lambda m: print(m, flush=True), progress=True)
    print(report.format())
    return 0 if report.ok else 1


COMMANDS = {"release": _release, "edition": _edition, "check": _check, "grade": _grade,
            "scaffold": _scaffold, "mutation-check": _mutation_check}


def release_main() -> None:
    """``course-release [--course-dir DIR]``."""
    sys.exit(main(sys.argv[1:], prog="course-release", command="release"))


def edition_main() -> None:
    """``course-edition OUT [--course-dir DIR]``."""
    sys.exit(main(sys.argv[1:], prog="course-edition", command="edition"))


def check_main() -> None:
    """``course-check NOTEBOOK``."""
    sys.exit(main(sys.argv[1:], prog="course-check", command="check"))


def grade_main() -> None:
    """``course-grade [--course-dir DIR] [--force] ...``."""
    sys.exit(main(sys.argv[1:], prog="course-grade", command="grade"))
