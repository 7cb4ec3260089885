"""The harness binds no name in the learner's namespace (issue 31, item 4): the executor's own
code reaches its modules without a name, and a graded test cell runs in a copy of the learner's
namespace (llmcheck/scope.py), so a learner's ``_fresh``, ``_token``, ``Test``, ``llmcheck`` or
``check`` is the one their functions call while the test cell runs. Run in a child process with a
real IPython shell (the kernel's), as the executor drives it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from course.grading.executor import HARNESS, harness_call
from course.grading.integrity import HARNESS_CHANGES

LEARNER = '''
def _fresh():
    return "learner's _fresh"
_token = "learner's _token"
class Test:
    kind = "learner's Test"
llmcheck = {"calls": 0}
def check():
    return "learner's check"
def answer():
    llmcheck["calls"] += 1
    return _fresh(), _token, Test.kind, check()
'''

TEST_CELL = '''
import llmcheck.fresh
from llmcheck.cases import Test
check = _fresh = _token = "the test cell's"
got = answer()
assert got == ("learner's _fresh", "learner's _token", "learner's Test", "learner's check"), got
assert Test.__module__ == "llmcheck.cases" and llmcheck.fresh.active()
'''

ENTER = (harness_call("llmcheck.scope", "enter")
         + harness_call("llmcheck.fresh", "receive", "ab" * 32))
CHILD = f'''
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
def run(code, silent=False):
    result = shell.run_cell(code, silent=silent, store_history=False)
    assert result.success, (code, result.error_before_exec, result.error_in_exec)
run({LEARNER!r})
run("__import__ = None")               # a learner's global cannot stand in for the builtin
names = set(shell.user_ns)
run({ENTER!r}, silent=True)
run({TEST_CELL!r})
run({harness_call("llmcheck.fresh", "receive", None) + harness_call("llmcheck.scope", "leave")!r},
    silent=True)
changes = shell.ev({HARNESS_CHANGES!r})
ns = shell.user_ns
assert ns["_fresh"]() == "learner's _fresh" and ns["_token"] == "learner's _token", ns["_token"]
assert ns["Test"].kind == "learner's Test" and ns["check"]() == "learner's check"
assert ns["llmcheck"] == {{"calls": 1}}, ns["llmcheck"]
assert set(ns) - names == {{"got"}}, set(ns) - names       # the cell's new name, copied back
assert isinstance(changes, list), changes
print("ok")
'''


def test_the_executor_code_names_nothing_of_the_learner():
    code = harness_call("llmcheck.fresh", "receive", None)
    assert "_fresh" not in HARNESS and "import " not in code and " as " not in code
    assert harness_call("m", "f", "ab", None) == f"{HARNESS}('m', fromlist=['f']).f('ab', None)\n"


def test_a_learner_s_reserved_looking_names_survive_a_test_cell():
    child = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD)], capture_output=True,
                           text=True, timeout=300)
    assert child.returncode == 0 and child.stdout.strip().endswith("ok"), child.stderr[-3000:]
