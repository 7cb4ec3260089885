"""llmcore.reference, the oracle, checked in turn: against numbers worked out by hand and against
PyTorch's own float64 ops (an unchecked reference is how a wrong LayerNorm survives for years)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from llmcore import reference

TIGHT = dict(rtol=1e-12, atol=1e-13)


def test_softmax_by_hand():
    np.testing.assert_allclose(reference.softmax([0.0, math.log(3.0)]), [0.25, 0.75], **TIGHT)
    np.testing.assert_allclose(reference.softmax([[1.0, 1.0, 1.0, 1.0]]), [[0.25] * 4], **TIGHT)
    np.testing.assert_allclose(reference.softmax([[0.0], [5.0]], dim=0),
                               [[1 / (1 + math.exp(5))], [1 / (1 + math.exp(-5))]], **TIGHT)


def test_attention_by_hand():
    """One query, two keys with scores 0 and ln 3 after scaling: weights 1/4 and 3/4."""
    q = np.array([[2.0, 0.0, 0.0, 0.0]])              # d_head = 4: q . k_j / sqrt(4) = k_j[0]
    k = np.array([[0.0, 1.0, 0.0, 0.0], [math.log(3.0), 0.0, 0.0, 0.0]])
    v = np.array([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
    np.testing.assert_allclose(reference.attention(q, k, v), [[0.25, 0.75, 0.0, 0.0]], **TIGHT)
    # causal with n = m = 2: the first query sees only the first key, so it copies v_0
    q2 = np.stack([q[0], q[0]])
    np.testing.assert_allclose(reference.attention(q2, k, v, causal=True),
                               [[1.0, 0.0, 0.0, 0.0], [0.25, 0.75, 0.0, 0.0]], **TIGHT)


def test_layer_norm_and_gelu_by_hand():
    out = reference.layer_norm([[1.0, 2.0, 3.0]], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0], eps=0.0)
    np.testing.assert_allclose(out, [[-math.sqrt(1.5), 0.0, math.sqrt(1.5)]], **TIGHT)  # var 2/3
    inner = math.sqrt(2 / math.pi) * (1 + 0.044715)
    np.testing.assert_allclose(reference.gelu([1.0]), [0.5 * (1 + math.tanh(inner))], **TIGHT)


@pytest.mark.parametrize("n, m, causal", [(5, 5, True), (3, 7, True), (4, 6, False)])
def test_reference_attention_equals_torch_sdpa_in_float64(n, m, causal, rng):
    q = rng.standard_normal((2, 3, n, 8))
    k, v = rng.standard_normal((2, 3, m, 8)), rng.standard_normal((2, 3, m, 8))
    mask = torch.ones(m, m, dtype=torch.bool).tril()[m - n:] if causal else None
    want = F.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)), attn_mask=mask)
    np.testing.assert_allclose(reference.attention(q, k, v, causal=causal), want.numpy(), rtol=1e-10,
                               atol=1e-12)


def test_reference_ops_equal_torch_float64_ops(rng):
    x = rng.standard_normal((2, 5, 8)) * 3
    t = torch.from_numpy(x)
    scale, shift = rng.standard_normal(8), rng.standard_normal(8)
    np.testing.assert_allclose(reference.softmax(x), F.softmax(t, dim=-1).numpy(), **TIGHT)
    np.testing.assert_allclose(reference.gelu(x), F.gelu(t, approximate="tanh").numpy(), **TIGHT)
    np.testing.assert_allclose(
        reference.layer_norm(x, scale, shift),
        F.layer_norm(t, (8,), torch.from_numpy(scale), torch.from_numpy(shift)).numpy(),
        rtol=1e-10, atol=1e-12)
    w, b = rng.standard_normal((8, 3)), rng.standard_normal(3)
    np.testing.assert_allclose(reference.linear(x, w, b),
                               F.linear(t, torch.from_numpy(w).T, torch.from_numpy(b)).numpy(),
                               **TIGHT)


def test_reference_returns_float64_whatever_it_is_given():
    x = np.ones((2, 3), dtype=np.float32)
    for out in (reference.softmax(x), reference.gelu(x), reference.matmul(x, x.T),
                reference.split_heads(x, 3)):
        assert out.dtype == np.float64
