"""pick_device's order (CUDA, then Apple's MPS, then the CPU), its overrides and its errors, with
torch's availability checks replaced so that every machine kind is tried on this one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llmcore import device as device_module
from llmcore.device import DEVICE_VARIABLE, describe_machine, float64_device, pick_device


@pytest.fixture
def machine(monkeypatch):
    """Set which accelerators torch reports: machine(cuda=..., mps=...)."""
    monkeypatch.delenv(DEVICE_VARIABLE, raising=False)

    def set_available(*, cuda: bool, mps: bool) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)

    return set_available


@pytest.mark.parametrize("cuda, mps, expected", [
    (True, True, "cuda"),        # a machine with both prefers CUDA
    (True, False, "cuda"),
    (False, True, "mps"),        # a Mac with Apple silicon
    (False, False, "cpu"),       # a laptop without a usable GPU
])
def test_pick_device_prefers_cuda_then_mps_then_cpu(machine, cuda, mps, expected):
    machine(cuda=cuda, mps=mps)
    assert pick_device() == torch.device(expected)


def test_prefer_insists_on_a_kind(machine):
    machine(cuda=True, mps=True)
    assert pick_device("cpu") == torch.device("cpu")
    assert pick_device("mps") == torch.device("mps")
    assert pick_device("cuda:1") == torch.device("cuda", 1)


@pytest.mark.parametrize("kind", ["cuda", "mps"])
def test_asking_for_a_missing_device_names_what_there_is(machine, kind):
    machine(cuda=False, mps=False)
    with pytest.raises(ValueError, match=f"'{kind}' was asked for.*available: cpu"):
        pick_device(kind)


def test_unknown_kind_is_refused(machine):
    with pytest.raises(ValueError, match=r"expected one of \('cuda', 'mps', 'cpu'\), got 'meta'"):
        pick_device("meta")


def test_environment_variable_overrides_the_choice(machine, monkeypatch):
    machine(cuda=False, mps=True)
    monkeypatch.setenv(DEVICE_VARIABLE, "cpu")
    assert pick_device() == torch.device("cpu")
    assert pick_device("mps") == torch.device("mps")        # an explicit argument wins
    monkeypatch.setenv(DEVICE_VARIABLE, "cuda")
    with pytest.raises(ValueError, match="'cuda' was asked for"):
        pick_device()


def test_float64_work_leaves_mps_for_the_cpu():
    assert float64_device("mps") == torch.device("cpu")
    assert float64_device("cpu") == torch.device("cpu")
    assert float64_device(torch.device("cuda", 0)) == torch.device("cuda", 0)


def test_describe_machine_names_the_gpu_kind():
    assert "GPU: Apple MPS" in describe_machine("mps")
    assert "GPU" not in describe_machine("cpu")
    assert describe_machine().endswith(f"torch {torch.__version__.split('+')[0]}")


def test_library_code_follows_a_given_device_without_asking_torch(machine):
    """With no accelerator reported, a CPU model still runs: nothing in llmcore queries CUDA or
    MPS behind the caller's back (device.py is the only module that does)."""
    machine(cuda=False, mps=False)
    import llmcore
    model = llmcore.GPT(llmcore.GPTConfig(vocab_size=11, max_seq_len=8, d_model=8, n_heads=2,
                                          n_layers=1), device=torch.device("cpu"), seed=0)
    logits = model(torch.zeros(1, 3, dtype=torch.long))
    assert logits.device == torch.device("cpu") and logits.shape == (1, 3, 11)
    sources = [p for p in Path(device_module.__file__).parent.glob("*.py")
               if p.name != "device.py"]
    asking = [p.name for p in sources
              if "cuda.is_available" in p.read_text() or "mps.is_available" in p.read_text()]
    assert not asking, f"modules that pick a device themselves: {asking}"
