"""llmcore.lora: the adapter's forward, merge and backward against autograd and float64, the
model wrapping (only A and B train; merging keeps the logits), the counts, the errors, meta."""

from __future__ import annotations

import pytest
import torch

from conftest import TINY
from llmcore import testing
from llmcore.llama import Llama, LlamaConfig
from llmcore.lora import (LoRA, add_lora, adapted_shapes, fine_tune, lora_backward, lora_linear,
                          lora_merge, lora_parameter_count, lora_parameters, merge_lora,
                          optimizer_state_bytes)
from llmcore.model import GPT
from llmcore.parameters import parameter_count
from llmcore.published import PUBLISHED

F64 = dict(dtype=torch.float64)


def adapter(rng, d_in, d_out, rank, device="cpu", **kw):
    return (testing.randn(rng, d_in, d_out, device=device, **kw),
            testing.randn(rng, d_in, rank, device=device, **kw),
            testing.randn(rng, rank, d_out, device=device, **kw))


@pytest.mark.parametrize("lead, d_in, d_out, rank, alpha", [
    ((5,), 7, 4, 2, 4.0), ((2, 3), 6, 9, 1, 1.0), ((1,), 5, 5, 3, 16.0)])
def test_lora_linear_matches_the_merged_weight_and_float64(lead, d_in, d_out, rank, alpha, device,
                                                           rng):
    w, a, b = adapter(rng, d_in, d_out, rank, device, **F64)
    x = testing.randn(rng, *lead, d_in, device=device, **F64)
    bias = testing.randn(rng, d_out, device=device, **F64)
    want = x.cpu().numpy() @ (w + alpha / rank * a @ b).cpu().numpy() + bias.cpu().numpy()
    got = lora_linear(x, w, a, b, alpha=alpha, bias=bias)
    torch.testing.assert_close(got.cpu(), torch.from_numpy(want))
    torch.testing.assert_close(got, x @ lora_merge(w, a, b, alpha=alpha) + bias)


def test_merge_leaves_w_alone_and_zero_b_changes_nothing(rng):
    w, a, b = adapter(rng, 6, 4, 2)
    before = w.clone()
    merged = lora_merge(w, a, b, alpha=3.0)
    assert torch.equal(w, before) and merged.data_ptr() != w.data_ptr()
    assert torch.equal(lora_merge(w, a, torch.zeros_like(b), alpha=3.0), w)


@pytest.mark.parametrize("lead, d_in, d_out, rank, alpha", [
    ((6,), 5, 3, 2, 2.0), ((2, 4), 3, 7, 1, 8.0), ((1,), 4, 4, 4, 1.0)])
def test_lora_backward_equals_autograd(lead, d_in, d_out, rank, alpha, device, rng):
    w, a, b = adapter(rng, d_in, d_out, rank, device, **F64)
    x = testing.randn(rng, *lead, d_in, device=device, **F64)
    g = testing.randn(rng, *lead, d_out, device=device, **F64)
    leaves = [t.clone().requires_grad_() for t in (a, b)]
    want = torch.autograd.grad(lora_linear(x, w, *leaves, alpha=alpha), leaves, g)
    got = lora_backward(x, a, b, g, alpha=alpha)
    for name, mine, theirs in zip(("dA", "dB"), got, want):
        torch.testing.assert_close(mine, theirs, rtol=1e-10, atol=1e-12, msg=name)


def test_first_step_moves_only_b(rng):
    """B = 0 at the start: dA = s x^T G B^T is zero, dB = s (x A)^T G is not."""
    w, a, _ = adapter(rng, 5, 3, 2, **F64)
    x, g = testing.randn(rng, 4, 5, **F64), testing.randn(rng, 4, 3, **F64)
    d_a, d_b = lora_backward(x, a, torch.zeros(2, 3, **F64), g, alpha=2.0)
    assert torch.count_nonzero(d_a) == 0 and torch.count_nonzero(d_b) > 0


def test_add_lora_trains_only_the_adapters_and_starts_as_the_model(device):
    model = GPT(TINY, device=device, seed=3)
    tokens = torch.randint(0, TINY.vocab_size, (2, 9), device=device)
    with torch.no_grad():
        before = model(tokens)
    names = add_lora(model, 4, alpha=8.0)
    assert names == [f"blocks.{i}.{n}" for i in range(TINY.n_layers)
                     for n in ("attention.w_qkv", "attention.w_o", "ffn.w_up", "ffn.w_down")]
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert {id(p) for p in trainable} == {id(p) for p in lora_parameters(model)}
    assert sum(p.numel() for p in trainable) == lora_parameter_count(adapted_shapes(TINY), 4)
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), before)          # B = 0: the same model
    optimizer = torch.optim.AdamW(lora_parameters(model), lr=1e-2)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    model(tokens).square().mean().backward()
    assert all(p.grad is None for n, p in model.named_parameters() if not p.requires_grad)
    optimizer.step()
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)
    with torch.no_grad():
        adapted = model(tokens)
    assert not torch.allclose(adapted, before)
    assert merge_lora(model) == len(names)
    plain = GPT(TINY, device=device)
    plain.load_state_dict(model.state_dict())       # strict: the original names and shapes again
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), adapted, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(plain(tokens), adapted, rtol=1e-5, atol=1e-5)


def test_add_lora_adapts_llama_too():
    config = LlamaConfig(vocab_size=50, max_seq_len=16, d_model=16, n_heads=4, n_kv_heads=2,
                         n_layers=1)
    names = add_lora(Llama(config, seed=0), 2)
    assert names == [f"blocks.0.{n}" for n in ("attention.w_q", "attention.w_k", "attention.w_v",
                                               "attention.w_o", "ffn.w_gate", "ffn.w_up",
                                               "ffn.w_down")]


def test_fine_tune_moves_only_the_adapters_and_its_state_is_theirs():
    model = GPT(TINY, seed=2)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters()}
    add_lora(model, 2)
    tokens = torch.arange(400) % TINY.vocab_size
    losses, optimizer = fine_tune(model, lora_parameters(model), tokens, steps=12, batch_size=4,
                                  seq_len=8, lr=5e-2)
    assert len(losses) == 12 and all(0 < bits < 10 for bits in losses)
    states = [t for s in optimizer.state.values() for t in s.values() if t.dim() > 0]
    assert sum(t.numel() for t in states) == 2 * lora_parameter_count(adapted_shapes(TINY), 2)
    merge_lora(model)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, frozen[n])}
    assert changed and changed <= {f"blocks.{i}.{leaf}" for i in range(TINY.n_layers)
                                   for leaf in ("attention.w_qkv", "attention.w_o", "ffn.w_up",
                                                "ffn.w_down")}
    with pytest.raises(ValueError, match="must require grad"):
        fine_tune(model, [model.token_embedding.detach()], tokens, steps=1, batch_size=1,
                  seq_len=4, lr=1e-3)


def test_optimizer_state_bytes_measures_the_moments():
    params = [torch.nn.Parameter(torch.zeros(3, 5)), torch.nn.Parameter(torch.zeros(7))]
    optimizer = torch.optim.AdamW(params, lr=0.1)
    assert optimizer_state_bytes(optimizer) == 0
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer.step()
    steps = sum(s["step"].untyped_storage().nbytes() for s in optimizer.state.values())
    assert optimizer_state_bytes(optimizer) == 2 * 4 * (15 + 7) + steps


def test_counts_against_the_model_and_published_shapes():
    shapes = adapted_shapes(TINY)
    counts = parameter_count(TINY)
    biases = TINY.n_layers * (3 * TINY.d_model + TINY.d_model + TINY.ffn_width + TINY.d_model)
    assert sum(i * o for i, o in shapes) == counts["attention"] + counts["ffn"] - biases
    assert lora_parameter_count(shapes, 2) == 2 * sum(i + o for i, o in shapes)
    llama = adapted_shapes(PUBLISHED["Llama 2 7B"])
    assert len(llama) == 32 * 7 and sum(i * o for i, o in llama) == 32 * (4 * 4096 ** 2
                                                                        + 3 * 4096 * 11008)


@pytest.mark.parametrize("call, match", [
    (lambda: lora_linear(torch.ones(2, 5), torch.ones(5, 3), torch.ones(4, 2), torch.ones(2, 3),
                         alpha=1.0), r"a: expected shape \(d_in=5, r\)"),
    (lambda: lora_merge(torch.ones(5, 3), torch.ones(5, 2), torch.ones(3, 3), alpha=1.0),
     r"b: expected shape \(r=2, d_out=3\)"),
    (lambda: lora_merge(torch.ones(5, 3), torch.ones(5, 2), torch.ones(2, 3), alpha=0.0),
     "alpha: expected a positive number"),
    (lambda: lora_backward(torch.ones(4, 5), torch.ones(5, 2), torch.ones(2, 3),
                           torch.ones(3, 3), alpha=1.0), "d_out: expected shape"),
    (lambda: LoRA(8, 4, 5), "rank 5 exceeds min"),
    (lambda: LoRA(8, 4, 0), "rank: expected a positive int"),
    (lambda: add_lora(torch.nn.Linear(3, 2), 1), "no 2-D parameter named"),
])
def test_bad_input_is_refused_with_a_clear_message(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_adapting_twice_is_refused():
    model = GPT(TINY)
    add_lora(model, 1)
    with pytest.raises(ValueError, match="merge_lora"):
        add_lora(model, 1)


def test_dtype_and_device_mismatch_are_refused():
    with pytest.raises((TypeError, ValueError), match="dtype|float"):
        lora_merge(torch.ones(5, 3), torch.ones(5, 2, dtype=torch.float64), torch.ones(2, 3),
                   alpha=1.0)


def test_meta_device_shapes():
    meta = torch.device("meta")
    x, w = torch.empty(2, 7, 6, device=meta), torch.empty(6, 5, device=meta)
    a, b = torch.empty(6, 3, device=meta), torch.empty(3, 5, device=meta)
    assert lora_linear(x, w, a, b, alpha=2.0).shape == (2, 7, 5)
    assert lora_merge(w, a, b, alpha=2.0).shape == (6, 5)
    d_a, d_b = lora_backward(x, a, b, torch.empty(2, 7, 5, device=meta), alpha=2.0)
    assert d_a.shape == (6, 3) and d_b.shape == (3, 5) and d_a.device == meta
    model = GPT(TINY, device=meta)
    add_lora(model, 2)
    assert all(p.device == meta for p in lora_parameters(model))
    assert model(torch.zeros(1, 4, dtype=torch.long, device=meta)).shape == (1, 4, TINY.vocab_size)
    merge_lora(model)
    assert model.blocks[0].attention.w_o.device == meta
