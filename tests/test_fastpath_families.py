"""llmcore.fastpath serves every family of chapter 11 (Llama 3's RoPE scaling, Qwen2's q/k/v biases,
Qwen3's q/k norms and head_dim, Mistral's sliding window, SmolLM2's tied head) in every precision:
in float32 the same step logits and greedy tokens as the teaching path (batch 1 and 16, with
left padding, past the window), below it logits within test_fastpath_precision's stated
tolerances of float32's, and int8/int4 equal to the teaching forward of the same rounded weights.
Small random configs, each field a family's released diff."""

from __future__ import annotations

import pytest
import torch

from llmcore import generate, lowbit, onerow
from llmcore.fastpath import FastLlama, FastStep, StaticCache, fast_model
from llmcore.llama import Llama, LlamaConfig
from llmcore.lowbit import Int8Linear, int8_linear
from llmcore.rope import RopeScaling
from llmcore.storage import storage_bytes
from course.bench.fast import PRODUCT_OPS
from test_fastpath import assert_steps_equal_the_teaching_forward, mixed_lengths
from test_fastpath_precision import (PRECISIONS, assert_near_float32,
                                     assert_rounding_is_all_that_changes)
from test_model import randomize, token_ids

BASE = dict(vocab_size=64, max_seq_len=48, d_model=64, n_heads=4, n_kv_heads=2, n_layers=2,
            d_ff=96)
"""Every matrix's d_out a multiple of 16 and d_in of 32 (PyTorch's CPU int4 kernel)."""

FAMILIES = {
    "llama": {},
    "llama3.2": dict(rope_base=500000.0, tie_embeddings=True,     # some pairs kept, some slowed
                     rope_scaling=RopeScaling(factor=32.0, low_freq_factor=1.0,
                                              high_freq_factor=4.0, original_context=32)),
    "qwen2.5": dict(qkv_bias=True, rope_base=1e6, tie_embeddings=True),
    "qwen3": dict(qk_norm=True, head_dim=32, rope_base=1e6, tie_embeddings=True),  # 4 x 32 != 64
    "mistral": dict(sliding_window=8),                            # shorter than most inputs
    "smollm2": dict(rope_base=100000.0, tie_embeddings=True),
}
"""Each family as its diff from Llama (chapter 11's table), on one small base."""


def family(name: str, seed: int = 1, std: float = 0.1, device="cpu") -> Llama:
    """A small random model of one family: every parameter O(1) (biases and q/k norms too)."""
    model = Llama(LlamaConfig(**BASE, **FAMILIES[name]))
    return randomize(model, seed=seed, std=std).to(device).eval()


def test_each_family_changes_the_function():
    """Every diff matters on these inputs: a fast path that dropped one would fail below."""
    prompt = token_ids(LlamaConfig(**BASE), 2, 20)
    plain = family("llama")
    with torch.no_grad():
        base = plain(prompt)
        for name in FAMILIES:
            if name != "llama":
                model = family(name)
                if not model.config.qk_norm:   # same shapes: the diff alone changes logits
                    model.load_state_dict(plain.state_dict(), strict=False)
                assert (model(prompt) - base).abs().max() > 1e-3, name


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_step_logits_equal_the_teaching_forward(name, device):
    model = family(name, seed=2, device=device)
    fast = fast_model(model)
    assert type(fast) is FastLlama
    prompt = token_ids(model.config, 3, 11).to(device)     # past mistral's window of 8
    assert_steps_equal_the_teaching_forward(model, fast, prompt, 24)


def test_mistral_steps_over_a_ring_of_its_window_equal_the_teaching_forward(device):
    """The rolling cache's serving form: a ring of W = 8 rows per layer, a prompt of 11 (its
    prefill past the band), then 13 steps wrapping the ring."""
    model = family("mistral", seed=2, device=device)
    prompt = token_ids(model.config, 3, 11).to(device)
    assert_steps_equal_the_teaching_forward(model, fast_model(model), prompt, 24, capacity=8)


def test_mistral_chunks_over_a_ring_equal_the_teaching_forward(device):
    """Several tokens at once after a past (speculative decoding's verification): into an
    empty ring, across its end, and after it has wrapped."""
    model = family("mistral", seed=5, device=device)
    ids = token_ids(model.config, 2, 23).to(device)
    fast, cache = fast_model(model), StaticCache(model, 2, 8)
    positions = torch.arange(23, device=device).expand(2, 23)
    with torch.no_grad():
        for start, end in [(0, 5), (5, 11), (11, 14), (14, 15), (15, 23)]:
            got = fast.step(ids[:, start:end], positions[:, start:end], cache, None)
            want = model(ids[:, :end], last_only=True)[:, -1]
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("b", [1, 16])
def test_mistral_fast_generation_keeps_only_its_window(b):
    """Without padding, FastStep's cache is the ring: its tensors' storage holds W = 8 rows
    per layer and sequence, not the 30 tokens; with left padding it keeps every row."""
    model = family("mistral", seed=3)
    prompt = token_ids(model.config, b, 6, seed=b)
    step = FastStep(fast_model(model, batch_size=b), model, prompt, 24, None)
    c = model.config
    row = c.n_layers * b * c.kv_heads * c.d_head * 4                       # bytes, float32
    assert storage_bytes([step.cache.keys, step.cache.values]) == 2 * 8 * row
    padded, mask = mixed_lengths(model.config, b, 6, "cpu", seed=b)
    if not bool(mask.all()):
        kept = FastStep(fast_model(model, batch_size=b), model, padded, 24, mask)
        assert storage_bytes([kept.cache.keys, kept.cache.values]) == 2 * 30 * row


@pytest.mark.parametrize("b", [1, 16])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_greedy_tokens_equal_the_teaching_path_in_float32(name, b, device):
    model = family(name, seed=3, device=device)
    prompt = token_ids(model.config, b, 6, seed=b).to(device)
    want = generate(model, prompt, 24)                    # 30 tokens: past the window
    assert torch.equal(generate(model, prompt, 24, fast=True), want)
    assert torch.equal(generate(model, prompt, 24, fast=True, precision="fp32"), want)


@pytest.mark.parametrize("b", [1, 16])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_left_padded_prompts_give_the_teaching_tokens(name, b, device):
    model = family(name, seed=4, device=device)
    prompt, mask = mixed_lengths(model.config, b, 12, device, seed=b)   # 12 > the window
    want = generate(model, prompt, 16, attention_mask=mask)
    assert torch.equal(generate(model, prompt, 16, attention_mask=mask, fast=True), want)


@pytest.mark.parametrize("b", [1, 16])
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_logits_stay_near_float32_within_the_stated_tolerance(name, precision, b):
    model = family(name, seed=5)
    prompt = token_ids(model.config, b, 9, seed=b)
    follow = token_ids(model.config, b, 6, seed=b + 1)
    assert_near_float32(model, prompt, follow, precision, f"{name} b={b}")


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_bf16s_own_kernel_at_one_row_stays_near_float32(name, monkeypatch):
    """One row of these small (cached) models in bf16 runs float32 products on the rounded
    weights (llmcore.fastpath.DENSE_BF16_WHEN_CACHED), covered above; bf16's own kernel at
    one row, as a large model may keep it, stays within the tolerance too."""
    import llmcore.fastpath
    monkeypatch.setattr(llmcore.fastpath, "DENSE_BF16_WHEN_CACHED", False)
    model = family(name, seed=5)
    assert fast_model(model, precision="bf16").dtype == torch.bfloat16
    prompt, follow = token_ids(model.config, 1, 9, seed=1), token_ids(model.config, 1, 6, seed=2)
    assert_near_float32(model, prompt, follow, "bf16", f"{name} b=1, bf16's own kernel")


@pytest.mark.parametrize("precision", ["int8", "int4"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_quantized_logits_equal_the_teaching_forward_of_the_same_rounded_weights(name,
                                                                                 precision):
    model = family(name, seed=6)
    prompt, follow = token_ids(model.config, 2, 10), token_ids(model.config, 2, 5, seed=6)
    assert_rounding_is_all_that_changes(model, prompt, follow, precision)


@pytest.mark.parametrize("precision", ["bf16", "int8", "w8a8", "int4"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_c_kernels_serve_every_family_at_one_row(name, precision, monkeypatch):
    """llmcore.onerow's C kernels, made the form one row takes (a model larger than the cache
    may keep them): each family's logits, a prompt's rows and then one row a step, stay within
    the stated tolerance of float32's, and int8's and int4's are the teaching forward of the
    same rounded weights."""
    import llmcore.fastpath
    c_form = lowbit.ONE_ROW_FORMATS[precision]
    if not c_form.available(torch.device("cpu")):
        pytest.skip(f"no one-row C kernel for {precision}: {onerow.unavailable_reason()}")
    monkeypatch.setitem(lowbit.FORMATS, precision, c_form)
    monkeypatch.setattr(llmcore.fastpath, "DENSE_BF16_WHEN_CACHED", False)
    model = family(name, seed=5)
    assert fast_model(model, precision=precision).kernel == c_form.kernel
    prompt, follow = token_ids(model.config, 1, 9, seed=3), token_ids(model.config, 1, 6, seed=4)
    assert_near_float32(model, prompt, follow, precision, f"{name}, C kernel")
    if precision in ("int8", "int4"):
        assert_rounding_is_all_that_changes(model, prompt, follow, precision)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_meta_device_generation_makes_nothing_on_the_cpu(name):
    model = Llama(LlamaConfig(**BASE, **FAMILIES[name]), device="meta")
    prompt = torch.zeros(3, 12, dtype=torch.long, device="meta")
    mask = torch.ones(3, 12, dtype=torch.bool, device="meta")
    for precision in (None, "bf16", "int8", "int4"):
        out = generate(model, prompt, 4, attention_mask=mask, fast=True, precision=precision)
        assert out.shape == (3, 16) and out.device.type == "meta"


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8", "w8a8", "int4"])
def test_a_prepared_copy_reads_each_input_once_q_k_v_fused_and_gate_up_fused(precision):
    """Copies (packed, cast or quantized) are fused: one product for q, k and v, one for gate
    and up (4 a block, not 7, and w8a8 rounds each input once); the fused matrix holds the
    same rounded numbers as the separate ones, since every precision rounds column by column.
    float32 at one row on a small model serves the model's own tensors, unfused and uncopied."""
    model = family("qwen2.5")                                   # with q/k/v biases
    attention, ffn = model.blocks[0].attention, model.blocks[0].ffn
    compared = 0
    for batch in (1, 16):
        fast = fast_model(model, precision=precision, batch_size=batch)
        w = fast.blocks[0]
        if fast.serves_own_tensors():
            assert (precision, batch) == ("fp32", 1)
            assert w.w_q is attention.w_q and w.w_qkv is None and w.w_gate_up is None
            continue
        assert w.w_q is w.w_k is w.w_v is w.w_gate is w.w_up is w.b_q is None
        assert w.b_qkv.shape == (fast.h * fast.d_head + 2 * fast.h_kv * fast.d_head,)
        if isinstance(w.w_gate_up, Int8Linear):
            apart = [int8_linear(m.detach(), fast.dtype) for m in (ffn.w_gate, ffn.w_up)]
            assert torch.equal(w.w_gate_up.values,
                               torch.cat([part.values for part in apart]))
            assert torch.equal(w.w_gate_up.scale, torch.cat([part.scale for part in apart]))
            compared += 1
    assert compared == (precision == "int8")                    # its one-row kernel
    fast = fast_model(model, precision=precision, batch_size=1)
    prompt = token_ids(model.config, 1, 6)
    with torch.inference_mode(), torch.profiler.profile() as profiled:
        generate(model, prompt, 2, fast=fast)
    calls = sum(e.count for e in profiled.key_averages() if e.key in PRODUCT_OPS)
    per_step = (4 if not fast.serves_own_tensors() else 7) * model.config.n_layers + 1
    assert calls == 2 * per_step, (precision, calls)
