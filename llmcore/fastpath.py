"""The fast inference path: the same model, the same numbers, fewer and larger operations per token.

The teaching path (``GPT.forward`` or ``Llama.forward`` with a :class:`llmcore.kvcache.KVCache`)
shows every step: each layer checks its operands' shapes, the cache returns views that explicit
attention masks and softmaxes, and generation runs under ``torch.no_grad``. Decoding one token of
a small model is then a hundred small torch calls whose Python overhead costs more than the
arithmetic. This module runs the same weights with what a serving engine does instead:

1. ``torch.inference_mode`` instead of ``no_grad`` (no version counters, no autograd metadata);
2. validation once per call (tokens, mask, lengths), never per layer per step;
3. every projection as one ``torch.addmm`` (bias + x @ w in one call; GPT's fused QKV), the
   residual added in place;
4. PyTorch's fused attention (``scaled_dot_product_attention``): the prompt with its own causal
   rule (no past, so top-left = bottom-right), each decode step with no mask at all (one new query
   sees every cached key) or, with left padding, an explicit key mask (b, 1, 1, m);
5. a static cache allocated once for prompt + new tokens, written in place; positions and masks
   are slices of tensors made once, so a step makes no per-step dtype or device copies;
6. optionally ``torch.compile`` of the per-layer step (``compile=True``).

:class:`FastDecoder` is the step every decoder shares (embed, blocks, last row's logits); a
:class:`FastGPT` or :class:`FastLlama` fills in its model's block. :class:`FastStep` is what
:func:`llmcore.decode.decode` calls: ``generate(model, prompt, t, fast=True)`` is the teaching
loop with this step in place of the model's forward, and the tests check that both paths give
the same logits and the same tokens. Chapter 7 (the fast path).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .layout import check_attention_mask
from .llama import Llama
from .model import GPT
from .rope import rope_tables, rotate_half


class StaticCache:
    """K and V of every layer in two tensors (L, b, h_kv, capacity, d_head), allocated once.

    ``length`` slots are filled, the same for every sequence (left padding is kept out of
    attention by the step's key mask). Chapter 7 (the fast path).
    """

    def __init__(self, model, batch_size: int, capacity: int):
        c = model.config
        shape = (c.n_layers, batch_size, c.kv_heads, capacity, c.d_head)
        self.keys = torch.empty(shape, device=model.device, dtype=model.dtype)
        self.values = torch.empty(shape, device=model.device, dtype=model.dtype)
        self.length = 0


def packed_linear_available(model) -> bool:
    """Whether the fast path can use oneDNN's prepacked matrix products for ``model``: a CPU
    float32 model and a torch built with oneDNN (mkldnn)."""
    return (model.device.type == "cpu" and model.dtype == torch.float32
            and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def _pack(weight: Tensor, batch_size: int, *, transposed: bool = True) -> Tensor:
    """weight (d_in, d_out) (or (d_out, d_in) when not transposed) in oneDNN's blocked layout for
    products with about batch_size rows: an opaque tensor only :func:`_packed_linear` reads."""
    w = weight.detach()
    return torch.ops.mkldnn._reorder_linear_weight(w.t() if transposed else w, batch_size)


def _plain_linear(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    """x (rows, d_in) @ w (d_in, d_out) + b: one torch.addmm (torch.mm without a bias)."""
    return torch.mm(x, w) if b is None else torch.addmm(b, x, w)


def _packed_linear(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    """The same product with w prepacked by :func:`_pack` (oneDNN's kernel)."""
    return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")


class FastDecoder:
    """A decoder's weights arranged for inference, and its forward step without per-step checks.

    model: a :class:`llmcore.model.GPT` (:class:`FastGPT`) or a :class:`llmcore.llama.Llama`
    (:class:`FastLlama`). The weights are the model's own tensors (no copy), so the fast path
    sees the model's current parameters. ``compile=True`` runs each block through
    ``torch.compile`` (the first calls pay for compilation). batch_size: the rows of a decode
    step. From 2 rows on, a CPU float32 model's products run on oneDNN's prepacked copies of
    each block's matrices (``w_*``) and of the output projection (``self.packed``; made here,
    so they hold the weights of this moment: build a new one after changing the model, as
    ``generate(..., fast=True)`` does on every call). For one row the plain ``addmm`` reads
    the weights faster. A subclass names its block's weights (``block_weights``) and writes
    ``embed``, ``_block`` and ``logits``. Chapter 7 (the fast path).
    """

    def __init__(self, model, *, compile: bool = False, batch_size: int = 1):
        c = model.config
        self.model, self.config = model, c
        self.h, self.h_kv, self.d_head = c.n_heads, c.kv_heads, c.d_head
        self.group = c.n_heads // c.kv_heads
        self.blocks = [self.block_weights(block) for block in model.blocks]
        self.packed = not compile and batch_size >= 2 and packed_linear_available(model)
        self.linear = _packed_linear if self.packed else _plain_linear
        self.head: Tensor | None = None
        if self.packed:           # oneDNN's blocked copies, made once per generate call
            with torch.inference_mode(False):
                self.blocks = [weights._replace(**{
                    name: _pack(t, batch_size) for name, t in weights._asdict().items()
                    if name.startswith("w_")}) for weights in self.blocks]
                self.head = self.packed_head(batch_size)
        self.block = torch.compile(self._block, dynamic=True) if compile else self._block

    def step(self, tokens: Tensor, positions: Tensor, cache: StaticCache,
             mask: Tensor | None) -> Tensor:
        """tokens, positions: (b, n) -> the last position's logits (b, v); cache gains n tokens.
        mask: (b, 1, n, m) bool, or None for the plain causal rule. No checks: the caller
        (:class:`FastStep`) validated everything once."""
        x = self.embed(tokens, positions)                                       # (b, n, d)
        rotation = self.rotation(positions)
        start = cache.length
        for layer, weights in enumerate(self.blocks):
            x = self.block(x, weights, cache.keys[layer], cache.values[layer], start, mask,
                           rotation)                                            # (b, n, d)
        cache.length = start + tokens.shape[1]
        return self.logits(x[:, -1])                                            # (b, v)

    def heads(self, rows: Tensor, b: int, n: int) -> Tensor:
        """rows: (b n, k d_head), k heads side by side -> (b, k, n, d_head), a view."""
        return rows.view(b, n, -1, self.d_head).transpose(1, 2)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, keys: Tensor,
               values: Tensor, start: int, mask: Tensor | None) -> Tensor:
        """Write the new k, v: (b, h_kv, n, d_head) at rows [start, start + n)
        of one layer's cache keys, values: (b, h_kv, capacity, d_head), then
        attend q: (b, h, n, d_head) over rows [0, start + n) with PyTorch's
        fused kernel -> (b, h, n, d_head). mask: (b, 1, n, m) bool, or None:
        the prompt's causal rule when start == 0, else no mask (one new query
        sees every cached key). Chapter 7 (the fast path)."""
        n = q.shape[2]
        end = start + n
        keys[:, :, start:end] = k
        values[:, :, start:end] = v
        causal = mask is None and start == 0 and n > 1
        return F.scaled_dot_product_attention(
            q, keys[:, :, :end], values[:, :, :end], attn_mask=mask,
            is_causal=causal, enable_gqa=self.group > 1)

    def rotation(self, positions: Tensor):
        """What the blocks need of the positions (None: they entered at the embedding)."""
        return None

    # -- what each model fills in ----------------------------------------------------------
    def block_weights(self, block) -> NamedTuple:
        """One block's tensors, named (matrices ``w_*``, which may be packed)."""
        raise NotImplementedError

    def packed_head(self, batch_size: int) -> Tensor:
        """The output projection packed for oneDNN (see :func:`_pack`)."""
        raise NotImplementedError

    def embed(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """tokens, positions: (b, n) -> the blocks' input x (b, n, d)."""
        raise NotImplementedError

    def _block(self, x: Tensor, weights: NamedTuple, keys: Tensor, values: Tensor,
               start: int, mask: Tensor | None, rotation) -> Tensor:
        """One block on x: (b, n, d) -> (b, n, d), writing this layer's K/V rows."""
        raise NotImplementedError

    def logits(self, last: Tensor) -> Tensor:
        """last: (b, d), the last position's residual stream -> logits (b, v)."""
        raise NotImplementedError


class GPTBlockWeights(NamedTuple):
    """One GPT block's tensors as the fast path reads them: the model's own parameters, or
    oneDNN's packed copies of the matrices (``w_*``)."""

    ln_1_scale: Tensor
    ln_1_shift: Tensor
    w_qkv: Tensor
    b_qkv: Tensor
    w_o: Tensor
    b_o: Tensor
    ln_2_scale: Tensor
    ln_2_shift: Tensor
    w_up: Tensor
    b_up: Tensor
    w_down: Tensor
    b_down: Tensor


class FastGPT(FastDecoder):
    """:class:`FastDecoder` for a :class:`llmcore.model.GPT`: learned positions added at the
    embedding, LayerNorm, fused QKV with biases, GELU, and the tied output projection read from
    a transposed copy that follows the embedding (:meth:`output_weight`). Chapter 7 (the fast
    path)."""

    def __init__(self, model: GPT, *, compile: bool = False, batch_size: int = 1):
        self.eps = model.config.ln_eps
        self._output: tuple[tuple, Tensor] | None = None     # (embedding key, its transpose)
        super().__init__(model, compile=compile, batch_size=batch_size)

    def block_weights(self, block) -> GPTBlockWeights:
        attention, ffn = block.attention, block.ffn
        return GPTBlockWeights(block.ln_1.scale, block.ln_1.shift, attention.w_qkv,
                               attention.b_qkv, attention.w_o, attention.b_o, block.ln_2.scale,
                               block.ln_2.shift, ffn.w_up, ffn.b_up, ffn.w_down, ffn.b_down)

    def packed_head(self, batch_size: int) -> Tensor:
        return _pack(self.model.token_embedding, batch_size, transposed=False)

    def embed(self, tokens: Tensor, positions: Tensor) -> Tensor:
        model = self.model
        return F.embedding(tokens, model.token_embedding) + model.position_embedding[positions]

    def _block(self, x: Tensor, w: GPTBlockWeights, keys: Tensor,
               values: Tensor, start: int, mask: Tensor | None,
               rotation: None) -> Tensor:
        """One block on x: (b, n, d) -> (b, n, d), its K/V rows written at
        [start, start + n) of this layer's cache (:meth:`attend`)."""
        b, n, d = x.shape
        rows = x.view(b * n, d)
        normed = F.layer_norm(rows, (d,), w.ln_1_scale, w.ln_1_shift, self.eps)
        qkv = self.heads(self.linear(normed, w.w_qkv, w.b_qkv), b, n)
        q, k, v = qkv.split((self.h, self.h_kv, self.h_kv), dim=1)
        out = self.attend(q, k, v, keys, values, start, mask)
        out = out.transpose(1, 2).reshape(b * n, d)                   # (b n, d)
        rows = self.linear(out, w.w_o, w.b_o).add_(rows)              # residual
        normed = F.layer_norm(rows, (d,), w.ln_2_scale, w.ln_2_shift, self.eps)
        hidden = F.gelu(self.linear(normed, w.w_up, w.b_up),
                        approximate="tanh")                           # (b n, f)
        out = self.linear(hidden, w.w_down, w.b_down)                 # (b n, d)
        return out.add_(rows).view(b, n, d)                           # residual

    def logits(self, last: Tensor) -> Tensor:
        """last: (b, d), the last position's residual stream -> logits (b, v)."""
        ln_f = self.model.ln_f
        normed = F.layer_norm(last, (self.config.d_model,), ln_f.scale, ln_f.shift, self.eps)
        if self.head is not None:
            return _packed_linear(normed, self.head, None)                    # (b, v)
        return normed @ self.output_weight()                                  # (b, v)

    def output_weight(self) -> Tensor:
        """The tied output projection as a (d, v) contiguous matrix: logits = x @ it.

        The model stores it as the embedding, (v, d), so ``F.linear(x, embedding)`` computes
        each logit as a dot product along a row; for one token (a matrix-vector product) a CPU
        streams that layout more slowly than x @ W with W (d, v) contiguous (the benchmark,
        ``course-bench --section fast``, measures both). This object keeps that one transposed
        copy (v d more numbers), as a serving engine prepares its weights once: made on first
        use and again whenever the embedding changes (its version counter, storage, dtype or
        device: training steps, in-place edits and ``.to()`` all change one). Nothing is kept
        on the model. Chapter 7 (the fast path).
        """
        embedding = self.model.token_embedding
        key = (embedding._version, embedding.data_ptr(), embedding.dtype, embedding.device)
        if self._output is None or self._output[0] != key:
            with torch.inference_mode(False):           # a normal tensor, usable in any mode
                self._output = (key, embedding.detach().t().contiguous())
        return self._output[1]


class LlamaBlockWeights(NamedTuple):
    """One Llama block's tensors as the fast path reads them: the model's own parameters, or
    oneDNN's packed copies of the matrices (``w_*``)."""

    attn_norm: Tensor
    w_q: Tensor
    w_k: Tensor
    w_v: Tensor
    w_o: Tensor
    ffn_norm: Tensor
    w_gate: Tensor
    w_up: Tensor
    w_down: Tensor


class FastLlama(FastDecoder):
    """:class:`FastDecoder` for a :class:`llmcore.llama.Llama`: no positions at the embedding,
    RMSNorm, RoPE on q and k (cos and sin tables made once for every position), SwiGLU, no
    biases, and the untied head ``lm_head`` (d, v) read as it is. Chapter 11."""

    def __init__(self, model: Llama, *, compile: bool = False, batch_size: int = 1):
        c = model.config
        self.eps = c.rms_eps
        dtype = torch.float64 if model.dtype == torch.float64 else torch.float32
        every = torch.arange(c.max_seq_len, device=model.device)
        with torch.inference_mode(False):
            cos, sin = rope_tables(every, c.d_head, c.rope_base, dtype=dtype)
        self.cos, self.sin = cos.to(model.dtype), sin.to(model.dtype)   # (T, d_head)
        super().__init__(model, compile=compile, batch_size=batch_size)

    def block_weights(self, block) -> LlamaBlockWeights:
        attention, ffn = block.attention, block.ffn
        return LlamaBlockWeights(block.attn_norm.weight, attention.w_q, attention.w_k,
                                 attention.w_v, attention.w_o, block.ffn_norm.weight,
                                 ffn.w_gate, ffn.w_up, ffn.w_down)

    def packed_head(self, batch_size: int) -> Tensor:
        return _pack(self.model.lm_head, batch_size)

    def embed(self, tokens: Tensor, positions: Tensor) -> Tensor:
        return F.embedding(tokens, self.model.token_embedding)

    def rotation(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin: (b, 1, n, d_head) for the positions (b, n), shared by every block."""
        return self.cos[positions][:, None], self.sin[positions][:, None]

    def _block(self, x: Tensor, w: LlamaBlockWeights, keys: Tensor, values: Tensor,
               start: int, mask: Tensor | None, rotation: tuple[Tensor, Tensor]) -> Tensor:
        """One block on x: (b, n, d) -> (b, n, d); keys stored already rotated."""
        b, n, d = x.shape
        rows = x.view(b * n, d)
        normed = F.rms_norm(rows, (d,), w.attn_norm, self.eps)
        q, k, v = (self.heads(self.linear(normed, weight, None), b, n)
                   for weight in (w.w_q, w.w_k, w.w_v))
        cos, sin = rotation
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        out = self.attend(q, k, v, keys, values, start, mask)   # (b, h, n, d_head)
        out = out.transpose(1, 2).reshape(b * n, d)              # (b n, d)
        rows = self.linear(out, w.w_o, None).add_(rows)          # residual
        normed = F.rms_norm(rows, (d,), w.ffn_norm, self.eps)
        gate = F.silu(self.linear(normed, w.w_gate, None))
        hidden = gate.mul_(self.linear(normed, w.w_up, None))    # (b n, f)
        return self.linear(hidden, w.w_down, None).add_(rows).view(b, n, d)

    def logits(self, last: Tensor) -> Tensor:
        """last: (b, d), the last position's residual stream -> logits (b, v)."""
        normed = F.rms_norm(last, (self.config.d_model,), self.model.norm_f.weight, self.eps)
        if self.head is not None:
            return _packed_linear(normed, self.head, None)                    # (b, v)
        return normed @ self.model.lm_head                                    # (b, v)


def fast_model(model, *, compile: bool = False, batch_size: int = 1) -> FastDecoder:
    """The fast path's arrangement of ``model``: a :class:`FastGPT` for a GPT, a
    :class:`FastLlama` for a Llama; any other model is refused, naming those two."""
    if isinstance(model, GPT):
        return FastGPT(model, compile=compile, batch_size=batch_size)
    if isinstance(model, Llama):
        return FastLlama(model, compile=compile, batch_size=batch_size)
    raise TypeError(f"the fast path serves llmcore's GPT and Llama models, got "
                    f"{type(model).__name__}")


def prompt_masks(attention_mask: Tensor, capacity: int) -> tuple[Tensor, Tensor, Tensor]:
    """Left-padded prompts (b, n): key_valid (b, capacity), the prompt's mask (b, 1, n, n) and
    the positions (b, n), counting real tokens only as the teaching path does.

    A padding query may see itself (and nothing else): its row is never seen by a real token,
    and a row with no visible key at all would give NaN in the fused kernel."""
    b, n = attention_mask.shape
    device = attention_mask.device
    key_valid = torch.ones(b, capacity, dtype=torch.bool, device=device)
    key_valid[:, :n] = attention_mask
    idx = torch.arange(n, device=device)
    causal = idx[None, :] <= idx[:, None]                                        # (n, n)
    itself = torch.eye(n, dtype=torch.bool, device=device)
    mask = (causal & attention_mask[:, None, :]) | itself                        # (b, n, n)
    positions = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)
    return key_valid, mask[:, None], positions


class FastStep:
    """The fast path's step for :func:`llmcore.decode.decode`: a :class:`StaticCache` for the
    prompt and every new token, positions and key masks made once here (after checking the
    mask), and each call under ``torch.inference_mode``.

    fast: a :class:`FastDecoder` of ``model``; prompt_ids: (b, n); attention_mask: (b, n) with 0
    for left padding, or None. Chapter 7 (the fast path).
    """

    def __init__(self, fast: FastDecoder, model, prompt_ids: Tensor, max_new_tokens: int,
                 attention_mask: Tensor | None):
        if fast.model is not model:
            raise ValueError("fast: this FastDecoder was built from another model")
        b, n = prompt_ids.shape
        device = prompt_ids.device
        mask = check_attention_mask(attention_mask, b, n, device)
        if mask is not None and device.type != "meta" and bool(mask.all()):
            mask = None                             # no padding: the plain causal rule
        total = n + max_new_tokens
        self.fast = fast
        with torch.inference_mode():
            self.cache = StaticCache(model, b, total)
            if mask is None:
                self.positions = torch.arange(total, device=device).expand(b, total)
                self.key_valid = self.prompt_mask = None
            else:
                self.key_valid, self.prompt_mask, prompt = prompt_masks(mask, total)
                after = prompt[:, -1:] + 1 + torch.arange(max_new_tokens, device=device)
                self.positions = torch.cat([prompt, after], dim=1)              # (b, total)

    @torch.inference_mode()
    def __call__(self, tokens: Tensor) -> Tensor:
        """tokens: (b, t) new ids -> logits (b, v) of the last position."""
        start = self.cache.length
        end = start + tokens.shape[1]
        if start == 0:
            mask = self.prompt_mask
        else:
            mask = None if self.key_valid is None else self.key_valid[:, None, None, :end]
        return self.fast.step(tokens, self.positions[:, start:end], self.cache, mask)
