"""nbgrader's exchange, closed where it was open: a submission only its student can change, and a
collect that refuses a submission whose files belong to someone else.

nbgrader's own exchange (``nbgrader.exchange.default``) leaves two doors open on a machine shared
by a class (its issues #978 and #1225):

- **submit** makes the student's folder in ``inbound/`` mode 0777 ("so the instructor can delete
  later") and its files 0644: any student who learns its name can read it (its submission secret
  names the student's feedback) and change the notebook in it before it is collected.
  :class:`PrivateSubmit` gives it to its student and the instructor's group alone (0750).
- **collect** takes the newest folder named ``<student>+<assignment>+<time>+<random>`` and, when
  its owner is someone else, only logs "cheating attempt?" and collects it anyway: a student who
  plants ``inbound/alice+...`` with a later time replaces alice's work. :class:`OwnerCheckedCollect`
  refuses such a folder before the newest is chosen (an error in the log, which the formgrader
  shows), so the student's own newest submission is collected; the collected copy is closed to
  everyone but the instructor (folders 0700, files 0600; with nbgrader's ``groupshared``, the
  instructors' group keeps its access).

Who owns a file is its owner's user name (``pwd``); where the students' servers run under uids
that the instructor's machine does not name (Kubernetes), a roster file maps each student to
their uid (``OwnerCheckedCollect.uid_roster``: JSON ``{"uids": {"alice": 2001}}``, the roster of
``deploy/zero-to-jupyterhub/config.yaml``).

:data:`EXCHANGE_CLASSES` names both for nbgrader's ``ExchangeFactory``: ``nbgrader_config.py`` (the
instructor's commands) and the hub's global configuration (the students' servers) set them.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import pwd
from pathlib import Path

from nbgrader.exchange.default.collect import ExchangeCollect, groupby
from nbgrader.exchange.default.submit import ExchangeSubmit
from traitlets import Unicode

SUBMISSION_FOLDER_MODE, SUBMISSION_FILE_MODE = 0o750, 0o644
"""A submission in ``inbound/``: its student writes it; its folder takes the group of
``inbound/`` (the instructor's: nbgrader's release makes ``inbound/`` setgid) and only that group
may enter it, so nobody else reads a file in it, name known or not. (Its files keep nbgrader's
mode: the student, who is not in the instructor's group, cannot give them that group, and the
folder is the gate.)"""
COLLECTED_FOLDER_MODE, COLLECTED_FILE_MODE = 0o700, 0o600
GROUPSHARED_FOLDER_MODE, GROUPSHARED_FILE_MODE = 0o2770, 0o660

EXCHANGE_CLASSES = {
    "submit": "course.grading.exchange.PrivateSubmit",
    "collect": "course.grading.exchange.OwnerCheckedCollect",
}
"""nbgrader's ``ExchangeFactory`` settings this module replaces."""


def close_permissions(folder: str | os.PathLike, *, groupshared: bool = False) -> None:
    """Make ``folder`` and everything in it its owner's alone (or its owner's and group's, for
    nbgrader's ``groupshared`` courses). Links are left as they are, never followed."""
    folder_mode, file_mode = ((GROUPSHARED_FOLDER_MODE, GROUPSHARED_FILE_MODE) if groupshared
                              else (COLLECTED_FOLDER_MODE, COLLECTED_FILE_MODE))
    for parent, dirs, files in os.walk(folder):
        for name in files:
            path = os.path.join(parent, name)
            if not os.path.islink(path):
                os.chmod(path, file_mode)
        os.chmod(parent, folder_mode)


class PrivateSubmit(ExchangeSubmit):
    """nbgrader's submit, with the submission its student's and the instructor's group's alone."""

    def copy_files(self):
        super().copy_files()
        folder = os.path.join(self.inbound_path, self.assignment_filename)
        self.set_perms(folder, fileperms=SUBMISSION_FILE_MODE, dirperms=SUBMISSION_FOLDER_MODE)


class OwnerCheckedCollect(ExchangeCollect):
    """nbgrader's collect, refusing every submission not owned by the student it names (while
    ``check_owner`` is on, nbgrader's default), and closing what it collects."""

    uid_roster = Unicode(
        "", help="A JSON file {'uids': {student: uid}} naming the owner of each uid, for servers "
                 "whose users this machine's accounts do not name (empty: its accounts)."
    ).tag(config=True)

    refused: list[str]

    def owner_of(self, path: str) -> str:
        """The user name owning ``path`` (not following a link), or ``uid <n>`` if unknown."""
        uid = os.lstat(path).st_uid
        if self.uid_roster:
            names = self._roster_names().get(uid, [])
            return names[0] if len(names) == 1 else f"uid {uid}"
        try:
            return pwd.getpwuid(uid).pw_name
        except KeyError:
            return f"uid {uid}"

    @functools.cache
    def _roster_names(self) -> dict[int, list[str]]:
        """The roster read once per collect: each uid and the names it is given."""
        roster = json.loads(Path(self.uid_roster).read_text(encoding="utf-8"))["uids"]
        names: dict[int, list[str]] = {}
        for name, uid in roster.items():
            names.setdefault(int(uid), []).append(name)
        return names

    def refusal(self, record: dict) -> str | None:
        """Why the submission ``record`` may not be collected (None if it may)."""
        path = os.path.join(self.inbound_path, record["filename"])
        if os.path.islink(path) or not os.path.isdir(path):
            return f"{path} is not a folder (a link or a file)"
        if not self.check_owner:
            return None
        owner = self.owner_of(path)
        if owner != record["username"]:
            return (f"{path} claims to be {record['username']}'s submission but belongs to "
                    f"{owner}")
        return None

    def init_src(self):
        """nbgrader's choice of one submission per student (the newest; with ``before_duedate``,
        the newest on time), made among the submissions that pass :meth:`refusal` only."""
        super().init_src()
        student = self.coursedir.student_id or "*"
        pattern = os.path.join(self.inbound_path, f"{student}+{self.coursedir.assignment_id}+*")
        candidates = [self._path_to_record(path) for path in glob.glob(pattern)]
        self.refused = []
        kept = []
        for record in candidates:
            reason = self.refusal(record)
            if reason:
                self.refused.append(reason)
                self.log.error("Refused: %s; it is not collected.", reason)
            else:
                kept.append(record)
        self.src_records = [self._chosen(records) for records in
                            groupby(kept, lambda item: item["username"]).values()]

    def _chosen(self, records: list[dict]) -> dict:
        ordered = self._sort_by_timestamp(records)
        if self.duedate is None or not self.before_duedate:
            return ordered[0]
        on_time = [r for r in ordered if r["timestamp"] <= self.duedate]
        return (on_time or ordered)[0]

    def do_copy(self, src, dest, log=None):
        super().do_copy(src, dest, log)
        close_permissions(dest, groupshared=self.coursedir.groupshared)
        folder_mode = (GROUPSHARED_FOLDER_MODE if self.coursedir.groupshared
                       else COLLECTED_FOLDER_MODE)
        for parent in (Path(dest).parent, Path(dest).parent.parent):   # <student>, submitted
            if parent.stat().st_uid == os.getuid():
                parent.chmod(folder_mode)
