"""llmcore.timing on torch.utils.benchmark.Timer: what the course adds to it (threads as torch
uses them, the inputs' devices, a fixed number of repeats long enough each, exact call counts)."""

from __future__ import annotations

import time

import pytest
import torch

from llmcore.timing import calls_made, measure, measurement, time_call, timer_for


def test_the_call_runs_with_the_threads_torch_uses_unless_told():
    seen = []
    measure(lambda: seen.append(torch.get_num_threads()), repeats=2, min_seconds=0)
    assert set(seen) == {torch.get_num_threads()}      # not Timer's default of 1
    before = torch.get_num_threads()
    seen.clear()
    measure(lambda: seen.append(torch.get_num_threads()), repeats=2, min_seconds=0, threads=1)
    assert set(seen) == {1} and torch.get_num_threads() == before     # restored afterwards
    with pytest.raises(ValueError, match="threads must be at least 1, got 0"):
        measure(sum, [1], threads=0)


@pytest.mark.parametrize("min_seconds", [0.0, 0.005])
def test_calls_made_counts_every_call(min_seconds):
    """A KV-cache step appends a token per call: chapters size the cache by calls_made."""
    calls = []
    result = measurement(lambda: calls.append(time.sleep(0.001)), repeats=4,
                         min_seconds=min_seconds)
    assert len(result.times) == 4
    assert len(calls) == calls_made(4, result.number_per_run)
    assert (result.number_per_run == 1) is (min_seconds == 0)


def test_each_repeat_lasts_min_seconds_and_times_are_per_call():
    result = measurement(time.sleep, 0.002, repeats=3, min_seconds=0.02)
    # 0.02 s of 2 ms calls: 10, or fewer when the first (estimating) sleep overshot, as a busy
    # virtual machine's sleeps do (7 seen for one of 2.9 ms); 5 allows a first sleep of 4 ms
    assert 5 <= result.number_per_run <= 10
    assert all(0.002 <= t < 0.02 for t in result.times)
    assert result.median == pytest.approx(sorted(result.times)[1])


def test_median_and_min_statistics_come_from_the_same_repeats():
    assert 0.001 <= time_call(time.sleep, 0.001, repeats=3, min_seconds=0, statistic="min") \
        <= time_call(time.sleep, 0.001, repeats=3, min_seconds=0) + 0.01


def test_timer_is_torchs_with_the_callable_inside():
    timer = timer_for(torch.add, torch.ones(3), torch.ones(3))
    assert isinstance(timer, torch.utils.benchmark.Timer)
    assert timer.timeit(10).median > 0
