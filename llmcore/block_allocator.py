"""The block allocator of a paged KV cache: a free list and a reference count per block.

A paged cache keeps every sequence's keys and values in one pool of fixed-size blocks (the cache
itself is :class:`llmcore.paged.PagedKVCache`). This module only hands out block ids and counts
who holds them: a block is free exactly when nobody references it, and a block shared by several
sequences (a fork) is counted once per sequence that lists it in its block table. Chapter 9.
"""

from __future__ import annotations

from collections import deque
from typing import Hashable, Mapping, Sequence


class OutOfBlocks(RuntimeError):
    """The pool has too few free blocks for what was asked; nothing was changed."""


class BlockAllocator:
    """Hands out block ids from a free list and counts references to each block.

    Invariants (see :meth:`check`): a block is free exactly when its count is 0; the free list
    holds each free block once; free + used == num_blocks. Chapter 9.
    """

    def __init__(self, num_blocks: int):
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self.free_list: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self.free_list)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free_list)

    def _check_id(self, block: int) -> None:
        if not 0 <= block < self.num_blocks:
            raise ValueError(f"block id {block} is outside the pool [0, {self.num_blocks})")

    def allocate(self) -> int:
        """A free block, now referenced once."""
        if not self.free_list:
            raise OutOfBlocks(f"no free block left (all {self.num_blocks} "
                              f"are in use)")
        block = self.free_list.popleft()
        self.ref_counts[block] = 1
        return block

    def share(self, block: int) -> None:
        """One more reference to a block in use (a forked sequence)."""
        self._check_id(block)
        if self.ref_counts[block] == 0:
            raise ValueError(f"block {block} is free; only a block in use can be shared")
        self.ref_counts[block] += 1

    def free(self, block: int) -> None:
        """Drop one reference; the block returns to the free list when none is
        left."""
        self._check_id(block)
        if self.ref_counts[block] == 0:
            raise ValueError(f"double free: block {block} is already free")
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self.free_list.append(block)

    def check(self) -> None:
        """Raise AssertionError if an invariant is broken."""
        free = list(self.free_list)
        assert len(free) == len(set(free)), f"a block is on the free list twice: {free}"
        for block in range(self.num_blocks):
            on_list = block in set(free)
            assert on_list == (self.ref_counts[block] == 0), \
                f"block {block}: reference count {self.ref_counts[block]}, on free list {on_list}"
        assert self.num_free + self.num_used == self.num_blocks


def block_owners(tables: Mapping[Hashable, Sequence[int]]) -> dict[int, list[Hashable]]:
    """Physical block id -> the sequences whose tables list it (its reference count is the
    length of that list). Blocks nobody lists are absent. Chapter 9."""
    owners: dict[int, list[Hashable]] = {}
    for seq_id, table in tables.items():
        for block in table:
            owners.setdefault(block, []).append(seq_id)
    return owners


def block_fill(tables: Mapping[Hashable, Sequence[int]], lengths: Mapping[Hashable, int],
               block_size: int) -> dict[int, int]:
    """Physical block id -> token slots filled in it (the most any of its owners fills)."""
    fill: dict[int, int] = {}
    for seq_id, table in tables.items():
        for j, block in enumerate(table):
            used = min(block_size, lengths[seq_id] - j * block_size)
            fill[block] = max(fill.get(block, 0), used)
    return fill
