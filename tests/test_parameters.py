"""llmcore.parameters.parameter_count: the table of chapter 5 equals num_parameters() of real
models (plain, grouped-query, custom FFN width), and refuses what is not a GPTConfig."""

from __future__ import annotations

import pytest

from llmcore import GPT, GPTConfig
from llmcore.parameters import parameter_count


@pytest.mark.parametrize("config", [
    GPTConfig(vocab_size=61, max_seq_len=48, d_model=24, n_heads=4, n_layers=2),
    GPTConfig(vocab_size=61, max_seq_len=48, d_model=24, n_heads=4, n_kv_heads=2, n_layers=3),
    GPTConfig(vocab_size=50257, max_seq_len=1024, d_model=768, n_heads=12, n_layers=12),
    GPTConfig(vocab_size=97, max_seq_len=16, d_model=32, n_heads=2, n_layers=1, d_ff=40),
], ids=["mha", "gqa", "gpt2-small", "d_ff"])
def test_the_count_equals_the_models_parameters(config):
    parts = parameter_count(config)
    assert sum(parts.values()) == GPT(config, device="meta").num_parameters()
    assert set(parts) == {"embeddings", "attention", "ffn", "layer norms"}


def test_gpt2_small_is_124m_and_bad_input_is_named():
    small = GPTConfig(vocab_size=50257, max_seq_len=1024, d_model=768, n_heads=12, n_layers=12)
    assert sum(parameter_count(small).values()) == 124_439_808
    with pytest.raises(TypeError, match="expected a GPTConfig, got dict"):
        parameter_count({"d_model": 8})
