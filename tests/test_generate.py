"""llmcore.generate: greedy is argmax, seeded sampling is reproducible and follows softmax(logits / T),
top-k never leaves the top k, per-row generators make a row's draws independent of its batch, eos
stops a sequence, and the generation loop equals running the model by hand."""

from __future__ import annotations

import pytest
import torch

from conftest import TINY, TINY_GQA
from llmcore import decode_steps, generate, sample
from llmcore.model import GPT, GPTConfig
from llmcore.softmax import softmax
from test_model import randomize


def prompt_ids(config, b=2, n=4, seed=0):
    return torch.randint(0, config.vocab_size, (b, n), generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def model():
    return randomize(GPT(TINY), seed=3).eval()


# ---------------------------------------------------------------------------------------- sample

def test_greedy_is_argmax(rng):
    logits = torch.from_numpy(rng.standard_normal((5, 11))).float()
    assert torch.equal(sample(logits), logits.argmax(dim=-1))
    assert torch.equal(sample(logits, temperature=0.0, top_k=3), logits.argmax(dim=-1))
    assert torch.equal(sample(logits, temperature=1.0, top_k=1,
                              generator=torch.Generator().manual_seed(0)), logits.argmax(dim=-1))


def test_seeded_sampling_is_reproducible(rng):
    logits = torch.from_numpy(rng.standard_normal((6, 40))).float()

    def draws(seed):
        g = torch.Generator().manual_seed(seed)
        return torch.stack([sample(logits, temperature=1.5, generator=g) for _ in range(5)])

    assert torch.equal(draws(7), draws(7))
    assert not torch.equal(draws(7), draws(8))


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_draws_follow_softmax_of_logits_over_temperature(temperature):
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    draws = sample(logits.expand(8000, 5), temperature=temperature,
                   generator=torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=5).float() / 8000
    want = softmax(logits / temperature)
    torch.testing.assert_close(freq, want, rtol=0, atol=0.025)   # ~5 standard errors


def test_top_k_never_picks_outside_the_top_k():
    """The tail is individually smaller but collectively most of the mass (about 82% here), so a
    sampler that ignored top_k would leave the top 3 thousands of times in 3000 draws."""
    logits = torch.cat([torch.tensor([1.0, 0.9, 0.8]), torch.full((17,), 0.7)])
    logits = logits[torch.randperm(20, generator=torch.Generator().manual_seed(1))]   # shuffled
    top = set(logits.topk(3).indices.tolist())
    draws = sample(logits.expand(3000, 20), temperature=1.0, top_k=3,
                   generator=torch.Generator().manual_seed(2))
    assert set(draws.tolist()) == top                     # every top-k token drawn, nothing else
    untruncated = sample(logits.expand(3000, 20), temperature=1.0,
                         generator=torch.Generator().manual_seed(2))
    assert not set(untruncated.tolist()) <= top           # the test can tell the difference


def test_per_row_generators_draw_the_same_alone_and_in_a_batch(rng):
    logits = torch.from_numpy(rng.standard_normal((3, 25))).float()
    seeds = [11, 22, 33]
    batch_gens = [torch.Generator().manual_seed(s) for s in seeds]
    alone_gens = [torch.Generator().manual_seed(s) for s in seeds]
    for _ in range(6):
        batch = sample(logits, temperature=1.0, top_k=10, generator=batch_gens)
        alone = [sample(logits[i:i + 1], temperature=1.0, top_k=10, generator=[alone_gens[i]])
                 for i in range(3)]
        assert torch.equal(batch, torch.cat(alone))


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(temperature=-0.5), ValueError, "temperature must be >= 0, got -0.5"),
    (dict(temperature=1.0, top_k=0), ValueError, "top_k must be positive, got 0"),
    (dict(temperature=1.0, generator=[torch.Generator()]), ValueError, r"generator: expected one per row \(2\), got 1"),
])
def test_sample_refuses_bad_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        sample(torch.zeros(2, 5), **kwargs)


def test_sample_wants_one_row_of_logits_per_sequence():
    with pytest.raises(ValueError, match=r"logits: expected shape \(b, v\), got \(2, 3, 5\)"):
        sample(torch.zeros(2, 3, 5))
    with pytest.raises(TypeError, match="logits: expected a torch.Tensor"):
        sample([[0.0, 1.0]])


# -------------------------------------------------------------------------------------- generate

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
