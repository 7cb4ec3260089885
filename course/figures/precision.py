"""Drawing numbers by their bits, and what fewer bits cost.

A floating-point number is three fields of bits: a sign, an exponent and a mantissa (the
fraction). :func:`float_fields` reads how many bits a torch floating dtype gives each field (from
``torch.finfo``), :func:`float_bits` reads the bits a number actually has in that dtype (through a
view of its storage as an integer of the same width, nothing recomputed), and
:func:`plot_float_bits` draws several numbers in several formats as rows of coloured bits, with
the value each row stands for.

:func:`plot_tradeoff` draws one point per precision (a name -> (x, y) mapping), each labelled,
for figures such as "bits per byte against bits per weight"; a second call adds another set.
Functions that make a figure close it in pyplot's registry, so a notebook shows it exactly once.
Chapter 13.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from .common import finish_axes

FIELD_COLORS = {"sign": "#c03d3e", "exponent": "#3a923a", "mantissa": "#3b75af"}
"""The colour of each field of a float's bits, the same in every figure."""

INTEGER_OF_WIDTH = {8: torch.int8, 16: torch.int16, 32: torch.int32, 64: torch.int64}
"""A signed integer dtype of each width: a float's storage is viewed as one to read its bits."""


def _check_float_dtype(dtype: object) -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype: expected a torch floating dtype (torch.float32, "
                        f"torch.bfloat16, ...), got {dtype!r}")
    if torch.finfo(dtype).bits not in INTEGER_OF_WIDTH:
        raise ValueError(f"dtype: {dtype} has {torch.finfo(dtype).bits} bits; expected one of "
                         f"{sorted(INTEGER_OF_WIDTH)}")
    return dtype


def float_fields(dtype: torch.dtype) -> tuple[int, int, int]:
    """(sign, exponent, mantissa) bit counts of a floating dtype: (1, 8, 23) for float32,
    (1, 8, 7) for bfloat16, (1, 5, 10) for float16. The mantissa bits are read from the spacing
    of numbers next to 1 (``finfo.eps = 2**-mantissa``), the exponent gets the rest."""
    info = torch.finfo(_check_float_dtype(dtype))
    mantissa = round(-math.log2(info.eps))
    return 1, info.bits - 1 - mantissa, mantissa


def _rounded(value: float | torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``value`` as a one-element CPU tensor of ``dtype`` (rounded to the format)."""
    _check_float_dtype(dtype)
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"value: expected one number, got shape {tuple(value.shape)}")
        if value.device.type == "meta":
            raise ValueError("value: a tensor on the meta device has no bits to read")
        return value.detach().reshape(1).cpu().to(dtype)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return torch.tensor([float(value)], dtype=dtype)
    raise TypeError(f"value: expected a number or a one-element tensor, got "
                    f"{type(value).__name__}")


def float_bits(value: float | torch.Tensor, dtype: torch.dtype) -> str:
    """The bits of ``value`` rounded to ``dtype``, most significant first, as a string of 0s and
    1s (sign, then exponent, then mantissa). Read from the tensor's storage viewed as an integer
    of the same width: what the machine holds, not a formula."""
    t = _rounded(value, dtype)
    bits = torch.finfo(dtype).bits
    pattern = int(t.view(INTEGER_OF_WIDTH[bits]).item()) & ((1 << bits) - 1)
    return format(pattern, f"0{bits}b")


def _check_rows(rows: object) -> list[tuple[str, float, torch.dtype]]:
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence) or not rows:
        raise TypeError("rows: expected a non-empty sequence of (label, value, dtype) tuples, "
                        f"got {type(rows).__name__}")
    checked = []
    for index, row in enumerate(rows):
        if not (isinstance(row, tuple) and len(row) == 3 and isinstance(row[0], str)):
            raise TypeError(f"rows[{index}]: expected (label, value, dtype), got {row!r:.80}")
        label, value, dtype = row
        float_bits(value, dtype)                      # checks the value and the dtype
        checked.append((label, value, dtype))
    return checked


def plot_float_bits(rows: Sequence[tuple[str, float, torch.dtype]], *,
                    title: str | None = None) -> Figure:
    """One row of bits per (label, value, dtype): each bit a cell with its digit, coloured by its
    field (sign, exponent, mantissa), and on the right the value those bits stand for (the
    number rounded to the format). Rows of narrower formats are shorter. Chapter 13."""
    checked = _check_rows(rows)
    widest = max(torch.finfo(dtype).bits for _, _, dtype in checked)
    label_cells = 0.45 * max(len(label) for label, _, _ in checked) + 1   # in cells of a bit
    value_cells = 9
    fig, ax = plt.subplots(figsize=(0.2 * (label_cells + widest + value_cells),
                                    0.3 * len(checked) + 0.8))
    for r, (label, value, dtype) in enumerate(checked):
        y = len(checked) - 1 - r
        sign, exponent, _ = float_fields(dtype)
        for i, bit in enumerate(float_bits(value, dtype)):
            field = "sign" if i < sign else "exponent" if i < sign + exponent else "mantissa"
            ax.add_patch(Rectangle((i, y + 0.08), 0.92, 0.84, facecolor=FIELD_COLORS[field],
                                   alpha=0.25 + 0.6 * (bit == "1"), edgecolor="none"))
            ax.text(i + 0.46, y + 0.5, bit, ha="center", va="center", fontsize=7,
                    family="monospace")
        ax.text(-0.5, y + 0.5, label, ha="right", va="center", fontsize=8)
        ax.text(widest + 0.5, y + 0.5, f"= {_rounded(value, dtype).item():.9g}", ha="left",
                va="center", fontsize=8, family="monospace")
    ax.set_xlim(-label_cells, widest + value_cells)
    ax.set_ylim(-0.1, len(checked) + 0.1)
    ax.axis("off")
    ax.legend(handles=[Patch(color=c, alpha=0.7, label=f) for f, c in FIELD_COLORS.items()],
              loc="upper center", bbox_to_anchor=(0.5, 0.0), ncols=3, frameon=False,
              fontsize="small")
    if title:
        ax.set_title(title)
    plt.close(fig)
    return fig


def _check_points(points: object) -> dict[str, tuple[float, float]]:
    if not isinstance(points, Mapping) or not points:
        raise TypeError("points: expected a non-empty mapping label -> (x, y), got "
                        f"{type(points).__name__}")
    checked = {}
    for label, point in points.items():
        try:
            x, y = (float(v) for v in point)
        except (TypeError, ValueError):
            raise TypeError(f"points[{label!r}]: expected a pair of numbers (x, y), got "
                            f"{point!r:.80}") from None
        if not (math.isfinite(x) and math.isfinite(y)):
            raise ValueError(f"points[{label!r}]: expected finite numbers, got ({x}, {y})")
        checked[str(label)] = (x, y)
    return checked


def plot_tradeoff(points: Mapping[str, tuple[float, float]], *, xlabel: str, ylabel: str,
                  ax: Axes | None = None, title: str | None = None, logx: bool = False,
                  logy: bool = False, label: str | None = None, color: str = "#3b75af",
                  annotate: bool = True) -> Axes:
    """One point per entry of ``points`` (name -> (x, y)), joined in the mapping's order by a
    thin line (e.g. from the most bits to the fewest); returns the Axes. Each point is labelled
    with its name (``annotate``), points at the same place (to three significant digits) with
    their names joined by " / ". Call it again on the same ``ax`` with another ``label`` and
    ``color`` to add a second set (the labels go to the legend). Log axes (base 2 for x) need
    positive numbers. Chapter 13."""
    data = _check_points(points)
    if (logx and any(x <= 0 for x, _ in data.values())) or \
            (logy and any(y <= 0 for _, y in data.values())):
        raise ValueError("points: log axes need positive numbers")
    if ax is None:
        fig, ax = plt.subplots(figsize=(5.0, 3.6))
        plt.close(fig)
    xs, ys = zip(*data.values())
    ax.plot(xs, ys, color=color, alpha=0.35, linewidth=1, zorder=1)
    ax.scatter(xs, ys, color=color, zorder=2, s=18, label=label)
    if annotate:
        places: dict[tuple[str, str], list[str]] = {}
        for name, (x, y) in data.items():
            places.setdefault((f"{x:.3g}", f"{y:.3g}"), []).append(name)
        for names in places.values():
            x, y = data[names[0]]
            ax.annotate(" / ".join(names), (x, y), textcoords="offset points", xytext=(4, 4),
                        fontsize=7)
    return finish_axes(ax, xlabel=xlabel, ylabel=ylabel, title=title, logx=logx, logy=logy,
                       legend=label is not None)
