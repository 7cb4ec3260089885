"""The kernel's audit hook (PEP 578): what evasion needs, reported as it happens.

The executor installs it when the kernel starts (:func:`install`, after the preloads and before
any cell). Python offers no way to remove an audit hook, and each report leaves the kernel at
once as a ``display_data`` message of MIME type :data:`llmcheck.record.AUDIT_MIME` sent on the
kernel's output channel through the session captured at install; the grader's executor takes it
out of the stream as it arrives and keeps it in the cell's metadata (course/grading/executor.py),
so what the kernel does afterwards cannot take a report back. Each report is evidence for the
instructor's review (course/grading/verdicts.py), never a lost point.

What is reported (:data:`WATCHED`): frames (``sys._getframe``, ``sys._current_frames``, a
frame, traceback or generator's frame attributes, a function's ``__code__``, ``__globals__``,
``__closure__``), tracing and profiling hooks (``sys.settrace``, ``sys.setprofile``), another
audit hook, the garbage collector's walks (``gc.get_objects``, ``get_referrers``,
``get_referents``), ``ctypes``, ``exec`` and ``compile``, functions and code objects built by
hand, an attribute of one of the harness's classes set or deleted, a function's defaults
replaced, a new Python thread, and the first import of torch's dispatch or foreign-function
modules. An event is reported only when the code that caused it is the learner's: the nearest
frame outside a few reflection modules of the standard library (``inspect``, ``traceback``,
``ctypes``, ``importlib``...) belongs to a notebook cell, so torch's, IPython's, the standard
library's and the harness's own uses of the same primitives (a recorder's profile hook, a
dataclass's ``exec``) are never reported. Each place is reported once, at most
:data:`MAX_REPORTS` in all.

torch's mode stacks raise no audit event of their own, and the op recorder is a mode on them:
``torch.utils._python_dispatch._get_current_dispatch_mode()`` hands it to any caller. So
:func:`install` replaces torch._C's entry points to both stacks (:data:`MODE_STACKS`), wherever a
loaded module holds them, with functions that raise :data:`MODE_EVENT` first. That event is
reported when the learner's cell called the entry point, directly or through torch's own
mode-stack helpers (reading the recorder, popping or pushing a mode), or called torch's tracing
machinery that did (``make_fx``, whose proxy mode is pushed the same way); torch's other uses
(printing a tensor sets the modes aside) and the harness's entering and leaving of its recorder
are never reported. The originals are kept only in those functions'
closures, which a learner reaches only through ``__closure__`` (itself reported).
"""

from __future__ import annotations

import os
import sys

from .record import AUDIT_MIME

WATCHED = frozenset({
    "sys._getframe", "sys._current_frames", "sys._current_exceptions", "sys.setprofile",
    "sys.settrace", "sys.addaudithook", "gc.get_objects", "gc.get_referrers",
    "gc.get_referents", "exec", "compile", "function.__new__", "code.__new__",
    "object.__getattr__", "object.__setattr__", "object.__delattr__", "import",
    "_thread.start_new_thread", "llmcheck.mode_stack"})
"""Audit events reported (and every ``ctypes.*`` event)."""

MODE_EVENT = "llmcheck.mode_stack"
"""The event the watched mode-stack entry points raise (argument: the entry point's name)."""

MODE_STACKS = ("_get_dispatch_stack_at", "_len_torch_dispatch_stack",
               "_pop_torch_dispatch_stack", "_push_on_torch_dispatch_stack", "_get_dispatch_mode",
               "_set_dispatch_mode", "_unset_dispatch_mode", "_get_function_stack_at",
               "_len_torch_function_stack", "_pop_torch_function_stack",
               "_push_on_torch_function_stack")
"""torch._C's functions that read or change torch's dispatch-mode and function-mode stacks."""

MODE_WALK = 80
"""Frames looked at, below a mode-stack event, for a learner's cell (make_fx's are deep)."""

MODE_HELPERS = frozenset({os.path.join("utils", "_python_dispatch.py"), "overrides.py"})
"""torch's own helpers around its mode stacks (paths inside torch's package): a call from the
learner's cell through them is the learner's."""

TRACING = tuple(os.path.join(*parts, "") for parts in (
    ("fx",), ("func",), ("_functorch",), ("export",), ("_export",), ("_subclasses",),
    ("_higher_order_ops",), ("_dynamo",), ("_prims",), ("_decomp",), ("_refs",)))
"""torch's tracing machinery (paths inside torch's package): a mode it pushes is the learner's
when the first frame below it outside torch is the learner's cell (``make_fx`` called there)."""

ATTRIBUTES = frozenset({"__code__", "__globals__", "__closure__", "f_back", "f_globals",
                        "f_locals", "f_builtins", "f_code", "tb_frame", "gi_frame", "cr_frame",
                        "ag_frame", "gi_code", "cr_code"})
"""The attribute events (``object.__getattr__``...) reported: frames and a function's insides."""

DEFAULTS = frozenset({"__defaults__", "__kwdefaults__"})
"""A function's defaults: reported when they are set or deleted (read freely)."""

MODULES = ("torch.utils._python_dispatch", "torch._C", "torch._ops", "ctypes", "_ctypes", "cffi",
           "gc", "IPython.core.events", "_testcapi", "_testinternalcapi")
"""Imports reported (a module loaded for the first time: one already loaded raises no event, so
the harness's own modules, which test cells import, are never among them)."""

REFLECTION = frozenset({"inspect.py", "traceback.py", "threading.py", "runpy.py", "code.py",
                        "codeop.py", "linecache.py"})
REFLECTION_PACKAGES = ("ctypes", "importlib")
"""Standard-library files and packages passed over when looking for who caused an event: they
do it on their caller's behalf (``inspect.currentframe`` calls ``sys._getframe``)."""

MAX_REPORTS = 50

_installed = False


def _stdlib() -> str:
    import sysconfig
    return sysconfig.get_paths()["stdlib"]


def _reported(event: str, args: tuple) -> str | None:
    """What to report of an event (a short detail), or None when it is not watched."""
    if event.startswith("ctypes."):
        return ""
    if event not in WATCHED:
        return None
    if event.startswith("object."):
        name = args[1] if len(args) > 1 else ""
        if name in ATTRIBUTES:
            return f"{type(args[0]).__name__}.{name}"
        target = args[0] if args else None
        if event != "object.__getattr__" and name in DEFAULTS:
            return f"{type(target).__name__}.{name}"    # a function's defaults replaced
        if event != "object.__getattr__" and isinstance(target, type) \
                and str(getattr(target, "__module__", "")).startswith("llmcheck"):
            return f"{target.__name__}.{name}"          # a harness class changed
        return None
    if event == "import":
        name = str(args[0]) if args else ""
        return name if name.startswith(MODULES) else None
    if event == MODE_EVENT:
        return str(args[0]) if args else ""
    return ""


def _watched(name: str, original):
    """``original`` behind a function that raises :data:`MODE_EVENT` first."""
    audit = sys.audit

    def entry(*args, **kwargs):
        audit(MODE_EVENT, name)
        return original(*args, **kwargs)

    entry.__name__ = entry.__qualname__ = name
    return entry


def watch_mode_stacks() -> int:
    """Replace torch._C's mode-stack entry points (:data:`MODE_STACKS`) with watched ones in
    torch._C and in every loaded torch module that imported them by name (identity, not names,
    finds them); returns how many bindings were replaced. Once per process."""
    import torch
    native = torch._C
    if getattr(native, "_len_torch_dispatch_stack").__module__ == __name__:
        return 0
    entries = {}
    for name in MODE_STACKS:
        original = getattr(native, name, None)
        if original is not None:
            entries[id(original)] = (original, _watched(name, original))
    replaced = 0
    for module_name, module in list(sys.modules.items()):
        if module is None or not (module_name == "torch" or module_name.startswith("torch.")):
            continue
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for key, value in list(namespace.items()):
            found = entries.get(id(value))
            if found is not None and found[0] is value:
                namespace[key] = found[1]
                replaced += 1
    return replaced


def install() -> bool:
    """Install the hook in this kernel (once); False outside an IPython kernel."""
    global _installed
    if _installed:
        return True
    try:
        from IPython import get_ipython
        shell = get_ipython()
        kernel = shell.kernel
        send, session, socket = kernel.session.send, kernel.session, kernel.iopub_socket
        get_parent = kernel.get_parent
        cell_prefix = os.path.dirname(shell.compile.get_code_name("", "", 0)) + os.sep
    except Exception:                                       # noqa: BLE001  (not a kernel)
        return False
    del session
    stdlib = _stdlib()
    getframe, getline = sys._getframe, __import__("linecache").getline
    busy, seen = [False], set()
    torch_dir = os.path.join(os.path.dirname(sys.modules["torch"].__file__), "") \
        if "torch" in sys.modules else "\0"

    def learners(frame) -> tuple[str, int, str] | None:
        """(file, line, function) of the learner's code that caused the event, or None."""
        for _ in range(12):
            if frame is None:
                return None
            filename = frame.f_code.co_filename
            if filename.startswith(stdlib) and (
                    os.path.basename(filename) in REFLECTION
                    or filename[len(stdlib):].lstrip(os.sep).startswith(REFLECTION_PACKAGES)):
                frame = frame.f_back
                continue
            if filename.startswith(cell_prefix) or \
                    filename.startswith("<") and not filename.startswith("<frozen"):
                return filename, frame.f_lineno, frame.f_code.co_name
            return None
        return None

    def mode_user(frame) -> tuple[str, int, str] | None:
        """The learner's cell that read or changed a mode stack: the frame below torch's own
        mode-stack helpers, or, below torch's tracing machinery (make_fx, torch.func, export),
        the first frame outside torch; None for the harness and for torch's other uses (printing
        a tensor sets its modes aside)."""
        frame = frame.f_back                     # the watched entry point's own frame
        tracing = False
        for _ in range(MODE_WALK):
            if frame is None:
                return None
            filename = frame.f_code.co_filename
            if filename.startswith(cell_prefix) or \
                    filename.startswith("<") and not filename.startswith("<frozen"):
                return filename, frame.f_lineno, frame.f_code.co_name
            inside = filename[len(torch_dir):] if filename.startswith(torch_dir) else None
            if inside is None or not (inside in MODE_HELPERS or tracing):
                if inside is None or not inside.startswith(TRACING):
                    return None
                tracing = True
            frame = frame.f_back
        return None

    def hook(event, args):
        if busy[0] or (event not in WATCHED and not event.startswith("ctypes.")):
            return
        busy[0] = True
        try:
            detail = _reported(event, args)
            if detail is None or len(seen) >= MAX_REPORTS:
                return
            where = (mode_user if event == MODE_EVENT else learners)(getframe(1))
            if where is None or (event, detail, where) in seen:
                return
            seen.add((event, detail, where))
            filename, line, function = where
            text = getline(filename, line).strip()[:200]
            report = {"event": event, "detail": detail, "line": line, "function": function,
                      "source": text}
            send(socket, "display_data",
                 {"data": {AUDIT_MIME: report, "text/plain": ""}, "metadata": {},
                  "transient": {}}, parent=get_parent())
        except Exception:                                   # noqa: BLE001  (never break a call)
            pass
        finally:
            busy[0] = False

    sys.addaudithook(hook)
    watch_mode_stacks()
    _installed = True
    return True
