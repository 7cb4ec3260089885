"""The position-wise feed-forward network: d -> f (= 4 d) -> d with a GELU in between.

Each column j of ``w_up`` (d, f) is one neuron: token i's pre-activation is x_i . w_up[:, j] + b_j.
Doing every neuron for every token at once is ``x @ w_up + b_up``. Chapter 5.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from .matmul import linear
from .shapes import check_operands, check_shape

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def gelu(x: Tensor) -> Tensor:
    """GELU in GPT-2's tanh form:
    0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).

    Elementwise, so any shape. Equal to ``F.gelu(x, approximate="tanh")``.
    Chapter 5.
    """
    inner = _SQRT_2_OVER_PI * (x + 0.044715 * x ** 3)
    return 0.5 * x * (1.0 + torch.tanh(inner))


def _check_ffn(x: Tensor, w_up: Tensor, b_up: Tensor | None, w_down: Tensor,
               b_down: Tensor | None) -> None:
    check_operands(x=x, w_up=w_up, b_up=b_up, w_down=w_down, b_down=b_down)
    sizes = check_shape("w_up", w_up, ("d", "f"))
    check_shape("x", x, ("...", "n", "d"), **sizes)
    check_shape("w_down", w_down, ("f", "d"), **sizes)
    if b_up is not None:
        check_shape("b_up", b_up, ("f",), **sizes)
    if b_down is not None:
        check_shape("b_down", b_down, ("d",), **sizes)


def ffn_loop(x: Tensor, w_up: Tensor, b_up: Tensor | None, w_down: Tensor,
             b_down: Tensor | None) -> Tensor:
    """The FFN one token at a time and one neuron at a time.

    x: (..., n, d)   w_up: (d, f)   b_up: (f,)   w_down: (f, d)
    b_down: (d,)   ->   (..., n, d). Chapter 5.
    """
    _check_ffn(x, w_up, b_up, w_down, b_down)
    f = w_up.shape[1]
    out = torch.empty_like(x)
    for idx in np.ndindex(*x.shape[:-1]):                      # every token
        hidden = torch.empty(f, dtype=x.dtype, device=x.device)
        for j in range(f):                  # every neuron: a column of w_up
            pre = x[idx] @ w_up[:, j] + (0.0 if b_up is None else b_up[j])
            hidden[j] = gelu(pre)
        out[idx] = hidden @ w_down + (0.0 if b_down is None else b_down)
    return out


def ffn(x: Tensor, w_up: Tensor, b_up: Tensor | None, w_down: Tensor,
        b_down: Tensor | None) -> Tensor:
    """Same contract as :func:`ffn_loop`: two matmuls and an elementwise
    GELU.

    x: (..., n, d) -> hidden (..., n, f) -> (..., n, d). Chapter 5.
    """
    _check_ffn(x, w_up, b_up, w_down, b_down)
    return linear(gelu(linear(x, w_up, b_up)), w_down, b_down)


def silu(x: Tensor) -> Tensor:
    """SiLU (swish): x * sigmoid(x). Elementwise; equal to ``F.silu``. Chapter 11."""
    return x * torch.sigmoid(x)


def _check_swiglu(x: Tensor, w_gate: Tensor, w_up: Tensor, w_down: Tensor) -> None:
    check_operands(x=x, w_gate=w_gate, w_up=w_up, w_down=w_down)
    sizes = check_shape("w_gate", w_gate, ("d", "f"))
    check_shape("w_up", w_up, ("d", "f"), **sizes)
    check_shape("x", x, ("...", "n", "d"), **sizes)
    check_shape("w_down", w_down, ("f", "d"), **sizes)


def swiglu_loop(x: Tensor, w_gate: Tensor, w_up: Tensor, w_down: Tensor) -> Tensor:
    """The gated FFN one token and one neuron at a time: neuron j's output is
    silu(x . w_gate[:, j]) * (x . w_up[:, j]), a value gated by another projection of the same x.

    x: (..., n, d)   w_gate, w_up: (d, f)   w_down: (f, d)   ->   (..., n, d). Chapter 11.
    """
    _check_swiglu(x, w_gate, w_up, w_down)
    f = w_up.shape[1]
    out = torch.empty_like(x)
    for idx in np.ndindex(*x.shape[:-1]):                    # every token
        hidden = torch.empty(f, dtype=x.dtype, device=x.device)
        for j in range(f):                                   # every neuron: two columns
            hidden[j] = silu(x[idx] @ w_gate[:, j]) * (x[idx] @ w_up[:, j])
        out[idx] = hidden @ w_down
    return out


def swiglu(x: Tensor, w_gate: Tensor, w_up: Tensor,
           w_down: Tensor) -> Tensor:
    """Same contract as :func:`swiglu_loop`:
    (silu(x w_gate) * (x w_up)) w_down, three matmuls.

    x: (..., n, d) -> gate and up (..., n, f) -> (..., n, d). No biases
    (Llama has none). Chapter 11.
    """
    _check_swiglu(x, w_gate, w_up, w_down)
    return linear(silu(linear(x, w_gate)) * linear(x, w_up), w_down)
