"""llmcore.rope: the loop over pairs == the block-diagonal matrix == the elementwise cos/sin form
== the NumPy reference; scores depend only on relative position; the paper's neighbour pairing is
the same rotation after a permutation; positions per sequence; meta and CUDA devices."""

from __future__ import annotations

import pytest
import torch

from llmcore import reference, testing
from llmcore.rope import (ROPE_BASE, apply_rope, interleaved_order, rope_frequencies, rope_loop,
                          rope_matrix, rotate_half)

F64 = dict(rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("shape, base", [
    ((5, 8), ROPE_BASE),            # (n, d_head)
    ((2, 3, 4, 6), ROPE_BASE),      # (b, h, n, d_head)
    ((3, 2), 100.0),                # one pair, another base
])
def test_rope_ladder(shape, base, rng):
    n, d_head = shape[-2], shape[-1]
    x = testing.randn(rng, *shape, dtype=torch.float64)
    positions = torch.tensor([0, 3, 1, 17, 40][:n])
    want = reference.apply_rope(x.numpy(), positions.numpy(), base)
    testing.assert_close(rope_loop(x, positions, base), want, **F64)
    testing.assert_close(apply_rope(x, positions, base), want, **F64)
    by_matrix = torch.stack([x[..., t, :] @ rope_matrix(int(p), d_head, base).T
                             for t, p in enumerate(positions)], dim=-2)
    testing.assert_close(by_matrix, want, **F64)
    torch.testing.assert_close(apply_rope(x.float(), positions, base), torch.from_numpy(want).float())


def test_positions_per_sequence(rng):
    x = testing.randn(rng, 2, 3, 4, 8, dtype=torch.float64)          # (b, h, n, d_head)
    positions = torch.tensor([[0, 1, 2, 3], [5, 6, 7, 8]])            # (b, n)
    want = reference.apply_rope(x.numpy(), positions.numpy())
    testing.assert_close(apply_rope(x, positions), want, **F64)
    testing.assert_close(rope_loop(x, positions), want, **F64)
    for s in range(2):                                               # each sequence alone
        testing.assert_close(apply_rope(x[s], positions[s]), want[s], **F64)


def test_matrix_is_a_rotation_and_the_identity_at_position_zero():
    for position in (0, 1, 7, 1000):
        r = rope_matrix(position, 10)
        testing.assert_close(r @ r.T, torch.eye(10, dtype=torch.float64), **F64)
    testing.assert_close(rope_matrix(0, 10), torch.eye(10, dtype=torch.float64), **F64)
    testing.assert_close(rope_matrix(3, 10) @ rope_matrix(4, 10), rope_matrix(7, 10), **F64)


def test_neighbour_pairs_are_block_diagonal_after_the_permutation():
    d_head = 8
    order = interleaved_order(d_head)
    assert order == [0, 4, 1, 5, 2, 6, 3, 7]
    r = rope_matrix(5, d_head)
    paper = r[order][:, order]                    # the same rotation, features paired (2i, 2i+1)
    block = torch.block_diag(*[paper[2 * i:2 * i + 2, 2 * i:2 * i + 2] for i in range(4)])
    testing.assert_close(paper, block, rtol=0, atol=0)   # nothing outside the 2 x 2 blocks
    theta = rope_frequencies(d_head, dtype=torch.float64)
    testing.assert_close(paper[2:4, 2:4], [[torch.cos(5 * theta[1]), -torch.sin(5 * theta[1])],
                                           [torch.sin(5 * theta[1]), torch.cos(5 * theta[1])]], **F64)


@pytest.mark.parametrize("shift", [0, 1, 5, 33])
def test_scores_depend_only_on_relative_position(shift, rng):
    q, k = testing.randn(rng, 1, 16, dtype=torch.float64), testing.randn(rng, 1, 16, dtype=torch.float64)
    for m, n in [(3, 1), (10, 2), (7, 7), (2, 9)]:
        base_score = apply_rope(q, torch.tensor([m])) @ apply_rope(k, torch.tensor([n])).T
        moved = apply_rope(q, torch.tensor([m + shift])) @ apply_rope(k, torch.tensor([n + shift])).T
        testing.assert_close(moved, base_score, **F64)
    a = apply_rope(q, torch.tensor([4])) @ apply_rope(k, torch.tensor([1])).T      # m - n = 3
    b = apply_rope(q, torch.tensor([4])) @ apply_rope(k, torch.tensor([2])).T      # m - n = 2
    assert not torch.allclose(a, b)                 # a different offset gives a different score


def test_rotation_keeps_length_and_rotate_half_is_a_quarter_turn(rng):
    x = testing.randn(rng, 6, 12, dtype=torch.float64)
    out = apply_rope(x, torch.arange(6) * 11)
    testing.assert_close(out.norm(dim=-1), x.norm(dim=-1), **F64)
    testing.assert_close(rotate_half(rotate_half(x)), -x, rtol=0, atol=0)


def test_meta_device_makes_nothing_on_the_cpu():
    x = torch.empty(2, 3, 5, 8, device="meta")
    out = apply_rope(x, torch.arange(5, device="meta").expand(2, 5))
    assert out.device.type == "meta" and out.shape == x.shape


def test_follows_the_device(device, rng):
    x = testing.randn(rng, 2, 3, 5, 8)
    positions = torch.arange(3, 8)
    out = apply_rope(x.to(device), positions.to(device))
    assert out.device.type == device.type
    torch.testing.assert_close(out.cpu(), apply_rope(x, positions))


@pytest.mark.parametrize("x, positions, error, message", [
    (torch.zeros(4, 7), torch.arange(4), ValueError, "d_head must be a positive even number"),
    (torch.zeros(4, 8), torch.arange(5), ValueError, r"positions: expected shape \(4\)"),
    (torch.zeros(4, 8), torch.arange(4.0), TypeError, "integer positions"),
    (torch.zeros(4, 8), torch.arange(4, device="meta"), ValueError, "positions are on meta"),
    (torch.zeros(2, 3, 4, 8), torch.zeros(3, 4, dtype=torch.long), ValueError, r"expected shape \(2, 4\)"),
])
def test_refuses_bad_inputs(x, positions, error, message):
    for fn in (apply_rope, rope_loop):
        with pytest.raises(error, match=message):
            fn(x, positions)
