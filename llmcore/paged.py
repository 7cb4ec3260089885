"""Paged attention's KV cache: fixed-size blocks in one pool, a block table per sequence.

A contiguous cache reserves room for the longest possible sequence up front; most of it is never
used. Here each layer's K and V live in one pool of blocks of p token slots, (h_kv, blocks, p,
d_head). A sequence owns a list of block ids, its block table; token t of the sequence sits in
block table[t // p] at slot t % p. Blocks are handed out from a free list as sequences grow and
returned when they finish, so the only unused reserved room is the unfilled tail of each
sequence's last block: under p slots per sequence.

Sequences can share blocks: a fork (several continuations of one prompt) copies the parent's
block table and raises each block's reference count instead of copying data. A block is written
only when its owner alone references it; appending into a shared, partly filled block first copies
it (copy on write).

This module is the cache: the pools, the block tables and what changes them. Block ids come from
:class:`llmcore.block_allocator.BlockAllocator`; one forward call over some sequences goes
through the view :class:`llmcore.paged_batch.PagedBatch` (``cache.batch([id, ...])``).
Chapter 9.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Hashable, Sequence

import torch

from .block_allocator import BlockAllocator, block_fill, block_owners
from .kvcache import kv_bytes_per_token
from .paged_batch import GROUP_COST_SLOTS, PagedBatch


@dataclass
class SequenceBlocks:
    """A sequence's block table and how many tokens it holds."""

    blocks: list[int] = field(default_factory=list)
    length: int = 0


class PagedKVCache:
    """Per layer, K and V pools of shape (h_kv, num_blocks, p, d_head), shared by all sequences.

    Head first: within a head, the slots of a block, and of a run of adjacent blocks, lie end to
    end, so a sequence whose blocks are adjacent is read as a view of the pool, without a copy.

    Sequences are named by any hashable id: ``add_sequence``, ``fork``, ``free_sequence``.
    ``cache.batch([id, ...])`` is what the model takes as its cache for one forward call over
    those sequences (one row of tokens each, in that order). Chapter 9.
    """

    def __init__(self, *, n_layers: int, n_kv_heads: int, d_head: int, block_size: int,
                 num_blocks: int, max_seq_len: int, device=None,
                 dtype: torch.dtype = torch.float32):
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.n_layers, self.n_kv_heads, self.d_head = n_layers, n_kv_heads, d_head
        self.block_size, self.max_seq_len = block_size, max_seq_len
        shape = (n_kv_heads, num_blocks, block_size, d_head)
        self.key_pools = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layers)]
        self.value_pools = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layers)]
        self.allocator = BlockAllocator(num_blocks)
        self.sequences: dict[Hashable, SequenceBlocks] = {}
        self.copy_on_write_count = 0
        self.group_cost = GROUP_COST_SLOTS   # what one more length group costs, in key slots

    @classmethod
    def for_model(cls, model, *, block_size: int, num_blocks: int) -> "PagedKVCache":
        """An empty pool shaped for ``model`` (a :class:`llmcore.model.GPT`), on its device."""
        c = model.config
        return cls(n_layers=c.n_layers, n_kv_heads=c.kv_heads, d_head=c.d_head,
                   block_size=block_size, num_blocks=num_blocks, max_seq_len=c.max_seq_len,
                   device=model.device, dtype=model.dtype)

    @property
    def device(self) -> torch.device:
        return self.key_pools[0].device

    # -- sequences -------------------------------------------------------------------------
    def sequence(self, seq_id: Hashable) -> SequenceBlocks:
        """The sequence's block table and length; KeyError if there is no such sequence."""
        if seq_id not in self.sequences:
            raise KeyError(f"unknown sequence {seq_id!r} (never added, or already freed)")
        return self.sequences[seq_id]

    def add_sequence(self, seq_id: Hashable) -> None:
        """Start an empty sequence; it takes blocks as its tokens arrive."""
        if seq_id in self.sequences:
            raise ValueError(f"sequence {seq_id!r} already exists")
        self.sequences[seq_id] = SequenceBlocks()

    def fork(self, parent: Hashable, child: Hashable) -> None:
        """Start ``child`` as a copy of ``parent`` that shares all its blocks
        (no data copied)."""
        source = self.sequence(parent)
        if child in self.sequences:
            raise ValueError(f"sequence {child!r} already exists")
        for block in source.blocks:
            self.allocator.share(block)
        copy = SequenceBlocks(list(source.blocks), source.length)
        self.sequences[child] = copy

    def free_sequence(self, seq_id: Hashable) -> None:
        """Return a finished sequence's blocks (shared ones stay with their other owners)."""
        seq = self.sequence(seq_id)
        for block in seq.blocks:
            self.allocator.free(block)
        del self.sequences[seq_id]

    def truncate(self, seq_id: Hashable, length: int) -> None:
        """Forget the sequence's tokens from ``length`` on, returning blocks it no longer needs."""
        seq = self.sequence(seq_id)
        if not 0 <= length <= seq.length:
            raise ValueError(f"truncate: length must lie in [0, {seq.length}], got {length}")
        while len(seq.blocks) > self.blocks_for(length):
            self.allocator.free(seq.blocks.pop())
        seq.length = length

    def length(self, seq_id: Hashable) -> int:
        return self.sequence(seq_id).length

    def block_table(self, seq_id: Hashable) -> list[int]:
        return list(self.sequence(seq_id).blocks)

    def block_tables(self) -> tuple[dict[Hashable, list[int]], dict[Hashable, int]]:
        """Every sequence's block table (a copy) and the tokens it holds, by sequence id."""
        return ({s: list(seq.blocks) for s, seq in self.sequences.items()},
                {s: seq.length for s, seq in self.sequences.items()})

    def check(self) -> None:
        """Raise AssertionError if an invariant is broken: the allocator's, or a block whose
        reference count is not the number of block tables that list it."""
        self.allocator.check()
        owners = block_owners(self.block_tables()[0])
        for block, count in enumerate(self.allocator.ref_counts):
            listed = len(owners.get(block, []))
            assert count == listed, \
                f"block {block} has reference count {count} but {listed} block tables list it"

    def blocks_for(self, tokens: int) -> int:
        """Blocks that hold ``tokens`` tokens: ceil(tokens / p)."""
        return math.ceil(tokens / self.block_size)

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool."""
        return self.allocator.num_blocks

    @property
    def num_free_blocks(self) -> int:
        """Blocks on the free list right now."""
        return self.allocator.num_free

    def can_ever_hold(self, n_tokens: int) -> bool:
        """Whether one sequence of n_tokens tokens fits in the whole pool (with nothing else)."""
        return self.blocks_for(n_tokens) <= self.num_blocks

    def can_admit(self, n_tokens: int, *, reserved_blocks: int = 0) -> bool:
        """Whether a new sequence that will grow to n_tokens tokens fits in the free blocks,
        after ``reserved_blocks`` blocks are kept for sequences already running (the blocks
        they may still take). The scheduler asks this, as vLLM's asks its block manager's
        ``can_allocate``, instead of counting the allocator's blocks itself."""
        if n_tokens < 1:
            raise ValueError(f"can_admit: n_tokens must be >= 1, got {n_tokens}")
        if reserved_blocks < 0:
            raise ValueError(f"can_admit: reserved_blocks must be >= 0, got {reserved_blocks}")
        return self.blocks_for(n_tokens) <= self.num_free_blocks - reserved_blocks

    def blocks_needed(self, seq_id: Hashable, n: int) -> int:
        """New blocks that appending n tokens to the sequence takes, copy on write included."""
        seq = self.sequence(seq_id)
        new = self.blocks_for(seq.length + n) - len(seq.blocks)
        partly_filled = seq.length % self.block_size != 0
        if n > 0 and partly_filled and self.allocator.ref_counts[seq.blocks[-1]] > 1:
            new += 1                                    # the shared last block gets copied
        return new

    def make_room(self, seq_id: Hashable, n: int) -> None:
        """Copy a shared last block if it will be written, then add blocks for n
        more tokens.

        Call it only after checking ``blocks_needed`` against the free list
        (``PagedBatch.prepare`` does): it allocates as it goes."""
        seq = self.sequence(seq_id)
        if n > 0 and seq.length % self.block_size and \
                self.allocator.ref_counts[seq.blocks[-1]] > 1:
            old, new = seq.blocks[-1], self.allocator.allocate()
            for pool in (*self.key_pools, *self.value_pools):
                pool[:, new] = pool[:, old]
            self.allocator.free(old)     # one reference fewer on the shared one
            seq.blocks[-1] = new
            self.copy_on_write_count += 1
        while len(seq.blocks) < self.blocks_for(seq.length + n):
            seq.blocks.append(self.allocator.allocate())

    def batch(self, seq_ids: Sequence[Hashable]) -> PagedBatch:
        """The cache view for one forward call over these sequences, in this order."""
        return PagedBatch(self, list(seq_ids))

    # -- memory ----------------------------------------------------------------------------
    def bytes_per_block(self) -> int:
        element = self.key_pools[0].element_size()
        return self.block_size * kv_bytes_per_token(self.n_layers, self.n_kv_heads, self.d_head,
                                                    element)

    def reserved_bytes(self) -> int:
        """The whole pool, in use or free."""
        return sum(t.numel() * t.element_size() for t in (*self.key_pools, *self.value_pools))

    def allocated_bytes(self) -> int:
        """Bytes of the blocks that sequences hold (shared blocks once)."""
        return self.allocator.num_used * self.bytes_per_block()

    def tokens_stored(self) -> int:
        """Token slots filled in blocks in use, a shared block counted once."""
        return sum(block_fill(*self.block_tables(), self.block_size).values())

    def used_bytes(self) -> int:
        element = self.key_pools[0].element_size()
        return self.tokens_stored() * kv_bytes_per_token(self.n_layers, self.n_kv_heads,
                                                         self.d_head, element)
