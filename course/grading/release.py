"""Releasing the exercises: solutions/ -> exercises/ (nbgrader generate_assignment). Instructors.

A release never overwrites a learner's edits: it records the sha256 of every notebook it writes
in ``exercises/.release.json``, and refuses (naming the files) to replace a notebook that differs
from what the previous release wrote (or, with no record, from what this release writes), unless
``force``, which first copies those notebooks to ``.exercises-backup/<time>/``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from .nbgrader_app import (course_directory, generate_assignment, prepare_environment,
                           assignments_in, course_config)

MANIFEST = ".release.json"
BACKUP_DIR = ".exercises-backup"


class EditedExercises(RuntimeError):
    """The release would overwrite notebooks that were edited since the last release."""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def edited_notebooks(target: Path, fresh: Path) -> list[Path]:
    """Notebooks in ``target`` that a release of ``fresh`` would overwrite and that differ from
    what the previous release wrote there (recorded in the manifest; with no record: from the
    fresh notebook itself)."""
    manifest = target / MANIFEST
    recorded = json.loads(manifest.read_text()) if manifest.is_file() else {}
    edited = []
    for notebook in sorted(target.glob("*/*.ipynb")):
        rel = notebook.relative_to(target).as_posix()
        new = fresh / rel
        expected = recorded.get(rel) or (_sha256(new) if new.is_file() else None)
        if (new.is_file() or rel in recorded) and _sha256(notebook) != expected:
            edited.append(notebook)
    return edited


def release(course_dir: str | os.PathLike = ".", *, release_dir: str | os.PathLike | None = None,
            config_file: str | os.PathLike | None = None, force: bool = False) -> list[Path]:
    """Generate the student notebooks from solutions/ (nbgrader generate_assignment).

    Writes ``release_dir`` (default: the course's release directory, exercises/), replacing each
    assignment folder; no gradebook is touched. Returns the notebooks written. The output depends
    only on solutions/, so a fresh generation equals the committed one. Raises
    :class:`EditedExercises` naming the notebooks edited since the last release, unless
    ``force`` (then they are backed up first).
    """
    prepare_environment()
    config = course_config(course_dir, config_file=config_file)
    config.SaveCells.enabled = False          # no gradebook: releasing records nothing
    coursedir = course_directory(config)
    root = Path(coursedir.root)
    source = root / coursedir.source_directory
    names = assignments_in(source)
    if not names:
        raise FileNotFoundError(f"release: no assignments in {source} (expected "
                                f"{source}/<assignment>/<notebook>.ipynb)")
    target = Path(release_dir).resolve() if release_dir is not None \
        else root / coursedir.release_directory
    with tempfile.TemporaryDirectory(prefix="course-release-") as scratch:
        fresh = Path(scratch)
        coursedir.release_directory = str(fresh)
        for name in names:
            coursedir.assignment_id = name
            generate_assignment(config, coursedir, no_database=True,
                                 failure=f"release: nbgrader generated nothing for {name}")
        edited = edited_notebooks(target, fresh)
        if edited and not force:
            listed = "\n  ".join(str(p) for p in edited)
            raise EditedExercises(
                f"release: refusing to overwrite {len(edited)} notebook(s) edited since the "
                f"last release:\n  {listed}\nSave your work elsewhere, or pass --force to "
                f"overwrite them (a copy is kept in {root / BACKUP_DIR}/).")
        if edited:
            backup = root / BACKUP_DIR / time.strftime("%Y%m%dT%H%M%S")
            for notebook in edited:
                copy = backup / notebook.relative_to(target)
                copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(notebook, copy)
        written, manifest = [], {}
        for name in names:
            shutil.rmtree(target / name, ignore_errors=True)
            shutil.copytree(fresh / name, target / name)
            for notebook in sorted((target / name).glob("*.ipynb")):
                notebook.chmod(0o644)
                manifest[notebook.relative_to(target).as_posix()] = _sha256(notebook)
                written.append(notebook)
    (target / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return written
