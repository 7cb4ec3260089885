"""Padded batches: each sequence computes exactly what it computes alone."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from llmcore import GPT, KVCache, generate, generate_batch, pad_batch
from conftest import TINY


def random_prompts(lengths, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


def alone(model, prompt, new, **kwargs):
    ids = torch.tensor([prompt], device=model.device)
    return generate(model, ids, new, **kwargs)[0, len(prompt):].tolist()


def test_pad_batch_pads_on_the_left():
    tokens, mask = pad_batch([[5, 6, 7], [8]], pad_id=0)
    assert tokens.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[True, True, True], [False, False, True]]


@pytest.mark.parametrize("bad, message", [([], "at least one prompt"),
                                          ([[1, 2], []], "prompt 1 is empty")])
def test_pad_batch_refuses_empty_input(bad, message):
    with pytest.raises(ValueError, match=message):
        pad_batch(bad)


@pytest.mark.parametrize("use_cache", [False, True])
def test_padded_logits_equal_each_sequence_alone(tiny_gqa_model, use_cache):
    model = tiny_gqa_model
    prompts = random_prompts([3, 9, 1, 6], TINY.vocab_size)
    tokens, mask = pad_batch(prompts, device=model.device)
    cache = KVCache.for_model(model, len(prompts)) if use_cache else None
    with torch.no_grad():
        batched = model(tokens, cache, attention_mask=mask)
        for i, p in enumerate(prompts):
            own = model(torch.tensor([p], device=model.device))
            torch.testing.assert_close(batched[i, -len(p):], own[0])
        # one decode step after the padded prefill still matches each sequence alone
        nxt = torch.tensor([[1], [2], [3], [4]], device=model.device)
        if use_cache:
            step = model(nxt, cache)[:, -1]
            for i, p in enumerate(prompts):
                own = model(torch.tensor([p + [i + 1]], device=model.device))[0, -1]
                torch.testing.assert_close(step[i], own)


@pytest.mark.parametrize("sampling", [dict(), dict(temperature=1.0, seeds=[1, 2, 3, 4])])
@pytest.mark.parametrize("use_cache", [False, True])
def test_generate_batch_equals_each_sequence_alone(tiny_model, sampling, use_cache):
    prompts = random_prompts([4, 1, 7, 2], TINY.vocab_size, seed=1)
    got = generate_batch(tiny_model, prompts, 10, use_cache=use_cache, **sampling)
    settings_alone = {k: v for k, v in sampling.items() if k != "seeds"}
    seeds = sampling.get("seeds", [None] * 4)
    want = [alone(tiny_model, p, 10, seed=s, **settings_alone) for p, s in zip(prompts, seeds)]
    assert got == want


def test_each_sequence_stops_on_its_own(tiny_model):
    prompts = random_prompts([3, 5, 2], TINY.vocab_size, seed=2)
    seeds = [11, 12, 13]                     # sampling: a random model's greedy text repeats
    free_run = [alone(tiny_model, p, 12, temperature=1.0, seed=s) for p, s in zip(prompts, seeds)]
    run = free_run[0]                        # a token sequence 0 first emits at step >= 2:
    first = next((i for i in range(2, len(run)) if run[i] not in run[:i]), None)
    assert first is not None, f"pick another seed: sequence 0 only repeats itself: {run}"
    eos = run[first]
    got = generate_batch(tiny_model, prompts, [12, 4, 12], eos_id=eos, temperature=1.0,
                         seeds=seeds)
    for out, full, limit in zip(got, free_run, [12, 4, 12]):
        stop = full.index(eos) + 1 if eos in full[:limit] else limit
        assert out == full[:stop]
    assert got[0][-1] == eos and len(got[0]) == first + 1
    assert len(got[1]) <= 4


def test_generate_batch_checks_its_arguments(tiny_model):
    with pytest.raises(ValueError, match="one limit per prompt"):
        generate_batch(tiny_model, [[1], [2]], [3])
    with pytest.raises(ValueError, match="one seed per prompt"):
        generate_batch(tiny_model, [[1], [2]], 3, temperature=1.0, seeds=[1])


def test_attention_mask_is_validated(tiny_model):
    tokens = torch.zeros(2, 3, dtype=torch.long, device=tiny_model.device)
    with pytest.raises(ValueError, match=r"attention_mask: expected shape \(2, 3\)"):
        tiny_model(tokens, attention_mask=torch.ones(2, 4, dtype=torch.bool,
                                                     device=tiny_model.device))
    with pytest.raises(TypeError, match="attention_mask: expected bool or integer"):
        tiny_model(tokens, attention_mask=torch.ones(2, 3, device=tiny_model.device))


@settings(max_examples=15, deadline=None)
@given(lengths=st.lists(st.integers(1, 12), min_size=1, max_size=5),
       new=st.integers(1, 6))
def test_any_lengths_batch_like_alone(lengths, new):
    model = GPT(TINY, seed=5).eval()
    prompts = random_prompts(lengths, TINY.vocab_size, seed=len(lengths))
    assert generate_batch(model, prompts, new) == [alone(model, p, new) for p in prompts]
