"""Evidence for an instructor's review: what in a learner's own cells reaches the grader's checks.

The verdicts (course/grading/verdicts.py) decide every point from what the checks saw. A few
in-process paths can fool checks that run in the learner's own kernel (replacing the harness's
functions, emptying a live policy through the garbage collector, writing a product into a tensor's
memory through ``ctypes``, disabling torch's dispatch for one op): where the records cannot tell,
the submission is marked for **review** with the evidence below. Review never costs a point: an
honest notebook that happens to use one of these keeps its score, and the instructor reads the
evidence next to it.

Only code is read (the syntax tree), never strings, comments or docstrings, and only constructs
that an exercise's answer has no use for: ordinary Python (``print``, ``display``, ``os.environ``,
``getattr``/``setattr``/``globals``, ``__class__``, warnings, any word in any string) is never
evidence.
"""

from __future__ import annotations

import ast

REVIEW_MODULES = frozenset({
    "ctypes", "cffi", "gc", "builtins", "importlib", "inspect", "marshal", "threading", "_thread",
    "concurrent", "multiprocessing", "llmcheck",
})
"""Modules whose import is evidence: native memory access, the garbage collector's object graph,
the interpreter's own namespaces, Python threads (the op recorder watches the test's thread) and
the checking harness itself."""

REVIEW_CALLS = frozenset({"exec", "eval", "compile", "__import__"})
"""Built-in functions that run code built at run time (a harness name assembled from strings)."""

REVIEW_ATTRIBUTES = frozenset({
    "__code__", "__globals__", "__closure__", "__builtins__", "__dict__", "__subclasses__",
    "f_back", "f_globals", "f_locals", "gi_frame", "modules", "setprofile", "settrace",
    "addaudithook", "_getframe", "events", "input_transformers_cleanup", "showtraceback",
})
"""Attributes that reach code objects, frames, module tables, tracing hooks or IPython's
machinery."""


USUAL_MODULES = frozenset({"torch", "np", "numpy", "F", "nn", "math", "llmcore", "llmcheck", "sys",
                           "os"})
"""Module names a notebook's locked cells import (the learner's cells may use them unimported)."""


def review_evidence(sources: list[str]) -> list[str]:
    """Short phrases naming what in ``sources`` (the learner's own cells) reaches the checks;
    [] for ordinary code. Cells that do not parse are skipped (they fail when they run)."""
    findings: list[str] = []
    modules = set(USUAL_MODULES)
    trees = []
    for source in sources:
        try:
            trees.append(ast.parse(source))
        except SyntaxError:
            continue
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    full = alias.name if isinstance(node, ast.Import) else \
                        f"{node.module or ''}.{alias.name}"
                    modules.add((alias.asname or alias.name).split(".")[0])
                    top = full.strip(".").split(".")[0]
                    if top in REVIEW_MODULES or alias.name in REVIEW_MODULES:
                        findings.append(f"imports {full.strip('.')}")
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in REVIEW_CALLS:
                findings.append(f"calls {node.func.id}()")
            elif isinstance(node, ast.Name) and node.id == "__builtins__":
                findings.append("uses __builtins__")
            elif isinstance(node, ast.Attribute):
                if node.attr in REVIEW_ATTRIBUTES:
                    findings.append(f"uses .{node.attr}")
                root = _root(node)
                if node.attr.startswith("_") and not node.attr.startswith("__") \
                        and root in modules | {"torch"} and root != "os":
                    findings.append(f"uses a library's private part ({root}...{node.attr})")
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) \
                    else [node.target]
                for target in targets:
                    if isinstance(target, ast.Attribute) and _root(target) in modules:
                        findings.append(f"replaces {ast.unparse(target)} of an imported module")
    return list(dict.fromkeys(findings))


def _root(node: ast.expr) -> str | None:
    """The name an attribute chain starts from (``torch`` for ``torch.nn.functional.x``)."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.value if not isinstance(node, ast.Call) else node.func
    return node.id if isinstance(node, ast.Name) else None
