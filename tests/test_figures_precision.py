"""course.figures.precision: the bits read are the machine's, the fields add up, the figures
show what they were given, and bad input is refused."""

from __future__ import annotations

import struct

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from course.figures.precision import (FIELD_COLORS, float_bits, float_fields,  # noqa: E402
                                      plot_float_bits, plot_tradeoff)


def test_field_widths_of_the_three_formats():
    assert float_fields(torch.float32) == (1, 8, 23)
    assert float_fields(torch.bfloat16) == (1, 8, 7)
    assert float_fields(torch.float16) == (1, 5, 10)
    assert float_fields(torch.float64) == (1, 11, 52)


@pytest.mark.parametrize("value", [1.0, -2.5, 0.1, 65504.0, 3e-5, -0.0])
def test_float32_bits_match_the_ieee_encoding_from_struct(value):
    (pattern,) = struct.unpack(">I", struct.pack(">f", value))
    assert float_bits(value, torch.float32) == format(pattern, "032b")


@pytest.mark.parametrize("value", [1.0, -2.5, 0.1, 300.0, 70000.0])
def test_bfloat16_is_the_top_half_of_float32_after_rounding(value):
    bits = float_bits(value, torch.bfloat16)
    assert len(bits) == 16
    rounded = torch.tensor(value, dtype=torch.bfloat16).float().item()
    assert float_bits(rounded, torch.float32) == bits + "0" * 16


def test_float16_bits_decode_to_the_stored_value():
    for value in (1.0, -2.5, 0.1, 1000.0):
        bits = float_bits(value, torch.float16)
        s, e, m = int(bits[0]), int(bits[1:6], 2), int(bits[6:], 2)
        decoded = (-1) ** s * 2.0 ** (e - 15) * (1 + m / 1024)
        assert decoded == torch.tensor(value, dtype=torch.float16).item()


def test_float_bits_reads_tensors_on_any_device(device):
    t = torch.tensor([-2.5], device=device)
    assert float_bits(t, torch.bfloat16) == float_bits(-2.5, torch.bfloat16)
    assert float_bits(t[0], torch.float16) == "1100000100000000"


def test_float_bits_refuses_bad_input():
    with pytest.raises(TypeError, match="floating dtype"):
        float_bits(1.0, torch.int32)
    with pytest.raises(ValueError, match="one number"):
        float_bits(torch.ones(2), torch.float32)
    with pytest.raises(ValueError, match="meta"):
        float_bits(torch.ones(1, device="meta"), torch.float32)
    with pytest.raises(TypeError, match="number or a one-element tensor"):
        float_bits("1.0", torch.float32)
    with pytest.raises(TypeError, match="number or a one-element tensor"):
        float_bits(True, torch.float32)


def test_plot_float_bits_draws_every_bit_with_its_field_colour():
    rows = [("one", 1.0, torch.float32), ("minus 2.5", -2.5, torch.bfloat16)]
    fig = plot_float_bits(rows)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    digits = [t.get_text() for t in ax.texts if t.get_text() in ("0", "1")]
    assert "".join(digits) == float_bits(1.0, torch.float32) + float_bits(-2.5, torch.bfloat16)
    colours = [matplotlib.colors.to_hex(p.get_facecolor()[:3]) for p in ax.patches]
    assert len(colours) == 48
    assert colours[0] == FIELD_COLORS["sign"]
    assert colours[1:9] == [FIELD_COLORS["exponent"]] * 8
    assert colours[9:32] == [FIELD_COLORS["mantissa"]] * 23
    assert colours[32 + 9:] == [FIELD_COLORS["mantissa"]] * 7
    values = [t.get_text() for t in ax.texts if t.get_text().startswith("=")]
    assert values == ["= 1", "= -2.5"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(FIELD_COLORS)


def test_plot_float_bits_refuses_bad_rows():
    with pytest.raises(TypeError, match="non-empty sequence"):
        plot_float_bits([])
    with pytest.raises(TypeError, match=r"rows\[0\]"):
        plot_float_bits([(1.0, torch.float32)])
    with pytest.raises(TypeError, match="floating dtype"):
        plot_float_bits([("x", 1.0, torch.int8)])


def test_plot_tradeoff_draws_the_points_and_merges_coinciding_labels():
    points = {"fp32": (32.0, 1.77), "bf16": (16.0, 1.7704), "fp16": (16.0, 1.77041),
              "int4": (4.5, 1.79)}
    ax = plot_tradeoff(points, xlabel="bits per weight", ylabel="bits per byte", logx=True)
    assert isinstance(ax, Axes)
    offsets = ax.collections[0].get_offsets().tolist()
    assert offsets == [[32.0, 1.77], [16.0, 1.7704], [16.0, 1.77041], [4.5, 1.79]]
    labels = sorted(t.get_text() for t in ax.texts)
    assert labels == ["bf16 / fp16", "fp32", "int4"]
    assert ax.get_xscale() == "log" and ax.get_xlabel() == "bits per weight"


def test_plot_tradeoff_adds_a_second_set_with_a_legend():
    ax = plot_tradeoff({"a": (1, 2), "b": (2, 1)}, xlabel="x", ylabel="y", label="first")
    plot_tradeoff({"a": (1, 3)}, xlabel="x", ylabel="y", ax=ax, label="second",
                  color="#e1812c", annotate=False)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["first", "second"]
    assert sorted(t.get_text() for t in ax.texts) == ["a", "b"]


def test_plot_tradeoff_refuses_bad_points():
    with pytest.raises(TypeError, match="non-empty mapping"):
        plot_tradeoff({}, xlabel="x", ylabel="y")
    with pytest.raises(TypeError, match="pair of numbers"):
        plot_tradeoff({"a": (1, 2, 3)}, xlabel="x", ylabel="y")
    with pytest.raises(ValueError, match="finite"):
        plot_tradeoff({"a": (1, float("nan"))}, xlabel="x", ylabel="y")
    with pytest.raises(ValueError, match="positive"):
        plot_tradeoff({"a": (0, 1)}, xlabel="x", ylabel="y", logx=True)
