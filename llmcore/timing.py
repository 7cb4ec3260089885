"""Measuring: how long a call takes, how many floating-point operations it does, and how
that compares with what this machine's matrix unit can do at best.

Used by ``python -m course.bench`` and by the book's timing cells, so that every figure in the
course is measured the same way:

* a warm-up call first (the first call pays for allocations, kernel choice, caches);
* each repeat runs the call often enough to last ``min_seconds`` (one timer tick measures nothing);
* the result is the median over repeats (robust to a neighbour process stealing the CPU now and
  then), or on request the minimum (the least disturbed repeat);
* with CUDA inputs the GPU is synchronised before the clock is read (kernels are asynchronous).

FLOP counts are the usual ones: a multiply-add is 2 FLOPs, so an (n, k) x (k, m) product is
2 n k m. Nothing here prints. Chapter 2.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable, Iterable

import torch
from torch import Tensor

DEFAULT_REPEATS = 5
"""How many timed repeats :func:`time_call` takes the median of."""

DEFAULT_MIN_SECONDS = 0.02
"""Each repeat lasts at least this long (the call is run several times if it is faster)."""


def devices_of(values: Iterable[Any]) -> set[torch.device]:
    """The devices of the tensors among ``values`` (looking one level into lists, tuples, dicts)."""
    found: set[torch.device] = set()
    for value in values:
        if isinstance(value, Tensor):
            found.add(value.device)
        elif isinstance(value, (list, tuple)):
            found |= {v.device for v in value if isinstance(v, Tensor)}
        elif isinstance(value, dict):
            found |= {v.device for v in value.values() if isinstance(v, Tensor)}
        elif isinstance(value, torch.nn.Module):
            found |= {p.device for p in value.parameters()}
    return found


def synchronize(devices: Iterable[torch.device]) -> None:
    """Wait until the queued work on each accelerator in ``devices`` has finished.

    CPU work is synchronous already; CUDA kernels return before they run, so without this a timer
    measures only the launch. The meta device has no work to wait for.
    """
    for device in devices:
        if device.type not in ("cpu", "meta"):
            torch.accelerator.synchronize(device)   # CUDA (or another accelerator) only


def measure(fn: Callable, *args, repeats: int = DEFAULT_REPEATS,
            min_seconds: float = DEFAULT_MIN_SECONDS, **kwargs) -> list[float]:
    """Seconds per call of ``fn(*args, **kwargs)``, one figure per repeat (after one warm-up).

    Each repeat runs the call ``number`` times back to back, with ``number`` chosen from the
    warm-up so that a repeat lasts about ``min_seconds``, and reports the total / number. CUDA
    inputs (tensors among args, kwargs, or a module's parameters) are synchronised around the clock.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    if min_seconds < 0:
        raise ValueError(f"min_seconds must be >= 0, got {min_seconds}")
    devices = devices_of([*args, *kwargs.values(), fn])
    if any(device.type == "meta" for device in devices):
        raise ValueError("measure: inputs are on the meta device, which computes nothing to time")
    synchronize(devices)
    start = time.perf_counter()
    fn(*args, **kwargs)                                       # warm-up, and a first estimate
    synchronize(devices)
    first = time.perf_counter() - start
    number = max(1, math.ceil(min_seconds / first)) if first > 0 else 1000
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn(*args, **kwargs)
        synchronize(devices)
        times.append((time.perf_counter() - start) / number)
    return times


STATISTICS = ("median", "min")


def time_call(fn: Callable, *args, repeats: int = DEFAULT_REPEATS,
              min_seconds: float = DEFAULT_MIN_SECONDS, statistic: str = "median",
              **kwargs) -> float:
    """Seconds per call of ``fn(*args, **kwargs)``: the median (or the minimum) over repeats.

    See :func:`measure` for the method. ``statistic="min"`` gives the least disturbed repeat, as
    Python's ``timeit`` advises on a machine shared with other processes: a slower repeat measures
    them, not ``fn``. Example: ``time_call(torch.matmul, a, b)`` with a: (n, k), b: (k, m).
    Chapter 2.
    """
    if statistic not in STATISTICS:
        raise ValueError(f"statistic: expected one of {STATISTICS}, got {statistic!r}")
    times = measure(fn, *args, repeats=repeats, min_seconds=min_seconds, **kwargs)
    return statistics.median(times) if statistic == "median" else min(times)


def gflops(flop_count: float, seconds: float) -> float:
    """Throughput in GFLOP/s (10^9 floating-point operations per second). Chapter 2."""
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, got {seconds}")
    return flop_count / seconds / 1e9


def matmul_flops(n: int, k: int, m: int, *, batch: int = 1) -> int:
    """FLOPs of ``batch`` products (n, k) x (k, m): each of the n m outputs takes k multiply-adds.

    A projection x @ w with x: (n, d_in), w: (d_in, d_out) is matmul_flops(n, d_in, d_out) (the bias
    adds n d_out more, negligible next to it). Chapter 2.
    """
    return 2 * batch * n * k * m


def attention_flops(n: int, m: int, d_head: int, *, n_heads: int = 1, batch: int = 1,
                    causal: bool = False) -> int:
    """FLOPs of the two matmuls of attention, q k^T (n, m) and weights @ v (n, d_head), per head.

    q: (b, h, n, d_head)   k, v: (b, h, m, d_head). Counts 2 d_head FLOPs per (query, key) pair
    for the scores and 2 d_head more for the weighted sum: 4 n m d_head per head. causal: count
    only the visible pairs (query i sees i + m - n + 1 keys), i.e. the work a loop that skips masked
    keys does; the matrix forms compute the full (n, m) rectangle whatever the mask. The softmax
    (a few FLOPs per pair, not d_head) is left out, as is customary. Chapter 3.
    """
    if n > m:
        raise ValueError(f"attention_flops: expected m >= n, got n = {n}, m = {m}")
    pairs = n * m - n * (n - 1) // 2 if causal else n * m
    return 4 * batch * n_heads * pairs * d_head


def layer_flops(n: int, d: int, *, d_ff: int | None = None, n_heads: int = 1, batch: int = 1,
                causal: bool = False) -> dict[str, int]:
    """FLOPs of one transformer layer's matrix products for b sequences of n tokens, by part.

    x: (b, n, d). Returns {"projections": W_qkv and W_o, 8 b n d^2; "ffn": d -> f -> d,
    4 b n d f (f = d_ff, default 4d: 16 b n d^2); "attention": q k^T and weights @ v,
    4 b n^2 d, or only the visible pairs with ``causal`` (what a kernel that skips masked keys
    does; see :func:`attention_flops`)}. Norms, softmax and activations (a few FLOPs per number,
    not d) are left out. Chapter 10.
    """
    f = 4 * d if d_ff is None else d_ff
    if d % n_heads:
        raise ValueError(f"layer_flops: n_heads = {n_heads} must divide d = {d}")
    projections = matmul_flops(n, d, 3 * d, batch=batch) + matmul_flops(n, d, d, batch=batch)
    return {"projections": projections,
            "ffn": matmul_flops(n, d, f, batch=batch) + matmul_flops(n, f, d, batch=batch),
            "attention": attention_flops(n, n, d // n_heads, n_heads=n_heads, batch=batch,
                                         causal=causal)}


def matmul_peak_gflops(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                       size: int | None = None, *, repeats: int = 3) -> float:
    """This machine's matmul throughput in GFLOP/s: the best of ``repeats`` square products.

    size: the side of the (size, size) x (size, size) product (default 1024 on a CPU, 4096 on a
    GPU: large enough to run near peak, small enough to take a fraction of a second). The best
    repeat, not the median, because a peak is what the hardware can do when nothing interferes.
    It is a measured practical peak, not the vendor's datasheet figure. Chapter 2.
    """
    device = torch.device(device)
    if device.type == "meta":
        raise ValueError("matmul_peak_gflops: the meta device computes nothing; pass cpu or cuda")
    if not dtype.is_floating_point:
        raise TypeError(f"dtype: expected a floating-point dtype, got {dtype}")
    if size is None:
        size = 1024 if device.type == "cpu" else 4096
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    seconds = min(measure(torch.matmul, a, b, repeats=repeats, min_seconds=0.05))
    return gflops(matmul_flops(size, size, size), seconds)
