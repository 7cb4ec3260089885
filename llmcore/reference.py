"""NumPy float64 twins of llmcore's operations: same names, same signatures, written plainly.

They are the oracle the tests hold the torch code to: double precision, no torch, nothing clever.
Inputs are NumPy arrays (or anything ``np.asarray`` accepts); outputs are float64 arrays.
"""

from __future__ import annotations

import math

import numpy as np

NEG_INF = -np.inf


def _f64(*arrays):
    return [None if a is None else np.asarray(a, dtype=np.float64) for a in arrays]


def matmul(a, b) -> np.ndarray:
    """a: (..., n, k)   b: (..., k, m)   ->   (..., n, m)."""
    a, b = _f64(a, b)
    return a @ b


def linear(x, w, b=None) -> np.ndarray:
    """x: (..., n, d_in)   w: (d_in, d_out)   b: (d_out,) or None   ->   (..., n, d_out)."""
    x, w, b = _f64(x, w, b)
    return x @ w if b is None else x @ w + b


def softmax(x, dim: int = -1) -> np.ndarray:
    """Stable softmax; a row of all -inf gives zeros."""
    (x,) = _f64(x)
    top = np.max(x, axis=dim, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    exps = np.exp(x - top)
    total = exps.sum(axis=dim, keepdims=True)
    return exps / np.where(total > 0, total, 1.0)


def causal_mask(n: int, m: int) -> np.ndarray:
    """(n, m) bool, bottom-right aligned: query i sees keys j <= i + (m - n)."""
    if n > m:
        raise ValueError(f"causal_mask: expected m >= n, got n = {n}, m = {m}")
    return np.arange(m)[None, :] <= np.arange(n)[:, None] + (m - n)


def attention(q, k, v, *, causal: bool = False, mask=None) -> np.ndarray:
    """q: (..., h, n, d_head)   k, v: (..., h_kv, m, d_head)   ->   (..., h, n, d_head)."""
    q, k, v = _f64(q, k, v)
    if q.ndim >= 3 and q.shape[-3] != k.shape[-3]:
        group = q.shape[-3] // k.shape[-3]
        k, v = np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)
    n, m = q.shape[-2], k.shape[-2]
    scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    allowed = np.ones((n, m), dtype=bool)
    if causal:
        allowed = allowed & causal_mask(n, m)
    if mask is not None:
        allowed = allowed & np.asarray(mask, dtype=bool)
    scores = np.where(allowed, scores, NEG_INF)
    return softmax(scores) @ v


def split_heads(x, n_heads: int) -> np.ndarray:
    """(..., n, h d_head) -> (..., h, n, d_head)."""
    (x,) = _f64(x)
    *lead, n, d = x.shape
    return np.swapaxes(x.reshape(*lead, n, n_heads, d // n_heads), -3, -2)


def merge_heads(x) -> np.ndarray:
    """(..., h, n, d_head) -> (..., n, h d_head)."""
    (x,) = _f64(x)
    *lead, h, n, d_head = x.shape
    return np.swapaxes(x, -3, -2).reshape(*lead, n, h * d_head)


def multihead_attention(x, w_q, w_k, w_v, w_o, *, n_heads: int, b_q=None, b_k=None, b_v=None,
                        b_o=None, causal: bool = False) -> np.ndarray:
    """x: (..., n, d) -> (..., n, d); w_k, w_v may have h_kv * d_head columns."""
    x, w_q, w_k, w_v = _f64(x, w_q, w_k, w_v)
    d_head = x.shape[-1] // n_heads
    n_kv_heads = np.asarray(w_k).shape[1] // d_head
    q = split_heads(linear(x, w_q, b_q), n_heads)
    k = split_heads(linear(x, w_k, b_k), n_kv_heads)
    v = split_heads(linear(x, w_v, b_v), n_kv_heads)
    return linear(merge_heads(attention(q, k, v, causal=causal)), w_o, b_o)


def gelu(x) -> np.ndarray:
    """GPT-2's tanh GELU."""
    (x,) = _f64(x)
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def ffn(x, w_up, b_up, w_down, b_down) -> np.ndarray:
    """x: (..., n, d) -> (..., n, d) through a hidden width f."""
    return linear(gelu(linear(x, w_up, b_up)), w_down, b_down)


def layer_norm(x, scale, shift, eps: float = 1e-5) -> np.ndarray:
    """Per row: scale * (x - mean) / sqrt(biased var + eps) + shift."""
    x, scale, shift = _f64(x, scale, shift)
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return scale * (x - mean) / np.sqrt(var + eps) + shift


def gpt_forward(params: dict, tokens, *, n_heads: int, n_kv_heads: int | None = None,
                eps: float = 1e-5) -> np.ndarray:
    """The whole GPT on one batch, from a ``state_dict`` of :class:`llmcore.model.GPT`.

    params: name -> array (torch tensors are converted); tokens: (b, n) ints -> logits (b, n, v).
    """
    p = {name: np.asarray(value.detach().cpu().double() if hasattr(value, "detach") else value,
                          dtype=np.float64) for name, value in params.items()}
    tokens = np.asarray(tokens)
    n = tokens.shape[-1]
    x = p["token_embedding"][tokens] + p["position_embedding"][:n]
    d = x.shape[-1]
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    d_head = d // n_heads
    layer = 0
    while f"blocks.{layer}.ln_1.scale" in p:
        pre = f"blocks.{layer}."
        h = layer_norm(x, p[pre + "ln_1.scale"], p[pre + "ln_1.shift"], eps)
        w_qkv, b_qkv = p[pre + "attention.w_qkv"], p[pre + "attention.b_qkv"]
        cuts = [d, d + n_kv_heads * d_head]
        w_q, w_k, w_v = np.split(w_qkv, cuts, axis=1)
        b_q, b_k, b_v = np.split(b_qkv, cuts)
        x = x + multihead_attention(h, w_q, w_k, w_v, p[pre + "attention.w_o"], n_heads=n_heads,
                                    b_q=b_q, b_k=b_k, b_v=b_v, b_o=p[pre + "attention.b_o"],
                                    causal=True)
        h = layer_norm(x, p[pre + "ln_2.scale"], p[pre + "ln_2.shift"], eps)
        x = x + ffn(h, p[pre + "ffn.w_up"], p[pre + "ffn.b_up"], p[pre + "ffn.w_down"],
                    p[pre + "ffn.b_down"])
        layer += 1
    x = layer_norm(x, p["ln_f.scale"], p["ln_f.shift"], eps)
    return x @ p["token_embedding"].T


def scale_frequencies(theta, scaling) -> np.ndarray:
    """Llama 3.1's RoPE scaling, one pair at a time: theta (half,) -> (half,). scaling: anything
    with factor, low_freq_factor, high_freq_factor and original_context (a
    :class:`llmcore.rope.RopeScaling`)."""
    (theta,) = _f64(theta)
    context, factor = scaling.original_context, scaling.factor
    low, high = scaling.low_freq_factor, scaling.high_freq_factor
    out = np.empty_like(theta)
    for i, t in enumerate(theta):
        wavelength = 2 * math.pi / t
        if wavelength < context / high:
            out[i] = t                                          # fast: kept
        elif wavelength > context / low:
            out[i] = t / factor                                 # slow: divided
        else:
            s = (context / wavelength - low) / (high - low)
            out[i] = (1 - s) * t / factor + s * t               # between: blended
    return out


def apply_rope(x, positions, base: float = 10000.0, *, scaling=None) -> np.ndarray:
    """Rotary embeddings, half-split pairs (i, i + d_head/2) turned by position * base^(-2i/d_head)
    (scaled by :func:`scale_frequencies` when ``scaling`` is given).

    x: (..., n, d_head)   positions: (n,) or (b, n) ints   ->   (..., n, d_head)."""
    (x,) = _f64(x)
    positions = np.asarray(positions)
    half = x.shape[-1] // 2
    theta = base ** (-np.arange(half) * 2.0 / x.shape[-1])
    if scaling is not None:
        theta = scale_frequencies(theta, scaling)
    angles = positions[..., None].astype(np.float64) * theta              # (..., n, half)
    if positions.ndim == 2:
        angles = angles.reshape(positions.shape[0], *(1,) * (x.ndim - 3), *angles.shape[1:])
    a, b = x[..., :half], x[..., half:]
    cos, sin = np.cos(angles), np.sin(angles)
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def sliding_window_mask(n: int, m: int, window: int) -> np.ndarray:
    """(n, m) bool: query i (key slot i + m - n) sees key j when 0 <= i + m - n - j < window."""
    i = np.arange(n)[:, None] + (m - n)
    j = np.arange(m)[None, :]
    return (j <= i) & (i - j < window)


def rms_norm(x, weight, eps: float = 1e-6) -> np.ndarray:
    """Per row: weight * x / sqrt(mean(x^2) + eps): no mean subtracted, no shift."""
    x, weight = _f64(x, weight)
    return weight * x / np.sqrt((x ** 2).mean(axis=-1, keepdims=True) + eps)


def silu(x) -> np.ndarray:
    """x * sigmoid(x)."""
    (x,) = _f64(x)
    return x / (1.0 + np.exp(-x))


def swiglu(x, w_gate, w_up, w_down) -> np.ndarray:
    """(silu(x w_gate) * (x w_up)) w_down: x (..., n, d) -> (..., n, d)."""
    return linear(silu(linear(x, w_gate)) * linear(x, w_up), w_down)


def llama_forward(params: dict, tokens, *, n_heads: int, n_kv_heads: int, eps: float = 1e-6,
                  base: float = 10000.0, scaling=None, window: int | None = None) -> np.ndarray:
    """The whole Llama on one batch, from a ``state_dict`` of :class:`llmcore.llama.Llama`, with
    the families' diffs: q/k/v biases and q/k norms when ``params`` holds them (Qwen2, Qwen3),
    RoPE ``scaling`` (Llama 3.1), a sliding ``window`` (Mistral).

    params: name -> array (torch tensors are converted); tokens: (b, n) ints -> logits (b, n, v).
    """
    p = {name: np.asarray(value.detach().cpu().double() if hasattr(value, "detach") else value,
                          dtype=np.float64) for name, value in params.items()}
    tokens = np.asarray(tokens)
    n = tokens.shape[-1]
    positions = np.arange(n)
    mask = None if window is None else sliding_window_mask(n, n, window)
    x = p["token_embedding"][tokens]
    layer = 0
    while f"blocks.{layer}.attn_norm.weight" in p:
        pre = f"blocks.{layer}.attention."
        h = rms_norm(x, p[f"blocks.{layer}.attn_norm.weight"], eps)
        q, k, v = (linear(h, p[pre + "w_" + name], p.get(pre + "b_" + name))
                   for name in "qkv")
        q, k, v = split_heads(q, n_heads), split_heads(k, n_kv_heads), split_heads(v, n_kv_heads)
        if pre + "q_norm.weight" in p:                          # each head's q and k
            q = rms_norm(q, p[pre + "q_norm.weight"], eps)
            k = rms_norm(k, p[pre + "k_norm.weight"], eps)
        q = apply_rope(q, positions, base, scaling=scaling)
        k = apply_rope(k, positions, base, scaling=scaling)
        out = attention(q, k, v, causal=True, mask=mask)
        x = x + linear(merge_heads(out), p[pre + "w_o"])
        h = rms_norm(x, p[f"blocks.{layer}.ffn_norm.weight"], eps)
        ffn = f"blocks.{layer}.ffn."
        x = x + swiglu(h, p[ffn + "w_gate"], p[ffn + "w_up"], p[ffn + "w_down"])
        layer += 1
    return rms_norm(x, p["norm_f.weight"], eps) @ p["lm_head"]


def moe(x, w_router, w_gate, w_up, w_down, *, top_k: int, normalize: bool = True,
        capacity: int | None = None) -> np.ndarray:
    """A mixture of SwiGLU experts, one token at a time: x (..., n, d)   w_router (d, E)
    w_gate, w_up (E, d, f)   w_down (E, f, d)   ->   (..., n, d).

    Each token takes the top_k experts of softmax(x w_router) (weights renormalised to sum to 1
    when ``normalize``); with a capacity, an expert takes the first ``capacity`` (token, choice)
    pairs in token order and a dropped pair adds nothing."""
    x, w_router, w_gate, w_up, w_down = _f64(x, w_router, w_gate, w_up, w_down)
    rows = x.reshape(-1, x.shape[-1])
    out = np.zeros_like(rows)
    taken = np.zeros(w_router.shape[1], dtype=int)
    for t, row in enumerate(rows):
        probs = softmax(row @ w_router)
        chosen = np.argsort(-probs, kind="stable")[:top_k]
        weights = probs[chosen] / probs[chosen].sum() if normalize else probs[chosen]
        for e, weight in zip(chosen, weights):
            if capacity is not None and taken[e] >= capacity:
                continue
            taken[e] += 1
            out[t] += weight * swiglu(row, w_gate[e], w_up[e], w_down[e])
    return out.reshape(x.shape)


def load_balancing_loss(router_logits, top_k: int) -> float:
    """E * sum_i f_i P_i: f_i the top_k choices that went to expert i per token, P_i the mean
    router probability of expert i. router_logits: (T, E) -> a float."""
    (logits,) = _f64(router_logits)
    probs = softmax(logits)
    n_tokens, n_experts = probs.shape
    counts = np.zeros(n_experts)
    for row in probs:
        counts[np.argsort(-row, kind="stable")[:top_k]] += 1
    return float(n_experts * np.sum(counts / n_tokens * probs.mean(axis=0)))


def prompt_lookup(tokens, k: int, *, ngram: int = 3) -> np.ndarray:
    """The tokens that followed the most recent earlier occurrence of the last n-gram (n = ngram,
    then shorter). tokens: (m,) ints -> (t,), t <= k."""
    tokens = np.asarray(tokens)
    m = len(tokens)
    for n in range(min(ngram, m - 1), 0, -1):
        for start in reversed(range(m - n)):
            if np.array_equal(tokens[start:start + n], tokens[m - n:]):
                return tokens[start + n:start + n + k]
    return tokens[:0]


def accept_greedy(draft, logits) -> tuple[int, int]:
    """Longest prefix of draft (k,) equal to the argmax of logits (k + 1, v); then the argmax
    at the first disagreement (or the last row). -> (accepted, next token)."""
    best = np.argmax(np.asarray(logits, dtype=np.float64), axis=-1)
    a = 0
    while a < len(draft) and best[a] == draft[a]:
        a += 1
    return a, int(best[a])


def residual_distribution(p, q) -> np.ndarray:
    """max(0, p - q) normalised; p itself where p == q. p, q: (..., v)."""
    p, q = _f64(p, q)
    excess = np.maximum(p - q, 0.0)
    total = excess.sum(axis=-1, keepdims=True)
    return np.where(total > 0, excess / np.where(total > 0, total, 1.0), p)


def accept_sampled(draft, p, q, u, u_draw) -> tuple[int, int]:
    """Keep draft token i while u[i] q[i, d_i] < p[i, d_i]; at the first rejection draw from the
    residual with u_draw (inverse CDF), all kept from p[k]. draft (k,), p (k + 1, v), q (k, v) or
    None (one-hot), u (k,), u_draw a float -> (accepted, next token)."""
    p = np.asarray(p, dtype=np.float64)
    k, v = len(draft), p.shape[-1]
    q = np.eye(v)[np.asarray(draft, dtype=int)] if q is None else np.asarray(q, np.float64)

    def draw(probs):
        cdf = np.cumsum(probs)
        return int(min(np.searchsorted(cdf, u_draw * cdf[-1], side="right"), v - 1))

    for i in range(k):
        if not u[i] * q[i, draft[i]] < p[i, draft[i]]:
            return i, draw(residual_distribution(p[i], q[i]))
    return k, draw(p[k])
