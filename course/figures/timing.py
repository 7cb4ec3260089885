"""Plotting measured timings: several implementations of one operation against a size.

A *series* maps a label to ``(sizes, values)``, two equal-length sequences of positive numbers,
for example the sizes n a call was timed at and the seconds it took::

    times = {"Python loops": ([16, 32, 64], [0.011, 0.045, 0.18]),
             "torch":        ([16, 32, 64, 128], [4e-6, 5e-6, 7e-6, 1.1e-5])}

Series may cover different sizes (slow implementations stop early). The functions:

* :func:`plot_series` draws any such mapping (log axes by default); the others build on it.
* :func:`plot_times` draws seconds per call against size on log-log axes, where a power law
  ``t ~ n^k`` is a straight line of slope k.
* :func:`throughput` converts seconds into GFLOP/s with a FLOP count per size;
  :func:`plot_gflops` draws that against the machine's measured peak (a dashed line).
* :func:`plot_timings` puts the two side by side, the usual figure of a timing cell.

Every function takes an optional ``ax`` to draw into, and otherwise makes its own figure (closed
in pyplot's registry, so that a notebook shows it exactly once, as the cell's result). The
measuring itself lives in :mod:`llmcore.timing`. Chapter 2 (reused in chapters 6-8).
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from .common import finish_axes

Series = Mapping[str, tuple[Sequence[float], Sequence[float]]]
"""label -> (sizes, values): one line per label."""

MARKERS = "osD^vP*X"
"""One marker per series, so that the lines stay distinguishable in greyscale."""


def check_series(name: str, series: object, *, positive: bool = True) -> dict[str, tuple[list[float], list[float]]]:
    """Validate a series mapping and return it as lists of floats.

    Raises TypeError unless ``series`` maps str labels to pairs of sequences, and ValueError when
    it is empty, a pair has unequal lengths or no points, or a number is not finite (or, with
    ``positive``, not above zero, which log axes need). Messages name ``name`` and the label.
    """
    if not isinstance(series, Mapping):
        raise TypeError(f"{name}: expected a mapping label -> (sizes, values), got "
                        f"{type(series).__name__}")
    if not series:
        raise ValueError(f"{name}: expected at least one series, got an empty mapping")
    checked = {}
    for label, pair in series.items():
        if not isinstance(label, str):
            raise TypeError(f"{name}: labels must be str, got {label!r} "
                            f"({type(label).__name__})")
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(f"{name}[{label!r}]: expected a pair (sizes, values), got "
                            f"{type(pair).__name__}")
        sizes, values = (_floats(f"{name}[{label!r}] {part}", seq)
                         for part, seq in zip(("sizes", "values"), pair))
        if len(sizes) != len(values):
            raise ValueError(f"{name}[{label!r}]: {len(sizes)} sizes but {len(values)} values; "
                             "expected one value per size")
        if not sizes:
            raise ValueError(f"{name}[{label!r}]: expected at least one point, got none")
        for part, seq in (("sizes", sizes), ("values", values)):
            bad = [x for x in seq if not math.isfinite(x) or (positive and x <= 0)]
            if bad:
                need = "positive finite numbers (log axes)" if positive else "finite numbers"
                raise ValueError(f"{name}[{label!r}] {part}: expected {need}, got {bad[0]!r}")
        checked[label] = (sizes, values)
    return checked


def _floats(name: str, seq: object) -> list[float]:
    if isinstance(seq, (str, bytes)) or not hasattr(seq, "__iter__"):
        raise TypeError(f"{name}: expected a sequence of numbers, got {type(seq).__name__}")
    try:
        return [float(x) for x in seq]
    except (TypeError, ValueError) as error:
        raise TypeError(f"{name}: expected a sequence of numbers ({error})") from None


def _new_axes(ax: Axes | None, figsize: tuple[float, float]) -> Axes:
    if ax is not None:
        if not isinstance(ax, Axes):
            raise TypeError(f"ax: expected a matplotlib Axes or None, got {type(ax).__name__}")
        return ax
    fig, ax = plt.subplots(figsize=figsize, layout="constrained")
    plt.close(fig)            # out of pyplot's registry: the caller owns (and displays) it
    return ax


def plot_series(series: Series, *, xlabel: str, ylabel: str, ax: Axes | None = None,
                title: str | None = None, logx: bool = True, logy: bool = True) -> Axes:
    """One line with markers per label of ``series`` (label -> (sizes, values)); returns the Axes.

    Log axes (the default) need positive numbers; with ``logx=logy=False`` any finite numbers do.
    The labels appear in the legend in the mapping's order. Chapter 2.
    """
    data = check_series("series", series, positive=logx or logy)
    ax = _new_axes(ax, (5.0, 3.6))
    for index, (label, (sizes, values)) in enumerate(data.items()):
        ax.plot(sizes, values, marker=MARKERS[index % len(MARKERS)], markersize=4, label=label)
    return finish_axes(ax, xlabel=xlabel, ylabel=ylabel, title=title, logx=logx, logy=logy)


def plot_times(times: Series, *, xlabel: str = "n (tokens)", ax: Axes | None = None,
               title: str | None = "time per call") -> Axes:
    """Seconds per call against size, log-log: ``times`` maps label -> (sizes, seconds).

    On these axes ``t = c n^k`` is a straight line of slope k: a method that does k nested passes
    over n shows up as a steeper line, a constant factor as a vertical shift. Chapter 2.
    """
    return plot_series(times, xlabel=xlabel, ylabel="seconds per call (log)", ax=ax, title=title)


def throughput(times: Series, flops: Callable[[float], float]) -> dict[str, tuple[list[float], list[float]]]:
    """Seconds -> GFLOP/s: label -> (sizes, flops(size) / seconds / 1e9).

    flops: the FLOP count of one call at a given size, the same for every implementation of the
    operation (e.g. ``lambda n: matmul_flops(n, d, d)`` from :mod:`llmcore.timing`). Chapter 2.
    """
    data = check_series("times", times)
    if not callable(flops):
        raise TypeError(f"flops: expected a function size -> FLOP count, got "
                        f"{type(flops).__name__}")
    rates = {}
    for label, (sizes, seconds) in data.items():
        counts = [float(flops(size)) for size in sizes]
        bad = [c for c in counts if not math.isfinite(c) or c <= 0]
        if bad:
            raise ValueError(f"flops: expected a positive FLOP count for every size of "
                             f"{label!r}, got {bad[0]!r}")
        rates[label] = (sizes, [c / s / 1e9 for c, s in zip(counts, seconds)])
    return rates


def plot_gflops(times: Series, flops: Callable[[float], float], *,
                peak_gflops: float | None = None, xlabel: str = "n (tokens)",
                ax: Axes | None = None, title: str | None = "throughput") -> Axes:
    """GFLOP/s of each implementation against size, log-log, with the peak as a dashed line.

    times: label -> (sizes, seconds); flops: size -> FLOP count of one call (see
    :func:`throughput`); peak_gflops: the machine's measured matmul peak
    (:func:`llmcore.timing.matmul_peak_gflops`), drawn as a horizontal line when given. The gap
    between a line and the peak is the fraction of the hardware the implementation leaves idle.
    Chapter 2.
    """
    if peak_gflops is not None:
        if isinstance(peak_gflops, bool) or not isinstance(peak_gflops, (int, float)):
            raise TypeError(f"peak_gflops: expected a number or None, got "
                            f"{type(peak_gflops).__name__}")
        if not math.isfinite(peak_gflops) or peak_gflops <= 0:
            raise ValueError(f"peak_gflops: expected a positive finite number, got {peak_gflops}")
    ax = plot_series(throughput(times, flops), xlabel=xlabel, ylabel="GFLOP/s (log)", ax=ax,
                     title=title)
    if peak_gflops is not None:
        ax.axhline(peak_gflops, color="black", linestyle="--", linewidth=1,
                   label=f"measured matmul peak ({peak_gflops:.3g} GFLOP/s)")
        ax.legend(fontsize="small")
    return ax


def plot_timings(times: Series, flops: Callable[[float], float], *,
                 peak_gflops: float | None = None, xlabel: str = "n (tokens)",
                 title: str | None = None) -> Figure:
    """The usual figure of a timing cell: :func:`plot_times` and :func:`plot_gflops` side by side.

    Returns the Figure (two Axes: time on the left, GFLOP/s on the right, one legend for both
    below them). Chapter 2.
    """
    data = check_series("times", times)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10.0, 3.8), layout="constrained")
    plt.close(fig)
    plot_times(data, xlabel=xlabel, ax=left)
    plot_gflops(data, flops, peak_gflops=peak_gflops, xlabel=xlabel, ax=right)
    handles, labels = right.get_legend_handles_labels()     # every series, and the peak
    for ax in (left, right):
        ax.get_legend().remove()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(3, len(labels)),
               fontsize="small", frameon=False)               # one legend, below both panels
    if title:
        fig.suptitle(title)
    return fig
