"""What a grading worker imports, loaded once by the fork server of :mod:`.workers` (its
``import`` is the whole effect): every job's process is forked with these already in memory,
instead of paying about a second of imports per notebook. Nothing here starts a thread, opens a
socket or reads a course: a fork of it is as fresh as a new interpreter."""

from .nbgrader_app import prepare_environment

prepare_environment()             # PATH, and jsonschema's slow optional import skipped

import nbformat                   # noqa: E402,F401  (imported for their side effect: loaded)
import nbconvert.exporters        # noqa: E402,F401
import nbgrader.api               # noqa: E402,F401
import nbgrader.converters        # noqa: E402,F401
import jupyter_client             # noqa: E402,F401

from . import sandbox, worker     # noqa: E402,F401
