"""course.figures.architecture: the shape table follows the config, matches a real model's
tensors, and both views draw every shape of that table."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from course.figures.architecture import (VIEWS, Shape, architecture_shapes,  # noqa: E402
                                          architecture_sizes, plot_architecture)
from llmcore.model import GPT, GPTConfig  # noqa: E402

CONFIG = GPTConfig(vocab_size=61, max_seq_len=48, d_model=24, n_heads=3, n_layers=2)
GQA = GPTConfig(vocab_size=61, max_seq_len=48, d_model=24, n_heads=4, n_kv_heads=2, n_layers=2)


def drawn_text(fig: Figure) -> str:
    return "\n".join(t.get_text() for ax in fig.axes for t in ax.texts + [ax.title])


def test_shapes_follow_the_config_with_every_size_distinct():
    s = architecture_shapes(CONFIG, n=5)
    assert s["x"].sizes == (5, 24)
    assert s["w_qkv"].sizes == (24, 72) and s["w_qkv"].symbols == ("d", "3d")
    assert s["q"].sizes == (3, 5, 8)
    assert s["scores"].sizes == (3, 5, 5)
    assert s["w_up"].sizes == (24, 96) and s["w_down"].sizes == (96, 24)
    assert s["logits"].sizes == (5, 61)
    assert s["position_embedding"].sizes == (48, 24)


def test_grouped_query_attention_narrows_k_and_v():
    s = architecture_shapes(GQA, n=7)
    assert s["q"].sizes == (4, 7, 6)
    assert s["k"].sizes == s["values"].sizes == (2, 7, 6)
    assert s["w_qkv"].sizes == (24, (4 + 2 * 2) * 6)
    assert s["w_qkv"].symbols == ("d", "(h + 2 h_kv) d_head")


def test_the_table_matches_a_real_model():
    """Parameters have the shapes the figure prints, and so do the logits of n tokens."""
    for config in (CONFIG, GQA):
        model = GPT(config, device="meta")
        s = architecture_shapes(config, n=5)
        block = model.blocks[0]
        assert tuple(model.token_embedding.shape) == s["token_embedding"].sizes
        assert tuple(model.position_embedding.shape) == s["position_embedding"].sizes
        assert tuple(block.attention.w_qkv.shape) == s["w_qkv"].sizes
        assert tuple(block.attention.w_o.shape) == s["w_o"].sizes
        assert tuple(block.ffn.w_up.shape) == s["w_up"].sizes
        assert tuple(block.ffn.w_down.shape) == s["w_down"].sizes
        logits = GPT(config, seed=0)(torch.zeros(2, 5, dtype=torch.long))
        assert tuple(logits.shape) == (2,) + s["logits"].sizes


def test_symbols_only_without_a_config():
    s = architecture_shapes(None, n=4)
    assert s["x"].sizes is None and str(s["x"]) == "(n, d)"
    assert s["tokens"].sizes == (4,)
    assert str(architecture_shapes(CONFIG, n=5)["logits"]) == "(n, v) = (5, 61)"


def test_sizes_are_the_configs_own():
    config = GPTConfig(vocab_size=61, max_seq_len=16, d_model=24, n_heads=3, n_layers=2, d_ff=40)
    sizes = architecture_sizes(config, n=3)
    assert (sizes.d, sizes.h, sizes.d_head, sizes.f, sizes.v, sizes.L) == (24, 3, 8, 40, 61, 2)
    assert sizes.max_seq_len == 16 and sizes.h_kv == 3


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("config", [CONFIG, GQA, None], ids=["mha", "gqa", "symbols"])
def test_each_view_draws_its_shapes(view, config):
    before = plt.get_fignums()
    fig = plot_architecture(config, n=9, view=view)
    assert isinstance(fig, Figure)
    assert plt.get_fignums() == before, "the figure must not stay open in pyplot"
    text = drawn_text(fig)
    s = architecture_shapes(config, n=9)
    if view == "vectors":
        expected = [str(s["tokens"]), str(s["x"]), str(s["logits"]), "n vectors of size v"]
    else:
        expected = [str(s["x"]), str(s["logits"]), str(s["q"]), str(s["token_embedding"])]
        if config is not None:
            expected.append(f"({s['x'].sizes[0]}, {s['x'].sizes[1]}) @ ({s['w_up'].sizes[0]}, "
                            f"{s['w_up'].sizes[1]})")
    for shape_text in expected:
        assert shape_text in text, f"{shape_text!r} is not drawn in the {view} view"
    fig.canvas.draw()        # renders: every artist (mathtext included) must be drawable


def test_draws_into_a_given_axes(ax):
    assert plot_architecture(CONFIG, view="matrices", ax=ax) is ax.figure


@pytest.mark.parametrize("kwargs, error, words", [
    ({"view": "tensors"}, ValueError, "view"),
    ({"n": 0}, ValueError, "n"),
    ({"n": 2.5}, TypeError, "n"),
    ({"n": 49}, ValueError, "max_seq_len"),
    ({"ax": "axes"}, TypeError, "ax"),
])
def test_bad_arguments_are_named(kwargs, error, words):
    with pytest.raises(error, match=words):
        plot_architecture(CONFIG, **kwargs)


def test_only_a_gpt_config_is_a_config():
    """The figure takes the real config type (which validates itself), not look-alikes."""
    with pytest.raises(TypeError, match="expected an llmcore GPTConfig .or None., got dict"):
        architecture_sizes({"d_model": 24, "n_heads": 3, "n_layers": 2, "vocab_size": 9})
    with pytest.raises(ValueError, match="divide d_model = 24"):
        GPTConfig(d_model=24, n_heads=5)


def test_shape_text():
    assert str(Shape(("n", "d"), (5, 24))) == "(n, d) = (5, 24)"
    assert str(Shape(("n",), None)) == "(n,)"
