"""The grader's worker processes (course/grading/workers.py): each job in a fresh process forked
from a warm server, with exactly the grader's environment, its own folder and log, killed at its
timeout and with the grader; and the same contract for a spawned interpreter."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from course.grading.workers import ForkServer, spawn_job

pytestmark = pytest.mark.slow      # grading (the fast tier has none)

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}


def job_file(folder: Path) -> Path:
    folder.mkdir(parents=True)
    path = folder / "job.json"
    path.write_text("{}")
    return path


def gone(pid: int) -> bool:
    """The process no longer runs (absent, or a zombie waiting for its parent)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


@pytest.fixture
def server():
    with ForkServer(ENV) as running:
        yield running


def test_each_job_is_a_fresh_process_with_exactly_its_environment(server, tmp_path):
    env = {**ENV, "ONLY_FOR_THIS_JOB": "yes"}
    seen = []
    for name in ("first", "second"):
        path = job_file(tmp_path / name)
        ended = server.run_job(path, env, timeout=60, target="forked_jobs:report")
        assert ended.returncode == 3, ended.output
        assert "a line for the job's log" in ended.output
        seen.append(json.loads((path.parent / "seen.json").read_text()))
    for view, name in zip(seen, ("first", "second")):
        assert view["cwd"] == str(tmp_path / name)
        assert view["env"] == env, "the job's environment is the grader's, exactly"
        assert view["stdin"] == "", "a job reads nothing from the server's requests"
        assert view["preloaded"], "the server's imports are shared"
    assert not seen[1]["marked_before"], "a job saw what an earlier job did to its memory"
    assert seen[0]["pid"] != seen[1]["pid"] != os.getpid()


def test_a_failing_or_killed_job_says_how_it_ended(server, tmp_path):
    ended = server.run_job(job_file(tmp_path / "fails"), ENV, timeout=60,
                           target="forked_jobs:fails")
    assert ended.returncode == 1 and "RuntimeError: the job's own error" in ended.output
    ended = server.run_job(job_file(tmp_path / "killed"), ENV, timeout=60,
                           target="forked_jobs:killed")
    assert ended.returncode == -9, ended


def test_a_job_past_its_timeout_is_killed(server, tmp_path):
    path = job_file(tmp_path / "hangs")
    start = time.perf_counter()
    ended = server.run_job(path, ENV, timeout=3, target="forked_jobs:hangs")
    assert ended.returncode is None and time.perf_counter() - start < 30
    pid = int((path.parent / "pid").read_text())
    assert gone(pid), f"the timed-out job {pid} still runs"


def test_jobs_die_with_the_server(tmp_path):
    path = job_file(tmp_path / "hangs")
    server = ForkServer(ENV)
    result = {}
    waiting = threading.Thread(target=lambda: result.update(
        ended=server.run_job(path, ENV, timeout=300, target="forked_jobs:hangs")))
    waiting.start()
    for _ in range(300):
        if (path.parent / "pid").is_file():
            break
        time.sleep(0.1)
    pid = int((path.parent / "pid").read_text())
    server._process.kill()                # as when the grader (its parent) is killed
    waiting.join(60)
    assert not waiting.is_alive(), "run_job still waits for a job whose server died"
    assert result["ended"].returncode == 1 and "fork server stopped" in result["ended"].output
    for _ in range(100):
        if gone(pid):
            break
        time.sleep(0.1)
    assert gone(pid), f"job {pid} outlived its fork server"
    assert not server.alive
    server.close()


def test_the_class_is_graded_on_when_the_fork_server_is_killed(tmp_path):
    """The job in flight fails with the reason; every later one starts a new interpreter."""
    from classroom import new_course, submission, submit
    from course.grading import grade

    course = new_course(tmp_path / "course")
    for student in ("s0", "s1", "s2"):
        submit(course, student, "01_matmul", submission("01_matmul", answered=True))
    servers: list[int] = []

    def kill_the_server(message: str) -> None:
        if message.startswith("grading ") and not servers:
            found = [p for p in _children(os.getpid()) if "workers import serve" in _command(p)]
            servers.extend(found)
            for pid in found:
                os.kill(pid, 15)

    run = grade(course, gradebook=course / "gradebook.db", workers=1, feedback=False,
                log=kill_the_server)
    assert servers, "no fork server was running when the submissions started"
    statuses = sorted(str(r.status) for r in run.rows)
    assert statuses.count("graded") >= 2, statuses
    assert all(r.score == r.max_score for r in run.rows if str(r.status) == "graded")


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_a_spawned_worker_reports_a_broken_job(tmp_path):
    path = job_file(tmp_path / "broken")
    ended = spawn_job(path, {**ENV, "PATH": os.path.dirname(sys.executable)}, timeout=120)
    assert ended.returncode not in (0, None) and "TypeError" in ended.output, ended


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_a_solution_failing_its_own_tests_stops_the_run_with_its_name(tmp_path, start):
    """The solutions' records are computed before any submission (in forked processes, or in
    the grader): a solution that fails its own test cell stops the run, named, either way."""
    import nbformat
    from classroom import new_course, submission, submit
    from course.grading import grade

    course = new_course(tmp_path / "course")
    source = course / "solutions" / "01_matmul" / "matmul.ipynb"
    nb = nbformat.read(source, as_version=4)
    (cell,) = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "dot"]
    assert "total = total + a[i] * b[i]" in cell.source
    cell.source = cell.source.replace("total = total + a[i] * b[i]", "total = total + a[i]")
    nbformat.write(nb, str(source))
    submit(course, "learner", "01_matmul", submission("01_matmul", answered=True))
    with pytest.raises(RuntimeError, match=r"matmul\.ipynb fails its own test cell test_dot"):
        grade(course, gradebook=course / "gradebook.db", workers=2, worker_start=start,
              feedback=False)
    assert not (course / "autograded").exists(), "no submission is graded against a bad solution"
