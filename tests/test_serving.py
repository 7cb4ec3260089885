"""The serving loop: every request gets exactly its solo tokens, whatever else runs beside it."""

from __future__ import annotations

import random

import pytest
import torch

from llmcore import PagedKVCache, Request, Scheduler, generate, serve
from conftest import TINY_GQA


def solo(model, request):
    ids = torch.tensor([request.prompt], device=model.device)
    out = generate(model, ids, request.max_new_tokens, temperature=request.temperature,
                   top_k=request.top_k, seed=request.seed)[0, len(request.prompt):].tolist()
    if request.eos_id is not None and request.eos_id in out:
        out = out[:out.index(request.eos_id) + 1]
    return out


def random_requests(count, seed=0):
    rng = random.Random(seed)
    arrivals = []
    for i in range(count):
        prompt = tuple(rng.randrange(TINY_GQA.vocab_size) for _ in range(rng.randint(1, 10)))
        sampled = i % 2 == 1
        arrivals.append((rng.randint(0, 8), Request(
            id=f"r{i}", prompt=prompt, max_new_tokens=rng.randint(1, 12),
            temperature=1.0 if sampled else 0.0, top_k=8 if i % 3 == 0 else None,
            seed=1000 + i if sampled else None)))
    return arrivals


@pytest.mark.parametrize("num_blocks, max_batch_size", [(64, None), (10, None), (64, 2)])
def test_every_request_gets_its_solo_tokens(tiny_gqa_model, num_blocks, max_batch_size):
    arrivals = random_requests(9)
    cache = PagedKVCache.for_model(tiny_gqa_model, block_size=4, num_blocks=num_blocks)
    scheduler = serve(tiny_gqa_model, cache, arrivals, max_batch_size=max_batch_size)
    for _, request in arrivals:
        assert scheduler.finished[request.id] == solo(tiny_gqa_model, request), request.id
    assert cache.allocator.num_free == num_blocks and not cache.sequences   # all returned
    cache.allocator.check()
    if max_batch_size is not None:
        assert all(len(record.blocks) <= max_batch_size for record in scheduler.timeline)


def test_a_full_pool_makes_requests_wait_without_harm(tiny_gqa_model):
    arrivals = random_requests(8, seed=1)
    cache = PagedKVCache.for_model(tiny_gqa_model, block_size=4, num_blocks=6)
    scheduler = serve(tiny_gqa_model, cache, arrivals)
    assert any(record.waiting for record in scheduler.timeline)             # someone waited
    for record in scheduler.timeline:
        held = [b for table in record.blocks.values() for b in table]
        assert len(held) == len(set(held)) and len(held) + record.free_blocks == 6
    for _, request in arrivals:
        assert scheduler.finished[request.id] == solo(tiny_gqa_model, request)


def test_requests_arrive_and_finish_at_different_steps(tiny_gqa_model):
    arrivals = random_requests(6, seed=2)
    cache = PagedKVCache.for_model(tiny_gqa_model, block_size=4, num_blocks=64)
    scheduler = serve(tiny_gqa_model, cache, arrivals)
    started = {rid: min(r.step for r in scheduler.timeline if rid in r.blocks)
               for rid in scheduler.finished}
    ended = {rid: r.step for r in scheduler.timeline for rid in r.finished}
    assert len(set(started.values())) > 1 and len(set(ended.values())) > 1
    overlapping = [r for r in scheduler.timeline if len(r.blocks) > 1]
    assert overlapping                                                      # truly batched


def test_end_token_retires_a_request_early(tiny_gqa_model):
    request = Request("x", (3, 4, 5), 12, temperature=1.0, seed=5)
    free_run = solo(tiny_gqa_model, request)
    eos = free_run[2]
    stopping = Request("y", (3, 4, 5), 12, temperature=1.0, seed=5, eos_id=eos)
    cache = PagedKVCache.for_model(tiny_gqa_model, block_size=4, num_blocks=16)
    scheduler = serve(tiny_gqa_model, cache, [(0, stopping)])
    assert scheduler.finished["y"] == free_run[:free_run.index(eos) + 1]


@pytest.mark.parametrize("request_, message", [
    (Request("a", (), 3), "prompt is empty"),
    (Request("a", (1,), 0), "max_new_tokens must be >= 1"),
    (Request("a", (999,), 3), r"token ids must lie in \[0, 61\)"),
    (Request("a", (1,) * 40, 20), "exceed max_seq_len = 48"),
    (Request("a", (1,) * 20, 10), "more than the whole pool"),
])
def test_impossible_requests_are_refused_at_once(tiny_gqa_model, request_, message):
    cache = PagedKVCache.for_model(tiny_gqa_model, block_size=4, num_blocks=4)
    scheduler = Scheduler(tiny_gqa_model, cache)
    with pytest.raises(ValueError, match=message):
        scheduler.submit(request_)
    assert not scheduler.waiting


def test_duplicate_request_ids_are_refused(tiny_gqa_model):
    scheduler = Scheduler(tiny_gqa_model,
                          PagedKVCache.for_model(tiny_gqa_model, block_size=4, num_blocks=8))
    scheduler.submit(Request("a", (1, 2), 2))
    with pytest.raises(ValueError, match="already submitted"):
        scheduler.submit(Request("a", (3,), 2))
