"""Measure the peak memory one call allocates for its tensors, on the CPU or on a CUDA device.

What is measured: the highest value, during the call, of (bytes of tensor storage allocated since
the call began) minus (bytes of those freed again). Tensors that existed before the call (the
inputs) are not counted; the returned result is, since the call allocated it. Memory outside
torch's allocator (Python objects, a BLAS library's scratch buffers) is not counted either.

How: on CUDA, the caching allocator's own statistics (``torch.cuda.max_memory_allocated``, reset
before the call). On the CPU torch keeps no such statistic, and Python's ``tracemalloc`` does not
see torch's allocations, so the call runs under ``torch.profiler`` with ``profile_memory=True``:
the profiler then records every allocation and free of tensor storage with its size and time,
and the peak is the maximum of their running sum. The profiler adds time, not memory, to what it
measures; its first use in a process takes a few seconds to start. Chapter 10.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Callable, Iterator

import torch
from torch import Tensor
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile


def _tensor_device(args: tuple, kwargs: dict) -> torch.device:
    """The one device of the tensors among the arguments; raise if there are none or several."""
    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, Tensor)]
    if not tensors:
        raise ValueError("peak_memory: expected at least one tensor among the arguments of fn, "
                         "to know which device to measure; got none")
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise ValueError(f"peak_memory: expected the tensor arguments on one device, got "
                         f"{sorted(str(d) for d in devices)}")
    return devices.pop()


@contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null for a moment: the profiler's C++ side prints
    'profiler_start'/'profiler_stop' lines there, which would clutter a notebook's output.
    Used only around starting and stopping the profiler, never around the measured call."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _cpu_peak(fn: Callable, args: tuple, kwargs: dict) -> int:
    """Peak of the running sum of the profiler's CPU allocation (+) and free (-) events."""
    profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _native_stderr_silenced():
        profiler.start()
    try:
        fn(*args, **kwargs)               # the result is freed after the call, inside the window
    finally:
        with _native_stderr_silenced():
            profiler.stop()
    try:
        events = profiler.profiler.kineto_results.events()
    except AttributeError as error:       # an internal attribute; pinned torch versions have it
        raise RuntimeError("peak_memory: this torch version's profiler does not expose its "
                           "allocation events (profiler.kineto_results)") from error
    changes = sorted((e.start_ns(), e.nbytes()) for e in events       # (time, +alloc or -free)
                     if e.name() == "[memory]" and e.device_type() == DeviceType.CPU)
    current = peak = 0
    for _, nbytes in changes:
        current += nbytes
        peak = max(peak, current)
    return peak


def _cuda_peak(fn: Callable, args: tuple, kwargs: dict, device: torch.device) -> int:
    """The caching allocator's high-water mark during the call, less what was allocated before."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn(*args, **kwargs)
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


def peak_memory(fn: Callable, *args, **kwargs) -> int:
    """Bytes of tensor memory that ``fn(*args, **kwargs)`` holds at its
    peak.

    The device measured is the one the tensor arguments live on (CPU:
    profiler events; CUDA: the allocator's statistics; see the module
    docstring for exactly what is counted). The call's result is discarded.
    Example: ``peak_memory(attention, q, k, v, causal=True)``. Chapter 10.
    """
    if not callable(fn):
        raise TypeError(f"peak_memory: fn: expected a callable, got "
                        f"{type(fn).__name__}")
    device = _tensor_device(args, kwargs)
    if device.type == "cpu":
        return _cpu_peak(fn, args, kwargs)
    if device.type == "cuda":
        return _cuda_peak(fn, args, kwargs, device)
    raise ValueError(f"peak_memory: can measure tensors on cpu or cuda, "
                     f"got {device} (the meta device allocates nothing)")
