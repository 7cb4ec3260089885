"""Drawing small matrices as grids of coloured cells with their numbers written in.

For worked examples small enough to read entry by entry (the n=3, d=4, h=2 multi-head example of
chapter 4, the tiny KV-cache walk-through of chapter 7). Blocks of columns or rows can be tinted
by group, so that the heads laid side by side in W_q, Q or the heads' outputs, and the row blocks
of W_o that act on each head, are told apart at a glance; the tint's strength follows the entry's
magnitude. Masked scores (-inf) appear as grey cells marked "-inf".

* :func:`draw_matrix` draws one matrix on an Axes you provide.
* :func:`plot_matrices` lays matrices and operator symbols out in one row, all with the same cell
  size, e.g. ``plot_matrices(("X", x), "@", ("W_q", w_q, {"col_groups": 2}), "=", ("Q", q,
  {"col_groups": 2}))``, and returns the Figure.

Functions that make a figure close it in pyplot's registry, so a notebook shows it exactly once,
as the cell's result. Chapter 4 (and 7).
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from .common import as_float_array, check_labels

HEAD_COLORS = ("#3b75af", "#e1812c", "#3a923a", "#c03d3e", "#8d69b8", "#84584e", "#d684bd",
               "#7f7f7f")
"""Group (head) i is tinted HEAD_COLORS[i]; the same colours in every figure of the book."""

UNGROUPED_COLORS = ("#c0504d", "#4f81bd")
"""Cells outside any group: positive entries tinted the first colour, negative the second."""

MASKED_COLOR = "#d9d9d9"
"""Cells holding -inf (a masked score)."""

MAX_SIDE = 16
"""The most rows or columns a matrix may have and keep its numbers legible."""

Format = str | Callable[[float], str] | None


def as_matrix(name: str, values: object) -> np.ndarray:
    """A tensor, array or nested list of numbers -> a 2-D float64 array (a 1-D input is one row).

    Raises TypeError for non-numbers and ValueError for more than 2 dimensions, an empty matrix,
    more than :data:`MAX_SIDE` rows or columns, NaN or +inf, naming ``name``.
    """
    array = as_float_array(name, values, "numbers")
    if array.ndim == 1:
        array = array[None, :]                                        # a bias: one row
    if array.ndim != 2:
        raise ValueError(f"{name}: expected a matrix (1 or 2 dimensions), got shape "
                         f"{array.shape}")
    if array.size == 0:
        raise ValueError(f"{name}: expected at least one entry, got shape {array.shape}")
    if max(array.shape) > MAX_SIDE:
        raise ValueError(f"{name}: at most {MAX_SIDE} rows and columns can be drawn with their "
                         f"numbers, got shape {array.shape} (draw a heatmap instead)")
    if np.isnan(array).any() or np.isposinf(array).any():
        raise ValueError(f"{name}: expected finite numbers (or -inf for masked entries), got "
                         f"{'NaN' if np.isnan(array).any() else '+inf'}")
    return array


def group_of_each(name: str, size: int, groups: int | Sequence[int] | None) -> list[int] | None:
    """Group index of each of ``size`` rows or columns.

    groups: None (no groups); an int w (consecutive blocks of w: index i is in group i // w, and
    w must divide size); or one non-negative group index per row/column.
    """
    if groups is None:
        return None
    if isinstance(groups, (int, np.integer)) and not isinstance(groups, bool):
        if groups <= 0 or size % groups:
            raise ValueError(f"{name}: a block width must be positive and divide {size}, got "
                             f"{groups}")
        return [i // int(groups) for i in range(size)]
    if isinstance(groups, (str, bytes)) or not isinstance(groups, Sequence):
        raise TypeError(f"{name}: expected None, a block width (int) or one group index per "
                        f"entry, got {type(groups).__name__}")
    ids = list(groups)
    if len(ids) != size:
        raise ValueError(f"{name}: expected {size} group indices (one per entry), got {len(ids)}")
    if any(isinstance(g, bool) or not isinstance(g, (int, np.integer)) or g < 0 for g in ids):
        raise ValueError(f"{name}: group indices must be non-negative ints, got {ids}")
    return [int(g) for g in ids]


def formatter(fmt: Format, array: np.ndarray) -> Callable[[float], str]:
    """How a cell's number is written: a format string ("{:.2f}"), a function, or None (whole
    numbers without decimals when every finite entry is whole, else two decimals)."""
    if fmt is None:
        finite = array[np.isfinite(array)]
        fmt = "{:.0f}" if np.all(finite == np.round(finite)) else "{:.2f}"
    if isinstance(fmt, str):
        try:
            fmt.format(1.0)
        except (IndexError, KeyError, ValueError):
            raise ValueError(f"fmt: expected a format string with one field such as '{{:.2f}}', "
                             f"got {fmt!r}") from None
        return fmt.format
    if callable(fmt):
        return fmt
    raise TypeError(f"fmt: expected a format string, a function or None, got "
                    f"{type(fmt).__name__}")


def _tint(color: str, strength: float) -> tuple[float, float, float]:
    """``color`` mixed with white: strength 0 is white, 1 is the full colour."""
    r, g, b = to_rgb(color)
    return (1 - strength * (1 - r), 1 - strength * (1 - g), 1 - strength * (1 - b))


def _without_negative_zero(text: str) -> str:
    """"-0" or "-0.00" (a tiny negative number, rounded) is written without its sign."""
    try:
        return text[1:] if text.startswith("-") and float(text) == 0 else text
    except ValueError:
        return text


def label_margin(row_labels: Sequence[str] | None) -> float:
    """Width (in cells) left of the grid that the row labels need."""
    return 0.0 if not row_labels else 0.25 + 0.2 * max(len(label) for label in row_labels)


def draw_matrix(ax: Axes, values: object, *, title: str | None = None, fmt: Format = None,
                col_groups: int | Sequence[int] | None = None,
                row_groups: int | Sequence[int] | None = None,
                colors: Sequence[str] = HEAD_COLORS, row_labels: Sequence[str] | None = None,
                col_labels: Sequence[str] | None = None, show_shape: bool = True,
                fontsize: float = 8.0) -> Axes:
    """Draw ``values`` on ``ax`` as a grid of square cells, each holding its number.

    values: (r, c) (or (c,), drawn as one row), at most :data:`MAX_SIDE` per side. Cell (i, j)
    spans [j, j + 1] x [i, i + 1] in data coordinates, row 0 at the top.
    col_groups / row_groups: a block width (``col_groups=d_head`` tints each head's columns) or a
    group index per column / row; group g is tinted ``colors[g]``. Where both are given, the column
    group wins. Ungrouped cells are tinted red (positive) or blue (negative). The tint's strength
    grows with |value|; -inf cells are grey. The title goes above, the shape (r, c) below.
    Returns ``ax``. Chapter 4.
    """
    if not isinstance(ax, Axes):
        raise TypeError(f"ax: expected a matplotlib Axes, got {type(ax).__name__}")
    array = as_matrix("values", values)
    r, c = array.shape
    cols = group_of_each("col_groups", c, col_groups)
    rows = group_of_each("row_groups", r, row_groups)
    used = max((cols or []) + (rows or []), default=-1)
    if used >= len(colors):
        raise ValueError(f"colors: {used + 1} groups need {used + 1} colours, got {len(colors)}")
    row_labels = check_labels("row_labels", row_labels, r)
    col_labels = check_labels("col_labels", col_labels, c)
    write = formatter(fmt, array)
    finite = np.abs(array[np.isfinite(array)])
    scale = finite.max() if finite.size and finite.max() > 0 else 1.0
    for i in range(r):
        for j in range(c):
            value = array[i, j]
            group = cols[j] if cols is not None else rows[i] if rows is not None else None
            if value == -math.inf:
                face, text = MASKED_COLOR, "-inf"
            else:
                strength = 0.15 + 0.6 * abs(value) / scale
                base = colors[group] if group is not None else \
                    UNGROUPED_COLORS[0] if value >= 0 else UNGROUPED_COLORS[1]
                face, text = _tint(base, strength), _without_negative_zero(write(value))
            ax.add_patch(Rectangle((j, i), 1, 1, facecolor=face, edgecolor="white",
                                   linewidth=1.2))
            ax.text(j + 0.5, i + 0.5, text, ha="center", va="center", fontsize=fontsize)
    if row_labels:
        for i, label in enumerate(row_labels):
            ax.text(-0.15, i + 0.5, label, ha="right", va="center", fontsize=fontsize)
    top = 0.0
    if col_labels:
        top = -0.55
        for j, label in enumerate(col_labels):
            ax.text(j + 0.5, -0.15, label, ha="center", va="bottom", fontsize=fontsize)
    if title:
        ax.text(c / 2, top - 0.25, title, ha="center", va="bottom", fontsize=fontsize + 2)
    if show_shape:
        shape = f"({c},)" if np.ndim(values) == 1 else f"({r}, {c})"
        ax.text(c / 2, r + 0.2, shape, ha="center", va="top", fontsize=fontsize - 0.5,
                color="#555555")
    ax.set_xlim(-label_margin(row_labels) - 0.05, c + 0.05)
    ax.set_ylim(r + 0.9, top - 1.2)                                    # row 0 at the top
    ax.set_aspect("equal")
    ax.axis("off")
    return ax


MatrixItem = tuple[str, object] | tuple[str, object, Mapping[str, object]]


def plot_matrices(*items: str | MatrixItem, cell: float = 0.45, fmt: Format = None,
                  title: str | None = None) -> Figure:
    """Matrices and operator symbols in one row, every cell the same size; returns the Figure.

    items: a str is drawn as a symbol ("@", "=", "+", "->"); a tuple (title, values) or
    (title, values, options) is a matrix drawn by :func:`draw_matrix`, options being its keyword
    arguments (col_groups, row_groups, row_labels, fmt, ...). fmt applies to every matrix that
    sets none. cell: a cell's side in inches. Matrices of fewer rows are centred vertically.
    Chapter 4.
    """
    if not items:
        raise ValueError("items: expected at least one matrix, got none")
    parsed: list[tuple[str, object] | tuple[str, np.ndarray, object, dict]] = []
    for index, item in enumerate(items):
        if isinstance(item, str):
            parsed.append(("symbol", item))
            continue
        if not isinstance(item, tuple) or len(item) not in (2, 3) or not isinstance(item[0], str):
            raise TypeError(f"items[{index}]: expected a symbol (str) or a tuple (title, values) "
                            f"or (title, values, options), got {item!r:.80}")
        options = dict(item[2]) if len(item) == 3 else {}
        if "title" in options or "values" in options:
            raise ValueError(f"items[{index}]: title and values go in the tuple, not the options")
        options.setdefault("fmt", fmt)
        parsed.append((item[0], as_matrix(f"items[{index}] ({item[0]})", item[1]), item[1],
                       options))
    if all(entry[0] == "symbol" for entry in parsed):
        raise ValueError("items: expected at least one matrix, got only symbols")
    if not (isinstance(cell, (int, float)) and 0.1 <= cell <= 2.0):
        raise ValueError(f"cell: expected a side between 0.1 and 2 inches, got {cell!r}")
    tallest = max(entry[1].shape[0] for entry in parsed if len(entry) == 4)
    head_room = 1.2 + max((0.55 for entry in parsed if len(entry) == 4
                           and entry[3].get("col_labels") is not None), default=0.0)
    height = tallest + 0.9 + head_room                                 # in cells
    widths = []
    for entry in parsed:
        if len(entry) == 2:
            widths.append(max(0.9, 0.5 + 0.2 * len(entry[1])))       # room for a word
        else:
            widths.append(entry[1].shape[1] + 0.1 + label_margin(entry[3].get("row_labels")))
    gap = 0.3
    total = sum(widths) + gap * (len(widths) + 1)
    fig = plt.figure(figsize=(total * cell, height * cell))
    plt.close(fig)            # out of pyplot's registry: the caller owns (and displays) it
    left = gap
    for entry, width in zip(parsed, widths):
        ax = fig.add_axes((left / total, 0.0, width / total, 1.0))
        left += width + gap
        if len(entry) == 2:
            ax.text(0.5, 0.5, entry[1], ha="center", va="center",
                    fontsize=14 if len(entry[1]) <= 2 else 10, transform=ax.transAxes)
            ax.axis("off")
            continue
        name, array, original, options = entry
        draw_matrix(ax, original, title=name, **options)
        r = array.shape[0]
        middle = r / 2                                                # centre on the tallest
        ax.set_ylim(middle + tallest / 2 + 0.9, middle - tallest / 2 - head_room)
    if title:
        fig.suptitle(title, fontsize=11, y=1.0, va="bottom")
    return fig
