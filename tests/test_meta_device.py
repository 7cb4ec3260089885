"""Everything runs on torch's ``meta`` device (shapes, no numbers): a tensor that library code creates
on the CPU behind the caller's back meets a meta tensor and raises, so this catches device bugs on
machines without a GPU. Each case also checks the output's shape."""

from __future__ import annotations

import pytest
import torch

from conftest import TINY, TINY_GQA
from llmcore import (attention, causal_mask, ffn, fuse_qkv, gelu, generate, layer_norm, linear,
                     matmul, merge_heads, multihead_attention, multihead_attention_qkv,
                     qkv_projection, sample, softmax, split_heads)
from llmcore.model import GPT, GPTConfig

META = torch.device("meta")


def meta(*shape: int, dtype=torch.float32) -> torch.Tensor:
    return torch.empty(*shape, device=META, dtype=dtype)


B, H, H_KV, N, M, D_HEAD = 2, 4, 2, 5, 7, 6
D = H * D_HEAD

CASES = {
    "matmul": (lambda: matmul(meta(B, N, D), meta(D, 9)), (B, N, 9)),
    "linear": (lambda: linear(meta(B, N, D), meta(D, 9), meta(9)), (B, N, 9)),
    "softmax": (lambda: softmax(meta(B, H, N, M)), (B, H, N, M)),
    "causal_mask": (lambda: causal_mask(N, M, META), (N, M)),
    "attention": (lambda: attention(meta(B, H, N, D_HEAD), meta(B, H, M, D_HEAD), meta(B, H, M, D_HEAD), causal=True), (B, H, N, D_HEAD)),
    "attention gqa": (lambda: attention(meta(B, H, N, D_HEAD), meta(B, H_KV, M, D_HEAD), meta(B, H_KV, M, D_HEAD), causal=True), (B, H, N, D_HEAD)),
    "attention fused": (lambda: attention(meta(B, H, N, D_HEAD), meta(B, H, M, D_HEAD), meta(B, H, M, D_HEAD), causal=True, backend="fused"), (B, H, N, D_HEAD)),
    "attention fused gqa": (lambda: attention(meta(B, H, N, D_HEAD), meta(B, H_KV, M, D_HEAD), meta(B, H_KV, M, D_HEAD), causal=True, backend="fused"), (B, H, N, D_HEAD)),
    "attention mask": (lambda: attention(meta(B, H, N, D_HEAD), meta(B, H, M, D_HEAD), meta(B, H, M, D_HEAD), mask=meta(B, 1, N, M, dtype=torch.bool)), (B, H, N, D_HEAD)),
    "split_heads": (lambda: split_heads(meta(B, N, D), H), (B, H, N, D_HEAD)),
    "merge_heads": (lambda: merge_heads(meta(B, H, N, D_HEAD)), (B, N, D)),
    "multihead": (lambda: multihead_attention(meta(B, N, D), meta(D, D), meta(D, D), meta(D, D), meta(D, D), n_heads=H, b_q=meta(D), causal=True), (B, N, D)),
    "multihead gqa": (lambda: multihead_attention(meta(B, N, D), meta(D, D), meta(D, H_KV * D_HEAD), meta(D, H_KV * D_HEAD), meta(D, D), n_heads=H, causal=True), (B, N, D)),
    "multihead fused": (lambda: multihead_attention(meta(B, N, D), meta(D, D), meta(D, D), meta(D, D), meta(D, D), n_heads=H, causal=True, backend="fused"), (B, N, D)),
    "fuse_qkv": (lambda: fuse_qkv(meta(D, D), meta(D, 12), meta(D, 12)), (D, D + 24)),
    "multihead_qkv": (lambda: multihead_attention_qkv(meta(B, N, D), meta(D, (H + 2 * H_KV) * D_HEAD), meta(D, D), n_heads=H, n_kv_heads=H_KV, causal=True), (B, N, D)),
    "gelu": (lambda: gelu(meta(B, N, D)), (B, N, D)),
    "ffn": (lambda: ffn(meta(B, N, D), meta(D, 4 * D), meta(4 * D), meta(4 * D, D), meta(D)), (B, N, D)),
    "layer_norm": (lambda: layer_norm(meta(B, N, D), meta(D), meta(D)), (B, N, D)),
    "sample greedy": (lambda: sample(meta(B, 61)), (B,)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_runs_on_meta(name):
    fn, shape = CASES[name]
    out = fn()
    assert out.device == META
    assert tuple(out.shape) == shape


def test_qkv_projection_runs_on_meta():
    q, k, v = qkv_projection(meta(B, N, D), meta(D, (H + 2 * H_KV) * D_HEAD), meta((H + 2 * H_KV) * D_HEAD),
                             n_heads=H, n_kv_heads=H_KV)
    assert {t.device for t in (q, k, v)} == {META}
    assert q.shape == (B, H, N, D_HEAD) and k.shape == v.shape == (B, H_KV, N, D_HEAD)


@pytest.mark.parametrize("config", [TINY, TINY_GQA], ids=["plain", "gqa"])
@pytest.mark.parametrize("backend", ["explicit", "fused"])
def test_model_forward_runs_on_meta(config, backend):
    model = GPT(config, device="meta")
    assert {p.device for p in model.parameters()} == {META}
    tokens = torch.zeros(3, 9, dtype=torch.long, device=META)
    logits = model(tokens, backend=backend)
    assert logits.device == META and logits.shape == (3, 9, config.vocab_size)
    assert model(tokens, last_only=True).shape == (3, 1, config.vocab_size)


def test_gpt2_small_forward_runs_on_meta_without_memory():
    config = GPTConfig(vocab_size=50257, max_seq_len=1024, d_model=768, n_heads=12, n_layers=12)
    model = GPT(config, device="meta")
    logits = model(torch.zeros(4, 1024, dtype=torch.long, device=META))
    assert logits.shape == (4, 1024, 50257) and logits.device == META


def test_greedy_generation_without_a_cache_runs_on_meta():
    model = GPT(TINY_GQA, device="meta")
    ids = torch.zeros(2, 4, dtype=torch.long, device=META)
    out = generate(model, ids, 5, use_cache=False)
    assert out.device == META and out.shape == (2, 9)


def test_sampling_on_meta_is_refused_with_a_reason():
    model = GPT(TINY, device="meta")
    ids = torch.zeros(2, 4, dtype=torch.long, device=META)
    with pytest.raises(ValueError, match="sampling needs real numbers: the meta device has none"):
        generate(model, ids, 3, use_cache=False, temperature=1.0, seed=0)


def test_a_cpu_tensor_created_behind_the_callers_back_is_caught():
    """The premise of this file: mixing a CPU tensor into meta work fails loudly."""
    with pytest.raises(RuntimeError, match="is not on the expected device"):
        meta(3, 4) + torch.ones(3, 4)                     # e.g. a bias made with torch.zeros(d)
    with pytest.raises(RuntimeError, match="is not on the expected device"):
        meta(3, 4).masked_fill(torch.ones(3, 4, dtype=torch.bool), 0.0)   # a mask made on the CPU
    with pytest.raises(ValueError, match="x on meta, w on cpu"):
        linear(meta(2, 3), torch.zeros(3, 4))
