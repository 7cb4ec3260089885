"""From a row of logits to a token: greedy, temperature, top-k, and seeded generators.

Both generation paths pick tokens with this module (the teaching step of :mod:`llmcore.generate`
and the fast step of :mod:`llmcore.fastpath`), so a seed draws the same tokens on either.
Chapter 6.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import torch
from torch import Generator, Tensor

from . import onerow
from .masks import NEG_INF
from .shapes import check_shape, check_tensor
from .softmax import softmax

Pick = Callable[[Tensor], Tensor]
"""What picks the next tokens: logits (b, v) -> token ids (b,) long."""


def seeded_generators(seed: int | Sequence[int] | None, b: int,
                      device) -> list[torch.Generator] | None:
    """One generator for the batch (an int), one per sequence (a list of b), or None (the
    global RNG). Sampling needs real numbers, so the meta device is refused. Chapter 6."""
    if seed is None:
        return None
    if device is not None and torch.device(device).type == "meta":
        raise ValueError("sampling needs real numbers: the meta device has none (use greedy)")
    seeds = [seed] if isinstance(seed, int) else list(seed)
    if not isinstance(seed, int) and len(seeds) != b:
        raise ValueError(f"seed: expected one seed per sequence ({b}), got {len(seeds)}")
    return [torch.Generator(device=device).manual_seed(s) for s in seeds]


def check_settings(temperature: float, top_k: int | None) -> None:
    """Raise ValueError unless temperature >= 0 and top_k is None or positive."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and not 0 < top_k:
        raise ValueError(f"top_k must be positive, got {top_k}")


def sample(logits: Tensor, *, temperature: float = 0.0,
           top_k: int | None = None,
           generator: Generator | Sequence[Generator] | None = None
           ) -> Tensor:
    """Pick one token per row of logits.

    logits: (b, v) -> (b,) long. temperature 0 is greedy (argmax);
    otherwise sample from softmax(logits / temperature), keeping only the
    top_k largest logits if given. generator: one for the whole batch, or a
    list with one per row (so that a row draws the same numbers whether it
    is sampled alone or in a batch). Chapter 6.
    """
    check_tensor("logits", logits)
    b, v = check_shape("logits", logits, ("b", "v")).values()
    check_settings(temperature, top_k)
    if temperature == 0:
        return logits.argmax(dim=-1)
    scaled = logits.float() / temperature
    if top_k is not None and top_k < v:
        kth = scaled.topk(top_k, dim=-1).values[:, -1:]             # (b, 1)
        scaled = scaled.masked_fill(scaled < kth, NEG_INF)
    probs = softmax(scaled, dim=-1)                                 # (b, v)
    if isinstance(generator, (list, tuple)):
        if len(generator) != b:
            raise ValueError(f"generator: expected one per row ({b}), "
                             f"got {len(generator)}")
        return torch.cat([torch.multinomial(probs[i:i + 1], 1,
                                            generator=g)[:, 0]
                          for i, g in enumerate(generator)])
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def greedy_in_c(logits: Tensor) -> Tensor:
    """The greedy pick, logits (b, v) -> (b,) long, found by llmcore's C argmax
    (:func:`llmcore.onerow.argmax_rows`) for float32 or bfloat16 logits on the CPU and by
    ``torch.argmax`` for any other: the same index either way (each row's first largest, a
    NaN counting as the largest). PyTorch's argmax takes 110-250 us for GPT-2's 50257
    logits on the course's Xeon, as long as a whole layer of a decode step in C. Chapter 7."""
    if (logits.is_cpu and logits.dim() == 2 and logits.shape[1] > 0
            and logits.dtype in (torch.float32, torch.bfloat16)):
        return onerow.argmax_rows(logits)
    return logits.argmax(dim=-1)


def token_picker(*, temperature: float, top_k: int | None, seed: int | Sequence[int] | None,
                 b: int, device, native: bool = False) -> Pick:
    """The pick of one generation call over b sequences: :func:`sample` with these settings and
    the generators ``seed`` asks for (one for the batch, or one per sequence), checked once
    here; greedy is the plain argmax, and with ``native`` (the fast path's pick) the same
    argmax in C (:func:`greedy_in_c`) where llmcore's kernels run on ``device``. Chapter 6."""
    check_settings(temperature, top_k)
    generators = seeded_generators(seed, b, device)
    if temperature == 0:
        if native and onerow.available(device):
            return greedy_in_c
        return functools.partial(torch.argmax, dim=-1)
    generator = generators[0] if generators is not None and isinstance(seed, int) else generators
    return functools.partial(sample, temperature=temperature, top_k=top_k, generator=generator)
