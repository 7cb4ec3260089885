"""llmcore.storage: views are counted once, distinct buffers each, and the bytes are the storage's
own (a slice counts its whole buffer); bad input is named."""

from __future__ import annotations

import pytest
import torch

from llmcore.storage import storage_bytes


def test_views_share_one_storage_and_count_once(device):
    x = torch.zeros(4, 6, device=device)
    assert storage_bytes([x]) == 4 * 6 * 4
    assert storage_bytes([x, x.t(), x[1:3], x.view(24)]) == 96     # one buffer, four views
    assert storage_bytes([x[:1]]) == 96                             # a slice holds the buffer
    y = torch.zeros(3, device=device, dtype=torch.float64)
    assert storage_bytes([x, y]) == 96 + 24
    assert storage_bytes([x, x.clone()]) == 2 * 96                  # a copy is a second buffer
    assert storage_bytes([]) == 0


def test_bad_input_is_named():
    with pytest.raises(TypeError, match="item 1 is a list, expected a torch.Tensor"):
        storage_bytes([torch.zeros(2), [1, 2]])
    with pytest.raises(ValueError, match="item 0 is on the meta device"):
        storage_bytes([torch.zeros(2, device="meta")])
