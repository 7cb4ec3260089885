"""A shared prefix: one system prompt's keys and values, computed once, read by every sequence.

When every sequence of a batch starts with the same tokens, their K and V rows are identical in
every layer (causal attention: the prefix never sees what follows it). So they are computed once,
with batch size 1, and each sequence's own tokens go into a cache of their own. At attention time
each layer's keys are the shared rows followed by the sequence's own rows. Chapter 8.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .kvcache import KVCache
from .layout import Layout, contiguous_layout


class SharedPrefixCache:
    """A batch of b sequences behind one common prefix of P tokens.

    prefix: a filled :class:`KVCache` of batch size 1 (its K/V are shared, never copied per
    sequence); own: a :class:`KVCache` of batch size b for the tokens after the prefix.
    Speaks the cache protocol of :mod:`llmcore.kvcache`. Chapter 8.
    """

    def __init__(self, prefix: KVCache, own: KVCache):
        if prefix.batch_size != 1:
            raise ValueError(f"prefix: expected a cache of batch size 1, got {prefix.batch_size}")
        if prefix.length == 0:
            raise ValueError("prefix: the cache is empty; prefill the shared prompt first")
        if prefix.valid is not None and not bool(prefix.valid[:, :prefix.length].all()):
            raise ValueError("prefix: the shared prompt must not contain padding")
        if own.length != 0:
            raise ValueError(f"own: expected an empty cache, got {own.length} tokens")
        self.prefix, self.own = prefix, own

    @classmethod
    def prefill(cls, model, prefix_ids: Tensor, *, batch_size: int) -> "SharedPrefixCache":
        """Run the shared prompt once (batch 1) and return a cache for ``batch_size`` sequences.

        prefix_ids: (1, P) token ids. Chapter 8.
        """
        prefix = KVCache.for_model(model, 1, capacity=prefix_ids.shape[1])
        with torch.no_grad():
            model(prefix_ids, prefix)
        own = KVCache.for_model(model, batch_size,
                                max_tokens=model.config.max_seq_len - prefix.length)
        return cls(prefix, own)

    @property
    def prefix_length(self) -> int:
        return self.prefix.length

    @property
    def batch_size(self) -> int:
        return self.own.batch_size

    @property
    def max_length(self) -> int:
        return self.prefix.length + self.own.length

    def prepare(self, b: int, n: int, attention_mask: Tensor | None) -> Layout:
        self.own.reserve(b, n)                                   # checks batch size and room
        past_valid = None
        if self.own.valid is not None:
            shared = torch.ones(b, self.prefix.length, dtype=torch.bool, device=self.own.device)
            past_valid = torch.cat([shared, self.own.valid[:, :self.own.length]], dim=1)
        return contiguous_layout(b, n, past_slots=self.max_length, past_valid=past_valid,
                                 attention_mask=attention_mask, device=self.own.device)

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """k, v: (b, h_kv, n, d_head) -> (b, h_kv, P + m_own, d_head): shared rows, then own.

        The concatenation is a working tensor for this layer's attention only; what the cache
        holds is the prefix once and each sequence's own rows."""
        own_k, own_v = self.own.update(layer, k, v)
        p = self.prefix.length
        shared_k = self.prefix.keys[layer][:, :, :p].expand(k.shape[0], -1, -1, -1)
        shared_v = self.prefix.values[layer][:, :, :p].expand(k.shape[0], -1, -1, -1)
        return torch.cat([shared_k, own_k], dim=2), torch.cat([shared_v, own_v], dim=2)

    def commit(self, n: int, attention_mask: Tensor | None) -> None:
        self.own.commit(n, attention_mask)

    def reserved_bytes(self) -> int:
        return self.prefix.reserved_bytes() + self.own.reserved_bytes()

    def used_bytes(self) -> int:
        return self.prefix.used_bytes() + self.own.used_bytes()

    def unshared_bytes(self) -> int:
        """Bytes the same tokens would hold if every sequence kept its own copy of the prefix."""
        return self.batch_size * self.prefix.used_bytes() + self.own.used_bytes()
