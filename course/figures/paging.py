"""Drawing a paged KV cache: block tables over a pool, reserved-but-unused room, and a timeline.

A paged cache keeps every sequence's keys and values in blocks of p token slots taken from one
pool; a sequence's *block table* lists its blocks in order, so token t sits in block
``table[t // p]`` at slot ``t % p`` (:mod:`llmcore.paged`). Several sequences may list the same
block (a shared prefix); a block nobody lists is free.

* :func:`plot_block_tables` draws block tables (one row per sequence, each entry the id of a
  physical block) above the pool (every block as p slots, filled slots coloured by the owner,
  shared blocks grey with their reference count, free blocks dashed).
* :func:`plot_paged_cache` does the same straight from a :class:`llmcore.paged.PagedKVCache`.
* :func:`plot_reservations` compares, for requests of given lengths, the room a contiguous
  max-length cache reserves with the room whole blocks of p slots reserve.
* :func:`plot_timeline` draws a serving run (:attr:`llmcore.serving.Scheduler.timeline`): which
  request holds which blocks at every step, with the free blocks and the waiting requests below.

Every function returns a matplotlib Figure and leaves nothing open in pyplot's registry, so a
notebook cell shows it exactly once, as the cell's result. Chapter 9.
"""

from __future__ import annotations

import math
from typing import Hashable, Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator

from llmcore.block_allocator import block_fill, block_owners
from llmcore.paged import PagedKVCache

SHARED_COLOR = "#9a9a9a"
"""Filled slots of a block that several sequences list (a shared prefix block)."""

EMPTY_COLOR = "#ffffff"
"""A slot reserved (its block is in use) but not yet holding a token."""

FREE_EDGE = "#b0b0b0"
"""The dashed outline of a free block."""

MAX_BLOCKS = 256
"""The most pool blocks a drawing may show and stay legible."""


def colors_for(ids: Sequence[Hashable]) -> dict[Hashable, tuple]:
    """One colour per id, in the given order (tab10, or tab20 beyond ten ids; cycled after)."""
    palette = plt.get_cmap("tab10" if len(ids) <= 10 else "tab20")
    return {rid: palette(i % palette.N) for i, rid in enumerate(ids)}


def _check_int(name: str, value: object, *, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name}: expected an int >= {low}, got {value}")
    return value


def check_block_tables(tables: object, lengths: object, *, num_blocks: int,
                       block_size: int) -> tuple[dict, dict]:
    """Validate block tables and lengths; return them as dicts of lists and ints.

    tables: sequence id -> list of block ids in [0, num_blocks); lengths: sequence id -> tokens
    held, with ceil(length / p) == len(table) (every block holds at least one of its tokens).
    Raises TypeError / ValueError naming the sequence and what was expected. Chapter 9.
    """
    num_blocks = _check_int("num_blocks", num_blocks, low=1)
    block_size = _check_int("block_size", block_size, low=1)
    if num_blocks > MAX_BLOCKS:
        raise ValueError(f"num_blocks: at most {MAX_BLOCKS} blocks can be drawn legibly, "
                         f"got {num_blocks}")
    for name, value in (("tables", tables), ("lengths", lengths)):
        if not isinstance(value, Mapping):
            raise TypeError(f"{name}: expected a mapping sequence id -> "
                            f"{'list of block ids' if name == 'tables' else 'token count'}, "
                            f"got {type(value).__name__}")
    if set(tables) != set(lengths):
        raise ValueError(f"tables and lengths: expected the same sequence ids, got "
                         f"{list(tables)} and {list(lengths)}")
    checked_tables, checked_lengths = {}, {}
    for seq_id, table in tables.items():
        if isinstance(table, (str, bytes)) or not isinstance(table, Sequence):
            raise TypeError(f"tables[{seq_id!r}]: expected a list of block ids, got "
                            f"{type(table).__name__}")
        blocks = [_check_int(f"tables[{seq_id!r}] entry", b, low=0) for b in table]
        outside = [b for b in blocks if b >= num_blocks]
        if outside:
            raise ValueError(f"tables[{seq_id!r}]: block id {outside[0]} is outside the pool "
                             f"[0, {num_blocks})")
        if len(set(blocks)) != len(blocks):
            raise ValueError(f"tables[{seq_id!r}]: a block appears twice in one table: {blocks}")
        length = _check_int(f"lengths[{seq_id!r}]", lengths[seq_id], low=0)
        if math.ceil(length / block_size) != len(blocks):
            raise ValueError(f"tables[{seq_id!r}]: {length} tokens in blocks of {block_size} "
                             f"need {math.ceil(length / block_size)} blocks, the table lists "
                             f"{len(blocks)}")
        checked_tables[seq_id], checked_lengths[seq_id] = blocks, length
    return checked_tables, checked_lengths


def _slots(ax: Axes, x: float, y: float, filled: int, block_size: int, color, *,
           width: float, height: float, dashed: bool = False) -> None:
    """One block as block_size slots side by side; the first ``filled`` coloured."""
    slot = width / block_size
    for s in range(block_size):
        face = color if s < filled else EMPTY_COLOR
        ax.add_patch(Rectangle((x + s * slot, y), slot, height, facecolor=face,
                               edgecolor="white" if s < filled else "#dddddd", linewidth=0.6))
    ax.add_patch(Rectangle((x, y), width, height, facecolor="none",
                           edgecolor=FREE_EDGE if dashed else "#333333",
                           linestyle="--" if dashed else "-", linewidth=1.0))


def draw_block_tables(ax: Axes, tables: Mapping, lengths: Mapping, *, block_size: int,
                      colors: Mapping) -> None:
    """One row per sequence: its name and length, then its table entries, in order.

    Entry j is a block drawn as its slots (filled ones in the sequence's colour) with the
    physical block id written on it; an entry shared with another sequence is outlined in bold.
    """
    owners = block_owners(tables)
    widest = max((len(t) for t in tables.values()), default=0)
    rows = list(tables)
    for r, seq_id in enumerate(rows):
        y = len(rows) - 1 - r
        ax.text(-0.15, y + 0.4, f"{seq_id}  ({lengths[seq_id]} tokens)", ha="right",
                va="center", fontsize=8)
        for j, block in enumerate(tables[seq_id]):
            filled = min(block_size, lengths[seq_id] - j * block_size)
            x = j * 1.25
            _slots(ax, x, y, filled, block_size, colors[seq_id], width=1.0, height=0.8)
            shared = len(owners[block]) > 1
            ax.text(x + 0.5, y + 0.4, str(block), ha="center", va="center", fontsize=8,
                    fontweight="bold" if shared else "normal", color="black",
                    bbox=dict(boxstyle="round,pad=0.15", facecolor="white", alpha=0.8,
                              edgecolor="black" if shared else "none", linewidth=1.2))
    for j in range(widest):
        ax.text(j * 1.25 + 0.5, len(rows) - 0.05, f"[{j}]", ha="center", va="bottom",
                fontsize=7, color="#555555")
    ax.set_xlim(-0.1, max(widest, 1) * 1.25)
    ax.set_ylim(-0.2, len(rows) + 0.35)
    ax.set_aspect("equal")
    ax.axis("off")


def draw_pool(ax: Axes, tables: Mapping, lengths: Mapping, *, num_blocks: int, block_size: int,
              colors: Mapping, per_row: int = 8) -> None:
    """The pool: every physical block as block_size slots, labelled with its id.

    A block one sequence holds has its filled slots in that sequence's colour; a block several
    hold is grey and labelled with its reference count (×k); a free block is a dashed outline.
    """
    owners = block_owners(tables)
    fill = block_fill(tables, lengths, block_size)
    rows = math.ceil(num_blocks / per_row)
    for block in range(num_blocks):
        x, y = (block % per_row) * 1.3, (rows - 1 - block // per_row) * 1.35
        held = owners.get(block, [])
        if not held:
            _slots(ax, x, y, 0, block_size, None, width=1.0, height=0.7, dashed=True)
            label = f"{block}: free"
        else:
            color = colors[held[0]] if len(held) == 1 else SHARED_COLOR
            _slots(ax, x, y, fill[block], block_size, color, width=1.0, height=0.7)
            label = f"{block}" if len(held) == 1 else f"{block} (×{len(held)})"
        ax.text(x + 0.5, y + 0.78, label, ha="center", va="bottom", fontsize=7,
                fontweight="bold" if len(held) > 1 else "normal")
    ax.set_xlim(-0.1, min(per_row, num_blocks) * 1.3)
    ax.set_ylim(-0.15, rows * 1.35)
    ax.set_aspect("equal")
    ax.axis("off")


def plot_block_tables(tables: Mapping[Hashable, Sequence[int]], lengths: Mapping[Hashable, int],
                      *, num_blocks: int, block_size: int, title: str | None = None,
                      per_row: int = 8) -> Figure:
    """Block tables (top) over the pool of physical blocks they point into (bottom).

    tables: sequence id -> its block table (physical block ids, in token order); lengths:
    sequence id -> tokens it holds; num_blocks: blocks in the pool; block_size: p, slots per
    block; per_row: pool blocks drawn per row. The same colour marks a sequence in both panels;
    a block several tables list is grey in the pool with its reference count, and its id is
    boxed in bold in the tables. Returns the Figure. Chapter 9.
    """
    tables, lengths = check_block_tables(tables, lengths, num_blocks=num_blocks,
                                         block_size=block_size)
    per_row = _check_int("per_row", per_row, low=1)
    colors = colors_for(list(tables))
    widest = max((len(t) for t in tables.values()), default=1)
    pool_rows = math.ceil(num_blocks / per_row)
    width = max(1.3 * min(per_row, num_blocks), 1.25 * widest + 2.0) * 0.62 + 0.8
    heights = [max(len(tables), 1) + 0.6, pool_rows * 1.35 + 0.2]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(width, 0.55 * sum(heights) + 1.2),
                                      height_ratios=heights, layout="constrained")
    plt.close(fig)            # out of pyplot's registry: the caller owns (and displays) it
    draw_block_tables(top, tables, lengths, block_size=block_size, colors=colors)
    top.set_title("block tables (entry j: the physical block holding tokens "
                  f"[j p, (j+1) p), p = {block_size})", fontsize=9)
    draw_pool(bottom, tables, lengths, num_blocks=num_blocks, block_size=block_size,
              colors=colors, per_row=per_row)
    free = num_blocks - len(block_owners(tables))
    bottom.set_title(f"the pool: {num_blocks} blocks of {block_size} slots, {free} free",
                     fontsize=9)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def plot_paged_cache(cache, *, title: str | None = None, per_row: int = 8) -> Figure:
    """:func:`plot_block_tables` for the sequences of a :class:`llmcore.paged.PagedKVCache`.

    Raises ValueError if the cache's reference counts disagree with its block tables (each
    block's count should be the number of tables listing it). Chapter 9.
    """
    if not isinstance(cache, PagedKVCache):
        raise TypeError(f"cache: expected a PagedKVCache (llmcore.paged), got "
                        f"{type(cache).__name__}")
    tables, lengths = cache.block_tables()
    try:
        cache.check()
    except AssertionError as broken:
        raise ValueError(f"cache: {broken}") from None
    return plot_block_tables(tables, lengths, num_blocks=cache.allocator.num_blocks,
                             block_size=cache.block_size, title=title, per_row=per_row)


def reserved_slots(lengths: Sequence[int], *, max_seq_len: int,
                   block_size: int) -> dict[str, int]:
    """Token slots used, and reserved by each scheme, for requests of these lengths.

    -> {"used": sum of lengths, "contiguous": len(lengths) * max_seq_len,
        "paged": sum of ceil(length / p) * p}. Chapter 9.
    """
    lengths = _check_lengths(lengths, max_seq_len)
    block_size = _check_int("block_size", block_size, low=1)
    return {"used": sum(lengths), "contiguous": len(lengths) * max_seq_len,
            "paged": sum(math.ceil(n / block_size) * block_size for n in lengths)}


def _check_lengths(lengths: object, max_seq_len: object) -> list[int]:
    max_seq_len = _check_int("max_seq_len", max_seq_len, low=1)
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Sequence):
        raise TypeError(f"lengths: expected a sequence of token counts, got "
                        f"{type(lengths).__name__}")
    if not lengths:
        raise ValueError("lengths: expected at least one request, got none")
    checked = [_check_int(f"lengths[{i}]", n, low=1) for i, n in enumerate(lengths)]
    too_long = [n for n in checked if n > max_seq_len]
    if too_long:
        raise ValueError(f"lengths: {too_long[0]} tokens exceed max_seq_len = {max_seq_len}")
    return checked


def plot_reservations(lengths: Sequence[int], *, max_seq_len: int, block_size: int,
                      title: str | None = None) -> Figure:
    """Per request, the slots it uses against the slots reserved for it, in two panels.

    Left: a contiguous cache per request, reserved for max_seq_len tokens. Right: whole blocks of
    p = block_size slots (block boundaries drawn). Dark: slots holding the request's tokens;
    light: reserved but unused. Each panel's title gives the unused fraction of what it reserves.
    Returns the Figure. Chapter 9.
    """
    lengths = _check_lengths(lengths, max_seq_len)
    totals = reserved_slots(lengths, max_seq_len=max_seq_len, block_size=block_size)
    fig, axes = plt.subplots(1, 2, figsize=(10.0, 0.28 * len(lengths) + 1.6), sharey=True,
                             layout="constrained")
    plt.close(fig)
    used_color, spare_color = "#3b75af", "#f2b8a2"
    for ax, scheme in zip(axes, ("contiguous", "paged")):
        for r, n in enumerate(lengths):
            reserved = max_seq_len if scheme == "contiguous" else \
                math.ceil(n / block_size) * block_size
            ax.barh(r, reserved, color=spare_color, height=0.75)
            ax.barh(r, n, color=used_color, height=0.75)
            if scheme == "paged":
                for edge in range(block_size, reserved, block_size):
                    ax.plot([edge, edge], [r - 0.375, r + 0.375], color="white", linewidth=0.6)
        waste = 1 - totals["used"] / totals[scheme]
        name = f"contiguous, {max_seq_len} slots each" if scheme == "contiguous" else \
            f"paged, blocks of p = {block_size}"
        ax.set_title(f"{name}: {100 * waste:.1f}% of reserved slots unused", fontsize=9)
        ax.set_xlim(0, max_seq_len)
        ax.set_xlabel("token slots")
    axes[0].invert_yaxis()                                  # request 0 on top (y is shared)
    axes[0].set_yticks(range(len(lengths)), [f"request {r}" for r in range(len(lengths))],
                       fontsize=7)
    fig.legend(handles=[Patch(color=used_color, label="holds a token"),
                        Patch(color=spare_color, label="reserved, unused")],
               loc="outside lower center", ncols=2, fontsize="small", frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


_RECORD_FIELDS = ("step", "blocks", "waiting", "finished", "free_blocks")


def _check_timeline(timeline: object, num_blocks: int) -> list:
    num_blocks = _check_int("num_blocks", num_blocks, low=1)
    if num_blocks > MAX_BLOCKS:
        raise ValueError(f"num_blocks: at most {MAX_BLOCKS} blocks can be drawn legibly, "
                         f"got {num_blocks}")
    if isinstance(timeline, (str, bytes)) or not isinstance(timeline, Sequence):
        raise TypeError(f"timeline: expected a sequence of StepRecord, got "
                        f"{type(timeline).__name__}")
    if not timeline:
        raise ValueError("timeline: expected at least one step, got none")
    for i, record in enumerate(timeline):
        missing = [f for f in _RECORD_FIELDS if not hasattr(record, f)]
        if missing:
            raise TypeError(f"timeline[{i}]: expected a StepRecord with {_RECORD_FIELDS}, got "
                            f"{type(record).__name__} without {missing}")
        if not isinstance(record.blocks, Mapping):
            raise TypeError(f"timeline[{i}].blocks: expected a mapping request id -> block "
                            f"table, got {type(record.blocks).__name__}")
        for rid, table in record.blocks.items():
            outside = [b for b in table if not 0 <= b < num_blocks]
            if outside:
                raise ValueError(f"timeline[{i}] (step {record.step}): request {rid!r} holds "
                                 f"block {outside[0]}, outside the pool [0, {num_blocks})")
        if not 0 <= record.free_blocks <= num_blocks:
            raise ValueError(f"timeline[{i}] (step {record.step}): free_blocks = "
                             f"{record.free_blocks} is outside [0, {num_blocks}]")
    return list(timeline)


def plot_timeline(timeline: Sequence, *, num_blocks: int, title: str | None = None) -> Figure:
    """Which request holds which blocks at every step of a serving run.

    timeline: :attr:`llmcore.serving.Scheduler.timeline`, a list of StepRecord(step, blocks,
    waiting, finished, free_blocks), each taken at the end of a step (before the requests that
    finished in it gave their blocks back). Top: block id against step, a cell coloured by the
    request holding the block (outlined in black in the step the request finished). Bottom: free
    blocks and waiting requests per step. Returns the Figure. Chapter 9.
    """
    records = _check_timeline(timeline, num_blocks)
    order: list = []
    for record in records:
        for rid in record.blocks:
            if rid not in order:
                order.append(rid)
    colors = colors_for(order)
    steps = [record.step for record in records]
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(min(8.0, max(6.0, 0.16 * len(records) + 2.5)), 0.15 * num_blocks + 3.0),
        height_ratios=[max(num_blocks, 4) * 0.16, 1.4], sharex=True, layout="constrained")
    plt.close(fig)
    for record in records:
        holders = block_owners(record.blocks)
        for block, rids in holders.items():
            ended = any(rid in record.finished for rid in rids)
            top.add_patch(Rectangle((record.step - 0.5, block - 0.5), 1, 1,
                                    facecolor=colors[rids[0]] if len(rids) == 1 else SHARED_COLOR,
                                    edgecolor="black" if ended else "white",
                                    linewidth=1.0 if ended else 0.4))
    top.set_xlim(min(steps) - 0.5, max(steps) + 0.5)
    top.set_ylim(num_blocks - 0.5, -0.5)                               # block 0 on top
    top.set_ylabel("physical block id")
    top.yaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    top.set_title("blocks held by each request (black outline: its last step)", fontsize=9)
    handles = [Patch(facecolor=colors[rid], label=str(rid)) for rid in order]
    top.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small",
               title="request", title_fontsize="small", frameon=False)
    bottom.step(steps, [r.free_blocks for r in records], where="mid", color="black",
                label="free blocks")
    bottom.bar(steps, [len(r.waiting) for r in records], color="#f2b8a2", width=0.8,
               label="requests waiting")
    bottom.set_ylim(0, num_blocks + 1)
    bottom.set_xlabel("step")
    bottom.set_ylabel("count")
    bottom.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
    bottom.grid(True, axis="y", alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig
