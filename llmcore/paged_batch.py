"""One forward call over some sequences of a paged KV cache: the view the model takes as its cache.

:class:`PagedBatch` is what ``PagedKVCache.batch([id, ...])`` returns: a
:class:`llmcore.cache.Cache` for one forward call over those sequences, in that order. It makes
room for the new tokens (all or nothing), writes each layer's new K and V rows into their blocks,
and attends every new query over its own sequence's blocks: sequences of different lengths need
no padding. Sequences are attended in groups of similar length (:func:`length_groups`); a group
of one sequence reads its blocks as a view of the pool when they are adjacent. Chapter 9.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable, Sequence

import torch
from torch import Tensor

from .attention import attention
from .block_allocator import OutOfBlocks
from .kvcache import attend_after_update
from .layout import Layout, ragged_layout
from .shapes import check_operands, check_shape


GROUP_COST_SLOTS = 0
"""What one more length group is charged, counted in key slots: it stands for the fixed cost of
one more attention call (a few small torch calls). A setting, not a measurement. 0, the default,
puts every sequence in a group of its own, read as a view of the pool when its blocks are
adjacent (no copy at all); a larger cost merges sequences of similar length into groups that are
gathered (copied) and padded to their longest. Each cache can set its own
(``PagedKVCache.group_cost``); Chapter 9 measures the choices side by side."""


def length_groups(ends: Sequence[int], *, group_cost: int | None = None
                  ) -> list[tuple[list[int], int]]:
    """Split a batch into groups of similar length, each gathered to its own
    longest sequence.

    ends: b key counts (cached + new tokens per sequence). Returns (rows, m)
    pairs: the batch rows of each group and its longest count. Sorted by
    length, the groups are runs of consecutive sequences; the split
    minimises the slots gathered, sum over groups of (size x longest), plus
    ``group_cost`` per group (default :data:`GROUP_COST_SLOTS`), by dynamic
    programming over the b sorted lengths (O(b^2)). One group is the plain
    gather to the batch's longest length; with ``group_cost`` 0 every
    sequence is a group of its own (on a tie the smaller last group wins),
    which :meth:`PagedBatch.attend` reads without padding, as a view where
    its blocks are adjacent. Chapter 9.
    """
    group_cost = GROUP_COST_SLOTS if group_cost is None else group_cost
    order = sorted(range(len(ends)), key=lambda i: ends[i])
    sorted_ends = [ends[i] for i in order]
    # best[j]: the cost of splitting the first j; cut[j]: where the last
    # group of best[j] starts
    best = [0] + [math.inf] * len(ends)
    cut = [0] * (len(ends) + 1)
    for j in range(1, len(ends) + 1):
        for i in range(j):               # last group = sorted rows i .. j-1
            cost = best[i] + (j - i) * sorted_ends[j - 1] + group_cost
            if cost <= best[j]:              # a tie: the smaller last group
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
    """Some sequences of a :class:`llmcore.paged.PagedKVCache` (``cache``, which makes this view
    with ``cache.batch(seq_ids)``), as one :class:`llmcore.cache.Cache` for a forward call.
    Sequences may have different lengths; no padding is involved."""

    def __init__(self, cache, seq_ids: list[Hashable]):
        if len(set(seq_ids)) != len(seq_ids):
            raise ValueError(f"a sequence appears twice in the batch: {seq_ids}")
        for seq_id in seq_ids:
            cache.sequence(seq_id)              # KeyError for an unknown one
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
        if needed > cache.num_free_blocks:
            raise OutOfBlocks(f"{needed} free blocks needed for {n} more token(s) in "
                              f"{len(self.seq_ids)} sequence(s), {cache.num_free_blocks} free")
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
        """Write the new rows into their blocks; gather each sequence's blocks
        back in order.

        k, v: (b, h_kv, n, d_head) -> (b, h_kv, m, d_head), m = longest
        length + n; a shorter sequence's extra slots hold whatever its padding
        block holds and are masked."""
        if self._pending is None:
            raise RuntimeError("update() before prepare(): the model calls "
                               "prepare first")
        _, _, tables, m, _ = self._pending
        key_pool, value_pool = self.write(layer, k, v)
        return (self.gather_blocks(key_pool, tables, m),
                self.gather_blocks(value_pool, tables, m))

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
        """pool: (h_kv, blocks, p, d_head)   tables: (b, t) block ids
        -> (b, h_kv, m, d_head): each sequence's blocks, read in table order
        and laid end to end. The indexing is the one copy: it writes each
        head's slots end to end, so merging blocks and slots and moving the
        batch axis first are views."""
        blocks = pool[:, tables]               # (h_kv, b, t, p, d_head): a copy
        rows = blocks.flatten(2, 3)[:, :, :m]  # (h_kv, b, m, d_head): a view
        return rows.transpose(0, 1)            # (b, h_kv, m, d_head): a view

    @staticmethod
    def sequence_rows(pool: Tensor, run: tuple[int, int] | Tensor,
                      m: int) -> Tensor:
        """One sequence's keys (or values) -> (1, h_kv, m, d_head).

        run: (first, count) when its blocks are adjacent in the pool, read as a
        view of it (no copy); else its block ids (t,), gathered (a copy of its
        own blocks only, no padding). pool: (h_kv, blocks, p, d_head)."""
        if isinstance(run, tuple):
            first, count = run
            blocks = pool[:, first:first + count]   # (h_kv, t, p, d_head): view
        else:
            blocks = pool.index_select(1, run)      # (h_kv, t, p, d_head): copy
        rows = blocks.flatten(1, 2)[:, :m]          # (h_kv, m, d_head): a view
        return rows.unsqueeze(0)                    # (1, h_kv, m, d_head)

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor,
               layout: Layout, backend: str = "explicit") -> Tensor:
        """q: (b, h, n, d_head), new k, v: (b, h_kv, n, d_head)
        -> (b, h, n, d_head).

        Sequences are attended in groups of similar length
        (:func:`length_groups`). A group of one sequence reads its own blocks:
        a view of the pool when they are adjacent (:meth:`sequence_rows`), so
        no copy; a larger group gathers its blocks up to its own longest
        sequence, not the batch's, and masks each sequence's extra slots."""
        if self._pending is None:
            raise RuntimeError("attend() before prepare(): the model calls "
                               "prepare first")
        groups = self._pending[4]
        if len(groups) == 1 and groups[0].run is None:       # one group: gather
            return attend_after_update(self, layer, q, k, v, layout, backend)
        key_pool, value_pool = self.write(layer, k, v)
        out = torch.empty_like(q)                            # (b, h, n, d_head)
        for group in groups:
            m, rows = group.m, group.rows
            if group.run is not None:      # one sequence: its m_g keys, no mask
                i, run = group.row, group.run
                # keys, values: (1, h_kv, m_g, d_head)
                keys = self.sequence_rows(key_pool, run, m)
                values = self.sequence_rows(value_pool, run, m)
                out[i:i + 1] = attention(q[i:i + 1], keys, values, causal=True,
                                         backend=backend)
                continue
            # keys, values: (b_g, h_kv, m_g, d_head)
            keys = self.gather_blocks(key_pool, group.tables, m)
            values = self.gather_blocks(value_pool, group.tables, m)
            mask = None if layout.mask is None else layout.mask[rows, ..., :m]
            out[rows] = attention(q[rows], keys, values, mask=mask,
                                  backend=backend)
        return out

    def commit(self, n: int, attention_mask: Tensor | None) -> None:
        """Each sequence of the batch now holds n more tokens."""
        for seq_id in self.seq_ids:
            self.cache.sequences[seq_id].length += n
        self._pending = None
