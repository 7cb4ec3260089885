"""course.figures.heatmaps: attention weights drawn as heatmaps, one panel per head."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from course.figures.heatmaps import (MAX_TOKENS, check_weights, draw_heatmap,  # noqa: E402
                                      plot_attention, token_labels)
from llmcore.attention_probe import attention_matrix  # noqa: E402
from llmcore.testing import randn  # noqa: E402


def causal_weights(rng, h, n, m):
    q, k = randn(rng, h, n, 5), randn(rng, h, m, 5)
    return attention_matrix(q, k, causal=True)                 # (h, n, m)


def test_one_panel_per_head_showing_the_weights(rng):
    weights = causal_weights(rng, 3, 6, 6)
    labels = token_labels(list("ab cd\n"))
    fig = plot_attention(weights, labels, title="layer 0")
    images = [ax.images[0] for ax in fig.axes if ax.images]
    assert len(images) == 3
    for head, image in enumerate(images):
        np.testing.assert_allclose(image.get_array(), weights[head].numpy(), rtol=1e-6)
        assert image.get_clim() == (0.0, 1.0)                 # one scale for every panel
    titles = [ax.get_title() for ax in fig.axes if ax.images]
    assert titles == ["head 0", "head 1", "head 2"]
    panels = [ax for ax in fig.axes if ax.images]                # a 2 x 2 grid, one left empty
    labels_shown = ["a", "b", "\u00b7", "c", "d", "\\n"]
    ticks = lambda axis: [t.get_text() for t in axis.get_ticklabels() if t.get_visible()]
    assert ticks(panels[2].xaxis) == labels_shown                # bottom row: key labels
    assert ticks(panels[0].yaxis) == labels_shown == ticks(panels[2].yaxis)   # left column
    assert ticks(panels[0].xaxis) == [] and ticks(panels[1].yaxis) == []      # inner: none
    assert panels[1].get_xlabel() == "key" and panels[1].get_ylabel() == ""
    assert len(fig.axes) == 5                         # three panels, an empty slot, a colour bar
    sizes = {t.get_fontsize() for ax in panels for axis in (ax.xaxis, ax.yaxis)
             for t in axis.get_ticklabels() if t.get_visible()}
    assert len(sizes) == 1                            # every panel's labels alike
    assert fig._suptitle.get_text() == "layer 0"
    assert not plt.fignum_exists(fig.number)


def test_queries_take_the_last_labels_when_keys_include_a_cache(rng):
    weights = causal_weights(rng, 2, 2, 5)                       # 2 new queries, 5 keys
    fig = plot_attention(weights, list("vwxyz"), heads=[1])
    (panel,) = [ax for ax in fig.axes if ax.images]
    assert [t.get_text() for t in panel.get_yticklabels()] == ["y", "z"]
    assert [t.get_text() for t in panel.get_xticklabels()] == list("vwxyz")
    assert panel.get_title() == "head 1"
    np.testing.assert_allclose(panel.images[0].get_array(), weights[1].numpy(), rtol=1e-6)


def test_a_single_matrix_and_unlabelled_ticks(rng):
    weights = causal_weights(rng, 1, 30, 30)[0]                  # (n, m)
    fig = plot_attention(weights)
    (panel,) = [ax for ax in fig.axes if ax.images]
    ticks = [t.get_text() for t in panel.get_xticklabels()]
    assert ticks[0] == "0" and len(ticks) <= 15                  # index ticks, thinned out


def test_draw_heatmap_on_a_given_axes(ax):
    values = np.array([[0.0, 2.0], [1.0, 3.0]])
    image = draw_heatmap(ax, values, vmin=0, vmax=3, row_labels=["r0", "r1"], xlabel="d",
                         title="t")
    assert image.get_clim() == (0, 3) and ax.get_xlabel() == "d" and ax.get_title() == "t"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["r0", "r1"]
    with pytest.raises(ValueError, match="vmin, vmax"):
        draw_heatmap(ax, values, vmin=1, vmax=1)
    with pytest.raises(ValueError, match="col_labels: expected 2 labels"):
        draw_heatmap(ax, values, col_labels=["a"])
    with pytest.raises(ValueError, match="values: expected a non-empty"):
        draw_heatmap(ax, np.ones(3))


def test_token_labels():
    assert token_labels(["a b", "\t", "\x00", "é"]) == ["a\u00b7b", "\\t", "\\x00", "é"]
    with pytest.raises(TypeError, match="pieces: expected a sequence of str"):
        token_labels("abc")
    with pytest.raises(TypeError, match=r"pieces\[1\]: expected a str"):
        token_labels(["a", 3])


@pytest.mark.parametrize("bad, error, match", [
    (torch.full((2, 3, 3), 0.5).log(), ValueError, "expected softmax weights in \\[0, 1\\]"),
    (torch.tensor([[1.0, float("-inf")], [0.5, 0.5]]), ValueError, "non-finite"),
    (torch.ones(1, 2, 2, 2) / 2, ValueError, r"pick one sequence of a batch: weights\[0\]"),
    (torch.ones(3) / 3, ValueError, "expected \\(n, m\\) or \\(h, n, m\\)"),
    (torch.ones(4, 2) / 2, ValueError, "expected m >= n"),
    (torch.ones(MAX_TOKENS + 1, MAX_TOKENS + 1) / 2, ValueError, "use a shorter text"),
    ("weights", TypeError, "expected a tensor, array or sequence of attention weights"),
    (torch.ones(2, 2, device="meta"), ValueError, "meta"),
])
def test_bad_weights_are_refused(bad, error, match):
    with pytest.raises(error, match=match):
        check_weights("weights", bad)


def test_bad_options_are_refused(rng):
    weights = causal_weights(rng, 2, 3, 3)
    with pytest.raises(ValueError, match=r"labels: expected 3 labels \(one per key\), got 2"):
        plot_attention(weights, ["a", "b"])
    with pytest.raises(ValueError, match=r"heads: expected indices in \[0, 2\)"):
        plot_attention(weights, heads=[2])
    with pytest.raises(TypeError, match="heads: expected a non-empty sequence"):
        plot_attention(weights, heads=[])
    with pytest.raises(ValueError, match="ncols: expected a positive int"):
        plot_attention(weights, ncols=0)
