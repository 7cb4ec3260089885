"""The grade run's secret: fresh inputs for every test case that nobody could know in advance.

The trusted grader draws one secret per grade run (:func:`run_secret`; ``course-grade`` hands it
to its workers in ``$COURSE_GRADE_SECRET``; plain ``nbgrader autograde`` draws one per process)
and gives each test cell's kernel, just before that cell runs, only the cell's own token
(:func:`cell_token`, an HMAC of the secret and the cell's grade_id). The kernel side
(llmcheck/fresh.py) draws each case's twin inputs from it; the instructor's solution is run with
the same secret, so its twin records are the expected answers. Kernels never see the secret
itself, and the learner's check (no autograde) has none.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import secrets

SECRET_ENV = "COURSE_GRADE_SECRET"


@functools.cache
def _drawn() -> str:
    return secrets.token_hex(32)


def run_secret() -> str:
    """This grade run's secret (hex): ``$COURSE_GRADE_SECRET`` when a grader set it, else one
    drawn for this process."""
    return os.environ.get(SECRET_ENV) or _drawn()


def cell_token(secret: str, grade_id: str) -> str:
    """The token one test cell's kernel gets (hex): it reveals nothing of other cells' tokens."""
    return hmac.new(bytes.fromhex(secret), grade_id.encode(), hashlib.sha256).hexdigest()


def fingerprint(secret: str) -> str:
    """A short public name of a secret (what the solution records' cache is keyed by)."""
    return hashlib.sha256(b"fingerprint:" + bytes.fromhex(secret)).hexdigest()[:12]
