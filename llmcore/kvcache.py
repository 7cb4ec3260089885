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
from .masks import sliding_window_mask
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


class RollingKVCache:
    """Sliding-window attention's cache (Mistral): per layer, K and V of the last ``window``
    tokens only, (b, h_kv, <= window, d_head), however long the sequence grows.

    A query sees itself and the window - 1 keys before it, so no later query needs a key older
    than the last window: each layer attends over its kept rows followed by the new ones (a band
    mask, :func:`llmcore.masks.sliding_window_mask`, when they are more than the window), then
    keeps the last ``window`` of them. The keys are stored already rotated, so a key's row
    carries its position and the kept rows could sit in any order (a ring buffer written in
    place is the serving form, :meth:`llmcore.fastpath.FastDecoder.attend_rolling`; this one
    keeps them in order). No padding. Chapter 11.
    """

    def __init__(self, *, n_layers: int, batch_size: int, n_kv_heads: int, d_head: int,
                 window: int, max_seq_len: int, device=None,
                 dtype: torch.dtype = torch.float32):
        if window < 1:
            raise ValueError(f"RollingKVCache: window must be at least 1, got {window}")
        self.n_layers, self.batch_size, self.window = n_layers, batch_size, window
        self.n_kv_heads, self.d_head, self.max_seq_len = n_kv_heads, d_head, max_seq_len
        empty = (batch_size, n_kv_heads, 0, d_head)
        self.keys = [torch.zeros(empty, device=device, dtype=dtype) for _ in range(n_layers)]
        self.values = [torch.zeros(empty, device=device, dtype=dtype) for _ in range(n_layers)]
        self.length = 0                      # tokens seen (positions continue from here)

    @classmethod
    def for_model(cls, model, batch_size: int) -> "RollingKVCache":
        """An empty cache for ``model``, whose config must have a ``sliding_window``."""
        c = model.config
        window = getattr(c, "sliding_window", None)
        if window is None:
            raise ValueError(f"RollingKVCache needs a model with a sliding_window; "
                             f"{type(model).__name__}'s attention sees every earlier key")
        return cls(n_layers=c.n_layers, batch_size=batch_size, n_kv_heads=c.kv_heads,
                   d_head=c.d_head, window=window, max_seq_len=c.max_seq_len,
                   device=model.device, dtype=model.dtype)

    @property
    def max_length(self) -> int:
        """Tokens seen so far (more than it holds once past the window)."""
        return self.length

    def held(self) -> int:
        """Rows each layer holds: min(length, window)."""
        return self.keys[0].shape[2]

    def prepare(self, b: int, n: int, attention_mask: Tensor | None) -> Layout:
        """Positions length .. length + n - 1 and, past the window, the band over the held rows
        and the new ones: (b, 1, n, held + n)."""
        if b != self.batch_size:
            raise ValueError(f"batch-size mismatch: tokens hold b = {b} sequences, the cache "
                             f"holds {self.batch_size}")
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("RollingKVCache holds no padding: pass sequences of equal length")
        if self.length + n > self.max_seq_len:
            raise ValueError(f"cache full: {self.length} seen + {n} new tokens > max_seq_len = "
                             f"{self.max_seq_len}")
        device = self.keys[0].device
        positions = torch.arange(self.length, self.length + n, device=device).expand(b, n)
        m = self.held() + n
        if m <= self.window:
            return Layout(positions, None)                        # the plain causal rule
        band = sliding_window_mask(n, m, self.window, device)     # (n, m)
        return Layout(positions, band.expand(b, 1, n, m))

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, layout: Layout,
               backend: str = "explicit") -> Tensor:
        """q: (b, h, n, d_head), new k, v: (b, h_kv, n, d_head) -> (b, h, n, d_head); keeps the
        last ``window`` rows of this layer."""
        check_operands(k=k, v=v, cache=self.keys[layer])
        keys = torch.cat([self.keys[layer], k], dim=2)            # (b, h_kv, held + n, d_head)
        values = torch.cat([self.values[layer], v], dim=2)
        out = attention(q, keys, values, causal=layout.mask is None, mask=layout.mask,
                        backend=backend)
        self.keys[layer] = keys[:, :, -self.window:].contiguous()
        self.values[layer] = values[:, :, -self.window:].contiguous()
        return out

    def commit(self, n: int, attention_mask: Tensor | None) -> None:
        """The n new tokens count as seen (their rows were kept by ``attend``)."""
        self.length += n
