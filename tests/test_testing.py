"""llmcore.testing: the comparison helpers pass what is equal, fail what is not, and say why (the
message a learner reads in an nbgrader test cell)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from llmcore import testing
from llmcore.attention import attention


def test_randn_gives_the_same_numbers_on_every_device_and_dtype(device):
    a = testing.randn(np.random.default_rng(3), 2, 3, dtype=torch.float64)
    b = testing.randn(np.random.default_rng(3), 2, 3, device=device)
    assert a.shape == (2, 3) and a.dtype == torch.float64
    assert b.device.type == device.type and b.dtype == torch.float32
    torch.testing.assert_close(b.cpu().double(), a, rtol=1e-7, atol=1e-7)
    assert not torch.equal(a, testing.randn(np.random.default_rng(4), 2, 3, dtype=torch.float64))


@pytest.mark.parametrize("actual, expected", [
    (torch.tensor([1.0, 2.0]), np.array([1.0, 2.0 + 1e-9])),
    ([[1.0, 2.0]], torch.tensor([[1.0, 2.0]])),                    # nested lists too
    (torch.tensor([math.nan]), [math.nan]),                       # NaN where NaN is expected
    (torch.tensor([-math.inf, 0.0]), [-math.inf, 0.0]),
])
def test_assert_close_accepts_equal_values(actual, expected):
    testing.assert_close(actual, expected)


@pytest.mark.parametrize("actual, expected, message", [
    (torch.zeros(2, 3), np.zeros((3, 2)), r"result: expected shape \(3, 2\), got \(2, 3\)"),
    (None, [1.0], "result: got None; did the function forget to return its result"),
    (torch.tensor([1.0, math.nan]), [1.0, 2.0], r"result: got NaN at index \(1,\) \(expected 2\)"),
    (torch.tensor([[1.0, 2.0], [3.0, 4.5]]), [[1.0, 2.0], [3.0, 4.0]], r"1 of 4 entries differ; the largest difference is at index \(1, 1\): expected 4, got 4\.5"),
    (torch.tensor([1.0, 2.0]), [1.0, math.nan], r"at index \(1,\): expected nan, got 2"),
])
def test_assert_close_explains_what_differs(actual, expected, message):
    with pytest.raises(AssertionError, match=message):
        testing.assert_close(actual, expected)


def test_assert_close_uses_its_tolerances():
    testing.assert_close([1.0 + 1e-3], [1.0], rtol=0, atol=1e-2)
    with pytest.raises(AssertionError, match="w_q"):
        testing.assert_close([1.0 + 1e-3], [1.0], rtol=0, atol=1e-4, name="w_q")


def test_assert_same_as_passes_an_equal_implementation():
    def my_attention(q, k, v, causal=False):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if causal:
            n = q.shape[-2]
            scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -math.inf)
        return torch.softmax(scores, dim=-1) @ v

    testing.assert_same_as(my_attention, attention, shapes=[(2, 5, 8)] * 3, causal=True)


def test_assert_same_as_fails_a_subtly_wrong_one():
    def unscaled(q, k, v, causal=False):      # forgot the 1 / sqrt(d_head)
        return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v

    with pytest.raises(AssertionError, match=r"unscaled\(\(2, 5, 8\), \(2, 5, 8\), \(2, 5, 8\)\): "
                                             r"\d+ of 80 entries differ"):
        testing.assert_same_as(unscaled, attention, shapes=[(2, 5, 8)] * 3)


def test_assert_same_as_hands_both_functions_the_dtype_device_and_keywords_asked_for(device):
    seen = []

    def spy(x, *, scale):
        seen.append((x.dtype, x.device.type, tuple(x.shape), scale))
        return x * scale

    testing.assert_same_as(spy, spy, shapes=[(3, 4)], dtype=torch.float32, device=device, scale=2.0,
                           rtol=1e-6, atol=1e-6)
    assert seen == [(torch.float32, device.type, (3, 4), 2.0)] * 2


def test_randint_draws_whole_numbers_in_the_closed_range_on_the_device(device):
    x = testing.randint(torch.Generator().manual_seed(0), -2, 2, 50, 4, device=device)
    assert x.shape == (50, 4) and x.dtype == torch.float64 and x.device.type == device.type
    values = set(x.cpu().flatten().tolist())
    assert values <= {-2.0, -1.0, 0.0, 1.0, 2.0} and {-2.0, 2.0} <= values   # both ends drawn
    again = testing.randint(torch.Generator().manual_seed(0), -2, 2, 50, 4, device=device)
    assert torch.equal(x, again)                                               # seeded
