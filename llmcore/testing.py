"""Comparison helpers with messages that teach: used by pytest, the chapters and nbgrader tests.

A failed check says what was expected and what came: the shapes, or where the values differ most
and by how much, so that a learner's next step is obvious.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch
from torch import Tensor


def randn(rng: np.random.Generator, *shape: int, device=None,
          dtype: torch.dtype = torch.float32) -> Tensor:
    """Standard-normal tensor from a NumPy generator (the same numbers on every device)."""
    return torch.from_numpy(rng.standard_normal(shape)).to(device=device, dtype=dtype)


def randint(generator: torch.Generator, low: int, high: int, *shape: int, device=None,
            dtype: torch.dtype = torch.float64) -> Tensor:
    """Whole numbers drawn uniformly from [low, high] (both included) by ``generator`` on the CPU,
    then moved: small exact values for examples checked by hand (Chapters 4 and 5)."""
    drawn = torch.randint(low, high + 1, shape, generator=generator)
    return drawn.to(device=device, dtype=dtype)


def _as_array(x) -> np.ndarray:
    if isinstance(x, Tensor):
        return x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def assert_close(actual, expected, *, name: str = "result", rtol: float = 1e-5,
                 atol: float = 1e-6) -> None:
    """Raise AssertionError unless actual and expected have one shape and close values.

    Works on tensors, arrays and nested lists; NaN never equals anything. The message names
    the expected and actual shape, or the entry that differs most.
    """
    if actual is None:
        raise AssertionError(f"{name}: got None; did the function forget to return its result?")
    got, want = _as_array(actual), _as_array(expected)
    if got.shape != want.shape:
        raise AssertionError(f"{name}: expected shape {want.shape}, got {got.shape}")
    if np.isnan(got).any() and not np.isnan(want).any():
        where = tuple(int(i) for i in np.argwhere(np.isnan(got))[0])
        raise AssertionError(f"{name}: got NaN at index {where} (expected {want[where]:.6g}); "
                             "an overflow or 0/0 somewhere?")
    bad = ~np.isclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
    if bad.any():
        diff = np.where(bad, np.abs(got - want), 0)
        diff = np.nan_to_num(diff, nan=np.inf)
        where = np.unravel_index(np.argmax(diff), diff.shape)
        where = tuple(int(i) for i in where)
        raise AssertionError(f"{name}: {int(bad.sum())} of {bad.size} entries differ; the largest "
                             f"difference is at index {where}: expected {want[where]:.6g}, "
                             f"got {got[where]:.6g}")


def assert_same_as(fn: Callable, oracle: Callable, *, shapes: Sequence[Sequence[int]],
                   seed: int = 0, dtype: torch.dtype = torch.float64, device=None,
                   rtol: float = 1e-7, atol: float = 1e-9, **kwargs) -> None:
    """Call ``fn`` and ``oracle`` on the same random inputs and require the same result.

    shapes: one shape per positional argument; kwargs are passed to both. Example:
    ``assert_same_as(my_attention, attention, shapes=[(2, 4, 8)] * 3, causal=True)``.
    """
    rng = np.random.default_rng(seed)
    args = [randn(rng, *shape, device=device, dtype=dtype) for shape in shapes]
    want = oracle(*args, **kwargs)
    got = fn(*[a.clone() for a in args], **kwargs)
    name = getattr(fn, "__name__", "fn")
    assert_close(got, want, name=f"{name}{tuple(tuple(s) for s in shapes)}", rtol=rtol, atol=atol)
