"""llmcore.parallel: sharding by heads is exact and invertible, the ranks' partial outputs sum to
the single-process layer (checked without processes), and one real two-process gloo run returns
the output of llmcore.model.Attention."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from llmcore import testing
from llmcore.layout import contiguous_layout
from llmcore.model import GPT, GPTConfig
from llmcore.multihead import multihead_attention_qkv
from llmcore.parallel import (attention_shard_forward, shard_attention_weights,
                              tensor_parallel_attention, unshard_attention_weights)

F64 = dict(rtol=1e-12, atol=1e-12)


def layer_weights(rng, d, n_heads, n_kv_heads, *, dtype=torch.float64, device=None):
    d_head = d // n_heads
    width = (n_heads + 2 * n_kv_heads) * d_head
    return dict(w_qkv=testing.randn(rng, d, width, dtype=dtype, device=device),
                b_qkv=testing.randn(rng, width, dtype=dtype, device=device),
                w_o=testing.randn(rng, d, d, dtype=dtype, device=device),
                b_o=testing.randn(rng, d, dtype=dtype, device=device))


CASES = [          # d, h, h_kv, world_size
    (24, 4, 4, 2),     # plain multi-head, two ranks
    (24, 4, 2, 2),     # grouped-query: one K/V head per rank
    (24, 6, 2, 2),     # three query heads per K/V head
    (24, 4, 4, 4),     # one head per rank
    (20, 4, 4, 1),     # one rank holds everything
]


@pytest.mark.parametrize("d, h, h_kv, world_size", CASES)
def test_shards_are_the_heads_columns_and_rows(d, h, h_kv, world_size, rng):
    w = layer_weights(rng, d, h, h_kv)
    shards = shard_attention_weights(w["w_qkv"], w["b_qkv"], w["w_o"], n_heads=h, n_kv_heads=h_kv,
                                     world_size=world_size)
    d_head = d // h
    q_w, kv_w = h // world_size * d_head, h_kv // world_size * d_head
    assert len(shards) == world_size
    for rank, shard in enumerate(shards):
        assert (shard.n_heads, shard.n_kv_heads) == (h // world_size, h_kv // world_size)
        assert shard.w_qkv.shape == (d, q_w + 2 * kv_w) and shard.w_o.shape == (q_w, d)
        q_cols = w["w_qkv"][:, rank * q_w:(rank + 1) * q_w]
        k_cols = w["w_qkv"][:, h * d_head + rank * kv_w:h * d_head + (rank + 1) * kv_w]
        v_start = (h + h_kv) * d_head
        v_cols = w["w_qkv"][:, v_start + rank * kv_w:v_start + (rank + 1) * kv_w]
        assert torch.equal(shard.w_qkv, torch.cat([q_cols, k_cols, v_cols], dim=1))
        assert torch.equal(shard.w_o, w["w_o"][rank * q_w:(rank + 1) * q_w])
    w_qkv, b_qkv, w_o = unshard_attention_weights(shards)
    assert torch.equal(w_qkv, w["w_qkv"]) and torch.equal(b_qkv, w["b_qkv"])
    assert torch.equal(w_o, w["w_o"])


@pytest.mark.parametrize("d, h, h_kv, world_size", CASES)
@pytest.mark.parametrize("n", [1, 7])
def test_partial_outputs_sum_to_the_layer(d, h, h_kv, world_size, n, rng):
    w = layer_weights(rng, d, h, h_kv)
    x = testing.randn(rng, 3, n, d, dtype=torch.float64)                    # b = 3
    want = multihead_attention_qkv(x, w["w_qkv"], w["w_o"], n_heads=h, n_kv_heads=h_kv,
                                   b_qkv=w["b_qkv"], b_o=w["b_o"], causal=True)
    shards = shard_attention_weights(w["w_qkv"], w["b_qkv"], w["w_o"], n_heads=h, n_kv_heads=h_kv,
                                     world_size=world_size)
    partials = [attention_shard_forward(x, shard) for shard in shards]
    assert all(p.shape == (3, n, d) for p in partials)
    testing.assert_close(sum(partials) + w["b_o"], want, **F64)
    if world_size > 1:               # one rank alone is not the answer: the sum is needed
        assert not torch.allclose(partials[0] + w["b_o"], want)


def test_without_biases(rng):
    w = layer_weights(rng, 24, 4, 2)
    x = testing.randn(rng, 2, 5, 24, dtype=torch.float64)
    shards = shard_attention_weights(w["w_qkv"], None, w["w_o"], n_heads=4, n_kv_heads=2)
    assert all(s.b_qkv is None for s in shards)
    assert unshard_attention_weights(shards)[1] is None
    want = multihead_attention_qkv(x, w["w_qkv"], w["w_o"], n_heads=4, n_kv_heads=2, causal=True)
    testing.assert_close(sum(attention_shard_forward(x, s) for s in shards), want, **F64)


def test_sharding_on_meta_device():
    w = {name: torch.empty(shape, device="meta") for name, shape in
         (("w_qkv", (24, 48)), ("b_qkv", (48,)), ("w_o", (24, 24)))}
    shards = shard_attention_weights(w["w_qkv"], w["b_qkv"], w["w_o"], n_heads=4, n_kv_heads=2)
    partial = attention_shard_forward(torch.empty(2, 5, 24, device="meta"), shards[1])
    assert partial.device.type == "meta" and partial.shape == (2, 5, 24)
    assert shards[0].w_qkv.device.type == "meta" and shards[0].w_qkv.shape == (24, 24)


@pytest.mark.parametrize("world_size, error, words", [
    (3, ValueError, "world_size = 3 must divide n_kv_heads = 2"),
    (4, ValueError, "world_size = 4"),           # divides h = 4 but not h_kv = 2
    (0, ValueError, "world_size"),
    (2.0, TypeError, "world_size"),
])
def test_bad_world_size(world_size, error, words, rng):
    w = layer_weights(rng, 24, 4, 2)
    with pytest.raises(error, match=words):
        shard_attention_weights(w["w_qkv"], w["b_qkv"], w["w_o"], n_heads=4, n_kv_heads=2,
                                world_size=world_size)


def test_bad_weights_and_inputs(rng):
    w = layer_weights(rng, 24, 4, 2)
    with pytest.raises(ValueError, match="w_qkv"):
        shard_attention_weights(w["w_qkv"][:, :-1], None, w["w_o"], n_heads=4, n_kv_heads=2)
    with pytest.raises(ValueError, match="n_heads"):
        shard_attention_weights(w["w_qkv"], None, w["w_o"], n_heads=5)
    shard = shard_attention_weights(w["w_qkv"], None, w["w_o"], n_heads=4, n_kv_heads=2)[0]
    with pytest.raises(ValueError, match="x"):
        attention_shard_forward(torch.zeros(2, 5, 23, dtype=torch.float64), shard)
    with pytest.raises(TypeError, match="dtype"):
        attention_shard_forward(torch.zeros(2, 5, 24), shard)
    x = torch.zeros(2, 5, 24, dtype=torch.float64)
    with pytest.raises(ValueError, match="n_heads"):           # a mapping does not know h
        tensor_parallel_attention(x, w)
    with pytest.raises(ValueError, match="w_o"):
        tensor_parallel_attention(x, {"w_qkv": w["w_qkv"]}, n_heads=4)
    with pytest.raises(TypeError, match="layer_or_weights"):
        tensor_parallel_attention(x, [w["w_qkv"]], n_heads=4)
    with pytest.raises(ValueError, match="world_size"):     # checked before any process starts
        tensor_parallel_attention(x, w, n_heads=4, n_kv_heads=2, world_size=3)
    with pytest.raises(ValueError, match="unshard|shards|AttentionShard"):
        unshard_attention_weights([])


@pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                    reason="torch.distributed with the gloo backend is not in this torch build")
def test_two_gloo_processes_equal_the_model_layer():
    """The one real multi-process run (starting two Python processes takes seconds)."""
    config = GPTConfig(vocab_size=61, max_seq_len=48, d_model=24, n_heads=4, n_kv_heads=2,
                       n_layers=1)
    layer = GPT(config, seed=3).blocks[0].attention
    generator = torch.Generator().manual_seed(4)
    with torch.no_grad():                         # GPT-2 starts biases at 0: make them count
        for p in layer.parameters():
            p.normal_(0.0, 0.5, generator=generator)
    x = torch.randn(2, 7, 24, generator=generator)                       # (b, n, d)
    layout = contiguous_layout(2, 7, past_slots=0, past_valid=None, attention_mask=None,
                               device=x.device)
    with torch.no_grad():
        want = layer(x, layout)
    got = tensor_parallel_attention(x, layer, world_size=2)
    assert got.shape == (2, 7, 24) and got.dtype == torch.float32
    torch.testing.assert_close(got, want)
    assert not x.is_shared()                       # the caller's tensors were not moved
    assert not layer.w_o.is_shared()
