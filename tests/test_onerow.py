"""llmcore's one-row C kernels (llmcore.onerow): w8a8's equals fbgemm's product bit for bit on
one row and its float64 model on several; int8's is the weight-only product to bfloat16's
rounding; bad operands are refused before any C code reads them; the kernels are compiled once
into a private folder, and where they cannot be (no compiler) the fast path keeps PyTorch's;
the fast path measures them as one more one-row form and gives the same tokens with them."""

from __future__ import annotations

import ctypes
import os
import stat
import time

import pytest
import torch

from llmcore import lowbit, onerow
from llmcore.fastpath import FastStep, fast_model
from llmcore.lowbit import int8_linear, w8a8_linear, w8a8_matmul
from llmcore.quantize import dequantize_int4, quantize_int4
from test_fastpath_precision import model_of, w8a8_reference
from test_model import token_ids

needs_kernels = pytest.mark.skipif(not onerow.available(),
                                   reason=f"one-row kernels: {onerow.unavailable_reason()}")

SHAPES = [(96, 80), (100, 37), (33, 5), (64, 4), (768, 2304)]
"""(d_in, d_out): d_in a multiple of 64 or not (the kernels' masked tail), d_out of 4 or not."""


def rows_of_all_sizes(n: int, d_in: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d_in, generator=g) * torch.logspace(-3, 3, n)[:, None]


@needs_kernels
@pytest.mark.parametrize("shape", SHAPES)
def test_one_row_of_w8a8_equals_fbgemms_product_bit_for_bit(shape):
    """The same codes (the row's and the weight's), exact integer sums and the same float32
    operations after them, with and without a bias."""
    d_in, d_out = shape
    g = torch.Generator().manual_seed(d_in + d_out)
    weight, bias = torch.randn(d_in, d_out, generator=g), torch.randn(d_out, generator=g)
    ours, fbgemms = onerow.w8a8_rows(weight), w8a8_linear(weight)
    for x in rows_of_all_sizes(6, d_in, seed=d_in).split(1):
        for b in (None, bias):
            assert torch.equal(onerow.w8a8_onerow(x, ours, b), w8a8_matmul(x, fbgemms, b))


@needs_kernels
def test_several_rows_of_w8a8_are_the_documented_arithmetic_row_by_row():
    """A prompt's rows (rounded in C, ``torch._int_mm`` on the codes, scaled in C) against the
    float64 model of w8a8, and each row equal to itself alone (the one-row C kernel), bit for
    bit; a row of zeros gives the bias."""
    g = torch.Generator().manual_seed(7)
    weight, bias = torch.randn(96, 80, generator=g), torch.randn(80, generator=g)
    x = rows_of_all_sizes(16, 96, seed=3)
    x[3] = 0
    w = onerow.w8a8_rows(weight)
    got = onerow.w8a8_onerow(x, w)
    alone = torch.cat([onerow.w8a8_onerow(row, w) for row in x.split(1)])
    want = w8a8_reference(x, weight)
    scale = want.abs().amax(dim=1, keepdim=True).clamp(min=1e-30)
    for product in (got, alone):
        assert float(((product.double() - want).abs() / scale).max()) < 1e-6
        assert torch.equal(product[3], torch.zeros(80))
    assert torch.equal(alone, got)                 # the same float32 operations
    torch.testing.assert_close(onerow.w8a8_onerow(x, w, bias), got + bias)
    torch.testing.assert_close(onerow.w8a8_onerow(x[3:4], w, bias), bias[None])
    assert w.weight_bytes == 96 * 80 + 4 * 80 + 4 * 80           # codes, row sums, scales


@needs_kernels
@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_a_row_with_an_inf_or_a_nan_gives_nan_never_a_finite_number(bad):
    """w8a8's rounding makes the row NaN; int4's sums carry the inf or NaN (never a finite
    number), and the other rows of a prompt keep theirs."""
    w = onerow.w8a8_rows(torch.randn(40, 12))
    x = torch.randn(3, 40)
    x[1, 5] = bad
    assert torch.isnan(onerow.w8a8_onerow(x[1:2], w)).all()
    several = onerow.w8a8_onerow(x, w)
    assert torch.isnan(several[1]).all() and torch.isfinite(several[[0, 2]]).all()
    w4 = onerow.int4_rows(torch.randn(64, 12))
    x = torch.randn(3, 64).bfloat16()
    x[1, 5] = bad
    several = onerow.int4_onerow(x, w4)
    assert not torch.isfinite(several[1]).any() and torch.isfinite(several[[0, 2]]).all()


@needs_kernels
@pytest.mark.parametrize("shape", SHAPES[:2] + SHAPES[-1:])
def test_one_row_of_int8_is_the_weight_only_product_to_bfloat16s_rounding(shape):
    """float32 sums of the bfloat16 row times the int8 codes, scaled and rounded once to
    bfloat16: within half a bfloat16 step of the float64 product (+ bias); the one-row form
    sends several rows to PyTorch's kernel on the same codes (d_in a multiple of 16: PyTorch's
    kernel needs it), and the C kernel refuses them."""
    d_in, d_out = shape
    d_in = d_in // 16 * 16
    g = torch.Generator().manual_seed(d_out)
    weight = torch.randn(d_in, d_out, generator=g)
    bias = torch.randn(d_out, generator=g).bfloat16()
    w = int8_linear(weight, torch.bfloat16)
    x = rows_of_all_sizes(4, d_in, seed=d_out).bfloat16()
    for row in x.split(1):
        got = onerow.int8_onerow(row, w, bias)
        want = row.double() @ (w.values.double().t() * w.scale.double()) + bias.double()
        assert got.dtype == torch.bfloat16
        assert bool(((got.double() - want).abs() <= 2 ** -8 * want.abs() + 1e-30).all())
    pytorchs = torch.ops.aten._weight_int8pack_mm(x, w.values, w.scale).add_(bias)
    assert torch.equal(lowbit.ONE_ROW_FORMATS["int8"].linear(x, w, bias), pytorchs)
    with pytest.raises(ValueError, match=r"x: this kernel takes one row \(1, \d+\), got 4"):
        onerow.int8_onerow(x, w, bias)


def int4_reference(x: torch.Tensor, w: onerow.Int4Rows) -> tuple[torch.Tensor, torch.Tensor]:
    """x (rows, d_in) @ the weights (code - 8) * scale + offset that w holds, in float64, and
    the same product of magnitudes (|x| @ |W|: the size of the terms a sum adds up)."""
    tiles, words, _ = w.codes.shape
    shifts = torch.arange(0, 32, 4, dtype=torch.int64)
    codes = (w.codes.to(torch.int64)[..., None] >> shifts) & 15           # (tiles, words, 16, 8)
    codes = codes.permute(1, 3, 0, 2).reshape(words * 8, tiles * 16)      # (d_in, padded d_out)
    def per_row(t):                                                       # (tiles, G, 16)
        return t.double().permute(1, 0, 2).reshape(-1, tiles * 16).repeat_interleave(
            w.group_size, dim=0)
    weight = ((codes.double() - 8) * per_row(w.scale) + per_row(w.offset))[:, :w.d_out]
    return x.double() @ weight, x.double().abs() @ weight.abs()


@needs_kernels
@pytest.mark.parametrize("shape, group_size", [((96, 80), 32), ((160, 37), 32), ((64, 4), 64),
                                               ((768, 2304), 32), ((768, 48), 128),
                                               ((40, 24), 8)])
def test_int4_is_the_weight_only_product_to_bfloat16s_rounding(shape, group_size):
    """The bfloat16 rows times the int4 weights (code - 8) * scale + offset, float32 sums,
    rounded once to bfloat16: within half a bfloat16 step (and float32's sums) of the float64
    product (+ bias), as close as PyTorch's int4 kernel on the same weights; the codes are
    quantize_int4's, the scale and offset int4_scale_offset's; a prompt of 9 rows (four at a
    time, then one by one) gives each row the numbers it gets alone."""
    d_in, d_out = shape
    g = torch.Generator().manual_seed(d_in + group_size)
    weight = torch.randn(d_in, d_out, generator=g)
    bias = torch.randn(d_out, generator=g).bfloat16()
    w = onerow.int4_rows(weight, torch.bfloat16, group_size)
    x = rows_of_all_sizes(9, d_in, seed=d_out).bfloat16()
    got = onerow.int4_onerow(x, w, bias)
    alone = torch.cat([onerow.int4_onerow(row, w, bias) for row in x.split(1)])
    assert got.dtype == torch.bfloat16 and got.shape == (9, d_out)
    assert torch.equal(alone, got)
    want, terms = int4_reference(x, w)
    want = want + bias.double()
    error = (got.double() - want).abs()
    assert bool((error <= 2 ** -8 * want.abs() + 2 ** -20 * terms).all())
    if d_out % lowbit.INT4_KERNEL_COLUMNS == 0 and group_size in (32, 64, 128, 256):
        pytorchs = lowbit._int4_linear(x, lowbit.int4_linear(weight, torch.bfloat16, group_size),
                                       bias)
        assert float(error.max()) <= float((pytorchs.double() - want).abs().max()) * 1.01


@needs_kernels
def test_int4s_weights_are_quantize_int4s_in_the_kernels_layout():
    """Int4Rows holds quantize_int4's codes, and its scale and offset give back
    (code - zero) * scale to bfloat16's rounding of scale and offset."""
    g = torch.Generator().manual_seed(2)
    weight = torch.randn(64, 37, generator=g)
    w = onerow.int4_rows(weight)
    assert w.codes.shape == (3, 8, 16) and w.codes.dtype == torch.uint32
    assert w.scale.shape == w.offset.shape == (3, 2, 16) and w.d_out == 37
    got = int4_reference(torch.eye(64), w)[0]                     # the weights themselves
    want = dequantize_int4(quantize_int4(weight)).double()
    scale = quantize_int4(weight).scale.repeat_interleave(32, dim=0).double()
    assert float(((got - want).abs() / scale).max()) < 16 * 2 ** -8     # bf16 scale, offset
    assert float((got - weight.double()).abs().max()) <= float(scale.max()) * 0.6
    assert lowbit.bytes_of(w) == 3 * 8 * 16 * 4 + 2 * 3 * 2 * 16 * 2


needs_bf16 = pytest.mark.skipif(not onerow.bf16_available(),
                                reason="one-row bf16 kernel: "
                                       f"{onerow.unavailable_reason() or 'no AVX512-BF16'}")


@needs_bf16
@pytest.mark.parametrize("shape", SHAPES)
def test_one_row_of_bf16_is_the_product_to_bfloat16s_rounding(shape):
    """float32 sums of bfloat16 products, rounded once to bfloat16: within a bfloat16 step of
    the float64 product (+ bias), as close as PyTorch's own bfloat16 product; the one-row form
    sends a few rows to the C kernel, each row's numbers its numbers alone, and more rows to
    ``F.linear`` on the same matrix."""
    d_in, d_out = shape
    g = torch.Generator().manual_seed(d_in)
    weight = torch.randn(d_in, d_out, generator=g)
    bias = torch.randn(d_out, generator=g).bfloat16()
    w = onerow.bf16_rows(weight)
    assert w.shape == (d_out, d_in) and w.dtype == torch.bfloat16
    x = rows_of_all_sizes(4, d_in, seed=d_out).bfloat16()
    for row in x.split(1):
        got = onerow.bf16_onerow(row, w, bias).double()
        want = row.double() @ w.double().t() + bias.double()
        pytorchs = torch.nn.functional.linear(row, w, bias).double()
        step = 2 ** -7 * want.abs().amax()
        assert float((got - want).abs().max()) <= step
        assert float((got - want).abs().max()) <= float((pytorchs - want).abs().max()) + step
    assert torch.equal(lowbit.ONE_ROW_FORMATS["bf16"].linear(x, w, bias),
                       onerow.bf16_onerow(x, w, bias))
    many = rows_of_all_sizes(onerow.bf16_rows_at_most() + 1, d_in, seed=1).bfloat16()
    assert torch.equal(lowbit.ONE_ROW_FORMATS["bf16"].linear(many, w, bias),
                       torch.nn.functional.linear(many, w, bias))
    with pytest.raises(ValueError, match=rf"x: bf16_onerow takes at most "
                                         rf"{onerow.bf16_rows_at_most()} rows here, got"):
        onerow.bf16_onerow(many, w, bias)


needs_amx = pytest.mark.skipif(not onerow.amx_available(),
                               reason=f"AMX's bfloat16 tiles do not run here: "
                                      f"{onerow.amx_unavailable_reason()}")


@needs_amx
@pytest.mark.parametrize("shape", SHAPES + [(3072, 768), (64, 16)])
@pytest.mark.parametrize("rows", [2, 15, 16, 17, 40, onerow.BF16_AMX_ROWS_AT_MOST])
def test_a_prompt_of_bf16_on_amx_is_the_product_to_bfloat16s_rounding(shape, rows):
    """AMX's tile products: every row within a bfloat16 step of the float64 product (+ bias)
    and as close as PyTorch's own bfloat16 product, with or without a bias, any d_in (the
    tiles' 32 values padded) and d_out (16 outputs a tile), up to 96 rows (six tiles of sums);
    1 and 2 threads give the same numbers."""
    d_in, d_out = shape
    g = torch.Generator().manual_seed(d_in + rows)
    w = onerow.bf16_rows(torch.randn(d_in, d_out, generator=g))
    bias = torch.randn(d_out, generator=g).bfloat16()
    x = rows_of_all_sizes(rows, d_in, seed=rows).bfloat16()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = onerow.bf16_onerow(x, w, bias, amx=True)
        torch.set_num_threads(2)
        got = onerow.bf16_onerow(x, w, bias, amx=True)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, got)
    for b in (bias, None):
        got = onerow.bf16_onerow(x, w, b, amx=True).double()
        want = x.double() @ w.double().t() + (0 if b is None else b.double())
        pytorchs = torch.nn.functional.linear(x, w, b).double()
        step = 2 ** -7 * want.abs().amax(dim=1, keepdim=True)
        assert bool(((got - want).abs() <= step).all())
        assert bool(((got - want).abs().amax(dim=1) <= (pytorchs - want).abs().amax(dim=1)
                     + step[:, 0]).all())


@pytest.mark.skipif(not onerow.available(),
                    reason=f"one-row kernels: {onerow.unavailable_reason()}")
def test_the_amx_row_limit_is_the_kernels_own():
    """BF16_AMX_ROWS_AT_MOST, which the Python side checks, is the library's llmcore_amx_rows,
    which amx.c and step.c's prompt use: six tiles of sums of 16 rows each."""
    library_rows = ctypes.c_long.in_dll(onerow._library(), "llmcore_amx_rows").value
    assert onerow.BF16_AMX_ROWS_AT_MOST == library_rows == 96


@needs_amx
@pytest.mark.parametrize("rows", [1, 16, 17, 33, 64])
def test_amx_gives_each_block_of_16_outputs_its_numbers_alone(rows):
    """Each thread reads several blocks of 16 outputs at once (six for a prompt of up to 16
    rows, three for 17 to 32, ...): every block's outputs equal, bit for bit, those of its 16
    outputs' weights multiplied alone, with 1 or 2 threads, the last, partial block too."""
    d_in, d_out = 96, 16 * 23 + 5
    g = torch.Generator().manual_seed(rows)
    w = onerow.bf16_rows(torch.randn(d_in, d_out, generator=g))
    bias = torch.randn(d_out, generator=g).bfloat16()
    x = rows_of_all_sizes(rows, d_in, seed=rows).bfloat16()
    alone = torch.cat([onerow.bf16_onerow(x, w[n:n + 16].contiguous(), bias[n:n + 16],
                                          amx=True) for n in range(0, d_out, 16)], dim=1)
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            assert torch.equal(onerow.bf16_onerow(x, w, bias, amx=True), alone)
    finally:
        torch.set_num_threads(threads)


@needs_bf16
@pytest.mark.parametrize("rows", [2, 3, 4, 5, 7, onerow.BF16_ROWS_AT_MOST])
def test_a_few_rows_of_bf16_give_each_row_its_numbers_alone(rows):
    """The kernel for a few rows without AMX does AVX512-BF16's dot product as two float32
    multiply-adds (odd halves, then even): every row's outputs equal, bit for bit, those of
    the one-row kernel (vdpbf16ps) on that row alone, whatever the rows beside it, with 1 or
    2 threads."""
    d_in, d_out = 100, 37                               # a masked tail, d_out not of 4
    g = torch.Generator().manual_seed(rows)
    w = onerow.bf16_rows(torch.randn(d_in, d_out, generator=g))
    bias = torch.randn(d_out, generator=g).bfloat16()
    x = rows_of_all_sizes(rows, d_in, seed=rows).bfloat16()
    alone = torch.cat([onerow.bf16_onerow(row, w, bias) for row in x.split(1)])
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            assert torch.equal(onerow.bf16_onerow(x, w, bias, amx=False), alone)
            assert torch.equal(onerow.bf16_onerow(x, w, amx=False), torch.cat(
                [onerow.bf16_onerow(row, w) for row in x.split(1)]))
    finally:
        torch.set_num_threads(threads)
    assert onerow.bf16_onerow(x[:0], w).shape == (0, d_out)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("v", [1, 15, 16, 17, 50257])
def test_argmax_in_c_is_torchs_argmax_ties_nans_and_infinities_included(dtype, v):
    """Each row's first largest value, a NaN counting as the largest (the first NaN): rows of
    random numbers, a tie, a NaN, all -inf, all zeros (-0.0 first), +inf last."""
    g = torch.Generator().manual_seed(v)
    x = torch.randn(8, v, generator=g).to(dtype)
    x[1, v // 2] = float("nan")
    x[2] = float("-inf")
    x[3] = 0.0
    x[3, 0] = -0.0
    x[4, v - 1] = float("inf")
    if v > 3:
        x[5, 1] = x[5, v - 2] = 1000.0                   # a tie: the first one
        x[6, 2] = x[6, v - 1] = float("nan")             # two NaNs: the first one
    assert torch.equal(onerow.argmax_rows(x), x.argmax(dim=-1))
    assert torch.equal(onerow.argmax_rows(x[:, :v].t().contiguous().t()), x.argmax(dim=-1))
    assert onerow.argmax_rows(x[:0]).shape == (0,)


@needs_kernels
def test_the_fast_paths_greedy_pick_is_the_c_argmax_and_the_teaching_paths_torchs():
    from llmcore.sampling import greedy_in_c, token_picker
    native = token_picker(temperature=0.0, top_k=None, seed=None, b=2, device="cpu",
                          native=True)
    plain = token_picker(temperature=0.0, top_k=None, seed=None, b=2, device="cpu")
    assert native is greedy_in_c and plain is not greedy_in_c
    meta = token_picker(temperature=0.0, top_k=None, seed=None, b=2, device="meta",
                        native=True)
    assert meta is not greedy_in_c                       # torch.argmax off the CPU
    logits = torch.randn(2, 300)
    assert torch.equal(native(logits), plain(logits))
    assert torch.equal(greedy_in_c(logits.double()), logits.double().argmax(dim=-1))
    with pytest.raises(ValueError, match=r"logits: expected a \(b, v\) float32 or bfloat16 "
                                         r"matrix with v > 0 on the CPU, got torch.float64"):
        onerow.argmax_rows(logits.double())
    with pytest.raises(ValueError, match=r"got torch.float32 \(300,\) on cpu"):
        onerow.argmax_rows(logits[0])


@needs_kernels
def test_bad_operands_are_refused_before_any_c_code_reads_them():
    w8, w = onerow.w8a8_rows(torch.randn(8, 16)), int8_linear(torch.randn(16, 8), torch.bfloat16)
    with pytest.raises(ValueError, match=r"x: expected a contiguous torch.float32 matrix "
                                         r"\(rows, 8\) on the CPU, got torch.bfloat16 \(1, 8\)"):
        onerow.w8a8_onerow(torch.ones(1, 8, dtype=torch.bfloat16), w8)
    with pytest.raises(ValueError, match=r"\(rows, 8\) on the CPU, got torch.float32 \(1, 9\)"):
        onerow.w8a8_onerow(torch.ones(1, 9), w8)
    with pytest.raises(ValueError, match=r"on the CPU, got torch.float32 \(1, 8\) on meta"):
        onerow.w8a8_onerow(torch.ones(1, 8, device="meta"), w8)
    with pytest.raises(ValueError, match=r"b: expected a bias of shape \(16,\) torch.float32"):
        onerow.w8a8_onerow(torch.ones(1, 8), w8, torch.ones(8))
    with pytest.raises(ValueError, match=r"\(rows, 16\) on the CPU, got torch.float32"):
        onerow.int8_onerow(torch.ones(1, 16), w)
    with pytest.raises(ValueError, match=r"b: expected a bias of shape \(8,\) torch.bfloat16"):
        onerow.int8_onerow(torch.ones(1, 16, dtype=torch.bfloat16), w, torch.ones(8))
    columns = torch.randn(8, 3).t()                  # a row that is not contiguous: copied
    assert torch.equal(onerow.w8a8_onerow(columns[:1], w8),
                       onerow.w8a8_onerow(columns[:1].contiguous(), w8))
    with pytest.raises(ValueError, match="float32 activations, got torch.bfloat16"):
        onerow.w8a8_rows(torch.randn(8, 16), torch.bfloat16)
    with pytest.raises(ValueError, match="bfloat16 activations, got torch.float32"):
        onerow.bf16_rows(torch.randn(8, 16), torch.float32)
    with pytest.raises(ValueError, match=r"\(rows, 8\) on the CPU, got torch.float32 \(1, 8\)"):
        onerow.bf16_onerow(torch.ones(1, 8), onerow.bf16_rows(torch.randn(8, 16)))
    w4 = onerow.int4_rows(torch.randn(64, 20))
    with pytest.raises(ValueError, match=r"\(rows, 64\) on the CPU, got torch.float32 \(1, 64\)"):
        onerow.int4_onerow(torch.ones(1, 64), w4)
    with pytest.raises(ValueError, match=r"b: expected a bias of shape \(20,\) torch.bfloat16"):
        onerow.int4_onerow(torch.ones(1, 64, dtype=torch.bfloat16), w4, torch.ones(20))
    with pytest.raises(ValueError, match=r"w: expected an Int4Rows of int4_rows .* got codes "
                                         r"torch.uint32 \(2, 8, 16\), scale torch.float32"):
        onerow.int4_onerow(torch.ones(1, 64, dtype=torch.bfloat16),
                           w4._replace(scale=w4.scale.float()))
    with pytest.raises(ValueError, match=r"d_out 33"):                  # past the last tile
        onerow.int4_onerow(torch.ones(1, 64, dtype=torch.bfloat16), w4._replace(d_out=33))
    with pytest.raises(ValueError, match="group_size must be a multiple of 8, got 12"):
        onerow.int4_rows(torch.randn(48, 16), torch.bfloat16, 12)
    with pytest.raises(ValueError, match="bfloat16 activations, got torch.float32"):
        onerow.int4_rows(torch.randn(64, 16), torch.float32)


@needs_kernels
def test_the_thread_count_does_not_change_a_number():
    """Each output is one thread's sum in a fixed order, so 1 and 2 threads agree exactly."""
    w8 = onerow.w8a8_rows(torch.randn(256, 300))
    w = int8_linear(torch.randn(256, 300), torch.bfloat16)
    w4 = onerow.int4_rows(torch.randn(256, 300))
    x = torch.randn(1, 256)
    prompt = torch.randn(6, 256).bfloat16()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = (onerow.w8a8_onerow(x, w8), onerow.int8_onerow(x.bfloat16(), w),
               onerow.int4_onerow(prompt, w4))
        torch.set_num_threads(2)
        two = (onerow.w8a8_onerow(x, w8), onerow.int8_onerow(x.bfloat16(), w),
               onerow.int4_onerow(prompt, w4))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(one, two))


def test_without_a_compiler_the_kernels_say_why_and_the_fast_path_keeps_pytorchs(
        monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    onerow._load.cache_clear()
    try:
        assert not onerow.available()
        assert "no-such-cc" in onerow.unavailable_reason()
        with pytest.raises(RuntimeError, match="one-row kernels are not available"):
            onerow.w8a8_onerow(torch.ones(1, 8), onerow.w8a8_rows(torch.randn(8, 4)))
        fast = fast_model(model_of("gpt"), precision="w8a8")
        names = [fast.form_name(*form) for form in fast.one_row_forms(fast.format)]
        assert names == ["PyTorch's int8 x int8 CPU kernel (fbgemm)"]
    finally:
        onerow._load.cache_clear()
    assert not onerow.available("meta") and "not on meta" in onerow.unavailable_reason("meta")


@needs_kernels
def test_the_library_is_compiled_once_into_a_folder_only_its_user_may_write(tmp_path):
    folder = tmp_path / "llmcore"
    folder.mkdir(mode=0o777)
    os.chmod(folder, 0o777)
    cc = onerow.compiler()
    first = onerow.build(cc, folder)
    made = first.stat().st_mtime_ns
    time.sleep(0.01)
    assert onerow.build(cc, folder) == first and first.stat().st_mtime_ns == made
    assert stat.S_IMODE(folder.stat().st_mode) & 0o022 == 0
    assert [p.name for p in folder.iterdir()] == [first.name]      # no scratch left behind


@needs_kernels
@pytest.mark.parametrize("precision", ["w8a8", "int8", "bf16", "int4"])
def test_the_fast_path_measures_the_c_kernel_and_keeps_its_numbers(precision, monkeypatch):
    """One row of a model that streams from memory (the threshold set to 0) measures the C
    kernel beside PyTorch's (each step in PyTorch, STEP_IN_C off: the products' choice
    alone); made the only fast one (every other form slowed), it is kept,
    and its logits over a prompt and three tokens are PyTorch's kernel's: w8a8's to
    float32's last bits (the prompt's several rows take torch._int_mm, the steps' one row
    the C kernel), int8's, bf16's and int4's to bfloat16's rounding (int4's head, in int8,
    takes int8's C kernel with its own)."""
    import llmcore.fastpath as fastpath
    if not lowbit.ONE_ROW_FORMATS[precision].available(torch.device("cpu")):
        pytest.skip(f"no one-row C kernel for {precision} on this CPU")
    monkeypatch.setattr(fastpath, "PACK_ONE_ROW_ABOVE_BYTES", 0)
    monkeypatch.setattr(fastpath, "STEP_IN_C", False)   # the products' choice alone
    model = model_of("gpt", seed=4)
    prompt, follow = token_ids(model.config, 1, 6), token_ids(model.config, 1, 3, seed=5)
    def slowed(product):
        def delayed(x, w, b):
            time.sleep(0.002)
            return product(x, w, b)
        return delayed

    kept = {}
    for keep_c_kernel in (True, False):
        with monkeypatch.context() as patched:
            c_form, own = lowbit.ONE_ROW_FORMATS[precision], lowbit.FORMATS[precision]
            if keep_c_kernel:              # every other form slowed: own, dense, packed
                if own.linear is not None:
                    patched.setitem(lowbit.FORMATS, precision,
                                    own._replace(linear=slowed(own.linear)))
                for name in ("plain_linear", "packed_linear"):
                    patched.setattr(fastpath, name, slowed(getattr(fastpath, name)))
            else:                          # the C kernel slowed (and the dense forms)
                patched.setitem(lowbit.ONE_ROW_FORMATS, precision,
                                c_form._replace(linear=slowed(c_form.linear)))
                if own.linear is not None:
                    for name in ("plain_linear", "packed_linear"):
                        patched.setattr(fastpath, name, slowed(getattr(fastpath, name)))
            fast = fast_model(model, precision=precision)
        assert any("llmcore's one-row" in name for name in fast.one_row_seconds)
        if precision == "int4" and keep_c_kernel:  # its head: int8's C kernel with its own
            assert fast.head_format.linear is lowbit.ONE_ROW_FORMATS["int8"].linear
        step = FastStep(fast, model, prompt, 4, None)
        logits = [step(prompt)] + [step(follow[:, t:t + 1]) for t in range(3)]
        kept[keep_c_kernel] = fast.kernel, torch.stack(logits)
    c_kernel, pytorchs = kept[True], kept[False]
    assert c_kernel[0].startswith("llmcore's one-row")
    assert not pytorchs[0].startswith("llmcore")
    if lowbit.FORMATS[precision].linear is not None:     # PyTorch's kernel of the precision
        assert pytorchs[0].startswith(lowbit.FORMATS[precision].kernel)
    scale = float(pytorchs[1].abs().max())
    error = float((c_kernel[1] - pytorchs[1]).abs().max()) / scale
    assert error < (1e-5 if precision == "w8a8" else 0.03), error
    assert torch.equal(c_kernel[1].argmax(-1), pytorchs[1].argmax(-1))


@needs_kernels
def test_a_batch_in_w8a8_rounds_its_rows_in_c_and_keeps_fbgemms_numbers(monkeypatch):
    """From 2 rows on, w8a8 on the CPU is lowbit.MANY_ROW_FORMATS' form (rows rounded in C,
    torch._int_mm, rows scaled in C), and its logits are fbgemm's to float32's last bits."""
    model = model_of("gpt", seed=6)
    prompt, follow = token_ids(model.config, 3, 5), token_ids(model.config, 3, 3, seed=2)

    def logits(fast):
        step = FastStep(fast, model, prompt, 3, None)
        return torch.stack([step(prompt)] + [step(follow[:, t:t + 1]) for t in range(2)])

    ours = fast_model(model, batch_size=3, precision="w8a8")
    assert ours.kernel.startswith("llmcore's rounding of each row (C)")
    monkeypatch.delitem(lowbit.MANY_ROW_FORMATS, "w8a8")
    fbgemms = fast_model(model, batch_size=3, precision="w8a8")
    assert "fbgemm" in fbgemms.kernel
    got, want = logits(ours), logits(fbgemms)
    assert float((got - want).abs().max() / want.abs().max()) < 1e-5
