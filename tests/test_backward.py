"""llmcore.backward: every matrix-formula gradient equals torch.autograd's (float64, shapes with
n != d and n != m, causal or not), the loss equals F.cross_entropy, and AdamW written out equals
torch.optim.AdamW step for step."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from llmcore.attention import attention
from llmcore.backward import (adamw_step, attention_head_backward, cross_entropy,
                              cross_entropy_backward, linear_backward, softmax_backward,
                              softmax_jacobian)

F64 = dict(dtype=torch.float64)


def leaf(*shape, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, **F64).to(device).requires_grad_()


@pytest.mark.parametrize("n, v", [(1, 3), (7, 11), (16, 256)])
def test_cross_entropy_and_its_gradient_match_autograd(n, v, device):
    logits = leaf(n, v, seed=n, device=device)
    targets = torch.randint(0, v, (n,), generator=torch.Generator().manual_seed(v)).to(device)
    loss = cross_entropy(logits, targets)
    torch.testing.assert_close(loss, F.cross_entropy(logits, targets))
    (want,) = torch.autograd.grad(F.cross_entropy(logits, targets), logits)
    torch.testing.assert_close(cross_entropy_backward(logits.detach(), targets), want)


def test_cross_entropy_is_stable_for_huge_logits():
    logits = torch.tensor([[1000.0, 0.0, -1000.0], [0.0, 2000.0, 1999.0]], **F64)
    targets = torch.tensor([0, 2])
    got = cross_entropy(logits, targets)
    assert torch.isfinite(got)
    torch.testing.assert_close(got, F.cross_entropy(logits, targets))


@pytest.mark.parametrize("n, d_in, d_out", [(5, 3, 4), (1, 8, 2), (9, 6, 6)])
def test_linear_backward_matches_autograd(n, d_in, d_out, device):
    x, w, b = leaf(n, d_in, seed=1, device=device), leaf(d_in, d_out, seed=2, device=device), \
        leaf(d_out, seed=3, device=device)
    d_y = leaf(n, d_out, seed=4, device=device).detach()
    y = x @ w + b
    want = torch.autograd.grad(y, (x, w, b), d_y)
    got = linear_backward(x.detach(), w.detach(), d_y)
    for name, g, wnt in zip(("dx", "dw", "db"), got, want):
        torch.testing.assert_close(g, wnt, msg=name)


def test_softmax_backward_is_the_jacobian_product_without_the_jacobian(device):
    s = leaf(4, 6, seed=5, device=device)
    a = torch.softmax(s, dim=-1)
    d_a = leaf(4, 6, seed=6, device=device).detach()
    (want,) = torch.autograd.grad(a, s, d_a)
    got = softmax_backward(a.detach(), d_a)
    torch.testing.assert_close(got, want)
    for row in range(4):                              # the explicit Jacobian, row by row
        jac = softmax_jacobian(a[row].detach())
        torch.testing.assert_close(jac @ d_a[row], got[row])
        torch.testing.assert_close(jac, torch.autograd.functional.jacobian(
            lambda r: torch.softmax(r, -1), s[row].detach()))


@pytest.mark.parametrize("n, m, d_head, causal", [(4, 4, 3, True), (2, 6, 5, True),
                                                   (3, 7, 4, False), (1, 1, 2, True)])
def test_attention_head_backward_matches_autograd(n, m, d_head, causal, device):
    q, k, v = leaf(n, d_head, seed=7, device=device), leaf(m, d_head, seed=8, device=device), \
        leaf(m, d_head, seed=9, device=device)
    d_out = leaf(n, d_head, seed=10, device=device).detach()
    out = attention(q, k, v, causal=causal)
    want = torch.autograd.grad(out, (q, k, v), d_out)
    got = attention_head_backward(q.detach(), k.detach(), v.detach(), d_out, causal=causal)
    for name, g, wnt in zip(("dq", "dk", "dv"), got, want):
        torch.testing.assert_close(g, wnt, msg=name)


def test_masked_keys_get_no_gradient():
    """Only query 0 carries a gradient, and causally it sees key 0 alone: keys 1 and 2 (its
    future) must receive nothing."""
    q, k, v = (torch.randn(3, 2, **F64) for _ in range(3))
    d_out = torch.zeros(3, 2, **F64)
    d_out[0] = 1.0
    _, d_k, d_v = attention_head_backward(q, k, v, d_out, causal=True)
    assert torch.equal(d_v[1:], torch.zeros(2, 2, **F64))
    assert torch.equal(d_k[1:], torch.zeros(2, 2, **F64))
    assert not torch.equal(d_v[0], torch.zeros(2, **F64))


def test_adamw_written_out_equals_torch_optim_adamw():
    torch.manual_seed(0)
    param = torch.randn(4, 3, **F64)
    ours, m, v = param.clone(), torch.zeros_like(param), torch.zeros_like(param)
    theirs = torch.nn.Parameter(param.clone())
    settings = dict(lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    optimizer = torch.optim.AdamW([theirs], **settings)
    for step in range(1, 6):
        grad = torch.randn(4, 3, **F64)
        theirs.grad = grad.clone()
        optimizer.step()
        ours, m, v = adamw_step(ours, grad, m, v, step, lr=0.01, beta1=0.9, beta2=0.95, eps=1e-8,
                                weight_decay=0.1)
        torch.testing.assert_close(ours, theirs.detach(), msg=f"step {step}")
    assert not torch.equal(ours, param)


def test_bad_inputs_are_named():
    with pytest.raises(TypeError, match="targets: expected torch.long"):
        cross_entropy(torch.zeros(2, 3), torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 3\)"):
        cross_entropy(torch.zeros(2, 3), torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="w"):
        linear_backward(torch.zeros(2, 3), torch.zeros(4, 5), torch.zeros(2, 5))
    with pytest.raises(ValueError, match="same shape"):
        softmax_backward(torch.zeros(2, 3), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="step counts from 1"):
        adamw_step(torch.zeros(2), torch.zeros(2), torch.zeros(2), torch.zeros(2), 0, lr=0.1)
    assert math.isclose(float(softmax_jacobian(torch.tensor([0.5, 0.5])).sum()), 0.0)


def test_meta_device_runs_the_formulas_without_memory():
    meta = dict(device="meta")
    dq, dk, dv = attention_head_backward(torch.empty(3, 4, **meta), torch.empty(5, 4, **meta),
                                         torch.empty(5, 4, **meta), torch.empty(3, 4, **meta),
                                         causal=True)
    assert dq.shape == (3, 4) and dk.shape == dv.shape == (5, 4) and dq.device.type == "meta"
    dx, dw, db = linear_backward(torch.empty(2, 3, **meta), torch.empty(3, 4, **meta),
                                 torch.empty(2, 4, **meta))
    assert (dx.shape, dw.shape, db.shape) == ((2, 3), (3, 4), (4,))
