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

**A launch link never points at a placeholder.** _config.yml ships with placeholder addresses
(:data:`PLACEHOLDERS`: a GitHub namespace the course does not control, and an example.org hub);
an address is *configured* when it is neither empty nor its setting's placeholder
(:func:`unconfigured`, the one rule, used by the build, the link functions and the command).
Both buttons need a configured GitHub repository (the Colab cell installs from it, the hub pulls
it); the JupyterHub button also needs a configured hub. :func:`launch_plan` decides, and the build
prints one line for each button it leaves out, saying why.

The Sphinx extension (:func:`setup`, listed in _config.yml) applies the plan: it takes the Colab
button over from the theme (whose link would point at the ``.md``), writes the first cell into
each page's notebook, and gives the theme the hub address (``COURSE_HUB_URL``, when set at build
time, replaces ``jupyterhub_url``; ``COURSE_REPOSITORY_URL``, course/sphinx_course.py, replaces
``repository.url``). Nothing is fetched when the book builds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from course import sphinx_course
from course.sphinx_course import REPOSITORY_VARIABLE

HUB_VARIABLE = "COURSE_HUB_URL"
REPOSITORY = "repository.url"
HUB = "launch_buttons.jupyterhub_url"
PLACEHOLDER_REPOSITORY_URL = "https://github.com/llmcore-course/algebra-of-llms"
"""``repository.url`` as _config.yml ships it. Nobody has published the course there: whoever
owns that GitHub namespace would be what a Colab install cell installs and what a hub pulls."""
PLACEHOLDER_HUB_URL = "https://hub.example.org"
"""``launch_buttons.jupyterhub_url`` as _config.yml ships it (example.org: no hub is there)."""
PLACEHOLDERS = {REPOSITORY: PLACEHOLDER_REPOSITORY_URL, HUB: PLACEHOLDER_HUB_URL}
"""Each address setting of _config.yml and the placeholder it ships with: left as it is, the
setting counts as unset. Change a placeholder in _config.yml and here together."""
VARIABLES = {REPOSITORY: REPOSITORY_VARIABLE, HUB: HUB_VARIABLE}
"""The environment variable that replaces each setting for one build."""
COLAB_MARKER = "course-colab-install"
"""The metadata key that marks the first cell :func:`colab_cell` wrote into a notebook."""
INTERFACES = {"jupyterlab": "lab/tree", "classic": "tree"}
"""nbgitpuller's ``urlpath`` prefix for each ``notebook_interface`` (the theme's own)."""


def _address_key(address: str) -> tuple[str, str]:
    """What two spellings of one address share: host (no ``www.``) and path (no trailing ``/``
    or ``.git``), case aside; the scheme does not matter."""
    parsed = urllib.parse.urlsplit(address.strip().lower())
    path = parsed.path.rstrip("/").removesuffix(".git").rstrip("/")
    return parsed.netloc.removeprefix("www."), path


def unconfigured(setting: str, address: str, name: str | None = None) -> str | None:
    """Why ``address``, the value of ``setting`` (a key of :data:`PLACEHOLDERS`), is no address
    to link to, or None when it is configured. The one rule: empty, or the setting's placeholder
    (compared as addresses: ``http://hub.example.org/`` is ``https://hub.example.org``).
    ``name``: where the value came from, for the message (default: the setting)."""
    placeholder = PLACEHOLDERS[setting]
    name = name or setting
    if not address.strip():
        return f"{name} is empty"
    if _address_key(address) == _address_key(placeholder):
        return f"{name} is the placeholder {placeholder}"
    return None


def _require_configured(setting: str, address: str) -> None:
    reason = unconfigured(setting, address)
    if reason:
        raise ValueError(f"{reason}; a launch link never points at a placeholder")


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
    ``~/<repository name>``. The same link as the book's JupyterHub button. ValueError for an
    empty or placeholder hub or repository (:func:`unconfigured`)."""
    _require_configured(HUB, hub_url)
    _require_configured(REPOSITORY, repository_url)
    if interface not in INTERFACES:
        raise ValueError(f"interface: expected one of {sorted(INTERFACES)}, got {interface!r}")
    _, name = repository_parts(repository_url)
    query = urllib.parse.urlencode(
        {"repo": repository_url, "urlpath": f"{INTERFACES[interface]}/{name}/{path.lstrip('/')}",
         "branch": branch}, safe="/")
    return f"{hub_url.strip().rstrip('/')}/hub/user-redirect/git-pull?{query}"


def colab_link(colab_url: str, repository_url: str, pagename: str, *,
               branch: str = "gh-pages") -> str:
    """The Colab link to the published notebook of page ``pagename`` (e.g. chapters/01_shapes).
    ValueError for an empty or placeholder repository."""
    _require_configured(REPOSITORY, repository_url)
    owner, name = repository_parts(repository_url)
    return f"{colab_url.strip().rstrip('/')}/github/{owner}/{name}/blob/{branch}/" \
           f"_sources/{pagename}.ipynb"


def install_target(repository_url: str, branch: str) -> str:
    """What pip installs on Colab: the course's package from its repository (ValueError for an
    empty or placeholder repository)."""
    _require_configured(REPOSITORY, repository_url)
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


# ------------------------------------------------------------------ which buttons a build offers

@dataclass(frozen=True)
class LaunchPlan:
    repository: str
    """The repository address the build uses (``COURSE_REPOSITORY_URL`` or ``repository.url``)."""
    hub: str
    """The JupyterHub button's hub; empty: no JupyterHub button."""
    colab: str
    """Colab's address; empty: no Colab button and no install cell."""
    notes: tuple[str, ...]
    """One line for each button left out, saying why (the build prints them)."""


def _setting_problem(setting: str, address: str, from_environment: bool) -> str | None:
    """:func:`unconfigured`'s reason, with what to do about it."""
    if from_environment:
        return unconfigured(setting, address, VARIABLES[setting])
    reason = unconfigured(setting, address)
    return reason and f"{reason}; set it in _config.yml or {VARIABLES[setting]}"


def launch_plan(repository: str, hub: str, colab: str,
                environ: Mapping[str, str] | None = None) -> LaunchPlan:
    """The launch buttons of a build whose _config.yml says ``repository`` (``repository.url``),
    ``hub`` (``launch_buttons.jupyterhub_url``) and ``colab`` (``launch_buttons.colab_url``), with
    the environment's replacements (``environ``, default ``os.environ``). Both buttons need a
    configured GitHub repository; the JupyterHub button also a configured hub; the Colab button
    a Colab address."""
    environ = os.environ if environ is None else environ
    repository_from_environment = bool(environ.get(REPOSITORY_VARIABLE, "").strip())
    repository = sphinx_course.repository_url(repository or "", environ).strip()
    hub_from_environment = HUB_VARIABLE in environ
    hub = (environ[HUB_VARIABLE] if hub_from_environment else hub or "").strip()
    colab = (colab or "").strip()

    repository_problem = _setting_problem(REPOSITORY, repository, repository_from_environment)
    if repository_problem is None:
        try:
            repository_parts(repository)
        except ValueError:
            name = REPOSITORY_VARIABLE if repository_from_environment else REPOSITORY
            repository_problem = f"{name} {repository} is not a GitHub repository"
    notes = []
    hub_problem = _setting_problem(HUB, hub, hub_from_environment) or repository_problem
    if hub_problem:
        notes.append(f"no JupyterHub button: {hub_problem}")
    colab_problem = ("launch_buttons.colab_url is empty" if not colab else repository_problem)
    if colab_problem:
        notes.append(f"no Colab button or install cell: {colab_problem}")
    return LaunchPlan(repository=repository, hub="" if hub_problem else hub,
                      colab="" if colab_problem else colab, notes=tuple(notes))


# ------------------------------------------------------------------ the Sphinx extension

def _apply_plan(app, config) -> None:
    """Decide the buttons (:func:`launch_plan`) and print why any is left out; keep the Colab
    settings for this extension (the theme's Colab link would open the .md) and give the theme
    the hub address, empty when there is no hub button."""
    from sphinx.util import logging

    options = dict(config.html_theme_options or {})
    buttons = dict(options.get("launch_buttons") or {})
    plan = launch_plan(options.get("repository_url", ""), buttons.get("jupyterhub_url", ""),
                       buttons.pop("colab_url", ""))
    app.course_colab = {"url": plan.colab, "repository": plan.repository,
                        "branch": buttons.pop("colab_branch", "") or "gh-pages"}
    buttons["jupyterhub_url"] = plan.hub
    options["launch_buttons"] = buttons
    config.html_theme_options = options
    logger = logging.getLogger(__name__)
    for note in plan.notes:
        logger.info(f"course.launch: {note}")


def _colab_button(app, pagename, templatename, context, doctree) -> None:
    colab = getattr(app, "course_colab", {})
    notebook = Path(app.outdir) / "_sources" / f"{pagename}.ipynb"
    if not colab.get("url") or doctree is None or not notebook.is_file():
        return
    repository = colab["repository"]
    branch = app.config.html_theme_options.get("repository_branch") or "main"
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
    app.connect("config-inited", _apply_plan, priority=600)
    app.connect("html-page-context", _colab_button, priority=510)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


# ------------------------------------------------------------------ the instructors' command

def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m course.launch",
        description="Print the JupyterHub link (through nbgitpuller) that opens each PATH of the "
                    "course's repository on your hub, for an e-mail, a syllabus or an LMS. "
                    "Placeholder addresses (those _config.yml ships with) are refused.")
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="a file or folder of the repository, e.g. "
                             "exercises/01_matmul/matmul.ipynb")
    parser.add_argument("--hub", required=True, help="the hub's address, https://hub.school.edu")
    parser.add_argument("--repository", help="the repository's address (default: repository.url "
                                             "of _config.yml, or $COURSE_REPOSITORY_URL)")
    parser.add_argument("--branch", help="default: repository.branch of _config.yml")
    parser.add_argument("--interface", default="jupyterlab", choices=sorted(INTERFACES))
    args = parser.parse_args(argv)
    from course.site import ROOT, book_config
    repository = book_config().get("repository", {})
    url = args.repository or sphinx_course.repository_url(repository.get("url", ""))
    branch = args.branch or repository.get("branch") or "main"
    problems = [p for p in args.paths if not (ROOT / p).exists()]
    if problems:
        print(f"course.launch: not in the course's folder {ROOT}: {', '.join(problems)}",
              file=sys.stderr)
        return 1
    repository_name = ("--repository" if args.repository else REPOSITORY_VARIABLE
                       if os.environ.get(REPOSITORY_VARIABLE, "").strip() else REPOSITORY)
    unset = [reason for reason in (unconfigured(HUB, args.hub, "--hub"),
                                   unconfigured(REPOSITORY, url, repository_name)) if reason]
    if unset:
        print(f"course.launch: {'; '.join(unset)}: name the class's hub (--hub) and the course's "
              f"repository (--repository, or repository.url in _config.yml)", file=sys.stderr)
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
