"""Which operations a computation reaches: record every aten op, refuse what a policy disallows.

The exercises ask learners to compute something themselves (a matrix product by loops, a softmax,
attention). Whatever Python path a computation takes (``@``, ``torch.matmul``, an alias,
``torch.ops.aten.mm``, ``torch.linalg``, ``einsum``, a method), it ends in aten operations, and a
:class:`~torch.utils._python_dispatch.TorchDispatchMode` sees every one of them. :class:`OpRecorder`
counts them (and the matrix products' rows and FLOPs, and the largest storage any tensor had), and
refuses what a :class:`~llmcheck.policy.Policy` does not allow. :func:`forbid` and
:func:`watch_torch_calls` are the learner-facing forms; ``llmcheck.cases.Test`` uses the recorder
to publish what a test's call reached, for the grader to judge outside the kernel
(course/grading/VERDICTS.md). Chapters 2-4 and 7 and their exercises.

The harness by concern, each module importing only those above it:

- ``llmcheck.tree``: the one walk over nested tensors;
- ``llmcheck.families``: op families and the table of the library's shortcuts;
- ``llmcheck.policy``: a policy parsed from ``forbid`` targets, and its refusals;
- ``llmcheck.policies``: the exercises' policies (PRODUCTS, SOFTMAXES, ..., PAGING);
- ``llmcheck.blocking``: NumPy and llmcore's named functions swapped for refusing stand-ins;
- this module: the recorder. It re-exports the names above that test cells and tests import
  from it (``from llmcheck.recorder import PRODUCTS``); importing it imports no llmcore module.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import types
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from .blocking import blocked
from .families import FAMILIES, PRODUCT_OPS, SHORTCUT_OPS, SHORTCUTS, Allow, op_family
from .identity import identity
from .policies import (ATTENTIONS, AUTOGRAD, BASICS, DECODING, GENERATION, ORDINARY, PAGING,
                       PRODUCTS, QUANTIZATION, SAMPLING, SOFTMAXES)
from .policy import (CodeOf, NotAllowedError, Policy, autograd_at_work, forbidden_frame,
                     resolve_function)
from .tree import op_tensors, tensors_in

__all__ = [
    "ATTENTIONS", "AUTOGRAD", "BASICS", "DECODING", "FAMILIES", "GENERATION", "ORDINARY",
    "PAGING", "PRODUCTS", "PRODUCT_OPS", "QUANTIZATION", "SAMPLING", "SHORTCUTS", "SHORTCUT_OPS",
    "SOFTMAXES", "Allow", "CodeOf", "NotAllowedError", "OpRecorder", "Policy", "TorchCall",
    "blocked", "forbid", "op_family", "storages_of", "watch_torch_calls",
]


def _storage_pointer(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


def _product_size(name: str, args) -> tuple[int, int]:
    """(rows, FLOPs) of a product op: rows of its left operand, 2*M*N*K multiply-adds."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if name in ("addmm", "addbmm", "baddbmm", "addmv", "addr", "_addmm_activation"):
        tensors = tensors[1:]                           # the first argument is the added term
    if len(tensors) < 2:
        return 0, 0
    a, b = tensors[0], tensors[1]
    if a.dim() == 0 or b.dim() == 0:
        return 0, 0
    if name in ("dot", "vdot"):
        return 1, 2 * a.shape[0]
    if name == "addr":
        return a.shape[0], 2 * a.shape[0] * b.shape[0]
    rows = math.prod(a.shape[:-1]) if a.dim() > 1 else 1
    columns = b.shape[-1] if b.dim() > 1 else 1
    if name.startswith(("_scaled_dot_product", "_efficient_attention", "_flash_attention")):
        columns = b.shape[-2]                           # q (.., n, d) against k (.., m, d)
        return rows, 4 * rows * columns * a.shape[-1]   # q k^T and A v
    return rows, 2 * rows * columns * a.shape[-1]


def _op_words(name: str) -> str:
    """An aten op as a refusal names it."""
    if op_family(name) == "product":
        return (f"torch's {name} (aten.{name}, which @, matmul, einsum, torch.linalg and their "
                "aliases reach)")
    return f"torch's {name} (aten.{name})"


@dataclass(frozen=True)
class TorchCall:
    """One aten op reached: its name, its tensor arguments' shapes and storage pointers, and for
    a product the rows of its left operand."""

    name: str
    shapes: tuple[tuple[int, ...], ...]
    storages: tuple[int, ...]
    product_rows: int = 0

    @property
    def is_product(self) -> bool:
        """A matrix or vector product (``@``, matmul, mm, einsum, linear, ...)."""
        return self.name in PRODUCT_OPS

    @property
    def rows(self) -> int:
        """Rows (tokens) of a product's left operand: every dimension but the last."""
        return self.product_rows

    def uses(self, t: torch.Tensor) -> bool:
        """Whether ``t`` (or a view of its memory, such as its transpose) was an argument."""
        pointer = _storage_pointer(t)
        return pointer != 0 and pointer in self.storages


def storages_of(*values) -> dict[int, int]:
    """{storage pointer: bytes} of every tensor in the values (nested lists, tuples and dicts, a
    module's parameters and buffers): a call's own inputs, which ``max_elements`` does not count
    (``OpRecorder(policy, exempt=storages_of(args, kwargs, inputs))``)."""
    found: dict[int, int] = {}
    for t in tensors_in(*values):
        with contextlib.suppress(RuntimeError, NotImplementedError):
            storage = t.untyped_storage()
            found[storage.data_ptr()] = max(found.get(storage.data_ptr(), 0), storage.nbytes())
    return found


@dataclass
class OpRecorder(TorchDispatchMode):
    """Records every aten op reached inside the block and refuses what ``policy`` does not allow.

    ops: op name -> count; products, flops: matrix-product ops and their FLOPs; calls: each op
    (kept only when ``keep_calls``); violations: a sentence for each refusal; largest,
    largest_shape, largest_op: the largest storage, in elements of the tensor's dtype, that any
    tensor an op took or returned had (however it grew: a new tensor, ``resize_``, ``out=``,
    ``set_``, a view of a large tensor made before the call), the shape of that tensor and the op
    after which it was seen; exempt: {storage pointer: bytes} of the call's own inputs
    (:func:`storages_of`), not counted while they keep their size. With ``track_live``, also
    peak_live and peak_live_op: the most elements that the storages of tensors seen by ops held
    **at once** (each storage counted once, from the first op that took or returned one of its
    tensors until the last such tensor is gone; the inputs' storages not counted), and the op
    after which that peak was seen: a whole matrix kept as many tiles in a list counts whole. A
    refused op raises :class:`NotAllowedError` (which the caller's code may catch: the
    violation stays recorded).
    """

    policy: Policy = field(default_factory=Policy)
    keep_calls: bool = False
    ops: Counter = field(default_factory=Counter)
    products: int = 0
    flops: int = 0
    calls: list = field(default_factory=list)
    violations: list = field(default_factory=list)
    produced: set = field(default_factory=set)      # storage pointers of every op's results
    largest: int = 0                                # elements of the largest storage seen
    largest_shape: tuple = ()
    largest_op: str = ""
    exempt: dict = field(default_factory=dict)      # the inputs' storages: pointer -> bytes
    track_live: bool = False
    live: int = 0                                   # elements the tracked storages hold now
    peak_live: int = 0
    peak_live_op: str = ""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """Keep torch from wrapping ``__torch_dispatch__`` in ``torch._dynamo.disable``: the
        wrapper's first call imports torch._dynamo (about 0.9 s of every graded kernel's CPU),
        and no op a recorder sees is compiled. (TorchDispatchMode's own switch for this.)"""
        return False

    def __post_init__(self):
        super().__init__()
        warm_up()
        self.profile_hook = self._profile_hook if self.policy.codes else None
        self._outer_profile = []
        self._helpers = []
        self._guards = []
        self._entered_at = []       # the frame of each `with` that entered: where walks stop
        self.dispatching = 0        # > 0 while this recorder hands an op on (its guard sees it)
        self._storages = {}         # storage pointer -> [elements, tensors alive] (track_live)
        self._tensors = {}          # identity(tensor) -> (weak reference, storage pointer)

    def _profile_hook(self, frame, event, arg) -> None:
        """With forbidden callables: every Python call, torch ops or not (an allocator's
        bookkeeping reaches none), is checked against them. Records the refusal (raising in a
        profile function would switch it off); the call then fails on its violations. The
        harness's own calls (its globals are llmcheck's) are passed over before ``f_code`` is
        read: that read is an audit event (llmcheck/audit.py), and the recorder's bookkeeping
        makes a dozen calls per op."""
        if event == "call" and identity(frame.f_globals) not in _HARNESS_GLOBALS:
            code = frame.f_code
            if code.co_name in self.policy.code_names and code in self.policy.codes:
                name = getattr(code, "co_qualname", code.co_name)
                self.refuse(f"{frame.f_globals.get('__name__', '')}.{name}")

    def __enter__(self):
        if self.profile_hook is not None:
            self._outer_profile.append(sys.getprofile())
            sys.setprofile(self.profile_hook)
        if self.policy.functions:
            self._helpers.append(HelperRefusal(self))
            self._helpers[-1].__enter__()
        self._guards.append(RecorderGuard(self))
        self._guards[-1].__enter__()            # below the recorder on torch's mode stack
        self._entered_at.append(sys._getframe(1))
        return super().__enter__()

    def __exit__(self, exc_type, exc_val, exc_tb):
        if self.profile_hook is not None:
            sys.setprofile(self._outer_profile.pop())
        if self.policy.functions:
            self._helpers.pop().__exit__(exc_type, exc_val, exc_tb)
        exited = super().__exit__(exc_type, exc_val, exc_tb)
        self._guards.pop().__exit__(exc_type, exc_val, exc_tb)
        self._entered_at.pop()
        return exited

    def refuse(self, what: str, error: NotAllowedError | None = None) -> NotAllowedError:
        error = error if error is not None else self.policy.refusal(what)
        self.violations.append(str(error))
        return error

    def held(self, t: torch.Tensor) -> int:
        """Elements (of t's dtype) in t's storage; 0 for a call's input that kept its size."""
        try:
            storage = t.untyped_storage()
            pointer, size = storage.data_ptr(), storage.nbytes()
        except (RuntimeError, NotImplementedError):         # sparse, nested: no one storage
            return t.numel()
        if pointer in self.exempt and size <= self.exempt[pointer]:
            return 0
        return size // max(t.element_size(), 1)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        self.ops[f"aten.{name}"] += 1
        rows = 0
        if name in PRODUCT_OPS:
            rows, flops = _product_size(name, args)
            self.products += 1
            self.flops += flops
        policy = self.policy
        if name in policy.named:
            raise self.refuse(_op_words(name))
        if policy.autograd:
            running = autograd_at_work(name)
            if running is not None:
                raise self.refuse(running)
        if not policy.allows(func):
            what = _op_words(name)
            raise self.refuse(what, policy.unlisted(what))
        if policy.numpy and name in ("lift_fresh", "lift_fresh_copy", "lift"):
            tensor = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if tensor is not None and not tensor.untyped_storage().resizable():
                raise self.refuse("a tensor on NumPy's (or another library's) memory")
        if policy.words or policy.codes or policy.traced:
            where = forbidden_frame(policy, sys._getframe(1),
                                    self._entered_at[-1] if self._entered_at else None)
            if where is not None:
                raise self.refuse(where)
        given = op_tensors(args, kwargs)   # inside lists too (cat takes a list)
        if self.keep_calls:
            tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
            self.calls.append(TorchCall(name, tuple(tuple(t.shape) for t in tensors),
                                        tuple(_storage_pointer(t) for t in tensors), rows))
        self.dispatching += 1
        try:
            result = func(*args, **kwargs)
        finally:
            self.dispatching -= 1
        results = op_tensors(result)
        for t in results:
            self.produced.add(_storage_pointer(t))
        for t in (*given, *results):            # after the op: what resize_, out=, set_ grew
            elements = self.held(t)
            if elements > self.largest:
                self.largest, self.largest_shape = elements, tuple(t.shape)
                self.largest_op = f"aten.{name}"
            if self.track_live:
                self._track(t, elements)
        if self.track_live and self.live > self.peak_live:
            self.peak_live, self.peak_live_op = self.live, f"aten.{name}"
        return result

    def _track(self, t: torch.Tensor, elements: int) -> None:
        """Count ``t``'s storage among the live ones until no tensor seen on it is left."""
        pointer = _storage_pointer(t)
        if pointer == 0:
            return
        entry = self._storages.get(pointer)
        if entry is None:
            entry = self._storages[pointer] = [0, 0]
        if elements > entry[0]:                 # new, or grown in place
            self.live += elements - entry[0]
            entry[0] = elements
        key = identity(t)
        if key in self._tensors:
            return
        try:
            reference = weakref.ref(t, self._gone(key))
        except TypeError:                       # a tensor that takes no weak reference
            return
        self._tensors[key] = (reference, pointer)
        entry[1] += 1

    def _gone(self, key: int) -> Callable:
        def gone(_reference, owner_of=weakref.ref(self)):
            owner = owner_of()
            if owner is None:
                return
            _, pointer = owner._tensors.pop(key, (None, 0))
            entry = owner._storages.get(pointer)
            if entry is not None:
                entry[1] -= 1
                if entry[1] <= 0:
                    owner.live -= entry[0]
                    del owner._storages[pointer]
        return gone


class RecorderGuard(TorchDispatchMode):
    """Pushed just below its recorder: every op the recorder hands on reaches it, so an op that
    reaches it otherwise ran with the recorder taken off torch's mode stack (popped, then put
    back): a violation. It also checks the op against the policy it was given, so a recorder
    whose policy was swapped during the call is seen."""

    _should_skip_dynamo = OpRecorder._should_skip_dynamo

    def __init__(self, recorder: "OpRecorder"):
        super().__init__()
        self.recorder = recorder
        self.policy = recorder.policy

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        recorder = self.recorder
        name = func.overloadpacket.__name__
        if not recorder.dispatching:
            recorder.violations.append(
                f"aten.{name} reached torch without passing the op recorder (taken off torch's "
                "mode stack, or its dispatch replaced), so the test could not see what it "
                "computed")
        elif recorder.policy is not self.policy and not self.policy.allows(func):
            recorder.violations.append(f"aten.{name} ran under a policy other than the test's")
        return func(*args, **(kwargs or {}))


class HelperRefusal(TorchFunctionMode):
    """Refuses the policy's torch API functions (``policy.functions``) by identity, at torch's
    Python API, whatever reference the learner's code holds (``torch.quantile`` kept in a
    variable before the call is the same function): helpers whose aten ops the allowlist allows."""

    def __init__(self, recorder: "OpRecorder"):
        super().__init__()
        self.recorder = recorder
        self.refused = {}
        for name in recorder.policy.functions:
            self.refused.setdefault(resolve_function(name), name)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = self.refused.get(func) if _hashable(func) else None
        if name is not None:
            raise self.recorder.refuse(f"{name} (a library helper that does what this exercise "
                                       "asks you to write)")
        return func(*args, **(kwargs or {}))


def _hashable(value) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


_warm = False
_HARNESS_GLOBALS: frozenset[int] = frozenset()
"""identity() of the namespace of every llmcheck module (taken at the first recorder): code running
in one of them is the harness's, never a forbidden callable."""


def warm_up() -> None:
    """Dispatch ops through a mode, once per process, before any recorder is entered: whatever
    torch imports lazily on a mode's first dispatch (torch._dynamo, for a mode whose dispatch it
    wraps; its import runs NumPy functions) must not meet the refusing stand-ins (nor count as
    the learner's)."""
    global _warm, _HARNESS_GLOBALS
    if not _warm:
        _warm = True
        package = os.path.join(sys.modules[__package__].__path__[0], "")
        namespaces = [vars(module) for module in list(sys.modules.values())
                      if (getattr(module, "__file__", None) or "").startswith(package)]
        # a sealed harness's functions run over private copies of these (llmcheck/seal.py)
        _HARNESS_GLOBALS = frozenset(
            {identity(namespace) for namespace in namespaces}
            | {identity(value.__globals__) for namespace in namespaces
               for value in list(namespace.values()) if isinstance(value, types.FunctionType)})
        with OpRecorder():
            torch.ones(2).softmax(-1) @ torch.ones(2)


@contextlib.contextmanager
def forbid(*targets: str | Allow | Callable, hint: str = "") -> Iterator[OpRecorder]:
    """Inside the block, reaching any target raises :class:`NotAllowedError` with a clear message.

    targets:
      ``"aten.NAME"``     the aten op NAME, however it is reached (``"aten.mm"`` covers ``@``,
                          torch.matmul, torch.mm, torch.ops.aten.mm, torch.linalg.matmul, ...);
      ``"llmcore.WORD"``  every llmcore function whose name contains WORD, called directly or
                          through any other function (the NumPy reference twins included);
      ``"numpy"``         every NumPy function, and tensors handed to or taken from NumPy;
      ``"autograd"``      every op autograd runs (backward engine, forward AD, ``*_backward*``);
      ``Allow(families)`` every aten op outside those :data:`FAMILIES` (PRODUCTS, SOFTMAXES,
                          ATTENTIONS and AUTOGRAD each hold one; several intersect);
      a callable          that very function or method (for example ``Attention.forward``);
                          a class or module: every function it defines;
      ``CodeOf("MODULE")`` every function the module of that name defines, imported when the
                          policy is made (``PAGING`` holds llmcore's three paging modules).
    hint: a sentence added to the message, saying what to use instead.

    ``with forbid(*SOFTMAXES, hint="Use torch.exp, amax and sum."): got = softmax_rows(x)``.
    """
    recorder = OpRecorder(Policy.of(targets, hint))
    with blocked(recorder), recorder:         # the stand-ins swapped outside the profile hook
        yield recorder


@contextlib.contextmanager
def watch_torch_calls() -> Iterator[list[TorchCall]]:
    """Record every aten op reached inside the block, in order (whatever Python path led there).

    >>> with watch_torch_calls() as calls:
    ...     y = torch.ones(3, 2) @ torch.ones(2, 4)
    >>> [c.name for c in calls if c.is_product]
    ['mm']
    """
    recorder = OpRecorder(keep_calls=True)
    with recorder:
        yield recorder.calls
