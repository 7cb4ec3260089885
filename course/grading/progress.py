"""A class's progress: notebooks done, their rate and the time left, for ``grade``,
``mutation-check`` and the class benchmark.

On a terminal it is tqdm's bar (tqdm comes with every profile), with the run's own lines printed
above it; where the output is not a terminal (a CI log, a pipe) there is no bar: one line every
``every`` notebooks (a tenth of the class, at least 10) and the run's own lines as they were.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
    if seconds >= 60:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds} s"


class Progress:
    """``total`` notebooks to go; :meth:`update` as each submission's notebooks are done,
    :meth:`write` for a line of the run's own."""

    def __init__(self, total: int, *, desc: str = "grading", stream: TextIO | None = None,
                 every: int | None = None, tty: bool | None = None):
        self.total, self.done, self.desc = total, 0, desc
        self.stream = stream or sys.stderr
        self.start = time.perf_counter()
        self.every = every or max(10, total // 10)
        self._next = self.every
        self._bar = None
        if tty if tty is not None else getattr(self.stream, "isatty", lambda: False)():
            try:
                from tqdm import tqdm
            except ImportError:            # no tqdm: the plain lines
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(total=total, desc=desc, unit="notebook", file=self.stream,
                                 dynamic_ncols=True, smoothing=0.1)

    def line(self) -> str:
        """'12 of 440 notebooks, 6.1/min, about 1 h 10 min left'."""
        seconds = time.perf_counter() - self.start
        rate = self.done / seconds * 60 if seconds > 0 else 0.0
        left = (self.total - self.done) / rate * 60 if rate > 0 else None
        return (f"{self.desc}: {self.done} of {self.total} notebooks, {rate:.1f}/min"
                + (f", about {_duration(left)} left" if left is not None and self.done < self.total
                   else f", {_duration(seconds)} in all" if self.done >= self.total else ""))

    def update(self, notebooks: int = 1) -> None:
        self.done += notebooks
        if self._bar is not None:
            self._bar.update(notebooks)
        elif self.done >= self._next or self.done >= self.total:
            while self._next <= self.done:
                self._next += self.every
            print(self.line(), file=self.stream, flush=True)

    def write(self, message: str, say=None) -> None:
        """A line of the run's own: above the bar on a terminal, else through ``say``."""
        say = say or (lambda text: print(text, file=self.stream, flush=True))
        if self._bar is not None:
            with self._bar.external_write_mode(file=self.stream):
                say(message)
        else:
            say(message)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
