"""The grading tests' classes, graded by a process of their own while the rest of the suite runs.

Three test modules grade a whole class in one run each (tests/test_grading.py,
test_grading_honest.py, test_grading_verdicts.py: about 300 notebooks, most of the suite's CPU).
Each declares its class as a :class:`ClassRun` named ``CLASS`` (which module-scoped fixture
serves it, the cell time limit, whether feedback pages are written) beside a
``build_class(course) -> extra`` that writes the submissions into a fresh course folder and
returns what its tests need from before grading (a hash of the tree, or None).

When a session selects tests that use those fixtures, :func:`start` (called by the conftest once
collection is done) starts this file as a child process that builds and grades those classes one
after another, each into a folder of its own, and moves the tests that read them to the end of
the run, so the grading overlaps every other test instead of following it. The fixture then waits
for its class (:meth:`ClassRun.graded`) and gets the same :class:`Graded` it would have computed
itself: same builder, same :func:`classroom.grade_class`, same real nbgrader and gradebook; what
the child printed is printed again. Where no child was started (``GRADING_TEST_BACKGROUND=0``,
or a run of a single test), the fixture grades its class itself, as before.

The child dies with the test session (``PR_SET_PDEATHSIG``), and :func:`stop` ends it and its
graders when the session ends early.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent


@dataclass
class Graded:
    """One graded class: its course folder, the run's CSV rows, the grading's wall time in
    seconds and what the builder returned (``extra``)."""

    course: Path
    rows: list
    seconds: float
    extra: object = None


@dataclass(frozen=True)
class ClassRun:
    """A class that a test module grades in one run (module: the test module's name; fixture: the
    module-scoped fixture that serves it; timeout: seconds per cell; feedback: write the feedback
    pages)."""

    module: str
    fixture: str
    timeout: float
    what: str
    feedback: bool = True

    def grade(self, course: Path, build: Callable[[Path], object]) -> Graded:
        """Write the class into ``course`` (a fresh folder) and grade it in this process."""
        from classroom import grade_class, new_course
        new_course(course)
        extra = build(course)
        start = time.perf_counter()
        run = grade_class(course, timeout=self.timeout, what=self.what, feedback=self.feedback)
        return Graded(course, run.rows, time.perf_counter() - start, extra)

    def graded(self, tmp_path_factory, build: Callable[[Path], object]) -> Graded:
        """The class graded: by the session's child process where :func:`start` started one for
        this module (waiting for it), else here."""
        if _background is not None and self.module in _background.modules:
            return _background.wait_for(self.module)
        return self.grade(tmp_path_factory.mktemp(self.module), build)


# ------------------------------------------------------------------------------ the child

class Background:
    """The child process grading ``modules`` in order into ``folder``: ``<module>/`` (the
    course), ``<module>.log`` (what it printed), then ``<module>.pickle`` (the Graded) or
    ``<module>.error`` (the traceback)."""

    def __init__(self, modules: list[str]):
        self.modules = modules
        self.folder = Path(tempfile.mkdtemp(prefix="pytest-classes-"))
        with open(self.folder / "child.stderr", "wb") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, str(Path(__file__)), str(self.folder), *modules],
                cwd=HERE.parent, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=stderr, start_new_session=True, preexec_fn=_die_with_parent)

    def wait_for(self, module: str) -> Graded:
        done, error = self.folder / f"{module}.pickle", self.folder / f"{module}.error"
        while not done.exists() and not error.exists() and self.process.poll() is None:
            time.sleep(0.5)
        log = self.folder / f"{module}.log"
        if log.exists():
            print(log.read_text(errors="replace"), end="")
        if done.exists():
            return pickle.loads(done.read_bytes())
        if error.exists():
            raise RuntimeError(f"grading the class of {module} failed in the background:\n"
                               + error.read_text(errors="replace"))
        stderr = (self.folder / "child.stderr").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"the background class run ended (exit {self.process.returncode}) "
                           f"before grading {module}; its stderr:\n{stderr}")

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def _die_with_parent() -> None:
    """In the child, before exec: die when the test session does (Linux; elsewhere a no-op)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG


_background: Background | None = None


def start(items: list) -> list:
    """Start the child for the classes the selected ``items`` read, and return the items with
    those tests moved to the end (in their order). Returns ``items`` unchanged where no class is
    read or ``GRADING_TEST_BACKGROUND=0``."""
    global _background
    if os.environ.get("GRADING_TEST_BACKGROUND", "1") == "0":
        return items
    readers, modules = [], []
    for item in items:
        run = getattr(getattr(item, "module", None), "CLASS", None)
        if isinstance(run, ClassRun) and run.fixture in getattr(item, "fixturenames", ()):
            readers.append(item)
            if run.module not in modules:
                modules.append(run.module)
    if not modules:
        return items
    _background = Background(modules)
    moved = set(map(id, readers))
    return [item for item in items if id(item) not in moved] + readers


def stop() -> None:
    """End the child (if still grading) and remove its folder."""
    global _background
    if _background is not None:
        _background.stop()
        _background = None


def main(folder: Path, modules: list[str]) -> int:
    """The child: build and grade each module's class in turn."""
    sys.path.insert(0, str(HERE))
    failed = 0
    for name in modules:
        with open(folder / f"{name}.log", "w") as log, contextlib.redirect_stdout(log):
            try:
                module = importlib.import_module(name)
                graded = module.CLASS.grade(folder / name, module.build_class)
                partial = folder / f"{name}.pickle.part"
                partial.write_bytes(pickle.dumps(graded))
                partial.rename(folder / f"{name}.pickle")
            except BaseException:                   # noqa: BLE001  (reported to the fixture)
                (folder / f"{name}.error").write_text(traceback.format_exc())
                failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2:]))
