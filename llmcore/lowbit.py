"""The fast path's formats: one entry per precision, saying how a matrix is stored and multiplied.

A (d_in, d_out) matrix W meets the activations x (rows, d_in) in one product per layer. Each
precision of the fast path (``precision=``, chapters 7 and 13) is a row of :data:`FORMATS`:

    precision  activations  how W is stored (prepare)               the product (linear)      head
    "fp32"     float32      the model's tensor (or oneDNN's packing)  torch.addmm (or oneDNN)   same
    "bf16"     bfloat16     a bfloat16 copy (or oneDNN's packing)     torch.addmm (or oneDNN)   same
    "int8"     bfloat16     :class:`Int8Linear`: int8, scale/column   aten._weight_int8pack_mm  same
    "w8a8"     float32      :class:`W8A8Linear`: fbgemm's int8        int8 x int8 (fbgemm)      same
    "int4"     bfloat16     :class:`Int4Linear`: 4-bit groups         aten._weight_int4pack_mm  int8

"int8" stores the matrices as int8 with one scale per output channel and runs PyTorch's
weight-only int8 kernel; "int4" stores them as 4-bit codes in groups of :data:`INT4_GROUP_SIZE`
rows along d_in and runs PyTorch's CPU int4 kernel, its head in int8 (the head's error reaches
the logits with no layer after it). The bfloat16 formats feed the kernels bfloat16 activations
(they are fast only then); the kernels accumulate in float32. "w8a8" stores the same int8 codes
and scales as "int8" but rounds the activations too, each row (token) to its own integer codes,
and multiplies integers by integers (fbgemm's int8 GEMM, the kernel under PyTorch's dynamic
quantization; a CPU instruction such as AVX-512 VNNI does 64 int8 multiply-adds at once).

The kernel is picked per batch size (:func:`format_of`): on the CPU, from a row's
``dense_from`` batch size on, the weight-only precisions ("bf16" from 2 rows, "int8" and "int4"
from 8) run :func:`dense`, their rounded weights dequantized once into float32 and multiplied
in float32, since their kernels widen every weight for every block of rows and fall behind
float32's own at large batches (the measurements are at :data:`BF16_DENSE_FROM_BATCH` and
:data:`INT_DENSE_FROM_BATCH`). On a CPU that multiplies bfloat16 in hardware
(:func:`bf16_arithmetic`: AVX512-BF16 or AMX), "bf16" stays bfloat16 at every batch size and
"int8" and "int4" are dequantized once into bfloat16 and multiplied in bfloat16, the faster
arithmetic there; the benchmark prints each setting's kernel. For one row, "bf16", "int8",
"w8a8" and "int4" have one more form, :data:`ONE_ROW_FORMATS`: the same numbers multiplied by
llmcore's C kernels (:mod:`llmcore.onerow`), which the fast path keeps where they measure
faster.

The floating-point formats prepare nothing of their own: their matrices are the model's (cast to
the format's dtype), read by ``torch.addmm`` or, where the caller chooses it, by oneDNN's
prepacked product (:func:`pack`, :func:`packed_linear`). The fast decoder
(:class:`llmcore.fastpath.FastModel`) reads its row of the table once, when it is built.
Chapter 13.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Callable, NamedTuple

import torch
from torch import Tensor

from . import onerow
from .quantize import (INT4_GROUP_SIZE, int4_scale_offset, quantize_int4, quantize_int8,
                       round_weight, unpack_int4)

INT4_KERNEL_COLUMNS = 16
"""PyTorch's CPU int4 kernel packs output columns in groups of 16: d_out must be a multiple."""

INT8_KERNEL_DEPTH = 16
"""PyTorch's CPU weight-only int8 kernel (``aten._weight_int8pack_mm``, torch 2.13) reads d_in
in blocks of 16: with any other d_in it returns wrong numbers or crashes (d_in = 8 or 100,
every d_out tried), so :func:`int8_linear` refuses such a matrix."""

def packed_linear_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether oneDNN's prepacked matrix products exist for matrices in ``dtype`` on ``device``:
    the CPU, float32 (or bfloat16 where oneDNN supports it on this CPU) and a torch built with
    oneDNN (mkldnn)."""
    if not (device.type == "cpu" and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype == torch.float32


def pack(weight: Tensor, batch_size: int, *, transposed: bool = True) -> Tensor:
    """weight (d_in, d_out) (or (d_out, d_in) when not transposed) in oneDNN's blocked layout for
    products with about batch_size rows: an opaque tensor only :func:`packed_linear` reads."""
    w = weight.detach()
    return torch.ops.mkldnn._reorder_linear_weight(w.t() if transposed else w, batch_size)


def plain_linear(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    """x (rows, d_in) @ w (d_in, d_out) + b: one torch.addmm (torch.mm without a bias)."""
    return torch.mm(x, w) if b is None else torch.addmm(b, x, w)


def packed_linear(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    """The same product with w prepacked by :func:`pack` (oneDNN's kernel)."""
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
    laid out for ``aten._weight_int8pack_mm``, the scale in ``dtype`` (the activations'). The
    kernel wants d_in a multiple of :data:`INT8_KERNEL_DEPTH`."""
    d_in, d_out = weight.shape
    if d_in % INT8_KERNEL_DEPTH:
        raise ValueError(f"int8: PyTorch's weight-only int8 kernel needs d_in divisible by "
                         f"{INT8_KERNEL_DEPTH}, got a ({d_in}, {d_out}) matrix")
    q = quantize_int8(weight.detach())
    return Int8Linear(q.values.t().contiguous(), q.scale.to(dtype))


def int4_linear(weight: Tensor, dtype: torch.dtype,
                group_size: int = INT4_GROUP_SIZE) -> Int4Linear:
    """weight (d_in, d_out) -> :class:`Int4Linear`: :func:`llmcore.quantize.quantize_int4`
    (with zero points) laid out for ``aten._weight_int4pack_mm_for_cpu``. The kernel wants
    d_out a multiple of :data:`INT4_KERNEL_COLUMNS`."""
    d_in, d_out = weight.shape
    if d_out % INT4_KERNEL_COLUMNS:
        raise ValueError(f"int4: PyTorch's CPU kernel needs d_out divisible by "
                         f"{INT4_KERNEL_COLUMNS}, got a "
                         f"({d_in}, {d_out}) matrix")
    q = quantize_int4(weight.detach(), group_size)
    codes = unpack_int4(q.packed).t().contiguous().to(torch.int32)            # (d_out, d_in)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
    return Int4Linear(packed, torch.stack(int4_scale_offset(q), dim=-1).to(dtype), group_size)


W8A8_STEP = 1 / 64
"""The step in which w8a8 rounds each activation row divided by its largest magnitude: codes
-64..64, the largest magnitude exactly on code 64 (never halfway between two codes, where a
last-bit difference in computing x / (r step) could round either way)."""

W8A8_ZERO = 64
"""The unsigned code of 0 in w8a8's activations: codes -64..64 travel as 0..128."""


class W8A8Linear(NamedTuple):
    """A (d_in, d_out) matrix for the int8 x int8 product: fbgemm's packed int8 codes with one
    scale per output channel (``torch.ops.quantized.linear_prepack``; an opaque object, so its
    bytes are counted by :attr:`weight_bytes`: d_in d_out codes and d_out float32 scales; see
    :func:`_w8a8_linear` for the product)."""

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
    return (device.type == "cpu"
            and hasattr(torch.ops.quantized, "linear_with_input_q_dq_qweight_dq_output_fp32")
            and ("fbgemm" in engines or "x86" in engines))


def w8a8_linear(weight: Tensor, dtype: torch.dtype = torch.float32) -> W8A8Linear:
    """weight (d_in, d_out) float32 -> :class:`W8A8Linear`: :func:`llmcore.quantize.quantize_int8`
    (the codes and scales the "int8" precision stores), packed once for fbgemm. dtype: the
    activations', float32, the kernel's only one (a parameter so that every format prepares
    with one signature). fbgemm takes its codes as one of PyTorch's quantized tensors, an API
    torch 2.13 deprecates: its warning is silenced here, where the packing happens, and
    nowhere else."""
    if dtype != torch.float32:
        raise ValueError(f"w8a8: fbgemm's kernel takes float32 activations, got {dtype}")
    d_in, d_out = weight.shape
    q = quantize_int8(weight.detach().float())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        codes = torch._make_per_channel_quantized_tensor(
            q.values.t().contiguous(), q.scale.double(),
            torch.zeros(d_out, dtype=torch.long), 0)                           # (d_out, d_in)
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

    Each row is divided by its largest magnitude r (every row then in [-1, 1]) and handed to
    fbgemm's kernel with a fixed scale, :data:`W8A8_STEP`: it rounds x[i] / r[i] in steps of
    1 / 64 to integer codes from -64 to 64 (sent unsigned, :data:`W8A8_ZERO` meaning 0),
    multiplies them by the weight's int8 codes with integer sums, and returns the float32
    product scaled by the step and each column's scale; times r[i], row i is x[i] W. Each row
    is rounded on its own, so a row's product never depends on the rest of its batch (fbgemm's
    dynamic kernel, ``linear_dynamic``, would round the whole input with one scale from its
    min and max). About 7 bits per activation, as PyTorch's dynamic quantization keeps
    (``reduce_range``, so that CPUs without VNNI cannot overflow their 16-bit pair sums:
    2 x 128 x 127 < 2**15). One row (a decode step at batch 1) takes r step as the kernel's
    scale instead: the same codes and integer sums, with no division before and no
    multiplication after (two passes over the row fewer, on each of a model's products).
    Tested against that float64 model in tests/test_fastpath_precision.py."""
    if x.shape[0] == 1:
        r = float(x.abs().max())
        if 0 < r < math.inf:                   # else (zeros, inf, nan): as every batch
            out = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
                x, W8A8_STEP * r, W8A8_ZERO, w.packed)                         # (1, d_out)
            return out if b is None else out.add_(b)
    r = x.abs().amax(dim=1, keepdim=True).clamp_(min=torch.finfo(x.dtype).tiny)  # (rows, 1)
    out = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
        x / r, W8A8_STEP, W8A8_ZERO, w.packed)                                 # (rows, d_out)
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


def int4_available(device: torch.device) -> bool:
    """Whether PyTorch's int4 kernel used here runs on ``device``: the CPU's (and the meta
    device, which only computes shapes)."""
    return device.type in ("cpu", "meta")


def everywhere(device: torch.device) -> bool:
    """A kernel every device has (torch.addmm, the int8 weight-only product)."""
    return True


class Format(NamedTuple):
    """One precision of the fast path: what its matrices are stored as and multiplied by.

    dtype: the activations' (and the KV cache's) dtype, None for the model's own;
    prepare(weight (d_in, d_out), dtype) -> the stored matrix, None for the weight itself cast to
    dtype (which a caller may :func:`pack` for oneDNN); linear(x (rows, d_in), stored,
    b (d_out,) or None) -> (rows, d_out), None for :func:`plain_linear` (or
    :func:`packed_linear`); head: the precision of the output projection (or its Format),
    None for this one;
    available(device) -> whether the kernel runs there, and kernel: its name, for the message
    that refuses it; own: the model's tensors serve as they are when they already have dtype
    (else every tensor is copied, the norms to float32); dense_from: the batch size from which
    this weight-only precision runs on the CPU as :func:`dense` does (None: never); rounding:
    the precision whose rounding (:func:`llmcore.quantize.round_weight`) the weights get before
    they are cast to dtype (None: none)."""

    dtype: torch.dtype | None
    prepare: Callable[[Tensor, torch.dtype], object] | None = None
    linear: Callable[[Tensor, object, Tensor | None], Tensor] | None = None
    head: str | Format | None = None
    available: Callable[[torch.device], bool] = everywhere
    kernel: str = "torch.addmm (or oneDNN's packed product)"
    own: bool = False
    dense_from: int | None = None
    rounding: str | None = None


BF16_DENSE_FROM_BATCH = 2
"""From this batch size on, "bf16" runs on the CPU as :func:`dense`: on a CPU without bfloat16
arithmetic (no AVX512-BF16 or AMX, as the course's Intel machine) oneDNN widens every weight
for every product, and a decode step of GPT-2 small with bfloat16 weights ran at 0.66x
float32's speed at batch 4 and 0.56x at batch 16 (1.28x at batch 1, where reading half the
bytes wins; one thread, oneDNN held to AVX512_CORE_VNNI, on a busy 2-core machine:
indicative). A CPU with bfloat16 arithmetic would gain from bfloat16 at every batch size."""

INT_DENSE_FROM_BATCH = 8
"""From this batch size on, "int8" and "int4" (weight-only) run on the CPU as :func:`dense`:
PyTorch's weight-only kernels turn every code into a number for every block of rows, so the
gain of reading 1 or 0.5 bytes a weight shrinks as the rows grow (GPT-2 small's decode step,
one thread: int8 at 1.81x, 1.59x and 0.93x float32's speed at batch 1, 4 and 16; int4 at
2.51x, 1.90x, 0.95x). Indicative, as :data:`BF16_DENSE_FROM_BATCH`; the crossing lies
between 4 and 16."""


@functools.cache
def _cpu_multiplies_bf16() -> bool:
    cpu = getattr(torch, "cpu", None)
    try:
        return bool(cpu._is_avx512_bf16_supported() or cpu._is_amx_tile_supported())
    except AttributeError:                      # an older torch: assume the widening CPU
        return False


def bf16_arithmetic(device: torch.device) -> bool:
    """Whether ``device`` is a CPU that multiplies bfloat16 in hardware (AVX512-BF16 or AMX),
    so that bfloat16 weights and activations beat float32 at every batch size (one (16, 768) by
    (768, 3072) product: 2.8x float32's speed on an AMD EPYC with AVX512-BF16); elsewhere
    oneDNN widens every bfloat16 weight for every product (:data:`BF16_DENSE_FROM_BATCH`)."""
    return device.type == "cpu" and _cpu_multiplies_bf16()


def dense(precision: str, dtype: torch.dtype = torch.float32, *, amx: bool = False) -> Format:
    """How a weight-only precision serves large batches on the CPU ("dequantized once"): its
    matrices rounded as ``precision`` rounds them (:func:`llmcore.quantize.round_weight`: the
    bf16 values, int8 per column, int4 per group of :data:`INT4_GROUP_SIZE`) and kept in
    ``dtype``, the activations, the KV cache and every product in ``dtype`` (``torch.addmm`` or
    oneDNN's packed kernel, as "fp32" or "bf16"), its head rounded as the precision's head. The
    same weights as the precision's kernel at batch 1 (in bfloat16, rounded once more to its 8
    bits of mantissa), that dtype's arithmetic on them: float32 by default, bfloat16 where the
    CPU multiplies it in hardware (:func:`format_of`); with ``amx`` (bfloat16 only) the rounded
    weights in :func:`llmcore.onerow.bf16_rows`' layout, multiplied by llmcore's AMX kernel
    (:func:`llmcore.onerow.bf16_onerow`, ``F.linear`` for more rows). Chapter 13."""
    fmt = FORMATS[precision]
    name = str(dtype).removeprefix("torch.")
    kernel = f"{name} products on {precision}-rounded weights (dequantized once)"
    if amx:
        if dtype != torch.bfloat16:
            raise ValueError(f"dense: AMX's kernel multiplies bfloat16, got {dtype}")
        return Format(dtype, onerow.bf16_rows, _bf16_one_row_in_c, head=fmt.head,
                      rounding=precision, available=onerow.amx_available,
                      kernel=kernel + "; llmcore's AMX kernel (C)")
    return Format(dtype, head=fmt.head, rounding=precision, kernel=kernel)


FORMATS = {
    "fp32": Format(torch.float32, own=True),
    "bf16": Format(torch.bfloat16, dense_from=BF16_DENSE_FROM_BATCH),
    "int8": Format(torch.bfloat16, int8_linear, _int8_linear,
                   kernel="PyTorch's weight-only int8 kernel", dense_from=INT_DENSE_FROM_BATCH),
    "w8a8": Format(torch.float32, w8a8_linear, _w8a8_linear,
                   available=w8a8_available,
                   kernel="PyTorch's int8 x int8 CPU kernel (fbgemm)"),
    "int4": Format(torch.bfloat16, int4_linear, _int4_linear, head="int8",
                   available=int4_available, kernel="PyTorch's CPU int4 kernel",
                   dense_from=INT_DENSE_FROM_BATCH),
}
"""Every precision of the fast path, one row each (see the module's docstring)."""

def _int8_one_row_in_c(x: Tensor, w: Int8Linear, b: Tensor | None) -> Tensor:
    """x (rows, d_in) @ the int8 matrix (+ b): one row through llmcore's C kernel
    (:func:`llmcore.onerow.int8_onerow`), several (a prompt) through PyTorch's weight-only
    int8 kernel on the same codes."""
    return onerow.int8_onerow(x, w, b) if x.shape[0] == 1 else _int8_linear(x, w, b)


def _bf16_one_row_in_c(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    """x (rows, d_in) @ w, (d_out, d_in) bfloat16 (+ b): up to
    :func:`llmcore.onerow.bf16_rows_at_most` rows through llmcore's C kernels
    (:func:`llmcore.onerow.bf16_onerow`), more (a long prompt) through ``F.linear``."""
    if x.shape[0] <= onerow.bf16_rows_at_most():
        return onerow.bf16_onerow(x, w, b)
    return torch.nn.functional.linear(x, w, b)


ONE_ROW_FORMATS = {
    "bf16": Format(torch.bfloat16, onerow.bf16_rows, _bf16_one_row_in_c,
                   available=onerow.bf16_available,
                   kernel="llmcore's one-row bfloat16 kernel (C, AVX512-BF16)"),
    "int8": Format(torch.bfloat16, int8_linear, _int8_one_row_in_c, available=onerow.available,
                   kernel="llmcore's one-row int8 kernel (C, AVX-512)"),
    "w8a8": Format(torch.float32, onerow.w8a8_rows, onerow.w8a8_onerow,
                   available=onerow.available,
                   kernel="llmcore's one-row int8 x int8 kernel (C, AVX-512 VNNI)"),
}
ONE_ROW_FORMATS["fp32"] = Format(
    torch.float32, None, onerow.fp32_onerow, available=onerow.available, own=True,
    kernel="llmcore's one-row float32 kernel (C, AVX-512)")
ONE_ROW_FORMATS["int4"] = Format(
    torch.bfloat16, onerow.int4_rows, onerow.int4_onerow, head=ONE_ROW_FORMATS["int8"],
    available=onerow.available, kernel="llmcore's one-row int4 kernel (C, AVX-512)")
"""One more form of a precision for one row, where its C kernel runs
(:func:`llmcore.onerow.available`): the same bfloat16 values, int8 codes and scales or int4
codes, scales and offsets (and, for "w8a8", the same rounding of the activations and the same
float32 results), multiplied by :mod:`llmcore.onerow`'s C kernels, which stream a matrix at
memory speed where PyTorch's one-row kernels fall short of it; "int4"'s head (int8) takes
"int8"'s C kernel. The fast path measures it against the precision's own forms and keeps the
fastest (:meth:`llmcore.fastpath.FastDecoder.one_row_forms`)."""


def _amx_batches(device: torch.device) -> bool:
    """Whether a batch's bfloat16 products run on llmcore's AMX kernel on ``device``: a CPU
    that multiplies bfloat16 (:func:`bf16_arithmetic`) with AMX lent to this process
    (:func:`llmcore.onerow.amx_available`)."""
    return bf16_arithmetic(device) and onerow.amx_available(device)


MANY_ROW_FORMATS = {
    "w8a8": ONE_ROW_FORMATS["w8a8"]._replace(
        kernel="llmcore's rounding of each row (C) and oneDNN's int8 x int8 product "
               "(torch._int_mm)"),
    "bf16": ONE_ROW_FORMATS["bf16"]._replace(
        available=_amx_batches,
        kernel="llmcore's bfloat16 product of a few rows on AMX (C)"),
}
"""How a precision serves two rows or more on the CPU where :mod:`llmcore.onerow` runs (see
:func:`format_of`): "w8a8" rounds each row in one pass in C and multiplies the codes with
``torch._int_mm``, then scales each row in C, where fbgemm's kernel takes one scale for the
whole input and each row must first be divided by its own (two more passes over the rows and
one over the products). The same codes, integer sums and float32 operations as its one-row
kernel: a row gives the same numbers alone and in a batch. GPT-2 small's 49 products at 16
rows on the course's Intel Xeon: 11.1 ms against 14.0 ms through fbgemm, measured together;
the integer products alone 9.1 ms against fbgemm's 11.4 (11.0 against 11.7 with oneDNN held
to AVX-512 VNNI, without the CPU's AMX). "bf16", where AMX runs (:func:`_amx_batches`), takes
its one-row form's weights and llmcore's AMX kernel (:func:`llmcore.onerow.bf16_onerow`)."""

MANY_ROWS_AT_MOST = {"bf16": onerow.BF16_AMX_ROWS_AT_MOST}
"""The largest batch a :data:`MANY_ROW_FORMATS` form serves (none: every batch); a larger one
keeps the precision's own form (a decode step's rows are the batch's)."""


PRECISIONS = tuple(FORMATS)
"""What ``precision=`` accepts (None: the model's own dtype and tensors)."""

NATIVE = Format(None, own=True)
"""precision=None: the model's own tensors, in its own dtype."""


def format_of(precision: str | None, device: torch.device, batch_size: int = 1) -> Format:
    """The row of :data:`FORMATS` for ``precision`` (:data:`NATIVE` for None), refused with what
    was expected if it is unknown or its kernel does not run on ``device``; on the CPU, from
    the row's ``dense_from`` batch size on, the precision's :func:`dense` form (the kernel per
    batch size); on a CPU with bfloat16 arithmetic (:func:`bf16_arithmetic`) "bf16" keeps its
    row at every batch size and the others' dense form multiplies in bfloat16; from 2 rows on,
    its :data:`MANY_ROW_FORMATS` form where that runs (up to :data:`MANY_ROWS_AT_MOST` rows),
    and on AMX the weight-only precisions' dense form multiplies there too. Chapter 13."""
    if precision is None:
        return NATIVE
    if precision not in FORMATS:
        raise ValueError(f"precision: expected None or one of {PRECISIONS}, got {precision!r}")
    fmt = FORMATS[precision]
    if not fmt.available(device):
        engines = (f", and this torch's quantized engines are "
                   f"{torch.backends.quantized.supported_engines}" if precision == "w8a8" else "")
        raise ValueError(f"precision={precision!r} uses {fmt.kernel}; the model is on "
                         f"{device}{engines}")
    many = MANY_ROW_FORMATS.get(precision)
    if (device.type == "cpu" and 2 <= batch_size <= MANY_ROWS_AT_MOST.get(precision, batch_size)
            and many is not None and many.available(device)):
        return many
    if device.type == "cpu" and fmt.dense_from is not None and batch_size >= fmt.dense_from:
        if not bf16_arithmetic(device):
            return dense(precision)
        if precision != "bf16":             # bf16 itself needs no dense form on such a CPU
            return dense(precision, torch.bfloat16, amx=_amx_batches(device)
                         and batch_size <= MANY_ROWS_AT_MOST["bf16"])
    return fmt
