"""Feedback pages a learner may read: each test's name, points and message, never the hidden
tests' source, and math rendered without a network (MathJax inlined from a local copy).

:class:`HideHiddenTests` is an nbconvert preprocessor for nbgrader's ``GenerateFeedback`` (set in
``nbgrader_config.py``); :func:`finish_feedback_pages` replaces the CDN MathJax of nbgrader's
feedback template by the local bundle of the ``sphinx-mathjax-offline`` package.
"""

from __future__ import annotations

import re
from pathlib import Path

from nbconvert.preprocessors import Preprocessor
from traitlets import Bool

HIDDEN_MARK = "### BEGIN HIDDEN TESTS"
HIDDEN_NOTE = "# Hidden tests: their code is not shown. Their result is below."


class HideHiddenTests(Preprocessor):
    """In a feedback page, a test cell with hidden tests keeps its visible part and its score;
    the hidden code is replaced by a note, and an error keeps its type and message only (a
    traceback would quote the hidden code)."""

    enabled = Bool(True).tag(config=True)

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "code" and HIDDEN_MARK in cell.source:
            cell.source = cell.source.split(HIDDEN_MARK)[0].rstrip() + "\n" + HIDDEN_NOTE
            for out in cell.get("outputs", []):
                if out.output_type == "error":
                    out.traceback = [f"{out.ename}: {out.evalue}"]
        return cell, resources


_MATHJAX_BLOCK = re.compile(r"<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->",
                            re.S)
_MATHJAX_CONFIG = ("<script>window.MathJax = {tex: {inlineMath: [['$', '$'], ['\\\\(', '\\\\)']], "
                   "processEscapes: true}, svg: {fontCache: 'global'}};</script>\n")


def local_mathjax() -> Path | None:
    """MathJax 3's single-file SVG bundle shipped by the sphinx-mathjax-offline package (the
    book's offline MathJax), or None if it is not installed."""
    import sys
    for entry in sys.path:
        candidate = Path(entry or ".") / "sphinx-mathjax-offline" / "static" / "mathjax" / "tex-svg.js"
        if candidate.is_file():
            return candidate
    return None


def offline_math(page: str, bundle: Path | None) -> str:
    """The page with nbgrader's CDN MathJax replaced by the inlined local bundle (or removed,
    leaving the TeX as typed, when there is no bundle)."""
    script = ""
    if bundle is not None:
        code = bundle.read_text(encoding="utf-8").replace("</script", "<\\/script")
        script = _MATHJAX_CONFIG + f"<script>{code}</script>"
    return _MATHJAX_BLOCK.sub(lambda _: script, page)


def finish_feedback_pages(folder: Path) -> None:
    """Make every feedback page in ``folder`` render its math offline."""
    bundle = local_mathjax()
    for page in sorted(Path(folder).glob("*.html")):
        page.write_text(offline_math(page.read_text(encoding="utf-8"), bundle), encoding="utf-8")
