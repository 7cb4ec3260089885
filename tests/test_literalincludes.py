"""Every ``literalinclude`` in the chapters names a file that exists and, with ``:pyobject:``, an
object defined in it: a rename in llmcore fails here, in seconds, instead of in the book build.
And every line of code the book shows fits the page: no included line, no line of a code example
and no input line of an executed cell wraps at a 1280 px window (test_browser.py checks the same
in Chromium on the built site)."""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import pytest

from course.site import executed_pages, source_of

ROOT = Path(__file__).resolve().parent.parent
DIRECTIVE = re.compile(r"^(?P<indent>[ \t]*)```\{literalinclude\}\s+(?P<path>\S+)\s*\n"
                       r"(?P<options>(?:(?P=indent):[^\n]*\n)*)", re.MULTILINE)
"""A literalinclude, at the start of a line or indented inside a list item, and its options."""


PAGE_COLUMNS = 76
"""Characters of code one line of the book holds at a 1280 px window, in a listing and in a code
cell's input alike: sphinx-book-theme's article column leaves either block about 653 px inside its
padding, and its 14 px monospace font is 8.43 px wide, so 77 characters fit and the 78th wraps
(measured in Chromium); 76 keeps a column spare for a wider fallback font. A longer line wraps,
and a right-aligned shape comment lands alone at the start of the next line."""

LIST_ITEM_COLUMNS = 72
"""The same inside a list item (an indented directive): the list's margin takes 4 columns."""


def includes(with_options: bool = False) -> list[tuple]:
    """(where, included file, pyobject or None) for every literalinclude of every chapter, and
    when asked its options ({name: value}) and the columns its block holds on the page."""
    found = []
    for chapter in sorted((ROOT / "chapters").glob("*.md")):
        text = chapter.read_text(encoding="utf-8")
        for match in DIRECTIVE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            options = dict(re.findall(r"^[ \t]*:(\w+):[ \t]*(.*)$", match["options"],
                                      re.MULTILINE))
            columns = LIST_ITEM_COLUMNS if match["indent"] else PAGE_COLUMNS
            found.append((f"{chapter.name}:{line}", (chapter.parent / match["path"]).resolve(),
                          options.get("pyobject"),
                          *([options, columns] if with_options else [])))
    return found


def shown_lines(source: str, pyobject: str | None, dedent: bool) -> list[str]:
    """The lines the book shows: the whole file, or the object (decorators included, as Sphinx
    takes them), with the common indentation removed under ``:dedent:``."""
    lines = source.splitlines()
    if pyobject is not None:
        body, node = ast.parse(source).body, None
        for name in pyobject.split("."):
            node = next(n for n in body if getattr(n, "name", None) == name)
            body = getattr(node, "body", [])
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        lines = lines[first - 1:node.end_lineno]
    return textwrap.dedent("\n".join(lines)).splitlines() if dedent else lines


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


@pytest.mark.parametrize("where, path, pyobject, options, columns", includes(with_options=True),
                         ids=[w for w, _, _ in INCLUDES])
def test_each_included_line_fits_the_page(where, path, pyobject, options, columns):
    if not path.is_file():
        pytest.skip("the file is missing (its own test says so)")
    lines = shown_lines(path.read_text(encoding="utf-8"), pyobject, "dedent" in options)
    wide = [f"{len(line)}: {line.strip()[:50]}" for line in lines if len(line) > columns]
    assert not wide, (f"{where}: {len(wide)} line(s) of {pyobject or path.name} wider than the "
                      f"{columns} columns the page shows (wrap them, or move a shape comment "
                      f"onto its own line):\n  " + "\n  ".join(wide))


FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>python|bash)\n(?P<body>.*?)^(?P=indent)```",
                   re.MULTILINE | re.DOTALL)
"""A code example written in a chapter's text (not an executed cell: those are ``{code-cell}``)."""


@pytest.mark.parametrize("chapter", sorted((ROOT / "chapters").glob("*.md")),
                         ids=lambda p: p.name)
def test_each_code_example_fits_the_page(chapter):
    text = chapter.read_text(encoding="utf-8")
    wide = [line.strip()[:50] for match in FENCE.finditer(text)
            for line in match["body"].splitlines()
            if len(line) - len(match["indent"]) >
            (LIST_ITEM_COLUMNS if match["indent"] else PAGE_COLUMNS)]
    assert not wide, f"{chapter.name}: example lines wider than the page shows: {wide}"


CODE_CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(?P<body>.*?)^```[ \t]*$",
                       re.MULTILINE | re.DOTALL)
"""An executed cell of a MyST notebook: its options, then the code the page shows as its input."""


def cell_input_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every input line of every code cell of a MyST notebook, without the
    cell's options (a ``---`` YAML block or ``:key: value`` lines, which the page does not show)."""
    found = []
    for match in CODE_CELL.finditer(text):
        first = text.count("\n", 0, match.start("body")) + 1
        lines = match["body"].splitlines()
        skip = 0
        if lines and lines[0].strip() == "---":
            skip = next((i + 1 for i, line in enumerate(lines[1:], 1) if line.strip() == "---"),
                        0)
        else:
            while skip < len(lines) and re.match(r"^:[\w-]+:", lines[skip]):
                skip += 1
        found += [(first + i, line) for i, line in enumerate(lines) if i >= skip]
    return found


EXECUTED = executed_pages()


def test_the_executed_pages_have_code_cells():
    assert sum(len(cell_input_lines(source_of(p).read_text(encoding="utf-8")))
               for p in EXECUTED) >= 1000, "the chapters' code cells were not found"


@pytest.mark.parametrize("docname", EXECUTED)
def test_each_code_cell_fits_the_page(docname):
    """Every input line of every executed cell fits the page as the listings do: a longer line
    wraps at a 1280 px window (the site's CSS wraps cell code rather than hide its end behind a
    scroll bar), which test_browser.py checks in Chromium."""
    path = source_of(docname)
    if path.suffix != ".md":
        pytest.skip(f"{path.name} is not a MyST notebook")
    wide = [f"{path.relative_to(ROOT)}:{number}: {len(line)} columns: {line.strip()[:50]}"
            for number, line in cell_input_lines(path.read_text(encoding="utf-8"))
            if len(line) > PAGE_COLUMNS]
    assert not wide, (f"{len(wide)} code-cell line(s) wider than the {PAGE_COLUMNS} columns "
                      f"the page shows (wrap them at a bracket, or move a shape comment onto "
                      f"its own line):\n  " + "\n  ".join(wide))


def test_cell_input_lines_leave_out_the_options():
    text = ("# A page\n\n```{code-cell} ipython3\n:tags: [hide-input]\nx = 1\n```\n"
            "text\n```{code-cell} ipython3\n---\ntags: [remove-output]\n---\ny = 2\n"
            "```\n```python\nnot a cell\n```\n")
    assert cell_input_lines(text) == [(5, "x = 1"), (12, "y = 2")]


def test_shown_lines_take_the_object_and_its_dedent():
    source = "import x\n\nclass A:\n    @staticmethod\n    def f():\n        return 1\n"
    assert shown_lines(source, "A.f", dedent=True) == ["@staticmethod", "def f():",
                                                        "    return 1"]
    assert shown_lines(source, "A.f", dedent=False)[0] == "    @staticmethod"
    assert len(shown_lines(source, None, dedent=False)) == 6


def test_a_missing_object_is_caught():
    """The check itself can fail: a name that is not there is not found."""
    source = (ROOT / "llmcore" / "masks.py").read_text(encoding="utf-8")
    assert "causal_mask" in defined_objects(source)
    assert "causal_mask_v2" not in defined_objects(source)
