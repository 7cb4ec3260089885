"""llmcheck.identity: object identity that raises no audit event (llmcheck/identity.py).

The audit hook cannot be removed from a process once added, so the event count is checked in a
subprocess of its own."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import torch

from llmcheck.identity import identity


class LoudHash:
    """A class whose own hash says nothing of identity and runs code when called."""

    calls = 0

    def __hash__(self):
        LoudHash.calls += 1
        return 7

    def __eq__(self, other):
        return True


def test_identity_is_one_number_per_live_object_and_runs_no_code_of_theirs():
    objects = [object(), LoudHash(), LoudHash(), np.zeros(3), [1, 2], {"a": 1}, torch.zeros(2),
               torch.zeros(2), np.dot, np.linalg.norm, len, identity]
    keys = [identity(o) for o in objects]
    assert len(set(keys)) == len(objects)                     # unhashable ones included
    assert keys == [identity(o) for o in objects]             # stable
    assert LoudHash.calls == 0                                # the class's __hash__ never ran
    t = torch.zeros(2)
    assert identity(t) == identity(t) != identity(t.view(2))  # a view is another object


def test_identity_raises_no_audit_event_where_id_raises_one():
    code = """
import sys
events = []
sys.addaudithook(lambda event, args: events.append(event))
from llmcheck.identity import identity
before = len(events)
identity(object()), identity([])
quiet = events[before:].count("builtins.id")
before = len(events)
id(object()), id([])
loud = events[before:].count("builtins.id")
print(quiet, loud)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=True)
    assert result.stdout.split() == ["0", "2"], result.stdout + result.stderr
