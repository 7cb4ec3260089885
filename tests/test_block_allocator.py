"""llmcore.block_allocator: blocks handed out and taken back, misuse refused, the invariants under
any sequence of operations, and who owns and fills which block of a set of block tables."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from llmcore.block_allocator import BlockAllocator, OutOfBlocks, block_fill, block_owners


def test_owners_and_fill_follow_the_tables():
    tables = {"a": [3, 0, 5], "b": [3, 1]}
    lengths = {"a": 10, "b": 6}
    assert block_owners(tables) == {3: ["a", "b"], 0: ["a"], 5: ["a"], 1: ["b"]}
    # p = 4: a fills 4, 4, 2; b fills 4, 2; the shared block 3 is full
    assert block_fill(tables, lengths, 4) == {3: 4, 0: 4, 5: 2, 1: 2}


def test_allocator_hands_out_and_takes_back():
    pool = BlockAllocator(3)
    a, b = pool.allocate(), pool.allocate()
    assert {a, b} <= {0, 1, 2} and a != b and pool.num_free == 1
    pool.share(a)
    pool.free(a)
    assert pool.num_free == 1                     # still referenced once
    pool.free(a)
    assert pool.num_free == 2 and pool.ref_counts[a] == 0
    pool.check()


@pytest.mark.parametrize("action, error, message", [
    (lambda p: p.free(0), ValueError, "double free: block 0"),
    (lambda p: p.free(7), ValueError, r"outside the pool \[0, 2\)"),
    (lambda p: p.share(1), ValueError, "block 1 is free"),
])
def test_allocator_refuses_misuse(action, error, message):
    pool = BlockAllocator(2)
    with pytest.raises(error, match=message):
        action(pool)
    pool.check()


def test_allocator_runs_out_clearly():
    pool = BlockAllocator(1)
    pool.allocate()
    with pytest.raises(OutOfBlocks, match="all 1 are in use"):
        pool.allocate()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["alloc", "share", "free"]), st.integers(0, 7)),
                max_size=60))
def test_allocator_invariants_hold_under_any_operations(operations):
    pool = BlockAllocator(8)
    owners: list[int] = []                        # one entry per reference handed out
    for op, pick in operations:
        if op == "alloc" and pool.num_free:
            owners.append(pool.allocate())
        elif op == "share" and owners:
            block = owners[pick % len(owners)]
            pool.share(block)
            owners.append(block)
        elif op == "free" and owners:
            pool.free(owners.pop(pick % len(owners)))
        pool.check()
        for block in range(8):
            assert pool.ref_counts[block] == owners.count(block)   # no block owned twice unseen
        assert pool.num_used == len(set(owners))
