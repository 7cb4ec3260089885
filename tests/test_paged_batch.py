"""llmcore.paged_batch: length groups cover every row once and never gather more than one group
would; a batch of very different lengths decodes in groups and equals each sequence alone.
(Paged == contiguous through ``cache.batch`` in general: tests/test_paged.py.)"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

import llmcore.paged_batch
from llmcore import GPT, KVCache, PagedKVCache
from llmcore.paged_batch import length_groups
from conftest import TINY_GQA


@given(st.lists(st.integers(1, 900), min_size=1, max_size=16), st.integers(0, 2000))
@settings(max_examples=60, deadline=None)
def test_length_groups_cover_every_row_once_and_beat_one_group(ends, cost):
    groups = length_groups(ends, group_cost=cost)
    rows = sorted(r for group, _ in groups for r in group)
    assert rows == list(range(len(ends)))
    for group, m in groups:
        assert m == max(ends[r] for r in group)
    gathered = sum(len(group) * m + cost for group, m in groups)
    assert gathered <= len(ends) * max(ends) + cost            # never worse than one group


def test_length_groups_extremes():
    assert length_groups([5, 900, 20], group_cost=10**9) == [([0, 2, 1], 900)]
    assert length_groups([5, 900, 20], group_cost=0) == [([0], 5), ([2], 20), ([1], 900)]


@pytest.mark.parametrize("backend", ["explicit", "fused"])
def test_mixed_lengths_decode_in_groups_equals_contiguous(device, backend, monkeypatch):
    """16 sequences of very different lengths (several groups) decode as one paged batch; every
    step's logits equal each sequence decoded alone in a contiguous cache."""
    splits = []
    original = llmcore.paged_batch.length_groups
    monkeypatch.setattr(llmcore.paged_batch, "length_groups",
                        lambda ends, **options: splits.append(original(ends, **options))
                        or splits[-1])
    model = GPT(TINY_GQA, device=device, seed=3).eval()
    g = torch.Generator().manual_seed(5)
    lengths = [2, 40, 3, 38, 5, 30, 1, 44, 7, 20, 33, 9, 41, 2, 25, 12]
    paged = PagedKVCache.for_model(model, block_size=4, num_blocks=16 * 12)
    paged.group_cost = 8                                  # several groups at these sizes
    alone, tokens = [], []
    with torch.no_grad():
        for i, length in enumerate(lengths):
            prompt = torch.randint(0, TINY_GQA.vocab_size, (1, length), generator=g).to(device)
            paged.add_sequence(i)
            model(prompt, paged.batch([i]), backend=backend)
            alone.append(KVCache.for_model(model, 1))
            tokens.append(model(prompt, alone[i], backend=backend)[:, -1:].argmax(-1))
        batch = paged.batch(range(16))
        for step in range(3):
            step_ids = torch.cat(tokens)                                       # (16, 1)
            got = model(step_ids, batch, backend=backend)
            for i in range(16):
                want = model(step_ids[i:i + 1], alone[i], backend=backend)
                torch.testing.assert_close(got[i:i + 1], want, rtol=1e-4, atol=1e-5)
                tokens[i] = want[:, -1:].argmax(-1)
    paged.check()
    assert len(splits[-1]) > 1, splits[-1]                 # the decode steps ran in groups
