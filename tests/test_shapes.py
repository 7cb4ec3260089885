"""llmcore.shapes' argument checks, llmcore.masks' causal mask (the oracle's own input, so pinned to literal matrices), the head
reshapes (views, inverse of each other, the right entries moved), and the argument checks whose
messages every op relies on."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from llmcore import reference, testing
from llmcore.masks import NEG_INF, causal_mask
from llmcore.multihead import merge_heads, split_heads
from llmcore.shapes import (check_operands, check_same_device, check_same_dtype, check_shape,
                            check_tensor)

SETTINGS = settings(max_examples=25, deadline=None)


# ---------------------------------------------------------------------------------- causal mask

@pytest.mark.parametrize("n, m, rows", [
    (2, 4, [[1, 1, 1, 0], [1, 1, 1, 1]]),                       # bottom-right: the cache case
    (3, 3, [[1, 0, 0], [1, 1, 0], [1, 1, 1]]),                  # square: the lower triangle
    (1, 5, [[1, 1, 1, 1, 1]]),                                  # one decode step sees everything
    (2, 5, [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]),
])
def test_causal_mask_is_a_literal_matrix(n, m, rows):
    mask = causal_mask(n, m)
    assert mask.dtype == torch.bool and mask.shape == (n, m)
    assert mask.int().tolist() == rows
    assert reference.causal_mask(n, m).astype(int).tolist() == rows


@pytest.mark.parametrize("n, m", [(1, 1), (4, 4), (3, 7), (6, 9)])
def test_causal_mask_is_the_last_n_rows_of_the_square_one(n, m):
    square = torch.ones(m, m, dtype=torch.bool).tril()
    assert torch.equal(causal_mask(n, m), square[m - n:])


def test_causal_mask_refuses_more_queries_than_keys():
    with pytest.raises(ValueError, match=r"n = 4 queries but only m = 2 keys"):
        causal_mask(4, 2)
    with pytest.raises(ValueError, match="expected m >= n"):
        reference.causal_mask(4, 2)


def test_causal_mask_is_made_on_the_device_asked_for(device):
    assert causal_mask(3, 5, device).device.type == device.type


def test_neg_inf_gives_exactly_zero_weight():
    assert NEG_INF == float("-inf")
    assert torch.exp(torch.tensor(NEG_INF)).item() == 0.0


# -------------------------------------------------------------------------------- head reshapes

@pytest.mark.parametrize("shape, n_heads", [
    ((5, 12), 3),            # (n, d): no batch
    ((2, 5, 12), 4),         # (b, n, d)
    ((2, 3, 7, 12), 2),      # two leading dimensions
    ((2, 5, 12), 1),         # one head: only the transpose
    ((2, 5, 12), 12),        # d_head = 1
])
def test_split_heads_moves_each_column_block_to_its_head(shape, n_heads, rng):
    x = testing.randn(rng, *shape, dtype=torch.float64)
    heads = split_heads(x, n_heads)
    *lead, n, d = shape
    d_head = d // n_heads
    assert heads.shape == (*lead, n_heads, n, d_head)
    for head in range(n_heads):                    # head i holds columns [i d_head, (i+1) d_head)
        assert torch.equal(heads[..., head, :, :], x[..., head * d_head:(head + 1) * d_head])
    testing.assert_close(heads, reference.split_heads(x.numpy(), n_heads), rtol=0, atol=0)


def test_split_heads_is_a_view_and_merge_heads_copies(rng):
    x = testing.randn(rng, 2, 5, 12)
    heads = split_heads(x, 3)
    assert heads.data_ptr() == x.data_ptr() and heads._base is x      # no data moved
    assert not heads.is_contiguous()                                 # the transpose is metadata
    merged = merge_heads(heads)
    assert merged.is_contiguous()
    assert torch.equal(merged, x)


@pytest.mark.parametrize("shape, n_heads", [((6, 8), 2), ((2, 6, 8), 4), ((3, 2, 5, 9), 3)])
def test_merge_heads_undoes_split_heads(shape, n_heads, rng, device):
    x = testing.randn(rng, *shape, device=device)
    assert torch.equal(merge_heads(split_heads(x, n_heads)), x)
    heads = testing.randn(rng, 2, n_heads, 5, 4, dtype=torch.float64)
    testing.assert_close(merge_heads(heads), reference.merge_heads(heads.numpy()), rtol=0, atol=0)
    assert torch.equal(split_heads(merge_heads(heads), n_heads), heads)


def test_split_heads_refuses_uneven_heads():
    with pytest.raises(ValueError, match=r"last dimension 8 of x \(2, 5, 8\) is not divisible by "
                                         r"n_heads = 3"):
        split_heads(torch.zeros(2, 5, 8), 3)


@SETTINGS
@given(lead=st.lists(st.integers(1, 3), max_size=2), n=st.integers(1, 6),
       n_heads=st.integers(1, 4), d_head=st.integers(1, 5))
def test_split_merge_round_trip_on_random_shapes(lead, n, n_heads, d_head):
    x = torch.randn(*lead, n, n_heads * d_head, dtype=torch.float64)
    heads = split_heads(x, n_heads)
    assert heads.shape == (*lead, n_heads, n, d_head)
    assert torch.equal(merge_heads(heads), x)
    np.testing.assert_array_equal(heads.numpy(), reference.split_heads(x.numpy(), n_heads))


# -------------------------------------------------------------------------------- argument checks

def test_check_shape_binds_symbols_and_returns_them():
    assert check_shape("q", torch.zeros(2, 5, 8), ("...", "n", "d_head")) == {"n": 5, "d_head": 8}
    assert check_shape("w", torch.zeros(8, 3), ("d", 3), d=8) == {"d": 8}
    assert check_shape("x", torch.zeros(4), ("...", "d")) == {"d": 4}


@pytest.mark.parametrize("shape, pattern, known, message", [
    ((2, 5, 7), ("...", "n", "d"), {"d": 8}, r"x: expected shape \(\.\.\., n=5, d=8\) with d = 8, got \(2, 5, 7\)"),
    ((5, 7), ("n", "n"), {}, r"x: expected shape \(n=5, n=5\) with n = 5, got \(5, 7\)"),
    ((5,), ("n", "d"), {}, r"x: expected shape \(n, d\), got \(5,\) \(1 dimensions instead of 2\)"),
    ((7,), ("...", "n", "d"), {}, r"got \(7,\) \(1 dimensions instead of at least 2\)"),
    ((5, 7), ("n", 8), {}, r"x: expected shape \(n=5, 8\), got \(5, 7\)"),
])
def test_check_shape_names_the_argument_the_expected_and_the_actual_shape(shape, pattern, known,
                                                                          message):
    with pytest.raises(ValueError, match=message):
        check_shape("x", torch.zeros(shape), pattern, **known)


def test_check_tensor_refuses_other_types():
    with pytest.raises(TypeError, match="w: expected a torch.Tensor, got list"):
        check_tensor("w", [[1.0]])
    with pytest.raises(TypeError, match="w: expected a torch.Tensor, got ndarray"):
        check_shape("w", np.zeros((2, 2)), ("a", "b"))


def test_check_operands_names_mismatched_dtypes_and_devices():
    a, b = torch.zeros(2), torch.zeros(2, dtype=torch.float64)
    with pytest.raises(TypeError, match="x is torch.float32, w is torch.float64"):
        check_same_dtype(x=a, w=b)
    with pytest.raises(TypeError, match="x: expected a floating-point tensor, got torch.int64"):
        check_same_dtype(x=torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="x on cpu, w on meta"):
        check_same_device(x=a, w=torch.zeros(2, device="meta"))
    with pytest.raises(TypeError, match="b: expected a torch.Tensor, got float"):
        check_operands(x=a, b=1.0)
    assert check_same_device(x=a, w=None) == torch.device("cpu")        # None: an absent bias
    assert check_same_dtype(x=a, w=None) == torch.float32
