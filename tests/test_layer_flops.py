"""llmcore.timing.layer_flops: the per-layer FLOP count by part equals what torch's FlopCounterMode
counts on a real one-layer model (plus its logits), for n below and above d, with GQA-free
and custom FFN widths; causality halves the attention term only in the count of visible pairs."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from llmcore import GPT, GPTConfig
from llmcore.timing import attention_flops, layer_flops, matmul_flops


@pytest.mark.parametrize("n, d, h, d_ff", [(5, 16, 2, None), (40, 16, 4, None), (9, 24, 3, 40)])
def test_layer_flops_match_the_flop_counter(n, d, h, d_ff):
    config = GPTConfig(vocab_size=32, max_seq_len=64, d_model=d, n_heads=h, n_layers=1, d_ff=d_ff)
    model = GPT(config, seed=0).eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.randint(0, 32, (2, n)))
    parts = layer_flops(n, d, d_ff=d_ff, n_heads=h, batch=2)
    assert counter.get_total_flops() == sum(parts.values()) + matmul_flops(n, d, 32, batch=2)
    f = 4 * d if d_ff is None else d_ff
    assert parts == {"projections": 2 * 8 * n * d * d, "ffn": 2 * 4 * n * d * f,
                     "attention": 2 * 4 * n * n * d}


def test_causal_counts_only_visible_pairs_and_bad_heads_are_named():
    n, d = 12, 8
    assert layer_flops(n, d, causal=True)["attention"] == attention_flops(n, n, d, causal=True)
    assert layer_flops(n, d, causal=True)["attention"] == 4 * (n * (n + 1) // 2) * d
    with pytest.raises(ValueError, match="n_heads = 3 must divide d = 8"):
        layer_flops(n, d, n_heads=3)
