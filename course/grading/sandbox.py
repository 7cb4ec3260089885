"""The sandbox a notebook's kernel runs in: bubblewrap, a memory cap and a wall clock.

:class:`SandboxedKernelManager` is a jupyter_client kernel manager that starts the kernel command
inside ``bwrap`` (Debian's ``bubblewrap``):

- a read-only view of the Python environment (``sys.prefix``, ``sys.base_prefix``, ``/usr``,
  ``/lib*``, a few ``/etc`` files) and of the ``llmcore`` and ``llmcheck`` package directories,
  mounted under ``/opt/course``; nothing else of the course (no ``solutions/``, ``source/``, gradebook,
  ``nbgrader_config.py``, other submissions);
- a private working directory ``/home/learner/work`` holding only copies of the notebooks of the
  folder it was started in; its own ``/tmp``, ``HOME`` and ``IPYTHONDIR`` (tmpfs of
  ``TMPFS_MB`` each where bwrap supports ``--size``: nothing it writes outlives it);
- no network (``--unshare-net``), so the grader talks to the kernel over jupyter's ``ipc``
  transport: unix sockets in a per-kernel directory bound into the sandbox;
- its own pid namespace and user (uid 1000): it cannot see or signal the grader or other kernels;
  ``--die-with-parent``: killing the sandbox kills every process started in it;
- ``RLIMIT_DATA`` of ``memory_limit_mb`` (allocations past it raise MemoryError);
- a wall clock per kernel (``notebook_timeout`` seconds): past it the whole sandbox gets SIGKILL,
  whatever the kernel does with SIGINT.

Where bwrap cannot start (not installed, no user namespaces) starting a kernel to autograde
raises :class:`SandboxUnavailable` naming the cause, unless ``unsandboxed_trusted`` is set
(trusted submissions only): the kernel then runs as the grader's own user with the memory cap and
wall clock alone, with a warning. The learner's ``course-check`` (nbgrader's validate: their own
code on their own machine) uses the sandbox where bwrap works and runs without it, with a warning,
where it does not (``sandbox = 'required'`` makes it refuse too).

What happened to each kernel (killed at the wall clock, started unsandboxed) is appended to
:data:`EVENTS`, which the grader reads to explain a failure.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager
from traitlets import Bool, Integer, Unicode, default

SANDBOX_HOME = "/home/learner"
SANDBOX_WORK = f"{SANDBOX_HOME}/work"
SANDBOX_COURSE = "/opt/course"          # llmcore and llmcheck are mounted here, read-only
KERNEL_PACKAGES = ("llmcore", "llmcheck")   # what a graded notebook imports of the course
SANDBOX_UID = 1000
ETC_FILES = ("passwd", "group", "hosts", "nsswitch.conf", "ld.so.cache", "ld.so.conf",
             "ld.so.conf.d", "localtime", "alternatives", "ssl", "mime.types")
PASSED_ENV = ("LANG", "LC_ALL", "TZ", "OPENBLAS_CORETYPE", "OMP_NUM_THREADS",
              "MKL_NUM_THREADS", "TORCH_CPP_LOG_LEVEL")

EVENTS: list[dict] = []
"""One dict per notable thing that happened to a kernel: ``{"kind": "timeout", "seconds": ..}``,
``{"kind": "unsandboxed"}``; appended by the kernel managers of this process."""


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


def bwrap_command(kernel_dir: Path, notebooks: list[Path]) -> list[str]:
    """The bwrap arguments (up to and including ``--``) of one kernel's sandbox.

    kernel_dir: the folder of the kernel's connection file and ipc sockets (bound read-write,
    at the same path); notebooks: files copied read-only into the working directory."""
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
    args += [*_sized_tmpfs("/tmp"), *_sized_tmpfs(SANDBOX_HOME)]
    for folder in _python_dirs():
        if not folder.startswith(("/usr/", "/bin", "/lib")):
            args += ["--ro-bind", folder, folder]
    for package in KERNEL_PACKAGES:
        args += ["--ro-bind", str(_package_dir(package)), f"{SANDBOX_COURSE}/{package}"]
    args += ["--proc", "/proc", "--dev", "/dev", "--ro-bind-try", "/sys", "/sys",
             "--dir", SANDBOX_WORK, "--dir", f"{SANDBOX_HOME}/.ipython"]
    for notebook in notebooks:
        args += ["--ro-bind", str(notebook), f"{SANDBOX_WORK}/{notebook.name}"]
    args += ["--bind", str(kernel_dir), str(kernel_dir), "--chdir", SANDBOX_WORK]
    env = {"HOME": SANDBOX_HOME, "IPYTHONDIR": f"{SANDBOX_HOME}/.ipython",
           "PATH": f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin",
           "PYTHONPATH": SANDBOX_COURSE, "MPLCONFIGDIR": "/tmp/matplotlib",
           "PYTHONDONTWRITEBYTECODE": "1", "USER": "learner"}
    env |= {name: os.environ[name] for name in PASSED_ENV if name in os.environ}
    for name, value in env.items():
        args += ["--setenv", name, value]
    return args + ["--"]


TMPFS_MB = 512
"""Size of the sandbox's /tmp and of its HOME (each; they live in memory)."""


@functools.cache
def _bwrap_has_size() -> bool:
    done = subprocess.run([bwrap_program(), "--help"], capture_output=True, text=True)
    return "--size" in done.stdout + done.stderr


def _sized_tmpfs(path: str) -> list[str]:
    size = ["--size", str(TMPFS_MB * 2**20)] if _bwrap_has_size() else []
    return [*size, "--tmpfs", path]


NO_MEMORY_LIMIT = ("memory limit not enforced: this OS has no `resource` module (POSIX only, "
                   "e.g. Windows), so a notebook's kernel may use all the machine's memory")


def limit_command(memory_limit_mb: int, log: logging.Logger | None = None) -> list[str]:
    """A launcher that sets RLIMIT_DATA (hard and soft: the kernel cannot raise it) and then
    becomes the kernel command that follows it. Where Python has no ``resource`` module (Windows)
    there is no rlimit to set: no launcher, and a warning (``log``) says so."""
    if memory_limit_mb <= 0:
        return []
    if importlib.util.find_spec("resource") is None:
        (log or logging.getLogger(__name__)).warning(NO_MEMORY_LIMIT)
        return []
    limit = memory_limit_mb * 2**20
    code = ("import os, resource, sys; "
            f"resource.setrlimit(resource.RLIMIT_DATA, ({limit}, {limit})); "
            "os.execv(sys.argv[1], sys.argv[1:])")
    return [sys.executable, "-c", code]


class SandboxedKernelManager(AsyncKernelManager):
    """A kernel manager that runs its kernel in a bubblewrap sandbox (see the module's doc)."""

    memory_limit_mb = Integer(
        2048, help="Memory (RLIMIT_DATA) the kernel may allocate, in MiB; 0: no limit. Past it "
                   "allocations raise MemoryError instead of the machine running out."
    ).tag(config=True)
    notebook_timeout = Integer(
        600, help="Seconds a kernel may live (a whole notebook); past them the sandbox and every "
                  "process in it are killed (SIGKILL). 0: no limit.").tag(config=True)
    unsandboxed_trusted = Bool(
        False, help="Run kernels WITHOUT the sandbox (as the grader's own user, in the "
                    "notebook's folder) when bwrap cannot start. Only for trusted notebooks: "
                    "their code can then read and change everything the grader can."
    ).tag(config=True)
    sandbox = Unicode(
        "autograde", help="When a kernel must run in the sandbox: 'autograde' (default): when "
                          "nbgrader autogrades (NBGRADER_EXECUTION=autograde), else only if bwrap "
                          "works (the learner's own check of their own code on their machine); "
                          "'required': always; 'if-available': never required."
    ).tag(config=True)

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
            if not any(e["kind"] == "unsandboxed" for e in EVENTS):   # once per process
                print(f"warning: running notebooks WITHOUT the sandbox: {problem}",
                      file=sys.stderr, flush=True)
            EVENTS.append({"kind": "unsandboxed", "reason": problem})
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
        folder = Path(kw.get("cwd") or os.getcwd())
        self._notebooks = sorted(p.resolve() for p in folder.glob("*.ipynb") if p.is_file())
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
        cmd = limit_command(self.memory_limit_mb, self.log) + cmd
        if self._sandboxed:
            cmd = bwrap_command(self._kernel_dir, self._notebooks) + cmd
        return cmd

    async def _async_launch_kernel(self, kernel_cmd, **kw):
        if self._sandboxed:
            kw.pop("cwd", None)                  # bwrap --chdir sets it inside the sandbox
            env = {k: v for k, v in (kw.get("env") or os.environ).items()
                   if k in ("PATH", "LANG", "LC_ALL")}
            kw["env"] = env
        await super()._async_launch_kernel(kernel_cmd, **kw)
        self._start_clock()

    def _start_clock(self) -> None:
        self._clock = None
        if self.notebook_timeout <= 0 or self.provisioner is None:
            return
        process = getattr(self.provisioner, "process", None)
        if process is None:
            return

        def kill() -> None:
            if process.poll() is None:
                EVENTS.append({"kind": "timeout", "seconds": self.notebook_timeout})
                self.log.error("kernel ran past %s s: killed", self.notebook_timeout)
                _kill_tree(process.pid)

        self._clock = threading.Timer(self.notebook_timeout, kill)
        self._clock.daemon = True
        self._clock.start()

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        clock = getattr(self, "_clock", None)
        if clock is not None:
            clock.cancel()
        process = getattr(self.provisioner, "process", None) if self.provisioner else None
        if process is not None and process.poll() is None:
            _kill_tree(process.pid)
        await super()._async_cleanup_resources(restart=restart)
        kernel_dir = getattr(self, "_kernel_dir", None)
        if kernel_dir is not None and not restart:
            shutil.rmtree(kernel_dir, ignore_errors=True)


def _kill_tree(pid: int) -> None:
    """SIGKILL a launched kernel: its process group (jupyter starts it in its own session) and
    the process itself. In the sandbox, bwrap's death takes every process of its pid
    namespace with it."""
    for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            kill()
        except (ProcessLookupError, PermissionError):
            pass
