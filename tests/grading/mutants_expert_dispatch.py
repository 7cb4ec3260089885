"""Wrong submissions of exercise 13 (13_expert_dispatch): the router, grouping the (token, choice)
pairs by expert and the grouped layer, as test data.

Same form as tests/grading/mutants.py: each starts from the released notebook with every answer
filled from solutions/, applies cell-level edits keyed by grade_id, and states its score and the
test cells that fail (all others pass). Points: test_route 2, _error 1, _hidden 2;
test_group_by_expert 2, _hidden 2; test_moe 2, _hidden 3 (14). moe calls the learner's route and
group_by_expert, so their mistakes cost the layer's cells too.
"""

from grading_mutants import Submission, Replace, Source, Prepend, Delete   # noqa: F401

DISPATCH = "13_expert_dispatch"

ROUTE = frozenset({"test_route", "test_route_hidden"})
GROUP = frozenset({"test_group_by_expert", "test_group_by_expert_hidden"})
LAYER = frozenset({"test_moe", "test_moe_hidden"})

RETURN_ROUTE = "return best / best.sum(dim=-1, keepdim=True), experts"
SCATTER = "out.index_add_(0, chosen, scale[start:start + count, None] * y)"

WRONG = [
    Submission(
        "route_not_renormalised", DISPATCH,
        "the k probabilities are returned as they are, not divided by their sum (right only "
        "for k = E)",
        score=5, failing=ROUTE | LAYER,
        edits={"route": Replace(RETURN_ROUTE, "return best, experts")}),
    Submission(
        "route_softmax_over_tokens", DISPATCH,
        "the softmax runs down the tokens (dim=0) instead of across the experts",
        score=5, failing=ROUTE | LAYER,
        edits={"route": Replace("torch.softmax(x @ w_router, dim=-1)",
                                "torch.softmax(x @ w_router, dim=0)")}),
    Submission(
        "route_least_probable", DISPATCH,
        "topk(largest=False): each token goes to its least probable experts",
        score=5, failing=ROUTE | LAYER,
        edits={"route": Replace("probs.topk(top_k, dim=-1)",
                                "probs.topk(top_k, dim=-1, largest=False)")}),
    Submission(
        "route_no_check", DISPATCH,
        "no check of top_k: 0 gives empty rows (0 / 0), E + 1 fails inside torch.topk with its "
        "RuntimeError, not the ValueError that says which top_k came",
        score=13, failing=frozenset({"test_route_error"}),
        edits={"route": Replace("if not 1 <= top_k <= n_experts:", "if False:")}),
    Submission(
        "group_pair_numbers_as_tokens", DISPATCH,
        "tokens are the pair numbers t k + j, not the tokens t (the same only when k = 1)",
        score=5, failing=GROUP | LAYER,
        edits={"group_by_expert": Replace("return order // top_k, order % top_k, counts",
                                          "return order, order % top_k, counts")}),
    Submission(
        "group_not_sorted", DISPATCH,
        "the pairs are listed in their flat order, never grouped by expert: each expert then "
        "gets the wrong tokens",
        score=5, failing=GROUP | LAYER,
        edits={"group_by_expert": Replace("order = torch.argsort(flat, stable=True)",
                                          "order = torch.arange(flat.numel())")}),
    Submission(
        "group_counts_by_a_loop", DISPATCH,
        "the counts come from a Python loop over the T k pairs: the right numbers, but work "
        "that grows with the tokens, op by op",
        score=9, failing=frozenset({"test_group_by_expert_hidden", "test_moe_hidden"}),
        edits={"group_by_expert": Replace(
            "counts = torch.bincount(flat, minlength=n_experts)",
            "counts = torch.zeros(n_experts, dtype=torch.long)\n"
            "    for e in flat:\n"
            "        counts[e] += 1")}),
    Submission(
        "moe_assigns_instead_of_adding", DISPATCH,
        "out[chosen] = ... instead of index_add_: a token's second expert overwrites its first",
        score=9, failing=LAYER,
        edits={"moe": Replace(SCATTER,
                              "out[chosen] = scale[start:start + count, None] * y")}),
    Submission(
        "moe_first_weight_for_every_pair", DISPATCH,
        "every pair is weighted by its token's first weight, weights[token, 0], not its own slot",
        score=9, failing=LAYER,
        edits={"moe": Replace("scale = weights[tokens, slots]", "scale = weights[tokens, 0]")}),
    Submission(
        "moe_unweighted", DISPATCH,
        "the experts' outputs are added without their weights",
        score=9, failing=LAYER,
        edits={"moe": Replace(SCATTER, "out.index_add_(0, chosen, y)")}),
    Submission(
        "moe_dense", DISPATCH,
        "every expert runs on every token and a (T, E) gate matrix zeroes the unchosen ones: the "
        "same numbers at E / k times the work",
        score=11, failing=frozenset({"test_moe_hidden"}),
        edits={"moe": Source(r'''
def moe(x, w_router, w_gate, w_up, w_down, top_k):
    rows = x.reshape(-1, x.shape[-1])
    weights, experts = route(rows, w_router, top_k)
    gates = torch.zeros(rows.shape[0], w_router.shape[1], dtype=rows.dtype)
    gates.scatter_(1, experts, weights)                            # (T, E)
    out = torch.zeros_like(rows)
    for e in range(w_router.shape[1]):
        out += gates[:, e:e + 1] * swiglu(rows, w_gate[e], w_up[e], w_down[e])
    return out.reshape(x.shape)
''')}),
    Submission(
        "moe_token_loop", DISPATCH,
        "the layer loops over tokens, one SwiGLU per (token, choice) pair: moe_loop again, "
        "with the router run once",
        score=11, failing=frozenset({"test_moe_hidden"}),
        edits={"moe": Source(r'''
def moe(x, w_router, w_gate, w_up, w_down, top_k):
    rows = x.reshape(-1, x.shape[-1])
    weights, experts = route(rows, w_router, top_k)
    out = torch.zeros_like(rows)
    for t in range(rows.shape[0]):
        for j in range(top_k):
            e = int(experts[t, j])
            out[t] += weights[t, j] * swiglu(rows[t:t + 1], w_gate[e], w_up[e], w_down[e])[0]
    return out.reshape(x.shape)
''')}),
    Submission(
        "moe_library", DISPATCH,
        "the layer calls llmcore's moe (refused)",
        score=9, failing=LAYER,
        edits={"moe": Replace(
            "rows = x.reshape(-1, x.shape[-1])                               # (T, d)\n",
            "from llmcore.moe import moe as library_moe\n"
            "    return library_moe(x, w_router, w_gate, w_up, w_down, top_k=top_k)\n")}),
    Submission(
        "moe_batch_not_flattened", DISPATCH,
        "x is used as it comes: right for (T, d), but a batch (b, n, d) is routed and gathered "
        "along the wrong axis",
        score=11, failing=frozenset({"test_moe_hidden"}),
        edits={"moe": Replace("rows = x.reshape(-1, x.shape[-1]) ", "rows = x ")}),
]
