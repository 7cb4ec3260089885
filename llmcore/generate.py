"""Generation: the teaching step, with or without a KV cache, and ``generate`` itself.

Only the last row of the logits predicts the next token. Without a cache every step re-runs the
whole sequence; with one, the prompt runs once (prefill) and each step then computes only the
newest token (decode). Either way the loop is :func:`llmcore.decode.decode`; ``fast=True`` hands
it the fast path's step (:mod:`llmcore.fastpath`) instead of :class:`ModelStep`. Chapters 6
and 7.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import torch
from torch import Tensor

from .cache import Cache
from .decode import DecodeStep, check_request, collect, decode
from .fastpath import FastDecoder, FastStep, fast_model
from .kvcache import KVCache
from .sampling import token_picker


class ModelStep:
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


def decode_steps(model, prompt_ids: Tensor, max_new_tokens: int, *,
                 use_cache: bool = True, temperature: float = 0.0,
                 top_k: int | None = None,
                 seed: int | Sequence[int] | None = None,
                 attention_mask: Tensor | None = None,
                 cache: Cache | None = None, backend: str = "explicit",
                 fast: bool | FastDecoder = False,
                 precision: str | None = None) -> Iterator[DecodeStep]:
    """Each step's last-row logits and chosen tokens, one
    :class:`DecodeStep` at a time.

    prompt_ids: (b, n); attention_mask: (b, n) with 0 for left padding;
    cache: an empty cache to fill (default: a contiguous :class:`KVCache`
    when use_cache). ``fast``: True, or a
    :class:`llmcore.fastpath.FastDecoder` of this model, steps with the
    fast path (its own static cache and fused attention: leave cache,
    use_cache and backend alone). ``precision`` (with fast=True): the
    fast path's weights in "fp32", "bf16", "int8", "w8a8" or "int4"
    (None: the model's own; see :class:`llmcore.fastpath.FastDecoder`).
    The request is checked here, once. Chapters 6, 7 and 13.
    """
    b, _ = check_request(model, prompt_ids, max_new_tokens)
    pick = token_picker(temperature=temperature, top_k=top_k, seed=seed,
                        b=b, device=prompt_ids.device)
    if precision is not None and fast is not True:
        raise ValueError(f"precision={precision!r} chooses the fast "
                         "path's weights: pass fast=True (a FastDecoder "
                         "given as fast has its own)")
    if fast is not False:
        if cache is not None or not use_cache or backend != "explicit":
            raise ValueError("fast=True brings its own cache and "
                             "attention: leave cache, use_cache and "
                             "backend at their defaults")
        runner = (fast_model(model, batch_size=b, precision=precision)
                  if fast is True else fast)
        step = FastStep(runner, model, prompt_ids, max_new_tokens,
                        attention_mask)
    elif use_cache:
        cache = KVCache.for_model(model, b) if cache is None else cache
        step = ModelStep(model, cache, attention_mask, backend)
    elif cache is not None:
        raise ValueError("a cache was given with use_cache=False")
    else:
        step = ModelStep(model, None, attention_mask, backend)
    return decode(step, prompt_ids, max_new_tokens, pick=pick)


def generate(model, prompt_ids: Tensor, max_new_tokens: int, *,
             use_cache: bool = True, temperature: float = 0.0,
             top_k: int | None = None,
             seed: int | Sequence[int] | None = None,
             eos_id: int | None = None,
             attention_mask: Tensor | None = None,
             cache: Cache | None = None, backend: str = "explicit",
             fast: bool | FastDecoder = False,
             precision: str | None = None) -> Tensor:
    """Generate up to max_new_tokens after each prompt.

    prompt_ids: (b, n) -> (b, n + t), t <= max_new_tokens. Greedy by
    default; ``temperature``, ``top_k`` and ``seed`` sample. A sequence
    that emits ``eos_id`` stops: its later entries repeat eos_id, and
    generation ends once every sequence has stopped. ``use_cache`` and
    ``fast`` change the speed, never the tokens; ``precision`` (with
    fast=True) reads the weights in fewer bits, which changes the logits
    a little (chapter 13). Chapters 6 and 7.
    """
    steps = decode_steps(model, prompt_ids, max_new_tokens,
                         use_cache=use_cache, temperature=temperature,
                         top_k=top_k, seed=seed,
                         attention_mask=attention_mask, cache=cache,
                         backend=backend, fast=fast, precision=precision)
    return collect(steps, prompt_ids, eos_id=eos_id)
