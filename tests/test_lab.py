"""The learner's JupyterLab has no nbgrader instructor tools; the instructor's keeps them.

Checked three ways: the extension lists Jupyter itself prints under each profile's configuration
(``jupyter labextension list``, ``jupyter server extension list``), a running server of each
profile (the formgrader's pages answer only for the instructor; the page configuration that the
browser loads names the disabled plugins), and, where Chromium is installed, the lab in a real
browser (the Nbgrader menu and the notebook toolbar as a learner sees them).
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from conftest import running_lab
from course.lab import (INSTRUCTOR_LAB_PLUGINS, INSTRUCTOR_SERVER_EXTENSIONS, PROFILES,
                        write_profile)
from course.site import BUILD_DIR, ROOT, tool, tool_env

ANSI = re.compile(r"\x1b\[[0-9;]*m")
LEARNER_SERVER_EXTENSIONS = ("nbgrader.server_extensions.validate_assignment",
                             "nbgrader.server_extensions.assignment_list")
"""What the learner's Validate button and assignment list need: they stay enabled."""


def jupyter_listing(profile: str, tmp_path, *args: str) -> str:
    env = {**tool_env(), "JUPYTER_CONFIG_DIR": str(write_profile(profile, tmp_path / profile))}
    done = subprocess.run([tool("jupyter"), *args], cwd=ROOT, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    assert done.returncode == 0, done.stdout
    return ANSI.sub("", done.stdout)


def effective_server_extensions(listing: str) -> dict[str, bool]:
    """The state of each server extension, from ``jupyter server extension list``: the listing
    goes through the configuration folders from the highest priority down (JUPYTER_CONFIG_DIR
    first), and the first folder that names an extension decides it."""
    state: dict[str, bool] = {}
    for name, value in re.findall(r"^\s{4}(\S+) (enabled|disabled)\s*$", listing, re.M):
        state.setdefault(name, value == "enabled")
    return state


@pytest.mark.parametrize("platform, preset, expected", [
    ("darwin", None, "cpu"),           # MPS has no float64: the chapters run on the CPU
    ("darwin", "mps", "mps"),          # unless the learner asks for the Apple GPU
    ("linux", None, None), ("win32", None, None)])
def test_lab_kernels_device_per_platform(monkeypatch, tmp_path, platform, preset, expected):
    from course import lab
    from llmcore.device import DEVICE_VARIABLE
    assert lab.DEVICE_VARIABLE == DEVICE_VARIABLE
    monkeypatch.setattr("sys.platform", platform)
    if preset is None:
        monkeypatch.delenv(DEVICE_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(DEVICE_VARIABLE, preset)
    assert lab.lab_environment("learner", tmp_path).get(DEVICE_VARIABLE) == expected


def test_learner_lab_extension_list_disables_the_instructor_plugins(tmp_path):
    listing = jupyter_listing("learner", tmp_path, "labextension", "list")
    assert re.search(r"@jupyter/nbgrader v[\d.]+ enabled OK", listing), listing
    disabled = listing.split("Disabled extensions:")[-1] if "Disabled extensions:" in listing \
        else ""
    for plugin in INSTRUCTOR_LAB_PLUGINS:
        assert plugin in disabled, f"{plugin} is not disabled for learners:\n{listing}"
    assert "validate-assignment" not in disabled and "assignment-list" not in disabled


def test_instructor_lab_extension_list_keeps_every_plugin(tmp_path):
    listing = jupyter_listing("instructor", tmp_path, "labextension", "list")
    assert "@jupyter/nbgrader:" not in listing.split("Disabled extensions:")[-1] \
        if "Disabled extensions:" in listing else True, listing


@pytest.mark.parametrize("profile", PROFILES)
def test_server_extension_list_per_profile(tmp_path, profile):
    listing = jupyter_listing(profile, tmp_path, "server", "extension", "list")
    state = effective_server_extensions(listing)
    for name in INSTRUCTOR_SERVER_EXTENSIONS:
        assert state.get(name) is (profile == "instructor"), f"{name}: {state.get(name)}"
    for name in LEARNER_SERVER_EXTENSIONS:
        assert state.get(name) is True, f"{name} must stay enabled for the {profile}"


@pytest.fixture(scope="module", params=PROFILES)
def lab(request):
    BUILD_DIR.mkdir(exist_ok=True)
    with running_lab(request.param, BUILD_DIR / f"jupyterlab-{request.param}.log") as server:
        yield request.param, server


@pytest.mark.slow
def test_running_lab_serves_the_instructor_tools_only_to_instructors(lab):
    profile, server = lab
    instructor = profile == "instructor"
    for path in ("/formgrader/api/status", "/formgraders"):        # formgrader, course list
        status = server.status(path)
        assert (status != 404) is instructor, f"{profile}: GET {path} -> {status}"
    for path in ("/assignments/validate", "/assignments"):        # Validate button, assignments
        status = server.status(path)
        assert status != 404, f"{profile}: GET {path} -> {status}: the learner needs it"


@pytest.mark.slow
def test_lab_page_tells_the_browser_which_plugins_are_off(lab):
    profile, server = lab
    page = server.text("/lab")
    found = re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>',
                      page, re.S)
    assert found, "the /lab page carries no jupyter-config-data"
    disabled = json.loads(found.group(1)).get("disabledExtensions", [])
    for plugin in INSTRUCTOR_LAB_PLUGINS:
        assert (plugin in disabled) is (profile == "learner"), f"{profile}: {plugin} {disabled}"


PLUGINS_JS = """async (ids) => {
    await window.jupyterapp.started;
    await window.jupyterapp.restored;
    return Object.fromEntries(ids.map(id => [id, window.jupyterapp.isPluginActivated(id)]));
}"""


@pytest.mark.slow
@pytest.mark.parametrize("profile", PROFILES)
def test_lab_in_a_real_browser(profile):
    """An exercise open in the lab as each audience sees it: nbgrader's instructor plugins run
    only for the instructor; the Validate button is on the learner's notebook toolbar."""
    from test_browser import CHROMIUM_ARGS, chromium_or_skip
    from playwright.sync_api import sync_playwright

    executable = chromium_or_skip()
    exercise = "exercises/01_matmul/matmul.ipynb"
    log = BUILD_DIR / f"jupyterlab-browser-{profile}.log"
    with running_lab(profile, log, "--LabApp.expose_app_in_browser=True") as server, \
            sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"{server.url}/lab/tree/{exercise}?token={server.token}")
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
            plugins = page.evaluate(PLUGINS_JS, [*INSTRUCTOR_LAB_PLUGINS,
                                                 "@jupyter/nbgrader:validate-assignment",
                                                 "@jupyter/nbgrader:assignment-list"])
            validate = page.locator(".jp-NotebookPanel-toolbar", has_text="Validate")
            validate.first.wait_for(timeout=30_000)
            create_tabs = page.locator(".lm-TabBar-tabLabel", has_text="Create Assignment").count()
            page.screenshot(path=str(BUILD_DIR / f"jupyterlab-{profile}.png"))
        finally:
            browser.close()
    instructor = profile == "instructor"
    for plugin in INSTRUCTOR_LAB_PLUGINS:
        assert plugins[plugin] is instructor, f"{profile}'s lab: {plugin} active: {plugins[plugin]}"
    assert (create_tabs > 0) is instructor, f"{profile}'s lab shows {create_tabs} Create " \
                                            "Assignment tabs"
    assert plugins["@jupyter/nbgrader:validate-assignment"] is True
    assert plugins["@jupyter/nbgrader:assignment-list"] is True
