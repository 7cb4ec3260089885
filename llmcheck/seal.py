"""Sealed namespaces: the harness's code runs over private copies of its modules' globals.

A learner's code can reach any module by name (``__import__`` of a string it builds) and rebind
its attributes: ``llmcheck.recorder.PRODUCT_OPS = frozenset()`` for the length of one call, put
back before the call returns, would stop products being counted, and no check made before or
after the call could tell. :func:`seal`, run by the grader's kernel when it starts (before the
audit hook and before any learner code), gives every function of the harness a private copy of
its module's namespace, taken then, so that what the harness's code reads (its tables, its
helpers, the other modules' functions it imported) no longer depends on the module's attributes:

- every function defined in an ``llmcheck`` module is replaced by a clone whose ``__globals__``
  is that module's private copy (methods of the module's classes too, static and class methods,
  properties, ``functools.lru_cache`` and ``contextlib.contextmanager`` wrappers rebuilt around
  their clones);
- the modules' namespaces and the private copies both hold the clones, so code outside the
  harness that calls ``llmcheck.fresh.receive(...)`` runs the same clone, whose ``global``
  writes land in the private copy that the harness's other functions read.

Rebinding a module attribute afterwards changes only the module's namespace, which the harness
no longer reads (``llmcheck.integrity.rebinding_check`` still reports it). Reaching a private copy
takes a function's ``__globals__`` or a ``gc`` walk, both audit events (llmcheck/audit.py). The
tables themselves are read-only (``MappingProxyType``, ``frozenset``, tuples), so they cannot be
changed in place either. Outside a graded kernel (tests, chapters) nothing is sealed.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import pkgutil
import sys
import types

_CONTEXT_MANAGER_CODE = contextlib.contextmanager(lambda: iter(())).__code__
"""The code of the wrapper ``contextlib.contextmanager`` returns (the same for every one)."""


def _harness_modules(package: str) -> dict[str, types.ModuleType]:
    root = importlib.import_module(package)
    for info in pkgutil.iter_modules(root.__path__):
        importlib.import_module(f"{package}.{info.name}")
    return {name: module for name, module in list(sys.modules.items())
            if module is not None and (name == package or name.startswith(package + "."))}


class _Sealer:
    """The clones of one seal: each harness function once, whatever names reach it."""

    def __init__(self, private: dict[int, dict]):
        self.private = private                  # id(module namespace) -> its private copy
        self.clones: dict[int, object] = {}     # id(original) -> clone

    def _function(self, fn: types.FunctionType) -> types.FunctionType | None:
        namespace = self.private.get(id(fn.__globals__))
        if namespace is None:                   # not a harness module's own code
            return None
        clone = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__,
                                   fn.__closure__)
        clone.__kwdefaults__ = fn.__kwdefaults__
        clone.__qualname__, clone.__doc__, clone.__module__ = (fn.__qualname__, fn.__doc__,
                                                               fn.__module__)
        clone.__annotations__ = fn.__annotations__
        clone.__dict__.update(fn.__dict__)
        return clone

    def clone(self, value):
        """``value``'s sealed counterpart, or None when it is not the harness's code."""
        if id(value) in self.clones:
            return self.clones[id(value)]
        new = None
        if isinstance(value, types.FunctionType):
            wrapped = getattr(value, "__wrapped__", None)
            if value.__code__ is _CONTEXT_MANAGER_CODE and isinstance(wrapped, types.FunctionType):
                inner = self._function(wrapped)
                new = contextlib.contextmanager(inner) if inner is not None else None
            else:
                new = self._function(value)
        elif isinstance(value, functools._lru_cache_wrapper):
            inner = self._function(value.__wrapped__)
            if inner is not None:
                new = functools.wraps(inner)(functools.lru_cache(**value.cache_parameters())(inner))
        elif isinstance(value, (staticmethod, classmethod)):
            inner = self.clone(value.__func__)
            new = type(value)(inner) if inner is not None else None
        elif isinstance(value, property):
            parts = [self.clone(part) if part is not None else None
                     for part in (value.fget, value.fset, value.fdel)]
            if any(part is not None for part in parts):
                new = property(*(clone or part for clone, part in
                                 zip(parts, (value.fget, value.fset, value.fdel))), value.__doc__)
        if new is not None:
            self.clones[id(value)] = new
        return new


def seal(package: str = "llmcheck") -> int:
    """Seal every module of ``package`` (importing them all first); returns how many functions
    were cloned. Run once, in a fresh kernel, before any learner code (see the module's doc)."""
    modules = _harness_modules(package)
    private = {id(vars(module)): dict(vars(module)) for module in modules.values()}
    sealer = _Sealer(private)
    rebind: list[tuple[dict | type, str, object]] = []
    for name, module in modules.items():
        for key, value in list(vars(module).items()):
            clone = sealer.clone(value)
            if clone is not None:
                rebind.append((vars(module), key, clone))
            if isinstance(value, type) and value.__module__ == name:
                for attribute, member in list(vars(value).items()):
                    clone = sealer.clone(member)
                    if clone is not None:
                        rebind.append((value, attribute, clone))
    for namespace in private.values():
        for key, value in list(namespace.items()):
            if id(value) in sealer.clones:
                namespace[key] = sealer.clones[id(value)]
    for owner, key, clone in rebind:
        if isinstance(owner, dict):
            owner[key] = clone
        else:
            setattr(owner, key, clone)
    return len(sealer.clones)


__all__ = ["seal"]
