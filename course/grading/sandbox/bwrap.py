"""The sandbox's walls: the ``bwrap`` (Debian's ``bubblewrap``) command a kernel starts in.

:func:`bwrap_command` gives a kernel:

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
  ``--die-with-parent``: killing the sandbox kills every process started in it.

Where bwrap cannot start (not installed, no user namespaces) starting a kernel to autograde
raises :class:`SandboxUnavailable` naming the cause, unless ``unsandboxed_trusted`` is set
(trusted submissions only): the kernel then runs as the grader's own user with the memory cap and
wall clock alone, with a warning. The learner's ``course-check`` (nbgrader's validate: their own
code on their own machine) uses the sandbox where bwrap works and runs without it, with a warning,
where it does not (``sandbox = 'required'`` makes it refuse too).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Mapping

from .limits import SHM_MB, TMPFS_MB, MiB

SANDBOX_HOME = "/home/learner"
SANDBOX_WORK = f"{SANDBOX_HOME}/work"
SANDBOX_COURSE = "/opt/course"          # llmcore and llmcheck are mounted here, read-only
KERNEL_PACKAGES = ("llmcore", "llmcheck")   # what a graded notebook imports of the course
SANDBOX_UID = 1000
ETC_FILES = ("passwd", "group", "hosts", "nsswitch.conf", "ld.so.cache", "ld.so.conf",
             "ld.so.conf.d", "localtime", "alternatives", "ssl", "mime.types")
PASSED_ENV = ("LANG", "LC_ALL", "TZ", "OPENBLAS_CORETYPE", "OMP_NUM_THREADS",
              "MKL_NUM_THREADS", "TORCH_CPP_LOG_LEVEL")


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


def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SandboxUnavailable(f"the sandbox needs the {name} package, which is not importable")
    return Path(list(spec.submodule_search_locations)[0]).resolve()


def python_dirs() -> list[str]:
    """The folders the kernel's interpreter and its packages live in, as given and resolved."""
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(sys.executable)}
    dirs |= {os.path.realpath(d) for d in list(dirs)}
    dirs |= {os.path.dirname(os.path.realpath(sys.executable))}
    return sorted(d for d in dirs if d and os.path.isdir(d))


def bwrap_command(kernel_dir: Path, *, caps: tuple[str, ...] = (),
                  files: dict[str, str] | None = None, uid: int = SANDBOX_UID,
                  environ: Mapping[str, str] | None = None) -> list[str]:
    """The bwrap arguments (up to and including ``--``) of one kernel's sandbox.

    kernel_dir: the folder of the kernel's connection file and ipc sockets (bound read-write,
    at the same path). The working directory is empty; every writable mount is a sized tmpfs
    but that folder, and the root and /dev are remounted read-only last. caps: capabilities
    kept inside the sandbox's own user namespace (the zygote's, ``zygote.py``; a kernel keeps
    none); files: host files bound read-only at the given paths; uid: the user (and group) it
    runs as (the zygote's is 0, in its own user namespace: each kernel it forks is
    ``SANDBOX_UID`` again); environ: where the variables it passes on (``PASSED_ENV``) are
    read (default: this process's environment)."""
    args = [shutil.which(bwrap_program()) or bwrap_program(), "--unshare-all", "--die-with-parent",
            "--uid", str(uid), "--gid", str(uid),
            "--hostname", "sandbox", "--clearenv"]
    for cap in caps:
        args += ["--cap-add", cap]
    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for name in ETC_FILES:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    # The private /tmp and HOME first: the Python environment (a checkout's .venv may live under
    # /tmp, as a fresh clone in CI does) is bound over them afterwards, not hidden by them.
    args += [*sized_tmpfs("/tmp", TMPFS_MB), *sized_tmpfs(SANDBOX_HOME, TMPFS_MB)]
    for folder in python_dirs():
        if not folder.startswith(("/usr/", "/bin", "/lib")):
            args += ["--ro-bind", folder, folder]
    for package in KERNEL_PACKAGES:
        args += ["--ro-bind", str(package_dir(package)), f"{SANDBOX_COURSE}/{package}"]
    for source, target in (files or {}).items():
        args += ["--ro-bind", source, target]
    args += ["--proc", "/proc", "--dev", "/dev", *sized_tmpfs("/dev/shm", SHM_MB),
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
    environ = os.environ if environ is None else environ
    env |= {name: environ[name] for name in PASSED_ENV if name in environ}
    for name, value in env.items():
        args += ["--setenv", name, value]
    return args + ["--"]


@functools.cache
def bwrap_has_size() -> bool:
    done = subprocess.run([bwrap_program(), "--help"], capture_output=True, text=True)
    return "--size" in done.stdout + done.stderr


def sized_tmpfs(path: str, size_mb: int) -> list[str]:
    """A tmpfs at path of size_mb (unsized where bwrap is older than 0.5: the memory cgroup
    still counts its files)."""
    size = ["--size", str(size_mb * MiB)] if bwrap_has_size() else []
    return [*size, "--tmpfs", path]
