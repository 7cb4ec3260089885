"""Chapter 5's name map is right: its llmcore column names every parameter of a GPT, its Hugging Face
column every parameter of a real GPT2LMHeadModel (random weights, built here, nothing downloaded),
row by row the pairs load_gpt2 uses, and a checkpoint saved by transformers loads under them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from llmcore import GPT, GPTConfig, load_gpt2
from llmcore.checkpoint import gpt2_names

transformers = pytest.importorskip("transformers", reason="transformers (the dev extra) is needed")

CHAPTER = Path(__file__).resolve().parent.parent / "chapters" / "05_complete_model.md"
LAYERS = 2


def name_map_rows() -> list[list[str]]:
    """The table between the name-map markers of chapter 5: one list of cells per row."""
    text = CHAPTER.read_text(encoding="utf-8")
    found = re.search(r"<!-- name-map: begin -->\n(.*?)<!-- name-map: end -->", text, re.S)
    assert found, f"{CHAPTER.name} has no name-map table"
    lines = [line for line in found.group(1).splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines[2:]]


def parameter_names(cell: str) -> list[str]:
    """The dotted names in backticks of one cell, with {i} expanded over the layers."""
    names = [n for n in re.findall(r"`([^`]+)`", cell) if re.fullmatch(r"[\w.{}]+", n)]
    return [n.replace("{i}", str(layer)) for n in names
            for layer in (range(LAYERS) if "{i}" in n else [None])]


def column_names(column: int) -> list[str]:
    return [name for row in name_map_rows() for name in parameter_names(row[column])
            if "." in name or name in ("token_embedding", "position_embedding")]


@pytest.fixture(scope="module")
def hf_model():
    config = transformers.GPT2Config(vocab_size=53, n_positions=32, n_embd=24, n_layer=LAYERS,
                                      n_head=3)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval()


def test_the_llmcore_column_names_every_parameter():
    model = GPT(GPTConfig(vocab_size=53, max_seq_len=32, d_model=24, n_heads=3,
                          n_layers=LAYERS), device="meta")
    ours = column_names(1)
    assert len(ours) == len(set(ours))
    assert set(ours) == set(model.state_dict())


def test_the_hugging_face_and_nanogpt_columns_name_every_parameter(hf_model):
    theirs = set(column_names(4)) - {"lm_head.weight"}
    weights = {name for name, _ in hf_model.named_parameters()}
    assert theirs == weights                       # lm_head is tied: not a parameter of its own
    assert "lm_head.weight" in hf_model.state_dict()
    assert column_names(3) == column_names(4)      # nanoGPT's module paths are Hugging Face's


def test_each_row_pairs_names_as_load_gpt2_does():
    mapping = gpt2_names(GPTConfig(vocab_size=53, max_seq_len=32, d_model=24, n_heads=3,
                                   n_layers=LAYERS))
    pairs = {}
    for row in name_map_rows():
        ours, theirs = parameter_names(row[1]), parameter_names(row[4])
        if ours and len(ours) == len(theirs):
            pairs.update(zip(ours, (t.removeprefix("transformer.") for t in theirs)))
    assert pairs == mapping


def test_a_transformers_checkpoint_loads_under_these_names(hf_model, tmp_path):
    hf_model.save_pretrained(tmp_path)
    model = load_gpt2(tmp_path)
    ids = torch.tensor([[1, 5, 9, 2, 44]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf_model(ids).logits, rtol=1e-5, atol=1e-5)
    state = dict(hf_model.named_parameters())
    for ours, theirs in gpt2_names(model.config).items():
        torch.testing.assert_close(model.state_dict()[ours], state[f"transformer.{theirs}"])
