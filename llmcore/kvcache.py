"""The KV cache: keep every layer's K and V rows of past tokens, compute only the new rows.

During generation each step adds one token. Its query must meet the keys and values of every
earlier token, and those never change (the weights are fixed and the past is causal), so they are
kept instead of recomputed. Q is not kept: only the newest query is ever needed again.

Every cache kind in llmcore (this contiguous one, ``llmcore.prefix.SharedPrefixCache`` and
``llmcore.paged.PagedKVCache``'s batches) satisfies :class:`llmcore.cache.Cache`, the interface the
model uses: ``max_length``, ``prepare``, ``attend`` once per layer, ``commit``. Most kinds attend
as :func:`attend_after_update`: ``update`` the store, which returns all visible rows
(b, h_kv, m, d_head), then call :func:`llmcore.attention.attention`.

Chapter 7.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .attention import attention
from .layout import Layout, contiguous_layout
from .shapes import check_operands, check_shape


def kv_bytes_per_token(n_layers: int, n_kv_heads: int, d_head: int,
                       bytes_per_element: int) -> int:
    """Cache bytes one token costs: a K and a V row, per K/V head, per
    layer.

    2 * L * h_kv * d_head * bytes_per_element. Chapter 7.
    """
    return 2 * n_layers * n_kv_heads * d_head * bytes_per_element


def attend_after_update(cache, layer: int, q: Tensor, k: Tensor, v: Tensor,
                        layout: Layout,
                        backend: str = "explicit") -> Tensor:
    """Store the new rows with ``cache.update``, then attend over all the
    rows it returns.

    q: (b, h, n, d_head)   k, v: (b, h_kv, n, d_head)
    -> (b, h, n, d_head). Chapter 7.
    """
    k, v = cache.update(layer, k, v)                  # (b, h_kv, m, d_head)
    return attention(q, k, v, causal=layout.mask is None, mask=layout.mask,
                     backend=backend)


class KVCache:
    """One contiguous cache for a batch: per layer, K and V of shape (b, h_kv, capacity, d_head).

    All sequences of the batch share slot numbers; slot j of a left-padded sequence may hold
    padding, which ``valid`` (b, capacity) records so that no query ever attends to it.

    capacity: slots to reserve up front. The default reserves max_seq_len, so nothing is ever
    copied; a smaller start doubles when full (amortised: log2(max_seq_len / capacity) copies in
    all, counted in ``grow_count``). Chapter 7.
    """

    def __init__(self, *, n_layers: int, batch_size: int, n_kv_heads: int, d_head: int,
                 max_seq_len: int, capacity: int | None = None, device=None,
                 dtype: torch.dtype = torch.float32):
        capacity = max_seq_len if capacity is None else capacity
        if not 0 < capacity <= max_seq_len:
            raise ValueError(f"capacity must lie in [1, max_seq_len = {max_seq_len}], got {capacity}")
        self.n_layers, self.batch_size = n_layers, batch_size
        self.n_kv_heads, self.d_head, self.max_seq_len = n_kv_heads, d_head, max_seq_len
        shape = (batch_size, n_kv_heads, capacity, d_head)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layers)]
        self.valid: Tensor | None = None     # (b, capacity) bool once any padding was cached
        self.length = 0                      # slots filled (the same for every sequence)
        self.grow_count = 0

    @classmethod
    def for_model(cls, model, batch_size: int, *, capacity: int | None = None,
                  max_tokens: int | None = None) -> "KVCache":
        """An empty cache shaped for ``model`` (a :class:`llmcore.model.GPT`), on its device.

        max_tokens: the most tokens per sequence it will hold (default: the model's max_seq_len).
        """
        c = model.config
        return cls(n_layers=c.n_layers, batch_size=batch_size, n_kv_heads=c.kv_heads,
                   d_head=c.d_head, max_seq_len=c.max_seq_len if max_tokens is None else max_tokens,
                   capacity=capacity, device=model.device, dtype=model.dtype)

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    @property
    def max_length(self) -> int:
        """Tokens cached so far (every sequence of the batch shares the slot count)."""
        return self.length

    @property
    def device(self) -> torch.device:
        return self.keys[0].device

    def prepare(self, b: int, n: int, attention_mask: Tensor | None) -> Layout:
        """Room for n new slots (growing the buffers if needed); their
        positions and mask.

        attention_mask: (b, n) bool or None -> Layout (positions (b, n), mask
        or None). See :meth:`llmcore.cache.Cache.prepare`."""
        self.reserve(b, n)
        past_valid = None if self.valid is None else self.valid[:, :self.length]
        return contiguous_layout(b, n, past_slots=self.length,
                                 past_valid=past_valid,
                                 attention_mask=attention_mask,
                                 device=self.device)

    def reserve(self, b: int, n: int) -> None:
        """Check that n more tokens for b sequences fit, and grow the buffers if needed."""
        if b != self.batch_size:
            raise ValueError(f"batch-size mismatch: tokens hold b = {b} sequences, the cache holds "
                             f"{self.batch_size}")
        if self.length + n > self.max_seq_len:
            raise ValueError(f"cache full: {self.length} cached + {n} new tokens > max_seq_len = "
                             f"{self.max_seq_len}")
        if self.length + n > self.capacity:
            self._grow(self.length + n)

    def _grow(self, needed: int) -> None:
        """Double the capacity (at least to ``needed``, at most max_seq_len): one copy of the past."""
        new_capacity = min(self.max_seq_len, max(needed, 2 * self.capacity))
        for store in (self.keys, self.values):
            for layer, old in enumerate(store):
                new = old.new_zeros(*old.shape[:2], new_capacity, old.shape[3])
                new[:, :, :self.length] = old[:, :, :self.length]
                store[layer] = new
        if self.valid is not None:
            valid = self.valid.new_zeros(self.batch_size, new_capacity)
            valid[:, :self.length] = self.valid[:, :self.length]
            self.valid = valid
        self.grow_count += 1

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write rows [length, length + n) of this layer; return rows
        [0, length + n).

        k, v: (b, h_kv, n, d_head) -> (b, h_kv, m, d_head) each, m = length + n
        (views, no copy).
        """
        keys, values = self.keys[layer], self.values[layer]
        check_operands(k=k, v=v, cache=keys)
        shape = (self.batch_size, self.n_kv_heads, "n", self.d_head)
        sizes = check_shape("k", k, shape)
        check_shape("v", v, shape, **sizes)
        end = self.length + k.shape[2]
        keys[:, :, self.length:end] = k
        values[:, :, self.length:end] = v
        return keys[:, :, :end], values[:, :, :end]

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, layout: Layout,
               backend: str = "explicit") -> Tensor:
        """q: (b, h, n, d_head), new k, v: (b, h_kv, n, d_head) -> (b, h, n, d_head)."""
        return attend_after_update(self, layer, q, k, v, layout, backend)

    def commit(self, n: int, attention_mask: Tensor | None) -> None:
        """The n slots written by this call now count; attention_mask (b, n)
        records which of them are padding (never attended to later)."""
        if attention_mask is not None and self.valid is None:
            self.valid = torch.ones(self.batch_size, self.capacity,
                                    dtype=torch.bool, device=self.device)
        if self.valid is not None:
            new = True if attention_mask is None else attention_mask
            self.valid[:, self.length:self.length + n] = new
        self.length += n

    def truncate(self, length: int) -> None:
        """Forget every token from ``length`` on (the buffers stay; later tokens overwrite them)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"truncate: length must lie in [0, {self.length}], got {length}")
        self.length = length

    def tokens_held(self) -> int:
        """Real (non-padding) tokens cached, summed over the batch."""
        if self.valid is None:
            return self.batch_size * self.length
        return int(self.valid[:, :self.length].sum())

    def reserved_bytes(self) -> int:
        """Bytes of every K and V buffer, used or not."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def used_bytes(self) -> int:
        """Bytes that hold real tokens' K and V."""
        element = self.keys[0].element_size()
        return self.tokens_held() * kv_bytes_per_token(self.n_layers, self.n_kv_heads,
                                                        self.d_head, element)
