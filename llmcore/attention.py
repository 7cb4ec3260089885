"""Scaled dot-product attention: per query, score every key, softmax, average the values.

Loop form: for each query row i, scores_j = q_i . k_j / sqrt(d_head) over the keys it may see,
weights = softmax(scores), out_i = sum_j weights_j v_j. Matrix form: the same for all rows at once,
softmax(Q K^T / sqrt(d_head)) V. Chapter 3; grouped K/V heads in Chapter 4.

Both forms take any number of leading (batch, head) dimensions. When K and V have fewer heads than
Q (multi-query and grouped-query attention, h_kv < h), query head i reads K/V head i // (h / h_kv).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .masks import causal_mask, mask_bias
from .shapes import check_operands, check_shape, check_tensor
from .softmax import softmax

BACKENDS = ("explicit", "fused")
"""``explicit``: the matmul-mask-softmax-matmul written out here (every step inspectable).
``fused``: ``torch.nn.functional.scaled_dot_product_attention``, one call that can use a fused
kernel. Chosen by the caller with ``backend=``; nothing probes the environment."""


def check_attention_inputs(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> int:
    """Check the shapes, dtypes and devices of an attention call (errors name the argument, the
    expected and the actual shape); return g, the query heads per K/V head (h / h_kv)."""
    check_operands(q=q, k=k, v=v)
    sizes = check_shape("q", q, ("...", "n", "d_head"))
    sizes = check_shape("k", k, ("...", "m", "d_head"), **sizes)
    check_shape("v", v, ("...", "m", "d_head"), **sizes)
    if k.shape != v.shape:
        raise ValueError(f"k and v: expected the same shape, got k {tuple(k.shape)} and "
                         f"v {tuple(v.shape)}")
    if q.shape[:-3] != k.shape[:-3] or q.dim() != k.dim():
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)}: expected the same leading "
                         "(batch) dimensions")
    group = 1
    if q.dim() >= 3 and q.shape[-3] != k.shape[-3]:
        h, h_kv = q.shape[-3], k.shape[-3]
        if h % h_kv:
            raise ValueError(f"q has h = {h} heads and k, v have h_kv = {h_kv}: expected h_kv to "
                             "divide h (grouped-query attention)")
        group = h // h_kv
    if mask is not None:
        check_tensor("mask", mask)
        if mask.dtype != torch.bool:
            raise TypeError(f"mask: expected a bool tensor (True = may attend), got {mask.dtype}")
        if mask.device != q.device:
            raise ValueError(f"mask is on {mask.device} but q is on {q.device}")
        want = (*q.shape[:-1], k.shape[-2])
        # broadcasts to want: each trailing size is 1 or want's (a plain loop: cheaper than
        # torch.broadcast_shapes, and one-way, so a mask cannot enlarge the output)
        if mask.dim() > len(want) or any(size not in (1, wanted) for size, wanted in
                                         zip(reversed(mask.shape), reversed(want))):
            raise ValueError(f"mask: expected a shape that broadcasts to {want} "
                             f"(..., n, m), got {tuple(mask.shape)}")
    return group


def attention_loop(q: Tensor, k: Tensor, v: Tensor, *,
                   causal: bool = False,
                   mask: Tensor | None = None) -> Tensor:
    """Scaled dot-product attention, one query row at a time. Slow; use
    tiny shapes.

    q: (..., h, n, d_head)   k, v: (..., h_kv, m, d_head)
    -> (..., h, n, d_head)
    causal: query i sees keys j <= i + (m - n) (bottom-right aligned:
    right for a KV cache).
    mask: bool, broadcastable to (..., h, n, m); True where a query may
    attend to a key. A query that may see no key at all gets a zero row.
    Chapter 3.
    """
    group = check_attention_inputs(q, k, v, mask)
    n, m, d_head = q.shape[-2], k.shape[-2], q.shape[-1]
    allowed = torch.ones(n, m, dtype=torch.bool, device=q.device)
    if causal:
        allowed = causal_mask(n, m, q.device)
    if mask is not None:
        allowed = allowed & mask
    allowed = allowed.expand(*q.shape[:-1], m)              # (..., h, n, m)
    out = torch.zeros_like(q)
    for idx in np.ndindex(*q.shape[:-2]):     # every (batch..., head) index
        kv_idx = idx[:-1] + (idx[-1] // group,) if group > 1 else idx
        keys, values = k[kv_idx], v[kv_idx]               # (m, d_head) each
        for i in range(n):                                # each query
            # the keys this query may see
            visible = allowed[idx][i].nonzero().flatten().tolist()
            if not visible:
                continue                       # nothing to attend to: zeros
            scores = torch.stack([q[idx][i] @ keys[j] for j in visible])
            scores = scores / math.sqrt(d_head)
            weights = softmax(scores)                    # (len(visible),)
            for weight, j in zip(weights, visible):      # sum of value rows
                out[idx][i] += weight * values[j]
    return out


def attention_scores(q: Tensor, k: Tensor) -> Tensor:
    """Scaled scores q k^T / sqrt(d_head) of every query against every key.

    q: (..., h, n, d_head)   k: (..., h_kv, m, d_head)   ->   (..., h, n, m)
    With h_kv < h, the g = h / h_kv query heads that share a K head are
    stacked as g n rows of one matmul against it, so K is read once, never
    repeated per query head. Chapter 3 (grouped heads: Chapter 4).
    """
    d_head = q.shape[-1]
    # the same as dividing the scores: n d_head divisions, not n m
    q = q / math.sqrt(d_head)
    if q.dim() < 3 or q.shape[-3] == k.shape[-3]:
        return q @ k.transpose(-2, -1)                         # (..., n, m)
    *lead, h, n, _ = q.shape
    h_kv = k.shape[-3]
    # (..., h_kv, g n, d_head): the g query heads of each K head, stacked
    rows = q.reshape(*lead, h_kv, h // h_kv * n, d_head)
    scores = rows @ k.transpose(-2, -1)                 # (.., h_kv, g n, m)
    return scores.view(*lead, h, n, k.shape[-2])        # (..., h, n, m)


def weighted_values(weights: Tensor, v: Tensor) -> Tensor:
    """Each query's weighted sum of value rows.

    weights: (..., h, n, m)   v: (..., h_kv, m, d_head)   ->   (..., h, n, d_head), grouped heads
    stacked as rows as in :func:`attention_scores`. Chapter 3.
    """
    if weights.dim() < 3 or weights.shape[-3] == v.shape[-3]:
        return weights @ v                                                  # (..., n, d_head)
    *lead, h, n, m = weights.shape
    rows = weights.reshape(*lead, v.shape[-3], h // v.shape[-3] * n, m)     # (..., h_kv, g n, m)
    return (rows @ v).view(*lead, h, n, v.shape[-1])                        # (..., h, n, d_head)


def attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False,
              mask: Tensor | None = None,
              backend: str = "explicit") -> Tensor:
    """Same contract as :func:`attention_loop`, all queries at once.

    q: (..., h, n, d_head)   k, v: (..., h_kv, m, d_head)
    -> (..., h, n, d_head)
    scores = q k^T / sqrt(d_head) is (..., h, n, m); masked scores become
    -inf before the softmax. backend: ``"explicit"`` (default) or
    ``"fused"`` (PyTorch's scaled_dot_product_attention).
    Chapter 3 (grouped K/V: Chapter 4; the fused kernel: Chapter 10).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, "
                         f"got {backend!r}")
    group = check_attention_inputs(q, k, v, mask)
    n, m = q.shape[-2], k.shape[-2]
    if backend == "fused" and causal and mask is None and n == m:
        # the kernel's own causal rule is top-left aligned, which is the
        # same when n == m, and it never builds an (n, m) mask
        return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                              enable_gqa=group > 1)
    # one new query (a decode step) sits after every key: the causal mask
    # would be all True
    allowed = causal_mask(n, m, q.device) if causal and n > 1 else None
    if mask is not None:
        allowed = mask if allowed is None else allowed & mask
    if backend == "fused":
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed,
                                             enable_gqa=group > 1)
        if allowed is not None:
            # rows with no visible key: zeros, as the explicit backend gives
            visible = allowed.any(dim=-1, keepdim=True)
            out = out.masked_fill(~visible, 0.0)
        return out
    scores = attention_scores(q, k)                         # (..., h, n, m)
    if allowed is not None:
        scores += mask_bias(allowed, scores.dtype)     # + M: 0 or -inf
    weights = softmax(scores, dim=-1, inplace=True)    # (..., h, n, m)
    return weighted_values(weights, v)                 # (..., h, n, d_head)
