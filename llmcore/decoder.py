"""What every decoder-only model in llmcore shares: its sizes, and the shell around its blocks.

    x = embed(tokens, positions)                       (b, n, d)   the model's own
    for each block:  x = block(x, layout, cache)       (b, n, d)   the model's own blocks
    logits = head(x)                                   (b, n, v)   the model's own

GPT (:mod:`llmcore.model`) and Llama (:mod:`llmcore.llama`) each write only their pieces: the
embedding (and whether positions enter there), the block, the head, and the initial value of
each parameter. The shell does the rest once for both: it checks the tokens, lays out positions
and masks (or asks the cache to), runs the blocks and commits the cache. Chapters 5 and 11.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

from .attention import BACKENDS
from .cache import Cache
from .kvcache import KVCache
from .layout import Layout, check_attention_mask, contiguous_layout
from .masks import sliding_window_mask
from .multihead import head_sizes
from .shapes import check_shape, check_tensor


@dataclass(frozen=True)
class DecoderSizes:
    """The sizes every decoder-only transformer in llmcore has (GPT and Llama), checked once:
    vocabulary, context, width, heads, layers, and the optional K/V head count and FFN width.
    Each model's config adds its own settings."""

    vocab_size: int = 256
    max_seq_len: int = 64
    d_model: int = 32
    n_heads: int = 4
    n_layers: int = 2
    n_kv_heads: int | None = None
    d_ff: int | None = None

    def __post_init__(self) -> None:
        kind = type(self).__name__
        for name in ("vocab_size", "max_seq_len", "d_model", "n_heads", "n_layers"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{kind}.{name} must be positive, got {getattr(self, name)}")
        head_sizes(self.d_model, self.n_heads, self.n_kv_heads)   # raises on uneven heads
        if self.d_ff is not None and self.d_ff <= 0:
            raise ValueError(f"{kind}.d_ff must be positive, got {self.d_ff}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """h_kv: the number of K/V heads (n_heads unless grouped-query attention is used)."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def ffn_width(self) -> int:
        """f: the FFN's hidden width (default 4 d_model)."""
        return 4 * self.d_model if self.d_ff is None else self.d_ff

    def to_dict(self) -> dict:
        return asdict(self)


def parameter(*shape: int, device, dtype) -> nn.Parameter:
    """A parameter of this shape, not yet filled (the model's ``reset_parameters`` fills it)."""
    return nn.Parameter(torch.empty(*shape, device=device, dtype=dtype))


class Decoder(nn.Module):
    """The shell of a decoder-only model: token ids (b, n) -> logits (b, n, v).

    A model subclasses it, builds ``token_embedding`` (v, d) and ``blocks`` (each called as
    ``block(x, layout, cache, layer, backend)``), calls ``reset_parameters(seed)`` last, and
    defines ``embed``, ``head`` and ``init_parameter``. Chapters 5 and 11.
    """

    def __init__(self, config: DecoderSizes):
        super().__init__()
        self.config = config

    def embed(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """tokens, positions: (b, n) -> the blocks' input x (b, n, d)."""
        raise NotImplementedError

    def head(self, x: Tensor) -> Tensor:
        """x: (b, n, d), the last block's output -> logits (b, n, v)."""
        raise NotImplementedError

    def init_parameter(self, name: str, p: Tensor, generator: torch.Generator) -> None:
        """Fill the parameter called ``name`` with its initial values, drawn from generator."""
        raise NotImplementedError

    @torch.no_grad()
    def reset_parameters(self, seed: int = 0) -> None:
        """Every parameter's initial values, in order, from one generator seeded with seed."""
        if self.device.type == "meta":
            return                                   # shapes only: there is nothing to fill
        generator = torch.Generator(device=self.device).manual_seed(seed)
        for name, p in self.named_parameters():
            self.init_parameter(name, p, generator)

    @property
    def device(self) -> torch.device:
        return self.token_embedding.device

    @property
    def dtype(self) -> torch.dtype:
        return self.token_embedding.dtype

    def num_parameters(self) -> int:
        """Parameter count (a tied embedding counted once)."""
        return sum(p.numel() for p in self.parameters())

    def check_tokens(self, tokens: object, past: int = 0) -> Tensor:
        """Validate token ids (b, n) against this model: type, device, range, length."""
        tokens = check_tensor("tokens", tokens)
        if tokens.dtype.is_floating_point or tokens.dtype == torch.bool or tokens.is_complex():
            raise TypeError(f"tokens: expected integer token ids, got {tokens.dtype}")
        check_shape("tokens", tokens, ("b", "n"))
        if tokens.device != self.device:
            raise ValueError(f"tokens are on {tokens.device} but the model's parameters are on "
                             f"{self.device}; move one of them (tokens.to(model.device))")
        if tokens.shape[1] == 0:
            raise ValueError("tokens: expected at least one token per sequence, got shape "
                             f"{tuple(tokens.shape)}")
        if past + tokens.shape[1] > self.config.max_seq_len:
            raise ValueError(f"sequence too long: {past} cached + {tokens.shape[1]} new tokens > "
                             f"max_seq_len = {self.config.max_seq_len}")
        if tokens.device.type != "meta" and tokens.numel():
            low, high = int(tokens.min()), int(tokens.max())
            if low < 0 or high >= self.config.vocab_size:
                raise ValueError(f"tokens: ids must lie in [0, {self.config.vocab_size}), got "
                                 f"values from {low} to {high}")
        return tokens

    def windowed(self, layout: Layout, cache: Cache | None, past: int) -> Layout:
        """The layout cut to the model's sliding window (``config.sliding_window``, Mistral): a
        query sees itself and the window - 1 keys before it, as
        :func:`llmcore.masks.sliding_window_mask` draws. Without a cache and with a contiguous
        :class:`llmcore.kvcache.KVCache` the slots are bottom-right aligned, so the band is that
        mask (with left padding too: slots and positions differ by a constant per sequence); a
        cache that keeps only the window itself (its ``window`` attribute, e.g.
        :class:`llmcore.kvcache.RollingKVCache`) lays out its own band. Any other cache holding
        more than the window is refused rather than attended wrongly. Chapter 11."""
        window = getattr(self.config, "sliding_window", None)
        own = getattr(cache, "window", None)
        if own is not None and own != window:
            raise ValueError(f"{type(cache).__name__} keeps a window of {own} keys, but this "
                             f"model's sliding_window is {window}")
        n = layout.positions.shape[1]
        if window is None or own is not None or past + n <= window:
            return layout                         # every key it holds is within the window
        if cache is not None and type(cache) is not KVCache:
            raise ValueError(f"sliding-window attention over {past + n} > {window} tokens "
                             f"is implemented without a cache, with KVCache and with "
                             f"RollingKVCache, not with {type(cache).__name__}")
        band = sliding_window_mask(n, past + n, window, layout.positions.device)   # (n, m)
        mask = band if layout.mask is None else layout.mask & band            # (b, 1, n, m)
        return Layout(layout.positions, mask.expand(len(layout.positions), 1, *band.shape))

    def forward(self, tokens: Tensor, cache: Cache | None = None, *,
                attention_mask: Tensor | None = None, backend: str = "explicit",
                last_only: bool = False) -> Tensor:
        """Logits for every position, or only the last with ``last_only``.

        tokens: (b, n) ids; attention_mask: (b, n), 1 for real tokens, 0 for
        padding (optional); cache: a KV cache (any llmcore.cache.Cache)
        holding the sequences' past; it gains these n tokens.
        -> logits (b, n, v), or (b, 1, v) with last_only.
        """
        if backend not in BACKENDS:
            raise ValueError(f"backend: expected one of {BACKENDS}, "
                             f"got {backend!r}")
        past = 0 if cache is None else cache.max_length
        tokens = self.check_tokens(tokens, past)
        b, n = tokens.shape
        mask = check_attention_mask(attention_mask, b, n, tokens.device)
        if cache is None:
            layout = contiguous_layout(b, n, past_slots=0, past_valid=None,
                                       attention_mask=mask,
                                       device=tokens.device)
        else:            # checks that the tokens fit before anything is written
            layout = cache.prepare(b, n, mask)
        layout = self.windowed(layout, cache, past)
        x = self.embed(tokens, layout.positions)                     # (b, n, d)
        for layer, block in enumerate(self.blocks):
            x = block(x, layout, cache, layer, backend)              # (b, n, d)
        if cache is not None:
            cache.commit(n, mask)
        if last_only:
            x = x[:, -1:]                                            # (b, 1, d)
        return self.head(x)                                          # (b, n, v)
