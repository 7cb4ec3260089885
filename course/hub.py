"""The course on a JupyterHub: the Python environment every user's server runs in
(``python -m course.hub env PREFIX``), and what the hub's configuration
(``deploy/jupyterhub_config.py``) and its test need to know about it.

On one machine the hub runs as root and starts each user's JupyterLab as that user, so the
environment's Python must be one that every user may run: a Python installed under ``/root``
(pyenv's default) is not, whatever the environment's own folders allow. :func:`build_env` picks
an interpreter that every user can reach (or refuses, naming the folder in the way), creates a
virtual environment at the prefix, installs the ``hub`` profile of ``pyproject.toml`` into it
(the learner's and the grader's packages, ``jupyterhub-singleuser`` and nbgitpuller;
torch from ``--torch-index`` when given) with the course's pinned versions, and installs
JupyterHub's proxy (``configurable-http-proxy``, from npm, at the version in
``requirements/npm.txt``) into the same prefix, so that ``PREFIX/bin`` holds everything the hub
starts.
"""

from __future__ import annotations

import argparse
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Iterable, Sequence

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "requirements" / "constraints.txt"
NPM_REQUIREMENTS = ROOT / "requirements" / "npm.txt"
PROFILE = "hub"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PROXY_COMMAND = "configurable-http-proxy"


def course_id(course_dir: str | os.PathLike = ROOT) -> str:
    """The course id the course's nbgrader_config.py sets (nbgrader's exchange is organised by
    it, so every user's server must use the same)."""
    from traitlets.config.loader import PyFileConfigLoader
    config = PyFileConfigLoader("nbgrader_config.py", path=str(course_dir)).load_config()
    return config.CourseDirectory.course_id


def unreachable_part(path: str | os.PathLike) -> str | None:
    """Why a user other than the owner could not run ``path`` (after following its links): the
    first folder on the way that others may not enter, or the file they may not read and run.
    None when every user can run it."""
    target = Path(os.path.realpath(path))
    if not target.exists():
        return f"{target} does not exist"
    for folder in reversed(target.parents):
        if not folder.stat().st_mode & stat.S_IXOTH:
            mode = stat.filemode(folder.stat().st_mode)
            return f"other users may not enter {folder} (mode {mode})"
    mode = target.stat().st_mode
    if not (mode & stat.S_IXOTH and mode & stat.S_IROTH):
        return f"other users may not read and run {target} (mode {stat.filemode(mode)})"
    return None


def python_for_everyone(candidates: Iterable[str | os.PathLike]) -> Path:
    """The first candidate interpreter that every user can run (Python 3.10 or newer).
    Raises RuntimeError naming each candidate and why it was refused."""
    refused = []
    for candidate in candidates:
        found = shutil.which(str(candidate))
        if found is None:
            refused.append(f"{candidate}: not found")
            continue
        problem = unreachable_part(found)
        if problem is None:
            version = subprocess.run(
                [found, "-c", "import sys; print(sys.version_info >= (3, 10))"],
                capture_output=True, text=True)
            if version.stdout.strip() == "True":
                return Path(found)
            problem = "not Python 3.10 or newer"
        refused.append(f"{candidate} ({found}): {problem}")
    raise RuntimeError("no Python that every user can run; the hub's users need one. Tried:\n  "
                       + "\n  ".join(refused))


def default_pythons() -> list[str]:
    """Where to look for an interpreter: the one running this, ``python3`` on PATH, Debian's."""
    return [getattr(sys, "_base_executable", sys.executable), "python3", "/usr/bin/python3"]


def npm_requirements(path: Path = NPM_REQUIREMENTS) -> list[str]:
    """The pinned npm packages (``name@version`` per line, ``#`` starts a comment)."""
    lines = (line.split("#")[0].strip() for line in path.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line]


def pinned(name: str, path: Path = CONSTRAINTS) -> str:
    """The version of ``name`` pinned in requirements/constraints.txt."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lower().startswith(f"{name.lower()}=="):
            return line.split("==", 1)[1].strip()
    raise KeyError(f"{path} pins no version of {name}")


def env_commands(prefix: Path, python: Path, torch_index: str | None) -> list[list[str]]:
    """The commands that build the hub's environment at ``prefix`` with ``python``."""
    pip = [str(prefix / "bin" / "python"), "-m", "pip", "install", "--quiet",
           "--disable-pip-version-check", "--no-compile"]
    commands = [[str(python), "-m", "venv", str(prefix)]]
    if torch_index:
        commands.append([*pip, f"torch=={pinned('torch')}", "--index-url", torch_index])
    commands.append([*pip, "-c", str(CONSTRAINTS), "-e", f"{ROOT}[{PROFILE}]"])
    commands.append(["npm", "install", "--global", "--prefix", str(prefix), "--no-audit",
                     "--no-fund", "--loglevel=error", *npm_requirements()])
    return commands


def build_env(prefix: str | os.PathLike, python: str | None = None,
              torch_index: str | None = None) -> Path:
    """Create (or complete) the hub's environment at ``prefix``; returns the prefix."""
    prefix = Path(prefix).resolve()
    chosen = python_for_everyone([python] if python else default_pythons())
    if shutil.which("npm") is None:
        raise RuntimeError("npm is not installed: JupyterHub's proxy (configurable-http-proxy) "
                           "comes from npm (Debian: apt-get install npm)")
    for command in env_commands(prefix, chosen, torch_index):
        if command[1:3] == ["-m", "venv"] and (prefix / "bin" / "python").exists():
            continue
        print("course.hub:", " ".join(command), flush=True)
        subprocess.run(command, check=True)
    problem = unreachable_part(prefix / "bin" / "jupyterhub-singleuser")
    if problem:
        raise RuntimeError(f"the hub's users cannot start their servers: {problem}")
    return prefix


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course.hub",
                                     description="The course's JupyterHub environment.")
    commands = parser.add_subparsers(dest="command", required=True)
    env = commands.add_parser("env", help="build the environment every hub user's server runs in")
    env.add_argument("prefix", help="where to create it (for example /opt/algebra-of-llms)")
    env.add_argument("--python", help="the interpreter (default: the first every user can run)")
    env.add_argument("--torch-index", default="",
                     help="a package index for torch alone, for example PyTorch's CPU index "
                          f"{TORCH_CPU_INDEX} (default: the plain pin, which is the CUDA build "
                          "on Linux)")
    args = parser.parse_args(argv)
    try:
        build_env(args.prefix, args.python, args.torch_index or None)
    except (RuntimeError, subprocess.CalledProcessError) as error:
        print(f"course.hub: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
