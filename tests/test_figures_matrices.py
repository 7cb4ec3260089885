"""course.figures.matrices: small matrices drawn as coloured grids holding their numbers."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from course.figures.matrices import (HEAD_COLORS, MASKED_COLOR, MAX_SIDE, draw_matrix,  # noqa: E402
                                      group_of_each, plot_matrices)


def cells(ax):
    """(row, col) -> face colour of each grid cell drawn on ax."""
    return {(int(p.get_y()), int(p.get_x())): p.get_facecolor()[:3]
            for p in ax.patches if isinstance(p, Rectangle)}


def texts(ax):
    return [t.get_text() for t in ax.texts]


def hue_is(colour, name):
    """The cell's tint is a mix of ``name`` with white: the same direction from white."""
    base = np.subtract(1, to_rgb(name))
    got = np.subtract(1, colour)
    return np.allclose(got / np.linalg.norm(got), base / np.linalg.norm(base), atol=1e-6)


def test_every_entry_is_a_cell_with_its_number(ax, rng):
    values = torch.from_numpy(rng.standard_normal((3, 5)))
    draw_matrix(ax, values, title="Q", fmt="{:.2f}")
    grid = cells(ax)
    assert sorted(grid) == [(i, j) for i in range(3) for j in range(5)]
    written = texts(ax)
    for value in values.flatten().tolist():
        assert f"{value:.2f}".replace("-0.00", "0.00") in written
    assert "Q" in written and "(3, 5)" in written


def test_column_groups_tint_each_heads_columns(ax):
    values = np.arange(1, 13, dtype=float).reshape(3, 4)       # n = 3, d = 4, two heads of 2
    draw_matrix(ax, values, col_groups=2)
    grid = cells(ax)
    for i in range(3):
        assert hue_is(grid[i, 0], HEAD_COLORS[0]) and hue_is(grid[i, 1], HEAD_COLORS[0])
        assert hue_is(grid[i, 2], HEAD_COLORS[1]) and hue_is(grid[i, 3], HEAD_COLORS[1])
    assert "12" in texts(ax) and "12.00" not in texts(ax)   # whole numbers are written whole
    # a larger magnitude gets a stronger tint (further from white)
    assert sum(grid[2, 3]) < sum(grid[0, 2])


def test_row_groups_and_explicit_group_indices(ax):
    draw_matrix(ax, np.ones((4, 3)), row_groups=[1, 1, 0, 0])
    grid = cells(ax)
    assert hue_is(grid[0, 2], HEAD_COLORS[1]) and hue_is(grid[3, 0], HEAD_COLORS[0])


def test_masked_scores_are_grey_and_marked(ax):
    scores = torch.tensor([[0.5, -math.inf], [-0.25, 1.0]])
    draw_matrix(ax, scores)
    grid = cells(ax)
    assert np.allclose(grid[0, 1], to_rgb(MASKED_COLOR))
    assert "-inf" in texts(ax)
    assert hue_is(grid[0, 0], "#c0504d") and hue_is(grid[1, 0], "#4f81bd")   # sign shows


def test_a_vector_is_one_row_and_negative_zero_loses_its_sign(ax):
    draw_matrix(ax, torch.tensor([-0.001, 2.0]), fmt="{:.1f}")
    assert sorted(cells(ax)) == [(0, 0), (0, 1)]
    assert "0.0" in texts(ax) and "-0.0" not in texts(ax) and "(2,)" in texts(ax)


def test_plot_matrices_lays_out_matrices_and_symbols():
    x, w = np.ones((3, 4)), np.ones((4, 6))
    fig = plot_matrices(("X", x), "@", ("W", w, {"col_groups": 2}), "=", ("Y", x @ w),
                        title="a product")
    assert len(fig.axes) == 5
    assert [t.get_text() for t in fig.axes[1].texts] == ["@"]
    assert len(cells(fig.axes[2])) == 24 and len(cells(fig.axes[4])) == 18
    # same cell size everywhere: data units per inch agree between the axes
    widths = [ax.get_position().width * fig.get_figwidth() / np.diff(ax.get_xlim())[0]
              for ax in (fig.axes[0], fig.axes[2], fig.axes[4])]
    assert np.allclose(widths, widths[0])
    assert fig._suptitle.get_text() == "a product"
    assert plt.fignum_exists(fig.number) is False      # closed in pyplot: shown once


@pytest.mark.parametrize("bad, error, match", [
    (np.ones((2, 2, 2)), ValueError, "values: expected a matrix"),
    (np.ones((MAX_SIDE + 1, 2)), ValueError, "at most 16 rows and columns"),
    (np.array([[1.0, float("nan")]]), ValueError, "NaN"),
    (np.array([[1.0, float("inf")]]), ValueError, r"\+inf"),
    (np.ones((0, 3)), ValueError, "at least one entry"),
    ("abc", TypeError, "values: expected a tensor"),
    (torch.ones(2, 2, device="meta"), ValueError, "meta"),
])
def test_bad_values_are_refused(ax, bad, error, match):
    with pytest.raises(error, match=match):
        draw_matrix(ax, bad)


def test_bad_groups_labels_and_options_are_refused(ax):
    with pytest.raises(ValueError, match="col_groups: a block width must be positive and divide 4"):
        draw_matrix(ax, np.ones((2, 4)), col_groups=3)
    with pytest.raises(ValueError, match="row_groups: expected 2 group indices"):
        draw_matrix(ax, np.ones((2, 4)), row_groups=[0, 1, 1])
    with pytest.raises(ValueError, match="colors: 3 groups need 3 colours, got 2"):
        draw_matrix(ax, np.ones((2, 3)), col_groups=1, colors=("red", "blue"))
    with pytest.raises(ValueError, match="row_labels: expected 2 labels"):
        draw_matrix(ax, np.ones((2, 3)), row_labels=["a"])
    with pytest.raises(ValueError, match="fmt: expected a format string"):
        draw_matrix(ax, np.ones((2, 3)), fmt="{x}")
    with pytest.raises(TypeError, match="ax: expected a matplotlib Axes"):
        draw_matrix(None, np.ones((2, 3)))
    with pytest.raises(TypeError, match="items\\[1\\]: expected a symbol"):
        plot_matrices(("X", np.ones((2, 2))), ["not", "a", "matrix"])
    with pytest.raises(ValueError, match="only symbols"):
        plot_matrices("@", "=")
    with pytest.raises(ValueError, match="title and values go in the tuple"):
        plot_matrices(("X", np.ones((2, 2)), {"title": "Y"}))


def test_group_of_each_forms():
    assert group_of_each("g", 6, 2) == [0, 0, 1, 1, 2, 2]
    assert group_of_each("g", 4, [0, 1, 0, 1]) == [0, 1, 0, 1]
    assert group_of_each("g", 4, None) is None
    with pytest.raises(TypeError, match="g: expected None, a block width"):
        group_of_each("g", 4, "ab")
