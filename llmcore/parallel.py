"""Tensor parallelism: one attention layer split by heads across processes, summed by all-reduce.

Heads are independent until the output projection, and the output projection splits along its
rows to match: with the heads' outputs laid side by side, out = [o_0 | o_1] (n, d),

    out @ w_o = o_0 @ w_o[rows of rank 0] + o_1 @ w_o[rows of rank 1]

So with ``world_size`` processes, rank r holds the columns of w_q, w_k, w_v for its own heads
(h / world_size query heads and h_kv / world_size K/V heads) and the matching row block of w_o.
Every rank receives the whole input x, computes its heads' attention and a partial output
(n, d), and one all-reduce (a sum over ranks) gives each rank the full output; the bias b_o is
added once, after the sum. No rank ever holds another rank's heads or their (n, m) scores.
Megatron-LM splits attention this way; here the processes are CPU processes talking through
``torch.distributed``'s gloo backend over localhost. Chapter 10.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Mapping

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor

from .attention import attention
from .matmul import linear
from .multihead import head_sizes
from .multihead import merge_heads, split_heads
from .shapes import check_operands, check_shape

PROCESS_GROUP_TIMEOUT = timedelta(seconds=60)
"""How long a rank waits for the others (to join, or in a collective) before giving up."""


@dataclass(frozen=True)
class AttentionShard:
    """The part of a causal self-attention layer that one rank holds.

    w_qkv: (d, (h_r + 2 h_kv_r) d_head), its heads' Q, K and V columns side by side;
    b_qkv: ((h_r + 2 h_kv_r) d_head,) or None; w_o: (h_r d_head, d), the matching rows of w_o;
    n_heads = h_r = h / world_size and n_kv_heads = h_kv_r = h_kv / world_size. Chapter 10.
    """

    w_qkv: Tensor
    b_qkv: Tensor | None
    w_o: Tensor
    n_heads: int
    n_kv_heads: int

    @property
    def d_head(self) -> int:
        return self.w_o.shape[0] // self.n_heads


def _check_world_size(world_size: object, n_heads: int, n_kv_heads: int) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size: expected a positive int, got {type(world_size).__name__}")
    if world_size <= 0:
        raise ValueError(f"world_size: expected a positive int, got {world_size}")
    if n_kv_heads % world_size:
        raise ValueError(f"world_size = {world_size} must divide n_kv_heads = {n_kv_heads} "
                         f"(and n_heads = {n_heads}): each rank takes whole heads")
    return world_size


def shard_attention_weights(w_qkv: Tensor, b_qkv: Tensor | None,
                            w_o: Tensor, *, n_heads: int,
                            n_kv_heads: int | None = None,
                            world_size: int = 2) -> list[AttentionShard]:
    """Cut a layer's weights by heads into ``world_size`` shards; pure, no
    processes.

    w_qkv: (d, (h + 2 h_kv) d_head)   b_qkv: ((h + 2 h_kv) d_head,) or None
    w_o: (d, d)   ->   world_size shards; rank r gets query heads
    [r h_r, (r+1) h_r) and K/V heads [r h_kv_r, (r+1) h_kv_r), which are
    exactly the K/V heads its query heads read under grouped-query
    attention. w_o's row blocks are views; the w_qkv columns are copied.
    Chapter 10.
    """
    check_operands(w_qkv=w_qkv, b_qkv=b_qkv, w_o=w_o)
    d = check_shape("w_o", w_o, ("d", "d"))["d"]
    d_head, n_kv_heads = head_sizes(d, n_heads, n_kv_heads)
    width = (n_heads + 2 * n_kv_heads) * d_head
    check_shape("w_qkv", w_qkv, ("d", width), d=d)
    if b_qkv is not None:
        check_shape("b_qkv", b_qkv, (width,))
    world_size = _check_world_size(world_size, n_heads, n_kv_heads)
    h_r, h_kv_r = n_heads // world_size, n_kv_heads // world_size
    q_width, kv_width = h_r * d_head, h_kv_r * d_head     # one rank's share
    k_start, v_start = n_heads * d_head, (n_heads + n_kv_heads) * d_head

    def own(t: Tensor, rank: int) -> Tensor:        # rank's Q, K, V columns
        q0, kv0 = rank * q_width, rank * kv_width
        return torch.cat([t[..., q0:q0 + q_width],
                          t[..., k_start + kv0:k_start + kv0 + kv_width],
                          t[..., v_start + kv0:v_start + kv0 + kv_width]],
                         dim=-1)

    shards = []
    for rank in range(world_size):
        rows = slice(rank * q_width, (rank + 1) * q_width)
        shards.append(AttentionShard(
            w_qkv=own(w_qkv, rank),           # (d, (h_r + 2 h_kv_r) d_head)
            b_qkv=None if b_qkv is None else own(b_qkv, rank),
            w_o=w_o[rows],                           # (h_r d_head, d): rows
            n_heads=h_r, n_kv_heads=h_kv_r))
    return shards


def unshard_attention_weights(shards: list[AttentionShard]) -> tuple[Tensor, Tensor | None, Tensor]:
    """Put the shards back together: the inverse of :func:`shard_attention_weights`.

    world_size shards -> w_qkv (d, (h + 2 h_kv) d_head), b_qkv or None, w_o (d, d). Chapter 10.
    """
    if not shards:
        raise ValueError("shards: expected at least one AttentionShard, got none")
    d_head = shards[0].d_head

    def parts(t: Tensor, shard: AttentionShard) -> list[Tensor]:     # its Q, K, V columns
        widths = [shard.n_heads * d_head, shard.n_kv_heads * d_head, shard.n_kv_heads * d_head]
        return list(t.split(widths, dim=-1))

    def join(tensors: list[Tensor]) -> Tensor:                         # all Q, then all K, all V
        pieces = [parts(t, s) for t, s in zip(tensors, shards)]
        return torch.cat([p[i] for i in range(3) for p in pieces], dim=-1)

    w_qkv = join([s.w_qkv for s in shards])
    b_qkv = None if shards[0].b_qkv is None else join([s.b_qkv for s in shards])
    w_o = torch.cat([s.w_o for s in shards], dim=0)                   # rows in rank order
    return w_qkv, b_qkv, w_o


def attention_shard_forward(x: Tensor, shard: AttentionShard, *,
                            causal: bool = True) -> Tensor:
    """One rank's part of the layer: its heads' attention, projected by
    its rows of w_o.

    x: (..., n, d) -> partial output (..., n, d), without b_o. Summed over
    all ranks and plus b_o this is the whole layer's output. Chapter 10.
    """
    check_operands(x=x, w_qkv=shard.w_qkv, b_qkv=shard.b_qkv, w_o=shard.w_o)
    d = check_shape("w_o", shard.w_o, ("d_r", "d"))["d"]
    check_shape("x", x, ("...", "n", "d"), d=d)
    d_head, h_r, h_kv_r = shard.d_head, shard.n_heads, shard.n_kv_heads
    # (..., n, (h_r + 2 h_kv_r) d_head)
    qkv = linear(x, shard.w_qkv, shard.b_qkv)
    q, k, v = qkv.split([h_r * d_head, h_kv_r * d_head, h_kv_r * d_head],
                        dim=-1)
    out = attention(split_heads(q, h_r),          # (..., h_r, n, d_head)
                    split_heads(k, h_kv_r),       # (..., h_kv_r, n, d_head)
                    split_heads(v, h_kv_r),
                    causal=causal)                # -> (..., h_r, n, d_head)
    return linear(merge_heads(out), shard.w_o)    # (..., n, d)


def _layer_weights(layer_or_weights: object) -> dict[str, Tensor | None]:
    """w_qkv, b_qkv, w_o, b_o from an llmcore.model.Attention (or any object with those
    attributes) or from a mapping with those keys."""
    names = ("w_qkv", "b_qkv", "w_o", "b_o")
    if isinstance(layer_or_weights, Mapping):
        missing = [n for n in ("w_qkv", "w_o") if n not in layer_or_weights]
        if missing:
            raise ValueError(f"layer_or_weights: the mapping lacks {missing}; "
                             f"expected keys {names}")
        return {n: layer_or_weights.get(n) for n in names}
    if all(hasattr(layer_or_weights, n) for n in names):
        return {n: getattr(layer_or_weights, n) for n in names}
    raise TypeError(f"layer_or_weights: expected an llmcore.model.Attention or a mapping with keys "
                    f"{names}, got {type(layer_or_weights).__name__}")


def _free_port() -> int:
    """A TCP port on localhost that nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world_size: int, port: int, x: Tensor,
               shards: list[AttentionShard], b_o: Tensor | None,
               causal: bool, result: Tensor) -> None:
    """What each spawned process runs: join the group, compute,
    all-reduce, rank 0 reports."""
    torch.set_num_threads(1)        # world_size processes share the machine
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world_size,
                            timeout=PROCESS_GROUP_TIMEOUT)
    try:
        # (..., n, d)
        partial = attention_shard_forward(x, shards[rank], causal=causal)
        dist.all_reduce(partial, op=dist.ReduceOp.SUM)    # now the full sum
        out = partial if b_o is None else partial + b_o   # bias added once
        if rank == 0:
            result.copy_(out)            # shared memory: the parent sees it
    finally:
        dist.destroy_process_group()


def tensor_parallel_attention(x: Tensor, layer_or_weights: object, *, n_heads: int | None = None,
                              n_kv_heads: int | None = None, world_size: int = 2,
                              causal: bool = True) -> Tensor:
    """Run a causal self-attention layer split by heads over ``world_size`` CPU processes.

    x: (..., n, d) -> (..., n, d), equal to the single-process layer (llmcore.model.Attention
    without a cache, or llmcore.multihead.multihead_attention_qkv). layer_or_weights: an
    llmcore.model.Attention, or a mapping with w_qkv, b_qkv, w_o, b_o; n_heads and n_kv_heads come
    from the layer if not given. Starts the processes with torch.multiprocessing (spawn), joins
    them through gloo on a free localhost port, and returns rank 0's all-reduced output. Starting
    the processes takes seconds; the point is the data flow, not speed. Chapter 10.
    """
    weights = _layer_weights(layer_or_weights)
    if n_heads is None:
        n_heads = getattr(layer_or_weights, "n_heads", None)
        if n_heads is None:
            raise ValueError("n_heads: required when layer_or_weights is a mapping")
    if n_kv_heads is None:
        n_kv_heads = getattr(layer_or_weights, "n_kv_heads", None)
    check_operands(x=x, **weights)
    if x.device.type != "cpu":
        raise ValueError(f"x is on {x.device}: the gloo processes here run on the CPU; "
                         "move x and the weights to the CPU")
    if not (dist.is_available() and dist.is_gloo_available()):
        raise RuntimeError("tensor_parallel_attention: torch.distributed with the gloo backend "
                           "is not available in this torch build")
    with torch.no_grad():
        shards = shard_attention_weights(weights["w_qkv"], weights["b_qkv"], weights["w_o"],
                                         n_heads=n_heads, n_kv_heads=n_kv_heads,
                                         world_size=world_size)
        check_shape("x", x, ("...", "n", "d"), d=weights["w_o"].shape[0])
        # Copies: sending a tensor to a process moves its storage into shared memory, which
        # must not happen to the caller's tensors; detached: no autograd graph crosses over.
        def copy(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.detach().clone()
        shards = [AttentionShard(copy(s.w_qkv), copy(s.b_qkv), copy(s.w_o), s.n_heads,
                                 s.n_kv_heads) for s in shards]
        result = torch.empty(x.shape, dtype=x.dtype).share_memory_()      # rank 0 writes here
        mp.spawn(_rank_main, args=(world_size, _free_port(), copy(x), shards, copy(weights["b_o"]),
                                   causal, result), nprocs=world_size, join=True)
    return result
