"""A GPT-2-style decoder: learned positions, pre-norm blocks, tied embedding and unembedding.

This module composes the operations of the earlier modules; it adds no new maths::

    x = token_embedding[tokens] + position_embedding[positions]        (b, n, d)
    for each block:  x = x + attention(layer_norm(x));  x = x + ffn(layer_norm(x))
    logits = layer_norm(x) @ token_embedding^T                         (b, n, v)

Parameters are plain tensors named as in the book (``w_qkv``, ``w_o``, ``w_up``, ...), held by
small ``torch.nn.Module`` containers so that ``.to(device)``, optimisers and ``state_dict`` work.
State never lives on the model: a KV cache is made by the caller and passed in. Chapter 5.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

from .attention import BACKENDS, attention
from .cache import Cache
from .ffn import ffn
from .layout import Layout, check_attention_mask, contiguous_layout
from .matmul import linear
from .multihead import head_sizes, merge_heads, qkv_projection
from .norm import LN_EPS, layer_norm
from .shapes import check_shape, check_tensor

INIT_STD = 0.02
"""Standard deviation of GPT-2's initial weights; residual output projections get
INIT_STD / sqrt(2 L) so the residual stream's variance does not grow with depth."""


@dataclass(frozen=True)
class DecoderSizes:
    """The sizes every decoder-only transformer in llmcore has (GPT here, Llama in
    :mod:`llmcore.llama`), checked once: vocabulary, context, width, heads, layers, and the
    optional K/V head count and FFN width. Each model's config adds its own settings."""

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


@dataclass(frozen=True)
class GPTConfig(DecoderSizes):
    """Sizes of a GPT. d_ff defaults to 4 d_model and n_kv_heads to n_heads (plain multi-head)."""

    ln_eps: float = LN_EPS


def _param(*shape: int, device, dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, device=device, dtype=dtype))


class LayerNorm(nn.Module):
    """scale, shift: (d,). Chapter 5."""

    def __init__(self, d: int, eps: float, *, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.scale = _param(d, device=device, dtype=dtype)
        self.shift = _param(d, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        return layer_norm(x, self.scale, self.shift, self.eps)


class Attention(nn.Module):
    """Causal self-attention with one combined projection w_qkv: (d, (h + 2 h_kv) d_head) and
    the output projection w_o: (d, d). Chapter 4."""

    def __init__(self, config: GPTConfig, *, device=None, dtype=None):
        super().__init__()
        self.n_heads, self.n_kv_heads = config.n_heads, config.kv_heads
        d, width = config.d_model, (config.n_heads + 2 * config.kv_heads) * config.d_head
        self.w_qkv = _param(d, width, device=device, dtype=dtype)
        self.b_qkv = _param(width, device=device, dtype=dtype)
        self.w_o = _param(d, d, device=device, dtype=dtype)
        self.b_o = _param(d, device=device, dtype=dtype)

    def forward(self, x: Tensor, layout: Layout, cache: Cache | None = None,
                layer: int = 0, backend: str = "explicit") -> Tensor:
        """x: (b, n, d) -> (b, n, d). With a cache, the queries also see the cached past."""
        q, k, v = qkv_projection(x, self.w_qkv, self.b_qkv, n_heads=self.n_heads,
                                 n_kv_heads=self.n_kv_heads)       # (b, h, n, d_head), (b, h_kv, n, d_head)
        if cache is None:
            out = attention(q, k, v, causal=layout.mask is None, mask=layout.mask,
                            backend=backend)                         # (b, h, n, d_head)
        else:                                   # the cache adds the past: m = past + n keys
            out = cache.attend(layer, q, k, v, layout, backend)      # (b, h, n, d_head)
        return linear(merge_heads(out), self.w_o, self.b_o)          # (b, n, d)


class FeedForward(nn.Module):
    """w_up: (d, f), w_down: (f, d) with biases. Chapter 5."""

    def __init__(self, config: GPTConfig, *, device=None, dtype=None):
        super().__init__()
        d, f = config.d_model, config.ffn_width
        self.w_up = _param(d, f, device=device, dtype=dtype)
        self.b_up = _param(f, device=device, dtype=dtype)
        self.w_down = _param(f, d, device=device, dtype=dtype)
        self.b_down = _param(d, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        return ffn(x, self.w_up, self.b_up, self.w_down, self.b_down)


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(ln_1(x)), then + ffn(ln_2(x)). Shape-preserving,
    (b, n, d) -> (b, n, d), which is why blocks stack. Chapter 5."""

    def __init__(self, config: GPTConfig, *, device=None, dtype=None):
        super().__init__()
        self.ln_1 = LayerNorm(config.d_model, config.ln_eps, device=device, dtype=dtype)
        self.attention = Attention(config, device=device, dtype=dtype)
        self.ln_2 = LayerNorm(config.d_model, config.ln_eps, device=device, dtype=dtype)
        self.ffn = FeedForward(config, device=device, dtype=dtype)

    def forward(self, x: Tensor, layout: Layout, cache: Cache | None = None,
                layer: int = 0, backend: str = "explicit") -> Tensor:
        x = x + self.attention(self.ln_1(x), layout, cache, layer, backend)   # residual
        return x + self.ffn(self.ln_2(x))                                    # residual


class GPT(nn.Module):
    """The whole model. ``model(tokens)`` maps token ids (b, n) to logits (b, n, v).

    config: sizes; device, dtype: where and how the parameters live (``"meta"`` builds shapes
    only); seed: the initial weights are drawn from a generator seeded with it. Chapter 5.
    """

    def __init__(self, config: GPTConfig, *, device=None, dtype=None, seed: int = 0):
        super().__init__()
        self.config = config
        d = config.d_model
        self.token_embedding = _param(config.vocab_size, d, device=device, dtype=dtype)   # (v, d)
        self.position_embedding = _param(config.max_seq_len, d, device=device, dtype=dtype)
        self.blocks = nn.ModuleList(Block(config, device=device, dtype=dtype)
                                    for _ in range(config.n_layers))
        self.ln_f = LayerNorm(d, config.ln_eps, device=device, dtype=dtype)
        self.reset_parameters(seed)

    @torch.no_grad()
    def reset_parameters(self, seed: int = 0) -> None:
        """GPT-2's initialisation: N(0, 0.02) weights, zero biases, unit LayerNorm scales."""
        device = self.token_embedding.device
        if device.type == "meta":
            return                                   # shapes only: there is nothing to fill
        generator = torch.Generator(device=device).manual_seed(seed)
        residual_std = INIT_STD / math.sqrt(2 * self.config.n_layers)
        for name, p in self.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "scale":
                p.fill_(1.0)
            elif leaf.startswith("b_") or leaf == "shift":
                p.zero_()
            else:
                std = residual_std if leaf in ("w_o", "w_down") else INIT_STD
                p.normal_(0.0, std, generator=generator)

    @property
    def device(self) -> torch.device:
        return self.token_embedding.device

    @property
    def dtype(self) -> torch.dtype:
        return self.token_embedding.dtype

    def num_parameters(self) -> int:
        """Parameter count (the tied embedding counted once)."""
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

    def forward(self, tokens: Tensor, cache: Cache | None = None, *,
                attention_mask: Tensor | None = None, backend: str = "explicit",
                last_only: bool = False) -> Tensor:
        """Logits for every position, or only the last with ``last_only``.

        tokens: (b, n) ids   attention_mask: (b, n), 1 for real tokens, 0 for padding (optional)
        cache: a KV cache (any llmcore.cache.Cache) holding the sequences' past; it gains
        these n tokens. -> logits (b, n, v), or (b, 1, v) with last_only.
        """
        if backend not in BACKENDS:
            raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
        past = 0 if cache is None else cache.max_length
        tokens = self.check_tokens(tokens, past)
        b, n = tokens.shape
        attention_mask = check_attention_mask(attention_mask, b, n, tokens.device)
        if cache is None:
            layout = contiguous_layout(b, n, past_slots=0, past_valid=None,
                                       attention_mask=attention_mask, device=tokens.device)
        else:
            layout = cache.prepare(b, n, attention_mask)   # validates before anything is written
        x = self.token_embedding[tokens] + self.position_embedding[layout.positions]   # (b, n, d)
        for layer, block in enumerate(self.blocks):
            x = block(x, layout, cache, layer, backend)                                # (b, n, d)
        if cache is not None:
            cache.commit(n, attention_mask)
        if last_only:
            x = x[:, -1:]                                                              # (b, 1, d)
        return linear(self.ln_f(x), self.token_embedding.t())                          # (b, n, v)
