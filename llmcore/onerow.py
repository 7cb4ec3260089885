"""llmcore's one-row kernels: int8, int4 and bfloat16 matrices times one row, in C, for a decode
step at batch 1.

A decode step at batch 1 multiplies one row by every matrix of the model, and each product reads
its whole matrix once: the step is bound by the bytes it reads. PyTorch's int8 kernels fall
short of that bound for one row on the course's Intel Xeon (2 cores): fbgemm's int8 x int8
product streamed GPT-2 small's 49 int8 matrices at 16-18 GB/s, the weight-only int8 kernel
at 10-12 GB/s, while float32's ``addmm`` streamed its four times larger matrices at 30 GB/s.
A matrix-vector product is a short loop (chapter 1); ``native/onerow.c`` writes it for one
row of int8 codes at a time, each core reading eight runs of its rows at once (one row of
each) and asking the CPU for each row's bytes 4 KiB before they are needed. That is what the
loop lacked to stream at memory speed: the same 49 matrices in 4.7 ms (26 GB/s), against
5.8 ms reading four adjacent rows at once, measured together, and 7.3 ms for fbgemm's kernel
in the benchmark (``python -m course.bench --section fast``).
int4 reads half those bytes but turns each 4-bit code into a number first, so its kernel keeps
sixteen outputs side by side, one per lane of a register, and finds each code's value by a
table lookup: GPT-2 small's 48 block matrices in 2.2 ms against PyTorch's int4 kernel's 3.2 ms,
and 16 rows (a prompt) in 15 ms against 21, measured together.

* :func:`w8a8_onerow`: the "w8a8" precision's product of one row: the row rounded to integer
  codes exactly as :func:`llmcore.lowbit.w8a8_matmul` rounds it, integer sums with AVX-512
  VNNI's int8 dot products; the same float32 numbers as fbgemm's kernel (tested).
* :func:`int8_onerow`: the "int8" precision's weight-only product of one bfloat16 row (codes
  widened to float32 as they are read, float32 sums, one rounding to bfloat16).
* :func:`int4_onerow`: the "int4" precision's weight-only product (4-bit codes in groups, each
  code's value looked up in a table of sixteen, float32 sums), for one row and for several
  (a prompt), a row giving the same numbers alone and in a batch.
* :func:`bf16_onerow`: the "bf16" precision's product of one row (AVX512-BF16), and of a
  prompt's rows, each weight read once for all of them: on AMX, Intel's tile unit
  (``native/amx.c``), where the CPU has it, else, for a few rows, the one-row sums done as
  float32 multiply-adds, which this CPU runs four times as fast as AVX512-BF16's dot product.
* :func:`argmax_rows`: the greedy pick of a step's logits (the fast path's).
* :func:`fp32_onerow`: float32's product of one row on the model's own (d_in, d_out) matrix,
  for the whole step in C (:mod:`llmcore.onerow_step`, ``native/step.c``, which
  :func:`gpt_step` calls).

The C file is compiled on first use with the system's C compiler (``$CC``, else ``cc``) into
a cache folder of the user's (``$XDG_CACHE_HOME/llmcore`` or ``~/.cache/llmcore``, private
to the user), named by a hash of the source and the flags, and loaded with :mod:`ctypes`;
its OpenMP threads are PyTorch's own (the same ``libgomp``), so ``torch.set_num_threads``
holds. Where there is no compiler, the CPU lacks AVX-512 VNNI or the device is not a CPU,
:func:`available` is False and :func:`unavailable_reason` says why: the fast path then keeps
PyTorch's kernels. The fast path offers these kernels as one more one-row form and keeps
whichever streams the model's matrices fastest on the machine
(:meth:`llmcore.fastpath.FastDecoder.measure_one_row`). Chapter 13.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from contextlib import nullcontext
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor
from torch.autograd import _profiler_enabled

from .quantize import (INT4_GROUP_SIZE, int4_scale_offset, quantize_int4, quantize_int8,
                       unpack_int4)

SOURCES = (Path(__file__).with_name("native") / "onerow.c",
           Path(__file__).with_name("native") / "step.c",
           Path(__file__).with_name("native") / "amx.c")
HEADERS = (Path(__file__).with_name("native") / "bf16.h",
           Path(__file__).with_name("native") / "runs.h")
"""The kernels' C sources, shipped with the package, compiled into one library: the products
(``onerow.c``), a GPT's whole decode step at batch 1 on them (``step.c``,
:mod:`llmcore.onerow_step`), a prompt's bfloat16 products on AMX (``amx.c``); the headers they
include (bfloat16 <-> float32, and the runs of rows each thread streams)."""

FLAGS = ("-O3", "-ffp-contract=off", "-mavx512f", "-mavx512bw", "-mavx512vnni",
         "-mavx512bf16", "-mamx-tile", "-mamx-bf16", "-fopenmp", "-shared", "-fPIC")
"""How the source is compiled: the instruction sets it uses, named (not ``-march=native``,
so that one build serves every CPU that has them; a kernel runs only where the CPU has its
own), no fused multiply-adds the source does not write (the same float32 operations as
fbgemm), and PyTorch's OpenMP."""

VERSION = 11
"""What ``llmcore_onerow_version()`` returns for this source: a stale library is refused."""

_POINTER, _LONG = ctypes.c_void_p, ctypes.c_long


class W8A8Rows(NamedTuple):
    """A (d_in, d_out) matrix for the "w8a8" product as :func:`w8a8_onerow` reads it: ``codes``
    (d_out, d_in) int8 (each output's codes contiguous: one row of the kernel's loop), the
    ``row_sums`` (d_out,) int32 of those codes (the unsigned activations' zero point is
    taken back with them), and ``scale`` (d_out,) float32: :func:`llmcore.quantize.quantize_int8`'s
    codes and scales, the same as every int8 format's."""

    codes: Tensor
    row_sums: Tensor
    scale: Tensor

    @property
    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self)


INT4_TILE = 16
"""Outputs side by side in :class:`Int4Rows`, one per 32-bit lane of an AVX-512 register."""

INT4_WORD = 8
"""int4 codes in one 32-bit word of :class:`Int4Rows`."""


class Int4Rows(NamedTuple):
    """A (d_in, d_out) matrix for the "int4" product as :func:`int4_onerow` reads it: tiles of
    :data:`INT4_TILE` outputs side by side, so that one register holds one weight of each.

    codes (tiles, d_in // 8, 16) uint32: word [t, i, l] holds the eight codes of rows 8i ..
    8i + 7 of output 16t + l, code 8i + q in bits 4q .. 4q + 3; scale and offset (tiles,
    d_in // group_size, 16) bfloat16, with the weight ``(code - 8) * scale + offset``
    (:func:`llmcore.quantize.int4_scale_offset`: the numbers PyTorch's int4 kernel reads);
    the last tile padded with zeros past d_out."""

    codes: Tensor
    scale: Tensor
    offset: Tensor
    d_out: int
    group_size: int


def cache_folder() -> Path:
    """Where compiled kernels are kept: ``$XDG_CACHE_HOME/llmcore`` (or ``~/.cache/llmcore``),
    made private to the user (mode 0700)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "llmcore"


def compiler() -> str | None:
    """The C compiler: ``$CC`` if set, else ``cc`` (or ``gcc``) on the PATH; None if none."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def _private_folder(folder: Path) -> Path:
    """``folder``, made if missing, owned by this user and closed to others: a shared library
    loaded from it runs as this user, so no one else may write there."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = folder.stat()
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise PermissionError(f"{folder} belongs to another user (uid {info.st_uid})")
    if info.st_mode & 0o022:
        os.chmod(folder, info.st_mode & ~0o022)
    return folder


def build(cc: str, folder: Path) -> Path:
    """Compile :data:`SOURCES` with ``cc`` into ``folder`` (once: the file is named by a hash of
    the sources, the flags and the compiler) and return the library's path. Raises
    RuntimeError with the compiler's message if compiling fails."""
    sources = [source.read_bytes() for source in (*SOURCES, *HEADERS)]
    key = hashlib.sha256(b"\0".join([*sources, " ".join(FLAGS).encode(), cc.encode()]))
    target = _private_folder(folder) / f"onerow-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        built = Path(scratch) / target.name
        result = subprocess.run([cc, *FLAGS, *map(str, SOURCES), "-o", str(built)],
                                capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"{cc} could not compile {' and '.join(s.name for s in SOURCES)}: "
                               f"{(result.stderr or result.stdout).strip()[:800]}")
        os.replace(built, target)                        # whole, or not at all
    return target


def _declare(library: ctypes.CDLL) -> ctypes.CDLL:
    library.llmcore_onerow_version.restype = ctypes.c_int
    library.llmcore_w8a8_onerow.argtypes = [_POINTER] * 6 + [_LONG, _LONG]
    library.llmcore_w8a8_onerow.restype = ctypes.c_int
    library.llmcore_int8_onerow.argtypes = [_POINTER] * 5 + [_LONG, _LONG]
    library.llmcore_int8_onerow.restype = ctypes.c_int
    library.llmcore_bf16_onerow.argtypes = [_POINTER] * 4 + [_LONG, _LONG]
    library.llmcore_bf16_onerow.restype = ctypes.c_int
    library.llmcore_bf16_rows.argtypes = [_POINTER] * 4 + [_LONG] * 3
    library.llmcore_bf16_rows.restype = ctypes.c_int
    library.llmcore_bf16_rows_amx.argtypes = [_POINTER] * 4 + [_LONG] * 3
    library.llmcore_bf16_rows_amx.restype = ctypes.c_int
    library.llmcore_amx_ready.restype = ctypes.c_int
    library.llmcore_argmax_rows.argtypes = [_POINTER] * 2 + [_LONG, _LONG, ctypes.c_int]
    library.llmcore_argmax_rows.restype = None
    library.llmcore_int4_rows.argtypes = [_POINTER] * 6 + [_LONG] * 4
    library.llmcore_int4_rows.restype = ctypes.c_int
    library.llmcore_w8a8_round_rows.argtypes = [_POINTER] * 3 + [_LONG, _LONG]
    library.llmcore_w8a8_round_rows.restype = None
    library.llmcore_w8a8_scale_rows.argtypes = [_POINTER] * 5 + [_LONG, _LONG]
    library.llmcore_w8a8_scale_rows.restype = None
    library.llmcore_fp32_onerow.argtypes = [_POINTER] * 4 + [_LONG, _LONG]
    library.llmcore_fp32_onerow.restype = ctypes.c_int
    library.llmcore_gpt_step.argtypes = [_POINTER] * 3 + [_LONG] * 5 + [_POINTER] * 2
    library.llmcore_gpt_step.restype = ctypes.c_int
    library.llmcore_gpt_tokens.argtypes = [_POINTER] * 3 + [_LONG, _LONG, _POINTER] + [_LONG] * 3 \
        + [_POINTER] * 2
    library.llmcore_gpt_tokens.restype = ctypes.c_int
    return library


@functools.cache
def _load() -> tuple[ctypes.CDLL | None, str]:
    """(the loaded library, "") or (None, why not): checked once per process."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None, f"the kernels are written for x86-64 CPUs, this one is {platform.machine()}"
    cpu = getattr(torch, "cpu", None)
    try:
        vnni = bool(cpu._is_avx512_supported() and cpu._is_vnni_supported())
    except AttributeError:
        return None, "this torch cannot say whether the CPU has AVX-512 VNNI"
    if not vnni:
        return None, "this CPU has no AVX-512 VNNI (int8 dot products)"
    cc = compiler()
    if cc is None:
        return None, "no C compiler: set $CC or install cc (gcc or clang)"
    try:
        path = build(cc, cache_folder())
        library = _declare(ctypes.CDLL(str(path)))
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        return None, f"{type(error).__name__}: {error}"
    if library.llmcore_onerow_version() != VERSION:
        return None, f"{path} is version {library.llmcore_onerow_version()}, not {VERSION}"
    return library, ""


def available(device: torch.device | str = "cpu") -> bool:
    """Whether the one-row kernels run on ``device``: a CPU with AVX-512 VNNI, the kernels
    compiled and loaded (:func:`unavailable_reason` says why not)."""
    return torch.device(device).type == "cpu" and _load()[0] is not None


def bf16_available(device: torch.device | str = "cpu") -> bool:
    """Whether :func:`bf16_onerow` runs on ``device``: :func:`available`, and the CPU has
    AVX512-BF16's dot products."""
    cpu = getattr(torch, "cpu", None)
    return available(device) and bool(getattr(cpu, "_is_avx512_bf16_supported", bool)())


@functools.cache
def amx_unavailable_reason() -> str:
    """Why :func:`amx_available` is False on the CPU ("" when it is True): checked once per
    process."""
    if not available():
        return unavailable_reason()
    cpu = getattr(torch, "cpu", None)
    if not getattr(cpu, "_is_amx_tile_supported", bool)():
        return "this CPU has no AMX tiles"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError as error:
        return f"cannot read the CPU's flags: {error}"
    if " amx_bf16" not in flags:
        return "this CPU's AMX has no bfloat16 products (amx_bf16)"
    if _library().llmcore_amx_ready() != 0:
        return "Linux did not lend this process AMX's tiles (arch_prctl ARCH_REQ_XCOMP_PERM)"
    return ""


def amx_available(device: torch.device | str = "cpu") -> bool:
    """Whether :func:`bf16_onerow` takes a prompt's rows on AMX, Intel's tile unit, on
    ``device``: a CPU with AMX's bfloat16 products, lent to this process by Linux."""
    return torch.device(device).type == "cpu" and amx_unavailable_reason() == ""


def unavailable_reason(device: torch.device | str = "cpu") -> str:
    """Why :func:`available` is False on ``device`` ("" when it is True)."""
    if torch.device(device).type != "cpu":
        return f"the one-row kernels run on the CPU, not on {torch.device(device).type}"
    return _load()[1]


def _profiled(name: str):
    """``torch.profiler.record_function(name)`` while a profiler records (a ctypes call is
    invisible to it otherwise), nothing at all the rest of the time (it costs ~8 us a call)."""
    return torch.profiler.record_function(name) if _profiler_enabled() else nullcontext()


def _library() -> ctypes.CDLL:
    library, why = _load()
    if library is None:
        raise RuntimeError(f"llmcore's one-row kernels are not available: {why}")
    return library


def w8a8_rows(weight: Tensor, dtype: torch.dtype = torch.float32) -> W8A8Rows:
    """weight (d_in, d_out) float32 -> :class:`W8A8Rows`: the codes and scales of
    :func:`llmcore.quantize.quantize_int8`, one row per output. dtype: the activations',
    float32 (a parameter so that every format prepares with one signature)."""
    if dtype != torch.float32:
        raise ValueError(f"w8a8: the one-row kernel takes float32 activations, got {dtype}")
    q = quantize_int8(weight.detach().float())
    codes = q.values.t().contiguous()                                     # (d_out, d_in)
    return W8A8Rows(codes, codes.sum(dim=1, dtype=torch.int32), q.scale.contiguous())


def _checked_row(x: Tensor, d_in: int, dtype: torch.dtype, what: str) -> Tensor:
    """x made contiguous (a copy only if it is not), once it is what the C code may read: a
    (rows, d_in) ``dtype`` matrix in CPU memory."""
    if isinstance(x, Tensor):
        x = x.contiguous()
    if not (isinstance(x, Tensor) and x.is_cpu and x.dtype == dtype and x.dim() == 2
            and x.shape[1] == d_in):
        raise ValueError(f"{what}: expected a contiguous {dtype} matrix (rows, {d_in}) on the "
                         f"CPU, got {getattr(x, 'dtype', type(x).__name__)} "
                         f"{tuple(getattr(x, 'shape', ()))} on {getattr(x, 'device', '-')}")
    return x


def _one_row(x: Tensor, d_in: int, dtype: torch.dtype) -> Tensor:
    """:func:`_checked_row` for a kernel that takes exactly one row."""
    x = _checked_row(x, d_in, dtype, "x")
    if x.shape[0] != 1:
        raise ValueError(f"x: this kernel takes one row (1, {d_in}), got {x.shape[0]} rows "
                         f"(llmcore.lowbit.ONE_ROW_FORMATS sends several to PyTorch's kernels)")
    return x


def _check_bias(b: Tensor | None, d_out: int, dtype: torch.dtype, what: str) -> None:
    if b is not None and not (b.is_cpu and b.dtype == dtype and tuple(b.shape) == (d_out,)
                              and b.is_contiguous()):
        raise ValueError(f"{what}: expected a bias of shape ({d_out},) {dtype} on the CPU, got "
                         f"{b.dtype} {tuple(b.shape)} on {b.device}")


def w8a8_onerow(x: Tensor, w: W8A8Rows, b: Tensor | None = None) -> Tensor:
    """x (rows, d_in) float32 @ the int8 matrix (+ b (d_out,) float32) -> (rows, d_out)
    float32, each row rounded to integer codes on its own scale as "w8a8" rounds it
    (:func:`llmcore.lowbit.w8a8_matmul`). One row runs the C kernel; several (a prompt) run
    ``torch._int_mm`` on the same codes, whose integer sums are the same. Chapter 13."""
    d_out, d_in = w.codes.shape
    x = _checked_row(x, d_in, torch.float32, "x")
    _check_bias(b, d_out, torch.float32, "b")
    if x.shape[0] != 1:
        return _w8a8_rows(x, w, b)
    out = torch.empty(1, d_out, dtype=torch.float32)
    with _profiled("llmcore::w8a8_onerow"):
        status = _library().llmcore_w8a8_onerow(
            w.codes.data_ptr(), w.row_sums.data_ptr(), w.scale.data_ptr(),
            None if b is None else b.data_ptr(), x.data_ptr(), out.data_ptr(), d_out, d_in)
    if status:
        raise MemoryError(f"w8a8_onerow: no memory for {d_in} activation codes")
    return out


def _w8a8_rows(x: Tensor, w: W8A8Rows, b: Tensor | None) -> Tensor:
    """Several rows: each rounded to its codes in C (the one-row kernel's rounding), the exact
    integer product ``torch._int_mm`` (oneDNN's; codes -64..64 fit int8), then in C each row's
    step and each column's scale, the one-row kernel's float32 operations: a row gives the
    same numbers alone and in a batch. A row with an inf or a NaN gives NaN, a row of zeros
    the bias."""
    rows, d_in = x.shape
    d_out = w.codes.shape[0]
    codes = torch.empty(rows, d_in, dtype=torch.int8)
    steps = torch.empty(rows, dtype=torch.float32)
    library = _library()
    library.llmcore_w8a8_round_rows(x.data_ptr(), codes.data_ptr(), steps.data_ptr(), rows,
                                    d_in)
    sums = torch._int_mm(codes, w.codes.t()).contiguous()                # (rows, d_out)
    out = torch.empty(rows, d_out, dtype=torch.float32)
    library.llmcore_w8a8_scale_rows(sums.data_ptr(), steps.data_ptr(), w.scale.data_ptr(),
                                    None if b is None else b.data_ptr(), out.data_ptr(), rows,
                                    d_out)
    return out


def int8_onerow(x: Tensor, w, b: Tensor | None = None) -> Tensor:
    """x (1, d_in) bfloat16, one row, @ an :class:`llmcore.lowbit.Int8Linear` (+ b (d_out,)
    bfloat16) -> (1, d_out) bfloat16, the weight-only int8 product: float32 sums, one rounding
    (``lowbit.ONE_ROW_FORMATS["int8"]`` sends several rows to PyTorch's kernel). Chapter 13."""
    d_out, d_in = w.values.shape
    x = _one_row(x, d_in, torch.bfloat16)
    _check_bias(b, d_out, torch.bfloat16, "b")
    if w.scale.dtype != torch.bfloat16 or not w.values.is_contiguous():
        raise ValueError(f"w: expected contiguous int8 codes and bfloat16 scales, got "
                         f"{w.values.dtype} codes and {w.scale.dtype} scales")
    out = torch.empty(1, d_out, dtype=torch.bfloat16)
    with _profiled("llmcore::int8_onerow"):
        status = _library().llmcore_int8_onerow(
            w.values.data_ptr(), w.scale.data_ptr(), None if b is None else b.data_ptr(),
            x.data_ptr(), out.data_ptr(), d_out, d_in)
    if status:
        raise MemoryError(f"int8_onerow: no memory for {d_in} activations")
    return out


def bf16_rows(weight: Tensor, dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """weight (d_in, d_out) -> (d_out, d_in) bfloat16, contiguous: each output's weights in one
    row, as :func:`bf16_onerow` reads them. dtype: the activations', bfloat16."""
    if dtype != torch.bfloat16:
        raise ValueError(f"bf16: the one-row kernel takes bfloat16 activations, got {dtype}")
    return weight.detach().t().to(torch.bfloat16).contiguous()


BF16_ROWS_AT_MOST = 8
"""The most rows :func:`bf16_onerow` takes without AMX: GPT-2 small's 48 block matrices took,
on the course's Xeon (2 cores, measured together with ``F.linear``), 12 ms for 2 or 4 rows
against 19 ms, 18 ms for 8 against 20, and 30 ms for 16 against 20 (its multiply-adds, not its
reads, bind the kernel from there: oneDNN's blocked products win)."""

BF16_AMX_ROWS_AT_MOST = 96
"""The most rows :func:`bf16_onerow` takes on AMX (six groups of 16, one tile of sums each):
the same 48 matrices took 10.4-10.9 ms for 2 to 16 rows against ``F.linear``'s 16-17 ms, 19
against 32 for 64 rows and 31 against 39 for 96, measured together."""


def bf16_rows_at_most(device: torch.device | str = "cpu") -> int:
    """The most rows :func:`bf16_onerow` takes on ``device``: :data:`BF16_AMX_ROWS_AT_MOST`
    where :func:`amx_available`, else :data:`BF16_ROWS_AT_MOST`."""
    return BF16_AMX_ROWS_AT_MOST if amx_available(device) else BF16_ROWS_AT_MOST


def bf16_onerow(x: Tensor, w: Tensor, b: Tensor | None = None, *,
                amx: bool | None = None) -> Tensor:
    """x (rows, d_in) bfloat16 @ w, a (d_out, d_in) matrix of :func:`bf16_rows` (+ b (d_out,)
    bfloat16) -> (rows, d_out) bfloat16: float32 sums of bfloat16 products, one rounding. One
    row streams w once (AVX512-BF16's dot products, each core reading eight runs of rows at
    once). Several, up to :func:`bf16_rows_at_most` (a prompt), read each weight from memory
    once for all of them: on AMX (``native/amx.c``, the sums in the tile unit's order, each
    core reading six blocks of 16 outputs at once), or else four outputs' weights at a time
    for four rows at a time, each row's sums those of the row alone (a row gives the same
    numbers alone and in a batch). ``amx``: None takes AMX where :func:`amx_available`, False
    never (at most :data:`BF16_ROWS_AT_MOST` rows then). ``lowbit.ONE_ROW_FORMATS["bf16"]``
    sends more rows to ``F.linear``. Chapter 13."""
    d_out, d_in = w.shape
    x = _checked_row(x, d_in, torch.bfloat16, "x")
    _check_bias(b, d_out, torch.bfloat16, "b")
    if w.dtype != torch.bfloat16 or not w.is_contiguous():
        raise ValueError(f"w: expected a contiguous bfloat16 (d_out, d_in) matrix, got "
                         f"{w.dtype}")
    on_amx = amx_available() if amx is None else amx
    if on_amx and not amx_available():
        raise ValueError(f"amx=True, but AMX does not run here: {amx_unavailable_reason()}")
    rows, most = x.shape[0], BF16_AMX_ROWS_AT_MOST if on_amx else BF16_ROWS_AT_MOST
    if rows > most:
        raise ValueError(f"x: bf16_onerow takes at most {most} rows here, got {rows} "
                         f"(llmcore.lowbit.ONE_ROW_FORMATS sends more to F.linear)")
    out = torch.empty(rows, d_out, dtype=torch.bfloat16)
    bias, library = None if b is None else b.data_ptr(), _library()
    with _profiled("llmcore::bf16_onerow"):
        if rows == 1:
            library.llmcore_bf16_onerow(w.data_ptr(), bias, x.data_ptr(), out.data_ptr(),
                                        d_out, d_in)
            return out
        if not rows:
            return out
        rows_kernel = library.llmcore_bf16_rows_amx if on_amx else library.llmcore_bf16_rows
        if rows_kernel(w.data_ptr(), bias, x.data_ptr(), out.data_ptr(), rows, d_out, d_in):
            raise MemoryError(f"bf16_onerow: no memory for {rows} rows of {d_in} activations")
    return out


def argmax_rows(logits: Tensor) -> Tensor:
    """The index of each row's first largest value: logits (b, v) float32 or bfloat16 on the
    CPU -> (b,) int64, ``torch.argmax(logits, dim=-1)``'s answer (a NaN counts as the
    largest), found in C: PyTorch's argmax took 110 us (float32) and 250 us (bfloat16) for
    GPT-2's 50257 logits on the course's Xeon, a step in C takes a few (the greedy pick of
    :func:`llmcore.sampling.token_picker` on the fast path). Other dtypes and devices are
    refused by name."""
    if not (isinstance(logits, Tensor) and logits.is_cpu and logits.dim() == 2
            and logits.dtype in (torch.float32, torch.bfloat16) and logits.shape[1] > 0):
        raise ValueError(f"logits: expected a (b, v) float32 or bfloat16 matrix with v > 0 on "
                         f"the CPU, got {getattr(logits, 'dtype', type(logits).__name__)} "
                         f"{tuple(getattr(logits, 'shape', ()))} on "
                         f"{getattr(logits, 'device', '-')}")
    logits = logits.contiguous()
    out = torch.empty(logits.shape[0], dtype=torch.long)
    with _profiled("llmcore::argmax_rows"):
        _library().llmcore_argmax_rows(logits.data_ptr(), out.data_ptr(), logits.shape[0],
                                       logits.shape[1], int(logits.dtype == torch.bfloat16))
    return out


def int4_rows(weight: Tensor, dtype: torch.dtype = torch.bfloat16,
              group_size: int = INT4_GROUP_SIZE) -> Int4Rows:
    """weight (d_in, d_out) -> :class:`Int4Rows`: :func:`llmcore.quantize.quantize_int4`'s codes
    (with zero points), scales and offsets in tiles of 16 outputs. dtype: the activations',
    bfloat16. group_size: rows per scale, a multiple of :data:`INT4_WORD`."""
    if dtype != torch.bfloat16:
        raise ValueError(f"int4: the kernel takes bfloat16 activations, got {dtype}")
    if group_size % INT4_WORD:
        raise ValueError(f"int4: the kernel reads codes {INT4_WORD} at a time: group_size must "
                         f"be a multiple of {INT4_WORD}, got {group_size}")
    q = quantize_int4(weight.detach(), group_size)
    d_in, d_out = weight.shape
    tiles = -(-d_out // INT4_TILE)
    pad = (0, tiles * INT4_TILE - d_out)                     # zeros past d_out
    codes = torch.nn.functional.pad(unpack_int4(q.packed), pad).to(torch.int64)
    eights = codes.view(d_in // INT4_WORD, INT4_WORD, tiles, INT4_TILE)
    words = sum(eights[:, q] << (4 * q) for q in range(INT4_WORD))       # (d_in / 8, tiles, 16)

    def tiled(t: Tensor) -> Tensor:                                     # (G, d_out) -> tiles
        t = torch.nn.functional.pad(t, pad).to(torch.bfloat16)
        return t.view(-1, tiles, INT4_TILE).permute(1, 0, 2).contiguous()

    scale, offset = int4_scale_offset(q)
    return Int4Rows(words.to(torch.uint32).permute(1, 0, 2).contiguous(), tiled(scale),
                    tiled(offset), d_out, group_size)


def int4_onerow(x: Tensor, w: Int4Rows, b: Tensor | None = None) -> Tensor:
    """x (rows, d_in) bfloat16 @ an :class:`Int4Rows` matrix (+ b (d_out,) bfloat16) ->
    (rows, d_out) bfloat16, the weight-only int4 product: each code's value looked up in a
    table of sixteen, float32 sums, one rounding. One row streams the codes once; several (a
    prompt) take each tile four rows at a time, with each row's operations those of a row
    alone (a row gives the same numbers alone and in a batch). Chapter 13."""
    tiles, words, lanes = w.codes.shape
    d_in = words * INT4_WORD
    x = _checked_row(x, d_in, torch.bfloat16, "x")
    _check_bias(b, w.d_out, torch.bfloat16, "b")
    groups = d_in // w.group_size
    if not (w.codes.dtype == torch.uint32 and lanes == INT4_TILE and w.codes.is_contiguous()
            and w.scale.shape == w.offset.shape == (tiles, groups, INT4_TILE)
            and w.scale.dtype == w.offset.dtype == torch.bfloat16
            and w.scale.is_contiguous() and w.offset.is_contiguous()
            and 0 < w.d_out <= tiles * INT4_TILE):
        raise ValueError(f"w: expected an Int4Rows of int4_rows (codes ({tiles}, {words}, 16) "
                         f"uint32, scale and offset ({tiles}, {groups}, 16) bfloat16), got "
                         f"codes {w.codes.dtype} {tuple(w.codes.shape)}, scale "
                         f"{w.scale.dtype} {tuple(w.scale.shape)}, offset {w.offset.dtype} "
                         f"{tuple(w.offset.shape)}, d_out {w.d_out}")
    rows = x.shape[0]
    out = torch.empty(rows, w.d_out, dtype=torch.bfloat16)
    with _profiled("llmcore::int4_onerow"):
        status = _library().llmcore_int4_rows(
            w.codes.data_ptr(), w.scale.data_ptr(), w.offset.data_ptr(),
            None if b is None else b.data_ptr(), x.data_ptr(), out.data_ptr(), rows, w.d_out,
            d_in, w.group_size)
    if status:
        raise MemoryError(f"int4_onerow: no memory for {rows} rows of {d_in} activations")
    return out


def fp32_onerow(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    """x (rows, d_in) float32 @ w, the model's own (d_in, d_out) float32 matrix (+ b (d_out,)
    float32) -> (rows, d_out) float32. One row runs the C kernel: each thread reads a band of
    w's rows front to back into its own partial sums, added at the end; several (a prompt)
    run ``torch.addmm``. Chapter 13."""
    if not (isinstance(w, Tensor) and w.dtype == torch.float32 and w.dim() == 2
            and w.is_contiguous() and w.is_cpu):
        raise ValueError(f"w: expected a contiguous float32 (d_in, d_out) matrix on the CPU, "
                         f"got {getattr(w, 'dtype', type(w).__name__)} "
                         f"{tuple(getattr(w, 'shape', ()))}")
    d_in, d_out = w.shape
    x = _checked_row(x, d_in, torch.float32, "x")
    _check_bias(b, d_out, torch.float32, "b")
    if x.shape[0] != 1:
        return x @ w if b is None else torch.addmm(b, x, w)
    out = torch.empty(1, d_out, dtype=torch.float32)
    with _profiled("llmcore::fp32_onerow"):
        status = _library().llmcore_fp32_onerow(
            w.data_ptr(), None if b is None else b.data_ptr(), x.data_ptr(), out.data_ptr(),
            d_out, d_in)
    if status:
        raise MemoryError(f"fp32_onerow: no memory for the threads' {d_out} partial sums")
    return out


def gpt_step(model: int, keys: int, values: int, capacity: int, bf16_cache: bool, token: int,
             position: int, start: int, logits: int, product_seconds: int | None) -> int:
    """The call of ``native/step.c``'s ``llmcore_gpt_step`` on addresses (the model's
    description, the cache's keys and values, the logits, where the products' seconds are
    added or None): 0, or -1 without memory. It checks nothing:
    :class:`llmcore.onerow_step.GPTStepInC` describes and checks every tensor it reads."""
    with _profiled("llmcore::gpt_step"):
        return _library().llmcore_gpt_step(model, keys, values, capacity, int(bf16_cache),
                                           token, position, start, logits, product_seconds)


def gpt_tokens(model: int, keys: int, values: int, capacity: int, bf16_cache: bool,
               tokens: int, n: int, position: int, start: int, logits: int,
               product_seconds: int | None) -> int:
    """The call of ``native/step.c``'s ``llmcore_gpt_tokens``: :func:`gpt_step` for ``n``
    tokens at once (a prompt), ``tokens`` the address of their (n,) int64 ids. 0, or -1
    without memory. It checks nothing: :class:`llmcore.onerow_step.GPTStepInC` does."""
    with _profiled("llmcore::gpt_tokens"):
        return _library().llmcore_gpt_tokens(model, keys, values, capacity, int(bf16_cache),
                                             tokens, n, position, start, logits,
                                             product_seconds)
