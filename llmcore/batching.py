"""Batching prompts of unequal length: left padding, attention masks, per-sequence positions.

Activations gain a batch axis, (n, d) -> (b, n, d); the weights do not change. Prompts of
different lengths are left-padded to one length n so that every sequence's newest token sits in
the last column (that is the row whose logits pick the next token). A mask keeps real tokens from
attending to padding, and positions count only real tokens, so each sequence computes exactly
what it computes alone. Chapter 8.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from .generate import decode_steps
from .kvcache import KVCache
from .prefix import SharedPrefixCache

TokenList = Sequence[int]


def pad_batch(prompts: Sequence[TokenList | Tensor], *, pad_id: int = 0,
              device=None) -> tuple[Tensor, Tensor]:
    """Left-pad token lists to one length.

    prompts: b sequences of token ids (lists or 1-D tensors), each
    non-empty -> tokens (b, n) long, attention_mask (b, n) bool (False on
    padding), n = the longest prompt. Chapter 8.
    """
    if len(prompts) == 0:
        raise ValueError("pad_batch: expected at least one prompt, "
                         "got none")
    rows = [p.tolist() if isinstance(p, Tensor) else list(p)
            for p in prompts]
    for i, row in enumerate(rows):
        if len(row) == 0:
            raise ValueError(f"pad_batch: prompt {i} is empty; every "
                             "prompt needs a token")
    n = max(len(row) for row in rows)
    b = len(rows)
    tokens = torch.full((b, n), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros(b, n, dtype=torch.bool, device=device)
    for i, row in enumerate(rows):
        tokens[i, n - len(row):] = torch.tensor(row, dtype=torch.long,
                                                device=device)
        mask[i, n - len(row):] = True
    return tokens, mask


def generate_batch(model, prompts: Sequence[TokenList | Tensor],
                   max_new_tokens: int | Sequence[int], *,
                   eos_id: int | None = None, temperature: float = 0.0,
                   top_k: int | None = None,
                   seeds: Sequence[int] | None = None,
                   use_cache: bool = True,
                   prefix: TokenList | Tensor | None = None,
                   pad_id: int = 0,
                   backend: str = "explicit") -> list[list[int]]:
    """Generate for several prompts in one batch; return each sequence's
    new tokens.

    prompts: b token lists of any lengths. max_new_tokens: one limit for
    all, or one per sequence. A sequence stops at its own limit or right
    after emitting eos_id (which is kept); the batch stops when every
    sequence has. seeds: one per sequence, so sampling draws what it draws
    alone. prefix: tokens shared by every prompt (a system prompt), placed
    before each prompt; its keys and values are computed once and shared
    (:class:`llmcore.prefix.SharedPrefixCache`).
    -> b lists of generated token ids. Chapter 8.
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
    cache = None
    if prefix is not None:
        if not use_cache:
            raise ValueError("prefix sharing needs the KV cache: "
                             "use_cache=True")
        prefix_ids = torch.as_tensor(prefix, dtype=torch.long,
                                     device=device).reshape(1, -1)
        cache = SharedPrefixCache.prefill(model, prefix_ids, batch_size=b)
    elif use_cache:
        cache = KVCache.for_model(model, b)
    outputs: list[list[int]] = [[] for _ in range(b)]
    done = [limit == 0 for limit in limits]
    if all(done):
        return outputs
    steps = decode_steps(model, tokens, max(limits), use_cache=use_cache,
                         cache=cache, attention_mask=mask,
                         temperature=temperature, top_k=top_k,
                         seed=list(seeds) if seeds is not None else None,
                         backend=backend)
    for step in steps:
        for i, token in enumerate(step.tokens.tolist()):
            if done[i]:
                continue
            outputs[i].append(token)
            done[i] = len(outputs[i]) >= limits[i] or token == eos_id
        if all(done):
            break
    return outputs
