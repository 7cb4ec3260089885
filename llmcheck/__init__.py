"""llmcheck: the exercises' kernel-side harness (what a graded test cell imports).

- :mod:`llmcheck.record`: the record format, torch-free; the trusted grader
  (``course.grading.verdicts``) imports it too, so both sides speak one format.
- :mod:`llmcheck.recorder`: :class:`~llmcheck.recorder.OpRecorder`, a TorchDispatchMode that sees
  every aten op a computation reaches, and the policies a test may set (allowed op families,
  refused llmcore functions, NumPy, autograd).
- :mod:`llmcheck.cases`: :class:`~llmcheck.cases.Test`, one test cell's cases, each run under the
  recorder and published as a record.

``llmcore`` never imports this package, and no chapter uses it: it exists for the exercises. This
module imports nothing, so importing ``llmcheck.record`` does not import torch.
"""
