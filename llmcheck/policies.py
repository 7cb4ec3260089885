"""The exercises' policies: what each exercise's test cells forbid (``Test(..., forbid=PRODUCTS)``).

Each policy is a tuple of ``forbid`` targets (``llmcheck.policy``): an :class:`Allow` of op
families, llmcore function-name words, ``"numpy"``, ``"autograd"``, and llmcore's modules as
:class:`CodeOf` names, imported only when a test makes its policy: importing this module imports
no llmcore module. ``llmcheck.recorder`` re-exports every name here, as the exercises import them.
"""

from __future__ import annotations

from .families import Allow
from .policy import CodeOf

BASICS = ("creation", "elementwise", "indexing", "reduction", "shape")
"""What every exercise's own code may reach: elementwise arithmetic, reductions, indexing, views,
reshapes, creating and copying tensors."""

PRODUCTS = (Allow(frozenset(BASICS)), "llmcore.dot", "llmcore.matmul", "llmcore.linear", "numpy")
"""No library product at all: only elementwise arithmetic, reductions, indexing, views, reshapes,
creating and copying tensors (``(a[:, :, None] * b[None]).sum(1)`` is fine, and so is
``torch.outer``, a broadcast product, and ``F.cosine_similarity``, elementwise products, sums and
norms; every product op, whatever reaches it: ``@``, matmul, einsum, F.linear, torch.sparse.mm,
F.bilinear, a convolution, embedding_bag, is not), no llmcore dot/matmul/linear, no NumPy. For
products written as loops. (A refusal of cosine_similarity by name needs a TorchFunctionMode,
which made exercise 1's loops nine times slower: it is allowed, and exercise 1 says so.)"""

SOFTMAXES = (Allow(frozenset({*BASICS, "product", "normalization"})), "llmcore.softmax",
             "aten.logsumexp", "numpy")
"""No library softmax: the basic families and matrix products, no softmax op (torch.softmax,
F.softmax, Tensor.softmax, nn.Softmax, log-softmax, the one inside fused attention) nor any other
op outside them, no logsumexp (the softmax's normaliser handed over: aten.logsumexp, however
reached), no llmcore function with
softmax in its name (the NumPy reference included), no NumPy."""

ORDINARY = (Allow(frozenset({*BASICS, "product", "softmax", "normalization"})),)
"""Every family an exercise's own code reaches, matrix products included (each one counted in
``products`` and ``flops``): for a cell that counts products or FLOPs (``max_products``,
``max_flops_ratio``), so that no product escapes the count through an op the counter does not know
(a convolution, F.bilinear, embedding_bag)."""

ATTENTIONS = (*ORDINARY, "llmcore.attention", "numpy")
"""No library attention: the basic families, matrix products, softmax and normalization; no fused
attention (F.scaled_dot_product_attention, nn.MultiheadAttention's fast path, ``_safe_softmax``)
nor any other op outside them, no llmcore function with attention in its name, no NumPy."""

AUTOGRAD = (*ORDINARY, "autograd", "traced", "llmcore.backward", "llmcore.jacobian", "numpy")
"""No library differentiation: the basic families, matrix products, softmax and normalization
(a forward pass, even on tensors that require grad); no torch autograd (``"autograd"``: any op
run by the backward engine, which torch.autograd.grad, Tensor.backward, torch.func.grad/vjp/jacrev
and torch.autograd.functional all reach; any op under forward-mode AD, as in torch.func.jvp/jacfwd;
any aten op named ``*_backward*``, such as ``_softmax_backward_data`` called directly; no op run
by code torch.fx generated, as a gradient graph traced with make_fx before the call and replayed
in it), no llmcore backward function nor its softmax Jacobian, no NumPy."""

PAGING = (CodeOf("llmcore.block_allocator"), CodeOf("llmcore.paged"),
          CodeOf("llmcore.paged_batch"))
"""llmcore's paging code, every function, method and property its three modules define (the block
allocator, the paged cache, the paged batch), in a learner's subclass too: for exercise 6, which
asks for them written by hand."""

DECODING = tuple(CodeOf(f"llmcore.{name}")
                 for name in ("generate", "decode", "sampling", "fastpath", "onerow_step"))
"""llmcore's decoding code: the generate, decode, sampling and fast-path modules (their loops,
steps and pickers; the fast path's whole step in C, ``onerow_step``, included)."""

GENERATION = (*ORDINARY, "llmcore.generate", *DECODING)
"""No library generation: every llmcore function with generate in its name and all of llmcore's
decoding code (the generate, decode, sampling and fast-path modules: their loops, steps and
pickers), for exercise 4's generation loop; the ordinary families otherwise."""

SAMPLING_HELPERS = ("torch.quantile", "torch.nanquantile", "torch.Tensor.quantile",
                    "torch.Tensor.nanquantile")
"""torch's helpers that hand over the k-th value as a threshold (a quantile of each row)."""

SAMPLING = (Allow(frozenset({*BASICS, "softmax"})), "aten.topk", "aten.kthvalue",
            "aten.multinomial", *SAMPLING_HELPERS, *DECODING, "numpy")
"""No library sampling: the basic families and softmax (sorting and cumsum included); not
torch.topk, torch.kthvalue or torch.quantile (the k largest, the k-th, or a threshold handed
over: sort instead), not
torch.multinomial (a draw by the library's own rule, which torch.distributions reaches too), no
matrix product nor any other op outside those families, none of llmcore's decoding code (the
generate, decode, sampling and fast-path modules), no NumPy. For exercise 9."""

QUANTIZATION = (Allow(frozenset({*BASICS, "product"})), "llmcore.quantize", "llmcore.pack",
                CodeOf("llmcore.quantize"), CodeOf("torch.ao.quantization.observer"), "numpy")
"""No library quantization: the basic families (round, clamp, abs, the bitwise &, | and the
shifts are elementwise; ``.to(torch.int8)`` is creation) and matrix products; no torch
quantization op (``torch.quantize_per_channel``, ``torch.ao``'s fake quantization, the packed
int8/int4 matmul kernels: none is in those families), none of torch.ao's observers (which compute
the scales and zero points), no llmcore function with quantize or pack in its name, nothing that
llmcore.quantize defines, no NumPy. For exercise 10."""
