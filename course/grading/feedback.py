"""Feedback pages a learner may read: each test's name, points and message, never the hidden
tests' source, and math rendered without a network or a script.

Both are plug-ins of nbgrader's own ``GenerateFeedback``, named in ``nbgrader_config.py`` (so the
hub's formgrader and ``nbgrader generate_feedback`` write the page course-grade writes, and
course-grade sets the same two in :func:`course.grading.nbgrader_app.course_config`):
:class:`HideHiddenTests`, an nbconvert preprocessor, and :class:`FeedbackExporter`, nbgrader's
HTML exporter whose page goes through :func:`offline_math`: the CDN MathJax of nbgrader's
feedback template removed, every formula rendered as MathML (latex2mathml), which browsers
display natively, and the inlined Bootstrap cut to what the page uses: a page of a few tens of
kB (nbgrader's own is 160-180 kB and loads MathJax from a CDN; an inlined MathJax made each one
2.2 MB).
"""

from __future__ import annotations

import html
import re
from pathlib import Path

from nbconvert.exporters import HTMLExporter
from nbconvert.preprocessors import Preprocessor
from traitlets import Bool

HIDDEN_MARK = "### BEGIN HIDDEN TESTS"
HIDDEN_NOTE = "# Hidden tests: their code is not shown. Their result is below."


class HideHiddenTests(Preprocessor):
    """In a feedback page, a test cell with hidden tests keeps its visible part and its score;
    the hidden code is replaced by a note, and an error keeps its type and message only (a
    traceback would quote the hidden code)."""

    enabled = Bool(True).tag(config=True)

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "code" and HIDDEN_MARK in cell.source:
            cell.source = cell.source.split(HIDDEN_MARK)[0].rstrip() + "\n" + HIDDEN_NOTE
            for out in cell.get("outputs", []):
                if out.output_type == "error":
                    out.traceback = [f"{out.ename}: {out.evalue}"]
        return cell, resources


_MATHJAX_BLOCK = re.compile(r"<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->"
                            r"|<!-- Loading mathjax macro -->", re.S)
_VERBATIM = re.compile(r"(<(pre|code|script|style|textarea)\b.*?</\2\s*>)", re.S | re.I)
_TAG = re.compile(r"(<[^>]*>)")
_MATH = re.compile(r"\$\$(?P<display>.+?)\$\$|\\\[(?P<bracket>.+?)\\\]"
                   r"|\\\((?P<paren>.+?)\\\)|(?<![\\$])\$(?P<inline>[^$]+?)(?<!\\)\$", re.S)
"""TeX as nbconvert leaves it in a page's Markdown: $$...$$ and \\[...\\] (display), $...$ and
\\(...\\) (inline); an escaped \\$ is a dollar sign."""


def tex_to_mathml(tex: str, *, display: bool) -> str:
    """MathML for one formula (latex2mathml), which browsers render natively: no script."""
    from latex2mathml.converter import convert
    return convert(tex.strip(), display="block" if display else "inline")


def _convert_text(text: str, failures: list[str]) -> str:
    def replace(match):
        display = match.group("display") or match.group("bracket")
        tex = display if display is not None else match.group("paren") or match.group("inline")
        try:
            return tex_to_mathml(html.unescape(tex), display=display is not None)
        except Exception:                       # noqa: BLE001 (an unsupported macro: keep the TeX)
            failures.append(html.unescape(tex))
            return match.group(0)
    return _MATH.sub(replace, text)


def render_math(page: str) -> tuple[str, list[str]]:
    """The page with every formula of its Markdown rendered as MathML (code, preformatted output,
    scripts and styles untouched), and the formulas left as TeX because they could not be
    converted."""
    failures: list[str] = []
    pieces = _VERBATIM.split(page)
    out = []
    for index, piece in enumerate(pieces):
        if index % 3 == 2:
            continue                            # the tag name captured by _VERBATIM
        if index % 3 == 1:
            out.append(piece)                   # verbatim: code, outputs, scripts, styles
            continue
        parts = _TAG.split(piece)
        out.append("".join(part if i % 2 else _convert_text(part, failures)
                           for i, part in enumerate(parts)))
    return "".join(out), failures


_STYLE = re.compile(r"(<style[^>]*>)(.*?)(</style>)", re.S | re.I)
_CLASS_ATTR = re.compile(r"""\bclass\s*=\s*["']([^"']*)["']""", re.I)
_ID_ATTR = re.compile(r"""\bid\s*=\s*["']([^"']*)["']""", re.I)
_IGNORED_IN_SELECTOR = re.compile(r":not\([^)]*\)|\[[^\]]*\]|::?[\w-]+(\([^)]*\))?")


def _blocks(css: str):
    """(prelude, body) of each top-level statement of a stylesheet (comments dropped); body is
    None for a statement without braces (@import, @charset)."""
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    at, n = 0, len(css)
    while at < n:
        brace, semi = css.find("{", at), css.find(";", at)
        if brace < 0 or (0 <= semi < brace and css[at:semi].strip().startswith("@")):
            end = semi if semi >= 0 else n
            if css[at:end].strip():
                yield css[at:end].strip(), None
            at = end + 1
            continue
        depth, i = 1, brace + 1
        while i < n and depth:
            depth += {"{": 1, "}": -1}.get(css[i], 0)
            i += 1
        yield css[at:brace].strip(), css[brace + 1:i - 1]
        at = i


def _may_match(selector: str, classes: set[str], ids: set[str]) -> bool:
    bare = _IGNORED_IN_SELECTOR.sub("", selector)
    return (all(c in classes for c in re.findall(r"\.([\w-]+)", bare))
            and all(i in ids for i in re.findall(r"#([\w-]+)", bare)))


def prune_css(css: str, classes: set[str], ids: set[str]) -> str:
    """The rules of ``css`` that may apply to a page with these classes and ids: a rule is kept
    when one of its selectors names only classes and ids the page has (elements, attributes and
    pseudo-classes are assumed to match); @media blocks are pruned inside; a font face is kept
    only for a family the kept rules use."""
    kept = []
    for prelude, body in _blocks(css):
        if body is None:
            kept.append(prelude + ";")
        elif prelude.startswith("@media") or prelude.startswith("@supports"):
            inner = prune_css(body, classes, ids)
            if inner:
                kept.append(f"{prelude}{{{inner}}}")
        elif prelude.startswith("@"):
            kept.append((prelude, body))
        elif any(_may_match(s, classes, ids) for s in prelude.split(",")):
            kept.append(f"{prelude}{{{body}}}")
    text = "".join(k for k in kept if isinstance(k, str))
    out = []
    for k in kept:
        if isinstance(k, tuple):
            prelude, body = k
            family = re.search(r"font-family\s*:\s*['\"]?([^;'\"]+)", body)
            if prelude.startswith("@font-face") and family and family.group(1) not in text:
                continue
            out.append(f"{prelude}{{{body}}}")
        else:
            out.append(k)
    return "\n".join(out)


def prune_styles(page: str) -> str:
    """The page with each stylesheet cut to the rules that may apply to it (nbgrader's feedback
    template inlines all of Bootstrap 3, 117 kB, of which a page uses a few kB)."""
    classes = {c for attr in _CLASS_ATTR.findall(page) for c in attr.split()}
    ids = set(_ID_ATTR.findall(page))
    return _STYLE.sub(lambda m: m.group(1) + "\n" + prune_css(m.group(2), classes, ids) + "\n"
                      + m.group(3), page)


def offline_math(page: str) -> str:
    """The page without nbgrader's CDN MathJax, its formulas rendered as MathML and its styles cut
    to what it uses: a page of a few tens of kB that shows its math offline, with no script."""
    return prune_styles(render_math(_MATHJAX_BLOCK.sub("", page))[0])


class FeedbackExporter(HTMLExporter):
    """nbgrader's feedback exporter (an ``HTMLExporter`` with its ``feedback`` template, which
    GenerateFeedback configures) whose page is finished by :func:`offline_math` before nbgrader
    writes it. ``c.GenerateFeedback.exporter_class`` names it: GenerateFeedback's one
    configurable step that sees every page it writes (its writer is fixed, and its
    ``post_convert_hook`` is told neither the pages nor, for a whole class, the student)."""

    def from_notebook_node(self, nb, resources=None, **kw):
        page, resources = super().from_notebook_node(nb, resources=resources, **kw)
        return offline_math(page), resources


def write_failure_pages(folder: Path, notebooks: list[str], student: str, assignment: str,
                        reason: str) -> None:
    """In ``folder``, a feedback page for each notebook (by name) of a submission that could not
    be run to the end, with the reason (course-grade's record step writes them, the one place)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in sorted(notebooks):
        (folder / f"{name}.html").write_text(
            "<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>Feedback</title></head>"
            f"<body>\n<h1>{html.escape(assignment)}: {html.escape(student)}</h1>\n"
            "<p>Your notebook could not be run to the end, so every test scored 0. The grader "
            f"reported: <code>{html.escape(reason)}</code></p>\n"
            "<p>Run <code>course-check NOTEBOOK</code> on your notebook to see "
            "what goes wrong, then submit it again.</p>\n</body></html>\n", encoding="utf-8")
