"""course.figures.memory: storage offsets follow the strides, and the figure shows them."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from course.figures.memory import (MAX_ELEMENTS, plot_layout, storage_offsets,  # noqa: E402
                                    storage_values)


def test_offsets_of_a_contiguous_matrix_count_in_row_major_order():
    x = torch.zeros(3, 5)
    assert storage_offsets(x).tolist() == np.arange(15).reshape(3, 5).tolist()


def test_a_transpose_reads_the_same_slots_in_the_other_order():
    x = torch.zeros(3, 5)
    assert storage_offsets(x.T).tolist() == storage_offsets(x).T.tolist()


def test_offsets_follow_views_slices_and_storage_offset(device):
    x = torch.arange(24.0, device=device).reshape(2, 3, 4)
    for view in (x.transpose(0, 2), x[:, 1:, ::2], x[1], x.view(6, 4)[2:5, 1]):
        flat = storage_values(view)
        # reading the storage at each offset must give back the element itself
        assert flat[storage_offsets(view)].tolist() == view.cpu().tolist()


def test_offsets_work_on_meta_tensors():
    x = torch.empty(4, 6, device="meta")
    assert storage_offsets(x.T)[1, 2] == 2 * 6 + 1


def text_of(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def test_plot_layout_titles_and_shared_storage():
    x = torch.arange(12.0).reshape(3, 4)
    fig = plot_layout({"x": x, "x.T": x.T, "copy": x.T.contiguous()}, label="value")
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[0].startswith("x: shape (3, 4)") and "stride (4, 1), contiguous" in titles[0]
    assert "stride (1, 4), not contiguous" in titles[1]
    assert "stride (3, 1), contiguous" in titles[2]
    strips = [t for t in titles if t.startswith("memory of")]
    assert strips == ["memory of x, x.T: 12 slots, in order",
                      "memory of copy: 12 slots, in order"]
    # the copy's memory holds x's columns one after another
    copy_strip = fig.axes[titles.index(strips[1])]
    assert text_of(copy_strip) == ["0", "4", "8", "1", "5", "9", "2", "6", "10", "3", "7", "11"]
    # x.T's grid shows x's values transposed, read row by row
    assert text_of(fig.axes[1]) == [str(v) for row in x.T.int().tolist() for v in row]


def test_plot_layout_draws_3d_tensors_as_slices():
    q = torch.zeros(3, 4)
    fig = plot_layout({"heads": q.view(3, 2, 2).transpose(0, 1)})
    labels = text_of(fig.axes[0])
    assert "[0]" in labels and "[1]" in labels and "[2]" not in labels
    assert labels.count("5") == 1           # slot 5 appears once: head 1 of token 1, feature 0


@pytest.mark.parametrize("tensors, error, words", [
    ({}, ValueError, "at least one tensor"),
    ([torch.zeros(2)], TypeError, "mapping"),
    ({"x": [1, 2]}, TypeError, r"tensors\['x'\]"),
    ({"x": torch.tensor(1.0)}, ValueError, "1 to 3 dimensions"),
    ({"x": torch.zeros(1, 2, 2, 2)}, ValueError, "1 to 3 dimensions"),
    ({"x": torch.zeros(MAX_ELEMENTS + 1)}, ValueError, "legibly"),
    ({"x": torch.zeros(100)[:3]}, ValueError, "storage of 100 slots"),
])
def test_bad_tensors_are_refused(tensors, error, words):
    with pytest.raises(error, match=words):
        plot_layout(tensors)


def test_values_of_a_meta_tensor_cannot_be_drawn():
    with pytest.raises(ValueError, match="meta"):
        plot_layout({"x": torch.empty(2, 3, device="meta")}, label="value")
    with pytest.raises(ValueError, match="label"):
        plot_layout({"x": torch.zeros(2, 3)}, label="colour")
