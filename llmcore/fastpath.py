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
6. optionally ``torch.compile`` of the per-layer step (``compile=True``);
7. optionally fewer bytes per weight (``precision=``, chapter 13): "bf16" keeps every matrix and
   the KV cache in bfloat16; "int8" stores the matrices as int8 with one scale per output
   channel and runs PyTorch's weight-only int8 kernel (``aten._weight_int8pack_mm``); "int4"
   stores the block matrices as 4-bit codes in groups along d_in and runs PyTorch's CPU int4
   kernel (``aten._weight_int4pack_mm_for_cpu``), its head in int8. The three feed the
   matrices bfloat16 activations (the kernels are fast only then) and keep in float32 what must
   stay there: the residual stream, the norms (computed on it) and the embeddings; the kernels
   accumulate their dot products and SDPA its softmax in float32. "w8a8" stores the same int8
   codes and scales as "int8" but rounds the activations too, each row (token) to its own
   integer codes, and multiplies integers by integers (fbgemm's int8 GEMM, the kernel under
   PyTorch's dynamic quantization; a CPU instruction such as AVX-512 VNNI does 64 int8
   multiply-adds at once): the activations, cache and stream stay float32 around it.

:class:`FastDecoder` is the step every decoder shares (embed, blocks, last row's logits); a
:class:`FastGPT` or :class:`FastLlama` fills in its model's block. :class:`FastStep` is what
:func:`llmcore.decode.decode` calls: ``generate(model, prompt, t, fast=True)`` is the teaching
loop with this step in place of the model's forward, and the tests check that both paths give
the same logits and the same tokens. Chapter 7 (the fast path).
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .device import last_level_cache_bytes
from .layout import check_attention_mask
from .llama import Llama
from .model import GPT
from .quantize import INT4_SYMMETRIC_ZERO, quantize_int4, quantize_int8, unpack_int4
from .rope import rope_tables, rotate_half
from .storage import storage_bytes

PRECISIONS = ("fp32", "bf16", "int8", "w8a8", "int4")
"""What ``precision=`` accepts (None: the model's own dtype and tensors)."""

INT4_GROUP_SIZE = 32
"""Rows of W per int4 scale and zero point in the fast path (d_in must be a multiple)."""


class StaticCache:
    """K and V of every layer in two tensors (L, b, h_kv, capacity, d_head), allocated once.

    ``length`` slots are filled, the same for every sequence (left padding is kept out of
    attention by the step's key mask). Chapter 7 (the fast path).
    """

    def __init__(self, model, batch_size: int, capacity: int, *,
                 dtype: torch.dtype | None = None):
        c = model.config
        shape = (c.n_layers, batch_size, c.kv_heads, capacity, c.d_head)
        dtype = model.dtype if dtype is None else dtype          # the fast path's: fast.dtype
        self.keys = torch.empty(shape, device=model.device, dtype=dtype)
        self.values = torch.empty(shape, device=model.device, dtype=dtype)
        self.length = 0


def packed_linear_available(model, dtype: torch.dtype | None = None) -> bool:
    """Whether the fast path can use oneDNN's prepacked matrix products for ``model`` with its
    matrices in ``dtype`` (default: the model's): a CPU model, float32 (or bfloat16 where
    oneDNN supports it on this CPU) and a torch built with oneDNN (mkldnn)."""
    dtype = model.dtype if dtype is None else dtype
    if not (model.device.type == "cpu" and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype == torch.float32


def streams_from_memory(model) -> bool:
    """Whether a decode step must read ``model``'s parameters from memory: more bytes than the
    CPU's last-level cache (:func:`llmcore.device.last_level_cache_bytes`). Then oneDNN's
    packed layout reads them faster than ``addmm`` even for one row (GPT-2 small, one row:
    about 22 ms against 28.5 ms on the course's 2-core machine); a model that stays in the
    cache (the 4M model: 0.77 ms plain, 1.0 ms packed) pays less per call with plain
    ``addmm``. Each storage counts once (a tied embedding and head are one matrix)."""
    return storage_bytes(model.parameters()) > last_level_cache_bytes()


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


class Int8Linear(NamedTuple):
    """A (d_in, d_out) matrix as PyTorch's weight-only int8 kernel reads it: ``values``
    (d_out, d_in) int8 (the transpose of :class:`llmcore.quantize.Int8Weight`'s) and ``scale``
    (d_out,) in the activations' dtype."""

    values: Tensor
    scale: Tensor


class Int4Linear(NamedTuple):
    """A (d_in, d_out) matrix as PyTorch's CPU int4 kernel reads it: its own packing of the
    codes (``aten._convert_weight_to_int4pack_for_cpu`` of the (d_out, d_in) codes), and per
    group and column (scale, offset) with ``w = (code - 8) * scale + offset``, so offset =
    (8 - zero) * scale for llmcore's ``(code - zero) * scale``."""

    packed: Tensor
    scale_and_offset: Tensor     # (d_in // group_size, d_out, 2)
    group_size: int


def int8_linear(weight: Tensor, dtype: torch.dtype) -> Int8Linear:
    """weight (d_in, d_out) -> :class:`Int8Linear`: :func:`llmcore.quantize.quantize_int8`
    laid out for ``aten._weight_int8pack_mm``, the scale in ``dtype`` (the activations')."""
    q = quantize_int8(weight.detach())
    return Int8Linear(q.values.t().contiguous(), q.scale.to(dtype))


def int4_linear(weight: Tensor, dtype: torch.dtype,
                group_size: int = INT4_GROUP_SIZE) -> Int4Linear:
    """weight (d_in, d_out) -> :class:`Int4Linear`: :func:`llmcore.quantize.quantize_int4`
    (with zero points) laid out for ``aten._weight_int4pack_mm_for_cpu``. The kernel wants
    d_out a multiple of 16."""
    d_in, d_out = weight.shape
    if d_out % 16:
        raise ValueError(f"int4: PyTorch's CPU kernel needs d_out divisible by 16, got a "
                         f"({d_in}, {d_out}) matrix")
    q = quantize_int4(weight.detach(), group_size)
    codes = unpack_int4(q.packed).t().contiguous().to(torch.int32)            # (d_out, d_in)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
    offset = (INT4_SYMMETRIC_ZERO - q.zero) * q.scale
    return Int4Linear(packed, torch.stack([q.scale, offset], dim=-1).to(dtype), group_size)


W8A8_PIN = torch.tensor([[1.0, -1.0]])
"""The two columns appended to every row of w8a8's activations, fixing their range to [-1, 1]."""


class W8A8Linear(NamedTuple):
    """A (d_in, d_out) matrix for the int8 x int8 product: fbgemm's packed int8 codes with one
    scale per output channel (``torch.ops.quantized.linear_prepack``; an opaque object, so its
    bytes are counted by :attr:`weight_bytes`: d_in d_out codes and d_out float32 scales) over
    d_in + 2 rows, the last two zero: they meet the two columns :data:`W8A8_PIN` appended to
    the activations (see :func:`_w8a8_linear`)."""

    packed: object
    d_in: int
    d_out: int

    @property
    def weight_bytes(self) -> int:
        return self.d_in * self.d_out + 4 * self.d_out


def w8a8_available(device: torch.device) -> bool:
    """Whether this torch has the int8 x int8 kernel for ``device``: PyTorch's quantized
    linear ops with the fbgemm (x86) engine, on the CPU only."""
    engines = torch.backends.quantized.supported_engines
    return (device.type == "cpu" and hasattr(torch.ops.quantized, "linear_dynamic")
            and ("fbgemm" in engines or "x86" in engines))


def w8a8_linear(weight: Tensor) -> W8A8Linear:
    """weight (d_in, d_out) float32 -> :class:`W8A8Linear`: :func:`llmcore.quantize.quantize_int8`
    (the codes and scales the "int8" precision stores), packed once for fbgemm. fbgemm takes
    its codes as one of PyTorch's quantized tensors, an API torch 2.13 deprecates: its warning
    is silenced here, where the packing happens, and nowhere else."""
    d_in, d_out = weight.shape
    q = quantize_int8(weight.detach().float())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        codes = torch.cat([q.values.t(), q.values.new_zeros(d_out, 2)], dim=1)
        codes = torch._make_per_channel_quantized_tensor(
            codes, q.scale.double(), torch.zeros(d_out, dtype=torch.long), 0)  # (d_out, d_in + 2)
        packed = torch.ops.quantized.linear_prepack(codes, None)
    return W8A8Linear(packed, d_in, d_out)


def w8a8_matmul(x: Tensor, w: W8A8Linear, b: Tensor | None = None) -> Tensor:
    """x (rows, d_in) float32 on the CPU @ the int8 matrix (+ b (d_out,)) -> (rows, d_out)
    float32, the activations rounded to integers one row at a time (:func:`_w8a8_linear`
    says how). Checks its operands and names what it expected; the fast path calls
    :func:`_w8a8_linear` directly, having checked once. Chapter 13."""
    if not isinstance(w, W8A8Linear):
        raise TypeError(f"w: expected a W8A8Linear (w8a8_linear), got {type(w).__name__}")
    if not isinstance(x, Tensor) or x.dim() != 2 or x.dtype != torch.float32 \
            or x.device.type != "cpu":
        raise ValueError(f"x: expected a float32 matrix (rows, {w.d_in}) on the CPU, got "
                         f"{getattr(x, 'dtype', type(x).__name__)} "
                         f"{tuple(getattr(x, 'shape', ()))} on {getattr(x, 'device', '-')}")
    if x.shape[1] != w.d_in:
        raise ValueError(f"x has {x.shape[1]} columns but the matrix has d_in = {w.d_in}")
    if b is not None and tuple(b.shape) != (w.d_out,):
        raise ValueError(f"b: expected shape ({w.d_out},), got {tuple(b.shape)}")
    return _w8a8_linear(x.contiguous(), w, b)


def _w8a8_linear(x: Tensor, w: W8A8Linear, b: Tensor | None) -> Tensor:
    """x (rows, d_in) float32 @ the int8 matrix (+ b) with int8 activations, one scale per row.

    fbgemm's dynamic kernel rounds its whole input with one scale from the input's min and max
    (a row's codes would then depend on the rest of its batch). So each row is first divided
    by its largest magnitude r (every row in [-1, 1]) and gains two columns, +1 and -1, that
    meet the matrix's two zero rows (they add nothing to the product): the input's range is
    then [-1, 1] on every call, so the kernel's scale never changes, each row is rounded on
    its own, and row i of the product, times r[i], is x[i] W whatever the batch. The kernel
    keeps about 7 bits per activation (``reduce_range``, what PyTorch's dynamic quantization
    uses, so that CPUs without VNNI cannot overflow their 16-bit pair sums): x[i] / r[i]
    rounded in steps of 2 / 127, integer codes from -64 to 64 (tested against that float64
    model in tests/test_fastpath_precision.py)."""
    r = x.abs().amax(dim=1, keepdim=True).clamp_(min=torch.finfo(x.dtype).tiny)  # (rows, 1)
    rows = torch.cat([x / r, W8A8_PIN.expand(x.shape[0], 2)], dim=1)        # (rows, d_in + 2)
    out = torch.ops.quantized.linear_dynamic(rows, w.packed, True)
    return out.mul_(r) if b is None else torch.addcmul(b, out, r)


def _int8_linear(x: Tensor, w: Int8Linear, b: Tensor | None) -> Tensor:
    """x (rows, d_in) @ the int8 matrix (+ b): PyTorch's weight-only int8 kernel."""
    out = torch.ops.aten._weight_int8pack_mm(x, w.values, w.scale)
    return out if b is None else out.add_(b)


def _int4_linear(x: Tensor, w: Int4Linear, b: Tensor | None) -> Tensor:
    """x (rows, d_in) @ the int4 matrix (+ b): PyTorch's CPU int4 kernel."""
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(x, w.packed, w.group_size,
                                                     w.scale_and_offset)
    return out if b is None else out.add_(b)


def bytes_of(weights) -> int:
    """Bytes of the weights in ``weights``: a tensor, a :class:`W8A8Linear` (its codes and
    scales), or (nested) tuples and lists of them."""
    if isinstance(weights, Tensor):
        return weights.numel() * weights.element_size()
    if isinstance(weights, W8A8Linear):
        return weights.weight_bytes
    if isinstance(weights, (tuple, list)):
        return sum(bytes_of(part) for part in weights)
    return 0


def check_precision(precision: str | None, model) -> None:
    """None or one of :data:`PRECISIONS`, and a kernel for it on the model's device."""
    if precision is not None and precision not in PRECISIONS:
        raise ValueError(f"precision: expected None or one of {PRECISIONS}, got {precision!r}")
    if precision == "int4" and model.device.type not in ("cpu", "meta"):
        raise ValueError(f"precision='int4' uses PyTorch's CPU int4 kernel; the model is on "
                         f"{model.device}")
    if precision == "w8a8" and not w8a8_available(model.device):
        raise ValueError(f"precision='w8a8' uses PyTorch's int8 x int8 CPU kernel (fbgemm); "
                         f"the model is on {model.device}, and this torch's quantized engines "
                         f"are {torch.backends.quantized.supported_engines}")


class FastDecoder:
    """A decoder's weights arranged for inference, and its forward step without per-step checks.

    model: a :class:`llmcore.model.GPT` (:class:`FastGPT`) or a :class:`llmcore.llama.Llama`
    (:class:`FastLlama`). ``compile=True`` runs each block through ``torch.compile`` (the first
    calls pay for compilation). batch_size: the rows of a decode step.

    precision None (or "fp32" for a float32 model): the weights are the model's own tensors (no
    copy), so the fast path sees the model's current parameters; from 2 rows on, a CPU float32
    model's products run on oneDNN's prepacked copies of each block's matrices (``w_*``) and of
    the output projection (``self.head``), made here (build a new one after changing the model,
    as ``generate(..., fast=True)`` does on every call); so do one row's when the weights do not
    fit in the CPU's cache (:func:`streams_from_memory`); otherwise one row runs the plain
    ``addmm``, which costs less per call. "bf16", "int8", "w8a8", "int4": this object holds
    its own copies of the matrices in that format (see the module's docstring), made here from
    the weights of this moment; ``dtype`` is the matrices' activations and the KV cache's
    dtype (bfloat16; float32 for w8a8, whose kernel rounds float32 activations itself), and
    ``stream_dtype`` the residual stream's (float32). A subclass names its block's weights
    (``block_weights``) and its head (``head_matrix``) and writes ``embed``, ``_block`` and
    ``logits``. Chapters 7 and 13.
    """

    def __init__(self, model, *, compile: bool = False, batch_size: int = 1,
                 precision: str | None = None):
        check_precision(precision, model)
        c = model.config
        self.model, self.config, self.precision = model, c, precision
        self.h, self.h_kv, self.d_head = c.n_heads, c.kv_heads, c.d_head
        self.group = c.n_heads // c.kv_heads
        self.dtype = {None: model.dtype, "fp32": torch.float32,
                      "w8a8": torch.float32}.get(precision, torch.bfloat16)
        low = self.dtype in (torch.bfloat16, torch.float16)
        self.stream_dtype = torch.float32 if low else self.dtype
        self.own = precision in (None, "fp32") and self.dtype == model.dtype
        quantized = precision in ("int8", "w8a8", "int4")
        self.packed = (not compile and not quantized
                       and packed_linear_available(model, self.dtype)
                       and (batch_size >= 2 or self.dtype == torch.bfloat16
                            or streams_from_memory(model)))
        plain = _packed_linear if self.packed else _plain_linear
        self.linear = {"int8": _int8_linear, "w8a8": _w8a8_linear,
                       "int4": _int4_linear}.get(precision, plain)
        self.head_linear = {"w8a8": _w8a8_linear}.get(
            precision, _int8_linear if quantized else plain)
        self.batch_size = batch_size
        with torch.inference_mode(False):       # normal tensors, usable in any mode
            self.blocks = [self.prepare_block(self.block_weights(block))
                           for block in model.blocks]
            self.head = (None if self.own and not self.packed
                         else self.prepare_matrix(self.head_matrix(), head=True))
        self.block = torch.compile(self._block, dynamic=True) if compile else self._block

    def prepare_matrix(self, weight: Tensor, *, head: bool = False):
        """weight (d_in, d_out) as this object's linear reads it: the model's tensor, a cast
        copy, oneDNN's packed copy, an :class:`Int8Linear` (int8, and the head of int4), a
        :class:`W8A8Linear` or an :class:`Int4Linear`."""
        w = weight.detach()
        if self.precision == "w8a8":
            return w8a8_linear(w)
        if self.precision == "int8" or (self.precision == "int4" and head):
            return int8_linear(w, self.dtype)
        if self.precision == "int4":
            return int4_linear(w, self.dtype)
        w = w.to(self.dtype)
        return _pack(w, self.batch_size) if self.packed else w

    def prepare_block(self, weights: NamedTuple) -> NamedTuple:
        """One block's tensors for this precision: matrices (``w_*``) by
        :meth:`prepare_matrix`, biases (``b_*``) in ``dtype``, norm weights in
        ``stream_dtype``; the model's own tensors when nothing changes."""
        if self.own and not self.packed:
            return weights
        return weights._replace(**{
            name: (self.prepare_matrix(t) if name.startswith("w_") else
                   t.detach().to(self.dtype if name.startswith("b_") else self.stream_dtype))
            for name, t in weights._asdict().items()})

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

    def head_logits(self, normed: Tensor) -> Tensor:
        """normed: (b, d) in stream_dtype -> logits (b, v) in stream_dtype through this
        object's head (:attr:`head`; None: the model's own (d, v) matrix,
        :meth:`output_matrix`)."""
        if self.head is None:
            return normed @ self.output_matrix()                                # (b, v)
        logits = self.head_linear(normed.to(self.dtype), self.head, None)
        return logits.to(self.stream_dtype)                                     # (b, v)

    def rotation(self, positions: Tensor):
        """What the blocks need of the positions (None: they entered at the embedding)."""
        return None

    def weight_bytes(self) -> int:
        """Bytes of weights one decode step reads: every tensor of the blocks (codes, scales,
        norms, biases, in this object's precision) and the output projection. The embedding's
        few rows (one per token) are not counted. Chapters 7 and 13."""
        head = self.output_matrix() if self.head is None else self.head
        return bytes_of([self.blocks, head])

    # -- what each model fills in ----------------------------------------------------------
    def block_weights(self, block) -> NamedTuple:
        """One block's tensors, named (matrices ``w_*``, which may be packed)."""
        raise NotImplementedError

    def head_matrix(self) -> Tensor:
        """The output projection as a (d, v) matrix (a view of the model's tensor)."""
        raise NotImplementedError

    def output_matrix(self) -> Tensor:
        """The model's own (d, v) output projection, read as it is for logits."""
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
    copies in the fast path's precision (the matrices ``w_*`` packed or quantized)."""

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
    a transposed copy that follows the embedding (:meth:`output_weight`) or from this object's
    own head. Chapters 7 and 13."""

    def __init__(self, model: GPT, *, compile: bool = False, batch_size: int = 1,
                 precision: str | None = None):
        self.eps = model.config.ln_eps
        self._output: tuple[tuple, Tensor] | None = None     # (embedding key, its transpose)
        super().__init__(model, compile=compile, batch_size=batch_size, precision=precision)
        ln_f = model.ln_f
        self.ln_f = (ln_f.scale.detach().to(self.stream_dtype),
                     ln_f.shift.detach().to(self.stream_dtype))

    def block_weights(self, block) -> GPTBlockWeights:
        attention, ffn = block.attention, block.ffn
        return GPTBlockWeights(block.ln_1.scale, block.ln_1.shift, attention.w_qkv,
                               attention.b_qkv, attention.w_o, attention.b_o, block.ln_2.scale,
                               block.ln_2.shift, ffn.w_up, ffn.b_up, ffn.w_down, ffn.b_down)

    def head_matrix(self) -> Tensor:
        return self.model.token_embedding.t()                                   # (d, v)

    def output_matrix(self) -> Tensor:
        return self.output_weight()

    def embed(self, tokens: Tensor, positions: Tensor) -> Tensor:
        model = self.model
        x = F.embedding(tokens, model.token_embedding) + model.position_embedding[positions]
        return x.to(self.stream_dtype)                                          # (b, n, d)

    def _block(self, x: Tensor, w: GPTBlockWeights, keys: Tensor,
               values: Tensor, start: int, mask: Tensor | None,
               rotation: None) -> Tensor:
        """One block on x: (b, n, d) -> (b, n, d), its K/V rows written at
        [start, start + n) of this layer's cache (:meth:`attend`). The
        residual stream x stays in stream_dtype; each matrix sees dtype."""
        b, n, d = x.shape
        rows = x.view(b * n, d)
        normed = F.layer_norm(rows, (d,), w.ln_1_scale, w.ln_1_shift,
                              self.eps).to(self.dtype)
        qkv = self.heads(self.linear(normed, w.w_qkv, w.b_qkv), b, n)
        q, k, v = qkv.split((self.h, self.h_kv, self.h_kv), dim=1)
        out = self.attend(q, k, v, keys, values, start, mask)
        out = out.transpose(1, 2).reshape(b * n, d)                   # (b n, d)
        rows = rows + self.linear(out, w.w_o, w.b_o)                  # residual
        normed = F.layer_norm(rows, (d,), w.ln_2_scale, w.ln_2_shift,
                              self.eps).to(self.dtype)
        hidden = F.gelu(self.linear(normed, w.w_up, w.b_up),
                        approximate="tanh")                           # (b n, f)
        out = self.linear(hidden, w.w_down, w.b_down)                 # (b n, d)
        return (rows + out).view(b, n, d)                             # residual

    def logits(self, last: Tensor) -> Tensor:
        """last: (b, d), the last position's residual stream -> logits (b, v)."""
        scale, shift = self.ln_f
        normed = F.layer_norm(last, (self.config.d_model,), scale, shift, self.eps)
        return self.head_logits(normed)                                         # (b, v)

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
    copies in the fast path's precision (the matrices ``w_*`` packed or quantized)."""

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

    def __init__(self, model: Llama, *, compile: bool = False, batch_size: int = 1,
                 precision: str | None = None):
        c = model.config
        self.eps = c.rms_eps
        super().__init__(model, compile=compile, batch_size=batch_size, precision=precision)
        dtype = torch.float64 if self.dtype == torch.float64 else torch.float32
        every = torch.arange(c.max_seq_len, device=model.device)
        with torch.inference_mode(False):
            cos, sin = rope_tables(every, c.d_head, c.rope_base, dtype=dtype)
            self.norm_f = model.norm_f.weight.detach().to(self.stream_dtype)
        self.cos, self.sin = cos.to(self.dtype), sin.to(self.dtype)   # (T, d_head)

    def block_weights(self, block) -> LlamaBlockWeights:
        attention, ffn = block.attention, block.ffn
        return LlamaBlockWeights(block.attn_norm.weight, attention.w_q, attention.w_k,
                                 attention.w_v, attention.w_o, block.ffn_norm.weight,
                                 ffn.w_gate, ffn.w_up, ffn.w_down)

    def head_matrix(self) -> Tensor:
        return self.model.lm_head                                               # (d, v)

    def output_matrix(self) -> Tensor:
        return self.model.lm_head

    def embed(self, tokens: Tensor, positions: Tensor) -> Tensor:
        return F.embedding(tokens, self.model.token_embedding).to(self.stream_dtype)

    def rotation(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin: (b, 1, n, d_head) for the positions (b, n), shared by every block."""
        return self.cos[positions][:, None], self.sin[positions][:, None]

    def _block(self, x: Tensor, w: LlamaBlockWeights, keys: Tensor, values: Tensor,
               start: int, mask: Tensor | None, rotation: tuple[Tensor, Tensor]) -> Tensor:
        """One block on x: (b, n, d) -> (b, n, d); keys stored already rotated."""
        b, n, d = x.shape
        rows = x.view(b * n, d)
        normed = F.rms_norm(rows, (d,), w.attn_norm, self.eps).to(self.dtype)
        q, k, v = (self.heads(self.linear(normed, weight, None), b, n)
                   for weight in (w.w_q, w.w_k, w.w_v))
        cos, sin = rotation
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        out = self.attend(q, k, v, keys, values, start, mask)   # (b, h, n, d_head)
        out = out.transpose(1, 2).reshape(b * n, d)              # (b n, d)
        rows = rows + self.linear(out, w.w_o, None)              # residual
        normed = F.rms_norm(rows, (d,), w.ffn_norm, self.eps).to(self.dtype)
        gate = F.silu(self.linear(normed, w.w_gate, None))
        hidden = gate.mul_(self.linear(normed, w.w_up, None))    # (b n, f)
        out = self.linear(hidden, w.w_down, None)
        return (rows + out).view(b, n, d)                        # residual

    def logits(self, last: Tensor) -> Tensor:
        """last: (b, d), the last position's residual stream -> logits (b, v)."""
        normed = F.rms_norm(last, (self.config.d_model,), self.norm_f, self.eps)
        return self.head_logits(normed)                                         # (b, v)


def fast_model(model, *, compile: bool = False, batch_size: int = 1,
               precision: str | None = None) -> FastDecoder:
    """The fast path's arrangement of ``model`` in ``precision`` (None, "fp32", "bf16",
    "int8", "int4"; see :class:`FastDecoder`): a :class:`FastGPT` for a GPT, a
    :class:`FastLlama` for a Llama; any other model is refused, naming those two."""
    if isinstance(model, GPT):
        return FastGPT(model, compile=compile, batch_size=batch_size, precision=precision)
    if isinstance(model, Llama):
        return FastLlama(model, compile=compile, batch_size=batch_size, precision=precision)
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
            self.cache = StaticCache(model, b, total, dtype=fast.dtype)
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
