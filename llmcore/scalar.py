"""Pure-Python versions on nested lists of floats: the loops with nothing vectorised at all.

They exist to be measured against (Chapter 2, ``python -m course.bench``): every multiply-add is
one Python bytecode round trip, which is what BLAS saves. Inputs are lists of rows (``x.tolist()``).
"""

from __future__ import annotations

import math

Matrix = list[list[float]]


def matmul_scalar(a: Matrix, b: Matrix) -> Matrix:
    """a: (n, k)   b: (k, m)   ->   (n, m), three nested loops over
    scalars. Chapter 2."""
    n, k, m = len(a), len(b), len(b[0])
    if any(len(row) != k for row in a):
        raise ValueError(f"matmul_scalar: a's rows must have k = {k} "
                         f"entries (b has {k} rows)")
    out = [[0.0] * m for _ in range(n)]
    for i in range(n):
        for j in range(m):
            total = 0.0
            for t in range(k):
                total += a[i][t] * b[t][j]
            out[i][j] = total
    return out


def attention_scalar(q: Matrix, k: Matrix, v: Matrix, *,
                     causal: bool = False) -> Matrix:
    """Scaled dot-product attention for one head on lists: q (n, d_head), k
    and v (m, d_head).

    Same contract as :func:`llmcore.attention.attention_loop` (bottom-right
    causal). Chapter 3.
    """
    n, m, d_head = len(q), len(k), len(q[0])
    scale = 1.0 / math.sqrt(d_head)
    out = []
    for i in range(n):
        last = i + (m - n) if causal else m - 1
        scores = [sum(q[i][c] * k[j][c] for c in range(d_head)) * scale
                  for j in range(last + 1)]
        top = max(scores)
        weights = [math.exp(s - top) for s in scores]
        total = sum(weights)
        out.append([sum(weights[j] * v[j][c] for j in range(last + 1))
                    / total for c in range(d_head)])
    return out
