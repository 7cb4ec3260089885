"""The kernel's audit hook (llmcheck/audit.py): what it reports, and the evidence the grader makes
of a report (course/grading/integrity.py). A real kernel's reports are graded in
tests/test_grading_verdicts.py (tests/grading/cheats_evasion.py, AUDIT_CHEATS)."""

from __future__ import annotations

import pytest

from course.grading.integrity import AUDIT_METADATA, audit_evidence
from llmcheck import audit


@pytest.mark.parametrize("event, args, detail", [
    ("sys._getframe", (None,), ""), ("sys.setprofile", (), ""), ("gc.get_objects", (-1,), ""),
    ("ctypes.dlopen", ("libc.so.6",), ""), ("exec", (None,), ""),
    ("object.__getattr__", (len, "__code__"), "builtin_function_or_method.__code__"),
    ("import", ("ctypes.util", None), "ctypes.util"), ("_thread.start_new_thread", (None,), ""),
    ("llmcheck.mode_stack", ("_get_dispatch_stack_at",), "_get_dispatch_stack_at"),
    ("object.__setattr__", (__import__("llmcheck.cases").cases.Test, "_run", None), "Test._run")])
def test_the_events_evasion_needs_are_reported(event, args, detail):
    assert audit._reported(event, args) == detail


@pytest.mark.parametrize("event, args", [
    ("open", ("x", "r")), ("object.__getattr__", (len, "__name__")), ("import", ("json",)),
    ("import", ("llmcheck.cases",)), ("os.listdir", (".",))])
def test_ordinary_events_are_not(event, args):
    assert audit._reported(event, args) is None


def test_outside_a_kernel_the_hook_is_not_installed():
    assert audit.install() is False


def test_a_report_becomes_evidence_naming_the_cell_and_the_learners_line():
    cells = [{"metadata": {}},
             {"metadata": {"nbgrader": {"grade_id": "test_dot"}, AUDIT_METADATA: [
                 {"event": "sys._getframe", "detail": "", "line": 4, "function": "dot",
                  "source": "frame = getattr(sys, '_get' + 'frame')(1)"}, "not a report"]}}]
    (evidence,) = audit_evidence(cells)
    assert "audit hook saw sys._getframe while cell test_dot ran" in evidence
    assert "dot at line 4" in evidence and "_get" in evidence
    assert audit_evidence([{"metadata": {}}]) == []
