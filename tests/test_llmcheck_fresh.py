"""Fresh inputs at grade time (llmcheck/fresh.py, course/grading/secret.py): with a cell's secret
every case runs again on inputs drawn from it; without one (the learner's check) nothing changes."""

from __future__ import annotations

import re

import pytest
import torch

from course.grading.secret import cell_token, fingerprint
from llmcheck import fresh
from llmcheck.cases import Test as CaseTest


@pytest.fixture
def secret():
    fresh.receive(cell_token("ab" * 32, "test_x"))
    yield
    fresh.receive(None)


def _published(capsys) -> list[str]:
    """The case names of the records printed (outside IPython, display prints the dict)."""
    return re.findall(r"'case': '([^']*)'", capsys.readouterr().out)


def test_no_secret_no_twin(capsys):
    assert not fresh.active()
    CaseTest("test_x").call(torch.mul, torch.ones(3), torch.arange(3.0), case="mul")
    assert len(_published(capsys)) == 1


def test_a_secret_runs_each_case_again_on_fresh_values(secret, capsys):
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    seen = []
    got = CaseTest("test_x").call(lambda t: seen.append(t.clone()) or t * 2, x, case="double")
    assert torch.equal(got, x * 2), "the case's own result is returned, not the twin's"
    lines = _published(capsys)
    assert lines == ["double", "double [fresh inputs]"]
    original, twin = seen
    assert torch.equal(original, x) and twin.shape == x.shape and twin.dtype == x.dtype
    assert not torch.equal(twin, x)
    again = fresh.twin("test_x", "double", torch.mul, (x,), {}).args[0]
    assert torch.equal(again, twin), "the same secret, cell and case draw the same values"
    assert not torch.equal(fresh.twin("test_x", "other", torch.mul, (x,), {}).args[0], twin)


def test_masks_constants_and_booleans_keep_their_meaning_integers_stay_in_range(secret):
    mask = torch.tensor([[0.0, float("-inf")], [0.0, 0.0]])
    ones, flags = torch.ones(4), torch.tensor([True, False, True])
    ids = torch.arange(50) % 7 + 3
    big = torch.randn(1000, dtype=torch.float64) * 50 + 1000
    (got_mask, got_ones, got_flags, got_ids, got_big), _ = fresh.twin(
        "c", "k", torch.add, (mask, ones, flags, ids, big), {})[1:3]
    assert got_mask is mask and got_ones is ones and got_flags is flags
    assert got_ids.dtype == ids.dtype and not torch.equal(got_ids, ids)
    assert int(got_ids.min()) >= 3 and int(got_ids.max()) <= 9, "ids stay in the tensor's range"
    assert abs(float(got_big.mean()) - 1000) < 10 and 40 < float(got_big.std()) < 60
    layer = torch.nn.Linear(3, 2)
    (twin_layer, x), _ = fresh.twin("c", "k", torch.add, (layer, torch.randn(2, 3)), {})[1:3]
    assert twin_layer is not layer and not torch.equal(twin_layer.weight, layer.weight)
    assert fresh.twin("c", "k", len, (torch.tensor([2, 2]), "x", 3), {}) is None, \
        "nothing to redraw: no twin"


def test_masked_rows_keep_their_minus_infinity_and_redraw_the_rest(secret):
    x = torch.tensor([[1.0, float("-inf"), 3.0], [float("-inf")] * 3, [0.5, -2.0, 4.0]])
    got = fresh.twin("c", "k", torch.exp, (x,), {}).args[0]
    assert torch.equal(torch.isinf(got), torch.isinf(x))
    assert not torch.equal(got[torch.isfinite(x)], x[torch.isfinite(x)])


def test_lists_of_integers_are_redrawn_in_their_range(secret):
    prompts = [[5, 6, 7], [8], [9, 5]]
    got = fresh.twin("c", "k", len, (prompts, 0), {}).args
    assert [len(p) for p in got[0]] == [3, 1, 2] and got[1] == 0 and got[0] != prompts
    assert all(5 <= t <= 9 for p in got[0] for t in p)


def test_python_numbers_are_drawn_by_the_tests_rule(secret, capsys):
    sizes = []
    CaseTest("test_x").call(lambda n, m: sizes.append((n, m)) or torch.zeros(n, m), 3, 3,
                            case="sizes", fresh_inputs=lambda rng: (int(rng.integers(4, 9)), 2))
    assert _published(capsys) == ["sizes", "sizes [fresh inputs]"]
    assert sizes[0] == (3, 3) and 4 <= sizes[1][0] < 9 and sizes[1][1] == 2


class Memo:
    """A cache that answers from a table keyed on its arguments once it has seen them."""
    table: dict = {}

    def __init__(self):
        self.rows = []

    def append(self, row):
        key = tuple(row.tolist())
        if key not in Memo.table:
            self.rows.append(row)
            Memo.table[key] = torch.cat(self.rows)
        return Memo.table[key]


def test_a_bound_method_runs_again_on_a_copy_of_its_object(secret, capsys):
    cache = Memo()
    rows = torch.tensor([1.0, 2.0])
    test = CaseTest("test_x")
    test.call(cache.append, rows, case="append")
    assert _published(capsys) == ["append", "append [fresh inputs]"]
    assert len(cache.rows) == 1, "the twin appended to a copy, not to the case's own object"
    twin = fresh.twin("test_x", "append", cache.append, (rows,), {})
    assert twin.fn.__self__ is not cache and not torch.equal(twin.args[0], rows)
    assert len(Memo.table) == 2, "the twin's row was new to a memo keyed on the inputs"


def test_a_closure_over_its_inputs_runs_on_their_twins_and_copies(secret, capsys):
    state = {"calls": 0}
    x = torch.arange(4.0)

    def step():
        state["calls"] += 1
        return x * 2

    got = CaseTest("test_y").call(step, case="closure", inputs=(x,))
    assert torch.equal(got, x * 2) and state["calls"] == 1, "the twin's state is a copy"
    assert _published(capsys) == ["closure", "closure [fresh inputs]"]
    twin = fresh.twin("test_y", "closure", step, (), {}, inputs=(x,))
    assert not torch.equal(twin.fn(), x * 2) and torch.equal(twin.fn(), twin.inputs[0] * 2)
    assert fresh.twin("test_y", "nothing", lambda: state["calls"], (), {}, inputs=(1,)) is None


class Pool:
    """A pool of ids that refuses to free an id it does not hold."""

    def __init__(self, n):
        self.n, self.freed = n, []

    def free(self, block):
        if not 0 <= block < self.n:
            raise ValueError(f"block {block} is not in the pool")
        self.freed.append(block)


def _options(capsys) -> list[str]:
    return re.findall(r"'options': (\{[^}]*\})", capsys.readouterr().out)


def test_an_error_case_runs_again_on_inputs_drawn_by_the_tests_rule(secret, capsys):
    pool, seen = Pool(3), []

    def free(block):
        seen.append(block)
        return pool.free(block)

    CaseTest("test_x").raises(ValueError, free, 3, case="outside", match=r"\b3\b",
                              fresh_inputs=lambda rng: (int(rng.integers(10, 20)),))
    assert [eval(o) for o in _options(capsys)] == [
        {"expect": "ValueError", "match": r"\b3\b"}, {"expect": "ValueError", "match": ""}], \
        "the twin is judged by the error's class: its message names other values"
    assert seen[0] == 3 and 10 <= seen[1] < 20


def test_an_error_memoised_for_the_tests_input_returns_on_the_twin(secret, capsys):
    def memo_free(block):
        if block == 3:
            raise ValueError("block 3 is not in the pool")

    CaseTest("test_x").raises(ValueError, memo_free, 3, case="outside",
                              fresh_inputs=lambda rng: (int(rng.integers(10, 20)),))
    out = capsys.readouterr().out
    assert re.findall(r"'case': '([^']*)'", out) == ["outside", "outside [fresh inputs]"]
    assert "'returned'" in out, "the twin's record says the function returned"


def test_an_error_case_of_a_bound_method_runs_again_on_a_copy(secret, capsys):
    pool = Pool(3)
    CaseTest("test_x").raises(ValueError, pool.free, 5, case="outside",
                              fresh_inputs=lambda rng: (-int(rng.integers(1, 9)),))
    assert _published(capsys) == ["outside", "outside [fresh inputs]"]
    assert pool.freed == [], "nothing reached the case's own object"


def test_an_error_case_without_a_rule_or_a_secret_has_no_twin(capsys):
    CaseTest("test_x").raises(ValueError, Pool(3).free, 5, case="outside",
                              fresh_inputs=lambda rng: (7,))
    assert _published(capsys) == ["outside"], "no secret (the learner's check): no twin"
    fresh.receive(cell_token("ab" * 32, "test_x"))
    try:
        CaseTest("test_x").raises(ValueError, Pool(3).free, 5, case="outside")
    finally:
        fresh.receive(None)
    assert _published(capsys) == ["outside"], "an error case is twinned only by its rule"


def test_the_solutions_twins_must_go_as_their_cases_do():
    from course.grading.judging import _twin_went_wrong
    raised = {"raised": {"type": "PoolError", "types": ["PoolError", "ValueError", "Exception"]}}
    assert _twin_went_wrong({"options": {}, "output": raised})
    assert not _twin_went_wrong({"options": {}, "output": {"value": 3}})
    assert not _twin_went_wrong({"options": {"expect": "ValueError"}, "output": raised})
    assert _twin_went_wrong({"options": {"expect": "KeyError"}, "output": raised})
    assert _twin_went_wrong({"options": {"expect": "ValueError"},
                             "output": {"returned": {"none": True}}})


def test_cell_tokens_reveal_nothing_of_each_other():
    secret = "cd" * 32
    assert cell_token(secret, "test_a") != cell_token(secret, "test_b")
    assert cell_token(secret, "test_a") == cell_token(secret, "test_a")
    assert secret not in fingerprint(secret) and len(fingerprint(secret)) == 12
