"""llmcore.peak_memory: peak_memory sees allocations of known size, reports the peak (not the
total) of what a call holds at once, ignores the inputs that existed before, and names bad input."""

from __future__ import annotations

import pytest
import torch

from llmcore.peak_memory import peak_memory

MIB = 2**20


def one_buffer(x):
    return x.new_zeros(MIB)                                 # float32: 4 MiB, returned


def two_buffers_in_turn(x):
    first = x.new_zeros(MIB)                                # 4 MiB ...
    total = first.sum()
    del first                                               # ... freed before the next 4 MiB
    second = x.new_ones(MIB)
    return total + second.sum()


def two_buffers_at_once(x):
    first, second = x.new_zeros(MIB), x.new_ones(MIB)       # 8 MiB held together
    return first.sum() + second.sum()


@pytest.mark.parametrize("fn, want", [
    (one_buffer, 4 * MIB), (two_buffers_in_turn, 4 * MIB), (two_buffers_at_once, 8 * MIB)])
def test_peak_memory_of_known_allocations(fn, want, device):
    x = torch.zeros(3, device=device)
    got = peak_memory(fn, x)
    assert want <= got < want + MIB // 4, f"{fn.__name__}: expected about {want} B, got {got} B"


def test_inputs_that_existed_before_are_not_counted(device):
    big = torch.ones(4 * MIB, device=device)                # 16 MiB, allocated outside the call
    assert peak_memory(torch.sum, big) < MIB


def test_bad_arguments():
    with pytest.raises(TypeError, match="fn"):
        peak_memory("attention", torch.zeros(2))
    with pytest.raises(ValueError, match="tensor"):
        peak_memory(lambda: torch.zeros(2))
    with pytest.raises(ValueError, match="meta"):
        peak_memory(torch.sum, torch.zeros(2, device="meta"))
