"""The learner's install stays under 1 GiB (issue 24), measured as the README measures it: a fresh
virtual environment, PyTorch's CPU wheel, then ``pip install --no-compile -c
requirements/constraints.txt -e ".[learner]"``, and ``du`` (blocks on disk). It holds no nbgrader,
and its ``course-check`` grades a solved exercise. Prints the size and the largest packages."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import nbformat
import pytest

from classroom import ROOT, submission

LIMIT = 2**30
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def disk_usage(folder: Path) -> int:
    """Bytes on disk under ``folder`` (allocated blocks, as ``du`` counts them)."""
    return sum(p.lstat().st_blocks * 512 for p in folder.rglob("*") if not p.is_symlink())


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="the CPU wheel index and du are Linux's")
def test_the_learner_install_is_under_1_gib_and_checks_without_nbgrader(tmp_path):
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env)
    python = str(env / "bin" / "python")
    pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
           "--no-compile", "--retries", "1"]
    pin = next(line.split("==")[1].strip() for line in
               (ROOT / "requirements" / "constraints.txt").read_text().splitlines()
               if line.startswith("torch=="))
    torch = subprocess.run([*pip, "--no-deps", f"torch=={pin}", "--index-url", TORCH_CPU_INDEX],
                           capture_output=True, text=True, timeout=1800)
    if torch.returncode != 0:
        pytest.skip(f"no CPU wheel of torch {pin} reachable: {torch.stderr.strip()[-300:]}")
    version = subprocess.run([python, "-c", "import importlib.metadata as m; "
                              "print(m.version('torch'))"], capture_output=True, text=True).stdout
    if "+cpu" not in version:
        pytest.skip(f"pip installed torch {version.strip()}, not the CPU build")
    learner = subprocess.run([*pip, "-c", str(ROOT / "requirements" / "constraints.txt"),
                              "-e", f"{ROOT}[learner]"], capture_output=True, text=True,
                             timeout=1800)
    assert learner.returncode == 0, learner.stderr[-3000:]

    used = disk_usage(env)
    sizes = sorted(((disk_usage(p), p.name) for p in
                    (env / "lib").glob("python*/site-packages/*") if p.is_dir()), reverse=True)
    print(f"learner install: {used / 2**20:.0f} MiB on disk (limit {LIMIT / 2**20:.0f} MiB); "
          "largest: " + ", ".join(f"{name} {size / 2**20:.0f}" for size, name in sizes[:6]))
    assert used < LIMIT, f"the learner install takes {used / 2**20:.0f} MiB, over 1 GiB"
    listed = subprocess.run([python, "-m", "pip", "list", "--format=freeze"],
                            capture_output=True, text=True, check=True).stdout.lower()
    assert "nbgrader" not in listed and "sqlalchemy" not in listed, listed

    solved = tmp_path / "01_matmul" / "matmul.ipynb"
    solved.parent.mkdir()
    nbformat.write(submission("01_matmul", answered=True), str(solved))
    done = subprocess.run([str(env / "bin" / "course-check"), str(solved)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PATH": f"{env / 'bin'}:{os.environ['PATH']}"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Points so far: 5 of 5" in done.stdout, done.stdout
