"""A shared prefix: one system prompt's keys and values, computed once, read by every sequence.

When every sequence of a batch starts with the same tokens, their K and V rows are identical in
every layer (causal attention: the prefix never sees what follows it). So they are computed once,
with batch size 1, and each sequence's own tokens go into a cache of their own.

Attention then runs over two sets of keys: the shared rows and the sequence's own. Their scores
are side by side in one row per query, so one softmax over both gives the same weights as over
the concatenated keys; the output is the shared part's weighted values plus the own part's. The
shared K and V are never copied per sequence, not even for a step: the queries of all b
sequences are stacked as the rows of one matmul against them. Chapter 8.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .attention import attention_scores, weighted_values
from .kvcache import KVCache
from .layout import Layout, contiguous_layout
from .masks import causal_mask, mask_bias
from .softmax import softmax


class SharedPrefixCache:
    """A batch of b sequences behind one common prefix of P tokens.

    prefix: a filled :class:`KVCache` of batch size 1 (its K/V are shared, never copied per
    sequence); own: a :class:`KVCache` of batch size b for the tokens after the prefix.
    Satisfies :class:`llmcore.cache.Cache`. Chapter 8.
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
    def prefill(cls, model, prefix_ids: Tensor, *,
                batch_size: int) -> SharedPrefixCache:
        """Run the shared prompt once (batch 1) and return a cache for
        ``batch_size`` sequences.

        prefix_ids: (1, P) token ids. Chapter 8.
        """
        prefix = KVCache.for_model(model, 1, capacity=prefix_ids.shape[1])
        with torch.no_grad():
            model(prefix_ids, prefix)
        room = model.config.max_seq_len - prefix.length
        own = KVCache.for_model(model, batch_size, max_tokens=room)
        return cls(prefix, own)

    @property
    def prefix_length(self) -> int:
        return self.prefix.length

    @property
    def batch_size(self) -> int:
        return self.own.batch_size

    @property
    def max_length(self) -> int:
        """Tokens each sequence holds: the shared prefix plus its own."""
        return self.prefix.length + self.own.length

    def prepare(self, b: int, n: int, attention_mask: Tensor | None) -> Layout:
        """Room for n new tokens in each sequence's own cache; positions continue after the
        prefix. attention_mask: (b, n) bool or None -> Layout."""
        self.own.reserve(b, n)                                   # checks batch size and room
        past_valid = None
        if self.own.valid is not None:
            shared = torch.ones(b, self.prefix.length, dtype=torch.bool, device=self.own.device)
            past_valid = torch.cat([shared, self.own.valid[:, :self.own.length]], dim=1)
        return contiguous_layout(b, n, past_slots=self.max_length, past_valid=past_valid,
                                 attention_mask=attention_mask, device=self.own.device)

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor,
               layout: Layout, backend: str = "explicit") -> Tensor:
        """Attention over the shared rows and each sequence's own rows, one
        softmax over both.

        q: (b, h, n, d_head)   new k, v: (b, h_kv, n, d_head)
        -> (b, h, n, d_head). backend: the fused kernel takes one K per
        sequence, so this path is always explicit.
        """
        own_k, own_v = self.own.update(layer, k, v)   # (b, h_kv, m_own, d_head)
        p = self.prefix.length
        # the shared rows, stored once: (h_kv, P, d_head)
        shared_k = self.prefix.keys[layer][0, :, :p]
        shared_v = self.prefix.values[layer][0, :, :p]
        b, h, n, d_head = q.shape
        # every sequence's queries as rows of one matrix: (h, b n, d_head)
        rows = q.transpose(0, 1).reshape(h, b * n, d_head)
        shared = attention_scores(rows, shared_k)      # (h, b n, P): one matmul
        shared = shared.view(h, b, n, p).transpose(0, 1)  # (b, h, n, P)
        own = attention_scores(q, own_k)                  # (b, h, n, m_own)
        scores = torch.cat([shared, own], dim=-1)         # (b, h, n, P + m_own)
        allowed = layout.mask if layout.mask is not None else \
            causal_mask(n, scores.shape[-1], q.device)
        scores += mask_bias(allowed, scores.dtype)        # + M, as in attention
        weights = softmax(scores, dim=-1, inplace=True)   # in our own buffer
        shared_weights = weights[..., :p].transpose(0, 1).reshape(h, b * n, p)
        out_shared = weighted_values(shared_weights, shared_v)     # (h, b n, .)
        out_shared = out_shared.view(h, b, n, d_head).transpose(0, 1)
        return out_shared + weighted_values(weights[..., p:], own_v)

    def commit(self, n: int, attention_mask: Tensor | None) -> None:
        """The new tokens count in each sequence's own cache (the prefix never changes)."""
        self.own.commit(n, attention_mask)

    def reserved_bytes(self) -> int:
        return self.prefix.reserved_bytes() + self.own.reserved_bytes()

    def used_bytes(self) -> int:
        return self.prefix.used_bytes() + self.own.used_bytes()

    def unshared_bytes(self) -> int:
        """Bytes the same tokens would hold if every sequence kept its own copy of the prefix."""
        return self.batch_size * self.prefix.used_bytes() + self.own.used_bytes()
