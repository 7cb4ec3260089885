"""A sandbox's memory cgroup: where the grader may make one, the kernel counts all it holds.

Where this process may make a memory cgroup (cgroup v1's memory hierarchy, as on the course's CI
machines where the grader runs as root; or cgroup v2 where the grader's own cgroup already
delegates the memory controller), each sandbox runs in one of its own (:class:`MemoryCgroup`,
entered by the launcher before bwrap starts, so every process of the sandbox is in it). The kernel
then counts every page the sandbox holds: anonymous memory (private or shared maps, any number of
processes), memfd files (written or mapped), the files of its tmpfs (``/tmp``, ``HOME``,
``/dev/shm``) and the page cache it fills. The watchdog stops the sandbox once its shared memory
(memfd and tmpfs files, shared maps: what no address-space limit bounds) passes
``memory_limit_mb``, or its anonymous and shared memory together (``memory.stat``: all of the
above but the page cache; private memory of several processes adds up) passes the address-space
limit; the cgroup's hard limit, ``CGROUP_CACHE_MB`` above that (no swap), stops what grows faster
than the watchdog looks (the OOM killer ends a process, the watchdog sees it and kills the rest).
A single process's private allocations meet their own address-space limit first, as a MemoryError
in the cell (the notebook goes on). Without that headroom a sandbox at its limit thrashes (its
code pages evicted and read again) instead of failing: a memfd writer then outlived a 10 s cell
timeout.
"""

from __future__ import annotations

import itertools
import os
import re
import sys
import time
from pathlib import Path

from .limits import MiB

CGROUP_PREFIX = "course-kernel-"
"""The name of every kernel's cgroup begins so, followed by the grader's pid."""


class MemoryCgroup:
    """The memory cgroup of one sandbox: a child of this process's own cgroup, with a hard limit
    and no swap (``create`` answers None where this process may not make one). The launcher
    enters it before bwrap starts; ``held_bytes`` is the memory its processes cannot give back,
    ``oom_kills`` whether the kernel's OOM killer stopped one of them; ``remove`` deletes it once
    its processes are gone."""

    _made = itertools.count()

    def __init__(self, path: Path, version: int):
        self.path, self.version = path, version

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    @classmethod
    def create(cls, limit_mb: int) -> MemoryCgroup | None:
        """A new cgroup under the first of this process's memory cgroups (v2 first) that allows
        one, or None. limit_mb is its hard limit (page cache included)."""
        for version, parent in own_memory_cgroups():
            remove_stale(parent)
            path = parent / f"{CGROUP_PREFIX}{os.getpid()}-{next(cls._made)}"
            try:
                path.mkdir()
            except OSError:
                continue
            limits = {"memory.max": limit_mb * MiB} if version == 2 else \
                {"memory.limit_in_bytes": limit_mb * MiB}
            optional = {"memory.swap.max": 0, "memory.oom.group": 1} if version == 2 else \
                {"memory.memsw.limit_in_bytes": limit_mb * MiB}     # where swap is accounted
            limits |= {name: value for name, value in optional.items()
                       if (path / name).exists()}
            try:
                for name, value in limits.items():
                    (path / name).write_text(str(value))
            except OSError:
                cls(path, version).remove()
                continue
            return cls(path, version)
        return None

    def pids(self) -> list[int]:
        try:
            return [int(pid) for pid in self.procs.read_text().split()]
        except OSError:
            return []

    def held_bytes(self, shared_only: bool = False) -> int:
        """Anonymous and shared memory (memfd files, tmpfs files, shared maps) of every process
        in the cgroup: with no swap, what reclaim cannot take back (page cache is not counted).
        shared_only: the shared part alone (what no address-space limit bounds)."""
        try:
            lines = (self.path / "memory.stat").read_text().splitlines()
        except OSError:
            return 0
        stat = dict(line.split()[:2] for line in lines if len(line.split()) >= 2)
        names = ("shmem",) if shared_only else \
            ("anon", "shmem") if self.version == 2 else ("rss", "shmem")
        return sum(int(stat.get(name, 0)) for name in names)

    def oom_kills(self) -> int:
        """Processes of the cgroup the kernel's OOM killer has killed."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            text = (self.path / name).read_text()
        except OSError:
            return 0
        found = re.search(r"^oom_kill (\d+)", text, re.M)
        return int(found.group(1)) if found else 0

    def remove(self, wait_s: float = 5.0) -> None:
        """Delete the cgroup, waiting up to wait_s for its killed processes to be gone."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.05)


def own_memory_cgroups() -> list[tuple[int, Path]]:
    """(version, folder) of this process's cgroups that have the memory controller: cgroup v2's
    if its memory is delegated to children (subtree_control), cgroup v1's memory hierarchy."""
    if not sys.platform.startswith("linux"):
        return []
    try:
        own = [line.split(":", 2) for line in Path("/proc/self/cgroup").read_text().splitlines()]
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    found = []
    for mount in mounts:
        fields, _, right = mount.partition(" - ")
        root, point = fields.split()[3:5]
        fstype, _, options = (right.split() + ["", "", ""])[:3]
        for hierarchy, controllers, path in own:
            if fstype == "cgroup2" and hierarchy == "0":
                version = 2
            elif fstype == "cgroup" and "memory" in controllers.split(",") \
                    and "memory" in options.split(","):
                version = 1
            else:
                continue
            relative = os.path.relpath(path, root)
            if relative.startswith(".."):
                continue
            folder = Path(point) / relative
            if version == 2:
                try:
                    if "memory" not in (folder / "cgroup.subtree_control").read_text().split():
                        continue
                except OSError:
                    continue
            found.append((version, folder.resolve()))
    return sorted(set(found), key=lambda item: -item[0])


def remove_stale(parent: Path) -> None:
    """Delete the empty cgroups that grader processes now dead left under parent."""
    try:
        stale = [p for p in parent.glob(f"{CGROUP_PREFIX}*")
                 if not os.path.exists(f"/proc/{p.name[len(CGROUP_PREFIX):].split('-')[0]}")]
    except OSError:
        return
    for path in stale:
        try:
            path.rmdir()
        except OSError:
            pass
