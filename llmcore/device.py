"""Choosing a device, and describing the machine a measurement ran on.

This is the only module that asks torch about CUDA. Library code never picks a device itself:
it follows its inputs (``torch.zeros(..., device=x.device)``). The caller picks once, in the first
cell of a chapter or at the top of a script::

    device = pick_device()
"""

from __future__ import annotations

import os
import platform

import torch


def pick_device(prefer: str | None = None) -> torch.device:
    """The device to run on: CUDA when it is present, else the CPU.

    prefer: ``"cpu"`` or ``"cuda"`` to insist on one; asking for CUDA where there is none raises.
    Chapter 0.
    """
    if prefer is not None:
        device = torch.device(prefer)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("pick_device: 'cuda' was asked for, but torch sees no CUDA device")
        return device
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


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
    return text + f"; torch {torch.__version__.split('+')[0]}"
