"""The grader's kernel client: ready as soon as the kernel has answered, not 0.2 s later.

jupyter_client's ``wait_for_ready`` ends by reading the IOPub channel until it has been silent
for 0.2 s, once per kernel: on a grade run whose kernels are forked in about 0.2 s
(``zygote.py``), that wait was half of each kernel's start. :class:`ReadyKernelClient` waits for
the same thing without the silence: the ``kernel_info`` reply on the shell channel, then, on
IOPub, the ``idle`` status of that very request, which the kernel publishes after everything it
published before (the start-up lines' output included), so IOPub is connected and drained up to
it. If IOPub joined too late to see it, the request is sent again, as jupyter_client does.
"""

from __future__ import annotations

import time
from queue import Empty

import zmq

from jupyter_client.asynchronous import AsyncKernelClient

RETRY_S = 0.2
"""How long the client waits for a request's idle on IOPub before it asks again."""
RECONNECT_MS = 10
"""How soon the client's sockets try again to reach a kernel not yet listening (zmq's default:
100 ms)."""


class ReadyKernelClient(AsyncKernelClient):
    """An AsyncKernelClient whose ``wait_for_ready`` returns once IOPub is drained up to the
    kernel_info request's idle status (see the module's doc); the rest is jupyter_client's."""

    async def _async_wait_for_ready(self, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (float("inf") if timeout is None else timeout)
        while True:
            request = self.kernel_info()
            if await self._answered(request, min(deadline, time.monotonic() + RETRY_S)):
                return
            if not await self._async_is_alive():
                raise RuntimeError("Kernel died before replying to kernel_info")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Kernel didn't respond in {timeout:.0f} seconds")

    wait_for_ready = _async_wait_for_ready

    def start_channels(self, *args, **kwargs) -> None:
        """jupyter_client's, with sockets that try again every RECONNECT_MS to reach a kernel
        that was not yet listening: the stdin channel, which no message of this wait goes
        through, is connected long before the kernel has started and answered (its start-up
        takes tens of milliseconds after it listens), as with jupyter_client's 0.2 s wait."""
        self.context.setsockopt(zmq.RECONNECT_IVL, RECONNECT_MS)
        super().start_channels(*args, **kwargs)

    async def _answered(self, request: str, until: float) -> bool:
        """Whether the kernel_info ``request`` got its reply and its idle status by ``until``
        (its reply is handled as jupyter_client's wait handles it)."""
        replied = idle = False
        while not (replied and idle):
            left = until - time.monotonic()
            if left <= 0:
                return False
            channel = self.iopub_channel if replied else self.shell_channel
            try:
                msg = await channel.get_msg(timeout=left)
            except Empty:
                return False
            if msg.get("parent_header", {}).get("msg_id") != request:
                continue
            if not replied and msg["msg_type"] == "kernel_info_reply":
                self._handle_kernel_info_reply(msg)
                replied = True
            elif replied and msg["msg_type"] == "status" \
                    and msg["content"].get("execution_state") == "idle":
                idle = True
        return True
