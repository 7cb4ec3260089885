"""Object identity without an audit event: :func:`identity`, for the harness's hot paths.

``id(x)`` raises the audit event ``builtins.id`` (PEP 578). In the grader's kernel an audit hook
is installed (:mod:`llmcheck.audit`), so every ``id()`` calls that Python function: about 0.3 us,
ten times the call itself. The harness keys objects by identity tens of thousands of times per
case (the NumPy stand-ins of :mod:`llmcheck.blocking`, the recorder's profile hook on every
Python call of the learner's function), which made a graded test cell several times slower in
the kernel than the same code outside it.

``object.__hash__`` is the default hash every object starts with: CPython computes it from the
object's address alone (rotated by four bits, a one-to-one map), runs no Python code (a class's
own ``__hash__`` is not consulted, and it works on unhashable objects too) and raises no audit
event. So, like ``id``, it is equal for the same object and different for two objects alive at
the same time; tests/test_llmcheck_identity.py checks both, and that it raises no event.
"""

from __future__ import annotations

identity = object.__hash__
"""identity(x) -> int: x's identity, as ``id(x)`` (unique among live objects), without the
``builtins.id`` audit event."""
