"""Next-token distributions drawn as bars: what temperature and top-k do to the probabilities.

A *distribution* is a vector of v probabilities (v = vocabulary size), one per possible next
token, non-negative and summing to 1: a softmax of one row of logits, possibly divided by a
temperature or cut to the top k first. Several of them for the same logits are drawn side by side
over the same tokens, so that the eye can follow one token's probability from panel to panel::

    from course.figures.sampling import plot_distributions
    plot_distributions({"T = 0.5": p_cold, "T = 1": p, "T = 2": p_hot}, labels, top=10)

* :func:`check_distribution` validates one distribution and returns it as float64 NumPy.
* :func:`shown_tokens` picks the tokens a figure shows: the ``top`` most probable of a reference
  distribution, most probable first.
* :func:`entropy_bits` measures how spread out a distribution is (0 bits: one certain token;
  log2(v) bits: all equally likely).
* :func:`plot_distributions` draws one panel per distribution, the same tokens in the same order
  in every panel, plus one bar for the probability left to all the other tokens.
* :func:`printable` makes sampled text safe to print in a notebook: a sampled byte can be a
  control character (an ANSI escape, say) that a terminal or the book's output renderer would
  interpret instead of show.

Figures made here are closed in pyplot's registry, so a notebook shows each exactly once, as the
cell's result. The probabilities themselves are computed by the caller (the chapter, with
:func:`llmcore.softmax.softmax`): this module only draws. Chapter 6.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from .common import as_float_array, panel_grid

SUM_TOLERANCE = 1e-3
"""How far from 1 a distribution's sum may be (float32 softmax outputs are not exact)."""

MAX_SHOWN = 30
"""The most tokens one panel may show and keep its tick labels legible."""

BAR_COLOR = "#3b75af"
"""Bars of the tokens shown."""

REST_COLOR = "#bdbdbd"
"""The bar of all the other tokens together."""

REST_LABEL = "others"
"""Tick label of the bar that sums every token not shown."""


def check_distribution(name: str, probabilities: object) -> np.ndarray:
    """One distribution over v tokens as a (v,) float64 array.

    Accepts a tensor, array or sequence of numbers, of shape (v,) or (1, v). Raises TypeError for
    non-numbers and ValueError for another shape, fewer than 2 tokens, a NaN, a negative entry or
    a sum away from 1, naming ``name``. Chapter 6.
    """
    array = as_float_array(name, probabilities, "probabilities")
    if array.ndim == 2 and array.shape[0] == 1:
        array = array[0]
    if array.ndim != 1 or array.shape[0] < 2:
        raise ValueError(f"{name}: expected probabilities of shape (v,) with v >= 2, got shape "
                         f"{array.shape}")
    if not np.isfinite(array).all():
        raise ValueError(f"{name}: expected finite probabilities, got "
                         f"{array[~np.isfinite(array)][0]!r}")
    if (array < 0).any():
        raise ValueError(f"{name}: probabilities cannot be negative, got {array.min():.3g} "
                         f"(pass softmax(logits), not the logits)")
    total = float(array.sum())
    if abs(total - 1.0) > SUM_TOLERANCE:
        raise ValueError(f"{name}: probabilities must sum to 1, these sum to {total:.6g} "
                         f"(pass softmax(logits), not the logits)")
    return array


def shown_tokens(probabilities: object, top: int) -> list[int]:
    """The ``top`` most probable token ids of a distribution (v,), most probable first.

    Ties keep the lower id first, so the choice does not depend on the sort's whims. Chapter 6.
    """
    array = check_distribution("probabilities", probabilities)
    if isinstance(top, bool) or not isinstance(top, int) or not 1 <= top <= array.shape[0]:
        raise ValueError(f"top: expected an int from 1 to v = {array.shape[0]}, got {top!r}")
    order = np.lexsort((np.arange(array.shape[0]), -array))       # by probability, then id
    return [int(i) for i in order[:top]]


def entropy_bits(probabilities: object) -> float:
    """Shannon entropy in bits, -sum p log2 p (terms with p = 0 count 0). Chapter 6.

    0 for a distribution that puts everything on one token; log2(v) for the uniform one. About
    2 to the entropy is the number of tokens a sample effectively chooses between.
    """
    array = check_distribution("probabilities", probabilities)
    nonzero = array[array > 0]
    return float(-(nonzero * np.log2(nonzero)).sum())


def plot_distributions(distributions: Mapping[str, object], labels: Sequence[str], *,
                       top: int = 10, reference: str | None = None, ncols: int | None = None,
                       title: str | None = None) -> Figure:
    """One bar chart per distribution, all over the same tokens; returns the Figure.

    distributions: panel title -> probabilities (v,), every one over the same v tokens.
    labels: v tick labels, one per token id (e.g. from
    :func:`course.figures.heatmaps.token_labels`). top: how many tokens to show, chosen by
    :func:`shown_tokens` on the ``reference`` distribution (default: the first); a last bar,
    "others", holds the probability of every token not shown, so each panel's bars sum to 1.
    Each panel's title gains the distribution's entropy. ncols: panels per row (default: all in
    one row, up to 4). Chapter 6.
    """
    if not isinstance(distributions, Mapping):
        raise TypeError(f"distributions: expected a mapping title -> probabilities, got "
                        f"{type(distributions).__name__}")
    if not distributions:
        raise ValueError("distributions: expected at least one distribution, got none")
    arrays: dict[str, np.ndarray] = {}
    for key, value in distributions.items():
        if not isinstance(key, str):
            raise TypeError(f"distributions: titles must be str, got {key!r}")
        arrays[key] = check_distribution(f"distributions[{key!r}]", value)
    sizes = {a.shape[0] for a in arrays.values()}
    if len(sizes) != 1:
        raise ValueError(f"distributions: expected every distribution over the same v tokens, "
                         f"got sizes {sorted(sizes)}")
    v = sizes.pop()
    if isinstance(labels, str) or not isinstance(labels, Sequence):
        raise TypeError(f"labels: expected a sequence of v = {v} str, got "
                        f"{type(labels).__name__}")
    if len(labels) != v:
        raise ValueError(f"labels: expected one per token, v = {v}, got {len(labels)}")
    if not isinstance(top, int) or isinstance(top, bool) or not 1 <= top <= min(v, MAX_SHOWN):
        raise ValueError(f"top: expected an int from 1 to {min(v, MAX_SHOWN)}, got {top!r}")
    if reference is None:
        reference = next(iter(arrays))
    if reference not in arrays:
        raise ValueError(f"reference: expected one of {list(arrays)}, got {reference!r}")
    count = len(arrays)
    nrows, ncols = panel_grid(count, 4 if ncols is None else ncols)

    tokens = shown_tokens(arrays[reference], top)
    ticks = [str(labels[t]) for t in tokens] + [REST_LABEL]
    colors = [BAR_COLOR] * len(tokens) + [REST_COLOR]
    width = max(2.6, 0.26 * (top + 1) + 0.9)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, 2.7 * nrows + 0.3),
                             sharey=True, squeeze=False, layout="constrained")
    plt.close(fig)            # out of pyplot's registry: the caller owns (and displays) it
    for index, (key, probs) in enumerate(arrays.items()):
        ax = axes[index // ncols][index % ncols]
        heights = [probs[t] for t in tokens]
        heights.append(max(0.0, 1.0 - float(sum(heights))))
        ax.bar(range(len(heights)), heights, color=colors, width=0.8)
        ax.set_xticks(range(len(heights)), ticks, fontsize="small", family="monospace")
        ax.tick_params(axis="x", labelrotation=90 if top > 12 else 0)
        ax.set_ylim(0, 1)
        ax.set_title(f"{key}\nentropy {entropy_bits(probs):.2f} bits", fontsize="medium")
        ax.grid(True, axis="y", alpha=0.3)
        if index % ncols == 0:
            ax.set_ylabel("probability")
    for index in range(count, nrows * ncols):
        axes[index // ncols][index % ncols].set_visible(False)
    if title:
        fig.suptitle(title)
    return fig


KEPT_CONTROLS = "\n\t"
"""Control characters :func:`printable` leaves as they are: line breaks and tabs lay code out."""


def printable(text: str) -> str:
    r"""Text with every unprintable character except newline and tab written as an escape.

    ``"a\x1b[31mb"`` (with a real escape character) -> ``"a\\x1b[31mb"``: the escape is shown,
    not obeyed. Characters above U+00FF are written ``\uNNNN``. Printable characters, including
    U+FFFD (what the byte tokenizer decodes invalid UTF-8 to), pass through unchanged.
    Chapters 5 and 6.
    """
    if not isinstance(text, str):
        raise TypeError(f"text: expected a str (decode token ids first), got "
                        f"{type(text).__name__}")
    return "".join(ch if ch.isprintable() or ch in KEPT_CONTROLS
                   else (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")
                   for ch in text)
