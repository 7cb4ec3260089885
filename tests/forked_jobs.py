"""Jobs for tests/test_grading_workers.py: what a process forked by the grader's fork server
may do (each is ``tests.forked_jobs:<name>``, called with the job file's path)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path


def report(job_file: str) -> int:
    """Write what the process sees next to the job file, leave a mark in a preloaded module
    (a later job must not see it), print to the log; exit 3."""
    import course.grading.preload as preload
    seen = {"pid": os.getpid(), "cwd": os.getcwd(), "env": dict(os.environ),
            "marked_before": hasattr(preload, "marked_by_a_job"),
            "stdin": sys.stdin.read(), "preloaded": "nbgrader.converters" in sys.modules}
    preload.marked_by_a_job = True
    Path(job_file).with_name("seen.json").write_text(json.dumps(seen))
    print("a line for the job's log")
    return 3


def fails(job_file: str) -> None:
    raise RuntimeError("the job's own error")


def killed(job_file: str) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def hangs(job_file: str) -> None:
    Path(job_file).with_name("pid").write_text(str(os.getpid()))
    time.sleep(600)
