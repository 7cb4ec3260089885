"""Kernels forked from a warm, sandboxed zygote instead of started from nothing.

A grade run's kernels all start the same way: the same sandbox, an empty working folder, the
same interpreter, and about a second of imports (torch, ipykernel, llmcore, llmcheck) before
the first cell, on every one of hundreds of notebooks. :class:`Zygote` starts one sandbox per
grade run (the same walls as a kernel's, ``bwrap.py``), whose process imports those modules once
and then only listens (``zygote_server.py``, which runs inside it). For each kernel the grader's
kernel manager asks it over a unix socket (:func:`fork_kernel`), and it forks a process that
walls the kernel off again before any of the notebook's code runs:

- new mount, pid, network, IPC and UTS namespaces for each kernel: fresh tmpfs on ``/tmp``,
  HOME and ``/dev/shm``, its own ``/proc`` (it sees no process but its own), no network, not
  even to another kernel; only its own connection folder is bound in;
- every capability dropped (the zygote's sandbox keeps ``CAP_SYS_ADMIN`` to make those mounts,
  in its own user namespace only) and ``no_new_privs``;
- the kernel's memory cgroup entered before it starts (the grader writes the forked process's
  pid, read from the socket's credentials) and the same rlimits as a fresh kernel;
- the random state a fresh interpreter draws (Python's, NumPy's and torch's) drawn again in
  each kernel.

Nothing of another notebook is in the zygote: it has run no notebook's code (it refuses to
start if its imports started a thread, since a fork of a threaded process is not a fresh
interpreter), and a request carries only a kernel's folder and its arguments. A kernel lives
while its manager holds its connection; closing it, or the grader's death, kills it.

Where the zygote cannot start (no user namespaces inside the sandbox, an old kernel), the kernel
manager starts each kernel fresh, as before.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Mapping

from .bwrap import SANDBOX_HOME, SANDBOX_UID, SANDBOX_WORK, bwrap_command
from .limits import SHM_MB, TMPFS_MB, MiB
from .watchdog import kill_tree

ZYGOTE_ENV = "COURSE_GRADE_ZYGOTE"
"""The socket of the grade run's zygote, for the kernel managers of its workers."""
ZYGOTE_MODULES = ("ipykernel.kernelapp", "ipykernel.ipkernel", "torch", "llmcore", "numpy",
                  "llmcheck.seal", "llmcheck.audit", "llmcheck.fresh", "llmcheck.integrity",
                  "llmcheck.cases")
"""What the zygote imports: what every graded kernel imports before its first cell."""
ZYGOTE_CAPS = ("CAP_SYS_ADMIN", "CAP_SETPCAP", "CAP_SETFCAP")
"""What the zygote keeps, in its own user namespace: to mount each kernel's view, drop the
capabilities from the bounding set, and map a kernel's user namespace onto its user 0."""
SERVER_FILE = Path(__file__).with_name("zygote_server.py")
SERVER_IN_SANDBOX = "/opt/zygote/zygote_server.py"
SOCKET_NAME = "zygote.sock"
STARTUP_S = 120
FORK_S = 30


class ZygoteUnavailable(RuntimeError):
    """The zygote could not start or fork; the message says why."""


class Zygote:
    """One grade run's zygote: a sandbox in a private folder (the kernels' folders go there too)
    that forks kernels; :meth:`stop` (or leaving the ``with``) kills it and removes the folder."""

    def __init__(self, modules: tuple[str, ...] = ZYGOTE_MODULES,
                 environ: Mapping[str, str] | None = None):
        self.modules = modules
        self.environ = dict(os.environ if environ is None else environ)
        self.root: Path | None = None
        self.process: subprocess.Popen | None = None

    @property
    def socket_path(self) -> str:
        assert self.root is not None, "the zygote is not started"
        return str(self.root / SOCKET_NAME)

    def start(self) -> "Zygote":
        self.root = Path(tempfile.mkdtemp(prefix="kz", dir="/tmp"))
        os.chmod(self.root, 0o700)
        walls = bwrap_command(self.root, caps=ZYGOTE_CAPS,
                              files={str(SERVER_FILE): SERVER_IN_SANDBOX}, uid=0,
                              environ=self.environ)
        command = [*walls, sys.executable, SERVER_IN_SANDBOX, self.socket_path,
                   ",".join(self.modules)]
        env = {k: v for k, v in self.environ.items() if k in ("PATH", "LANG", "LC_ALL")}
        self._errors = tempfile.TemporaryFile()      # a file: a pipe left unread could fill
        self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=self._errors,
                                        env=env, start_new_session=True)
        ready = select.select([self.process.stdout], [], [], STARTUP_S)[0]
        line = self.process.stdout.readline() if ready else b""
        if line.strip() != b"ready":
            why = self._last_error()
            self.stop()
            raise ZygoteUnavailable(f"the zygote did not start: {why}")
        return self

    def _last_error(self) -> str:
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            kill_tree(self.process.pid)
        self._errors.seek(0)
        lines = self._errors.read().decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else f"exit status {self.process.returncode}"

    def stop(self) -> None:
        """Kill the zygote (every kernel it forked dies with it) and remove its folder."""
        if self.process is not None:
            kill_tree(self.process.pid)
            self.process.wait()
            self.process.stdout.close()
            self._errors.close()
            self.process = None
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "Zygote":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class ForkedKernel:
    """A kernel forked by the zygote, seen as jupyter_client sees a ``Popen``: ``pid`` is its
    supervisor's (in this process's pid namespace; the kernel and all its processes die with
    it), ``poll``/``wait``/``send_signal``/``kill``; :meth:`close` lets it go (it is killed)."""

    stdin = stdout = stderr = None

    def __init__(self, connection: socket.socket, pid: int):
        self.connection, self.pid = connection, pid
        self.pidfd = os.pidfd_open(pid)       # from here on, signals cannot reach another process
        self.returncode: int | None = None
        self._buffer = b""

    def go(self) -> None:
        """Let the supervisor start the kernel (once it is in its cgroup)."""
        self.connection.sendall(b"go\n")
        reply = self._message(FORK_S)
        if "kernel" not in reply:
            raise ZygoteUnavailable(f"the zygote could not start the kernel: {reply}")

    def _message(self, timeout: float | None) -> dict:
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self.connection], [], [], left)[0]:
                raise ZygoteUnavailable("the zygote did not answer")
            chunk = self.connection.recv(4096)
            if not chunk:
                return {"error": "the zygote's supervisor ended"}
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def poll(self) -> int | None:
        if self.returncode is None and self.pidfd >= 0 \
                and select.select([self.pidfd], [], [], 0)[0]:
            self._ended()
        return self.returncode

    def _ended(self) -> None:
        code = -signal.SIGKILL
        try:
            self.connection.setblocking(False)
            while True:
                reply = self._message(0)
                if "exit" in reply:
                    code = int(reply["exit"])
                if "error" in reply or "exit" in reply:
                    break
        except (OSError, ValueError, ZygoteUnavailable):
            pass
        self.returncode = code

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and self.pidfd >= 0:
            if not select.select([self.pidfd], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired("forked kernel", timeout)
            self._ended()
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            signal.pidfd_send_signal(self.pidfd, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def close(self) -> None:
        """Kill the kernel if it still runs (its supervisor, and with it every process of the
        kernel's) and let go of it; ``poll`` then answers its exit status."""
        if self.pidfd < 0:
            return
        if self.poll() is None:
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            self.returncode = -signal.SIGKILL
        self.connection.close()
        os.close(self.pidfd)
        self.pidfd = -1


def fork_kernel(socket_path: str, kernel_dir: Path, argv: list[str], rlimits: dict[str, int],
                stdout: int = 1, stderr: int = 2) -> ForkedKernel:
    """Ask the zygote at ``socket_path`` for a kernel run as ``ipykernel_launcher *argv`` in the
    connection folder ``kernel_dir`` (a folder of the zygote's root) under ``rlimits``; the
    kernel writes to ``stdout`` and ``stderr``. Returns before the kernel starts: put
    ``.pid`` in the kernel's cgroup, then call :meth:`ForkedKernel.go`."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    connection.settimeout(FORK_S)
    try:
        connection.connect(socket_path)
        request = {"kernel_dir": str(kernel_dir),
                   "argv": list(argv), "rlimits": rlimits, "cwd": SANDBOX_WORK,
                   "uid": SANDBOX_UID,
                   "home": SANDBOX_HOME, "home_dirs": [SANDBOX_WORK, f"{SANDBOX_HOME}/.ipython"],
                   "tmp_bytes": TMPFS_MB * MiB, "shm_bytes": SHM_MB * MiB}
        fds = struct.pack("2i", stdout, stderr)
        connection.sendmsg([(json.dumps(request) + "\n").encode()],
                           [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        pid = _hello(connection)
    except (OSError, ValueError) as error:
        connection.close()
        raise ZygoteUnavailable(f"the zygote at {socket_path} did not fork: {error}") from error
    connection.settimeout(None)
    return ForkedKernel(connection, pid)


def _hello(connection: socket.socket) -> int:
    """The supervisor's pid as this process sees it: from the credentials the kernel attaches
    to its hello (what it claims inside its own pid namespace means nothing here)."""
    credentials = struct.calcsize("3i")           # pid, uid, gid
    data, ancillary, _, _ = connection.recvmsg(4096, socket.CMSG_SPACE(credentials))
    for level, kind, value in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            pid, _, _ = struct.unpack("3i", value[:credentials])
            reply = json.loads(data.split(b"\n", 1)[0] or b"{}")
            if "hello" not in reply:
                raise ValueError(f"the zygote answered {reply}")
            return pid
    raise ValueError(f"no credentials came with the zygote's answer {data[:200]!r}")
