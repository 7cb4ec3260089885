"""llmcore.matmul: the ladder reference == loop == matrix == torch for the product and the projection
x @ w + b, on shapes where n, k (d_in) and m (d_out) all differ, and the errors that name arguments."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from llmcore import reference, testing
from llmcore.matmul import dot_loop, linear, linear_loop, matmul, matmul_loop

SETTINGS = settings(max_examples=25, deadline=None)
F64 = dict(rtol=1e-12, atol=1e-12)          # between our own rungs, in float64


@pytest.mark.parametrize("n, k, m", [
    (3, 5, 7),       # every size different: a swapped loop bound cannot pass
    (7, 5, 3),
    (1, 4, 6),       # one token
    (6, 1, 2),       # an outer product
    (4, 4, 4),       # square (the only case a wrong bound gets right)
])
def test_matmul_ladder(n, k, m, rng):
    a, b = testing.randn(rng, n, k, dtype=torch.float64), testing.randn(rng, k, m, dtype=torch.float64)
    want = reference.matmul(a.numpy(), b.numpy())
    testing.assert_close(matmul_loop(a, b), want, **F64)
    testing.assert_close(matmul(a, b), want, **F64)
    testing.assert_close(a @ b, want, **F64)


def test_matmul_broadcasts_leading_dimensions(rng):
    a, b = testing.randn(rng, 2, 3, 4, 5), testing.randn(rng, 5, 6)
    out = matmul(a, b)
    assert out.shape == (2, 3, 4, 6)
    for i in range(2):
        torch.testing.assert_close(out[i], torch.stack([matmul_loop(a[i, j], b) for j in range(3)]))


@pytest.mark.parametrize("k", [1, 5, 17])
def test_dot_loop_matches_torch_dot(k, rng):
    a, b = testing.randn(rng, k, dtype=torch.float64), testing.randn(rng, k, dtype=torch.float64)
    out = dot_loop(a, b)
    assert out.shape == () and out.dtype == torch.float64
    testing.assert_close(out, torch.dot(a, b), **F64)


@pytest.mark.parametrize("x_shape, d_out, bias", [
    ((5, 7), 3, True),          # (n, d_in) -> (n, d_out)
    ((2, 5, 7), 3, True),       # (b, n, d_in)
    ((2, 5, 7), 3, False),      # no bias
    ((3, 2, 4, 6), 9, True),    # two leading dimensions
    ((1, 8), 8, True),          # one token, d_in == d_out
])
def test_linear_ladder(x_shape, d_out, bias, rng):
    d_in = x_shape[-1]
    x = testing.randn(rng, *x_shape, dtype=torch.float64)
    w = testing.randn(rng, d_in, d_out, dtype=torch.float64)
    b = testing.randn(rng, d_out, dtype=torch.float64) if bias else None
    want = reference.linear(x.numpy(), w.numpy(), None if b is None else b.numpy())
    testing.assert_close(linear_loop(x, w, b), want, **F64)
    testing.assert_close(linear(x, w, b), want, **F64)
    # torch's own op stores the weight transposed, (d_out, d_in), and computes x @ weight^T
    x32, w32 = x.float(), w.float()
    b32 = None if b is None else b.float()
    torch.testing.assert_close(linear(x32, w32, b32), F.linear(x32, w32.T, b32))
    torch.testing.assert_close(linear_loop(x32, w32, b32), F.linear(x32, w32.T, b32))


def test_linear_rows_are_independent(rng):
    """Each token is projected on its own: a row's output depends on that row only."""
    x, w, b = testing.randn(rng, 6, 4), testing.randn(rng, 4, 5), testing.randn(rng, 5)
    out = linear(x, w, b)
    x2 = x.clone()
    x2[3] += 10.0
    changed = (linear(x2, w, b) != out).any(dim=-1)
    assert changed.tolist() == [False, False, False, True, False, False]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_forms_follow_the_input_dtype_and_device(dtype, device, rng):
    x, w, b = (testing.randn(rng, *s, device=device, dtype=dtype) for s in [(2, 5, 7), (7, 3), (3,)])
    for out in (linear(x, w, b), linear_loop(x, w, b), matmul(x, w), matmul_loop(x[0], w)):
        assert out.dtype == dtype and out.device.type == device.type


def test_cpu_and_device_agree(device, rng):
    x, w, b = testing.randn(rng, 2, 5, 7), testing.randn(rng, 7, 3), testing.randn(rng, 3)
    on_device = [t.to(device) for t in (x, w, b)]
    torch.testing.assert_close(linear(*on_device).cpu(), linear(x, w, b))
    torch.testing.assert_close(linear_loop(*on_device).cpu(), linear(x, w, b))
    torch.testing.assert_close(matmul_loop(on_device[0][1], on_device[1]).cpu(), x[1] @ w)


@SETTINGS
@given(n=st.integers(1, 6), k=st.integers(1, 6), m=st.integers(1, 6), batch=st.integers(1, 3),
       seed=st.integers(0, 2**16))
def test_ladder_on_random_shapes(n, k, m, batch, seed):
    rng = torch.Generator().manual_seed(seed)
    a = torch.randn(n, k, generator=rng, dtype=torch.float64)
    b = torch.randn(k, m, generator=rng, dtype=torch.float64)
    x = torch.randn(batch, n, k, generator=rng, dtype=torch.float64)
    bias = torch.randn(m, generator=rng, dtype=torch.float64)
    testing.assert_close(matmul_loop(a, b), reference.matmul(a.numpy(), b.numpy()), **F64)
    testing.assert_close(linear_loop(x, b, bias), linear(x, b, bias), **F64)
    testing.assert_close(linear(x, b, bias), reference.linear(x.numpy(), b.numpy(), bias.numpy()),
                         **F64)


# ------------------------------------------------------------------------------------ bad inputs

@pytest.mark.parametrize("fn", [linear, linear_loop])
@pytest.mark.parametrize("x, w, b, error, message", [
    (torch.zeros(2, 5, 7), torch.zeros(8, 3), None, ValueError, r"x: expected shape \(\.\.\., n=5, d_in=8\) with d_in = 8, got \(2, 5, 7\)"),
    (torch.zeros(5, 8), torch.zeros(8, 3), torch.zeros(4), ValueError, r"b: expected shape \(d_out=3\) with d_out = 3, got \(4,\)"),
    (torch.zeros(5, 8), torch.zeros(8), None, ValueError, r"w: expected shape \(d_in, d_out\), got \(8,\)"),
    (torch.zeros(5, 8), torch.zeros(8, 3, dtype=torch.float64), None, TypeError, "x is torch.float32, w is torch.float64"),
    (torch.zeros(5, 8, dtype=torch.long), torch.zeros(8, 3, dtype=torch.long), None, TypeError, "x: expected a floating-point tensor, got torch.int64"),
    (torch.zeros(5, 8), torch.zeros(8, 3, device="meta"), None, ValueError, "x on cpu, w on meta"),
    ([[0.0] * 8], torch.zeros(8, 3), None, TypeError, "x: expected a torch.Tensor, got list"),
])
def test_linear_refuses_bad_inputs(fn, x, w, b, error, message):
    with pytest.raises(error, match=message):
        fn(x, w, b)


@pytest.mark.parametrize("fn", [matmul, matmul_loop])
@pytest.mark.parametrize("a, b, error, message", [
    (torch.zeros(5, 7), torch.zeros(8, 3), ValueError, r"b: expected shape .*k=7, m\) with k = 7, got \(8, 3\)"),
    (torch.zeros(5, 7), torch.zeros(7, 3, dtype=torch.float64), TypeError, "a is torch.float32, b is torch.float64"),
    (torch.zeros(5, 7), torch.zeros(7, 3, device="meta"), ValueError, "a on cpu, b on meta"),
])
def test_matmul_refuses_bad_inputs(fn, a, b, error, message):
    with pytest.raises(error, match=message):
        fn(a, b)


def test_loops_refuse_what_they_cannot_loop_over():
    with pytest.raises(ValueError, match=r"a: expected shape \(n, k\), got \(2, 5, 7\)"):
        matmul_loop(torch.zeros(2, 5, 7), torch.zeros(7, 3))
    with pytest.raises(ValueError, match=r"b: expected shape \(k=3\) with k = 3, got \(4,\)"):
        dot_loop(torch.zeros(3), torch.zeros(4))
