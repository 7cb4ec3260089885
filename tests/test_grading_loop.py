"""The learner's and the instructor's loop (issue 34): what the commands say while they run and
when they are misused, where a notebook's seconds go (--profile), and the Makefile's installs.

The fast tests hold the progress lines, the profile's table, course-check's usage and the
Makefile's decisions (a profile installed by hand is stamped, not installed again; make hub needs
no dev install, takes PyTorch's CPU index on Linux, fails loudly, and is skipped without npm).
The slow one runs course-check on an exercise: each test's verdict as it finishes, a first line
at once, no kernel noise, and --profile's split.
"""

from __future__ import annotations

import io
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from classroom import ROOT
from course.grading import sandbox
from course.grading.progress import Progress

BIN = Path(sys.executable).parent
needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="no make here")


def test_course_check_alone_names_itself_and_says_what_it_expects():
    done = subprocess.run([str(BIN / "course-check")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith("usage: course-check "), done.stderr
    assert "python -m course.grading" not in done.stderr
    assert "notebook" in done.stderr and "exercises/01_matmul/matmul.ipynb" in done.stderr


def test_the_other_entry_points_name_themselves():
    for name in ("course-grade", "course-release", "course-edition"):
        done = subprocess.run([str(BIN / name), "--no-such-option"], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 2 and done.stderr.startswith(f"usage: {name} "), done.stderr


def test_progress_off_a_terminal_is_a_line_per_n_notebooks():
    out = io.StringIO()
    with Progress(25, stream=out, every=10, tty=False) as progress:
        for i in range(25):
            progress.update()
            if i == 3:
                progress.write("alice/01_matmul: graded", say=lambda m: print(m, file=out))
    lines = out.getvalue().splitlines()
    assert lines[0] == "alice/01_matmul: graded"
    assert [line.split(",")[0] for line in lines[1:]] == [
        "grading: 10 of 25 notebooks", "grading: 20 of 25 notebooks",
        "grading: 25 of 25 notebooks"]
    assert "left" in lines[1] and "/min" in lines[1] and "in all" in lines[-1]
    assert Progress(440, stream=io.StringIO(), tty=False).every == 44, "a tenth of the class"


def test_progress_on_a_terminal_is_a_bar_with_rate_and_time_left():
    out = io.StringIO()
    with Progress(4, stream=out, tty=True) as progress:
        progress.update(2)
        progress.write("bob/02_attention: graded", say=lambda m: print(m, file=out))
        progress.update(2)
    text = out.getvalue()
    assert "4/4" in text and "notebook" in text and "bob/02_attention: graded" in text


def test_a_profile_is_a_table_of_phases():
    from course.grading.profiling import Profile
    profile = Profile()
    profile.add("kernel start", 3.0)
    profile.add("test cells", 1.0)
    profile.add("test cells", 1.0)
    text = profile.format("Where the seconds went:", wall=6.0)
    assert "kernel start" in text and "50.0%" in text and "x2" in text
    assert "the rest" in text and "wall clock" in text
    assert Profile.from_json(profile.to_json()).phases == profile.phases


# ------------------------------------------------------------------------------ the Makefile

def _make(*args: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), *args],
                          capture_output=True, text=True, timeout=120)


@needs_make
def test_make_stamps_a_profile_installed_by_hand_instead_of_installing_it(tmp_path):
    """The README's pip lines write no stamp: make check after them must not install again."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"               # this environment, seen from another folder
    python.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    start = time.perf_counter()
    done = _make("learner", f"VENV={venv}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the learner profile is installed" in done.stdout and "pip" not in done.stdout
    assert (venv / ".installed-learner").is_file()
    assert time.perf_counter() - start < 60
    dry = _make("-n", "instructor", f"VENV={tmp_path / 'empty'}")
    assert "pip install" in dry.stdout, "an environment without the profile is installed"


@needs_make
def test_make_hub_needs_no_dev_install_and_takes_the_cpu_index_on_linux(tmp_path):
    dry = _make("-n", "hub", f"VENV={tmp_path / 'venv'}")
    assert dry.returncode == 0, dry.stderr
    assert '.[dev]' not in dry.stdout, "make hub must not do the dev install first"
    assert "-m course.hub env" in dry.stdout
    if platform.system() == "Linux":
        assert "--torch-index https://download.pytorch.org/whl/cpu" in dry.stdout
    assert "--torch-index" not in _make("-n", "hub", f"VENV={tmp_path / 'venv'}",
                                        "HUB_TORCH_INDEX=").stdout


@needs_make
def test_make_hub_fails_loudly_and_is_skipped_only_without_npm(tmp_path):
    failed = _make("hub", f"VENV={tmp_path / 'venv'}", "PYTHON=false", "NPM=sh")
    assert failed.returncode != 0, "a hub environment that could not be built fails the target"
    skipped = _make("hub", f"VENV={tmp_path / 'venv'}", "NPM=no-such-npm-here")
    assert skipped.returncode == 0, skipped.stdout + skipped.stderr
    assert "npm is not installed; the hub test will be skipped" in skipped.stdout


# ------------------------------------------------------------------------------ slow

@pytest.mark.skipif(sandbox.sandbox_problem() is not None,
                    reason=f"no sandbox here: {sandbox.sandbox_problem()}")
@pytest.mark.slow
def test_course_check_says_each_verdict_as_it_finishes_and_profiles():
    start = time.perf_counter()
    process = subprocess.Popen([str(BIN / "course-check"), "--profile",
                                "exercises/01_matmul/matmul.ipynb"], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = process.stdout.readline()
    first_seconds = time.perf_counter() - start
    rest = process.stdout.read()
    assert process.wait(timeout=600) == 1
    print(f"first line after {first_seconds:.2f} s\n{first}{rest}")
    assert first.startswith("Checking matmul.ipynb in a fresh kernel")
    assert first_seconds < 5, "the first line comes before the kernel starts (under 1 s idle)"
    assert "KeyboardInterrupt" not in rest and "[IPKernelApp]" not in rest
    lines = rest.splitlines()
    tests = [i for i, line in enumerate(lines) if line.startswith(("  FAIL", "  HIDDEN"))]
    assert tests and max(tests) < next(i for i, line in enumerate(lines)
                                       if line.startswith("Points so far"))
    assert "Not done yet" in rest
    for phase in ("kernel start", "the learner's cells", "test cells", "kernel shutdown",
                  "wall clock"):
        assert phase in rest, phase
