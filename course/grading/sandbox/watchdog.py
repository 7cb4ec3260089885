"""The watchdog: a thread that looks at one sandbox and stops it at the first limit it is past.

Every ``WATCH_INTERVAL_S`` it checks the wall clock (``notebook_timeout`` seconds: past it the
whole sandbox gets SIGKILL, whatever the kernel does with SIGINT), the memory the sandbox holds
(the cgroup's count where there is one, else the count from /proc: see ``proc.py``) and the
kernel's connection folder (``KERNEL_DIR_MB``; a deleted file the sandbox still holds open or
mapped there counts ``MAX_FILE_MB``, the most it can hold). Each stop is an event
(``events.py``), recorded once per kernel.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

from .cgroup import MemoryCgroup
from .events import stopped_event
from .limits import KERNEL_DIR_MB, MAX_FILE_MB, WATCH_INTERVAL_S, MiB, address_space_mb
from .proc import folder_bytes, held_files, resident_bytes, sandbox_pids


class Watchdog:
    """One kernel's watchdog. process: the launched kernel (None: nothing to watch but the
    cgroup and the folder, once, at :meth:`finish`); kernel_dir: its connection folder when it
    runs in the sandbox (None: unsandboxed, no folder to cap); record: called with each event."""

    def __init__(self, process: subprocess.Popen | None, *, memory_limit_mb: int,
                 notebook_timeout: int, cgroup: MemoryCgroup | None, kernel_dir: Path | None,
                 record: Callable[[dict], None], log: logging.Logger):
        self.process, self.cgroup, self.kernel_dir = process, cgroup, kernel_dir
        self.memory_limit_mb, self.notebook_timeout = memory_limit_mb, notebook_timeout
        self.record, self.log = record, log
        self._halt = threading.Event()
        self._stop_lock = threading.Lock()
        self.stopped = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread that checks the sandbox every WATCH_INTERVAL_S (:meth:`past_a_limit`)
        and stops it at the first limit it is past (no thread without a process)."""
        process = self.process
        if process is None:
            return
        deadline = time.monotonic() + self.notebook_timeout if self.notebook_timeout > 0 \
            else None

        def watch() -> None:
            while not self._halt.wait(WATCH_INTERVAL_S):
                alive = process.poll() is None       # one more look once it has ended
                if alive and deadline is not None and time.monotonic() > deadline:
                    self.stop(stopped_event("timeout", seconds=self.notebook_timeout))
                try:
                    event = self.past_a_limit()
                except Exception:                    # a failed look must not stop the clock
                    self.log.exception("the sandbox's watchdog could not measure it")
                    event = None
                if event is not None:
                    self.stop(event)
                if self.stopped or not alive:
                    return

        self._thread = threading.Thread(target=watch, name="sandbox-watchdog", daemon=True)
        self._thread.start()

    def past_a_limit(self) -> dict | None:
        """The event of the memory or disk limit the sandbox is past, or None. Once the
        launched process has ended only the cgroup and the folder are read (its pid may be
        another process's already)."""
        alive = self.process is not None and self.process.poll() is None
        pids = [] if not alive else self.cgroup.pids() if self.cgroup is not None \
            else sandbox_pids(self.process.pid)
        deleted, memfds = held_files(pids)
        if self.memory_limit_mb > 0:
            cgroup, limit = self.cgroup, self.memory_limit_mb * MiB
            total_limit = address_space_mb(self.memory_limit_mb) * MiB
            if cgroup is not None:
                shared, total = cgroup.held_bytes(shared_only=True), cgroup.held_bytes()
            else:
                files = sum(memfds.values())
                shared = resident_bytes(pids, ("RssShmem:",)) + files
                total = resident_bytes(pids) + files
            how = "cgroup" if cgroup is not None else "watchdog"
            if cgroup is not None and cgroup.oom_kills() > 0 or shared > limit:
                return stopped_event("memory", limit_mb=self.memory_limit_mb, how=how)
            if total > total_limit:          # private memory of several processes together
                return stopped_event("memory", limit_mb=total_limit // MiB, how=how)
        if self.kernel_dir is not None:
            limit = KERNEL_DIR_MB * MiB
            inside = str(self.kernel_dir) + os.sep
            hidden = MAX_FILE_MB * MiB * sum(path.startswith(inside) for path in deleted)
            if hidden + folder_bytes(self.kernel_dir, limit - hidden) > limit:
                return stopped_event("disk", limit_mb=KERNEL_DIR_MB)
        return None

    def stop(self, event: dict) -> None:
        """Record why the sandbox is stopped (once per kernel) and kill it if it still runs."""
        with self._stop_lock:                   # the watchdog and the cleanup may both look
            if self.stopped:
                return
            self.stopped = True
        self.record(event)
        self.log.error("%s", event["message"])
        if self.process is not None and self.process.poll() is None:
            kill_tree(self.process.pid)

    def finish(self) -> None:
        """Stop the thread and look once more: a kernel the OOM killer ended, or one that died
        with too much in its folder, gets its reason too."""
        self._halt.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        event = self.past_a_limit()
        if event is not None:
            self.stop(event)


def kill_tree(pid: int) -> None:
    """SIGKILL a launched kernel: its process group (jupyter starts it in its own session) and
    the process itself. In the sandbox, bwrap's death takes every process of its pid
    namespace with it."""
    for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            kill()
        except (ProcessLookupError, PermissionError):
            pass
