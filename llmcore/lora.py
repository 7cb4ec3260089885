"""LoRA: fine-tuning a frozen weight through a low-rank update.

In the book's (in, out) convention a linear layer is y = x W with W
(d_in, d_out). LoRA freezes W and learns two thin matrices, A (d_in, r)
and B (r, d_out) with r much smaller than d_in and d_out::

    y = x W + (alpha / r) (x A) B     the adapter's forward: x A is (N, r)
    W' = W + (alpha / r) A B          the merge: one (d_in, d_out) matrix

The LoRA paper writes W0 + B A in the (out, in) convention, where the
matrix that meets the input stands on the right; here it stands on the
left, so the product is A B (x -> x A -> x A B). B starts at zero, so the
adapted model starts as the frozen one, and A at random, so that B's first
gradient, (alpha / r) (x A)^T G, is not zero.

:func:`add_lora` wraps a model's block matrices with :class:`LoRA` through
``torch.nn.utils.parametrize`` (every read of ``w_o`` then returns
W + (alpha / r) A B) and freezes everything else; :func:`merge_lora` writes
the sums back as plain weights. Chapter 14.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from .backward import linear_backward
from .model import GPTConfig
from .published import PublishedModel
from .shapes import check_operands, check_shape
from .storage import storage_bytes
from .train import random_batch, train_step

TARGETS = ("w_qkv", "w_q", "w_k", "w_v", "w_o", "w_gate", "w_up", "w_down")
"""The block matrices :func:`add_lora` adapts by default: the attention and
FFN weights of GPT and Llama (embeddings, biases and norms stay frozen)."""


def _scale(alpha: float, rank: int) -> float:
    if not alpha > 0:
        raise ValueError(f"alpha: expected a positive number, got {alpha}")
    return alpha / rank


def _check_adapter(w: Tensor | None, a: Tensor,
                   b: Tensor) -> dict[str, int]:
    """Shapes of W (d_in, d_out) when given, A (d_in, r), B (r, d_out)."""
    sizes = {} if w is None else check_shape("w", w, ("d_in", "d_out"))
    sizes.update(check_shape("a", a, ("d_in", "r"), **sizes))
    sizes.update(check_shape("b", b, ("r", "d_out"), **sizes))
    return sizes


def lora_linear(x: Tensor, w: Tensor, a: Tensor, b: Tensor, *,
                alpha: float, bias: Tensor | None = None) -> Tensor:
    """The adapted layer without forming A B: x W + (alpha / r) (x A) B.

    x: (..., d_in)   w: (d_in, d_out)   a: (d_in, r)   b: (r, d_out)
    bias: (d_out,) or None   ->   (..., d_out). Per row it costs
    r (d_in + d_out) multiply-adds more than x W. Chapter 14.
    """
    check_operands(x=x, w=w, a=a, b=b)
    sizes = _check_adapter(w, a, b)
    check_shape("x", x, ("...", "d_in"), d_in=sizes["d_in"])
    scale = _scale(alpha, sizes["r"])
    y = x @ w + scale * ((x @ a) @ b)                     # (..., d_out)
    return y if bias is None else y + bias


def lora_merge(w: Tensor, a: Tensor, b: Tensor, *,
               alpha: float) -> Tensor:
    """W' = W + (alpha / r) A B, a new tensor (w is left as it is).

    w: (d_in, d_out)   a: (d_in, r)   b: (r, d_out)   ->   (d_in, d_out).
    x W' equals :func:`lora_linear` at the cost of x W alone. Chapter 14.
    """
    check_operands(w=w, a=a, b=b)
    sizes = _check_adapter(w, a, b)
    return w + _scale(alpha, sizes["r"]) * (a @ b)        # (d_in, d_out)


def lora_backward(x: Tensor, a: Tensor, b: Tensor, d_out: Tensor, *,
                  alpha: float) -> tuple[Tensor, Tensor]:
    """Gradients of A and B for y = x W + s (x A) B, s = alpha / r.

    x: (..., d_in)   a: (d_in, r)   b: (r, d_out)   d_out = dL/dy:
    (..., d_out)   ->   dA (d_in, r), dB (r, d_out), summed over all rows.
    Chapter 12's linear rule twice: through h B with h = x A,
    dB = h^T (s G) and dh = (s G) B^T; then through x A, dA = x^T dh.
    W is frozen: no gradient is computed for it. Chapter 14.
    """
    check_operands(x=x, a=a, b=b, d_out=d_out)
    sizes = _check_adapter(None, a, b)
    check_shape("x", x, ("...", "d_in"), d_in=sizes["d_in"])
    check_shape("d_out", d_out, (*x.shape[:-1], "d_out"),
                d_out=sizes["d_out"])
    s = _scale(alpha, sizes["r"])
    rows = x.reshape(-1, sizes["d_in"])                   # (N, d_in)
    grad = s * d_out.reshape(-1, sizes["d_out"])          # (N, d_out)
    hidden = rows @ a                                     # h: (N, r)
    d_hidden, d_b, _ = linear_backward(hidden, b, grad)   # dh, dB
    return rows.T @ d_hidden, d_b                         # dA, dB


class LoRA(nn.Module):
    """The parametrization W -> W + (alpha / r) A B (for
    ``torch.nn.utils.parametrize``).

    a: (d_in, r), drawn N(0, 1 / d_in) so that x A keeps the scale of x;
    b: (r, d_out), zeros, so the adapted weight starts equal to W.
    generator seeds A (the meta device holds no values: nothing drawn).
    Chapter 14.
    """

    def __init__(self, d_in: int, d_out: int, rank: int, *,
                 alpha: float | None = None, device=None, dtype=None,
                 generator: torch.Generator | None = None):
        super().__init__()
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"rank: expected a positive int, got {rank!r}")
        if rank > min(d_in, d_out):
            raise ValueError(
                f"rank {rank} exceeds min(d_in, d_out) = {min(d_in, d_out)}"
                f": A B could be any ({d_in}, {d_out}) matrix; train W")
        self.rank = rank
        self.alpha = float(rank if alpha is None else alpha)
        _scale(self.alpha, rank)                  # raises on alpha <= 0
        self.a = nn.Parameter(torch.empty(d_in, rank, device=device,
                                          dtype=dtype))
        self.b = nn.Parameter(torch.zeros(rank, d_out, device=device,
                                          dtype=dtype))
        if self.a.device.type != "meta":
            with torch.no_grad():
                self.a.normal_(0.0, d_in ** -0.5, generator=generator)

    def forward(self, w: Tensor) -> Tensor:
        """w: (d_in, d_out), the frozen weight -> W + (alpha / r) A B."""
        return lora_merge(w, self.a, self.b, alpha=self.alpha)


def add_lora(model: nn.Module, rank: int, *, alpha: float | None = None,
             targets: tuple[str, ...] = TARGETS,
             seed: int = 0) -> list[str]:
    """Freeze model, then adapt each 2-D parameter named in targets.

    Each adapted weight (d_in, d_out) gains a :class:`LoRA` of this rank
    (alpha defaults to the rank: scale 1), and only the adapters' A and B
    require grad. The model's code is unchanged: wherever it reads W it
    now gets W + (alpha / r) A B. Returns the adapted names
    (``"blocks.0.attention.w_qkv"``, ...). Chapter 14.
    """
    if any(parametrize.is_parametrized(m) for m in model.modules()):
        raise ValueError("add_lora: the model already has adapters; "
                         "merge_lora(model) first")
    found = [(name, module, leaf) for name, module in model.named_modules()
             for leaf in targets
             if isinstance(getattr(module, leaf, None), nn.Parameter)
             and getattr(module, leaf).dim() == 2]
    if not found:
        raise ValueError(f"add_lora: no 2-D parameter named "
                         f"{', '.join(targets)} in {type(model).__name__}")
    for p in model.parameters():
        p.requires_grad_(False)
    device = getattr(found[0][1], found[0][2]).device
    generator = (None if device.type == "meta"
                 else torch.Generator(device=device).manual_seed(seed))
    names = []
    for name, module, leaf in found:
        w = getattr(module, leaf)
        adapter = LoRA(*w.shape, rank, alpha=alpha, device=w.device,
                       dtype=w.dtype, generator=generator)
        parametrize.register_parametrization(module, leaf, adapter)
        names.append(f"{name}.{leaf}" if name else leaf)
    return names


def lora_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The A and B of every :class:`LoRA` in model, in module order: what
    the optimizer trains after :func:`add_lora`. Chapter 14."""
    return [p for m in model.modules() if isinstance(m, LoRA)
            for p in (m.a, m.b)]


@torch.no_grad()
def merge_lora(model: nn.Module) -> int:
    """Replace every adapted weight by W + (alpha / r) A B, a plain
    parameter again; returns how many were merged. The model then has its
    original parameters and shapes, so its forward costs what it did
    before fine-tuning. Chapter 14.
    """
    merged = 0
    for module in list(model.modules()):
        if not parametrize.is_parametrized(module):
            continue
        for leaf in list(module.parametrizations):
            parametrize.remove_parametrizations(module, leaf,
                                                leave_parametrized=True)
            merged += 1
    return merged


def fine_tune(model: nn.Module, params: list[nn.Parameter], tokens: Tensor,
              *, steps: int, batch_size: int, seq_len: int, lr: float,
              seed: int = 0, grad_clip: float = 1.0
              ) -> tuple[list[float], torch.optim.AdamW]:
    """Train params (all the model's, or its adapters' after
    :func:`add_lora`) on a byte stream: AdamW at a constant lr, no weight
    decay, the gradient's norm clipped to grad_clip.

    tokens: (N,) bytes. Each step draws batch_size windows of seq_len + 1
    bytes from a generator seeded by seed: runs with one seed see the same
    batches. Returns every step's training loss in bits per byte, and the
    optimizer (its state is what training params holds in memory). Leaves
    the model in eval mode. Chapter 14.
    """
    if not params:
        raise ValueError("fine_tune: params is empty; nothing would train")
    if any(not p.requires_grad for p in params):
        raise ValueError("fine_tune: every parameter in params must "
                         "require grad")
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    losses = []
    model.train()
    for _ in range(steps):
        batch = random_batch(tokens, batch_size, seq_len, generator)
        bits, _ = train_step(model, params, optimizer, batch.to(params[0].device),
                             grad_clip=grad_clip)
        losses.append(bits)
    model.eval()
    return losses, optimizer


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the distinct storages behind the tensors in the optimizer's
    state (AdamW: two moments per trained parameter and a step counter),
    by :func:`llmcore.storage.storage_bytes`. Measured, not computed from a
    formula: 0 before the first step. Chapter 14."""
    return storage_bytes(value for state in optimizer.state.values()
                         for value in state.values()
                         if isinstance(value, Tensor))


def adapted_shapes(sizes: GPTConfig | PublishedModel
                   ) -> list[tuple[int, int]]:
    """The (d_in, d_out) of every block matrix of a model, all layers: for
    llmcore's GPT or a published model. Attention: the Q, K, V projections
    (one combined W_qkv in llmcore's GPT) and W_o; FFN: W_up and W_down,
    and W_gate for SwiGLU. Chapter 14.
    """
    if isinstance(sizes, PublishedModel):
        d, f = sizes.d_model, sizes.d_ff
        q = sizes.n_heads * sizes.d_head
        kv = sizes.n_kv_heads * sizes.d_head
        gate = [(d, f)] if sizes.ffn == "swiglu" else []
        return ([(d, q), (d, kv), (d, kv), (q, d), *gate, (d, f), (f, d)]
                * sizes.n_layers)
    if isinstance(sizes, GPTConfig):
        d, f = sizes.d_model, sizes.ffn_width
        width = (sizes.n_heads + 2 * sizes.kv_heads) * sizes.d_head
        return [(d, width), (d, d), (d, f), (f, d)] * sizes.n_layers
    raise TypeError(f"adapted_shapes: expected a GPTConfig or a "
                    f"PublishedModel, got {type(sizes).__name__}")


def lora_parameter_count(shapes: list[tuple[int, int]],
                         rank: int) -> int:
    """Parameters of rank-r adapters on matrices of these (d_in, d_out):
    r (d_in + d_out) each, against d_in d_out to train the matrix itself.
    Chapter 14."""
    if not isinstance(rank, int) or rank <= 0:
        raise ValueError(f"rank: expected a positive int, got {rank!r}")
    return sum(rank * (d_in + d_out) for d_in, d_out in shapes)
