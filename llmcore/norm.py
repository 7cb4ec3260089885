"""Layer normalisation: per token, centre and scale its d features, then a learned affine map.

layer_norm(x)_i = scale * (x_i - mean(x_i)) / sqrt(var(x_i) + eps) + shift, with the biased
variance (divide by d) and eps inside the square root, as ``torch.nn.LayerNorm`` does. No matrix
trick is involved: rows are independent, so all of them run at once. Chapter 5.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .shapes import check_operands, check_shape

LN_EPS = 1e-5
"""Added to the variance before the square root; torch.nn.LayerNorm's and GPT-2's default."""


def _check_norm(x: Tensor, scale: Tensor, shift: Tensor) -> None:
    check_operands(x=x, scale=scale, shift=shift)
    sizes = check_shape("x", x, ("...", "d"))
    check_shape("scale", scale, ("d",), **sizes)
    check_shape("shift", shift, ("d",), **sizes)


def layer_norm_loop(x: Tensor, scale: Tensor, shift: Tensor,
                    eps: float = LN_EPS) -> Tensor:
    """Layer norm one row (token) at a time, mean and variance by explicit
    sums.

    x: (..., d)   scale, shift: (d,)   ->   (..., d). Chapter 5.
    """
    _check_norm(x, scale, shift)
    d = x.shape[-1]
    out = torch.empty_like(x)
    for idx in np.ndindex(*x.shape[:-1]):
        row = x[idx]
        mean = sum(row[c] for c in range(d)) / d
        # biased: divide by d
        var = sum((row[c] - mean) ** 2 for c in range(d)) / d
        out[idx] = scale * (row - mean) / torch.sqrt(var + eps) + shift
    return out


def layer_norm(x: Tensor, scale: Tensor, shift: Tensor,
               eps: float = LN_EPS) -> Tensor:
    """Same contract as :func:`layer_norm_loop`, every row at once.

    x: (..., d)   scale, shift: (d,)   ->   (..., d). Chapter 5.
    """
    _check_norm(x, scale, shift)
    # (..., 1) each
    var, mean = torch.var_mean(x, dim=-1, keepdim=True, unbiased=False)
    return scale * (x - mean) / torch.sqrt(var + eps) + shift


RMS_EPS = 1e-6
"""Added to the mean square before the square root; Llama's default (HF's ``rms_norm_eps``)."""


def _check_rms(x: Tensor, weight: Tensor) -> None:
    check_operands(x=x, weight=weight)
    sizes = check_shape("x", x, ("...", "d"))
    check_shape("weight", weight, ("d",), **sizes)


def rms_norm_loop(x: Tensor, weight: Tensor, eps: float = RMS_EPS) -> Tensor:
    """RMS norm one row (token) at a time: divide by the root mean square, then scale.

    x: (..., d)   weight: (d,)   ->   (..., d). Unlike layer norm: no mean subtracted, no shift.
    Chapter 11.
    """
    _check_rms(x, weight)
    d = x.shape[-1]
    out = torch.empty_like(x)
    for idx in np.ndindex(*x.shape[:-1]):
        row = x[idx]
        mean_square = sum(row[c] ** 2 for c in range(d)) / d
        out[idx] = weight * row / torch.sqrt(mean_square + eps)
    return out


def rms_norm(x: Tensor, weight: Tensor, eps: float = RMS_EPS) -> Tensor:
    """Same contract as :func:`rms_norm_loop`, every row at once. Half
    precision is normalised in float32 and cast back before the weight, as
    Hugging Face's Llama does.

    x: (..., d)   weight: (d,)   ->   (..., d). Chapter 11.
    """
    _check_rms(x, weight)
    wide = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    mean_square = wide.pow(2).mean(dim=-1, keepdim=True)          # (..., 1)
    return weight * (wide * torch.rsqrt(mean_square + eps)).to(x.dtype)
