"""The sandbox's limits, one table: sizes, margins and the watchdog's interval.

Memory (``memory_limit_mb``, default 2048) is capped by what the sandbox holds, not by how it asks:
a memory cgroup where the grader may make one (``cgroup.py``), else the watchdog's count from
/proc (``proc.py``, ``watchdog.py``); in both cases every process also gets an address-space limit
(``RLIMIT_AS``, set by the launcher, ``launcher.py``) of :func:`address_space_mb`: the margin is
the address space a kernel reserves without using it (shared libraries, thread stacks, malloc
arenas; measured below), so a notebook may still reserve about ``memory_limit_mb`` of its own, and
an allocation past it raises MemoryError (the usual, readable end of a greedy cell) instead of the
sandbox being killed.

Disk: each file the sandbox writes may grow to ``MAX_FILE_MB`` (``RLIMIT_FSIZE``: past it a write
raises ``OSError: File too large``; a memfd too), its tmpfs are sized and the root is read-only,
so the connection folder is the only writable host path; the watchdog stops the sandbox once
that folder holds more than ``KERNEL_DIR_MB``.
"""

from __future__ import annotations

import os

MiB = 2**20

TMPFS_MB = 512
"""Size of the sandbox's /tmp and of its HOME (each; they live in memory)."""
SHM_MB = 64
"""Size of the sandbox's /dev/shm (bwrap's /dev is an unsized tmpfs: it gets a tmpfs of its own)."""
MAX_FILE_MB = 64
"""RLIMIT_FSIZE: the most any one file written in the sandbox may hold (memfd files included)."""
KERNEL_DIR_MB = 16
"""The most the kernel's connection folder (on the host's disk) may hold; a kernel needs a few
hundred bytes there (its connection file and five sockets)."""
ENTRY_BYTES = 4096
"""What each entry of the connection folder counts at least (an empty file still takes an
inode): the folder holds at most KERNEL_DIR_MB / ENTRY_BYTES entries, and is summed quickly."""
KERNEL_VIRTUAL_MB = 2048
"""Address space a kernel reserves beyond what it uses, before its notebook's own allocations.
Measured in this sandbox (torch 2.13 CPU, 2 CPUs): 1315 MiB after ``import torch, llmcore,
llmcheck`` (13 threads), at most 1525 MiB while running any one of the 8 solution notebooks, 1620
MiB after all 8 in one kernel (17 threads; resident: 250-360 MiB); the rest is headroom for a
larger torch. tests/test_grading_sandbox.py checks that the solutions leave a notebook
memory_limit_mb of address space."""
THREAD_VIRTUAL_MB = 64
"""Address space per CPU on top of KERNEL_VIRTUAL_MB: torch starts a worker thread per CPU, each
with an 8 MiB stack and, once it allocates, a glibc malloc arena (a 64 MiB reservation). Measured
outside the sandbox: 31 MiB more per torch thread (2 -> 64 threads: 727 -> 2660 MiB)."""
CGROUP_CACHE_MB = 512
"""What a memory cgroup allows on top of memory_limit_mb for page cache (the kernel's libraries,
files it reads or writes): the watchdog stops a sandbox whose anonymous and shared memory passes
memory_limit_mb, before the cgroup's hard limit makes it thrash (its code pages evicted and read
again) or the OOM killer picks a process."""
WATCH_INTERVAL_S = 0.25
"""How often the watchdog checks a sandbox (wall clock, memory, connection folder)."""


def address_space_mb(memory_limit_mb: int) -> int:
    """RLIMIT_AS of a kernel allowed memory_limit_mb: the limit plus what a kernel reserves
    without using it (KERNEL_VIRTUAL_MB, and THREAD_VIRTUAL_MB per CPU)."""
    return memory_limit_mb + KERNEL_VIRTUAL_MB + THREAD_VIRTUAL_MB * (os.cpu_count() or 1)
