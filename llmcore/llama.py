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

from .attention import BACKENDS, attention
from .cache import Cache
from .ffn import swiglu
from .layout import Layout, check_attention_mask, contiguous_layout
from .matmul import linear
from .model import GPT, DecoderSizes, _param
from .multihead import merge_heads, split_heads
from .norm import RMS_EPS, rms_norm
from .rope import ROPE_BASE, apply_rope

INIT_STD = 0.02
"""Standard deviation of the initial weights (HF's ``initializer_range`` default)."""


@dataclass(frozen=True)
class LlamaConfig(DecoderSizes):
    """Sizes of a Llama. d_ff defaults to Llama's 8/3 d_model rounded up to a multiple of 8."""

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
        self.weight = _param(d, device=device, dtype=dtype)

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
        self.w_q = _param(d, d, device=device, dtype=dtype)
        self.w_k = _param(d, d_kv, device=device, dtype=dtype)
        self.w_v = _param(d, d_kv, device=device, dtype=dtype)
        self.w_o = _param(d, d, device=device, dtype=dtype)

    def forward(self, x: Tensor, layout: Layout, cache: Cache | None = None,
                layer: int = 0, backend: str = "explicit") -> Tensor:
        """x: (b, n, d) -> (b, n, d). The cache receives keys already rotated."""
        q = split_heads(linear(x, self.w_q), self.n_heads)                 # (b, h, n, d_head)
        k = split_heads(linear(x, self.w_k), self.n_kv_heads)              # (b, h_kv, n, d_head)
        v = split_heads(linear(x, self.w_v), self.n_kv_heads)              # (b, h_kv, n, d_head)
        q = apply_rope(q, layout.positions, self.rope_base)                # only the new rows
        k = apply_rope(k, layout.positions, self.rope_base)
        if cache is None:
            out = attention(q, k, v, causal=layout.mask is None, mask=layout.mask,
                            backend=backend)                               # (b, h, n, d_head)
        else:
            out = cache.attend(layer, q, k, v, layout, backend)            # (b, h, n, d_head)
        return linear(merge_heads(out), self.w_o)                          # (b, n, d)


class SwiGLU(nn.Module):
    """w_gate, w_up: (d, f), w_down: (f, d); no biases. Chapter 11."""

    def __init__(self, config: LlamaConfig, *, device=None, dtype=None):
        super().__init__()
        d, f = config.d_model, config.ffn_width
        self.w_gate = _param(d, f, device=device, dtype=dtype)
        self.w_up = _param(d, f, device=device, dtype=dtype)
        self.w_down = _param(f, d, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        return swiglu(x, self.w_gate, self.w_up, self.w_down)


class LlamaBlock(nn.Module):
    """x + attention(attn_norm(x)), then + ffn(ffn_norm(x)): GPT-2's pre-norm block with
    RMSNorm, RoPE inside attention and SwiGLU. (b, n, d) -> (b, n, d). Chapter 11."""

    def __init__(self, config: LlamaConfig, *, device=None, dtype=None):
        super().__init__()
        self.attn_norm = RMSNorm(config.d_model, config.rms_eps, device=device, dtype=dtype)
        self.attention = LlamaAttention(config, device=device, dtype=dtype)
        self.ffn_norm = RMSNorm(config.d_model, config.rms_eps, device=device, dtype=dtype)
        self.ffn = SwiGLU(config, device=device, dtype=dtype)

    def forward(self, x: Tensor, layout: Layout, cache: Cache | None = None,
                layer: int = 0, backend: str = "explicit") -> Tensor:
        x = x + self.attention(self.attn_norm(x), layout, cache, layer, backend)   # residual
        return x + self.ffn(self.ffn_norm(x))                                      # residual


class Llama(nn.Module):
    """The whole model: token ids (b, n) -> logits (b, n, v), with or without a KV cache.

    Same calling convention as :class:`llmcore.model.GPT` (so ``llmcore.generate.generate`` and
    ``KVCache.for_model`` work unchanged). Chapter 11.
    """

    def __init__(self, config: LlamaConfig, *, device=None, dtype=None, seed: int = 0):
        super().__init__()
        self.config = config
        d = config.d_model
        self.token_embedding = _param(config.vocab_size, d, device=device, dtype=dtype)  # (v, d)
        self.blocks = nn.ModuleList(LlamaBlock(config, device=device, dtype=dtype)
                                    for _ in range(config.n_layers))
        self.norm_f = RMSNorm(d, config.rms_eps, device=device, dtype=dtype)
        self.lm_head = _param(d, config.vocab_size, device=device, dtype=dtype)          # (d, v)
        self.reset_parameters(seed)

    @torch.no_grad()
    def reset_parameters(self, seed: int = 0) -> None:
        """N(0, 0.02) weights, unit norm weights (HF's LlamaForCausalLM initialisation)."""
        device = self.token_embedding.device
        if device.type == "meta":
            return
        generator = torch.Generator(device=device).manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight") or name.endswith("norm_f.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, INIT_STD, generator=generator)

    @property
    def device(self) -> torch.device:
        return self.token_embedding.device

    @property
    def dtype(self) -> torch.dtype:
        return self.token_embedding.dtype

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def check_tokens(self, tokens: object, past: int = 0) -> Tensor:
        """Validate token ids (b, n): the same checks as :meth:`llmcore.model.GPT.check_tokens`."""
        return GPT.check_tokens(self, tokens, past)

    def forward(self, tokens: Tensor, cache: Cache | None = None, *,
                attention_mask: Tensor | None = None, backend: str = "explicit",
                last_only: bool = False) -> Tensor:
        """tokens: (b, n) ids   attention_mask: (b, n) or None   cache: any llmcore Cache
        -> logits (b, n, v), or (b, 1, v) with last_only. Positions come from the cache's Layout."""
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
            layout = cache.prepare(b, n, attention_mask)
        x = self.token_embedding[tokens]                                   # (b, n, d)
        for layer, block in enumerate(self.blocks):
            x = block(x, layout, cache, layer, backend)                    # (b, n, d)
        if cache is not None:
            cache.commit(n, attention_mask)
        if last_only:
            x = x[:, -1:]                                                  # (b, 1, d)
        return linear(self.norm_f(x), self.lm_head)                        # (b, n, v)


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
