"""llmcore.fastpath: the fast path computes what the teaching path computes, for a GPT and for a
Llama. Same last-row logits after a prompt and after every decode step, same greedy tokens at
batch 1 and 16, with left padding (mixed prompt lengths), grouped-query attention, eos, seeded
sampling; its errors name what was wrong; it keeps its state on itself, never on the model; it
follows the model's device (CPU, CUDA where present, meta)."""

from __future__ import annotations

import time

import pytest
import torch

from conftest import TINY, TINY_GQA
from llmcore import decode_steps, generate
from llmcore.fastpath import FastGPT, FastLlama, StaticCache, fast_model
from llmcore.lowbit import packed_linear_available
from llmcore.kvcache import KVCache
from llmcore.llama import Llama, LlamaConfig
from llmcore.model import GPT
from test_model import randomize, token_ids

TINY_LLAMA = LlamaConfig(vocab_size=61, max_seq_len=48, d_model=32, n_heads=4, n_kv_heads=2,
                         n_layers=2, d_ff=40)
"""A Llama with grouped-query attention, every size distinct from the GPTs' where it can be."""


def tiny(kind: str, seed: int, device="cpu"):
    """A randomized tiny model of one kind: "mha", "gqa" (GPTs) or "llama"."""
    if kind == "llama":
        return randomize(Llama(TINY_LLAMA), seed=seed).to(device).eval()
    return randomize(GPT(TINY if kind == "mha" else TINY_GQA), seed=seed).to(device).eval()


KINDS = ["mha", "gqa", "llama"]


def mixed_lengths(config, b, n, device, seed=0):
    """b left-padded prompts of 1..n real tokens: ids (b, n) and mask (b, n)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, n + 1, (b,), generator=g)
    lengths[0] = n                                           # one full-length prompt
    mask = torch.arange(n)[None, :] >= (n - lengths)[:, None]
    return token_ids(config, b, n, seed).to(device), mask.to(device)


def assert_steps_equal_the_teaching_forward(model, fast, prompt, total, capacity=None):
    """The fast step's logits after the prompt (b, n) and after each greedy token up to
    ``total`` tokens equal the teaching forward's with a KVCache. capacity: the fast cache's
    rows (default ``total``; a sliding window's W: its ring of the last window)."""
    b, n = prompt.shape
    cache, teaching = StaticCache(model, b, capacity or total), KVCache.for_model(model, b)
    positions = torch.arange(total, device=prompt.device).expand(b, total)
    with torch.no_grad():
        want = model(prompt, teaching, last_only=True)[:, -1]
        got = fast.step(prompt, positions[:, :n], cache, None)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        for t in range(n, total):
            step = want.argmax(dim=-1, keepdim=True)
            want = model(step, teaching, last_only=True)[:, -1]
            got = fast.step(step, positions[:, t:t + 1], cache, None)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert cache.length == teaching.length == total


@pytest.mark.parametrize("kind", KINDS)
def test_step_logits_equal_the_teaching_forward_with_a_cache(kind, device):
    model = tiny(kind, seed=4, device=device)
    fast = fast_model(model)
    assert type(fast) is (FastLlama if kind == "llama" else FastGPT)
    assert_steps_equal_the_teaching_forward(model, fast, token_ids(model.config, 3, 7).to(device),
                                            12)


def test_the_output_projection_follows_the_embedding_when_it_changes(device):
    model = randomize(GPT(TINY), seed=5).to(device).eval()
    fast = FastGPT(model)
    head = fast.output_weight()
    assert head.shape == (TINY.d_model, TINY.vocab_size) and head.is_contiguous()
    assert torch.equal(head, model.token_embedding.t())
    assert fast.output_weight() is head                       # kept while nothing changes
    assert FastGPT(model).output_weight() is not head         # each fast model owns its copy
    assert not [name for name in vars(model) if "fast" in name]   # nothing hung on the model
    prompt = token_ids(TINY, 2, 5).to(device)
    positions = torch.arange(5, device=device).expand(2, 5)
    with torch.no_grad():
        model.token_embedding.mul_(1.5)                 # an in-place edit, as a training step
        got = fast.step(prompt, positions, StaticCache(model, 2, 5), None)
        want = model(prompt, KVCache.for_model(model, 2), last_only=True)[:, -1]
    assert torch.equal(fast.output_weight(), model.token_embedding.t())
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_prepacked_products_for_batches_give_the_plain_fast_path_logits(kind):
    model = tiny(kind, seed=6)
    if not packed_linear_available(model.device, model.dtype):
        pytest.skip("this torch has no oneDNN (mkldnn) CPU kernels")
    packed, plain = fast_model(model, batch_size=4), fast_model(model)
    assert packed.packed and not plain.packed and not fast_model(model, batch_size=1).packed
    assert not packed_linear_available(model.device, torch.float64)
    assert not packed_linear_available(torch.device("meta"), torch.float32)
    prompt = token_ids(model.config, 4, 6)
    positions = torch.arange(8).expand(4, 8)
    with torch.inference_mode():
        caches = StaticCache(model, 4, 8), StaticCache(model, 4, 8)
        for t in (slice(0, 6), slice(6, 7), slice(7, 8)):
            tokens = prompt if t.start == 0 else got.argmax(dim=-1, keepdim=True)
            got = packed.step(tokens, positions[:, t], caches[0], None)
            want = plain.step(tokens, positions[:, t], caches[1], None)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("b", [1, 16])
@pytest.mark.parametrize("kind", KINDS)
def test_greedy_tokens_equal_the_teaching_path(kind, b, device):
    model = tiny(kind, seed=5, device=device)
    prompt = token_ids(model.config, b, 6, seed=b).to(device)
    want = generate(model, prompt, 20)
    assert torch.equal(generate(model, prompt, 20, fast=True), want)
    kept = fast_model(model, batch_size=b)                    # built once, used twice
    assert torch.equal(generate(model, prompt, 20, fast=kept), want)
    assert torch.equal(generate(model, prompt, 20, fast=kept), want)


@pytest.mark.parametrize("b", [1, 16])
@pytest.mark.parametrize("kind", ["mha", "llama"])
def test_mixed_prompt_lengths_with_left_padding_give_the_teaching_tokens(kind, b, device):
    model = tiny(kind, seed=6, device=device)
    prompt, mask = mixed_lengths(model.config, b, 9, device, seed=b)
    want = generate(model, prompt, 15, attention_mask=mask)
    assert torch.equal(generate(model, prompt, 15, attention_mask=mask, fast=True), want)


@pytest.mark.parametrize("kind", ["mha", "llama"])
def test_eos_and_seeded_sampling_match_the_teaching_path(kind):
    model = tiny(kind, seed=7)
    prompt = token_ids(model.config, 4, 5)
    greedy = generate(model, prompt, 12)
    eos = int(greedy[0, 8])                         # a token the first sequence emits
    assert torch.equal(generate(model, prompt, 12, eos_id=eos, fast=True),
                       generate(model, prompt, 12, eos_id=eos))
    for seed in (3, [1, 2, 3, 4]):
        assert torch.equal(generate(model, prompt, 12, temperature=0.8, top_k=5, seed=seed,
                                    fast=True),
                           generate(model, prompt, 12, temperature=0.8, top_k=5, seed=seed))


@pytest.mark.parametrize("kind", ["mha", "llama"])
def test_fast_path_runs_under_inference_mode_and_leaves_the_model_unchanged(kind):
    model = tiny(kind, seed=8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    attributes = set(vars(model))
    steps = list(decode_steps(model, token_ids(model.config, 2, 4), 5, fast=True))
    assert all(step.logits.is_inference() for step in steps)
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert set(vars(model)) == attributes                     # nothing hung on the model


def test_bad_calls_are_refused_with_what_was_expected():
    model = GPT(TINY).eval()
    prompt = token_ids(TINY, 2, 4)
    with pytest.raises(ValueError, match="max_seq_len"):
        generate(model, prompt, TINY.max_seq_len, fast=True)
    with pytest.raises(ValueError, match="ids must lie in"):
        generate(model, prompt + TINY.vocab_size, 3, fast=True)
    with pytest.raises(ValueError, match=r"attention_mask.*\(2, 4\)"):
        generate(model, prompt, 3, attention_mask=torch.ones(2, 5, dtype=torch.bool), fast=True)
    with pytest.raises(ValueError, match="fast=True brings its own cache"):
        generate(model, prompt, 3, backend="fused", fast=True)
    with pytest.raises(ValueError, match="another model"):
        generate(model, prompt, 3, fast=FastGPT(GPT(TINY)))
    with pytest.raises(TypeError, match="serves llmcore's GPT and Llama models, got Linear"):
        fast_model(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, prompt, -1, fast=True)


@pytest.mark.parametrize("model", [GPT(TINY_GQA, device="meta"),
                                   Llama(TINY_LLAMA, device="meta")], ids=["gpt", "llama"])
def test_meta_device_generation_makes_nothing_on_the_cpu(model):
    prompt = torch.zeros(3, 5, dtype=torch.long, device="meta")
    out = generate(model, prompt, 4, fast=True)
    assert out.shape == (3, 9) and out.device.type == "meta"
    mask = torch.ones(3, 5, dtype=torch.bool, device="meta")
    assert generate(model, prompt, 4, attention_mask=mask, fast=True).shape == (3, 9)


@pytest.mark.parametrize("b", [1, 16])
def test_transformers_generates_the_same_tokens_from_the_same_weights(b, tmp_path):
    """llmcore (teaching and fast) == Hugging Face transformers' GPT2LMHeadModel loaded from
    llmcore.save_gpt2's directory: greedy tokens, batch 1 and 16 with mixed prompt lengths."""
    transformers = pytest.importorskip("transformers", reason="transformers (dev extra) is absent")
    from llmcore import save_gpt2
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    model = randomize(GPT(TINY), seed=9).eval()
    save_gpt2(model, tmp_path)
    peer = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    prompt, mask = mixed_lengths(TINY, b, 8, "cpu", seed=b)
    want = peer.generate(input_ids=prompt, attention_mask=mask.long(), max_new_tokens=12,
                         min_new_tokens=12, do_sample=False, pad_token_id=0)
    assert torch.equal(generate(model, prompt, 12, attention_mask=mask, fast=True), want)
    assert torch.equal(generate(model, prompt, 12, attention_mask=mask), want)


def test_one_row_measures_its_kernel_when_the_weights_do_not_fit_in_a_cache(monkeypatch):
    """A model larger than a CPU's last-level cache (:data:`PACK_ONE_ROW_ABOVE_BYTES`) streams
    its weights from memory every step, and which one-row product reads them faster depends on
    the CPU: the fast path times both on the model's matrices and keeps the faster (here made
    slower on purpose, each way in turn), and says so; one that fits keeps addmm unmeasured;
    ``pack=`` chooses explicitly. Either form gives the teaching path's logits."""
    import llmcore.fastpath as fastpath
    from llmcore.storage import storage_bytes
    model = tiny("gpt", seed=7)
    if not packed_linear_available(model.device, model.dtype):
        pytest.skip("this torch has no oneDNN (mkldnn) CPU kernels")
    weights = storage_bytes(model.parameters())
    assert fastpath.streams_from_memory(model, weights - 1)
    assert not fastpath.streams_from_memory(model, weights)
    assert weights < fastpath.PACK_ONE_ROW_ABOVE_BYTES
    from llmcore import lowbit                   # PyTorch's two forms alone (the C one:
    monkeypatch.delitem(lowbit.ONE_ROW_FORMATS, "fp32", raising=False)   # test_onerow_step)
    small = fast_model(model)
    assert not small.packed and not small.one_row_seconds and small.kernel == "torch.addmm"
    assert fast_model(model, pack=True).packed and not fast_model(model, batch_size=4,
                                                                   pack=False).packed
    monkeypatch.setattr(fastpath, "PACK_ONE_ROW_ABOVE_BYTES", weights - 1)
    prompt = token_ids(model.config, 1, 6)
    positions = torch.arange(6).expand(1, 6)
    with torch.inference_mode():
        want = model(prompt)[:, -1]
    for slow in ("plain_linear", "packed_linear"):
        with monkeypatch.context() as patch:
            product = getattr(fastpath, slow)

            def delayed(x, w, b, product=product):
                time.sleep(0.002)
                return product(x, w, b)

            patch.setattr(fastpath, slow, delayed)
            fast = fast_model(model)
        assert fast.packed == (slow == "plain_linear")
        seconds = fast.one_row_seconds
        kept, dropped = (("float32 oneDNN packed", "float32 addmm") if fast.packed
                         else ("float32 addmm", "float32 oneDNN packed"))
        assert seconds[kept] < seconds[dropped] and len(seconds) == 2
        assert "measured fastest for one row here" in fast.kernel
        with torch.inference_mode():
            got = fast.step(prompt, positions, StaticCache(model, 1, 6), None)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
