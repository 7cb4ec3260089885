"""Fresh inputs at grade time: every case is run again on values nobody could know in advance.

A test cell's inputs are fixed (literals, seeded generators): a learner can read them, and the
hidden ones reach the kernel with the cell. So when the trusted grader runs a test cell, each case
runs a second time on a *twin* of its arguments drawn from a **secret for that cell**
(:meth:`llmcheck.cases.Test.call`).

How the secret arrives: just before the cell, the grader's executor tells the kernel that one
waits (:func:`expect`). The first case that needs it asks for it on the kernel's stdin channel,
through the kernel's own ``raw_input`` taken when the kernel started (:func:`install`, before any
learner code), and the executor answers the first request of the cell with the secret and any
other request with nothing. So code that runs before the cell's first case (an IPython hook, an
input transformer) cannot read the secret: it is not in the kernel yet. If such code asks for it
first, the harness's own request comes back empty, every twin of the cell fails
(:class:`SecretTaken`), and the executor records the second request for the instructor. After
the cell the secret is withdrawn (``receive(None)``). The instructor's solution runs with
the same secret, so its twin records are the expected answers; answers memoised for the released
inputs, or for inputs read from a test's source, earn nothing on the twin. Without a secret (the
learner's own check, a chapter) there is no twin.

What a twin redraws (:func:`twin`), each kind of value keeping its meaning:

* a floating-point tensor: new values with the same shape, dtype, device, mean and spread (so
  "large logits" stay large); its non-finite entries (a mask's ``-inf``) stay where they are and
  only the finite ones are redrawn; a constant tensor (a norm's unit gain, a 0/-inf mask) is kept;
* an integer tensor (token ids, codes, lengths, positions, indices): every entry drawn uniformly
  between the tensor's own smallest and largest entry, so ids stay in the vocabulary and indices in
  range; a boolean tensor is kept (a causal mask);
* a list of integers (prompts, nested or not): the same, between its own smallest and largest;
* a model (``nn.Module``): a copy with fresh weights; anything else (a cache, a store): a deep copy
  taken **before** the case runs, so the twin starts from the state the case started from and
  cannot disturb the cases that follow;
* a bound method (``cache.append``): the method of a twin of its object;
* a function given ``inputs=`` (a lambda or helper of the test cell that closes over its data):
  the same code over twins of the data it reads (its globals and closure cells that are not
  modules, functions or classes), the ``inputs`` redrawn first so the closure sees the same twins;
* Python numbers, strings and tuples are kept (a ``dim``, a ``k``, a size): a case whose only
  inputs are such values draws them with the test's own rule, ``fresh_inputs=lambda rng: args``
  (``rng`` a NumPy generator seeded from the secret; the callable returns the twin's positional
  arguments).

A case with nothing to redraw (an allocator's bookkeeping, a property read) has no twin.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import os
import sys
import types
from typing import Callable, NamedTuple

import torch

from .record import SECRET_PROMPT, TWIN_SUFFIX

_secret: bytes | None = None
_expected = False            # the grader holds a secret for the cell now running, not yet asked
_taken = False               # the grader answered this cell's request with nothing
_ask: Callable[[str], str] | None = None     # the kernel's raw_input, taken at install
_cell_files = ""             # the folder of the files IPython compiles cells into


class SecretTaken(RuntimeError):
    """The grader answered the harness's request for the cell's secret with nothing: other code
    in the kernel asked for it first."""


def install() -> bool:
    """Take the kernel's ``raw_input`` (before any learner code runs); False outside a kernel."""
    global _ask, _cell_files
    try:
        from IPython import get_ipython
        shell = get_ipython()
        _ask = shell.kernel.raw_input
        _cell_files = os.path.dirname(shell.compile.get_code_name("", "", 0)) + os.sep
    except Exception:                                       # noqa: BLE001  (not a kernel)
        return False
    return True


def expect() -> None:
    """The grader says the cell about to run has a secret, given on the first request."""
    global _secret, _expected, _taken
    _secret, _expected, _taken = None, True, False


def receive(token: str | None) -> None:
    """Set (a hex string) or withdraw (None) the secret of the test cell now running (the
    grader withdraws it after the cell; tests and chapters set one to draw twins)."""
    global _secret, _expected, _taken
    _secret = bytes.fromhex(token) if token else None
    if token is None:
        _expected = _taken = False


def _asked_by_a_test_cell() -> bool:
    """Whether this request comes from :func:`twin` called by ``Test.call`` (or ``Test.raises``)
    called by the code of the cell now running: the outermost notebook-cell frame on the stack is
    a cell's module code, and that method's caller is in that same cell (not a hook or a helper
    of an earlier cell, which runs in a file of its own)."""
    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    drawer, frame = sys._getframe(2), sys._getframe(3)    # _secret_now <- twin <- Test.call/raises
    if drawer.f_code is not twin.__code__ or frame.f_code.co_name not in ("call", "raises") \
            or not frame.f_code.co_filename.startswith(here):
        return False
    caller, outermost, walk = frame.f_back, None, frame.f_back
    while walk is not None:
        if walk.f_code.co_filename.startswith(_cell_files):
            outermost = walk
        walk = walk.f_back
    return outermost is not None and outermost.f_code.co_name == "<module>" \
        and caller is not None and caller.f_code.co_filename == outermost.f_code.co_filename


def _secret_now() -> bytes | None:
    """The cell's secret (see the module's docstring); None without one. While the grader holds
    it, the first request from a test cell's own call asks for it on stdin, whatever the module's
    state says; a request from anywhere else gets None and asks nothing."""
    global _secret, _expected, _taken
    if _expected and _ask is not None:
        if not _asked_by_a_test_cell():
            return None
        _expected = False
        try:
            token = _ask(SECRET_PROMPT)
        except Exception:                                   # noqa: BLE001  (no stdin)
            token = ""
        _secret, _taken = (bytes.fromhex(token), False) if token else (None, True)
    if _taken:
        raise SecretTaken("the grader gave this cell's secret to an earlier request, so its "
                          "cases could not be run again on fresh inputs")
    return _secret


def active() -> bool:
    """Whether the grader handed over, or holds, a secret for the cell now running."""
    return _secret is not None or _expected or _taken


def _seed(cell: str, case: str) -> int:
    digest = hashlib.sha256(_secret + f"\0{cell}\0{case}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def _generator(cell: str, case: str) -> torch.Generator:
    """A CPU generator seeded by the cell's secret and the case (values are drawn on the CPU and
    moved to the argument's device, so every device draws the same)."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed(_seed(cell, case))
    return generator


def _fresh_tensor(t: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """New values like ``t``'s (see the module's docstring), or ``t`` itself when it keeps them."""
    if t.device.type == "meta" or t.numel() == 0 or t.is_complex() or t.dtype == torch.bool:
        return t
    if not t.dtype.is_floating_point:
        return _fresh_integers(t, generator)
    values = t.detach().to("cpu", torch.float64)
    finite = torch.isfinite(values)
    kept = values[finite]
    if kept.numel() == 0 or kept.numel() > 1 and bool((kept == kept[0]).all()):
        return t                   # a mask, or a constant (a norm's unit gain): keep its meaning
    mean = float(kept.mean())
    spread = float(kept.std()) if kept.numel() > 1 else max(abs(mean), 1.0)
    spread = spread if spread > 0 else 1.0
    drawn = torch.randn(t.shape, generator=generator, dtype=torch.float64) * spread + mean
    drawn = torch.where(finite, drawn, values)             # -inf stays -inf, where it was
    fresh = drawn.to(dtype=t.dtype, device=t.device)
    return fresh.requires_grad_(t.requires_grad) if t.is_leaf else fresh


DRAWS = 8
"""Draws a twin of integers makes until it differs from the original (a few values in a narrow
range may come out the same: a memo keyed on them would then pass)."""


def _fresh_integers(t: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    low, high = int(t.min()), int(t.max())
    if low == high:
        return t
    original = t.detach().to("cpu", torch.int64)
    for _ in range(DRAWS):
        drawn = torch.randint(low, high + 1, t.shape, generator=generator, dtype=torch.int64)
        if not torch.equal(drawn, original):
            break
    return drawn.to(dtype=t.dtype, device=t.device)


def _int_leaves(value) -> list[int] | None:
    """The integers of a (nested) list holding integers only, or None."""
    if type(value) is list:
        found = []
        for item in value:
            inner = _int_leaves(item) if type(item) is list else \
                [item] if type(item) is int else None
            if inner is None:
                return None
            found += inner
        return found
    return None


def _fresh_int_list(value: list, low: int, high: int, generator: torch.Generator) -> list:
    return [_fresh_int_list(item, low, high, generator) if type(item) is list
            else int(torch.randint(low, high + 1, (), generator=generator)) for item in value]


class Twin(NamedTuple):
    """A case's twin: what to call, on what (and the inputs it closes over, for the digest)."""
    fn: Callable
    args: tuple
    kwargs: dict
    inputs: object


class _Drawer:
    """One twin's draws, sharing one memo (object id -> its twin), so an object reached twice
    (as an argument and inside a model, a store or a closure) has one twin."""

    def __init__(self, generator: torch.Generator):
        self.generator = generator
        self.memo: dict[int, object] = {}
        self.redrawn = False

    def leaf(self, value):
        if id(value) in self.memo:
            return self.memo[id(value)]
        if isinstance(value, torch.Tensor):
            drawn = _fresh_tensor(value, self.generator)
            self.redrawn |= drawn is not value
        elif isinstance(value, torch.nn.Module):             # a model: fresh weights
            drawn = copy.deepcopy(value, self.memo)
            with torch.no_grad():
                for tensor in [*drawn.parameters(), *drawn.buffers()]:
                    fresh = _fresh_tensor(tensor, self.generator)
                    self.redrawn |= fresh is not tensor
                    tensor.copy_(fresh)
        else:
            ints = _int_leaves(value)
            if ints and min(ints) < max(ints):
                for _ in range(DRAWS):
                    drawn = _fresh_int_list(value, min(ints), max(ints), self.generator)
                    if drawn != value:
                        break
                self.redrawn = True
            else:
                drawn = copy.deepcopy(value, self.memo)
        self.memo[id(value)] = drawn
        return drawn

    def tree(self, value):
        """A twin of a nested value: lists of integers drawn whole, other branches rebuilt."""
        def walk(v):
            if type(v) is list and _int_leaves(v):
                return self.leaf(v)
            if type(v) in (list, tuple):
                return type(v)(walk(item) for item in v)
            if type(v) is dict:
                return {key: walk(item) for key, item in v.items()}
            return self.leaf(v)

        return walk(value)

    def data(self, value) -> bool:
        """Whether a global or closure value is data a twin redraws (not code, a class or a
        module)."""
        return not isinstance(value, (types.ModuleType, types.FunctionType, type,
                                      types.BuiltinFunctionType, types.MethodType))

    def function(self, fn: types.FunctionType) -> types.FunctionType:
        """``fn``'s code over twins of the data it reads: its globals and closure cells."""
        names: set[str] = set()
        codes = [fn.__code__]
        while codes:
            code = codes.pop()
            names.update(code.co_names)
            codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
        namespace = fn.__globals__
        twin_globals = dict(namespace)
        for name in names:
            if name in namespace and self.data(namespace[name]):
                twin_globals[name] = self.leaf(namespace[name])
        closure = None
        if fn.__closure__:
            closure = tuple(types.CellType(self.leaf(cell.cell_contents)
                                           if self.data(cell.cell_contents)
                                           else cell.cell_contents) for cell in fn.__closure__)
        twin_fn = types.FunctionType(fn.__code__, twin_globals, fn.__name__, fn.__defaults__,
                                     closure)
        twin_fn.__kwdefaults__ = fn.__kwdefaults__
        return twin_fn


def twin(cell: str, case: str, fn: Callable, args: tuple, kwargs: dict, *, inputs=(),
         draw: Callable | None = None) -> Twin | None:
    """The case's twin drawn from the cell's secret (see the module's docstring), or None when
    there is no secret or nothing to redraw. Call it before the case runs: objects are copied in
    the state the case starts from. draw: the test's rule for its Python-number arguments.
    Raises :class:`SecretTaken` when the cell's secret went to an earlier request."""
    if _secret_now() is None:
        return None
    drawer = _Drawer(_generator(cell, case))
    twin_inputs = drawer.tree(inputs)
    if draw is not None:
        import numpy
        drawn = draw(numpy.random.default_rng(_seed(cell, case + " [draw]")))
        twin_args = tuple(drawn) if isinstance(drawn, (list, tuple)) else (drawn,)
        drawer.redrawn = True
    else:
        twin_args = drawer.tree(tuple(args))
    twin_kwargs = drawer.tree(dict(kwargs))
    twin_fn = fn
    if inspect.ismethod(fn) and not isinstance(fn.__self__, (type, types.ModuleType)):
        twin_fn = types.MethodType(fn.__func__, drawer.leaf(fn.__self__))
    elif isinstance(fn, types.FunctionType) and inputs != ():
        twin_fn = drawer.function(fn)
    if not drawer.redrawn:
        return None
    return Twin(twin_fn, twin_args, twin_kwargs, twin_inputs)


__all__ = ["TWIN_SUFFIX", "SecretTaken", "Twin", "active", "expect", "install", "receive",
           "twin"]
