"""The shape legend, and argument checks that name what they expected and what came.

Legend, used in every docstring of the package and in the book::

    b       batch size                 n       query length (tokens computed this step)
    m       key length (m >= n with a cache)
    d       d_model                    h       n_heads          d_head = d / h
    h_kv    n_kv_heads (h_kv <= h)     f       FFN width (4 d)  v      vocab_size
    p       page (block) size          L       n_layers

Rows are tokens: ``x`` is (n, d) and ``q = x @ w_q`` is (n, d_head) for one head.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

def check_tensor(name: str, x: object) -> Tensor:
    """Raise a TypeError naming ``name`` unless ``x`` is a torch tensor; return it."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    return x


def format_shape(pattern: Sequence[int | str]) -> str:
    """``("...", "n", 8)`` -> ``"(..., n, 8)"``."""
    return "(" + ", ".join(str(p) for p in pattern) + ")"


def check_shape(name: str, x: Tensor, pattern: Sequence[int | str], **known: int) -> dict[str, int]:
    """Check ``x.shape`` against a pattern of sizes and symbols; return the symbols' sizes.

    pattern: ints must match exactly; strings are symbols, bound on first use and required to be
    equal wherever they repeat (``known`` binds some up front); a leading ``"..."`` matches any number
    of leading (batch) dimensions. Raises ValueError naming ``name``, the expected and the actual shape.

    >>> check_shape("q", torch.zeros(2, 5, 8), ("...", "n", "d_head"), d_head=8)
    {'d_head': 8, 'n': 5}
    """
    check_tensor(name, x)
    sizes = dict(known)
    dims = list(pattern)
    leading = bool(dims) and dims[0] == "..."
    if leading:
        dims = dims[1:]
    shape = tuple(x.shape)
    if (len(shape) < len(dims)) if leading else (len(shape) != len(dims)):
        raise ValueError(
            f"{name}: expected shape {_describe(pattern, sizes)}, got {shape} "
            f"({len(shape)} dimensions instead of {'at least ' if leading else ''}{len(dims)})"
        )
    tail = shape[len(shape) - len(dims):]
    for symbol, size in zip(dims, tail):
        if isinstance(symbol, str):
            if sizes.setdefault(symbol, size) != size:
                raise ValueError(
                    f"{name}: expected shape {_describe(pattern, sizes)} with {symbol} = "
                    f"{sizes[symbol]}, got {shape}"
                )
        elif symbol != size:
            raise ValueError(f"{name}: expected shape {_describe(pattern, sizes)}, got {shape}")
    return sizes


def _describe(pattern: Sequence[int | str], sizes: dict[str, int]) -> str:
    """The pattern with the symbols that are already bound shown with their size."""
    parts = [f"{p}={sizes[p]}" if isinstance(p, str) and p in sizes else str(p) for p in pattern]
    return "(" + ", ".join(parts) + ")"


def check_same_device(**tensors: Tensor | None) -> torch.device:
    """Raise a ValueError listing every argument's device unless all are on one device."""
    present = {name: t for name, t in tensors.items() if t is not None}
    devices = {t.device for t in present.values()}
    if len(devices) > 1:
        listing = ", ".join(f"{name} on {t.device}" for name, t in present.items())
        raise ValueError(f"expected all tensors on one device, got {listing}")
    return next(iter(devices))


def check_same_dtype(**tensors: Tensor | None) -> torch.dtype:
    """Raise a TypeError listing every argument's dtype unless all share one floating dtype."""
    present = {name: t for name, t in tensors.items() if t is not None}
    dtypes = {t.dtype for t in present.values()}
    if len(dtypes) > 1:
        listing = ", ".join(f"{name} is {t.dtype}" for name, t in present.items())
        raise TypeError(f"expected one floating dtype for all tensors, got {listing}")
    dtype = next(iter(dtypes))
    if not dtype.is_floating_point:
        name = next(iter(present))
        raise TypeError(f"{name}: expected a floating-point tensor, got {dtype}")
    return dtype


def check_operands(**tensors: Tensor | None) -> None:
    """Type, dtype and device checks shared by every matrix-form op (names appear in errors).

    Under ``torch.autocast`` for the tensors' device, mixed floating dtypes are what autocast
    asks for (it casts each op's inputs), so only the floating-point check remains."""
    present = [t for t in tensors.values() if t is not None]
    first = present[0] if present else None
    if first is not None and isinstance(first, Tensor) and first.dtype.is_floating_point and all(
            isinstance(t, Tensor) and t.dtype == first.dtype and t.device == first.device
            for t in present):
        return                         # the common case, checked cheaply: nothing to report
    for name, t in tensors.items():
        if t is not None:
            check_tensor(name, t)
    device = check_same_device(**tensors)
    if device.type in ("cpu", "cuda") and torch.is_autocast_enabled(device.type):
        for name, t in tensors.items():
            if t is not None and not t.dtype.is_floating_point:
                raise TypeError(f"{name}: expected a floating-point tensor, got {t.dtype}")
        return
    check_same_dtype(**tensors)
