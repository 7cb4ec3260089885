"""What happened to a kernel: events, their messages, and the file a job keeps them in.

What happened to a kernel (started unsandboxed; stopped at the wall clock, past its memory or
past its disk) is an event (:func:`stopped_event`) kept by its kernel manager (``events``) and,
when ``events_file`` is set, appended to that file: the grader's worker sets it to its job's
folder and reads it back (:func:`read_events`) to explain a failure (:func:`stop_reason`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

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
