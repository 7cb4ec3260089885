"""From logits to tokens: sampling, and the generation loop with or without a KV cache.

Only the last row of the logits predicts the next token. Generation alternates: run the model,
take the last row (b, v), pick a token per sequence, append, repeat. Without a cache every step
re-runs the whole sequence; with one, the prompt runs once (prefill) and each step then computes
only the newest token (decode). Chapters 6 and 7.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
from torch import Tensor

from .cache import Cache
from .kvcache import KVCache
from .masks import NEG_INF
from .shapes import check_shape, check_tensor
from .softmax import softmax


def _generators(seed: int | Sequence[int] | None, b: int, device) -> list[torch.Generator] | None:
    """One generator for the batch (an int), one per sequence (a list), or None (global RNG)."""
    if seed is None:
        return None
    if device is not None and torch.device(device).type == "meta":
        raise ValueError("sampling needs real numbers: the meta device has none (use greedy)")
    seeds = [seed] if isinstance(seed, int) else list(seed)
    if not isinstance(seed, int) and len(seeds) != b:
        raise ValueError(f"seed: expected one seed per sequence ({b}), got {len(seeds)}")
    return [torch.Generator(device=device).manual_seed(s) for s in seeds]


def sample(logits: Tensor, *, temperature: float = 0.0, top_k: int | None = None,
           generator: torch.Generator | Sequence[torch.Generator] | None = None) -> Tensor:
    """Pick one token per row of logits.

    logits: (b, v) -> (b,) long. temperature 0 is greedy (argmax); otherwise sample from
    softmax(logits / temperature), keeping only the top_k largest logits if given.
    generator: one for the whole batch, or a list with one per row (so that a row draws the same
    numbers whether it is sampled alone or in a batch). Chapter 6.
    """
    check_tensor("logits", logits)
    b, v = check_shape("logits", logits, ("b", "v")).values()
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and not 0 < top_k:
        raise ValueError(f"top_k must be positive, got {top_k}")
    if temperature == 0:
        return logits.argmax(dim=-1)
    scaled = logits.float() / temperature
    if top_k is not None and top_k < v:
        kth = scaled.topk(top_k, dim=-1).values[:, -1:]                 # (b, 1)
        scaled = scaled.masked_fill(scaled < kth, NEG_INF)
    probs = softmax(scaled, dim=-1)                                     # (b, v)
    if isinstance(generator, (list, tuple)):
        if len(generator) != b:
            raise ValueError(f"generator: expected one per row ({b}), got {len(generator)}")
        return torch.cat([torch.multinomial(probs[i:i + 1], 1, generator=g)[:, 0]
                          for i, g in enumerate(generator)])
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


@dataclass(frozen=True)
class DecodeStep:
    """One generation step. logits: (b, v), the last row's logits; tokens: (b,), the pick."""

    logits: Tensor
    tokens: Tensor


def decode_steps(model, prompt_ids: Tensor, max_new_tokens: int, *, use_cache: bool = True,
                 temperature: float = 0.0, top_k: int | None = None,
                 seed: int | Sequence[int] | None = None, attention_mask: Tensor | None = None,
                 cache: Cache | None = None,
                 backend: str = "explicit") -> Iterator[DecodeStep]:
    """Yield each step's last-row logits and chosen tokens; ``generate`` collects them.

    prompt_ids: (b, n); attention_mask: (b, n) with 0 for left padding; cache: an empty cache to
    fill (default: a contiguous :class:`KVCache` when use_cache). Chapters 6 and 7.
    """
    check_tensor("prompt_ids", prompt_ids)
    b, n = check_shape("prompt_ids", prompt_ids, ("b", "n")).values()
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if n + max_new_tokens > model.config.max_seq_len:
        raise ValueError(f"prompt of {n} tokens + max_new_tokens = {max_new_tokens} exceeds "
                         f"max_seq_len = {model.config.max_seq_len}")
    generators = _generators(seed, b, prompt_ids.device)
    generator = generators[0] if generators is not None and isinstance(seed, int) else generators
    if use_cache and cache is None:
        cache = KVCache.for_model(model, b)
    if not use_cache and cache is not None:
        raise ValueError("a cache was given with use_cache=False")
    ids, mask = prompt_ids, attention_mask
    new = ids                                        # what the model has not seen yet
    for _ in range(max_new_tokens):
        with torch.no_grad():      # closed before each yield: the caller's grad mode is its own
            if use_cache:
                logits = model(new, cache, attention_mask=mask if new is prompt_ids else None,
                               backend=backend, last_only=True)
            else:
                logits = model(ids, attention_mask=mask, backend=backend, last_only=True)
            last = logits[:, -1]                                             # (b, v)
            token = sample(last, temperature=temperature, top_k=top_k, generator=generator)
        yield DecodeStep(last, token)
        new = token[:, None]                                                 # (b, 1)
        if not use_cache:
            ids = torch.cat([ids, new], dim=1)
            if mask is not None:
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)


def generate(model, prompt_ids: Tensor, max_new_tokens: int, *, use_cache: bool = True,
             temperature: float = 0.0, top_k: int | None = None,
             seed: int | Sequence[int] | None = None, eos_id: int | None = None,
             attention_mask: Tensor | None = None, cache: Cache | None = None,
             backend: str = "explicit", fast: bool = False) -> Tensor:
    """Generate up to max_new_tokens after each prompt.

    prompt_ids: (b, n) -> (b, n + t), t <= max_new_tokens. Greedy by default; ``temperature``,
    ``top_k`` and ``seed`` sample. A sequence that emits ``eos_id`` stops: its later entries
    repeat eos_id, and generation ends once every sequence has stopped. ``use_cache`` changes the
    speed, never the tokens. ``fast=True`` takes the fast path of :mod:`llmcore.fastpath` (its
    own static cache and fused attention: no ``cache``, ``backend`` or ``use_cache=False``), which
    gives the same tokens. Chapters 6 and 7.
    """
    check_tensor("prompt_ids", prompt_ids)
    if fast:
        if cache is not None or not use_cache or backend != "explicit":
            raise ValueError("fast=True brings its own cache and attention: leave cache, "
                             "use_cache and backend at their defaults")
        from .fastpath import generate_fast
        return generate_fast(model, prompt_ids, max_new_tokens, temperature=temperature,
                             top_k=top_k, seed=seed, eos_id=eos_id, attention_mask=attention_mask)
    out = [prompt_ids]
    done = torch.zeros(prompt_ids.shape[0], dtype=torch.bool, device=prompt_ids.device)
    for step in decode_steps(model, prompt_ids, max_new_tokens, use_cache=use_cache,
                             temperature=temperature, top_k=top_k, seed=seed,
                             attention_mask=attention_mask, cache=cache, backend=backend):
        tokens = step.tokens
        if eos_id is not None:
            tokens = torch.where(done, torch.full_like(tokens, eos_id), tokens)
            done = done | (tokens == eos_id)
        out.append(tokens[:, None])
        if eos_id is not None and bool(done.all()):
            break
    return torch.cat(out, dim=1)
