"""Drawing where a tensor's elements live: the index grid you see, and the flat memory behind it.

A tensor is a flat block of memory (its *storage*) plus metadata: a shape, and a *stride* per
dimension, the number of storage slots to skip to move one step along it. Element ``[i, j]``
lives at ``storage_offset + i * stride[0] + j * stride[1]``. A transpose swaps the shape and the
strides and moves nothing; ``.contiguous()`` copies into a fresh storage in row-major order.

:func:`plot_layout` draws several tensors side by side, each element labelled with (and coloured
by) the storage slot it reads, and below them each distinct storage as a strip of slots: cells of
one colour are the same number in memory. Tensors of 1 to 3 dimensions are drawn; a 3-D tensor
appears as a row of 2-D slices (one per index of its first dimension), so that the view
(n, h, d_head) and the transpose (h, n, d_head) of chapter 4 can be compared. Chapter 2.
"""

from __future__ import annotations

from typing import Mapping

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import Colormap
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from torch import Tensor

MAX_ELEMENTS = 48
"""The most elements a drawn tensor (or storage) may have and stay legible."""

LABELS = ("offset", "value")


def storage_offsets(t: Tensor) -> np.ndarray:
    """The storage slot of every element of ``t``: an integer array of t's shape.

    offset[idx] = t.storage_offset() + sum_k idx[k] * t.stride(k). Works on any device (only
    metadata is read). Chapter 2.
    """
    if not isinstance(t, Tensor):
        raise TypeError(f"t: expected a torch.Tensor, got {type(t).__name__}")
    offsets = np.full(tuple(t.shape), t.storage_offset(), dtype=np.int64)
    for dim, (size, stride) in enumerate(zip(t.shape, t.stride())):
        shape = [1] * t.dim()
        shape[dim] = size
        offsets = offsets + (np.arange(size) * stride).reshape(shape)
    return offsets


def storage_values(t: Tensor) -> np.ndarray:
    """Every slot of ``t``'s storage, in memory order, as a 1-D NumPy array (copied to the CPU)."""
    slots = t.untyped_storage().nbytes() // t.element_size()
    flat = t.detach().as_strided((slots,), (1,), 0)       # the whole storage, slot by slot
    return flat.cpu().numpy()


def _check_tensors(tensors: object, label: str) -> dict[str, Tensor]:
    if not isinstance(tensors, Mapping):
        raise TypeError(f"tensors: expected a mapping name -> tensor, got "
                        f"{type(tensors).__name__}")
    if not tensors:
        raise ValueError("tensors: expected at least one tensor, got an empty mapping")
    if label not in LABELS:
        raise ValueError(f"label: expected one of {LABELS}, got {label!r}")
    for name, t in tensors.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"tensors[{name!r}]: expected a torch.Tensor, got "
                            f"{type(t).__name__}")
        if not 1 <= t.dim() <= 3:
            raise ValueError(f"tensors[{name!r}]: expected 1 to 3 dimensions, got shape "
                             f"{tuple(t.shape)}")
        slots = t.untyped_storage().nbytes() // t.element_size()
        if t.numel() > MAX_ELEMENTS or slots > MAX_ELEMENTS:
            raise ValueError(f"tensors[{name!r}]: at most {MAX_ELEMENTS} elements can be drawn "
                             f"legibly, got shape {tuple(t.shape)} on a storage of {slots} slots")
        if label == "value" and t.device.type == "meta":
            raise ValueError(f"tensors[{name!r}] is on the meta device and has no values; "
                             "use label='offset'")
    return dict(tensors)


def _text(value: float, label: str) -> str:
    if label == "offset":
        return str(int(value))
    return f"{value:.3g}" if isinstance(value, (float, np.floating)) else str(value)


def _cell(ax: Axes, x: float, y: float, slot: int, text: str, cmap: Colormap, slots: int) -> None:
    colour = cmap(slot / max(slots - 1, 1))
    ax.add_patch(Rectangle((x, y), 1, 1, facecolor=colour, edgecolor="white", linewidth=1.5))
    luminance = 0.299 * colour[0] + 0.587 * colour[1] + 0.114 * colour[2]
    ax.text(x + 0.5, y + 0.5, text, ha="center", va="center", fontsize=8,
            color="black" if luminance > 0.5 else "white")


def draw_tensor(ax: Axes, t: Tensor, *, name: str, label: str = "offset",
                cmap: str = "viridis") -> None:
    """Draw ``t`` as its index grid on ``ax``: each cell coloured by its storage slot and labelled
    with that slot (``label="offset"``) or with the element's value (``label="value"``).

    t: (k,), (r, c) or (s, r, c); a 3-D tensor is drawn as s grids side by side. The title gives
    the shape, the strides and whether the tensor is contiguous. Chapter 2.
    """
    t = _check_tensors({name: t}, label)[name]
    offsets = storage_offsets(t)
    values = t.detach().cpu().numpy() if label == "value" else offsets
    slots = t.untyped_storage().nbytes() // t.element_size()
    colours = plt.get_cmap(cmap)
    grids = offsets.reshape((1,) * (3 - t.dim()) + offsets.shape)     # (s, r, c)
    texts = values.reshape(grids.shape)
    s, r, c = grids.shape
    for k in range(s):
        left = k * (c + 1)                                             # one empty column between
        for i in range(r):
            for j in range(c):
                _cell(ax, left + j, r - 1 - i, int(grids[k, i, j]),
                      _text(texts[k, i, j], label), colours, slots)
        if t.dim() == 3:
            ax.text(left + c / 2, r + 0.15, f"[{k}]", ha="center", va="bottom", fontsize=8)
    ax.set_xlim(-0.1, s * (c + 1) - 0.9)
    ax.set_ylim(-0.1, r + (0.7 if t.dim() == 3 else 0.1))
    ax.set_aspect("equal")
    ax.axis("off")
    state = "contiguous" if t.is_contiguous() else "not contiguous"
    ax.set_title(f"{name}: shape {tuple(t.shape)}\nstride {t.stride()}, {state}", fontsize=9)


def draw_storage(ax: Axes, t: Tensor, *, name: str, label: str = "offset",
                 cmap: str = "viridis") -> None:
    """Draw the flat storage behind ``t`` as one strip of slots, in memory order. Chapter 2."""
    t = _check_tensors({name: t}, label)[name]
    slots = t.untyped_storage().nbytes() // t.element_size()
    values = storage_values(t) if label == "value" else np.arange(slots)
    colours = plt.get_cmap(cmap)
    for slot in range(slots):
        _cell(ax, slot, 0, slot, _text(values[slot], label), colours, slots)
    ax.set_xlim(-0.1, slots + 0.1)
    ax.set_ylim(-0.1, 1.1)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"memory of {name}: {slots} slots, in order", fontsize=9)


def plot_layout(tensors: Mapping[str, Tensor], *, label: str = "offset",
                cmap: str = "viridis") -> Figure:
    """Tensors side by side (top row) over the distinct storages they read (one strip each).

    tensors: name -> tensor (1 to 3 dimensions, at most :data:`MAX_ELEMENTS` elements), e.g.
    ``{"x": x, "x.T": x.T, "x.T.contiguous()": x.T.contiguous()}``: x and x.T share one strip,
    the contiguous copy gets its own. label: ``"offset"`` writes the storage slot in each cell,
    ``"value"`` the number stored there. Returns the Figure. Chapter 2 (and 4).
    """
    tensors = _check_tensors(tensors, label)
    storages: dict[tuple, list[str]] = {}
    for name, t in tensors.items():
        key = (t.device, t.untyped_storage().data_ptr()) if t.device.type != "meta" \
            else ("meta", name)                                        # meta: nothing is shared
        storages.setdefault(key, []).append(name)
    widths = [_grid_width(t) for t in tensors.values()]
    strip_width = max(t.untyped_storage().nbytes() // t.element_size() for t in tensors.values())
    fig = plt.figure(figsize=(min(12.0, 1.0 + 0.42 * max(sum(widths) + len(widths), strip_width)),
                              1.6 + 0.45 * max(_grid_height(t) for t in tensors.values())
                              + 0.8 * len(storages)),
                     layout="constrained")
    plt.close(fig)            # out of pyplot's registry: the caller owns (and displays) it
    heights = [max(_grid_height(t) for t in tensors.values()) + 1.2] + [1.6] * len(storages)
    rows = fig.subfigures(len(heights), 1, height_ratios=heights)
    top = rows[0].subplots(1, len(tensors), width_ratios=widths, squeeze=False)[0]
    for ax, (name, t) in zip(top, tensors.items()):
        draw_tensor(ax, t, name=name, label=label, cmap=cmap)
    for row, names in zip(rows[1:], storages.values()):
        draw_storage(row.subplots(), tensors[names[0]], name=", ".join(names), label=label,
                     cmap=cmap)
    return fig


def _grid_width(t: Tensor) -> int:
    shape = (1,) * (3 - t.dim()) + tuple(t.shape)
    return shape[0] * (shape[2] + 1) - 1


def _grid_height(t: Tensor) -> int:
    return 1 if t.dim() == 1 else t.shape[-2]
