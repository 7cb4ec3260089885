"""llmcore.speculative: drafts, verification on the cache and its rollback, greedy and sampled
acceptance (loop == matrix == NumPy), greedy speculative decoding == plain greedy decoding on the
shipped model, and the sampled output's distribution == the target's (exact enumeration, and a
chi-square test of the whole loop)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from conftest import TINY
from llmcore import reference
from llmcore.generate import generate
from llmcore.kvcache import KVCache
from llmcore.model import GPT, GPTConfig
from llmcore.paged import PagedKVCache
from llmcore.pretrained import load_pretrained
from llmcore.speculative import (ModelDraft, PagedSequence, PromptLookupDraft, accept_greedy,
                                 accept_greedy_loop, accept_sampled, accept_sampled_loop,
                                 draw, expected_tokens_per_forward, prompt_lookup,
                                 prompt_lookup_loop, residual_distribution, speculative_decode,
                                 truncated_model, verify, verify_loop)
from llmcore.tokenizer import encode_tensor

META = torch.device("meta")

CODE = '''    def truncate(self, length: int) -> None:
        """Forget every token from length on."""
        if not 0 <= length <= self.length:
            raise ValueError(f"truncate: length must lie in [0, {self.length}], got {length}")
        self.length = length

    def tokens_held(self) -> int:
'''
"""Real code text, with the repetitions prompt lookup feeds on."""


@pytest.fixture(scope="module")
def shipped():
    return load_pretrained().eval()


def shipped_on(shipped, device):
    return shipped if device.type == "cpu" else load_pretrained().to(device).eval()


# ------------------------------------------------------------------ prompt lookup

LOOKUPS = [([1, 2, 3, 9, 9, 1, 2, 3], 3, 3, [9, 9, 1]),     # the 3-gram recurs
           ([1, 2, 3, 4, 1, 2, 3], 2, 3, [4, 1]),           # k cuts the continuation
           ([5, 1, 7, 6, 2, 7], 4, 3, [6, 2, 7]),           # only the 1-gram 7 recurs
           ([4, 1, 2, 8, 1, 2, 9, 1, 2], 2, 2, [9, 1]),     # the most recent occurrence wins
           ([1, 2, 3, 4], 3, 3, []),                        # nothing recurs
           ([7], 3, 3, []),                                 # one token
           ([3, 3, 3, 3], 5, 2, [3])]                       # overlapping, runs up to the end


@pytest.mark.parametrize("impl", [prompt_lookup_loop, prompt_lookup])
@pytest.mark.parametrize("tokens, k, ngram, want", LOOKUPS)
def test_prompt_lookup_literal(impl, tokens, k, ngram, want, device):
    got = impl(torch.tensor(tokens, device=device), k, ngram=ngram)
    assert got.tolist() == want
    assert reference.prompt_lookup(np.array(tokens), k, ngram=ngram).tolist() == want


@pytest.mark.parametrize("seed", range(6))
def test_prompt_lookup_loop_matrix_reference_agree(seed, device):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 4, size=int(rng.integers(2, 40)))
    for k, ngram in ((1, 1), (3, 2), (5, 4)):
        want = reference.prompt_lookup(tokens, k, ngram=ngram).tolist()
        t = torch.as_tensor(tokens, device=device)
        assert prompt_lookup_loop(t, k, ngram=ngram).tolist() == want
        assert prompt_lookup(t, k, ngram=ngram).tolist() == want


# ------------------------------------------------------------------ acceptance rungs

def greedy_case(rng, k, v, agree, device):
    """A draft whose first ``agree`` tokens are the argmax of their rows, then one that is not."""
    logits = torch.as_tensor(rng.normal(size=(k + 1, v)), device=device)
    best = logits.argmax(dim=-1)
    draft = best[:k].clone()
    if agree < k:
        draft[agree] = (draft[agree] + 1) % v
        draft[agree + 1:] = torch.as_tensor(rng.integers(0, v, size=k - agree - 1), device=device)
    return draft, logits


@pytest.mark.parametrize("k, v", [(1, 5), (4, 7), (6, 3)])
def test_accept_greedy_rungs_agree(k, v, device, rng):
    drafts, rows = [], []
    for agree in range(k + 1):
        draft, logits = greedy_case(rng, k, v, agree, device)
        a_loop, next_loop = accept_greedy_loop(draft, logits)
        a, nxt = accept_greedy(draft, logits)
        want = reference.accept_greedy(draft.cpu().numpy(), logits.cpu().numpy())
        assert (int(a_loop), int(next_loop)) == (int(a), int(nxt)) == want
        assert want[0] == agree and want[1] == int(logits[agree].argmax())
        drafts.append(draft)
        rows.append(logits)
    a, nxt = accept_greedy(torch.stack(drafts), torch.stack(rows))      # a batch at once
    assert a.tolist() == list(range(k + 1))


def sampled_case(rng, k, v, device, deterministic=False):
    p = torch.as_tensor(rng.dirichlet(np.full(v, 0.7), size=k + 1), device=device)
    q = None if deterministic else torch.as_tensor(rng.dirichlet(np.full(v, 0.7), size=k),
                                                   device=device)
    draft = torch.as_tensor(rng.integers(0, v, size=k), device=device)
    u = torch.as_tensor(rng.uniform(size=k), device=device)
    u_draw = torch.as_tensor(rng.uniform(), device=device)
    return draft, p, q, u, u_draw


@pytest.mark.parametrize("deterministic", [False, True], ids=["q", "one-hot"])
@pytest.mark.parametrize("k, v", [(1, 4), (3, 6), (5, 3)])
def test_accept_sampled_rungs_agree(k, v, deterministic, device, rng):
    cases = [sampled_case(rng, k, v, device, deterministic) for _ in range(40)]
    outcomes = set()
    for draft, p, q, u, u_draw in cases:
        got_loop = tuple(int(t) for t in accept_sampled_loop(draft, p, q, u, u_draw))
        got = tuple(int(t) for t in accept_sampled(draft, p, q, u, u_draw))
        want = reference.accept_sampled(draft.cpu().numpy(), p.cpu().numpy(),
                                        None if q is None else q.cpu().numpy(),
                                        u.cpu().numpy(), float(u_draw))
        assert got_loop == got == want
        outcomes.add(got[0])
    assert len(outcomes) > 1, "the cases never left the first outcome: too easy"
    batch = [torch.stack(parts) for parts in zip(*[c for c in cases])] if not deterministic \
        else [torch.stack([c[i] for c in cases]) for i in (0, 1)] + [None] + \
        [torch.stack([c[i] for c in cases]) for i in (3, 4)]
    a, nxt = accept_sampled(*batch)
    assert [(int(x), int(y)) for x, y in zip(a, nxt)] == \
        [tuple(int(t) for t in accept_sampled(*c)) for c in cases]


def test_residual_distribution(device, rng):
    p = torch.as_tensor(rng.dirichlet(np.ones(6), size=4), device=device)
    q = torch.as_tensor(rng.dirichlet(np.ones(6), size=4), device=device)
    r = residual_distribution(p, q)
    torch.testing.assert_close(r.cpu(), torch.from_numpy(reference.residual_distribution(
        p.cpu().numpy(), q.cpu().numpy())))
    torch.testing.assert_close(r.sum(-1), torch.ones(4, dtype=r.dtype, device=device))
    assert bool((r[p <= q] == 0).all())
    torch.testing.assert_close(residual_distribution(p, p), p)    # nothing to reject: p


def test_draw_is_the_inverse_cdf(device):
    probs = torch.tensor([0.2, 0.0, 0.5, 0.3], dtype=torch.float64, device=device)
    got = [int(draw(probs, torch.tensor(u, dtype=torch.float64, device=device)))
           for u in (0.0, 0.19, 0.2, 0.69, 0.7, 0.999999)]
    assert got == [0, 0, 2, 2, 3, 3]


# ------------------------------------------------------------------ the sampled distribution

V, K, T = 3, 2, 3
"""Exact enumeration: vocabulary 3, 2 drafted tokens per round, the first 3 emitted tokens."""


def table(context: tuple, salt: int) -> np.ndarray:
    """A made-up model: a distribution over V tokens for every context (from a seeded rng)."""
    rng = np.random.default_rng(abs(hash((salt,) + context)) % 2**32)
    probs = rng.dirichlet(np.full(V, 0.6))
    return probs


def cells(*rows: np.ndarray) -> list[tuple[float, float]]:
    """[0, 1) cut at every cumulative probability of the rows: (midpoint, width) of each cell."""
    cuts = sorted({0.0, 1.0} | {float(c) for row in rows for c in np.cumsum(row) / row.sum()
                                if 0 < c < 1})
    return [((lo + hi) / 2, hi - lo) for lo, hi in zip(cuts, cuts[1:]) if hi > lo]


def round_outcomes(context: tuple, k: int, target, drafter, deterministic: bool):
    """Every outcome of one round of speculative sampling, with its exact probability: the
    drafts, each acceptance uniform's two cells (below or above p/q) and u_draw's cells, the
    emitted tokens decided by ``accept_sampled`` itself at each cell's midpoint."""
    for draft in itertools.product(range(V), repeat=k):
        q_rows = [drafter(context + draft[:i]) for i in range(k)]
        if deterministic:          # the draft is drafter's argmax: probability 1, q one-hot
            if list(draft) != [int(np.argmax(r)) for r in q_rows]:
                continue
            weight, q = 1.0, None
        else:
            weight = math.prod(q_rows[i][draft[i]] for i in range(k))
            q = torch.tensor(np.array(q_rows)).reshape(k, V)
        p = np.array([target(context + draft[:i]) for i in range(k + 1)])
        qd = np.eye(V)[list(draft)] if deterministic else np.array(q_rows).reshape(k, V)
        ratios = [min(1.0, p[i, draft[i]] / qd[i, draft[i]]) for i in range(k)]
        candidates = [reference.residual_distribution(p[i], qd[i]) for i in range(k)] + [p[k]]
        for accept in itertools.product([True, False], repeat=k):
            u = [r / 2 if keep else (r + 1) / 2 for r, keep in zip(ratios, accept)]
            w_u = math.prod(r if keep else 1 - r for r, keep in zip(ratios, accept))
            if w_u == 0:
                continue
            for u_draw, width in cells(*candidates):
                a, nxt = accept_sampled(torch.tensor(draft, dtype=torch.long), torch.tensor(p), q,
                                        torch.tensor(u, dtype=torch.float64),
                                        torch.tensor(u_draw, dtype=torch.float64))
                yield draft[:int(a)] + (int(nxt),), weight * w_u * width


def speculative_distribution(context: tuple, need: int, target, drafter, deterministic):
    """The exact distribution of the next ``need`` tokens that rounds of speculative sampling
    emit (each round drafts min(K, need - 1), as speculative_decode does)."""
    if need == 0:
        return {(): 1.0}
    out: dict[tuple, float] = {}
    for emitted, prob in round_outcomes(context, min(K, need - 1), target, drafter,
                                        deterministic):
        rest = speculative_distribution(context + emitted, need - len(emitted), target,
                                        drafter, deterministic)
        for tail, p_tail in rest.items():
            out[emitted + tail] = out.get(emitted + tail, 0.0) + prob * p_tail
    return out


@pytest.mark.parametrize("deterministic", [False, True], ids=["sampled draft", "greedy draft"])
def test_sampled_output_has_the_targets_distribution_exactly(deterministic):
    target = lambda context: table(context, 1)
    drafter = lambda context: table(context, 2)
    got = speculative_distribution((), T, target, drafter, deterministic)
    want = {seq: math.prod(target(seq[:i])[seq[i]] for i in range(T))
            for seq in itertools.product(range(V), repeat=T)}
    assert set(got) <= set(want)
    for seq, prob in want.items():
        assert got.get(seq, 0.0) == pytest.approx(prob, abs=1e-12), seq
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-12)


def chi_square_p_value(counts: np.ndarray, expected: np.ndarray) -> float:
    """Pearson's test, cells with expected count below 5 pooled into one; p-value from the
    regularised upper incomplete gamma function."""
    small = expected < 5
    counts = np.append(counts[~small], counts[small].sum())
    expected = np.append(expected[~small], expected[small].sum())
    keep = expected > 0
    statistic = float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(statistic / 2, dtype=torch.float64)))


SMALL = GPTConfig(vocab_size=4, max_seq_len=12, d_model=16, n_heads=2, n_layers=2)
TEMPERATURE = 0.05      # sharpens the tiny random models' near-uniform logits
FALSE_ALARM = 1e-3      # the chance that this test fails on a correct implementation


@pytest.mark.slow
@pytest.mark.parametrize("draft_kind", ["lookup", "model"])
def test_whole_loop_samples_the_targets_distribution(draft_kind):
    """speculative_decode at temperature > 0, 800 seeds: the first three generated tokens'
    counts against the target's exact joint distribution (chi-square; FALSE_ALARM)."""
    target = GPT(SMALL, seed=3).eval()
    prompt = torch.tensor([[0, 1, 0, 1]])
    draft = PromptLookupDraft(ngram=2) if draft_kind == "lookup" else \
        ModelDraft(GPT(SMALL, seed=4).eval(), temperature=TEMPERATURE,
                   generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        seqs = torch.tensor(list(itertools.product(range(SMALL.vocab_size), repeat=3)))
        contexts = torch.cat([prompt.expand(len(seqs), -1), seqs], dim=1)
        probs = torch.softmax(target(contexts).double() / TEMPERATURE, dim=-1)  # (64, 7, v)
        n = prompt.shape[1]
        want = torch.ones(len(seqs), dtype=torch.float64)
        for i in range(3):
            want *= probs[torch.arange(len(seqs)), n - 1 + i, seqs[:, i]]
    runs = 800
    counts = np.zeros(len(seqs))
    for seed in range(runs):
        out = speculative_decode(target, prompt, 3, draft=draft, k=2,
                                 temperature=TEMPERATURE, seed=seed).tokens[0, n:]
        counts[int(out[0]) * 16 + int(out[1]) * 4 + int(out[2])] += 1
    p_value = chi_square_p_value(counts, runs * want.numpy())
    assert p_value > FALSE_ALARM, f"chi-square p-value {p_value:.2e}"


# ------------------------------------------------------------------ verification and rollback

def test_verify_is_the_loop_in_one_forward(tiny_model, device):
    tokens = torch.tensor([[3, 14, 15, 9, 2, 6, 5, 35, 8, 9]], device=device)
    caches = []
    for impl in (verify_loop, verify):
        cache = KVCache.for_model(tiny_model, 1)
        tiny_model(tokens[:, :4], cache)
        caches.append((impl(tiny_model, cache, tokens[:, 4:]), cache))
    (want, loop_cache), (got, cache) = caches
    assert got.shape == (6, TINY.vocab_size) and cache.length == loop_cache.length == 10
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_contiguous_rollback_equals_a_fresh_prefill(tiny_model, device):
    tokens = torch.tensor([[3, 14, 15, 9, 2, 6, 5, 35, 8, 9]], device=device)
    cache = KVCache.for_model(tiny_model, 1)
    tiny_model(tokens[:, :4], cache)
    verify(tiny_model, cache, torch.tensor([[40, 41, 42, 43]], device=device))   # rejected
    cache.truncate(4)
    verify(tiny_model, cache, tokens[:, 4:])                                      # overwrite
    fresh = KVCache.for_model(tiny_model, 1)
    tiny_model(tokens, fresh)
    for layer in range(TINY.n_layers):
        torch.testing.assert_close(cache.keys[layer][:, :, :10], fresh.keys[layer][:, :, :10])
        torch.testing.assert_close(cache.values[layer][:, :, :10],
                                   fresh.values[layer][:, :, :10])


def test_paged_rollback_returns_blocks_to_the_pool(tiny_model, device):
    paged = PagedKVCache.for_model(tiny_model, block_size=4, num_blocks=6)
    paged.add_sequence("s")
    seq = PagedSequence(paged, "s")
    tiny_model(torch.tensor([[1, 2, 3, 4, 5]], device=device), seq)         # 5 tokens: 2 blocks
    assert paged.num_free_blocks == 4
    logits = verify(tiny_model, seq, torch.tensor([[6, 7, 8, 9, 10, 11, 12]], device=device))
    assert logits.shape == (7, TINY.vocab_size)
    assert seq.max_length == 12 and paged.num_free_blocks == 3               # 12 tokens: 3
    seq.truncate(6)                                                          # keep 6: 2 blocks
    assert paged.num_free_blocks == 4 and len(paged.block_table("s")) == 2
    paged.check()
    contiguous = KVCache.for_model(tiny_model, 1)
    tiny_model(torch.tensor([[1, 2, 3, 4, 5, 6]], device=device), contiguous)
    want = tiny_model(torch.tensor([[13]], device=device), contiguous)
    torch.testing.assert_close(tiny_model(torch.tensor([[13]], device=device), seq), want,
                               rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------ greedy == plain greedy

def code_prompts(device):
    ids = encode_tensor(CODE, device=device)                                 # (1, m)
    return [ids[:, :40], ids[:, 200:236]]


@pytest.mark.parametrize("draft_kind", ["lookup", "first 2 layers"])
def test_greedy_speculative_equals_plain_greedy_on_the_shipped_model(shipped, draft_kind,
                                                                     device):
    model = shipped_on(shipped, device)
    small = truncated_model(model, 2)
    for prompt in code_prompts(device):
        want = generate(model, prompt, 48)
        for k in (1, 4):
            draft = PromptLookupDraft() if draft_kind == "lookup" else ModelDraft(small)
            got = speculative_decode(model, prompt, 48, draft=draft, k=k)
            assert torch.equal(got.tokens, want), (k, got.tokens, want)
            assert got.forwards == got.rounds + 1 < 49


def test_greedy_speculative_on_a_paged_cache(shipped, device):
    model = shipped_on(shipped, device)
    prompt = code_prompts(device)[0]
    paged = PagedKVCache.for_model(model, block_size=8, num_blocks=14)
    paged.add_sequence(0)
    got = speculative_decode(model, prompt, 60, draft=PromptLookupDraft(), k=4,
                             cache=PagedSequence(paged, 0))
    assert torch.equal(got.tokens, generate(model, prompt, 60))
    held = 40 + 60 - 1                                 # the last token is never fed back
    assert paged.length(0) == held
    assert paged.num_free_blocks == 14 - math.ceil(held / 8)     # rejected blocks returned
    paged.check()


def test_truncated_model(shipped):
    full = truncated_model(shipped, shipped.config.n_layers)
    tokens = encode_tensor(CODE[:50])
    torch.testing.assert_close(full(tokens), shipped(tokens))
    small = truncated_model(shipped, 1)
    assert small.config.n_layers == 1 and len(small.blocks) == 1
    torch.testing.assert_close(small.blocks[0].ffn.w_up, shipped.blocks[0].ffn.w_up)
    for bad in (0, 5, 1.5):
        with pytest.raises(ValueError, match="n_layers"):
            truncated_model(shipped, bad)


def test_expected_tokens_per_forward():
    assert expected_tokens_per_forward(0.0, 4) == 1.0
    assert expected_tokens_per_forward(1.0, 4) == 5.0
    assert expected_tokens_per_forward(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    with pytest.raises(ValueError, match="alpha"):
        expected_tokens_per_forward(1.5, 2)


# ------------------------------------------------------------------ meta device, errors

def test_verify_and_acceptance_run_on_meta():
    model = GPT(TINY, device="meta")
    cache = KVCache.for_model(model, 1)
    logits = verify(model, cache, torch.zeros(1, 5, dtype=torch.long, device=META))
    assert logits.device == META and logits.shape == (5, TINY.vocab_size)
    draft = torch.zeros(3, 4, dtype=torch.long, device=META)
    a, nxt = accept_greedy(draft, torch.empty(3, 5, 7, device=META))
    assert a.shape == nxt.shape == (3,) and a.device == nxt.device == META
    p = torch.empty(3, 5, 7, device=META, dtype=torch.float64)
    a, nxt = accept_sampled(draft, p, p[:, :4], torch.empty(3, 4, device=META),
                            torch.empty(3, device=META))
    assert a.shape == nxt.shape == (3,) and nxt.device == META


def test_bad_input_raises_clear_errors(tiny_model, device):
    prompt = torch.tensor([[1, 2, 3]], device=device)
    for k in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="k .tokens drafted"):
            speculative_decode(tiny_model, prompt, 4, draft=PromptLookupDraft(), k=k)
        with pytest.raises(ValueError, match="k .tokens drafted"):
            prompt_lookup(prompt[0], k)
    with pytest.raises(ValueError, match="ngram"):
        prompt_lookup(prompt[0], 2, ngram=0)
    with pytest.raises(ValueError, match="b = 1"):
        speculative_decode(tiny_model, prompt.expand(2, -1), 4, draft=PromptLookupDraft(), k=2)
    with pytest.raises(ValueError, match="max_seq_len"):
        speculative_decode(tiny_model, prompt, 100, draft=PromptLookupDraft(), k=2)
    with pytest.raises(ValueError, match="temperature"):
        speculative_decode(tiny_model, prompt, 4, draft=PromptLookupDraft(), k=2,
                           temperature=-1)
    full = KVCache.for_model(tiny_model, 1)
    tiny_model(prompt, full)
    with pytest.raises(ValueError, match="empty cache"):
        speculative_decode(tiny_model, prompt, 4, draft=PromptLookupDraft(), k=2, cache=full)
    with pytest.raises(TypeError, match="roll back|PagedSequence"):
        verify(tiny_model, object(), prompt)
    with pytest.raises(ValueError, match="tokens"):
        prompt_lookup(prompt, 2)                                   # (1, m), not (m,)
    with pytest.raises(TypeError, match="integer"):
        prompt_lookup(prompt[0].float(), 2)
    logits = torch.randn(4, 9, device=device)
    with pytest.raises(ValueError, match="logits"):
        accept_greedy(torch.tensor([1, 2, 3, 4], device=device), logits)   # needs k + 1 rows
    with pytest.raises(TypeError, match="integer"):
        accept_greedy(torch.tensor([1.0, 2.0, 3.0], device=device), logits)
    p = torch.softmax(logits.double(), -1)
    draft = torch.tensor([1, 2, 3], device=device)
    with pytest.raises(ValueError, match="u"):
        accept_sampled(draft, p, None, torch.rand(2, device=device), torch.rand((), device=device))
    with pytest.raises(ValueError, match="q"):
        accept_sampled(draft, p, p, torch.rand(3, device=device), torch.rand((), device=device))
