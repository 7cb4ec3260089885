"""Which operations a computation reaches: record every aten op, refuse the forbidden ones.

The exercises ask learners to compute something themselves (a matrix product by loops, a softmax,
attention). Whatever Python path a computation takes (``@``, ``torch.matmul``, an alias,
``torch.ops.aten.mm``, ``torch.linalg``, ``einsum``, a method), it ends in aten operations, and a
:class:`~torch.utils._python_dispatch.TorchDispatchMode` sees every one of them. :class:`OpRecorder`
counts them (and the matrix products' rows and FLOPs), and refuses those a :class:`Policy` names,
as well as llmcore's own implementations (seen on the Python stack), NumPy (every NumPy function,
and the conversions between tensors and arrays) and any Python callable named. :func:`forbid` and
:func:`watch_torch_calls` are the learner-facing forms; ``llmcheck.cases.Test`` uses the recorder
to publish what a test's call reached, for the grader to judge outside the kernel
(course/grading/VERDICTS.md). Chapters 2-4 and 7 and their exercises.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import types
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

PRODUCT_OPS = frozenset({
    "mm", "bmm", "addmm", "addbmm", "baddbmm", "mv", "addmv", "dot", "vdot", "addr", "_int_mm",
    "_scaled_mm", "convolution", "_convolution", "mkldnn_convolution", "cudnn_convolution",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_efficient_attention_forward", "_flash_attention_forward", "_fused_sdp_choice",
    "_native_multi_head_attention", "_addmm_activation",
})
"""Every aten op that multiplies matrices or vectors: what ``@``, matmul, einsum, tensordot,
F.linear, torch.linalg.matmul/vecdot/multi_dot and the fused attention kernels end in."""

FUSED_ATTENTION_OPS = frozenset({
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_efficient_attention_forward", "_flash_attention_forward", "_native_multi_head_attention",
    "_safe_softmax", "_scaled_dot_product_attention_math",
})

PRODUCTS = (*(f"aten.{op}" for op in sorted(PRODUCT_OPS)),
            "llmcore.dot", "llmcore.matmul", "llmcore.linear", "numpy")
"""Every way to have a library multiply vectors or matrices for you: every aten product op
(``@``, torch.matmul, torch.ops.aten.mm, einsum, torch.linalg, F.linear all reach one), llmcore's
dot/matmul/linear functions, and NumPy. For exercises that ask for the product written as loops."""

SOFTMAXES = ("aten._softmax", "aten._log_softmax", "aten._safe_softmax", "aten.softmax",
             "aten.log_softmax", "llmcore.softmax", "numpy")
"""torch's softmax in all its spellings (torch.softmax, F.softmax, Tensor.softmax, nn.Softmax,
log-softmax, the one inside fused attention), every llmcore function with softmax in its name
(the NumPy reference included), and NumPy."""

ATTENTIONS = (*(f"aten.{op}" for op in sorted(FUSED_ATTENTION_OPS)), "llmcore.attention",
              "numpy")
"""torch's fused attention (F.scaled_dot_product_attention, nn.MultiheadAttention's fast path),
every llmcore function with attention in its name, and NumPy."""

AUTOGRAD = ("autograd", "llmcore.backward", "llmcore.jacobian", "numpy")
"""Every way to have a library differentiate for you: torch's autograd (``"autograd"``: any op
run by the backward engine, which torch.autograd.grad, Tensor.backward, torch.func.grad/vjp/jacrev
and torch.autograd.functional all reach; any op under forward-mode AD, as in torch.func.jvp/jacfwd;
any aten op named ``*_backward*``, such as ``_softmax_backward_data`` called directly), llmcore's
backward functions and its softmax Jacobian, and NumPy."""

_EXEMPT_MODULES = ("llmcore.testing",)
"""llmcore modules whose functions a test may always call (they compare, they compute nothing)."""

_LLMCORE_DIR = os.path.dirname(os.path.abspath(__import__("llmcore").__file__))


class NotAllowedError(AssertionError):
    """A function under test reached a library's own implementation of what it should compute."""


@dataclass(frozen=True)
class Policy:
    """What a call may not reach.

    ops: aten op names (``"mm"``); words: llmcore function-name words (``"softmax"``); numpy:
    refuse NumPy and the conversions between tensors and arrays; codes: code objects of Python
    callables (``Attention.forward``); hint: a sentence added to each refusal.
    """

    ops: frozenset[str] = frozenset()
    words: tuple[str, ...] = ()
    numpy: bool = False
    codes: frozenset = frozenset()
    callables: tuple[str, ...] = ()
    hint: str = ""
    autograd: bool = False      # refuse autograd's work: backward engine, forward AD, *_backward*

    @classmethod
    def of(cls, targets: Sequence, hint: str = "") -> "Policy":
        """Parse ``forbid`` targets: ``"aten.NAME"``, ``"llmcore.WORD"``, ``"numpy"``, callables."""
        names = [t for t in targets if isinstance(t, str)]
        unknown = [t for t in names if not (t.startswith(("aten.", "llmcore."))
                                            or t in ("numpy", "autograd"))]
        if unknown:
            raise ValueError(f"forbid: targets must be 'aten.OP', 'llmcore.WORD', 'numpy', "
                             f"'autograd' or callables, got {unknown}")
        callables = [t for t in targets if not isinstance(t, str)]
        codes = [code for c in callables for code in _codes_of(c)]
        return cls(ops=frozenset(t.split(".", 1)[1] for t in names if t.startswith("aten.")),
                   words=tuple(t.split(".", 1)[1] for t in names if t.startswith("llmcore.")),
                   numpy="numpy" in names, codes=frozenset(codes),
                   callables=tuple(getattr(c, "__qualname__", None) and
                                   f"{c.__module__}.{c.__qualname__}" or c.__name__
                                   for c in callables),
                   hint=hint, autograd="autograd" in names)

    def describe(self) -> dict:
        """The policy as JSON-ready data (what a record states)."""
        return {"ops": sorted(f"aten.{op}" for op in self.ops), "llmcore": list(self.words),
                "numpy": self.numpy, "callables": list(self.callables),
                **({"autograd": True} if self.autograd else {})}

    def refusal(self, what: str) -> NotAllowedError:
        hint = f" {self.hint}" if self.hint else ""
        return NotAllowedError(f"{what} was used, but this exercise asks you to compute it "
                               f"yourself; the library's own version is not allowed here.{hint}")


def _codes_of(target, depth: int = 0) -> list:
    """The code objects a callable target stands for: a function's (or method's) own; every
    function, method and property of a class; every function and class a module defines (not the
    names it imports). ``forbid(llmcore.paged)`` refuses all of llmcore's paging code."""
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
        return [code for value in members for code in _codes_of(value, depth + 1)
                if code.co_filename == source]
    if depth == 0:
        raise ValueError(f"forbid: {target!r} is not a Python function, class or module")
    return []


def _is_library_name(module: str, name: str, words: Sequence[str]) -> bool:
    """An llmcore function named with one of the words; private helpers and argument checks
    (``_check_attention_inputs``, ``check_attention_mask``) compute nothing and do not count."""
    return (module.startswith("llmcore.") and module not in _EXEMPT_MODULES
            and not name.startswith(("_", "check")) and any(word in name for word in words))


def _forbidden_frame(policy: Policy, frame) -> str | None:
    """The outermost frame on the stack that runs forbidden code, as 'module.function'."""
    outermost = None
    while frame is not None:
        code = frame.f_code
        module = frame.f_globals.get("__name__", "") or ""
        if code in policy.codes or (policy.words and (
                _is_library_name(module, code.co_name, policy.words) or
                (code.co_filename.startswith(_LLMCORE_DIR) and module not in _EXEMPT_MODULES
                 and _is_library_name("llmcore.copy", code.co_name, policy.words)))):
            outermost = f"{module}.{getattr(code, 'co_qualname', code.co_name)}"
        frame = frame.f_back
    return outermost


def _autograd_at_work(name: str) -> str | None:
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


def _tensor_arguments(args, kwargs) -> list[torch.Tensor]:
    """The tensors among an op's arguments, inside lists too (``cat`` takes a list)."""
    found = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            found.append(a)
        elif isinstance(a, (list, tuple)):
            found.extend(t for t in a if isinstance(t, torch.Tensor))
    return found


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


@dataclass
class OpRecorder(TorchDispatchMode):
    """Records every aten op reached inside the block and refuses what ``policy`` forbids.

    ops: op name -> count; products, flops: matrix-product ops and their FLOPs; calls: each op
    (kept only when ``keep_calls``); violations: a sentence for each refusal; largest,
    largest_shape, largest_op: the most elements of any tensor an op allocated (a result that is
    not a view of one of its arguments), its shape and the op. A refused op raises
    :class:`NotAllowedError` (which the caller's code may catch: the violation stays recorded).
    """

    policy: Policy = field(default_factory=Policy)
    keep_calls: bool = False
    ops: Counter = field(default_factory=Counter)
    products: int = 0
    flops: int = 0
    calls: list = field(default_factory=list)
    violations: list = field(default_factory=list)
    produced: set = field(default_factory=set)      # storage pointers of every op's results
    largest: int = 0                                # elements of the largest tensor allocated
    largest_shape: tuple = ()
    largest_op: str = ""

    def __post_init__(self):
        super().__init__()
        _warm_up()
        self.profile_hook = self._profile_hook if self.policy.codes else None
        self._outer_profile = []

    def _profile_hook(self, frame, event, arg) -> None:
        """With forbidden callables: every Python call, torch ops or not (an allocator's
        bookkeeping reaches none), is checked against them. Records the refusal (raising in a
        profile function would switch it off); the call then fails on its violations."""
        if event == "call" and frame.f_code in self.policy.codes:
            name = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
            self.refuse(f"{frame.f_globals.get('__name__', '')}.{name}")

    def __enter__(self):
        if self.profile_hook is not None:
            self._outer_profile.append(sys.getprofile())
            sys.setprofile(self.profile_hook)
        return super().__enter__()

    def __exit__(self, exc_type, exc_val, exc_tb):
        if self.profile_hook is not None:
            sys.setprofile(self._outer_profile.pop())
        return super().__exit__(exc_type, exc_val, exc_tb)

    def refuse(self, what: str) -> NotAllowedError:
        error = self.policy.refusal(what)
        self.violations.append(str(error))
        return error

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        self.ops[f"aten.{name}"] += 1
        rows = 0
        if name in PRODUCT_OPS:
            rows, flops = _product_size(name, args)
            self.products += 1
            self.flops += flops
        if name in self.policy.ops:
            raise self.refuse(f"torch's {name} (aten.{name}, which @, matmul, einsum, "
                              "torch.linalg and their aliases reach)" if name in PRODUCT_OPS
                              else f"torch's {name} (aten.{name})")
        if self.policy.autograd:
            running = _autograd_at_work(name)
            if running is not None:
                raise self.refuse(running)
        if self.policy.numpy and name in ("lift_fresh", "lift_fresh_copy", "lift"):
            tensor = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if tensor is not None and not tensor.untyped_storage().resizable():
                raise self.refuse("a tensor on NumPy's (or another library's) memory")
        if self.policy.words or self.policy.codes:
            where = _forbidden_frame(self.policy, sys._getframe(1))
            if where is not None:
                raise self.refuse(where)
        if self.keep_calls:
            tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
            self.calls.append(TorchCall(name, tuple(tuple(t.shape) for t in tensors),
                                        tuple(_storage_pointer(t) for t in tensors), rows))
        result = func(*args, **kwargs)
        given = None
        for t in (result if isinstance(result, (tuple, list)) else (result,)):
            if isinstance(t, torch.Tensor):
                self.produced.add(_storage_pointer(t))
                if t.numel() > self.largest:
                    if given is None:           # storages of the arguments: a view allocates none
                        given = {_storage_pointer(a) for a in _tensor_arguments(args, kwargs)}
                    if _storage_pointer(t) not in given or name.startswith("lift"):
                        self.largest, self.largest_shape = t.numel(), tuple(t.shape)
                        self.largest_op = f"aten.{name}"
        return result


_NUMPY_API = ("numpy", "numpy.linalg", "numpy.fft", "numpy.emath", "numpy.polynomial",
              "numpy.lib.stride_tricks")


def _numpy_callables() -> list[tuple[object, str, object]]:
    """(module, name, function) for every public NumPy function and ufunc, wherever a loaded NumPy
    module holds it (``numpy._core.multiarray.dot`` is ``numpy.dot``). NumPy's internal helpers
    stay: torch imports NumPy modules lazily, and their import runs those helpers."""
    import importlib
    public = {}
    for name in _NUMPY_API:
        with contextlib.suppress(ImportError):
            module = importlib.import_module(name)
            for attr, value in list(vars(module).items()):
                if callable(value) and not isinstance(value, (type, types.ModuleType)) \
                        and not attr.startswith("_"):
                    public[id(value)] = value
    found = []
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "numpy" or name.startswith("numpy.")):
            continue
        for attr, value in list(vars(module).items()):
            if id(value) in public and not attr.startswith("__"):
                found.append((module, attr, value))
    return found


def _llmcore_functions(words: Sequence[str]) -> list[tuple[object, str, object]]:
    found = []
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "llmcore" or name.startswith("llmcore.")) \
                or name in _EXEMPT_MODULES:
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, types.FunctionType) and _is_library_name(
                    getattr(value, "__module__", "") or "", value.__name__, words):
                found.append((module, attr, value))
    return found


_CONVERSIONS = ("from_numpy", "as_tensor", "asarray", "tensor", "frombuffer", "from_dlpack")
"""torch's functions that make a tensor from an array (refused for arrays when NumPy is)."""


_warm = False


def _warm_up() -> None:
    """Dispatch ops through a mode, once per process, before any recorder is entered: the first
    dispatch imports torch._dynamo, whose import runs NumPy functions, which must not meet the
    refusing stand-ins (nor count as the learner's)."""
    global _warm
    if not _warm:
        _warm = True
        with OpRecorder():
            torch.ones(2).softmax(-1) @ torch.ones(2)


@contextlib.contextmanager
def blocked(recorder: OpRecorder) -> Iterator[dict]:
    """Swap what the recorder's policy forbids but no aten op reveals for refusing stand-ins:
    llmcore's functions named by the policy (the NumPy reference twins compute without torch),
    every NumPy function (when the policy forbids NumPy), ``Tensor.numpy``/``__array__`` and the
    array -> tensor conversions; in their modules, in ``__main__`` and in llmcore's modules.
    Yields {id(stand-in): original} (the canaries check they are still in place)."""
    policy = recorder.policy
    originals: dict[int, tuple[object, str]] = {}          # id(original) -> description
    patches: list[tuple[object, str, object]] = []

    def stand_in(what: str, original):
        def refusing(*args, **kwargs):
            raise recorder.refuse(what)
        refusing.__name__ = getattr(original, "__name__", "refused")
        return refusing

    def convert_checked(what: str, original):
        import numpy
        def converting(data, *args, **kwargs):
            if isinstance(data, numpy.ndarray) or hasattr(data, "__array_interface__") \
                    or hasattr(data, "__dlpack__") and not isinstance(data, torch.Tensor):
                raise recorder.refuse(what)
            return original(data, *args, **kwargs)
        converting.__name__ = original.__name__
        return converting

    found = _llmcore_functions(policy.words) if policy.words else []
    for module, attr, value in found:
        originals[id(value)] = (stand_in(f"{value.__module__}.{value.__qualname__}", value), attr)
    if policy.numpy:
        for module, attr, value in _numpy_callables():
            if id(value) not in originals:
                originals[id(value)] = (stand_in(f"numpy's {attr}", value), attr)
            found.append((module, attr, value))
        for attr in _CONVERSIONS:
            value = getattr(torch, attr, None)
            if value is not None:
                originals[id(value)] = (convert_checked(f"torch.{attr} of an array", value), attr)
                found.append((torch, attr, value))
        for attr in ("numpy", "__array__"):
            value = getattr(torch.Tensor, attr)
            originals[id(value)] = (stand_in(f"Tensor.{attr}() (a tensor handed to NumPy)",
                                             value), attr)
            found.append((torch.Tensor, attr, value))
    namespaces = [sys.modules.get("__main__")] + [
        m for name, m in list(sys.modules.items()) if m is not None
        and (name == "llmcore" or name.startswith("llmcore.")) and name not in _EXEMPT_MODULES]
    for namespace in namespaces:
        if namespace is None:
            continue
        for attr, value in list(vars(namespace).items()):
            if id(value) in originals:
                found.append((namespace, attr, value))
    seen = set()
    for owner, attr, value in found:
        if (id(owner), attr) in seen:
            continue
        seen.add((id(owner), attr))
        patches.append((owner, attr, value))
        setattr(owner, attr, originals[id(value)][0])
    try:
        yield {id(originals[id(v)][0]): (o, a) for o, a, v in patches}
    finally:
        for owner, attr, original in reversed(patches):
            setattr(owner, attr, original)


@contextlib.contextmanager
def forbid(*targets: str | Callable, hint: str = "") -> Iterator[OpRecorder]:
    """Inside the block, reaching any target raises :class:`NotAllowedError` with a clear message.

    targets:
      ``"aten.NAME"``     the aten op NAME, however it is reached (``"aten.mm"`` covers ``@``,
                          torch.matmul, torch.mm, torch.ops.aten.mm, torch.linalg.matmul, ...);
      ``"llmcore.WORD"``  every llmcore function whose name contains WORD, called directly or
                          through any other function (the NumPy reference twins included);
      ``"numpy"``         every NumPy function, and tensors handed to or taken from NumPy;
      ``"autograd"``      every op autograd runs (backward engine, forward AD, ``*_backward*``);
      a callable          that very function or method (for example ``Attention.forward``);
                          a class or module: every function it defines (``llmcore.paged``).
    hint: a sentence added to the message, saying what to use instead.

    ``with forbid(*SOFTMAXES, hint="Use torch.exp, amax and sum."): got = softmax_rows(x)``.
    """
    recorder = OpRecorder(Policy.of(targets, hint))
    with recorder, blocked(recorder):
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
