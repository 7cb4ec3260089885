"""Section ``ops``: one projection and one attention, from pure-Python loops to fused kernels.

Every form computes the same numbers from the same inputs (the table's last column shows each
one's largest difference from the NumPy float64 reference), so the times compare like with like:

* projection ``x @ w``, x: (n, d), w: (d, d): pure-Python triple loop, torch one entry at a time
  (``matmul_loop``), one token at a time (``linear_loop``), NumPy, torch ``linear``;
* attention of one head, q, k, v: (n, d_head), once without a mask (the plain formula) and once
  causal: pure Python, ``attention_loop``, NumPy (``reference.attention``), torch ``attention``
  explicit and fused;
* a larger attention, (b, h, n, d_head) = (1, 12, 512, 64) as in one GPT-2 small layer: NumPy,
  torch explicit and fused.

GFLOP/s count useful work: 2 n d d for the projection, and for causal attention 4 d_head per
visible (query, key) pair (:func:`llmcore.timing.attention_flops`), so a form that computes the
masked half of the scores and throws it away shows a lower rate. The peak is this machine's
measured float32 matmul (:func:`llmcore.timing.matmul_peak_gflops`). Chapters 2, 3 and 10.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, TextIO

import numpy as np
import torch

from llmcore import reference
from llmcore.attention import attention, attention_loop
from llmcore.device import describe_machine
from llmcore.matmul import linear, linear_loop, matmul_loop
from llmcore.scalar import attention_scalar, matmul_scalar
from llmcore.timing import attention_flops, gflops, matmul_flops, matmul_peak_gflops, time_call

NAME = "ops"


@dataclass(frozen=True)
class Sizes:
    """The sizes one run uses. n, d: the projection and small attention (q: (n, d) for one head);
    big_*: the large attention (b, h, n, d_head); peak_size: the square matmul of the peak."""

    n: int
    d: int
    big_b: int
    big_heads: int
    big_n: int
    big_d_head: int
    peak_size: int | None
    repeats: int
    slow_repeats: int
    min_seconds: float


FULL = Sizes(n=64, d=64, big_b=1, big_heads=12, big_n=512, big_d_head=64, peak_size=None,
             repeats=9, slow_repeats=3, min_seconds=0.02)
QUICK = Sizes(n=6, d=10, big_b=1, big_heads=2, big_n=24, big_d_head=8, peak_size=128,
              repeats=1, slow_repeats=1, min_seconds=0.0)

STATISTIC = "min"
"""Each time is the best repeat: on a machine shared with other processes a slower repeat
measures them, not the code (Python's timeit gives the same advice)."""

MATRIX_VS_PYTHON_AT_LEAST = 300.0
"""Expected on a 2-core machine: matrix attention >= 300x faster than pure-Python loops at
n = 64, d = 64. Checked with and without the causal mask: the pure-Python loop skips the masked
half of the work, the matrix form computes it and throws it away, so causal is the harder case."""

EXPLICIT_VS_FUSED_AT_MOST = 2.0
"""Expected: explicit torch attention takes at most 2x the fused kernel's time at n = 512."""


@dataclass(frozen=True)
class Row:
    """One measured form: what it is, its dtype, seconds per call, useful FLOPs per call, and its
    largest absolute difference from the float64 reference."""

    label: str
    dtype: str
    seconds: float
    flops: int
    error: float


def measure_row(label: str, dtype: str, fn: Callable, args: tuple, flops: int, want: np.ndarray,
                *, repeats: int, min_seconds: float, kwargs: dict | None = None) -> Row:
    """Run ``fn(*args, **kwargs)`` once to check it against ``want``, then time it."""
    kwargs = kwargs or {}
    got = fn(*args, **kwargs)
    got = got.detach().cpu().double().numpy() if isinstance(got, torch.Tensor) \
        else np.asarray(got, dtype=np.float64)
    error = float(np.abs(got - want).max())
    seconds = time_call(fn, *args, repeats=repeats, min_seconds=min_seconds, statistic=STATISTIC,
                        **kwargs)
    return Row(label, dtype, seconds, flops, error)


def format_seconds(seconds: float) -> str:
    """A time with a readable unit: ``"12.3 ms"``."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def write_table(out: TextIO, title: str, rows: list[Row], peak: float) -> None:
    """The rows of one measurement, fastest form last as listed, with GFLOP/s and % of peak."""
    out.write(f"\n{title}\n")
    out.write(f"  {'form':<52} {'dtype':<8} {'time':>9} {'GFLOP/s':>9} {'% peak':>7} "
              f"{'max |diff|':>10}\n")
    for row in rows:
        rate = gflops(row.flops, row.seconds)
        out.write(f"  {row.label:<52} {row.dtype:<8} {format_seconds(row.seconds):>9} "
                  f"{rate:>9.3g} {100 * rate / peak:>6.2g}% {row.error:>10.1e}\n")


def format_ratio(value: float) -> str:
    """A ratio with at least two significant digits and no exponent: 3124, 12.50, 0.0042."""
    if value >= 100:
        return f"{value:.0f}"
    if value >= 1 or value <= 0:
        return f"{value:.2f}"
    return f"{value:.{1 - math.floor(math.log10(value))}f}"       # 0.0042: two significant


def write_ratio(out: TextIO, label: str, value: float, *, at_least: float | None = None,
                at_most: float | None = None, checked: bool = True) -> None:
    """``ratio <label>: <value>x``, then the expectation and whether it held (if there is one)."""
    line = f"ratio {label}: {format_ratio(value)}x"
    if at_least is not None or at_most is not None:
        bound = f">= {at_least:g}x" if at_least is not None else f"<= {at_most:g}x"
        held = (at_least is None or value >= at_least) and (at_most is None or value <= at_most)
        verdict = ("held" if held else "NOT held") if checked \
            else "not checked (--quick sizes are not the expectation's)"
        line += f"   expected {bound}: {verdict}"
    out.write(line + "\n")


def projection_rows(sizes: Sizes, device: torch.device, rng: np.random.Generator) -> list[Row]:
    """x @ w with x: (n, d), w: (d, d), every form."""
    n, d = sizes.n, sizes.d
    x64, w64 = rng.standard_normal((n, d)), rng.standard_normal((d, d))
    want = reference.matmul(x64, w64)                                       # (n, d) float64
    x, w = (torch.from_numpy(a).to(device, torch.float32) for a in (x64, w64))
    x32, w32 = x64.astype(np.float32), w64.astype(np.float32)
    flops = matmul_flops(n, d, d)
    slow = dict(repeats=sizes.slow_repeats, min_seconds=sizes.min_seconds)
    fast = dict(repeats=sizes.repeats, min_seconds=sizes.min_seconds)
    return [
        measure_row("pure Python, triple loop (matmul_scalar)", "float64", matmul_scalar,
                    (x64.tolist(), w64.tolist()), flops, want, **slow),
        measure_row("torch, one entry at a time (matmul_loop)", "float32", matmul_loop,
                    (x, w), flops, want, **slow),
        measure_row("torch, one token at a time (linear_loop)", "float32", linear_loop,
                    (x, w), flops, want, **fast),
        measure_row("NumPy, x @ w (reference.matmul)", "float64", reference.matmul,
                    (x64, w64), flops, want, **fast),
        measure_row("NumPy, x @ w", "float32", np.matmul, (x32, w32), flops, want, **fast),
        measure_row("torch, x @ w (linear)", "float32", linear, (x, w), flops, want, **fast),
    ]


def attention_inputs(shape: tuple[int, ...], device: torch.device, rng: np.random.Generator, *,
                     causal: bool = True):
    """q, k, v as float64 arrays and as float32 tensors on ``device``, and the reference output."""
    arrays = [rng.standard_normal(shape) for _ in range(3)]
    want = reference.attention(*arrays, causal=causal)
    tensors = tuple(torch.from_numpy(a).to(device, torch.float32) for a in arrays)
    return arrays, tensors, want


def matrix_attention_rows(arrays, tensors, want: np.ndarray, flops: int, options: dict, *,
                          numpy_timing: dict, torch_timing: dict) -> list[Row]:
    """The three matrix forms of one attention: NumPy float64, torch explicit, torch fused.
    options: ``attention``'s keywords (``causal``); the timings: ``measure_row``'s repeats."""
    return [
        measure_row("NumPy matrices (reference.attention)", "float64", reference.attention,
                    tuple(arrays), flops, want, kwargs=options, **numpy_timing),
        measure_row("torch matrices, explicit (attention)", "float32", attention, tensors,
                    flops, want, kwargs=options, **torch_timing),
        measure_row("torch, fused (attention, backend='fused')", "float32", attention,
                    tensors, flops, want, kwargs={**options, "backend": "fused"}, **torch_timing),
    ]


def small_attention_rows(sizes: Sizes, device: torch.device, rng: np.random.Generator, *,
                         causal: bool) -> list[Row]:
    """Attention of one head, q, k, v: (n, d_head) with d_head = d, causal or not, every form."""
    n, d_head = sizes.n, sizes.d
    arrays, tensors, want = attention_inputs((n, d_head), device, rng, causal=causal)
    flops = attention_flops(n, n, d_head, causal=causal)
    slow = dict(repeats=sizes.slow_repeats, min_seconds=sizes.min_seconds)
    fast = dict(repeats=sizes.repeats, min_seconds=sizes.min_seconds)
    options = {"causal": causal}
    return [
        measure_row("pure Python, loops over lists (attention_scalar)", "float64",
                    attention_scalar, tuple(a.tolist() for a in arrays), flops, want,
                    kwargs=options, **slow),
        measure_row("torch, one query, one key at a time (attention_loop)", "float32",
                    attention_loop, tensors, flops, want, kwargs=options, **slow),
        *matrix_attention_rows(arrays, tensors, want, flops, options, numpy_timing=fast,
                               torch_timing=fast),
    ]


def big_attention_rows(sizes: Sizes, device: torch.device, rng: np.random.Generator) -> list[Row]:
    """Causal attention q, k, v: (b, h, n, d_head): NumPy, torch explicit, torch fused."""
    b, h, n, d_head = sizes.big_b, sizes.big_heads, sizes.big_n, sizes.big_d_head
    arrays, tensors, want = attention_inputs((b, h, n, d_head), device, rng)
    flops = attention_flops(n, n, d_head, n_heads=h, batch=b, causal=True)
    slow = dict(repeats=sizes.slow_repeats, min_seconds=sizes.min_seconds)
    fast = dict(repeats=sizes.repeats, min_seconds=sizes.min_seconds)
    return matrix_attention_rows(arrays, tensors, want, flops, {"causal": True},
                                 numpy_timing=slow, torch_timing=fast)


def run(out: TextIO, *, quick: bool = False, device: torch.device | str | None = None) -> None:
    """Measure and write the section's tables and ratios to ``out``."""
    device = torch.device(device if device is not None else "cpu")
    sizes = QUICK if quick else FULL
    rng = np.random.default_rng(0)
    peak = matmul_peak_gflops(device, torch.float32, sizes.peak_size)
    out.write(f"== {NAME}: the same projection and attention, from loops to matrices ==\n")
    out.write(f"machine: {describe_machine(device)}\n")
    note = "   (--quick: tiny sizes, not a measurement)" if quick else ""
    out.write(f"device for torch: {device}{note}\n")
    out.write(f"peak: {peak:.3g} GFLOP/s (float32 square matmul on {device}, best of 3)\n")
    out.write(f"times: best of {sizes.repeats} repeats ({sizes.slow_repeats} for the slow loops), "
              f"each repeat at least {sizes.min_seconds * 1e3:g} ms long; "
              "max |diff|: against the NumPy float64 reference\n")

    n, d = sizes.n, sizes.d
    projection = projection_rows(sizes, device, rng)
    write_table(out, f"projection x @ w, x: (n={n}, d={d}), w: ({d}, {d})", projection, peak)
    plain = small_attention_rows(sizes, device, rng, causal=False)
    write_table(out, f"attention without a mask, one head, q, k, v: (n={n}, d_head={d})", plain,
                peak)
    small = small_attention_rows(sizes, device, rng, causal=True)
    write_table(out, f"causal attention, one head, q, k, v: (n={n}, d_head={d})", small, peak)
    b, h, big_n, d_head = sizes.big_b, sizes.big_heads, sizes.big_n, sizes.big_d_head
    big = big_attention_rows(sizes, device, rng)
    write_table(out, f"causal attention, q, k, v: (b={b}, h={h}, n={big_n}, d_head={d_head})",
                big, peak)

    py_proj, _, per_token, *_, torch_proj = projection
    plain_py, _, _, plain_explicit, _ = plain
    py_attn, loop_attn, _, explicit, _ = small
    _, big_explicit, big_fused = big
    out.write("\n")
    write_ratio(out, f"projection, torch matrix vs pure Python (n={n}, d={d})",
                py_proj.seconds / torch_proj.seconds)
    write_ratio(out, f"projection, torch matrix vs linear_loop (n={n}, d={d})",
                per_token.seconds / torch_proj.seconds)
    write_ratio(out, f"attention without a mask, torch matrix vs pure Python (n={n}, d={d})",
                plain_py.seconds / plain_explicit.seconds, at_least=MATRIX_VS_PYTHON_AT_LEAST,
                checked=not quick)
    write_ratio(out, f"causal attention, torch matrix vs pure Python (n={n}, d={d})",
                py_attn.seconds / explicit.seconds, at_least=MATRIX_VS_PYTHON_AT_LEAST,
                checked=not quick)
    write_ratio(out, f"causal attention, torch matrix vs attention_loop (n={n}, d={d})",
                loop_attn.seconds / explicit.seconds)
    write_ratio(out, f"attention, explicit time / fused time (n={big_n}, both through "
                     f"llmcore.attention, checks included; section 'fast' times SDPA directly)",
                big_explicit.seconds / big_fused.seconds, at_most=EXPLICIT_VS_FUSED_AT_MOST,
                checked=not quick)
