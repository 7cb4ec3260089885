"""A graded test cell's own namespace: what it binds never lands on a learner's name.

A test cell imports ``Test``, ``torch``, ``assert_close``... and assigns ``test``, ``a``, ``rng``;
run in the learner's namespace, those would replace the learner's own names of the same spelling
while the learner's functions run (a helper class of theirs called ``Test``, a function called
``check``). So the grader's executor calls :func:`enter` just before a test cell runs and
:func:`leave` just after (silent requests, through a module attribute: no name is bound in the
learner's namespace to reach them). In between, the cell runs in a *copy* of the learner's
namespace: it sees every name the learner defined, its own bindings go to the copy, and the
learner's functions keep looking up their globals in the learner's namespace, unchanged.

After the cell, the names it bound that the learner's namespace does not hold are copied back (a
later cell may rely on an import a test cell made, as it does in Jupyter); a name the learner
holds is never replaced. Outside IPython (no shell) both are no-ops.
"""

from __future__ import annotations

import sys
import types

_saved: tuple | None = None
"""(the learner's module, its namespace) while a test cell runs in its copy; None otherwise."""


def _shell():
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None


def enter() -> None:
    """Run the next cell in a copy of the learner's namespace (no-op when one is entered)."""
    global _saved
    shell = _shell()
    if shell is None or _saved is not None:
        return
    module, namespace = shell.user_module, shell.user_ns
    copy = types.ModuleType(module.__name__)
    copy.__dict__.update(namespace)
    _saved = (module, namespace)
    shell.user_module, shell.user_ns = copy, copy.__dict__


def leave() -> None:
    """Back to the learner's namespace; names the cell added that it lacks are copied over."""
    global _saved
    shell = _shell()
    if shell is None or _saved is None:
        return
    module, namespace = _saved
    cell = shell.user_ns
    _saved = None
    shell.user_module, shell.user_ns = module, namespace
    if cell is not namespace:
        for name, value in cell.items():
            if name not in namespace:
                namespace[name] = value
