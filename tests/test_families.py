"""llmcore.llama's families (chapter 11): Llama 3.2 (RoPE scaling), Qwen2.5 (q/k/v biases), Qwen3
(q/k norms, head_dim), Mistral (sliding window, rolling cache), SmolLM2 (tied head), each equal
to transformers' model on random weights of its released config.json (layers and vocabulary
shrunk, every other field as released); every config field classified, every unimplemented one
refused by name; the fast path gives the teaching path's greedy tokens for each."""

from __future__ import annotations

import pytest
import torch

from llmcore import reference
from llmcore.generate import generate
from llmcore.kvcache import KVCache, RollingKVCache
from llmcore.llama import (IGNORED_FIELDS, READ_FIELDS, REQUIRED_FIELDS, Llama, LlamaConfig,
                           config_from_hf, from_hf, load_hf_llama, load_llama)
from llmcore.masks import causal_mask, sliding_window_mask
from llmcore.paged import PagedKVCache
from llmcore.rope import RopeScaling, rope_frequencies

transformers = pytest.importorskip("transformers", reason="transformers is not installed")

# The released config.json files (Hugging Face hub, as published), written out in full.
LLAMA_3_2_1B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256}
LLAMA_3_1_8B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
    "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0", "use_cache": True, "vocab_size": 128256}
QWEN2_5_0_5B = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
    "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
    "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.40.1", "use_cache": True, "use_mrope": False,
    "use_sliding_window": False, "vocab_size": 151936}
QWEN3_0_6B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936}
MISTRAL_7B_V0_1 = {
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.34.0.dev0", "use_cache": True, "vocab_size": 32000}
SMOLLM2_135M = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "silu", "hidden_size": 576,
    "initializer_range": 0.041666666666666664, "intermediate_size": 1536,
    "is_llama_config": True, "max_position_embeddings": 8192, "mlp_bias": False,
    "model_type": "llama", "num_attention_heads": 9, "num_hidden_layers": 30,
    "num_key_value_heads": 3, "pad_token_id": None, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_interleaved": False, "rope_scaling": None, "rope_theta": 100000,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.42.3",
    "use_cache": True, "vocab_size": 49152}

RELEASED = {"Llama 3.1 8B": LLAMA_3_1_8B, "Llama 3.2 1B": LLAMA_3_2_1B, "Qwen2.5 0.5B": QWEN2_5_0_5B,
            "Qwen3 0.6B": QWEN3_0_6B, "Mistral 7B v0.1": MISTRAL_7B_V0_1,
            "SmolLM2 135M": SMOLLM2_135M}
CLASSES = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config",
           "mistral": "MistralConfig"}
VOCAB = 256


def shrunk(fields: dict, n_layers: int = 2) -> dict:
    """The released config with fewer layers and a small vocabulary, every other field kept."""
    return {**fields, "num_hidden_layers": n_layers, "vocab_size": VOCAB}


def hf_model(fields: dict, seed: int = 0, scale: float = 3.0):
    """transformers' model for a config.json (random weights, never downloaded)."""
    config_class = getattr(transformers, CLASSES[fields["model_type"]])
    config = config_class.from_dict(fields)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():                # larger weights: logits far apart, a wrong piece shows
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.mul_(scale)
    return model


def tokens(b=2, n=12, seed=1):
    return torch.randint(0, VOCAB, (b, n), generator=torch.Generator().manual_seed(seed))


# -- every field of every supported config class is classified; unimplemented ones refused ----

@pytest.mark.parametrize("family", sorted(CLASSES))
def test_every_field_of_the_config_class_is_read_required_or_ignored(family):
    config = getattr(transformers, CLASSES[family])()
    known = set(READ_FIELDS) | set(REQUIRED_FIELDS) | set(IGNORED_FIELDS)
    fields = config.to_dict()
    assert not sorted(set(fields) - known), "fields llmcore has not classified"
    config_from_hf(config)                                    # the defaults are accepted


@pytest.mark.parametrize("name", sorted(RELEASED))
def test_every_field_of_the_released_config_json_is_classified(name):
    fields = RELEASED[name]
    known = set(READ_FIELDS) | set(REQUIRED_FIELDS) | set(IGNORED_FIELDS)
    assert set(fields) <= known
    config_from_hf(fields)


@pytest.mark.parametrize("family", sorted(CLASSES))
def test_each_required_field_with_another_value_is_refused_by_name(family):
    fields = getattr(transformers, CLASSES[family])().to_dict()
    others = {"hidden_act": "gelu", "mlp_bias": True, "attention_bias": True,
              "is_encoder_decoder": True, "chunk_size_feed_forward": 4, "use_mrope": True,
              "rope_interleaved": True}
    assert set(others) == set(REQUIRED_FIELDS)
    for field, value in others.items():
        with pytest.raises(ValueError, match=field):
            config_from_hf({**fields, field: value})
    with pytest.raises(ValueError, match="new_field"):
        config_from_hf({**fields, "new_field": 1})


def test_read_fields_change_the_config_or_are_refused():
    """No read field is dropped silently: changing it changes the LlamaConfig or is refused."""
    base = shrunk(LLAMA_3_2_1B)
    changed = {"vocab_size": 300, "hidden_size": 1024, "num_attention_heads": 16,
               "num_key_value_heads": 4, "num_hidden_layers": 3, "intermediate_size": 4096,
               "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "head_dim": 128,
               "rope_theta": 10000.0, "rope_scaling": {**base["rope_scaling"], "factor": 8.0},
               "tie_word_embeddings": False}
    for field, value in changed.items():
        assert config_from_hf({**base, field: value}) != config_from_hf(base), field
    with pytest.raises(ValueError, match="yarn"):
        config_from_hf({**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        config_from_hf({**base, "rope_parameters": {"rope_theta": 1e4, "rope_type": "default",
                                                    "partial_rotary_factor": 0.5}})
    with pytest.raises(ValueError, match="gemma3"):
        config_from_hf({**base, "model_type": "gemma3"})
    qwen = shrunk(QWEN2_5_0_5B)
    assert config_from_hf(qwen).sliding_window is None          # use_sliding_window false
    with pytest.raises(ValueError, match="mixes full and sliding"):
        config_from_hf({**qwen, "use_sliding_window": True, "max_window_layers": 1})
    assert config_from_hf({**qwen, "use_sliding_window": True,
                           "max_window_layers": 0}).sliding_window == 32768
    assert config_from_hf(shrunk(MISTRAL_7B_V0_1)).sliding_window == 4096


def test_each_family_reads_its_diff():
    assert config_from_hf(LLAMA_3_2_1B).rope_scaling == RopeScaling(32.0, 1.0, 4.0, 8192)
    assert config_from_hf(LLAMA_3_2_1B).rope_base == 500000.0
    qwen2 = config_from_hf(QWEN2_5_0_5B)
    assert qwen2.qkv_bias and not qwen2.qk_norm and qwen2.rope_base == 1e6
    qwen3 = config_from_hf(QWEN3_0_6B)
    assert qwen3.qk_norm and qwen3.d_head == 128 and qwen3.d_model // qwen3.n_heads == 64
    assert config_from_hf(MISTRAL_7B_V0_1).sliding_window == 4096
    smol = config_from_hf(SMOLLM2_135M)
    assert smol == LlamaConfig(vocab_size=49152, max_seq_len=8192, d_model=576, n_heads=9,
                               n_layers=30, n_kv_heads=3, d_ff=1536, rms_eps=1e-5,
                               rope_base=100000.0, tie_embeddings=True)


TINY = dict(vocab_size=97, max_seq_len=48, d_model=64, n_heads=4, n_kv_heads=2, n_layers=2,
            d_ff=160)


@pytest.mark.parametrize("diff", [
    {}, {"rope_scaling": RopeScaling(8.0, 1.0, 4.0, 16), "rope_base": 500000.0},
    {"qkv_bias": True, "rope_base": 1e6}, {"qk_norm": True, "head_dim": 32},
    {"sliding_window": 5}, {"tie_embeddings": True}], ids=lambda d: ",".join(d) or "llama")
def test_float64_logits_of_each_diff_equal_the_numpy_reference(diff):
    config = LlamaConfig(**TINY, **diff)
    model = Llama(config, dtype=torch.float64, seed=5).eval()
    with torch.no_grad():                           # larger weights (and biases): a wrong piece
        for p in model.parameters():                # shows clearly
            p.add_(torch.randn_like(p) * 0.2) if p.ndim == 1 else p.mul_(5.0)
        ids = tokens(n=14) % 97
        got = model(ids)
    want = reference.llama_forward(model.state_dict(), ids.numpy(), n_heads=4, n_kv_heads=2,
                                   eps=config.rms_eps, base=config.rope_base,
                                   scaling=config.rope_scaling, window=config.sliding_window)
    torch.testing.assert_close(got, torch.from_numpy(want), rtol=1e-9, atol=1e-9)


def test_reference_rope_scaling_equals_the_tensor_form():
    scaling = RopeScaling(32.0, 1.0, 4.0, 8192)
    theta = rope_frequencies(64, 500000.0, dtype=torch.float64)
    torch.testing.assert_close(torch.from_numpy(reference.scale_frequencies(theta.numpy(),
                                                                            scaling)),
                               rope_frequencies(64, 500000.0, dtype=torch.float64,
                                                scaling=scaling), rtol=1e-12, atol=0)
    assert (reference.sliding_window_mask(5, 9, 3) == sliding_window_mask(5, 9, 3).numpy()).all()


@pytest.mark.parametrize("fields", [LLAMA_3_1_8B, LLAMA_3_2_1B], ids=["3.1 8B", "3.2 1B"])
def test_llama3_frequencies_equal_hugging_face_and_keep_the_fast_pairs(fields):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    config = transformers.LlamaConfig.from_dict(fields)
    want, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    ours = config_from_hf(fields)
    factor = fields["rope_scaling"]["factor"]
    assert ours.rope_scaling == RopeScaling(factor, 1.0, 4.0, 8192)
    got = rope_frequencies(ours.d_head, ours.rope_base, scaling=ours.rope_scaling)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    plain = rope_frequencies(ours.d_head, ours.rope_base)
    assert torch.equal(got[:8], plain[:8])                               # fast pairs kept
    torch.testing.assert_close(got[-4:], plain[-4:] / factor)             # slow ones / factor


# -- each family equals transformers on random weights of its released config -----------------

FAMILY_CASES = {"Llama 3.2 1B": (LLAMA_3_2_1B, 2), "Qwen2.5 0.5B": (QWEN2_5_0_5B, 2),
                "Qwen3 0.6B": (QWEN3_0_6B, 2), "Mistral 7B v0.1": (MISTRAL_7B_V0_1, 1),
                "SmolLM2 135M": (SMOLLM2_135M, 2)}


@pytest.mark.parametrize("name", sorted(FAMILY_CASES))
def test_logits_and_greedy_tokens_equal_hugging_face(name):
    released, n_layers = FAMILY_CASES[name]
    fields = shrunk(released, n_layers)
    hf = hf_model(fields)
    model = from_hf(hf).eval()
    assert model.config == config_from_hf(fields)                     # config.json == to_dict()
    assert model.num_parameters() >= sum(p.numel() for p in hf.parameters())
    prompt = tokens()
    with torch.no_grad():
        want, got = hf(prompt).logits, model(prompt)
    assert want.abs().max() > 1.0
    difference = (got - want).abs().max().item()
    print(f"{name}: max |logit difference| {difference:.2e}")
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    new = 8
    cache = KVCache.for_model(model, 2, max_tokens=prompt.shape[1] + new)
    ours = generate(model, prompt, new, cache=cache)
    theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new,
                         do_sample=False, pad_token_id=0)
    assert torch.equal(ours, theirs)


def test_load_llama_reads_config_json_and_safetensors(tmp_path):
    hf = hf_model(shrunk(QWEN3_0_6B, 1))
    hf.save_pretrained(tmp_path)
    model = load_llama(tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(model(tokens()), hf(tokens()).logits, rtol=1e-4, atol=1e-4)


# -- Mistral's sliding window: the band mask and the rolling cache -----------------------------

SLIDING = {**MISTRAL_7B_V0_1, "hidden_size": 64, "intermediate_size": 160,
           "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
           "max_position_embeddings": 128, "sliding_window": 16, "vocab_size": VOCAB}


def test_sliding_window_mask_is_the_causal_band():
    assert sliding_window_mask(3, 5, 2).int().tolist() == [[0, 1, 1, 0, 0], [0, 0, 1, 1, 0],
                                                           [0, 0, 0, 1, 1]]
    assert torch.equal(sliding_window_mask(6, 6, 6), causal_mask(6, 6))
    itself = torch.ones(4, 9, dtype=torch.bool).triu(5).tril(5)        # query i is key 5 + i
    assert torch.equal(sliding_window_mask(4, 9, 1), itself)


def test_mistral_window_shorter_than_the_input_equals_hugging_face():
    """The issue's case: window 16, 60 tokens (once 0.79 off, silently)."""
    hf = hf_model(SLIDING, seed=2, scale=5.0)
    model = from_hf(hf)
    prompt = tokens(b=2, n=60, seed=3)
    with torch.no_grad():
        want, got = hf(prompt).logits, model(prompt)
        full = from_hf(hf_model({**SLIDING, "sliding_window": None}, seed=2, scale=5.0))(prompt)
    assert (full - want).abs().max() > 1e-2              # the window matters on this input
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["KVCache", "RollingKVCache"])
def test_mistral_cached_decoding_and_greedy_tokens_equal_hugging_face(kind):
    hf = hf_model(SLIDING, seed=4, scale=5.0)
    model = from_hf(hf)
    prompt = tokens(b=2, n=20, seed=5)
    make = KVCache.for_model if kind == "KVCache" else RollingKVCache.for_model
    cache = make(model, 2)
    ours = generate(model, prompt, 30, cache=cache)
    theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=30,
                         do_sample=False, pad_token_id=0)
    assert torch.equal(ours, theirs)
    if kind == "RollingKVCache":
        assert cache.length == 49 and cache.keys[0].shape[2] == 16   # only the last window
    with torch.no_grad():
        torch.testing.assert_close(model(ours), hf(ours).logits, rtol=1e-4, atol=1e-4)


def test_rolling_cache_step_by_step_equals_the_whole_sequence():
    model = from_hf(hf_model(SLIDING, seed=6, scale=5.0))
    sequence = tokens(b=1, n=40, seed=7)
    cache = RollingKVCache.for_model(model, 1)
    with torch.no_grad():
        whole = model(sequence)
        steps = [model(sequence[:, :23], cache)]                       # prefill past the window
        steps += [model(sequence[:, i:i + 1], cache) for i in range(23, 40)]
    torch.testing.assert_close(torch.cat(steps, dim=1), whole, rtol=1e-5, atol=1e-5)


def test_left_padded_sliding_window_batch_equals_each_prompt_alone():
    model = from_hf(hf_model(SLIDING, seed=9, scale=5.0))
    short, long = tokens(b=1, n=14, seed=10), tokens(b=1, n=20, seed=11)
    batch = torch.cat([torch.cat([torch.zeros(1, 6, dtype=torch.long), short], dim=1), long])
    mask = torch.cat([torch.cat([torch.zeros(1, 6), torch.ones(1, 14)], dim=1),
                      torch.ones(1, 20)]).long()
    together = generate(model, batch, 12, attention_mask=mask)
    assert torch.equal(together[0, 6:], generate(model, short, 12)[0])
    assert torch.equal(together[1], generate(model, long, 12)[0])


def test_tied_head_must_agree_with_the_embedding():
    hf = hf_model(shrunk(SMOLLM2_135M, 1))
    state = dict(hf.state_dict())
    state["lm_head.weight"] = state["lm_head.weight"] + 1.0
    with pytest.raises(ValueError, match="tie_word_embeddings"):
        load_hf_llama(state, config_from_hf(hf.config))


def test_a_cache_that_cannot_band_is_refused_past_the_window():
    model = from_hf(hf_model(SLIDING, seed=8))
    pages = PagedKVCache.for_model(model, block_size=4, num_blocks=16)
    pages.add_sequence("a")
    with torch.no_grad():
        model(tokens(b=1, n=10), pages.batch(["a"]))             # within the window: served
        with pytest.raises(ValueError, match="sliding-window attention over 20 > 16"):
            model(tokens(b=1, n=10), pages.batch(["a"]))


# -- the fast path serves every family (tests/test_fastpath_families.py: every precision) --------

@pytest.mark.parametrize("name", sorted(FAMILY_CASES))
def test_fast_path_gives_the_teaching_tokens_on_each_released_config(name):
    """The released widths (GQA ratios, head_dim, rope_theta, scaling) on the fast path; the
    teaching path equals transformers above."""
    released, n_layers = FAMILY_CASES[name]
    model = from_hf(hf_model(shrunk(released, n_layers), seed=12)).eval()
    prompt = tokens(n=6, seed=13)
    assert torch.equal(generate(model, prompt, 8, fast=True), generate(model, prompt, 8))


def test_fast_path_decodes_past_mistrals_window_as_hugging_face():
    hf = hf_model(SLIDING, seed=4, scale=5.0)
    model = from_hf(hf)
    for n in (6, 20):                                  # a prompt within the window, and past it
        prompt = tokens(b=2, n=n, seed=5)
        theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=30,
                             do_sample=False, pad_token_id=0)
        assert torch.equal(generate(model, prompt, 30, fast=True), theirs)
