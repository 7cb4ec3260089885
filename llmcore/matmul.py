"""Matrix multiplication and the projection ``x @ w + b``: loops, then one matmul.

Rows are tokens. Projecting one token ``t_i`` (a row of d numbers) by ``w`` (d_in, d_out) is a
(1, d_in) x (d_in, d_out) product; stacking the n rows gives ``X @ W``, one matmul. Chapter 2.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .shapes import check_operands, check_shape


def dot_loop(a: Tensor, b: Tensor) -> Tensor:
    """Dot product by an explicit loop over the shared dimension.

    a, b: (k,) -> () . Chapter 2.
    """
    sizes = check_shape("a", a, ("k",))
    check_shape("b", b, ("k",), **sizes)
    total = torch.zeros((), dtype=a.dtype, device=a.device)
    for i in range(a.shape[0]):
        total = total + a[i] * b[i]
    return total


def matmul_loop(a: Tensor, b: Tensor) -> Tensor:
    """Matrix product, one output entry at a time: row i of ``a`` times
    column j of ``b``.

    a: (n, k)   b: (k, m)   ->   (n, m). The loop bounds are n, m and the
    shared k; mixing them up is only caught when n, k and m differ.
    Chapter 2.
    """
    check_operands(a=a, b=b)
    sizes = check_shape("a", a, ("n", "k"))
    check_shape("b", b, ("k", "m"), k=sizes["k"])
    n, m = a.shape[0], b.shape[1]
    out = torch.empty(n, m, dtype=a.dtype, device=a.device)
    for i in range(n):                # each row of a (a token)
        for j in range(m):            # each column of b (an output feature)
            # the row-times-column dot product over k
            out[i, j] = (a[i] * b[:, j]).sum()
    return out


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """Same contract as :func:`matmul_loop`, as one call into BLAS (CPU) or cuBLAS (GPU).

    a: (..., n, k)   b: (..., k, m)   ->   (..., n, m); leading dimensions broadcast. Chapter 2.
    """
    check_operands(a=a, b=b)
    sizes = check_shape("a", a, ("...", "n", "k"))
    check_shape("b", b, ("...", "k", "m"), k=sizes["k"])
    return a @ b


def linear_loop(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    """Project each token separately: ``y_i = x_i @ w + b``, one row at a
    time.

    x: (..., n, d_in)   w: (d_in, d_out)   b: (d_out,) or None
    -> (..., n, d_out). Chapter 2.
    """
    check_operands(x=x, w=w, b=b)
    sizes = check_shape("w", w, ("d_in", "d_out"))
    check_shape("x", x, ("...", "n", "d_in"), d_in=sizes["d_in"])
    if b is not None:
        check_shape("b", b, ("d_out",), d_out=sizes["d_out"])
    out = torch.empty(*x.shape[:-1], w.shape[1], dtype=x.dtype,
                      device=x.device)
    for idx in np.ndindex(*x.shape[:-1]):    # every token of every sequence
        row = x[idx] @ w               # (d_in,) @ (d_in, d_out) -> (d_out,)
        out[idx] = row if b is None else row + b
    return out


def linear(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    """Same contract as :func:`linear_loop`, all tokens at once:
    ``x @ w + b``.

    x: (..., n, d_in)   w: (d_in, d_out)   b: (d_out,) or None
    -> (..., n, d_out). The weight is shared by every token (and every
    sequence of a batch). Chapter 2.
    """
    check_operands(x=x, w=w, b=b)
    sizes = check_shape("w", w, ("d_in", "d_out"))
    check_shape("x", x, ("...", "n", "d_in"), d_in=sizes["d_in"])
    if b is None:
        return x @ w
    check_shape("b", b, ("d_out",), d_out=sizes["d_out"])
    return x @ w + b
