"""Heatmaps of attention weights: for every query (row), how much it reads each key (column).

An attention weight matrix A is (n, m): entry (i, j) is the share of value row j in query i's
output, a number in [0, 1], and each row sums to 1. Under a causal mask everything right of the
(bottom-right aligned) diagonal is 0. One head gives one such matrix; a layer gives h of them.

* :func:`token_labels` turns token texts into tick labels (spaces and newlines made visible).
* :func:`draw_heatmap` draws one matrix on an Axes you provide.
* :func:`plot_attention` draws the heads of one layer side by side with one colour bar and
  returns the Figure.

Figures made here are closed in pyplot's registry, so a notebook shows each exactly once, as the
cell's result. Chapter 3 (and 7).
"""

from __future__ import annotations

import math
from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.image import AxesImage

from .common import as_float_array, check_labels, panel_grid

MAX_TOKENS = 96
"""The most queries or keys a heatmap may have and still show one tick label per token."""

VISIBLE = {" ": "\u00b7", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
"""How :func:`token_labels` shows characters that would otherwise be invisible."""


def token_labels(pieces: Sequence[str]) -> list[str]:
    """Tick labels for tokens: each piece of text with spaces shown as a middle dot, newlines and
    tabs as ``\\n`` and ``\\t``, other control characters as ``\\xNN``.

    pieces: one str per token (e.g. ``[decode([t]) for t in ids]``) -> a list of the same length.
    Chapter 3.
    """
    if isinstance(pieces, str) or not isinstance(pieces, Sequence):
        raise TypeError(f"pieces: expected a sequence of str (one per token), got "
                        f"{type(pieces).__name__}")
    labels = []
    for index, piece in enumerate(pieces):
        if not isinstance(piece, str):
            raise TypeError(f"pieces[{index}]: expected a str, got {type(piece).__name__}")
        labels.append("".join(VISIBLE.get(ch, ch if ch.isprintable() else f"\\x{ord(ch):02x}")
                              for ch in piece))
    return labels


def check_weights(name: str, weights: object) -> np.ndarray:
    """Attention weights as a (h, n, m) float64 array; a single (n, m) matrix becomes h = 1.

    Raises TypeError for non-numeric input, ValueError for the wrong number of dimensions, more
    than :data:`MAX_TOKENS` queries or keys, more queries than keys, or entries outside [0, 1]
    (these are softmax outputs: scores, with their -inf, are not), naming ``name``.
    """
    array = as_float_array(name, weights, "attention weights")
    if array.ndim == 2:
        array = array[None]
    if array.ndim != 3:
        hint = " (pick one sequence of a batch: weights[0])" if array.ndim == 4 else ""
        raise ValueError(f"{name}: expected (n, m) or (h, n, m), got shape {array.shape}{hint}")
    h, n, m = array.shape
    if min(h, n, m) == 0:
        raise ValueError(f"{name}: expected at least one head, query and key, got shape "
                         f"{array.shape}")
    if max(n, m) > MAX_TOKENS:
        raise ValueError(f"{name}: at most {MAX_TOKENS} queries and keys can be labelled, got "
                         f"shape {array.shape}; use a shorter text")
    if n > m:
        raise ValueError(f"{name}: expected m >= n (each query is one of the last n keys), got "
                         f"n = {n} queries and m = {m} keys")
    if not np.isfinite(array).all() or array.min() < -1e-6 or array.max() > 1 + 1e-6:
        raise ValueError(f"{name}: expected softmax weights in [0, 1], got values from "
                         f"{np.nanmin(array):.3g} to {np.nanmax(array):.3g}"
                         f"{' (with non-finite entries)' if not np.isfinite(array).all() else ''}")
    return array


def draw_heatmap(ax: Axes, values: object, *, row_labels: Sequence[str] | None = None,
                 col_labels: Sequence[str] | None = None, title: str | None = None,
                 vmin: float = 0.0, vmax: float = 1.0, cmap: str = "viridis",
                 xlabel: str = "key", ylabel: str = "query", fontsize: float = 7.0,
                 ticks: bool = True) -> AxesImage:
    """Draw the matrix ``values`` (r, c) on ``ax``, one square per entry, coloured from vmin to vmax.

    row_labels / col_labels: one tick label per row / column (or None for index numbers).
    ticks: False leaves the tick positions and labels alone (for an Axes that shares them with
    one already set up). Returns the image, for a colour bar. Chapter 3.
    """
    if not isinstance(ax, Axes):
        raise TypeError(f"ax: expected a matplotlib Axes, got {type(ax).__name__}")
    array = as_float_array("values", values)
    if array.ndim != 2 or array.size == 0:
        raise ValueError(f"values: expected a non-empty (r, c) matrix, got shape {array.shape}")
    if not vmin < vmax:
        raise ValueError(f"vmin, vmax: expected vmin < vmax, got {vmin} and {vmax}")
    r, c = array.shape
    image = ax.imshow(array, cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest")
    for axis, labels, size, name in ((ax.xaxis, col_labels, c, "col_labels"),
                                     (ax.yaxis, row_labels, r, "row_labels")):
        labels = check_labels(name, labels, size)
        if not ticks:
            continue
        if labels is not None:
            axis.set_ticks(range(size), labels, fontsize=fontsize)
        else:
            step = max(1, math.ceil(size / 12))
            axis.set_ticks(range(0, size, step), [str(k) for k in range(0, size, step)],
                           fontsize=fontsize)
    if col_labels is not None:
        ax.tick_params(axis="x", labelrotation=90)
    ax.tick_params(length=0, labelsize=fontsize)     # per Axes, even where ticks are shared
    ax.set_xlabel(xlabel, fontsize=fontsize + 1)
    ax.set_ylabel(ylabel, fontsize=fontsize + 1)
    if title:
        ax.set_title(title, fontsize=fontsize + 2)
    return image


def plot_attention(weights: object, labels: Sequence[str] | None = None, *,
                   heads: Sequence[int] | None = None, title: str | None = None,
                   ncols: int = 2, cmap: str = "viridis", panel: float | None = None) -> Figure:
    """The attention weights of one layer as heatmaps, one panel per head, one shared colour bar.

    weights: (h, n, m) or (n, m), entries in [0, 1] (e.g. ``probe.attention_weights(...)[0]``).
    labels: m key labels (see :func:`token_labels`); queries are the last n keys, so they get the
    last n labels. heads: which heads to draw (default all), titled "head i". ncols: panels per
    row. panel: a panel's side in inches (default: grows with m). Returns the Figure. Chapter 3.
    """
    array = check_weights("weights", weights)
    h, n, m = array.shape
    labels = check_labels("labels", labels, m, "one per key")
    if heads is None:
        heads = list(range(h))
    if isinstance(heads, (str, bytes)) or not isinstance(heads, Sequence) or not heads:
        raise TypeError(f"heads: expected a non-empty sequence of head indices, got {heads!r}")
    for head in heads:
        if isinstance(head, bool) or not isinstance(head, (int, np.integer)) or not 0 <= head < h:
            raise ValueError(f"heads: expected indices in [0, {h}), got {list(heads)}")
    rows, cols = panel_grid(len(heads), ncols)
    side = panel if panel is not None else min(4.0, max(2.2, 0.11 * m + 1.0))
    fig, axes = plt.subplots(rows, cols, figsize=(side * cols + 0.8, side * rows + 0.4),
                             layout="constrained", squeeze=False, sharex=True, sharey=True)
    plt.close(fig)            # out of pyplot's registry: the caller owns (and displays) it
    image = None
    for index, (ax, head) in enumerate(zip(axes.flat, heads)):
        image = draw_heatmap(ax, array[head], row_labels=None if labels is None else labels[m - n:],
                             col_labels=labels, title=f"head {head}", cmap=cmap,
                             fontsize=7.0 if m <= 40 else 5.5,
                             xlabel="key" if index + cols >= len(heads) else "",
                             ylabel="query" if index % cols == 0 else "",
                             ticks=index == 0)             # shared axes: set once, for all
        # tick labels only on the outer panels (the axes are shared): fewer texts to lay out
        ax.tick_params(labelbottom=index + cols >= len(heads), labelleft=index % cols == 0)
    for ax in list(axes.flat)[len(heads):]:
        ax.axis("off")
    fig.colorbar(image, ax=axes, shrink=0.8, label="attention weight")
    if title:
        fig.suptitle(title)
    return fig
