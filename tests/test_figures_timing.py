"""course.figures.timing: the figures show the series they were given, and bad input is refused."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from course.figures.timing import (check_series, plot_gflops, plot_series,  # noqa: E402
                                    plot_times, plot_timings, throughput)
from llmcore.timing import matmul_flops  # noqa: E402

D, D_OUT = 12, 5
TIMES = {"loops": ([4, 8, 16], [1e-3, 4e-3, 1.6e-2]),
         "torch": ([4, 8, 16, 32], [2e-6, 2.5e-6, 3e-6, 5e-6])}


def flops(n: float) -> float:
    return matmul_flops(int(n), D, D_OUT)


def lines_by_label(ax: Axes) -> dict:
    return {line.get_label(): line for line in ax.get_lines()}


def test_plot_times_draws_one_line_per_series_on_log_axes():
    ax = plot_times(TIMES, xlabel="n")
    lines = lines_by_label(ax)
    assert set(lines) == {"loops", "torch"}
    assert list(lines["torch"].get_xdata()) == [4, 8, 16, 32]
    assert list(lines["loops"].get_ydata()) == [1e-3, 4e-3, 1.6e-2]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert ax.get_xlabel() == "n" and "seconds" in ax.get_ylabel()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["loops", "torch"]


def test_throughput_divides_flops_by_seconds():
    rates = throughput(TIMES, flops)
    sizes, values = rates["loops"]
    assert sizes == [4, 8, 16]
    for n, seconds, rate in zip(sizes, TIMES["loops"][1], values):
        assert math.isclose(rate, 2 * n * D * D_OUT / seconds / 1e9)


def test_plot_gflops_draws_rates_and_the_peak_line():
    ax = plot_gflops(TIMES, flops, peak_gflops=42.0)
    lines = lines_by_label(ax)
    peak = [label for label in lines if "peak" in label]
    assert len(peak) == 1 and "42" in peak[0]
    assert list(lines[peak[0]].get_ydata()) == [42.0, 42.0]
    expected = [2 * 32 * D * D_OUT / 5e-6 / 1e9]
    assert math.isclose(list(lines["torch"].get_ydata())[-1], expected[0])
    assert "GFLOP/s" in ax.get_ylabel()


def test_plot_gflops_without_peak_has_no_peak_line():
    ax = plot_gflops(TIMES, flops)
    assert not any("peak" in label for label in lines_by_label(ax))


def test_plot_timings_returns_a_figure_with_two_panels():
    fig = plot_timings(TIMES, flops, peak_gflops=10.0, xlabel="tokens", title="projection")
    assert isinstance(fig, Figure)
    left, right = fig.axes
    assert left.get_xlabel() == right.get_xlabel() == "tokens"
    assert "seconds" in left.get_ylabel() and "GFLOP/s" in right.get_ylabel()
    assert fig.get_suptitle() == "projection"
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[:2] == ["loops", "torch"] and "peak" in legend[2]


def test_an_axes_passed_in_is_drawn_into():
    fig = Figure()
    ax = fig.subplots()
    assert plot_series(TIMES, xlabel="b", ylabel="tokens/s", ax=ax, logy=False) is ax
    assert ax.get_yscale() == "linear" and ax.get_ylabel() == "tokens/s"


@pytest.mark.parametrize("bad, error, words", [
    ({}, ValueError, "at least one series"),
    ([1, 2], TypeError, "mapping"),
    ({"a": ([1, 2], [1.0])}, ValueError, "2 sizes but 1 values"),
    ({"a": ([], [])}, ValueError, "at least one point"),
    ({"a": ([1, 2], [1.0, 0.0])}, ValueError, "positive"),
    ({"a": ([1, 2], [1.0, float("nan")])}, ValueError, "positive"),
    ({"a": ([1, 2], "ab")}, TypeError, "sequence of numbers"),
    ({"a": [1, 2, 3]}, TypeError, "pair"),
    ({3: ([1], [1.0])}, TypeError, "labels must be str"),
])
def test_bad_series_are_refused_with_a_message(bad, error, words):
    with pytest.raises(error, match=words):
        plot_times(bad)


def test_linear_axes_accept_zero_and_negative_values():
    data = check_series("series", {"a": ([0, 1], [-1.0, 2.0])}, positive=False)
    assert data == {"a": ([0.0, 1.0], [-1.0, 2.0])}


@pytest.mark.parametrize("peak, error", [(0.0, ValueError), (-3.0, ValueError),
                                         (float("inf"), ValueError), ("fast", TypeError)])
def test_bad_peak_is_refused(peak, error):
    with pytest.raises(error, match="peak_gflops"):
        plot_gflops(TIMES, flops, peak_gflops=peak)


def test_flops_must_be_a_positive_count():
    with pytest.raises(TypeError, match="flops"):
        throughput(TIMES, 123)
    with pytest.raises(ValueError, match="flops"):
        throughput(TIMES, lambda n: 0)


def test_ax_must_be_an_axes():
    with pytest.raises(TypeError, match="ax"):
        plot_times(TIMES, ax="left")
