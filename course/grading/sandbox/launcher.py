"""The launcher: limits set before the kernel starts (rlimits, and entering the memory cgroup).

Every process of a sandbox gets an address-space limit (``RLIMIT_AS``, :func:`address_space_mb`)
and a file-size limit (``RLIMIT_FSIZE``, ``MAX_FILE_MB``), hard and soft, set by a small Python
launcher that then becomes the kernel's command (bwrap and the kernel inherit them). Where Python
has no ``resource`` module (Windows) there is no limit at all, with a warning; on macOS the
launcher sets ``RLIMIT_DATA`` (no cgroup).
"""

from __future__ import annotations

import importlib.util
import logging
import sys

from .cgroup import MemoryCgroup
from .limits import MAX_FILE_MB, MiB, address_space_mb

NO_MEMORY_LIMIT = ("memory limit not enforced: this OS has no `resource` module (POSIX only, "
                   "e.g. Windows), so a notebook's kernel may use all the machine's memory")


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
    procs = str(cgroup.procs) if cgroup is not None else ""
    return [sys.executable, "-c", _LAUNCHER.format(procs=procs, limits=rlimits(memory_limit_mb))]


def rlimits(memory_limit_mb: int) -> dict[str, int]:
    """The rlimits of a kernel allowed memory_limit_mb (0: no memory limit), by name: the
    launcher's, and those a kernel forked by the zygote sets (``zygote.py``)."""
    limits = {"RLIMIT_FSIZE": MAX_FILE_MB * MiB}
    if memory_limit_mb > 0 and sys.platform.startswith("linux"):
        limits["RLIMIT_AS"] = address_space_mb(memory_limit_mb) * MiB
    elif memory_limit_mb > 0:
        limits["RLIMIT_DATA"] = memory_limit_mb * MiB
    return limits
