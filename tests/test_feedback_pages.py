"""Feedback pages render their math at generation time (MathML) and stay small (issue 24): an
inlined MathJax made each page 2.2 MB. A page is built from each solution notebook with nbgrader's
own feedback template (as GenerateFeedback builds it), then finished by
course.grading.feedback; the last test opens one in headless Chromium, offline."""

from __future__ import annotations

import os
import re
import shutil

import nbformat
import pytest

from classroom import ROOT
from course.grading import feedback

nbgrader = pytest.importorskip("nbgrader", reason="feedback pages are nbgrader's (instructor)")

SOLUTIONS = sorted(ROOT.glob("solutions/*/*.ipynb"))
PAGE_LIMIT = 200_000


def raw_feedback_page(path) -> str:
    """The page nbgrader's GenerateFeedback writes for a notebook (its template, its Bootstrap,
    MathJax from the CDN; hidden tests' code hidden by the course's preprocessor), before the
    course finishes it."""
    from nbconvert import HTMLExporter
    base = os.path.join(os.path.dirname(nbgrader.__file__), "server_extensions", "formgrader")
    exporter = HTMLExporter(
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
