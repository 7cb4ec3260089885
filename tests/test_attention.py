"""llmcore.attention: reference == loop == explicit == fused == PyTorch's scaled_dot_product_attention
(with an explicit bottom-right mask), grouped-query and multi-query K/V, arbitrary masks, fully
masked rows as zeros, and errors that name the argument and both shapes."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from llmcore import reference, testing
from llmcore.attention import attention, attention_loop
from llmcore.masks import causal_mask

SETTINGS = settings(max_examples=20, deadline=None)
F64 = dict(rtol=1e-10, atol=1e-12)


def forms(**kwargs):
    """Every torch rung of attention with the same keyword arguments."""
    return {
        "loop": lambda q, k, v: attention_loop(q, k, v, **kwargs),
        "explicit": lambda q, k, v: attention(q, k, v, **kwargs),
        "fused": lambda q, k, v: attention(q, k, v, backend="fused", **kwargs),
    }


@pytest.mark.parametrize("form", ["loop", "explicit", "fused"])
@pytest.mark.parametrize("lead, n, m, d_head, causal", [
    ((2, 3), 5, 5, 8, True),       # prefill: (b, h, n, n)
    ((2, 3), 1, 7, 8, True),       # decode: one query, the whole past
    ((2, 3), 3, 7, 8, True),       # chunked prefill: bottom-right aligned
    ((2, 3), 4, 6, 5, False),      # no mask, n != m != d_head
    ((), 6, 9, 4, True),           # (n, d_head): one head, no batch
    ((3,), 2, 2, 3, True),         # (h, n, d_head)
])
def test_attention_ladder(form, lead, n, m, d_head, causal, rng):
    q = testing.randn(rng, *lead, n, d_head, dtype=torch.float64)
    k, v = (testing.randn(rng, *lead, m, d_head, dtype=torch.float64) for _ in range(2))
    fn = forms(causal=causal)[form]
    want = reference.attention(q.numpy(), k.numpy(), v.numpy(), causal=causal)
    testing.assert_close(fn(q, k, v), want, **F64)
    # PyTorch's own op, in float32, with the mask spelled out: its is_causal is top-left aligned
    q32, k32, v32 = q.float(), k.float(), v.float()
    mask = causal_mask(n, m) if causal else None
    torch.testing.assert_close(fn(q32, k32, v32),
                               F.scaled_dot_product_attention(q32, k32, v32, attn_mask=mask))


def test_sdpa_is_causal_differs_from_the_cache_mask_when_m_exceeds_n(rng):
    """Why the tests pass an explicit mask: is_causal aligns top-left, wrong for a cache."""
    q, k, v = testing.randn(rng, 1, 2, 3, 4), testing.randn(rng, 1, 2, 6, 4), testing.randn(rng, 1, 2, 6, 4)
    top_left = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert not torch.allclose(attention(q, k, v, causal=True), top_left)
    torch.testing.assert_close(attention(q, k, v, causal=True),
                               F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(3, 6)))


def test_scores_are_scaled_by_the_square_root_of_d_head(rng):
    q, k, v = (testing.randn(rng, 4, 16, dtype=torch.float64) for _ in range(3))
    by_hand = torch.softmax(q @ k.T / math.sqrt(16), dim=-1) @ v
    testing.assert_close(attention(q, k, v), by_hand, **F64)
    assert not torch.allclose(attention(q, k, v), torch.softmax(q @ k.T, dim=-1) @ v)


@pytest.mark.parametrize("form", ["loop", "explicit", "fused"])
@pytest.mark.parametrize("h, h_kv, n, m, causal", [
    (4, 2, 5, 5, True),      # grouped-query: 2 query heads per K/V head
    (6, 3, 3, 7, True),
    (4, 1, 5, 5, True),      # multi-query: one K/V head for all
    (6, 2, 4, 6, False),
])
def test_grouped_query_attention_equals_attention_on_repeated_kv(form, h, h_kv, n, m, causal, rng):
    b, d_head = 2, 4
    q = testing.randn(rng, b, h, n, d_head, dtype=torch.float64)
    k, v = (testing.randn(rng, b, h_kv, m, d_head, dtype=torch.float64) for _ in range(2))
    # query head i reads K/V head i // (h / h_kv): repeat each K/V head for its group
    k_full, v_full = (t.repeat_interleave(h // h_kv, dim=1) for t in (k, v))
    fn = forms(causal=causal)[form]
    out = fn(q, k, v)
    assert out.shape == (b, h, n, d_head)
    testing.assert_close(out, attention(q, k_full, v_full, causal=causal), **F64)
    testing.assert_close(out, reference.attention(q.numpy(), k.numpy(), v.numpy(), causal=causal), **F64)
    mask = causal_mask(n, m) if causal else None
    torch.testing.assert_close(fn(q.float(), k.float(), v.float()), F.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=mask, enable_gqa=True))


@pytest.mark.parametrize("form", ["loop", "explicit", "fused"])
@pytest.mark.parametrize("mask_shape, causal, h_kv", [
    ((5, 7), False, 3),             # one mask for every batch and head
    ((2, 1, 5, 7), False, 3),       # per sequence (padding), shared by heads
    ((2, 3, 5, 7), True, 3),        # per head, and the causal rule on top
    ((2, 1, 5, 7), True, 1),        # multi-query with a per-sequence mask
    ((2, 3, 5, 7), False, 1),       # multi-query with a per-head mask
    ((2, 1, 6, 6), True, 3),        # n == m: causal and a padding mask together
    ((6, 6), True, 1),
])
def test_an_explicit_mask_equals_sdpa_and_the_reference(form, mask_shape, causal, h_kv, rng):
    b, h, d_head = 2, 3, 4
    n, m = mask_shape[-2:]
    q = testing.randn(rng, b, h, n, d_head, dtype=torch.float64)
    k, v = (testing.randn(rng, b, h_kv, m, d_head, dtype=torch.float64) for _ in range(2))
    mask = torch.from_numpy(rng.random(mask_shape) < 0.7)
    mask[..., -1] = True                         # every query sees its last key: no empty row here
    fn = forms(causal=causal, mask=mask)[form]
    want = reference.attention(q.numpy(), k.numpy(), v.numpy(), causal=causal, mask=mask.numpy())
    testing.assert_close(fn(q, k, v), want, **F64)
    allowed = mask & causal_mask(n, m) if causal else mask
    torch.testing.assert_close(fn(q.float(), k.float(), v.float()), F.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=allowed, enable_gqa=h_kv != h))


@pytest.mark.parametrize("form", ["loop", "explicit", "fused"])
def test_a_query_with_no_visible_key_gets_zeros_not_nan(form, rng):
    b, h, n, m, d_head = 2, 2, 3, 5, 4
    q = testing.randn(rng, b, h, n, d_head, dtype=torch.float64)
    k, v = (testing.randn(rng, b, h, m, d_head, dtype=torch.float64) for _ in range(2))
    mask = torch.ones(b, 1, n, m, dtype=torch.bool)
    mask[0, :, 1] = False                        # sequence 0, query 1: a padding query
    mask[1, :, :, :2] = False                    # sequence 1: the first two keys are padding
    out = forms(causal=True, mask=mask)[form](q, k, v)
    assert not torch.isnan(out).any()
    assert torch.equal(out[0, :, 1], torch.zeros(h, d_head, dtype=torch.float64))
    want = reference.attention(q.numpy(), k.numpy(), v.numpy(), causal=True, mask=mask.numpy())
    testing.assert_close(out, want, **F64)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_backend_equals_explicit(causal, dtype, rng):
    q = testing.randn(rng, 2, 4, 6, 8, dtype=dtype)
    k, v = (testing.randn(rng, 2, 4, 9, 8, dtype=dtype) for _ in range(2))
    torch.testing.assert_close(attention(q, k, v, causal=causal, backend="fused"),
                               attention(q, k, v, causal=causal))


def test_attention_follows_the_inputs_dtype_and_device(device, rng):
    q = testing.randn(rng, 2, 4, 5, 8)
    k, v = (testing.randn(rng, 2, 2, 7, 8) for _ in range(2))
    want = attention(q, k, v, causal=True)
    for fn in forms(causal=True).values():
        out = fn(q.to(device), k.to(device), v.to(device))
        assert out.device.type == device.type and out.dtype == torch.float32
        torch.testing.assert_close(out.cpu(), want)


@SETTINGS
@given(b=st.integers(1, 2), h_kv=st.integers(1, 3), group=st.integers(1, 3), n=st.integers(1, 5),
       extra=st.integers(0, 4), d_head=st.integers(1, 6), causal=st.booleans(),
       seed=st.integers(0, 2**16))
def test_ladder_on_random_shapes(b, h_kv, group, n, extra, d_head, causal, seed):
    g = torch.Generator().manual_seed(seed)
    m = n + extra
    q = torch.randn(b, h_kv * group, n, d_head, generator=g, dtype=torch.float64)
    k, v = (torch.randn(b, h_kv, m, d_head, generator=g, dtype=torch.float64) for _ in range(2))
    want = reference.attention(q.numpy(), k.numpy(), v.numpy(), causal=causal)
    for name, fn in forms(causal=causal).items():
        testing.assert_close(fn(q, k, v), want, name=name, **F64)


# ------------------------------------------------------------------------------------ bad inputs

Q, KV = torch.zeros(2, 3, 5, 8), torch.zeros(2, 3, 7, 8)


@pytest.mark.parametrize("form", ["loop", "explicit", "fused"])
@pytest.mark.parametrize("q, k, v, kwargs, error, message", [
    (Q, torch.zeros(2, 3, 7, 6), torch.zeros(2, 3, 7, 6), {}, ValueError, r"k: expected shape \(\.\.\., m=7, d_head=8\) with d_head = 8, got \(2, 3, 7, 6\)"),
    (Q, KV, torch.zeros(2, 3, 6, 8), {}, ValueError, r"v: expected shape \(\.\.\., m=7, d_head=8\) with m = 7, got \(2, 3, 6, 8\)"),
    (Q, torch.zeros(2, 2, 7, 8), torch.zeros(2, 2, 7, 8), {}, ValueError, "q has h = 3 heads and k, v have h_kv = 2: expected h_kv to divide h"),
    (Q, torch.zeros(3, 3, 7, 8), torch.zeros(3, 3, 7, 8), {}, ValueError, r"q \(2, 3, 5, 8\) and k \(3, 3, 7, 8\): expected the same leading"),
    (Q, torch.zeros(3, 7, 8), torch.zeros(3, 7, 8), {}, ValueError, "expected the same leading"),
    (torch.zeros(2, 3, 9, 8), KV, KV, {"causal": True}, ValueError, "n = 9 queries but only m = 7 keys"),
    (Q, KV.double(), KV.double(), {}, TypeError, "q is torch.float32, k is torch.float64"),
    (Q, KV.to("meta"), KV.to("meta"), {}, ValueError, "q on cpu, k on meta, v on meta"),
    (Q, KV, KV, {"mask": torch.ones(5, 7)}, TypeError, "mask: expected a bool tensor .*got torch.float32"),
    (Q, KV, KV, {"mask": torch.ones(5, 6, dtype=torch.bool)}, ValueError, r"mask: expected a shape that broadcasts to \(2, 3, 5, 7\) \(\.\.\., n, m\), got \(5, 6\)"),
    (Q, KV, KV, {"mask": torch.ones(5, 7, dtype=torch.bool, device="meta")}, ValueError, "mask is on meta but q is on cpu"),
    (Q.tolist(), KV, KV, {}, TypeError, "q: expected a torch.Tensor, got list"),
])
def test_attention_refuses_bad_inputs(form, q, k, v, kwargs, error, message):
    with pytest.raises(error, match=message):
        forms(**kwargs)[form](q, k, v)


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match=r"backend: expected one of \('explicit', 'fused'\), got 'flash'"):
        attention(Q, KV, KV, backend="flash")
