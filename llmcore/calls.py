"""Which library calls a computation makes: forbid some, record all.

The exercises ask learners to compute something themselves (a matrix product by loops, a softmax,
attention); their test cells use :func:`forbid` so that calling the library's own implementation
fails with a message that says what to use instead, and :func:`watch_torch_calls` to see which
torch operations a function ran (one matrix product for all tokens, not one per token).
Chapters 2-4 and 7 and their exercises.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import sys
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch
from torch.overrides import TorchFunctionMode

PRODUCTS = (
    "torch.matmul", "torch.mm", "torch.bmm", "torch.mv", "torch.dot", "torch.vdot", "torch.inner",
    "torch.einsum", "torch.tensordot", "torch.addmm", "torch.addmv", "torch.addbmm",
    "torch.baddbmm", "torch.linear", "torch.bilinear", "torch.chain_matmul", "torch.multi_dot",
    "torch.vecdot", "torch.__matmul__", "torch.__rmatmul__", "torch.__imatmul__",
    "numpy.dot", "numpy.matmul", "numpy.inner", "numpy.vdot", "numpy.einsum", "numpy.tensordot",
    "numpy.linalg.multi_dot",
    "llmcore.dot", "llmcore.matmul", "llmcore.linear",
)
"""Every way to have a library multiply vectors or matrices for you: torch's products (``@``
included), NumPy's, and llmcore's own dot/matmul/linear functions. For exercises that ask for
the product written out as loops."""

SOFTMAXES = (
    "torch.softmax", "torch.log_softmax", "torch._softmax", "torch._log_softmax",
    "torch.special_softmax", "torch.special_log_softmax", "torch.gumbel_softmax",
    "llmcore.softmax",
)
"""torch's softmax in all its spellings (torch.softmax, F.softmax, Tensor.softmax, nn.Softmax,
log-softmax) and every llmcore function with softmax in its name."""

ATTENTIONS = (
    "torch.scaled_dot_product_attention", "torch.multi_head_attention_forward",
    "llmcore.attention",
)
"""torch's fused attention, nn.MultiheadAttention, and every llmcore function with attention in
its name (attention, attention_loop, multihead_attention, ...)."""

_PRODUCT_OPS = frozenset(name.split(".", 1)[1] for name in PRODUCTS if name.startswith("torch."))

_EXEMPT_MODULES = ("llmcore.calls", "llmcore.testing")
"""llmcore modules whose functions a test may always call (they compare, they compute nothing)."""


class NotAllowedError(AssertionError):
    """A function under test called a library's own implementation of what it should compute."""


def _torch_op_name(func) -> str:
    return getattr(func, "__name__", "") or ""


def _is_library_name(module: str, name: str, words: Sequence[str]) -> bool:
    """An llmcore function named with one of the words; private helpers and argument checks
    (``_check_attention_inputs``, ``check_attention_mask``) compute nothing and do not count."""
    return (module.startswith("llmcore.") and module not in _EXEMPT_MODULES
            and not name.startswith(("_", "check")) and any(word in name for word in words))


def _is_library_function(obj, words: Sequence[str]) -> bool:
    return inspect.isfunction(obj) and _is_library_name(getattr(obj, "__module__", None) or "",
                                              getattr(obj, "__name__", "") or "", words)


def _is_library_code(code, module_globals: dict, words: Sequence[str]) -> bool:
    return _is_library_name(module_globals.get("__name__", "") or "", code.co_name, words)


def _resolve(dotted: str):
    """'numpy.linalg.multi_dot' -> (module object, attribute name), or None if absent."""
    module_name, _, attr = dotted.rpartition(".")
    module = sys.modules.get(module_name)
    if module is None:
        with contextlib.suppress(ImportError):
            module = __import__(module_name, fromlist=["_"])
    if module is None or not hasattr(module, attr):
        return None
    return module, attr


@contextlib.contextmanager
def forbid(*targets: str | Callable, hint: str = "") -> Iterator[None]:
    """Inside the block, calling any target raises :class:`NotAllowedError` with a clear message.

    targets:
      ``"torch.NAME"``    every torch function or Tensor method called NAME, however it is
                          reached (``torch.softmax``, ``F.softmax``, ``x.softmax``, ``nn.Softmax``;
                          ``"torch.matmul"`` also covers ``a @ b``);
      ``"llmcore.WORD"``  every llmcore function whose name contains WORD, called directly or
                          through any other function;
      ``"numpy.NAME"``    that NumPy function;
      a callable          that very function or method (for example ``Attention.forward``).
    hint: a sentence added to the message, saying what to use instead.

    Used by the exercises' test cells:
    ``with forbid(*SOFTMAXES, hint="Use torch.exp, amax and sum."): got = softmax_rows(x)``.
    """
    names = [t for t in targets if isinstance(t, str)]
    unknown = [t for t in names if not t.startswith(("torch.", "llmcore.", "numpy."))]
    if unknown:
        raise ValueError(f"forbid: targets must start with 'torch.', 'llmcore.' or 'numpy.' (or be "
                         f"callables), got {unknown}")
    torch_ops = {t.split(".", 1)[1] for t in names if t.startswith("torch.")}
    words = tuple(t.split(".", 1)[1] for t in names if t.startswith("llmcore."))
    numpy_names = [t for t in names if t.startswith("numpy.")]
    callables = [t for t in targets if not isinstance(t, str)]
    codes = {getattr(c, "__code__", None) for c in callables} - {None}
    objects = {id(c): c for c in callables}
    hint = f" {hint}" if hint else ""

    def refuse(what: str) -> NotAllowedError:
        return NotAllowedError(f"{what} was called, but this exercise asks you to compute it "
                               f"yourself; the library's own version is not allowed here.{hint}")

    def check_stack() -> None:
        outermost, frame = None, sys._getframe(2)
        while frame is not None:
            code = frame.f_code
            if code in codes or (words and _is_library_code(code, frame.f_globals, words)):
                name = getattr(code, "co_qualname", code.co_name)      # Python 3.11+
                outermost = f"{frame.f_globals.get('__name__')}.{name}"
            frame = frame.f_back
        if outermost is not None:
            raise refuse(outermost)

    class Refuse(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = _torch_op_name(func)
            if name in torch_ops or id(func) in objects:
                raise refuse(f"torch's {name}" if name in torch_ops else name)
            if words or codes:
                check_stack()
            return func(*args, **(kwargs or {}))

    # Functions that may run without any torch call (NumPy, the llmcore reference twins) are
    # swapped for a refusing stand-in wherever a student could reach them by name.
    def stand_in(what: str):
        def refusing(*args, **kwargs):
            raise refuse(what)
        return refusing

    patches: list[tuple[object, str, object]] = []
    namespaces = [m for name, m in list(sys.modules.items()) if m is not None
                  and (name == "llmcore" or name.startswith("llmcore."))
                  and name not in _EXEMPT_MODULES]
    main = sys.modules.get("__main__")
    for dotted in numpy_names:
        found = _resolve(dotted)
        if found is not None:
            module, attr = found
            original = getattr(module, attr)
            patches.append((module, attr, original))
            objects[id(original)] = original
    for namespace in [*namespaces, main]:
        if namespace is None:
            continue
        for attr, value in list(vars(namespace).items()):
            if id(value) in objects or (words and _is_library_function(value, words)):
                patches.append((namespace, attr, value))
    for owner, attr, original in patches:
        what = (f"{getattr(original, '__module__', None) or 'numpy'}."
                f"{getattr(original, '__name__', attr)}")
        setattr(owner, attr, stand_in(what))
    try:
        with Refuse():
            yield
    finally:
        for owner, attr, original in reversed(patches):
            setattr(owner, attr, original)


def _storage_pointer(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


@dataclass(frozen=True)
class TorchCall:
    """One torch function call: its name, its tensor arguments' shapes and storage pointers."""

    name: str
    shapes: tuple[tuple[int, ...], ...]
    storages: tuple[int, ...]

    @property
    def is_product(self) -> bool:
        """A matrix or vector product (``@``, matmul, mm, einsum, linear, ...)."""
        return self.name in _PRODUCT_OPS

    @property
    def rows(self) -> int:
        """Rows (tokens) of the first tensor argument: every dimension but the last."""
        return math.prod(self.shapes[0][:-1]) if self.shapes else 0

    def uses(self, t: torch.Tensor) -> bool:
        """Whether ``t`` (or a view of its memory, such as its transpose) was an argument."""
        pointer = _storage_pointer(t)
        return pointer != 0 and pointer in self.storages


@contextlib.contextmanager
def watch_torch_calls() -> Iterator[list[TorchCall]]:
    """Record every torch function call made inside the block, in order.

    >>> with watch_torch_calls() as calls:
    ...     y = torch.ones(3, 2) @ torch.ones(2, 4)
    >>> [c.name for c in calls if c.is_product]
    ['matmul']
    """
    calls: list[TorchCall] = []

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            tensors = [a for a in (*args, *(kwargs or {}).values()) if isinstance(a, torch.Tensor)]
            name = _torch_op_name(func)
            if name != "__get__":
                calls.append(TorchCall(name, tuple(tuple(t.shape) for t in tensors),
                                       tuple(_storage_pointer(t) for t in tensors)))
            return func(*args, **(kwargs or {}))

    with Watch():
        yield calls
