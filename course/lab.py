"""JupyterLab on the course, for a learner or an instructor: ``course-lab [--instructor]``
(``python -m course.lab``; ``make lab`` and ``make lab-instructor`` run it).

Both open the ``.md`` chapters as notebooks (jupytext's viewer is the default for Markdown) and
offer nbgrader's Validate button on the exercises. The learner's lab leaves out nbgrader's
instructor tools: the formgrader, the Create Assignment toolbar and the course list, in the
browser (lab extension plugins) and on the server (server extensions). The instructor's lab keeps
them.

Each profile is a Jupyter configuration folder, written by :func:`write_profile` under the
virtual environment (``<venv>/etc/course-lab/<profile>``) and selected with
``JUPYTER_CONFIG_DIR``, which Jupyter reads before every other configuration folder. The
installed packages are not touched, so one environment serves both audiences. On a JupyterHub the
same settings go into the students' image instead (README, "JupyterHub").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

PROFILES = ("learner", "instructor")

INSTRUCTOR_LAB_PLUGINS = ("@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:create-assignment",
                          "@jupyter/nbgrader:course-list")
"""nbgrader's JupyterLab plugins that only an instructor uses (the learner keeps
``validate-assignment``, ``assignment-list`` and the Nbgrader menu that opens the list)."""

INSTRUCTOR_SERVER_EXTENSIONS = ("nbgrader.server_extensions.formgrader",
                                "nbgrader.server_extensions.course_list")
"""nbgrader's server extensions behind those plugins."""

JUPYTEXT_VIEWERS = {"@jupyterlab/docmanager-extension:plugin": {
    "defaultViewers": {"markdown": "Jupytext Notebook", "myst": "Jupytext Notebook"}}}
"""What ``jupytext-config set-default-viewer markdown myst`` writes: a double-click on a chapter
opens it as a notebook, not in the text editor."""


def profile_dir(profile: str, prefix: str | os.PathLike = sys.prefix) -> Path:
    """The configuration folder of a profile inside the environment at ``prefix``."""
    if profile not in PROFILES:
        raise ValueError(f"profile: expected one of {PROFILES}, got {profile!r}")
    return Path(prefix) / "etc" / "course-lab" / profile


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def write_profile(profile: str, folder: str | os.PathLike | None = None) -> Path:
    """Write a profile's Jupyter configuration into ``folder`` (default :func:`profile_dir`) and
    return the folder. Written afresh each time, so an edited profile cannot drift."""
    folder = Path(folder) if folder is not None else profile_dir(profile)
    learner = profile == "learner"
    _write_json(folder / "labconfig" / "default_setting_overrides.json", JUPYTEXT_VIEWERS)
    _write_json(folder / "labconfig" / "page_config.json",
                {"disabledExtensions": {name: learner for name in INSTRUCTOR_LAB_PLUGINS}})
    _write_json(folder / "jupyter_server_config.json",
                {"ServerApp": {"jpserver_extensions": {
                    name: not learner for name in INSTRUCTOR_SERVER_EXTENSIONS}}})
    return folder


DEVICE_VARIABLE = "LLMCORE_DEVICE"
"""llmcore.device.DEVICE_VARIABLE, named here so that starting the lab does not import torch."""

MACOS_DEVICE = "cpu"
"""The device the chapters' kernels use on macOS unless LLMCORE_DEVICE says otherwise: Apple's
GPU (MPS) has no float64, in which several chapters check their results."""


def lab_environment(profile: str, folder: str | os.PathLike | None = None) -> dict[str, str]:
    """The environment in which ``jupyter`` runs with a profile (written first); the kernels
    inherit it. On macOS it sets ``LLMCORE_DEVICE=cpu`` unless the variable is set already
    (``LLMCORE_DEVICE=mps course-lab`` tries the Apple GPU)."""
    env = dict(os.environ)
    env["JUPYTER_CONFIG_DIR"] = str(write_profile(profile, folder))
    if sys.platform == "darwin":
        env.setdefault(DEVICE_VARIABLE, MACOS_DEVICE)
    return env


def lab_arguments(course_dir: str | os.PathLike = ".") -> list[str]:
    """``jupyter lab`` on the course folder (as root only where the OS has users and it is root)."""
    args = [sys.executable, "-m", "jupyter", "lab", f"--notebook-dir={Path(course_dir).resolve()}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        args.append("--allow-root")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="course-lab", description="Start JupyterLab on the course (learner's view by "
                                       "default). Other arguments go to `jupyter lab`.")
    parser.add_argument("--instructor", action="store_true",
                        help="keep nbgrader's instructor tools (formgrader, Create Assignment)")
    parser.add_argument("--course-dir", default=".", help="the course folder (default: .)")
    args, rest = parser.parse_known_args(argv)
    profile = "instructor" if args.instructor else "learner"
    env = lab_environment(profile)
    print(f"course-lab: {profile}'s JupyterLab (configuration: {env['JUPYTER_CONFIG_DIR']})",
          flush=True)
    try:
        return subprocess.call([*lab_arguments(args.course_dir), *rest], env=env)
    except KeyboardInterrupt:
        return 0


def cli() -> None:
    """``course-lab [--instructor] [jupyter lab options]``."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
