"""course.figures.paging: block tables, the pool, reservations and the serving timeline are drawn
from the data they are given, and bad input is refused with a message naming it."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from llmcore import GPT, PagedKVCache, Request, serve  # noqa: E402
from course.figures.paging import (SHARED_COLOR, check_block_tables, colors_for,  # noqa: E402
                                    plot_block_tables, plot_paged_cache, plot_reservations,
                                    plot_timeline, reserved_slots)
from llmcore.serving import StepRecord  # noqa: E402
from conftest import TINY_GQA  # noqa: E402


def texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def test_block_tables_figure_shows_ids_shared_counts_and_free_blocks():
    tables = {"a": [3, 0, 5], "b": [3, 1]}
    fig = plot_block_tables(tables, {"a": 10, "b": 6}, num_blocks=8, block_size=4,
                            title="two sequences")
    top, bottom = fig.axes
    labels = texts(top)
    assert "a  (10 tokens)" in labels and "b  (6 tokens)" in labels
    assert labels.count("3") == 2                     # block 3 in both tables
    pool = texts(bottom)
    assert "3 (×2)" in pool and "0" in pool and "6: free" in pool and "7: free" in pool
    assert sum(label.endswith("free") for label in pool) == 8 - 4
    assert "4 free" in bottom.get_title() and fig.get_suptitle() == "two sequences"
    # slots: 8 blocks of 4 slots, each also outlined: 8 * (4 + 1) rectangles in the pool
    assert sum(isinstance(p, Rectangle) for p in bottom.patches) == 8 * 5
    shared_slots = [p for p in bottom.patches
                    if matplotlib.colors.same_color(p.get_facecolor(), SHARED_COLOR)]
    assert len(shared_slots) == 4                     # block 3 is full: 4 grey slots


def test_filled_slots_match_the_lengths():
    fig = plot_block_tables({"s": [0, 1]}, {"s": 5}, num_blocks=2, block_size=4)
    color = colors_for(["s"])["s"]
    pool = fig.axes[1]
    coloured = [p for p in pool.patches if matplotlib.colors.same_color(p.get_facecolor(), color)]
    assert len(coloured) == 5                         # 4 + 1 of the 8 slots hold a token


@pytest.mark.parametrize("tables, lengths, error, words", [
    ([0], {"a": 1}, TypeError, "tables: expected a mapping"),
    ({"a": [0]}, {"b": 1}, ValueError, "the same sequence ids"),
    ({"a": "01"}, {"a": 2}, TypeError, r"tables\['a'\]: expected a list"),
    ({"a": [9]}, {"a": 1}, ValueError, r"block id 9 is outside the pool \[0, 4\)"),
    ({"a": [1, 1]}, {"a": 5}, ValueError, "a block appears twice"),
    ({"a": [0]}, {"a": 5}, ValueError, "5 tokens in blocks of 4 need 2 blocks"),
    ({"a": [0.5]}, {"a": 1}, TypeError, "expected an int"),
])
def test_bad_tables_are_refused(tables, lengths, error, words):
    with pytest.raises(error, match=words):
        check_block_tables(tables, lengths, num_blocks=4, block_size=4)


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(num_blocks=0, block_size=4), ValueError, "num_blocks: expected an int >= 1"),
    (dict(num_blocks=4, block_size=True), TypeError, "block_size: expected an int"),
    (dict(num_blocks=10_000, block_size=4), ValueError, "drawn legibly"),
])
def test_bad_sizes_are_refused(kwargs, error, words):
    with pytest.raises(error, match=words):
        plot_block_tables({}, {}, **kwargs)


@torch.no_grad()
def test_paged_cache_figure_reads_a_real_cache_after_a_fork():
    model = GPT(TINY_GQA, seed=0).eval()
    cache = PagedKVCache.for_model(model, block_size=4, num_blocks=6)
    cache.add_sequence("p")
    model(torch.arange(6)[None], cache.batch(["p"]))
    cache.fork("p", "q")
    fig = plot_paged_cache(cache)
    pool = texts(fig.axes[1])
    table = cache.block_table("p")
    assert f"{table[0]} (×2)" in pool and f"{table[1]} (×2)" in pool
    assert "4 free" in fig.axes[1].get_title()


def test_paged_cache_figure_refuses_counts_that_disagree_with_the_tables():
    cache = PagedKVCache(n_layers=1, n_kv_heads=1, d_head=2, block_size=2, num_blocks=3,
                         max_seq_len=8)
    cache.allocator.allocate()                      # a reference no table accounts for
    with pytest.raises(ValueError, match="reference count 1 but 0 block tables list it"):
        plot_paged_cache(cache)
    with pytest.raises(TypeError, match="expected a PagedKVCache"):
        plot_paged_cache(object())


def test_reserved_slots_counts_both_schemes():
    assert reserved_slots([5, 16, 1], max_seq_len=32, block_size=8) == \
        {"used": 22, "contiguous": 96, "paged": 8 + 16 + 8}


def test_reservations_figure_titles_give_the_waste():
    fig = plot_reservations([5, 16, 1], max_seq_len=32, block_size=8)
    left, right = fig.axes[:2]
    assert f"{100 * (1 - 22 / 96):.1f}%" in left.get_title()
    assert f"{100 * (1 - 22 / 32):.1f}%" in right.get_title()
    assert len(left.patches) == 2 * 3 and len(right.patches) == 2 * 3   # reserved + used each


@pytest.mark.parametrize("lengths, error, words", [
    ([], ValueError, "at least one request"),
    ("12", TypeError, "sequence of token counts"),
    ([0], ValueError, r"lengths\[0\]: expected an int >= 1"),
    ([40], ValueError, "40 tokens exceed max_seq_len = 32"),
])
def test_bad_lengths_are_refused(lengths, error, words):
    with pytest.raises(error, match=words):
        plot_reservations(lengths, max_seq_len=32, block_size=8)


def record(step, blocks, free, waiting=(), finished=()):
    return StepRecord(step, blocks, tuple(waiting), tuple(finished), free)


def test_timeline_draws_one_cell_per_held_block_per_step():
    timeline = [record(0, {"r0": [0]}, 3),
                record(1, {"r0": [0, 2], "r1": [1]}, 1, waiting=["r2"]),
                record(2, {"r1": [1]}, 3, finished=["r1"])]
    fig = plot_timeline(timeline, num_blocks=4)
    top, bottom = fig.axes[:2]
    cells = [p for p in top.patches if isinstance(p, Rectangle)]
    assert len(cells) == 1 + 3 + 1
    finished = [p for p in cells if p.get_linewidth() == 1.0]
    assert len(finished) == 1 and finished[0].get_xy() == (1.5, 0.5)    # r1, block 1, step 2
    legend = [t.get_text() for t in top.get_legend().get_texts()]
    assert legend == ["r0", "r1"]
    free_line = bottom.get_lines()[0]
    assert list(free_line.get_ydata()) == [3, 1, 3]
    assert [p.get_height() for p in bottom.patches] == [0, 1, 0]        # waiting per step


@torch.no_grad()
def test_timeline_of_a_real_serving_run():
    model = GPT(TINY_GQA, seed=0).eval()
    cache = PagedKVCache.for_model(model, block_size=4, num_blocks=8)
    arrivals = [(0, Request("a", (1, 2, 3), 6)), (1, Request("b", (4,) * 9, 3)),
                (1, Request("c", (5, 6), 8))]
    scheduler = serve(model, cache, arrivals)
    fig = plot_timeline(scheduler.timeline, num_blocks=8)
    held = sum(len(t) for r in scheduler.timeline for t in r.blocks.values())
    assert len(fig.axes[0].patches) == held
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["a", "b", "c"]


@pytest.mark.parametrize("timeline, error, words", [
    ([], ValueError, "at least one step"),
    ("x", TypeError, "sequence of StepRecord"),
    ([object()], TypeError, r"timeline\[0\]: expected a StepRecord"),
    ([StepRecord(0, [1], (), (), 3)], TypeError, "blocks: expected a mapping"),
    ([StepRecord(4, {"r": [7]}, (), (), 3)], ValueError,
     r"step 4\): request 'r' holds block 7, outside the pool \[0, 4\)"),
    ([StepRecord(0, {}, (), (), 9)], ValueError, "free_blocks = 9"),
])
def test_bad_timelines_are_refused(timeline, error, words):
    with pytest.raises(error, match=words):
        plot_timeline(timeline, num_blocks=4)
