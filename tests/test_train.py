"""llmcore.train without the full run: the learning-rate schedule, batches and evaluation windows,
and a short training run on a tiny config that lowers the loss and repeats exactly under its seed
(the command that writes a model folder is course.ship: tests/test_ship.py)."""

from __future__ import annotations

import sys

import pytest
import torch

from llmcore.model import GPT, GPTConfig
from llmcore.train import (TrainConfig, evaluate_bits_per_byte, evaluation_windows,
                           learning_rate, next_byte_loss, random_batch, spread, train)

TINY_RUN = dict(d_model=32, n_layers=2, n_heads=2, max_seq_len=24, batch_size=8, steps=60,
                lr=1e-2, warmup_steps=6, eval_every=20, eval_windows=16)
"""A few seconds on a CPU: every size distinct (d = 32, h = 2, n = 24, b = 8)."""

TEXT = ("def add(a, b):\n    return a + b\n\n" * 40 + "class Point:\n    x = 0\n    y = 0\n"
        * 30).encode()


def stream(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def test_schedule_warms_up_linearly_then_decays_by_a_half_cosine():
    c = TrainConfig(steps=200, warmup_steps=20, lr=1e-3, min_lr_ratio=0.1)
    lrs = [learning_rate(s, c) for s in range(c.steps)]
    assert lrs[:20] == pytest.approx([1e-3 * (s + 1) / 20 for s in range(20)])
    assert lrs[19] == pytest.approx(1e-3)
    assert lrs[-1] == pytest.approx(1e-4)                       # lr * min_lr_ratio at the end
    middle = 20 + (199 - 20) / 2                                # half way through the decay
    assert learning_rate(int(middle), c) == pytest.approx(0.55e-3, rel=0.01)
    assert all(a >= b for a, b in zip(lrs[19:], lrs[20:]))      # never rises after warm-up


def test_schedule_without_warmup_starts_at_the_peak():
    c = TrainConfig(steps=10, warmup_steps=0, lr=2e-3, min_lr_ratio=0.0)
    assert learning_rate(0, c) == pytest.approx(2e-3) and learning_rate(9, c) == pytest.approx(0)


def test_random_batch_windows_are_consecutive_and_seeded():
    tokens = torch.arange(100, dtype=torch.uint8)
    g = torch.Generator().manual_seed(3)
    batch = random_batch(tokens, 5, 7, g)                       # (b=5, n+1=8)
    assert batch.shape == (5, 8) and batch.dtype == torch.long
    assert ((batch[:, 1:] - batch[:, :-1]) == 1).all()          # consecutive bytes
    again = random_batch(tokens, 5, 7, torch.Generator().manual_seed(3))
    assert torch.equal(batch, again)


def test_evaluation_windows_score_every_byte_once():
    tokens = torch.arange(50, dtype=torch.uint8)
    windows = evaluation_windows(tokens, 7)                     # k = 49 // 7 = 7
    assert windows.shape == (7, 8)
    assert windows[:, 1:].flatten().tolist() == list(range(1, 50))   # each target once
    assert torch.equal(windows[1:, 0], windows[:-1, -1])        # overlap of one byte
    assert spread(windows, 3)[:, 0].tolist() == [0, 21, 42]     # first, middle, last
    assert spread(windows, 99).shape == windows.shape


@pytest.mark.parametrize("bad, error, message", [
    (torch.arange(5), ValueError, "5 tokens are fewer than one window"),
    (torch.zeros(3, 40), ValueError, r"expected a 1-D tensor of byte tokens \(N,\), got shape"),
    ([1, 2, 3], TypeError, "expected a 1-D tensor of byte tokens, got list"),
])
def test_streams_are_checked(bad, error, message):
    with pytest.raises(error, match=message):
        evaluation_windows(bad, 8)


@pytest.mark.parametrize("field, value, message", [
    ("steps", 0, "steps must be positive"),
    ("lr", -1.0, "lr must be positive"),
    ("warmup_steps", 10 ** 6, r"warmup_steps must lie in \[0, steps"),
    ("min_lr_ratio", 2.0, r"min_lr_ratio must lie in \[0, 1\]"),
    ("n_heads", 5, "n_heads"),
])
def test_train_config_refuses_bad_settings(field, value, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig.from_settings(**{field: value})


def test_train_config_holds_a_gpt_config():
    config = TrainConfig.from_settings(**TINY_RUN)
    assert isinstance(config.model, GPTConfig) and config.model.d_model == 32
    assert config.model.vocab_size == 256 and config.steps == 60
    assert TrainConfig.from_settings(**config.settings()) == config          # a round trip
    assert list(config.settings())[:4] == ["d_model", "n_layers", "n_heads", "max_seq_len"]
    with pytest.raises(ValueError, match="vocab_size must be 256"):
        TrainConfig(model=GPTConfig(vocab_size=300))
    with pytest.raises(TypeError, match="expected a GPTConfig, got dict"):
        TrainConfig(model={"d_model": 32})


def test_next_byte_loss_of_a_fresh_model_is_about_uniform():
    config = TrainConfig.from_settings(**TINY_RUN)
    model = GPT(config.model, seed=0)
    windows = evaluation_windows(stream(TEXT), config.model.max_seq_len)
    bits = evaluate_bits_per_byte(model, windows)
    assert abs(bits - 8.0) < 0.3                                 # log2(256) = 8: knows nothing
    loss = next_byte_loss(model, windows[:4])
    assert loss.dtype == torch.float32 and loss.dim() == 0


@pytest.fixture(scope="module")
def tiny_run():
    config = TrainConfig.from_settings(**TINY_RUN)
    tokens = stream(TEXT)
    return config, train(config, tokens, tokens, progress=False)


def test_a_short_run_lowers_the_loss(tiny_run):
    config, (model, history) = tiny_run
    assert len(history.train_bits) == config.steps == len(history.lr) == len(history.grad_norm)
    assert history.eval_steps == [20, 40, 60]
    first, last = sum(history.train_bits[:5]) / 5, sum(history.train_bits[-5:]) / 5
    assert first > 6.5 and last < first - 3.0, (first, last)
    assert history.eval_bits[-1] < 3.5                          # repetitive text: easy
    assert not model.training
    assert max(history.grad_norm) > 0 and history.wall_seconds > 0


def test_a_run_repeats_exactly_under_its_seed():
    short = TrainConfig.from_settings(**{**TINY_RUN, "steps": 12, "eval_every": 6})
    tokens = stream(TEXT)
    a = train(short, tokens, tokens, progress=False)[1]
    b = train(short, tokens, tokens, progress=False)[1]
    assert a.train_bits == b.train_bits and a.eval_bits == b.eval_bits
    other = train(TrainConfig.from_settings(**{**TINY_RUN, "steps": 12, "eval_every": 6, "seed": 1}),
                  tokens, tokens, progress=False)[1]
    assert other.train_bits != a.train_bits


def test_training_prints_plain_progress_lines_without_tqdm(monkeypatch, capsys):
    """llmcore needs only torch, NumPy and safetensors: without tqdm the progress is printed."""
    monkeypatch.setitem(sys.modules, "tqdm", None)           # `import tqdm...` now raises
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    short = TrainConfig.from_settings(**{**TINY_RUN, "steps": 6, "eval_every": 3})
    tokens = stream(TEXT)
    with_bar = train(short, tokens, tokens, progress=True)[1]
    printed = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in printed] == ["step     3", "step     6"], printed
    assert "validation" in printed[-1]
    quiet = train(short, tokens, tokens, progress=False)[1]
    assert capsys.readouterr().out == "" and quiet.train_bits == with_bar.train_bits
