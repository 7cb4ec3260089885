"""llmcheck.recorder' AUTOGRAD policy: every way to have torch (or llmcore) differentiate is refused,
whatever Python entry point reaches it, and a forward pass on tensors that require grad is not."""

from __future__ import annotations

import pytest
import torch

import llmcore.backward
from llmcheck.recorder import AUTOGRAD, NotAllowedError, Policy, forbid
from llmcheck.cases import RECORD_MIME, Test as ExerciseTest

X = torch.arange(12.0, dtype=torch.float64).reshape(3, 4) / 10
W = torch.arange(8.0, dtype=torch.float64).reshape(4, 2) / 10 - 0.3
G = torch.ones(3, 2, dtype=torch.float64)


def _leaf() -> torch.Tensor:
    return X.clone().requires_grad_()


def _forward_ad():
    import torch.autograd.forward_ad as forward_ad
    with forward_ad.dual_level():
        dual = forward_ad.make_dual(X, torch.ones_like(X))
        return forward_ad.unpack_dual(dual @ W).tangent


def _engine():
    from torch.autograd import Variable
    return Variable._execution_engine.run_backward(
        (_leaf() @ W,), (G,), False, False, (), allow_unreachable=True, accumulate_grad=True)


class _Doubled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t):
        return t * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


@pytest.mark.parametrize("call", [
    lambda: torch.autograd.grad((leaf := _leaf()) @ W, leaf, G),
    lambda: (_leaf() @ W).backward(G),
    lambda: torch.autograd.backward((_leaf() @ W,), (G,)),
    lambda: torch.func.grad(lambda t: ((t @ W) * G).sum())(X),
    lambda: torch.func.vjp(lambda t: t @ W, X)[1](G),
    lambda: torch.func.jacrev(lambda t: t @ W)(X),
    lambda: torch.func.jvp(lambda t: t @ W, (X,), (torch.ones_like(X),)),
    lambda: torch.func.jacfwd(lambda t: t @ W)(X),
    lambda: torch.autograd.functional.vjp(lambda t: t @ W, X, G),
    lambda: torch.autograd.functional.jacobian(lambda t: t @ W, X),
    lambda: torch.autograd.functional.jvp(lambda t: t @ W, X, torch.ones_like(X)),
    _forward_ad, _engine,
    lambda: _Doubled.apply(_leaf()).sum().backward(),
    lambda: torch.ops.aten._softmax_backward_data(G, G.softmax(-1), -1, torch.float64),
    lambda: llmcore.backward.linear_backward(X, W, G),
    lambda: llmcore.backward.softmax_backward(G, G),
    lambda: llmcore.backward.softmax_jacobian(G[0]),
    lambda: llmcore.backward.attention_head_backward(X, X, X, X),
], ids=["autograd.grad", "Tensor.backward", "autograd.backward", "func.grad", "func.vjp",
        "func.jacrev", "func.jvp", "func.jacfwd", "functional.vjp", "functional.jacobian",
        "functional.jvp", "forward_ad", "engine", "Function", "softmax_backward_data",
        "llmcore.linear_backward", "llmcore.softmax_backward", "llmcore.softmax_jacobian",
        "llmcore.attention_head_backward"])
def test_forbid_autograd_refuses_every_path(call):
    with pytest.raises(NotAllowedError, match="compute it yourself"):
        with forbid(*AUTOGRAD):
            call()


def test_forbid_autograd_allows_a_forward_pass_that_tracks_gradients():
    with forbid(*AUTOGRAD) as recorder:
        y = torch.softmax(_leaf() @ W, dim=-1)
    assert y.requires_grad and not recorder.violations
    leaf = _leaf()
    (grad,) = torch.autograd.grad((leaf * leaf).sum(), leaf)     # outside: autograd works again
    torch.testing.assert_close(grad, 2 * X)


def test_autograd_policy_is_described_and_its_canary_passes(monkeypatch):
    import IPython.display
    records = []
    monkeypatch.setattr(IPython.display, "display",
                        lambda data, raw: records.append(data[RECORD_MIME]))
    assert Policy.of(AUTOGRAD).describe()["autograd"] is True
    assert "autograd" not in Policy.of(("numpy",)).describe()    # other records are unchanged
    test = ExerciseTest("test_autograd_canary", forbid=AUTOGRAD)
    got = test.call(lambda a, b: a @ b, X, W, case="a product")
    torch.testing.assert_close(got, X @ W)
    leaf = _leaf()
    with pytest.raises(NotAllowedError):
        test.call(lambda: torch.autograd.grad((leaf * leaf).sum(), leaf), case="autograd")
    assert [r["canaries"]["forbid"] for r in records] == [True, True]
    assert records[0]["violations"] == [] and records[0]["policy"]["autograd"] is True
    assert "backward pass" in records[1]["violations"][0]
