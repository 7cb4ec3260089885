"""The course's exchange classes (course/grading/exchange.py) in seconds, on a scratch exchange:
collect refuses a submission that is not its student's and collects the student's own instead,
and closes what it collects; submit leaves a folder only its student writes. The whole class on
a real hub, with real users attacking it, is tests/test_hub.py."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

pytest.importorskip("nbgrader")
from nbgrader.auth import Authenticator  # noqa: E402
from nbgrader.coursedir import CourseDirectory  # noqa: E402

from course.grading.exchange import (  # noqa: E402
    COLLECTED_FILE_MODE, COLLECTED_FOLDER_MODE, EXCHANGE_CLASSES, SUBMISSION_FILE_MODE,
    SUBMISSION_FOLDER_MODE,
    OwnerCheckedCollect, PrivateSubmit)

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="nbgrader's exchange is POSIX")

COURSE, ASSIGNMENT = "course101", "a1"
STRANGER_UID = 54321
"""A uid no account has: a planted folder's owner (chown needs root)."""


def me() -> str:
    import pwd
    return pwd.getpwuid(os.getuid()).pw_name


def submission(inbound: Path, student: str, when: str, text: str, uid: int | None = None) -> Path:
    """A folder in inbound/ as nbgrader's submit names it, holding one notebook."""
    folder = inbound / f"{student}+{ASSIGNMENT}+{when}+{os.urandom(4).hex()}"
    folder.mkdir(parents=True)
    (folder / "work.ipynb").write_text(text, encoding="utf-8")
    (folder / "timestamp.txt").write_text(when, encoding="utf-8")
    if uid is not None:
        for path in (folder / "work.ipynb", folder / "timestamp.txt", folder):
            os.chown(path, uid, -1)
    return folder


def collect(tmp_path: Path, **options) -> OwnerCheckedCollect:
    coursedir = CourseDirectory(root=str(tmp_path / "course"), course_id=COURSE,
                                assignment_id=ASSIGNMENT)
    app = OwnerCheckedCollect(coursedir=coursedir, authenticator=Authenticator(),
                              root=str(tmp_path / "exchange"), **options)
    app.start()
    return app


@pytest.fixture
def inbound(tmp_path) -> Path:
    folder = tmp_path / "exchange" / COURSE / "inbound"
    folder.mkdir(parents=True)
    (tmp_path / "course").mkdir()
    return folder


def collected_text(tmp_path: Path, student: str) -> str:
    return (tmp_path / "course" / "submitted" / student / ASSIGNMENT / "work.ipynb").read_text()


@pytest.mark.skipif(os.geteuid() != 0, reason="planting a folder owned by another uid needs root")
def test_collect_refuses_a_forged_newer_submission_and_keeps_the_students_own(tmp_path, inbound):
    student = me()
    submission(inbound, student, "2026-01-01 10:00:00.000000 UTC", "honest")
    forged = submission(inbound, student, "2026-01-01 11:00:00.000000 UTC", "forged",
                        uid=STRANGER_UID)
    app = collect(tmp_path)
    assert collected_text(tmp_path, student) == "honest"
    assert len(app.refused) == 1 and str(forged) in app.refused[0]
    assert f"belongs to uid {STRANGER_UID}" in app.refused[0]


@pytest.mark.skipif(os.geteuid() != 0, reason="planting a folder owned by another uid needs root")
def test_collect_refuses_a_forged_only_submission(tmp_path, inbound):
    submission(inbound, me(), "2026-01-01 11:00:00.000000 UTC", "forged", uid=STRANGER_UID)
    app = collect(tmp_path)
    assert app.refused and not (tmp_path / "course" / "submitted").exists()


def test_collect_refuses_a_link_in_place_of_a_submission(tmp_path, inbound):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "work.ipynb").write_text("linked")
    (inbound / f"{me()}+{ASSIGNMENT}+2026-01-01 10:00:00.000000 UTC+ab12").symlink_to(elsewhere)
    app = collect(tmp_path)
    assert app.refused and "not a folder" in app.refused[0]
    assert not (tmp_path / "course" / "submitted").exists()


def test_collect_closes_what_it_collects(tmp_path, inbound):
    folder = submission(inbound, me(), "2026-01-01 10:00:00.000000 UTC", "honest")
    for path in (folder, *folder.iterdir()):
        path.chmod(0o777)                           # as nbgrader's submit leaves its folder
    app = collect(tmp_path)
    assert app.refused == []
    target = tmp_path / "course" / "submitted" / me() / ASSIGNMENT
    for folder in (target, target.parent, target.parent.parent):
        assert stat.S_IMODE(folder.stat().st_mode) == COLLECTED_FOLDER_MODE, folder
    assert stat.S_IMODE((target / "work.ipynb").stat().st_mode) == COLLECTED_FILE_MODE


@pytest.mark.skipif(os.geteuid() != 0, reason="a submission owned by another uid needs root")
def test_collect_names_owners_from_a_roster(tmp_path, inbound):
    """Servers whose uids the machine does not name (Kubernetes): the roster says whose is whose."""
    roster = tmp_path / "uids.json"
    roster.write_text(json.dumps({"uids": {"alice": STRANGER_UID, "bob": STRANGER_UID + 1}}))
    submission(inbound, "alice", "2026-01-01 10:00:00.000000 UTC", "alice's", uid=STRANGER_UID)
    submission(inbound, "alice", "2026-01-01 11:00:00.000000 UTC", "bob's", uid=STRANGER_UID + 1)
    app = collect(tmp_path, uid_roster=str(roster))
    assert collected_text(tmp_path, "alice") == "alice's"
    assert len(app.refused) == 1 and "belongs to bob" in app.refused[0]


@pytest.mark.skipif(os.geteuid() != 0, reason="planting a folder owned by another uid needs root")
def test_collect_without_the_owner_check_takes_the_newest(tmp_path, inbound):
    """One shared uid (every student jovyan): check_owner off, nbgrader's choice as before."""
    submission(inbound, me(), "2026-01-01 10:00:00.000000 UTC", "older")
    submission(inbound, me(), "2026-01-01 11:00:00.000000 UTC", "newer", uid=STRANGER_UID)
    app = collect(tmp_path, check_owner=False)
    assert app.refused == [] and collected_text(tmp_path, me()) == "newer"


def test_submit_leaves_a_folder_only_its_student_writes(tmp_path, monkeypatch):
    """nbgrader's submit makes the folder 0777; the course's makes it its student's alone."""
    release = tmp_path / "exchange" / COURSE / "outbound" / ASSIGNMENT
    release.mkdir(parents=True)
    (release / "work.ipynb").write_text("{}")
    (tmp_path / "exchange" / COURSE / "inbound").mkdir()
    work = tmp_path / "student"
    (work / ASSIGNMENT).mkdir(parents=True)
    (work / ASSIGNMENT / "work.ipynb").write_text("{}")
    monkeypatch.chdir(work)
    coursedir = CourseDirectory(root=str(work), course_id=COURSE, assignment_id=ASSIGNMENT)
    app = PrivateSubmit(coursedir=coursedir, authenticator=Authenticator(),
                        root=str(tmp_path / "exchange"), cache=str(tmp_path / "cache"))
    app.start()
    made = list((tmp_path / "exchange" / COURSE / "inbound").iterdir())
    assert len(made) == 1
    assert stat.S_IMODE(made[0].stat().st_mode) == SUBMISSION_FOLDER_MODE == 0o750
    for path in made[0].iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == SUBMISSION_FILE_MODE == 0o644, path


def test_the_course_config_uses_the_course_exchange():
    from traitlets.config.loader import PyFileConfigLoader
    from course.site import ROOT
    config = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()
    for action, name in EXCHANGE_CLASSES.items():
        assert config.ExchangeFactory[action] == name
