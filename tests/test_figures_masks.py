"""course.figures.masks: attention masks and padded batches drawn as grids of cells."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from llmcore.batching import pad_batch  # noqa: E402
from course.figures.masks import (ALLOWED_COLOR, FUTURE_COLOR, PADDING_COLOR, MAX_SIDE,  # noqa: E402
                                   check_mask, draw_mask, plot_masks, plot_padded_batch)
from llmcore.layout import contiguous_layout  # noqa: E402
from llmcore.masks import causal_mask  # noqa: E402


def cells(ax):
    """(row, col) -> face colour of each grid cell drawn on ax (patches, or one RGB image)."""
    if ax.images:
        rgb = np.asarray(ax.images[0].get_array())
        return {(i, j): tuple(rgb[i, j][:3]) for i in range(rgb.shape[0])
                for j in range(rgb.shape[1])}
    return {(int(p.get_y()), int(p.get_x())): p.get_facecolor()[:3]
            for p in ax.patches if isinstance(p, Rectangle)}


def same(colour, name):
    return np.allclose(colour, to_rgb(name))


def padded_layout():
    """Three prompts of lengths 2, 5, 3: a (3, 1, 5, 5) mask with left padding."""
    tokens, valid = pad_batch([[1, 2], [3, 4, 5, 6, 7], [8, 9, 10]])
    layout = contiguous_layout(3, 5, past_slots=0, past_valid=None, attention_mask=valid,
                               device=tokens.device)
    return layout, valid


def test_check_mask_accepts_the_three_layouts():
    mask = causal_mask(3, 5, torch.device("cpu"))                      # (n, m) = (3, 5)
    assert check_mask("m", mask).shape == (1, 3, 5)
    assert check_mask("m", mask.expand(2, 3, 5)).shape == (2, 3, 5)
    four = check_mask("m", mask.expand(2, 1, 3, 5))
    assert four.shape == (2, 3, 5) and four.dtype == np.bool_
    assert (four[1] == mask.numpy()).all()


@pytest.mark.parametrize("bad, error, message", [
    (torch.ones(3, 5), TypeError, "bool"),
    (np.zeros((3, 5), dtype=np.int64), TypeError, "bool"),
    (torch.ones(2, 2, 3, 5, dtype=torch.bool), ValueError, r"\(b, 1, n, m\)"),
    (torch.ones(5, dtype=torch.bool), ValueError, "expected shape"),
    (torch.ones(0, 3, 5, dtype=torch.bool), ValueError, "at least one entry"),
    (torch.ones(3, MAX_SIDE + 1, dtype=torch.bool), ValueError, "at most"),
    (torch.ones(3, 5, dtype=torch.bool, device="meta"), ValueError, "meta"),
])
def test_check_mask_refuses_what_it_cannot_draw(bad, error, message):
    with pytest.raises(error, match=message):
        check_mask("mask", bad)


def test_each_cell_is_coloured_by_why_it_is_masked(ax):
    layout, valid = padded_layout()
    draw_mask(ax, layout.mask[0], padding=~valid[0])                  # prompt of length 2
    grid = cells(ax)
    assert sorted(grid) == [(i, j) for i in range(5) for j in range(5)]
    for (i, j), colour in grid.items():
        if layout.mask[0, 0, i, j]:
            assert same(colour, ALLOWED_COLOR), (i, j)
        elif j < 3:                                                    # the 3 padding slots
            assert same(colour, PADDING_COLOR), (i, j)
        else:
            assert same(colour, FUTURE_COLOR), (i, j)
    assert same(grid[(4, 3)], ALLOWED_COLOR) and same(grid[(3, 4)], FUTURE_COLOR)


def test_without_padding_every_masked_cell_is_the_future(ax):
    mask = causal_mask(2, 4, torch.device("cpu"))                      # bottom-right aligned
    draw_mask(ax, mask, row_labels=["p2", "p3"], col_labels=list("abcd"))
    grid = cells(ax)
    assert same(grid[(0, 3)], FUTURE_COLOR) and same(grid[(0, 2)], ALLOWED_COLOR)
    assert same(grid[(1, 3)], ALLOWED_COLOR)
    assert [t.get_text() for t in ax.get_xticklabels()] == list("abcd")
    assert [t.get_text() for t in ax.get_yticklabels()] == ["p2", "p3"]


def test_draw_mask_checks_its_arguments(ax):
    mask = causal_mask(2, 4, torch.device("cpu"))
    with pytest.raises(TypeError, match="Axes"):
        draw_mask("not an axes", mask)
    with pytest.raises(ValueError, match="plot_masks"):
        draw_mask(ax, mask.expand(2, 2, 4))
    with pytest.raises(ValueError, match=r"padding: expected shape \(4,\)"):
        draw_mask(ax, mask, padding=torch.zeros(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="expected 2 labels"):
        draw_mask(ax, mask, row_labels=["a"])
    with pytest.raises(TypeError, match="sequence of 4 strings"):
        draw_mask(ax, mask, col_labels="abcd")


def test_plot_masks_draws_one_panel_per_sequence_and_stays_closed():
    layout, valid = padded_layout()
    before = plt.get_fignums()
    fig = plot_masks(layout.mask, padding=~valid, titles=["a", "b", "c"], title="masks")
    assert plt.get_fignums() == before                                 # not left in pyplot
    assert len(fig.axes) == 3
    assert [ax.get_title() for ax in fig.axes] == ["a", "b", "c"]
    for s, ax in enumerate(fig.axes):
        grid = cells(ax)
        allowed = {cell for cell, colour in grid.items() if same(colour, ALLOWED_COLOR)}
        want = {(i, j) for i in range(5) for j in range(5) if layout.mask[s, 0, i, j]}
        assert allowed == want
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "masked: padding key" in labels


def test_plot_masks_lays_panels_out_in_rows():
    layout, valid = padded_layout()
    fig = plot_masks(layout.mask, padding=~valid, ncols=2)            # 3 panels: 2 + 1
    drawn = [ax for ax in fig.axes if ax.images]
    assert len(fig.axes) == 4 and len(drawn) == 3
    rows = sorted({round(ax.get_position().y0, 3) for ax in drawn})
    assert len(rows) == 2                                              # two rows of panels
    with pytest.raises(ValueError, match="ncols"):
        plot_masks(layout.mask, ncols=0)


def test_plot_masks_checks_per_sequence_arguments():
    layout, valid = padded_layout()
    with pytest.raises(ValueError, match=r"padding: expected shape \(3, 5\)"):
        plot_masks(layout.mask, padding=~valid[:2])
    with pytest.raises(ValueError, match="one entry per sequence"):
        plot_masks(layout.mask, titles=["only one"])
    with pytest.raises(ValueError, match="cell"):
        plot_masks(layout.mask, cell=5)


def test_padded_batch_shows_tokens_padding_and_positions():
    layout, valid = padded_layout()
    labels = [list("...ab"), list("cdefg"), list("..hij")]
    before = plt.get_fignums()
    fig = plot_padded_batch(labels, valid, layout.positions, title="batch")
    assert plt.get_fignums() == before
    ax = fig.axes[0]
    grid = cells(ax)
    assert len(grid) == 15
    assert all(same(grid[(s, j)], PADDING_COLOR) == (not bool(valid[s, j]))
               for s in range(3) for j in range(5))
    texts = [t.get_text() for t in ax.texts]
    assert texts.count("pad") == int((~valid).sum())
    for letter in "abcdefghij":
        assert letter in texts
    assert texts.count("4") == 1                 # only the unpadded prompt reaches position 4


def test_padded_batch_checks_its_arguments():
    layout, valid = padded_layout()
    labels = [list("abcde")] * 3
    with pytest.raises(TypeError, match="bool"):
        plot_padded_batch(labels, valid.long())
    with pytest.raises(ValueError, match="one entry per sequence"):
        plot_padded_batch(labels[:2], valid)
    with pytest.raises(ValueError, match="expected 5 labels"):
        plot_padded_batch([list("abc")] * 3, valid)
    with pytest.raises(ValueError, match="positions"):
        plot_padded_batch(labels, valid, layout.positions[:, :2])
