"""The sealed harness (llmcheck/seal.py): once sealed, rebinding a harness module's attribute,
even for the length of one call and put back before it returns, changes nothing the harness
does. Each test seals a fresh interpreter (sealing rebinds the whole package)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_sealed(body: str) -> str:
    """Run ``body`` in a new interpreter after llmcheck.seal.seal(); its stdout."""
    code = "import llmcheck.seal\nllmcheck.seal.seal()\n" + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_every_harness_function_reads_a_private_namespace():
    out = run_sealed("""
        import sys, types
        open_ = []
        for name, module in list(sys.modules.items()):
            if name.startswith("llmcheck") and module is not None:
                for key, value in vars(module).items():
                    if isinstance(value, types.FunctionType) and value.__globals__ is vars(module):
                        open_.append(f"{name}.{key}")
                    if isinstance(value, type) and value.__module__ == name:
                        for attribute, member in vars(value).items():
                            if isinstance(member, types.FunctionType) \\
                                    and member.__globals__ is vars(module):
                                open_.append(f"{name}.{key}.{attribute}")
        print(open_)
    """)
    assert out.strip() == "[]", f"functions still reading their module's namespace: {out}"


def test_a_table_rebound_for_one_call_and_put_back_changes_no_count():
    out = run_sealed("""
        import contextlib, io, torch
        import llmcheck.recorder as recorder
        from llmcheck.cases import Test

        def rows_one_by_one(x, w):
            counted = recorder.PRODUCT_OPS
            recorder.PRODUCT_OPS = frozenset()
            try:
                return torch.stack([row @ w for row in x])
            finally:
                recorder.PRODUCT_OPS = counted

        test = Test("test_x")
        with contextlib.redirect_stdout(io.StringIO()):
            test.call(rows_one_by_one, torch.ones(5, 3), torch.ones(3, 2), case="rows")
        print("products", test.last.products)      # unsealed: 0
    """)
    assert "products 5" in out


def test_a_helper_rebound_for_one_call_refuses_all_the_same():
    """Unsealed, this function's gradient is allowed: the recorder looks up its autograd check
    by the module's name for it, which the function swaps for the length of the call."""
    out = run_sealed("""
        import io, contextlib, torch
        import llmcheck.recorder as recorder
        from llmcheck.cases import Test
        from llmcheck.recorder import NotAllowedError

        def gradient_by_autograd(x):
            saved = recorder.autograd_at_work
            recorder.autograd_at_work = lambda name: None
            try:
                with torch.enable_grad():
                    leaf = x.clone().requires_grad_()
                    return torch.autograd.grad((leaf * leaf).sum(), leaf)[0]
            finally:
                recorder.autograd_at_work = saved

        with contextlib.redirect_stdout(io.StringIO()):
            try:
                Test("test_x", forbid=("autograd",)).call(gradient_by_autograd, torch.ones(3),
                                                           case="grad")
                result = "allowed"
            except NotAllowedError:
                result = "refused"
        print(result)
    """)
    assert out.strip() == "refused"


def test_the_tables_cannot_be_changed_in_place_and_state_stays_shared():
    out = run_sealed("""
        import llmcheck.families as families
        import llmcheck.fresh as fresh
        for table, key in ((families.FAMILIES, "product"), (families._FAMILY_OF, "mm")):
            try:
                table[key] = "elementwise"
                print("changed")
            except TypeError:
                print("read-only")
        fresh.receive("ab" * 32)             # the module's function, as the grader calls it
        print("active", fresh.active())      # read by another sealed function: the same state
        fresh.receive(None)
        print("active", fresh.active())
    """)
    assert out.split() == ["read-only", "read-only", "active", "True", "active", "False"]
