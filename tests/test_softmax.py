"""llmcore.softmax: reference == loop == matrix == F.softmax along any axis, stable on huge logits,
and all zeros (not NaN) on a fully masked row."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from llmcore import reference, testing
from llmcore.softmax import softmax, softmax_loop, softmax_naive

SETTINGS = settings(max_examples=25, deadline=None)
F64 = dict(rtol=1e-12, atol=1e-14)
INF = float("inf")


@pytest.mark.parametrize("shape, dim", [
    ((7,), -1),
    ((3, 7), -1),            # (n, m) scores
    ((2, 3, 5, 7), -1),      # (b, h, n, m)
    ((3, 7), 0),             # along the other axis
    ((2, 3, 5), 1),
    ((2, 3, 5), -3),
])
def test_softmax_ladder(shape, dim, rng):
    x = testing.randn(rng, *shape, dtype=torch.float64) * 3
    want = reference.softmax(x.numpy(), dim=dim)
    testing.assert_close(softmax_loop(x, dim=dim), want, **F64)
    testing.assert_close(softmax(x, dim=dim), want, **F64)
    testing.assert_close(F.softmax(x, dim=dim), want, **F64)
    x32 = x.float()
    torch.testing.assert_close(softmax(x32, dim=dim), F.softmax(x32, dim=dim))
    torch.testing.assert_close(softmax_loop(x32, dim=dim), F.softmax(x32, dim=dim))


@pytest.mark.parametrize("fn", [softmax, softmax_loop])
def test_rows_are_probabilities_unchanged_by_a_shift(fn, rng):
    x = testing.randn(rng, 4, 9, dtype=torch.float64)
    p = fn(x)
    assert (p > 0).all()
    testing.assert_close(p.sum(dim=-1), torch.ones(4, dtype=torch.float64), **F64)
    testing.assert_close(fn(x + 123.0), p, rtol=1e-10, atol=1e-14)   # adding a constant changes nothing


@pytest.mark.parametrize("fn", [softmax, softmax_loop, reference.softmax])
@pytest.mark.parametrize("scale", [1e4, -1e4, 3e38])
def test_huge_logits_stay_finite_and_equal_the_shifted_form(fn, scale):
    x = torch.tensor([[1.0, 0.5, -2.0, 0.9], [0.0, -1.0, 0.25, -0.5]], dtype=torch.float32) * scale
    arg = x.numpy() if fn is reference.softmax else x
    p = torch.as_tensor(fn(arg)).float()
    assert torch.isfinite(p).all()
    shifted = torch.exp(x - x.amax(dim=-1, keepdim=True))
    torch.testing.assert_close(p, shifted / shifted.sum(dim=-1, keepdim=True))


def test_the_naive_form_overflows_where_the_stable_one_does_not():
    x = torch.tensor([1000.0, 999.0, 0.0])
    assert torch.isnan(softmax_naive(x)).any()                 # inf / inf
    torch.testing.assert_close(softmax(x), F.softmax(x, dim=-1))
    torch.testing.assert_close(softmax_naive(x / 1000), softmax(x / 1000))   # fine when small


@pytest.mark.parametrize("fn", [softmax, softmax_loop, reference.softmax])
def test_fully_masked_rows_give_zeros_not_nan(fn):
    x = torch.tensor([[0.5, -INF, 1.0, -INF],
                      [-INF, -INF, -INF, -INF],                 # a padding query: no key at all
                      [-INF, -INF, 2.0, -INF]], dtype=torch.float64)
    p = torch.as_tensor(fn(x.numpy() if fn is reference.softmax else x))
    assert not torch.isnan(p).any()
    assert p[1].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert p[2].tolist() == [0.0, 0.0, 1.0, 0.0]
    assert p[0, 1] == 0 and p[0, 3] == 0                     # masked keys get exactly zero
    testing.assert_close(p[0], F.softmax(x[0], dim=-1), **F64)
    assert torch.isnan(F.softmax(x[1], dim=-1)).all()         # what torch's own op does instead


def test_softmax_follows_the_device_and_dtype(device, rng):
    x = testing.randn(rng, 2, 5, 7)
    for dtype in (torch.float32, torch.float64):
        out = softmax(x.to(device, dtype))
        assert out.device.type == device.type and out.dtype == dtype
        torch.testing.assert_close(out.cpu(), F.softmax(x.to(dtype), dim=-1))
    masked = torch.full((3, 4), -INF, device=device)
    assert torch.equal(softmax(masked).cpu(), torch.zeros(3, 4))


@pytest.mark.parametrize("fn", [softmax, softmax_loop])
def test_softmax_refuses_a_non_tensor(fn):
    with pytest.raises(TypeError, match="x: expected a torch.Tensor, got list"):
        fn([1.0, 2.0])


@SETTINGS
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3), scale=st.sampled_from([0.1, 10, 1e3]),
       masked=st.floats(0, 0.9), seed=st.integers(0, 2**16), data=st.data())
def test_ladder_on_random_shapes_and_masks(shape, scale, masked, seed, data):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float64) * scale
    x = x.masked_fill(torch.rand(*shape, generator=g) < masked, -INF)
    dim = data.draw(st.integers(-len(shape), len(shape) - 1), label="dim")
    want = reference.softmax(x.numpy(), dim=dim)
    testing.assert_close(softmax(x, dim=dim), want, **F64)
    testing.assert_close(softmax_loop(x, dim=dim), want, **F64)
    sums = softmax(x, dim=dim).sum(dim=dim)
    alive = (x > -INF).any(dim=dim)
    testing.assert_close(sums, alive.double(), **F64)         # 1 per row, 0 where all masked
    assert not math.isnan(sums.sum().item())


def test_inplace_overwrites_its_input_and_equals_the_new_tensor_form(rng):
    x = testing.randn(rng, 2, 3, 5, 7, dtype=torch.float64) * 3
    x[0, 1, 2] = -INF                                         # a fully masked row too
    keep = x.clone()
    want = softmax(x, dim=-1)
    assert torch.equal(x, keep)                               # the default leaves x alone
    got = softmax(x, dim=-1, inplace=True)
    assert got.data_ptr() == x.data_ptr()                     # no new (..., m) buffer
    testing.assert_close(got, want, **F64)
    testing.assert_close(x, want, **F64)


def test_inplace_on_a_computed_tensor_keeps_the_gradient_right(rng):
    a = testing.randn(rng, 4, 6, dtype=torch.float64).requires_grad_()
    b = a.detach().clone().requires_grad_()
    weights = torch.arange(24, dtype=torch.float64).view(4, 6)
    (softmax(a * 2.0, inplace=True) * weights).sum().backward()   # a * 2.0: a buffer we own
    (F.softmax(b * 2.0, dim=-1) * weights).sum().backward()
    testing.assert_close(a.grad, b.grad, rtol=1e-12, atol=1e-12)
