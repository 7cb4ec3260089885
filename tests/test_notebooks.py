"""The chapters as notebooks, outside the book build: each one runs top to bottom in a fresh
kernel, and JupyterLab (as `make lab` / `course-lab` starts it) opens the `.md` chapters as notebooks through
jupytext, and saves them back unchanged.

Every page of _toc.yml that the book executes is covered (course/site.py reads the toc).
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path
from typing import Iterator

import jupytext
import pytest

from course import site as book_site
from course.site import ROOT, cell_timeout_s, executed_pages, source_of, tool, tool_env
from conftest import Lab, running_lab

pytestmark = pytest.mark.slow

EXECUTED = executed_pages()
MARKDOWN_CHAPTERS = [p for p in EXECUTED if source_of(p).suffix == ".md"]
ANSI = re.compile(r"\x1b\[[0-9;]*m")
JUPYTEXT_VIEWER = "Jupytext Notebook"


# ------------------------------------------------------------------ top to bottom, fresh kernel

def _errors(notebook) -> list[str]:
    return [f"{o.get('ename')}: {o.get('evalue')}" for c in notebook.cells if c.cell_type == "code"
            for o in c.get("outputs", []) if o.get("output_type") == "error"]


@pytest.mark.parametrize("docname", EXECUTED)
def test_chapter_runs_top_to_bottom_in_a_fresh_kernel(docname):
    """Where the book build has just run the chapter (its execution cache holds a run of this
    very code, made with this llmcore: course/site.py cached_run), that run is checked: the
    build runs each chapter top to bottom in a fresh kernel too. Otherwise it runs here."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    path = source_of(docname)
    cached = book_site.cached_run(docname)
    if cached is not None:
        notebook, how = cached, "the book build's run (execution cache)"
    else:
        notebook = jupytext.read(path)
        client = NotebookClient(notebook, timeout=cell_timeout_s(), kernel_name="python3",
                                allow_errors=False,
                                resources={"metadata": {"path": str(path.parent)}})
        start = time.perf_counter()
        try:
            client.execute()
        except CellTimeoutError as error:
            pytest.fail(f"{docname}: a cell ran past the {cell_timeout_s()} s per-cell timeout: "
                        f"{error}")
        except CellExecutionError as error:
            pytest.fail(f"{docname}: a cell failed when run top to bottom in a fresh kernel:\n"
                        f"{error}")
        how = f"run here in {time.perf_counter() - start:.1f} s"
    code_cells = [c for c in notebook.cells if c.cell_type == "code"]
    counts = [c.get("execution_count") for c in code_cells]
    assert counts == list(range(1, len(code_cells) + 1)), \
        f"{docname}: not every code cell ran, in order (execution counts {counts}; {how})"
    assert not _errors(notebook), f"{docname}: {_errors(notebook)} ({how})"
    print(f"{docname}: {len(code_cells)} code cells, {how}")


def test_a_cached_run_is_only_trusted_for_the_current_llmcore(tmp_path, monkeypatch):
    """The key of the execution cache changes with any file of llmcore, and a key file that
    does not match the current key makes every chapter run here again."""
    for folder in book_site.EXECUTION_INPUTS:
        (tmp_path / folder).mkdir(parents=True)
    module = tmp_path / "llmcore" / "x.py"
    module.write_text("a = 1\n")
    before = book_site.execution_key(tmp_path)
    module.write_text("a = 2\n")
    assert book_site.execution_key(tmp_path) != before
    monkeypatch.setattr(book_site, "EXECUTION_KEY_FILE", tmp_path / "stale-key")
    (tmp_path / "stale-key").write_text(before + "\n")
    assert book_site.cached_run(EXECUTED[0]) is None


# ------------------------------------------------------------------------ JupyterLab + jupytext

def jupyter(*args: str) -> str:
    done = subprocess.run([tool("jupyter"), *args], cwd=ROOT, env=tool_env(), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    return ANSI.sub("", done.stdout)


def test_jupytext_server_extension_is_enabled():
    """It swaps in jupytext's contents manager, which reads .md files as notebooks."""
    listing = jupyter("server", "extension", "list")
    assert re.search(r"jupyterlab_jupytext\s+enabled", listing), listing
    assert re.search(r"jupyterlab_jupytext\s+OK", listing), listing


def test_jupytext_lab_extension_is_enabled():
    """It adds the "Jupytext Notebook" viewer and the Jupytext commands to JupyterLab."""
    listing = jupyter("labextension", "list")
    assert re.search(r"jupyterlab-jupytext\s+v[\d.]+\s+enabled\s+OK", listing), listing


def test_jupytext_configuration_is_the_repository_one():
    from jupytext.config import find_jupytext_configuration_file, load_jupytext_config

    for docname in MARKDOWN_CHAPTERS:
        found = find_jupytext_configuration_file(str(source_of(docname).parent))
        assert found and Path(found) == ROOT / "jupytext.toml", \
            f"{docname}: jupytext reads {found}, expected {ROOT / 'jupytext.toml'}"
    config = load_jupytext_config(str(source_of(EXECUTED[0])))
    assert "md" in config.notebook_extensions and "py" not in config.notebook_extensions


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    """The learner's JupyterLab, as `make lab` starts it."""
    book_site.BUILD_DIR.mkdir(exist_ok=True)
    with running_lab("learner", book_site.BUILD_DIR / "jupyterlab-test.log") as server:
        yield server


def test_jupyterlab_uses_the_jupytext_contents_manager(lab):
    log = (book_site.BUILD_DIR / "jupyterlab-test.log").read_text(encoding="utf-8")
    assert "Jupytext Server Extension" in log and "jupyterlab_jupytext | extension was " \
        "successfully loaded" in log, "jupyter lab did not load jupytext's server extension"


@pytest.mark.parametrize("docname", MARKDOWN_CHAPTERS)
def test_jupyterlab_opens_the_chapter_as_a_notebook(lab, docname):
    path = source_of(docname)
    model = lab.request("GET", f"/api/contents/{docname}.md?type=notebook&content=1")
    assert model["type"] == "notebook" and model["format"] == "json"
    notebook = model["content"]
    assert notebook["metadata"]["kernelspec"]["name"] == "python3"
    assert notebook["metadata"]["jupytext"]["text_representation"]["format_name"] == "myst"
    want = [c.source for c in jupytext.read(path).cells if c.cell_type == "code"]
    got = [c["source"] for c in notebook["cells"] if c["cell_type"] == "code"]
    assert want and got == want, f"{docname}: JupyterLab sees different code cells"


@pytest.mark.parametrize("docname", MARKDOWN_CHAPTERS)
def test_saving_from_jupyterlab_leaves_the_chapter_unchanged(lab, docname):
    """Open a chapter, save it (to a copy under _build): the file written is the committed one."""
    model = lab.request("GET", f"/api/contents/{docname}.md?type=notebook&content=1")
    copy = f"_build/jupytext-roundtrip/{docname}.md"
    (ROOT / copy).parent.mkdir(parents=True, exist_ok=True)
    lab.request("PUT", f"/api/contents/{copy}",
                {"type": "notebook", "format": "json", "content": model["content"]})
    original = source_of(docname).read_text(encoding="utf-8")
    saved = (ROOT / copy).read_text(encoding="utf-8")
    assert saved == original, (
        f"{docname}: saving from JupyterLab rewrites the file; first differing line: "
        f"{next((a, b) for a, b in zip(saved.splitlines() + [''], original.splitlines() + ['']) if a != b)}")


def test_jupyterlab_opens_markdown_as_notebooks_on_double_click(lab):
    """The default viewer of Markdown files is jupytext's notebook, not the text editor."""
    settings = lab.request("GET", "/lab/api/settings/@jupyterlab/docmanager-extension:plugin")
    viewers = settings["schema"]["properties"]["defaultViewers"].get("default", {})
    user = settings.get("settings", {}).get("defaultViewers", {})
    viewer = user.get("markdown", viewers.get("markdown"))
    assert viewer == JUPYTEXT_VIEWER, (
        f"JupyterLab opens .md files with {viewer or 'the text editor'!r}, expected "
        f"{JUPYTEXT_VIEWER!r}; course-lab's profiles set it (course/lab.py, JUPYTEXT_VIEWERS)")
