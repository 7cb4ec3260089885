"""Shared fixtures: the device matrix (CPU always, CUDA where present), seeded generators, a
tiny random GPT that every model-level test can use, a matplotlib Axes for the figure tests, and
a JupyterLab server started as ``course-lab`` starts it (``running_lab``; test_notebooks.py and
test_lab.py use it)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import torch

from llmcore.device import cuda_available
from llmcore.model import GPT, GPTConfig

DEVICES = ["cpu", "cuda"]

os.environ.setdefault("COURSE_CHECK_STANDBY", "0")
"""The learner's check leaves no standby kernel (course/grading/standby.py) in the tests or their
subprocesses: a test asks for one by setting COURSE_CHECK_STANDBY=1 (tests/test_check_standby.py)."""


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    """Runs a test once per device; the CUDA run is skipped, with the reason, where there is none."""
    if request.param == "cuda" and not cuda_available():
        pytest.skip("CUDA is not available on this machine")
    return torch.device(request.param)


@pytest.fixture
def rng() -> np.random.Generator:
    """A fresh, seeded NumPy generator per test: no state shared between cases."""
    return np.random.default_rng(0)


TINY = GPTConfig(vocab_size=61, max_seq_len=48, d_model=24, n_heads=3, n_layers=2)
"""Every size distinct (v != n != d != h ...), so that a transposed or swapped axis cannot pass."""

TINY_GQA = GPTConfig(vocab_size=61, max_seq_len=48, d_model=24, n_heads=4, n_kv_heads=2,
                     n_layers=2)


@pytest.fixture
def tiny_model(device) -> GPT:
    """A randomly initialised tiny GPT in float32 on the test's device."""
    return GPT(TINY, device=device, seed=1).eval()


@pytest.fixture
def tiny_gqa_model(device) -> GPT:
    """The same, with grouped-query attention (4 query heads sharing 2 K/V heads)."""
    return GPT(TINY_GQA, device=device, seed=2).eval()


@pytest.fixture
def ax():
    """A fresh Axes on matplotlib's Agg backend (no window), its figure closed after the test.
    matplotlib is imported here, not at the top: most tests never draw."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots()
    yield ax
    plt.close(fig)


# ------------------------------------------------------------------ a JupyterLab server to test

class Lab:
    """A running JupyterLab server, reached through its REST API with its token."""

    def __init__(self, url: str, token: str, log: Path):
        self.url, self.token, self.log = url, token, log

    def request(self, method: str, path: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                     headers={"Authorization": f"token {self.token}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as response:
            return json.loads(response.read() or b"{}")

    def text(self, path: str) -> str:
        req = urllib.request.Request(f"{self.url}{path}",
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=60) as response:
            return response.read().decode("utf-8")

    def status(self, path: str) -> int:
        """The HTTP status of a GET (redirects not followed)."""
        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args, **kwargs):
                return None
        opener = urllib.request.build_opener(NoRedirect)
        req = urllib.request.Request(f"{self.url}{path}",
                                     headers={"Authorization": f"token {self.token}"})
        try:
            with opener.open(req, timeout=60) as response:
                return response.status
        except urllib.error.HTTPError as error:
            return error.code


LAB_START_TIMEOUT_S = 120


@contextlib.contextmanager
def running_lab(profile: str, log: Path, *extra: str) -> Iterator[Lab]:
    """JupyterLab on the course started as ``course-lab`` starts it for ``profile`` (learner or
    instructor), with its output in ``log`` and ``extra`` arguments; stopped on exit."""
    from course.lab import lab_arguments, write_profile
    from course.site import ROOT, tail, tool_env

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(16)
    runtime = Path(tempfile.mkdtemp(prefix="jupyter-runtime-"))
    config = Path(tempfile.mkdtemp(prefix=f"course-lab-{profile}-"))
    args = [*lab_arguments(ROOT), "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1",
            f"--IdentityProvider.token={token}", "--ServerApp.port_retries=0", *extra]
    env = {**tool_env(), "JUPYTER_CONFIG_DIR": str(write_profile(profile, config)),
           "JUPYTER_RUNTIME_DIR": str(runtime)}
    with open(log, "w", encoding="utf-8") as out:
        server = subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    lab = Lab(f"http://127.0.0.1:{port}", token, log)
    try:
        deadline = time.monotonic() + LAB_START_TIMEOUT_S
        while True:
            if server.poll() is not None:
                pytest.fail(f"jupyter lab exited with {server.returncode}:\n"
                            f"{tail(log.read_text(encoding='utf-8'))}")
            try:
                lab.request("GET", "/api/status")
                break
            except (urllib.error.URLError, ConnectionError, OSError):
                if time.monotonic() > deadline:
                    pytest.fail(f"jupyter lab did not answer within {LAB_START_TIMEOUT_S} s; "
                                f"log: {log}")
                time.sleep(0.5)
        yield lab
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        shutil.rmtree(runtime, ignore_errors=True)
        shutil.rmtree(config, ignore_errors=True)


# ------------------------------------------------- the grading tests' classes (tests/class_runs.py)

@pytest.hookimpl(trylast=True)          # after -m and -k have deselected what they deselect
def pytest_collection_modifyitems(config, items):
    """Start grading the classes the selected tests read, in a child process, and move those
    tests to the end of the run: the grading overlaps the rest of the suite."""
    if any(getattr(getattr(item, "module", None), "CLASS", None) is not None for item in items):
        import class_runs
        items[:] = class_runs.start(items)


def pytest_sessionfinish(session, exitstatus):
    import sys
    if "class_runs" in sys.modules:
        sys.modules["class_runs"].stop()
