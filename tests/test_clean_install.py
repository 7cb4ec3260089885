"""llmcore stands alone: in a fresh virtual environment with only torch, numpy and safetensors (and
what torch itself requires), every llmcore submodule imports, and none of them imports the course's
tooling or its instructor-only dependencies."""

from __future__ import annotations

import os
import shutil
import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "requirements" / "constraints.txt"
FORBIDDEN = ("course", "matplotlib", "nbgrader", "transformers", "playwright", "jupyter_book",
             "IPython", "pytest", "hypothesis")

IMPORT_ALL = """
import importlib, pkgutil, sys
import llmcore
names = sorted(m.name for m in pkgutil.walk_packages(llmcore.__path__, "llmcore."))
for name in names:
    importlib.import_module(name)
bad = sorted(m for m in sys.modules if m.split(".")[0] in FORBIDDEN)
assert not bad, f"llmcore imported {bad}"
try:
    import course
except ImportError:
    pass
else:
    raise AssertionError("course is importable here: the check would not be clean")
print(len(names), "submodules:", " ".join(names))
"""


@pytest.mark.slow
def test_every_llmcore_submodule_imports_with_only_torch_numpy_safetensors(tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / ("Scripts" if os.name == "nt" else "bin") / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "-c", str(CONSTRAINTS), "torch", "numpy", "safetensors"],
        capture_output=True, text=True, timeout=900)
    assert install.returncode == 0, install.stderr[-3000:]
    packages = subprocess.run([str(python), "-m", "pip", "list", "--format=freeze"],
                              capture_output=True, text=True, check=True).stdout
    installed = {line.split("==")[0].lower() for line in packages.split()}
    assert {"torch", "numpy", "safetensors"} <= installed
    assert not installed & {"matplotlib", "nbgrader", "transformers", "tqdm", "jupyter-book"}

    source = tmp_path / "src"                 # llmcore alone: no course/ beside it
    shutil.copytree(ROOT / "llmcore", source / "llmcore",
                    ignore=shutil.ignore_patterns("__pycache__"))
    code = f"FORBIDDEN = {FORBIDDEN!r}\n{IMPORT_ALL}"
    done = subprocess.run([str(python), "-c", code], cwd=source, capture_output=True, text=True,
                          env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(source),
                               "HOME": str(tmp_path)}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    count = int(done.stdout.split()[0])
    expected = {p.stem for p in (ROOT / "llmcore").glob("*.py") if p.stem != "__init__"}
    assert count >= len(expected), done.stdout
