"""What a learner imports works on macOS and Windows too: every llmcore module and the learner's
check import with the POSIX-only modules (resource, fcntl, pwd, grp, termios) missing, as on
Windows, and the grader's kernel then runs without a memory limit, saying so."""

from __future__ import annotations

import logging
import pkgutil
import subprocess
import sys
import textwrap

import llmcore

POSIX_ONLY = ("resource", "fcntl", "pwd", "grp", "termios")

LEARNER_MODULES = ["llmcore", *(f"llmcore.{m.name}" for m in pkgutil.iter_modules(llmcore.__path__)),
                   "course.grading", "course.grading.check", "course.grading.cli",
                   "course.grading.executor", "course.lab"]


def test_learner_modules_import_without_posix_only_modules():
    """A fresh interpreter where importing a POSIX-only module fails, as it does on Windows."""
    script = textwrap.dedent(f"""
        import importlib, sys
        class WindowsLike:
            def find_spec(self, name, path=None, target=None):
                if name in {POSIX_ONLY!r}:
                    raise ModuleNotFoundError(f"No module named {{name!r}} (not on Windows)")
        for name in {POSIX_ONLY!r}:
            sys.modules.pop(name, None)
        sys.meta_path.insert(0, WindowsLike())
        failed = []
        for module in {LEARNER_MODULES!r}:
            try:
                importlib.import_module(module)
            except ImportError as error:
                failed.append(f"{{module}}: {{error}}")
        print("\\n".join(failed))
        sys.exit(1 if failed else 0)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, f"imports that need a POSIX-only module:\n{result.stdout}" \
                                   f"{result.stderr[-2000:]}"


def test_kernel_without_resource_gets_no_memory_limit_and_a_warning(monkeypatch, caplog):
    import importlib.util

    from course.grading.sandbox import NO_MEMORY_LIMIT, limit_command

    assert "setrlimit" in " ".join(limit_command(512))        # POSIX: the limit is set
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "resource" else real_find_spec(name, *a))
    log = logging.getLogger("limit-command-test")
    with caplog.at_level(logging.WARNING, logger="limit-command-test"):
        assert limit_command(512, log) == []
    assert NO_MEMORY_LIMIT in caplog.text
