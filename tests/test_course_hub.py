"""The hub's set-up without a hub (seconds): the environment builder's checks and commands
(course/hub.py) and what deploy/jupyterhub_config.py writes and chooses per user. The hub itself
runs in tests/test_hub.py."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from course import hub
from course.lab import INSTRUCTOR_LAB_PLUGINS
from course.site import ROOT


@pytest.fixture
def open_folder():
    """A folder every user may enter (pytest's tmp_path is closed to others)."""
    folder = Path(tempfile.mkdtemp(dir="/tmp", prefix="course-hub-unit-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX permissions")
def test_unreachable_part_names_the_closed_folder(open_folder):
    program = open_folder / "closed" / "bin" / "python"
    program.parent.mkdir(parents=True)
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    assert hub.unreachable_part(program) is None
    (open_folder / "closed").chmod(0o700)
    assert f"may not enter {open_folder / 'closed'}" in hub.unreachable_part(program)
    (open_folder / "closed").chmod(0o755)
    program.chmod(0o700)
    assert "may not read and run" in hub.unreachable_part(program)
    assert "does not exist" in hub.unreachable_part(open_folder / "nothing")


def test_python_for_everyone_says_what_it_refused(open_folder):
    closed = open_folder / "closed"
    closed.mkdir(mode=0o700)
    (closed / "python3").symlink_to(sys.executable)
    with pytest.raises(RuntimeError) as refused:
        hub.python_for_everyone([str(closed / "python3"), "no-such-python-here"])
    assert "no-such-python-here: not found" in str(refused.value)
    assert f"{closed / 'python3'} (" in str(refused.value)        # refused, with the reason


def test_env_commands_install_the_hub_profile_with_the_pins(open_folder):
    commands = hub.env_commands(open_folder / "env", Path("/usr/bin/python3"), None)
    assert commands[0] == ["/usr/bin/python3", "-m", "venv", str(open_folder / "env")]
    assert not any("torch==" in part for command in commands for part in command)
    pip = commands[1]
    assert pip[pip.index("-c") + 1] == str(hub.CONSTRAINTS) and pip[-1] == f"{ROOT}[hub]"
    assert commands[-1][:4] == ["npm", "install", "--global", "--prefix"]
    assert commands[-1][-1].startswith("configurable-http-proxy@")
    with_index = hub.env_commands(open_folder / "env", Path("/usr/bin/python3"),
                                  hub.TORCH_CPU_INDEX)
    assert with_index[1][-3:] == [f"torch=={hub.pinned('torch')}", "--index-url",
                                  hub.TORCH_CPU_INDEX]


def test_every_pin_the_hub_profile_names_is_in_the_constraints():
    for name in ("jupyterhub", "nbgitpuller", "nbgrader"):
        assert hub.pinned(name)
    with pytest.raises(KeyError, match="no-such-package"):
        hub.pinned("no-such-package")


@pytest.fixture
def hub_config(open_folder, monkeypatch):
    """deploy/jupyterhub_config.py loaded as JupyterHub loads it (traitlets), in a scratch state
    folder."""
    from traitlets.config.loader import PyFileConfigLoader
    monkeypatch.setenv("COURSE_HUB_STATE", str(open_folder / "state"))
    monkeypatch.setenv("COURSE_HUB_EXCHANGE", str(open_folder / "exchange"))
    monkeypatch.setenv("COURSE_HUB_INSTRUCTORS", "ada,grace")
    monkeypatch.setenv("COURSE_HUB_ENV", str(open_folder / "env"))
    config = PyFileConfigLoader("jupyterhub_config.py", path=str(ROOT / "deploy")).load_config()
    return config, open_folder


def test_hub_config_writes_one_nbgrader_setting_for_everyone(hub_config):
    config, folder = hub_config
    common = folder / "state" / "jupyter" / "nbgrader" / "nbgrader_config.py"
    from traitlets.config.loader import PyFileConfigLoader
    loaded = PyFileConfigLoader(common.name, path=str(common.parent)).load_config()
    assert loaded.CourseDirectory.course_id == hub.course_id()
    assert loaded.Exchange.root == str(folder / "exchange")
    assert (folder / "exchange").stat().st_mode & 0o777 == 0o777
    assert (folder / "state" / "hub").stat().st_mode & 0o777 == 0o700
    assert config.Spawner.cmd == [str(folder / "env" / "bin" / "jupyterhub-singleuser")]
    assert config.JupyterHub.load_groups == {"instructors": {"users": ["ada", "grace"]}}
    assert config.Authenticator.allowed_users == {"ada", "grace"}


@pytest.mark.parametrize("groups, expected", [(["instructors"], "instructor"), ([], "learner")])
def test_hub_config_gives_each_user_their_profile(hub_config, groups, expected):
    import json
    config, folder = hub_config
    user = SimpleNamespace(name="someone", groups=[SimpleNamespace(name=g) for g in groups])
    spawner = SimpleNamespace(user=user, environment={"PATH": "/usr/bin"})
    config.Spawner.pre_spawn_hook(spawner)
    paths = spawner.environment["JUPYTER_CONFIG_PATH"].split(os.pathsep)
    assert Path(paths[0]).name == expected and Path(paths[-1]).name == "nbgrader"
    assert spawner.environment["PATH"] == "/usr/bin"
    page = json.loads((Path(paths[0]) / "labconfig" / "page_config.json").read_text())
    assert all(page["disabledExtensions"][p] is (expected == "learner")
               for p in INSTRUCTOR_LAB_PLUGINS)
