"""llmcore's import graph, read from the source with ``ast`` (every import, at module level or
inside a function): no cycle, no module importing from a layer above its own, no module
importing the package itself, and no private name (``_x``) imported from another module. The
course's tooling (``course``) imports no private name across its modules either, and the grader
builds no class behind a module-level ``__getattr__`` (nbgrader loads plain classes by name).

The layers, bottom to top, are the architecture in one table: a new module takes its place here,
and may import only from its own layer (without a cycle) or from the layers below."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "llmcore"

LAYERS = {
    "foundations": ["device", "shapes", "masks", "storage", "timing", "peak_memory", "published",
                    "scalar", "reference", "testing", "tokenizer", "corpus", "batching"],
    "operations": ["softmax", "matmul", "norm", "rope", "attention", "multihead", "ffn", "moe",
                   "tiled", "backward", "parallel", "sampling", "quantize", "onerow", "lowbit",
                   "onerow_step"],
    "caches": ["layout", "cache", "kvcache", "prefix", "block_allocator", "paged_batch",
               "paged"],
    "models": ["decoder", "model", "llama", "parameters", "checkpoint", "attention_probe",
               "pretrained"],
    "generation": ["decode", "fastpath", "generate", "serving", "train", "lora", "speculative"],
}
"""Bottom to top: shapes and tools; the operations, each in its rungs; where keys and values are
kept; the models that compose them; generation, which runs a model step by step."""

LAYER_OF = {f"llmcore.{name}": i for i, names in enumerate(LAYERS.values()) for name in names}


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(source: str, name: str, is_package: bool = False, *,
               package_dir: Path = PACKAGE) -> list[tuple[str, str, int]]:
    """(module, imported name or "", line) for every import of a module of the package in
    ``package_dir`` (llmcore by default) in ``source``, the source of module ``name``; relative
    imports resolved."""
    top = package_dir.name
    package = name if is_package else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                submodule = f"{module}.{alias.name}"
                if submodule in LAYER_OF or Path(package_dir.parent, *submodule.split(".")).is_dir() \
                        or Path(package_dir.parent, *submodule.split(".")).with_suffix(".py").is_file():
                    found.append((submodule, "", node.lineno))      # from . import x
                else:
                    found.append((module, alias.name, node.lineno))
        elif isinstance(node, ast.Import):
            found += [(alias.name, "", node.lineno) for alias in node.names]
    return [(m, n, line) for m, n, line in found if m == top or m.startswith(f"{top}.")]


def graph(root: Path = PACKAGE) -> dict[str, list[tuple[str, str, int]]]:
    """Each module of the package in ``root`` -> its imports of the package's modules."""
    return {module_name(path, root): imports_of(path.read_text(encoding="utf-8"),
                                                module_name(path, root),
                                                path.name == "__init__.py", package_dir=root)
            for path in sorted(root.rglob("*.py"))}


def private_imports(imports: list[tuple[str, str, int]], module: str) -> list[str]:
    """The imports of private names (``_x``, or from a ``_module``) of modules other than
    ``module`` itself."""
    return [f"{target}.{name} (line {line})" for target, name, line in imports
            if (name.startswith("_") or any(part.startswith("_") and part != "__init__"
                                            for part in target.split(".")))
            and target != module]


def home(module: str, layer_of: dict[str, int] = LAYER_OF) -> str:
    """The module an import lands in, as LAYERS (or another table's ``layer_of``) names it: a
    listed subpackage none of whose modules is listed holds its modules (llmcore.pretrained,
    course.figures); any other module is itself."""
    name = module
    while name not in layer_of and name.count(".") > 1:
        name = name.rpartition(".")[0]
    listed_inside = any(other.startswith(f"{name}.") for other in layer_of)
    return name if name == module or (name in layer_of and not listed_inside) else module


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph, as a path that returns to its start, or None."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        path.pop()
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


GRAPH = graph()
MODULES = sorted(m for m in GRAPH if m != "llmcore")


def test_every_module_has_a_layer():
    unplaced = [m for m in MODULES if home(m) not in LAYER_OF]
    assert not unplaced, f"modules missing from LAYERS (give each its layer): {unplaced}"
    stale = sorted(set(LAYER_OF) - {home(m) for m in MODULES})
    assert not stale, f"LAYERS names modules that do not exist: {stale}"


def test_no_import_cycle():
    edges = {m: {home(target) for target, _, _ in GRAPH[m]} - {home(m)} for m in MODULES}
    cycle = find_cycle(edges)
    assert cycle is None, f"an import cycle in llmcore: {' -> '.join(cycle)}"


@pytest.mark.parametrize("module", MODULES)
def test_imports_point_down_or_across(module):
    upward = [f"{target} (line {line})" for target, _, line in GRAPH[module]
              if target == "llmcore" or LAYER_OF[home(target)] > LAYER_OF[home(module)]]
    assert not upward, (f"{module} ({list(LAYERS)[LAYER_OF[home(module)]]}) imports from a "
                        f"layer above it or the package itself: {upward}")


@pytest.mark.parametrize("module", MODULES)
def test_no_private_name_is_imported_from_another_module(module):
    private = [item for item in private_imports(GRAPH[module], module)
               if home(item.partition(" ")[0].rpartition(".")[0]) != home(module)]
    assert not private, f"{module} imports private names of other modules: {private}"


COURSE = PACKAGE.parent / "course"
COURSE_GRAPH = graph(COURSE)


@pytest.mark.parametrize("module", sorted(COURSE_GRAPH))
def test_the_course_tooling_imports_no_private_name_across_modules(module):
    private = private_imports(COURSE_GRAPH[module], module)
    assert not private, f"{module} imports private names of other modules: {private}"


def module_getattr_lines(source: str) -> list[int]:
    """Lines of a module-level ``def __getattr__`` (a module attribute built on first access)."""
    return [node.lineno for node in ast.parse(source).body
            if isinstance(node, ast.FunctionDef) and node.name == "__getattr__"]


@pytest.mark.parametrize("path", sorted((COURSE / "grading").glob("*.py")), ids=lambda p: p.name)
def test_the_grader_builds_no_class_behind_a_module_getattr(path):
    lines = module_getattr_lines(path.read_text(encoding="utf-8"))
    assert not lines, (f"{path.name}:{lines}: a module-level __getattr__; give nbgrader a plain "
                       "class (course/grading/executor.py)")


# -- the course's tooling and the exercises' harness: a layers table each, the same rules ---------
COURSE_LAYERS = {
    "book tools": ["topics_corpus", "figures", "sphinx_course", "site", "launch", "ship", "lab"],
    "grading parts": ["grading.cells", "grading.secret", "grading.integrity", "grading.review",
                      "grading.sandbox", "grading.exchange", "grading.edition", "grading.hidden",
                      "grading.feedback", "grading.progress"],
    "running and judging": ["grading.executor", "grading.verdicts", "grading.judging",
                            "grading.profiling", "grading.standby"],
    "nbgrader": ["grading.nbgrader_app", "grading.report"],
    "audiences": ["grading.check", "grading.release", "grading.worker", "grading.preload",
                  "grading.workers", "grading.grade",
                  "grading.authoring"],
    "commands": ["grading", "grading.cli", "grading.__main__", "hub", "bench", "installed"],
}
"""Bottom to top: the book's own tools; the grader's parts that need no other (nbgrader's cell
metadata, the run's secret, the sandbox, the integrity protocol, review evidence, feedback
pages, the progress bar); a notebook run (and timed) and judged; nbgrader's applications and the
gradebook; one module per audience (the learner's check, release, one submission's worker, the
class's grade, authoring); the commands, the hub, the benchmarks and the install check.
``course.figures`` and ``course.bench`` are units."""

LLMCHECK_LAYERS = {
    "formats": ["identity", "record", "tree"],
    "kernel state": ["audit", "fresh", "integrity", "scope", "seal"],
    "op families and policies": ["families", "policy", "policies"],
    "recording": ["blocking", "recorder"],
    "test cases": ["cases"],
}
"""Bottom to top: the record both sides read (no torch) and the walk over nested tensors; the
kernel's audit hook, the cell's secret and the harness's state at start; the families of aten ops
and the exercises' policies; the op recorder and NumPy's blocking; ``Test``, what a test cell
calls."""

LAYERED = {package: ({f"{package}.{name}": i for i, names in enumerate(layers.values())
                      for name in names}, layers, graph(PACKAGE.parent / package))
           for package, layers in {"course": COURSE_LAYERS, "llmcheck": LLMCHECK_LAYERS}.items()}
"""package -> (module -> its layer's index, the layers table, the package's import graph)."""


def upward_imports(package: str, module: str) -> list[str]:
    """The imports of ``module`` from a layer above its own or from the package itself."""
    layer_of, _, imports = LAYERED[package]
    return [f"{target} (line {line})" for target, _, line in imports[module]
            if target == package or layer_of.get(home(target, layer_of), -1)
            > layer_of[home(module, layer_of)]]


@pytest.mark.parametrize("package", sorted(LAYERED))
def test_every_course_and_harness_module_has_a_layer(package):
    layer_of, _, imports = LAYERED[package]
    modules = [m for m in imports if m != package]
    unplaced = [m for m in modules if home(m, layer_of) not in layer_of]
    assert not unplaced, f"{package} modules missing from its layers table: {unplaced}"
    stale = sorted(set(layer_of) - {home(m, layer_of) for m in modules})
    assert not stale, f"{package}'s layers table names modules that do not exist: {stale}"


@pytest.mark.parametrize("package", sorted(LAYERED))
def test_no_import_cycle_in_the_course_or_the_harness(package):
    layer_of, _, imports = LAYERED[package]
    edges: dict[str, set[str]] = {}
    for module in [m for m in imports if m != package]:
        edges.setdefault(home(module, layer_of), set()).update(
            {home(target, layer_of) for target, _, _ in imports[module]}
            - {home(module, layer_of)})
    cycle = find_cycle(edges)
    assert cycle is None, f"an import cycle in {package}: {' -> '.join(cycle)}"


@pytest.mark.parametrize("package, module", [(p, m) for p in sorted(LAYERED)
                                             for m in sorted(LAYERED[p][2]) if m != p])
def test_course_and_harness_imports_point_down_or_across(package, module):
    layer_of, layers, _ = LAYERED[package]
    upward = upward_imports(package, module)
    assert not upward, (f"{module} ({list(layers)[layer_of[home(module, layer_of)]]}) imports "
                        f"from a layer above it or the package itself: {upward}")


@pytest.mark.parametrize("module", sorted(LAYERED["llmcheck"][2]))
def test_the_harness_imports_no_private_name_across_modules(module):
    private = private_imports(LAYERED["llmcheck"][2][module], module)
    assert not private, f"{module} imports private names of other modules: {private}"


# -- the checks can fail ------------------------------------------------------------------------
def test_a_cycle_is_found_and_a_chain_is_not():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_function_level_relative_and_private_imports_are_all_seen():
    source = ("from .shapes import check_shape\n"
              "def f():\n"
              "    from .generate import _hidden\n"
              "    import llmcore.model\n")
    assert imports_of(source, "llmcore.sampling") == [
        ("llmcore.shapes", "check_shape", 1), ("llmcore.generate", "_hidden", 3),
        ("llmcore.model", "", 4)]
    assert imports_of("from ..model import GPT\n", "llmcore.pretrained.x") == [
        ("llmcore.model", "GPT", 1)]
    assert imports_of("from .model import GPT\n", "llmcore.pretrained", is_package=True) == [
        ("llmcore.pretrained.model", "GPT", 1)]


def test_private_imports_and_module_getattr_are_seen():
    source = ("from .report import _rows, GradeRow\n"
              "def f():\n"
              "    from .nbgrader_app import _quiet\n"
              "    from . import _helpers\n")
    found = imports_of(source, "course.grading.grade", package_dir=COURSE)
    assert private_imports(found, "course.grading.grade") == [
        "course.grading.report._rows (line 1)", "course.grading.nbgrader_app._quiet (line 3)",
        "course.grading._helpers (line 4)"]
    assert module_getattr_lines("x = 1\ndef __getattr__(name):\n    return name\n") == [2]
    assert module_getattr_lines("class A:\n    def __getattr__(self, name):\n        pass\n") == []


def test_a_unit_holds_its_modules_and_a_package_with_listed_modules_does_not():
    layer_of = {"course.figures": 0, "course.grading": 1, "course.grading.cells": 0}
    assert home("course.figures.common", layer_of) == "course.figures"
    assert home("course.grading", layer_of) == "course.grading"
    assert home("course.grading.new", layer_of) == "course.grading.new"      # unplaced
    assert home("course.grading.cells", layer_of) == "course.grading.cells"
