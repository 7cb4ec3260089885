"""The worker processes of a grade run: one fresh process per submission, forked from a warm
server instead of started from scratch.

A job's process is what it always was, a process of its own that nothing else runs in: its
memory, its nbgrader application, its kernel manager and its sandboxed kernel are new, and a
crash, a hang or a kill ends it alone. Only the imports are shared: the :class:`ForkServer` (one
per grade run, a plain ``python`` that has imported course/grading/preload.py: nbgrader,
nbconvert and the grader's modules, and nothing else) forks each job's process, so each starts
about a second sooner. ``GradeOptions.worker_start = "spawn"`` starts ``python -c
WORKER_COMMAND`` per job instead, as before (the grading benchmark compares the two).

Python's own ``multiprocessing`` fork server is not used: it runs the caller's ``__main__``
script again in every child, which a library must not do to its caller.

The server speaks JSON lines: the grader writes ``{"id", "job", "env"}``; the server answers
``{"id", "pid"}`` when the job's process is forked and ``{"id", "exit"}`` when it ended (a
negative exit is the signal that killed it). A job past its timeout is killed by the grader
(same user) and reported like any other end. The server exits when its input closes; its
children are killed when it dies (``PR_SET_PDEATHSIG``), and it dies with the grader.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .worker import WORKER_COMMAND

WorkerStart = Literal["fork", "spawn"]
"""How a job's process starts: forked from the warm server, or a new interpreter."""

JOB_LOG = "worker.log"
"""A forked job's stdout and stderr, in its job folder."""

SERVE_COMMAND = "from course.grading.workers import serve; serve()"

WORKER_TARGET = "course.grading.worker:main"
"""What a forked job runs: ``module:function``, called with the job file's path (what ``python -c
WORKER_COMMAND`` runs; the tests name others)."""


@dataclass(frozen=True)
class WorkerExit:
    """How a job's process ended."""

    returncode: int | None       # None: it ran past the timeout and was killed
    output: str                  # what it printed (stdout and stderr together)


def spawn_job(job_file: Path, env: dict[str, str], *, timeout: float) -> WorkerExit:
    """Run the worker on ``job_file`` in a new interpreter (in the job's folder, with exactly
    ``env``); a process still running after ``timeout`` seconds is killed."""
    try:
        done = subprocess.run([sys.executable, "-c", WORKER_COMMAND, str(job_file)],
                              cwd=job_file.parent, env=env, capture_output=True, text=True,
                              preexec_fn=die_with_parent, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        return WorkerExit(None, _text(expired.stdout) + _text(expired.stderr))
    return WorkerExit(done.returncode, (done.stdout or "") + (done.stderr or ""))


class _Pending:
    def __init__(self):
        self.forked = threading.Event()
        self.ended = threading.Event()
        self.pid: int | None = None
        self.exit: int | None = None


class ForkServer:
    """A warm process that forks one worker process per job (see the module's docstring).

    Start it in the thread that lives as long as the run (the server is killed when the thread
    that started it ends); :meth:`run_job` may be called from any number of threads."""

    def __init__(self, env: dict[str, str]):
        self._process = subprocess.Popen([sys.executable, "-c", SERVE_COMMAND], env=env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         preexec_fn=die_with_parent)
        self._write = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._next = 0
        self._reader = threading.Thread(target=self._read, name="fork server replies",
                                        daemon=True)
        self._reader.start()

    def run_job(self, job_file: Path, env: dict[str, str], *, timeout: float,
                target: str = WORKER_TARGET) -> WorkerExit:
        """Fork a process that calls ``target`` on ``job_file`` (in its folder, with exactly
        ``env``) and wait at most ``timeout`` seconds for it to end; one still running then is
        killed."""
        log = job_file.parent / JOB_LOG
        with self._write:
            self._next += 1
            ident, pending = self._next, _Pending()
            self._pending[ident] = pending
            request = {"id": ident, "job": str(job_file), "env": env, "log": str(log),
                       "target": target}
            try:
                self._process.stdin.write(json.dumps(request).encode() + b"\n")
                self._process.stdin.flush()
            except (BrokenPipeError, ValueError):
                pending.ended.set()
        finished = pending.ended.wait(timeout)
        if not finished:
            if pending.forked.wait(5) and pending.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pending.pid, signal.SIGKILL)
            pending.ended.wait(30)
        self._pending.pop(ident, None)
        output = log.read_text(errors="replace") if log.is_file() else ""
        if pending.exit is None and finished:
            output += f"\nthe grader's fork server stopped (exit {self._process.poll()})"
            return WorkerExit(1, output)
        return WorkerExit(pending.exit if finished else None, output)

    @property
    def alive(self) -> bool:
        """Whether the server still runs (a stopped one answers nothing more: start jobs
        another way)."""
        return self._process.poll() is None and self._reader.is_alive()

    def close(self) -> None:
        """End the server (after the jobs: any job still running is killed with it)."""
        with contextlib.suppress(BrokenPipeError, ValueError):
            self._process.stdin.close()
        try:
            self._process.wait(30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._reader.join(5)

    def __enter__(self) -> "ForkServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _read(self) -> None:
        for line in self._process.stdout:
            reply = json.loads(line)
            pending = self._pending.get(reply["id"])
            if pending is None:
                continue
            if "pid" in reply:
                pending.pid = reply["pid"]
                pending.forked.set()
            if "exit" in reply:
                pending.exit = reply["exit"]
                pending.ended.set()
        for pending in list(self._pending.values()):     # the server is gone
            pending.forked.set()
            pending.ended.set()


# ------------------------------------------------------------------------ the server's side

def serve() -> None:
    """The fork server's main loop (``python -c SERVE_COMMAND``): import the worker's modules
    once, then fork a process per request line on stdin and report each fork and each end."""
    die_with_parent()
    import course.grading.preload  # noqa: F401   (loaded, then shared by every fork)

    replies = os.fdopen(os.dup(1), "w", buffering=1)
    requests, buffer, children = sys.stdin.fileno(), b"", {}
    open_input = True
    while open_input or children:
        ready, _, _ = select.select([requests] if open_input else [], [], [], 0.05)
        if ready:
            chunk = os.read(requests, 1 << 16)
            open_input = bool(chunk)
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in filter(None, lines):
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    replies.close()
                    _job_process(request["job"], request["env"], request["log"],
                                 request["target"])
                children[pid] = request["id"]
                replies.write(json.dumps({"id": request["id"], "pid": pid}) + "\n")
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            replies.write(json.dumps({"id": children.pop(pid),
                                      "exit": os.waitstatus_to_exitcode(status)}) + "\n")


def _job_process(job_file: str, env: dict[str, str], log: str, target: str) -> None:
    """In a forked job: output to the job's log, no input, the grader's environment and the
    job's folder, killed with the server; then ``target`` (the worker's main, as ``python -c
    WORKER_COMMAND`` runs it). Never returns (:func:`_leave`)."""
    try:
        descriptor = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(descriptor, 1)
        os.dup2(descriptor, 2)
        os.close(descriptor)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(Path(job_file).parent)
        die_with_parent()
        import importlib
        module, function = target.split(":")
        code = getattr(importlib.import_module(module), function)(job_file)
    except SystemExit as stop:               # as the interpreter treats it: a message means 1
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if stop.code is not None and not isinstance(stop.code, int):
            print(stop.code, file=sys.stderr)
    except BaseException:
        import traceback
        traceback.print_exc()
        code = 1
    _leave(code if isinstance(code, int) else 0)


def _leave(code: int) -> None:
    """End a forked job as ``multiprocessing`` ends its forked children: the log handlers and
    the standard streams flushed, then ``os._exit``. A normal interpreter exit would take down
    every module the server preloaded, touching the whole inherited heap (about a second a
    job); the job's own clean-up (its kernel, sandbox, cgroup and scratch files) is done by
    then, in ``finally`` blocks and context managers, not at exit."""
    import logging
    try:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def die_with_parent() -> None:
    """Get SIGKILL when the parent dies (Linux prctl PR_SET_PDEATHSIG; elsewhere nothing)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _text(data) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data
