"""llmcore.attention_probe: recomputed attention weights must be the ones the model itself uses."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llmcore import reference
from llmcore.attention import attention
from llmcore.model import GPT
from llmcore.multihead import qkv_projection
from llmcore.attention_probe import attention_matrix, attention_weights, head_trace
from llmcore.multihead import merge_heads
from llmcore.testing import randn

from conftest import TINY, TINY_GQA


def sharpened(config, device, seed):
    """A random GPT whose weights are large enough to give peaked, unequal attention rows
    (GPT-2's 0.02 initialisation gives nearly uniform ones, which would hide a wrong mask)."""
    model = GPT(config, device=device, seed=seed).eval()
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3, generator=generator)
    return model


def captured_attention(model, tokens, layer):
    """The input and output of block ``layer``'s attention sublayer during a real forward call."""
    seen = {}

    def hook(module, args, output):
        seen["x"], seen["out"] = args[0].detach(), output.detach()

    handle = model.blocks[layer].attention.register_forward_hook(hook)
    try:
        with torch.no_grad():
            model(tokens)
    finally:
        handle.remove()
    return seen["x"], seen["out"]


@pytest.mark.parametrize("config", [TINY, TINY_GQA], ids=["mha", "gqa"])
@pytest.mark.parametrize("layer", [0, 1])
def test_weights_reproduce_the_models_attention_output(config, layer, device):
    model = sharpened(config, device, seed=3)
    tokens = torch.randint(0, config.vocab_size, (2, 9),
                           generator=torch.Generator().manual_seed(4)).to(device)
    weights = attention_weights(model, tokens, layer)
    assert weights.shape == (2, config.n_heads, 9, 9)
    x, out = captured_attention(model, tokens, layer)
    block = model.blocks[layer].attention
    _, _, v = qkv_projection(x, block.w_qkv, block.b_qkv, n_heads=config.n_heads,
                             n_kv_heads=config.kv_heads)                        # (b, h_kv, n, d_head)
    v = v.repeat_interleave(config.n_heads // config.kv_heads, dim=-3)          # (b, h, n, d_head)
    rebuilt = merge_heads(weights @ v) @ block.w_o + block.b_o                  # (b, n, d)
    torch.testing.assert_close(rebuilt, out)


def test_rows_are_causal_distributions(device):
    model = sharpened(TINY, device, seed=5)
    tokens = torch.arange(11, device=device).reshape(1, 11) * 5 % TINY.vocab_size
    weights = attention_weights(model, tokens, 1)
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, TINY.n_heads, 11, device=device))
    above = torch.triu(torch.ones(11, 11, dtype=torch.bool, device=device), diagonal=1)
    assert (weights[..., above] == 0).all()
    assert (weights[..., ~above] > 0).all()
    assert weights.max() > 0.5, "the sharpened model should give some peaked rows"


@pytest.mark.parametrize("n, m", [(5, 5), (2, 7)])
def test_attention_matrix_times_v_is_attention(n, m, device, rng):
    q = randn(rng, 3, 4, n, 6, device=device, dtype=torch.float64)
    k, v = (randn(rng, 3, 2, m, 6, device=device, dtype=torch.float64) for _ in range(2))
    weights = attention_matrix(q, k, causal=True)                        # (3, 4, n, m)
    want = attention(q, k, v, causal=True)
    torch.testing.assert_close(weights @ v.repeat_interleave(2, dim=-3), want)
    np.testing.assert_allclose((weights @ v.repeat_interleave(2, dim=-3)).cpu().numpy(),
                               reference.attention(q.cpu().numpy(), k.cpu().numpy(),
                                                   v.cpu().numpy(), causal=True), rtol=1e-10)


def test_runs_on_meta_without_touching_the_cpu():
    model = GPT(TINY, device="meta")
    tokens = torch.zeros(2, 7, dtype=torch.long, device="meta")
    weights = attention_weights(model, tokens, 1)
    assert weights.device.type == "meta" and weights.shape == (2, TINY.n_heads, 7, 7)


def test_bad_arguments_are_named(rng):
    model = GPT(TINY, seed=0)
    tokens = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="layer: expected an int in \\[0, 2\\)"):
        attention_weights(model, tokens, 2)
    with pytest.raises(ValueError, match="layer"):
        attention_weights(model, tokens, -1)
    with pytest.raises(TypeError, match="model: expected an llmcore.model.GPT"):
        attention_weights(torch.nn.Linear(2, 2), tokens, 0)
    with pytest.raises(TypeError, match="tokens"):
        attention_weights(model, tokens.float(), 0)
    with pytest.raises(ValueError, match="h_kv to divide h"):
        attention_matrix(randn(rng, 1, 4, 3, 2), randn(rng, 1, 3, 3, 2))
    with pytest.raises(ValueError, match="k: expected shape"):
        attention_matrix(randn(rng, 2, 3, 4), randn(rng, 2, 3, 5))


def test_head_trace_keeps_every_step_of_one_head():
    torch.manual_seed(0)
    x, w_q, w_k, w_v = (torch.randn(*s, dtype=torch.float64) for s in ((5, 6), (6, 3), (6, 3),
                                                                      (6, 3)))
    t = head_trace(x, w_q, w_k, w_v)
    assert t.scores.shape == t.weights.shape == (5, 5) and t.out.shape == (5, 3)
    assert torch.isinf(t.scores.triu(1)[t.scores.triu(1) != 0]).all()    # the future: -inf
    torch.testing.assert_close(t.out, attention(x @ w_q, x @ w_k, x @ w_v, causal=True))
    open_ = head_trace(x, w_q, w_k, w_v, causal=False)
    torch.testing.assert_close(open_.out, attention(x @ w_q, x @ w_k, x @ w_v))
    with pytest.raises(ValueError, match="w_k"):
        head_trace(x, w_q, w_k[:4], w_v)
