"""Wrong submissions of exercise 12 (12_speculative): greedy and sampled acceptance, the residual
distribution and the cache rollback, as test data.

Same form as tests/grading/mutants.py: each starts from the released notebook with every answer
filled from solutions/, applies cell-level edits keyed by grade_id, and states its score and the
test cells that fail (all others pass). Points: test_accept_greedy 2, _hidden 2; test_residual 1,
_hidden 2; test_accept_sampled 2, _hidden 2, _distribution_hidden 2; test_rollback 1, _hidden 2
(16). accept_sampled calls the learner's residual_distribution, so a wrong residual costs the
sampled cells too.
"""

from grading_mutants import Submission, Replace, Source, Prepend, Delete   # noqa: F401

SPECULATIVE = "12_speculative"

GREEDY = frozenset({"test_accept_greedy", "test_accept_greedy_hidden"})
RESIDUAL = frozenset({"test_residual", "test_residual_hidden"})
SAMPLED = frozenset({"test_accept_sampled", "test_accept_sampled_hidden",
                     "test_accept_sampled_distribution_hidden"})
ROLLBACK = frozenset({"test_rollback", "test_rollback_hidden"})

A_LINE = ("a = torch.where(differs.any(dim=-1), first, torch.full_like(first, k)).long()   # (...)")
SAMPLED_A = ("a = torch.where(fails.any(dim=-1), first, torch.full_like(first, k)).long()   # (...)")

WRONG = [
    Submission(
        "greedy_counts_every_match", SPECULATIVE,
        "a counts every guess that equals its row's argmax, also those after the first "
        "disagreement (computed on a context that is gone)",
        score=12, failing=GREEDY,
        edits={"accept_greedy": Replace(A_LINE, "a = (~differs).sum(dim=-1)")}),
    Submission(
        "greedy_next_from_last_row", SPECULATIVE,
        "the next token is always the argmax of the last row (the bonus), even after a rejection",
        score=12, failing=GREEDY,
        edits={"accept_greedy": Replace("return a, choice.gather(-1, a[..., None])[..., 0]",
                                        "return a, choice[..., k]")}),
    Submission(
        "greedy_last_maximum", SPECULATIVE,
        "ties go to the last maximum of a row, not the first (the token greedy decoding picks)",
        score=14, failing=frozenset({"test_accept_greedy_hidden"}),
        edits={"accept_greedy": Replace(
            "choice = logits.argmax(dim=-1) ",
            "choice = logits.shape[-1] - 1 - logits.flip(-1).argmax(dim=-1) ")}),
    Submission(
        "residual_not_normalised", SPECULATIVE,
        "the residual is max(0, p - q) without dividing by its sum: not a distribution (the "
        "sampled draw, which divides the running sums by their last entry, still comes out right)",
        score=13, failing=RESIDUAL,
        edits={"residual_distribution": Replace("return torch.where(nonzero, divided, p)",
                                                "return torch.where(nonzero, excess, p)")}),
    Submission(
        "residual_divides_by_zero", SPECULATIVE,
        "no special row where p = q: 0 / 0 gives NaN instead of p",
        score=13, failing=RESIDUAL,
        edits={"residual_distribution": Replace("return torch.where(nonzero, divided, p)",
                                                "return excess / total")}),
    Submission(
        "residual_reversed", SPECULATIVE,
        "max(0, q - p): the mass the drafter proposes too often, not too rarely",
        score=7, failing=RESIDUAL | SAMPLED,
        edits={"residual_distribution": Replace("excess = torch.clamp(p - q, min=0)",
                                                "excess = torch.clamp(q - p, min=0)")}),
    Submission(
        "residual_library", SPECULATIVE,
        "residual_distribution calls llmcore's (refused), so accept_sampled, which uses it, "
        "fails too",
        score=7, failing=RESIDUAL | SAMPLED,
        edits={"residual_distribution": Replace(
            "excess = torch.clamp(p - q, min=0)",
            "from llmcore.speculative import residual_distribution as library_residual\n"
            "    return library_residual(p, q)")}),
    Submission(
        "sampled_ratio_inverted", SPECULATIVE,
        "a guess passes when u q < p is written the wrong way round (u p < q): the draft's "
        "preferences win",
        score=10, failing=SAMPLED,
        edits={"accept_sampled": Replace("fails = u * q_guess >= p_guess",
                                         "fails = u * p_guess >= q_guess")}),
    Submission(
        "sampled_counts_every_pass", SPECULATIVE,
        "a counts every guess that passes, also those after the first rejection",
        score=10, failing=SAMPLED,
        edits={"accept_sampled": Replace(SAMPLED_A, "a = (~fails).sum(dim=-1)")}),
    Submission(
        "sampled_rejection_draws_from_p", SPECULATIVE,
        "after a rejection the next token is drawn from p, not from the residual: the rejected "
        "token can come back, so tokens the drafter over-proposes appear too often",
        score=10, failing=SAMPLED,
        edits={"accept_sampled": Replace(
            "rows = torch.cat([residual_distribution(p[..., :k, :], q), p[..., k:, :]], dim=-2)",
            "rows = p")}),
    Submission(
        "sampled_draws_in_other_order", SPECULATIVE,
        "u_draw is drawn before u: the same distribution, but not the tokens the rule fixes for "
        "a seed",
        score=10, failing=SAMPLED,
        edits={"accept_sampled": Replace(
            "u = torch.rand(draft.shape, **options)                          # (..., k)\n"
            "    u_draw = torch.rand(draft.shape[:-1], **options)                # (...)",
            "u_draw = torch.rand(draft.shape[:-1], **options)\n"
            "    u = torch.rand(draft.shape, **options)")}),
    Submission(
        "sampled_multinomial", SPECULATIVE,
        "the final token is drawn with torch.multinomial (refused)",
        score=10, failing=SAMPLED,
        edits={"accept_sampled": Replace(
            "return a, (running <= u_draw[..., None]).sum(dim=-1)",
            "flat = torch.multinomial(row.reshape(-1, v), 1, generator=generator)\n"
            "    return a, flat.reshape(a.shape)")}),
    Submission(
        "rollback_copies", SPECULATIVE,
        "the right rows, but cloned: a copy of the whole cache at every round, not a view",
        score=13, failing=ROLLBACK,
        edits={"rollback": Replace("return cache[..., : m - k + a, :]",
                                   "return cache[..., : m - k + a, :].clone()")}),
    Submission(
        "rollback_drops_the_pending_row", SPECULATIVE,
        "keeps m - k + a - 1 rows: the pending token's keys, verified in the same forward, go too",
        score=13, failing=ROLLBACK,
        edits={"rollback": Replace("return cache[..., : m - k + a, :]",
                                   "return cache[..., : m - k + a - 1, :]")}),
    Submission(
        "rollback_first_axis", SPECULATIVE,
        "slices the first axis instead of the positions: right only for a single head (m, d_head)",
        score=13, failing=ROLLBACK,
        edits={"rollback": Replace("return cache[..., : m - k + a, :]",
                                   "return cache[: m - k + a]")}),
    Submission(
        "rollback_no_checks", SPECULATIVE,
        "never raises: a = k + 1 or a negative a silently keeps the wrong rows",
        score=13, failing=ROLLBACK,
        edits={"rollback": Replace("if not 0 <= a <= k or m < k + 1:", "if False:")}),
]
