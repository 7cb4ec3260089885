"""Blocking what no aten op reveals: llmcore's named functions, NumPy, and arrays made tensors.

A policy that forbids NumPy, or llmcore functions by name (the NumPy reference twins compute
without torch), cannot rely on the op recorder alone: :func:`blocked` swaps those functions for
refusing stand-ins for the duration of a call, in their own modules, in ``__main__`` and in
llmcore's modules, and yields where it put them (the tamper canaries check they stay).
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import types
from typing import Iterator, Protocol, Sequence

import torch

from .identity import identity
from .policy import EXEMPT_MODULES, NotAllowedError, Policy, is_library_name


class Refuser(Protocol):
    """What :func:`blocked` asks of a recorder (``llmcheck.recorder.OpRecorder``)."""

    policy: Policy

    def refuse(self, what: str) -> NotAllowedError:
        """Record the refusal of ``what`` and return the error to raise."""


_NUMPY_API = ("numpy", "numpy.linalg", "numpy.fft", "numpy.emath", "numpy.polynomial",
              "numpy.lib.stride_tricks")


def _numpy_callables() -> list[tuple[object, str, object]]:
    """(module, name, function) for every public NumPy function and ufunc, wherever a loaded NumPy
    module holds it (``numpy._core.multiarray.dot`` is ``numpy.dot``). NumPy's internal helpers
    stay: torch imports NumPy modules lazily, and their import runs those helpers."""
    public = {}
    for name in _NUMPY_API:
        with contextlib.suppress(ImportError):
            module = importlib.import_module(name)
            for attr, value in list(vars(module).items()):
                if callable(value) and not isinstance(value, (type, types.ModuleType)) \
                        and not attr.startswith("_"):
                    public[identity(value)] = value
    found = []
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "numpy" or name.startswith("numpy.")):
            continue
        for attr, value in list(vars(module).items()):
            if identity(value) in public and not attr.startswith("__"):
                found.append((module, attr, value))
    return found


def _llmcore_functions(words: Sequence[str]) -> list[tuple[object, str, object]]:
    found = []
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "llmcore" or name.startswith("llmcore.")) \
                or name in EXEMPT_MODULES:
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, types.FunctionType) and is_library_name(
                    getattr(value, "__module__", "") or "", value.__name__, words):
                found.append((module, attr, value))
    return found


_CONVERSIONS = ("from_numpy", "as_tensor", "asarray", "tensor", "frombuffer", "from_dlpack")
"""torch's functions that make a tensor from an array (refused for arrays when NumPy is)."""


@contextlib.contextmanager
def blocked(recorder: Refuser) -> Iterator[dict]:
    """Swap what the recorder's policy forbids but no aten op reveals for refusing stand-ins:
    llmcore's functions named by the policy (the NumPy reference twins compute without torch),
    every NumPy function (when the policy forbids NumPy), ``Tensor.numpy``/``__array__`` and the
    array -> tensor conversions; in their modules, in ``__main__`` and in llmcore's modules.
    Yields {identity(stand-in): original} (the canaries check they are still in place)."""
    policy = recorder.policy
    originals: dict[int, tuple[object, str]] = {}          # identity(original) -> description
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
        originals[identity(value)] = (
            stand_in(f"{value.__module__}.{value.__qualname__}", value), attr)
    if policy.numpy:
        for module, attr, value in _numpy_callables():
            if identity(value) not in originals:
                originals[identity(value)] = (stand_in(f"numpy's {attr}", value), attr)
            found.append((module, attr, value))
        for attr in _CONVERSIONS:
            value = getattr(torch, attr, None)
            if value is not None:
                originals[identity(value)] = (
                    convert_checked(f"torch.{attr} of an array", value), attr)
                found.append((torch, attr, value))
        for attr in ("numpy", "__array__"):
            value = getattr(torch.Tensor, attr)
            originals[identity(value)] = (stand_in(f"Tensor.{attr}() (a tensor handed to NumPy)",
                                             value), attr)
            found.append((torch.Tensor, attr, value))
    namespaces = [sys.modules.get("__main__")] + [
        m for name, m in list(sys.modules.items()) if m is not None
        and (name == "llmcore" or name.startswith("llmcore.")) and name not in EXEMPT_MODULES]
    for namespace in namespaces:
        if namespace is None:
            continue
        for attr, value in list(vars(namespace).items()):
            if identity(value) in originals:
                found.append((namespace, attr, value))
    seen = set()
    for owner, attr, value in found:
        if (identity(owner), attr) in seen:
            continue
        seen.add((identity(owner), attr))
        patches.append((owner, attr, value))
        setattr(owner, attr, originals[identity(value)][0])
    try:
        yield {identity(originals[identity(v)][0]): (o, a) for o, a, v in patches}
    finally:
        for owner, attr, original in reversed(patches):
            setattr(owner, attr, original)
