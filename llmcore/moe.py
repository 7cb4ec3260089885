"""Mixture of experts: E SwiGLU FFNs per layer, each token sent through k of them.

A router, one (d, E) matrix, scores every expert for every token; each token keeps the k best
of softmax(x w_router), renormalised to sum to 1 (Mixtral's rule), and its output is the
weighted sum of those k experts' SwiGLU outputs::

    probs   = softmax(x w_router)                  (T, E): T tokens, E experts
    weights, experts = top_k(probs)                (T, k) each; weights /= weights.sum(-1)
    y_t     = sum_j weights[t, j] swiglu_{experts[t, j]}(x_t)

The loop form (:func:`moe_loop`) does exactly that, token by token. The grouped form
(:func:`moe`) turns the per-token choice of weights into data movement: sort the T k
(token, choice) pairs by expert, gather each expert's tokens into one matrix, run one SwiGLU
product per expert, and scatter-add the weighted rows back. :func:`moe_dense` runs every
expert on every token and zeroes the unchosen ones (E / k times the work), and
:func:`moe_capacity` pads each expert's group to a fixed capacity C, so every shape is known
in advance: one batched product (E, C, d) x (E, d, f), at the price of dropping the pairs that
overflow an expert. Expert weights are stacked (E, d, f) in the book's (in, out) convention;
transformers stores (E, 2f, d) and (E, d, f) as (out, in), so :func:`from_hf_moe` transposes.

:func:`load_balancing_loss` is the Switch Transformer auxiliary loss in the form transformers
computes it for Mixtral; :func:`moe_parameters` counts a published MoE model from its
configuration (:data:`PUBLISHED_MOE`). Chapter 16.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from .ffn import silu, swiglu
from .shapes import check_operands, check_shape
from .softmax import softmax


class Routing(NamedTuple):
    """What the router decided for T tokens: weights (T, k), each row
    summing to 1 when renormalised; experts (T, k) int64, each row's
    experts, most probable first; probs (T, E), the whole softmax (the
    load-balancing loss needs it)."""

    weights: Tensor
    experts: Tensor
    probs: Tensor


class Dispatch(NamedTuple):
    """The (token, choice) pairs grouped by expert. tokens, slots: (a,)
    int64, the token and which of its k choices each kept pair is, expert
    0's pairs first, each group in token order; counts: (E,) int64, the
    pairs kept per expert (they sum to a); dropped: (T, k) bool, the pairs
    an expert at capacity refused (all False without a capacity)."""

    tokens: Tensor
    slots: Tensor
    counts: Tensor
    dropped: Tensor


def _check_moe(x: Tensor, w_router: Tensor, w_gate: Tensor, w_up: Tensor,
               w_down: Tensor, top_k: int) -> dict[str, int]:
    check_operands(x=x, w_router=w_router, w_gate=w_gate, w_up=w_up,
                   w_down=w_down)
    sizes = check_shape("w_router", w_router, ("d", "E"))
    sizes = check_shape("w_gate", w_gate, ("E", "d", "f"), **sizes)
    check_shape("w_up", w_up, ("E", "d", "f"), **sizes)
    check_shape("w_down", w_down, ("E", "f", "d"), **sizes)
    check_shape("x", x, ("...", "d"), d=sizes["d"])
    _check_top_k(top_k, sizes["E"])
    return sizes


def _check_top_k(top_k: int, n_experts: int) -> None:
    if (isinstance(top_k, bool) or not isinstance(top_k, int)
            or not 1 <= top_k <= n_experts):
        raise ValueError(f"top_k: expected an int from 1 to the {n_experts} "
                         f"experts, got {top_k!r}")


def _check_capacity(capacity: int | None) -> None:
    if capacity is not None and (isinstance(capacity, bool)
                                 or not isinstance(capacity, int)
                                 or capacity < 0):
        raise ValueError(f"capacity: expected None or an int >= 0, got "
                         f"{capacity!r}")


def _stacked_swiglu(x: Tensor, w_gate: Tensor, w_up: Tensor,
                    w_down: Tensor) -> Tensor:
    """Every expert at once: x (E, c, d), or (c, d) shared by all;
    w_gate, w_up (E, d, f); w_down (E, f, d)   ->   (E, c, d): one
    batched product per matrix."""
    return (silu(x @ w_gate) * (x @ w_up)) @ w_down


def route(x: Tensor, w_router: Tensor, top_k: int, *,
          normalize: bool = True) -> Routing:
    """Every token's k experts and their weights, all tokens at once.

    x: (..., d)   w_router: (d, E)   ->   Routing of the T = x.numel() / d
    tokens: weights, experts (T, k), probs (T, E). normalize: divide the
    k kept probabilities by their sum (Mixtral; Qwen3-MoE's
    ``norm_topk_prob``); False keeps them as they are. Chapter 16.
    """
    check_operands(x=x, w_router=w_router)
    sizes = check_shape("w_router", w_router, ("d", "E"))
    check_shape("x", x, ("...", "d"), **sizes)
    _check_top_k(top_k, sizes["E"])
    logits = x.reshape(-1, sizes["d"]) @ w_router              # (T, E)
    probs = softmax(logits, dim=-1)
    weights, experts = torch.topk(probs, top_k, dim=-1)        # (T, k)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return Routing(weights, experts, probs)


def group_by_expert(experts: Tensor, n_experts: int,
                    capacity: int | None = None) -> Dispatch:
    """Sort the T k (token, choice) pairs by expert, in token order
    inside each group.

    experts: (T, k) int64, as :func:`route` returns them -> Dispatch.
    capacity: at most this many pairs per expert, the first in token
    order (first come, first served, as in the Switch Transformer); the
    others are dropped. Chapter 16.
    """
    if experts.dim() != 2 or experts.dtype != torch.int64:
        raise ValueError(f"experts: expected a (T, k) int64 tensor, got "
                         f"{tuple(experts.shape)} {experts.dtype}")
    _check_capacity(capacity)
    n_tokens, top_k = experts.shape
    flat = experts.reshape(-1)                 # (T k,): pair a = t k + j
    order = torch.argsort(flat, stable=True)   # by expert, token order
    counts = torch.zeros(n_experts, dtype=torch.int64,
                         device=flat.device)
    counts.index_add_(0, flat, torch.ones_like(flat))          # (E,)
    keep = torch.ones_like(order, dtype=torch.bool)
    if capacity is not None:
        starts = torch.cumsum(counts, 0) - counts   # each group's start
        sorted_at = torch.arange(flat.numel(), device=flat.device)
        keep = sorted_at - starts[flat[order]] < capacity
        counts = counts.clamp(max=capacity)
    dropped = torch.zeros_like(flat, dtype=torch.bool)
    dropped[order] = ~keep
    kept = order[keep]
    return Dispatch(kept // top_k, kept % top_k, counts,
                    dropped.reshape(n_tokens, top_k))


def moe_loop(x: Tensor, w_router: Tensor, w_gate: Tensor, w_up: Tensor,
             w_down: Tensor, *, top_k: int, normalize: bool = True,
             capacity: int | None = None) -> Tensor:
    """The mixture one token at a time: route the token, then add up its
    experts' outputs.

    x: (..., d)   w_router: (d, E)   w_gate, w_up: (E, d, f)
    w_down: (E, f, d)   ->   (..., d). capacity: an expert that has
    taken ``capacity`` pairs (of earlier tokens) skips the others. Slow;
    use tiny shapes. Chapter 16.
    """
    sizes = _check_moe(x, w_router, w_gate, w_up, w_down, top_k)
    _check_capacity(capacity)
    rows = x.reshape(-1, sizes["d"])                           # (T, d)
    out = torch.zeros_like(rows)
    taken = [0] * sizes["E"]
    for t in range(rows.shape[0]):                       # every token
        probs = softmax(rows[t] @ w_router, dim=-1)            # (E,)
        weights, experts = torch.topk(probs, top_k)            # (k,)
        if normalize:
            weights = weights / weights.sum()
        for weight, e in zip(weights, experts.tolist()):   # k experts
            if capacity is not None and taken[e] >= capacity:
                continue                                   # dropped
            taken[e] += 1
            y = swiglu(rows[t:t + 1], w_gate[e], w_up[e], w_down[e])
            out[t] += weight * y[0]                            # (d,)
    return out.reshape(x.shape)


def moe(x: Tensor, w_router: Tensor, w_gate: Tensor, w_up: Tensor,
        w_down: Tensor, *, top_k: int, normalize: bool = True) -> Tensor:
    """Same contract as :func:`moe_loop` (nothing dropped): sort the
    pairs by expert, gather, one SwiGLU product per expert, weighted
    scatter-add.

    x: (..., d) -> (c_e, d) per expert -> (..., d). The loop runs over
    the E experts, never over tokens. The group sizes c_e depend on the
    routing, so the meta device, which computes no values, is refused
    (:func:`moe_capacity` has fixed shapes). Chapter 16.
    """
    sizes = _check_moe(x, w_router, w_gate, w_up, w_down, top_k)
    if x.device.type == "meta":
        raise ValueError("moe: the groups' sizes depend on the routing, "
                         "which the meta device does not compute; use "
                         "moe_capacity (fixed shapes) or moe_dense")
    rows = x.reshape(-1, sizes["d"])                           # (T, d)
    routing = route(rows, w_router, top_k, normalize=normalize)
    plan = group_by_expert(routing.experts, sizes["E"])
    gathered = rows[plan.tokens]                             # (T k, d)
    scale = routing.weights[plan.tokens, plan.slots]           # (T k,)
    out = torch.zeros_like(rows)
    start = 0
    for e, count in enumerate(plan.counts.tolist()):    # every expert
        end = start + count
        y = swiglu(gathered[start:end], w_gate[e], w_up[e],
                   w_down[e])                                # (c_e, d)
        out.index_add_(0, plan.tokens[start:end],
                       scale[start:end, None] * y)       # scatter-add
        start = end
    return out.reshape(x.shape)


def moe_dense(x: Tensor, w_router: Tensor, w_gate: Tensor, w_up: Tensor,
              w_down: Tensor, *, top_k: int,
              normalize: bool = True) -> Tensor:
    """Same contract as :func:`moe`, computed densely: every expert on
    every token, then a (T, E) gate matrix, zero but at each token's k
    experts, mixes the E outputs.

    x: (..., d) -> (E, T, d) -> (..., d). E / k times the expert FLOPs
    of :func:`moe`, and fixed shapes. Chapter 16.
    """
    sizes = _check_moe(x, w_router, w_gate, w_up, w_down, top_k)
    rows = x.reshape(-1, sizes["d"])                           # (T, d)
    routing = route(rows, w_router, top_k, normalize=normalize)
    gates = torch.zeros_like(routing.probs).scatter(
        1, routing.experts, routing.weights)                   # (T, E)
    y = _stacked_swiglu(rows, w_gate, w_up, w_down)         # (E, T, d)
    out = torch.einsum("te,etd->td", gates, y)                 # (T, d)
    return out.reshape(x.shape)


def moe_capacity(x: Tensor, w_router: Tensor, w_gate: Tensor,
                 w_up: Tensor, w_down: Tensor, *, top_k: int,
                 capacity: int, normalize: bool = True) -> Tensor:
    """Same contract as :func:`moe_loop` with a capacity C: each expert's
    group padded to C rows, one batched SwiGLU for all experts, the
    overflow dropped.

    x: (..., d) -> buffer (E, C, d) -> (E, C, d) -> (..., d). Every shape
    is fixed by E, C and d, whatever the routing (what a compiler for an
    accelerator wants). A dropped pair adds nothing: the residual
    connection still carries its token. Chapter 16.
    """
    sizes = _check_moe(x, w_router, w_gate, w_up, w_down, top_k)
    _check_capacity(capacity)
    if capacity is None:
        raise ValueError("capacity: moe_capacity needs an int (moe is "
                         "the form without one)")
    n_experts, d = sizes["E"], sizes["d"]
    rows = x.reshape(-1, d)                                    # (T, d)
    routing = route(rows, w_router, top_k, normalize=normalize)
    flat = routing.experts.reshape(-1)                         # (T k,)
    hits = torch.nn.functional.one_hot(flat, n_experts)     # (T k, E)
    rank = ((torch.cumsum(hits, 0) - 1) * hits).sum(-1)  # in its group
    keep = rank < capacity                                     # (T k,)
    # row e C + rank of the buffer; every dropped pair goes to one spare
    # row at the end, which is never computed
    spare = n_experts * capacity
    slot = torch.where(keep, flat * capacity + rank, spare)    # (T k,)
    tokens = torch.arange(rows.shape[0], device=x.device)
    tokens = tokens.repeat_interleave(top_k)                   # (T k,)
    buffer = rows.new_zeros(spare + 1, d).index_copy(
        0, slot, rows[tokens])                            # (E C + 1, d)
    y = _stacked_swiglu(buffer[:-1].reshape(n_experts, capacity, d),
                        w_gate, w_up, w_down)               # (E, C, d)
    y = torch.cat([y.reshape(spare, d), rows.new_zeros(1, d)])
    scale = routing.weights.reshape(-1) * keep                 # (T k,)
    out = torch.zeros_like(rows).index_add_(0, tokens,
                                            scale[:, None] * y[slot])
    return out.reshape(x.shape)


def expert_capacity(n_tokens: int, n_experts: int, top_k: int,
                    factor: float = 1.0) -> int:
    """C = ceil(factor T k / E): the rows each expert's group is padded
    to. At factor 1, C is the average load exactly, so a router that is
    not perfectly balanced drops pairs. Chapter 16."""
    if not factor > 0:
        raise ValueError(f"factor: expected a positive number, got "
                         f"{factor}")
    return math.ceil(factor * n_tokens * top_k / n_experts)


def load_balancing_loss(routing: Routing) -> Tensor:
    """The Switch Transformer auxiliary loss E sum_i f_i P_i, as
    transformers computes it for Mixtral (``load_balancing_loss_func``
    on one layer, no padding mask).

    f_i: the top-k choices that went to expert i, per token (the f_i sum
    to k); P_i: expert i's router probability averaged over the tokens.
    A balanced router scores k; one that sends every token to the same k
    experts scores up to E. Only P carries a gradient (f counts).
    routing: of T tokens -> a scalar. Chapter 16.
    """
    n_tokens, n_experts = routing.probs.shape
    flat = routing.experts.reshape(-1)                         # (T k,)
    ones = torch.ones_like(flat, dtype=routing.probs.dtype)
    counts = torch.zeros_like(routing.probs[0]).index_add_(0, flat, ones)
    share = counts / n_tokens                                 # f: (E,)
    mean_prob = routing.probs.mean(dim=0)                     # P: (E,)
    return n_experts * torch.sum(share * mean_prob)


class MoECosts(NamedTuple):
    """Per token: FLOPs of the matrix products, and bytes of weights
    read (each expert's matrices once per group, or once per token)."""

    flops: float
    weight_bytes: float


def moe_costs(experts: Tensor, d: int, f: int, n_experts: int, form: str,
              *, bytes_per_value: int = 4) -> MoECosts:
    """What one token costs each form, for the routing ``experts`` (T, k)
    of T tokens.

    form: "loop" (each token reads its k experts' weights itself),
    "grouped" (each expert chosen at least once is read once for all its
    tokens) or "dense" (all E experts run on every token, each read
    once). FLOPs: 2 d E for the router, 6 d f per expert run (three
    (d, f) products). Chapter 16.
    """
    n_tokens, top_k = experts.shape
    router, expert = d * n_experts, 3 * d * f              # weights
    used = int(torch.unique(experts).numel())
    runs = {"loop": top_k, "grouped": top_k, "dense": n_experts}
    reads = {"loop": n_tokens * (router + top_k * expert),
             "grouped": router + used * expert,
             "dense": router + n_experts * expert}
    if form not in runs:
        raise ValueError(f"form: expected one of {sorted(runs)}, got "
                         f"{form!r}")
    flops = 2 * router + 2 * expert * runs[form]
    return MoECosts(flops, bytes_per_value * reads[form] / n_tokens)


def from_hf_moe(block) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(w_router (d, E), w_gate (E, d, f), w_up (E, d, f), w_down (E, f, d)) from a transformers
    sparse MoE block (Mixtral's or Qwen3-MoE's, duck-typed): ``gate.weight`` (E, d) and
    ``experts.gate_up_proj`` (E, 2f, d), gate rows first, ``experts.down_proj`` (E, d, f), all
    (out, in), transposed to the book's (in, out). Chapter 16."""
    gate_up = block.experts.gate_up_proj.detach()                        # (E, 2f, d)
    f = gate_up.shape[1] // 2
    return (block.gate.weight.detach().T.contiguous(),
            gate_up[:, :f].transpose(1, 2).contiguous(),
            gate_up[:, f:].transpose(1, 2).contiguous(),
            block.experts.down_proj.detach().transpose(1, 2).contiguous())


@dataclass(frozen=True)
class MoEModel:
    """The sizes of a published MoE decoder, as its released ``config.json`` gives them.

    Attention is grouped-query (h, h_kv, d_head; ``qk_norm``: Qwen3's per-head RMSNorm on q and
    k) or, with ``mla`` (q_lora_rank, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_head_dim),
    DeepSeek's multi-head latent attention. The first ``dense_layers`` layers have a plain
    SwiGLU of width ``d_ff_dense``; the others E routed experts of width ``d_ff_expert``, k per
    token, and ``n_shared`` shared experts every token uses. ``router_bias``: DeepSeek-V3's
    per-expert correction (E numbers)."""

    source: str
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    n_experts: int
    top_k: int
    d_ff_expert: int
    n_shared: int = 0
    dense_layers: int = 0
    d_ff_dense: int = 0
    qk_norm: bool = False
    router_bias: bool = False
    mla: tuple[int, int, int, int, int] | None = None
    published_total: float = 0.0
    published_active: float = 0.0


PUBLISHED_MOE = {
    "Mixtral 8x7B": MoEModel(
        "mistralai/Mixtral-8x7B-v0.1 config.json; 46.7B / 12.9B: Mistral AI's announcement",
        32000, 4096, 32, 32, 8, 128, 8, 2, 14336,
        published_total=46.7e9, published_active=12.9e9),
    "Qwen3-30B-A3B": MoEModel(
        "Qwen/Qwen3-30B-A3B config.json; 30.5B / 3.3B: its model card",
        151936, 2048, 48, 32, 4, 128, 128, 8, 768, qk_norm=True,
        published_total=30.5e9, published_active=3.3e9),
    "DeepSeek-V3": MoEModel(
        "deepseek-ai/DeepSeek-V3 config.json; 671B / 37B: arXiv:2412.19437",
        129280, 7168, 61, 128, 128, 128, 256, 8, 2048, n_shared=1, dense_layers=3,
        d_ff_dense=18432, router_bias=True, mla=(1536, 512, 128, 64, 128),
        published_total=671e9, published_active=37e9),
}
"""Published MoE models with their sources; the counts ``published_*`` are the makers' own,
for comparison with :func:`moe_parameters` (DeepSeek-V3's 671B leave out its 14B multi-token
prediction module, as this count does)."""


def moe_parameters(m: MoEModel) -> dict[str, int]:
    """Parameters of a published MoE model: {"total", "active" (per token: every weight but
    the E - k routed experts it skips), "experts" (all routed experts), "per expert"}.
    Embedding and head (untied) both count, norms too. Chapter 16."""
    d, h = m.d_model, m.n_heads
    if m.mla is None:
        attention = 2 * d * h * m.d_head + 2 * d * m.n_kv_heads * m.d_head
        attention += 2 * m.d_head if m.qk_norm else 0
    else:
        q_rank, kv_rank, nope, rope, v_dim = m.mla
        attention = (d * q_rank + q_rank + q_rank * h * (nope + rope)       # q down, norm, up
                     + d * (kv_rank + rope) + kv_rank                       # kv down, norm
                     + kv_rank * h * (nope + v_dim) + h * v_dim * d)        # kv up, output
    expert = 3 * d * m.d_ff_expert
    moe_layers = m.n_layers - m.dense_layers
    shared = (d * m.n_experts + (m.n_experts if m.router_bias else 0)
              + m.n_shared * expert) * moe_layers
    common = (2 * m.vocab_size * d + d + m.n_layers * (attention + 2 * d)
              + m.dense_layers * 3 * d * m.d_ff_dense + shared)
    routed = moe_layers * m.n_experts * expert
    return {"total": common + routed, "active": common + moe_layers * m.top_k * expert,
            "experts": routed, "per expert": expert}
