"""The record a test case publishes, as both sides read it: imports neither torch nor NumPy.

The learner's kernel (:mod:`llmcheck.cases`) writes one record per case as a ``display_data``
output of MIME type :data:`RECORD_MIME`; the trusted grader (``course.grading.verdicts``) reads it
from the executed notebook and judges it against the instructor's. The fields are described in
course/grading/VERDICTS.md, section 2.
"""

from __future__ import annotations

import json

RECORD_MIME = "application/vnd.llmcore.record+json"
RECORD_VERSION = 2
OPTIONS = ("rtol", "atol", "view_of", "max_products", "max_flops_ratio", "max_elements",
           "max_live_elements", "max_ops_ratio")
"""The options a case may set (judged from the solution's record, never the learner's)."""

TWIN_SUFFIX = " [fresh inputs]"
"""What the record of a case's twin (the same case on fresh inputs, llmcheck/fresh.py) adds to
its case's name."""

SECRET_PROMPT = "llmcheck: this test cell's secret"
"""The prompt of the kernel's one request for its test cell's secret (llmcheck/fresh.py): the
grader's executor answers the first request of a test cell with this prompt, and only the first
(course/grading/executor.py)."""

MAX_RECORDS_PER_CELL = 64
MAX_RECORD_CHARS = 200_000
"""What the grader's executor keeps of a cell's records (more, or larger, are dropped)."""


def too_large(elements: int, shape, op: str, limit: int) -> str:
    """The sentence for a call whose tensors held more than ``limit`` elements in one storage
    (said in the kernel, for feedback, and by the grader, which decides)."""
    return (f"it held a {tuple(shape)} tensor ({elements} elements in one storage, made or grown "
            f"by {op}) where no tensor of more than {limit} elements is expected: hold one tile "
            "at a time, never the whole matrix")


def too_much_live(elements: int, op: str, limit: int) -> str:
    """The sentence for a call whose tensors held more than ``limit`` elements at once, in any
    number of storages (said in the kernel, for feedback, and by the grader, which decides)."""
    return (f"its tensors held {elements} elements at once (the most, after {op}) where at most "
            f"{limit} are expected: keep one tile at a time and drop it before the next, never "
            "the whole matrix, not even in pieces")


def is_record_output(output: dict) -> bool:
    """Whether a notebook output (a dict as nbformat reads it) carries a record."""
    return output.get("output_type") == "display_data" and RECORD_MIME in output.get("data", {})


def records_of(outputs) -> list[dict]:
    """The records among a cell's outputs, in order (a malformed one as ``{"malformed": ...}``)."""
    found = []
    for out in outputs:
        if not is_record_output(out):
            continue
        record = out["data"][RECORD_MIME]
        if isinstance(record, str):
            try:
                record = json.loads(record)
            except ValueError:
                record = {"malformed": record[:100]}
        found.append(record if isinstance(record, dict) else {"malformed": str(record)[:100]})
    return found


AUDIT_MIME = "application/vnd.llmcore.audit+json"
"""MIME type of the kernel's audit reports (llmcheck/audit.py): the grader's executor takes each
one out of the output stream as it arrives (course/grading/executor.py), so nothing the kernel
does afterwards (a cleared output, an output widget) removes it."""
