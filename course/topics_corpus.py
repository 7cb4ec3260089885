"""The fine-tuning corpus of chapter 14: English prose the shipped model never saw.

CPython's ``pydoc_data/topics.py`` holds the text of the Python Language Reference's topics
(statements, operators, data model) that ``help("assert")`` prints: prose with some code. The
shipped model's corpus (llmcore.corpus) leaves ``pydoc_data`` out, so none of it was trained on.
:func:`extract_topics` takes a capped subset of it and splits it by topic (a topic's hash decides,
as llmcore.corpus splits files); the result is shipped in ``course/data/python_topics/`` (see its
DATA_CARD.md: PSF License Version 2, as all of CPython), and :func:`load_topics` reads it back,
so the chapter needs nothing but the repository. Chapter 14.
"""

from __future__ import annotations

from pathlib import Path

from llmcore.corpus import is_validation, path_hash

DATA_DIR = Path(__file__).resolve().parent / "data" / "python_topics"
FILES = {"train": "train.txt", "heldout": "heldout.txt"}

MAX_BYTES = 200_000
"""The cap on the text kept, shared between the splits in proportion."""

HELDOUT_FRACTION = 0.2
"""About this share of the topics (by hash of the topic's name) is held out."""


def extract_topics(max_bytes: int = MAX_BYTES,
                   fraction: float = HELDOUT_FRACTION) -> dict[str, bytes]:
    """{"train": ..., "heldout": ...} from this interpreter's pydoc_data.topics. A topic is
    held out when its hash is below fraction; each split visits its topics in hash order and
    keeps them while it stays within its share of max_bytes (fraction of it for the held-out
    part), then joins them in sorted topic order, each ending with a blank line."""
    from pydoc_data.topics import topics

    budget = {"heldout": fraction * max_bytes, "train": (1 - fraction) * max_bytes}
    kept: dict[str, dict[str, bytes]] = {"train": {}, "heldout": {}}
    for name in sorted(topics, key=lambda t: (path_hash(t), t)):
        split = "heldout" if is_validation(name, fraction) else "train"
        text = topics[name].rstrip("\n").encode("utf-8") + b"\n\n"
        if sum(map(len, kept[split].values())) + len(text) <= budget[split]:
            kept[split][name] = text
    return {split: b"".join(texts[t] for t in sorted(texts)) for split, texts in kept.items()}


def write_topics(folder: Path = DATA_DIR) -> None:
    """Write :func:`extract_topics` into folder (``python -m course.topics_corpus``)."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, data in extract_topics().items():
        (folder / FILES[split]).write_bytes(data)


def load_topics(folder: Path = DATA_DIR) -> dict[str, bytes]:
    """The shipped splits: {"train": bytes, "heldout": bytes}. Chapter 14."""
    missing = [f for f in FILES.values() if not (folder / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{folder} lacks {', '.join(missing)}: run "
                                f"`python -m course.topics_corpus` to write them")
    return {split: (folder / file).read_bytes() for split, file in FILES.items()}


if __name__ == "__main__":
    write_topics()
