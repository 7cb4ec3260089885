"""llmcore.decode: the one generation loop feeds each pick back to the step, collect repeats eos
after a sequence stops and ends once all have, and the teaching and fast paths both run through
it (they differ only in the step)."""

from __future__ import annotations

import importlib

import pytest
import torch

from conftest import TINY
from llmcore.decode import StepResult, check_request, collect, decode
from llmcore.generate import TeachingStep, generate
from llmcore.fastpath import FastStep
from llmcore.model import GPT


class Scripted:
    """A step that records what it is given and answers logits whose argmax is ``next_token``."""

    def __init__(self, vocab: int = 7):
        self.vocab, self.seen = vocab, []

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        self.seen.append(tokens.clone())
        b = tokens.shape[0]
        logits = torch.zeros(b, self.vocab)
        logits[torch.arange(b), (tokens[:, -1] + 1) % self.vocab] = 1.0    # next id, mod v
        return logits


def test_each_pick_is_fed_back_and_the_prompt_goes_first():
    step, prompt = Scripted(), torch.tensor([[1, 2, 3], [4, 5, 6]])
    steps = list(decode(step, prompt, 3, pick=lambda logits: logits.argmax(-1)))
    assert [s.tokens.tolist() for s in steps] == [[4, 0], [5, 1], [6, 2]]
    assert torch.equal(step.seen[0], prompt)
    assert [t.tolist() for t in step.seen[1:]] == [[[4], [0]], [[5], [1]]]
    assert all(isinstance(s, StepResult) and s.logits.shape == (2, 7) for s in steps)


def test_collect_repeats_eos_after_a_sequence_stops_and_ends_when_all_have():
    prompt = torch.tensor([[1], [3]])
    rows = [[5, 2], [0, 6], [4, 0], [1, 1]]            # eos 0: row 1 at step 1, row 0 at step 2
    steps = [StepResult(torch.zeros(2, 7), torch.tensor(r)) for r in rows]
    assert collect(steps, prompt, eos_id=0).tolist() == [[1, 5, 0, 0], [3, 2, 6, 0]]
    assert collect(steps, prompt).tolist() == [[1, 5, 0, 4, 1], [3, 2, 6, 0, 1]]


def test_zero_steps_give_the_prompt():
    prompt = torch.tensor([[1, 2]])
    assert torch.equal(collect(decode(Scripted(), prompt, 0, pick=torch.argmax), prompt), prompt)


@pytest.mark.parametrize("fast, kind", [(False, TeachingStep), (True, FastStep)])
def test_teaching_and_fast_paths_share_the_loop(monkeypatch, fast, kind):
    calls = []
    module = importlib.import_module("llmcore.generate")   # llmcore.generate is the function
    original = module.decode
    monkeypatch.setattr(module, "decode",
                        lambda step, *args, **kwargs: calls.append(step)
                        or original(step, *args, **kwargs))
    model = GPT(TINY, seed=2).eval()
    generate(model, torch.zeros(1, 3, dtype=torch.long), 4, fast=fast)
    assert len(calls) == 1 and type(calls[0]) is kind


def test_a_request_is_checked_once_before_any_step():
    model = GPT(TINY)
    assert check_request(model, torch.zeros(2, 5, dtype=torch.long), 3) == (2, 5)
    with pytest.raises(ValueError, match="exceeds max_seq_len"):
        check_request(model, torch.zeros(1, 5, dtype=torch.long), TINY.max_seq_len)
    with pytest.raises(ValueError, match="ids must lie in"):
        check_request(model, torch.full((1, 2), TINY.vocab_size), 1)
