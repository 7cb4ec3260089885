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
torch for reading: the GPU kernel's gain comes from keeping tiles in on-chip memory). Three choices
keep the plain-torch loop within reach of PyTorch's fused kernel on a CPU without changing the
algorithm: one batched product per tile for all heads (``bmm``, and ``baddbmm_`` adding into the
running output in place), query tiles larger than key tiles (fewer Python-level steps), and
scores in base 2 (``exp2``, cheaper than ``exp`` in torch's CPU kernels, gives the same weights).

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
"""Default block of keys (and of columns for :func:`online_softmax`)."""

DEFAULT_BLOCK_Q = 256
"""Default block of queries. A (256, 128) float32 score tile is 128 KiB a head; on a CPU the
larger tile means fewer, larger matrix products (measured in course/bench/fast.py)."""


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
                        scores: Tensor, *, inplace: bool = False,
                        base2: bool = False
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
    need the scores afterwards). base2: the scores are in base 2 (already
    multiplied by log2(e)), so exp2 stands for exp: the same weights, as
    exp2(x log2(e)) = exp(x), and torch's exp2 is cheaper. Chapter 10.
    """
    block_max = scores.amax(dim=-1, keepdim=True)
    new_max = torch.maximum(running_max, block_max)               # (..., 1)
    # a row with no score yet (max -inf) is shifted by 0, not by -inf
    shift = new_max.nan_to_num(posinf=0.0, neginf=0.0)
    exp = torch.exp2 if base2 else torch.exp
    # 0 while nothing was seen: exp(-inf - 0)
    rescale = exp(running_max - shift)
    # masked scores -> 0
    weights = (exp(scores.sub_(shift), out=scores) if inplace
               else exp(scores - shift))
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
                    block_q: int = DEFAULT_BLOCK_Q,
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
    overwrite it); a query tile's running output is one (..., h, block_q,
    d_head) tensor. Each product is one batched matrix product over B =
    batch x h_kv (the g = h / h_kv query heads that share a K/V head are
    stacked as rows, so K and V are never repeated). Follows the inputs'
    device and dtype. Chapter 10.
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
    # scores in base 2 (exp2 for exp), 1 / sqrt(d_head) folded in too
    q_scale = math.log2(math.e) / math.sqrt(d_head)
    offset = m - n                             # query i is token i + offset
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    for i0 in range(0, n, block_q):
        i1 = min(i0 + block_q, n)
        tq = i1 - i0
        # (B, g tq, d_head): scaled once, not once per key tile
        q_tile = q[..., i0:i1, :] * q_scale
        q_tile = q_tile.reshape(-1, group * tq, d_head)
        acc = torch.zeros_like(q_tile)            # sum of weights x values
        running_max = torch.full((*q_tile.shape[:-1], 1), NEG_INF,
                                 dtype=q.dtype, device=q.device)
        running_sum = torch.zeros_like(running_max)      # (B, g tq, 1)
        key_end = min(m, i1 + offset) if causal else m   # last key seen + 1
        for j0 in range(0, key_end, block_k):
            j1 = min(j0 + block_k, m)
            # (B, tk, d_head): views when K and V are contiguous
            k_tile = k[..., j0:j1, :].reshape(-1, j1 - j0, d_head)
            v_tile = v[..., j0:j1, :].reshape(-1, j1 - j0, d_head)
            scores = torch.bmm(q_tile, k_tile.mT)         # (B, g tq, tk)
            if causal and j1 - 1 > i0 + offset:  # tile crosses the diagonal
                rows = torch.arange(i0, i1, device=q.device).unsqueeze(-1)
                cols = torch.arange(j0, j1, device=q.device)
                scores.unflatten(1, (group, tq)).masked_fill_(
                    cols > rows + offset, NEG_INF)
            if allowed is not None:
                seen = allowed[..., i0:i1, j0:j1].reshape(scores.shape)
                scores.masked_fill_(~seen, NEG_INF)
            # the weights overwrite the scores
            running_max, running_sum, rescale, weights = \
                online_softmax_step(running_max, running_sum, scores,
                                    inplace=True, base2=True)
            # acc = acc * rescale + weights @ v_tile, in place
            acc.mul_(rescale).baddbmm_(weights, v_tile)
            del scores, weights    # free it before the next tile is made
        # rows that saw no key: 0 / tiny = 0
        acc.div_(running_sum.clamp(min=torch.finfo(q.dtype).tiny))
        out[..., i0:i1, :] = acc.view(*q.shape[:-2], tq, d_head)
    return out
