"""llmcore.sampling: greedy is argmax, seeded sampling is reproducible and follows
softmax(logits / T), top-k never leaves the top k, per-row generators make a row's draws
independent of its batch, bad settings are refused, and a picker checks its settings once."""

from __future__ import annotations

import pytest
import torch

from llmcore.sampling import sample, seeded_generators, token_picker
from llmcore.softmax import softmax


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


def test_a_picker_is_greedy_or_samples_with_its_own_generators(rng):
    logits = torch.from_numpy(rng.standard_normal((3, 25))).float()
    greedy = token_picker(temperature=0.0, top_k=None, seed=None, b=3, device="cpu")
    assert torch.equal(greedy(logits), logits.argmax(dim=-1))
    first, second = (token_picker(temperature=1.0, top_k=5, seed=[4, 5, 6], b=3,
                                  device="cpu")(logits) for _ in range(2))
    assert torch.equal(first, second)                        # each picker: fresh generators
    alone = token_picker(temperature=1.0, top_k=5, seed=[5], b=1, device="cpu")
    assert torch.equal(first[1:2], alone(logits[1:2]))       # row 1 draws as if alone
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        token_picker(temperature=-1.0, top_k=None, seed=None, b=3, device="cpu")
    with pytest.raises(ValueError, match=r"seed: expected one seed per sequence \(3\), got 2"):
        seeded_generators([1, 2], 3, "cpu")
