"""What an exercise's test cell uses: run the learner's function and publish what it did.

A test cell makes a :class:`Test` and runs each case through :meth:`Test.call` (or
:meth:`Test.raises`): the function runs under :class:`llmcheck.recorder.OpRecorder` with the cell's
policy, then the tamper canaries run, then one record (the output, the aten ops reached, the
inputs' digest) is published as a ``display_data`` output of MIME type :data:`RECORD_MIME`. The
kernel only produces these records; the grader judges them outside it against the instructor's run
(course/grading/VERDICTS.md). The cell still asserts on the returned value, for feedback.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import sys
from types import MappingProxyType
from typing import Callable

import torch

from . import fresh
from .blocking import blocked
from .identity import identity
from .record import OPTIONS, RECORD_MIME, RECORD_VERSION, too_large, too_much_live
from .recorder import NotAllowedError, OpRecorder, Policy, storages_of
from .tree import fold, tensors_in


def encode(value) -> dict:
    """A function's result as JSON data: tensors as dtype, shape and base64 bytes."""
    if isinstance(value, torch.Tensor):
        t = value.detach().to("cpu").contiguous()
        if t.dtype == torch.bfloat16:
            t = t.float()
        data = t.numpy().tobytes() if t.numel() else b""
        return {"tensor": {"dtype": str(t.dtype).removeprefix("torch."),
                           "shape": list(t.shape), "data": base64.b64encode(data).decode()}}
    if isinstance(value, (list, tuple)):
        return {type(value).__name__ if type(value) in (list, tuple) else "list":
                [encode(v) for v in value]}
    if value is None:
        return {"none": True}
    if isinstance(value, bool):
        return {"value": value}
    if isinstance(value, int):
        return {"value": int(value)}
    if isinstance(value, float):
        return {"value": value if value == value and abs(value) != float("inf") else repr(value)}
    if isinstance(value, str):
        return {"value": value}
    return {"other": type(value).__name__}


def raised(error: BaseException) -> dict:
    """An exception as a record states it: its type, every class it is an instance of (a
    learner's own subclass of ValueError is a ValueError), and its message."""
    return {"type": type(error).__name__,
            "types": [cls.__name__ for cls in type(error).__mro__ if cls is not object],
            "message": str(error)[:500]}


def _leaf_pieces(value) -> list:
    """What a leaf adds to the digest: bytes, and tensors (turned into bytes one at a time)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, torch.nn.Module):
        return [f"M{type(value).__name__}".encode(),
                *(piece for name, tensor in value.state_dict().items()
                  for piece in (name.encode(), tensor))]
    if isinstance(value, (int, float, bool, str, type(None))):
        return [f"S{type(value).__name__}{value!r}".encode()]
    return [f"O{type(value).__name__}".encode()]


def _branch_pieces(container, results: list[list]) -> list:
    """A list or tuple: its length, then its items; a dict: each key (in the order of its text)
    with its value."""
    if isinstance(container, dict):
        keyed = sorted(zip(container, results), key=lambda item: str(item[0]))
        return [piece for key, result in keyed for piece in (str(key).encode(), *result)]
    return [f"L{len(container)}".encode(), *(piece for result in results for piece in result)]


def _tensor_bytes(value: torch.Tensor) -> bytes:
    t = value.detach().to("cpu").contiguous()
    data = (t.float() if t.dtype == torch.bfloat16 else t).numpy().tobytes() if t.numel() else b""
    return f"T{t.dtype}{tuple(t.shape)}".encode() + data


def digest(*values) -> str:
    """SHA-256 of the values' types, dtypes, shapes and bytes (a model: its state dict)."""
    h = hashlib.sha256()
    for v in values:
        for piece in fold(v, _leaf_pieces, _branch_pieces):
            h.update(_tensor_bytes(piece) if isinstance(piece, torch.Tensor) else piece)
    return h.hexdigest()


def _views_of(result, argument) -> list[bool]:
    tensors = result if isinstance(result, (list, tuple)) else [result]
    if not isinstance(argument, torch.Tensor):
        return [False for _ in tensors]
    base = argument.untyped_storage().data_ptr()
    return [isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() == base
            for t in tensors]


_CANARY_OPS = MappingProxyType({
    "bmm": lambda eye: torch.ops.aten.bmm(eye[None], eye[None]),
    "dot": lambda eye: torch.ops.aten.dot(eye[0], eye[0]),
    "_softmax": lambda eye: torch.ops.aten._softmax(eye, -1, False),
    "_safe_softmax": lambda eye: torch.ops.aten._safe_softmax(eye, -1),
    "logsumexp": lambda eye: torch.ops.aten.logsumexp(eye, [1]),
})
"""A known call of each op a policy may forbid: the forbid canary commits it."""

_CANARY_FUNCTIONS = MappingProxyType({
    "torch.quantile": lambda eye: torch.quantile(eye, 0.5),
})
"""A known call of the torch functions a policy may refuse (``policy.functions``)."""


def _unseen(result, recorder: OpRecorder, given) -> bool:
    """Whether a returned tensor was neither given to the call nor made by an op the recorder saw
    (made before the call, or computed with the recorder switched off)."""
    known = recorder.produced | {t.untyped_storage().data_ptr() for t in tensors_in(given)}
    return any(t.numel() and t.device.type != "meta"
               and t.untyped_storage().data_ptr() not in known for t in tensors_in(result))


def _in_place(stand_ins: dict) -> bool:
    """Whether every stand-in of :func:`~llmcheck.blocking.blocked` ({identity(stand-in): (owner,
    name)}) is still where it was put: False when the learner's code put a refused name back."""
    return all(identity(getattr(owner, attr, None)) == stand_in_id
               for stand_in_id, (owner, attr) in stand_ins.items())


def _canaries(recorder: OpRecorder) -> dict[str, bool]:
    """Known violations committed after the learner's function returned, under the same recorder
    and stand-ins: each must still be seen (True) or the learner's code switched a check off
    (the stand-ins' own places are checked by :func:`_in_place`, outside the recorder)."""
    policy = recorder.policy
    counted = (recorder.ops.copy(), recorder.products, recorder.flops)
    largest = (recorder.largest, recorder.largest_shape, recorder.largest_op,
               recorder.peak_live, recorder.peak_live_op)
    before = (recorder.ops["aten.mm"], recorder.products, len(recorder.violations))
    eye = torch.eye(2)
    refused = False
    try:
        torch.ops.aten.mm(eye, eye)
    except NotAllowedError:
        refused = True
    result = {"recorder": recorder.ops["aten.mm"] == before[0] + 1
              and recorder.products == before[1] + 1}
    forbid_ok = refused == ("mm" in policy.ops)
    for op, attempt in _CANARY_OPS.items():
        if op in policy.ops and op != "mm":
            try:
                attempt(eye)
                forbid_ok = False
            except NotAllowedError:
                pass
    for name, attempt in _CANARY_FUNCTIONS.items():
        if name in policy.functions:        # a refused helper must still be refused
            try:
                attempt(eye)
                forbid_ok = False
            except NotAllowedError:
                pass
    if policy.autograd:                     # a backward pass must still be refused
        try:
            with torch.inference_mode(False), torch.enable_grad():
                leaf = eye.clone().requires_grad_()
                torch.autograd.grad((leaf * leaf).sum(), leaf)
            forbid_ok = False
        except NotAllowedError:
            pass
        except Exception:                   # noqa: BLE001  (not refused: the check is off)
            forbid_ok = False
    if recorder.profile_hook is not None and sys.getprofile() is not recorder.profile_hook:
        forbid_ok = False                   # the check of forbidden callables was switched off
    result["forbid"] = forbid_ok
    if policy.numpy:
        numpy = sys.modules.get("numpy")
        ok = True
        for attempt in (lambda: numpy.dot(1.0, 2.0), lambda: torch.ones(2).numpy(),
                        lambda: numpy.asarray(torch.ones(2))):
            try:
                attempt()
                ok = False
            except NotAllowedError:
                pass
        result["numpy"] = ok
    del recorder.violations[before[2]:]     # the canaries' own work is not the learner's
    recorder.ops, recorder.products, recorder.flops = counted
    (recorder.largest, recorder.largest_shape, recorder.largest_op, recorder.peak_live,
     recorder.peak_live_op) = largest
    return result


def _rebound_sentence(names: list[str]) -> str:
    """The violation of a case that found the harness's names bound to something else."""
    return ("the checking harness was changed while the cell ran ("
            + ", ".join(dict.fromkeys(names)) + " replaced), so its records cannot be trusted")


def _raiser(error: BaseException) -> Callable:
    """A stand-in for a twin that could not be made: calling it raises why."""
    def cannot_copy():
        raise RuntimeError(f"the fresh-input twin of this case could not be made: "
                           f"{type(error).__name__}: {error}") from error
    return cannot_copy


def install_rebinding_check() -> None:
    """Give :class:`Test` the harness's rebinding check
    (:func:`llmcheck.integrity.rebinding_check`), its baseline taken now: the grader's executor
    calls it when the kernel starts, after every harness module is loaded and before any learner
    code runs. The recorder's lazily made state (the harness's namespaces, torch's lazy imports)
    is made first, so that the baseline holds it."""
    from .integrity import rebinding_check
    from .recorder import warm_up
    warm_up()
    Test._rebound = staticmethod(rebinding_check())


class Test:
    """One test cell's cases: ``Test(grade_id, forbid=(...), hint=...)``, then ``call``/``raises``.

    forbid: targets as for :func:`llmcheck.recorder.forbid` (the cell's policy for every case).
    """

    __slots__ = ("cell", "policy", "cases", "last")     # no attribute can be added to a test

    _rebound: Callable[[], list[str]] = staticmethod(lambda: [])
    """The harness's names rebound since the kernel started (the grader's executor installs the
    check when the kernel starts, :func:`install_rebinding_check`; none elsewhere). Asked before
    each case and right after the learner's function returns, before any harness function it could
    have replaced runs: a replaced harness function fails the case, even when it is put back
    before the cell ends."""

    def __init__(self, cell: str, *, forbid=(), hint: str = ""):
        self.cell = cell
        self.policy = Policy.of(tuple(forbid), hint)
        self.cases: list[str] = []
        self.last: OpRecorder | None = None     # the last case's recorder (ops, products, flops)

    def _run(self, fn: Callable, args, kwargs, inputs=(), track_live: bool = False):
        rebound = self._rebound()
        recorder = OpRecorder(self.policy, exempt=storages_of(args, kwargs, inputs),
                              track_live=track_live)
        error = None
        result = None
        # the stand-ins go in before the recorder and come out after it: swapping thousands of
        # NumPy names under the recorder's profile hook (a Python call per builtin call) cost
        # most of a test cell's time
        with blocked(recorder) as stand_ins:
            with recorder:
                if rebound:                  # changed before the case: its first violation
                    recorder.violations.append(_rebound_sentence(rebound))
                try:
                    result = fn(*args, **kwargs)
                except BaseException as raised:        # noqa: BLE001  (published, then re-raised)
                    error = raised
                during = [name for name in self._rebound() if name not in rebound]
                if during:
                    recorder.violations.append(_rebound_sentence(during))
                if error is None and _unseen(result, recorder, (args, kwargs, inputs)):
                    recorder.violations.append(
                        "the result was not computed by operations the test could see (a tensor "
                        "made before the call, or computed with the op recorder switched off)")
                # a call interrupted (the cell's time ran out) may have lost the profile hook
                # to the interruption: its canaries would accuse the learner of tampering
                interrupted = isinstance(error, KeyboardInterrupt)
                canaries = {} if interrupted else _canaries(recorder)
            if not interrupted and not _in_place(stand_ins):
                canaries["forbid"] = False      # a refused name was put back during the call
        self.last = recorder
        return recorder, result, error, canaries

    def _publish(self, case: str, recorder: OpRecorder, output: dict, inputs: str,
                 canaries: dict, options: dict, views: list[bool]) -> None:
        if case in self.cases:
            raise ValueError(f"{self.cell}: case {case!r} is recorded twice; name each case once")
        self.cases.append(case)
        record = {"version": RECORD_VERSION, "cell": self.cell, "case": case,
                  "index": len(self.cases) - 1, "inputs": inputs, "output": output,
                  "ops": dict(sorted(recorder.ops.items())), "products": recorder.products,
                  "flops": recorder.flops, "views": views,
                  "largest": {"elements": recorder.largest, "shape": list(recorder.largest_shape),
                              "op": recorder.largest_op},
                  **({"live": {"elements": recorder.peak_live, "op": recorder.peak_live_op}}
                     if recorder.track_live else {}),
                  "violations": list(dict.fromkeys(recorder.violations)), "canaries": canaries,
                  "options": options, "policy": self.policy.describe()}
        from IPython.display import display
        display({RECORD_MIME: json.loads(json.dumps(record)),
                 "text/plain": f"[{self.cell}: {case} recorded]"}, raw=True)

    def call(self, fn: Callable, *args, case: str, inputs=(), kwargs: dict | None = None,
             fresh_inputs: bool = True, **options_and_kwargs):
        """Run ``fn(*args, **kwargs)`` under the policy; publish the record; return the result.

        Options (judged by the grader from the solution's record): rtol, atol, view_of,
        max_products, max_flops_ratio, max_elements (no tensor in the call may hold a storage of
        more elements: work in tiles); any other keyword goes to ``fn``. When the grader handed
        over a secret (llmcheck/fresh.py), the case runs again on fresh inputs and publishes a
        second record; ``fresh_inputs=False`` opts a case out (its inputs must keep a structure
        that random values would break); ``fresh_inputs=lambda rng: (n, m)`` draws the twin's
        positional arguments by the test's own rule (for Python numbers, which are kept).
        """
        options = {k: v for k, v in options_and_kwargs.items() if k in OPTIONS}
        kwargs = {**{k: v for k, v in options_and_kwargs.items() if k not in OPTIONS},
                  **(kwargs or {})}
        options.setdefault("rtol", 1e-5)
        options.setdefault("atol", 1e-6)
        twin = None
        if fresh_inputs:                  # drawn before the case runs: from the state it starts in
            try:
                twin = fresh.twin(self.cell, case, fn, args, kwargs, inputs=inputs,
                                  draw=fresh_inputs if callable(fresh_inputs) else None)
            except Exception as cannot:   # noqa: BLE001  (an object that cannot be copied)
                twin = fresh.Twin(_raiser(cannot), (), {}, inputs)
        recorder, result, error = self._case(fn, args, kwargs, inputs, case, options)
        if error is None and not recorder.violations and twin is not None:
            self._case(twin.fn, twin.args, twin.kwargs, twin.inputs, case + fresh.TWIN_SUFFIX,
                       options)               # judged by the grader, not raised here
            self.last = recorder
        if error is not None:
            raise error
        if recorder.violations:
            raise NotAllowedError(recorder.violations[0])
        if "max_elements" in options and recorder.largest > options["max_elements"]:
            raise AssertionError(too_large(recorder.largest, recorder.largest_shape,
                                           recorder.largest_op, options["max_elements"]))
        if "max_live_elements" in options and recorder.peak_live > options["max_live_elements"]:
            raise AssertionError(too_much_live(recorder.peak_live, recorder.peak_live_op,
                                               options["max_live_elements"]))
        return result

    def _case(self, fn: Callable, args, kwargs, inputs, case: str, options: dict):
        """Run one case under the recorder and publish its record: (recorder, result, error)."""
        input_digest = digest(args, kwargs, inputs)
        recorder, result, error, canaries = self._run(
            fn, args, kwargs, inputs, track_live="max_live_elements" in options)
        if error is not None:
            output = {"raised": raised(error)}
        else:
            output = encode(result)
        views = _views_of(result, args[options["view_of"]]) if "view_of" in options else []
        self._publish(case, recorder, output, input_digest, canaries, options, views)
        return recorder, result, error

    def raises(self, expected: type[BaseException], fn: Callable, *args, case: str,
               match: str = "", explain: str = "", inputs=(), fresh_inputs=None,
               **kwargs) -> BaseException:
        """Run ``fn`` expecting ``expected`` with a message matching ``match``; publish the
        record; return the exception (AssertionError in the kernel when it did not come).
        explain: what the message should say, for the learner (default: the pattern).
        fresh_inputs: ``lambda rng: args``, the test's rule for other arguments that must raise
        the same error; when the grader handed over a secret, the case runs again on them (a bound
        method on a copy of its object) and publishes a second record, judged by the error's
        class (its message names other values)."""
        twin = None                       # drawn here, as in call: the secret's gate reads
        if callable(fresh_inputs):        # this frame (fresh._asked_by_a_test_cell)
            try:
                twin = fresh.twin(self.cell, case, fn, args, kwargs, inputs=inputs,
                                  draw=fresh_inputs)
            except Exception as cannot:   # noqa: BLE001  (an object that cannot be copied)
                twin = fresh.Twin(_raiser(cannot), (), {}, inputs)
        recorder, result, error = self._raising_case(fn, args, kwargs, inputs, case, expected,
                                                     match)
        if isinstance(error, expected) and not recorder.violations and twin is not None:
            self._raising_case(twin.fn, twin.args, twin.kwargs, twin.inputs,
                               case + fresh.TWIN_SUFFIX, expected, "")   # judged by the grader
            self.last = recorder
        if recorder.violations:
            raise NotAllowedError(recorder.violations[0])
        name = getattr(fn, "__name__", "the function")
        if error is None:
            raise AssertionError(f"{name} should raise {expected.__name__} ({case}), but it "
                                 "returned")
        if not isinstance(error, expected):
            raise error
        if match and not re.search(match, str(error)):
            raise AssertionError(f"{name} raised {expected.__name__}({str(error)!r}); "
                                 + (explain or f"the message should match {match!r}"))
        return error

    def _raising_case(self, fn: Callable, args, kwargs, inputs, case: str,
                      expected: type[BaseException], match: str):
        """Run one case that should raise and publish its record: (recorder, result, error)."""
        input_digest = digest(args, kwargs, inputs)
        recorder, result, error, canaries = self._run(fn, args, kwargs, inputs)
        output = ({"raised": raised(error)}
                  if error is not None else {"returned": encode(result)})
        options = {"expect": expected.__name__, "match": match}
        self._publish(case, recorder, output, input_digest, canaries, options, [])
        return recorder, result, error
