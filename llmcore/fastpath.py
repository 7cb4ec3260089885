"""The fast inference path: the same GPT, the same numbers, fewer and larger operations per token.

The teaching path (``GPT.forward`` with a :class:`llmcore.kvcache.KVCache`) shows every step:
each layer checks its operands' shapes, the cache returns views that explicit attention masks and
softmaxes, and generation runs under ``torch.no_grad``. Decoding one token of a small model is
then a hundred small torch calls whose Python overhead costs more than the arithmetic. This module
runs the same weights with what a serving engine does instead, each step named:

1. ``torch.inference_mode`` instead of ``no_grad`` (no version counters, no autograd metadata);
2. validation once per call (tokens, mask, lengths), never per layer per step;
3. one fused QKV projection and every projection as ``torch.addmm`` (bias + x @ w in one call),
   the residual added in place;
4. PyTorch's fused attention (``scaled_dot_product_attention``): the prompt with its own causal
   rule (no past, so top-left = bottom-right), each decode step with no mask at all (one new query
   sees every cached key) or, with left padding, an explicit key mask (b, 1, 1, m);
5. a static cache allocated once for prompt + new tokens, written in place; positions and masks
   are slices of tensors made once, so a step makes no per-step dtype or device copies;
6. optionally ``torch.compile`` of the per-layer step (``compile=True``).

Opt in with ``generate(model, prompt, t, fast=True)`` or :func:`generate_fast`; the tests check
that both paths give the same logits and the same greedy tokens. Chapter 7 (the fast path).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .generate import _generators, sample
from .layout import check_attention_mask


OUTPUT_WEIGHT_ATTRIBUTE = "_fast_output_weight"
"""Where a model keeps the fast path's (d, v) copy of its output projection, with the key of the
embedding it was made from (:meth:`FastGPT.output_weight`)."""


class StaticCache:
    """K and V of every layer in two tensors (L, b, h_kv, capacity, d_head), allocated once.

    ``length`` slots are filled, the same for every sequence (left padding is recorded in
    ``key_valid``: (b, capacity) bool, or None when there is none). Chapter 7 (the fast path).
    """

    def __init__(self, model, batch_size: int, capacity: int):
        c = model.config
        shape = (c.n_layers, batch_size, c.kv_heads, capacity, c.d_head)
        self.keys = torch.empty(shape, device=model.device, dtype=model.dtype)
        self.values = torch.empty(shape, device=model.device, dtype=model.dtype)
        self.key_valid: Tensor | None = None
        self.length = 0


_MATRICES = (2, 4, 8, 10)
"""Positions of W_qkv, W_o, W_up and W_down in a block's weight tuple (FastGPT.blocks)."""


def packed_linear_available(model) -> bool:
    """Whether the fast path can use oneDNN's prepacked matrix products for ``model``: a CPU
    float32 model and a torch built with oneDNN (mkldnn)."""
    w = model.token_embedding
    return (w.device.type == "cpu" and w.dtype == torch.float32
            and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def _pack(weight: Tensor, batch_size: int, *, transposed: bool = True) -> Tensor:
    """weight (d_in, d_out) (or (d_out, d_in) when not transposed) in oneDNN's blocked layout for
    products with about batch_size rows: an opaque tensor only :func:`_packed_linear` reads."""
    w = weight.detach()
    return torch.ops.mkldnn._reorder_linear_weight(w.t() if transposed else w, batch_size)


def _addmm_linear(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    """x (rows, d_in) @ w (d_in, d_out) + b: one torch.addmm."""
    return torch.addmm(b, x, w)


def _packed_linear(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    """The same product with w prepacked by :func:`_pack` (oneDNN's kernel)."""
    return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")


class FastGPT:
    """A GPT's weights arranged for inference, and its forward step without per-step checks.

    model: a :class:`llmcore.model.GPT`. The weights are the model's own tensors (no copy), so
    the fast path always sees the model's current parameters; only the output projection is read
    from a transposed copy that follows the embedding (:meth:`output_weight`). ``compile=True``
    runs each block through ``torch.compile`` (the first calls pay for compilation).
    batch_size: the rows of a decode step. From 2 rows on, a CPU float32 model's products run on
    oneDNN's prepacked copies of the four matrices of each block and of the output projection
    (``self.packed``; made here, so they hold the weights of this moment: build a new FastGPT
    after changing the model, as :func:`generate_fast` does on every call). For one row the
    plain ``addmm`` reads the weights faster. Chapter 7 (the fast path).
    """

    def __init__(self, model, *, compile: bool = False, batch_size: int = 1):
        c = model.config
        self.model, self.config = model, c
        self.h, self.h_kv, self.d_head = c.n_heads, c.kv_heads, c.d_head
        self.eps = c.ln_eps
        self.group = c.n_heads // c.kv_heads
        self.blocks = [(b.ln_1.scale, b.ln_1.shift, b.attention.w_qkv, b.attention.b_qkv,
                        b.attention.w_o, b.attention.b_o, b.ln_2.scale, b.ln_2.shift,
                        b.ffn.w_up, b.ffn.b_up, b.ffn.w_down, b.ffn.b_down)
                       for b in model.blocks]
        self.packed = not compile and batch_size >= 2 and packed_linear_available(model)
        self.linear = _packed_linear if self.packed else _addmm_linear
        self.head = None
        if self.packed:           # oneDNN's blocked copies, made once per call of generate_fast
            with torch.inference_mode(False):
                self.blocks = [tuple(_pack(t, batch_size) if i in _MATRICES else t
                                     for i, t in enumerate(weights)) for weights in self.blocks]
                self.head = _pack(model.token_embedding, batch_size, transposed=False)
        self.block = torch.compile(self._block, dynamic=True) if compile else self._block

    def output_weight(self) -> Tensor:
        """The tied output projection as a (d, v) contiguous matrix: logits = x @ it.

        The model stores it as the embedding, (v, d), so ``F.linear(x, embedding)`` computes each
        logit as a dot product along a row; for one token (a matrix-vector product) this CPU
        streams that layout at about half the speed of x @ W with W (d, v) contiguous (GPT-2
        small's 154 MB head: 11.3 ms against 6.3 ms). The fast path keeps that one transposed
        copy (v d more numbers) with the model, as a serving engine prepares its weights once:
        made on first use (a transposing copy: about 0.1 s at GPT-2 small's size) and again
        whenever the embedding changes (its version counter, storage, dtype or device: training
        steps, in-place edits and ``.to()`` all change one). Chapter 7 (the fast path).
        """
        embedding = self.model.token_embedding
        key = (embedding._version, embedding.data_ptr(), embedding.dtype, embedding.device)
        cached = getattr(self.model, OUTPUT_WEIGHT_ATTRIBUTE, None)
        if cached is None or cached[0] != key:
            with torch.inference_mode(False):           # a normal tensor, usable in any mode
                cached = (key, embedding.detach().t().contiguous())
            setattr(self.model, OUTPUT_WEIGHT_ATTRIBUTE, cached)
        return cached[1]

    def _block(self, x: Tensor, weights: tuple, keys: Tensor, values: Tensor, start: int,
               mask: Tensor | None) -> Tensor:
        """One block on x: (b, n, d), writing K/V rows [start, start + n) of this layer's cache
        keys, values: (b, h_kv, capacity, d_head). mask: (b, 1, n, m) bool or None (then the
        prompt's causal rule when start == 0, and no mask for a decode step). -> (b, n, d)."""
        ln1_w, ln1_b, w_qkv, b_qkv, w_o, b_o, ln2_w, ln2_b, w_up, b_up, w_down, b_down = weights
        b, n, d = x.shape
        rows = x.view(b * n, d)
        qkv = self.linear(F.layer_norm(rows, (d,), ln1_w, ln1_b, self.eps), w_qkv, b_qkv)
        qkv = qkv.view(b, n, self.h + 2 * self.h_kv, self.d_head).transpose(1, 2)
        q, k, v = qkv.split((self.h, self.h_kv, self.h_kv), dim=1)       # (b, h(_kv), n, d_head)
        end = start + n
        keys[:, :, start:end] = k
        values[:, :, start:end] = v
        out = F.scaled_dot_product_attention(
            q, keys[:, :, :end], values[:, :, :end], attn_mask=mask,
            is_causal=mask is None and start == 0 and n > 1, enable_gqa=self.group > 1)
        rows = self.linear(out.transpose(1, 2).reshape(b * n, d), w_o, b_o).add_(rows)
        hidden = F.gelu(self.linear(F.layer_norm(rows, (d,), ln2_w, ln2_b, self.eps), w_up, b_up),
                        approximate="tanh")                                      # (b n, f)
        return self.linear(hidden, w_down, b_down).add_(rows).view(b, n, d)      # residual

    def step(self, tokens: Tensor, positions: Tensor, cache: StaticCache,
             mask: Tensor | None) -> Tensor:
        """tokens, positions: (b, n) -> the last position's logits (b, v); cache gains n tokens.
        No checks: :func:`generate_fast` validated everything once."""
        model = self.model
        x = F.embedding(tokens, model.token_embedding) + model.position_embedding[positions]
        start = cache.length
        for layer, weights in enumerate(self.blocks):
            x = self.block(x, weights, cache.keys[layer], cache.values[layer], start, mask)
        cache.length = start + tokens.shape[1]
        last = F.layer_norm(x[:, -1], (self.config.d_model,), model.ln_f.scale, model.ln_f.shift,
                            self.eps)                                            # (b, d)
        if self.head is not None:
            return _packed_linear(last, self.head, None)                         # (b, v)
        return last @ self.output_weight()                                       # (b, v)


def _prompt_masks(attention_mask: Tensor, capacity: int) -> tuple[Tensor, Tensor, Tensor]:
    """Left-padded prompts: key_valid (b, capacity), the prompt's mask (b, 1, n, n) and the
    positions (b, n), counting real tokens only as the teaching path does.

    A padding query may see itself (and nothing else): its row is never seen by a real token,
    and a row with no visible key at all would give NaN in the fused kernel."""
    b, n = attention_mask.shape
    key_valid = torch.ones(b, capacity, dtype=torch.bool, device=attention_mask.device)
    key_valid[:, :n] = attention_mask
    idx = torch.arange(n, device=attention_mask.device)
    causal = idx[None, :] <= idx[:, None]                                        # (n, n)
    mask = (causal & attention_mask[:, None, :]) | torch.eye(n, dtype=torch.bool,
                                                             device=attention_mask.device)
    positions = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)
    return key_valid, mask[:, None], positions


@torch.inference_mode()
def generate_fast(model, prompt_ids: Tensor, max_new_tokens: int, *, temperature: float = 0.0,
                  top_k: int | None = None, seed: int | Sequence[int] | None = None,
                  eos_id: int | None = None, attention_mask: Tensor | None = None,
                  fast_model: FastGPT | None = None) -> Tensor:
    """:func:`llmcore.generate.generate` on the fast path: the same contract and the same tokens.

    prompt_ids: (b, n) -> (b, n + t), t <= max_new_tokens. attention_mask: (b, n), 0 for left
    padding. fast_model: a :class:`FastGPT` of ``model`` to reuse (e.g. a compiled one).
    Everything is validated here, once. Chapter 7 (the fast path).
    """
    tokens = model.check_tokens(prompt_ids)
    b, n = tokens.shape
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if n + max_new_tokens > model.config.max_seq_len:
        raise ValueError(f"prompt of {n} tokens + max_new_tokens = {max_new_tokens} exceeds "
                         f"max_seq_len = {model.config.max_seq_len}")
    attention_mask = check_attention_mask(attention_mask, b, n, tokens.device)
    if attention_mask is not None and tokens.device.type != "meta" and bool(attention_mask.all()):
        attention_mask = None                       # no padding: the plain causal rule
    generators = _generators(seed, b, tokens.device)
    generator = generators[0] if generators is not None and isinstance(seed, int) else generators
    fast = FastGPT(model, batch_size=b) if fast_model is None else fast_model
    if fast.model is not model:
        raise ValueError("fast_model was built from another model")
    total = n + max_new_tokens
    cache = StaticCache(model, b, total)
    out = torch.empty(b, total, dtype=tokens.dtype, device=tokens.device)
    out[:, :n] = tokens
    if attention_mask is None:
        positions = torch.arange(total, device=tokens.device).expand(b, total)
        prompt_mask, key_valid = None, None
    else:
        key_valid, prompt_mask, prompt_positions = _prompt_masks(attention_mask, total)
        positions = torch.cat([prompt_positions, prompt_positions[:, -1:] + 1 +
                               torch.arange(max_new_tokens, device=tokens.device)], dim=1)
    done = torch.zeros(b, dtype=torch.bool, device=tokens.device)
    new, mask = tokens, prompt_mask
    for t in range(max_new_tokens):
        start = n + t - new.shape[1]
        logits = fast.step(new, positions[:, start:n + t], cache, mask)          # (b, v)
        if temperature == 0 and top_k is None:
            picked = logits.argmax(dim=-1)
        else:
            picked = sample(logits, temperature=temperature, top_k=top_k, generator=generator)
        if eos_id is not None:
            picked = torch.where(done, torch.full_like(picked, eos_id), picked)
            done |= picked == eos_id
        out[:, n + t] = picked
        if eos_id is not None and bool(done.all()):
            return out[:, :n + t + 1]
        new = out[:, n + t:n + t + 1]                                            # (b, 1)
        mask = None if key_valid is None else key_valid[:, None, None, :n + t + 1]
    return out
