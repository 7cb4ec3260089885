"""Op families: what an allowlist is made of, and the library's shortcuts, in one table.

Every aten op a computation reaches belongs to at most one family (:func:`op_family`): the
families a learner's own code is built from (creation, elementwise, indexing, reduction, shape,
normalization) are lists below or torch's own description of an op; the matrix products and
softmax are rows of :data:`SHORTCUTS`, the one table of the library's shortcuts, which also says
which ops count as matrix products (``products`` and ``flops`` of a recorder) and which a policy
names when it refuses them. An :class:`Allow` names the families a call may reach. Imports torch,
never llmcore. Chapters 2-4 and 7 and their exercises.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

import torch


class Shortcuts(NamedTuple):
    """One row of :data:`SHORTCUTS`: ops of one kind, the family an allowlist knows them by
    (None: in no family, so refused by every allowlist), and whether each is counted as a matrix
    product (``products``, ``flops``)."""

    what: str
    family: str | None
    counted: bool
    ops: tuple[str, ...]


def _row(what: str, family: str | None, counted: bool, ops: str) -> Shortcuts:
    return Shortcuts(what, family, counted, tuple(ops.split()))


SHORTCUTS = (
    _row("matrix products: what @, matmul, einsum, tensordot, F.linear and torch.linalg end in",
         "product", True, "mm bmm addmm addbmm baddbmm mv addmv dot vdot addr _addmm_activation"),
    _row("the composite products, named before they decompose", "product", False,
         "matmul linear einsum tensordot"),
    _row("integer and scaled matrix products", None, True, "_int_mm _scaled_mm"),
    _row("packed low-bit and grouped products", None, False,
         "_weight_int8pack_mm _weight_int4pack_mm _grouped_mm mkldnn_linear"),
    _row("convolutions", None, True,
         "convolution _convolution mkldnn_convolution cudnn_convolution"),
    _row("convolutions, named before they decompose", None, False,
         """conv_tbc conv1d conv2d conv3d _convolution_mode conv_transpose1d conv_transpose2d
         im2col"""),
    _row("fused attention kernels", None, True,
         """_scaled_dot_product_flash_attention _scaled_dot_product_flash_attention_for_cpu
         _scaled_dot_product_efficient_attention _scaled_dot_product_cudnn_attention
         _efficient_attention_forward _flash_attention_forward _fused_sdp_choice
         _native_multi_head_attention"""),
    _row("fused attention's other parts", None, False,
         "_safe_softmax _scaled_dot_product_attention_math"),
    _row("softmax", "softmax", False,
         "_softmax softmax _log_softmax log_softmax special_softmax special_log_softmax"),
    _row("other products in disguise (bilinear forms, sparse products, bags of embeddings, "
         "distances, chains)", None, False,
         """_trilinear bilinear _sparse_mm _sparse_addmm _sparse_sparse_matmul sspaddmm
         _embedding_bag _embedding_bag_forward_only embedding_bag _cdist_forward _euclidean_dist
         cdist chain_matmul linalg_multi_dot linalg_matmul linalg_vecdot inner"""),
    _row("Fourier transforms", None, False, "_fft_r2c _fft_c2c _fft_c2r"),
)
"""The library's shortcuts, one row per kind. Every op here is one a policy names when its
allowlist refuses it (:data:`SHORTCUT_OPS`), so the record states it; an allowlist refuses every
other op outside its families all the same."""

PRODUCT_OPS = frozenset(op for row in SHORTCUTS if row.counted for op in row.ops)
"""The aten ops counted as matrix products (``products``, ``flops``)."""

SHORTCUT_OPS = frozenset(op for row in SHORTCUTS for op in row.ops)
"""Every op of :data:`SHORTCUTS`: the library shortcuts known by name."""

_LISTED = MappingProxyType({
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
})
"""The families of the ops a learner's own code is built from, written as lists (in-place forms,
``NAME_``, follow their op). Elementwise ops and views are also recognised from torch's own
description of each op (:func:`op_family`)."""

_FAMILY_OF = MappingProxyType(
    {**{name: family for family, names in _LISTED.items() for name in names.split()},
     **{op: row.family for row in SHORTCUTS for op in row.ops}})

FAMILIES = MappingProxyType({
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
})
"""Every op family an :class:`Allow` may name, with what it holds, in the words a refusal uses.
The tables here are read-only views (``MappingProxyType``) and the families found are kept by
``functools.lru_cache``, not in a dict: no code in the kernel can change what an op's family is."""


def _aten_packet(name: str):
    try:
        packet = getattr(torch.ops.aten, name)
    except (AttributeError, RuntimeError):
        return None
    return packet if isinstance(packet, torch._ops.OpOverloadPacket) else None


@functools.lru_cache(maxsize=None)
def _family_of_name(name: str, packet=None) -> str | None:
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
