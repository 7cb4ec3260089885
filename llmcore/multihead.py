"""Multi-head attention: h small attentions side by side, then one output projection.

Per-head weights (d, d_head) laid next to each other form one (d, d) matrix, so one matmul
computes every head's queries; a view cuts them apart again. Keys and values may have fewer heads
than queries (h_kv <= h: multi-query when h_kv = 1, grouped-query in between). Chapter 4.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .attention import attention
from .matmul import linear
from .shapes import check_operands, check_shape


def split_heads(x: Tensor, n_heads: int) -> Tensor:
    """Cut the feature axis into heads and move heads before tokens. A
    view: no data moves.

    x: (..., n, h * d_head) -> (..., h, n, d_head). Chapter 4.
    """
    *lead, n, d = x.shape
    if d % n_heads:
        raise ValueError(f"split_heads: last dimension {d} of x "
                         f"{tuple(x.shape)} is not divisible by "
                         f"n_heads = {n_heads}")
    heads = x.view(*lead, n, n_heads, d // n_heads)    # (..., n, h, d_head)
    return heads.transpose(-3, -2)                     # (..., h, n, d_head)


def merge_heads(x: Tensor) -> Tensor:
    """Undo :func:`split_heads`: heads side by side again along the
    features.

    x: (..., h, n, d_head) -> (..., n, h * d_head). After the transpose
    the memory is no longer row-major, so ``reshape`` copies (``view``
    would raise). Chapter 4.
    """
    *lead, h, n, d_head = x.shape
    return x.transpose(-3, -2).reshape(*lead, n, h * d_head)   # (..., n, d)


def head_sizes(d: int, n_heads: int, n_kv_heads: int | None = None) -> tuple[int, int]:
    """(d_head, h_kv) for d_model d, with clear errors when the heads do not divide evenly."""
    if n_heads <= 0 or d % n_heads:
        raise ValueError(f"n_heads = {n_heads} must be positive and divide d_model = {d}")
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    if n_kv_heads <= 0 or n_heads % n_kv_heads:
        raise ValueError(f"n_kv_heads = {n_kv_heads} must be positive and divide "
                         f"n_heads = {n_heads}")
    return d // n_heads, n_kv_heads


def _kv_heads_from_width(d: int, n_heads: int, d_kv: int) -> tuple[int, int]:
    """(d_head, h_kv) for K/V projections with d_kv columns."""
    d_head, _ = head_sizes(d, n_heads)
    if d_kv % d_head:
        raise ValueError(f"w_k, w_v: expected (d, h_kv * d_head) with d_head = {d_head}, "
                         f"got {d_kv} columns")
    return head_sizes(d, n_heads, d_kv // d_head)


def multihead_attention_loop(x: Tensor, w_q: Tensor, w_k: Tensor,
                             w_v: Tensor, w_o: Tensor, *, n_heads: int,
                             b_q: Tensor | None = None,
                             b_k: Tensor | None = None,
                             b_v: Tensor | None = None,
                             b_o: Tensor | None = None,
                             causal: bool = False) -> Tensor:
    """Multi-head attention as a loop over heads, each with its own slice
    of columns.

    x: (..., n, d)   w_q, w_o: (d, d)   w_k, w_v: (d, h_kv * d_head)
    b_*: their column counts   ->   (..., n, d). Head i uses columns
    [i d_head, (i+1) d_head) of w_q and K/V head i // (h / h_kv). The
    heads' outputs are laid side by side, then projected by w_o. Chapter 4.
    """
    check_operands(x=x, w_q=w_q, w_k=w_k, w_v=w_v, w_o=w_o, b_q=b_q,
                   b_k=b_k, b_v=b_v, b_o=b_o)
    d = check_shape("x", x, ("...", "n", "d"))["d"]
    check_shape("w_q", w_q, ("d", "d"), d=d)
    check_shape("w_o", w_o, ("d", "d"), d=d)
    d_kv = check_shape("w_k", w_k, ("d", "d_kv"), d=d)["d_kv"]
    check_shape("w_v", w_v, ("d", "d_kv"), d=d, d_kv=d_kv)
    d_head, n_kv_heads = _kv_heads_from_width(d, n_heads, d_kv)
    group = n_heads // n_kv_heads

    def columns(w: Tensor, b: Tensor | None, cols: slice):
        return w[:, cols], None if b is None else b[cols]       # one head's

    outputs = []
    for head in range(n_heads):
        cols = slice(head * d_head, (head + 1) * d_head)
        kv_head = head // group
        kv_cols = slice(kv_head * d_head, (kv_head + 1) * d_head)
        q = linear(x, *columns(w_q, b_q, cols))           # (..., n, d_head)
        k = linear(x, *columns(w_k, b_k, kv_cols))        # (..., n, d_head)
        v = linear(x, *columns(w_v, b_v, kv_cols))        # (..., n, d_head)
        outputs.append(attention(q, k, v, causal=causal))
    return linear(torch.cat(outputs, dim=-1), w_o, b_o)        # (..., n, d)


def multihead_attention(x: Tensor, w_q: Tensor, w_k: Tensor, w_v: Tensor,
                        w_o: Tensor, *, n_heads: int,
                        b_q: Tensor | None = None,
                        b_k: Tensor | None = None,
                        b_v: Tensor | None = None,
                        b_o: Tensor | None = None, causal: bool = False,
                        backend: str = "explicit") -> Tensor:
    """Same contract as :func:`multihead_attention_loop`: three matmuls,
    views, one attention.

    x: (..., n, d) -> q (..., h, n, d_head), k and v (..., h_kv, n, d_head)
    -> (..., n, d). Chapter 4.
    """
    check_operands(x=x, w_q=w_q, w_k=w_k, w_v=w_v, w_o=w_o, b_q=b_q,
                   b_k=b_k, b_v=b_v, b_o=b_o)
    d = check_shape("x", x, ("...", "n", "d"))["d"]
    check_shape("w_q", w_q, ("d", "d"), d=d)
    d_kv = check_shape("w_k", w_k, ("d", "d_kv"), d=d)["d_kv"]
    d_head, n_kv_heads = _kv_heads_from_width(d, n_heads, d_kv)
    q = split_heads(linear(x, w_q, b_q), n_heads)      # (..., h, n, d_head)
    # k, v: (..., h_kv, n, d_head)
    k = split_heads(linear(x, w_k, b_k), n_kv_heads)
    v = split_heads(linear(x, w_v, b_v), n_kv_heads)
    out = attention(q, k, v, causal=causal, backend=backend)
    return linear(merge_heads(out), w_o, b_o)                  # (..., n, d)


def fuse_qkv(w_q: Tensor, w_k: Tensor, w_v: Tensor) -> Tensor:
    """Lay the three projections side by side:
    (d, d), (d, d_kv), (d, d_kv) -> (d, d + 2 d_kv).

    Works for weights (2-D) and for biases (1-D) alike. Chapter 4.
    """
    check_operands(w_q=w_q, w_k=w_k, w_v=w_v)
    return torch.cat([w_q, w_k, w_v], dim=-1)


def qkv_projection(x: Tensor, w_qkv: Tensor, b_qkv: Tensor | None, *,
                   n_heads: int, n_kv_heads: int | None = None
                   ) -> tuple[Tensor, Tensor, Tensor]:
    """One matmul for Q, K and V, then a split and views into heads.

    x: (..., n, d)   w_qkv: (d, (h + 2 h_kv) d_head)
    b_qkv: ((h + 2 h_kv) d_head,) or None
    ->   q (..., h, n, d_head), k and v (..., h_kv, n, d_head). Chapter 4.
    """
    check_operands(x=x, w_qkv=w_qkv, b_qkv=b_qkv)
    d = check_shape("x", x, ("...", "n", "d"))["d"]
    d_head, n_kv_heads = head_sizes(d, n_heads, n_kv_heads)
    width = (n_heads + 2 * n_kv_heads) * d_head
    check_shape("w_qkv", w_qkv, ("d", width), d=d)
    qkv = linear(x, w_qkv, b_qkv)                          # (..., n, width)
    d_q, d_kv = n_heads * d_head, n_kv_heads * d_head
    q, k, v = qkv.split([d_q, d_kv, d_kv], dim=-1)
    return (split_heads(q, n_heads),                # (..., h, n, d_head)
            split_heads(k, n_kv_heads),             # (..., h_kv, n, d_head)
            split_heads(v, n_kv_heads))


def multihead_attention_qkv(x: Tensor, w_qkv: Tensor, w_o: Tensor, *, n_heads: int,
                            n_kv_heads: int | None = None, b_qkv: Tensor | None = None,
                            b_o: Tensor | None = None, causal: bool = False,
                            backend: str = "explicit") -> Tensor:
    """:func:`multihead_attention` with one combined projection: same numbers, one matmul.

    x: (..., n, d)   w_qkv: (d, (h + 2 h_kv) d_head)   w_o: (d, d)   ->   (..., n, d). Chapter 4.
    """
    q, k, v = qkv_projection(x, w_qkv, b_qkv, n_heads=n_heads, n_kv_heads=n_kv_heads)
    out = attention(q, k, v, causal=causal, backend=backend)     # (..., h, n, d_head)
    return linear(merge_heads(out), w_o, b_o)                    # (..., n, d)
