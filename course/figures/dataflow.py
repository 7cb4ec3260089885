"""Drawing the data flow of an attention layer: the tensors it makes, and where its cost goes.

* :func:`storage_kinds` says, for tensors listed in the order a computation makes them, which
  ones read memory an earlier tensor already owns (views: reshapes, transposes, splits) and
  which got memory of their own (products, softmax, copies).
* :func:`plot_data_flow` draws such a chain as boxes top to bottom, each with its shape and the
  operation that made it, coloured by that distinction.
* :func:`plot_step_costs` draws, for one or more measures (FLOPs, measured time, bytes), each
  step's share of the total as horizontal bars, one panel per measure.

Every function that draws returns a matplotlib Figure and leaves nothing open in pyplot's
registry, so a notebook cell shows it exactly once, as the cell's result. Chapter 10.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Patch
from torch import Tensor

from llmcore.shapes import check_tensor, format_shape

VIEW_COLOR = "#cfe3f3"
"""A tensor that reads memory an earlier tensor owns: no data moved to make it."""

NEW_COLOR = "#f6d0b8"
"""A tensor with memory of its own: its numbers were computed or copied into place."""

INPUT_COLOR = "#e4e4e4"
"""The first tensor of the chain (the layer's input)."""

MAX_STEPS = 24
"""The most steps a drawing may hold and stay legible."""


def _check_steps(steps: object) -> list[tuple[str, Tensor, str]]:
    if isinstance(steps, (str, bytes)) or not isinstance(steps, Sequence):
        raise TypeError(f"steps: expected a sequence of (name, tensor, operation) triples, got "
                        f"{type(steps).__name__}")
    if not steps:
        raise ValueError("steps: expected at least one (name, tensor, operation), got none")
    if len(steps) > MAX_STEPS:
        raise ValueError(f"steps: at most {MAX_STEPS} steps can be drawn legibly, got "
                         f"{len(steps)}")
    checked = []
    for i, step in enumerate(steps):
        if not isinstance(step, (tuple, list)) or len(step) != 3:
            raise TypeError(f"steps[{i}]: expected a (name, tensor, operation) triple, got "
                            f"{step!r:.60}")
        name, tensor, operation = step
        if not isinstance(name, str) or not isinstance(operation, str):
            raise TypeError(f"steps[{i}]: name and operation must be str, got "
                            f"{type(name).__name__} and {type(operation).__name__}")
        check_tensor(f"steps[{i}] ({name})", tensor)
        if tensor.device.type == "meta":
            raise ValueError(f"steps[{i}] ({name}): a meta tensor has no memory, so whether it "
                             "is a view cannot be told")
        checked.append((name, tensor, operation))
    return checked


def storage_kinds(steps: Sequence[tuple[str, Tensor, str]]) -> list[str | None]:
    """For each step, the name of the earlier step whose memory its tensor reads, or None.

    steps: (name, tensor, operation) in the order they were computed. A tensor "reads" an
    earlier one's memory when both have the same underlying storage (``untyped_storage()``); the
    first step, and any tensor with a storage not seen before, gets None (memory of its own).
    Chapter 10.
    """
    seen: dict[tuple, str] = {}
    kinds: list[str | None] = []
    for name, tensor, _ in _check_steps(steps):
        key = (tensor.device, tensor.untyped_storage().data_ptr())
        kinds.append(seen.get(key))
        seen.setdefault(key, name)
    return kinds


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def plot_data_flow(steps: Sequence[tuple[str, Tensor, str]], *, title: str | None = None,
                   symbols: Mapping[int, str] | None = None) -> Figure:
    """The chain of tensors a computation makes, top to bottom, with shapes and operations.

    steps: (name, tensor, operation) triples in order; operation is what made the tensor from the
    previous ones (written on the arrow into its box). A box is blue when the tensor reads memory
    an earlier tensor owns (a view; the box names the owner) and orange when it has memory of its
    own (its size in bytes is shown). symbols: optional size -> letter, e.g. {2: "b", 5: "n"},
    to write shapes as (b, n, d) beside the numbers. Returns the Figure. Chapter 10.
    """
    checked = _check_steps(steps)
    if symbols is not None and not isinstance(symbols, Mapping):
        raise TypeError(f"symbols: expected a mapping size -> name, got {type(symbols).__name__}")
    owners = storage_kinds(checked)
    height = 0.62 * len(checked) + 1.0
    fig, ax = plt.subplots(figsize=(7.6, height), layout="constrained")
    plt.close(fig)            # out of pyplot's registry: the caller owns (and displays) it
    for i, ((name, tensor, operation), owner) in enumerate(zip(checked, owners)):
        y = len(checked) - 1 - i
        if i == 0:
            color, note = INPUT_COLOR, "input"
        elif owner is None:
            color, note = NEW_COLOR, f"new memory, {_bytes(tensor.numel() * tensor.element_size())}"
        else:
            color, note = VIEW_COLOR, f"view of {owner}'s memory"
        ax.add_patch(FancyBboxPatch((0.0, y + 0.12), 4.6, 0.56, boxstyle="round,pad=0.02",
                                    facecolor=color, edgecolor="#555555", linewidth=0.8))
        shape = format_shape(tensor.shape)
        if symbols:
            shape = f"{format_shape([symbols.get(s, s) for s in tensor.shape])} = {shape}"
        ax.text(0.12, y + 0.4, name, ha="left", va="center", fontsize=9, fontweight="bold")
        ax.text(1.45, y + 0.4, shape, ha="left", va="center", fontsize=8, family="monospace")
        ax.text(4.75, y + 0.4, note, ha="left", va="center", fontsize=8)
        if i > 0:
            ax.annotate("", xy=(0.6, y + 0.69), xytext=(0.6, y + 1.11),
                        arrowprops=dict(arrowstyle="->", color="#333333", linewidth=0.8))
            ax.text(0.72, y + 0.9, operation, ha="left", va="center", fontsize=7.5,
                    color="#333333", style="italic")
    ax.set_xlim(-0.1, 7.6)
    ax.set_ylim(-0.1, len(checked) + 0.1)
    ax.axis("off")
    fig.legend(handles=[Patch(facecolor=VIEW_COLOR, edgecolor="#555555",
                              label="view: no data moved"),
                        Patch(facecolor=NEW_COLOR, edgecolor="#555555",
                              label="new memory: computed or copied")],
               loc="outside lower center", ncols=2, fontsize="small", frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
    return fig


def _check_costs(costs: object) -> dict[str, dict[str, float]]:
    if not isinstance(costs, Mapping):
        raise TypeError(f"costs: expected a mapping measure -> (step -> value), got "
                        f"{type(costs).__name__}")
    if not costs:
        raise ValueError("costs: expected at least one measure, got none")
    checked: dict[str, dict[str, float]] = {}
    steps: list[str] | None = None
    for measure, values in costs.items():
        if not isinstance(measure, str):
            raise TypeError(f"costs: measure names must be str, got {measure!r}")
        if not isinstance(values, Mapping) or not values:
            raise TypeError(f"costs[{measure!r}]: expected a non-empty mapping step -> value, "
                            f"got {values!r:.60}")
        if steps is None:
            steps = list(values)
        elif list(values) != steps:
            raise ValueError(f"costs[{measure!r}]: expected the steps {steps} in that order, "
                             f"got {list(values)}")
        row = {}
        for step, value in values.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"costs[{measure!r}][{step!r}]: expected a number, got "
                                f"{type(value).__name__}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"costs[{measure!r}][{step!r}]: expected a finite number >= 0, "
                                 f"got {value}")
            row[step] = float(value)
        if sum(row.values()) <= 0:
            raise ValueError(f"costs[{measure!r}]: every value is 0, so there are no shares")
        checked[measure] = row
    return checked


def step_shares(costs: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """Each step's fraction of each measure's total: measure -> (step -> share in [0, 1])."""
    checked = _check_costs(costs)
    return {measure: {step: value / sum(row.values()) for step, value in row.items()}
            for measure, row in checked.items()}


def plot_step_costs(costs: Mapping[str, Mapping[str, float]], *,
                    title: str | None = None) -> Figure:
    """Each step's share of the total, one panel per measure, steps top to bottom.

    costs: measure -> (step -> value >= 0), every measure over the same steps in the same order,
    e.g. ``{"FLOPs": {"W_qkv": 2.4e6, ...}, "measured time": {"W_qkv": 3e-5, ...}}``. Each bar is
    labelled with its percentage. Returns the Figure. Chapter 10.
    """
    shares = step_shares(costs)
    steps = list(next(iter(shares.values())))
    fig, axes = plt.subplots(1, len(shares), figsize=(2.8 * len(shares) + 1.4,
                                                      0.3 * len(steps) + 1.1),
                             sharey=True, squeeze=False, layout="constrained")
    plt.close(fig)
    for ax, (measure, row) in zip(axes[0], shares.items()):
        values = [100 * row[s] for s in steps]
        ax.barh(range(len(steps)), values, color="#3b75af", height=0.7)
        for y, value in enumerate(values):
            ax.text(value + 1.5, y, f"{value:.1f}%", va="center", fontsize=7.5)
        ax.set_xlim(0, 115)
        ax.set_xlabel("% of the total")
        ax.set_title(measure, fontsize=9)
        ax.grid(True, axis="x", alpha=0.3)
    axes[0][0].set_yticks(range(len(steps)), steps, fontsize=8)
    axes[0][0].invert_yaxis()                                  # first step on top (y is shared)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig
