"""Submissions that try to earn points they have not earned, as test data (issue 13).

Same form as tests/grading/mutants.py (a released notebook, answered or not, then cell edits by
grade_id). Each cheat states the score it must get, which test cells fail, the score its honest
work would earn (``honest``: the same answers without the cheat) and, for some cells, a phrase the
grader's reason must contain, which says what caught it: "tampering detected: your code uses"
(the grader's screen of the learner's own cells), "did not run"/"none of its records" (a test that
made no records), "check was switched off" (a canary), "was used" (the op recorder's refusal),
"differ" (the trusted comparison), "FLOPs" (the work counter).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mutants import ATTENTION, KV_CACHE, MATMUL, Prepend, Replace, Source

ALL = {
    MATMUL: frozenset({"test_dot", "test_dot_hidden", "test_matmul", "test_matmul_error",
                       "test_matmul_hidden", "test_project", "test_project_hidden"}),
    ATTENTION: frozenset({"test_softmax", "test_softmax_large_hidden",
                          "test_softmax_masked_hidden", "test_causal_mask",
                          "test_causal_mask_hidden", "test_attention", "test_attention_hidden"}),
}
DOT_AND_MATMUL = frozenset({"test_dot", "test_dot_hidden", "test_matmul", "test_matmul_hidden"})
MATMUL_CELLS = frozenset({"test_matmul", "test_matmul_hidden"})


@dataclass(frozen=True)
class Cheat:
    student: str
    assignment: str
    why: str
    score: float
    failing: frozenset[str]
    honest: float                   # what the same answers earn without the cheat
    edits: dict = field(default_factory=dict)
    answered: bool = True
    reasons: dict = field(default_factory=dict)    # grade_id -> phrase its verdict reason holds
    stops_grader: bool = False


LIBRARY_MATMUL = "n, m = a.shape[0], b.shape[1]"     # the line after matmul's shape check

CHEATS = [
    # ---- patching the checks -------------------------------------------------------------------
    Cheat("patches_asserts", ATTENTION,
          "softmax without the max shift (honest: 7 points), plus assert_close, np.testing, "
          "numpy.isclose and torch.allclose patched to always pass",
          score=0, failing=ALL[ATTENTION], honest=7,
          reasons={"test_softmax_large_hidden": "differ",
                   "test_softmax": "tampering detected: your code uses"},
          edits={"softmax_rows": Source('''
import numpy
import numpy.testing
import torch.testing
import llmcore.testing

llmcore.testing.assert_close = lambda *args, **kwargs: None
torch.testing.assert_close = lambda *args, **kwargs: None
numpy.testing.assert_allclose = lambda *args, **kwargs: None
numpy.isclose = lambda a, b, **kwargs: numpy.ones(numpy.shape(a), dtype=bool)
torch.allclose = lambda *args, **kwargs: True

def softmax_rows(x):
    exps = torch.exp(x)
    return exps / exps.sum(dim=-1, keepdim=True)
''')}),
    Cheat("patches_isinstance", MATMUL,
          "no answers (honest: 0); builtins.isinstance patched to always say yes (the kernel's own "
          "machinery breaks: the notebook cannot be run to the end, graded 0)",
          score=0, failing=ALL[MATMUL], honest=0, answered=False, stops_grader=True,
          edits={"dot": Prepend("import builtins\nbuiltins.isinstance = lambda *args: True\n")}),
    Cheat("swallows_errors", MATMUL,
          "no answers (honest: 0); IPython's showtraceback silenced so failing tests show no error "
          "(plain nbgrader would give full marks)",
          score=0, failing=ALL[MATMUL], honest=0, answered=False,
          reasons={"test_dot": "raised NotImplementedError"},
          edits={"dot": Prepend("get_ipython().showtraceback = lambda *args, **kwargs: None\n")}),
    Cheat("input_transformer", MATMUL,
          "no answers (honest: 0); an IPython input transformer rewrites every test cell to `pass`",
          score=0, failing=ALL[MATMUL], honest=0, answered=False,
          reasons={"test_dot": "none of its"},
          edits={"dot": Prepend(
              "def _quiet(lines):\n"
              "    return ['pass\\n'] if any('Test(' in line for line in lines) else lines\n"
              "get_ipython().input_transformers_cleanup.append(_quiet)\n")}),
    Cheat("pre_run_hook", MATMUL,
          "matmul by @ (honest: 7); a pre_run_cell hook swaps the harness's Test.call for a plain "
          "call before every cell, so no op is recorded",
          score=0, failing=ALL[MATMUL], honest=7,
          edits={"matmul": Replace(LIBRARY_MATMUL, "return a @ b"),
                 "dot": Prepend(
                     "import llmcheck.cases\n"
                     "def _plain(self, fn, *args, case, inputs=(), kwargs=None, **options):\n"
                     "    return fn(*args, **{k: v for k, v in options.items()\n"
                     "                        if k not in llmcheck.cases.OPTIONS})\n"
                     "def _hook(info):\n"
                     "    llmcheck.cases.Test.call = _plain\n"
                     "get_ipython().events.register('pre_run_cell', _hook)\n")},
          reasons={"test_dot": "none of its"}),
    Cheat("edits_test_policy", MATMUL,
          "matmul by @ (honest: 7) and the visible and hidden matmul tests edited to forbid "
          "nothing: grading restores the instructor's test cells",
          score=7, failing=MATMUL_CELLS, honest=7,
          edits={"matmul": Replace(LIBRARY_MATMUL, "return a @ b"),
                 "test_matmul": Replace("forbid=PRODUCTS, ", ""),
                 "test_matmul_hidden": Source("pass")},
          reasons={"test_matmul": "was used"}),
    Cheat("forges_records", MATMUL,
          "matmul by @ (honest: 7); Test.call replaced by one that computes outside the recorder and "
          "publishes a clean record by hand (right outputs, no ops, every canary true)",
          score=0, failing=ALL[MATMUL], honest=7,
          edits={"matmul": Replace(LIBRARY_MATMUL, "return a @ b"),
                 "dot": Prepend('''
from IPython.display import display
from llmcheck import cases

def _forged(self, fn, *args, case, inputs=(), kwargs=None, **options):
    result = fn(*args)
    options.setdefault("rtol", 1e-5)
    options.setdefault("atol", 1e-6)
    record = {"version": 1, "cell": self.cell, "case": case, "index": len(self.cases),
              "inputs": exercise.digest(args, kwargs or {}, inputs),
              "output": exercise.encode(result), "ops": {}, "products": 0, "flops": 0,
              "views": [], "violations": [],
              "canaries": {"recorder": True, "forbid": True, "numpy": True},
              "options": options, "policy": self.policy.describe()}
    self.cases.append(case)
    display({exercise.RECORD_MIME: record, "text/plain": "forged"}, raw=True)
    return result

exercise.Test.call = _forged
''')},
          reasons={"test_matmul": "tampering detected: your code uses"}),
    Cheat("patches_recorder", MATMUL,
          "matmul by @ (honest: 7); the op recorder's dispatch hook patched to let every op through "
          "unrecorded",
          score=0, failing=ALL[MATMUL], honest=7,
          edits={"matmul": Replace(LIBRARY_MATMUL, "return a @ b"),
                 "dot": Prepend(
                     "import llmcheck.recorder\n"
                     "llmcheck.recorder.OpRecorder.__torch_dispatch__ = (\n"
                     "    lambda self, func, types, args=(), kwargs=None: func(*args, **(kwargs or {})))\n")},
          reasons={"test_dot": "switched off"}),

    Cheat("pops_recorder", MATMUL,
          "matmul by @ (honest: 7) with the op recorder popped off torch's dispatch-mode stack for "
          "the product and pushed back after it: nothing recorded and every canary still passes, "
          "but the result comes from no op the recorder saw (and the screen sees torch._C)",
          score=0, failing=ALL[MATMUL], honest=7,
          edits={"matmul": Replace(
              LIBRARY_MATMUL,
              "mode = torch._C._pop_torch_dispatch_stack(None)\n"
              "    try:\n"
              "        return a @ b\n"
              "    finally:\n"
              "        torch._C._push_on_torch_dispatch_stack(mode)")},
          reasons={"test_matmul": "not computed by operations the test could see",
                   "test_dot": "tampering detected: your code uses a library's private part"}),

    # ---- forbidden ops by another path (no tampering code: the op recorder alone) -------------------
    Cheat("alias_matmul", MATMUL, "matmul through an alias of torch.matmul (honest: 7)",
          score=7, failing=MATMUL_CELLS, honest=7,
          edits={"matmul": Replace(LIBRARY_MATMUL, "product = torch.matmul\n    return product(a, b)")},
          reasons={"test_matmul": "was used"}),
    Cheat("aten_mm", MATMUL, "matmul by torch.ops.aten.mm (honest: 7)",
          score=7, failing=MATMUL_CELLS, honest=7,
          edits={"matmul": Replace(LIBRARY_MATMUL, "return torch.ops.aten.mm(a, b)")},
          reasons={"test_matmul_hidden": "aten.mm"}),
    Cheat("thread_matmul", MATMUL,
          "matmul by @ run in a thread of its own (the recorder watches the test's thread), "
          "returned as a clone made on the test's thread (honest: 7)",
          score=0, failing=ALL[MATMUL], honest=7,
          reasons={"test_matmul": "tampering detected: your code uses"},
          edits={"matmul": Replace(
              LIBRARY_MATMUL,
              "import threading\n"
              "    box = []\n"
              "    worker = threading.Thread(target=lambda: box.append(a @ b))\n"
              "    worker.start()\n"
              "    worker.join()\n"
              "    return box[0].clone()")}),
    Cheat("linalg_matmul", MATMUL, "matmul by torch.linalg.matmul (honest: 7)",
          score=7, failing=MATMUL_CELLS, honest=7,
          edits={"matmul": Replace(LIBRARY_MATMUL, "return torch.linalg.matmul(a, b)")}),
    Cheat("einsum_matmul", MATMUL, "matmul by torch.einsum (honest: 7)",
          score=7, failing=MATMUL_CELLS, honest=7,
          edits={"matmul": Replace(LIBRARY_MATMUL, "return torch.einsum('ik,kj->ij', a, b)")}),
    Cheat("vecdot_dot", MATMUL,
          "dot by torch.linalg.vecdot, which matmul (calling dot) inherits (honest: 4)",
          score=4, failing=DOT_AND_MATMUL, honest=4,
          edits={"dot": Source("def dot(a, b):\n    return torch.linalg.vecdot(a, b)\n")},
          reasons={"test_dot": "vdot"}),
    Cheat("numpy_dot", MATMUL,
          "dot computed by numpy.dot on the tensors' arrays, converted back with torch.from_numpy "
          "(honest: 4)",
          score=4, failing=DOT_AND_MATMUL, honest=4,
          edits={"dot": Source("import numpy as np\n\ndef dot(a, b):\n"
                               "    return torch.from_numpy(np.asarray(np.dot(a.numpy(), b.numpy())))\n")},
          reasons={"test_dot": "NumPy"}),
    Cheat("numpy_lists", MATMUL,
          "matmul computed by NumPy on Python lists (tolist), converted back with torch.tensor "
          "(honest: 7)",
          score=7, failing=MATMUL_CELLS, honest=7,
          edits={"matmul": Replace(
              LIBRARY_MATMUL,
              "import numpy as np\n"
              "    return torch.tensor(np.array(a.tolist()) @ np.array(b.tolist()), dtype=a.dtype)")},
          reasons={"test_matmul": "numpy's array"}),
    Cheat("reference_softmax", ATTENTION,
          "softmax_rows by llmcore.reference.softmax (NumPy) on the tensor's list; attention, which "
          "calls it, reaches NumPy too (honest, with torch.softmax: 8)",
          score=3, failing=frozenset({"test_softmax", "test_softmax_large_hidden",
                                      "test_softmax_masked_hidden", "test_attention",
                                      "test_attention_hidden"}), honest=8,
          edits={"softmax_rows": Source(
              "import numpy as np\nimport llmcore.reference\n\ndef softmax_rows(x):\n"
              "    return torch.tensor(llmcore.reference.softmax(np.array(x.tolist())), "
              "dtype=x.dtype)\n")}),
    Cheat("fused_attention", ATTENTION,
          "attention by F.scaled_dot_product_attention with an explicit mask (honest: 8)",
          score=8, failing=frozenset({"test_attention", "test_attention_hidden"}), honest=8,
          edits={"attention": Source('''
import torch.nn.functional as F

def attention(q, k, v, causal=False):
    mask = causal_mask(q.shape[-2], k.shape[-2]) if causal else None
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
''')},
          reasons={"test_attention": "was used"}),

    # ---- the KV cache's work counter ---------------------------------------------------------
    Cheat("copies_model", KV_CACHE,
          "generation recomputes every old K and V (honest: 10), on a deep copy of the model and "
          "fresh caches each step, so counters hooked to the model's own weights see nothing",
          score=10, failing=frozenset({"test_generate_cached_hidden"}), honest=10,
          edits={"generate_cached": Source('''
import copy

def generate_cached(model, prompt, max_new_tokens):
    tokens = list(prompt)
    for step in range(max_new_tokens):
        twin = copy.deepcopy(model)
        caches = [LayerCache(twin.config.n_heads, twin.config.d_head, dtype=twin.dtype)
                  for _ in twin.blocks]
        for position, token in enumerate(tokens):
            logits = model_step(twin, token, position, caches)
        tokens.append(int(logits.argmax()))
    return tokens
''')},
          reasons={"test_generate_cached_hidden": "FLOPs"}),
]
