"""Looking inside a model: the attention weights of one layer, recomputed from its parameters.

The model never keeps its attention weights (state is explicit in llmcore; nothing is stored on
``self``), and the matrix form of attention never hands them back. To look at them, this module
recomputes them with the same functions the model runs: the earlier blocks, then the layer's own
layer norm, combined QKV projection, scaled scores, causal mask and softmax. Chapter 3 (heatmaps);
Chapter 7 reuses it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .layout import contiguous_layout
from .matmul import linear
from .model import GPT
from .norm import layer_norm
from .multihead import qkv_projection
from .masks import NEG_INF, causal_mask
from .shapes import check_operands, check_shape
from .softmax import softmax


def attention_matrix(q: Tensor, k: Tensor, *,
                     causal: bool = False) -> Tensor:
    """The attention weights A = softmax(q k^T / sqrt(d_head)), masked if
    causal.

    q: (..., h, n, d_head)   k: (..., h_kv, m, d_head)   ->   (..., h, n, m)
    with each row summing to 1. With h_kv < h (grouped-query attention)
    query head i reads K head i // (h / h_kv), as in
    :func:`llmcore.attention.attention`; ``attention_matrix(q, k) @ v``
    (v's heads repeated the same way) is the attention output. causal:
    bottom-right aligned, query i sees keys j <= i + (m - n). Chapter 3.
    """
    check_operands(q=q, k=k)
    sizes = check_shape("q", q, ("...", "n", "d_head"))
    check_shape("k", k, ("...", "m", "d_head"), d_head=sizes["d_head"])
    if q.dim() != k.dim() or q.shape[:-3] != k.shape[:-3]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)}: "
                         "expected the same leading (batch) dimensions")
    if q.dim() >= 3 and q.shape[-3] != k.shape[-3]:
        h, h_kv = q.shape[-3], k.shape[-3]
        if h % h_kv:
            raise ValueError(f"q has h = {h} heads and k has h_kv = "
                             f"{h_kv}: expected h_kv to divide h "
                             "(grouped-query attention)")
        k = k.repeat_interleave(h // h_kv, dim=-3)     # (..., h, m, d_head)
    # (..., h, n, m)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        allowed = causal_mask(q.shape[-2], k.shape[-2], q.device)   # (n, m)
        scores = scores.masked_fill(~allowed, NEG_INF)
    return softmax(scores, dim=-1)                          # (..., h, n, m)


@dataclass(frozen=True)
class HeadTrace:
    """Every intermediate of one attention head over m tokens (Chapter 7's walk-through).

    q, k, v: (m, d_head)   scores: (m, m) scaled, masked entries -inf   weights: (m, m)
    out: (m, d_head) = weights @ v."""

    q: Tensor
    k: Tensor
    v: Tensor
    scores: Tensor
    weights: Tensor
    out: Tensor


def head_trace(x: Tensor, w_q: Tensor, w_k: Tensor, w_v: Tensor, *,
               causal: bool = True) -> HeadTrace:
    """One attention head over the rows of x, keeping every intermediate
    to look at.

    x: (m, d)   w_q, w_k, w_v: (d, d_head)   ->   HeadTrace. The same maths
    as :func:`llmcore.attention.attention`, step by step; causal: query i
    sees keys j <= i. Chapter 7.
    """
    check_operands(x=x, w_q=w_q, w_k=w_k, w_v=w_v)
    sizes = check_shape("x", x, ("m", "d"))
    for name, w in (("w_q", w_q), ("w_k", w_k), ("w_v", w_v)):
        check_shape(name, w, ("d", "d_head"), d=sizes["d"])
    q, k, v = linear(x, w_q), linear(x, w_k), linear(x, w_v)   # (m, d_head)
    m = x.shape[0]
    scores = q @ k.T / math.sqrt(q.shape[-1])                       # (m, m)
    if causal:
        scores = scores.masked_fill(~causal_mask(m, m, x.device), NEG_INF)
    weights = softmax(scores, dim=-1)                          # (m, m)
    out = weights @ v                                          # (m, d_head)
    return HeadTrace(q, k, v, scores, weights, out)


@torch.no_grad()
def attention_weights(model: GPT, tokens: Tensor, layer: int) -> Tensor:
    """What each token attends to, per head, in one layer of ``model`` on
    ``tokens``.

    tokens: (b, n) ids on the model's device   layer: 0 <= layer < L
    -> (b, h, n, n): row i of head j holds the weights query i gives keys
    0..i (zeros above the diagonal; each row sums to 1). The blocks before
    ``layer`` run as in the model; then layer norm, the combined QKV
    projection and :func:`attention_matrix`. No padding, no cache.
    Chapter 3.
    """
    if not isinstance(model, GPT):
        raise TypeError(f"model: expected an llmcore.model.GPT, got "
                        f"{type(model).__name__}")
    n_layers = model.config.n_layers
    if (isinstance(layer, bool) or not isinstance(layer, int)
            or not 0 <= layer < n_layers):
        raise ValueError(f"layer: expected an int in [0, {n_layers}) for "
                         f"this {n_layers}-layer model, got {layer!r}")
    tokens = model.check_tokens(tokens)
    b, n = tokens.shape
    layout = contiguous_layout(b, n, past_slots=0, past_valid=None,
                               attention_mask=None, device=tokens.device)
    x = model.embed(tokens, layout.positions)                    # (b, n, d)
    for block in model.blocks[:layer]:
        x = block(x, layout)                                     # (b, n, d)
    block = model.blocks[layer]
    ln, attention = block.ln_1, block.attention
    x = layer_norm(x, ln.scale, ln.shift, ln.eps)                # (b, n, d)
    # q: (b, h, n, d_head), k: (b, h_kv, n, d_head)
    q, k, _ = qkv_projection(x, attention.w_qkv, attention.b_qkv,
                             n_heads=attention.n_heads,
                             n_kv_heads=attention.n_kv_heads)
    return attention_matrix(q, k, causal=True)                # (b, h, n, n)
