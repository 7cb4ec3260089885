"""The interface every KV cache speaks to the model, stated in code.

A forward call with a cache (``model(tokens, cache)``, :meth:`llmcore.decoder.Decoder.forward`)
asks it, in this order:

1. ``max_length``: how many tokens its longest sequence already holds (for the max_seq_len check);
2. ``prepare(b, n, attention_mask)``: whether n more tokens for b sequences fit (it raises before
   anything is written, so a refused call changes nothing), making room if needed, and where the
   new tokens sit (their positions and the keys each may see, a :class:`~llmcore.layout.Layout`);
3. ``attend(layer, q, k, v, layout, backend)`` once per layer: store this layer's new K and V rows
   and return the new queries' attention over every key they may see;
4. ``commit(n, attention_mask)``: the new tokens now count as cached.

:class:`llmcore.kvcache.KVCache` (contiguous), :class:`llmcore.prefix.SharedPrefixCache` (a
common prefix read by every sequence) and :class:`llmcore.paged_batch.PagedBatch` (some sequences
of a :class:`llmcore.paged.PagedKVCache`) all satisfy :class:`Cache`; generation, batching and
serving use nothing else. The fast path's :class:`llmcore.fastpath.StaticCache` is not a
:class:`Cache`: it is never handed to a model's forward; :class:`llmcore.fastpath.FastDecoder`
writes its layers' rows into it directly, so it needs no interface. Chapters 7-9.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import Tensor

from .layout import Layout


@runtime_checkable
class Cache(Protocol):
    """What a model's forward needs of a KV cache (b sequences, h query heads, h_kv K/V heads)."""

    @property
    def max_length(self) -> int:
        """Tokens held by the longest sequence: the new tokens get positions from here on."""
        ...

    def prepare(self, b: int, n: int, attention_mask: Tensor | None) -> Layout:
        """Make room for n new tokens in each of b sequences and say where they sit.

        attention_mask: (b, n) bool, False for padding, or None.
        -> Layout: positions (b, n) long, mask (b, 1, n, m) bool or None (plain causal rule).
        Raises ValueError (or OutOfBlocks) before writing anything when they do not fit.
        """
        ...

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, layout: Layout,
               backend: str = "explicit") -> Tensor:
        """Store layer ``layer``'s new rows; attend the new queries over all visible keys.

        q: (b, h, n, d_head)   k, v: (b, h_kv, n, d_head)   ->   (b, h, n, d_head)
        layout: what ``prepare`` returned for this call; backend: as in llmcore.attention.
        """
        ...

    def commit(self, n: int, attention_mask: Tensor | None) -> None:
        """Count the n new tokens (those attention_mask (b, n) marks real) as cached."""
        ...
