"""Wrong submissions of exercise 8 (08_backward): the backward pass by hand, as test data.

Same form as tests/grading/mutants.py: each starts from the released notebook with every answer
filled from solutions/, applies cell-level edits keyed by grade_id, and states its score and the
test cells that fail (all others pass). Points: test_linear_backward 2, _hidden 1, _batch_hidden 2;
test_softmax_backward 2, _hidden 2; test_attention_backward 2, _hidden 2, _causal_hidden 2 (15).
"""

from grading_mutants import Submission, Replace, Source, Prepend, Delete   # noqa: F401

BACKWARD = "08_backward"

LINEAR = frozenset({"test_linear_backward", "test_linear_backward_hidden",
                    "test_linear_backward_batch_hidden"})
SOFTMAX = frozenset({"test_softmax_backward", "test_softmax_backward_hidden"})
ATTENTION = frozenset({"test_attention_backward", "test_attention_backward_hidden",
                       "test_attention_backward_causal_hidden"})
CAUSAL = frozenset({"test_attention_backward", "test_attention_backward_causal_hidden"})
"""The cells with a causal head: the visible one has one (n = 3, m = 5), the hidden one three."""

WRONG = [
    Submission(
        "transposed_dw", BACKWARD,
        "dw = d_out^T x instead of x^T d_out: the right numbers transposed, (d_out, d_in) where w "
        "is (d_in, d_out)",
        score=10, failing=LINEAR,
        edits={"linear_backward": Replace("dw = rows_x.T @ rows_d", "dw = rows_d.T @ rows_x")}),
    Submission(
        "dx_without_transpose", BACKWARD,
        "dx = d_out w, forgetting the transpose: a shape error whenever d_in != d_out, wrong "
        "numbers when they are equal",
        score=10, failing=LINEAR,
        edits={"linear_backward": Replace("dx = d_out @ w.T ", "dx = d_out @ w ")}),
    Submission(
        "db_not_summed_over_batch", BACKWARD,
        "db sums d_out over the rows of each sequence only (dim=-2): right for one sequence, "
        "(b, d_out) instead of (d_out,) for a batch",
        score=13, failing=frozenset({"test_linear_backward_batch_hidden"}),
        edits={"linear_backward": Replace("db = rows_d.sum(dim=0)", "db = d_out.sum(dim=-2)")}),
    Submission(
        "tensor_backward", BACKWARD,
        "linear_backward runs the forward on leaves that require grad and calls Tensor.backward: "
        "autograd's backward pass, refused",
        score=10, failing=LINEAR,
        edits={"linear_backward": Replace(
            "d_in, d_out_size = w.shape",
            "x_, w_ = x.detach().requires_grad_(), w.detach().requires_grad_()\n"
            "    b_ = torch.zeros(w.shape[1], dtype=w.dtype, requires_grad=True)\n"
            "    (x_ @ w_ + b_).backward(d_out)\n"
            "    return x_.grad, w_.grad, b_.grad\n"
            "    d_in, d_out_size = w.shape")}),
    Submission(
        "jacobian_diagonal_only", BACKWARD,
        "softmax backward with the Jacobian's diagonal only, a (1 - a) d_a: forgets that every "
        "score moves every weight of its row; attention's dq and dk are wrong with it",
        score=5, failing=SOFTMAX | ATTENTION,
        edits={"softmax_backward": Replace("return a * (d_a - (d_a * a).sum(dim=-1, keepdim=True))",
                                           "return a * (1 - a) * d_a")}),
    Submission(
        "forms_the_jacobian", BACKWARD,
        "builds each row's (m, m) Jacobian diag(a) - a a^T and multiplies it by d_a: the right "
        "numbers, but m^2 numbers per row and a matrix product the softmax tests allow none of",
        score=11, failing=SOFTMAX,
        edits={"softmax_backward": Replace(
            "return a * (d_a - (d_a * a).sum(dim=-1, keepdim=True))",
            "jacobian = torch.diag_embed(a) - a.unsqueeze(-1) * a.unsqueeze(-2)   # (..., m, m)\n"
            "    return (jacobian @ d_a.unsqueeze(-1)).squeeze(-1)")}),
    Submission(
        "library_softmax_backward", BACKWARD,
        "softmax_backward calls llmcore's softmax_backward (refused), which also breaks attention, "
        "built on it",
        score=5, failing=SOFTMAX | ATTENTION,
        edits={"softmax_backward": Replace(
            "return a * (d_a - (d_a * a).sum(dim=-1, keepdim=True))",
            "from llmcore.backward import softmax_backward as library_softmax_backward\n"
            "    return library_softmax_backward(a, d_a)")}),
    Submission(
        "no_scale_in_dq_dk", BACKWARD,
        "dq = dS k and dk = dS^T q without the 1/sqrt(d_head) that multiplied the scores",
        score=9, failing=ATTENTION,
        edits={"attention_backward": Replace(
            "dq = (d_scores @ k) * scale" + " " * 39 + "# (n, d_head)\n"
            "    dk = (d_scores.T @ q) * scale",
            "dq = d_scores @ k\n    dk = d_scores.T @ q")}),
    Submission(
        "no_causal_mask", BACKWARD,
        "the recomputed forward forgets the causal mask: right without a mask, wrong weights (and "
        "gradient reaching future keys) for causal heads, the visible one included",
        score=11, failing=CAUSAL,
        edits={"attention_backward": Replace("    if causal:\n", "    if False:\n")}),
    Submission(
        "top_left_mask", BACKWARD,
        "the causal mask aligned top-left (j <= i): right for n == m, wrong when the n queries are "
        "the last n of m > n tokens, as in the visible causal case (3 of 5)",
        score=11, failing=CAUSAL,
        edits={"attention_backward": Replace("torch.arange(n)[:, None] + (m - n)",
                                             "torch.arange(n)[:, None]")}),
    Submission(
        "autograd_grad", BACKWARD,
        "attention_backward recomputes the head on leaves that require grad and asks "
        "torch.autograd.grad for (dq, dk, dv): autograd's backward pass, refused",
        score=9, failing=ATTENTION,
        edits={"attention_backward": Replace(
            "n, m, d_head = q.shape[0], k.shape[0], q.shape[1]",
            "leaves = [t.detach().requires_grad_() for t in (q, k, v)]\n"
            "    scores = leaves[0] @ leaves[1].T / math.sqrt(q.shape[1])\n"
            "    if causal:\n"
            "        allowed = torch.ones(q.shape[0], k.shape[0]).tril(k.shape[0] - q.shape[0])\n"
            "        scores = scores.masked_fill(allowed == 0, float('-inf'))\n"
            "    out = torch.softmax(scores, dim=-1) @ leaves[2]\n"
            "    return torch.autograd.grad(out, leaves, d_out)\n"
            "    n, m, d_head = q.shape[0], k.shape[0], q.shape[1]")}),
]
