"""Shared by the figure modules: input checks (numbers to draw, labels to write), the grid of
panels a figure lays out, and the finish of a line chart's axes."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch


def as_float_array(name: str, values: object, what: str = "numbers") -> np.ndarray:
    """A tensor (on any device but meta), array or nested list -> a float64 NumPy array.

    Raises ValueError for a meta tensor (it has no values) and TypeError for anything that is
    not numbers, naming ``name`` and saying what was expected (``what``)."""
    if isinstance(values, torch.Tensor):
        if values.device.type == "meta":
            raise ValueError(f"{name}: a tensor on the meta device has no values to draw")
        values = values.detach().cpu().double().numpy()
    try:
        return np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected a tensor, array or sequence of {what}, got "
                        f"{type(values).__name__}") from None


def check_labels(name: str, labels: Sequence[str] | None, size: int,
                 per: str = "") -> list[str] | None:
    """``size`` labels as strings, or None; ``per`` says what each labels (e.g. "one per key")."""
    if labels is None:
        return None
    detail = f" ({per})" if per else ""
    if isinstance(labels, str) or not isinstance(labels, Sequence):
        raise TypeError(f"{name}: expected a sequence of {size} strings{detail}, got "
                        f"{type(labels).__name__}")
    if len(labels) != size:
        raise ValueError(f"{name}: expected {size} labels{detail}, got {len(labels)}")
    return [str(label) for label in labels]


def panel_grid(count: int, ncols: object) -> tuple[int, int]:
    """(rows, cols) of a grid for ``count`` panels at most ``ncols`` per row (never wider than
    ``count``); a ValueError unless ncols is a positive int."""
    if isinstance(ncols, bool) or not isinstance(ncols, int) or ncols < 1:
        raise ValueError(f"ncols: expected a positive int, got {ncols!r}")
    cols = min(ncols, count)
    return math.ceil(count / cols), cols


def finish_axes(ax, *, xlabel: str, ylabel: str, title: str | None = None, logx: bool = False,
                logy: bool = False, legend: bool = True):
    """Scales (log2 x with plain numbers 16, 32, ... rather than 2^4; log10 y), labels, title,
    legend and a light grid of a line chart; returns ``ax``."""
    from matplotlib.ticker import ScalarFormatter
    if logx:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ScalarFormatter())
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    if legend:
        ax.legend(fontsize="small")
    ax.grid(True, which="major", alpha=0.3)
    return ax
