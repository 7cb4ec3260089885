"""llmcheck.integrity watches the harness's functions by name: every name must resolve, or the
check would compare None with None and say nothing. A rename fails loudly where the kernel
starts; a function removed after the start is a change like any other."""

from __future__ import annotations

import subprocess
import sys

import pytest

from llmcheck import cases, integrity


@pytest.mark.parametrize("module, dotted", [(m, d) for m, names in integrity.WATCHED.items()
                                            for d in names])
def test_every_watched_name_is_a_function(module, dotted):
    assert f"{module}.{dotted}" not in integrity.unresolved()
    assert not str(integrity.BASELINE[f"{module}.{dotted}"][1]).startswith("not a function")


def test_a_watched_name_that_does_not_resolve_stops_the_baseline(monkeypatch):
    from types import MappingProxyType
    monkeypatch.setattr(integrity, "WATCHED", MappingProxyType(
        {**integrity.WATCHED,
         "llmcheck.cases": (*integrity.WATCHED["llmcheck.cases"], "Test.renamed")}))
    assert integrity.unresolved() == ["llmcheck.cases.Test.renamed"]
    with pytest.raises(integrity.UnwatchedName, match=r"llmcheck\.cases\.Test\.renamed"):
        integrity.baseline()


def test_a_renamed_harness_function_fails_where_the_kernel_starts():
    """As the grader's preload imports it: a rename is an error, not a quiet check."""
    done = subprocess.run(
        [sys.executable, "-c", "import llmcheck.cases as c\n"
                               "c.Test._published = c.Test._publish\n"
                               "del c.Test._publish\n"
                               "import llmcheck.integrity\n"],
        capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "UnwatchedName" in done.stderr, done.stderr
    assert "llmcheck.cases.Test._publish" in done.stderr


def test_a_function_removed_after_the_start_is_a_change(monkeypatch):
    monkeypatch.delattr(cases.Test, "raises")
    assert integrity.changes() == ["llmcheck.cases.Test.raises: replaced"]


def test_the_rebinding_check_names_a_harness_function_replaced_and_put_back():
    from llmcheck import cases
    check = integrity.rebinding_check()
    assert check() == []
    original = cases._canaries
    cases._canaries = lambda recorder: {}
    try:
        assert check() == ["llmcheck.cases._canaries"]
    finally:
        cases._canaries = original
    assert check() == []
