"""The architecture of a GPT, drawn with the shape of everything that flows through it.

One function, two views of the same model:

* ``view="vectors"`` (chapter 1): token ids become n vectors of size d, L shape-preserving
  blocks (layer norm, attention, layer norm, FFN, each with a residual) turn them into n new
  vectors of size d, and the unembedding turns those into n vectors of size v, the logits;
* ``view="matrices"`` (end of chapter 5): the same flow with the vectors stacked as the rows of
  matrices, every step a matrix product with its operands' shapes, (n, d) @ (d, 3d) -> (n, 3d),
  ..., (n, d) @ (d, v) -> (n, v).

Both views are drawn from :func:`architecture_shapes`, a table of every tensor's shape, in
symbols and (when a config is given) in numbers, so a chapter can also assert the real tensors
of a model against the very shapes the figure shows::

    from course.figures.architecture import architecture_shapes, plot_architecture
    plot_architecture(config, n=5)                       # chapter 1: lists of vectors
    plot_architecture(config, n=5, view="matrices")      # chapter 5: matrices
    shapes = architecture_shapes(config, n=5)
    assert tuple(logits.shape[-2:]) == shapes["logits"].sizes

``config`` is a :class:`llmcore.model.GPTConfig` (which has checked its own sizes); ``None``
draws the symbols alone.
Shapes are those of one sequence (rows are tokens); a batch adds a leading b. Chapters 1 and 5.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle

from llmcore.model import GPTConfig

VIEWS = ("vectors", "matrices")
"""The two ways :func:`plot_architecture` draws the model."""

DEFAULT_N = 5
"""Tokens drawn when no n is given: few enough to draw each one, more than one."""

MAX_DRAWN_TOKENS = 6
"""Beyond this many tokens the figure draws the first and last ones with an ellipsis between."""

COLORS = {
    "tokens": "#d9d9d9",
    "embedding": "#9ecae1",
    "attention": "#fdae6b",
    "ffn": "#a1d99b",
    "norm": "#dadaeb",
    "logits": "#fc9272",
    "block": "#f7f7f7",
}
"""One colour per kind of step, shared by both views."""


@dataclass(frozen=True)
class Sizes:
    """The sizes a drawing needs, in the book's notation (None where no config was given)."""

    n: int | None
    d: int | None
    h: int | None
    h_kv: int | None
    d_head: int | None
    f: int | None
    v: int | None
    L: int | None
    max_seq_len: int | None

    @property
    def known(self) -> bool:
        """Whether numbers are available (a config was given)."""
        return self.d is not None


@dataclass(frozen=True)
class Shape:
    """One tensor's shape: its dimensions in symbols, and in numbers when they are known.

    ``str(shape)`` is ``"(n, d)"`` or, with numbers, ``"(n, d) = (5, 32)"``.
    """

    symbols: tuple[str, ...]
    sizes: tuple[int, ...] | None

    def __str__(self) -> str:
        text = "(" + ", ".join(self.symbols) + (",)" if len(self.symbols) == 1 else ")")
        if self.sizes is not None:
            numbers = "(" + ", ".join(str(s) for s in self.sizes) + (",)" if len(self.sizes) == 1 else ")")
            if numbers != text:
                text += " = " + numbers
        return text


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected a positive int, got {value!r} ({type(value).__name__})")
    if value <= 0:
        raise ValueError(f"{name}: expected a positive int, got {value}")
    return value


def architecture_sizes(config: GPTConfig | None = None, *, n: int | None = None) -> Sizes:
    """Read the sizes of ``config`` (a GPTConfig) in the book's notation.

    n: tokens in the sequence (default :data:`DEFAULT_N`, at most max_seq_len). With
    ``config=None`` every size but n is None (a drawing in symbols only). Raises TypeError for a
    config that is not a GPTConfig or a non-int n, ValueError for n <= 0 or beyond max_seq_len.
    Chapter 1.
    """
    n = DEFAULT_N if n is None else _positive_int("n", n)
    if config is None:
        return Sizes(n, None, None, None, None, None, None, None, None)
    if not isinstance(config, GPTConfig):
        raise TypeError(f"config: expected an llmcore GPTConfig (or None), got "
                        f"{type(config).__name__}")
    if n > config.max_seq_len:                 # GPTConfig has checked its own sizes
        raise ValueError(f"n = {n} tokens exceeds config.max_seq_len = {config.max_seq_len}")
    return Sizes(n=n, d=config.d_model, h=config.n_heads, h_kv=config.kv_heads,
                 d_head=config.d_head, f=config.ffn_width, v=config.vocab_size,
                 L=config.n_layers, max_seq_len=config.max_seq_len)


def architecture_shapes(config: GPTConfig | None = None, *, n: int | None = None) -> dict[str, Shape]:
    """The shape of every tensor the figure names, for one sequence of n tokens.

    Keys, in the order data flows (weights are (rows in, columns out): rows are tokens)::

        tokens (n,)  token_embedding (v, d)  position_embedding (max_seq_len, d)  x (n, d)
        w_qkv (d, (h + 2 h_kv) d_head)  qkv (n, (h + 2 h_kv) d_head)
        q (h, n, d_head)  k (h_kv, n, d_head)  values (h_kv, n, d_head)
        scores (h, n, n)  context (h, n, d_head)  merged (n, d)  w_o (d, d)  attention_out (n, d)
        w_up (d, f)  hidden (n, f)  w_down (f, d)  ffn_out (n, d)  block_out (n, d)
        unembedding (d, v)  logits (n, v)

    (``values`` rather than ``v``, which is the vocabulary size.) With plain multi-head
    attention (h_kv = h) the QKV width is written 3d. Chapters 1 and 5.
    """
    s = architecture_sizes(config, n=n)
    if s.h_kv is None or s.h_kv == s.h:
        qkv_symbol = "3d"
    else:
        qkv_symbol = "(h + 2 h_kv) d_head"
    qkv_width = None if not s.known else (s.h + 2 * s.h_kv) * s.d_head
    table = {
        "tokens": (("n",), (s.n,)),
        "token_embedding": (("v", "d"), (s.v, s.d)),
        "position_embedding": (("max_seq_len", "d"), (s.max_seq_len, s.d)),
        "x": (("n", "d"), (s.n, s.d)),
        "w_qkv": (("d", qkv_symbol), (s.d, qkv_width)),
        "qkv": (("n", qkv_symbol), (s.n, qkv_width)),
        "q": (("h", "n", "d_head"), (s.h, s.n, s.d_head)),
        "k": (("h_kv", "n", "d_head"), (s.h_kv, s.n, s.d_head)),
        "values": (("h_kv", "n", "d_head"), (s.h_kv, s.n, s.d_head)),
        "scores": (("h", "n", "n"), (s.h, s.n, s.n)),
        "context": (("h", "n", "d_head"), (s.h, s.n, s.d_head)),
        "merged": (("n", "d"), (s.n, s.d)),
        "w_o": (("d", "d"), (s.d, s.d)),
        "attention_out": (("n", "d"), (s.n, s.d)),
        "w_up": (("d", "f"), (s.d, s.f)),
        "hidden": (("n", "f"), (s.n, s.f)),
        "w_down": (("f", "d"), (s.f, s.d)),
        "ffn_out": (("n", "d"), (s.n, s.d)),
        "block_out": (("n", "d"), (s.n, s.d)),
        "unembedding": (("d", "v"), (s.d, s.v)),
        "logits": (("n", "v"), (s.n, s.v)),
    }
    shapes = {}
    for name, (symbols, sizes) in table.items():
        shapes[name] = Shape(symbols, None if any(x is None for x in sizes) else sizes)
    return shapes


# ---------------------------------------------------------------------------------------------
# Drawing. Coordinates: x in [0, WIDTH], y grows upwards; the flow runs from the top down.

WIDTH = 11.0
LEFT = 0.3            # left edge of the drawn data
NOTE_X = 6.2          # where the shape notes start


def _box(ax: Axes, x: float, y: float, w: float, h: float, text: str, color: str, *,
         fontsize: float = 9, style: str = "round,pad=0.02,rounding_size=0.08",
         linestyle: str = "-", weight: str = "normal") -> None:
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle=style, facecolor=color,
                                edgecolor="#444444", linewidth=1.0, linestyle=linestyle))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize,
                weight=weight)


def _arrow(ax: Axes, x: float, y0: float, y1: float, label: str = "", *,
           label_x: float | None = None) -> None:
    ax.add_patch(FancyArrowPatch((x, y0), (x, y1), arrowstyle="-|>", mutation_scale=12,
                                 color="#333333", linewidth=1.2))
    if label:
        ax.text(x + 0.15 if label_x is None else label_x, (y0 + y1) / 2, label, ha="left",
                va="center", fontsize=8.5, color="#333333", style="italic")


def _note(ax: Axes, y: float, text: str, *, weight: str = "normal") -> None:
    ax.text(NOTE_X, y, text, ha="left", va="center", fontsize=8.5, weight=weight,
            family="monospace")


def _token_indices(n: int) -> list[int | None]:
    """Which tokens to draw: all of them, or the first and last few with None as an ellipsis."""
    if n <= MAX_DRAWN_TOKENS:
        return list(range(n))
    return [0, 1, 2, None, n - 2, n - 1]


def _draw_vectors(ax: Axes, y: float, n: int, height: float, cells: int, color: str,
                  token_width: float) -> None:
    """n column vectors (one per token) of ``cells`` drawn cells each, bottom at y."""
    for slot, index in enumerate(_token_indices(n)):
        x = LEFT + slot * token_width
        if index is None:
            ax.text(x + 0.25, y + height / 2, "…", ha="center", va="center", fontsize=12)
            continue
        cell_h = height / cells
        for c in range(cells):
            ax.add_patch(Rectangle((x + 0.08, y + c * cell_h), 0.34, cell_h, facecolor=color,
                                   edgecolor="#555555", linewidth=0.6))


def _draw_matrix(ax: Axes, y: float, n: int, width: float, height: float, color: str,
                 name: str) -> None:
    """An (n, ·) matrix as a rectangle with one band per row (token), bottom at y."""
    rows = _token_indices(n)
    row_h = height / len(rows)
    for r, index in enumerate(rows):
        top = y + height - (r + 1) * row_h
        if index is None:
            ax.text(LEFT + width / 2, top + row_h / 2, "⋮", ha="center", va="center", fontsize=10)
            continue
        ax.add_patch(Rectangle((LEFT, top), width, row_h, facecolor=color, edgecolor="#555555",
                               linewidth=0.6))
    ax.text(LEFT + width + 0.12, y + height / 2, name, ha="left", va="center", fontsize=10)


def _token_row(ax: Axes, y: float, n: int, token_width: float) -> None:
    for slot, index in enumerate(_token_indices(n)):
        x = LEFT + slot * token_width
        if index is None:
            ax.text(x + 0.25, y + 0.2, "…", ha="center", va="center", fontsize=12)
            continue
        _box(ax, x + 0.04, y, 0.42, 0.4, f"$t_{{{index + 1}}}$", COLORS["tokens"], fontsize=9,
             style="square,pad=0")


def plot_architecture(config: GPTConfig | None = None, *, n: int | None = None, view: str = "vectors",
                      ax: Axes | None = None, title: str | None = None) -> Figure:
    """Draw the model from token ids to logits, every stage annotated with its shape.

    config: a GPTConfig whose numbers are printed beside
    the symbols; None for symbols only. n: tokens drawn (default 5; beyond 6 the middle ones are
    elided). view: ``"vectors"`` (lists of vectors, chapter 1) or ``"matrices"`` (matrix products
    with their operands' shapes, chapter 5). ax: an Axes to draw into (its figure is returned);
    otherwise a new figure, closed in pyplot so that a notebook shows it once, as the cell's
    value. The shapes drawn are exactly those of :func:`architecture_shapes`. Chapters 1 and 5.
    """
    if view not in VIEWS:
        raise ValueError(f"view: expected one of {VIEWS}, got {view!r}")
    if ax is not None and not isinstance(ax, Axes):
        raise TypeError(f"ax: expected a matplotlib Axes or None, got {type(ax).__name__}")
    sizes = architecture_sizes(config, n=n)
    shapes = architecture_shapes(config, n=n)
    if ax is None:
        fig, ax = plt.subplots(figsize=(9.4, 10.4) if view == "matrices" else (8.4, 8.4))
        plt.close(fig)            # out of pyplot's registry: the caller owns (and displays) it
    fig = ax.figure
    if view == "vectors":
        top = _draw_vectors_view(ax, sizes, shapes)
    else:
        top = _draw_matrices_view(ax, sizes, shapes)
    ax.set_xlim(0, WIDTH)
    ax.set_ylim(0, top)
    ax.set_aspect("equal")
    ax.axis("off")
    if title is None:
        title = ("A GPT as lists of vectors" if view == "vectors"
                 else "A GPT as matrix products (one sequence; rows are tokens)")
        if sizes.known:
            title += (f"\nd = {sizes.d}, h = {sizes.h}, d_head = {sizes.d_head}, f = {sizes.f}, "
                      f"v = {sizes.v}, L = {sizes.L}, n = {sizes.n}")
    if title:
        ax.set_title(title, fontsize=10)
    return fig


def _layers_label(sizes: Sizes) -> str:
    return "× L blocks" + (f" (L = {sizes.L})" if sizes.L is not None else "")


def _draw_vectors_view(ax: Axes, sizes: Sizes, shapes: dict[str, Shape]) -> float:
    n = sizes.n
    token_width = 0.55
    data_w = len(_token_indices(n)) * token_width
    mid = LEFT + data_w / 2
    d_cells = 4
    v_cells = 7                    # the vocabulary is (nearly always) far wider than d
    y = 0.2

    # logits at the bottom, then upwards: unembedding, vectors, blocks, vectors, embedding, tokens
    _draw_vectors(ax, y, n, 2.1, v_cells, COLORS["logits"], token_width)
    _note(ax, y + 1.05, f"n vectors of size v: logits\n{shapes['logits']}", weight="bold")
    y += 2.1
    _arrow(ax, mid, y + 0.9, y + 0.05, "final layer norm, unembedding (d -> v)",
           label_x=LEFT + data_w + 0.15)
    y += 0.9
    _draw_vectors(ax, y, n, 1.2, d_cells, COLORS["embedding"], token_width)
    _note(ax, y + 0.6, f"n vectors of size d\n{shapes['block_out']}")
    y += 1.2

    # the block
    _arrow(ax, mid, y + 0.5, y + 0.05)
    y += 0.5
    block_y, block_h = y, 3.0
    _box(ax, 0.1, block_y, 5.8, block_h, "", COLORS["block"], linestyle="--")
    ax.text(0.25, block_y + block_h - 0.22, _layers_label(sizes), ha="left", va="center",
            fontsize=9, weight="bold")
    inner_x, inner_w = 0.55, 3.3
    # inside a block data flows downwards: attention, its residual add, FFN, its residual add
    _box(ax, inner_x, block_y + 0.45, inner_w, 0.5, "layer norm -> FFN", COLORS["ffn"])
    ax.text(inner_x + inner_w + 0.1, block_y + 0.7, "each token\non its own",
            ha="left", va="center", fontsize=7.5)
    _box(ax, inner_x, block_y + 1.6, inner_w, 0.5, "layer norm -> attention",
         COLORS["attention"])
    ax.text(inner_x + inner_w + 0.1, block_y + 1.85, "tokens exchange\ninformation",
            ha="left", va="center", fontsize=7.5)
    for y_plus in (block_y + 0.22, block_y + 1.33):
        ax.text(inner_x + inner_w / 2, y_plus, "+ residual (x + ...)", ha="center",
                va="center", fontsize=7.5, color="#555555")
    _note(ax, block_y + block_h / 2,
          "in:  n vectors of size d\nout: n vectors of size d\n(n, d) -> (n, d)\n"
          "shape-preserving,\nso blocks stack",
          weight="normal")
    y = block_y + block_h

    _arrow(ax, mid, y + 0.5, y + 0.05)
    y += 0.5
    _draw_vectors(ax, y, n, 1.2, d_cells, COLORS["embedding"], token_width)
    _note(ax, y + 0.6, f"n vectors of size d\n{shapes['x']}", weight="bold")
    y += 1.2
    _arrow(ax, mid, y + 0.9, y + 0.05, "embedding lookup + position", label_x=LEFT + data_w + 0.15)
    y += 0.9
    _token_row(ax, y, n, token_width)
    _note(ax, y + 0.2, f"n token ids\n{shapes['tokens']}", weight="bold")
    return y + 0.7


def _product(a: Shape, b: Shape, out: Shape) -> str:
    """``(n, d) @ (d, f) -> (n, f)``, with a second line in numbers when they are known."""
    def fmt(shape: Shape, numbers: bool) -> str:
        parts = shape.sizes if numbers else shape.symbols
        return "(" + ", ".join(str(p) for p in parts) + ")"
    text = f"{fmt(a, False)} @ {fmt(b, False)} -> {fmt(out, False)}"
    if a.sizes is not None and b.sizes is not None and out.sizes is not None:
        text += f"\n{fmt(a, True)} @ {fmt(b, True)} -> {fmt(out, True)}"
    return text


def _draw_matrices_view(ax: Axes, sizes: Sizes, shapes: dict[str, Shape]) -> float:
    n = sizes.n
    d_width, v_width = 1.6, 4.2
    s = shapes
    transposed_k = Shape(("h_kv", "d_head", "n"), None if s["k"].sizes is None
                         else (s["k"].sizes[0], s["k"].sizes[2], s["k"].sizes[1]))
    y = 0.2

    _draw_matrix(ax, y, n, v_width, 1.3, COLORS["logits"], "logits")
    _note(ax, y + 0.65, f"logits {s['logits']}", weight="bold")
    y += 1.3
    _arrow(ax, LEFT + d_width / 2, y + 1.0, y + 0.05,
           "LN(X) @ unembedding\n(token_embedding transposed)", label_x=LEFT + d_width / 2 + 0.15)
    _note(ax, y + 0.5, _product(s["block_out"], s["unembedding"], s["logits"]))
    y += 1.0
    _draw_matrix(ax, y, n, d_width, 1.3, COLORS["embedding"], "X")
    _note(ax, y + 0.65, f"X {s['block_out']}")
    y += 1.3

    _arrow(ax, LEFT + d_width / 2, y + 0.45, y + 0.05)
    y += 0.45
    steps = [  # (colour, what happens, shapes), drawn from the bottom of the block upwards
        ("ffn", "X = X + H @ w_down", _product(s["hidden"], s["w_down"], s["ffn_out"])),
        ("ffn", "H = GELU(LN(X) @ w_up)", _product(s["x"], s["w_up"], s["hidden"])),
        ("attention", "X = X + merged @ w_o", _product(s["merged"], s["w_o"], s["attention_out"])),
        ("attention", "A V, merge heads",
         _product(s["scores"], s["values"], s["context"]) + f"\n-> merged {s['merged']}"),
        ("attention", "A = softmax(QKᵀ/√d_head + mask)",
         _product(s["q"], transposed_k, s["scores"])),
        ("attention", "split, view, transpose",
         f"Q {s['q']}\nK, V {s['k']}"),
        ("attention", "QKV = LN(X) @ w_qkv", _product(s["x"], s["w_qkv"], s["qkv"])),
    ]
    row_h, gap = 0.62, 0.12
    block_h = len(steps) * (row_h + gap) + 0.55
    _box(ax, 0.1, y, WIDTH - 0.2, block_h, "", COLORS["block"], linestyle="--")
    ax.text(0.25, y + block_h - 0.24, _layers_label(sizes) + ": (n, d) in, (n, d) out",
            ha="left", va="center", fontsize=9, weight="bold")
    row_y = y + 0.15
    for color, what, shape_text in steps:
        _box(ax, 0.4, row_y, 4.4, row_h, what, COLORS[color], fontsize=8.5)
        ax.text(5.0, row_y + row_h / 2, shape_text, ha="left", va="center", fontsize=7.5,
                family="monospace")
        row_y += row_h + gap
    y += block_h

    _arrow(ax, LEFT + d_width / 2, y + 0.45, y + 0.05)
    y += 0.45
    _draw_matrix(ax, y, n, d_width, 1.3, COLORS["embedding"], "X")
    _note(ax, y + 0.65, f"X {s['x']}", weight="bold")
    y += 1.3
    _arrow(ax, LEFT + d_width / 2, y + 1.0, y + 0.05,
           "token_embedding[tokens]\n+ position_embedding[0..n)", label_x=LEFT + d_width / 2 + 0.15)
    _note(ax, y + 0.5, f"token_embedding {s['token_embedding']}\n"
                       f"position_embedding {s['position_embedding']}")
    y += 1.0
    _draw_matrix_row(ax, y, n)
    _note(ax, y + 0.2, f"tokens {s['tokens']}", weight="bold")
    return y + 0.7


def _draw_matrix_row(ax: Axes, y: float, n: int) -> None:
    """The token ids as one row of n integers."""
    for slot, index in enumerate(_token_indices(n)):
        x = LEFT + slot * 0.45
        if index is None:
            ax.text(x + 0.2, y + 0.2, "…", ha="center", va="center", fontsize=11)
            continue
        _box(ax, x, y, 0.42, 0.4, f"$t_{{{index + 1}}}$", COLORS["tokens"], fontsize=8.5,
             style="square,pad=0")
