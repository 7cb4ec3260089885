"""Which keys each query may see: the causal mask, and the additive mask M with its -inf.

Chapter 3 (and 7 for a cache, where there are more keys than queries).
"""

from __future__ import annotations

import torch
from torch import Tensor

NEG_INF = float("-inf")
"""The score a masked key gets: exp(-inf) = 0 exactly, so it receives no weight. A row whose keys
are all masked (a padding query) comes out of :func:`llmcore.softmax.softmax` as all zeros."""


def mask_bias(allowed: Tensor,
              dtype: torch.dtype = torch.float32) -> Tensor:
    """The additive mask M of softmax(scores + M): 0 where ``allowed``, -inf
    elsewhere.

    allowed: bool, any shape -> a float tensor of that shape, on its
    device. Adding M is one pass over the scores (masked_fill with a
    broadcast bool mask is several times slower on the CPU), and
    exp(-inf) = 0 gives the blocked keys exactly zero weight. Chapter 3.
    """
    bias = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return bias.masked_fill_(~allowed, NEG_INF)


def causal_mask(n: int, m: int,
                device: torch.device | str | None = None) -> Tensor:
    """Which keys each query may see: True where query i may attend to
    key j.

    (n, m) bool, bottom-right aligned: query i is token m - n + i of the
    sequence, so it sees keys j <= i + (m - n). With m == n this is the
    lower triangle; with a cache (m > n) the newest queries see every cached
    key. Chapter 3 (and 7 for m > n).

    >>> causal_mask(2, 4).int().tolist()
    [[1, 1, 1, 0], [1, 1, 1, 1]]
    """
    if n > m:
        raise ValueError(f"causal_mask: n = {n} queries but only m = {m} "
                         "keys; expected m >= n (each query is one of the "
                         "last n keys)")
    # the lower triangle, its diagonal shifted right by m - n:
    # keeps j - i <= m - n
    ones = torch.ones(n, m, dtype=torch.bool, device=device)        # (n, m)
    return ones.tril_(m - n)


def sliding_window_mask(n: int, m: int, window: int,
                        device: torch.device | str | None = None) -> Tensor:
    """The causal mask cut to a band: query i sees key j when
    0 <= (i + m - n) - j < window, itself and the window - 1 keys before it.

    (n, m) bool, bottom-right aligned as :func:`causal_mask` (Mistral's
    sliding-window attention). Chapter 11.

    >>> sliding_window_mask(3, 5, 2).int().tolist()
    [[0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]]
    """
    if window < 1:
        raise ValueError(f"sliding_window_mask: window must be at least 1, "
                         f"got {window}")
    causal = causal_mask(n, m, device)                 # j <= i + (m - n)
    # j <= i + (m - n) - window: older than the window
    too_old = causal.tril(m - n - window)
    return causal & ~too_old
