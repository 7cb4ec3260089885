"""The learner's check's standby kernel (course/grading/standby.py): the next check takes the
kernel the previous one left started, each kernel is still fresh and used once, a standby made
another way is not taken, one left alone stops, and a check that lets go kills its kernel.

Each test keeps its standbys in a folder of its own (``TMPDIR``), short enough for a unix socket's
path, and stops them when it ends."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest

from course.grading import sandbox, standby

ROOT = Path(__file__).resolve().parents[1]
EXERCISE = ROOT / "exercises" / "01_matmul" / "matmul.ipynb"
BARE = standby.Spec("python3", ("--IPKernelApp.log_level=ERROR",), 2048, 600)
"""A kernel with no preloads: quick to start, made like a check's in every other way."""

pytestmark = pytest.mark.skipif(sandbox.sandbox_problem() is not None,
                                reason=f"the sandbox cannot start here: {sandbox.sandbox_problem()}")


@pytest.fixture
def own_root(monkeypatch, tmp_path_factory):
    """This test's standby folder (TMPDIR) with standbys on; every standby stopped after.
    pytest's own temporary folders are placed first, outside it (they are placed from TMPDIR
    once per session, and this folder is removed after the test)."""
    tmp_path_factory.getbasetemp()
    folder = tempfile.mkdtemp(prefix="sb", dir="/tmp")
    monkeypatch.setenv("TMPDIR", folder)
    monkeypatch.setenv(standby.SWITCH, "1")
    tempfile.tempdir = None                      # gettempdir() reads TMPDIR again
    try:
        yield standby.standby_root()
    finally:
        standby.stop_all()
        monkeypatch.undo()
        tempfile.tempdir = None                  # and again from the restored TMPDIR
        shutil.rmtree(folder, ignore_errors=True)


def until(condition, seconds: float = 60) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def course_check(notebook: Path, *options: str) -> str:
    done = subprocess.run([sys.executable, "-m", "course.grading", "check", "--profile",
                           *options, str(notebook)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    return done.stdout + done.stderr


def with_learner_code(tmp_path: Path, name: str, code: str) -> Path:
    """Exercise 1 with its first answer cell replaced by ``code``."""
    nb = nbformat.read(str(EXERCISE), as_version=4)
    answer = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution"))
    answer.source = code
    path = tmp_path / name / EXERCISE.name
    path.parent.mkdir()
    nbformat.write(nb, str(path))
    return path


@pytest.mark.slow
def test_the_next_check_takes_the_kernel_the_last_one_left_and_leaves_another(own_root):
    first = course_check(EXERCISE)
    assert "kernel start (sandbox" in first and "kernel taken from the standby" not in first
    assert until(lambda: standby.untaken() and standby.settle(0.1)), "no standby was left"
    (left,) = standby.untaken()
    second = course_check(EXERCISE)
    assert "kernel taken from the standby" in second and "kernel start (sandbox" not in second
    verdicts = [line for line in second.splitlines() if line.startswith("  FAIL")]
    assert verdicts == [line for line in first.splitlines() if line.startswith("  FAIL")]
    assert until(lambda: not left.exists()), "the taken standby did not end with its check"
    assert until(lambda: len(standby.untaken()) == 1), "the second check left no standby"
    assert standby.untaken()[0] != left
    off = course_check(EXERCISE, "--no-standby")
    assert "kernel start (sandbox" in off and len(standby.untaken()) == 1


@pytest.mark.slow
def test_a_taken_kernel_is_fresh_and_keeps_the_cell_timeout(own_root, tmp_path):
    writes = with_learner_code(tmp_path, "a", "import builtins, os\n"
                               "open('/tmp/left-by-a', 'w').write('a')\n"
                               "open(os.path.expanduser('~/left-by-a'), 'w').write('a')\n"
                               "builtins.left_by_a = True\n")
    course_check(writes)
    assert until(lambda: standby.untaken() and standby.settle(0.1))
    reads = with_learner_code(tmp_path, "b", "import builtins, os\n"
                              "seen = [p for p in ('/tmp/left-by-a', '~/left-by-a') "
                              "if os.path.exists(os.path.expanduser(p))]\n"
                              "assert not seen and not hasattr(builtins, 'left_by_a'), seen\n"
                              "while True:\n    pass\n")
    start = time.monotonic()
    text = course_check(reads, "--timeout", "3")
    assert "kernel taken from the standby" in text
    assert "CellTimeoutError" in text and "AssertionError" not in text, text
    assert time.monotonic() - start < 60


def test_a_standby_made_another_way_is_not_taken_and_is_asked_to_stop(own_root):
    bare = standby.leave(BARE)
    assert bare is not None and bare.parent == own_root and standby.untaken() == [bare]
    other = standby.Spec(BARE.kernel_name, BARE.extra_arguments, 1024, BARE.notebook_timeout)
    assert other.key() != BARE.key()
    assert standby.claim(other) is None and bare.exists()
    assert standby.leave(BARE) is None                    # one unclaimed standby per spec
    standby.leave(other)
    assert until(lambda: not bare.exists()), "the other spec's standby did not stop"
    assert until(lambda: [f.name.rpartition("-")[0] for f in standby.untaken()]
                 == [other.key()])
    assert standby.stop_all() == 1 and not standby.untaken()


def test_the_key_follows_the_files_the_kernel_is_made_of(own_root, monkeypatch):
    files = [Path(path) for path, _, _ in standby._package_files()]
    names = {(p.parent.name, p.name) for p in files}
    assert {("llmcheck", "seal.py"), ("llmcore", "model.py"), ("sandbox", "bwrap.py")} <= names
    before = BARE.key()
    monkeypatch.setattr(standby, "_package_files", lambda: [[str(files[0]), 1, 2]])
    assert BARE.key() != before


def test_a_kernel_let_go_is_killed_with_its_sandbox(own_root):
    folder = standby.leave(BARE)
    pid = int(folder.name.rpartition("-")[2])
    claimed = standby.claim(BARE)                          # waits for it to start
    assert claimed is not None and (folder / standby.TAKEN_FILE).exists()
    assert not (folder / standby.SOCKET_FILE).exists() and standby.untaken() == []
    assert standby.claim(BARE) is None                    # used once
    assert asyncio.run(claimed.poll()) is None            # running
    asyncio.run(claimed.cleanup())                         # as a killed check's socket closes
    assert until(lambda: not folder.exists(), 30)
    assert until(lambda: not alive(pid), 30)


def alive(pid: int) -> bool:
    """The process runs (a zombie, ended but not yet waited for by this test's process, does
    not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_an_unclaimed_standby_stops_when_its_time_is_up(own_root, monkeypatch):
    monkeypatch.setenv(standby.IDLE, "3")
    folder = standby.leave(BARE)
    assert until(lambda: (folder / standby.READY_FILE).exists())
    assert until(lambda: not folder.exists(), 60), "the idle standby is still there"


def test_a_folder_others_can_open_is_not_used(own_root):
    os.chmod(own_root, 0o755)
    try:
        with pytest.raises(standby.StandbyUnsafe, match="0700"):
            standby.standby_root()
        assert standby.claim(BARE) is None and standby.leave(BARE) is None
    finally:
        os.chmod(own_root, 0o700)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_folder_another_user_made_first_is_not_used(own_root):
    """On a shared machine another user can make /tmp/course-check-standby-<your uid> before
    your first check, to hand out kernels: it is refused, and the check starts its own."""
    os.chown(own_root, 4242, 4242)
    try:
        with pytest.raises(standby.StandbyUnsafe, match=f"uid {os.getuid()}"):
            standby.standby_root()
        assert standby.claim(BARE) is None and standby.leave(BARE) is None
    finally:
        os.chown(own_root, 0, 0)
