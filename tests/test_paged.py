"""llmcore.paged: paged == contiguous (forks, copy on write, frees), waste under one block per
sequence, refusals that leave every other sequence intact, and the reference counts the block
tables account for."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings, strategies as st

from llmcore import GPT, KVCache, OutOfBlocks, PagedKVCache
from conftest import TINY_GQA


def test_cache_check_catches_a_count_no_table_accounts_for():
    cache = PagedKVCache(n_layers=1, n_kv_heads=1, d_head=2, block_size=2, num_blocks=3,
                         max_seq_len=8)
    cache.add_sequence("a")
    cache.make_room("a", 3)                         # two blocks, listed by a's table
    cache.check()
    cache.allocator.allocate()                      # a reference no table accounts for
    with pytest.raises(AssertionError, match="reference count 1 but 0 block tables list it"):
        cache.check()


# -- paged == contiguous ------------------------------------------------------------------------
class Twin:
    """The same sequences in a paged cache and in one contiguous cache each."""

    def __init__(self, model, block_size, num_blocks):
        self.model = model
        self.paged = PagedKVCache.for_model(model, block_size=block_size, num_blocks=num_blocks)
        self.contiguous: dict = {}

    def add(self, name):
        self.paged.add_sequence(name)
        self.contiguous[name] = KVCache.for_model(self.model, 1)

    def fork(self, parent, child):
        self.paged.fork(parent, child)
        source = self.contiguous[parent]
        copy = KVCache.for_model(self.model, 1)
        for store, src in ((copy.keys, source.keys), (copy.values, source.values)):
            for layer, tensor in enumerate(src):
                store[layer].copy_(tensor)
        copy.length = source.length
        self.contiguous[child] = copy

    def free(self, name):
        self.paged.free_sequence(name)
        del self.contiguous[name]

    @torch.no_grad()
    def run(self, names, tokens):
        """tokens: (b, n), one row per name; checks paged logits == contiguous logits."""
        paged = self.model(tokens, self.paged.batch(names))
        for i, name in enumerate(names):
            alone = self.model(tokens[i:i + 1], self.contiguous[name])
            torch.testing.assert_close(paged[i], alone[0], msg=f"sequence {name!r}")
        self.paged.check()
        return paged


def tokens(*shape, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, TINY_GQA.vocab_size, shape, generator=g).to(device)


def test_paged_equals_contiguous_with_forks_copy_on_write_and_frees(tiny_gqa_model):
    device = tiny_gqa_model.device
    twin = Twin(tiny_gqa_model, block_size=4, num_blocks=24)
    twin.add("a")
    twin.add("b")
    twin.run(["a"], tokens(1, 10, device=device))           # 2.5 blocks
    twin.run(["b"], tokens(1, 3, seed=1, device=device))
    twin.fork("a", "a2")                                    # shares a's 3 blocks, last one partly
    assert twin.paged.block_table("a2") == twin.paged.block_table("a")
    for step in range(7):
        twin.run(["a", "b", "a2"], tokens(3, 1, seed=10 + step, device=device))
    assert twin.paged.copy_on_write_count == 1              # only the first append copied
    shared = set(twin.paged.block_table("a")) & set(twin.paged.block_table("a2"))
    assert len(shared) == 2                                 # the two full prefix blocks
    twin.free("a")
    twin.add("c")                                           # reuses freed blocks
    twin.run(["c"], tokens(1, 6, seed=3, device=device))
    for step in range(3):
        twin.run(["a2", "c", "b"], tokens(3, 1, seed=30 + step, device=device))


def test_fork_at_a_block_boundary_copies_nothing(tiny_gqa_model):
    twin = Twin(tiny_gqa_model, block_size=4, num_blocks=12)
    twin.add("a")
    twin.run(["a"], tokens(1, 8, device=tiny_gqa_model.device))    # exactly 2 blocks
    twin.fork("a", "b")
    twin.run(["a", "b"], tokens(2, 1, device=tiny_gqa_model.device))
    assert twin.paged.copy_on_write_count == 0


@settings(max_examples=8, deadline=None)
@given(block_size=st.integers(1, 7), lengths=st.lists(st.integers(1, 9), min_size=1, max_size=3),
       steps=st.integers(0, 4))
def test_any_block_size_matches_contiguous(block_size, lengths, steps):
    model = GPT(TINY_GQA, seed=3).eval()
    twin = Twin(model, block_size=block_size, num_blocks=64)
    names = list(range(len(lengths)))
    for name, n in zip(names, lengths):
        twin.add(name)
        twin.run([name], tokens(1, n, seed=name))
    for step in range(steps):
        twin.run(names, tokens(len(names), 1, seed=100 + step))


def test_waste_is_under_one_block_per_sequence(tiny_gqa_model):
    rng = random.Random(0)
    cache = PagedKVCache.for_model(tiny_gqa_model, block_size=8, num_blocks=64)
    with torch.no_grad():
        for name in range(6):
            cache.add_sequence(name)
            n = rng.randint(1, 40)
            tiny_gqa_model(tokens(1, n, seed=name, device=tiny_gqa_model.device),
                           cache.batch([name]))
    waste = cache.allocated_bytes() - cache.used_bytes()
    assert 0 <= waste < 6 * cache.bytes_per_block()
    assert cache.used_bytes() == cache.tokens_stored() * cache.bytes_per_block() // 8


# -- refusals leave everyone else intact ---------------------------------------------------------
def state(cache):
    return ({s: (cache.block_table(s), cache.length(s)) for s in cache.sequences},
            cache.allocator.num_free, [p.clone() for p in cache.key_pools + cache.value_pools])


def assert_same_state(cache, before):
    tables, free, pools = before
    assert {s: (cache.block_table(s), cache.length(s)) for s in cache.sequences} == tables
    assert cache.allocator.num_free == free
    for a, b in zip(cache.key_pools + cache.value_pools, pools):
        assert torch.equal(a, b)


def filled(model, block_size=4, num_blocks=5):
    cache = PagedKVCache.for_model(model, block_size=block_size, num_blocks=num_blocks)
    with torch.no_grad():
        for name, n in (("a", 6), ("b", 5)):
            cache.add_sequence(name)
            model(tokens(1, n, seed=len(name) + n, device=model.device), cache.batch([name]))
    return cache


def test_asking_for_more_blocks_than_free_changes_nothing(tiny_gqa_model):
    cache = filled(tiny_gqa_model)                          # 2 + 2 of 5 blocks in use
    before = state(cache)
    with pytest.raises(OutOfBlocks, match="2 free blocks needed .* 1 free"):
        tiny_gqa_model(tokens(2, 4, device=tiny_gqa_model.device), cache.batch(["a", "b"]))
    assert_same_state(cache, before)


@pytest.mark.parametrize("action, error, message", [
    (lambda c: c.batch(["zzz"]), KeyError, "unknown sequence 'zzz'"),
    (lambda c: c.free_sequence("gone"), KeyError, "unknown sequence 'gone'"),
    (lambda c: c.add_sequence("a"), ValueError, "already exists"),
    (lambda c: c.fork("a", "b"), ValueError, "already exists"),
    (lambda c: c.batch(["a", "a"]), ValueError, "appears twice"),
])
def test_misuse_is_refused_and_changes_nothing(tiny_gqa_model, action, error, message):
    cache = filled(tiny_gqa_model, num_blocks=8)
    before = state(cache)
    with pytest.raises(error, match=message):
        action(cache)
    assert_same_state(cache, before)


def test_appending_to_a_freed_sequence_and_double_free_are_refused(tiny_gqa_model):
    cache = filled(tiny_gqa_model, num_blocks=8)
    cache.free_sequence("a")
    before = state(cache)
    with pytest.raises(KeyError, match="unknown sequence 'a'"):
        tiny_gqa_model(tokens(1, 1, device=tiny_gqa_model.device), cache.batch(["a"]))
    with pytest.raises(KeyError, match="already freed"):
        cache.free_sequence("a")
    assert_same_state(cache, before)


@pytest.mark.parametrize("shape, mask, error, message", [
    ((3, 1), None, ValueError, "batch-size mismatch: tokens hold b = 3"),
    ((2, 2), [[False, True], [True, True]], ValueError, "takes no padding"),
])
def test_bad_batches_are_refused_and_change_nothing(tiny_gqa_model, shape, mask, error, message):
    cache = filled(tiny_gqa_model, num_blocks=8)
    before = state(cache)
    device = tiny_gqa_model.device
    attention_mask = None if mask is None else torch.tensor(mask, device=device)
    with pytest.raises(error, match=message):
        tiny_gqa_model(tokens(*shape, device=device), cache.batch(["a", "b"]),
                       attention_mask=attention_mask)
    assert_same_state(cache, before)


def test_decoding_past_max_seq_len_is_refused(tiny_gqa_model):
    cache = PagedKVCache.for_model(tiny_gqa_model, block_size=8, num_blocks=16)
    cache.add_sequence("a")
    with torch.no_grad():
        tiny_gqa_model(tokens(1, TINY_GQA.max_seq_len, device=tiny_gqa_model.device),
                       cache.batch(["a"]))
        before = state(cache)
        with pytest.raises(ValueError, match="max_seq_len"):
            tiny_gqa_model(tokens(1, 1, device=tiny_gqa_model.device), cache.batch(["a"]))
    assert_same_state(cache, before)


def test_paged_cache_follows_the_model_onto_meta():
    model = GPT(TINY_GQA, device="meta")
    cache = PagedKVCache.for_model(model, block_size=4, num_blocks=8)
    cache.add_sequence(0)
    cache.add_sequence(1)
    model(torch.zeros(1, 5, dtype=torch.long, device="meta"), cache.batch([0]))
    model(torch.zeros(1, 2, dtype=torch.long, device="meta"), cache.batch([1]))
    logits = model(torch.zeros(2, 1, dtype=torch.long, device="meta"), cache.batch([0, 1]))
    assert logits.device.type == "meta" and logits.shape == (2, 1, TINY_GQA.vocab_size)
    assert cache.length(0) == 6 and cache.length(1) == 3


def test_truncate_returns_blocks_and_keeps_shared_ones_safe(tiny_gqa_model):
    device = tiny_gqa_model.device
    twin = Twin(tiny_gqa_model, block_size=4, num_blocks=16)
    twin.add("a")
    twin.run(["a"], tokens(1, 10, device=device))                  # 3 blocks
    twin.fork("a", "b")
    free = twin.paged.allocator.num_free
    twin.paged.truncate("b", 6)                                    # b keeps 2 shared blocks
    assert twin.paged.allocator.num_free == free                   # the third is still a's
    assert twin.paged.block_table("b") == twin.paged.block_table("a")[:2]
    twin.contiguous["b"].truncate(6)
    twin.run(["b", "a"], tokens(2, 1, seed=4, device=device))      # b writes: copy on write
    assert twin.paged.copy_on_write_count == 1
    twin.paged.truncate("a", 0)
    twin.paged.check()
    with pytest.raises(ValueError, match="truncate: length must lie in"):
        twin.paged.truncate("b", 99)
