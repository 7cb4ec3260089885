"""A small serving loop: requests come and go while one batch decodes (continuous batching).

Each step the scheduler (1) admits waiting requests, oldest first, while the block pool can
promise them room for their whole answer, and runs each new prompt once (prefill), which gives
its first token; (2) decodes one more token for every request that was already running, all in
one batch over a paged KV cache; (3) retires requests that reached their end token or token
limit and returns their blocks to the pool, so waiting requests can start on the next step.

A request that cannot be promised room waits; a running request is never starved of blocks,
because admission counts what every running request may still need. Each request samples with
its own generator, so it gets exactly the tokens it would get if it were served alone. Chapter 9.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Hashable, Iterable

import torch

from .sampling import sample
from .paged import PagedKVCache


@dataclass(frozen=True)
class Request:
    """What a client asks for: continue ``prompt`` by up to
    ``max_new_tokens`` tokens.

    temperature 0 is greedy; seed makes sampling reproducible; eos_id ends
    the answer early."""

    id: Hashable
    prompt: tuple[int, ...]
    max_new_tokens: int
    temperature: float = 0.0
    top_k: int | None = None
    seed: int | None = None
    eos_id: int | None = None


@dataclass
class _Active:
    request: Request
    generator: torch.Generator | None
    output: list[int] = field(default_factory=list)

    @property
    def done(self) -> bool:
        r = self.request
        return len(self.output) >= r.max_new_tokens or \
            (r.eos_id is not None and bool(self.output) and self.output[-1] == r.eos_id)


@dataclass(frozen=True)
class StepRecord:
    """What the pool looked like at the end of one step (before finished requests left).

    blocks: request id -> its block table; waiting: ids still queued; finished: ids that ended
    this step; free_blocks: blocks on the free list."""

    step: int
    blocks: dict
    waiting: tuple
    finished: tuple
    free_blocks: int


class Scheduler:
    """Continuous batching over one :class:`llmcore.paged.PagedKVCache`. Chapter 9.

    max_batch_size: the most requests decoding together (default: no limit but the pool)."""

    def __init__(self, model, cache: PagedKVCache, *, max_batch_size: int | None = None):
        self.model, self.cache, self.max_batch_size = model, cache, max_batch_size
        self.waiting: deque[Request] = deque()
        self.running: dict[Hashable, _Active] = {}
        self.finished: dict[Hashable, list[int]] = {}
        self.timeline: list[StepRecord] = []
        self.step_count = 0

    def submit(self, request: Request) -> None:
        """Queue a request after checking that it can ever be served."""
        known = {r.id for r in self.waiting} | set(self.running) | set(self.finished)
        if request.id in known:
            raise ValueError(f"request id {request.id!r} was already submitted")
        if len(request.prompt) == 0:
            raise ValueError(f"request {request.id!r}: the prompt is empty")
        if request.max_new_tokens < 1:
            raise ValueError(f"request {request.id!r}: max_new_tokens must be >= 1, got "
                             f"{request.max_new_tokens}")
        vocab = self.model.config.vocab_size
        if not all(0 <= t < vocab for t in request.prompt):
            raise ValueError(f"request {request.id!r}: token ids must lie in [0, {vocab})")
        total = self._max_tokens(request)
        if total > self.cache.max_seq_len:
            raise ValueError(f"request {request.id!r}: {len(request.prompt)} prompt + "
                             f"{request.max_new_tokens} new tokens exceed max_seq_len = "
                             f"{self.cache.max_seq_len}")
        if not self.cache.can_ever_hold(total):
            raise ValueError(f"request {request.id!r} needs {self.cache.blocks_for(total)} blocks, "
                             f"more than the whole pool ({self.cache.num_blocks})")
        self.waiting.append(request)

    @staticmethod
    def _max_tokens(request: Request) -> int:
        """Tokens the cache may hold for it: the prompt and every answer token but the last."""
        return len(request.prompt) + request.max_new_tokens - 1

    def _promised_blocks(self) -> int:
        """Blocks running requests may still take before they finish."""
        cache = self.cache
        return sum(max(0, cache.blocks_for(self._max_tokens(a.request))
                       - len(cache.block_table(rid))) for rid, a in self.running.items())

    def _admit(self) -> list[Hashable]:
        admitted = []
        while self.waiting:
            if self.max_batch_size is not None and len(self.running) >= self.max_batch_size:
                break
            request = self.waiting[0]
            if not self.cache.can_admit(self._max_tokens(request),
                                        reserved_blocks=self._promised_blocks()):
                break                                   # oldest first: later ones wait too
            self.waiting.popleft()
            generator = None
            if request.seed is not None:
                generator = torch.Generator(device=self.model.device).manual_seed(request.seed)
            self.running[request.id] = _Active(request, generator)
            self.cache.add_sequence(request.id)
            admitted.append(request.id)
        return admitted

    def _pick(self, active: _Active, logits: torch.Tensor) -> None:
        r = active.request
        token = sample(logits[None], temperature=r.temperature, top_k=r.top_k,
                       generator=active.generator)
        active.output.append(int(token[0]))

    @torch.no_grad()
    def step(self) -> list[Hashable]:
        """Admit, prefill, decode one token for everyone running, retire.
        Returns finished ids."""
        model, cache = self.model, self.cache
        decoding = [rid for rid, a in self.running.items() if not a.done]
        for rid in self._admit():                     # prefill, one prompt each
            active = self.running[rid]
            prompt = torch.tensor([active.request.prompt], device=model.device)
            logits = model(prompt, cache.batch([rid]), last_only=True)
            self._pick(active, logits[0, -1])
        if decoding:                                      # decode, all together
            last = torch.tensor([[self.running[rid].output[-1]]
                                 for rid in decoding],
                                device=model.device)                    # (b, 1)
            logits = model(last, cache.batch(decoding), last_only=True)
            for i, rid in enumerate(decoding):
                self._pick(self.running[rid], logits[i, -1])
        finished = [rid for rid, a in self.running.items() if a.done]
        self.timeline.append(StepRecord(
            self.step_count,
            {rid: cache.block_table(rid) for rid in self.running},
            tuple(r.id for r in self.waiting), tuple(finished),
            cache.num_free_blocks))
        for rid in finished:
            self.finished[rid] = self.running.pop(rid).output
            cache.free_sequence(rid)
        self.step_count += 1
        return finished

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running


def serve(model, cache: PagedKVCache,
          arrivals: Iterable[tuple[int, Request]], *,
          max_batch_size: int | None = None,
          max_steps: int = 100_000) -> Scheduler:
    """Run requests that arrive at given steps until all are answered.

    arrivals: (step, request) pairs. Returns the scheduler: ``.finished``
    maps each request id to its generated tokens, ``.timeline`` records
    the pool at every step. Chapter 9.
    """
    pending = sorted(arrivals, key=lambda pair: pair[0])
    scheduler = Scheduler(model, cache, max_batch_size=max_batch_size)
    i = 0
    while i < len(pending) or not scheduler.idle:
        if scheduler.step_count >= max_steps:
            raise RuntimeError(f"serve: still busy after max_steps = "
                               f"{max_steps} steps")
        while i < len(pending) and pending[i][0] <= scheduler.step_count:
            scheduler.submit(pending[i][1])
            i += 1
        scheduler.step()
    return scheduler
