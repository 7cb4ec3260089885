"""Verdicts decided outside the learner's kernel (issue 13): the records, the trusted judge, the
learner's check against the release, and every cheat of tests/grading/cheats.py graded in one run
between honest students."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest
import torch

from course.grading.report import State
from course.grading.review import review_evidence
from course.grading.verdicts import Verdict, judge
from llmcheck.recorder import (PRODUCTS, NotAllowedError, OpRecorder, Policy, forbid,
                               storages_of)
from class_runs import ClassRun
from classroom import (ASSIGNMENTS as GRADED_ASSIGNMENTS, check, mutants, row_of, submission,
                       submit, submit_all, tree_hash)

ROOT = Path(__file__).resolve().parent.parent
sys.modules["mutants"] = mutants              # cheats.py imports the edit classes by this name
sys.path.insert(0, str(ROOT / "tests" / "grading"))
import cheats  # noqa: E402

CELL_TIMEOUT = 60          # seconds per cell: a slow cheat is judged by what it computes, not cut short


# ------------------------------------------------------------------------------------------------
# The op recorder and the judge, without a kernel (fast)
# ------------------------------------------------------------------------------------------------

def test_the_recorder_counts_products_and_flops_whatever_the_copy():
    w = torch.randn(4, 6)
    twin = w.clone()
    with OpRecorder() as recorder:
        torch.randn(5, 4) @ w
        torch.randn(3, 4) @ twin                 # a copy of the weights is counted all the same
    assert recorder.products == 2 and recorder.flops == 2 * (5 + 3) * 4 * 6
    assert recorder.ops["aten.mm"] == 2


def test_a_caught_refusal_stays_recorded():
    with forbid(*PRODUCTS) as recorder:
        try:
            torch.ones(2, 2) @ torch.ones(2, 2)
        except NotAllowedError:
            pass
    assert recorder.violations and "aten.mm" in recorder.violations[0]


def test_numpy_is_back_after_the_block():
    import numpy as np
    with pytest.raises(NotAllowedError):
        with forbid("numpy"):
            np.dot([1.0], [2.0])
    assert np.dot([1.0], [2.0]) == 2.0 and torch.ones(1).numpy()[0] == 1.0


def test_a_forbidden_module_is_refused_even_where_it_reaches_no_torch_op():
    import sys

    import llmcore.block_allocator
    from llmcheck.cases import Test

    class Mine(llmcore.block_allocator.BlockAllocator):   # a subclass: the library's code runs
        pass

    outer = sys.getprofile()
    with forbid(llmcore.block_allocator) as recorder:
        Mine(3).allocate()                          # pure Python bookkeeping, no aten op
    assert any("BlockAllocator.allocate" in v for v in recorder.violations)
    assert sys.getprofile() is outer                # the hook is gone after the block
    with forbid(llmcore.block_allocator) as recorder:
        [1, 2, 3].pop()                             # anything else is fine
    assert not recorder.violations
    assert Policy.of((llmcore.block_allocator,)).describe()["callables"] == \
        ["llmcore.block_allocator"]
    with pytest.raises(ValueError, match="not a Python function, class or module"):
        Policy.of((3,))

    def switches_it_off():
        sys.setprofile(None)
        return 1

    recorder, _, _, canaries = Test("t", forbid=(llmcore.block_allocator,))._run(
        switches_it_off, (), {})
    assert canaries["forbid"] is False
    sys.setprofile(outer)


def test_the_recorder_keeps_the_largest_storage_not_the_inputs_or_views():
    x = torch.randn(4, 6)
    with OpRecorder(exempt=storages_of(x)) as recorder:     # x is the call's input
        x.t().expand(3, 6, 4)                   # views allocate nothing: (3, 6, 4) is not counted
        y = x[:, :2] * 2                        # (4, 2)
        y.mul_(3)                               # in place: nothing allocated
        torch.cat([y, y])                       # (8, 2): the largest
    assert (recorder.largest, recorder.largest_shape, recorder.largest_op) == \
        (16, (8, 2), "aten.cat")


def test_max_elements_fails_in_the_kernel_and_the_record_says_what_was_allocated(capsys):
    from llmcheck.cases import Test
    test = Test("test_x")
    q, k = torch.randn(16, 4), torch.randn(16, 4)
    got = test.call(lambda: q @ k[:4].t(), case="tile", max_elements=64)
    assert got.shape == (16, 4) and test.last.largest == 64
    with pytest.raises(AssertionError, match=r"a \(16, 16\) tensor \(256 elements in one "
                                             r"storage, made or grown by aten.mm\) where no "
                                             r"tensor of more than 64"):
        test.call(lambda: q @ k.t(), case="whole", max_elements=64)


def _record(case="c", **changes) -> dict:
    record = {"version": 1, "cell": "test_x", "case": case, "index": 0, "inputs": "abc",
              "output": {"value": 3}, "ops": {"aten.add": 1}, "products": 0, "flops": 0,
              "views": [], "violations": [], "canaries": {"recorder": True, "forbid": True},
              "options": {"rtol": 1e-5, "atol": 1e-6},
              "policy": Policy.of(PRODUCTS).describe()}
    record.update(changes)
    return record


@pytest.mark.parametrize("got, phrase, tampering", [
    ([], "none of its", False),
    ([_record(), _record()], "tampering detected", True),
    ([_record(case="other")], "tampering detected", True),
    ([_record(inputs="xyz")], "inputs", True),
    ([_record(canaries={"recorder": False, "forbid": True})], "switched off (recorder)", True),
    ([_record(ops={"aten.mm": 1})], "aten.mm", False),
    ([_record(output={"value": 4})], "expected 3", False),
    ([_record(violations=["numpy's dot was used"])], "numpy's dot", False),
    ([_record(policy={"ops": [], "llmcore": [], "numpy": False, "callables": []})],
     "rules were changed", True),
], ids=["missing", "repeated", "unknown", "inputs", "canary", "forbidden_op", "wrong", "violation",
        "policy"])
def test_judge_refuses_what_does_not_hold_up(got, phrase, tampering):
    verdict = judge("test_x", [_record()], got)
    assert not verdict.passed and verdict.tampering == tampering and phrase in verdict.reason, \
        verdict


def test_judge_passes_the_same_records_and_refuses_authoring_errors():
    assert judge("test_x", [_record()], [_record()]) == Verdict(True)
    with pytest.raises(ValueError, match="made no record"):
        judge("test_x", [], [_record()])


def test_a_learners_own_exception_class_counts_as_its_base_class():
    """PoolExhausted(RuntimeError) is a RuntimeError: raises() and a raising case accept it."""
    expect = {"rtol": 1e-5, "atol": 1e-6, "expect": "RuntimeError", "match": "full"}
    want = _record(options=expect, output={"raised": {"type": "RuntimeError", "message": "full"}})
    own = {"type": "PoolExhausted", "message": "pool full",
           "types": ["PoolExhausted", "RuntimeError", "Exception", "BaseException"]}
    assert judge("test_x", [want], [_record(options=expect, output={"raised": own})]).passed
    other = dict(own, types=["PoolExhausted", "Exception", "BaseException"])
    verdict = judge("test_x", [want], [_record(options=expect, output={"raised": other})])
    assert not verdict.passed and "expected RuntimeError, got PoolExhausted" in verdict.reason
    raising = _record(output={"raised": {"type": "KeyError", "message": "'x'"}})
    assert judge("test_x", [raising], [_record(output={"raised": dict(
        own, type="Unknown", types=["Unknown", "KeyError", "LookupError"])})]).passed


def test_judge_refuses_an_allocation_above_max_elements():
    options = {"rtol": 1e-5, "atol": 1e-6, "max_elements": 512}
    want = _record(options=options, largest={"elements": 512, "shape": [64, 8], "op": "aten.mm"})
    assert judge("test_x", [want], [want]) == Verdict(True)
    whole = _record(options=options, largest={"elements": 4096, "shape": [64, 64],
                                              "op": "aten.mm"})
    verdict = judge("test_x", [want], [whole])
    assert not verdict.passed and not verdict.tampering, verdict
    assert "a (64, 64) tensor (4096 elements in one storage, made or grown by aten.mm)" \
        in verdict.reason
    assert "more than 512 elements" in verdict.reason
    assert judge("test_x", [want], [_record(options=options)]).tampering     # no "largest"


def test_review_evidence_is_what_reaches_the_checks_never_ordinary_python():
    honest = [
        "def dot(a, b):\n    total = torch.zeros(())\n    for i in range(a.shape[0]):\n"
        "        total = total + a[i] * b[i]\n    return total",
        "class LayerCache:\n    def __init__(self, h):\n        self.keys = torch.zeros(h, 0)\n"
        "    def __repr__(self):\n        return f'{self.__class__.__name__}({type(self).__name__})'",
        "import copy\nimport numpy as np\nx = [1]\nx[0] = 2",
        "import os\nos.environ['OMP_NUM_THREADS'] = '1'\ndisplay(torch.ones(2))",
        'def f(obj):\n    """As in exercise 2: llmcheck, get_ipython, sys.modules, exec."""\n'
        "    setattr(obj, 'x', getattr(obj, 'y', 0))\n    return globals()['f']  # exercise",
        "import warnings\nwarnings.warn('slow path')\nclass A:\n    def f(self):\n"
        "        return self._cache",
    ]
    assert review_evidence(honest) == []
    assert review_evidence(["torch.allclose = lambda *a: True"]) == \
        ["replaces torch.allclose of an imported module"]
    assert "uses .events" in review_evidence(["get_ipython().events.register('x', print)"])
    assert "imports llmcheck.cases" in review_evidence(["from llmcheck import cases"])
    assert "uses a library's private part (torch..._C)" in \
        review_evidence(["m = torch._C._pop_torch_dispatch_mode()"])
    assert review_evidence(["from concurrent.futures import ThreadPoolExecutor"]) == \
        ["imports concurrent.futures.ThreadPoolExecutor"]
    assert "calls exec()" in review_evidence(["exec('x = 1')"])
    assert "uses .modules" in review_evidence(["import sys\nsys.modules['a'].b = 1"])
    assert review_evidence(["def broken(:"]) == []


# ------------------------------------------------------------------------------------------------
# The learner's check runs the release's tests
# ------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_check_reports_a_test_replaced_by_pass_as_altered(tmp_path):
    nb = submission(mutants.MATMUL, answered=True, edits={
        "matmul": mutants.Replace(cheats.LIBRARY_MATMUL, "return a @ b"),
        "test_matmul": mutants.Source("pass"), "test_project": mutants.Delete()})
    copy = tmp_path / "01_matmul" / "matmul.ipynb"
    copy.parent.mkdir()
    nbformat.write(nb, str(copy))
    done = check(copy)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "ALTERED test_matmul" in done.stdout and "ALTERED test_project" in done.stdout
    assert "FAIL    test_matmul: 0 of 2 points" in done.stdout, done.stdout
    assert "PASS    test_project:" in done.stdout, "the deleted test is put back and runs"
    assert "exercises/01_matmul/matmul.ipynb" in done.stdout


@pytest.mark.slow
def test_check_fails_a_test_that_published_no_record(tmp_path):
    nb = submission(mutants.MATMUL, answered=True,
                     edits={"dot": _cheat("input_transformer").edits["dot"]})
    copy = tmp_path / "matmul.ipynb"
    nbformat.write(nb, str(copy))
    done = check(copy)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL    test_dot: 0 of 1 point" in done.stdout and "none of its records" in done.stdout
    assert "NOTE    your code uses .input_transformers_cleanup" in done.stdout, done.stdout
    assert "costs no point" in done.stdout


def _cheat(student: str) -> cheats.Cheat:
    return next(c for c in cheats.CHEATS if c.student == student)


# ------------------------------------------------------------------------------------------------
# One class: honest students around every cheat, graded in one run
# ------------------------------------------------------------------------------------------------

HONEST = ("aaa_honest", "zzz_honest")
CHEATS = [c for c in cheats.CHEATS if c.assignment in GRADED_ASSIGNMENTS]
ASSIGNMENTS = sorted({c.assignment for c in CHEATS})


def build_class(course: Path) -> dict[str, str]:
    """The class: two honest students around every cheat; returns the tree's hashes before
    grading."""
    for student in HONEST:
        for assignment in ASSIGNMENTS:
            submit(course, student, assignment, submission(assignment, answered=True))
    submit_all(course, CHEATS)
    return tree_hash(course)


CLASS = ClassRun("test_grading_verdicts", "graded", timeout=CELL_TIMEOUT,
                 what="notebooks (honest and cheats)", feedback=False)   # no test reads feedback


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The class graded once (tests/class_runs.py); returns (course folder, CSV rows, the
    tree's hashes before grading)."""
    run = CLASS.graded(tmp_path_factory, build_class)
    return run.course, run.rows, run.extra


@pytest.mark.slow       # its fixture grades a whole class
def test_cheats_leave_the_course_byte_identical(graded):
    """Solutions, submissions and config unchanged: only the grader's outputs are new."""
    course, _, before = graded
    assert tree_hash(course) == before


def _verdicts(course: Path, student: str, assignment: str) -> dict[str, dict]:
    path = course / "autograded" / student / assignment / \
        f"{mutants.ASSIGNMENTS[assignment]}.ipynb"
    nb = json.loads(path.read_text())
    return {c["metadata"]["nbgrader"]["grade_id"]: c["metadata"].get("verdict", {})
            for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade")
            and not c["metadata"]["nbgrader"].get("solution")}


@pytest.mark.slow
@pytest.mark.parametrize("student", HONEST)
@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_honest_students_keep_full_marks(graded, student, assignment):
    course, rows, _ = graded
    row = row_of(rows, student, assignment)
    assert row.score == row.max_score > 0, row
    assert all(v.get("passed") for v in _verdicts(course, student, assignment).values())


@pytest.mark.slow
@pytest.mark.parametrize("cheat", CHEATS, ids=[c.student for c in CHEATS])
def test_no_cheat_scores_above_its_honest_work(graded, cheat):
    course, rows, _ = graded
    row = row_of(rows, cheat.student, cheat.assignment)
    if cheat.stops_grader:                # no autograded notebook: the whole submission is 0
        assert row.status.state is State.FAILED and row.score == cheat.score == 0, row
    else:
        verdicts = _verdicts(course, cheat.student, cheat.assignment)
        failed = {name for name, verdict in verdicts.items() if not verdict.get("passed")}
        assert failed == cheat.failing, f"{cheat.why}: expected {sorted(cheat.failing)} to " \
                                        f"fail, got {sorted(failed)}: {verdicts}"
        assert row.score == cheat.score, row
        if cheat.review:
            assert row.status.state is State.REVIEW and cheat.review in row.status.detail, row
        else:
            assert cheat.score <= cheat.honest, "only a submission marked for review may " \
                                                "score above its honest work"
        for grade_id, phrase in cheat.reasons.items():
            assert phrase in verdicts[grade_id]["reason"], (grade_id, verdicts[grade_id])


def test_plain_nbgrader_and_course_grade_judge_alike():
    """nbgrader_config.py (plain `nbgrader autograde`) names the pipeline course-grade builds."""
    from traitlets.config.loader import PyFileConfigLoader
    from traitlets.utils.importstring import import_item

    from course.grading.nbgrader_app import autograde_preprocessors
    config = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()
    named = [import_item(p) if isinstance(p, str) else p
             for p in config.Autograde.autograde_preprocessors]
    assert named == autograde_preprocessors()
    assert "Verdicts" in [p.__name__ for p in named]


@pytest.mark.parametrize("stopped_by", [None, "CellTimeoutError", "KeyboardInterrupt"])
def test_a_case_cut_short_by_the_time_limit_is_slow_not_tampering(stopped_by):
    """A record without its checks (canaries) reads as tampering, unless the cell was stopped by
    its time limit: then the case was cut short inside the checks, and the reason says so."""
    from nbformat.v4 import new_code_cell, new_notebook, new_output
    from course.grading.verdicts import judge_notebook
    from llmcheck.record import RECORD_MIME

    cell = new_code_cell("test.call(f)", metadata={"nbgrader": {
        "grade": True, "grade_id": "test_x", "points": 1, "solution": False, "locked": True}})
    cell.outputs = [new_output("display_data", data={RECORD_MIME: _record(canaries={})})]
    if stopped_by:
        cell.outputs.append(new_output("error", ename=stopped_by, evalue="", traceback=[]))
    verdicts = judge_notebook(new_notebook(cells=[cell]), {"test_x": [_record()]})
    verdict = verdicts["test_x"]
    assert not verdict.passed
    if stopped_by:
        assert not verdict.tampering and "ran past its time limit" in verdict.reason, verdict
    else:
        assert verdict.tampering and verdict.unrecorded \
            and "switched off (missing)" in verdict.reason, verdict
