"""Wrong submissions of exercise 11 (11_lora): LoRA's forward, merge and backward, as test data.

Same form as tests/grading/mutants.py: each starts from the released notebook with every answer
filled from solutions/, applies cell-level edits keyed by grade_id, and states its score and the
test cells that fail (all others pass). Points: test_lora_forward 2, _error 1, _hidden 3;
test_lora_merge 1, _hidden 2; test_lora_backward 2, _hidden 2, _batch_hidden 2 (15).
"""

from grading_mutants import Submission, Replace, Source, Prepend, Delete   # noqa: F401

LORA = "11_lora"

FORWARD = frozenset({"test_lora_forward", "test_lora_forward_hidden"})
MERGE = frozenset({"test_lora_merge", "test_lora_merge_hidden"})
BACKWARD = frozenset({"test_lora_backward", "test_lora_backward_hidden",
                      "test_lora_backward_batch_hidden"})

WRONG = [
    Submission(
        "scale_alpha", LORA,
        "the forward scales the adapter by alpha instead of alpha / r: right only at rank 1",
        score=10, failing=FORWARD,
        edits={"lora_forward": Replace("scale = alpha / rank", "scale = alpha")}),
    Submission(
        "forgets_frozen_w", LORA,
        "the forward returns the adapter's term (alpha / r) (x A) B alone, without x W: the "
        "frozen layer's output is lost",
        score=10, failing=FORWARD,
        edits={"lora_forward": Replace("return x @ w + scale * ((x @ a) @ b)",
                                       "return scale * ((x @ a) @ b)")}),
    Submission(
        "forward_merges_first", LORA,
        "the forward computes x (W + s A B): the right numbers, but it forms the (d_in, d_out) "
        "matrix A B, several times the work for a few rows through wide matrices",
        score=12, failing=frozenset({"test_lora_forward_hidden"}),
        edits={"lora_forward": Replace("return x @ w + scale * ((x @ a) @ b)",
                                       "return x @ (w + scale * (a @ b))")}),
    Submission(
        "no_shape_check", LORA,
        "the forward checks no shapes: an A with the wrong number of rows fails inside the "
        "product with torch's RuntimeError, not the ValueError that shows the shapes",
        score=14, failing=frozenset({"test_lora_forward_error"}),
        edits={"lora_forward": Replace("if a.shape[0] != d_in or tuple(b.shape) != (rank, d_out):",
                                       "if False:")}),
    Submission(
        "library_lora_linear", LORA,
        "the forward calls llmcore's lora_linear (refused), in the error case too",
        score=9, failing=FORWARD | {"test_lora_forward_error"},
        edits={"lora_forward": Replace(
            "d_in, d_out = w.shape\n",
            "from llmcore.lora import lora_linear\n"
            "    return lora_linear(x, w, a, b, alpha=alpha)\n"
            "    d_in, d_out = w.shape\n")}),
    Submission(
        "merge_in_place", LORA,
        "the merge adds s A B into w in place and returns it: the right matrix, but the frozen "
        "weight is gone (another adapter, or the unmerged model, can no longer use it)",
        score=12, failing=MERGE,
        edits={"lora_merge": Replace("return w + scale * (a @ b)",
                                     "w += scale * (a @ b)\n    return w")}),
    Submission(
        "merge_without_scale", LORA,
        "the merge adds A B without alpha / r: right only when alpha equals r",
        score=12, failing=MERGE,
        edits={"lora_merge": Replace("return w + scale * (a @ b)", "return w + a @ b")}),
    Submission(
        "backward_without_scale", LORA,
        "dA and dB without the scale alpha / r that multiplied the adapter's output",
        score=9, failing=BACKWARD,
        edits={"lora_backward": Replace("grad = scale * d_y.reshape(-1, b.shape[1])",
                                        "grad = d_y.reshape(-1, b.shape[1])")}),
    Submission(
        "dh_without_transpose", LORA,
        "dH = s G B, forgetting B's transpose: a shape error whenever d_out != r, wrong numbers "
        "when they are equal",
        score=9, failing=BACKWARD,
        edits={"lora_backward": Replace("d_hidden = grad @ b.T ", "d_hidden = grad @ b ")}),
    Submission(
        "batch_not_flattened", LORA,
        "the products run per sequence without flattening the batch: right for one sequence, "
        "(b, r, d_out) and (b, d_in, r) instead of sums over the batch",
        score=13, failing=frozenset({"test_lora_backward_batch_hidden"}),
        edits={"lora_backward": Source(r'''
def lora_backward(x, a, b, d_y, alpha):
    scale = alpha / a.shape[1]
    hidden = x @ a                                    # (..., n, r)
    db = hidden.transpose(-2, -1) @ (scale * d_y)
    da = x.transpose(-2, -1) @ ((scale * d_y) @ b.T)
    return da, db
''')}),
    Submission(
        "forms_full_gradient", LORA,
        "the backward forms W's gradient X^T G (d_in, d_out) and projects it, dA = s X^T G B^T and "
        "dB = s A^T X^T G: the right numbers, but the (d_in, d_out) product LoRA exists to avoid",
        score=13, failing=frozenset({"test_lora_backward_hidden"}),
        edits={"lora_backward": Replace(
            "hidden = rows @ a                                 # H = X A: (N, r)\n"
            "    db = hidden.T @ grad                              # (r, d_out)\n"
            "    d_hidden = grad @ b.T                             # (N, r)\n"
            "    da = rows.T @ d_hidden                            # (d_in, r)\n",
            "d_w = rows.T @ grad                               # (d_in, d_out)\n"
            "    db = a.T @ d_w\n"
            "    da = d_w @ b.T\n")}),
    Submission(
        "autograd_backward", LORA,
        "the backward runs the adapter on leaves that require grad and asks torch.autograd.grad: "
        "autograd's backward pass, refused",
        score=9, failing=BACKWARD,
        edits={"lora_backward": Replace(
            "d_in, rank = a.shape\n",
            "leaves = [a.detach().requires_grad_(), b.detach().requires_grad_()]\n"
            "    y = alpha / a.shape[1] * (x @ leaves[0]) @ leaves[1]\n"
            "    return torch.autograd.grad(y, leaves, d_y)\n"
            "    d_in, rank = a.shape\n")}),
    Submission(
        "library_lora_backward", LORA,
        "the backward calls llmcore's lora_backward (refused)",
        score=9, failing=BACKWARD,
        edits={"lora_backward": Replace(
            "d_in, rank = a.shape\n",
            "from llmcore.lora import lora_backward as library_backward\n"
            "    return library_backward(x, a, b, d_y, alpha=alpha)\n"
            "    d_in, rank = a.shape\n")}),
]
