"""``python -m course.bench``: what each reformulation of the course buys, measured here.

Sections (each a module with ``run(out, *, quick, device)``), run in order by ``__main__``:

* ``ops`` (:mod:`course.bench.ops`): the same projection and the same attention as pure-Python
  loops, the ``*_loop`` forms, NumPy and torch matrix forms (explicit and fused), with the ratios
  between them and GFLOP/s against the machine's measured matmul peak.
* ``inference`` (:mod:`course.bench.inference`): generation with and without a KV cache, batch
  throughput, paged vs contiguous caches, and cache memory against the per-token formula.

Nothing runs at import. ``--quick`` uses tiny sizes (a smoke run, not a measurement). Chapter 2.
"""
