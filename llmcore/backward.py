"""Training as matrix algebra: the loss, and the backward pass of each piece as matrix formulas.

Autograd computes these for us during training (:mod:`llmcore.train`); written out, each gradient
is a few matrix products of the same shapes as the forward pass, which is why training costs a
small multiple of inference. Rows are tokens throughout: x is (N, d_in), w is (d_in, d_out),
y = x w + b. Each function here is checked against torch.autograd in the tests. Chapter 12.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .masks import causal_mask, mask_bias
from .shapes import check_operands, check_shape, check_tensor
from .softmax import softmax


def cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy of the targets under softmax(logits), in nats,
    computed stably.

    logits: (N, v)   targets: (N,) long in [0, v)   ->   a scalar. Per row,
    -log softmax(z)_t = logsumexp(z) - z_t, and
    logsumexp(z) = max(z) + log sum exp(z - max(z)) never overflows.
    Chapter 12.
    """
    check_operands(logits=logits)
    sizes = check_shape("logits", logits, ("N", "v"))
    _check_targets(targets, sizes["N"], sizes["v"], logits.device)
    top = logits.amax(dim=-1, keepdim=True)                         # (N, 1)
    total = torch.exp(logits - top).sum(dim=-1)                     # (N,)
    log_total = top.squeeze(-1) + torch.log(total)                  # (N,)
    picked = logits.gather(-1, targets[:, None]).squeeze(-1)        # (N,)
    return (log_total - picked).mean()


def cross_entropy_backward(logits: Tensor, targets: Tensor) -> Tensor:
    """d loss / d logits for :func:`cross_entropy`:
    (softmax(logits) - onehot(targets)) / N.

    logits: (N, v)   targets: (N,)   ->   (N, v). Chapter 12.
    """
    check_operands(logits=logits)
    sizes = check_shape("logits", logits, ("N", "v"))
    _check_targets(targets, sizes["N"], sizes["v"], logits.device)
    grad = softmax(logits, dim=-1)                                  # (N, v)
    grad[torch.arange(sizes["N"], device=logits.device), targets] -= 1.0
    return grad / sizes["N"]


def linear_backward(x: Tensor, w: Tensor,
                    d_out: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of y = x w + b, given dL/dy.

    x: (N, d_in)   w: (d_in, d_out)   d_out: (N, d_out)
    -> dx = d_out w^T (N, d_in), dw = x^T d_out (d_in, d_out),
    db = column sums of d_out (d_out,). Chapter 12.
    """
    check_operands(x=x, w=w, d_out=d_out)
    sizes = check_shape("x", x, ("N", "d_in"))
    check_shape("w", w, ("d_in", "d_out"), **sizes)
    check_shape("d_out", d_out, ("N", "d_out"), N=sizes["N"],
                d_out=w.shape[1])
    return d_out @ w.T, x.T @ d_out, d_out.sum(dim=0)


def softmax_jacobian(a: Tensor) -> Tensor:
    """The Jacobian of one softmax row, d a_i / d s_j = a_i (delta_ij - a_j) = diag(a) - a a^T.

    a: (m,), a softmax output   ->   (m, m). m^2 numbers for one row: shown once, never used in
    training (see :func:`softmax_backward`). Chapter 12.
    """
    check_tensor("a", a)
    check_shape("a", a, ("m",))
    return torch.diag(a) - torch.outer(a, a)


def softmax_backward(a: Tensor, d_a: Tensor) -> Tensor:
    """dL/ds for a = softmax(s) along the last axis, without forming any
    Jacobian.

    a, d_a: (..., m)   ->   (..., m) = a * (d_a - rowsum(d_a * a)): the
    Jacobian-vector product (diag(a) - a a^T) d_a, one row at a time, in
    O(m) per row. Chapter 12.
    """
    check_operands(a=a, d_a=d_a)
    if a.shape != d_a.shape:
        raise ValueError(f"softmax_backward: a {tuple(a.shape)} and d_a "
                         f"{tuple(d_a.shape)} must have the same shape")
    return a * (d_a - (d_a * a).sum(dim=-1, keepdim=True))


def attention_head_backward(q: Tensor, k: Tensor, v: Tensor,
                            d_out: Tensor, *, causal: bool = False
                            ) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of one head, out = softmax(q k^T / sqrt(d_head) + M) v,
    given dL/d out.

    q: (n, d_head)   k, v: (m, d_head)   d_out: (n, d_head)
    -> dq (n, d_head), dk (m, d_head), dv (m, d_head). Forward again, then
    backward through each product: dv = A^T d_out; dA = d_out v^T;
    dS = softmax_backward(A, dA); dq = dS k / sqrt(d_head);
    dk = dS^T q / sqrt(d_head). Masked scores have A = 0, hence dS = 0: no
    gradient flows to keys a query may not see. causal: bottom-right
    aligned as in llmcore.attention. Chapter 12.
    """
    check_operands(q=q, k=k, v=v, d_out=d_out)
    sizes = check_shape("q", q, ("n", "d_head"))
    kv = check_shape("k", k, ("m", "d_head"), d_head=sizes["d_head"])
    check_shape("v", v, ("m", "d_head"), **kv)
    check_shape("d_out", d_out, ("n", "d_head"), **sizes)
    scale = 1.0 / math.sqrt(sizes["d_head"])
    scores = (q @ k.T) * scale                                      # (n, m)
    if causal:
        allowed = causal_mask(sizes["n"], kv["m"], q.device)
        scores = scores + mask_bias(allowed, scores.dtype)
    weights = softmax(scores, dim=-1)                          # A: (n, m)
    d_v = weights.T @ d_out                                    # (m, d_head)
    d_weights = d_out @ v.T                                    # (n, m)
    d_scores = softmax_backward(weights, d_weights)            # (n, m)
    return (d_scores @ k) * scale, (d_scores.T @ q) * scale, d_v


def adamw_step(param: Tensor, grad: Tensor, m: Tensor, v: Tensor,
               step: int, *, lr: float, beta1: float = 0.9,
               beta2: float = 0.999, eps: float = 1e-8,
               weight_decay: float = 0.01
               ) -> tuple[Tensor, Tensor, Tensor]:
    """One AdamW update written out; returns new (param, m, v) and changes
    nothing in place.

    param, grad, m, v: the same shape; step: 1 for the first update.
    Decoupled weight decay (param * (1 - lr wd)), moving averages of the
    gradient and of its square, their bias corrections 1 - beta^step, then
    param - lr m_hat / (sqrt(v_hat) + eps), as torch.optim.AdamW computes
    it. Chapter 12.
    """
    check_operands(param=param, grad=grad, m=m, v=v)
    for name, t in (("grad", grad), ("m", m), ("v", v)):
        if t.shape != param.shape:
            raise ValueError(f"adamw_step: {name} {tuple(t.shape)} must "
                             f"have param's shape {tuple(param.shape)}")
    if step < 1:
        raise ValueError(f"adamw_step: step counts from 1, got {step}")
    m = beta1 * m + (1 - beta1) * grad
    v = beta2 * v + (1 - beta2) * grad * grad
    m_hat = m / (1 - beta1 ** step)
    v_hat = v / (1 - beta2 ** step)
    decayed = param * (1 - lr * weight_decay)
    return decayed - lr * m_hat / (v_hat.sqrt() + eps), m, v


def _check_targets(targets: Tensor, n: int, vocab: int, device: torch.device) -> None:
    check_tensor("targets", targets)
    check_shape("targets", targets, (n,))
    if targets.dtype != torch.long:
        raise TypeError(f"targets: expected torch.long class ids, got {targets.dtype}")
    if targets.device != device:
        raise ValueError(f"targets are on {targets.device} but logits are on {device}")
    if device.type != "meta" and n and (int(targets.min()) < 0 or int(targets.max()) >= vocab):
        raise ValueError(f"targets: ids must lie in [0, {vocab}), got values from "
                         f"{int(targets.min())} to {int(targets.max())}")
