"""nbgrader's exchange workflow end to end, with nbgrader's own commands, as a class on a shared
machine or a JupyterHub runs it (README, "Teaching a class on JupyterHub"):

    instructor  generate_assignment -> release_assignment
    students    fetch_assignment -> (answer) -> submit
    instructor  collect -> autograde -> generate_feedback -> release_feedback
    students    fetch_feedback

Everything happens in temporary folders: an exchange directory, the instructor's course folder
(a copy of solutions/ only) and one home and working folder per student. nbgrader knows a student
by the OS user that runs the command, or, when that user is ``jovyan`` (the one user of every
single-user container that a JupyterHub with the Docker or Kubernetes spawner starts), by
``$JUPYTERHUB_USER``. This machine has one OS user, so each student's commands run as in such a
container: a ``sitecustomize`` shim makes the OS report the current user as ``jovyan`` (only to
the student's process), and ``JUPYTERHUB_USER`` names the student. The instructor's commands read the course's own
nbgrader_config.py (course id, limits, and whatever kernel sandbox it configures for autograde);
only the course root and the exchange are set on the command line. The students' commands get the
course id and the exchange on their command line, as a hub's global nbgrader_config.py gives them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest

from course.site import ROOT, tool, tool_env

pytestmark = pytest.mark.slow

ASSIGNMENT = "01_matmul"
NOTEBOOK = "matmul"
COURSE_ID = "algebra-of-llms"
STUDENTS = {"alice": "answered", "bob": "untouched"}
COMMAND_TIMEOUT_S = 600


def course_id_of_config() -> str:
    """The course id nbgrader_config.py sets (the exchange is organised by it)."""
    from traitlets.config.loader import PyFileConfigLoader
    config = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()
    return config.CourseDirectory.course_id


CONTAINER_USER_SHIM = """\
# A JupyterHub single-user container runs every student as the OS user jovyan; nbgrader then takes
# the student's name from JUPYTERHUB_USER. Test shim: this process's own user reads as jovyan.
import os, pwd
_getpwuid, _uid = pwd.getpwuid, os.getuid()
def getpwuid(uid):
    entry = _getpwuid(uid)
    return pwd.struct_passwd(("jovyan", *tuple(entry)[1:])) if uid == _uid else entry
pwd.getpwuid = getpwuid
"""


class Nbgrader:
    """Runs ``nbgrader`` as one user: their home, working folder, user name and Jupyter
    configuration folder, nothing shared with the test's own environment."""

    def __init__(self, base: Path, user: str, workdir: Path, *options: str,
                 container: bool = False):
        self.user, self.workdir, self.options = user, workdir, options
        self.home = base / "homes" / user
        for folder in (self.home / ".jupyter", workdir):
            folder.mkdir(parents=True, exist_ok=True)
        self.path = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        self.env = {"HOME": str(self.home), "JUPYTER_CONFIG_DIR": str(self.home / ".jupyter"),
                    "JUPYTER_DATA_DIR": str(self.home / ".local" / "share" / "jupyter")}
        if container:
            shim = base / "container-user" / user
            shim.mkdir(parents=True)
            (shim / "sitecustomize.py").write_text(CONTAINER_USER_SHIM, encoding="utf-8")
            self.path.insert(0, str(shim))
            self.env["JUPYTERHUB_USER"] = user

    def __call__(self, command: str, *args: str) -> str:
        from nbgrader.apps.nbgraderapp import NbGraderApp
        # an unknown subcommand prints nbgrader's help and exits 0: it must not pass for a step
        assert command in NbGraderApp.subcommands, f"nbgrader has no command {command!r}"
        env = {**tool_env(), **self.env, "PYTHONPATH": os.pathsep.join(self.path)}
        done = subprocess.run([tool("nbgrader"), command, *args, *self.options], cwd=self.workdir,
                              env=env, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=COMMAND_TIMEOUT_S)
        assert done.returncode == 0, f"{self.user}: nbgrader {command} failed:\n{done.stdout}"
        return done.stdout


def answer(path: Path) -> None:
    """Fill every answer cell of a fetched notebook with the solution's code."""
    solution = nbformat.read(ROOT / "solutions" / ASSIGNMENT / f"{NOTEBOOK}.ipynb", as_version=4)
    answers = {c.metadata["nbgrader"]["grade_id"]: c.source for c in solution.cells
               if c.metadata.get("nbgrader", {}).get("solution")}
    notebook = nbformat.read(path, as_version=4)
    filled = 0
    for cell in notebook.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell.source = "\n".join(line for line in answers[grade_id].splitlines()
                                    if line.strip() not in ("### BEGIN SOLUTION",
                                                            "### END SOLUTION"))
            filled += 1
    assert filled, f"{path}: no answer cells to fill"
    # where the kernel runs, printed for test_autograde_runs_in_the_sandbox
    notebook.cells.insert(1, nbformat.v4.new_code_cell(
        "import os\nprint('WHERE', os.getuid(), os.getcwd())"))
    nbformat.write(notebook, path)


@pytest.fixture(scope="module")
def semester(tmp_path_factory):
    """Run the whole exchange workflow once; returns the folders and the commands' output."""
    assert course_id_of_config() == COURSE_ID, "the exchange test expects the course's id"
    base = tmp_path_factory.mktemp("exchange-workflow")
    exchange = base / "exchange"
    exchange.mkdir()
    exchange.chmod(0o777)            # every user writes into it (nbgrader checks the mode)
    course = base / "course"
    shutil.copytree(ROOT / "solutions" / ASSIGNMENT, course / "solutions" / ASSIGNMENT)
    instructor = Nbgrader(base, "instructor", course,
                          f"--NbGrader.config_file={ROOT / 'nbgrader_config'}",
                          f"--CourseDirectory.root={course}", f"--Exchange.root={exchange}",
                          # one OS user submits for everyone here, as in hub containers: nbgrader
                          # would warn that each submission's files are not the student's own
                          "--CollectApp.check_owner=False")
    students = {name: Nbgrader(base, name, base / "work" / name,
                               f"--CourseDirectory.course_id={COURSE_ID}",
                               f"--Exchange.root={exchange}", container=True)
                for name in STUDENTS}
    log = {}
    log["generate"] = instructor("generate_assignment", ASSIGNMENT)
    log["release"] = instructor("release_assignment", ASSIGNMENT)
    for name, student in students.items():
        log[f"list {name}"] = student("list")
        student("fetch_assignment", ASSIGNMENT)
        if STUDENTS[name] == "answered":
            answer(student.workdir / ASSIGNMENT / f"{NOTEBOOK}.ipynb")
        log[f"submit {name}"] = student("submit", ASSIGNMENT)
    log["collect"] = instructor("collect", ASSIGNMENT)
    log["autograde"] = instructor("autograde", ASSIGNMENT)
    log["generate_feedback"] = instructor("generate_feedback", ASSIGNMENT)
    log["release_feedback"] = instructor("release_feedback", ASSIGNMENT)
    for name, student in students.items():
        log[f"fetch_feedback {name}"] = student("fetch_feedback", ASSIGNMENT)
    return {"course": course, "exchange": exchange, "students": students, "log": log}


def test_release_reaches_every_student(semester):
    outbound = semester["exchange"] / COURSE_ID / "outbound" / ASSIGNMENT / f"{NOTEBOOK}.ipynb"
    assert outbound.is_file()
    released = nbformat.read(outbound, as_version=4)
    assert not any("### BEGIN SOLUTION" in c.source for c in released.cells), \
        "the released notebook still holds a solution"
    for name, student in semester["students"].items():
        assert f"{COURSE_ID} {ASSIGNMENT}" in semester["log"][f"list {name}"]
        assert (student.workdir / ASSIGNMENT / f"{NOTEBOOK}.ipynb").is_file(), name


def test_each_submission_is_collected_under_its_student(semester):
    inbound = sorted(p.name.split("+")[0] for p in
                     (semester["exchange"] / COURSE_ID / "inbound").iterdir())
    assert inbound == sorted(STUDENTS)
    for name in STUDENTS:
        collected = semester["course"] / "submitted" / name / ASSIGNMENT / f"{NOTEBOOK}.ipynb"
        assert collected.is_file(), f"collect did not bring back {name}'s notebook"


def test_autograde_scores_the_answered_notebook_full_and_the_untouched_one_zero(semester):
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{semester['course'] / 'gradebook.db'}", COURSE_ID) as gradebook:
        scores = {name: gradebook.find_submission(ASSIGNMENT, name) for name in STUDENTS}
        result = {name: (s.score, s.max_score) for name, s in scores.items()}
    max_score = result["alice"][1]
    assert max_score > 0
    assert result == {"alice": (max_score, max_score), "bob": (0, max_score)}, result


def test_autograde_runs_in_the_sandbox(semester):
    """Plain ``nbgrader autograde`` with the course's config runs each kernel in the sandbox."""
    from course.grading import sandbox

    autograded = semester["course"] / "autograded" / "alice" / ASSIGNMENT / f"{NOTEBOOK}.ipynb"
    cells = nbformat.read(autograded, as_version=4).cells
    printed = "".join(output.get("text", "") for cell in cells
                      for output in cell.get("outputs", []))
    assert f"WHERE {sandbox.SANDBOX_UID} {sandbox.SANDBOX_WORK}" in printed, printed


def test_feedback_goes_back_to_each_student_alone(semester):
    for name, student in semester["students"].items():
        pages = list((student.workdir / ASSIGNMENT / "feedback").glob(f"*/{NOTEBOOK}.html"))
        assert len(pages) == 1, f"{name} fetched {pages}"
        page = pages[0].read_text(encoding="utf-8")
        other = next(n for n in STUDENTS if n != name)
        assert "Score" in page
        assert other not in page, f"{name}'s feedback mentions {other}"
