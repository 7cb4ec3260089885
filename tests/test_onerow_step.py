"""A GPT's whole decode step at batch 1 in C (llmcore.onerow_step): it gives the PyTorch step's
logits (float32's to its last bits' order, the others' to bfloat16's or w8a8's rounding) and
tokens, for every one-row kind, with grouped-query attention, over long caches, after the
model's embedding changes; the fast path keeps it only where it serves (batch 1, one token, a
GPT, llmcore's C kernels), times it against PyTorch's step where the products alone chose
another form, and a bad token, position or cache is refused before C reads memory."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

import llmcore.fastpath as fastpath
from llmcore import lowbit, onerow
from llmcore.fastpath import FastStep, StaticCache, fast_model
from llmcore.model import GPT, GPTConfig
from llmcore.onerow_step import GPTStepInC, why_not
from test_fastpath_precision import SMALL_GPT, model_of
from test_model import randomize, token_ids

pytestmark = pytest.mark.skipif(not onerow.available(),
                                reason=f"one-row kernels: {onerow.unavailable_reason()}")

GQA_GPT = GPTConfig(vocab_size=64, max_seq_len=80, d_model=64, n_heads=4, n_kv_heads=2,
                    n_layers=2)

TOLERANCE = {"fp32": 1e-5, "w8a8": 2e-3, "int8": 0.03, "bf16": 0.03, "int4": 0.03}
"""Relative to the largest logit. float32: only the products' order of summation differs.
w8a8: a normed activation a rounding away from a code boundary may take the next code (1/64 of
its row's largest value). bfloat16 kinds: one rounding of a bfloat16 activation either way."""


def forced(precision: str, monkeypatch) -> None:
    """Make ``precision``'s one-row C form its only form (no measuring on a small model)."""
    c_form = lowbit.ONE_ROW_FORMATS[precision]
    if not c_form.available(torch.device("cpu")):
        pytest.skip(f"no one-row C kernel for {precision} on this CPU")
    monkeypatch.setitem(lowbit.FORMATS, precision, c_form._replace(dense_from=None))
    monkeypatch.setattr(fastpath, "DENSE_BF16_WHEN_CACHED", False)


def logits_of(model, precision, prompt, follow, *, in_c: bool, monkeypatch) -> tuple:
    """(the fast path, its logits after the prompt and after each token of follow (t + 1, v)),
    with the step in C allowed or not."""
    with monkeypatch.context() as patched:
        patched.setattr(fastpath, "STEP_IN_C", in_c)
        fast = fast_model(model, precision=precision)
    assert (fast.one_row_step is not None) == in_c, fast.kernel
    step = FastStep(fast, model, prompt, follow.shape[1], None)
    out = [step(prompt)] + [step(follow[:, t:t + 1]) for t in range(follow.shape[1])]
    return fast, torch.cat(out)


@pytest.mark.parametrize("precision", ["fp32", "w8a8", "int8", "bf16", "int4"])
@pytest.mark.parametrize("config", ["mha", "gqa"])
def test_the_step_in_c_gives_the_pytorch_steps_logits(precision, config, monkeypatch):
    forced(precision, monkeypatch)
    if config == "mha":
        model = model_of("gpt", seed=3)
    else:
        model = randomize(GPT(GQA_GPT), seed=3, std=0.1).eval()
    prompt, follow = token_ids(model.config, 1, 5), token_ids(model.config, 1, 40, seed=9)
    fast, ours = logits_of(model, precision, prompt, follow, in_c=True,
                           monkeypatch=monkeypatch)
    assert "run whole in C" in fast.kernel
    _, theirs = logits_of(model, precision, prompt, follow, in_c=False,
                          monkeypatch=monkeypatch)
    if not fast.one_row_step.prompts:                   # the prompt: PyTorch both times
        assert torch.equal(ours[0], theirs[0])
    scale = float(theirs.abs().max())
    error = float((ours - theirs).abs().max()) / scale
    assert error < TOLERANCE[precision], error
    # the same greedy token, but where PyTorch's two best were within the tolerance (a tie
    # that one rounding either way decides)
    picked, best = ours.argmax(-1, keepdim=True), theirs.argmax(-1, keepdim=True)
    gap = theirs.gather(-1, best) - theirs.gather(-1, picked)
    assert bool((gap <= 2 * TOLERANCE[precision] * scale).all())
    if precision in ("fp32", "w8a8"):
        assert torch.equal(picked, best)


def test_float32s_step_in_c_is_the_teaching_forward(monkeypatch):
    forced("fp32", monkeypatch)
    model = model_of("gpt", seed=5)
    prompt, follow = token_ids(model.config, 1, 4), token_ids(model.config, 1, 12, seed=2)
    _, ours = logits_of(model, "fp32", prompt, follow, in_c=True, monkeypatch=monkeypatch)
    with torch.inference_mode():
        want = model(torch.cat([prompt, follow], dim=1))[0, prompt.shape[1] - 1:]
    torch.testing.assert_close(ours, want, rtol=1e-4, atol=1e-4)


def test_it_reads_the_models_embedding_as_it_is_now(monkeypatch):
    """float32's step reads the model's own tensors: an in-place edit of the (tied) embedding
    changes its logits as it changes the teaching forward's."""
    forced("fp32", monkeypatch)
    model = model_of("gpt", seed=6)
    fast = fast_model(model, precision="fp32")
    assert fast.one_row_step is not None
    prompt, token = token_ids(model.config, 1, 3), token_ids(model.config, 1, 1, seed=4)
    with torch.no_grad():
        model.token_embedding.mul_(1.5)
    step = FastStep(fast, model, prompt, 1, None)
    step(prompt)
    got = step(token)
    with torch.inference_mode():
        want = model(torch.cat([prompt, token], dim=1))[:, -1]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_it_serves_only_what_it_computes(monkeypatch):
    """Batch 2, a Llama, torch.compile's blocks and PyTorch's own kernels keep the PyTorch
    step, each with its reason; several tokens (a prompt) of a kind other than bfloat16 on AMX
    and a mask go to PyTorch too."""
    forced("w8a8", monkeypatch)
    forced("fp32", monkeypatch)
    gpt = model_of("gpt", seed=1)
    assert "batch 1, not 2" in why_not(fast_model(gpt, batch_size=2, precision="w8a8"))
    assert "not a FastLlama's" in why_not(fast_model(model_of("llama"), precision="w8a8"))
    monkeypatch.setitem(lowbit.FORMATS, "w8a8", lowbit.FORMATS["int8"]._replace(
        dense_from=None))                           # PyTorch's weight-only kernel
    # (pack= chooses the kernels: the C step is not timed against them)
    assert "C kernels" in why_not(fast_model(gpt, precision="w8a8", pack=False))
    fast = fast_model(gpt, precision="fp32")
    if fast.one_row_step is None:
        pytest.skip(f"float32 keeps PyTorch's step here: {fast.kernel}")
    real = fast.one_row_step
    fast.one_row_step = recorded = Recorded(real)
    assert not real.prompts and "only bfloat16" in real.why_no_prompts
    step = FastStep(fast, gpt, token_ids(gpt.config, 1, 3), 2, None)
    step(token_ids(gpt.config, 1, 3))
    assert not recorded.shapes                      # the prompt: PyTorch
    with pytest.raises(ValueError, match="3 tokens at once, but only bfloat16"):
        real(token_ids(gpt.config, 1, 3), torch.arange(3)[None], step.cache)
    step(token_ids(gpt.config, 1, 1))
    assert recorded.shapes == [(1, 1)]


def test_bad_tokens_positions_and_caches_are_refused_before_c_reads_memory(monkeypatch):
    forced("w8a8", monkeypatch)
    model = model_of("gpt", seed=2)
    fast = fast_model(model, precision="w8a8")
    in_c = fast.one_row_step
    cache = StaticCache(model, 1, 4, dtype=fast.dtype)
    one = torch.zeros(1, 1, dtype=torch.long)
    with pytest.raises(IndexError, match="token 64"):
        in_c(one + model.config.vocab_size, one, cache)
    with pytest.raises(IndexError, match="position -1"):
        in_c(one, one - 1, cache)
    cache.length = 4
    with pytest.raises(ValueError, match="4 torch.float32 rows, 4 filled"):
        in_c(one, one, cache)
    wrong = StaticCache(model, 1, 4, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="got torch.bfloat16"):
        in_c(one, one, wrong)
    other = model_of("llama")                          # 2 K/V heads of 16: another shape
    with pytest.raises(ValueError, match=r"\(2, 1, 4, 4, 16\), got torch.float32 "
                                         r"\(2, 1, 2, 4, 16\)"):
        in_c(one, one, StaticCache(other, 1, 4, dtype=torch.float32))
    batch = StaticCache(model, 2, 4, dtype=torch.float32)
    with pytest.raises(ValueError, match="layers, 1, kv_heads"):
        in_c(one, one, batch)
    with pytest.raises(ValueError, match="batch 1"):
        GPTStepInC(fast_model(model, batch_size=2, precision="w8a8"))


def test_the_step_in_c_is_timed_against_pytorchs_step_when_the_products_chose_pytorch(
        monkeypatch):
    """Where PyTorch's product won the products' pass (the C kernel slowed here), the fast
    path times both whole steps, keeps the faster, and says so: the step in C still wins,
    its products calling the kernels themselves, not the slowed Python function."""
    monkeypatch.setattr(fastpath, "PACK_ONE_ROW_ABOVE_BYTES", 0)
    c_form = lowbit.ONE_ROW_FORMATS["fp32"]

    def slowed(x, w, b):
        time.sleep(0.002)
        return c_form.linear(x, w, b)

    monkeypatch.setitem(lowbit.ONE_ROW_FORMATS, "fp32", c_form._replace(linear=slowed))
    model = model_of("gpt", seed=8)
    fast = fast_model(model, precision="fp32")
    assert "llmcore" not in min(fast.one_row_seconds, key=fast.one_row_seconds.get)
    assert len(fast.step_seconds) == 2 and "whole steps measured" in fast.kernel
    faster = min(fast.step_seconds, key=fast.step_seconds.get)
    assert (fast.one_row_step is not None) == faster.startswith("a step in C")


@pytest.mark.parametrize("precision", [None, "w8a8", "int4"])
def test_a_model_in_the_cache_times_the_step_in_c_too_unless_the_caller_chose(precision):
    """A model that stays in the CPU's cache measures no product forms, but its step is mostly
    the per-op cost the step in C saves: at batch 1 both whole steps are timed and the faster
    kept, with its logits the PyTorch step's; ``pack=`` (the caller's choice) keeps PyTorch's."""
    model = model_of("gpt", seed=10)
    assert not fastpath.streams_from_memory(model)
    fast = fast_model(model, precision=precision)
    assert not fast.one_row_seconds and len(fast.step_seconds) == 2, fast.kernel
    faster = min(fast.step_seconds, key=fast.step_seconds.get)
    assert (fast.one_row_step is not None) == faster.startswith("a step in C")
    chosen = fast_model(model, precision=precision, pack=False)
    assert chosen.one_row_step is None and not chosen.step_seconds
    prompt, follow = token_ids(model.config, 1, 4), token_ids(model.config, 1, 6, seed=3)
    logits = []
    for each in (fast, chosen):
        step = FastStep(each, model, prompt, follow.shape[1], None)
        logits.append(torch.cat([step(prompt)] + [step(follow[:, t:t + 1])
                                                 for t in range(follow.shape[1])]))
    scale = float(logits[1].abs().max())
    tolerance = TOLERANCE[precision or "fp32"] * (10 if precision == "int4" else 1)
    assert float((logits[0] - logits[1]).abs().max()) / scale < tolerance


class Recorded:
    """A step in C that records the shape of the tokens of each call."""

    def __init__(self, step: GPTStepInC):
        self.step, self.prompts, self.shapes = step, step.prompts, []

    def __call__(self, tokens, positions, cache):
        self.shapes.append(tuple(tokens.shape))
        return self.step(tokens, positions, cache)


needs_amx = pytest.mark.skipif(not onerow.amx_available(),
                               reason=f"AMX does not run here: {onerow.amx_unavailable_reason()}")


@needs_amx
@pytest.mark.parametrize("config", ["mha", "gqa"])
@pytest.mark.parametrize("n", [2, 16, 97])
def test_a_bf16_prompt_in_c_gives_the_pytorch_prompts_logits_and_cache(config, n,
                                                                       monkeypatch):
    """bfloat16 on AMX takes a prompt's tokens in one call to C (97: two calls of the AMX
    kernel, 96 rows and 1): its last logits and every cached key and value within a bfloat16
    rounding of the PyTorch prompt's, the cache n rows longer; then a prompt after a past
    (3 tokens after n), each token seeing the rows up to its own."""
    forced("bf16", monkeypatch)
    if config == "mha":
        model = randomize(GPT(LONG_GPT), seed=12, std=0.1).eval()
    else:
        config = dataclasses.replace(GQA_GPT, max_seq_len=128)          # room for 97 + 3
        model = randomize(GPT(config), seed=12, std=0.1).eval()
    prompt, more = token_ids(model.config, 1, n), token_ids(model.config, 1, 3, seed=5)
    runs = {}
    for in_c in (True, False):
        with monkeypatch.context() as patched:
            patched.setattr(fastpath, "STEP_IN_C", in_c)
            fast = fast_model(model, precision="bf16")
        assert (fast.one_row_step is not None and fast.one_row_step.prompts) == in_c
        step = FastStep(fast, model, prompt, more.shape[1] + 1, None)
        if in_c:
            fast.one_row_step = recorded = Recorded(fast.one_row_step)
        first = step(prompt)
        assert step.cache.length == n
        after = step(more)                            # three tokens after the prompt
        assert step.cache.length == n + 3
        if in_c:
            assert recorded.shapes == [(1, n), (1, 3)]
        runs[in_c] = first, after, step.cache
    (first, after, cache), (want_first, want_after, want_cache) = runs[True], runs[False]
    for got, want in ((first, want_first), (after, want_after)):
        error = float((got - want).abs().max() / want.abs().max())
        assert error < TOLERANCE["bf16"], error
    for got, want in ((cache.keys, want_cache.keys), (cache.values, want_cache.values)):
        rows = got[:, :, :, :n + 3].float(), want[:, :, :, :n + 3].float()
        assert float((rows[0] - rows[1]).abs().max()) <= 2 ** -7 * float(rows[1].abs().max())


@needs_amx
def test_a_bad_prompt_is_refused_before_c_reads_memory(monkeypatch):
    forced("bf16", monkeypatch)
    model = model_of("gpt", seed=2)
    in_c = fast_model(model, precision="bf16").one_row_step
    assert in_c is not None and in_c.prompts
    cache = StaticCache(model, 1, 6, dtype=torch.bfloat16)
    ids, places = torch.tensor([[1, 2, 3]]), torch.arange(3)[None]
    with pytest.raises(IndexError, match="token 64 or position 0 to 2"):
        in_c(ids.index_fill(1, torch.tensor([1]), model.config.vocab_size), places, cache)
    with pytest.raises(IndexError, match="token -1"):
        in_c(ids - 2, places, cache)
    with pytest.raises(ValueError, match="consecutive positions"):
        in_c(ids, torch.tensor([[0, 2, 3]]), cache)
    with pytest.raises(ValueError, match=r"\(1, n\), n >= 1, got \(1, 0\)"):
        in_c(ids[:, :0], places[:, :0], cache)
    with pytest.raises(ValueError, match=r"got \(1, 3\) and \(1, 2\)"):
        in_c(ids, places[:, :2], cache)
    cache.length = 4
    with pytest.raises(ValueError, match="6 torch.bfloat16 rows, 4 filled; expected room "
                                         "for 3 more"):
        in_c(ids, places + 4, cache)


LONG_GPT = GPTConfig(vocab_size=64, max_seq_len=320, d_model=256, n_heads=8, n_layers=1)
"""A cache past 256 keys of 8 heads of 32: attention's 65536 multiply-adds a step, from which
native/step.c shares the heads among the threads (ATTEND_ALONE_BELOW)."""


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_attention_over_a_long_cache_on_every_thread_gives_the_same_logits(precision,
                                                                           monkeypatch):
    forced(precision, monkeypatch)
    model = randomize(GPT(LONG_GPT), seed=11, std=0.1).eval()
    prompt, follow = token_ids(model.config, 1, 250), token_ids(model.config, 1, 12, seed=4)
    _, ours = logits_of(model, precision, prompt, follow, in_c=True, monkeypatch=monkeypatch)
    _, theirs = logits_of(model, precision, prompt, follow, in_c=False,
                          monkeypatch=monkeypatch)
    error = float((ours - theirs).abs().max() / theirs.abs().max())
    assert error < TOLERANCE[precision], error
