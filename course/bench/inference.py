"""Section ``inference``: what the KV cache, batching and paging buy, measured.

* generation with the KV cache against recomputing the whole sequence every step, for 64, 256
  and 1024 new tokens, on a model of about 4M parameters (greedy, the same tokens both ways);
* total throughput (generated tokens per second) at batch sizes 1, 4 and 16 with the cache;
* one decode step over a paged cache against one over a contiguous cache, same sequences;
* reserved-but-unused cache memory for requests of random lengths: one contiguous cache per
  request sized for max_seq_len, against paged blocks; and the per-token formula
  2 L h_kv d_head bytes_per_element checked against the bytes the cache tensors hold.

Chapters 7, 8 and 9.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import TextIO

import torch

from llmcore.device import describe_machine
from llmcore.generate import generate
from llmcore.kvcache import KVCache, kv_bytes_per_token
from llmcore.model import GPT, GPTConfig
from llmcore.paged import PagedKVCache
from llmcore.timing import time_call
from .ops import format_seconds, write_ratio

NAME = "inference"

CACHE_SPEEDUP_AT_LEAST = {256: 5.0, 1024: 15.0}
"""Expected on a 2-core machine with a ~4M-parameter model: cached generation at least 5x faster
than recomputation for 256 new tokens and 15x for 1024."""

BATCH16_VS_BATCH1_AT_LEAST = 3.0
"""Expected: total tokens/s at batch 16 at least 3x batch 1."""

PAGED_VS_CONTIGUOUS_AT_MOST = 2.0
"""Expected on the CPU in pure torch: a paged decode step at most 2x a contiguous one."""


@dataclass(frozen=True)
class Sizes:
    config: GPTConfig              # the model generation runs on
    prompt: int                    # prompt tokens
    new_tokens: tuple[int, ...]    # cached vs recompute at these lengths
    batches: tuple[int, ...]       # throughput at these batch sizes
    batch_new: int                 # tokens generated per sequence in the throughput runs
    paged_batch: int               # sequences in the paged vs contiguous decode step
    paged_length: int              # their cached length
    block_size: int
    requests: int                  # random-length requests in the memory comparison
    memory_config: GPTConfig       # the (small) model whose caches the memory figures fill


FULL = Sizes(config=GPTConfig(vocab_size=256, max_seq_len=1088, d_model=256, n_heads=8,
                              n_layers=4),
             prompt=16, new_tokens=(64, 256, 1024), batches=(1, 4, 16), batch_new=64,
             paged_batch=8, paged_length=256, block_size=16, requests=32,
             memory_config=GPTConfig(vocab_size=256, max_seq_len=1024, d_model=32, n_heads=4,
                                     n_layers=2))
QUICK = Sizes(config=GPTConfig(vocab_size=64, max_seq_len=48, d_model=16, n_heads=2, n_layers=1),
              prompt=4, new_tokens=(4, 16), batches=(1, 2), batch_new=4, paged_batch=2,
              paged_length=8, block_size=4, requests=4,
              memory_config=GPTConfig(vocab_size=64, max_seq_len=48, d_model=16, n_heads=2,
                                      n_layers=1))


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def cache_vs_recompute(out: TextIO, model: GPT, sizes: Sizes, checked: bool) -> None:
    prompt = torch.randint(0, model.config.vocab_size, (1, sizes.prompt), device=model.device,
                           generator=torch.Generator().manual_seed(0))
    out.write(f"\ngeneration, 1 sequence, {sizes.prompt}-token prompt, greedy\n")
    out.write(f"  {'new tokens':>10} {'recompute':>11} {'KV cache':>11} {'speed-up':>9}\n")
    generate(model, prompt, 4, use_cache=True)                         # warm-up
    for new in sizes.new_tokens:
        results = {}
        times = {}
        for use_cache in (False, True):
            times[use_cache] = _seconds(lambda: results.__setitem__(
                use_cache, generate(model, prompt, new, use_cache=use_cache)))
        if not torch.equal(results[True], results[False]):
            raise AssertionError(f"cached and recomputed generation differ at {new} tokens")
        ratio = times[False] / times[True]
        out.write(f"  {new:>10} {format_seconds(times[False]):>11} "
                  f"{format_seconds(times[True]):>11} {ratio:>8.1f}x\n")
        if new in CACHE_SPEEDUP_AT_LEAST:
            write_ratio(out, f"KV cache vs recompute at {new} new tokens", ratio,
                        at_least=CACHE_SPEEDUP_AT_LEAST[new], checked=checked)


def batch_throughput(out: TextIO, model: GPT, sizes: Sizes, checked: bool) -> None:
    out.write(f"\nthroughput with the KV cache, {sizes.prompt}-token prompts, "
              f"{sizes.batch_new} new tokens each\n")
    out.write(f"  {'batch':>6} {'time':>10} {'tokens/s':>10}\n")
    rates = {}
    g = torch.Generator().manual_seed(1)
    for b in sizes.batches:
        prompts = torch.randint(0, model.config.vocab_size, (b, sizes.prompt), generator=g)
        prompts = prompts.to(model.device)
        generate(model, prompts, 2)                                    # warm-up at this size
        seconds = _seconds(lambda: generate(model, prompts, sizes.batch_new))
        rates[b] = b * sizes.batch_new / seconds
        out.write(f"  {b:>6} {format_seconds(seconds):>10} {rates[b]:>10.0f}\n")
    first, last = sizes.batches[0], sizes.batches[-1]
    write_ratio(out, f"tokens/s at batch {last} vs batch {first}", rates[last] / rates[first],
                at_least=BATCH16_VS_BATCH1_AT_LEAST if (first, last) == (1, 16) else None,
                checked=checked)


@torch.no_grad()
def paged_vs_contiguous(out: TextIO, model: GPT, sizes: Sizes, checked: bool) -> None:
    b, length, p = sizes.paged_batch, sizes.paged_length, sizes.block_size
    device = model.device
    g = torch.Generator().manual_seed(2)
    prompts = torch.randint(0, model.config.vocab_size, (b, length), generator=g).to(device)
    contiguous = KVCache.for_model(model, b)
    model(prompts, contiguous)
    paged = PagedKVCache.for_model(model, block_size=p,
                                   num_blocks=b * paged_blocks(length + 1, p))
    for i in range(b):
        paged.add_sequence(i)
        model(prompts[i:i + 1], paged.batch([i]))
    step = torch.randint(0, model.config.vocab_size, (b, 1), generator=g).to(device)
    want = model(step, contiguous)
    got = model(step, paged.batch(list(range(b))))
    torch.testing.assert_close(got, want)

    def contiguous_step():                # decode one token, then forget it
        model(step, contiguous)
        contiguous.truncate(length)

    def paged_step():
        model(step, paged.batch(list(range(b))))
        for i in range(b):
            paged.truncate(i, length)

    t_contiguous = time_call(contiguous_step, repeats=7, min_seconds=0.05, statistic="min")
    t_paged = time_call(paged_step, repeats=7, min_seconds=0.05, statistic="min")
    out.write(f"\none decode step, {b} sequences of {length} cached tokens "
              f"(paged: blocks of {p})\n")
    out.write(f"  contiguous cache {format_seconds(t_contiguous):>10}\n")
    out.write(f"  paged cache      {format_seconds(t_paged):>10}\n")
    write_ratio(out, "paged step time / contiguous step time", t_paged / t_contiguous,
                at_most=PAGED_VS_CONTIGUOUS_AT_MOST, checked=checked)


def paged_blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


@torch.no_grad()
def memory_waste(out: TextIO, sizes: Sizes) -> None:
    config, p = sizes.memory_config, sizes.block_size
    model = GPT(config, seed=0).eval()
    rng = random.Random(3)
    lengths = [rng.randint(1, config.max_seq_len) for _ in range(sizes.requests)]
    contiguous_reserved = contiguous_used = 0
    for length in lengths:
        cache = KVCache.for_model(model, 1)                     # sized for max_seq_len
        model(torch.zeros(1, length, dtype=torch.long), cache)
        contiguous_reserved += cache.reserved_bytes()
        contiguous_used += cache.used_bytes()
    paged = PagedKVCache.for_model(model, block_size=p,
                                   num_blocks=sum(paged_blocks(n, p) for n in lengths))
    for i, length in enumerate(lengths):
        paged.add_sequence(i)
        model(torch.zeros(1, length, dtype=torch.long), paged.batch([i]))
    per_token = kv_bytes_per_token(config.n_layers, config.kv_heads, config.d_head, 4)
    held = sum(t.numel() * t.element_size() for t in (*cache.keys, *cache.values)) \
        // config.max_seq_len
    out.write(f"\ncache memory, {len(lengths)} requests of random lengths 1..{config.max_seq_len}"
              f" (model: L={config.n_layers}, h_kv={config.kv_heads}, d_head={config.d_head}, "
              f"float32)\n")
    out.write(f"  bytes per token: formula 2 L h_kv d_head 4 = {per_token}; "
              f"measured from the cache tensors = {held}\n")
    waste_contiguous = 1 - contiguous_used / contiguous_reserved
    waste_paged = 1 - paged.used_bytes() / paged.allocated_bytes()
    unused_paged_tokens = (paged.allocated_bytes() - paged.used_bytes()) // per_token
    out.write(f"  contiguous, max-length per request: reserved {contiguous_reserved / 2**20:.2f} MiB,"
              f" used {contiguous_used / 2**20:.2f} MiB, wasted {100 * waste_contiguous:.1f}%\n")
    out.write(f"  paged, blocks of {p}: allocated {paged.allocated_bytes() / 2**20:.2f} MiB, "
              f"used {paged.used_bytes() / 2**20:.2f} MiB, wasted {100 * waste_paged:.1f}% "
              f"({unused_paged_tokens / len(lengths):.1f} unused slots per request, "
              f"under one block = {p}: {'held' if unused_paged_tokens < p * len(lengths) else 'NOT held'})\n")
    out.write("  (vLLM's paper reports 60-80% waste in systems without paging, under 4% with it)\n")


def run(out: TextIO, *, quick: bool = False, device: torch.device | str | None = None) -> None:
    """Measure and write the section's tables and ratios to ``out``."""
    device = torch.device(device if device is not None else "cpu")
    sizes = QUICK if quick else FULL
    model = GPT(sizes.config, device=device, seed=0).eval()
    out.write(f"== {NAME}: KV cache, batching, paged attention ==\n")
    out.write(f"machine: {describe_machine(device)}\n")
    out.write(f"model: {model.num_parameters() / 1e6:.2f}M parameters (d={sizes.config.d_model}, "
              f"L={sizes.config.n_layers}, h={sizes.config.n_heads}), device {device}"
              f"{'   (--quick: tiny sizes, not a measurement)' if quick else ''}\n")
    checked = not quick
    cache_vs_recompute(out, model, sizes, checked)
    batch_throughput(out, model, sizes, checked)
    paged_vs_contiguous(out, model, sizes, checked)
    memory_waste(out, sizes)
