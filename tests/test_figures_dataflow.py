"""course.figures.dataflow: views are told from new memory by storage, shapes and shares are
drawn as given, and bad input is refused with a message naming it."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

from course.figures.dataflow import (NEW_COLOR, VIEW_COLOR, plot_data_flow,  # noqa: E402
                                      plot_step_costs, step_shares, storage_kinds)
from llmcore.multihead import merge_heads, split_heads  # noqa: E402


def head_chain(device="cpu"):
    x = torch.randn(2, 5, 12, device=device)                      # (b, n, d), h = 3
    w = torch.randn(12, 36, device=device)
    qkv = x @ w                                                    # (b, n, 3d)
    q = qkv[..., :12]
    heads = split_heads(q, 3)                                      # (b, h, n, d_head)
    scaled = heads.contiguous()                                    # new, head-major memory
    merged = merge_heads(scaled)                                   # a copy: heads interleave
    return [("x", x, "input"), ("qkv", qkv, "x @ W"), ("q", q, "split"),
            ("heads", heads, "split_heads"), ("scaled", scaled, "contiguous()"),
            ("merged", merged, "merge_heads")]


def test_storage_kinds_names_the_owner_of_each_view(device):
    assert storage_kinds(head_chain(device)) == [None, None, "qkv", "qkv", None, None]


def test_merging_heads_straight_after_splitting_them_is_a_view():
    q = torch.randn(2, 5, 12)
    steps = [("q", q, "input"), ("back", merge_heads(split_heads(q, 3)), "split, merge")]
    assert storage_kinds(steps) == [None, "q"]          # the original layout: nothing to copy


def test_a_slice_at_an_offset_is_still_a_view_of_its_owner():
    base = torch.zeros(4, 6)
    steps = [("base", base, "input"), ("tail", base[:, 3:], "slice"),
             ("copy", base[:, 3:].contiguous(), "contiguous")]
    assert storage_kinds(steps) == [None, "base", None]


def test_data_flow_figure_writes_shapes_and_colours_views():
    fig = plot_data_flow(head_chain(), symbols={2: "b", 5: "n", 12: "d", 36: "3d", 3: "h",
                                                4: "d_head"}, title="chain")
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert "(b, h, n, d_head) = (2, 3, 5, 4)" in texts
    assert "view of qkv's memory" in texts and "input" in texts
    assert f"new memory, {2 * 5 * 36 * 4 / 1024:.1f} KiB" in texts          # qkv, float32
    assert "split_heads" in texts and "merge_heads" in texts
    faces = [matplotlib.colors.to_hex(p.get_facecolor()) for p in ax.patches]
    assert faces.count(VIEW_COLOR) == 2 and faces.count(NEW_COLOR) == 3
    assert ax.get_title() == "chain"


@pytest.mark.parametrize("steps, error, words", [
    ([], ValueError, "at least one"),
    ("abc", TypeError, "sequence of"),
    ([("x", torch.zeros(2))], TypeError, r"steps\[0\]: expected a \(name, tensor, operation\)"),
    ([("x", [1.0], "input")], TypeError, r"steps\[0\] \(x\): expected a torch.Tensor"),
    ([(1, torch.zeros(2), "input")], TypeError, "must be str"),
    ([("x", torch.zeros(2, device="meta"), "input")], ValueError, "meta tensor has no memory"),
    ([("x", torch.zeros(1), "op")] * 30, ValueError, "at most 24 steps"),
])
def test_bad_steps_are_refused(steps, error, words):
    with pytest.raises(error, match=words):
        plot_data_flow(steps)


def test_shares_sum_to_one_per_measure():
    shares = step_shares({"FLOPs": {"a": 1, "b": 3, "c": 0}, "time": {"a": 2.0, "b": 1.0,
                                                                      "c": 1.0}})
    assert shares["FLOPs"] == {"a": 0.25, "b": 0.75, "c": 0.0}
    assert shares["time"] == {"a": 0.5, "b": 0.25, "c": 0.25}


def test_step_costs_figure_has_a_panel_per_measure_with_percent_labels():
    fig = plot_step_costs({"FLOPs": {"proj": 3, "attn": 1}, "time": {"proj": 1, "attn": 1}},
                          title="costs")
    flops_ax, time_ax = fig.axes
    assert flops_ax.get_title() == "FLOPs" and time_ax.get_title() == "time"
    assert [t.get_text() for t in flops_ax.texts] == ["75.0%", "25.0%"]
    assert [t.get_text() for t in time_ax.texts] == ["50.0%", "50.0%"]
    assert [round(p.get_width(), 6) for p in flops_ax.patches] == [75.0, 25.0]
    assert [t.get_text() for t in flops_ax.get_yticklabels()] == ["proj", "attn"]
    assert fig.get_suptitle() == "costs"


@pytest.mark.parametrize("costs, error, words", [
    ({}, ValueError, "at least one measure"),
    ([1], TypeError, "expected a mapping measure"),
    ({"f": {}}, TypeError, r"costs\['f'\]: expected a non-empty mapping"),
    ({"f": {"a": 1, "b": 2}, "t": {"b": 1, "a": 2}}, ValueError, "the steps"),
    ({"f": {"a": "1"}}, TypeError, r"costs\['f'\]\['a'\]: expected a number"),
    ({"f": {"a": -1.0}}, ValueError, "finite number >= 0"),
    ({"f": {"a": float("nan")}}, ValueError, "finite number >= 0"),
    ({"f": {"a": 0, "b": 0}}, ValueError, "every value is 0"),
    ({1: {"a": 1}}, TypeError, "measure names must be str"),
])
def test_bad_costs_are_refused(costs, error, words):
    with pytest.raises(error, match=words):
        plot_step_costs(costs)
