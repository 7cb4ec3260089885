"""Where the tokens of one forward call sit: their positions, and which keys each may see.

A forward call computes n new tokens per sequence. Each needs a position (to look up its position
embedding) and a set of visible keys: the keys of earlier tokens of its own sequence, never
padding, never the future. Without padding that is the plain causal rule, and ``mask`` is None.
With padding (prompts of unequal length in one batch) or sequences of unequal length (a paged
cache), each sequence gets its own row of the mask. Every cache kind produces a ``Layout``;
the model only reads it. Chapters 7-9.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .masks import causal_mask
from .shapes import check_shape, check_tensor


@dataclass(frozen=True)
class Layout:
    """positions: (b, n) long, the position of each new token in its own sequence.
    mask: (b, 1, n, m) bool, True where a new token may attend to key slot j, or None for the plain
    bottom-right causal rule over m = (past slots) + n keys, the same for every sequence."""

    positions: Tensor
    mask: Tensor | None


def check_attention_mask(attention_mask: Tensor | None, b: int, n: int,
                         device: torch.device) -> Tensor | None:
    """Validate an attention mask for new tokens: (b, n), True (or 1) for real tokens, False for
    padding. Returns it as bool, or None when absent."""
    if attention_mask is None:
        return None
    check_tensor("attention_mask", attention_mask)
    check_shape("attention_mask", attention_mask, (b, n))
    if attention_mask.device != device:
        raise ValueError(f"attention_mask is on {attention_mask.device} but tokens are on {device}")
    if attention_mask.dtype.is_floating_point or attention_mask.is_complex():
        raise TypeError(f"attention_mask: expected bool or integer (1 = token, 0 = padding), "
                        f"got {attention_mask.dtype}")
    return attention_mask.bool()


def contiguous_layout(b: int, n: int, *, past_slots: int,
                      past_valid: Tensor | None,
                      attention_mask: Tensor | None,
                      device: torch.device) -> Layout:
    """Layout for sequences that share slot numbers (no cache, or one
    contiguous cache).

    past_slots: key slots already cached (same for every sequence);
    past_valid: (b, past_slots) bool, which of them hold real tokens, or
    None if all do; attention_mask: (b, n) bool or None. Positions count
    only real tokens, so a left-padded sequence starts at position 0.
    """
    if attention_mask is None and past_valid is None:
        positions = torch.arange(past_slots, past_slots + n, device=device)
        return Layout(positions.expand(b, n), None)
    new_valid = attention_mask if attention_mask is not None else \
        torch.ones(b, n, dtype=torch.bool, device=device)
    old_valid = past_valid if past_valid is not None else \
        torch.ones(b, past_slots, dtype=torch.bool, device=device)
    key_valid = torch.cat([old_valid, new_valid], dim=-1)           # (b, m)
    before = old_valid.sum(dim=-1, keepdim=True)                    # (b, 1)
    positions = before + new_valid.cumsum(dim=-1) - 1
    positions = positions.clamp(min=0)                              # (b, n)
    m = past_slots + n
    visible = key_valid[:, None, None, :]                     # (b, 1, 1, m)
    mask = causal_mask(n, m, device) & visible                # (b, 1, n, m)
    return Layout(positions, mask)


def ragged_layout(lengths: list[int], n: int, device: torch.device) -> Layout:
    """Layout for sequences with their own cached lengths (a paged cache), n new tokens each.

    lengths: b ints, tokens already cached per sequence. Keys are gathered into
    m = max(lengths) + n slots; sequence s's new token i sits at position lengths[s] + i and sees
    key slots j <= lengths[s] + i (slots past its own length are never seen).
    """
    positions = torch.tensor(lengths, device=device)[:, None] + torch.arange(n, device=device)
    slots = torch.arange(max(lengths) + n, device=device)                     # (m,)
    mask = slots[None, None, :] <= positions[:, :, None]                      # (b, n, m)
    return Layout(positions, mask.unsqueeze(1))                               # (b, 1, n, m)
