"""llmcore.multihead: the loop over heads == views and one attention == one combined W_qkv == the NumPy
reference == torch.nn.MultiheadAttention (with its transposed weight layout mapped), grouped-query
and multi-query projections, and errors for heads that do not divide."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from llmcore import reference, testing
from llmcore.matmul import linear
from llmcore.multihead import (fuse_qkv, multihead_attention, multihead_attention_loop,
                               multihead_attention_qkv, qkv_projection)
from llmcore.masks import causal_mask
from llmcore.multihead import split_heads

SETTINGS = settings(max_examples=15, deadline=None)
F64 = dict(rtol=1e-10, atol=1e-12)


def weights(rng, d, n_heads, n_kv_heads=None, *, bias=True, dtype=torch.float64, device=None):
    """w_q, w_o: (d, d); w_k, w_v: (d, h_kv d_head); biases to match (or None)."""
    d_kv = (n_kv_heads or n_heads) * (d // n_heads)
    scale = d ** -0.5
    w = {name: testing.randn(rng, d, cols, dtype=dtype, device=device) * scale
         for name, cols in (("w_q", d), ("w_k", d_kv), ("w_v", d_kv), ("w_o", d))}
    b = {f"b_{name[2:]}": testing.randn(rng, cols, dtype=dtype, device=device) if bias else None
         for name, cols in (("w_q", d), ("w_k", d_kv), ("w_v", d_kv), ("w_o", d))}
    return w, b


def as_numpy(tensors):
    return {name: None if t is None else t.cpu().numpy() for name, t in tensors.items()}


@pytest.mark.parametrize("lead, n, d, n_heads, n_kv_heads, causal, bias", [
    ((2,), 5, 12, 3, None, True, True),       # (b, n, d), plain multi-head
    ((2,), 7, 12, 4, 2, True, True),          # grouped-query
    ((2,), 7, 12, 4, 1, True, False),         # multi-query, no biases
    ((), 6, 8, 2, None, False, True),         # (n, d), no mask
    ((2, 2), 3, 6, 3, None, True, True),      # two leading dimensions
    ((3,), 4, 10, 1, None, True, True),       # one head: plain attention
])
def test_multihead_ladder(lead, n, d, n_heads, n_kv_heads, causal, bias, rng):
    x = testing.randn(rng, *lead, n, d, dtype=torch.float64)
    w, b = weights(rng, d, n_heads, n_kv_heads, bias=bias)
    want = reference.multihead_attention(x.numpy(), **as_numpy(w), **as_numpy(b), n_heads=n_heads,
                                         causal=causal)
    args = dict(**w, **b, n_heads=n_heads, causal=causal)
    testing.assert_close(multihead_attention_loop(x, **args), want, **F64)
    testing.assert_close(multihead_attention(x, **args), want, **F64)
    testing.assert_close(multihead_attention(x, **args, backend="fused"), want, **F64)
    w_qkv = fuse_qkv(w["w_q"], w["w_k"], w["w_v"])
    b_qkv = fuse_qkv(b["b_q"], b["b_k"], b["b_v"]) if bias else None
    testing.assert_close(multihead_attention_qkv(x, w_qkv, w["w_o"], n_heads=n_heads,
                                                 n_kv_heads=n_kv_heads, b_qkv=b_qkv, b_o=b["b_o"],
                                                 causal=causal), want, **F64)


@pytest.mark.parametrize("n, d, n_heads, causal", [
    (5, 12, 3, True),
    (7, 8, 4, False),
    (4, 6, 1, True),
])
def test_multihead_equals_torch_nn_multihead_attention(n, d, n_heads, causal, rng):
    """torch stores projections as (d_out, d_in) and applies x @ W^T; ours are (d_in, d_out)."""
    b_size = 2
    x = testing.randn(rng, b_size, n, d)
    w, b = weights(rng, d, n_heads, dtype=torch.float32)
    mha = torch.nn.MultiheadAttention(d, n_heads, batch_first=True, bias=True).eval()
    with torch.no_grad():
        mha.in_proj_weight.copy_(fuse_qkv(w["w_q"], w["w_k"], w["w_v"]).T)     # (3d, d)
        mha.in_proj_bias.copy_(fuse_qkv(b["b_q"], b["b_k"], b["b_v"]))        # (3d,)
        mha.out_proj.weight.copy_(w["w_o"].T)
        mha.out_proj.bias.copy_(b["b_o"])
        blocked = ~causal_mask(n, n) if causal else None                      # True = may NOT attend
        want, _ = mha(x, x, x, attn_mask=blocked, need_weights=False)
    torch.testing.assert_close(multihead_attention(x, **w, **b, n_heads=n_heads, causal=causal), want)
    torch.testing.assert_close(multihead_attention_loop(x, **w, **b, n_heads=n_heads, causal=causal),
                               want)


@pytest.mark.parametrize("n_heads, n_kv_heads", [(4, 4), (4, 2), (6, 3), (6, 1)])
def test_one_combined_projection_equals_three_matmuls(n_heads, n_kv_heads, rng):
    d, n = 12, 5
    x = testing.randn(rng, 2, n, d, dtype=torch.float64)
    w, b = weights(rng, d, n_heads, n_kv_heads)
    q, k, v = qkv_projection(x, fuse_qkv(w["w_q"], w["w_k"], w["w_v"]),
                             fuse_qkv(b["b_q"], b["b_k"], b["b_v"]), n_heads=n_heads,
                             n_kv_heads=n_kv_heads)
    d_head = d // n_heads
    assert q.shape == (2, n_heads, n, d_head) and k.shape == v.shape == (2, n_kv_heads, n, d_head)
    testing.assert_close(q, split_heads(linear(x, w["w_q"], b["b_q"]), n_heads), **F64)
    testing.assert_close(k, split_heads(linear(x, w["w_k"], b["b_k"]), n_kv_heads), **F64)
    testing.assert_close(v, split_heads(linear(x, w["w_v"], b["b_v"]), n_kv_heads), **F64)
    # and the same without a bias
    q0, _, _ = qkv_projection(x, fuse_qkv(w["w_q"], w["w_k"], w["w_v"]), None, n_heads=n_heads,
                              n_kv_heads=n_kv_heads)
    testing.assert_close(q0, split_heads(x @ w["w_q"], n_heads), **F64)


def test_fuse_qkv_lays_the_weights_side_by_side(rng):
    w_q, w_k, w_v = testing.randn(rng, 6, 6), testing.randn(rng, 6, 2), testing.randn(rng, 6, 2)
    fused = fuse_qkv(w_q, w_k, w_v)
    assert fused.shape == (6, 10)
    assert torch.equal(fused[:, :6], w_q) and torch.equal(fused[:, 6:8], w_k) and torch.equal(fused[:, 8:], w_v)
    assert fuse_qkv(torch.zeros(6), torch.ones(2), torch.ones(2)).tolist() == [0.0] * 6 + [1.0] * 4


def test_grouped_query_equals_multihead_with_repeated_kv_columns(rng):
    """h_kv < h is ordinary multi-head attention whose K/V heads are copied across each group."""
    d, n_heads, n_kv_heads = 12, 6, 2
    d_head, group = d // n_heads, n_heads // n_kv_heads
    x = testing.randn(rng, 2, 5, d, dtype=torch.float64)
    w, b = weights(rng, d, n_heads, n_kv_heads)

    def repeat(t):     # (..., h_kv d_head) -> (..., h d_head): each K/V head's columns `group` times
        return t.unflatten(-1, (n_kv_heads, d_head)).repeat_interleave(group, dim=-2).flatten(-2)

    full = dict(w, w_k=repeat(w["w_k"]), w_v=repeat(w["w_v"]))
    full_b = dict(b, b_k=repeat(b["b_k"]), b_v=repeat(b["b_v"]))
    testing.assert_close(multihead_attention(x, **w, **b, n_heads=n_heads, causal=True),
                         multihead_attention(x, **full, **full_b, n_heads=n_heads, causal=True), **F64)


def test_heads_are_independent_until_the_output_projection(rng):
    """Zeroing head j's query columns changes head j's output only (the loop's premise)."""
    d, n_heads = 12, 3
    x = testing.randn(rng, 4, d, dtype=torch.float64)
    w, _ = weights(rng, d, n_heads, bias=False)
    eye = torch.eye(d, dtype=torch.float64)                   # w_o = I: heads side by side
    before = multihead_attention(x, w["w_q"], w["w_k"], w["w_v"], eye, n_heads=n_heads, causal=True)
    w_q = w["w_q"].clone()
    w_q[:, 4:8] = 0.0                                         # head 1's columns
    after = multihead_attention(x, w_q, w["w_k"], w["w_v"], eye, n_heads=n_heads, causal=True)
    changed = (after != before).any(dim=0).unflatten(0, (n_heads, 4)).any(dim=-1)
    assert changed.tolist() == [False, True, False]


def test_multihead_follows_the_device(device, rng):
    x = testing.randn(rng, 2, 5, 12)
    w, b = weights(rng, 12, 4, 2, dtype=torch.float32)
    want = multihead_attention(x, **w, **b, n_heads=4, causal=True)
    on = {k: v.to(device) for k, v in {**w, **b}.items()}
    for fn in (multihead_attention, multihead_attention_loop):
        out = fn(x.to(device), **on, n_heads=4, causal=True)
        assert out.device.type == device.type
        torch.testing.assert_close(out.cpu(), want)
    q, k, v = qkv_projection(x.to(device), fuse_qkv(on["w_q"], on["w_k"], on["w_v"]), None,
                             n_heads=4, n_kv_heads=2)
    assert {t.device.type for t in (q, k, v)} == {device.type}


@SETTINGS
@given(b=st.integers(1, 2), n=st.integers(1, 5), n_kv_heads=st.integers(1, 3), group=st.integers(1, 2),
       d_head=st.integers(1, 4), causal=st.booleans(), seed=st.integers(0, 2**16))
def test_ladder_on_random_shapes(b, n, n_kv_heads, group, d_head, causal, seed):
    n_heads = n_kv_heads * group
    d = n_heads * d_head
    rng = np.random.default_rng(seed)
    x = testing.randn(rng, b, n, d, dtype=torch.float64)
    w, bias = weights(rng, d, n_heads, n_kv_heads)
    want = reference.multihead_attention(x.numpy(), **as_numpy(w), **as_numpy(bias),
                                         n_heads=n_heads, causal=causal)
    args = dict(**w, **bias, n_heads=n_heads, causal=causal)
    testing.assert_close(multihead_attention(x, **args), want, **F64)
    testing.assert_close(multihead_attention_loop(x, **args), want, **F64)


# ------------------------------------------------------------------------------------ bad inputs

X = torch.zeros(2, 5, 12)
W = torch.zeros(12, 12)


@pytest.mark.parametrize("fn", [multihead_attention, multihead_attention_loop])
@pytest.mark.parametrize("x, w_q, w_k, w_v, n_heads, message", [
    (X, W, W, W, 5, "n_heads = 5 must be positive and divide d_model = 12"),
    (X, W, W, W, 0, "n_heads = 0 must be positive"),
    (X, torch.zeros(12, 10), W, W, 3, r"w_q: expected shape \(d=12, d=12\) with d = 12, got \(12, 10\)"),
    (X, W, torch.zeros(12, 5), torch.zeros(12, 5), 3, r"w_k, w_v: expected \(d, h_kv \* d_head\) with d_head = 4, got 5 columns"),
    (X, W, torch.zeros(12, 8), torch.zeros(12, 8), 6, "n_kv_heads = 4 must be positive and divide n_heads = 6"),
    (torch.zeros(2, 5, 10), W, W, W, 3, r"w_q: expected shape \(d=10, d=10\) with d = 10, got \(12, 12\)"),
])
def test_multihead_refuses_bad_shapes(fn, x, w_q, w_k, w_v, n_heads, message):
    with pytest.raises(ValueError, match=message):
        fn(x, w_q, w_k, w_v, W, n_heads=n_heads)


def test_loop_form_checks_w_v_and_w_o_as_well():
    with pytest.raises(ValueError, match=r"w_v: expected shape \(d=12, d_kv=12\) with d_kv = 12, got \(12, 8\)"):
        multihead_attention_loop(X, W, W, torch.zeros(12, 8), W, n_heads=3)
    with pytest.raises(ValueError, match=r"w_o: expected shape \(d=12, d=12\) with d = 12, got \(12, 8\)"):
        multihead_attention_loop(X, W, W, W, torch.zeros(12, 8), n_heads=3)


def test_qkv_projection_refuses_the_wrong_width():
    with pytest.raises(ValueError, match=r"w_qkv: expected shape \(d=12, 36\), got \(12, 30\)"):
        qkv_projection(X, torch.zeros(12, 30), None, n_heads=3)
    with pytest.raises(ValueError, match=r"w_qkv: expected shape \(d=12, 24\), got \(12, 36\)"):
        qkv_projection(X, torch.zeros(12, 36), None, n_heads=4, n_kv_heads=2)


def test_qkv_projection_names_w_qkv_in_a_dtype_mismatch():
    with pytest.raises(TypeError, match="x is torch.float32, w_qkv is torch.float64"):
        qkv_projection(X, torch.zeros(12, 36, dtype=torch.float64), None, n_heads=3)
