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
    again = fresh.twin("test_x", "double", (x,), {})[0][0]
    assert torch.equal(again, twin), "the same secret, cell and case draw the same values"
    assert not torch.equal(fresh.twin("test_x", "other", (x,), {})[0][0], twin)


def test_masks_constants_integers_and_state_keep_their_meaning(secret):
    mask = torch.tensor([[0.0, float("-inf")], [0.0, 0.0]])
    ones, ids = torch.ones(4), torch.tensor([3, 1, 2])
    big = torch.randn(1000, dtype=torch.float64) * 50 + 1000
    (got_mask, got_ones, got_ids, got_big), _ = fresh.twin("c", "k", (mask, ones, ids, big), {})
    assert got_mask is mask and got_ones is ones and got_ids is ids
    assert abs(float(got_big.mean()) - 1000) < 10 and 40 < float(got_big.std()) < 60
    layer = torch.nn.Linear(3, 2)
    (twin_layer, x), _ = fresh.twin("c", "k", (layer, torch.randn(2, 3)), {})
    assert twin_layer is not layer and not torch.equal(twin_layer.weight, layer.weight)
    assert fresh.twin("c", "k", (ids, [1, 2]), {}) is None, "nothing to redraw: no twin"


def test_stateful_cases_have_no_twin(secret, capsys):
    state = []
    CaseTest("test_x").call(state.append, torch.ones(2), case="bound method")
    CaseTest("test_y").call(lambda: state.append(1), case="closure", inputs=(torch.ones(2),))
    assert len(_published(capsys)) == 2 and len(state) == 2


def test_cell_tokens_reveal_nothing_of_each_other():
    secret = "cd" * 32
    assert cell_token(secret, "test_a") != cell_token(secret, "test_b")
    assert cell_token(secret, "test_a") == cell_token(secret, "test_a")
    assert secret not in fingerprint(secret) and len(fingerprint(secret)) == 12
