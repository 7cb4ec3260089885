"""Every ``literalinclude`` in the chapters names a file that exists and, with ``:pyobject:``, an
object defined in it: a rename in llmcore fails here, in seconds, instead of in the book build."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DIRECTIVE = re.compile(r"^```\{literalinclude\}\s+(?P<path>\S+)\s*\n(?P<options>(?::[^\n]*\n)*)",
                       re.MULTILINE)


def includes() -> list[tuple[str, Path, str | None]]:
    """(where, included file, pyobject or None) for every literalinclude of every chapter."""
    found = []
    for chapter in sorted((ROOT / "chapters").glob("*.md")):
        text = chapter.read_text(encoding="utf-8")
        for match in DIRECTIVE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            options = dict(re.findall(r"^:(\w+):\s*(.*)$", match["options"], re.MULTILINE))
            found.append((f"{chapter.name}:{line}", (chapter.parent / match["path"]).resolve(),
                          options.get("pyobject")))
    return found


def defined_objects(source: str) -> set[str]:
    """Dotted names of the module's top-level functions and classes and the classes' members,
    as Sphinx's ``:pyobject:`` spells them (``f``, ``Class``, ``Class.method``)."""
    names = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            if isinstance(node, ast.ClassDef):
                names |= {f"{node.name}.{item.name}" for item in node.body
                          if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return names


INCLUDES = includes()


def test_the_chapters_include_code():
    assert len(INCLUDES) >= 50, "the chapters show their code with literalinclude"


@pytest.mark.parametrize("where, path, pyobject", INCLUDES, ids=[w for w, _, _ in INCLUDES])
def test_each_include_names_a_real_file_and_object(where, path, pyobject):
    assert path.is_file(), f"{where}: literalinclude of {path}, which does not exist"
    if pyobject is not None:
        names = defined_objects(path.read_text(encoding="utf-8"))
        assert pyobject in names, (f"{where}: :pyobject: {pyobject} is not defined in "
                                   f"{path.relative_to(ROOT)}")


def test_a_missing_object_is_caught():
    """The check itself can fail: a name that is not there is not found."""
    source = (ROOT / "llmcore" / "masks.py").read_text(encoding="utf-8")
    assert "causal_mask" in defined_objects(source)
    assert "causal_mask_v2" not in defined_objects(source)
