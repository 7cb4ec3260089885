"""``python -m llmcore.bench``: what each reformulation of the course buys, measured on this machine.

Sections (each a module with ``run(out, *, quick, device)``), run in order by ``__main__``:

* ``ops`` (:mod:`llmcore.bench.ops`): the same projection and the same attention as pure-Python
  loops, the ``*_loop`` forms, NumPy and torch matrix forms (explicit and fused), with the ratios
  between them and GFLOP/s against the machine's measured matmul peak.

Nothing runs at import. ``--quick`` uses tiny sizes (a smoke run, not a measurement). Chapter 2.
"""
