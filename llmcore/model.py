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
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .attention import attention
from .cache import Cache
from .decoder import Decoder, DecoderSizes, parameter
from .ffn import ffn
from .layout import Layout
from .matmul import linear
from .multihead import merge_heads, qkv_projection
from .norm import LN_EPS, layer_norm

INIT_STD = 0.02
"""Standard deviation of GPT-2's initial weights; residual output projections get
INIT_STD / sqrt(2 L) so the residual stream's variance does not grow with depth."""


@dataclass(frozen=True)
class GPTConfig(DecoderSizes):
    """Sizes of a GPT. d_ff defaults to 4 d_model and n_kv_heads to n_heads (plain multi-head)."""

    ln_eps: float = LN_EPS


class LayerNorm(nn.Module):
    """scale, shift: (d,). Chapter 5."""

    def __init__(self, d: int, eps: float, *, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.scale = parameter(d, device=device, dtype=dtype)
        self.shift = parameter(d, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        return layer_norm(x, self.scale, self.shift, self.eps)


class Attention(nn.Module):
    """Causal self-attention with one combined projection w_qkv: (d, (h + 2 h_kv) d_head) and
    the output projection w_o: (d, d). Chapter 4."""

    def __init__(self, config: GPTConfig, *, device=None, dtype=None):
        super().__init__()
        self.n_heads, self.n_kv_heads = config.n_heads, config.kv_heads
        d, width = config.d_model, (config.n_heads + 2 * config.kv_heads) * config.d_head
        self.w_qkv = parameter(d, width, device=device, dtype=dtype)
        self.b_qkv = parameter(width, device=device, dtype=dtype)
        self.w_o = parameter(d, d, device=device, dtype=dtype)
        self.b_o = parameter(d, device=device, dtype=dtype)

    def forward(self, x: Tensor, layout: Layout, cache: Cache | None = None,
                layer: int = 0, backend: str = "explicit") -> Tensor:
        """x: (b, n, d) -> (b, n, d). With a cache, the queries also see the
        cached past."""
        # q: (b, h, n, d_head); k, v: (b, h_kv, n, d_head)
        q, k, v = qkv_projection(x, self.w_qkv, self.b_qkv,
                                 n_heads=self.n_heads,
                                 n_kv_heads=self.n_kv_heads)
        if cache is None:
            out = attention(q, k, v, causal=layout.mask is None,
                            mask=layout.mask, backend=backend)
        else:                       # the cache adds the past: m = past + n keys
            out = cache.attend(layer, q, k, v, layout, backend)
        # out: (b, h, n, d_head)
        return linear(merge_heads(out), self.w_o, self.b_o)          # (b, n, d)


class FeedForward(nn.Module):
    """w_up: (d, f), w_down: (f, d) with biases. Chapter 5."""

    def __init__(self, config: GPTConfig, *, device=None, dtype=None):
        super().__init__()
        d, f = config.d_model, config.ffn_width
        self.w_up = parameter(d, f, device=device, dtype=dtype)
        self.b_up = parameter(f, device=device, dtype=dtype)
        self.w_down = parameter(f, d, device=device, dtype=dtype)
        self.b_down = parameter(d, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        return ffn(x, self.w_up, self.b_up, self.w_down, self.b_down)


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(ln_1(x)), then
    + ffn(ln_2(x)). Shape-preserving, (b, n, d) -> (b, n, d), which is why
    blocks stack. Chapter 5."""

    def __init__(self, config: GPTConfig, *, device=None, dtype=None):
        super().__init__()
        d, eps = config.d_model, config.ln_eps
        self.ln_1 = LayerNorm(d, eps, device=device, dtype=dtype)
        self.attention = Attention(config, device=device, dtype=dtype)
        self.ln_2 = LayerNorm(d, eps, device=device, dtype=dtype)
        self.ffn = FeedForward(config, device=device, dtype=dtype)

    def forward(self, x: Tensor, layout: Layout, cache: Cache | None = None,
                layer: int = 0, backend: str = "explicit") -> Tensor:
        attended = self.attention(self.ln_1(x), layout, cache, layer,
                                  backend)
        x = x + attended                                          # residual
        return x + self.ffn(self.ln_2(x))                         # residual


class GPT(Decoder):
    """The whole model. ``model(tokens)`` maps token ids (b, n) to logits (b, n, v).

    config: sizes; device, dtype: where and how the parameters live (``"meta"`` builds shapes
    only); seed: the initial weights are drawn from a generator seeded with it. The forward
    pass is the shell every decoder shares (:class:`llmcore.decoder.Decoder`); GPT brings its
    embedding, blocks and head. Chapter 5.
    """

    def __init__(self, config: GPTConfig, *, device=None, dtype=None, seed: int = 0):
        super().__init__(config)
        d = config.d_model
        self.token_embedding = parameter(config.vocab_size, d, device=device,
                                         dtype=dtype)                        # (v, d)
        self.position_embedding = parameter(config.max_seq_len, d, device=device,
                                            dtype=dtype)                     # (T, d)
        self.blocks = nn.ModuleList(Block(config, device=device, dtype=dtype)
                                    for _ in range(config.n_layers))
        self.ln_f = LayerNorm(d, config.ln_eps, device=device, dtype=dtype)
        self.reset_parameters(seed)

    def init_parameter(self, name: str, p: Tensor, generator: torch.Generator) -> None:
        """GPT-2's initialisation: N(0, 0.02) weights (0.02 / sqrt(2 L) for the residual
        outputs w_o and w_down), zero biases and shifts, unit LayerNorm scales."""
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "scale":
            p.fill_(1.0)
        elif leaf.startswith("b_") or leaf == "shift":
            p.zero_()
        else:
            residual_std = INIT_STD / math.sqrt(2 * self.config.n_layers)
            std = residual_std if leaf in ("w_o", "w_down") else INIT_STD
            p.normal_(0.0, std, generator=generator)

    def embed(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """tokens, positions: (b, n) -> x (b, n, d): each token's row of the
        embedding plus its position's row of the position embedding."""
        return self.token_embedding[tokens] + self.position_embedding[positions]

    def head(self, x: Tensor) -> Tensor:
        """x: (b, n, d) -> logits (b, n, v): the final layer norm, then the
        embedding transposed (tied: no weights of its own)."""
        return linear(self.ln_f(x), self.token_embedding.t())
