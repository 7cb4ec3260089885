"""A policy: what a call under test may not reach, parsed once from a test's ``forbid`` targets.

A :class:`Policy` holds the aten ops refused by name, the op families an allowlist leaves open
(``llmcheck.families``), the words of llmcore functions refused, NumPy, autograd and the code
objects of Python callables; it words every refusal (:class:`NotAllowedError`). A module named by
:class:`CodeOf` is imported only when a policy is made, so importing this module (or the exercise
policies, ``llmcheck.policies``) imports no llmcore module. Chapters 2-4 and 7 and their exercises.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from dataclasses import dataclass, field
from typing import Sequence

import torch

from .families import FAMILIES, SHORTCUT_OPS, Allow, op_family

EXEMPT_MODULES = ("llmcore.testing",)
"""llmcore modules whose functions a test may always call (they compare, they compute nothing)."""

LLMCORE_DIR = os.path.dirname(os.path.abspath(importlib.util.find_spec("llmcore").origin))
"""llmcore's folder (found without importing llmcore): frames running code from it are
llmcore's."""


@dataclass(frozen=True)
class CodeOf:
    """A ``forbid`` target: every function, method and property the module named ``module``
    defines (not the names it imports), in a learner's subclass too. The module is imported when
    a policy is made, not when the target is written."""

    module: str

    def resolve(self) -> types.ModuleType:
        return importlib.import_module(self.module)


class NotAllowedError(AssertionError):
    """A function under test reached a library's own implementation of what it should compute."""


def _families_text(families) -> str:
    return "; ".join(FAMILIES[f] for f in sorted(families))


@dataclass(frozen=True)
class Policy:
    """What a call may not reach.

    ops: aten op names refused by name (``"mm"``): the ``aten.NAME`` targets, and the
    :data:`SHORTCUT_OPS` that the allowlist leaves out; named: the ``aten.NAME`` targets alone;
    allow: the op families a call may reach (None: every op not refused by name), the intersection
    of the policy's :class:`Allow` targets; words: llmcore function-name words (``"softmax"``);
    numpy: refuse NumPy and the conversions between tensors and arrays; codes: code objects of
    Python callables (``Attention.forward``); functions: torch's own API functions refused by
    name (``"torch.logsumexp"``: a library helper whose aten ops the allowlist allows, seen by a
    TorchFunctionMode whatever reference the learner's code holds); traced: refuse ops run by
    code that torch.fx generated (a graph traced before the call and replayed in it); hint: a
    sentence added to each refusal.
    """

    ops: frozenset[str] = frozenset()
    words: tuple[str, ...] = ()
    numpy: bool = False
    codes: frozenset = frozenset()
    callables: tuple[str, ...] = ()
    hint: str = ""
    autograd: bool = False      # refuse autograd's work: backward engine, forward AD, *_backward*
    allow: frozenset[str] | None = None
    named: frozenset[str] = frozenset()
    functions: tuple[str, ...] = ()
    traced: bool = False
    code_names: frozenset[str] = field(init=False, repr=False, compare=False,
                                       default=frozenset())

    def __post_init__(self):
        # the names of the refused code objects: a code object equal to one of them has its name
        # (CPython compares co_name first), so the recorder tests ``code.co_name in code_names``
        # before ``code in codes``, which hashes the code's bytecode, constants and names each
        # time, for every Python call of a recorded case
        object.__setattr__(self, "code_names", frozenset(code.co_name for code in self.codes))

    @classmethod
    def of(cls, targets: Sequence, hint: str = "") -> "Policy":
        """Parse ``forbid`` targets: ``"aten.NAME"``, ``"llmcore.WORD"``, ``"numpy"``,
        ``"autograd"``, :class:`Allow` lists (intersected), callables, :class:`CodeOf` modules
        (imported now)."""
        names = [t for t in targets if isinstance(t, str)]
        unknown = [t for t in names if not (t.startswith(("aten.", "llmcore.", "torch."))
                                            or t in ("numpy", "autograd", "traced"))]
        if unknown:
            raise ValueError(f"forbid: targets must be 'aten.OP', 'llmcore.WORD', 'torch.NAME', "
                             f"'numpy', 'autograd', 'traced', Allow(...), CodeOf(...) or "
                             f"callables, got {unknown}")
        allows = [t for t in targets if isinstance(t, Allow)]
        allow = frozenset.intersection(*(a.families for a in allows)) if allows else None
        callables = [t.resolve() if isinstance(t, CodeOf) else t
                     for t in targets if not isinstance(t, (str, Allow))]
        codes = [code for c in callables for code in codes_of(c)]
        named = frozenset(t.split(".", 1)[1] for t in names if t.startswith("aten."))
        shortcuts = frozenset() if allow is None else frozenset(
            op for op in SHORTCUT_OPS if op_family(op) not in allow)
        return cls(ops=named | shortcuts, named=named,
                   words=tuple(dict.fromkeys(t.split(".", 1)[1] for t in names
                                             if t.startswith("llmcore."))),
                   numpy="numpy" in names, codes=frozenset(codes),
                   callables=tuple(getattr(c, "__qualname__", None) and
                                   f"{c.__module__}.{c.__qualname__}" or c.__name__
                                   for c in callables),
                   hint=hint, autograd="autograd" in names, allow=allow,
                   functions=tuple(dict.fromkeys(t for t in names if t.startswith("torch."))),
                   traced="traced" in names)

    def allows(self, func) -> bool:
        """Whether an aten op (OpOverload, packet or name) may run under this policy."""
        name = func if isinstance(func, str) else \
            getattr(func, "overloadpacket", func).__name__
        if name in self.ops:
            return False
        return self.allow is None or op_family(func) in self.allow

    def describe(self) -> dict:
        """The policy as JSON-ready data (what a record states): ``ops`` refused by name, and with
        an allowlist ``allow``, the sorted families every other op must belong to."""
        return {"ops": sorted(f"aten.{op}" for op in self.ops), "llmcore": list(self.words),
                "numpy": self.numpy, "callables": list(self.callables),
                **({"autograd": True} if self.autograd else {}),
                **({"functions": list(self.functions)} if self.functions else {}),
                **({"traced": True} if self.traced else {}),
                **({"allow": sorted(self.allow)} if self.allow is not None else {})}

    def refusal(self, what: str) -> NotAllowedError:
        hint = f" {self.hint}" if self.hint else ""
        return NotAllowedError(f"{what} was used, but this exercise asks you to compute it "
                               f"yourself; the library's own version is not allowed here.{hint}")

    def unlisted(self, what: str) -> NotAllowedError:
        """The refusal of an op outside the allowlist: which op, that this test does not allow
        it, and what it does allow."""
        hint = f" {self.hint}" if self.hint else ""
        allowed = _families_text(self.allow) if self.allow else "nothing"
        return NotAllowedError(f"{what} was used, but it is not among the operations this test "
                               f"allows: this exercise asks you to compute it yourself with "
                               f"{allowed}.{hint}")


def codes_of(target, depth: int = 0) -> list:
    """The code objects a callable target stands for: a function's (or method's) own; every
    function, method and property of a class; every function and class a module defines (not the
    names it imports). ``forbid(*PAGING)`` refuses all of llmcore's paging code."""
    if isinstance(target, (staticmethod, classmethod)):
        target = target.__func__
    if isinstance(target, property):
        return [f.__code__ for f in (target.fget, target.fset, target.fdel) if f is not None]
    code = getattr(target, "__code__", None)
    if code is not None:
        return [code]
    if isinstance(target, (type, types.ModuleType)):
        home = target.__name__ if isinstance(target, types.ModuleType) else target.__module__
        members = [value for value in vars(target).values()
                   if isinstance(value, (staticmethod, classmethod, property))
                   or (isinstance(value, type) and depth < 2 or hasattr(value, "__code__"))
                   and getattr(value, "__module__", None) == home]
        source = getattr(sys.modules.get(home), "__file__", None)     # not generated, not wrapped
        return [code for value in members for code in codes_of(value, depth + 1)
                if code.co_filename == source]
    if depth == 0:
        raise ValueError(f"forbid: {target!r} is not a Python function, class or module")
    return []


def is_library_name(module: str, name: str, words: Sequence[str]) -> bool:
    """An llmcore function named with one of the words; private helpers and argument checks
    (``_check_attention_inputs``, ``check_attention_mask``) compute nothing and do not count."""
    return (module.startswith("llmcore.") and module not in EXEMPT_MODULES
            and not name.startswith(("_", "check")) and any(word in name for word in words))


TRACED_CODE = "<eval_with_key>"
"""How the files of torch.fx's generated code begin (a GraphModule's forward: what make_fx
traces and a replay runs)."""


def resolve_function(name: str):
    """torch's API function (or Tensor method) named ``name`` ("torch.special.logsumexp")."""
    import importlib
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            value = getattr(value, attribute)
        return value
    raise ValueError(f"forbid: no function {name!r}")


def forbidden_frame(policy: Policy, frame, stop=None) -> str | None:
    """The outermost frame on the stack that runs forbidden code, as 'module.function'; the walk
    ends below ``frame`` at ``stop`` (the frame that entered the recorder: what runs beneath it,
    the test cell and the kernel, is the harness's), or at the bottom of the stack."""
    outermost = None
    while frame is not None and frame is not stop:
        code = frame.f_code
        if policy.traced and code.co_filename.startswith(TRACED_CODE):
            return "a graph traced before the call and replayed in it (torch.fx's generated code)"
        module = frame.f_globals.get("__name__", "") or ""
        if code.co_name in policy.code_names and code in policy.codes or (policy.words and (
                is_library_name(module, code.co_name, policy.words) or
                (code.co_filename.startswith(LLMCORE_DIR) and module not in EXEMPT_MODULES
                 and is_library_name("llmcore.copy", code.co_name, policy.words)))):
            outermost = f"{module}.{getattr(code, 'co_qualname', code.co_name)}"
        frame = frame.f_back
    return outermost


def autograd_at_work(name: str) -> str | None:
    """What of autograd an op is part of, or None: the backward engine running it (whatever
    Python entry point started the engine), forward-mode AD (a dual level is open), or an aten
    derivative kernel called by name (``aten._softmax_backward_data``)."""
    if torch._C._current_graph_task_id() != -1:
        return (f"torch's autograd (aten.{name} run by the backward pass, which "
                "torch.autograd.grad, Tensor.backward, torch.func.grad/vjp and "
                "torch.autograd.functional start)")
    import torch.autograd.forward_ad as forward_ad
    if forward_ad._current_level >= 0:
        return f"torch's forward-mode autograd (aten.{name} under a dual level: torch.func.jvp)"
    if "backward" in name:
        return f"torch's derivative kernel aten.{name}"
    return None
