"""llmcore.model: the GPT equals the NumPy float64 reference forward pass, respects causality and
batch independence, ties its unembedding to the embedding, and refuses bad configs and tokens with
clear messages."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from conftest import TINY, TINY_GQA
from llmcore import reference, testing
from llmcore.model import GPT, GPTConfig, INIT_STD


def randomize(model: GPT, seed: int = 0, std: float = 0.3) -> GPT:
    """Every parameter random and O(1) (biases and norm shifts too, which GPT-2's init zeroes), so a
    wrong bias, scale or axis anywhere changes the logits visibly. Norm scales stay near 1. A
    Llama works too."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=p.dtype) * std
            scale = name.endswith(("scale", "norm.weight", "norm_f.weight"))   # GPT's, Llama's
            p.copy_((1.0 + noise if scale else noise).to(p.device))
    return model


def token_ids(config: GPTConfig, b: int, n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, config.vocab_size, (b, n), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------- config

def test_config_defaults_and_derived_sizes():
    config = GPTConfig(vocab_size=61, max_seq_len=48, d_model=24, n_heads=3, n_layers=2)
    assert (config.d_head, config.kv_heads, config.ffn_width) == (8, 3, 96)
    config = GPTConfig(d_model=24, n_heads=4, n_kv_heads=2, d_ff=40)
    assert (config.d_head, config.kv_heads, config.ffn_width) == (6, 2, 40)
    assert config.to_dict()["n_kv_heads"] == 2


@pytest.mark.parametrize("fields, message", [
    (dict(d_model=30, n_heads=4), "n_heads = 4 must be positive and divide d_model = 30"),
    (dict(d_model=32, n_heads=4, n_kv_heads=3), "n_kv_heads = 3 must be positive and divide n_heads = 4"),
    (dict(n_layers=0), "GPTConfig.n_layers must be positive, got 0"),
    (dict(vocab_size=-1), "GPTConfig.vocab_size must be positive, got -1"),
    (dict(max_seq_len=0), "GPTConfig.max_seq_len must be positive, got 0"),
    (dict(d_ff=0), "GPTConfig.d_ff must be positive, got 0"),
])
def test_config_refuses_impossible_sizes(fields, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(**fields)


# ------------------------------------------------------------------------------------ the forward

@pytest.mark.parametrize("config, b, n", [
    (TINY, 2, 7),                  # v = 61, n = 7, d = 24: every size distinct
    (TINY, 1, TINY.max_seq_len),   # the full context
    (TINY_GQA, 3, 5),              # grouped-query attention
    (dataclasses.replace(TINY, d_ff=40, n_layers=3), 2, 6),     # f != 4 d, L = 3
])
def test_model_equals_the_numpy_reference(config, b, n):
    model = randomize(GPT(config, dtype=torch.float64))
    tokens = token_ids(config, b, n)
    logits = model(tokens)
    assert logits.shape == (b, n, config.vocab_size) and logits.dtype == torch.float64
    want = reference.gpt_forward(model.state_dict(), tokens.numpy(), n_heads=config.n_heads,
                                 n_kv_heads=config.n_kv_heads, eps=config.ln_eps)
    testing.assert_close(logits, want, rtol=1e-9, atol=1e-9)


def test_float32_model_is_close_to_the_float64_reference():
    model = randomize(GPT(TINY))
    tokens = token_ids(TINY, 2, 9)
    want = reference.gpt_forward(model.state_dict(), tokens.numpy(), n_heads=TINY.n_heads)
    torch.testing.assert_close(model(tokens), torch.from_numpy(want).float(), rtol=1e-4, atol=1e-4)


def test_later_tokens_never_change_earlier_logits():
    model = randomize(GPT(TINY, dtype=torch.float64))
    tokens = token_ids(TINY, 1, 8)
    changed = tokens.clone()
    changed[0, 5] = (changed[0, 5] + 1) % TINY.vocab_size
    before, after = model(tokens), model(changed)
    same = torch.isclose(before, after, rtol=0, atol=1e-12).all(dim=-1)[0]
    assert same.tolist() == [True] * 5 + [False] * 3


def test_sequences_of_a_batch_do_not_see_each_other():
    model = randomize(GPT(TINY, dtype=torch.float64))
    tokens = token_ids(TINY, 3, 6)
    batch = model(tokens)
    for i in range(3):
        testing.assert_close(model(tokens[i:i + 1]), batch[i:i + 1], rtol=1e-12, atol=1e-12)


def test_fused_backend_and_last_only_give_the_same_logits():
    model = randomize(GPT(TINY_GQA))
    tokens = token_ids(TINY_GQA, 2, 9)
    full = model(tokens)
    torch.testing.assert_close(model(tokens, backend="fused"), full)
    last = model(tokens, last_only=True)
    assert last.shape == (2, 1, TINY_GQA.vocab_size)
    torch.testing.assert_close(last, full[:, -1:])


def test_any_integer_dtype_of_token_ids_works():
    model = randomize(GPT(TINY))
    tokens = token_ids(TINY, 2, 5)
    torch.testing.assert_close(model(tokens.int()), model(tokens), rtol=0, atol=0)


def test_the_unembedding_is_the_embedding_transposed():
    """Tied weights: the logit of token t is the final hidden state dotted with t's embedding."""
    model = randomize(GPT(TINY, dtype=torch.float64))
    names = dict(model.named_parameters())
    assert not any("head" in name or "unembed" in name for name in names)   # no separate matrix
    captured = []
    hook = model.ln_f.register_forward_hook(lambda module, args, out: captured.append(out))
    tokens = token_ids(TINY, 1, 4)
    with torch.no_grad():
        logits = model(tokens)
    hook.remove()
    hidden = captured[0]                                                     # (1, 4, d)
    embedding = model.token_embedding.detach()
    testing.assert_close(logits, hidden @ embedding.T, rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        model.token_embedding[7] *= 2.0               # token 7's embedding row is its unembedding
        doubled = model(tokens[:, :1] * 0 + 3)        # a prompt without token 7: only the output
    with torch.no_grad():                             # column of token 7 can change
        model.token_embedding[7] /= 2.0
        base = model(tokens[:, :1] * 0 + 3)
    changed = (doubled != base).any(dim=(0, 1))
    assert changed.nonzero().flatten().tolist() == [7]
    testing.assert_close(doubled[..., 7], 2 * base[..., 7], rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------- parameters, init

def test_parameter_shapes_follow_the_config():
    model = GPT(TINY_GQA, device="meta")
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    d, v, f = 24, 61, 96
    width = (4 + 2 * 2) * 6                               # (h + 2 h_kv) d_head
    assert shapes["token_embedding"] == (v, d) and shapes["position_embedding"] == (48, d)
    assert shapes["blocks.1.attention.w_qkv"] == (d, width)
    assert shapes["blocks.1.attention.b_qkv"] == (width,)
    assert shapes["blocks.0.attention.w_o"] == (d, d)
    assert shapes["blocks.0.ffn.w_up"] == (d, f) and shapes["blocks.0.ffn.w_down"] == (f, d)
    assert len(shapes) == 2 + 2 * 12 + 2


def test_gpt2_small_has_124m_parameters():
    """GPT-2 small's published count (embedding tied), computed on meta: no memory is allocated."""
    config = GPTConfig(vocab_size=50257, max_seq_len=1024, d_model=768, n_heads=12, n_layers=12)
    assert GPT(config, device="meta").num_parameters() == 124_439_808


def test_initialisation_is_seeded_and_gpt2_like():
    a, b, c = GPT(TINY, seed=3), GPT(TINY, seed=3), GPT(TINY, seed=4)
    for (name, p), q, r in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(p, q), name
        if name.endswith(("scale",)):
            assert (p == 1).all(), name
        elif name.rsplit(".", 1)[-1].startswith("b_") or name.endswith("shift"):
            assert (p == 0).all(), name
        else:
            assert not torch.equal(p, r), name
    big = GPT(GPTConfig(vocab_size=512, max_seq_len=64, d_model=64, n_heads=4, n_layers=2), seed=0)
    assert abs(big.token_embedding.std().item() - INIT_STD) < 0.002
    residual = big.blocks[0].ffn.w_down.std().item()
    assert abs(residual - INIT_STD / 2) < 0.002                    # INIT_STD / sqrt(2 L), L = 2


# ------------------------------------------------------------------------------------ bad inputs

@pytest.mark.parametrize("tokens, error, message", [
    (torch.zeros(1, 49, dtype=torch.long), ValueError, r"sequence too long: 0 cached \+ 49 new tokens > max_seq_len = 48"),
    (torch.full((2, 4), 61), ValueError, r"tokens: ids must lie in \[0, 61\), got values from 61 to 61"),
    (torch.tensor([[3, -1, 5]]), ValueError, r"tokens: ids must lie in \[0, 61\), got values from -1 to 5"),
    (torch.zeros(1, 4), TypeError, "tokens: expected integer token ids, got torch.float32"),
    (torch.zeros(1, 4, dtype=torch.bool), TypeError, "tokens: expected integer token ids, got torch.bool"),
    (torch.zeros(4, dtype=torch.long), ValueError, r"tokens: expected shape \(b, n\), got \(4,\)"),
    (torch.zeros(2, 0, dtype=torch.long), ValueError, "tokens: expected at least one token per sequence"),
    (torch.zeros(1, 4, dtype=torch.long, device="meta"), ValueError, "tokens are on meta but the model's parameters are on cpu"),
    ([[1, 2, 3]], TypeError, "tokens: expected a torch.Tensor, got list"),
])
def test_model_refuses_bad_tokens(tokens, error, message):
    with pytest.raises(error, match=message):
        GPT(TINY)(tokens)


def test_model_refuses_an_unknown_backend():
    with pytest.raises(ValueError, match="backend: expected one of"):
        GPT(TINY)(torch.zeros(1, 3, dtype=torch.long), backend="flash")


# ---------------------------------------------------------------------------------- CPU vs CUDA

def test_cpu_and_device_give_the_same_logits(device):
    model = randomize(GPT(TINY_GQA))
    tokens = token_ids(TINY_GQA, 2, 10)
    want = model(tokens)
    moved = model.to(device)
    assert moved.device.type == device.type
    for backend in ("explicit", "fused"):
        got = moved(tokens.to(device), backend=backend)
        assert got.device.type == device.type
        torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)


def test_the_tiny_fixture_models_run_on_their_device(tiny_model, tiny_gqa_model, device):
    for model in (tiny_model, tiny_gqa_model):
        tokens = token_ids(model.config, 2, 5).to(device)
        logits = model(tokens)
        assert logits.device.type == device.type and logits.shape == (2, 5, 61)
        assert torch.isfinite(logits).all()
        np.testing.assert_allclose(
            logits.detach().cpu().double().numpy(),
            reference.gpt_forward(model.state_dict(), tokens.cpu().numpy(),
                                  n_heads=model.config.n_heads,
                                  n_kv_heads=model.config.n_kv_heads), rtol=1e-4, atol=1e-5)
