"""Submissions the grader must score right: wrong answers and broken notebooks, as test data.

Each submission starts from a released notebook (exercises/), either untouched or with every
answer cell filled from solutions/ (``answered``), and then applies cell-level edits, keyed by the
cell's nbgrader grade_id. Each states the score it must get and exactly which test cells fail
(every other test cell must pass); tests/test_grading.py submits them all under one class and
grades them in one run, next to the solutions and the untouched releases. The wrong submissions
of exercises 5-8 live beside this file, one module per assignment (mutants_<notebook>.py, each a
list WRONG of these Submissions).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Replace:
    """Replace ``old`` (which must occur exactly once) with ``new`` in the cell's source."""
    old: str
    new: str


@dataclass(frozen=True)
class Source:
    """Set the cell's whole source."""
    text: str


@dataclass(frozen=True)
class Prepend:
    """Put code before the cell's source."""
    text: str


@dataclass(frozen=True)
class Delete:
    """Remove the cell from the notebook."""


@dataclass(frozen=True)
class Duplicate:
    """Keep the cell and put a copy after it, nbgrader metadata (its grade_id) included, as
    JupyterLab's copy and paste does; ``text`` replaces the copy's source when given."""
    text: str | None = None


@dataclass(frozen=True)
class Submission:
    student: str
    assignment: str                 # its notebook is ASSIGNMENTS[assignment] + ".ipynb"
    why: str
    score: float
    failing: frozenset[str]
    edits: dict = field(default_factory=dict)
    answered: bool = True
    stops_grader: bool = False      # the kernel dies: nbgrader cannot finish, the grade is 0


ASSIGNMENTS = {"01_matmul": "matmul", "02_attention": "attention", "03_multihead": "multihead",
               "04_kv_cache": "kv_cache", "05_batching": "batching",
               "06_paged_cache": "paged_cache", "07_tiled_attention": "tiled_attention",
               "08_backward": "backward", "09_sampling": "sampling",
               "10_quantization": "quantization", "11_lora": "lora",
               "12_speculative": "speculative", "13_expert_dispatch": "expert_dispatch"}
"""Assignment folder -> its notebook's name (without .ipynb)."""
MATMUL, ATTENTION, MULTIHEAD, KV_CACHE, *_ = ASSIGNMENTS       # 5-8: mutants_<notebook>.py


WRONG = [
    Submission(
        "wrong_loop_bound", MATMUL,
        "matmul's column loop runs to a's column count k instead of b's m: right only when k == m, "
        "so every square test passes",
        score=9, failing=frozenset({"test_matmul_hidden"}),
        edits={"matmul": Replace("for j in range(m):", "for j in range(a.shape[1]):")}),
    Submission(
        "row_by_row", MATMUL,
        "project multiplies one token row at a time: the right numbers, but n products instead of one",
        score=10, failing=frozenset({"test_project_hidden"}),
        edits={"project": Replace(
            "q = x @ w ",
            "q = torch.stack([row @ w for row in x.reshape(-1, x.shape[-1])]).reshape("
            "*x.shape[:-1], w.shape[1]) ")}),
    Submission(
        "library_matmul", MATMUL,
        "matmul calls @ (the library's product) instead of looping",
        score=7, failing=frozenset({"test_matmul", "test_matmul_hidden"}),
        edits={"matmul": Replace("n, m = a.shape[0], b.shape[1]", "return a @ b")}),
    Submission(
        "no_max_shift", ATTENTION,
        "softmax without subtracting the row maximum: exp overflows on large logits (and 0/0 on a "
        "fully masked row), which also breaks attention with large scores",
        score=7, failing=frozenset({"test_softmax_large_hidden", "test_softmax_masked_hidden",
                                    "test_attention_hidden"}),
        edits={"softmax_rows": Source('''
def softmax_rows(x):
    exps = torch.exp(x)
    return exps / exps.sum(dim=-1, keepdim=True)
''')}),
    Submission(
        "library_softmax", ATTENTION,
        "softmax_rows calls torch.softmax",
        score=8, failing=frozenset({"test_softmax", "test_softmax_large_hidden",
                                    "test_softmax_masked_hidden"}),
        edits={"softmax_rows": Replace("top = x.amax(dim=-1, keepdim=True) ",
                                       "return torch.softmax(x, dim=-1) ")}),
    Submission(
        "mask_off_by_one", ATTENTION,
        "the causal mask uses < instead of <=: a query may not see itself, so query 0 sees nothing",
        score=5, failing=frozenset({"test_causal_mask", "test_causal_mask_hidden", "test_attention",
                                    "test_attention_hidden"}),
        edits={"causal_mask": Replace("cols <= rows + (m - n)", "cols < rows + (m - n)")}),
    Submission(
        "mask_top_left", ATTENTION,
        "the causal mask is aligned to the top-left corner (j <= i): right only when n == m",
        score=7, failing=frozenset({"test_causal_mask", "test_causal_mask_hidden",
                                    "test_attention_hidden"}),
        edits={"causal_mask": Replace("cols <= rows + (m - n)", "cols <= rows")}),
    Submission(
        "heads_wrong_axis", MULTIHEAD,
        "split_heads cuts the token axis instead of the feature axis (a view with no transpose), "
        "which also spoils qkv_projection and multi-head attention built on it",
        score=3, failing=frozenset({"test_split_heads", "test_split_heads_hidden",
                                    "test_qkv_projection", "test_qkv_projection_hidden",
                                    "test_multihead_attention", "test_multihead_attention_hidden"}),
        edits={"split_heads": Replace("x.view(*lead, n, n_heads, d // n_heads).transpose(-3, -2)",
                                      "x.view(*lead, n_heads, n, d // n_heads)")}),
    Submission(
        "three_products", MULTIHEAD,
        "qkv_projection does three products with slices of w_qkv instead of one",
        score=12, failing=frozenset({"test_qkv_projection_hidden"}),
        edits={"qkv_projection": Replace(
            "qkv = x @ w_qkv ",
            "d = x.shape[-1]\n    qkv = torch.cat([x @ w_qkv[:, :d], x @ w_qkv[:, d:2 * d], "
            "x @ w_qkv[:, 2 * d:]], dim=-1) ")}),
    Submission(
        "forgets_append", KV_CACHE,
        "append returns the new rows but never stores them: every step attends to itself alone",
        score=0, failing=frozenset({"test_cache", "test_cache_hidden", "test_decode_step",
                                    "test_decode_step_hidden", "test_generate_cached",
                                    "test_generate_cached_hidden"}),
        edits={"layer_cache": Replace("self.keys = torch.cat([self.keys, k], dim=1)\n"
                                      "        self.values = torch.cat([self.values, v], dim=1)\n"
                                      "        return self.keys, self.values",
                                      "return k, v")}),
    Submission(
        "recomputes_kv", KV_CACHE,
        "generation starts from fresh caches at every step and runs the whole sequence again: the "
        "right tokens, but every old K and V is recomputed",
        score=10, failing=frozenset({"test_generate_cached_hidden"}),
        edits={"generate_cached": Source('''
def generate_cached(model, prompt, max_new_tokens):
    tokens = list(prompt)
    for step in range(max_new_tokens):
        caches = [LayerCache(model.config.n_heads, model.config.d_head, dtype=model.dtype)
                  for _ in model.blocks]
        for position, token in enumerate(tokens):
            logits = model_step(model, token, position, caches)
        tokens.append(int(logits.argmax()))
    return tokens
''')}),
]


BROKEN = [
    Submission(
        "raises", ATTENTION,
        "the softmax cell raises (a name that does not exist), so softmax_rows is never defined and "
        "attention, which uses it, fails too",
        score=3, failing=frozenset({"test_softmax", "test_softmax_large_hidden",
                                    "test_softmax_masked_hidden", "test_attention",
                                    "test_attention_hidden"}),
        edits={"softmax_rows": Prepend("stable = make_stable(softmax)\n")}),
    Submission(
        "loops_forever", MATMUL,
        "a cell that never finishes before project is defined: interrupted at the cell timeout",
        score=9, failing=frozenset({"test_project", "test_project_hidden"}),
        edits={"project": Prepend("while True:\n    pass\n")}),
    Submission(
        "allocates", MULTIHEAD,
        "merge_heads keeps allocating until memory runs out: MemoryError at the kernel's limit, "
        "not a dead machine",
        score=8, failing=frozenset({"test_merge_heads", "test_merge_heads_hidden",
                                    "test_multihead_attention", "test_multihead_attention_hidden"}),
        edits={"merge_heads": Replace(
            "*lead, h, n, d_head = x.shape",
            "hoard = []\n    while True:\n        hoard.append(torch.ones(2**24))")}),
    Submission(
        "prints", ATTENTION,
        "only softmax answered, but it prints megabytes (once when defined, 200 kB at every call); "
        "the output is cut short and the softmax points still count",
        score=5, failing=frozenset({"test_causal_mask", "test_causal_mask_hidden", "test_attention",
                                    "test_attention_hidden"}),
        answered=False,
        edits={"softmax_rows": Source('''
for line in range(5):
    print(line, "x" * 1_000_000)

def softmax_rows(x):
    print("debug", "y" * 200_000)
    top = x.amax(dim=-1, keepdim=True)
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    exps = torch.exp(x - top)
    total = exps.sum(dim=-1, keepdim=True)
    return exps / torch.where(total == 0, torch.ones_like(total), total)
''')}),
    Submission(
        "tampered", MATMUL,
        "no answers, but the test cells were emptied to 'pass' and one was deleted: grading puts "
        "the original tests back",
        score=0, failing=frozenset({"test_dot", "test_dot_hidden", "test_matmul",
                                    "test_matmul_error", "test_matmul_hidden", "test_project",
                                    "test_project_hidden"}),
        answered=False,
        edits={"test_dot": Source("pass"), "test_dot_hidden": Source("pass"),
               "test_matmul": Source("pass"), "test_matmul_error": Source("assert True"),
               "test_matmul_hidden": Source("pass"), "test_project": Delete()}),
    Submission(
        "kernel_dies", KV_CACHE,
        "the notebook kills its own kernel half-way: nbgrader cannot finish it, the grade is 0 and "
        "the run goes on",
        score=0, failing=frozenset({"test_cache", "test_cache_hidden", "test_decode_step",
                                    "test_decode_step_hidden", "test_generate_cached",
                                    "test_generate_cached_hidden"}),
        stops_grader=True,
        edits={"generate_cached": Prepend("import os\nos._exit(1)\n")}),
]
