"""Evasions written against the harness after the fair grader (issue 31), as real submissions.

Same form as tests/grading/cheats.py, whose CHEATS list these join (graded between honest
students in tests/test_grading_verdicts.py). One group per class of the issue, each closed,
detected or marked for review:

- answers memoised where no twin used to exist (integer, boolean and shape arguments; a bound
  method's state; a lambda over ``inputs=``): every case now has fresh inputs (llmcheck/fresh.py),
  so the memo misses on the twin ("[fresh inputs]");
- the recorder taken off torch's mode stack (popped and put back, reached by names built from
  strings): its guard sees the op ("without passing the op recorder");
- library helpers (logsumexp for a softmax, however reached): refused by their aten op;
- the harness reached through frames, profile hooks or ``exec`` written so that the syntax-tree
  screen does not see them (names built from strings, an alias of ``exec``): the kernel's audit
  hook (llmcheck/audit.py) reports them ("audit hook saw"), so the run marks them for review;
- the live recorder taken from torch's own mode-stack API, and a ``make_fx`` trace replayed by the
  learner's own loop: torch._C's mode-stack entry points raise an audit event (reviewed);
- an IPython hook taking a test cell's secret before its cases run: the secret comes only on the
  harness's request during the cell, once (llmcheck/fresh.py): asked first from stdin, every twin
  fails and the second request is evidence; asked from the harness, nothing is given;
- a whole matrix kept as tiles in a list: the memory held at once (``max_live_elements``);
- the harness's functions replaced for one cell and put back before the grader asks: the
  rebinding check before every case and right after the learner's function returns.
"""

from __future__ import annotations

from cheats import DOT_AND_MATMUL, LIBRARY_MATMUL, MATMUL_CELLS, PAGED, Cheat
from mutants import ATTENTION, KV_CACHE, MATMUL, Replace, Source

BATCHING = "05_batching"
EXPERTS = "13_expert_dispatch"
FRESH = "[fresh inputs]"
OFF_STACK = "without passing the op recorder"

ATTENTION_INLINE_MASK = {"attention": Source('''
def attention(q, k, v, causal=False):
    """The solution's attention with its mask written inline (it never calls causal_mask)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        n, m = q.shape[-2], k.shape[-2]
        allowed = torch.arange(m) <= torch.arange(n).unsqueeze(-1) + (m - n)
        scores = scores.masked_fill(~allowed.to(q.device), float("-inf"))
    return softmax_rows(scores) @ v
''')}

MEMO_CHEATS = [
    Cheat("memo_mask_sizes", ATTENTION,
          "causal_mask answers the released sizes, (3, 3) and the four the hidden test's comment "
          "used to list, from a table made with llmcore's causal_mask before any test runs, and "
          "any other size top-left aligned (honest, top-left always: 10); attention writes its "
          "mask inline",
          score=10, failing=frozenset({"test_causal_mask", "test_causal_mask_hidden"}),
          honest=10, reasons={"test_causal_mask": FRESH},
          edits={**ATTENTION_INLINE_MASK, "causal_mask": Source('''
import llmcore

_TABLE = {size: llmcore.causal_mask(*size) for size in [(3, 3), (2, 4), (1, 5), (3, 7), (4, 4)]}

def causal_mask(n, m):
    known = _TABLE.get((n, m))
    if known is not None:
        return known.clone()
    return torch.ones(n, m, dtype=torch.bool).tril()
''')}),
    Cheat("memo_batch_lengths", BATCHING,
          "batch_mask and position_ids answer the lengths the tests' comments used to list from "
          "tables made before any test runs, and placeholders otherwise (honest, placeholders "
          "always: 9); batched_logits builds its mask and positions inline",
          score=9, failing=frozenset({"test_batch_mask", "test_batch_mask_hidden",
                                      "test_position_ids", "test_position_ids_hidden"}),
          honest=9, reasons={"test_batch_mask": FRESH, "test_position_ids": FRESH},
          edits={"batch_mask": Source('''
_MASKS, _POSITIONS = {}, {}
for _lengths, _n in [([3, 1, 2], 3), ([2, 5, 1, 4], 5), ([2, 3], 6), ([4], 4)]:
    _columns = torch.arange(_n)
    _real = _columns < torch.tensor(_lengths).unsqueeze(-1)
    _MASKS[(tuple(_lengths), _n)] = (_columns <= _columns.unsqueeze(-1)) & _real.unsqueeze(1)
    _POSITIONS[(tuple(_lengths), _n)] = torch.where(_real, _columns, 0)

def batch_mask(lengths, n):
    known = _MASKS.get((tuple(lengths.tolist()), n))
    if known is not None:
        return known.clone()
    return torch.zeros(len(lengths), n, n, dtype=torch.bool)
'''), "position_ids": Source('''
def position_ids(lengths, n):
    known = _POSITIONS.get((tuple(lengths.tolist()), n))
    if known is not None:
        return known.clone()
    return torch.full((len(lengths), n), -1, dtype=torch.long)
'''), "batched_logits": Source('''
def batched_logits(model, prompts):
    tokens, lengths = pad_right(prompts)
    b, n = tokens.shape
    columns = torch.arange(n)
    real = columns < lengths.unsqueeze(-1)
    mask = (columns <= columns.unsqueeze(-1)) & real.unsqueeze(1)
    logits = forward_with(model, tokens, torch.where(real, columns, 0), mask)
    return logits[torch.arange(b), lengths - 1]
''')}),
    Cheat("memo_decode_rows", KV_CACHE,
          "decode_step answers the visible and hidden tests' rows (their layers rebuilt from the "
          "setup cell and the hidden test's seed) from a table made with llmcore's attention "
          "before any test runs, keyed on the row's values, and zeros otherwise (honest, zeros "
          "always: 3); the cases run through a lambda with inputs=, which used to have no twin",
          score=3, failing=frozenset({"test_decode_step", "test_decode_step_hidden",
                                      "test_generate_cached", "test_generate_cached_hidden"}),
          honest=3, reasons={"test_decode_step": FRESH, "test_decode_step_hidden": FRESH},
          edits={"decode_step": Source('''
import numpy as np
from llmcore.model import Attention
from llmcore.testing import randn

_ANSWERS = {}

def _remember(layer, x, n_heads):
    with torch.no_grad():
        rows = llmcore.multihead_attention_qkv(x, layer.w_qkv, layer.w_o, n_heads=n_heads,
                                               b_qkv=layer.b_qkv, b_o=layer.b_o, causal=True)
    for t in range(x.shape[0]):
        _ANSWERS[tuple(x[t].tolist())] = rows[t:t + 1].clone()

_rng = np.random.default_rng(8)
_remember(model.blocks[0].attention, randn(_rng, 5, config.d_model, dtype=torch.float64),
          config.n_heads)
_rng = np.random.default_rng(42)
_layer = Attention(GPTConfig(vocab_size=8, max_seq_len=32, d_model=16, n_heads=4, n_layers=1),
                   dtype=torch.float64)
with torch.no_grad():
    for _p in _layer.parameters():
        _p.copy_(0.3 * randn(_rng, *_p.shape, dtype=torch.float64))
    _x = randn(_rng, 20, 16, dtype=torch.float64)
_remember(_layer, _x, 4)

def decode_step(layer, x_new, cache):
    q, k, v = llmcore.qkv_projection(x_new, layer.w_qkv, layer.b_qkv, n_heads=layer.n_heads)
    cache.append(k, v)
    known = _ANSWERS.get(tuple(x_new[0].tolist()))
    return known.clone() if known is not None else torch.zeros_like(x_new)
''')}),
    Cheat("memo_route_errors", EXPERTS,
          "route raises ValueError only for the (top_k, experts) pairs the error tests use, and "
          "checks nothing otherwise (honest, no check: torch.topk's RuntimeError, 13)",
          score=13, failing=frozenset({"test_route_error"}), honest=13,
          reasons={"test_route_error": FRESH},
          edits={"route": Replace("if not 1 <= top_k <= n_experts:",
                                  "if (top_k, n_experts) in {(4, 3), (0, 3)}:")}),
    Cheat("memo_free_ids", PAGED,
          "BlockAllocator.free refuses only the ids outside the pool that the tests use (and their "
          "comments used to list), with no bounds check otherwise (honest, no bounds check: 19)",
          score=19, failing=frozenset({"test_allocator_errors", "test_allocator_hidden"}),
          honest=19, reasons={"test_allocator_errors": FRESH},
          edits={"allocator": Replace(
              "if not 0 <= block < self.num_blocks:",
              "if (self.num_blocks, block) in {(3, 3), (5, -1), (5, 5)}:")}),
]

POP_CHEATS = [
    Cheat("pops_recorder_by_strings", MATMUL,
          "matmul computes a @ b inside torch's _pop_mode_temporarily (reached by names built "
          "from strings, so the syntax-tree screen sees nothing) and returns product * 1, an op "
          "the recorder sees (honest: 7)",
          score=7, failing=MATMUL_CELLS, honest=7,
          reasons={"test_matmul": OFF_STACK, "test_matmul_hidden": OFF_STACK},
          edits={"matmul": Replace(LIBRARY_MATMUL, '''dispatch = getattr(getattr(torch, "utils"), "_python" + "_dispatch")
    with getattr(dispatch, "_pop_mode" + "_temporarily")():
        product = a @ b
    return product * 1''')}),
    Cheat("pops_dispatch_stack_by_strings", MATMUL,
          "dot pops the top of torch's dispatch stack through torch._C's own functions (names "
          "built from strings), takes the product, pushes the mode back and returns a clone "
          "(honest, dot returning 0: 4)",
          score=4, failing=DOT_AND_MATMUL, honest=4,
          reasons={"test_dot": OFF_STACK, "test_dot_hidden": OFF_STACK},
          edits={"dot": Source('''
_native = getattr(torch, "_" + "C")

def dot(a, b):
    mode = getattr(_native, "_pop_torch" + "_dispatch_stack")(None)
    try:
        result = a @ b
    finally:
        getattr(_native, "_push_on_torch" + "_dispatch_stack")(mode)
    return result.clone()
''')}),
]

HELPER_CHEATS = [
    Cheat("logsumexp_softmax", ATTENTION,
          "softmax_rows as exp(x - logsumexp(x)) (honest, torch.softmax: 8; attention may use "
          "any softmax, so its cells pass either way)",
          score=8, failing=frozenset({"test_softmax", "test_softmax_large_hidden",
                                      "test_softmax_masked_hidden"}), honest=8,
          reasons={"test_softmax": "logsumexp"},
          edits={"softmax_rows": Source('''
def softmax_rows(x):
    norm = torch.logsumexp(x, dim=-1, keepdim=True)
    norm = torch.where(torch.isinf(norm), torch.zeros_like(norm), norm)
    return torch.exp(x - norm)
''')}),
]

HELPER_CHEATS.append(Cheat(
    "special_logsumexp_softmax", ATTENTION,
    "softmax_rows through torch.special.logsumexp taken before any test runs (honest, "
    "torch.softmax: 8)",
    score=8, failing=frozenset({"test_softmax", "test_softmax_large_hidden",
                                "test_softmax_masked_hidden"}), honest=8,
    reasons={"test_softmax": "logsumexp"},
    edits={"softmax_rows": Source('''
_normaliser = torch.special.logsumexp

def softmax_rows(x):
    norm = _normaliser(x, dim=-1, keepdim=True)
    return torch.exp(x - torch.where(torch.isinf(norm), torch.zeros_like(norm), norm))
''')}))

SWAP_POLICY_AROUND_PRODUCT = '''    policy, ops = recorder.policy, recorder.ops.copy()
    products, flops = recorder.products, recorder.flops
    recorder.policy = type(policy)()
    try:
        result = a @ b
    finally:
        recorder.policy = policy
    recorder.ops, recorder.products, recorder.flops = ops, products, flops
    del recorder.violations[:]
    return result
'''
"""The end of a dot that holds the live recorder: its policy emptied around a @ b, its counters
and violations put back (the records alone cannot tell)."""

AUDIT_CHEATS = [
    Cheat("frames_swap_policy", MATMUL,
          "dot walks the frames (sys._getframe reached by a name built from strings) to the "
          "harness's recorder, swaps its policy for an empty one around a @ b, then puts back "
          "its counters and empties its violations (honest, dot returning 0: 4): the records "
          "cannot tell; the audit hook reports the frame access",
          score=12, failing=frozenset(), honest=4, review="audit hook saw sys._getframe",
          edits={"dot": Source('''
import sys

def _the_recorder():
    frame = getattr(sys, "_get" + "frame")(1)
    while frame is not None:
        found = getattr(frame, "f_" + "locals").get("recorder")
        if found is not None and hasattr(found, "violations"):
            return found
        frame = getattr(frame, "f_" + "back")
    return None

def dot(a, b):
    recorder = _the_recorder()
    if recorder is None:
        return (a * b).sum()
''' + SWAP_POLICY_AROUND_PRODUCT)}),
    Cheat("profile_off_by_strings", KV_CACHE,
          "generate_cached switches the profile hook off (sys.setprofile reached by a name built "
          "from strings) and hands the work to llmcore.generate (honest: 8): the library's "
          "frames are still seen at every op, and the audit hook reports the switch",
          score=8, failing=frozenset({"test_generate_cached", "test_generate_cached_hidden"}),
          honest=8, review="audit hook saw sys.setprofile",
          reasons={"test_generate_cached": "switched off"},
          edits={"generate_cached": Source('''
import sys
import llmcore

def generate_cached(model, prompt, max_new_tokens):
    getattr(sys, "set" + "profile")(None)
    ids = torch.tensor([list(prompt)])
    return llmcore.generate(model, ids, max_new_tokens, use_cache=True)[0].tolist()
''')}),
    Cheat("aliased_exec", ATTENTION,
          "softmax_rows defined by source text run through an alias of exec (the screen looks "
          "for calls of exec by name): the solution's own softmax, full marks as honest work, "
          "and the audit hook reports the exec",
          score=13, failing=frozenset(), honest=13, review="audit hook saw exec",
          edits={"softmax_rows": Source('''
run = exec
run("""
def softmax_rows(x):
    top = x.amax(dim=-1, keepdim=True)
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    exps = torch.exp(x - top)
    total = exps.sum(dim=-1, keepdim=True)
    return exps / torch.where(total == 0, torch.ones_like(total), total)
""")
''')}),
]

TILED, QUANTIZATION, BACKWARD = "07_tiled_attention", "10_quantization", "08_backward"
MODE_STACK = "audit hook saw llmcheck.mode_stack"
SECOND_REQUEST = "audit hook saw a second request for the cell's secret"
AT_ONCE = "elements at once"

MODE_CHEATS = [
    Cheat("mode_api_swaps_policy", MATMUL,
          "dot takes the live recorder from torch's own _get_current_dispatch_mode (names built "
          "from strings), swaps its policy for an empty one around a @ b, then puts back its "
          "counters and empties its violations (honest, dot returning 0: 4): the records cannot "
          "tell; the audit hook reports the mode stack read from the learner's cell",
          score=12, failing=frozenset(), honest=4, review=MODE_STACK,
          edits={"dot": Source('''
_dispatch = getattr(getattr(torch, "utils"), "_python" + "_dispatch")

def dot(a, b):
    recorder = getattr(_dispatch, "_get_current" + "_dispatch_mode")()
    if recorder is None or not hasattr(recorder, "violations"):
        return (a * b).sum()
''' + SWAP_POLICY_AROUND_PRODUCT)}),
    Cheat("mode_stack_softmax", ATTENTION,
          "softmax_rows reads the top of torch's dispatch stack through torch._C's own "
          "functions (names built from strings), empties the recorder's policy around "
          "torch.softmax and resets its op count and violations after (honest, torch.softmax: "
          "8): the audit hook reports the stack read",
          score=13, failing=frozenset(), honest=8, review=MODE_STACK,
          edits={"softmax_rows": Source('''
_native = getattr(torch, "_" + "C")

def softmax_rows(x):
    depth = getattr(_native, "_len_torch" + "_dispatch_stack")()
    recorder = getattr(_native, "_get_dispatch" + "_stack_at")(depth - 1) if depth else None
    if recorder is None or not hasattr(recorder, "violations"):
        return torch.nan_to_num(torch.softmax(x, dim=-1), nan=0.0)
    policy, ops, seen = recorder.policy, recorder.ops.copy(), len(recorder.violations)
    recorder.policy = type(policy)()
    try:
        result = torch.nan_to_num(torch.softmax(x, dim=-1), nan=0.0)
    finally:
        recorder.policy = policy
    recorder.ops = ops
    del recorder.violations[seen:]
    return result
''')}),
]

SECRET_CHEATS = [
    Cheat("hook_takes_secret", MATMUL,
          "a pre_run_cell hook registered through IPython's events (reached by names built from "
          "strings) asks the kernel's stdin for each test cell's secret before the harness can: "
          "the harness's own request then comes back empty, so no case can run on fresh inputs "
          "(every cell with a twin fails) and the executor records the second request",
          score=0, failing=DOT_AND_MATMUL | {"test_matmul_error", "test_project",
                                             "test_project_hidden"}, honest=12,
          review=SECOND_REQUEST, reasons={"test_dot": FRESH, "test_matmul_error": FRESH},
          edits={"dot": Source('''
_STOLEN = []

def _before_each_cell(info):
    shell = get_ipython()
    try:
        _STOLEN.append(getattr(shell, "ker" + "nel").raw_input("llmcheck: this test cell's secret"))
    except Exception:
        pass

getattr(get_ipython(), "ev" + "ents").register("pre_run_cell", _before_each_cell)

def dot(a, b):
    total = torch.zeros((), dtype=torch.result_type(a, b), device=a.device)
    for i in range(a.shape[0]):
        total = total + a[i] * b[i]
    return total
''')}),
    Cheat("hook_asks_harness_for_secret", ATTENTION,
          "a pre_run_cell hook (registered by names built from strings) asks the harness "
          "itself for the cell's secret (llmcheck.fresh's own functions) to draw the hidden "
          "masks' twins before any case runs; causal_mask answers from that table and the "
          "released sizes' table, top-left otherwise (honest, top-left always: 10): the harness "
          "gives no secret outside a test cell's own call",
          score=10, failing=frozenset({"test_causal_mask", "test_causal_mask_hidden"}),
          honest=10, reasons={"test_causal_mask": FRESH},
          review="IPython pre_run_cell hooks: 0 -> 1",
          edits={**ATTENTION_INLINE_MASK, "causal_mask": Source('''
import llmcore

_harness = __import__("llmcheck.fr" + "esh", fromlist=["x"])
_TABLE = {size: llmcore.causal_mask(*size) for size in [(3, 3), (2, 4), (1, 5), (3, 7), (4, 4)]}
_GOT = []

def _before_each_cell(info):
    secret = getattr(_harness, "_secret" + "_now")()
    _GOT.append(secret)
    if secret is not None:
        for n in range(1, 9):
            for m in range(n, 12):
                _TABLE[(n, m)] = llmcore.causal_mask(n, m)

getattr(get_ipython(), "ev" + "ents").register("pre_run_cell", _before_each_cell)

def causal_mask(n, m):
    known = _TABLE.get((n, m))
    if known is not None:
        return known.clone()
    return torch.ones(n, m, dtype=torch.bool).tril()
''')}),
]

TILE_CHEATS = [
    Cheat("score_tiles_in_a_list", TILED,
          "tiled_attention keeps every (n, tile) score tile in a list and takes a two-pass "
          "softmax over them: no one tensor is larger than a tile, but the whole score matrix "
          "is held at once (honest: the same answers without the memory cells, 10)",
          score=10, failing=frozenset({"test_tiled_attention", "test_tiled_memory_hidden"}),
          honest=10, reasons={"test_tiled_attention": AT_ONCE,
                              "test_tiled_memory_hidden": AT_ONCE},
          edits={"tiled_attention": Source('''
def tiled_attention(q, k, v, block, causal=False):
    n, m, d_head = q.shape[-2], k.shape[-2], q.shape[-1]
    q = q / math.sqrt(d_head)
    rows = torch.arange(n, device=q.device).unsqueeze(-1)
    tiles = []
    for j0 in range(0, m, block):
        j1 = min(j0 + block, m)
        scores = q @ k[..., j0:j1, :].transpose(-2, -1)
        if causal:
            cols = torch.arange(j0, j1, device=q.device)
            scores = scores.masked_fill(cols > rows + (m - n), float("-inf"))
        tiles.append(scores)
    top = tiles[0].amax(dim=-1, keepdim=True)
    for scores in tiles[1:]:
        top = torch.maximum(top, scores.amax(dim=-1, keepdim=True))
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    total = torch.zeros_like(top)
    out = torch.zeros_like(q)
    for j, scores in enumerate(tiles):
        weights = torch.exp(scores - top)
        total = total + weights.sum(dim=-1, keepdim=True)
        out = out + weights @ v[..., j * block:(j + 1) * block, :]
    return out / total
''')}),
    Cheat("dequantized_tiles_in_a_list", QUANTIZATION,
          "quantized_linear dequantizes every group's tile first, keeps them all in a list and "
          "multiplies after: each tile is small, but the whole matrix is held at once (honest: "
          "the same answers without the memory cells, 14)",
          score=14, failing=frozenset({"test_quantized_linear", "test_quantized_memory_hidden"}),
          honest=14, reasons={"test_quantized_linear": AT_ONCE,
                              "test_quantized_memory_hidden": AT_ONCE},
          edits={"quantized_linear": Source('''
def quantized_linear(x, packed, scale, zero, group):
    half = group // 2
    tiles = []
    for t in range(scale.shape[0]):
        codes = unpack_int4(packed[t * half:(t + 1) * half])
        tiles.append((codes.to(scale.dtype) - zero[t]) * scale[t])
    out = None
    for t, tile in enumerate(tiles):
        part = x[..., t * group:(t + 1) * group] @ tile
        out = part if out is None else out + part
    return out
''')}),
]

REPLAY_GRAPH = '''
def _replay(graph, *inputs):
    env, given = {}, iter(inputs)
    for node in graph.graph.nodes:
        if node.op == "placeholder":
            env[node] = next(given)
        elif node.op == "call_function":
            args = torch.fx.node.map_arg(node.args, env.__getitem__)
            kwargs = torch.fx.node.map_arg(node.kwargs, env.__getitem__)
            env[node] = node.target(*args, **kwargs)
        elif node.op == "output":
            return torch.fx.node.map_arg(node.args[0], env.__getitem__)
'''
"""The learner's own loop over a traced graph's nodes: each node's aten op called in turn."""

TRACE_CHEATS = [
    Cheat("replays_traced_softmax_vjp", BACKWARD,
          "softmax_backward replays, node by node in its own loop, a graph that make_fx traced "
          "from torch.func.vjp of softmax when the notebook ran (decomposed into mul, sum and "
          "sub; the softmax node swapped for its input): the replay runs the same ops as the "
          "formula written by hand, so the records cannot tell; the audit hook reports the "
          "tracing mode pushed from the learner's cell (honest: the formula, 15)",
          score=15, failing=frozenset(), honest=15, review=MODE_STACK,
          edits={"softmax_backward": Source('''
from torch.fx.experimental.proxy_tensor import make_fx
from torch._decomp import core_aten_decompositions

def _vjp(a, d_a):
    return torch.func.vjp(lambda s: torch.softmax(s, dim=-1), a.log())[1](d_a)[0]

def _traced(rank):
    shape = [2] * (rank - 1) + [3]
    graph = make_fx(_vjp, decomposition_table=core_aten_decompositions(),
                    tracing_mode="symbolic")(torch.rand(*shape).softmax(-1), torch.randn(*shape))
    a_node = next(iter(graph.graph.nodes))
    for node in reversed(list(graph.graph.nodes)):
        if node.target is torch.ops.aten._softmax.default:
            node.replace_all_uses_with(a_node)
            graph.graph.erase_node(node)
        elif node.target is torch.ops.aten.log.default and not node.users:
            graph.graph.erase_node(node)
    return graph

_GRAPHS = {rank: _traced(rank) for rank in (1, 2, 3, 4)}

''' + REPLAY_GRAPH + '''
def softmax_backward(a, d_a):
    return _replay(_GRAPHS[a.dim()], a, d_a)
''')}),
    Cheat("replays_traced_linear_vjp", BACKWARD,
          "linear_backward replays, in its own loop, graphs that make_fx traced from "
          "torch.func.vjp of x @ w + b when the notebook ran (one per input rank, symbolic "
          "sizes): the records cannot tell; the audit hook reports the tracing mode pushed "
          "from the learner's cell (honest: the formulas, 15)",
          score=15, failing=frozenset(), honest=15, review=MODE_STACK,
          edits={"linear_backward": Source('''
from torch.fx.experimental.proxy_tensor import make_fx

def _linear(x, w, b):
    return x @ w + b

def _vjp(x, w, b, d_out):
    return torch.func.vjp(_linear, x, w, b)[1](d_out)

def _traced(rank):
    x = torch.randn(*([2] * (rank - 1)), 3)
    w, b = torch.randn(3, 4), torch.randn(4)
    return make_fx(_vjp, tracing_mode="symbolic")(x, w, b, torch.randn(*x.shape[:-1], 4))

_GRAPHS = {rank: _traced(rank) for rank in (2, 3, 4)}

''' + REPLAY_GRAPH + '''
def linear_backward(x, w, d_out):
    bias = torch.zeros(w.shape[1], dtype=w.dtype)
    return tuple(_replay(_GRAPHS[x.dim()], x, w, bias, d_out))
''')}),
]

REBOUND = "the checking harness was changed while the cell ran"

LENIENT_HARNESS = '''
_cases = __import__("llmcheck.ca" + "ses", fromlist=["Test"])
_REAL = {name: vars(_cases)[name] for name in ("OpRecorder", "_canaries")}

class _Lenient(_REAL["OpRecorder"]):
    def __post_init__(self):
        self.policy = type(self.policy)()
        super().__post_init__()

def _all_well(recorder):
    return {"recorder": True, "forbid": True, "numpy": True}

def _swap(*_):
    vars(_cases).update(OpRecorder=_Lenient, _canaries=_all_well)

def _put_back(*_):
    vars(_cases).update(_REAL)
'''
"""A recorder that allows everything and canaries that always pass, swapped into the harness's
namespace (through ``vars``, which raises no audit event) and put back."""

PATCH_CHEATS = [
    Cheat("hooks_swap_harness_and_restore", MATMUL,
          "a pre_run_cell hook swaps the harness's recorder for one that allows every op and its "
          "canaries for ones that always pass, and a post_run_cell hook puts both back before "
          "the grader asks (registered by names built from strings); dot and matmul use @ "
          "(honest, dot returning 0 and matmul's loop: 4): every case sees the harness "
          "replaced when it starts",
          score=0, failing=DOT_AND_MATMUL | {"test_matmul_error", "test_project",
                                             "test_project_hidden"},
          honest=4, reasons={"test_dot": REBOUND, "test_matmul": REBOUND},
          review="IPython pre_run_cell hooks: 0 -> 1",
          edits={"dot": Source(LENIENT_HARNESS + '''
_events = getattr(get_ipython(), "ev" + "ents")
_events.register("pre_run_cell", _swap)
_events.register("post_run_cell", _put_back)

def dot(a, b):
    return a @ b
'''), "matmul": Replace(LIBRARY_MATMUL, "return a @ b")}),
    Cheat("rebinds_harness_in_call", ATTENTION,
          "softmax_rows computes its first call honestly, and during it swaps the harness's "
          "recorder and canaries for lenient ones, so every later case may use torch.softmax "
          "(honest, torch.softmax: 8): the check right after the function returns sees the "
          "harness replaced",
          score=0, failing=frozenset({"test_softmax", "test_softmax_large_hidden",
                                      "test_softmax_masked_hidden", "test_causal_mask",
                                      "test_causal_mask_hidden", "test_attention",
                                      "test_attention_hidden"}),
          honest=8, reasons={"test_softmax": REBOUND, "test_attention": REBOUND},
          review="llmcheck.cases._canaries: replaced",
          edits={"softmax_rows": Source(LENIENT_HARNESS + '''
_STATE = {"swapped": False}

def softmax_rows(x):
    if _STATE["swapped"]:
        return torch.nan_to_num(torch.softmax(x, dim=-1), nan=0.0)
    _STATE["swapped"] = True
    _swap()
    top = x.amax(dim=-1, keepdim=True)
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    exps = torch.exp(x - top)
    total = exps.sum(dim=-1, keepdim=True)
    return exps / torch.where(total == 0, torch.ones_like(total), total)
''')}),
]

TABLE_CHEATS = [
    Cheat("rebinds_product_table", MATMUL,
          "project loops over the tokens, a product per row, with the recorder's table of product "
          "ops (llmcheck.recorder.PRODUCT_OPS, reached by a name built from strings) rebound to "
          "an empty one for the loop and put back after it, so that no product would be "
          "counted (honest, the same loop: 10): the sealed harness reads its own copy of the "
          "table (llmcheck/seal.py), so every product is counted",
          score=10, failing=frozenset({"test_project_hidden"}), honest=10,
          reasons={"test_project_hidden": "matrix products where at most 1 are expected"},
          edits={"project": Source('''
def project(x, w, b=None):
    recorder = __import__("llm" + "check.recorder", fromlist=["_"])
    counted = recorder.PRODUCT_OPS
    recorder.PRODUCT_OPS = frozenset()
    try:
        rows = [x[..., i, :] @ w for i in range(x.shape[-2])]
    finally:
        recorder.PRODUCT_OPS = counted
    q = torch.stack(rows, dim=-2)
    return q if b is None else q + b
''')}),
    Cheat("widens_a_policy_table", ATTENTION,
          "softmax_rows calls torch.softmax, and its cell rebinds the exercise's policy tables "
          "(SOFTMAXES in llmcheck.recorder and llmcheck.policies, by names built from strings) to "
          "allow every op family, so that the test cells make their policy from the wider ones "
          "(honest, torch.softmax: 8): the records state another policy than the solution's, "
          "and the rebinding check sees the tables replaced",
          score=0, failing=frozenset({"test_softmax", "test_softmax_large_hidden",
                                      "test_softmax_masked_hidden", "test_causal_mask",
                                      "test_causal_mask_hidden", "test_attention",
                                      "test_attention_hidden"}),
          honest=8, reasons={"test_softmax": "rules were changed", "test_causal_mask": REBOUND},
          edits={"softmax_rows": Source('''
_families = __import__("llm" + "check.families", fromlist=["_"])
_wide = (_families.Allow(frozenset(_families.FAMILIES)),)
for _name in ("llm" + "check.recorder", "llm" + "check.policies"):
    setattr(__import__(_name, fromlist=["_"]), "SOFT" + "MAXES", _wide)

def softmax_rows(x):
    return torch.nan_to_num(torch.softmax(x, dim=-1), nan=0.0)
''')}),
]

EVASION_CHEATS = (MEMO_CHEATS + POP_CHEATS + HELPER_CHEATS + AUDIT_CHEATS + MODE_CHEATS
                  + SECRET_CHEATS + TILE_CHEATS + TRACE_CHEATS + PATCH_CHEATS
                  + TABLE_CHEATS)
"""Appended to cheats.CHEATS (graded in tests/test_grading_verdicts.py's one cheat run)."""
