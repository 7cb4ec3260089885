"""Smoke run of the benchmark's ``fast`` section at tiny sizes: it runs, its internal equality
checks pass (teaching == fast == transformers tokens, paged == contiguous logits, tiled == SDPA),
and it reports every ratio with what it compares. Timings are never asserted."""

from __future__ import annotations

import importlib.util
import io
import re

import pytest
import torch

from course.bench import fast

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


@pytest.fixture(scope="module")
def report() -> str:
    out = io.StringIO()
    fast.run(out, quick=True)
    return out.getvalue()


def ratio(report: str, label: str) -> float:
    match = re.search(rf"^ratio {re.escape(label)}: ([\d.]+)x", report, re.M)
    assert match, f"no ratio line for {label!r} in:\n{report}"
    return float(match.group(1))


def test_reports_bandwidth_generation_paging_and_attention_ratios(report):
    assert float(re.search(r"^memory bandwidth: ([\d.]+) GB/s", report, re.M).group(1)) > 0
    for b in (1, 3):
        assert ratio(report, f"tiny batch {b}, fast / teaching tokens/s") > 0
    assert ratio(report, "tiny decode step time / weight-read bound") > 0
    assert ratio(report, "tiny output projection, (v, d) rows / (d, v) copy time") > 0
    for backend in ("fused", "explicit"):
        assert ratio(report, f"mixed lengths, paged / contiguous decode step time ({backend})") > 0
    assert ratio(report, "shared prefix, contiguous / shared-prefix decode step time") > 0
    assert ratio(report, "explicit attention() time / SDPA time (n=32)") > 0
    assert ratio(report, "tiled / SDPA time (n=64)") > 0
    assert ratio(report, "tiled / SDPA peak memory (n=64)") > 0
    assert "not checked (--quick sizes" in report
    assert report.count("(greedy tokens identical)") == 2


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is not installed (dev extra)")
def test_transformers_peer_is_compared_on_the_same_weights(report):
    assert "GPT2LMHeadModel from llmcore.save_gpt2 of the same random weights" in report
    for b in (1, 3):
        assert ratio(report, f"tiny batch {b}, fast / transformers tokens/s") > 0


def test_missing_transformers_is_reported_not_hidden(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "transformers", None)   # import fails
    peer, note = fast.load_transformers(fast.GPT(fast.TINY), "unused")
    assert peer is None and "transformers is not installed" in note


def test_weight_bytes_count_every_parameter_but_the_position_table():
    model = fast.GPT(fast.TINY)
    c = fast.TINY
    assert fast.weight_bytes(model) == 4 * (model.num_parameters() - c.max_seq_len * c.d_model)
    assert fast.weight_bytes(fast.GPT(fast.TINY, dtype=torch.float64)) == \
        2 * fast.weight_bytes(model)
