"""Wrong submissions of exercise 7 (online softmax and tiled attention), as test data: each
starts from the released notebook with every answer filled from solutions/ and edits one answer
cell; each states its score and exactly which test cells fail (tests/grading/mutants.py)."""

from grading_mutants import Submission, Replace, Source, Prepend, Delete  # noqa: F401

TILED = "07_tiled_attention"
TILED_CELLS = frozenset({"test_tiled_attention", "test_tiled_attention_hidden",
                         "test_tiled_memory_hidden"})

WRONG = [
    Submission(
        "sum_not_rescaled", TILED,
        "the step adds the tile's exponentials to the running sum without rescaling it when the "
        "maximum grows: every sum, softmax and attention output is wrong",
        score=0, failing=frozenset({"test_step", "test_step_hidden", "test_online_softmax",
                                    "test_online_softmax_hidden"}) | TILED_CELLS,
        edits={"online_softmax_step": Replace("new_sum = running_sum * rescale + ",
                                              "new_sum = running_sum + ")}),
    Submission(
        "no_inf_guard", TILED,
        "the step shifts by new_max even when it is -inf: a row whose scores are all -inf so far "
        "gets -inf - (-inf) = nan (attention, whose every query sees key 0, is unaffected)",
        score=11, failing=frozenset({"test_step_hidden", "test_online_softmax_hidden"}),
        edits={"online_softmax_step": Replace(
            "shift = torch.where(torch.isinf(new_max), torch.zeros_like(new_max), new_max)",
            "shift = new_max")}),
    Submission(
        "no_max_shift", TILED,
        "online_softmax sums exp(x) tile by tile without any maximum: right for small logits, "
        "inf / inf = nan for logits in the thousands",
        score=13, failing=frozenset({"test_online_softmax_hidden"}),
        edits={"online_softmax": Source('''
def online_softmax(x, block):
    total = torch.zeros(*x.shape[:-1], 1, dtype=x.dtype)
    for start in range(0, x.shape[-1], block):
        total = total + torch.exp(x[..., start:start + block]).sum(dim=-1, keepdim=True)
    return torch.exp(x) / torch.where(total == 0, torch.ones_like(total), total)
''')}),
    Submission(
        "acc_not_rescaled", TILED,
        "the accumulator is not rescaled when the maximum grows: earlier tiles' values keep "
        "weights relative to an old maximum, so the output is wrong whenever there is more than "
        "one tile",
        score=7, failing=TILED_CELLS,
        edits={"tiled_attention": Replace("acc = acc * rescale + ", "acc = acc + ")}),
    Submission(
        "divides_per_tile", TILED,
        "each tile's contribution is divided by the running sum so far instead of dividing once "
        "at the end: earlier tiles were divided by too small a sum",
        score=7, failing=TILED_CELLS,
        edits={"tiled_attention": Source('''
def tiled_attention(q, k, v, block, causal=False):
    n, m, d_head = q.shape[-2], k.shape[-2], q.shape[-1]
    q = q / math.sqrt(d_head)
    running_max = torch.full((*q.shape[:-1], 1), float("-inf"), dtype=q.dtype)
    running_sum = torch.zeros_like(running_max)
    acc = torch.zeros_like(q)
    rows = torch.arange(n).unsqueeze(-1)
    for j0 in range(0, m, block):
        j1 = min(j0 + block, m)
        scores = q @ k[..., j0:j1, :].transpose(-2, -1)
        if causal:
            scores = scores.masked_fill(torch.arange(j0, j1) > rows + (m - n), float("-inf"))
        running_max, running_sum, rescale = online_softmax_step(running_max, running_sum, scores)
        acc = acc * rescale + torch.exp(scores - running_max) @ v[..., j0:j1, :] / running_sum
    return acc
''')}),
    Submission(
        "top_left_causal", TILED,
        "the causal mask is aligned to the top-left corner (key j > query i) instead of the "
        "bottom-right (j > i + m - n): right only when n == m, as in the visible test",
        score=10, failing=frozenset({"test_tiled_attention_hidden", "test_tiled_memory_hidden"}),
        edits={"tiled_attention": Replace("cols > rows + (m - n)", "cols > rows")}),
    Submission(
        "drops_last_tile", TILED,
        "the tile loop stops before a last, shorter tile: right only when block divides m (the "
        "visible tests and the memory tests), wrong (or 0 / 0) otherwise",
        score=12, failing=frozenset({"test_tiled_attention_hidden"}),
        edits={"tiled_attention": Replace("for j0 in range(0, m, block):",
                                          "for j0 in range(0, m - block + 1, block):")}),
    Submission(
        "whole_score_matrix", TILED,
        "computes the whole (n, m) score matrix and then the softmax: the right numbers, but it "
        "allocates exactly what tiling is meant to avoid",
        score=10, failing=frozenset({"test_tiled_attention", "test_tiled_memory_hidden"}),
        edits={"tiled_attention": Source('''
def tiled_attention(q, k, v, block, causal=False):
    n, m = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])          # (..., n, m) at once
    if causal:
        future = torch.arange(m) > torch.arange(n).unsqueeze(-1) + (m - n)
        scores = scores.masked_fill(future, float("-inf"))
    return online_softmax(scores, block) @ v
''')}),
    Submission(
        "whole_causal_mask", TILED,
        "the scores are tiled, but the causal mask is built once for all (n, m) pairs and sliced "
        "per tile: an (n, m) tensor all the same, which the causal memory test refuses",
        score=13, failing=frozenset({"test_tiled_memory_hidden"}),
        edits={"tiled_attention": Source('''
def tiled_attention(q, k, v, block, causal=False):
    n, m, d_head = q.shape[-2], k.shape[-2], q.shape[-1]
    q = q / math.sqrt(d_head)
    running_max = torch.full((*q.shape[:-1], 1), float("-inf"), dtype=q.dtype)
    running_sum = torch.zeros_like(running_max)
    acc = torch.zeros_like(q)
    if causal:                                  # (n, m) bool, once for all tiles
        future = torch.arange(m) > torch.arange(n).unsqueeze(-1) + (m - n)
    for j0 in range(0, m, block):
        j1 = min(j0 + block, m)
        scores = q @ k[..., j0:j1, :].transpose(-2, -1)
        if causal:
            scores = scores.masked_fill(future[:, j0:j1], float("-inf"))
        running_max, running_sum, rescale = online_softmax_step(running_max, running_sum, scores)
        acc = acc * rescale + torch.exp(scores - running_max) @ v[..., j0:j1, :]
    return acc / running_sum
''')}),
    Submission(
        "library_tiled", TILED,
        "tiled_attention calls llmcore.tiled.tiled_attention (the library's own) instead of "
        "looping over the tiles",
        score=7, failing=TILED_CELLS,
        edits={"tiled_attention": Source('''
import llmcore.tiled

def tiled_attention(q, k, v, block, causal=False):
    return llmcore.tiled.tiled_attention(q, k, v, causal=causal, block_q=block, block_k=block)
''')}),
]
