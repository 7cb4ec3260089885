"""Fresh inputs at grade time: every case is run again on values nobody could know in advance.

A test cell's inputs are fixed (literals, seeded generators): a learner can read them, and the
hidden ones reach the kernel with the cell. So when the trusted grader runs a test cell it first
hands the kernel a **secret for that cell** (:func:`receive`, sent by the grader's executor just
before the cell runs and withdrawn after it); :meth:`llmcheck.cases.Test.call` then runs each case a
second time on a *twin* of its arguments, every floating-point tensor replaced by values drawn
from the secret (same shape, dtype and device; same mean and spread, so "large logits" stay
large). The instructor's solution runs with the same secret, so its twin records are the expected
answers; answers memoised for the released inputs, or for inputs read from a test's source, earn
nothing on the twin. Without a secret (the learner's own check, a chapter) there is no twin.

Non-finite tensors (masks of 0 and -inf), constant ones (a norm's unit gain) and integer or
boolean tensors are kept as they are; a model (an ``nn.Module``) is copied with fresh weights;
other arguments (a cache) are deep-copied so the twin cannot disturb the case it follows. Cases
whose function is a bound method or closes over its inputs (``inputs=``) have no twin: their
state lives outside the arguments.
"""

from __future__ import annotations

import copy
import hashlib

import torch

from .record import TWIN_SUFFIX
from .tree import fold

_secret: bytes | None = None


def receive(token: str | None) -> None:
    """Set (a hex string) or withdraw (None) the secret of the test cell about to run."""
    global _secret
    _secret = bytes.fromhex(token) if token else None


def active() -> bool:
    """Whether the grader handed over a secret for the cell now running."""
    return _secret is not None


def _generator(cell: str, case: str) -> torch.Generator:
    """A CPU generator seeded by the cell's secret and the case (values are drawn on the CPU and
    moved to the argument's device, so every device draws the same)."""
    digest = hashlib.sha256(_secret + f"\0{cell}\0{case}".encode()).digest()
    generator = torch.Generator(device="cpu")
    generator.manual_seed(int.from_bytes(digest[:8], "little"))
    return generator


def _fresh_tensor(t: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """New values like ``t``'s: same shape, dtype, device, mean and spread (drawn on the CPU)."""
    if t.device.type == "meta" or not t.dtype.is_floating_point or t.numel() == 0:
        return t
    values = t.detach().to("cpu", torch.float64)
    if not torch.isfinite(values).all() or bool((values == values.flatten()[0]).all()):
        return t                   # a mask, or a constant (a norm's unit gain): keep its meaning
    mean = float(values.mean())
    spread = float(values.std()) if t.numel() > 1 else max(abs(mean), 1.0)
    spread = spread if spread > 0 else 1.0
    drawn = torch.randn(t.shape, generator=generator, dtype=torch.float64) * spread + mean
    fresh = drawn.to(dtype=t.dtype, device=t.device)
    return fresh.requires_grad_(t.requires_grad) if t.is_leaf else fresh


def twin(cell: str, case: str, args: tuple, kwargs: dict):
    """(args, kwargs) with every floating-point tensor drawn afresh from the cell's secret and
    everything else deep-copied, or None when there is no secret or no tensor to redraw."""
    if _secret is None:
        return None
    generator = _generator(cell, case)
    redrawn = [False]
    memo: dict[int, object] = {}

    def leaf(value):
        if isinstance(value, torch.Tensor):
            if id(value) not in memo:
                memo[id(value)] = _fresh_tensor(value, generator)
                redrawn[0] |= memo[id(value)] is not value
            return memo[id(value)]
        if isinstance(value, torch.nn.Module):             # a model: fresh weights
            twin_module = copy.deepcopy(value, memo)
            with torch.no_grad():
                for tensor in [*twin_module.parameters(), *twin_module.buffers()]:
                    drawn = _fresh_tensor(tensor, generator)
                    redrawn[0] |= drawn is not tensor
                    tensor.copy_(drawn)
            return twin_module
        return copy.deepcopy(value, memo)

    def rebuilt(container, items: list):
        return dict(zip(container, items)) if isinstance(container, dict) else \
            type(container)(items)

    fresh_args, fresh_kwargs = fold((tuple(args), dict(kwargs)), leaf, rebuilt, exact=True)
    return (fresh_args, fresh_kwargs) if redrawn[0] else None
