"""The trusted verdicts: each test cell is judged outside the learner's kernel.

A submission's kernel only publishes records (``llmcheck.cases``: outputs, aten ops reached,
the inputs' digest, tamper canaries). The rules here compare them with the records of the
instructor's solution notebook and turn every cell whose records do not hold up into a failed
cell with a reason (course/grading/VERDICTS.md); :class:`course.grading.judging.Verdicts` (an
nbgrader preprocessor after Execute) runs the solution once and applies them. This module
imports neither nbgrader nor the executor, so the learner's check uses it too.
"""

from __future__ import annotations

import base64
import re
from dataclasses import asdict, dataclass

import numpy as np

from llmcheck.record import records_of as _records_in, too_large, too_much_live


@dataclass(frozen=True)
class Verdict:
    """One test cell's verdict: passed, whether tampering was detected, a sentence for learners."""

    passed: bool
    tampering: bool = False
    reason: str = ""
    unrecorded: bool = False     # a case kept no record of its checks (cut short, or removed)


def records_of(cell) -> list[dict]:
    """The records a test cell's outputs carry, in order."""
    return _records_in(cell.get("outputs", []))


def kernel_error(cell) -> bool:
    """Whether the cell raised in the kernel (an error output)."""
    return any(out.get("output_type") == "error" for out in cell.get("outputs", []))


def decode_tensor(data: dict) -> np.ndarray:
    """A record's tensor as a NumPy array (bool, ints and floats)."""
    dtype = np.dtype({"bool": "bool", "float16": "float16"}.get(data["dtype"], data["dtype"]))
    raw = base64.b64decode(data["data"])
    return np.frombuffer(raw, dtype=dtype).reshape(data["shape"])


def compare(want: dict, got: dict, *, rtol: float, atol: float, where: str = "the result") -> str:
    """'' when ``got`` matches ``want`` (both encoded outputs), else a sentence saying how not."""
    if "tensor" in want:
        if "tensor" not in got:
            return f"{where}: expected a tensor, got {_kind(got)}"
        w, g = want["tensor"], got["tensor"]
        if g.get("dtype") != w["dtype"]:
            return f"{where}: expected dtype {w['dtype']}, got {g.get('dtype')}"
        if list(g.get("shape", [])) != list(w["shape"]):
            return f"{where}: expected shape {tuple(w['shape'])}, got {tuple(g.get('shape', []))}"
        try:
            a, b = decode_tensor(w), decode_tensor(g)
        except (ValueError, KeyError, TypeError):
            return f"{where}: the recorded tensor is malformed"
        if a.dtype == bool or a.dtype.kind in "iu":
            bad = a != b
        else:
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            bad = ~np.isclose(b64, a64, rtol=rtol, atol=atol, equal_nan=True)
        if bad.any():
            index = tuple(int(i) for i in np.argwhere(bad)[0])
            return (f"{where}: {int(bad.sum())} of {bad.size} entries differ from the expected "
                    f"values (first at index {index})")
        return ""
    for kind in ("list", "tuple"):
        if kind in want:
            items = got.get("list", got.get("tuple"))
            if items is None:
                return f"{where}: expected a {kind}, got {_kind(got)}"
            if len(items) != len(want[kind]):
                return f"{where}: expected {len(want[kind])} items, got {len(items)}"
            for i, (w, g) in enumerate(zip(want[kind], items)):
                problem = compare(w, g, rtol=rtol, atol=atol, where=f"{where}[{i}]")
                if problem:
                    return problem
            return ""
    if "value" in want:
        w, g = want["value"], got.get("value", object())
        if isinstance(w, float) and isinstance(g, (int, float)) and not isinstance(g, bool):
            return "" if abs(g - w) <= atol + rtol * abs(w) else f"{where}: expected {w}, got {g}"
        return "" if type(g) is type(w) and g == w else f"{where}: expected {w!r}, got {_short(got)}"
    if "none" in want:
        return "" if "none" in got else f"{where}: expected None, got {_kind(got)}"
    if "raised" in want:
        if "raised" not in got:
            return f"{where}: expected {want['raised']['type']} to be raised"
        return "" if _is_a(got["raised"], want["raised"]["type"]) else \
            f"{where}: expected {want['raised']['type']}, got {got['raised'].get('type')}"
    return f"{where}: the expected output has an unknown form"


def _is_a(raised: dict, expected: str) -> bool:
    """Whether a recorded exception is an instance of the class named ``expected`` (its own
    type or any base class: a learner's ``PoolExhausted(RuntimeError)`` is a RuntimeError)."""
    types = raised.get("types")
    return expected in types if isinstance(types, list) else raised.get("type") == expected


def _kind(encoded: dict) -> str:
    if "raised" in encoded:
        raised = encoded["raised"]
        return f"an error, {raised.get('type')}: {str(raised.get('message', ''))[:200]}"
    return next(iter(encoded), "nothing")


def _short(encoded: dict) -> str:
    return repr(encoded.get("value"))[:80] if "value" in encoded else _kind(encoded)


def judge(grade_id: str, expected: list[dict], got: list[dict]) -> Verdict:
    """The verdict on one test cell: ``got`` (the submission's records) against ``expected``
    (the solution's); options and policies come from ``expected`` only."""
    if not expected:
        raise ValueError(f"{grade_id}: the solution's test cell made no record; every test cell "
                         "must check through llmcheck.cases.Test (course/grading/VERDICTS.md)")
    names = [r.get("case") for r in got]
    wanted = [r["case"] for r in expected]
    if not got:
        return Verdict(False, False, f"{grade_id}: the test made none of its {len(wanted)} "
                                     "records, so it did not run as written")
    if any(r.get("cell") != grade_id for r in got) or len(set(names)) != len(names) \
            or set(names) - set(wanted) or any(r.get("version") != e.get("version")
                                               for r, e in zip(got, expected)):
        return Verdict(False, True, f"{grade_id}: tampering detected: records that this test does "
                                    "not make (repeated, renamed or forged)")
    by_case = {r["case"]: r for r in got}
    for want in expected:
        case = want["case"]
        where = f"{grade_id}, case {case!r}"
        have = by_case.get(case)
        if have is None:
            return Verdict(False, False, f"{where}: did not run")
        if have.get("inputs") != want["inputs"]:
            return Verdict(False, True, f"{where}: tampering detected: the function did not get "
                                        "the test's inputs")
        if have.get("policy") != want["policy"] or have.get("options") != want["options"]:
            return Verdict(False, True, f"{where}: tampering detected: the test's rules were changed")
        canaries = have.get("canaries") or {}
        if set(canaries) != set(want["canaries"]) or not all(v is True for v in canaries.values()):
            off = sorted(k for k, v in canaries.items() if v is not True)
            return Verdict(False, True, f"{where}: tampering detected: a check was switched off "
                                        f"({', '.join(off or ['missing'])})", unrecorded=not off)
        violations = have.get("violations")
        if not isinstance(violations, list):
            return Verdict(False, True, f"{where}: tampering detected: a malformed record")
        if violations:
            return Verdict(False, False, f"{where}: {violations[0]}")
        ops = have.get("ops") if isinstance(have.get("ops"), dict) else {}
        forbidden = sorted(op for op in want["policy"]["ops"] if ops.get(op))
        if forbidden:
            return Verdict(False, False, f"{where}: reached {', '.join(forbidden)}, which this "
                                         "exercise does not allow")
        options = want["options"]
        products, flops = have.get("products"), have.get("flops")
        if not isinstance(products, int) or not isinstance(flops, int):
            return Verdict(False, True, f"{where}: tampering detected: a malformed record")
        if "max_products" in options and products > options["max_products"]:
            return Verdict(False, False, f"{where}: {products} matrix products where at most "
                                         f"{options['max_products']} are expected")
        if "max_flops_ratio" in options and flops > options["max_flops_ratio"] * want["flops"]:
            return Verdict(False, False, f"{where}: {flops} FLOPs of matrix products, "
                                         f"{flops / max(want['flops'], 1):.1f} times the "
                                         "expected work: is something computed again?")
        if "max_ops_ratio" in options:
            done, expected_ops = sum(ops.values()), sum(want["ops"].values())
            if not all(isinstance(v, int) for v in ops.values()):
                return Verdict(False, True, f"{where}: tampering detected: a malformed record")
            if done > options["max_ops_ratio"] * expected_ops:
                return Verdict(False, False, (
                    f"{where}: {done} tensor operations, {done / max(expected_ops, 1):.1f} times "
                    "the expected number: work that grows with the input (a loop over its "
                    "blocks or rows?) where one operation on the whole is expected"))
        if "max_elements" in options:
            largest = have.get("largest")
            if not isinstance(largest, dict) or not isinstance(largest.get("elements"), int) \
                    or not isinstance(largest.get("shape"), list):
                return Verdict(False, True, f"{where}: tampering detected: a malformed record")
            if largest["elements"] > options["max_elements"]:
                return Verdict(False, False, f"{where}: " + too_large(
                    largest["elements"], largest["shape"], largest.get("op"),
                    options["max_elements"]))
        if "max_live_elements" in options:
            live = have.get("live")
            if not isinstance(live, dict) or not isinstance(live.get("elements"), int):
                return Verdict(False, True, f"{where}: tampering detected: a malformed record")
            if live["elements"] > options["max_live_elements"]:
                return Verdict(False, False, f"{where}: " + too_much_live(
                    live["elements"], live.get("op"), options["max_live_elements"]))
        if "view_of" in options and not (have.get("views") and all(
                v is True for v in have["views"])):
            return Verdict(False, False, f"{where}: the result is a copy, not a view of the input")
        problem = _compare_output(want, have, where)
        if problem:
            return Verdict(False, False, problem)
    return Verdict(True)


def _compare_output(want: dict, have: dict, where: str) -> str:
    options = want["options"]
    got = have.get("output") if isinstance(have.get("output"), dict) else {}
    if "expect" in options:                              # Test.raises
        raised = got.get("raised")
        if not raised:
            return f"{where}: expected {options['expect']} to be raised, but the function returned"
        if not _is_a(raised, options["expect"]):
            return f"{where}: expected {options['expect']}, got {raised.get('type')}"
        if options.get("match") and not re.search(options["match"], str(raised.get("message"))):
            return f"{where}: the {options['expect']} message does not match {options['match']!r}"
        return ""
    if "raised" in got and "raised" not in want["output"]:
        return f"{where}: raised {got['raised'].get('type')}: {got['raised'].get('message')}"
    return compare(want["output"], got, rtol=float(options["rtol"]), atol=float(options["atol"]),
                   where=where)


# ------------------------------------------------------------------------------------------------
# The learner's own cells
# ------------------------------------------------------------------------------------------------

def learner_sources(nb, instructor_tests: frozenset[str] = frozenset()) -> list[str]:
    """The source of every cell the learner may edit (answers and cells they added). A cell
    whose source is exactly one of the instructor's test cells (released or with its hidden
    tests), for example a test cell whose grade_id the learner renamed, is the instructor's
    code, not the learner's: it is not read as theirs."""
    from .cells import is_locked, is_test
    return [c.source for c in nb.cells if c.cell_type == "code"
            and not is_locked(c) and not is_test(c) and c.source.strip() not in instructor_tests]


def test_cells(nb) -> list:
    """The notebook's test cells (course/grading/cells.py), in order."""
    from .cells import is_test
    return [c for c in nb.cells if is_test(c)]



REVIEW_METADATA = "course_review"
"""Notebook metadata key: the evidence for an instructor's review (course/grading/review.py)."""

WARNING_PREFIX = "[shown, not scored: the cell wrote this to stderr] "


def judge_notebook(nb, expected: dict[str, list[dict]],
                   instructor_tests: frozenset[str] = frozenset()) -> dict[str, Verdict]:
    """Judge every test cell of an executed submission in place: a failing cell gets an error
    output (TamperingDetected or VerdictFailed) and every judged cell ``metadata.verdict``; a
    passing cell's stderr (a warning) is kept as shown output, not scored. The evidence for a
    review (course/grading/review.py) goes in ``nb.metadata[REVIEW_METADATA]``; it costs no
    point. instructor_tests: the instructor's test-cell sources (never read as learner code)."""
    from nbformat.v4 import new_output

    from .review import review_evidence
    verdicts = {}
    from .integrity import HARNESS_METADATA, audit_evidence
    evidence = review_evidence(learner_sources(nb, instructor_tests))
    evidence += audit_evidence(nb.cells)
    evidence += [f"the harness changed by the end of {cell.metadata.nbgrader.get('grade_id')}: "
                 + "; ".join(map(str, cell.metadata[HARNESS_METADATA][:3]))
                 for cell in test_cells(nb) if cell.metadata.get(HARNESS_METADATA)]
    if evidence:
        nb.metadata[REVIEW_METADATA] = evidence
    else:
        nb.metadata.pop(REVIEW_METADATA, None)
    for cell in test_cells(nb):
        grade_id = cell.metadata.nbgrader.get("grade_id")
        if grade_id not in expected:
            continue                       # a cell the instructor's notebook does not have
        verdict = judge(grade_id, expected[grade_id], records_of(cell))
        if verdict.unrecorded and timed_out(cell):
            # a case cut short by the cell's time limit keeps no record of its checks: slow,
            # not tampering (the points are lost either way; the word is not)
            verdict = Verdict(False, False, f"{grade_id}: the cell ran past its time limit "
                                            "before its checks were recorded")
        if verdict.passed and kernel_error(cell):
            verdict = Verdict(False, False, "the test raised an error in the notebook")
        elif not verdict.passed:
            name = "TamperingDetected" if verdict.tampering else "VerdictFailed"
            # first: nbgrader scores a cell by its first error or execute_result output, and an
            # execute_result before an appended error would earn (partial) credit
            cell.outputs.insert(0, new_output("error", ename=name, evalue=verdict.reason,
                                              traceback=[f"{name}: {verdict.reason}"]))
        else:
            show_stderr_unscored(cell)
        cell.metadata["verdict"] = asdict(verdict)
        verdicts[grade_id] = verdict
    return verdicts


TIMEOUT_ERRORS = ("CellTimeoutError", "KeyboardInterrupt")
"""How a cell stopped by its time limit ends (nbclient's error, the interrupt it sends)."""


def timed_out(cell) -> bool:
    return any(o.get("output_type") == "error" and o.get("ename") in TIMEOUT_ERRORS
               for o in cell.get("outputs", []))


def show_stderr_unscored(cell) -> None:
    """nbgrader scores a test cell 0 for any stderr output; a passed verdict's stderr is a
    warning (a UserWarning, a debugging print to stderr), shown to the learner as stdout."""
    for out in cell.outputs:
        if out.get("output_type") == "stream" and out.get("name") == "stderr":
            out["name"] = "stdout"
            out["text"] = WARNING_PREFIX + out.get("text", "")
