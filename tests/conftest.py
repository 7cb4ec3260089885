"""Shared fixtures: the device matrix (CPU always, CUDA where present), seeded generators, and
a tiny random GPT that every model-level test can use."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llmcore.device import cuda_available
from llmcore.model import GPT, GPTConfig

DEVICES = ["cpu", "cuda"]


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    """Runs a test once per device; the CUDA run is skipped, with the reason, where there is none."""
    if request.param == "cuda" and not cuda_available():
        pytest.skip("CUDA is not available on this machine")
    return torch.device(request.param)


@pytest.fixture
def rng() -> np.random.Generator:
    """A fresh, seeded NumPy generator per test: no state shared between cases."""
    return np.random.default_rng(0)


TINY = GPTConfig(vocab_size=61, max_seq_len=48, d_model=24, n_heads=3, n_layers=2)
"""Every size distinct (v != n != d != h ...), so that a transposed or swapped axis cannot pass."""

TINY_GQA = GPTConfig(vocab_size=61, max_seq_len=48, d_model=24, n_heads=4, n_kv_heads=2,
                     n_layers=2)


@pytest.fixture
def tiny_model(device) -> GPT:
    """A randomly initialised tiny GPT in float32 on the test's device."""
    return GPT(TINY, device=device, seed=1).eval()


@pytest.fixture
def tiny_gqa_model(device) -> GPT:
    """The same, with grouped-query attention (4 query heads sharing 2 K/V heads)."""
    return GPT(TINY_GQA, device=device, seed=2).eval()
