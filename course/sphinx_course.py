"""The book's own Sphinx extension (listed in _config.yml): every chapter page offers its notebook
as an ``.ipynb`` download and says how to open it in JupyterLab, and the repository button's
address can be set when the book is built.

* Download: sphinx-book-theme's download menu offers ``.ipynb`` only when a launch button
  (Binder, JupyterHub, Colab) is configured; a site built with none (the placeholder or empty
  addresses of _config.yml: see course/launch.py for the buttons) still offers it,
  because this extension copies the notebook that MyST-NB writes for the page
  (``_build/jupyter_execute/<page>.ipynb``: the page's cells and kernel; MyST-NB keeps the
  outputs in its execution cache, not in this file, so the learner gets a clean notebook to run)
  next to the page's source under ``_sources/`` and names it in the page context, so the theme's
  menu lists it.
* A note at the top of each such page says what to do with it (:data:`RUN_NOTE`).
* Repository: ``repository.url`` in _config.yml is the address of the course's repository; the
  environment variable ``COURSE_REPOSITORY_URL`` (:data:`REPOSITORY_VARIABLE`), when set at build
  time, replaces it (a fork or a mirror builds its own site without editing the file).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Mapping

REPOSITORY_VARIABLE = "COURSE_REPOSITORY_URL"

RUN_NOTE = (
    '<div class="admonition tip run-in-lab">\n'
    '<p class="admonition-title">Run this chapter</p>\n'
    "<p>Download it as a notebook (the download button at the top of the page, then "
    "<strong>.ipynb</strong>), or open <code>{source}</code> from the course's folder: start "
    "JupyterLab there with <code>course-lab</code> (or <code>make lab</code>) and double-click "
    "the file; it opens as a notebook. The notebook imports <code>llmcore</code>, so run it with "
    "the course installed (README, \"Install\").</p>\n</div>\n")
"""Shown under the title of every page that has a notebook; {source}: the page's source file."""


def repository_url(default: str, environ: Mapping[str, str] | None = None) -> str:
    """The repository address for the site: ``$COURSE_REPOSITORY_URL`` if set (in ``environ``,
    default ``os.environ``), else default."""
    return (os.environ if environ is None else environ).get(REPOSITORY_VARIABLE, "").strip() \
        or default


def _set_repository(app, config) -> None:
    options = dict(config.html_theme_options or {})
    url = repository_url(options.get("repository_url", ""))
    if url:
        options["repository_url"] = url
        config.html_theme_options = options


def executed_notebook(app, pagename: str) -> Path | None:
    """The notebook MyST-NB wrote for a page, if the page is a notebook."""
    folder = Path(app.outdir).parent / getattr(app.config, "nb_output_folder", "jupyter_execute")
    path = folder / f"{pagename}.ipynb"
    return path if path.is_file() else None


def _offer_notebook(app, pagename, templatename, context, doctree) -> None:
    notebook = executed_notebook(app, pagename)
    if notebook is None or doctree is None:
        return
    target = Path(app.outdir) / "_sources" / f"{pagename}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(notebook, target)
    context["ipynb_source"] = f"{pagename}.ipynb"
    body = context.get("body", "")
    end_of_title = body.find("</h1>")
    if end_of_title >= 0:
        note = RUN_NOTE.format(source=app.env.doc2path(pagename, base=False))
        at = end_of_title + len("</h1>")
        context["body"] = body[:at] + "\n" + note + body[at:]


def setup(app):
    app.connect("config-inited", _set_repository)
    # before sphinx-book-theme builds its header buttons (priority 501)
    app.connect("html-page-context", _offer_notebook, priority=500)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
