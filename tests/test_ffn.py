"""llmcore.ffn: GELU == F.gelu(approximate="tanh") == the reference; the FFN's loop over tokens and
neurons == two matmuls == the reference == torch's own layers, with f != 4 d allowed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from llmcore import reference, testing
from llmcore.ffn import ffn, ffn_loop, gelu, silu, swiglu, swiglu_loop

SETTINGS = settings(max_examples=15, deadline=None)
F64 = dict(rtol=1e-12, atol=1e-12)


def ffn_weights(rng, d, f, *, bias=True, dtype=torch.float64):
    w_up = testing.randn(rng, d, f, dtype=dtype) * d ** -0.5
    w_down = testing.randn(rng, f, d, dtype=dtype) * f ** -0.5
    b_up = testing.randn(rng, f, dtype=dtype) if bias else None
    b_down = testing.randn(rng, d, dtype=dtype) if bias else None
    return w_up, b_up, w_down, b_down


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4)])
def test_gelu_ladder(shape, rng):
    x = testing.randn(rng, *shape, dtype=torch.float64) * 3
    testing.assert_close(gelu(x), reference.gelu(x.numpy()), **F64)
    testing.assert_close(gelu(x), F.gelu(x, approximate="tanh"), **F64)
    torch.testing.assert_close(gelu(x.float()), F.gelu(x.float(), approximate="tanh"))


def test_gelu_is_the_tanh_form_not_the_exact_erf_one():
    x = torch.linspace(-4, 4, 81, dtype=torch.float64)
    assert (gelu(x) - F.gelu(x)).abs().max() > 1e-5         # the two differ visibly ...
    assert (gelu(x) - F.gelu(x)).abs().max() < 1e-2         # ... but only a little
    assert gelu(torch.tensor(0.0)) == 0.0
    testing.assert_close(gelu(torch.tensor([30.0, -30.0])), [30.0, 0.0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("lead, n, d, f, bias", [
    ((2,), 5, 6, 24, True),     # (b, n, d), f = 4 d
    ((2,), 5, 6, 10, True),     # f != 4 d
    ((), 7, 4, 16, False),      # (n, d), no biases
    ((2, 3), 2, 3, 12, True),   # two leading dimensions
])
def test_ffn_ladder(lead, n, d, f, bias, rng):
    x = testing.randn(rng, *lead, n, d, dtype=torch.float64)
    params = ffn_weights(rng, d, f, bias=bias)
    want = reference.ffn(x.numpy(), *(None if p is None else p.numpy() for p in params))
    testing.assert_close(ffn_loop(x, *params), want, **F64)
    testing.assert_close(ffn(x, *params), want, **F64)
    # torch's own layers: nn.Linear keeps (d_out, d_in) weights and computes x @ W^T
    w_up, b_up, w_down, b_down = (None if p is None else p.float() for p in params)
    up = torch.nn.Linear(d, f, bias=bias)
    down = torch.nn.Linear(f, d, bias=bias)
    with torch.no_grad():
        up.weight.copy_(w_up.T)
        down.weight.copy_(w_down.T)
        if bias:
            up.bias.copy_(b_up)
            down.bias.copy_(b_down)
        want32 = down(F.gelu(up(x.float()), approximate="tanh"))
    torch.testing.assert_close(ffn(x.float(), w_up, b_up, w_down, b_down), want32)


def test_ffn_acts_on_each_token_alone(rng):
    x = testing.randn(rng, 6, 4, dtype=torch.float64)
    params = ffn_weights(rng, 4, 16)
    out = ffn(x, *params)
    for i in range(6):
        testing.assert_close(ffn(x[i:i + 1], *params), out[i:i + 1], **F64)


def test_ffn_follows_the_device(device, rng):
    x = testing.randn(rng, 2, 5, 6)
    params = ffn_weights(rng, 6, 24, dtype=torch.float32)
    want = ffn(x, *params)
    moved = [p.to(device) for p in params]
    for fn in (ffn, ffn_loop):
        out = fn(x.to(device), *moved)
        assert out.device.type == device.type
        torch.testing.assert_close(out.cpu(), want)


@SETTINGS
@given(b=st.integers(1, 2), n=st.integers(1, 4), d=st.integers(1, 6), f=st.integers(1, 12),
       seed=st.integers(0, 2**16))
def test_ladder_on_random_shapes(b, n, d, f, seed):
    rng = np.random.default_rng(seed)
    x = testing.randn(rng, b, n, d, dtype=torch.float64)
    params = ffn_weights(rng, d, f)
    want = reference.ffn(x.numpy(), *(p.numpy() for p in params))
    testing.assert_close(ffn_loop(x, *params), want, **F64)
    testing.assert_close(ffn(x, *params), want, **F64)


X = torch.zeros(2, 5, 6)


@pytest.mark.parametrize("fn", [ffn, ffn_loop])
@pytest.mark.parametrize("x, w_up, b_up, w_down, b_down, error, message", [
    (X, torch.zeros(6, 24), None, torch.zeros(23, 6), None, ValueError, r"w_down: expected shape \(f=24, d=6\) with f = 24, got \(23, 6\)"),
    (X, torch.zeros(6, 24), None, torch.zeros(24, 5), None, ValueError, r"w_down: expected shape \(f=24, d=6\) with d = 6, got \(24, 5\)"),
    (torch.zeros(2, 5, 7), torch.zeros(6, 24), None, torch.zeros(24, 6), None, ValueError, r"x: expected shape \(\.\.\., n=5, d=6\) with d = 6, got \(2, 5, 7\)"),
    (X, torch.zeros(6, 24), torch.zeros(6), torch.zeros(24, 6), None, ValueError, r"b_up: expected shape \(f=24\) with f = 24, got \(6,\)"),
    (X, torch.zeros(6, 24), None, torch.zeros(24, 6), torch.zeros(24), ValueError, r"b_down: expected shape \(d=6\) with d = 6, got \(24,\)"),
    (X, torch.zeros(6, 24, dtype=torch.float64), None, torch.zeros(24, 6), None, TypeError, "x is torch.float32, w_up is torch.float64"),
    (X, torch.zeros(6, 24), None, torch.zeros(24, 6, device="meta"), None, ValueError, "x on cpu, w_up on cpu, w_down on meta"),
])
def test_ffn_refuses_bad_inputs(fn, x, w_up, b_up, w_down, b_down, error, message):
    with pytest.raises(error, match=message):
        fn(x, w_up, b_up, w_down, b_down)


def swiglu_weights(rng, d, f, dtype=torch.float64):
    return (testing.randn(rng, d, f, dtype=dtype) * d ** -0.5,
            testing.randn(rng, d, f, dtype=dtype) * d ** -0.5,
            testing.randn(rng, f, d, dtype=dtype) * f ** -0.5)


def test_silu_ladder(rng):
    x = testing.randn(rng, 3, 5, dtype=torch.float64) * 4
    testing.assert_close(silu(x), reference.silu(x.numpy()), **F64)
    testing.assert_close(silu(x), F.silu(x), **F64)


@pytest.mark.parametrize("lead, n, d, f", [((2,), 5, 6, 16), ((), 3, 4, 10), ((2, 3), 2, 3, 8)])
def test_swiglu_ladder(lead, n, d, f, rng):
    x = testing.randn(rng, *lead, n, d, dtype=torch.float64)
    w_gate, w_up, w_down = swiglu_weights(rng, d, f)
    want = reference.swiglu(x.numpy(), w_gate.numpy(), w_up.numpy(), w_down.numpy())
    testing.assert_close(swiglu_loop(x, w_gate, w_up, w_down), want, **F64)
    testing.assert_close(swiglu(x, w_gate, w_up, w_down), want, **F64)
    gate, up, down = (torch.nn.Linear(d, f, bias=False), torch.nn.Linear(d, f, bias=False),
                      torch.nn.Linear(f, d, bias=False))
    with torch.no_grad():
        for layer, w in ((gate, w_gate), (up, w_up), (down, w_down)):
            layer.weight.copy_(w.T.float())
        want32 = down(F.silu(gate(x.float())) * up(x.float()))
    torch.testing.assert_close(swiglu(x.float(), w_gate.float(), w_up.float(), w_down.float()), want32)


def test_swiglu_has_three_matrices_where_the_gelu_ffn_has_two(rng):
    d, f = 6, 16
    w_gate, w_up, w_down = swiglu_weights(rng, d, f)
    x = testing.randn(rng, 4, d, dtype=torch.float64)
    assert sum(w.numel() for w in (w_gate, w_up, w_down)) == 3 * d * f     # GELU FFN: 2 d f
    zero_gate = torch.zeros_like(w_gate)                 # silu(0) = 0 closes every gate
    testing.assert_close(swiglu(x, zero_gate, w_up, w_down), torch.zeros(4, d, dtype=torch.float64),
                         rtol=0, atol=0)


def test_swiglu_follows_the_device(device, rng):
    x, (w_gate, w_up, w_down) = testing.randn(rng, 2, 5, 6), swiglu_weights(rng, 6, 10, torch.float32)
    out = swiglu(*(t.to(device) for t in (x, w_gate, w_up, w_down)))
    assert out.device.type == device.type
    torch.testing.assert_close(out.cpu(), swiglu(x, w_gate, w_up, w_down))
    assert swiglu(*(t.to("meta") for t in (x, w_gate, w_up, w_down))).device.type == "meta"


def test_swiglu_refuses_bad_inputs():
    with pytest.raises(ValueError, match="w_up: expected shape"):
        swiglu(torch.zeros(2, 3, 4), torch.zeros(4, 8), torch.zeros(4, 7), torch.zeros(8, 4))
    with pytest.raises(ValueError, match="w_down: expected shape"):
        swiglu_loop(torch.zeros(2, 3, 4), torch.zeros(4, 8), torch.zeros(4, 8), torch.zeros(4, 8))
