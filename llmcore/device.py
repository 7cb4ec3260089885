"""Choosing a device, and describing the machine a measurement ran on.

This is the only module that asks torch which accelerators exist (CUDA, Apple's MPS). Library code never picks a device itself:
it follows its inputs (``torch.zeros(..., device=x.device)``). The caller picks once, in the first
cell of a chapter or at the top of a script::

    device = pick_device()
"""

from __future__ import annotations

import os
import platform

import torch


DEVICE_VARIABLE = "LLMCORE_DEVICE"
"""Environment variable that overrides the automatic choice (e.g. ``LLMCORE_DEVICE=cpu``)."""

KINDS = ("cuda", "mps", "cpu")
"""The device kinds :func:`pick_device` knows, in the order it prefers them."""


def mps_available() -> bool:
    """Whether torch sees an Apple-silicon GPU (Metal Performance Shaders; macOS only)."""
    backend = getattr(torch.backends, "mps", None)
    return backend is not None and backend.is_available()


def _available(kind: str) -> bool:
    return {"cuda": torch.cuda.is_available, "mps": mps_available, "cpu": lambda: True}[kind]()


def pick_device(prefer: str | None = None) -> torch.device:
    """The device to run on: CUDA when it is present, else Apple's MPS GPU, else the CPU.

    prefer: ``"cuda"``, ``"mps"`` or ``"cpu"`` (optionally with an index, ``"cuda:1"``) to insist
    on one; without it the environment variable ``LLMCORE_DEVICE`` may name one. Asking for a
    device torch does not see raises, naming what it does see. MPS has no float64: work in float64
    goes to :func:`float64_device`. Chapter 0.
    """
    prefer = prefer or os.environ.get(DEVICE_VARIABLE) or None
    if prefer is not None:
        device = torch.device(prefer)
        if device.type not in KINDS:
            raise ValueError(f"pick_device: expected one of {KINDS}, got {prefer!r}")
        if not _available(device.type):
            seen = [kind for kind in KINDS if _available(kind)]
            raise ValueError(f"pick_device: {device.type!r} was asked for, but torch sees no "
                             f"{device.type} device here (available: {', '.join(seen)})")
        return device
    return torch.device(next(kind for kind in KINDS if _available(kind)))


def float64_device(device: torch.device | str) -> torch.device:
    """Where float64 work for ``device`` runs: the device itself, or the CPU for Apple's MPS,
    which has no float64 (a float64 tensor there raises TypeError)."""
    device = torch.device(device)
    return torch.device("cpu") if device.type == "mps" else device


def cuda_available() -> bool:
    """Whether torch sees a CUDA device (the tests' CUDA variants run only then)."""
    return torch.cuda.is_available()


def cpu_name() -> str:
    """The processor's model name as the OS reports it (``platform.processor()`` is often empty)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask), else all the machine's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def load_average() -> tuple[float, ...]:
    """The 1, 5 and 15 minute load averages, rounded to 0.01; () where the system keeps none."""
    try:
        return tuple(round(x, 2) for x in os.getloadavg())
    except (OSError, AttributeError):
        return ()


def describe_machine(device: torch.device | str | None = None) -> str:
    """One line naming the hardware a timing ran on, for the book to print beside its figures.

    Example: ``"CPU: Intel(R) Xeon(R) ... (2 cores visible, torch uses 2 threads); torch 2.13.0"``.
    """
    text = f"CPU: {cpu_name()} ({usable_cores()} cores visible, torch uses {torch.get_num_threads()} threads)"
    device = torch.device(device) if device is not None else None
    if device is not None and device.type == "cuda":
        text += f"; GPU: {torch.cuda.get_device_name(device)}"
    elif device is not None and device.type == "mps":
        text += "; GPU: Apple MPS"
    return text + f"; torch {torch.__version__.split('+')[0]}"
