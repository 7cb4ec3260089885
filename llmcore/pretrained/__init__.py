"""The small trained model that ships with the course, loaded offline in one call.

The package carries the checkpoint as package data, one folder per model::

    llmcore/pretrained/tiny-stdlib/
        config.json, model.safetensors   GPT-2 layout (what llmcore.load_gpt2 reads)
        metrics.json                     the numbers its training run measured
        MODEL_CARD.md, DATA_CARD.md      what it is, what it was trained on, its license
        loss_curve.png, validation_slice.txt

``load_pretrained()`` finds the folder with ``importlib.resources`` (so it works after
``pip install``, from any working directory), checks the weights file against the SHA-256
recorded at training time, and returns an :class:`llmcore.model.GPT` in float32 and eval mode.
Nothing here touches the network. ``python -m course.ship --ship`` makes the folder.
Chapter 5.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

import torch

from ..checkpoint import CONFIG_FILE, WEIGHTS_FILE, load_gpt2, read_json_object, sha256_file
from ..model import GPT
from ..tokenizer import ByteTokenizer

DEFAULT_MODEL = "tiny-stdlib"
"""The model :func:`load_pretrained` loads when given no name."""

METRICS_FILE = "metrics.json"


def available() -> list[str]:
    """The names of the models shipped in this installation, sorted."""
    root = resources.files(__name__)
    return sorted(entry.name for entry in root.iterdir()
                  if entry.is_dir() and entry.joinpath(CONFIG_FILE).is_file())


def pretrained_dir(name: str | os.PathLike = DEFAULT_MODEL) -> Path:
    """The folder of a shipped model (by name), or a folder given as a path (e.g. what
    ``python -m course.ship`` wrote under runs/), checked to hold a checkpoint."""
    if isinstance(name, os.PathLike) or (isinstance(name, str) and os.sep in name):
        folder = Path(name)
    elif isinstance(name, str):
        entry = resources.files(__name__).joinpath(name)
        if not entry.is_dir():
            raise ValueError(f"name: no shipped model called {name!r}; available: "
                             f"{', '.join(available()) or 'none'}")
        if not isinstance(entry, Path):     # e.g. a zipped install: not a folder on disk
            raise RuntimeError(f"the package data of {name!r} is not on the file system "
                               f"({entry!r}); install llmcore unzipped")
        folder = entry
    else:
        raise TypeError(f"name: expected a model name or a folder path, got "
                        f"{type(name).__name__}")
    if not folder.is_dir():
        raise FileNotFoundError(f"model folder {folder} does not exist")
    for file in (CONFIG_FILE, WEIGHTS_FILE):
        if not (folder / file).is_file():
            raise FileNotFoundError(f"model folder {folder} has no {file}")
    return folder


def pretrained_info(name: str | os.PathLike = DEFAULT_MODEL) -> dict:
    """The numbers recorded by the model's training run (its ``metrics.json``): sizes,
    settings, timings, validation loss and baselines in bits per byte, the fixed slice's loss,
    and generations. Empty dict if the folder has no metrics.json. Chapter 5."""
    file = pretrained_dir(name) / METRICS_FILE
    if not file.is_file():
        return {}
    return read_json_object(file)


def load_tokenizer(name: str | os.PathLike = DEFAULT_MODEL) -> ByteTokenizer:
    """The tokenizer the model was trained with (every shipped model uses bytes)."""
    tokenizer = pretrained_info(name).get("tokenizer", "bytes")
    if tokenizer != "bytes":
        raise ValueError(f"model {name!r} records tokenizer {tokenizer!r}; llmcore only has "
                         f"the byte tokenizer")
    return ByteTokenizer()


def load_pretrained(name: str | os.PathLike = DEFAULT_MODEL, *,
                    device=None, dtype: torch.dtype | None = None,
                    verify: bool = True) -> GPT:
    """Load a shipped model (or a model folder given as a path) as an
    :class:`llmcore.GPT`.

    device: where the weights go (default: CPU). dtype: default float32,
    whatever the file stores. verify: compare the weights file with the
    SHA-256 that metrics.json recorded, so a corrupted or replaced file
    raises instead of giving a silently different model. Returns the model
    in eval mode: ``model(tokens)`` maps (b, n) byte ids to (b, n, 256)
    logits. Chapter 5.

    >>> model = load_pretrained()
    """
    folder = pretrained_dir(name)
    if verify:
        want = pretrained_info(folder).get("weights_sha256")
        if want is not None:
            got = sha256_file(folder / WEIGHTS_FILE)
            if got != want:
                raise ValueError(
                    f"{folder / WEIGHTS_FILE}: SHA-256 {got[:16]}... "
                    f"differs from {want[:16]}... recorded in "
                    f"{METRICS_FILE}; the file is corrupted or was "
                    "replaced (reinstall llmcore, or pass verify=False "
                    "to load it anyway)")
    dtype = torch.float32 if dtype is None else dtype
    return load_gpt2(folder, device=device, dtype=dtype)
