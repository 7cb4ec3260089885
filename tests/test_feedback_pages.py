"""Feedback pages render their math at generation time (MathML) and stay small (issue 24): an
inlined MathJax made each page 2.2 MB. A page is built from each solution notebook with nbgrader's
own feedback template (as GenerateFeedback builds it), then finished by
course.grading.feedback; one test opens one in headless Chromium, offline. The last one grades a
submission and has nbgrader's own GenerateFeedback (as the hub's formgrader runs it, with the
course's nbgrader_config.py) write its page: the same page as course-grade's (issue 29)."""

from __future__ import annotations

import html
import os
import re
import shutil

import nbformat
import pytest

from classroom import ROOT, new_course, submission, submit
from course import grading
from course.grading import feedback

nbgrader = pytest.importorskip("nbgrader", reason="feedback pages are nbgrader's (instructor)")

SOLUTIONS = sorted(ROOT.glob("solutions/*/*.ipynb"))
PAGE_LIMIT = 200_000


def raw_feedback_page(path, exporter_class=None) -> str:
    """The page nbgrader's GenerateFeedback writes for a notebook (its template, its Bootstrap,
    MathJax from the CDN; hidden tests' code hidden by the course's preprocessor) with nbconvert's
    HTMLExporter, before the course finishes it (or with ``exporter_class``)."""
    from nbconvert import HTMLExporter
    base = os.path.join(os.path.dirname(nbgrader.__file__), "server_extensions", "formgrader")
    exporter = (exporter_class or HTMLExporter)(
        template_name="feedback", extra_template_basedirs=[os.path.join(base, "templates")],
        extra_template_paths=[os.path.join(base, "static", "node_modules", "bootstrap", "dist",
                                           "css")])
    nb, _ = feedback.HideHiddenTests().preprocess(nbformat.read(path, as_version=4), {})
    points = 0.0
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader")
        if meta:
            meta.setdefault("points", 0)
            meta.update(score=meta["points"], comment=None)
            points += float(meta["points"]) if meta.get("grade") else 0.0
    resources = {"nbgrader": {"notebook": path.stem, "score": points, "max_score": points,
                              "late_penalty": 0}}
    return exporter.from_notebook_node(nb, resources=resources)[0]


def markdown_formulas(path) -> int:
    """How many formulas the notebook's Markdown cells hold ($...$, $$...$$)."""
    text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells
                     if c.cell_type == "markdown")
    text = re.sub(r"`[^`]*`", "", text)                         # code spans hold no math
    return len(re.findall(r"\$\$.+?\$\$|(?<![\\$])\$[^$]+?(?<!\\)\$", text, re.S))


@pytest.fixture(scope="module")
def pages():
    return {path.parent.name: raw_feedback_page(path) for path in SOLUTIONS}


def test_every_formula_becomes_mathml_and_the_page_is_small(pages):
    assert len(pages) == len(SOLUTIONS) >= 8
    for path in SOLUTIONS:
        raw = pages[path.parent.name]
        assert "<!-- Load mathjax -->" in raw and len(raw) > 100_000   # nbgrader's, untouched
        page, failures = feedback.render_math(raw)
        assert failures == [], f"{path.parent.name}: could not convert {failures[:3]}"
        done = feedback.offline_math(raw)
        wanted = markdown_formulas(path)
        assert wanted > 5 and done.count("<math") == wanted, (path.parent.name, wanted)
        assert "<script" not in done and "mathjax" not in done.lower(), path.parent.name
        assert len(done.encode()) < PAGE_LIMIT, f"{path.parent.name}: {len(done.encode())} bytes"
        print(f"{path.parent.name}: {len(raw.encode()) / 1e3:.0f} kB from nbgrader's template, "
              f"{len(done.encode()) / 1e3:.0f} kB finished, {wanted} formulas")


def test_the_course_exporter_writes_the_finished_page(pages):
    """GenerateFeedback's exporter in nbgrader_config.py writes the finished page itself."""
    path = SOLUTIONS[0]
    page = raw_feedback_page(path, feedback.FeedbackExporter)
    assert page == feedback.offline_math(pages[path.parent.name])


def test_nbgrader_config_and_course_grade_give_feedback_alike(tmp_path):
    """nbgrader_config.py (nbgrader's GenerateFeedback, the hub's formgrader) names the feedback
    pipeline course-grade sets."""
    from traitlets.config.loader import PyFileConfigLoader
    from traitlets.utils.importstring import import_item

    from course.grading.nbgrader_app import course_config
    named = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()
    (tmp_path / "nbgrader_config.py").write_text("")
    course = course_config(tmp_path, config_file=tmp_path / "nbgrader_config.py")
    steps, exporters = [], []
    for config in (named, course):
        steps.append([import_item(p) if isinstance(p, str) else p
                      for p in config.GenerateFeedback.preprocessors])
        exporters.append(import_item(config.GenerateFeedback.exporter_class))
    assert steps[0] == steps[1] and steps[0][-1] is feedback.HideHiddenTests, steps
    assert exporters == [feedback.FeedbackExporter] * 2


def test_code_and_outputs_keep_their_dollars():
    page = ('<p>cost $O(n^2)$ and \\(x\\)</p><pre>echo "$HOME costs $5"</pre>'
            '<code>$a$</code><p>a price: 5 \\$ and 6 \\$</p>')
    done, failures = feedback.render_math(page)
    assert failures == [] and done.count("<math") == 2
    assert '<pre>echo "$HOME costs $5"</pre>' in done and "<code>$a$</code>" in done
    assert "5 \\$ and 6 \\$" in done


def test_prune_css_keeps_what_the_page_can_use():
    css = """/* Bootstrap */ .panel{border:1px} .carousel{x:1} .panel .badge{y:2}
    a:hover,.nav>li{color:red} #toc li{z:3} #gone{z:4} [class*="col-"]{w:1}
    .btn:not(.active){q:1} @media (min-width:768px){.panel{m:1}.navbar{m:2}}
    @font-face{font-family:'Glyphicons Halflings';src:url(x.woff)}"""
    kept = feedback.prune_css(css, classes={"panel", "btn"}, ids={"toc"})
    for rule in (".panel{border:1px}", "a:hover,.nav>li{color:red}", "#toc li{z:3}",
                 '[class*="col-"]{w:1}', ".btn:not(.active){q:1}",
                 "@media (min-width:768px){.panel{m:1}}"):
        assert rule in kept, (rule, kept)
    for gone in (".carousel", ".badge", "#gone", ".navbar", "Glyphicons"):
        assert gone not in kept, (gone, kept)


@pytest.mark.slow
def test_a_finished_page_shows_its_math_offline_in_chromium(pages, tmp_path):
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Chromium is not installed (`make browser` installs it as root)")
    name = "08_backward" if "08_backward" in pages else sorted(pages)[-1]
    page_file = tmp_path / "feedback.html"
    page_file.write_text(feedback.offline_math(pages[name]), encoding="utf-8")
    requested = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        try:
            tab = browser.new_page(viewport={"width": 1280, "height": 900})
            tab.on("request", lambda r: requested.append(r.url))
            tab.goto(page_file.as_uri())
            shown = tab.evaluate("""() => [...document.querySelectorAll('math')].map(m => {
                const r = m.getBoundingClientRect();
                return [getComputedStyle(m).display, r.width, r.height]; })""")
            text = tab.evaluate("document.body.innerText")
        finally:
            browser.close()
    assert requested == [page_file.as_uri()], requested          # nothing else fetched
    assert len(shown) == markdown_formulas(next(p for p in SOLUTIONS if p.parent.name == name))
    for display, width, height in shown:
        assert display in ("math", "block math") and width > 0 and height > 0, shown
    assert "$" not in re.sub(r"\d", "", text.split("Test cell")[0])   # no TeX left in the prose


def formgrader_api(course):
    """nbgrader's API as the hub's formgrader makes it: the course's nbgrader_config.py, plus the
    HTMLExporter settings of the formgrader's own pages (FormgradeExtension.build_extra_config)."""
    from nbgrader.apps.api import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from nbgrader.server_extensions.formgrader import handlers
    from traitlets.config.loader import PyFileConfigLoader
    config = PyFileConfigLoader("nbgrader_config.py", path=str(course)).load_config()
    config.HTMLExporter.template_name = "formgrade"
    config.HTMLExporter.extra_template_basedirs = [handlers.template_path]
    return NbGraderAPI(CourseDirectory(config=config), config=config)


def hidden_lines(path) -> list[str]:
    """The lines of a notebook's hidden tests that its release does not show elsewhere."""
    released = (ROOT / "exercises" / path.parent.name / path.name).read_text()
    lines = []
    for cell in nbformat.read(path, as_version=4).cells:
        if feedback.HIDDEN_MARK in cell.source:
            block = cell.source.split(feedback.HIDDEN_MARK)[1].split("### END HIDDEN TESTS")[0]
            lines += [line.strip() for line in block.splitlines()
                      if len(line.strip()) > 20 and line.strip() not in released]
    return lines


@pytest.mark.slow
def test_nbgraders_own_generate_feedback_writes_the_course_page(tmp_path):
    """The hub's "Generate Feedback" (nbgrader's GenerateFeedback through its API, configured
    by the course's nbgrader_config.py) writes the page course-grade writes: small, its math as
    MathML, no script from a CDN, no hidden test's code."""
    from course.grading import sandbox
    if sandbox.sandbox_problem() is not None:
        pytest.skip(f"no sandbox here: {sandbox.sandbox_problem()}")
    solution = ROOT / "solutions" / "01_matmul" / "matmul.ipynb"
    course = new_course(tmp_path / "course")
    submit(course, "learner", "01_matmul", submission("01_matmul", answered=False))
    grading.grade(course, timeout=60)
    folder = course / "feedback" / "learner" / "01_matmul"
    course_page = (folder / "matmul.html").read_text(encoding="utf-8")
    shutil.rmtree(folder)

    result = formgrader_api(course).generate_feedback("01_matmul", "learner")
    assert result["success"], result.get("error") or result.get("log")
    page_file = folder / "matmul.html"
    assert page_file.is_file(), result.get("log")
    page = page_file.read_text(encoding="utf-8")
    size = len(page.encode())
    print(f"nbgrader's GenerateFeedback: {size / 1e3:.0f} kB, course-grade: "
          f"{len(course_page.encode()) / 1e3:.0f} kB")
    assert size < PAGE_LIMIT, f"{size} bytes"
    assert not re.findall(r"<script[^>]*\bsrc\s*=\s*[\"']?(?:https?:)?//", page, re.I), \
        "the page loads a script from the network"
    assert "mathjax" not in page.lower() and not re.search(r"https?://[^\"'\s]*cdn", page)
    assert page.count("<math") == markdown_formulas(solution) > 5
    assert "BEGIN HIDDEN TESTS" not in page and feedback.HIDDEN_NOTE in page
    shown = html.unescape(page)
    leaked = [line for line in hidden_lines(solution) if line in shown]
    assert hidden_lines(solution) and not leaked, leaked
    assert page == course_page, "course-grade and nbgrader's GenerateFeedback differ"
