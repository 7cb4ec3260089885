"""The course's executor, :class:`BoundedExecute`: nbgrader's Execute settings with the course's
limits, without nbgrader, so that the learner's check runs in the learner's install (no nbgrader
there). Each kernel runs in the course's sandbox
(:class:`course.grading.sandbox.SandboxedKernelManager`) with preloaded modules, each cell keeps
at most an output cap, each graded test cell's secret token is answered to the kernel's first
request for it on the stdin channel while the cell runs (never before: llmcheck/fresh.py), and runs
in its own copy of the learner's namespace (llmcheck/scope.py: what it imports or assigns never
replaces a learner's name), and the harness's state is asked for just after
(course/grading/integrity.py). The kernel's audit hook (llmcheck/audit.py, installed before any
cell) sends its reports as they happen; they are taken out of the output stream here and kept in
the cell's metadata, where the verdicts find them. The executor's own code binds no name in the kernel
(:data:`HARNESS`).

Its one address is ``course.grading.executor.BoundedExecute``: ``nbgrader_config.py`` names it
there (so plain ``nbgrader autograde`` uses it), and the learner's check, the solution's run
(course/grading/judging.py) and course-grade's pipeline import it from here when a notebook is
to run (importing ``course.grading`` imports no nbconvert). Nothing here or in the sandbox
imports ``resource`` at module level: the learner's check imports them on any OS, and where there
is no ``resource`` (Windows) the kernel runs without a memory limit and a warning says so.
"""

from __future__ import annotations

import asyncio
import ast
import os

from jupyter_core.utils import run_sync
from nbformat.v4 import new_output
from traitlets import Integer, List, Unicode

from llmcheck.record import (AUDIT_MIME, MAX_RECORD_CHARS, MAX_RECORDS_PER_CELL, RECORD_MIME,
                             SECRET_PROMPT)
from .cells import execute_class, is_test
from .integrity import AUDIT_METADATA, HARNESS_CHANGES, HARNESS_METADATA, MAX_AUDIT_REPORTS
from .sandbox import SandboxedKernelManager
from .secret import cell_token, run_secret


HARNESS = "(lambda: 0).__builtins__['__import__']"
"""How the executor's code reaches a harness module in the kernel without a name: a lambda's
builtins are the kernel's own (a learner's global ``__import__`` cannot stand in), and the module
comes back as a value, so nothing is bound in, or deleted from, the learner's namespace (a
learner's helper may be called ``_fresh``, ``_preloaded``, ``llmcheck``...)."""


def harness_call(module: str, function: str, *args) -> str:
    """Kernel code calling ``module.function(*args)`` (arguments as Python literals) that binds
    no name in the learner's namespace (:data:`HARNESS`)."""
    arguments = ", ".join(repr(a) for a in args)
    return f"{HARNESS}({module!r}, fromlist=[{function!r}]).{function}({arguments})\n"


def output_size(out) -> int:
    """Characters of one output (stream text, error message and traceback, or data)."""
    if out.output_type == "stream":
        return len(out.text)
    if out.output_type == "error":
        return len(out.evalue) + sum(len(line) for line in out.traceback)
    data = out.get("data", {})
    return sum(len(v) if isinstance(v, str) else len(str(v)) for v in data.values())


class BoundedExecute(execute_class()):
    """Execute, where each kernel runs in the course's sandbox (its kernel manager) with
    preloaded modules, and each cell keeps at most max_output_chars of output (an error
    and the first stderr are always kept, shortened, because they decide the cell's
    grade)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("kernel_manager_class", SandboxedKernelManager)
        super().__init__(*args, **kwargs)

    max_output_chars = Integer(
        20_000, help="Characters of output a cell keeps; the rest is dropped while the "
                     "cell runs.").tag(config=True)
    grade_secret = Unicode(
        "", help="The grade run's secret (hex; course/grading/secret.py). Each graded test "
                 "cell's kernel gets its own token from it just before the cell runs, and "
                 "every case runs again on fresh inputs drawn from it. Default: the run's "
                 "secret when nbgrader autogrades, none otherwise (the learner's check)."
    ).tag(config=True)
    preload = List(
        Unicode(), ["torch", "llmcore"],
        help="Modules imported when the kernel starts (before any cell, outside the cell "
             "timeout), so that a slow first import is never mistaken for a hung "
             "cell.").tag(config=True)

    def _kernel_code(self) -> str:
        code = ""
        for name in self.preload:
            code += f"{HARNESS}({name!r})\n"
        # always, after the preloads and before any cell: the audit hook (llmcheck/audit.py),
        # whose reports leave the kernel as they happen, and the harness's state at start,
        # which the grader compares with after every test cell (llmcheck/integrity.py)
        # first, the harness sealed: its code runs over private copies of its modules'
        # namespaces, so rebinding a module's attribute does not change what it does
        # (llmcheck/seal.py)
        code += harness_call("llmcheck.seal", "seal")
        code += harness_call("llmcheck.audit", "install")
        code += harness_call("llmcheck.fresh", "install")
        code += harness_call("llmcheck.integrity", "take_baseline")
        code += harness_call("llmcheck.cases", "install_rebinding_check")
        return code

    async def async_start_new_kernel(self, **kwargs):
        code = self._kernel_code()
        extra = [a for a in self.extra_arguments
                 if not a.startswith(("--IPKernelApp.exec_lines", "--IPKernelApp.log_level"))]
        extra.append("--IPKernelApp.log_level=ERROR")     # no start-up chatter on stderr
        if code:
            extra.append(f"--IPKernelApp.exec_lines={code}")
        self.extra_arguments = extra
        await super().async_start_new_kernel(**kwargs)

    start_new_kernel = run_sync(async_start_new_kernel)

    def _secret(self) -> str:
        if self.grade_secret:
            return self.grade_secret
        return run_secret() if os.environ.get("NBGRADER_EXECUTION") == "autograde" else ""

    def preprocess_cell(self, cell, resources, index):
        cell.metadata.pop(AUDIT_METADATA, None)
        cell, resources = self._preprocess_cell(cell, resources, index)
        if self._audit.get(index):
            cell.metadata[AUDIT_METADATA] = self._audit[index]
        return cell, resources

    def process_message(self, msg, cell, cell_index):
        """The kernel's audit reports (llmcheck/audit.py) are taken out of the stream here, before
        any output handling (a clear_output or an output widget cannot reach them), and kept for
        the cell's metadata."""
        content = msg.get("content", {})
        if msg.get("msg_type") == "display_data" and isinstance(content.get("data"), dict) \
                and AUDIT_MIME in content["data"]:
            reports = self._audit.setdefault(cell_index, [])
            if len(reports) < MAX_AUDIT_REPORTS:
                reports.append(content["data"][AUDIT_MIME])
            return None
        return super().process_message(msg, cell, cell_index)

    def _preprocess_cell(self, cell, resources, index):
        if not is_test(cell):
            return super().preprocess_cell(cell, resources, index)
        secret = self._secret()
        token = cell_token(secret, cell.metadata.nbgrader.get("grade_id", "")) if secret else None
        self._tell_kernel(harness_call("llmcheck.scope", "enter")
                          + (harness_call("llmcheck.fresh", "expect") if secret else ""))
        self._cell_token = token
        try:
            cell, resources = super().preprocess_cell(cell, resources, index)
        finally:
            self._cell_token = None
            self._tell_kernel((harness_call("llmcheck.fresh", "receive", None) if secret else "")
                              + harness_call("llmcheck.scope", "leave"))
        changes = self._tell_kernel("", ask=HARNESS_CHANGES)
        if changes:
            cell.metadata[HARNESS_METADATA] = changes
        return cell, resources

    _cell_token: str | None = None

    async def async_execute_cell(self, cell, cell_index, execution_count=None,
                                 store_history=True):
        """A test cell with a secret runs with the stdin channel open, answered by
        :meth:`_answer_stdin` while it runs."""
        token = self._cell_token
        if token is None:
            return await super().async_execute_cell(cell, cell_index, execution_count,
                                                    store_history)
        self.kc.allow_stdin = True
        answering = asyncio.ensure_future(self._answer_stdin(token, cell_index))
        try:
            return await super().async_execute_cell(cell, cell_index, execution_count,
                                                    store_history)
        finally:
            answering.cancel()
            self.kc.allow_stdin = False

    execute_cell = run_sync(async_execute_cell)

    async def _answer_stdin(self, token: str, cell_index: int) -> None:
        """Answer the cell's first request for its secret with the token, and every other input
        request with nothing; each other request is kept as an audit report (evidence for the
        instructor: llmcheck/fresh.py says why a second request means the secret was taken)."""
        given = False
        while True:
            msg = await self.kc.get_stdin_msg(timeout=None)
            if msg.get("msg_type") != "input_request":
                continue
            prompt = str(msg.get("content", {}).get("prompt", ""))
            if prompt == SECRET_PROMPT and not given:
                given = True
                self.kc.input(token)
                continue
            self.kc.input("")
            reports = self._audit.setdefault(cell_index, [])
            if len(reports) < MAX_AUDIT_REPORTS:
                reports.append({
                    "event": "a second request for the cell's secret"
                    if prompt == SECRET_PROMPT else "an input request", "detail": "",
                    "line": 0, "function": "code before or inside the cell", "source": prompt})

    def _tell_kernel(self, code: str, ask: str = ""):
        """Run ``code`` silently (no history, no pre/post-run-cell events, no outputs); with
        ``ask``, evaluate that expression afterwards and return its value (a Python
        literal), or None when the kernel could not answer."""
        async def tell():
            msg_id = self.kc.execute(code, silent=True, store_history=False,
                                     allow_stdin=False,
                                     user_expressions={"answer": ask} if ask else None)
            return await self.async_wait_for_reply(msg_id)
        try:
            reply = run_sync(tell)()
        except Exception as error:                 # noqa: BLE001 (a dead kernel: the cell fails)
            self.log.warning("the kernel did not answer the grader: %s", error)
            return None
        if not ask or reply is None:
            return None
        answer = reply.get("content", {}).get("user_expressions", {}).get("answer", {})
        try:
            return ast.literal_eval(answer.get("data", {}).get("text/plain", ""))
        except (ValueError, SyntaxError):
            return None

    def preprocess(self, nb, resources=None, km=None):
        self._kept: dict[int, int] = {}
        self._stderr_kept: set[int] = set()
        self._truncated: set[int] = set()
        self._records: dict[int, int] = {}
        self._audit: dict[int, list] = {}
        return super().preprocess(nb, resources, km)

    def output(self, outs, msg, display_id, cell_index):
        out = super().output(outs, msg, display_id, cell_index)
        if out is None:
            return None
        if RECORD_MIME in out.get("data", {}):       # verdict records: their own cap
            records = self._records.get(cell_index, 0) + 1
            self._records[cell_index] = records
            if records <= MAX_RECORDS_PER_CELL and output_size(out) <= MAX_RECORD_CHARS:
                return out
            out.data = {"text/plain": "[record dropped: too many or too large]"}
        cap = self.max_output_chars
        kept = self._kept.get(cell_index, 0)
        size = output_size(out)
        if cap < 0 or kept + size <= cap:
            self._kept[cell_index] = kept + size
            if out.get("name") == "stderr":
                self._stderr_kept.add(cell_index)
            return out
        room = max(cap - kept, 0)
        needed = (out.output_type in ("error", "execute_result")
                  or (out.output_type == "stream" and out.name == "stderr"
                      and cell_index not in self._stderr_kept))
        if out.output_type == "stream" and (room > 0 or needed):
            out.text = out.text[:max(room, 200)]
            if out.name == "stderr":
                self._stderr_kept.add(cell_index)
        elif out.output_type == "error":
            out.evalue = out.evalue[:2000]
            out.traceback = [line[:2000] for line in out.traceback[-40:]]
        elif out.output_type == "execute_result":       # a partial-credit value: keep it short
            out.data = {key: value[:2000] if isinstance(value, str) else value
                        for key, value in out.data.items()}
        elif not needed and outs and outs[-1] is out:
            outs.pop()
        self._kept[cell_index] = cap
        if cell_index not in self._truncated:
            self._truncated.add(cell_index)
            outs.append(new_output("stream", name="stdout",
                                   text=f"\n[output truncated by the grader after {cap} "
                                        "characters]\n"))
        return out
