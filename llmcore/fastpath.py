"""The fast inference path: the same model, the same numbers, fewer and larger operations per token.

The teaching path (``GPT.forward`` or ``Llama.forward`` with a :class:`llmcore.kvcache.KVCache`)
shows every step: each layer checks its operands' shapes, the cache returns views that explicit
attention masks and softmaxes, and generation runs under ``torch.no_grad``. Decoding one token of
a small model is then a hundred small torch calls whose Python overhead costs more than the
arithmetic. This module runs the same weights with what a serving engine does instead:

1. ``torch.inference_mode`` instead of ``no_grad`` (no version counters, no autograd metadata);
2. validation once per call (tokens, mask, lengths), never per layer per step;
3. every projection as one ``torch.addmm`` (bias + x @ w in one call; GPT's fused QKV), the
   residual added in place;
4. PyTorch's fused attention (``scaled_dot_product_attention``): the prompt with its own causal
   rule (no past, so top-left = bottom-right), each decode step with no mask at all (one new query
   sees every cached key) or, with left padding, an explicit key mask (b, 1, 1, m);
5. a static cache allocated once for prompt + new tokens, written in place; positions and masks
   are slices of tensors made once, so a step makes no per-step dtype or device copies;
6. optionally ``torch.compile`` of the per-layer step (``compile=True``);
7. optionally fewer bytes per weight (``precision=``, chapter 13): "bf16", "int8", "w8a8" or
   "int4", each a row of :data:`llmcore.lowbit.FORMATS` (how a matrix is stored, its product,
   the head's); the residual stream, the norms (computed on it) and the embeddings stay in
   float32.

:class:`FastDecoder` is the step every decoder shares (embed, blocks, last row's logits); a
:class:`FastGPT` or :class:`FastLlama` fills in its model's block. :class:`FastStep` is what
:func:`llmcore.decode.decode` calls: ``generate(model, prompt, t, fast=True)`` is the teaching
loop with this step in place of the model's forward, and the tests check that both paths give
the same logits and the same tokens. Chapter 7 (the fast path).
"""

from __future__ import annotations

import statistics
import time
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .layout import check_attention_mask
from .llama import Llama
from .lowbit import (ONE_ROW_FORMATS, Format, bytes_of, dense, format_of, pack,
                     packed_linear, packed_linear_available, plain_linear)
from .masks import causal_mask, sliding_window_mask
from .model import GPT
from .onerow_step import gpt_step_in_c
from .quantize import round_weight
from .rope import rope_tables, rotate_half
from .storage import storage_bytes


class StaticCache:
    """K and V of every layer in two tensors (L, b, h_kv, capacity, d_head), allocated once.

    ``length`` slots are filled, the same for every sequence (left padding is kept out of
    attention by the step's key mask). Chapter 7 (the fast path).
    """

    def __init__(self, model, batch_size: int, capacity: int, *,
                 dtype: torch.dtype | None = None):
        c = model.config
        shape = (c.n_layers, batch_size, c.kv_heads, capacity, c.d_head)
        dtype = model.dtype if dtype is None else dtype          # the fast path's: fast.dtype
        self.keys = torch.empty(shape, device=model.device, dtype=dtype)
        self.values = torch.empty(shape, device=model.device, dtype=dtype)
        self.length = 0


PACK_ONE_ROW_ABOVE_BYTES = 32 * 2**20
"""Weights larger than this (each storage once) may take oneDNN's packed product even for one
row: which one-row kernel streams them faster is measured (:meth:`FastDecoder.measure_one_row`).

A decode step of such a model reads its weights from memory, not from the CPU's last-level
cache (a common size, and this course machine's: 32 MiB). Which kernel reads them faster
depends on the CPU: oneDNN's packed layout on the course's earlier machines (GPT-2 small, one
row: about 22 ms against 28.5 ms with ``addmm``), ``addmm`` (Intel's MKL) on an Intel Xeon with
AMX (GPT-2 small's float32 step: 17 ms against 21-23 ms packed). A model that stays in the
cache (the 4M model: 0.77 ms plain, 1.0 ms packed) pays less per call with plain ``addmm`` and
is not measured. ``fast_model(model, pack=True)`` or ``pack=False`` chooses explicitly."""

DENSE_BF16_WHEN_CACHED = True
"""Whether one row of a model that stays in the CPU's cache (not :func:`streams_from_memory`) in
"bf16" runs :func:`llmcore.lowbit.dense`: float32 products on its bf16-rounded weights. bf16's
gain at one row is reading half the bytes, and a cached model reads them from the cache; its
kernels (oneDNN's, converting every activation and weight) then lose to float32's: the 4M
model's bf16 decode ran at 0.59-0.84x float32's speed on an AMD EPYC with AVX512-BF16 and on
an Intel Xeon with AMX. The same weights and float32 arithmetic, as at large batches on a CPU
without bfloat16 arithmetic; ``kernel`` says so. False keeps bf16's own kernel (as
``pack=`` does). A GPT's step with it is then timed against bf16's whole step in C, which
reads bf16's own kernel's bytes without PyTorch's per-op cost, and the faster is kept
(:meth:`FastDecoder.choose_one_row_step`; the 4M model: 0.3 ms a step in C against 1.3 ms)."""

ONE_ROW_ROUNDS = 5
"""Passes of each one-row kernel over a model's block matrices when the fast path measures
which one to keep (:meth:`FastDecoder.measure_one_row`); the median pass of each counts, the
typical one rather than the luckiest: on a shared machine a kernel's speed can change from one
second to the next (on the course's Intel Xeon with AMX, bf16's one-row kernel ran GPT-2
small's block products in 8-9 ms in some seconds and 16-20 ms in others; float32's in 11-14
ms)."""


CLEARLY_FASTER = 1.5
"""When two whole steps are timed (:meth:`FastDecoder.choose_one_row_step`), two rounds suffice
if the best of one is this many times the other's: a generate(fast=True) call, which prepares
its fast model each time, does not pay for rounds that cannot change the choice."""

STEP_IN_C = True
"""Whether a one-token step at batch 1 may run whole in C (:mod:`llmcore.onerow_step`, where it
serves the model and its kernels: :meth:`FastDecoder.choose_one_row_step`). False keeps every
step in PyTorch, each product through the form kept (for comparisons and tests)."""


def streams_from_memory(model, threshold: int | None = None) -> bool:
    """Whether ``model``'s parameters (each storage once: a tied embedding and head are one
    matrix) are more than ``threshold`` bytes (default :data:`PACK_ONE_ROW_ABOVE_BYTES`), so
    that a decode step streams them from memory. Chapter 7 (the fast path)."""
    limit = PACK_ONE_ROW_ABOVE_BYTES if threshold is None else threshold
    return storage_bytes(model.parameters()) > limit


class FastDecoder:
    """A decoder's weights arranged for inference, and its forward step without per-step checks.

    model: a :class:`llmcore.model.GPT` (:class:`FastGPT`) or a :class:`llmcore.llama.Llama`
    (:class:`FastLlama`). ``compile=True`` runs each block through ``torch.compile`` (the first
    calls pay for compilation). batch_size: the rows of a decode step.

    precision None (or "fp32" for a float32 model): the weights are the model's own tensors (no
    copy), so the fast path sees the model's current parameters; from 2 rows on, a CPU float32
    model's products run on oneDNN's prepacked copies of each block's matrices (``w_*``) and of
    the output projection (``self.head``), made here (build a new one after changing the model,
    as ``generate(..., fast=True)`` does on every call); for one row, when the weights are
    larger than a CPU's cache (:func:`streams_from_memory`), whichever of the two forms this
    CPU streams faster, measured on the model's own matrices (:meth:`measure_one_row`;
    ``kernel`` says which); otherwise one row runs the plain ``addmm`` (bfloat16: packed),
    which costs less per call, and "bf16" runs float32 products on its bf16-rounded weights
    (:data:`DENSE_BF16_WHEN_CACHED`). ``pack`` (True or False) overrides that rule; packing
    needs oneDNN and is never used with ``compile`` or an integer format. "bf16", "int8",
    "w8a8", "int4": this object holds its own copies of the matrices in that format (its row
    of :data:`llmcore.lowbit.FORMATS` for this batch size, :func:`llmcore.lowbit.format_of`:
    on the CPU a large batch of "bf16", "int8" or "int4" gets :func:`llmcore.lowbit.dense`,
    the rounded weights in float32), made here from
    the weights of this moment; ``dtype`` is the matrices' activations and the KV cache's
    dtype (bfloat16; float32 for w8a8, whose kernel rounds float32 activations itself), and
    ``stream_dtype`` the residual stream's (float32). At batch 1 on a CPU a GPT's one-token
    steps may run whole in C (``one_row_step``, :meth:`choose_one_row_step`), where that is
    the faster step. A subclass names its block's weights
    (``block_weights``) and its head (``head_matrix``) and writes ``embed``, ``_block`` and
    ``logits``. Chapters 7 and 13.
    """

    def __init__(self, model, *, compile: bool = False, batch_size: int = 1,
                 precision: str | None = None, pack: bool | None = None):
        c = model.config
        self.model, self.config, self.precision = model, c, precision
        self.h, self.h_kv, self.d_head = c.n_heads, c.kv_heads, c.d_head
        self.group = c.n_heads // c.kv_heads
        self.window = getattr(c, "sliding_window", None)      # Mistral's; None: every key
        self.batch_size = batch_size
        self.chosen = compile or pack is not None      # the caller chose the kernels
        self.one_row_seconds: dict[str, float] = {}     # filled when measured,
        self.one_row_dense: set[str] = set()            # and which forms are dense
        self.step_seconds: dict[str, float] = {}        # steps timed (choose_one_row_step)
        # its row of the formats' table, for this batch size (the kernel per batch size)
        fmt = format_of(precision, model.device, batch_size)
        forms = []
        if not compile and pack is None and batch_size == 1 and model.device.type == "cpu":
            if streams_from_memory(model):
                forms = self.one_row_forms(fmt)
            elif precision == "bf16" and DENSE_BF16_WHEN_CACHED:
                fmt = dense(precision)          # half the bytes gain nothing in a cache
        with torch.inference_mode(False):       # normal tensors, usable in any mode
            if len(forms) > 1:
                self.measure_one_row(forms)     # prepares each, keeps the fastest
            else:
                self.use_format(fmt)
                can_pack = not compile and self.packable(fmt)
                if can_pack and pack is None:
                    pack = batch_size >= 2 or self.dtype == torch.bfloat16
                self.prepare_weights(can_pack and bool(pack))
        self.compiled = compile
        self.block = torch.compile(self._block, dynamic=True) if compile else self._block
        self.one_row_step = None        # a subclass's whole step in C (FastGPT: onerow_step)

    def use_format(self, fmt: Format) -> None:
        """Take ``fmt`` (a row of :data:`llmcore.lowbit.FORMATS`, or its dense form) and what
        follows from it: the head's format, the activations' ``dtype``, the residual stream's
        ``stream_dtype``, and whether the model's own tensors serve (``own``)."""
        device = self.model.device
        self.format = fmt
        if fmt.head is None:
            self.head_format = fmt
        elif isinstance(fmt.head, Format):          # a one-row form names its head's form
            self.head_format = fmt.head
        elif fmt.rounding is not None:           # a dense form's head is dense too, alike
            self.head_format = dense(fmt.head, fmt.dtype, amx=fmt.prepare is not None)
        else:
            self.head_format = format_of(fmt.head, device, self.batch_size)
        self.dtype = fmt.dtype or self.model.dtype
        low = self.dtype in (torch.bfloat16, torch.float16)
        self.stream_dtype = torch.float32 if low else self.dtype
        self.own = fmt.own and self.dtype == self.model.dtype

    def prepare_weights(self, packed: bool) -> None:
        """Prepare every block's weights and the head for this precision, packed for oneDNN
        or not, and the products that read them (``linear``, ``head_linear``)."""
        self.packed = packed
        plain = packed_linear if packed else plain_linear
        self.linear = self.format.linear or plain
        self.head_linear = self.head_format.linear or plain
        self.blocks = [self.prepare_block(self.block_weights(block))
                       for block in self.model.blocks]
        self.head = (None if self.serves_own_tensors()
                     else self.prepare_matrix(self.head_matrix(), head=True))

    def packable(self, fmt: Format) -> bool:
        """Whether ``fmt``'s matrices may be packed for oneDNN: a floating-point format (its
        matrices the model's, cast) in a dtype oneDNN multiplies on this model's device."""
        return fmt.prepare is None and fmt.linear is None and packed_linear_available(
            self.model.device, fmt.dtype or self.model.dtype)

    def one_row_forms(self, fmt: Format) -> list[tuple[Format, bool]]:
        """The (format, packed) forms one row of this model may take on this machine: the
        precision's own format and, for a weight-only precision (on the CPU, where the caller
        asks), its dense form (:func:`llmcore.lowbit.dense`: the same rounded weights in
        float32, float32's kernels); each floating-point format plain (``addmm``) and, where
        oneDNN runs it, packed."""
        formats = [fmt] if fmt.dense_from is None else [fmt, dense(self.precision)]
        native = self.one_row_c_form()
        if native is not None and native.available(self.model.device):
            formats.append(native)                    # llmcore's C kernel (llmcore.onerow)
        forms = []
        for each in formats:
            forms.append((each, False))
            if self.packable(each):
                forms.append((each, True))
        return forms

    def one_row_c_form(self) -> Format | None:
        """This precision's C form for one row (:data:`llmcore.lowbit.ONE_ROW_FORMATS`; a float32
        model's own precision is "fp32"), or None where it has none."""
        own = "fp32" if self.model.dtype == torch.float32 else None
        return ONE_ROW_FORMATS.get(self.precision or own)

    def take_form(self, form: dict) -> None:
        """Hold ``form``: the :data:`FORM_ATTRIBUTES` of one prepared form, by name."""
        for name, value in form.items():
            setattr(self, name, value)

    def form_name(self, fmt: Format, packed: bool) -> str:
        """One (format, packed) form in a few words, for ``one_row_seconds`` and ``kernel``."""
        if fmt.prepare is not None or fmt.linear is not None:
            return fmt.kernel
        dtype = str(fmt.dtype or self.model.dtype).removeprefix("torch.")
        kernel = "oneDNN packed" if packed else "addmm"
        rounded = f" on {fmt.rounding}-rounded weights" if fmt.rounding else ""
        return f"{dtype} {kernel}{rounded}"

    FORM_ATTRIBUTES = ("format", "head_format", "dtype", "stream_dtype", "own", "packed",
                       "linear", "head_linear", "blocks", "head")
    """What :meth:`use_format` and :meth:`prepare_weights` set: one form of this model."""

    def measure_one_row(self, forms: list[tuple[Format, bool]],
                        rounds: int = ONE_ROW_ROUNDS) -> None:
        """Keep whichever of ``forms`` (:meth:`one_row_forms`) streams this model's block
        matrices fastest for one row on this CPU (:data:`PACK_ONE_ROW_ABOVE_BYTES`). Each form
        is prepared (all are held until measured), each times ``rounds`` passes of one row
        (ones, in its dtype: not zeros, which a kernel may skip) through every block matrix,
        alternating, and all but the fastest (by its median pass) are dropped;
        ``one_row_seconds`` keeps each form's median pass, and ``one_row_dense`` names the
        dense forms (float32 arithmetic on the rounded weights) among them. Serving engines
        tune their kernels on the machine in the same way. Chapters 7 and 13."""
        prepared, inputs = [], []
        for fmt, packed in forms:
            self.use_format(fmt)
            self.prepare_weights(packed)
            prepared.append({name: getattr(self, name) for name in self.FORM_ATTRIBUTES})
            inputs.append(self.matrix_inputs())
        rows = {(form["dtype"], d): torch.ones(1, d, dtype=form["dtype"],
                                               device=self.model.device)
                for form, d_in in zip(prepared, inputs)
                for d in d_in.values()}                                # one row per d_in, dtype
        passes: list[list[float]] = [[] for _ in forms]
        with torch.inference_mode():
            for _ in range(rounds):
                for i, (form, d_in) in enumerate(zip(prepared, inputs)):
                    linear, dtype = form["linear"], form["dtype"]
                    begin = time.perf_counter()
                    for weights in form["blocks"]:
                        for name, d in d_in.items():
                            linear(rows[dtype, d], getattr(weights, name), None)
                    passes[i].append(time.perf_counter() - begin)
        typical = [statistics.median(seconds) for seconds in passes]
        fastest = min(range(len(forms)), key=typical.__getitem__)
        self.take_form(prepared[fastest])
        self.one_row_seconds = {self.form_name(*form): seconds
                                for form, seconds in zip(forms, typical)}
        self.one_row_dense = {self.form_name(fmt, packed) for fmt, packed in forms
                              if fmt.rounding is not None}

    def step_in_c(self):
        """This model's whole one-row decode step in C for the form now held, or None where
        there is none (default; :class:`FastGPT`: :func:`llmcore.onerow_step.gpt_step_in_c`)."""
        return None

    def choose_one_row_step(self, rounds: int = ONE_ROW_ROUNDS) -> None:
        """Set ``one_row_step``: the step in C (:meth:`step_in_c`) for the form kept, where it
        can serve it. Where it cannot, at batch 1 on a CPU where the precision's C form runs
        (:data:`llmcore.lowbit.ONE_ROW_FORMATS`) and the caller chose no kernel (``pack=``,
        ``compile=``), the kept form's step and the C form's step in C are timed against each
        other (``rounds`` rounds of a few decode steps, medians), and the faster is kept. The
        step in C saves the per-op cost of the rest of the step (chapter 13), which a pass of
        products alone does not see (GPT-2 small in float32: addmm's products a little faster
        than the C kernel's, the whole step in C 18 ms against 23 on the course's Intel Xeon),
        and a model that stays in the CPU's cache, whose forms are not measured, is mostly that
        cost (the 4M model in w8a8: 0.16 ms a step in C, 1.25 ms in PyTorch's operators).
        ``step_seconds`` keeps both steps' times."""
        self.one_row_step = self.step_in_c() if STEP_IN_C else None
        native = self.one_row_c_form()
        device = self.model.device
        if (not STEP_IN_C or self.one_row_step is not None or native is None or self.chosen
                or self.batch_size != 1 or device.type != "cpu"
                or not native.available(device)):
            return
        kept = {name: getattr(self, name) for name in self.FORM_ATTRIBUTES}
        self.use_format(native)
        self.prepare_weights(False)
        in_c = self.step_in_c()
        native_form = {name: getattr(self, name) for name in self.FORM_ATTRIBUTES}
        if in_c is None:                                # (cannot happen: same checks)
            self.take_form(kept)
            return
        tries = {"kept": (kept, None), "in C": (native_form, in_c)}
        seconds = {name: [] for name in tries}
        steps = 3
        with torch.inference_mode():
            caches = {name: StaticCache(self.model, 1, steps + 1, dtype=form["dtype"])
                      for name, (form, _) in tries.items()}
            tokens = torch.zeros(1, 1, dtype=torch.long, device=self.model.device)
            positions = torch.arange(steps, device=self.model.device).view(steps, 1, 1)
            for done in range(1, rounds + 1):
                for name, (form, step) in tries.items():
                    self.take_form(form)
                    self.one_row_step = step
                    cache = caches[name]
                    cache.length = 0
                    begin = time.perf_counter()
                    for t in range(steps):
                        self.step(tokens, positions[t], cache, None)
                    seconds[name].append((time.perf_counter() - begin) / steps)
                quick, slow = sorted(min(times) for times in seconds.values())
                if done >= 2 and slow > CLEARLY_FASTER * quick:
                    break                           # no need for more rounds
        typical = {name: statistics.median(times) for name, times in seconds.items()}
        best = min(typical, key=typical.__getitem__)
        self.take_form(tries[best][0])
        self.one_row_step = tries[best][1]
        kept_name = self.form_name(kept["format"], kept["packed"])
        self.step_seconds = {f"a step with {kept_name}": typical["kept"],
                             "a step in C with " + native.kernel.removeprefix("llmcore's "):
                             typical["in C"]}

    @property
    def kernel(self) -> str:
        """The product this object runs, in words: its format's kernel, which of
        ``torch.addmm`` and oneDNN's packed product it kept for a floating-point format, and,
        when it measured its one-row forms, their times."""
        if (self.format.prepare is not None or self.format.linear is not None
                or self.format.rounding is not None):
            name = self.format.kernel
        else:
            name = "oneDNN's packed product" if self.packed else "torch.addmm"
        if self.one_row_seconds:
            times = ", ".join(f"{form} {seconds * 1e3:.1f} ms"
                              for form, seconds in self.one_row_seconds.items())
            name += f" (measured fastest for one row here, a pass: {times})"
        if self.step_seconds:
            times = ", ".join(f"{form} {seconds * 1e3:.1f} ms"
                              for form, seconds in self.step_seconds.items())
            name += f"; whole steps measured: {times}"
        if self.one_row_step is not None:
            name += "; one-token steps run whole in C (llmcore.onerow_step)"
        return name

    def prepare_matrix(self, weight: Tensor, *, head: bool = False):
        """weight (d_in, d_out) as this object's linear (or head_linear) reads it: what its
        format prepares (an :class:`llmcore.lowbit.Int8Linear`, ``W8A8Linear`` or
        ``Int4Linear``), else the model's tensor cast to ``dtype``, packed for oneDNN when
        ``packed``."""
        fmt = self.head_format if head else self.format
        w = weight.detach()
        if fmt.rounding is not None:                  # a weight-only precision, dense
            w = round_weight(w, fmt.rounding)
        if fmt.prepare is not None:
            return fmt.prepare(w, self.dtype)
        w = w.to(self.dtype)
        return pack(w, self.batch_size) if self.packed else w

    def serves_own_tensors(self) -> bool:
        """Whether the blocks are the model's own tensors (no copy): its own dtype and format,
        not packed."""
        return self.own and not self.packed

    def matrix_inputs(self) -> dict[str, int]:
        """The prepared blocks' matrices by name (``w_*``), each with the width d_in of the
        rows it reads (fused, as :meth:`prepare_block` made them, when copies were made)."""
        weights = self.block_weights(self.model.blocks[0])
        if not self.serves_own_tensors():       # fused shapes, on the meta device: no copy
            weights = self.fuse(weights._replace(**{
                name: t.detach().to("meta") for name, t in weights._asdict().items()
                if t is not None}))
        return {name: w.shape[0] for name, w in weights._asdict().items()
                if name.startswith("w_") and w is not None}

    def prepare_block(self, weights: NamedTuple) -> NamedTuple:
        """One block's tensors for this precision: matrices (``w_*``) by
        :meth:`prepare_matrix`, biases (``b_*``) in ``dtype``, norm weights in
        ``stream_dtype``; the model's own tensors when nothing changes."""
        if self.serves_own_tensors():
            return weights
        weights = self.fuse(weights)                            # a copy is made anyway
        return weights._replace(**{
            name: (self.prepare_matrix(t) if name.startswith("w_") else
                   t.detach().to(self.dtype if name.startswith("b_") else self.stream_dtype))
            for name, t in weights._asdict().items() if t is not None})

    def step(self, tokens: Tensor, positions: Tensor, cache: StaticCache,
             mask: Tensor | None) -> Tensor:
        """tokens, positions: (b, n) -> the last position's logits (b, v); cache gains n tokens.
        mask: (b, 1, n, m) bool, or None for the plain causal rule. No checks: the caller
        (:class:`FastStep`) validated everything once."""
        in_c = self.one_row_step
        if (in_c is not None and mask is None and tokens.shape[0] == 1
                and (tokens.shape[1] == 1 or in_c.prompts)):
            return in_c(tokens, positions, cache)                     # one call to C
        x = self.embed(tokens, positions)                                       # (b, n, d)
        rotation = self.rotation(positions)
        start = cache.length
        if not self.rolls(cache.keys.shape[3], start + tokens.shape[1]):   # a ring draws its
            mask = self.visible(mask, start, tokens.shape[1], tokens.device)  # own band
        for layer, weights in enumerate(self.blocks):
            x = self.block(x, weights, cache.keys[layer], cache.values[layer], start, mask,
                           rotation)                                            # (b, n, d)
        cache.length = start + tokens.shape[1]
        return self.logits(x[:, -1])                                            # (b, v)

    @staticmethod
    def rolls(capacity: int, end: int) -> bool:
        """Whether a cache of ``capacity`` rows that has seen ``end`` tokens is a ring of the last
        window (FastStep's rolling cache for a sliding window): fewer rows than tokens."""
        return capacity < end

    def visible(self, mask: Tensor | None, start: int, n: int,
                device: torch.device) -> Tensor | None:
        """The keys n queries at slots [start, start + n) may see, once per step for every
        layer: mask (b, 1, n, m) or (b, 1, 1, m) bool, or None (the plain causal rule), cut
        to the sliding window (``config.sliding_window``, Mistral: the band of
        :func:`llmcore.masks.sliding_window_mask`) when several queries reach past it; one
        query needs no band, :meth:`attend` reads only its window's keys. Several queries
        after a past get the bottom-right causal mask SDPA's is_causal does not draw.
        Chapters 7 and 11."""
        end = start + n
        window = self.window
        if n == 1 or (start == 0 and (window is None or end <= window)):
            return mask
        rule = (causal_mask(n, end, device) if window is None or end <= window
                else sliding_window_mask(n, end, window, device))                # (n, m)
        return rule if mask is None else mask & rule

    def heads(self, rows: Tensor, b: int, n: int) -> Tensor:
        """rows: (b n, k d_head), k heads side by side -> (b, k, n, d_head), a view."""
        return rows.view(b, n, -1, self.d_head).transpose(1, 2)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, keys: Tensor,
               values: Tensor, start: int, mask: Tensor | None) -> Tensor:
        """Write the new k, v: (b, h_kv, n, d_head) at rows [start, start + n)
        of one layer's cache keys, values: (b, h_kv, capacity, d_head), then
        attend q: (b, h, n, d_head) over rows [0, start + n) with PyTorch's
        fused kernel -> (b, h, n, d_head). mask: (b, 1, n, m) bool, or None:
        the prompt's causal rule when start == 0, else no mask (one new query
        sees every cached key). With a sliding window only the rows from
        start - window + 1 on are read (the first query's window).
        Chapter 7 (the fast path)."""
        n = q.shape[2]
        end = start + n
        if self.rolls(keys.shape[2], end):
            return self.attend_rolling(q, k, v, keys, values, start)
        keys[:, :, start:end] = k
        values[:, :, start:end] = v
        first = 0 if self.window is None else max(0, start - self.window + 1)
        if mask is not None and first:       # (b, 1, n, end - first)
            mask = mask[..., first:]
        causal = mask is None and start == 0 and n > 1
        return F.scaled_dot_product_attention(
            q, keys[:, :, first:end], values[:, :, first:end], attn_mask=mask,
            is_causal=causal, enable_gqa=self.group > 1)

    def attend_rolling(self, q: Tensor, k: Tensor, v: Tensor, keys: Tensor, values: Tensor,
                       start: int) -> Tensor:
        """Sliding-window attention over a ring of the last window (Mistral's rolling cache, the
        serving form of :class:`llmcore.kvcache.RollingKVCache`): keys, values (b, h_kv, W,
        d_head), W = ``config.sliding_window``, row t % W holding token t's K (already rotated,
        so a row's slot does not matter to attention). q: (b, h, n, d_head), the new k, v:
        (b, h_kv, n, d_head) of tokens start .. start + n - 1 -> (b, h, n, d_head). One query
        writes its row and attends over the ring's filled rows, all within its window; several
        attend over the held rows in token order followed by their own, through the band of
        :func:`llmcore.masks.sliding_window_mask`, then their last W rows go into the ring.
        No padding (FastStep keeps every row for left-padded prompts), and no rollback: a
        ring forgets the rows it overwrites. Chapters 7 and 11."""
        window = keys.shape[2]
        n = q.shape[2]
        end = start + n
        gqa = self.group > 1
        if n == 1:
            slot = start % window
            keys[:, :, slot] = k[:, :, 0]
            values[:, :, slot] = v[:, :, 0]
            held = min(end, window)
            return F.scaled_dot_product_attention(q, keys[:, :, :held], values[:, :, :held],
                                                  enable_gqa=gqa)
        held = min(start, window)
        if start > window:                       # full and wrapped: oldest row first
            past_k = torch.roll(keys, -(start % window), dims=2)
            past_v = torch.roll(values, -(start % window), dims=2)
        else:
            past_k, past_v = keys[:, :, :held], values[:, :, :held]
        band = sliding_window_mask(n, held + n, window, q.device)                # (n, held + n)
        out = F.scaled_dot_product_attention(q, torch.cat([past_k, k], dim=2),
                                             torch.cat([past_v, v], dim=2), attn_mask=band,
                                             enable_gqa=gqa)
        kept = min(n, window)
        slots = torch.arange(end - kept, end, device=q.device) % window
        keys.index_copy_(2, slots, k[:, :, n - kept:])
        values.index_copy_(2, slots, v[:, :, n - kept:])
        return out

    def head_logits(self, normed: Tensor) -> Tensor:
        """normed: (b, d) in stream_dtype -> logits (b, v) in stream_dtype through this
        object's head (:attr:`head`; None: the model's own (d, v) matrix,
        :meth:`output_matrix`)."""
        if self.head is None:
            return normed @ self.output_matrix()                                # (b, v)
        logits = self.head_linear(normed.to(self.dtype), self.head, None)
        return logits.to(self.stream_dtype)                                     # (b, v)

    def rotation(self, positions: Tensor):
        """What the blocks need of the positions (None: they entered at the embedding)."""
        return None

    def weight_bytes(self) -> int:
        """Bytes of weights one decode step reads: every tensor of the blocks (codes, scales,
        norms, biases, in this object's precision) and the output projection. The embedding's
        few rows (one per token) are not counted. Chapters 7 and 13."""
        head = self.output_matrix() if self.head is None else self.head
        return bytes_of([self.blocks, head])

    # -- what each model fills in ----------------------------------------------------------
    def fuse(self, weights: NamedTuple) -> NamedTuple:
        """A block's weights with the matrices that read the same rows joined side by side,
        for the copies :meth:`prepare_block` makes (default: unchanged)."""
        return weights

    def block_weights(self, block) -> NamedTuple:
        """One block's tensors, named (matrices ``w_*``, which may be packed)."""
        raise NotImplementedError

    def head_matrix(self) -> Tensor:
        """The output projection as a (d, v) matrix (a view of the model's tensor)."""
        raise NotImplementedError

    def output_matrix(self) -> Tensor:
        """The model's own (d, v) output projection, read as it is for logits."""
        raise NotImplementedError

    def embed(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """tokens, positions: (b, n) -> the blocks' input x (b, n, d)."""
        raise NotImplementedError

    def _block(self, x: Tensor, weights: NamedTuple, keys: Tensor, values: Tensor,
               start: int, mask: Tensor | None, rotation) -> Tensor:
        """One block on x: (b, n, d) -> (b, n, d), writing this layer's K/V rows."""
        raise NotImplementedError

    def logits(self, last: Tensor) -> Tensor:
        """last: (b, d), the last position's residual stream -> logits (b, v)."""
        raise NotImplementedError


class GPTBlockWeights(NamedTuple):
    """One GPT block's tensors as the fast path reads them: the model's own parameters, or
    copies in the fast path's precision (the matrices ``w_*`` packed or quantized)."""

    ln_1_scale: Tensor
    ln_1_shift: Tensor
    w_qkv: Tensor
    b_qkv: Tensor
    w_o: Tensor
    b_o: Tensor
    ln_2_scale: Tensor
    ln_2_shift: Tensor
    w_up: Tensor
    b_up: Tensor
    w_down: Tensor
    b_down: Tensor


class FastGPT(FastDecoder):
    """:class:`FastDecoder` for a :class:`llmcore.model.GPT`: learned positions added at the
    embedding, LayerNorm, fused QKV with biases, GELU, and the tied output projection read from
    a transposed copy that follows the embedding (:meth:`output_weight`) or from this object's
    own head. Chapters 7 and 13."""

    def __init__(self, model: GPT, *, compile: bool = False, batch_size: int = 1,
                 precision: str | None = None, pack: bool | None = None):
        self.eps = model.config.ln_eps
        self._output: tuple[tuple, Tensor] | None = None     # (embedding key, its transpose)
        super().__init__(model, compile=compile, batch_size=batch_size, precision=precision,
                         pack=pack)
        ln_f = model.ln_f
        self.ln_f = (ln_f.scale.detach().to(self.stream_dtype),
                     ln_f.shift.detach().to(self.stream_dtype))
        self.choose_one_row_step()                    # the whole step in C, where it serves

    def block_weights(self, block) -> GPTBlockWeights:
        attention, ffn = block.attention, block.ffn
        return GPTBlockWeights(block.ln_1.scale, block.ln_1.shift, attention.w_qkv,
                               attention.b_qkv, attention.w_o, attention.b_o, block.ln_2.scale,
                               block.ln_2.shift, ffn.w_up, ffn.b_up, ffn.w_down, ffn.b_down)

    def head_matrix(self) -> Tensor:
        return self.model.token_embedding.t()                                   # (d, v)

    def output_matrix(self) -> Tensor:
        return self.output_weight()

    def embed(self, tokens: Tensor, positions: Tensor) -> Tensor:
        model = self.model
        x = F.embedding(tokens, model.token_embedding) + model.position_embedding[positions]
        return x.to(self.stream_dtype)                                          # (b, n, d)

    def _block(self, x: Tensor, w: GPTBlockWeights, keys: Tensor,
               values: Tensor, start: int, mask: Tensor | None,
               rotation: None) -> Tensor:
        """One block on x: (b, n, d) -> (b, n, d), its K/V rows written at
        [start, start + n) of this layer's cache (:meth:`attend`). The
        residual stream x stays in stream_dtype; each matrix sees dtype."""
        b, n, d = x.shape
        rows = x.view(b * n, d)
        normed = F.layer_norm(rows, (d,), w.ln_1_scale, w.ln_1_shift,
                              self.eps).to(self.dtype)
        qkv = self.heads(self.linear(normed, w.w_qkv, w.b_qkv), b, n)
        q, k, v = qkv.split((self.h, self.h_kv, self.h_kv), dim=1)
        out = self.attend(q, k, v, keys, values, start, mask)
        out = out.transpose(1, 2).reshape(b * n, d)                   # (b n, d)
        rows = rows + self.linear(out, w.w_o, w.b_o)                  # residual
        normed = F.layer_norm(rows, (d,), w.ln_2_scale, w.ln_2_shift,
                              self.eps).to(self.dtype)
        hidden = F.gelu(self.linear(normed, w.w_up, w.b_up),
                        approximate="tanh")                           # (b n, f)
        out = self.linear(hidden, w.w_down, w.b_down)                 # (b n, d)
        return (rows + out).view(b, n, d)                             # residual

    def step_in_c(self):
        return gpt_step_in_c(self)

    def logits(self, last: Tensor) -> Tensor:
        """last: (b, d), the last position's residual stream -> logits (b, v)."""
        scale, shift = self.ln_f
        normed = F.layer_norm(last, (self.config.d_model,), scale, shift, self.eps)
        return self.head_logits(normed)                                         # (b, v)

    def output_weight(self) -> Tensor:
        """The tied output projection as a (d, v) contiguous matrix: logits = x @ it.

        The model stores it as the embedding, (v, d), so ``F.linear(x, embedding)`` computes
        each logit as a dot product along a row; for one token (a matrix-vector product) a CPU
        streams that layout more slowly than x @ W with W (d, v) contiguous (the benchmark,
        ``course-bench --section fast``, measures both). This object keeps that one transposed
        copy (v d more numbers), as a serving engine prepares its weights once: made on first
        use and again whenever the embedding changes (its version counter, storage, dtype or
        device: training steps, in-place edits and ``.to()`` all change one). Nothing is kept
        on the model. Chapter 7 (the fast path).
        """
        embedding = self.model.token_embedding
        key = (embedding._version, embedding.data_ptr(), embedding.dtype, embedding.device)
        if self._output is None or self._output[0] != key:
            with torch.inference_mode(False):           # a normal tensor, usable in any mode
                self._output = (key, embedding.detach().t().contiguous())
        return self._output[1]


class LlamaBlockWeights(NamedTuple):
    """One Llama block's tensors as the fast path reads them: the model's own parameters, or
    copies in the fast path's precision (the matrices ``w_*`` packed or quantized). The
    families' extras are None where a model has none: q/k/v biases (Qwen2), per-head q and k
    norms (Qwen3). Copies are fused (:meth:`FastLlama.fuse`): ``w_qkv`` (d, (h + 2 h_kv)
    d_head) = [w_q | w_k | w_v] with ``b_qkv``, and ``w_gate_up`` (d, 2 f) = [w_gate | w_up],
    the separate fields then None: one product for each input instead of three and two."""

    attn_norm: Tensor
    w_q: Tensor | None
    w_k: Tensor | None
    w_v: Tensor | None
    w_o: Tensor
    ffn_norm: Tensor
    w_gate: Tensor | None
    w_up: Tensor | None
    w_down: Tensor
    b_q: Tensor | None = None
    b_k: Tensor | None = None
    b_v: Tensor | None = None
    q_norm: Tensor | None = None
    k_norm: Tensor | None = None
    w_qkv: Tensor | None = None
    b_qkv: Tensor | None = None
    w_gate_up: Tensor | None = None


class FastLlama(FastDecoder):
    """:class:`FastDecoder` for a :class:`llmcore.llama.Llama` and each family of chapter 11: no
    positions at the embedding, RMSNorm, RoPE on q and k (cos and sin tables made once for
    every position, with Llama 3.1's frequency scaling when the config has one), SwiGLU, the
    head ``lm_head`` (d, v) read as it is (a tied one too: SmolLM2, Llama 3.2), q/k/v biases
    (Qwen2), per-head q and k RMSNorm and a head_dim of its own (Qwen3), and a sliding window
    (Mistral: :meth:`FastDecoder.visible` and :meth:`FastDecoder.attend`). Chapter 11."""

    def __init__(self, model: Llama, *, compile: bool = False, batch_size: int = 1,
                 precision: str | None = None, pack: bool | None = None):
        c = model.config
        self.eps = c.rms_eps
        super().__init__(model, compile=compile, batch_size=batch_size, precision=precision,
                         pack=pack)
        dtype = torch.float64 if self.dtype == torch.float64 else torch.float32
        every = torch.arange(c.max_seq_len, device=model.device)
        with torch.inference_mode(False):
            cos, sin = rope_tables(every, c.d_head, c.rope_base, dtype=dtype,
                                   scaling=c.rope_scaling)
            self.norm_f = model.norm_f.weight.detach().to(self.stream_dtype)
        self.cos, self.sin = cos.to(self.dtype), sin.to(self.dtype)   # (T, d_head)
        self.qkv_widths = (self.h * self.d_head, self.h_kv * self.d_head,
                           self.h_kv * self.d_head)                     # w_qkv's three parts

    def block_weights(self, block) -> LlamaBlockWeights:
        attention, ffn = block.attention, block.ffn
        norms = ((None, None) if attention.q_norm is None
                 else (attention.q_norm.weight, attention.k_norm.weight))
        return LlamaBlockWeights(block.attn_norm.weight, attention.w_q, attention.w_k,
                                 attention.w_v, attention.w_o, block.ffn_norm.weight,
                                 ffn.w_gate, ffn.w_up, ffn.w_down, attention.b_q,
                                 attention.b_k, attention.b_v, *norms)

    def fuse(self, w: LlamaBlockWeights) -> LlamaBlockWeights:
        """The block's matrices that read the same rows as one matrix each (a copy):
        [w_q | w_k | w_v] (d, (h + 2 h_kv) d_head) with its biases side by side, and [w_gate |
        w_up] (d, 2 f). Each output column is the same sum as before, and every precision
        rounds a matrix column by column (or in groups along d_in), so the fused copy holds
        the same rounded numbers; a decode step then runs 4 products a block, not 7, and
        w8a8 rounds each input's rows once. Chapters 7 and 11."""
        biases = None
        if w.b_q is not None:                               # Qwen2: all three, or none
            biases = torch.cat([w.b_q, w.b_k, w.b_v])
        return w._replace(w_q=None, w_k=None, w_v=None, b_q=None, b_k=None, b_v=None,
                          w_gate=None, w_up=None, b_qkv=biases,
                          w_qkv=torch.cat([w.w_q, w.w_k, w.w_v], dim=1).detach(),
                          w_gate_up=torch.cat([w.w_gate, w.w_up], dim=1).detach())

    def head_matrix(self) -> Tensor:
        return self.model.lm_head                                               # (d, v)

    def output_matrix(self) -> Tensor:
        return self.model.lm_head

    def embed(self, tokens: Tensor, positions: Tensor) -> Tensor:
        return F.embedding(tokens, self.model.token_embedding).to(self.stream_dtype)

    def rotation(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin: (b, 1, n, d_head) for the positions (b, n), shared by every block."""
        return self.cos[positions][:, None], self.sin[positions][:, None]

    def head_norm(self, x: Tensor, weight: Tensor) -> Tensor:
        """Qwen3's RMSNorm of every head: x (b, k, n, d_head) normalised in stream_dtype, as
        the teaching path's :func:`llmcore.norm.rms_norm` does half precision -> dtype.
        Chapter 11."""
        wide = x.to(self.stream_dtype)
        return F.rms_norm(wide, (self.d_head,), weight, self.eps).to(self.dtype)

    def _block(self, x: Tensor, w: LlamaBlockWeights, keys: Tensor, values: Tensor,
               start: int, mask: Tensor | None, rotation: tuple[Tensor, Tensor]) -> Tensor:
        """One block on x: (b, n, d) -> (b, n, d); keys stored already rotated."""
        b, n, d = x.shape
        rows = x.view(b * n, d)
        normed = F.rms_norm(rows, (d,), w.attn_norm, self.eps).to(self.dtype)
        if w.w_qkv is None:                                      # the model's own tensors
            q, k, v = (self.linear(normed, w.w_q, w.b_q), self.linear(normed, w.w_k, w.b_k),
                       self.linear(normed, w.w_v, w.b_v))
        else:                                                    # fused: views of one product
            q, k, v = self.linear(normed, w.w_qkv, w.b_qkv).split(self.qkv_widths, dim=1)
        q = self.heads(q, b, n)                                  # (b, h, n, d_head)
        k, v = self.heads(k, b, n), self.heads(v, b, n)          # (b, h_kv, n, d_head)
        if w.q_norm is not None:                                 # Qwen3
            q, k = self.head_norm(q, w.q_norm), self.head_norm(k, w.k_norm)
        cos, sin = rotation
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        out = self.attend(q, k, v, keys, values, start, mask)   # (b, h, n, d_head)
        out = out.transpose(1, 2).reshape(b * n, -1)             # (b n, h d_head)
        rows = rows + self.linear(out, w.w_o, None)              # residual
        normed = F.rms_norm(rows, (d,), w.ffn_norm, self.eps).to(self.dtype)
        if w.w_gate_up is None:
            gate, up = self.linear(normed, w.w_gate, None), self.linear(normed, w.w_up, None)
        else:
            gate, up = self.linear(normed, w.w_gate_up, None).chunk(2, dim=1)
        hidden = F.silu(gate).mul_(up)                           # (b n, f)
        out = self.linear(hidden, w.w_down, None)
        return (rows + out).view(b, n, d)                        # residual

    def logits(self, last: Tensor) -> Tensor:
        """last: (b, d), the last position's residual stream -> logits (b, v)."""
        normed = F.rms_norm(last, (self.config.d_model,), self.norm_f, self.eps)
        return self.head_logits(normed)                                         # (b, v)


def fast_model(model, *, compile: bool = False, batch_size: int = 1,
               precision: str | None = None, pack: bool | None = None) -> FastDecoder:
    """The fast path's arrangement of ``model`` in ``precision`` (None or one of
    :data:`llmcore.lowbit.PRECISIONS`: "fp32", "bf16", "int8", "w8a8", "int4"; see
    :class:`FastDecoder`): a :class:`FastGPT` for a GPT, a :class:`FastLlama` for a Llama; any
    other model is refused, naming those two. Chapters 7 and 13."""
    options = dict(compile=compile, batch_size=batch_size, precision=precision, pack=pack)
    if isinstance(model, GPT):
        return FastGPT(model, **options)
    if isinstance(model, Llama):
        return FastLlama(model, **options)
    raise TypeError(f"the fast path serves llmcore's GPT and Llama models, got "
                    f"{type(model).__name__}")


def weights_signature(model) -> tuple:
    """What identifies the values of ``model``'s parameters without reading them: each one's
    storage, version counter (every in-place write bumps it: a training step, ``copy_``,
    ``load_state_dict``), dtype and device. Equal signatures: the same weights. Chapter 7."""
    return tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in model.parameters())


class FastModels:
    """The fast path's preparations, each made once and kept here, by the caller, until
    :meth:`clear`: one :class:`FastDecoder` per model, precision and batch size (a batch size
    picks its kernels and their weights' layout: chapters 7 and 13).

    ``generate(model, ids, t, fast=prepared, precision="w8a8")`` with ``prepared =
    FastModels()`` prepares the weights on the first call and reuses them on the next ones
    (``fast=True`` prepares them for its one call). A model whose parameters changed since
    (:func:`weights_signature`) is prepared again, so no call reads stale weights. Nothing is
    kept on the model; the prepared copies live as long as this object holds them.
    ``preparations`` counts the :class:`FastDecoder` objects made. Chapters 7 and 13."""

    def __init__(self, *, compile: bool = False, pack: bool | None = None):
        self.options = dict(compile=compile, pack=pack)
        self.kept: dict[tuple, tuple[tuple, FastDecoder]] = {}
        self.preparations = 0

    def get(self, model, *, precision: str | None = None, batch_size: int = 1) -> FastDecoder:
        """The fast model of ``model`` in ``precision`` for ``batch_size`` rows: the kept one
        if the model's weights are unchanged, else made now (:func:`fast_model`) and kept."""
        key = (id(model), precision, batch_size)
        signature = weights_signature(model)
        kept = self.kept.get(key)
        if kept is not None and kept[1].model is model and kept[0] == signature:
            return kept[1]
        fast = fast_model(model, batch_size=batch_size, precision=precision, **self.options)
        self.kept[key] = (signature, fast)
        self.preparations += 1
        return fast

    def clear(self) -> None:
        """Drop every prepared model (their weights' memory goes with them)."""
        self.kept.clear()

    def __len__(self) -> int:
        return len(self.kept)


def prompt_masks(attention_mask: Tensor, capacity: int) -> tuple[Tensor, Tensor, Tensor]:
    """Left-padded prompts (b, n): key_valid (b, capacity), the prompt's mask (b, 1, n, n) and
    the positions (b, n), counting real tokens only as the teaching path does.

    A padding query may see itself (and nothing else): its row is never seen by a real token,
    and a row with no visible key at all would give NaN in the fused kernel."""
    b, n = attention_mask.shape
    device = attention_mask.device
    key_valid = torch.ones(b, capacity, dtype=torch.bool, device=device)
    key_valid[:, :n] = attention_mask
    idx = torch.arange(n, device=device)
    causal = idx[None, :] <= idx[:, None]                                        # (n, n)
    itself = torch.eye(n, dtype=torch.bool, device=device)
    mask = (causal & attention_mask[:, None, :]) | itself                        # (b, n, n)
    positions = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)
    return key_valid, mask[:, None], positions


class FastStep:
    """The fast path's step for :func:`llmcore.decode.decode`: a :class:`StaticCache` for the
    prompt and every new token, positions and key masks made once here (after checking the
    mask), and each call under ``torch.inference_mode``.

    fast: a :class:`FastDecoder` of ``model``; prompt_ids: (b, n); attention_mask: (b, n) with 0
    for left padding, or None. Chapter 7 (the fast path).
    """

    def __init__(self, fast: FastDecoder, model, prompt_ids: Tensor, max_new_tokens: int,
                 attention_mask: Tensor | None):
        if fast.model is not model:
            raise ValueError("fast: this FastDecoder was built from another model")
        b, n = prompt_ids.shape
        device = prompt_ids.device
        mask = check_attention_mask(attention_mask, b, n, device)
        if mask is not None and device.type != "meta" and bool(mask.all()):
            mask = None                             # no padding: the plain causal rule
        total = n + max_new_tokens
        self.fast = fast
        # a sliding window without padding keeps only the last window: a ring of W rows
        # (FastDecoder.attend_rolling); left-padded prompts keep every row, masked by the band
        rolling = fast.window is not None and mask is None and total > fast.window
        with torch.inference_mode():
            self.cache = StaticCache(model, b, fast.window if rolling else total,
                                     dtype=fast.dtype)
            if mask is None:
                self.positions = torch.arange(total, device=device).expand(b, total)
                self.key_valid = self.prompt_mask = None
            else:
                self.key_valid, self.prompt_mask, prompt = prompt_masks(mask, total)
                after = prompt[:, -1:] + 1 + torch.arange(max_new_tokens, device=device)
                self.positions = torch.cat([prompt, after], dim=1)              # (b, total)

    @torch.inference_mode()
    def __call__(self, tokens: Tensor) -> Tensor:
        """tokens: (b, t) new ids -> logits (b, v) of the last position."""
        start = self.cache.length
        end = start + tokens.shape[1]
        if start == 0:
            mask = self.prompt_mask
        else:
            mask = None if self.key_valid is None else self.key_valid[:, None, None, :end]
        return self.fast.step(tokens, self.positions[:, start:end], self.cache, mask)
