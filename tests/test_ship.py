"""course.ship end to end on a tiny config: the files it writes, and that the folder loads."""

from __future__ import annotations

import json
import math

import pytest
import torch

from course.ship import main
from llmcore.corpus import load_corpus
from llmcore.pretrained import load_pretrained, pretrained_info


def test_command_line_writes_a_loadable_model_folder(tmp_path, capsys):
    out = tmp_path / "run"
    flags = {"--d-model": 24, "--n-layers": 1, "--n-heads": 3, "--max-seq-len": 40,
             "--batch-size": 4, "--steps": 8, "--warmup-steps": 2, "--eval-every": 4,
             "--eval-windows": 4, "--threads": 1}
    argv = [str(x) for kv in flags.items() for x in kv] + ["--out", str(out), "--no-progress"]
    metrics = main(argv)
    printed = capsys.readouterr().out
    for name in ("config.json", "model.safetensors", "metrics.json", "loss_curve.png",
                 "validation_slice.txt", "MODEL_CARD.md", "DATA_CARD.md"):
        assert (out / name).is_file(), name
    assert json.loads((out / "metrics.json").read_text()) == metrics
    assert "greedy" in printed and "baselines on the validation split" in printed
    corpus = load_corpus()
    assert metrics["corpus"] == corpus.summary()
    assert metrics["model"]["d_model"] == 24 and metrics["training"]["steps"] == 8
    assert metrics["weights_dtype"] == "float32"                 # small enough to store as is
    model = load_pretrained(out)                              # the folder loads, hash checked
    assert model.dtype == torch.float32 and model.config.max_seq_len == 40
    assert pretrained_info(out)["validation"]["bits_per_byte"] == \
        pytest.approx(metrics["validation"]["bits_per_byte"])
    card = (out / "MODEL_CARD.md").read_text()
    assert f"{metrics['validation']['bits_per_byte']:.3f}" in card
    assert f"{metrics['baselines']['bigram_bits_per_byte']:.3f}" in card
    assert "PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2" in (out / "DATA_CARD.md").read_text()
    assert math.isfinite(metrics["fixed_slice"]["bits_per_byte"])
