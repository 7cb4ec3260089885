"""The contiguous KV cache: cached generation == recomputation, step by step; the work it saves;
its capacity policy; its memory against the formula; refusals that leave it intact."""

from __future__ import annotations

import math

import pytest
import torch

import llmcore.model
from llmcore import GPT, KVCache, decode_steps, generate, kv_bytes_per_token
from llmcore.device import cuda_available
from conftest import TINY


def prompt(model, b=2, n=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (b, n), generator=g).to(model.device)


@pytest.mark.parametrize("model_fixture", ["tiny_model", "tiny_gqa_model"])
def test_cached_logits_equal_uncached_at_every_step(model_fixture, device, request):
    model = request.getfixturevalue(model_fixture)
    ids = prompt(model)
    cached = list(decode_steps(model, ids, 12, use_cache=True))
    uncached = list(decode_steps(model, ids, 12, use_cache=False))
    for step, (a, b) in enumerate(zip(cached, uncached)):
        torch.testing.assert_close(a.logits, b.logits, msg=f"step {step}")
        assert torch.equal(a.tokens, b.tokens), f"step {step}"


@pytest.mark.parametrize("sampling", [dict(), dict(temperature=0.8, seed=7),
                                      dict(temperature=1.3, top_k=5, seed=3)])
def test_generate_with_cache_gives_the_same_tokens(tiny_model, sampling):
    ids = prompt(tiny_model, b=3, n=4)
    with_cache = generate(tiny_model, ids, 20, use_cache=True, **sampling)
    without = generate(tiny_model, ids, 20, use_cache=False, **sampling)
    assert torch.equal(with_cache, without)
    assert with_cache.shape == (3, 24)


def test_decode_step_projects_only_the_new_token(tiny_model, monkeypatch):
    rows_projected = []
    original = llmcore.model.qkv_projection

    def counting(x, *args, **kwargs):
        rows_projected.append(x.shape[1])           # tokens of this call, per layer
        return original(x, *args, **kwargs)

    monkeypatch.setattr(llmcore.model, "qkv_projection", counting)
    generate(tiny_model, prompt(tiny_model, n=6), 5, use_cache=True)
    layers = tiny_model.config.n_layers
    # prefill projects the 6 prompt tokens; each of the 4 later steps projects 1 (the 5th token
    # is sampled from the 4th step's logits and never fed back)
    assert rows_projected == [6] * layers + [1] * (4 * layers)
    rows_projected.clear()
    generate(tiny_model, prompt(tiny_model, n=6), 5, use_cache=False)
    assert rows_projected == [n for n in range(6, 11) for _ in range(layers)]   # all, every step


def test_chunked_prefill_equals_one_pass(tiny_model):
    ids = prompt(tiny_model, b=2, n=11)
    cache = KVCache.for_model(tiny_model, 2)
    with torch.no_grad():
        parts = [tiny_model(ids[:, :4], cache), tiny_model(ids[:, 4:9], cache),
                 tiny_model(ids[:, 9:], cache)]
        whole = tiny_model(ids)
    torch.testing.assert_close(torch.cat(parts, dim=1), whole)
    assert cache.length == 11


def test_growing_capacity_copies_rarely_and_changes_nothing(tiny_model):
    ids = prompt(tiny_model, b=2, n=3)
    cache = KVCache.for_model(tiny_model, 2, capacity=2)
    grown = generate(tiny_model, ids, 40, cache=cache)
    assert torch.equal(grown, generate(tiny_model, ids, 40, use_cache=False))
    # 2 -> 4 -> 8 -> 16 -> 32 -> 48 (max_seq_len): one copy per doubling, not one per step
    assert cache.grow_count == math.ceil(math.log2(TINY.max_seq_len / 2))
    assert cache.capacity == TINY.max_seq_len


def test_preallocated_cache_never_copies(tiny_model):
    cache = KVCache.for_model(tiny_model, 2)
    pointers = [k.data_ptr() for k in cache.keys]
    generate(tiny_model, prompt(tiny_model), 30, cache=cache)
    assert cache.grow_count == 0
    assert [k.data_ptr() for k in cache.keys] == pointers


def test_memory_matches_the_formula(tiny_gqa_model):
    model, b, n = tiny_gqa_model, 3, 7
    c = model.config
    cache = KVCache.for_model(model, b, capacity=n)
    with torch.no_grad():
        model(prompt(model, b=b, n=n), cache)
    per_token = kv_bytes_per_token(c.n_layers, c.kv_heads, c.d_head, 4)
    assert per_token == 2 * 2 * 2 * 6 * 4
    stored = sum(t[:, :, :cache.length].numel() * t.element_size()
                 for t in (*cache.keys, *cache.values))
    assert cache.used_bytes() == stored == b * n * per_token
    assert cache.reserved_bytes() == stored            # capacity == length: nothing spare


def test_padding_is_not_counted_as_used(tiny_model):
    cache = KVCache.for_model(tiny_model, 2)
    mask = torch.tensor([[False, False, True], [True, True, True]], device=tiny_model.device)
    with torch.no_grad():
        tiny_model(prompt(tiny_model, n=3), cache, attention_mask=mask)
    assert cache.tokens_held() == 4


def snapshot(cache):
    return cache.length, [k.clone() for k in cache.keys], [v.clone() for v in cache.values]


def assert_unchanged(cache, before):
    length, keys, values = before
    assert cache.length == length
    for a, b in zip(cache.keys + cache.values, keys + values):
        assert torch.equal(a, b)


def test_decoding_past_max_seq_len_is_refused_and_leaves_the_cache_intact(tiny_model):
    cache = KVCache.for_model(tiny_model, 1)
    with torch.no_grad():
        tiny_model(prompt(tiny_model, b=1, n=TINY.max_seq_len - 1), cache)
        before = snapshot(cache)
        with pytest.raises(ValueError, match="max_seq_len"):
            tiny_model(prompt(tiny_model, b=1, n=2), cache)
    assert_unchanged(cache, before)
    with pytest.raises(ValueError, match="exceeds max_seq_len"):
        generate(tiny_model, prompt(tiny_model, b=1, n=40), 10)


def test_batch_size_mismatch_is_refused_and_leaves_the_cache_intact(tiny_model):
    cache = KVCache.for_model(tiny_model, 2)
    with torch.no_grad():
        tiny_model(prompt(tiny_model, b=2, n=3), cache)
        before = snapshot(cache)
        with pytest.raises(ValueError, match="batch-size mismatch: tokens hold b = 3"):
            tiny_model(prompt(tiny_model, b=3, n=1), cache)
    assert_unchanged(cache, before)


def test_update_checks_shapes(tiny_model):
    cache = KVCache.for_model(tiny_model, 2)
    c = tiny_model.config
    k = torch.zeros(2, c.kv_heads + 1, 1, c.d_head, device=tiny_model.device)
    with pytest.raises(ValueError, match=r"k: expected shape \(2, 3, n, 8\)"):
        cache.update(0, k, k)


def test_capacity_outside_limits_is_refused(tiny_model):
    with pytest.raises(ValueError, match="capacity must lie in"):
        KVCache.for_model(tiny_model, 1, capacity=TINY.max_seq_len + 1)


def test_cache_follows_the_model_onto_meta():
    model = GPT(TINY, device="meta")
    cache = KVCache.for_model(model, 2)
    tokens = torch.zeros(2, 5, dtype=torch.long, device="meta")
    logits = model(tokens, cache)
    step = model(tokens[:, :1], cache)
    assert logits.device.type == step.device.type == "meta"
    assert step.shape == (2, 1, TINY.vocab_size)
    assert all(k.device.type == "meta" for k in cache.keys)
    assert cache.length == 6


def test_cpu_and_cuda_caches_agree():
    if not cuda_available():
        pytest.skip("CUDA is not available on this machine")
    device = torch.device("cuda")
    cpu = GPT(TINY, seed=4).eval()
    gpu = GPT(TINY, seed=4).eval().to(device)
    ids = prompt(cpu, b=2, n=5)
    want = list(decode_steps(cpu, ids, 8))
    got = list(decode_steps(gpu, ids.to(device), 8))
    for a, b in zip(want, got):
        torch.testing.assert_close(b.logits.cpu(), a.logits, rtol=1e-4, atol=1e-4)


def test_truncate_forgets_the_tail(tiny_model):
    ids = prompt(tiny_model, b=1, n=9)
    cache = KVCache.for_model(tiny_model, 1)
    with torch.no_grad():
        tiny_model(ids, cache)
        cache.truncate(5)
        again = tiny_model(ids[:, 5:], cache)
        whole = tiny_model(ids)
    torch.testing.assert_close(again, whole[:, 5:])
    with pytest.raises(ValueError, match=r"truncate: length must lie in \[0, 9\], got 10"):
        cache.truncate(10)
