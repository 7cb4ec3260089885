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

The environment holds no solution and no hidden test: what it installs is the course's learner
edition (:mod:`course.grading.edition`), written to ``PREFIX/course`` (root's, readable by all)
and installed from there, so the course's own clone (with ``solutions/``) can stay closed to
everyone but its owner; ``build_env`` writes the edition afresh each time it runs.

The hub's set-up of a class on one machine (``deploy/jupyterhub_config.py`` calls these):
:func:`close_home` (a home only its user can enter), :func:`prepare_exchange` (nbgrader's exchange
owned by root and the course's instructor, with the sticky bit where everyone writes) and
:func:`network_settings` (HTTPS, or only the machine's own address behind a reverse proxy).
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Iterable, Sequence

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "requirements" / "constraints.txt"
NPM_REQUIREMENTS = ROOT / "requirements" / "npm.txt"
PROFILE = "hub"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PROXY_COMMAND = "configurable-http-proxy"
EDITION_FOLDER = "course"
"""Where in the environment's prefix the learner edition it installs lives."""
HOME_MODE = 0o700
"""A user's home on the hub: theirs alone."""
EXCHANGE_ROOT_MODE = 0o1777
"""nbgrader insists that everyone may write the exchange's root; the sticky bit keeps each entry
its owner's (nobody renames, replaces or deletes what another made)."""
EXCHANGE_MODES = {"": 0o755, "outbound": 0o755, "inbound": 0o3733, "feedback": 0o711}
"""The course's folder in the exchange and its parts, owned by the course's instructor: released
assignments readable by all; ``inbound`` writable by all but not listable, with the sticky bit
(a submission is its student's: nobody else renames or replaces it) and setgid (submissions take
the instructor's group); ``feedback`` readable only by a file's exact (secret) name."""
DEFAULT_PORT = 8000
INSTALLED_STAMP = ".course-hub-installed"
"""What the environment's packages were installed from (:func:`install_key`)."""


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
    """The commands that build the hub's environment at ``prefix`` with ``python``: the hub
    profile of the learner edition at ``prefix/course`` (:func:`write_edition`), with the pins."""
    pip = [str(prefix / "bin" / "python"), "-m", "pip", "install", "--quiet",
           "--disable-pip-version-check", "--no-compile"]
    commands = [[str(python), "-m", "venv", str(prefix)]]
    if torch_index:
        commands.append([*pip, f"torch=={pinned('torch')}", "--index-url", torch_index])
    commands.append([*pip, "-c", str(CONSTRAINTS), "-e", f"{prefix / EDITION_FOLDER}[{PROFILE}]"])
    commands.append(["npm", "install", "--global", "--prefix", str(prefix), "--no-audit",
                     "--no-fund", "--loglevel=error", *npm_requirements()])
    return commands


def install_key(torch_index: str | None) -> str:
    """The pins and options an environment's packages come from: when they are unchanged, a
    rebuild only writes the edition afresh (the editable install already points at it)."""
    import hashlib
    pins = b"".join(p.read_bytes() for p in (ROOT / "pyproject.toml", CONSTRAINTS))
    return f"{hashlib.sha256(pins).hexdigest()} torch-index={torch_index or ''}\n"


def _edition_module():
    """course/grading/edition.py, loaded on its own: it needs only the standard library, while
    importing the ``course.grading`` package imports the grader (numpy, nbformat), which the
    bare Python that builds the hub's environment does not have."""
    import importlib.util
    path = ROOT / "course" / "grading" / "edition.py"
    spec = importlib.util.spec_from_file_location("course_grading_edition", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_edition(target: Path, course: Path = ROOT) -> Path:
    """Write the learner edition of ``course`` to ``target``, replacing the one there (the old
    one is removed only once the new one is complete); every part readable, none writable, by
    other users. Returns ``target``."""
    learner_edition = _edition_module().learner_edition
    fresh = target.with_name(target.name + ".new")
    shutil.rmtree(fresh, ignore_errors=True)
    learner_edition(course, fresh)
    for folder, _, files in os.walk(fresh):
        os.chmod(folder, 0o755)
        for name in files:
            path = os.path.join(folder, name)
            os.chmod(path, 0o755 if os.access(path, os.X_OK) else 0o644)
    old = target.with_name(target.name + ".old")
    if target.exists():
        shutil.rmtree(old, ignore_errors=True)
        target.rename(old)
    fresh.rename(target)
    shutil.rmtree(old, ignore_errors=True)
    return target


def close_home(name: str) -> str | None:
    """Close the home of the Unix user ``name`` to everyone else (mode 0700) if it is open
    (Debian's ``useradd -m`` makes homes 0755). Returns what was changed, or None."""
    home = Path(pwd.getpwnam(name).pw_dir)
    mode = home.stat().st_mode & 0o7777
    if mode & 0o077 == 0:
        return None
    home.chmod(HOME_MODE)
    return f"closed {name}'s home {home} to other users ({oct(mode)} -> {oct(HOME_MODE)})"


def prepare_exchange(root: Path, course: str, instructor: str,
                     ids: tuple[int, int] | None = None) -> list[str]:
    """nbgrader's exchange at ``root`` for the course ``course``, set up (as root) so that no
    student can subvert it: ``root`` owned by root with :data:`EXCHANGE_ROOT_MODE`, the course's
    folder and its parts owned by the instructor with :data:`EXCHANGE_MODES`. Anything already
    there that belongs to anyone else is refused (RuntimeError naming it and its owner), never
    removed. ``ids`` gives the instructor's (uid, gid) where this machine has no account of
    that name (a volume prepared for Kubernetes pods). Returns what it changed."""
    if ids is None:
        account = pwd.getpwnam(instructor)
        ids = (account.pw_uid, account.pw_gid)
    owner = SimpleNamespace(pw_uid=ids[0], pw_gid=ids[1])
    changed = []
    root.mkdir(parents=True, exist_ok=True)
    _check_owner(root, {0, os.geteuid()}, "root (the hub)")
    if root.stat().st_mode & 0o7777 != EXCHANGE_ROOT_MODE:
        root.chmod(EXCHANGE_ROOT_MODE)
        changed.append(f"{root}: mode {oct(EXCHANGE_ROOT_MODE)}")
    for part, mode in EXCHANGE_MODES.items():
        folder = root / course / part if part else root / course
        if not folder.exists() and not folder.is_symlink():
            folder.mkdir()
            os.chown(folder, owner.pw_uid, owner.pw_gid)
            changed.append(f"{folder}: made, {instructor}'s")
        _check_owner(folder, {owner.pw_uid, 0}, f"root or {instructor}")
        if folder.stat().st_mode & 0o7777 != mode:
            folder.chmod(mode)
            changed.append(f"{folder}: mode {oct(mode)}")
    return changed


def _check_owner(folder: Path, uids: set[int], who: str) -> None:
    """RuntimeError unless ``folder`` is a real folder (not a link) owned by one of ``uids``."""
    info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise RuntimeError(f"the exchange: {folder} should be a folder, found "
                           f"{stat.filemode(info.st_mode)} (a link or a file); move it away")
    if info.st_uid not in uids:
        try:
            name = pwd.getpwuid(info.st_uid).pw_name
        except KeyError:
            name = f"uid {info.st_uid}"
        raise RuntimeError(f"the exchange: {folder} belongs to {name}, expected {who}: someone "
                           "may have planted it; check what it holds and move it away")


def network_settings(cert: str = "", key: str = "", port: int = DEFAULT_PORT) -> dict:
    """Where the hub listens (JupyterHub's settings): HTTPS on every address with the
    certificate ``cert`` and its key ``key``; without them, plain HTTP on the machine's own
    address only (127.0.0.1), for a reverse proxy on the same machine that serves HTTPS."""
    if bool(cert) != bool(key):
        raise ValueError(f"HTTPS needs both a certificate and its key: got certificate "
                         f"{cert or '(none)'} and key {key or '(none)'}")
    if cert:
        for path in (cert, key):
            if not Path(path).is_file():
                raise FileNotFoundError(f"HTTPS: no such file {path}")
        return {"ssl_cert": cert, "ssl_key": key, "bind_url": f"https://:{port}"}
    return {"bind_url": f"http://127.0.0.1:{port}"}


def build_env(prefix: str | os.PathLike, python: str | None = None,
              torch_index: str | None = None) -> Path:
    """Create (or complete) the hub's environment at ``prefix``; returns the prefix."""
    prefix = Path(prefix).resolve()
    chosen = python_for_everyone([python] if python else default_pythons())
    if shutil.which("npm") is None:
        raise RuntimeError("npm is not installed: JupyterHub's proxy (configurable-http-proxy) "
                           "comes from npm (Debian: apt-get install npm)")
    write_edition(prefix / EDITION_FOLDER)
    installed = prefix / INSTALLED_STAMP
    wanted = install_key(torch_index)
    for command in env_commands(prefix, chosen, torch_index):
        if command[1:3] == ["-m", "venv"] and (prefix / "bin" / "python").exists():
            continue
        if command[0] == "npm" and (prefix / "bin" / PROXY_COMMAND).exists():
            continue
        if "pip" in command and installed.is_file() and installed.read_text() == wanted:
            continue                    # the same pins: the edition's new files are enough
        print("course.hub:", " ".join(command), flush=True)
        subprocess.run(command, check=True)
    installed.write_text(wanted)
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
    exchange = commands.add_parser(
        "exchange", help="set up nbgrader's exchange so that no student can subvert it (as root)")
    exchange.add_argument("root", help="the exchange's folder (for example /srv/nbgrader/exchange)")
    exchange.add_argument("--instructor", required=True,
                          help="the instructor who releases and collects (owns the course's "
                               "folder)")
    exchange.add_argument("--ids", metavar="UID:GID",
                          help="the instructor's uid and gid, where this machine has no such "
                               "account (a volume for Kubernetes pods)")
    exchange.add_argument("--course",
                          help="the course id (default: the course's nbgrader_config.py)")
    args = parser.parse_args(argv)
    try:
        if args.command == "exchange":
            ids = tuple(int(part) for part in args.ids.split(":")) if args.ids else None
            for change in prepare_exchange(Path(args.root), args.course or course_id(),
                                           args.instructor, ids):
                print(f"course.hub: {change}")
            return 0
        build_env(args.prefix, args.python, args.torch_index or None)
    except (RuntimeError, KeyError, ValueError, subprocess.CalledProcessError) as error:
        print(f"course.hub: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
