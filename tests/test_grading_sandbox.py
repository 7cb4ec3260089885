"""The grader against a hostile class: sandboxed kernels, limits, nothing lost, every outcome
explained. Attacks are real submissions (tests/grading/attacks.py), graded in ONE run with honest
students before and after them; those that go for the machine's memory and disk
(tests/grading/resource_attacks.py) in a second run of their own; another test SIGKILLs the grader
mid-run and runs it again.

The fast tests at the top check the sandbox's pieces without nbgrader.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import nbformat
import pytest

from course import grading
from course.grading import sandbox
from classroom import (DATA, cell_scores, count_grades, load_data, new_course, submission, submit,
                       tree_hash)

ROOT = Path(__file__).resolve().parent.parent



attacks = load_data("grading_attacks", DATA / "attacks.py")
resource_attacks = load_data("grading_resource_attacks", DATA / "resource_attacks.py")

CELL_TIMEOUT = 10
NOTEBOOK_TIMEOUT = 40
GREEDY_CELL_TIMEOUT = 60     # a greedy cell must meet its memory or disk limit, not the clock

needs_sandbox = pytest.mark.skipif(sandbox.sandbox_problem() is not None,
                                   reason=f"no sandbox here: {sandbox.sandbox_problem()}")


# ------------------------------------------------------------------------------------------------
# The sandbox's pieces (fast)
# ------------------------------------------------------------------------------------------------

def test_bwrap_command_binds_no_course_folder(tmp_path):
    args = sandbox.bwrap_command(tmp_path)
    binds = [args[i + 1] for i, a in enumerate(args) if a in ("--bind", "--ro-bind",
                                                              "--ro-bind-try")]
    for forbidden in ("solutions", "exercises", "submitted", "gradebook.db", "nbgrader_config"):
        assert not [b for b in binds if forbidden in b], (forbidden, binds)
    assert str(ROOT) not in binds, "the course root itself must never be bound"
    assert "--unshare-all" in args and "--die-with-parent" in args and args[-1] == "--"
    assert args[args.index("--bind") + 1] == str(tmp_path), "only the kernel's socket folder " \
                                                            "is writable"


def test_the_working_folder_gets_no_notebook(tmp_path):
    """The notebook being graded has its hidden tests restored: the kernel must not find it in
    its folder (nor any other notebook of the folder nbgrader started it in)."""
    (tmp_path / "matmul.ipynb").write_text("{}")
    args = sandbox.bwrap_command(tmp_path)
    targets = [args[i + 2] for i, a in enumerate(args) if a in ("--bind", "--ro-bind",
                                                                "--ro-bind-try")]
    assert not [t for t in targets if t.endswith(".ipynb") or t.startswith(sandbox.SANDBOX_WORK)]
    assert ["--dir", sandbox.SANDBOX_WORK] == args[args.index(sandbox.SANDBOX_WORK) - 1:
                                                   args.index(sandbox.SANDBOX_WORK) + 1]


MOUNTS = ("--bind", "--ro-bind", "--ro-bind-try", "--tmpfs", "--dir", "--dev", "--proc",
          "--symlink")


def test_every_writable_mount_is_sized_and_the_rest_is_read_only(tmp_path):
    args = sandbox.bwrap_command(tmp_path)
    tmpfs = {args[i + 1]: args[i - 2:i] for i, a in enumerate(args) if a == "--tmpfs"}
    assert set(tmpfs) == {"/tmp", sandbox.SANDBOX_HOME, "/dev/shm"}, tmpfs
    if sandbox.bwrap_has_size():
        sizes = {path: int(size[1]) // sandbox.MiB for path, size in tmpfs.items()}
        assert sizes == {"/tmp": sandbox.TMPFS_MB, sandbox.SANDBOX_HOME: sandbox.TMPFS_MB,
                         "/dev/shm": sandbox.SHM_MB}, tmpfs
    assert args.index("/dev/shm") > args.index("--dev"), "/dev/shm must be mounted over --dev"
    assert args.count("--bind") == 1, "the connection folder is the one writable host path"
    last_mount = max(i for i, a in enumerate(args) if a in MOUNTS)
    remounts = [args[i + 1] for i, a in enumerate(args) if a == "--remount-ro"]
    assert remounts == ["/dev", "/"] and args.index("--remount-ro") > last_mount, args


def test_the_kernels_share_of_the_cores_reaches_the_sandbox(tmp_path, monkeypatch):
    """grade's workers set OMP_NUM_THREADS to each kernel's share of the cores (cores // workers,
    at least 1) unless the grader's own environment sets it, and the sandbox, which clears the
    environment, passes it on to the kernel."""
    from course.grading.grade import kernel_threads, worker_environment
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert [kernel_threads(w) for w in (1, 2, 3, 8, 16)] == [8, 4, 2, 1, 1]
    env = worker_environment(workers=2)
    assert env["OMP_NUM_THREADS"] == "4"
    monkeypatch.setattr(os, "environ", env)
    args = sandbox.bwrap_command(tmp_path)
    assert ["--setenv", "OMP_NUM_THREADS", "4"] == args[args.index("OMP_NUM_THREADS") - 1:
                                                       args.index("OMP_NUM_THREADS") + 2]
    monkeypatch.setattr(os, "environ", {**env, "OMP_NUM_THREADS": "3"})
    assert worker_environment(workers=2)["OMP_NUM_THREADS"] == "3"      # the grader's choice


def test_the_python_environment_is_bound_over_the_private_tmp(tmp_path, monkeypatch):
    """A checkout (and its .venv) under /tmp, as a fresh clone in CI may be: the environment must
    be mounted after the private /tmp, or the sandbox hides the kernel's own interpreter."""
    monkeypatch.setattr(sandbox.bwrap, "python_dirs", lambda: ["/tmp/somewhere/.venv"])
    args = sandbox.bwrap_command(tmp_path)
    tmpfs = args.index("/tmp", args.index("--tmpfs"))
    bound = [i for i, a in enumerate(args) if a == "/tmp/somewhere/.venv"]
    assert bound and min(bound) > tmpfs, args


LIMITS = "import resource as r; print(*(r.getrlimit(x)[1] for x in (r.RLIMIT_AS, r.RLIMIT_FSIZE)))"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS is set on Linux")
def test_the_launcher_limits_address_space_and_file_size():
    import resource
    done = subprocess.run([*sandbox.limit_command(2048), sys.executable, "-c", LIMITS],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    address_space, file_size = map(int, done.stdout.split())
    assert address_space == sandbox.address_space_mb(2048) * sandbox.MiB
    assert sandbox.address_space_mb(2048) == 2048 + sandbox.KERNEL_VIRTUAL_MB + \
        sandbox.THREAD_VIRTUAL_MB * (os.cpu_count() or 1)
    assert file_size == sandbox.MAX_FILE_MB * sandbox.MiB
    unlimited = subprocess.run([*sandbox.limit_command(0), sys.executable, "-c", LIMITS],
                               capture_output=True, text=True, timeout=60)
    assert unlimited.stdout.split() == [str(resource.RLIM_INFINITY), str(file_size)]


def _can_make_a_cgroup() -> bool:
    group = sandbox.MemoryCgroup.create(64)
    if group is not None:
        group.remove()
    return group is not None


needs_cgroup = pytest.mark.skipif(not _can_make_a_cgroup(), reason="this process may not make a "
                                  "memory cgroup (the watchdog caps memory here)")


@needs_cgroup
def test_a_memory_cgroup_stops_its_processes_at_its_limit():
    """Whatever way a process asks: a memfd file written without any map counts as well."""
    for code in ("x = b'x' * 2**28", "import os; fd = os.memfd_create('m')\n"
                                     "for _ in range(8): os.write(fd, b'x' * 2**25)"):
        group = sandbox.MemoryCgroup.create(64)
        try:
            done = subprocess.run([*sandbox.limit_command(0, cgroup=group), sys.executable, "-c",
                                   code], capture_output=True, timeout=60)
            assert done.returncode == -signal.SIGKILL and group.oom_kills() == 1, done
        finally:
            group.remove()
        assert not group.path.exists()


def test_the_watchdog_measures(tmp_path):
    """What the watchdog reads: the folder (each entry at least ENTRY_BYTES, the count stopping
    past its limit), deleted files still held, memfd files, resident memory, a process tree."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "empty").touch()
    (tmp_path / "data").write_bytes(b"x" * sandbox.MiB)
    assert sandbox.folder_bytes(tmp_path, 10 * sandbox.MiB) == sandbox.MiB + 2 * \
        sandbox.ENTRY_BYTES
    many = tmp_path / "many"
    many.mkdir()
    for i in range(100):
        (many / f"f{i}").touch()
    assert sandbox.folder_bytes(many, 8 * sandbox.ENTRY_BYTES) == 9 * sandbox.ENTRY_BYTES, \
        "the count stops past its limit"
    hidden = open(tmp_path / "hidden", "wb")
    memfd = os.memfd_create("measured")
    try:
        os.unlink(hidden.name)
        os.write(memfd, b"m" * sandbox.MiB)
        deleted, memfds = sandbox.held_files([os.getpid()])
        assert str(tmp_path / "hidden") in deleted
        assert sandbox.MiB in memfds.values()
    finally:
        hidden.close()
        os.close(memfd)
    assert sandbox.resident_bytes([os.getpid()]) > sandbox.MiB
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert {os.getpid(), child.pid} <= set(sandbox.sandbox_pids(os.getpid()))
    finally:
        child.kill()
        child.wait()


def test_stop_reason_is_the_first_limit_a_kernel_hit():
    events = [{"kind": "unsandboxed", "reason": "test"}]
    assert sandbox.stop_reason(events) is None
    events += [sandbox.stopped_event("disk", limit_mb=16),
               sandbox.stopped_event("memory", limit_mb=2048, how="cgroup")]
    assert sandbox.stop_reason(events).startswith("disk: the kernel wrote more than 16 MiB")
    assert sandbox.stopped_event("timeout", seconds=8)["message"] == \
        "timeout: the notebook ran past 8 s and its sandbox was killed"


def test_grading_refuses_without_a_sandbox(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox, "sandbox_problem", lambda: "bwrap is not installed (test)")
    (tmp_path / "submitted").mkdir()
    with pytest.raises(sandbox.SandboxUnavailable, match="bwrap is not installed.*"
                                                          "--unsandboxed-trusted"):
        grading.grade(tmp_path, config_file=ROOT / "nbgrader_config.py")
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from course.grading import sandbox, cli; "
         "sandbox.sandbox_problem = lambda: 'no user namespaces (test)'; "
         f"sys.exit(cli.main(['grade', '--course-dir', {str(tmp_path)!r}]))"],
        cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2 and "no user namespaces (test)" in done.stderr, done.stderr


def test_kernel_manager_refuses_to_autograde_without_a_sandbox(monkeypatch):
    monkeypatch.setattr(sandbox.manager, "sandbox_problem", lambda: "bwrap is not installed (test)")
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    km = sandbox.SandboxedKernelManager(kernel_name="python3")
    with pytest.raises(sandbox.SandboxUnavailable, match="unsandboxed_trusted"):
        asyncio.run(km.start_kernel())


@pytest.mark.slow
def test_the_learners_check_runs_unsandboxed_with_a_warning_where_bwrap_cannot_start():
    code = ("import sys; from course.grading import sandbox, cli; "
            "sandbox.manager.sandbox_problem = lambda: 'no user namespaces (test)'; "
            "sys.exit(cli.main(['check', 'exercises/01_matmul/matmul.ipynb', '--timeout', '60']))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL    test_dot: 0 of 1 point" in done.stdout, done.stdout
    assert "warning: running notebooks WITHOUT the sandbox: no user namespaces (test)" \
        in done.stderr, done.stderr


@pytest.fixture(scope="module")
def zygote():
    """A zygote for this module's kernels (course/grading/sandbox/zygote.py)."""
    if sandbox.sandbox_problem() is not None:
        pytest.skip(f"no sandbox here: {sandbox.sandbox_problem()}")
    from course.grading.sandbox.zygote import Zygote
    with Zygote() as started:
        yield started.socket_path


@pytest.fixture(params=["fresh", "zygote"])
def kernel_start(request) -> str:
    """How the test's kernels start: each one fresh (""), or forked by the zygote (its socket).
    The sandbox's guarantees must hold either way."""
    return request.getfixturevalue("zygote") if request.param == "zygote" else ""


async def _sandboxed_kernel(cwd: Path, *, notebook_timeout: int, zygote: str = "", **limits):
    """A started SandboxedKernelManager and its ready client; its events also go to
    cwd/events.jsonl (as a grader's worker asks). zygote: the socket of the zygote to fork it
    from ("": started fresh)."""
    km = sandbox.SandboxedKernelManager(kernel_name="python3", notebook_timeout=notebook_timeout,
                                        events_file=str(cwd / "events.jsonl"), zygote=zygote,
                                        **limits)
    await km.start_kernel(cwd=str(cwd))
    assert km.from_zygote == bool(zygote), km.events
    kc = km.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=60)
    return km, kc


async def _run_in_kernel(km, kc, code: str, timeout: float = 60) -> str:
    """What code printed in the kernel (its error's name and value too), then the kernel shut
    down as nbclient does it (a kernel that died meanwhile only gets cleanup_resources)."""
    seen = []

    def hook(msg) -> None:
        if msg["msg_type"] == "stream":
            seen.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            seen.append(f"{msg['content']['ename']}: {msg['content']['evalue']}\n")

    run = asyncio.ensure_future(kc.execute_interactive(code, timeout=timeout, output_hook=hook))
    while not run.done() and await km.is_alive():
        await asyncio.wait([run], timeout=0.5)
    run.cancel()
    kc.stop_channels()
    if await km.is_alive():
        await km.shutdown_kernel(now=True)
    await km.cleanup_resources()
    return "".join(seen)


@needs_sandbox
@pytest.mark.slow
def test_a_sandboxed_kernel_sees_no_notebook_and_leaves_nothing(tmp_path, kernel_start):
    """The working folder is empty: the notebook nbgrader runs (hidden tests restored) is not in
    it, through /proc/self/cwd either."""
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "mine.ipynb").write_text("BEGIN HIDDEN TESTS")
    (folder / "secret.txt").write_text("not for the kernel")
    token = uuid.uuid4().hex

    async def run() -> str:
        km, kc = await _sandboxed_kernel(folder, notebook_timeout=60, zygote=kernel_start)
        code = ("import glob, os, subprocess, sys\n"
                "root = %r\n"
                "print(sorted(os.listdir('.')), os.getuid(),"
                " sorted(os.listdir(root)) if os.path.isdir(root) else [],"
                " glob.glob('/proc/*/cwd/*'))\n"
                "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', %r],"
                " start_new_session=True)\n" % (str(ROOT), token))
        return await _run_in_kernel(km, kc, code, timeout=30)

    seen = asyncio.run(run())
    # The course root shows at most the mount point of a virtual environment kept inside it.
    assert seen.strip() in ("[] 1000 [] []", "[] 1000 ['.venv'] []"), seen
    time.sleep(0.5)
    assert not _processes_with(token), "a process started in the sandbox outlived its kernel"


@needs_sandbox
@pytest.mark.slow
def test_the_wall_clock_kills_a_kernel_that_ignores_sigint(tmp_path, kernel_start):
    token = uuid.uuid4().hex

    async def run() -> bool:
        km, kc = await _sandboxed_kernel(tmp_path, notebook_timeout=8, zygote=kernel_start)
        kc.execute("import signal, subprocess, sys\n"
                   "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                   "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)',"
                   f" {token!r}])\n"
                   "while True:\n    pass\n")
        await asyncio.sleep(2)
        await km.interrupt_kernel()
        await asyncio.sleep(1)
        alive_after_interrupt = await km.is_alive()
        await asyncio.sleep(8)
        alive = await km.is_alive()
        kc.stop_channels()
        await km.shutdown_kernel(now=True)
        return alive_after_interrupt and not alive, km.events

    survived_and_died, events = asyncio.run(run())
    assert survived_and_died, "the kernel must survive the interrupt and die at the wall clock"
    assert sandbox.stopped_event("timeout", seconds=8) in events
    time.sleep(0.5)
    assert not _processes_with(token)


MEMFD_HOARD = """
import os
fds = []
while True:
    fds.append(os.memfd_create("hoard"))
    os.write(fds[-1], b"m" * 2**25)
"""


@needs_sandbox
@pytest.mark.slow
@pytest.mark.parametrize("how", ["cgroup", "watchdog"])
def test_a_kernel_past_its_memory_is_stopped_with_its_reason(tmp_path, monkeypatch, how,
                                                               kernel_start):
    """memfd files written without a map count in no rlimit: the cgroup (where this process
    may make one) or else the watchdog stops the sandbox, and says why."""
    if how == "cgroup" and not _can_make_a_cgroup():
        pytest.skip("this process may not make a memory cgroup")
    if how == "watchdog":
        monkeypatch.setattr(sandbox.MemoryCgroup, "create", classmethod(lambda cls, mb: None))
    shared = _meminfo("Shmem")

    async def run() -> list[dict]:
        km, kc = await _sandboxed_kernel(tmp_path, notebook_timeout=60, memory_limit_mb=1024,
                                         zygote=kernel_start)
        group = km._cgroup
        await _run_in_kernel(km, kc, MEMFD_HOARD, timeout=30)
        assert group is None or not group.path.exists(), "the kernel's cgroup outlived it"
        return km.events

    events = asyncio.run(run())
    assert events == [sandbox.stopped_event("memory", limit_mb=1024, how=how)]
    assert sandbox.read_events(tmp_path / "events.jsonl") == events, "the job's file has them"
    deadline = time.monotonic() + 10            # a killed process's memory is freed soon after
    while _meminfo("Shmem") > shared + 256 * sandbox.MiB and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _meminfo("Shmem") < shared + 256 * sandbox.MiB, "the memfd files outlived the kernel"


@needs_sandbox
@pytest.mark.slow
def test_a_kernel_that_floods_its_connection_folder_is_stopped_with_its_reason(tmp_path,
                                                                              kernel_start):
    flood = ("import os, sys\n"
             "folder = os.path.dirname(next(a for a in sys.argv if a.endswith('kernel.json')))\n"
             "for i in range(1000):\n"
             "    open(os.path.join(folder, f'f{i}'), 'wb').write(b'd' * 2**20)\n")

    async def run() -> tuple[Path, list[dict]]:
        km, kc = await _sandboxed_kernel(tmp_path, notebook_timeout=60, zygote=kernel_start)
        folder = km._kernel_dir
        await _run_in_kernel(km, kc, flood, timeout=30)
        return folder, km.events

    folder, events = asyncio.run(run())
    assert events == [sandbox.stopped_event("disk", limit_mb=sandbox.KERNEL_DIR_MB)]
    assert not folder.exists()


SOLUTIONS_PEAK = """
import resource
peak = next(int(line.split()[1]) for line in open("/proc/self/status")
            if line.startswith("VmPeak:")) * 1024
print("ADDRESS SPACE", peak, resource.getrlimit(resource.RLIMIT_AS)[1])
"""


@needs_sandbox
@pytest.mark.slow
def test_the_solutions_leave_a_notebook_its_memory_limit_of_address_space(tmp_path):
    """RLIMIT_AS is the memory limit plus a measured margin (what a kernel reserves without
    using it): after every solution notebook has run in one kernel, what is left of the address
    space must still be at least the memory limit."""
    code = "import torch, llmcore, llmcheck\n"
    for notebook in sorted((ROOT / "solutions").glob("*/*.ipynb")):
        nb = nbformat.read(notebook, as_version=4)
        code += "\n".join(c.source for c in nb.cells if c.cell_type == "code") + "\n"

    async def run() -> str:
        km, kc = await _sandboxed_kernel(tmp_path, notebook_timeout=300)
        return await _run_in_kernel(km, kc, code + SOLUTIONS_PEAK, timeout=240)

    printed = asyncio.run(run())
    found = re.search(r"ADDRESS SPACE (\d+) (\d+)", printed)
    assert found, printed[-3000:]
    peak, limit = map(int, found.groups())
    assert limit == sandbox.address_space_mb(2048) * sandbox.MiB
    assert limit - peak >= 2048 * sandbox.MiB, (peak / sandbox.MiB, limit / sandbox.MiB)


def _meminfo(name: str) -> int:
    """A /proc/meminfo line, in bytes (Shmem: tmpfs and memfd files, shared maps)."""
    with open("/proc/meminfo") as meminfo:
        return next(int(line.split()[1]) * 1024 for line in meminfo
                    if line.startswith(f"{name}:"))


def _processes_with(token: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if token.encode() in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
    return found


# ------------------------------------------------------------------------------------------------
# A hostile class, graded in one run
# ------------------------------------------------------------------------------------------------

def _attack_notebook(attack, course: Path, token: str):
    nb = submission(attack.assignment, answered=attack.answered)
    code = attack.code.format(course=course, token=token, grader_pid=os.getpid())
    first_answer = next(i for i, c in enumerate(nb.cells)
                        if c.metadata.get("nbgrader", {}).get("solution"))
    nb.cells.insert(first_answer, nbformat.v4.new_code_cell(code))
    for cell in list(nb.cells):
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade_id") in attack.delete:
            nb.cells.remove(cell)
        elif meta.get("grade_id") in attack.rename:
            meta["grade_id"] = attack.rename[meta["grade_id"]]
    return nb


class _Honest:
    def __init__(self, student):
        self.student, self.assignment = student, "01_matmul"


HONEST = [_Honest("aa_honest"), _Honest("zz_honest")]


def _printed(notebook: Path) -> str:
    """Everything the notebook's cells printed (stream outputs), not their source."""
    nb = nbformat.read(notebook, as_version=4)
    return "".join(out.get("text", "") for cell in nb.cells for out in cell.get("outputs", [])
                   if out.get("output_type") == "stream")


def _attacks_between_honest_students(course: Path, attacks_: list) -> str:
    """Submit each attack (its notebook made with a fresh token, returned) between two honest
    students of exercise 1."""
    token = uuid.uuid4().hex
    honest = submission("01_matmul", answered=True)
    submit(course, "aa_honest", "01_matmul", honest)
    for attack in attacks_:
        submit(course, attack.student, attack.assignment, _attack_notebook(attack, course, token))
    submit(course, "zz_honest", "01_matmul", honest)
    return token


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    if sandbox.sandbox_problem() is not None:
        pytest.skip(f"no sandbox here: {sandbox.sandbox_problem()}")
    course = new_course(tmp_path_factory.mktemp("hostile"))
    submit(course, "aa_blank", "01_matmul", submission("01_matmul", answered=False))
    token = _attacks_between_honest_students(course, attacks.ATTACKS)
    # Submissions made of symbolic links to another student's work.
    linked = course / "submitted" / "links_notebook" / "01_matmul"
    linked.mkdir(parents=True)
    (linked / "matmul.ipynb").symlink_to(course / "submitted" / "aa_honest" / "01_matmul" /
                                         "matmul.ipynb")
    (course / "submitted" / "links_folder").symlink_to(course / "submitted" / "aa_honest")
    before = tree_hash(course)
    run = grading.grade(course, timeout=CELL_TIMEOUT, notebook_timeout=NOTEBOOK_TIMEOUT,
                        log=lambda message: print(message, flush=True))
    print(run.summary())
    with open(course / "course_grades.csv", newline="") as f:
        table = {(r["student_id"], r["assignment"]): r for r in csv.DictReader(f)}
    return course, token, before, run, table


@pytest.mark.slow
def test_honest_students_keep_their_exact_scores(hostile):
    course, _, _, run, table = hostile
    for student, score in (("aa_honest", 12), ("zz_honest", 12), ("aa_blank", 0)):
        row = table[(student, "01_matmul")]
        assert row["status"] == "graded" and float(row["score"]) == score, row
    cells = cell_scores(course / "gradebook.db", "zz_honest", "01_matmul")
    assert all(score == top for score, top in cells.values()), cells


@pytest.mark.slow
@pytest.mark.parametrize("attack", attacks.ATTACKS, ids=[a.student for a in attacks.ATTACKS])
def test_no_attack_scores_above_its_honest_work(hostile, attack):
    course, _, _, _, table = hostile
    row = table[(attack.student, attack.assignment)]
    assert float(row["score"]) <= attack.max_score, row
    assert row["status"].startswith("failed:") == attack.fails, row
    if attack.reason:
        assert attack.reason in row["status"] + row["reasons"], row
    graded = course / "autograded" / attack.student / attack.assignment / "matmul.ipynb"
    if not attack.fails:
        assert float(row["score"]) == attack.max_score, row
        text = _printed(graded)
        assert "SUCCEEDED" not in text, [line for line in text.splitlines()
                                          if "SUCCEEDED" in line]


@pytest.mark.slow
def test_a_submission_of_symbolic_links_gets_nothing(hostile):
    _, _, _, _, table = hostile
    row = table[("links_notebook", "01_matmul")]
    assert float(row["score"]) == 0 and "symbolic link" in row["reasons"], row
    row = table[("links_folder", "01_matmul")]
    assert float(row["score"]) == 0 and row["status"].startswith("refused:"), row


@pytest.mark.slow
def test_every_probe_was_blocked(hostile):
    course, _, _, _, _ = hostile
    outputs = "".join(_printed(course / "autograded" / a.student / a.assignment / "matmul.ipynb")
                      for a in [*attacks.ATTACKS, *HONEST] if not getattr(a, "fails", False))
    assert "SUCCEEDED" not in outputs
    for probe in ("read_solutions", "read_gradebook", "read_config", "read_other",
                  "write_gradebook", "write_other", "write_solutions", "sitecustomize",
                  "pth_file", "llmcore", "kill_parent", "kill_grader", "tcp", "dns"):
        assert f"ATTACK {probe} BLOCKED" in outputs, probe


@pytest.mark.slow
def test_the_course_is_unchanged_except_for_the_grader_outputs(hostile):
    course, token, before, _, _ = hostile
    time.sleep(5)
    assert tree_hash(course) == before
    assert not (course / "daemon_was_here").exists() and not (course / "planted.txt").exists()
    assert not _processes_with(token), "a daemon outlived its kernel"


@pytest.mark.slow
def test_every_failure_has_its_reason_in_the_csv(hostile):
    _, _, _, _, table = hostile
    for (student, _), row in table.items():
        if float(row["score"]) < float(row["max_score"]):
            assert row["reasons"] or row["status"].startswith("failed:"), row
    blank = table[("aa_blank", "01_matmul")]["reasons"]
    assert "test_dot: NotImplementedError: replace this line with your code" in blank
    renamed = table[("renames_tests", "01_matmul")]["reasons"]
    assert "test_dot: locked test cell missing or its grade_id renamed" in renamed
    assert "test_matmul: locked test cell missing" in renamed


@pytest.mark.slow
def test_feedback_hides_hidden_tests_and_needs_no_network(hostile):
    course, _, _, _, _ = hostile
    page = (course / "feedback" / "aa_blank" / "01_matmul" / "matmul.html").read_text()
    assert "BEGIN HIDDEN TESTS" not in page and "Hidden tests: their code is not shown" in page
    assert "test_matmul_hidden" in page and "NotImplementedError" in page
    assert not re.findall(r"<(?:script|link)[^>]*(?:src|href)=[\"']https?://", page), \
        "the page loads something from the network"
    assert "<math" in page and "<script" not in page, "math as MathML, no script"


@pytest.mark.slow
def test_the_grade_run_reports_its_throughput(hostile):
    _, _, _, run, _ = hostile
    assert run.notebooks == len(attacks.ATTACKS) + 4 and run.workers == (os.cpu_count() or 1)
    summary = run.summary()
    assert "notebooks/min" in summary and "s per notebook" in summary


# ------------------------------------------------------------------------------------------------
# A greedy class: submissions that go for the machine's memory and disk, graded in one run
# ------------------------------------------------------------------------------------------------

def _disk_free(path: str = "/tmp") -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def _stale_cgroups() -> list[Path]:
    """Kernel cgroups left under this process's memory cgroups by grader processes now gone."""
    return [path for _, parent in sandbox.own_memory_cgroups()
            for path in parent.glob(f"{sandbox.CGROUP_PREFIX}*")
            if not Path(f"/proc/{path.name[len(sandbox.CGROUP_PREFIX):].split('-')[0]}").exists()]


@pytest.fixture(scope="module")
def greedy(tmp_path_factory):
    if sandbox.sandbox_problem() is not None:
        pytest.skip(f"no sandbox here: {sandbox.sandbox_problem()}")
    course = new_course(tmp_path_factory.mktemp("greedy"))
    _attacks_between_honest_students(course, resource_attacks.RESOURCE_ATTACKS)
    before = {"shmem": _meminfo("Shmem"), "disk": _disk_free()}
    run = grading.grade(course, timeout=GREEDY_CELL_TIMEOUT, notebook_timeout=2 * NOTEBOOK_TIMEOUT,
                        log=lambda message: print(message, flush=True))
    print(run.summary())
    time.sleep(1)
    after = {"shmem": _meminfo("Shmem"), "disk": _disk_free()}
    with open(course / "course_grades.csv", newline="") as f:
        table = {(r["student_id"], r["assignment"]): r for r in csv.DictReader(f)}
    return course, table, before, after


@pytest.mark.slow
@pytest.mark.parametrize("attack", resource_attacks.RESOURCE_ATTACKS,
                         ids=[a.student for a in resource_attacks.RESOURCE_ATTACKS])
def test_a_greedy_submission_ends_with_its_own_reason(greedy, attack):
    _, table, _, _ = greedy
    row = table[(attack.student, attack.assignment)]
    assert row["status"].startswith("failed:") == attack.fails, row
    if attack.reason:
        assert attack.reason in row["status"] + row["reasons"], row
    assert float(row["score"]) == attack.max_score, row     # honest marks, or 0 when stopped


@pytest.mark.slow
def test_honest_students_beside_greedy_ones_keep_full_marks(greedy):
    course, table, _, _ = greedy
    for student in ("aa_honest", "zz_honest"):
        row = table[(student, "01_matmul")]
        assert (row["status"], float(row["score"]), row["reasons"]) == ("graded", 12, ""), row
    cells = cell_scores(course / "gradebook.db", "zz_honest", "01_matmul")
    assert all(score == top for score, top in cells.values()), cells


@pytest.mark.slow
def test_greedy_probes_were_blocked(greedy):
    course, _, _, _ = greedy
    outputs = "".join(_printed(course / "autograded" / a.student / a.assignment / "matmul.ipynb")
                      for a in resource_attacks.RESOURCE_ATTACKS if not a.fails)
    assert "SUCCEEDED" not in outputs, [line for line in outputs.splitlines()
                                        if "SUCCEEDED" in line]
    for probe in resource_attacks.PROBES:
        assert f"ATTACK {probe} BLOCKED" in outputs, probe


@pytest.mark.slow
def test_the_machine_has_its_memory_and_disk_back_after_a_greedy_class(greedy):
    """Every kernel's memory (tmpfs and memfd files: Shmem), its connection folder and its
    cgroup are gone once the run is over."""
    _, _, before, after = greedy
    assert after["shmem"] < before["shmem"] + 256 * sandbox.MiB, (before, after)
    assert after["disk"] > before["disk"] - 256 * sandbox.MiB, (before, after)
    leftovers = [path for path in Path("/tmp").glob("k*/*")
                 if path.name.startswith(("fill", "big", "hidden"))]
    assert not leftovers, leftovers
    assert not _stale_cgroups()


# ------------------------------------------------------------------------------------------------
# A grader killed mid-run loses nothing
# ------------------------------------------------------------------------------------------------

def _graded_students(gradebook: Path) -> set[str]:
    if not gradebook.exists():
        return set()
    with contextlib.closing(sqlite3.connect(gradebook)) as db:
        try:
            return {r[0] for r in db.execute("select student_id from submitted_assignment")}
        except sqlite3.OperationalError:
            return set()


@pytest.mark.slow
def test_trusted_notebooks_can_be_graded_without_a_sandbox(tmp_path_factory):
    course = new_course(tmp_path_factory.mktemp("trusted"))
    submit(course, "trusted", "01_matmul", submission("01_matmul", answered=True))
    env = dict(os.environ, COURSE_BWRAP="/nonexistent/bwrap")
    command = [sys.executable, "-m", "course.grading", "grade", "--course-dir", str(course),
               "--timeout", str(CELL_TIMEOUT), "--no-feedback"]
    refused = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "bubblewrap (/nonexistent/bwrap) is not installed" in refused.stderr
    assert "--unsandboxed-trusted" in refused.stderr and not (course / "autograded").exists()
    done = subprocess.run([*command, "--unsandboxed-trusted"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING: grading WITHOUT a sandbox" in done.stdout
    with open(course / "course_grades.csv", newline="") as f:
        (row,) = csv.DictReader(f)
    assert (row["status"], row["score"]) == ("graded", "12"), row


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` now (Linux /proc)."""
    parent = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, up in parent.items() if up in frontier} - found
        found |= frontier
    return found


def _running(pid: int) -> bool:
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return "?"


def _scores(course: Path, student: str) -> dict:
    return cell_scores(course / "gradebook.db", student, "01_matmul")


@needs_sandbox
@pytest.mark.slow
def test_a_grader_killed_mid_run_keeps_every_grade(tmp_path_factory):
    course = new_course(tmp_path_factory.mktemp("killed"))
    students = [f"s{i}" for i in range(3)]
    for student in students:
        submit(course, student, "01_matmul", submission("01_matmul", answered=True))
    command = [sys.executable, "-m", "course.grading", "grade", "--course-dir", str(course),
               "--timeout", str(CELL_TIMEOUT), "--workers", "1", "--no-feedback"]
    grader = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not _graded_students(course / "gradebook.db") and time.monotonic() < deadline:
        time.sleep(0.2)
    first = _graded_students(course / "gradebook.db")
    running = _descendants(grader.pid)     # the fork server, the next job, its sandboxed kernel
    grader.send_signal(signal.SIGKILL)
    grader.wait()
    assert first and len(first) < len(students), first
    assert running, "the grader had no worker process while it graded"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_running(pid) for pid in running):
        time.sleep(0.2)
    left = {pid: _command(pid) for pid in running if _running(pid)}
    assert not left, f"processes of the killed grader still run: {left}"
    scores = {s: _scores(course, s) for s in first}
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    with open(course / "course_grades.csv", newline="") as f:
        table = {r["student_id"]: r for r in csv.DictReader(f)}
    assert set(table) == set(students)
    for student in students:
        assert float(table[student]["score"]) == 12, table[student]
        expected = "graded earlier" if student in first else "graded"
        assert table[student]["status"] == expected, (student, table[student])
    assert {s: _scores(course, s) for s in first} == scores
    # --force grades everything again, replacing (not duplicating) each submission's grades.
    grades = count_grades(course / "gradebook.db")
    forced = subprocess.run([*command[:-3], "--force", "--workers", "2", "--no-feedback"],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert forced.returncode == 0, forced.stdout + forced.stderr
    with open(course / "course_grades.csv", newline="") as f:
        again = {r["student_id"]: (r["status"], r["score"]) for r in csv.DictReader(f)}
    assert again == {s: ("graded", "12") for s in students}
    assert count_grades(course / "gradebook.db") == grades
    assert "notebooks/min" in forced.stdout and "s per notebook" in forced.stdout


# ------------------------------------------------------------------------------------------------
# Releasing never overwrites a learner's edits
# ------------------------------------------------------------------------------------------------

def test_release_refuses_to_overwrite_edited_exercises(tmp_path):
    from course.grading.release import BACKUP_DIR, EditedExercises
    new_course(tmp_path)
    first = grading.release(tmp_path)
    assert grading.release(tmp_path) == first, "an untouched release is replaced silently"
    edited = tmp_path / "exercises" / "01_matmul" / "matmul.ipynb"
    nb = nbformat.read(edited, as_version=4)
    nb.cells[0].source += "\nmy notes"
    nbformat.write(nb, str(edited))
    mine = edited.read_bytes()
    with pytest.raises(EditedExercises, match=r"(?s)1 notebook.*01_matmul/matmul.ipynb.*--force"):
        grading.release(tmp_path)
    assert edited.read_bytes() == mine, "a refused release must not touch the notebook"
    grading.release(tmp_path, force=True)
    backups = list((tmp_path / BACKUP_DIR).glob("*/01_matmul/matmul.ipynb"))
    assert len(backups) == 1 and backups[0].read_bytes() == mine
    assert edited.read_bytes() != mine


def test_the_learner_edition_has_no_solutions_or_grading_data(tmp_path):
    out = tmp_path / "edition"
    done = subprocess.run([sys.executable, "-m", "course.grading", "edition", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    files = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert {"exercises/01_matmul/matmul.ipynb", "llmcore/__init__.py", "_toc.yml",
            "README.md", "nbgrader_config.py"} <= files
    assert any(f.startswith("chapters/") for f in files)
    leaked = [f for f in files if f.startswith(("solutions/", "tests/grading/", "submitted/"))
              or "test_grading" in f or f.endswith(".db")]
    assert not leaked, leaked
    for notebook in out.rglob("*.ipynb"):
        text = notebook.read_text()
        assert "BEGIN HIDDEN TESTS" not in text and "BEGIN SOLUTION" not in text, notebook
    again = subprocess.run([sys.executable, "-m", "course.grading", "edition", str(out)],
                           cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 2 and "exists and is not empty" in again.stderr


# ------------------------------------------------------------------------------------------------
# Plain nbgrader applies the same sandbox, and warns about nothing on untouched notebooks
# ------------------------------------------------------------------------------------------------

@needs_sandbox
@pytest.mark.slow
def test_plain_nbgrader_autograde_is_sandboxed_and_quiet(tmp_path_factory):
    course = new_course(tmp_path_factory.mktemp("plain"))
    submit(course, "untouched", "01_matmul", submission("01_matmul", answered=False))
    probe = submission("01_matmul", answered=True)
    probe.cells.insert(1, nbformat.v4.new_code_cell("import os\nprint('WHERE', os.getuid(), "
                                                    "os.getcwd())"))
    submit(course, "probe", "01_matmul", probe)
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    for command in (["generate_assignment", "01_matmul", "--force"],
                    ["autograde", "01_matmul"]):
        done = subprocess.run([sys.executable, "-m", "nbgrader", *command], cwd=course, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
    output = done.stdout + done.stderr
    assert "checksum" not in output.lower(), output
    printed = _printed(course / "autograded" / "probe" / "01_matmul" / "matmul.ipynb")
    assert f"WHERE {sandbox.SANDBOX_UID} {sandbox.SANDBOX_WORK}" in printed, printed
    cells = cell_scores(course / "gradebook.db", "untouched", "01_matmul")
    assert "test_matmul_hidden" in cells and all(score == 0 for score, _ in cells.values())
    cells = cell_scores(course / "gradebook.db", "probe", "01_matmul")
    assert all(score == top for score, top in cells.values()), cells
