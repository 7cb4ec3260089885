"""Drawing attention masks and padded batches as grids of cells.

A mask says, for each new token (a row, the query i) and each key slot (a column j), whether the
query may attend to that key. The model's masks are (b, 1, n, m) bool tensors, one (n, m) panel
per sequence (:class:`llmcore.layout.Layout`); a padded batch is (b, n) tokens with a (b, n)
attention mask that is False on padding (:func:`llmcore.batching.pad_batch`).

* :func:`check_mask` turns an (n, m), (b, n, m) or (b, 1, n, m) bool mask into a (b, n, m) array.
* :func:`draw_mask` draws one (n, m) mask on an Axes: blue where the query may attend, pale where
  the key is in its future, grey where the key slot holds padding.
* :func:`plot_masks` draws every sequence's mask side by side, with one legend.
* :func:`plot_padded_batch` draws a (b, n) batch: each token's text over its position, padding
  slots grey.

Functions that make a figure close it in pyplot's registry, so a notebook shows it exactly once,
as the cell's result. Chapter 8 (and 7, 9).
"""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from .common import check_labels, panel_grid

ALLOWED_COLOR = "#3b75af"
"""A cell where the query may attend to the key."""

FUTURE_COLOR = "#eef1f5"
"""A masked cell whose key is a real token the query may not see (a later token)."""

PADDING_COLOR = "#b8b8b8"
"""A masked cell whose key slot holds padding (or a padding slot in a batch drawing)."""

MAX_SIDE = 64
"""The most rows or columns a mask panel may have and stay readable."""


def _as_bool_array(name: str, values: object) -> np.ndarray:
    """A bool tensor or array -> a NumPy bool array (copied to the CPU)."""
    if isinstance(values, torch.Tensor):
        if values.device.type == "meta":
            raise ValueError(f"{name}: a tensor on the meta device has no values to draw")
        if values.dtype != torch.bool:
            raise TypeError(f"{name}: expected a bool tensor (True = may attend / real token), "
                            f"got {values.dtype}")
        return values.detach().cpu().numpy()
    array = np.asarray(values)
    if array.dtype != np.bool_:
        raise TypeError(f"{name}: expected bool values (True = may attend / real token), got "
                        f"{array.dtype}")
    return array


def check_mask(name: str, mask: object) -> np.ndarray:
    """An attention mask as a (b, n, m) NumPy bool array.

    mask: (n, m) (one sequence, b = 1), (b, n, m), or the model's (b, 1, n, m). Raises TypeError
    unless the values are bool, ValueError for another number of dimensions, a head axis other
    than 1, an empty mask, or more than :data:`MAX_SIDE` rows or columns, naming ``name``.
    """
    array = _as_bool_array(name, mask)
    if array.ndim == 4:
        if array.shape[1] != 1:
            raise ValueError(f"{name}: a 4-D mask must be (b, 1, n, m), got shape {array.shape}")
        array = array[:, 0]
    elif array.ndim == 2:
        array = array[None]
    elif array.ndim != 3:
        raise ValueError(f"{name}: expected shape (n, m), (b, n, m) or (b, 1, n, m), got "
                         f"{array.shape}")
    if array.size == 0:
        raise ValueError(f"{name}: expected at least one entry, got shape {array.shape}")
    if max(array.shape[1:]) > MAX_SIDE:
        raise ValueError(f"{name}: at most {MAX_SIDE} rows and columns can be drawn, got "
                         f"(n, m) = {array.shape[1:]}")
    return array


def _per_sequence(name: str, values: Sequence | None, b: int) -> list:
    """One entry per sequence (or b Nones)."""
    if values is None:
        return [None] * b
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray,
                                                                   torch.Tensor)):
        raise TypeError(f"{name}: expected one entry per sequence ({b}), got "
                        f"{type(values).__name__}")
    if len(values) != b:
        raise ValueError(f"{name}: expected one entry per sequence ({b}), got {len(values)}")
    return list(values)


def legend_handles(padding: bool = True) -> list[Patch]:
    """Legend entries for the cell colours of :func:`draw_mask`."""
    handles = [Patch(facecolor=ALLOWED_COLOR, label="may attend"),
               Patch(facecolor=FUTURE_COLOR, edgecolor="#999999", label="masked: future key")]
    if padding:
        handles.append(Patch(facecolor=PADDING_COLOR, label="masked: padding key"))
    return handles


def draw_mask(ax: Axes, mask: object, *, padding: object = None,
              row_labels: Sequence[str] | None = None, col_labels: Sequence[str] | None = None,
              title: str | None = None, fontsize: float = 7.0) -> Axes:
    """Draw one (n, m) mask on ``ax``: cell (i, j) is query i against key slot j, row 0 on top.

    The cells are one image (``ax.images[0]``, RGB, pixel (i, j) = cell (i, j)), fast even for
    many panels.

    mask: (n, m) bool (or (1, n, m), (1, 1, n, m)), True where the query may attend.
    padding: (m,) bool, True where key slot j holds padding; masked cells in those columns are
    drawn grey, other masked cells pale (the causal mask's future). Without it every masked cell
    is pale. row_labels: n labels (e.g. the queries' positions); col_labels: m labels (e.g. the
    keys' tokens). Returns ``ax``. Chapter 8.
    """
    if not isinstance(ax, Axes):
        raise TypeError(f"ax: expected a matplotlib Axes, got {type(ax).__name__}")
    array = check_mask("mask", mask)
    if array.shape[0] != 1:
        raise ValueError(f"mask: draw_mask draws one sequence, got b = {array.shape[0]} "
                         "(use plot_masks)")
    array = array[0]
    n, m = array.shape
    pad = np.zeros(m, dtype=bool) if padding is None else _as_bool_array("padding", padding)
    if pad.shape != (m,):
        raise ValueError(f"padding: expected shape ({m},), one flag per key slot, got "
                         f"{pad.shape}")
    row_labels = check_labels("row_labels", row_labels, n)
    col_labels = check_labels("col_labels", col_labels, m)
    palette = np.array([to_rgb(c) for c in (FUTURE_COLOR, PADDING_COLOR, ALLOWED_COLOR)])
    kind = np.where(array, 2, np.where(pad[None, :], 1, 0))           # (n, m): index into palette
    ax.imshow(palette[kind], extent=(0, m, n, 0), interpolation="nearest")   # one image: fast
    ax.vlines(range(1, m), 0, n, colors="white", linewidth=1.0)        # cell borders
    ax.hlines(range(1, n), 0, m, colors="white", linewidth=1.0)
    ax.set_xlim(0, m)
    ax.set_ylim(n, 0)                                                  # row 0 at the top
    ax.set_aspect("equal")
    ax.set_xticks([j + 0.5 for j in range(m)],
                  col_labels if col_labels is not None else [str(j) for j in range(m)],
                  fontsize=fontsize)
    ax.set_yticks([i + 0.5 for i in range(n)],
                  row_labels if row_labels is not None else [str(i) for i in range(n)],
                  fontsize=fontsize)
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_xlabel("key slot j", fontsize=fontsize + 1)
    ax.set_ylabel("query i", fontsize=fontsize + 1)
    if title:
        ax.set_title(title, fontsize=fontsize + 2)
    return ax


def plot_masks(mask: object, *, padding: object = None,
               row_labels: Sequence[Sequence[str]] | None = None,
               col_labels: Sequence[Sequence[str]] | None = None,
               titles: Sequence[str] | None = None, title: str | None = None,
               cell: float = 0.3, ncols: int | None = None) -> Figure:
    """Every sequence's mask, one panel each, with a legend; returns the Figure.

    mask: (b, 1, n, m), (b, n, m) or (n, m) bool (a :class:`llmcore.layout.Layout`'s ``mask``).
    padding: (b, m) bool, True where sequence s's key slot j holds padding (or None).
    row_labels / col_labels / titles: one entry per sequence (n labels / m labels / a str); the
    default titles are "sequence s". cell: a cell's side in inches. ncols: panels per row
    (default: all b in one row). Chapter 8.
    """
    array = check_mask("mask", mask)
    b, n, m = array.shape
    if padding is not None:
        pad = _as_bool_array("padding", padding)
        if pad.shape != (b, m):
            raise ValueError(f"padding: expected shape ({b}, {m}), one flag per sequence and "
                             f"key slot, got {pad.shape}")
    else:
        pad = None
    rows = _per_sequence("row_labels", row_labels, b)
    cols = _per_sequence("col_labels", col_labels, b)
    names = _per_sequence("titles", titles, b)
    if not (isinstance(cell, (int, float)) and 0.05 <= cell <= 1.0):
        raise ValueError(f"cell: expected a side between 0.05 and 1 inch, got {cell!r}")
    nrows, ncols = panel_grid(b, b if ncols is None else ncols)
    width = ncols * (m * cell + 0.9) + 0.3
    height = nrows * (n * cell + 1.1) + 0.5
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False,
                             layout="constrained")
    plt.close(fig)            # out of pyplot's registry: the caller owns (and displays) it
    for s, ax in enumerate(axes.flat):
        if s >= b:
            ax.axis("off")                                             # an empty grid slot
            continue
        draw_mask(ax, array[s], padding=None if pad is None else pad[s], row_labels=rows[s],
                  col_labels=cols[s], title=names[s] if names[s] is not None else f"sequence {s}")
    fig.legend(handles=legend_handles(padding=pad is not None and bool(pad.any())),
               loc="outside lower center", ncols=3, fontsize="small", frameon=False)
    if title:
        fig.suptitle(title)
    return fig


def plot_padded_batch(labels: Sequence[Sequence[str]], attention_mask: object,
                      positions: object = None, *, title: str | None = None,
                      cell: float = 0.55) -> Figure:
    """A padded batch as a (b, n) grid: each slot's token text, with its position beneath.

    labels: b sequences of n strings (the tokens' text; padding slots may hold anything);
    attention_mask: (b, n) bool, False on padding (drawn grey, labelled "pad");
    positions: (b, n) ints, the position each real token gets (written under its text), or None.
    Returns the Figure. Chapter 8.
    """
    valid = _as_bool_array("attention_mask", attention_mask)
    if valid.ndim != 2 or valid.size == 0:
        raise ValueError(f"attention_mask: expected a non-empty (b, n) mask, got shape "
                         f"{valid.shape}")
    b, n = valid.shape
    if n > MAX_SIDE:
        raise ValueError(f"attention_mask: at most {MAX_SIDE} slots can be drawn, got n = {n}")
    rows = [check_labels(f"labels[{s}]", row, n) for s, row in enumerate(_per_sequence("labels",
                                                                                  labels, b))]
    if positions is not None:
        if isinstance(positions, torch.Tensor):
            positions = positions.detach().cpu().numpy()
        pos = np.asarray(positions)
        if pos.shape != (b, n) or not np.issubdtype(pos.dtype, np.integer):
            raise ValueError(f"positions: expected ({b}, {n}) integers, got shape {pos.shape} "
                             f"of {pos.dtype}")
    else:
        pos = None
    if not (isinstance(cell, (int, float)) and 0.1 <= cell <= 2.0):
        raise ValueError(f"cell: expected a side between 0.1 and 2 inches, got {cell!r}")
    fig, ax = plt.subplots(figsize=(n * cell + 1.2, b * cell + 0.9), layout="constrained")
    plt.close(fig)
    for s in range(b):
        for j in range(n):
            real = bool(valid[s, j])
            ax.add_patch(Rectangle((j, s), 1, 1, facecolor="#dbe6f1" if real else PADDING_COLOR,
                                   edgecolor="white", linewidth=1.5))
            text = rows[s][j] if real else "pad"
            ax.text(j + 0.5, s + 0.42, text, ha="center", va="center", fontsize=9,
                    family="monospace", color="black" if real else "#555555")
            if pos is not None and real:
                ax.text(j + 0.5, s + 0.82, f"{int(pos[s, j])}", ha="center", va="center",
                        fontsize=6.5, color="#3b75af")
    ax.set_xlim(0, n)
    ax.set_ylim(b, 0)
    ax.set_aspect("equal")
    ax.set_xticks([j + 0.5 for j in range(n)], [str(j) for j in range(n)], fontsize=7)
    ax.set_yticks([s + 0.5 for s in range(b)], [f"sequence {s}" for s in range(b)], fontsize=8)
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_xlabel("slot (column of the (b, n) batch)" +
                  ("; small numbers: positions" if pos is not None else ""), fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    return fig
