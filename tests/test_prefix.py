"""A shared prefix: computed once, stored once, and the outputs of every sequence unchanged."""

from __future__ import annotations

import pytest
import torch

from llmcore import KVCache, SharedPrefixCache, decode_steps, generate_batch, pad_batch
from conftest import TINY

PREFIX = [7, 3, 11, 40, 2, 9]
PROMPTS = [[5, 6], [1], [30, 31, 32, 33]]


@pytest.mark.parametrize("sampling", [dict(), dict(temperature=0.9, seeds=[4, 5, 6])])
def test_shared_prefix_equals_unshared(tiny_gqa_model, sampling):
    shared = generate_batch(tiny_gqa_model, PROMPTS, 9, prefix=PREFIX, **sampling)
    unshared = generate_batch(tiny_gqa_model, [PREFIX + p for p in PROMPTS], 9, **sampling)
    assert shared == unshared


def test_logits_equal_step_by_step(tiny_model):
    device = tiny_model.device
    suffix, mask = pad_batch(PROMPTS, device=device)
    full, full_mask = pad_batch([PREFIX + p for p in PROMPTS], device=device)
    prefix_ids = torch.tensor([PREFIX], device=device)
    shared = SharedPrefixCache.prefill(tiny_model, prefix_ids, batch_size=3)
    a = list(decode_steps(tiny_model, suffix, 6, cache=shared, attention_mask=mask))
    b = list(decode_steps(tiny_model, full, 6, attention_mask=full_mask))
    for step, (x, y) in enumerate(zip(a, b)):
        torch.testing.assert_close(x.logits, y.logits, msg=f"step {step}")


def test_prefix_is_stored_once_and_the_saving_is_reported(tiny_model):
    device = tiny_model.device
    shared = SharedPrefixCache.prefill(tiny_model, torch.tensor([PREFIX], device=device),
                                       batch_size=3)
    suffix, mask = pad_batch(PROMPTS, device=device)
    with torch.no_grad():
        tiny_model(suffix, shared, attention_mask=mask)
    assert all(k.shape[0] == 1 for k in shared.prefix.keys)      # batch 1: no per-sequence copy
    assert shared.max_length == len(PREFIX) + suffix.shape[1]
    prefix_bytes = shared.prefix.used_bytes()
    assert prefix_bytes == len(PREFIX) * shared.prefix.reserved_bytes() // len(PREFIX)
    assert shared.unshared_bytes() - shared.used_bytes() == 2 * prefix_bytes   # (b - 1) copies


def test_prefix_cache_must_be_single_filled_and_unpadded(tiny_model):
    two = KVCache.for_model(tiny_model, 2)
    with pytest.raises(ValueError, match="batch size 1"):
        SharedPrefixCache(two, KVCache.for_model(tiny_model, 2))
    with pytest.raises(ValueError, match="empty"):
        SharedPrefixCache(KVCache.for_model(tiny_model, 1), KVCache.for_model(tiny_model, 2))
    padded = KVCache.for_model(tiny_model, 1)
    with torch.no_grad():
        tiny_model(torch.tensor([[0, 4, 5]], device=tiny_model.device), padded,
                   attention_mask=torch.tensor([[False, True, True]], device=tiny_model.device))
    with pytest.raises(ValueError, match="padding"):
        SharedPrefixCache(padded, KVCache.for_model(tiny_model, 2))


def test_prefix_and_suffix_share_max_seq_len(tiny_model):
    prefix_ids = torch.zeros(1, TINY.max_seq_len - 2, dtype=torch.long, device=tiny_model.device)
    shared = SharedPrefixCache.prefill(tiny_model, prefix_ids, batch_size=1)
    with pytest.raises(ValueError, match="max_seq_len"):
        with torch.no_grad():
            tiny_model(torch.zeros(1, 3, dtype=torch.long, device=tiny_model.device), shared)


def test_a_decode_step_never_copies_the_prefix_per_sequence():
    # one head of width 64, so a per-sequence copy of the prefix keys of one layer (b P d_head
    # floats) dwarfs everything else a decode step allocates (scores are b P floats per head)
    from llmcore import GPT, GPTConfig, peak_memory
    model = GPT(GPTConfig(vocab_size=61, max_seq_len=64, d_model=64, n_heads=1, n_layers=1),
                seed=0).eval()
    b, prefix_length = 8, 48
    shared = SharedPrefixCache.prefill(model, torch.zeros(1, prefix_length, dtype=torch.long),
                                       batch_size=b)
    step = torch.zeros(b, 1, dtype=torch.long)
    with torch.no_grad():
        model(step, shared)
        peak = peak_memory(model, step, shared)
    one_copy = b * prefix_length * 64 * 4
    assert peak < one_copy, f"a decode step peaked at {peak} bytes; one copy is {one_copy}"
