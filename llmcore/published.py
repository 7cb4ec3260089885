"""Sizes of the published models the book cites, with their sources: one table for every chapter.

Each entry gives what the KV cache and the FFN arithmetic need: L layers, h query heads, h_kv K/V
heads, d_head, d_model and the FFN width f. Sources: GPT-2 small and XL from OpenAI's released
``hparams.json`` (Radford et al., 2019, Table 2); GPT-3 175B from Brown et al., 2020
(arXiv:2005.14165), Table 2.1; Llama 2 7B from its released ``params.json`` (Touvron et al., 2023,
arXiv:2307.09288: only its 34B and 70B models use grouped-query attention); Llama 3 8B and 70B
from the Llama Team, 2024 (arXiv:2407.21783), Table 3. Chapters 7 and 11.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PublishedModel:
    """The sizes of one published decoder. ffn: "gelu" (two matrices) or "swiglu" (three)."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_model: int
    d_ff: int
    ffn: str


PUBLISHED = {
    "GPT-2 small": PublishedModel(12, 12, 12, 64, 768, 3072, "gelu"),
    "GPT-2 XL": PublishedModel(48, 25, 25, 64, 1600, 6400, "gelu"),
    "GPT-3 175B": PublishedModel(96, 96, 96, 128, 12288, 49152, "gelu"),
    "Llama 2 7B": PublishedModel(32, 32, 32, 128, 4096, 11008, "swiglu"),
    "Llama 3 8B": PublishedModel(32, 32, 8, 128, 4096, 14336, "swiglu"),
    "Llama 3 70B": PublishedModel(80, 64, 8, 128, 8192, 28672, "swiglu"),
}
"""name -> sizes, in the order the book's tables print them."""
