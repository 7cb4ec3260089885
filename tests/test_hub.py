"""A class on a real JupyterHub: the hub (JupyterHub with its proxy, configurable-http-proxy)
started on 127.0.0.1 with the repository's own configuration (deploy/jupyterhub_config.py), real
Unix users, and the course driven as people drive it:

    everyone    logs in through the hub (its REST API; one student also in Chromium)
    instructor  generates and releases 01_matmul from the formgrader (its REST API)
    students    see it in the Assignments tab, fetch it, answer (alice fully, bob not at all)
                and submit it, through their own servers (nbgrader's assignment-list API)
    instructor  collects, autogrades (each kernel in the course's sandbox), generates and
                releases feedback, from the formgrader
    students    fetch their feedback, through their own servers

Every step goes through the HTTP handlers that the lab's buttons call (the Assignments tab's
Fetch and Submit, the formgrader's Release, Collect, Autograde, Generate and Release feedback),
as the user whose server it is: nbgrader then runs as that Unix user in that server's
environment and configuration, which is what the class gets. Nothing runs nbgrader on a user's
behalf from outside. The timeline is printed.

The users' environment is the one ``make hub`` builds (``python -m course.hub env .venv/hub``:
the hub profile, a Python every user can run, the proxy from npm). The test needs root (it
creates the users and the hub starts their servers as them), the environment with its proxy,
and bubblewrap for the grading sandbox; without one it is skipped with the reason. The users
(``hubtest-*``) and every file of the run are removed at the end.
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import pytest

from course.hub import course_id, unreachable_part
from course.site import BUILD_DIR, ROOT
from test_exchange import ASSIGNMENT, NOTEBOOK, answer

pytestmark = pytest.mark.slow

HUB_ENV = Path(os.environ.get("COURSE_HUB_TEST_ENV", ROOT / ".venv" / "hub"))
"""The users' environment (``make hub``)."""
PREFIX = "hubtest-"
STUDENTS = {f"{PREFIX}alice": "answered", f"{PREFIX}bob": "untouched"}
INSTRUCTOR = f"{PREFIX}teacher"
GROUP = f"{PREFIX}class"
COURSE_FOLDER = "algebra-of-llms"
START_TIMEOUT_S = 240
REQUEST_TIMEOUT_S = 600
LOG_DIR = BUILD_DIR / "hub"


def problem_running_a_hub() -> str | None:
    """Why this machine cannot run the test's hub (None if it can)."""
    if os.geteuid() != 0:
        return (f"the hub test creates Unix users and JupyterHub starts their servers as them: "
                f"it needs root, and runs as uid {os.geteuid()}")
    for command in ("useradd", "userdel", "groupadd", "groupdel", "chpasswd"):
        if shutil.which(command) is None:
            return f"{command} is not installed (the test creates its users with it)"
    if shutil.which("npm") is None:
        return "npm is not installed: JupyterHub's proxy (configurable-http-proxy) comes from npm"
    for name in ("jupyterhub", "jupyterhub-singleuser", "configurable-http-proxy"):
        if not (HUB_ENV / "bin" / name).exists():
            return (f"{HUB_ENV}/bin/{name} is missing: `make hub` builds the users' environment "
                    f"(python -m course.hub env {HUB_ENV})")
    unreachable = unreachable_part(HUB_ENV / "bin" / "python")
    if unreachable:
        return f"the users cannot run {HUB_ENV}/bin/python: {unreachable}"
    from course.grading.sandbox import sandbox_problem
    return sandbox_problem()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(*command: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(command, check=check, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT)


# ------------------------------------------------------------------ the machine's users

def remove_user(name: str) -> None:
    """Stop what the user still runs (each process by its id), then delete user and home."""
    try:
        uid = pwd.getpwnam(name).pw_uid
    except KeyError:
        return
    for pid in run("pgrep", "-u", str(uid), check=False).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    run("userdel", "--remove", name, check=False)


def create_users() -> dict[str, str]:
    """The class's Unix users (students in the class's group) with random passwords."""
    for name in [*STUDENTS, INSTRUCTOR]:
        remove_user(name)                       # left by an interrupted run
    run("groupdel", GROUP, check=False)
    run("groupadd", GROUP)
    passwords = {}
    for name in [*STUDENTS, INSTRUCTOR]:
        groups = ["--groups", GROUP] if name in STUDENTS else []
        run("useradd", "--create-home", "--shell", "/bin/bash", *groups, name)
        passwords[name] = secrets.token_urlsafe(12)
    subprocess.run(["chpasswd"], input="".join(f"{n}:{p}\n" for n, p in passwords.items()),
                   text=True, check=True)
    return passwords


def give_instructor_the_course(name: str) -> Path:
    """The instructor's clone of the course (what the formgrader works on): the course's
    nbgrader_config.py and the assignment's source, owned by the instructor."""
    home = Path(pwd.getpwnam(name).pw_dir)
    course = home / COURSE_FOLDER
    shutil.copytree(ROOT / "solutions" / ASSIGNMENT, course / "solutions" / ASSIGNMENT)
    shutil.copy2(ROOT / "nbgrader_config.py", course / "nbgrader_config.py")
    run("chown", "-R", f"{name}:{name}", str(course))
    return course


# ------------------------------------------------------------------ HTTP

@dataclass
class Response:
    status: int
    body: bytes

    def json(self):
        return json.loads(self.body or b"null")


def request(url: str, method: str = "GET", *, token: str | None = None, data=None,
            form: dict | None = None, timeout: float = REQUEST_TIMEOUT_S) -> Response:
    headers = {}
    body = None
    if token:
        headers["Authorization"] = f"token {token}"
    if data is not None:
        body, headers["Content-Type"] = json.dumps(data).encode(), "application/json"
    if form is not None:
        body = urllib.parse.urlencode(form).encode()
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            return Response(response.status, response.read())
    except urllib.error.HTTPError as error:
        return Response(error.code, error.read())


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


@dataclass
class Hub:
    url: str
    log: Path
    process: subprocess.Popen
    start: float = field(default_factory=time.monotonic)
    timeline: list[tuple[float, str]] = field(default_factory=list)

    def mark(self, event: str) -> None:
        self.timeline.append((time.monotonic() - self.start, event))

    def api(self, method: str, path: str, token: str | None = None, **kw) -> Response:
        return request(f"{self.url}/hub/api{path}", method, token=token, **kw)

    def login(self, name: str, password: str) -> str:
        """Log in as a person does (the hub's login form: the authenticator checks the Unix
        password and the session cookie comes back), then ask the REST API, with that session,
        for an API token of the user's own."""
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar),
                                             NoRedirect())
        opener.open(f"{self.url}/hub/login", timeout=60).read()
        xsrf = next(c.value for c in jar if c.name == "_xsrf")
        form = urllib.parse.urlencode({"username": name, "password": password,
                                       "_xsrf": xsrf}).encode()
        try:
            opener.open(f"{self.url}/hub/login?next=/hub/home", form, timeout=120).read()
            status = 200
        except urllib.error.HTTPError as error:
            status = error.code
        cookies = {c.name for c in jar}
        assert status == 302 and "jupyterhub-hub-login" in cookies, \
            f"{name} could not log in: {status}, cookies {sorted(cookies)}; log: {self.log}"
        xsrf = next(c.value for c in jar if c.name == "_xsrf")      # renewed by the login
        req = urllib.request.Request(
            f"{self.url}/hub/api/users/{name}/tokens", method="POST",
            data=json.dumps({"note": "hub test"}).encode(),
            headers={"X-XSRFToken": xsrf, "Content-Type": "application/json"})
        with opener.open(req, timeout=60) as response:
            return json.loads(response.read())["token"]

    def start_server(self, name: str, token: str) -> None:
        done = self.api("POST", f"/users/{name}/server", token=token)
        assert done.status in (201, 202), f"{name}'s server: {done.status} {done.body!r}"

    def wait_ready(self, name: str, token: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            model = self.api("GET", f"/users/{name}", token=token).json()
            server = (model.get("servers") or {}).get("", {})
            if server.get("ready"):
                return
            assert self.process.poll() is None, f"the hub exited; log: {self.log}"
            assert time.monotonic() < deadline, \
                f"{name}'s server was not ready after {START_TIMEOUT_S} s: {server}; " \
                f"log: {self.log}"
            time.sleep(1)

    def server(self, name: str, token: str, method: str, path: str, **kw) -> Response:
        """A request to the user's own server, through the hub's proxy."""
        return request(f"{self.url}/user/{name}{path}", method, token=token, **kw)


def start_hub(base: Path) -> Hub:
    port = free_port()
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = LOG_DIR / "jupyterhub.log"
    env = {**os.environ, "PATH": f"{HUB_ENV / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "COURSE_HUB_ENV": str(HUB_ENV), "COURSE_HUB_STATE": str(base / "state"),
           "COURSE_HUB_EXCHANGE": str(base / "exchange"), "COURSE_HUB_GROUP": GROUP,
           "COURSE_HUB_INSTRUCTORS": INSTRUCTOR, "COURSE_HUB_COURSE_DIR": f"~/{COURSE_FOLDER}"}
    env.pop("VIRTUAL_ENV", None)
    command = [str(HUB_ENV / "bin" / "jupyterhub"), "-f",
               str(ROOT / "deploy" / "jupyterhub_config.py"),
               f"--JupyterHub.bind_url=http://127.0.0.1:{port}",
               f"--JupyterHub.hub_bind_url=http://127.0.0.1:{free_port()}",
               f"--ConfigurableHTTPProxy.api_url=http://127.0.0.1:{free_port()}"]
    with open(log, "w", encoding="utf-8") as out:
        process = subprocess.Popen(command, cwd=base, env=env, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    hub = Hub(f"http://127.0.0.1:{port}", log, process)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if process.poll() is not None:
            pytest.fail(f"jupyterhub exited with {process.returncode}:\n"
                        f"{log.read_text(encoding='utf-8')[-4000:]}")
        try:
            if request(f"{hub.url}/hub/api/", timeout=5).status == 200:
                break
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"jupyterhub did not answer within {START_TIMEOUT_S} s; log: {log}")
        time.sleep(0.5)
    hub.mark("hub up (its proxy in front)")
    return hub


def stop_hub(hub: Hub) -> None:
    """SIGTERM: the hub stops every user's server and its proxy, then exits."""
    try:
        os.killpg(hub.process.pid, signal.SIGTERM)
        hub.process.wait(timeout=60)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(hub.process.pid, signal.SIGKILL)
        hub.process.wait()


# ------------------------------------------------------------------ what the people do

def formgrader(hub: Hub, token: str, method: str, path: str) -> dict:
    """The instructor's formgrader API (what its buttons call); fails on an unsuccessful step."""
    done = hub.server(INSTRUCTOR, token, method, f"/formgrader/api{path}",
                      data={} if method == "POST" else None)
    assert done.status == 200, f"formgrader {path}: {done.status} {done.body[-2000:]!r}"
    result = done.json()
    if isinstance(result, dict) and "success" in result:
        assert result["success"], f"formgrader {path} failed:\n{result.get('error')}\n" \
                                  f"{result.get('log')}"
    return result


def assignments(hub: Hub, name: str, token: str, action: str = "", **form) -> object:
    """A student's Assignments tab: list (GET) or fetch, submit, fetch_feedback (POST)."""
    cid = course_id()
    if not action:
        done = hub.server(name, token, "GET", f"/assignments?course_id={cid}")
    else:
        done = hub.server(name, token, "POST", f"/assignments/{action}",
                          form={"course_id": cid, "assignment_id": ASSIGNMENT, **form})
    assert done.status == 200, f"{name}: assignments {action or 'list'}: {done.status} " \
                               f"{done.body[-2000:]!r}"
    result = done.json()
    assert result.get("success"), f"{name}: assignments {action or 'list'}: {result}"
    return result.get("value")


def answer_through_the_lab(hub: Hub, name: str, token: str, path: str) -> None:
    """Open the fetched notebook (contents API), fill every answer cell, save it back."""
    done = hub.server(name, token, "GET", f"/api/contents/{path}?content=1&type=notebook")
    assert done.status == 200, f"{name} cannot open {path}: {done.status}"
    with tempfile.TemporaryDirectory() as scratch:
        local = Path(scratch) / "notebook.ipynb"
        nbformat.write(nbformat.from_dict(done.json()["content"]), local)
        answer(local)
        content = json.loads(local.read_text(encoding="utf-8"))
    saved = hub.server(name, token, "PUT", f"/api/contents/{path}",
                       data={"type": "notebook", "format": "json", "content": content})
    assert saved.status == 200, f"{name} could not save {path}: {saved.status} {saved.body!r}"


@dataclass
class Browser:
    """What one student saw in Chromium, or why it was not looked at."""
    skipped: str | None = None
    plugins: dict = field(default_factory=dict)
    menu: list = field(default_factory=list)
    released: str = ""
    create_tabs: int = -1


NBGRADER_MENU_JS = """() => Array.from(document.querySelectorAll('.lm-Menu-itemLabel'))
    .map(e => e.textContent.trim()).filter(Boolean)"""


def student_in_a_browser(hub: Hub, name: str, password: str) -> Browser:
    """Log in on the hub's login page, open the lab, open Nbgrader > Assignment List."""
    try:
        from test_browser import CHROMIUM_ARGS, chromium_or_skip
        executable = chromium_or_skip()
    except pytest.skip.Exception as skipped:
        return Browser(skipped=str(skipped))
    except ValueError as error:            # test_browser reads _toc.yml when it is imported
        return Browser(skipped=f"tests/test_browser.py cannot be imported: {error}")
    from playwright.sync_api import sync_playwright

    seen = Browser()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"{hub.url}/hub/login")
            page.fill("#username_input", name)
            page.fill("#password_input", password)
            page.click("#login_submit")
            page.wait_for_url(f"{hub.url}/user/{name}/**", timeout=120_000)
            page.goto(f"{hub.url}/user/{name}/lab")
            page.wait_for_selector(".jp-LabShell", timeout=120_000)
            page.locator(".lm-MenuBar-itemLabel", has_text="Nbgrader").click()
            page.wait_for_selector(".lm-Menu-itemLabel", timeout=30_000)
            seen.menu = page.evaluate(NBGRADER_MENU_JS)
            page.locator(".lm-Menu-itemLabel", has_text="Assignment List").click()
            listing = page.locator("#released_assignments_list")
            listing.get_by_text(ASSIGNMENT).first.wait_for(timeout=60_000)
            seen.released = listing.inner_text()
            seen.create_tabs = page.locator(".lm-TabBar-tabLabel",
                                            has_text="Create Assignment").count()
            page.screenshot(path=str(LOG_DIR / f"{name}-assignments.png"))
        finally:
            browser.close()
    return seen


def gradebook_scores(course: Path) -> dict[str, tuple[float, float]]:
    """(score, max_score) per student, read from the instructor's gradebook with sqlite."""
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", course_id()) as gradebook:
        return {name: (s.score, s.max_score) for name in STUDENTS
                for s in [gradebook.find_submission(ASSIGNMENT, name)]}


@pytest.fixture(scope="module")
def hub_class():
    """The whole class once; returns what each step saw."""
    problem = problem_running_a_hub()
    if problem:
        pytest.skip(problem)
    base = Path(tempfile.mkdtemp(prefix="course-hub-", dir="/tmp"))
    base.chmod(0o755)                           # every user reaches the exchange under it
    hub = None
    try:
        passwords = create_users()
        course = give_instructor_the_course(INSTRUCTOR)
        hub = start_hub(base)
        seen: dict = {"course": course, "exchange": base / "exchange"}

        with pytest.raises(AssertionError, match="could not log in"):
            hub.login(INSTRUCTOR, "not-" + passwords[INSTRUCTOR])   # no session cookie
        tokens = {name: hub.login(name, password) for name, password in passwords.items()}
        hub.mark("3 users logged in (login form, PAM; API tokens from the REST API)")
        for name, token in tokens.items():
            hub.start_server(name, token)
        for name, token in tokens.items():
            hub.wait_ready(name, token)
        hub.mark("3 servers ready (one JupyterLab per Unix user)")

        seen["formgrader"] = {name: hub.server(name, token, "GET", "/formgrader/api/status").status
                              for name, token in tokens.items()}
        seen["whoami"] = {name: hub.server(name, token, "GET", "/api/me").json()
                          .get("identity", {}).get("username") for name, token in tokens.items()}
        teacher = tokens[INSTRUCTOR]
        formgrader(hub, teacher, "POST", f"/assignment/{ASSIGNMENT}/assign")
        formgrader(hub, teacher, "POST", f"/assignment/{ASSIGNMENT}/release")
        hub.mark(f"instructor released {ASSIGNMENT} (formgrader)")

        first = next(iter(STUDENTS))
        seen["browser"] = student_in_a_browser(hub, first, passwords[first])
        hub.mark(f"{first} saw {ASSIGNMENT} in the Assignments tab (Chromium)"
                 if not seen["browser"].skipped else "browser step skipped")

        seen["listed"], seen["fetched"] = {}, {}
        for name, kind in STUDENTS.items():
            seen["listed"][name] = assignments(hub, name, tokens[name])
            assignments(hub, name, tokens[name], "fetch")
            path = f"{ASSIGNMENT}/{NOTEBOOK}.ipynb"
            seen["fetched"][name] = hub.server(name, tokens[name], "GET",
                                               f"/api/contents/{path}?content=0").status
            if kind == "answered":
                answer_through_the_lab(hub, name, tokens[name], path)
            assignments(hub, name, tokens[name], "submit")
        hub.mark("2 students fetched, answered (one fully, one not) and submitted")

        formgrader(hub, teacher, "POST", f"/assignment/{ASSIGNMENT}/collect")
        seen["collected"] = sorted(p.name for p in (course / "submitted").iterdir())
        for name in STUDENTS:
            formgrader(hub, teacher, "POST", f"/submission/{ASSIGNMENT}/{name}/autograde")
        hub.mark("instructor collected and autograded (sandboxed kernels)")
        seen["submissions"] = {s["student"]: (s["score"], s["max_score"]) for s in
                               formgrader(hub, teacher, "GET", f"/submissions/{ASSIGNMENT}")}
        formgrader(hub, teacher, "POST", f"/assignment/{ASSIGNMENT}/generate_feedback")
        formgrader(hub, teacher, "POST", f"/assignment/{ASSIGNMENT}/release_feedback")
        hub.mark("instructor generated and released feedback")

        seen["feedback"] = {}
        for name in STUDENTS:
            assignments(hub, name, tokens[name], "fetch_feedback")
            home = Path(pwd.getpwnam(name).pw_dir)
            seen["feedback"][name] = {
                str(p.relative_to(home)): p.read_text(encoding="utf-8")
                for p in sorted((home / ASSIGNMENT / "feedback").glob("*/*.html"))}
        hub.mark("2 students fetched their feedback")
        seen["gradebook"] = gradebook_scores(course)
        seen["autograded"] = nbformat.read(
            course / "autograded" / first / ASSIGNMENT / f"{NOTEBOOK}.ipynb", as_version=4)
        seen["timeline"] = hub.timeline
        yield seen
    finally:
        if hub is not None:
            stop_hub(hub)
        for name in [*STUDENTS, INSTRUCTOR]:
            remove_user(name)
        run("groupdel", GROUP, check=False)
        shutil.rmtree(base, ignore_errors=True)


def test_timeline(hub_class, capsys):
    """The class's timeline, printed (seconds since the hub's start was asked for)."""
    lines = [f"  {seconds:6.1f} s  {event}" for seconds, event in hub_class["timeline"]]
    with capsys.disabled():
        print("\nJupyterHub class timeline (this machine, shared: times are indicative)\n"
              + "\n".join(lines))
    events = [event for _, event in hub_class["timeline"]]
    assert any("released" in e for e in events) and any("feedback" in e for e in events)


def test_each_server_runs_as_its_user(hub_class):
    assert hub_class["whoami"] == {name: name for name in [*STUDENTS, INSTRUCTOR]}


def test_formgrader_only_on_the_instructors_server(hub_class):
    statuses = hub_class["formgrader"]
    assert statuses[INSTRUCTOR] == 200, statuses
    for name in STUDENTS:
        assert statuses[name] == 404, f"{name}'s server serves the formgrader: {statuses}"


def test_student_lab_in_a_browser(hub_class):
    seen: Browser = hub_class["browser"]
    if seen.skipped:
        pytest.skip(seen.skipped)
    assert "Assignment List" in seen.menu, seen.menu
    assert "Formgrader" not in seen.menu and "Course List" not in seen.menu, seen.menu
    assert seen.create_tabs == 0, "the student's lab has a Create Assignment tab"
    assert ASSIGNMENT in seen.released


def test_release_reaches_both_students(hub_class):
    cid = course_id()
    for name in STUDENTS:
        listed = hub_class["listed"][name]
        released = [a for a in listed if a["assignment_id"] == ASSIGNMENT
                    and a["course_id"] == cid]
        assert released and released[0]["status"] == "released", f"{name} saw {listed}"
        assert hub_class["fetched"][name] == 200, f"{name} has no fetched notebook"


def test_collect_files_each_submission_under_its_student(hub_class):
    assert hub_class["collected"] == sorted(STUDENTS)


def test_gradebook_scores_are_exact(hub_class):
    """alice answered everything: full marks; bob submitted the untouched notebook: zero. The
    formgrader reports what the gradebook holds."""
    scores = hub_class["gradebook"]
    full = scores[f"{PREFIX}alice"][1]
    assert full > 0
    assert scores == {f"{PREFIX}alice": (full, full), f"{PREFIX}bob": (0, full)}, scores
    assert hub_class["submissions"] == scores


def test_autograde_ran_in_the_sandbox(hub_class):
    from course.grading import sandbox
    printed = "".join(output.get("text", "") for cell in hub_class["autograded"].cells
                      for output in cell.get("outputs", []))
    assert f"WHERE {sandbox.SANDBOX_UID} {sandbox.SANDBOX_WORK}" in printed, printed


def test_each_student_fetches_only_their_own_feedback(hub_class):
    for name in STUDENTS:
        pages = hub_class["feedback"][name]
        assert len(pages) == 1, f"{name} fetched {sorted(pages)}"
        page = next(iter(pages.values()))
        assert "Score" in page
        for other in STUDENTS:
            if other != name:
                assert other not in page, f"{name}'s feedback mentions {other}"
