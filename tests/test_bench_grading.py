"""The benchmark's grading section (a class graded at scale): the class it builds mixes honest,
wrong and hostile submissions over every assignment, the projections follow from the measured
rate, and a --quick run grades a small class through ``python -m course.bench grading``."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from classroom import ALL_ASSIGNMENTS, ROOT
from course.bench import __main__ as bench, grading
from course.grading import standby


def test_the_class_mixes_every_kind_over_every_assignment(tmp_path):
    assignments = [a for a in sorted(ALL_ASSIGNMENTS) if (ROOT / "solutions" / a).is_dir()]
    kinds = grading.build_class(tmp_path / "course", 6, assignments)
    submitted = sorted((tmp_path / "course" / "submitted").glob("*/*/*.ipynb"))
    assert len(submitted) == sum(kinds.values()) == 6 * len(assignments)
    assert {"honest", "wrong", "hostile"} <= set(kinds), kinds
    assert {p.parent.name for p in submitted} == set(assignments)
    assert (tmp_path / "course" / "nbgrader_config.py").is_file()


def test_projections_scale_the_measured_rate():
    lines = grading.projection(rate_per_min=6.0, cores_used=2, notebooks=400,
                               per_notebook_disk=2**20, peak_per_worker=2**30, assignments=10)
    assert "about 48 notebooks/min" in lines[0] and "in 8.3 min" in lines[0]
    assert "16.0 GiB" in lines[0]
    assert "5000 notebooks: 1.7 h on 16 cores (13.9 h at this run's rate)" in lines[1]
    assert "500 notebooks in 10 min" in lines[1] and "4.88 GiB" in lines[1]


def test_the_section_is_run_by_name_only():
    assert bench.parse_args(["grading"]).section == ["grading"]
    assert bench.parse_args([]).section is None and "grading" in bench.ON_REQUEST
    with pytest.raises(SystemExit):
        bench.parse_args(["nonsense"])


@pytest.mark.slow
def test_a_quick_grading_run_reports_every_figure():
    done = subprocess.run([sys.executable, "-m", "course.bench", "grading", "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout + done.stderr
    text = done.stdout
    count = int(re.search(r"= (\d+) notebooks \(", text).group(1))
    assert re.search(rf"graded: {count} rows", text), text
    assert re.search(r"wall time: \d+ s: .* submissions at [\d.]+ notebooks/min", text), text
    assert re.search(r"peak memory .*: [\d.]+ GiB", text), text
    pages = re.search(r"feedback pages: (\d+), largest (\d+) kB", text)
    assert pages and int(pages.group(1)) == count and int(pages.group(2)) < 200, text
    assert "on paper, 16 cores" in text and "a hub of 500 students" in text
    assert re.search(r"check on the untouched .*: [\d.]+ s then; now [\d.]+ s in the learner's "
                     r"loop .*: [\d.]+x faster \(goal 3x\); [\d.]+ s with none ready "
                     r"\(--no-standby\): [\d.]+x; first line after [\d.]+ s then, [\d.]+ s now",
                     text), text
    assert not standby.untaken(), "the benchmark left standby kernels running"
    for part in ("the submissions", "the whole run"):
        assert re.search(rf"= \d+ notebooks on \d+ workers, {part}.*: [\d.]+ notebooks/min then, "
                         r"[\d.]+ now: [\d.]+x \(goal 3x\)", text), text
