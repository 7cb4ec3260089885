"""The kernel manager nbgrader and the learner's check start kernels with: the sandbox put together.

:class:`SandboxedKernelManager` (a jupyter_client ``AsyncKernelManager``, named in
``nbgrader_config.py``) makes each kernel a connection folder, a memory cgroup where it can
(``cgroup.py``), a launcher that sets the rlimits (``launcher.py``), the bwrap command
(``bwrap.py``) and a watchdog (``watchdog.py``); it keeps the events of its kernels
(``events.py``) and cleans all of it up when the kernel ends.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager
from traitlets import Bool, DottedObjectName, Integer, List, Unicode, default

from .bwrap import SandboxUnavailable, bwrap_command, sandbox_problem
from .cgroup import MemoryCgroup
from .client import ReadyKernelClient
from .launcher import limit_command, rlimits
from .limits import CGROUP_CACHE_MB, address_space_mb
from .watchdog import Watchdog, kill_tree
from .zygote import ZYGOTE_ENV, ForkedKernel, ZygoteUnavailable, fork_kernel


class SandboxedKernelManager(AsyncKernelManager):
    """A kernel manager that runs its kernel in a bubblewrap sandbox (see the package's doc)."""

    # ready once the kernel has answered (client.py), not after 0.2 s of silence on IOPub
    client_class = DottedObjectName("course.grading.sandbox.client.ReadyKernelClient")

    @default("client_factory")
    def _default_client_factory(self):
        return ReadyKernelClient

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
    zygote = Unicode(
        help="The socket of a zygote (course/grading/sandbox/zygote.py) to fork sandboxed "
             "kernels from instead of starting each one; default: $COURSE_GRADE_ZYGOTE (the "
             "grade run's), else none. Where it cannot fork, kernels start as usual."
    ).tag(config=True)
    from_zygote = Bool(False, help="Whether the last kernel was forked by the zygote (read "
                                   "by the grader's profile); not configurable.")

    @default("zygote")
    def _default_zygote(self):
        return os.environ.get(ZYGOTE_ENV, "")

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
        self.from_zygote = self._sandboxed and self._zygote_can_fork()
        folder = os.path.dirname(self.zygote) if self.from_zygote else "/tmp"
        self._kernel_dir = Path(tempfile.mkdtemp(prefix="k", dir=folder))
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

    def _zygote_can_fork(self) -> bool:
        """A zygote is set, is there, and the kernel is ipykernel's (what it forks)."""
        argv = list(self.kernel_spec.argv) if self.kernel_spec else []
        return bool(self.zygote) and os.path.exists(self.zygote) \
            and argv[1:3] == ["-m", "ipykernel_launcher"]

    def format_kernel_cmd(self, extra_arguments=None):
        # parent_handle=1: no parent poller (the sandbox has its own pid 1) and no console banner.
        cmd = super().format_kernel_cmd([*(extra_arguments or []),
                                         "--IPKernelApp.parent_handle=1"])
        return cmd if self.from_zygote else self._walled(cmd)   # the zygote walls its own

    def _walled(self, cmd: list[str]) -> list[str]:
        """The kernel's command in its sandbox (where there is one), under the launcher."""
        if self._sandboxed:
            cmd = bwrap_command(self._kernel_dir) + cmd
        return limit_command(self.memory_limit_mb, self.log, cgroup=self._cgroup) + cmd

    async def _async_launch_kernel(self, kernel_cmd, **kw):
        if self.from_zygote:
            try:
                self._fork_from_zygote(kernel_cmd)
                return
            except ZygoteUnavailable as error:   # the kernel starts as usual instead
                self.log.warning("%s; starting the kernel without it", error)
                self._record({"kind": "zygote-refused", "reason": str(error)})
                self.from_zygote = False
                kernel_cmd = self._walled(kernel_cmd)
        if self._sandboxed:
            kw.pop("cwd", None)                  # bwrap --chdir sets it inside the sandbox
            env = {k: v for k, v in (kw.get("env") or os.environ).items()
                   if k in ("PATH", "LANG", "LC_ALL")}
            kw["env"] = env
        await super()._async_launch_kernel(kernel_cmd, **kw)
        self._start_watchdog()

    def _fork_from_zygote(self, kernel_cmd: list[str]) -> None:
        """The kernel forked by the zygote (``zygote.py``) and entered in its cgroup before it
        starts; jupyter_client sees it as the provisioner's process."""
        argv = kernel_cmd[kernel_cmd.index("ipykernel_launcher") + 1:]
        forked = fork_kernel(self.zygote, self._kernel_dir, argv, rlimits(self.memory_limit_mb))
        try:
            if self._cgroup is not None:
                self._cgroup.procs.write_text(str(forked.pid))
            forked.go()
        except BaseException:
            forked.close()
            raise
        self._forked = forked
        provisioner = self.provisioner
        provisioner.process, provisioner.pid, provisioner.pgid = forked, forked.pid, forked.pid
        self._reconcile_connection_info(provisioner.connection_info)
        self._start_watchdog()

    def _start_watchdog(self) -> None:
        process = getattr(self.provisioner, "process", None) if self.provisioner else None
        self._watchdog = Watchdog(process, memory_limit_mb=self.memory_limit_mb,
                                  notebook_timeout=self.notebook_timeout, cgroup=self._cgroup,
                                  kernel_dir=self._kernel_dir if self._sandboxed else None,
                                  record=self._record, log=self.log)
        self._watchdog.start()

    async def _async_shutdown_kernel(self, now: bool = False, restart: bool = False) -> None:
        # A graded kernel is never reused and nothing it holds is kept: it is killed at once
        # (with the whole sandbox, by the cleanup) instead of asked to stop and waited for
        # (seconds per notebook). jupyter_client also interrupts a kernel before stopping it,
        # and an idle one (every notebook that ran to its end) answered by logging
        # "KeyboardInterrupt caught in kernel." on stderr: no interrupt is sent.
        self._quiet_shutdown = True
        try:
            await super()._async_shutdown_kernel(now=True, restart=restart)
        finally:
            self._quiet_shutdown = False

    shutdown_kernel = _async_shutdown_kernel     # AsyncKernelManager binds its parent's here

    async def _async_interrupt_kernel(self) -> None:
        if getattr(self, "_quiet_shutdown", False):
            return
        await super()._async_interrupt_kernel()

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        process = getattr(self.provisioner, "process", None) if self.provisioner else None
        if process is not None and process.poll() is None:
            kill_tree(process.pid)
        forked = getattr(self, "_forked", None)
        if forked is not None:
            forked.close()
            self._forked = None
        watchdog = getattr(self, "_watchdog", None)
        if watchdog is not None:
            watchdog.finish()
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
