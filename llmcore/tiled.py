"""Attention in tiles with an online softmax: the (n, m) score matrix is never held in memory.

Explicit attention builds scores = q k^T / sqrt(d_head), a (..., h, n, m) tensor, before it
softmaxes and averages. Its memory grows with n m: at n = m = 4096 one head of one sequence needs
64 MiB of float32 scores, before the softmax's temporaries. The softmax of a row can instead be
computed while the row streams past, keeping only two numbers per row:

    running_max   the largest score seen so far              (where exp is shifted to)
    running_sum   sum of exp(score - running_max) so far     (the softmax's denominator)

When a later score is larger than running_max, everything summed so far was shifted by the old
maximum: multiplying by ``rescale = exp(old_max - new_max)`` moves it to the new one. Attention
carries a third running quantity, the unnormalised output ``acc = sum exp(score - running_max) v``,
rescaled the same way; dividing by running_sum at the end gives softmax(scores) @ v exactly.
So attention can walk over tiles of block_q queries by block_k keys, holding one
(block_q, block_k) tile of scores at a time (the algorithm of FlashAttention, written here in plain
torch for reading, not for speed: the GPU kernel's gain comes from keeping tiles in on-chip memory).

Rungs: :func:`online_softmax_loop` (one entry at a time), :func:`online_softmax` (a block of
columns at a time), :func:`online_softmax_step` (the update both use), :func:`tiled_attention`.
Chapter 10.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from .attention import check_attention_inputs
from .masks import NEG_INF
from .shapes import check_tensor

DEFAULT_BLOCK = 128
"""Default tile size (queries and keys). A (128, 128) float32 score tile is 64 KiB."""


def _check_block(name: str, value: object) -> int:
    """A tile size must be a positive int (not a bool); raise naming the argument otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}: expected a positive int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name}: expected a positive int, got {value}")
    return int(value)


def online_softmax_loop(x: Tensor, dim: int = -1) -> Tensor:
    """Softmax with one pass over each row for max and sum together, one entry at a time.

    x: (..., m) -> (..., m) along ``dim``; equal to :func:`llmcore.softmax.softmax`, including
    all-zero rows where every entry is -inf. The first pass keeps a running maximum and a running
    sum of exp(x_j - running_max), rescaling the sum whenever the maximum grows; the second pass
    writes exp(x_j - max) / sum. Slow; use small rows. Chapter 10.
    """
    check_tensor("x", x)
    rows = x.movedim(dim, -1)
    out = torch.empty_like(rows)
    for idx in np.ndindex(*rows.shape[:-1]):
        running_max, running_sum = -math.inf, 0.0
        row = rows[idx].tolist()
        for value in row:                               # the one streaming pass
            if value == -math.inf:
                continue                                # a masked entry adds exp(-inf) = 0
            if value > running_max:                     # new maximum: shift what was summed
                running_sum = running_sum * math.exp(running_max - value) + 1.0
                running_max = value
            else:
                running_sum += math.exp(value - running_max)
        if running_sum == 0.0:                          # every entry masked: zeros, not NaN
            out[idx] = 0.0
            continue
        weights = [math.exp(value - running_max) / running_sum for value in row]
        out[idx] = torch.tensor(weights, dtype=x.dtype, device=x.device)
    return out.movedim(-1, dim)


def online_softmax_step(running_max: Tensor, running_sum: Tensor,
                        scores: Tensor, *, inplace: bool = False
                        ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Fold one block of scores into a running maximum and sum.

    running_max, running_sum: (..., 1)   scores: (..., block)
    -> new_max (..., 1), new_sum (..., 1), rescale (..., 1),
    weights (..., block), where ``rescale = exp(running_max - new_max)``
    converts anything accumulated against the old maximum and
    ``weights = exp(scores - new_max)``. Start from running_max = -inf,
    running_sum = 0. Rows whose scores are all -inf so far keep max -inf
    and sum 0 (shifted by 0, never NaN). inplace: compute the weights in
    the scores' own memory (no second tile allocated; the caller must not
    need the scores afterwards). Chapter 10.
    """
    block_max = scores.amax(dim=-1, keepdim=True)
    new_max = torch.maximum(running_max, block_max)               # (..., 1)
    shift = torch.where(torch.isfinite(new_max), new_max,
                        torch.zeros_like(new_max))
    # 0 while nothing was seen: exp(-inf - 0)
    rescale = torch.exp(running_max - shift)
    # masked scores -> 0
    weights = (scores.sub_(shift).exp_() if inplace
               else torch.exp(scores - shift))
    new_sum = running_sum * rescale + weights.sum(dim=-1, keepdim=True)
    return new_max, new_sum, rescale, weights


def online_softmax(x: Tensor, dim: int = -1, *, block: int = DEFAULT_BLOCK) -> Tensor:
    """Softmax computed from running statistics over blocks of ``block`` columns.

    x: (..., m) -> (..., m) along ``dim``; equal to :func:`llmcore.softmax.softmax`. Pass one
    folds each block into the running max and sum (:func:`online_softmax_step`); pass two
    normalises. Only (..., 1) statistics are carried between blocks. Chapter 10.
    """
    check_tensor("x", x)
    block = _check_block("block", block)
    rows = x.movedim(dim, -1)                                       # (..., m)
    m = rows.shape[-1]
    running_max = torch.full((*rows.shape[:-1], 1), NEG_INF, dtype=x.dtype, device=x.device)
    running_sum = torch.zeros_like(running_max)
    for start in range(0, m, block):
        running_max, running_sum, _, _ = online_softmax_step(
            running_max, running_sum, rows[..., start:start + block])
    shift = torch.where(torch.isfinite(running_max), running_max, torch.zeros_like(running_max))
    total = torch.where(running_sum > 0, running_sum, torch.ones_like(running_sum))
    return (torch.exp(rows - shift) / total).movedim(-1, dim)       # all -inf rows: 0 / 1


def tiled_attention(q: Tensor, k: Tensor, v: Tensor, *,
                    causal: bool = False, mask: Tensor | None = None,
                    block_q: int = DEFAULT_BLOCK,
                    block_k: int = DEFAULT_BLOCK) -> Tensor:
    """Same contract as :func:`llmcore.attention.attention`, one
    (block_q, block_k) tile at a time.

    q: (..., h, n, d_head)   k, v: (..., h_kv, m, d_head)
    -> (..., h, n, d_head)
    causal: query i sees keys j <= i + (m - n) (bottom-right aligned); key
    tiles wholly in a query tile's future are skipped, not computed and
    masked. mask: bool, broadcastable to (..., h, n, m), True where a query
    may attend to a key. Queries that may see no key get zeros.
    block_q, block_k: tile sizes; need not divide n or m. The largest
    intermediate is one (..., h, block_q, block_k) score tile (its weights
    overwrite it); the running output of a query tile is accumulated in
    place in its rows of the output, so it costs no buffer. Follows the
    inputs' device and dtype. Chapter 10.
    """
    group = check_attention_inputs(q, k, v, mask)
    block_q = _check_block("block_q", block_q)
    block_k = _check_block("block_k", block_k)
    n, m, d_head = q.shape[-2], k.shape[-2], q.shape[-1]
    if causal and n > m:
        raise ValueError(f"tiled_attention: causal with n = {n} queries "
                         f"but only m = {m} keys; expected m >= n (each "
                         "query is one of the last n keys)")
    # a view: (..., h, n, m)
    allowed = None if mask is None else mask.expand(*q.shape[:-1], m)
    if group > 1:             # (..., h_kv, g, n, d_head): no copy of K or V
        q = q.unflatten(-3, (k.shape[-3], group))
        k, v = k.unsqueeze(-3), v.unsqueeze(-3)  # (..., h_kv, 1, m, d_head)
        if allowed is not None:                  # (..., h_kv, g, n, m)
            allowed = allowed.unflatten(-3, (k.shape[-4], group))
    scale = math.sqrt(d_head)
    offset = m - n                             # query i is token i + offset
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    for i0 in range(0, n, block_q):
        i1 = min(i0 + block_q, n)
        # (..., tq, d_head): scaled once, not once per key tile
        q_tile = q[..., i0:i1, :] / scale
        running_max = torch.full((*q_tile.shape[:-1], 1), NEG_INF,
                                 dtype=q.dtype, device=q.device)
        running_sum = torch.zeros_like(running_max)           # (..., tq, 1)
        # (..., tq, d_head): accumulated in the output itself
        acc = out[..., i0:i1, :].zero_()
        key_end = min(m, i1 + offset) if causal else m   # last key seen + 1
        for j0 in range(0, key_end, block_k):
            j1 = min(j0 + block_k, m)
            k_tile = k[..., j0:j1, :]
            scores = q_tile @ k_tile.transpose(-2, -1)       # (..., tq, tk)
            if causal and j1 - 1 > i0 + offset:  # tile crosses the diagonal
                rows = torch.arange(i0, i1, device=q.device).unsqueeze(-1)
                cols = torch.arange(j0, j1, device=q.device)
                scores.masked_fill_(cols > rows + offset, NEG_INF)
            if allowed is not None:
                scores.masked_fill_(~allowed[..., i0:i1, j0:j1], NEG_INF)
            # the weights overwrite the scores
            running_max, running_sum, rescale, weights = \
                online_softmax_step(running_max, running_sum, scores,
                                    inplace=True)
            acc.mul_(rescale).add_(weights @ v[..., j0:j1, :])
        # rows that saw no key: 0 / tiny = 0
        acc.div_(running_sum.clamp(min=torch.finfo(q.dtype).tiny))
    return out.flatten(-4, -3) if group > 1 else out
