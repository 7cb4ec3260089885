"""llmcore.scalar: the pure-Python loops the benchmark measures compute the same numbers as the
NumPy reference (otherwise their timings would compare different work)."""

from __future__ import annotations

import pytest
import torch

from llmcore import reference, testing
from llmcore.attention import attention_loop
from llmcore.scalar import attention_scalar, matmul_scalar

F64 = dict(rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n, k, m", [(3, 5, 7), (7, 5, 3), (1, 1, 1), (4, 2, 4)])
def test_matmul_scalar_matches_reference(n, k, m, rng):
    a, b = rng.standard_normal((n, k)), rng.standard_normal((k, m))
    out = matmul_scalar(a.tolist(), b.tolist())
    assert isinstance(out, list) and len(out) == n and all(len(row) == m for row in out)
    testing.assert_close(out, reference.matmul(a, b), **F64)


@pytest.mark.parametrize("n, m, d_head, causal", [
    (5, 5, 4, True),       # prefill
    (3, 7, 4, True),       # chunked prefill: bottom-right aligned
    (1, 6, 3, True),       # decode: one query sees every key
    (4, 6, 5, False),
])
def test_attention_scalar_matches_reference_and_loop(n, m, d_head, causal, rng):
    q, k, v = rng.standard_normal((n, d_head)), rng.standard_normal((m, d_head)), \
        rng.standard_normal((m, d_head))
    out = attention_scalar(q.tolist(), k.tolist(), v.tolist(), causal=causal)
    testing.assert_close(out, reference.attention(q, k, v, causal=causal), **F64)
    loop = attention_loop(*(torch.from_numpy(a) for a in (q, k, v)), causal=causal)
    testing.assert_close(out, loop, **F64)


def test_attention_scalar_survives_large_scores():
    """The row maximum is subtracted before exp: scores of 1e4 would overflow math.exp."""
    q = [[100.0, 0.0], [0.0, 100.0]]
    k = [[100.0, 0.0], [0.0, 100.0], [1.0, 1.0]]
    v = [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
    testing.assert_close(attention_scalar(q, k, v), reference.attention(q, k, v), **F64)


def test_matmul_scalar_refuses_ragged_rows():
    with pytest.raises(ValueError, match="a's rows must have k = 2 entries"):
        matmul_scalar([[1.0, 2.0], [3.0]], [[1.0], [2.0]])
