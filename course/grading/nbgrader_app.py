"""Running nbgrader's own applications for a course directory.

The course directory comes from an argument or the working directory (as nbgrader's commands do),
never from where this package is installed. nbgrader is imported only when a function runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Iterator


CONFIG_NAME = "nbgrader_config.py"


def prepare_environment() -> None:
    """Put this interpreter's bin directory first on PATH: nbgrader runs ``alembic`` for a new
    gradebook, and the ``python3`` kernel spec starts ``python`` from PATH.

    Also skips one optional import: nbformat imports jsonschema, which tries rfc3987_syntax (an
    "iri" format checker that no notebook uses) and that package builds a parser at import, about
    2.5 s of CPU for every command. jsonschema does without it (``suppress(ImportError)``)."""
    sys.modules.setdefault("rfc3987_syntax", None)
    bin_dir = os.path.dirname(sys.executable)
    parts = os.environ.get("PATH", "").split(os.pathsep)
    if parts[:1] != [bin_dir]:
        os.environ["PATH"] = os.pathsep.join([bin_dir, *[p for p in parts if p != bin_dir]])


def find_config(start: Path) -> Path | None:
    """The nbgrader_config.py of the course that holds ``start``: the nearest one in start or
    its parents (None if there is none: nbgrader's defaults apply)."""
    start = start.resolve()
    for folder in [start, *start.parents] if start.is_dir() else list(start.parents):
        if (folder / CONFIG_NAME).is_file():
            return folder / CONFIG_NAME
    return None


def course_config(course_dir: str | os.PathLike = ".", *,
                  gradebook: str | os.PathLike | None = None, timeout: int | None = None,
                  config_file: str | os.PathLike | None = None):
    """The nbgrader configuration for a course directory, as a traitlets ``Config``.

    Reads nbgrader_config.py (``config_file``, else the nearest one at or above ``course_dir``,
    else at or above the working directory, as nbgrader's own commands read it), then sets
    the course root to ``course_dir``, the gradebook (default ``course_dir/gradebook.db``), the
    cell timeout if given, the grader's bounded Execute preprocessor, and the course's feedback
    page (hidden tests hidden, math as MathML: course/grading/feedback.py).
    """
    from nbgrader.converters import Autograde, GenerateFeedback
    from traitlets.config import Config
    from traitlets.config.loader import PyFileConfigLoader

    course = Path(course_dir).resolve()
    path = Path(config_file).resolve() if config_file else \
        find_config(course) or find_config(Path.cwd())
    config = Config()
    if path is not None:
        config.merge(PyFileConfigLoader(path.name, path=str(path.parent)).load_config())
    config.CourseDirectory.root = str(course)
    book = Path(gradebook).resolve() if gradebook else course / "gradebook.db"
    config.CourseDirectory.db_url = f"sqlite:///{book}"
    if timeout is not None:
        config.Execute.timeout = int(timeout)
    config.Autograde.autograde_preprocessors = autograde_preprocessors()
    sanitize = Autograde.class_traits()["sanitize_preprocessors"].default()
    at = next(i for i, p in enumerate(sanitize) if p.__name__ == "OverwriteCells")
    config.Autograde.sanitize_preprocessors = [*sanitize[:at],
                                               "course.grading.hidden.RestoreHiddenTests",
                                               *sanitize[at:]]
    feedback = GenerateFeedback.class_traits()["preprocessors"].default()
    config.GenerateFeedback.preprocessors = [*feedback, "course.grading.feedback.HideHiddenTests"]
    config.GenerateFeedback.exporter_class = "course.grading.feedback.FeedbackExporter"
    return config


def autograde_preprocessors() -> list:
    """nbgrader's autograde pipeline with the course's two changes: Execute bounded (limits) and
    the trusted Verdicts (course/grading/VERDICTS.md) judging every test cell before its grade is
    saved. course-grade uses it; nbgrader_config.py spells the same list for plain
    `nbgrader autograde` (a test checks that the two agree)."""
    from nbgrader.converters import Autograde
    from nbgrader.preprocessors import Execute, SaveAutoGrades

    from .executor import BoundedExecute
    from .judging import Verdicts
    steps = []
    for step in Autograde.class_traits()["autograde_preprocessors"].default():
        if step is SaveAutoGrades:
            steps.append(Verdicts)
        steps.append(BoundedExecute if step is Execute else step)
    return steps


def course_directory(config, **attrs):
    """nbgrader's CourseDirectory for ``config``, with ``attrs`` set on it (assignment_id...)."""
    from nbgrader.coursedir import CourseDirectory
    coursedir = CourseDirectory(config=config)
    for name, value in attrs.items():
        setattr(coursedir, name, value)
    return coursedir


class LogRecords(logging.Handler):
    """Keeps a converter's log records (level, message) for failure reasons and --verbose."""

    def __init__(self):
        super().__init__(level=logging.INFO)
        self.records: list[tuple[int, str]] = []

    def emit(self, record):
        with contextlib.suppress(Exception):
            self.records.append((record.levelno, record.getMessage()))

    def errors(self) -> str:
        """The ERROR (and worse) messages, one per line."""
        return "\n".join(m for level, m in self.records if level >= logging.ERROR)


@contextlib.contextmanager
def quiet_gradebook() -> Iterator[None]:
    """Silence two harmless warnings of nbgrader 0.9 with today's libraries: its gradebook makes
    SQLAlchemy 2 warn "... not in session, add operation ... will not proceed" while it creates a
    submission (which it then adds: nothing is lost), and a test cell it puts back into a
    submission has no cell id (nbformat gives it one)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not in session.*")
        warnings.filterwarnings("ignore", message="Cell is missing an id field")
        yield


def run_converter(app) -> LogRecords:
    """Start an nbgrader converter; return its log. nbgrader raises at the end of a run in which
    some submissions failed (after grading all the others): that is reported, not raised."""
    from nbgrader.converters.base import NbGraderException
    records = LogRecords()
    app.log.addHandler(records)
    old_level = app.log.level
    app.log.setLevel(logging.INFO)
    try:
        with quiet_gradebook():
            app.start()
    except NbGraderException:
        pass
    finally:
        app.log.removeHandler(records)
        app.log.setLevel(old_level)
    return records


def assignments_in(folder: Path) -> list[str]:
    """Assignment names: the sub-folders of ``folder`` that hold at least one notebook."""
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir()
                  if p.is_dir() and not p.name.startswith((".", "_")) and any(p.glob("*.ipynb")))



def generate_assignment(config, coursedir, *, no_database: bool,
                         failure: str) -> tuple[LogRecords, list[Path]]:
    """nbgrader generate_assignment of ``coursedir.assignment_id`` into its release directory;
    returns the log and the notebooks written, or raises RuntimeError(failure + nbgrader's errors)
    when it wrote none."""
    from nbgrader.converters import GenerateAssignment
    app = GenerateAssignment(coursedir=coursedir, config=config)
    app.force = True
    app.no_database = no_database
    records = run_converter(app)
    folder = Path(coursedir.root) / coursedir.release_directory / coursedir.assignment_id
    notebooks = sorted(folder.glob("*.ipynb"))
    if not notebooks:
        raise RuntimeError(f"{failure}:\n{records.errors()}")
    return records, notebooks



def last_error_line(text: str) -> str:
    """The line of ``text`` (a traceback or a log) that says what went wrong: the last line
    naming an error, else the last line; ANSI colours stripped."""
    from nbconvert.filters import strip_ansi
    lines = [line.rstrip() for line in strip_ansi(text).splitlines() if line.strip()]
    for line in reversed(lines):
        if re.match(r"^\w*(Error|Exception|Interrupt|Exit)\b", line.strip()):
            return line.strip()
    return lines[-1].strip() if lines else "failed"

