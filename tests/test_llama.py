"""llmcore.llama: equal to Hugging Face transformers' LlamaForCausalLM on random weights of a small
config (logits, cached decoding, greedy tokens, also on the fast path); keys cached already
rotated; the GQA cache costs 2 L h_kv d_head elements per token; padding, devices and bad
configs."""

from __future__ import annotations

import pytest
import torch

from llmcore import reference
from llmcore.generate import generate
from llmcore.kvcache import KVCache, kv_bytes_per_token
from llmcore.llama import Llama, LlamaConfig, config_from_hf, from_hf, load_hf_llama
from llmcore.multihead import split_heads
from llmcore.rope import apply_rope

SMALL = LlamaConfig(vocab_size=97, max_seq_len=48, d_model=64, n_heads=4, n_kv_heads=2,
                    n_layers=2, d_ff=160)


def hf_llama(seed: int = 0, **overrides):
    """A random transformers LlamaForCausalLM of SMALL's sizes (never downloaded)."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    sizes = dict(vocab_size=97, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                 num_hidden_layers=2, intermediate_size=160, max_position_embeddings=48,
                 tie_word_embeddings=False)
    sizes.update(overrides)
    config = transformers.LlamaConfig(**sizes)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():               # larger weights: logits far apart, so greedy ties are rare
        for p in model.parameters():
            if p.ndim == 2:
                p.mul_(5.0)
    return model


def prompt(b=2, n=9, seed=1):
    return torch.randint(0, 97, (b, n), generator=torch.Generator().manual_seed(seed))


def test_float64_logits_equal_the_numpy_reference():
    model = Llama(SMALL, dtype=torch.float64, seed=5).eval()
    with torch.no_grad():                       # larger weights: a wrong piece shows clearly
        for p in model.parameters():
            p.mul_(5.0)
        got = model(prompt())
    want = reference.llama_forward(model.state_dict(), prompt().numpy(), n_heads=SMALL.n_heads,
                                   n_kv_heads=SMALL.kv_heads, eps=SMALL.rms_eps)
    assert abs(want).max() > 1.0
    torch.testing.assert_close(got, torch.from_numpy(want), rtol=1e-9, atol=1e-9)


def test_config_from_hf_reads_every_size():
    hf = hf_llama()
    assert config_from_hf(hf.config) == SMALL
    assert from_hf(hf).num_parameters() == sum(p.numel() for p in hf.parameters())


def test_logits_equal_hugging_face():
    hf = hf_llama()
    model = from_hf(hf)
    tokens = prompt()
    with torch.no_grad():
        want = hf(tokens).logits
        got = model(tokens)
    assert want.abs().max() > 1.0                 # the comparison is not between near-zeros
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_cached_decoding_equals_hugging_face_with_its_dynamic_cache():
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    hf = hf_llama(seed=3)
    model = from_hf(hf)
    tokens = prompt(n=6)
    cache, hf_cache = KVCache.for_model(model, 2), transformers.DynamicCache(config=hf.config)
    new = tokens
    with torch.no_grad():
        for _ in range(5):
            got = model(new, cache)
            out = hf(new, past_key_values=hf_cache, use_cache=True)
            torch.testing.assert_close(got, out.logits, rtol=1e-4, atol=1e-4)
            new = got[:, -1].argmax(dim=-1, keepdim=True)
    assert cache.length == 6 + 4


def test_greedy_tokens_equal_hugging_face_with_and_without_cache_and_on_the_fast_path():
    hf = hf_llama(seed=4)
    model = from_hf(hf)
    tokens = prompt(n=7, seed=5)
    with_cache = generate(model, tokens, 12)
    without = generate(model, tokens, 12, use_cache=False)
    fast = generate(model, tokens, 12, fast=True)
    theirs = hf.generate(tokens, attention_mask=torch.ones_like(tokens), max_new_tokens=12,
                         do_sample=False, pad_token_id=0)
    assert torch.equal(with_cache, without)
    assert torch.equal(with_cache, fast)
    assert torch.equal(with_cache, theirs)


def test_cached_keys_are_stored_rotated():
    model = Llama(SMALL, seed=7).eval()
    tokens = prompt(b=1, n=8)
    cache = KVCache.for_model(model, 1)
    with torch.no_grad():
        model(tokens[:, :5], cache)
        model(tokens[:, 5:6], cache)                          # one decoding step
        attention = model.blocks[0].attention
        x = model.blocks[0].attn_norm(model.token_embedding[tokens[:, :6]])
        k = split_heads(x @ attention.w_k, SMALL.kv_heads)    # (1, h_kv, 6, d_head), unrotated
        rotated = apply_rope(k, torch.arange(6))
    torch.testing.assert_close(cache.keys[0][:, :, :6], rotated)
    assert not torch.allclose(cache.keys[0][:, :, 1:6], k[:, :, 1:6])   # rotation changed them


def test_gqa_cache_bytes_per_token():
    model = Llama(SMALL).eval()
    cache = KVCache.for_model(model, 2)
    with torch.no_grad():
        model(prompt(n=10), cache)
    per_token = cache.used_bytes() / (2 * 10)
    assert per_token == 2 * SMALL.n_layers * SMALL.kv_heads * SMALL.d_head * 4
    assert per_token == kv_bytes_per_token(SMALL.n_layers, SMALL.kv_heads, SMALL.d_head, 4)
    assert cache.keys[0].shape[1] == SMALL.kv_heads == SMALL.n_heads // 2   # half of multi-head's


def test_hugging_face_cache_holds_the_same_number_of_kv_heads():
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    hf = hf_llama()
    hf_cache = transformers.DynamicCache(config=hf.config)
    with torch.no_grad():
        hf(prompt(n=10), past_key_values=hf_cache, use_cache=True)
    keys = hf_cache.layers[0].keys
    assert tuple(keys.shape) == (2, SMALL.kv_heads, 10, SMALL.d_head)
    per_token = sum(t.numel() * t.element_size() for layer in hf_cache.layers
                    for t in (layer.keys, layer.values)) / (2 * 10)
    assert per_token == kv_bytes_per_token(SMALL.n_layers, SMALL.kv_heads, SMALL.d_head, 4)


def test_left_padded_batch_equals_each_prompt_alone():
    model = Llama(SMALL, seed=2).eval()
    short, long = prompt(b=1, n=4, seed=8), prompt(b=1, n=7, seed=9)
    batch = torch.cat([torch.cat([torch.zeros(1, 3, dtype=torch.long), short], dim=1), long])
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [1] * 7])
    together = generate(model, batch, 5, attention_mask=mask)
    assert torch.equal(together[0, 3:], generate(model, short, 5)[0])
    assert torch.equal(together[1], generate(model, long, 5)[0])


def test_meta_device_builds_shapes_only():
    model = Llama(SMALL, device="meta")
    logits = model(torch.zeros(2, 5, dtype=torch.long, device="meta"))
    assert logits.device.type == "meta" and logits.shape == (2, 5, SMALL.vocab_size)


def test_follows_the_device(device):
    model = Llama(SMALL, seed=3).eval()
    tokens = prompt()
    with torch.no_grad():
        want = model(tokens)
        got = model.to(device)(tokens.to(device))
    assert got.device.type == device.type
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)


def test_refuses_what_it_does_not_implement():
    with pytest.raises(ValueError, match="attention_bias"):
        config_from_hf(hf_llama(attention_bias=True).config)
    with pytest.raises(ValueError, match="d_head = 3 must be even"):
        LlamaConfig(d_model=12, n_heads=4)
    state = hf_llama().state_dict()
    del state["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(KeyError, match="model.layers.1.mlp.up_proj.weight"):
        load_hf_llama(state, SMALL)


def test_tied_embeddings_load_as_the_embedding_transposed():
    hf = hf_llama(tie_word_embeddings=True)
    model = from_hf(hf)
    torch.testing.assert_close(model.lm_head, model.token_embedding.T, rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(model(prompt()), hf(prompt()).logits, rtol=1e-4, atol=1e-4)
