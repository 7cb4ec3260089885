"""Which operations a computation reaches: record every aten op, refuse what a policy disallows.

The exercises ask learners to compute something themselves (a matrix product by loops, a softmax,
attention). Whatever Python path a computation takes (``@``, ``torch.matmul``, an alias,
``torch.ops.aten.mm``, ``torch.linalg``, ``einsum``, a method), it ends in aten operations, and a
:class:`~torch.utils._python_dispatch.TorchDispatchMode` sees every one of them. :class:`OpRecorder`
counts them (and the matrix products' rows and FLOPs, and the largest storage any tensor had), and
refuses what a :class:`Policy` does not allow: an :class:`Allow` list of op families (every op
outside them is refused, whether or not anyone thought of it: torch has more ways to multiply than
any list of products), aten ops named one by one, llmcore's own implementations (seen on the
Python stack), NumPy (every NumPy function, and the conversions between tensors and arrays),
autograd, and any Python callable named. :func:`forbid` and :func:`watch_torch_calls` are the
learner-facing forms; ``llmcheck.cases.Test`` uses the recorder to publish what a test's call
reached, for the grader to judge outside the kernel (course/grading/VERDICTS.md). Chapters 2-4 and
7 and their exercises.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import types
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

PRODUCT_OPS = frozenset({
    "mm", "bmm", "addmm", "addbmm", "baddbmm", "mv", "addmv", "dot", "vdot", "addr", "_int_mm",
    "_scaled_mm", "convolution", "_convolution", "mkldnn_convolution", "cudnn_convolution",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_efficient_attention_forward", "_flash_attention_forward", "_fused_sdp_choice",
    "_native_multi_head_attention", "_addmm_activation",
})
"""The aten ops counted as matrix products (``products``, ``flops``): what ``@``, matmul, einsum,
tensordot, F.linear, torch.linalg.matmul/vecdot/multi_dot and the fused attention kernels end in."""

FUSED_ATTENTION_OPS = frozenset({
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_efficient_attention_forward", "_flash_attention_forward", "_native_multi_head_attention",
    "_safe_softmax", "_scaled_dot_product_attention_math",
})

# ------------------------------------------------------------------------------------------------
# Op families: what an allowlist is made of
# ------------------------------------------------------------------------------------------------

_LISTED = {
    "product": """mm bmm addmm addbmm baddbmm mv addmv dot vdot addr _addmm_activation matmul
        linear einsum tensordot""",
    "softmax": "_softmax softmax _log_softmax log_softmax special_softmax special_log_softmax",
    "normalization": """native_layer_norm layer_norm _fused_rms_norm rms_norm native_group_norm
        group_norm""",
    "reduction": """sum nansum mean nanmean prod amax amin aminmax max min argmax argmin cumsum
        cumprod cummax cummin _cummax_helper _cummin_helper logcumsumexp logsumexp std var
        std_mean var_mean norm linalg_vector_norm dist any all count_nonzero median nanmedian mode
        kthvalue sort argsort msort topk unique_consecutive _unique _unique2 unique_dim bincount
        histc trace equal allclose isclose is_nonzero is_same_size""",
    "indexing": """index _unsafe_index index_put _index_put_impl _unsafe_index_put index_select
        index_add index_copy index_fill index_reduce gather scatter scatter_add scatter_reduce
        masked_fill masked_select masked_scatter where take take_along_dim put cat concat
        concatenate _cat stack hstack vstack dstack column_stack split split_with_sizes
        tensor_split unbind chunk narrow narrow_copy tril triu tril_indices triu_indices flip
        fliplr flipud roll rot90 nonzero nonzero_static argwhere repeat repeat_interleave tile
        select_scatter slice_scatter diagonal_scatter as_strided_scatter diag diag_embed diagflat
        embedding searchsorted bucketize one_hot constant_pad_nd pad meshgrid isin
        _unsafe_masked_index""",
    "shape": """_unsafe_view view_copy reshape _reshape_copy flatten unflatten permute_copy
        transpose_copy t_copy expand_copy unsqueeze_copy squeeze_copy slice_copy select_copy
        unbind_copy split_copy split_with_sizes_copy detach_copy alias_copy as_strided_copy
        diagonal_copy unfold_copy view_as movedim moveaxis contiguous resolve_conj resolve_neg
        broadcast_to expand_as reshape_as ravel atleast_1d atleast_2d atleast_3d""",
    "creation": """empty empty_like empty_strided empty_permuted new_empty new_empty_strided zeros
        zeros_like new_zeros ones ones_like new_ones full full_like new_full scalar_tensor arange
        linspace logspace eye lift lift_fresh lift_fresh_copy _to_copy to clone copy _copy_from
        _copy_from_and_resize fill zero detach _local_scalar_dense item rand rand_like randn
        randn_like randint randint_like randperm normal uniform bernoulli random exponential
        geometric cauchy log_normal multinomial native_dropout dropout resize resize_as set
        _pin_memory pin_memory record_stream _has_compatible_shallow_copy_type complex polar
        _assert_async _assert_scalar _functional_assert_async sym_constrain_range
        sym_constrain_range_for_size""",
    "elementwise": """floor_divide true_divide hardswish log_sigmoid_forward glu _prelu_kernel
        _conj_physical""",
}
"""The families written as lists (in-place forms, ``NAME_``, follow their op). Elementwise ops and
views are also recognised from torch's own description of each op (:func:`op_family`)."""

_FAMILY_OF = {name: family for family, names in _LISTED.items() for name in names.split()}

FAMILIES = {
    "creation": "making and copying tensors (zeros, full, arange, zeros_like, new_zeros, clone, "
                "copy_, to, item)",
    "elementwise": "elementwise arithmetic and comparisons (+, *, /, exp, sqrt, where, clamp, "
                   "maximum, ==, <)",
    "indexing": "indexing (slices, a[idx], gather, scatter, masked_fill, cat, stack, tril, flip)",
    "reduction": "reductions (sum, mean, amax, max, argmax, cumsum, logsumexp, sort, topk)",
    "shape": "views and reshapes (view, reshape, transpose, permute, expand, unsqueeze)",
    "product": "matrix products (@, matmul, mm, bmm, F.linear)",
    "softmax": "softmax (torch.softmax, F.softmax, log_softmax)",
    "normalization": "normalization (F.layer_norm, F.rms_norm)",
}
"""Every op family an :class:`Allow` may name, with what it holds, in the words a refusal uses."""

_families_cache: dict[str, str | None] = {}


def _aten_packet(name: str):
    try:
        packet = getattr(torch.ops.aten, name)
    except (AttributeError, RuntimeError):
        return None
    return packet if isinstance(packet, torch._ops.OpOverloadPacket) else None


def _family_of_name(name: str, packet=None) -> str | None:
    if name in _families_cache:
        return _families_cache[name]
    family = None
    if "backward" in name:                          # a derivative kernel: autograd's work
        family = None
    elif name in _FAMILY_OF:
        family = _FAMILY_OF[name]
    else:
        packet = packet if packet is not None else _aten_packet(name)
        overloads = [getattr(packet, o) for o in packet.overloads()] if packet is not None else []
        if any(torch.Tag.pointwise in o.tags for o in overloads):
            family = "elementwise"
        elif any(r.alias_info is not None and not r.alias_info.is_write
                 for o in overloads for r in o._schema.returns[:1]):
            family = "shape"                        # returns a view of an argument
        elif name.endswith("_") and not name.startswith("__"):
            family = _family_of_name(name[:-1])     # in place: the family of its functional form
    _families_cache[name] = family
    return family


def op_family(func) -> str | None:
    """The family of an aten op (an OpOverload, its packet, or its name), or None for an op in
    none: ``"elementwise"`` (torch tags it pointwise), ``"shape"`` (its schema returns a view of an
    argument), or the listed families (product, softmax, normalization, reduction, indexing, shape,
    creation). An in-place op (``mul_``) or an ``out=`` overload (``mm.out``) has the family of its
    functional form; an op named ``*backward*`` is in none."""
    if isinstance(func, str):
        return _family_of_name(func)
    packet = getattr(func, "overloadpacket", func)
    return _family_of_name(packet.__name__, packet)


@dataclass(frozen=True)
class Allow:
    """An allowlist: the op families (names of :data:`FAMILIES`) a call may reach; every other aten
    op is refused. Several in one policy intersect (each test asks for its own restriction)."""

    families: frozenset[str]

    def __post_init__(self):
        unknown = sorted(set(self.families) - set(FAMILIES))
        if unknown:
            raise ValueError(f"Allow: unknown op families {unknown}; known: {sorted(FAMILIES)}")
        object.__setattr__(self, "families", frozenset(self.families))

    def __repr__(self) -> str:
        return f"Allow({sorted(self.families)})"


BASICS = ("creation", "elementwise", "indexing", "reduction", "shape")
"""What every exercise's own code may reach: elementwise arithmetic, reductions, indexing, views,
reshapes, creating and copying tensors."""

SHORTCUT_OPS = frozenset({
    *PRODUCT_OPS, *FUSED_ATTENTION_OPS, *_LISTED["product"].split(), *_LISTED["softmax"].split(),
    "_trilinear", "bilinear", "_sparse_mm", "_sparse_addmm", "_sparse_sparse_matmul", "sspaddmm",
    "_embedding_bag", "_embedding_bag_forward_only", "embedding_bag", "conv_tbc", "conv1d",
    "conv2d", "conv3d", "_convolution_mode", "conv_transpose1d", "conv_transpose2d",
    "_cdist_forward", "_euclidean_dist", "cdist", "im2col", "_fft_r2c", "_fft_c2c", "_fft_c2r",
    "chain_matmul", "linalg_multi_dot", "linalg_matmul", "linalg_vecdot", "inner",
    "_weight_int8pack_mm", "_weight_int4pack_mm", "_grouped_mm", "mkldnn_linear",
})
"""Library shortcuts known by name: a policy's ``ops`` names those it refuses, so the record (and
the grader's second look at the ops reached) states them; its allowlist refuses them and every
other op outside its families all the same."""

PRODUCTS = (Allow(frozenset(BASICS)), "llmcore.dot", "llmcore.matmul", "llmcore.linear", "numpy")
"""No library product at all: only elementwise arithmetic, reductions, indexing, views, reshapes,
creating and copying tensors (``(a[:, :, None] * b[None]).sum(1)`` is fine; every product op,
whatever reaches it: ``@``, matmul, einsum, F.linear, torch.sparse.mm, F.bilinear, a convolution,
embedding_bag, is not), no llmcore dot/matmul/linear, no NumPy. For products written as loops."""

SOFTMAXES = (Allow(frozenset({*BASICS, "product", "normalization"})), "llmcore.softmax", "numpy")
"""No library softmax: the basic families and matrix products, no softmax op (torch.softmax,
F.softmax, Tensor.softmax, nn.Softmax, log-softmax, the one inside fused attention) nor any other
op outside them, no llmcore function with softmax in its name (the NumPy reference included), no
NumPy."""

ORDINARY = (Allow(frozenset({*BASICS, "product", "softmax", "normalization"})),)
"""Every family an exercise's own code reaches, matrix products included (each one counted in
``products`` and ``flops``): for a cell that counts products or FLOPs (``max_products``,
``max_flops_ratio``), so that no product escapes the count through an op the counter does not know
(a convolution, F.bilinear, embedding_bag)."""

ATTENTIONS = (*ORDINARY, "llmcore.attention", "numpy")
"""No library attention: the basic families, matrix products, softmax and normalization; no fused
attention (F.scaled_dot_product_attention, nn.MultiheadAttention's fast path, ``_safe_softmax``)
nor any other op outside them, no llmcore function with attention in its name, no NumPy."""

AUTOGRAD = (*ORDINARY, "autograd", "llmcore.backward", "llmcore.jacobian", "numpy")
"""No library differentiation: the basic families, matrix products, softmax and normalization
(a forward pass, even on tensors that require grad); no torch autograd (``"autograd"``: any op
run by the backward engine, which torch.autograd.grad, Tensor.backward, torch.func.grad/vjp/jacrev
and torch.autograd.functional all reach; any op under forward-mode AD, as in torch.func.jvp/jacfwd;
any aten op named ``*_backward*``, such as ``_softmax_backward_data`` called directly), no
llmcore backward function nor its softmax Jacobian, no NumPy."""

def _paging_modules() -> tuple:
    import llmcore.block_allocator
    import llmcore.paged
    import llmcore.paged_batch
    return llmcore.block_allocator, llmcore.paged, llmcore.paged_batch


PAGING = _paging_modules()
"""llmcore's paging code, every function, method and property its three modules define (the block
allocator, the paged cache, the paged batch), in a learner's subclass too: for exercise 6, which
asks for them written by hand."""


def _generation_modules() -> tuple:
    import importlib
    return tuple(importlib.import_module(f"llmcore.{name}")
                 for name in ("generate", "decode", "sampling", "fastpath"))


GENERATION = (*ORDINARY, "llmcore.generate", *_generation_modules())
"""No library generation: every llmcore function with generate in its name and all of llmcore's
decoding code (the generate, decode, sampling and fast-path modules: their loops, steps and
pickers), for exercise 4's generation loop; the ordinary families otherwise."""

SAMPLING = (Allow(frozenset({*BASICS, "softmax"})), "aten.topk", "aten.kthvalue",
            "aten.multinomial", *_generation_modules(), "numpy")
"""No library sampling: the basic families and softmax (sorting and cumsum included); not
torch.topk or torch.kthvalue (the k largest, or the k-th, handed over: sort instead), not
torch.multinomial (a draw by the library's own rule, which torch.distributions reaches too), no
matrix product nor any other op outside those families, none of llmcore's decoding code (the
generate, decode, sampling and fast-path modules), no NumPy. For exercise 9."""


def _quantization_modules() -> tuple:
    import llmcore.quantize
    return (llmcore.quantize,)


QUANTIZATION = (Allow(frozenset({*BASICS, "product"})), "llmcore.quantize", "llmcore.pack",
                *_quantization_modules(), "numpy")
"""No library quantization: the basic families (round, clamp, abs, the bitwise &, | and the
shifts are elementwise; ``.to(torch.int8)`` is creation) and matrix products; no torch
quantization op (``torch.quantize_per_channel``, ``torch.ao``'s fake quantization, the packed
int8/int4 matmul kernels: none is in those families), no llmcore function with quantize or pack
in its name, nothing that llmcore.quantize defines, no NumPy. For exercise 10."""

_EXEMPT_MODULES = ("llmcore.testing",)
"""llmcore modules whose functions a test may always call (they compare, they compute nothing)."""

_LLMCORE_DIR = os.path.dirname(os.path.abspath(__import__("llmcore").__file__))


class NotAllowedError(AssertionError):
    """A function under test reached a library's own implementation of what it should compute."""


def _families_text(families) -> str:
    return "; ".join(FAMILIES[f] for f in sorted(families))


@dataclass(frozen=True)
class Policy:
    """What a call may not reach.

    ops: aten op names refused by name (``"mm"``): the ``aten.NAME`` targets, and the
    :data:`SHORTCUT_OPS` that the allowlist leaves out; named: the ``aten.NAME`` targets alone;
    allow: the op families a call may reach (None: every op not refused by name), the intersection
    of the policy's :class:`Allow` targets; words: llmcore function-name words (``"softmax"``);
    numpy: refuse NumPy and the conversions between tensors and arrays; codes: code objects of
    Python callables (``Attention.forward``); hint: a sentence added to each refusal.
    """

    ops: frozenset[str] = frozenset()
    words: tuple[str, ...] = ()
    numpy: bool = False
    codes: frozenset = frozenset()
    callables: tuple[str, ...] = ()
    hint: str = ""
    autograd: bool = False      # refuse autograd's work: backward engine, forward AD, *_backward*
    allow: frozenset[str] | None = None
    named: frozenset[str] = frozenset()

    @classmethod
    def of(cls, targets: Sequence, hint: str = "") -> "Policy":
        """Parse ``forbid`` targets: ``"aten.NAME"``, ``"llmcore.WORD"``, ``"numpy"``,
        ``"autograd"``, :class:`Allow` lists (intersected), callables."""
        names = [t for t in targets if isinstance(t, str)]
        unknown = [t for t in names if not (t.startswith(("aten.", "llmcore."))
                                            or t in ("numpy", "autograd"))]
        if unknown:
            raise ValueError(f"forbid: targets must be 'aten.OP', 'llmcore.WORD', 'numpy', "
                             f"'autograd', Allow(...) or callables, got {unknown}")
        allows = [t for t in targets if isinstance(t, Allow)]
        allow = frozenset.intersection(*(a.families for a in allows)) if allows else None
        callables = [t for t in targets if not isinstance(t, (str, Allow))]
        codes = [code for c in callables for code in _codes_of(c)]
        named = frozenset(t.split(".", 1)[1] for t in names if t.startswith("aten."))
        shortcuts = frozenset() if allow is None else frozenset(
            op for op in SHORTCUT_OPS if op_family(op) not in allow)
        return cls(ops=named | shortcuts, named=named,
                   words=tuple(dict.fromkeys(t.split(".", 1)[1] for t in names
                                             if t.startswith("llmcore."))),
                   numpy="numpy" in names, codes=frozenset(codes),
                   callables=tuple(getattr(c, "__qualname__", None) and
                                   f"{c.__module__}.{c.__qualname__}" or c.__name__
                                   for c in callables),
                   hint=hint, autograd="autograd" in names, allow=allow)

    def allows(self, func) -> bool:
        """Whether an aten op (OpOverload, packet or name) may run under this policy."""
        name = func if isinstance(func, str) else \
            getattr(func, "overloadpacket", func).__name__
        if name in self.ops:
            return False
        return self.allow is None or op_family(func) in self.allow

    def describe(self) -> dict:
        """The policy as JSON-ready data (what a record states): ``ops`` refused by name, and with
        an allowlist ``allow``, the sorted families every other op must belong to."""
        return {"ops": sorted(f"aten.{op}" for op in self.ops), "llmcore": list(self.words),
                "numpy": self.numpy, "callables": list(self.callables),
                **({"autograd": True} if self.autograd else {}),
                **({"allow": sorted(self.allow)} if self.allow is not None else {})}

    def refusal(self, what: str) -> NotAllowedError:
        hint = f" {self.hint}" if self.hint else ""
        return NotAllowedError(f"{what} was used, but this exercise asks you to compute it "
                               f"yourself; the library's own version is not allowed here.{hint}")

    def unlisted(self, what: str) -> NotAllowedError:
        """The refusal of an op outside the allowlist: which op, that this test does not allow
        it, and what it does allow."""
        hint = f" {self.hint}" if self.hint else ""
        allowed = _families_text(self.allow) if self.allow else "nothing"
        return NotAllowedError(f"{what} was used, but it is not among the operations this test "
                               f"allows: this exercise asks you to compute it yourself with "
                               f"{allowed}.{hint}")


def _codes_of(target, depth: int = 0) -> list:
    """The code objects a callable target stands for: a function's (or method's) own; every
    function, method and property of a class; every function and class a module defines (not the
    names it imports). ``forbid(*PAGING)`` refuses all of llmcore's paging code."""
    if isinstance(target, (staticmethod, classmethod)):
        target = target.__func__
    if isinstance(target, property):
        return [f.__code__ for f in (target.fget, target.fset, target.fdel) if f is not None]
    code = getattr(target, "__code__", None)
    if code is not None:
        return [code]
    if isinstance(target, (type, types.ModuleType)):
        home = target.__name__ if isinstance(target, types.ModuleType) else target.__module__
        members = [value for value in vars(target).values()
                   if isinstance(value, (staticmethod, classmethod, property))
                   or (isinstance(value, type) and depth < 2 or hasattr(value, "__code__"))
                   and getattr(value, "__module__", None) == home]
        source = getattr(sys.modules.get(home), "__file__", None)     # not generated, not wrapped
        return [code for value in members for code in _codes_of(value, depth + 1)
                if code.co_filename == source]
    if depth == 0:
        raise ValueError(f"forbid: {target!r} is not a Python function, class or module")
    return []


def _is_library_name(module: str, name: str, words: Sequence[str]) -> bool:
    """An llmcore function named with one of the words; private helpers and argument checks
    (``_check_attention_inputs``, ``check_attention_mask``) compute nothing and do not count."""
    return (module.startswith("llmcore.") and module not in _EXEMPT_MODULES
            and not name.startswith(("_", "check")) and any(word in name for word in words))


def _forbidden_frame(policy: Policy, frame) -> str | None:
    """The outermost frame on the stack that runs forbidden code, as 'module.function'."""
    outermost = None
    while frame is not None:
        code = frame.f_code
        module = frame.f_globals.get("__name__", "") or ""
        if code in policy.codes or (policy.words and (
                _is_library_name(module, code.co_name, policy.words) or
                (code.co_filename.startswith(_LLMCORE_DIR) and module not in _EXEMPT_MODULES
                 and _is_library_name("llmcore.copy", code.co_name, policy.words)))):
            outermost = f"{module}.{getattr(code, 'co_qualname', code.co_name)}"
        frame = frame.f_back
    return outermost


def _autograd_at_work(name: str) -> str | None:
    """What of autograd an op is part of, or None: the backward engine running it (whatever
    Python entry point started the engine), forward-mode AD (a dual level is open), or an aten
    derivative kernel called by name (``aten._softmax_backward_data``)."""
    if torch._C._current_graph_task_id() != -1:
        return (f"torch's autograd (aten.{name} run by the backward pass, which "
                "torch.autograd.grad, Tensor.backward, torch.func.grad/vjp and "
                "torch.autograd.functional start)")
    import torch.autograd.forward_ad as forward_ad
    if forward_ad._current_level >= 0:
        return f"torch's forward-mode autograd (aten.{name} under a dual level: torch.func.jvp)"
    if "backward" in name:
        return f"torch's derivative kernel aten.{name}"
    return None


def _storage_pointer(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


def _product_size(name: str, args) -> tuple[int, int]:
    """(rows, FLOPs) of a product op: rows of its left operand, 2*M*N*K multiply-adds."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if name in ("addmm", "addbmm", "baddbmm", "addmv", "addr", "_addmm_activation"):
        tensors = tensors[1:]                           # the first argument is the added term
    if len(tensors) < 2:
        return 0, 0
    a, b = tensors[0], tensors[1]
    if a.dim() == 0 or b.dim() == 0:
        return 0, 0
    if name in ("dot", "vdot"):
        return 1, 2 * a.shape[0]
    if name == "addr":
        return a.shape[0], 2 * a.shape[0] * b.shape[0]
    rows = math.prod(a.shape[:-1]) if a.dim() > 1 else 1
    columns = b.shape[-1] if b.dim() > 1 else 1
    if name.startswith(("_scaled_dot_product", "_efficient_attention", "_flash_attention")):
        columns = b.shape[-2]                           # q (.., n, d) against k (.., m, d)
        return rows, 4 * rows * columns * a.shape[-1]   # q k^T and A v
    return rows, 2 * rows * columns * a.shape[-1]


def _tensor_arguments(args, kwargs) -> list[torch.Tensor]:
    """The tensors among an op's arguments, inside lists too (``cat`` takes a list)."""
    found = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            found.append(a)
        elif isinstance(a, (list, tuple)):
            found.extend(t for t in a if isinstance(t, torch.Tensor))
    return found


@dataclass(frozen=True)
class TorchCall:
    """One aten op reached: its name, its tensor arguments' shapes and storage pointers, and for
    a product the rows of its left operand."""

    name: str
    shapes: tuple[tuple[int, ...], ...]
    storages: tuple[int, ...]
    product_rows: int = 0

    @property
    def is_product(self) -> bool:
        """A matrix or vector product (``@``, matmul, mm, einsum, linear, ...)."""
        return self.name in PRODUCT_OPS

    @property
    def rows(self) -> int:
        """Rows (tokens) of a product's left operand: every dimension but the last."""
        return self.product_rows

    def uses(self, t: torch.Tensor) -> bool:
        """Whether ``t`` (or a view of its memory, such as its transpose) was an argument."""
        pointer = _storage_pointer(t)
        return pointer != 0 and pointer in self.storages


def storages_of(*values) -> dict[int, int]:
    """{storage pointer: bytes} of every tensor in the values (nested lists, tuples and dicts, a
    module's parameters and buffers): a call's own inputs, which ``max_elements`` does not count
    (``OpRecorder(policy, exempt=storages_of(args, kwargs, inputs))``)."""
    found: dict[int, int] = {}

    def walk(value, depth: int) -> None:
        if isinstance(value, torch.Tensor):
            with contextlib.suppress(RuntimeError, NotImplementedError):
                storage = value.untyped_storage()
                found[storage.data_ptr()] = max(found.get(storage.data_ptr(), 0), storage.nbytes())
        elif isinstance(value, torch.nn.Module):
            for t in (*value.parameters(), *value.buffers()):
                walk(t, depth)
        elif depth < 4 and isinstance(value, (list, tuple)):
            for v in value:
                walk(v, depth + 1)
        elif depth < 4 and isinstance(value, dict):
            for v in value.values():
                walk(v, depth + 1)

    for value in values:
        walk(value, 0)
    return found


@dataclass
class OpRecorder(TorchDispatchMode):
    """Records every aten op reached inside the block and refuses what ``policy`` does not allow.

    ops: op name -> count; products, flops: matrix-product ops and their FLOPs; calls: each op
    (kept only when ``keep_calls``); violations: a sentence for each refusal; largest,
    largest_shape, largest_op: the largest storage, in elements of the tensor's dtype, that any
    tensor an op took or returned had (however it grew: a new tensor, ``resize_``, ``out=``,
    ``set_``, a view of a large tensor made before the call), the shape of that tensor and the op
    after which it was seen; exempt: {storage pointer: bytes} of the call's own inputs
    (:func:`storages_of`), not counted while they keep their size. A refused op raises
    :class:`NotAllowedError` (which the caller's code may catch: the violation stays recorded).
    """

    policy: Policy = field(default_factory=Policy)
    keep_calls: bool = False
    ops: Counter = field(default_factory=Counter)
    products: int = 0
    flops: int = 0
    calls: list = field(default_factory=list)
    violations: list = field(default_factory=list)
    produced: set = field(default_factory=set)      # storage pointers of every op's results
    largest: int = 0                                # elements of the largest storage seen
    largest_shape: tuple = ()
    largest_op: str = ""
    exempt: dict = field(default_factory=dict)      # the inputs' storages: pointer -> bytes

    def __post_init__(self):
        super().__init__()
        _warm_up()
        self.profile_hook = self._profile_hook if self.policy.codes else None
        self._outer_profile = []

    def _profile_hook(self, frame, event, arg) -> None:
        """With forbidden callables: every Python call, torch ops or not (an allocator's
        bookkeeping reaches none), is checked against them. Records the refusal (raising in a
        profile function would switch it off); the call then fails on its violations."""
        if event == "call" and frame.f_code in self.policy.codes:
            name = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
            self.refuse(f"{frame.f_globals.get('__name__', '')}.{name}")

    def __enter__(self):
        if self.profile_hook is not None:
            self._outer_profile.append(sys.getprofile())
            sys.setprofile(self.profile_hook)
        return super().__enter__()

    def __exit__(self, exc_type, exc_val, exc_tb):
        if self.profile_hook is not None:
            sys.setprofile(self._outer_profile.pop())
        return super().__exit__(exc_type, exc_val, exc_tb)

    def refuse(self, what: str, error: NotAllowedError | None = None) -> NotAllowedError:
        error = error if error is not None else self.policy.refusal(what)
        self.violations.append(str(error))
        return error

    def held(self, t: torch.Tensor) -> int:
        """Elements (of t's dtype) in t's storage; 0 for a call's input that kept its size."""
        try:
            storage = t.untyped_storage()
            pointer, size = storage.data_ptr(), storage.nbytes()
        except (RuntimeError, NotImplementedError):         # sparse, nested: no one storage
            return t.numel()
        if pointer in self.exempt and size <= self.exempt[pointer]:
            return 0
        return size // max(t.element_size(), 1)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        self.ops[f"aten.{name}"] += 1
        rows = 0
        if name in PRODUCT_OPS:
            rows, flops = _product_size(name, args)
            self.products += 1
            self.flops += flops
        policy = self.policy
        what = f"torch's {name} (aten.{name})"
        if op_family(name) == "product":
            what = (f"torch's {name} (aten.{name}, which @, matmul, einsum, torch.linalg and "
                    "their aliases reach)")
        if name in policy.named:
            raise self.refuse(what)
        if policy.autograd:
            running = _autograd_at_work(name)
            if running is not None:
                raise self.refuse(running)
        if not policy.allows(func):
            raise self.refuse(what, policy.unlisted(what))
        if policy.numpy and name in ("lift_fresh", "lift_fresh_copy", "lift"):
            tensor = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if tensor is not None and not tensor.untyped_storage().resizable():
                raise self.refuse("a tensor on NumPy's (or another library's) memory")
        if policy.words or policy.codes:
            where = _forbidden_frame(policy, sys._getframe(1))
            if where is not None:
                raise self.refuse(where)
        given = _tensor_arguments(args, kwargs)
        if self.keep_calls:
            tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
            self.calls.append(TorchCall(name, tuple(tuple(t.shape) for t in tensors),
                                        tuple(_storage_pointer(t) for t in tensors), rows))
        result = func(*args, **kwargs)
        results = [t for t in (result if isinstance(result, (tuple, list)) else (result,))
                   if isinstance(t, torch.Tensor)]
        for t in results:
            self.produced.add(_storage_pointer(t))
        for t in (*given, *results):            # after the op: what resize_, out=, set_ grew
            elements = self.held(t)
            if elements > self.largest:
                self.largest, self.largest_shape = elements, tuple(t.shape)
                self.largest_op = f"aten.{name}"
        return result


_NUMPY_API = ("numpy", "numpy.linalg", "numpy.fft", "numpy.emath", "numpy.polynomial",
              "numpy.lib.stride_tricks")


def _numpy_callables() -> list[tuple[object, str, object]]:
    """(module, name, function) for every public NumPy function and ufunc, wherever a loaded NumPy
    module holds it (``numpy._core.multiarray.dot`` is ``numpy.dot``). NumPy's internal helpers
    stay: torch imports NumPy modules lazily, and their import runs those helpers."""
    import importlib
    public = {}
    for name in _NUMPY_API:
        with contextlib.suppress(ImportError):
            module = importlib.import_module(name)
            for attr, value in list(vars(module).items()):
                if callable(value) and not isinstance(value, (type, types.ModuleType)) \
                        and not attr.startswith("_"):
                    public[id(value)] = value
    found = []
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "numpy" or name.startswith("numpy.")):
            continue
        for attr, value in list(vars(module).items()):
            if id(value) in public and not attr.startswith("__"):
                found.append((module, attr, value))
    return found


def _llmcore_functions(words: Sequence[str]) -> list[tuple[object, str, object]]:
    found = []
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "llmcore" or name.startswith("llmcore.")) \
                or name in _EXEMPT_MODULES:
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, types.FunctionType) and _is_library_name(
                    getattr(value, "__module__", "") or "", value.__name__, words):
                found.append((module, attr, value))
    return found


_CONVERSIONS = ("from_numpy", "as_tensor", "asarray", "tensor", "frombuffer", "from_dlpack")
"""torch's functions that make a tensor from an array (refused for arrays when NumPy is)."""


_warm = False


def _warm_up() -> None:
    """Dispatch ops through a mode, once per process, before any recorder is entered: the first
    dispatch imports torch._dynamo, whose import runs NumPy functions, which must not meet the
    refusing stand-ins (nor count as the learner's)."""
    global _warm
    if not _warm:
        _warm = True
        with OpRecorder():
            torch.ones(2).softmax(-1) @ torch.ones(2)


@contextlib.contextmanager
def blocked(recorder: OpRecorder) -> Iterator[dict]:
    """Swap what the recorder's policy forbids but no aten op reveals for refusing stand-ins:
    llmcore's functions named by the policy (the NumPy reference twins compute without torch),
    every NumPy function (when the policy forbids NumPy), ``Tensor.numpy``/``__array__`` and the
    array -> tensor conversions; in their modules, in ``__main__`` and in llmcore's modules.
    Yields {id(stand-in): original} (the canaries check they are still in place)."""
    policy = recorder.policy
    originals: dict[int, tuple[object, str]] = {}          # id(original) -> description
    patches: list[tuple[object, str, object]] = []

    def stand_in(what: str, original):
        def refusing(*args, **kwargs):
            raise recorder.refuse(what)
        refusing.__name__ = getattr(original, "__name__", "refused")
        return refusing

    def convert_checked(what: str, original):
        import numpy
        def converting(data, *args, **kwargs):
            if isinstance(data, numpy.ndarray) or hasattr(data, "__array_interface__") \
                    or hasattr(data, "__dlpack__") and not isinstance(data, torch.Tensor):
                raise recorder.refuse(what)
            return original(data, *args, **kwargs)
        converting.__name__ = original.__name__
        return converting

    found = _llmcore_functions(policy.words) if policy.words else []
    for module, attr, value in found:
        originals[id(value)] = (stand_in(f"{value.__module__}.{value.__qualname__}", value), attr)
    if policy.numpy:
        for module, attr, value in _numpy_callables():
            if id(value) not in originals:
                originals[id(value)] = (stand_in(f"numpy's {attr}", value), attr)
            found.append((module, attr, value))
        for attr in _CONVERSIONS:
            value = getattr(torch, attr, None)
            if value is not None:
                originals[id(value)] = (convert_checked(f"torch.{attr} of an array", value), attr)
                found.append((torch, attr, value))
        for attr in ("numpy", "__array__"):
            value = getattr(torch.Tensor, attr)
            originals[id(value)] = (stand_in(f"Tensor.{attr}() (a tensor handed to NumPy)",
                                             value), attr)
            found.append((torch.Tensor, attr, value))
    namespaces = [sys.modules.get("__main__")] + [
        m for name, m in list(sys.modules.items()) if m is not None
        and (name == "llmcore" or name.startswith("llmcore.")) and name not in _EXEMPT_MODULES]
    for namespace in namespaces:
        if namespace is None:
            continue
        for attr, value in list(vars(namespace).items()):
            if id(value) in originals:
                found.append((namespace, attr, value))
    seen = set()
    for owner, attr, value in found:
        if (id(owner), attr) in seen:
            continue
        seen.add((id(owner), attr))
        patches.append((owner, attr, value))
        setattr(owner, attr, originals[id(value)][0])
    try:
        yield {id(originals[id(v)][0]): (o, a) for o, a, v in patches}
    finally:
        for owner, attr, original in reversed(patches):
            setattr(owner, attr, original)


@contextlib.contextmanager
def forbid(*targets: str | Allow | Callable, hint: str = "") -> Iterator[OpRecorder]:
    """Inside the block, reaching any target raises :class:`NotAllowedError` with a clear message.

    targets:
      ``"aten.NAME"``     the aten op NAME, however it is reached (``"aten.mm"`` covers ``@``,
                          torch.matmul, torch.mm, torch.ops.aten.mm, torch.linalg.matmul, ...);
      ``"llmcore.WORD"``  every llmcore function whose name contains WORD, called directly or
                          through any other function (the NumPy reference twins included);
      ``"numpy"``         every NumPy function, and tensors handed to or taken from NumPy;
      ``"autograd"``      every op autograd runs (backward engine, forward AD, ``*_backward*``);
      ``Allow(families)`` every aten op outside those :data:`FAMILIES` (PRODUCTS, SOFTMAXES,
                          ATTENTIONS and AUTOGRAD each hold one; several intersect);
      a callable          that very function or method (for example ``Attention.forward``);
                          a class or module: every function it defines (``llmcore.paged``, ``PAGING``).
    hint: a sentence added to the message, saying what to use instead.

    ``with forbid(*SOFTMAXES, hint="Use torch.exp, amax and sum."): got = softmax_rows(x)``.
    """
    recorder = OpRecorder(Policy.of(targets, hint))
    with recorder, blocked(recorder):
        yield recorder


@contextlib.contextmanager
def watch_torch_calls() -> Iterator[list[TorchCall]]:
    """Record every aten op reached inside the block, in order (whatever Python path led there).

    >>> with watch_torch_calls() as calls:
    ...     y = torch.ones(3, 2) @ torch.ones(2, 4)
    >>> [c.name for c in calls if c.is_product]
    ['mm']
    """
    recorder = OpRecorder(keep_calls=True)
    with recorder:
        yield recorder.calls
