"""What tensors really hold in memory: their distinct storages, counted once each.

Several tensors can share one storage (a view, a transpose, a slice of a cache buffer), so adding
up ``numel() * element_size()`` over tensors counts some bytes twice and misses the slots a view
does not show. :func:`storage_bytes` asks each tensor for its storage instead: its address and its
size in bytes, and counts every distinct storage once. It measures what was allocated, whatever
formula predicted it. Chapters 8 and 9.
"""

from __future__ import annotations

from typing import Iterable

from torch import Tensor


def storage_bytes(tensors: Iterable[Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (each storage
    counted once).

    tensors: any tensors on one or several devices (not ``meta``: a meta
    tensor holds no memory, so it is refused rather than counted as 0).
    -> bytes, an int.
    """
    seen: dict[tuple[str, int], int] = {}
    for index, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise TypeError(f"storage_bytes: item {index} is a "
                            f"{type(t).__name__}, expected a torch.Tensor")
        if t.device.type == "meta":
            raise ValueError(f"storage_bytes: item {index} is on the meta "
                             "device, which holds no memory to measure")
        storage = t.untyped_storage()
        seen[(str(t.device), storage.data_ptr())] = storage.nbytes()
    return sum(seen.values())
