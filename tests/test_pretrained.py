"""The shipped model: it loads in one call from any working directory, matches the validation loss
its training run recorded, beats the n-gram baselines it is compared with, generates the same
text under a seed with and without the KV cache, and every broken checkpoint (truncated,
corrupted, a config that disagrees with the tensors) or out-of-range token id gets a clear
error."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from llmcore import decode_steps, generate, load_gpt2
from llmcore.corpus import load_corpus, ngram_bits_per_byte
from llmcore.model import GPT
from llmcore.pretrained import (DEFAULT_MODEL, available, load_pretrained, load_tokenizer,
                                pretrained_dir, pretrained_info)
from llmcore.tokenizer import ByteTokenizer, decode, encode_tensor
from course.ship import model_card
from llmcore.train import evaluate_bits_per_byte, evaluation_windows

MAX_WEIGHTS_BYTES = 8 * 10 ** 6


@pytest.fixture(scope="module")
def info() -> dict:
    return pretrained_info()


@pytest.fixture(scope="module")
def model() -> GPT:
    return load_pretrained()


@pytest.fixture
def copy_of_shipped(tmp_path) -> Path:
    """A writable copy of the shipped folder, to break in various ways."""
    return Path(shutil.copytree(pretrained_dir(), tmp_path / "copy"))


def test_it_ships_small_and_loads_in_one_call(model, info):
    assert DEFAULT_MODEL in available()
    folder = pretrained_dir()
    for name in ("config.json", "model.safetensors", "metrics.json", "MODEL_CARD.md",
                 "DATA_CARD.md", "loss_curve.png", "validation_slice.txt"):
        assert (folder / name).is_file(), name
    assert (folder / "model.safetensors").stat().st_size <= MAX_WEIGHTS_BYTES
    assert isinstance(model, GPT) and not model.training
    assert model.dtype == torch.float32 and model.device.type == "cpu"
    assert model.config.vocab_size == 256 and model.config.max_seq_len >= 128
    assert model.num_parameters() == info["model"]["parameters"] <= 5_000_000
    assert load_tokenizer() == ByteTokenizer()


def test_it_matches_its_recorded_loss_on_the_fixed_slice(info, device):
    model = load_pretrained(device=device)
    fixed = info["fixed_slice"]
    data = (pretrained_dir() / fixed["file"]).read_bytes()
    assert len(data) == fixed["bytes"]
    tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    windows = evaluation_windows(tokens, fixed["seq_len"])
    assert windows.shape[0] == fixed["n_windows"]
    bits = evaluate_bits_per_byte(model, windows)
    assert bits == pytest.approx(fixed["bits_per_byte"], abs=2e-3)


def test_its_recorded_quality_beats_the_baselines(info):
    val = info["validation"]["bits_per_byte"]
    unigram = info["baselines"]["unigram_bits_per_byte"]
    bigram = info["baselines"]["bigram_bits_per_byte"]
    assert val <= 2.0 and val < bigram - 1.0 and bigram < unigram
    assert info["history"]["eval_bits"][-1] == pytest.approx(val, abs=0.15)   # same split


def test_the_recorded_baselines_on_this_machines_stdlib(info):
    corpus = load_corpus()
    if corpus.summary()["validation_sha256"] != info["corpus"]["validation_sha256"]:
        pytest.skip(f"this Python's standard library ({info['corpus']['python']} was used for "
                    "training) gives another validation text; its baselines differ")
    for order, key in ((1, "unigram_bits_per_byte"), (2, "bigram_bits_per_byte")):
        got = ngram_bits_per_byte(corpus.train.data, corpus.validation.data, order)
        assert got == pytest.approx(info["baselines"][key], rel=1e-9)


def test_generation_is_deterministic_under_a_seed(model):
    prompt = encode_tensor("def ")
    a = generate(model, prompt, 40, temperature=0.9, seed=7)
    b = generate(model, prompt, 40, temperature=0.9, seed=7)
    c = generate(model, prompt, 40, temperature=0.9, seed=8)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(generate(model, prompt, 40), generate(model, prompt, 40))


def test_cached_and_uncached_generation_agree(model):
    prompt = encode_tensor("class Parser:\n    def ")
    for kwargs in ({}, {"temperature": 0.8, "seed": 3}):
        cached = generate(model, prompt, 24, use_cache=True, **kwargs)
        uncached = generate(model, prompt, 24, use_cache=False, **kwargs)
        assert torch.equal(cached, uncached), kwargs
    steps = zip(decode_steps(model, prompt, 8, use_cache=True),
                decode_steps(model, prompt, 8, use_cache=False))
    for with_cache, without in steps:
        torch.testing.assert_close(with_cache.logits, without.logits, rtol=1e-4, atol=1e-4)


def test_greedy_text_looks_like_python(model):
    prompt = encode_tensor("    def __init__(self")
    continuation = decode(generate(model, prompt, 30)[0, prompt.shape[1]:])
    assert "):\n" in continuation                     # it closes the signature, starts a body


def test_it_loads_from_any_working_directory(tmp_path):
    code = ("from llmcore.pretrained import load_pretrained, pretrained_info\n"
            "m = load_pretrained(); i = pretrained_info()\n"
            "print(m.num_parameters(), i['model']['parameters'])\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    got, want = done.stdout.split()
    assert got == want


def test_a_truncated_weights_file_is_refused(copy_of_shipped):
    weights = copy_of_shipped / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ValueError, match="SHA-256 .* differs .* corrupted or was replaced"):
        load_pretrained(copy_of_shipped)
    with pytest.raises(ValueError, match="not a readable safetensors file, it may be truncated"):
        load_pretrained(copy_of_shipped, verify=False)


def test_a_corrupted_weights_file_is_refused(copy_of_shipped):
    weights = copy_of_shipped / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF                  # one flipped byte inside the tensor data
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="SHA-256"):
        load_pretrained(copy_of_shipped)
    data[10:40] = b"\x00" * 30                      # a garbled header
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        load_pretrained(copy_of_shipped, verify=False)


@pytest.mark.parametrize("field, change, message", [
    ("n_embd", 8, "has shape .* but config.json implies"),
    ("n_layer", 1, "tensors this GPT-2 config does not use"),
    ("n_layer", 9, "missing .* tensor"),
    ("n_positions", 64, "wpe.weight has shape"),
])
def test_a_config_that_disagrees_with_the_tensors_is_refused(copy_of_shipped, field, change,
                                                              message):
    config_file = copy_of_shipped / "config.json"
    fields = json.loads(config_file.read_text())
    fields[field] = change if field != "n_embd" else fields["n_head"] * change
    config_file.write_text(json.dumps(fields))
    with pytest.raises(ValueError, match=message):
        load_pretrained(copy_of_shipped)


def test_missing_files_and_unknown_names(copy_of_shipped, tmp_path):
    with pytest.raises(ValueError, match="no shipped model called 'nope'; available: "):
        load_pretrained("nope")
    (copy_of_shipped / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        load_pretrained(copy_of_shipped)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_pretrained(tmp_path / "absent")
    with pytest.raises(TypeError, match="expected a model name or a folder path, got int"):
        load_pretrained(3)


def test_out_of_range_token_ids_are_refused(model):
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 256\), got values from 0 to 256"):
        model(torch.tensor([[0, 256]]))
    with pytest.raises(ValueError, match="token id 300 at position 1"):
        decode([65, 300])


def test_it_loads_in_another_dtype_and_verify_can_be_skipped(model):
    double = load_pretrained(dtype=torch.float64, verify=False)
    assert double.dtype == torch.float64
    tokens = encode_tensor("import os\n")
    torch.testing.assert_close(double(tokens).float(), model(tokens), rtol=1e-4, atol=1e-4)
    plain = load_gpt2(pretrained_dir())                 # the file itself, as stored
    assert plain.dtype == getattr(torch, pretrained_info()["weights_dtype"])


def test_its_model_card_is_written_from_its_metrics(info):
    """The card's figures are the recorded ones (edit metrics.json, never the card by hand)."""
    card = (pretrained_dir() / "MODEL_CARD.md").read_text(encoding="utf-8")
    assert card == model_card(info)
    for number, rerun in enumerate(info.get("reproductions", []), start=2):
        assert f"Measured: run {number}, `{rerun['command']}`" in card
        # "reproduce the shipped checkpoint's validation loss within a few percent"
        assert rerun["bits_per_byte"] == pytest.approx(info["validation"]["bits_per_byte"],
                                                       rel=0.05)
