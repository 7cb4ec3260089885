"""The launch buttons' links and the Colab first cell (course/launch.py), and the rule that no
launch link points at a placeholder address: each button is checked here in a small real Sphinx
build with the course's extensions and theme, and on the book's own pages in the browser
(tests/test_browser.py, test_launch_buttons_in_a_real_browser)."""

from __future__ import annotations

import json
import subprocess
import sys
import types
import urllib.parse
from pathlib import Path
from types import SimpleNamespace

import pytest

from course import launch
from course.site import ROOT, read_page, tool_env

REPO = "https://github.com/a-school/algebra-of-llms"
"""A configured repository (not _config.yml's placeholder, launch.PLACEHOLDER_REPOSITORY_URL)."""
HUB = "https://hub.school.edu"
COLAB = "https://colab.research.google.com"


def test_nbgitpuller_link_opens_the_file_in_the_pulled_folder():
    link = launch.nbgitpuller_link(HUB + "/", REPO, "chapters/03_attention.md",
                                   branch="main")
    base, query = link.split("?", 1)
    assert base == f"{HUB}/hub/user-redirect/git-pull"
    assert urllib.parse.parse_qs(query) == {
        "repo": [REPO], "branch": ["main"], "urlpath": ["lab/tree/algebra-of-llms/chapters/"
                                                        "03_attention.md"]}
    classic = launch.nbgitpuller_link(HUB, REPO + ".git", "exercises",
                                      interface="classic")
    assert "urlpath=tree/algebra-of-llms/exercises" in classic


@pytest.mark.parametrize("hub, repository, message", [
    ("", REPO, "jupyterhub_url is empty"),
    (launch.PLACEHOLDER_HUB_URL, REPO, "jupyterhub_url is the placeholder"),
    (HUB, launch.PLACEHOLDER_REPOSITORY_URL, "repository.url is the placeholder"),
    (HUB, " ", "repository.url is empty"),
    (HUB, "https://gitlab.com/a/b", "github.com"),
    (HUB, "https://github.com/only-owner", "github.com")])
def test_nbgitpuller_link_refuses_what_it_cannot_link(hub, repository, message):
    with pytest.raises(ValueError, match=message):
        launch.nbgitpuller_link(hub, repository, "chapters/01_shapes.md")


def test_colab_link_points_at_the_published_notebook():
    assert launch.colab_link(COLAB, REPO, "chapters/01_shapes") == (
        "https://colab.research.google.com/github/a-school/algebra-of-llms/blob/gh-pages/"
        "_sources/chapters/01_shapes.ipynb")


@pytest.mark.parametrize("make", [
    lambda repository: launch.colab_link(COLAB, repository, "chapters/01_shapes"),
    lambda repository: launch.colab_cell(repository, "main"),
    lambda repository: launch.install_target(repository, "main")])
def test_nothing_links_to_or_installs_from_the_placeholder_repository(make):
    for repository in (launch.PLACEHOLDER_REPOSITORY_URL, ""):
        with pytest.raises(ValueError, match="repository.url is"):
            make(repository)


@pytest.mark.parametrize("setting, address, reason", [
    (launch.REPOSITORY, "", "repository.url is empty"),
    (launch.REPOSITORY, "   ", "repository.url is empty"),
    (launch.REPOSITORY, launch.PLACEHOLDER_REPOSITORY_URL, "placeholder"),
    (launch.REPOSITORY, "https://github.com/llmcore-course/algebra-of-llms.git", "placeholder"),
    (launch.REPOSITORY, "http://www.github.com/LLMcore-Course/Algebra-of-LLMs/", "placeholder"),
    (launch.REPOSITORY, "https://github.com/llmcore-course/algebra-of-llms-2026", None),
    (launch.REPOSITORY, REPO, None),
    (launch.HUB, "", "launch_buttons.jupyterhub_url is empty"),
    (launch.HUB, " https://hub.example.org/ ", "placeholder"),
    (launch.HUB, "HTTP://HUB.EXAMPLE.ORG", "placeholder"),
    (launch.HUB, "https://hub.example.org.school.edu", None),
    (launch.HUB, HUB, None)])
def test_a_placeholder_is_the_settings_own_placeholder_address(setting, address, reason):
    """The one rule (launch.unconfigured): an address is unset when it is empty or the setting's
    placeholder (launch.PLACEHOLDERS) in any spelling of the same address; anything else is
    configured."""
    got = launch.unconfigured(setting, address)
    if reason is None:
        assert got is None
    else:
        assert got is not None and reason in got
        if reason == "placeholder":
            assert got == f"{setting} is the placeholder {launch.PLACEHOLDERS[setting]}"


def run_cell(source: str, monkeypatch, *, on_colab: bool) -> list:
    """Execute the cell's code as a kernel would, with subprocess.run recorded (nothing is
    installed); on_colab puts a google.colab module among the imported ones, as Colab does."""
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: calls.append((a, k)))
    if on_colab:
        monkeypatch.setitem(sys.modules, "google", types.ModuleType("google"))
        monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    exec(compile(source, "<first cell>", "exec"), {})
    return calls


def test_colab_cell_installs_the_course_on_colab_only(monkeypatch):
    source = launch.colab_cell(REPO, "main")
    assert run_cell(source, monkeypatch, on_colab=False) == []
    calls = run_cell(source, monkeypatch, on_colab=True)
    assert len(calls) == 1
    (command,), options = calls[0]
    assert command[:4] == [sys.executable, "-m", "pip", "install"]
    assert command[-1] == f"llmcore @ git+{REPO}@main" and options == {"check": True}


def test_colab_cell_does_nothing_in_a_real_kernel_off_colab(tmp_path):
    """The same cell in a fresh Python process (no Colab): it exits cleanly and runs no pip."""
    script = tmp_path / "cell.py"
    script.write_text("import subprocess\n"
                      "subprocess.run = lambda *a, **k: print('PIP', a)\n"
                      + launch.colab_cell(REPO, "main") + "print('DONE')\n", encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=tool_env(), timeout=60)
    assert done.returncode == 0 and done.stdout == "DONE\n", done.stdout + done.stderr


def notebook_file(path: Path, minor: int = 5) -> Path:
    cells = [{"cell_type": "markdown", "id": "a", "metadata": {}, "source": ["# Title"]},
             {"cell_type": "code", "id": "b", "metadata": {}, "source": ["x = 1"],
              "outputs": [], "execution_count": None}]
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4,
                                "nbformat_minor": minor}), encoding="utf-8")
    return path


def test_add_colab_cell_puts_it_first_once(tmp_path):
    import nbformat
    path = notebook_file(tmp_path / "page.ipynb")
    launch.add_colab_cell(path, REPO, "main")
    launch.add_colab_cell(path, REPO, "main")          # the theme copies, we add: still one
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    assert [c.source.splitlines()[0] for c in notebook.cells] == [
        launch.colab_cell(REPO, "main").splitlines()[0], "# Title", "x = 1"]
    assert notebook.cells[0].metadata[launch.COLAB_MARKER] is True


@pytest.fixture
def no_overrides(monkeypatch):
    """A build environment without COURSE_HUB_URL or COURSE_REPOSITORY_URL."""
    monkeypatch.delenv(launch.HUB_VARIABLE, raising=False)
    monkeypatch.delenv(launch.REPOSITORY_VARIABLE, raising=False)


def sphinx_app(tmp_path, buttons: dict, pagename: str = "chapters/01_shapes", *,
               repository: str = REPO):
    """What the extension reads of Sphinx: the theme options and the page's notebook copy."""
    config = SimpleNamespace(html_theme_options={
        "repository_url": repository, "repository_branch": "main", "launch_buttons": buttons})
    copy = tmp_path / "_sources" / f"{pagename}.ipynb"
    copy.parent.mkdir(parents=True)
    notebook_file(copy)
    return SimpleNamespace(config=config, outdir=str(tmp_path))


def render(app, pagename: str = "chapters/01_shapes") -> tuple[list[str], dict]:
    """The Colab links the extension adds to a page, and the first cell of its notebook."""
    context = {"header_buttons": []}
    launch._colab_button(app, pagename, "page.html", context, doctree=object())
    groups = [b for b in context["header_buttons"] if b.get("label") == "launch-buttons"]
    links = [b["url"] for group in groups for b in group["buttons"]]
    notebook = Path(app.outdir) / "_sources" / f"{pagename}.ipynb"
    return links, json.loads(notebook.read_text(encoding="utf-8"))["cells"][0]


PLACEHOLDER_HUB_NOTE = (f"no JupyterHub button: launch_buttons.jupyterhub_url is the placeholder "
                        f"{launch.PLACEHOLDER_HUB_URL}; set it in _config.yml or COURSE_HUB_URL")
PLACEHOLDER_COLAB_NOTE = (f"no Colab button or install cell: repository.url is the placeholder "
                          f"{launch.PLACEHOLDER_REPOSITORY_URL}; set it in _config.yml or "
                          f"COURSE_REPOSITORY_URL")


@pytest.mark.parametrize("repository, hub, colab, want_hub, want_colab, notes", [
    (REPO, HUB, COLAB, True, True, []),
    (launch.PLACEHOLDER_REPOSITORY_URL, launch.PLACEHOLDER_HUB_URL, COLAB, False, False,
     [PLACEHOLDER_HUB_NOTE, PLACEHOLDER_COLAB_NOTE]),
    (REPO, launch.PLACEHOLDER_HUB_URL, COLAB, False, True, [PLACEHOLDER_HUB_NOTE]),
    (launch.PLACEHOLDER_REPOSITORY_URL, HUB, COLAB, False, False,
     [PLACEHOLDER_COLAB_NOTE.replace("no Colab button or install cell", "no JupyterHub button"),
      PLACEHOLDER_COLAB_NOTE]),
    ("", "", COLAB, False, False,
     ["no JupyterHub button: launch_buttons.jupyterhub_url is empty; set it in _config.yml or "
      "COURSE_HUB_URL",
      "no Colab button or install cell: repository.url is empty; set it in _config.yml or "
      "COURSE_REPOSITORY_URL"]),
    (REPO, HUB, "", True, False,
     ["no Colab button or install cell: launch_buttons.colab_url is empty"]),
    ("https://gitlab.com/a-school/algebra-of-llms", HUB, COLAB, False, False,
     ["no JupyterHub button: repository.url https://gitlab.com/a-school/algebra-of-llms is "
      "not a GitHub repository",
      "no Colab button or install cell: repository.url "
      "https://gitlab.com/a-school/algebra-of-llms is not a GitHub repository"])])
def test_the_extension_offers_a_button_only_for_configured_addresses(
        tmp_path, no_overrides, repository, hub, colab, want_hub, want_colab, notes):
    """Placeholder (or empty) repository: no Colab button, no install cell in the notebook, and no
    JupyterHub button (it would pull the placeholder); placeholder hub: no JupyterHub button;
    both configured: both buttons, as before. The notes are the lines the build prints."""
    assert [n for n in launch.launch_plan(repository, hub, colab).notes] == notes
    app = sphinx_app(tmp_path, {"colab_url": colab, "jupyterhub_url": hub,
                                "notebook_interface": "jupyterlab"}, repository=repository)
    launch._apply_plan(app, app.config)
    buttons = app.config.html_theme_options["launch_buttons"]
    assert "colab_url" not in buttons, "the theme would add its own Colab link to the .md source"
    assert buttons["jupyterhub_url"] == (hub if want_hub else "")   # the theme's button
    links, first = render(app)
    if want_colab:
        assert links == [launch.colab_link(colab, repository, "chapters/01_shapes")]
        assert first["metadata"].get(launch.COLAB_MARKER)
        assert "".join(first["source"]) == launch.colab_cell(repository, "main")
    else:
        assert links == [] and not first["metadata"].get(launch.COLAB_MARKER)
        assert first["source"] == ["# Title"]


@pytest.mark.parametrize("value, expected", [(HUB, HUB), ("", ""),
                                             (launch.PLACEHOLDER_HUB_URL, "")])
def test_hub_address_from_the_environment(tmp_path, monkeypatch, value, expected):
    monkeypatch.setenv(launch.HUB_VARIABLE, value)
    monkeypatch.delenv(launch.REPOSITORY_VARIABLE, raising=False)
    app = sphinx_app(tmp_path, {"jupyterhub_url": "https://hub.elsewhere.edu"})
    launch._apply_plan(app, app.config)
    assert app.config.html_theme_options["launch_buttons"]["jupyterhub_url"] == expected
    notes = launch.launch_plan(REPO, "https://hub.elsewhere.edu", COLAB).notes
    if expected:
        assert notes == ()
    else:       # the value came from the environment: the note names the variable
        why = "is empty" if not value else f"is the placeholder {launch.PLACEHOLDER_HUB_URL}"
        assert notes == (f"no JupyterHub button: COURSE_HUB_URL {why}",)


def test_repository_from_the_environment(tmp_path, monkeypatch):
    """COURSE_REPOSITORY_URL replaces the placeholder of _config.yml: both buttons are back."""
    monkeypatch.setenv(launch.REPOSITORY_VARIABLE, REPO)
    monkeypatch.setenv(launch.HUB_VARIABLE, HUB)
    app = sphinx_app(tmp_path, {"colab_url": COLAB, "jupyterhub_url": launch.PLACEHOLDER_HUB_URL},
                     repository=launch.PLACEHOLDER_REPOSITORY_URL)
    launch._apply_plan(app, app.config)
    assert app.config.html_theme_options["launch_buttons"]["jupyterhub_url"] == HUB
    links, first = render(app)
    assert links == [launch.colab_link(COLAB, REPO, "chapters/01_shapes")]
    assert "".join(first["source"]) == launch.colab_cell(REPO, "main")
    monkeypatch.setenv(launch.REPOSITORY_VARIABLE, launch.PLACEHOLDER_REPOSITORY_URL)
    assert launch.launch_plan(REPO, HUB, COLAB).notes[-1] == (
        f"no Colab button or install cell: COURSE_REPOSITORY_URL is the placeholder "
        f"{launch.PLACEHOLDER_REPOSITORY_URL}")


# ------------------------------------------------- a real Sphinx build with the course's extensions

MINI_PAGE = """---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---
# A chapter

```{code-cell} python
x = 1
```
"""


def sphinx_build(tmp_path, environ: dict) -> tuple:
    """Build a one-chapter site as the book does (MyST-NB, sphinx-book-theme, the course's
    extensions, _config.yml's launch settings with the placeholders; strict, nothing executed)
    with the extra environment ``environ``: the build's output, the page's HTML and links, the
    published notebook's cells."""
    from course.site import book_config
    config = book_config()
    buttons = {key: value for key, value in config["launch_buttons"].items()
               if key in ("notebook_interface", "jupyterhub_url", "colab_url", "colab_branch")}
    assert buttons["jupyterhub_url"] in ("", launch.PLACEHOLDER_HUB_URL) or \
        launch.unconfigured(launch.HUB, buttons["jupyterhub_url"]) is None
    source = tmp_path / "src"
    source.mkdir()
    (source / "index.md").write_text(MINI_PAGE, encoding="utf-8")
    options = {"repository_url": launch.PLACEHOLDER_REPOSITORY_URL, "repository_branch": "main",
               "launch_buttons": {**buttons, "jupyterhub_url": launch.PLACEHOLDER_HUB_URL}}
    (source / "conf.py").write_text(
        'extensions = ["myst_nb", "sphinx_book_theme", "course.sphinx_course", "course.launch"]\n'
        'html_theme = "sphinx_book_theme"\n'
        f"html_theme_options = {options!r}\n"
        'nb_execution_mode = "off"\n', encoding="utf-8")
    env = {k: v for k, v in tool_env().items()
           if k not in (launch.HUB_VARIABLE, launch.REPOSITORY_VARIABLE)}
    env.update(environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-W", "-n",
                           str(source), str(tmp_path / "out" / "html")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    page = tmp_path / "out" / "html" / "index.html"
    notebook = json.loads((tmp_path / "out" / "html" / "_sources" / "index.ipynb").read_text())
    return done, page.read_text(encoding="utf-8"), read_page(page).links, notebook["cells"]


def test_a_build_with_the_placeholders_has_no_launch_buttons_and_says_why(tmp_path):
    done, html, links, cells = sphinx_build(tmp_path, {})
    lines = done.stdout.splitlines()
    assert f"course.launch: {PLACEHOLDER_HUB_NOTE}" in lines, done.stdout
    assert f"course.launch: {PLACEHOLDER_COLAB_NOTE}" in lines, done.stdout
    assert "git-pull" not in html and "colab.research.google.com" not in html
    assert "launch-buttons" not in html
    assert not [link for link in links if "git-pull" in link or "colab" in link], links
    assert not any(c["metadata"].get(launch.COLAB_MARKER) for c in cells)
    assert not any("pip" in "".join(c["source"]) for c in cells), "an install cell"
    assert "_sources/index.ipynb" in html, "the notebook download stays (course.sphinx_course)"


def test_a_build_with_a_configured_repository_and_hub_has_both_buttons(tmp_path):
    done, html, links, cells = sphinx_build(tmp_path, {launch.REPOSITORY_VARIABLE: REPO,
                                                       launch.HUB_VARIABLE: HUB})
    assert "course.launch:" not in done.stdout
    hub_link = launch.nbgitpuller_link(HUB, REPO, "index.md")
    colab_link = launch.colab_link(COLAB, REPO, "index")
    assert hub_link in links and colab_link in links, links
    assert "".join(cells[0]["source"]) == launch.colab_cell(REPO, "main")
    assert ["".join(c["source"]) for c in cells[1:] if c["cell_type"] == "code"] == ["x = 1"]


# ----------------------------------------------------------------- the instructors' command

def run_command(*args: str, **environ: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in tool_env().items() if k != launch.REPOSITORY_VARIABLE}
    env.update(environ)
    return subprocess.run([sys.executable, "-m", "course.launch", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_link_command_for_instructors():
    """The README's recipe: links to an exercise and a chapter on the class's hub."""
    done = run_command("--hub", HUB, "--repository", REPO, "exercises/01_matmul/matmul.ipynb",
                       "chapters/01_shapes.md")
    assert done.returncode == 0, done.stderr
    links = done.stdout.split()
    assert len(links) == 2
    for link, path in zip(links, ["exercises/01_matmul/matmul.ipynb", "chapters/01_shapes.md"]):
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(link).query)
        assert query["urlpath"][0].endswith(f"/{path}") and (ROOT / path).exists()
        assert query["repo"] == [REPO]
    from_environment = run_command("--hub", HUB, "chapters/01_shapes.md",
                                   COURSE_REPOSITORY_URL=REPO)
    assert from_environment.returncode == 0 and from_environment.stdout.split() == links[1:]
    missing = run_command("--hub", HUB, "--repository", REPO, "exercises/no_such.ipynb")
    assert missing.returncode == 1 and "no_such" in missing.stderr


def test_link_command_refuses_placeholders():
    done = run_command("--hub", launch.PLACEHOLDER_HUB_URL, "--repository",
                       launch.PLACEHOLDER_REPOSITORY_URL, "chapters/01_shapes.md")
    assert done.returncode == 1 and done.stdout == ""
    assert f"--hub is the placeholder {launch.PLACEHOLDER_HUB_URL}" in done.stderr
    assert f"--repository is the placeholder {launch.PLACEHOLDER_REPOSITORY_URL}" in done.stderr
    from course.site import book_config
    if launch.unconfigured(launch.REPOSITORY, book_config()["repository"]["url"]):
        done = run_command("--hub", HUB, "chapters/01_shapes.md")     # _config.yml's placeholder
        assert done.returncode == 1 and done.stdout == ""
        assert "repository.url is the placeholder" in done.stderr, done.stderr
