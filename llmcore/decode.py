"""The one generation loop: a step runs the model on what it has not seen, a pick chooses.

Generation alternates: run the model on the new tokens (the prompt first, then the token just
picked), take the last position's logits (b, v), pick a token per sequence, repeat. How the model
is run is the step's business, and the only part the two paths do differently: the teaching path
(:class:`llmcore.generate.TeachingStep`, ``GPT.forward`` with a KV cache or without one) and the
fast path (:class:`llmcore.fastpath.FastStep`) hand their step to the same :func:`decode`, as
vLLM's model runners share one scheduler loop. Each turn yields a :class:`StepResult` (the
logits and the picks); :func:`collect` turns them into token ids. Chapters 6 and 7.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator, Protocol, Sequence

import torch
from torch import Tensor

from .sampling import Pick
from .shapes import check_shape, check_tensor


class Step(Protocol):
    """One forward step of generation. It keeps what it needs between calls (a KV cache, or the
    tokens so far), so each call gets only what the model has not seen yet."""

    def __call__(self, tokens: Tensor) -> Tensor:
        """tokens: (b, t) new ids, the prompt then one per step -> logits (b, v) of the last."""
        ...


@dataclass(frozen=True)
class StepResult:
    """What one turn of :func:`decode` gives: logits (b, v), the last row's; tokens (b,), the
    pick."""

    logits: Tensor
    tokens: Tensor


def check_request(model, prompt_ids: Tensor, max_new_tokens: int) -> tuple[int, int]:
    """Check a generation request once, before any step: prompt_ids (b, n) ids that the model
    accepts, and room for max_new_tokens more within max_seq_len. -> (b, n). Chapter 6."""
    check_tensor("prompt_ids", prompt_ids)
    b, n = check_shape("prompt_ids", prompt_ids, ("b", "n")).values()
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if n + max_new_tokens > model.config.max_seq_len:
        raise ValueError(f"prompt of {n} tokens + max_new_tokens = {max_new_tokens} exceeds "
                         f"max_seq_len = {model.config.max_seq_len}")
    model.check_tokens(prompt_ids)
    return b, n


def decode(step: Step, prompt_ids: Tensor, max_new_tokens: int, *,
           pick: Pick) -> Iterator[StepResult]:
    """The generation loop: yield each step's last-row logits and picked
    tokens.

    prompt_ids: (b, n). step(tokens (b, t)) -> logits (b, v);
    pick(logits) -> tokens (b,). Chapters 6 and 7.
    """
    new = prompt_ids                       # what the model has not seen yet
    for _ in range(max_new_tokens):
        logits = step(new)                                          # (b, v)
        tokens = pick(logits)                                       # (b,)
        yield StepResult(logits, tokens)
        new = tokens[:, None]                                       # (b, 1)


def collect(results: Iterable[StepResult], prompt_ids: Tensor, *,
            eos_id: int | None = None, limits: Sequence[int] | None = None) -> Tensor:
    """The prompt followed by each step's tokens: (b, n) -> (b, n + t).

    A sequence that emits ``eos_id`` stops: its later entries repeat eos_id. ``limits``: the
    most new tokens of each sequence (b,); one that has them stops too, its later entries left
    for the caller to cut. Collecting ends once every sequence has stopped (t may be fewer than
    the steps on offer). Chapters 6 and 8.
    """
    out = [prompt_ids]
    done = torch.zeros(prompt_ids.shape[0], dtype=torch.bool, device=prompt_ids.device)
    full = None if limits is None else torch.as_tensor(limits, device=prompt_ids.device)
    for count, result in enumerate(results, start=1):
        tokens = result.tokens
        if eos_id is not None:
            eos = torch.full_like(tokens, eos_id)
            tokens = torch.where(done, eos, tokens)
            done = done | (tokens == eos_id)
        if full is not None:
            done = done | (full <= count)
        out.append(tokens[:, None])                              # (b, 1)
        if (eos_id is not None or full is not None) and bool(done.all()):
            break
    return torch.cat(out, dim=1)                                 # (b, n + t)
