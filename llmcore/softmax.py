"""Softmax over the last axis: per row, subtract the maximum, exponentiate, normalise.

Subtracting the row maximum changes nothing mathematically (it cancels in the ratio) but keeps
``exp`` from overflowing: exp(1000) is inf in float32, exp(1000 - 1000) is 1. A row whose entries
are all ``-inf`` (every key masked, as for a padding query) has no defined softmax; here it gives
all zeros instead of NaN, so it adds nothing downstream. Chapter 3.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from .shapes import check_tensor

LOG2_E = 1.0 / math.log(2.0)
"""log2(e): e^y = 2^(y log2 e)."""


def softmax_loop(x: Tensor, dim: int = -1) -> Tensor:
    """Stable softmax, one row at a time and one entry at a time.

    x: (..., m) -> (..., m) along ``dim``; each row sums to 1, or is all zeros if all -inf. Chapter 3.
    """
    check_tensor("x", x)
    rows = x.movedim(dim, -1)
    out = torch.empty_like(rows)
    for idx in np.ndindex(*rows.shape[:-1]):
        row = rows[idx].tolist()
        top = max(row)
        if top == -math.inf:                           # fully masked: no key to attend to
            out[idx] = 0.0
            continue
        exps = [math.exp(value - top) for value in row]  # every exponent <= 0: no overflow
        total = sum(exps)
        out[idx] = torch.tensor([e / total for e in exps], dtype=x.dtype, device=x.device)
    return out.movedim(-1, dim)


def softmax(x: Tensor, dim: int = -1, *, inplace: bool = False) -> Tensor:
    """Same contract as :func:`softmax_loop`, every row at once.

    x: (..., m) -> (..., m). Follows x's device and dtype. Chapter 3.
    inplace: overwrite x with the result (as ``F.relu(inplace=True)``), for
    a scores buffer the caller owns: attention uses it, so its (..., n, m)
    scores are the only buffer of that size.
    """
    check_tensor("x", x)
    # the shift needs no gradient; an all -inf row gets a finite one
    top = x.detach().amax(dim=dim, keepdim=True)
    top = top.clamp_(min=torch.finfo(x.dtype).min)
    shifted = x.sub_(top) if inplace else x - top      # every exponent <= 0
    # e^y computed as 2^(y log2 e), the same number: torch's exp2 kernel
    # keeps its speed on the -inf entries a mask leaves, where exp can slow
    # down several-fold (measured in Chapter 3)
    exps = shifted.mul_(LOG2_E).exp2_()
    # A row with a finite maximum sums to at least 1 (its maximum gives
    # exp(0) = 1); an all -inf row sums to 0, and dividing it by 1 instead
    # leaves zeros, not 0 / 0 = NaN.
    total = exps.sum(dim=dim, keepdim=True).clamp_(min=1.0)
    if exps.requires_grad:
        return exps / total      # autograd keeps exps for the backward pass
    return exps.div_(total)      # no gradient: in place, no new buffer


def softmax_naive(x: Tensor, dim: int = -1) -> Tensor:
    """Softmax without the max shift, kept to show what goes wrong: exp
    overflows to inf and inf / inf is NaN for logits above about 88 in
    float32. Do not use. Chapter 3."""
    exps = torch.exp(x)
    return exps / exps.sum(dim=dim, keepdim=True)
