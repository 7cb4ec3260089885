"""llmcore.generate: greedy generation equals running the model by hand, with or without a cache;
seeded sampling is reproducible and per-sequence seeds give a row the tokens it gets alone; eos
stops a sequence; bad requests are refused before any step runs. (sample: test_sampling.py; the
loop itself: test_decode.py.)"""

from __future__ import annotations

import pytest
import torch

from conftest import TINY, TINY_GQA
from llmcore import decode_steps, generate
from llmcore.model import GPT, GPTConfig
from test_model import randomize


def prompt_ids(config, b=2, n=4, seed=0):
    return torch.randint(0, config.vocab_size, (b, n), generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def model():
    return randomize(GPT(TINY), seed=3).eval()


def test_greedy_generate_equals_argmax_of_the_model_by_hand(model):
    ids = prompt_ids(TINY, b=3, n=4)
    out = generate(model, ids, 9, use_cache=False)
    assert out.shape == (3, 13) and torch.equal(out[:, :4], ids)
    by_hand = ids
    with torch.no_grad():
        for _ in range(9):
            by_hand = torch.cat([by_hand, model(by_hand)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, by_hand)
    assert len(set(out[:, 4:].flatten().tolist())) > 3        # not one token repeated: a real test


def test_decode_steps_yield_the_last_rows_logits(model):
    ids = prompt_ids(TINY, b=2, n=5)
    seen = ids
    for step in decode_steps(model, ids, 4, use_cache=False):
        assert step.logits.shape == (2, TINY.vocab_size) and step.tokens.shape == (2,)
        with torch.no_grad():
            torch.testing.assert_close(step.logits, model(seen)[:, -1])
        seen = torch.cat([seen, step.tokens[:, None]], dim=1)


def test_zero_new_tokens_returns_the_prompt(model):
    ids = prompt_ids(TINY)
    assert torch.equal(generate(model, ids, 0, use_cache=False), ids)


@pytest.mark.parametrize("use_cache", [False, True])
def test_sampled_generation_is_reproducible_and_seed_dependent(model, use_cache):
    ids = prompt_ids(TINY, b=2, n=3)
    a = generate(model, ids, 12, use_cache=use_cache, temperature=0.9, top_k=20, seed=5)
    b = generate(model, ids, 12, use_cache=use_cache, temperature=0.9, top_k=20, seed=5)
    c = generate(model, ids, 12, use_cache=use_cache, temperature=0.9, top_k=20, seed=6)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_per_sequence_seeds_give_the_same_tokens_alone_and_in_a_batch(model):
    ids = prompt_ids(TINY, b=3, n=4, seed=4)
    seeds = [101, 202, 303]
    batch = generate(model, ids, 10, use_cache=False, temperature=1.0, seed=seeds)
    for i, s in enumerate(seeds):
        alone = generate(model, ids[i:i + 1], 10, use_cache=False, temperature=1.0, seed=[s])
        assert torch.equal(batch[i:i + 1], alone), f"row {i}"


def test_eos_stops_a_sequence_and_is_repeated_after(model):
    ids = prompt_ids(TINY, b=2, n=4, seed=9)
    free = generate(model, ids, 10, use_cache=False)
    eos = int(free[0, 4 + 2])                      # what row 0 emits at its third step
    out = generate(model, ids, 10, use_cache=False, eos_id=eos)
    for row in range(2):
        new = free[row, 4:].tolist()
        stop = new.index(eos) if eos in new else None
        if stop is None:                            # never emits eos: unchanged
            assert out[row, 4:].tolist() == new[:out.shape[1] - 4]
        else:                                       # identical up to eos, then eos only
            got = out[row, 4:].tolist()
            assert got[:stop + 1] == new[:stop + 1]
            assert got[stop:] == [eos] * (len(got) - stop)
    assert out[0, 4:].tolist()[:3] == free[0, 4:7].tolist()


def test_generation_ends_once_every_sequence_has_stopped(model):
    ids = prompt_ids(TINY, b=1, n=4, seed=9)
    free = generate(model, ids, 10, use_cache=False)
    eos = int(free[0, 6])                           # the third new token
    first = free[0, 4:].tolist().index(eos)         # (it may appear earlier)
    out = generate(model, ids, 10, use_cache=False, eos_id=eos)
    assert out.shape == (1, 4 + first + 1)          # stopped early: no padding steps
    assert out[0, -1] == eos


def test_cached_and_uncached_greedy_generation_agree(tiny_gqa_model):
    ids = prompt_ids(TINY_GQA, b=2, n=5).to(tiny_gqa_model.device)
    assert torch.equal(generate(tiny_gqa_model, ids, 8, use_cache=True),
                       generate(tiny_gqa_model, ids, 8, use_cache=False))


def test_generation_on_the_device_equals_the_cpu(device):
    model = randomize(GPT(TINY_GQA), seed=4)
    ids = prompt_ids(TINY_GQA, b=2, n=5)
    want = generate(model, ids, 8, use_cache=False)
    got = generate(model.to(device), ids.to(device), 8, use_cache=False)
    assert got.device.type == device.type
    assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("args, kwargs, error, message", [
    ((TINY.max_seq_len - 3, 4), {}, ValueError, r"prompt of 45 tokens \+ max_new_tokens = 4 exceeds max_seq_len = 48"),
    ((4, -1), {}, ValueError, "max_new_tokens must be >= 0, got -1"),
    ((4, 3), dict(temperature=1.0, seed=[1, 2, 3]), ValueError, r"seed: expected one seed per sequence \(2\), got 3"),
    ((4, 3), dict(temperature=-1.0), ValueError, "temperature must be >= 0"),
])
def test_generate_refuses_bad_arguments(model, args, kwargs, error, message):
    n, new = args
    ids = torch.zeros(2, n, dtype=torch.long)
    with pytest.raises(error, match=message):
        generate(model, ids, new, use_cache=False, **kwargs)


def test_generate_refuses_bad_prompts(model):
    with pytest.raises(ValueError, match=r"prompt_ids: expected shape \(b, n\), got \(5,\)"):
        generate(model, torch.zeros(5, dtype=torch.long), 2, use_cache=False)
    with pytest.raises(TypeError, match="prompt_ids: expected a torch.Tensor, got list"):
        list(decode_steps(model, [[1, 2]], 2, use_cache=False))
    with pytest.raises(TypeError, match="tokens: expected integer token ids, got torch.float32"):
        generate(model, torch.zeros(1, 3), 2, use_cache=False)
    with pytest.raises(ValueError, match=r"tokens: ids must lie in \[0, 61\)"):
        generate(model, torch.full((1, 3), 99), 2, use_cache=False)


def test_generate_names_a_non_tensor_prompt(model):
    with pytest.raises(TypeError, match="prompt_ids: expected a torch.Tensor, got list"):
        generate(model, [[1, 2]], 2, use_cache=False)


def test_stopping_generation_early_leaves_grad_mode_alone():
    model = GPT(GPTConfig(vocab_size=11, max_seq_len=16, d_model=8, n_heads=2, n_layers=1))
    steps = decode_steps(model, torch.zeros(1, 2, dtype=torch.long), 5)
    next(steps)                                   # suspended mid-generation, like a break
    assert torch.is_grad_enabled()
    generate(model, torch.zeros(1, 2, dtype=torch.long), 5, eos_id=0)
    assert torch.is_grad_enabled()
