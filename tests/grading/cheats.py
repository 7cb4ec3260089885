"""Submissions that try to earn points they have not earned, as test data (issue 13).

Same form as tests/grading/mutants.py (a released notebook, answered or not, then cell edits by
grade_id). Each cheat states the score it must get, which test cells fail, the score its honest
work would earn (``honest``: the same answers without the cheat) and, for some cells, a phrase the
grader's reason must contain, which says what caught it: "did not run"/"none of its records" (a
test that made no records, or no records for its fresh inputs), "check was switched off" (a
canary), "was used" (the op recorder's refusal), "differ" (the trusted comparison), "FLOPs" (the
work counter). In-process tampering that the records cannot reveal is marked for the
instructor's review (``review``: a phrase of the evidence), never zeroed for a pattern.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mutants import ATTENTION, KV_CACHE, MATMUL, Duplicate, Prepend, Replace, Source

PAGED = "06_paged_cache"

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
    review: str = ""                # a phrase of the review evidence (course/grading/review.py):
                                    # the run marks it for the instructor; only then may the
                                    # score exceed the honest work


LIBRARY_MATMUL = "n, m = a.shape[0], b.shape[1]"     # the line after matmul's shape check

CHEATS = [
    # ---- patching the checks -------------------------------------------------------------------
    Cheat("patches_asserts", ATTENTION,
          "softmax without the max shift (honest: 7 points), plus assert_close, np.testing, "
          "numpy.isclose and torch.allclose patched to always pass",
          score=7, failing=frozenset({"test_softmax_large_hidden", "test_softmax_masked_hidden",
                                      "test_attention_hidden"}), honest=7,
          reasons={"test_softmax_large_hidden": "differ"},
          review="replaces torch.allclose",
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
          score=1, failing=ALL[MATMUL] - {"test_matmul_error"}, honest=7,
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
          score=1, failing=ALL[MATMUL] - {"test_matmul_error"}, honest=7,
          edits={"matmul": Replace(LIBRARY_MATMUL, "return a @ b"),
                 "dot": Prepend('''
from IPython.display import display
from llmcheck import cases

def _forged(self, fn, *args, case, inputs=(), kwargs=None, **options):
    result = fn(*args)
    options.setdefault("rtol", 1e-5)
    options.setdefault("atol", 1e-6)
    record = {"version": cases.RECORD_VERSION, "cell": self.cell, "case": case,
              "index": len(self.cases), "inputs": cases.digest(args, kwargs or {}, inputs),
              "output": cases.encode(result), "ops": {}, "products": 0, "flops": 0,
              "views": [], "violations": [], "largest": {"elements": 0, "shape": [], "op": ""},
              "canaries": {"recorder": True, "forbid": True, "numpy": True},
              "options": options, "policy": self.policy.describe()}
    self.cases.append(case)
    display({cases.RECORD_MIME: record, "text/plain": "forged"}, raw=True)
    return result

cases.Test.call = _forged
''')},
          reasons={"test_matmul": "did not run"}, review="replaces cases.Test.call"),
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
          "but the result comes from no op the recorder saw (and torch._C is evidence for review)",
          score=7, failing=MATMUL_CELLS, honest=7,
          edits={"matmul": Replace(
              LIBRARY_MATMUL,
              "mode = torch._C._pop_torch_dispatch_stack(None)\n"
              "    try:\n"
              "        return a @ b\n"
              "    finally:\n"
              "        torch._C._push_on_torch_dispatch_stack(mode)")},
          reasons={"test_matmul": "without passing the op recorder"},
          review="private part (torch..._C)"),

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
          "returned as a clone made on the test's thread (honest: 7): the recorder cannot see "
          "another thread's ops, so it earns full marks, marked for review",
          score=12, failing=frozenset(), honest=7, review="imports threading",
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

    # ---- answers known in advance: the fresh inputs of grade time earn them nothing ----------
    Cheat("hardcodes_visible", MATMUL,
          "dot answers the visible test's inputs from a table and returns 0 otherwise (honest, "
          "returning 0 always: 4)",
          score=4, failing=DOT_AND_MATMUL, honest=4,
          edits={"dot": Source('''
KNOWN = {((1.0, 2.0, 3.0), (4.0, -5.0, 6.0)): 12.0}

def dot(a, b):
    """As in the visible test: the answer it expects."""
    key = (tuple(a.tolist()), tuple(b.tolist()))
    return torch.tensor(KNOWN.get(key, 0.0), dtype=a.dtype)
''')},
          reasons={"test_dot": "[fresh inputs]"}),
    Cheat("memoises_answers", MATMUL,
          "matmul answers every test input it could know in advance (the visible ones and the "
          "hidden ones, regenerated from the hidden tests' seeds as a leaked notebook would give "
          "them), computed with @ before the tests run, and returns zeros otherwise (honest, "
          "zeros always: 7)",
          score=7, failing=MATMUL_CELLS, honest=7,
          edits={"matmul": Source('''
import numpy as np
from llmcore.testing import randn

def _key(a, b):
    return (a.dtype, tuple(a.shape), tuple(b.shape), a.flatten().tolist(), b.flatten().tolist())

ANSWERS = {}
_a = torch.tensor([[1.0, 2.0], [3.0, 4.0]]); _b = torch.tensor([[5.0, 6.0], [7.0, 8.0]])
ANSWERS[str(_key(_a, _b))] = _a @ _b
_rng = np.random.default_rng(1)
_a, _b = randn(_rng, 3, 3), randn(_rng, 3, 3)
ANSWERS[str(_key(_a, _b))] = _a @ _b
_rng = np.random.default_rng(2)
for _n, _k, _m in [(5, 3, 7), (2, 6, 4), (1, 4, 1), (4, 1, 6), (7, 2, 3)]:
    _a, _b = randn(_rng, _n, _k, dtype=torch.float64), randn(_rng, _k, _m, dtype=torch.float64)
    ANSWERS[str(_key(_a, _b))] = _a @ _b

def matmul(a, b):
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul: a is {tuple(a.shape)} and b is {tuple(b.shape)}")
    known = ANSWERS.get(str(_key(a, b)))
    return known.clone() if known is not None else torch.zeros(a.shape[0], b.shape[1], dtype=a.dtype)
''')},
          reasons={"test_matmul_hidden": "[fresh inputs]"}),

    # ---- what the text forbids, enforced by what the recorder sees -----------------------------
    Cheat("calls_library_generate", KV_CACHE,
          "generate_cached hands the work to llmcore.generate with its own cache (honest: 8)",
          score=8, failing=frozenset({"test_generate_cached", "test_generate_cached_hidden"}),
          honest=8,
          edits={"generate_cached": Source('''
import llmcore

def generate_cached(model, prompt, max_new_tokens):
    ids = torch.tensor([list(prompt)])
    return llmcore.generate(model, ids, max_new_tokens, use_cache=True)[0].tolist()
''')},
          reasons={"test_generate_cached": "was used"}),
    Cheat("slices_blocks", PAGED,
          "gather copies the sequence's blocks one slice at a time into a tensor it made (no "
          "single-int index, no cat or stack): the loop the text forbids (honest: 18)",
          score=18, failing=frozenset({"test_gather", "test_gather_hidden"}), honest=18,
          edits={"gather": Source('''
def gather(store, seq_id):
    table = store.block_table(seq_id)
    m, p, d_head = store.length(seq_id), store.keys.shape[1], store.keys.shape[-1]
    keys = store.keys.new_zeros(len(table) * p, d_head)
    values = store.values.new_zeros(len(table) * p, d_head)
    for slot, block in enumerate(table):
        keys[slot * p:(slot + 1) * p] = store.keys[block:block + 1].reshape(p, d_head)
        values[slot * p:(slot + 1) * p] = store.values[block:block + 1].reshape(p, d_head)
    return keys[:m], values[:m]
''')},
          reasons={"test_gather_hidden": "tensor operations"}),
    Cheat("index_per_block", PAGED,
          "gather picks each block with index_select and a one-element index, then joins them by "
          "writing into a tensor it made: a loop over the table in other clothes (honest: 18)",
          score=18, failing=frozenset({"test_gather", "test_gather_hidden"}), honest=18,
          edits={"gather": Source('''
def gather(store, seq_id):
    table, m = store.block_table(seq_id), store.length(seq_id)
    p, d_head = store.keys.shape[1], store.keys.shape[-1]
    out = [store.keys.new_empty(len(table), p, d_head), store.values.new_empty(len(table), p, d_head)]
    for slot, block in enumerate(table):
        pick = torch.full((1,), block, dtype=torch.long)
        for pool, into in zip((store.keys, store.values), out):
            into[slot:slot + 1] = torch.index_select(pool, 0, pick)
    return out[0].reshape(-1, d_head)[:m], out[1].reshape(-1, d_head)[:m]
''')},
          reasons={"test_gather_hidden": "tensor operations"}),

    # ---- a copied cell: its grade_id repeats (nbgrader alone would stop with KeyError) ----------
    Cheat("copies_answer_cell", MATMUL,
          "an honest learner copied the dot cell to try a variant below it (the copy keeps the "
          "cell's grade_id); both definitions are right: full marks, the CSV says which was graded",
          score=12, failing=frozenset(), honest=12,
          edits={"dot": Duplicate('''
def dot(a, b):
    """Second try: the same sum, accumulated in a Python float first."""
    total = 0.0
    for i in range(a.shape[0]):
        total = total + a[i] * b[i]
    return torch.as_tensor(total, dtype=a.dtype) if not isinstance(total, torch.Tensor) else total
''')}),
    Cheat("copies_test_cell", MATMUL,
          "dot returns 0 (honest: 4) and the visible dot test is copied with its body replaced by "
          "`pass`: the first copy is the instructor's cell, graded; the other runs as ordinary code",
          score=4, failing=DOT_AND_MATMUL, honest=4,
          edits={"dot": Source("def dot(a, b):\n    return torch.zeros((), dtype=a.dtype)\n"),
                 "test_dot": Duplicate("pass")}),

    # ---- the harness reached in process: the records decide, or the run marks it for review ----
    Cheat("gc_empties_policy", MATMUL,
          "matmul by @ after emptying every live Policy object found through the garbage "
          "collector (honest: 7): the records show rules other than the test's",
          score=7, failing=MATMUL_CELLS, honest=7, review="imports gc",
          edits={"matmul": Replace(LIBRARY_MATMUL, '''import gc, dataclasses
    for obj in gc.get_objects():
        if type(obj).__name__ == "Policy" and dataclasses.is_dataclass(obj):
            for f in dataclasses.fields(obj):
                value = getattr(obj, f.name)
                if isinstance(value, (frozenset, tuple)):
                    object.__setattr__(obj, f.name, type(value)())
                elif isinstance(value, bool):
                    object.__setattr__(obj, f.name, False)
                elif value is not None and f.name == "allow":
                    object.__setattr__(obj, f.name, None)
    return a @ b''')}),
    Cheat("sys_modules_call", MATMUL,
          "Test.call reached through sys.modules by a name built from strings and replaced by one "
          "that computes the answer with @ outside the recorder and hands the harness a function "
          "returning a copy of it (honest: 7): every fresh-input twin gets the stale answer",
          score=1, failing=ALL[MATMUL] - {"test_matmul_error"}, honest=7,
          review="uses .modules",
          edits={"matmul": Replace(LIBRARY_MATMUL, "return a @ b"),
                 "dot": Prepend('''
import sys
_cases = sys.modules["llm" + "check" + ".cases"]
_real_call = _cases.Test.call

def _outside(self, fn, *args, case, **options):
    names = ("rtol", "atol", "view_of", "max_products", "max_flops_ratio", "max_elements",
             "max_ops_ratio", "inputs", "kwargs", "fresh_inputs")
    answer = fn(*args, **{k: v for k, v in options.items() if k not in names})
    return _real_call(self, lambda *a, **k: answer.clone(), *args, case=case, **options)

_cases.Test.call = _outside
''')},
          reasons={"test_matmul": "[fresh inputs]"}),
    Cheat("exec_hidden_patch", MATMUL,
          "base64 code run through exec fetched with attrgetter from __import__(\"built\" + "
          "\"ins\"): it patches the op recorder to let a product through unseen only when it "
          "comes from the learner's matmul (the canaries still pass), and matmul returns a clone "
          "of a @ b (honest: 7): the guard below the recorder sees the product pass it by, and "
          "the run marks it for review",
          score=7, failing=MATMUL_CELLS, honest=7, review="calls __import__()",
          reasons={"test_matmul": "without passing the op recorder"},
          edits={"dot": Prepend(
              "import base64, operator\n"
              "_code = base64.b64decode(" + repr(__import__("base64").b64encode(b'''
import sys
_rec = sys.modules["llmcheck.recorder"].OpRecorder
_orig = _rec.__torch_dispatch__
def _dispatch(self, func, types, args=(), kwargs=None):
    frame = sys._getframe(1)
    while frame is not None and func.overloadpacket.__name__ == "mm":
        if frame.f_code.co_name == "matmul":
            return func(*args, **(kwargs or {}))
        frame = frame.f_back
    return _orig(self, func, types, args, kwargs)
_rec.__torch_dispatch__ = _dispatch
''').decode()) + ").decode()\n"
              "operator.attrgetter(\"ex\" + \"ec\")(__import__(\"built\" + \"ins\"))(_code)\n"),
                 "matmul": Replace(LIBRARY_MATMUL, "return (a @ b).clone()")}),
    Cheat("ctypes_gemm", MATMUL,
          "matmul by BLAS's gemm called through ctypes on the tensors' memory, into a tensor "
          "made inside the call (honest: 7): no op multiplies, the run marks it for review",
          score=12, failing=frozenset(), honest=7, review="imports ctypes",
          edits={"matmul": Source('''
import ctypes, os, torch
_blas = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))

def matmul(a, b):
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul: a is {tuple(a.shape)} and b is {tuple(b.shape)}")
    n, k = a.shape
    m = b.shape[1]
    a, b = a.contiguous(), b.contiguous()
    out = torch.empty(n, m, dtype=a.dtype)
    gemm, real = ((_blas.dgemm_, ctypes.c_double) if a.dtype == torch.float64
                  else (_blas.sgemm_, ctypes.c_float))
    no, one, zero = ctypes.c_char(b"N"), real(1.0), real(0.0)
    sizes = [ctypes.c_int(v) for v in (m, n, k, m, k, m)]
    ref = ctypes.byref
    gemm(ref(no), ref(no), ref(sizes[0]), ref(sizes[1]), ref(sizes[2]), ref(one),
         ctypes.c_void_p(b.data_ptr()), ref(sizes[3]), ctypes.c_void_p(a.data_ptr()),
         ref(sizes[4]), ref(zero), ctypes.c_void_p(out.data_ptr()), ref(sizes[5]))
    return out
''')}),
    Cheat("disables_dispatch", MATMUL,
          "matmul by @ under torch._C._DisableTorchDispatch (the recorder never sees it), "
          "returned as a clone (honest: 7): the run marks it for review",
          score=12, failing=frozenset(), honest=7, review="private part (torch..._C)",
          edits={"matmul": Replace(LIBRARY_MATMUL, '''with torch._C._DisableTorchDispatch():
        product = a @ b
    return product.clone()''')}),
]
from cheats_ops import OP_CHEATS; CHEATS += OP_CHEATS  # noqa: E402,E702  (issue 20: allowlists, storage)
from cheats_evasion import EVASION_CHEATS; CHEATS += EVASION_CHEATS  # noqa: E402,E702  (issue 31: evasions)
