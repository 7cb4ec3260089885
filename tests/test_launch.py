"""The launch buttons' links and the Colab first cell (course/launch.py). The buttons on the built
pages are checked in the browser (tests/test_browser.py, test_launch_buttons_in_a_real_browser)."""

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
from course.site import ROOT, tool_env

REPO = "https://github.com/llmcore-course/algebra-of-llms"


def test_nbgitpuller_link_opens_the_file_in_the_pulled_folder():
    link = launch.nbgitpuller_link("https://hub.example.org/", REPO, "chapters/03_attention.md",
                                   branch="main")
    base, query = link.split("?", 1)
    assert base == "https://hub.example.org/hub/user-redirect/git-pull"
    assert urllib.parse.parse_qs(query) == {
        "repo": [REPO], "branch": ["main"], "urlpath": ["lab/tree/algebra-of-llms/chapters/"
                                                        "03_attention.md"]}
    classic = launch.nbgitpuller_link("https://hub.example.org", REPO + ".git", "exercises",
                                      interface="classic")
    assert "urlpath=tree/algebra-of-llms/exercises" in classic


@pytest.mark.parametrize("hub, repository, message", [
    ("", REPO, "hub address"),
    ("https://hub.example.org", "https://gitlab.com/a/b", "github.com"),
    ("https://hub.example.org", "https://github.com/only-owner", "github.com")])
def test_nbgitpuller_link_refuses_what_it_cannot_link(hub, repository, message):
    with pytest.raises(ValueError, match=message):
        launch.nbgitpuller_link(hub, repository, "chapters/01_shapes.md")


def test_colab_link_points_at_the_published_notebook():
    assert launch.colab_link("https://colab.research.google.com", REPO, "chapters/01_shapes") == (
        "https://colab.research.google.com/github/llmcore-course/algebra-of-llms/blob/gh-pages/"
        "_sources/chapters/01_shapes.ipynb")


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


def sphinx_app(tmp_path, buttons: dict, pagename: str = "chapters/01_shapes"):
    """What the extension reads of Sphinx: the theme options and the page's notebook copy."""
    config = SimpleNamespace(html_theme_options={
        "repository_url": REPO, "repository_branch": "main", "launch_buttons": buttons})
    copy = tmp_path / "_sources" / f"{pagename}.ipynb"
    copy.parent.mkdir(parents=True)
    notebook_file(copy)
    return SimpleNamespace(config=config, outdir=str(tmp_path))


@pytest.mark.parametrize("colab_url", ["https://colab.research.google.com", ""])
def test_colab_button_on_when_set_off_when_empty(tmp_path, monkeypatch, colab_url):
    monkeypatch.delenv(launch.HUB_VARIABLE, raising=False)
    app = sphinx_app(tmp_path, {"colab_url": colab_url, "jupyterhub_url": ""})
    launch._take_over_colab(app, app.config)
    assert "colab_url" not in app.config.html_theme_options["launch_buttons"], \
        "the theme would add its own Colab link to the .md source"
    context = {"header_buttons": []}
    launch._colab_button(app, "chapters/01_shapes", "page.html", context, doctree=object())
    groups = [b for b in context["header_buttons"] if b.get("label") == "launch-buttons"]
    first = json.loads((tmp_path / "_sources/chapters/01_shapes.ipynb").read_text())["cells"][0]
    if colab_url:
        assert [b["url"] for b in groups[0]["buttons"]] == [
            launch.colab_link(colab_url, REPO, "chapters/01_shapes")]
        assert first["metadata"].get(launch.COLAB_MARKER)
    else:
        assert groups == [] and not first["metadata"].get(launch.COLAB_MARKER)


@pytest.mark.parametrize("value, expected", [("https://hub.school.edu", "https://hub.school.edu"),
                                             ("", "")])
def test_hub_address_from_the_environment(tmp_path, monkeypatch, value, expected):
    monkeypatch.setenv(launch.HUB_VARIABLE, value)
    app = sphinx_app(tmp_path, {"jupyterhub_url": "https://hub.example.org"})
    launch._take_over_colab(app, app.config)
    assert app.config.html_theme_options["launch_buttons"]["jupyterhub_url"] == expected


def test_link_command_for_instructors():
    """The README's recipe: links to an exercise and a chapter on the class's hub."""
    done = subprocess.run([sys.executable, "-m", "course.launch", "--hub",
                           "https://hub.school.edu", "exercises/01_matmul/matmul.ipynb",
                           "chapters/01_shapes.md"], cwd=ROOT, env=tool_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    links = done.stdout.split()
    assert len(links) == 2
    for link, path in zip(links, ["exercises/01_matmul/matmul.ipynb", "chapters/01_shapes.md"]):
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(link).query)
        assert query["urlpath"][0].endswith(f"/{path}") and (ROOT / path).exists()
    missing = subprocess.run([sys.executable, "-m", "course.launch", "--hub",
                              "https://hub.school.edu", "exercises/no_such.ipynb"], cwd=ROOT,
                             env=tool_env(), capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "no_such" in missing.stderr
