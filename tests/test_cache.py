"""llmcore.cache.Cache: every cache kind satisfies the interface the model uses, with the same
signatures; and the paged cache answers the scheduler's admission question."""

from __future__ import annotations

import inspect

import pytest
import torch

from llmcore import KVCache, PagedKVCache, Request, Scheduler, SharedPrefixCache, generate
from llmcore.cache import Cache
from llmcore.paged_batch import PagedBatch

PROTOCOL_METHODS = ("prepare", "attend", "commit")


def every_cache(model) -> list:
    """One of each cache kind, ready for a forward call of batch 2."""
    paged = PagedKVCache.for_model(model, block_size=4, num_blocks=16)
    paged.add_sequence("a")
    paged.add_sequence("b")
    prompt = torch.tensor([[1, 2, 3]], device=model.device)
    return [KVCache.for_model(model, 2), SharedPrefixCache.prefill(model, prompt, batch_size=2),
            paged.batch(["a", "b"])]


def test_every_cache_kind_satisfies_the_protocol(tiny_gqa_model):
    caches = every_cache(tiny_gqa_model)
    assert {type(c) for c in caches} == {KVCache, SharedPrefixCache, PagedBatch}
    for cache in caches:
        assert isinstance(cache, Cache), type(cache).__name__
        assert isinstance(type(cache).__dict__.get("max_length"), property), type(cache).__name__
        for name in PROTOCOL_METHODS:
            want = inspect.signature(getattr(Cache, name))
            got = inspect.signature(getattr(type(cache), name))
            assert list(got.parameters) == list(want.parameters), (type(cache).__name__, name)
            assert [p.default for p in got.parameters.values()] == \
                [p.default for p in want.parameters.values()], (type(cache).__name__, name)
            assert getattr(type(cache), name).__doc__, f"{type(cache).__name__}.{name}: no docstring"


def test_something_without_the_methods_is_not_a_cache():
    class NotACache:
        max_length = 0

        def prepare(self, b, n, attention_mask):
            return None

    assert not isinstance(NotACache(), Cache)


def test_the_model_runs_the_protocol_in_order(tiny_gqa_model):
    """prepare once, attend once per layer, commit once: what the protocol's docstring says."""
    calls = []

    class Recording(KVCache):
        def prepare(self, b, n, attention_mask):
            calls.append("prepare")
            return super().prepare(b, n, attention_mask)

        def attend(self, layer, q, k, v, layout, backend="explicit"):
            calls.append(f"attend {layer}")
            return super().attend(layer, q, k, v, layout, backend)

        def commit(self, n, attention_mask):
            calls.append("commit")
            super().commit(n, attention_mask)

    cache = Recording.for_model(tiny_gqa_model, 1)
    tiny_gqa_model(torch.tensor([[4, 5, 6]], device=tiny_gqa_model.device), cache)
    layers = tiny_gqa_model.config.n_layers
    assert calls == ["prepare", *[f"attend {i}" for i in range(layers)], "commit"]
    assert cache.max_length == 3


def test_can_admit_counts_free_blocks_and_what_is_reserved(tiny_gqa_model):
    cache = PagedKVCache.for_model(tiny_gqa_model, block_size=4, num_blocks=3)
    assert cache.can_admit(12) and not cache.can_admit(13)            # 3 blocks of 4 tokens
    assert cache.can_admit(8, reserved_blocks=1) and not cache.can_admit(9, reserved_blocks=1)
    assert cache.can_ever_hold(12) and not cache.can_ever_hold(13)
    cache.add_sequence("x")
    cache.make_room("x", 5)                                           # takes 2 blocks
    assert cache.num_free_blocks == 1 and cache.can_admit(4) and not cache.can_admit(5)
    assert cache.can_ever_hold(12)                                    # the pool, not the free list
    with pytest.raises(ValueError, match="n_tokens must be >= 1, got 0"):
        cache.can_admit(0)
    with pytest.raises(ValueError, match="reserved_blocks must be >= 0, got -1"):
        cache.can_admit(4, reserved_blocks=-1)


def test_the_scheduler_asks_the_cache_whether_a_request_fits(tiny_gqa_model):
    """A cache that refuses admission keeps requests waiting: the scheduler does not count the
    allocator's blocks behind the cache's back."""
    answers = []

    class Refusing(PagedKVCache):
        def can_admit(self, n_tokens, *, reserved_blocks=0):
            answers.append((n_tokens, reserved_blocks))
            return len(answers) > 2                                   # refuse twice, then admit

    cache = Refusing.for_model(tiny_gqa_model, block_size=4, num_blocks=32)
    scheduler = Scheduler(tiny_gqa_model, cache)
    request = Request(id="r", prompt=(1, 2, 3), max_new_tokens=4)
    scheduler.submit(request)
    scheduler.step()
    scheduler.step()
    assert list(scheduler.waiting) == [request] and not scheduler.running
    while not scheduler.idle:
        scheduler.step()
    assert answers[0] == (3 + 4 - 1, 0)                               # prompt + new - 1 tokens
    want = generate(tiny_gqa_model, torch.tensor([[1, 2, 3]], device=tiny_gqa_model.device), 4)
    assert scheduler.finished["r"] == want[0, 3:].tolist()
