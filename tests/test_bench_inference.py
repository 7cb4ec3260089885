"""Smoke run of the benchmark's inference section at tiny sizes: it runs, its internal equality
checks pass (cached == recomputed, paged == contiguous), and it reports every figure."""

from __future__ import annotations

import io
import re

from course.bench import inference


def test_inference_section_reports_every_figure():
    out = io.StringIO()
    inference.run(out, quick=True)
    text = out.getvalue()
    assert re.search(r"new tokens\s+recompute\s+KV cache", text)
    assert len(re.findall(r"^\s+\d+\s+\S+ m?s\s+\S+ m?s\s+[\d.]+x$", text, re.M)) == 2
    assert re.search(r"ratio tokens/s at batch 2 vs batch 1: [\d.]+x", text)
    assert re.search(r"ratio paged step time / contiguous step time: [\d.]+x", text)
    formula, measured = map(int, re.search(r"formula .* = (\d+); measured .* = (\d+)",
                                           text).groups())
    assert formula == measured
    contiguous = float(re.search(r"contiguous, max-length .* wasted ([\d.]+)%", text).group(1))
    paged = float(re.search(r"paged, blocks of \d+: .* wasted ([\d.]+)%", text).group(1))
    assert paged < contiguous
    assert "under one block = 4: held" in text
