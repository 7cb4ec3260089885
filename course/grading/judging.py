"""Judging a submission in nbgrader's autograde: the solution's records and the Verdicts step.

:func:`expected_records` runs the instructor's solution notebook once in a fresh kernel (the
course's executor, with the grade run's secret) and keeps its records per test cell, cached;
:class:`Verdicts`, the autograde preprocessor that ``nbgrader_config.py`` names after Execute,
judges every test cell of a submission against them with the rules of
:mod:`course.grading.verdicts` (the contract is course/grading/VERDICTS.md). This module imports
nbgrader; nothing in ``import course.grading`` imports it.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import pickle
import tempfile
from dataclasses import asdict
from pathlib import Path

import nbformat
import numpy as np
from nbgrader.coursedir import CourseDirectory
from nbgrader.preprocessors import ClearHiddenTests, NbGraderPreprocessor
from traitlets import Unicode

from llmcheck.record import TWIN_SUFFIX
from .executor import BoundedExecute
from .secret import fingerprint, run_secret
from .verdicts import judge_notebook, kernel_error, records_of, test_cells

CACHE_VERSION = 2


class Verdicts(NbGraderPreprocessor):
    """Judge every test cell's records against the solution notebook's (after Execute)."""

    cache_dir = Unicode(
        "", help="Folder for the solution notebooks' records (cached by content); default: "
                 "$COURSE_VERDICTS_CACHE, else .verdicts/ in the course root (parallel "
                 "workers in scratch courses share one by setting either)").tag(config=True)

    def preprocess(self, nb, resources):
        info = resources.get("nbgrader", {})
        coursedir = CourseDirectory(config=self.config)
        folder = Path(coursedir.format_path(coursedir.source_directory, ".",
                                            info["assignment"]))
        source = folder / f"{info['notebook']}.ipynb"
        if not source.is_file():
            raise RuntimeError(f"verdicts: no solution notebook {source} to judge against")
        cache = Path(self.cache_dir or os.environ.get("COURSE_VERDICTS_CACHE")
                     or Path(coursedir.root) / ".verdicts")
        expected = expected_records(source, self.config, cache / info["assignment"])
        verdicts = judge_notebook(nb, expected, instructor_test_sources(source))
        resources.setdefault("verdicts", {}).update(
            {k: asdict(v) for k, v in verdicts.items()})
        return nb, resources


def instructor_test_sources(source: Path) -> frozenset[str]:
    """The instructor's test cells of a solution notebook, each as written (hidden tests
    included) and as released (hidden tests removed, as nbgrader's ClearHiddenTests does)."""
    clear = ClearHiddenTests()
    sources = set()
    for cell in test_cells(nbformat.read(str(source), as_version=4)):
        released = copy.deepcopy(cell)
        clear._remove_hidden_test_region(released)
        sources |= {cell.source.strip(), released.source.strip()}
    return frozenset(sources)


def _cache_key(source: Path) -> str:
    """What the solution's records depend on: the notebook, llmcore's code (models, inputs,
    the harness) and the torch and NumPy versions."""
    h = hashlib.sha256(source.read_bytes())
    for package in ("llmcore", "llmcheck"):
        spec = importlib.util.find_spec(package)         # found, not imported (no torch here)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            for path in sorted(Path(folder).rglob("*.py")):
                h.update(path.read_bytes())
    h.update(f"{importlib.metadata.version('torch')} {np.__version__}".encode())
    return h.hexdigest()[:16]


def expected_records(source: Path, config, cache_dir: Path | None,
                     secret: str | None = None) -> dict[str, list[dict]]:
    """grade_id -> the records of the solution notebook's test cell, its cases' fresh-input
    twins drawn from ``secret`` (default: this run's, course/grading/secret.py) included; cached
    by the notebook, llmcore's and llmcheck's code, the library versions and the secret's
    fingerprint.

    Raises RuntimeError when a test cell of the solution fails or makes no record."""
    secret = secret or run_secret()
    key = f"{_cache_key(source)}-{fingerprint(secret)}"
    cached = cache_dir / f"{source.stem}-{key}.json" if cache_dir else None
    if cached is not None and cached.is_file():
        stored = json.loads(cached.read_text())
        if stored.get("version") == CACHE_VERSION:
            return stored["records"]
    records = _run_solution(source, config, secret)
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=cached.parent, delete=False,
                                         suffix=".tmp") as f:
            json.dump({"version": CACHE_VERSION, "records": records}, f)
        os.replace(f.name, cached)
    return records


RECORDS_ERROR = ".error"
"""Beside a records job's file: why the solution failed (the message of expected_records)."""


def records_job(job_file: str) -> int:
    """A forked process of the grader (course/grading/workers.py) computing one solution's
    records into the run's cache: ``job_file`` is the grader's pickle of ``(source, config,
    cache_dir, secret)``. A solution that fails its own tests leaves the reason in
    ``job_file + RECORDS_ERROR`` and exits 1."""
    with open(job_file, "rb") as f:
        source, config, cache_dir, secret = pickle.load(f)     # written by the grader itself
    try:
        expected_records(Path(source), config, Path(cache_dir), secret)
    except RuntimeError as error:
        Path(job_file + RECORDS_ERROR).write_text(str(error))
        return 1
    return 0


def _run_solution(source: Path, config, secret: str) -> dict[str, list[dict]]:
    nb = nbformat.read(str(source), as_version=4)
    execute = BoundedExecute(config=config)
    execute.grade_secret = secret
    with tempfile.TemporaryDirectory(prefix="solution-run-") as folder:
        nb, _ = execute.preprocess(nb, {"metadata": {"path": folder}})
    records = {}
    for cell in test_cells(nb):
        grade_id = cell.metadata.nbgrader["grade_id"]
        found = records_of(cell)
        if kernel_error(cell) or not found or any(r["violations"] for r in found) \
                or not all(all(r["canaries"].values()) for r in found):
            raise RuntimeError(f"the solution {source} fails its own test cell {grade_id} (or it "
                               "makes no record through llmcheck.cases.Test): fix the solution "
                               "or the test")
        twins_wrong = [r["case"] for r in found if r["case"].endswith(TWIN_SUFFIX)
                       and _twin_went_wrong(r)]
        if twins_wrong:
            raise RuntimeError(f"the solution {source}, test cell {grade_id}: case "
                               f"{twins_wrong[0]!r} went wrong on fresh inputs (raised where the "
                               "case returns, or did not raise the expected error where it "
                               "raises): its inputs need their values (pass fresh_inputs=False "
                               "to that test.call) or its fresh_inputs rule draws wrong inputs")
        records[grade_id] = found
    return records


def _twin_went_wrong(record: dict) -> bool:
    """Whether the solution's twin record failed its own case: a ``Test.call`` twin that raised,
    or a ``Test.raises`` twin without the expected error."""
    output = record.get("output") or {}
    expect = (record.get("options") or {}).get("expect")
    if expect is None:
        return "raised" in output
    return "raised" not in output or expect not in (output["raised"].get("types") or [])
