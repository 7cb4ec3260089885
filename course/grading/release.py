"""Releasing the exercises: solutions/ -> exercises/ (nbgrader generate_assignment). Instructors."""

from __future__ import annotations

import os
from pathlib import Path

from .nbgrader_app import (_course_directory, _generate_assignment, _prepare_environment,
                           assignments_in, course_config)


def release(course_dir: str | os.PathLike = ".", *, release_dir: str | os.PathLike | None = None,
            config_file: str | os.PathLike | None = None) -> list[Path]:
    """Generate the student notebooks from solutions/ (nbgrader generate_assignment).

    Writes ``release_dir`` (default: the course's release directory, exercises/), replacing each
    assignment folder; no gradebook is touched. Returns the notebooks written. The output depends
    only on solutions/, so a fresh generation equals the committed one.
    """
    _prepare_environment()
    config = course_config(course_dir, config_file=config_file)
    config.SaveCells.enabled = False          # no gradebook: releasing records nothing
    coursedir = _course_directory(config)
    source = Path(coursedir.root) / coursedir.source_directory
    names = assignments_in(source)
    if not names:
        raise FileNotFoundError(f"release: no assignments in {source} (expected "
                                f"{source}/<assignment>/<notebook>.ipynb)")
    if release_dir is not None:
        coursedir.release_directory = str(Path(release_dir).resolve())
    written = []
    for name in names:
        coursedir.assignment_id = name
        _, notebooks = _generate_assignment(config, coursedir, no_database=True,
                                            failure=f"release: nbgrader generated nothing for {name}")
        for notebook in notebooks:
            notebook.chmod(0o644)
        written += notebooks
    return written

