"""llmcore.quantize: int8 per output channel and int4 in groups, against float64 references of
the dequantized product, activations in int8 per row and the int8 x int8 product, loops
against matrices, the packing round trip, the rounding bound (|w - dequantized| <= scale / 2),
PyTorch's own kernels, and the meta device."""

from __future__ import annotations

import pytest
import torch

from conftest import TINY
from llmcore.llama import Llama, LlamaConfig
from llmcore.model import GPT
from llmcore.quantize import (Int4Weight, Int8Weight, dequantize_int4, dequantize_int8,
                              fake_quantize, int8_product, matrix_names, pack_int4,
                              quantize_int4, quantize_int8, quantize_rows, quantized_matmul,
                              unpack_int4)


def weights(d_in: int, d_out: int, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    """Uneven columns (scales 1e-3 .. 1) with an outlier each, the way trained weights look."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(d_in, d_out, generator=g, dtype=torch.float64)
    w *= torch.logspace(-3, 0, d_out, dtype=torch.float64)
    w[torch.randint(d_in, (d_out,), generator=g), torch.arange(d_out)] *= 6
    return w.to(dtype)


def activations(*shape: int, seed: int = 1, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


# -- int8 ----------------------------------------------------------------------------------

def test_int8_codes_scales_and_the_rounding_bound():
    w = weights(40, 24)
    q = quantize_int8(w)
    assert q.values.dtype == torch.int8 and q.values.shape == (40, 24)
    assert q.scale.dtype == torch.float32 and q.scale.shape == (24,)
    assert int(q.values.abs().max()) == 127                     # each column's max is +-127
    assert (q.values.abs().amax(dim=0) == 127).all()
    torch.testing.assert_close(q.scale.double(), w.double().abs().amax(dim=0) / 127)
    error = (w.double() - dequantize_int8(q, torch.float64)).abs()
    assert (error <= q.scale.double() / 2 * (1 + 1e-6)).all()


def test_int8_loop_form_equals_the_matrix_form():
    w = weights(12, 7, seed=3)
    q = quantize_int8(w)
    want = torch.empty(12, 7, dtype=torch.float64)
    for j in range(7):                                          # column by column
        s = max(abs(float(w[i, j])) for i in range(12)) / 127
        for i in range(12):
            want[i, j] = max(-127, min(127, round(float(w[i, j]) / s))) * s
    torch.testing.assert_close(dequantize_int8(q, torch.float64), want, rtol=1e-6, atol=0)


def test_a_zero_column_gets_scale_one_and_zero_codes():
    w = weights(8, 5)
    w[:, 2] = 0
    q = quantize_int8(w)
    assert float(q.scale[2]) == 1.0 and not q.values[:, 2].any()
    assert torch.isfinite(dequantize_int8(q)).all()


def test_negating_the_weights_negates_the_codes():
    w = weights(16, 9)
    assert torch.equal(quantize_int8(-w).values, -quantize_int8(w).values)


@pytest.mark.parametrize("lead", [(5,), (2, 3)])
def test_int8_product_equals_the_float64_product_of_the_dequantized_matrix(lead):
    w, x = weights(48, 20), activations(*lead, 48)
    q = quantize_int8(w)
    want = x.double() @ dequantize_int8(q, torch.float64)
    got = quantized_matmul(x, q)
    assert got.shape == (*lead, 20) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(quantized_matmul(x.double(), q), want)


def test_int8_product_equals_pytorchs_weight_only_int8_kernel():
    kernel = getattr(torch.ops.aten, "_weight_int8pack_mm", None)
    if kernel is None:
        pytest.skip("this torch has no aten._weight_int8pack_mm")
    w, x = weights(64, 32), activations(6, 64)
    q = quantize_int8(w)
    theirs = kernel(x, q.values.t().contiguous(), q.scale)       # weight as (d_out, d_in)
    torch.testing.assert_close(quantized_matmul(x, q), theirs, rtol=1e-5, atol=1e-5)


# -- int4 ----------------------------------------------------------------------------------

def test_packing_two_codes_per_byte_round_trips_and_puts_even_rows_low():
    codes = torch.randint(0, 16, (10, 7), generator=torch.Generator().manual_seed(0))
    packed = pack_int4(codes)
    assert packed.dtype == torch.uint8 and packed.shape == (5, 7)
    assert torch.equal(unpack_int4(packed).long(), codes)
    assert int(packed[0, 0]) == int(codes[0, 0]) + 16 * int(codes[1, 0])
    assert torch.equal(pack_int4(unpack_int4(packed)), packed)


@pytest.mark.parametrize("group_size", [8, 32])
@pytest.mark.parametrize("zero_point", [True, False])
def test_int4_codes_and_the_rounding_bound(group_size, zero_point):
    w = weights(64, 12)
    q = quantize_int4(w, group_size, zero_point=zero_point)
    assert q.packed.shape == (32, 12) and q.group_size == group_size
    assert q.scale.shape == q.zero.shape == (64 // group_size, 12)
    codes = unpack_int4(q.packed)
    assert int(codes.max()) <= 15
    if not zero_point:
        assert (q.zero == 8).all() and int(codes.min()) >= 1       # -7..7 around code 8
    error = (w.double() - dequantize_int4(q, torch.float64)).abs()
    bound = q.scale.double().repeat_interleave(group_size, dim=0) / 2
    assert (error <= bound * (1 + 1e-5) + 1e-7).all()


def test_int4_loop_form_equals_the_matrix_form():
    w, g = weights(16, 5, seed=2), 4
    q = quantize_int4(w, g)
    want = torch.empty(16, 5, dtype=torch.float64)
    for start in range(0, 16, g):
        for j in range(5):
            column = [float(w[i, j]) for i in range(start, start + g)]
            lo, hi = min(column), max(column)
            s = (hi - lo) / 15
            for i, value in enumerate(column):
                code = max(0, min(15, round((value - lo) / s)))
                want[start + i, j] = code * s + lo                 # (code - zero) s, zero = -lo/s
    torch.testing.assert_close(dequantize_int4(q, torch.float64), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("zero_point", [True, False])
def test_int4_product_group_by_group_equals_the_float64_product(zero_point):
    w, x = weights(96, 40), activations(3, 4, 96)
    q = quantize_int4(w, 32, zero_point=zero_point)
    want = x.double() @ dequantize_int4(q, torch.float64)
    torch.testing.assert_close(quantized_matmul(x.double(), q), want)
    torch.testing.assert_close(quantized_matmul(x, q).double(), want, rtol=1e-4, atol=1e-4)


def test_int4_product_equals_pytorchs_cpu_int4_kernel():
    convert = getattr(torch.ops.aten, "_convert_weight_to_int4pack_for_cpu", None)
    kernel = getattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu", None)
    if convert is None or kernel is None:
        pytest.skip("this torch has no CPU int4 weight-only kernel")
    w, x = weights(128, 48), activations(5, 128)
    q = quantize_int4(w, 32)
    # PyTorch's layout: codes (d_out, d_in) int32, and per group (scale, (8 - zero) scale),
    # since it computes (code - 8) * scale + its zero.
    packed = convert(unpack_int4(q.packed).t().contiguous().int(), 1)
    scale_and_zero = torch.stack([q.scale, (8 - q.zero) * q.scale], dim=-1)
    theirs = kernel(x, packed, 32, scale_and_zero)
    torch.testing.assert_close(quantized_matmul(x, q), theirs, rtol=1e-4, atol=1e-4)


def test_the_int4_product_never_holds_the_whole_matrix_in_float(monkeypatch):
    w, x = weights(64, 16), activations(2, 64)
    q = quantize_int4(w, 16)
    largest = []
    real = torch.Tensor.to

    def watching(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        if out.is_floating_point():
            largest.append(out.numel())
        return out

    monkeypatch.setattr(torch.Tensor, "to", watching)
    quantized_matmul(x, q)
    monkeypatch.undo()
    assert max(largest) <= 16 * 16                               # one group of codes at most


# -- bad input -----------------------------------------------------------------------------

def test_bad_inputs_are_refused_with_what_was_expected():
    w = weights(8, 4)
    with pytest.raises(ValueError, match="matrix"):
        quantize_int8(w[0])
    with pytest.raises(TypeError, match="floating"):
        quantize_int8(torch.ones(4, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="even"):
        quantize_int4(weights(7, 4), 7)
    with pytest.raises(ValueError, match="not divisible by group_size"):
        quantize_int4(weights(24, 4), 16)
    with pytest.raises(ValueError, match=r"\[0, 15\]"):
        pack_int4(torch.tensor([[16], [0]]))
    with pytest.raises(ValueError, match="d_in = 8"):
        quantized_matmul(activations(2, 9), quantize_int8(w))
    with pytest.raises(TypeError, match="floating"):
        quantized_matmul(torch.ones(2, 8, dtype=torch.int64), quantize_int8(w))
    with pytest.raises(TypeError, match="Int8Weight or an Int4Weight"):
        quantized_matmul(activations(2, 8), w)
    bad = Int8Weight(torch.zeros(8, 4, dtype=torch.int8), torch.ones(8))
    with pytest.raises(ValueError, match="one per output channel"):
        dequantize_int8(bad)
    bad4 = Int4Weight(torch.zeros(4, 3, dtype=torch.uint8), torch.ones(2, 3), torch.ones(1, 3), 4)
    with pytest.raises(ValueError, match="Int4Weight.zero"):
        dequantize_int4(bad4)
    with pytest.raises(ValueError, match="precision"):
        fake_quantize(GPT(TINY), "int3")
    with pytest.raises(ValueError, match="int4 only"):
        fake_quantize(GPT(TINY), "int8", group_size=8)


# -- meta device ---------------------------------------------------------------------------

def test_quantizing_and_the_products_run_on_the_meta_device():
    w = torch.empty(64, 24, device="meta")
    x = torch.empty(3, 64, device="meta")
    q8 = quantize_int8(w)
    assert q8.values.device.type == "meta" and q8.values.dtype == torch.int8
    assert quantized_matmul(x, q8).shape == (3, 24)
    assert dequantize_int8(q8).shape == (64, 24)
    q4 = quantize_int4(w, 16)
    assert q4.packed.shape == (32, 24) and q4.packed.device.type == "meta"
    out = quantized_matmul(x, q4)
    assert out.shape == (3, 24) and out.device.type == "meta"
    assert dequantize_int4(q4).shape == (64, 24)


# -- whole models --------------------------------------------------------------------------

@pytest.mark.parametrize("precision", ["bf16", "fp16", "int8", "int4"])
def test_fake_quantize_rounds_the_block_matrices_only_and_leaves_the_model(precision):
    model = GPT(TINY, seed=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    group = 8 if precision == "int4" else None
    copy = fake_quantize(model, precision, group_size=group)
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name])                     # the model is untouched
    rounded = set(matrix_names(model))
    assert rounded == {f"blocks.{i}.{m}" for i in range(TINY.n_layers)
                       for m in ("attention.w_qkv", "attention.w_o", "ffn.w_up", "ffn.w_down")}
    for name, value in copy.state_dict().items():
        if name in rounded:
            assert not torch.equal(value, before[name])
            assert value.dtype == before[name].dtype
        else:
            assert torch.equal(value, before[name]), name


def test_fake_quantize_int8_gives_logits_near_the_model_on_a_llama():
    config = LlamaConfig(vocab_size=61, max_seq_len=16, d_model=32, n_heads=4, n_layers=2)
    model = Llama(config, seed=2).eval()
    rounded = fake_quantize(model, "int8")
    assert set(matrix_names(model)) == {f"blocks.{i}.{m}" for i in range(2) for m in (
        "attention.w_q", "attention.w_k", "attention.w_v", "attention.w_o",
        "ffn.w_gate", "ffn.w_up", "ffn.w_down")}
    tokens = torch.randint(61, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = model(tokens), rounded(tokens)
    assert not torch.equal(got, want)
    torch.testing.assert_close(got, want, rtol=0, atol=0.02 * float(want.abs().max()))


def test_quantize_rows_rounds_each_row_on_its_own_within_half_a_step():
    g = torch.Generator().manual_seed(11)
    x = torch.randn(6, 40, generator=g) * torch.logspace(-3, 3, 6)[:, None]
    x[2] = 0
    q = quantize_rows(x)
    assert q.values.dtype == torch.int8 and q.scale.shape == (6, 1)
    assert int(q.values.abs().max()) == 127 and float(q.scale[2]) == 1.0
    assert bool(((x - q.values * q.scale).abs() <= q.scale / 2 + 1e-12 * q.scale).all())
    for i in range(6):                               # a row's codes never see its neighbours
        alone = quantize_rows(x[i:i + 1])
        assert torch.equal(alone.values[0], q.values[i]) and torch.equal(alone.scale[0], q.scale[i])
    with pytest.raises(ValueError, match=r"expected a floating matrix \(rows, d\)"):
        quantize_rows(torch.ones(2, 3, 4))


def test_int8_product_is_the_loop_over_integer_codes_with_both_scales_outside():
    g = torch.Generator().manual_seed(12)
    x, w = torch.randn(3, 5, generator=g), torch.randn(5, 4, generator=g)
    xq, wq = quantize_rows(x), quantize_int8(w)
    got = int8_product(xq, wq)
    for i in range(3):
        for j in range(4):
            integers = sum(int(xq.values[i, k]) * int(wq.values[k, j]) for k in range(5))
            want = integers * float(xq.scale[i, 0]) * float(wq.scale[j])
            assert got[i, j].item() == pytest.approx(want, rel=1e-6)
    exact = x.double() @ w.double()
    assert float((got.double() - exact).abs().max()) < 0.05 * float(exact.abs().max())
    with pytest.raises(ValueError, match="x has 5 columns but the weight has 4 rows"):
        int8_product(xq, quantize_int8(torch.randn(4, 4)))
    with pytest.raises(TypeError, match="expected an Int8Rows"):
        int8_product(x, wq)
