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

The hub is started as deploy/README.md says: from the environment's copy of the course (the
learner edition), over HTTPS (a self-signed certificate made for the run). The users are made
as the README says (homes 0700), except one student whose home is left open as Debian's plain
``useradd -m`` makes it, which the hub closes before his server starts. That student (bob) then
attacks: as his own Unix user (tests/hub_attacker.py, run with runuser) he tries to read, change,
rename, plant and forge every file and folder of the other student, the instructor and the
exchange, and to find solutions through the environment; with his own API token he tries the
hub's API and the others' servers. Each attempt must be refused, and the class must still be
graded right. The instructor's role stops and starts bob's server, without access to it.

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
import ssl
import stat
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
ALICE, BOB = STUDENTS
ATTACKER, VICTIM = BOB, ALICE
OPEN_HOMES = {BOB}
"""Made with Debian's plain ``useradd -m`` (0755), not the README's HOME_MODE=0700: the hub
must close it before his server starts."""
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
    if not (HUB_ENV / "course" / "deploy" / "jupyterhub_config.py").is_file():
        return (f"{HUB_ENV}/course is not the course's learner edition: `make hub` writes it "
                f"(python -m course.hub env {HUB_ENV})")
    for command in ("openssl", "runuser"):
        if shutil.which(command) is None:
            return f"{command} is not installed (the test makes a certificate and runs as users)"
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
        private = [] if name in OPEN_HOMES else ["-K", "HOME_MODE=0700"]    # the README's
        run("useradd", "--create-home", *private, "--shell", "/bin/bash", *groups, name)
        passwords[name] = secrets.token_urlsafe(12)
    for name in OPEN_HOMES:
        assert home_mode(name) == 0o755, f"{name}'s home should start open: {home_mode(name):o}"
    subprocess.run(["chpasswd"], input="".join(f"{n}:{p}\n" for n, p in passwords.items()),
                   text=True, check=True)
    return passwords


def home_of(name: str) -> Path:
    return Path(pwd.getpwnam(name).pw_dir)


def home_mode(name: str) -> int:
    return stat.S_IMODE(home_of(name).stat().st_mode)


def make_certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key (root's alone)."""
    folder.mkdir(mode=0o700)
    cert, key = folder / "hub.crt", folder / "hub.key"
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
        "-keyout", str(key), "-out", str(cert))
    key.chmod(0o600)
    return cert, key


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


TLS: dict[str, ssl.SSLContext] = {}
"""The context that trusts the run's own certificate (set when the hub starts)."""


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
        with urllib.request.urlopen(req, timeout=timeout, context=TLS.get("context")) as response:
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
                                             urllib.request.HTTPSHandler(
                                                 context=TLS.get("context")), NoRedirect())
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
    """The README's command: the environment's jupyterhub with the edition's configuration,
    HTTPS with a certificate (here self-signed, for 127.0.0.1 and a free port)."""
    port = free_port()
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = LOG_DIR / "jupyterhub.log"
    cert, key = make_certificate(base / "tls")
    TLS["context"] = ssl.create_default_context(cafile=str(cert))
    env = {**os.environ, "PATH": f"{HUB_ENV / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "COURSE_HUB_ENV": str(HUB_ENV), "COURSE_HUB_STATE": str(base / "state"),
           "COURSE_HUB_EXCHANGE": str(base / "exchange"), "COURSE_HUB_GROUP": GROUP,
           "COURSE_HUB_INSTRUCTORS": INSTRUCTOR, "COURSE_HUB_COURSE_DIR": f"~/{COURSE_FOLDER}",
           "COURSE_HUB_SSL_CERT": str(cert), "COURSE_HUB_SSL_KEY": str(key)}
    env.pop("VIRTUAL_ENV", None)
    command = [str(HUB_ENV / "bin" / "jupyterhub"), "-f",
               str(HUB_ENV / "course" / "deploy" / "jupyterhub_config.py"),
               f"--JupyterHub.bind_url=https://127.0.0.1:{port}",
               f"--JupyterHub.hub_bind_url=http://127.0.0.1:{free_port()}",
               f"--ConfigurableHTTPProxy.api_url=http://127.0.0.1:{free_port()}"]
    with open(log, "w", encoding="utf-8") as out:
        process = subprocess.Popen(command, cwd=base, env=env, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    hub = Hub(f"https://127.0.0.1:{port}", log, process)
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
    hub.mark("hub up over HTTPS (its proxy in front)")
    return hub


def plain_http_refused(url: str) -> str:
    """What a plain-HTTP request to the hub's address gets (it serves only HTTPS)."""
    import http.client
    try:
        done = request(url.replace("https://", "http://", 1) + "/hub/login", timeout=10)
    except (urllib.error.URLError, http.client.HTTPException, OSError) as error:
        return f"refused: {type(error).__name__}"
    return f"status {done.status}"


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
            page = browser.new_page(viewport={"width": 1280, "height": 900},
                                    ignore_https_errors=True)     # the run's own certificate
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


# ------------------------------------------------------------------ what a curious student tries

def as_user(name: str, base: Path, plan: list[dict]) -> dict:
    """Run tests/hub_attacker.py as the Unix user ``name`` (their uid and groups, their home,
    the hub's environment) with ``plan``; returns each attempt's outcome."""
    folder = base / "attacks"
    folder.mkdir(mode=0o755, exist_ok=True)
    script = folder / "hub_attacker.py"
    shutil.copy(Path(__file__).with_name("hub_attacker.py"), script)
    script.chmod(0o644)
    plan_file = folder / f"plan-{len(list(folder.glob('plan-*')))}.json"
    plan_file.write_text(json.dumps(plan), encoding="utf-8")
    plan_file.chmod(0o644)
    env = {"PATH": f"{HUB_ENV / 'bin'}:/usr/bin:/bin", "HOME": str(home_of(name)),
           "LANG": "C.UTF-8"}
    done = subprocess.run([shutil.which("runuser"), "-u", name, "--",
                           str(HUB_ENV / "bin" / "python"), str(script), str(plan_file)], cwd=folder, env=env, text=True,
                          capture_output=True, timeout=300)
    assert done.returncode == 0, f"the attacker's script failed: {done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def exchange_attacks(exchange: Path, course: Path) -> list[dict]:
    """Before collect: the exchange, the other student's submission (its name known: read by
    root and handed over), the homes, the instructor's course, the environment."""
    cid = course_id()
    folder = exchange / cid
    inbound = folder / "inbound"
    known = next(p for p in inbound.iterdir() if p.name.startswith(f"{VICTIM}+"))
    later = time.strftime("%Y-%m-%d %H:%M:%S.000000 UTC", time.gmtime(time.time() + 3600))
    untouched = home_of(ATTACKER) / ASSIGNMENT / f"{NOTEBOOK}.ipynb"
    victim_home = home_of(VICTIM)
    return [
        {"name": "list the inbound folder", "op": "listing", "path": str(inbound)},
        {"name": "read the other's known submission (its secret)", "op": "read",
         "path": str(known)},
        {"name": "write the other's known submission", "op": "write",
         "path": str(known / f"{NOTEBOOK}.ipynb")},
        {"name": "plant a file in the other's known submission", "op": "create",
         "path": str(known / "planted.py")},
        {"name": "move the other's known submission away", "op": "rename", "path": str(known),
         "to": f"{known}-moved"},
        {"name": "delete the other's known submission", "op": "remove", "path": str(known)},
        {"name": "rename the course's exchange folder", "op": "rename", "path": str(folder),
         "to": f"{folder}-moved"},
        {"name": "replace the course's exchange folder", "op": "replace", "path": str(folder)},
        {"name": "delete the course's exchange folder", "op": "remove", "path": str(folder)},
        {"name": "plant a folder in the course's exchange folder", "op": "mkdir",
         "path": str(folder / "inbound2")},
        {"name": "replace the inbound folder", "op": "replace", "path": str(inbound)},
        {"name": "change the released notebook", "op": "write",
         "path": str(folder / "outbound" / ASSIGNMENT / f"{NOTEBOOK}.ipynb")},
        {"name": "FORGE a newer submission in the other's name", "op": "forge",
         "path": str(inbound / f"{VICTIM}+{ASSIGNMENT}+{later}+{secrets.token_hex(16)}"),
         "to": str(untouched)},
        {"name": "read the other's notebook", "op": "read",
         "path": str(victim_home / ASSIGNMENT / f"{NOTEBOOK}.ipynb")},
        {"name": "read the other's nbgrader cache (submission secrets)", "op": "read",
         "path": str(victim_home / ".local" / "share" / "jupyter" / "nbgrader_cache")},
        {"name": "list the other's home", "op": "listing", "path": str(victim_home)},
        {"name": "read the instructor's solutions", "op": "read",
         "path": str(course / "solutions")},
        {"name": "read the instructor's gradebook", "op": "read",
         "path": str(course / "gradebook.db")},
        {"name": "list the instructor's home", "op": "listing", "path": str(course.parent)},
        {"name": "solutions through the environment", "op": "solutions_via_env"},
    ]


def graded_class_attacks(exchange: Path, course: Path) -> list[dict]:
    """After grading and feedback: what the instructor collected, graded and returned."""
    victim_home = home_of(VICTIM)
    submitted = course / "submitted" / VICTIM / ASSIGNMENT
    return [
        {"name": "read the other's feedback", "op": "read",
         "path": str(victim_home / ASSIGNMENT / "feedback")},
        {"name": "read the other's nbgrader cache (after feedback)", "op": "read",
         "path": str(victim_home / ".local" / "share" / "jupyter" / "nbgrader_cache")},
        {"name": "list the exchange's feedback folder", "op": "listing",
         "path": str(exchange / course_id() / "feedback")},
        {"name": "read a collected submission", "op": "read", "path": str(submitted)},
        {"name": "write a collected submission", "op": "write",
         "path": str(submitted / f"{NOTEBOOK}.ipynb")},
        {"name": "read the autograded notebooks", "op": "read", "path": str(course / "autograded")},
        {"name": "read the instructor's feedback folder", "op": "read",
         "path": str(course / "feedback")},
        {"name": "read the gradebook (after grading)", "op": "read",
         "path": str(course / "gradebook.db")},
    ]


def api_attacks(hub: Hub, token: str) -> dict[str, tuple[int, object]]:
    """The attacker's own API token against the hub's REST API and the others' servers."""
    cid = course_id()
    tries = {
        "list every user": ("GET", "/hub/api/users", None),
        "read the other's user": ("GET", f"/hub/api/users/{VICTIM}", None),
        "stop the other's server": ("DELETE", f"/hub/api/users/{VICTIM}/server", None),
        "a token for the other": ("POST", f"/hub/api/users/{VICTIM}/tokens", {}),
        "make himself admin": ("PATCH", f"/hub/api/users/{ATTACKER}", {"admin": True}),
        "join the instructors": ("POST", "/hub/api/groups/instructors/users",
                                 {"users": [ATTACKER]}),
        "open the other's files": ("GET", f"/user/{VICTIM}/api/contents/{ASSIGNMENT}", None),
        "the other's assignments": ("GET", f"/user/{VICTIM}/assignments?course_id={cid}", None),
        "the instructor's formgrader": ("GET", f"/user/{INSTRUCTOR}/formgrader/api/status",
                                        None),
    }
    seen = {}
    for name, (method, path, data) in tries.items():
        done = request(f"{hub.url}{path}", method, token=token, data=data, timeout=60)
        try:
            body = done.json()
        except ValueError:
            body = done.body[:200]
        seen[name] = (done.status, body)
    return seen


def instructor_stops_and_starts(hub: Hub, teacher: str, student: str) -> dict:
    """The instructors' role on a student's server: open it (refused), stop it, start it."""
    seen = {"open": hub.server(student, teacher, "GET", "/api/contents/").status,
            "stop": hub.api("DELETE", f"/users/{student}/server", token=teacher).status}
    deadline = time.monotonic() + START_TIMEOUT_S
    while (hub.api("GET", f"/users/{student}", token=teacher).json().get("servers") or {}):
        assert time.monotonic() < deadline, f"{student}'s server did not stop; log: {hub.log}"
        time.sleep(1)
    seen["stopped"] = True
    seen["start"] = hub.api("POST", f"/users/{student}/server", token=teacher).status
    hub.wait_ready(student, teacher)
    seen["ready"] = True
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
        seen: dict = {"course": course, "exchange": base / "exchange",
                      "open_homes_before": {n: home_mode(n) for n in OPEN_HOMES}}

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
        seen["homes"] = {name: home_mode(name) for name in [*STUDENTS, INSTRUCTOR]}
        seen["exchange_modes"] = {
            str(p.relative_to(base)): (stat.S_IMODE(p.stat().st_mode), p.stat().st_uid)
            for p in [base / "exchange", *sorted((base / "exchange").rglob("*"))]
            if p.is_dir() and len(p.relative_to(base / "exchange").parts) <= 2}

        seen["attacks"] = as_user(ATTACKER, base, exchange_attacks(base / "exchange", course))
        seen["api_attacks"] = api_attacks(hub, tokens[ATTACKER])
        hub.mark(f"{ATTACKER} tried {len(seen['attacks']) + len(seen['api_attacks'])} attacks "
                 "on files and the hub's API")

        collected = formgrader(hub, teacher, "POST", f"/assignment/{ASSIGNMENT}/collect")
        seen["collect_log"] = f"{collected.get('log')}\n{collected.get('error')}"
        seen["collected"] = sorted(p.name for p in (course / "submitted").iterdir())
        seen["collected_modes"] = {
            str(p.relative_to(course)): (stat.S_IMODE(p.stat().st_mode), p.stat().st_uid)
            for p in [course / "submitted", *(course / "submitted").rglob("*")]}
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
        seen["attacks"].update(as_user(ATTACKER, base,
                                       graded_class_attacks(base / "exchange", course)))
        seen["instructor_role"] = instructor_stops_and_starts(hub, teacher, ATTACKER)
        hub.mark("the instructor stopped and started a student's server (no access to it)")
        seen["plain_http"] = plain_http_refused(hub.url)
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


# ------------------------------------------------------------------ nobody's work is another's

def test_every_home_is_closed_before_its_server_starts(hub_class):
    """The README's users are made 0700; bob's home was made open (Debian's default) and the hub
    closed it before his server started."""
    assert hub_class["open_homes_before"] == {name: 0o755 for name in OPEN_HOMES}
    assert hub_class["homes"] == {name: 0o700 for name in [*STUDENTS, INSTRUCTOR]}


def test_the_exchange_belongs_to_root_and_the_instructor(hub_class):
    modes = hub_class["exchange_modes"]
    cid = course_id()
    teacher = pwd.getpwnam(INSTRUCTOR).pw_uid
    assert modes["exchange"] == (0o1777, 0), modes
    assert modes[f"exchange/{cid}"] == (0o755, teacher), modes


def test_every_attack_is_printed(hub_class, capsys):
    """What the attacker tried and what each attempt got (for the record)."""
    lines = [f"  {name:55} {outcome}" for name, outcome in hub_class["attacks"].items()]
    lines += [f"  API: {name:50} HTTP {status}"
              for name, (status, _) in hub_class["api_attacks"].items()]
    with capsys.disabled():
        print(f"\n{ATTACKER}'s attempts (as his own Unix user and API token)\n" + "\n".join(lines))
    assert len(lines) == len(hub_class["attacks"]) + len(hub_class["api_attacks"])


def test_every_attack_on_the_files_is_refused(hub_class):
    """bob, as his own Unix user, against alice's files, the instructor's course, the exchange
    and the environment: every attempt is refused by the system (permission or ownership); the
    forged submission can be made (the inbound folder must stay writable) but is refused by
    collect (next test); the environment holds no solution."""
    outcomes = hub_class["attacks"]
    assert len(outcomes) == 28, sorted(outcomes)
    worked = {name: outcome for name, outcome in outcomes.items()
              if not name.startswith(("FORGE", "solutions"))
              and not str(outcome).startswith("refused")}
    assert not worked, f"attacks that worked: {worked}"
    assert outcomes["solutions through the environment"] == []
    assert outcomes["FORGE a newer submission in the other's name"] == "done"


def test_collect_refuses_the_forged_submission(hub_class):
    """The forged folder is newer than alice's own: nbgrader alone would have collected it
    (with a warning). The course's collect refuses it, says so in the formgrader's log, and
    collects alice's own (her full marks: test_gradebook_scores_are_exact)."""
    log = hub_class["collect_log"]
    assert "Refused" in log and f"claims to be {VICTIM}'s submission but belongs to {ATTACKER}" \
        in log, log


def test_collected_submissions_are_the_instructors_alone(hub_class):
    teacher = pwd.getpwnam(INSTRUCTOR).pw_uid
    for path, (mode, owner) in hub_class["collected_modes"].items():
        assert owner == teacher, f"{path} belongs to uid {owner}"
        assert mode & 0o077 == 0, f"{path} has mode {mode:o}"


def test_every_attack_on_the_hubs_api_is_refused(hub_class):
    seen = dict(hub_class["api_attacks"])
    status, users = seen.pop("list every user")
    assert status == 403 or [u["name"] for u in users] == [ATTACKER], (status, users)
    allowed = {name: answer for name, answer in seen.items() if answer[0] not in (403, 404)}
    assert not allowed, f"the hub let {ATTACKER} do: {allowed}"


def test_instructors_stop_and_start_a_students_server_without_opening_it(hub_class):
    seen = hub_class["instructor_role"]
    assert seen["open"] in (403, 404), seen
    assert seen["stop"] in (202, 204) and seen["stopped"], seen
    assert seen["start"] in (201, 202) and seen["ready"], seen


def test_the_hub_serves_https_only(hub_class):
    assert not hub_class["plain_http"].startswith("status 2"), hub_class["plain_http"]
    assert hub_class["plain_http"] != "status 302", hub_class["plain_http"]


def test_the_formgraders_feedback_is_self_contained(hub_class):
    """Generate Feedback in the formgrader writes the course's page: under 200 kB, math as
    MathML, no script from another host (a student's browser sends nothing out)."""
    import re
    for name in STUDENTS:
        for path, page in hub_class["feedback"][name].items():
            assert len(page.encode()) < 200_000, f"{path}: {len(page.encode())} bytes"
            remote = re.findall(r"<(?:script|link)[^>]+(?:src|href)=[\"']?(?:https?:)?//[^>]*>",
                                page, re.I)
            assert not remote, f"{path} loads {remote}"
            assert "mathjax" not in page.lower(), f"{path} still mentions MathJax"
