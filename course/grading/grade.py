"""The course's nbgrader front end, and the helpers the exercises' test cells use.

Commands (run from the repository root; ``make exercises``, ``make check NB=...``, ``make grade``)::

    python -m llmcore.grading release           solutions/ -> exercises/ (the student notebooks)
    python -m llmcore.grading check NOTEBOOK    run one notebook in a fresh kernel, print each
                                                visible test's result and the points so far;
                                                exit status 1 if anything fails
    python -m llmcore.grading grade             grade submitted/<student>/<assignment>/*.ipynb:
                                                gradebook.db, feedback/ (HTML) and grades.csv

Every notebook runs in a kernel with a cell timeout (``c.Execute.timeout`` in nbgrader_config.py),
a memory limit (``c.BoundedExecute.memory_limit_mb``) and a cap on the output each cell may keep
(``c.BoundedExecute.max_output_chars``), so a submission that loops forever, allocates without
bound or prints megabytes is graded (low) and the run goes on to the next student.

Test cells use :func:`forbid` (calls to a library's own implementation of what the exercise asks
for fail inside it) and :func:`watch_torch_calls` (which torch operations a function ran: one
matrix product for all tokens, not one per token). Importing this module does not import nbgrader;
only the three commands do.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import html
import inspect
import logging
import math
import os
import re
import shutil
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch
from torch.overrides import TorchFunctionMode

# ------------------------------------------------------------------------------------------------
# Test-cell helpers: forbidden calls and a log of torch calls
# ------------------------------------------------------------------------------------------------

PRODUCTS = (
    "torch.matmul", "torch.mm", "torch.bmm", "torch.mv", "torch.dot", "torch.vdot", "torch.inner",
    "torch.einsum", "torch.tensordot", "torch.addmm", "torch.addmv", "torch.addbmm",
    "torch.baddbmm", "torch.linear", "torch.bilinear", "torch.chain_matmul", "torch.multi_dot",
    "torch.vecdot", "torch.__matmul__", "torch.__rmatmul__", "torch.__imatmul__",
    "numpy.dot", "numpy.matmul", "numpy.inner", "numpy.vdot", "numpy.einsum", "numpy.tensordot",
    "numpy.linalg.multi_dot",
    "llmcore.dot", "llmcore.matmul", "llmcore.linear",
)
"""Every way to have a library multiply vectors or matrices for you: torch's products (``@``
included), NumPy's, and llmcore's own dot/matmul/linear functions. For exercises that ask for
the product written out as loops."""

SOFTMAXES = (
    "torch.softmax", "torch.log_softmax", "torch._softmax", "torch._log_softmax",
    "torch.special_softmax", "torch.special_log_softmax", "torch.gumbel_softmax",
    "llmcore.softmax",
)
"""torch's softmax in all its spellings (torch.softmax, F.softmax, Tensor.softmax, nn.Softmax,
log-softmax) and every llmcore function with softmax in its name."""

ATTENTIONS = (
    "torch.scaled_dot_product_attention", "torch.multi_head_attention_forward",
    "llmcore.attention",
)
"""torch's fused attention, nn.MultiheadAttention, and every llmcore function with attention in
its name (attention, attention_loop, multihead_attention, ...)."""

_PRODUCT_OPS = frozenset(name.split(".", 1)[1] for name in PRODUCTS if name.startswith("torch."))

_EXEMPT_MODULES = ("llmcore.grading", "llmcore.testing")
"""llmcore modules whose functions a test may always call (they compare, they compute nothing)."""


class NotAllowedError(AssertionError):
    """A function under test called a library's own implementation of what it should compute."""


def _torch_op_name(func) -> str:
    return getattr(func, "__name__", "") or ""


def _is_library_name(module: str, name: str, words: Sequence[str]) -> bool:
    """An llmcore function named with one of the words; private helpers and argument checks
    (``_check_attention_inputs``, ``check_attention_mask``) compute nothing and do not count."""
    return (module.startswith("llmcore.") and module not in _EXEMPT_MODULES
            and not name.startswith(("_", "check")) and any(word in name for word in words))


def _is_library_function(obj, words: Sequence[str]) -> bool:
    return inspect.isfunction(obj) and _is_library_name(getattr(obj, "__module__", None) or "",
                                              getattr(obj, "__name__", "") or "", words)


def _is_library_code(code, module_globals: dict, words: Sequence[str]) -> bool:
    return _is_library_name(module_globals.get("__name__", "") or "", code.co_name, words)


def _resolve(dotted: str):
    """'numpy.linalg.multi_dot' -> (module object, attribute name), or None if absent."""
    module_name, _, attr = dotted.rpartition(".")
    module = sys.modules.get(module_name)
    if module is None:
        with contextlib.suppress(ImportError):
            module = __import__(module_name, fromlist=["_"])
    if module is None or not hasattr(module, attr):
        return None
    return module, attr


@contextlib.contextmanager
def forbid(*targets: str | Callable, hint: str = "") -> Iterator[None]:
    """Inside the block, calling any target raises :class:`NotAllowedError` with a clear message.

    targets:
      ``"torch.NAME"``    every torch function or Tensor method called NAME, however it is
                          reached (``torch.softmax``, ``F.softmax``, ``x.softmax``, ``nn.Softmax``;
                          ``"torch.matmul"`` also covers ``a @ b``);
      ``"llmcore.WORD"``  every llmcore function whose name contains WORD, called directly or
                          through any other function;
      ``"numpy.NAME"``    that NumPy function;
      a callable          that very function or method (for example ``Attention.forward``).
    hint: a sentence added to the message, saying what to use instead.

    Used by the exercises' test cells:
    ``with forbid(*SOFTMAXES, hint="Use torch.exp, amax and sum."): got = softmax_rows(x)``.
    """
    names = [t for t in targets if isinstance(t, str)]
    unknown = [t for t in names if not t.startswith(("torch.", "llmcore.", "numpy."))]
    if unknown:
        raise ValueError(f"forbid: targets must start with 'torch.', 'llmcore.' or 'numpy.' (or be "
                         f"callables), got {unknown}")
    torch_ops = {t.split(".", 1)[1] for t in names if t.startswith("torch.")}
    words = tuple(t.split(".", 1)[1] for t in names if t.startswith("llmcore."))
    numpy_names = [t for t in names if t.startswith("numpy.")]
    callables = [t for t in targets if not isinstance(t, str)]
    codes = {getattr(c, "__code__", None) for c in callables} - {None}
    objects = {id(c): c for c in callables}
    hint = f" {hint}" if hint else ""

    def refuse(what: str) -> NotAllowedError:
        return NotAllowedError(f"{what} was called, but this exercise asks you to compute it "
                               f"yourself; the library's own version is not allowed here.{hint}")

    def check_stack() -> None:
        outermost, frame = None, sys._getframe(2)
        while frame is not None:
            code = frame.f_code
            if code in codes or (words and _is_library_code(code, frame.f_globals, words)):
                name = getattr(code, "co_qualname", code.co_name)      # Python 3.11+
                outermost = f"{frame.f_globals.get('__name__')}.{name}"
            frame = frame.f_back
        if outermost is not None:
            raise refuse(outermost)

    class Refuse(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = _torch_op_name(func)
            if name in torch_ops or id(func) in objects:
                raise refuse(f"torch's {name}" if name in torch_ops else name)
            if words or codes:
                check_stack()
            return func(*args, **(kwargs or {}))

    # Functions that may run without any torch call (NumPy, the llmcore reference twins) are
    # swapped for a refusing stand-in wherever a student could reach them by name.
    def stand_in(what: str):
        def refusing(*args, **kwargs):
            raise refuse(what)
        return refusing

    patches: list[tuple[object, str, object]] = []
    namespaces = [m for name, m in list(sys.modules.items()) if m is not None
                  and (name == "llmcore" or name.startswith("llmcore."))
                  and name not in _EXEMPT_MODULES]
    main = sys.modules.get("__main__")
    for dotted in numpy_names:
        found = _resolve(dotted)
        if found is not None:
            module, attr = found
            original = getattr(module, attr)
            patches.append((module, attr, original))
            objects[id(original)] = original
    for namespace in [*namespaces, main]:
        if namespace is None:
            continue
        for attr, value in list(vars(namespace).items()):
            if id(value) in objects or (words and _is_library_function(value, words)):
                patches.append((namespace, attr, value))
    for owner, attr, original in patches:
        what = (f"{getattr(original, '__module__', None) or 'numpy'}."
                f"{getattr(original, '__name__', attr)}")
        setattr(owner, attr, stand_in(what))
    try:
        with Refuse():
            yield
    finally:
        for owner, attr, original in reversed(patches):
            setattr(owner, attr, original)


def _storage_pointer(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


@dataclass(frozen=True)
class TorchCall:
    """One torch function call: its name, its tensor arguments' shapes and storage pointers."""

    name: str
    shapes: tuple[tuple[int, ...], ...]
    storages: tuple[int, ...]

    @property
    def is_product(self) -> bool:
        """A matrix or vector product (``@``, matmul, mm, einsum, linear, ...)."""
        return self.name in _PRODUCT_OPS

    @property
    def rows(self) -> int:
        """Rows (tokens) of the first tensor argument: every dimension but the last."""
        return math.prod(self.shapes[0][:-1]) if self.shapes else 0

    def uses(self, t: torch.Tensor) -> bool:
        """Whether ``t`` (or a view of its memory, such as its transpose) was an argument."""
        pointer = _storage_pointer(t)
        return pointer != 0 and pointer in self.storages


@contextlib.contextmanager
def watch_torch_calls() -> Iterator[list[TorchCall]]:
    """Record every torch function call made inside the block, in order.

    >>> with watch_torch_calls() as calls:
    ...     y = torch.ones(3, 2) @ torch.ones(2, 4)
    >>> [c.name for c in calls if c.is_product]
    ['matmul']
    """
    calls: list[TorchCall] = []

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            tensors = [a for a in (*args, *(kwargs or {}).values()) if isinstance(a, torch.Tensor)]
            name = _torch_op_name(func)
            if name != "__get__":
                calls.append(TorchCall(name, tuple(tuple(t.shape) for t in tensors),
                                       tuple(_storage_pointer(t) for t in tensors)))
            return func(*args, **(kwargs or {}))

    with Watch():
        yield calls


# ------------------------------------------------------------------------------------------------
# nbgrader plumbing (imported lazily: only the commands below need nbgrader)
# ------------------------------------------------------------------------------------------------

REPOSITORY = Path(__file__).resolve().parent.parent
CONFIG_NAME = "nbgrader_config.py"


def _prepare_environment() -> None:
    """Put this interpreter's bin directory first on PATH: nbgrader runs ``alembic`` for a new
    gradebook, and the ``python3`` kernel spec starts ``python`` from PATH.

    Also skips one optional import: nbformat imports jsonschema, which tries rfc3987_syntax (an
    "iri" format checker that no notebook uses) and that package builds a parser at import, about
    2.5 s of CPU for every command. jsonschema does without it (``suppress(ImportError)``)."""
    sys.modules.setdefault("rfc3987_syntax", None)
    bin_dir = os.path.dirname(sys.executable)
    parts = os.environ.get("PATH", "").split(os.pathsep)
    if parts[:1] != [bin_dir]:
        os.environ["PATH"] = os.pathsep.join([bin_dir, *[p for p in parts if p != bin_dir]])


def _memory_limit_code(megabytes: int) -> str:
    limit = megabytes * 2**20
    return ("import resource as _resource\n"
            "try:\n"
            f"    _resource.setrlimit(_resource.RLIMIT_DATA, ({limit}, {limit}))\n"
            "except (ValueError, OSError):\n"
            "    pass\n"
            "del _resource\n")


@functools.cache
def _bounded_execute() -> type:
    """nbgrader's Execute preprocessor with a memory limit, preloaded modules and an output cap
    (built on first use, so that importing llmcore.grading does not import nbgrader)."""
    from jupyter_core.utils import run_sync
    from nbformat.v4 import new_output
    from nbgrader.preprocessors import Execute
    from traitlets import Integer, List, Unicode

    class BoundedExecute(Execute):
        """Execute, where each kernel gets a memory limit and preloaded modules, and each cell
        keeps at most max_output_chars of output (an error and the first stderr are always
        kept, shortened, because they decide the cell's grade)."""

        memory_limit_mb = Integer(
            2048, help="Memory (RLIMIT_DATA) a notebook's kernel may allocate, in MiB; 0: no "
                       "limit. Past it, allocations raise MemoryError instead of the machine "
                       "running out.").tag(config=True)
        max_output_chars = Integer(
            20_000, help="Characters of output a cell keeps; the rest is dropped while the "
                         "cell runs.").tag(config=True)
        preload = List(
            Unicode(), ["torch", "llmcore"],
            help="Modules imported when the kernel starts (before any cell, outside the cell "
                 "timeout), so that a slow first import is never mistaken for a hung "
                 "cell.").tag(config=True)

        def _kernel_code(self) -> str:
            code = ""
            if self.memory_limit_mb > 0:
                try:
                    import resource  # noqa: F401  (POSIX only)
                    code += _memory_limit_code(self.memory_limit_mb)
                except ImportError:
                    pass
            for name in self.preload:
                code += f"import {name} as _preloaded\ndel _preloaded\n"
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

        def preprocess(self, nb, resources=None, km=None):
            self._kept: dict[int, int] = {}
            self._stderr_kept: set[int] = set()
            self._truncated: set[int] = set()
            return super().preprocess(nb, resources, km)

        def output(self, outs, msg, display_id, cell_index):
            out = super().output(outs, msg, display_id, cell_index)
            if out is None:
                return None
            cap = self.max_output_chars
            kept = self._kept.get(cell_index, 0)
            size = _output_size(out)
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

    return BoundedExecute


def _output_size(out) -> int:
    if out.output_type == "stream":
        return len(out.text)
    if out.output_type == "error":
        return len(out.evalue) + sum(len(line) for line in out.traceback)
    data = out.get("data", {})
    return sum(len(v) if isinstance(v, str) else len(str(v)) for v in data.values())


def find_config(start: Path) -> Path | None:
    """The nbgrader_config.py of the course that holds ``start``: the nearest one in start or
    its parents, else the repository's."""
    start = start.resolve()
    for folder in [start, *start.parents] if start.is_dir() else list(start.parents):
        if (folder / CONFIG_NAME).is_file():
            return folder / CONFIG_NAME
    fallback = REPOSITORY / CONFIG_NAME
    return fallback if fallback.is_file() else None


def course_config(course_dir: str | os.PathLike = ".", *,
                  gradebook: str | os.PathLike | None = None, timeout: int | None = None,
                  config_file: str | os.PathLike | None = None):
    """The nbgrader configuration for a course directory, as a traitlets ``Config``.

    Reads nbgrader_config.py (``config_file``, else the course's, else the repository's), then sets
    the course root to ``course_dir``, the gradebook (default ``course_dir/gradebook.db``), the
    cell timeout if given, and the grader's bounded Execute preprocessor.
    """
    from nbgrader.converters import Autograde
    from nbgrader.preprocessors import Execute
    from traitlets.config import Config
    from traitlets.config.loader import PyFileConfigLoader

    course = Path(course_dir).resolve()
    path = Path(config_file).resolve() if config_file else find_config(course)
    config = Config()
    if path is not None:
        config.merge(PyFileConfigLoader(path.name, path=str(path.parent)).load_config())
    config.CourseDirectory.root = str(course)
    book = Path(gradebook).resolve() if gradebook else course / "gradebook.db"
    config.CourseDirectory.db_url = f"sqlite:///{book}"
    if timeout is not None:
        config.Execute.timeout = int(timeout)
    bounded = _bounded_execute()
    defaults = Autograde.class_traits()["autograde_preprocessors"].default()
    config.Autograde.autograde_preprocessors = [bounded if p is Execute else p for p in defaults]
    return config


def _course_directory(config, **attrs):
    from nbgrader.coursedir import CourseDirectory
    coursedir = CourseDirectory(config=config)
    for name, value in attrs.items():
        setattr(coursedir, name, value)
    return coursedir


class _LogRecords(logging.Handler):
    """Keeps a converter's log records (level, message) for failure reasons and --verbose."""

    def __init__(self):
        super().__init__(level=logging.INFO)
        self.records: list[tuple[int, str]] = []

    def emit(self, record):
        with contextlib.suppress(Exception):
            self.records.append((record.levelno, record.getMessage()))

    def errors(self) -> str:
        """The ERROR (and worse) messages, one per line."""
        return "\n".join(m for level, m in self.records if level >= logging.ERROR)


@contextlib.contextmanager
def _quiet_gradebook() -> Iterator[None]:
    """Silence two harmless warnings of nbgrader 0.9 with today's libraries: its gradebook makes
    SQLAlchemy 2 warn "... not in session, add operation ... will not proceed" while it creates a
    submission (which it then adds: nothing is lost), and a test cell it puts back into a
    submission has no cell id (nbformat gives it one)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not in session.*")
        warnings.filterwarnings("ignore", message="Cell is missing an id field")
        yield


def _run_converter(app) -> _LogRecords:
    """Start an nbgrader converter; return its log. nbgrader raises at the end of a run in which
    some submissions failed (after grading all the others): that is reported, not raised."""
    from nbgrader.converters.base import NbGraderException
    records = _LogRecords()
    app.log.addHandler(records)
    old_level = app.log.level
    app.log.setLevel(logging.INFO)
    try:
        with _quiet_gradebook():
            app.start()
    except NbGraderException:
        pass
    finally:
        app.log.removeHandler(records)
        app.log.setLevel(old_level)
    return records


def assignments_in(folder: Path) -> list[str]:
    """Assignment names: the sub-folders of ``folder`` that hold at least one notebook."""
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir()
                  if p.is_dir() and not p.name.startswith((".", "_")) and any(p.glob("*.ipynb")))


# ------------------------------------------------------------------------------------------------
# release
# ------------------------------------------------------------------------------------------------

def release(course_dir: str | os.PathLike = ".", *, release_dir: str | os.PathLike | None = None,
            config_file: str | os.PathLike | None = None) -> list[Path]:
    """Generate the student notebooks from solutions/ (nbgrader generate_assignment).

    Writes ``release_dir`` (default: the course's release directory, exercises/), replacing each
    assignment folder; no gradebook is touched. Returns the notebooks written. The output depends
    only on solutions/, so a fresh generation equals the committed one.
    """
    _prepare_environment()
    config = course_config(course_dir, config_file=config_file)
    config.SaveCells.enabled = False          # no gradebook: releasing records nothing
    coursedir = _course_directory(config)
    source = Path(coursedir.root) / coursedir.source_directory
    names = assignments_in(source)
    if not names:
        raise FileNotFoundError(f"release: no assignments in {source} (expected "
                                f"{source}/<assignment>/<notebook>.ipynb)")
    if release_dir is not None:
        coursedir.release_directory = str(Path(release_dir).resolve())
    written = []
    for name in names:
        coursedir.assignment_id = name
        _, notebooks = _generate_assignment(config, coursedir, no_database=True,
                                            failure=f"release: nbgrader generated nothing for {name}")
        for notebook in notebooks:
            notebook.chmod(0o644)
        written += notebooks
    return written


# ------------------------------------------------------------------------------------------------
# check (the learner's command)
# ------------------------------------------------------------------------------------------------

HIDDEN_MARK = "### BEGIN HIDDEN TESTS"


@dataclass(frozen=True)
class CellResult:
    """One test cell of a checked notebook."""

    grade_id: str
    points: float
    score: float | None          # None: hidden tests that only run when the notebook is graded
    message: str                 # the error's last line when the cell failed, else ""
    hidden: bool                 # the cell holds hidden tests (a solution notebook's)

    @property
    def status(self) -> str:
        if self.score is None:
            return "HIDDEN"
        return "PASS" if self.score >= self.points else "FAIL"


@dataclass(frozen=True)
class CheckReport:
    notebook: Path
    tests: tuple[CellResult, ...]
    cell_errors: tuple[str, ...]     # errors in cells that are not tests (your code)
    edited_tests: tuple[str, ...]    # read-only cells changed (grading restores them)

    @property
    def points(self) -> float:
        return sum(t.score for t in self.tests if t.score is not None)

    @property
    def max_points(self) -> float:
        return sum(t.points for t in self.tests if t.score is not None)

    @property
    def hidden_points(self) -> float:
        return sum(t.points for t in self.tests if t.score is None)

    @property
    def ok(self) -> bool:
        return (all(t.status != "FAIL" for t in self.tests) and not self.cell_errors
                and not self.edited_tests)


def _code_lines(source: str) -> list[str]:
    return [line for line in source.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def _last_error_line(text: str) -> str:
    from nbconvert.filters import strip_ansi
    lines = [line.rstrip() for line in strip_ansi(text).splitlines() if line.strip()]
    for line in reversed(lines):
        if re.match(r"^\w*(Error|Exception|Interrupt|Exit)\b", line.strip()):
            return line.strip()
    return lines[-1].strip() if lines else "failed"


def _error_text(cell) -> str:
    errors = [out.ename for out in cell.get("outputs", []) if out.output_type == "error"]
    if "CellTimeoutError" in errors or "KeyboardInterrupt" in errors:
        return ("CellTimeoutError: the cell ran past the time limit and was interrupted (a loop "
                "that never ends?)")
    for out in cell.get("outputs", []):
        if out.output_type == "error":
            return f"{out.ename}: {out.evalue}" if out.evalue else out.ename
    for out in cell.get("outputs", []):
        if out.output_type == "stream" and out.name == "stderr":
            return "wrote to stderr: " + _last_error_line(out.text)
    return ""


def check(notebook: str | os.PathLike, *, timeout: int | None = None,
          config_file: str | os.PathLike | None = None) -> CheckReport:
    """Run a notebook in a fresh kernel (nbgrader's Validator, bounded like the grader) and
    report every test cell: pass or fail with its message, and the points it is worth."""
    _prepare_environment()
    from nbgrader import utils
    from nbgrader.preprocessors import CheckCellMetadata, ClearOutput
    from nbgrader.validator import Validator
    from traitlets import List

    path = Path(notebook).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"check: no notebook at {notebook}")
    config = course_config(path.parent, timeout=timeout, config_file=config_file)

    class Checker(Validator):
        preprocessors = List([CheckCellMetadata, ClearOutput, _bounded_execute()])

        def _preprocess(self, nb):
            self.executed = super()._preprocess(nb)
            return self.executed

    checker = Checker(config=config)
    checker.ignore_checksums = False
    try:
        found = checker.validate(str(path))
    except Exception as error:          # the kernel died, or the notebook is not a notebook
        reason = f"{type(error).__name__}: {error}".strip().splitlines()[0]
        return CheckReport(path, (), (f"the notebook could not be run to the end ({reason})",), ())
    edited = tuple(c["source"].splitlines()[0] if c["source"] else "(empty cell)"
                   for c in found.get("changed", []))
    if "type_changed" in found:
        changed = tuple(f"a {c['old_type']} cell became {c['new_type']}"
                        for c in found["type_changed"])
        return CheckReport(path, (), (), changed)
    tests, errors = [], []
    for index, cell in enumerate(checker.executed.cells):
        if cell.cell_type != "code":
            continue
        if utils.is_grade(cell) and not utils.is_solution(cell):
            grade_id = cell.metadata.nbgrader.get("grade_id", f"cell {index}")
            hidden = HIDDEN_MARK in cell.source
            if not _code_lines(cell.source):
                tests.append(CellResult(grade_id, float(cell.metadata.nbgrader["points"]), None,
                                        "", True))
                continue
            score, points = utils.determine_grade(cell)
            message = _error_text(cell) if score < points else ""
            tests.append(CellResult(grade_id, points, float(score), message, hidden))
        else:
            message = _error_text(cell)
            if message:
                first = (cell.source.strip().splitlines() or ["(empty)"])[0][:60]
                errors.append(f"cell {index} ({first}): {message}")
    return CheckReport(path, tuple(tests), tuple(errors), edited)


def format_report(report: CheckReport) -> str:
    lines = [f"Checked {report.notebook.name} in a fresh kernel."]
    for test in report.tests:
        points = f"{test.points:g} point{'s' if test.points != 1 else ''}"
        if test.score is None:
            lines.append(f"  HIDDEN  {test.grade_id}: {points}, run when the notebook is graded")
            continue
        label = test.grade_id + (" (hidden tests)" if test.hidden else "")
        lines.append(f"  {test.status:<6}  {label}: {test.score:g} of {points}")
        if test.message:
            message = test.message if len(test.message) < 600 else test.message[:600] + " ..."
            lines.append("          " + message.replace("\n", "\n          "))
    for error in report.cell_errors:
        lines.append(f"  ERROR   {error}")
    for cell in report.edited_tests:
        lines.append(f"  EDITED  a read-only cell was changed ({cell!r}); grading runs the "
                     "original, so undo the change")
    hidden = f" ({report.hidden_points:g} more in hidden tests, run when graded)" \
        if report.hidden_points else ""
    lines.append(f"Points so far: {report.points:g} of {report.max_points:g}{hidden}.")
    lines.append("All visible tests pass." if report.ok else
                 "Not done yet: fix what FAILs or ERRORs above and check again.")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# grade (the instructor's command)
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GradeRow:
    """One line of grades.csv."""

    student: str
    assignment: str
    score: float
    max_score: float
    status: str          # "graded", "failed: ...", "unknown assignment", "not submitted"


def _submissions(course: Path, submitted_dir: str) -> list[tuple[str, str]]:
    """(student, assignment) for every folder submitted/<student>/<assignment>/ with a notebook."""
    root = course / submitted_dir
    if not root.is_dir():
        raise FileNotFoundError(f"grade: no submissions folder {root} (expected "
                                f"{root}/<student>/<assignment>/<notebook>.ipynb)")
    return [(student.name, assignment) for student in sorted(root.iterdir())
            if student.is_dir() and not student.name.startswith(".")
            for assignment in assignments_in(student)]


def _failure_reasons(records: _LogRecords) -> dict[str, str]:
    """Submission folder -> the last line of the error that stopped its grading."""
    reasons, current = {}, None
    for level, message in records.records:
        found = re.match(r"There was an error processing assignment: (.*)", message)
        if found:
            current = found.group(1).strip()
        elif current is not None and level >= logging.ERROR and "Traceback" in message:
            reasons[os.path.normpath(current)] = _last_error_line(message)
            current = None
    return reasons


def _zero_failed(db_url: str, course_id: str, assignment: str, student: str) -> None:
    """Record 0 points for every test of a submission nbgrader could not run to the end."""
    from nbgrader.api import Gradebook
    with _quiet_gradebook(), Gradebook(db_url, course_id) as gb:
        gb.update_or_create_student(student)
        submission = gb.update_or_create_submission(assignment, student)
        for notebook in submission.notebooks:
            for grade in notebook.grades:
                grade.auto_score = 0
                grade.needs_manual_grade = False
        gb.db.commit()


def _failure_feedback(path: Path, student: str, assignment: str, reason: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>Feedback</title></head><body>\n"
        f"<h1>{html.escape(assignment)}: {html.escape(student)}</h1>\n"
        "<p>Your notebook could not be run to the end, so every test scored 0. The grader "
        f"reported: <code>{html.escape(reason)}</code></p>\n"
        "<p>Run <code>python -m llmcore.grading check NOTEBOOK</code> on your notebook to see "
        "what goes wrong, then submit it again.</p>\n</body></html>\n", encoding="utf-8")


def _generate_assignment(config, coursedir, *, no_database: bool,
                         failure: str) -> tuple[_LogRecords, list[Path]]:
    """nbgrader generate_assignment of ``coursedir.assignment_id`` into its release directory;
    returns the log and the notebooks written, or raises RuntimeError(failure + nbgrader's errors)
    when it wrote none."""
    from nbgrader.converters import GenerateAssignment
    app = GenerateAssignment(coursedir=coursedir, config=config)
    app.force = True
    app.no_database = no_database
    records = _run_converter(app)
    folder = Path(coursedir.root) / coursedir.release_directory / coursedir.assignment_id
    notebooks = sorted(folder.glob("*.ipynb"))
    if not notebooks:
        raise RuntimeError(f"{failure}:\n{records.errors()}")
    return records, notebooks


def _register(config, assignment: str) -> _LogRecords:
    """Record an assignment's cells (tests, points, checksums, hidden tests) in the gradebook
    (nbgrader generate_assignment into a scratch folder: exercises/ is not touched)."""
    with tempfile.TemporaryDirectory() as scratch:
        coursedir = _course_directory(config, assignment_id=assignment, release_directory=scratch)
        records, _ = _generate_assignment(
            config, coursedir, no_database=False,
            failure=f"grade: nbgrader could not register {assignment}")
    return records


def grade(course_dir: str | os.PathLike = ".", *, gradebook: str | os.PathLike | None = None,
          csv_path: str | os.PathLike | None = None, timeout: int | None = None,
          force: bool = False, assignments: Sequence[str] | None = None,
          config_file: str | os.PathLike | None = None, feedback: bool = True,
          log: Callable[[str], None] | None = None, verbose: bool = False) -> list[GradeRow]:
    """Grade every submission in ``course_dir/submitted/<student>/<assignment>/``.

    One nbgrader autograde run per assignment grades all its students; a submission that
    raises, hangs, exhausts its memory or kills its kernel is graded 0 where it stopped and the
    run goes on. Submissions graded by an earlier run are kept unless ``force``. Then writes
    feedback HTML (``feedback/<student>/<assignment>/``) and the CSV (default
    ``course_dir/grades.csv``) of every submission in the gradebook, which it returns.
    log: called with a line of progress; verbose: also pass it nbgrader's warnings and errors.
    """
    _prepare_environment()
    from nbgrader.converters import Autograde, GenerateFeedback

    say = log or (lambda message: None)

    def report(records: _LogRecords) -> None:
        if verbose:
            for level, message in records.records:
                if level >= logging.WARNING:
                    say(f"  nbgrader {logging.getLevelName(level).lower()}: {message}")

    config = course_config(course_dir, gradebook=gradebook, timeout=timeout,
                           config_file=config_file)
    coursedir = _course_directory(config)
    course = Path(coursedir.root)

    def folder(step: str, student: str, assignment: str) -> Path:
        return Path(coursedir.format_path(step, student, assignment))

    known = set(assignments_in(course / coursedir.source_directory))
    pairs = _submissions(course, coursedir.submitted_directory)
    if assignments:
        pairs = [(s, a) for s, a in pairs if a in set(assignments)]
    status: dict[tuple[str, str], str] = {}
    for student, assignment in pairs:
        if assignment not in known:
            status[(student, assignment)] = "unknown assignment"
            say(f"{student}/{assignment}: no such assignment in {coursedir.source_directory}/")

    for assignment in sorted({a for s, a in pairs if a in known}):
        students = [s for s, a in pairs if a == assignment]
        report(_register(config, assignment))

        def graded_files(student: str) -> list[tuple[Path, int]]:
            return [(p, p.stat().st_mtime_ns) for p in sorted(
                folder(coursedir.autograded_directory, student, assignment).glob("*.ipynb"))]

        before = {student: graded_files(student) for student in students}
        say(f"{assignment}: grading {len(students)} submission(s)")
        app = Autograde(coursedir=_course_directory(config, assignment_id=assignment,
                                                    student_id="*"), config=config)
        app.force = force
        app.create_student = True
        records = _run_converter(app)
        report(records)
        reasons = _failure_reasons(records)
        for student in students:
            files = graded_files(student)
            if files and files != before[student]:
                status[(student, assignment)] = "graded"
                shutil.rmtree(folder(coursedir.feedback_directory, student, assignment),
                              ignore_errors=True)
                continue
            if files:
                status[(student, assignment)] = "graded earlier"
                continue
            submitted = folder(coursedir.submitted_directory, student, assignment)
            reason = reasons.get(os.path.normpath(submitted),
                                 "nbgrader could not run this notebook to the end")
            status[(student, assignment)] = f"failed: {reason}"
            say(f"{student}/{assignment}: graded 0, the notebook stopped the grader ({reason})")
            _zero_failed(coursedir.db_url, coursedir.course_id, assignment, student)
            if feedback:
                for nb in sorted(submitted.glob("*.ipynb")):
                    pages = folder(coursedir.feedback_directory, student, assignment)
                    _failure_feedback(pages / f"{nb.stem}.html", student, assignment, reason)
        if feedback:
            app = GenerateFeedback(coursedir=_course_directory(
                config, assignment_id=assignment, student_id="*"), config=config)
            report(_run_converter(app))

    rows = _gradebook_rows(coursedir, status)
    write_grades(rows, Path(csv_path) if csv_path else course / "grades.csv")
    return rows


def _gradebook_rows(coursedir, status: dict[tuple[str, str], str]) -> list[GradeRow]:
    """Every submission in the gradebook (this run's and earlier ones), plus the submissions of
    unknown assignments, sorted by assignment and student."""
    from nbgrader.api import Gradebook, MissingEntry
    rows = []
    with Gradebook(coursedir.db_url, coursedir.course_id) as gb:
        for assignment in gb.assignments:
            for student in gb.students:
                try:
                    submission = gb.find_submission(assignment.name, student.id)
                except MissingEntry:
                    continue
                note = status.get((student.id, assignment.name), "graded earlier")
                rows.append(GradeRow(student.id, assignment.name, float(submission.score),
                                     float(assignment.max_score), note))
    rows += [GradeRow(student, assignment, 0.0, 0.0, note)
             for (student, assignment), note in status.items() if note == "unknown assignment"]
    return sorted(rows, key=lambda r: (r.assignment, r.student))


def write_grades(rows: Sequence[GradeRow], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["student_id", "assignment", "score", "max_score", "status"])
        for r in rows:
            writer.writerow([r.student, r.assignment, f"{r.score:g}", f"{r.max_score:g}", r.status])


# ------------------------------------------------------------------------------------------------
# command line
# ------------------------------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m llmcore.grading",
        description="Release, check and grade the course's nbgrader exercises.")
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("release",
                            help="generate exercises/ (student notebooks) from solutions/")
    p.add_argument("--course-dir", default=".", help="course root (default: .)")
    p.add_argument("--release-dir", default=None,
                   help="write here instead of the course's exercises/")

    p = commands.add_parser("check", help="run a notebook and print each visible test's result")
    p.add_argument("notebook",
                   help="path to an .ipynb (for example exercises/01_matmul/matmul.ipynb)")
    p.add_argument("--timeout", type=int, default=None, help="seconds per cell (default: config)")

    p = commands.add_parser("grade", help="grade submitted/<student>/<assignment>/ (autograde, "
                                          "feedback HTML, grades CSV)")
    p.add_argument("--course-dir", default=".", help="course root (default: .)")
    p.add_argument("--gradebook", default=None,
                   help="sqlite gradebook (default: COURSE/gradebook.db)")
    p.add_argument("--csv", default=None, help="grades file (default: COURSE/grades.csv)")
    p.add_argument("--timeout", type=int, default=None, help="seconds per cell (default: config)")
    p.add_argument("--assignment", action="append", default=None,
                   help="grade only this assignment (repeatable; default: all)")
    p.add_argument("--force", action="store_true", help="grade again what was graded before")
    p.add_argument("--no-feedback", action="store_true", help="skip the feedback HTML")
    p.add_argument("--verbose", action="store_true",
                   help="also show nbgrader's warnings and errors")

    args = parser.parse_args(argv)
    try:
        if args.command == "release":
            for path in release(args.course_dir, release_dir=args.release_dir):
                print(f"wrote {path}")
            return 0
        if args.command == "check":
            report = check(args.notebook, timeout=args.timeout)
            print(format_report(report))
            return 0 if report.ok else 1
        rows = grade(args.course_dir, gradebook=args.gradebook, csv_path=args.csv,
                     timeout=args.timeout, force=args.force, assignments=args.assignment,
                     feedback=not args.no_feedback, log=lambda m: print(m, flush=True),
                     verbose=args.verbose)
        width = max([len(r.student) for r in rows] + [7])
        for r in rows:
            print(f"{r.assignment:<16} {r.student:<{width}} {r.score:>5g} / {r.max_score:<4g} "
                  f"{r.status}")
        course = Path(args.course_dir).resolve()
        print(f"grades: {Path(args.csv) if args.csv else course / 'grades.csv'}; "
              f"feedback: {course / 'feedback'}")
        return 0
    except (FileNotFoundError, RuntimeError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
