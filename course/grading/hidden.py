"""Putting a released test cell's hidden tests back before nbgrader checks it.

A released test cell holds the instructor's cell without its hidden tests, so nbgrader's
OverwriteCells finds its checksum "changed" in every submission, warns, and restores the source
from the gradebook. :class:`RestoreHiddenTests` (a sanitize preprocessor of ``nbgrader
autograde``, set in ``nbgrader_config.py``) restores the hidden tests of every locked cell that is
exactly as released, so an untouched notebook raises no warning, while a test cell the learner
changed is still reported and overwritten by OverwriteCells.
"""

from __future__ import annotations

import copy

from nbconvert.preprocessors import Preprocessor
from traitlets import Bool


class RestoreHiddenTests(Preprocessor):
    """Locked cells whose source equals the released form of the instructor's cell get the
    instructor's source (with its hidden tests) back."""

    enabled = Bool(True).tag(config=True)

    def preprocess(self, nb, resources):
        from nbgrader.api import Gradebook, MissingEntry
        from nbgrader.preprocessors import ClearHiddenTests

        info = resources["nbgrader"]
        clear = ClearHiddenTests(config=self.config)
        with Gradebook(info["db_url"]) as gb:
            for cell in nb.cells:
                grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
                if grade_id is None:
                    continue
                try:
                    source = gb.find_source_cell(grade_id, info["notebook"], info["assignment"])
                except MissingEntry:
                    continue
                if not source.locked or clear.begin_test_delimeter not in source.source:
                    continue
                released = copy.deepcopy(cell)
                released.source = source.source
                released, _ = clear.preprocess_cell(released, {}, 0)
                if cell.source == released.source:
                    cell.source = source.source
        return nb, resources
