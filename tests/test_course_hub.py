"""The hub's set-up without a hub (seconds): the environment builder's checks and commands
(course/hub.py) and what deploy/jupyterhub_config.py writes and chooses per user. The hub itself
runs in tests/test_hub.py."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from course import hub
from course.grading.exchange import EXCHANGE_CLASSES
from course.lab import INSTRUCTOR_LAB_PLUGINS
from course.site import ROOT


THIS_USER = __import__("pwd").getpwuid(os.getuid()).pw_name
"""The first instructor in the scratch configuration: the owner of the course's exchange folder
must be a real account, and only root may give a folder to another."""


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
    assert pip[pip.index("-c") + 1] == str(hub.CONSTRAINTS)
    assert pip[-1] == f"{open_folder / 'env' / hub.EDITION_FOLDER}[hub]"    # the edition
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
    monkeypatch.setenv("COURSE_HUB_INSTRUCTORS", f"{THIS_USER},grace")
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
    for action, name in EXCHANGE_CLASSES.items():
        assert loaded.ExchangeFactory[action] == name
    assert (folder / "state" / "hub").stat().st_mode & 0o777 == 0o700
    assert config.Spawner.cmd == [str(folder / "env" / "bin" / "jupyterhub-singleuser")]
    assert config.Authenticator.allowed_users == {THIS_USER, "grace"}
    assert config.Authenticator.admin_users == set() and config.JupyterHub.admin_access is False


def test_hub_config_prepares_the_exchange(hub_config):
    """The exchange's root is sticky and the hub's; the course's folder the first instructor's,
    its inbound writable but not listable, sticky and setgid."""
    _, folder = hub_config
    root = folder / "exchange"
    course = root / hub.course_id()
    assert stat.S_IMODE(root.stat().st_mode) == hub.EXCHANGE_ROOT_MODE == 0o1777
    for part, mode in hub.EXCHANGE_MODES.items():
        info = (course / part).stat()
        assert stat.S_IMODE(info.st_mode) == mode and info.st_uid == os.getuid(), part
    assert hub.EXCHANGE_MODES["inbound"] & 0o007 == 0o003      # others: write and enter, no list


def test_hub_config_listens_on_localhost_without_a_certificate(hub_config):
    config, _ = hub_config
    assert config.JupyterHub.bind_url == "http://127.0.0.1:8000"
    assert "ssl_cert" not in config.JupyterHub


def test_network_settings_serve_https_with_a_certificate(open_folder):
    cert, key = open_folder / "hub.crt", open_folder / "hub.key"
    cert.write_text("certificate")
    key.write_text("key")
    assert hub.network_settings(str(cert), str(key)) == {
        "ssl_cert": str(cert), "ssl_key": str(key), "bind_url": "https://:8000"}
    with pytest.raises(ValueError, match="both a certificate and its key"):
        hub.network_settings(str(cert), "")
    with pytest.raises(FileNotFoundError, match="no-such.key"):
        hub.network_settings(str(cert), str(open_folder / "no-such.key"))


def test_hub_config_gives_instructors_a_role_that_stops_servers_without_access(hub_config):
    config, _ = hub_config
    (role,) = config.JupyterHub.load_roles
    assert role["users"] == [THIS_USER, "grace"]
    assert "servers!group=students" in role["scopes"]
    assert not any(scope.startswith(("access:", "admin", "users", "tokens"))
                   for scope in role["scopes"]), role["scopes"]
    assert config.Authenticator.manage_groups is True
    assert not config.JupyterHub.get("load_groups")
    hook = config.Authenticator.post_auth_hook
    assert hook(None, None, {"name": "grace"})["groups"] == ["instructors"]
    assert hook(None, None, {"name": "someone"})["groups"] == ["students"]


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another uid needs root")
def test_prepare_exchange_refuses_a_planted_course_folder(open_folder):
    """A course folder someone else made before the hub started (a student who would receive
    every submission) stops the hub with its owner's name; nothing is removed."""
    root = open_folder / "exchange"
    (root / "course101").mkdir(parents=True)
    os.chown(root / "course101", 54321, 54321)
    with pytest.raises(RuntimeError, match="belongs to uid 54321"):
        hub.prepare_exchange(root, "course101", "root")
    assert (root / "course101").exists()
    (root / "course101").rmdir()
    (root / "course101").symlink_to(open_folder)
    with pytest.raises(RuntimeError, match="should be a folder"):
        hub.prepare_exchange(root, "course101", "root")


@pytest.mark.skipif(os.geteuid() != 0, reason="a home of another user needs root to create")
def test_close_home_closes_an_open_home_only():
    import subprocess
    name = "hubunit-home"
    subprocess.run(["userdel", "--remove", name], capture_output=True)
    subprocess.run(["useradd", "--create-home", name], check=True)
    try:
        home = Path(__import__("pwd").getpwnam(name).pw_dir)
        home.chmod(0o755)
        assert "0o755 -> 0o700" in hub.close_home(name)
        assert stat.S_IMODE(home.stat().st_mode) == 0o700
        assert hub.close_home(name) is None
    finally:
        subprocess.run(["userdel", "--remove", name], capture_output=True)


def test_the_environment_is_the_learner_edition(open_folder):
    """What the hub's users import is written from the learner edition: no solutions/, no
    hidden test, and written afresh (an old file disappears)."""
    target = open_folder / "env" / "course"
    hub.write_edition(target)
    (target / "stale.py").write_text("left over")
    hub.write_edition(target)
    assert not (target / "stale.py").exists() and not (target / "solutions").exists()
    assert (target / "llmcore").is_dir() and (target / "deploy" / "jupyterhub_config.py").is_file()
    released = "\n".join(p.read_text() for p in (ROOT / "exercises").rglob("*.ipynb"))
    hidden = {line for line in hidden_test_lines(ROOT / "solutions") if line not in released}
    assert len(hidden) > 30, "too few lines to tell the hidden tests by"
    for path in target.rglob("*"):
        assert path.stat().st_mode & 0o002 == 0, f"{path} is writable by everyone"
        if path.is_file() and path.suffix in {".py", ".ipynb", ".md", ".txt", ".json"}:
            text = path.read_text(errors="replace")
            assert "### BEGIN SOLUTION" not in text and "### BEGIN HIDDEN TESTS" not in text \
                or path.suffix != ".ipynb", path
            leaked = [line for line in hidden if line in text]
            assert not leaked, f"{path} holds hidden tests: {leaked[:3]}"


def hidden_test_lines(solutions: Path) -> set[str]:
    """Every assertion (of some length) inside a hidden-test block of the solutions' notebooks."""
    import nbformat
    lines = set()
    for notebook in solutions.rglob("*.ipynb"):
        for cell in nbformat.read(notebook, as_version=4).cells:
            inside = False
            for line in cell.source.splitlines():
                if "### BEGIN HIDDEN TESTS" in line or "### END HIDDEN TESTS" in line:
                    inside = "BEGIN" in line
                elif inside and len(line.strip()) > 30 and line.strip().startswith("assert"):
                    lines.add(line.strip())
    return lines


@pytest.mark.parametrize("groups, expected", [(["instructors"], "instructor"), ([], "learner")])
def test_hub_config_gives_each_user_their_profile(hub_config, groups, expected, monkeypatch):
    """Before a server starts, its user's home is closed (course.hub.close_home, tested below
    with a real user) and the profile chosen."""
    import json
    config, folder = hub_config
    closed = []
    monkeypatch.setitem(config.Spawner.pre_spawn_hook.__globals__, "close_home", closed.append)
    user = SimpleNamespace(name="someone", groups=[SimpleNamespace(name=g) for g in groups])
    spawner = SimpleNamespace(user=user, environment={"PATH": "/usr/bin"})
    config.Spawner.pre_spawn_hook(spawner)
    assert closed == ["someone"]
    paths = spawner.environment["JUPYTER_CONFIG_PATH"].split(os.pathsep)
    assert Path(paths[0]).name == expected and Path(paths[-1]).name == "nbgrader"
    assert spawner.environment["PATH"] == "/usr/bin"
    page = json.loads((Path(paths[0]) / "labconfig" / "page_config.json").read_text())
    assert all(page["disabledExtensions"][p] is (expected == "learner")
               for p in INSTRUCTOR_LAB_PLUGINS)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another uid needs root")
def test_the_exchange_command_prepares_a_volume_for_uids_without_accounts(open_folder, capsys):
    """``python -m course.hub exchange`` for a Kubernetes volume: the instructor's uid and gid
    given, no account of that name on this machine."""
    root = open_folder / "exchange"
    assert hub.main(["exchange", str(root), "--instructor", "teacher", "--ids", "4321:100",
                     "--course", "course101"]) == 0
    info = (root / "course101" / "inbound").stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (4321, 100, 0o3733)
    assert "inbound" in capsys.readouterr().out
    assert hub.main(["exchange", str(root), "--instructor", "no-such-user-here",
                     "--course", "course102"]) == 1


# ------------------------------------------------------------------ Zero to JupyterHub's config

Z2JH = ROOT / "deploy" / "zero-to-jupyterhub" / "config.yaml"


@pytest.fixture(scope="module")
def z2jh() -> dict:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load(Z2JH.read_text(encoding="utf-8"))


def run_hub_snippet(z2jh: dict):
    """The chart's hub.extraConfig run as the hub runs it, with its roster file."""
    import builtins
    import io
    from traitlets.config import Config
    roster = z2jh["hub"]["extraFiles"]["course-roster"]
    opened = {roster["mountPath"]: roster["stringData"]}

    def fake_open(path, *args, **kwargs):
        return io.StringIO(opened[path]) if path in opened else builtins.open(path, *args, **kwargs)
    namespace = {"c": Config(), "open": fake_open}
    for name, code in z2jh["hub"]["extraConfig"].items():
        exec(compile(code, f"{Z2JH}:hub.extraConfig.{name}", "exec"), namespace)
    return namespace


def test_z2jh_gives_each_user_their_own_uid(z2jh):
    """Every student a distinct uid from the roster (never the image's shared jovyan); a name
    missing from the roster starts no server."""
    namespace = run_hub_snippet(z2jh)
    c = namespace["c"]
    environment = c.KubeSpawner.environment.get_value({})     # what .update() added
    uids = {}
    for name in ("teacher", "alice", "bob"):
        spawner = SimpleNamespace(user=SimpleNamespace(name=name))
        uids[name] = int(environment["NB_UID"](spawner))
        assert environment["NB_USER"](spawner) == name
    assert len(set(uids.values())) == 3 and min(uids.values()) >= 2000, uids
    assert environment["NB_GID"](SimpleNamespace(user=SimpleNamespace(name="teacher"))) == "2000"
    with pytest.raises(ValueError, match="no uid in the course's roster"):
        environment["NB_UID"](SimpleNamespace(user=SimpleNamespace(name="mallory")))
    (role,) = c.JupyterHub.load_roles
    assert role["users"] == ["teacher"] and "servers!group=students" in role["scopes"]
    hook = c.Authenticator.post_auth_hook
    assert hook(None, None, {"name": "alice"})["groups"] == ["students"]


def test_z2jh_nbgrader_config_checks_owners_with_the_roster(z2jh):
    """The pods' nbgrader: the course's exchange classes, the owner check on, and the roster
    the hub uses (mounted into every pod) naming the uids."""
    from traitlets.config import Config
    files = z2jh["singleuser"]["extraFiles"]
    config = Config()
    exec(compile(files["nbgrader-config"]["stringData"], "nbgrader-config", "exec"),
         {"c": config, "get_config": lambda: config})
    for action, name in EXCHANGE_CLASSES.items():
        assert config.ExchangeFactory[action] == name
    assert config.CollectApp.check_owner is True
    assert config.OwnerCheckedCollect.uid_roster == files["course-roster"]["mountPath"]
    assert files["course-roster"]["stringData"] == \
        z2jh["hub"]["extraFiles"]["course-roster"]["stringData"]
    assert config.CourseDirectory.course_id == hub.course_id()
    assert z2jh["hub"]["config"]["JupyterHub"]["admin_access"] is False
    assert z2jh["proxy"]["https"]["enabled"] is True
