"""The harness's state, as the grader asks for it after every test cell.

The grader's executor imports this module when the kernel starts, before any learner code runs
(:data:`BASELINE` is taken then), and after each graded test cell asks for :func:`changes` through
the execute reply's ``user_expressions`` (a silent request: no output, no history, no IPython
events). What changed (a harness function replaced, a dispatch mode left on torch's stack, a
tracing hook, an IPython hook that runs before or after every cell) is evidence for the
instructor's review (course/grading/review.py), never a lost point.

This check runs in the learner's process: code that restores everything before the grader asks,
or that replaces this module's answer, is not caught by it (course/grading/VERDICTS.md, section
6, lists what remains).
"""

from __future__ import annotations

import hashlib
import sys

_WATCHED = {
    "llmcheck.cases": ("Test.call", "Test.raises", "Test._case", "Test._run", "Test._publish",
                       "digest", "encode", "_canaries", "_unseen"),
    "llmcheck.recorder": ("OpRecorder.__torch_dispatch__", "OpRecorder.__enter__",
                          "OpRecorder.__exit__", "OpRecorder.refuse", "Policy.of",
                          "Policy.describe", "blocked"),
    "llmcheck.fresh": ("receive", "twin"),
}
"""The harness's functions whose replacement would change what a record says."""

_IPYTHON_EVENTS = ("pre_run_cell", "post_run_cell", "pre_execute")
_IPYTHON_TRANSFORMERS = ("input_transformers_cleanup", "input_transformers_post",
                         "ast_transformers")


def _resolve(module, dotted: str):
    value = module
    for part in dotted.split("."):
        value = vars(value).get(part) if hasattr(value, "__dict__") else None
    return value


def _code_hash(function) -> str:
    code = getattr(getattr(function, "__func__", function), "__code__", None)
    if code is None:
        return f"not a function: {type(function).__name__}"
    return hashlib.sha256(code.co_code + repr(code.co_consts).encode()).hexdigest()[:16]


def snapshot() -> dict[str, object]:
    """What the harness and the interpreter's hooks look like now (plain data)."""
    import importlib
    state: dict[str, object] = {}
    for name, functions in _WATCHED.items():
        module = sys.modules.get(name) or importlib.import_module(name)
        state[f"module {name}"] = id(module)
        for dotted in functions:
            function = _resolve(module, dotted)
            state[f"{name}.{dotted}"] = (id(function), _code_hash(function))
    state["tracing hook"] = sys.gettrace() is not None
    state["profiling hook"] = sys.getprofile() is not None
    try:
        import torch
        state["torch dispatch modes left on the stack"] = torch._C._len_torch_dispatch_stack()
    except Exception:                                   # noqa: BLE001  (no torch: nothing to see)
        pass
    shell = _shell()
    if shell is not None:
        for event in _IPYTHON_EVENTS:
            state[f"IPython {event} hooks"] = len(shell.events.callbacks.get(event, []))
        for attribute in _IPYTHON_TRANSFORMERS:
            state[f"IPython {attribute}"] = len(getattr(shell, attribute, []) or [])
    return state


def _shell():
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None


BASELINE = snapshot()


def changes() -> list[str]:
    """What differs from the state at kernel start, one phrase each ([] when nothing)."""
    now = snapshot()
    found = []
    for key, before in BASELINE.items():
        after = now.get(key)
        if after != before:
            found.append(f"{key}: replaced" if isinstance(before, tuple) else
                         f"{key}: {before} -> {after}")
    return found
