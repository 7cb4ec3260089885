"""A byte-level tokenizer: every UTF-8 byte is one token, so the vocabulary is v = 256.

Encoding a string is writing it as UTF-8 and reading off the bytes: ``"é"`` is two tokens,
``[195, 169]``. No training, no merges, no unknown token: any text encodes, and any sequence of
ids in [0, 256) decodes. A model can still emit bytes that are not valid UTF-8 (half of a
two-byte character, say); decoding replaces those with U+FFFD instead of failing. The course
uses bytes so that tokenisation stays out of the way of the algebra. Chapter 1.
"""

from __future__ import annotations

import operator
from typing import Sequence

import torch
from torch import Tensor

VOCAB_SIZE = 256
"""v: one token per possible byte value."""

REPLACEMENT_CHARACTER = "\ufffd"
"""What :func:`decode` writes for bytes that do not form valid UTF-8."""


def encode(text: str) -> list[int]:
    """Text -> token ids: the bytes of its UTF-8 encoding.

    text: a str of any length -> list of len(text.encode()) ints in
    [0, 256). Chapter 1.

    >>> encode("hé")
    [104, 195, 169]
    """
    if not isinstance(text, str):
        hint = (" (decode bytes first, or pass list(data) to decode)"
                if isinstance(text, (bytes, bytearray)) else "")
        raise TypeError(f"text: expected a str, got {type(text).__name__}"
                        + hint)
    return list(text.encode("utf-8"))


def encode_tensor(text: str, *, device: torch.device | str | None = None) -> Tensor:
    """Text -> a batch of one sequence of token ids, ready for ``model(tokens)``.

    text -> (1, n) long tensor on ``device`` (default: the CPU), n = len(encode(text)). Chapter 1.
    """
    return torch.tensor([encode(text)], dtype=torch.long, device=device)   # (1, n)


def _ids_to_list(ids: object, name: str) -> list[int]:
    """A 1-D sequence or tensor of integer ids -> a list of ints, range-checked."""
    if isinstance(ids, Tensor):
        if ids.dtype.is_floating_point or ids.is_complex() or ids.dtype == torch.bool:
            raise TypeError(f"{name}: expected integer token ids, got a {ids.dtype} tensor")
        if ids.dim() != 1:
            raise ValueError(f"{name}: expected a 1-D tensor of token ids (n,), got shape "
                             f"{tuple(ids.shape)}")
        if ids.device.type == "meta":
            raise ValueError(f"{name}: a tensor on the meta device holds no ids to decode")
        values = ids.tolist()
    elif isinstance(ids, (str, bytes, bytearray)):
        raise TypeError(f"{name}: expected a sequence of int token ids, got "
                        f"{type(ids).__name__} (use encode() for text)")
    else:
        try:
            values = list(ids)                       # type: ignore[call-overload]
        except TypeError:
            raise TypeError(f"{name}: expected a list or tensor of token ids, got "
                            f"{type(ids).__name__}") from None
    for position, value in enumerate(values):
        try:
            if isinstance(value, bool):
                raise TypeError
            value = values[position] = operator.index(value)    # int, numpy integer, ...
        except TypeError:
            raise TypeError(f"{name}: expected int token ids, got {type(value).__name__} "
                            f"{value!r} at position {position}") from None
        if not 0 <= value < VOCAB_SIZE:
            raise ValueError(f"{name}: token id {value} at position {position} is outside the "
                             f"byte vocabulary [0, {VOCAB_SIZE})")
    return values


def decode(ids: Sequence[int] | Tensor) -> str | list[str]:
    """Token ids -> text. Never fails on valid ids: bytes that are not UTF-8 become U+FFFD.

    ids: a list of ints or a 1-D tensor (n,) -> str; a 2-D tensor (b, n) -> list of b strs.
    Raises ValueError naming the first id outside [0, 256) and its position. Chapter 1.

    >>> decode([104, 195, 169])
    'hé'
    >>> decode([104, 195])        # half of 'é'
    'h\\ufffd'
    """
    if isinstance(ids, Tensor) and ids.dim() == 2:
        return [decode_one(row, name=f"ids[{i}]") for i, row in enumerate(ids)]
    return decode_one(ids)


def decode_one(ids: Sequence[int] | Tensor, *, name: str = "ids") -> str:
    """:func:`decode` for exactly one sequence: ids (n,) -> str. Chapter 1."""
    return bytes(_ids_to_list(ids, name)).decode("utf-8", errors="replace")


class ByteTokenizer:
    """The byte tokenizer as an object, for code that expects ``tokenizer.encode/decode``.

    It has no state: ``ByteTokenizer().encode`` is :func:`encode`. vocab_size = 256. Chapter 1.
    """

    vocab_size = VOCAB_SIZE

    def encode(self, text: str) -> list[int]:
        return encode(text)

    def encode_tensor(self, text: str, *, device: torch.device | str | None = None) -> Tensor:
        return encode_tensor(text, device=device)

    def decode(self, ids: Sequence[int] | Tensor) -> str | list[str]:
        return decode(ids)

    def __repr__(self) -> str:
        return f"ByteTokenizer(vocab_size={VOCAB_SIZE})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ByteTokenizer)

    def __hash__(self) -> int:
        return hash(ByteTokenizer)
