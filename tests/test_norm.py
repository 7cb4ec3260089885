"""llmcore.norm: layer norm's loop == matrix == the reference == F.layer_norm (biased variance, eps
inside the square root: the detail annotated-transformer got wrong)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from llmcore import reference, testing
from llmcore.norm import LN_EPS, RMS_EPS, layer_norm, layer_norm_loop, rms_norm, rms_norm_loop

SETTINGS = settings(max_examples=20, deadline=None)
F64 = dict(rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("fn", [layer_norm, layer_norm_loop])
@pytest.mark.parametrize("shape, eps", [
    ((5, 8), LN_EPS),          # (n, d)
    ((2, 5, 8), LN_EPS),       # (b, n, d)
    ((2, 3, 4, 6), 1e-6),      # two leading dimensions, another eps
    ((7,), 0.1),               # one token; a large eps shows where it enters
])
def test_layer_norm_ladder(fn, shape, eps, rng):
    d = shape[-1]
    x = testing.randn(rng, *shape, dtype=torch.float64) * 2 + 0.5
    scale, shift = testing.randn(rng, d, dtype=torch.float64), testing.randn(rng, d, dtype=torch.float64)
    want = reference.layer_norm(x.numpy(), scale.numpy(), shift.numpy(), eps)
    testing.assert_close(fn(x, scale, shift, eps), want, **F64)
    testing.assert_close(F.layer_norm(x, (d,), scale, shift, eps), want, **F64)
    x32, s32, b32 = x.float(), scale.float(), shift.float()
    torch.testing.assert_close(fn(x32, s32, b32, eps), F.layer_norm(x32, (d,), s32, b32, eps))


def test_layer_norm_equals_torch_nn_layer_norm_module(rng):
    x = testing.randn(rng, 2, 5, 8)
    module = torch.nn.LayerNorm(8)                            # eps 1e-5, like LN_EPS
    with torch.no_grad():
        module.weight.copy_(testing.randn(rng, 8))
        module.bias.copy_(testing.randn(rng, 8))
        want = module(x)
    assert module.eps == LN_EPS
    torch.testing.assert_close(layer_norm(x, module.weight.detach(), module.bias.detach()), want)


def test_the_unbiased_variance_would_be_a_different_norm(rng):
    x = testing.randn(rng, 4, 6, dtype=torch.float64)
    ones, zeros = torch.ones(6, dtype=torch.float64), torch.zeros(6, dtype=torch.float64)
    out = layer_norm(x, ones, zeros, eps=0.0)
    testing.assert_close(out.mean(dim=-1), torch.zeros(4, dtype=torch.float64), rtol=0, atol=1e-12)
    testing.assert_close(out.var(dim=-1, unbiased=False), torch.ones(4, dtype=torch.float64), **F64)
    unbiased = (x - x.mean(-1, keepdim=True)) / x.std(-1, keepdim=True)
    assert not torch.allclose(out, unbiased)


@pytest.mark.parametrize("fn", [layer_norm, layer_norm_loop])
def test_a_constant_row_gives_the_shift_not_nan(fn):
    x = torch.full((3, 5), 7.0)
    scale, shift = torch.full((5,), 2.0), torch.arange(5.0)
    out = fn(x, scale, shift)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, shift.expand(3, 5))


def test_layer_norm_follows_the_device(device, rng):
    x, scale, shift = testing.randn(rng, 2, 5, 8), testing.randn(rng, 8), testing.randn(rng, 8)
    want = layer_norm(x, scale, shift)
    for fn in (layer_norm, layer_norm_loop):
        out = fn(x.to(device), scale.to(device), shift.to(device))
        assert out.device.type == device.type
        torch.testing.assert_close(out.cpu(), want)


@SETTINGS
@given(lead=st.lists(st.integers(1, 3), max_size=2), d=st.integers(1, 9),
       offset=st.floats(-100, 100), seed=st.integers(0, 2**16))
def test_ladder_on_random_shapes(lead, d, offset, seed):
    rng = np.random.default_rng(seed)
    x = testing.randn(rng, *lead, d, dtype=torch.float64) + offset
    scale, shift = testing.randn(rng, d, dtype=torch.float64), testing.randn(rng, d, dtype=torch.float64)
    want = reference.layer_norm(x.numpy(), scale.numpy(), shift.numpy())
    testing.assert_close(layer_norm(x, scale, shift), want, rtol=1e-8, atol=1e-9)
    testing.assert_close(layer_norm_loop(x, scale, shift), want, rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("fn", [layer_norm, layer_norm_loop])
@pytest.mark.parametrize("x, scale, shift, error, message", [
    (torch.zeros(2, 5, 8), torch.zeros(7), torch.zeros(8), ValueError, r"scale: expected shape \(d=8\) with d = 8, got \(7,\)"),
    (torch.zeros(2, 5, 8), torch.zeros(8), torch.zeros(8, 1), ValueError, r"shift: expected shape \(d=8\), got \(8, 1\)"),
    (torch.zeros(2, 5, 8), torch.zeros(8, dtype=torch.float64), torch.zeros(8), TypeError, "x is torch.float32, scale is torch.float64"),
    (torch.zeros(2, 5, 8), torch.zeros(8), torch.zeros(8, device="meta"), ValueError, "shift on meta"),
])
def test_layer_norm_refuses_bad_inputs(fn, x, scale, shift, error, message):
    with pytest.raises(error, match=message):
        fn(x, scale, shift)


@pytest.mark.parametrize("fn", [rms_norm, rms_norm_loop])
@pytest.mark.parametrize("shape, eps", [((5, 8), RMS_EPS), ((2, 3, 4, 6), 1e-5), ((7,), 0.1)])
def test_rms_norm_ladder(fn, shape, eps, rng):
    d = shape[-1]
    x = testing.randn(rng, *shape, dtype=torch.float64) * 2 + 0.5
    weight = testing.randn(rng, d, dtype=torch.float64)
    want = reference.rms_norm(x.numpy(), weight.numpy(), eps)
    testing.assert_close(fn(x, weight, eps), want, **F64)
    testing.assert_close(F.rms_norm(x, (d,), weight, eps), want, **F64)
    torch.testing.assert_close(fn(x.float(), weight.float(), eps),
                               F.rms_norm(x.float(), (d,), weight.float(), eps))


def test_rms_norm_keeps_the_mean_that_layer_norm_removes(rng):
    x = testing.randn(rng, 4, 6, dtype=torch.float64) + 3.0
    ones, zeros = torch.ones(6, dtype=torch.float64), torch.zeros(6, dtype=torch.float64)
    out = rms_norm(x, ones, eps=0.0)
    testing.assert_close(out.pow(2).mean(dim=-1), torch.ones(4, dtype=torch.float64), **F64)
    assert (out.mean(dim=-1) > 0.5).all()                      # the offset survives ...
    centred = x - x.mean(dim=-1, keepdim=True)                 # ... and on centred rows the two agree
    testing.assert_close(rms_norm(centred, ones, eps=0.0), layer_norm(centred, ones, zeros, eps=0.0),
                         **F64)


def test_rms_norm_half_precision_normalises_in_float32(rng):
    x, weight = testing.randn(rng, 3, 16) * 100, testing.randn(rng, 16)
    got = rms_norm(x.bfloat16(), weight.bfloat16())
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), rms_norm(x, weight), rtol=2e-2, atol=2e-2)


def test_rms_norm_follows_the_device(device, rng):
    x, weight = testing.randn(rng, 2, 5, 8), testing.randn(rng, 8)
    for fn in (rms_norm, rms_norm_loop):
        out = fn(x.to(device), weight.to(device))
        assert out.device.type == device.type
        torch.testing.assert_close(out.cpu(), rms_norm(x, weight))
    assert rms_norm(x.to("meta"), weight.to("meta")).device.type == "meta"


@pytest.mark.parametrize("fn", [rms_norm, rms_norm_loop])
def test_rms_norm_refuses_bad_inputs(fn):
    with pytest.raises(ValueError, match=r"weight: expected shape \(d=8\) with d = 8, got \(7,\)"):
        fn(torch.zeros(2, 8), torch.zeros(7))
    with pytest.raises(TypeError, match="x is torch.float32, weight is torch.float64"):
        fn(torch.zeros(2, 8), torch.zeros(8, dtype=torch.float64))
