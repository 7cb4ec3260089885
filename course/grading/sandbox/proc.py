"""The watchdog's measures, read from /proc and the connection folder.

Without a cgroup (other machines, the learner's own), the watchdog sums the sandbox's processes'
shared resident memory (``RssShmem``) with the memfd files they hold open, and the same with
their anonymous memory (``RssAnon``); it can overshoot by what a process allocates between two
looks. The tmpfs files add at most their sizes (``2 * TMPFS_MB + SHM_MB``); System V shared
memory filled and then detached is not seen (it lives in the sandbox's own IPC namespace and goes
with it). The connection folder is summed with each entry counting at least ``ENTRY_BYTES``.
"""

from __future__ import annotations

import os
from pathlib import Path

from .limits import ENTRY_BYTES


def sandbox_pids(root: int) -> list[int]:
    """root and every process descended from it: all the processes of a sandbox (bwrap's init,
    a descendant, adopts its orphans, double-forked daemons included)."""
    children: dict[int, list[int]] = {}
    try:
        entries = list(os.scandir("/proc"))
    except OSError:                  # no /proc (macOS): nothing to measure
        return [root]
    for entry in entries:
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def folder_bytes(folder: Path, limit: int) -> int:
    """What the files under folder take on disk, each entry at least ENTRY_BYTES (links are not
    followed); the count stops as soon as it is past limit."""
    total, todo = 0, [folder]
    while todo:
        try:
            with os.scandir(todo.pop()) as entries:
                for entry in entries:
                    stat = entry.stat(follow_symlinks=False)
                    total += max(stat.st_blocks * 512, ENTRY_BYTES)
                    if total > limit:
                        return total
                    if entry.is_dir(follow_symlinks=False):
                        todo.append(Path(entry.path))
        except OSError:           # gone meanwhile: what was counted stands
            continue
    return total


def held_files(pids: list[int]) -> tuple[set[str], dict[tuple[int, int], int]]:
    """What the processes hold that no folder shows: the paths of the deleted files they keep
    open or mapped, and the size on disk (bytes) of each memfd file they keep open, by (device,
    inode). Processes that cannot be read (gone, or not ours) are skipped."""
    deleted, memfds = set(), {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("/memfd:"):
                    stat = os.stat(f"/proc/{pid}/fd/{fd}")
                    memfds[(stat.st_dev, stat.st_ino)] = stat.st_blocks * 512
                elif target.endswith(" (deleted)"):
                    deleted.add(target[:-len(" (deleted)")])
            except OSError:
                continue
        try:
            with open(f"/proc/{pid}/maps") as maps:
                lines = [line.rstrip("\n") for line in maps]
        except OSError:
            continue
        deleted |= {line.split(None, 5)[-1][:-len(" (deleted)")] for line in lines
                    if line.endswith(" (deleted)")}
    return deleted, memfds


def resident_bytes(pids: list[int], kinds: tuple[str, ...] = ("RssAnon:", "RssShmem:")) -> int:
    """The anonymous and shared memory the processes hold in RAM (RssAnon + RssShmem; with
    ``kinds=("RssShmem:",)`` the shared part only)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as status:
                total += sum(int(line.split()[1]) * 1024 for line in status
                             if line.startswith(kinds))
        except (OSError, IndexError, ValueError):
            continue
    return total
