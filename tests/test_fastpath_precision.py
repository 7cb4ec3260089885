"""The fast path in fewer bits (``precision=`` "bf16", "int8", "w8a8", "int4"): logits near the
float32 path's within stated tolerances (and equal to the teaching forward of the same rounded
weights); greedy tokens agreeing with float32 over 32 tokens on the shipped model and on a
GPT-2-shaped random model for at least a stated share of prompts (the share is printed);
batched decoding equal to each sequence alone, and paged decoding equal to contiguous, in each
precision; w8a8's product against a float64 model of its kernel, row by row; the fast object
owns its state; bad precisions are refused."""

from __future__ import annotations

import time

import pytest
import torch

from llmcore import generate
from llmcore.fastpath import FastModels, FastStep, fast_model
from llmcore.llama import Llama, LlamaConfig
from llmcore.model import GPT, GPTConfig
from llmcore.pretrained import load_pretrained
from llmcore.quantize import fake_quantize, round_weight
from test_model import randomize, token_ids
from test_paged import Twin

PRECISIONS = ["bf16", "int8", "w8a8", "int4"]
ON_META = ["bf16", "int8", "int4"]
"""w8a8's kernel is fbgemm's, CPU only: on meta it is refused (tested below)."""

SMALL_GPT = GPTConfig(vocab_size=64, max_seq_len=48, d_model=64, n_heads=4, n_layers=2)
SMALL_LLAMA = LlamaConfig(vocab_size=64, max_seq_len=48, d_model=64, n_heads=4, n_kv_heads=2,
                          n_layers=2, d_ff=96)
"""d_out of every matrix a multiple of 16 and d_in of 32: PyTorch's CPU int4 kernel needs both."""

GPT2_SHAPED = GPTConfig(vocab_size=50257, max_seq_len=64, d_model=128, n_heads=4, n_layers=2)
"""GPT-2's vocabulary and initialisation, fewer and narrower layers (fast enough for a test)."""

LOGITS_TOLERANCE = {"bf16": 0.03, "int8": 0.08, "w8a8": 0.15, "int4": 0.6}
"""Largest |logit - float32 logit| allowed, as a share of the largest |float32 logit|, on models
with O(1) random weights (std 0.1): about 2.5x what we measured (0.013, 0.035, 0.046-0.056,
0.27-0.41).
bfloat16 keeps 8 significant bits (a relative rounding of 2^-9 per weight and activation);
int8 keeps 127 levels per column; int4 keeps 16 levels per group of 32, so on weights as
spread as these its error is large: the int4 bound is a sanity check, the exact check of int4
is the teaching forward of the same rounded weights (test below)."""

AGREEMENT_FLOOR = {
    "shipped": {"bf16": 0.8, "int8": 0.8, "w8a8": 0.7, "int4": 0.5},
    "gpt2-shaped": {"bf16": 0.75, "int8": 0.75, "w8a8": 0.625, "int4": 0.25},
}
"""Least share of prompts whose 32 greedy tokens equal float32's. Measured (the tests print
it): shipped model 10, 10, 9 and 7 of 10 prompts for bf16, int8, w8a8, int4; GPT-2-shaped
random model 8, 8, 7 and 3 of 8. w8a8 rounds the activations too (7-bit codes per row)."""


def model_of(kind: str, seed: int = 1):
    """A small model with O(1) random weights: "gpt" or "llama"."""
    model = GPT(SMALL_GPT) if kind == "gpt" else Llama(SMALL_LLAMA)
    return randomize(model, seed=seed, std=0.1).eval()


def forced_logits(model, prompt, follow, precision) -> torch.Tensor:
    """The fast path's logits after the prompt (b, n) and after each token of ``follow`` (b, t)
    fed in turn (teacher forcing: every precision sees the same tokens) -> (b, t, v)."""
    fast = fast_model(model, batch_size=prompt.shape[0], precision=precision)
    step = FastStep(fast, model, prompt, follow.shape[1], None)
    out = [step(prompt)]
    out += [step(follow[:, t:t + 1]) for t in range(follow.shape[1] - 1)]
    return torch.stack(out, dim=1)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """Largest |got - want| as a share of the largest |want|."""
    return float((got - want).abs().max() / want.abs().max())


def assert_near_float32(model, prompt, follow, precision, label: str) -> None:
    """The fast path's forced logits in ``precision`` within its stated tolerance of float32's
    (printed)."""
    want = forced_logits(model, prompt, follow, None)
    got = forced_logits(model, prompt, follow, precision)
    assert got.dtype == torch.float32 and got.shape == want.shape
    error = relative_error(got, want)
    print(f"{label} {precision}: largest logit error {error:.4f} of the largest logit")
    assert 0 < error <= LOGITS_TOLERANCE[precision]


def assert_rounding_is_all_that_changes(model, prompt, follow, precision) -> None:
    """The fast path's int8/int4 is llmcore.quantize's: the teaching forward of the model with
    its block matrices rounded by fake_quantize and its head by int8, in float32, gives the same
    logits up to bfloat16 activations."""
    rounded = fake_quantize(model, precision, group_size=32 if precision == "int4" else None)
    with torch.no_grad():
        rounded.lm_head.copy_(round_weight(rounded.lm_head, "int8"))
    got = forced_logits(model, prompt, follow, precision)
    error = relative_error(got, forced_logits(rounded, prompt, follow, None))
    assert error <= LOGITS_TOLERANCE["bf16"]                   # bf16 activations, nothing else
    assert error < relative_error(got, forced_logits(model, prompt, follow, None))


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_logits_stay_near_float32_within_the_stated_tolerance(kind, precision):
    prompt, follow = token_ids(SMALL_GPT, 3, 9), token_ids(SMALL_GPT, 3, 6, seed=5)
    assert_near_float32(model_of(kind), prompt, follow, precision, kind)


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_quantized_logits_equal_the_teaching_forward_of_the_same_rounded_weights(precision):
    prompt, follow = token_ids(SMALL_GPT, 2, 7), token_ids(SMALL_GPT, 2, 5, seed=6)
    assert_rounding_is_all_that_changes(model_of("llama", seed=2), prompt, follow, precision)


NEW_TOKENS = 32


def float32_run(model, prompts, mask):
    """A model, its prompts (b, n) and mask, and its float32 greedy tokens (b, n + 32)."""
    return model, prompts, mask, generate(model, prompts, NEW_TOKENS, attention_mask=mask,
                                          fast=True)


def greedy_agreement(run, precision) -> float:
    """Share of rows whose greedy tokens in ``precision`` equal float32's."""
    model, prompts, mask, want = run
    got = generate(model, prompts, NEW_TOKENS, attention_mask=mask, fast=True,
                   precision=precision)
    return float((got == want).all(dim=1).float().mean())


def left_padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    n = max(len(r) for r in rows)
    ids = torch.tensor([[0] * (n - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (n - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


SHIPPED_PROMPTS = [b"def ", b"import os\n", b"class Parser:\n    def ", b"    for i in range(",
                   b"if __name__ == ", b"return self.", b"# comment", b"x = [", b"while True:\n",
                   b"try:\n    "]


@pytest.fixture(scope="module")
def shipped_run():
    return float32_run(load_pretrained().eval(), *left_padded([list(p) for p in SHIPPED_PROMPTS]))


@pytest.fixture(scope="module")
def gpt2_shaped_run():
    return float32_run(GPT(GPT2_SHAPED, seed=0).eval(), token_ids(GPT2_SHAPED, 8, 8, seed=3), None)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_greedy_tokens_agree_with_float32_on_the_shipped_model(precision, shipped_run):
    share = greedy_agreement(shipped_run, precision)
    print(f"shipped model, {precision}: {share:.0%} of {len(SHIPPED_PROMPTS)} prompts give "
          f"float32's 32 greedy tokens")
    assert share >= AGREEMENT_FLOOR["shipped"][precision]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_greedy_tokens_agree_with_float32_on_a_gpt2_shaped_model(precision, gpt2_shaped_run):
    share = greedy_agreement(gpt2_shaped_run, precision)
    print(f"GPT-2-shaped random model, {precision}: {share:.0%} of 8 prompts give float32's "
          f"32 greedy tokens")
    assert share >= AGREEMENT_FLOOR["gpt2-shaped"][precision]


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_a_padded_batch_decodes_as_each_sequence_alone(kind, precision):
    model = model_of(kind, seed=3)
    g = torch.Generator().manual_seed(4)
    rows = [torch.randint(0, 64, (n,), generator=g).tolist() for n in (7, 3, 5, 1)]
    prompts, mask = left_padded(rows)
    prepared = FastModels()          # the batch's kernels for each sequence alone too
    batched = generate(model, prompts, 10, attention_mask=mask, fast=prepared,
                       precision=precision)
    fast = prepared.get(model, precision=precision, batch_size=len(rows))
    for i, row in enumerate(rows):
        alone = generate(model, torch.tensor([row]), 10, fast=fast)
        assert torch.equal(batched[i, -10:], alone[0, -10:]), f"sequence {i}"
    assert prepared.preparations == 1


@pytest.mark.parametrize("precision", PRECISIONS)
def test_paged_decoding_equals_contiguous_in_each_precision(precision):
    """The paged cache is the teaching path's (the fast path keeps one static cache), so each
    precision runs there on its own weights: the model in bfloat16, or with its matrices
    rounded to int8/int4 (fake_quantize; w8a8 stores int8's weights); paged logits equal
    contiguous ones at every step."""
    base = model_of("gpt", seed=4)
    weights = "int8" if precision == "w8a8" else precision
    model = base.to(torch.bfloat16) if precision == "bf16" else fake_quantize(base, weights)
    twin = Twin(model, block_size=3, num_blocks=32)
    g = torch.Generator().manual_seed(5)
    for name, n in enumerate((5, 2, 7)):
        twin.add(name)
        twin.run([name], torch.randint(0, 64, (1, n), generator=g))
    for _ in range(4):
        twin.run([0, 1, 2], torch.randint(0, 64, (3, 1), generator=g))


def test_the_fast_model_owns_its_weights_and_leaves_the_model_unchanged():
    model = model_of("gpt", seed=5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    attributes = set(vars(model))
    fast = fast_model(model, precision="int8")
    generate(model, token_ids(SMALL_GPT, 2, 4), 5, fast=fast)
    assert set(vars(model)) == attributes
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]) and value.dtype == torch.float32
    assert fast.dtype == torch.bfloat16 and fast.stream_dtype == torch.float32
    assert fast.blocks[0].w_qkv.values.dtype == torch.int8
    bf16 = fast_model(model, precision="bf16", pack=True)          # bf16's own kernel
    assert bf16.blocks[0].ln_1_scale.dtype == torch.float32         # norms stay float32
    assert bf16.blocks[0].b_qkv.dtype == torch.bfloat16


def test_one_row_of_a_cached_model_in_bf16_is_float32_arithmetic_on_rounded_weights():
    """bf16's gain at one row is reading half the bytes, which a model that fits in a cache
    does not need (llmcore.fastpath.DENSE_BF16_WHEN_CACHED): its one row runs float32
    products on its bf16-rounded weights, says so, and gives the float32 teaching forward of
    those weights; pack= asks for bf16's own kernel."""
    model = model_of("llama", seed=8)
    fast = fast_model(model, precision="bf16")
    assert fast.dtype == torch.float32 and fast.format.rounding == "bf16"
    assert fast.kernel == "float32 products on bf16-rounded weights (dequantized once)"
    assert fast_model(model, precision="bf16", pack=False).dtype == torch.bfloat16
    rounded = fake_quantize(model, "bf16")
    with torch.no_grad():
        rounded.lm_head.copy_(round_weight(rounded.lm_head, "bf16"))
    prompt, follow = token_ids(SMALL_GPT, 1, 7), token_ids(SMALL_GPT, 1, 5, seed=9)
    torch.testing.assert_close(forced_logits(model, prompt, follow, "bf16"),
                               forced_logits(rounded, prompt, follow, None),
                               rtol=1e-4, atol=1e-4)


def test_bad_precisions_are_refused_with_what_was_expected():
    model = model_of("gpt")
    prompt = token_ids(SMALL_GPT, 1, 3)
    with pytest.raises(ValueError, match="precision: expected None or one of"):
        fast_model(model, precision="int3")
    with pytest.raises(ValueError, match="pass fast=True"):
        generate(model, prompt, 2, precision="bf16")
    with pytest.raises(ValueError, match="divisible by 16"):
        fast_model(GPT(GPTConfig(vocab_size=64, d_model=40, n_heads=4)), precision="int4")
    with pytest.raises(ValueError, match=r"int8: PyTorch's weight-only int8 kernel needs d_in "
                                         r"divisible by 16, got a \(40, 120\) matrix"):
        fast_model(GPT(GPTConfig(vocab_size=64, d_model=40, n_heads=4)), precision="int8")


@pytest.mark.parametrize("precision", ON_META)
def test_each_precision_generates_on_the_meta_device_and_counts_its_bytes(precision):
    model = GPT(SMALL_GPT, device="meta")
    prompt = torch.zeros(2, 5, dtype=torch.long, device="meta")
    out = generate(model, prompt, 3, fast=True, precision=precision)
    assert out.shape == (2, 8) and out.device.type == "meta"
    fp32 = fast_model(model).weight_bytes()
    read = fast_model(model, precision=precision).weight_bytes()
    assert read < fp32 / {"bf16": 1.8, "int8": 3.0, "int4": 3.5}[precision]


def test_w8a8_is_refused_where_its_kernel_is_not():
    model = GPT(SMALL_GPT, device="meta")
    with pytest.raises(ValueError, match="precision='w8a8' uses PyTorch's int8 x int8 CPU kernel"
                                         ".*the model is on meta"):
        fast_model(model, precision="w8a8")


def w8a8_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """What the w8a8 product is documented to compute, in float64: each row of x divided by
    its largest magnitude r and rounded in steps of 1/64 (integer codes -64..64), the weight's
    int8 codes per output channel, integer sums, then r * (1/64) * s[j]."""
    from llmcore.quantize import quantize_int8
    q = quantize_int8(weight)
    x64 = x.double()
    r = x64.abs().amax(dim=1, keepdim=True).clamp(min=1e-300)
    step = 1 / 64
    codes = torch.round(x64 / r / step)
    return (codes @ q.values.double()) * r * step * q.scale.double()


def test_w8a8_product_is_the_documented_integer_arithmetic_row_by_row():
    """The kernel against its float64 model, and each row of a batch equal to the same row
    alone (which takes the one-row path: its scale given to the kernel), to float32's last
    bits: a token's codes never depend on its neighbours."""
    from llmcore.lowbit import w8a8_linear, w8a8_matmul
    g = torch.Generator().manual_seed(7)
    weight = torch.randn(96, 80, generator=g)
    x = torch.randn(16, 96, generator=g) * torch.logspace(-2, 2, 16)[:, None]  # rows of all sizes
    x[3] = 0                                                                   # and one of zeros
    packed = w8a8_linear(weight)
    with torch.inference_mode():
        got = w8a8_matmul(x, packed, None)
        alone = torch.cat([w8a8_matmul(x[i:i + 1], packed, None) for i in range(16)])
    want = w8a8_reference(x, weight)
    scale = want.abs().amax(dim=1, keepdim=True).clamp(min=1e-30)
    for product in (got, alone):
        assert float(((product.double() - want).abs() / scale).max()) < 1e-6
        assert torch.equal(product[3], torch.zeros(80))
    torch.testing.assert_close(alone, got, rtol=1e-6, atol=1e-6 * float(scale.max()))
    assert packed.weight_bytes == 96 * 80 + 4 * 80


def test_w8a8_matmul_names_what_it_expected():
    from llmcore.lowbit import w8a8_linear, w8a8_matmul
    packed = w8a8_linear(torch.randn(8, 16))
    with pytest.raises(ValueError, match=r"expected a float32 matrix \(rows, 8\) on the CPU, "
                                         r"got torch.bfloat16 \(2, 8\)"):
        w8a8_matmul(torch.ones(2, 8, dtype=torch.bfloat16), packed)
    with pytest.raises(ValueError, match="x has 9 columns but the matrix has d_in = 8"):
        w8a8_matmul(torch.ones(2, 9), packed)
    with pytest.raises(ValueError, match=r"b: expected shape \(16,\), got \(8,\)"):
        w8a8_matmul(torch.ones(2, 8), packed, torch.ones(8))
    with pytest.raises(TypeError, match="expected a W8A8Linear"):
        w8a8_matmul(torch.ones(2, 8), torch.ones(8, 16))
    want = w8a8_matmul(torch.ones(2, 8), packed) + torch.arange(16.0)
    torch.testing.assert_close(w8a8_matmul(torch.ones(2, 8), packed, torch.arange(16.0)), want,
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("precision", ["w8a8", "int8", "bf16", None])
def test_a_held_fast_models_prepares_each_model_and_precision_once(precision, monkeypatch):
    """generate(fast=prepared, precision=...) prepares the weights on the first call only
    (counted: FastDecoder objects made, and matrices prepared), gives fast=True's tokens, and
    prepares again only for another precision or batch size, or weights that changed."""
    from llmcore.fastpath import FastDecoder
    matrices = []
    original = FastDecoder.prepare_matrix
    monkeypatch.setattr(FastDecoder, "prepare_matrix",
                        lambda self, *a, **k: matrices.append(1) or original(self, *a, **k))
    model = model_of("llama", seed=7)
    attributes = set(vars(model))
    prompt = token_ids(SMALL_GPT, 2, 5)
    want = generate(model, prompt, 6, fast=True, precision=precision)
    made = len(matrices)
    prepared = FastModels()
    for _ in range(3):
        assert torch.equal(generate(model, prompt, 6, fast=prepared, precision=precision), want)
    assert prepared.preparations == 1 and len(prepared) == 1
    assert len(matrices) == 2 * made                        # fast=True's, then the held one's
    generate(model, prompt[:1], 6, fast=prepared, precision=precision)      # another batch size
    generate(model, prompt, 6, fast=prepared, precision="fp32" if precision else "bf16")
    assert prepared.preparations == 3
    with torch.no_grad():
        model.lm_head.mul_(-1.0)                            # an in-place edit: prepared again
    edited = generate(model, prompt, 6, fast=prepared, precision=precision)
    assert prepared.preparations == 4
    assert torch.equal(edited, generate(model, prompt, 6, fast=True, precision=precision))
    assert set(vars(model)) == attributes                   # nothing hung on the model
    prepared.clear()
    assert len(prepared) == 0
    generate(model, prompt, 6, fast=prepared, precision=precision)
    assert prepared.preparations == 5


@pytest.mark.parametrize("multiplies_bf16", [False, True])
def test_the_kernel_is_picked_per_batch_size_and_says_its_arithmetic(monkeypatch,
                                                                     multiplies_bf16):
    """On the CPU a weight-only precision serves large batches dense (its rounded weights in
    float32, float32 products: lowbit.dense), but on a CPU that multiplies bfloat16 in hardware
    bf16 stays bfloat16 and int8 and int4 are dense in bfloat16 (a batch of up to 96 rows on
    llmcore's AMX kernel, where it runs); fp32 never changes, w8a8
    from 2 rows on only to its MANY_ROW_FORMATS form (the same arithmetic), where llmcore's
    C kernels run; no precision changes on another device."""
    from llmcore import lowbit
    from llmcore.lowbit import (BF16_DENSE_FROM_BATCH, FORMATS, INT_DENSE_FROM_BATCH,
                                format_of)
    monkeypatch.setattr(lowbit, "_cpu_multiplies_bf16", lambda: multiplies_bf16)
    cpu, meta = torch.device("cpu"), torch.device("meta")
    amx = multiplies_bf16 and lowbit.onerow.amx_available(cpu)
    most = lowbit.MANY_ROWS_AT_MOST["bf16"]
    if multiplies_bf16:                 # bf16 stays bf16; a batch on AMX where it runs
        batch_form = lowbit.MANY_ROW_FORMATS["bf16"] if amx else FORMATS["bf16"]
        assert format_of("bf16", cpu, 1) is FORMATS["bf16"]
        assert all(format_of("bf16", cpu, b) is batch_form for b in (2, 16, 64, most))
        assert format_of("bf16", cpu, most + 1) is FORMATS["bf16"]
    starts = {"bf16": BF16_DENSE_FROM_BATCH, "int8": INT_DENSE_FROM_BATCH,
              "int4": INT_DENSE_FROM_BATCH}
    for precision, start in starts.items():
        if precision == "bf16" and multiplies_bf16:
            continue
        assert format_of(precision, cpu, start - 1) is FORMATS[precision]
        fmt = format_of(precision, cpu, start)
        arithmetic = torch.bfloat16 if multiplies_bf16 else torch.float32
        assert (fmt.dtype, fmt.rounding) == (arithmetic, precision)
        assert fmt.prepare is (lowbit.onerow.bf16_rows if amx else None)   # AMX's layout
        assert "dequantized once" in fmt.kernel
        assert format_of(precision, cpu, most + 1).prepare is None
        assert format_of(precision, meta, 16) is FORMATS[precision]
    assert format_of("fp32", cpu, 64) is FORMATS["fp32"]
    many = (lowbit.MANY_ROW_FORMATS["w8a8"] if lowbit.MANY_ROW_FORMATS["w8a8"].available(cpu)
            else FORMATS["w8a8"])                       # llmcore's C rounding where it runs
    assert format_of("w8a8", cpu, 1) is FORMATS["w8a8"]
    assert all(format_of("w8a8", cpu, b) is many for b in (2, 16, 64))


@pytest.mark.parametrize("precision", ["bf16", "int8", "int4"])
def test_a_dense_batch_is_float32_arithmetic_on_the_rounded_weights(precision, monkeypatch):
    """At a large batch the precision's logits equal the float32 teaching forward of the
    model with its matrices rounded as the precision rounds them (head too: int8 for int4's),
    to float32's tolerance: the arithmetic the benchmark states (bf16's dense form: a CPU
    without bfloat16 arithmetic, as if this one had none)."""
    from llmcore import lowbit
    from llmcore.lowbit import INT_DENSE_FROM_BATCH
    monkeypatch.setattr(lowbit, "_cpu_multiplies_bf16", lambda: False)
    model = model_of("llama", seed=8)
    rounded = fake_quantize(model, precision)
    with torch.no_grad():
        rounded.lm_head.copy_(round_weight(rounded.lm_head,
                                           "int8" if precision == "int4" else precision))
    b = INT_DENSE_FROM_BATCH
    prompt, follow = token_ids(SMALL_GPT, b, 7), token_ids(SMALL_GPT, b, 5, seed=9)
    got = forced_logits(model, prompt, follow, precision)
    torch.testing.assert_close(got, forced_logits(rounded, prompt, follow, None),
                               rtol=1e-4, atol=1e-4)
    assert relative_error(got, forced_logits(model, prompt, follow, None)) > 0


@pytest.mark.parametrize("precision", ["bf16", "int8", "int4"])
def test_one_row_of_a_streamed_model_keeps_the_fastest_form_and_says_its_arithmetic(
        precision, monkeypatch):
    """For one row of a model whose weights stream from memory, a weight-only precision times
    its own kernel and its dense form (the same rounded weights, float32 products) and keeps
    the faster, so that it is never slower than float32 for want of a kernel: here its own
    products are made slower on purpose, the dense form is kept, its logits are the float32
    teaching forward of the rounded weights, and its kernel says so, with each form's time.
    Left alone (nothing slowed), whichever it keeps gives logits within the stated
    tolerance."""
    import llmcore.fastpath as fastpath
    from llmcore import lowbit
    model = model_of("llama", seed=8)
    monkeypatch.setattr(fastpath, "PACK_ONE_ROW_ABOVE_BYTES", 0)
    prompt, follow = token_ids(SMALL_GPT, 1, 7), token_ids(SMALL_GPT, 1, 5, seed=9)
    assert_near_float32(model, prompt, follow, precision, f"{precision}, measured")

    def slowed(product):
        def delayed(x, w, b):
            if x.dtype == torch.bfloat16:     # the precision's own kernels, not float32's
                time.sleep(0.002)
            return product(x, w, b)
        return delayed

    if precision == "bf16":
        for name in ("plain_linear", "packed_linear"):
            monkeypatch.setattr(fastpath, name, slowed(getattr(fastpath, name)))
    for formats in (lowbit.FORMATS, lowbit.ONE_ROW_FORMATS):    # and llmcore's C kernels
        fmt = formats.get(precision)
        if fmt is not None and fmt.linear is not None:
            monkeypatch.setitem(formats, precision, fmt._replace(linear=slowed(fmt.linear)))
    fast = fast_model(model, precision=precision)
    assert fast.dtype == torch.float32 and fast.format.rounding == precision
    assert "dequantized once" in fast.kernel and "measured fastest" in fast.kernel
    names = list(fast.one_row_seconds)
    native = (precision in lowbit.ONE_ROW_FORMATS
              and lowbit.ONE_ROW_FORMATS[precision].available(torch.device("cpu")))
    assert len(names) == (4 if precision == "bf16" else 3) + native, names
    kept = min(fast.one_row_seconds, key=fast.one_row_seconds.get)
    assert "float32" in kept and f"{precision}-rounded" in kept and kept in fast.one_row_dense
    assert len(fast.one_row_dense) == 2                  # the dense form, plain and packed
    rounded = fake_quantize(model, precision)
    with torch.no_grad():
        rounded.lm_head.copy_(round_weight(rounded.lm_head,
                                           "int8" if precision == "int4" else precision))
    got = torch.stack([FastStep(fast, model, prompt, 1, None)(prompt)])
    want = torch.stack([FastStep(fast_model(rounded), rounded, prompt, 1, None)(prompt)])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
