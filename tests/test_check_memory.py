"""The learner's check shows the memory a size-capped test measured (issue 22, correction 11): the
largest tensor the learner's code allocated, against the most the test allows, so a learner sees
how close they are before the hidden tests apply their own cap.

The fast tests read records made by the real harness (llmcheck.cases.Test in this process); the
slow ones check exercise 7 end to end, solved and with the whole score matrix.
"""

from __future__ import annotations

import nbformat
import pytest
import torch
from nbformat.v4 import new_code_cell, new_output

from classroom import check, load_data, needs_assignment, submission, DATA
from course.grading.check import CellResult, CheckReport, Footprint, footprints, format_report
from llmcheck import cases as harness
from llmcheck.record import RECORD_MIME

TILED = "07_tiled_attention"


def _cell_of(records: list[dict]):
    """A test cell as the executor leaves it: one display_data output per record."""
    cell = new_code_cell("test = Test(...)")
    cell.outputs = [new_output("display_data", data={RECORD_MIME: r, "text/plain": "[record]"})
                    for r in records]
    return cell


def _records(monkeypatch, calls) -> list[dict]:
    """The records the real harness publishes for ``calls`` (fn, case, max_elements or None)."""
    published = []
    monkeypatch.setattr("IPython.display.display",
                        lambda data, raw: published.append(data[RECORD_MIME]))
    test = harness.Test("test_tiles")
    q, k = torch.randn(16, 4), torch.randn(16, 4)
    for fn, case, cap in calls:
        options = {} if cap is None else {"max_elements": cap}
        try:
            test.call(fn, q, k, case=case, **options)
        except AssertionError:
            pass                     # over the cap: the kernel says so, the record stays
    return published


def test_footprints_report_each_capped_case_against_its_cap(monkeypatch):
    records = _records(monkeypatch, [
        (lambda q, k: q @ k[:4].t(), "one tile", 64),          # (16, 4): 64 of 64
        (lambda q, k: q @ k[:2].t(), "half a tile", 64),       # (16, 2): 32 of 64
        (lambda q, k: q @ k.t(), "whole matrix", 64),          # (16, 16): 256, 4 times 64
        (lambda q, k: q @ k.t(), "no cap", None),              # not size-capped: not shown
    ])
    found = footprints(_cell_of(records))
    assert found == (Footprint("one tile", 64, (16, 4), 64),
                     Footprint("half a tile", 32, (16, 2), 64),
                     Footprint("whole matrix", 256, (16, 16), 64))
    assert found[0].describe() == \
        "memory: largest tensor (16, 4), 64 elements, 100% of the 64 allowed (case 'one tile')"
    assert "32 elements, 50% of the 64 allowed" in found[1].describe()
    assert "256 elements, 4.0 times the 64 allowed" in found[2].describe()


def test_malformed_or_uncapped_records_show_no_figure():
    good = {"case": "c", "options": {"max_elements": 8},
            "largest": {"elements": 4, "shape": [2, 2], "op": "aten.mm"}}
    broken = [{**good, "largest": "big"}, {**good, "options": {"max_elements": "8"}},
              {**good, "largest": {"elements": 4, "shape": "2x2"}}, {**good, "options": {}},
              {"malformed": "x"}]
    assert footprints(_cell_of(broken)) == ()
    assert footprints(_cell_of([good])) == (Footprint("c", 4, (2, 2), 8),)


def test_the_report_prints_the_figure_under_its_test(tmp_path):
    tile = Footprint("memory: n = m = 64, tiles of 8", 512, (64, 8), 512)
    report = CheckReport(tmp_path / "tiled.ipynb", (
        CellResult("test_online_step", 2, 2.0, "", False),
        CellResult("test_tiled_attention", 3, 3.0, "", False, (tile,)),
        CellResult("test_tiled_memory_hidden", 4, None, "", True)), (), ())
    lines = format_report(report).splitlines()
    at = lines.index("  PASS    test_tiled_attention: 3 of 3 points")
    assert lines[at + 1] == ("          memory: largest tensor (64, 8), 512 elements, 100% of the "
                             "512 allowed (case 'memory: n = m = 64, tiles of 8')")
    assert sum("largest tensor" in line for line in lines) == 1


# ------------------------------------------------------------------------------------------------
# End to end: exercise 7 through course-check
# ------------------------------------------------------------------------------------------------

@pytest.mark.slow
@needs_assignment(TILED)
def test_check_shows_the_tiled_memory_of_a_solved_and_a_whole_matrix_notebook(tmp_path):
    solved = tmp_path / "solved" / "tiled_attention.ipynb"
    solved.parent.mkdir()
    nbformat.write(submission(TILED, answered=True), str(solved))
    done = check(solved)
    assert done.returncode == 0, done.stdout + done.stderr
    line = next(l for l in done.stdout.splitlines()
                if "(case 'memory: n = m = 64" in l and "largest tensor" in l)
    allowed = int(line.split(" allowed")[0].split()[-1])
    elements = int(line.split(" elements")[0].split()[-1])
    assert allowed == 64 * 8 and 0 < elements <= allowed, line

    mutants = load_data("grading_mutants_tiled_attention", DATA / "mutants_tiled_attention.py")
    whole = next(s for s in mutants.WRONG if s.student == "whole_score_matrix")
    wrong = tmp_path / "whole" / "tiled_attention.ipynb"
    wrong.parent.mkdir()
    nbformat.write(submission(TILED, answered=True, edits=whole.edits), str(wrong))
    done = check(wrong)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL    test_tiled_attention" in done.stdout, done.stdout
    assert "largest tensor (64, 64), 4096 elements, 8.0 times the 512 allowed" in done.stdout, \
        done.stdout
