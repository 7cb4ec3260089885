"""``python -m course.bench [--quick] [--section NAME ...] [--device cpu|cuda] [--threads N]``.

Runs the sections in :data:`SECTIONS` in order and writes their tables to standard output. A
section is a ``(name, run)`` pair where ``run(out, *, quick, device)`` writes its report to the
text stream ``out``; to add one, append its pair to :data:`SECTIONS`. Chapter 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Callable, TextIO

import torch

from llmcore.device import load_average, pick_device, usable_cores
from . import fast, grading, inference, ops

Section = Callable[..., None]
"""``run(out: TextIO, *, quick: bool, device: torch.device) -> None``."""

SECTIONS: list[tuple[str, Section]] = [
    (ops.NAME, ops.run),
    (inference.NAME, inference.run),
    (fast.NAME, fast.run),
    (grading.NAME, grading.run),
]
ON_REQUEST = {grading.NAME}
"""Sections run only when named (a class-scale grading run takes most of an hour on 2 cores)."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    names = [name for name, _ in SECTIONS]
    parser = argparse.ArgumentParser(
        prog="python -m course.bench",
        description="Measure what each reformulation buys: loops vs NumPy vs torch matrices.")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes: a smoke run of a few seconds, not a measurement")
    parser.add_argument("--section", action="append", choices=names, metavar="NAME",
                        help=f"run only this section (repeatable); one of {', '.join(names)}")
    parser.add_argument("sections", nargs="*", metavar="SECTION",
                        help="the same as --section SECTION (python -m course.bench grading)")
    parser.add_argument("--device", default=None,
                        help="where the torch forms run: cpu or cuda (default: cuda if present)")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="torch.set_num_threads(N) first (default: torch's choice); 1 gives "
                             "steadier figures on a machine that other processes share")
    args = parser.parse_args(argv)
    unknown = [name for name in args.sections if name not in names]
    if unknown:
        parser.error(f"unknown section {unknown[0]!r}; expected one of {', '.join(names)}")
    args.section = (args.section or []) + args.sections or None
    return args


def load_note() -> str:
    """The machine's load when the run starts: timings mean little while others compete for it."""
    cores, loads = usable_cores(), load_average()
    if not loads:
        return f"load: unknown on this system ({cores} cores)"
    load = loads[0]
    note = f"load: {load:.1f} runnable processes on average over the last minute, {cores} cores"
    if load > cores:
        note += ("; other processes compete for the CPU, so these figures are pessimistic "
                 "(--threads 1 suffers least)")
    return note


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    """Run the chosen sections, writing to ``out`` (default: standard output)."""
    args = parse_args(argv)
    out = sys.stdout if out is None else out
    try:
        device = pick_device(args.device)
    except (ValueError, RuntimeError) as err:
        print(f"--device: {err}", file=sys.stderr)
        return 2
    if args.threads is not None:
        if args.threads < 1:
            print(f"--threads: expected a positive number, got {args.threads}", file=sys.stderr)
            return 2
        torch.set_num_threads(args.threads)
    chosen = args.section or [name for name, _ in SECTIONS if name not in ON_REQUEST]
    start = time.perf_counter()
    threads = torch.get_num_threads()
    out.write(f"llmcore benchmark (torch {torch.__version__.split('+')[0]}, "
              f"{threads} thread{'s' if threads != 1 else ''})\n")
    out.write(load_note() + "\n")
    for name, run in SECTIONS:
        if name in chosen:
            out.write("\n")
            run(out, quick=args.quick, device=device)
            out.flush()
    out.write(f"\ntotal: {time.perf_counter() - start:.1f} s\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
