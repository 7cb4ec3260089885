"""A GPT's whole decode step at batch 1 in one call to C, on llmcore's one-row kernels.

At batch 1 the matrix products of a decode step read the weights once each and run at the
memory's speed (:mod:`llmcore.onerow`). The rest of the step is little arithmetic in many
small operations: LayerNorm, attention of one query over the cached keys, GELU, the residual
additions, some 25 PyTorch operators a block. Each costs a few microseconds of Python and of
PyTorch's dispatcher, whatever its size: on GPT-2 small about 2.3 ms a step on the course's
Intel Xeon, against 4-7 ms of products in int8 or int4. ``native/step.c`` runs the step as one
C function, the same operations in the same order and with the same roundings as
:meth:`llmcore.fastpath.FastGPT._block`, calling the same product kernels: what a serving
engine's fused decode kernel does, written out. Chapter 13.

:class:`GPTStepInC` is built by :func:`gpt_step_in_c` from a :class:`llmcore.fastpath.FastGPT`
whose every matrix takes a C kernel (the one-row forms of :data:`llmcore.lowbit.ONE_ROW_FORMATS`,
float32's included); the fast path then runs its one-token steps at batch 1 through it, and a
prompt's tokens too where one call multiplies all their rows (bfloat16 on AMX:
:func:`why_no_prompts`). Any other case (several rows, a mask, another device or kernel)
keeps the PyTorch step, and :func:`why_not` says why.
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from . import onerow
from .lowbit import ONE_ROW_FORMATS

KIND_FP32, KIND_W8A8, KIND_INT8, KIND_BF16, KIND_INT4 = range(5)
"""``llmcore_matrix.kind`` in ``native/step.c``: which kernel reads a matrix."""

KINDS = {"fp32": KIND_FP32, "w8a8": KIND_W8A8, "int8": KIND_INT8, "bf16": KIND_BF16,
         "int4": KIND_INT4}
"""The kind of each one-row format's matrices, by its key in ``ONE_ROW_FORMATS``."""

ACTIVATIONS = {KIND_FP32: torch.float32, KIND_W8A8: torch.float32, KIND_INT8: torch.bfloat16,
               KIND_BF16: torch.bfloat16, KIND_INT4: torch.bfloat16}
"""The dtype a kind's products take and give (and its biases', and the KV cache's)."""

_P, _L = ctypes.c_void_p, ctypes.c_long


class Matrix(ctypes.Structure):
    """``llmcore_matrix``: one prepared matrix and the kernel that reads it."""

    _fields_ = [("kind", _L), ("d_in", _L), ("d_out", _L), ("group", _L),
                ("w", _P), ("a", _P), ("b", _P), ("bias", _P)]


class Block(ctypes.Structure):
    """``llmcore_gpt_block``: one GPT block's norms and matrices."""

    _fields_ = [("ln_1_scale", _P), ("ln_1_shift", _P), ("qkv", Matrix), ("o", Matrix),
                ("ln_2_scale", _P), ("ln_2_shift", _P), ("up", Matrix), ("down", Matrix)]


class Model(ctypes.Structure):
    """``llmcore_gpt``: a GPT's shapes, embeddings, blocks and head."""

    _fields_ = [("layers", _L), ("d", _L), ("heads", _L), ("kv_heads", _L), ("d_head", _L),
                ("vocab", _L), ("eps", ctypes.c_float), ("token_embedding", _P),
                ("position_embedding", _P), ("blocks", ctypes.POINTER(Block)),
                ("ln_f_scale", _P), ("ln_f_shift", _P), ("head", Matrix)]


def kind_of(linear) -> int | None:
    """The kind of the matrices ``linear`` multiplies (a one-row format's product), or None when
    it is not one of llmcore's C kernels."""
    for name, kind in KINDS.items():
        fmt = ONE_ROW_FORMATS.get(name)
        if fmt is not None and linear is fmt.linear:
            return kind
    return None


def _pointer(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _float32_vector(t: Tensor, size: int, what: str) -> Tensor:
    if not (t.dtype == torch.float32 and t.is_cpu and t.is_contiguous()
            and tuple(t.shape) == (size,)):
        raise ValueError(f"{what}: expected a contiguous float32 ({size},) vector on the CPU, "
                         f"got {t.dtype} {tuple(t.shape)} on {t.device}")
    return t


def describe(kind: int, weight, bias: Tensor | None, d_in: int) -> Matrix:
    """A :class:`Matrix` for ``weight`` as its kind's product reads it, with its bias (in the
    kind's activations' dtype, or None). Each layout is checked here, once, with the same
    messages the Python kernels give: a tensor C reads must be what C expects."""
    dtype = ACTIVATIONS[kind]
    probe = torch.empty(1, d_in, dtype=dtype)
    if kind == KIND_FP32:
        out = onerow.fp32_onerow(probe.zero_(), weight, bias)      # checks w and the bias
        return Matrix(kind, d_in, out.shape[1], 0, _pointer(weight), None, None,
                      _pointer(bias))
    if kind == KIND_W8A8:
        out = onerow.w8a8_onerow(probe.zero_(), weight, bias)
        return Matrix(kind, d_in, out.shape[1], 0, _pointer(weight.codes),
                      _pointer(weight.row_sums), _pointer(weight.scale), _pointer(bias))
    if kind == KIND_INT8:
        out = onerow.int8_onerow(probe.zero_(), weight, bias)
        return Matrix(kind, d_in, out.shape[1], 0, _pointer(weight.values),
                      _pointer(weight.scale), None, _pointer(bias))
    if kind == KIND_BF16:
        out = onerow.bf16_onerow(probe.zero_(), weight, bias)
        return Matrix(kind, d_in, out.shape[1], 0, _pointer(weight), None, None,
                      _pointer(bias))
    out = onerow.int4_onerow(probe.zero_(), weight, bias)
    return Matrix(kind, d_in, out.shape[1], weight.group_size, _pointer(weight.codes),
                  _pointer(weight.scale), _pointer(weight.offset), _pointer(bias))


def why_not(fast) -> str:
    """Why :func:`gpt_step_in_c` cannot serve ``fast`` ("" when it can)."""
    model = fast.model
    if type(fast).__name__ != "FastGPT":
        return f"the C step is a GPT's, not a {type(fast).__name__}'s"
    if model.device.type != "cpu" or not onerow.available(model.device):
        return f"the one-row kernels do not run here: {onerow.unavailable_reason(model.device)}"
    if fast.batch_size != 1:
        return f"the C step serves batch 1, not {fast.batch_size}"
    if model.dtype != torch.float32:
        return f"the C step reads a float32 model's embeddings, not {model.dtype}"
    if fast.compiled:
        return "the blocks are compiled (torch.compile)"
    kinds = {kind_of(fast.linear), kind_of(fast.head_linear if fast.head is not None
                                           else fast.linear)}
    if None in kinds:
        return f"not every product is one of llmcore's C kernels: {fast.kernel}"
    return ""


def why_no_prompts(kind: int) -> str:
    """Why the step in C cannot take a prompt's tokens at once for matrices of ``kind`` (""
    when it can): a prompt's rows pay off in C only where one call multiplies them all,
    reading each weight once. That is bfloat16 on AMX (``native/amx.c``); any other kernel
    takes one row at a time, and PyTorch's batched products serve a prompt faster."""
    if kind != KIND_BF16:
        return "only bfloat16's products (on AMX) take a prompt's rows at once in C"
    if onerow.amx_available():
        return ""
    return f"AMX does not run here: {onerow.amx_unavailable_reason()}"


def gpt_step_in_c(fast) -> GPTStepInC | None:
    """A :class:`GPTStepInC` for ``fast``, or None (:func:`why_not` says why)."""
    return None if why_not(fast) else GPTStepInC(fast)


class GPTStepInC:
    """One decode step of ``fast`` (a :class:`llmcore.fastpath.FastGPT`, batch 1, every product a
    C kernel) in one call to ``llmcore_gpt_step``: ``step(tokens, positions, cache)`` with
    tokens, positions (1, 1) -> logits (1, v) float32, the cache's row ``cache.length`` written
    in every layer. The prepared matrices are ``fast``'s own (no copy; they stay alive with
    ``fast``); the embeddings, and float32's output projection, are read from the model at
    every call, as the PyTorch step reads them. ``product_seconds``, when not None, gains the
    seconds spent in the matrix products (the profile of chapter 13's benchmark)."""

    def __init__(self, fast):
        why = why_not(fast)
        if why:
            raise ValueError(f"GPTStepInC: {why}")
        model, c = fast.model, fast.config
        self.fast, self.d = fast, c.d_model
        self.kind = kind_of(fast.linear)
        self.head_kind = kind_of(fast.head_linear) if fast.head is not None else self.kind
        self.dtype = ACTIVATIONS[self.kind]
        if fast.dtype != self.dtype or ACTIVATIONS[self.head_kind] != self.dtype:
            raise ValueError(f"GPTStepInC: the fast path's activations are {fast.dtype}, its "
                             f"kernels take {self.dtype} and {ACTIVATIONS[self.head_kind]}")
        d, f = c.d_model, None
        blocks = (Block * len(fast.blocks))()
        for block, w in zip(blocks, fast.blocks):
            f = w.b_up.shape[0]
            block.ln_1_scale = _float32_vector(w.ln_1_scale, d, "ln_1_scale").data_ptr()
            block.ln_1_shift = _float32_vector(w.ln_1_shift, d, "ln_1_shift").data_ptr()
            block.ln_2_scale = _float32_vector(w.ln_2_scale, d, "ln_2_scale").data_ptr()
            block.ln_2_shift = _float32_vector(w.ln_2_shift, d, "ln_2_shift").data_ptr()
            block.qkv = describe(self.kind, w.w_qkv, w.b_qkv, d)
            block.o = describe(self.kind, w.w_o, w.b_o, d)
            block.up = describe(self.kind, w.w_up, w.b_up, d)
            block.down = describe(self.kind, w.w_down, w.b_down, f)
            if (block.qkv.d_out, block.o.d_out, block.up.d_out, block.down.d_out) != (
                    (fast.h + 2 * fast.h_kv) * fast.d_head, d, f, d):
                raise ValueError("GPTStepInC: the block's matrices do not have GPT's shapes")
        scale, shift = fast.ln_f
        self.model = Model(len(blocks), d, fast.h, fast.h_kv, fast.d_head, c.vocab_size,
                           fast.eps, 0, 0, blocks, _float32_vector(scale, d, "ln_f").data_ptr(),
                           _float32_vector(shift, d, "ln_f").data_ptr())
        self._blocks = blocks                          # alive as long as self.model points
        if fast.head is not None:
            self.model.head = describe(self.head_kind, fast.head, None, d)
        self.product_seconds: float | None = None
        self._spent = ctypes.c_double(0.0)
        self.why_no_prompts = why_no_prompts(self.kind)
        """Why a prompt's tokens cannot go through C at once ("" when they can)."""
        self.prompts = not self.why_no_prompts
        """Whether a call may take several tokens (a prompt) in one call to C."""

    def __call__(self, tokens: Tensor, positions: Tensor, cache) -> Tensor:
        """tokens, positions: (1, n) -> logits (1, v) float32 of the last token; the cache gains
        n tokens, each attending over the rows up to its own. n > 1 (a prompt) only where
        :attr:`prompts`, with consecutive positions."""
        model, fast, g = self.fast.model, self.fast, self.model
        n = tokens.shape[1]
        embedding, positions_table = model.token_embedding, model.position_embedding
        if not (embedding.dtype == positions_table.dtype == torch.float32
                and embedding.is_contiguous() and positions_table.is_contiguous()
                and embedding.is_cpu and positions_table.is_cpu
                and tuple(embedding.shape) == (g.vocab, self.d)
                and positions_table.dim() == 2 and positions_table.shape[1] == self.d):
            raise ValueError(f"GPTStepInC: expected the model's embeddings as contiguous "
                             f"float32 CPU tensors ({g.vocab}, {self.d}) and (positions, "
                             f"{self.d}), got {embedding.dtype} {tuple(embedding.shape)} and "
                             f"{positions_table.dtype} {tuple(positions_table.shape)}; build a "
                             f"new fast path")
        if n < 1 or tuple(positions.shape) != (1, n):
            raise ValueError(f"GPTStepInC: expected tokens and positions (1, n), n >= 1, got "
                             f"{tuple(tokens.shape)} and {tuple(positions.shape)}")
        if n == 1:
            token = lowest = highest = int(tokens.item())
            position = int(positions.item())
        else:
            if not self.prompts:
                raise ValueError(f"GPTStepInC: {n} tokens at once, but {self.why_no_prompts}")
            ids = tokens.reshape(n).to(torch.long).contiguous()
            lowest, highest = int(ids.min()), int(ids.max())
            position = int(positions[0, 0])
            if not torch.equal(positions.reshape(n).cpu(), torch.arange(position, position + n)):
                raise ValueError(f"GPTStepInC: expected consecutive positions for {n} tokens, "
                                 f"got {positions.tolist()}")
        last = position + n - 1
        if not (0 <= lowest and highest < g.vocab and 0 <= position
                and last < positions_table.shape[0]):
            where = f"{position}" if n == 1 else f"{position} to {last}"
            raise IndexError(f"token {lowest if lowest < 0 else highest} or position {where} "
                             f"out of range ({g.vocab} tokens, {positions_table.shape[0]} "
                             f"positions)")
        keys, values = cache.keys, cache.values
        capacity = keys.shape[3] if keys.dim() == 5 else 0
        shape = (g.layers, 1, g.kv_heads, capacity, g.d_head)
        if not all(t.dtype == self.dtype and tuple(t.shape) == shape and t.is_contiguous()
                   and t.is_cpu for t in (keys, values)):
            raise ValueError(f"GPTStepInC: expected the cache's keys and values as contiguous "
                             f"{self.dtype} CPU tensors (layers, 1, kv_heads, capacity, "
                             f"d_head) = {shape}, got {keys.dtype} {tuple(keys.shape)} and "
                             f"{values.dtype} {tuple(values.shape)}")
        start = cache.length
        if not (0 <= start and start + n <= capacity):
            raise ValueError(f"GPTStepInC: the cache holds {capacity} {keys.dtype} rows, "
                             f"{start} filled; expected room for {n} more")
        g.token_embedding = embedding.data_ptr()
        g.position_embedding = positions_table.data_ptr()
        if fast.head is None:                    # float32's own (d, v) projection
            head = fast.output_matrix()
            if tuple(head.shape) != (self.d, g.vocab) or not head.is_contiguous():
                raise ValueError(f"GPTStepInC: expected the output projection as a contiguous "
                                 f"({self.d}, {g.vocab}) matrix, got {tuple(head.shape)}")
            g.head = Matrix(KIND_FP32, self.d, head.shape[1], 0, head.data_ptr(), None, None,
                            None)
        logits = torch.empty(1, g.vocab, dtype=torch.float32)
        timing = self.product_seconds is not None
        self._spent.value = 0.0
        spent = ctypes.addressof(self._spent) if timing else None
        bf16_cache = self.dtype == torch.bfloat16
        if n == 1:
            status = onerow.gpt_step(ctypes.addressof(g), keys.data_ptr(), values.data_ptr(),
                                     capacity, bf16_cache, token, position, start,
                                     logits.data_ptr(), spent)
        else:
            status = onerow.gpt_tokens(ctypes.addressof(g), keys.data_ptr(), values.data_ptr(),
                                       capacity, bf16_cache, ids.data_ptr(), n, position, start,
                                       logits.data_ptr(), spent)
        if status:
            raise MemoryError("GPTStepInC: no memory for the step's activations")
        if timing:
            self.product_seconds += self._spent.value
        cache.length = start + n
        return logits
