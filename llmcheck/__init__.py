"""llmcheck: the exercises' kernel-side harness (what a graded test cell imports).

- :mod:`llmcheck.record`: the record format, torch-free; the trusted grader
  (``course.grading.verdicts``) imports it too, so both sides speak one format.
- :mod:`llmcheck.tree`: the one walk over nested tensors (arguments, results, models).
- :mod:`llmcheck.families`, :mod:`llmcheck.policy`, :mod:`llmcheck.policies`,
  :mod:`llmcheck.blocking`: op families and the table of the library's shortcuts, a policy and
  its refusals, the exercises' policies, NumPy and llmcore functions swapped out.
- :mod:`llmcheck.recorder`: :class:`~llmcheck.recorder.OpRecorder`, a TorchDispatchMode that sees
  every aten op a computation reaches; it re-exports the policies a test may set.
- :mod:`llmcheck.cases`: :class:`~llmcheck.cases.Test`, one test cell's cases, each run under the
  recorder and published as a record; :mod:`llmcheck.fresh`, the twin on fresh inputs;
  :mod:`llmcheck.integrity`, the harness's state the grader asks for; :mod:`llmcheck.scope`, a
  test cell's own copy of the learner's namespace.

``llmcore`` never imports this package, and no chapter uses it: it exists for the exercises. This
module imports nothing, so importing ``llmcheck.record`` does not import torch; importing the
recorder imports no llmcore module.
"""
