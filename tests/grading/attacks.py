"""Hostile submissions the grader must survive, as test data (beside mutants.py).

Each is a released notebook (exercises/) with every answer filled in from solutions/
(``answered``), a code cell of attack code added before the first answer cell, and optionally
test cells renamed or deleted. tests/test_grading_sandbox.py grades them in ONE run together
with honest students before and after them, then checks that honest students keep their exact
scores, that no attack scores above its honest work, that the course directory is unchanged
except for the grader's outputs, and that every failure's reason is in the CSV.

Attack code is a template: ``{course}`` is the course directory (an attacker who knows every
path), ``{token}`` a word unique to the test run (to find a surviving process), and
``{grader_pid}`` the grading process's pid. Each probe prints ``ATTACK <name> SUCCEEDED`` when it
got through and ``ATTACK <name> BLOCKED ...`` when it did not; honest work continues after it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Attack:
    student: str
    why: str
    code: str
    max_score: float                  # at most what its honest work earns
    reason: str | None = None         # a word the CSV's status or reasons must hold
    fails: bool = False               # the notebook cannot be run to the end (status failed:)
    answered: bool = True
    rename: dict = field(default_factory=dict)     # grade_id -> new grade_id
    delete: tuple = ()                             # grade_ids of cells removed
    assignment: str = "01_matmul"


PROBE = '''
def _attack(name, action):
    try:
        action()
    except BaseException as error:
        print("ATTACK", name, "BLOCKED", type(error).__name__)
    else:
        print("ATTACK", name, "SUCCEEDED")
'''

HONEST = 12.0            # 01_matmul's full marks


ATTACKS = [
    Attack(
        "reads_course", "reads the solutions, the gradebook, nbgrader's config, another "
        "student's submission and the release's hidden material",
        PROBE + '''
_attack("read_solutions", lambda: open("{course}/solutions/01_matmul/matmul.ipynb").read())
_attack("read_gradebook", lambda: open("{course}/gradebook.db", "rb").read())
_attack("read_config", lambda: open("{course}/nbgrader_config.py").read())
_attack("read_other", lambda: open("{course}/submitted/aa_honest/01_matmul/matmul.ipynb").read())
_attack("list_course", lambda: __import__("os").listdir("{course}"))
''', HONEST),
    Attack(
        "writes_course", "rewrites the gradebook (sqlite), another student's submission and the "
        "hidden tests in solutions/, and drops a file in the course",
        PROBE + '''
import sqlite3
def _zero_everyone():
    db = sqlite3.connect("{course}/gradebook.db")
    db.execute("update grade set auto_score = 0")
    db.commit()
_attack("write_gradebook", _zero_everyone)
_attack("write_other", lambda: open("{course}/submitted/aa_honest/01_matmul/matmul.ipynb", "w").write("{{}}"))
_attack("write_solutions", lambda: open("{course}/solutions/01_matmul/matmul.ipynb", "w").write("{{}}"))
_attack("write_course", lambda: open("{course}/planted.txt", "w").write("x"))
_attack("write_submitted", lambda: open("{course}/submitted/zz_honest/01_matmul/extra.txt", "w").write("x"))
''', HONEST),
    Attack(
        "plants_startup", "plants code for later kernels: an IPython startup file, a "
        "sitecustomize.py and a .pth file in site-packages, a usercustomize in ~/.local",
        PROBE + '''
import os, site, sysconfig
PAYLOAD = "print('ATTACK planted_code SUCCEEDED')\\n"
def _startup():
    folder = os.path.expanduser("~/.ipython/profile_default/startup")
    os.makedirs(folder, exist_ok=True)
    open(os.path.join(folder, "00-planted.py"), "w").write(PAYLOAD)
    raise RuntimeError("written, but only to this kernel's private home")
_attack("ipython_startup", _startup)
_attack("sitecustomize", lambda: open(os.path.join(sysconfig.get_paths()["purelib"], "sitecustomize.py"), "w").write(PAYLOAD))
_attack("pth_file", lambda: open(os.path.join(sysconfig.get_paths()["purelib"], "zz_planted.pth"), "w").write("import os; " + PAYLOAD))
_attack("llmcore", lambda: open(os.path.join(os.path.dirname(__import__("llmcore").__file__), "__init__.py"), "a").write(PAYLOAD))
def _user():
    folder = site.getusersitepackages()
    os.makedirs(folder, exist_ok=True)
    open(os.path.join(folder, "usercustomize.py"), "w").write(PAYLOAD)
    raise RuntimeError("written, but only to this kernel's private home")
_attack("usercustomize", _user)
''', HONEST),
    Attack(
        "leaves_daemon", "double-forks a daemon that sleeps past its kernel and then writes "
        "into the course",
        '''
import os, subprocess, sys
code = "import time, sys; time.sleep(20); open('{course}/daemon_was_here', 'w').write('x')"
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", code, "{token}"])
    os._exit(0)
print("daemon started")
''', HONEST),
    Attack(
        "kills_grader", "signals its parent, the grader's pid and every other process it can "
        "(os.kill(-1)): only its own sandbox's processes are in reach",
        PROBE + '''
import os, signal, time
def _kill_parent():
    parent = os.getppid()
    os.kill(parent, signal.SIGKILL)
    time.sleep(0.5)
    try:
        os.kill(parent, 0)
    except ProcessLookupError:
        return                      # the parent is gone
    raise PermissionError(f"pid {{parent}} (its parent, the sandbox's init) survived SIGKILL")
_attack("kill_parent", _kill_parent)
_attack("kill_grader", lambda: os.kill({grader_pid}, signal.SIGKILL))
os.kill(-1, signal.SIGKILL)
''', HONEST),
    Attack(
        "kills_everything", "runs kill -9 -1, which kills every process it may signal: here "
        "only its own kernel, so the notebook stops and scores 0; the grader goes on",
        '''
import subprocess
subprocess.run(["kill", "-9", "-1"])
''', 0.0, reason="kernel died", fails=True),
    Attack(
        "uses_network", "opens a TCP connection (a package index) and resolves a name",
        PROBE + '''
import socket
_attack("tcp", lambda: socket.create_connection(("151.101.0.223", 443), timeout=3))
_attack("dns", lambda: socket.getaddrinfo("pypi.org", 443))
''', HONEST),
    Attack(
        "ignores_sigint", "a loop that ignores SIGINT: the per-cell interrupt cannot stop it, "
        "the notebook's wall clock kills the whole sandbox",
        '''
import signal
signal.signal(signal.SIGINT, signal.SIG_IGN)
while True:
    pass
''', 0.0, reason="timeout", fails=True),
    Attack(
        "hoards_memory", "reserves NumPy arrays until memory runs out before any answer (empty "
        "arrays: the cap counts reserved memory, so it is reached in a moment even on a busy "
        "machine, well inside the cell timeout)",
        '''
import numpy as np
hoard = []
while True:
    hoard.append(np.empty(2**25))
''', HONEST, reason="memory cap"),
    Attack(
        "floods_output", "prints megabytes before its answers",
        '''
for _ in range(50):
    print("z" * 100_000)
''', HONEST, reason="output cap"),
    Attack(
        "renames_tests", "renames a test cell's grade_id and deletes another test cell: graded "
        "against the instructor's cells",
        "print('no attack code, only renamed and deleted test cells')\n", HONEST,
        reason="renamed", rename={"test_dot": "test_dot_mine"}, delete=("test_matmul",)),
]
