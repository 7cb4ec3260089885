"""One click from a chapter to running it: the book's launch buttons and the links behind them.

* **JupyterHub** (``launch_buttons.jupyterhub_url`` in _config.yml): sphinx-book-theme's button,
  a link through nbgitpuller (``/hub/user-redirect/git-pull``): the hub logs the reader in, pulls
  the course's repository (``repository.url``, branch ``repository.branch``) into their home
  folder, or updates the copy they have without overwriting their edits, and opens the chapter
  in JupyterLab. :func:`nbgitpuller_link` builds the same link for anything in the repository
  (``python -m course.launch``: an instructor's links to exercises, for example).
* **Colab** (``launch_buttons.colab_url``): Colab opens notebooks from GitHub, and the chapters
  are MyST Markdown (Colab cannot open them), so the button opens the chapter's notebook as the
  published site holds it: ``_sources/<page>.ipynb`` on the branch ``launch_buttons.colab_branch``
  (``gh-pages``, where ``ghp-import`` publishes the site). That notebook (also the page's
  ``.ipynb`` download) starts with :func:`colab_cell`: on Colab it installs the course from the
  repository, anywhere else it does nothing.

Each button is off while its address is empty. The Sphinx extension (:func:`setup`, listed in
_config.yml) takes the Colab button over from the theme (whose link would point at the ``.md``)
and writes the first cell into each page's notebook. Nothing is fetched when the book builds.
``COURSE_HUB_URL``, when set at build time, replaces ``jupyterhub_url`` (empty: no button).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.parse
from pathlib import Path
from typing import Sequence

HUB_VARIABLE = "COURSE_HUB_URL"
COLAB_MARKER = "course-colab-install"
"""The metadata key that marks the first cell :func:`colab_cell` wrote into a notebook."""
INTERFACES = {"jupyterlab": "lab/tree", "classic": "tree"}
"""nbgitpuller's ``urlpath`` prefix for each ``notebook_interface`` (the theme's own)."""


def repository_parts(repository_url: str) -> tuple[str, str]:
    """(owner, name) of a GitHub repository address; ValueError for any other address."""
    parsed = urllib.parse.urlsplit(repository_url.strip())
    parts = [p for p in parsed.path.split("/") if p]
    if parsed.netloc.lower() != "github.com" or len(parts) < 2:
        raise ValueError(f"repository address: expected https://github.com/<owner>/<name>, "
                         f"got {repository_url!r}")
    return parts[0], parts[1].removesuffix(".git")


def nbgitpuller_link(hub_url: str, repository_url: str, path: str, *, branch: str = "main",
                     interface: str = "jupyterlab") -> str:
    """The link that opens ``path`` (relative to the repository's root) on the hub at
    ``hub_url`` after nbgitpuller has pulled ``branch`` of the repository into the user's
    ``~/<repository name>``. The same link as the book's JupyterHub button."""
    if not hub_url.strip():
        raise ValueError("hub address: expected https://<your hub>, got an empty address")
    if interface not in INTERFACES:
        raise ValueError(f"interface: expected one of {sorted(INTERFACES)}, got {interface!r}")
    _, name = repository_parts(repository_url)
    query = urllib.parse.urlencode(
        {"repo": repository_url, "urlpath": f"{INTERFACES[interface]}/{name}/{path.lstrip('/')}",
         "branch": branch}, safe="/")
    return f"{hub_url.strip().rstrip('/')}/hub/user-redirect/git-pull?{query}"


def colab_link(colab_url: str, repository_url: str, pagename: str, *,
               branch: str = "gh-pages") -> str:
    """The Colab link to the published notebook of page ``pagename`` (e.g. chapters/01_shapes)."""
    owner, name = repository_parts(repository_url)
    return f"{colab_url.strip().rstrip('/')}/github/{owner}/{name}/blob/{branch}/" \
           f"_sources/{pagename}.ipynb"


def install_target(repository_url: str, branch: str) -> str:
    """What pip installs on Colab: the course's package from its repository."""
    return f"llmcore @ git+{repository_url.strip().removesuffix('/')}@{branch}"


def colab_cell(repository_url: str, branch: str) -> str:
    """The first cell of every chapter's notebook: installs the course on Colab, else nothing."""
    return ("# On Google Colab this cell installs the course; anywhere else it does nothing.\n"
            "import sys\n"
            "if \"google.colab\" in sys.modules:\n"
            "    import subprocess\n"
            f"    target = {json.dumps(install_target(repository_url, branch))}\n"
            "    subprocess.run([sys.executable, \"-m\", \"pip\", \"install\", \"--quiet\",\n"
            "                    target], check=True)\n")


def add_colab_cell(notebook_path: str | os.PathLike, repository_url: str, branch: str) -> None:
    """Put :func:`colab_cell` first in a notebook file (once: a cell it wrote is replaced)."""
    path = Path(notebook_path)
    notebook = json.loads(path.read_text(encoding="utf-8"))
    cells = [c for c in notebook["cells"] if not c.get("metadata", {}).get(COLAB_MARKER)]
    source = colab_cell(repository_url, branch)
    cells.insert(0, {"cell_type": "code", "execution_count": None, "outputs": [],
                     "metadata": {COLAB_MARKER: True},
                     "source": source.splitlines(keepends=True)})
    if notebook.get("nbformat", 4) >= 4 and notebook.get("nbformat_minor", 0) >= 5:
        cells[0]["id"] = COLAB_MARKER
    notebook["cells"] = cells
    path.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


# ------------------------------------------------------------------ the Sphinx extension

def _take_over_colab(app, config) -> None:
    """Keep the Colab settings for this extension (the theme's Colab link would open the .md),
    and apply COURSE_HUB_URL."""
    options = dict(config.html_theme_options or {})
    buttons = dict(options.get("launch_buttons") or {})
    app.course_colab = {"url": buttons.pop("colab_url", "") or "",
                        "branch": buttons.pop("colab_branch", "") or "gh-pages"}
    if os.environ.get(HUB_VARIABLE) is not None:
        buttons["jupyterhub_url"] = os.environ[HUB_VARIABLE].strip()
    options["launch_buttons"] = buttons
    config.html_theme_options = options


def _colab_button(app, pagename, templatename, context, doctree) -> None:
    colab = getattr(app, "course_colab", {})
    notebook = Path(app.outdir) / "_sources" / f"{pagename}.ipynb"
    if not colab.get("url") or doctree is None or not notebook.is_file():
        return
    options = app.config.html_theme_options
    repository = options.get("repository_url", "")
    branch = options.get("repository_branch") or "main"
    add_colab_cell(notebook, repository, branch)
    button = {"type": "link", "text": "Colab", "tooltip": "Launch on Colab",
              "icon": "_static/images/logo_colab.png",
              "url": colab_link(colab["url"], repository, pagename, branch=colab["branch"])}
    buttons = context.setdefault("header_buttons", [])
    group = next((b for b in buttons if b.get("label") == "launch-buttons"), None)
    if group is None:
        buttons.append({"type": "group", "tooltip": "Launch interactive content",
                        "icon": "fas fa-rocket", "buttons": [button],
                        "label": "launch-buttons"})
    else:
        group["buttons"].append(button)


def setup(app):
    # after course.sphinx_course's config-inited (the repository address) and the theme's
    # launch buttons (html-page-context, priority 501), which copy each page's notebook
    app.connect("config-inited", _take_over_colab, priority=600)
    app.connect("html-page-context", _colab_button, priority=510)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


# ------------------------------------------------------------------ the instructors' command

def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m course.launch",
        description="Print the JupyterHub link (through nbgitpuller) that opens each PATH of the "
                    "course's repository on your hub, for an e-mail, a syllabus or an LMS.")
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="a file or folder of the repository, e.g. "
                             "exercises/01_matmul/matmul.ipynb")
    parser.add_argument("--hub", required=True, help="the hub's address, https://hub.example.org")
    parser.add_argument("--repository", help="the repository's address (default: repository.url "
                                             "of _config.yml, or $COURSE_REPOSITORY_URL)")
    parser.add_argument("--branch", help="default: repository.branch of _config.yml")
    parser.add_argument("--interface", default="jupyterlab", choices=sorted(INTERFACES))
    args = parser.parse_args(argv)
    from course.site import ROOT, book_config
    from course.sphinx_course import repository_url
    repository = book_config().get("repository", {})
    url = args.repository or repository_url(repository.get("url", ""))
    branch = args.branch or repository.get("branch") or "main"
    problems = [p for p in args.paths if not (ROOT / p).exists()]
    if problems:
        print(f"course.launch: not in the course's folder {ROOT}: {', '.join(problems)}",
              file=sys.stderr)
        return 1
    try:
        for path in args.paths:
            print(nbgitpuller_link(args.hub, url, path, branch=branch, interface=args.interface))
    except ValueError as error:
        print(f"course.launch: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
