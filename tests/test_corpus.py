"""llmcore.corpus: which files are read (exclusions, license headers, UTF-8), a by-file split that
depends on paths alone (not on the order the file system lists them), a deterministic cap, and
the unigram/bigram baselines against a loop-by-loop count."""

from __future__ import annotations

import math
import os
import sysconfig
from collections import Counter
from pathlib import Path

import pytest
import torch

from llmcore import corpus
from llmcore.corpus import (load_corpus, ngram_bits_per_byte, path_hash, source_files,
                            stdlib_dir)

KEPT = ["a.py", "b.py", "pkg/__init__.py", "pkg/mod.py", "pkg/sub/deep.py", "zeta.py"]
LEFT_OUT = ["test/test_a.py", "pkg/tests/test_b.py", "idlelib/idle_test/t.py",
            "site-packages/third.py", "encodings/cp1252.py", "pydoc_data/topics.py",
            "__pycache__/a.cpython-311.py", "_sysconfigdata__linux.py", "config-3.11/x.py"]


@pytest.fixture
def fake_stdlib(tmp_path) -> Path:
    """A small tree shaped like a standard library, with every kind of file that is left out."""
    for i, rel in enumerate(KEPT + LEFT_OUT):
        file = tmp_path / rel
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(f"# {rel}\nx = {i}\n" * (i + 1), encoding="utf-8")
    (tmp_path / "notes.txt").write_text("not python\n")
    (tmp_path / "latin.py").write_bytes(b"s = '\xe9'\n")                       # not UTF-8
    (tmp_path / "mit.py").write_text("# Copyright X\n#\n# Permission  is hereby\n#  granted, "
                                     "free of charge\nx = 1\n")               # own license
    (tmp_path / "noeol.py").write_text("y = 2")                               # no final newline
    return tmp_path


def test_source_files_are_sorted_and_exclude_tests_and_generated_files(fake_stdlib):
    assert source_files(fake_stdlib) == sorted(KEPT + ["latin.py", "mit.py", "noeol.py"])


def test_load_corpus_leaves_out_other_licenses_and_non_utf8(fake_stdlib):
    c = load_corpus(fake_stdlib, validation_fraction=0.5)
    assert dict(c.skipped) == {"latin.py": "not valid UTF-8", "mit.py":
                               "carries its own license notice ('permission is hereby granted')"}
    files = c.train.files + c.validation.files
    assert sorted(files) == sorted(KEPT + ["noeol.py"])
    assert not set(c.train.files) & set(c.validation.files)
    for split in (c.train, c.validation):
        assert list(split.files) == sorted(split.files)
        want = b"".join((fake_stdlib / p).read_bytes().rstrip(b"\n") + b"\n" for p in split.files)
        assert split.data == want                     # unmodified, each ending in a newline
        assert split.tokens().tolist() == list(want)


def test_split_is_by_path_hash(fake_stdlib):
    c = load_corpus(fake_stdlib, validation_fraction=0.5)
    assert all(path_hash(p) < 0.5 for p in c.validation.files)
    assert all(path_hash(p) >= 0.5 for p in c.train.files)


def test_split_does_not_depend_on_listing_order(fake_stdlib, monkeypatch):
    before = load_corpus(fake_stdlib, validation_fraction=0.5)
    real_walk = os.walk

    def reversed_walk(top, *args, **kwargs):        # the file system lists in another order
        for directory, subdirs, files in real_walk(top, *args, **kwargs):
            subdirs.reverse()
            yield directory, subdirs, files[::-1]

    monkeypatch.setattr(corpus.os, "walk", reversed_walk)
    after = load_corpus(fake_stdlib, validation_fraction=0.5)
    assert after.summary() == before.summary()
    assert after.train.data == before.train.data and after.validation.data == before.validation.data


def test_cap_keeps_files_in_hash_order_until_full(fake_stdlib):
    full = load_corpus(fake_stdlib, validation_fraction=0.5)
    files = full.train.files + full.validation.files
    sizes = {p: len((fake_stdlib / p).read_bytes().rstrip(b"\n")) + 1 for p in files}
    total = sum(sizes.values())
    checked = 0
    for cap in range(total // 4, total, max(1, total // 16)):
        kept, used = [], 0
        for p in sorted(files, key=lambda p: (path_hash(p), p)):   # the documented rule
            if used + sizes[p] <= cap:
                kept.append(p)
                used += sizes[p]
        train = [p for p in kept if path_hash(p) >= 0.5]
        if not train or len(train) == len(kept):
            with pytest.raises(ValueError, match="give an empty"):
                load_corpus(fake_stdlib, validation_fraction=0.5, max_bytes=cap)
            continue
        capped = load_corpus(fake_stdlib, validation_fraction=0.5, max_bytes=cap)
        assert sorted(capped.train.files + capped.validation.files) == sorted(kept)
        assert capped.train.n_bytes + capped.validation.n_bytes == used <= cap
        assert any("cap" in reason for _, reason in capped.skipped)
        checked += 1
    assert checked >= 2


def test_path_hash_is_a_fraction_fixed_by_the_path():
    values = [path_hash(f"m{i}.py") for i in range(200)]
    assert all(0 <= v < 1 for v in values) and len(set(values)) == 200
    assert path_hash("json/decoder.py") == path_hash("json/decoder.py")
    assert 0.3 < sum(v < 0.5 for v in values) / 200 < 0.7                # roughly uniform


@pytest.mark.parametrize("kwargs, message", [
    ({"validation_fraction": 0.0}, "validation_fraction: expected a number in \\(0, 1\\)"),
    ({"validation_fraction": 1.5}, "validation_fraction"),
    ({"max_bytes": 0}, "max_bytes: expected a positive byte count"),
])
def test_bad_arguments(fake_stdlib, kwargs, message):
    with pytest.raises(ValueError, match=message):
        load_corpus(fake_stdlib, **kwargs)


def test_missing_or_empty_root(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        load_corpus(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="has no .py files"):
        load_corpus(tmp_path)


def test_stdlib_dir_is_sysconfigs():
    assert stdlib_dir() == Path(sysconfig.get_paths()["stdlib"])
    assert (stdlib_dir() / "os.py").is_file()


def ngram_loop(train: bytes, validation: bytes, order: int, alpha: float = 1.0) -> float:
    """The baselines by plain counting, one byte at a time (the oracle)."""
    unigram = Counter(train)
    total = len(train) + 256 * alpha
    p1 = {x: (unigram[x] + alpha) / total for x in range(256)}
    if order == 1:
        return -sum(math.log2(p1[x]) for x in validation) / len(validation)
    pairs = Counter(zip(train, train[1:]))
    after = Counter(train[:-1])
    bits = -math.log2(p1[validation[0]])
    for prev, x in zip(validation, validation[1:]):
        bits -= math.log2((pairs[prev, x] + alpha) / (after[prev] + 256 * alpha))
    return bits / len(validation)


@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("alpha", [1.0, 0.1])
def test_ngram_baselines_match_counting(order, alpha):
    train = b"def f(x):\n    return x + 1\n" * 3 + "é\xff".encode()
    validation = b"def g(y):\n    return y\n\x00"
    want = ngram_loop(train, validation, order, alpha)
    assert ngram_bits_per_byte(train, validation, order, alpha=alpha) == pytest.approx(want)
    as_tensor = torch.frombuffer(bytearray(train), dtype=torch.uint8)
    assert ngram_bits_per_byte(as_tensor, validation, order, alpha=alpha) == pytest.approx(want)


def test_bigram_learns_a_periodic_text():
    text = b"ab" * 500                    # (almost no smoothing: alpha = 1e-4)
    assert ngram_bits_per_byte(text, text, 1, alpha=1e-4) == pytest.approx(1.0, abs=0.01)
    assert ngram_bits_per_byte(text, text, 2, alpha=1e-4) < 0.02     # each byte predicts the next


@pytest.mark.parametrize("kwargs, error, message", [
    ({"order": 3}, ValueError, "order: expected 1 \\(unigram\\) or 2 \\(bigram\\)"),
    ({"order": 1, "alpha": 0}, ValueError, "alpha: expected a positive"),
])
def test_ngram_bad_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        ngram_bits_per_byte(b"abc", b"abc", **kwargs)


def test_ngram_bad_data():
    with pytest.raises(ValueError, match="byte values must lie in \\[0, 256\\)"):
        ngram_bits_per_byte(torch.tensor([1, 300]), b"ab", 1)
    with pytest.raises(TypeError, match="validation: expected bytes or a 1-D array"):
        ngram_bits_per_byte(b"abc", torch.zeros(2, 2, dtype=torch.long), 1)


def test_the_real_standard_library():
    """The corpus the shipped model was trained on: both splits substantial, by file, and the
    baselines where a byte model of Python source puts them."""
    c = load_corpus()
    s = c.summary()
    assert s["train_files"] > 100 and s["validation_files"] >= 5
    assert 0.01 < s["validation_bytes"] / (s["train_bytes"] + s["validation_bytes"]) < 0.15
    assert not set(c.train.files) & set(c.validation.files)
    assert not any(part in corpus.EXCLUDED_DIRS for p in c.train.files for part in p.split("/"))
    unigram = ngram_bits_per_byte(c.train.data, c.validation.data, 1)
    bigram = ngram_bits_per_byte(c.train.data, c.validation.data, 2)
    assert 4.0 < unigram < 5.2 and 3.0 < bigram < 4.0 and bigram < unigram - 0.5
