"""Measuring: how long a call takes, how many floating-point operations it does, and how
that compares with what this machine's matrix unit can do at best.

Used by ``python -m course.bench`` and by the book's timing cells, so that every figure in the
course is measured the same way. The timing itself is PyTorch's benchmark timer,
:class:`torch.utils.benchmark.Timer`: it warms up before it measures (the first calls pay for
allocations, kernel choice, caches), runs the call with a set number of torch threads and keeps
the runs in a :class:`torch.utils.benchmark.Measurement` (median, IQR, ...). What this module adds:

* the call is any Python callable with its arguments (Timer takes a statement string);
* torch keeps the threads it uses now (Timer's default is 1 thread, which would time a different
  machine from the one :func:`llmcore.device.describe_machine` describes);
* the clock waits for the devices of the call's own tensors (CUDA kernels are asynchronous), and
  refuses the meta device, which computes nothing;
* a fixed number of repeats, each running the call often enough to last ``min_seconds`` (one timer
  tick measures nothing), summarised by the median (robust to a neighbour process stealing the
  CPU now and then) or, on request, the minimum (the least disturbed repeat);
* FLOP counts and a measured matmul peak to compare rates with.

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
from torch.utils.benchmark import Measurement, Timer

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
            torch.accelerator.synchronize(device)   # CUDA, MPS (or another accelerator) only


def timer_for(fn: Callable, *args, threads: int | None = None, **kwargs) -> Timer:
    """A :class:`torch.utils.benchmark.Timer` of ``fn(*args, **kwargs)`` whose clock waits for the
    devices of the call's tensors (args, kwargs, a module's parameters), with ``threads`` torch
    threads (default: as many as torch uses now)."""
    devices = devices_of([*args, *kwargs.values(), fn])
    if any(device.type == "meta" for device in devices):
        raise ValueError("measure: inputs are on the meta device, which computes nothing to time")

    def clock() -> float:
        synchronize(devices)
        return time.perf_counter()

    threads = torch.get_num_threads() if threads is None else threads
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    return Timer(stmt="fn(*args, **kwargs)", globals={"fn": fn, "args": args, "kwargs": kwargs},
                 timer=clock, num_threads=threads, description=getattr(fn, "__name__", None))


def calls_made(repeats: int, number: int = 1) -> int:
    """How many times :func:`measure` calls the function: Timer's warm-up (2 calls) and a first
    timed call, then per repeat Timer's warm-up (number // 100 calls, at least 2) and ``number``
    timed calls. For timing a call that changes state (a KV cache step appends a token)."""
    return 3 + repeats * (number + max(number // 100, 2))


def measurement(fn: Callable, *args, repeats: int = DEFAULT_REPEATS,
                min_seconds: float = DEFAULT_MIN_SECONDS, threads: int | None = None,
                **kwargs) -> Measurement:
    """The timings of ``fn(*args, **kwargs)`` as one :class:`~torch.utils.benchmark.Measurement`
    of ``repeats`` runs (its ``times`` are seconds per call; ``median``, ``iqr``, ...).

    A first timed call (after Timer's warm-up) estimates the time of one call; each repeat then
    runs the call ``number`` times back to back, with ``number`` chosen so that a repeat lasts
    about ``min_seconds``. See :func:`calls_made` for the number of calls in all.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    if min_seconds < 0:
        raise ValueError(f"min_seconds must be >= 0, got {min_seconds}")
    timer = timer_for(fn, *args, threads=threads, **kwargs)
    first = timer.timeit(1).median
    number = max(1, math.ceil(min_seconds / first))
    runs = [timer.timeit(number) for _ in range(repeats)]      # each: one run of number calls
    return Measurement(number_per_run=number, raw_times=[t for run in runs for t in run.raw_times],
                       task_spec=runs[0].task_spec)


def measure(fn: Callable, *args, repeats: int = DEFAULT_REPEATS,
            min_seconds: float = DEFAULT_MIN_SECONDS, threads: int | None = None,
            **kwargs) -> list[float]:
    """Seconds per call of ``fn(*args, **kwargs)``, one figure per repeat (see
    :func:`measurement`)."""
    return list(measurement(fn, *args, repeats=repeats, min_seconds=min_seconds,
                            threads=threads, **kwargs).times)


STATISTICS = ("median", "min")


def time_call(fn: Callable, *args, repeats: int = DEFAULT_REPEATS,
              min_seconds: float = DEFAULT_MIN_SECONDS, statistic: str = "median",
              threads: int | None = None, **kwargs) -> float:
    """Seconds per call of ``fn(*args, **kwargs)``: the median (or the minimum) over repeats.

    See :func:`measurement` for the method. ``statistic="min"`` gives the least disturbed repeat,
    as Python's ``timeit`` advises on a machine shared with other processes: a slower repeat
    measures them, not ``fn``. Example: ``time_call(torch.matmul, a, b)`` with a: (n, k),
    b: (k, m). Chapter 2.
    """
    if statistic not in STATISTICS:
        raise ValueError(f"statistic: expected one of {STATISTICS}, got {statistic!r}")
    times = measure(fn, *args, repeats=repeats, min_seconds=min_seconds, threads=threads,
                    **kwargs)
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


def layer_flops(n: int, d: int, *, d_ff: int | None = None,
                n_heads: int = 1, batch: int = 1,
                causal: bool = False) -> dict[str, int]:
    """FLOPs of one transformer layer's matrix products for b sequences of
    n tokens, by part.

    x: (b, n, d). Returns {"projections": W_qkv and W_o, 8 b n d^2;
    "ffn": d -> f -> d, 4 b n d f (f = d_ff, default 4d: 16 b n d^2);
    "attention": q k^T and weights @ v, 4 b n^2 d, or only the visible
    pairs with ``causal`` (what a kernel that skips masked keys does; see
    :func:`attention_flops`)}. Norms, softmax and activations (a few FLOPs
    per number, not d) are left out. Chapter 10.
    """
    f = 4 * d if d_ff is None else d_ff
    if d % n_heads:
        raise ValueError(f"layer_flops: n_heads = {n_heads} must divide "
                         f"d = {d}")
    projections = (matmul_flops(n, d, 3 * d, batch=batch)
                   + matmul_flops(n, d, d, batch=batch))
    ffn = (matmul_flops(n, d, f, batch=batch)
           + matmul_flops(n, f, d, batch=batch))
    attention = attention_flops(n, n, d // n_heads, n_heads=n_heads,
                                batch=batch, causal=causal)
    return {"projections": projections, "ffn": ffn, "attention": attention}


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
