"""Generation: the options turned into a step (:func:`make_step`), and ``generate`` itself.

Only the last row of the logits predicts the next token. Without a cache every step re-runs the
whole sequence; with one, the prompt runs once (prefill) and each step then computes only the
newest token (decode). Either way the loop is :func:`llmcore.decode.decode`: :func:`make_step`
hands it the teaching path's step (:class:`TeachingStep`) or, with ``fast=True``, the fast
path's (:class:`llmcore.fastpath.FastStep`); it is the one place the options are checked.
:func:`generate` and :func:`generate_batch` both run through it. Chapters 6, 7 and 8.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import torch
from torch import Tensor

from .batching import TokenList, pad_batch
from .cache import Cache
from .decode import Step, StepResult, check_request, collect, decode
from .fastpath import FastDecoder, FastModels, FastStep, fast_model
from .kvcache import KVCache
from .prefix import SharedPrefixCache
from .sampling import token_picker


class TeachingStep:
    """The teaching path's step: the model's own forward, under ``torch.no_grad``.

    With a cache, the model sees only the new tokens and the cache holds the past (prefill,
    then decode). Without one (cache None), every step runs the whole sequence so far, the
    padding mask growing by one column per step. Chapters 6 and 7.
    """

    def __init__(self, model, cache: Cache | None, attention_mask: Tensor | None,
                 backend: str):
        self.model, self.cache, self.backend = model, cache, backend
        self.mask = attention_mask          # (b, n): the prompt's padding, or None
        self.seen: Tensor | None = None     # without a cache: every token so far (b, m)

    def __call__(self, tokens: Tensor) -> Tensor:
        """tokens: (b, t) new ids -> logits (b, v) of the last position."""
        model, mask = self.model, self.mask
        with torch.no_grad():
            if self.cache is not None:
                logits = model(tokens, self.cache, attention_mask=mask,
                               backend=self.backend, last_only=True)
                self.mask = None      # the cache holds the prompt's padding now
            else:
                if self.seen is not None:      # a picked token: one more column
                    tokens = torch.cat([self.seen, tokens], dim=1)
                    if mask is not None:
                        ones = torch.ones_like(mask[:, :1])
                        self.mask = mask = torch.cat([mask, ones], dim=1)
                self.seen = tokens
                logits = model(tokens, attention_mask=mask,
                               backend=self.backend, last_only=True)
        return logits[:, -1]                                            # (b, v)


def make_step(model, prompt_ids: Tensor, max_new_tokens: int, *,
              use_cache: bool = True, cache: Cache | None = None,
              attention_mask: Tensor | None = None,
              backend: str = "explicit",
              fast: bool | FastDecoder | FastModels = False,
              precision: str | None = None) -> Step:
    """The step that runs ``model`` for this request; the options are
    checked here and only here.

    prompt_ids: (b, n), checked with max_new_tokens (``check_request``);
    attention_mask: (b, n) with 0 for left padding. The teaching step
    (:class:`TeachingStep`) fills ``cache`` (default: a contiguous
    KVCache), or re-runs the whole sequence with use_cache=False;
    ``backend`` is its attention's. ``fast`` gives the fast path's step
    (FastStep: its own static cache and fused attention), its weights in
    ``precision`` (None, or one of :data:`llmcore.lowbit.PRECISIONS`):
    True prepares them for this call, a FastModels you hold prepares
    them once and keeps them, a FastDecoder of this model is them.
    Chapters 6, 7 and 13.
    """
    b, _ = check_request(model, prompt_ids, max_new_tokens)
    if precision is not None and (fast is False
                                  or isinstance(fast, FastDecoder)):
        raise ValueError(f"precision={precision!r} chooses the fast "
                         "path's weights: pass fast=True or a FastModels "
                         "(a FastDecoder given as fast has its own)")
    if fast is not False:
        if cache is not None or not use_cache or backend != "explicit":
            raise ValueError("fast=True brings its own cache and "
                             "attention: leave cache, use_cache and "
                             "backend at their defaults")
        if isinstance(fast, FastModels):
            fast = fast.get(model, precision=precision, batch_size=b)
        elif fast is True:
            fast = fast_model(model, batch_size=b, precision=precision)
        return FastStep(fast, model, prompt_ids, max_new_tokens,
                        attention_mask)
    if cache is not None and not use_cache:
        raise ValueError("a cache was given with use_cache=False (a "
                         "cache, a shared prefix's too, needs the KV "
                         "cache: use_cache=True)")
    if use_cache and cache is None:
        cache = KVCache.for_model(model, b)
    return TeachingStep(model, cache, attention_mask, backend)


def decode_steps(model, prompt_ids: Tensor, max_new_tokens: int, *,
                 temperature: float = 0.0, top_k: int | None = None,
                 seed: int | Sequence[int] | None = None,
                 **step_options) -> Iterator[StepResult]:
    """Each step's last-row logits and picked tokens, one StepResult at
    a time: ``decode`` with the step of :func:`make_step` (which takes
    ``step_options``) and the pick of temperature, top_k and seed.

    prompt_ids: (b, n). Chapters 6 and 7.
    """
    step = make_step(model, prompt_ids, max_new_tokens, **step_options)
    pick = token_picker(temperature=temperature, top_k=top_k, seed=seed,
                        b=prompt_ids.shape[0], device=prompt_ids.device,
                        native=step_options.get("fast", False) is not False)
    return decode(step, prompt_ids, max_new_tokens, pick=pick)


def generate(model, prompt_ids: Tensor, max_new_tokens: int, *,
             eos_id: int | None = None, **options) -> Tensor:
    """Generate up to max_new_tokens after each prompt.

    prompt_ids: (b, n) -> (b, n + t), t <= max_new_tokens. Greedy by
    default; ``temperature``, ``top_k`` and ``seed`` sample. A sequence
    that emits ``eos_id`` stops: its later entries repeat eos_id. The
    other options choose the step (:func:`make_step`): ``use_cache``
    and ``fast`` change the speed, never the tokens. Chapter 6.
    """
    results = decode_steps(model, prompt_ids, max_new_tokens, **options)
    return collect(results, prompt_ids, eos_id=eos_id)


def generate_batch(model, prompts: Sequence[TokenList | Tensor],
                   max_new_tokens: int | Sequence[int], *,
                   eos_id: int | None = None,
                   seeds: Sequence[int] | None = None,
                   prefix: TokenList | Tensor | None = None,
                   pad_id: int = 0, **options) -> list[list[int]]:
    """Generate for several prompts in one batch; return each sequence's
    new tokens.

    prompts: b token lists of any lengths, left-padded (``pad_batch``).
    max_new_tokens: one limit for all, or one per sequence. A sequence
    stops at its own limit or right after emitting eos_id (which is
    kept); the batch stops when every sequence has. seeds: one per
    sequence, so sampling draws what it draws alone. prefix: tokens
    shared by every prompt (a system prompt), placed before each prompt;
    its keys and values are computed once and shared
    (:class:`llmcore.prefix.SharedPrefixCache`). The other options are
    :func:`generate`'s. -> b lists of generated token ids. Chapter 8.
    """
    b = len(prompts)
    limits = ([max_new_tokens] * b if isinstance(max_new_tokens, int)
              else list(max_new_tokens))
    if len(limits) != b:
        raise ValueError(f"max_new_tokens: expected one limit per prompt "
                         f"({b}), got {len(limits)}")
    if seeds is not None and len(seeds) != b:
        raise ValueError(f"seeds: expected one seed per prompt ({b}), "
                         f"got {len(seeds)}")
    device = model.device
    tokens, mask = pad_batch(prompts, pad_id=pad_id, device=device)
    if prefix is not None:
        prefix_ids = torch.as_tensor(prefix, dtype=torch.long,
                                     device=device).reshape(1, -1)
        options["cache"] = SharedPrefixCache.prefill(model, prefix_ids,
                                                     batch_size=b)
    results = decode_steps(model, tokens, max(limits),
                           attention_mask=mask,
                           seed=list(seeds) if seeds is not None else None,
                           **options)
    out = collect(results, tokens, eos_id=eos_id, limits=limits)
    new = out[:, tokens.shape[1]:].tolist()                      # (b, t)
    return [until_eos(row[:limit], eos_id)
            for row, limit in zip(new, limits)]


def until_eos(tokens: list[int], eos_id: int | None) -> list[int]:
    """tokens up to and including the first eos_id (all of them when there
    is none, or eos_id is None)."""
    return tokens[:tokens.index(eos_id) + 1] if eos_id in tokens else tokens
