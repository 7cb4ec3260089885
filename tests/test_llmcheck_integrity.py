"""llmcheck.integrity: what of the harness changed since the kernel started, which the grader asks
for after every test cell and turns into evidence for review (never a lost point)."""

from __future__ import annotations

import sys

import torch

from llmcheck import cases, integrity


def test_nothing_changed_says_nothing():
    assert integrity.changes() == []


def test_a_replaced_harness_function_is_named(monkeypatch):
    monkeypatch.setattr(cases.Test, "call", lambda self, *a, **k: None)
    assert integrity.changes() == ["llmcheck.cases.Test.call: replaced"]


def test_a_dispatch_mode_left_on_the_stack_and_a_tracing_hook_are_named():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Quiet(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    mode = Quiet()
    mode.__enter__()
    try:
        assert "torch dispatch modes left on the stack: 0 -> 1" in integrity.changes()
    finally:
        mode.__exit__(None, None, None)
    previous = sys.gettrace()
    sys.settrace(lambda *args: None)
    try:
        assert "tracing hook: False -> True" in integrity.changes()
    finally:
        sys.settrace(previous)
    assert integrity.changes() == []


def test_the_verdicts_turn_harness_changes_into_review_evidence():
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    from course.grading.integrity import HARNESS_METADATA
    from course.grading.verdicts import REVIEW_METADATA, judge_notebook
    test = new_code_cell("pass", metadata={"nbgrader": {"grade": True, "solution": False,
                                                        "grade_id": "test_x", "points": 1,
                                                        "locked": True}})
    test.metadata[HARNESS_METADATA] = ["llmcheck.cases.Test.call: replaced"]
    nb = new_notebook(cells=[test])
    nbformat.validate(nb)
    judge_notebook(nb, {})
    assert nb.metadata[REVIEW_METADATA] == [
        "the harness changed by the end of test_x: llmcheck.cases.Test.call: replaced"]
