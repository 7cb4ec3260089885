"""The course package beside llmcore: llmcore never imports it; the grader works from an installed
(non-editable) copy and finds the course from its arguments or the working directory; and the book's
execution cache is dropped by changes to what the chapters run, not by the grader or the tests."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def imported_modules(path: Path) -> set[str]:
    """Top-level names of every module a Python file imports (absolute imports)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", sorted((ROOT / "llmcore").rglob("*.py")),
                         ids=lambda p: p.relative_to(ROOT).as_posix())
def test_llmcore_never_imports_the_course_tooling(path):
    bad = imported_modules(path) & {"course", "matplotlib", "nbgrader", "transformers"}
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_llmcore_holds_no_grading_figure_benchmark_or_shipping_code():
    names = {p.relative_to(ROOT / "llmcore").as_posix() for p in (ROOT / "llmcore").rglob("*.py")}
    assert not {n for n in names if n.split("/")[0] in ("figures", "bench")}
    assert not {"grading.py", "ship.py"} & names
    train = (ROOT / "llmcore" / "train.py").read_text(encoding="utf-8")
    assert "MODEL_CARD" not in train and "argparse" not in train


@pytest.mark.slow
def test_the_grader_runs_from_an_installed_copy(tmp_path):
    """pip install (not editable) into a folder, then release a course that lives elsewhere:
    nothing is looked up next to the installed package's files."""
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                           "--disable-pip-version-check", "--no-build-isolation", "--target",
                           str(site), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    course = tmp_path / "my course"
    for name in ("solutions", "nbgrader_config.py"):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
        copy(ROOT / name, course / name)
    env = {**os.environ, "PYTHONPATH": str(site),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    where = subprocess.run([sys.executable, "-c", "import course, llmcore; "
                            "print(course.__file__); print(llmcore.__file__)"],
                           cwd=course, env=env, capture_output=True, text=True, check=True)
    assert all(line.startswith(str(site)) for line in where.stdout.split()), where.stdout
    done = subprocess.run([sys.executable, "-m", "course.grading", "release"], cwd=course,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    released = sorted(p.relative_to(course).as_posix() for p in course.glob("exercises/*/*.ipynb"))
    assert released == sorted(p.relative_to(ROOT).as_posix()
                              for p in ROOT.glob("exercises/*/*.ipynb"))
    assert not (ROOT / "exercises").samefile(course / "exercises")


def _book_cache_survives(tmp_path: Path, edit: str) -> bool:
    """Copy what `make book-cache` reads, run it, plant a cache, edit one file, run it again:
    whether the planted cache is still there."""
    work = tmp_path / edit.replace("/", "_")
    for name in ("llmcore", "course", "tests"):
        shutil.copytree(ROOT / name, work / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("Makefile", "_config.yml", "_toc.yml"):
        shutil.copy2(ROOT / name, work / name)
    (work / ".venv").symlink_to(sys.prefix)         # this Python (the course's) runs course.site

    def book_cache() -> None:
        subprocess.run(["make", "--no-print-directory", "book-cache"], cwd=work, check=True,
                       capture_output=True, text=True)

    book_cache()
    marker = work / "_build" / ".jupyter_cache" / "planted"
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("executed notebooks")
    book_cache()
    assert marker.exists(), "an unchanged tree must keep the cache"
    with open(work / edit, "a", encoding="utf-8") as f:
        f.write("\n# an edit\n")
    book_cache()
    return marker.exists()


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("edit, kept", [
    ("llmcore/attention.py", False),
    ("course/figures/common.py", False),
    ("course/grading/grade.py", True),
    ("course/bench/ops.py", True),
    ("tests/test_attention.py", True),
])
def test_the_book_cache_follows_what_the_chapters_run(tmp_path, edit, kept):
    assert _book_cache_survives(tmp_path, edit) is kept
