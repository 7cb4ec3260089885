"""A Llama-style decoder: what changed after GPT-2, composed from llmcore's operations.

    x = token_embedding[tokens]                                        (b, n, d): no positions here
    for each block:
        q, k = rope(x_n w_q), rope(x_n w_k)   with x_n = rms_norm(x)    positions enter q and k only
        x = x + attention(q, k, x_n w_v) w_o                           h_kv <= h K/V heads (GQA)
        x = x + swiglu(rms_norm(x))
    logits = rms_norm(x) @ lm_head                                     (b, n, v): not tied

No biases anywhere. The families after Llama 2 are each a small diff from this model, a field of
:class:`LlamaConfig` (read from a checkpoint's config.json by :func:`config_from_hf`):

    Llama 3.1/3.2  rope_scaling: the slow RoPE frequencies divided, the fast ones kept
    Qwen2/2.5      qkv_bias: q, k, v = x w + b
    Qwen3          qk_norm: q, k = rms_norm(q), rms_norm(k) per head, before RoPE; head_dim
    Mistral        sliding_window: query i sees keys j with i - window < j <= i
    SmolLM2        none: a Llama whose head is tied (lm_head = the embedding's transpose)

With a KV cache (any :class:`llmcore.cache.Cache`) the keys are stored already
rotated: a cached key's rotation depends only on its own position, which never changes, so each
decoding step rotates just the new row. Weights are (in, out) as everywhere in the book; Hugging
Face's ``nn.Linear`` stores (out, in), so :func:`load_hf_llama` transposes. Chapter 11.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import torch
from torch import Tensor, nn

from .attention import attention
from .cache import Cache
from .checkpoint import CONFIG_FILE, read_json_object, read_tensors
from .decoder import Decoder, DecoderSizes, parameter
from .ffn import swiglu
from .layout import Layout
from .matmul import linear
from .multihead import merge_heads, split_heads
from .norm import RMS_EPS, rms_norm
from .rope import ROPE_BASE, RopeScaling, apply_rope

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
    rope_scaling: RopeScaling | None = None
    head_dim: int | None = None
    qkv_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.d_head <= 0 or self.d_head % 2:
            raise ValueError(f"LlamaConfig: d_head = {self.d_head} must be even (RoPE turns "
                             "pairs)")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"LlamaConfig: sliding_window must be at least 1 or None, got "
                             f"{self.sliding_window}")

    @property
    def d_head(self) -> int:
        """d_head: head_dim when set (Qwen3), else d_model / n_heads."""
        return self.d_model // self.n_heads if self.head_dim is None else self.head_dim

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
    (d, h_kv d_head), w_o: (h d_head, d); no biases, except b_q, b_k, b_v with qkv_bias
    (Qwen2); with qk_norm (Qwen3) q_norm and k_norm, (d_head,) each, normalise every head's q
    and k before RoPE. Chapter 11."""

    def __init__(self, config: LlamaConfig, *, device=None, dtype=None):
        super().__init__()
        self.n_heads, self.n_kv_heads = config.n_heads, config.kv_heads
        self.rope_base, self.rope_scaling = config.rope_base, config.rope_scaling
        d, d_head = config.d_model, config.d_head
        d_q, d_kv = config.n_heads * d_head, config.kv_heads * d_head
        self.w_q = parameter(d, d_q, device=device, dtype=dtype)
        self.w_k = parameter(d, d_kv, device=device, dtype=dtype)
        self.w_v = parameter(d, d_kv, device=device, dtype=dtype)
        self.w_o = parameter(d_q, d, device=device, dtype=dtype)
        self.b_q = self.b_k = self.b_v = None
        if config.qkv_bias:
            self.b_q = parameter(d_q, device=device, dtype=dtype)
            self.b_k = parameter(d_kv, device=device, dtype=dtype)
            self.b_v = parameter(d_kv, device=device, dtype=dtype)
        self.q_norm = self.k_norm = None
        if config.qk_norm:
            self.q_norm = RMSNorm(d_head, config.rms_eps, device=device, dtype=dtype)
            self.k_norm = RMSNorm(d_head, config.rms_eps, device=device, dtype=dtype)

    def forward(self, x: Tensor, layout: Layout, cache: Cache | None = None,
                layer: int = 0, backend: str = "explicit") -> Tensor:
        """x: (b, n, d) -> (b, n, d). The cache receives keys already
        rotated."""
        h, h_kv = self.n_heads, self.n_kv_heads
        # q: (b, h, n, d_head); k, v: (b, h_kv, n, d_head)
        q = split_heads(linear(x, self.w_q, self.b_q), h)
        k = split_heads(linear(x, self.w_k, self.b_k), h_kv)
        v = split_heads(linear(x, self.w_v, self.b_v), h_kv)
        if self.q_norm is not None:       # Qwen3: each head's q, k normalised
            q, k = self.q_norm(q), self.k_norm(k)
        rope = dict(base=self.rope_base, scaling=self.rope_scaling)
        q = apply_rope(q, layout.positions, **rope)     # the new rows only
        k = apply_rope(k, layout.positions, **rope)
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
        """N(0, 0.02) weights, unit norm weights, zero biases (HF's LlamaForCausalLM
        initialisation)."""
        if name.endswith("norm.weight") or name.endswith("norm_f.weight"):
            p.fill_(1.0)
        elif name.rsplit(".", 1)[-1].startswith("b_"):
            p.zero_()
        else:
            p.normal_(0.0, INIT_STD, generator=generator)

    def embed(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """tokens: (b, n) -> x (b, n, d); the positions go to RoPE, not here."""
        return self.token_embedding[tokens]

    def head(self, x: Tensor) -> Tensor:
        """x: (b, n, d) -> logits (b, n, v): RMSNorm, then lm_head (d, v)."""
        return linear(self.norm_f(x), self.lm_head)


FAMILIES = {
    "llama": "Llama 1-3.2, SmolLM2: the model above (rope_scaling from Llama 3.1 on)",
    "qwen2": "Qwen2, Qwen2.5: biases on q, k and v (qkv_bias)",
    "qwen3": "Qwen3: per-head RMSNorm on q and k (qk_norm), head_dim of its own",
    "mistral": "Mistral: sliding-window attention (sliding_window)",
}
"""config.json's ``model_type`` -> what the family changes; every other type is refused."""

READ_FIELDS = ("model_type", "vocab_size", "hidden_size", "num_attention_heads",
               "num_key_value_heads", "num_hidden_layers", "intermediate_size",
               "max_position_embeddings", "rms_norm_eps", "head_dim", "rope_theta",
               "rope_parameters", "rope_scaling", "sliding_window", "use_sliding_window",
               "max_window_layers", "layer_types", "tie_word_embeddings")
"""config.json fields :func:`config_from_hf` reads into a :class:`LlamaConfig` (or checks)."""

REQUIRED_FIELDS = {"hidden_act": ("silu",), "mlp_bias": (False,), "attention_bias": (False,),
                   "is_encoder_decoder": (False,), "chunk_size_feed_forward": (0, None),
                   "use_mrope": (False,), "rope_interleaved": (False,)}
"""Fields that change the computation in a way llmcore does not implement: a config.json whose
value is not one of these is refused, naming the field (attention_bias: Llama's and Qwen3's
bias on all four projections; Qwen2's q, k, v biases come with its model_type; use_mrope:
Qwen2-VL's multimodal RoPE; rope_interleaved: the paper's neighbour pairs)."""

IGNORED_FIELDS = {
    "transformers_version": "provenance", "architectures": "provenance",
    "_name_or_path": "provenance", "is_llama_config": "provenance (SmolLM2)",
    "dtype": "the stored dtype (the caller picks one)",
    "torch_dtype": "the stored dtype (the caller picks one)",
    "id2label": "classification heads only", "label2id": "classification heads only",
    "problem_type": "classification heads only", "return_dict": "the output's container",
    "output_hidden_states": "extra outputs", "output_attentions": "extra outputs",
    "use_cache": "generation's default, not the function", "initializer_range": "training",
    "attention_dropout": "training (no dropout at inference)",
    "pad_token_id": "the tokenizer's", "bos_token_id": "the tokenizer's",
    "eos_token_id": "the tokenizer's",
    "pretraining_tp": "split products during pretraining: the same function",
}
"""Fields that do not change the logits: read by nothing. Any field in none of the three tables
is refused by name, so a config.json with a setting llmcore has not classified is never
computed."""

ROPE_FIELDS = {"default": (), "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                                         "original_max_position_embeddings")}
"""rope_type -> its parameters (besides rope_theta); any other type or parameter is refused."""


def _rope_from_hf(fields: dict) -> tuple[float, RopeScaling | None]:
    """rope_theta and the scaling of a config.json: transformers 5's ``rope_parameters`` or
    4's ``rope_theta`` and ``rope_scaling``."""
    params = {**(fields.get("rope_scaling") or {}), **(fields.get("rope_parameters") or {})}
    base = float(params.pop("rope_theta", fields.get("rope_theta", ROPE_BASE)))
    kind = params.pop("rope_type", params.pop("type", "default"))
    if kind not in ROPE_FIELDS:
        raise ValueError(f"rope_type = {kind!r} is not implemented (llmcore implements "
                         f"{', '.join(ROPE_FIELDS)})")
    unknown = sorted(set(params) - set(ROPE_FIELDS[kind]))
    missing = sorted(set(ROPE_FIELDS[kind]) - set(params))
    if unknown or missing:
        raise ValueError(f"rope_type {kind!r}: parameters not implemented {unknown}, "
                         f"missing {missing}")
    if kind == "default":
        return base, None
    return base, RopeScaling(factor=float(params["factor"]),
                             low_freq_factor=float(params["low_freq_factor"]),
                             high_freq_factor=float(params["high_freq_factor"]),
                             original_context=int(params["original_max_position_embeddings"]))


def _window_from_hf(fields: dict, family: str, n_layers: int) -> int | None:
    """The sliding window every layer uses, or None. Mistral: ``sliding_window``. Qwen2/3:
    only with ``use_sliding_window``, and only on the layers ``layer_types`` (or
    max_window_layers) marks; a model that mixes full and windowed layers is refused."""
    if family == "mistral":
        return fields.get("sliding_window")
    window = fields.get("sliding_window") if fields.get("use_sliding_window") else None
    first = fields.get("max_window_layers", n_layers)
    types = fields.get("layer_types") or [
        "sliding_attention" if window is not None and i >= first else "full_attention"
        for i in range(n_layers)]
    if len(types) != n_layers or not set(types) <= {"full_attention", "sliding_attention"}:
        raise ValueError(f"layer_types = {types}: expected {n_layers} of 'full_attention' or "
                         "'sliding_attention'")
    if window is None or set(types) == {"full_attention"}:
        return None
    if set(types) == {"sliding_attention"}:
        return window
    raise ValueError("layer_types mixes full and sliding-window layers: not implemented")


def config_fields(config) -> dict:
    """A config.json's fields as a dict: the dict itself, or a transformers config's
    ``to_dict()`` (duck-typed: llmcore never imports transformers)."""
    return dict(config) if isinstance(config, Mapping) else config.to_dict()


def config_from_hf(hf_config, source: str = CONFIG_FILE) -> LlamaConfig:
    """A :class:`LlamaConfig` from the fields of a checkpoint's config.json (a dict, or a
    transformers config) of a family in :data:`FAMILIES`. Refuses, naming the field, every field
    that is not in :data:`READ_FIELDS`, :data:`REQUIRED_FIELDS` or :data:`IGNORED_FIELDS`, every
    required field with another value, and every RoPE type or window this model does not
    implement: no config is accepted and computed wrong. Chapter 11."""
    fields = config_fields(hf_config)
    family = fields.get("model_type", "llama")
    if family not in FAMILIES:
        raise ValueError(f"{source}: model_type = {family!r} is not implemented (llmcore "
                         f"implements {', '.join(FAMILIES)})")
    known = set(READ_FIELDS) | set(REQUIRED_FIELDS) | set(IGNORED_FIELDS)
    bad = [f"{name} (not a field llmcore knows)" for name in sorted(set(fields) - known)]
    bad += [f"{name} = {fields[name]!r} (llmcore implements {allowed[0]!r})"
            for name, allowed in REQUIRED_FIELDS.items()
            if name in fields and fields[name] not in allowed]
    if bad:
        raise ValueError(f"{source}: this {family} config uses what llmcore does not "
                         f"implement: {'; '.join(bad)}")
    d, h = fields["hidden_size"], fields["num_attention_heads"]
    n_layers = fields["num_hidden_layers"]
    head_dim = fields.get("head_dim") or d // h
    try:
        base, scaling = _rope_from_hf(fields)
        window = _window_from_hf(fields, family, n_layers)
        return LlamaConfig(vocab_size=fields["vocab_size"],
                           max_seq_len=fields["max_position_embeddings"], d_model=d, n_heads=h,
                           n_layers=n_layers,
                           n_kv_heads=fields.get("num_key_value_heads") or h,
                           d_ff=fields["intermediate_size"],
                           rms_eps=fields.get("rms_norm_eps", RMS_EPS), rope_base=base,
                           rope_scaling=scaling,
                           head_dim=None if head_dim * h == d else head_dim,
                           qkv_bias=family == "qwen2", qk_norm=family == "qwen3",
                           sliding_window=window,
                           tie_embeddings=bool(fields.get("tie_word_embeddings", False)))
    except ValueError as err:
        raise ValueError(f"{source}: {err}") from None


def load_hf_llama(state_dict: Mapping[str, Tensor], config: LlamaConfig, *,
                  device=None, dtype=None) -> Llama:
    """A :class:`Llama` holding the weights of a transformers ``LlamaForCausalLM`` state dict.

    HF's linear weights are (out, in); the book's are (in, out), so each is transposed. With
    ``config.tie_embeddings`` the head is the embedding's transpose (a stored ``lm_head.weight``
    must equal the embedding).
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
        if config.qkv_bias:                                      # Qwen2
            for mine, theirs in (("b_q", "q_proj"), ("b_k", "k_proj"), ("b_v", "v_proj")):
                ours[me + "attention." + mine] = take(hf + f"self_attn.{theirs}.bias")
        if config.qk_norm:                                       # Qwen3
            for norm in ("q_norm", "k_norm"):
                ours[me + f"attention.{norm}.weight"] = take(hf + f"self_attn.{norm}.weight")
        for mine, theirs in (("w_gate", "gate_proj"), ("w_up", "up_proj"), ("w_down", "down_proj")):
            ours[me + "ffn." + mine] = take(hf + f"mlp.{theirs}.weight", True)
    ours["norm_f.weight"] = take("model.norm.weight")
    if config.tie_embeddings:              # HF ties them: a stored lm_head must agree
        if "lm_head.weight" in state_dict and not torch.equal(take("lm_head.weight"),
                                                              ours["token_embedding"]):
            raise ValueError("load_hf_llama: tie_word_embeddings is true but lm_head.weight "
                             "differs from the embedding")
        ours["lm_head"] = ours["token_embedding"].t()
    else:
        ours["lm_head"] = take("lm_head.weight", True)
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
    """:func:`load_hf_llama` on a transformers ``LlamaForCausalLM`` (or Qwen2, Qwen3, Mistral
    ``...ForCausalLM``), sizes from its config."""
    return load_hf_llama(hf_model.state_dict(), config_from_hf(hf_model.config),
                         device=device, dtype=dtype)


def load_llama(path, *, device=None, dtype=None) -> Llama:
    """A checkpoint directory in Hugging Face's layout (config.json and one model.safetensors,
    what ``save_pretrained`` writes) of a family in :data:`FAMILIES`, as a :class:`Llama` in
    eval mode. Chapter 11."""
    file = Path(path) / CONFIG_FILE
    if not file.is_file():
        raise FileNotFoundError(f"no {CONFIG_FILE} in {path}")
    config = config_from_hf(read_json_object(file), str(file))
    return load_hf_llama(read_tensors(path), config, device=device, dtype=dtype).eval()
