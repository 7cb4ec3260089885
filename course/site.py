"""The site checks' shared part: the pages of _toc.yml, their sources, and one strict build per
test session (tests/test_book.py, test_browser.py and test_notebooks.py all read from here).

The course directory is the nearest folder, from the working directory up, that holds both
``_config.yml`` and ``_toc.yml`` (``COURSE_DIR`` in the environment overrides it), never the place
this module is installed.

The build is the one ``make book`` runs, ``jupyter-book build . -W -n --keep-going``, into the
same ``_build`` (so the execution cache is reused and only changed chapters run again), plus
``--all``: every page is read again, so a warning that an earlier, failed build already printed
cannot hide behind Sphinx's incremental build. It runs at most once per pytest process.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import yaml



def find_course_root(start: Path | None = None) -> Path:
    """The course directory: ``$COURSE_DIR``, else the nearest of ``start`` (default: the working
    directory) and its parents that holds ``_config.yml`` and ``_toc.yml``."""
    if os.environ.get("COURSE_DIR"):
        return Path(os.environ["COURSE_DIR"]).resolve()
    start = (start or Path.cwd()).resolve()
    for folder in (start, *start.parents):
        if (folder / "_config.yml").is_file() and (folder / "_toc.yml").is_file():
            return folder
    raise FileNotFoundError(f"no course directory (a folder with _config.yml and _toc.yml) at "
                            f"{start} or above it; run from the course or set COURSE_DIR")


ROOT = find_course_root()
CONFIG_FILE = ROOT / "_config.yml"
TOC_FILE = ROOT / "_toc.yml"
BUILD_DIR = ROOT / "_build"
HTML_DIR = BUILD_DIR / "html"
BUILD_LOG = BUILD_DIR / "book-build.log"
SCREENSHOT_DIR = BUILD_DIR / "screenshots"
SOURCE_SUFFIXES = (".md", ".ipynb")
BUILD_TIMEOUT_S = 40 * 60
"""Generous: the whole book executes in about 10 minutes on 2 cores when nothing is cached."""

STRICT_BUILD = ["build", ".", "-W", "-n", "--keep-going", "--all"]
"""Arguments of ``jupyter-book``: the strict build of ``make book``, every page read again."""


def venv_bin() -> Path:
    """The folder of the running Python's scripts (the course's .venv/bin under make)."""
    return Path(sys.executable).parent


def tool(name: str) -> str:
    """Path of a console script installed next to this Python (jupyter-book, jupyter, ...)."""
    path = venv_bin() / name
    if not path.exists():
        raise FileNotFoundError(f"{name} is not installed next to {sys.executable}; "
                                f"run `make venv` (it installs the book's dependencies)")
    return str(path)


def tool_env() -> dict[str, str]:
    """The environment for subprocesses: this Python's scripts first on PATH (kernels, alembic)."""
    env = dict(os.environ)
    env["PATH"] = f"{venv_bin()}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")   # quiet debugger note from kernels
    return env


@functools.cache
def book_config() -> dict:
    return yaml.safe_load(CONFIG_FILE.read_text(encoding="utf-8"))


def toc_pages(toc_file: Path = TOC_FILE) -> list[str]:
    """Every page of a table of contents, root first, in reading order, as docnames
    (paths relative to the repository root without suffix, e.g. ``chapters/00_intro``).

    Parsed with sphinx-external-toc, the parser Jupyter Book itself uses; glob entries are
    expanded like Sphinx does (sorted matching source files). Raises ValueError for a listed
    page with no source file.
    """
    from sphinx_external_toc.api import UrlItem
    from sphinx_external_toc.parsing import parse_toc_yaml

    site_map = parse_toc_yaml(toc_file)
    pages: list[str] = []

    def visit(docname: str) -> None:
        pages.append(docname)
        for subtree in site_map[docname].subtrees:
            for item in subtree.items:
                if isinstance(item, UrlItem):
                    continue
                visit(str(item))

    visit(site_map.root.docname)
    for docname in pages:
        source_of(docname)            # raises for a page without a file
    return pages


def source_of(docname: str) -> Path:
    """The source file of a page: ``<docname>.md`` or ``<docname>.ipynb`` under the root."""
    found = [ROOT / f"{docname}{suffix}" for suffix in SOURCE_SUFFIXES
             if (ROOT / f"{docname}{suffix}").is_file()]
    if len(found) != 1:
        raise ValueError(f"{TOC_FILE.name} lists {docname!r}, expected exactly one source file "
                         f"{docname}.md or {docname}.ipynb, found {[str(p) for p in found]}")
    return found[0]


def html_of(docname: str, html_dir: Path = HTML_DIR) -> Path:
    return html_dir / f"{docname}.html"


def execution_excluded(path: Path) -> bool:
    """Whether the book build skips executing this notebook: myst-nb's own test, the source's
    path matched against each ``execute.exclude_patterns`` entry of _config.yml."""
    patterns = book_config().get("execute", {}).get("exclude_patterns", [])
    posix = PurePosixPath(Path(path).as_posix())
    return any(posix.match(pattern) for pattern in patterns)


def executed_pages() -> list[str]:
    """The pages of _toc.yml that the build executes (chapters, not nbgrader notebooks)."""
    return [p for p in toc_pages() if not execution_excluded(source_of(p))]


def cell_timeout_s() -> int:
    """The per-cell timeout of _config.yml (seconds), shared by the build and test_notebooks."""
    return int(book_config()["execute"]["timeout"])


@dataclass(frozen=True)
class BuildResult:
    returncode: int
    log: str
    seconds: float

    def problems(self) -> list[str]:
        """The WARNING and ERROR lines of the build's output."""
        return [line for line in self.log.splitlines()
                if "WARNING" in line or "ERROR" in line or "CRITICAL" in line]


# --------------------------------------------------------------------------------------------
# The execution cache (jupyter-cache): keyed by myst-nb on each chapter's own code only

EXECUTION_INPUTS = ("llmcore", "course/figures")
"""What every chapter runs besides its own cells (code, the shipped model and its JSON)."""
EXECUTION_KEY_FILE = BUILD_DIR / ".llmcore-hash"


def execution_key(root: Path = ROOT) -> str:
    """A hash of :data:`EXECUTION_INPUTS` (their .py, .safetensors and .json files, in path
    order): a chapter's cached run is only as good as the llmcore it ran with."""
    digest = hashlib.sha256()
    files = [f for folder in EXECUTION_INPUTS for f in (root / folder).rglob("*")
             if f.is_file() and f.suffix in (".py", ".safetensors", ".json")
             and "__pycache__" not in f.parts]
    for path in sorted(files, key=lambda f: f.relative_to(root).as_posix().encode()):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@functools.cache
def _key_of_this_process() -> str:
    """execution_key() once per process: the sources a test run reads do not change under it
    (every chapter's check would otherwise hash llmcore and the shipped model again)."""
    return execution_key()


def cache_folder() -> Path:
    return ROOT / book_config()["execute"]["cache"]


def drop_stale_cache() -> bool:
    """Drop the execution cache when llmcore or the figures changed since it was filled (then
    every chapter runs again); True if it was dropped. ``make book`` and the tests' build call
    it before building, so each cached run was made with the llmcore of EXECUTION_KEY_FILE."""
    key = execution_key()
    if EXECUTION_KEY_FILE.is_file() and EXECUTION_KEY_FILE.read_text().strip() == key:
        return False
    shutil.rmtree(cache_folder(), ignore_errors=True)
    BUILD_DIR.mkdir(exist_ok=True)
    EXECUTION_KEY_FILE.write_text(key + "\n")
    return True


def cached_run(docname: str):
    """The notebook of ``docname`` as the book build executed it (a fresh kernel, top to bottom,
    outputs included), from the execution cache, when the cache holds a run of its current code
    made with the current llmcore; else None."""
    if not EXECUTION_KEY_FILE.is_file() or \
            EXECUTION_KEY_FILE.read_text().strip() != _key_of_this_process():
        return None
    import jupytext
    from jupyter_cache import get_cache
    from jupyter_cache.base import CachingError

    cache = get_cache(str(cache_folder()))
    try:
        record = cache.match_cache_notebook(jupytext.read(source_of(docname)))
    except (KeyError, CachingError):
        return None
    return cache.get_cache_bundle(record.pk).nb


@functools.cache
def build_book() -> BuildResult:
    """Run the strict build once per process (after dropping a stale execution cache); the log
    also goes to _build/book-build.log."""
    BUILD_DIR.mkdir(exist_ok=True)
    drop_stale_cache()
    start = time.perf_counter()
    try:
        done = subprocess.run([tool("jupyter-book"), *STRICT_BUILD], cwd=ROOT, env=tool_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=BUILD_TIMEOUT_S)
        returncode, log = done.returncode, done.stdout
    except subprocess.TimeoutExpired as timeout:
        out = timeout.stdout or ""
        returncode = -1
        log = (out.decode(errors="replace") if isinstance(out, bytes) else out) + \
            f"\n[book_site] the build ran past {BUILD_TIMEOUT_S} s and was stopped\n"
    seconds = time.perf_counter() - start
    log += f"\n[book_site] jupyter-book {' '.join(STRICT_BUILD)}: exit {returncode} in {seconds:.1f} s\n"
    BUILD_LOG.write_text(log, encoding="utf-8")
    return BuildResult(returncode, log, seconds)


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


# --------------------------------------------------------------------------------------------
# Reading built pages (standard library only)

from html.parser import HTMLParser  # noqa: E402

RESOURCE_ATTRIBUTES = {
    "script": ("src",), "img": ("src", "srcset"), "iframe": ("src",), "source": ("src", "srcset"),
    "video": ("src", "poster"), "audio": ("src",), "embed": ("src",), "object": ("data",),
    "link": ("href",), "image": ("href", "xlink:href"), "use": ("href", "xlink:href"),
}
"""Attributes through which a browser fetches something as a page loads (``<a href>`` is a
link to follow, not a fetch)."""


@dataclass
class Page:
    """What the tests need from one built HTML page."""

    resources: list[tuple[str, str]]       # (tag, url) of everything the page fetches
    links: list[str]                       # every <a href>
    ids: set[str]                          # every id= (anchor targets)
    article_h1: int                        # <h1> elements inside the article
    math_nodes: int                        # elements whose class says they hold math
    output_nodes: int                      # executed cell outputs (myst-nb's cell_output)


class _PageParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.page = Page([], [], set(), 0, 0, 0)
        self._article_depth = 0            # >0 while inside <article class="bd-article">
        self._stack: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        if a.get("id"):
            self.page.ids.add(a["id"])
        if tag == "a" and a.get("name"):
            self.page.ids.add(a["name"])
        if tag == "a" and a.get("href") is not None:
            self.page.links.append(a["href"])
        for attr in RESOURCE_ATTRIBUTES.get(tag, ()):
            if a.get(attr):
                if tag == "link" and set((a.get("rel") or "").split()) & {"canonical"}:
                    continue                # metadata, never fetched
                for url in (a[attr].split(",") if attr == "srcset" else [a[attr]]):
                    self.page.resources.append((tag, url.strip().split(" ")[0]))
        if tag == "article" and "bd-article" in classes:
            self._article_depth = 1
        elif self._article_depth and tag not in VOID_TAGS:
            self._article_depth += 1
        if tag == "h1" and self._article_depth:
            self.page.article_h1 += 1
        if {"math", "math-wrapper"} & set(classes) or tag == "math":
            self.page.math_nodes += 1
        if "cell_output" in classes:
            self.page.output_nodes += 1

    def handle_endtag(self, tag):
        if self._article_depth and tag not in VOID_TAGS:
            self._article_depth -= 1


VOID_TAGS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta",
             "source", "track", "wbr"}


def read_page(path: Path) -> Page:
    parser = _PageParser()
    parser.feed(Path(path).read_text(encoding="utf-8"))
    parser.close()
    return parser.page


def is_remote(url: str) -> bool:
    """Whether fetching ``url`` from a page would leave the machine (http(s) or //host)."""
    u = url.strip().lower()
    return u.startswith(("http://", "https://", "//", "ftp://", "ws://", "wss://"))


# --------------------------------------------------------------------------------------------
# The instructor's copy of the site: the table of contents plus the solutions

SOLUTIONS_CAPTION = "Solutions (instructor copy: do not publish)"

INSTRUCTOR_TOC = BUILD_DIR / "_toc_instructor.yml"


def solution_pages(toc_file: Path = TOC_FILE) -> list[str]:
    """The solution of every exercise the table of contents lists: exercises/<a>/<nb> ->
    solutions/<a>/<nb> (nbgrader's source and release folders mirror each other)."""
    pages = []
    for page in toc_pages(toc_file):
        if page.startswith("exercises/"):
            solution = "solutions/" + page[len("exercises/"):]
            source_of(solution)       # raises ValueError if the solution notebook is missing
            pages.append(solution)
    return pages


def instructor_toc(toc_file: Path = TOC_FILE) -> dict:
    """_toc.yml plus a last part with the solutions of the exercises it lists (shown, never
    executed: execute.exclude_patterns covers solutions/). Raises ValueError when it lists no
    exercise (the instructor site would add nothing) or an exercise has no solution."""
    toc = yaml.safe_load(Path(toc_file).read_text(encoding="utf-8"))
    if "parts" not in toc:
        raise ValueError(f"{toc_file}: expected a table of contents with parts")
    pages = solution_pages(toc_file)
    if not pages:
        raise ValueError(f"{toc_file} lists no exercises/<assignment>/<notebook>: there are no "
                         "solutions to add")
    toc["parts"].append({"caption": SOLUTIONS_CAPTION,
                         "chapters": [{"file": page} for page in pages]})
    return toc


def main(argv: list[str]) -> int:
    """``python -m course.site instructor-toc [OUT]``: write the instructor's table of
    contents (default _build/_toc_instructor.yml) for ``jupyter-book build --toc OUT``.
    ``python -m course.site drop-stale-cache``: drop the execution cache if llmcore changed."""
    if argv == ["drop-stale-cache"]:
        if drop_stale_cache():
            print("llmcore or the figures changed: the execution cache is dropped "
                  "(every chapter runs again)")
        return 0
    if not argv or argv[0] != "instructor-toc" or len(argv) > 2:
        print(main.__doc__, file=sys.stderr)
        return 2
    out = Path(argv[1]) if len(argv) == 2 else INSTRUCTOR_TOC
    try:
        toc = instructor_toc()
    except ValueError as error:
        print(f"book-instructor: {error}", file=sys.stderr)
        return 1
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("# Generated from _toc.yml by python -m course.site: do not edit.\n"
                   + yaml.safe_dump(toc, sort_keys=False), encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
