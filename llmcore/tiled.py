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
torch for reading: the GPU kernel's gain comes from keeping tiles in on-chip memory).

The maximum is only a shift: exp(s - c) / sum exp(s - c) is the softmax for every c, and the
maximum is the c that guarantees exp never overflows. So the running maximum need not follow
every tile: a query's first key tile's maximum, kept for all its tiles, is exact for any later
score within exp's range above it (2**128 in float32, base 2), and saves a maximum and a
rescaling per tile. :func:`tiled_attention` runs each query tile that way and checks it
(:func:`shift_held`); a tile that overflowed (or a query that saw nothing in its first tile) is
computed again with the online softmax's rescaling, exact for every input (FlashAttention 4
skips rescales for the same reason). The other choices that keep the plain-torch loop within
reach of PyTorch's fused kernel on a CPU without changing the algorithm: one batched product per
tile for all heads (``bmm``, and ``baddbmm_`` adding into the running output in place), one
score buffer reused for every tile, the causal mask of a diagonal tile added by the product
itself (``baddbmm_`` onto a 0 / -inf tile), query tiles larger than key tiles (fewer Python-level
steps), and scores in base 2 (``exp2``, cheaper than ``exp`` in torch's CPU kernels, gives the
same weights).

Rungs: :func:`online_softmax_loop` (one entry at a time), :func:`online_softmax` (a block of
columns at a time), :func:`online_softmax_step` (the update both use), :func:`tiled_attention`
(:func:`attend_query_tile` over a :class:`TileSource`). Chapter 10.
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
    intermediate is one (..., h, block_q, block_k) score tile (one buffer,
    its weights written over its scores); a query tile's running output is
    one (..., h, block_q, d_head) tensor. Each product is one batched matrix
    product over B = batch x h_kv (the g = h / h_kv query heads that share a
    K/V head are stacked as rows, so K and V are never repeated). Each query
    tile runs :func:`attend_query_tile` with the first tile's maximum kept
    as its shift, and again with the online softmax's rescaling where that
    shift did not hold (:func:`shift_held`). Follows the inputs' device and
    dtype. Chapter 10.
    """
    group = check_attention_inputs(q, k, v, mask)
    block_q = _check_block("block_q", block_q)
    block_k = _check_block("block_k", block_k)
    n, m, d_head = q.shape[-2], k.shape[-2], q.shape[-1]
    if causal and n > m:
        raise ValueError(f"tiled_attention: causal with n = {n} queries "
                         f"but only m = {m} keys; expected m >= n (each "
                         "query is one of the last n keys)")
    tiles = TileSource(q, k, v, causal=causal, mask=mask, group=group,
                       block_q=block_q, block_k=block_k)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    for i0 in range(0, n, block_q):
        i1 = min(i0 + block_q, n)
        acc, total = attend_query_tile(tiles, i0, i1, rescale=False)
        if not shift_held(acc, total):       # rare; exact for every input
            acc, total = attend_query_tile(tiles, i0, i1, rescale=True)
        # rows that saw no key: 0 / tiny = 0
        acc.div_(total.clamp(min=torch.finfo(q.dtype).tiny))
        out[..., i0:i1, :] = acc.view(*q.shape[:-2], i1 - i0, d_head)
    return out


class TileSource:
    """What :func:`attend_query_tile` reads: the inputs cut into tiles, and
    the scores of one tile, in one buffer reused for every tile.

    q: (..., h, n, d_head), k, v: (..., h_kv, m, d_head) as
    :func:`tiled_attention` takes them; ``queries(i0, i1)`` -> (B, g tq,
    d_head) scaled for base 2, ``keys_and_values(j0, j1)`` -> two (B, tk,
    d_head) (views when K and V are contiguous), ``scores(q_tile, i0, i1, j0,
    j1)`` -> (B, g tq, tk), the masked scores in the buffer: a causal tile
    that crosses the diagonal gets its -inf entries from the product itself
    (``baddbmm_`` onto an additive 0 / -inf tile, made once per diagonal
    position), a ``mask`` by ``masked_fill_``. Chapter 10."""

    def __init__(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool,
                 mask: Tensor | None, group: int, block_q: int, block_k: int):
        self.q, self.k, self.v, self.causal, self.group = q, k, v, causal, group
        self.block_k = block_k
        n, m, self.d_head = q.shape[-2], k.shape[-2], q.shape[-1]
        self.offset = m - n                     # query i is token i + offset
        # a view: (..., h, n, m)
        self.allowed = (None if mask is None
                        else mask.expand(*q.shape[:-1], m))
        # scores in base 2 (exp2 for exp), 1 / sqrt(d_head) folded in too
        self.q_scale = math.log2(math.e) / math.sqrt(self.d_head)
        batch = math.prod(k.shape[:-2])                          # B
        tile = group * min(block_q, n) * min(block_k, m)  # the largest tile
        self.buffer = torch.empty(batch, tile, dtype=q.dtype, device=q.device)
        self.diagonal: dict[tuple[int, int, int], Tensor] = {}

    def key_end(self, i1: int) -> int:
        """The last key a query tile ending at i1 may see, plus one."""
        m = self.k.shape[-2]
        return min(m, i1 + self.offset) if self.causal else m

    def queries(self, i0: int, i1: int) -> Tensor:
        """(B, g tq, d_head): scaled once, not once per key tile."""
        q_tile = self.q[..., i0:i1, :] * self.q_scale
        return q_tile.reshape(-1, self.group * (i1 - i0), self.d_head)

    def keys_and_values(self, j0: int, j1: int) -> tuple[Tensor, Tensor]:
        """Two (B, tk, d_head) tiles of K and V."""
        return (self.k[..., j0:j1, :].reshape(-1, j1 - j0, self.d_head),
                self.v[..., j0:j1, :].reshape(-1, j1 - j0, self.d_head))

    def scores(self, q_tile: Tensor, k_tile: Tensor, i0: int, i1: int,
               j0: int, j1: int) -> Tensor:
        """q_tile k_tile^T (B, g tq, tk) in the buffer, masked (-inf)."""
        tq, tk = i1 - i0, j1 - j0
        out = self.buffer[:, :self.group * tq * tk].view(-1, self.group * tq, tk)
        if self.causal and j1 - 1 > i0 + self.offset:   # crosses the diagonal
            scores = out.copy_(self.causal_tile(i0, i1, j0, j1)).baddbmm_(
                q_tile, k_tile.mT)
        else:
            scores = torch.bmm(q_tile, k_tile.mT, out=out)
        if self.allowed is not None:
            seen = self.allowed[..., i0:i1, j0:j1].reshape(scores.shape)
            scores.masked_fill_(~seen, NEG_INF)
        return scores

    def causal_tile(self, i0: int, i1: int, j0: int, j1: int) -> Tensor:
        """(g tq, tk): 0 where query i may see key j (j <= i + offset), -inf
        where not; one per position against the diagonal, made once."""
        key = (i0 + self.offset - j0, i1 - i0, j1 - j0)
        if key not in self.diagonal:
            rows = torch.arange(i0, i1, device=self.q.device).unsqueeze(-1)
            cols = torch.arange(j0, j1, device=self.q.device)
            tile = torch.zeros(i1 - i0, j1 - j0, dtype=self.q.dtype,
                               device=self.q.device)
            tile.masked_fill_(cols > rows + self.offset, NEG_INF)
            self.diagonal[key] = tile.repeat(self.group, 1)
        return self.diagonal[key]


def attend_query_tile(tiles: TileSource, i0: int, i1: int, *,
                      rescale: bool) -> tuple[Tensor, Tensor]:
    """Queries i0..i1 - 1 against every key tile they may see -> acc (B,
    g tq, d_head), the unnormalised output sum_j exp(s_j - shift) v_j, and
    total (B, g tq, 1), sum_j exp(s_j - shift); the output is acc / total.

    Any shift gives the same softmax, exp(s - c) / sum exp(s - c) for every
    c: the maximum is only the shift that keeps exp from overflowing.
    rescale=True is the online softmax (:func:`online_softmax_step`): the
    shift follows the running maximum, and what was summed is rescaled
    whenever it grows; exact for every input. rescale=False keeps each
    query's first key tile's maximum as its shift for all its key tiles:
    no maximum per tile and no rescaling, which stays exact while no later
    score passes it by exp's range (2**128 in float32's base 2; what
    :func:`shift_held` checks). Chapter 10."""
    q_tile = tiles.queries(i0, i1)
    acc = torch.zeros_like(q_tile)            # sum of weights x values
    total = torch.zeros((*q_tile.shape[:-1], 1), dtype=q_tile.dtype,
                        device=q_tile.device)           # (B, g tq, 1)
    running_max = torch.full_like(total, NEG_INF)       # rescale=True
    shift = None                                        # rescale=False
    m = tiles.k.shape[-2]
    for j0 in range(0, tiles.key_end(i1), tiles.block_k):
        j1 = min(j0 + tiles.block_k, m)
        k_tile, v_tile = tiles.keys_and_values(j0, j1)
        scores = tiles.scores(q_tile, k_tile, i0, i1, j0, j1)
        if rescale:                  # the weights overwrite the scores
            running_max, total, factor, weights = online_softmax_step(
                running_max, total, scores, inplace=True, base2=True)
            acc.mul_(factor)         # re-shifted to the new maximum
        else:
            if shift is None:        # no score seen: shift by 0, not -inf
                shift = scores.amax(dim=-1, keepdim=True).nan_to_num_(
                    posinf=0.0, neginf=0.0)
            weights = scores.sub_(shift).exp2_()
            total += weights.sum(dim=-1, keepdim=True)
        acc.baddbmm_(weights, v_tile)          # acc += weights @ v_tile
    return acc, total


def shift_held(acc: Tensor, total: Tensor) -> bool:
    """Whether a query tile of :func:`attend_query_tile` with a fixed shift
    is exact: the outputs' sum finite (no weight overflowed; a sum of
    finite but huge outputs that overflows sends the tile to the exact path
    too, at no cost but time) and every total at least 1 (nan fails), as it
    is for a query whose shift was one of its own scores (that score's
    weight is exp(0) = 1); a query that saw no key in its first tile was
    shifted by 0, and may have lost its weights to underflow. On the meta
    device, or for no queries at all, there is nothing to check: True.
    Chapter 10."""
    if acc.device.type == "meta" or total.numel() == 0:
        return True
    # one sum of acc is finite only if every entry is (inf or nan spreads)
    return bool(torch.isfinite(acc.sum()) & (total.amin() >= 1))
