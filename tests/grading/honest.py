"""Honest submissions the grader must give full marks: correct answers written differently.

Same form as tests/grading/mutants.py: each starts from the released notebook with every answer
filled from solutions/, then rewrites answer cells (never a test or a given cell), keyed by
grade_id. Each is a correct answer that keeps every rule its exercise states (no product ops in
exercise 1's loops, no softmax op in exercise 2's softmax, no autograd in exercise 8, ...), written
the way learners do: other loop orders, while loops, helper functions and classes, comprehensions
then torch.stack, in-place updates, type hints, dataclasses, ``functools``/``itertools``. Some also
carry what an honest learner writes around the answer and the grader must not punish (issue 20,
"nothing an honest learner writes in ordinary Python costs a point"): debugging ``print`` and
``display``, an environment variable of its own process, ``warnings.warn`` and torch's own
UserWarnings, ``getattr``/``setattr``/``__class__``/``globals()`` on its own objects, words such as
"exercise" or "llmcheck" in strings, comments and docstrings. Every one must score the
assignment's full marks with no failing test cell; tests/test_grading_honest.py grades them all
in one run.
"""

from grading_mutants import Submission, Replace, Source, Prepend  # noqa: F401

MATMUL, ATTENTION, MULTIHEAD, KV_CACHE = "01_matmul", "02_attention", "03_multihead", "04_kv_cache"
BATCHING, PAGED, TILED, BACKWARD = ("05_batching", "06_paged_cache", "07_tiled_attention",
                                    "08_backward")
SAMPLING = "09_sampling"
QUANT = "10_quantization"
LORA = "11_lora"
SPECULATIVE, DISPATCH = "12_speculative", "13_expert_dispatch"

FULL_MARKS = {MATMUL: 12, ATTENTION: 13, MULTIHEAD: 14, KV_CACHE: 13, BATCHING: 15, PAGED: 22,
              TILED: 15, BACKWARD: 15, SAMPLING: 21, QUANT: 18, LORA: 15, SPECULATIVE: 16,
              DISPATCH: 14}
"""Each assignment's points (the sum over its solution notebook's test cells; the fast test checks
this)."""


def honest(student: str, assignment: str, why: str, edits: dict) -> Submission:
    """A correct answer: full marks, no failing test cell."""
    return Submission(student, assignment, why, score=FULL_MARKS[assignment],
                      failing=frozenset(), edits=edits)


# ------------------------------------------------------------------------------------------------
# Exercise 1: dot, matmul by loops, project with one product
# ------------------------------------------------------------------------------------------------

MATMUL_VARIANTS = [
    honest(
        "h01_column_major", MATMUL,
        "matmul fills the result column by column (j outer, i inner); dot is functools.reduce "
        "over a generator of products; the error message shows the shapes as lists [2, 3]; "
        "project calls torch.matmul and returns early without a bias",
        {"dot": Source(r'''
import functools
import operator


def dot(a, b):
    """Dot product of two vectors: the products of their entries, added up.

    a, b: (k,) -> ().
    """
    products = (a[i] * b[i] for i in range(a.shape[0]))
    return functools.reduce(operator.add, products)
'''),
         "matmul": Source(r'''
def matmul(a, b):
    """(n, k) times (k, m) -> (n, m), one column of the result at a time."""
    n, k = a.shape
    k_b, m = b.shape
    if k != k_b:
        raise ValueError(f"matmul: shapes {list(a.shape)} and {list(b.shape)} do not chain "
                         f"({k} columns against {k_b} rows)")
    out = torch.empty(n, m, dtype=a.dtype)
    for j in range(m):                  # every column of b ...
        column = b[:, j]
        for i in range(n):              # ... against every row of a
            out[i, j] = dot(a[i], column)
    return out
'''),
         "project": Source(r'''
def project(x, w, b=None):
    """x @ w (+ b) for every token at once."""
    if b is None:
        return torch.matmul(x, w)
    return torch.matmul(x, w) + b
''')}),
    honest(
        "h01_rank_one_updates", MATMUL,
        "matmul accumulates k rank-1 layers (k outer: column p of a times row p of b, broadcast "
        "and added in place); dot is a while loop with +=; the error message uses %-formatting; "
        "project is x.matmul(w) then torch.add",
        {"dot": Source(r'''
def dot(a, b):
    """Dot product with a while loop."""
    total = torch.zeros((), dtype=a.dtype)
    i = 0
    while i < len(a):
        total += a[i] * b[i]
        i += 1
    return total
'''),
         "matmul": Source(r'''
def matmul(a, b):
    """Sum over p of the outer product of column p of a and row p of b (elementwise only)."""
    if a.ndim != 2 or b.ndim != 2 or a.shape[-1] != b.shape[0]:
        raise ValueError("matmul: cannot multiply a %s by b %s: the inner sizes differ"
                         % (tuple(a.shape), tuple(b.shape)))
    n, k = a.shape
    m = b.shape[1]
    out = torch.zeros(n, m, dtype=a.dtype)
    for p in range(k):                                          # k outer
        out += a[:, p].unsqueeze(1) * b[p].unsqueeze(0)         # (n, 1) * (1, m) -> (n, m)
    return out
'''),
         "project": Source(r'''
def project(x, w, b=None):
    out = x.matmul(w)                   # one product for every token
    if b is None:
        return out
    return torch.add(out, b)
''')}),
    honest(
        "h01_broadcast_typed", MATMUL,
        "matmul broadcasts (n, k, 1) * (1, k, m) and sums over k (elementwise products, no "
        "product op); dot zips the two vectors; type hints with from __future__ import "
        "annotations; the error message shows torch.Size([2, 3]); project uses torch.tensordot",
        {"dot": Source(r'''
from __future__ import annotations

from torch import Tensor


def dot(a: Tensor, b: Tensor) -> Tensor:
    """Sum of a_i * b_i, walking both vectors together."""
    total: Tensor = a.new_zeros(())
    for a_i, b_i in zip(a, b):
        total = total + a_i * b_i
    return total
'''),
         "matmul": Source(r'''
from __future__ import annotations

from torch import Tensor


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """Every entry (i, j) at once: the products a[i, p] * b[p, j], added up over p."""
    if a.shape[-1] != b.shape[0]:
        raise ValueError(f"matmul: a is {a.shape} and b is {b.shape}; expected (n, k) and "
                         "(k, m) with the same k")
    # (n, k, 1) * (1, k, m) -> (n, k, m), then add up over k
    return (a.unsqueeze(-1) * b.unsqueeze(0)).sum(dim=1)
'''),
         "project": Source(r'''
from __future__ import annotations

from torch import Tensor


def project(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    out = torch.tensordot(x, w, dims=1)         # contracts x's last axis with w's first
    return out if b is None else out + b
''')}),
    honest(
        "h01_prints_and_displays", MATMUL,
        "debugging print(...) inside every function (f-strings, .item()) and display(...) of a "
        "small example at the end of every answer cell",
        {"dot": Source(r'''
def dot(a, b):
    """Dot product by a loop over the entries."""
    acc = torch.zeros((), dtype=a.dtype)
    for i in range(len(a)):
        acc = acc + a[i] * b[i]
    print(f"dot: {len(a)} terms, total {acc.item():.4f}")
    return acc


display(dot(torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])))
'''),
         "matmul": Source(r'''
def matmul(a, b):
    """Matrix product by loops."""
    rows, inner = a.shape
    if inner != b.shape[0]:
        raise ValueError(f"matmul: a is {tuple(a.shape)} and b is {tuple(b.shape)}; the inner "
                         f"sizes {inner} and {b.shape[0]} differ")
    cols = b.shape[1]
    print(f"matmul: ({rows}, {inner}) by ({inner}, {cols})")
    result = torch.zeros(rows, cols, dtype=a.dtype)
    for i in range(rows):
        for j in range(cols):
            result[i, j] = dot(a[i, :], b[:, j])
    return result


display(matmul(torch.eye(2), torch.tensor([[1.0, 2.0], [3.0, 4.0]])))
'''),
         "project": Source(r'''
def project(x, w, b=None):
    y = x @ w
    print("project:", tuple(x.shape), "->", tuple(y.shape))
    if b is not None:
        y = y + b
    return y


display(project(torch.ones(2, 3), torch.ones(3, 4)).shape)
''')}),
    honest(
        "h01_words_in_docstrings", MATMUL,
        "docstrings and messages that name the exercise, the llmcheck recorder and get_ipython; "
        "dot is Python's sum over a generator; matmul walks itertools.product(range(n), "
        "range(m)) and formats its error with str.format; project flattens the tokens to one "
        "(N, d_in) matrix and back",
        {"dot": Source(r'''
def dot(a, b):
    """Dot product, as exercise 1 asks: a loop, since the llmcheck recorder refuses torch.dot.

    (In a notebook get_ipython() exists, but nothing here needs it.)
    """
    return sum(a[i] * b[i] for i in range(a.shape[0]))
'''),
         "matmul": Source(r'''
import itertools


def matmul(a, b):
    """Matrix product by loops, as exercise 1 asks: the recorder refuses @ here.

    a: (n, k)   b: (k, m)   ->   (n, m).
    """
    if a.shape[1] != b.shape[0]:
        raise ValueError("matmul (exercise 1): a is {} and b is {}: the inner sizes differ"
                         .format(tuple(a.shape), tuple(b.shape)))
    n, m = a.shape[0], b.shape[1]
    out = torch.zeros(n, m, dtype=a.dtype)
    for i, j in itertools.product(range(n), range(m)):
        out[i, j] = dot(a[i], b[:, j])
    return out
'''),
         "project": Source(r'''
def project(x, w, b=None):
    """One product for every token, which the llmcheck recorder counts (the exercise says @)."""
    flat = x.reshape(-1, x.shape[-1])                             # (N, d_in): every token
    out = (flat @ w).reshape(*x.shape[:-1], w.shape[-1])          # (..., n, d_out)
    return out if b is None else out + b
''')}),
]

RESERVED_NAME_VARIANTS = [
    honest(
        "h01_helper_named_fresh", MATMUL,
        "a helper named _fresh (a new zero accumulator or result) that dot and matmul call while "
        "the tests run: the grader's executor once bound and deleted a name _fresh around every "
        "test cell (issue 31, item 4); it binds no name in the learner's namespace now",
        {"dot": Source(r'''
def _fresh(*shape, like):
    """A new tensor of zeros with like's dtype and device (the learner's own helper)."""
    return torch.zeros(shape, dtype=like.dtype, device=like.device)


def dot(a, b):
    total = _fresh(like=a)
    for i in range(a.shape[0]):
        total = total + a[i] * b[i]
    return total
'''),
         "matmul": Source(r'''
def matmul(a, b):
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul: a is {tuple(a.shape)} and b is {tuple(b.shape)}")
    out = _fresh(a.shape[0], b.shape[1], like=a)
    for i in range(a.shape[0]):
        for j in range(b.shape[1]):
            out[i, j] = dot(a[i], b[:, j])
    return out
''')}),
    honest(
        "h01_helper_named_token", MATMUL,
        "a helper named _token (it spells a shape for a message) that matmul's error calls, and a "
        "module-level _token_count that dot updates: names that look like the grader's secret",
        {"dot": Source(r'''
_token_count = {"dot": 0}


def _token(shape):
    """A shape as the learner likes to print it: (2, 3)."""
    return "(" + ", ".join(str(size) for size in shape) + ")"


def dot(a, b):
    _token_count["dot"] += 1
    total = torch.zeros((), dtype=a.dtype, device=a.device)
    for i in range(a.shape[0]):
        total = total + a[i] * b[i]
    return total
'''),
         "matmul": Source(r'''
def matmul(a, b):
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul: a is {_token(a.shape)} and b is {_token(b.shape)}; the "
                         "inner sizes differ")
    out = a.new_empty(a.shape[0], b.shape[1])
    for j, column in enumerate(b.unbind(1)):          # column by column
        out[:, j] = torch.stack([dot(row, column) for row in a.unbind(0)])
    return out
''')}),
    honest(
        "h01_class_named_test", MATMUL,
        "the learner's own class named Test (a shape check) that matmul builds on every call, "
        "while the test cells import llmcheck's Test: each test cell runs in its own copy of the "
        "learner's namespace, so the learner's functions keep their own Test",
        {"matmul": Source(r'''
class Test:
    """The learner's own check that two matrices can be multiplied."""

    def __init__(self, a, b):
        self.ok = a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0]
        self.message = f"matmul: a is {tuple(a.shape)} and b is {tuple(b.shape)}"

    def sizes(self, a, b):
        if not self.ok:
            raise ValueError(self.message)
        return a.shape[0], a.shape[1], b.shape[1]


def matmul(a, b):
    n, k, m = Test(a, b).sizes(a, b)
    out = torch.zeros(n, m, dtype=a.dtype, device=a.device)
    for i in range(n):
        for j in range(m):
            out[i, j] = dot(a[i], b[:, j])
    return out
''')}),
    honest(
        "h01_variable_named_llmcheck", MATMUL,
        "a dict named llmcheck (the learner counts calls in it) that every function updates: "
        "the test cells import from llmcheck's modules by the import system, never through the "
        "learner's global of that name",
        {"dot": Source(r'''
llmcheck = {"dot": 0, "matmul": 0, "project": 0}     # the learner's own call counts


def dot(a, b):
    llmcheck["dot"] += 1
    total, i = a.new_zeros(()), 0
    while i < len(a):
        total += a[i] * b[i]
        i += 1
    return total
'''),
         "matmul": Source(r'''
def matmul(a, b):
    llmcheck["matmul"] += 1
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul: a is {tuple(a.shape)} and b is {tuple(b.shape)}")
    rows = [torch.stack([dot(row, column) for column in b.T]) for row in a]
    return torch.stack(rows)
'''),
         "project": Source(r'''
def project(x, w, b=None):
    llmcheck["project"] += 1
    q = x @ w
    return q if b is None else q + b
''')}),
    honest(
        "h01_helper_named_check", MATMUL,
        "a helper named check (the shapes of a product, or a ValueError) that matmul and project "
        "call, the name of the course's own check command",
        {"matmul": Source(r'''
def check(a, b):
    """(n, k, m) of a product a @ b, or a ValueError that shows both shapes."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul: a is {tuple(a.shape)} and b is {tuple(b.shape)}")
    return a.shape[0], a.shape[1], b.shape[1]


def matmul(a, b):
    n, _, m = check(a, b)
    out = []
    for i in range(n):
        out.append([dot(a[i], b[:, j]) for j in range(m)])
    return torch.stack([torch.stack(row) for row in out])
'''),
         "project": Source(r'''
def project(x, w, b=None):
    if x.shape[-1] != w.shape[0]:
        raise ValueError(f"project: x is {tuple(x.shape)} and w is {tuple(w.shape)}")
    q = x @ w
    return q if b is None else q + b
''')}),
]


# ------------------------------------------------------------------------------------------------
# Exercise 2: softmax_rows, causal_mask, attention
# ------------------------------------------------------------------------------------------------

ATTENTION_VARIANTS = [
    honest(
        "h02_row_by_row", ATTENTION,
        "softmax_rows flattens to rows, handles one row at a time in a Python loop (skipping a "
        "fully masked row with continue) and torch.stacks them back; causal_mask is a nested list "
        "comprehension turned into a tensor; attention masks with torch.where",
        {"softmax_rows": Source(r'''
def softmax_rows(x):
    """Softmax of each row, one row at a time."""
    flat = x.reshape(-1, x.shape[-1])                # (rows, m)
    out_rows = []
    for row in flat:
        if bool(torch.isneginf(row).all()):          # a query that sees nothing: zeros
            out_rows.append(torch.zeros_like(row))
            continue
        weights = (row - row.max()).exp()
        out_rows.append(weights / weights.sum())
    return torch.stack(out_rows).reshape(x.shape)
'''),
         "causal_mask": Source(r'''
def causal_mask(n, m):
    offset = m - n                                   # keys cached before the first query
    return torch.tensor([[j <= i + offset for j in range(m)] for i in range(n)],
                        dtype=torch.bool)
'''),
         "attention": Source(r'''
def attention(q, k, v, causal=False):
    d_head = q.shape[-1]
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d_head)
    if causal:
        keep = causal_mask(q.shape[-2], k.shape[-2])
        scores = torch.where(keep, scores, torch.full_like(scores, float("-inf")))
    return torch.matmul(softmax_rows(scores), v)
''')}),
    honest(
        "h02_tril_and_max", ATTENTION,
        "softmax_rows uses x.max(...).values and masked_fill; causal_mask is "
        "torch.ones(n, m).tril(diagonal=m - n); attention scales q before the product and uses "
        "k.mT and logical_not",
        {"softmax_rows": Source(r'''
def softmax_rows(x):
    peak = x.max(dim=-1, keepdim=True).values
    peak = peak.masked_fill(peak == float("-inf"), 0.0)          # an all -inf row: shift by 0
    e = (x - peak).exp()
    norm = e.sum(dim=-1, keepdim=True)
    return e / norm.masked_fill(norm == 0, 1.0)
'''),
         "causal_mask": Source(r'''
def causal_mask(n, m):
    # keep the entries on or below the diagonal shifted right by m - n
    return torch.ones(n, m, dtype=torch.bool).tril(diagonal=m - n)
'''),
         "attention": Source(r'''
def attention(q, k, v, causal=False):
    q = q * (1.0 / math.sqrt(q.shape[-1]))                       # scale once, before the product
    scores = q @ k.mT
    if causal:
        hidden = causal_mask(q.shape[-2], k.shape[-2]).logical_not()
        scores = scores.masked_fill(hidden, -math.inf)
    return softmax_rows(scores) @ v
''')}),
    honest(
        "h02_sets_omp_threads", ATTENTION,
        "every answer cell starts with import os; os.environ['OMP_NUM_THREADS'] = '1'; softmax "
        "divides under torch.where; causal_mask subtracts two aranges; attention uses "
        "torch.einsum",
        {"softmax_rows": Source(r'''
import os
os.environ["OMP_NUM_THREADS"] = "1"          # one thread, so my timings do not jump around


def softmax_rows(x):
    row_max = x.amax(dim=-1, keepdim=True)
    safe_max = torch.where(row_max > -math.inf, row_max, torch.zeros_like(row_max))
    numer = torch.exp(x - safe_max)
    denom = numer.sum(dim=-1, keepdim=True)
    return torch.where(denom > 0, numer / denom, torch.zeros_like(numer))
'''),
         "causal_mask": Source(r'''
import os
os.environ["OMP_NUM_THREADS"] = "1"


def causal_mask(n, m):
    distance = torch.arange(m)[None, :] - torch.arange(n)[:, None]    # j - i, (n, m)
    return distance <= m - n
'''),
         "attention": Source(r'''
import os
os.environ["OMP_NUM_THREADS"] = "1"


def attention(q, k, v, causal=False):
    scores = torch.einsum("...id,...jd->...ij", q, k) / math.sqrt(q.shape[-1])
    if causal:
        scores = scores.masked_fill(~causal_mask(q.shape[-2], k.shape[-2]), float("-inf"))
    return torch.einsum("...ij,...jd->...id", softmax_rows(scores), v)
''')}),
    honest(
        "h02_warns_on_masked_rows", ATTENTION,
        "softmax_rows calls warnings.warn when a row is entirely -inf (it still returns zeros "
        "there), so the masked-rows test writes a UserWarning to stderr; causal_mask is the "
        "complement of triu; attention masks in place (masked_fill_)",
        {"softmax_rows": Source(r'''
import warnings


def softmax_rows(x):
    top = x.amax(dim=-1, keepdim=True)
    empty = torch.isneginf(top)
    if empty.any():
        warnings.warn(f"softmax_rows: {int(empty.sum())} row(s) are all -inf; they get zeros")
    top = top.masked_fill(empty, 0.0)
    exps = torch.exp(x - top)
    total = exps.sum(dim=-1, keepdim=True)
    return exps / torch.where(total == 0, torch.ones_like(total), total)
'''),
         "causal_mask": Source(r'''
def causal_mask(n, m):
    future = torch.triu(torch.ones(n, m, dtype=torch.bool), diagonal=m - n + 1)
    return ~future
'''),
         "attention": Source(r'''
def attention(q, k, v, causal=False):
    scores = q @ k.transpose(-1, -2)
    scores /= math.sqrt(q.shape[-1])
    if causal:
        scores.masked_fill_(~causal_mask(q.shape[-2], k.shape[-2]), float("-inf"))
    return softmax_rows(scores) @ v
''')}),
    honest(
        "h02_globals_lookup", ATTENTION,
        "attention finds its helpers with globals()['causal_mask'] and globals()['softmax_rows']; "
        "softmax_rows clamps the shift to the dtype's lowest finite value and the sum to its "
        "smallest positive one; causal_mask fills a zeros tensor row by row",
        {"softmax_rows": Source(r'''
def softmax_rows(x):
    info = torch.finfo(x.dtype)
    shift = x.amax(dim=-1, keepdim=True).clamp(min=info.min)     # all -inf row: a finite shift
    exps = torch.exp(x - shift)
    return exps / exps.sum(dim=-1, keepdim=True).clamp(min=info.tiny)
'''),
         "causal_mask": Source(r'''
def causal_mask(n, m):
    mask = torch.zeros(n, m, dtype=torch.bool)
    for i in range(n):
        mask[i, : i + (m - n) + 1] = True
    return mask
'''),
         "attention": Source(r'''
def attention(q, k, v, causal=False):
    helpers = globals()                              # my own functions, by name
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        allowed = helpers["causal_mask"](q.shape[-2], k.shape[-2])
        scores = scores.masked_fill(~allowed, float("-inf"))
    return helpers["softmax_rows"](scores) @ v
''')}),
]


# ------------------------------------------------------------------------------------------------
# Exercise 3: split_heads, merge_heads, qkv_projection, multihead_attention
# ------------------------------------------------------------------------------------------------

MULTIHEAD_VARIANTS = [
    honest(
        "h03_unflatten_movedim", MULTIHEAD,
        "split_heads is unflatten + movedim (both views); merge_heads is movedim + flatten; "
        "qkv_projection uses torch.matmul and chunk and returns a generator made into a tuple; "
        "the output bias is added in place",
        {"split_heads": Source(r'''
def split_heads(x, n_heads):
    return x.unflatten(-1, (n_heads, -1)).movedim(-2, -3)          # (..., h, n, d_head)
'''),
         "merge_heads": Source(r'''
def merge_heads(x):
    return x.movedim(-3, -2).flatten(-2)                           # (..., n, h * d_head)
'''),
         "qkv_projection": Source(r'''
def qkv_projection(x, w_qkv, b_qkv, n_heads):
    qkv = torch.matmul(x, w_qkv)
    if b_qkv is not None:
        qkv = qkv + b_qkv
    return tuple(split_heads(part, n_heads) for part in qkv.chunk(3, dim=-1))
'''),
         "multihead_attention": Source(r'''
def multihead_attention(x, w_qkv, b_qkv, w_o, b_o, n_heads, causal=True):
    q, k, v = qkv_projection(x, w_qkv, b_qkv, n_heads)
    heads = llmcore.attention(q, k, v, causal=causal)
    out = torch.matmul(merge_heads(heads), w_o)
    if b_o is not None:
        out += b_o
    return out
''')}),
    honest(
        "h03_cat_of_heads", MULTIHEAD,
        "merge_heads concatenates the unbound heads along the features; split_heads is reshape + "
        "swapaxes; qkv_projection adds the bias in place (add_) and slices; multihead_attention "
        "writes its own attention with torch.softmax and a triu mask instead of llmcore.attention",
        {"split_heads": Source(r'''
def split_heads(x, n_heads):
    d = x.shape[-1]
    d_head = d // n_heads
    return x.reshape(*x.shape[:-1], n_heads, d_head).swapaxes(-3, -2)
'''),
         "merge_heads": Source(r'''
def merge_heads(x):
    # head i's (..., n, d_head) block goes to columns i * d_head ... (i + 1) * d_head - 1
    return torch.cat(x.unbind(dim=-3), dim=-1)
'''),
         "qkv_projection": Source(r'''
def qkv_projection(x, w_qkv, b_qkv, n_heads):
    qkv = x @ w_qkv
    if b_qkv is not None:
        qkv.add_(b_qkv)
    d = w_qkv.shape[0]
    q = split_heads(qkv[..., :d], n_heads)
    k = split_heads(qkv[..., d:2 * d], n_heads)
    v = split_heads(qkv[..., 2 * d:], n_heads)
    return q, k, v
'''),
         "multihead_attention": Source(r'''
import math


def multihead_attention(x, w_qkv, b_qkv, w_o, b_o, n_heads, causal=True):
    q, k, v = qkv_projection(x, w_qkv, b_qkv, n_heads)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])     # (..., h, n, n)
    if causal:
        n = scores.shape[-1]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    out = merge_heads(torch.softmax(scores, dim=-1) @ v) @ w_o
    return out + b_o if b_o is not None else out
''')}),
    honest(
        "h03_returns_a_list", MULTIHEAD,
        "qkv_projection returns [q, k, v] as a list (the test accepts a tuple or a list), built "
        "by a comprehension over torch.split; split_heads is view + permute over an explicit "
        "axis order; merge_heads is permute + contiguous + view",
        {"split_heads": Source(r'''
def split_heads(x, n_heads):
    *lead, n, d = x.shape
    heads = x.view(*lead, n, n_heads, d // n_heads)
    r = len(lead)
    return heads.permute(*range(r), r + 1, r, r + 2)
'''),
         "merge_heads": Source(r'''
def merge_heads(x):
    *lead, h, n, d_head = x.shape
    r = len(lead)
    return x.permute(*range(r), r + 1, r, r + 2).contiguous().view(*lead, n, h * d_head)
'''),
         "qkv_projection": Source(r'''
def qkv_projection(x, w_qkv, b_qkv, n_heads):
    d = x.shape[-1]
    qkv = x @ w_qkv if b_qkv is None else x @ w_qkv + b_qkv
    return [split_heads(part, n_heads) for part in torch.split(qkv, d, dim=-1)]
'''),
         "multihead_attention": Source(r'''
def multihead_attention(x, w_qkv, b_qkv, w_o, b_o, n_heads, causal=True):
    q, k, v = qkv_projection(x, w_qkv, b_qkv, n_heads)
    merged = merge_heads(llmcore.attention(q, k, v, causal=causal))
    return merged @ w_o if b_o is None else torch.addmm(b_o, merged.reshape(-1, merged.shape[-1]),
                                                        w_o).reshape(merged.shape)
''')}),
    honest(
        "h03_class_name_messages", MULTIHEAD,
        "a helper class HeadLayout does the splitting and merging; its error message and its "
        "__repr__ name the class with self.__class__.__name__ and type(self).__name__",
        {"split_heads": Source(r'''
class HeadLayout:
    """How the feature axis of d numbers is cut into heads."""

    def __init__(self, n_heads):
        self.n_heads = n_heads

    def __repr__(self):
        return f"{type(self).__name__}(n_heads={self.n_heads})"

    def check(self, d):
        if d % self.n_heads:
            raise ValueError(f"{self.__class__.__name__}: d = {d} is not a multiple of "
                             f"{self.n_heads} heads")

    def split(self, x):
        *lead, n, d = x.shape
        self.check(d)
        return x.view(*lead, n, self.n_heads, d // self.n_heads).transpose(-3, -2)

    def merge(self, x):
        *lead, h, n, d_head = x.shape
        return x.transpose(-3, -2).reshape(*lead, n, h * d_head)


def split_heads(x, n_heads):
    return HeadLayout(n_heads).split(x)
'''),
         "merge_heads": Source(r'''
def merge_heads(x):
    return HeadLayout(x.shape[-3]).merge(x)
'''),
         "qkv_projection": Source(r'''
def qkv_projection(x, w_qkv, b_qkv, n_heads):
    layout = HeadLayout(n_heads)
    qkv = x @ w_qkv
    if b_qkv is not None:
        qkv = qkv + b_qkv
    d = x.shape[-1]
    q, k, v = torch.split(qkv, [d, d, d], dim=-1)
    return layout.split(q), layout.split(k), layout.split(v)
'''),
         "multihead_attention": Source(r'''
def multihead_attention(x, w_qkv, b_qkv, w_o, b_o, n_heads, causal=True):
    layout = HeadLayout(n_heads)
    q, k, v = qkv_projection(x, w_qkv, b_qkv, n_heads)
    out = layout.merge(llmcore.attention(q, k, v, causal=causal)) @ w_o
    if b_o is None:
        return out
    return out + b_o
''')}),
    honest(
        "h03_getattr_setattr", MULTIHEAD,
        "multihead_attention keeps its weights in a small object of its own built with setattr "
        "and reads the optional biases back with getattr(obj, name, None)",
        {"multihead_attention": Source(r'''
class Weights:
    """The weights of one attention layer, as attributes."""

    def __init__(self, **named):
        for name, value in named.items():
            setattr(self, name, value)


def multihead_attention(x, w_qkv, b_qkv, w_o, b_o, n_heads, causal=True):
    layer = Weights(w_qkv=w_qkv, w_o=w_o, **({} if b_qkv is None else {"b_qkv": b_qkv}),
                    **({} if b_o is None else {"b_o": b_o}))
    q, k, v = qkv_projection(x, layer.w_qkv, getattr(layer, "b_qkv", None), n_heads)
    out = merge_heads(llmcore.attention(q, k, v, causal=causal)) @ layer.w_o
    bias = getattr(layer, "b_o", None)
    return out if bias is None else out + bias
''')}),
    honest(
        "h03_prints_and_asserts", MULTIHEAD,
        "print(...) in every function, assert statements with f-string messages about the "
        "shapes; qkv_projection splits with tensor_split",
        {"split_heads": Source(r'''
def split_heads(x, n_heads):
    d = x.shape[-1]
    assert d % n_heads == 0, f"d = {d} does not split into {n_heads} heads"
    d_head = d // n_heads
    print(f"split_heads: {tuple(x.shape)} -> {n_heads} heads of {d_head}")
    heads = x.view(*x.shape[:-1], n_heads, d_head)
    return heads.transpose(-2, -3)
'''),
         "merge_heads": Source(r'''
def merge_heads(x):
    assert x.dim() >= 3, f"merge_heads needs (..., h, n, d_head), got {tuple(x.shape)}"
    h, n, d_head = x.shape[-3:]
    print(f"merge_heads: {h} heads of ({n}, {d_head})")
    return x.transpose(-3, -2).reshape(*x.shape[:-3], n, h * d_head)
'''),
         "qkv_projection": Source(r'''
def qkv_projection(x, w_qkv, b_qkv, n_heads):
    assert w_qkv.shape[-1] == 3 * x.shape[-1], f"w_qkv is {tuple(w_qkv.shape)}"
    qkv = x @ w_qkv
    if b_qkv is not None:
        qkv = qkv + b_qkv
    print(f"qkv_projection: one product, {tuple(x.shape)} @ {tuple(w_qkv.shape)}")
    return tuple(split_heads(t, n_heads) for t in qkv.tensor_split(3, dim=-1))
'''),
         "multihead_attention": Source(r'''
def multihead_attention(x, w_qkv, b_qkv, w_o, b_o, n_heads, causal=True):
    q, k, v = qkv_projection(x, w_qkv, b_qkv, n_heads)
    print(f"multihead_attention: q {tuple(q.shape)}, causal={causal}")
    y = merge_heads(llmcore.attention(q, k, v, causal=causal)) @ w_o
    assert y.shape == x.shape, f"{tuple(y.shape)} != {tuple(x.shape)}"
    return y if b_o is None else y + b_o
''')}),
]


# ------------------------------------------------------------------------------------------------
# Exercise 4: LayerCache.append, decode_step, generate_cached
# ------------------------------------------------------------------------------------------------

KV_CACHE_VARIANTS = [
    honest(
        "h04_chunk_list", KV_CACHE,
        "the cache keeps the list of appended chunks and concatenates them all at each append "
        "(length sums the chunks); decode_step does its own projection (x @ w_qkv + b, split, "
        "reshape) and its own exp softmax; generate_cached uses while loops and break",
        {"layer_cache": Source(r'''
class LayerCache:
    """Keys and values of one layer, kept as the list of appended chunks."""

    def __init__(self, n_heads, d_head, dtype=torch.float64):
        self.keys = torch.zeros(n_heads, 0, d_head, dtype=dtype)
        self.values = torch.zeros(n_heads, 0, d_head, dtype=dtype)
        self.key_chunks = []
        self.value_chunks = []

    @property
    def length(self):
        return sum(chunk.shape[1] for chunk in self.key_chunks)

    def append(self, k, v):
        self.key_chunks.append(k)
        self.value_chunks.append(v)
        self.keys = torch.cat([self.keys[:, :0], *self.key_chunks], dim=1)
        self.values = torch.cat([self.values[:, :0], *self.value_chunks], dim=1)
        return self.keys, self.values
'''),
         "decode_step": Source(r'''
def decode_step(layer, x_new, cache):
    d = x_new.shape[-1]
    h = layer.n_heads
    d_head = d // h
    qkv = x_new @ layer.w_qkv
    if layer.b_qkv is not None:
        qkv = qkv + layer.b_qkv                                        # (1, 3d)
    q, k, v = (part.reshape(1, h, d_head).transpose(0, 1) for part in qkv.split(d, dim=-1))
    keys, values = cache.append(k, v)                                  # (h, m, d_head)
    scores = q @ keys.transpose(1, 2) / math.sqrt(d_head)              # (h, 1, m)
    weights = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    weights = weights / weights.sum(dim=-1, keepdim=True)
    out = (weights @ values).transpose(0, 1).reshape(1, d)             # (1, d)
    out = out @ layer.w_o
    return out if layer.b_o is None else out + layer.b_o
'''),
         "generate_cached": Source(r'''
def generate_cached(model, prompt, max_new_tokens):
    caches = [LayerCache(model.config.n_heads, model.config.d_head, dtype=model.dtype)
              for _ in range(len(model.blocks))]
    tokens = [int(t) for t in prompt]
    position = 0
    while position < len(prompt):                      # the prompt, once
        logits = model_step(model, tokens[position], position, caches)
        position += 1
    produced = 0
    while produced < max_new_tokens:
        next_token = int(torch.argmax(logits))
        tokens.append(next_token)
        produced += 1
        if produced == max_new_tokens:
            break                                      # the last token needs no logits
        logits = model_step(model, next_token, len(tokens) - 1, caches)
    return tokens
''')}),
    honest(
        "h04_growing_buffer", KV_CACHE,
        "the cache preallocates a buffer, doubles it when full, writes new rows into it in place "
        "and returns views of its filled part; decode_step merges heads by transpose + reshape "
        "and calls llmcore.linear; generate_cached is one loop over every position but the last",
        {"layer_cache": Source(r'''
class LayerCache:
    """Keys and values of one layer in a buffer that doubles when it is full."""

    def __init__(self, n_heads, d_head, dtype=torch.float64):
        self.buffer_k = torch.zeros(n_heads, 8, d_head, dtype=dtype)
        self.buffer_v = torch.zeros(n_heads, 8, d_head, dtype=dtype)
        self.m = 0
        self.keys, self.values = self.buffer_k[:, :0], self.buffer_v[:, :0]

    @property
    def length(self):
        return self.m

    def grow(self, needed):
        capacity = self.buffer_k.shape[1]
        if needed <= capacity:
            return
        while capacity < needed:
            capacity *= 2
        h, _, d_head = self.buffer_k.shape
        bigger_k = self.buffer_k.new_zeros(h, capacity, d_head)
        bigger_v = self.buffer_v.new_zeros(h, capacity, d_head)
        bigger_k[:, :self.m] = self.buffer_k[:, :self.m]
        bigger_v[:, :self.m] = self.buffer_v[:, :self.m]
        self.buffer_k, self.buffer_v = bigger_k, bigger_v

    def append(self, k, v):
        start, stop = self.m, self.m + k.shape[1]
        self.grow(stop)
        self.buffer_k[:, start:stop] = k
        self.buffer_v[:, start:stop] = v
        self.m = stop
        self.keys, self.values = self.buffer_k[:, :stop], self.buffer_v[:, :stop]
        return self.keys, self.values
'''),
         "decode_step": Source(r'''
def decode_step(layer, x_new, cache):
    q, k, v = llmcore.qkv_projection(x_new, layer.w_qkv, layer.b_qkv, n_heads=layer.n_heads)
    keys, values = cache.append(k, v)
    weights = llmcore.softmax(q @ keys.mT / math.sqrt(q.shape[-1]))       # (h, 1, m)
    heads = weights @ values                                                # (h, 1, d_head)
    merged = heads.transpose(0, 1).reshape(1, -1)                           # (1, d)
    return llmcore.linear(merged, layer.w_o, layer.b_o)
'''),
         "generate_cached": Source(r'''
def generate_cached(model, prompt, max_new_tokens):
    caches = [LayerCache(model.config.n_heads, model.config.d_head, dtype=model.dtype)
              for _ in model.blocks]
    tokens = list(prompt)
    # every position once; from the prompt's last token on, each step's logits pick the next
    for position in range(len(prompt) + max_new_tokens - 1):
        logits = model_step(model, tokens[position], position, caches)
        if position >= len(prompt) - 1:
            tokens.append(int(logits.argmax()))
    return tokens
''')}),
    honest(
        "h04_dataclasses", KV_CACHE,
        "LayerCache is a @dataclass (fields n_heads, d_head, dtype; __post_init__ makes the empty "
        "tensors); decode_step keeps q, k, v in a frozen dataclass and uses torch.einsum and "
        "torch.softmax; type hints and from __future__ import annotations",
        {"layer_cache": Source(r'''
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LayerCache:
    """Keys and values of one layer, (h, m, d_head) each."""

    n_heads: int
    d_head: int
    dtype: torch.dtype = torch.float64
    keys: torch.Tensor = field(init=False, repr=False)
    values: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.keys = torch.zeros(self.n_heads, 0, self.d_head, dtype=self.dtype)
        self.values = torch.zeros(self.n_heads, 0, self.d_head, dtype=self.dtype)

    @property
    def length(self) -> int:
        return self.keys.shape[1]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys = torch.cat((self.keys, k), dim=1)
        self.values = torch.cat((self.values, v), dim=1)
        return self.keys, self.values
'''),
         "decode_step": Source(r'''
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Projected:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor


def decode_step(layer, x_new: torch.Tensor, cache: LayerCache) -> torch.Tensor:
    new = Projected(*llmcore.qkv_projection(x_new, layer.w_qkv, layer.b_qkv,
                                            n_heads=layer.n_heads))
    keys, values = cache.append(new.k, new.v)
    scores = torch.einsum("hqd,hkd->hqk", new.q, keys) / math.sqrt(new.q.shape[-1])
    out = torch.einsum("hqk,hkd->hqd", torch.softmax(scores, dim=-1), values)
    return llmcore.linear(llmcore.merge_heads(out), layer.w_o, layer.b_o)
'''),
         "generate_cached": Source(r'''
from __future__ import annotations


def generate_cached(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    caches = [LayerCache(model.config.n_heads, model.config.d_head, model.dtype)
              for _ in model.blocks]
    tokens: list[int] = []
    logits = None
    for position, token in enumerate(prompt):
        tokens.append(token)
        logits = model_step(model, token, position, caches)
    for step in range(max_new_tokens):
        tokens.append(logits.argmax().item())
        if step < max_new_tokens - 1:
            logits = model_step(model, tokens[-1], len(tokens) - 1, caches)
    return tokens
''')}),
    honest(
        "h04_copies_with_torch_tensor", KV_CACHE,
        "append copies its inputs with torch.tensor(k, dtype=...) (torch prints a UserWarning to "
        "stderr: 'To copy construct from a tensor, it is recommended to use clone().detach()'); "
        "decode_step scales the query first; generate_cached keeps the last token in a variable",
        {"layer_cache": Replace(
            "self.keys = torch.cat([self.keys, k], dim=1)\n"
            "        self.values = torch.cat([self.values, v], dim=1)",
            "k = torch.tensor(k, dtype=self.keys.dtype)           # my own copy of the rows\n"
            "        v = torch.tensor(v, dtype=self.values.dtype)\n"
            "        self.keys = torch.cat([self.keys, k], dim=1)\n"
            "        self.values = torch.cat([self.values, v], dim=1)"),
         "decode_step": Source(r'''
def decode_step(layer, x_new, cache):
    q, k, v = llmcore.qkv_projection(x_new, layer.w_qkv, layer.b_qkv, n_heads=layer.n_heads)
    q = q / math.sqrt(q.shape[-1])
    keys, values = cache.append(k, v)
    attended = llmcore.softmax(q @ keys.transpose(-2, -1)) @ values
    return llmcore.linear(llmcore.merge_heads(attended), layer.w_o, layer.b_o)
'''),
         "generate_cached": Source(r'''
def generate_cached(model, prompt, max_new_tokens):
    caches = [LayerCache(model.config.n_heads, model.config.d_head, dtype=model.dtype)
              for _ in model.blocks]
    for position, token in enumerate(prompt):
        logits = model_step(model, token, position, caches)
    out = list(prompt)
    for _ in range(max_new_tokens):
        last = int(logits.argmax())
        out.append(last)
        if len(out) < len(prompt) + max_new_tokens:
            logits = model_step(model, last, len(out) - 1, caches)
    return out
''')}),
    honest(
        "h04_warns_on_nothing_to_do", KV_CACHE,
        "generate_cached calls warnings.warn when asked for no new tokens (and returns the "
        "prompt), so the hidden test's last case writes a UserWarning to stderr; decode_step "
        "uses its own scores and torch.softmax",
        {"generate_cached": Source(r'''
import warnings


def generate_cached(model, prompt, max_new_tokens):
    tokens = list(prompt)
    if max_new_tokens == 0:
        warnings.warn("generate_cached: max_new_tokens is 0, returning the prompt")
        return tokens
    caches = [LayerCache(model.config.n_heads, model.config.d_head, dtype=model.dtype)
              for _ in model.blocks]
    for position, token in enumerate(tokens):
        logits = model_step(model, token, position, caches)
    while True:
        tokens.append(int(logits.argmax()))
        if len(tokens) == len(prompt) + max_new_tokens:
            return tokens
        logits = model_step(model, tokens[-1], len(tokens) - 1, caches)
'''),
         "decode_step": Source(r'''
def decode_step(layer, x_new, cache):
    q, k, v = llmcore.qkv_projection(x_new, layer.w_qkv, layer.b_qkv, n_heads=layer.n_heads)
    keys, values = cache.append(k, v)
    scores = torch.matmul(q, keys.transpose(1, 2)) / math.sqrt(keys.shape[-1])
    out = torch.matmul(torch.softmax(scores, dim=-1), values)          # (h, 1, d_head)
    return llmcore.linear(llmcore.merge_heads(out), layer.w_o, layer.b_o)
''')}),
]


# ------------------------------------------------------------------------------------------------
# Exercise 5: pad_right, batch_mask, position_ids, batched_logits
# ------------------------------------------------------------------------------------------------

BATCHING_VARIANTS = [
    honest(
        "h05_python_lists", BATCHING,
        "pad_right pads Python lists and makes one tensor at the end; batch_mask stacks one tril "
        "panel per sequence; position_ids is a list comprehension; batched_logits picks each row "
        "in a loop and torch.stacks them",
        {"pad_right": Source(r'''
def pad_right(prompts, pad_id=0):
    if not prompts:
        raise ValueError("no prompts: nothing to batch")
    rows = []
    for s, prompt in enumerate(prompts):
        ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError(f"prompt {s} is empty")
        rows.append(ids)
    n = max(len(r) for r in rows)
    tokens = torch.tensor([r + [pad_id] * (n - len(r)) for r in rows], dtype=torch.long)
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    return tokens, lengths
'''),
         "batch_mask": Source(r'''
def batch_mask(lengths, n):
    panels = []
    for length in lengths.tolist():
        panel = torch.ones(n, n, dtype=torch.bool).tril()      # causal
        panel[:, length:] = False                              # padding keys
        panels.append(panel)
    return torch.stack(panels)
'''),
         "position_ids": Source(r'''
def position_ids(lengths, n):
    return torch.tensor([[j if j < length else 0 for j in range(n)]
                         for length in lengths.tolist()], dtype=torch.long)
'''),
         "batched_logits": Source(r'''
def batched_logits(model, prompts):
    tokens, lengths = pad_right(prompts)
    n = tokens.shape[1]
    logits = forward_with(model, tokens, position_ids(lengths, n), batch_mask(lengths, n))
    return torch.stack([logits[s, int(lengths[s]) - 1] for s in range(len(prompts))])
''')}),
    honest(
        "h05_broadcasting", BATCHING,
        "pad_right copies each prompt into a narrow view of a torch.full batch; batch_mask "
        "broadcasts (1, n, n) & (b, 1, n); position_ids multiplies an expanded arange by the "
        "real-slot mask; batched_logits uses gather",
        {"pad_right": Source(r'''
def pad_right(prompts, pad_id=0):
    if len(prompts) == 0:
        raise ValueError("no prompts were given (an empty batch)")
    sizes = [len(p) for p in prompts]
    for s, size in enumerate(sizes):
        if size == 0:
            raise ValueError(f"empty prompt: prompt {s} has no token")
    tokens = torch.full((len(prompts), max(sizes)), pad_id, dtype=torch.long)
    for s, prompt in enumerate(prompts):
        tokens[s].narrow(0, 0, sizes[s]).copy_(torch.as_tensor(prompt))
    return tokens, torch.tensor(sizes)
'''),
         "batch_mask": Source(r'''
def batch_mask(lengths, n):
    j = torch.arange(n)
    causal = (j <= j.view(n, 1)).unsqueeze(0)                   # (1, n, n)
    real = j.view(1, 1, n) < lengths.view(-1, 1, 1)             # (b, 1, n)
    return causal & real
'''),
         "position_ids": Source(r'''
def position_ids(lengths, n):
    columns = torch.arange(n)
    return columns.expand(len(lengths), n) * (columns < lengths[:, None])
'''),
         "batched_logits": Source(r'''
def batched_logits(model, prompts):
    tokens, lengths = pad_right(prompts)
    n = tokens.shape[1]
    logits = forward_with(model, tokens, position_ids(lengths, n), batch_mask(lengths, n))
    last = (lengths - 1).view(-1, 1, 1).expand(-1, 1, logits.shape[-1])   # (b, 1, v)
    return logits.gather(1, last).squeeze(1)
''')}),
    honest(
        "h05_copies_with_torch_tensor", BATCHING,
        "pad_right converts every prompt with torch.tensor(p, dtype=torch.long), which for a "
        "prompt already given as a tensor makes torch print a UserWarning to stderr; the rest "
        "is torch.where and masked_fill",
        {"pad_right": Source(r'''
def pad_right(prompts, pad_id=0):
    if len(prompts) == 0:
        raise ValueError("no prompts: the batch is empty")
    rows = [torch.tensor(p, dtype=torch.long) for p in prompts]
    for s, row in enumerate(rows):
        if row.numel() == 0:
            raise ValueError(f"prompt {s} is empty")
    n = max(row.numel() for row in rows)
    tokens = torch.full((len(rows), n), pad_id, dtype=torch.long)
    for s, row in enumerate(rows):
        tokens[s, :row.numel()] = row
    return tokens, torch.tensor([row.numel() for row in rows], dtype=torch.long)
'''),
         "batch_mask": Source(r'''
def batch_mask(lengths, n):
    keys = torch.arange(n)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    padding = keys[None, None, :] >= lengths[:, None, None]          # (b, 1, n)
    return causal.expand(len(lengths), n, n).masked_fill(padding, False)
'''),
         "position_ids": Source(r'''
def position_ids(lengths, n):
    columns = torch.arange(n).unsqueeze(0)                           # (1, n)
    return torch.where(columns < lengths.unsqueeze(1), columns, torch.zeros_like(columns))
'''),
         "batched_logits": Source(r'''
def batched_logits(model, prompts):
    tokens, lengths = pad_right(prompts)
    b, n = tokens.shape
    logits = forward_with(model, tokens, position_ids(lengths, n), batch_mask(lengths, n))
    return logits[torch.arange(b), lengths - 1]
''')}),
    honest(
        "h05_class_name_repr", BATCHING,
        "a helper class PaddedBatch (its __repr__ and error messages name the class through "
        "type(self).__name__ and self.__class__.__name__) does the padding; pad_right returns "
        "its two tensors as a tuple",
        {"pad_right": Source(r'''
class PaddedBatch:
    """Prompts padded on the right: tokens (b, n) and lengths (b,)."""

    def __init__(self, prompts, pad_id):
        if len(prompts) == 0:
            raise ValueError(f"{self.__class__.__name__}: no prompts to pad")
        ids = [torch.as_tensor(p, dtype=torch.long).reshape(-1) for p in prompts]
        for s, row in enumerate(ids):
            if len(row) == 0:
                raise ValueError(f"{type(self).__name__}: prompt {s} is empty")
        self.lengths = torch.tensor([len(row) for row in ids])
        self.tokens = torch.full((len(ids), max(len(row) for row in ids)), pad_id,
                                 dtype=torch.long)
        for s, row in enumerate(ids):
            self.tokens[s, :len(row)] = row

    def __repr__(self):
        b, n = self.tokens.shape
        return f"{type(self).__name__}(b={b}, n={n})"


def pad_right(prompts, pad_id=0):
    batch = PaddedBatch(prompts, pad_id)
    return batch.tokens, batch.lengths
'''),
         "batch_mask": Source(r'''
def batch_mask(lengths, n):
    q = torch.arange(n)[:, None]
    k = torch.arange(n)[None, :]
    return torch.stack([(k <= q) & (k < length) for length in lengths])
'''),
         "position_ids": Source(r'''
def position_ids(lengths, n):
    positions = torch.arange(n).repeat(len(lengths), 1)
    positions[positions >= lengths[:, None]] = 0
    return positions
''')}),
    honest(
        "h05_comments_and_asserts", BATCHING,
        "comments that talk about the exercise, llmcheck and get_ipython (comments only), "
        "assert statements with messages, early returns and itertools.zip_longest for the "
        "padding",
        {"pad_right": Source(r'''
import itertools


def pad_right(prompts, pad_id=0):
    # exercise 5, part 1: right padding. The llmcheck recorder refuses pad_sequence here, and
    # get_ipython has nothing to do with it.
    if len(prompts) == 0:
        raise ValueError("no prompts: the batch is empty")
    lists = [[int(t) for t in p] for p in prompts]
    for s, ids in enumerate(lists):
        if len(ids) == 0:
            raise ValueError(f"prompt {s} is empty")
    columns = itertools.zip_longest(*lists, fillvalue=pad_id)         # column by column
    tokens = torch.tensor(list(columns), dtype=torch.long).T.contiguous()
    lengths = torch.tensor([len(ids) for ids in lists], dtype=torch.long)
    assert tokens.shape == (len(lists), int(lengths.max())), f"bad shape {tuple(tokens.shape)}"
    return tokens, lengths
'''),
         "batch_mask": Source(r'''
def batch_mask(lengths, n):
    # the recorder of the exercise watches this: no llmcore mask helpers
    assert n >= int(lengths.max()), f"n = {n} is shorter than the longest prompt"
    i = torch.arange(n).view(1, n, 1)
    j = torch.arange(n).view(1, 1, n)
    return (j <= i) & (j < lengths.view(-1, 1, 1))
'''),
         "position_ids": Source(r'''
def position_ids(lengths, n):
    # 0 on padding, the column elsewhere
    j = torch.arange(n)
    if bool((lengths == n).all()):
        return j.repeat(len(lengths), 1)               # no padding at all: early return
    return j * (j < lengths.unsqueeze(-1)).long()
'''),
         "batched_logits": Source(r'''
def batched_logits(model, prompts):
    # one forward pass for the whole batch (the exercise counts the products)
    tokens, lengths = pad_right(prompts)
    n = tokens.shape[-1]
    logits = forward_with(model, tokens, position_ids(lengths, n), batch_mask(lengths, n))
    assert logits.shape[:2] == tokens.shape, "forward_with keeps (b, n)"
    return logits[range(len(prompts)), (lengths - 1).tolist()]
''')}),
]


# ------------------------------------------------------------------------------------------------
# Exercise 6: BlockAllocator, PagedKVStore.append, gather, free_sequence, paged_attention
# ------------------------------------------------------------------------------------------------

STORE_INIT = r'''
    def __init__(self, num_blocks, block_size, d_head, dtype=torch.float64):
        self.block_size = block_size
        self.keys = torch.zeros(num_blocks, block_size, d_head, dtype=dtype)      # the key pool
        self.values = torch.zeros(num_blocks, block_size, d_head, dtype=dtype)    # the value pool
        self.allocator = BlockAllocator(num_blocks)
        self.tables = {}
        self.lengths = {}

    def block_table(self, seq_id):
        return list(self.tables.get(seq_id, []))

    def length(self, seq_id):
        return self.lengths.get(seq_id, 0)
'''
"""The given part of PagedKVStore, which a learner rewriting the whole cell keeps."""

PAGED_VARIANTS = [
    honest(
        "h06_heap_allocator", PAGED,
        "the allocator keeps a heapq of free ids plus a set for membership; append uses divmod; "
        "gather uses torch.index_select and flatten; free_sequence checks membership and raises "
        "KeyError itself; paged_attention writes its own exp softmax",
        {"allocator": Source(r'''
import heapq


class BlockAllocator:
    """A min-heap of the free ids (smallest first) and a set to answer 'is it free?'."""

    def __init__(self, num_blocks):
        self.num_blocks = num_blocks
        self.heap = list(range(num_blocks))           # sorted, hence already a heap
        self.free_set = set(self.heap)

    @property
    def num_free(self):
        return len(self.free_set)

    def allocate(self):
        if not self.heap:
            raise RuntimeError(f"the pool of {self.num_blocks} blocks is exhausted")
        block = heapq.heappop(self.heap)
        self.free_set.discard(block)
        return block

    def free(self, block):
        if block < 0 or block >= self.num_blocks:
            raise ValueError(f"cannot free block {block}: the pool holds blocks 0 to "
                             f"{self.num_blocks - 1}")
        if block in self.free_set:
            raise ValueError(f"block {block} is not in use (a double free)")
        heapq.heappush(self.heap, block)
        self.free_set.add(block)
'''),
         "paged_store": Source("class PagedKVStore:\n" + STORE_INIT + r'''
    def append(self, seq_id, k_row, v_row):
        if seq_id not in self.tables:
            self.tables[seq_id] = []
            self.lengths[seq_id] = 0
        t = self.lengths[seq_id]
        index, slot = divmod(t, self.block_size)
        if index == len(self.tables[seq_id]):                 # every slot taken: a new block
            self.tables[seq_id].append(self.allocator.allocate())
        block = self.tables[seq_id][index]
        self.keys[block, slot] = k_row
        self.values[block, slot] = v_row
        self.lengths[seq_id] = t + 1
'''),
         "gather": Source(r'''
def gather(store, seq_id):
    table = torch.as_tensor(store.block_table(seq_id), dtype=torch.long)
    m = store.length(seq_id)
    keys = torch.index_select(store.keys, 0, table).flatten(0, 1)[:m]
    values = torch.index_select(store.values, 0, table).flatten(0, 1)[:m]
    return keys, values
'''),
         "free_sequence": Source(r'''
def free_sequence(store, seq_id):
    if seq_id not in store.tables:
        raise KeyError(seq_id)
    for block in store.tables[seq_id]:
        store.allocator.free(block)
    del store.tables[seq_id]
    del store.lengths[seq_id]
'''),
         "paged_attention": Source(r'''
def paged_attention(q, store, seq_id):
    keys, values = gather(store, seq_id)
    n, m = len(q), len(keys)
    scores = (q @ keys.mT) / math.sqrt(q.shape[1])
    future = torch.arange(m)[None, :] > torch.arange(n)[:, None] + (m - n)
    scores = scores.masked_fill(future, -math.inf)
    weights = (scores - scores.amax(dim=1, keepdim=True)).exp()
    return (weights / weights.sum(dim=1, keepdim=True)) @ values
''')}),
    honest(
        "h06_in_use_flags", PAGED,
        "the allocator keeps a list of in-use flags and scans it for the first free one; append "
        "takes blocks in a while loop; gather indexes the pools with the table and views them "
        "flat; free_sequence pops and frees in reverse; paged_attention uses a tril mask, "
        "torch.where and llmcore.softmax",
        {"allocator": Source(r'''
class BlockAllocator:
    def __init__(self, num_blocks):
        self.num_blocks = num_blocks
        self.in_use = [False] * num_blocks

    @property
    def num_free(self):
        return self.in_use.count(False)

    def allocate(self):
        for block, used in enumerate(self.in_use):
            if not used:
                self.in_use[block] = True
                return block
        raise RuntimeError(f"no free block among the {self.num_blocks} of the pool")

    def free(self, block):
        if block not in range(self.num_blocks):
            raise ValueError(f"block id {block} is outside the pool of {self.num_blocks}")
        if not self.in_use[block]:
            raise ValueError(f"block {block} is already free")
        self.in_use[block] = False
'''),
         "paged_store": Source("class PagedKVStore:\n" + STORE_INIT + r'''
    def append(self, seq_id, k_row, v_row):
        table = self.tables.setdefault(seq_id, [])
        t = self.lengths.get(seq_id, 0)
        while len(table) * self.block_size <= t:               # no free slot left
            table.append(self.allocator.allocate())
        self.keys[table[t // self.block_size], t % self.block_size] = k_row
        self.values[table[t // self.block_size], t % self.block_size] = v_row
        self.lengths[seq_id] = t + 1
'''),
         "gather": Source(r'''
def gather(store, seq_id):
    table = torch.tensor(store.block_table(seq_id), dtype=torch.int64)
    m = store.length(seq_id)
    d_head = store.keys.shape[-1]
    return store.keys[table].view(-1, d_head)[:m], store.values[table].view(-1, d_head)[:m]
'''),
         "free_sequence": Source(r'''
def free_sequence(store, seq_id):
    blocks = store.tables.pop(seq_id)              # KeyError for a sequence it does not hold
    store.lengths.pop(seq_id)
    for block in reversed(blocks):
        store.allocator.free(block)
'''),
         "paged_attention": Source(r'''
def paged_attention(q, store, seq_id):
    keys, values = gather(store, seq_id)
    n, m = q.shape[0], keys.shape[0]
    scores = torch.matmul(q, keys.t()) * q.shape[-1] ** -0.5
    visible = torch.ones(n, m, dtype=torch.bool).tril(diagonal=m - n)
    scores = torch.where(visible, scores, torch.tensor(float("-inf"), dtype=scores.dtype))
    return llmcore.softmax(scores) @ values
''')}),
    honest(
        "h06_words_in_strings", PAGED,
        "docstrings and error messages that mention the exercise, the llmcheck.recorder and "
        "get_ipython; the allocator keeps a sorted free list (bisect); append computes the block "
        "count with ceiling division; gather reshapes to (-1, d_head)",
        {"allocator": Source(r'''
import bisect


class BlockAllocator:
    """A sorted free list, as exercise 6 suggests (llmcheck.recorder refuses llmcore.paged)."""

    def __init__(self, num_blocks):
        self.num_blocks = num_blocks
        self.free_list = list(range(num_blocks))

    @property
    def num_free(self):
        """Free blocks (the exercise calls them the free list)."""
        return len(self.free_list)

    def allocate(self):
        if len(self.free_list) == 0:
            raise RuntimeError(f"exercise 6: the pool is full, all {self.num_blocks} blocks "
                               "are in use")
        return self.free_list.pop(0)

    def free(self, block):
        if not 0 <= block < self.num_blocks:
            raise ValueError(f"block {block} does not exist (in this exercise the ids run from "
                             f"0 to {self.num_blocks - 1})")
        i = bisect.bisect_left(self.free_list, block)
        if i < len(self.free_list) and self.free_list[i] == block:
            raise ValueError(f"double free of block {block} (see the exercise's text)")
        self.free_list.insert(i, block)
'''),
         "paged_store": Source("class PagedKVStore:\n" + STORE_INIT + r'''
    def append(self, seq_id, k_row, v_row):
        """One more token; written for exercise 6, checked by the llmcheck recorder."""
        t = self.length(seq_id)
        table = self.tables.setdefault(seq_id, [])
        if -(-(t + 1) // self.block_size) > len(table):      # ceil((t + 1) / p) blocks needed
            table.append(self.allocator.allocate())
        self.keys[table[-1], t % self.block_size] = k_row
        self.values[table[-1], t % self.block_size] = v_row
        self.lengths[seq_id] = t + 1
'''),
         "gather": Source(r'''
def gather(store, seq_id):
    """One indexing per pool, as the exercise says (get_ipython is not involved)."""
    table = torch.tensor(store.block_table(seq_id), dtype=torch.long)
    m = store.length(seq_id)
    keys = store.keys[table].reshape(-1, store.keys.shape[-1])
    values = store.values[table].reshape(-1, store.values.shape[-1])
    return keys[:m], values[:m]
'''),
         "free_sequence": Source(r'''
def free_sequence(store, seq_id):
    """Exercise 6, part 4: KeyError for an unknown sequence, as dict.pop gives."""
    for block in store.tables.pop(seq_id):
        store.allocator.free(block)
    store.lengths.pop(seq_id)
'''),
         "paged_attention": Source(r'''
def paged_attention(q, store, seq_id):
    """Bottom-right aligned causal attention, as in exercise 2."""
    keys, values = gather(store, seq_id)
    n, m = q.shape[0], keys.shape[0]
    scores = q @ keys.T / math.sqrt(q.shape[-1])
    rows = torch.arange(n).unsqueeze(-1)
    scores = scores.masked_fill(torch.arange(m) > rows + (m - n), float("-inf"))
    return torch.softmax(scores, dim=-1) @ values
''')}),
    honest(
        "h06_getattr_setattr", PAGED,
        "the allocator sets its state with setattr in a loop and counts its calls with "
        "getattr(self, 'allocations', 0); free_sequence reads the allocator with "
        "getattr(store, 'allocator'); the store's append counts its appends the same way",
        {"allocator": Source(r'''
class BlockAllocator:
    def __init__(self, num_blocks):
        self.num_blocks = num_blocks
        for name, value in (("free_ids", set(range(num_blocks))), ("allocations", 0)):
            setattr(self, name, value)

    @property
    def num_free(self):
        return len(self.free_ids)

    def allocate(self):
        if not self.free_ids:
            raise RuntimeError(f"no free block: all {self.num_blocks} blocks are in use")
        block = min(self.free_ids)
        self.free_ids.remove(block)
        self.allocations = getattr(self, "allocations", 0) + 1
        return block

    def free(self, block):
        if block < 0 or block >= self.num_blocks:
            raise ValueError(f"block {block} is outside the pool of {self.num_blocks}")
        if block in self.free_ids:
            raise ValueError(f"block {block} is free already")
        self.free_ids.add(block)
'''),
         "paged_store": Source("class PagedKVStore:\n" + STORE_INIT + r'''
    def append(self, seq_id, k_row, v_row):
        setattr(self, "appends", getattr(self, "appends", 0) + 1)
        t = self.length(seq_id)
        table = self.tables.setdefault(seq_id, [])
        if t % self.block_size == 0:                          # the last block is full, or none
            table.append(self.allocator.allocate())
        block, slot = table[t // self.block_size], t % self.block_size
        self.keys[block, slot], self.values[block, slot] = k_row, v_row
        self.lengths[seq_id] = t + 1
'''),
         "free_sequence": Source(r'''
def free_sequence(store, seq_id):
    allocator = getattr(store, "allocator")
    table = store.tables[seq_id]
    for block in table:
        allocator.free(block)
    del store.tables[seq_id], store.lengths[seq_id]
''')}),
    honest(
        "h06_prints_and_displays", PAGED,
        "print(...) when a block is handed out or freed, display(...) of a small example at the "
        "end of the allocator and store cells; the allocator keeps a plain list and takes min()",
        {"allocator": Source(r'''
class BlockAllocator:
    def __init__(self, num_blocks):
        self.num_blocks = num_blocks
        self.available = list(range(num_blocks))

    @property
    def num_free(self):
        return len(self.available)

    def allocate(self):
        if not self.available:
            raise RuntimeError(f"out of blocks: {self.num_blocks} of {self.num_blocks} in use")
        block = min(self.available)
        self.available.remove(block)
        print(f"allocate -> block {block} ({len(self.available)} left)")
        return block

    def free(self, block):
        if block < 0 or block >= self.num_blocks:
            raise ValueError(f"no block {block} in a pool of {self.num_blocks}")
        if block in self.available:
            raise ValueError(f"block {block} is already free")
        self.available.append(block)
        print(f"free block {block}")


display(BlockAllocator(3).num_free)
'''),
         "paged_store": Source("class PagedKVStore:\n" + STORE_INIT + r'''
    def append(self, seq_id, k_row, v_row):
        table = self.tables.setdefault(seq_id, [])
        t = self.lengths.get(seq_id, 0)
        if t == self.block_size * len(table):
            table.append(self.allocator.allocate())
            print(f"{seq_id!r}: a new block, table {table}")
        self.keys[table[t // self.block_size], t % self.block_size] = k_row
        self.values[table[t // self.block_size], t % self.block_size] = v_row
        self.lengths[seq_id] = t + 1


demo = PagedKVStore(num_blocks=2, block_size=2, d_head=1)
demo.append("x", torch.ones(1), torch.ones(1))
display(demo.block_table("x"))
''')}),
    honest(
        "h06_own_exception_classes", PAGED,
        "the allocator raises its own exception classes, PoolExhausted(RuntimeError) and "
        "BadBlock(ValueError), and free_sequence raises UnknownSequence(KeyError): each is the "
        "exception the exercise asks for (except RuntimeError catches PoolExhausted)",
        {"allocator": Source(r'''
class PoolExhausted(RuntimeError):
    """Every block of the pool is in use."""


class BadBlock(ValueError):
    """A block id outside the pool, or a block that is already free."""


class BlockAllocator:
    def __init__(self, num_blocks):
        self.num_blocks = num_blocks
        self.free_blocks = sorted(range(num_blocks))

    @property
    def num_free(self):
        return len(self.free_blocks)

    def allocate(self):
        if not self.free_blocks:
            raise PoolExhausted(f"no free block: all {self.num_blocks} blocks are in use")
        return self.free_blocks.pop(0)

    def free(self, block):
        if not 0 <= block < self.num_blocks:
            raise BadBlock(f"block {block} is not in the pool (ids 0 to {self.num_blocks - 1})")
        if block in self.free_blocks:
            raise BadBlock(f"double free: block {block} is already free")
        self.free_blocks = sorted(self.free_blocks + [block])
'''),
         "free_sequence": Source(r'''
class UnknownSequence(KeyError):
    """A sequence the store does not hold."""


def free_sequence(store, seq_id):
    if seq_id not in store.tables:
        raise UnknownSequence(seq_id)
    for block in store.tables.pop(seq_id):
        store.allocator.free(block)
    del store.lengths[seq_id]
''')}),
]


# ------------------------------------------------------------------------------------------------
# Exercise 7: online_softmax_step, online_softmax, tiled_attention
# ------------------------------------------------------------------------------------------------

TILED_VARIANTS = [
    honest(
        "h07_in_place_while", TILED,
        "the step picks the new maximum with torch.where and masked_fill; online_softmax walks "
        "the tiles with a while loop; tiled_attention updates its accumulator in place "
        "(mul_, add_, div_), masks each tile in place and scales the scores, not q",
        {"online_softmax_step": Source(r'''
def online_softmax_step(running_max, running_sum, scores):
    tile_max = scores.max(dim=-1, keepdim=True).values
    new_max = torch.where(tile_max > running_max, tile_max, running_max)
    shift = new_max.masked_fill(new_max == -math.inf, 0.0)
    rescale = (running_max - shift).exp()
    new_sum = running_sum * rescale + (scores - shift).exp().sum(dim=-1, keepdim=True)
    return new_max, new_sum, rescale
'''),
         "online_softmax": Source(r'''
def online_softmax(x, block):
    m = x.shape[-1]
    row_max = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    row_sum = torch.zeros(x.shape[:-1] + (1,), dtype=x.dtype)
    start = 0
    while start < m:
        row_max, row_sum, _ = online_softmax_step(row_max, row_sum, x[..., start:start + block])
        start += block
    shift = torch.where(row_max == -math.inf, torch.zeros_like(row_max), row_max)
    denom = torch.where(row_sum > 0, row_sum, torch.ones_like(row_sum))
    return (x - shift).exp() / denom
'''),
         "tiled_attention": Source(r'''
def tiled_attention(q, k, v, block, causal=False):
    n, m = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    running_max = q.new_full(q.shape[:-1] + (1,), -math.inf)
    running_sum = q.new_zeros(q.shape[:-1] + (1,))
    acc = torch.zeros_like(q)
    j0 = 0
    while j0 < m:
        j1 = min(j0 + block, m)
        scores = (q @ k[..., j0:j1, :].transpose(-2, -1)) * scale          # (..., n, j1 - j0)
        if causal:
            future = torch.arange(j0, j1).unsqueeze(0) > torch.arange(n).unsqueeze(1) + (m - n)
            scores.masked_fill_(future, -math.inf)
        running_max, running_sum, rescale = online_softmax_step(running_max, running_sum, scores)
        acc.mul_(rescale).add_(torch.exp(scores - running_max) @ v[..., j0:j1, :])
        j0 = j1
    return acc.div_(running_sum)
''')}),
    honest(
        "h07_dataclass_state", TILED,
        "tiled_attention keeps its running max, sum and accumulator in a @dataclass and masks "
        "each tile with ones(n, width).tril(m - n - j0); the step sums with torch.addcmul; "
        "online_softmax iterates x.split(block) and finishes with nan_to_num and clamp",
        {"online_softmax_step": Source(r'''
def online_softmax_step(running_max, running_sum, scores):
    new_max = torch.maximum(running_max, scores.amax(-1, keepdim=True))
    shift = torch.where(torch.isfinite(new_max), new_max, torch.zeros_like(new_max))
    rescale = torch.exp(running_max - shift)
    tile_sum = torch.sum(torch.exp(scores - shift), dim=-1, keepdim=True)
    return new_max, torch.addcmul(tile_sum, running_sum, rescale), rescale
'''),
         "online_softmax": Source(r'''
def online_softmax(x, block):
    state_max = torch.full((*x.shape[:-1], 1), -math.inf, dtype=x.dtype)
    state_sum = torch.zeros_like(state_max)
    for tile in x.split(block, dim=-1):
        state_max, state_sum, _ = online_softmax_step(state_max, state_sum, tile)
    shift = torch.nan_to_num(state_max, neginf=0.0)             # all -inf row: shift by 0
    return torch.exp(x - shift) / state_sum.clamp(min=torch.finfo(x.dtype).tiny)
'''),
         "tiled_attention": Source(r'''
from dataclasses import dataclass


@dataclass
class Running:
    """What every query carries from tile to tile."""
    max: torch.Tensor       # (..., n, 1)
    sum: torch.Tensor       # (..., n, 1)
    acc: torch.Tensor       # (..., n, d_head)


def tiled_attention(q, k, v, block, causal=False):
    n, m, d_head = q.shape[-2], k.shape[-2], q.shape[-1]
    state = Running(max=torch.full((*q.shape[:-1], 1), -math.inf, dtype=q.dtype),
                    sum=torch.zeros((*q.shape[:-1], 1), dtype=q.dtype),
                    acc=torch.zeros_like(q))
    for j0 in range(0, m, block):
        k_tile, v_tile = k[..., j0:j0 + block, :], v[..., j0:j0 + block, :]
        width = k_tile.shape[-2]
        scores = q @ k_tile.transpose(-2, -1) / math.sqrt(d_head)
        if causal:
            # key j0 + c is visible to query i when j0 + c <= i + (m - n)
            visible = torch.ones(n, width, dtype=torch.bool).tril(diagonal=m - n - j0)
            scores = scores.masked_fill(~visible, -math.inf)
        state.max, state.sum, rescale = online_softmax_step(state.max, state.sum, scores)
        state.acc = state.acc * rescale + torch.exp(scores - state.max) @ v_tile
    return state.acc / state.sum
''')}),
    honest(
        "h07_inline_and_reduce", TILED,
        "tiled_attention folds each tile inline (its own maximum, factor and sums, without "
        "calling online_softmax_step) over a generator of tile bounds; online_softmax folds the "
        "tiles with functools.reduce; the step uses torch.max of two tensors",
        {"online_softmax_step": Source(r'''
def online_softmax_step(running_max, running_sum, scores):
    new_max = torch.max(running_max, scores.amax(dim=-1, keepdim=True))
    shift = new_max.masked_fill(new_max == -math.inf, 0)
    rescale = torch.exp(running_max - shift)
    new_sum = running_sum * rescale + torch.exp(scores - shift).sum(-1, keepdim=True)
    return new_max, new_sum, rescale
'''),
         "online_softmax": Source(r'''
import functools


def online_softmax(x, block):
    start = (torch.full((*x.shape[:-1], 1), -math.inf, dtype=x.dtype),
             torch.zeros((*x.shape[:-1], 1), dtype=x.dtype))

    def fold(state, begin):
        return online_softmax_step(*state, x[..., begin:begin + block])[:2]

    final_max, final_sum = functools.reduce(fold, range(0, x.shape[-1], block), start)
    final_max = final_max.masked_fill(torch.isinf(final_max), 0.0)
    final_sum = final_sum.masked_fill(final_sum == 0, 1.0)
    return torch.exp(x - final_max) / final_sum
'''),
         "tiled_attention": Source(r'''
def tile_bounds(m, block):
    """(start, stop) of each tile of keys."""
    start = 0
    while start < m:
        yield start, min(start + block, m)
        start += block


def tiled_attention(q, k, v, block, causal=False):
    n, m = q.shape[-2], k.shape[-2]
    q_scaled = q / math.sqrt(q.shape[-1])
    best = torch.full_like(q[..., :1], -math.inf)          # (..., n, 1)
    total = torch.zeros_like(q[..., :1])
    acc = torch.zeros_like(q)
    last_visible = torch.arange(n).unsqueeze(-1) + (m - n)  # (n, 1)
    for start, stop in tile_bounds(m, block):
        s = torch.matmul(q_scaled, k[..., start:stop, :].transpose(-1, -2))
        if causal:
            s = torch.where(torch.arange(start, stop) <= last_visible, s, s.new_tensor(-math.inf))
        new_best = torch.maximum(best, s.amax(dim=-1, keepdim=True))   # finite from tile 1 on
        factor = torch.exp(best - new_best)
        p = torch.exp(s - new_best)
        total = total * factor + p.sum(dim=-1, keepdim=True)
        acc = acc * factor + p @ v[..., start:stop, :]
        best = new_best
    return acc / total
''')}),
    honest(
        "h07_warns_on_one_tile", TILED,
        "tiled_attention calls warnings.warn when one tile covers every key (block >= m), which "
        "a hidden case does, so that test writes a UserWarning to stderr; the causal mask compares "
        "key and query indices per tile with <=",
        {"tiled_attention": Source(r'''
import warnings


def tiled_attention(q, k, v, block, causal=False):
    n, m, d_head = q.shape[-2], k.shape[-2], q.shape[-1]
    if block >= m:
        warnings.warn(f"tiled_attention: one tile of {block} covers all {m} keys")
    running_max = torch.full((*q.shape[:-1], 1), float("-inf"), dtype=q.dtype)
    running_sum = torch.zeros_like(running_max)
    out = torch.zeros_like(q)
    query_index = torch.arange(n)[:, None]
    for j0 in range(0, m, block):
        j1 = min(m, j0 + block)
        scores = q @ k[..., j0:j1, :].mT / math.sqrt(d_head)
        if causal:
            allowed = torch.arange(j0, j1)[None, :] <= query_index + (m - n)
            scores = scores.masked_fill(~allowed, float("-inf"))
        running_max, running_sum, rescale = online_softmax_step(running_max, running_sum, scores)
        out = rescale * out + torch.exp(scores - running_max) @ v[..., j0:j1, :]
    return out / running_sum
''')}),
    honest(
        "h07_environ_and_globals", TILED,
        "the cells start with os.environ['OMP_NUM_THREADS'] = '1', and tiled_attention finds "
        "its step function with globals()['online_softmax_step']",
        {"online_softmax": Prepend('import os\nos.environ["OMP_NUM_THREADS"] = "1"\n\n'),
         "tiled_attention": Source(r'''
import os
os.environ["OMP_NUM_THREADS"] = "1"


def tiled_attention(q, k, v, block, causal=False):
    step = globals()["online_softmax_step"]                 # my function from part 1
    n, m = q.shape[-2], k.shape[-2]
    q = q * (1 / math.sqrt(q.shape[-1]))
    stats_max = torch.full(q.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
    stats_sum = torch.zeros(q.shape[:-1] + (1,), dtype=q.dtype)
    acc = torch.zeros(q.shape, dtype=q.dtype)
    rows = torch.arange(n).reshape(n, 1) + (m - n)
    for j0 in range(0, m, block):
        kt, vt = k[..., j0:j0 + block, :], v[..., j0:j0 + block, :]
        scores = q @ kt.transpose(-2, -1)
        if causal:
            scores = scores.masked_fill(torch.arange(j0, j0 + kt.shape[-2]) > rows, -math.inf)
        stats_max, stats_sum, rescale = step(stats_max, stats_sum, scores)
        acc = acc * rescale + (scores - stats_max).exp() @ vt
    return acc / stats_sum
''')}),
]


# ------------------------------------------------------------------------------------------------
# Exercise 8: linear_backward, softmax_backward, attention_backward (no autograd)
# ------------------------------------------------------------------------------------------------

BACKWARD_VARIANTS = [
    honest(
        "h08_einsum", BACKWARD,
        "linear_backward uses torch.einsum for dx and dw (summing over every leading axis) and "
        "sums db over a tuple of axes; softmax_backward is a * d_a - a * inner; "
        "attention_backward writes its own exp softmax and masks with llmcore.causal_mask",
        {"linear_backward": Source(r'''
def linear_backward(x, w, d_out):
    dx = torch.einsum("...o,io->...i", d_out, w)
    dw = torch.einsum("...ni,...no->io", x, d_out)
    db = d_out.sum(dim=tuple(range(d_out.dim() - 1)))
    return dx, dw, db
'''),
         "softmax_backward": Source(r'''
def softmax_backward(a, d_a):
    inner = torch.sum(a * d_a, dim=-1, keepdim=True)       # a . g per row
    return a * d_a - a * inner
'''),
         "attention_backward": Source(r'''
import llmcore


def attention_backward(q, k, v, d_out, causal=False):
    scale = q.shape[-1] ** -0.5
    s = q @ k.T * scale
    if causal:
        s = s.masked_fill(~llmcore.causal_mask(q.shape[0], k.shape[0]), -math.inf)
    e = torch.exp(s - s.max(dim=-1, keepdim=True).values)
    a = e / e.sum(dim=-1, keepdim=True)
    dv = a.T @ d_out
    ds = softmax_backward(a, d_out @ v.T)
    return ds @ k * scale, ds.T @ q * scale, dv
''')}),
    honest(
        "h08_row_helpers", BACKWARD,
        "a helper as_rows flattens the leading axes; torch.matmul and .mT; softmax_backward "
        "centres d_a first; attention_backward scales q before the product, masks with "
        "torch.where and torch.full_like, and calls torch.softmax",
        {"linear_backward": Source(r'''
def as_rows(t):
    """(..., n, d) -> (N, d): every row of every sequence."""
    return t.reshape(-1, t.shape[-1])


def linear_backward(x, w, d_out):
    dx = torch.matmul(d_out, w.mT)
    dw = as_rows(x).mT @ as_rows(d_out)
    db = as_rows(d_out).sum(0)
    return (dx, dw, db)
'''),
         "softmax_backward": Source(r'''
def softmax_backward(a, d_a):
    centred = d_a - (a * d_a).sum(-1).unsqueeze(-1)
    return centred * a
'''),
         "attention_backward": Source(r'''
def attention_backward(q, k, v, d_out, causal=False):
    n, d_head = q.shape
    m = k.shape[0]
    scale = 1 / math.sqrt(d_head)
    q_scaled = q * scale
    logits = torch.matmul(q_scaled, k.t())
    if causal:
        rows = torch.arange(n).view(-1, 1)
        cols = torch.arange(m).view(1, -1)
        logits = torch.where(cols - rows <= m - n, logits, torch.full_like(logits, -math.inf))
    probs = torch.softmax(logits, dim=1)
    grad_v = probs.t() @ d_out
    grad_logits = softmax_backward(probs, d_out @ v.t())
    grad_q = grad_logits @ k * scale
    grad_k = grad_logits.t() @ q_scaled
    return grad_q, grad_k, grad_v
''')}),
    honest(
        "h08_dataclass_typed", BACKWARD,
        "type hints and from __future__ import annotations; linear_backward returns early for "
        "one sequence and sums per-sequence products for a batch; attention_backward keeps the "
        "forward pass in a frozen @dataclass made by a helper",
        {"linear_backward": Source(r'''
from __future__ import annotations

from torch import Tensor


def linear_backward(x: Tensor, w: Tensor, d_out: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    dx = d_out @ w.transpose(0, 1)
    if x.dim() == 2:                                   # one sequence
        return dx, x.transpose(0, 1) @ d_out, d_out.sum(dim=0)
    per_sequence = x.transpose(-2, -1) @ d_out         # (..., d_in, d_out)
    dw = per_sequence.reshape(-1, *w.shape).sum(dim=0)
    db = d_out.reshape(-1, d_out.shape[-1]).sum(dim=0)
    return dx, dw, db
'''),
         "softmax_backward": Source(r'''
from __future__ import annotations

from torch import Tensor


def softmax_backward(a: Tensor, d_a: Tensor) -> Tensor:
    return (d_a - (d_a * a).sum(dim=-1, keepdim=True)).mul(a)
'''),
         "attention_backward": Source(r'''
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class HeadForward:
    weights: Tensor        # A: (n, m)
    scale: float


def head_forward(q: Tensor, k: Tensor, causal: bool) -> HeadForward:
    n, m = q.shape[0], k.shape[0]
    scale = 1.0 / math.sqrt(q.shape[1])
    scores = (q @ k.T) * scale
    if not causal:
        return HeadForward(torch.softmax(scores, dim=-1), scale)
    future = torch.arange(m)[None, :] > torch.arange(n)[:, None] + (m - n)
    return HeadForward(torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1), scale)


def attention_backward(q: Tensor, k: Tensor, v: Tensor, d_out: Tensor,
                       causal: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    fwd = head_forward(q, k, causal)
    dv = fwd.weights.T @ d_out
    d_scores = softmax_backward(fwd.weights, d_out @ v.T)
    return (d_scores @ k) * fwd.scale, (d_scores.T @ q) * fwd.scale, dv
''')}),
    honest(
        "h08_copies_with_torch_tensor", BACKWARD,
        "linear_backward copies w with torch.tensor(w) before transposing it (torch prints a "
        "UserWarning to stderr, 'To copy construct from a tensor ...'); dw and db from the "
        "flattened rows with .t()",
        {"linear_backward": Source(r'''
def linear_backward(x, w, d_out):
    w_copy = torch.tensor(w)                        # my own copy, so I never touch the caller's
    d_in = w_copy.shape[0]
    dx = d_out @ w_copy.t()
    flat_x = x.reshape(-1, d_in)
    flat_d = d_out.reshape(-1, w_copy.shape[1])
    return dx, flat_x.t() @ flat_d, flat_d.sum(dim=0)
''')}),
    honest(
        "h08_words_in_docstrings", BACKWARD,
        "docstrings that mention the exercise, autograd, the llmcheck recorder and get_ipython; "
        "linear_backward contracts the leading axes with torch.tensordot; attention_backward "
        "masks with torch.triu",
        {"linear_backward": Source(r'''
def linear_backward(x, w, d_out):
    """By hand, as exercise 8 asks: the llmcheck recorder refuses autograd here.

    (get_ipython() would show the notebook's history; the gradients need none of it.)
    """
    lead = list(range(x.dim() - 1))
    dx = torch.tensordot(d_out, w, dims=([-1], [1]))          # (..., n, d_in)
    dw = torch.tensordot(x, d_out, dims=(lead, lead))          # (d_in, d_out)
    db = d_out.flatten(0, -2).sum(0)
    return dx, dw, db
'''),
         "softmax_backward": Source(r'''
def softmax_backward(a, d_a):
    """J g without the Jacobian (the exercise's recorder counts the products: none here)."""
    return a * d_a - a * (a * d_a).sum(-1, keepdim=True)
'''),
         "attention_backward": Source(r'''
def attention_backward(q, k, v, d_out, causal=False):
    """One head backward, bottom-right aligned as in exercise 2, checked against autograd."""
    n, m = q.shape[0], k.shape[0]
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = q @ k.T * scale
    if causal:
        future = torch.triu(torch.ones(n, m, dtype=torch.bool), diagonal=m - n + 1)
        scores = scores.masked_fill(future, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    d_scores = softmax_backward(weights, d_out @ v.T)
    return d_scores @ k * scale, d_scores.T @ q * scale, weights.T @ d_out
''')}),
]


# ------------------------------------------------------------------------------------------------
# Exercise 10: int8 per channel, int4 groups packed two per byte, a quantized linear layer
# ------------------------------------------------------------------------------------------------

QUANT_VARIANTS = [
    honest(
        "h10_column_loops", QUANT,
        "quantize_int8 fills the values column by column in a Python loop (one scale per column, "
        "guarded with an if); dequantize_int8 multiplies by scale.unsqueeze(0); the linear layer "
        "accumulates into torch.zeros with += and slices x with narrow",
        {"quantize_int8": Source(r'''
def quantize_int8(w):
    """One scale per output column, a loop over the columns."""
    d_in, d_out = w.shape
    values = torch.empty(d_in, d_out, dtype=torch.int8)
    scale = torch.empty(d_out, dtype=w.dtype)
    for j in range(d_out):
        column = w[:, j]
        s = column.abs().max() / 127
        if s == 0:                      # a column of zeros
            s = torch.ones((), dtype=w.dtype)
        scale[j] = s
        values[:, j] = torch.round(column / s).clamp(-127, 127).to(torch.int8)
    return values, scale
'''),
         "dequantize_int8": Source(r'''
def dequantize_int8(values, scale):
    return values.to(scale.dtype) * scale.unsqueeze(0)        # (1, d_out) broadcast over rows
'''),
         "quantized_linear": Source(r'''
def quantized_linear(x, packed, scale, zero, group):
    n_groups, d_out = scale.shape
    out = torch.zeros(*x.shape[:-1], d_out, dtype=x.dtype)
    for t in range(n_groups):
        tile = dequantize_int4(packed[t * (group // 2):(t + 1) * (group // 2)],
                               scale[t:t + 1], zero[t:t + 1], group)    # (group, d_out)
        out += x.narrow(-1, t * group, group) @ tile
    return out
''')}),
    honest(
        "h10_aminmax_and_arithmetic", QUANT,
        "int8 guard with masked_fill and torch.div; int4 ranges with torch.aminmax and scales "
        "spread to every row with repeat_interleave; packing with + and * 16, unpacking with % 16 "
        "and // 16 into an empty tensor's even and odd rows",
        {"quantize_int8": Source(r'''
def quantize_int8(w):
    scale = torch.div(w.abs().amax(dim=0), 127)
    scale = scale.masked_fill(scale == 0, 1.0)
    values = torch.clamp(torch.round(torch.div(w, scale)), min=-127, max=127)
    return values.to(dtype=torch.int8), scale
'''),
         "quantize_int4": Source(r'''
def quantize_int4(w, group: int):
    d_in, d_out = w.shape
    if d_in % group != 0:
        raise ValueError(f"d_in = {d_in} is not a multiple of group = {group}")
    lo, hi = torch.aminmax(w.view(d_in // group, group, d_out), dim=1)
    scale = (hi - lo) / 15
    scale = scale.masked_fill(scale == 0, 1.0)
    zero = -lo / scale
    every_row_scale = scale.repeat_interleave(group, dim=0)          # (d_in, d_out)
    every_row_zero = zero.repeat_interleave(group, dim=0)
    codes = torch.clamp(torch.round(w / every_row_scale + every_row_zero), 0, 15)
    return codes.to(torch.uint8), scale, zero
'''),
         "pack_int4": Source(r'''
def pack_int4(codes):
    even, odd = codes[::2], codes[1::2]
    return even + odd * 16                  # at most 15 + 240 = 255: fits in a uint8


def unpack_int4(packed):
    rows, d_out = packed.shape
    codes = torch.empty(2 * rows, d_out, dtype=torch.uint8)
    codes[0::2] = packed % 16
    codes[1::2] = packed // 16
    return codes
'''),
         "dequantize_int4": Source(r'''
def dequantize_int4(packed, scale, zero, group):
    codes = unpack_int4(packed).to(scale.dtype)
    return (codes - zero.repeat_interleave(group, dim=0)) * scale.repeat_interleave(group, dim=0)
''')}),
    honest(
        "h10_scale_outside", QUANT,
        "the linear layer keeps the scale and the zero point outside the product, as the chapter "
        "does: (x_g @ codes_g - rowsum(x_g) zero_g) * scale_g, summed over the groups with sum() "
        "of a generator; unpack_int4 uses bitwise_and and bitwise_right_shift",
        {"pack_int4": Source(r'''
def pack_int4(codes):
    return torch.bitwise_or(codes[0::2], torch.bitwise_left_shift(codes[1::2], 4))


def unpack_int4(packed):
    low = torch.bitwise_and(packed, 0x0F)
    high = torch.bitwise_right_shift(packed, 4)
    return torch.stack((low, high), dim=-2).flatten(0, 1)       # (r, 2, d_out) -> (2r, d_out)
'''),
         "quantized_linear": Source(r'''
def group_product(x_g, packed_g, scale_g, zero_g):
    """x_g (..., g) @ one group's tile, with the scale and the zero point outside the product."""
    codes = unpack_int4(packed_g).to(x_g.dtype)                     # (g, d_out)
    return (x_g @ codes - x_g.sum(dim=-1, keepdim=True) * zero_g) * scale_g


def quantized_linear(x, packed, scale, zero, group):
    half = group // 2
    return sum(group_product(x[..., t * group:(t + 1) * group], packed[t * half:(t + 1) * half],
                             scale[t], zero[t])
               for t in range(scale.shape[0]))
''')}),
    honest(
        "h10_dataclass", QUANT,
        "a dataclass Int4Groups holds codes, scale and zero with a method per step; quantize_int4 "
        "returns its fields as a tuple; dequantize_int4 reshapes into groups with unflatten; the "
        "linear layer walks (x slice, bytes slice, scale row, zero row) with zip over "
        "split/chunk; type hints; a debugging print when the cell runs",
        {"quantize_int4": Source(r'''
from dataclasses import dataclass

from torch import Tensor


@dataclass
class Int4Groups:
    codes: Tensor        # (d_in, d_out) uint8
    scale: Tensor        # (d_in // group, d_out)
    zero: Tensor

    @classmethod
    def of(cls, w: Tensor, group: int) -> "Int4Groups":
        d_in, d_out = w.shape
        if d_in % group:
            raise ValueError(f"cannot cut d_in={d_in} rows into groups of {group}")
        grouped = w.unflatten(0, (d_in // group, group))
        lo = grouped.min(dim=1).values
        hi = grouped.max(dim=1).values
        step = (hi - lo) / 15
        step = torch.where(hi == lo, torch.ones_like(step), step)
        zero = -lo / step
        codes = (grouped / step.unsqueeze(1) + zero.unsqueeze(1)).round().clamp(0, 15)
        return cls(codes.flatten(0, 1).to(torch.uint8), step, zero)


def quantize_int4(w: Tensor, group: int) -> tuple[Tensor, Tensor, Tensor]:
    q = Int4Groups.of(w, group)
    return q.codes, q.scale, q.zero


print("quantize_int4 defined: groups of consecutive rows, zero = -lo / scale")
'''),
         "dequantize_int4": Source(r'''
def dequantize_int4(packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                    group: int) -> torch.Tensor:
    codes = unpack_int4(packed)
    grouped = codes.unflatten(0, (-1, group)).to(scale.dtype)       # (n_groups, group, d_out)
    return ((grouped - zero.unsqueeze(1)) * scale.unsqueeze(1)).flatten(0, 1)
'''),
         "quantized_linear": Source(r'''
def quantized_linear(x, packed, scale, zero, group):
    out = None
    pieces = zip(x.split(group, dim=-1), packed.split(group // 2, dim=0),
                 scale.unbind(0), zero.unbind(0))
    for x_g, bytes_g, scale_g, zero_g in pieces:
        tile = (unpack_int4(bytes_g).to(scale_g.dtype) - zero_g) * scale_g   # (group, d_out)
        out = x_g @ tile if out is None else out + x_g @ tile
    return out
''')}),
    honest(
        "h10_row_pairs", QUANT,
        "the linear layer goes one byte row at a time (two weight rows), adding the outer products "
        "x[..., i:i+1] * w_row with broadcasting, no matrix product at all; quantize_int8 keeps "
        "the scale as a (1, d_out) row while dividing, then flattens it; pack_int4 checks that "
        "d_in is even",
        {"quantize_int8": Source(r'''
def quantize_int8(w):
    scale = w.abs().amax(dim=0, keepdim=True) / 127               # (1, d_out)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    values = (w / scale).round().clamp(-127, 127).to(torch.int8)
    return values, scale.reshape(-1)
'''),
         "pack_int4": Source(r'''
def pack_int4(codes):
    if codes.shape[0] % 2:
        raise ValueError(f"pack_int4: d_in must be even, got codes of shape {tuple(codes.shape)}")
    return codes[0::2] | (codes[1::2] << 4)


def unpack_int4(packed):
    return torch.stack([packed & 15, packed >> 4], dim=1).reshape(-1, packed.shape[-1])
'''),
         "quantized_linear": Source(r'''
def quantized_linear(x, packed, scale, zero, group):
    out = torch.zeros(*x.shape[:-1], packed.shape[1], dtype=x.dtype)
    for i in range(packed.shape[0]):                  # byte row i: weight rows 2i and 2i + 1
        t = (2 * i) // group                          # both rows are in the same group
        low = (packed[i] & 15).to(x.dtype)
        high = (packed[i] >> 4).to(x.dtype)
        out = out + x[..., 2 * i:2 * i + 1] * ((low - zero[t]) * scale[t])
        out = out + x[..., 2 * i + 1:2 * i + 2] * ((high - zero[t]) * scale[t])
    return out
''')}),
]

# ------------------------------------------------------------------------------------------------
# Exercise 9: temperature, top-k, top-p, drawing with a generator, sampling
# ------------------------------------------------------------------------------------------------

SAMPLING_VARIANTS = [
    honest(
        "h09_row_by_row", SAMPLING,
        "every function flattens the leading axes and loops over the rows in Python: a softmax "
        "written out with the row maximum, top-k and top-p thresholds with torch.where, a draw "
        "with one torch.rand call and searchsorted per row, sample with early returns",
        {"temperature_probs": Source(r'''
def temperature_probs(logits, temperature):
    """softmax(logits / T) one row at a time; T = 0: one-hot at the first maximum."""
    if temperature < 0:
        raise ValueError(f"a temperature of {temperature} is negative: use T >= 0")
    rows = logits.reshape(-1, logits.shape[-1])
    out = []
    for row in rows:
        if temperature == 0:
            one_hot = torch.zeros_like(row)
            one_hot[int(row.argmax())] = 1.0
            out.append(one_hot)
            continue
        scaled = row / temperature
        exps = torch.exp(scaled - scaled.max())
        out.append(exps / exps.sum())
    return torch.stack(out).reshape(logits.shape)
'''),
         "top_k_filter": Source(r'''
def top_k_filter(logits, k):
    """Rows kept at or above their k-th largest logit."""
    if k < 1:
        raise ValueError(f"k = {k}: keep at least one token")
    v = logits.shape[-1]
    rows = logits.reshape(-1, v)
    out = torch.empty_like(rows)
    for i in range(rows.shape[0]):
        descending = torch.sort(rows[i], descending=True).values
        threshold = descending[min(k, v) - 1]
        out[i] = torch.where(rows[i] >= threshold, rows[i], float("-inf"))
    return out.reshape(logits.shape)
'''),
         "top_p_filter": Source(r'''
def top_p_filter(logits, p):
    """Each row's nucleus, found with a running total over the sorted probabilities."""
    if p <= 0 or p > 1:
        raise ValueError(f"p = {p} is outside (0, 1]")
    if p == 1:
        return logits.clone()                 # p = 1: no filter at all
    v = logits.shape[-1]
    rows = logits.reshape(-1, v)
    out = torch.empty_like(rows)
    for i in range(rows.shape[0]):
        probs = torch.softmax(rows[i], dim=-1)
        ordered = probs.sort(descending=True).values
        cumulative = ordered.cumsum(dim=0)
        n_needed = 1
        while n_needed < v and cumulative[n_needed - 1] < p:
            n_needed += 1
        least = ordered[n_needed - 1]
        out[i] = torch.where(probs >= least, rows[i], float("-inf"))
    return out.reshape(logits.shape)
'''),
         "draw": Source(r'''
def draw(logits, generator):
    """Inverse transform, row by row, with the u of one torch.rand call."""
    u = torch.rand(logits.shape[:-1], generator=generator, dtype=logits.dtype,
                   device=logits.device)
    rows = logits.reshape(-1, logits.shape[-1])
    flat_u = u.reshape(-1)
    tokens = []
    for row, u_row in zip(rows, flat_u):
        cumulative = torch.softmax(row, dim=-1).cumsum(dim=0)
        cumulative = cumulative / cumulative[-1]
        tokens.append(torch.searchsorted(cumulative, u_row.reshape(1), right=True)[0])
    return torch.stack(tokens).reshape(logits.shape[:-1])
'''),
         "sample": Source(r'''
def sample(logits, generator, temperature=1.0, top_k=None, top_p=None):
    """Greedy at T = 0, else temperature, top-k, top-p and a draw."""
    if temperature < 0:
        raise ValueError(f"a temperature of {temperature} is negative")
    if temperature == 0:
        return torch.argmax(logits, dim=-1)
    logits = logits / temperature
    if top_k is None and top_p is None:
        return draw(logits, generator)
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    return draw(logits, generator)
''')}),
    honest(
        "h09_shift_first_and_searchsorted", SAMPLING,
        "the logits shifted by their row maximum before the temperature, F.softmax and one_hot; "
        "top-k's "
        "threshold gathered from argsort, top-p's mass before each token by rolling the running "
        "sums, the draw by searchsorted; prints what it computes and displays a table",
        {"temperature_probs": Source(r'''
from IPython.display import display


def temperature_probs(logits, temperature):
    """softmax((z - max z) / T) == softmax(z / T): a shift per row changes nothing."""
    if temperature < 0:
        raise ValueError("temperature must not be negative (got %s)" % temperature)
    if temperature == 0:
        first = torch.argmax(logits, dim=-1)
        return torch.nn.functional.one_hot(first, logits.shape[-1]).to(logits.dtype)
    shifted = logits - logits.max(dim=-1, keepdim=True).values
    return torch.nn.functional.softmax(shifted / temperature, dim=-1)

print("temperature_probs on (1, 2, 4) at T = 2:",
      temperature_probs(torch.tensor([1.0, 2.0, 4.0]), 2.0))
display({"T": [0.5, 1, 2], "note": "sharper, the model's, flatter"})
'''),
         "top_k_filter": Source(r'''
def top_k_filter(logits, k):
    if k < 1:
        raise ValueError(f"top_k must be positive, got {k}")
    k = min(k, logits.shape[-1])
    order = torch.argsort(logits, dim=-1, descending=True)
    kth = torch.gather(logits, -1, order[..., k - 1 : k])
    print(f"top_k_filter: k = {k}, logits {tuple(logits.shape)}")
    return torch.where(logits >= kth, logits, torch.full_like(logits, float("-inf")))
'''),
         "top_p_filter": Source(r'''
def top_p_filter(logits, p):
    if not (0 < p <= 1):
        raise ValueError(f"p must be in (0, 1], got {p}")
    if p >= 1:
        return logits + 0.0                       # the whole vocabulary, as a new tensor
    probs = logits.softmax(dim=-1)
    ordered, _ = torch.sort(probs, dim=-1, descending=True)
    cumulative = torch.cumsum(ordered, dim=-1)
    before = cumulative.roll(1, dims=-1)
    before[..., 0] = 0.0                      # nothing comes before the most probable token
    needed = before < p
    smallest = torch.where(needed, ordered, torch.full_like(ordered, 2.0)).amin(dim=-1,
                                                                            keepdim=True)
    return logits.masked_fill(probs < smallest, float("-inf"))
'''),
         "draw": Source(r'''
def draw(logits, generator):
    probs = logits.softmax(dim=-1)
    cumulative = torch.cumsum(probs, dim=-1)
    cumulative = cumulative / cumulative[..., -1:]
    u = torch.rand(logits.shape[:-1], generator=generator, dtype=logits.dtype,
                   device=logits.device)
    return torch.searchsorted(cumulative.contiguous(), u[..., None].contiguous(),
                              right=True)[..., 0]
''')}),
    honest(
        "h09_helpers_and_a_pipeline", SAMPLING,
        "a helper that masks below a threshold shared by both filters, a frozen dataclass of "
        "settings, sample as a list of steps built with functools.partial, a warning when top_k "
        "keeps everything",
        {"top_k_filter": Source(r'''
import warnings
from dataclasses import dataclass
from functools import partial

NEG_INF = float("-inf")


def mask_below(logits, threshold):
    """Every logit whose score is below the row's threshold -> -inf."""
    return logits.masked_fill(logits < threshold, NEG_INF)


def top_k_filter(logits, k):
    if k < 1:
        raise ValueError(f"top_k must be at least 1, got {k}")
    if k >= logits.shape[-1]:
        warnings.warn(f"top_k = {k} keeps all {logits.shape[-1]} tokens")
        return logits.clone()
    kth = logits.sort(dim=-1, descending=True).values.narrow(-1, k - 1, 1)
    return mask_below(logits, kth)
'''),
         "top_p_filter": Source(r'''
def top_p_filter(logits, p):
    if not 0 < p <= 1:
        raise ValueError(f"top_p must lie in (0, 1], got {p}")
    if p == 1.0:
        return logits * 1
    probs = torch.softmax(logits, dim=-1)
    ordered = probs.sort(dim=-1, descending=True).values
    exclusive = torch.cat([torch.zeros_like(ordered[..., :1]),
                           ordered.cumsum(dim=-1)[..., :-1]], dim=-1)
    count = (exclusive < p).sum(dim=-1, keepdim=True)
    least = ordered.gather(-1, count - 1)
    return logits.masked_fill(probs < least, NEG_INF)
'''),
         "sample": Source(r'''
@dataclass(frozen=True)
class Settings:
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def steps(self):
        yield lambda z: z / self.temperature
        if self.top_k is not None:
            yield partial(top_k_filter, k=self.top_k)
        if self.top_p is not None:
            yield partial(top_p_filter, p=self.top_p)


def sample(logits, generator, temperature=1.0, top_k=None, top_p=None):
    settings = Settings(temperature, top_k, top_p)
    if settings.temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {settings.temperature}")
    if settings.temperature == 0:
        return logits.max(dim=-1).indices if logits.dim() > 0 else logits.argmax()
    for step in settings.steps():
        logits = step(logits)
    return draw(logits, generator)
''')}),
    honest(
        "h09_stable_sort_ranks", SAMPLING,
        "ties handled by ranks: a stable sort, each token's rank scattered back, the k-th value "
        "and the nucleus' last value read at those ranks; T = 0 as a scatter of ones; type hints",
        {"temperature_probs": Source(r'''
from torch import Tensor


def temperature_probs(logits: Tensor, temperature: float) -> Tensor:
    if temperature < 0:
        raise ValueError(f"temperature {temperature!r} < 0")
    if temperature == 0:
        ones = torch.ones_like(logits[..., :1])
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), ones)
    scaled = logits / temperature
    shifted = scaled - scaled.amax(dim=-1, keepdim=True)
    return shifted.exp() / shifted.exp().sum(dim=-1, keepdim=True)
'''),
         "top_k_filter": Source(r'''
def top_k_filter(logits: Tensor, k: int) -> Tensor:
    if k < 1:
        raise ValueError(f"top_k = {k} < 1")
    values, order = torch.sort(logits, dim=-1, descending=True, stable=True)
    ranks = torch.empty_like(order).scatter_(-1, order, torch.arange(
        logits.shape[-1]).expand_as(order).contiguous())
    in_top = ranks < k
    kth = values[..., min(k, logits.shape[-1]) - 1].unsqueeze(-1)
    keep = in_top | (logits == kth)
    return torch.where(keep, logits, torch.tensor(float("-inf"), dtype=logits.dtype))
'''),
         "top_p_filter": Source(r'''
def top_p_filter(logits: Tensor, p: float) -> Tensor:
    if p <= 0 or p > 1:
        raise ValueError(f"top_p = {p} is not in (0, 1]")
    if p == 1:
        return torch.clone(logits)
    probs = torch.softmax(logits, dim=-1)
    values, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    running = values.cumsum(dim=-1)
    needed = torch.ones_like(values, dtype=torch.bool)
    needed[..., 1:] = running[..., :-1] < p
    last = needed.sum(dim=-1, keepdim=True) - 1
    least = values.gather(-1, last)
    return torch.where(probs >= least, logits, torch.tensor(float("-inf"), dtype=logits.dtype))
'''),
         "draw": Source(r'''
def draw(logits: Tensor, generator: torch.Generator) -> Tensor:
    probs = torch.softmax(logits, dim=-1)
    running = probs.cumsum(dim=-1)
    running = running / running[..., -1:]
    u = torch.rand(logits.shape[:-1], dtype=logits.dtype, device=logits.device,
                   generator=generator)
    below = running <= u.unsqueeze(-1)
    return below.long().sum(dim=-1)
''')}),
    honest(
        "h09_words_and_environment", SAMPLING,
        "docstrings that mention the exercise, torch.topk, torch.multinomial and the llmcheck "
        "recorder; an environment variable of its own; getattr on its own helper; sample calls "
        "temperature_probs-style division through a small class",
        {"sample": Source(r'''
import os

os.environ["MY_SAMPLING_DEBUG"] = "0"


class Pipeline:
    """The exercise's order: temperature, top-k, top-p, then the draw (no torch.topk, no
    torch.multinomial: the llmcheck recorder would refuse them, and this needs neither)."""

    def __init__(self, temperature, top_k, top_p):
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p

    def filter_k(self, logits):
        return logits if self.top_k is None else top_k_filter(logits, self.top_k)

    def filter_p(self, logits):
        return logits if self.top_p is None else top_p_filter(logits, self.top_p)

    def __call__(self, logits, generator):
        if os.environ.get("MY_SAMPLING_DEBUG") == "1":
            print("sampling", tuple(logits.shape))
        scaled = logits / self.temperature
        for name in ("filter_k", "filter_p"):
            scaled = getattr(self, name)(scaled)
        return draw(scaled, generator)


def sample(logits, generator, temperature=1.0, top_k=None, top_p=None):
    """Exercise 9, part 5."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return logits.argmax(dim=-1)
    return Pipeline(temperature, top_k, top_p)(logits, generator)
''')}),
]


# ------------------------------------------------------------------------------------------------
# Exercise 11: LoRA's forward, merge and backward
# ------------------------------------------------------------------------------------------------

LORA_VARIANTS = [
    honest(
        "h11_einsum", LORA,
        "every product written as a two-operand einsum (x A first, then B); the shape check "
        "compares torch.Size objects and shows lists; the merge is torch.add with alpha=",
        {"lora_forward": Source(r'''
def lora_forward(x, w, a, b, alpha):
    """x W + (alpha / r) (x A) B, the thin way round."""
    if a.shape[0] != w.shape[0] or b.shape != torch.Size([a.shape[1], w.shape[1]]):
        raise ValueError(f"shapes do not fit: w {list(w.shape)}, a {list(a.shape)}, "
                         f"b {list(b.shape)}")
    thin = torch.einsum("...i,ir->...r", x, a)
    return torch.einsum("...i,io->...o", x, w) + alpha / a.shape[1] * torch.einsum(
        "...r,ro->...o", thin, b)
'''),
         "lora_merge": Source(r'''
def lora_merge(w, a, b, alpha):
    """W + (alpha / r) A B; torch.add makes a new tensor."""
    return torch.add(w, torch.einsum("ir,ro->io", a, b), alpha=alpha / a.shape[1])
'''),
         "lora_backward": Source(r'''
def lora_backward(x, a, b, d_y, alpha):
    """dA and dB by einsum; the ellipsis sums over every leading axis."""
    s = alpha / a.shape[1]
    h = torch.einsum("...i,ir->...r", x, a)
    db = s * torch.einsum("...r,...o->ro", h, d_y)
    dh = s * torch.einsum("...o,ro->...r", d_y, b)
    da = torch.einsum("...i,...r->ir", x, dh)
    return da, db
''')}),
    honest(
        "h11_linear_rule_helper", LORA,
        "chapter 12's rule as a typed helper, linear_grads(x, w, g) -> (dx, dw), applied twice; "
        "a small frozen dataclass holds the adapter's sizes and raises the shape error",
        {"lora_forward": Source(r'''
from dataclasses import dataclass


@dataclass(frozen=True)
class AdapterSizes:
    d_in: int
    d_out: int
    rank: int

    @classmethod
    def of(cls, w: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> "AdapterSizes":
        sizes = cls(w.shape[0], w.shape[1], a.shape[1])
        if tuple(a.shape) != (sizes.d_in, sizes.rank) or \
                tuple(b.shape) != (sizes.rank, sizes.d_out):
            raise ValueError(f"A {tuple(a.shape)} and B {tuple(b.shape)} cannot adapt "
                             f"W {tuple(w.shape)}")
        return sizes


def lora_forward(x: torch.Tensor, w: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                 alpha: float) -> torch.Tensor:
    sizes = AdapterSizes.of(w, a, b)
    low = x @ a                                   # (..., n, r)
    return x @ w + (alpha / sizes.rank) * (low @ b)
'''),
         "lora_backward": Source(r'''
def linear_grads(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor):
    """y = x w, rows are tokens: dx = g w^T, dw = x^T g."""
    return g @ w.T, x.T @ g


def lora_backward(x, a, b, d_y, alpha):
    rows = x.reshape(-1, a.shape[0])
    g = d_y.reshape(-1, b.shape[1]) * (alpha / a.shape[1])
    d_h, d_b = linear_grads(rows @ a, b, g)       # through H B
    _, d_a = linear_grads(rows, a, d_h)           # through X A (its dx is not needed)
    return d_a, d_b
''')}),
    honest(
        "h11_loops_over_sequences", LORA,
        "the backward adds up each sequence's gradients in a Python loop (same products, one "
        "sequence at a time); the merge clones w and adds in place; prints while debugging",
        {"lora_merge": Source(r'''
def lora_merge(w, a, b, alpha):
    merged = w.clone()
    merged.add_(a @ b, alpha=alpha / a.shape[1])   # in place on the copy, never on w
    print("merged", tuple(merged.shape))
    return merged
'''),
         "lora_backward": Source(r'''
def lora_backward(x, a, b, d_y, alpha):
    scale = alpha / a.shape[1]
    seqs = x.reshape(-1, x.shape[-2], x.shape[-1])          # (b, n, d_in), b = 1 for one
    grads = d_y.reshape(-1, d_y.shape[-2], d_y.shape[-1])
    da = torch.zeros_like(a)
    db = torch.zeros_like(b)
    for seq, g in zip(seqs, grads):
        g = scale * g
        db += (seq @ a).T @ g
        da += seq.T @ (g @ b.T)
    return da, db
''')}),
    honest(
        "h11_transposes_and_mT", LORA,
        "gradients computed transposed and turned back (dB = (G^T H)^T with .mT), the scale "
        "applied at the end; the forward chains x @ a @ b left to right and checks shapes "
        "with asserts turned into ValueError",
        {"lora_forward": Source(r'''
def lora_forward(x, w, a, b, alpha):
    try:
        assert a.shape[0] == w.shape[0], "rows"
        assert b.shape[0] == a.shape[1] and b.shape[1] == w.shape[1], "b"
    except AssertionError as why:
        raise ValueError(f"lora_forward ({why}): w is {tuple(w.shape)}, a is {tuple(a.shape)}, "
                         f"b is {tuple(b.shape)}") from None
    return x @ a @ b * (alpha / a.shape[-1]) + x @ w
'''),
         "lora_backward": Source(r'''
def lora_backward(x, a, b, d_y, alpha):
    rows = x.flatten(0, -2)
    g = d_y.flatten(0, -2)
    h = rows @ a
    db = (g.mT @ h).mT
    da = (((g @ b.mT).mT) @ rows).mT
    s = alpha / a.shape[-1]
    return s * da, s * db
''')}),
    honest(
        "h11_words_and_warnings", LORA,
        "warns (warnings.warn) when B is all zero, the first step of training, where dA is 0; "
        "words such as 'llmcheck', 'exercise' and 'autograd' in docstrings and comments",
        {"lora_merge": Source(r'''
def lora_merge(w, a, b, alpha):
    """Exercise 11, part 2: no autograd and no llmcheck here, just W + s A B."""
    return w + (alpha / a.shape[1]) * (a @ b)
'''),
         "lora_backward": Source(r'''
import warnings


def lora_backward(x, a, b, d_y, alpha):
    """My own backward (the exercise refuses autograd; the llmcheck harness watches the ops)."""
    if float(b.abs().sum()) == 0.0:
        warnings.warn("B is all zero: dA will be zero at this step")
    s = alpha / a.shape[1]
    rows = x.reshape(-1, x.shape[-1])
    g = s * d_y.reshape(-1, d_y.shape[-1])
    return rows.T @ (g @ b.T), (rows @ a).T @ g
''')}),
]


# ------------------------------------------------------------------------------------------------
# Exercise 12: greedy and sampled acceptance, the residual, the rollback
# ------------------------------------------------------------------------------------------------

SPECULATIVE_VARIANTS = [
    honest(
        "h12_loops_over_rounds", SPECULATIVE,
        "greedy acceptance walks each round's guesses with a while loop (the rounds flattened, "
        "the answers reshaped back); the residual is p - min(p, q); sampled acceptance draws its "
        "two uniforms first, then walks guess by guess, every round at once, keeping the row to "
        "draw from as it goes; the rollback is torch.narrow",
        {"accept_greedy": Source(r'''
def accept_greedy(draft, logits):
    k, v = draft.shape[-1], logits.shape[-1]
    rounds = draft.reshape(-1, k)
    rows = logits.reshape(-1, k + 1, v)
    kept, following = [], []
    for guesses, scores in zip(rounds, rows):
        a = 0
        while a < k and scores[a].argmax() == guesses[a]:
            a += 1
        kept.append(a)
        following.append(scores[a].argmax())
    shape = draft.shape[:-1]
    return (torch.tensor(kept, dtype=torch.long).reshape(shape),
            torch.stack(following).reshape(shape))
'''),
         "residual_distribution": Source(r'''
def residual_distribution(p, q):
    """The part of p that q does not cover, rescaled to sum to 1."""
    left = p - torch.minimum(p, q)
    mass = left.sum(-1, keepdim=True)
    return torch.where(mass == 0, p, left / mass)
'''),
         "accept_sampled": Source(r'''
def accept_sampled(draft, target_logits, draft_logits, generator):
    k = draft.shape[-1]
    p = torch.softmax(target_logits, dim=-1)
    q = torch.softmax(draft_logits, dim=-1)
    u = torch.rand(draft.shape, generator=generator, dtype=p.dtype, device=p.device)
    u_draw = torch.rand(draft.shape[:-1], generator=generator, dtype=p.dtype, device=p.device)
    a = torch.zeros(draft.shape[:-1], dtype=torch.long, device=draft.device)
    alive = torch.ones(draft.shape[:-1], dtype=torch.bool, device=draft.device)
    row = p[..., k, :].clone()                        # every guess kept: the bonus row
    for i in range(k):                                # guess by guess, all rounds at once
        x = draft[..., i : i + 1]
        passed = u[..., i] * q[..., i, :].gather(-1, x)[..., 0] < p[..., i, :].gather(-1, x)[..., 0]
        stops = alive & ~passed
        row = torch.where(stops[..., None], residual_distribution(p[..., i, :], q[..., i, :]), row)
        alive = alive & passed
        a = a + alive.long()
    running = row.cumsum(dim=-1)
    running = running / running[..., -1:]
    return a, (running <= u_draw[..., None]).sum(dim=-1)
'''),
         "rollback": Source(r'''
def rollback(cache, k, a):
    a = int(a)
    rows = cache.size(-2)
    if a < 0 or a > k:
        raise ValueError(f"a = {a} is not between 0 and k = {k}")
    if rows <= k:
        raise ValueError(f"a cache of {rows} rows cannot hold the {k + 1} verified positions")
    return torch.narrow(cache, -2, 0, rows - (k - a))
''')}),
    honest(
        "h12_products_and_searchsorted", SPECULATIVE,
        "greedy acceptance as a cumulative product of agreements; the sampled rule written as "
        "u < p / q with a division; the draw by searchsorted on the normalised running sums; "
        "the residual with nan_to_num; the rollback slices with a computed slice object",
        {"accept_greedy": Source(r'''
def accept_greedy(draft, logits):
    best = torch.argmax(logits, dim=-1)                  # (..., k + 1)
    agree = (best[..., :-1] == draft).to(torch.long)
    a = torch.cumprod(agree, dim=-1).sum(dim=-1)
    return a, torch.take_along_dim(best, a.unsqueeze(-1), dim=-1).squeeze(-1)
'''),
         "residual_distribution": Source(r'''
def residual_distribution(p, q):
    excess = (p - q).clamp_min(0)
    total = excess.sum(dim=-1, keepdim=True)
    normalised = torch.nan_to_num(excess / total, nan=0.0)
    return torch.where(total > 0, normalised, p)
'''),
         "accept_sampled": Source(r'''
def accept_sampled(draft, target_logits, draft_logits, generator):
    k = draft.shape[-1]
    p = target_logits.softmax(-1)
    q = draft_logits.softmax(-1)
    u = torch.rand(draft.shape, generator=generator, dtype=p.dtype, device=p.device)
    u_draw = torch.rand(draft.shape[:-1], generator=generator, dtype=p.dtype, device=p.device)
    p_x = torch.take_along_dim(p[..., :k, :], draft.unsqueeze(-1), dim=-1).squeeze(-1)
    q_x = torch.take_along_dim(q, draft.unsqueeze(-1), dim=-1).squeeze(-1)
    passes = (u < p_x / q_x).to(torch.long)
    a = passes.cumprod(dim=-1).sum(dim=-1)
    residuals = residual_distribution(p[..., :k, :], q)
    choices = torch.cat([residuals, p[..., k:, :]], dim=-2)          # (..., k + 1, v)
    index = a[..., None, None].expand(*a.shape, 1, p.shape[-1])
    row = torch.gather(choices, -2, index).squeeze(-2)
    running = row.cumsum(-1)
    running = running / running[..., -1:]
    token = torch.searchsorted(running.contiguous(), u_draw[..., None].contiguous(), right=True)
    return a, token.squeeze(-1)
'''),
         "rollback": Source(r'''
def rollback(cache, k, a):
    a = int(a)
    if not (0 <= a <= k and cache.shape[-2] >= k + 1):
        raise ValueError(f"rollback: k = {k}, a = {a}, cache of {cache.shape[-2]} rows")
    keep = slice(0, cache.shape[-2] - k + a)
    return cache[(Ellipsis, keep, slice(None))]
''')}),
    honest(
        "h12_helpers_and_prints", SPECULATIVE,
        "a helper for each round's first failure shared by both acceptance rules; a draw helper "
        "like exercise 9's; debugging prints and a warning when a row's excess is 0; words such "
        "as 'llmcheck' and 'speculative' in docstrings",
        {"accept_greedy": Source(r'''
def first_failure(fails):
    """Index of the first True along the last axis, or its length when there is none."""
    k = fails.shape[-1]
    positions = torch.arange(k, device=fails.device).expand_as(fails)
    return torch.where(fails, positions, torch.full_like(positions, k)).amin(dim=-1)


def accept_greedy(draft, logits):
    """Greedy speculative acceptance (llmcheck watches the ops, not these words)."""
    picks = logits.argmax(-1)
    a = first_failure(picks[..., :-1] != draft)
    print("kept", a.tolist())
    return a, picks.gather(-1, a.unsqueeze(-1)).squeeze(-1)
'''),
         "residual_distribution": Source(r'''
import warnings


def residual_distribution(p, q):
    excess = torch.relu(p - q)
    total = excess.sum(-1, keepdim=True)
    if bool((total == 0).any()):
        warnings.warn("a row with p == q: its residual is p itself")
    return torch.where(total > 0, excess / torch.where(total > 0, total, 1.0), p)
'''),
         "accept_sampled": Source(r'''
def draw_with(row, u):
    running = row.cumsum(dim=-1)
    running = running / running[..., -1:]
    return (running <= u.unsqueeze(-1)).sum(dim=-1)


def accept_sampled(draft, target_logits, draft_logits, generator):
    """Speculative sampling: keep with probability min(1, p/q), then the residual."""
    k = draft.shape[-1]
    p, q = torch.softmax(target_logits, -1), torch.softmax(draft_logits, -1)
    u = torch.rand(draft.shape, generator=generator, dtype=p.dtype, device=p.device)
    u_draw = torch.rand(draft.shape[:-1], generator=generator, dtype=p.dtype, device=p.device)
    at = draft.unsqueeze(-1)
    a = first_failure(u * q.gather(-1, at).squeeze(-1) >= p[..., :k, :].gather(-1, at).squeeze(-1))
    rows = torch.cat([residual_distribution(p[..., :k, :], q), p[..., k:, :]], dim=-2)
    row = rows.gather(-2, a[..., None, None].expand(*a.shape, 1, rows.shape[-1])).squeeze(-2)
    return a, draw_with(row, u_draw)
'''),
         "rollback": Source(r'''
def rollback(cache, k, a):
    a = int(a.item()) if isinstance(a, torch.Tensor) else a
    m = cache.shape[-2]
    if a not in range(k + 1) or m < k + 1:
        raise ValueError(f"cannot roll back: a={a}, k={k}, m={m}")
    kept, _ = cache.split([m - k + a, k - a], dim=-2)
    return kept
''')}),
]


# ------------------------------------------------------------------------------------------------
# Exercise 13: routing, grouping by expert, the grouped layer
# ------------------------------------------------------------------------------------------------

DISPATCH_VARIANTS = [
    honest(
        "h13_masks_per_expert", DISPATCH,
        "the router sorts the probabilities (no topk) and renormalises with a softmax of the "
        "kept logits; the groups come from one boolean mask per expert (nonzero, a loop over "
        "the E experts), the counts from their lengths; the layer scatter-adds with scatter_add_",
        {"route": Source(r'''
def route(x, w_router, top_k):
    n_experts = w_router.shape[-1]
    if top_k < 1 or top_k > n_experts:
        raise ValueError(f"route: top_k = {top_k} for {n_experts} experts")
    logits = x @ w_router
    ordered, experts = torch.sort(logits, dim=-1, descending=True)
    return torch.softmax(ordered[:, :top_k], dim=-1), experts[:, :top_k]
'''),
         "group_by_expert": Source(r'''
def group_by_expert(experts, n_experts):
    k = experts.shape[1]
    flat = experts.flatten()
    groups = [torch.nonzero(flat == e).flatten() for e in range(n_experts)]
    pairs = torch.cat(groups)
    counts = torch.tensor([len(g) for g in groups], dtype=torch.long)
    return torch.div(pairs, k, rounding_mode="floor"), torch.remainder(pairs, k), counts
'''),
         "moe": Source(r'''
def moe(x, w_router, w_gate, w_up, w_down, top_k):
    d = x.shape[-1]
    rows = x.reshape(-1, d)
    weights, experts = route(rows, w_router, top_k)
    tokens, slots, counts = group_by_expert(experts, w_router.shape[1])
    out = torch.zeros_like(rows)
    ends = torch.cumsum(counts, 0).tolist()
    for e, end in enumerate(ends):
        start = end - int(counts[e])
        if start == end:
            continue
        who = tokens[start:end]
        y = swiglu(rows[who], w_gate[e], w_up[e], w_down[e]) * weights[who, slots[start:end]][:, None]
        out.scatter_add_(0, who[:, None].expand(-1, d), y)
    return out.reshape(x.shape)
''')}),
    honest(
        "h13_sort_keys_and_split", DISPATCH,
        "the pairs sorted by one unique key, expert * (T k) + pair number (an ordinary sort); "
        "counts by index_add_; the gathered rows split per expert with torch.split; the layer "
        "adds with index_put_(accumulate=True); the router's product is an einsum",
        {"route": Source(r'''
def route(x, w_router, top_k):
    if not isinstance(top_k, int) or not 0 < top_k <= w_router.shape[1]:
        raise ValueError("top_k %r is not between 1 and %d" % (top_k, w_router.shape[1]))
    probs = torch.einsum("td,de->te", x, w_router).softmax(dim=-1)
    values, experts = torch.topk(probs, top_k)
    return values / values.sum(-1, keepdim=True), experts
'''),
         "group_by_expert": Source(r'''
def group_by_expert(experts, n_experts):
    k = experts.shape[-1]
    flat = experts.reshape(-1)
    pairs = torch.arange(flat.numel())
    _, order = torch.sort(flat * flat.numel() + pairs)
    counts = torch.zeros(n_experts, dtype=torch.long).index_add_(0, flat, torch.ones_like(flat))
    return order // k, order % k, counts
'''),
         "moe": Source(r'''
def moe(x, w_router, w_gate, w_up, w_down, top_k):
    rows = x.reshape(-1, x.shape[-1])
    weights, experts = route(rows, w_router, top_k)
    tokens, slots, counts = group_by_expert(experts, w_router.shape[1])
    sizes = counts.tolist()
    gathered = rows[tokens].split(sizes)
    scales = weights[tokens, slots].split(sizes)
    targets = tokens.split(sizes)
    out = torch.zeros_like(rows)
    for e, (group, scale, target) in enumerate(zip(gathered, scales, targets)):
        if group.shape[0] > 0:
            y = swiglu(group, w_gate[e], w_up[e], w_down[e])
            out.index_put_((target,), scale.unsqueeze(1) * y, accumulate=True)
    return out.view(x.shape)
''')}),
    honest(
        "h13_helpers_prints_and_warnings", DISPATCH,
        "a helper that returns one expert's weighted output; a warning for an expert with no "
        "tokens; prints of the group sizes; words such as 'llmcore' and 'exercise' in docstrings",
        {"group_by_expert": Source(r'''
def group_by_expert(experts, n_experts):
    """Exercise 13, part 2 (not llmcore's): a stable argsort of the flat choices."""
    flat = experts.view(-1)
    order = flat.argsort(stable=True)
    counts = flat.bincount(minlength=n_experts)
    print("group sizes", counts.tolist())
    return order.div(experts.shape[1], rounding_mode="floor"), order.fmod(experts.shape[1]), counts
'''),
         "moe": Source(r'''
import warnings


def expert_output(rows, e, w_gate, w_up, w_down, scale):
    return scale[:, None] * swiglu(rows, w_gate[e], w_up[e], w_down[e])


def moe(x, w_router, w_gate, w_up, w_down, top_k):
    rows = x.reshape(-1, x.shape[-1])
    weights, experts = route(rows, w_router, top_k)
    tokens, slots, counts = group_by_expert(experts, w_router.shape[1])
    out = rows.new_zeros(rows.shape)
    start = 0
    for e in range(w_router.shape[1]):
        stop = start + int(counts[e])
        if stop == start:
            warnings.warn(f"expert {e} got no tokens")
            continue
        mine = tokens[start:stop]
        out.index_add_(0, mine, expert_output(rows[mine], e, w_gate, w_up, w_down,
                                              weights[mine, slots[start:stop]]))
        start = stop
    return out.reshape(*x.shape)
''')}),
]


HONEST_VARIANTS = (MATMUL_VARIANTS + RESERVED_NAME_VARIANTS + ATTENTION_VARIANTS
                   + MULTIHEAD_VARIANTS + KV_CACHE_VARIANTS
                   + BATCHING_VARIANTS + PAGED_VARIANTS + TILED_VARIANTS + BACKWARD_VARIANTS
                   + SAMPLING_VARIANTS + QUANT_VARIANTS + LORA_VARIANTS
                   + SPECULATIVE_VARIANTS + DISPATCH_VARIANTS)
"""Every honest submission, each of which must score its assignment's full marks."""


WRITES = {
    "h01_prints_and_displays": {"stdout", "display"},
    "h02_warns_on_masked_rows": {"warning"},
    "h03_prints_and_asserts": {"stdout"},
    "h04_copies_with_torch_tensor": {"warning"},
    "h04_warns_on_nothing_to_do": {"warning"},
    "h05_copies_with_torch_tensor": {"warning"},
    "h06_prints_and_displays": {"stdout", "display"},
    "h07_warns_on_one_tile": {"warning"},
    "h08_copies_with_torch_tensor": {"warning"},
    "h09_shift_first_and_searchsorted": {"stdout", "display"},
    "h09_helpers_and_a_pipeline": {"warning"},
    "h12_helpers_and_prints": {"stdout", "warning"},
    "h13_helpers_prints_and_warnings": {"stdout", "warning"},
}
"""What these variants' graded notebooks must show, since their point is that it costs nothing:
"stdout", printed output in a test cell; "warning", a warning's text in a test cell's output
(written to stderr, whatever stream the grader then shows it on); "display", a display() output
in an answer cell."""
