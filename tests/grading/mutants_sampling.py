"""Wrong submissions of exercise 9 (09_sampling): temperature, top-k, top-p, drawing with a
generator, and sampling, as test data.

Same form as tests/grading/mutants.py: each starts from the released notebook with every answer
filled from solutions/, applies cell-level edits keyed by grade_id, and states its score and the
test cells that fail (all others pass). Points: test_temperature 2, _hidden 2; test_top_k 2,
_hidden 2; test_top_p 2, _hidden 2; test_draw 2, _hidden 2; test_sample 2, _hidden 3 (21).
`sample` calls the learner's own filters and draw, so a wrong filter or draw also costs the
sample tests that use it.
"""

from grading_mutants import Submission, Replace, Source, Prepend, Delete   # noqa: F401

SAMPLING = "09_sampling"

TEMPERATURE = frozenset({"test_temperature", "test_temperature_hidden"})
TOP_K = frozenset({"test_top_k", "test_top_k_hidden"})
TOP_P = frozenset({"test_top_p", "test_top_p_hidden"})
DRAW = frozenset({"test_draw", "test_draw_hidden"})
SAMPLE = frozenset({"test_sample", "test_sample_hidden"})

WRONG = [
    Submission(
        "temperature_multiplies", SAMPLING,
        "multiplies the logits by T instead of dividing: right at T = 1 only, sharper where it "
        "should be flatter",
        score=17, failing=TEMPERATURE,
        edits={"temperature_probs": Replace("torch.softmax(logits / temperature, dim=-1)",
                                            "torch.softmax(logits * temperature, dim=-1)")}),
    Submission(
        "temperature_unstable_softmax", SAMPLING,
        "exp(logits / T) divided by its sum, without subtracting the row maximum: right for small "
        "logits, inf / inf = nan for logits in the thousands",
        score=19, failing=frozenset({"test_temperature_hidden"}),
        edits={"temperature_probs": Replace(
            "return torch.softmax(logits / temperature, dim=-1)",
            "exps = torch.exp(logits / temperature)\n"
            "    return exps / exps.sum(dim=-1, keepdim=True)")}),
    Submission(
        "greedy_splits_ties", SAMPLING,
        "at T = 0 the mass is shared equally by every tied maximum (the limit of the softmax) "
        "instead of going to the first of them, as greedy decoding's argmax does",
        score=19, failing=frozenset({"test_temperature_hidden"}),
        edits={"temperature_probs": Replace(
            "best = logits.argmax(dim=-1, keepdim=True)",
            "top = (logits == logits.amax(dim=-1, keepdim=True)).to(logits.dtype)\n"
            "        return top / top.sum(dim=-1, keepdim=True)")}),
    Submission(
        "top_k_drops_ties", SAMPLING,
        "keeps exactly k tokens, the first k of a sort, so a token tied with the k-th largest "
        "logit is dropped (or kept) by the sort's order instead of kept",
        score=19, failing=frozenset({"test_top_k_hidden"}),
        edits={"top_k_filter": Replace(
            "ordered = logits.sort(dim=-1, descending=True).values",
            "order = logits.sort(dim=-1, descending=True).indices[..., :k]\n"
            "    keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order, True)\n"
            "    return logits.masked_fill(~keep, float('-inf'))\n"
            "    ordered = logits.sort(dim=-1, descending=True).values")}),
    Submission(
        "top_k_off_by_one", SAMPLING,
        "takes the threshold at index k of the sorted row instead of k - 1: keeps k + 1 tokens, "
        "and fails on an index when k >= v",
        score=12, failing=TOP_K | SAMPLE,
        edits={"top_k_filter": Replace("kth = ordered[..., min(k, v) - 1 : min(k, v)]",
                                       "kth = ordered[..., k : k + 1]")}),
    Submission(
        "top_k_with_topk", SAMPLING,
        "takes the k-th largest from torch.topk, which the exercise refuses (sorting is the "
        "allowed way); sample, which calls the filter, fails wherever top_k is given",
        score=12, failing=TOP_K | SAMPLE,
        edits={"top_k_filter": Replace(
            "kth = ordered[..., min(k, v) - 1 : min(k, v)]",
            "kth = logits.topk(min(k, v), dim=-1).values[..., -1:]")}),
    Submission(
        "top_p_drops_the_crossing_token", SAMPLING,
        "keeps the tokens whose running sum is still <= p: drops the token that makes the mass "
        "reach p, and leaves a row empty (all -inf) when its top token alone exceeds p",
        score=14, failing=TOP_P | frozenset({"test_sample_hidden"}),
        edits={"top_p_filter": Source('''
def top_p_filter(logits, p):
    if not 0 < p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {p}")
    probs = torch.softmax(logits, dim=-1)
    ordered, order = probs.sort(dim=-1, descending=True)
    keep_sorted = ordered.cumsum(dim=-1) <= p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return logits.masked_fill(~keep, float("-inf"))
''')}),
    Submission(
        "top_p_one_left_to_the_rule", SAMPLING,
        "p = 1 goes through the rule like any other p: in float32 the running sum of 50,000 "
        "probabilities reaches 1.0 before the end, and the last tokens are dropped",
        score=19, failing=frozenset({"test_top_p_hidden"}),
        edits={"top_p_filter": Replace(
            "    if p == 1:\n        return logits.clone()                                           "
            "# the filter is off\n", "")}),
    Submission(
        "top_p_drops_ties", SAMPLING,
        "keeps exactly the smallest prefix of a sort: a token as probable as the nucleus' last "
        "one is kept or dropped by the sort's order instead of kept",
        score=19, failing=frozenset({"test_top_p_hidden"}),
        edits={"top_p_filter": Replace(
            "smallest = ordered.gather(-1, count - 1)",
            "order = probs.sort(dim=-1, descending=True).indices\n"
            "    ranks = torch.arange(probs.shape[-1]).expand_as(probs)\n"
            "    keep = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, ranks < count)\n"
            "    return logits.masked_fill(~keep, float('-inf'))\n"
            "    smallest = ordered.gather(-1, count - 1)")}),
    Submission(
        "top_p_unstable_softmax", SAMPLING,
        "the nucleus' probabilities as exp(logits) over their sum, without the row maximum: nan "
        "for logits in the thousands, which also spoils sample there",
        score=16, failing=frozenset({"test_top_p_hidden", "test_sample_hidden"}),
        edits={"top_p_filter": Replace(
            "probs = torch.softmax(logits, dim=-1)",
            "exps = torch.exp(logits)\n    probs = exps / exps.sum(dim=-1, keepdim=True)")}),
    Submission(
        "draw_with_multinomial", SAMPLING,
        "draws with torch.multinomial and the given generator: the right distribution, but a "
        "sampler the exercise refuses (and other tokens than the stated rule's)",
        score=12, failing=DRAW | SAMPLE,
        edits={"draw": Replace(
            "probs = torch.softmax(logits, dim=-1)",
            "probs = torch.softmax(logits, dim=-1)\n"
            "    flat = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, "
            "generator=generator)\n"
            "    return flat.reshape(logits.shape[:-1])")}),
    Submission(
        "draw_u_in_float32", SAMPLING,
        "draws u in torch.rand's default float32 whatever the logits' dtype: float32 rows are "
        "right, float64 ones draw other numbers (and move the generator on differently)",
        score=16, failing=frozenset({"test_draw_hidden", "test_sample_hidden"}),
        edits={"draw": Replace("generator=generator, dtype=logits.dtype,",
                               "generator=generator,")}),
    Submission(
        "greedy_as_a_tiny_temperature", SAMPLING,
        "temperature 0 replaced by a tiny temperature and a draw: almost always the argmax, but "
        "it draws from the generator (moving it on) and splits tied maxima at random",
        score=16, failing=SAMPLE,
        edits={"sample": Replace("if temperature == 0:\n"
                                 "        return logits.argmax(dim=-1)",
                                 "if temperature == 0:\n"
                                 "        temperature = 1e-6")}),
    Submission(
        "top_p_before_top_k", SAMPLING,
        "applies top-p to the full distribution and top-k afterwards: the nucleus is measured on "
        "probabilities top-k would have renormalised",
        score=18, failing=frozenset({"test_sample_hidden"}),
        edits={"sample": Source('''
def sample(logits, generator, temperature=1.0, top_k=None, top_p=None):
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return logits.argmax(dim=-1)
    scaled = logits / temperature
    if top_p is not None:
        scaled = top_p_filter(scaled, top_p)
    if top_k is not None:
        scaled = top_k_filter(scaled, top_k)
    return draw(scaled, generator)
''')}),
    Submission(
        "top_p_before_temperature", SAMPLING,
        "applies the filters to the raw logits and divides by the temperature afterwards: top-p "
        "adds up the probabilities at T = 1, not at the temperature asked for",
        score=18, failing=frozenset({"test_sample_hidden"}),
        edits={"sample": Source('''
def sample(logits, generator, temperature=1.0, top_k=None, top_p=None):
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return logits.argmax(dim=-1)
    filtered = logits
    if top_k is not None:
        filtered = top_k_filter(filtered, top_k)
    if top_p is not None:
        filtered = top_p_filter(filtered, top_p)
    return draw(filtered / temperature, generator)
''')}),
]
