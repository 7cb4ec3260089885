"""The built site in a real browser: headless Chromium (Debian's package, driven by Playwright;
no browser is downloaded) opens the index and every page of _toc.yml from a local HTTP server and
checks what a reader would see: no console errors, no failed requests, nothing fetched from
another host, math typeset by the bundled MathJax, every image loaded, every internal link and
anchor resolving, no sideways scrolling at a desktop (1280 px) or a phone (390 px) width
(long code lines scroll inside their block), and at the desktop width no line of code wrapping:
not in a listing (the package's code shown with literalinclude), a code example, or the input of
an executed cell. A screenshot of each page goes to _build/screenshots/<page>.jpg (and
<page>-phone.jpg).

Without Chromium the tests are skipped, unless LLMCORE_REQUIRE_BROWSER=1 (CI sets it).
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Iterator

import pytest

from course.site import (HTML_DIR, SCREENSHOT_DIR, build_book, executed_pages, html_of,
                         read_page, toc_pages)

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-quic"]
"""Flags for a closed network: without the background-networking ones Chromium keeps trying
(and failing) to reach Google's services."""

REQUIRE = os.environ.get("LLMCORE_REQUIRE_BROWSER") == "1"
PAGES = ["index"] + toc_pages()
EXECUTED = set(executed_pages())
"""The pages whose code cells the build runs: the chapters (the exercises are shown, not run)."""
MATHJAX_TIMEOUT_MS = 30_000
RAW_TEX = ("$$", "\\begin", "\\(", "\\)", "\\[", "\\]", "\\frac", "\\sqrt")
"""Text that MathJax removes when it typesets; seen outside code, math was left raw."""


def chromium_or_skip() -> str:
    path = CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")
    problem = None
    if path is None:
        problem = f"Chromium is not installed ({CHROMIUM}; `make browser` installs it as root)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError as error:
            problem = f"playwright is not importable: {error}"
    if problem:
        if REQUIRE:
            pytest.fail(f"LLMCORE_REQUIRE_BROWSER=1 but {problem}")
        pytest.skip(problem)
    return path


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):      # noqa: A002 (the base class's name)
        pass


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    """The built site served over HTTP from a thread: yields its base URL."""
    chromium_or_skip()
    result = build_book()
    missing = [p for p in PAGES[1:] if not html_of(p).is_file()]
    assert (HTML_DIR / "index.html").is_file() and not missing, \
        f"the build (exit {result.returncode}) produced no HTML for {missing or ['index']}"
    handler = functools.partial(QuietHandler, directory=str(HTML_DIR))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser(site):
    from playwright.sync_api import sync_playwright

    executable = chromium_or_skip()
    playwright = sync_playwright().start()
    try:
        chromium = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS,
                                              headless=True)
        try:
            # one context for every page: the theme's scripts and MathJax are fetched once and
            # then come from the browser's cache (request routing would disable that cache)
            context = chromium.new_context(viewport={"width": WIDTHS["desktop"], "height": 900})
            yield context
            context.close()
        finally:
            chromium.close()
    finally:
        playwright.stop()


def is_local(url: str, site: str) -> bool:
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme in ("data", "blob", "about"):
        return True
    return f"{parsed.scheme}://{parsed.netloc}" == site


@functools.cache
def ids_of(page_path: str) -> frozenset[str]:
    """The anchors of a built page, by its path under the site (e.g. /chapters/01_shapes.html)."""
    return frozenset(read_page(HTML_DIR / urllib.parse.unquote(page_path).lstrip("/")).ids)


def status_of(url: str) -> int:
    for method in ("HEAD", "GET"):
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=30) as r:
                return r.status
        except urllib.error.HTTPError as error:
            if method == "GET":
                return error.code
        except urllib.error.URLError:
            if method == "GET":
                return 0
    return 0


IMAGES_JS = """async () => {
    const images = Array.from(document.images);
    images.forEach(img => { img.loading = 'eager'; });
    const settle = img => img.complete ? Promise.resolve() : new Promise(done => {
        img.addEventListener('load', done, {once: true});
        img.addEventListener('error', done, {once: true});
    });
    await Promise.race([Promise.all(images.map(settle)),
                        new Promise(done => setTimeout(done, 15000))]);
    return images.map(img => ({src: img.currentSrc || img.src,
                               ok: img.complete && img.naturalWidth > 0}));
}"""

VISIBLE_TEXT_JS = """() => {
    const root = (document.querySelector('article') || document.body).cloneNode(true);
    root.querySelectorAll('pre, code, script, style, textarea, mjx-container, .highlight')
        .forEach(node => node.remove());
    return root.textContent;
}"""

WIDTHS = {"desktop": 1280, "phone": 390}
"""Window widths (CSS px) at which no page may scroll sideways: a laptop and a phone."""

OVERFLOW_JS = """(cells) => {
    const width = document.documentElement.clientWidth;
    const page = Math.max(document.documentElement.scrollWidth, document.body.scrollWidth);
    const blocks = Array.from(document.querySelectorAll('pre'))
        .filter(pre => pre.offsetParent !== null);        // shown (not in a closed toggle)
    const wide = blocks.filter(pre => pre.getBoundingClientRect().right > width + 1)
        .map(pre => pre.textContent.slice(0, 60));
    const clipped = blocks.filter(pre => pre.scrollWidth > pre.clientWidth + 1 &&
        !['auto', 'scroll'].includes(getComputedStyle(pre).overflowX))
        .map(pre => pre.textContent.slice(0, 60));
    const code = blocks.filter(pre => pre.closest('div.highlight') && !pre.closest('.cell_output'));
    const scrolling = code.filter(pre => pre.scrollWidth > pre.clientWidth + 1)
        .map(pre => pre.textContent.slice(0, 60));
    const wrapped = code.filter(pre => cells || !pre.closest('.cell')).filter(pre => {
        const style = pre.style.whiteSpace;
        pre.style.whiteSpace = 'pre';                 // unwrapped: does a line stick out?
        const wraps = pre.scrollWidth > pre.clientWidth + 1;
        pre.style.whiteSpace = style;
        return wraps;
    }).map(pre => pre.textContent.slice(0, 60));
    return {width, page, wide, clipped, scrolling, wrapped};
}"""
"""The page's width against the window's, the code blocks that stick out of the window or hide
text they cannot scroll to, the blocks of code (cells and listings, not printed output) that
need a scroll bar to be read, and the blocks of code with a line that wraps (the site's CSS
wraps long lines of code at a desktop width rather than scroll them): the listings (llmcore's
code shown with literalinclude) and the chapters' code examples, and, when `cells` is true (a
page the build executes), the input of every code cell. Printed output is never counted: it
keeps its lines and may scroll (tables)."""

MATHJAX_JS = """async () => {
    await MathJax.startup.promise;
    return {typeset: document.querySelectorAll('mjx-container').length,
            errors: Array.from(document.querySelectorAll('mjx-merror'))
                         .map(e => e.getAttribute('data-mjx-error') || e.textContent)};
}"""


@pytest.mark.parametrize("docname", PAGES)
def test_page_in_a_real_browser(browser, site, docname):
    remote, failed, bad_status, console_errors = [], [], [], []
    page = browser.new_page()
    page.on("request", lambda r: None if is_local(r.url, site) else remote.append(r.url))
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: console_errors.append(f"uncaught: {e}"))
    page.on("requestfailed", lambda r: failed.append(f"{r.url} ({r.failure})"))
    page.on("response", lambda r: bad_status.append(f"{r.url} -> {r.status}")
            if r.status >= 400 else None)
    try:
        start = time.perf_counter()
        page.goto(f"{site}/{'index' if docname == 'index' else docname}.html", wait_until="load")
        if docname == "index":          # a redirect to the root page
            page.wait_for_url(f"{site}/{PAGES[1]}.html", timeout=10_000)
        page.evaluate("() => document.fonts.ready.then(() => true)")
        shown = PAGES[1] if docname == "index" else docname

        # math: typeset by the bundled MathJax, nothing left raw
        if read_page(html_of(shown)).math_nodes:
            page.wait_for_function("() => window.MathJax && MathJax.startup && "
                                   "MathJax.startup.promise", timeout=MATHJAX_TIMEOUT_MS)
            math = page.evaluate(MATHJAX_JS)
            assert math["typeset"] > 0, f"{docname}: MathJax typeset nothing"
            assert not math["errors"], f"{docname}: TeX errors: {math['errors'][:5]}"
        text = page.evaluate(VISIBLE_TEXT_JS)
        raw = [marker for marker in RAW_TEX if marker in text]
        assert not raw, f"{docname}: raw LaTeX left in the visible text: {raw}"

        images = page.evaluate(IMAGES_JS)
        broken = [i["src"] for i in images if not i["ok"]]
        assert not broken, f"{docname}: images that did not load: {broken}"

        # links: every local target answers, every anchor exists
        links = page.evaluate("() => Array.from(document.querySelectorAll('a[href]'))"
                              ".map(a => a.href)")
        here = urllib.parse.urlsplit(page.url)
        dead, missing_anchors = [], []
        for link in sorted(set(links)):
            parsed = urllib.parse.urlsplit(link)
            if parsed.scheme not in ("http", "https") or not is_local(link, site):
                continue                      # mailto:, javascript:, other sites (not fetched)
            target = urllib.parse.urlunsplit((parsed.scheme, parsed.netloc, parsed.path, "", ""))
            if parsed.path != here.path and status_of(target) != 200:
                dead.append(link)
                continue
            anchor = urllib.parse.unquote(parsed.fragment)
            if anchor:
                if parsed.path == here.path:
                    ok = page.evaluate("id => document.getElementById(id) !== null || "
                                       "document.getElementsByName(id).length > 0", anchor)
                else:
                    ok = parsed.path.endswith(".html") and anchor in ids_of(parsed.path)
                if not ok:
                    missing_anchors.append(link)
        assert not dead, f"{docname}: links to missing pages or files: {dead}"
        assert not missing_anchors, f"{docname}: links to missing anchors: {missing_anchors}"

        SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOT_DIR / f"{docname.replace('/', '__')}.jpg"),
                        full_page=True, type="jpeg", quality=70)

        # no sideways scrolling at a desktop and a phone width: long code scrolls in its block
        for name, width in WIDTHS.items():
            page.set_viewport_size({"width": width, "height": 900})
            page.wait_for_timeout(200)                      # the theme's layout settles
            found = page.evaluate(OVERFLOW_JS, shown in EXECUTED)
            assert found["page"] <= found["width"], (
                f"{docname} at {width} px ({name}): the page is {found['page']} px wide, wider "
                f"than the window ({found['width']} px); blocks past the edge: {found['wide']}")
            assert not found["wide"], f"{docname} at {width} px: code wider than the window: " \
                                      f"{found['wide']}"
            assert not found["clipped"], f"{docname} at {width} px: code cut off without a " \
                                         f"scroll bar: {found['clipped']}"
            if name == "desktop":       # the whole of every line of code is in view
                assert not found["scrolling"], f"{docname} at {width} px: code that needs a " \
                                               f"scroll bar: {found['scrolling']}"
                # and no line of a listing, an example or an executed cell's input wraps (a
                # wrapped shape comment lands alone at column 0); test_literalincludes.py
                # checks the same width on the source, in seconds
                assert not found["wrapped"], f"{docname} at {width} px: code with lines " \
                                             f"wider than the page: {found['wrapped']}"
            else:
                page.screenshot(path=str(SCREENSHOT_DIR / f"{docname.replace('/', '__')}"
                                                          f"-{name}.jpg"),
                                full_page=False, type="jpeg", quality=70)
        assert not remote, f"{docname}: requests to other hosts: {remote}"
        assert not failed, f"{docname}: failed requests: {failed}"
        assert not bad_status, f"{docname}: error responses: {bad_status}"
        assert not console_errors, f"{docname}: console errors: {console_errors}"
        print(f"{docname}: checked in {time.perf_counter() - start:.1f} s "
              f"({len(images)} images, {len(set(links))} links)")
    finally:
        page.close()


# ----------------------------------------------------------- launch buttons (course/launch.py)

LAUNCH_LINKS_JS = """() => Array.from(document.querySelectorAll('.dropdown-launch-buttons a[href]'))
    .map(a => ({text: a.textContent.trim(), href: a.href}))"""


def launch_settings() -> dict:
    """The launch buttons the build offered: _config.yml's launch_buttons and repository, with
    the environment's overrides and the rule that no button points at a placeholder, as
    course.launch.launch_plan decided them for the build (a build with _config.yml's placeholder
    addresses, the default, offers neither button; COURSE_REPOSITORY_URL and COURSE_HUB_URL set
    to real addresses for `make test` bring both)."""
    from course.launch import launch_plan
    from course.site import book_config
    config = book_config()
    buttons = config.get("launch_buttons", {})
    plan = launch_plan(config.get("repository", {}).get("url", ""),
                       buttons.get("jupyterhub_url", ""), buttons.get("colab_url", ""))
    return {"hub": plan.hub, "colab": plan.colab, "repository": plan.repository,
            "colab_branch": buttons.get("colab_branch") or "gh-pages",
            "branch": config.get("repository", {}).get("branch") or "main"}


@pytest.mark.parametrize("docname", [p for p in PAGES if p.startswith("chapters/")])
def test_launch_buttons_in_a_real_browser(browser, site, docname):
    """Every chapter's launch menu, opened as a reader opens it: the JupyterHub link pulls the
    course's repository through nbgitpuller and opens this chapter's source (a file that is in
    the repository), the same link the instructors' command makes; the Colab link opens the
    chapter's notebook as the site publishes it, whose first cell installs the course on Colab.
    A button whose address is empty or _config.yml's placeholder is absent, and without the
    Colab button the published notebook has no install cell (the default build: neither button,
    no launch menu). Nothing is followed or fetched from another host."""
    import json

    from course.launch import COLAB_MARKER, colab_cell, colab_link, nbgitpuller_link
    from course.site import ROOT, source_of

    settings = launch_settings()
    remote = []
    page = browser.new_page()
    page.on("request", lambda r: None if is_local(r.url, site) else remote.append(r.url))
    try:
        page.goto(f"{site}/{docname}.html", wait_until="load")
        links = {link["text"]: link["href"] for link in page.evaluate(LAUNCH_LINKS_JS)}
        expected = {}
        if settings["hub"]:
            source = source_of(docname).relative_to(ROOT).as_posix()
            expected["JupyterHub"] = nbgitpuller_link(settings["hub"], settings["repository"],
                                                      source, branch=settings["branch"])
        if settings["colab"]:
            expected["Colab"] = colab_link(settings["colab"], settings["repository"], docname,
                                           branch=settings["colab_branch"])
        assert links == expected, f"{docname}: launch links {links}, expected {expected}"
        menus = page.locator(".dropdown-launch-buttons").count()
        assert menus == (1 if expected else 0), f"{docname}: {menus} launch menus"
        if expected:
            page.locator(".dropdown-launch-buttons button").click()
            for text in expected:
                item = page.locator(".dropdown-launch-buttons a", has_text=text)
                item.wait_for(state="visible", timeout=5_000)
        if "JupyterHub" in links:
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(links["JupyterHub"]).query)
            opened = query["urlpath"][0].split("/", 3)[3]       # lab/tree/<repository>/<path>
            assert (ROOT / opened).is_file(), f"{docname}: the hub would open {opened}"
        published = f"{site}/_sources/{docname}.ipynb"           # also the .ipynb download
        assert status_of(published) == 200, f"{docname}: no notebook at {published}"
        with urllib.request.urlopen(published, timeout=30) as response:
            cells = json.loads(response.read())["cells"]
        installs = [c for c in cells if c["metadata"].get(COLAB_MARKER)
                    or "google.colab" in "".join(c["source"])]
        if "Colab" in links:
            assert installs == [cells[0]] and "".join(cells[0]["source"]) == colab_cell(
                settings["repository"], settings["branch"]), cells[0]
        else:
            assert not installs, f"{docname}: an install cell without a Colab button: {installs}"
        assert not remote, f"{docname}: requests to other hosts: {remote}"
    finally:
        page.close()
