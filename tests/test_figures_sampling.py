"""course.figures.sampling: the bars show the probabilities they were given, over the same
tokens in every panel, and bad input is refused with a message that names it."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from course.figures.sampling import (REST_LABEL, check_distribution,  # noqa: E402
                                      entropy_bits, plot_distributions, printable,
                                      shown_tokens)
from llmcore.tokenizer import decode  # noqa: E402
from llmcore.softmax import softmax  # noqa: E402
from llmcore.testing import randn  # noqa: E402

V = 11                                  # a vocabulary size unlike top, ncols or panel counts
LABELS = [chr(ord("a") + i) for i in range(V)]


def distributions(rng):
    logits = randn(rng, V, dtype=torch.float64) * 2
    return {f"T = {t}": softmax(logits / t, dim=-1) for t in (0.5, 1.0, 2.0)}


def panels(fig):
    return [ax for ax in fig.axes if ax.get_visible()]


def bar_heights(ax):
    return [patch.get_height() for patch in ax.patches]


def tick_texts(ax):
    return [t.get_text() for t in ax.get_xticklabels()]


def test_each_panel_shows_the_same_tokens_and_the_rest_of_the_mass(rng):
    dists = distributions(rng)
    fig = plot_distributions(dists, LABELS, top=4)
    axes = panels(fig)
    assert len(axes) == 3
    chosen = shown_tokens(dists["T = 0.5"], 4)                 # the first is the reference
    for ax, (key, probs) in zip(axes, dists.items()):
        heights = bar_heights(ax)
        want = [probs[t].item() for t in chosen]
        np.testing.assert_allclose(heights[:4], want, rtol=1e-12)
        assert math.isclose(heights[4], 1 - sum(want), rel_tol=1e-9)    # everything else
        assert tick_texts(ax) == [LABELS[t] for t in chosen] + [REST_LABEL]
        assert ax.get_title().startswith(key)
        assert f"{entropy_bits(probs):.2f} bits" in ax.get_title()
        assert ax.get_ylim() == (0.0, 1.0)
    assert not plt.fignum_exists(fig.number)


def test_a_flatter_distribution_leaves_more_to_the_other_tokens(rng):
    dists = distributions(rng)
    axes = panels(plot_distributions(dists, LABELS, top=3))
    rest = [bar_heights(ax)[-1] for ax in axes]
    assert rest[0] < rest[1] < rest[2]                          # T = 0.5, 1, 2


def test_the_reference_panel_chooses_the_tokens(rng):
    dists = distributions(rng)
    fig = plot_distributions(dists, LABELS, top=5, reference="T = 2.0")
    chosen = shown_tokens(dists["T = 2.0"], 5)
    assert tick_texts(panels(fig)[0])[:5] == [LABELS[t] for t in chosen]


def test_panels_fill_rows_and_unused_slots_are_hidden(rng):
    dists = distributions(rng)
    fig = plot_distributions(dists, LABELS, top=3, ncols=2, title="three temperatures")
    assert len(fig.axes) == 4 and len(panels(fig)) == 3
    assert fig.get_suptitle() == "three temperatures"
    assert panels(fig)[0].get_ylabel() == "probability" and panels(fig)[1].get_ylabel() == ""


def test_a_top_k_distribution_shows_zero_bars(rng):
    logits = randn(rng, V, dtype=torch.float64)
    keep = logits >= logits.topk(3).values[-1]
    probs = softmax(logits.masked_fill(~keep, float("-inf")), dim=-1)
    fig = plot_distributions({"all": softmax(logits, dim=-1), "top-3": probs}, LABELS, top=6)
    heights = bar_heights(panels(fig)[1])
    np.testing.assert_allclose(heights[3:], 0.0, atol=1e-12)    # tokens 4-6 and the rest
    assert math.isclose(sum(heights[:3]), 1.0, rel_tol=1e-9)


def test_shown_tokens_orders_by_probability_then_id():
    probs = [0.1, 0.3, 0.1, 0.3, 0.2]
    assert shown_tokens(probs, 5) == [1, 3, 4, 0, 2]
    assert shown_tokens(torch.tensor([probs]), 2) == [1, 3]     # (1, v) is accepted


def test_entropy_of_certain_uniform_and_two_way_distributions():
    assert entropy_bits([0.0, 1.0, 0.0]) == 0.0
    assert math.isclose(entropy_bits(np.full(16, 1 / 16)), 4.0)
    assert math.isclose(entropy_bits([0.5, 0.5]), 1.0)


@pytest.mark.parametrize("bad, error, words", [
    ([0.5, 0.6], ValueError, "sum to 1"),
    ([1.5, -0.5], ValueError, "negative"),
    ([[0.5, 0.5], [0.5, 0.5]], ValueError, "shape (v,)"),
    ([1.0], ValueError, "v >= 2"),
    ([float("nan"), 1.0], ValueError, "finite"),
    (["a", "b"], TypeError, "probabilities"),
])
def test_check_distribution_names_the_problem(bad, error, words):
    with pytest.raises(error, match=r"^p: .*" + words.replace("(", r"\(").replace(")", r"\)")):
        check_distribution("p", bad)


def test_meta_tensors_have_nothing_to_draw():
    with pytest.raises(ValueError, match="meta"):
        check_distribution("p", torch.empty(4, device="meta"))


def test_logits_instead_of_probabilities_are_refused(rng):
    logits = randn(rng, V, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"distributions\['raw'\].*softmax"):
        plot_distributions({"raw": logits}, LABELS)


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(labels=LABELS[:-1]), ValueError, "labels: expected one per token"),
    (dict(labels="abcdefghijk"), TypeError, "labels: expected a sequence"),
    (dict(top=0), ValueError, "top: expected"),
    (dict(top=V + 1), ValueError, "top: expected"),
    (dict(reference="T = 3"), ValueError, "reference: expected one of"),
    (dict(ncols=0), ValueError, "ncols: expected"),
])
def test_bad_arguments_are_refused(rng, kwargs, error, words):
    arguments = dict(labels=LABELS) | kwargs
    with pytest.raises(error, match=words):
        plot_distributions(distributions(rng), **arguments)


def test_distributions_over_different_vocabularies_are_refused():
    with pytest.raises(ValueError, match="same v tokens"):
        plot_distributions({"a": [0.5, 0.5], "b": [0.2, 0.3, 0.5]}, ["x", "y"])
    with pytest.raises(ValueError, match="at least one"):
        plot_distributions({}, LABELS)
    with pytest.raises(TypeError, match="mapping"):
        plot_distributions([[0.5, 0.5]], ["x", "y"])


def test_printable_shows_control_characters_instead_of_obeying_them():
    assert printable("a\x1b[31mb") == "a\\x1b[31mb"            # an ANSI colour code, shown
    assert printable("x\x00y\x7f") == "x\\x00y\\x7f"
    assert printable("\u2028") == "\\u2028"                     # a line separator
    code = "def f(x):\n\treturn x  # é \ufffd"
    assert printable(code) == code                               # layout and text untouched


def test_printable_makes_any_decoded_bytes_safe():
    text = decode(list(range(256)))
    shown = printable(text)
    assert all(ch.isprintable() or ch in "\n\t" for ch in shown)
    assert "\x1b" not in shown and "\\x1b" in shown


def test_printable_refuses_token_ids():
    with pytest.raises(TypeError, match="text: expected a str"):
        printable([104, 105])
