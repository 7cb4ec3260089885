"""The classes nbgrader loads by name: ``nbgrader_config.py`` lists them, and nbconvert imports
them from these paths when plain ``nbgrader autograde`` runs.

* :class:`BoundedExecute` runs a notebook (defined in :mod:`course.grading.executor`, which
  needs no nbgrader: the learner's check uses it too);
* :class:`Verdicts` judges every test cell's records against the solution notebook's
  (course/grading/verdicts.py; the contract is course/grading/VERDICTS.md).

This module imports nbgrader; nothing in ``import course.grading`` imports it (the learner's
check and the grader reach these classes through :func:`course.grading.limits.bounded_execute`
and :func:`course.grading.nbgrader_app.autograde_preprocessors` when they run a notebook).
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path

from nbgrader.coursedir import CourseDirectory
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Unicode

from .executor import BoundedExecute  # noqa: F401  (nbgrader_config.py names it here)
from .verdicts import expected_records, instructor_test_sources, judge_notebook


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
