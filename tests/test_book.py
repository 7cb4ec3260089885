"""The book: the strict build of `make book` succeeds, every page of _toc.yml becomes a page of
the site, nothing is fetched from the network, and nbgrader notebooks are never executed.

The build runs once per session (course/site.py) and test_browser.py reuses it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import jupytext
import pytest
import yaml
from markdown_it import MarkdownIt

from course import site as book_site
from course.site import (HTML_DIR, ROOT, build_book, execution_excluded, html_of, is_remote,
                       read_page, source_of, toc_pages)

pytestmark = pytest.mark.slow

PAGES = toc_pages()
EXECUTED = book_site.executed_pages()

PARTS = {"Foundations": (1, 2), "Attention": (3, 4), "The model": (5, 6),
         "Inference": (7, 8, 9), "Beyond": (10, 11, 12),
         "Fewer bits, fewer parameters": (13, 14), "More tokens, more parameters": (15, 16)}
"""Which chapters each part of the table of contents holds (notes/CHAPTERS.md)."""


@pytest.fixture(scope="session")
def book() -> book_site.BuildResult:
    return build_book()


# ---------------------------------------------------------------------------- the build itself

def test_strict_build_succeeds(book):
    problems = "\n".join(book.problems()[:30])
    assert book.returncode == 0, (
        f"`jupyter-book {' '.join(book_site.STRICT_BUILD)}` failed (exit {book.returncode}) "
        f"after {book.seconds:.0f} s; full log in {book_site.BUILD_LOG}\n"
        f"warnings and errors:\n{problems}\n--- end of the log:\n{book_site.tail(book.log)}")
    print(f"strict book build: {book.seconds:.1f} s")


@pytest.mark.parametrize("docname", PAGES)
def test_every_page_of_the_toc_becomes_html(book, docname):
    page = html_of(docname)
    assert page.is_file(), f"{docname} is in _toc.yml but the build wrote no {page}"
    assert read_page(page).article_h1 == 1, f"{page}: expected exactly one <h1> in the article"


def test_the_index_opens_the_root_page(book):
    index = HTML_DIR / "index.html"
    assert index.is_file(), "the site has no index.html"
    assert f"{PAGES[0]}.html" in index.read_text(encoding="utf-8"), \
        f"index.html does not lead to the root page {PAGES[0]}.html"


# ------------------------------------------------------------------------------ the sources

def level_one_headings(path: Path) -> list[str]:
    """The `# Title` headings of a page's Markdown (fenced code and directives do not count)."""
    notebook = jupytext.read(path)
    md = MarkdownIt("commonmark")
    titles = []
    for cell in notebook.cells:
        if cell.cell_type != "markdown":
            continue
        tokens = md.parse(cell.source)
        for i, token in enumerate(tokens):
            if token.type == "heading_open" and token.tag == "h1":
                titles.append(tokens[i + 1].content)
    return titles


@pytest.mark.parametrize("docname", PAGES)
def test_every_page_has_exactly_one_title(docname):
    titles = level_one_headings(source_of(docname))
    assert len(titles) == 1, f"{docname}: expected exactly one `# Title`, found {titles}"


@pytest.mark.parametrize("docname", EXECUTED)
def test_executed_chapters_carry_the_myst_notebook_header(docname):
    """Without format_name: myst (and a kernelspec) the build shows the code but never runs it."""
    path = source_of(docname)
    if path.suffix != ".md":
        pytest.skip(f"{path.name} is an .ipynb notebook: it needs no jupytext header")
    metadata = jupytext.read(path).metadata
    fmt = metadata.get("jupytext", {}).get("text_representation", {})
    assert fmt.get("format_name") == "myst", f"{path}: the jupytext header must say format_name: myst"
    assert metadata.get("kernelspec", {}).get("name") == "python3", f"{path}: kernelspec python3 missing"


def tracked_chapter_files() -> list[str]:
    """The chapter sources in git (drafts that are not committed yet do not count)."""
    if shutil.which("git") and (ROOT / ".git").exists():
        done = subprocess.run(["git", "ls-files", "chapters"], cwd=ROOT, capture_output=True,
                              text=True, check=True)
        files = done.stdout.split()
    else:
        files = [p.relative_to(ROOT).as_posix() for p in (ROOT / "chapters").iterdir()]
    return sorted(f for f in files if f.endswith((".md", ".ipynb")))


def test_every_committed_chapter_is_in_the_toc():
    """only_build_toc_files would silently leave a chapter out of the site."""
    missing = [f for f in tracked_chapter_files() if Path(f).with_suffix("").as_posix() not in PAGES]
    assert not missing, f"chapters not listed in _toc.yml (so not built): {missing}"


def test_chapters_sit_in_their_parts_in_order():
    toc = yaml.safe_load(book_site.TOC_FILE.read_text(encoding="utf-8"))
    assert toc.get("format") == "jb-book"
    assert toc["root"] == "chapters/00_intro"
    seen = []
    for part in toc.get("parts", []):
        caption = part.get("caption")
        if caption == "Exercises":
            continue
        assert caption in PARTS, f"unexpected part {caption!r}; expected one of {list(PARTS)}"
        assert part.get("numbered") is True, f"part {caption!r}: chapters must be numbered"
        for entry in part["chapters"]:
            match = re.fullmatch(r"chapters/(\d\d)_\w+", entry.get("file", ""))
            assert match, f"part {caption!r}: {entry} is not a chapters/NN_name file"
            number = int(match.group(1))
            assert number in PARTS[caption], f"chapter {number} does not belong in {caption!r}"
            seen.append(number)
    assert seen == sorted(seen), f"chapters out of order in _toc.yml: {seen}"


@pytest.mark.parametrize("docname", [p for p in PAGES if re.fullmatch(r"chapters/\d\d_\w+", p)
                                     and not p.startswith("chapters/00")])
def test_chapter_numbers_in_the_site_match_the_file_names(book, docname):
    """Sphinx numbers chapters by position; a chapter missing from the toc shifts the rest."""
    text = html_of(docname).read_text(encoding="utf-8")
    article = text[text.index('<article class="bd-article"'):]
    number = re.search(r'<h1>\s*<span class="section-number">([\d.]+)\s', article)
    assert number, f"{docname}: its title carries no chapter number"
    assert number.group(1).rstrip(".") == str(int(docname[9:11])), \
        f"{docname} is numbered {number.group(1)} in the site"


# ------------------------------------------------------------------ offline: nothing fetched

def test_pages_fetch_nothing_from_the_network(book):
    pages = sorted(HTML_DIR.rglob("*.html"))
    assert pages, "no HTML pages were built"
    remote = [(p.relative_to(HTML_DIR).as_posix(), tag, url)
              for p in pages for tag, url in read_page(p).resources if is_remote(url)]
    assert not remote, f"pages fetch from the network (must be served from _static): {remote[:10]}"


def test_stylesheets_fetch_nothing_from_the_network(book):
    remote = []
    for css in (HTML_DIR / "_static").rglob("*.css"):
        text = css.read_text(encoding="utf-8", errors="replace")
        for url in re.findall(r"""url\(\s*['"]?([^'")\s]+)""", text) + \
                re.findall(r"""@import\s+['"]([^'"]+)""", text):
            if is_remote(url):
                remote.append((css.relative_to(HTML_DIR).as_posix(), url))
    assert not remote, f"stylesheets fetch fonts or styles from the network: {remote[:10]}"


def test_mathjax_is_bundled_and_loaded_from_static(book):
    script = HTML_DIR / "_static" / "mathjax" / "tex-chtml.js"
    assert script.is_file(), "sphinx-mathjax-offline did not copy MathJax into _static/mathjax"
    with_math = [p for p in PAGES if read_page(html_of(p)).math_nodes]
    assert with_math, "no page has math (the introduction should)"
    for docname in with_math:
        sources = [url for tag, url in read_page(html_of(docname)).resources if tag == "script"]
        assert any(re.search(r"_static/mathjax/tex-chtml\.js", u) for u in sources), \
            f"{docname} has math but does not load _static/mathjax/tex-chtml.js: {sources}"


def test_only_the_configured_launch_buttons(book):
    """JupyterHub and Colab are offered as _config.yml sets them (course/launch.py; their links
    are checked in the browser, test_browser.py); Binder, Deepnote and Thebe (live code from a
    CDN) never are."""
    for docname in PAGES:
        text = html_of(docname).read_text(encoding="utf-8")
        for marker in ("mybinder.org", "deepnote.com", "thebe-launch-button", "btn-launch-"):
            assert marker not in text, f"{docname}: found a launch button ({marker!r})"


def test_the_build_says_why_a_launch_button_is_left_out(book):
    """One line in the build's output for each launch button it leaves out (course/launch.py:
    with _config.yml's placeholder repository or hub, neither Colab nor JupyterHub)."""
    from course.launch import launch_plan
    config = book_site.book_config()
    buttons = config["launch_buttons"]
    plan = launch_plan(config["repository"]["url"], buttons.get("jupyterhub_url", ""),
                       buttons.get("colab_url", ""))
    printed = [line for line in book.log.splitlines() if line.startswith("course.launch:")]
    assert printed == [f"course.launch: {note}" for note in plan.notes], printed


@pytest.mark.parametrize("docname", PAGES)
def test_download_button_serves_the_page_source(book, docname):
    source = source_of(docname)
    target = f"_sources/{docname}{source.suffix}"
    links = read_page(html_of(docname)).links
    assert any(link.endswith(target) for link in links), \
        f"{docname}: no download link to {target}"
    served = HTML_DIR / target
    assert served.is_file() and served.read_bytes() == source.read_bytes(), \
        f"{served} is missing or differs from {source}"


@pytest.mark.parametrize("docname", EXECUTED)
def test_download_button_offers_the_notebook_and_the_page_says_how_to_open_it(book, docname):
    """The theme's download menu lists <page>.ipynb (course.sphinx_course), a notebook with the
    chapter's cells and the python3 kernel; the page tells the reader what to do with it."""
    target = f"_sources/{docname}.ipynb"
    page = html_of(docname)
    assert any(link.endswith(target) for link in read_page(page).links), \
        f"{docname}: no download link to {target}"
    import nbformat
    notebook = nbformat.read(HTML_DIR / target, as_version=4)
    want = [c.source for c in jupytext.read(source_of(docname)).cells if c.cell_type == "code"]
    from course.launch import COLAB_MARKER      # the first cell that installs it on Colab
    got = [c.source for c in notebook.cells
           if c.cell_type == "code" and not c.metadata.get(COLAB_MARKER)]
    assert got == want, f"{target}: not the chapter's code cells"
    assert notebook.metadata.kernelspec.name == "python3", f"{target}: no python3 kernel"
    text = page.read_text(encoding="utf-8")
    assert "Run this chapter" in text and f"<code>{docname}{source_of(docname).suffix}</code>" \
        in text, f"{docname}: no note on opening the notebook in JupyterLab"


def test_repository_button_links_to_the_configured_repository(book):
    """repository.url of _config.yml, or COURSE_REPOSITORY_URL when the build had it set."""
    from course.sphinx_course import repository_url
    url = repository_url(book_site.book_config()["repository"]["url"])
    assert url.startswith("https://"), f"the repository must be a web address, got {url!r}"
    for docname in PAGES:
        links = read_page(html_of(docname)).links
        assert url in links, f"{docname} has no repository button linking to {url}"


def test_repository_address_can_be_set_when_building(monkeypatch):
    """The override itself, on a Sphinx config as Jupyter Book fills it (no build needed)."""
    from types import SimpleNamespace

    from course.sphinx_course import REPOSITORY_VARIABLE, _set_repository
    config = SimpleNamespace(html_theme_options={"repository_url": "https://example.org/a",
                                                 "use_repository_button": True})
    monkeypatch.delenv(REPOSITORY_VARIABLE, raising=False)
    _set_repository(None, config)
    assert config.html_theme_options["repository_url"] == "https://example.org/a"
    monkeypatch.setenv(REPOSITORY_VARIABLE, "https://git.example.edu/course/llms")
    _set_repository(None, config)
    assert config.html_theme_options == {"repository_url": "https://git.example.edu/course/llms",
                                         "use_repository_button": True}


# -------------------------------------------------------- exercises and solutions: never run

def notebooks_under(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def test_exercise_and_solution_notebooks_are_excluded_from_execution():
    for example in ("exercises/01_matmul/matmul.ipynb", "exercises/notes.ipynb",
                    "solutions/04_kv_cache/kv_cache.ipynb"):
        assert execution_excluded(ROOT / example), f"{example} would be executed by the build"
    assert not execution_excluded(source_of(PAGES[0])), "the root page must be executed"
    for notebook in notebooks_under("exercises") + notebooks_under("solutions"):
        assert execution_excluded(notebook), f"{notebook} would be executed by the build"


def test_only_chapters_were_executed(book):
    """The execution cache holds every executed chapter and nothing from exercises/solutions."""
    from jupyter_cache import get_cache

    cache = get_cache(str(ROOT / book_site.book_config()["execute"]["cache"]))
    records = {Path(r.uri).resolve() for r in cache.list_project_records()}
    executed = {r.uri for r in cache.list_cache_records()}
    assert executed, "the execution cache is empty: were the chapters executed?"
    nbgrader = [r for r in records if r.relative_to(ROOT).parts[0] in ("exercises", "solutions")]
    assert not nbgrader, f"nbgrader notebooks were executed by the build: {nbgrader}"
    for docname in EXECUTED:
        assert source_of(docname).resolve() in records, f"{docname} is not in the execution cache"
    for docname in PAGES:
        if docname.split("/")[0] in ("exercises", "solutions"):
            assert read_page(html_of(docname)).output_nodes == 0, \
                f"{docname} shows cell outputs: it was executed"


def test_solutions_are_not_published(book):
    listed = [p for p in PAGES if p.startswith("solutions/")]
    assert not listed, f"_toc.yml lists solutions: {listed} (only `make book-instructor` may)"
    assert not (HTML_DIR / "solutions").exists(), f"{HTML_DIR / 'solutions'} exists"
    assert not (HTML_DIR / "_sources" / "solutions").exists()


def test_instructor_toc_is_the_student_toc_plus_the_solutions(tmp_path):
    solutions = book_site.solution_pages()
    assert solutions, "_toc.yml lists no exercises, so there is no solution to add"
    toc = book_site.instructor_toc()
    out = tmp_path / "_toc_instructor.yml"
    out.write_text(yaml.safe_dump(toc), encoding="utf-8")
    assert toc_pages(out) == PAGES + solutions
    assert toc["parts"][-1]["caption"] == book_site.SOLUTIONS_CAPTION
    bare = tmp_path / "_toc.yml"
    bare.write_text(f"format: jb-book\nroot: {PAGES[0]}\nparts:\n  - caption: Links\n"
                    "    chapters:\n      - url: https://example.org\n        title: a link\n",
                    encoding="utf-8")
    with pytest.raises(ValueError, match="no exercises"):
        book_site.instructor_toc(bare)


def test_instructor_switch_adds_the_solutions(book):
    """`make book-instructor` builds a separate site with the solution of every listed exercise."""
    solutions = book_site.solution_pages()
    assert solutions, "_toc.yml lists no exercises, so there is no solution to add"
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    instructor = ROOT / "_build" / "instructor"
    shutil.rmtree(instructor, ignore_errors=True)     # no stale page may pass for a new one
    # -o: take the virtual environment as up to date (this test runs inside it)
    done = subprocess.run(["make", "-o", ".venv/.installed", "-o", ".venv/.installed-instructor",
                           "book-instructor"], cwd=ROOT,
                          env=book_site.tool_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=book_site.BUILD_TIMEOUT_S)
    assert done.returncode == 0, f"make book-instructor failed:\n{book_site.tail(done.stdout)}"
    instructor_html = instructor / "_build" / "html"
    for docname in PAGES + solutions:
        page = html_of(docname, instructor_html)
        assert page.is_file(), f"the instructor site has no page for {docname}"
    for docname in solutions:
        assert read_page(html_of(docname, instructor_html)).output_nodes == 0, \
            f"{docname} was executed in the instructor build"
