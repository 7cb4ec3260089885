"""Smoke run of the benchmark's ``fast`` section at tiny sizes: it runs, its internal equality
checks pass (teaching == fast == transformers tokens, paged == contiguous logits, tiled == SDPA),
and it reports every ratio with what it compares. Timings are never asserted."""

from __future__ import annotations

import dataclasses
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


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is not installed (dev extra)")
def test_reports_a_llama_shape_in_every_precision_against_transformers(report):
    for b in (1, 3):
        for p in ("fp32", "bf16"):
            assert ratio(report, f"tiny Llama batch {b}, fast {p} / transformers {p} tokens/s") > 0
        assert ratio(report, f"tiny Llama batch {b}, fast w8a8 / transformers int8 tokens/s") > 0
        for p in ("bf16", "int8", "w8a8", "int4"):
            assert ratio(report, f"tiny Llama batch {b}, fast {p} / fast fp32 tokens/s") > 0


def test_reports_bandwidth_generation_paging_and_attention_ratios(report):
    assert float(re.search(r"^memory bandwidth: ([\d.]+) GB/s", report, re.M).group(1)) > 0
    for b in (1, 3):
        assert ratio(report, f"tiny batch {b}, fast / teaching tokens/s") > 0
    assert ratio(report, "tiny decode step time / weight-read bound") > 0
    assert ratio(report, "tiny output projection, (v, d) rows / (d, v) copy time") > 0
    for backend in ("fused", "explicit"):
        assert ratio(report, f"mixed lengths, paged / contiguous decode step time ({backend})") > 0
    assert ratio(report, "shared prefix, contiguous / shared-prefix decode step time") > 0
    assert ratio(report, "Mistral decode step, ring / static cache time") > 0
    ring = re.search(r"ring of W rows .*, (\d+) KiB of cache; static cache of every row "
                     r".*, (\d+) KiB", report)
    assert ring and float(ring.group(1)) < float(ring.group(2)), report    # 48 rows of 193
    assert ratio(report, "explicit attention() time / SDPA time (n=32)") > 0
    assert ratio(report, "tiled / SDPA time (n=64)") > 0
    assert ratio(report, "tiled / SDPA peak memory (n=64)") > 0
    assert "not checked (--quick sizes" in report
    assert report.count("(greedy tokens identical)") == 2


def test_reports_each_precision_against_fp32_and_its_own_bound(report):
    for b in (1, 3):
        for p in ("bf16", "int8", "w8a8", "int4"):
            assert ratio(report, f"tiny batch {b}, fast {p} / fast fp32 tokens/s") > 0
    for p in fast.PRECISIONS:
        assert ratio(report, f"tiny {p} decode step time / its weight-read bound") > 0
        assert re.search(rf"^ +{p}: weights .*; products \S+ \S+ of a profiled step of \S+ "
                         r"\S+ \(5 a step, [\d.]+ GB/s\)", report, re.M)
        assert re.search(rf"^  batch  1 +{p}: fast +\d+ .* prepared once in \S+", report, re.M)


def test_precision_rows_count_fewer_bytes_for_fewer_bits(monkeypatch):
    """Each row counts the bytes its kernel reads: bf16's own kernel half of float32's, but
    one row of a model that fits in a cache runs float32 products on bf16-rounded weights
    (llmcore.fastpath.DENSE_BF16_WHEN_CACHED), which read float32's bytes, and says so (the
    step in C, which a cached model's bf16 may keep instead, is timed elsewhere: off here)."""
    import llmcore.fastpath
    monkeypatch.setattr(llmcore.fastpath, "STEP_IN_C", False)
    model = fast.GPT(fast.TINY)
    cached = fast.precision_rows(model, 1e10, batch=1, context=4, sizes=fast.QUICK,
                                 precisions=("fp32", "bf16"))
    assert cached[1]["weight_bytes"] == cached[0]["weight_bytes"]
    assert "float32 products on bf16-rounded weights" in cached[1]["kernel"]
    monkeypatch.setattr(llmcore.fastpath, "DENSE_BF16_WHEN_CACHED", False)
    rows = fast.precision_rows(model, 1e10, batch=1, context=4, sizes=fast.QUICK)
    read = {row["precision"]: row["weight_bytes"] for row in rows}
    assert read["fp32"] == fast.weight_bytes(model) - 2 * 4 * fast.TINY.d_model   # not ln_f
    assert 1.8 < read["fp32"] / read["bf16"] <= 2 and read["int4"] < read["int8"] < read["bf16"]
    assert read["int4"] < read["w8a8"] < read["bf16"]   # int8 codes; its scales and biases fp32
    for row in rows:
        assert row["bound_tokens_per_second"] == pytest.approx(1e10 / row["weight_bytes"])
        assert row["step_over_bound"] == pytest.approx(
            row["bound_tokens_per_second"] / row["tokens_per_second"])


def test_the_profile_finds_every_product_of_a_step_in_every_precision():
    """Where a step's time goes: each precision's kernel is one of PRODUCT_OPS, found once per
    matrix of the model (4 a block, and the head) per step, and the products take part of the
    step's time."""
    model = fast.GPT(fast.TINY)
    rows = fast.precision_rows(model, 1e10, batch=1, context=4, sizes=fast.QUICK, split=True)
    for row in rows:
        assert row["products"] == 4 * fast.TINY.n_layers + 1, row["precision"]
        assert 0 < row["product_seconds"] < row["profiled_step_seconds"], row["precision"]


@pytest.mark.parametrize("precision", ["bf16", "int8", "w8a8", "int4"])
def test_the_profile_finds_llmcores_c_kernels_too(precision, monkeypatch):
    """A ctypes call is invisible to torch.profiler: llmcore.onerow records each of its C
    kernels' calls under its own name while a profiler runs, and the bench counts them."""
    from llmcore import lowbit
    c_form = lowbit.ONE_ROW_FORMATS[precision]
    if not c_form.available(torch.device("cpu")):
        pytest.skip(f"no one-row C kernel for {precision} here")
    monkeypatch.setitem(lowbit.FORMATS, precision, c_form._replace(dense_from=None))
    monkeypatch.setattr("llmcore.fastpath.DENSE_BF16_WHEN_CACHED", False)   # bf16's own
    model = fast.GPT(fast.TINY)
    row, = fast.precision_rows(model, 1e10, precisions=[precision], batch=1, context=4,
                               sizes=fast.QUICK, split=True)
    assert row["kernel"].startswith("llmcore's one-row")
    assert row["products"] == 4 * fast.TINY.n_layers + 1
    assert 0 < row["product_seconds"] < row["profiled_step_seconds"]


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is not installed (dev extra)")
def test_the_int8_peer_quantizes_every_matrix_and_keeps_the_logits_near(tmp_path):
    model = fast.GPT(fast.TINY, seed=0).eval()
    peers, note = fast.precision_peers(model, str(tmp_path))
    assert f"of its {4 * fast.TINY.n_layers + 1} matrices" in note
    ids = torch.randint(0, fast.TINY.vocab_size, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(ids)
        for precision, peer in peers.items():
            got = peer(ids).logits.float()
            assert (got - want).abs().max() <= 0.05 * want.abs().max(), precision


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


def test_the_goal_of_w8a8_or_int4_reads_the_faster_of_the_two():
    """GPT-2 small's batch-1 goal names either precision (issue 33): its line divides the
    faster one's tokens/s by fp32's, and each precision keeps its own line beside it."""
    out = io.StringIO()
    fast.precision_generation(out, "GPT-2 small", fast.GPT(fast.TINY, seed=0), {}, fast.QUICK,
                              checked=False)
    report = out.getvalue()
    either, batch, goal = fast.EITHER_VS_FP32_AT_LEAST
    line = [row for row in report.splitlines() if f"the faster of {' and '.join(either)}" in row]
    assert len(line) == 1 and f"batch {batch}," in line[0] and f">= {goal:g}x" in line[0]
    named = line[0].split("(")[1].split(")")[0]
    assert named in either
    rates = {p: ratio(report, f"GPT-2 small batch {batch}, fast {p} / fast fp32 tokens/s")
             for p in either}
    both = ratio(report, f"GPT-2 small batch {batch}, the faster of {' and '.join(either)} "
                         f"({named}) / fast fp32 tokens/s")
    assert both == max(rates.values()) == rates[named]


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is not installed (dev extra)")
@pytest.mark.parametrize("goal", [0.0, 1e9])
def test_each_precision_is_held_against_its_peer_and_a_goal_not_held_shows_its_profile(
        tmp_path, monkeypatch, goal):
    """Issue 33: every precision, weight-only int8 too, >= 1.2x transformers in the same
    precision. A goal no run can hold (1e9x) is followed, line by line, by the peer's time a
    step over the fast path's products alone; a goal every run holds (0x) by nothing."""
    monkeypatch.setattr(fast, "PRECISION_VS_TRANSFORMERS_AT_LEAST", goal)
    model = fast.GPT(fast.TINY, seed=0).eval()
    peers, _ = fast.precision_peers(model, str(tmp_path))
    out = io.StringIO()
    fast.precision_generation(out, "tiny", model, peers, fast.QUICK, checked=True)
    lines = out.getvalue().splitlines()
    verdict = "NOT held" if goal else "held"
    for b in fast.QUICK.batches:
        for p, peer in fast.PEER_OF.items():
            if peer not in peers:                  # GPT-2's fp32 peer is generation()'s
                continue
            label = f"ratio tiny batch {b}, fast {p} / transformers {peer} tokens/s: "
            at = [i for i, line in enumerate(lines) if line.startswith(label)]
            assert len(at) == 1, label
            assert lines[at[0]].endswith(f"expected >= {goal:g}x: {verdict}"), lines[at[0]]
            profile = (f"ratio tiny batch {b}, transformers {peer}'s time a step / fast {p}'s "
                       f"products alone")
            if goal:
                assert lines[at[0] + 1].startswith(profile), lines[at[0] + 1]
                assert float(re.search(r": ([\d.]+)x$", lines[at[0] + 1]).group(1)) > 0
            else:
                assert not any(line.startswith(profile) for line in lines)


def test_a_goal_against_fp32_prints_the_read_rate_it_needs(monkeypatch):
    """Under each goal against fp32 the profile prints the ratio of the products' read rates
    and the least one that goal needs: goal / (fp32's bytes / the precision's bytes), since
    the rest of a step adds to both. (The step in C is off: for this cached model it is timed
    against PyTorch's step, and the two runs below could keep forms of different bytes.)"""
    monkeypatch.setattr("llmcore.fastpath.STEP_IN_C", False)
    out = io.StringIO()
    model = fast.GPT(fast.TINY, seed=0)
    fast.precision_bounds(out, "GPT-2 small", model, 1e10, fast.QUICK, checked=False)
    report = out.getvalue()
    rows = {row["precision"]: row for row in fast.precision_rows(model, 1e10, sizes=fast.QUICK)}
    for p, goal in (("bf16", 2.0), ("w8a8", 3.0), ("int4", 3.0)):
        fewer = rows["fp32"]["weight_bytes"] / rows[p]["weight_bytes"]
        line = re.search(rf"^ratio GPT-2 small batch 1, {p}'s products' bytes a second / "
                         rf"fp32's, profiled \(its goal of {goal:g}x needs more than "
                         rf"{goal / fewer:.2f}x: fp32 reads {fewer:.2f}x its bytes.*: "
                         r"([\d.]+)x$", report, re.M)
        assert line and float(line.group(1)) > 0, (p, report)


def test_a_bound_measures_the_bandwidth_in_turn_with_the_step():
    """Given a meter, the step's repeats and the copies alternate (step, copy, step, copy...),
    and the best of each is kept; given a number, that number is the bandwidth."""
    calls, rates = [], iter([3e10, 5e10, 4e10, 2e10, 1e10, 4.5e10, 3.5e10])

    def step():
        calls.append("step")

    def meter(repeats=1):
        calls.append("copy")
        return next(rates)

    sizes = dataclasses.replace(fast.FULL, min_seconds=1e-4)
    seconds, rate = fast.step_and_bandwidth(step, meter, sizes)
    kinds = [kind for i, kind in enumerate(calls) if i == 0 or calls[i - 1] != kind]
    assert kinds == ["step", "copy"] * 7 and rate == 5e10 and 0 < seconds < 1e-3
    assert fast.step_and_bandwidth(step, 2.5e10, fast.QUICK)[1] == 2.5e10
