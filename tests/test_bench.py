"""``python -m course.bench`` smoke-runs (``--quick``) and reports what it promises: every form's
row, the ratios as numbers, the expectations' verdicts, the machine and its measured peak. Timings
themselves are never asserted. Also the measuring helpers of llmcore.timing."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from course.bench.__main__ import ON_REQUEST, SECTIONS, main
from llmcore.masks import causal_mask
from llmcore.timing import (attention_flops, calls_made, gflops, matmul_flops, matmul_peak_gflops,
                            measure, time_call)

ROOT = Path(__file__).resolve().parents[1]

FORMS = [
    "pure Python, triple loop (matmul_scalar)",
    "torch, one entry at a time (matmul_loop)",
    "torch, one token at a time (linear_loop)",
    "NumPy, x @ w (reference.matmul)",
    "NumPy, x @ w",
    "torch, x @ w (linear)",
    "pure Python, loops over lists (attention_scalar)",
    "torch, one query, one key at a time (attention_loop)",
    "NumPy matrices (reference.attention)",
    "torch matrices, explicit (attention)",
    "torch, fused (attention, backend='fused')",
]
RATIOS = [
    "projection, torch matrix vs pure Python",
    "projection, torch matrix vs linear_loop",
    "attention without a mask, torch matrix vs pure Python",
    "causal attention, torch matrix vs pure Python",
    "causal attention, torch matrix vs attention_loop",
    "attention, explicit time / fused time",
]
ROW = re.compile(r"^  (?P<label>.+?)\s+(?P<dtype>float32|float64)\s+(?P<time>[\d.e+-]+ (?:s|ms|us|ns))"
                 r"\s+(?P<rate>[\d.e+-]+)\s+(?P<pct>[\d.e+-]+)%\s+(?P<diff>[\d.e+-]+)$")
RATIO = re.compile(r"^ratio (?P<label>.+?) \(.*\): (?P<value>[\d.]+)x(?:\s+expected (?P<bound>[<>]= [\d.]+x): "
                   r"(?P<verdict>.+))?$")


@pytest.fixture(scope="module")
def report() -> str:
    done = subprocess.run([sys.executable, "-m", "course.bench", "--quick", "--section", "ops",
                           "--device", "cpu"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return done.stdout


def test_report_names_the_machine_and_its_measured_peak(report):
    assert re.search(r"^machine: CPU: .+ cores visible.*; torch \d", report, re.M)
    peak = re.search(r"^peak: ([\d.e+]+) GFLOP/s \(float32 square matmul on cpu", report, re.M)
    assert peak and float(peak.group(1)) > 0


def test_report_has_a_row_for_every_form_with_numbers(report):
    rows = [ROW.match(line) for line in report.splitlines()]
    rows = [r for r in rows if r]
    labels = [r["label"] for r in rows]
    for form in FORMS:
        assert form in labels, form
    assert labels.count("torch matrices, explicit (attention)") == 3      # no mask, causal, large
    for r in rows:
        assert float(r["rate"]) > 0 and float(r["pct"]) > 0
        assert float(r["diff"]) < 1e-4, r["label"]      # every form computed the same numbers


def test_report_gives_each_ratio_as_a_number_and_each_expectation_a_verdict(report):
    ratios = {m["label"]: m for m in map(RATIO.match, report.splitlines()) if m}
    assert sorted(ratios) == sorted(RATIOS)
    for m in ratios.values():
        assert float(m["value"]) > 0
    checked = ("attention without a mask, torch matrix vs pure Python",
               "causal attention, torch matrix vs pure Python")
    for label in checked:
        assert ratios[label]["bound"] == ">= 300x"
    assert ratios["attention, explicit time / fused time"]["bound"] == "<= 2x"
    for label in (*checked, "attention, explicit time / fused time"):
        assert ratios[label]["verdict"].startswith("not checked")     # --quick sizes are tiny


def test_sections_are_listed_and_unknown_ones_refused(capsys):
    assert [name for name, _ in SECTIONS][0] == "ops" and all(callable(run) for _, run in SECTIONS)
    with pytest.raises(SystemExit) as exit_:
        main(["--section", "nonsense"])
    assert exit_.value.code == 2
    assert "invalid choice: 'nonsense'" in capsys.readouterr().err
    assert main(["--threads", "0"]) == 2
    assert "--threads: expected a positive number, got 0" in capsys.readouterr().err


def test_main_writes_to_the_stream_it_is_given():
    out = io.StringIO()
    threads = torch.get_num_threads()
    try:
        assert main(["--quick", "--device", "cpu", "--threads", "1"], out=out) == 0
    finally:
        torch.set_num_threads(threads)
    text = out.getvalue()
    assert text.startswith("llmcore benchmark (torch ") and "1 thread)" in text
    assert re.search(r"^load: ", text, re.M) and "total:" in text
    for name, _ in SECTIONS:                    # every section ran, but those run only by name
        assert (f"\n== {name}: " in text) == (name not in ON_REQUEST), name


# ---------------------------------------------------------------------------- llmcore.timing

@pytest.mark.parametrize("n, k, m, batch, flops", [(2, 3, 4, 1, 48), (5, 1, 7, 3, 210), (1, 1, 1, 1, 2)])
def test_matmul_flops_counts_two_per_multiply_add(n, k, m, batch, flops):
    assert matmul_flops(n, k, m, batch=batch) == flops


@pytest.mark.parametrize("n, m", [(4, 4), (3, 7), (1, 5)])
def test_attention_flops_counts_the_visible_pairs(n, m):
    d_head, h, b = 8, 3, 2
    assert attention_flops(n, m, d_head, n_heads=h, batch=b) == 4 * b * h * n * m * d_head
    visible = int(causal_mask(n, m).sum())
    assert attention_flops(n, m, d_head, n_heads=h, batch=b, causal=True) == 4 * b * h * visible * d_head
    with pytest.raises(ValueError, match="expected m >= n"):
        attention_flops(m + 1, m, d_head)


def test_gflops_divides_by_time():
    assert gflops(3e9, 1.5) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="seconds must be positive, got 0"):
        gflops(1.0, 0.0)


def test_measure_warms_up_then_repeats_calls_long_enough():
    calls = []
    times = measure(lambda x: calls.append(x), 7, repeats=3, min_seconds=0.0)
    assert len(times) == 3 and all(t >= 0 for t in times)
    assert calls[0] == 7 and len(calls) == calls_made(3, number=1)  # warm-ups + 1 per repeat


def test_time_call_statistics_and_argument_checks():
    seconds = time_call(sum, range(1000), repeats=3, min_seconds=0.001)
    assert 0 < seconds < 1
    assert time_call(sum, range(1000), repeats=3, min_seconds=0.001, statistic="min") > 0
    with pytest.raises(ValueError, match=r"statistic: expected one of \('median', 'min'\), got 'mean'"):
        time_call(sum, [1], statistic="mean")
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        time_call(sum, [1], repeats=0)
    with pytest.raises(ValueError, match="the meta device"):
        time_call(torch.matmul, torch.empty(2, 2, device="meta"), torch.empty(2, 2, device="meta"))


def test_matmul_peak_is_a_positive_rate(device):
    assert matmul_peak_gflops(device, size=64, repeats=1) > 0
    with pytest.raises(ValueError, match="meta device computes nothing"):
        matmul_peak_gflops("meta")
    with pytest.raises(TypeError, match="expected a floating-point dtype"):
        matmul_peak_gflops("cpu", dtype=torch.int32, size=8)


def test_small_ratios_keep_their_digits():
    """A ratio below 0.01 (tiny --quick sizes on a busy machine) must not print as 0.00x."""
    from course.bench.ops import format_ratio
    assert [format_ratio(v) for v in (3124.4, 12.5, 0.5, 0.0123, 0.00042)] == \
        ["3124", "12.50", "0.50", "0.012", "0.00042"]
    assert float(format_ratio(1e-6)) > 0
