"""Kernels forked from the grade run's zygote (course/grading/sandbox/zygote.py): each one as
walled off from the others as two fresh sandboxes are, and as fresh.

The attacks run as a notebook's code would, in a kernel forked while another kernel of the same
zygote runs and has left traces everywhere it may write: files, a process, a listening socket.
The sandbox's limits (memory, disk, wall clock) are tested for forked kernels in
tests/test_grading_sandbox.py (``kernel_start``).
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from pathlib import Path

import pytest

from course import grading
from course.grading import sandbox

pytestmark = [pytest.mark.skipif(sandbox.sandbox_problem() is not None,
                                 reason=f"no sandbox here: {sandbox.sandbox_problem()}"),
              pytest.mark.slow]             # each test starts sandboxed kernels


@pytest.fixture(scope="module")
def zygote():
    from course.grading.sandbox.zygote import Zygote
    with Zygote() as started:
        yield started


async def _kernel(folder: Path, zygote: str):
    km = sandbox.SandboxedKernelManager(kernel_name="python3", notebook_timeout=120,
                                        zygote=zygote, events_file=str(folder / "events.jsonl"))
    await km.start_kernel(cwd=str(folder))
    kc = km.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=60)
    return km, kc


async def _run(kc, code: str, answer: str | None = None) -> dict:
    """The JSON the code printed last (its error, if it raised); with ``answer``, its input
    requests get that answer."""
    printed = []

    def hook(msg) -> None:
        if msg["msg_type"] == "stream":
            printed.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            printed.append(json.dumps({"error": msg["content"]["evalue"]}))

    if answer is None:
        await kc.execute_interactive(code, timeout=60, output_hook=hook)
    else:
        await kc.execute_interactive(code, timeout=60, output_hook=hook, allow_stdin=True,
                                     stdin_hook=lambda msg: kc.input(answer))
    return json.loads("".join(printed).strip().splitlines()[-1])


async def _stop(km, kc) -> None:
    kc.stop_channels()
    await km.shutdown_kernel(now=True)
    await km.cleanup_resources()


LEAVE_TRACES = """
import json, os, socket, subprocess, sys
token = {token!r}
for folder in ("/tmp", os.path.expanduser("~"), os.getcwd(), "/dev/shm"):
    with open(os.path.join(folder, token), "w") as f:
        f.write(token)
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind("\\0" + token)
listener.listen(1)
loopback = socket.socket()
loopback.bind(("127.0.0.1", 0)) if os.path.exists("/proc/net") else None
sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", token])
print(json.dumps({{"pid": os.getpid(), "sleeper": sleeper.pid}}))
"""

LOOK_FOR_TRACES = """
import ctypes, json, os, socket
token, zygote_socket = {token!r}, {zygote_socket!r}
found = []
for top in ("/tmp", "/home", "/dev/shm", "/run", "/var/tmp"):
    for here, dirs, files in os.walk(top):
        found += [os.path.join(here, name) for name in files + dirs if token in name]
processes = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            processes.append(open(f"/proc/{{pid}}/cmdline", "rb").read().decode(errors="replace"))
        except OSError:
            pass
try:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.connect("\\0" + token)
    reached = True
except OSError:
    reached = False
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
libc = ctypes.CDLL(None, use_errno=True)
unmounted = libc.umount2(b"/tmp", 2) == 0
mounted = libc.mount(b"none", b"/mnt", b"tmpfs", 0, None) == 0
userns_unmount = None
print(json.dumps({{
    "found": found, "processes": processes, "reached": reached, "uid": os.getuid(),
    "caps": [status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")],
    "no_new_privs": status["NoNewPrivs"].strip(), "unmounted": unmounted, "mounted": mounted,
    "zygote_socket": os.path.exists(zygote_socket), "tmp": sorted(os.listdir("/tmp")),
    "pid": os.getpid()}}))
"""


def test_a_forked_kernel_sees_nothing_of_another_running_one(tmp_path, zygote):
    """Kernel A writes a file wherever it may, listens on an abstract socket and leaves a
    process running; kernel B, forked while A still runs, finds none of it, holds no capability
    (so it can neither unmount its fresh /tmp nor mount anything), and cannot reach the zygote."""
    token = uuid.uuid4().hex

    async def run():
        a_dir, b_dir = tmp_path / "a", tmp_path / "b"
        a_dir.mkdir(), b_dir.mkdir()
        km_a, kc_a = await _kernel(a_dir, zygote.socket_path)
        try:
            traces = await _run(kc_a, LEAVE_TRACES.format(token=token))
            km_b, kc_b = await _kernel(b_dir, zygote.socket_path)
            try:
                seen = await _run(kc_b, LOOK_FOR_TRACES.format(
                    token=token, zygote_socket=zygote.socket_path))
                kernel_dir_b = km_b._kernel_dir
            finally:
                await _stop(km_b, kc_b)
        finally:
            await _stop(km_a, kc_a)
        return traces, seen, kernel_dir_b

    traces, seen, kernel_dir_b = asyncio.run(run())
    assert "error" not in traces, traces
    assert traces["pid"] == 2, "a forked kernel is pid 2 of its own namespace, as in bwrap's"
    assert seen["found"] == [], seen
    assert not any(token in command for command in seen["processes"]), seen["processes"]
    assert seen["reached"] is False, "kernel B reached kernel A's abstract socket"
    assert seen["uid"] == sandbox.SANDBOX_UID
    assert seen["caps"] == ["0000000000000000"] * 5, seen["caps"]
    assert seen["no_new_privs"] == "1"
    assert seen["unmounted"] is False and seen["mounted"] is False, seen
    assert seen["zygote_socket"] is False, "the zygote's socket is visible in a kernel"
    # its own folder's parent, and what a fresh sandbox shows too: where the Python
    # environment is bound when it lies under /tmp (a checkout there, as CI's fresh clone)
    environment = {d.split("/")[2] for d in sandbox.python_dirs() if d.startswith("/tmp/")}
    assert sorted(seen["tmp"]) == sorted({kernel_dir_b.parent.name} | environment), seen["tmp"]
    assert _processes_with(token) == [], "kernel A's process outlived it"


FRESH_STATE = """
import json, random, sys, numpy, torch
print(json.dumps({"random": random.random(), "numpy": float(numpy.random.random()),
                  "torch_seed": torch.initial_seed(), "argv0": sys.argv[0],
                  "path0": sys.path[0], "main": sys.modules["__main__"].__name__,
                  "zygote_module": "zygote_server" in sys.modules}))
"""


def test_each_forked_kernel_draws_its_own_random_state_as_a_fresh_one_would(tmp_path, zygote):
    """Python's, NumPy's and torch's generators are seeded from the system's entropy in a
    fresh interpreter: two forked kernels must not share the zygote's draw."""
    async def run(start: str):
        folder = tmp_path / uuid.uuid4().hex
        folder.mkdir()
        km, kc = await _kernel(folder, start)
        try:
            return await _run(kc, FRESH_STATE)
        finally:
            await _stop(km, kc)

    first, second = asyncio.run(run(zygote.socket_path)), asyncio.run(run(zygote.socket_path))
    fresh = asyncio.run(run(""))
    for generator in ("random", "numpy", "torch_seed"):
        assert first[generator] != second[generator], generator
    for key in ("argv0", "path0", "main"):
        assert first[key] == fresh[key], (key, first[key], fresh[key])
    assert first["zygote_module"] is False


def test_a_zygote_that_cannot_fork_leaves_the_kernel_to_start_fresh(tmp_path):
    """A socket that answers nothing (a zygote gone wrong): the kernel starts fresh, in the
    sandbox, and the refusal is an event."""
    path = tmp_path / "zygote.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)

    async def run():
        import threading

        def refuse():
            conn, _ = listener.accept()
            conn.close()
        threading.Thread(target=refuse, daemon=True).start()
        km, kc = await _kernel(tmp_path, str(path))
        try:
            return await _run(kc, "import json, os; print(json.dumps({'uid': os.getuid()}))"), \
                km.from_zygote, km.events
        finally:
            await _stop(km, kc)

    seen, from_zygote, events = asyncio.run(run())
    assert seen == {"uid": sandbox.SANDBOX_UID}
    assert from_zygote is False
    assert [e["kind"] for e in events] == ["zygote-refused"], events


def test_stopping_the_zygote_ends_its_kernels(tmp_path):
    from course.grading.sandbox.zygote import Zygote
    token = uuid.uuid4().hex
    started = Zygote().start()

    async def run():
        km, kc = await _kernel(tmp_path, started.socket_path)
        await _run(kc, LEAVE_TRACES.format(token=token))
        kc.stop_channels()
        return km

    km = asyncio.run(run())
    assert _processes_with(token), "the kernel's process should run"
    started.stop()
    deadline = time.monotonic() + 10
    while _processes_with(token) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_with(token) == []
    assert not Path(started.socket_path).exists()
    asyncio.run(km.cleanup_resources())


def _processes_with(token: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if token.encode() in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                pass
    return found


def test_a_grade_run_forks_every_kernel_and_grades_as_fresh_kernels_do(tmp_path):
    """One class graded twice, with the zygote (the default) and ``zygote=False``: every
    submission's kernel of the first run is forked, none of the second, and every score is the
    same."""
    from classroom import new_course, submission, submit
    from course.grading.profiling import KERNEL_FROM_ZYGOTE, KERNEL_START

    runs = {}
    for zygote in (True, False):
        course = new_course(tmp_path / f"zygote-{zygote}")
        for student, answered in (("honest", True), ("untouched", False)):
            submit(course, student, "01_matmul", submission("01_matmul", answered=answered))
        runs[zygote] = grading.grade(course, gradebook=course / "gradebook.db", timeout=60,
                                     feedback=False, profile=True, workers=2, zygote=zygote)
    forked, fresh = runs[True].profile, runs[False].profile
    notebooks = 2                          # the profile's kernels: the submissions' own
    assert forked.phases[KERNEL_FROM_ZYGOTE][1] == notebooks, forked.phases
    assert KERNEL_START not in forked.phases, forked.phases
    assert fresh.phases[KERNEL_START][1] == notebooks and KERNEL_FROM_ZYGOTE not in fresh.phases
    scores = {zygote: sorted((r.student, r.score, r.status) for r in run.rows)
              for zygote, run in runs.items()}
    assert scores[True] == scores[False], scores
    assert sorted(score for _, score, _ in scores[True]) == [0, 12], scores


def test_the_client_is_ready_once_the_kernel_answered_and_says_when_it_died(tmp_path, zygote):
    """ReadyKernelClient (course/grading/sandbox/client.py): ready without jupyter_client's
    0.2 s of IOPub silence, with the start-up lines' output drained (the first cell sees only
    its own) and the stdin channel connected (the first cell's input request, as a test cell
    asks for its secret, is answered: a kernel's request sent before the client is connected
    is lost), and a kernel that dies while starting is an error, not a wait."""
    async def run(exec_lines: str):
        km = sandbox.SandboxedKernelManager(kernel_name="python3", zygote=zygote.socket_path)
        await km.start_kernel(cwd=str(tmp_path),
                              extra_arguments=[f"--IPKernelApp.exec_lines={exec_lines}"])
        kc = km.client()
        kc.start_channels()
        try:
            await kc.wait_for_ready(timeout=30)
            return type(kc).__name__, await _run(
                kc, "import json; print(json.dumps([input('secret?')]))", answer="1")
        finally:
            kc.stop_channels()
            await km.shutdown_kernel(now=True)
            await km.cleanup_resources()

    for _ in range(3):
        assert asyncio.run(run("print('start-up chatter')")) == ("ReadyKernelClient", ["1"])
    with pytest.raises(RuntimeError, match="Kernel died before replying"):
        asyncio.run(run("import os; os._exit(3)"))
