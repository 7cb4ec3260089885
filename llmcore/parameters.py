"""How many parameters a GPT holds, by part, from its configuration alone.

The table of Chapter 5: token embedding v d (tied: it is also the unembedding), position
embedding T d (T = max_seq_len), per block two layer norms (2 * 2d), attention
(W_qkv, b_qkv, W_o, b_o: d w + w + d^2 + d with w = (h + 2 h_kv) d_head) and the FFN
(W_up, b_up, W_down, b_down: d f + f + f d + d), and the final layer norm (2d). Chapter 5.
"""

from __future__ import annotations

from .model import GPTConfig


def parameter_count(config: GPTConfig) -> dict[str, int]:
    """Parameters by part: {"embeddings", "attention", "ffn", "layer norms"}
    -> counts, whose sum equals ``GPT(config).num_parameters()``.
    Chapter 5."""
    if not isinstance(config, GPTConfig):
        raise TypeError(f"parameter_count: expected a GPTConfig, got "
                        f"{type(config).__name__}")
    c = config
    d, f = c.d_model, c.ffn_width
    w_qkv = (c.n_heads + 2 * c.kv_heads) * c.d_head
    return {"embeddings": c.vocab_size * d + c.max_seq_len * d,
            "attention": c.n_layers * (d * w_qkv + w_qkv + d * d + d),
            "ffn": c.n_layers * (d * f + f + f * d + d),
            "layer norms": c.n_layers * 2 * 2 * d + 2 * d}
