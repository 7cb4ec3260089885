"""llmcheck.tree: the one walk over nested tensors, as its four users read it (the storages a
call was given, the tensors an op took, the inputs' digest, the twin on fresh inputs)."""

from __future__ import annotations

import collections

import torch

from llmcheck import cases, fresh
from llmcheck.tree import fold, op_tensors, tensors_in

Pair = collections.namedtuple("Pair", "first second")
X = torch.arange(6.0).reshape(2, 3)
Y = torch.ones(4)


def test_tensors_in_finds_nested_tensors_and_a_models_weights_in_order():
    model = torch.nn.Linear(3, 2)
    found = tensors_in((X, [Y, {"b": X.t()}]), {"model": model, "n": 3})
    assert [id(t) for t in found] == [id(X), id(Y), id(found[2]), id(model.weight),
                                     id(model.bias)]
    assert found[2].untyped_storage().data_ptr() == X.untyped_storage().data_ptr()


def test_tensors_in_opens_four_levels_and_no_more():
    assert tensors_in([[[[Y]]]]) == [Y]
    assert tensors_in([[[[[Y]]]]]) == []


def test_fold_opens_namedtuples_unless_exact():
    assert tensors_in(Pair(X, Y)) == [X, Y]
    kinds = fold(Pair(X, 1), type, lambda container, results: results, exact=True)
    assert kinds is Pair


def test_the_digest_ignores_a_dicts_order_but_not_a_lists():
    assert cases.digest({"a": X, "b": Y}) == cases.digest({"b": Y, "a": X})
    assert cases.digest([X, Y]) != cases.digest([Y, X])
    assert cases.digest([X]) == cases.digest((X,)), "a list and a tuple digest alike"
    assert cases.digest(torch.nn.Linear(3, 2).requires_grad_(False)) != cases.digest(X)


def test_the_twin_redraws_tensors_keeps_structure_and_copies_a_namedtuple(monkeypatch):
    fresh.receive("ab" * 16)
    try:
        kept = torch.full((2,), 0.5) + torch.arange(2.0)
        args, kwargs = (X, [Y, Y], Pair(kept, X)), {"d": {"y": Y}}
        twin_args, twin_kwargs = fresh.twin("cell", "case", len, args, kwargs)[1:3]
    finally:
        fresh.receive(None)
    assert type(twin_args) is tuple and type(twin_args[1]) is list
    assert twin_args[1][0] is twin_args[1][1], "one tensor, one twin"
    assert not torch.equal(twin_args[0], X) and twin_args[0].shape == X.shape
    assert type(twin_args[2]) is Pair and torch.equal(twin_args[2].first, kept), \
        "a namedtuple is not opened: deep-copied as it is"
    assert twin_args[2].second is twin_args[0], "what it shares with the arguments stays shared"
    assert twin_kwargs["d"]["y"] is twin_args[1][0]


def test_an_ops_tensors_are_found_as_the_whole_walk_finds_them():
    """The recorder's hot path (op_tensors) finds the same tensors in the same order as
    tensors_in, for what aten ops take and return, and hands anything deeper to it."""
    t = [torch.zeros(i + 1) for i in range(4)]
    shapes = [((t[0], 1, [t[1], None, t[2]]), {"out": t[3]}),     # cat's list, index's optionals
              ((t[0],), {}), (t[1],), ((t[0], t[1]),),             # a result, a tuple of them
              (torch.return_types.max((t[0], t[1])),),             # a named tuple of results
              (([1, 2], "x", None), {"dim": [0, 1]}),              # no tensor at all
              ((t[0], [[t[1]]]), {}), ((t[0], {"a": t[1]}), {}),   # deeper: the whole walk
              ((torch.nn.Linear(2, 2),), {})]
    for values in shapes:
        assert [id(x) for x in op_tensors(*values)] == [id(x) for x in tensors_in(*values)]
