"""Execution limits for a notebook: its kernel in the sandbox, preloaded modules, output per cell.

The executor itself is :class:`course.grading.plugins.BoundedExecute` (nbgrader's Execute with
these limits); :func:`bounded_execute` hands it over without importing nbgrader before a
notebook runs. The learner's check and the instructor's grade both run notebooks with it, and
``nbgrader_config.py`` names it (``course.grading.plugins.BoundedExecute``) so that plain
``nbgrader autograde`` uses it too. Its kernels are started by
:class:`course.grading.sandbox.SandboxedKernelManager` (sandbox, memory cap, wall clock per
notebook). Nothing here or there imports ``resource`` at module level: the
learner's check imports these modules on any OS, and where there is no ``resource`` (Windows) the
kernel runs without a memory limit and a warning says so.
"""

from __future__ import annotations


HARNESS_METADATA = "harness_changes"
"""Test-cell metadata the executor writes: what of the harness changed while the cell ran
(llmcheck/integrity.py), evidence for review."""
HARNESS_CHANGES = "__import__('llmcheck.integrity', fromlist=['changes']).changes()"


def bounded_execute() -> type:
    """nbgrader's Execute with the course's limits, :class:`course.grading.plugins.BoundedExecute`
    (imported when a notebook is to be run, so that importing course.grading imports no
    nbgrader)."""
    from .executor import BoundedExecute
    return BoundedExecute


def output_size(out) -> int:
    """Characters of one output (stream text, error message and traceback, or data)."""
    if out.output_type == "stream":
        return len(out.text)
    if out.output_type == "error":
        return len(out.evalue) + sum(len(line) for line in out.traceback)
    data = out.get("data", {})
    return sum(len(v) if isinstance(v, str) else len(str(v)) for v in data.values())

