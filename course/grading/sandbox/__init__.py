"""The sandbox a notebook's kernel runs in: bubblewrap, a memory cap, disk caps and a wall clock.

:class:`SandboxedKernelManager` is a jupyter_client kernel manager that starts the kernel command
inside ``bwrap`` (Debian's ``bubblewrap``), under limits it cannot raise, with a watchdog that
stops it at the first one it passes and says why. One module per concern, each importing only
those above it in this list:

- ``limits``: the numbers (tmpfs sizes, file and folder caps, address-space margins, the
  watchdog's interval), and :func:`address_space_mb`;
- ``events``: what happened to a kernel, as events with a message for the learner;
- ``bwrap``: the sandbox's walls (mounts, namespaces, environment) and whether bwrap can start;
- ``cgroup``: a sandbox's memory cgroup, where the grader may make one;
- ``launcher``: the rlimits and the cgroup, entered before bwrap starts;
- ``proc``: what the watchdog measures in /proc and in the connection folder;
- ``watchdog``: the thread that stops a sandbox at its wall clock, memory or disk limit;
- ``zygote``: the grade run's zygote, a warm sandbox that forks each kernel into namespaces of
  its own (``zygote_server.py`` is its side, run inside it as a script);
- ``client``: the kernel client, ready as soon as the kernel has answered;
- ``manager``: :class:`SandboxedKernelManager`, which puts them together.

Every name other modules use is importable from here (``from course.grading import sandbox``).
"""

from __future__ import annotations

from .bwrap import (ETC_FILES, KERNEL_PACKAGES, PASSED_ENV, SANDBOX_COURSE, SANDBOX_HOME,
                    SANDBOX_UID, SANDBOX_WORK, SandboxUnavailable, bwrap_command,
                    bwrap_has_size, bwrap_program, package_dir, python_dirs, sandbox_problem,
                    sized_tmpfs)
from .cgroup import CGROUP_PREFIX, MemoryCgroup, own_memory_cgroups, remove_stale
from .events import STOPPED, read_events, stop_reason, stopped_event
from .launcher import NO_MEMORY_LIMIT, limit_command
from .limits import (CGROUP_CACHE_MB, ENTRY_BYTES, KERNEL_DIR_MB, KERNEL_VIRTUAL_MB,
                     MAX_FILE_MB, SHM_MB, THREAD_VIRTUAL_MB, TMPFS_MB, WATCH_INTERVAL_S, MiB,
                     address_space_mb)
from .manager import SandboxedKernelManager
from .proc import folder_bytes, held_files, resident_bytes, sandbox_pids
from .watchdog import Watchdog, kill_tree
from .zygote import ZYGOTE_ENV, ForkedKernel, Zygote, ZygoteUnavailable, fork_kernel

__all__ = [
    "CGROUP_CACHE_MB", "CGROUP_PREFIX", "ENTRY_BYTES", "ETC_FILES", "KERNEL_DIR_MB",
    "KERNEL_PACKAGES", "KERNEL_VIRTUAL_MB", "MAX_FILE_MB", "NO_MEMORY_LIMIT", "PASSED_ENV",
    "SANDBOX_COURSE", "SANDBOX_HOME", "SANDBOX_UID", "SANDBOX_WORK", "SHM_MB", "STOPPED",
    "THREAD_VIRTUAL_MB", "TMPFS_MB", "WATCH_INTERVAL_S", "MemoryCgroup", "MiB",
    "SandboxUnavailable", "SandboxedKernelManager", "Watchdog", "address_space_mb",
    "bwrap_command", "bwrap_has_size", "bwrap_program", "folder_bytes", "held_files",
    "kill_tree", "limit_command", "own_memory_cgroups", "package_dir", "python_dirs",
    "read_events", "remove_stale", "resident_bytes", "sandbox_pids", "sandbox_problem",
    "sized_tmpfs", "stop_reason", "stopped_event",
]
