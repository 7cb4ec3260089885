"""A Llama-style decoder: what changed after GPT-2, composed from llmcore's operations.

    x = token_embedding[tokens]                                        (b, n, d): no positions here
    for each block:
        q, k = rope(x_n w_q), rope(x_n w_k)   with x_n = rms_norm(x)    positions enter q and k only
        x = x + attention(q, k, x_n w_v) w_o                           h_kv <= h K/V heads (GQA)
        x = x + swiglu(rms_norm(x))
    logits = rms_norm(x) @ lm_head                                     (b, n, v): not tied

No biases anywhere. With a KV cache (any :class:`llmcore.cache.Cache`) the keys are stored already
rotated: a cached key's rotation depends only on its own position, which never changes, so each
decoding step rotates just the new row. Weights are (in, out) as everywhere in the book; Hugging
Face's ``nn.Linear`` stores (out, in), so :func:`load_hf_llama` transposes. Chapter 11.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch
from torch import Tensor, nn

from .attention import attention
from .cache import Cache
from .decoder import Decoder, DecoderSizes, parameter
from .ffn import swiglu
from .layout import Layout
from .matmul import linear
from .multihead import merge_heads, split_heads
from .norm import RMS_EPS, rms_norm
from .rope import ROPE_BASE, apply_rope

INIT_STD = 0.02
"""Standard deviation of the initial weights (HF's ``initializer_range`` default)."""


@dataclass(frozen=True)
class LlamaConfig(DecoderSizes):
    """Sizes of a Llama. d_ff defaults to 8/3 d_model rounded up to a multiple of 8: llmcore's
    default for small models, not Meta's rule (which rounds up to a multiple of 256 in Llama 2 7B
    and 13B, and multiplies by 1.3 first, then rounds up to 1024 or 4096, in Llama 2 70B and
    Llama 3: chapter 11). rope_base: 10000 as in Llama 1-2; Llama 3 uses 500000."""

    rms_eps: float = RMS_EPS
    rope_base: float = ROPE_BASE

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.d_head % 2:
            raise ValueError(f"LlamaConfig: d_head = {self.d_head} must be even (RoPE turns "
                             "pairs)")

    @property
    def ffn_width(self) -> int:
        """f: the SwiGLU hidden width (two up-projections of this width, one down)."""
        if self.d_ff is not None:
            return self.d_ff
        return -(-8 * self.d_model // 3 // 8) * 8


class RMSNorm(nn.Module):
    """weight: (d,). Chapter 11."""

    def __init__(self, d: int, eps: float, *, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = parameter(d, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


class LlamaAttention(nn.Module):
    """Grouped-query attention with RoPE on q and k. w_q: (d, h d_head), w_k, w_v:
    (d, h_kv d_head), w_o: (h d_head, d); no biases. Chapter 11."""

    def __init__(self, config: LlamaConfig, *, device=None, dtype=None):
        super().__init__()
        self.n_heads, self.n_kv_heads = config.n_heads, config.kv_heads
        self.rope_base = config.rope_base
        d, d_kv = config.d_model, config.kv_heads * config.d_head
        self.w_q = parameter(d, d, device=device, dtype=dtype)
        self.w_k = parameter(d, d_kv, device=device, dtype=dtype)
        self.w_v = parameter(d, d_kv, device=device, dtype=dtype)
        self.w_o = parameter(d, d, device=device, dtype=dtype)

    def forward(self, x: Tensor, layout: Layout, cache: Cache | None = None,
                layer: int = 0, backend: str = "explicit") -> Tensor:
        """x: (b, n, d) -> (b, n, d). The cache receives keys already
        rotated."""
        h, h_kv = self.n_heads, self.n_kv_heads
        q = split_heads(linear(x, self.w_q), h)           # (b, h, n, d_head)
        k = split_heads(linear(x, self.w_k), h_kv)        # (b, h_kv, n, d_head)
        v = split_heads(linear(x, self.w_v), h_kv)        # (b, h_kv, n, d_head)
        q = apply_rope(q, layout.positions, self.rope_base)  # the new rows only
        k = apply_rope(k, layout.positions, self.rope_base)
        if cache is None:
            out = attention(q, k, v, causal=layout.mask is None,
                            mask=layout.mask, backend=backend)
        else:
            out = cache.attend(layer, q, k, v, layout, backend)
        # out: (b, h, n, d_head)
        return linear(merge_heads(out), self.w_o)                    # (b, n, d)


class SwiGLU(nn.Module):
    """w_gate, w_up: (d, f), w_down: (f, d); no biases. Chapter 11."""

    def __init__(self, config: LlamaConfig, *, device=None, dtype=None):
        super().__init__()
        d, f = config.d_model, config.ffn_width
        self.w_gate = parameter(d, f, device=device, dtype=dtype)
        self.w_up = parameter(d, f, device=device, dtype=dtype)
        self.w_down = parameter(f, d, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        return swiglu(x, self.w_gate, self.w_up, self.w_down)


class LlamaBlock(nn.Module):
    """x + attention(attn_norm(x)), then + ffn(ffn_norm(x)): GPT-2's
    pre-norm block with RMSNorm, RoPE inside attention and SwiGLU.
    (b, n, d) -> (b, n, d). Chapter 11."""

    def __init__(self, config: LlamaConfig, *, device=None, dtype=None):
        super().__init__()
        d, eps = config.d_model, config.rms_eps
        self.attn_norm = RMSNorm(d, eps, device=device, dtype=dtype)
        self.attention = LlamaAttention(config, device=device, dtype=dtype)
        self.ffn_norm = RMSNorm(d, eps, device=device, dtype=dtype)
        self.ffn = SwiGLU(config, device=device, dtype=dtype)

    def forward(self, x: Tensor, layout: Layout, cache: Cache | None = None,
                layer: int = 0, backend: str = "explicit") -> Tensor:
        attended = self.attention(self.attn_norm(x), layout, cache, layer,
                                  backend)
        x = x + attended                                          # residual
        return x + self.ffn(self.ffn_norm(x))                     # residual


class Llama(Decoder):
    """The whole model: token ids (b, n) -> logits (b, n, v), with or without a KV cache.

    The same shell as :class:`llmcore.model.GPT` (:class:`llmcore.decoder.Decoder`), so
    ``llmcore.generate.generate`` and ``KVCache.for_model`` work unchanged; Llama brings its
    embedding (no positions: they enter inside attention), blocks and untied head. Chapter 11.
    """

    def __init__(self, config: LlamaConfig, *, device=None, dtype=None, seed: int = 0):
        super().__init__(config)
        d = config.d_model
        self.token_embedding = parameter(config.vocab_size, d, device=device,
                                         dtype=dtype)                        # (v, d)
        self.blocks = nn.ModuleList(LlamaBlock(config, device=device, dtype=dtype)
                                    for _ in range(config.n_layers))
        self.norm_f = RMSNorm(d, config.rms_eps, device=device, dtype=dtype)
        self.lm_head = parameter(d, config.vocab_size, device=device,
                                 dtype=dtype)                                # (d, v)
        self.reset_parameters(seed)

    def init_parameter(self, name: str, p: Tensor, generator: torch.Generator) -> None:
        """N(0, 0.02) weights, unit norm weights (HF's LlamaForCausalLM initialisation)."""
        if name.endswith("norm.weight") or name.endswith("norm_f.weight"):
            p.fill_(1.0)
        else:
            p.normal_(0.0, INIT_STD, generator=generator)

    def embed(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """tokens: (b, n) -> x (b, n, d); the positions go to RoPE, not here."""
        return self.token_embedding[tokens]

    def head(self, x: Tensor) -> Tensor:
        """x: (b, n, d) -> logits (b, n, v): RMSNorm, then lm_head (d, v)."""
        return linear(self.norm_f(x), self.lm_head)


def _hf_rope_base(hf_config) -> float:
    """rope_theta of a transformers LlamaConfig (``rope_parameters`` in v5, else ``rope_theta``)."""
    params = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling",
                                                                    None) or {}
    if params.get("rope_type", params.get("type", "default")) != "default":
        raise ValueError(f"only plain RoPE is supported, got {params}")
    return float(params.get("rope_theta", getattr(hf_config, "rope_theta", ROPE_BASE)))


def config_from_hf(hf_config) -> LlamaConfig:
    """A :class:`LlamaConfig` with the sizes of a transformers ``LlamaConfig`` (duck-typed: llmcore
    never imports transformers). Refuses what this model does not implement."""
    d, h = hf_config.hidden_size, hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or d // h
    unsupported = {"head_dim != hidden_size / heads": head_dim != d // h,
                   "attention_bias": getattr(hf_config, "attention_bias", False),
                   "mlp_bias": getattr(hf_config, "mlp_bias", False),
                   f"hidden_act = {hf_config.hidden_act!r}": hf_config.hidden_act != "silu"}
    bad = [name for name, present in unsupported.items() if present]
    if bad:
        raise ValueError(f"this Llama config uses what llmcore's Llama does not implement: {bad}")
    return LlamaConfig(vocab_size=hf_config.vocab_size,
                       max_seq_len=hf_config.max_position_embeddings, d_model=d, n_heads=h,
                       n_layers=hf_config.num_hidden_layers,
                       n_kv_heads=getattr(hf_config, "num_key_value_heads", None) or h,
                       d_ff=hf_config.intermediate_size, rms_eps=hf_config.rms_norm_eps,
                       rope_base=_hf_rope_base(hf_config))


def load_hf_llama(state_dict: Mapping[str, Tensor], config: LlamaConfig, *,
                  device=None, dtype=None) -> Llama:
    """A :class:`Llama` holding the weights of a transformers ``LlamaForCausalLM`` state dict.

    HF's linear weights are (out, in); the book's are (in, out), so each is transposed. A missing
    ``lm_head.weight`` means tied embeddings: the head is then the embedding's transpose.
    Every HF tensor must be used and every llmcore parameter filled, or a KeyError names which.
    """
    model = Llama(config, device="meta")
    ours: dict[str, Tensor] = {}
    used = set()

    def take(name: str, transpose: bool = False) -> Tensor:
        if name not in state_dict:
            raise KeyError(f"load_hf_llama: the state dict has no {name!r}")
        used.add(name)
        t = state_dict[name].detach()
        return t.t() if transpose else t

    ours["token_embedding"] = take("model.embed_tokens.weight")
    for i in range(config.n_layers):
        hf, me = f"model.layers.{i}.", f"blocks.{i}."
        ours[me + "attn_norm.weight"] = take(hf + "input_layernorm.weight")
        ours[me + "ffn_norm.weight"] = take(hf + "post_attention_layernorm.weight")
        for mine, theirs in (("w_q", "q_proj"), ("w_k", "k_proj"), ("w_v", "v_proj"),
                             ("w_o", "o_proj")):
            ours[me + "attention." + mine] = take(hf + f"self_attn.{theirs}.weight", True)
        for mine, theirs in (("w_gate", "gate_proj"), ("w_up", "up_proj"), ("w_down", "down_proj")):
            ours[me + "ffn." + mine] = take(hf + f"mlp.{theirs}.weight", True)
    ours["norm_f.weight"] = take("model.norm.weight")
    ours["lm_head"] = (take("lm_head.weight", True) if "lm_head.weight" in state_dict
                       else ours["token_embedding"].t())
    leftover = sorted(set(state_dict) - used - {"model.rotary_emb.inv_freq"})
    if leftover:
        raise KeyError(f"load_hf_llama: HF tensors this model has no place for: {leftover[:5]}")
    for name, p in model.named_parameters():
        if tuple(ours[name].shape) != tuple(p.shape):
            raise ValueError(f"load_hf_llama: {name} expects shape {tuple(p.shape)}, the HF "
                             f"tensor gives {tuple(ours[name].shape)}")
    model.load_state_dict({k: v.clone(memory_format=torch.contiguous_format)
                           for k, v in ours.items()}, assign=True)
    return model.to(device=device, dtype=dtype)


def from_hf(hf_model, *, device=None, dtype=None) -> Llama:
    """:func:`load_hf_llama` on a transformers ``LlamaForCausalLM``, sizes from its config."""
    return load_hf_llama(hf_model.state_dict(), config_from_hf(hf_model.config),
                         device=device, dtype=dtype)
