"""The sandbox a notebook's kernel runs in: bubblewrap, a memory cap, disk caps and a wall clock.

:class:`SandboxedKernelManager` is a jupyter_client kernel manager that starts the kernel command
inside ``bwrap`` (Debian's ``bubblewrap``):

- a read-only view of the Python environment (``sys.prefix``, ``sys.base_prefix``, ``/usr``,
  ``/lib*``, a few ``/etc`` files) and of the ``llmcore`` and ``llmcheck`` package directories,
  mounted under ``/opt/course``; nothing else of the course (no ``solutions/``, ``source/``,
  gradebook, ``nbgrader_config.py``, other submissions, and not the notebook being graded:
  nbgrader sends the kernel its cells one by one, the hidden tests last);
- an empty working directory ``/home/learner/work``; its own ``/tmp``, ``HOME`` (the working
  directory and ``IPYTHONDIR`` included) and ``/dev/shm``, each a tmpfs of its own size
  (``TMPFS_MB``, ``TMPFS_MB``, ``SHM_MB``; bwrap >= 0.5 has ``--size``): nothing it writes
  outlives it. Every other path is read-only: the root (bwrap's own tmpfs) and ``/dev`` are
  remounted read-only once the mounts are made, so writing to ``/var`` fails (EROFS);
- no network (``--unshare-net``), so the grader talks to the kernel over jupyter's ``ipc``
  transport: unix sockets in a per-kernel connection folder (the host's ``/tmp/k*``) bound
  read-write into the sandbox, the one place where it can write to the host's disk;
- its own pid namespace and user (uid 1000): it cannot see or signal the grader or other kernels;
  ``--die-with-parent``: killing the sandbox kills every process started in it;
- a wall clock per kernel (``notebook_timeout`` seconds): past it the whole sandbox gets SIGKILL,
  whatever the kernel does with SIGINT.

Memory (``memory_limit_mb``, default 2048) is capped by what the sandbox holds, not by how it asks:

- Where this process may make a memory cgroup (cgroup v1's memory hierarchy, as on the course's
  CI machines where the grader runs as root; or cgroup v2 where the grader's own cgroup already
  delegates the memory controller), each sandbox runs in one of its own (:class:`MemoryCgroup`,
  entered by the launcher before bwrap starts, so every process of the sandbox is in it). The
  kernel then counts every page the sandbox holds: anonymous memory (private or shared maps,
  any number of processes), memfd files (written or mapped), the files of its tmpfs (``/tmp``,
  ``HOME``, ``/dev/shm``) and the page cache it fills. The watchdog stops the sandbox once its
  shared memory (memfd and tmpfs files, shared maps: what no address-space limit bounds) passes
  ``memory_limit_mb``, or its anonymous and shared memory together (``memory.stat``: all of the
  above but the page cache; private memory of several processes adds up) passes the
  address-space limit below; the cgroup's hard limit, ``CGROUP_CACHE_MB`` above that (no swap),
  stops what grows faster than the watchdog looks (the OOM killer ends a process, the watchdog
  sees it and kills the rest). A single process's private allocations meet their own
  address-space limit first, as a MemoryError in the cell (the notebook goes on). Without that headroom a sandbox at its limit thrashes (its code pages
  evicted and read again) instead of failing: a memfd writer then outlived a 10 s cell timeout.
- Without a cgroup (other machines, the learner's own), a watchdog thread sums the sandbox's
  processes' shared resident memory (``RssShmem``) with the memfd files they hold open, and the
  same with their anonymous memory (``RssAnon``), every ``WATCH_INTERVAL_S``, and kills the
  sandbox past the same two limits; it can
  overshoot by what a process allocates in that interval. The tmpfs files add at most their
  sizes (``2 * TMPFS_MB + SHM_MB``); System V shared memory filled and then detached is not
  seen (it lives in the sandbox's own IPC namespace and goes with it).
- In both cases every process also gets an address-space limit (``RLIMIT_AS``) of
  ``memory_limit_mb + KERNEL_VIRTUAL_MB + THREAD_VIRTUAL_MB * cpus``: the margin is the address
  space a kernel reserves without using it (shared libraries, thread stacks, malloc arenas;
  measured below), so a notebook may still reserve about ``memory_limit_mb`` of its own, and an
  allocation past it raises MemoryError (the usual, readable end of a greedy cell) instead of
  the sandbox being killed. Where Python has no ``resource`` module (Windows) there is no limit
  at all, with a warning; on macOS the launcher sets ``RLIMIT_DATA`` as before (no cgroup).

Disk: each file the sandbox writes may grow to ``MAX_FILE_MB`` (``RLIMIT_FSIZE``: past it a write
raises ``OSError: File too large``; a memfd too), its tmpfs are sized and the root is read-only,
so the connection folder is the only writable host path. The watchdog sums that folder (each
entry counts at least ``ENTRY_BYTES``; a deleted file the sandbox still holds open or mapped
there counts ``MAX_FILE_MB``, the most it can hold) and kills the sandbox past ``KERNEL_DIR_MB``;
the folder is removed when the kernel ends.

Where bwrap cannot start (not installed, no user namespaces) starting a kernel to autograde
raises :class:`SandboxUnavailable` naming the cause, unless ``unsandboxed_trusted`` is set
(trusted submissions only): the kernel then runs as the grader's own user with the memory cap and
wall clock alone, with a warning. The learner's ``course-check`` (nbgrader's validate: their own
code on their own machine) uses the sandbox where bwrap works and runs without it, with a warning,
where it does not (``sandbox = 'required'`` makes it refuse too).

What happened to a kernel (started unsandboxed; stopped at the wall clock, past its memory or
past its disk) is an event (:func:`stopped_event`) kept by its kernel manager (``events``) and,
when ``events_file`` is set, appended to that file: the grader's worker sets it to its job's
folder and reads it back (:func:`read_events`) to explain a failure (:func:`stop_reason`).
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager
from traitlets import Bool, Integer, List, Unicode, default

SANDBOX_HOME = "/home/learner"
SANDBOX_WORK = f"{SANDBOX_HOME}/work"
SANDBOX_COURSE = "/opt/course"          # llmcore and llmcheck are mounted here, read-only
KERNEL_PACKAGES = ("llmcore", "llmcheck")   # what a graded notebook imports of the course
SANDBOX_UID = 1000
ETC_FILES = ("passwd", "group", "hosts", "nsswitch.conf", "ld.so.cache", "ld.so.conf",
             "ld.so.conf.d", "localtime", "alternatives", "ssl", "mime.types")
PASSED_ENV = ("LANG", "LC_ALL", "TZ", "OPENBLAS_CORETYPE", "OMP_NUM_THREADS",
              "MKL_NUM_THREADS", "TORCH_CPP_LOG_LEVEL")
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
CGROUP_PREFIX = "course-kernel-"

STOPPED = {
    "timeout": "timeout: the notebook ran past {seconds} s and its sandbox was killed",
    "memory": "memory: the notebook's kernel went past its {limit_mb} MiB (everything its "
              "processes hold counts: allocations, memfd and tmpfs files) and its sandbox was "
              "killed",
    "disk": "disk: the kernel wrote more than {limit_mb} MiB into its connection folder (the "
            "only place it may write on the grader's disk) and its sandbox was killed",
}
"""The message of each kind of event that stops a kernel: its reason, for the learner."""


def stopped_event(kind: str, **fields) -> dict:
    """The event of a sandbox stopped by a limit: kind, fields and a readable message.

    Events are dicts: ``{"kind": "unsandboxed", "reason": ..}``, and, with ``message`` (see
    :data:`STOPPED`), ``{"kind": "timeout", "seconds": ..}``, ``{"kind": "memory",
    "limit_mb": .., "how": ..}``, ``{"kind": "disk", "limit_mb": ..}``."""
    return {"kind": kind, **fields, "message": STOPPED[kind].format(**fields)}


def read_events(path: str | os.PathLike) -> list[dict]:
    """The events a kernel manager appended to ``path`` (one JSON object per line; none if the
    file is absent)."""
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def stop_reason(events: list[dict]) -> str | None:
    """The message of the first limit that stopped a kernel, or None."""
    stopped = [e for e in events if e["kind"] in STOPPED]
    return stopped[0]["message"] if stopped else None


class SandboxUnavailable(RuntimeError):
    """bwrap cannot start here; the message names the cause and the opt-out."""


def bwrap_program() -> str:
    """The bubblewrap program: ``$COURSE_BWRAP`` if set (a path or a name on PATH), else bwrap."""
    return os.environ.get("COURSE_BWRAP", "bwrap")


@functools.cache
def sandbox_problem() -> str | None:
    """Why a bubblewrap sandbox cannot start on this machine, or None when it can (a tiny
    sandbox with every namespace is started once per process to find out)."""
    bwrap = shutil.which(bwrap_program())
    if bwrap is None:
        return (f"bubblewrap ({bwrap_program()}) is not installed: install it (Debian/Ubuntu: "
                "apt-get install bubblewrap)")
    try:
        done = subprocess.run([bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                               "--unshare-all", "--die-with-parent", "--uid", str(SANDBOX_UID),
                               "true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"bwrap could not run: {error}"
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return (f"bwrap cannot create its namespaces here ({reason}); user namespaces may be "
                "disabled (sysctl kernel.unprivileged_userns_clone / "
                "user.max_user_namespaces) or forbidden in this container")
    return None


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SandboxUnavailable(f"the sandbox needs the {name} package, which is not importable")
    return Path(list(spec.submodule_search_locations)[0]).resolve()


def _python_dirs() -> list[str]:
    """The folders the kernel's interpreter and its packages live in, as given and resolved."""
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(sys.executable)}
    dirs |= {os.path.realpath(d) for d in list(dirs)}
    dirs |= {os.path.dirname(os.path.realpath(sys.executable))}
    return sorted(d for d in dirs if d and os.path.isdir(d))


def bwrap_command(kernel_dir: Path) -> list[str]:
    """The bwrap arguments (up to and including ``--``) of one kernel's sandbox.

    kernel_dir: the folder of the kernel's connection file and ipc sockets (bound read-write,
    at the same path). The working directory is empty; every writable mount is a sized tmpfs
    but that folder, and the root and /dev are remounted read-only last."""
    args = [shutil.which(bwrap_program()) or bwrap_program(), "--unshare-all", "--die-with-parent",
            "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
            "--hostname", "sandbox", "--clearenv"]
    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for name in ETC_FILES:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    # The private /tmp and HOME first: the Python environment (a checkout's .venv may live under
    # /tmp, as a fresh clone in CI does) is bound over them afterwards, not hidden by them.
    args += [*_sized_tmpfs("/tmp", TMPFS_MB), *_sized_tmpfs(SANDBOX_HOME, TMPFS_MB)]
    for folder in _python_dirs():
        if not folder.startswith(("/usr/", "/bin", "/lib")):
            args += ["--ro-bind", folder, folder]
    for package in KERNEL_PACKAGES:
        args += ["--ro-bind", str(_package_dir(package)), f"{SANDBOX_COURSE}/{package}"]
    args += ["--proc", "/proc", "--dev", "/dev", *_sized_tmpfs("/dev/shm", SHM_MB),
             "--ro-bind-try", "/sys", "/sys",
             "--dir", SANDBOX_WORK, "--dir", f"{SANDBOX_HOME}/.ipython",
             "--bind", str(kernel_dir), str(kernel_dir),
             # last, once every mount point exists: bwrap's root tmpfs and /dev become read-only
             "--remount-ro", "/dev", "--remount-ro", "/",
             "--chdir", SANDBOX_WORK]
    env = {"HOME": SANDBOX_HOME, "IPYTHONDIR": f"{SANDBOX_HOME}/.ipython",
           "PATH": f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin",
           "PYTHONPATH": SANDBOX_COURSE, "MPLCONFIGDIR": "/tmp/matplotlib",
           "PYTHONDONTWRITEBYTECODE": "1", "USER": "learner"}
    env |= {name: os.environ[name] for name in PASSED_ENV if name in os.environ}
    for name, value in env.items():
        args += ["--setenv", name, value]
    return args + ["--"]


@functools.cache
def _bwrap_has_size() -> bool:
    done = subprocess.run([bwrap_program(), "--help"], capture_output=True, text=True)
    return "--size" in done.stdout + done.stderr


def _sized_tmpfs(path: str, size_mb: int) -> list[str]:
    """A tmpfs at path of size_mb (unsized where bwrap is older than 0.5: the memory cgroup
    still counts its files)."""
    size = ["--size", str(size_mb * MiB)] if _bwrap_has_size() else []
    return [*size, "--tmpfs", path]


# ------------------------------------------------------------------------------------------------
# Limits set before the kernel starts: rlimits and the memory cgroup, entered by a launcher
# ------------------------------------------------------------------------------------------------

NO_MEMORY_LIMIT = ("memory limit not enforced: this OS has no `resource` module (POSIX only, "
                   "e.g. Windows), so a notebook's kernel may use all the machine's memory")


def address_space_mb(memory_limit_mb: int) -> int:
    """RLIMIT_AS of a kernel allowed memory_limit_mb: the limit plus what a kernel reserves
    without using it (KERNEL_VIRTUAL_MB, and THREAD_VIRTUAL_MB per CPU)."""
    return memory_limit_mb + KERNEL_VIRTUAL_MB + THREAD_VIRTUAL_MB * (os.cpu_count() or 1)


_LAUNCHER = """\
import os, resource, sys
if {procs!r}:
    with open({procs!r}, "w") as procs:   # enter the sandbox's memory cgroup before it starts
        procs.write(str(os.getpid()))
for name, limit in {limits!r}.items():
    which = getattr(resource, name)
    hard = resource.getrlimit(which)[1]
    limit = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
    resource.setrlimit(which, (limit, limit))
os.execv(sys.argv[1], sys.argv[1:])
"""


def limit_command(memory_limit_mb: int, log: logging.Logger | None = None, *,
                  cgroup: MemoryCgroup | None = None) -> list[str]:
    """A launcher that enters ``cgroup`` (if any), sets the rlimits (hard and soft: the kernel
    cannot raise them) and then becomes the command that follows it: RLIMIT_FSIZE of
    MAX_FILE_MB, and for memory_limit_mb > 0 RLIMIT_AS of :func:`address_space_mb` on Linux
    (RLIMIT_DATA of memory_limit_mb elsewhere, e.g. macOS). Where Python has no ``resource``
    module (Windows) there is no rlimit to set: no launcher, and a warning (``log``) says so."""
    if importlib.util.find_spec("resource") is None:
        if memory_limit_mb > 0:
            (log or logging.getLogger(__name__)).warning(NO_MEMORY_LIMIT)
        return []
    limits = {"RLIMIT_FSIZE": MAX_FILE_MB * MiB}
    if memory_limit_mb > 0 and sys.platform.startswith("linux"):
        limits["RLIMIT_AS"] = address_space_mb(memory_limit_mb) * MiB
    elif memory_limit_mb > 0:
        limits["RLIMIT_DATA"] = memory_limit_mb * MiB
    procs = str(cgroup.procs) if cgroup is not None else ""
    return [sys.executable, "-c", _LAUNCHER.format(procs=procs, limits=limits)]


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
        for version, parent in _own_memory_cgroups():
            _remove_stale(parent)
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


def _own_memory_cgroups() -> list[tuple[int, Path]]:
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


def _remove_stale(parent: Path) -> None:
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


# ------------------------------------------------------------------------------------------------
# The watchdog's measures, read from /proc and the connection folder
# ------------------------------------------------------------------------------------------------

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


# ------------------------------------------------------------------------------------------------
# The kernel manager
# ------------------------------------------------------------------------------------------------

class SandboxedKernelManager(AsyncKernelManager):
    """A kernel manager that runs its kernel in a bubblewrap sandbox (see the module's doc)."""

    memory_limit_mb = Integer(
        2048, help="Memory the kernel's sandbox may hold, in MiB (all its processes, memfd and "
                   "tmpfs files; see course.grading.sandbox); 0: no limit. Past it the sandbox "
                   "is killed, and an allocation past about as much raises MemoryError."
    ).tag(config=True)
    notebook_timeout = Integer(
        600, help="Seconds a kernel may live (a whole notebook); past them the sandbox and every "
                  "process in it are killed (SIGKILL). 0: no limit.").tag(config=True)
    unsandboxed_trusted = Bool(
        False, help="Run kernels WITHOUT the sandbox (as the grader's own user, in the "
                    "notebook's folder) when bwrap cannot start. Only for trusted notebooks: "
                    "their code can then read and change everything the grader can."
    ).tag(config=True)
    events = List(help="What happened to this manager's kernels (see stopped_event), oldest "
                       "first; not configurable.")
    events_file = Unicode(
        "", help="A file to append each kernel's events to, one JSON object per line (the "
                 "grader's worker sets it in its job's folder and reads it back); unset, the "
                 "events stay on the kernel manager (events).").tag(config=True)
    sandbox = Unicode(
        "autograde", help="When a kernel must run in the sandbox: 'autograde' (default): when "
                          "nbgrader autogrades (NBGRADER_EXECUTION=autograde), else only if bwrap "
                          "works (the learner's own check of their own code on their machine); "
                          "'required': always; 'if-available': never required."
    ).tag(config=True)

    def _record(self, event: dict) -> None:
        self.events.append(event)
        if self.events_file:
            with open(self.events_file, "a", encoding="utf-8") as f:
                f.write(json.dumps(event) + "\n")

    def _required(self) -> bool:
        if self.sandbox == "autograde":
            return os.environ.get("NBGRADER_EXECUTION") == "autograde"
        return self.sandbox == "required"

    @default("transport")
    def _default_transport(self):
        return "ipc"

    def _use_sandbox(self) -> bool:
        problem = sandbox_problem()
        if problem is None:
            return True
        if self.unsandboxed_trusted or not self._required():
            if not any(e["kind"] == "unsandboxed" for e in self.events):   # once per manager
                print(f"warning: running notebooks WITHOUT the sandbox: {problem}",
                      file=sys.stderr, flush=True)
            self._record({"kind": "unsandboxed", "reason": problem})
            return False
        raise SandboxUnavailable(
            f"cannot grade in a sandbox: {problem}. Grading untrusted notebooks without one "
            "would let them read and change the course; for trusted notebooks only, pass "
            "--unsandboxed-trusted (or set c.SandboxedKernelManager.unsandboxed_trusted = True).")

    async def _async_pre_start_kernel(self, **kw):
        self._sandboxed = self._use_sandbox()
        self._kernel_dir = Path(tempfile.mkdtemp(prefix="k", dir="/tmp"))
        os.chmod(self._kernel_dir, 0o700)
        self.connection_file = str(self._kernel_dir / "kernel.json")
        self.ip = str(self._kernel_dir / "kernel-ipc")
        self._cgroup = MemoryCgroup.create(address_space_mb(self.memory_limit_mb)
                                           + CGROUP_CACHE_MB) \
            if self.memory_limit_mb > 0 else None
        if self._sandboxed:
            # A signal from outside reaches bwrap, not the kernel: interrupt over the control
            # channel (ipykernel then signals itself).
            self.kernel_spec.interrupt_mode = "message"
        elif self.transport == "ipc":
            self.transport = "tcp"
            self.ip = "127.0.0.1"
        return await super()._async_pre_start_kernel(**kw)

    def format_kernel_cmd(self, extra_arguments=None):
        # parent_handle=1: no parent poller (the sandbox has its own pid 1) and no console banner.
        cmd = super().format_kernel_cmd([*(extra_arguments or []),
                                         "--IPKernelApp.parent_handle=1"])
        if self._sandboxed:
            cmd = bwrap_command(self._kernel_dir) + cmd
        return limit_command(self.memory_limit_mb, self.log, cgroup=self._cgroup) + cmd

    async def _async_launch_kernel(self, kernel_cmd, **kw):
        if self._sandboxed:
            kw.pop("cwd", None)                  # bwrap --chdir sets it inside the sandbox
            env = {k: v for k, v in (kw.get("env") or os.environ).items()
                   if k in ("PATH", "LANG", "LC_ALL")}
            kw["env"] = env
        await super()._async_launch_kernel(kernel_cmd, **kw)
        self._start_watchdog()

    # -------------------------------------------------------------------- the watchdog
    def _start_watchdog(self) -> None:
        """A thread that checks the sandbox every WATCH_INTERVAL_S (:meth:`_past_a_limit`) and
        stops it at the first limit it is past."""
        self._watch_stop = threading.Event()
        self._stop_lock = threading.Lock()
        self._stopped = False
        process = getattr(self.provisioner, "process", None) if self.provisioner else None
        self._process = process
        if process is None:
            self._watchdog = None
            return
        deadline = time.monotonic() + self.notebook_timeout if self.notebook_timeout > 0 else None

        def watch() -> None:
            while not self._watch_stop.wait(WATCH_INTERVAL_S):
                alive = process.poll() is None       # one more look once it has ended
                if alive and deadline is not None and time.monotonic() > deadline:
                    self._stop(stopped_event("timeout", seconds=self.notebook_timeout))
                try:
                    event = self._past_a_limit()
                except Exception:                    # a failed look must not stop the clock
                    self.log.exception("the sandbox's watchdog could not measure it")
                    event = None
                if event is not None:
                    self._stop(event)
                if self._stopped or not alive:
                    return

        self._watchdog = threading.Thread(target=watch, name="sandbox-watchdog", daemon=True)
        self._watchdog.start()

    def _past_a_limit(self) -> dict | None:
        """The event of the memory or disk limit the sandbox is past, or None. Once the
        launched process has ended only the cgroup and the folder are read (its pid may be
        another process's already)."""
        alive = self._process is not None and self._process.poll() is None
        pids = [] if not alive else self._cgroup.pids() if self._cgroup is not None \
            else sandbox_pids(self._process.pid)
        deleted, memfds = held_files(pids)
        if self.memory_limit_mb > 0:
            cgroup, limit = self._cgroup, self.memory_limit_mb * MiB
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
        if self._sandboxed:
            limit = KERNEL_DIR_MB * MiB
            inside = str(self._kernel_dir) + os.sep
            hidden = MAX_FILE_MB * MiB * sum(path.startswith(inside) for path in deleted)
            if hidden + folder_bytes(self._kernel_dir, limit - hidden) > limit:
                return stopped_event("disk", limit_mb=KERNEL_DIR_MB)
        return None

    def _stop(self, event: dict) -> None:
        """Record why the sandbox is stopped (once per kernel) and kill it if it still runs."""
        with self._stop_lock:                   # the watchdog and the cleanup may both look
            if self._stopped:
                return
            self._stopped = True
        self._record(event)
        self.log.error("%s", event["message"])
        if self._process is not None and self._process.poll() is None:
            _kill_tree(self._process.pid)

    def _finish_watchdog(self) -> None:
        """Stop the watchdog and look once more: a kernel the OOM killer ended, or one that
        died with too much in its folder, gets its reason too."""
        stop = getattr(self, "_watch_stop", None)
        if stop is None:
            return
        stop.set()
        if self._watchdog is not None and self._watchdog is not threading.current_thread():
            self._watchdog.join(timeout=5)
        event = self._past_a_limit()
        if event is not None:
            self._stop(event)

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        process = getattr(self.provisioner, "process", None) if self.provisioner else None
        if process is not None and process.poll() is None:
            _kill_tree(process.pid)
        self._finish_watchdog()
        await super()._async_cleanup_resources(restart=restart)
        cgroup = getattr(self, "_cgroup", None)
        if cgroup is not None:
            cgroup.remove()
            self._cgroup = None
        kernel_dir = getattr(self, "_kernel_dir", None)
        if kernel_dir is not None and not restart:
            shutil.rmtree(kernel_dir, ignore_errors=True)

    # AsyncKernelManager binds KernelManager's own method to this name: nbclient calls it on a
    # kernel that died (killed by a limit), and this class's cleanup must run then too.
    cleanup_resources = _async_cleanup_resources


def _kill_tree(pid: int) -> None:
    """SIGKILL a launched kernel: its process group (jupyter starts it in its own session) and
    the process itself. In the sandbox, bwrap's death takes every process of its pid
    namespace with it."""
    for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            kill()
        except (ProcessLookupError, PermissionError):
            pass
