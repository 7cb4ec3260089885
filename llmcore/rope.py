"""Rotary position embeddings (RoPE): turn pairs of query/key features by position-dependent angles.

A query or key row of d_head features is cut into d_head / 2 pairs; pair i is turned by the angle
position * theta_i, with theta_i = base^(-2i / d_head) (base 10000 in RoFormer and Llama 1-2,
500000 in Llama 3): the first pairs spin fast, the last ones slowly. Rotations compose, so the score of a query at position p and a key at
position s, (R_p q) . (R_s k) = q . R_{s - p} k, depends only on s - p: relative position.

Pairing convention: Hugging Face's Llama pairs feature i with feature i + d_head / 2 (its
``rotate_half``); the RoFormer paper pairs neighbours (2i, 2i + 1). Both are the same rotation
after a fixed permutation of the features (:func:`interleaved_order`), which converted checkpoints
fold into w_q and w_k, within each head: into their columns in the book's (in, out) convention,
the rows of the (out, in) ``nn.Linear`` weights that checkpoints store. llmcore uses the
half-split pairing, so its numbers equal HF's.

Llama 3.1 and 3.2 stretch the slow pairs for a longer context (``rope_scaling`` of type "llama3",
:class:`RopeScaling`): a pair whose wavelength 2 pi / theta_i is short against the context of
pretraining keeps theta_i, a long one is slowed by ``factor``, and the ones between blend the two.

Three rungs, one contract: :func:`rope_loop` (one pair at a time), :func:`rope_matrix` (a
block-diagonal rotation, up to that permutation, applied as x @ R^T) and :func:`apply_rope` (two
elementwise products with cos/sin tables: what the model uses). Chapter 11.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .shapes import check_shape, check_tensor

ROPE_BASE = 10000.0
"""The base of the angle frequencies, theta_i = base^(-2i / d_head): RoFormer's and Llama 1-2's
(Llama 3 uses 500000: pass ``base``, or ``LlamaConfig(rope_base=...)``)."""


def _check_d_head(d_head: int) -> None:
    if d_head <= 0 or d_head % 2:
        raise ValueError(f"RoPE: d_head must be a positive even number (features come in pairs), "
                         f"got {d_head}")


def rope_frequencies(d_head: int, base: float = ROPE_BASE, *, device=None,
                     dtype: torch.dtype = torch.float32,
                     scaling: RopeScaling | None = None) -> Tensor:
    """theta_i = base^(-2i / d_head) for i = 0 .. d_head/2 - 1: radians per position of pair i.

    -> (d_head / 2,). Computed as 1 / base^(2i / d_head), as Hugging Face does; then scaled by
    ``scaling`` (Llama 3.1's rule, :func:`scale_frequencies`) when given. Chapter 11.
    """
    _check_d_head(d_head)
    exponents = torch.arange(0, d_head, 2, device=device, dtype=dtype) / d_head   # 2i / d_head
    theta = 1.0 / (base ** exponents)
    return theta if scaling is None else scale_frequencies(theta, scaling)


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3.1's frequency-dependent RoPE scaling (``rope_type`` "llama3"), as released:
    factor 8 (3.1) or 32 (3.2), low_freq_factor 1, high_freq_factor 4, original context 8192.

    With lambda_i = 2 pi / theta_i the wavelength of pair i and L the original context:
    lambda_i < L / high_freq_factor: theta_i kept; lambda_i > L / low_freq_factor: theta_i /
    factor; between: (1 - s) theta_i / factor + s theta_i with s = (L / lambda_i - low) /
    (high - low). Chapter 11."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_context: int

    def __post_init__(self) -> None:
        if not (self.factor > 0 and 0 < self.low_freq_factor < self.high_freq_factor
                and self.original_context > 0):
            raise ValueError(f"RopeScaling: expected factor > 0, 0 < low_freq_factor < "
                             f"high_freq_factor and original_context > 0, got {self}")


def scale_frequencies(theta: Tensor, scaling: RopeScaling) -> Tensor:
    """theta: (d_head / 2,) -> theta scaled by Llama 3.1's three-part rule
    (:class:`RopeScaling`): fast pairs kept, slow ones divided by factor,
    a blend between. Chapter 11."""
    low, high = scaling.low_freq_factor, scaling.high_freq_factor
    context = scaling.original_context                    # L_0
    wavelength = 2 * math.pi / theta                      # per turn
    slow = theta / scaling.factor
    s = (context / wavelength - low) / (high - low)       # 0 at L_0/low
    blend = (1 - s) * slow + s * theta                    # 1 at L_0/high
    out = torch.where(wavelength > context / low, slow, theta)
    between = ((wavelength >= context / high)
               & (wavelength <= context / low))
    return torch.where(between, blend, out)


def _check_positions(x: Tensor, positions: Tensor) -> None:
    check_tensor("x", x)
    check_tensor("positions", positions)
    _check_d_head(x.shape[-1])
    if not x.dtype.is_floating_point:
        raise TypeError(f"x: expected a floating-point tensor, got {x.dtype}")
    if positions.dtype.is_floating_point or positions.dtype == torch.bool:
        raise TypeError(f"positions: expected integer positions, got {positions.dtype}")
    if positions.device != x.device:
        raise ValueError(f"positions are on {positions.device} but x is on {x.device}")
    n = check_shape("x", x, ("...", "n", "d_head"))["n"]
    if positions.ndim == 1:
        check_shape("positions", positions, (n,))
    elif positions.ndim == 2 and x.ndim >= 3:
        check_shape("positions", positions, (x.shape[0], n))
    else:
        raise ValueError(f"positions: expected (n,) = ({n},) or (b, n) = ({x.shape[0]}, {n}) for "
                         f"x of shape {tuple(x.shape)}, got {tuple(positions.shape)}")


def _table_dtype(x: Tensor) -> torch.dtype:
    """Angles in float64 for float64 inputs, otherwise float32 (as HF: never in half precision)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def rope_loop(x: Tensor, positions: Tensor,
              base: float = ROPE_BASE) -> Tensor:
    """RoPE one row and one pair at a time: pair (x_i, x_{i + d_head/2})
    turned by pos * theta_i.

    x: (..., n, d_head)   positions: (n,) or (b, n) ints
    -> (..., n, d_head). Slow; tiny shapes only. Chapter 11.
    """
    _check_positions(x, positions)
    n, d_head = x.shape[-2], x.shape[-1]
    half = d_head // 2
    theta = rope_frequencies(d_head, base, device=x.device,
                             dtype=_table_dtype(x))
    out = torch.empty_like(x)
    for idx in np.ndindex(*x.shape[:-2]):        # every (batch, head) index
        for t in range(n):
            pos = (positions[t] if positions.ndim == 1
                   else positions[idx[0], t])
            for i in range(half):
                angle = pos.to(theta.dtype) * theta[i]
                cos = torch.cos(angle).to(x.dtype)
                sin = torch.sin(angle).to(x.dtype)
                a, b = x[idx][t, i], x[idx][t, i + half]
                out[idx][t, i] = a * cos - b * sin          # [cos -sin] [a]
                out[idx][t, i + half] = a * sin + b * cos   # [sin  cos] [b]
    return out


def interleaved_order(d_head: int) -> list[int]:
    """The feature order that puts each half-split pair side by side: [0, h, 1, h + 1, ...].

    With ``order = interleaved_order(d_head)``, ``x[..., order]`` lays pair i at features
    (2i, 2i + 1), the RoFormer paper's neighbour pairing. Chapter 11.
    """
    _check_d_head(d_head)
    half = d_head // 2
    return [j for i in range(half) for j in (i, i + half)]


def rope_matrix(position: int, d_head: int, base: float = ROPE_BASE, *,
                device=None, dtype: torch.dtype = torch.float64) -> Tensor:
    """The rotation R_pos as a (d_head, d_head) matrix; rotate rows with
    ``x @ R.T``.

    Built as the paper writes it, a block-diagonal matrix of 2 x 2
    rotations by pos * theta_i (neighbour pairs), then its rows and columns
    put back in half-split order. Chapter 11.
    """
    theta = rope_frequencies(d_head, base, device=device,
                             dtype=torch.float64)
    angles = position * theta                                  # (d_head/2,)
    cos, sin = torch.cos(angles), torch.sin(angles)
    blocks = [torch.stack([torch.stack([c, -s]), torch.stack([s, c])])
              for c, s in zip(cos, sin)]                  # each (2, 2)
    interleaved = torch.block_diag(*blocks)               # (d_head, d_head)
    order = torch.tensor(interleaved_order(d_head), device=device)
    back = torch.argsort(order)       # half-split feature j sits at back[j]
    return interleaved[back][:, back].to(dtype)


def rope_tables(positions: Tensor, d_head: int, base: float = ROPE_BASE, *,
                dtype: torch.dtype = torch.float32,
                scaling: RopeScaling | None = None) -> tuple[Tensor, Tensor]:
    """cos and sin of every angle, each repeated for both halves of the features.

    positions: (n,) or (b, n) ints -> cos, sin: positions.shape + (d_head,). Chapter 11.
    """
    theta = rope_frequencies(d_head, base, device=positions.device, dtype=dtype,
                             scaling=scaling)
    angles = positions.to(dtype)[..., None] * theta                         # (..., n, d_head/2)
    angles = torch.cat([angles, angles], dim=-1)                            # (..., n, d_head)
    return torch.cos(angles), torch.sin(angles)


def rotate_half(x: Tensor) -> Tensor:
    """(a, b) -> (-b, a) for the two halves of the last axis: the 90-degree turn of every pair.

    x: (..., d_head) -> (..., d_head). Chapter 11.
    """
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def apply_rope(x: Tensor, positions: Tensor,
               base: float = ROPE_BASE, *,
               scaling: RopeScaling | None = None) -> Tensor:
    """RoPE with no loop and no matrix: x * cos + rotate_half(x) * sin,
    elementwise.

    x: (..., n, d_head)   positions: (n,) or (b, n) ints (b = x.shape[0])
    -> (..., n, d_head). Costs 2 d_head multiplies and d_head additions per
    row (the cos/sin tables aside) instead of the matrix form's d_head^2
    multiplies. scaling: Llama 3.1's frequencies (:class:`RopeScaling`).
    Chapter 11.
    """
    _check_positions(x, positions)
    cos, sin = rope_tables(positions, x.shape[-1], base,
                           dtype=_table_dtype(x), scaling=scaling)
    if positions.ndim == 2:  # (b, n, d_head): skip the axes between b and n
        shape = (positions.shape[0],) + (1,) * (x.ndim - 3) + cos.shape[1:]
        cos, sin = cos.view(shape), sin.view(shape)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + rotate_half(x) * sin
