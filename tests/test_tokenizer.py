"""llmcore.tokenizer: bytes in, bytes out. Round trips for any text, decoding that never fails on
valid ids (invalid UTF-8 becomes U+FFFD, exactly as Python's own decoder does), lists and 1-D/2-D
tensors accepted, and a clear error naming any id outside [0, 256)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmcore.tokenizer import (REPLACEMENT_CHARACTER, VOCAB_SIZE, ByteTokenizer, decode,
                               decode_one, encode, encode_tensor)


@pytest.mark.parametrize("text, ids", [
    ("", []),
    ("def f(x):\n", [100, 101, 102, 32, 102, 40, 120, 41, 58, 10]),
    ("é", [0xC3, 0xA9]),                     # one character, two bytes
    ("€", [0xE2, 0x82, 0xAC]),               # three bytes
    ("🐍", [0xF0, 0x9F, 0x90, 0x8D]),         # four bytes
    ("\x00\x7f", [0, 127]),
])
def test_encode_is_the_utf8_bytes(text, ids):
    assert encode(text) == ids
    assert decode(ids) == text


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_decode_inverts_encode(text):
    ids = encode(text)
    assert all(0 <= i < VOCAB_SIZE for i in ids)
    assert decode(ids) == text
    assert decode(torch.tensor(ids, dtype=torch.long)) == text


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, VOCAB_SIZE - 1), max_size=40))
def test_decode_never_fails_on_valid_ids(ids):
    assert decode(ids) == bytes(ids).decode("utf-8", errors="replace")


def test_invalid_utf8_becomes_the_replacement_character():
    assert decode([104, 0xC3]) == "h" + REPLACEMENT_CHARACTER     # half of 'é'
    assert decode([0xFF, 65]) == REPLACEMENT_CHARACTER + "A"       # 0xFF never occurs in UTF-8


def test_tensors_of_every_integer_dtype_and_2d_batches():
    ids = encode("hi")
    for dtype in (torch.uint8, torch.int32, torch.long):
        assert decode(torch.tensor(ids, dtype=dtype)) == "hi"
    batch = torch.tensor([encode("ab"), encode("cd"), encode("é")])   # (b=3, n=2)
    assert decode(batch) == ["ab", "cd", "é"]
    assert decode(np.array(ids)) == "hi"                             # numpy integers
    assert decode((104, 105)) == "hi"


def test_encode_tensor_is_a_batch_of_one():
    tokens = encode_tensor("abc")
    assert tokens.shape == (1, 3) and tokens.dtype == torch.long
    assert tokens.tolist() == [[97, 98, 99]]


def test_encode_tensor_follows_the_device_asked_for(device):
    assert encode_tensor("x", device=device).device.type == device.type


@pytest.mark.parametrize("ids, position, value", [
    ([65, 256, 66], 1, 256),
    ([-1], 0, -1),
    (torch.tensor([1, 2, 1000]), 2, 1000),
])
def test_out_of_range_ids_are_named(ids, position, value):
    with pytest.raises(ValueError, match=rf"token id {value} at position {position} is outside "
                                         r"the byte vocabulary \[0, 256\)"):
        decode(ids)


def test_out_of_range_id_in_a_batch_names_the_row():
    with pytest.raises(ValueError, match=r"ids\[1\]: token id 300 at position 0"):
        decode(torch.tensor([[65, 66], [300, 1]]))


@pytest.mark.parametrize("bad, error, message", [
    ([1.5], TypeError, "expected int token ids, got float 1.5 at position 0"),
    ([True], TypeError, "got bool"),
    (torch.tensor([1.0, 2.0]), TypeError, "got a torch.float32 tensor"),
    (torch.zeros(2, 2, 2, dtype=torch.long), ValueError, r"expected a 1-D tensor"),
    ("abc", TypeError, "use encode"),
    (7, TypeError, "expected a list or tensor of token ids, got int"),
])
def test_bad_ids_get_a_clear_error(bad, error, message):
    with pytest.raises(error, match=message):
        decode(bad)


def test_decode_one_refuses_a_batch():
    with pytest.raises(ValueError, match=r"1-D tensor of token ids \(n,\), got shape \(2, 3\)"):
        decode_one(torch.zeros(2, 3, dtype=torch.long))


@pytest.mark.parametrize("bad", [b"bytes", 42, None])
def test_encode_wants_text(bad):
    with pytest.raises(TypeError, match="text: expected a str"):
        encode(bad)


def test_tokenizer_object_is_the_same_functions():
    tokenizer = ByteTokenizer()
    assert tokenizer.vocab_size == VOCAB_SIZE == 256
    assert tokenizer.encode("é") == encode("é")
    assert tokenizer.decode([0xC3, 0xA9]) == "é"
    assert tokenizer.encode_tensor("ab").tolist() == [[97, 98]]
    assert tokenizer == ByteTokenizer() and "256" in repr(tokenizer)
