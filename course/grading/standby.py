"""A sandboxed kernel started before the learner's next check asks for it.

The learner's loop is edit, check, edit, check, and most of a check's seconds are its kernel's
start: the sandbox, the interpreter and torch's import (about 1.6 s of 2.4 s on a 2-core
machine). So each check leaves a *standby*: a background process (``python -m
course.grading.standby``) that starts the next check's kernel exactly as the check would (the
same :class:`~course.grading.sandbox.SandboxedKernelManager`, kernel arguments, preloads and
limits) while the learner edits, and keeps it unused for at most ``STANDBY_IDLE_S`` seconds.

The next check whose kernel would be the same (the same :meth:`Spec.key`: the interpreter, the
kernel's arguments, the limits, the sandbox's settings and the files of the packages the kernel
imports) takes that kernel over instead of starting one (:class:`StandbyKernelManager`). Every
kernel is still fresh, sandboxed and used by one check only; it was only started earlier.

A taken kernel lives while its check holds the standby's socket (a check that dies, killed or
not, closes it) and at most the notebook's time limit counted from the take-over; the standby's
own watchdog keeps its memory and disk limits all along. Then the standby kills the sandbox,
removes its folder and exits.

Only where the sandbox works (an unsandboxed kernel runs in the notebook's own folder, which is
not known in advance). The standbys of a user live in one private folder
(:func:`standby_root`); a check leaves one only where none made the same way waits, and asks
those made otherwise to stop. Off with ``course-check --no-standby`` or
``COURSE_CHECK_STANDBY=0`` (the test suite sets it).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import select
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

from jupyter_client.manager import in_pending_state

from .sandbox import (KERNEL_PACKAGES, PASSED_ENV, SandboxedKernelManager, bwrap_program,
                      kill_tree, package_dir)

STANDBY_IDLE_S = 300
"""Seconds an unclaimed standby keeps its kernel before it stops (``COURSE_CHECK_STANDBY_IDLE``
overrides it)."""

SWITCH = "COURSE_CHECK_STANDBY"          # "0": no standby is claimed or left
IDLE = "COURSE_CHECK_STANDBY_IDLE"
READY_FILE = "ready"                     # written in a standby's folder once its kernel is up
SOCKET_FILE = "sock"                     # bound as the standby starts, removed when taken
TAKEN_FILE = "taken"                     # written when a check takes the kernel
STARTUP_S = 120                          # the most a standby waits for its kernel to start
CLAIM_S = 60                             # the most a check waits for a standby still starting


class StandbyUnsafe(RuntimeError):
    """The standbys' folder is not a private folder of this user."""


def enabled() -> bool:
    """Whether checks claim and leave standbys: on Linux, unless ``COURSE_CHECK_STANDBY=0``."""
    return sys.platform.startswith("linux") and os.environ.get(SWITCH, "1") != "0"


def idle_seconds() -> float:
    return float(os.environ.get(IDLE, STANDBY_IDLE_S))


def standby_root() -> Path:
    """This user's standbys' folder (made 0700 if missing); :class:`StandbyUnsafe` when it is a
    link, another user's, or open to others (another user could then hand out kernels)."""
    root = Path(tempfile.gettempdir()) / f"course-check-standby-{os.getuid()}"
    try:
        root.mkdir(mode=0o700)
    except FileExistsError:
        pass
    info = os.lstat(root)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise StandbyUnsafe(f"{root} must be a folder of uid {os.getuid()} that only it can "
                            f"open (mode 0700); it is not, so no standby is used")
    return root


def _package_files() -> list[list]:
    """(path, mtime, size) of every Python file a kernel or its sandbox is made of."""
    files = []
    for package in (*KERNEL_PACKAGES, "course.grading.sandbox"):
        for path in sorted(package_dir(package).rglob("*.py")):
            info = path.stat()
            files.append([str(path), info.st_mtime_ns, info.st_size])
    return files


@dataclass(frozen=True)
class Spec:
    """What a check's kernel is made of: its kernel spec's name, the arguments the executor
    gives it (the preloads among them) and its sandbox's limits."""

    kernel_name: str
    extra_arguments: tuple[str, ...]
    memory_limit_mb: int
    notebook_timeout: int

    def key(self) -> str:
        """A digest of the spec and of what else makes the kernel: the interpreter, bwrap, the
        environment the sandbox passes on and the files of llmcore, llmcheck and the sandbox.
        A standby is taken only by a check with the same key."""
        made_of = [asdict(self), sys.executable, bwrap_program(),
                   {name: os.environ.get(name) for name in PASSED_ENV}, _package_files()]
        return hashlib.sha256(json.dumps(made_of, sort_keys=True).encode()).hexdigest()[:24]

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Spec":
        fields = json.loads(text)
        return cls(str(fields["kernel_name"]), tuple(map(str, fields["extra_arguments"])),
                   int(fields["memory_limit_mb"]), int(fields["notebook_timeout"]))


# -- the check's side ------------------------------------------------------------------------

class Claimed:
    """A standby's kernel as a check holds it: the provisioner of :class:`StandbyKernelManager`
    (jupyter_client asks it whether the kernel runs, and to kill it), each question a line of
    JSON to the standby over its socket."""

    def __init__(self, connection: socket.socket, lines, info: dict):
        self.socket, self._lines, self.info = connection, lines, info   # lines: its one reader
        self.has_process = True

    def _ask(self, request: dict) -> dict:
        try:
            self.socket.sendall((json.dumps(request) + "\n").encode())
            line = self._lines.readline()
        except OSError:
            line = ""
        return json.loads(line) if line else {"returncode": -9}   # the standby is gone

    async def poll(self) -> int | None:
        return self._ask({"op": "poll"}).get("returncode")

    async def wait(self) -> int | None:
        while (code := await self.poll()) is None:
            await asyncio.sleep(0.05)
        return code

    async def kill(self, restart: bool = False) -> None:
        self._ask({"op": "kill"})

    terminate = kill

    async def send_signal(self, signum: int) -> None:
        self._ask({"op": "kill"})          # nothing but a kill reaches a sandboxed kernel

    async def post_launch(self, **kwargs) -> None:
        return None

    async def cleanup(self, restart: bool = False) -> None:
        self.has_process = False
        for closing in (self._lines.close, self.socket.close):
            try:
                closing()
            except OSError:
                pass


def _usable_root() -> Path | None:
    """:func:`standby_root`, or None where it is unsafe or cannot be made (no standby then)."""
    try:
        return standby_root()
    except (StandbyUnsafe, OSError):
        return None


def _key_of(folder: Path) -> str:
    return folder.name.rpartition("-")[0]


def _standbys(root: Path, *, taken: bool = False) -> list[Path]:
    """The standbys' folders, each ``<key>-<pid>`` (those whose process is gone are removed),
    starting or waiting; ``taken``: those a check holds too."""
    found = []
    for folder in sorted(root.iterdir()):
        key, _, pid = folder.name.rpartition("-")
        if not key or not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
            continue
        except PermissionError:
            pass
        if taken or not (folder / TAKEN_FILE).exists():
            found.append(folder)
    return found


def untaken() -> list[Path]:
    """This user's standbys that no check holds (starting or waiting), by folder."""
    root = _usable_root()
    return _standbys(root) if root is not None else []


def _connect(folder: Path, request: dict, timeout: float):
    """Send a standby its first (and only) request, waiting up to ``timeout`` for one still
    starting to listen and then to answer; (the socket, its reader, the answer), or None when
    it is gone, taken by another check, or silent. The reader is the socket's only one: a
    second would miss what the first had buffered."""
    deadline = time.monotonic() + timeout
    while not (folder / SOCKET_FILE).exists():
        if time.monotonic() > deadline or not folder.exists():
            return None
        time.sleep(0.02)
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.settimeout(max(0.1, deadline - time.monotonic()))
        connection.connect(str(folder / SOCKET_FILE))
        connection.sendall((json.dumps(request) + "\n").encode())
        lines = connection.makefile("r", encoding="utf-8")
        line = lines.readline()
        connection.settimeout(None)
        if line:
            return connection, lines, json.loads(line)
    except (OSError, ValueError):
        pass
    connection.close()
    return None


def _ask_to_stop(folder: Path, timeout: float = STARTUP_S) -> bool:
    """Ask a standby no check holds to stop (one still starting hears it once its kernel is up,
    within ``timeout``); whether it heard."""
    answered = _connect(folder, {"op": "quit"}, timeout)
    if answered is not None:
        answered[0].close()
    return answered is not None


def claim(spec: Spec) -> Claimed | None:
    """Take over this user's standby kernel made as ``spec`` says (waiting for one still
    starting), or None when there is none to take."""
    root, key = _usable_root(), spec.key()
    for folder in _standbys(root) if root is not None else ():
        if _key_of(folder) != key:
            continue
        answered = _connect(folder, {"op": "claim", "key": key}, CLAIM_S)
        if answered is not None and "connection" in answered[2]:
            return Claimed(*answered[:2], answered[2]["connection"])
        if answered is not None:
            answered[0].close()
    return None


def leave(spec: Spec) -> Path | None:
    """Start a standby for the next check made as ``spec`` says (in the background), unless one
    no check holds is already there; standbys made otherwise (an older llmcore, other limits)
    are asked to stop. Returns the new standby's folder (made before this returns), or None."""
    root, key = _usable_root(), spec.key()
    if root is None:
        return None
    for folder in _standbys(root):
        if _key_of(folder) == key:
            return None
        _ask_to_stop(folder, timeout=10)          # the check waits for this, a few seconds
    process = subprocess.Popen(
        [sys.executable, "-m", "course.grading.standby", spec.to_json(), str(root), key],
        cwd=root, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    folder = root / f"{key}-{process.pid}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


def stop_all(timeout: float = STARTUP_S) -> int:
    """Ask every standby of this user that no check holds to stop (one still starting when it
    listens), and wait until they are gone; returns how many heard."""
    root = standby_root()
    heard = sum(_ask_to_stop(folder) for folder in _standbys(root))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _standbys(root):
        time.sleep(0.05)
    return heard


def settle(timeout: float = STARTUP_S) -> bool:
    """Wait until every standby of this user has its kernel up (or is gone): a benchmark times
    the next command on a machine the standby no longer loads. False past ``timeout``."""
    deadline = time.monotonic() + timeout
    root = standby_root()
    while time.monotonic() < deadline:
        if all((folder / READY_FILE).exists() for folder in _standbys(root)):
            return True
        time.sleep(0.05)
    return False


class StandbyKernelManager(SandboxedKernelManager):
    """The learner's check's kernel manager: it takes over a standby kernel made as its own
    would be (:func:`claim`) and starts one itself only when there is none. ``from_standby``
    says which happened; :attr:`last_spec` is the spec of the last sandboxed kernel a manager of
    the class asked for (the check leaves a standby made that way; each check makes a subclass
    of its own, course/grading/check.py, so that two checks of one process never mix theirs)."""

    last_spec: ClassVar[Spec | None] = None
    from_standby = False

    def _spec(self, extra_arguments) -> Spec | None:
        if not self._use_sandbox():
            return None
        return Spec(self.kernel_name, tuple(extra_arguments or ()), self.memory_limit_mb,
                    self.notebook_timeout)

    @in_pending_state
    async def _async_start_kernel(self, **kw) -> None:
        spec = self._spec(kw.get("extra_arguments"))
        type(self).last_spec = spec
        claimed = claim(spec) if spec is not None else None
        if claimed is None:
            return await SandboxedKernelManager._async_start_kernel.__wrapped__(self, **kw)
        self._attempted_start = True
        self.kernel_spec.interrupt_mode = "message"     # as for every sandboxed kernel
        self.load_connection_info(claimed.info)
        self.provisioner = claimed
        self.from_standby = True
        await self._async_post_start_kernel(**kw)

    start_kernel = _async_start_kernel


# -- the standby's side ----------------------------------------------------------------------

async def _start(spec: Spec) -> SandboxedKernelManager:
    """The kernel a check made as ``spec`` says would start, started and answering."""
    manager = SandboxedKernelManager(kernel_name=spec.kernel_name, sandbox="required",
                                     memory_limit_mb=spec.memory_limit_mb, notebook_timeout=0)
    await manager.start_kernel(extra_arguments=list(spec.extra_arguments))
    client = manager.client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=STARTUP_S)
    finally:
        client.stop_channels()
    return manager


def _attend(connection: socket.socket, lines, process: subprocess.Popen, seconds: int) -> None:
    """Answer the check that took the kernel until it lets go; kill the kernel ``seconds``
    after the take-over (0: no limit). lines: the socket's reader (the check asks one question
    at a time, so nothing waits in its buffer when select looks)."""
    deadline = time.monotonic() + seconds if seconds > 0 else None
    while True:
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        readable, _, _ = select.select([connection], [], [], wait)
        if not readable:                          # the notebook's time is up
            kill_tree(process.pid)
            deadline = None
            continue
        line = lines.readline()
        if not line:                              # the check let go (or died)
            return
        request = json.loads(line)
        if request.get("op") == "kill":
            kill_tree(process.pid)
            process.wait(timeout=10)
        connection.sendall((json.dumps({"returncode": process.poll()}) + "\n").encode())


async def serve(spec: Spec, root: Path, key: str) -> None:
    """The standby process: start the kernel, wait for one check to take it (or quit when
    ``idle_seconds`` pass or another check asks it to), attend to that check, then clean up.
    Its folder is ``<root>/<key>-<pid>`` (:func:`leave` makes it too, so that it is seen at
    once); only a claim with ``key`` is answered."""
    if root != standby_root():
        raise StandbyUnsafe(f"{root} is not this user's standby folder {standby_root()}")
    folder = root / f"{key}-{os.getpid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    manager = None
    try:
        listener.bind(str(folder / SOCKET_FILE))
        listener.listen(2)
        manager = await _start(spec)
        (folder / READY_FILE).touch()
        listener.settimeout(idle_seconds())
        while True:
            try:
                connection, _ = listener.accept()
            except socket.timeout:
                return
            lines = connection.makefile("r", encoding="utf-8")
            connection.settimeout(5)
            try:
                request = json.loads(lines.readline() or "{}")
            except (OSError, ValueError):
                request = {}
            alive = manager.provisioner.process.poll() is None
            if request.get("op") == "claim" and request.get("key") == key and alive:
                break
            answer = {"stopping": True} if request.get("op") == "quit" else {
                "refused": "its kernel has ended" if not alive else
                "a standby is taken by a check made as it was (the same key)"}
            try:
                connection.sendall((json.dumps(answer) + "\n").encode())
            except OSError:
                pass
            connection.close()
            if request.get("op") == "quit" or not alive:
                return
        (folder / TAKEN_FILE).touch()
        listener.close()                          # one check only: the next finds no socket
        (folder / SOCKET_FILE).unlink(missing_ok=True)
        info = manager.get_connection_info(session=False)
        info = {k: v.decode() if isinstance(v, bytes) else v for k, v in info.items()}
        connection.settimeout(None)
        with connection:
            connection.sendall((json.dumps({"connection": info}) + "\n").encode())
            _attend(connection, lines, manager.provisioner.process, spec.notebook_timeout)
    finally:
        listener.close()
        if manager is not None:
            await manager.shutdown_kernel(now=True)
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m course.grading.standby SPEC_JSON ROOT KEY (started by "
              "course-check)", file=sys.stderr)
        return 2
    asyncio.run(serve(Spec.from_json(argv[0]), Path(argv[1]), argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
