"""The training text: the Python standard library's own source files, split by file.

Every Python installation carries its standard library as ``.py`` source, so this corpus needs
no download. :func:`stdlib_dir` finds it through ``sysconfig`` (the ``stdlib`` path, e.g.
``/usr/lib/python3.11``); :func:`source_files` lists the ``.py`` files under it, leaving out
test suites, installed third-party packages, generated tables, machine-specific files and the
few files that carry a license notice other than the PSF License;
:func:`load_corpus` reads them and splits them into training and validation *by file*, so no
validation file is ever seen, even in part, during training.

Everything is deterministic and independent of the order in which the file system lists a
directory: paths are sorted, and a file's split is decided by a hash of its relative path.
The standard library is under the PSF License Version 2 (see the data card of the shipped model,
``llmcore/pretrained/*/DATA_CARD.md``).

The module also measures the two simplest models of the text, unigram and bigram byte
frequencies, as baselines for a trained model's loss in bits per byte. Chapter 5.
"""

from __future__ import annotations

import hashlib
import math
import os
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .tokenizer import VOCAB_SIZE

EXCLUDED_DIRS = frozenset({
    "site-packages", "dist-packages",   # third-party packages installed into this Python
    "__pycache__", "lib-dynload",       # compiled files
    "test", "tests", "idle_test",       # test suites: large, repetitive, full of odd data
    "encodings",                        # codec modules, mostly generated character tables
    "pydoc_data",                       # pydoc's generated help text
})
"""Directories (at any depth below the root) whose files are left out."""

EXCLUDED_PREFIXES = ("_sysconfigdata", "config-")
"""File or directory names starting with these are left out: they describe how this particular
interpreter was built, so they differ from machine to machine."""

OTHER_LICENSE_MARKERS = ("permission to use, copy, modify", "permission is hereby granted",
                         "permission notice shall be", "provided 'as-is'", "licensed under the",
                         "spdx-license-identifier")
"""Phrases that, in the first :data:`LICENSE_HEADER_BYTES` bytes of a file (lower-cased, comment
marks and runs of white space reduced to one space), mark a notice of its
own (MIT, Apache, zlib, HPND-style: e.g. logging, tarfile, xml.etree, sqlite3). Those files are
left out, so that every file of the corpus is under the PSF License alone."""

LICENSE_HEADER_BYTES = 8192

VALIDATION_FRACTION = 0.05
"""About this share of the files (chosen by a hash of their path) is held out for validation."""

MAX_BYTES = 16 * 2 ** 20
"""A cap on the text read (16 MiB; CPython 3.11's selected files are about 10 MB), so that an
unusually large standard library cannot blow up memory or the time spent reading it."""


def stdlib_dir() -> Path:
    """The directory of this interpreter's standard library source, as ``sysconfig`` reports it."""
    return Path(sysconfig.get_paths()["stdlib"])


def _excluded(parts: tuple[str, ...]) -> bool:
    return any(part in EXCLUDED_DIRS or part.startswith(EXCLUDED_PREFIXES) for part in parts)


def source_files(root: str | Path | None = None) -> list[str]:
    """The ``.py`` files of the corpus: paths relative to ``root`` (default :func:`stdlib_dir`),
    with ``/`` separators, sorted, minus the exclusions above (tests, site-packages, ...)."""
    root = stdlib_dir() if root is None else Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"corpus root {root} is not a directory")
    found = []
    for directory, subdirs, files in os.walk(root):
        rel = Path(directory).relative_to(root).parts
        subdirs[:] = [s for s in subdirs if not _excluded((s,))]     # do not descend into them
        found += ["/".join((*rel, name)) for name in files
                  if name.endswith(".py") and not _excluded((name,))]
    return sorted(found)


def path_hash(path: str) -> float:
    """A number in [0, 1) fixed by the relative path alone (SHA-256), used to split and to cap."""
    return int(hashlib.sha256(path.encode("utf-8")).hexdigest()[:15], 16) / 16 ** 15


def is_validation(path: str, fraction: float = VALIDATION_FRACTION) -> bool:
    """Whether the file at this relative path belongs to the validation split."""
    return path_hash(path) < fraction


@dataclass(frozen=True)
class CorpusSplit:
    """One side of the split: the files (relative paths, sorted) and their bytes, concatenated in
    that order, each file ending with a newline."""

    name: str
    files: tuple[str, ...]
    data: bytes = field(repr=False)

    @property
    def n_bytes(self) -> int:
        return len(self.data)

    def tokens(self) -> Tensor:
        """The split as a 1-D uint8 tensor of byte tokens (CPU; a copy of ``data``)."""
        return torch.frombuffer(bytearray(self.data), dtype=torch.uint8)


@dataclass(frozen=True)
class Corpus:
    """The corpus read from ``root``: a training and a validation split, plus what was left out
    (``skipped``: files with a license notice of their own, not valid UTF-8, or over the byte
    cap, each with the reason)."""

    root: Path
    train: CorpusSplit
    validation: CorpusSplit
    skipped: tuple[tuple[str, str], ...]
    validation_fraction: float
    max_bytes: int

    def summary(self) -> dict:
        """Counts and sizes, for logs, metrics.json and the data card."""
        return {
            "root": str(self.root), "python": sys.version.split()[0],
            "validation_fraction": self.validation_fraction, "max_bytes": self.max_bytes,
            "train_files": len(self.train.files), "train_bytes": self.train.n_bytes,
            "validation_files": len(self.validation.files),
            "validation_bytes": self.validation.n_bytes,
            "skipped_files": len(self.skipped),
            "train_sha256": hashlib.sha256(self.train.data).hexdigest(),
            "validation_sha256": hashlib.sha256(self.validation.data).hexdigest(),
        }


def _read_text_bytes(file: Path) -> tuple[bytes | None, str]:
    """The file's bytes, ending in a newline; or None and the reason it is left out."""
    data = file.read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not valid UTF-8"
    header = data[:LICENSE_HEADER_BYTES].decode("utf-8", errors="ignore").lower()
    header = " ".join(header.replace("#", " ").split())
    for marker in OTHER_LICENSE_MARKERS:
        if marker in header:
            return None, f"carries its own license notice ({marker!r})"
    return (data if data.endswith(b"\n") else data + b"\n"), ""


def load_corpus(root: str | Path | None = None, *,
                validation_fraction: float = VALIDATION_FRACTION,
                max_bytes: int = MAX_BYTES) -> Corpus:
    """Read the corpus under ``root`` (default: this interpreter's standard library).

    Files are visited in the order of :func:`path_hash` and kept while the running total stays
    within ``max_bytes``, so a cap keeps an unbiased, deterministic subset; each split is then
    concatenated in sorted path order. Returns a :class:`Corpus`. Chapter 5.
    """
    if not 0 < validation_fraction < 1:
        raise ValueError(f"validation_fraction: expected a number in (0, 1), got "
                         f"{validation_fraction}")
    if max_bytes <= 0:
        raise ValueError(f"max_bytes: expected a positive byte count, got {max_bytes}")
    root = stdlib_dir() if root is None else Path(root)
    paths = source_files(root)
    if not paths:
        raise ValueError(f"corpus root {root} has no .py files outside the excluded directories")
    contents: dict[str, bytes] = {}
    skipped: list[tuple[str, str]] = []
    total = 0
    for path in sorted(paths, key=lambda p: (path_hash(p), p)):
        data, reason = _read_text_bytes(root / path)
        if data is None:
            skipped.append((path, reason))
        elif total + len(data) > max_bytes:
            skipped.append((path, f"over the {max_bytes}-byte cap"))
        else:
            contents[path] = data
            total += len(data)
    kept = sorted(contents)
    validation = tuple(p for p in kept if is_validation(p, validation_fraction))
    train = tuple(p for p in kept if not is_validation(p, validation_fraction))
    if not validation or not train:
        raise ValueError(f"corpus root {root}: {len(kept)} file(s) give an empty "
                         f"{'validation' if not validation else 'training'} split; use a larger "
                         f"corpus or another validation_fraction")

    def split(name: str, files: tuple[str, ...]) -> CorpusSplit:
        return CorpusSplit(name, files, b"".join(contents[p] for p in files))

    return Corpus(root, split("train", train), split("validation", validation),
                  tuple(sorted(skipped)), validation_fraction, max_bytes)


def _as_byte_array(name: str, data: bytes | Tensor | np.ndarray) -> np.ndarray:
    if isinstance(data, (bytes, bytearray)):
        return np.frombuffer(bytes(data), dtype=np.uint8).astype(np.int64)
    if isinstance(data, Tensor):
        data = data.detach().cpu().numpy()
    if not isinstance(data, np.ndarray) or data.ndim != 1:
        raise TypeError(f"{name}: expected bytes or a 1-D array of byte values, got "
                        f"{type(data).__name__}{getattr(data, 'shape', '')}")
    if data.size and (data.min() < 0 or data.max() >= VOCAB_SIZE):
        raise ValueError(f"{name}: byte values must lie in [0, {VOCAB_SIZE}), got "
                         f"{data.min()} to {data.max()}")
    return data.astype(np.int64)


def ngram_bits_per_byte(train: bytes | Tensor | np.ndarray, validation: bytes | Tensor | np.ndarray,
                        order: int, *, alpha: float = 1.0) -> float:
    """Cross-entropy, in bits per byte, of a byte n-gram model counted on ``train`` and scored on
    ``validation``.

    order 1 (unigram): p(x) from byte counts; order 2 (bigram): p(x | previous byte). Counts get
    ``alpha`` added to every cell (Laplace smoothing), so unseen bytes keep a small probability.
    The bigram scores the first validation byte with the unigram. The numbers a trained model
    must beat. Chapter 5.
    """
    if order not in (1, 2):
        raise ValueError(f"order: expected 1 (unigram) or 2 (bigram), got {order}")
    if alpha <= 0:
        raise ValueError(f"alpha: expected a positive smoothing count, got {alpha}")
    train_ids, val_ids = _as_byte_array("train", train), _as_byte_array("validation", validation)
    if len(train_ids) < 2 or len(val_ids) < 2:
        raise ValueError(f"train and validation: expected at least 2 bytes each, got "
                         f"{len(train_ids)} and {len(val_ids)}")
    v = VOCAB_SIZE
    unigram = np.bincount(train_ids, minlength=v) + alpha                     # (v,)
    log_unigram = np.log2(unigram / unigram.sum())
    if order == 1:
        return float(-log_unigram[val_ids].mean())
    pairs = np.bincount(train_ids[:-1] * v + train_ids[1:], minlength=v * v)
    bigram = pairs.reshape(v, v) + alpha                                      # (v, v): prev, next
    log_bigram = np.log2(bigram / bigram.sum(axis=1, keepdims=True))
    total = -log_unigram[val_ids[0]] - log_bigram[val_ids[:-1], val_ids[1:]].sum()
    return float(total / len(val_ids))


def bits_per_byte(loss_nats: float) -> float:
    """A mean cross-entropy per byte token in nats (what ``F.cross_entropy`` returns) -> bits."""
    return loss_nats / math.log(2)
