"""The harness's state, as the grader asks for it after every test cell.

The grader's executor imports this module when the kernel starts, before any learner code runs
(:data:`BASELINE` is taken then), and after each graded test cell asks for :func:`changes` through
the execute reply's ``user_expressions`` (a silent request: no output, no history, no IPython
events). What changed (a harness function replaced, a dispatch mode left on torch's stack, a
tracing hook, an IPython hook that runs before or after every cell) is evidence for the
instructor's review (course/grading/review.py), never a lost point.

This check runs in the learner's process: code that restores everything before the grader asks,
or that replaces this module's answer, is not caught by it. So right after importing it, the
grader's executor installs :func:`rebinding_check` in ``llmcheck.cases.Test``
(``llmcheck.cases.install_rebinding_check``), which asks it before every case and right after
the learner's function returns: a harness function, class or module replaced in an
llmcheck namespace fails the case even when it is put back before the cell ends
(course/grading/VERDICTS.md, section 6, lists what remains).
"""

from __future__ import annotations

import functools
import hashlib
import sys
import types
from types import MappingProxyType
from typing import Callable

WATCHED = MappingProxyType({
    "llmcheck.cases": ("Test.call", "Test.raises", "Test._case", "Test._raising_case",
                       "Test._run", "Test._publish",
                       "digest", "encode", "_canaries", "_in_place", "_unseen", "blocked",
                       "fold", "tensors_in", "storages_of"),
    "llmcheck.recorder": ("OpRecorder.__torch_dispatch__", "OpRecorder.__enter__",
                          "OpRecorder.__exit__", "OpRecorder.refuse", "OpRecorder.held",
                          "blocked", "tensors_in", "op_family", "forbidden_frame",
                          "autograd_at_work"),
    "llmcheck.policy": ("Policy.of", "Policy.describe", "Policy.allows"),
    "llmcheck.fresh": ("receive", "expect", "twin", "_secret_now", "_asked_by_a_test_cell",
                       "_fresh_tensor", "_fresh_integers"),
})
"""The harness's functions whose replacement would change what a record says, each named in the
module whose code calls it (``llmcheck.cases`` calls its own binding of ``blocked``). Every name
must resolve to a function when the kernel starts: :func:`snapshot` refuses to take the baseline
otherwise (:class:`UnwatchedName`), so a rename cannot turn the check off in silence."""


class UnwatchedName(LookupError):
    """A name in :data:`WATCHED` that does not resolve to a function: the harness was renamed
    without this table (a developer's error, raised where the kernel starts)."""


_IPYTHON_EVENTS = ("pre_run_cell", "post_run_cell", "pre_execute")
_IPYTHON_TRANSFORMERS = ("input_transformers_cleanup", "input_transformers_post",
                         "ast_transformers")


def _resolve(module, dotted: str):
    value = module
    for part in dotted.split("."):
        value = vars(value).get(part) if hasattr(value, "__dict__") else None
    return value


def unresolved() -> list[str]:
    """The names of :data:`WATCHED` that are not a function now (``[]`` when every one is)."""
    import importlib
    missing = []
    for name, functions in WATCHED.items():
        module = sys.modules.get(name) or importlib.import_module(name)
        for dotted in functions:
            function = _resolve(module, dotted)
            if getattr(getattr(function, "__func__", function), "__code__", None) is None:
                missing.append(f"{name}.{dotted}")
    return missing


def _code_hash(function) -> str:
    code = getattr(getattr(function, "__func__", function), "__code__", None)
    if code is None:
        return f"not a function: {type(function).__name__}"
    return hashlib.sha256(code.co_code + repr(code.co_consts).encode()).hexdigest()[:16]


def snapshot() -> dict[str, object]:
    """What the harness and the interpreter's hooks look like now (plain data)."""
    import importlib
    state: dict[str, object] = {}
    for name, functions in WATCHED.items():
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


def baseline() -> dict[str, object]:
    """The snapshot at kernel start; raises :class:`UnwatchedName` when a watched name does not
    resolve to a function (renamed or moved without :data:`WATCHED`)."""
    missing = unresolved()
    if missing:
        raise UnwatchedName(f"llmcheck.integrity watches names that are not functions: {missing}; "
                            "update WATCHED where the harness was renamed or moved")
    return snapshot()


BASELINE = baseline()
"""The snapshot when this module was imported; the grader's kernel takes it again once the
harness is sealed and its hooks are installed (:func:`take_baseline`)."""


def take_baseline() -> None:
    """Take :data:`BASELINE` now (the grader's kernel: after llmcheck.seal and the installs,
    before any learner code)."""
    global BASELINE
    BASELINE = baseline()


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


_BOUND = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, type,
          types.ModuleType, functools._lru_cache_wrapper, MappingProxyType, frozenset, tuple)
"""What :func:`rebinding_check` watches in a namespace: code, classes and modules, and the
harness's read-only tables (frozensets, tuples, read-only mappings: which ops count as products,
which families an op belongs to, each exercise's policy), which no code can change in place;
not the mutable state that changes from cell to cell (the secret of the cell now running)."""


def rebinding_check(package: str = "llmcheck") -> Callable[[], list[str]]:
    """A check for use while a test cell runs: the names of the package's modules (every
    function, class and module bound in their namespaces now, kept in the check's closure) that
    are bound to something else when it is called; ``[]`` when none. Unlike :func:`changes`,
    which the grader asks for after the cell, it catches a harness function replaced and put
    back within the cell (from an IPython hook, or by the learner's function during a case)."""
    watched = []
    for name, module in list(sys.modules.items()):
        if module is None or not (name == package or name.startswith(package + ".")):
            continue
        namespace = vars(module)
        watched.append((name, namespace, tuple((key, value) for key, value in namespace.items()
                                               if isinstance(value, _BOUND))))

    def rebound() -> list[str]:
        return [f"{name}.{key}" for name, namespace, bound in watched for key, value in bound
                if namespace.get(key) is not value]

    return rebound

