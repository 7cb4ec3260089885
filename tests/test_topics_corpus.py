"""course.topics_corpus: chapter 14's shipped fine-tuning text and where it comes from."""

from __future__ import annotations

import sys

import pytest

from course.topics_corpus import HELDOUT_FRACTION, MAX_BYTES, extract_topics, load_topics
from llmcore.corpus import source_files

SHIPPED_WITH = (3, 11)
"""The Python version whose pydoc_data the shipped files were extracted from."""


def test_the_shipped_splits_are_text_within_the_cap():
    splits = load_topics()
    sizes = {name: len(data) for name, data in splits.items()}
    assert sum(sizes.values()) <= MAX_BYTES
    assert sizes["heldout"] <= HELDOUT_FRACTION * MAX_BYTES < sizes["train"]
    for data in splits.values():
        data.decode("utf-8")
        assert data.endswith(b"\n\n")


@pytest.mark.skipif(sys.version_info[:2] != SHIPPED_WITH,
                    reason=f"the files were extracted from Python {SHIPPED_WITH}'s pydoc_data")
def test_the_shipped_splits_equal_a_fresh_extraction():
    assert extract_topics() == load_topics()


def test_the_shipped_model_never_saw_it():
    """The shipped model's corpus leaves pydoc_data out: no training file comes from there."""
    files = source_files()
    assert files and not [p for p in files if p.startswith("pydoc_data/")]
