"""Where a notebook's seconds go: ``--profile`` on ``check`` and ``grade``.

:class:`ProfiledExecute` is the course's :class:`course.grading.executor.BoundedExecute` with a
stopwatch around the kernel's start (the sandbox, the interpreter and the preloaded imports) and
around each cell (the learner's cells and the test cells apart), and a callback after each cell
(the learner's check prints each test's verdict as it finishes). It changes nothing a cell sees:
the same kernel manager, limits, preloads and tokens. The phases it times go to the active
:class:`Profile` of the process; the grader's workers write theirs next to their outcome, and the
grader adds its own (the solutions' records, nbgrader's own steps, the feedback page).

The fresh-input twins (course/grading/VERDICTS.md) run inside their test cell, in the kernel: their
seconds are part of the test cells' and cannot be told apart from outside the kernel.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from jupyter_core.utils import run_sync

from .cells import is_test
from .executor import BoundedExecute

KERNEL_START = "kernel start (sandbox, interpreter, preloaded imports)"
KERNEL_FROM_STANDBY = "kernel taken from the standby (started after the last check)"
KERNEL_FROM_ZYGOTE = "kernel forked from the run's zygote (sandbox, own namespaces)"
LEARNER_CELLS = "the learner's cells"
TEST_CELLS = "test cells (fresh-input twins included)"
KERNEL_STOP = "kernel shutdown (sandbox removed)"
PROFILE_FILE = "profile.json"


class Profile:
    """Seconds per phase, in the order the phases were first seen, with how often each ran."""

    def __init__(self) -> None:
        self.phases: dict[str, list[float]] = {}      # phase -> [seconds, count]

    def add(self, phase: str, seconds: float, count: int = 1) -> None:
        total = self.phases.setdefault(phase, [0.0, 0])
        total[0] += seconds
        total[1] += count

    @contextmanager
    def time(self, phase: str, count: int = 1) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(phase, time.perf_counter() - start, count)

    def seconds(self, phase: str) -> float:
        return self.phases.get(phase, [0.0, 0])[0]

    def merge(self, other: "Profile") -> None:
        for phase, (seconds, count) in other.phases.items():
            self.add(phase, seconds, count)

    def to_json(self) -> str:
        return json.dumps(self.phases)

    @classmethod
    def from_json(cls, text: str) -> "Profile":
        profile = cls()
        for phase, (seconds, count) in json.loads(text).items():
            profile.add(str(phase), float(seconds), int(count))
        return profile

    def format(self, title: str, wall: float | None = None, notebooks: int = 0) -> str:
        """A table: each phase's seconds, its share of all the phases' seconds, how many times
        it ran; with ``notebooks``, its seconds per notebook; with ``wall``, the wall clock and
        what no phase accounts for."""
        phases = dict(self.phases)
        if wall is not None:
            rest = wall - sum(s for s, _ in phases.values())
            if rest > 0:
                phases["the rest (Python, imports, reading, verdicts)"] = [rest, 1]
        total = sum(s for s, _ in phases.values()) or 1.0
        width = max([len(p) for p in phases] + [46])
        lines = [title]
        for phase, (seconds, count) in phases.items():
            each = f" {seconds / notebooks:7.2f} s per notebook" if notebooks else ""
            times = f" x{count}" if count > 1 else ""
            lines.append(f"  {phase:<{width}} {seconds:8.2f} s {seconds / total:6.1%}"
                         f"{each}{times}")
        if wall is not None:
            lines.append(f"  {'wall clock':<{width}} {wall:8.2f} s")
        return "\n".join(lines)


ACTIVE = Profile()
"""The process's profile: what :class:`ProfiledExecute` adds to."""


class ProfiledExecute(BoundedExecute):
    """BoundedExecute, timed: the kernel's start and each cell go to :data:`ACTIVE`; after each
    code cell ``on_cell(index, cell)`` is called (None: nothing)."""

    on_cell: Callable | None = None

    def _start_phase(self) -> str:
        if getattr(self.km, "from_standby", False):
            return KERNEL_FROM_STANDBY
        return KERNEL_FROM_ZYGOTE if getattr(self.km, "from_zygote", False) else KERNEL_START

    async def async_start_new_kernel(self, **kwargs):
        start = time.perf_counter()
        try:
            await super().async_start_new_kernel(**kwargs)
        finally:
            ACTIVE.add(self._start_phase(), time.perf_counter() - start)

    start_new_kernel = run_sync(async_start_new_kernel)

    async def async_start_new_kernel_client(self):
        start = time.perf_counter()          # waits for the kernel: its imports run first
        try:
            return await super().async_start_new_kernel_client()
        finally:
            ACTIVE.add(self._start_phase(), time.perf_counter() - start, count=0)

    start_new_kernel_client = run_sync(async_start_new_kernel_client)

    async def _async_cleanup_kernel(self):
        with ACTIVE.time(KERNEL_STOP):
            await super()._async_cleanup_kernel()

    _cleanup_kernel = run_sync(_async_cleanup_kernel)

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type != "code":
            return super().preprocess_cell(cell, resources, index)
        with ACTIVE.time(TEST_CELLS if is_test(cell) else LEARNER_CELLS):
            cell, resources = super().preprocess_cell(cell, resources, index)
        if self.on_cell is not None:
            self.on_cell(index, cell)
        return cell, resources


def swap_executor(config) -> None:
    """Make nbgrader's autograde (in ``config``) run notebooks with :class:`ProfiledExecute`."""
    name = "course.grading.executor.BoundedExecute"
    steps = list(config.Autograde.get("autograde_preprocessors", []))
    config.Autograde.autograde_preprocessors = [
        ProfiledExecute if step is BoundedExecute or step == name else step for step in steps]
    # its settings (limits, output cap, preloads) are BoundedExecute's: the subclass reads them
    # from the parent's section, as traitlets does for a subclass


def read(folder: str | Path) -> Profile | None:
    path = Path(folder) / PROFILE_FILE
    return Profile.from_json(path.read_text()) if path.is_file() else None
