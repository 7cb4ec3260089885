"""Weights in fewer bits: scaled integers, and the products that keep the scale outside.

Weight-only int8, one scale per output channel (column j of W, the book's (d_in, d_out)
convention)::

    W[:, j] ~ Q[:, j] * s[j]    Q int8 in [-127, 127],  s[j] = max_i |W[i, j]| / 127
    X W ~ X (Q S) = (X Q) S     S = diag(s): the scale leaves the product

int4 in groups of g consecutive rows along d_in, a scale and a zero point per group and
column, two 4-bit codes per byte::

    W[i, j] ~ (C[i, j] - z[i // g, j]) * s[i // g, j]     C in [0, 15]
    X W ~ sum over groups G of ((X_G C_G) - (sum_i X_G[:, i]) z_G) * s_G

The symmetric form fixes z = 8 (codes 1..15 stand for -7..7 times s). Rounding to the nearest
code keeps every weight within half a step of its value: ``|W - dequantize(quantize(W))| <=
s / 2``. :func:`quantized_matmul` is the product with the scale (and the zero point) outside,
group by group; :func:`fake_quantize` rounds a whole model's matrices to measure what the
rounding costs. The fast path runs the same formats on PyTorch's kernels
(:mod:`llmcore.lowbit`). Chapter 13.
"""

from __future__ import annotations

import copy
from typing import NamedTuple

import torch
from torch import Tensor

INT8_MAX = 127
"""int8 codes are kept in [-127, 127]: symmetric, so -W rounds to -Q (-128 is never used)."""

INT4_LEVELS = 15
"""int4 codes are in [0, INT4_LEVELS]: sixteen levels, two codes per byte."""

INT4_SYMMETRIC_ZERO = 8
"""The zero point of the symmetric int4 form: code 8 stands for 0."""

ROUNDINGS = ("fp32", "bf16", "fp16", "int8", "int4")
"""The roundings :func:`fake_quantize` knows (fp32 leaves the weights as they are); the fast
path's kernels are :data:`llmcore.lowbit.PRECISIONS`."""

INT4_GROUP_SIZE = 32
"""Rows of W per int4 scale and zero point, unless a caller names another group size."""


class Int8Weight(NamedTuple):
    """A (d_in, d_out) matrix as int8 codes and one float32 scale per output channel:
    ``W[:, j] ~ values[:, j] * scale[j]``. Chapter 13."""

    values: Tensor   # (d_in, d_out) int8 in [-127, 127]
    scale: Tensor    # (d_out,) float32


class Int4Weight(NamedTuple):
    """A (d_in, d_out) matrix as 4-bit codes packed two per byte along d_in, with a float32
    scale and zero point per group of ``group_size`` rows and per column:
    ``W[i, j] ~ (code[i, j] - zero[i // g, j]) * scale[i // g, j]``. Chapter 13."""

    packed: Tensor   # (d_in // 2, d_out) uint8: code[2i, j] low 4 bits, code[2i+1, j] high
    scale: Tensor    # (d_in // group_size, d_out) float32
    zero: Tensor     # (d_in // group_size, d_out) float32 (8 for the symmetric form)
    group_size: int


def _check_matrix(w: Tensor, what: str = "w") -> None:
    """A floating (d_in, d_out) matrix, or a clear error."""
    if not isinstance(w, Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor (d_in, d_out), got {type(w).__name__}")
    if w.dim() != 2:
        raise ValueError(f"{what}: expected a matrix (d_in, d_out), got shape {tuple(w.shape)}")
    if not w.is_floating_point():
        raise TypeError(f"{what}: expected a floating dtype, got {w.dtype}")


def _working(w: Tensor) -> Tensor:
    """w in the dtype the rounding is computed in: float64 stays, others become float32."""
    return w if w.dtype == torch.float64 else w.float()


def quantize_int8(w: Tensor) -> Int8Weight:
    """Symmetric int8 per output channel: w (d_in, d_out) -> values (d_in, d_out) int8 and
    scale (d_out,) float32 with ``scale[j] = max_i |w[i, j]| / 127``; a column of zeros gets
    scale 1 (its codes are all 0). Each value is rounded to the nearest code, so
    ``|w - values * scale| <= scale / 2``. Chapter 13."""
    _check_matrix(w)
    wf = _working(w)
    amax = wf.abs().amax(dim=0)                                          # (d_out,)
    scale = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax)).float()
    codes = torch.round(wf / scale.to(wf.dtype)).clamp_(-INT8_MAX, INT8_MAX)
    return Int8Weight(codes.to(torch.int8), scale)


def _check_int8(q: Int8Weight) -> None:
    if not isinstance(q, Int8Weight):
        raise TypeError(f"expected an Int8Weight, got {type(q).__name__}")
    if q.values.dtype != torch.int8 or q.values.dim() != 2:
        raise ValueError(f"Int8Weight.values: expected an int8 matrix (d_in, d_out), got "
                         f"{q.values.dtype} {tuple(q.values.shape)}")
    if tuple(q.scale.shape) != (q.values.shape[1],):
        raise ValueError(f"Int8Weight.scale: expected shape ({q.values.shape[1]},) (one per "
                         f"output channel), got {tuple(q.scale.shape)}")


def dequantize_int8(q: Int8Weight, dtype: torch.dtype = torch.float32) -> Tensor:
    """values * scale: the (d_in, d_out) matrix in ``dtype``. Chapter 13."""
    _check_int8(q)
    work = torch.float64 if dtype == torch.float64 else torch.float32
    return (q.values.to(work) * q.scale.to(work)).to(dtype)


def pack_int4(codes: Tensor) -> Tensor:
    """codes (d_in, d_out), integers in [0, 15], d_in even -> (d_in // 2, d_out) uint8: byte
    [i, j] holds code[2i, j] in its low 4 bits and code[2i+1, j] in its high 4 bits.
    Chapter 13."""
    if not isinstance(codes, Tensor) or codes.dim() != 2:
        raise ValueError(f"codes: expected a matrix (d_in, d_out), got "
                         f"{getattr(codes, 'shape', type(codes).__name__)}")
    if codes.is_floating_point() or codes.is_complex() or codes.dtype == torch.bool:
        raise TypeError(f"codes: expected an integer dtype, got {codes.dtype}")
    if codes.shape[0] % 2:
        raise ValueError(f"codes: d_in must be even to pack two codes per byte, got "
                         f"{codes.shape[0]}")
    if codes.device.type != "meta" and codes.numel() and (
            int(codes.min()) < 0 or int(codes.max()) > INT4_LEVELS):
        raise ValueError(f"codes: expected values in [0, {INT4_LEVELS}], got "
                         f"[{int(codes.min())}, {int(codes.max())}]")
    c = codes.to(torch.uint8)
    return c[0::2] | (c[1::2] << 4)                                       # (d_in // 2, d_out)


def unpack_int4(packed: Tensor) -> Tensor:
    """packed (r, d_out) uint8 -> codes (2 r, d_out) uint8 in [0, 15], the inverse of
    :func:`pack_int4`. Chapter 13."""
    if not isinstance(packed, Tensor) or packed.dim() != 2 or packed.dtype != torch.uint8:
        raise ValueError(f"packed: expected a uint8 matrix (d_in // 2, d_out), got "
                         f"{getattr(packed, 'dtype', type(packed).__name__)} "
                         f"{tuple(getattr(packed, 'shape', ()))}")
    r, d_out = packed.shape
    low, high = packed & 0x0F, packed >> 4
    return torch.stack([low, high], dim=1).view(2 * r, d_out)             # (2 r, d_out)


def _check_group(d_in: int, group_size: int) -> None:
    if not isinstance(group_size, int) or group_size <= 0 or group_size % 2:
        raise ValueError(f"group_size: expected a positive even integer, got {group_size!r}")
    if d_in % 2:
        raise ValueError(f"int4 packs two rows per byte: d_in must be even, got {d_in}")
    if d_in % group_size:
        raise ValueError(f"d_in ({d_in}) is not divisible by group_size ({group_size})")


def quantize_int4(w: Tensor, group_size: int = INT4_GROUP_SIZE, *, zero_point: bool = True) -> Int4Weight:
    """int4 in groups of ``group_size`` rows along d_in: w (d_in, d_out) -> :class:`Int4Weight`.

    zero_point=True (asymmetric): each group's range [lo, hi] spans the sixteen codes,
    ``scale = (hi - lo) / 15`` and ``zero = -lo / scale`` (a float, not rounded, so that the
    range is covered exactly). zero_point=False (symmetric): ``zero = 8`` and
    ``scale = max |w| / 7``. A constant group gets scale 1. Rounding to the nearest code gives
    ``|w - dequantize| <= scale / 2``. Chapter 13."""
    _check_matrix(w)
    d_in, d_out = w.shape
    _check_group(d_in, group_size)
    groups = _working(w).view(d_in // group_size, group_size, d_out)     # (G, g, d_out)
    if zero_point:
        lo, hi = groups.amin(dim=1), groups.amax(dim=1)                   # (G, d_out)
        span = hi - lo
        scale = torch.where(span > 0, span / INT4_LEVELS, torch.ones_like(span)).float()
        zero = (-lo / scale.to(lo.dtype)).float()
    else:
        amax = groups.abs().amax(dim=1)
        half = INT4_LEVELS - INT4_SYMMETRIC_ZERO                           # 7
        scale = torch.where(amax > 0, amax / half, torch.ones_like(amax)).float()
        zero = torch.full_like(scale, float(INT4_SYMMETRIC_ZERO))
    work = groups.dtype
    codes = torch.round(groups / scale.to(work)[:, None] + zero.to(work)[:, None])
    codes = codes.clamp_(0, INT4_LEVELS).to(torch.uint8).view(d_in, d_out)
    return Int4Weight(pack_int4(codes), scale, zero, group_size)


def _check_int4(q: Int4Weight) -> None:
    if not isinstance(q, Int4Weight):
        raise TypeError(f"expected an Int4Weight, got {type(q).__name__}")
    unpacked_rows = 2 * q.packed.shape[0] if q.packed.dim() == 2 else -1
    if q.packed.dtype != torch.uint8 or unpacked_rows < 0:
        raise ValueError(f"Int4Weight.packed: expected a uint8 matrix (d_in // 2, d_out), got "
                         f"{q.packed.dtype} {tuple(q.packed.shape)}")
    _check_group(unpacked_rows, q.group_size)
    want = (unpacked_rows // q.group_size, q.packed.shape[1])
    for name in ("scale", "zero"):
        got = tuple(getattr(q, name).shape)
        if got != want:
            raise ValueError(f"Int4Weight.{name}: expected shape {want} (d_in // group_size, "
                             f"d_out), got {got}")


def dequantize_int4(q: Int4Weight, dtype: torch.dtype = torch.float32) -> Tensor:
    """(code - zero) * scale, group by group: the (d_in, d_out) matrix in ``dtype``.
    Chapter 13."""
    _check_int4(q)
    work = torch.float64 if dtype == torch.float64 else torch.float32
    codes = unpack_int4(q.packed)
    d_in, d_out = codes.shape
    groups = codes.view(d_in // q.group_size, q.group_size, d_out).to(work)
    w = (groups - q.zero.to(work)[:, None]) * q.scale.to(work)[:, None]   # (G, g, d_out)
    return w.view(d_in, d_out).to(dtype)


def int4_scale_offset(q: Int4Weight) -> tuple[Tensor, Tensor]:
    """(scale, offset), each (d_in // group_size, d_out) float32, with ``(code - 8) * scale +
    offset`` the same weight as ``(code - zero) * scale``: offset = (8 - zero) * scale, the
    form the int4 kernels read (PyTorch's and :mod:`llmcore.onerow`'s). Chapter 13."""
    _check_int4(q)
    return q.scale, (INT4_SYMMETRIC_ZERO - q.zero) * q.scale


def quantized_matmul(x: Tensor, q: Int8Weight | Int4Weight) -> Tensor:
    """x (..., d_in) @ the quantized matrix -> (..., d_out), in x's dtype.

    Int8Weight: ``(x @ values) * scale``, the scale applied once to the product's columns.
    Int4Weight: group by group, ``(x_G @ codes_G - sum(x_G) zero_G) * scale_G`` summed over
    the groups, unpacking one group's bytes at a time: the whole matrix is never held in
    floating point (at most g x d_out codes are). Chapter 13."""
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise TypeError(f"x: expected a floating tensor (..., d_in), got "
                        f"{getattr(x, 'dtype', type(x).__name__)}")
    if isinstance(q, Int8Weight):
        _check_int8(q)
        d_in = q.values.shape[0]
    elif isinstance(q, Int4Weight):
        _check_int4(q)
        d_in = 2 * q.packed.shape[0]
    else:
        raise TypeError(f"q: expected an Int8Weight or an Int4Weight, got {type(q).__name__}")
    if x.dim() == 0 or x.shape[-1] != d_in:
        raise ValueError(f"x: expected last dimension d_in = {d_in}, got shape "
                         f"{tuple(x.shape)}")
    for name, t in q._asdict().items():
        if isinstance(t, Tensor) and t.device != x.device:
            raise ValueError(f"x is on {x.device} but the weight's {name} is on {t.device}")
    if isinstance(q, Int8Weight):
        return (x @ q.values.to(x.dtype)) * q.scale.to(x.dtype)           # (..., d_out)
    g, half = q.group_size, q.group_size // 2
    out = x.new_zeros(*x.shape[:-1], q.packed.shape[1])                   # (..., d_out)
    for group in range(d_in // g):
        x_g = x[..., group * g:(group + 1) * g]                           # (..., g)
        codes = unpack_int4(q.packed[group * half:(group + 1) * half])    # (g, d_out)
        product = x_g @ codes.to(x.dtype) - x_g.sum(dim=-1, keepdim=True) * q.zero[group].to(
            x.dtype)
        out += product * q.scale[group].to(x.dtype)
    return out


class Int8Rows(NamedTuple):
    """Activations (rows, d) as int8 codes with one float32 scale per row (per token):
    ``x[i] ~ values[i] * scale[i]``. Chapter 13."""

    values: Tensor   # (rows, d) int8 in [-127, 127]
    scale: Tensor    # (rows, 1) float32


def quantize_rows(x: Tensor) -> Int8Rows:
    """Symmetric int8 per row, the activations' side of an int8 x int8 product: x (rows, d)
    -> codes and ``scale[i] = max_j |x[i, j]| / 127`` (1 for a row of zeros). Each row is
    rounded on its own, so a token's codes never depend on the other rows of its batch.
    Chapter 13."""
    if not isinstance(x, Tensor) or x.dim() != 2 or not x.is_floating_point():
        raise ValueError(f"x: expected a floating matrix (rows, d), got "
                         f"{getattr(x, 'dtype', type(x).__name__)} "
                         f"{tuple(getattr(x, 'shape', ()))}")
    q = quantize_int8(x.t())                  # a row of x is a column of x^T: the same rule
    return Int8Rows(q.values.t().contiguous(), q.scale[:, None])


def int8_product(x: Int8Rows, q: Int8Weight) -> Tensor:
    """The int8 x int8 product with both scales outside: ``x W ~ diag(r) (X_q W_q) diag(s)``,
    (rows, d_in) codes times (d_in, d_out) codes summed as integers (exactly: each product is
    at most 127**2 < 2**14, so float64 holds any sum of up to 2**39 of them), then row i times
    r[i] and column j times s[j] -> (rows, d_out) float32. This is the arithmetic of an int8
    GEMM (W8A8): integer multiply-adds, one float multiply per output. Chapter 13."""
    _check_int8(q)
    if not isinstance(x, Int8Rows):
        raise TypeError(f"x: expected an Int8Rows (quantize_rows), got {type(x).__name__}")
    if x.values.shape[1] != q.values.shape[0]:
        raise ValueError(f"x has {x.values.shape[1]} columns but the weight has "
                         f"{q.values.shape[0]} rows (d_in)")
    integers = x.values.double() @ q.values.double()                     # (rows, d_out), exact
    return (integers * x.scale.double() * q.scale.double()).float()


def quantize(w: Tensor, precision: str, *, group_size: int | None = None):
    """w (d_in, d_out) in the named integer precision: an :class:`Int8Weight` for "int8" (no
    group_size), an :class:`Int4Weight` for "int4" (group_size defaults to
    :data:`INT4_GROUP_SIZE`). Chapter 13."""
    if precision == "int8":
        if group_size is not None:
            raise ValueError(f"int8 is per output channel: group_size must be None, got "
                             f"{group_size}")
        return quantize_int8(w)
    if precision == "int4":
        return quantize_int4(w, INT4_GROUP_SIZE if group_size is None else group_size)
    raise ValueError(f"precision: expected 'int8' or 'int4', got {precision!r}")


def dequantize(q: Int8Weight | Int4Weight, dtype: torch.dtype = torch.float32) -> Tensor:
    """The (d_in, d_out) matrix an :class:`Int8Weight` or :class:`Int4Weight` stands for."""
    if isinstance(q, Int8Weight):
        return dequantize_int8(q, dtype)
    if isinstance(q, Int4Weight):
        return dequantize_int4(q, dtype)
    raise TypeError(f"q: expected an Int8Weight or an Int4Weight, got {type(q).__name__}")


FLOAT_FORMATS = {"bf16": torch.bfloat16, "fp16": torch.float16}


def round_weight(w: Tensor, precision: str, *, group_size: int | None = None) -> Tensor:
    """w rounded to ``precision`` and back to its own dtype and shape: ``dequantize(
    quantize(w))`` for "int8"/"int4", a cast through bf16/fp16 and back, w itself for "fp32".
    Chapter 13."""
    if precision == "fp32":
        return w
    if precision in FLOAT_FORMATS:
        return w.to(FLOAT_FORMATS[precision]).to(w.dtype)
    return dequantize(quantize(w, precision, group_size=group_size), w.dtype)


def matrix_names(model) -> list[str]:
    """The names of the model's block matrices, the weights :func:`fake_quantize` rounds:
    every 2-D parameter inside ``model.blocks`` (``w_qkv``, ``w_o``, ``w_up``, ``w_down`` for
    a GPT; ``w_q``, ``w_k``, ``w_v``, ``w_o``, ``w_gate``, ``w_up``, ``w_down`` for a Llama)."""
    return [f"blocks.{name}" for name, p in model.blocks.named_parameters() if p.dim() == 2]


def fake_quantize(model, precision: str, *, group_size: int | None = None):
    """A deep copy of a GPT or Llama whose block matrices are rounded to ``precision``
    ("fp32", "bf16", "fp16", "int8", "int4") and stored back in the model's dtype, so that the
    unchanged forward pass measures what the rounding costs (bits per byte, logits).

    Rounded: every matrix inside the blocks (:func:`matrix_names`), which hold most of a
    model's weights. Kept as they are: the embeddings, the output head, the norms and biases.
    The vectors are a few numbers per layer; the token embedding is read one row per token
    (no product reads it all), and in a GPT it is also the tied head, whose error reaches the
    logits with no layer after it: quantizers commonly keep it in higher precision. One rule
    for every precision keeps the comparison between precisions fair. group_size: for "int4"
    only (default :data:`INT4_GROUP_SIZE`). The model given is not changed. Chapter 13.
    """
    if precision not in ROUNDINGS:
        raise ValueError(f"precision: expected one of {ROUNDINGS}, got {precision!r}")
    if group_size is not None and precision != "int4":
        raise ValueError(f"group_size applies to int4 only, got group_size={group_size} "
                         f"for {precision}")
    if not hasattr(model, "blocks"):
        raise TypeError(f"expected an llmcore GPT or Llama (a model with blocks), got "
                        f"{type(model).__name__}")
    copied = copy.deepcopy(model)
    with torch.no_grad():
        for name in matrix_names(copied):
            p = copied.get_parameter(name)
            p.copy_(round_weight(p.detach(), precision, group_size=group_size))
    return copied
