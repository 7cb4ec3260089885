"""A curious student's attempts on a class's files, run as that student's own Unix user (the uid
and groups their server has) by tests/test_hub.py:

    runuser -u <student> -- <hub env>/bin/python hub_attacker.py PLAN.json

PLAN is a list of attempts ``{"name": ..., "op": ..., "path": ..., "to": ...}``; it prints one
JSON object ``{name: outcome}``, where an outcome is ``"done"`` (the attempt worked: the attack
succeeded), ``"refused: <errno name>"`` (the system said no) or, for ``solutions_via_env``, the
paths it found. Nothing here knows what should happen: the test decides.
"""

from __future__ import annotations

import errno
import importlib
import json
import os
import shutil
import sys
from pathlib import Path


def read(path: str, to: str | None) -> None:
    target = Path(path)
    if target.is_dir():
        for entry in sorted(target.rglob("*")):        # every file of it, as far as allowed
            if entry.is_file():
                entry.read_bytes()
        os.listdir(target)
    else:
        target.read_bytes()


def listing(path: str, to: str | None) -> None:
    os.listdir(path)


def write(path: str, to: str | None) -> None:
    with open(path, "r+b") as out:
        out.write(b"{}")


def create(path: str, to: str | None) -> None:
    with open(path, "xb") as out:
        out.write(b"planted")


def mkdir(path: str, to: str | None) -> None:
    os.mkdir(path)


def rename(path: str, to: str | None) -> None:
    os.rename(path, to)


def remove(path: str, to: str | None) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def replace(path: str, to: str | None) -> None:
    """Make a folder of one's own beside ``path`` and move it into its place."""
    planted = f"{path}.planted-{os.getpid()}"
    os.mkdir(planted)
    try:
        os.rename(planted, path)
    finally:
        if os.path.isdir(planted):
            os.rmdir(planted)


def forge(path: str, to: str | None) -> None:
    """A submission folder in another student's name (``path``), holding the notebook ``to``,
    open to everyone as nbgrader's own submit leaves one."""
    os.mkdir(path)
    shutil.copy(to, Path(path) / Path(to).name)
    Path(path, "timestamp.txt").write_text(Path(path).name.split("+")[2])
    for entry in (Path(path) / Path(to).name, Path(path) / "timestamp.txt", Path(path)):
        entry.chmod(0o777)


def solutions_via_env(path: str, to: str | None) -> list[str]:
    """Everything a student can import from the environment, searched for the instructor's
    material: a ``solutions`` folder beside any of the course's packages, and notebooks or
    files holding hidden tests anywhere under the folders they come from."""
    found = []
    for package in ("course", "llmcore", "llmcheck"):
        module = importlib.import_module(package)
        source = Path(module.__file__).resolve().parent.parent
        for folder in (source / "solutions", source / "source"):
            if folder.exists():
                found.append(str(folder))
        for notebook in source.rglob("*.ipynb"):
            try:
                text = notebook.read_text(errors="replace")
            except OSError:
                continue
            if "### BEGIN HIDDEN TESTS" in text or "### BEGIN SOLUTION" in text:
                found.append(str(notebook))
    return found


OPS = {f.__name__: f for f in (read, listing, write, create, mkdir, rename, remove, replace,
                               forge, solutions_via_env)}


def main(plan_file: str) -> int:
    outcomes = {}
    for step in json.loads(Path(plan_file).read_text()):
        try:
            result = OPS[step["op"]](step.get("path"), step.get("to"))
            outcomes[step["name"]] = result if isinstance(result, list) else "done"
        except OSError as error:
            outcomes[step["name"]] = f"refused: {errno.errorcode.get(error.errno, error.errno)}"
    print(json.dumps(outcomes))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
