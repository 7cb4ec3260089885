"""The grader against a hostile class: sandboxed kernels, limits, nothing lost, every outcome
explained. Attacks are real submissions (tests/grading/attacks.py), graded in ONE run with honest
students before and after them; a second test SIGKILLs the grader mid-run and runs it again.

The fast tests at the top check the sandbox's pieces without nbgrader.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import importlib.util
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import nbformat
import pytest

from course import grading
from course.grading import sandbox

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import test_grading as tg  # noqa: E402  (the class builders of the earlier grading tests)

_spec = importlib.util.spec_from_file_location("grading_attacks",
                                               ROOT / "tests" / "grading" / "attacks.py")
attacks = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = attacks
_spec.loader.exec_module(attacks)

CELL_TIMEOUT = 10
NOTEBOOK_TIMEOUT = 40

needs_sandbox = pytest.mark.skipif(sandbox.sandbox_problem() is not None,
                                   reason=f"no sandbox here: {sandbox.sandbox_problem()}")


# ------------------------------------------------------------------------------------------------
# The sandbox's pieces (fast)
# ------------------------------------------------------------------------------------------------

def test_bwrap_command_binds_no_course_folder(tmp_path):
    notebook = tmp_path / "matmul.ipynb"
    notebook.write_text("{}")
    args = sandbox.bwrap_command(tmp_path, [notebook])
    binds = [args[i + 1] for i, a in enumerate(args) if a in ("--bind", "--ro-bind",
                                                              "--ro-bind-try")]
    for forbidden in ("solutions", "exercises", "submitted", "gradebook.db", "nbgrader_config"):
        assert not [b for b in binds if forbidden in b], (forbidden, binds)
    assert str(ROOT) not in binds, "the course root itself must never be bound"
    assert "--unshare-all" in args and "--die-with-parent" in args and args[-1] == "--"
    assert args[args.index("--bind") + 1] == str(tmp_path), "only the kernel's socket folder " \
                                                            "is writable"


def test_the_python_environment_is_bound_over_the_private_tmp(tmp_path, monkeypatch):
    """A checkout (and its .venv) under /tmp, as a fresh clone in CI may be: the environment must
    be mounted after the private /tmp, or the sandbox hides the kernel's own interpreter."""
    monkeypatch.setattr(sandbox, "_python_dirs", lambda: ["/tmp/somewhere/.venv"])
    args = sandbox.bwrap_command(tmp_path, [])
    tmpfs = args.index("/tmp", args.index("--tmpfs"))
    bound = [i for i, a in enumerate(args) if a == "/tmp/somewhere/.venv"]
    assert bound and min(bound) > tmpfs, args


def test_grading_refuses_without_a_sandbox(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox, "sandbox_problem", lambda: "bwrap is not installed (test)")
    (tmp_path / "submitted").mkdir()
    with pytest.raises(sandbox.SandboxUnavailable, match="bwrap is not installed.*"
                                                          "--unsandboxed-trusted"):
        grading.grade(tmp_path, config_file=ROOT / "nbgrader_config.py")
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from course.grading import sandbox, cli; "
         "sandbox.sandbox_problem = lambda: 'no user namespaces (test)'; "
         f"sys.exit(cli.main(['grade', '--course-dir', {str(tmp_path)!r}]))"],
        cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2 and "no user namespaces (test)" in done.stderr, done.stderr


def test_kernel_manager_refuses_to_autograde_without_a_sandbox(monkeypatch):
    monkeypatch.setattr(sandbox, "sandbox_problem", lambda: "bwrap is not installed (test)")
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    km = sandbox.SandboxedKernelManager(kernel_name="python3")
    with pytest.raises(sandbox.SandboxUnavailable, match="unsandboxed_trusted"):
        asyncio.run(km.start_kernel())


@pytest.mark.slow
def test_the_learners_check_runs_unsandboxed_with_a_warning_where_bwrap_cannot_start():
    code = ("import sys; from course.grading import sandbox, cli; "
            "sandbox.sandbox_problem = lambda: 'no user namespaces (test)'; "
            "sys.exit(cli.main(['check', 'exercises/01_matmul/matmul.ipynb', '--timeout', '60']))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL    test_dot: 0 of 1 point" in done.stdout, done.stdout
    assert "warning: running notebooks WITHOUT the sandbox: no user namespaces (test)" \
        in done.stderr, done.stderr


async def _sandboxed_kernel(cwd: Path, *, notebook_timeout: int):
    """A started SandboxedKernelManager and its ready client."""
    km = sandbox.SandboxedKernelManager(kernel_name="python3", notebook_timeout=notebook_timeout)
    await km.start_kernel(cwd=str(cwd))
    kc = km.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=60)
    return km, kc


@needs_sandbox
@pytest.mark.slow
def test_a_sandboxed_kernel_sees_only_its_notebook_and_leaves_nothing(tmp_path):
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "mine.ipynb").write_text("{}")
    (folder / "secret.txt").write_text("not for the kernel")
    token = uuid.uuid4().hex

    async def run() -> str:
        km, kc = await _sandboxed_kernel(folder, notebook_timeout=60)
        seen = []
        code = ("import os, subprocess, sys\n"
                "root = %r\n"
                "print(sorted(os.listdir('.')), os.getuid(),"
                " sorted(os.listdir(root)) if os.path.isdir(root) else [])\n"
                "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', %r],"
                " start_new_session=True)\n" % (str(ROOT), token))
        await kc.execute_interactive(code, timeout=30, output_hook=lambda m: seen.append(
            m["content"].get("text", "")) if m["msg_type"] == "stream" else None)
        kc.stop_channels()
        await km.shutdown_kernel()
        return "".join(seen)

    seen = asyncio.run(run())
    # The course root shows at most the mount point of a virtual environment kept inside it.
    assert seen.strip() in ("['mine.ipynb'] 1000 []", "['mine.ipynb'] 1000 ['.venv']"), seen
    time.sleep(0.5)
    assert not _processes_with(token), "a process started in the sandbox outlived its kernel"


@needs_sandbox
@pytest.mark.slow
def test_the_wall_clock_kills_a_kernel_that_ignores_sigint(tmp_path):
    token = uuid.uuid4().hex

    async def run() -> bool:
        km, kc = await _sandboxed_kernel(tmp_path, notebook_timeout=8)
        kc.execute("import signal, subprocess, sys\n"
                   "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                   f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', {token!r}])\n"
                   "while True:\n    pass\n")
        await asyncio.sleep(2)
        await km.interrupt_kernel()
        await asyncio.sleep(1)
        alive_after_interrupt = await km.is_alive()
        await asyncio.sleep(8)
        alive = await km.is_alive()
        kc.stop_channels()
        await km.shutdown_kernel(now=True)
        return alive_after_interrupt and not alive

    before = len(sandbox.EVENTS)
    assert asyncio.run(run()), "the kernel must survive the interrupt and die at the wall clock"
    assert {"kind": "timeout", "seconds": 8} in sandbox.EVENTS[before:]
    time.sleep(0.5)
    assert not _processes_with(token)


def _processes_with(token: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if token.encode() in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
    return found


# ------------------------------------------------------------------------------------------------
# A hostile class, graded in one run
# ------------------------------------------------------------------------------------------------

def _attack_notebook(attack, course: Path, token: str):
    nb = tg._submission(attack.assignment, answered=attack.answered)
    code = attack.code.format(course=course, token=token, grader_pid=os.getpid())
    first_answer = next(i for i, c in enumerate(nb.cells)
                        if c.metadata.get("nbgrader", {}).get("solution"))
    nb.cells.insert(first_answer, nbformat.v4.new_code_cell(code))
    for cell in list(nb.cells):
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade_id") in attack.delete:
            nb.cells.remove(cell)
        elif meta.get("grade_id") in attack.rename:
            meta["grade_id"] = attack.rename[meta["grade_id"]]
    return nb


class _Honest:
    def __init__(self, student):
        self.student, self.assignment = student, "01_matmul"


HONEST = [_Honest("aa_honest"), _Honest("zz_honest")]


def _printed(notebook: Path) -> str:
    """Everything the notebook's cells printed (stream outputs), not their source."""
    nb = nbformat.read(notebook, as_version=4)
    return "".join(out.get("text", "") for cell in nb.cells for out in cell.get("outputs", [])
                   if out.get("output_type") == "stream")


def _new_course(tmp_path_factory, name: str) -> Path:
    course = tmp_path_factory.mktemp(name)
    shutil.copytree(ROOT / "solutions", course / "solutions")
    shutil.copy(ROOT / "nbgrader_config.py", course / "nbgrader_config.py")
    return course


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    if sandbox.sandbox_problem() is not None:
        pytest.skip(f"no sandbox here: {sandbox.sandbox_problem()}")
    course = _new_course(tmp_path_factory, "hostile")
    token = uuid.uuid4().hex
    honest = tg._submission("01_matmul", answered=True)
    tg._submit(course, "aa_honest", "01_matmul", honest)
    tg._submit(course, "aa_blank", "01_matmul", tg._submission("01_matmul", answered=False))
    for attack in attacks.ATTACKS:
        tg._submit(course, attack.student, attack.assignment,
                   _attack_notebook(attack, course, token))
    tg._submit(course, "zz_honest", "01_matmul", honest)
    # Submissions made of symbolic links to another student's work.
    linked = course / "submitted" / "links_notebook" / "01_matmul"
    linked.mkdir(parents=True)
    (linked / "matmul.ipynb").symlink_to(course / "submitted" / "aa_honest" / "01_matmul" /
                                         "matmul.ipynb")
    (course / "submitted" / "links_folder").symlink_to(course / "submitted" / "aa_honest")
    before = tg.tree_hash(course)
    run = grading.grade(course, timeout=CELL_TIMEOUT, notebook_timeout=NOTEBOOK_TIMEOUT,
                        log=lambda message: print(message, flush=True))
    print(run.summary())
    with open(course / "course_grades.csv", newline="") as f:
        table = {(r["student_id"], r["assignment"]): r for r in csv.DictReader(f)}
    return course, token, before, run, table


@pytest.mark.slow
def test_honest_students_keep_their_exact_scores(hostile):
    course, _, _, run, table = hostile
    for student, score in (("aa_honest", 12), ("zz_honest", 12), ("aa_blank", 0)):
        row = table[(student, "01_matmul")]
        assert row["status"] == "graded" and float(row["score"]) == score, row
    cells = tg._cell_scores(course / "gradebook.db", "zz_honest", "01_matmul")
    assert all(score == top for score, top in cells.values()), cells


@pytest.mark.slow
@pytest.mark.parametrize("attack", attacks.ATTACKS, ids=[a.student for a in attacks.ATTACKS])
def test_no_attack_scores_above_its_honest_work(hostile, attack):
    course, _, _, _, table = hostile
    row = table[(attack.student, attack.assignment)]
    assert float(row["score"]) <= attack.max_score, row
    assert row["status"].startswith("failed:") == attack.fails, row
    if attack.reason:
        assert attack.reason in row["status"] + row["reasons"], row
    graded = course / "autograded" / attack.student / attack.assignment / "matmul.ipynb"
    if not attack.fails:
        assert float(row["score"]) == attack.max_score, row
        text = _printed(graded)
        assert "SUCCEEDED" not in text, [line for line in text.splitlines()
                                          if "SUCCEEDED" in line]


@pytest.mark.slow
def test_a_submission_of_symbolic_links_gets_nothing(hostile):
    _, _, _, _, table = hostile
    row = table[("links_notebook", "01_matmul")]
    assert float(row["score"]) == 0 and "symbolic link" in row["reasons"], row
    row = table[("links_folder", "01_matmul")]
    assert float(row["score"]) == 0 and row["status"].startswith("refused:"), row


@pytest.mark.slow
def test_every_probe_was_blocked(hostile):
    course, _, _, _, _ = hostile
    outputs = "".join(_printed(course / "autograded" / a.student / a.assignment / "matmul.ipynb")
                      for a in [*attacks.ATTACKS, *HONEST] if not getattr(a, "fails", False))
    assert "SUCCEEDED" not in outputs
    for probe in ("read_solutions", "read_gradebook", "read_config", "read_other",
                  "write_gradebook", "write_other", "write_solutions", "sitecustomize",
                  "pth_file", "llmcore", "kill_parent", "kill_grader", "tcp", "dns"):
        assert f"ATTACK {probe} BLOCKED" in outputs, probe


@pytest.mark.slow
def test_the_course_is_unchanged_except_for_the_grader_outputs(hostile):
    course, token, before, _, _ = hostile
    time.sleep(5)
    assert tg.tree_hash(course) == before
    assert not (course / "daemon_was_here").exists() and not (course / "planted.txt").exists()
    assert not _processes_with(token), "a daemon outlived its kernel"


@pytest.mark.slow
def test_every_failure_has_its_reason_in_the_csv(hostile):
    _, _, _, _, table = hostile
    for (student, _), row in table.items():
        if float(row["score"]) < float(row["max_score"]):
            assert row["reasons"] or row["status"].startswith("failed:"), row
    blank = table[("aa_blank", "01_matmul")]["reasons"]
    assert "test_dot: NotImplementedError: replace this line with your code" in blank
    renamed = table[("renames_tests", "01_matmul")]["reasons"]
    assert "test_dot: locked test cell missing or its grade_id renamed" in renamed
    assert "test_matmul: locked test cell missing" in renamed


@pytest.mark.slow
def test_feedback_hides_hidden_tests_and_needs_no_network(hostile):
    course, _, _, _, _ = hostile
    page = (course / "feedback" / "aa_blank" / "01_matmul" / "matmul.html").read_text()
    assert "BEGIN HIDDEN TESTS" not in page and "Hidden tests: their code is not shown" in page
    assert "test_matmul_hidden" in page and "NotImplementedError" in page
    assert not re.findall(r"<(?:script|link)[^>]*(?:src|href)=[\"']https?://", page), \
        "the page loads something from the network"
    assert "window.MathJax" in page


@pytest.mark.slow
def test_the_grade_run_reports_its_throughput(hostile):
    _, _, _, run, _ = hostile
    assert run.notebooks == len(attacks.ATTACKS) + 4 and run.workers == (os.cpu_count() or 1)
    summary = run.summary()
    assert "notebooks/min" in summary and "s per notebook" in summary


# ------------------------------------------------------------------------------------------------
# A grader killed mid-run loses nothing
# ------------------------------------------------------------------------------------------------

def _graded_students(gradebook: Path) -> set[str]:
    if not gradebook.exists():
        return set()
    with contextlib.closing(sqlite3.connect(gradebook)) as db:
        try:
            return {r[0] for r in db.execute("select student_id from submitted_assignment")}
        except sqlite3.OperationalError:
            return set()


@pytest.mark.slow
def test_trusted_notebooks_can_be_graded_without_a_sandbox(tmp_path_factory):
    course = _new_course(tmp_path_factory, "trusted")
    tg._submit(course, "trusted", "01_matmul", tg._submission("01_matmul", answered=True))
    env = dict(os.environ, COURSE_BWRAP="/nonexistent/bwrap")
    command = [sys.executable, "-m", "course.grading", "grade", "--course-dir", str(course),
               "--timeout", str(CELL_TIMEOUT), "--no-feedback"]
    refused = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "bubblewrap (/nonexistent/bwrap) is not installed" in refused.stderr
    assert "--unsandboxed-trusted" in refused.stderr and not (course / "autograded").exists()
    done = subprocess.run([*command, "--unsandboxed-trusted"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING: grading WITHOUT a sandbox" in done.stdout
    with open(course / "course_grades.csv", newline="") as f:
        (row,) = csv.DictReader(f)
    assert (row["status"], row["score"]) == ("graded", "12"), row


def _scores(course: Path, student: str) -> dict:
    return tg._cell_scores(course / "gradebook.db", student, "01_matmul")


@needs_sandbox
@pytest.mark.slow
def test_a_grader_killed_mid_run_keeps_every_grade(tmp_path_factory):
    course = _new_course(tmp_path_factory, "killed")
    students = [f"s{i}" for i in range(3)]
    for student in students:
        tg._submit(course, student, "01_matmul", tg._submission("01_matmul", answered=True))
    command = [sys.executable, "-m", "course.grading", "grade", "--course-dir", str(course),
               "--timeout", str(CELL_TIMEOUT), "--workers", "1", "--no-feedback"]
    grader = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not _graded_students(course / "gradebook.db") and time.monotonic() < deadline:
        time.sleep(0.2)
    first = _graded_students(course / "gradebook.db")
    grader.send_signal(signal.SIGKILL)
    grader.wait()
    assert first and len(first) < len(students), first
    scores = {s: _scores(course, s) for s in first}
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    with open(course / "course_grades.csv", newline="") as f:
        table = {r["student_id"]: r for r in csv.DictReader(f)}
    assert set(table) == set(students)
    for student in students:
        assert float(table[student]["score"]) == 12, table[student]
        expected = "graded earlier" if student in first else "graded"
        assert table[student]["status"] == expected, (student, table[student])
    assert {s: _scores(course, s) for s in first} == scores
    # --force grades everything again, replacing (not duplicating) each submission's grades.
    grades = tg._count_grades(course / "gradebook.db")
    forced = subprocess.run([*command[:-3], "--force", "--workers", "2", "--no-feedback"],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert forced.returncode == 0, forced.stdout + forced.stderr
    with open(course / "course_grades.csv", newline="") as f:
        again = {r["student_id"]: (r["status"], r["score"]) for r in csv.DictReader(f)}
    assert again == {s: ("graded", "12") for s in students}
    assert tg._count_grades(course / "gradebook.db") == grades
    assert "notebooks/min" in forced.stdout and "s per notebook" in forced.stdout


# ------------------------------------------------------------------------------------------------
# Releasing never overwrites a learner's edits
# ------------------------------------------------------------------------------------------------

def test_release_refuses_to_overwrite_edited_exercises(tmp_path):
    from course.grading.release import BACKUP_DIR, EditedExercises
    shutil.copytree(ROOT / "solutions", tmp_path / "solutions")
    shutil.copy(ROOT / "nbgrader_config.py", tmp_path / "nbgrader_config.py")
    first = grading.release(tmp_path)
    assert grading.release(tmp_path) == first, "an untouched release is replaced silently"
    edited = tmp_path / "exercises" / "01_matmul" / "matmul.ipynb"
    nb = nbformat.read(edited, as_version=4)
    nb.cells[0].source += "\nmy notes"
    nbformat.write(nb, str(edited))
    mine = edited.read_bytes()
    with pytest.raises(EditedExercises, match=r"(?s)1 notebook.*01_matmul/matmul.ipynb.*--force"):
        grading.release(tmp_path)
    assert edited.read_bytes() == mine, "a refused release must not touch the notebook"
    grading.release(tmp_path, force=True)
    backups = list((tmp_path / BACKUP_DIR).glob("*/01_matmul/matmul.ipynb"))
    assert len(backups) == 1 and backups[0].read_bytes() == mine
    assert edited.read_bytes() != mine


def test_the_learner_edition_has_no_solutions_or_grading_data(tmp_path):
    out = tmp_path / "edition"
    done = subprocess.run([sys.executable, "-m", "course.grading", "edition", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    files = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert {"exercises/01_matmul/matmul.ipynb", "llmcore/__init__.py", "_toc.yml",
            "README.md", "nbgrader_config.py"} <= files
    assert any(f.startswith("chapters/") for f in files)
    leaked = [f for f in files if f.startswith(("solutions/", "tests/grading/", "submitted/"))
              or "test_grading" in f or f.endswith(".db")]
    assert not leaked, leaked
    for notebook in out.rglob("*.ipynb"):
        text = notebook.read_text()
        assert "BEGIN HIDDEN TESTS" not in text and "BEGIN SOLUTION" not in text, notebook
    again = subprocess.run([sys.executable, "-m", "course.grading", "edition", str(out)],
                           cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 2 and "exists and is not empty" in again.stderr


# ------------------------------------------------------------------------------------------------
# Plain nbgrader applies the same sandbox, and warns about nothing on untouched notebooks
# ------------------------------------------------------------------------------------------------

@needs_sandbox
@pytest.mark.slow
def test_plain_nbgrader_autograde_is_sandboxed_and_quiet(tmp_path_factory):
    course = _new_course(tmp_path_factory, "plain")
    tg._submit(course, "untouched", "01_matmul", tg._submission("01_matmul", answered=False))
    probe = tg._submission("01_matmul", answered=True)
    probe.cells.insert(1, nbformat.v4.new_code_cell("import os\nprint('WHERE', os.getuid(), "
                                                    "os.getcwd())"))
    tg._submit(course, "probe", "01_matmul", probe)
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    for command in (["generate_assignment", "01_matmul", "--force"],
                    ["autograde", "01_matmul"]):
        done = subprocess.run([sys.executable, "-m", "nbgrader", *command], cwd=course, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
    output = done.stdout + done.stderr
    assert "checksum" not in output.lower(), output
    printed = _printed(course / "autograded" / "probe" / "01_matmul" / "matmul.ipynb")
    assert f"WHERE {sandbox.SANDBOX_UID} {sandbox.SANDBOX_WORK}" in printed, printed
    cells = tg._cell_scores(course / "gradebook.db", "untouched", "01_matmul")
    assert "test_matmul_hidden" in cells and all(score == 0 for score, _ in cells.values())
    cells = tg._cell_scores(course / "gradebook.db", "probe", "01_matmul")
    assert all(score == top for score, top in cells.values()), cells
