"""The one walk over a test's nested values: tensors inside lists, tuples, dicts and models.

A case's arguments, an aten op's arguments, a function's result: each is a tree whose branches
are lists, tuples and dicts and whose leaves are tensors, models (``nn.Module``) and anything
else. :func:`fold` walks such a tree once, the same way for every use: the storages a call was
given (``llmcheck.recorder.storages_of``), the tensors an op took or a call returned
(:func:`tensors_in`) and the inputs' digest (``llmcheck.cases.digest``). The twin on fresh inputs
(``llmcheck.fresh.twin``) walks the same branches (exactly lists, tuples and dicts) but draws a list
of integers whole, so it has its own walk.
"""

from __future__ import annotations

from typing import Callable, TypeVar

import torch

T = TypeVar("T")

SEARCH_DEPTH = 4
"""How deeply :func:`tensors_in` looks into nested lists, tuples and dicts (a container nested
deeper is not opened: its tensors are not found)."""


def is_branch(value, *, exact: bool = False) -> bool:
    """Whether the walk opens ``value``: a list, tuple or dict (with ``exact``, only those types
    themselves: a namedtuple or an OrderedDict is then a leaf, as a walk that rebuilds needs)."""
    if exact:
        return type(value) in (list, tuple, dict)
    return isinstance(value, (list, tuple, dict))


def fold(value, leaf: Callable[[object], T], branch: Callable[[object, list[T]], T], *,
         depth: int | None = None, exact: bool = False) -> T:
    """Walk a nested value: ``leaf(x)`` for each leaf, ``branch(container, results)`` for each
    list, tuple or dict, with the results of its items in order (a dict's items are its values,
    in its own order). The outermost value is at depth 0; a container at ``depth`` or deeper is a
    leaf (None: no limit). exact: see :func:`is_branch`.
    """
    def walk(v, level: int):
        if is_branch(v, exact=exact) and (depth is None or level < depth):
            items = v.values() if isinstance(v, dict) else v
            return branch(v, [walk(item, level + 1) for item in items])
        return leaf(v)

    return walk(value, 0)


def _tensors_of_leaf(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, torch.nn.Module):
        return [*value.parameters(), *value.buffers()]
    return []


def _concatenated(_container, results: list[list]) -> list:
    return [item for result in results for item in result]


def tensors_in(*values) -> list[torch.Tensor]:
    """Every tensor in the values, in order: nested lists, tuples and dicts (up to
    :data:`SEARCH_DEPTH` levels in each value), a model's parameters and buffers."""
    return [t for value in values
            for t in fold(value, _tensors_of_leaf, _concatenated, depth=SEARCH_DEPTH)]


def op_tensors(*values) -> list[torch.Tensor]:
    """:func:`tensors_in` for what an aten op takes and returns, its hot path: tensors, Python
    values and lists of them one level deep (``cat``'s list, ``index``'s optional tensors), a
    dict of keyword arguments, a tuple of results. The same tensors in the same order; anything
    nested deeper, or a model, goes to :func:`tensors_in` whole."""
    found: list[torch.Tensor] = []
    for value in values:
        items = (value.values() if isinstance(value, dict) else
                 value if isinstance(value, (list, tuple)) else (value,))
        for item in items:
            if isinstance(item, torch.Tensor):
                found.append(item)
            elif isinstance(item, (list, tuple)):
                for inner in item:
                    if isinstance(inner, torch.Tensor):
                        found.append(inner)
                    elif isinstance(inner, (list, tuple, dict, torch.nn.Module)):
                        return tensors_in(*values)
            elif isinstance(item, (dict, torch.nn.Module)):
                return tensors_in(*values)
    return found
