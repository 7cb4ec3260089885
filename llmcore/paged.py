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
it (copy on write). Chapter 9.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Hashable, Mapping, Sequence

import torch
from torch import Tensor

from .attention import attention
from .kvcache import attend_after_update, kv_bytes_per_token
from .layout import Layout, ragged_layout
from .shapes import check_operands, check_shape


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
            raise OutOfBlocks(f"no free block left (all {self.num_blocks} are in use)")
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
        """Drop one reference; the block returns to the free list when none is left."""
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
    def _get(self, seq_id: Hashable) -> SequenceBlocks:
        if seq_id not in self.sequences:
            raise KeyError(f"unknown sequence {seq_id!r} (never added, or already freed)")
        return self.sequences[seq_id]

    def add_sequence(self, seq_id: Hashable) -> None:
        """Start an empty sequence; it takes blocks as its tokens arrive."""
        if seq_id in self.sequences:
            raise ValueError(f"sequence {seq_id!r} already exists")
        self.sequences[seq_id] = SequenceBlocks()

    def fork(self, parent: Hashable, child: Hashable) -> None:
        """Start ``child`` as a copy of ``parent`` that shares all its blocks (no data copied)."""
        source = self._get(parent)
        if child in self.sequences:
            raise ValueError(f"sequence {child!r} already exists")
        for block in source.blocks:
            self.allocator.share(block)
        self.sequences[child] = SequenceBlocks(list(source.blocks), source.length)

    def free_sequence(self, seq_id: Hashable) -> None:
        """Return a finished sequence's blocks (shared ones stay with their other owners)."""
        seq = self._get(seq_id)
        for block in seq.blocks:
            self.allocator.free(block)
        del self.sequences[seq_id]

    def truncate(self, seq_id: Hashable, length: int) -> None:
        """Forget the sequence's tokens from ``length`` on, returning blocks it no longer needs."""
        seq = self._get(seq_id)
        if not 0 <= length <= seq.length:
            raise ValueError(f"truncate: length must lie in [0, {seq.length}], got {length}")
        while len(seq.blocks) > self.blocks_for(length):
            self.allocator.free(seq.blocks.pop())
        seq.length = length

    def length(self, seq_id: Hashable) -> int:
        return self._get(seq_id).length

    def block_table(self, seq_id: Hashable) -> list[int]:
        return list(self._get(seq_id).blocks)

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
        seq = self._get(seq_id)
        new = self.blocks_for(seq.length + n) - len(seq.blocks)
        partly_filled = seq.length % self.block_size != 0
        if n > 0 and partly_filled and self.allocator.ref_counts[seq.blocks[-1]] > 1:
            new += 1                                    # the shared last block gets copied
        return new

    def make_room(self, seq_id: Hashable, n: int) -> None:
        """Copy a shared last block if it will be written, then add blocks for n more tokens.

        Call it only after checking ``blocks_needed`` against the free list (``PagedBatch.prepare``
        does): it allocates as it goes."""
        seq = self._get(seq_id)
        if n > 0 and seq.length % self.block_size and \
                self.allocator.ref_counts[seq.blocks[-1]] > 1:
            old, new = seq.blocks[-1], self.allocator.allocate()
            for pool in (*self.key_pools, *self.value_pools):
                pool[:, new] = pool[:, old]
            self.allocator.free(old)                     # one reference fewer on the shared one
            seq.blocks[-1] = new
            self.copy_on_write_count += 1
        while len(seq.blocks) < self.blocks_for(seq.length + n):
            seq.blocks.append(self.allocator.allocate())

    def batch(self, seq_ids: Sequence[Hashable]) -> "PagedBatch":
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


GROUP_COST_SLOTS = 0
"""What one more length group is charged, counted in key slots: it stands for the fixed cost of
one more attention call (a few small torch calls). A setting, not a measurement. 0, the default,
puts every sequence in a group of its own, read as a view of the pool when its blocks are
adjacent (no copy at all); a larger cost merges sequences of similar length into groups that are
gathered (copied) and padded to their longest. Each cache can set its own
(``PagedKVCache.group_cost``); Chapter 9 measures the choices side by side."""


def length_groups(ends: Sequence[int], *,
                  group_cost: int | None = None) -> list[tuple[list[int], int]]:
    """Split a batch into groups of similar length, each gathered to its own longest sequence.

    ends: b key counts (cached + new tokens per sequence). Returns (rows, m) pairs: the batch rows
    of each group and its longest count. Sorted by length, the groups are runs of consecutive
    sequences; the split minimises the slots gathered, sum over groups of (size x longest), plus
    ``group_cost`` per group (default :data:`GROUP_COST_SLOTS`), by dynamic programming over the
    b sorted lengths (O(b^2)).
    One group is the plain gather to the batch's longest length; with ``group_cost`` 0 every
    sequence is a group of its own (on a tie the smaller last group wins), which
    :meth:`PagedBatch.attend` reads without padding, as a view where its blocks are adjacent.
    Chapter 9.
    """
    group_cost = GROUP_COST_SLOTS if group_cost is None else group_cost
    order = sorted(range(len(ends)), key=lambda i: ends[i])
    sorted_ends = [ends[i] for i in order]
    best = [0] + [math.inf] * len(ends)          # best[j]: cost of splitting the first j
    cut = [0] * (len(ends) + 1)                  # cut[j]: where the last group of best[j] starts
    for j in range(1, len(ends) + 1):
        for i in range(j):                       # last group = sorted rows i .. j-1
            cost = best[i] + (j - i) * sorted_ends[j - 1] + group_cost
            if cost <= best[j]:                  # a tie: the smaller last group
                best[j], cut[j] = cost, i
    groups, j = [], len(ends)
    while j > 0:
        groups.append((order[cut[j]:j], sorted_ends[j - 1]))
        j = cut[j]
    return groups[::-1]


@dataclass(frozen=True)
class LengthGroup:
    """Batch rows (g,) long, their block tables (g, blocks) and m, the longest key count. A group
    of one sequence also has its batch row and its run: (first block, count) when its blocks are
    adjacent in the pool (read as a view), else its block ids (t,) (gathered)."""

    rows: Tensor
    tables: Tensor
    m: int
    row: int | None = None
    run: tuple[int, int] | Tensor | None = None


def block_run(blocks: Sequence[int]) -> tuple[int, int] | None:
    """(first, count) if the block ids are first, first + 1, ..., first + count - 1, else None."""
    first = blocks[0]
    return (first, len(blocks)) if list(blocks) == list(range(first, first + len(blocks))) \
        else None


class PagedBatch:
    """Some sequences of a :class:`PagedKVCache`, as one :class:`llmcore.cache.Cache` for a
    forward call. Sequences may have different lengths; no padding is involved."""

    def __init__(self, cache: PagedKVCache, seq_ids: list[Hashable]):
        if len(set(seq_ids)) != len(seq_ids):
            raise ValueError(f"a sequence appears twice in the batch: {seq_ids}")
        for seq_id in seq_ids:
            cache._get(seq_id)
        self.cache, self.seq_ids = cache, seq_ids
        self._pending: tuple | None = None     # what prepare() worked out for this call

    @property
    def max_length(self) -> int:
        """Tokens held by the longest sequence of the batch."""
        return max((self.cache.length(s) for s in self.seq_ids), default=0)

    def prepare(self, b: int, n: int, attention_mask: Tensor | None) -> Layout:
        """Allocate the blocks n more tokens per sequence need (all or nothing: OutOfBlocks
        before any is taken), and lay out each sequence's new tokens after its own length.

        attention_mask: must be None or all True (no padding) -> Layout with a (b, 1, n, m) mask,
        m = longest length + n."""
        cache = self.cache
        if b != len(self.seq_ids):
            raise ValueError(f"batch-size mismatch: tokens hold b = {b} sequences, the batch "
                             f"names {len(self.seq_ids)}")
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("a paged batch takes no padding: each sequence has its own length, "
                             "so run prompts of different lengths in separate calls")
        for seq_id in self.seq_ids:
            if cache.length(seq_id) + n > cache.max_seq_len:
                raise ValueError(f"sequence {seq_id!r}: {cache.length(seq_id)} cached + {n} new "
                                 f"tokens > max_seq_len = {cache.max_seq_len}")
        needed = sum(cache.blocks_needed(s, n) for s in self.seq_ids)
        if needed > cache.allocator.num_free:
            raise OutOfBlocks(f"{needed} free blocks needed for {n} more token(s) in "
                              f"{len(self.seq_ids)} sequence(s), {cache.allocator.num_free} free")
        for seq_id in self.seq_ids:
            cache.make_room(seq_id, n)
        p, device = cache.block_size, cache.device
        seqs = [cache.sequences[s] for s in self.seq_ids]
        positions = [[seq.length + i for i in range(n)] for seq in seqs]
        write_blocks = torch.tensor([[seq.blocks[t // p] for t in row]
                                     for seq, row in zip(seqs, positions)], device=device)
        write_slots = torch.tensor([[t % p for t in row] for row in positions], device=device)
        widest = max(len(seq.blocks) for seq in seqs)
        tables = torch.tensor([seq.blocks + [0] * (widest - len(seq.blocks)) for seq in seqs],
                              device=device)                      # (b, blocks); 0 pads, masked
        lengths = [seq.length for seq in seqs]
        groups = []
        for rows, m in length_groups([t + n for t in lengths], group_cost=cache.group_cost):
            row = run = None
            if len(rows) == 1:                     # one sequence: its own blocks, no padding
                row, blocks = rows[0], seqs[rows[0]].blocks
                run = block_run(blocks) or torch.tensor(blocks, device=device)
            groups.append(LengthGroup(torch.tensor(rows, device=device), tables[rows], m, row,
                                      run))
        self._pending = (write_blocks, write_slots, tables, max(lengths) + n, groups)
        return ragged_layout(lengths, n, device)

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new rows into their blocks; gather each sequence's blocks back in order.

        k, v: (b, h_kv, n, d_head) -> (b, h_kv, m, d_head), m = longest length + n; a shorter
        sequence's extra slots hold whatever its padding block holds and are masked."""
        if self._pending is None:
            raise RuntimeError("update() before prepare(): the model calls prepare first")
        _, _, tables, m, _ = self._pending
        key_pool, value_pool = self.write(layer, k, v)
        return self.gather_blocks(key_pool, tables, m), self.gather_blocks(value_pool, tables, m)

    def write(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new rows k, v: (b, h_kv, n, d_head) into their slots; return this layer's
        pools (h_kv, blocks, p, d_head)."""
        write_blocks, write_slots = self._pending[:2]
        cache = self.cache
        key_pool, value_pool = cache.key_pools[layer], cache.value_pools[layer]
        check_operands(k=k, v=v, pool=key_pool)
        b = len(self.seq_ids)
        sizes = check_shape("k", k, (b, cache.n_kv_heads, "n", cache.d_head))
        check_shape("v", v, (b, cache.n_kv_heads, "n", cache.d_head), **sizes)
        key_pool[:, write_blocks, write_slots] = k.transpose(0, 1)      # (h_kv, b, n, d_head)
        value_pool[:, write_blocks, write_slots] = v.transpose(0, 1)
        return key_pool, value_pool

    @staticmethod
    def gather_blocks(pool: Tensor, tables: Tensor, m: int) -> Tensor:
        """pool: (h_kv, blocks, p, d_head)   tables: (b, t) block ids   ->   (b, h_kv, m, d_head):
        each sequence's blocks, read in table order and laid end to end. The indexing is the one
        copy: it writes each head's slots end to end, so merging blocks and slots and moving the
        batch axis first are views."""
        blocks = pool[:, tables]                         # (h_kv, b, t, p, d_head): a copy
        return blocks.flatten(2, 3)[:, :, :m].transpose(0, 1)   # (b, h_kv, m, d_head): views

    @staticmethod
    def sequence_rows(pool: Tensor, run: tuple[int, int] | Tensor, m: int) -> Tensor:
        """One sequence's keys (or values) -> (1, h_kv, m, d_head). run: (first, count) when its
        blocks are adjacent in the pool, read as a view of it (no copy); else its block ids (t,),
        gathered (a copy of its own blocks only, no padding). pool: (h_kv, blocks, p, d_head)."""
        if isinstance(run, tuple):
            first, count = run
            blocks = pool[:, first:first + count]            # (h_kv, t, p, d_head): a view
        else:
            blocks = pool.index_select(1, run)               # (h_kv, t, p, d_head): a copy
        return blocks.flatten(1, 2)[:, :m].unsqueeze(0)      # (1, h_kv, m, d_head): a view

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, layout: Layout,
               backend: str = "explicit") -> Tensor:
        """q: (b, h, n, d_head), new k, v: (b, h_kv, n, d_head) -> (b, h, n, d_head).

        Sequences are attended in groups of similar length (:func:`length_groups`). A group of
        one sequence reads its own blocks: a view of the pool when they are adjacent
        (:meth:`sequence_rows`), so no copy; a larger group gathers its blocks up to its own
        longest sequence, not the batch's, and masks each sequence's extra slots."""
        if self._pending is None:
            raise RuntimeError("attend() before prepare(): the model calls prepare first")
        groups = self._pending[4]
        if len(groups) == 1 and groups[0].run is None:       # one group: gather to the longest
            return attend_after_update(self, layer, q, k, v, layout, backend)
        key_pool, value_pool = self.write(layer, k, v)
        out = torch.empty_like(q)                                         # (b, h, n, d_head)
        for group in groups:
            if group.run is not None:                     # one sequence: its m_g keys, no mask
                i, run, m = group.row, group.run, group.m
                keys = self.sequence_rows(key_pool, run, m)               # (1, h_kv, m_g, d_head)
                values = self.sequence_rows(value_pool, run, m)
                out[i:i + 1] = attention(q[i:i + 1], keys, values, causal=True, backend=backend)
                continue
            keys = self.gather_blocks(key_pool, group.tables, group.m)    # (b_g, h_kv, m_g, d_head)
            values = self.gather_blocks(value_pool, group.tables, group.m)
            mask = None if layout.mask is None else layout.mask[group.rows, ..., :group.m]
            out[group.rows] = attention(q[group.rows], keys, values, mask=mask, backend=backend)
        return out

    def commit(self, n: int, attention_mask: Tensor | None) -> None:
        """Each sequence of the batch now holds n more tokens."""
        for seq_id in self.seq_ids:
            self.cache.sequences[seq_id].length += n
        self._pending = None
