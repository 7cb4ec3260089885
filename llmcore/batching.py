"""Batching prompts of unequal length: left padding, attention masks, per-sequence positions.

Activations gain a batch axis, (n, d) -> (b, n, d); the weights do not change. Prompts of
different lengths are left-padded to one length n so that every sequence's newest token sits in
the last column (that is the row whose logits pick the next token). A mask keeps real tokens from
attending to padding, and positions count only real tokens, so each sequence computes exactly
what it computes alone. :func:`llmcore.generate.generate_batch` generates for such a batch.
Chapter 8.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor


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
