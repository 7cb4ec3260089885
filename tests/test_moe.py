"""llmcore.moe: the ladder (NumPy reference == loop == grouped == dense, and with a capacity
loop == padded batch), the routing and dispatch properties, the load-balancing loss and the
sparse MoE blocks of transformers (Mixtral, Qwen3-MoE) on random weights of their released
configurations' expert counts, the meta device, CUDA where present, and clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llmcore import reference
from llmcore.moe import (PUBLISHED_MOE, expert_capacity, from_hf_moe, group_by_expert,
                         load_balancing_loss, moe, moe_capacity, moe_costs, moe_dense, moe_loop,
                         moe_parameters, route)
from llmcore import testing


def randn(rng, *shape: int, device=None, dtype=torch.float64) -> torch.Tensor:
    """Float64 unless told: the ladder's rungs agree to the last digits."""
    return testing.randn(rng, *shape, device=device, dtype=dtype)


def weights(rng, d: int, f: int, n_experts: int, device=None, dtype=torch.float64):
    """w_router (d, E), w_gate, w_up (E, d, f), w_down (E, f, d)."""
    return (randn(rng, d, n_experts, device=device, dtype=dtype),
            randn(rng, n_experts, d, f, device=device, dtype=dtype),
            randn(rng, n_experts, d, f, device=device, dtype=dtype),
            randn(rng, n_experts, f, d, device=device, dtype=dtype))


def numpy_of(tensors):
    return [t.cpu().numpy() for t in tensors]


CASES = [((13,), 6, 5, 4, 2), ((2, 7), 8, 3, 8, 2), ((9,), 4, 7, 5, 1), ((3, 4), 5, 6, 6, 6)]
"""(leading shape of x, d, f, E, k): every size different; k = 1 (Switch) and k = E."""


@pytest.mark.parametrize("lead, d, f, n_experts, top_k", CASES)
@pytest.mark.parametrize("normalize", [True, False])
def test_loop_grouped_dense_and_reference_agree(lead, d, f, n_experts, top_k, normalize,
                                                device, rng):
    x = randn(rng, *lead, d, device=device)
    w = weights(rng, d, f, n_experts, device)
    want = reference.moe(x.cpu().numpy(), *numpy_of(w), top_k=top_k, normalize=normalize)
    for form in (moe_loop, moe, moe_dense):
        got = form(x, *w, top_k=top_k, normalize=normalize)
        assert got.shape == x.shape
        np.testing.assert_allclose(got.cpu().numpy(), want, rtol=1e-10, atol=1e-10,
                                   err_msg=form.__name__)


@pytest.mark.parametrize("lead, d, f, n_experts, top_k", CASES)
@pytest.mark.parametrize("capacity", [0, 1, 2, 5, 100])
def test_capacity_forms_agree_and_drop_the_same_pairs(lead, d, f, n_experts, top_k, capacity,
                                                      device, rng):
    x = randn(rng, *lead, d, device=device)
    w = weights(rng, d, f, n_experts, device)
    want = reference.moe(x.cpu().numpy(), *numpy_of(w), top_k=top_k, capacity=capacity)
    for got in (moe_loop(x, *w, top_k=top_k, capacity=capacity),
                moe_capacity(x, *w, top_k=top_k, capacity=capacity)):
        np.testing.assert_allclose(got.cpu().numpy(), want, rtol=1e-10, atol=1e-10)


def test_a_capacity_nobody_reaches_drops_nothing(rng):
    x = randn(rng, 20, 6)
    w = weights(rng, 6, 4, 5)
    torch.testing.assert_close(moe_capacity(x, *w, top_k=2, capacity=40), moe(x, *w, top_k=2))
    assert not moe_capacity(x, *w, top_k=2, capacity=0).any()          # everything dropped


def test_routing_weights_sum_to_one_and_pick_the_most_probable(rng):
    x, w_router = randn(rng, 30, 8), randn(rng, 8, 6)
    routing = route(x, w_router, 3)
    torch.testing.assert_close(routing.weights.sum(-1), torch.ones(30, dtype=torch.float64))
    chosen = routing.probs.gather(1, routing.experts)                  # (T, k)
    unchosen = routing.probs.scatter(1, routing.experts, -1.0).max(-1).values
    assert (chosen.min(-1).values >= unchosen).all()
    assert (chosen[:, :-1] >= chosen[:, 1:]).all()                     # most probable first
    raw = route(x, w_router, 3, normalize=False)
    torch.testing.assert_close(raw.weights, chosen)


def test_dispatch_groups_by_expert_in_token_order():
    experts = torch.tensor([[2, 0], [0, 1], [2, 1], [0, 2]])
    plan = group_by_expert(experts, 4)
    assert plan.counts.tolist() == [3, 2, 3, 0]
    assert plan.tokens.tolist() == [0, 1, 3, 1, 2, 0, 2, 3]
    assert plan.slots.tolist() == [1, 0, 0, 1, 1, 0, 0, 1]
    assert not plan.dropped.any()
    capped = group_by_expert(experts, 4, capacity=2)                   # token 3's expert 0 and 2
    assert capped.counts.tolist() == [2, 2, 2, 0]
    assert capped.dropped.tolist() == [[False, False], [False, False], [False, False],
                                       [True, True]]
    assert capped.tokens.tolist() == [0, 1, 1, 2, 0, 2]


def test_expert_capacity_is_the_average_load_times_the_factor():
    assert expert_capacity(64, 8, 2) == 16
    assert expert_capacity(64, 8, 2, 1.25) == 20
    assert expert_capacity(10, 4, 1) == 3                              # rounded up
    with pytest.raises(ValueError, match="factor"):
        expert_capacity(10, 4, 1, 0.0)


def test_load_balancing_loss_matches_the_reference_and_its_bounds(rng):
    x, w_router = randn(rng, 50, 8), randn(rng, 8, 6)
    routing = route(x, w_router, 2)
    want = reference.load_balancing_loss((x @ w_router).numpy(), 2)
    assert load_balancing_loss(routing).item() == pytest.approx(want, rel=1e-12)
    balanced = route(torch.eye(6, dtype=torch.float64) * 50, torch.eye(6, dtype=torch.float64), 1)
    assert load_balancing_loss(balanced).item() == pytest.approx(1.0, rel=1e-6)   # k = 1: 1
    collapsed = route(torch.ones(6, 6, dtype=torch.float64),
                      torch.eye(6, dtype=torch.float64) * torch.tensor([50.0] + [0.0] * 5,
                                                                       dtype=torch.float64), 1)
    assert load_balancing_loss(collapsed).item() == pytest.approx(6.0, rel=1e-6)  # all on one


def test_load_balancing_loss_equals_transformers(rng):
    mixtral = pytest.importorskip("transformers.models.mixtral.modeling_mixtral",
                                  reason="transformers is not installed")
    logits = randn(rng, 40, 8, dtype=torch.float32)
    want = mixtral.load_balancing_loss_func((logits,), 8, 2)
    routing = route(logits, torch.eye(8), 2)                            # x w_router = logits
    torch.testing.assert_close(load_balancing_loss(routing), want)


def test_the_loss_has_a_gradient_through_the_probabilities(rng):
    x = randn(rng, 20, 5)
    w_router = randn(rng, 5, 4).requires_grad_()
    load_balancing_loss(route(x, w_router, 2)).backward()
    assert w_router.grad is not None and w_router.grad.abs().sum() > 0


def hf_block(family: str, d: int, f: int):
    """A random transformers sparse MoE block with the released model's expert count and k."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    m = PUBLISHED_MOE[{"mixtral": "Mixtral 8x7B", "qwen3_moe": "Qwen3-30B-A3B"}[family]]
    if family == "mixtral":
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
        config = transformers.MixtralConfig(hidden_size=d, intermediate_size=f,
                                            num_local_experts=m.n_experts,
                                            num_experts_per_tok=m.top_k)
        block = MixtralSparseMoeBlock(config)
    else:
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
        config = transformers.Qwen3MoeConfig(hidden_size=d, moe_intermediate_size=f,
                                             num_experts=m.n_experts,
                                             num_experts_per_tok=m.top_k, norm_topk_prob=True)
        block = Qwen3MoeSparseMoeBlock(config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in block.parameters():                   # (out, in): unit-scale outputs
            p.copy_(torch.randn(p.shape, generator=generator) / p.shape[-1] ** 0.5)
    return block.eval()


@pytest.mark.parametrize("family, d, f", [("mixtral", 64, 224), ("qwen3_moe", 32, 12)])
def test_block_equals_transformers_sparse_moe_block(family, d, f):
    block = hf_block(family, d, f)
    x = torch.randn(2, 9, d, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = block(x)
    w = from_hf_moe(block)
    assert w[0].shape == (d, block.gate.weight.shape[0]) and w[1].shape[1:] == (d, f)
    for form in (moe, moe_loop, moe_dense):
        torch.testing.assert_close(form(x, *w, top_k=block.gate.top_k), want, rtol=1e-5,
                                   atol=1e-5)


def test_costs_per_token_of_the_three_forms():
    experts = torch.tensor([[0, 1], [0, 1], [1, 0], [0, 1]])            # 2 of 4 experts used
    d, f, n_experts = 8, 16, 4
    loop, grouped, dense = (moe_costs(experts, d, f, n_experts, form)
                            for form in ("loop", "grouped", "dense"))
    assert loop.flops == grouped.flops == 2 * d * n_experts + 2 * 2 * 3 * d * f
    assert dense.flops == 2 * d * n_experts + 2 * 4 * 3 * d * f
    assert loop.weight_bytes == 4 * (d * n_experts + 2 * 3 * d * f)
    assert grouped.weight_bytes == 4 * (d * n_experts + 2 * 3 * d * f) / 4
    assert dense.weight_bytes == 4 * (d * n_experts + 4 * 3 * d * f) / 4
    with pytest.raises(ValueError, match="form"):
        moe_costs(experts, d, f, n_experts, "sparse")


@pytest.mark.parametrize("name", sorted(PUBLISHED_MOE))
def test_published_counts_match_what_the_makers_state(name):
    m = PUBLISHED_MOE[name]
    counts = moe_parameters(m)
    assert counts["total"] == pytest.approx(m.published_total, rel=0.01)
    assert counts["active"] == pytest.approx(m.published_active, rel=0.02)
    assert counts["total"] - counts["active"] == ((m.n_layers - m.dense_layers)
                                                  * (m.n_experts - m.top_k) * counts["per expert"])


def test_mixtral_count_equals_transformers_on_the_meta_device():
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    m = PUBLISHED_MOE["Mixtral 8x7B"]
    config = transformers.MixtralConfig(vocab_size=m.vocab_size, hidden_size=m.d_model,
                                        intermediate_size=m.d_ff_expert,
                                        num_hidden_layers=m.n_layers,
                                        num_attention_heads=m.n_heads,
                                        num_key_value_heads=m.n_kv_heads,
                                        num_local_experts=m.n_experts,
                                        num_experts_per_tok=m.top_k)
    with torch.device("meta"):
        model = transformers.MixtralForCausalLM(config)
    assert sum(p.numel() for p in model.parameters()) == moe_parameters(m)["total"]


META = torch.device("meta")


def test_fixed_shape_forms_run_on_meta():
    x = torch.empty(2, 5, 8, device=META)
    w = (torch.empty(8, 4, device=META), torch.empty(4, 8, 6, device=META),
         torch.empty(4, 8, 6, device=META), torch.empty(4, 6, 8, device=META))
    routing = route(x, w[0], 2)
    assert routing.weights.device == META and routing.weights.shape == (10, 2)
    assert routing.probs.shape == (10, 4)
    assert load_balancing_loss(routing).shape == ()
    for out in (moe_dense(x, *w, top_k=2), moe_capacity(x, *w, top_k=2, capacity=3)):
        assert out.device == META and out.shape == (2, 5, 8)
    with pytest.raises(ValueError, match="meta"):
        moe(x, *w, top_k=2)


def test_float32_forms_agree(device, rng):
    x = randn(rng, 33, 16, device=device, dtype=torch.float32)
    w = weights(rng, 16, 24, 8, device, torch.float32)
    want = moe_loop(x, *w, top_k=2)
    for got in (moe(x, *w, top_k=2), moe_dense(x, *w, top_k=2),
                moe_capacity(x, *w, top_k=2, capacity=33)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_bad_input_is_refused_by_name(rng):
    x = randn(rng, 5, 6)
    w = weights(rng, 6, 4, 3)
    with pytest.raises(ValueError, match="top_k"):
        moe(x, *w, top_k=4)                                             # more than E
    with pytest.raises(ValueError, match="top_k"):
        moe_loop(x, *w, top_k=0)
    with pytest.raises(ValueError, match="top_k"):
        route(x, w[0], 1.5)
    with pytest.raises(ValueError, match="x"):
        moe(randn(rng, 5, 7), *w, top_k=2)                              # d differs
    with pytest.raises(ValueError, match="w_down"):
        moe(x, w[0], w[1], w[2], randn(rng, 3, 5, 6), top_k=2)          # f differs
    with pytest.raises(ValueError, match="w_gate"):
        moe(x, w[0], randn(rng, 4, 6, 4), w[2], w[3], top_k=2)          # E differs
    with pytest.raises(ValueError, match="capacity"):
        moe_capacity(x, *w, top_k=2, capacity=-1)
    with pytest.raises(ValueError, match="capacity"):
        moe_capacity(x, *w, top_k=2, capacity=None)
    with pytest.raises(ValueError, match="experts"):
        group_by_expert(torch.zeros(5, dtype=torch.int64), 3)
    with pytest.raises(TypeError):
        moe(x.float(), *w, top_k=2)                                     # mixed dtypes
